//! GGUF: the file format of ggml and llama.cpp models (ggml's src/gguf.cpp, include/gguf.h).
//!
//! [`GgufFile::open`] memory-maps a file, validates its header and exposes its tensors zero-copy in
//! a read-only host [`Buffer`] that keeps the map alive; [`GgufFile::bind`] turns a tensor into a
//! graph weight. [`Gguf::parse`] validates a header from any byte slice; [`GgufWriter`] writes v3
//! files laid out as ggml writes them, or metadata only, or split into shards ([`GgufModel`] reads
//! a split model back, zero-copy across the shards' maps); [`GgufFile::from_reader`] reads from any
//! `Read + Seek`. Versions 2 and 3 are read; version 1, unknown versions and
//! big-endian files are refused.
//!
//! ```no_run
//! use quantgraph::Graph;
//! use quantgraph::gguf::GgufFile;
//!
//! let file = GgufFile::open("model.gguf")?;
//! let n_layers = file.metadata().get_u32("llama.block_count")?;
//! let mut g = Graph::new();
//! let tok_embd = file.bind(&mut g, "token_embd.weight")?;
//! # let _ = (n_layers, tok_embd);
//! # Ok::<(), quantgraph::Error>(())
//! ```

mod reader;
mod split;
mod value;
mod writer;

pub use reader::Gguf;
pub use split::{
    GgufModel, KEY_SPLIT_COUNT, KEY_SPLIT_NO, KEY_SPLIT_TENSORS_COUNT, SplitBy, split_path,
    split_prefix,
};
pub use value::{Array, ArrayElement, Metadata, Scalar, Value, ValueType};
pub use writer::{GGUF_VERSION, GgufWriter};

use crate::buffer::Buffer;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::{Graph, TensorId};
use std::path::Path;

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: &[u8; 4] = b"GGUF";
/// Data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: usize = 32;
/// The metadata key that sets the alignment (must be a power-of-two u32).
pub const KEY_GENERAL_ALIGNMENT: &str = "general.alignment";
/// Most dimensions a tensor can have (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;
/// ggml's `GGML_MAX_NAME`: tensor names are at most `MAX_NAME_LEN - 1` bytes.
pub const MAX_NAME_LEN: usize = 64;
/// Longest string a file may hold (ggml's `GGUF_MAX_STRING_LENGTH`, 1 GiB).
pub const MAX_STRING_LEN: u64 = 1 << 30;

/// One tensor of a GGUF file: name, type, shape and where its bytes are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub(crate) name: String,
    pub(crate) dtype: DType,
    pub(crate) n_dims: usize,
    pub(crate) ne: [usize; MAX_DIMS],
    pub(crate) n_elements: u64,
    pub(crate) size: usize,
    /// Offset from the start of the data section, as stored in the file.
    pub(crate) data_offset: u64,
    /// Offset from the start of the file (and of [`GgufFile::buffer`]).
    pub(crate) offset: usize,
}

impl TensorInfo {
    /// The tensor's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shape as stored (`n_dims` entries, ggml order: `shape()[0]` is innermost).
    pub fn shape(&self) -> &[usize] {
        &self.ne[..self.n_dims]
    }

    /// The shape padded with 1s to four dimensions.
    pub fn ne(&self) -> [usize; MAX_DIMS] {
        self.ne
    }

    /// Number of elements.
    pub fn n_elements(&self) -> u64 {
        self.n_elements
    }

    /// Bytes of tensor data.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Absolute byte offset of the data from the start of the file, which is also its offset in
    /// [`GgufFile::buffer`].
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Offset relative to the data section, as stored in the file.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }
}

/// A 64-byte-aligned copy of some bytes, for [`GgufFile::from_bytes`].
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
struct Line([u8; 64]);

struct AlignedBytes {
    lines: Vec<Line>,
    len: usize,
}

impl AlignedBytes {
    fn copy_of(bytes: &[u8]) -> AlignedBytes {
        let mut lines = vec![Line([0; 64]); bytes.len().div_ceil(64)];
        bytemuck::cast_slice_mut::<Line, u8>(&mut lines)[..bytes.len()].copy_from_slice(bytes);
        AlignedBytes { lines, len: bytes.len() }
    }
}

impl AsRef<[u8]> for AlignedBytes {
    fn as_ref(&self) -> &[u8] {
        &bytemuck::cast_slice::<Line, u8>(&self.lines)[..self.len]
    }
}

/// A validated GGUF file whose bytes live in a read-only host [`Buffer`]: a memory map for
/// [`open`](Self::open) (no copy; the buffer keeps the map alive, also inside graphs and plans
/// that use its tensors), an aligned copy for
/// [`from_bytes`](Self::from_bytes), the caller's `Vec` for [`from_vec`](Self::from_vec).
#[derive(Clone, Debug)]
pub struct GgufFile {
    gguf: Gguf,
    buffer: Buffer,
}

impl GgufFile {
    /// Memory-maps the file at `path` and validates it.
    ///
    /// The file must not be modified while it is mapped (the usual contract of memory maps: bytes
    /// changed by another process show through, and a truncated file faults on access).
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref();
        let file = std::fs::File::open(path).map_err(|e| {
            Error::Io(std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
        })?;
        // SAFETY: the map is only ever read through shared slices (the buffer is read-only). The
        // remaining hazard, another process truncating or rewriting the file while it is mapped,
        // cannot be excluded by any library; it is the documented contract of this function.
        let map = unsafe { memmap2::Mmap::map(&file) }?;
        let gguf = Gguf::parse(&map).map_err(|e| match e {
            Error::Gguf(m) => Error::Gguf(format!("{}: {m}", path.display())),
            e => e,
        })?;
        Ok(GgufFile { gguf, buffer: Buffer::from_host(map) })
    }

    /// Validates `bytes` and copies them into a new 64-byte-aligned buffer (so tensor data is as
    /// aligned as in a memory map).
    pub fn from_bytes(bytes: &[u8]) -> Result<GgufFile> {
        let gguf = Gguf::parse(bytes)?;
        Ok(GgufFile { gguf, buffer: Buffer::from_host(AlignedBytes::copy_of(bytes)) })
    }

    /// Validates `bytes` and keeps them, without copying, as the file's buffer. Tensor data is
    /// then only as aligned as the `Vec`'s allocation.
    pub fn from_vec(bytes: Vec<u8>) -> Result<GgufFile> {
        let gguf = Gguf::parse(&bytes)?;
        Ok(GgufFile { gguf, buffer: Buffer::from_host(bytes) })
    }

    /// Reads a whole GGUF from any seekable reader (a file, a `Cursor`, a decompressing
    /// stream with seek support) from its current position to its end, validates it and keeps
    /// the bytes in a 64-byte-aligned buffer, as [`from_bytes`](Self::from_bytes) does.
    pub fn from_reader<R: std::io::Read + std::io::Seek>(reader: &mut R) -> Result<GgufFile> {
        let start = reader.stream_position()?;
        let end = reader.seek(std::io::SeekFrom::End(0))?;
        reader.seek(std::io::SeekFrom::Start(start))?;
        let len = usize::try_from(end.saturating_sub(start))
            .map_err(|_| Error::Overflow { what: "GGUF stream length" })?;
        let mut lines = vec![Line([0; 64]); len.div_ceil(64)];
        reader.read_exact(&mut bytemuck::cast_slice_mut::<Line, u8>(&mut lines)[..len])?;
        let bytes = AlignedBytes { lines, len };
        let gguf = Gguf::parse(bytes.as_ref())?;
        Ok(GgufFile { gguf, buffer: Buffer::from_host(bytes) })
    }

    /// The parsed header.
    pub fn gguf(&self) -> &Gguf {
        &self.gguf
    }

    /// The whole file's bytes; tensor `t` is at `t.offset()..t.offset() + t.size()`.
    pub fn buffer(&self) -> &Buffer {
        &self.buffer
    }

    /// The file's GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.gguf.version()
    }

    /// The data alignment.
    pub fn alignment(&self) -> usize {
        self.gguf.alignment()
    }

    /// The key-value metadata.
    pub fn metadata(&self) -> &Metadata {
        self.gguf.metadata()
    }

    /// Every tensor, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        self.gguf.tensors()
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.gguf.tensor(name)
    }

    fn require(&self, name: &str) -> Result<&TensorInfo> {
        self.tensor(name).ok_or_else(|| Error::Gguf(format!("no tensor named '{name}'")))
    }

    /// A copy of the bytes of tensor `name`.
    pub fn tensor_data(&self, name: &str) -> Result<Vec<u8>> {
        let t = self.require(name)?;
        let mut out = vec![0u8; t.size];
        self.buffer.read(t.offset, &mut out)?;
        Ok(out)
    }

    /// Adds tensor `name` to `graph` as a weight that reads the file's buffer in place
    /// ([`Graph::weight`]); the graph and its plans keep the buffer (and the map) alive.
    ///
    /// Every tensor binds zero-copy to [`buffer`](Self::buffer). To run a matrix from the
    /// repacked layout instead, copy it into a [`CpuRepackBufferType`](crate::CpuRepackBufferType)
    /// buffer with [`Buffer::set_tensor`](crate::Buffer::set_tensor) and bind that with
    /// [`Graph::weight`] (as [`Llama::from_gguf_repacked`](crate::models::llama::Llama::from_gguf_repacked) does).
    pub fn bind(&self, graph: &mut Graph, name: &str) -> Result<TensorId> {
        let t = self.require(name)?;
        graph.weight(t.dtype, &t.ne[..t.n_dims.max(1)], &self.buffer, t.offset)
    }
}
