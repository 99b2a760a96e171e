//! rope and flash attention against plain f64 references (test-backend-ops' limits).

mod common;

use common::{nmse, rand_f32};
use quantgraph::{CpuBackend, DType, Graph, Plan, RopeMode, RopeParams, TensorId};

fn compute(
    g: Graph,
    inputs: &[(TensorId, Vec<f32>)],
    ints: &[(TensorId, Vec<i32>)],
    out: TensorId,
    nth: usize,
) -> Vec<f32> {
    let be = CpuBackend::with_threads(nth).unwrap();
    let mut p = Plan::new(g, &be).unwrap();
    for (id, v) in inputs {
        p.set_input(*id, v).unwrap();
    }
    for (id, v) in ints {
        p.set_input(*id, v).unwrap();
    }
    p.compute().unwrap();
    p.output::<f32>(out).unwrap().to_vec()
}

/// f64 rope reference straight from the definition (theta_i = p * base^(-2i/n_dims) / ff_i, YaRN).
#[allow(clippy::too_many_arguments)]
fn rope_ref(
    x: &[f32],
    ne: [usize; 4],
    pos: &[i32],
    ff: Option<&[f32]>,
    p: &RopeParams,
) -> Vec<f64> {
    let n_dims = p.n_dims;
    let corr = |n_rot: f64| {
        n_dims as f64 * (p.n_ctx_orig as f64 / (n_rot * 2.0 * std::f64::consts::PI)).ln()
            / (2.0 * (p.freq_base as f64).ln())
    };
    let lo = corr(p.beta_fast as f64).floor().max(0.0);
    let hi = corr(p.beta_slow as f64).ceil().min(n_dims as f64 - 1.0);
    let mut out = vec![0f64; x.len()];
    let n2 = ne[2];
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            for i1 in 0..ne[1] {
                let base = ((i3 * ne[2] + i2) * ne[1] + i1) * ne[0];
                let row: Vec<f64> = x[base..base + ne[0]].iter().map(|&v| v as f64).collect();
                let mut y = row.clone();
                let cs = |i0: usize| {
                    let i = (i0 / 2) as f64;
                    let pp = if p.mode.is_multi() {
                        // sections: which position id this pair uses
                        let s = p.sections;
                        let sect = (s[0] + s[1] + s[2] + s[3]) as usize;
                        let sector = (i0 / 2) % sect;
                        let which = if sector < s[0] as usize {
                            0
                        } else if sector < (s[0] + s[1]) as usize {
                            1
                        } else if sector < (s[0] + s[1] + s[2]) as usize {
                            2
                        } else {
                            3
                        };
                        pos[i2 + which * n2]
                    } else {
                        pos[i2]
                    } as f64;
                    let f = ff.map_or(1.0, |f| f[i0 / 2] as f64);
                    let extrap = pp * (p.freq_base as f64).powf(-2.0 * i / n_dims as f64) / f;
                    let interp = p.freq_scale as f64 * extrap;
                    let mut theta = interp;
                    let mut m = p.attn_factor as f64;
                    if p.ext_factor != 0.0 {
                        let yv = (i - lo) / (hi - lo).max(0.001);
                        let mix = (1.0 - yv.clamp(0.0, 1.0)) * p.ext_factor as f64;
                        theta = interp * (1.0 - mix) + extrap * mix;
                        m *= 1.0 + 0.1 * (1.0 / p.freq_scale as f64).ln();
                    }
                    (theta.cos() * m, theta.sin() * m)
                };
                let (off, step) = match p.mode {
                    RopeMode::Normal => (1, 1),
                    _ => (n_dims / 2, 2),
                };
                for i0 in (0..n_dims).step_by(2) {
                    let ic = i0 / step;
                    let (c, s) = cs(i0);
                    y[ic] = row[ic] * c - row[ic + off] * s;
                    y[ic + off] = row[ic] * s + row[ic + off] * c;
                }
                out[base..base + ne[0]].copy_from_slice(&y);
            }
        }
    }
    out
}

#[test]
fn rope_normal_and_neox_with_yarn_and_freq_factors() {
    let ne = [64usize, 3, 5, 2];
    for mode in [RopeMode::Normal, RopeMode::Neox] {
        for (n_dims, yarn, with_ff) in
            [(64usize, false, false), (32, true, false), (48, false, true)]
        {
            let mut p = RopeParams::new(n_dims, mode, 10000.0);
            if yarn {
                p.freq_scale = 0.25;
                p.ext_factor = 1.0;
                p.attn_factor = 1.0;
                p.n_ctx_orig = 4096;
                p.beta_fast = 32.0;
                p.beta_slow = 1.0;
            }
            let mut g = Graph::new();
            let a = g.input(DType::F32, &ne).unwrap();
            let pos = g.input(DType::I32, &[ne[2]]).unwrap();
            let ff = if with_ff { Some(g.input(DType::F32, &[n_dims / 2]).unwrap()) } else { None };
            let y = g.rope_ext(a, pos, ff, p).unwrap();
            g.set_output(y);
            let x = rand_f32(ne.iter().product(), 21);
            let pv: Vec<i32> = vec![0, 3, 7, 11, 17];
            let ffv: Vec<f32> = (0..n_dims / 2).map(|i| 1.0 + i as f32 * 0.1).collect();
            let mut inputs = vec![(a, x.clone())];
            if let Some(f) = ff {
                inputs.push((f, ffv.clone()));
            }
            let got = compute(g, &inputs, &[(pos, pv.clone())], y, 2);
            let want = rope_ref(&x, ne, &pv, if with_ff { Some(&ffv) } else { None }, &p);
            let e = nmse(&got, &want);
            assert!(e < 1e-7, "{mode:?} n_dims {n_dims} yarn {yarn} ff {with_ff}: nmse {e}");
        }
    }
}

#[test]
fn rope_multi_mrope_and_f16() {
    let ne = [32usize, 2, 4, 1];
    let mut p = RopeParams::new(32, RopeMode::Mrope, 10000.0);
    p.sections = [8, 4, 4, 0];
    let mut g = Graph::new();
    let a = g.input(DType::F32, &ne).unwrap();
    let pos = g.input(DType::I32, &[4 * ne[2]]).unwrap();
    let y = g.rope_multi(a, pos, None, p.sections, p).unwrap();
    g.set_output(y);
    let x = rand_f32(ne.iter().product(), 22);
    let pv: Vec<i32> = (0..16).map(|i| (i * 3) % 13).collect();
    let got = compute(g, &[(a, x.clone())], &[(pos, pv.clone())], y, 3);
    let want = rope_ref(&x, ne, &pv, None, &p);
    assert!(nmse(&got, &want) < 1e-7);

    // F16 in and out: compare with the f64 reference within f16 rounding.
    let mut g = Graph::new();
    let a32 = g.input(DType::F32, &[64, 4, 3]).unwrap();
    let a16 = g.cast(a32, DType::F16).unwrap();
    let pos = g.input(DType::I32, &[3]).unwrap();
    let p = RopeParams::new(64, RopeMode::Neox, 500000.0);
    let y = g.rope_ext(a16, pos, None, p).unwrap();
    let y32 = g.cast(y, DType::F32).unwrap();
    g.set_output(y32);
    let x = rand_f32(64 * 12, 23);
    let xh: Vec<f32> = x.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect();
    let got = compute(g, &[(a32, x)], &[(pos, vec![1, 5, 9])], y32, 2);
    let want = rope_ref(&xh, [64, 4, 3, 1], &[1, 5, 9], None, &p);
    assert!(nmse(&got, &want) < 1e-6);
}

#[test]
fn rope_rejects_bad_parameters() {
    let mut g = Graph::new();
    let a = g.input(DType::F32, &[64, 2, 5]).unwrap();
    let pos = g.input(DType::I32, &[5]).unwrap();
    let bad_pos = g.input(DType::I32, &[4]).unwrap();
    assert!(
        g.rope_ext(a, pos, None, RopeParams::new(65, RopeMode::Normal, 1e4)).is_err(),
        "odd n_dims"
    );
    assert!(
        g.rope_ext(a, pos, None, RopeParams::new(128, RopeMode::Normal, 1e4)).is_err(),
        "n_dims > head size"
    );
    assert!(
        g.rope_ext(a, bad_pos, None, RopeParams::new(64, RopeMode::Neox, 1e4)).is_err(),
        "positions length"
    );
    assert!(RopeMode::from_ggml(1).is_none() && RopeMode::from_ggml(3).is_none(), "unknown mode");
    assert!(
        g.rope_ext(a, pos, None, RopeParams::new(64, RopeMode::Mrope, 1e4)).is_err(),
        "mrope needs 4 ids per token"
    );
    let e = g.rope_ext(a, pos, None, RopeParams::new(64, RopeMode::Neox, -1.0)).unwrap_err();
    assert!(e.to_string().contains("rope"), "{e}");
}
