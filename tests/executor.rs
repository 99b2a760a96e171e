//! The executor's team of workers: the caller runs worker 0 and hands the others the job; workers
//! stay hot between computes and go back to the pool when idle. These tests check that it stays
//! correct under the awkward uses: computes from several threads on one backend, computes spaced
//! wider than the hot window, a compute started from inside one of the backend's own computes,
//! a panicking abort hook, and a change of thread count.

use quantgraph::testdata::uniform;
use quantgraph::{Backend, CpuBackend, DType, Error, Graph, Plan, TensorId};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// y = ((x + x) * x + x ...) over `depth` nodes on 64 x 37 values; returns the plan, x and y.
fn chain(be: &CpuBackend, depth: usize) -> (Plan, TensorId, TensorId) {
    let mut g = Graph::new();
    let x = g.input(DType::F32, &[64, 37]).unwrap();
    let mut y = x;
    for i in 0..depth {
        y = if i % 2 == 0 { g.add(y, x).unwrap() } else { g.mul(y, x).unwrap() };
    }
    g.set_output(y).unwrap();
    (Plan::new(g, be).unwrap(), x, y)
}

/// 64 x 37 values in [0.5, 1.5), so the chain neither vanishes nor overflows.
fn input(seed: u64) -> Vec<f32> {
    uniform(64 * 37, seed, 0.5, 1.5)
}

fn reference(x: &[f32], depth: usize) -> Vec<f32> {
    x.iter()
        .map(|&v| {
            let mut y = v;
            for i in 0..depth {
                y = if i % 2 == 0 { y + v } else { y * v };
            }
            y
        })
        .collect()
}

#[test]
fn computes_from_several_threads_on_one_backend_all_finish_correctly() {
    for threads in [2, 3] {
        let be = Arc::new(CpuBackend::with_threads(threads).unwrap());
        let handles: Vec<_> = (0..3u64)
            .map(|t| {
                let be = be.clone();
                std::thread::spawn(move || {
                    let (mut p, x, y) = chain(&be, 7);
                    let xs = input(t);
                    let want = reference(&xs, 7);
                    p.set_input(x, &xs).unwrap();
                    for _ in 0..200 {
                        p.compute().unwrap();
                        assert_eq!(p.output::<f32>(y).unwrap(), &want[..]);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }
}

#[test]
fn computes_spaced_wider_than_the_hot_window_restart_the_workers() {
    let be = CpuBackend::with_threads(3).unwrap();
    let (mut p, x, y) = chain(&be, 5);
    let xs = input(9);
    let want = reference(&xs, 5);
    p.set_input(x, &xs).unwrap();
    for i in 0..12 {
        p.compute().unwrap();
        assert_eq!(p.output::<f32>(y).unwrap(), &want[..]);
        if i % 3 == 0 {
            std::thread::sleep(Duration::from_millis(3));
        }
    }
    // A new thread count replaces the pool and its team.
    be.set_n_threads(2).unwrap();
    p.compute().unwrap();
    assert_eq!(p.output::<f32>(y).unwrap(), &want[..]);
}

#[test]
fn a_compute_inside_a_compute_of_the_same_backend_is_an_error_not_a_deadlock() {
    let be = Arc::new(CpuBackend::with_threads(2).unwrap());
    let other = Arc::new(CpuBackend::with_threads(2).unwrap());
    let saw_error = Arc::new(AtomicBool::new(false));
    for (inner_be, same) in [(be.clone(), true), (other, false)] {
        let flag = saw_error.clone();
        let body: quantgraph::CustomFn = Arc::new(move |a| {
            if a.ith == 0 {
                let (mut p, x, y) = chain(&inner_be, 3);
                let xs = input(1);
                p.set_input(x, &xs).unwrap();
                match p.compute() {
                    Ok(()) => {
                        if p.output::<f32>(y).unwrap() != &reference(&xs, 3)[..] {
                            return Err("inner compute gave wrong values".into());
                        }
                    }
                    Err(e) => {
                        if !e.to_string().contains("inside one of its own") {
                            return Err(format!("unexpected inner error: {e}"));
                        }
                        flag.store(true, Ordering::Relaxed);
                    }
                }
            }
            a.dst[..].fill(1.0);
            Ok(())
        });
        let mut g = Graph::new();
        let x = g.input(DType::F32, &[8, 4]).unwrap();
        let y = g.map_custom1(x, "nested", None, body).unwrap();
        g.set_output(y).unwrap();
        let mut p = Plan::new(g, &be).unwrap();
        p.set_input(x, &[0.0f32; 32]).unwrap();
        saw_error.store(false, Ordering::Relaxed);
        p.compute().unwrap();
        assert_eq!(saw_error.load(Ordering::Relaxed), same, "same backend: {same}");
    }
}

#[test]
fn a_panicking_abort_hook_stops_the_compute_and_leaves_the_plan_usable() {
    let be = CpuBackend::with_threads(3).unwrap();
    let (mut p, x, y) = chain(&be, 6);
    let xs = input(4);
    p.set_input(x, &xs).unwrap();
    be.set_abort_hook(Some(Arc::new(|| panic!("hook failed"))));
    assert!(matches!(p.compute(), Err(Error::Aborted)));
    be.set_abort_hook(None);
    p.compute().unwrap();
    assert_eq!(p.output::<f32>(y).unwrap(), &reference(&xs, 6)[..]);
}
