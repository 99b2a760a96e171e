//! Parsing and validation of a GGUF header (magic, version, counts, metadata, tensor infos) from a
//! byte slice, following ggml's `gguf_init_from_reader` (src/gguf.cpp).
//!
//! Everything read is checked before it is trusted: every length and count against the bytes left,
//! so a hostile file cannot make the reader allocate more than its own size justifies; every size
//! computation is overflow-checked; every error names the key, tensor or value at fault.

use super::value::{Array, Metadata, Value, ValueType};
use super::{
    DEFAULT_ALIGNMENT, GGUF_MAGIC, KEY_GENERAL_ALIGNMENT, MAX_DIMS, MAX_NAME_LEN, MAX_STRING_LEN,
    TensorInfo,
};
use crate::dtype::DType;
use crate::error::{Error, Result};
use std::collections::HashMap;

fn err(msg: impl Into<String>) -> Error {
    Error::Gguf(msg.into())
}

/// A little-endian cursor over the file's bytes; every read is bounds-checked.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(err(format!(
                "file truncated reading {} at offset {}: need {n} bytes, {} left",
                what(),
                self.pos,
                self.remaining()
            )));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, what)?);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn i64(&mut self, what: &dyn Fn() -> String) -> Result<i64> {
        Ok(i64::from_le_bytes(self.array(what)?))
    }

    /// A count of items of at least `min_size` bytes each, refused unless the rest of the file can
    /// hold that many (this bounds every allocation by the file's size).
    fn count(&mut self, min_size: usize, what: &dyn Fn() -> String) -> Result<usize> {
        let n = self.u64(what)?;
        let fits = usize::try_from(n)
            .ok()
            .filter(|&n| n.checked_mul(min_size).is_some_and(|bytes| bytes <= self.remaining()));
        fits.ok_or_else(|| {
            err(format!(
                "{} is {n}, more than the {} bytes left in the file can hold",
                what(),
                self.remaining()
            ))
        })
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let len = self.u64(&|| format!("length of {}", what()))?;
        if len > MAX_STRING_LEN {
            return Err(err(format!(
                "{}: string length {len} exceeds the maximum {MAX_STRING_LEN}",
                what()
            )));
        }
        // `len` fits in usize: it is at most 1 GiB. `take` checks it against the bytes left.
        let bytes = self.take(len as usize, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|e| err(format!("{} is not valid UTF-8: {e}", what())))
    }
}

/// Reads `n` fixed-size little-endian values; `n * SIZE` was checked against the bytes left.
fn fixed<T, const SIZE: usize>(
    c: &mut Cursor<'_>,
    n: usize,
    what: &dyn Fn() -> String,
    conv: impl Fn([u8; SIZE]) -> T,
) -> Result<Vec<T>> {
    let bytes = c.take(n * SIZE, what)?;
    Ok(bytes
        .chunks_exact(SIZE)
        .map(|ch| {
            let mut a = [0u8; SIZE];
            a.copy_from_slice(ch);
            conv(a)
        })
        .collect())
}

fn bool_of(b: u8, what: &dyn Fn() -> String) -> Result<bool> {
    match b {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(err(format!("{}: bool value {b} is neither 0 nor 1", what()))),
    }
}

fn read_scalar(c: &mut Cursor<'_>, ty: ValueType, what: &dyn Fn() -> String) -> Result<Value> {
    Ok(match ty {
        ValueType::U8 => Value::U8(u8::from_le_bytes(c.array(what)?)),
        ValueType::I8 => Value::I8(i8::from_le_bytes(c.array(what)?)),
        ValueType::U16 => Value::U16(u16::from_le_bytes(c.array(what)?)),
        ValueType::I16 => Value::I16(i16::from_le_bytes(c.array(what)?)),
        ValueType::U32 => Value::U32(u32::from_le_bytes(c.array(what)?)),
        ValueType::I32 => Value::I32(i32::from_le_bytes(c.array(what)?)),
        ValueType::F32 => Value::F32(f32::from_le_bytes(c.array(what)?)),
        ValueType::Bool => Value::Bool(bool_of(c.array::<1>(what)?[0], what)?),
        ValueType::String => Value::String(c.string(what)?),
        ValueType::U64 => Value::U64(u64::from_le_bytes(c.array(what)?)),
        ValueType::I64 => Value::I64(i64::from_le_bytes(c.array(what)?)),
        ValueType::F64 => Value::F64(f64::from_le_bytes(c.array(what)?)),
        ValueType::Array => return Err(err(format!("{}: nested arrays are not allowed", what()))),
    })
}

fn read_array(c: &mut Cursor<'_>, key: &str) -> Result<Array> {
    let ety_id = c.u32(&|| format!("element type of array '{key}'"))?;
    let ety = ValueType::from_id(ety_id)
        .ok_or_else(|| err(format!("array '{key}' has invalid element type id {ety_id}")))?;
    if ety == ValueType::Array {
        return Err(err(format!(
            "array '{key}' is an array of arrays; nested arrays are not allowed"
        )));
    }
    let what = || format!("array '{key}' ({} elements)", ety.name());
    let n = c.count(ety.min_size(), &|| format!("element count of array '{key}'"))?;
    Ok(match ety {
        ValueType::U8 => Array::U8(fixed(c, n, &what, u8::from_le_bytes)?),
        ValueType::I8 => Array::I8(fixed(c, n, &what, i8::from_le_bytes)?),
        ValueType::U16 => Array::U16(fixed(c, n, &what, u16::from_le_bytes)?),
        ValueType::I16 => Array::I16(fixed(c, n, &what, i16::from_le_bytes)?),
        ValueType::U32 => Array::U32(fixed(c, n, &what, u32::from_le_bytes)?),
        ValueType::I32 => Array::I32(fixed(c, n, &what, i32::from_le_bytes)?),
        ValueType::F32 => Array::F32(fixed(c, n, &what, f32::from_le_bytes)?),
        ValueType::U64 => Array::U64(fixed(c, n, &what, u64::from_le_bytes)?),
        ValueType::I64 => Array::I64(fixed(c, n, &what, i64::from_le_bytes)?),
        ValueType::F64 => Array::F64(fixed(c, n, &what, f64::from_le_bytes)?),
        ValueType::Bool => {
            let raw = c.take(n, &what)?;
            Array::Bool(raw.iter().map(|&b| bool_of(b, &what)).collect::<Result<_>>()?)
        }
        ValueType::String => {
            // `count` proved n * 8 <= bytes left; reserving at most RESERVE up front keeps even
            // that from turning into a large allocation before the strings are actually read.
            let mut v = Vec::with_capacity(n.min(RESERVE));
            for i in 0..n {
                v.push(c.string(&|| format!("element {i} of array '{key}'"))?);
            }
            Array::String(v)
        }
        ValueType::Array => unreachable!("refused above"),
    })
}

/// Most items reserved up front for a count read from the file; more grow as they are read.
const RESERVE: usize = 4096;
/// Least bytes of one metadata pair: key length, type id and a one-byte value (the key itself
/// counts as 0 bytes here; empty keys are refused when read).
const MIN_KV_SIZE: usize = 8 + 4 + 1;
/// Minimum bytes of one tensor info: name length, n_dims, type, offset.
const MIN_TENSOR_INFO_SIZE: usize = 8 + 4 + 4 + 8;

/// The parsed, validated header of a GGUF file: version, metadata and tensor infos, with the
/// offset of the data section. It borrows nothing: tensor data stays in the bytes it came from
/// (see [`super::GgufFile`], which keeps those bytes in a [`crate::Buffer`]).
#[derive(Clone, Debug)]
pub struct Gguf {
    pub(crate) version: u32,
    pub(crate) alignment: usize,
    pub(crate) data_offset: usize,
    pub(crate) metadata: Metadata,
    pub(crate) tensors: Vec<TensorInfo>,
    pub(crate) by_name: HashMap<String, usize>,
}

impl Gguf {
    /// Parses and validates the whole file in `bytes` (header and the placement of every tensor's
    /// data). Returns `Err` naming the fault for any malformed input; never panics.
    ///
    /// ```
    /// use quantgraph::gguf::{Gguf, GgufWriter};
    /// let mut w = GgufWriter::new();
    /// w.add("general.name", "tiny")?;
    /// let bytes = w.to_vec()?;
    /// let g = Gguf::parse(&bytes)?;
    /// assert_eq!(g.metadata().get_str("general.name")?, "tiny");
    /// assert!(Gguf::parse(&bytes[..10]).is_err());
    /// # Ok::<(), quantgraph::Error>(())
    /// ```
    pub fn parse(bytes: &[u8]) -> Result<Gguf> {
        let mut c = Cursor { buf: bytes, pos: 0 };
        let magic = c.take(4, &|| "magic".into())?;
        if magic != GGUF_MAGIC {
            return Err(err(format!("bad magic {magic:02x?}, expected \"GGUF\"")));
        }
        let version = c.u32(&|| "version".into())?;
        if version != 0 && version & 0xffff == 0 {
            return Err(err(format!(
                "version {version:#x} looks byte-swapped: big-endian GGUF files are not supported"
            )));
        }
        match version {
            2 | 3 => {}
            1 => return Err(err("GGUF version 1 is not supported (only versions 2 and 3)")),
            v => return Err(err(format!("unknown GGUF version {v} (only versions 2 and 3)"))),
        }
        let n_tensors_raw = c.i64(&|| "tensor count".into())?;
        let n_kv_raw = c.i64(&|| "metadata count".into())?;
        if n_tensors_raw < 0 {
            return Err(err(format!("tensor count {n_tensors_raw} is negative")));
        }
        if n_kv_raw < 0 {
            return Err(err(format!("metadata count {n_kv_raw} is negative")));
        }
        let check = |n: i64, size: usize, what: &str, rem: usize| -> Result<usize> {
            usize::try_from(n)
                .ok()
                .filter(|&n| n.checked_mul(size).is_some_and(|b| b <= rem))
                .ok_or_else(|| {
                    err(format!(
                        "{what} {n} is more than the {rem} bytes left in the file can hold"
                    ))
                })
        };
        let n_kv = check(n_kv_raw, MIN_KV_SIZE, "metadata count", c.remaining())?;
        let n_tensors = check(n_tensors_raw, MIN_TENSOR_INFO_SIZE, "tensor count", c.remaining())?;

        let mut metadata = Metadata::with_capacity(n_kv.min(RESERVE));
        for i in 0..n_kv {
            let key = c.string(&|| format!("key of metadata pair {i}"))?;
            if key.is_empty() {
                return Err(err(format!("metadata pair {i} has an empty key")));
            }
            if metadata.contains_key(&key) {
                return Err(err(format!("duplicate metadata key '{key}'")));
            }
            let ty_id = c.u32(&|| format!("type of metadata key '{key}'"))?;
            let ty = ValueType::from_id(ty_id)
                .ok_or_else(|| err(format!("metadata key '{key}' has invalid type id {ty_id}")))?;
            let value = if ty == ValueType::Array {
                Value::Array(read_array(&mut c, &key)?)
            } else {
                read_scalar(&mut c, ty, &|| format!("value of metadata key '{key}'"))?
            };
            metadata.insert(key, value)?;
        }

        let alignment = match metadata.get(KEY_GENERAL_ALIGNMENT) {
            None => DEFAULT_ALIGNMENT,
            Some(Value::U32(a)) => {
                if *a == 0 || !a.is_power_of_two() {
                    return Err(err(format!(
                        "{KEY_GENERAL_ALIGNMENT} is {a}, which is not a power of two"
                    )));
                }
                *a as usize
            }
            Some(v) => {
                return Err(err(format!(
                    "{KEY_GENERAL_ALIGNMENT} must have type u32 but has type {}",
                    v.type_name()
                )));
            }
        };

        let mut tensors = Vec::with_capacity(n_tensors.min(RESERVE));
        let mut by_name = HashMap::with_capacity(n_tensors.min(RESERVE));
        for i in 0..n_tensors {
            let name = c.string(&|| format!("name of tensor {i}"))?;
            if name.len() >= MAX_NAME_LEN {
                return Err(err(format!(
                    "tensor {i} name '{name}' is {} bytes long, the limit is {}",
                    name.len(),
                    MAX_NAME_LEN - 1
                )));
            }
            if by_name.contains_key(&name) {
                return Err(err(format!("duplicate tensor name '{name}'")));
            }
            let n_dims = c.u32(&|| format!("n_dims of tensor '{name}'"))?;
            if n_dims as usize > MAX_DIMS {
                return Err(err(format!(
                    "tensor '{name}' has {n_dims} dimensions, at most {MAX_DIMS} are allowed"
                )));
            }
            let mut ne = [1usize; MAX_DIMS];
            for (j, d) in ne.iter_mut().enumerate().take(n_dims as usize) {
                let v = c.i64(&|| format!("dimension {j} of tensor '{name}'"))?;
                *d = usize::try_from(v).map_err(|_| {
                    err(format!("tensor '{name}' dimension {j} is {v}, not a valid size"))
                })?;
            }
            let ty_id = c.u32(&|| format!("type of tensor '{name}'"))?;
            let dtype = DType::from_ggml_id(ty_id)
                .ok_or_else(|| err(format!("tensor '{name}' has unknown ggml type id {ty_id}")))?;
            let rel = c.u64(&|| format!("data offset of tensor '{name}'"))?;

            let shape_err = |what: &str| {
                err(format!("tensor '{name}' {dtype} {ne:?}: {what}", ne = &ne[..n_dims as usize]))
            };
            let n_elements = ne
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
                .filter(|&n| n <= i64::MAX as u64)
                .ok_or_else(|| shape_err("element count overflows"))?;
            let row = dtype.row_size(ne[0]).map_err(|_| {
                shape_err(&format!(
                    "ne[0] is not a multiple of the block size {}",
                    dtype.block_size()
                ))
            })?;
            let size = ne[1..]
                .iter()
                .try_fold(row, |acc, &d| acc.checked_mul(d))
                .ok_or_else(|| shape_err("byte size overflows"))?;
            if rel % alignment as u64 != 0 {
                return Err(shape_err(&format!(
                    "data offset {rel} is not a multiple of the alignment {alignment}"
                )));
            }
            by_name.insert(name.clone(), i);
            tensors.push(TensorInfo {
                name,
                dtype,
                n_dims: n_dims as usize,
                ne,
                n_elements,
                size,
                data_offset: rel,
                offset: 0,
            });
        }

        // The data section starts at the next multiple of the alignment (ggml seeks there only
        // when there are tensors; a file without tensors may end right after its metadata).
        let data_offset = if n_tensors > 0 {
            let start = c.pos.div_ceil(alignment).checked_mul(alignment);
            match start {
                Some(s) if s <= bytes.len() => s,
                _ => {
                    return Err(err(format!(
                        "file ends before the data section (header ends at {}, alignment {alignment})",
                        c.pos
                    )));
                }
            }
        } else {
            c.pos
        };

        let data_len = (bytes.len() - data_offset) as u64;
        for t in &mut tensors {
            let end = t.data_offset.checked_add(t.size as u64);
            if end.is_none_or(|e| e > data_len) {
                return Err(err(format!(
                    "tensor '{}' data {}..{} (relative to the data section at {data_offset}) \
                     is outside the file of {} bytes",
                    t.name,
                    t.data_offset,
                    t.data_offset as u128 + t.size as u128,
                    bytes.len()
                )));
            }
            // Both fit in the file's length, which is a usize.
            t.offset = data_offset + t.data_offset as usize;
        }

        let mut order: Vec<usize> = (0..tensors.len()).filter(|&i| tensors[i].size > 0).collect();
        order.sort_by_key(|&i| tensors[i].offset);
        for w in order.windows(2) {
            let (a, b) = (&tensors[w[0]], &tensors[w[1]]);
            if a.offset + a.size > b.offset {
                return Err(err(format!(
                    "tensor '{}' (bytes {}..{}) overlaps tensor '{}' (bytes {}..{})",
                    a.name,
                    a.offset,
                    a.offset + a.size,
                    b.name,
                    b.offset,
                    b.offset + b.size
                )));
            }
        }

        Ok(Gguf { version, alignment, data_offset, metadata, tensors, by_name })
    }

    /// The file's GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Alignment of the data section and tensor offsets (`general.alignment`, default 32).
    pub fn alignment(&self) -> usize {
        self.alignment
    }

    /// Byte offset of the data section from the start of the file.
    pub fn data_offset(&self) -> usize {
        self.data_offset
    }

    /// The key-value metadata.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Every tensor, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }
}
