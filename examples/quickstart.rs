//! quantgraph quickstart: build a small 2-layer MLP with RMS norm and softmax, plan it for the CPU
//! backend, run it on random inputs, and print a checksum, the time per compute and the backend's
//! features.
//!
//! Run with `cargo run --release --example quickstart`.

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

fn main() -> quantgraph::Result<()> {
    let (d, h, n) = (512usize, 1536usize, 32usize);

    // Weights live in caller-owned buffers shared by any number of graphs: W1 as F16, W2 as F32.
    let w1_f32 = rand_vec(d * h, 1);
    let w1_f16: Vec<half::f16> = w1_f32.iter().map(|&x| half::f16::from_f32(x * 0.05)).collect();
    let w1_buf = Buffer::from_host(bytemuck::cast_slice::<half::f16, u8>(&w1_f16).to_vec());
    let w2: Vec<f32> = rand_vec(h * d, 2).iter().map(|x| x * 0.05).collect();
    let w2_buf = Buffer::from_host(bytemuck::cast_slice::<f32, u8>(&w2).to_vec());

    let mut g = Graph::new();
    let x = g.input(DType::F32, &[d, n])?;
    let w1 = g.weight(DType::F16, &[d, h], &w1_buf, 0)?;
    let w2 = g.weight(DType::F32, &[h, d], &w2_buf, 0)?;
    let t = g.rms_norm(x, 1e-5)?;
    let t = g.mul_mat(w1, t)?; // [h, n]
    let t = g.silu(t)?;
    let t = g.mul_mat(w2, t)?; // [d, n]
    let t = g.add(t, x)?; // residual
    let t = g.rms_norm(t, 1e-5)?;
    let y = g.soft_max_ext(t, None, 0.5, 0.0)?;
    g.set_name(y, "probs")?;
    g.set_output(y);

    let backend = CpuBackend::new()?;
    let mut plan = Plan::new(g, &backend)?;
    let stats = plan.stats();
    plan.set_input(x, &rand_vec(d * n, 3))?;

    plan.compute()?; // warm-up
    let reps = 20;
    let t0 = Instant::now();
    for _ in 0..reps {
        plan.compute()?;
    }
    let per = t0.elapsed().as_secs_f64() / reps as f64;

    let out = plan.output::<f32>(y)?;
    let checksum: f64 =
        out.iter().enumerate().map(|(i, &v)| v as f64 * ((i % 7) as f64 + 1.0)).sum();
    let row_sums: f32 = out[..d].iter().sum();
    let flops = 2.0 * (d * h * n * 2) as f64;

    println!("quantgraph quickstart: 2-layer MLP d={d} hidden={h} batch={n}");
    println!(
        "  nodes: {}, arena: {} KiB (intermediates without reuse: {} KiB), in place: {}",
        stats.n_nodes,
        stats.arena_bytes / 1024,
        stats.intermediate_bytes / 1024,
        stats.n_inplace
    );
    println!("  checksum: {checksum:.6}  (first row sums to {row_sums:.6})");
    println!("  time per compute: {:.3} ms  ({:.2} GFLOPS)", per * 1e3, flops / per / 1e9);
    println!("  threads: {}  isa: {}", backend.n_threads(), backend.isa().name());
    let feats: Vec<String> = backend.features().iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!("  features: {}", feats.join(" "));
    Ok(())
}
