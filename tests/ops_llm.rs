//! rope and flash attention against plain f64 references (test-backend-ops' limits).

mod common;

use common::nmse;
use quantgraph::testdata::rand_f32;
use quantgraph::{CpuBackend, DType, Graph, Plan, RopeMode, RopeParams, TensorId};

fn compute(
    g: Graph,
    inputs: &[(TensorId, Vec<f32>)],
    ints: &[(TensorId, Vec<i32>)],
    out: TensorId,
    nth: usize,
) -> Vec<f32> {
    let be = CpuBackend::with_threads(nth).unwrap();
    // Guard bytes around every tensor catch any op writing outside its output.
    let mut p = Plan::with_guards(g, &be, 64).unwrap();
    for (id, v) in inputs {
        p.set_input(*id, v).unwrap();
    }
    for (id, v) in ints {
        p.set_input(*id, v).unwrap();
    }
    p.compute().unwrap();
    p.check_guards().unwrap();
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
            g.set_output(y).unwrap();
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
    g.set_output(y).unwrap();
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
    g.set_output(y32).unwrap();
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

struct Attn {
    dk: usize,
    dv: usize,
    n_q: usize,
    n_kv: usize,
    n_head: usize,
    n_head_kv: usize,
    kv_type: DType,
    mask: bool,
    sinks: bool,
    p: quantgraph::FlashAttnParams,
}

/// Builds and runs one flash attention; returns (ours, f64 reference).
fn run_attn(c: &Attn, nth: usize) -> (Vec<f32>, Vec<f64>) {
    use quantgraph::Buffer;
    let q = rand_f32(c.dk * c.n_q * c.n_head, 31);
    let k = rand_f32(c.dk * c.n_kv * c.n_head_kv, 32);
    let v = rand_f32(c.dv * c.n_kv * c.n_head_kv, 33);
    // K/V stored in their type; the reference uses what the type can represent.
    let store = |x: &[f32]| -> (Vec<u8>, Vec<f32>) {
        let mut bytes = vec![0u8; c.kv_type.row_size(x.len()).unwrap()];
        match c.kv_type {
            DType::F32 | DType::F16 | DType::BF16 => {
                quantgraph::quant::quantize_for_dot(c.kv_type, x, &mut bytes).unwrap()
            }
            t => quantgraph::quant::quantize(t, x, &mut bytes).unwrap(),
        }
        let mut back = vec![0f32; x.len()];
        quantgraph::quant::dequantize(c.kv_type, &bytes, &mut back).unwrap();
        (bytes, back)
    };
    let (kb, kd) = store(&k);
    let (vb, vd) = store(&v);
    let kbuf = Buffer::from_host(kb);
    let vbuf = Buffer::from_host(vb);
    let n_q_pad = c.n_q.next_multiple_of(4);
    let mut maskv = vec![0f32; c.n_kv * n_q_pad];
    for i in 0..c.n_q {
        for j in 0..c.n_kv {
            // causal over the last n_q positions, a deterministic extra hole, and for even query
            // rows a fully masked run of 32 positions (whole blocks of the decode kernels)
            let run = i % 2 == 0 && (32..64).contains(&j) && c.n_kv > 96;
            if j > c.n_kv - c.n_q + i || (j * 7 + i) % 11 == 0 || run {
                maskv[i * c.n_kv + j] = f32::NEG_INFINITY;
            } else {
                maskv[i * c.n_kv + j] = ((j % 5) as f32) * -0.25;
            }
        }
    }
    let maskh: Vec<f32> = maskv.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect();
    let sinks: Vec<f32> = (0..c.n_head).map(|h| h as f32 * 0.5 - 0.7).collect();

    let mut g = Graph::new();
    let tq = g.input(DType::F32, &[c.dk, c.n_q, c.n_head]).unwrap();
    let tk = g.weight(c.kv_type, &[c.dk, c.n_kv, c.n_head_kv], &kbuf, 0).unwrap();
    let tv = g.weight(c.kv_type, &[c.dv, c.n_kv, c.n_head_kv], &vbuf, 0).unwrap();
    let tm32 = g.input(DType::F32, &[c.n_kv, n_q_pad]).unwrap();
    let tm = if c.mask { Some(g.cast(tm32, DType::F16).unwrap()) } else { None };
    let ts = if c.sinks { Some(g.input(DType::F32, &[c.n_head]).unwrap()) } else { None };
    let out = g.flash_attn_ext(tq, tk, tv, tm, ts, c.p).unwrap();
    g.set_output(out).unwrap();
    let mut inputs = vec![(tq, q.clone())];
    if c.mask {
        inputs.push((tm32, maskv.clone()));
    }
    if let Some(s) = ts {
        inputs.push((s, sinks.clone()));
    }
    let got = compute(g, &inputs, &[], out, nth);

    let p = c.p;
    let n_head_log2 = 1u32 << (c.n_head as u32).ilog2();
    let mut want = vec![0f64; c.dv * c.n_head * c.n_q];
    for h in 0..c.n_head {
        let hk = h / (c.n_head / c.n_head_kv);
        let slope = if p.max_bias > 0.0 {
            let m0 = 2f64.powf(-(p.max_bias as f64) / n_head_log2 as f64);
            let m1 = 2f64.powf(-(p.max_bias as f64 / 2.0) / n_head_log2 as f64);
            let hh = h as u32;
            if hh < n_head_log2 {
                m0.powi(hh as i32 + 1)
            } else {
                m1.powi(2 * (hh - n_head_log2) as i32 + 1)
            }
        } else {
            1.0
        };
        for i in 0..c.n_q {
            let qrow = &q[(h * c.n_q + i) * c.dk..][..c.dk];
            let mut logits = Vec::new();
            for j in 0..c.n_kv {
                let mv = if c.mask { slope * maskh[i * c.n_kv + j] as f64 } else { 0.0 };
                if mv == f64::NEG_INFINITY {
                    continue;
                }
                let krow = &kd[(hk * c.n_kv + j) * c.dk..][..c.dk];
                let mut s: f64 =
                    qrow.iter().zip(krow).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>()
                        * p.scale as f64;
                if p.logit_softcap != 0.0 {
                    s = p.logit_softcap as f64 * (s / p.logit_softcap as f64).tanh();
                }
                logits.push((j, s + mv));
            }
            let mut mx = logits.iter().map(|x| x.1).fold(f64::NEG_INFINITY, f64::max);
            if c.sinks {
                mx = mx.max(sinks[h] as f64);
            }
            let mut den: f64 = logits.iter().map(|x| (x.1 - mx).exp()).sum();
            if c.sinks {
                den += (sinks[h] as f64 - mx).exp();
            }
            for dd in 0..c.dv {
                let num: f64 = logits
                    .iter()
                    .map(|&(j, l)| (l - mx).exp() * vd[(hk * c.n_kv + j) * c.dv + dd] as f64)
                    .sum();
                want[(i * c.n_head + h) * c.dv + dd] = num / den;
            }
        }
    }
    (got, want)
}

#[test]
fn flash_attn_ext_prefill_f16_gqa_causal_mask() {
    let c = Attn {
        dk: 64,
        dv: 64,
        n_q: 7,
        n_kv: 37,
        n_head: 4,
        n_head_kv: 2,
        kv_type: DType::F16,
        mask: true,
        sinks: false,
        p: quantgraph::FlashAttnParams::new(0.125),
    };
    let (got, want) = run_attn(&c, 2);
    let e = nmse(&got, &want);
    assert!(e < 5e-4, "nmse {e}");
}

#[test]
fn flash_attn_ext_every_kv_type() {
    for kv_type in common::KV_TYPES {
        let c = Attn {
            dk: 64,
            dv: 32,
            n_q: 9,
            n_kv: 20,
            n_head: 2,
            n_head_kv: 1,
            kv_type,
            mask: true,
            sinks: false,
            p: quantgraph::FlashAttnParams::new(0.2),
        };
        let (got, want) = run_attn(&c, 2);
        let e = nmse(&got, &want);
        assert!(e < 5e-4, "{kv_type}: nmse {e}");
    }
}

#[test]
fn flash_attn_ext_k_quant_iq_and_fp4_kv() {
    // K through its dot product with Q8_K / Q8_0 queries, V through its row dequantizer.
    for kv_type in [
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::Q8_0,
        DType::IQ4_XS,
        DType::IQ3_S,
        DType::MXFP4,
    ] {
        let c = Attn {
            dk: 256,
            dv: 256,
            n_q: 3,
            n_kv: 19,
            n_head: 2,
            n_head_kv: 1,
            kv_type,
            mask: true,
            sinks: false,
            p: quantgraph::FlashAttnParams::new(0.0625),
        };
        let (got, want) = run_attn(&c, 1);
        let e = nmse(&got, &want);
        assert!(e < 5e-4, "{kv_type}: nmse {e}");
        let (got3, _) = run_attn(&c, 3);
        assert_eq!(got, got3, "{kv_type}: 1 and 3 threads differ");
    }
    // Mixed K / V types and head sizes.
    let mut g = Graph::new();
    let q = g.input(DType::F32, &[64, 2, 2]).unwrap();
    let k = g.input(DType::F16, &[64, 4, 1]).unwrap();
    let v = g.input(DType::Q4_K, &[256, 4, 1]).unwrap();
    assert!(g.flash_attn_ext(q, k, v, None, None, quantgraph::FlashAttnParams::new(1.0)).is_ok());
    let k = g.input(DType::Q4_K, &[256, 4, 1]).unwrap();
    let q = g.input(DType::F32, &[256, 2, 2]).unwrap();
    let v = g.input(DType::F32, &[48, 4, 1]).unwrap();
    assert!(g.flash_attn_ext(q, k, v, None, None, quantgraph::FlashAttnParams::new(1.0)).is_ok());
}

#[test]
fn flash_attn_ext_decode_split_kv_with_sinks_alibi_softcap_is_thread_invariant() {
    let c = Attn {
        dk: 128,
        dv: 128,
        n_q: 1,
        n_kv: 700,
        n_head: 4,
        n_head_kv: 4,
        kv_type: DType::F16,
        mask: true,
        sinks: true,
        p: quantgraph::FlashAttnParams { scale: 0.09, max_bias: 8.0, logit_softcap: 20.0 },
    };
    let (g1, want) = run_attn(&c, 1);
    let e = nmse(&g1, &want);
    assert!(e < 5e-4, "nmse {e}");
    for nth in [2, 3] {
        assert_eq!(run_attn(&c, nth).0, g1, "{nth} threads");
    }
    // F16 decode with dk != dv (192 / 144: a 128-float accumulator chunk, then 16), GQA, a
    // KV length that is no multiple of 16, three queries (split KV), masked blocks.
    let c3 = Attn {
        dk: 192,
        dv: 144,
        n_q: 3,
        n_kv: 333,
        n_head: 4,
        n_head_kv: 2,
        kv_type: DType::F16,
        mask: true,
        sinks: false,
        p: quantgraph::FlashAttnParams::new(0.07),
    };
    let (g1, want) = run_attn(&c3, 1);
    let e = nmse(&g1, &want);
    assert!(e < 5e-4, "dk 192 dv 144: nmse {e}");
    assert_eq!(run_attn(&c3, 3).0, g1, "dk 192 dv 144: 3 threads");
    // No mask, head size 40 (not a power of two).
    let c2 = Attn {
        dk: 40,
        dv: 40,
        n_q: 2,
        n_kv: 300,
        n_head: 2,
        n_head_kv: 1,
        kv_type: DType::F32,
        mask: false,
        sinks: false,
        p: quantgraph::FlashAttnParams::new(0.3),
    };
    let (got, want) = run_attn(&c2, 2);
    assert!(nmse(&got, &want) < 5e-4);
}

/// Eight or more queries per head with F32/F16/BF16 K/V take the tiled path (S and O through the
/// float GEMM kernel, KV blocks of 96, query blocks of 96; K/V packed per task, or once per head
/// in a first phase from 97 queries): tails of both, head sizes that are not multiples of 16,
/// dk != dv, GQA, sinks, ALiBi, softcap, no mask, and 1/2/3 threads bitwise.
#[test]
fn flash_attn_ext_tiled_prefill_matches_reference_and_is_thread_invariant() {
    let mut cases = Vec::new();
    for (i, kv_type) in [DType::F16, DType::F32, DType::BF16].into_iter().enumerate() {
        cases.push(Attn {
            dk: 64,
            dv: 40,
            n_q: 49,
            n_kv: 200,
            n_head: 4,
            n_head_kv: 2,
            kv_type,
            mask: true,
            sinks: i == 0,
            p: quantgraph::FlashAttnParams { scale: 0.125, max_bias: 0.0, logit_softcap: 0.0 },
        });
    }
    cases.push(Attn {
        dk: 40,
        dv: 72,
        n_q: 8,
        n_kv: 97,
        n_head: 2,
        n_head_kv: 1,
        kv_type: DType::F16,
        mask: true,
        sinks: true,
        p: quantgraph::FlashAttnParams { scale: 0.09, max_bias: 8.0, logit_softcap: 20.0 },
    });
    cases.push(Attn {
        dk: 128,
        dv: 128,
        n_q: 100,
        n_kv: 100,
        n_head: 2,
        n_head_kv: 2,
        kv_type: DType::F16,
        mask: false,
        sinks: false,
        p: quantgraph::FlashAttnParams::new(0.088),
    });
    cases.push(Attn {
        dk: 64,
        dv: 40,
        n_q: 200,
        n_kv: 203,
        n_head: 4,
        n_head_kv: 2,
        kv_type: DType::BF16,
        mask: true,
        sinks: true,
        p: quantgraph::FlashAttnParams { scale: 0.125, max_bias: 2.0, logit_softcap: 0.0 },
    });
    for c in &cases {
        let (g1, want) = run_attn(c, 1);
        let e = nmse(&g1, &want);
        assert!(e < 5e-4, "{} dk {} n_q {}: nmse {e}", c.kv_type, c.dk, c.n_q);
        for nth in [2, 3] {
            assert_eq!(run_attn(c, nth).0, g1, "{} {nth} threads", c.kv_type);
        }
    }
}

#[test]
fn flash_attn_ext_rejects_bad_shapes() {
    let mut g = Graph::new();
    let q = g.input(DType::F32, &[64, 3, 4]).unwrap();
    let k = g.input(DType::F16, &[64, 10, 2]).unwrap();
    let v = g.input(DType::F16, &[64, 10, 2]).unwrap();
    let k_bad = g.input(DType::F16, &[32, 10, 2]).unwrap();
    let k_heads = g.input(DType::F16, &[64, 10, 3]).unwrap();
    let m_small = g.input(DType::F16, &[8, 3]).unwrap();
    let m_ok = g.input(DType::F16, &[10, 4]).unwrap();
    let p = quantgraph::FlashAttnParams::new(0.1);
    assert!(g.flash_attn_ext(q, k_bad, v, None, None, p).is_err(), "head sizes differ");
    assert!(
        g.flash_attn_ext(q, k_heads, v, None, None, p).is_err(),
        "kv heads must divide q heads"
    );
    assert!(g.flash_attn_ext(q, k, v, Some(m_small), None, p).is_err(), "mask too small");
    let alibi = quantgraph::FlashAttnParams { max_bias: 1.0, ..p };
    assert!(g.flash_attn_ext(q, k, v, None, None, alibi).is_err(), "alibi needs a mask");
    let r = g.flash_attn_ext(q, k, v, Some(m_ok), None, p).unwrap();
    assert_eq!(g.shape(r).unwrap(), [64, 4, 3, 1]);
}

#[test]
fn soft_max_ext_with_sinks() {
    let ne = [6usize, 3, 4, 1];
    let mut g = Graph::new();
    let a = g.input(DType::F32, &ne).unwrap();
    let s = g.input(DType::F32, &[4]).unwrap();
    let y = g.soft_max_ext_sinks(a, None, s, 0.5, 0.0).unwrap();
    g.set_output(y).unwrap();
    let x = rand_f32(72, 71);
    let sv = vec![-1.0f32, 0.0, 2.0, 10.0];
    let got = compute(g, &[(a, x.clone()), (s, sv.clone())], &[], y, 2);
    let mut want = Vec::new();
    for row in 0..12 {
        let h = row / 3;
        let v: Vec<f64> = x[row * 6..row * 6 + 6].iter().map(|&t| t as f64 * 0.5).collect();
        let mx = v.iter().cloned().fold(sv[h] as f64, f64::max);
        let den: f64 = v.iter().map(|t| (t - mx).exp()).sum::<f64>() + (sv[h] as f64 - mx).exp();
        want.extend(v.iter().map(|t| (t - mx).exp() / den));
    }
    assert!(nmse(&got, &want) < 1e-6);
    let mut g = Graph::new();
    let a = g.input(DType::F32, &ne).unwrap();
    let bad = g.input(DType::F32, &[3]).unwrap();
    assert!(g.soft_max_ext_sinks(a, None, bad, 1.0, 0.0).is_err());
}

#[test]
fn rope_odd_head_size_with_partial_rotation() {
    let ne = [33usize, 2, 3, 1];
    for mode in [RopeMode::Normal, RopeMode::Neox] {
        let p = RopeParams::new(16, mode, 10000.0);
        let mut g = Graph::new();
        let a = g.input(DType::F32, &ne).unwrap();
        let pos = g.input(DType::I32, &[3]).unwrap();
        let y = g.rope_ext(a, pos, None, p).unwrap();
        g.set_output(y).unwrap();
        let x = rand_f32(ne.iter().product(), 24);
        let got = compute(g, &[(a, x.clone())], &[(pos, vec![2, 9, 4])], y, 2);
        let mut want = rope_ref(&x, ne, &[2, 9, 4], None, &p);
        // Dims past n_dims pass through unchanged.
        for (k, w) in want.iter_mut().enumerate() {
            if k % 33 >= 16 {
                *w = x[k] as f64;
            }
        }
        assert!(nmse(&got, &want) < 1e-7, "{mode:?}");
    }
}

#[test]
fn rope_with_an_offset_rotates_the_dims_after_it() {
    // Rows of 34 with 16 rotated dims starting at 6: the rotated part equals rope on those 16
    // dims alone (same angles, same arithmetic: bitwise), the other dims pass through.
    let (ne0, n_dims, offs) = (34usize, 16usize, 6usize);
    let ne = [ne0, 2, 3, 1];
    let posv = vec![5, 0, 17];
    for mode in [RopeMode::Normal, RopeMode::Neox] {
        for back in [false, true] {
            let mut p = RopeParams::new(n_dims, mode, 10000.0);
            p.n_ctx_orig = 64;
            p.ext_factor = 0.5;
            p.freq_scale = 0.5;
            let x = rand_f32(ne.iter().product(), 31);
            let (mut outs, mut refs) = (Vec::new(), Vec::new());
            for nth in [1, 2, 3] {
                let mut g = Graph::new();
                let a = g.input(DType::F32, &ne).unwrap();
                let pos = g.input(DType::I32, &[3]).unwrap();
                let y = if back {
                    let y = g.rope_ext_back(a, pos, None, p).unwrap();
                    g.rope_set_offset(y, offs).unwrap();
                    y
                } else {
                    g.rope_ext(a, pos, None, RopeParams { n_offs: offs, ..p }).unwrap()
                };
                g.set_output(y).unwrap();
                outs.push(compute(g, &[(a, x.clone())], &[(pos, posv.clone())], y, nth));
                // The reference: the rotated dims as rows of their own.
                let mut g = Graph::new();
                let part = g.input(DType::F32, &[n_dims, 2, 3, 1]).unwrap();
                let pos = g.input(DType::I32, &[3]).unwrap();
                let y = if back {
                    g.rope_ext_back(part, pos, None, p).unwrap()
                } else {
                    g.rope_ext(part, pos, None, p).unwrap()
                };
                g.set_output(y).unwrap();
                let xs: Vec<f32> =
                    x.chunks(ne0).flat_map(|r| r[offs..offs + n_dims].to_vec()).collect();
                refs.push(compute(g, &[(part, xs)], &[(pos, posv.clone())], y, nth));
            }
            for (got, want) in outs.iter().zip(&refs) {
                for (r, row) in got.chunks(ne0).enumerate() {
                    let xr = &x[r * ne0..(r + 1) * ne0];
                    assert_eq!(&row[..offs], &xr[..offs], "{mode:?} back={back}: head dims");
                    assert_eq!(&row[offs + n_dims..], &xr[offs + n_dims..], "{mode:?}: tail dims");
                    assert_eq!(
                        &row[offs..offs + n_dims],
                        &want[r * n_dims..(r + 1) * n_dims],
                        "{mode:?} back={back}: rotated dims"
                    );
                }
            }
            assert!(outs.windows(2).all(|w| w[0] == w[1]), "thread counts differ");
        }
    }
    let mut g = Graph::new();
    let a = g.input(DType::F32, &[34, 1, 2]).unwrap();
    let pos = g.input(DType::I32, &[2]).unwrap();
    let y = g.rope_ext(a, pos, None, RopeParams::new(16, RopeMode::Neox, 1e4)).unwrap();
    assert!(g.rope_set_offset(y, 3).is_err(), "odd offset");
    assert!(g.rope_set_offset(y, 20).is_err(), "past the row");
    assert!(g.rope_set_offset(y, 18).is_ok());
    assert!(g.rope_set_offset(a, 2).is_err(), "not a rope node");
    let bad = RopeParams { n_offs: 20, ..RopeParams::new(16, RopeMode::Normal, 1e4) };
    assert!(g.rope_ext(a, pos, None, bad).is_err());
}
