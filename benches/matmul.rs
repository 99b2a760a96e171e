//! `mul_mat` on one plan per (type, columns): decode (N = 1, the dot-product path) and prefill
//! (N = 64, the GEMM path) of a 1024 x 4096 weight matrix, 2 threads, in GFLOPS (criterion's
//! element throughput counts multiply-adds x 2). The one-line `bench` example's `matmul` runs any
//! shape.
//!
//! `cargo bench --bench matmul -- q4_0` runs one type.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use quantgraph::testdata::rand_f32;
use quantgraph::{Buffer, CpuBackend, DType, Graph, Plan};
use std::time::Duration;

const M: usize = 1024;
const K: usize = 4096;

const TYPES: [DType; 8] = [
    DType::F32,
    DType::F16,
    DType::Q4_0,
    DType::Q8_0,
    DType::Q4_K,
    DType::Q6_K,
    DType::IQ4_XS,
    DType::MXFP4,
];

fn plan(ty: DType, n: usize, be: &CpuBackend) -> quantgraph::Result<Plan> {
    let w = rand_f32(M * K, 1);
    let mut bytes = vec![0u8; ty.row_size(K)? * M];
    match ty {
        DType::F32 => bytes.copy_from_slice(bytemuck::cast_slice(&w)),
        DType::F16 => quantgraph::quant::quantize_for_dot(ty, &w, &mut bytes)?,
        _ => quantgraph::quant::quantize(ty, &w, &mut bytes)?,
    }
    let buf = Buffer::from_host(bytes);
    let mut g = Graph::new();
    let a = g.weight(ty, &[K, M], &buf, 0)?;
    let x = g.input(DType::F32, &[K, n])?;
    let y = g.mul_mat(a, x)?;
    g.set_output(y).unwrap();
    let mut p = Plan::new(g, be)?;
    p.set_input(x, &rand_f32(K * n, 2))?;
    Ok(p)
}

fn bench(c: &mut Criterion) {
    let be = CpuBackend::with_threads(2).expect("backend");
    let mut group = c.benchmark_group("mul_mat");
    group.measurement_time(Duration::from_secs(2)).warm_up_time(Duration::from_millis(300));
    for ty in TYPES {
        for n in [1usize, 64] {
            let mut p = plan(ty, n, &be).expect("plan");
            group.throughput(Throughput::Elements((2 * M * K * n) as u64));
            group.bench_with_input(BenchmarkId::new(ty.name(), format!("n{n}")), &n, |b, _| {
                b.iter(|| p.compute().expect("compute"))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
