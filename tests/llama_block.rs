//! A whole llama-style transformer block built from quantgraph ops (rms_norm, mul_mat, rope neox,
//! flash_attn_ext with a causal mask, SwiGLU, residual adds) checked against an f64 reference, and
//! bitwise identical for 1, 2 and 3 threads.

mod common;

use common::nmse;
use quantgraph::testdata::rand_f32;
use quantgraph::{
    Buffer, CpuBackend, DType, FlashAttnParams, Graph, Plan, RopeMode, RopeParams, TensorId,
};

const D: usize = 64; // model width
const H: usize = 4; // heads
const HKV: usize = 2; // kv heads (GQA)
const HD: usize = D / H; // head size 16
const FF: usize = 96; // ffn width
const T: usize = 7; // tokens
const EPS: f32 = 1e-5;

struct Weights {
    attn_norm: Vec<f32>,
    wq: Vec<f32>,
    wk: Vec<f32>,
    wv: Vec<f32>,
    wo: Vec<f32>,
    ffn_norm: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
}

fn weights() -> Weights {
    let s = |n: usize, seed: u64, scale: f32| {
        rand_f32(n, seed).iter().map(|v| v * scale).collect::<Vec<_>>()
    };
    Weights {
        attn_norm: rand_f32(D, 1).iter().map(|v| 1.0 + 0.2 * v).collect(),
        wq: s(D * D, 2, 0.2),
        wk: s(D * HKV * HD, 3, 0.2),
        wv: s(D * HKV * HD, 4, 0.2),
        wo: s(D * D, 5, 0.2),
        ffn_norm: rand_f32(D, 6).iter().map(|v| 1.0 + 0.2 * v).collect(),
        gate: s(D * FF, 7, 0.2),
        up: s(D * FF, 8, 0.2),
        down: s(FF * D, 9, 0.2),
    }
}

fn weight(g: &mut Graph, v: &[f32], ne: &[usize], ty: DType) -> TensorId {
    let mut bytes = vec![0u8; ty.row_size(v.len()).unwrap()];
    match ty {
        DType::F32 | DType::F16 => quantgraph::quant::quantize_for_dot(ty, v, &mut bytes).unwrap(),
        _ => quantgraph::quant::quantize(ty, v, &mut bytes).unwrap(),
    }
    let buf = Buffer::from_host(bytes);
    g.weight(ty, ne, &buf, 0).unwrap()
}

fn dq(v: &[f32], ty: DType) -> Vec<f32> {
    let mut bytes = vec![0u8; ty.row_size(v.len()).unwrap()];
    match ty {
        DType::F32 | DType::F16 => quantgraph::quant::quantize_for_dot(ty, v, &mut bytes).unwrap(),
        _ => quantgraph::quant::quantize(ty, v, &mut bytes).unwrap(),
    }
    let mut out = vec![0f32; v.len()];
    quantgraph::quant::dequantize(ty, &bytes, &mut out).unwrap();
    out
}

/// Builds the block; returns (graph, x input, positions, mask, output).
fn build(w: &Weights, wt: DType) -> (Graph, TensorId, TensorId, TensorId, TensorId) {
    let mut g = Graph::new();
    let x = g.input(DType::F32, &[D, T]).unwrap();
    let pos = g.input(DType::I32, &[T]).unwrap();
    let mask32 = g.input(DType::F32, &[T, T.next_multiple_of(4)]).unwrap();
    let mask = g.cast(mask32, DType::F16).unwrap();
    let an = g.input(DType::F32, &[D]).unwrap();
    let fnorm = g.input(DType::F32, &[D]).unwrap();
    let wq = weight(&mut g, &w.wq, &[D, D], wt);
    let wk = weight(&mut g, &w.wk, &[D, HKV * HD], wt);
    let wv = weight(&mut g, &w.wv, &[D, HKV * HD], wt);
    let wo = weight(&mut g, &w.wo, &[D, D], wt);
    let wg = weight(&mut g, &w.gate, &[D, FF], wt);
    let wu = weight(&mut g, &w.up, &[D, FF], wt);
    let wd = weight(&mut g, &w.down, &[FF, D], wt);

    let h = g.rms_norm_mul(x, an, EPS).unwrap();
    let q = g.mul_mat(wq, h).unwrap();
    let k = g.mul_mat(wk, h).unwrap();
    let v = g.mul_mat(wv, h).unwrap();
    let q = g.reshape(q, &[HD, H, T]).unwrap();
    let k = g.reshape(k, &[HD, HKV, T]).unwrap();
    let v = g.reshape(v, &[HD, HKV, T]).unwrap();
    let rp = RopeParams::new(HD, RopeMode::Neox, 10000.0);
    let q = g.rope_ext(q, pos, None, rp).unwrap();
    let k = g.rope_ext(k, pos, None, rp).unwrap();
    // [hd, heads, tokens] -> [hd, tokens, heads] for attention; K/V stored as F16 like a cache.
    let q = g.permute(q, [0, 2, 1, 3]).unwrap();
    let k = g.permute(k, [0, 2, 1, 3]).unwrap();
    let v = g.permute(v, [0, 2, 1, 3]).unwrap();
    let k = g.cast(k, DType::F16).unwrap();
    let v = g.cast(v, DType::F16).unwrap();
    let q = g.cont(q).unwrap();
    let att = g
        .flash_attn_ext(q, k, v, Some(mask), None, FlashAttnParams::new(1.0 / (HD as f32).sqrt()))
        .unwrap();
    let att = g.reshape(att, &[D, T]).unwrap();
    let o = g.mul_mat(wo, att).unwrap();
    let x1 = g.add(o, x).unwrap();
    let h2 = g.rms_norm(x1, EPS).unwrap();
    let h2 = g.mul(h2, fnorm).unwrap();
    let gt = g.mul_mat(wg, h2).unwrap();
    let up = g.mul_mat(wu, h2).unwrap();
    let ff = g.swiglu(gt, Some(up)).unwrap();
    let dn = g.mul_mat(wd, ff).unwrap();
    let out = g.add(dn, x1).unwrap();
    g.set_output(out).unwrap();
    // The norm weights ride along as inputs.
    g.set_name(an, "attn_norm").unwrap();
    g.set_name(fnorm, "ffn_norm").unwrap();
    (g, x, pos, mask32, out)
}

fn matvec(w: &[f64], rows: usize, cols: usize, x: &[f64]) -> Vec<f64> {
    (0..rows).map(|r| (0..cols).map(|c| w[r * cols + c] * x[c]).sum()).collect()
}

fn reference(w: &Weights, wt: DType, x: &[f32]) -> Vec<f64> {
    let f = |v: &[f32]| dq(v, wt).iter().map(|&t| t as f64).collect::<Vec<f64>>();
    let (wq, wk, wv, wo, wg, wu, wd) =
        (f(&w.wq), f(&w.wk), f(&w.wv), f(&w.wo), f(&w.gate), f(&w.up), f(&w.down));
    let rms = |v: &[f64], gw: &[f32]| {
        let ms = v.iter().map(|t| t * t).sum::<f64>() / v.len() as f64;
        v.iter().zip(gw).map(|(t, g)| t / (ms + EPS as f64).sqrt() * *g as f64).collect::<Vec<_>>()
    };
    let rope = |v: &mut [f64], p: usize| {
        for i in 0..HD / 2 {
            let th = p as f64 * 10000f64.powf(-2.0 * i as f64 / HD as f64);
            let (a, b) = (v[i], v[i + HD / 2]);
            v[i] = a * th.cos() - b * th.sin();
            v[i + HD / 2] = a * th.sin() + b * th.cos();
        }
    };
    let xs: Vec<Vec<f64>> =
        (0..T).map(|t| x[t * D..(t + 1) * D].iter().map(|&v| v as f64).collect()).collect();
    let mut qs = Vec::new();
    let mut ks = Vec::new();
    let mut vs = Vec::new();
    for (t, xt) in xs.iter().enumerate() {
        let h = rms(xt, &w.attn_norm);
        let mut q = matvec(&wq, D, D, &h);
        let mut k = matvec(&wk, HKV * HD, D, &h);
        let v = matvec(&wv, HKV * HD, D, &h);
        for hh in 0..H {
            rope(&mut q[hh * HD..(hh + 1) * HD], t);
        }
        for hh in 0..HKV {
            rope(&mut k[hh * HD..(hh + 1) * HD], t);
        }
        qs.push(q);
        ks.push(k);
        vs.push(v);
    }
    let mut out = Vec::new();
    for t in 0..T {
        let mut att = vec![0f64; D];
        for hh in 0..H {
            let kh = hh / (H / HKV);
            let q = &qs[t][hh * HD..(hh + 1) * HD];
            let logits: Vec<f64> = (0..=t)
                .map(|j| {
                    q.iter().zip(&ks[j][kh * HD..(kh + 1) * HD]).map(|(a, b)| a * b).sum::<f64>()
                        / (HD as f64).sqrt()
                })
                .collect();
            let mx = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let den: f64 = logits.iter().map(|l| (l - mx).exp()).sum();
            for d in 0..HD {
                att[hh * HD + d] =
                    (0..=t).map(|j| (logits[j] - mx).exp() * vs[j][kh * HD + d]).sum::<f64>() / den;
            }
        }
        let o = matvec(&wo, D, D, &att);
        let x1: Vec<f64> = o.iter().zip(&xs[t]).map(|(a, b)| a + b).collect();
        let h2 = rms(&x1, &w.ffn_norm);
        let gt = matvec(&wg, FF, D, &h2);
        let up = matvec(&wu, FF, D, &h2);
        let ff: Vec<f64> = gt.iter().zip(&up).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
        let dn = matvec(&wd, D, FF, &ff);
        out.extend(dn.iter().zip(&x1).map(|(a, b)| a + b));
    }
    out
}

fn run(w: &Weights, wt: DType, x: &[f32], nth: usize) -> Vec<f32> {
    let (g, xi, pos, mask, out) = build(w, wt);
    let an = g.find("attn_norm").unwrap();
    let fnorm = g.find("ffn_norm").unwrap();
    let mut p = Plan::new(g, &CpuBackend::with_threads(nth).unwrap()).unwrap();
    p.set_input(xi, x).unwrap();
    p.set_input(pos, &(0..T as i32).collect::<Vec<_>>()).unwrap();
    let mp = T.next_multiple_of(4);
    let m: Vec<f32> =
        (0..T * mp).map(|k| if k % T > k / T { f32::NEG_INFINITY } else { 0.0 }).collect();
    p.set_input(mask, &m).unwrap();
    p.set_input(an, &w.attn_norm).unwrap();
    p.set_input(fnorm, &w.ffn_norm).unwrap();
    p.compute().unwrap();
    p.output::<f32>(out).unwrap().to_vec()
}

#[test]
fn llama_block_matches_f64_reference_and_is_thread_invariant() {
    let w = weights();
    let x = rand_f32(D * T, 10);
    for wt in [DType::F32, DType::F16, DType::Q8_0, DType::Q4_0] {
        let got = run(&w, wt, &x, 1);
        let want = reference(&w, wt, &x);
        let e = nmse(&got, &want);
        assert!(e < 2e-3, "{wt}: nmse {e}");
        for nth in [2, 3] {
            assert_eq!(run(&w, wt, &x, nth), got, "{wt}: {nth} threads");
        }
    }
}
