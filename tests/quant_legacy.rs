//! The float, legacy, FP4, low-bit and ternary formats against ggml: golden bytes produced by ggml
//! itself, ggml's test-quantize-fns limits, importance-matrix semantics, edge inputs and argument
//! errors.

mod common;

use common::QUANTIZABLE;
use quantgraph::DType;
use quantgraph::quant::{dequantize, quantize, quantize_for_dot, quantize_with_imatrix, vec_dot};
use quantgraph::testdata::{generate_data, rand_f32};

/// Every type this module implements that the golden set covers.
const GOLDEN_TYPES: [&str; 14] = [
    "f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "mxfp4", "nvfp4", "q1_0", "q2_0",
    "tq1_0", "tq2_0",
];

/// The vec-dot types whose `from_float` lives here.
const OWN_VEC_DOT_TYPES: [DType; 5] =
    [DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q8_1];

fn quantized(dtype: DType, x: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; dtype.row_size(x.len()).unwrap()];
    quantize(dtype, x, &mut q).unwrap();
    q
}

fn dequantized(dtype: DType, q: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; n];
    dequantize(dtype, q, &mut out).unwrap();
    out
}

fn for_dot(dtype: DType, x: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; dtype.row_size(x.len()).unwrap()];
    quantize_for_dot(dtype, x, &mut q).unwrap();
    q
}

fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

// ------------------------------------------------------------------------------------------------
// Golden vectors

#[test]
fn golden_quantize_bytes_match_ggml() {
    let x = common::quant_x();
    for name in GOLDEN_TYPES {
        let case = common::quant_case(name);
        let got = quantized(case.dtype, &x);
        assert_eq!(got.len(), case.q.len(), "{name}");
        assert!(got == case.q, "{name}: first differing byte {:?}", first_diff(&got, &case.q));
    }
}

#[test]
fn golden_dequantize_is_bit_exact() {
    let (rows, n) = common::quant_rows();
    for name in GOLDEN_TYPES {
        let case = common::quant_case(name);
        let got = dequantized(case.dtype, &case.q, rows * n);
        for (i, (g, w)) in got.iter().zip(&case.deq).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{name} element {i}: {g} vs {w}");
        }
    }
}

#[test]
fn golden_activation_conversion_matches_ggml_cpu() {
    let y = common::quant_y();
    let mut seen = Vec::new();
    for name in GOLDEN_TYPES {
        let case = common::quant_case(name);
        if !OWN_VEC_DOT_TYPES.contains(&case.vec_dot_type) {
            continue;
        }
        let got = for_dot(case.vec_dot_type, &y);
        assert!(
            got == case.y_q,
            "{name} -> {}: first differing byte {:?}",
            case.vec_dot_type,
            first_diff(&got, &case.y_q)
        );
        seen.push(case.vec_dot_type);
    }
    for t in OWN_VEC_DOT_TYPES {
        assert!(seen.contains(&t), "no golden activation data exercised {t}");
    }
}

#[test]
fn golden_vec_dot_matches_ggml() {
    let (rows, n) = common::quant_rows();
    for name in GOLDEN_TYPES {
        let case = common::quant_case(name);
        let xr = case.dtype.row_size(n).unwrap();
        let yr = case.vec_dot_type.row_size(n).unwrap();
        assert_eq!(case.vec_dot.len(), rows);
        for r in 0..rows {
            let got = vec_dot(
                case.dtype,
                n,
                &case.q[r * xr..(r + 1) * xr],
                &case.y_q[r * yr..(r + 1) * yr],
            )
            .unwrap();
            let want = case.vec_dot[r];
            let tol = (want.abs() * 1e-4).max(1e-6);
            assert!((got - want).abs() <= tol, "{name} row {r}: {got} vs ggml {want}");
        }
    }
}

/// The plain-float dots follow ggml's AVX2 accumulation order, so they reproduce its bits.
#[test]
fn golden_float_vec_dot_is_bit_exact() {
    let (rows, n) = common::quant_rows();
    for name in ["f32", "f16", "bf16"] {
        let case = common::quant_case(name);
        let xr = case.dtype.row_size(n).unwrap();
        for r in 0..rows {
            let got = vec_dot(
                case.dtype,
                n,
                &case.q[r * xr..(r + 1) * xr],
                &case.y_q[r * xr..(r + 1) * xr],
            )
            .unwrap();
            assert_eq!(got.to_bits(), case.vec_dot[r].to_bits(), "{name} row {r}");
        }
    }
}

// ------------------------------------------------------------------------------------------------
// ggml's tests/test-quantize-fns.cpp

const MAX_QUANTIZATION_REFERENCE_ERROR: f32 = 0.0001;
const MAX_QUANTIZATION_TOTAL_ERROR: f32 = 0.002;
const MAX_QUANTIZATION_TOTAL_ERROR_BINARY: f32 = 0.025;
const MAX_QUANTIZATION_TOTAL_ERROR_TERNARY: f32 = 0.01;
const MAX_QUANTIZATION_TOTAL_ERROR_FP4: f32 = 0.0030;
const MAX_DOT_PRODUCT_ERROR: f32 = 0.02;
const MAX_DOT_PRODUCT_ERROR_FP4: f32 = 0.03;
const MAX_DOT_PRODUCT_ERROR_BINARY: f32 = 0.40;
const MAX_DOT_PRODUCT_ERROR_TERNARY: f32 = 0.15;

/// `array_rmse`: sqrt of the summed squared differences, divided by n (ggml's definition).
fn array_rmse(a: &[f32], b: &[f32]) -> f32 {
    let sum: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    (sum as f32).sqrt() / a.len() as f32
}

fn dot_product(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x * y) as f64).sum::<f64>() as f32
}

/// ggml's `from_float` of the CPU backend: the activation converters for vec-dot types, the
/// reference quantizer otherwise.
fn cpu_from_float(dtype: DType, x: &[f32]) -> Vec<u8> {
    if OWN_VEC_DOT_TYPES.contains(&dtype) { for_dot(dtype, x) } else { quantized(dtype, x) }
}

/// ggml's `quantize_row_q8_K_ref`, only to make activations for the ternary dot test (the Q8_K
/// converter belongs to the K-quant module).
fn q8_k_for_test(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for xb in x.chunks_exact(256) {
        let (mut max, mut amax) = (0.0f32, 0.0f32);
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        let iscale = -127.0 / max;
        let qs: Vec<i8> = xb
            .iter()
            .map(|&v| {
                (((iscale * v + 12582912.0).to_bits() as i32 & 0x7f_ffff) - 0x40_0000).min(127)
                    as i8
            })
            .collect();
        out.extend_from_slice(&(1.0 / iscale).to_le_bytes());
        out.extend(qs.iter().map(|&q| q as u8));
        for c in qs.chunks(16) {
            let s: i32 = c.iter().map(|&q| q as i32).sum();
            out.extend_from_slice(&(s as i16).to_le_bytes());
        }
    }
    out
}

#[test]
fn ggml_test_quantize_fns_limits() {
    const N: usize = 32 * 128;
    let data = generate_data(0.0, N);
    let data2 = generate_data(1.0, N);
    for dtype in QUANTIZABLE {
        let cpu = cpu_from_float(dtype, &data);
        let out = dequantized(dtype, &cpu, N);
        let total = array_rmse(&data, &out);
        let max_total = match dtype {
            DType::Q1_0 => MAX_QUANTIZATION_TOTAL_ERROR_BINARY,
            DType::TQ1_0 | DType::TQ2_0 | DType::Q2_0 => MAX_QUANTIZATION_TOTAL_ERROR_TERNARY,
            DType::NVFP4 => MAX_QUANTIZATION_TOTAL_ERROR_FP4,
            _ => MAX_QUANTIZATION_TOTAL_ERROR,
        };
        assert!(total < max_total, "{dtype} absolute quantization error {total}");

        let out_ref = dequantized(dtype, &quantized(dtype, &data), N);
        let reference = array_rmse(&out, &out_ref);
        assert!(
            reference < MAX_QUANTIZATION_REFERENCE_ERROR,
            "{dtype} reference error {reference}"
        );

        let vdt = dtype.vec_dot_type();
        let y = if vdt == DType::Q8_K { q8_k_for_test(&data2) } else { for_dot(vdt, &data2) };
        let result = vec_dot(dtype, N, &cpu, &y).unwrap();
        let err = (result - dot_product(&data, &data2)).abs() / N as f32;
        let max_dot = match dtype {
            DType::Q1_0 => MAX_DOT_PRODUCT_ERROR_BINARY,
            DType::TQ1_0 | DType::TQ2_0 | DType::Q2_0 => MAX_DOT_PRODUCT_ERROR_TERNARY,
            DType::NVFP4 => MAX_DOT_PRODUCT_ERROR_FP4,
            _ => MAX_DOT_PRODUCT_ERROR,
        };
        assert!(err < max_dot, "{dtype} dot product error {err}");
    }
}

/// Q8_0's CPU converter (AVX2 rounding) stays within ggml's reference-error limit of the reference
/// quantizer, as test-quantize-fns checks.
#[test]
fn q8_0_cpu_converter_close_to_reference() {
    const N: usize = 32 * 128;
    let data = generate_data(0.0, N);
    let a = dequantized(DType::Q8_0, &for_dot(DType::Q8_0, &data), N);
    let b = dequantized(DType::Q8_0, &quantized(DType::Q8_0, &data), N);
    assert!(array_rmse(&a, &b) < MAX_QUANTIZATION_REFERENCE_ERROR);
}

#[test]
fn ggml_test_vec_dot_f32_odd_lengths() {
    for n in [1usize, 2, 3, 5, 7, 8, 15, 16, 17, 31, 33, 63, 67, 127, 129, 193, 255, 1023] {
        let a = generate_data(0.0, n);
        let b = generate_data(1.0, n);
        let got =
            vec_dot(DType::F32, n, bytemuck::cast_slice(&a), bytemuck::cast_slice(&b)).unwrap();
        let err = (got - dot_product(&a, &b)).abs() / n as f32;
        assert!(err < MAX_QUANTIZATION_REFERENCE_ERROR, "n={n}: {got} err {err}");
        for t in [DType::F16, DType::BF16] {
            let got = vec_dot(t, n, &for_dot(t, &a), &for_dot(t, &b)).unwrap();
            let err = (got - dot_product(&a, &b)).abs() / n as f32;
            assert!(err < 0.01, "{t} n={n}: {got} err {err}");
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Importance matrix

fn with_imatrix(dtype: DType, x: &[f32], n_per_row: usize, qw: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; dtype.row_size(x.len()).unwrap()];
    quantize_with_imatrix(dtype, x, n_per_row, qw, &mut q).unwrap();
    q
}

#[test]
fn imatrix_changes_bytes_where_ggml_uses_it() {
    let n = 256;
    let x: Vec<f32> = rand_f32(2 * n, 7);
    let qw: Vec<f32> = rand_f32(n, 8).iter().map(|v| v.abs() + 0.01).collect();
    for dtype in [DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1] {
        let plain = quantized(dtype, &x);
        let weighted = with_imatrix(dtype, &x, n, &qw);
        assert_ne!(plain, weighted, "{dtype}: the imatrix path must differ from the reference");
        // Weighted quantization minimises the weighted error, so it does no worse than the
        // reference under those weights.
        let wd = dequantized(dtype, &weighted, 2 * n);
        let pd = dequantized(dtype, &plain, 2 * n);
        let werr = |d: &[f32]| -> f64 {
            d.iter()
                .zip(&x)
                .enumerate()
                .map(|(i, (a, b))| qw[i % n] as f64 * ((a - b) as f64).powi(2))
                .sum()
        };
        assert!(werr(&wd) <= werr(&pd) * 1.02, "{dtype}: {} vs {}", werr(&wd), werr(&pd));
    }
}

/// Scaling every importance weight by a power of two scales every sum in ggml's search exactly,
/// so the chosen quants cannot change.
#[test]
fn imatrix_scaled_by_power_of_two_gives_identical_bytes() {
    let n = 128;
    let x = rand_f32(3 * n, 11);
    let qw: Vec<f32> = rand_f32(n, 12).iter().map(|v| v.abs() + 0.1).collect();
    let qw4: Vec<f32> = qw.iter().map(|v| v * 4.0).collect();
    for dtype in [DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1] {
        assert_eq!(with_imatrix(dtype, &x, n, &qw), with_imatrix(dtype, &x, n, &qw4), "{dtype}");
    }
}

/// ggml ignores `quant_weights` for these types (or, for Q1_0/Q2_0, quantizes row by row with the
/// reference code), so any imatrix gives the reference bytes.
#[test]
fn imatrix_is_ignored_where_ggml_ignores_it() {
    let n = 512;
    let x = rand_f32(2 * n, 3);
    let qw: Vec<f32> = rand_f32(n, 4).iter().map(|v| v * v * 10.0).collect();
    for dtype in [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q8_0,
        DType::MXFP4,
        DType::NVFP4,
        DType::Q1_0,
        DType::Q2_0,
        DType::TQ1_0,
        DType::TQ2_0,
    ] {
        assert_eq!(with_imatrix(dtype, &x, n, &qw), quantized(dtype, &x), "{dtype}");
    }
}

/// Values exactly on a quantization grid: ggml's weighted search keeps the exact scale
/// (Cauchy-Schwarz: no other candidate can beat an exact fit), so the answer is known by hand.
#[test]
fn imatrix_known_answer_on_exact_grid() {
    let qw: Vec<f32> = (0..32).map(|j| 1.0 + j as f32).collect();
    // Q4_0: x = (j % 16 - 8) / 2, first largest |x| is x[0] = -4 -> d = 0.5, codes j % 16.
    let x: Vec<f32> = (0..32).map(|j| ((j % 16) as f32 - 8.0) * 0.5).collect();
    let q = with_imatrix(DType::Q4_0, &x, 32, &qw);
    let mut want = vec![0x00, 0x38]; // f16 0.5
    want.extend((0..16u8).map(|j| j | (j << 4)));
    assert_eq!(q, want);
    assert_eq!(quantized(DType::Q4_0, &x), want);

    // Q5_0: x = (j - 16) / 4 -> x[0] = -4, d = 0.25, codes j.
    let x: Vec<f32> = (0..32).map(|j| (j as f32 - 16.0) * 0.25).collect();
    let q = with_imatrix(DType::Q5_0, &x, 32, &qw);
    let mut want = vec![0x00, 0x34]; // f16 0.25
    want.extend_from_slice(&0xFFFF_0000u32.to_le_bytes()); // bit 4 set for codes 16..31
    want.extend((0..16u8).map(|j| j | (j << 4)));
    assert_eq!(q, want);

    // Q4_1: x = (j % 16) / 4 - 1 -> min -1, d = 0.25, zero weighted error, codes j % 16.
    let x: Vec<f32> = (0..32).map(|j| (j % 16) as f32 * 0.25 - 1.0).collect();
    let q = with_imatrix(DType::Q4_1, &x, 32, &qw);
    let mut want = vec![0x00, 0x34, 0x00, 0xBC]; // d = 0.25, m = -1
    want.extend((0..16u8).map(|j| j | (j << 4)));
    assert_eq!(q, want);
    assert_eq!(quantized(DType::Q4_1, &x), want);
}

#[test]
fn imatrix_rows_are_independent() {
    let n = 64;
    let x = rand_f32(4 * n, 21);
    let qw: Vec<f32> = (0..n).map(|j| 1.0 + (j % 5) as f32).collect();
    for dtype in [DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1] {
        let all = with_imatrix(dtype, &x, n, &qw);
        let rs = dtype.row_size(n).unwrap();
        for r in 0..4 {
            let one = with_imatrix(dtype, &x[r * n..(r + 1) * n], n, &qw);
            assert_eq!(&all[r * rs..(r + 1) * rs], &one[..], "{dtype} row {r}");
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Edge inputs

fn block_len(dtype: DType) -> usize {
    dtype.block_size().max(256)
}

#[test]
fn edge_rows_never_panic_and_roundtrip_sizes() {
    for dtype in QUANTIZABLE {
        let n = block_len(dtype);
        let rows: Vec<Vec<f32>> = vec![
            vec![0.0; n],
            vec![0.3125; n],
            vec![1e-30; n],
            vec![-1e30; n],
            rand_f32(n, 5).iter().map(|v| v * 1e30).collect(),
            rand_f32(n, 6).iter().map(|v| v * 1e-30).collect(),
            (0..n).map(|i| if i % 7 == 0 { f32::NAN } else { i as f32 }).collect(),
            (0..n).map(|i| if i % 5 == 0 { f32::INFINITY } else { -(i as f32) }).collect(),
            vec![f32::NAN; n],
            vec![f32::NEG_INFINITY; n],
            (0..n).map(|i| f32::from_bits(1 + i as u32)).collect(), // subnormals
        ];
        for x in &rows {
            let q = quantized(dtype, x);
            let _ = dequantized(dtype, &q, n);
            let qw = vec![1.0; n];
            let mut q2 = vec![0u8; q.len()];
            quantize_with_imatrix(dtype, x, n, &qw, &mut q2).unwrap();
            let vdt = dtype.vec_dot_type();
            if vdt != DType::Q8_K {
                let y = for_dot(vdt, x);
                let _ = vec_dot(dtype, n, &q, &y).unwrap();
            }
        }
    }
}

#[test]
fn zero_row_quantizes_to_zero() {
    for dtype in QUANTIZABLE {
        let n = block_len(dtype);
        let q = quantized(dtype, &vec![0.0; n]);
        let d = dequantized(dtype, &q, n);
        assert!(d.iter().all(|&v| v == 0.0), "{dtype}: {:?}", &d[..4]);
    }
    // Known bytes: Q4_0 stores d = 0 / -8 = -0.0 (f16 0x8000) and code 8 (0 + 8.5 truncated).
    let q = quantized(DType::Q4_0, &[0.0; 32]);
    assert_eq!(&q[..2], &0x8000u16.to_le_bytes());
    assert!(q[2..].iter().all(|&b| b == 0x88));
}

#[test]
fn q8_0_huge_and_tiny_magnitudes() {
    // 1e30 / 127 overflows f16 to infinity; the quants still use the f32 scale: all 127.
    let q = quantized(DType::Q8_0, &[1e30; 32]);
    assert_eq!(&q[..2], &0x7C00u16.to_le_bytes());
    assert!(q[2..].iter().all(|&b| b == 127));
    // 1e-30 / 127 underflows f16 to zero; again the quants are all 127.
    let q = quantized(DType::Q8_0, &[1e-30; 32]);
    assert_eq!(&q[..2], &[0, 0]);
    assert!(q[2..].iter().all(|&b| b == 127));
    // The AVX2 converter agrees on both.
    assert_eq!(for_dot(DType::Q8_0, &[1e30; 32])[2..], quantized(DType::Q8_0, &[1e30; 32])[2..]);
    assert_eq!(for_dot(DType::Q8_0, &[1e-30; 32])[2..], quantized(DType::Q8_0, &[1e-30; 32])[2..]);
}

#[test]
fn nan_inputs_follow_ggml_arithmetic() {
    let mut x: Vec<f32> = (0..32).map(|i| i as f32 - 16.0).collect();
    x[0] = f32::NAN;
    // Reference: C's MAX(amax, NaN) keeps the NaN only until the next element replaces it, so the
    // scale comes from the other values (|-15| = 15); roundf(NaN) stored to int8_t is 0.
    let q = quantized(DType::Q8_0, &x);
    let d = u16::from_le_bytes([q[0], q[1]]);
    assert_eq!(d, half_bits(15.0 / 127.0));
    assert_eq!(q[2], 0);
    assert_eq!(q[3] as i8, -127); // -15 / d
    // AVX2 converter: maxps drops the NaN the same way; cvtps_epi32(NaN) = INT_MIN saturates to -128.
    let c = for_dot(DType::Q8_0, &x);
    assert_eq!(&c[..2], &q[..2]);
    assert_eq!(c[2] as i8, -128);
    assert_eq!(c[3] as i8, -127);
    // A trailing NaN survives C's MAX: d is NaN (f16 0x7E00) and every quant is 0.
    let mut y = vec![1.0f32; 32];
    y[31] = f32::NAN;
    let q = quantized(DType::Q8_0, &y);
    assert_eq!(u16::from_le_bytes([q[0], q[1]]), 0x7E00);
    assert!(q[2..].iter().all(|&b| b == 0));
    // F16: the reference turns every NaN into 0x7E00 (with sign); F16C keeps the payload.
    let nan = f32::from_bits(0x7FC0_1000 | (0x155 << 13));
    assert_eq!(quantized(DType::F16, &[nan]), 0x7E00u16.to_le_bytes());
    assert_eq!(for_dot(DType::F16, &[nan]), (0x7E00u16 | 0x155).to_le_bytes());
    // Q1_0: NaN >= 0 is false, so its sign bit is 0.
    let mut z = vec![1.0f32; 128];
    z[3] = f32::NAN;
    let q = quantized(DType::Q1_0, &z);
    assert_eq!(q[2], 0b1111_0111);
}

fn half_bits(v: f32) -> u16 {
    let mut q = [0u8; 2];
    quantize(DType::F16, &[v], &mut q).unwrap();
    u16::from_le_bytes(q)
}

#[test]
fn misaligned_buffers_give_the_same_results() {
    let n = 512;
    let x = rand_f32(n, 9);
    let y = rand_f32(n, 10);
    for dtype in QUANTIZABLE {
        let q = quantized(dtype, &x);
        let mut buf = vec![0u8; q.len() + 1];
        quantize(dtype, &x, &mut buf[1..]).unwrap();
        assert_eq!(&buf[1..], &q[..], "{dtype} quantize into odd address");
        let want = dequantized(dtype, &q, n);
        let mut out = vec![0.0f32; n];
        dequantize(dtype, &buf[1..], &mut out).unwrap();
        assert_eq!(out, want, "{dtype} dequantize from odd address");
        let vdt = dtype.vec_dot_type();
        if vdt != DType::Q8_K {
            let yq = for_dot(vdt, &y);
            let mut ybuf = vec![0u8; yq.len() + 1];
            quantize_for_dot(vdt, &y, &mut ybuf[1..]).unwrap();
            assert_eq!(&ybuf[1..], &yq[..]);
            let a = vec_dot(dtype, n, &q, &yq).unwrap();
            let b = vec_dot(dtype, n, &buf[1..], &ybuf[1..]).unwrap();
            assert_eq!(a.to_bits(), b.to_bits(), "{dtype} vec_dot from odd address");
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Argument errors

#[test]
fn wrong_lengths_are_errors() {
    for dtype in QUANTIZABLE {
        let bs = dtype.block_size();
        let n = block_len(dtype);
        let x = vec![0.5f32; n];
        let rs = dtype.row_size(n).unwrap();
        // destination too short / too long
        assert!(quantize(dtype, &x, &mut vec![0u8; rs - 1]).is_err(), "{dtype}");
        assert!(quantize(dtype, &x, &mut vec![0u8; rs + 1]).is_err(), "{dtype}");
        // not a whole number of blocks
        if bs > 1 {
            let mut out = vec![0u8; rs];
            assert!(quantize(dtype, &x[..n - 1], &mut out).is_err(), "{dtype}");
            assert!(dequantize(dtype, &out[..rs - 1], &mut vec![0.0; n]).is_err(), "{dtype}");
        }
        assert!(dequantize(dtype, &vec![0u8; rs], &mut vec![0.0; n + bs]).is_err(), "{dtype}");
        // imatrix of the wrong length, rows that do not divide the input
        let mut out = vec![0u8; rs];
        assert!(quantize_with_imatrix(dtype, &x, n, &vec![1.0; n - 1], &mut out).is_err());
        assert!(quantize_with_imatrix(dtype, &x, n - 1, &vec![1.0; n - 1], &mut out).is_err());
        assert!(quantize_with_imatrix(dtype, &x, 0, &[], &mut out).is_err());
        // vec_dot with mismatched lengths
        let vdt = dtype.vec_dot_type();
        let yr = vdt.row_size(n).unwrap();
        assert!(vec_dot(dtype, n, &vec![0u8; rs], &vec![0u8; yr - 1]).is_err(), "{dtype}");
        assert!(vec_dot(dtype, n, &vec![0u8; rs + 1], &vec![0u8; yr]).is_err(), "{dtype}");
        if bs > 1 {
            assert!(vec_dot(dtype, n - 1, &vec![0u8; rs], &vec![0u8; yr]).is_err(), "{dtype}");
        }
    }
}

#[test]
fn activation_only_and_weight_only_types_are_refused() {
    let x = vec![0.0f32; 32];
    // Q8_1 is only an activation type: ggml neither quantizes nor dequantizes it.
    assert!(quantize(DType::Q8_1, &x, &mut [0u8; 36]).is_err());
    assert!(dequantize(DType::Q8_1, &[0u8; 36], &mut [0.0; 32]).is_err());
    assert!(vec_dot(DType::Q8_1, 32, &[0u8; 36], &[0u8; 36]).is_err());
    assert!(quantize_for_dot(DType::Q8_1, &x, &mut [0u8; 36]).is_ok());
    // Weight formats are not activation types.
    for dtype in [DType::Q4_0, DType::Q5_1, DType::MXFP4, DType::TQ2_0, DType::Q1_0] {
        let n = block_len(dtype);
        let mut out = vec![0u8; dtype.row_size(n).unwrap()];
        assert!(quantize_for_dot(dtype, &vec![0.0; n], &mut out).is_err(), "{dtype}");
    }
    assert!(quantize_for_dot(DType::Q8_0, &x[..31], &mut [0u8; 34]).is_err());
}

#[test]
fn empty_input_is_fine() {
    for dtype in QUANTIZABLE {
        quantize(dtype, &[], &mut []).unwrap();
        dequantize(dtype, &[], &mut []).unwrap();
        assert_eq!(vec_dot(dtype, 0, &[], &[]).unwrap(), 0.0);
    }
}

/// Known bytes for a constant row, worked out from ggml's reference code.
#[test]
fn constant_rows_known_bytes() {
    let c = 0.3125f32; // f16 0x3500, exact
    let d = 0x3500u16.to_le_bytes();
    let block = |dtype: DType| quantized(dtype, &vec![c; dtype.block_size()]);
    // Q2_0: round(1) + 1 = 2 in every 2-bit field.
    assert_eq!(block(DType::Q2_0), [&d[..], &[0xAA; 16]].concat());
    // Q1_0: d = mean |x| = c, every sign bit set.
    assert_eq!(block(DType::Q1_0), [&d[..], &[0xFF; 16]].concat());
    // TQ2_0: trit +1 stored as 2 in each of four fields.
    assert_eq!(block(DType::TQ2_0), [&[0xAA; 64][..], &d[..]].concat());
    // TQ1_0: five trits of 2 = 242 -> ceil(242 * 256 / 243) = 255; four trits then a zero digit:
    // 80 * 3 = 240 -> ceil(240 * 256 / 243) = 253.
    assert_eq!(block(DType::TQ1_0), [&[255u8; 48][..], &[253; 4], &d[..]].concat());
    // Negative constants land on trit -1, code 0.
    assert_eq!(quantized(DType::TQ2_0, &[-c; 256])[..64], [0u8; 64]);
    assert_eq!(quantized(DType::Q2_0, &[-c; 64])[2..], [0u8; 16]);
    // Dequantizing gives the constant back for all of them.
    for dtype in [DType::Q2_0, DType::Q1_0, DType::TQ2_0, DType::TQ1_0] {
        let n = dtype.block_size();
        assert!(dequantized(dtype, &block(dtype), n).iter().all(|&v| v == c), "{dtype}");
    }
}

/// MXFP4's shared exponent and NVFP4's UE4M3 scale at extreme magnitudes.
#[test]
fn fp4_extreme_magnitudes_known_bytes() {
    // 1e-30: floor(log2) = -100 -> e = 25, d = 2^-103; 1e-30 / d = 10.1 is nearest to 12 (code 7).
    let q = quantized(DType::MXFP4, &[1e-30; 32]);
    assert_eq!(q[0], 25);
    assert!(q[1..].iter().all(|&b| b == 0x77));
    assert_eq!(dequantized(DType::MXFP4, &q, 32)[0], 12.0 * 2f32.powi(-103));
    // 1e30: floor(log2) = 99 -> e = 224, d = 2^96; 1e30 / d = 12.6 -> code 7.
    let q = quantized(DType::MXFP4, &[1e30; 32]);
    assert_eq!(q[0], 224);
    assert!(q[1..].iter().all(|&b| b == 0x77));
    // A subnormal maximum makes `floor(log2) - 2 + 127` negative (-8); ggml converts it straight to
    // uint8_t, which x86 wraps to 248. The values then sit nearest to code 0.
    let q = quantized(DType::MXFP4, &[1e-40; 32]);
    assert_eq!(q[0], 248);
    assert!(q[1..].iter().all(|&b| b == 0));
    // NVFP4 at 1e30: the scale saturates to 0x7E (224 after halving); every candidate's error rounds
    // to 1e30 in f32, so the first code (0) wins.
    let q = quantized(DType::NVFP4, &[1e30; 64]);
    assert_eq!(q[..4], [0x7E; 4]);
    assert!(q[4..].iter().all(|&b| b == 0));
    // A zero maximum gives scale byte 0.
    assert_eq!(quantized(DType::NVFP4, &[0.0; 64])[..4], [0; 4]);
}

// ------------------------------------------------------------------------------------------------
// Known answers from ggml's reference code on edge inputs and with importance matrices
// (tests/data/legacy: outputs of ggml's own ggml-quants.c; see the README there).

const LEGACY_N: usize = 256;

fn legacy_file(name: &str) -> Vec<u8> {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/legacy").join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn legacy_f32(name: &str) -> Vec<f32> {
    legacy_file(name).chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

const EDGE_TYPES: [&str; 11] =
    ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "mxfp4", "nvfp4", "q1_0", "q2_0", "tq1_0", "tq2_0"];

#[test]
fn edge_inputs_match_ggml_reference_bytes() {
    let x = legacy_f32("edge_x.f32");
    for name in EDGE_TYPES {
        let dtype = DType::from_name(name).unwrap();
        let want = legacy_file(&format!("edge.{name}.bin"));
        let got = quantized(dtype, &x);
        let rs = dtype.row_size(LEGACY_N).unwrap();
        for (r, (g, w)) in got.chunks(rs).zip(want.chunks(rs)).enumerate() {
            assert!(g == w, "{name} edge row {r}: first differing byte {:?}", first_diff(g, w));
        }
        let deq = dequantized(dtype, &want, x.len());
        let want_deq = legacy_f32(&format!("edge.{name}.deq.f32"));
        for (i, (g, w)) in deq.iter().zip(&want_deq).enumerate() {
            assert!(g.to_bits() == w.to_bits(), "{name} dequantized element {i}: {g} vs {w}");
        }
    }
}

#[test]
fn imatrix_matches_ggml_reference_bytes() {
    let x = legacy_f32("imat_x.f32");
    let w = legacy_f32("imat_w.f32");
    let edge = legacy_f32("edge_x.f32");
    for name in ["q4_0", "q4_1", "q5_0", "q5_1"] {
        let dtype = DType::from_name(name).unwrap();
        let got = with_imatrix(dtype, &x, LEGACY_N, &w);
        let want = legacy_file(&format!("imat.{name}.bin"));
        assert!(got == want, "{name}: first differing byte {:?}", first_diff(&got, &want));
        assert_ne!(got, quantized(dtype, &x), "{name}: the imatrix must matter here");
        // A uniform imatrix still selects ggml's weighted search (weights sqrt(sigma2 + x^2)), not
        // the reference rounding; any power-of-two level gives the same bytes.
        let ones = with_imatrix(dtype, &x, LEGACY_N, &[1.0; LEGACY_N]);
        let want = legacy_file(&format!("imat_ones.{name}.bin"));
        assert!(
            ones == want,
            "{name} uniform: first differing byte {:?}",
            first_diff(&ones, &want)
        );
        assert_ne!(ones, quantized(dtype, &x), "{name}: uniform imatrix vs reference");
        assert_eq!(ones, with_imatrix(dtype, &x, LEGACY_N, &[0.5; LEGACY_N]), "{name}");
        let got = with_imatrix(dtype, &edge, LEGACY_N, &w);
        let want = legacy_file(&format!("imat_edge.{name}.bin"));
        let rs = dtype.row_size(LEGACY_N).unwrap();
        for (r, (g, w)) in got.chunks(rs).zip(want.chunks(rs)).enumerate() {
            assert!(
                g == w,
                "{name} imatrix edge row {r}: first differing byte {:?}",
                first_diff(g, w)
            );
        }
    }
}

#[test]
fn edge_inputs_match_ggml_cpu_converters() {
    let x = legacy_f32("edge_x.f32");
    for (dtype, file) in [
        (DType::Q8_0, "edge.cpu.q8_0.bin"),
        (DType::Q8_1, "edge.cpu.q8_1.bin"),
        (DType::F16, "edge.cpu.f16.bin"),
        (DType::BF16, "edge.cpu.bf16.bin"),
    ] {
        let want = legacy_file(file);
        let got = for_dot(dtype, &x);
        let rs = dtype.row_size(LEGACY_N).unwrap();
        for (r, (g, w)) in got.chunks(rs).zip(want.chunks(rs)).enumerate() {
            assert!(g == w, "{dtype} edge row {r}: first differing byte {:?}", first_diff(g, w));
        }
    }
    // The reference conversions ggml_quantize_chunk uses.
    assert_eq!(quantized(DType::F16, &x), legacy_file("edge.f16.bin"));
    assert_eq!(quantized(DType::BF16, &x), legacy_file("edge.cpu.bf16.bin"));
}

/// ggml's portable dot products on the edge rows (NaN and infinities included), through the public
/// API (whatever kernel tier is selected).
#[test]
fn edge_vec_dot_matches_ggml_generic() {
    let q8_0 = legacy_file("edge.cpu.q8_0.bin");
    let q8_1 = legacy_file("edge.cpu.q8_1.bin");
    let q8_k = legacy_file("edge.q8_K.bin");
    let mut finite = 0;
    for name in EDGE_TYPES {
        let dtype = DType::from_name(name).unwrap();
        let w = legacy_file(&format!("edge.{name}.bin"));
        let want = legacy_f32(&format!("edge.dot.{name}.f32"));
        let vdt = dtype.vec_dot_type();
        let act = match vdt {
            DType::Q8_0 => &q8_0,
            DType::Q8_1 => &q8_1,
            _ => &q8_k,
        };
        let xr = dtype.row_size(LEGACY_N).unwrap();
        let yr = vdt.row_size(LEGACY_N).unwrap();
        for (r, &want) in want.iter().enumerate() {
            // ggml's generic kernels are the scalar tier's spec; the AVX2 tier follows ggml's AVX2
            // kernels, which differ on these rows (e.g. a q8 value of -128 under the sign trick).
            let got = quantgraph::kernels::vec_dot_with(
                quantgraph::Isa::Scalar,
                dtype,
                LEGACY_N,
                &w[r * xr..(r + 1) * xr],
                &act[r * yr..(r + 1) * yr],
            )
            .unwrap();
            let ok = if want.is_finite() {
                finite += 1;
                (got - want).abs() <= (want.abs() * 1e-4).max(1e-6)
            } else {
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan())
            };
            assert!(ok, "{name} edge row {r}: {got} vs ggml {want}");
        }
    }
    assert!(finite > 60, "only {finite} finite reference results");
}

/// Q8_K blocks hold an f32, so their bytes need 4-byte alignment to be borrowed in place; an odd
/// address must still work.
#[test]
fn ternary_dot_with_misaligned_q8_k() {
    let q8_k = legacy_file("edge.q8_K.bin");
    for name in ["tq1_0", "tq2_0"] {
        let dtype = DType::from_name(name).unwrap();
        let w = legacy_file(&format!("edge.{name}.bin"));
        let xr = dtype.row_size(LEGACY_N).unwrap();
        for r in 5..12 {
            let x = &w[r * xr..(r + 1) * xr];
            let y = &q8_k[r * 292..(r + 1) * 292];
            let mut odd = vec![0u8; 293];
            odd[1..].copy_from_slice(y);
            let a = vec_dot(dtype, LEGACY_N, x, y).unwrap();
            let b = vec_dot(dtype, LEGACY_N, x, &odd[1..]).unwrap();
            assert_eq!(a.to_bits(), b.to_bits(), "{name} row {r}");
        }
    }
}
