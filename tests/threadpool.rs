//! Thread control: pools shared between backends, poll time, pause and resume, pinning. What
//! the tests wait for (a worker falling asleep) has a generous deadline; nothing is timed.

use quantgraph::backend::{Threadpool, ThreadpoolParams};
use quantgraph::{Backend, CpuBackend, DType, Graph, Plan, TensorId};
use std::time::{Duration, Instant};

fn chain(n: usize) -> (Graph, TensorId, TensorId) {
    let mut g = Graph::new();
    let x = g.input(DType::F32, &[256]).unwrap();
    let mut t = x;
    for _ in 0..n {
        t = g.add(t, x).unwrap();
    }
    g.set_output(t).unwrap();
    (g, x, t)
}

fn run(be: &CpuBackend) -> Vec<f32> {
    let (g, x, y) = chain(20);
    let mut p = Plan::new(g, be).unwrap();
    p.set_input(x, &vec![0.5f32; 256]).unwrap();
    p.compute().unwrap();
    p.output::<f32>(y).unwrap().to_vec()
}

/// Waits (up to 20 s) until `f` holds.
fn eventually(what: &str, f: impl Fn() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < Duration::from_secs(20), "never: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn defaults_are_unchanged() {
    let p = ThreadpoolParams::new(3);
    assert_eq!((p.n_threads, p.poll, p.affinity.len()), (3, Duration::from_micros(300), 0));
    let be = CpuBackend::with_threads(2).unwrap();
    assert_eq!(be.threadpool().n_threads(), 2);
    assert!(!be.threadpool().is_paused());
    assert!(Threadpool::new(&ThreadpoolParams::new(0)).is_err());
}

#[test]
fn one_pool_serves_two_backends_computing_at_once() {
    let pool = Threadpool::new(&ThreadpoolParams::new(2)).unwrap();
    let a = CpuBackend::with_threadpool(&pool).unwrap();
    let b = CpuBackend::with_threadpool(&pool).unwrap();
    let want = vec![10.5f32; 256];
    std::thread::scope(|s| {
        for be in [&a, &b] {
            s.spawn(|| {
                for _ in 0..20 {
                    assert_eq!(run(be), want);
                }
            });
        }
    });
    // set_n_threads detaches one backend onto a pool of its own; the other keeps the shared one.
    a.set_n_threads(3).unwrap();
    assert_eq!((a.n_threads(), b.n_threads(), pool.n_threads()), (3, 2, 2));
    assert_eq!(run(&a), want);
    assert_eq!(run(&b), want);
}

#[test]
fn a_paused_pool_sleeps_at_once_and_still_computes() {
    // Workers poll for a minute after a compute unless the pool is paused.
    let pool = Threadpool::new(&ThreadpoolParams::new(2).poll(Duration::from_secs(60))).unwrap();
    let be = CpuBackend::with_threadpool(&pool).unwrap();
    let want = vec![10.5f32; 256];
    assert_eq!(run(&be), want);
    assert_eq!(pool.n_sleeping(), 0, "the worker polls after a compute");
    pool.pause();
    eventually("the paused pool's worker sleeps", || pool.n_sleeping() == 1);
    assert_eq!(run(&be), want, "a paused pool computes");
    eventually("it sleeps again right after", || pool.n_sleeping() == 1);
    pool.resume();
    assert_eq!(run(&be), want);
    assert_eq!(pool.n_sleeping(), 0, "resumed: it polls again");
    // A zero poll time sleeps after every compute without pausing.
    pool.set_poll(Duration::ZERO);
    assert_eq!(run(&be), want);
    eventually("a zero poll time sleeps at once", || pool.n_sleeping() == 1);
    assert_eq!(run(&be), want);
}

#[test]
fn pinned_pools_compute_the_same() {
    let cpus = num_cpus();
    let params = ThreadpoolParams::new(2).affinity((0..cpus).rev().collect());
    let be = CpuBackend::with_params(&params).unwrap();
    assert_eq!(run(&be), vec![10.5f32; 256]);
    assert!(format!("{:?}", be.threadpool()).contains("affinity"));
    // set_n_threads keeps the pinning and poll time.
    be.set_n_threads(3).unwrap();
    assert_eq!(be.threadpool().n_threads(), 3);
    assert!(format!("{:?}", be.threadpool()).contains(&format!("{:?}", params.affinity)));
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
