//! `train-op NAME`: the training ops (losses, optimizer steps, backward ops) on typical shapes, in
//! GB/s of tensor traffic.

use crate::measure::median_compute_secs;
use quantgraph::testdata::rand_f32;
use quantgraph::{Buffer, CpuBackend, DType, Graph, Plan};

/// One training op on a typical shape; prints median ms and GB/s of tensor traffic.
pub fn train_op(name: &str, threads: usize, reps: usize) -> quantgraph::Result<()> {
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
                g.pool_2d_back(
                    a,
                    af,
                    quantgraph::Pool2dParams::new(PoolOp::Max, 2, 2).stride(2, 2).padding(0.0, 0.0),
                )?,
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
        g.set_output(out)?;
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
