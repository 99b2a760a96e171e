//! `GgufWriter`: builds a GGUF v3 file from metadata and tensor bytes, laid out as ggml's
//! `gguf_write_out` does: header, metadata, tensor infos, zero padding to the alignment, then each
//! tensor's data followed by zero padding to the alignment.

use super::value::{Array, Metadata, Value};
use super::{DEFAULT_ALIGNMENT, GGUF_MAGIC, KEY_GENERAL_ALIGNMENT, MAX_DIMS, MAX_NAME_LEN};
use crate::buffer::Buffer;
use crate::dtype::DType;
use crate::error::{Error, Result};
use std::io::Write;
use std::path::Path;

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
        let mut w = Counting { out, n: 0 };
        w.put(GGUF_MAGIC)?;
        w.put(&GGUF_VERSION.to_le_bytes())?;
        w.put(&(self.tensors.len() as u64).to_le_bytes())?;
        w.put(&(self.metadata.len() as u64).to_le_bytes())?;
        for (k, v) in self.metadata.iter() {
            w.string(k)?;
            w.put(&v.value_type().id().to_le_bytes())?;
            write_value(&mut w, v)?;
        }
        let mut rel = 0usize;
        for t in &self.tensors {
            w.string(&t.name)?;
            w.put(&(t.ne.len() as u32).to_le_bytes())?;
            for &d in &t.ne {
                w.put(&(d as u64).to_le_bytes())?;
            }
            w.put(&t.dtype.ggml_id().to_le_bytes())?;
            w.put(&(rel as u64).to_le_bytes())?;
            rel = rel
                .checked_add(pad_to(t.size, self.alignment))
                .ok_or(Error::Overflow { what: "GGUF data section size" })?;
        }
        w.pad(self.alignment)?;
        for t in &self.tensors {
            match &t.data {
                Data::Bytes(b) => w.put(b)?,
                Data::Owned(v) => w.put(v)?,
                Data::Buffer(buf, off) => {
                    buf.with_bytes(|all| w.put(&all[*off..*off + t.size]))??;
                }
            }
            w.pad(self.alignment)?;
        }
        w.out.flush()?;
        Ok(w.n)
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
