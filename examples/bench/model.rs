//! `model`: prefill and decode tokens/s of a llama model, synthetic or a GGUF file on disk.

use crate::measure::median;
use quantgraph::{CpuBackend, DType};
use std::time::Instant;

/// Options of `model`.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// KV cache size (`--ctx`); default: depth + prompt + generated tokens.
    pub n_ctx: Option<usize>,
    /// Tokens in the cache before the measured prompt and decode (`--depth`, as llama-bench's
    /// `-d`), filled untimed.
    pub depth: usize,
    /// Timed prefills (`--reps`, median), each after an untimed warm-up prefill of the same
    /// length (as llama-bench warms up).
    pub reps: usize,
    /// Cache cells attended over: those in use rounded up to a multiple of this (`--kv-step`;
    /// default the runner's, a number at least `n_ctx` attends over the whole cache).
    pub kv_step: Option<usize>,
}

/// Prefill (512 tokens) and decode tokens per second of a synthetic llama model: `tiny` (the
/// quickstart's) or `large` (8 layers, d=1024, Q4_0).
pub fn model(
    which: &str,
    threads: usize,
    n_prompt: usize,
    n_gen: usize,
    repack: bool,
    opts: Options,
) -> quantgraph::Result<()> {
    use quantgraph::models::llama::{LlamaConfig, WeightTypes, synthetic_gguf};
    let n_ctx = opts.n_ctx.unwrap_or(opts.depth + n_prompt + n_gen);
    // A GGUF file on disk (memory-mapped), or one of the synthetic models.
    if std::path::Path::new(which).is_file() {
        let file = quantgraph::GgufFile::open(which)?;
        return run_model(&file, which, Some(n_ctx), threads, n_prompt, n_gen, repack, opts);
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
    run_model(&file, which, None, threads, n_prompt, n_gen, repack, opts)
}

/// Prefill of `n_prompt` tokens (last-token logits, as llama-bench's pp), then `n_gen` greedy
/// decode steps (median step, as llama-bench's tg), for a GGUF of any architecture the runner
/// takes (llama, qwen2, qwen3, gemma3), both after
/// `opts.depth` cached tokens.
#[allow(clippy::too_many_arguments)]
fn run_model(
    file: &quantgraph::GgufFile,
    which: &str,
    n_ctx: Option<usize>,
    threads: usize,
    n_prompt: usize,
    n_gen: usize,
    repack: bool,
    opts: Options,
) -> quantgraph::Result<()> {
    use quantgraph::models::llama::{Llama, argmax};
    let be = CpuBackend::with_threads(threads)?;
    let mut m = if repack {
        quantgraph::models::load_repacked(file, n_ctx, &be)?.0
    } else {
        quantgraph::models::load(file, n_ctx, &be)?
    };
    if let Some(k) = opts.kv_step {
        m.set_kv_step(k)?;
    }
    let n_vocab = m.config().n_vocab;
    let tok = |i: usize| ((i * 7919 + 13) % n_vocab) as u32;
    let fill = |m: &mut Llama| -> quantgraph::Result<()> {
        m.reset();
        let depth: Vec<u32> = (0..opts.depth).map(tok).collect();
        for c in depth.chunks(512) {
            m.forward_last(c)?;
        }
        Ok(())
    };
    let prompt: Vec<u32> = (opts.depth..opts.depth + n_prompt).map(tok).collect();
    let mut prefill = Vec::new();
    let mut logits = Vec::new();
    for rep in 0..=opts.reps.max(1) {
        fill(&mut m)?;
        if prompt.is_empty() {
            break;
        }
        let t0 = Instant::now();
        logits = m.forward_last(&prompt)?;
        if rep > 0 {
            prefill.push(t0.elapsed().as_secs_f64());
        }
    }
    let mut next =
        if logits.is_empty() { tok(0) } else { argmax(&logits[logits.len() - n_vocab..]) };
    let mut times = Vec::new();
    for _ in 0..n_gen {
        let t0 = Instant::now();
        next = argmax(&m.forward(&[next])?);
        times.push(t0.elapsed().as_secs_f64());
    }
    let rate = |n: usize, t: Vec<f64>| if t.is_empty() { 0.0 } else { n as f64 / median(t) };
    println!(
        "quantgraph model {which} threads={threads} n_ctx={} depth={} prefill_tokens={n_prompt} prefill_tok_s={:.1} decode_tok_s={:.1}{}",
        m.config().n_ctx,
        opts.depth,
        rate(n_prompt, prefill),
        rate(1, times),
        if repack { " buffer=CPU_REPACK" } else { "" }
    );
    Ok(())
}
