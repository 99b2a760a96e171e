//! mul_mat_id and out_prod against plain f64 references with test-backend-ops' shapes and NMSE
//! limits, for every weight type they accept; mul_mat_id also bitwise against per-expert mul_mats,
//! out-of-range ids, build-time shape and type errors, and thread-count invariance (1, 2 and 3
//! threads bitwise). Every plan has guard bytes around its tensors.

mod common;

use common::{each, nmse};
use quantgraph::kernels::{Isa, selected_isa, vec_dot_with};
use quantgraph::quant::{dequantize, quantize, quantize_for_dot};
use quantgraph::testdata::{Xorshift64, rand_f32, random_blocks};
use quantgraph::{CpuBackend, DType, Error, Graph, Plan, TensorId};

/// Types whose reference quantizer needs an importance matrix or builds grid tables that take
/// seconds in a test build; their weights are random valid blocks instead.
const RANDOM_BLOCK_TYPES: [DType; 5] =
    [DType::IQ1_S, DType::IQ1_M, DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S];

/// `x` in type `ty`: the reference quantizer, the plain conversion of float types, or (for
/// [`RANDOM_BLOCK_TYPES`]) random valid blocks seeded from `x`; `None` when the type has none.
fn encode(ty: DType, x: &[f32]) -> Option<Vec<u8>> {
    if RANDOM_BLOCK_TYPES.contains(&ty) {
        return Some(random_blocks(ty, x.len(), x.len() as u64 ^ x[0].to_bits() as u64).unwrap());
    }
    let mut q = vec![0u8; ty.row_size(x.len()).ok()?];
    if quantize(ty, x, &mut q).is_ok() || quantize_for_dot(ty, x, &mut q).is_ok() {
        Some(q)
    } else {
        None
    }
}

fn decode(ty: DType, q: &[u8], n: usize) -> Vec<f32> {
    let mut v = vec![0f32; n];
    dequantize(ty, q, &mut v).unwrap();
    v
}

/// True when `ty` has a dot-product kernel (so mul_mat and mul_mat_id accept it as weights).
fn has_dot(ty: DType) -> bool {
    let k = 256;
    let (Ok(xs), Ok(ys)) = (ty.row_size(k), ty.vec_dot_type().row_size(k)) else {
        return false;
    };
    vec_dot_with(Isa::Scalar, ty, k, &vec![0u8; xs], &vec![0u8; ys]).is_ok()
}

/// Weight types with a dot product that we can make weights for.
fn weight_types() -> Vec<DType> {
    DType::ALL
        .into_iter()
        .filter(|&t| has_dot(t) && encode(t, &rand_f32(256, 1)).is_some())
        .collect()
}

/// test-backend-ops' ids: per token a shuffle of `i % n_mats`, of which the first `n_used` are
/// read through a strided view when `n_used < n_mats`.
fn make_ids(n_mats: usize, n_tok: usize, seed: u64) -> Vec<i32> {
    let mut r = Xorshift64::new(seed);
    let mut out = Vec::with_capacity(n_mats * n_tok);
    for _ in 0..n_tok {
        let mut row: Vec<i32> = (0..n_mats as i32).collect();
        for i in (1..n_mats).rev() {
            row.swap(i, (r.next_u64() % (i as u64 + 1)) as usize);
        }
        out.extend(row);
    }
    out
}

struct MoeCase {
    ty: DType,
    n_mats: usize,
    n_used: usize,
    /// b has one row shared by the slots instead of one per slot.
    bcast: bool,
    m: usize,
    n: usize,
    k: usize,
    as_q: Vec<u8>,
    as_f: Vec<f32>,
    b: Vec<f32>,
    /// [n_mats, n] (the op reads the first n_used of each row).
    ids: Vec<i32>,
    /// The tier every plan of the case runs (the backend's, so runs compared bitwise agree on
    /// it whatever other tests do).
    isa: Isa,
}

impl MoeCase {
    #[allow(clippy::too_many_arguments)]
    fn new(
        ty: DType,
        n_mats: usize,
        n_used: usize,
        bcast: bool,
        m: usize,
        n: usize,
        k: usize,
        seed: u64,
    ) -> MoeCase {
        let x = rand_f32(k * m * n_mats, seed);
        let as_q = encode(ty, &x).unwrap();
        let as_f = decode(ty, &as_q, x.len());
        let nb = if bcast { 1 } else { n_used };
        let b = rand_f32(k * nb * n, seed + 7);
        let ids = make_ids(n_mats, n, seed + 13);
        MoeCase { ty, n_mats, n_used, bcast, m, n, k, as_q, as_f, b, ids, isa: selected_isa() }
    }

    fn nb(&self) -> usize {
        if self.bcast { 1 } else { self.n_used }
    }

    fn id(&self, s: usize, t: usize) -> usize {
        self.ids[t * self.n_mats + s] as usize
    }

    /// Builds the graph: (graph, as, b, ids input, out).
    fn graph(&self) -> (Graph, TensorId, TensorId, TensorId, TensorId) {
        let mut g = Graph::new();
        let a = g.input(self.ty, &[self.k, self.m, self.n_mats]).unwrap();
        let b = g.input(DType::F32, &[self.k, self.nb(), self.n]).unwrap();
        let ids_in = g.input(DType::I32, &[self.n_mats, self.n]).unwrap();
        let ids = if self.n_used != self.n_mats {
            g.view_2d(ids_in, [self.n_used, self.n], self.n_mats * 4, 0).unwrap()
        } else {
            ids_in
        };
        let y = g.mul_mat_id(a, b, ids).unwrap();
        g.set_output(y).unwrap();
        (g, a, b, ids_in, y)
    }

    fn run(&self, threads: usize) -> Vec<f32> {
        let (g, a, b, ids, y) = self.graph();
        let be = CpuBackend::with_isa(threads, self.isa).unwrap();
        let mut p = Plan::with_guards(g, &be, 64).unwrap();
        p.set_input_bytes(a, &self.as_q).unwrap();
        p.set_input(b, &self.b).unwrap();
        p.set_input(ids, &self.ids).unwrap();
        p.compute().unwrap();
        p.check_guards().unwrap();
        p.output::<f32>(y).unwrap().to_vec()
    }

    /// f64 reference from the dequantized weights: [m, n_used, n].
    fn reference(&self) -> Vec<f64> {
        let (k, m) = (self.k, self.m);
        let mut out = Vec::with_capacity(m * self.n_used * self.n);
        for t in 0..self.n {
            for s in 0..self.n_used {
                let e = self.id(s, t);
                let br = &self.b[(t * self.nb() + s % self.nb()) * k..][..k];
                for i in 0..m {
                    let ar = &self.as_f[(e * m + i) * k..][..k];
                    out.push(ar.iter().zip(br).map(|(x, y)| *x as f64 * *y as f64).sum());
                }
            }
        }
        out
    }

    /// The same products as one mul_mat per expert over the b rows of that expert's (slot,
    /// token) pairs, gathered in mul_mat_id's order: one column runs `vec_dot`, two to five the
    /// register tiles (bitwise `vec_dot`), six or more the GEMM; mul_mat_id takes the same path
    /// per expert and must match bitwise.
    fn per_expert_mul_mats(&self) -> Vec<f32> {
        let (k, m) = (self.k, self.m);
        let row = self.ty.row_size(k).unwrap();
        let mut out = vec![f32::NAN; m * self.n_used * self.n];
        for e in 0..self.n_mats {
            let pairs: Vec<(usize, usize)> = (0..self.n)
                .flat_map(|t| (0..self.n_used).map(move |s| (s, t)))
                .filter(|&(s, t)| self.id(s, t) == e)
                .collect();
            if pairs.is_empty() {
                continue;
            }
            let mut g = Graph::new();
            let a = g.input(self.ty, &[k, m]).unwrap();
            let b = g.input(DType::F32, &[k, pairs.len()]).unwrap();
            let y = g.mul_mat(a, b).unwrap();
            g.set_output(y).unwrap();
            let be = CpuBackend::with_isa(2, self.isa).unwrap();
            let mut p = Plan::with_guards(g, &be, 64).unwrap();
            p.set_input_bytes(a, &self.as_q[e * m * row..(e + 1) * m * row]).unwrap();
            let bv: Vec<f32> = pairs
                .iter()
                .flat_map(|&(s, t)| self.b[(t * self.nb() + s % self.nb()) * k..][..k].to_vec())
                .collect();
            p.set_input(b, &bv).unwrap();
            p.compute().unwrap();
            p.check_guards().unwrap();
            let o = p.output::<f32>(y).unwrap();
            for (j, &(s, t)) in pairs.iter().enumerate() {
                out[(t * self.n_used + s) * m..][..m].copy_from_slice(&o[j * m..(j + 1) * m]);
            }
        }
        out
    }
}

#[test]
fn mul_mat_id_accepts_exactly_the_types_with_a_dot_product() {
    // Every type with a dot product gets weights in the tests below.
    let with_dot: Vec<DType> = DType::ALL.into_iter().filter(|&t| has_dot(t)).collect();
    assert_eq!(weight_types(), with_dot);
    assert!(with_dot.len() >= 25, "{with_dot:?}");
    for t in DType::ALL {
        let Ok(k) = t.row_size(256).map(|_| 256) else { continue };
        let mut g = Graph::new();
        let a = g.input(t, &[k, 4, 2]).unwrap();
        let b = g.input(DType::F32, &[k, 1, 3]).unwrap();
        let ids = g.input(DType::I32, &[2, 3]).unwrap();
        let r = g.mul_mat_id(a, b, ids);
        assert_eq!(r.is_ok(), has_dot(t), "{t}: {r:?}");
        if let Err(e) = r {
            assert!(matches!(e, Error::Type { op: "mul_mat_id", .. }), "{t}: {e}");
        }
    }
}

/// Every weight type on test-backend-ops' sweep shapes (n_mats 4, k 256), scaled down in m.
#[test]
fn mul_mat_id_every_type_matches_f64_and_per_expert_mul_mat() {
    let combos: [(usize, bool, usize, usize); 5] = [
        (1, false, 16, 1),
        (2, false, 33, 5),
        (4, true, 16, 17),
        (3, false, 17, 4),
        (2, true, 20, 33),
    ];
    for ty in weight_types() {
        for (ci, &(n_used, bcast, m, n)) in combos.iter().enumerate() {
            let c = MoeCase::new(ty, 4, n_used, bcast, m, n, 256, 100 + ci as u64);
            let got = c.run(2);
            let want = c.reference();
            let e = nmse(&got, &want);
            assert!(e < 5e-4, "{ty} n_used={n_used} b={bcast} m={m} n={n}: nmse {e}");
            let mm = c.per_expert_mul_mats();
            let diff = got.iter().zip(&mm).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
            assert_eq!(
                diff, 0,
                "{ty} n_used={n_used} b={bcast} m={m} n={n}: {diff} elements differ from per-expert mul_mat"
            );
        }
    }
}

/// The full n_used x broadcast x n_tokens sweep for the types with register-tile kernels.
#[test]
fn mul_mat_id_sweep_q4_0_q8_0_f32() {
    for ty in [DType::Q4_0, DType::Q8_0, DType::F32] {
        for n_used in [1, 2, 4] {
            for bcast in [false, true] {
                for n in [1, 4, 5, 17, 33] {
                    let c = MoeCase::new(ty, 4, n_used, bcast, 33, n, 256, n as u64);
                    let e = nmse(&c.run(2), &c.reference());
                    assert!(e < 5e-4, "{ty} n_used={n_used} b={bcast} n={n}: nmse {e}");
                }
            }
        }
    }
}

#[test]
fn mul_mat_id_single_expert_and_all_tokens_on_one_expert() {
    // n_mats = 1 (test-backend-ops' F16 1x1 case) and ids all equal (one expert gets every pair).
    let c = MoeCase::new(DType::F16, 1, 1, false, 8, 16, 256, 5);
    assert!(nmse(&c.run(3), &c.reference()) < 5e-4);
    let mut c = MoeCase::new(DType::Q8_0, 8, 2, false, 40, 33, 256, 6);
    for t in 0..c.n {
        c.ids[t * 8] = 3;
        c.ids[t * 8 + 1] = 3;
    }
    let e = nmse(&c.run(2), &c.reference());
    assert!(e < 5e-4, "nmse {e}");
}

#[test]
fn mul_mat_id_is_thread_count_invariant() {
    for ty in [DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::F16, DType::F32, DType::IQ4_NL] {
        let c = MoeCase::new(ty, 4, 2, false, 33, 17, 256, 9);
        let one = c.run(1);
        for threads in [2, 3] {
            let other = c.run(threads);
            assert!(
                one.iter().zip(&other).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{ty}: {threads} threads differ from 1"
            );
        }
    }
}

/// Experts with more weight rows than one GEMM block (96) and more pairs than one block of
/// columns (512): the chunks cover every output once, bitwise as the per-expert mul_mat.
#[test]
fn mul_mat_id_gemm_blocks_cover_many_rows_and_pairs() {
    for ty in [DType::Q4_0, DType::F16] {
        check_against_mul_mat(&MoeCase::new(ty, 2, 2, false, 100, 600, 64, 5), 3);
    }
}

/// `c` on `threads` threads against the f64 reference and bitwise against the per-expert
/// mul_mats, and the same bits on one thread.
fn check_against_mul_mat(c: &MoeCase, threads: usize) {
    let ty = c.ty;
    let got = c.run(threads);
    let e = nmse(&got, &c.reference());
    assert!(e < 5e-4, "{ty}: nmse {e}");
    let mm = c.per_expert_mul_mats();
    assert!(got.iter().zip(&mm).all(|(x, y)| x.to_bits() == y.to_bits()), "{ty}");
    assert_eq!(c.run(1), got, "{ty}: 1 vs {threads} threads");
}

/// Rows longer than the packers' 256-value chunks (and not a multiple of them) on the float
/// GEMM: against the f64 reference, bitwise as the per-expert mul_mat, for 1 and 2 threads.
#[test]
fn mul_mat_id_float_gemm_packs_long_rows() {
    for ty in [DType::F16, DType::F32] {
        check_against_mul_mat(&MoeCase::new(ty, 3, 2, false, 20, 24, 2 * 256 + 64, 31), 2);
    }
}

/// Every SIMD tier this CPU has, against the f64 reference and bitwise against per-expert
/// mul_mats on the same tier; out_prod against its reference on every tier.
#[test]
fn every_tier_matches_reference_and_mul_mat() {
    for isa in Isa::ALL.into_iter().filter(|i| i.is_supported()) {
        for ty in [DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::IQ4_NL, DType::F16, DType::F32] {
            let c = MoeCase { isa, ..MoeCase::new(ty, 4, 2, false, 33, 17, 256, 21) };
            let got = c.run(2);
            let e = nmse(&got, &c.reference());
            assert!(e < 5e-4, "{ty} on {isa:?}: nmse {e}");
            let mm = c.per_expert_mul_mats();
            assert!(
                got.iter().zip(&mm).all(|(x, y)| x.to_bits() == y.to_bits()),
                "{ty} on {isa:?}: differs from mul_mat"
            );
        }
        for ty in [DType::F32, DType::F16, DType::Q4_0] {
            let c =
                OutProdCase { isa, ..OutProdCase::new(ty, [256, 16, 2, 1], [16, 16, 2, 1], 22) };
            let e = nmse(&c.run(2), &c.reference());
            assert!(e < c.limit(), "out_prod {ty} on {isa:?}: nmse {e}");
        }
    }
}

#[test]
fn mul_mat_id_out_of_range_ids_fail_at_compute_and_plan_recovers() {
    let c = MoeCase::new(DType::Q4_0, 4, 2, false, 16, 5, 256, 11);
    let (g, a, b, ids, y) = c.graph();
    let be = CpuBackend::with_threads(2).unwrap();
    let mut p = Plan::with_guards(g, &be, 64).unwrap();
    p.set_input_bytes(a, &c.as_q).unwrap();
    p.set_input(b, &c.b).unwrap();
    for bad in [4, -1, i32::MAX, i32::MIN] {
        let mut wrong = c.ids.clone();
        wrong[3 * 4 + 1] = bad; // token 3, slot 1 (inside the view)
        p.set_input(ids, &wrong).unwrap();
        match p.compute() {
            Err(Error::IndexOutOfRange { op: "mul_mat_id", index, limit: 4, .. }) => {
                assert_eq!(index, bad as i64)
            }
            other => panic!("id {bad}: expected IndexOutOfRange, got {other:?}"),
        }
    }
    // Outside the view (slots n_used.. of the ids row) nothing is read.
    let mut ignored = c.ids.clone();
    ignored[3 * 4 + 2] = 99;
    p.set_input(ids, &ignored).unwrap();
    p.compute().unwrap();
    p.check_guards().unwrap();
    let e = nmse(p.output::<f32>(y).unwrap(), &c.reference());
    assert!(e < 5e-4, "after errors: nmse {e}");
}

#[test]
fn mul_mat_id_rejects_bad_shapes_and_types_at_build() {
    let mut g = Graph::new();
    let a = g.input(DType::Q4_0, &[256, 16, 4]).unwrap();
    let a4 = g.input(DType::Q4_0, &[256, 16, 2, 2]).unwrap();
    let b = g.input(DType::F32, &[256, 2, 5]).unwrap();
    let b1 = g.input(DType::F32, &[256, 1, 5]).unwrap();
    let b_k = g.input(DType::F32, &[128, 2, 5]).unwrap();
    let b3 = g.input(DType::F32, &[256, 3, 5]).unwrap();
    let b16 = g.input(DType::F16, &[256, 2, 5]).unwrap();
    let ids = g.input(DType::I32, &[2, 5]).unwrap();
    let ids_f = g.input(DType::F32, &[2, 5]).unwrap();
    let ids_t = g.input(DType::I32, &[2, 4]).unwrap();
    let ids_3d = g.input(DType::I32, &[2, 5, 2]).unwrap();
    assert!(g.mul_mat_id(a, b, ids).is_ok());
    assert!(g.mul_mat_id(a, b1, ids).is_ok());
    let shape =
        |r: quantgraph::Result<TensorId>| matches!(r, Err(Error::Shape { op: "mul_mat_id", .. }));
    let ty =
        |r: quantgraph::Result<TensorId>| matches!(r, Err(Error::Type { op: "mul_mat_id", .. }));
    assert!(ty(g.mul_mat_id(a, b, ids_f)));
    assert!(ty(g.mul_mat_id(a, b16, ids)));
    assert!(shape(g.mul_mat_id(a4, b, ids)));
    assert!(shape(g.mul_mat_id(a, b_k, ids)));
    assert!(shape(g.mul_mat_id(a, b3, ids)));
    assert!(shape(g.mul_mat_id(a, b, ids_t)));
    assert!(shape(g.mul_mat_id(a, b, ids_3d)));
    let a32 = g.input(DType::F32, &[16, 256, 4]).unwrap();
    let at = g.transpose(a32).unwrap();
    assert!(shape(g.mul_mat_id(at, b, ids)), "transposed experts");
    let msg = g.mul_mat_id(a, b_k, ids).unwrap_err().to_string();
    assert!(
        msg.contains("mul_mat_id") && msg.contains("[256, 16, 4") && msg.contains("[128"),
        "{msg}"
    );
}

// ---------------------------------------------------------------------------------------------
// out_prod

/// Types ggml's CPU out_prod runs for `a` (the cases of ggml_compute_forward_out_prod): F32,
/// F16 and every quantized weight type.
fn out_prod_accepted() -> Vec<DType> {
    [DType::F32, DType::F16].into_iter().chain(common::QUANT_WEIGHT_TYPES).collect()
}

/// Those we can make data for without an importance matrix.
fn out_prod_types() -> Vec<DType> {
    out_prod_accepted().into_iter().filter(|&t| encode(t, &rand_f32(256, 2)).is_some()).collect()
}

#[test]
fn out_prod_accepts_exactly_ggml_cpu_types() {
    for t in DType::ALL {
        let Ok(m) = t.row_size(256).map(|_| 256) else { continue };
        let mut g = Graph::new();
        let a = g.input(t, &[m, 4, 2]).unwrap();
        let b = g.input(DType::F32, &[3, 4, 2]).unwrap();
        let r = g.out_prod(a, b);
        assert_eq!(r.is_ok(), out_prod_accepted().contains(&t), "{t}: {r:?}");
        if let Err(e) = r {
            assert!(matches!(e, Error::Type { op: "out_prod", .. }), "{t}: {e}");
        }
    }
}

struct OutProdCase {
    ty: DType,
    /// a's shape [m, k, p, q] and b's [n, k, p*r, q*s].
    ane: [usize; 4],
    bne: [usize; 4],
    a_q: Vec<u8>,
    a_f: Vec<f32>,
    b: Vec<f32>,
    /// b is fed as [k, n, ..] and transposed in the graph.
    trans_b: bool,
    /// a is fed with dims 2 and 3 swapped and permuted back in the graph.
    perm_a: bool,
    /// The tier every plan of the case runs.
    isa: Isa,
}

impl OutProdCase {
    fn new(ty: DType, ane: [usize; 4], bne: [usize; 4], seed: u64) -> OutProdCase {
        let x = rand_f32(ane.iter().product(), seed);
        let a_q = encode(ty, &x).unwrap();
        let a_f = decode(ty, &a_q, x.len());
        let b = rand_f32(bne.iter().product(), seed + 3);
        let isa = selected_isa();
        OutProdCase { ty, ane, bne, a_q, a_f, b, trans_b: false, perm_a: false, isa }
    }

    fn a(&self, i: usize, l: usize, i2: usize, i3: usize) -> f64 {
        let ne = self.ane;
        self.a_f[((i3 * ne[2] + i2) * ne[1] + l) * ne[0] + i] as f64
    }

    fn b(&self, j: usize, l: usize, i2: usize, i3: usize) -> f64 {
        let ne = self.bne;
        self.b[((i3 * ne[2] + i2) * ne[1] + l) * ne[0] + j] as f64
    }

    fn reference(&self) -> Vec<f64> {
        let (m, k, n) = (self.ane[0], self.ane[1], self.bne[0]);
        let (r2, r3) = (self.bne[2] / self.ane[2], self.bne[3] / self.ane[3]);
        each([m, n, self.bne[2], self.bne[3]])
            .map(|[i, j, i2, i3]| {
                (0..k).map(|l| self.a(i, l, i2 / r2, i3 / r3) * self.b(j, l, i2, i3)).sum()
            })
            .collect()
    }

    /// Stores a (and b) in the memory layout the graph's views expect.
    fn run(&self, threads: usize) -> Vec<f32> {
        let [m, k, p, q] = self.ane;
        let [n, _, bp, bq] = self.bne;
        let mut g = Graph::new();
        let (a_in, a) = if self.perm_a {
            let a_in = g.input(self.ty, &[m, k, q, p]).unwrap();
            (a_in, g.permute(a_in, [0, 1, 3, 2]).unwrap())
        } else {
            let a_in = g.input(self.ty, &[m, k, p, q]).unwrap();
            (a_in, a_in)
        };
        let (b_in, b) = if self.trans_b {
            let b_in = g.input(DType::F32, &[k, n, bp, bq]).unwrap();
            (b_in, g.transpose(b_in).unwrap())
        } else {
            let b_in = g.input(DType::F32, &[n, k, bp, bq]).unwrap();
            (b_in, b_in)
        };
        let y = g.out_prod(a, b).unwrap();
        g.set_output(y).unwrap();
        let be = CpuBackend::with_isa(threads, self.isa).unwrap();
        let mut pl = Plan::with_guards(g, &be, 64).unwrap();
        let a_bytes = if self.perm_a {
            // a_in[.., .., i3, i2] = a[.., .., i2, i3]: move whole [m, k] matrices.
            let mat = self.a_q.len() / (p * q);
            let mut v = vec![0u8; self.a_q.len()];
            for i3 in 0..q {
                for i2 in 0..p {
                    v[(i2 * q + i3) * mat..][..mat]
                        .copy_from_slice(&self.a_q[(i3 * p + i2) * mat..][..mat]);
                }
            }
            v
        } else {
            self.a_q.clone()
        };
        pl.set_input_bytes(a_in, &a_bytes).unwrap();
        let b_data = if self.trans_b {
            each([k, n, bp, bq]).map(|[l, j, i2, i3]| self.b(j, l, i2, i3) as f32).collect()
        } else {
            self.b.clone()
        };
        pl.set_input(b_in, &b_data).unwrap();
        pl.compute().unwrap();
        pl.check_guards().unwrap();
        pl.output::<f32>(y).unwrap().to_vec()
    }

    fn limit(&self) -> f64 {
        if matches!(self.ty, DType::F32 | DType::F16) { 1e-7 } else { 5e-4 }
    }
}

/// test-backend-ops' F32 sweep: m 256, n and k in {1, 16}, batch {1, 3}^2, repeats {1, 2}^2.
#[test]
fn out_prod_f32_broadcast_sweep() {
    let mut seed = 0;
    for n in [1, 16] {
        for k in [1, 16] {
            for (bs2, bs3) in [(1, 1), (3, 1), (1, 3), (3, 3)] {
                for (nr2, nr3) in [(1, 1), (2, 1), (1, 2), (2, 2)] {
                    seed += 1;
                    let c = OutProdCase::new(
                        DType::F32,
                        [256, k, bs2, bs3],
                        [n, k, bs2 * nr2, bs3 * nr3],
                        seed,
                    );
                    let e = nmse(&c.run(2), &c.reference());
                    assert!(e < c.limit(), "n={n} k={k} bs=({bs2},{bs3}) nr=({nr2},{nr3}): {e}");
                }
            }
        }
    }
    // test-backend-ops' batched sweeps (ne2 up to 32, repeats up to 32), smaller.
    for (bs2, nr2) in [(8, 1), (1, 8), (2, 16)] {
        let c = OutProdCase::new(DType::F32, [256, 16, bs2, 1], [16, 16, bs2 * nr2, 1], 77);
        let e = nmse(&c.run(3), &c.reference());
        assert!(e < c.limit(), "bs2={bs2} nr2={nr2}: {e}");
    }
}

#[test]
fn out_prod_every_type_matches_f64() {
    let types = out_prod_types();
    assert_eq!(types, out_prod_accepted(), "every type ggml's CPU out_prod runs gets data");
    for ty in types {
        for (i, (n, k, bs)) in
            [(16, 16, (1, 1)), (1, 16, (3, 1)), (16, 1, (1, 3))].into_iter().enumerate()
        {
            let c = OutProdCase::new(ty, [256, k, bs.0, bs.1], [n, k, bs.0, bs.1], 40 + i as u64);
            let e = nmse(&c.run(2), &c.reference());
            assert!(e < c.limit(), "{ty} n={n} k={k} bs={bs:?}: nmse {e}");
        }
    }
}

#[test]
fn out_prod_transposed_b_and_permuted_a() {
    for ty in [DType::F32, DType::F16, DType::Q8_0] {
        for (trans_b, perm_a) in [(true, false), (false, true), (true, true)] {
            let (bne, nr) =
                if ty == DType::F32 { ([16, 16, 6, 2], 2) } else { ([16, 16, 3, 2], 1) };
            let mut c = OutProdCase::new(ty, [256, 16, 3, 2], bne, 50);
            c.trans_b = trans_b;
            c.perm_a = perm_a;
            let e = nmse(&c.run(2), &c.reference());
            assert!(e < c.limit(), "{ty} trans_b={trans_b} perm_a={perm_a} nr={nr}: nmse {e}");
        }
    }
}

#[test]
fn out_prod_is_thread_count_invariant() {
    for ty in [DType::F32, DType::F16, DType::Q4_K] {
        let bne = if ty == DType::F32 { [33, 16, 6, 1] } else { [33, 16, 3, 1] };
        let c = OutProdCase::new(ty, [256, 16, 3, 1], bne, 60);
        let one = c.run(1);
        for threads in [2, 3] {
            let other = c.run(threads);
            assert!(
                one.iter().zip(&other).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{ty}: {threads} threads differ from 1"
            );
        }
    }
}

#[test]
fn out_prod_rejects_what_ggml_cpu_does_not_run() {
    let mut g = Graph::new();
    let a = g.input(DType::F32, &[256, 16, 3]).unwrap();
    let a_q = g.input(DType::Q4_0, &[256, 16, 3]).unwrap();
    let a_bf = g.input(DType::BF16, &[256, 16, 3]).unwrap();
    let a_i = g.input(DType::I32, &[256, 16, 3]).unwrap();
    let b = g.input(DType::F32, &[8, 16, 3]).unwrap();
    let b6 = g.input(DType::F32, &[8, 16, 6]).unwrap();
    let b4 = g.input(DType::F32, &[8, 16, 4]).unwrap();
    let b_k = g.input(DType::F32, &[8, 15, 3]).unwrap();
    let b16 = g.input(DType::F16, &[8, 16, 3]).unwrap();
    let y = g.out_prod(a, b).unwrap();
    assert_eq!(g.shape(y).unwrap(), [256, 8, 3, 1]);
    let y = g.out_prod(a, b6).unwrap();
    assert_eq!(g.shape(y).unwrap(), [256, 8, 6, 1]);
    assert!(g.out_prod(a_q, b).is_ok());
    let shape =
        |r: quantgraph::Result<TensorId>| matches!(r, Err(Error::Shape { op: "out_prod", .. }));
    let ty = |r: quantgraph::Result<TensorId>| matches!(r, Err(Error::Type { op: "out_prod", .. }));
    assert!(shape(g.out_prod(a, b4)), "3 does not divide 4");
    assert!(shape(g.out_prod(a, b_k)), "k differs");
    assert!(shape(g.out_prod(a_q, b6)), "quantized a does not broadcast on the CPU");
    assert!(ty(g.out_prod(a_bf, b)));
    assert!(ty(g.out_prod(a_i, b)));
    assert!(ty(g.out_prod(a, b16)));
    let at = g.transpose(a).unwrap();
    assert!(g.out_prod(at, b).is_err());
}

#[test]
fn empty_shapes_compute_nothing_without_failing() {
    let be = CpuBackend::with_threads(2).unwrap();
    let mut g = Graph::new();
    let a = g.input(DType::Q4_0, &[256, 16, 4]).unwrap();
    let b = g.input(DType::F32, &[256, 1, 0]).unwrap();
    let ids = g.input(DType::I32, &[2, 0]).unwrap();
    let y = g.mul_mat_id(a, b, ids).unwrap();
    let qa = g.input(DType::Q8_0, &[64, 4, 0]).unwrap();
    let qb = g.input(DType::F32, &[5, 4, 0]).unwrap();
    let z = g.out_prod(qa, qb).unwrap();
    let fa = g.input(DType::F32, &[8, 4]).unwrap();
    let fb = g.input(DType::F32, &[0, 4]).unwrap();
    let w = g.out_prod(fa, fb).unwrap();
    for t in [y, z, w] {
        g.set_output(t).unwrap();
    }
    let mut p = Plan::with_guards(g, &be, 64).unwrap();
    p.set_input_bytes(a, &vec![0u8; 256 / 32 * 18 * 16 * 4]).unwrap();
    p.set_input(fa, &[1.0f32; 32]).unwrap();
    for (id, n) in [(b, 0), (ids, 0), (qa, 0), (qb, 0), (fb, 0)] {
        p.set_input_bytes(id, &vec![0u8; n]).unwrap();
    }
    p.compute().unwrap();
    p.check_guards().unwrap();
    assert!(p.output::<f32>(y).unwrap().is_empty());
    assert!(p.output::<f32>(w).unwrap().is_empty());
}

/// b already in the weights' vec-dot type (F16 for F16, Q8_0 for Q4_0, Q8_K for Q4_K) skips the
/// conversion and gives bitwise what F32 b converted by the op gives.
#[test]
fn mul_mat_id_b_in_vec_dot_type_matches_f32_b() {
    for ty in [DType::F16, DType::Q4_0, DType::Q4_K] {
        let c = MoeCase::new(ty, 4, 2, false, 20, 9, 256, 31);
        let want = c.run(2);
        let vd = ty.vec_dot_type();
        let mut b_vd = vec![0u8; vd.row_size(c.b.len()).unwrap()];
        quantize_for_dot(vd, &c.b, &mut b_vd).unwrap();
        let mut g = Graph::new();
        let a = g.input(ty, &[c.k, c.m, c.n_mats]).unwrap();
        let b = g.input(vd, &[c.k, c.nb(), c.n]).unwrap();
        let ids_in = g.input(DType::I32, &[c.n_mats, c.n]).unwrap();
        let ids = g.view_2d(ids_in, [c.n_used, c.n], c.n_mats * 4, 0).unwrap();
        let y = g.mul_mat_id(a, b, ids).unwrap();
        g.set_output(y).unwrap();
        let mut p = Plan::with_guards(g, &CpuBackend::with_isa(3, c.isa).unwrap(), 64).unwrap();
        p.set_input_bytes(a, &c.as_q).unwrap();
        p.set_input_bytes(b, &b_vd).unwrap();
        p.set_input(ids_in, &c.ids).unwrap();
        p.compute().unwrap();
        p.check_guards().unwrap();
        let got = p.output::<f32>(y).unwrap();
        assert!(
            got.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{ty} with {vd} b differs from F32 b"
        );
    }
}
