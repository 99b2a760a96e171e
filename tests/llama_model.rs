//! The llama model runner on small random weights: prefill logits against an f64 reference,
//! prefill + decode against one prefill, and greedy generation reproducible across thread counts.

mod common;

/// The runner tests' small model with a cache of 32 cells.
fn cfg() -> LlamaConfig {
    common::llama::tiny_config(32)
}

use common::nmse;
use quantgraph::models::WeightRef;
use quantgraph::models::llama::{Llama, LlamaConfig};
use quantgraph::testdata::rand_f32;
use quantgraph::{Buffer, CpuBackend, DType};
use std::collections::HashMap;

/// Weight values as the model sees them (after rounding to their type), by name.
type Values = HashMap<String, (Vec<f32>, [usize; 4])>;

/// Random weights: the model's references and the values they hold.
fn weights(c: &LlamaConfig, ty: DType) -> (HashMap<String, WeightRef>, Values) {
    let mut refs = HashMap::new();
    let mut vals = HashMap::new();
    let mut seed = 100;
    let mut add = |name: String, ne: [usize; 4], scale: f32, offset: f32, ty: DType| {
        seed += 1;
        let n: usize = ne.iter().product();
        let v: Vec<f32> = rand_f32(n, seed).iter().map(|x| x * scale + offset).collect();
        let mut bytes = vec![0u8; ty.row_size(n).unwrap()];
        match ty {
            DType::F32 | DType::F16 => {
                quantgraph::quant::quantize_for_dot(ty, &v, &mut bytes).unwrap()
            }
            _ => quantgraph::quant::quantize(ty, &v, &mut bytes).unwrap(),
        }
        let mut back = vec![0f32; n];
        quantgraph::quant::dequantize(ty, &bytes, &mut back).unwrap();
        refs.insert(
            name.clone(),
            WeightRef { dtype: ty, ne, buffer: Buffer::from_host(bytes), offset: 0 },
        );
        vals.insert(name, (back, ne));
    };
    let (d, kv, ff) = (c.n_embd, c.head_dim() * c.n_head_kv, c.n_ff);
    add("token_embd.weight".into(), [d, c.n_vocab, 1, 1], 1.0, 0.0, ty);
    add("output_norm.weight".into(), [d, 1, 1, 1], 0.2, 1.0, DType::F32);
    add("output.weight".into(), [d, c.n_vocab, 1, 1], 0.3, 0.0, ty);
    for i in 0..c.n_layer {
        let b = |n: &str| format!("blk.{i}.{n}.weight");
        add(b("attn_norm"), [d, 1, 1, 1], 0.2, 1.0, DType::F32);
        add(b("attn_q"), [d, d, 1, 1], 0.25, 0.0, ty);
        add(b("attn_k"), [d, kv, 1, 1], 0.25, 0.0, ty);
        add(b("attn_v"), [d, kv, 1, 1], 0.25, 0.0, ty);
        add(b("attn_output"), [d, d, 1, 1], 0.25, 0.0, ty);
        add(b("ffn_norm"), [d, 1, 1, 1], 0.2, 1.0, DType::F32);
        add(b("ffn_gate"), [d, ff, 1, 1], 0.25, 0.0, ty);
        add(b("ffn_up"), [d, ff, 1, 1], 0.25, 0.0, ty);
        add(b("ffn_down"), [ff, d, 1, 1], 0.25, 0.0, ty);
    }
    (refs, vals)
}

fn reference(c: &LlamaConfig, w: &Values, tokens: &[u32]) -> Vec<f64> {
    let g = |n: &str| &w[n].0;
    let mv = |m: &[f32], rows: usize, cols: usize, x: &[f64]| -> Vec<f64> {
        (0..rows).map(|r| (0..cols).map(|k| m[r * cols + k] as f64 * x[k]).sum()).collect()
    };
    let rms = |x: &[f64], wt: &[f32]| {
        let ms = x.iter().map(|t| t * t).sum::<f64>() / x.len() as f64;
        x.iter()
            .zip(wt)
            .map(|(t, g)| t / (ms + c.eps as f64).sqrt() * *g as f64)
            .collect::<Vec<_>>()
    };
    let (d, hd, nh, nkv) = (c.n_embd, c.head_dim(), c.n_head, c.n_head_kv);
    let rope = |v: &mut [f64], p: usize| {
        for i in (0..hd).step_by(2) {
            let th = p as f64 * (c.rope_base as f64).powf(-(i as f64) / hd as f64);
            let (a, b) = (v[i], v[i + 1]);
            v[i] = a * th.cos() - b * th.sin();
            v[i + 1] = a * th.sin() + b * th.cos();
        }
    };
    let mut xs: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&t| g("token_embd.weight")[t as usize * d..][..d].iter().map(|&v| v as f64).collect())
        .collect();
    for l in 0..c.n_layer {
        let n = |s: &str| format!("blk.{l}.{s}.weight");
        let (mut qs, mut ks, mut vs) = (Vec::new(), Vec::new(), Vec::new());
        for (p, x) in xs.iter().enumerate() {
            let h = rms(x, g(&n("attn_norm")));
            let mut q = mv(g(&n("attn_q")), d, d, &h);
            let mut k = mv(g(&n("attn_k")), hd * nkv, d, &h);
            for hh in 0..nh {
                rope(&mut q[hh * hd..(hh + 1) * hd], p);
            }
            for hh in 0..nkv {
                rope(&mut k[hh * hd..(hh + 1) * hd], p);
            }
            qs.push(q);
            ks.push(k);
            vs.push(mv(g(&n("attn_v")), hd * nkv, d, &h));
        }
        let mut next = Vec::new();
        for (t, x) in xs.iter().enumerate() {
            let mut att = vec![0f64; d];
            for hh in 0..nh {
                let kh = hh / (nh / nkv);
                let lg: Vec<f64> = (0..=t)
                    .map(|j| {
                        (0..hd).map(|e| qs[t][hh * hd + e] * ks[j][kh * hd + e]).sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let mx = lg.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let den: f64 = lg.iter().map(|v| (v - mx).exp()).sum();
                for e in 0..hd {
                    att[hh * hd + e] =
                        (0..=t).map(|j| (lg[j] - mx).exp() * vs[j][kh * hd + e]).sum::<f64>() / den;
                }
            }
            let o = mv(g(&n("attn_output")), d, d, &att);
            let x1: Vec<f64> = o.iter().zip(x).map(|(a, b)| a + b).collect();
            let h2 = rms(&x1, g(&n("ffn_norm")));
            let gt = mv(g(&n("ffn_gate")), c.n_ff, d, &h2);
            let up = mv(g(&n("ffn_up")), c.n_ff, d, &h2);
            let ff: Vec<f64> =
                gt.iter().zip(&up).map(|(a, b)| a / (1.0 + (-a).exp()) * b).collect();
            let dn = mv(g(&n("ffn_down")), d, c.n_ff, &ff);
            next.push(dn.iter().zip(&x1).map(|(a, b)| a + b).collect());
        }
        xs = next;
    }
    xs.iter()
        .flat_map(|x| mv(g("output.weight"), c.n_vocab, d, &rms(x, g("output_norm.weight"))))
        .collect()
}

#[test]
fn prefill_matches_reference_and_decode_matches_prefill() {
    let c = cfg();
    for ty in [DType::F32, DType::F16, DType::Q8_0, DType::Q4_0] {
        let (refs, vals) = weights(&c, ty);
        let be = CpuBackend::with_threads(2).unwrap();
        let mut m = Llama::new(c, &refs, &be).unwrap();
        let prompt = [3u32, 17, 42, 8, 0, 49, 21];
        let logits = m.forward(&prompt).unwrap();
        let want = reference(&c, &vals, &prompt);
        let e = nmse(&logits, &want);
        assert!(e < 1e-3, "{ty}: nmse {e}");
        // Decode the last prompt token after prefilling the others: same logits as the prefill.
        m.reset();
        m.forward(&prompt[..6]).unwrap();
        let last = m.forward(&prompt[6..]).unwrap();
        let full = &logits[6 * c.n_vocab..];
        let e = nmse(&last, &full.iter().map(|&v| v as f64).collect::<Vec<_>>());
        assert!(e < 1e-6, "{ty}: decode vs prefill nmse {e}");
        assert_eq!(m.n_past(), 7);
        // The prompt with only its last token's logits: the last row of the full prefill.
        m.reset();
        let only = m.forward_last(&prompt).unwrap();
        assert_eq!(only.len(), c.n_vocab);
        let e = nmse(&only, &full.iter().map(|&v| v as f64).collect::<Vec<_>>());
        assert!(e < 1e-6, "{ty}: forward_last vs prefill nmse {e}");
        assert_eq!(m.n_past(), 7);
    }
}

#[test]
fn generation_is_thread_invariant_and_bounded_by_the_context() {
    let c = cfg();
    let (refs, _) = weights(&c, DType::Q8_0);
    let mut outs = Vec::new();
    for nth in [1, 2, 3] {
        let be = CpuBackend::with_threads(nth).unwrap();
        let mut m = Llama::new(c, &refs, &be).unwrap();
        outs.push(m.generate(&[1, 2, 3], 10).unwrap());
        assert!(m.forward(&[0; 32]).is_err(), "past the context");
        assert!(m.forward(&[50]).is_err(), "outside the vocabulary");
    }
    assert_eq!(outs[0], outs[1]);
    assert_eq!(outs[0], outs[2]);
    let mut missing = refs.clone();
    missing.remove("blk.1.ffn_up.weight");
    let e = Llama::new(c, &missing, &CpuBackend::with_threads(1).unwrap()).err().unwrap();
    assert!(e.to_string().contains("blk.1.ffn_up.weight"), "{e}");
}

#[test]
fn gguf_round_trip_loads_zero_copy_and_generates_the_same_tokens() {
    use quantgraph::GgufFile;
    use quantgraph::models::llama::{WeightTypes, synthetic_gguf};
    let c = LlamaConfig { n_ctx: 24, ..cfg() };
    let bytes = synthetic_gguf(&c, WeightTypes::default(), 7).unwrap();
    let path = std::env::temp_dir().join(format!("qg-llama-test-{}.gguf", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let be = CpuBackend::with_threads(2).unwrap();
    let mapped = GgufFile::open(&path).unwrap();
    let in_memory = GgufFile::from_vec(bytes).unwrap();
    let mut a = Llama::from_gguf(&mapped, None, &be).unwrap();
    let mut b = Llama::from_gguf(&in_memory, Some(16), &be).unwrap();
    assert_eq!(a.config().n_ctx, 24);
    assert_eq!(b.config().n_ctx, 16);
    assert_eq!(a.config().n_vocab, c.n_vocab);
    let ta = a.generate(&[5, 6, 7], 6).unwrap();
    let tb = b.generate(&[5, 6, 7], 6).unwrap();
    assert_eq!(ta, tb);
    std::fs::remove_file(&path).unwrap();
    // Not a llama file: a clear error.
    let mut w = quantgraph::GgufWriter::new();
    w.add("general.architecture", "mamba").unwrap();
    let other = GgufFile::from_vec(w.to_vec().unwrap()).unwrap();
    let e = Llama::from_gguf(&other, None, &be).err().unwrap().to_string();
    assert!(e.contains("mamba"), "{e}");
}

#[test]
fn repacked_model_matches_the_plain_one() {
    use quantgraph::GgufFile;
    use quantgraph::models::llama::{WeightTypes, synthetic_gguf};
    // K-quants need rows of 256; 56 vocabulary rows repack (multiple of 8).
    let c = LlamaConfig { n_ctx: 24, n_embd: 256, n_ff: 256, n_vocab: 56, ..cfg() };
    for types in [
        WeightTypes { embd: DType::F16, attn: DType::Q4_0, ffn: DType::Q4_K, output: DType::Q6_K },
        WeightTypes {
            embd: DType::Q8_0,
            attn: DType::IQ4_NL,
            ffn: DType::Q2_K,
            output: DType::MXFP4,
        },
    ] {
        let bytes = synthetic_gguf(&c, types, 11).unwrap();
        let file = GgufFile::from_vec(bytes).unwrap();
        let be = CpuBackend::with_threads(2).unwrap();
        let mut plain = Llama::from_gguf(&file, None, &be).unwrap();
        let (mut rep, repacked) = Llama::from_gguf_repacked(&file, None, &be).unwrap();
        // Every projection of the 2 layers and the output matrix, at most one byte per weight.
        let per_layer = 2 * (c.n_embd * c.n_embd + c.n_embd * c.n_embd / 2) + 3 * c.n_embd * c.n_ff;
        assert!(repacked > 0 && repacked <= 2 * per_layer + c.n_embd * c.n_vocab, "{repacked}");
        let prompt = [3u32, 9, 27, 1, 40];
        let lp = plain.forward(&prompt).unwrap();
        let lr = rep.forward(&prompt).unwrap();
        let want: Vec<f64> = lp.iter().map(|&v| v as f64).collect();
        let e = common::nmse(&lr, &want);
        assert!(e < 1e-8, "{types:?}: repacked logits NMSE {e}");
        assert_eq!(plain.generate(&[7], 5).unwrap(), rep.generate(&[7], 5).unwrap(), "{types:?}");
    }
}
