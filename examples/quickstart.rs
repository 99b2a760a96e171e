//! quantgraph quickstart, end to end: write a tiny deterministic llama model (F16 embedding, Q8_0
//! attention, Q4_0 feed-forward) to a GGUF file with our writer, load it back zero-copy (memory
//! mapped), run a prefill and greedy decode steps, and print the tokens, timings and the
//! backend's features.
//!
//! Run with `cargo run --release --example quickstart`.

use quantgraph::models::llama::{Llama, LlamaConfig, WeightTypes, synthetic_gguf};
use quantgraph::{Backend, CpuBackend, GgufFile};
use std::time::Instant;

fn main() -> quantgraph::Result<()> {
    let cfg = LlamaConfig {
        n_embd: 256,
        n_layer: 4,
        n_head: 8,
        n_head_kv: 4,
        n_ff: 768,
        n_vocab: 512,
        n_ctx: 256,
        rope_base: 10000.0,
        eps: 1e-5,
    };
    // 1. Write the model with quantgraph's GGUF writer.
    let t0 = Instant::now();
    let bytes = synthetic_gguf(&cfg, WeightTypes::default(), 42)?;
    let path =
        std::env::temp_dir().join(format!("quantgraph-quickstart-{}.gguf", std::process::id()));
    std::fs::write(&path, &bytes)?;
    let t_write = t0.elapsed();

    // 2. Load it back: the file is memory-mapped and its tensors are used in place.
    let t0 = Instant::now();
    let file = GgufFile::open(&path)?;
    let backend = CpuBackend::new()?;
    let mut model = Llama::from_gguf(&file, None, &backend)?;
    let t_load = t0.elapsed();

    // 3. Prefill a prompt, then decode greedily.
    let prompt: Vec<u32> = (0..32).map(|i| (i * 37 + 11) % cfg.n_vocab as u32).collect();
    let t0 = Instant::now();
    let logits = model.forward_last(&prompt)?;
    let t_prefill = t0.elapsed().as_secs_f64();
    let mut next = quantgraph::models::llama::argmax(&logits[logits.len() - cfg.n_vocab..]);
    let n_decode = 16;
    let mut generated = Vec::new();
    let t0 = Instant::now();
    for _ in 0..n_decode {
        generated.push(next);
        let l = model.forward(&[next])?;
        next = quantgraph::models::llama::argmax(&l);
    }
    let t_decode = t0.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&path);

    println!(
        "quantgraph quickstart: synthetic llama, {} layers, d={}, {} heads ({} kv), ff={}, vocab={}",
        cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.n_ff, cfg.n_vocab
    );
    println!(
        "  gguf: {:.2} MiB written in {:.1} ms, opened zero-copy + graph built in {:.1} ms ({} tensors)",
        bytes.len() as f64 / (1 << 20) as f64,
        t_write.as_secs_f64() * 1e3,
        t_load.as_secs_f64() * 1e3,
        file.tensors().len()
    );
    println!("  prompt ({} tokens): {:?}", prompt.len(), &prompt);
    println!("  generated: {generated:?}");
    println!(
        "  prefill: {:.2} ms ({:.0} tokens/s)",
        t_prefill * 1e3,
        prompt.len() as f64 / t_prefill
    );
    println!(
        "  decode:  {:.2} ms/token ({:.0} tokens/s)",
        t_decode * 1e3 / n_decode as f64,
        n_decode as f64 / t_decode
    );
    println!("  threads: {}  isa: {}", backend.n_threads(), backend.isa().name());
    let feats: Vec<String> = backend.features().iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!("  features: {}", feats.join(" "));
    Ok(())
}
