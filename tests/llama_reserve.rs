//! Memory reserve: a llama model planned once for its longest prompt runs every shorter prompt
//! and decode steps in that one arena, computing exactly what separately planned steps compute,
//! and no compute allocates (counted by a global allocator).

mod common;

use quantgraph::models::llama::{Llama, LlamaConfig, WeightTypes, synthetic_gguf};
use quantgraph::{CpuBackend, Error, GgufFile, Plan};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Counts allocations on every thread while `COUNTING` is on.
struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; the counter is a relaxed atomic.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's contract is passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations made on any thread while `f` runs. The counter is process-wide, so this file
/// has one test: the test harness allocates on its own thread when another test finishes.
fn allocations<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let before = ALLOCS.load(Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    let r = f();
    COUNTING.store(false, Ordering::SeqCst);
    (r, ALLOCS.load(Ordering::SeqCst) - before)
}

/// The longest prompt of the reserve test: 24, or `QG_RESERVE_MAX_PROMPT` (for example 512, a
/// run of some minutes in release: `QG_RESERVE_MAX_PROMPT=512 cargo test --release --test
/// llama_reserve`).
fn max_prompt() -> usize {
    std::env::var("QG_RESERVE_MAX_PROMPT").ok().and_then(|v| v.parse().ok()).unwrap_or(24)
}

fn cfg() -> LlamaConfig {
    common::llama::tiny_config(max_prompt() + 8)
}

fn model(file: &GgufFile, be: &CpuBackend) -> Llama {
    Llama::from_gguf(file, Some(cfg().n_ctx), be).unwrap()
}

/// The mask `Llama` feeds a step of `t` tokens after `n_past` cached ones.
fn mask(n_ctx: usize, n_past: usize, t: usize) -> Vec<f32> {
    let mut m = vec![f32::NEG_INFINITY; n_ctx * t.next_multiple_of(4)];
    for i in 0..t {
        m[i * n_ctx..i * n_ctx + n_past + i + 1].fill(0.0);
    }
    m
}

#[test]
fn one_reserved_arena_runs_every_step() {
    prefill_1_to_n_and_decode_run_in_one_reserved_arena_without_allocating();
    a_reserved_model_gives_the_same_tokens();
}

fn prefill_1_to_n_and_decode_run_in_one_reserved_arena_without_allocating() {
    // Two threads: between steps the second worker goes to sleep (building a graph takes
    // longer than it polls), and waking it must not allocate either.
    for threads in [1, 2] {
        reserved_steps(threads);
    }
}

fn reserved_steps(threads: usize) {
    let c = cfg();
    let file =
        GgufFile::from_bytes(&synthetic_gguf(&c, WeightTypes::default(), 7).unwrap()).unwrap();
    let be = CpuBackend::with_threads(threads).unwrap();
    let (a, mut reference) = (model(&file, &be), model(&file, &be));
    // The reserved steps attend over the whole cache (`step_graph`); so does the reference (its
    // shorter attention spans could round short prompts' queries differently, see
    // `Llama::set_kv_step`).
    reference.set_kv_step(c.n_ctx).unwrap();
    let tokens: Vec<u32> = (0..c.n_ctx as u32).map(|i| (i * 7 + 3) % c.n_vocab as u32).collect();

    let worst = a.step_graph(max_prompt(), false).unwrap();
    let mut plan = Plan::reserve(worst.graph, &be).unwrap();
    let reserved = plan.stats();
    let mut computes = 0;
    for t in 1..=max_prompt() {
        // Prefill t tokens, then decode until the cache is full (every length decodes a few
        // steps; the longest prompts leave fewer).
        reference.reset();
        let mut n_past = 0;
        let steps = std::iter::once(t).chain(std::iter::repeat_n(1, (c.n_ctx - t).min(3)));
        for n in steps {
            let want = reference.forward(&tokens[n_past..n_past + n]).unwrap();
            let s = a.step_graph(n, false).unwrap();
            plan.replan(s.graph).unwrap();
            assert!(plan.stats().arena_bytes <= reserved.arena_bytes);
            assert_eq!(plan.stats().work_bytes, reserved.work_bytes, "the work buffer is kept");
            let ids: Vec<i32> = tokens[n_past..n_past + n].iter().map(|&x| x as i32).collect();
            let pos: Vec<i32> = (n_past..n_past + n).map(|p| p as i32).collect();
            plan.set_input(s.tokens, &ids).unwrap();
            plan.set_input(s.pos, &pos).unwrap();
            plan.set_input(s.mask, &mask(c.n_ctx, n_past, n)).unwrap();
            // The counter sees every thread of the process, so a stray allocation elsewhere (the
            // test harness) can land in one window: an allocation made by compute itself shows
            // in every try. Recomputing a step writes the same cache cells with the same values.
            let allocs = (0..3)
                .map(|_| {
                    let (r, allocs) = allocations(|| plan.compute());
                    r.unwrap();
                    allocs
                })
                .min()
                .unwrap();
            assert_eq!(
                allocs, 0,
                "{threads} threads: compute of {n} tokens after {n_past} allocated"
            );
            computes += 1;
            let got = plan.output::<f32>(s.logits).unwrap();
            assert_eq!(got, want.as_slice(), "{n} tokens after {n_past}");
            n_past += n;
        }
    }
    assert!(computes > 2 * max_prompt());

    // A longer prompt does not fit: the error says by how much and names a tensor.
    let too_long = a.step_graph(max_prompt() + 4, false).unwrap();
    let e = plan.replan(too_long.graph).unwrap_err();
    assert!(matches!(e, Error::Buffer(_)), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("more than the") && msg.contains("is past it"), "{msg}");
    // ... and the plan keeps its last graph.
    plan.compute().unwrap();
}

fn a_reserved_model_gives_the_same_tokens() {
    let c = cfg();
    let file =
        GgufFile::from_bytes(&synthetic_gguf(&c, WeightTypes::default(), 9).unwrap()).unwrap();
    let be = CpuBackend::with_threads(2).unwrap();
    let (mut a, mut b) = (model(&file, &be), model(&file, &be));
    a.reserve(16).unwrap();
    for prompt in [&[1u32, 2, 3][..], &[4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]] {
        a.reset();
        b.reset();
        assert_eq!(a.generate(prompt, 6).unwrap(), b.generate(prompt, 6).unwrap());
    }
    a.reset();
    let e = a.forward(&[1; 20]).unwrap_err().to_string();
    assert!(e.contains("replan"), "{e}");
    // The reserve survives the refusal.
    a.reset();
    assert_eq!(a.forward(&[1, 2]).unwrap(), {
        b.reset();
        b.forward(&[1, 2]).unwrap()
    });
}
