//! K-quants (Q2_K..Q6_K) and their activation type Q8_K against ggml: golden vectors, ggml's
//! test-quantize-fns limits, importance-matrix known answers, edge rows, errors and alignment.

mod common;

use common::{K_TYPES, quant_case, quant_rows, quant_x, quant_y};
use proptest::prelude::*;
use quantgraph::DType;
use quantgraph::quant::{dequantize, quantize, quantize_for_dot, quantize_with_imatrix, vec_dot};
use quantgraph::testdata::{generate_data, rand_f32};

fn q(dtype: DType, x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; dtype.row_size(x.len()).unwrap()];
    quantize(dtype, x, &mut out).unwrap();
    out
}

fn q_im(dtype: DType, x: &[f32], n_per_row: usize, im: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; dtype.row_size(x.len()).unwrap()];
    quantize_with_imatrix(dtype, x, n_per_row, im, &mut out).unwrap();
    out
}

fn deq(dtype: DType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    dequantize(dtype, bytes, &mut out).unwrap();
    out
}

fn q8k(y: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; DType::Q8_K.row_size(y.len()).unwrap()];
    quantize_for_dot(DType::Q8_K, y, &mut out).unwrap();
    out
}

/// FNV-1a, 64 bit: the known answers below are hashes of the bytes ggml produced.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// Index of the first differing byte, for readable failures.
fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

// ---------------------------------------------------------------------------------------------
// Golden vectors produced by ggml (tests/data/golden).

#[test]
fn golden_quantize_is_bit_exact() {
    let x = quant_x();
    for dtype in K_TYPES {
        let case = quant_case(dtype.name());
        let got = q(dtype, &x);
        assert_eq!(got.len(), case.q.len(), "{dtype}");
        assert!(got == case.q, "{dtype}: first differing byte {:?}", first_diff(&got, &case.q));
    }
}

#[test]
fn golden_dequantize_is_bit_exact() {
    for dtype in K_TYPES {
        let case = quant_case(dtype.name());
        let got = deq(dtype, &case.q, case.deq.len());
        for (i, (g, w)) in got.iter().zip(&case.deq).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{dtype} element {i}: {g} vs {w}");
        }
    }
}

#[test]
fn golden_q8_k_from_float_is_bit_exact() {
    let y = quant_y();
    let got = q8k(&y);
    for dtype in K_TYPES {
        let case = quant_case(dtype.name());
        assert_eq!(case.vec_dot_type, DType::Q8_K, "{dtype}");
        assert!(
            got == case.y_q,
            "{dtype} y_q: first differing byte {:?}",
            first_diff(&got, &case.y_q)
        );
    }
}

#[test]
fn golden_vec_dot_matches_ggml() {
    let (rows, n) = quant_rows();
    for dtype in K_TYPES {
        let case = quant_case(dtype.name());
        let xr = dtype.row_size(n).unwrap();
        let yr = DType::Q8_K.row_size(n).unwrap();
        assert_eq!(case.vec_dot.len(), rows);
        for r in 0..rows {
            let got =
                vec_dot(dtype, n, &case.q[r * xr..(r + 1) * xr], &case.y_q[r * yr..(r + 1) * yr])
                    .unwrap();
            let want = case.vec_dot[r];
            let err = (got - want).abs();
            assert!(
                err <= 1e-4 * want.abs() || err <= 1e-6,
                "{dtype} row {r}: got {got}, ggml {want}"
            );
        }
    }
}

#[test]
fn q8_k_dequantize_is_within_half_a_step() {
    let y = quant_y();
    let bytes = q8k(&y);
    let back = deq(DType::Q8_K, &bytes, y.len());
    for (blk, (yb, bb)) in y.chunks(256).zip(back.chunks(256)).enumerate() {
        let amax = yb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let step = amax / 127.0;
        for (a, b) in yb.iter().zip(bb) {
            assert!((a - b).abs() <= 0.5 * step * 1.0001 + 1e-12, "block {blk}: {a} vs {b}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// ggml's tests/test-quantize-fns.cpp, with its data, error definitions and limits.

fn array_rmse(a: &[f32], b: &[f32]) -> f32 {
    let sum: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    (sum as f32).sqrt() / a.len() as f32
}

fn dot_f64(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x * y) as f64).sum::<f64>() as f32
}

#[test]
fn test_quantize_fns_limits() {
    let n = 32 * 128;
    let data = generate_data(0.0, n);
    let data2 = generate_data(1.0, n);
    for dtype in K_TYPES {
        let (max_total, max_dot) = match dtype {
            DType::Q2_K => (0.0075, 0.04),
            DType::Q3_K => (0.0040, 0.02),
            _ => (0.002, 0.02),
        };
        // ggml's CPU from_float for these types is the reference quantizer.
        let qd = q(dtype, &data);
        let back = deq(dtype, &qd, n);
        let total = array_rmse(&data, &back);
        assert!(total < max_total, "{dtype} total quantization error {total}");

        let reference = array_rmse(&back, &deq(dtype, &q(dtype, &data), n));
        assert!(reference < 0.0001, "{dtype} reference error {reference}");

        let got = vec_dot(dtype, n, &qd, &q8k(&data2)).unwrap();
        let dot_err = (got - dot_f64(&data, &data2)).abs() / n as f32;
        assert!(dot_err < max_dot, "{dtype} dot product error {dot_err}");
    }
}

// ---------------------------------------------------------------------------------------------
// Importance matrix.

/// A non-uniform imatrix whose values are exact in f32 (the known answers were made in C with
/// `1.0f + (float)((i * 7) % 13) * 0.25f`).
fn imatrix(n: usize) -> Vec<f32> {
    (0..n).map(|i| 1.0 + ((i * 7) % 13) as f32 * 0.25).collect()
}

#[test]
fn imatrix_known_answers_match_ggml() {
    // FNV-1a of ggml's quantize_qX_K(golden x, 4 rows of 1024, imatrix(1024)), computed by
    // compiling ggml-quants.c at commit d99724f (as ggml-base is built: -O2, no -march).
    let want = [
        (DType::Q2_K, 0xfd97_3aae_0790_c482u64),
        (DType::Q3_K, 0xc54e_fa55_8905_9afb),
        (DType::Q4_K, 0xe8a5_1411_d35a_1163),
        (DType::Q5_K, 0x6cfd_7157_6c29_4957),
        (DType::Q6_K, 0x1b95_d410_4c5f_fa32),
    ];
    let x = quant_x();
    let (_, n) = quant_rows();
    let im = imatrix(n);
    for (dtype, h) in want {
        let got = q_im(dtype, &x, n, &im);
        assert_eq!(fnv1a(&got), h, "{dtype}");
        assert_ne!(got, quant_case(dtype.name()).q, "{dtype}: imatrix must change the bytes");
    }
}

#[test]
fn imatrix_lowers_the_weighted_error() {
    // Strongly non-uniform importance: every 8th column matters 100x more.
    let n = 1024;
    let x: Vec<f32> = rand_f32(4 * n, 7).iter().map(|v| v * 3.0).collect();
    let im: Vec<f32> = (0..n).map(|i| if i % 8 == 0 { 100.0 } else { 1.0 }).collect();
    let werr = |y: &[f32]| -> f64 {
        x.iter()
            .zip(y)
            .enumerate()
            .map(|(i, (a, b))| im[i % n] as f64 * ((a - b) as f64).powi(2))
            .sum()
    };
    for dtype in K_TYPES {
        let plain = deq(dtype, &q(dtype, &x), x.len());
        let weighted = deq(dtype, &q_im(dtype, &x, n, &im), x.len());
        let (e0, e1) = (werr(&plain), werr(&weighted));
        assert!(e1 < e0, "{dtype}: weighted error with imatrix {e1} not below {e0}");
        // ... and the result is still an accurate quantization.
        let rel = e1
            / x.iter()
                .enumerate()
                .map(|(i, v)| im[i % n] as f64 * (*v as f64).powi(2))
                .sum::<f64>();
        assert!(rel < 0.1, "{dtype}: relative weighted error {rel}");
    }
}

#[test]
fn imatrix_rows_are_quantized_independently() {
    let n = 512;
    let x = rand_f32(3 * n, 11);
    let im = imatrix(n);
    for dtype in K_TYPES {
        let all = q_im(dtype, &x, n, &im);
        let rb = dtype.row_size(n).unwrap();
        for r in 0..3 {
            let one = q_im(dtype, &x[r * n..(r + 1) * n], n, &im);
            assert_eq!(one, all[r * rb..(r + 1) * rb], "{dtype} row {r}");
        }
    }
}

/// 64 rows of 512 spanning magnitudes 1e-4..1e4 with x8 outliers, and a random imatrix; the same
/// construction in C made the known answers below.
fn stress_rows() -> (Vec<f32>, Vec<f32>) {
    let sc = [1e-4f32, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1000.0, 1e4];
    let mut x = rand_f32(64 * 512, 42);
    for (i, v) in x.iter_mut().enumerate() {
        *v *= sc[(i / 512) % 9];
        if i % 37 == 0 {
            *v *= 8.0;
        }
    }
    let im = rand_f32(512, 43).iter().map(|v| v.abs() * 4.0 + 0.01).collect();
    (x, im)
}

#[test]
fn stress_rows_match_ggml_bytes() {
    // FNV-1a of ggml's bytes for stress_rows(): (type, without imatrix, with imatrix).
    let want = [
        (DType::Q2_K, 0xf0d7_3c16_3506_5fadu64, 0xf5ef_c1c8_c766_c8d4u64),
        (DType::Q3_K, 0xee07_ad6a_3f84_1d8e, 0xae49_0d0c_0551_373e),
        (DType::Q4_K, 0x1a6b_7de6_517d_1ec0, 0xd2c1_9efe_e4d8_af4f),
        (DType::Q5_K, 0xd6d1_c3ee_5b2b_bb1e, 0x28c7_2038_29ed_1264),
        (DType::Q6_K, 0xaf89_1c1a_9942_87e0, 0x857f_74a4_06e3_f752),
    ];
    let (x, im) = stress_rows();
    for (dtype, h_plain, h_im) in want {
        assert_eq!(fnv1a(&q(dtype, &x)), h_plain, "{dtype} without imatrix");
        assert_eq!(fnv1a(&q_im(dtype, &x, 512, &im)), h_im, "{dtype} with imatrix");
    }
    assert_eq!(fnv1a(&q8k(&x)), 0xc4da_4326_2287_a8a0, "q8_K");
}

#[test]
fn degenerate_imatrix_values_match_ggml_bytes() {
    // The first 4 stress rows (512 each) with importance matrices of zeros, a NaN, negative
    // values and an infinity; FNV-1a of ggml's bytes in that order.
    let want = [
        (
            DType::Q2_K,
            [
                0x8a0e_82c7_fdfc_0d8au64,
                0x9653_9adc_00b2_d3a3,
                0x509c_ec40_8c9f_3a88,
                0xbe23_d63e_b57b_f221,
            ],
        ),
        (
            DType::Q3_K,
            [
                0xbf7b_5391_9d08_2184,
                0xa602_87e0_688d_1254,
                0x6606_12d5_1319_0eac,
                0x59ff_e515_adc1_3e54,
            ],
        ),
        (
            DType::Q4_K,
            [
                0x6ce0_feaf_2cf9_e80c,
                0x01e6_2060_a7c4_9994,
                0x9995_6168_7109_b11c,
                0xd06b_7580_52f0_44cf,
            ],
        ),
        (
            DType::Q5_K,
            [
                0xb36f_0552_bad9_e363,
                0x50ff_cf31_2930_5c92,
                0x50c8_188f_28f2_0347,
                0xa252_420e_6c4c_5bd4,
            ],
        ),
        (
            DType::Q6_K,
            [
                0x26df_caf1_ebf4_2665,
                0x1709_2b55_9abd_974c,
                0x0306_be3d_9c1b_d5b0,
                0x1709_2b55_9abd_974c,
            ],
        ),
    ];
    let (x, _) = stress_rows();
    let x = &x[..4 * 512];
    let zero = vec![0f32; 512];
    let mut nan = vec![1f32; 512];
    nan[5] = f32::NAN;
    let neg: Vec<f32> = (0..512).map(|i| if i % 3 == 0 { -1.0 } else { 2.0 }).collect();
    let mut inf = vec![1f32; 512];
    inf[7] = f32::INFINITY;
    for (dtype, hashes) in want {
        for (im, h) in [&zero, &nan, &neg, &inf].into_iter().zip(hashes) {
            assert_eq!(fnv1a(&q_im(dtype, x, 512, im)), h, "{dtype} imatrix {:?}", &im[..8]);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Edge rows: zero, constant, tiny, huge, NaN, infinities, subnormals.

/// Ten rows of 256, as built by the C generator for the known answers below.
fn edge_rows() -> Vec<f32> {
    let x = quant_x();
    let mut e = vec![0f32; 10 * 256];
    for i in 0..256 {
        e[i] = 0.0;
        e[256 + i] = 0.3125;
        e[2 * 256 + i] = 1e-30;
        e[3 * 256 + i] = -1e30;
        e[4 * 256 + i] = f32::NAN;
        e[5 * 256 + i] = x[i];
        e[6 * 256 + i] = x[256 + i];
        e[7 * 256 + i] = x[i] * 1e-38;
        e[8 * 256 + i] = if i & 1 == 1 { 1e30 } else { -1e-30 };
        e[9 * 256 + i] = x[512 + i];
    }
    e[5 * 256 + 17] = f32::NAN;
    e[6 * 256 + 3] = f32::INFINITY;
    e[9 * 256 + 100] = f32::NEG_INFINITY;
    e
}

#[test]
fn edge_rows_match_ggml_bytes() {
    // FNV-1a of ggml's bytes for edge_rows(), without and with imatrix(256) (rows of 256).
    let want = [
        (DType::Q2_K, 0x91d7_506e_ecc2_287eu64, 0x94ba_24cf_5297_f0e4u64),
        (DType::Q3_K, 0x9593_3d55_0137_627f, 0xc1a1_5b18_3461_d229),
        (DType::Q4_K, 0x26a9_c1fc_59de_e962, 0x0374_ebaa_9d4b_dbd9),
        (DType::Q5_K, 0xcfa1_19b2_611f_94af, 0x8d93_f9b4_bdf2_83e3),
        (DType::Q6_K, 0x437b_77f3_6519_19ca, 0x3d8a_bf30_5bee_ec72),
    ];
    let e = edge_rows();
    let im = imatrix(256);
    for (dtype, h_plain, h_im) in want {
        assert_eq!(fnv1a(&q(dtype, &e)), h_plain, "{dtype} without imatrix");
        assert_eq!(fnv1a(&q_im(dtype, &e, 256, &im)), h_im, "{dtype} with imatrix");
    }
    assert_eq!(fnv1a(&q8k(&e)), 0xa093_72f8_41c8_019a, "q8_K");
}

#[test]
fn edge_rows_dequantize_as_ggml() {
    // FNV-1a of the f32 bytes of ggml's dequantize_row_* on its own bytes for edge_rows().
    let want = [
        (DType::Q2_K, 0x0079_844e_753f_fa4au64),
        (DType::Q3_K, 0xb644_6e3c_af22_1a3e),
        (DType::Q4_K, 0x4a85_3891_5ad7_1b7c),
        (DType::Q5_K, 0xc07b_f1cb_6660_62e3),
        (DType::Q6_K, 0x5e8e_c72d_0425_0021),
        (DType::Q8_K, 0x9ae7_52b2_b2b1_234e),
    ];
    let e = edge_rows();
    for (dtype, h) in want {
        let b = if dtype == DType::Q8_K { q8k(&e) } else { q(dtype, &e) };
        let back = deq(dtype, &b, e.len());
        let bytes: Vec<u8> = back.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(fnv1a(&bytes), h, "{dtype}");
    }
}

#[test]
fn edge_rows_never_panic_anywhere() {
    let e = edge_rows();
    let y = q8k(&e);
    let _ = deq(DType::Q8_K, &y, e.len());
    for dtype in K_TYPES {
        let b = q(dtype, &e);
        let _ = deq(dtype, &b, e.len());
        let _ = vec_dot(dtype, e.len(), &b, &y).unwrap();
    }
}

#[test]
fn zero_row_quantizes_to_zero() {
    let z = vec![0f32; 512];
    for dtype in K_TYPES {
        let b = q(dtype, &z);
        assert!(deq(dtype, &b, 512).iter().all(|v| *v == 0.0), "{dtype}");
        assert_eq!(vec_dot(dtype, 512, &b, &q8k(&rand_f32(512, 3))).unwrap(), 0.0, "{dtype}");
    }
    assert!(q8k(&z).iter().all(|b| *b == 0));
}

#[test]
fn constant_row_roundtrips_closely() {
    let c = vec![0.3125f32; 256];
    for dtype in K_TYPES {
        let back = deq(dtype, &q(dtype, &c), 256);
        for v in back {
            assert!((v - 0.3125).abs() < 0.02, "{dtype}: {v}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn any_f32_bits_quantize_without_panic(bits in proptest::collection::vec(any::<u32>(), 256)) {
        let x: Vec<f32> = bits.into_iter().map(f32::from_bits).collect();
        let y = q8k(&x);
        for dtype in K_TYPES {
            let b = q(dtype, &x);
            let _ = q_im(dtype, &x, 256, &x.iter().map(|v| v.abs()).collect::<Vec<_>>());
            let _ = deq(dtype, &b, 256);
            let _ = vec_dot(dtype, 256, &b, &y).unwrap();
        }
    }

    #[test]
    fn any_block_bytes_dequantize_and_dot_without_panic(
        raw in proptest::collection::vec(any::<u8>(), 292 * 2),
    ) {
        let y = &raw[..292];
        for dtype in K_TYPES {
            let ts = dtype.row_size(256).unwrap();
            let x = &raw[292..292 + ts];
            let _ = deq(dtype, x, 256);
            let _ = vec_dot(dtype, 256, x, y).unwrap();
        }
        let _ = deq(DType::Q8_K, y, 256);
    }
}

// ---------------------------------------------------------------------------------------------
// Alignment: blocks are read from and written to byte slices at any address.

#[test]
fn misaligned_slices_give_the_same_results() {
    let x = quant_x();
    let (_, n) = quant_rows();
    let y = quant_y();
    let yq = q8k(&y);
    for off in 1..4 {
        let mut ybuf = vec![0u8; yq.len() + off];
        quantize_for_dot(DType::Q8_K, &y, &mut ybuf[off..]).unwrap();
        assert_eq!(&ybuf[off..], &yq[..], "q8_K written at offset {off}");
        let mut yback = vec![0f32; y.len()];
        dequantize(DType::Q8_K, &ybuf[off..], &mut yback).unwrap();
        assert_eq!(yback, deq(DType::Q8_K, &yq, y.len()));

        for dtype in K_TYPES {
            let want = q(dtype, &x);
            let mut buf = vec![0u8; want.len() + off];
            quantize(dtype, &x, &mut buf[off..]).unwrap();
            assert_eq!(&buf[off..], &want[..], "{dtype} written at offset {off}");
            let xb = &buf[off..];
            assert_eq!(deq(dtype, xb, x.len()), deq(dtype, &want, x.len()), "{dtype}");
            let rb = dtype.row_size(n).unwrap();
            let yr = DType::Q8_K.row_size(n).unwrap();
            let d_mis = vec_dot(dtype, n, &xb[..rb], &ybuf[off..off + yr]).unwrap();
            let d_ali = vec_dot(dtype, n, &want[..rb], &yq[..yr]).unwrap();
            assert_eq!(d_mis.to_bits(), d_ali.to_bits(), "{dtype} vec_dot at offset {off}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Errors.

#[test]
fn partial_blocks_and_wrong_lengths_are_errors() {
    let x = rand_f32(512, 5);
    for dtype in K_TYPES.into_iter().chain([DType::Q8_K]) {
        let ts = dtype.row_size(256).unwrap();
        let mut out = vec![0u8; 2 * ts];
        let mut f = vec![0f32; 512];
        if dtype != DType::Q8_K {
            assert!(quantize(dtype, &x[..300], &mut out).is_err(), "{dtype} partial block");
            assert!(quantize(dtype, &x, &mut out[..ts]).is_err(), "{dtype} short dst");
            assert!(quantize(dtype, &x[..256], &mut out).is_err(), "{dtype} long dst");
            let im = imatrix(256);
            assert!(quantize_with_imatrix(dtype, &x, 256, &im[..100], &mut out).is_err());
            assert!(quantize_with_imatrix(dtype, &x, 128, &im[..128], &mut out).is_err());
            assert!(quantize_with_imatrix(dtype, &x[..500], 256, &im, &mut out).is_err());
            assert!(quantize_with_imatrix(dtype, &x, 0, &im, &mut out).is_err());
            assert!(vec_dot(dtype, 256, &out[..ts], &[0u8; 10]).is_err(), "{dtype} short y");
            assert!(vec_dot(dtype, 100, &out[..ts], &[0u8; 292]).is_err(), "{dtype} partial n");
        } else {
            // ggml_quantize_chunk does not take Q8_K; only the CPU converter makes it.
            assert!(quantize(dtype, &x, &mut out).is_err());
            assert!(quantize_for_dot(dtype, &x[..300], &mut out).is_err());
            assert!(quantize_for_dot(dtype, &x, &mut out[..ts]).is_err());
        }
        assert!(dequantize(dtype, &out[..ts - 1], &mut f[..256]).is_err(), "{dtype} partial");
        assert!(dequantize(dtype, &out, &mut f[..256]).is_err(), "{dtype} dst too short");
    }
    // The weight types are not vec-dot types.
    for dtype in K_TYPES {
        let mut out = vec![0u8; dtype.row_size(512).unwrap()];
        assert!(quantize_for_dot(dtype, &x, &mut out).is_err(), "{dtype}");
    }
}
