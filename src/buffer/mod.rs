//! `Buffer`: memory that tensors live in. A 64-byte-aligned host allocation owned by the buffer,
//! memory the caller owns (a `Vec`, a memory map) kept alive by the buffer, or the memory of
//! another device behind a [`DeviceMemory`] (ggml's `ggml_backend_buffer`). Every buffer knows
//! its [`BufferType`].
//!
//! A buffer is a cheap handle (`Clone` shares it). Its bytes are guarded by a small reader/writer
//! state so that a compute reading weights and a caller writing them, or two computes writing the
//! same KV cache, cannot overlap: the loser gets `Error::Buffer`, never a data race.

use crate::error::{Error, Result};
use std::alloc::Layout;
use std::any::Any;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicIsize, Ordering};

use crate::dtype::DType;

mod types;
pub use types::{BufferType, CpuBufferType, CpuRepackBufferType, DeviceMemory};

/// A tensor stored in a CPU_REPACK buffer by [`Buffer::set_tensor`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RepackEntry {
    pub offset: usize,
    pub dtype: DType,
    pub ne: [usize; 4],
}

/// Alignment of buffers allocated by the CPU buffer type.
pub const BUFFER_ALIGNMENT: usize = 64;

/// Buffers of at least this many bytes are anonymous memory maps advised to use transparent
/// huge pages (Linux): one TLB entry per 2 MiB instead of per 4 KiB, so streaming through large
/// weights, KV caches and activations takes fewer page walks (decode reading Q8_0, Q4_0 and F16
/// weights from memory on a Zen 3: medians 1.0-1.1x, rounds 0.9-1.4x).
#[cfg(target_os = "linux")]
const HUGE_PAGE_MIN: usize = 2 << 20;

enum Storage {
    Owned {
        layout: Layout,
    },
    /// A large buffer's memory (see [`HUGE_PAGE_MIN`]); unmapped on drop.
    #[cfg(target_os = "linux")]
    Mapped {
        _map: memmap2::MmapMut,
    },
    Borrowed {
        _owner: Box<dyn Any + Send + Sync>,
    },
    /// Not host memory: every access goes through the device's implementation.
    Device(Box<dyn DeviceMemory>),
}

struct Inner {
    ptr: *mut u8,
    len: usize,
    writable: bool,
    storage: Storage,
    name: String,
    /// > 0: that many readers; -1: one writer; 0: free.
    state: AtomicIsize,
    /// `Some` for CPU_REPACK buffers: the tensors stored (repacked) so far.
    repack: Option<Mutex<Vec<RepackEntry>>>,
    buft: Arc<dyn BufferType>,
}

// SAFETY: the memory behind `ptr` is owned by `Inner` (or by `_owner`, which is Send + Sync) and
// every access to it goes through the reader/writer `state`, so sharing across threads is sound.
unsafe impl Send for Inner {}
// SAFETY: as above; `&Inner` only hands out the pointer under the `state` protocol.
unsafe impl Sync for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Storage::Owned { layout } = self.storage
            && layout.size() != 0
        {
            // SAFETY: `ptr` came from `alloc_zeroed(layout)` in `Buffer::alloc` and is freed once.
            unsafe { std::alloc::dealloc(self.ptr, layout) };
        }
    }
}

/// Memory holding tensor data (host memory, or a device's through [`DeviceMemory`]); cloning
/// shares it.
#[derive(Clone)]
pub struct Buffer {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("name", &self.inner.name)
            .field("len", &self.inner.len)
            .field("writable", &self.inner.writable)
            .finish()
    }
}

impl Buffer {
    /// A zeroed, 64-byte-aligned, writable buffer of `len` bytes.
    pub fn alloc(len: usize) -> Result<Buffer> {
        Buffer::alloc_named(len, "CPU")
    }

    pub(crate) fn alloc_named(len: usize, name: &str) -> Result<Buffer> {
        Buffer::alloc_with(len, name, None)
    }

    fn alloc_with(
        len: usize,
        name: &str,
        repack: Option<Mutex<Vec<RepackEntry>>>,
    ) -> Result<Buffer> {
        let buft: Arc<dyn BufferType> =
            if repack.is_some() { Arc::new(CpuRepackBufferType) } else { Arc::new(CpuBufferType) };
        let (ptr, storage) = Buffer::zeroed(len)?;
        Ok(Buffer {
            inner: Arc::new(Inner {
                ptr,
                len,
                writable: true,
                storage,
                name: name.into(),
                state: AtomicIsize::new(0),
                repack,
                buft,
            }),
        })
    }

    /// `len` zeroed bytes, at least [`BUFFER_ALIGNMENT`]-aligned, and what owns them: a memory
    /// map advised to use huge pages for large buffers on Linux (page-aligned; the heap when the
    /// map fails), else the heap.
    fn zeroed(len: usize) -> Result<(*mut u8, Storage)> {
        #[cfg(target_os = "linux")]
        if len >= HUGE_PAGE_MIN
            && let Ok(mut map) = memmap2::MmapMut::map_anon(len)
        {
            // Only advice: without transparent huge pages the map keeps 4 KiB pages.
            let _ = map.advise(memmap2::Advice::HugePage);
            let ptr = map.as_mut_ptr();
            debug_assert!(ptr.align_offset(BUFFER_ALIGNMENT) == 0);
            return Ok((ptr, Storage::Mapped { _map: map }));
        }
        let layout = Layout::from_size_align(len.max(1), BUFFER_ALIGNMENT)
            .map_err(|_| Error::Buffer(format!("cannot allocate {len} bytes")))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(Error::Buffer(format!("out of memory allocating {len} bytes")));
        }
        Ok((ptr, Storage::Owned { layout }))
    }

    /// A CPU_REPACK buffer: tensors are stored with [`Buffer::set_tensor`], which rearranges them
    /// into the interleaved layout the repacked matmul kernels read.
    pub(crate) fn alloc_repack(len: usize) -> Result<Buffer> {
        Buffer::alloc_with(len, crate::quant::repack::REPACK_NAME, Some(Mutex::new(Vec::new())))
    }

    /// True for buffers of the CPU_REPACK type (weights stored in an interleaved layout).
    pub fn is_repacked(&self) -> bool {
        self.inner.repack.is_some()
    }

    /// Stores a tensor of `dtype` and shape `ne` (ggml order) at byte `offset`. `data` holds the
    /// tensor in ggml's plain layout (rows of blocks). A plain buffer copies it; a CPU_REPACK
    /// buffer rearranges it into the interleaved layout on the way in (no second copy is kept)
    /// and fails for tensors it cannot hold (see [`CpuRepackBufferType`](super::CpuRepackBufferType)).
    pub fn set_tensor(&self, offset: usize, dtype: DType, ne: &[usize], data: &[u8]) -> Result<()> {
        let ne4 = crate::quant::repack::shape4(ne)?;
        let need = crate::quant::repack::plain_bytes(dtype, &ne4)?;
        if data.len() != need {
            return Err(Error::Buffer(format!(
                "set_tensor: {dtype} {ne:?} needs {need} bytes, got {}",
                data.len()
            )));
        }
        let Some(entries) = &self.inner.repack else {
            return self.write(offset, data);
        };
        crate::quant::repack::check(dtype, &ne4)?;
        self.check_range(offset, need)?;
        let _g = self.lock_write()?;
        // SAFETY: the range is inside the allocation (checked above) and the write lock excludes
        // every other reader and writer while the slice lives.
        let dst = unsafe { std::slice::from_raw_parts_mut(self.inner.ptr.add(offset), need) };
        crate::quant::repack::repack(dtype, &ne4, data, dst)?;
        let mut list = match entries.lock() {
            Ok(l) => l,
            Err(e) => e.into_inner(),
        };
        list.retain(|e| {
            let end = e.offset + crate::quant::repack::plain_bytes(e.dtype, &e.ne).unwrap_or(0);
            end <= offset || e.offset >= offset + need
        });
        list.push(RepackEntry { offset, dtype, ne: ne4 });
        Ok(())
    }

    /// Reads a tensor of `dtype` and shape `ne` stored at byte `offset` into `out`, in ggml's plain
    /// layout (a CPU_REPACK buffer un-interleaves it).
    pub fn get_tensor(
        &self,
        offset: usize,
        dtype: DType,
        ne: &[usize],
        out: &mut [u8],
    ) -> Result<()> {
        let ne4 = crate::quant::repack::shape4(ne)?;
        let need = crate::quant::repack::plain_bytes(dtype, &ne4)?;
        if out.len() != need {
            return Err(Error::Buffer(format!(
                "get_tensor: {dtype} {ne:?} needs {need} bytes, got {}",
                out.len()
            )));
        }
        if !self.is_repacked() {
            return self.read(offset, out);
        }
        if !self.holds_repacked(offset, dtype, &ne4) {
            return Err(Error::Buffer(format!(
                "get_tensor: no {dtype} {ne:?} was stored at offset {offset} of '{}'",
                self.inner.name
            )));
        }
        self.check_range(offset, need)?;
        let _g = self.lock_read()?;
        // SAFETY: in range (checked above); the read lock excludes writers while the slice lives.
        let src = unsafe { std::slice::from_raw_parts(self.inner.ptr.add(offset), need) };
        crate::quant::repack::unpack(dtype, &ne4, src, out)
    }

    /// True when `set_tensor` stored exactly this tensor at `offset` of this CPU_REPACK buffer.
    pub(crate) fn holds_repacked(&self, offset: usize, dtype: DType, ne: &[usize; 4]) -> bool {
        let Some(entries) = &self.inner.repack else { return false };
        let list = match entries.lock() {
            Ok(l) => l,
            Err(e) => e.into_inner(),
        };
        list.contains(&RepackEntry { offset, dtype, ne: *ne })
    }

    /// A read-only buffer over memory the caller owns (a `Vec<u8>`, a memory map, ...), without
    /// copying. The owner is kept alive as long as any clone of the buffer or any plan using it.
    pub fn from_host<T>(owner: T) -> Buffer
    where
        T: AsRef<[u8]> + Send + Sync + 'static,
    {
        let boxed: Box<T> = Box::new(owner);
        let slice = (*boxed).as_ref();
        let (ptr, len) = (slice.as_ptr() as *mut u8, slice.len());
        Buffer {
            inner: Arc::new(Inner {
                ptr,
                len,
                writable: false,
                storage: Storage::Borrowed { _owner: boxed },
                name: "CPU_Host".into(),
                state: AtomicIsize::new(0),
                repack: None,
                buft: Arc::new(CpuBufferType),
            }),
        }
    }

    /// A writable buffer over a caller-provided `Vec<u8>` (taken by value, not copied).
    pub fn from_vec(mut v: Vec<u8>) -> Buffer {
        let (ptr, len) = (v.as_mut_ptr(), v.len());
        Buffer {
            inner: Arc::new(Inner {
                ptr,
                len,
                writable: true,
                storage: Storage::Borrowed { _owner: Box::new(v) },
                name: "CPU_Host".into(),
                state: AtomicIsize::new(0),
                repack: None,
                buft: Arc::new(CpuBufferType),
            }),
        }
    }

    /// A buffer over another device's memory (ggml's `ggml_backend_buffer_init`): what a
    /// device's [`BufferType::alloc`] returns. `buft` is the type the buffer reports
    /// ([`Buffer::buffer_type`]); reads and writes go through `memory` after range checks and
    /// under the buffer's reader/writer lock. Such a buffer can hold weights and state of a
    /// graph; the backend whose device accepts `buft` computes the nodes that use them.
    pub fn from_device(buft: Arc<dyn BufferType>, memory: impl DeviceMemory) -> Buffer {
        let len = memory.size();
        Buffer {
            inner: Arc::new(Inner {
                ptr: std::ptr::null_mut(),
                len,
                writable: true,
                name: buft.name().into(),
                storage: Storage::Device(Box::new(memory)),
                state: AtomicIsize::new(0),
                repack: None,
                buft,
            }),
        }
    }

    /// The buffer's type: [`CpuBufferType`] for host memory, [`CpuRepackBufferType`] for
    /// repacked weights, the device's type for [`Buffer::from_device`] buffers.
    pub fn buffer_type(&self) -> Arc<dyn BufferType> {
        self.inner.buft.clone()
    }

    /// True for buffers over another device's memory ([`Buffer::from_device`]): the CPU cannot
    /// address them.
    pub fn is_device(&self) -> bool {
        matches!(self.inner.storage, Storage::Device(_))
    }

    /// The device memory behind a [`Buffer::from_device`] buffer (`None` for host memory).
    pub fn device_memory(&self) -> Option<&dyn DeviceMemory> {
        match &self.inner.storage {
            Storage::Device(m) => Some(m.as_ref()),
            _ => None,
        }
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// True for a zero-byte buffer.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// False for buffers over read-only caller memory (`from_host`).
    pub fn is_writable(&self) -> bool {
        self.inner.writable
    }

    /// The buffer type's name ("CPU", "CPU_Host").
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// True when both handles share the same memory.
    pub fn same(&self, other: &Buffer) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    fn check_range(&self, offset: usize, n: usize) -> Result<()> {
        match offset.checked_add(n) {
            Some(end) if end <= self.inner.len => Ok(()),
            _ => Err(Error::Buffer(format!(
                "range {offset}..{} is outside buffer '{}' of {} bytes",
                offset.saturating_add(n),
                self.inner.name,
                self.inner.len
            ))),
        }
    }

    /// Copies `data` into the buffer at `offset`. Fails when read-only or in use by a compute.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.no_raw_writes()?;
        if !self.inner.writable {
            return Err(Error::Buffer(format!("buffer '{}' is read-only", self.inner.name)));
        }
        self.check_range(offset, data.len())?;
        let _g = self.lock_write()?;
        if let Some(m) = self.device_memory() {
            return m.write(offset, data);
        }
        // SAFETY: the range is inside the allocation (checked above) and the write lock excludes
        // every other reader and writer.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.inner.ptr.add(offset), data.len())
        };
        Ok(())
    }

    /// Copies f32 values into the buffer at byte `offset`.
    pub fn write_f32(&self, offset: usize, data: &[f32]) -> Result<()> {
        self.write(offset, bytemuck::cast_slice(data))
    }

    /// Copies bytes out of the buffer at `offset` into `out`.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check_range(offset, out.len())?;
        let _g = self.lock_read()?;
        if let Some(m) = self.device_memory() {
            return m.read(offset, out);
        }
        // SAFETY: in range (checked above); the read lock excludes writers.
        unsafe {
            std::ptr::copy_nonoverlapping(self.inner.ptr.add(offset), out.as_mut_ptr(), out.len())
        };
        Ok(())
    }

    /// Runs `f` on the whole contents (read lock held). `Err` for device memory: use `read`.
    pub fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
        if self.is_device() {
            return Err(types::not_host(&self.inner.name, "with_bytes"));
        }
        let _g = self.lock_read()?;
        // SAFETY: ptr/len describe the live allocation; the read lock excludes writers while the
        // slice exists (it does not escape `f`).
        let s = unsafe { std::slice::from_raw_parts(self.inner.ptr, self.inner.len) };
        Ok(f(s))
    }

    /// Fills the whole buffer with `byte`.
    pub fn fill(&self, byte: u8) -> Result<()> {
        self.no_raw_writes()?;
        if !self.inner.writable {
            return Err(Error::Buffer(format!("buffer '{}' is read-only", self.inner.name)));
        }
        let _g = self.lock_write()?;
        if let Some(m) = self.device_memory() {
            return m.fill(byte);
        }
        // SAFETY: whole allocation, write lock held.
        unsafe { std::ptr::write_bytes(self.inner.ptr, byte, self.inner.len) };
        Ok(())
    }

    /// Copies `len` bytes at `src_offset` of this buffer to `dst_offset` of `dst`, whatever
    /// memory either lives in (ggml's `ggml_backend_tensor_copy`): host to host directly, to or
    /// from a device through its [`DeviceMemory`], device to device through the destination's
    /// [`DeviceMemory::copy_from`] or else through a host staging copy. Repacked buffers hold
    /// no plain bytes and are refused.
    pub fn copy_to(
        &self,
        src_offset: usize,
        dst: &Buffer,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        if self.is_repacked() {
            return Err(Error::Buffer(format!(
                "copy_to: buffer '{}' holds repacked weights: read tensors with get_tensor",
                self.inner.name
            )));
        }
        dst.no_raw_writes()?;
        if !dst.inner.writable {
            return Err(Error::Buffer(format!("buffer '{}' is read-only", dst.inner.name)));
        }
        self.check_range(src_offset, len)?;
        dst.check_range(dst_offset, len)?;
        if self.same(dst) {
            let _g = self.lock_write()?;
            if let Some(m) = self.device_memory() {
                let mut tmp = vec![0u8; len];
                m.read(src_offset, &mut tmp)?;
                return m.write(dst_offset, &tmp);
            }
            // SAFETY: both ranges are inside the allocation (checked above), the write lock
            // excludes everyone else, and `copy` allows overlapping ranges.
            unsafe {
                std::ptr::copy(self.inner.ptr.add(src_offset), self.inner.ptr.add(dst_offset), len)
            };
            return Ok(());
        }
        match (self.device_memory(), dst.device_memory()) {
            (None, _) => {
                let _g = self.lock_read()?;
                // SAFETY: in range (checked above); the read lock excludes writers while the
                // slice lives.
                let src =
                    unsafe { std::slice::from_raw_parts(self.inner.ptr.add(src_offset), len) };
                dst.write(dst_offset, src)
            }
            (Some(m), None) => {
                let _s = self.lock_read()?;
                let _d = dst.lock_write()?;
                // SAFETY: in range (checked above); the write lock excludes every other access
                // to `dst` while the slice lives.
                let out =
                    unsafe { std::slice::from_raw_parts_mut(dst.inner.ptr.add(dst_offset), len) };
                m.read(src_offset, out)
            }
            (Some(_), Some(dm)) => {
                {
                    let _s = self.lock_read()?;
                    let _d = dst.lock_write()?;
                    if dm.copy_from(dst_offset, self, src_offset, len)? {
                        return Ok(());
                    }
                }
                let mut tmp = vec![0u8; len];
                self.read(src_offset, &mut tmp)?;
                dst.write(dst_offset, &tmp)
            }
        }
    }

    fn no_raw_writes(&self) -> Result<()> {
        if self.is_repacked() {
            return Err(Error::Buffer(format!(
                "buffer '{}' holds repacked weights: store tensors with set_tensor",
                self.inner.name
            )));
        }
        Ok(())
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.inner.ptr
    }

    pub(crate) fn lock_read(&self) -> Result<BufferGuard> {
        let s = &self.inner.state;
        let mut cur = s.load(Ordering::Relaxed);
        loop {
            if cur < 0 {
                return Err(Error::Buffer(format!(
                    "buffer '{}' is being written by another compute or call",
                    self.inner.name
                )));
            }
            match s.compare_exchange_weak(cur, cur + 1, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return Ok(BufferGuard { buf: self.clone(), write: false }),
                Err(v) => cur = v,
            }
        }
    }

    pub(crate) fn lock_write(&self) -> Result<BufferGuard> {
        match self.inner.state.compare_exchange(0, -1, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => Ok(BufferGuard { buf: self.clone(), write: true }),
            Err(_) => Err(Error::Buffer(format!(
                "buffer '{}' is in use by another compute or call",
                self.inner.name
            ))),
        }
    }
}

/// Held while a buffer is read or written; releases on drop.
pub(crate) struct BufferGuard {
    buf: Buffer,
    write: bool,
}

impl Drop for BufferGuard {
    fn drop(&mut self) {
        let s = &self.buf.inner.state;
        if self.write {
            s.store(0, Ordering::Release);
        } else {
            s.fetch_sub(1, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_buffers_are_aligned_zeroed_and_hold_their_bytes() {
        // Above the huge-page threshold on Linux: a memory map rather than the heap.
        let len = (5 << 20) + 3;
        let b = Buffer::alloc(len).unwrap();
        assert_eq!(b.len(), len);
        assert_eq!(b.ptr() as usize % BUFFER_ALIGNMENT, 0);
        let mut out = vec![1u8; len];
        b.read(0, &mut out).unwrap();
        assert!(out.iter().all(|&x| x == 0));
        let bytes: Vec<u8> = (0..len).map(|i| (i * 7 + 1) as u8).collect();
        b.write(0, &bytes).unwrap();
        let c = b.clone();
        drop(b);
        c.read(0, &mut out).unwrap();
        assert_eq!(out, bytes);
    }

    #[test]
    fn alloc_is_aligned_and_zeroed() {
        let b = Buffer::alloc(100).unwrap();
        assert_eq!(b.ptr() as usize % BUFFER_ALIGNMENT, 0);
        let mut out = [1u8; 100];
        b.read(0, &mut out).unwrap();
        assert!(out.iter().all(|&x| x == 0));
    }

    #[test]
    fn out_of_range_and_read_only_are_errors() {
        let b = Buffer::alloc(8).unwrap();
        assert!(b.write(4, &[0; 5]).is_err());
        assert!(b.write(usize::MAX, &[0; 1]).is_err());
        let h = Buffer::from_host(vec![1u8, 2, 3]);
        assert!(h.write(0, &[0]).is_err());
        let mut o = [0u8; 3];
        h.read(0, &mut o).unwrap();
        assert_eq!(o, [1, 2, 3]);
    }

    #[test]
    fn writer_excludes_readers() {
        let b = Buffer::alloc(8).unwrap();
        let g = b.lock_read().unwrap();
        assert!(b.lock_write().is_err());
        drop(g);
        let w = b.lock_write().unwrap();
        assert!(b.lock_read().is_err());
        drop(w);
        assert!(b.lock_read().is_ok());
    }
}
