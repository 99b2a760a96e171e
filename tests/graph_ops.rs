//! Foundation ops against plain f64 references: odd shapes, broadcasts, views, permutations; thread
//! count invariance; planner reuse; abort; bad input.

mod common;

use common::{each, nmse};
use quantgraph::testdata::rand_f32;
use quantgraph::{Backend, CpuBackend, DType, Error, Graph, Plan, TensorId};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Logical element (i0..i3) of a contiguous ggml-order array.
fn at(v: &[f32], ne: [usize; 4], i: [usize; 4]) -> f64 {
    v[((i[3] * ne[2] + i[2]) * ne[1] + i[1]) * ne[0] + i[0]] as f64
}

fn run1(g: Graph, inputs: &[(TensorId, Vec<f32>)], out: TensorId, threads: usize) -> Vec<f32> {
    let be = CpuBackend::with_threads(threads).unwrap();
    // Guard bytes around every tensor catch any op writing outside its output.
    let mut p = Plan::with_guards(g, &be, 64).unwrap();
    for (id, v) in inputs {
        p.set_input(*id, v).unwrap();
    }
    p.compute().unwrap();
    p.check_guards().unwrap();
    p.output::<f32>(out).unwrap().to_vec()
}

const SHAPES: [[usize; 4]; 3] = [[5, 7, 11, 13], [16, 3, 2, 1], [1, 1, 1, 1]];

#[test]
fn binary_ops_broadcast_like_ggml() {
    type F = fn(f64, f64) -> f64;
    let ops: [(&str, F); 4] = [
        ("add", |a, b| a + b),
        ("sub", |a, b| a - b),
        ("mul", |a, b| a * b),
        ("div", |a, b| a / b),
    ];
    for ne in SHAPES {
        // b shapes that divide a's: full, row vector, broadcast on dims 1..3.
        let bshapes = [ne, [ne[0], 1, 1, 1], [1, ne[1], 1, ne[3]], [ne[0], 1, ne[2], 1]];
        for nb in bshapes {
            for (name, f) in ops {
                let mut g = Graph::new();
                let a = g.input(DType::F32, &ne).unwrap();
                let b = g.input(DType::F32, &nb).unwrap();
                let c = match name {
                    "add" => g.add(a, b),
                    "sub" => g.sub(a, b),
                    "mul" => g.mul(a, b),
                    _ => g.div(a, b),
                }
                .unwrap();
                g.set_output(c).unwrap();
                let va = rand_f32(ne.iter().product(), 1);
                let vb: Vec<f32> =
                    rand_f32(nb.iter().product(), 2).iter().map(|x| x + 2.5).collect();
                let got = run1(g, &[(a, va.clone()), (b, vb.clone())], c, 2);
                let want: Vec<f64> = each(ne)
                    .map(|i| {
                        let j = [i[0] % nb[0], i[1] % nb[1], i[2] % nb[2], i[3] % nb[3]];
                        f(at(&va, ne, i), at(&vb, nb, j))
                    })
                    .collect();
                let e = nmse(&got, &want);
                assert!(e < 1e-7, "{name} {ne:?} {nb:?}: nmse {e}");
            }
        }
    }
}

#[test]
fn unary_ops_on_permuted_views() {
    let ne = [5, 7, 3, 2];
    type F = fn(f64) -> f64;
    let refs: [(&str, F); 5] = [
        ("silu", |x| x / (1.0 + (-x).exp())),
        ("relu", |x| x.max(0.0)),
        ("gelu", |x| {
            0.5 * x
                * (1.0
                    + ((2.0 / std::f64::consts::PI).sqrt() * x * (1.0 + 0.044715 * x * x)).tanh())
        }),
        ("scale", |x| x * -1.5),
        ("scale_bias", |x| x * 0.5 + 0.25),
    ];
    for (name, f) in refs {
        let mut g = Graph::new();
        let a = g.input(DType::F32, &ne).unwrap();
        let p = g.permute(a, [1, 0, 2, 3]).unwrap(); // shape [7, 5, 3, 2], strided
        let y = match name {
            "silu" => g.silu(p),
            "relu" => g.relu(p),
            "gelu" => g.gelu(p),
            "scale" => g.scale(p, -1.5),
            _ => g.scale_bias(p, 0.5, 0.25),
        }
        .unwrap();
        g.set_output(y).unwrap();
        let va: Vec<f32> = rand_f32(ne.iter().product(), 3).iter().map(|x| x * 4.0).collect();
        let got = run1(g, &[(a, va.clone())], y, 3);
        let pne = [7, 5, 3, 2];
        let want: Vec<f64> = each(pne).map(|i| f(at(&va, ne, [i[1], i[0], i[2], i[3]]))).collect();
        let e = nmse(&got, &want);
        assert!(e < 1e-7, "{name}: nmse {e}");
    }
}

#[test]
fn rms_norm_and_soft_max_ext_match_reference() {
    for ne in [[5usize, 7, 11, 3], [64, 4, 2, 1]] {
        let mut g = Graph::new();
        let a = g.input(DType::F32, &ne).unwrap();
        let r = g.rms_norm(a, 1e-6).unwrap();
        g.set_output(r).unwrap();
        let va: Vec<f32> = rand_f32(ne.iter().product(), 4).iter().map(|x| x * 3.0).collect();
        let got = run1(g, &[(a, va.clone())], r, 2);
        let mut want = Vec::new();
        for row in va.chunks(ne[0]) {
            let ms = row.iter().map(|&x| x as f64 * x as f64).sum::<f64>() / ne[0] as f64;
            want.extend(row.iter().map(|&x| x as f64 / (ms + 1e-6).sqrt()));
        }
        assert!(nmse(&got, &want) < 1e-7, "rms_norm {ne:?}");
    }
    // soft_max_ext with an F16 and an F32 mask broadcast over heads, scale and ALiBi.
    for (mask_ty, max_bias) in [(DType::F32, 0.0f32), (DType::F16, 0.0), (DType::F32, 8.0)] {
        let ne = [9usize, 5, 6, 2];
        let mne = [9usize, 7, 1, 1]; // more rows than needed, as ggml allows
        let mut g = Graph::new();
        let a = g.input(DType::F32, &ne).unwrap();
        let m32 = g.input(DType::F32, &mne).unwrap();
        let m = if mask_ty == DType::F16 { g.cast(m32, DType::F16).unwrap() } else { m32 };
        let s = g.soft_max_ext(a, Some(m), 0.7, max_bias).unwrap();
        g.set_output(s).unwrap();
        let va = rand_f32(ne.iter().product(), 5);
        let mut vm: Vec<f32> = rand_f32(mne.iter().product(), 6);
        vm[3] = f32::NEG_INFINITY; // a masked position
        let vm_used: Vec<f32> = if mask_ty == DType::F16 {
            vm.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect()
        } else {
            vm.clone()
        };
        let got = run1(g, &[(a, va.clone()), (m32, vm.clone())], s, 3);
        let n_head_log2 = 1u32 << (ne[2] as u32).ilog2();
        let m0 = 2f64.powf(-(max_bias as f64) / n_head_log2 as f64);
        let m1 = 2f64.powf(-(max_bias as f64 / 2.0) / n_head_log2 as f64);
        let mut want = vec![0f64; got.len()];
        for i3 in 0..ne[3] {
            for i2 in 0..ne[2] {
                let h = i2 as u32;
                let slope = if max_bias > 0.0 {
                    if h < n_head_log2 {
                        m0.powi(h as i32 + 1)
                    } else {
                        m1.powi(2 * (h - n_head_log2) as i32 + 1)
                    }
                } else {
                    1.0
                };
                for i1 in 0..ne[1] {
                    let v: Vec<f64> = (0..ne[0])
                        .map(|i0| {
                            at(&va, ne, [i0, i1, i2, i3]) * 0.7
                                + slope * at(&vm_used, mne, [i0, i1, 0, 0])
                        })
                        .collect();
                    let mx = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let sum: f64 = v.iter().map(|x| (x - mx).exp()).sum();
                    for i0 in 0..ne[0] {
                        want[((i3 * ne[2] + i2) * ne[1] + i1) * ne[0] + i0] =
                            (v[i0] - mx).exp() / sum;
                    }
                }
            }
        }
        let e = nmse(&got, &want);
        assert!(e < 1e-6, "soft_max {mask_ty} bias {max_bias}: nmse {e}");
    }
}

#[test]
fn get_rows_f32_f16_and_out_of_range() {
    let ne = [6usize, 10, 3, 1];
    for ty in [DType::F32, DType::F16] {
        let mut g = Graph::new();
        let a32 = g.input(DType::F32, &ne).unwrap();
        let a = if ty == DType::F16 { g.cast(a32, DType::F16).unwrap() } else { a32 };
        let ids = g.input(DType::I32, &[4, 3]).unwrap();
        let r = g.get_rows(a, ids).unwrap();
        g.set_output(r).unwrap();
        let be = CpuBackend::with_threads(2).unwrap();
        let mut p = Plan::new(g, &be).unwrap();
        let va = rand_f32(ne.iter().product(), 7);
        let vi: Vec<i32> = vec![0, 9, 3, 3, 1, 2, 8, 5, 7, 7, 0, 4];
        p.set_input(a32, &va).unwrap();
        p.set_input(ids, &vi).unwrap();
        p.compute().unwrap();
        let got = p.output::<f32>(r).unwrap().to_vec();
        let mut want = Vec::new();
        for i11 in 0..3 {
            for i10 in 0..4 {
                let id = vi[i11 * 4 + i10] as usize;
                for i0 in 0..ne[0] {
                    let x = at(&va, ne, [i0, id, i11, 0]);
                    want.push(if ty == DType::F16 { half::f16::from_f64(x).to_f64() } else { x });
                }
            }
        }
        assert_eq!(nmse(&got, &want), 0.0, "{ty}");
        // An id out of range: Err naming the value; the plan stays usable.
        let mut bad = vi.clone();
        bad[5] = 10;
        p.set_input(ids, &bad).unwrap();
        let e = p.compute().unwrap_err();
        assert!(matches!(e, Error::IndexOutOfRange { index: 10, limit: 10, .. }), "{e}");
        bad[5] = -1;
        p.set_input(ids, &bad).unwrap();
        assert!(p.compute().is_err());
        p.set_input(ids, &vi).unwrap();
        p.compute().unwrap();
        assert_eq!(p.output::<f32>(r).unwrap(), &got[..]);
    }
}

#[test]
fn get_rows_from_an_i32_table_gives_i32_rows() {
    let ne = [5usize, 7, 2, 1];
    let mut g = Graph::new();
    let a = g.input(DType::I32, &ne).unwrap();
    let ids = g.input(DType::I32, &[3, 2]).unwrap();
    let r = g.get_rows(a, ids).unwrap();
    assert_eq!(g.dtype(r).unwrap(), DType::I32);
    g.set_output(r).unwrap();
    let va: Vec<i32> = (0..ne.iter().product::<usize>() as i32).map(|x| x * 7 - 100).collect();
    let vi = vec![6, 0, 6, 2, 5, 1];
    let mut first: Option<Vec<i32>> = None;
    for nth in [1, 2, 3] {
        let mut p = Plan::new(g.clone(), &CpuBackend::with_threads(nth).unwrap()).unwrap();
        p.set_input(a, &va).unwrap();
        p.set_input(ids, &vi).unwrap();
        p.compute().unwrap();
        let got = p.output::<i32>(r).unwrap().to_vec();
        let mut want = Vec::new();
        for i11 in 0..2 {
            for i10 in 0..3 {
                let id = vi[i11 * 3 + i10] as usize;
                want.extend_from_slice(&va[(i11 * ne[1] + id) * ne[0]..][..ne[0]]);
            }
        }
        assert_eq!(got, want, "{nth} threads");
        match &first {
            None => first = Some(got),
            Some(f) => assert_eq!(f, &got),
        }
        let mut bad = vi.clone();
        bad[1] = 7;
        p.set_input(ids, &bad).unwrap();
        assert!(matches!(p.compute().unwrap_err(), Error::IndexOutOfRange { index: 7, .. }));
    }
}

fn matmul_ref(a: &[f32], ane: [usize; 4], b: &[f32], bne: [usize; 4]) -> Vec<f64> {
    let (k, m, n) = (ane[0], ane[1], bne[1]);
    let mut out = Vec::new();
    for i3 in 0..bne[3] {
        for i2 in 0..bne[2] {
            for j in 0..n {
                for i in 0..m {
                    let mut s = 0f64;
                    for kk in 0..k {
                        s += at(a, ane, [kk, i, i2 / (bne[2] / ane[2]), i3 / (bne[3] / ane[3])])
                            * at(b, bne, [kk, j, i2, i3]);
                    }
                    out.push(s);
                }
            }
        }
    }
    out
}

#[test]
fn mul_mat_f32_and_f16_with_broadcast_and_transposed_b() {
    let cases = [
        ([33usize, 17, 1, 1], [33usize, 5, 1, 1]),
        ([64, 9, 2, 1], [64, 3, 6, 2]),
        ([7, 1, 1, 1], [7, 1, 1, 1]),
    ];
    for ty in [DType::F32, DType::F16] {
        for (ane, bne) in cases {
            let mut g = Graph::new();
            let a32 = g.input(DType::F32, &ane).unwrap();
            let a = if ty == DType::F16 { g.cast(a32, DType::F16).unwrap() } else { a32 };
            let b = g.input(DType::F32, &bne).unwrap();
            let c = g.mul_mat(a, b).unwrap();
            g.set_output(c).unwrap();
            let va = rand_f32(ane.iter().product(), 8);
            let vb = rand_f32(bne.iter().product(), 9);
            let got = run1(g, &[(a32, va.clone()), (b, vb.clone())], c, 2);
            let want = matmul_ref(&va, ane, &vb, bne);
            let e = nmse(&got, &want);
            assert!(e < if ty == DType::F16 { 1e-5 } else { 1e-9 }, "{ty} {ane:?} {bne:?}: {e}");
        }
    }
    // b given transposed: a permuted view with strided rows goes through the conversion phase.
    let mut g = Graph::new();
    let a = g.input(DType::F32, &[8, 4]).unwrap();
    let bt = g.input(DType::F32, &[3, 8]).unwrap();
    let b = g.transpose(bt).unwrap(); // [8, 3] strided
    let c = g.mul_mat(a, b).unwrap();
    g.set_output(c).unwrap();
    let va = rand_f32(32, 10);
    let vbt = rand_f32(24, 11);
    let got = run1(g, &[(a, va.clone()), (bt, vbt.clone())], c, 2);
    let vb: Vec<f32> = (0..24).map(|k| vbt[(k % 8) * 3 + k / 8]).collect();
    assert!(nmse(&got, &matmul_ref(&va, [8, 4, 1, 1], &vb, [8, 3, 1, 1])) < 1e-9);
}

#[test]
fn cpy_into_state_view_persists_and_cont_reorders() {
    // A KV-cache-like state: each compute writes one row at a position given by a view.
    let cache = quantgraph::Buffer::alloc(4 * 2 * 8).unwrap();
    let mut results = Vec::new();
    for pos in 0..3usize {
        let mut g = Graph::new();
        let kv = g.state(DType::F16, &[8, 4], &cache, 0).unwrap();
        let x = g.input(DType::F32, &[8]).unwrap();
        let dst = g.view_1d(kv, 8, pos * 16).unwrap();
        let w = g.cpy(x, dst).unwrap();
        let _ = w;
        let all = g.view_2d(kv, [8, pos + 1], 16, 0).unwrap();
        let all32 = g.cast(all, DType::F32).unwrap();
        g.set_output(all32).unwrap();
        let be = CpuBackend::with_threads(2).unwrap();
        let mut p = Plan::new(g, &be).unwrap();
        p.set_input(x, &[pos as f32 + 0.5; 8]).unwrap();
        p.compute().unwrap();
        results = p.output::<f32>(all32).unwrap().to_vec();
    }
    let want: Vec<f32> = (0..3).flat_map(|p| vec![p as f32 + 0.5; 8]).collect();
    assert_eq!(results, want);

    // cont of a permuted tensor, F32 -> F16 cpy into a tensor of another shape.
    let mut g = Graph::new();
    let a = g.input(DType::F32, &[3, 4, 2]).unwrap();
    let p = g.permute(a, [2, 0, 1, 3]).unwrap(); // a's dim i becomes dim axes[i]: [4, 2, 3]
    let c = g.cont(p).unwrap();
    g.set_output(c).unwrap();
    let va: Vec<f32> = (0..24).map(|x| x as f32).collect();
    let got = run1(g, &[(a, va.clone())], c, 3);
    let want: Vec<f32> =
        each([4, 2, 3, 1]).map(|r| at(&va, [3, 4, 2, 1], [r[2], r[0], r[1], 0]) as f32).collect();
    assert_eq!(got, want);
}

/// Copies whose rows are contiguous on both sides (a permutation that keeps dimension 0, a
/// view with a row stride into a destination whose rows start inside source rows, rows into a
/// view with a row stride), in F32 and F16, on 1 and 3 threads: every element lands where the
/// logical order puts it.
#[test]
fn copies_of_row_contiguous_views_keep_the_logical_order() {
    for threads in [1, 3] {
        let mut g = Graph::new();
        let a = g.input(DType::F32, &[5, 3, 4]).unwrap();
        let p = g.permute(a, [0, 2, 1, 3]).unwrap(); // [5, 4, 3]
        let c = g.cont(p).unwrap();
        let h = g.cast(a, DType::F16).unwrap();
        let hp = g.permute(h, [0, 2, 1, 3]).unwrap();
        let hc = g.cont(hp).unwrap();
        let hc32 = g.cast(hc, DType::F32).unwrap();
        let big = g.input(DType::F32, &[7, 6]).unwrap();
        let v = g.view_2d(big, [5, 6], 28, 4).unwrap(); // columns 1..6 of each row
        let dst = g.input(DType::F32, &[6, 5]).unwrap();
        let w = g.cpy(v, dst).unwrap();
        let wc = g.cont(w).unwrap();
        // Into a destination whose rows are strided: rows of 5 in a tensor of rows of 7.
        let s6 = g.input(DType::F32, &[6, 5]).unwrap();
        let wide = g.input(DType::F32, &[7, 6]).unwrap();
        let wv = g.view_2d(wide, [5, 6], 28, 4).unwrap();
        let sw = g.cpy(s6, wv).unwrap();
        let swc = g.cont(sw).unwrap();
        for t in [c, hc32, wc, swc] {
            g.set_output(t).unwrap();
        }
        let be = CpuBackend::with_threads(threads).unwrap();
        let mut plan = Plan::with_guards(g, &be, 64).unwrap();
        let va: Vec<f32> = (0..60).map(|x| x as f32).collect();
        let vb: Vec<f32> = (0..42).map(|x| 100.0 + x as f32).collect();
        plan.set_input(a, &va).unwrap();
        plan.set_input(big, &vb).unwrap();
        plan.set_input(dst, &[0.0f32; 30]).unwrap();
        let v6: Vec<f32> = (0..30).map(|x| 500.0 + x as f32).collect();
        plan.set_input(s6, &v6).unwrap();
        plan.set_input(wide, &[0.0f32; 42]).unwrap();
        plan.compute().unwrap();
        plan.check_guards().unwrap();
        let want: Vec<f32> = each([5, 4, 3, 1])
            .map(|r| at(&va, [5, 3, 4, 1], [r[0], r[2], r[1], 0]) as f32)
            .collect();
        assert_eq!(plan.output::<f32>(c).unwrap(), &want[..], "{threads} threads");
        assert_eq!(plan.output::<f32>(hc32).unwrap(), &want[..], "f16, {threads} threads");
        let vb = &vb;
        let want: Vec<f32> = (0..6).flat_map(|r| (1..6).map(move |i| vb[r * 7 + i])).collect();
        assert_eq!(plan.output::<f32>(wc).unwrap(), &want[..], "view, {threads} threads");
        assert_eq!(plan.output::<f32>(swc).unwrap(), &v6[..], "into a view, {threads} threads");
    }
}

/// A small MLP used by several tests: x -> rms_norm -> W1 -> silu -> W2 -> + x -> softmax.
fn mlp(d: usize, h: usize, n: usize) -> (Graph, Vec<(TensorId, Vec<f32>)>, TensorId) {
    let mut g = Graph::new();
    let x = g.input(DType::F32, &[d, n]).unwrap();
    let w1 = g.input(DType::F32, &[d, h]).unwrap();
    let w2 = g.input(DType::F32, &[h, d]).unwrap();
    let t = g.rms_norm(x, 1e-5).unwrap();
    let t = g.mul_mat(w1, t).unwrap();
    let t = g.silu(t).unwrap();
    let t = g.mul_mat(w2, t).unwrap();
    let t = g.add(t, x).unwrap();
    let y = g.soft_max(t).unwrap();
    g.set_output(y).unwrap();
    let inputs =
        vec![(x, rand_f32(d * n, 12)), (w1, rand_f32(d * h, 13)), (w2, rand_f32(h * d, 14))];
    (g, inputs, y)
}

#[test]
fn results_are_bitwise_identical_for_1_to_4_threads() {
    let (g, inputs, y) = mlp(67, 45, 13);
    let base = run1(g.clone(), &inputs, y, 1);
    for t in 2..=4 {
        assert_eq!(run1(g.clone(), &inputs, y, t), base, "{t} threads");
    }
}

#[test]
fn planner_reuses_memory_on_a_chain() {
    let mut g = Graph::new();
    let x = g.input(DType::F32, &[256]).unwrap();
    let mut t = x;
    for i in 0..50 {
        t = if i % 2 == 0 { g.add(t, x).unwrap() } else { g.mul(t, x).unwrap() };
    }
    g.set_output(t).unwrap();
    let p = Plan::new(g, &CpuBackend::with_threads(1).unwrap()).unwrap();
    let s = p.stats();
    assert_eq!(s.n_nodes, 50);
    assert!(s.n_inplace >= 48, "{s:?}");
    assert!(s.arena_bytes * 10 < s.intermediate_bytes, "{s:?}");
}

#[test]
fn abort_after_k_nodes_then_compute_again() {
    let (g, inputs, y) = mlp(32, 16, 4);
    let be = CpuBackend::with_threads(2).unwrap();
    let mut p = Plan::new(g, &be).unwrap();
    for (id, v) in &inputs {
        p.set_input(*id, v).unwrap();
    }
    p.compute().unwrap();
    let want = p.output::<f32>(y).unwrap().to_vec();
    let polls = Arc::new(AtomicUsize::new(0));
    let c = polls.clone();
    be.set_abort_hook(Some(Arc::new(move || c.fetch_add(1, Ordering::Relaxed) >= 2)));
    assert!(matches!(p.compute(), Err(Error::Aborted)));
    assert_eq!(polls.load(Ordering::Relaxed), 3, "stopped after the third node");
    be.set_abort_hook(None);
    p.compute().unwrap();
    assert_eq!(p.output::<f32>(y).unwrap(), &want[..]);
}

#[test]
fn bad_input_gives_clear_errors() {
    let mut g = Graph::new();
    let a = g.input(DType::F32, &[4, 3]).unwrap();
    let b = g.input(DType::F32, &[3, 4]).unwrap();
    let e = g.add(a, b).unwrap_err().to_string();
    assert!(e.contains("add") && e.contains("[3, 4, 1, 1]") && e.contains("[4, 3, 1, 1]"), "{e}");
    let e = g.mul_mat(a, b).unwrap_err().to_string();
    assert!(e.contains("mul_mat"), "{e}");
    let i = g.input(DType::I32, &[4, 3]).unwrap();
    assert!(g.add(a, i).unwrap_err().to_string().contains("i32"));
    assert!(g.get_rows(a, a).is_err());
    assert!(g.input(DType::Q4_0, &[33]).is_err());
    assert!(g.permute(a, [0, 0, 1, 2]).is_err());
    assert!(g.view_2d(a, [4, 4], 16, 0).is_err(), "view past the end");
    assert!(g.reshape(a, &[5, 2]).is_err());
    assert!(DType::from_ggml_id(4).is_none());
    assert!(g.rms_norm(a, -1.0).is_err());

    let c = g.add(a, a).unwrap();
    g.set_output(c).unwrap();
    let mut p = Plan::new(g, &CpuBackend::with_threads(1).unwrap()).unwrap();
    assert!(p.compute().unwrap_err().to_string().contains("never set"));
    assert!(p.set_input(a, &[1.0f32; 5]).unwrap_err().to_string().contains("12"));
    assert!(p.set_input(a, &[1i32; 12]).is_err());
    p.set_input(a, &[1.0f32; 12]).unwrap();
    p.compute().unwrap();
    assert_eq!(p.output::<f32>(c).unwrap(), &[2.0f32; 12]);
    assert!(p.output::<i32>(c).is_err());
}

#[test]
fn weights_in_shared_buffers_are_read_only() {
    let w = quantgraph::Buffer::from_host(
        bytemuck::cast_slice::<f32, u8>(&[1.0, 2.0, 3.0, 4.0]).to_vec(),
    );
    let mut g = Graph::new();
    let wt = g.weight(DType::F32, &[4], &w, 0).unwrap();
    assert!(g.weight(DType::F32, &[5], &w, 0).is_err(), "past the end of the buffer");
    assert!(g.state(DType::F32, &[4], &w, 0).is_err(), "state needs a writable buffer");
    let x = g.input(DType::F32, &[4]).unwrap();
    assert!(g.cpy(x, wt).is_err(), "cannot write into weights");
    let y = g.mul(x, wt).unwrap();
    g.set_output(y).unwrap();
    let mut p = Plan::new(g, &CpuBackend::with_threads(2).unwrap()).unwrap();
    p.set_input(x, &[2.0f32; 4]).unwrap();
    p.compute().unwrap();
    assert_eq!(p.output::<f32>(y).unwrap(), &[2.0, 4.0, 6.0, 8.0]);
}

#[test]
fn backend_and_device_report_like_ggml() {
    use quantgraph::Registry;
    let reg = quantgraph::CpuRegistry;
    let devs = reg.devices();
    assert_eq!(devs.len(), 1);
    let d = &devs[0];
    assert_eq!(d.name(), "CPU");
    assert!(!d.description().is_empty());
    let props = d.props();
    assert!(props.memory_total > 0 && props.caps.buffer_from_host_ptr);
    assert_eq!(d.default_buffer_type().alignment(), 64);
    let be = d.init_backend().unwrap();
    be.set_n_threads(3).unwrap();
    assert_eq!(be.n_threads(), 3);
    assert!(be.set_n_threads(0).is_err());
    #[cfg(target_arch = "x86_64")]
    assert!(be.features().iter().any(|(n, _)| *n == "SSE3"));
}

#[test]
fn huge_shapes_and_parameters_are_errors_not_panics() {
    let mut g = Graph::new();
    let a = g.input(DType::F32, &[4, 3]).unwrap();
    let big = usize::MAX / 2;
    assert!(g.input(DType::F32, &[big, 4]).is_err());
    assert!(g.input(DType::Q4_0, &[usize::MAX - 31]).is_err());
    assert!(g.arange(0.0, 1e30, 1e-30).is_err());
    assert!(g.repeat(a, [4 * (big / 4), 3, 1, 1]).is_err());
    assert!(g.interpolate(a, [big, big, 1, 1], quantgraph::ScaleMode::Nearest).is_err());
    assert!(g.pad(a, [big, big, 0, 0]).is_err());
    assert!(g.timestep_embedding(a, big, 10000).is_err());
    assert!(g.view_2d(a, [4, big], 16, 0).is_err());
    assert!(g.view_3d(a, [4, 3, big], [16, 48], 0).is_err());
    assert!(g.view_4d(a, [4, 1, 1, big], [16, 16, usize::MAX], 0).is_err());
    assert!(g.reshape(a, &[big, 2]).is_err());
    assert!(g.upscale(a, big, quantgraph::ScaleMode::Nearest).is_err());
}
