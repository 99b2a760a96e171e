//! The i-quants against ggml: golden bytes, floats and dot products (tests/data/golden, made by ggml
//! itself), ggml's test-quantize-fns error limits, imatrix-only types, and rows that must not panic.

mod common;

use common::{QuantCase, quant_case, quant_rows, quant_x, rand_f32};
use quantgraph::{DType, quant};

/// The IQ types with golden data (ggml quantizes them without an importance matrix).
const GOLDEN: [&str; 6] = ["iq1_m", "iq2_s", "iq3_s", "iq3_xxs", "iq4_nl", "iq4_xs"];
/// The IQ types ggml only quantizes with an importance matrix.
const IMATRIX_ONLY: [DType; 3] = [DType::IQ2_XXS, DType::IQ2_XS, DType::IQ1_S];
const ALL_IQ: [DType; 9] = [
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

fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

fn check_quantize(name: &str) {
    let c = quant_case(name);
    let x = quant_x();
    let mut q = vec![0u8; c.q.len()];
    quant::quantize(c.dtype, &x, &mut q).unwrap();
    assert_eq!(q.len(), c.q.len());
    if let Some(i) = first_diff(&q, &c.q) {
        let row = c.dtype.row_size(quant_rows().1).unwrap();
        panic!(
            "{name}: byte {i} (row {}, offset {}) is {:#04x}, ggml wrote {:#04x}",
            i / row,
            i % row,
            q[i],
            c.q[i]
        );
    }
}

fn check_dequantize(name: &str) {
    let c = quant_case(name);
    let mut y = vec![0f32; c.deq.len()];
    quant::dequantize(c.dtype, &c.q, &mut y).unwrap();
    for (i, (a, b)) in y.iter().zip(&c.deq).enumerate() {
        assert_eq!(a.to_bits(), b.to_bits(), "{name}: element {i}: {a} vs ggml {b}");
    }
}

fn check_vec_dot(c: &QuantCase, name: &str, dot: impl Fn(usize, &[u8], &[u8]) -> f32) {
    let (rows, n) = quant_rows();
    let xr = c.dtype.row_size(n).unwrap();
    let yr = c.vec_dot_type.row_size(n).unwrap();
    assert_eq!(c.vec_dot.len(), rows);
    for r in 0..rows {
        let got = dot(n, &c.q[r * xr..(r + 1) * xr], &c.y_q[r * yr..(r + 1) * yr]);
        let want = c.vec_dot[r];
        let tol = (1e-4 * want.abs()).max(1e-6);
        assert!((got - want).abs() <= tol, "{name} row {r}: {got} vs ggml {want}");
    }
}

#[test]
fn golden_set_has_every_listed_type() {
    let types = common::quant_types();
    for name in GOLDEN {
        assert!(types.iter().any(|t| t == name), "{name} missing from the golden set");
    }
}

#[test]
fn iq4_nl_quantize_matches_ggml_bytes() {
    check_quantize("iq4_nl");
}

#[test]
fn iq4_nl_cpu_from_float_matches_ggml_bytes() {
    let c = quant_case("iq4_nl");
    let want = c.q_cpu.as_ref().expect("iq4_nl has q_cpu");
    let mut q = vec![0u8; want.len()];
    quant::quantize_for_dot(DType::IQ4_NL, &quant_x(), &mut q).unwrap();
    assert_eq!(first_diff(&q, want), None);
}

#[test]
fn iq4_xs_quantize_matches_ggml_bytes() {
    check_quantize("iq4_xs");
}

#[test]
fn iq3_xxs_quantize_matches_ggml_bytes() {
    check_quantize("iq3_xxs");
}

#[test]
fn iq3_s_quantize_matches_ggml_bytes() {
    check_quantize("iq3_s");
}

#[test]
fn iq2_s_quantize_matches_ggml_bytes() {
    check_quantize("iq2_s");
}

#[test]
fn iq1_m_quantize_matches_ggml_bytes() {
    check_quantize("iq1_m");
}

#[test]
fn golden_dequantize_is_bit_exact() {
    for name in GOLDEN {
        check_dequantize(name);
    }
}

#[test]
fn golden_vec_dot_matches_ggml() {
    for name in GOLDEN {
        let c = quant_case(name);
        check_vec_dot(&c, name, |n, x, y| quant::vec_dot(c.dtype, n, x, y).unwrap());
    }
}

#[test]
fn vec_dot_accepts_unaligned_slices() {
    for name in GOLDEN {
        let c = quant_case(name);
        check_vec_dot(&c, name, |n, x, y| {
            let mut xs = vec![0u8; x.len() + 1];
            xs[1..].copy_from_slice(x);
            let mut ys = vec![0u8; y.len() + 3];
            ys[3..].copy_from_slice(y);
            quant::vec_dot(c.dtype, n, &xs[1..], &ys[3..]).unwrap()
        });
    }
}
