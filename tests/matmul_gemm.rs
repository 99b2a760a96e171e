//! mul_mat of Q8_0 and Q4_0 weights with two or more columns, which runs the register-tile
//! (gemm) kernels below 6 columns and the f32 GEMM on dequantized values from 6: accuracy against a dequantize-then-f64 reference on odd M/N tails and
//! broadcasts, thread-count invariance, every ISA tier against the scalar one, and agreement with
//! one `vec_dot` per output element.

mod common;

use common::{assert_close_to_scale, matmul_f64, nmse, tiers};
use quantgraph::DType;
use quantgraph::kernels::{Isa, vec_dot_with};
use quantgraph::quant::{dequantize, quantize, quantize_for_dot};
use quantgraph::testdata::rand_f32;

const TYPES: [DType; 2] = [DType::Q8_0, DType::Q4_0];

struct Case {
    ty: DType,
    ane: [usize; 4],
    bne: [usize; 4],
    a_f32: Vec<f32>,
    a_q: Vec<u8>,
    b: Vec<f32>,
}

fn case(ty: DType, ane: [usize; 4], bne: [usize; 4], seed: u64) -> Case {
    let a_f32 = rand_f32(ane.iter().product(), seed);
    let mut a_q = vec![0u8; ty.row_size(ane[0]).unwrap() * ane[1..].iter().product::<usize>()];
    quantize(ty, &a_f32, &mut a_q).unwrap();
    let b = rand_f32(bne.iter().product(), seed + 1);
    Case { ty, ane, bne, a_f32, a_q, b }
}

fn run(c: &Case, isa: Isa, threads: usize) -> Vec<f32> {
    common::mul_mat_guarded(isa, threads, c.ty, c.ane, &c.a_q, c.bne, &c.b)
}

fn shapes() -> Vec<([usize; 4], [usize; 4])> {
    let mut v = Vec::new();
    for k in [64, 256] {
        for n in [2, 3, 5, 7, 8, 9, 16] {
            v.push(([k, 17, 1, 1], [k, n, 1, 1]));
        }
    }
    // Broadcast over dims 2 and 3, and more than one 16x16 tile each way.
    v.push(([64, 17, 2, 1], [64, 5, 4, 3]));
    v.push(([256, 37, 1, 2], [256, 19, 3, 2]));
    v
}

#[test]
fn gemm_matches_dequantized_f64_reference_on_odd_tails() {
    for ty in TYPES {
        for (s, (ane, bne)) in shapes().into_iter().enumerate() {
            let c = case(ty, ane, bne, 100 + s as u64);
            let mut a_deq = vec![0f32; c.a_f32.len()];
            dequantize(ty, &c.a_q, &mut a_deq).unwrap();
            let want = matmul_f64(&a_deq, ane, &c.b, bne);
            for isa in tiers() {
                let got = run(&c, isa, 2);
                let e = nmse(&got, &want);
                assert!(e < 5e-4, "{ty} {} {ane:?} x {bne:?}: nmse {e}", isa.name());
            }
        }
    }
}

#[test]
fn gemm_is_bitwise_identical_for_1_2_3_threads() {
    for ty in TYPES {
        for (ane, bne) in [([256, 67, 1, 1], [256, 37, 1, 1]), ([64, 17, 2, 1], [64, 9, 4, 1])] {
            let c = case(ty, ane, bne, 7);
            for isa in tiers() {
                let one = run(&c, isa, 1);
                for threads in [2, 3] {
                    let got = run(&c, isa, threads);
                    let same = one.iter().zip(&got).all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(
                        same,
                        "{ty} {} {ane:?} x {bne:?}: {threads} threads differ",
                        isa.name()
                    );
                }
            }
        }
    }
}

#[test]
fn gemm_tiers_agree_with_scalar() {
    for ty in TYPES {
        for (s, (ane, bne)) in shapes().into_iter().enumerate() {
            let c = case(ty, ane, bne, 300 + s as u64);
            let want = run(&c, Isa::Scalar, 2);
            // Relative to the output's scale: single elements may cancel to near zero.
            for isa in tiers() {
                let got = run(&c, isa, 2);
                let what = format!("{ty} {} {ane:?} x {bne:?}", isa.name());
                assert_close_to_scale(&got, &want, 1e-6, &what);
            }
        }
    }
}

#[test]
fn gemm_matches_one_vec_dot_per_element() {
    for ty in TYPES {
        for (s, (ane, bne)) in shapes().into_iter().enumerate() {
            let c = case(ty, ane, bne, 500 + s as u64);
            let k = ane[0];
            let (ra, rb) = (ty.row_size(k).unwrap(), DType::Q8_0.row_size(k).unwrap());
            let mut b_q = vec![0u8; rb * c.b.len() / k];
            quantize_for_dot(DType::Q8_0, &c.b, &mut b_q).unwrap();
            let (m, n) = (ane[1], bne[1]);
            let (r2, r3) = (bne[2] / ane[2], bne[3] / ane[3]);
            for isa in tiers() {
                let got = run(&c, isa, 2);
                let scale = got.iter().fold(0f32, |m, v| m.max(v.abs()));
                let mut idx = 0;
                for i3 in 0..bne[3] {
                    for i2 in 0..bne[2] {
                        for j in 0..n {
                            let yb = &b_q[((i3 * bne[2] + i2) * n + j) * rb..][..rb];
                            for i in 0..m {
                                let xa =
                                    &c.a_q[((i3 / r3 * ane[2] + i2 / r2) * m + i) * ra..][..ra];
                                let want = vec_dot_with(isa, ty, k, xa, yb).unwrap();
                                let g = got[idx];
                                // Fewer than 6 columns: the tile kernels keep vec_dot's reduction
                                // order (equal bits). From 6 columns the f32 GEMM sums the same
                                // products in another order: equal up to f32 rounding.
                                let close = if n < 6 {
                                    (g - want).abs() <= 1e-5 * want.abs()
                                } else {
                                    (g - want).abs() <= 1e-5 * scale
                                };
                                assert!(
                                    g.to_bits() == want.to_bits() || close,
                                    "{ty} {} {ane:?} x {bne:?} ({i}, {j}): {g} vs {want}",
                                    isa.name()
                                );
                                idx += 1;
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Decode (one column) of F32 rows of 32 KiB, which runs the register tiles rather than one dot
/// per row, and of F16 rows as long, which keeps the dots: the same bits as `vec_dot` on every
/// tier and for 1, 2 and 3 threads.
#[test]
fn long_float_rows_decode_gives_one_vec_dot_per_row() {
    for (ty, k) in [(DType::F32, 8192), (DType::F16, 16384)] {
        let (m, ane, bne) = (19, [k, 19, 1, 1], [k, 1, 1, 1]);
        let a_f32 = rand_f32(k * m, 900);
        let mut a = vec![0u8; ty.row_size(k).unwrap() * m];
        quantize(ty, &a_f32, &mut a).unwrap();
        let b = rand_f32(k, 901);
        let mut b_v = vec![0u8; ty.row_size(k).unwrap()];
        quantize_for_dot(ty, &b, &mut b_v).unwrap();
        let ra = ty.row_size(k).unwrap();
        for isa in tiers() {
            for threads in [1, 2, 3] {
                let got = common::mul_mat_guarded(isa, threads, ty, ane, &a, bne, &b);
                for (i, g) in got.iter().enumerate() {
                    let want = vec_dot_with(isa, ty, k, &a[i * ra..][..ra], &b_v).unwrap();
                    assert_eq!(
                        g.to_bits(),
                        want.to_bits(),
                        "{ty} {} t{threads} row {i}",
                        isa.name()
                    );
                }
            }
        }
    }
}

/// Decode (one column of f32 activations) of quantized weights: each worker converts the
/// column into a slot of its own (the node has one phase), and every output is still `vec_dot`
/// on the converted column, bit for bit, on every tier and for 1, 2 and 3 threads.
#[test]
fn decode_gives_one_vec_dot_per_row_for_any_thread_count() {
    for ty in [DType::Q8_0, DType::Q4_0, DType::Q4_K] {
        let (k, m) = (512, 37);
        let c = case(ty, [k, m, 1, 1], [k, 1, 1, 1], 950);
        let vd = ty.vec_dot_type();
        let mut b_q = vec![0u8; vd.row_size(k).unwrap()];
        quantize_for_dot(vd, &c.b, &mut b_q).unwrap();
        let ra = ty.row_size(k).unwrap();
        for isa in tiers() {
            for threads in [1, 2, 3] {
                let got = run(&c, isa, threads);
                assert_eq!(got.len(), m);
                for (i, g) in got.iter().enumerate() {
                    let want = vec_dot_with(isa, ty, k, &c.a_q[i * ra..][..ra], &b_q).unwrap();
                    assert_eq!(
                        g.to_bits(),
                        want.to_bits(),
                        "{ty} {} t{threads} row {i}",
                        isa.name()
                    );
                }
            }
        }
    }
}
