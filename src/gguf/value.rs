//! GGUF metadata: the 13 value types (`enum gguf_type` in ggml's include/gguf.h), arrays of them
//! (never nested), and [`Metadata`], the ordered key-value map with typed getters that return
//! `Err` when a key is missing or holds another type.

use crate::error::{Error, Result};
use std::collections::HashMap;

/// A metadata value type with ggml's id (`GGUF_TYPE_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ValueType {
    /// `GGUF_TYPE_UINT8`: unsigned 8-bit integer, 1 byte.
    U8 = 0,
    /// `GGUF_TYPE_INT8`: signed 8-bit integer, 1 byte.
    I8 = 1,
    /// `GGUF_TYPE_UINT16`: unsigned 16-bit integer, 2 bytes little-endian.
    U16 = 2,
    /// `GGUF_TYPE_INT16`: signed 16-bit integer, 2 bytes little-endian.
    I16 = 3,
    /// `GGUF_TYPE_UINT32`: unsigned 32-bit integer, 4 bytes little-endian.
    U32 = 4,
    /// `GGUF_TYPE_INT32`: signed 32-bit integer, 4 bytes little-endian.
    I32 = 5,
    /// `GGUF_TYPE_FLOAT32`: IEEE 754 single precision, 4 bytes little-endian.
    F32 = 6,
    /// `GGUF_TYPE_BOOL`: one byte, 0 or 1; the reader refuses any other byte.
    Bool = 7,
    /// `GGUF_TYPE_STRING`: a u64 byte length, then that many bytes of UTF-8 with no terminator.
    String = 8,
    /// `GGUF_TYPE_ARRAY`: a u32 element type, a u64 count, then the elements; the element type
    /// is never `Array` (nested arrays are refused).
    Array = 9,
    /// `GGUF_TYPE_UINT64`: unsigned 64-bit integer, 8 bytes little-endian.
    U64 = 10,
    /// `GGUF_TYPE_INT64`: signed 64-bit integer, 8 bytes little-endian.
    I64 = 11,
    /// `GGUF_TYPE_FLOAT64`: IEEE 754 double precision, 8 bytes little-endian.
    F64 = 12,
}

impl ValueType {
    /// The type for a GGUF id, or `None` for an id GGUF does not define.
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The id stored in files.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// ggml's name (`gguf_type_name`): "u8", "i32", "str", "arr", ...
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "str",
            Array => "arr",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }

    /// Bytes one value of this type takes in a file; for strings and arrays, the least it can
    /// take (an empty one). Used to refuse counts that the remaining bytes cannot hold.
    pub(crate) fn min_size(self) -> usize {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

impl std::fmt::Display for ValueType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// An array value: elements of one scalar or string type.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    /// Elements of type `u8` ([`ValueType::U8`]).
    U8(Vec<u8>),
    /// Elements of type `i8` ([`ValueType::I8`]).
    I8(Vec<i8>),
    /// Elements of type `u16` ([`ValueType::U16`]).
    U16(Vec<u16>),
    /// Elements of type `i16` ([`ValueType::I16`]).
    I16(Vec<i16>),
    /// Elements of type `u32` ([`ValueType::U32`]).
    U32(Vec<u32>),
    /// Elements of type `i32` ([`ValueType::I32`]), e.g. `tokenizer.ggml.token_type`.
    I32(Vec<i32>),
    /// Elements of type `f32` ([`ValueType::F32`]), e.g. `tokenizer.ggml.scores`.
    F32(Vec<f32>),
    /// Booleans ([`ValueType::Bool`]), one byte each in the file.
    Bool(Vec<bool>),
    /// Strings ([`ValueType::String`]), e.g. `tokenizer.ggml.tokens` or `tokenizer.ggml.merges`.
    String(Vec<String>),
    /// Elements of type `u64` ([`ValueType::U64`]).
    U64(Vec<u64>),
    /// Elements of type `i64` ([`ValueType::I64`]).
    I64(Vec<i64>),
    /// Elements of type `f64` ([`ValueType::F64`]).
    F64(Vec<f64>),
}

impl Array {
    /// The type of the elements.
    pub fn elem_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    /// True for an empty array.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A `u8` ([`ValueType::U8`]).
    U8(u8),
    /// An `i8` ([`ValueType::I8`]).
    I8(i8),
    /// A `u16` ([`ValueType::U16`]).
    U16(u16),
    /// An `i16` ([`ValueType::I16`]).
    I16(i16),
    /// A `u32` ([`ValueType::U32`]): the usual type of counts such as `llama.block_count` and of
    /// `general.alignment`.
    U32(u32),
    /// An `i32` ([`ValueType::I32`]).
    I32(i32),
    /// An `f32` ([`ValueType::F32`]), e.g. `llama.attention.layer_norm_rms_epsilon`.
    F32(f32),
    /// A boolean ([`ValueType::Bool`]).
    Bool(bool),
    /// A UTF-8 string ([`ValueType::String`]), e.g. `general.architecture`.
    String(String),
    /// An array of one scalar or string type ([`ValueType::Array`]).
    Array(Array),
    /// A `u64` ([`ValueType::U64`]).
    U64(u64),
    /// An `i64` ([`ValueType::I64`]).
    I64(i64),
    /// An `f64` ([`ValueType::F64`]).
    F64(f64),
}

impl Value {
    /// The value's type (`ValueType::Array` for arrays).
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// A type name for messages: "u32", "arr[f32]", ...
    pub fn type_name(&self) -> String {
        match self {
            Value::Array(a) => format!("arr[{}]", a.elem_type()),
            v => v.value_type().name().to_string(),
        }
    }
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        fn list<T: std::fmt::Debug>(f: &mut std::fmt::Formatter<'_>, v: &[T]) -> std::fmt::Result {
            const SHOW: usize = 8;
            write!(f, "[")?;
            for (i, x) in v.iter().take(SHOW).enumerate() {
                if i > 0 {
                    write!(f, ", ")?;
                }
                write!(f, "{x:?}")?;
            }
            if v.len() > SHOW {
                write!(f, ", ... ({} items)", v.len())?;
            }
            write!(f, "]")
        }
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::String(v) => write!(f, "{v:?}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
            Value::Array(a) => match a {
                Array::U8(v) => list(f, v),
                Array::I8(v) => list(f, v),
                Array::U16(v) => list(f, v),
                Array::I16(v) => list(f, v),
                Array::U32(v) => list(f, v),
                Array::I32(v) => list(f, v),
                Array::F32(v) => list(f, v),
                Array::Bool(v) => list(f, v),
                Array::String(v) => list(f, v),
                Array::U64(v) => list(f, v),
                Array::I64(v) => list(f, v),
                Array::F64(v) => list(f, v),
            },
        }
    }
}

/// A Rust type that a scalar metadata value converts to and from ([`Metadata::get`]).
pub trait Scalar: Sized + Copy {
    /// The GGUF type that holds this Rust type.
    const TYPE: ValueType;
    /// The value, when it has exactly this type.
    fn from_value(v: &Value) -> Option<Self>;
    /// Wraps the value.
    fn into_value(self) -> Value;
}

/// A Rust type that array elements convert to ([`Metadata::get_arr`]): every scalar and `String`.
pub trait ArrayElement: Sized {
    /// The GGUF type of the elements.
    const TYPE: ValueType;
    /// The elements, when the array has exactly this element type.
    fn slice(a: &Array) -> Option<&[Self]>;
    /// Wraps a vector of elements.
    fn into_array(v: Vec<Self>) -> Array;
}

macro_rules! scalar {
    ($t:ty, $variant:ident) => {
        impl Scalar for $t {
            const TYPE: ValueType = ValueType::$variant;
            fn from_value(v: &Value) -> Option<Self> {
                match v {
                    Value::$variant(x) => Some(*x),
                    _ => None,
                }
            }
            fn into_value(self) -> Value {
                Value::$variant(self)
            }
        }
        impl ArrayElement for $t {
            const TYPE: ValueType = ValueType::$variant;
            fn slice(a: &Array) -> Option<&[Self]> {
                match a {
                    Array::$variant(x) => Some(x),
                    _ => None,
                }
            }
            fn into_array(v: Vec<Self>) -> Array {
                Array::$variant(v)
            }
        }
        impl From<$t> for Value {
            fn from(x: $t) -> Value {
                Value::$variant(x)
            }
        }
        impl From<Vec<$t>> for Value {
            fn from(x: Vec<$t>) -> Value {
                Value::Array(Array::$variant(x))
            }
        }
        impl From<&[$t]> for Value {
            fn from(x: &[$t]) -> Value {
                Value::Array(Array::$variant(x.to_vec()))
            }
        }
    };
}

scalar!(u8, U8);
scalar!(i8, I8);
scalar!(u16, U16);
scalar!(i16, I16);
scalar!(u32, U32);
scalar!(i32, I32);
scalar!(f32, F32);
scalar!(bool, Bool);
scalar!(u64, U64);
scalar!(i64, I64);
scalar!(f64, F64);

impl ArrayElement for String {
    const TYPE: ValueType = ValueType::String;
    fn slice(a: &Array) -> Option<&[Self]> {
        match a {
            Array::String(x) => Some(x),
            _ => None,
        }
    }
    fn into_array(v: Vec<Self>) -> Array {
        Array::String(v)
    }
}

impl From<&str> for Value {
    fn from(x: &str) -> Value {
        Value::String(x.to_string())
    }
}

impl From<String> for Value {
    fn from(x: String) -> Value {
        Value::String(x)
    }
}

impl From<Vec<String>> for Value {
    fn from(x: Vec<String>) -> Value {
        Value::Array(Array::String(x))
    }
}

impl From<&[&str]> for Value {
    fn from(x: &[&str]) -> Value {
        Value::Array(Array::String(x.iter().map(|s| s.to_string()).collect()))
    }
}

impl From<Array> for Value {
    fn from(x: Array) -> Value {
        Value::Array(x)
    }
}

/// The key-value metadata of a GGUF file, in file order, with unique keys.
///
/// ```
/// use quantgraph::gguf::{Metadata, Value};
/// let mut m = Metadata::new();
/// m.insert("general.architecture", "llama")?;
/// m.insert("llama.block_count", 32u32)?;
/// m.insert("tokenizer.ggml.scores", vec![0.5f32, -1.0])?;
/// assert_eq!(m.get_str("general.architecture")?, "llama");
/// assert_eq!(m.get_u32("llama.block_count")?, 32);
/// assert_eq!(m.get_arr::<f32>("tokenizer.ggml.scores")?, &[0.5, -1.0]);
/// assert!(m.get_u64("llama.block_count").is_err()); // stored as u32
/// assert!(m.get_u32("missing").is_err());
/// # Ok::<(), quantgraph::Error>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

macro_rules! getter {
    ($name:ident, $t:ty) => {
        #[doc = concat!("The `", stringify!($t), "` value of `key`; `Err` when missing or of another type.")]
        pub fn $name(&self, key: &str) -> Result<$t> {
            self.get_as::<$t>(key)
        }
    };
}

impl Metadata {
    /// Empty metadata.
    pub fn new() -> Metadata {
        Metadata::default()
    }

    /// Number of key-value pairs.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Adds a pair; `Err` when the key is empty or already present (GGUF keys are unique).
    pub fn insert(&mut self, key: impl Into<String>, value: impl Into<Value>) -> Result<()> {
        let key = key.into();
        if key.is_empty() {
            return Err(Error::Gguf("metadata key is empty".into()));
        }
        if self.index.contains_key(&key) {
            return Err(Error::Gguf(format!("duplicate metadata key '{key}'")));
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value.into()));
        Ok(())
    }

    /// Sets `key` to `value`: overwrites the value in place (keeping the key's position) when
    /// the key exists, else appends the pair. Returns the old value. `Err` for an empty key.
    pub fn set(
        &mut self,
        key: impl Into<String>,
        value: impl Into<Value>,
    ) -> Result<Option<Value>> {
        let key = key.into();
        match self.index.get(&key) {
            Some(&i) => Ok(Some(std::mem::replace(&mut self.entries[i].1, value.into()))),
            None => self.insert(key, value).map(|_| None),
        }
    }

    /// Removes `key`, returning its value (`None` when absent). Later pairs keep their order.
    pub fn remove(&mut self, key: &str) -> Option<Value> {
        let i = self.index.remove(key)?;
        let (_, v) = self.entries.remove(i);
        for (k, _) in &self.entries[i..] {
            if let Some(j) = self.index.get_mut(k) {
                *j -= 1;
            }
        }
        Some(v)
    }

    /// Pairs with capacity reserved for `n` more.
    pub(crate) fn with_capacity(n: usize) -> Metadata {
        Metadata { entries: Vec::with_capacity(n), index: HashMap::with_capacity(n) }
    }

    /// The pairs in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// True when `key` is present.
    pub fn contains_key(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// The value of `key`, of any type.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    fn require(&self, key: &str) -> Result<&Value> {
        self.get(key).ok_or_else(|| Error::Gguf(format!("metadata key '{key}' not found")))
    }

    fn mismatch(key: &str, want: &str, got: &Value) -> Error {
        Error::Gguf(format!("metadata key '{key}' has type {}, not {want}", got.type_name()))
    }

    /// The scalar value of `key` as `T`; `Err` when missing or stored with another type (no
    /// conversions: a `u32` is not returned as a `u64`).
    pub fn get_as<T: Scalar>(&self, key: &str) -> Result<T> {
        let v = self.require(key)?;
        T::from_value(v).ok_or_else(|| Metadata::mismatch(key, T::TYPE.name(), v))
    }

    getter!(get_u8, u8);
    getter!(get_i8, i8);
    getter!(get_u16, u16);
    getter!(get_i16, i16);
    getter!(get_u32, u32);
    getter!(get_i32, i32);
    getter!(get_f32, f32);
    getter!(get_bool, bool);
    getter!(get_u64, u64);
    getter!(get_i64, i64);
    getter!(get_f64, f64);

    /// The string value of `key`; `Err` when missing or of another type.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        match self.require(key)? {
            Value::String(s) => Ok(s),
            v => Err(Metadata::mismatch(key, "str", v)),
        }
    }

    /// The array value of `key` with elements of type `T` (`String` for string arrays); `Err`
    /// when missing, not an array, or an array of another element type.
    pub fn get_arr<T: ArrayElement>(&self, key: &str) -> Result<&[T]> {
        let v = self.require(key)?;
        let want = || format!("arr[{}]", T::TYPE.name());
        match v {
            Value::Array(a) => T::slice(a).ok_or_else(|| Metadata::mismatch(key, &want(), v)),
            _ => Err(Metadata::mismatch(key, &want(), v)),
        }
    }
}
