//! Runs a GGUF language model.
//!
//! Text mode: tokenize a prompt with the file's own tokenizer, generate, and stream the text with
//! tokens/s at the end:
//! ```text
//! cargo run --release --example llama -- -m FILE.gguf -p "The capital of France is" [-n 64]
//!     [--chat] [--system TEXT] [--temp 0.8] [--top-k 40] [--top-p 0.95] [--min-p 0.05]
//!     [--repeat-penalty 1.1] [--seed N] [--stop STR]... [-t THREADS] [-c N_CTX] [--repack]
//! ```
//! Greedy unless `--temp` is given. `--chat` wraps the prompt in the ChatML chat format (with the
//! default system prompt of the file's chat template, or `--system`) and stops at the end of the
//! assistant's turn. `--top1` prints the prompt's ids and the argmax of the logits at every
//! prompt position instead of generating; `--ids` prints the prompt's ids and the generated ids
//! after the text; `--ignore-eos` generates past end-of-generation tokens.
//!
//! Several `-p` serve the prompts together (`Llama::forward_batch`): one batch of every prompt,
//! then one batch per step holding the next token of each sequence still going, each sequence
//! with its own sampler (seed + its index); each text is printed when its sequence ends, then
//! the total tokens/s.
//!
//! Token-id mode, for benchmarking: prefill a prompt of generated token ids, then greedy decode,
//! and print the generated ids with prefill and decode speed.
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
    if args.iter().any(|a| a == "-m" || a == "--model") {
        return run_text(&args);
    }
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

/// Text mode: `-m FILE -p TEXT ...` (see the file's header).
fn run_text(args: &[String]) -> quantgraph::Result<()> {
    use quantgraph::models::generate::{
        ChatMessage, GenerateParams, chatml, chatml_default_system, generate,
    };
    use quantgraph::models::sampling::SamplerParams;
    use quantgraph::tokenizer::Tokenizer;
    use std::io::Write;

    let bad = |m: String| quantgraph::Error::InvalidArgument(m);
    let mut model_path = None;
    let mut prompts = Vec::new();
    let mut system = None;
    let (mut n_gen, mut threads, mut n_ctx) = (64usize, 2usize, None);
    let (mut chat, mut repack, mut top1, mut show_ids) = (false, false, false, false);
    let mut ignore_eos = false;
    let (mut temp, mut top_k, mut top_p, mut min_p, mut repeat, mut seed) =
        (None, None, None, None, None, None);
    let mut stop = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().cloned().ok_or_else(|| bad(format!("{a} needs a value")));
        let num = |v: String| -> quantgraph::Result<f64> {
            v.parse::<f64>().map_err(|_| bad(format!("{a}: '{v}' is not a number")))
        };
        match a.as_str() {
            "-m" | "--model" => model_path = Some(val()?),
            "-p" | "--prompt" => prompts.push(val()?),
            "-n" | "--n-predict" => n_gen = num(val()?)? as usize,
            "-t" | "--threads" => threads = num(val()?)? as usize,
            "-c" | "--ctx-size" => n_ctx = Some(num(val()?)? as usize),
            "--chat" => chat = true,
            "--system" => system = Some(val()?),
            "--repack" => repack = true,
            "--top1" => top1 = true,
            "--ids" => show_ids = true,
            "--ignore-eos" => ignore_eos = true,
            "--temp" => temp = Some(num(val()?)? as f32),
            "--top-k" => top_k = Some(num(val()?)? as usize),
            "--top-p" => top_p = Some(num(val()?)? as f32),
            "--min-p" => min_p = Some(num(val()?)? as f32),
            "--repeat-penalty" => repeat = Some(num(val()?)? as f32),
            "--seed" => seed = Some(num(val()?)? as u64),
            "--stop" => stop.push(val()?),
            other => return Err(bad(format!("unknown argument '{other}'"))),
        }
    }
    // Greedy unless a temperature is given; then llama.cpp's defaults for what is not given.
    let mut sp = match temp {
        Some(t) if t > 0.0 => SamplerParams::default(),
        _ => SamplerParams::greedy(),
    };
    sp.temperature = temp.unwrap_or(sp.temperature);
    sp.top_k = top_k.unwrap_or(sp.top_k);
    sp.top_p = top_p.unwrap_or(sp.top_p);
    sp.min_p = min_p.unwrap_or(sp.min_p);
    sp.repeat_penalty = repeat.unwrap_or(sp.repeat_penalty);
    sp.seed = seed.unwrap_or(sp.seed);
    if prompts.is_empty() {
        prompts.push(String::from("Once upon a time"));
    }
    let path = model_path.ok_or_else(|| bad("-m FILE.gguf is required".into()))?;
    let file = GgufFile::open(&path)?;
    let tok = Tokenizer::from_gguf(&file)?;
    let template = file.metadata().get_str("tokenizer.chat_template").ok();
    let system = system.or_else(|| template.and_then(chatml_default_system));
    let to_ids = |prompt: &str| {
        let text = if chat {
            let mut msgs = Vec::new();
            if let Some(s) = &system {
                msgs.push(ChatMessage::new("system", s));
            }
            msgs.push(ChatMessage::new("user", prompt));
            chatml(&msgs, true)
        } else {
            prompt.to_string()
        };
        tok.encode(&text, true, true)
    };
    let all_ids: Vec<Vec<u32>> = prompts.iter().map(|p| to_ids(p)).collect();
    // Room for every prompt and every sequence's generated tokens.
    let n_ctx = n_ctx.unwrap_or(all_ids.iter().map(|ids| ids.len() + n_gen).sum());
    let backend = CpuBackend::with_threads(threads)?;
    // Whatever architecture the file holds (an error names one that is not supported).
    let mut model = if repack {
        quantgraph::models::load_repacked(&file, Some(n_ctx), &backend)?.0
    } else {
        quantgraph::models::load(&file, Some(n_ctx), &backend)?
    };
    if prompts.len() > 1 && !top1 {
        let stops = stop.clone();
        return run_batch(&mut model, &tok, &prompts, &all_ids, n_gen, &sp, &stops, chat, &backend);
    }
    let (prompt, ids) = (&prompts[0], &all_ids[0]);
    if top1 {
        // The prompt's ids and the most likely next token at every prompt position, for
        // comparing with another implementation's logits.
        let nv = model.config().n_vocab;
        let logits = model.forward(ids)?;
        let best: Vec<u32> = logits.chunks(nv).map(argmax).collect();
        println!("{ids:?}");
        println!("{best:?}");
        return Ok(());
    }
    let mut params = GenerateParams::default();
    params.max_tokens = n_gen;
    params.sampler = sp;
    params.stop = stop;
    params.stop_at_eog = !ignore_eos;
    if !chat {
        print!("{prompt}");
    }
    let mut out = std::io::stdout();
    let g = generate(&mut model, &tok, ids, &params, &mut |t| {
        print!("{t}");
        let _ = out.flush();
    })?;
    println!();
    if show_ids {
        println!("{ids:?}");
        println!("{:?}", g.tokens);
    }
    let n = g.tokens.len();
    eprintln!(
        "prompt {} tokens, {:.1} tokens/s; generated {n} tokens, {:.1} tokens/s; stop: {:?}; threads={}",
        g.n_prompt,
        g.n_prompt as f64 / g.prefill_secs,
        n.saturating_sub(1) as f64 / g.decode_secs.max(1e-9),
        g.stop,
        backend.n_threads()
    );
    Ok(())
}

/// One sequence of the batch mode.
struct Seq {
    sampler: quantgraph::models::sampling::Sampler,
    dec: quantgraph::tokenizer::StreamDecoder,
    text: String,
    tokens: Vec<u32>,
    done: bool,
}

/// Batch mode: the prompts served together (see the file's header).
#[allow(clippy::too_many_arguments)]
fn run_batch(
    model: &mut Llama,
    tok: &quantgraph::tokenizer::Tokenizer,
    prompts: &[String],
    all_ids: &[Vec<u32>],
    n_gen: usize,
    sp: &quantgraph::models::sampling::SamplerParams,
    stop: &[String],
    chat: bool,
    backend: &CpuBackend,
) -> quantgraph::Result<()> {
    use quantgraph::models::llama::Batch;
    use quantgraph::models::sampling::Sampler;
    let nv = model.config().n_vocab;
    let mut seqs = Vec::new();
    for (k, ids) in all_ids.iter().enumerate() {
        let mut p = sp.clone();
        p.seed = sp.seed.wrapping_add(k as u64);
        let mut sampler = Sampler::new(p)?;
        for &t in ids {
            sampler.accept(t);
        }
        let dec = quantgraph::tokenizer::StreamDecoder::new();
        seqs.push(Seq { sampler, dec, text: String::new(), tokens: Vec::new(), done: false });
    }
    let t0 = Instant::now();
    let mut batch = Batch::new();
    for (k, ids) in all_ids.iter().enumerate() {
        batch.add_seq(k as u32, ids, true);
    }
    let n_prompt = batch.len();
    // The logits of each sequence still going, in sequence order.
    let mut logits = model.forward_batch(&batch)?;
    let mut n_decoded = 0;
    loop {
        batch.clear();
        let active: Vec<usize> = (0..seqs.len()).filter(|&k| !seqs[k].done).collect();
        for (row, &k) in active.iter().enumerate() {
            let s = &mut seqs[k];
            let id = s.sampler.sample(&logits[row * nv..(row + 1) * nv])?;
            s.sampler.accept(id);
            s.tokens.push(id);
            if tok.is_eog(id) {
                s.done = true;
            } else {
                s.text.push_str(&s.dec.push(tok, id, false)?);
                if let Some(p) = stop.iter().filter_map(|x| s.text.find(x.as_str())).min() {
                    s.text.truncate(p);
                    s.done = true;
                }
            }
            let full = model.seq_len(k as u32) + 1 > model.config().n_ctx;
            if s.tokens.len() >= n_gen || full {
                s.done = true;
            }
            if s.done {
                s.text.push_str(&s.dec.flush());
                let shown = if chat { String::new() } else { prompts[k].clone() };
                println!("--- sequence {k} ({} tokens)\n{shown}{}", s.tokens.len(), s.text);
                // Its cells are free for the others.
                model.seq_rm(k as u32);
            } else {
                batch.push(id, k as u32, true);
            }
        }
        if batch.is_empty() {
            break;
        }
        n_decoded += batch.len();
        logits = model.forward_batch(&batch)?;
    }
    let secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "{} sequences: prompts {n_prompt} tokens, decoded {n_decoded} tokens in batches, {:.1} tokens/s in all; threads={}",
        seqs.len(),
        (n_prompt + n_decoded) as f64 / secs.max(1e-9),
        backend.n_threads()
    );
    Ok(())
}
