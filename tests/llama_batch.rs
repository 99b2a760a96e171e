//! Several sequences in one step ([`Llama::forward_batch`]): prompts of different lengths run
//! together, then decode steps of one token per sequence, give the logits of each sequence run
//! alone on a fresh model; freed cells are reused; sliding-window blocks; thread counts; every
//! error leaves the model as it was.

mod common;

use common::llama::{file_weights as weights, tiny_config as cfg};
use quantgraph::models::llama::{ArchParams, Batch, Llama, WeightTypes, argmax};
use quantgraph::{CpuBackend, DType, GgufFile};

/// Token `i` of sequence `s`.
fn tok(s: usize, i: usize) -> u32 {
    ((i * 7 + s * 13 + 3) % 50) as u32
}

/// Logits of sequence `s` alone: its prompt, then `steps` single tokens.
fn alone(m: &mut Llama, s: usize, prompt: usize, steps: usize) -> Vec<Vec<f32>> {
    m.reset();
    let p: Vec<u32> = (0..prompt).map(|i| tok(s, i)).collect();
    let mut out = vec![m.forward_last(&p).unwrap()];
    for i in prompt..prompt + steps {
        out.push(m.forward(&[tok(s, i)]).unwrap());
    }
    out
}

/// The same sequences (`(id, prompt length)`) run together: the prompts in one batch (or, with
/// `prompts_apart`, one batch each), then `steps` batches of one token per sequence. Per
/// sequence, the logits of each step.
fn together(
    m: &mut Llama,
    seqs: &[(usize, usize)],
    steps: usize,
    prompts_apart: bool,
) -> Vec<Vec<Vec<f32>>> {
    let nv = m.config().n_vocab;
    let mut out = vec![Vec::new(); seqs.len()];
    let mut b = Batch::new();
    for (k, &(s, prompt)) in seqs.iter().enumerate() {
        let p: Vec<u32> = (0..prompt).map(|i| tok(s, i)).collect();
        b.add_seq(s as u32, &p, true);
        if prompts_apart {
            out[k].push(m.forward_batch(&b).unwrap());
            b.clear();
        }
    }
    if !prompts_apart {
        let l = m.forward_batch(&b).unwrap();
        assert_eq!(l.len(), seqs.len() * nv);
        for (k, o) in out.iter_mut().enumerate() {
            o.push(l[k * nv..(k + 1) * nv].to_vec());
        }
    }
    for step in 0..steps {
        b.clear();
        for &(s, prompt) in seqs {
            b.push(tok(s, prompt + step), s as u32, true);
        }
        let l = m.forward_batch(&b).unwrap();
        for (k, o) in out.iter_mut().enumerate() {
            o.push(l[k * nv..(k + 1) * nv].to_vec());
        }
    }
    out
}

/// Largest difference relative to the largest logit.
fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    let err = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    err / want.iter().fold(0f32, |m, x| m.max(x.abs()))
}

/// Each sequence's logits run together against run alone: bit for bit (`tol` 0) or within
/// `tol` of the largest logit with the same argmax.
fn check(got: &[Vec<Vec<f32>>], want: &[Vec<Vec<f32>>], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len());
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.len(), w.len());
        for (i, (g, w)) in g.iter().zip(w).enumerate() {
            if tol == 0.0 {
                assert!(g == w, "{what}: sequence {k}, step {i} differs");
            } else {
                let e = rel_err(g, w);
                assert!(e <= tol, "{what}: sequence {k}, step {i}: {e:e}");
                assert_eq!(argmax(g), argmax(w), "{what}: sequence {k}, step {i}");
            }
        }
    }
}

fn each_alone(
    f: &GgufFile,
    be: &CpuBackend,
    seqs: &[(usize, usize)],
    steps: usize,
) -> Vec<Vec<Vec<f32>>> {
    let mut solo = Llama::from_gguf(f, None, be).unwrap();
    seqs.iter().map(|&(s, prompt)| alone(&mut solo, s, prompt, steps)).collect()
}

// Whether a batch gives each sequence's logits bit for bit as that sequence alone depends on
// the kernel paths, not on the cache cells: flash attention skips the masked cells (the other
// sequences') one by one without touching its sums, but both it and the matrix products pick
// their path from the number of tokens in the step:
// - flash attention takes its tiled path from 8 query rows per head, which keeps Q in f32 where
//   the one-row path rounds it to F16 (up to about 1e-2 of the largest logit; 7e-3 seen here),
//   as a short prompt does across the paths in `llama_kv_step.rs`;
// - the matrix products' kernels change with the number of tokens too (F32 weights: the float
//   GEMM's order of summation, about 1e-6 here; quantized weights: the int8 tiles from a few
//   tokens on, which give other bits for some shapes).
// So prompts run in batches of their own followed by decode steps of a few tokens (the paths
// each sequence takes alone) are equal bit for bit with these quantized weights, and prompts
// run together are compared to 1e-2 of the largest logit with the same argmax.

#[test]
fn decode_together_equals_each_alone_bit_for_bit() {
    let c = cfg(64);
    let be = CpuBackend::with_threads(2).unwrap();
    let f = common::llama::synthetic_file(&c, WeightTypes::default(), 7);
    let seqs = [(0, 9), (1, 3), (2, 14)];
    let want = each_alone(&f, &be, &seqs, 6);
    let mut m = Llama::from_gguf(&f, None, &be).unwrap();
    check(&together(&mut m, &seqs, 6, true), &want, 0.0, "default step");
    assert_eq!((m.seq_len(0), m.seq_len(1), m.seq_len(2), m.seq_len(3)), (15, 9, 20, 0));
    // Attending over cells rounded up to 16 (masks and K/V views shorter than the cache).
    let mut m = Llama::from_gguf(&f, None, &be).unwrap();
    m.set_kv_step(16).unwrap();
    check(&together(&mut m, &seqs, 6, true), &want, 0.0, "step 16");
}

#[test]
fn prompts_together_agree_with_each_alone() {
    let c = cfg(64);
    let be = CpuBackend::with_threads(2).unwrap();
    let seqs = [(0, 9), (1, 3), (2, 14)];
    for types in [WeightTypes::default(), WeightTypes::all(DType::F32)] {
        let f = common::llama::synthetic_file(&c, types, 7);
        let want = each_alone(&f, &be, &seqs, 5);
        let mut m = Llama::from_gguf(&f, None, &be).unwrap();
        check(&together(&mut m, &seqs, 5, false), &want, 1e-2, &format!("{types:?}"));
        // Prompts apart: with F32 weights, the GEMM order only.
        let mut m = Llama::from_gguf(&f, None, &be).unwrap();
        check(&together(&mut m, &seqs, 5, true), &want, 1e-4, &format!("{types:?} apart"));
    }
}

#[test]
fn freed_cells_serve_a_new_sequence() {
    let c = cfg(40);
    let f = common::llama::synthetic_file(&c, WeightTypes::default(), 9);
    let be = CpuBackend::with_threads(2).unwrap();
    let mut m = Llama::from_gguf(&f, None, &be).unwrap();
    // Sequence 0 in cells 0..6, sequence 1 in 6..16; then 0 is removed and sequence 2's prompt
    // takes its 6 cells and 4 after sequence 1's; then both decode together.
    together(&mut m, &[(0, 6), (1, 10)], 0, true);
    m.seq_rm(0);
    m.seq_rm(5); // no such sequence: nothing happens
    assert_eq!((m.seq_len(0), m.seq_len(1)), (0, 10));
    let nv = c.n_vocab;
    let want2 = each_alone(&f, &be, &[(2, 10)], 3).remove(0);
    let want1 = each_alone(&f, &be, &[(1, 10)], 3).remove(0);
    let mut b = Batch::new();
    b.add_seq(2, &(0..10).map(|i| tok(2, i)).collect::<Vec<_>>(), true);
    assert!(m.forward_batch(&b).unwrap() == want2[0]);
    for step in 0..3 {
        b.clear();
        b.push(tok(1, 10 + step), 1, true).push(tok(2, 10 + step), 2, true);
        let l = m.forward_batch(&b).unwrap();
        assert!(l[..nv] == want1[1 + step] && l[nv..] == want2[1 + step], "step {step}");
    }
    // `forward` (sequence 0) while others are cached: its own tokens, in free cells.
    let want0 = each_alone(&f, &be, &[(0, 5)], 1).remove(0);
    assert!(m.forward_last(&(0..5).map(|i| tok(0, i)).collect::<Vec<_>>()).unwrap() == want0[0]);
    assert!(m.forward(&[tok(0, 5)]).unwrap() == want0[1]);
    assert_eq!(m.n_past(), 6);
    // With the others gone, sequence 0 is not in cells 0..6 and still runs right.
    m.seq_rm(1);
    m.seq_rm(2);
    let mut solo = Llama::from_gguf(&f, None, &be).unwrap();
    solo.forward(&(0..6).map(|i| tok(0, i)).collect::<Vec<_>>()).unwrap();
    assert!(m.forward(&[3]).unwrap() == solo.forward(&[3]).unwrap());
    // A batch that asks for no logits fills the cache and returns none.
    b.clear();
    b.add_seq(4, &[1, 2, 3], false);
    assert_eq!(b.n_outputs(), 0);
    assert!(m.forward_batch(&b).unwrap().is_empty());
    assert_eq!(m.seq_len(4), 3);
    m.reset();
    assert_eq!((m.n_past(), m.seq_len(4)), (0, 0));
    let fresh = each_alone(&f, &be, &[(3, 7)], 2);
    assert!(together(&mut m, &[(3, 7)], 2, true) == fresh);
}

#[test]
fn sliding_window_blocks_together_equal_each_alone() {
    let c = cfg(64);
    let f = common::llama::synthetic_file(&c, WeightTypes::default(), 5);
    let be = CpuBackend::with_threads(2).unwrap();
    let w = weights(&f);
    let mut arch = ArchParams::default();
    arch.swa_window = 5;
    arch.swa_layers = vec![true, false];
    let mk = || Llama::new_arch(c, arch.clone(), &w, &be).unwrap();
    let seqs = [(0, 12), (1, 4), (2, 7)];
    let mut solo = mk();
    let want: Vec<_> = seqs.iter().map(|&(s, p)| alone(&mut solo, s, p, 8)).collect();
    check(&together(&mut mk(), &seqs, 8, true), &want, 0.0, "sliding window, prompts apart");
    check(&together(&mut mk(), &seqs, 8, false), &want, 1e-2, "sliding window");
}

#[test]
fn one_and_two_threads_agree() {
    let c = cfg(64);
    let f = common::llama::synthetic_file(&c, WeightTypes::default(), 11);
    let seqs = [(0, 5), (1, 11), (2, 2)];
    let run = |n| {
        let be = CpuBackend::with_threads(n).unwrap();
        together(&mut Llama::from_gguf(&f, None, &be).unwrap(), &seqs, 3, false)
    };
    assert!(run(1) == run(2));
}

#[test]
fn reserved_arena_serves_batches() {
    let c = cfg(64);
    let f = common::llama::synthetic_file(&c, WeightTypes::default(), 13);
    let be = CpuBackend::with_threads(2).unwrap();
    let seqs = [(0, 9), (1, 3), (2, 6)];
    let mut plain = Llama::from_gguf(&f, None, &be).unwrap();
    let want = together(&mut plain, &seqs, 3, false);
    let mut m = Llama::from_gguf(&f, None, &be).unwrap();
    m.reserve(18).unwrap();
    check(&together(&mut m, &seqs, 3, false), &want, 0.0, "reserved");
    // The single-sequence steps still fit the arena.
    m.reset();
    plain.reset();
    let p: Vec<u32> = (0..18).map(|i| tok(0, i)).collect();
    assert!(m.forward(&p).unwrap() == plain.forward(&p).unwrap());
}

#[test]
fn errors_leave_the_model_as_it_was() {
    let c = cfg(16);
    let f = common::llama::synthetic_file(&c, WeightTypes::default(), 17);
    let be = CpuBackend::with_threads(2).unwrap();
    let mut m = Llama::from_gguf(&f, None, &be).unwrap();
    together(&mut m, &[(0, 8), (1, 6)], 0, false);
    let err = |m: &mut Llama, b: &Batch| m.forward_batch(b).unwrap_err().to_string();
    let mut b = Batch::new();
    assert!(b.is_empty() && err(&mut m, &b).contains("empty batch"));
    b.push(tok(0, 8), 0, true).push(50, 1, true);
    assert!(err(&mut m, &b).contains("token 50 is outside the vocabulary of 50"));
    // Sequence 0 would pass position 16 of a context of 16.
    b.clear();
    b.add_seq(0, &[1; 9], true);
    let e = err(&mut m, &b);
    assert!(e.contains("sequence 0: 8 cached + 9 new tokens exceed the context of 16"), "{e}");
    // Two free cells for three new tokens.
    b.clear();
    b.add_seq(2, &[1, 2, 3], true);
    let e = err(&mut m, &b);
    assert!(e.contains("needs 3 free cache cells, 2 of 16 are free"), "{e}");
    assert!(m.forward(&[1, 2, 3]).is_err());
    assert_eq!((m.seq_len(0), m.seq_len(1), m.seq_len(2)), (8, 6, 0));
    // The model goes on as if the errors had not happened.
    let mut clean = Llama::from_gguf(&f, None, &be).unwrap();
    together(&mut clean, &[(0, 8), (1, 6)], 0, false);
    b.clear();
    b.push(tok(0, 8), 0, true).push(tok(1, 6), 1, false);
    assert!(m.forward_batch(&b).unwrap() == clean.forward_batch(&b).unwrap());
    assert_eq!((m.seq_len(0), m.seq_len(1), m.seq_len(2)), (9, 7, 0));
}
