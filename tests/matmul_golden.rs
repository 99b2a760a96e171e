//! mul_mat against ggml's own outputs (tests/data/golden/matmul): every type in the golden set,
//! A [K, M] in that type, B [K, N] F32, within NMSE 1e-6 of ggml's C, on every SIMD tier.

mod common;

use common::{MatmulCase, matmul_cases, nmse};
use quantgraph::{Buffer, CpuBackend, Graph, Isa, Plan};

/// NMSE of our mul_mat against ggml's C for one golden case, with A stored in `buf`.
fn golden_nmse(c: &MatmulCase, buf: &Buffer) -> f64 {
    let mut g = Graph::new();
    let a = g.weight(c.dtype, &[c.k, c.m], buf, 0).unwrap();
    let b = g.input(quantgraph::DType::F32, &[c.k, c.n]).unwrap();
    let y = g.mul_mat(a, b).unwrap();
    g.set_output(y).unwrap();
    let mut p = Plan::new(g, &CpuBackend::with_threads(2).unwrap()).unwrap();
    p.set_input(b, &c.b).unwrap();
    p.compute().unwrap();
    let want: Vec<f64> = c.c.iter().map(|&v| v as f64).collect();
    nmse(p.output::<f32>(y).unwrap(), &want)
}

#[test]
fn mul_mat_matches_ggml_golden_outputs_on_every_tier() {
    let cases = matmul_cases();
    assert!(cases.len() >= 20, "golden set has {} cases", cases.len());
    for isa in Isa::ALL.into_iter().filter(|i| i.is_supported()) {
        quantgraph::kernels::set_isa(isa).unwrap();
        for c in &cases {
            let e = golden_nmse(c, &Buffer::from_host(c.a.clone()));
            assert!(e < 1e-6, "{} on {}: nmse {e}", c.dtype, isa.name());
        }
    }
    quantgraph::kernels::set_isa(Isa::best()).unwrap();
}

/// The same golden cases with the weights in the CPU_REPACK buffer type, for every case whose
/// type and shape it takes (m a multiple of 8), on every tier.
#[test]
fn repacked_mul_mat_matches_ggml_golden_outputs() {
    use quantgraph::{BufferType, CpuRepackBufferType};
    let buft = CpuRepackBufferType;
    let mut covered = Vec::new();
    for isa in Isa::ALL.into_iter().filter(|i| i.is_supported()) {
        quantgraph::kernels::set_isa(isa).unwrap();
        for c in matmul_cases() {
            if !buft.supports_tensor(c.dtype, &[c.k, c.m]) {
                continue;
            }
            let buf = buft.alloc(c.a.len()).unwrap();
            buf.set_tensor(0, c.dtype, &[c.k, c.m], &c.a).unwrap();
            let e = golden_nmse(&c, &buf);
            assert!(e < 1e-6, "repacked {} on {}: nmse {e}", c.dtype, isa.name());
            covered.push(c.dtype);
        }
    }
    quantgraph::kernels::set_isa(Isa::best()).unwrap();
    assert!(!covered.is_empty(), "no golden case fits the repacked layout");
    eprintln!("repacked golden cases: {covered:?}");
}
