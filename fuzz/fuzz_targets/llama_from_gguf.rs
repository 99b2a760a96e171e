//! Fuzzes `Llama::from_gguf` (and `from_gguf_repacked`) on mutated model files: whatever the bytes,
//! loading gives `Ok` or `Err`, and a model that loads runs a forward pass of two tokens and then
//! one more, with `Ok` or `Err` again, never a panic or an abort.
//!
//! The corpus seeds itself: when the corpus directory given on the command line is empty, the
//! target first writes small synthetic llama models there (the crate's own GGUF writer, several
//! weight types), so `cargo fuzz run llama_from_gguf` starts from valid files.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quantgraph::models::llama::{Llama, LlamaConfig, WeightTypes, synthetic_gguf};
use quantgraph::{CpuBackend, DType, GgufFile};
use std::sync::OnceLock;

/// The largest context the target plans for: a longer `llama.context_length` is overridden, as
/// attention runs over the whole cache and would only make each run slower.
const MAX_CTX: usize = 64;

fn seeds() -> Vec<(String, Vec<u8>)> {
    let cfg = |n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab| LlamaConfig {
        n_embd,
        n_layer,
        n_head,
        n_head_kv,
        n_ff,
        n_vocab,
        n_ctx: 16,
        rope_base: 10000.0,
        eps: 1e-5,
    };
    let small = cfg(64, 1, 4, 2, 96, 32);
    let kq = cfg(256, 1, 4, 1, 256, 16);
    let mixed =
        WeightTypes { embd: DType::Q8_0, attn: DType::F16, ffn: DType::Q4_K, output: DType::Q6_K };
    [
        ("default", small, WeightTypes::default()),
        ("f32", cfg(32, 2, 2, 2, 48, 24), WeightTypes::all(DType::F32)),
        ("q4_0", small, WeightTypes::all(DType::Q4_0)),
        ("k_quants", kq, mixed),
        ("iq4_nl", kq, WeightTypes::all(DType::IQ4_NL)),
    ]
    .into_iter()
    .map(|(name, c, t)| (format!("synthetic_{name}.gguf"), synthetic_gguf(&c, t, 7).unwrap()))
    .collect()
}

/// Writes the seeds into the first corpus directory on the command line if it is empty.
fn seed_corpus() {
    let Some(dir) = std::env::args().skip(1).find(|a| !a.starts_with('-')) else { return };
    let dir = std::path::Path::new(&dir);
    let empty = std::fs::read_dir(dir).map(|mut d| d.next().is_none()).unwrap_or(false);
    if empty {
        for (name, bytes) in seeds() {
            let _ = std::fs::write(dir.join(name), bytes);
        }
    }
}

fn backend() -> &'static CpuBackend {
    static B: OnceLock<CpuBackend> = OnceLock::new();
    B.get_or_init(|| CpuBackend::with_threads(2).unwrap())
}

fuzz_target!(init: seed_corpus(), |data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data) else { return };
    let n_ctx = match LlamaConfig::from_gguf(&file, None) {
        Ok(c) if c.n_ctx <= MAX_CTX => None,
        _ => Some(MAX_CTX),
    };
    // Both loaders, picked by a bit of the input that every mutation can reach.
    let model = if data.len() % 2 == 0 {
        Llama::from_gguf(&file, n_ctx, backend())
    } else {
        Llama::from_gguf_repacked(&file, n_ctx, backend()).map(|(m, _)| m)
    };
    let Ok(mut model) = model else { return };
    let n_vocab = model.config().n_vocab as u32;
    let (a, b) = (data[data.len() / 2] as u32 % (n_vocab + 1), 1 % n_vocab.max(1));
    if let Ok(logits) = model.forward(&[a, b]) {
        assert_eq!(logits.len(), 2 * n_vocab as usize);
        let _ = model.forward(&[0]);
    }
});
