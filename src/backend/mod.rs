//! Backend layer modelled on ggml-backend: [`Registry`] -> [`Device`] -> [`Backend`], with
//! [`BufferType`] and [`Buffer`]. The CPU implementation is the one this crate ships.
//!
//! Where ggml looks functions up by string (`get_proc_address`), these traits have typed methods:
//! `features()`, `set_n_threads()`, `set_abort_hook()`.

mod cpu;
pub(crate) mod pool;
pub use crate::quant::repack;

pub(crate) use crate::buffer::BufferGuard;
pub use crate::buffer::{BUFFER_ALIGNMENT, Buffer};
pub(crate) use cpu::CpuShared;
pub use cpu::{
    CpuBackend, CpuBufferType, CpuDevice, CpuRegistry, CpuRepackBufferType, MAX_THREADS,
};

use crate::error::Result;
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

/// What a device can do (ggml's `ggml_backend_dev_caps`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

/// A kind of memory tensors can be stored in (ggml's `ggml_backend_buffer_type`).
pub trait BufferType: Send + Sync {
    /// Name ("CPU").
    fn name(&self) -> &str;
    /// Alignment of allocations in bytes.
    fn alignment(&self) -> usize;
    /// Largest single allocation.
    fn max_size(&self) -> usize;
    /// True when the memory is host memory that the CPU can read directly.
    fn is_host(&self) -> bool;
    /// Allocates a zeroed buffer of `size` bytes.
    fn alloc(&self, size: usize) -> Result<Buffer>;
    /// True when a tensor of `dtype` and shape `ne` can be stored in this buffer type (the
    /// device's per-tensor choice of an extra buffer type, like ggml's `extra_buffer_type`).
    fn supports_tensor(&self, dtype: crate::dtype::DType, ne: &[usize]) -> bool {
        let _ = (dtype, ne);
        true
    }
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
    /// True when the device can compute node `node` of `graph`.
    fn supports_op(&self, graph: &Graph, node: TensorId) -> bool;
    /// True when the device can use tensors stored in `buft`.
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
    fn init_backend(&self) -> Result<CpuBackend>;
}

/// The abort hook: polled between nodes; returning `true` stops the compute with
/// `Error::Aborted`.
pub type AbortHook = Arc<dyn Fn() -> bool + Send + Sync>;

/// A backend computing graphs on a device (ggml's `ggml_backend`).
pub trait Backend: Send + Sync {
    /// Name ("CPU").
    fn name(&self) -> &str;
    /// The device it runs on.
    fn device(&self) -> Arc<dyn Device>;
    /// ggml's feature list for this device: `(name, value)`, e.g. `("AVX2", "1")`.
    fn features(&self) -> Vec<(&'static str, String)>;
    /// Number of worker threads.
    fn n_threads(&self) -> usize;
    /// Sets the number of worker threads (1 to [`MAX_THREADS`] on the CPU backend); takes effect
    /// at the next compute.
    fn set_n_threads(&self, n: usize) -> Result<()>;
    /// Installs (or removes with `None`) the abort hook.
    fn set_abort_hook(&self, hook: Option<AbortHook>);
}

/// A family of devices (ggml's `ggml_backend_reg`).
pub trait Registry: Send + Sync {
    /// Name ("CPU").
    fn name(&self) -> &str;
    /// The devices it exposes.
    fn devices(&self) -> Vec<Arc<dyn Device>>;
}
