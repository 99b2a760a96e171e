//! A runner that attends over the cache cells in use (rounded up to a step) gives the logits of
//! one that attends over the whole cache, bit for bit, at positions on both sides of the step
//! boundaries; prompts that reuse the previous prompt's plan (as it is, or its arena for
//! another shape) give the logits of a freshly planned model.

mod common;

use common::llama::tiny_config as cfg;
use quantgraph::models::WeightRef;
use quantgraph::models::llama::{DEFAULT_KV_STEP, Llama, WeightTypes};
use quantgraph::{CpuBackend, Plan};

fn tok(i: usize) -> u32 {
    ((i * 7 + 3) % 50) as u32
}

#[test]
fn decode_over_cells_in_use_equals_whole_cache() {
    let c = cfg(600);
    let f = common::llama::synthetic_file(&c, WeightTypes::default(), 3);
    let be = CpuBackend::with_threads(2).unwrap();
    let mut whole = Llama::from_gguf(&f, Some(c.n_ctx), &be).unwrap();
    whole.set_kv_step(c.n_ctx).unwrap();
    let mut default = Llama::from_gguf(&f, Some(c.n_ctx), &be).unwrap();
    let mut fine = Llama::from_gguf(&f, Some(c.n_ctx), &be).unwrap();
    fine.set_kv_step(16).unwrap();
    assert!(fine.set_kv_step(0).is_err());
    // Prompts that end just before the 256 and 512 boundaries (the default step) and the
    // 16-cell ones, then decode steps across them; the last prompt leaves a few cells only.
    let mut n = 0;
    for (prompt, decode) in [(5, 4), (240, 10), (240, 16), (60, 20)] {
        for (i, t) in std::iter::once(prompt).chain(std::iter::repeat_n(1, decode)).enumerate() {
            let ids: Vec<u32> = (n..n + t).map(tok).collect();
            let want = whole.forward(&ids).unwrap();
            for m in [&mut default, &mut fine] {
                let got = m.forward(&ids).unwrap();
                assert!(got == want, "{t} tokens at position {n} (step {i}) differ");
            }
            n += t;
        }
    }
    assert_eq!(n, c.n_ctx - 5);
    assert_eq!(DEFAULT_KV_STEP, 256);
    // Past the context: an `Err`, on the bucketed runner as on the whole-cache one.
    assert!(default.forward(&[1; 6]).is_err());
    assert!(whole.forward(&[1; 6]).is_err());
    assert_eq!(default.forward(&[1; 5]).unwrap(), whole.forward(&[1; 5]).unwrap());
}

#[test]
fn a_short_prompt_over_few_heads_agrees_to_q_rounding() {
    // Flash attention takes its many-rows path for 8 or more queries per head unless fewer
    // than 64 rows (queries x heads) meet more than 256 cells, which it cuts into chunks: a
    // prompt of 8 to 15 tokens over 4 heads takes the chunked path over the whole cache of
    // 600 cells and the many-rows one over 16. The chunked path rounds Q to F16 as ggml does,
    // the other keeps it in f32: the logits agree to that rounding.
    let c = cfg(600);
    let f = common::llama::synthetic_file(&c, WeightTypes::default(), 3);
    let be = CpuBackend::with_threads(2).unwrap();
    let mut whole = Llama::from_gguf(&f, Some(c.n_ctx), &be).unwrap();
    whole.set_kv_step(c.n_ctx).unwrap();
    let mut fine = Llama::from_gguf(&f, Some(c.n_ctx), &be).unwrap();
    fine.set_kv_step(16).unwrap();
    let ids: Vec<u32> = (0..13).map(tok).collect();
    let (got, want) = (fine.forward(&ids).unwrap(), whole.forward(&ids).unwrap());
    let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    let top = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    assert!(err <= 1e-2 * top, "{err} of {top}");
}

#[test]
fn sliding_window_blocks_over_cells_in_use_equal_whole_cache() {
    use quantgraph::models::llama::ArchParams;
    // The llama weights with gemma3's sliding window on the first block. Past 256 + window
    // + step positions the window's blocks attend over cells from 256 on only.
    let c = cfg(600);
    let f = common::llama::synthetic_file(&c, WeightTypes::default(), 5);
    let be = CpuBackend::with_threads(1).unwrap();
    let weights: std::collections::HashMap<_, _> = f
        .tensors()
        .iter()
        .map(|t| {
            let w = WeightRef {
                dtype: t.dtype(),
                ne: t.ne(),
                buffer: f.buffer().clone(),
                offset: t.offset(),
            };
            (t.name().to_string(), w)
        })
        .collect();
    let mut arch = ArchParams::default();
    arch.swa_window = 20;
    arch.swa_layers = vec![true, false];
    let mk = || Llama::new_arch(c, arch.clone(), &weights, &be).unwrap();
    let (mut whole, mut fine, mut default) = (mk(), mk(), mk());
    whole.set_kv_step(c.n_ctx).unwrap();
    fine.set_kv_step(32).unwrap();
    let mut n = 0;
    for t in [30, 1, 1, 1, 40, 1, 1, 200, 1, 1, 60, 1, 1, 150, 1, 1, 1] {
        let ids: Vec<u32> = (n..n + t).map(tok).collect();
        let want = whole.forward(&ids).unwrap();
        assert!(want == fine.forward(&ids).unwrap(), "{t} at {n}, step 32");
        assert!(want == default.forward(&ids).unwrap(), "{t} at {n}, default step");
        n += t;
    }
    assert_eq!(n, 492);
}

#[test]
fn prompts_reusing_a_plan_equal_a_fresh_plan() {
    let c = cfg(96);
    let f = common::llama::synthetic_file(&c, WeightTypes::default(), 11);
    let be = CpuBackend::with_threads(2).unwrap();
    let mut reused = Llama::from_gguf(&f, Some(c.n_ctx), &be).unwrap();
    reused.set_kv_step(16).unwrap();
    // The same shape twice (the plan as it is), shorter ones (the arena of a longer one),
    // a longer one (planned anew), after cached tokens too; last-token logits and all.
    let cases: [(&[usize], bool); 6] = [
        (&[7], true),
        (&[7], true),
        (&[7], false),
        (&[12, 1, 5], true),
        (&[30], false),
        (&[3, 9, 9, 2, 1], false),
    ];
    for (k, &(lens, last)) in cases.iter().enumerate() {
        reused.reset();
        // Each step of `fresh` is planned for that step alone (`Plan::new`); it writes the
        // same cache rows as `reused`'s.
        let fresh = Llama::from_gguf(&f, Some(c.n_ctx), &be).unwrap();
        let mut n = 0;
        for &t in lens {
            let ids: Vec<u32> = (n..n + t).map(|i| tok(i + k)).collect();
            let n_kv = (n + t).next_multiple_of(16).min(c.n_ctx);
            let mut s = fresh.step_graph_kv(t, n_kv, last).unwrap();
            let mut plan = Plan::new(std::mem::take(&mut s.graph), &be).unwrap();
            let mut mask = vec![f32::NEG_INFINITY; n_kv * t.next_multiple_of(4)];
            for i in 0..t {
                mask[i * n_kv..i * n_kv + n + i + 1].fill(0.0);
            }
            let tk: Vec<i32> = ids.iter().map(|&x| x as i32).collect();
            let pos: Vec<i32> = (n..n + t).map(|p| p as i32).collect();
            plan.set_input(s.tokens, &tk).unwrap();
            plan.set_input(s.pos, &pos).unwrap();
            plan.set_input(s.mask, &mask).unwrap();
            plan.compute().unwrap();
            let want = plan.output::<f32>(s.logits).unwrap();
            let got = if last { reused.forward_last(&ids) } else { reused.forward(&ids) }.unwrap();
            assert!(got == want, "case {k}: {t} tokens after {n}");
            n += t;
        }
    }
}
