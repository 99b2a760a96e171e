//! Repacked weights (CPU_REPACK buffer type): mul_mat on repacked weights equals mul_mat on the
//! same weights in a plain buffer and the f64 reference of the dequantized weights, for decode and
//! prefill column counts, task and K-chunk tails, broadcasts and strided activations; thread-count
//! invariance; every ISA tier against the scalar one (or, where the tier runs the integer GEMM
//! on repacked weights, against the plain layout's result); and the build-time errors for
//! misuse. The same for mul_mat_id on repacked experts: each output bitwise the expert's
//! repacked mul_mat over its own tokens, near the plain path and the f64 reference.

mod common;

use common::{matmul_f64, nmse, tiers};
use quantgraph::backend::repack::REPACK_TYPES;
use quantgraph::kernels::Isa;
use quantgraph::quant::{dequantize, quantize};
use quantgraph::testdata::rand_f32;
use quantgraph::{Buffer, BufferType, CpuBackend, CpuRepackBufferType, DType, Graph, Plan};

struct Case {
    ty: DType,
    ane: [usize; 4],
    bne: [usize; 4],
    b_transposed: bool,
    a_bytes: Vec<u8>,
    a_val: Vec<f32>,
    b: Vec<f32>,
}

fn case(ty: DType, ane: [usize; 4], bne: [usize; 4], seed: u64) -> Case {
    let a = rand_f32(ane.iter().product(), seed);
    let mut a_bytes = vec![0u8; ty.row_size(ane[0]).unwrap() * ane[1..].iter().product::<usize>()];
    quantize(ty, &a, &mut a_bytes).unwrap();
    let mut a_val = vec![0f32; a.len()];
    dequantize(ty, &a_bytes, &mut a_val).unwrap();
    let b = rand_f32(bne.iter().product(), seed + 1);
    Case { ty, ane, bne, b_transposed: false, a_bytes, a_val, b }
}

fn run(c: &Case, repacked: bool, isa: Isa, threads: usize) -> Vec<f32> {
    let be = CpuBackend::with_isa(threads, isa).unwrap();
    let buf = if repacked {
        CpuRepackBufferType.alloc(c.a_bytes.len()).unwrap()
    } else {
        Buffer::alloc(c.a_bytes.len()).unwrap()
    };
    buf.set_tensor(0, c.ty, &c.ane, &c.a_bytes).unwrap();
    assert_eq!(buf.is_repacked(), repacked);
    let mut back = vec![0u8; c.a_bytes.len()];
    buf.get_tensor(0, c.ty, &c.ane, &mut back).unwrap();
    assert!(back == c.a_bytes, "get_tensor returns the plain layout");
    let mut g = Graph::new();
    let a = g.weight(c.ty, &c.ane, &buf, 0).unwrap();
    let (b_in, b) = if c.b_transposed {
        let t = g.input(DType::F32, &[c.bne[1], c.bne[0]]).unwrap();
        (t, g.transpose(t).unwrap())
    } else {
        let t = g.input(DType::F32, &c.bne).unwrap();
        (t, t)
    };
    let y = g.mul_mat(a, b).unwrap();
    g.set_output(y).unwrap();
    let mut p = Plan::with_guards(g, &be, 64).unwrap();
    if c.b_transposed {
        let (k, n) = (c.bne[0], c.bne[1]);
        let bt: Vec<f32> = (0..n * k).map(|i| c.b[(i % n) * k + i / n]).collect();
        p.set_input(b_in, &bt).unwrap();
    } else {
        p.set_input(b_in, &c.b).unwrap();
    }
    p.compute().unwrap();
    p.check_guards().unwrap();
    // A second compute gives the same result (nothing in the plan is consumed).
    let first = p.output::<f32>(y).unwrap().to_vec();
    p.compute().unwrap();
    assert_eq!(first, p.output::<f32>(y).unwrap());
    first
}

/// Column counts around the 4-column kernel and the 64-column task; rows around the 4-group task;
/// K across several 2048-element chunks with a tail.
fn shapes(ty: DType) -> Vec<([usize; 4], [usize; 4])> {
    let bs = ty.block_size();
    let k1 = bs.max(32) * 3;
    let k2 = 2048 + 2 * bs.max(256);
    let mut v = Vec::new();
    for n in [1, 2, 3, 4, 5, 7, 9, 16, 67] {
        v.push(([k1, 40, 1, 1], [k1, n, 1, 1]));
    }
    v.push(([k2, 8, 1, 1], [k2, 1, 1, 1]));
    v.push(([k2, 16, 1, 1], [k2, 6, 1, 1]));
    // Broadcast over dims 2 and 3.
    v.push(([k1, 8, 2, 1], [k1, 3, 4, 3]));
    v
}

/// The repacked result against the f64 reference (test-backend-ops' matmul NMSE limit) and the
/// plain path (the same integer sums, only float rounding of the scales may differ).
fn check_near(what: &str, rep: &[f32], want: &[f64], plain: &[f32]) {
    let e_ref = nmse(rep, want);
    assert!(e_ref < 5e-4, "{what}: repacked vs f64 NMSE {e_ref}");
    let plain64: Vec<f64> = plain.iter().map(|&v| v as f64).collect();
    let e_plain = nmse(rep, &plain64);
    assert!(e_plain < 1e-10, "{what}: repacked vs plain NMSE {e_plain}");
}

#[test]
fn repacked_matches_plain_and_reference() {
    for ty in REPACK_TYPES {
        for (i, (ane, bne)) in shapes(ty).into_iter().enumerate() {
            let c = case(ty, ane, bne, 100 + i as u64);
            let want = matmul_f64(&c.a_val, ane, &c.b, bne);
            let plain = run(&c, false, Isa::best(), 2);
            let rep = run(&c, true, Isa::best(), 2);
            check_near(&format!("{ty} {ane:?} x {bne:?}"), &rep, &want, &plain);
        }
    }
}

#[test]
fn repacked_strided_activations() {
    for ty in REPACK_TYPES {
        let k = 2 * ty.block_size().max(256);
        let mut c = case(ty, [k, 16, 1, 1], [k, 5, 1, 1], 7);
        c.b_transposed = true;
        let plain = run(&c, false, Isa::best(), 2);
        let rep = run(&c, true, Isa::best(), 2);
        let plain64: Vec<f64> = plain.iter().map(|&v| v as f64).collect();
        assert!(nmse(&rep, &plain64) < 1e-10, "{ty}");
    }
}

#[test]
fn repacked_is_thread_invariant_and_tiers_agree() {
    for ty in REPACK_TYPES {
        let k = 2048 + ty.block_size().max(256);
        let c = case(ty, [k, 48, 1, 1], [k, 70, 1, 1], 3);
        let base = run(&c, true, Isa::Scalar, 1);
        for isa in tiers() {
            // Prefill takes the repacked kernels (the scalar tier's bits) or, on tiers with
            // integer GEMM kernels, the integer GEMM (the plain layout's bits on that tier).
            let plain = run(&c, false, isa, 1);
            for threads in [1, 2, 3] {
                let got = run(&c, true, isa, threads);
                assert!(got == base || got == plain, "{ty} {isa:?} {threads} threads");
            }
        }
        let d = case(ty, [k, 16, 1, 1], [k, 1, 1, 1], 4);
        let base = run(&d, true, Isa::Scalar, 1);
        for isa in tiers() {
            assert!(run(&d, true, isa, 3) == base, "{ty} decode {isa:?}");
        }
    }
}

#[test]
fn repacked_misuse_is_an_error() {
    let buft = CpuRepackBufferType;
    assert_eq!(buft.name(), "CPU_REPACK");
    assert!(buft.supports_tensor(DType::Q4_0, &[64, 8]));
    assert!(!buft.supports_tensor(DType::Q4_0, &[64, 12]));
    assert!(!buft.supports_tensor(DType::Q8_0, &[64, 8]));
    let w = vec![0u8; DType::Q4_0.row_size(64).unwrap() * 8];
    let buf = buft.alloc(w.len() * 2).unwrap();
    // Raw writes would bypass the layout.
    assert!(buf.write(0, &w).is_err());
    assert!(buf.set_tensor(0, DType::Q8_0, &[64, 8], &vec![0u8; 68 * 8]).is_err());
    assert!(buf.set_tensor(0, DType::Q4_0, &[64, 8], &w[1..]).is_err());
    buf.set_tensor(0, DType::Q4_0, &[64, 8], &w).unwrap();
    let mut g = Graph::new();
    // Not stored there with this shape / type / offset.
    assert!(g.weight(DType::Q4_0, &[64, 8], &buf, w.len()).is_err());
    assert!(g.weight(DType::Q4_0, &[32, 16], &buf, 0).is_err());
    assert!(g.state(DType::Q4_0, &[64, 8], &buf, 0).is_err());
    let wt = g.weight(DType::Q4_0, &[64, 8], &buf, 0).unwrap();
    // Only mul_mat's first source, whole, with F32 activations.
    let ids = g.input(DType::I32, &[2]).unwrap();
    let e = g.get_rows(wt, ids).unwrap_err();
    assert!(e.to_string().contains("repacked"), "{e}");
    assert!(g.view_2d(wt, [64, 4], DType::Q4_0.row_size(64).unwrap(), 0).is_err());
    let x16 = g.input(DType::F16, &[64, 2]).unwrap();
    assert!(g.mul_mat(wt, x16).is_err());
    let x = g.input(DType::F32, &[64, 2]).unwrap();
    assert!(g.mul_mat(x, wt).is_err());
    assert!(g.mul_mat(wt, x).is_ok());
}

/// A mul_mat_id case: `n_as` experts `[k, m]`, b `[k, n_b, n_tok]`, ids `[n_used, n_tok]`.
struct IdCase {
    ty: DType,
    k: usize,
    m: usize,
    n_as: usize,
    n_b: usize,
    n_used: usize,
    n_tok: usize,
    a_bytes: Vec<u8>,
    a_val: Vec<f32>,
    b: Vec<f32>,
    ids: Vec<i32>,
}

#[allow(clippy::too_many_arguments)]
fn id_case(
    ty: DType,
    k: usize,
    m: usize,
    n_as: usize,
    n_b: usize,
    n_used: usize,
    n_tok: usize,
    seed: u64,
) -> IdCase {
    let c = case(ty, [k, m, n_as, 1], [k, n_b, n_tok, 1], seed);
    // Distinct experts per token, spread unevenly (expert 0 is picked most).
    let ids = (0..n_tok)
        .flat_map(|t| (0..n_used).map(move |s| ((t * 7 + s * (1 + t % 3)) % n_as) as i32))
        .collect();
    IdCase { ty, k, m, n_as, n_b, n_used, n_tok, a_bytes: c.a_bytes, a_val: c.a_val, b: c.b, ids }
}

/// mul_mat_id on the experts stored repacked or plain.
fn run_id(c: &IdCase, repacked: bool, isa: Isa, threads: usize) -> Vec<f32> {
    let be = CpuBackend::with_isa(threads, isa).unwrap();
    let ne = [c.k, c.m, c.n_as];
    let buf = if repacked {
        CpuRepackBufferType.alloc(c.a_bytes.len()).unwrap()
    } else {
        Buffer::alloc(c.a_bytes.len()).unwrap()
    };
    buf.set_tensor(0, c.ty, &ne, &c.a_bytes).unwrap();
    let mut g = Graph::new();
    let a = g.weight(c.ty, &ne, &buf, 0).unwrap();
    let b = g.input(DType::F32, &[c.k, c.n_b, c.n_tok]).unwrap();
    let ids = g.input(DType::I32, &[c.n_used, c.n_tok]).unwrap();
    let y = g.mul_mat_id(a, b, ids).unwrap();
    g.set_output(y).unwrap();
    let mut p = Plan::with_guards(g, &be, 64).unwrap();
    p.set_input(b, &c.b).unwrap();
    p.set_input(ids, &c.ids).unwrap();
    p.compute().unwrap();
    p.check_guards().unwrap();
    p.output::<f32>(y).unwrap().to_vec()
}

/// Each (token, slot) pair's output from a repacked `mul_mat` of its expert against the b rows
/// of the pairs routed to that expert, in pair order (the column count mul_mat_id sees for the
/// expert, so the same path): `out[t * n_used + s]`, m values.
fn per_pair_repacked(c: &IdCase) -> Vec<Vec<f32>> {
    let row = c.ty.row_size(c.k).unwrap();
    let mut out = vec![Vec::new(); c.n_tok * c.n_used];
    for e in 0..c.n_as {
        let pairs: Vec<(usize, usize)> = (0..c.n_tok)
            .flat_map(|t| (0..c.n_used).map(move |s| (t, s)))
            .filter(|&(t, s)| c.ids[t * c.n_used + s] as usize == e)
            .collect();
        if pairs.is_empty() {
            continue;
        }
        let mut bb = Vec::with_capacity(c.k * pairs.len());
        for &(t, s) in &pairs {
            let col = t * c.n_b + s % c.n_b;
            bb.extend_from_slice(&c.b[col * c.k..(col + 1) * c.k]);
        }
        let cc = Case {
            ty: c.ty,
            ane: [c.k, c.m, 1, 1],
            bne: [c.k, pairs.len(), 1, 1],
            b_transposed: false,
            a_bytes: c.a_bytes[e * c.m * row..(e + 1) * c.m * row].to_vec(),
            a_val: c.a_val[e * c.m * c.k..(e + 1) * c.m * c.k].to_vec(),
            b: bb,
        };
        let y = run(&cc, true, Isa::best(), 2);
        for (j, &(t, s)) in pairs.iter().enumerate() {
            out[t * c.n_used + s] = y[j * c.m..(j + 1) * c.m].to_vec();
        }
    }
    out
}

/// Shapes: decode (one pair per expert), a few tokens, more pairs per expert than a task's 64
/// columns, K across the 2048-element chunks, b shared by the slots (n_b = 1).
fn id_shapes(ty: DType) -> Vec<[usize; 6]> {
    let bs = ty.block_size();
    let k1 = bs.max(32) * 3;
    let k2 = 2048 + 2 * bs.max(256);
    // [k, m, n_as, n_b, n_used, n_tok]
    vec![
        [k1, 40, 4, 2, 2, 1],
        [k1, 24, 4, 2, 2, 5],
        [k1, 16, 3, 1, 2, 9],
        [k1, 8, 2, 2, 2, 70],
        [k2, 16, 4, 2, 2, 7],
    ]
}

#[test]
fn repacked_mul_mat_id_matches_plain_per_expert_and_reference() {
    for ty in REPACK_TYPES {
        for (i, [k, m, n_as, n_b, n_used, n_tok]) in id_shapes(ty).into_iter().enumerate() {
            let c = id_case(ty, k, m, n_as, n_b, n_used, n_tok, 300 + i as u64);
            let what =
                format!("{ty} k={k} m={m} experts={n_as} n_b={n_b} used={n_used} tokens={n_tok}");
            let rep = run_id(&c, true, Isa::best(), 2);
            let plain = run_id(&c, false, Isa::best(), 2);
            let per = per_pair_repacked(&c);
            let mut want = Vec::with_capacity(rep.len());
            for t in 0..n_tok {
                for s in 0..n_used {
                    let e = c.ids[t * n_used + s] as usize;
                    let col = t * n_b + s % n_b;
                    let ex = &per[t * n_used + s][..];
                    let got = &rep[(t * n_used + s) * m..(t * n_used + s + 1) * m];
                    assert!(
                        got == ex,
                        "{what}: pair ({s}, {t}) differs from expert {e}'s repacked mul_mat"
                    );
                    let a = &c.a_val[e * m * k..(e + 1) * m * k];
                    let x = &c.b[col * k..(col + 1) * k];
                    for r in 0..m {
                        want.push((0..k).map(|l| a[r * k + l] as f64 * x[l] as f64).sum::<f64>());
                    }
                }
            }
            check_near(&what, &rep, &want, &plain);
        }
    }
}

#[test]
fn repacked_mul_mat_id_is_thread_invariant_and_tiers_agree() {
    for ty in REPACK_TYPES {
        let k = 2048 + ty.block_size().max(256);
        for c in [id_case(ty, k, 24, 3, 2, 2, 40, 9), id_case(ty, k, 16, 4, 1, 2, 1, 10)] {
            let base = run_id(&c, true, Isa::Scalar, 1);
            for isa in tiers() {
                // As for mul_mat: the repacked kernels' bits, or the integer GEMM's, which are
                // the plain layout's on that tier.
                let plain = run_id(&c, false, isa, 1);
                for threads in [1, 2, 3] {
                    let got = run_id(&c, true, isa, threads);
                    let ok = got == base || got == plain;
                    assert!(ok, "{ty} tokens={} {isa:?} {threads} threads", c.n_tok);
                }
            }
        }
    }
}

#[test]
fn repacked_mul_mat_id_misuse_is_an_error() {
    let (k, m, n_as) = (64, 8, 2);
    let w = vec![0u8; DType::Q4_0.row_size(k).unwrap() * m * n_as];
    let buf = CpuRepackBufferType.alloc(w.len()).unwrap();
    buf.set_tensor(0, DType::Q4_0, &[k, m, n_as], &w).unwrap();
    let mut g = Graph::new();
    let a = g.weight(DType::Q4_0, &[k, m, n_as], &buf, 0).unwrap();
    let ids = g.input(DType::I32, &[1, 2]).unwrap();
    // Activations already in Q8_0 are fine for plain experts, not for repacked ones.
    let bq = g.input(DType::Q8_0, &[k, 1, 2]).unwrap();
    let e = g.mul_mat_id(a, bq, ids).unwrap_err();
    assert!(e.to_string().contains("repacked"), "{e}");
    // A repacked tensor is never mul_mat_id's activations.
    let x = g.input(DType::F32, &[k, 1, 2]).unwrap();
    assert!(g.mul_mat_id(x, a, ids).is_err());
    assert!(g.mul_mat_id(a, x, ids).is_ok());
}
