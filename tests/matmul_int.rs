//! mul_mat of the weight types with an integer form (K-quants, IQ, ternary against Q8_K; legacy,
//! IQ4_NL, MXFP4, NVFP4, Q1_0, Q2_0 against Q8_0 / Q8_1) with 6 or more columns, which runs the
//! integer GEMM on every x86 tier (VNNI, or AVX2 `vpmaddubsw`): accuracy
//! against a dequantize-then-f64 reference on odd M/N tails and broadcasts on every tier, thread-count
//! invariance, and agreement with one `vec_dot` per output element. The kernels' bits against
//! the portable kernel are tested in `kernels::igemm`.

mod common;

use common::{QUANT_WEIGHT_TYPES as TYPES, matmul_f64, mul_mat_guarded_bytes, nmse};
use quantgraph::kernels::{Isa, vec_dot_with};
use quantgraph::quant::{dequantize, quantize, quantize_for_dot, quantize_with_imatrix};
use quantgraph::testdata::rand_f32;
use quantgraph::{CpuBackend, DType, Graph, Plan};

struct Case {
    ty: DType,
    ane: [usize; 4],
    bne: [usize; 4],
    a_q: Vec<u8>,
    a_deq: Vec<f32>,
    b: Vec<f32>,
}

fn case(ty: DType, ane: [usize; 4], bne: [usize; 4], seed: u64) -> Case {
    let a_f32 = rand_f32(ane.iter().product(), seed);
    let mut a_q = vec![0u8; ty.row_size(ane[0]).unwrap() * ane[1..].iter().product::<usize>()];
    if quantize(ty, &a_f32, &mut a_q).is_err() {
        // IQ1 and IQ2 types need an importance matrix.
        let imatrix = vec![1.0f32; ane[0]];
        quantize_with_imatrix(ty, &a_f32, ane[0], &imatrix, &mut a_q).unwrap();
    }
    let mut a_deq = vec![0f32; a_f32.len()];
    dequantize(ty, &a_q, &mut a_deq).unwrap();
    let b = rand_f32(bne.iter().product(), seed + 1);
    Case { ty, ane, bne, a_q, a_deq, b }
}

fn run(c: &Case, isa: Isa, threads: usize) -> Vec<f32> {
    common::mul_mat_guarded(isa, threads, c.ty, c.ane, &c.a_q, c.bne, &c.b)
}

/// Odd row counts (partial bands of 8 and tasks), 16 columns and ragged panels, broadcasts; for
/// the block types also rows that end in a partial 256-element step (K = 384, 640, 128).
fn shapes(ty: DType) -> Vec<([usize; 4], [usize; 4])> {
    let k = if ty.block_size() == 256 { [256, 512, 256] } else { [384, 640, 128] };
    vec![
        ([k[0], 13, 1, 1], [k[0], 16, 1, 1]),
        ([k[1], 70, 1, 1], [k[1], 33, 1, 1]),
        ([k[2], 9, 2, 1], [k[2], 17, 4, 3]),
    ]
}

#[test]
fn int_gemm_matches_dequantized_f64_reference_on_odd_tails() {
    for ty in TYPES {
        for (s, (ane, bne)) in shapes(ty).into_iter().enumerate() {
            let c = case(ty, ane, bne, 100 + s as u64);
            let want = matmul_f64(&c.a_deq, ane, &c.b, bne);
            // Every tier: AVX-512 VNNI, AVX2 (AVX-VNNI or maddubs kernels), the portable one.
            for isa in Isa::ALL.into_iter().filter(|i| i.is_supported()) {
                let got = run(&c, isa, 2);
                let e = nmse(&got, &want);
                assert!(e < 5e-4, "{ty} {isa:?} {ane:?} x {bne:?}: nmse {e}");
            }
        }
    }
}

#[test]
fn int_gemm_is_bitwise_identical_for_1_2_3_threads() {
    for (ty, k) in [
        (DType::Q4_K, 256),
        (DType::Q6_K, 256),
        (DType::IQ2_XS, 256),
        (DType::Q4_1, 384),
        (DType::Q8_0, 384),
        (DType::IQ4_XS, 256),
    ] {
        let (ane, bne) = ([k, 150, 1, 1], [k, 530, 1, 1]);
        let c = case(ty, ane, bne, 7);
        let one = run(&c, Isa::best(), 1);
        for threads in [2, 3] {
            let got = run(&c, Isa::best(), threads);
            let same = one.iter().zip(&got).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{ty}: {threads} threads differ from 1");
        }
    }
}

#[test]
fn int_gemm_matches_one_vec_dot_per_element() {
    for ty in TYPES {
        let k = if ty.block_size() == 256 { 512 } else { 640 };
        let (ane, bne) = ([k, 19, 1, 1], [k, 17, 1, 1]);
        let c = case(ty, ane, bne, 500);
        let vd = ty.vec_dot_type();
        let (ra, rb) = (ty.row_size(k).unwrap(), vd.row_size(k).unwrap());
        let mut b_q = vec![0u8; rb * c.b.len() / k];
        quantize_for_dot(vd, &c.b, &mut b_q).unwrap();
        let got = run(&c, Isa::best(), 2);
        let scale = got.iter().fold(0f32, |m, v| m.max(v.abs()));
        let (m, n) = (ane[1], bne[1]);
        for j in 0..n {
            for i in 0..m {
                let want =
                    vec_dot_with(Isa::Scalar, ty, k, &c.a_q[i * ra..][..ra], &b_q[j * rb..][..rb])
                        .unwrap();
                // The same integer products; the float scalings are applied in another order.
                let g = got[j * m + i];
                assert!((g - want).abs() <= 2e-6 * scale, "{ty} ({i}, {j}): {g} vs {want}");
            }
        }
    }
}

/// b already in the vec-dot type (Q8_K, Q8_0, Q8_1) gives bitwise what F32 b, converted by the
/// op, gives.
#[test]
fn int_gemm_b_in_vec_dot_type_matches_f32_b() {
    for (ty, k) in [
        (DType::Q4_K, 512),
        (DType::Q6_K, 512),
        (DType::IQ4_XS, 512),
        (DType::Q4_0, 576),
        (DType::Q5_1, 576),
    ] {
        let (ane, bne) = ([k, 70, 1, 1], [k, 21, 1, 1]);
        let c = case(ty, ane, bne, 900);
        let want = run(&c, Isa::best(), 2);
        let vd = ty.vec_dot_type();
        let mut b_q = vec![0u8; vd.row_size(c.b.len()).unwrap()];
        quantize_for_dot(vd, &c.b, &mut b_q).unwrap();
        let got = mul_mat_guarded_bytes(Isa::best(), 2, (ty, ane, &c.a_q), (vd, bne, &b_q));
        let same = got.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "{ty}: {vd} b differs from F32 b");
    }
}

/// Activations stored transposed ([n, k]) and viewed as [k, n] (elements `n * 4` bytes apart):
/// converted element by element, they give the bits of the contiguous ones, which are converted
/// where they lie, in the integer GEMM (7 columns) and in the dot products' conversion (3).
#[test]
fn strided_f32_activations_give_the_contiguous_bits() {
    let be = CpuBackend::with_threads(2).unwrap();
    for (ty, n) in [(DType::Q4_0, 7), (DType::Q4_K, 7), (DType::Q4_K, 3)] {
        let (k, m) = (512, 9);
        let c = case(ty, [k, m, 1, 1], [k, n, 1, 1], 91);
        let mut out = Vec::new();
        for transposed in [false, true] {
            let mut g = Graph::new();
            let a = g.input(ty, &c.ane).unwrap();
            let (b_in, b) = if transposed {
                let t = g.input(DType::F32, &[n, k]).unwrap();
                (t, g.transpose(t).unwrap())
            } else {
                let t = g.input(DType::F32, &[k, n]).unwrap();
                (t, t)
            };
            let y = g.mul_mat(a, b).unwrap();
            g.set_output(y).unwrap();
            let mut p = Plan::new(g, &be).unwrap();
            p.set_input_bytes(a, &c.a_q).unwrap();
            if transposed {
                let bt: Vec<f32> = (0..n * k).map(|i| c.b[(i % n) * k + i / n]).collect();
                p.set_input(b_in, &bt).unwrap();
            } else {
                p.set_input(b_in, &c.b).unwrap();
            }
            p.compute().unwrap();
            out.push(p.output::<f32>(y).unwrap().to_vec());
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&out[0]), bits(&out[1]), "{ty}, {n} columns");
    }
}

/// Q8_0 weights and Q8_0 activation rows holding the byte -128 (which ggml's quantizers never
/// write but a file may hold), against IQ4_NL weights too: every tier gives the exact sums,
/// whichever way it multiplies them (CPUs without VNNI move a sign between the operands, which
/// -128 does not survive on the side it is moved to, so those rows take another route).
#[test]
fn level_and_weight_minus_128_are_exact_on_every_tier() {
    let (k, m, n) = (320, 11, 9);
    // Scale 1/64 (exact in f16) and levels cycling through -128..=127, -128 every 256.
    let rows = |count: usize, phase: usize| -> Vec<u8> {
        let mut out = Vec::new();
        for r in 0..count {
            for blk in 0..k / 32 {
                out.extend_from_slice(&half::f16::from_f32(1.0 / 64.0).to_bits().to_le_bytes());
                for e in 0..32 {
                    let i = r * 37 + blk * 32 + e * 5 + phase;
                    out.push(if i.is_multiple_of(7) { 0x80 } else { (i * 29 % 256) as u8 });
                }
            }
        }
        out
    };
    let b_q = rows(n, 3);
    let mut b_deq = vec![0f32; k * n];
    dequantize(DType::Q8_0, &b_q, &mut b_deq).unwrap();
    for ty in [DType::Q8_0, DType::IQ4_NL] {
        let (ane, bne) = ([k, m, 1, 1], [k, n, 1, 1]);
        let a_q = if ty == DType::Q8_0 {
            rows(m, 0)
        } else {
            let mut q = vec![0u8; ty.row_size(k).unwrap() * m];
            quantize(ty, &rand_f32(k * m, 77), &mut q).unwrap();
            q
        };
        let mut a_deq = vec![0f32; k * m];
        dequantize(ty, &a_q, &mut a_deq).unwrap();
        let want = matmul_f64(&a_deq, ane, &b_deq, bne);
        // F32 activations (the dequantized levels: -128 becomes -2.0, which the quantizer
        // makes -127) and the Q8_0 rows as they are.
        let from_f32 = matmul_f64(&a_deq, ane, &requantized(&b_deq), bne);
        for isa in Isa::ALL.into_iter().filter(|i| i.is_supported()) {
            let got = mul_mat_guarded_bytes(isa, 2, (ty, ane, &a_q), (DType::Q8_0, bne, &b_q));
            let e = nmse(&got, &want);
            assert!(e < 1e-10, "{ty} {isa:?} with Q8_0 rows: nmse {e}");
            let got = common::mul_mat_guarded(isa, 2, ty, ane, &a_q, bne, &b_deq);
            let e = nmse(&got, &from_f32);
            assert!(e < 1e-10, "{ty} {isa:?} with F32 rows: nmse {e}");
        }
    }
}

/// What the Q8_0 quantizer makes of `x`, dequantized.
fn requantized(x: &[f32]) -> Vec<f32> {
    let mut q = vec![0u8; DType::Q8_0.row_size(x.len()).unwrap()];
    quantize_for_dot(DType::Q8_0, x, &mut q).unwrap();
    let mut out = vec![0f32; x.len()];
    dequantize(DType::Q8_0, &q, &mut out).unwrap();
    out
}
