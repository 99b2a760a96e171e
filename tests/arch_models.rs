//! The llama-like architectures (qwen2, qwen3, gemma3, llama) on small synthetic GGUFs, every
//! logit of a prompt against a plain f64 forward pass written here from llama.cpp's graphs
//! (src/models/{llama,qwen2,qwen3,gemma3}.cpp); and the loader's errors.

use quantgraph::models::{Architecture, load};
use quantgraph::testdata::Xorshift64;
use quantgraph::{CpuBackend, DType, GgufFile, GgufWriter};

#[derive(Clone, Copy, PartialEq, Debug)]
enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    Gemma3,
}

const D: usize = 32; // n_embd
const NH: usize = 4;
const NKV: usize = 2;
const HD: usize = 16; // head size (not D / NH for qwen3 and gemma3)
const FF: usize = 48;
const NV: usize = 40;
const NL: usize = 3;
const EPS: f32 = 1e-6;
const BASE: f32 = 10000.0;
const BASE_SWA: f32 = 500.0;
const WINDOW: usize = 3;

fn name(a: Arch) -> &'static str {
    match a {
        Arch::Llama => "llama",
        Arch::Qwen2 => "qwen2",
        Arch::Qwen3 => "qwen3",
        Arch::Gemma3 => "gemma3",
    }
}

fn hd(a: Arch) -> usize {
    if a == Arch::Llama || a == Arch::Qwen2 { D / NH } else { HD }
}

/// A model's tensors as f32 (name -> values), written to GGUF in F32.
struct Model {
    arch: Arch,
    t: std::collections::HashMap<String, Vec<f32>>,
    bytes: Vec<u8>,
}

fn model(a: Arch, seed: u64) -> Model {
    let p = name(a);
    let mut w = GgufWriter::new();
    w.add("general.architecture", p).unwrap();
    w.add(&format!("{p}.embedding_length"), D as u32).unwrap();
    w.add(&format!("{p}.block_count"), NL as u32).unwrap();
    w.add(&format!("{p}.attention.head_count"), NH as u32).unwrap();
    w.add(&format!("{p}.attention.head_count_kv"), NKV as u32).unwrap();
    w.add(&format!("{p}.feed_forward_length"), FF as u32).unwrap();
    w.add(&format!("{p}.context_length"), 16u32).unwrap();
    w.add(&format!("{p}.rope.freq_base"), BASE).unwrap();
    w.add(&format!("{p}.attention.layer_norm_rms_epsilon"), EPS).unwrap();
    if hd(a) != D / NH {
        w.add(&format!("{p}.attention.key_length"), hd(a) as u32).unwrap();
    }
    if a == Arch::Gemma3 {
        w.add("gemma3.attention.sliding_window", WINDOW as u32).unwrap();
        w.add("gemma3.attention.sliding_window_pattern", 2u32).unwrap();
        w.add("gemma3.rope.freq_base_swa", BASE_SWA).unwrap();
    }
    let mut r = Xorshift64::new(seed);
    let mut t = std::collections::HashMap::new();
    let mut add = |w: &mut GgufWriter, name: String, ne: &[usize], scale: f32, offset: f32| {
        let v: Vec<f32> = (0..ne.iter().product()).map(|_| r.next_f32() * scale + offset).collect();
        w.add_tensor_owned(&name, DType::F32, ne, bytemuck::cast_slice(&v).to_vec()).unwrap();
        t.insert(name, v);
    };
    let (q, kv) = (hd(a) * NH, hd(a) * NKV);
    let s = |n: usize| 1.0 / (n as f32).sqrt();
    add(&mut w, "token_embd.weight".into(), &[D, NV], 1.0, 0.0);
    for i in 0..NL {
        let n = |x: &str| format!("blk.{i}.{x}.weight");
        add(&mut w, n("attn_norm"), &[D], 0.2, 1.0);
        add(&mut w, n("attn_q"), &[D, q], s(D), 0.0);
        add(&mut w, n("attn_k"), &[D, kv], s(D), 0.0);
        add(&mut w, n("attn_v"), &[D, kv], s(D), 0.0);
        add(&mut w, n("attn_output"), &[q, D], s(q), 0.0);
        add(&mut w, n("ffn_norm"), &[D], 0.2, 1.0);
        add(&mut w, n("ffn_gate"), &[D, FF], s(D), 0.0);
        add(&mut w, n("ffn_up"), &[D, FF], s(D), 0.0);
        add(&mut w, n("ffn_down"), &[FF, D], s(FF), 0.0);
        if a == Arch::Qwen2 {
            for (x, len) in [("attn_q", q), ("attn_k", kv), ("attn_v", kv)] {
                add(&mut w, format!("blk.{i}.{x}.bias"), &[len], 0.5, 0.0);
            }
        }
        if a == Arch::Qwen3 || a == Arch::Gemma3 {
            add(&mut w, n("attn_q_norm"), &[hd(a)], 0.2, 1.0);
            add(&mut w, n("attn_k_norm"), &[hd(a)], 0.2, 1.0);
        }
        if a == Arch::Gemma3 {
            add(&mut w, n("post_attention_norm"), &[D], 0.2, 1.0);
            add(&mut w, n("post_ffw_norm"), &[D], 0.2, 1.0);
        }
    }
    add(&mut w, "output_norm.weight".into(), &[D], 0.2, 1.0);
    if a != Arch::Gemma3 {
        // gemma3 ties the output projection to the embedding.
        add(&mut w, "output.weight".into(), &[D, NV], s(D), 0.0);
    }
    Model { arch: a, t, bytes: w.to_vec().unwrap() }
}

// ---- the f64 reference ----

fn rms_norm(x: &[f64], w: &[f32]) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let s = 1.0 / (ms + EPS as f64).sqrt();
    x.iter().zip(w).map(|(v, &g)| v * s * g as f64).collect()
}

/// y = W x for W of ggml shape [n_in, n_out].
fn matvec(w: &[f32], x: &[f64]) -> Vec<f64> {
    w.chunks(x.len()).map(|row| row.iter().zip(x).map(|(&a, b)| a as f64 * b).sum()).collect()
}

fn rope(v: &mut [f64], pos: usize, base: f64, neox: bool) {
    let n = v.len();
    for i in 0..n / 2 {
        let theta = pos as f64 * base.powf(-2.0 * i as f64 / n as f64);
        let (a, b) = if neox { (i, i + n / 2) } else { (2 * i, 2 * i + 1) };
        let (x0, x1) = (v[a], v[b]);
        v[a] = x0 * theta.cos() - x1 * theta.sin();
        v[b] = x0 * theta.sin() + x1 * theta.cos();
    }
}

fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

fn reference(m: &Model, tokens: &[u32]) -> Vec<Vec<f64>> {
    let a = m.arch;
    let (h, t) = (hd(a), &m.t);
    let w = |n: &str| &t[n];
    let neox = a != Arch::Llama;
    let scale = if a == Arch::Gemma3 { (D as f64).sqrt() } else { 1.0 };
    let mut x: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&tk| {
            w("token_embd.weight")[tk as usize * D..][..D]
                .iter()
                .map(|&v| v as f64 * scale)
                .collect()
        })
        .collect();
    for il in 0..NL {
        let n = |s: &str| format!("blk.{il}.{s}.weight");
        let swa = a == Arch::Gemma3 && il % 2 == 0;
        let base = if swa { BASE_SWA } else { BASE } as f64;
        let mut qs = Vec::new();
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        for (p, xt) in x.iter().enumerate() {
            let hn = rms_norm(xt, w(&n("attn_norm")));
            let mut q = matvec(w(&n("attn_q")), &hn);
            let mut k = matvec(w(&n("attn_k")), &hn);
            let mut v = matvec(w(&n("attn_v")), &hn);
            if a == Arch::Qwen2 {
                for (y, b) in [(&mut q, "attn_q"), (&mut k, "attn_k"), (&mut v, "attn_v")] {
                    for (yi, bi) in y.iter_mut().zip(&t[&format!("blk.{il}.{b}.bias")]) {
                        *yi += *bi as f64;
                    }
                }
            }
            for (y, nm) in [(&mut q, "attn_q_norm"), (&mut k, "attn_k_norm")] {
                for head in y.chunks_mut(h) {
                    if a == Arch::Qwen3 || a == Arch::Gemma3 {
                        let normed = rms_norm(head, w(&n(nm)));
                        head.copy_from_slice(&normed);
                    }
                    rope(head, p, base, neox);
                }
            }
            qs.push(q);
            ks.push(k);
            vs.push(v);
        }
        let att_scale = 1.0 / (h as f64).sqrt();
        for p in 0..x.len() {
            let mut att = vec![0.0; h * NH];
            for head in 0..NH {
                let kvh = head / (NH / NKV);
                let q = &qs[p][head * h..][..h];
                let keys: Vec<usize> = (0..=p).filter(|&j| !swa || p - j < WINDOW).collect();
                let s: Vec<f64> = keys
                    .iter()
                    .map(|&j| {
                        q.iter().zip(&ks[j][kvh * h..][..h]).map(|(a, b)| a * b).sum::<f64>()
                            * att_scale
                    })
                    .collect();
                let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|v| (v - mx).exp()).collect();
                let sum: f64 = e.iter().sum();
                for (&j, ej) in keys.iter().zip(&e) {
                    for d in 0..h {
                        att[head * h + d] += ej / sum * vs[j][kvh * h + d];
                    }
                }
            }
            let mut o = matvec(w(&n("attn_output")), &att);
            if a == Arch::Gemma3 {
                o = rms_norm(&o, w(&n("post_attention_norm")));
            }
            let x1: Vec<f64> = x[p].iter().zip(&o).map(|(a, b)| a + b).collect();
            let h2 = rms_norm(&x1, w(&n("ffn_norm")));
            let g = matvec(w(&n("ffn_gate")), &h2);
            let u = matvec(w(&n("ffn_up")), &h2);
            let act: Vec<f64> = g
                .iter()
                .zip(&u)
                .map(
                    |(&g, &u)| {
                        if a == Arch::Gemma3 { gelu(g) * u } else { g / (1.0 + (-g).exp()) * u }
                    },
                )
                .collect();
            let mut dn = matvec(w(&n("ffn_down")), &act);
            if a == Arch::Gemma3 {
                dn = rms_norm(&dn, w(&n("post_ffw_norm")));
            }
            // Later positions of this layer read x[p] only through ks/vs, already computed.
            x[p] = x1.iter().zip(&dn).map(|(a, b)| a + b).collect();
        }
    }
    let out = t.get("output.weight").unwrap_or(&t["token_embd.weight"]);
    x.iter().map(|xt| matvec(out, &rms_norm(xt, w("output_norm.weight")))).collect()
}

fn check(a: Arch) {
    let m = model(a, 42 + a as u64);
    let file = GgufFile::from_vec(m.bytes.clone()).unwrap();
    assert_eq!(Architecture::from_gguf(&file).unwrap().name(), name(a));
    let backend = CpuBackend::with_threads(2).unwrap();
    let mut model = load(&file, None, &backend).unwrap();
    let prompt = [3u32, 17, 5, 39, 0, 22, 8];
    let want = reference(&m, &prompt);
    // The prompt at once, then the same prompt token by token (the decode path).
    let got_all = model.forward(&prompt).unwrap();
    model.reset();
    let mut got_steps = Vec::new();
    for &tk in &prompt {
        got_steps.extend(model.forward(&[tk]).unwrap());
    }
    for got in [got_all, got_steps] {
        assert_eq!(got.len(), NV * prompt.len());
        let mut worst = 0.0f64;
        for (p, row) in want.iter().enumerate() {
            let scale = row.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            for (i, &r) in row.iter().enumerate() {
                worst = worst.max((got[p * NV + i] as f64 - r).abs() / scale);
            }
        }
        // K and V are cached in F16.
        assert!(worst < 5e-3, "{a:?}: relative error {worst}");
    }
}

#[test]
fn llama_matches_the_reference() {
    check(Arch::Llama);
}

#[test]
fn qwen2_biases_match_the_reference() {
    check(Arch::Qwen2);
}

#[test]
fn qwen3_qk_norms_match_the_reference() {
    check(Arch::Qwen3);
}

#[test]
fn gemma3_sliding_window_gelu_and_post_norms_match_the_reference() {
    check(Arch::Gemma3);
}

#[test]
fn unsupported_architecture_is_named() {
    let mut w = GgufWriter::new();
    w.add("general.architecture", "mamba").unwrap();
    let file = GgufFile::from_vec(w.to_vec().unwrap()).unwrap();
    let e = Architecture::from_gguf(&file).unwrap_err().to_string();
    assert!(e.contains("'mamba'") && e.contains("qwen3"), "{e}");
    let backend = CpuBackend::with_threads(1).unwrap();
    assert!(load(&file, None, &backend).is_err());
}
