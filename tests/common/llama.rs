//! The small synthetic llama model the runner tests share.

use quantgraph::GgufFile;
use quantgraph::models::WeightRef;
use quantgraph::models::llama::{LlamaConfig, WeightTypes, synthetic_gguf};
use std::collections::HashMap;

/// Two blocks, d = 64, 4 heads over 2 KV heads, a vocabulary of 50, a cache of `n_ctx` cells.
pub fn tiny_config(n_ctx: usize) -> LlamaConfig {
    LlamaConfig {
        n_embd: 64,
        n_layer: 2,
        n_head: 4,
        n_head_kv: 2,
        n_ff: 96,
        n_vocab: 50,
        n_ctx,
        rope_base: 10000.0,
        eps: 1e-5,
    }
}

/// A synthetic GGUF of `c` with weights of `types`, drawn from `seed`.
pub fn synthetic_file(c: &LlamaConfig, types: WeightTypes, seed: u64) -> GgufFile {
    GgufFile::from_bytes(&synthetic_gguf(c, types, seed).unwrap()).unwrap()
}

/// Every tensor of `f` by name, pointing into its buffer.
pub fn file_weights(f: &GgufFile) -> HashMap<String, WeightRef> {
    f.tensors()
        .iter()
        .map(|t| {
            let w = WeightRef {
                dtype: t.dtype(),
                ne: t.ne(),
                buffer: f.buffer().clone(),
                offset: t.offset(),
            };
            (t.name().to_string(), w)
        })
        .collect()
}
