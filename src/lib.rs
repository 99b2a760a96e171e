//! quantgraph: a pure-Rust tensor graph execution engine for CPUs, bit-compatible with ggml.

pub mod dtype;
pub mod error;
pub mod kernels;
pub mod quant;

pub use dtype::{DType, QK_K};
pub use error::{Error, Result};
