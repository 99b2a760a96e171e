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
    BlockSize {
        /// The type whose block size was not met.
        dtype: DType,
        /// The element count given (a row length, `ne[0]`).
        n: usize,
        /// Elements per block of `dtype` ([`DType::block_size`]): 32 for Q4_0, 256 for the K-quants.
        block: usize,
    },
    /// A size computation overflowed `usize`.
    #[error("size overflow computing {what}")]
    Overflow {
        /// The quantity being computed ("row size", "upscale size", a node's result size, ...).
        what: &'static str,
    },
    /// A type name or id that ggml does not have.
    #[error("unknown tensor type {0:?}")]
    UnknownType(String),
    /// Shapes that do not fit the op (broadcast rules, matmul inner dimensions, view bounds, ...).
    #[error("{op}: {msg}")]
    Shape {
        /// The op that refused, by name (ggml's where ggml has the op: `"mul_mat"`, `"concat"`).
        op: &'static str,
        /// The shapes involved and the rule they break.
        msg: String,
    },
    /// A tensor type the op does not accept.
    #[error("{op}: unsupported type combination: {msg}")]
    Type {
        /// The op that refused, by name (as in [`Error::Shape`]).
        op: &'static str,
        /// The tensors and types involved, and the types the op accepts.
        msg: String,
    },
    /// A bad op parameter (mode, axis, eps, ...).
    #[error("{op}: invalid parameter: {msg}")]
    Param {
        /// The op that refused, by name (as in [`Error::Shape`]).
        op: &'static str,
        /// The parameter, its value and the accepted range.
        msg: String,
    },
    /// The backend cannot run this node.
    #[error("{op}: not supported by backend {backend}: {msg}")]
    Unsupported {
        /// The op, by name (as in [`Error::Shape`]).
        op: &'static str,
        /// The backend's name (`"CPU"`).
        backend: String,
        /// What is missing (a kernel for this type, a conversion, ...).
        msg: String,
    },
    /// Bad data or arguments handed to a function (lengths, ids, missing inputs).
    #[error("{0}")]
    InvalidArgument(String),
    /// An index stored in a tensor was out of range at compute time.
    #[error("{op}: index {index} in tensor '{tensor}' is out of range 0..{limit}")]
    IndexOutOfRange {
        /// The op that read the index (`"get_rows"`, `"mul_mat_id"`, `"ssm_scan"`, ...).
        op: &'static str,
        /// The node whose index input held the value, as the plan describes it.
        tensor: String,
        /// The offending index, widened to i64 (it may be negative).
        index: i64,
        /// The exclusive upper bound: valid indices are `0..limit`.
        limit: usize,
    },
    /// The abort hook asked compute to stop.
    #[error("computation aborted by the abort hook")]
    Aborted,
    /// The eval callback returned `false` after a node; the plan stays usable.
    #[error("compute stopped by the eval callback after node {node}")]
    Stopped {
        /// The last node computed, described.
        node: String,
    },
    /// A buffer operation failed (out of bounds, read-only, in use by another compute).
    #[error("buffer: {0}")]
    Buffer(String),
    /// A quantization routine refused its input.
    #[error("quantize {dtype}: {msg}")]
    Quant {
        /// The type being quantized to or dequantized from (or whose dot product was asked for).
        dtype: DType,
        /// Why: a missing importance matrix, data ggml's quantizer would abort on, no routine for
        /// the type, ...
        msg: String,
    },
    /// A custom op's closure returned `Err`, or a node's compute panicked; the plan and pool
    /// remain usable.
    #[error("custom op '{name}' panicked: {msg}")]
    Panicked {
        /// The custom op's name, or the description of the node whose compute panicked.
        name: String,
        /// The message the closure returned as `Err`, or the panic's payload when it is a string
        /// (`"unknown panic"` otherwise).
        msg: String,
    },
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
