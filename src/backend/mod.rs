//! Backend layer modelled on ggml-backend: [`Registry`] -> [`Device`] -> [`Backend`] ->
//! [`BackendPlan`], with [`BufferType`] and [`Buffer`]. All are object-safe traits that another
//! backend implements from outside the crate (a GPU, an NPU, a remote machine); the CPU is one
//! implementation, registered in the process-wide registry list ([`registries`], [`register`]).
//!
//! Where ggml looks functions up by string (`get_proc_address`), these traits have typed methods:
//! `features()`, `set_n_threads()`, `set_abort_hook()`.

mod cpu;
pub(crate) mod pool;
mod registry;
pub use crate::quant::repack;

pub(crate) use crate::buffer::BufferGuard;
pub use crate::buffer::{
    BUFFER_ALIGNMENT, Buffer, BufferType, CpuBufferType, CpuRepackBufferType, DeviceMemory,
};
pub(crate) use cpu::CpuShared;
pub use cpu::{CpuBackend, CpuDevice, CpuRegistry, MAX_THREADS, Threadpool, ThreadpoolParams};
pub use registry::{device_by_name, devices, init_by_name, register, registries};

use crate::error::{Error, Result};
use crate::graph::{Graph, TensorId};
use std::sync::Arc;

/// Kind of device (ggml's `ggml_backend_dev_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeviceType {
    /// The host CPU.
    Cpu,
    /// A discrete GPU.
    Gpu,
    /// An integrated GPU sharing host memory.
    IGpu,
    /// An accelerator used together with the CPU (BLAS, AMX).
    Accel,
}

/// What a device can do (ggml's `ggml_backend_dev_caps`). `Default` is all false; set the
/// fields a device has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceCaps {
    /// Asynchronous compute and transfers.
    pub async_compute: bool,
    /// Pinned host buffers.
    pub host_buffer: bool,
    /// Buffers created over caller memory without copying.
    pub buffer_from_host_ptr: bool,
    /// Event synchronisation.
    pub events: bool,
}

/// Device properties (ggml's `ggml_backend_dev_props`).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct DeviceProps {
    /// Short name ("CPU").
    pub name: String,
    /// Human description (the CPU brand string).
    pub description: String,
    /// Free memory in bytes.
    pub memory_free: usize,
    /// Total memory in bytes.
    pub memory_total: usize,
    /// Device kind.
    pub device_type: DeviceType,
    /// Capabilities.
    pub caps: DeviceCaps,
}

/// A compute device (ggml's `ggml_backend_dev`).
pub trait Device: Send + Sync {
    /// Short name ("CPU").
    fn name(&self) -> &str;
    /// Description (for the CPU: the brand string).
    fn description(&self) -> &str;
    /// (free, total) memory in bytes.
    fn memory(&self) -> (usize, usize);
    /// Device kind.
    fn device_type(&self) -> DeviceType;
    /// All properties at once.
    fn props(&self) -> DeviceProps {
        let (free, total) = self.memory();
        DeviceProps {
            name: self.name().into(),
            description: self.description().into(),
            memory_free: free,
            memory_total: total,
            device_type: self.device_type(),
            caps: self.caps(),
        }
    }
    /// Capabilities.
    fn caps(&self) -> DeviceCaps;
    /// True when the device can compute node `node` of `graph` (its op, types and layouts; where
    /// the sources are stored is [`Device::supports_buft`]'s question).
    fn supports_op(&self, graph: &Graph, node: TensorId) -> bool;
    /// True when the device can use tensors stored in `buft` directly. Decide by identity
    /// (`buft.is::<MyBufferType>()`, [`BufferType::is_host`]), not by name.
    fn supports_buft(&self, buft: &dyn BufferType) -> bool;
    /// The buffer type for this device's tensors.
    fn default_buffer_type(&self) -> Arc<dyn BufferType>;
    /// Additional buffer types (repacked weight layouts, ...).
    fn extra_buffer_types(&self) -> Vec<Arc<dyn BufferType>>;
    /// A buffer over caller-owned bytes without copying (read-only).
    fn buffer_from_host(&self, data: Arc<[u8]>) -> Result<Buffer> {
        Ok(Buffer::from_host(data))
    }
    /// Starts a backend (a compute stream) on this device.
    fn init_backend(&self) -> Result<Box<dyn Backend>>;
}

/// The abort hook: polled between nodes; returning `true` stops the compute with
/// `Error::Aborted`.
pub type AbortHook = Arc<dyn Fn() -> bool + Send + Sync>;

/// What an eval callback sees of a node that was just computed (ggml's `cb_eval` with
/// `ask == false`): its name, op and result, read-only.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct NodeEval<'a> {
    /// The node's id in the plan's graph.
    pub id: TensorId,
    /// The node's name ([`Graph::set_name`]), if it has one.
    pub name: Option<&'a str>,
    /// The op that computed it.
    pub op: &'a crate::graph::Op,
    /// Result type.
    pub dtype: crate::dtype::DType,
    /// Result shape (ggml order).
    pub ne: [usize; 4],
    /// Result byte strides.
    pub nb: [usize; 4],
    /// The bytes the result spans (ggml's `ggml_nbytes` from its first element): for a
    /// contiguous F32 result, `bytemuck::cast_slice::<u8, f32>(data)` are its values.
    pub data: &'a [u8],
}

/// A per-node eval callback (ggml's `ggml_backend_sched_eval_callback`): called after every node
/// of a compute, in order, on the thread that called `compute`. Returning `false` stops the
/// compute with [`Error::Stopped`]; the plan stays usable. Used for debugging and for collecting
/// activation statistics (importance matrices). A plan without one pays nothing for it.
pub type EvalCallback = Box<dyn FnMut(&NodeEval<'_>) -> bool + Send>;

/// A backend computing graphs on a device (ggml's `ggml_backend`): it plans graphs into
/// [`BackendPlan`]s, says which nodes and buffer types it can take, and owns its buffer types.
/// [`crate::sched::Scheduler`] splits one graph across several backends through this trait.
pub trait Backend: Send + Sync {
    /// Name ("CPU").
    fn name(&self) -> &str;
    /// The device it runs on.
    fn device(&self) -> Arc<dyn Device>;
    /// ggml's feature list for this device: `(name, value)`, e.g. `("AVX2", "1")`.
    fn features(&self) -> Vec<(&'static str, String)> {
        Vec::new()
    }
    /// Number of worker threads.
    fn n_threads(&self) -> usize {
        1
    }
    /// Sets the number of worker threads (1 to [`MAX_THREADS`] on the CPU backend); takes effect
    /// at the next compute. Backends without threads of their own accept only 1.
    fn set_n_threads(&self, n: usize) -> Result<()> {
        if n == 1 {
            Ok(())
        } else {
            Err(Error::arg(format!("set_n_threads: backend {} runs no threads", self.name())))
        }
    }
    /// Installs (or removes with `None`) the abort hook.
    fn set_abort_hook(&self, hook: Option<AbortHook>);
    /// True when this backend can compute node `node` of `graph` (ggml's
    /// `ggml_backend_supports_op`).
    fn supports_op(&self, graph: &Graph, node: TensorId) -> bool {
        self.device().supports_op(graph, node)
    }
    /// True when this backend can use tensors stored in `buft` directly (by identity).
    fn supports_buft(&self, buft: &dyn BufferType) -> bool {
        self.device().supports_buft(buft)
    }
    /// The buffer type this backend allocates its tensors in.
    fn default_buffer_type(&self) -> Arc<dyn BufferType> {
        self.device().default_buffer_type()
    }
    /// Plans `graph`: checks every needed node, places its tensors in this backend's memory and
    /// returns the plan that computes it (ggml's `graph_plan_create`). Nodes that no output
    /// depends on (and that write no state) may be left out.
    fn plan(&self, graph: &Graph) -> Result<Box<dyn BackendPlan>>;
}

/// A graph planned on one backend (ggml's `ggml_backend_graph_plan`): inputs in, compute any
/// number of times, outputs out. Inputs and outputs may live in memory the CPU cannot address,
/// so they are copied in and out as bytes.
pub trait BackendPlan: Send {
    /// The graph this plan computes.
    fn graph(&self) -> &Graph;
    /// Copies the bytes of input `id` (its type's bytes, contiguous, all of them).
    fn set_input_bytes(&mut self, id: TensorId, data: &[u8]) -> Result<()>;
    /// Runs the graph. On error the plan stays usable.
    fn compute(&mut self) -> Result<()>;
    /// Copies `out.len()` bytes of output (or input) `id`, starting at byte `offset` of the
    /// tensor, into `out`.
    fn read_bytes(&self, id: TensorId, offset: usize, out: &mut [u8]) -> Result<()>;
    /// The bytes of output (or input) `id` when they are host memory the caller may borrow
    /// (saves a copy); `None` otherwise.
    fn host_bytes(&self, id: TensorId) -> Option<&[u8]> {
        let _ = id;
        None
    }
    /// Installs (or removes) a per-node eval callback. `Err` from backends that have none.
    fn set_eval_callback(&mut self, cb: Option<EvalCallback>) -> Result<()> {
        let _ = cb;
        Err(Error::Unsupported {
            op: "set_eval_callback",
            backend: String::new(),
            msg: "this backend's plans have no eval callback".into(),
        })
    }
}

/// A family of devices (ggml's `ggml_backend_reg`). Add one to the process-wide list with
/// [`register`]; the CPU's is there from the start.
pub trait Registry: Send + Sync {
    /// Name ("CPU").
    fn name(&self) -> &str;
    /// The devices it exposes.
    fn devices(&self) -> Vec<Arc<dyn Device>>;
}
