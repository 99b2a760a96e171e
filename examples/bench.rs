//! Benchmarks with one line of output per run, compared against ggml's runs of the same shapes.
//!
//! ```text
//! cargo run --release --example bench -- node-overhead NODES THREADS
//! cargo run --release --example bench -- plan-overhead NODES
//! cargo run --release --example bench -- matmul TYPE M N K THREADS REPS
//! cargo run --release --example bench -- vec-dot TYPE N REPS
//! ```
//! Times are medians over repetitions; the machine is noisy, so compare ratios measured together.

use quantgraph::{Backend, Buffer, CpuBackend, DType, Graph, Plan};
use std::time::Instant;

fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    v[v.len() / 2]
}

fn arg<T: std::str::FromStr>(args: &[String], i: usize, what: &str) -> T {
    args.get(i).and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        eprintln!("missing or bad argument {i}: {what}");
        std::process::exit(2)
    })
}

/// A chain of `nodes` adds of 64-element F32 tensors (the graph ggml's overhead was measured on).
fn chain(nodes: usize) -> quantgraph::Result<(Graph, quantgraph::TensorId, quantgraph::TensorId)> {
    let mut g = Graph::with_capacity(nodes + 2);
    let x = g.input(DType::F32, &[64])?;
    let mut t = x;
    for _ in 0..nodes {
        t = g.add(t, x)?;
    }
    g.set_output(t);
    Ok((g, x, t))
}

fn node_overhead(nodes: usize, threads: usize) -> quantgraph::Result<()> {
    let be = CpuBackend::with_threads(threads)?;
    let (g, x, _) = chain(nodes)?;
    let mut plan = Plan::new(g, &be)?;
    plan.set_input(x, &rand_vec(64, 1))?;
    for _ in 0..20 {
        plan.compute()?;
    }
    let mut times = Vec::new();
    for _ in 0..200 {
        let t0 = Instant::now();
        plan.compute()?;
        times.push(t0.elapsed().as_secs_f64());
    }
    let us = median(times) * 1e6 / nodes as f64;
    println!("quantgraph node_overhead nodes={nodes} threads={threads} median_us_per_node={us:.3}");
    Ok(())
}

fn plan_overhead(nodes: usize) -> quantgraph::Result<()> {
    let be = CpuBackend::with_threads(1)?;
    let mut times = Vec::new();
    for _ in 0..200 {
        let t0 = Instant::now();
        let (g, _, _) = chain(nodes)?;
        let plan = Plan::new(g, &be)?;
        std::hint::black_box(&plan);
        times.push(t0.elapsed().as_secs_f64());
    }
    println!("quantgraph plan_overhead nodes={nodes} median_us={:.1}", median(times) * 1e6);
    Ok(())
}

fn matmul(
    ty: DType,
    m: usize,
    n: usize,
    k: usize,
    threads: usize,
    reps: usize,
) -> quantgraph::Result<()> {
    let be = CpuBackend::with_threads(threads)?;
    let a = rand_vec(m * k, 1);
    let row = ty.row_size(k)?;
    let mut bytes = vec![0u8; row * m];
    match ty {
        DType::F32 => bytes.copy_from_slice(bytemuck::cast_slice(&a)),
        DType::F16 | DType::BF16 => quantgraph::quant::quantize_for_dot(ty, &a, &mut bytes)?,
        _ => quantgraph::quant::quantize(ty, &a, &mut bytes)?,
    }
    let wbuf = Buffer::from_host(bytes);
    let mut g = Graph::new();
    let w = g.weight(ty, &[k, m], &wbuf, 0)?;
    let x = g.input(DType::F32, &[k, n])?;
    let y = g.mul_mat(w, x)?;
    g.set_output(y);
    let mut plan = Plan::new(g, &be)?;
    plan.set_input(x, &rand_vec(k * n, 2))?;
    plan.compute()?;
    let mut times = Vec::new();
    for _ in 0..reps.max(1) {
        let t0 = Instant::now();
        plan.compute()?;
        times.push(t0.elapsed().as_secs_f64());
    }
    let t = median(times);
    let gflops = 2.0 * (m * n * k) as f64 / t / 1e9;
    println!(
        "quantgraph matmul {} {m} {n} {k} threads={} median_ms={:.3} gflops={gflops:.1}",
        ty.name(),
        be.n_threads(),
        t * 1e3
    );
    Ok(())
}

fn vec_dot(ty: DType, n: usize, reps: usize) -> quantgraph::Result<()> {
    let x = rand_vec(n, 1);
    let y = rand_vec(n, 2);
    let mut xq = vec![0u8; ty.row_size(n)?];
    match ty {
        DType::F32 | DType::F16 | DType::BF16 => {
            quantgraph::quant::quantize_for_dot(ty, &x, &mut xq)?
        }
        // iq1_s, iq2_xxs, iq2_xs need an importance matrix: a uniform one.
        DType::IQ1_S | DType::IQ2_XXS | DType::IQ2_XS => {
            quantgraph::quant::quantize_with_imatrix(ty, &x, n, &vec![1.0; n], &mut xq)?
        }
        _ => quantgraph::quant::quantize(ty, &x, &mut xq)?,
    }
    let vd = ty.vec_dot_type();
    let mut yq = vec![0u8; vd.row_size(n)?];
    quantgraph::quant::quantize_for_dot(vd, &y, &mut yq)?;
    let inner = 1000;
    let mut times = Vec::new();
    for _ in 0..reps.max(1) {
        let t0 = Instant::now();
        for _ in 0..inner {
            std::hint::black_box(quantgraph::quant::vec_dot(
                ty,
                n,
                std::hint::black_box(&xq),
                &yq,
            )?);
        }
        times.push(t0.elapsed().as_secs_f64() / inner as f64);
    }
    println!(
        "quantgraph vec_dot {} n={n} isa={} median_ns={:.1}",
        ty.name(),
        quantgraph::kernels::selected_isa().name(),
        median(times) * 1e9
    );
    Ok(())
}

/// Measures memory bandwidth (GB/s) with a multi-threaded copy of 256 MiB, the same run's
/// reference for the GB/s columns.
fn bandwidth(threads: usize) -> f64 {
    let n = 32 << 20; // f64 elements: 256 MiB per side
    let src = vec![1.0f64; n];
    let mut dst = vec![0.0f64; n];
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("pool");
    let mut times = Vec::new();
    for _ in 0..5 {
        let t0 = Instant::now();
        pool.install(|| {
            use rayon::prelude::*;
            dst.par_chunks_mut(1 << 16)
                .zip(src.par_chunks(1 << 16))
                .for_each(|(d, s)| d.copy_from_slice(s));
        });
        times.push(t0.elapsed().as_secs_f64());
    }
    std::hint::black_box(&dst);
    2.0 * (n * 8) as f64 / median(times) / 1e9
}

/// One op on the shapes the issues name; prints median ms and GB/s of tensor traffic.
fn op(name: &str, threads: usize, reps: usize) -> quantgraph::Result<()> {
    use quantgraph::{FlashAttnParams, RopeMode, RopeParams};
    let be = CpuBackend::with_threads(threads)?;
    let mut g = Graph::new();
    let mut f32_inputs = Vec::new();
    let mut i32_inputs: Vec<(quantgraph::TensorId, Vec<i32>)> = Vec::new();
    let mut f16_inputs = Vec::new();
    let mut input = |g: &mut Graph, ne: &[usize]| -> quantgraph::Result<quantgraph::TensorId> {
        let t = g.input(DType::F32, ne)?;
        f32_inputs.push((t, ne.iter().product::<usize>()));
        Ok(t)
    };
    let mut input16 = |g: &mut Graph, ne: &[usize]| -> quantgraph::Result<quantgraph::TensorId> {
        let t = g.input(DType::F16, ne)?;
        f16_inputs.push((t, ne.iter().product::<usize>()));
        Ok(t)
    };
    // (output, bytes moved per run)
    let (out, bytes) = match name {
        "rms_norm" => {
            let a = input(&mut g, &[4096, 512])?;
            (g.rms_norm(a, 1e-5)?, 2 * 4096 * 512 * 4)
        }
        "soft_max_ext" => {
            let a = input(&mut g, &[512, 512, 32])?;
            let m = input16(&mut g, &[512, 512])?;
            (g.soft_max_ext(a, Some(m), 0.125, 0.0)?, 2 * 512 * 512 * 32 * 4)
        }
        "rope" => {
            let a = input(&mut g, &[128, 32, 512])?;
            let p = g.input(DType::I32, &[512])?;
            i32_inputs.push((p, (0..512).collect()));
            (
                g.rope_ext(a, p, None, RopeParams::new(128, RopeMode::Neox, 10000.0))?,
                2 * 128 * 32 * 512 * 4,
            )
        }
        "add" | "mul" => {
            let a = input(&mut g, &[4096, 512])?;
            let b = input(&mut g, &[4096, 512])?;
            (if name == "add" { g.add(a, b)? } else { g.mul(a, b)? }, 3 * 4096 * 512 * 4)
        }
        "silu" | "gelu" => {
            let a = input(&mut g, &[4096, 512])?;
            (if name == "silu" { g.silu(a)? } else { g.gelu(a)? }, 2 * 4096 * 512 * 4)
        }
        "swiglu" => {
            let a = input(&mut g, &[11008, 512])?;
            let b = input(&mut g, &[11008, 512])?;
            (g.swiglu(a, Some(b))?, 3 * 11008 * 512 * 4)
        }
        "get_rows" => {
            let w = rand_vec(4096 * 4096, 3);
            let mut q = vec![0u8; DType::Q4_0.row_size(4096 * 4096)?];
            quantgraph::quant::quantize(DType::Q4_0, &w, &mut q)?;
            let buf = Buffer::from_host(q);
            let a = g.weight(DType::Q4_0, &[4096, 4096], &buf, 0)?;
            let ids = g.input(DType::I32, &[512])?;
            i32_inputs.push((ids, (0..512).map(|i| (i * 7919) % 4096).collect()));
            (g.get_rows(a, ids)?, 512 * 4096 * 4 + 512 * DType::Q4_0.row_size(4096)?)
        }
        "cpy_f32_q8_0" => {
            let a = input(&mut g, &[4096, 512])?;
            (g.cast(a, DType::Q8_0)?, 4096 * 512 * 4 + DType::Q8_0.row_size(4096 * 512)?)
        }
        "flash_attn_ext" | "flash_attn_ext_decode" => {
            let (nq, nkv) = if name == "flash_attn_ext" { (512, 512) } else { (1, 4096) };
            let q = input(&mut g, &[128, nq, 32])?;
            let k = input16(&mut g, &[128, nkv, 32])?;
            let v = input16(&mut g, &[128, nkv, 32])?;
            let m = input16(&mut g, &[nkv, nq.next_multiple_of(4)])?;
            let o = g.flash_attn_ext(q, k, v, Some(m), None, FlashAttnParams::new(0.088))?;
            (o, 2 * nkv * 128 * 32 * 2 + 2 * nq * 128 * 32 * 4)
        }
        _ => return Err(quantgraph::Error::InvalidArgument(format!("unknown op bench {name}"))),
    };
    g.set_output(out);
    let mut plan = Plan::new(g, &be)?;
    for (t, n) in &f32_inputs {
        plan.set_input(*t, &rand_vec(*n, 7))?;
    }
    for (t, n) in &f16_inputs {
        let v: Vec<half::f16> = rand_vec(*n, 8).iter().map(|&x| half::f16::from_f32(x)).collect();
        plan.set_input(*t, &v)?;
    }
    for (t, v) in &i32_inputs {
        plan.set_input(*t, v)?;
    }
    plan.compute()?;
    let mut times = Vec::new();
    for _ in 0..reps.max(1) {
        let t0 = Instant::now();
        plan.compute()?;
        times.push(t0.elapsed().as_secs_f64());
    }
    let t = median(times);
    println!(
        "quantgraph op {name} threads={threads} median_ms={:.3} gbps={:.1} machine_gbps={:.1}",
        t * 1e3,
        bytes as f64 / t / 1e9,
        bandwidth(threads)
    );
    Ok(())
}

/// Prefill (512 tokens) and decode tokens per second of a synthetic llama model: `tiny` (the
/// quickstart's) or `large` (8 layers, d=1024, Q4_0).
fn model(which: &str, threads: usize, n_prompt: usize, n_gen: usize) -> quantgraph::Result<()> {
    use quantgraph::models::llama::{Llama, LlamaConfig, WeightTypes, argmax, synthetic_gguf};
    let n_ctx = n_prompt + n_gen;
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
                "unknown model {which} (tiny|large)"
            )));
        }
    };
    let file = quantgraph::GgufFile::from_vec(synthetic_gguf(&cfg, types, 1)?)?;
    let be = CpuBackend::with_threads(threads)?;
    let mut m = Llama::from_gguf(&file, None, &be)?;
    let prompt: Vec<u32> = (0..n_prompt).map(|i| ((i * 7919 + 13) % cfg.n_vocab) as u32).collect();
    let t0 = Instant::now();
    let logits = m.forward(&prompt)?;
    let tp = t0.elapsed().as_secs_f64();
    let mut next = argmax(&logits[logits.len() - cfg.n_vocab..]);
    let mut times = Vec::new();
    for _ in 0..n_gen {
        let t0 = Instant::now();
        next = argmax(&m.forward(&[next])?);
        times.push(t0.elapsed().as_secs_f64());
    }
    println!(
        "quantgraph model {which} threads={threads} prefill_tokens={n_prompt} prefill_tok_s={:.1} decode_tok_s={:.1}",
        n_prompt as f64 / tp,
        1.0 / median(times)
    );
    Ok(())
}

/// Vision ops (issue #7): conv_2d (3x3, 64->64 channels, 64x64 image, batch 1, stride 1, pad 1;
/// `conv_2d_f16` with an F16 kernel), im2col of the same shapes (F32 and `im2col_f16` results)
/// and a 2x2 max pool_2d (stride 2) over 64 channels of 128x128. Prints GFLOPS for the
/// convolutions and GB/s of tensor traffic for the memory-bound ones.
fn vision_op(name: &str, threads: usize, reps: usize) -> quantgraph::Result<()> {
    use quantgraph::{Conv2dParams, PoolOp};
    let be = CpuBackend::with_threads(threads)?;
    let mut g = Graph::new();
    let p = Conv2dParams::square(1, 1, 1);
    let (w, h, c, oc) = (64usize, 64usize, 64usize, 64usize);
    let mut inputs = Vec::new();
    // (output, flops, bytes)
    let (out, flops, bytes) = match name {
        "conv_2d" | "conv_2d_f16" | "im2col" | "im2col_f16" => {
            let x = g.input(DType::F32, &[w, h, c, 1])?;
            let kt = if name.ends_with("f16") { DType::F16 } else { DType::F32 };
            let k = g.input(kt, &[3, 3, c, oc])?;
            inputs.push((x, DType::F32, w * h * c));
            inputs.push((k, kt, 9 * c * oc));
            if name.starts_with("conv") {
                (g.conv_2d(k, x, p)?, 2.0 * (w * h * oc * c * 9) as f64, 0)
            } else {
                let o = g.im2col(k, x, p, true, kt)?;
                (o, 0.0, w * h * c * 4 + w * h * c * 9 * kt.type_size())
            }
        }
        "pool_2d" => {
            let x = g.input(DType::F32, &[128, 128, 64, 1])?;
            inputs.push((x, DType::F32, 128 * 128 * 64));
            (g.pool_2d(x, PoolOp::Max, 2, 2, 2, 2, 0.0, 0.0)?, 0.0, 128 * 128 * 64 * 4 * 5 / 4)
        }
        _ => return Err(quantgraph::Error::InvalidArgument(format!("unknown op bench {name}"))),
    };
    g.set_output(out);
    let mut plan = Plan::new(g, &be)?;
    for (i, (t, dt, n)) in inputs.iter().enumerate() {
        let v = rand_vec(*n, 11 + i as u64);
        if *dt == DType::F16 {
            let h: Vec<half::f16> = v.iter().map(|&x| half::f16::from_f32(x)).collect();
            plan.set_input(*t, &h)?;
        } else {
            plan.set_input(*t, &v)?;
        }
    }
    plan.compute()?;
    let mut times = Vec::new();
    for _ in 0..reps.max(1) {
        let t0 = Instant::now();
        plan.compute()?;
        times.push(t0.elapsed().as_secs_f64());
    }
    let t = median(times);
    if flops > 0.0 {
        println!(
            "quantgraph op {name} threads={threads} median_ms={:.3} gflops={:.1}",
            t * 1e3,
            flops / t / 1e9
        );
    } else {
        println!(
            "quantgraph op {name} threads={threads} median_ms={:.3} gbytes_per_s={:.1}",
            t * 1e3,
            bytes as f64 / t / 1e9
        );
    }
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.first().map(String::as_str) {
        Some("node-overhead") => node_overhead(arg(&args, 1, "NODES"), arg(&args, 2, "THREADS")),
        Some("plan-overhead") => plan_overhead(arg(&args, 1, "NODES")),
        Some("matmul") => {
            let ty: String = arg(&args, 1, "TYPE");
            match DType::from_name(&ty) {
                Some(t) => matmul(
                    t,
                    arg(&args, 2, "M"),
                    arg(&args, 3, "N"),
                    arg(&args, 4, "K"),
                    arg(&args, 5, "THREADS"),
                    arg(&args, 6, "REPS"),
                ),
                None => Err(quantgraph::Error::UnknownType(ty)),
            }
        }
        Some("op")
            if matches!(
                args.get(1).map(String::as_str),
                Some("conv_2d" | "conv_2d_f16" | "im2col" | "im2col_f16" | "pool_2d")
            ) =>
        {
            vision_op(
                &arg::<String>(&args, 1, "NAME"),
                arg(&args, 2, "THREADS"),
                arg(&args, 3, "REPS"),
            )
        }
        Some("op") => {
            op(&arg::<String>(&args, 1, "NAME"), arg(&args, 2, "THREADS"), arg(&args, 3, "REPS"))
        }
        Some("model") => model(
            &arg::<String>(&args, 1, "tiny|large"),
            arg(&args, 2, "THREADS"),
            args.get(3).and_then(|s| s.parse().ok()).unwrap_or(512),
            args.get(4).and_then(|s| s.parse().ok()).unwrap_or(16),
        ),
        Some("bandwidth") => {
            let t: usize = arg(&args, 1, "THREADS");
            println!("quantgraph bandwidth threads={t} gbps={:.1}", bandwidth(t));
            Ok(())
        }
        Some("vec-dot") => {
            let ty: String = arg(&args, 1, "TYPE");
            match DType::from_name(&ty) {
                Some(t) => vec_dot(t, arg(&args, 2, "N"), arg(&args, 3, "REPS")),
                None => Err(quantgraph::Error::UnknownType(ty)),
            }
        }
        _ => {
            eprintln!(
                "usage: bench node-overhead NODES THREADS | plan-overhead NODES | \
                 matmul TYPE M N K THREADS REPS | vec-dot TYPE N REPS | op NAME THREADS REPS | \
                 bandwidth THREADS | model tiny|large THREADS [N_PROMPT] [N_GEN]"
            );
            std::process::exit(2)
        }
    };
    if let Err(e) = r {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
