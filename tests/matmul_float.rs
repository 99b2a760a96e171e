//! mul_mat of F32, F16 and BF16 weights with six or more columns, which runs the packed float
//! GEMM (`ops/mul_mat_f.rs`): accuracy against an f64 reference over odd tails, several K blocks,
//! more columns than one task holds, broadcasts and strided activations; thread-count invariance;
//! every ISA tier against the scalar one; guard bytes around every tensor.

mod common;

use common::{FLOAT_TYPES as TYPES, assert_close_to_scale, matmul_f64, nmse, tiers};
use quantgraph::kernels::Isa;
use quantgraph::quant::{dequantize, quantize_for_dot};
use quantgraph::testdata::rand_f32;
use quantgraph::{CpuBackend, DType, Graph, Plan};

struct Case {
    ty: DType,
    ane: [usize; 4],
    bne: [usize; 4],
    /// Activations stored transposed ([n, k]) and viewed as [k, n]: a strided b.
    b_transposed: bool,
    b_type: DType,
    a_bytes: Vec<u8>,
    a_val: Vec<f32>,
    b: Vec<f32>,
}

fn case(ty: DType, ane: [usize; 4], bne: [usize; 4], seed: u64) -> Case {
    let a = rand_f32(ane.iter().product(), seed);
    let mut a_bytes = vec![0u8; ty.row_size(ane[0]).unwrap() * ane[1..].iter().product::<usize>()];
    if ty == DType::F32 {
        a_bytes.copy_from_slice(bytemuck::cast_slice(&a));
    } else {
        quantize_for_dot(ty, &a, &mut a_bytes).unwrap();
    }
    let mut a_val = vec![0f32; a.len()];
    dequantize(ty, &a_bytes, &mut a_val).unwrap();
    let b = rand_f32(bne.iter().product(), seed + 1);
    Case { ty, ane, bne, b_transposed: false, b_type: DType::F32, a_bytes, a_val, b }
}

fn run(c: &Case, isa: Isa, threads: usize) -> Vec<f32> {
    let be = CpuBackend::with_isa(threads, isa).unwrap();
    let mut g = Graph::new();
    let a = g.input(c.ty, &c.ane).unwrap();
    let (b_in, b) = if c.b_transposed {
        assert_eq!(c.bne[2..], [1, 1]);
        let t = g.input(DType::F32, &[c.bne[1], c.bne[0]]).unwrap();
        (t, g.transpose(t).unwrap())
    } else {
        let t = g.input(DType::F32, &c.bne).unwrap();
        let b = if c.b_type == DType::F32 { t } else { g.cast(t, c.b_type).unwrap() };
        (t, b)
    };
    let y = g.mul_mat(a, b).unwrap();
    g.set_output(y).unwrap();
    let mut p = Plan::with_guards(g, &be, 64).unwrap();
    p.set_input_bytes(a, &c.a_bytes).unwrap();
    if c.b_transposed {
        let (k, n) = (c.bne[0], c.bne[1]);
        let bt: Vec<f32> = (0..n * k).map(|i| c.b[(i % n) * k + i / n]).collect();
        p.set_input(b_in, &bt).unwrap();
    } else {
        p.set_input(b_in, &c.b).unwrap();
    }
    p.compute().unwrap();
    p.check_guards().unwrap();
    p.output::<f32>(y).unwrap().to_vec()
}

/// Odd tails around the 6-row strip, the 16-column panel, the 96-row and 512-column task blocks
/// and the 256-value K block (and, for BF16 on the tile unit, the 16-row strip and the
/// 32-value step: odd numbers of strips and panels, a K block of one step).
fn shapes() -> Vec<([usize; 4], [usize; 4])> {
    let mut v = Vec::new();
    for (k, m, n) in [
        (1, 5, 6),
        (7, 13, 7),
        (64, 17, 16),
        (256, 49, 17),
        (511, 6, 33),
        (1100, 11, 9),
        (96, 50, 300),
        (32, 7, 520),
        (64, 100, 7),
        (544, 37, 40),
    ] {
        v.push(([k, m, 1, 1], [k, n, 1, 1]));
    }
    // Broadcast over dims 2 and 3.
    v.push(([64, 17, 2, 1], [64, 7, 4, 3]));
    v.push(([40, 9, 1, 2], [40, 19, 3, 2]));
    v
}

#[test]
fn float_gemm_matches_f64_reference() {
    for ty in TYPES {
        for (s, (ane, bne)) in shapes().into_iter().enumerate() {
            let c = case(ty, ane, bne, 100 + s as u64);
            // F16/BF16 weights round the activations to their own precision, as ggml does.
            let b_ref: Vec<f32> = match ty {
                DType::F32 => c.b.clone(),
                _ => {
                    let mut q = vec![0u8; ty.row_size(c.b.len()).unwrap()];
                    quantize_for_dot(ty, &c.b, &mut q).unwrap();
                    let mut r = vec![0f32; c.b.len()];
                    dequantize(ty, &q, &mut r).unwrap();
                    r
                }
            };
            let want = matmul_f64(&c.a_val, ane, &b_ref, bne);
            for isa in tiers() {
                let got = run(&c, isa, 2);
                let e = nmse(&got, &want);
                assert!(e < 1e-10, "{ty} {} {ane:?} x {bne:?}: nmse {e}", isa.name());
            }
        }
    }
}

#[test]
fn float_gemm_takes_strided_and_half_precision_activations() {
    for ty in TYPES {
        let (ane, bne) = ([300, 13, 1, 1], [300, 21, 1, 1]);
        let plain = case(ty, ane, bne, 9);
        let want = run(&plain, Isa::best(), 2);
        let strided = Case { b_transposed: true, ..case(ty, ane, bne, 9) };
        assert_eq!(run(&strided, Isa::best(), 2), want, "{ty}: transposed b");
        // b already in the weights' F16 / BF16: the same values as rounding an F32 b inside.
        if ty != DType::F32 {
            let half = Case { b_type: ty, ..case(ty, ane, bne, 9) };
            assert_eq!(run(&half, Isa::best(), 2), want, "{ty} x {ty}");
        }
    }
}

#[test]
fn float_gemm_is_bitwise_identical_for_1_2_3_threads() {
    for ty in TYPES {
        for (ane, bne) in [
            ([600, 67, 1, 1], [600, 37, 1, 1]),
            ([64, 17, 2, 1], [64, 9, 4, 1]),
            ([544, 37, 1, 1], [544, 40, 1, 1]),
        ] {
            let c = case(ty, ane, bne, 7);
            for isa in tiers() {
                let one = run(&c, isa, 1);
                for threads in [2, 3] {
                    let got = run(&c, isa, threads);
                    let same = one.iter().zip(&got).all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same, "{ty} {} {ane:?} x {bne:?}: {threads} threads", isa.name());
                }
            }
        }
    }
}

#[test]
fn float_gemm_tiers_agree_with_scalar() {
    for ty in TYPES {
        for (s, (ane, bne)) in shapes().into_iter().enumerate() {
            let c = case(ty, ane, bne, 300 + s as u64);
            let want = run(&c, Isa::Scalar, 2);
            // Fused and separate multiply-adds round differently: compare relative to the
            // output's scale (single elements may cancel to near zero).
            for isa in tiers() {
                let got = run(&c, isa, 2);
                let what = format!("{ty} {} {ane:?} x {bne:?}", isa.name());
                assert_close_to_scale(&got, &want, 1e-5, &what);
            }
        }
    }
}

/// Every quantized weight type with a dot product takes the same GEMM (dequantized strips, the
/// activations rounded through the vec-dot type): against a dequantize-then-f64 product (NMSE
/// 5e-4, test-backend-ops' limit for mul_mat) and against one `vec_dot` per element (same products, another
/// summation order), with 1 and 3 threads bitwise equal.
#[test]
fn quantized_gemm_matches_reference_for_every_type() {
    let (k, m, n) = (512, 13, 17);
    for ty in DType::ALL {
        if ty.is_integer() || TYPES.contains(&ty) || ty.vec_dot_type() == ty {
            continue;
        }
        let x = rand_f32(k * m, 77);
        let mut a_bytes = vec![0u8; ty.row_size(k).unwrap() * m];
        let quantized =
            if matches!(ty, DType::IQ2_XXS | DType::IQ2_XS | DType::IQ1_S | DType::IQ1_M) {
                let imatrix: Vec<f32> = (0..k).map(|i| 1.0 + (i % 7) as f32 * 0.1).collect();
                quantgraph::quant::quantize_with_imatrix(ty, &x, k, &imatrix, &mut a_bytes)
            } else {
                quantgraph::quant::quantize(ty, &x, &mut a_bytes)
            };
        if quantized.is_err()
            || quantgraph::quant::vec_dot(
                ty,
                k,
                &a_bytes[..ty.row_size(k).unwrap()],
                &vec![0u8; ty.vec_dot_type().row_size(k).unwrap()],
            )
            .is_err()
        {
            continue;
        }
        let mut a_val = vec![0f32; k * m];
        dequantize(ty, &a_bytes, &mut a_val).unwrap();
        let b = rand_f32(k * n, 78);
        let c = Case {
            ty,
            ane: [k, m, 1, 1],
            bne: [k, n, 1, 1],
            b_transposed: false,
            b_type: DType::F32,
            a_bytes: a_bytes.clone(),
            a_val: a_val.clone(),
            b: b.clone(),
        };
        let got = run(&c, Isa::best(), 3);
        // Transposed (strided) activations pack the same values.
        let strided = Case { b_transposed: true, a_bytes: a_bytes.clone(), b: b.clone(), ..c };
        assert_eq!(run(&strided, Isa::best(), 2), got, "{ty}: transposed b");
        let c = strided;
        let want = matmul_f64(&a_val, c.ane, &b, c.bne);
        let e = nmse(&got, &want);
        assert!(e < 5e-4, "{ty}: nmse {e}");
        assert_eq!(run(&c, Isa::best(), 1), got, "{ty}: 1 vs 3 threads");
        // One vec_dot per element against the same converted activations.
        let vd = ty.vec_dot_type();
        let (ra, rb) = (ty.row_size(k).unwrap(), vd.row_size(k).unwrap());
        let mut b_q = vec![0u8; rb * n];
        quantize_for_dot(vd, &b, &mut b_q).unwrap();
        let scale = got.iter().fold(0f32, |mx, v| mx.max(v.abs()));
        // Q8_1's vec_dot uses the block sum stored in f16 (ggml's `s`); the GEMM uses the exact
        // sum of the converted values, so the two differ by that rounding.
        let tol = if vd == DType::Q8_1 { 2e-3 } else { 2e-5 };
        for j in 0..n {
            for i in 0..m {
                let want = quantgraph::quant::vec_dot(
                    ty,
                    k,
                    &a_bytes[i * ra..(i + 1) * ra],
                    &b_q[j * rb..(j + 1) * rb],
                )
                .unwrap();
                let g = got[j * m + i];
                assert!((g - want).abs() <= tol * scale, "{ty} ({i}, {j}): {g} vs {want}");
            }
        }
    }
}

/// The normalised Sylvester Hadamard matrix H_n / sqrt(n): entry (i, j) is
/// (-1)^popcount(i & j) / sqrt(n).
fn hadamard(n: usize) -> Vec<f32> {
    let s = 1.0 / (n as f64).sqrt();
    (0..n * n)
        .map(|e| {
            let (i, j) = (e / n, e % n);
            (if (i & j).count_ones() % 2 == 0 { s } else { -s }) as f32
        })
        .collect()
}

#[test]
fn hadamard_hint_matches_the_dense_product() {
    use quantgraph::MatMulHint;
    for (n, cols, b_type) in [
        (1usize, 3usize, DType::F32),
        (2, 1, DType::F32),
        (64, 7, DType::F16),
        (256, 5, DType::F32),
    ] {
        let h = hadamard(n);
        let bne = [n, cols, 2, 1];
        let b = rand_f32(bne.iter().product(), n as u64);
        let mut outs = Vec::new();
        let hints: &[MatMulHint] = if b_type == DType::F32 {
            &[MatMulHint::None, MatMulHint::Src0IsHadamard]
        } else {
            &[MatMulHint::Src0IsHadamard]
        };
        for &hint in hints {
            let mut g = Graph::new();
            let ta = g.input(DType::F32, &[n, n]).unwrap();
            let tb = g.input(b_type, &bne).unwrap();
            let y = if b_type == DType::F32 {
                // The dense node, then the hint (ggml's order of calls).
                let y = g.mul_mat(ta, tb).unwrap();
                g.mul_mat_set_hint(y, hint).unwrap();
                y
            } else {
                // F16 activations have no dense F32 product: the hint comes with the node.
                g.mul_mat_with_hint(ta, tb, hint).unwrap()
            };
            g.set_output(y).unwrap();
            let mut per_threads = Vec::new();
            for nth in [1, 2, 3] {
                let backend = CpuBackend::with_threads(nth).unwrap();
                let mut plan = Plan::new(g.clone(), &backend).unwrap();
                // With the hint the weights are not read: give them garbage to prove it.
                let a_data =
                    if hint == MatMulHint::None { h.clone() } else { vec![f32::NAN; n * n] };
                plan.set_input(ta, &a_data).unwrap();
                if b_type == DType::F16 {
                    let bh: Vec<half::f16> = b.iter().map(|&x| half::f16::from_f32(x)).collect();
                    plan.set_input(tb, &bh).unwrap();
                } else {
                    plan.set_input(tb, &b).unwrap();
                }
                plan.compute().unwrap();
                per_threads.push(plan.output::<f32>(y).unwrap().to_vec());
            }
            assert!(per_threads.windows(2).all(|w| w[0] == w[1]), "n {n}: thread counts differ");
            outs.push(per_threads.swap_remove(0));
        }
        let bq: Vec<f32> = if b_type == DType::F16 {
            b.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect()
        } else {
            b.clone()
        };
        let want = matmul_f64(&h, [n, n, 1, 1], &bq, bne);
        for (what, got) in ["first", "second"].iter().zip(&outs) {
            let e = nmse(got, &want);
            assert!(e < 5e-4, "n {n} {what}: nmse {e:e}");
        }
    }
}

#[test]
fn hadamard_hint_rejects_what_it_cannot_transform() {
    use quantgraph::MatMulHint;
    let mut g = Graph::new();
    let a = g.input(DType::F32, &[12, 12]).unwrap();
    let b = g.input(DType::F32, &[12, 3]).unwrap();
    let y = g.mul_mat(a, b).unwrap();
    let e = g.mul_mat_set_hint(y, MatMulHint::Src0IsHadamard).unwrap_err();
    assert!(e.to_string().contains("power of two"), "{e}");
    let a16 = g.input(DType::F16, &[16, 16]).unwrap();
    let b16 = g.input(DType::F32, &[16, 3]).unwrap();
    let y16 = g.mul_mat(a16, b16).unwrap();
    assert!(g.mul_mat_set_hint(y16, MatMulHint::Src0IsHadamard).is_err());
    let bf16 = g.input(DType::F16, &[16, 3]).unwrap();
    let a32 = g.input(DType::F32, &[16, 16]).unwrap();
    let yh = g.mul_mat_with_hint(a32, bf16, MatMulHint::Src0IsHadamard).unwrap();
    // Back to the dense form is refused: F32 weights have no product with F16 activations.
    assert!(g.mul_mat_set_hint(yh, MatMulHint::None).is_err());
    let s = g.scale(b, 2.0).unwrap();
    let e = g.mul_mat_set_hint(s, MatMulHint::Src0IsHadamard).unwrap_err();
    assert!(e.to_string().contains("not mul_mat"), "{e}");
}

#[test]
fn bf16_activations_of_f32_weights_are_widened() {
    // Both paths: dot products (fewer than six columns) and the packed GEMM.
    for (m, n, k) in [(5usize, 1usize, 33usize), (17, 3, 64), (19, 9, 130)] {
        let a = rand_f32(m * k, 7);
        let b: Vec<half::bf16> =
            rand_f32(n * k, 8).iter().map(|&x| half::bf16::from_f32(x)).collect();
        let bf: Vec<f32> = b.iter().map(|x| x.to_f32()).collect();
        let want = matmul_f64(&a, [k, m, 1, 1], &bf, [k, n, 1, 1]);
        let mut g = Graph::new();
        let ta = g.input(DType::F32, &[k, m]).unwrap();
        let tb = g.input(DType::BF16, &[k, n]).unwrap();
        let y = g.mul_mat(ta, tb).unwrap();
        g.set_output(y).unwrap();
        let mut first: Option<Vec<f32>> = None;
        for nth in [1, 2, 3] {
            let backend = CpuBackend::with_threads(nth).unwrap();
            let mut plan = Plan::new(g.clone(), &backend).unwrap();
            plan.set_input(ta, &a).unwrap();
            plan.set_input(tb, &b).unwrap();
            plan.compute().unwrap();
            let got = plan.output::<f32>(y).unwrap().to_vec();
            let e = nmse(&got, &want);
            assert!(e < 5e-4, "{m}x{n}x{k}: nmse {e:e}");
            match &first {
                None => first = Some(got),
                Some(f) => assert_eq!(f, &got, "{m}x{n}x{k}: {nth} threads differ"),
            }
        }
    }
    // Other weight types keep their activation rule.
    let mut g = Graph::new();
    let a16 = g.input(DType::F16, &[32, 4]).unwrap();
    let b16 = g.input(DType::BF16, &[32, 2]).unwrap();
    assert!(g.mul_mat(a16, b16).is_err());
}
