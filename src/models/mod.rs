//! Model graphs built from quantgraph ops. `llama` runs llama-architecture models (llama.cpp's
//! GGUF tensor names and hyperparameters) with a KV cache kept in state buffers, and with
//! [`llama::ArchParams`] the llama-like architectures of [`Architecture`] (qwen2, qwen3,
//! gemma3), loaded by [`load`]; `sampling` picks tokens from logits; `generate` turns a model
//! and a tokenizer into a text generator.

pub mod arch;
pub mod generate;
pub mod llama;
pub mod sampling;

pub use arch::{Architecture, load, load_repacked};

use crate::buffer::Buffer;
use crate::dtype::DType;

/// Where one weight tensor lives: its type, shape (ggml order) and bytes in a shared buffer.
#[derive(Clone, Debug)]
pub struct WeightRef {
    /// Element type.
    pub dtype: DType,
    /// Shape, ggml order.
    pub ne: [usize; 4],
    /// The buffer holding it (a memory-mapped file, or owned memory).
    pub buffer: Buffer,
    /// Byte offset inside the buffer.
    pub offset: usize,
}
