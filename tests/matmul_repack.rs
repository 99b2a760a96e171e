//! Repacked weights (CPU_REPACK buffer type): mul_mat on repacked weights equals mul_mat on the
//! same weights in a plain buffer and the f64 reference of the dequantized weights, for decode and
//! prefill column counts, task and K-chunk tails, broadcasts and strided activations; thread-count
//! invariance; every ISA tier against the scalar one; and the build-time errors for misuse.

mod common;

use common::{matmul_f64, nmse, rand_f32, tiers};
use quantgraph::backend::repack::REPACK_TYPES;
use quantgraph::kernels::{Isa, set_isa};
use quantgraph::quant::{dequantize, quantize};
use quantgraph::{Buffer, BufferType, CpuBackend, CpuRepackBufferType, DType, Graph, Plan};
use std::sync::Mutex;

static ISA_LOCK: Mutex<()> = Mutex::new(());

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
    set_isa(isa).unwrap();
    let be = CpuBackend::with_threads(threads).unwrap();
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
    g.set_output(y);
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
    set_isa(Isa::best()).unwrap();
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

#[test]
fn repacked_matches_plain_and_reference() {
    let _l = ISA_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    for ty in REPACK_TYPES {
        for (i, (ane, bne)) in shapes(ty).into_iter().enumerate() {
            let c = case(ty, ane, bne, 100 + i as u64);
            let want = matmul_f64(&c.a_val, ane, &c.b, bne);
            let plain = run(&c, false, Isa::best(), 2);
            let rep = run(&c, true, Isa::best(), 2);
            let e_ref = nmse(&rep, &want);
            assert!(e_ref < 5e-4, "{ty} {ane:?} x {bne:?}: repacked vs f64 NMSE {e_ref}");
            let plain64: Vec<f64> = plain.iter().map(|&v| v as f64).collect();
            let e_plain = nmse(&rep, &plain64);
            assert!(e_plain < 1e-10, "{ty} {ane:?} x {bne:?}: repacked vs plain NMSE {e_plain}");
        }
    }
}

#[test]
fn repacked_strided_activations() {
    let _l = ISA_LOCK.lock().unwrap_or_else(|e| e.into_inner());
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
    let _l = ISA_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    for ty in REPACK_TYPES {
        let k = 2048 + ty.block_size().max(256);
        let c = case(ty, [k, 48, 1, 1], [k, 70, 1, 1], 3);
        let base = run(&c, true, Isa::Scalar, 1);
        for isa in tiers() {
            for threads in [1, 2, 3] {
                let got = run(&c, true, isa, threads);
                assert!(got == base, "{ty} {isa:?} {threads} threads differs from scalar 1 thread");
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
