//! The AVX2 `vec_dot` kernels of `src/kernels/x86/avx2_quants.rs` against the scalar tier, in one
//! process through `kernels::vec_dot_with`, and against ggml's golden dot products.
//!
//! The float dots (F32, F16, BF16) follow ggml's AVX2 order in both tiers, and Q2_0 ggml's generic
//! order in both tiers, so they must agree bit for bit. The other block formats sum each block in
//! integers (exact in both tiers) but combine the blocks in different float orders (the scalar tier
//! follows ggml's generic code, the AVX2 tier ggml's AVX2 code), so they must agree to 1e-6 of the
//! sum of the magnitudes of the products, the scale that bounds a reordering error. Against ggml's
//! golden results (its AVX2 build) every row must be within 1e-4, and is in fact bit-exact.

mod common;

use quantgraph::DType;
use quantgraph::kernels::{Isa, vec_dot_with};
use quantgraph::quant::{quantize, quantize_for_dot};
use quantgraph::testdata::rand_f32;

/// Every type with an AVX2 kernel in avx2_quants.rs.
fn types() -> impl Iterator<Item = DType> {
    common::QUANTIZABLE.into_iter().chain(common::K_TYPES)
}

fn is_float(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::BF16)
}

/// Types whose AVX2 kernel combines the scales in the scalar kernel's float order (ggml has no
/// AVX2 Q2_0 kernel, so both follow its generic one): the tiers must agree bit for bit.
fn same_order_as_scalar(d: DType) -> bool {
    is_float(d) || d == DType::Q2_0
}

/// True when the AVX2 tier can run here; otherwise says why the test does nothing.
fn have_avx2(test: &str) -> bool {
    let ok = Isa::Avx2.is_supported();
    if !ok {
        println!("{test}: skipped, this CPU lacks AVX2/FMA/F16C");
    }
    ok
}

/// `x` as weights of `dtype` and `y` as its activations, the way matmul prepares them.
fn operands(dtype: DType, x: &[f32], y: &[f32]) -> (Vec<u8>, Vec<u8>) {
    let n = x.len();
    let mut xq = vec![0u8; dtype.row_size(n).unwrap()];
    if is_float(dtype) {
        quantize_for_dot(dtype, x, &mut xq).unwrap();
    } else {
        quantize(dtype, x, &mut xq).unwrap();
    }
    let vd = dtype.vec_dot_type();
    let mut yq = vec![0u8; vd.row_size(n).unwrap()];
    quantize_for_dot(vd, y, &mut yq).unwrap();
    (xq, yq)
}

/// Checks the AVX2 kernel against the scalar one on one pair of rows.
fn assert_tiers_agree(dtype: DType, x: &[f32], y: &[f32], what: &str) {
    let n = x.len();
    let (xq, yq) = operands(dtype, x, y);
    let scalar = vec_dot_with(Isa::Scalar, dtype, n, &xq, &yq).unwrap();
    let avx2 = vec_dot_with(Isa::Avx2, dtype, n, &xq, &yq).unwrap();
    if same_order_as_scalar(dtype) {
        assert_eq!(avx2.to_bits(), scalar.to_bits(), "{dtype} {what}: avx2 {avx2} scalar {scalar}");
    } else {
        let scale: f64 = x.iter().zip(y).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
        let err = (avx2 as f64 - scalar as f64).abs();
        assert!(
            err <= 1e-6 * scale.max(1e-30),
            "{dtype} {what}: avx2 {avx2} scalar {scalar} (err {err:e}, scale {scale:e})"
        );
    }
}

#[test]
fn avx2_matches_scalar_on_1_2_and_17_blocks() {
    if !have_avx2("avx2_matches_scalar_on_1_2_and_17_blocks") {
        return;
    }
    for dtype in types() {
        let bs = if is_float(dtype) { 32 } else { dtype.block_size() };
        for (i, blocks) in [1usize, 2, 17].into_iter().enumerate() {
            let n = bs * blocks;
            for seed in 0..4u64 {
                let x = rand_f32(n, 1000 + seed * 31 + i as u64);
                let y = rand_f32(n, 2000 + seed * 17 + i as u64);
                assert_tiers_agree(dtype, &x, &y, &format!("{blocks} blocks seed {seed}"));
            }
        }
    }
}

#[test]
fn avx2_float_dots_handle_every_tail_length() {
    if !have_avx2("avx2_float_dots_handle_every_tail_length") {
        return;
    }
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for n in (0..=70).chain([95, 96, 97, 127, 128, 129, 1000, 4097]) {
            let x = rand_f32(n, 7 + n as u64);
            let y = rand_f32(n, 9 + n as u64);
            assert_tiers_agree(dtype, &x, &y, &format!("n={n}"));
        }
    }
}

#[test]
fn avx2_matches_scalar_on_scaled_and_sparse_rows() {
    if !have_avx2("avx2_matches_scalar_on_scaled_and_sparse_rows") {
        return;
    }
    for dtype in types() {
        let n = 4 * if is_float(dtype) { 32 } else { dtype.block_size() };
        // Magnitudes from 1e-3 to 1e3 across blocks, outliers, and a zero stretch.
        let x: Vec<f32> = rand_f32(n, 5)
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let s = 10f32.powi((i * 7 / n) as i32 - 3);
                if i % 97 == 3 {
                    v * s * 8.0
                } else if (n / 2..n / 2 + 40).contains(&i) {
                    0.0
                } else {
                    v * s
                }
            })
            .collect();
        let y: Vec<f32> = rand_f32(n, 6).iter().map(|v| v * 50.0).collect();
        assert_tiers_agree(dtype, &x, &y, "scaled");
        let zeros = vec![0.0f32; n];
        assert_tiers_agree(dtype, &zeros, &y, "zero weights");
        assert_tiers_agree(dtype, &x, &zeros, "zero activations");
    }
}

#[test]
fn avx2_gives_the_same_bits_on_misaligned_slices() {
    if !have_avx2("avx2_gives_the_same_bits_on_misaligned_slices") {
        return;
    }
    for dtype in types() {
        let n = 3 * if is_float(dtype) { 32 } else { dtype.block_size() }
            + if is_float(dtype) { 5 } else { 0 };
        let (xq, yq) = operands(dtype, &rand_f32(n, 11), &rand_f32(n, 12));
        let want = vec_dot_with(Isa::Avx2, dtype, n, &xq, &yq).unwrap();
        for (ox, oy) in [(1usize, 0usize), (0, 3), (5, 7)] {
            let mut xs = vec![0u8; ox];
            xs.extend_from_slice(&xq);
            let mut ys = vec![0u8; oy];
            ys.extend_from_slice(&yq);
            let got = vec_dot_with(Isa::Avx2, dtype, n, &xs[ox..], &ys[oy..]).unwrap();
            assert_eq!(got.to_bits(), want.to_bits(), "{dtype} offsets {ox},{oy}");
        }
    }
}

#[test]
fn vec_dot_with_refuses_wrong_lengths() {
    if !have_avx2("vec_dot_with_refuses_wrong_lengths") {
        return;
    }
    let (xq, yq) = operands(DType::Q4_0, &rand_f32(64, 1), &rand_f32(64, 2));
    assert!(vec_dot_with(Isa::Avx2, DType::Q4_0, 64, &xq[1..], &yq).is_err());
    assert!(vec_dot_with(Isa::Avx2, DType::Q4_0, 64, &xq, &yq[..yq.len() - 1]).is_err());
    assert!(vec_dot_with(Isa::Avx2, DType::Q4_0, 32, &xq, &yq).is_err());
}

/// ggml's own vec_dot results (its AVX2 build) on the golden rows: within a relative 1e-4, and in
/// fact bit-exact.
#[test]
fn avx2_golden_vec_dot_matches_ggml() {
    if !have_avx2("avx2_golden_vec_dot_matches_ggml") {
        return;
    }
    let (rows, n) = common::quant_rows();
    for dtype in types() {
        let case = common::quant_case(dtype.name());
        let xr = dtype.row_size(n).unwrap();
        let yr = case.vec_dot_type.row_size(n).unwrap();
        assert_eq!(case.vec_dot.len(), rows);
        for r in 0..rows {
            let x = &case.q[r * xr..(r + 1) * xr];
            let y = &case.y_q[r * yr..(r + 1) * yr];
            let got = vec_dot_with(Isa::Avx2, dtype, n, x, y).unwrap();
            let want = case.vec_dot[r];
            let tol = (want.abs() * 1e-4).max(1e-6);
            assert!((got - want).abs() <= tol, "{dtype} row {r}: {got} vs ggml {want}");
            // Same lane layout and float order as ggml's kernels: the very same bits.
            assert_eq!(got.to_bits(), want.to_bits(), "{dtype} row {r}: {got} vs ggml {want}");
        }
    }
}

fn legacy_file(name: &str) -> Vec<u8> {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/legacy").join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The edge rows of tests/data/legacy (NaN, infinities, huge and tiny magnitudes; activations that
/// hold -128) against ggml's portable dot products, the format's definition: the AVX2 kernels must
/// not inherit the sign-trick wrap of ggml's AVX2 code on a -128 activation.
#[test]
fn avx2_matches_ggml_generic_on_edge_rows() {
    if !have_avx2("avx2_matches_ggml_generic_on_edge_rows") {
        return;
    }
    const N: usize = 256;
    let q8_0 = legacy_file("edge.cpu.q8_0.bin");
    let q8_1 = legacy_file("edge.cpu.q8_1.bin");
    let q8_k = legacy_file("edge.q8_K.bin");
    let mut bad = Vec::new();
    for name in
        ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "mxfp4", "nvfp4", "q1_0", "q2_0", "tq1_0", "tq2_0"]
    {
        let dtype = DType::from_name(name).unwrap();
        let w = legacy_file(&format!("edge.{name}.bin"));
        let want: Vec<f32> = legacy_file(&format!("edge.dot.{name}.f32"))
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let vdt = dtype.vec_dot_type();
        let act = match vdt {
            DType::Q8_0 => &q8_0,
            DType::Q8_1 => &q8_1,
            _ => &q8_k,
        };
        let (xr, yr) = (dtype.row_size(N).unwrap(), vdt.row_size(N).unwrap());
        for (r, &want) in want.iter().enumerate() {
            let (x, y) = (&w[r * xr..(r + 1) * xr], &act[r * yr..(r + 1) * yr]);
            let got = vec_dot_with(Isa::Avx2, dtype, N, x, y).unwrap();
            let ok = if want.is_finite() {
                (got - want).abs() <= (want.abs() * 1e-4).max(1e-6)
            } else {
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan())
            };
            if !ok {
                bad.push(format!("{name} row {r}: avx2 {got} ggml generic {want}"));
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// Q4_0 and Q5_0 run a loop without the per-block test for a non-finite scale and fall back to the
/// checked loop only when the result is not finite: rows where one block's weight scale is
/// infinite or NaN (and the others finite) must give what the scalar tier gives.
#[test]
fn avx2_q4_0_q5_0_blocks_with_non_finite_scales() {
    if !have_avx2("avx2_q4_0_q5_0_blocks_with_non_finite_scales") {
        return;
    }
    for dtype in [DType::Q4_0, DType::Q5_0] {
        let n = 32 * 9;
        let (xq, yq) = operands(dtype, &rand_f32(n, 41), &rand_f32(n, 42));
        let bsz = dtype.type_size();
        let want_finite = vec_dot_with(Isa::Scalar, dtype, n, &xq, &yq).unwrap();
        let got_finite = vec_dot_with(Isa::Avx2, dtype, n, &xq, &yq).unwrap();
        assert!(want_finite.is_finite() && got_finite.is_finite());
        for (block, bits) in [(0usize, 0x7C00u16), (4, 0xFC00), (8, 0x7E00), (3, 0x7C01)] {
            let mut x = xq.clone();
            x[block * bsz..block * bsz + 2].copy_from_slice(&bits.to_le_bytes());
            let scalar = vec_dot_with(Isa::Scalar, dtype, n, &x, &yq).unwrap();
            let avx2 = vec_dot_with(Isa::Avx2, dtype, n, &x, &yq).unwrap();
            assert!(
                avx2.to_bits() == scalar.to_bits() || (avx2.is_nan() && scalar.is_nan()),
                "{dtype} block {block} scale {bits:#06x}: avx2 {avx2} scalar {scalar}"
            );
        }
        // A zero block under an infinite scale: 0 * inf, NaN in both tiers.
        let mut x = xq.clone();
        x[..2].copy_from_slice(&0x7C00u16.to_le_bytes());
        let mut y = yq.clone();
        y[2..34].fill(0);
        let scalar = vec_dot_with(Isa::Scalar, dtype, n, &x, &y).unwrap();
        let avx2 = vec_dot_with(Isa::Avx2, dtype, n, &x, &y).unwrap();
        assert!(scalar.is_nan() && avx2.is_nan(), "{dtype}: avx2 {avx2} scalar {scalar}");
    }
}

/// Q1_0's AVX2 kernel follows ggml's AVX2 arithmetic (negate y where the weight bit is clear), so
/// a -128 activation byte, which the Q8_0 quantizer never writes, wraps under a clear bit as it
/// does in ggml's AVX2 build; under a set bit, and for every valid byte, it is exact. The scalar
/// tier follows ggml's portable code and is exact everywhere.
#[test]
fn avx2_q1_0_treats_a_minus_128_activation_like_ggml_avx2() {
    if !have_avx2("avx2_q1_0_treats_a_minus_128_activation_like_ggml_avx2") {
        return;
    }
    let one = 0x3C00u16.to_le_bytes(); // f16 1.0
    // One Q1_0 block (128 weights): bit 1 set, every other bit clear (weights +1 and -1).
    let mut x = vec![0u8; 18];
    x[..2].copy_from_slice(&one);
    x[2] = 0b10;
    // Four Q8_0 blocks with scale 1: y[0] = -128 (weight -1), y[1] = -128 (weight +1), y[2] = 5.
    let mut y = vec![0u8; 4 * 34];
    for b in 0..4 {
        y[b * 34..b * 34 + 2].copy_from_slice(&one);
    }
    y[2] = 0x80;
    y[3] = 0x80;
    y[4] = 5;
    let scalar = vec_dot_with(Isa::Scalar, DType::Q1_0, 128, &x, &y).unwrap();
    let avx2 = vec_dot_with(Isa::Avx2, DType::Q1_0, 128, &x, &y).unwrap();
    assert_eq!(scalar, 128.0 - 128.0 - 5.0);
    assert_eq!(avx2, -128.0 - 128.0 - 5.0);
    // Without the -128 under a clear bit the tiers agree.
    y[2] = 0x81; // -127
    let scalar = vec_dot_with(Isa::Scalar, DType::Q1_0, 128, &x, &y).unwrap();
    let avx2 = vec_dot_with(Isa::Avx2, DType::Q1_0, 128, &x, &y).unwrap();
    assert_eq!((scalar, avx2), (127.0 - 128.0 - 5.0, 127.0 - 128.0 - 5.0));
}
