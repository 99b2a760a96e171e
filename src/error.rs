//! The crate's one error type. Every failure reachable from the public API is one of these, with a
//! message that names the op, tensor, type or value at fault.

use crate::dtype::DType;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in quantgraph.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A row length that is not a whole number of blocks of its type.
    #[error("{dtype}: {n} elements is not a multiple of the block size {block}")]
    BlockSize { dtype: DType, n: usize, block: usize },
    /// A size computation overflowed `usize`.
    #[error("size overflow computing {what}")]
    Overflow { what: &'static str },
    /// A type name or id that ggml does not have.
    #[error("unknown tensor type {0:?}")]
    UnknownType(String),
    /// Shapes that do not fit the op (broadcast rules, matmul inner dimensions, view bounds, ...).
    #[error("{op}: {msg}")]
    Shape { op: &'static str, msg: String },
    /// A tensor type the op does not accept.
    #[error("{op}: unsupported type combination: {msg}")]
    Type { op: &'static str, msg: String },
    /// A bad op parameter (mode, axis, eps, ...).
    #[error("{op}: invalid parameter: {msg}")]
    Param { op: &'static str, msg: String },
    /// The backend cannot run this node.
    #[error("{op}: not supported by backend {backend}: {msg}")]
    Unsupported { op: &'static str, backend: String, msg: String },
    /// Bad data or arguments handed to a function (lengths, ids, missing inputs).
    #[error("{0}")]
    InvalidArgument(String),
    /// An index stored in a tensor was out of range at compute time.
    #[error("{op}: index {index} in tensor '{tensor}' is out of range 0..{limit}")]
    IndexOutOfRange { op: &'static str, tensor: String, index: i64, limit: usize },
    /// The abort hook asked compute to stop.
    #[error("computation aborted by the abort hook")]
    Aborted,
    /// A buffer operation failed (out of bounds, read-only, in use by another compute).
    #[error("buffer: {0}")]
    Buffer(String),
    /// A quantization routine refused its input.
    #[error("quantize {dtype}: {msg}")]
    Quant { dtype: DType, msg: String },
    /// A user closure (custom op) panicked; the plan and pool remain usable.
    #[error("custom op '{name}' panicked: {msg}")]
    Panicked { name: String, msg: String },
    /// A GGUF file is malformed or uses something this reader refuses.
    #[error("gguf: {0}")]
    Gguf(String),
    /// An I/O error (reading or writing files).
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    pub(crate) fn shape(op: &'static str, msg: impl Into<String>) -> Error {
        Error::Shape { op, msg: msg.into() }
    }
    pub(crate) fn ty(op: &'static str, msg: impl Into<String>) -> Error {
        Error::Type { op, msg: msg.into() }
    }
    pub(crate) fn param(op: &'static str, msg: impl Into<String>) -> Error {
        Error::Param { op, msg: msg.into() }
    }
    pub(crate) fn arg(msg: impl Into<String>) -> Error {
        Error::InvalidArgument(msg.into())
    }
}
