//! `node-overhead` and `plan-overhead`: the fixed cost per node of a compute and of building a plan,
//! on a chain of small adds.

use crate::measure::median;
use quantgraph::testdata::rand_f32;
use quantgraph::{CpuBackend, DType, Graph, Plan};
use std::time::Instant;

/// A chain of `nodes` adds of 64-element F32 tensors (the graph ggml's overhead was measured on).
fn chain(nodes: usize) -> quantgraph::Result<(Graph, quantgraph::TensorId, quantgraph::TensorId)> {
    let mut g = Graph::with_capacity(nodes + 2);
    let x = g.input(DType::F32, &[64])?;
    let mut t = x;
    for _ in 0..nodes {
        t = g.add(t, x)?;
    }
    g.set_output(t)?;
    Ok((g, x, t))
}

/// Median microseconds per node of computing the chain, after 20 warm-up computes.
pub fn node_overhead(nodes: usize, threads: usize) -> quantgraph::Result<()> {
    let be = CpuBackend::with_threads(threads)?;
    let (g, x, _) = chain(nodes)?;
    let mut plan = Plan::new(g, &be)?;
    plan.set_input(x, &rand_f32(64, 1))?;
    for _ in 0..20 {
        plan.compute()?;
    }
    let mut times = Vec::new();
    for _ in 0..200 {
        let t0 = Instant::now();
        plan.compute()?;
        times.push(t0.elapsed().as_secs_f64());
    }
    let us = median(times) * 1e6 / nodes as f64;
    println!("quantgraph node_overhead nodes={nodes} threads={threads} median_us_per_node={us:.3}");
    Ok(())
}

/// Median microseconds to build the chain and plan it on one thread.
pub fn plan_overhead(nodes: usize) -> quantgraph::Result<()> {
    let be = CpuBackend::with_threads(1)?;
    let mut times = Vec::new();
    for _ in 0..200 {
        let t0 = Instant::now();
        let (g, _, _) = chain(nodes)?;
        let plan = Plan::new(g, &be)?;
        std::hint::black_box(&plan);
        times.push(t0.elapsed().as_secs_f64());
    }
    println!("quantgraph plan_overhead nodes={nodes} median_us={:.1}", median(times) * 1e6);
    Ok(())
}
