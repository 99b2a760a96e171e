//! Buffer types (ggml's `ggml_backend_buffer_type`): the kinds of memory a tensor can live in.
//! The CPU's two are here; another backend implements [`BufferType`] for its own memory and
//! [`DeviceMemory`] for the storage behind each of its buffers.

use super::{BUFFER_ALIGNMENT, Buffer};
use crate::dtype::DType;
use crate::error::{Error, Result};
use std::any::Any;

/// A kind of memory tensors can be stored in (ggml's `ggml_backend_buffer_type`).
///
/// Buffer types are told apart by identity, not by name: a device accepts a buffer type when it
/// is one of its own Rust types (`(buft as &dyn Any).is::<MyBufferType>()`), or host memory.
/// Every [`Buffer`] knows its type ([`Buffer::buffer_type`]).
pub trait BufferType: Any + Send + Sync {
    /// Name ("CPU"), for messages.
    fn name(&self) -> &str;
    /// Alignment of allocations in bytes.
    fn alignment(&self) -> usize;
    /// Largest single allocation.
    fn max_size(&self) -> usize;
    /// True when the memory is host memory in ggml's plain layout that the CPU can read
    /// directly.
    fn is_host(&self) -> bool;
    /// Allocates a zeroed buffer of `size` bytes. A device's buffer type returns
    /// [`Buffer::from_device`] over its own memory.
    fn alloc(&self, size: usize) -> Result<Buffer>;
    /// True when a tensor of `dtype` and shape `ne` can be stored in this buffer type (the
    /// device's per-tensor choice of an extra buffer type, like ggml's `extra_buffer_type`).
    fn supports_tensor(&self, dtype: DType, ne: &[usize]) -> bool {
        let _ = (dtype, ne);
        true
    }
}

impl dyn BufferType {
    /// True when this buffer type is the Rust type `T` (identity, not name).
    pub fn is<T: BufferType>(&self) -> bool {
        (self as &dyn Any).is::<T>()
    }
}

/// The storage behind a buffer that is not host memory (ggml's `ggml_backend_buffer_i`): device
/// memory, a remote machine's memory, a file. [`Buffer::from_device`] wraps it; the buffer's
/// `read`, `write`, `fill`, `set_tensor`, `get_tensor` and `copy_to` then go through it, after
/// checking ranges and taking the buffer's reader/writer lock. The backend that owns the memory
/// reaches its own type again with `(buffer.device_memory()? as &dyn Any).downcast_ref::<M>()`.
pub trait DeviceMemory: Any + Send + Sync {
    /// Size in bytes.
    fn size(&self) -> usize;
    /// Copies `data` to byte `offset` (the range is checked by the caller).
    fn write(&self, offset: usize, data: &[u8]) -> Result<()>;
    /// Copies bytes at `offset` into `out` (the range is checked by the caller).
    fn read(&self, offset: usize, out: &mut [u8]) -> Result<()>;
    /// Sets every byte to `byte`.
    fn fill(&self, byte: u8) -> Result<()> {
        let chunk = [byte; 4096];
        let mut off = 0;
        while off < self.size() {
            let n = (self.size() - off).min(chunk.len());
            self.write(off, &chunk[..n])?;
            off += n;
        }
        Ok(())
    }
    /// Copies `len` bytes at `src_offset` of `src` (another buffer, maybe of another device) to
    /// `dst_offset` of this memory without going through the host, when the device can (ggml's
    /// `cpy_tensor`). `Ok(false)` means "not this way"; the caller then stages through host memory.
    /// Called with `src` locked for reading and this memory's buffer for writing: reach the
    /// source through `src.device_memory()` (or `src.read`: read locks are shared), never through
    /// this buffer's own `write`.
    fn copy_from(
        &self,
        dst_offset: usize,
        src: &Buffer,
        src_offset: usize,
        len: usize,
    ) -> Result<bool> {
        let _ = (dst_offset, src, src_offset, len);
        Ok(false)
    }
}

/// Plain host memory, 64-byte aligned.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBufferType;

impl BufferType for CpuBufferType {
    fn name(&self) -> &str {
        "CPU"
    }
    fn alignment(&self) -> usize {
        BUFFER_ALIGNMENT
    }
    fn max_size(&self) -> usize {
        isize::MAX as usize
    }
    fn is_host(&self) -> bool {
        true
    }
    fn alloc(&self, size: usize) -> Result<Buffer> {
        Buffer::alloc_named(size, "CPU")
    }
}

/// Repacked weights (ggml's CPU_REPACK): Q4_0, IQ4_NL, MXFP4, Q4_K, Q6_K, Q2_K and TQ2_0 matrices with a
/// multiple of 8 rows, stored 8 rows interleaved for the repacked matmul kernels. Store tensors
/// with [`Buffer::set_tensor`] (it repacks on the way in, keeping no plain copy), then bind them
/// with `Graph::weight`; such weights can only feed `mul_mat` as its first source, with F32
/// activations. Same size as the plain layout.
///
/// ```
/// use quantgraph::{Buffer, BufferType, CpuRepackBufferType, DType, Graph};
/// let buft = CpuRepackBufferType;
/// assert!(buft.supports_tensor(DType::Q4_0, &[64, 8]));
/// let w = vec![0u8; DType::Q4_0.row_size(64)? * 8];
/// let buf = buft.alloc(w.len())?;
/// buf.set_tensor(0, DType::Q4_0, &[64, 8], &w)?;
/// let mut g = Graph::new();
/// let wt = g.weight(DType::Q4_0, &[64, 8], &buf, 0)?;
/// let x = g.input(DType::F32, &[64, 3])?;
/// let y = g.mul_mat(wt, x)?;
/// # let _ = y;
/// # Ok::<(), quantgraph::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuRepackBufferType;

impl BufferType for CpuRepackBufferType {
    fn name(&self) -> &str {
        crate::quant::repack::REPACK_NAME
    }
    fn alignment(&self) -> usize {
        BUFFER_ALIGNMENT
    }
    fn max_size(&self) -> usize {
        isize::MAX as usize
    }
    fn is_host(&self) -> bool {
        false
    }
    fn alloc(&self, size: usize) -> Result<Buffer> {
        Buffer::alloc_repack(size)
    }
    fn supports_tensor(&self, dtype: DType, ne: &[usize]) -> bool {
        crate::quant::repack::supports(dtype, ne)
    }
}

pub(super) fn not_host(name: &str, what: &str) -> Error {
    Error::Buffer(format!("{what}: buffer '{name}' is not host memory"))
}
