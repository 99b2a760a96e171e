//! The LLM ops' contiguous fast paths on every kernel tier this CPU has, in one run: fused SwiGLU,
//! F32 GELU (f16 table, gathered on AVX2), neox rope rotation (also at an offset), F32 -> Q8_0 copy and the tiled
//! flash attention (vector score scaling/masking and row max). Each is bitwise identical for 1,
//! 2 and 3 threads on each tier; across tiers GELU, rope and the Q8_0 bytes are bitwise equal and
//! SwiGLU and attention (vector exp, FMA GEMM on AVX2, the AVX-512 F16 decode loop) agree to
//! rounding. Sizes leave tails after
//! every vector width, block and tile. Each plan runs its backend's tier (`CpuBackend::with_isa`).

mod common;

use common::nmse;
use quantgraph::kernels::Isa;
use quantgraph::testdata::rand_f32;
use quantgraph::{CpuBackend, DType, FlashAttnParams, Graph, Plan, RopeMode, RopeParams, TensorId};

/// Runs `build` on tier `isa` with random F32 inputs (and F16 inputs, given as F32 then cast in
/// the graph).
fn run(
    isa: Isa,
    threads: usize,
    build: impl Fn(&mut Graph) -> (Vec<(TensorId, usize)>, Vec<(TensorId, Vec<i32>)>, TensorId),
) -> Vec<f32> {
    let mut g = Graph::new();
    let (inputs, ints, out) = build(&mut g);
    g.set_output(out).unwrap();
    let mut p = Plan::with_guards(g, &CpuBackend::with_isa(threads, isa).unwrap(), 64).unwrap();
    for (k, (id, n)) in inputs.iter().enumerate() {
        let v: Vec<f32> = rand_f32(*n, 40 + k as u64).iter().map(|x| x * 6.0).collect();
        p.set_input(*id, &v).unwrap();
    }
    for (id, v) in &ints {
        p.set_input(*id, v).unwrap();
    }
    p.compute().unwrap();
    p.check_guards().unwrap();
    p.output::<f32>(out).unwrap().to_vec()
}

type Case = (&'static str, bool, fn(Isa, usize) -> Vec<f32>);

fn swiglu_split(isa: Isa, t: usize) -> Vec<f32> {
    run(isa, t, |g| {
        let a = g.input(DType::F32, &[1003, 5]).unwrap();
        let b = g.input(DType::F32, &[1003, 5]).unwrap();
        (vec![(a, 5015), (b, 5015)], vec![], g.swiglu(a, Some(b)).unwrap())
    })
}

fn swiglu_fused(isa: Isa, t: usize) -> Vec<f32> {
    run(isa, t, |g| {
        let a = g.input(DType::F32, &[2 * 77, 9]).unwrap();
        (vec![(a, 154 * 9)], vec![], g.swiglu(a, None).unwrap())
    })
}

fn gelu(isa: Isa, t: usize) -> Vec<f32> {
    run(isa, t, |g| {
        let a = g.input(DType::F32, &[1003, 5]).unwrap();
        let s = g.scale(a, 2.0).unwrap(); // inputs in [-12, 12]: both saturation arms
        (vec![(a, 5015)], vec![], g.gelu(s).unwrap())
    })
}

fn rope(ne0: usize, n_dims: usize, isa: Isa, t: usize) -> Vec<f32> {
    rope_at(ne0, n_dims, 0, isa, t)
}

fn rope_at(ne0: usize, n_dims: usize, n_offs: usize, isa: Isa, t: usize) -> Vec<f32> {
    run(isa, t, |g| {
        let a = g.input(DType::F32, &[ne0, 3, 7]).unwrap();
        let p = g.input(DType::I32, &[7]).unwrap();
        let mut rp = RopeParams::new(n_dims, RopeMode::Neox, 10000.0);
        rp.freq_scale = 0.5;
        rp.n_offs = n_offs;
        let out = g.rope_ext(a, p, None, rp).unwrap();
        (vec![(a, ne0 * 21)], vec![(p, (0..7).map(|i| i * 13 + 2).collect())], out)
    })
}

fn rope_partial(isa: Isa, t: usize) -> Vec<f32> {
    rope(80, 36, isa, t) // 18 pairs: two vectors and a tail of 2, then 44 copied dims
}

fn rope_full(isa: Isa, t: usize) -> Vec<f32> {
    rope(72, 72, isa, t)
}

fn rope_offset(isa: Isa, t: usize) -> Vec<f32> {
    rope_at(80, 36, 10, isa, t) // 10 copied dims, 36 rotated, 34 copied
}

fn cpy_q8_0(isa: Isa, t: usize) -> Vec<f32> {
    run(isa, t, |g| {
        let a = g.input(DType::F32, &[4096, 3]).unwrap();
        let q = g.cast(a, DType::Q8_0).unwrap();
        (vec![(a, 4096 * 3)], vec![], g.cast(q, DType::F32).unwrap())
    })
}

fn attn(mask: bool, softcap: f32, isa: Isa, t: usize) -> Vec<f32> {
    run(isa, t, |g| {
        let (dk, nq, nkv) = (72, 100, 203);
        let q = g.input(DType::F32, &[dk, nq, 4]).unwrap();
        let k32 = g.input(DType::F32, &[dk, nkv, 2]).unwrap();
        let v32 = g.input(DType::F32, &[dk, nkv, 2]).unwrap();
        let m32 = g.input(DType::F32, &[nkv, 100]).unwrap();
        let k = g.cast(k32, DType::F16).unwrap();
        let v = g.cast(v32, DType::F16).unwrap();
        let m = g.cast(m32, DType::F16).unwrap();
        let p = FlashAttnParams { scale: 0.04, max_bias: 0.0, logit_softcap: softcap };
        let o = g.flash_attn_ext(q, k, v, mask.then_some(m), None, p).unwrap();
        let mut ins = vec![(q, dk * nq * 4), (k32, dk * nkv * 2), (v32, dk * nkv * 2)];
        if mask {
            ins.push((m32, nkv * 100));
        }
        (ins, vec![], o)
    })
}

/// Decode: 2 queries over a long F16 KV (split into chunks; the AVX-512 tier's F16 loop), head
/// size 128, GQA, a mask.
fn attn_decode(isa: Isa, t: usize) -> Vec<f32> {
    run(isa, t, |g| {
        let (d, nq, nkv) = (128, 2, 1000);
        let q = g.input(DType::F32, &[d, nq, 4]).unwrap();
        let k32 = g.input(DType::F32, &[d, nkv, 2]).unwrap();
        let v32 = g.input(DType::F32, &[d, nkv, 2]).unwrap();
        let m32 = g.input(DType::F32, &[nkv, 4]).unwrap();
        let k = g.cast(k32, DType::F16).unwrap();
        let v = g.cast(v32, DType::F16).unwrap();
        let m = g.cast(m32, DType::F16).unwrap();
        let o = g.flash_attn_ext(q, k, v, Some(m), None, FlashAttnParams::new(0.02)).unwrap();
        (vec![(q, d * nq * 4), (k32, d * nkv * 2), (v32, d * nkv * 2), (m32, nkv * 4)], vec![], o)
    })
}

fn attn_masked(isa: Isa, t: usize) -> Vec<f32> {
    attn(true, 0.0, isa, t)
}

fn attn_unmasked(isa: Isa, t: usize) -> Vec<f32> {
    attn(false, 0.0, isa, t)
}

fn attn_softcap(isa: Isa, t: usize) -> Vec<f32> {
    attn(true, 30.0, isa, t)
}

#[test]
fn llm_fast_paths_agree_across_tiers_and_threads() {
    // (name, bitwise across tiers, run)
    let cases: [Case; 11] = [
        ("swiglu split", false, swiglu_split),
        ("swiglu fused", false, swiglu_fused),
        ("gelu", true, gelu),
        ("rope partial", true, rope_partial),
        ("rope full", true, rope_full),
        ("rope with an offset", true, rope_offset),
        ("cpy f32 -> q8_0", true, cpy_q8_0),
        ("flash_attn masked", false, attn_masked),
        ("flash_attn unmasked", false, attn_unmasked),
        ("flash_attn softcap", false, attn_softcap),
        ("flash_attn decode f16", false, attn_decode),
    ];
    let tiers: Vec<Isa> = Isa::ALL.into_iter().filter(|i| i.is_supported()).collect();
    for (name, bitwise, f) in cases {
        let mut per_tier = Vec::new();
        for &isa in &tiers {
            let one = f(isa, 1);
            assert!(one.iter().all(|v| v.is_finite()), "{name} {isa:?}: non-finite output");
            for t in [2, 3] {
                let got = f(isa, t);
                assert!(
                    got.iter().zip(&one).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{name} {isa:?}: {t} threads differ from 1"
                );
            }
            per_tier.push(one);
        }
        let base: Vec<f64> = per_tier[0].iter().map(|&v| v as f64).collect();
        for (other, isa) in per_tier[1..].iter().zip(&tiers[1..]) {
            if bitwise {
                assert!(
                    other.iter().zip(&per_tier[0]).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{name}: {isa:?} differs from the scalar tier"
                );
            } else {
                let e = nmse(other, &base);
                assert!(e < 1e-10, "{name}: {isa:?} vs scalar nmse {e}");
            }
        }
    }
}

/// A NaN in one head's K makes that head's output NaN (as ggml's online softmax does) and leaves
/// the other heads finite, on every tier (the AVX-512 F16 decode loop and the generic one).
#[test]
fn flash_attn_ext_decode_propagates_nan_scores_per_head() {
    let (d, n_kv, heads) = (64usize, 300usize, 2usize);
    for isa in Isa::ALL.into_iter().filter(|i| i.is_supported()) {
        let mut g = Graph::new();
        let q = g.input(DType::F32, &[d, 1, heads]).unwrap();
        let k32 = g.input(DType::F32, &[d, n_kv, heads]).unwrap();
        let v32 = g.input(DType::F32, &[d, n_kv, heads]).unwrap();
        let k = g.cast(k32, DType::F16).unwrap();
        let v = g.cast(v32, DType::F16).unwrap();
        let o = g.flash_attn_ext(q, k, v, None, None, FlashAttnParams::new(0.125)).unwrap();
        g.set_output(o).unwrap();
        let mut p = Plan::with_guards(g, &CpuBackend::with_isa(2, isa).unwrap(), 64).unwrap();
        let mut kv = rand_f32(d * n_kv * heads, 2);
        kv[d * 17 + 3] = f32::NAN; // head 0, position 17
        p.set_input(q, &rand_f32(d * heads, 1)).unwrap();
        p.set_input(k32, &kv).unwrap();
        p.set_input(v32, &rand_f32(d * n_kv * heads, 3)).unwrap();
        p.compute().unwrap();
        let out = p.output::<f32>(o).unwrap();
        // dst is [d, heads, 1]: head 0 first.
        assert!(out[..d].iter().all(|x| x.is_nan()), "{}: head 0 {:?}", isa.name(), &out[..4]);
        assert!(out[d..].iter().all(|x| x.is_finite()), "{}: head 1", isa.name());
    }
}
