//! Per-node executor overhead: a chain of 1000 adds of 64-element F32 tensors (the graph ggml's
//! own per-node cost was measured on), with 1 and 2 threads; and graph build + plan of that chain.

use criterion::{BenchmarkId, Criterion, Throughput, black_box, criterion_group, criterion_main};
use quantgraph::{CpuBackend, DType, Graph, Plan};

fn chain(nodes: usize) -> (Graph, quantgraph::TensorId) {
    let mut g = Graph::with_capacity(nodes + 1);
    let x = g.input(DType::F32, &[64]).unwrap();
    let mut t = x;
    for _ in 0..nodes {
        t = g.add(t, x).unwrap();
    }
    g.set_output(t).unwrap();
    (g, x)
}

fn node_overhead(c: &mut Criterion) {
    let mut group = c.benchmark_group("node_overhead");
    group.throughput(Throughput::Elements(1000));
    for threads in [1usize, 2] {
        let be = CpuBackend::with_threads(threads).unwrap();
        let (g, x) = chain(1000);
        let mut plan = Plan::new(g, &be).unwrap();
        plan.set_input(x, &[0.5f32; 64]).unwrap();
        group.bench_with_input(BenchmarkId::new("add_chain_1000", threads), &threads, |b, _| {
            b.iter(|| plan.compute().unwrap())
        });
    }
    group.finish();
    let be = CpuBackend::with_threads(1).unwrap();
    c.bench_function("plan_overhead/add_chain_1000", |b| {
        b.iter(|| {
            let (g, _) = chain(1000);
            black_box(Plan::new(g, &be).unwrap())
        })
    });
}

criterion_group!(benches, node_overhead);
criterion_main!(benches);
