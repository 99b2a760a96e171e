//! `vec_dot` per type at n = 4096, every ISA tier this CPU has side by side
//! (`vec_dot/q4_0/avx2/4096` beside `vec_dot/q4_0/scalar/4096`: the kernel through a
//! `VecDotKernel` bound once, like ggml's harness; `.../avx2-api/4096`: through `vec_dot_with`, with
//! its per-call checks), on weights made by the reference
//! quantizer and activations made by the CPU converter, as a matmul row sees them.
//!
//! Every type with a vec_dot kernel: the float, legacy, K-quant, low-bit, ternary and IQ formats.
//!
//! `cargo bench --bench vec_dot -- q4_0` runs one type.

use criterion::{BenchmarkId, Criterion, Throughput, black_box, criterion_group, criterion_main};
use quantgraph::DType;
use quantgraph::kernels::{Isa, VecDotKernel, vec_dot_with};
use quantgraph::quant::{quantize, quantize_for_dot, quantize_with_imatrix};
use quantgraph::testdata::rand_f32;
use std::time::Duration;

const N: usize = 4096;

const TYPES: [DType; 28] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::MXFP4,
    DType::NVFP4,
    DType::Q1_0,
    DType::Q2_0,
    DType::TQ1_0,
    DType::TQ2_0,
    DType::Q2_K,
    DType::Q3_K,
    DType::Q4_K,
    DType::Q5_K,
    DType::Q6_K,
    DType::IQ2_XXS,
    DType::IQ2_XS,
    DType::IQ2_S,
    DType::IQ3_XXS,
    DType::IQ3_S,
    DType::IQ1_S,
    DType::IQ1_M,
    DType::IQ4_NL,
    DType::IQ4_XS,
];

fn operands(dtype: DType) -> (Vec<u8>, Vec<u8>) {
    let (x, y) = (rand_f32(N, 1), rand_f32(N, 2));
    let mut xq = vec![0u8; dtype.row_size(N).unwrap()];
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => quantize_for_dot(dtype, &x, &mut xq).unwrap(),
        // These three need an importance matrix: a uniform one, as the `bench` example's `vec-dot` does.
        DType::IQ1_S | DType::IQ2_XXS | DType::IQ2_XS => {
            quantize_with_imatrix(dtype, &x, N, &vec![1.0; N], &mut xq).unwrap()
        }
        _ => quantize(dtype, &x, &mut xq).unwrap(),
    }
    let vd = dtype.vec_dot_type();
    let mut yq = vec![0u8; vd.row_size(N).unwrap()];
    quantize_for_dot(vd, &y, &mut yq).unwrap();
    (xq, yq)
}

fn vec_dot(c: &mut Criterion) {
    for dtype in TYPES {
        let (xq, yq) = operands(dtype);
        let mut group = c.benchmark_group(format!("vec_dot/{}", dtype.name()));
        group.throughput(Throughput::Elements(N as u64));
        for isa in Isa::ALL.into_iter().filter(|i| i.is_supported()) {
            // The tier's kernel bound once (lengths checked at bind time), as ggml's harness calls
            // `type_traits_cpu[t].vec_dot`; `api` beside it goes through the public entry point
            // (`vec_dot_with`: table lookup and length checks on every call).
            let k = VecDotKernel::new(isa, dtype, N).unwrap();
            group.bench_with_input(BenchmarkId::new(isa.name(), N), &k, |b, k| {
                b.iter(|| k.dot(black_box(&xq), black_box(&yq)).unwrap())
            });
            group.bench_with_input(
                BenchmarkId::new(format!("{}-api", isa.name()), N),
                &isa,
                |b, &isa| {
                    b.iter(|| vec_dot_with(isa, dtype, N, black_box(&xq), black_box(&yq)).unwrap())
                },
            );
        }
        group.finish();
    }
}

criterion_group! {
    name = benches;
    // Short runs: the machine is shared; compare tiers measured together.
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20);
    targets = vec_dot
}
criterion_main!(benches);
