//! quantgraph: a pure-Rust tensor graph execution engine for CPUs, bit-compatible with ggml.
//!
//! Build a [`Graph`] of tensor ops (ggml's ops and semantics, shapes in ggml's order with `ne[0]`
//! innermost), plan it for a [`CpuBackend`] into a [`Plan`] (memory planning, work buffer, abort
//! hook), then compute it any number of times on the backend's thread pool. Kernels are picked at
//! run time by CPU feature detection. Every ggml tensor type is supported by [`DType`], with
//! ggml's ids, names and block layouts; [`quant`] quantizes and dequantizes them.
//!
//! ```
//! use quantgraph::{CpuBackend, DType, Graph, Plan};
//!
//! // y = softmax(W x) for a 3x4 weight matrix W and a batch of two 4-vectors x.
//! let mut g = Graph::new();
//! let w = g.input(DType::F32, &[4, 3])?; // ne = [k, m]
//! let x = g.input(DType::F32, &[4, 2])?; // ne = [k, n]
//! let y = g.mul_mat(w, x)?;              // ne = [m, n] = [3, 2]
//! let y = g.soft_max(y)?;
//! g.set_output(y)?;
//!
//! let backend = CpuBackend::with_threads(2)?;
//! let mut plan = Plan::new(g, &backend)?;
//! plan.set_input(w, &[1.0f32, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0])?;
//! plan.set_input(x, &[1.0f32, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0, 0.0])?;
//! plan.compute()?;
//! let out = plan.output::<f32>(y)?;
//! assert!((out[0..3].iter().sum::<f32>() - 1.0).abs() < 1e-6);
//! assert!((out[3] - 1.0 / 3.0).abs() < 1e-6); // a row of zeros gives a uniform softmax
//! # Ok::<(), quantgraph::Error>(())
//! ```

#![warn(missing_docs)]

pub mod backend;
mod buffer;
pub mod dtype;
pub mod error;
pub mod gguf;
pub mod graph;
pub mod kernels;
pub mod models;
pub(crate) mod ops;
pub mod opt;
pub mod plan;
pub mod quant;
pub mod sched;
#[doc(hidden)]
pub mod testdata;
pub mod tokenizer;

pub use backend::{
    AbortHook, Backend, BackendPlan, Buffer, BufferType, CpuBackend, CpuBufferType, CpuDevice,
    CpuRegistry, CpuRepackBufferType, Device, DeviceCaps, DeviceMemory, DeviceProps, DeviceType,
    EvalCallback, MAX_THREADS, NodeEval, Registry, Threadpool, ThreadpoolParams,
};
pub use dtype::{DType, QK_K};
pub use error::{Error, Result};
pub use gguf::{GgufFile, GgufModel, GgufWriter};
pub use graph::{
    Conv2dParams, Conv3dParams, CustomAnyArgs, CustomAnyFn, CustomAnyParams, CustomArgs, CustomFn,
    CustomSplitFn, CustomSrc, DSV4_HC_MAX_ITER, FlashAttnBackLayout, FlashAttnParams, Gather,
    GluOp, Graph, Im2colBackParams, MatMulHint, Op, Pool2dParams, PoolOp, RopeMode, RopeParams,
    ScaleMode, SortOrder, Storage, TensorId, TriType, UnaryOp,
};
pub use kernels::{CpuFeatures, Isa};
pub use plan::{Element, Plan, PlanStats};
