//! `model`: prefill and decode tokens/s of a llama model, synthetic or a GGUF file on disk.

use crate::measure::median;
use quantgraph::{CpuBackend, DType};
use std::time::Instant;

/// Prefill (512 tokens) and decode tokens per second of a synthetic llama model: `tiny` (the
/// quickstart's) or `large` (8 layers, d=1024, Q4_0).
pub fn model(
    which: &str,
    threads: usize,
    n_prompt: usize,
    n_gen: usize,
    repack: bool,
) -> quantgraph::Result<()> {
    use quantgraph::models::llama::{LlamaConfig, WeightTypes, synthetic_gguf};
    let n_ctx = n_prompt + n_gen;
    // A GGUF file on disk (memory-mapped), or one of the synthetic models.
    if std::path::Path::new(which).is_file() {
        let file = quantgraph::GgufFile::open(which)?;
        return run_model(&file, which, Some(n_ctx), threads, n_prompt, n_gen, repack);
    }
    let (cfg, types) = match which {
        "tiny" => (
            LlamaConfig {
                n_embd: 256,
                n_layer: 4,
                n_head: 8,
                n_head_kv: 4,
                n_ff: 768,
                n_vocab: 512,
                n_ctx,
                rope_base: 1e4,
                eps: 1e-5,
            },
            WeightTypes::default(),
        ),
        "large" => (
            LlamaConfig {
                n_embd: 1024,
                n_layer: 8,
                n_head: 16,
                n_head_kv: 8,
                n_ff: 2816,
                n_vocab: 4096,
                n_ctx,
                rope_base: 1e4,
                eps: 1e-5,
            },
            WeightTypes::all(DType::Q4_0),
        ),
        _ => {
            return Err(quantgraph::Error::InvalidArgument(format!(
                "unknown model {which} (tiny|large, or a GGUF file)"
            )));
        }
    };
    let file = quantgraph::GgufFile::from_vec(synthetic_gguf(&cfg, types, 1)?)?;
    run_model(&file, which, None, threads, n_prompt, n_gen, repack)
}

/// Prefill of `n_prompt` tokens (last-token logits, as llama-bench's pp), then `n_gen` greedy
/// decode steps (median step, as llama-bench's tg), for a llama-architecture GGUF.
fn run_model(
    file: &quantgraph::GgufFile,
    which: &str,
    n_ctx: Option<usize>,
    threads: usize,
    n_prompt: usize,
    n_gen: usize,
    repack: bool,
) -> quantgraph::Result<()> {
    use quantgraph::models::llama::{Llama, argmax};
    let be = CpuBackend::with_threads(threads)?;
    let mut m = if repack {
        Llama::from_gguf_repacked(file, n_ctx, &be)?.0
    } else {
        Llama::from_gguf(file, n_ctx, &be)?
    };
    let n_vocab = m.config().n_vocab;
    let prompt: Vec<u32> = (0..n_prompt).map(|i| ((i * 7919 + 13) % n_vocab) as u32).collect();
    let t0 = Instant::now();
    let logits = m.forward_last(&prompt)?;
    let tp = t0.elapsed().as_secs_f64();
    let mut next = argmax(&logits[logits.len() - n_vocab..]);
    let mut times = Vec::new();
    for _ in 0..n_gen {
        let t0 = Instant::now();
        next = argmax(&m.forward(&[next])?);
        times.push(t0.elapsed().as_secs_f64());
    }
    println!(
        "quantgraph model {which} threads={threads} prefill_tokens={n_prompt} prefill_tok_s={:.1} decode_tok_s={:.1}{}",
        n_prompt as f64 / tp,
        1.0 / median(times),
        if repack { " buffer=CPU_REPACK" } else { "" }
    );
    Ok(())
}
