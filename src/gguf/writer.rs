//! `GgufWriter`: builds a GGUF v3 file from metadata and tensor bytes, laid out as ggml's
//! `gguf_write_out` does: header, metadata, tensor infos, zero padding to the alignment, then each
//! tensor's data followed by zero padding to the alignment.

use super::split::{KEY_SPLIT_COUNT, KEY_SPLIT_NO, KEY_SPLIT_TENSORS_COUNT, SplitBy, split_path};
use super::value::{Array, Metadata, Value};
use super::{DEFAULT_ALIGNMENT, GGUF_MAGIC, KEY_GENERAL_ALIGNMENT, MAX_DIMS, MAX_NAME_LEN};
use crate::buffer::Buffer;
use crate::dtype::DType;
use crate::error::{Error, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The GGUF version this writer produces.
pub const GGUF_VERSION: u32 = 3;

enum Data<'a> {
    Bytes(&'a [u8]),
    Owned(Vec<u8>),
    Buffer(Buffer, usize),
}

struct PendingTensor<'a> {
    name: String,
    dtype: DType,
    ne: Vec<usize>,
    size: usize,
    data: Data<'a>,
}

/// Builds a GGUF v3 file: add metadata and tensors, then write it to a file, a `Vec` or any
/// `Write`. Tensor bytes are borrowed (or shared, for buffers) until the file is written.
///
/// ```
/// use quantgraph::DType;
/// use quantgraph::gguf::{GgufFile, GgufWriter};
/// let weights: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|x| x.to_le_bytes()).collect();
/// let mut w = GgufWriter::new();
/// w.add("general.architecture", "demo")?;
/// w.add_tensor("w", DType::F32, &[2, 2], &weights)?;
/// let file = GgufFile::from_bytes(&w.to_vec()?)?;
/// let t = file.tensor("w").unwrap();
/// assert_eq!((t.shape(), t.size()), (&[2usize, 2][..], 16));
/// assert_eq!(file.tensor_data("w")?, weights);
/// # Ok::<(), quantgraph::Error>(())
/// ```
pub struct GgufWriter<'a> {
    metadata: Metadata,
    alignment: usize,
    tensors: Vec<PendingTensor<'a>>,
}

impl Default for GgufWriter<'_> {
    fn default() -> Self {
        GgufWriter::new()
    }
}

fn err(msg: impl Into<String>) -> Error {
    Error::Gguf(msg.into())
}

fn pad_to(n: usize, alignment: usize) -> usize {
    n.div_ceil(alignment) * alignment
}

impl<'a> GgufWriter<'a> {
    /// An empty file with the default alignment (32).
    pub fn new() -> GgufWriter<'a> {
        GgufWriter { metadata: Metadata::new(), alignment: DEFAULT_ALIGNMENT, tensors: Vec::new() }
    }

    /// Sets the data alignment and stores it as `general.alignment` (u32), as ggml does. Must be a
    /// power of two, and set before any other `general.alignment`.
    pub fn set_alignment(&mut self, alignment: u32) -> Result<&mut Self> {
        self.add(KEY_GENERAL_ALIGNMENT, alignment)
    }

    /// Adds a metadata pair. `Err` for a duplicate or empty key, or a `general.alignment` that is
    /// not a power-of-two u32.
    pub fn add(&mut self, key: &str, value: impl Into<Value>) -> Result<&mut Self> {
        let value = value.into();
        if key == KEY_GENERAL_ALIGNMENT {
            match value {
                Value::U32(a) if a.is_power_of_two() => {}
                ref v => {
                    return Err(err(format!(
                        "{KEY_GENERAL_ALIGNMENT} must be a power-of-two u32, got {} {v}",
                        v.type_name()
                    )));
                }
            }
        }
        let align = if let Value::U32(a) = value { a as usize } else { 0 };
        self.metadata.insert(key, value)?;
        if key == KEY_GENERAL_ALIGNMENT {
            self.alignment = align;
        }
        Ok(self)
    }

    /// Adds every pair of `metadata` (e.g. copied from a file being rewritten).
    pub fn add_all(&mut self, metadata: &Metadata) -> Result<&mut Self> {
        for (k, v) in metadata.iter() {
            self.add(k, v.clone())?;
        }
        Ok(self)
    }

    /// Sets a metadata pair, overwriting the value of an existing key in place (ggml's
    /// `gguf_set_*`). The same checks as [`add`](Self::add) apply to `general.alignment`.
    pub fn set(&mut self, key: &str, value: impl Into<Value>) -> Result<&mut Self> {
        let value = value.into();
        if !self.metadata.contains_key(key) {
            return self.add(key, value);
        }
        if key == KEY_GENERAL_ALIGNMENT {
            match value {
                Value::U32(a) if a.is_power_of_two() => self.alignment = a as usize,
                ref v => {
                    return Err(err(format!(
                        "{KEY_GENERAL_ALIGNMENT} must be a power-of-two u32, got {} {v}",
                        v.type_name()
                    )));
                }
            }
        }
        self.metadata.set(key, value)?;
        Ok(self)
    }

    /// Removes a metadata pair (ggml's `gguf_remove_key`); returns its value, `None` when absent.
    /// Removing `general.alignment` restores the default alignment.
    pub fn remove(&mut self, key: &str) -> Option<Value> {
        if key == KEY_GENERAL_ALIGNMENT {
            self.alignment = DEFAULT_ALIGNMENT;
        }
        self.metadata.remove(key)
    }

    /// The metadata written so far.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// The names of the tensors added so far, in order.
    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.tensors.iter().map(|t| t.name.as_str())
    }

    /// Replaces the type and bytes of the tensor `name` (ggml's `gguf_set_tensor_type` and
    /// `gguf_set_tensor_data`), keeping its shape and place: e.g. to store a requantized copy.
    /// `data` must be the tensor's byte size in the new type.
    pub fn set_tensor_data(
        &mut self,
        name: &str,
        dtype: DType,
        data: Vec<u8>,
    ) -> Result<&mut Self> {
        let i = self
            .tensors
            .iter()
            .position(|t| t.name == name)
            .ok_or_else(|| err(format!("no tensor named '{name}'")))?;
        let ne = self.tensors[i].ne.clone();
        let old = self.tensors.remove(i);
        let size = match self.check_tensor(name, dtype, &ne) {
            Ok(s) if s == data.len() => s,
            Ok(s) => {
                self.tensors.insert(i, old);
                return Err(err(format!(
                    "tensor '{name}' {dtype} {ne:?} needs {s} bytes, {} were given",
                    data.len()
                )));
            }
            Err(e) => {
                self.tensors.insert(i, old);
                return Err(e);
            }
        };
        self.tensors.insert(
            i,
            PendingTensor { name: name.into(), dtype, ne, size, data: Data::Owned(data) },
        );
        Ok(self)
    }

    /// Removes the tensor `name`; `Err` when there is none.
    pub fn remove_tensor(&mut self, name: &str) -> Result<&mut Self> {
        let i = self
            .tensors
            .iter()
            .position(|t| t.name == name)
            .ok_or_else(|| err(format!("no tensor named '{name}'")))?;
        self.tensors.remove(i);
        Ok(self)
    }

    /// A writer holding every metadata pair and tensor of `file` (tensor bytes shared with the
    /// file's buffer, read when written), to edit and write back or split.
    pub fn from_file(file: &super::GgufFile) -> Result<GgufWriter<'static>> {
        let mut w = GgufWriter::new();
        w.add_all(file.metadata())?;
        for t in file.tensors() {
            w.add_tensor_from_buffer(t.name(), t.dtype(), t.shape(), file.buffer(), t.offset())?;
        }
        Ok(w)
    }

    fn check_tensor(&self, name: &str, dtype: DType, ne: &[usize]) -> Result<usize> {
        if name.len() >= MAX_NAME_LEN {
            return Err(err(format!(
                "tensor name '{name}' is {} bytes long, the limit is {}",
                name.len(),
                MAX_NAME_LEN - 1
            )));
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(err(format!("duplicate tensor name '{name}'")));
        }
        if ne.len() > MAX_DIMS {
            return Err(err(format!("tensor '{name}' has {} dimensions, at most 4", ne.len())));
        }
        if ne.iter().any(|&d| d > i64::MAX as usize) {
            return Err(err(format!("tensor '{name}' dimension too large: {ne:?}")));
        }
        let row = dtype.row_size(ne.first().copied().unwrap_or(1))?;
        ne.iter()
            .skip(1)
            .try_fold(row, |acc, &d| acc.checked_mul(d))
            .ok_or(Error::Overflow { what: "tensor byte size" })
    }

    fn push(&mut self, name: &str, dtype: DType, ne: &[usize], data: Data<'a>) -> Result<()> {
        let size = self.check_tensor(name, dtype, ne)?;
        let have = match &data {
            Data::Bytes(b) => b.len(),
            Data::Owned(v) => v.len(),
            Data::Buffer(..) => size,
        };
        if have != size {
            return Err(err(format!(
                "tensor '{name}' {dtype} {ne:?} needs {size} bytes, {have} were given"
            )));
        }
        self.tensors.push(PendingTensor { name: name.into(), dtype, ne: ne.to_vec(), size, data });
        Ok(())
    }

    /// Adds a tensor of type `dtype` and shape `ne` (ggml order, `ne[0]` innermost, up to 4 dims,
    /// written as given) whose bytes are `data` (exactly the tensor's byte size).
    pub fn add_tensor(
        &mut self,
        name: &str,
        dtype: DType,
        ne: &[usize],
        data: &'a [u8],
    ) -> Result<&mut Self> {
        self.push(name, dtype, ne, Data::Bytes(data))?;
        Ok(self)
    }

    /// Like [`add_tensor`](Self::add_tensor), taking ownership of the bytes.
    pub fn add_tensor_owned(
        &mut self,
        name: &str,
        dtype: DType,
        ne: &[usize],
        data: Vec<u8>,
    ) -> Result<&mut Self> {
        self.push(name, dtype, ne, Data::Owned(data))?;
        Ok(self)
    }

    /// Adds a tensor whose bytes are in `buffer` at byte `offset` (read when the file is written).
    pub fn add_tensor_from_buffer(
        &mut self,
        name: &str,
        dtype: DType,
        ne: &[usize],
        buffer: &Buffer,
        offset: usize,
    ) -> Result<&mut Self> {
        let size = self.check_tensor(name, dtype, ne)?;
        if offset.checked_add(size).is_none_or(|end| end > buffer.len()) {
            return Err(err(format!(
                "tensor '{name}': bytes {offset}..+{size} are outside the buffer of {} bytes",
                buffer.len()
            )));
        }
        self.push(name, dtype, ne, Data::Buffer(buffer.clone(), offset))?;
        Ok(self)
    }

    /// Writes the file to `out`; returns the number of bytes written.
    pub fn write_to<W: Write>(&self, out: &mut W) -> Result<u64> {
        self.write_parts(
            &self.metadata,
            &self.tensors.iter().collect::<Vec<_>>(),
            self.alignment,
            true,
            out,
        )
    }

    /// Writes only the metadata part of the file (header, metadata, tensor infos and the padding
    /// before the data; ggml's `gguf_write_to_file` with `only_meta`): the bytes a full write
    /// starts with. Returns the number of bytes written.
    pub fn write_metadata_to<W: Write>(&self, out: &mut W) -> Result<u64> {
        self.write_parts(
            &self.metadata,
            &self.tensors.iter().collect::<Vec<_>>(),
            self.alignment,
            false,
            out,
        )
    }

    /// [`write_metadata_to`](Self::write_metadata_to) into a `Vec`.
    pub fn metadata_to_vec(&self) -> Result<Vec<u8>> {
        let mut v = Vec::new();
        self.write_metadata_to(&mut v)?;
        Ok(v)
    }

    fn write_parts<W: Write>(
        &self,
        metadata: &Metadata,
        tensors: &[&PendingTensor<'a>],
        alignment: usize,
        with_data: bool,
        out: &mut W,
    ) -> Result<u64> {
        let mut w = Counting { out, n: 0 };
        w.put(GGUF_MAGIC)?;
        w.put(&GGUF_VERSION.to_le_bytes())?;
        w.put(&(tensors.len() as u64).to_le_bytes())?;
        w.put(&(metadata.len() as u64).to_le_bytes())?;
        for (k, v) in metadata.iter() {
            w.string(k)?;
            w.put(&v.value_type().id().to_le_bytes())?;
            write_value(&mut w, v)?;
        }
        let mut rel = 0usize;
        for t in tensors {
            w.string(&t.name)?;
            w.put(&(t.ne.len() as u32).to_le_bytes())?;
            for &d in &t.ne {
                w.put(&(d as u64).to_le_bytes())?;
            }
            w.put(&t.dtype.ggml_id().to_le_bytes())?;
            w.put(&(rel as u64).to_le_bytes())?;
            rel = rel
                .checked_add(pad_to(t.size, alignment))
                .ok_or(Error::Overflow { what: "GGUF data section size" })?;
        }
        w.pad(alignment)?;
        if with_data {
            for t in tensors {
                match &t.data {
                    Data::Bytes(b) => w.put(b)?,
                    Data::Owned(v) => w.put(v)?,
                    Data::Buffer(buf, off) => {
                        buf.with_bytes(|all| w.put(&all[*off..*off + t.size]))??;
                    }
                }
                w.pad(alignment)?;
            }
        }
        w.out.flush()?;
        Ok(w.n)
    }

    /// Writes the model as `split.count` shards at [`split_path`]`(prefix, i, n)` with
    /// llama.cpp's `split.*` keys, as `llama-gguf-split --split` does: every shard has `split.no`
    /// (u16), `split.count` (u16) and `split.tensors.count` (i32, all shards' tensors); the
    /// first also has every other metadata pair. Tensors keep their order; `by` says when a new
    /// shard starts. Returns the paths written.
    pub fn write_split(&self, prefix: &str, by: SplitBy) -> Result<Vec<PathBuf>> {
        let groups = self.split_groups(by)?;
        let n = groups.len();
        if n > u16::MAX as usize {
            return Err(err(format!("{n} shards: split.count is a u16")));
        }
        let n_tensors = i32::try_from(self.tensors.len())
            .map_err(|_| err("too many tensors for split.tensors.count (an i32)"))?;
        let mut paths = Vec::with_capacity(n);
        for (i, group) in groups.iter().enumerate() {
            let mut md = if i == 0 { self.metadata.clone() } else { Metadata::new() };
            for key in [KEY_SPLIT_NO, KEY_SPLIT_COUNT, KEY_SPLIT_TENSORS_COUNT] {
                md.remove(key);
            }
            md.insert(KEY_SPLIT_NO, i as u16)?;
            md.insert(KEY_SPLIT_COUNT, n as u16)?;
            md.insert(KEY_SPLIT_TENSORS_COUNT, n_tensors)?;
            let alignment = if i == 0 { self.alignment } else { DEFAULT_ALIGNMENT };
            let tensors: Vec<&PendingTensor<'a>> =
                group.iter().map(|&t| &self.tensors[t]).collect();
            let path = PathBuf::from(split_path(prefix, i, n));
            let f = std::fs::File::create(&path).map_err(|e| {
                Error::Io(std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
            })?;
            let mut out = std::io::BufWriter::new(f);
            self.write_parts(&md, &tensors, alignment, true, &mut out)?;
            out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
            paths.push(path);
        }
        Ok(paths)
    }

    /// Tensor indices of each shard, with `llama-gguf-split`'s rules: a new shard starts every
    /// `n` tensors, or before a tensor that would take the shard's data (tensor sizes padded to
    /// 32 bytes) past the byte limit. A shard always gets at least one tensor.
    fn split_groups(&self, by: SplitBy) -> Result<Vec<Vec<usize>>> {
        match by {
            SplitBy::MaxTensors(0) => return Err(err("split: at least one tensor per shard")),
            SplitBy::MaxBytes(0) => return Err(err("split: the byte limit must be > 0")),
            _ => {}
        }
        let mut groups: Vec<Vec<usize>> = vec![Vec::new()];
        let mut size = 0usize;
        for (i, t) in self.tensors.iter().enumerate() {
            let bytes = pad_to(t.size, DEFAULT_ALIGNMENT);
            let next = size.saturating_add(bytes);
            let new = match by {
                SplitBy::MaxTensors(n) => i > 0 && i % n == 0,
                SplitBy::MaxBytes(b) => next > b && !groups.last().is_some_and(|g| g.is_empty()),
            };
            if new {
                groups.push(Vec::new());
                size = bytes;
            } else {
                size = next;
            }
            groups.last_mut().expect("one group").push(i);
        }
        Ok(groups)
    }

    /// The file as bytes.
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let mut v = Vec::new();
        self.write_to(&mut v)?;
        Ok(v)
    }

    /// Writes the file at `path` (created or truncated).
    pub fn write_file(&self, path: impl AsRef<Path>) -> Result<u64> {
        let f = std::fs::File::create(path)?;
        let mut out = std::io::BufWriter::new(f);
        let n = self.write_to(&mut out)?;
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        Ok(n)
    }
}

struct Counting<'w, W: Write> {
    out: &'w mut W,
    n: u64,
}

impl<W: Write> Counting<'_, W> {
    fn put(&mut self, b: &[u8]) -> Result<()> {
        self.out.write_all(b)?;
        self.n += b.len() as u64;
        Ok(())
    }

    fn string(&mut self, s: &str) -> Result<()> {
        self.put(&(s.len() as u64).to_le_bytes())?;
        self.put(s.as_bytes())
    }

    fn pad(&mut self, alignment: usize) -> Result<()> {
        let rem = (self.n % alignment as u64) as usize;
        if rem != 0 {
            self.put(&vec![0u8; alignment - rem])?;
        }
        Ok(())
    }
}

fn write_value<W: Write>(w: &mut Counting<'_, W>, v: &Value) -> Result<()> {
    match v {
        Value::U8(x) => w.put(&x.to_le_bytes()),
        Value::I8(x) => w.put(&x.to_le_bytes()),
        Value::U16(x) => w.put(&x.to_le_bytes()),
        Value::I16(x) => w.put(&x.to_le_bytes()),
        Value::U32(x) => w.put(&x.to_le_bytes()),
        Value::I32(x) => w.put(&x.to_le_bytes()),
        Value::F32(x) => w.put(&x.to_le_bytes()),
        Value::Bool(x) => w.put(&[u8::from(*x)]),
        Value::String(s) => w.string(s),
        Value::U64(x) => w.put(&x.to_le_bytes()),
        Value::I64(x) => w.put(&x.to_le_bytes()),
        Value::F64(x) => w.put(&x.to_le_bytes()),
        Value::Array(a) => {
            w.put(&a.elem_type().id().to_le_bytes())?;
            w.put(&(a.len() as u64).to_le_bytes())?;
            macro_rules! each {
                ($v:expr) => {{
                    for x in $v {
                        w.put(&x.to_le_bytes())?;
                    }
                    Ok(())
                }};
            }
            match a {
                Array::U8(v) => w.put(v),
                Array::I8(v) => each!(v),
                Array::U16(v) => each!(v),
                Array::I16(v) => each!(v),
                Array::U32(v) => each!(v),
                Array::I32(v) => each!(v),
                Array::F32(v) => each!(v),
                Array::Bool(v) => {
                    let b: Vec<u8> = v.iter().map(|&x| u8::from(x)).collect();
                    w.put(&b)
                }
                Array::String(v) => {
                    for s in v {
                        w.string(s)?;
                    }
                    Ok(())
                }
                Array::U64(v) => each!(v),
                Array::I64(v) => each!(v),
                Array::F64(v) => each!(v),
            }
        }
    }
}
