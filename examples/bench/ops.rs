//! `op NAME`: single ops on model shapes (elementwise, norms, softmax, rope, attention, get_rows,
//! copies, the recurrent ops and the vision ops), in GB/s of tensor traffic or GFLOPS.

use crate::measure::{digest, median_and_best_compute_secs, median_compute_secs};
use crate::peaks::bandwidth;
use quantgraph::testdata::{rand_f32, uniform};
use quantgraph::{Buffer, CpuBackend, DType, Graph, Plan};

/// One op on a llama-sized shape (mostly 512 tokens of 4096, attention with 32 heads of 128);
/// prints median and best ms, GB/s of tensor traffic, the machine's copy bandwidth beside it and
/// the output digest. The recurrent ops go to [`recurrent_op`].
pub fn op(name: &str, threads: usize, reps: usize) -> quantgraph::Result<()> {
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
        // The sum written over `a`, as a graph allocator that reuses a dead operand's memory
        // runs a residual add.
        "add_inplace" => {
            let a = input(&mut g, &[4096, 512])?;
            let b = input(&mut g, &[4096, 512])?;
            (g.add_inplace(a, b)?, 3 * 4096 * 512 * 4)
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
        "cont_permuted" => {
            // Attention's [head_dim, heads, tokens] to [head_dim, tokens, heads].
            let a = input(&mut g, &[128, 32, 512])?;
            let p = g.permute(a, [0, 2, 1, 3])?;
            (g.cont(p)?, 2 * 128 * 32 * 512 * 4)
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
    g.set_output(out)?;
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
    g.set_output(out)?;
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

/// Vision ops: conv_2d (3x3, 64->64 channels, 64x64 image, batch 1, stride 1, pad 1;
/// `conv_2d_f16` with an F16 kernel), im2col of the same shapes (F32 and `im2col_f16` results)
/// and a 2x2 max pool_2d (stride 2) over 64 channels of 128x128. Prints GFLOPS for the
/// convolutions and GB/s of tensor traffic for the memory-bound ones.
pub fn vision_op(name: &str, threads: usize, reps: usize) -> quantgraph::Result<()> {
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
            (
                g.pool_2d(
                    x,
                    quantgraph::Pool2dParams::new(PoolOp::Max, 2, 2).stride(2, 2).padding(0.0, 0.0),
                )?,
                0.0,
                128 * 128 * 64 * 4 * 5 / 4,
            )
        }
        _ => return Err(quantgraph::Error::InvalidArgument(format!("unknown op bench {name}"))),
    };
    g.set_output(out)?;
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
