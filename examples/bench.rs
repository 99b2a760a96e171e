//! Benchmarks with one line of output per run, compared against ggml's runs of the same shapes.
//!
//! ```text
//! cargo run --release --example bench -- node-overhead NODES THREADS
//! cargo run --release --example bench -- plan-overhead NODES
//! cargo run --release --example bench -- matmul TYPE M N K THREADS REPS [--repack]
//! cargo run --release --example bench -- mul_mat_id TYPE M N K N_EXPERT N_USED THREADS REPS [--repack]
//! cargo run --release --example bench -- vec-dot TYPE N REPS [--kernel]
//! cargo run --release --example bench -- peak THREADS
//! cargo run --release --example bench -- op ssm_scan|rwkv_wkv6[_decode] THREADS REPS
//! cargo run --release --example bench -- train-op NAME THREADS REPS
//! cargo run --release --example bench -- model tiny|large|FILE.gguf THREADS [N_PROMPT] [N_GEN] [--repack]
//! ```
//! `model` with a llama-architecture GGUF file prints prefill and decode tokens/s in the form of
//! llama-bench's pp / tg (last-token logits for the prompt, median decode step).
//! Times are medians over repetitions; the machine is noisy, so compare ratios measured together.

use quantgraph::testdata::{rand_f32, uniform};
use quantgraph::{Backend, Buffer, BufferType, CpuBackend, DType, Graph, Plan};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    v[v.len() / 2]
}

/// One warm-up compute, then the median wall time of `reps` computes, in seconds.
/// FNV-1a of a tensor's bytes after the last compute: two builds that print the same digest for
/// the same command computed the same bits.
fn digest(plan: &Plan, id: quantgraph::TensorId) -> String {
    let bytes = plan.output_bytes(id).unwrap_or(&[]);
    let h = bytes
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    format!("{h:016x}")
}

fn median_compute_secs(plan: &mut Plan, reps: usize) -> quantgraph::Result<f64> {
    plan.compute()?;
    let mut times = Vec::new();
    for _ in 0..reps.max(1) {
        let t0 = Instant::now();
        plan.compute()?;
        times.push(t0.elapsed().as_secs_f64());
    }
    Ok(median(times))
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
    plan.set_input(x, &rand_f32(64, 1))?;
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
    repack: bool,
) -> quantgraph::Result<()> {
    let be = CpuBackend::with_threads(threads)?;
    let a = rand_f32(m * k, 1);
    let row = ty.row_size(k)?;
    let mut bytes = vec![0u8; row * m];
    match ty {
        DType::F32 => bytes.copy_from_slice(bytemuck::cast_slice(&a)),
        DType::F16 | DType::BF16 => quantgraph::quant::quantize_for_dot(ty, &a, &mut bytes)?,
        _ => quantgraph::quant::quantize(ty, &a, &mut bytes)?,
    }
    let wbuf = weight_buffer(ty, &[k, m], bytes, repack)?;
    let mut g = Graph::new();
    let w = g.weight(ty, &[k, m], &wbuf, 0)?;
    let x = g.input(DType::F32, &[k, n])?;
    let y = g.mul_mat(w, x)?;
    g.set_output(y);
    let mut plan = Plan::new(g, &be)?;
    plan.set_input(x, &rand_f32(k * n, 2))?;
    let t = median_compute_secs(&mut plan, reps)?;
    let gflops = 2.0 * (m * n * k) as f64 / t / 1e9;
    let suffix = if repack {
        format!(" buffer=CPU_REPACK weight_bytes={}", wbuf.len())
    } else {
        String::new()
    };
    println!(
        "quantgraph matmul {} {m} {n} {k} threads={} median_ms={:.3} gflops={gflops:.1}{suffix} digest={}",
        ty.name(),
        be.n_threads(),
        t * 1e3,
        digest(&plan, y)
    );
    Ok(())
}

/// The weights in a plain buffer, or (with `--repack`) in the CPU_REPACK buffer type: repacked on
/// the way in, the plain bytes dropped right after, so only one copy stays alive.
fn weight_buffer(
    ty: DType,
    ne: &[usize],
    bytes: Vec<u8>,
    repack: bool,
) -> quantgraph::Result<Buffer> {
    if !repack {
        return Ok(Buffer::from_host(bytes));
    }
    let b = quantgraph::CpuRepackBufferType.alloc(bytes.len())?;
    b.set_tensor(0, ty, ne, &bytes)?;
    Ok(b)
}

/// `bench mul_mat_id TYPE M N K N_EXPERT N_USED THREADS REPS`: mul_mat_id as test-backend-ops
/// times it: `as` [K, M, E] weights, b F32 [K, U, N] (one row per slot), ids [U, N] picking U
/// distinct experts per token; flops = 2 M N K U. `--repack` stores the experts in the CPU_REPACK
/// buffer type.
#[allow(clippy::too_many_arguments)]
fn mul_mat_id(
    ty: DType,
    m: usize,
    n: usize,
    k: usize,
    experts: usize,
    used: usize,
    threads: usize,
    reps: usize,
    repack: bool,
) -> quantgraph::Result<()> {
    if used == 0 || used > experts {
        return Err(quantgraph::Error::InvalidArgument(format!(
            "mul_mat_id bench: need 1 <= N_USED ({used}) <= N_EXPERT ({experts})"
        )));
    }
    let be = CpuBackend::with_threads(threads)?;
    let a = rand_f32(m * k * experts, 1);
    let mut bytes = vec![0u8; ty.row_size(k)? * m * experts];
    match ty {
        DType::F32 => bytes.copy_from_slice(bytemuck::cast_slice(&a)),
        DType::F16 | DType::BF16 => quantgraph::quant::quantize_for_dot(ty, &a, &mut bytes)?,
        _ => quantgraph::quant::quantize(ty, &a, &mut bytes)?,
    }
    let wbuf = weight_buffer(ty, &[k, m, experts], bytes, repack)?;
    let mut g = Graph::new();
    let w = g.weight(ty, &[k, m, experts], &wbuf, 0)?;
    let x = g.input(DType::F32, &[k, used, n])?;
    let ids = g.input(DType::I32, &[used, n])?;
    let y = g.mul_mat_id(w, x, ids)?;
    g.set_output(y);
    let mut plan = Plan::new(g, &be)?;
    plan.set_input(x, &rand_f32(k * used * n, 2))?;
    // Token t uses experts t, t + 1, ... (mod E): every expert gets work as in a real batch.
    let ids_v: Vec<i32> =
        (0..n).flat_map(|t| (0..used).map(move |s| ((t + s) % experts) as i32)).collect();
    plan.set_input(ids, &ids_v)?;
    let t = median_compute_secs(&mut plan, reps)?;
    let gflops = 2.0 * (m * n * k * used) as f64 / t / 1e9;
    println!(
        "quantgraph mul_mat_id {} {m} {n} {k} experts={experts} used={used} threads={} median_ms={:.3} gflops={gflops:.1}{}",
        ty.name(),
        be.n_threads(),
        t * 1e3,
        if repack { " buffer=CPU_REPACK" } else { "" }
    );
    Ok(())
}

/// Median over `reps` of the mean time of 1000 dot products of one `n`-element row, the method of
/// ggml's side-by-side harness. By default through the public `quant::vec_dot` (dispatch and length
/// checks on every call); with `kernel` through a [`quantgraph::kernels::VecDotKernel`] bound once,
/// which calls the selected tier's kernel the way ggml's harness calls `type_traits_cpu[t].vec_dot`.
fn vec_dot(ty: DType, n: usize, reps: usize, kernel: bool) -> quantgraph::Result<()> {
    let x = rand_f32(n, 1);
    let y = rand_f32(n, 2);
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
    let bound = quantgraph::kernels::VecDotKernel::new(quantgraph::kernels::selected_isa(), ty, n)?;
    let mut times = Vec::new();
    for _ in 0..reps.max(1) {
        let t0 = Instant::now();
        if kernel {
            for _ in 0..inner {
                std::hint::black_box(bound.dot(std::hint::black_box(&xq), &yq)?);
            }
        } else {
            for _ in 0..inner {
                std::hint::black_box(quantgraph::quant::vec_dot(
                    ty,
                    n,
                    std::hint::black_box(&xq),
                    &yq,
                )?);
            }
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

/// One warm-up compute, then (median, best) wall time of `reps` computes, in seconds: on a busy
/// machine the best run is the steadier side-by-side figure.
fn median_and_best_compute_secs(plan: &mut Plan, reps: usize) -> quantgraph::Result<(f64, f64)> {
    plan.compute()?;
    let mut times = Vec::new();
    for _ in 0..reps.max(1) {
        let t0 = Instant::now();
        plan.compute()?;
        times.push(t0.elapsed().as_secs_f64());
    }
    let best = times.iter().copied().fold(f64::INFINITY, f64::min);
    Ok((median(times), best))
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
        "ssm_scan" | "ssm_scan_decode" | "rwkv_wkv6" | "rwkv_wkv6_decode" => {
            return recurrent_op(name, threads, reps);
        }
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
            let w = rand_f32(4096 * 4096, 3);
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
        plan.set_input(*t, &rand_f32(*n, 7))?;
    }
    for (t, n) in &f16_inputs {
        let v: Vec<half::f16> = rand_f32(*n, 8).iter().map(|&x| half::f16::from_f32(x)).collect();
        plan.set_input(*t, &v)?;
    }
    for (t, v) in &i32_inputs {
        plan.set_input(*t, v)?;
    }
    let (t, best) = median_and_best_compute_secs(&mut plan, reps)?;
    println!(
        "quantgraph op {name} threads={threads} median_ms={:.3} best_ms={:.3} gbytes_per_s={:.1} machine_gbytes_per_s={:.1} digest={}",
        t * 1e3,
        best * 1e3,
        bytes as f64 / t / 1e9,
        if std::env::var_os("QG_BENCH_NO_BANDWIDTH").is_some() { 0.0 } else { bandwidth(threads) },
        digest(&plan, out)
    );
    Ok(())
}

/// The recurrent ops on model shapes, in GFLOPS (their state stays in cache, so flops, not
/// bytes, bound them):
/// - `ssm_scan`: Mamba-2 prefill, d_state 128, head_dim 64, 32 heads (d_inner 2048), 1 group,
///   512 tokens, 1 sequence; 5 flops per state element per token. `ssm_scan_decode`: 1 token.
/// - `rwkv_wkv6`: 32 heads of 64 (C = 2048), 512 tokens, 1 sequence; 7 flops per state element
///   per token. `rwkv_wkv6_decode`: 1 token.
fn recurrent_op(name: &str, threads: usize, reps: usize) -> quantgraph::Result<()> {
    let be = CpuBackend::with_threads(threads)?;
    let mut g = Graph::new();
    let mut inputs: Vec<(quantgraph::TensorId, Vec<f32>)> = Vec::new();
    let mut input = |g: &mut Graph, ne: &[usize], lo: f32, hi: f32| {
        let t = g.input(DType::F32, ne)?;
        let n = ne.iter().product::<usize>();
        inputs.push((t, uniform(n, inputs.len() as u64 + 1, lo, hi)));
        Ok::<_, quantgraph::Error>(t)
    };
    let decode = name.ends_with("_decode");
    let n_tok = if decode { 1 } else { 512 };
    let mut ids = None;
    let (out, flops) = if name.starts_with("ssm_scan") {
        let (ds, hd, nh, ng) = (128, 64, 32, 1);
        let s = input(&mut g, &[ds, hd, nh, 1], -1.0, 1.0)?;
        let x = input(&mut g, &[hd, nh, n_tok, 1], -1.0, 1.0)?;
        let dt = input(&mut g, &[nh, n_tok, 1], -1.0, 1.0)?;
        let a = input(&mut g, &[1, nh], -1.0, -0.5)?;
        let b = input(&mut g, &[ds, ng, n_tok, 1], -1.0, 1.0)?;
        let c = input(&mut g, &[ds, ng, n_tok, 1], -1.0, 1.0)?;
        let id = g.input(DType::I32, &[1])?;
        ids = Some(id);
        (g.ssm_scan(s, x, dt, a, b, c, id, 1)?, 5.0 * (ds * hd * nh * n_tok) as f64)
    } else {
        let (h, sz) = (32, 64);
        let k = input(&mut g, &[sz, h, n_tok], -1.0, 1.0)?;
        let v = input(&mut g, &[sz, h, n_tok], -1.0, 1.0)?;
        let r = input(&mut g, &[sz, h, n_tok], -1.0, 1.0)?;
        let tf = input(&mut g, &[sz, h], -1.0, 1.0)?;
        let td = input(&mut g, &[sz, h, n_tok], 0.0, 1.0)?;
        let st = input(&mut g, &[sz * sz * h, 1], -1.0, 1.0)?;
        (g.rwkv_wkv6(k, v, r, tf, td, st)?, 7.0 * (sz * sz * h * n_tok) as f64)
    };
    g.set_output(out);
    let mut plan = Plan::new(g, &be)?;
    for (t, v) in &inputs {
        plan.set_input(*t, v)?;
    }
    if let Some(id) = ids {
        plan.set_input(id, &[0i32])?;
    }
    let t = median_compute_secs(&mut plan, reps)?;
    println!(
        "quantgraph op {name} threads={threads} median_ms={:.3} gflops={:.2}",
        t * 1e3,
        flops / t / 1e9
    );
    Ok(())
}

/// One training op (issue #7) on a typical shape; prints median ms and GB/s of tensor traffic.
fn train_op(name: &str, threads: usize, reps: usize) -> quantgraph::Result<()> {
    use quantgraph::{PoolOp, RopeMode, RopeParams};
    let be = CpuBackend::with_threads(threads)?;
    let mut g = Graph::new();
    let mut f32_inputs: Vec<(quantgraph::TensorId, usize)> = Vec::new();
    let mut i32_inputs: Vec<(quantgraph::TensorId, Vec<i32>)> = Vec::new();
    let mut input = |g: &mut Graph, ne: &[usize]| -> quantgraph::Result<quantgraph::TensorId> {
        let t = g.input(DType::F32, ne)?;
        f32_inputs.push((t, ne.iter().product::<usize>()));
        Ok(t)
    };
    let mut states = Vec::new();
    let mut state = |g: &mut Graph, ne: &[usize]| -> quantgraph::Result<quantgraph::TensorId> {
        let n: usize = ne.iter().product();
        let buf = Buffer::alloc(n * 4)?;
        buf.write_f32(0, &rand_f32(n, 11).iter().map(|v| v.abs()).collect::<Vec<_>>())?;
        let t = g.state(DType::F32, ne, &buf, 0)?;
        states.push(buf);
        Ok(t)
    };
    // (output, bytes moved per run); optimizer steps write state and have no output to mark.
    let (out, bytes) = match name {
        "cross_entropy_loss" => {
            let a = input(&mut g, &[32000, 64])?;
            let b = input(&mut g, &[32000, 64])?;
            (g.cross_entropy_loss(a, b)?, 2 * 32000 * 64 * 4)
        }
        "cross_entropy_loss_back" => {
            let d = input(&mut g, &[1])?;
            let a = input(&mut g, &[32000, 64])?;
            let b = input(&mut g, &[32000, 64])?;
            (g.cross_entropy_loss_back(d, a, b)?, 3 * 32000 * 64 * 4)
        }
        "opt_step_adamw" => {
            let ne = [4096, 1024];
            let w = state(&mut g, &ne)?;
            let m = state(&mut g, &ne)?;
            let v = state(&mut g, &ne)?;
            let gr = input(&mut g, &ne)?;
            let p = g.input(DType::F32, &[7])?;
            f32_inputs.push((p, 7));
            (g.opt_step_adamw(w, gr, m, v, p)?, 7 * 4096 * 1024 * 4)
        }
        "opt_step_sgd" => {
            let ne = [4096, 1024];
            let w = state(&mut g, &ne)?;
            let gr = input(&mut g, &ne)?;
            let p = g.input(DType::F32, &[2])?;
            f32_inputs.push((p, 2));
            (g.opt_step_sgd(w, gr, p)?, 3 * 4096 * 1024 * 4)
        }
        "silu_back" => {
            let a = input(&mut g, &[4096, 512])?;
            let b = input(&mut g, &[4096, 512])?;
            (g.silu_back(a, b)?, 3 * 4096 * 512 * 4)
        }
        "rms_norm_back" => {
            let a = input(&mut g, &[4096, 512])?;
            let b = input(&mut g, &[4096, 512])?;
            (g.rms_norm_back(a, b, 1e-5)?, 3 * 4096 * 512 * 4)
        }
        "soft_max_back" => {
            let a = input(&mut g, &[512, 512, 32])?;
            let b = input(&mut g, &[512, 512, 32])?;
            (g.soft_max_ext_back(a, b, 0.125, 0.0)?, 3 * 512 * 512 * 32 * 4)
        }
        "rope_back" => {
            let a = input(&mut g, &[128, 32, 512])?;
            let p = g.input(DType::I32, &[512])?;
            i32_inputs.push((p, (0..512).collect()));
            let rp = RopeParams::new(128, RopeMode::Neox, 10000.0);
            (g.rope_ext_back(a, p, None, rp)?, 2 * 128 * 32 * 512 * 4)
        }
        "get_rows_back" => {
            let a = input(&mut g, &[4096, 512])?;
            let ids = g.input(DType::I32, &[512])?;
            i32_inputs.push((ids, (0..512).map(|i| (i * 7919) % 32000).collect()));
            let like = g.input(DType::F32, &[4096, 32000])?;
            (g.get_rows_back(a, ids, like)?, (32000 + 2 * 512) * 4096 * 4)
        }
        "im2col_back" => {
            // 3x3 conv, 64 channels on 64x64 images, batch 4 (im2col output [576, 64, 64, 4]).
            let a = input(&mut g, &[576, 64, 64, 4])?;
            let k = input(&mut g, &[3, 3, 64, 64])?;
            (
                g.im2col_back(a, k, [64, 64, 64, 4], 1, 1, 1, 1, 1, 1, true)?,
                (576 + 64) * 64 * 64 * 4 * 4,
            )
        }
        "pool_2d_back" => {
            let a = input(&mut g, &[64, 64, 64, 4])?;
            let af = input(&mut g, &[128, 128, 64, 4])?;
            (
                g.pool_2d_back(a, af, PoolOp::Max, 2, 2, 2, 2, 0.0, 0.0)?,
                (64 * 64 + 2 * 128 * 128) * 64 * 4 * 4,
            )
        }
        "flash_attn_back" => {
            let (d, n, h) = (64, 256, 8);
            let q = input(&mut g, &[d, n, h])?;
            let k = input(&mut g, &[d, n, h])?;
            let v = input(&mut g, &[n, d, h])?;
            let dd = input(&mut g, &[d, n, h])?;
            (g.flash_attn_back(q, k, v, dd, true)?, 7 * d * n * h * 4)
        }
        _ => return Err(quantgraph::Error::InvalidArgument(format!("unknown train op {name}"))),
    };
    if !name.starts_with("opt_step") {
        g.set_output(out);
    }
    let mut plan = Plan::new(g, &be)?;
    for (t, n) in &f32_inputs {
        let v: Vec<f32> = if *n == 7 {
            vec![1e-3, 0.9, 0.999, 1e-8, 0.0, 10.0, 1000.0]
        } else if *n == 2 {
            vec![1e-3, 0.0]
        } else {
            rand_f32(*n, 7)
        };
        plan.set_input(*t, &v)?;
    }
    for (t, v) in &i32_inputs {
        plan.set_input(*t, v)?;
    }
    let t = median_compute_secs(&mut plan, reps)?;
    println!(
        "quantgraph train-op {name} threads={threads} median_ms={:.3} gbytes_per_s={:.1}",
        t * 1e3,
        bytes as f64 / t / 1e9
    );
    Ok(())
}

/// Prefill (512 tokens) and decode tokens per second of a synthetic llama model: `tiny` (the
/// quickstart's) or `large` (8 layers, d=1024, Q4_0).
fn model(
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

/// The f32 FMA peak of `threads` threads: 12 independent FMA chains per thread, 16-lane where
/// the CPU has AVX-512 (the width quantgraph's AVX-512 tier uses), else 8-lane (AVX2); median of
/// 5 runs of about 0.1 s. Prefill f32 matmul is compared against this number.
fn fma_peak(threads: usize) -> f64 {
    #[cfg(target_arch = "x86_64")]
    fn per_thread(iters: u64) -> u64 {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn chains(iters: u64) -> f32 {
            use std::arch::x86_64::*;
            let mut acc = [_mm256_set1_ps(0.5); 12];
            let (m, a) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
            for _ in 0..iters {
                for v in acc.iter_mut() {
                    *v = _mm256_fmadd_ps(*v, m, a);
                }
            }
            let mut s = [0f32; 8];
            let mut t = acc[0];
            for v in &acc[1..] {
                t = _mm256_add_ps(t, *v);
            }
            // SAFETY: `s` holds 8 f32.
            unsafe { _mm256_storeu_ps(s.as_mut_ptr(), t) };
            s.iter().sum()
        }
        #[target_feature(enable = "avx512f")]
        unsafe fn chains16(iters: u64) -> f32 {
            use std::arch::x86_64::*;
            let mut acc = [_mm512_set1_ps(0.5); 12];
            let (m, a) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
            for _ in 0..iters {
                for v in acc.iter_mut() {
                    *v = _mm512_fmadd_ps(*v, m, a);
                }
            }
            let mut t = acc[0];
            for v in &acc[1..] {
                t = _mm512_add_ps(t, *v);
            }
            _mm512_reduce_add_ps(t)
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: AVX-512 F detected just above.
            let v = unsafe { chains16(iters) };
            std::hint::black_box(v);
            iters * 12 * 16 * 2
        } else if std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: AVX2/FMA detected just above.
            let v = unsafe { chains(iters) };
            std::hint::black_box(v);
            iters * 12 * 8 * 2
        } else {
            0
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    fn per_thread(_iters: u64) -> u64 {
        0
    }
    per_second_on_threads(threads, per_thread)
}

/// Median over 5 runs of `threads` threads each calling `work(5_000_000)`: the operations they
/// report, in billions per second.
fn per_second_on_threads(threads: usize, work: fn(u64) -> u64) -> f64 {
    let iters = 5_000_000u64;
    let mut runs = Vec::new();
    for _ in 0..5 {
        let t0 = Instant::now();
        let ops: u64 = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads.max(1)).map(|_| s.spawn(move || work(iters))).collect();
            hs.into_iter().map(|h| h.join().unwrap_or(0)).sum()
        });
        runs.push(ops as f64 / t0.elapsed().as_secs_f64() / 1e9);
    }
    median(runs)
}

/// The int8 dot-product peak of `threads` threads where the CPU has AVX-512 VNNI: 12 independent
/// `vpdpbusd` chains per thread, each instruction 64 multiply-adds (128 operations, counted as
/// GFLOPS are); median of 5 runs. Quantized prefill (the integer GEMM) is compared against it.
fn int8_peak(threads: usize) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    fn per_thread(iters: u64) -> u64 {
        #[target_feature(enable = "avx512f,avx512vnni")]
        unsafe fn chains(iters: u64) -> i32 {
            use std::arch::x86_64::*;
            let mut acc = [_mm512_set1_epi32(1); 12];
            let (u, s) = (_mm512_set1_epi8(3), _mm512_set1_epi8(-2));
            for _ in 0..iters {
                for v in acc.iter_mut() {
                    *v = _mm512_dpbusd_epi32(*v, u, s);
                }
            }
            let mut t = acc[0];
            for v in &acc[1..] {
                t = _mm512_add_epi32(t, *v);
            }
            _mm512_reduce_add_epi32(t)
        }
        // SAFETY: int8_peak runs this only where AVX-512 F and VNNI were detected.
        let v = unsafe { chains(iters) };
        std::hint::black_box(v);
        iters * 12 * 64 * 2
    }
    #[cfg(not(target_arch = "x86_64"))]
    fn per_thread(_iters: u64) -> u64 {
        0
    }
    #[cfg(target_arch = "x86_64")]
    if !(std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512vnni"))
    {
        return None;
    }
    #[cfg(not(target_arch = "x86_64"))]
    return None;
    Some(per_second_on_threads(threads, per_thread))
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
        let v = rand_f32(*n, 11 + i as u64);
        if *dt == DType::F16 {
            let h: Vec<half::f16> = v.iter().map(|&x| half::f16::from_f32(x)).collect();
            plan.set_input(*t, &h)?;
        } else {
            plan.set_input(*t, &v)?;
        }
    }
    let t = median_compute_secs(&mut plan, reps)?;
    if flops > 0.0 {
        println!(
            "quantgraph op {name} threads={threads} median_ms={:.3} gflops={:.1} digest={}",
            t * 1e3,
            flops / t / 1e9,
            digest(&plan, out)
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
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let repack = args.iter().any(|a| a == "--repack");
    args.retain(|a| a != "--repack");
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
                    repack,
                ),
                None => Err(quantgraph::Error::UnknownType(ty)),
            }
        }
        Some("mul_mat_id") => {
            let ty: String = arg(&args, 1, "TYPE");
            match DType::from_name(&ty) {
                Some(t) => mul_mat_id(
                    t,
                    arg(&args, 2, "M"),
                    arg(&args, 3, "N"),
                    arg(&args, 4, "K"),
                    arg(&args, 5, "N_EXPERT"),
                    arg(&args, 6, "N_USED"),
                    arg(&args, 7, "THREADS"),
                    arg(&args, 8, "REPS"),
                    repack,
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
        Some("train-op") => train_op(
            &arg::<String>(&args, 1, "NAME"),
            arg(&args, 2, "THREADS"),
            arg(&args, 3, "REPS"),
        ),
        Some("model") => model(
            &arg::<String>(&args, 1, "tiny|large|FILE.gguf"),
            arg(&args, 2, "THREADS"),
            args.get(3).and_then(|s| s.parse().ok()).unwrap_or(512),
            args.get(4).and_then(|s| s.parse().ok()).unwrap_or(16),
            repack,
        ),
        Some("peak") => {
            let t: usize = arg(&args, 1, "THREADS");
            println!("quantgraph peak threads={t} gflops={:.1}", fma_peak(t));
            if let Some(g) = int8_peak(t) {
                println!("quantgraph int8_peak threads={t} gops={g:.1}");
            }
            Ok(())
        }
        Some("bandwidth") => {
            let t: usize = arg(&args, 1, "THREADS");
            println!("quantgraph bandwidth threads={t} gbps={:.1}", bandwidth(t));
            Ok(())
        }
        Some("vec-dot") => {
            let ty: String = arg(&args, 1, "TYPE");
            match DType::from_name(&ty) {
                Some(t) => {
                    let kernel = args.get(4).is_some_and(|a| a == "--kernel");
                    vec_dot(t, arg(&args, 2, "N"), arg(&args, 3, "REPS"), kernel)
                }
                None => Err(quantgraph::Error::UnknownType(ty)),
            }
        }
        _ => {
            eprintln!(
                "usage: bench node-overhead NODES THREADS | plan-overhead NODES | \
                 matmul TYPE M N K THREADS REPS [--repack] | \
                 mul_mat_id TYPE M N K N_EXPERT N_USED THREADS REPS [--repack] | \
                 vec-dot TYPE N REPS [--kernel] | op NAME THREADS REPS | \
                 train-op NAME THREADS REPS | bandwidth THREADS | peak THREADS | model tiny|large|FILE.gguf THREADS [N_PROMPT] [N_GEN]"
            );
            std::process::exit(2)
        }
    };
    if let Err(e) = r {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
