//! Runs a llama-architecture GGUF model: prefill a prompt of token ids, then greedy decode, and
//! print the generated ids with prefill and decode speed.
//!
//! ```text
//! cargo run --release --example llama -- FILE.gguf [N_PROMPT] [N_GEN] [THREADS] [N_CTX] [--repack]
//! cargo run --release --example llama -- --synthetic [N_PROMPT] [N_GEN] [THREADS] [N_CTX]
//! ```
//! `--synthetic` writes an 8-layer d=1024 model with Q4_0 weights to a temporary file first.
//! Token ids are generated deterministically (no tokenizer is needed to measure speed).
//! `--repack` copies the weights the CPU_REPACK buffer type takes (Q4_0, IQ4_NL, MXFP4, Q4_K,
//! Q6_K, TQ2_0, Q2_K) into its interleaved layout first, as llama.cpp's CPU backend does by
//! default.

use quantgraph::models::llama::{Llama, LlamaConfig, WeightTypes, argmax, synthetic_gguf};
use quantgraph::{Backend, CpuBackend, DType, GgufFile};
use std::time::Instant;

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> quantgraph::Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let repack = args.iter().any(|a| a == "--repack");
    args.retain(|a| a != "--repack");
    let num = |i: usize, d: usize| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (n_prompt, n_gen, threads) = (num(1, 512), num(2, 32), num(3, 2));
    let n_ctx = num(4, n_prompt + n_gen);
    let path = match args.first().map(String::as_str) {
        Some("--synthetic") | None => {
            let cfg = LlamaConfig {
                n_embd: 1024,
                n_layer: 8,
                n_head: 16,
                n_head_kv: 8,
                n_ff: 2816,
                n_vocab: 4096,
                n_ctx,
                rope_base: 10000.0,
                eps: 1e-5,
            };
            let p =
                std::env::temp_dir().join(format!("quantgraph-llama-{}.gguf", std::process::id()));
            std::fs::write(&p, synthetic_gguf(&cfg, WeightTypes::all(DType::Q4_0), 1)?)?;
            p
        }
        Some(f) => f.into(),
    };
    let file = GgufFile::open(&path)?;
    let backend = CpuBackend::with_threads(threads)?;
    let mut model = if repack {
        Llama::from_gguf_repacked(&file, Some(n_ctx), &backend)?.0
    } else {
        Llama::from_gguf(&file, Some(n_ctx), &backend)?
    };
    let nv = model.config().n_vocab;
    let prompt: Vec<u32> = (0..n_prompt).map(|i| ((i * 7919 + 13) % nv) as u32).collect();
    let t0 = Instant::now();
    let logits = model.forward_last(&prompt)?;
    let t_prefill = t0.elapsed().as_secs_f64();
    let mut next = argmax(&logits[logits.len() - nv..]);
    let mut out = Vec::new();
    let t0 = Instant::now();
    for _ in 0..n_gen {
        out.push(next);
        next = argmax(&model.forward(&[next])?);
    }
    let t_decode = t0.elapsed().as_secs_f64();
    if args.first().map(String::as_str) != Some(path.to_str().unwrap_or("")) {
        let _ = std::fs::remove_file(&path);
    }
    let c = model.config();
    println!(
        "model: {} layers, d={}, heads {}/{}, ff={}, vocab={}, ctx={}",
        c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.n_ff, c.n_vocab, c.n_ctx
    );
    println!("generated: {out:?}");
    println!(
        "quantgraph llama prefill_tokens={n_prompt} prefill_tok_s={:.1} decode_tokens={n_gen} decode_tok_s={:.1} threads={}{}",
        n_prompt as f64 / t_prefill,
        n_gen as f64 / t_decode,
        backend.n_threads(),
        if repack { " repack" } else { "" }
    );
    Ok(())
}
