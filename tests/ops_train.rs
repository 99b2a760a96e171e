//! Training ops: cross_entropy_loss(+back) and the optimizer steps against f64
//! references; the backward ops against f64 references and against finite differences of their
//! forward ops (test-backend-ops' grad mode: central differences, 4-point when "precise", mean
//! absolute asymmetry below its limit). Guard bytes around every tensor, thread counts 1, 2 and 3
//! bitwise identical, bad shapes refused at build time.

mod common;

use common::{each, nmse};
use half::f16;
use quantgraph::testdata::uniform;
use quantgraph::{
    Buffer, CpuBackend, DType, Error, FlashAttnBackLayout, Graph, Plan, PoolOp, RopeMode,
    RopeParams, TensorId,
};

// ---------------------------------------------------------------------------------------------
// Harness

/// A graph with its input data, ready to run with any thread count.
struct Case {
    g: Graph,
    f32s: Vec<(TensorId, Vec<f32>)>,
    f16s: Vec<(TensorId, Vec<f16>)>,
    i32s: Vec<(TensorId, Vec<i32>)>,
    out: TensorId,
}

impl Case {
    fn new(g: Graph, out: TensorId) -> Case {
        Case { g, f32s: vec![], f16s: vec![], i32s: vec![], out }
    }

    fn plan(&self, nth: usize) -> Plan {
        let mut g = self.g.clone();
        g.set_output(self.out).unwrap();
        let mut p = Plan::with_guards(g, &CpuBackend::with_threads(nth).unwrap(), 64).unwrap();
        for (id, v) in &self.f32s {
            p.set_input(*id, v).unwrap();
        }
        for (id, v) in &self.f16s {
            p.set_input(*id, v).unwrap();
        }
        for (id, v) in &self.i32s {
            p.set_input(*id, v).unwrap();
        }
        p
    }

    /// Output as f32 (F16 outputs widened), guards checked.
    fn run(&self, nth: usize) -> Vec<f32> {
        let mut p = self.plan(nth);
        p.compute().unwrap();
        p.check_guards().unwrap();
        read_out(&p, self.out)
    }

    /// Runs with 1, 2 and 3 threads, asserts bitwise-equal results, returns them.
    fn run_threads(&self, what: &str) -> Vec<f32> {
        let one = self.run(1);
        for nth in [2, 3] {
            let other = self.run(nth);
            let same = one.iter().zip(&other).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same && one.len() == other.len(), "{what}: {nth} threads differ from 1");
        }
        one
    }
}

fn read_out(p: &Plan, out: TensorId) -> Vec<f32> {
    match p.graph().dtype(out).unwrap() {
        DType::F16 => p.output::<f16>(out).unwrap().iter().map(|v| v.to_f32()).collect(),
        _ => p.output::<f32>(out).unwrap().to_vec(),
    }
}

fn to64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

fn numel(ne: [usize; 4]) -> usize {
    ne.iter().product()
}

/// test-backend-ops' numerical gradient of `L(x) = sum(w * f(x))`, element by element: central
/// differences with step `eps`, the 4-point formula when `precise`. Outputs an element does not
/// touch cancel exactly, so only the affected ones add rounding noise.
fn numeric_grad(
    f: &mut dyn FnMut(&[f32]) -> Vec<f64>,
    x: &[f32],
    w: &[f64],
    eps: f32,
    precise: bool,
) -> Vec<f64> {
    let mut xs = x.to_vec();
    let mut at = |xs: &mut Vec<f32>, i: usize, v: f32| {
        xs[i] = v;
        let y = f(xs);
        xs[i] = x[i];
        y
    };
    let diff = |a: &[f64], b: &[f64]| -> f64 {
        w.iter().zip(a.iter().zip(b)).map(|(w, (a, b))| w * (a - b)).sum()
    };
    (0..x.len())
        .map(|i| {
            let fu = at(&mut xs, i, x[i] + eps);
            let fd = at(&mut xs, i, x[i] - eps);
            if precise {
                let fuh = at(&mut xs, i, x[i] + 0.5 * eps);
                let fdh = at(&mut xs, i, x[i] - 0.5 * eps);
                (8.0 * diff(&fuh, &fdh) - diff(&fu, &fd)) / (6.0 * eps as f64)
            } else {
                diff(&fu, &fd) / (2.0 * eps as f64)
            }
        })
        .collect()
}

/// The same with an f64 function and step (for forward references written in the test).
fn numeric_grad64(
    f: &mut dyn FnMut(&[f64]) -> Vec<f64>,
    x: &[f64],
    w: &[f64],
    eps: f64,
) -> Vec<f64> {
    let mut xs = x.to_vec();
    (0..x.len())
        .map(|i| {
            xs[i] = x[i] + eps;
            let fu = f(&xs);
            xs[i] = x[i] - eps;
            let fd = f(&xs);
            xs[i] = x[i];
            w.iter().zip(fu.iter().zip(&fd)).map(|(w, (a, b))| w * (a - b)).sum::<f64>()
                / (2.0 * eps)
        })
        .collect()
}

/// test-backend-ops' mean absolute asymmetry |(a - b) / (a + b)| between the numerical `gn` and
/// the algebraic `ga` gradients. Pairs that are both zero up to rounding (1e-6 of the largest
/// gradient) count as agreeing, where ggml would divide 0 by 0.
fn mean_abs_asymm(gn: &[f64], ga: &[f32]) -> f64 {
    assert_eq!(gn.len(), ga.len());
    let scale = ga.iter().fold(0f64, |m, &v| m.max((v as f64).abs()));
    let (mut sum, mut n) = (0.0, 0usize);
    for (&a, &b) in gn.iter().zip(ga) {
        let b = b as f64;
        if a.abs() + b.abs() <= 1e-6 * scale {
            continue;
        }
        sum += ((a - b) / (a + b)).abs();
        n += 1;
    }
    if n == 0 { 0.0 } else { sum / n as f64 }
}

/// A plan evaluating `out` of `g` for a new value of the F32 input `x` (other inputs fixed).
fn forward_fn(case: Case, x: TensorId) -> impl FnMut(&[f32]) -> Vec<f64> {
    let mut p = case.plan(1);
    move |xv: &[f32]| {
        p.set_input(x, xv).unwrap();
        p.compute().unwrap();
        to64(&read_out(&p, case.out))
    }
}

fn assert_nmse(got: &[f32], want: &[f64], limit: f64, what: &str) {
    let e = nmse(got, want);
    assert!(e < limit, "{what}: nmse {e:e} >= {limit:e}");
}

fn assert_maa(gn: &[f64], ga: &[f32], limit: f64, what: &str) {
    let e = mean_abs_asymm(gn, ga);
    assert!(e < limit, "{what}: mean abs asymmetry {e:e} >= {limit:e}");
}

// ---------------------------------------------------------------------------------------------
// cross_entropy_loss

fn softmax_rows(x: &[f32], nc: usize) -> Vec<f32> {
    x.chunks(nc)
        .flat_map(|r| {
            let m = r.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
            let e: Vec<f64> = r.iter().map(|&v| (v as f64 - m).exp()).collect();
            let s: f64 = e.iter().sum();
            e.into_iter().map(move |v| (v / s) as f32)
        })
        .collect()
}

fn cross_entropy_ref(x: &[f32], y: &[f32], nc: usize) -> f64 {
    let nr = x.len() / nc;
    let mut total = 0.0;
    for (xr, yr) in x.chunks(nc).zip(y.chunks(nc)) {
        let m = xr.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
        let lse = xr.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln() + m;
        total += xr.iter().zip(yr).map(|(&a, &b)| b as f64 * (a as f64 - lse)).sum::<f64>();
    }
    -total / nr as f64
}

#[test]
fn cross_entropy_loss_matches_f64_reference_and_is_thread_invariant() {
    for ne in [[10, 5, 4, 3], [30000, 1, 1, 1]] {
        let n = numel(ne);
        let x = uniform(n, 1, -100.0, 100.0);
        let y = softmax_rows(&uniform(n, 2, -100.0, 100.0), ne[0]);
        let mut g = Graph::new();
        let a = g.input(DType::F32, &ne).unwrap();
        let b = g.input(DType::F32, &ne).unwrap();
        let out = g.cross_entropy_loss(a, b).unwrap();
        assert_eq!(g.shape(out).unwrap(), [1, 1, 1, 1]);
        let mut c = Case::new(g, out);
        c.f32s = vec![(a, x.clone()), (b, y.clone())];
        let got = c.run_threads("cross_entropy_loss");
        assert_nmse(&got, &[cross_entropy_ref(&x, &y, ne[0])], 1e-7, "cross_entropy_loss");
    }
}

#[test]
fn cross_entropy_loss_back_matches_f64_reference() {
    for (ne, r) in [([10, 5, 4, 3], 1.0), ([10, 5, 4, 3], 100.0), ([30000, 1, 1, 1], 1.0)] {
        let n = numel(ne);
        let x = uniform(n, 3, -r, r);
        let y = softmax_rows(&uniform(n, 4, -r, r), ne[0]);
        let gr = 0.7f32;
        let mut g = Graph::new();
        let gi = g.input(DType::F32, &[1]).unwrap();
        let a = g.input(DType::F32, &ne).unwrap();
        let b = g.input(DType::F32, &ne).unwrap();
        let out = g.cross_entropy_loss_back(gi, a, b).unwrap();
        let mut c = Case::new(g, out);
        c.f32s = vec![(gi, vec![gr]), (a, x.clone()), (b, y.clone())];
        let got = c.run_threads("cross_entropy_loss_back");
        let nr = (n / ne[0]) as f64;
        let mut want = Vec::with_capacity(n);
        for (xr, yr) in x.chunks(ne[0]).zip(y.chunks(ne[0])) {
            let m = xr.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
            let s: f64 = xr.iter().map(|&v| (v as f64 - m).exp()).sum();
            for (&v, &l) in xr.iter().zip(yr) {
                want.push(((v as f64 - m).exp() / s - l as f64) * gr as f64 / nr);
            }
        }
        assert_nmse(&got, &want, 1e-7, "cross_entropy_loss_back");
    }
}

/// Finite differences of cross_entropy_loss itself (4-point). ggml's grad mode uses logits in
/// [-100, 100], eps 1 and 60 rows; an F32 scalar loss of that size carries rounding noise of
/// ~4e-6, far above 1e-4 of the smallest gradients (mean asymmetry ~0.1), so this check uses 2
/// rows, logits in [-4, 4] and eps 0.5 (the least noisy step) to meet test-backend-ops' 1e-4
/// limit; cross_entropy_loss_back_matches_f64_reference covers ggml's [-100, 100] range.
#[test]
fn cross_entropy_loss_back_matches_finite_differences_of_the_loss() {
    let ne = [10, 2, 1, 1];
    let n = numel(ne);
    let x = uniform(n, 5, -4.0, 4.0);
    let y = softmax_rows(&uniform(n, 6, -4.0, 4.0), ne[0]);
    let mut g = Graph::new();
    let a = g.input(DType::F32, &ne).unwrap();
    let b = g.input(DType::F32, &ne).unwrap();
    let loss = g.cross_entropy_loss(a, b).unwrap();
    let mut fc = Case::new(g, loss);
    fc.f32s = vec![(a, x.clone()), (b, y.clone())];
    let gn = numeric_grad(&mut forward_fn(fc, a), &x, &[1.0], 0.5, true);

    let mut g = Graph::new();
    let gi = g.input(DType::F32, &[1]).unwrap();
    let a = g.input(DType::F32, &ne).unwrap();
    let b = g.input(DType::F32, &ne).unwrap();
    let back = g.cross_entropy_loss_back(gi, a, b).unwrap();
    let mut bc = Case::new(g, back);
    bc.f32s = vec![(gi, vec![1.0]), (a, x), (b, y)];
    let ga = bc.run(2);
    assert_maa(&gn, &ga, 1e-4, "cross_entropy_loss grad");
}

// ---------------------------------------------------------------------------------------------
// Optimizer steps

fn state_with(buf: &Buffer, data: &[f32]) {
    buf.write_f32(0, data).unwrap();
}

fn read_state(buf: &Buffer, n: usize) -> Vec<f32> {
    let mut b = vec![0u8; n * 4];
    buf.read(0, &mut b).unwrap();
    bytemuck::cast_slice(&b).to_vec()
}

/// Three AdamW steps (ggml-opt's beta1h / beta2h per step) on state tensors, against an f64
/// reference of ggml's update, with 1, 2 and 3 threads giving the same bits.
#[test]
fn opt_step_adamw_matches_f64_reference_over_steps() {
    let ne = [10, 5, 4, 3];
    let n = numel(ne);
    let w0 = uniform(n, 7, 0.0, 1.0);
    let m0 = uniform(n, 8, 0.0, 1.0);
    let v0 = uniform(n, 9, 0.0, 1.0);
    let grads: Vec<Vec<f32>> = (0..3).map(|s| uniform(n, 10 + s, -1.0, 1.0)).collect();
    let (alpha, beta1, beta2, eps, wd) = (1e-2f32, 0.9f32, 0.999f32, 1e-8f32, 0.1f32);
    let params = |t: i32| -> Vec<f32> {
        let b1h = 1.0 / (1.0 - beta1.powi(t));
        let b2h = 1.0 / (1.0 - beta2.powi(t));
        vec![alpha, beta1, beta2, eps, wd, b1h, b2h]
    };
    // f64 reference.
    let (mut w, mut m, mut v) = (to64(&w0), to64(&m0), to64(&v0));
    let mut want = Vec::new();
    for (s, gv) in grads.iter().enumerate() {
        let p = to64(&params(s as i32 + 1));
        for i in 0..n {
            let g = gv[i] as f64;
            m[i] = m[i] * p[1] + g * (1.0 - p[1]);
            v[i] = v[i] * p[2] + g * g * (1.0 - p[2]);
            let mh = m[i] * p[5];
            let vh = (v[i] * p[6]).sqrt() + p[3];
            w[i] = w[i] * (1.0 - p[0] * p[4]) - p[0] * mh / vh;
        }
        want.push((w.clone(), m.clone(), v.clone()));
    }
    let mut results: Vec<Vec<u32>> = Vec::new();
    for nth in [1, 2, 3] {
        let bw = Buffer::alloc(n * 4).unwrap();
        // m and v share one buffer, side by side.
        let bmv = Buffer::alloc(2 * n * 4).unwrap();
        state_with(&bw, &w0);
        bmv.write_f32(0, &m0).unwrap();
        bmv.write_f32(n * 4, &v0).unwrap();
        let mut g = Graph::new();
        let a = g.state(DType::F32, &ne, &bw, 0).unwrap();
        let gm = g.state(DType::F32, &ne, &bmv, 0).unwrap();
        let gv = g.state(DType::F32, &ne, &bmv, n * 4).unwrap();
        let grad = g.input(DType::F32, &ne).unwrap();
        let pp = g.input(DType::F32, &[7]).unwrap();
        let step = g.opt_step_adamw(a, grad, gm, gv, pp).unwrap();
        assert_eq!(g.op(step).unwrap().name(), "opt_step_adamw");
        let mut plan = Plan::with_guards(g, &CpuBackend::with_threads(nth).unwrap(), 64).unwrap();
        let mut bits = Vec::new();
        for (s, gvals) in grads.iter().enumerate() {
            plan.set_input(grad, gvals).unwrap();
            plan.set_input(pp, &params(s as i32 + 1)).unwrap();
            plan.compute().unwrap();
            plan.check_guards().unwrap();
            let (ww, wm, wv) = &want[s];
            let got_w = read_state(&bw, n);
            let mut mv = vec![0u8; 2 * n * 4];
            bmv.read(0, &mut mv).unwrap();
            let mv: Vec<f32> = bytemuck::cast_slice(&mv).to_vec();
            assert_nmse(&got_w, ww, 1e-7, &format!("adamw params step {s}"));
            assert_nmse(&mv[..n], wm, 1e-7, &format!("adamw m step {s}"));
            assert_nmse(&mv[n..], wv, 1e-7, &format!("adamw v step {s}"));
            bits.extend(got_w.iter().chain(&mv).map(|v| v.to_bits()));
        }
        results.push(bits);
    }
    assert_eq!(results[0], results[1], "adamw: 2 threads differ from 1");
    assert_eq!(results[0], results[2], "adamw: 3 threads differ from 1");
}

#[test]
fn opt_step_sgd_matches_f64_reference_over_steps() {
    let ne = [10, 5, 4, 3];
    let n = numel(ne);
    let w0 = uniform(n, 20, 0.0, 1.0);
    let grads: Vec<Vec<f32>> = (0..3).map(|s| uniform(n, 21 + s, -1.0, 1.0)).collect();
    let (alpha, wd) = (0.05f32, 0.3f32);
    let mut w = to64(&w0);
    let mut want = Vec::new();
    for gv in &grads {
        for i in 0..n {
            w[i] = w[i] * (1.0 - alpha as f64 * wd as f64) - alpha as f64 * gv[i] as f64;
        }
        want.push(w.clone());
    }
    let mut results = Vec::new();
    for nth in [1, 2, 3] {
        let bw = Buffer::alloc(n * 4).unwrap();
        state_with(&bw, &w0);
        let mut g = Graph::new();
        let a = g.state(DType::F32, &ne, &bw, 0).unwrap();
        let grad = g.input(DType::F32, &ne).unwrap();
        let pp = g.input(DType::F32, &[2]).unwrap();
        g.opt_step_sgd(a, grad, pp).unwrap();
        let mut plan = Plan::with_guards(g, &CpuBackend::with_threads(nth).unwrap(), 64).unwrap();
        let mut bits = Vec::new();
        for (s, gvals) in grads.iter().enumerate() {
            plan.set_input(grad, gvals).unwrap();
            plan.set_input(pp, &[alpha, wd]).unwrap();
            plan.compute().unwrap();
            plan.check_guards().unwrap();
            let got = read_state(&bw, n);
            assert_nmse(&got, &want[s], 1e-7, &format!("sgd step {s}"));
            bits.extend(got.iter().map(|v| v.to_bits()));
        }
        results.push(bits);
    }
    assert_eq!(results[0], results[1]);
    assert_eq!(results[0], results[2]);
}

#[test]
fn opt_steps_reject_bad_inputs() {
    let ne = [8, 3];
    let buf = Buffer::alloc(4 * 24 * 4).unwrap();
    let mut g = Graph::new();
    let a = g.state(DType::F32, &ne, &buf, 0).unwrap();
    let m = g.state(DType::F32, &ne, &buf, 96).unwrap();
    let v = g.state(DType::F32, &ne, &buf, 192).unwrap();
    let overlap = g.state(DType::F32, &ne, &buf, 48).unwrap();
    let grad = g.input(DType::F32, &ne).unwrap();
    let p7 = g.input(DType::F32, &[7]).unwrap();
    let p6 = g.input(DType::F32, &[6]).unwrap();
    let p2 = g.input(DType::F32, &[2]).unwrap();
    let x = g.input(DType::F32, &ne).unwrap();
    let small = g.input(DType::F32, &[8, 2]).unwrap();
    let h = g.input(DType::F16, &ne).unwrap();
    // Parameters that are not state tensors cannot be updated in place.
    let e = g.opt_step_adamw(x, grad, m, v, p7).unwrap_err();
    assert!(e.to_string().contains("opt_step_adamw") && e.to_string().contains("state"), "{e}");
    assert!(g.opt_step_sgd(x, grad, p2).is_err());
    // Overlapping state ranges, wrong parameter counts, shapes and types.
    let e = g.opt_step_adamw(a, grad, overlap, v, p7).unwrap_err();
    assert!(e.to_string().contains("overlap"), "{e}");
    assert!(g.opt_step_adamw(a, grad, m, m, p7).is_err());
    assert!(g.opt_step_adamw(a, a, m, v, p7).is_err(), "grad aliasing the params");
    assert!(matches!(g.opt_step_adamw(a, grad, m, v, p6), Err(Error::Shape { .. })));
    assert!(matches!(g.opt_step_adamw(a, small, m, v, p7), Err(Error::Shape { .. })));
    assert!(matches!(g.opt_step_adamw(a, h, m, v, p7), Err(Error::Type { .. })));
    assert!(matches!(g.opt_step_sgd(a, grad, p7), Err(Error::Shape { .. })));
    assert!(g.opt_step_adamw(a, grad, m, v, p7).is_ok());
    assert!(g.opt_step_sgd(a, grad, p2).is_ok());
}

// ---------------------------------------------------------------------------------------------
// silu_back

fn silu_back_ref(x: f64, dy: f64) -> f64 {
    let s = 1.0 / (1.0 + (-x).exp());
    dy * s * (1.0 + x * (1.0 - s))
}

#[test]
fn silu_back_matches_reference_f32_and_f16() {
    let ne = [64, 5, 4, 3];
    let n = numel(ne);
    // test_unary's [-150, 150] reaches exp overflow on both sides.
    for (dt, r) in [(DType::F32, 6.0), (DType::F32, 150.0), (DType::F16, 6.0), (DType::F16, 150.0)]
    {
        let x = uniform(n, 30, -r, r);
        let dy = uniform(n, 31, -1.0, 1.0);
        let mut g = Graph::new();
        let a = g.input(dt, &ne).unwrap();
        let b = g.input(dt, &ne).unwrap();
        let out = g.silu_back(a, b).unwrap();
        assert_eq!(g.dtype(out).unwrap(), dt);
        let mut c = Case::new(g, out);
        let want: Vec<f64> = if dt == DType::F16 {
            let (xh, dh): (Vec<f16>, Vec<f16>) = (
                x.iter().map(|&v| f16::from_f32(v)).collect(),
                dy.iter().map(|&v| f16::from_f32(v)).collect(),
            );
            let w = (0..n)
                .map(|i| f16::from_f64(silu_back_ref(xh[i].to_f64(), dh[i].to_f64())).to_f64())
                .collect();
            c.f16s = vec![(a, dh), (b, xh)];
            w
        } else {
            c.f32s = vec![(a, dy.clone()), (b, x.clone())];
            (0..n).map(|i| silu_back_ref(x[i] as f64, dy[i] as f64)).collect()
        };
        let got = c.run_threads("silu_back");
        assert!(got.iter().all(|v| v.is_finite()), "silu_back {dt} range {r}: not finite");
        assert_nmse(&got, &want, 1e-7, &format!("silu_back {dt} range {r}"));
    }
}

#[test]
fn silu_back_matches_finite_differences_of_silu() {
    let ne = [128, 2, 2, 2];
    let n = numel(ne);
    let x = uniform(n, 32, -6.0, 6.0);
    let w = uniform(n, 33, -1.0, 1.0);
    let mut g = Graph::new();
    let a = g.input(DType::F32, &ne).unwrap();
    let y = g.silu(a).unwrap();
    let mut fc = Case::new(g, y);
    fc.f32s = vec![(a, x.clone())];
    let gn = numeric_grad(&mut forward_fn(fc, a), &x, &to64(&w), 0.1, true);
    let mut g = Graph::new();
    let dy = g.input(DType::F32, &ne).unwrap();
    let xi = g.input(DType::F32, &ne).unwrap();
    let out = g.silu_back(dy, xi).unwrap();
    let mut bc = Case::new(g, out);
    bc.f32s = vec![(dy, w), (xi, x)];
    assert_maa(&gn, &bc.run(2), 1e-4, "silu grad");
}

// ---------------------------------------------------------------------------------------------
// rms_norm_back

fn rms_norm_back_ref(dz: &[f32], x: &[f32], nc: usize, eps: f64) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for (dr, xr) in dz.chunks(nc).zip(x.chunks(nc)) {
        let sxx: f64 = xr.iter().map(|&v| v as f64 * v as f64).sum();
        let sxd: f64 = xr.iter().zip(dr).map(|(&a, &b)| a as f64 * b as f64).sum();
        let mean_eps = sxx / nc as f64 + eps;
        let rrms = 1.0 / mean_eps.sqrt();
        for (&d, &v) in dr.iter().zip(xr) {
            out.push((d as f64 - v as f64 * sxd / (nc as f64 * mean_eps)) * rrms);
        }
    }
    out
}

#[test]
fn rms_norm_back_matches_reference() {
    for eps in [0.0f32, 1e-6, 1e-4, 1e-1, 10.0] {
        for n0 in [64usize, 1025] {
            let ne = [n0, 5, 4, 3];
            let n = numel(ne);
            let dz = uniform(n, 40, -10.0, 10.0);
            let x = uniform(n, 41, -10.0, 10.0);
            let mut g = Graph::new();
            let a = g.input(DType::F32, &ne).unwrap();
            let b = g.input(DType::F32, &ne).unwrap();
            let out = g.rms_norm_back(a, b, eps).unwrap();
            let mut c = Case::new(g, out);
            c.f32s = vec![(a, dz.clone()), (b, x.clone())];
            let got = if n0 == 64 { c.run_threads("rms_norm_back") } else { c.run(2) };
            let want = rms_norm_back_ref(&dz, &x, n0, eps as f64);
            assert_nmse(&got, &want, 1e-7, &format!("rms_norm_back eps {eps} n {n0}"));
        }
    }
}

/// test_rms_norm's grad mode: inputs in [-10, 10], eps 1, precise.
#[test]
fn rms_norm_back_matches_finite_differences_of_rms_norm() {
    let ne = [64, 5, 4, 3];
    let n = numel(ne);
    let x = uniform(n, 42, -10.0, 10.0);
    let w = uniform(n, 43, -1.0, 1.0);
    let eps = 1e-6f32;
    let mut g = Graph::new();
    let a = g.input(DType::F32, &ne).unwrap();
    let y = g.rms_norm(a, eps).unwrap();
    let mut fc = Case::new(g, y);
    fc.f32s = vec![(a, x.clone())];
    let gn = numeric_grad(&mut forward_fn(fc, a), &x, &to64(&w), 1.0, true);
    let mut g = Graph::new();
    let dz = g.input(DType::F32, &ne).unwrap();
    let xi = g.input(DType::F32, &ne).unwrap();
    let out = g.rms_norm_back(dz, xi, eps).unwrap();
    let mut bc = Case::new(g, out);
    bc.f32s = vec![(dz, w), (xi, x)];
    assert_maa(&gn, &bc.run(3), 1e-4, "rms_norm grad");
}

// ---------------------------------------------------------------------------------------------
// soft_max_ext_back

#[test]
fn soft_max_ext_back_matches_reference() {
    for scale in [1.0f32, 0.1] {
        for n0 in [16usize, 1024] {
            for n1 in [16usize, 1024] {
                for ne in [[n0, n1, 1, 1], [n0 - 1, n1 - 1, 1, 1], [n0, n1, 2, 3]] {
                    let n = numel(ne);
                    let dy = uniform(n, 50, -1.0, 1.0);
                    let y = uniform(n, 51, -1.0, 1.0);
                    let mut g = Graph::new();
                    let a = g.input(DType::F32, &ne).unwrap();
                    let b = g.input(DType::F32, &ne).unwrap();
                    let out = g.soft_max_ext_back(a, b, scale, 0.0).unwrap();
                    let mut c = Case::new(g, out);
                    c.f32s = vec![(a, dy.clone()), (b, y.clone())];
                    let got = if n < 5000 { c.run_threads("soft_max_back") } else { c.run(2) };
                    let mut want = Vec::with_capacity(n);
                    for (dr, yr) in dy.chunks(ne[0]).zip(y.chunks(ne[0])) {
                        let dot: f64 = dr.iter().zip(yr).map(|(&a, &b)| a as f64 * b as f64).sum();
                        for (&d, &v) in dr.iter().zip(yr) {
                            want.push(scale as f64 * v as f64 * (d as f64 - dot));
                        }
                    }
                    assert_nmse(&got, &want, 1e-7, &format!("soft_max_back {ne:?} scale {scale}"));
                }
            }
        }
    }
}

/// test_soft_max's grad mode (precise, eps 0.1), through soft_max_ext's output.
#[test]
fn soft_max_ext_back_matches_finite_differences_of_soft_max_ext() {
    let ne = [10, 5, 4, 3];
    let n = numel(ne);
    let x = uniform(n, 52, -1.0, 1.0);
    let w = uniform(n, 53, -1.0, 1.0);
    for scale in [1.0f32, 0.1] {
        let mut g = Graph::new();
        let a = g.input(DType::F32, &ne).unwrap();
        let y = g.soft_max_ext(a, None, scale, 0.0).unwrap();
        let mut fc = Case::new(g, y);
        fc.f32s = vec![(a, x.clone())];
        let yv = fc.run(1);
        let gn = numeric_grad(&mut forward_fn(fc, a), &x, &to64(&w), 0.1, true);
        let mut g = Graph::new();
        let dy = g.input(DType::F32, &ne).unwrap();
        let yi = g.input(DType::F32, &ne).unwrap();
        let out = g.soft_max_ext_back(dy, yi, scale, 0.0).unwrap();
        let mut bc = Case::new(g, out);
        bc.f32s = vec![(dy, w.clone()), (yi, yv)];
        assert_maa(&gn, &bc.run(2), 1e-4, &format!("soft_max grad scale {scale}"));
    }
}

// ---------------------------------------------------------------------------------------------
// rope_back

/// f64 rope (Normal, Neox, Mrope) with YaRN and frequency factors; `sin_sign` -1 is rope_back.
fn rope_ref(
    x: &[f32],
    ne: [usize; 4],
    pos: &[i32],
    ff: Option<&[f32]>,
    p: &RopeParams,
    sin_sign: f64,
) -> Vec<f64> {
    let n_dims = p.n_dims;
    let corr = |n_rot: f64| {
        n_dims as f64 * (p.n_ctx_orig as f64 / (n_rot * 2.0 * std::f64::consts::PI)).ln()
            / (2.0 * (p.freq_base as f64).ln())
    };
    let lo = corr(p.beta_fast as f64).floor().max(0.0);
    let hi = corr(p.beta_slow as f64).ceil().min(n_dims as f64 - 1.0);
    let mut out = to64(x);
    for i in each([1, ne[1], ne[2], ne[3]]) {
        let (i2, base) = (i[2], ((i[3] * ne[2] + i[2]) * ne[1] + i[1]) * ne[0]);
        let row = to64(&x[base..base + ne[0]]);
        let cs = |i0: usize| {
            let k = (i0 / 2) as f64;
            let pp = if p.mode.is_multi() {
                let s = p.sections;
                let sector = (i0 / 2) % (s[0] + s[1] + s[2] + s[3]) as usize;
                let which = [s[0], s[0] + s[1], s[0] + s[1] + s[2]]
                    .iter()
                    .position(|&e| sector < e as usize)
                    .unwrap_or(3);
                pos[i2 + which * ne[2]]
            } else {
                pos[i2]
            } as f64;
            let f = ff.map_or(1.0, |f| f[i0 / 2] as f64);
            let extrap = pp * (p.freq_base as f64).powf(-2.0 * k / n_dims as f64) / f;
            let interp = p.freq_scale as f64 * extrap;
            let (mut theta, mut m) = (interp, p.attn_factor as f64);
            if p.ext_factor != 0.0 {
                let y = (k - lo) / (hi - lo).max(0.001);
                let mix = (1.0 - y.clamp(0.0, 1.0)) * p.ext_factor as f64;
                theta = interp * (1.0 - mix) + extrap * mix;
                m *= 1.0 + 0.1 * (1.0 / p.freq_scale as f64).ln();
            }
            (theta.cos() * m, theta.sin() * m * sin_sign)
        };
        let (off, step) = if p.mode == RopeMode::Normal { (1, 1) } else { (n_dims / 2, 2) };
        for i0 in (0..n_dims).step_by(2) {
            let ic = i0 / step;
            let (c, s) = cs(i0);
            out[base + ic] = row[ic] * c - row[ic + off] * s;
            out[base + ic + off] = row[ic] * s + row[ic + off] * c;
        }
    }
    out
}

fn rope_params(mode: RopeMode, n_dims: usize, yarn: bool) -> RopeParams {
    let mut p = RopeParams::new(n_dims, mode, 10000.0);
    if yarn {
        p.n_ctx_orig = 512;
        p.freq_scale = 0.25;
        p.ext_factor = 1.0;
        p.attn_factor = 1.3;
    }
    if mode.is_multi() {
        p.sections = if mode == RopeMode::Vision { [4, 4, 0, 0] } else { [6, 5, 5, 0] };
    }
    p
}

/// Builds rope (back = false) or rope_back of an F32/F16 input with I32 positions.
fn rope_case(
    back: bool,
    dt: DType,
    ne: [usize; 4],
    p: RopeParams,
    x: &[f32],
    pos: &[i32],
    ff: Option<&[f32]>,
) -> (Case, TensorId) {
    let mut g = Graph::new();
    let a = g.input(dt, &ne).unwrap();
    let pi = g.input(DType::I32, &[pos.len()]).unwrap();
    let fi = ff.map(|f| g.input(DType::F32, &[f.len()]).unwrap());
    let out = match (back, p.mode.is_multi()) {
        (false, false) => g.rope_ext(a, pi, fi, p).unwrap(),
        (false, true) => g.rope_multi(a, pi, fi, p.sections, p).unwrap(),
        (true, false) => g.rope_ext_back(a, pi, fi, p).unwrap(),
        (true, true) => g.rope_multi_back(a, pi, fi, p.sections, p).unwrap(),
    };
    let mut c = Case::new(g, out);
    if dt == DType::F16 {
        c.f16s.push((a, x.iter().map(|&v| f16::from_f32(v)).collect()));
    } else {
        c.f32s.push((a, x.to_vec()));
    }
    c.i32s.push((pi, pos.to_vec()));
    if let (Some(fi), Some(f)) = (fi, ff) {
        c.f32s.push((fi, f.to_vec()));
    }
    (c, a)
}

#[test]
fn rope_back_matches_f64_reference_and_inverts_rope() {
    let ne = [32, 4, 3, 1];
    let n = numel(ne);
    let x = uniform(n, 60, -1.0, 1.0);
    let ffv = uniform(16, 61, 1.0, 3.0);
    for mode in [RopeMode::Normal, RopeMode::Neox, RopeMode::Mrope] {
        for (yarn, ff) in [(false, None), (true, Some(&ffv[..]))] {
            let p = rope_params(mode, if mode == RopeMode::Normal { 24 } else { 32 }, yarn);
            let pos: Vec<i32> = (0..if mode.is_multi() { 4 * ne[2] } else { ne[2] } as i32)
                .map(|i| 3 + 7 * i)
                .collect();
            let (c, _) = rope_case(true, DType::F32, ne, p, &x, &pos, ff);
            let got = c.run_threads("rope_back");
            let want = rope_ref(&x, ne, &pos, ff, &p, -1.0);
            assert_nmse(&got, &want, 1e-7, &format!("rope_back {mode:?} yarn {yarn}"));
            if !yarn {
                // An orthogonal rotation: rope_back(rope(x)) == x.
                let (fc, _) = rope_case(false, DType::F32, ne, p, &x, &pos, ff);
                let y = fc.run(1);
                let (bc, _) = rope_case(true, DType::F32, ne, p, &y, &pos, ff);
                assert_nmse(&bc.run(2), &to64(&x), 1e-7, &format!("rope_back(rope) {mode:?}"));
            }
        }
    }
}

/// test_rope's grad mode: precise, eps 0.1, limit 1e-3; every mode, with and without YaRN.
#[test]
fn rope_back_matches_finite_differences_of_rope_every_mode() {
    let ne = [32, 4, 3, 1];
    let n = numel(ne);
    let x = uniform(n, 62, -1.0, 1.0);
    let w = uniform(n, 63, -1.0, 1.0);
    let ffv = uniform(16, 64, 1.0, 3.0);
    for mode in
        [RopeMode::Normal, RopeMode::Neox, RopeMode::Mrope, RopeMode::Vision, RopeMode::Imrope]
    {
        for yarn in [false, true] {
            let n_dims = match mode {
                RopeMode::Vision => 16,
                RopeMode::Normal => 24,
                _ => 32,
            };
            let p = rope_params(mode, n_dims, yarn);
            let ff = if yarn && mode != RopeMode::Vision { Some(&ffv[..]) } else { None };
            let pos: Vec<i32> = (0..if mode.is_multi() { 4 * ne[2] } else { ne[2] } as i32)
                .map(|i| 2 + 5 * i)
                .collect();
            let (fc, a) = rope_case(false, DType::F32, ne, p, &x, &pos, ff);
            let gn = numeric_grad(&mut forward_fn(fc, a), &x, &to64(&w), 0.1, true);
            let (bc, _) = rope_case(true, DType::F32, ne, p, &w, &pos, ff);
            let ga = bc.run_threads("rope_back");
            assert_maa(&gn, &ga, 1e-3, &format!("rope grad {mode:?} yarn {yarn}"));
        }
    }
}

#[test]
fn rope_back_f16_matches_f32_path() {
    let ne = [64, 2, 3, 1];
    let n = numel(ne);
    let x = uniform(n, 65, -1.0, 1.0);
    let xr: Vec<f32> = x.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
    let pos = vec![1, 9, 30];
    for mode in [RopeMode::Normal, RopeMode::Neox] {
        let p = rope_params(mode, 64, false);
        let (c16, _) = rope_case(true, DType::F16, ne, p, &x, &pos, None);
        let got = c16.run_threads("rope_back f16");
        let (c32, _) = rope_case(true, DType::F32, ne, p, &xr, &pos, None);
        let want: Vec<f64> = c32.run(1).iter().map(|&v| f16::from_f32(v).to_f64()).collect();
        assert_nmse(&got, &want, 1e-7, &format!("rope_back f16 {mode:?}"));
    }
}

// ---------------------------------------------------------------------------------------------
// get_rows_back, repeat_back

fn get_rows_back_case(dt: DType, nc: usize, m: usize, ids: &[i32], grad: &[f32]) -> Case {
    let mut g = Graph::new();
    let a = g.input(dt, &[nc, ids.len()]).unwrap();
    let b = g.input(DType::I32, &[ids.len()]).unwrap();
    let like = g.input(DType::F32, &[nc, m]).unwrap();
    let out = g.get_rows_back(a, b, like).unwrap();
    assert_eq!(g.shape(out).unwrap(), [nc, m, 1, 1]);
    let mut c = Case::new(g, out);
    if dt == DType::F16 {
        c.f16s.push((a, grad.iter().map(|&v| f16::from_f32(v)).collect()));
    } else {
        c.f32s.push((a, grad.to_vec()));
    }
    c.i32s.push((b, ids.to_vec()));
    // `like` only gives the shape; the plan leaves it out.
    c
}

#[test]
fn get_rows_back_matches_reference_f32_f16() {
    for (nc, m, r) in [(1usize, 8usize, 2usize), (1, 70000, 4), (256, 5, 4), (10, 5, 3)] {
        for dt in [DType::F32, DType::F16] {
            let grad = uniform(nc * r, 70, -1.0, 1.0);
            // Repeated ids accumulate.
            let mut ids: Vec<i32> = (0..r).map(|i| ((i * 7919 + 3) % m) as i32).collect();
            ids[r - 1] = ids[0];
            let c = get_rows_back_case(dt, nc, m, &ids, &grad);
            let got = c.run_threads("get_rows_back");
            let mut want = vec![0f64; nc * m];
            for (i, &id) in ids.iter().enumerate() {
                for j in 0..nc {
                    let v = grad[i * nc + j];
                    let v = if dt == DType::F16 { f16::from_f32(v).to_f32() } else { v };
                    want[id as usize * nc + j] += v as f64;
                }
            }
            assert_nmse(&got, &want, 1e-7, &format!("get_rows_back {dt} {nc}x{m} r {r}"));
        }
    }
    // An id out of range: compute returns Err and the plan stays usable.
    let c = get_rows_back_case(DType::F32, 4, 5, &[1, 5], &[0.5; 8]);
    let mut p = c.plan(2);
    let e = p.compute().unwrap_err();
    assert!(matches!(e, Error::IndexOutOfRange { index: 5, limit: 5, .. }), "{e}");
    p.set_input(c.i32s[0].0, &[1, 4]).unwrap();
    p.compute().unwrap();
}

#[test]
fn get_rows_back_matches_finite_differences_of_get_rows() {
    let (nc, m) = (10usize, 5usize);
    let ids = vec![3i32, 0, 3];
    let x = uniform(nc * m, 71, -1.0, 1.0);
    let w = uniform(nc * ids.len(), 72, -1.0, 1.0);
    let mut g = Graph::new();
    let a = g.input(DType::F32, &[nc, m]).unwrap();
    let b = g.input(DType::I32, &[ids.len()]).unwrap();
    let y = g.get_rows(a, b).unwrap();
    let mut fc = Case::new(g, y);
    fc.f32s.push((a, x.clone()));
    fc.i32s.push((b, ids.clone()));
    let gn = numeric_grad(&mut forward_fn(fc, a), &x, &to64(&w), 0.1, false);
    let ga = get_rows_back_case(DType::F32, nc, m, &ids, &w).run(2);
    assert_maa(&gn, &ga, 1e-4, "get_rows grad");
}

/// test_repeat_back's shapes ({8, 6, 4, 2} tiled along each dim, also from a strided view),
/// checked against finite differences of repeat.
#[test]
fn repeat_back_matches_finite_differences_of_repeat() {
    let ne = [8usize, 6, 4, 2];
    for nr in [[1usize, 1, 1, 1], [2, 1, 1, 1], [1, 2, 1, 1], [1, 1, 2, 1], [1, 1, 1, 2]] {
        for view in [false, true] {
            let big = [ne[0] * nr[0], ne[1] * nr[1], ne[2] * nr[2], ne[3] * nr[3]];
            let x = uniform(numel(ne), 80, -1.0, 1.0);
            let w = uniform(numel(big), 81, -1.0, 1.0);
            let mut g = Graph::new();
            let a = g.input(DType::F32, &ne).unwrap();
            let y = g.repeat(a, big).unwrap();
            let mut fc = Case::new(g, y);
            fc.f32s.push((a, x.clone()));
            let gn = numeric_grad(&mut forward_fn(fc, a), &x, &to64(&w), 0.1, false);
            // repeat_back of w (through a strided view of a larger tensor when `view`).
            let mut g = Graph::new();
            let (src, data) = if view {
                let outer = [big[0] * 2, big[1], big[2], big[3]];
                let s = g.input(DType::F32, &outer).unwrap();
                let nb = g.strides(s).unwrap();
                let v = g.view_4d(s, big, [nb[1], nb[2], nb[3]], 0).unwrap();
                let mut d = vec![9.0f32; numel(outer)];
                for i in each(big) {
                    let k = ((i[3] * outer[2] + i[2]) * outer[1] + i[1]) * outer[0] + i[0];
                    d[k] = w[((i[3] * big[2] + i[2]) * big[1] + i[1]) * big[0] + i[0]];
                }
                (s, (v, d))
            } else {
                let s = g.input(DType::F32, &big).unwrap();
                (s, (s, w.clone()))
            };
            let target = g.input(DType::F32, &ne).unwrap();
            let out = g.repeat_back(data.0, target).unwrap();
            let mut bc = Case::new(g, out);
            bc.f32s.push((src, data.1));
            let ga = bc.run_threads("repeat_back");
            assert_maa(&gn, &ga, 1e-4, &format!("repeat grad nr {nr:?} view {view}"));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// im2col_back

/// f64 im2col of `x` ([IW, IH, IC, N] or [IW, IC, N]) for a kernel of (kw, kh): ggml's layout
/// [IC*KH*KW, OW, OH, N] (1-D: [IC*KW, OW, N]).
#[allow(clippy::too_many_arguments)]
fn im2col_ref(
    x: &[f64],
    ne: [usize; 4],
    kw: usize,
    kh: usize,
    s: [i64; 2],
    p: [i64; 2],
    d: [i64; 2],
    is_2d: bool,
) -> Vec<f64> {
    let (iw, ih, ic, n) =
        if is_2d { (ne[0], ne[1], ne[2], ne[3]) } else { (ne[0], 1, ne[1], ne[2]) };
    let out = |ins: usize, k: usize, s: i64, p: i64, d: i64| {
        ((ins as i64 + 2 * p - d * (k as i64 - 1) - 1) / s + 1) as usize
    };
    let ow = out(iw, kw, s[0], p[0], d[0]);
    let oh = if is_2d { out(ih, kh, s[1], p[1], d[1]) } else { 1 };
    let cols = ic * kh * kw;
    let mut r = vec![0f64; cols * ow * oh * n];
    for b in 0..n {
        for oy in 0..oh {
            for ox in 0..ow {
                for c in 0..ic {
                    for ky in 0..kh {
                        for kx in 0..kw {
                            let y =
                                if is_2d { oy as i64 * s[1] + ky as i64 * d[1] - p[1] } else { 0 };
                            let xx = ox as i64 * s[0] + kx as i64 * d[0] - p[0];
                            if y < 0 || y >= ih as i64 || xx < 0 || xx >= iw as i64 {
                                continue;
                            }
                            let src = ((b * ic + c) * ih + y as usize) * iw + xx as usize;
                            r[((b * oh + oy) * ow + ox) * cols + (c * kh + ky) * kw + kx] = x[src];
                        }
                    }
                }
            }
        }
    }
    r
}

#[test]
fn im2col_back_matches_finite_differences_of_im2col() {
    // (input, kernel, s, p, d, 2-D): test_im2col's small cases and odd strides and dilations.
    type Im2colCase = ([usize; 4], [usize; 4], [usize; 2], [usize; 2], [usize; 2], bool);
    let cases: [Im2colCase; 5] = [
        ([10, 10, 3, 1], [3, 3, 3, 1], [1, 1], [1, 1], [1, 1], true),
        ([5, 5, 1, 2], [3, 4, 1, 2], [1, 1], [0, 0], [1, 1], true),
        ([9, 7, 2, 2], [3, 2, 2, 1], [2, 3], [1, 2], [2, 1], true),
        ([30, 4, 2, 1], [3, 4, 5, 1], [1, 0], [1, 0], [1, 0], false),
        ([17, 3, 2, 1], [4, 3, 2, 1], [3, 0], [2, 0], [2, 0], false),
    ];
    for (ine, kne, s, p, d, is_2d) in cases {
        for kt in [DType::F32, DType::F16] {
            let x = to64(&uniform(numel(ine), 90, -1.0, 1.0));
            let (kw, kh) = (kne[0], if is_2d { kne[1] } else { 1 });
            let (s64, p64, d64) = (
                [s[0] as i64, s[1].max(1) as i64],
                [p[0] as i64, p[1] as i64],
                [d[0] as i64, d[1].max(1) as i64],
            );
            let fwd = im2col_ref(&x, ine, kw, kh, s64, p64, d64, is_2d);
            let w = to64(&uniform(fwd.len(), 91, -1.0, 1.0));
            let mut f = |xv: &[f64]| im2col_ref(xv, ine, kw, kh, s64, p64, d64, is_2d);
            let gn = numeric_grad64(&mut f, &x, &w, 1e-3);
            let cols = if is_2d { kne[2] * kh * kw } else { kne[1] * kw };
            let ow = (ine[0] + 2 * p[0] - d[0] * (kw - 1) - 1) / s[0] + 1;
            let gne = if is_2d {
                let oh = (ine[1] + 2 * p[1] - d[1] * (kh - 1) - 1) / s[1] + 1;
                [cols, ow, oh, ine[3]]
            } else {
                [cols, ow, ine[2], 1]
            };
            assert_eq!(numel(gne), fwd.len());
            let mut g = Graph::new();
            let a = g.input(DType::F32, &gne).unwrap();
            let k = g.input(kt, &kne).unwrap();
            let out = g.im2col_back(a, k, ine, s[0], s[1], p[0], p[1], d[0], d[1], is_2d).unwrap();
            assert_eq!(g.shape(out).unwrap(), ine);
            let mut c = Case::new(g, out);
            c.f32s.push((a, w.iter().map(|&v| v as f32).collect()));
            // The kernel only lends its shape; its values do not matter.
            if kt == DType::F16 {
                c.f16s.push((k, vec![f16::ONE; numel(kne)]));
            } else {
                c.f32s.push((k, vec![1.0; numel(kne)]));
            }
            let ga = c.run_threads("im2col_back");
            assert_nmse(&ga, &gn, 1e-7, &format!("im2col_back {ine:?} {kne:?} {kt}"));
            assert_maa(&gn, &ga, 1e-4, &format!("im2col grad {ine:?} {kne:?}"));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// pool_2d_back

#[allow(clippy::too_many_arguments)]
fn pool_2d_ref(
    x: &[f64],
    ne: [usize; 4],
    op: PoolOp,
    k: [usize; 2],
    s: [usize; 2],
    p: [usize; 2],
) -> (Vec<f64>, [usize; 4]) {
    let ow = (ne[0] + 2 * p[0] - k[0]) / s[0] + 1;
    let oh = (ne[1] + 2 * p[1] - k[1]) / s[1] + 1;
    let one = [ow, oh, ne[2], ne[3]];
    let mut out = vec![0f64; numel(one)];
    for i in each(one) {
        let plane = i[3] * ne[2] + i[2];
        let mut acc = if op == PoolOp::Max { -(f32::MAX as f64) } else { 0.0 };
        for ky in 0..k[1] {
            for kx in 0..k[0] {
                let y = (i[1] * s[1] + ky) as i64 - p[1] as i64;
                let xx = (i[0] * s[0] + kx) as i64 - p[0] as i64;
                if y < 0 || y >= ne[1] as i64 || xx < 0 || xx >= ne[0] as i64 {
                    continue;
                }
                let v = x[(plane * ne[1] + y as usize) * ne[0] + xx as usize];
                acc = if op == PoolOp::Max { acc.max(v) } else { acc + v };
            }
        }
        if op == PoolOp::Avg {
            acc /= (k[0] * k[1]) as f64;
        }
        out[((plane * oh) + i[1]) * ow + i[0]] = acc;
    }
    (out, one)
}

/// test_pool2d's cases ({10, 10, 3, 1}, k, s in {1,2} x {1,3}, p in {0, 1}) for both functions,
/// F32 and F16 forward inputs.
#[test]
fn pool_2d_back_matches_finite_differences_of_pool_2d() {
    let ne = [10usize, 10, 3, 1];
    let mut n_cases = 0;
    for op in [PoolOp::Avg, PoolOp::Max] {
        for k0 in [1usize, 3] {
            for k1 in [1usize, 3] {
                for s0 in [1usize, 2] {
                    for s1 in [1usize, 2] {
                        for p0 in [0usize, 1] {
                            for p1 in [0usize, 1] {
                                // ggml's forward needs out > 0; with k=1, p=1 windows may be empty.
                                let dt = if n_cases % 2 == 0 { DType::F32 } else { DType::F16 };
                                n_cases += 1;
                                // Distinct values (even in F16), so every max is unique.
                                let nx = numel(ne);
                                let xf: Vec<f32> = (0..nx)
                                    .map(|i| {
                                        ((i * 97 + n_cases) % nx) as f32 / nx as f32 * 2.0 - 1.0
                                    })
                                    .collect();
                                let xf: Vec<f32> = if dt == DType::F16 {
                                    xf.iter().map(|&v| f16::from_f32(v).to_f32()).collect()
                                } else {
                                    xf
                                };
                                let x = to64(&xf);
                                let (k, s, p) = ([k0, k1], [s0, s1], [p0, p1]);
                                let (_, one) = pool_2d_ref(&x, ne, op, k, s, p);
                                let w = to64(&uniform(numel(one), 200 + n_cases as u64, -1.0, 1.0));
                                let mut f = |xv: &[f64]| pool_2d_ref(xv, ne, op, k, s, p).0;
                                let gn = numeric_grad64(&mut f, &x, &w, 1e-5);
                                let mut g = Graph::new();
                                let a = g.input(DType::F32, &one).unwrap();
                                let af = g.input(dt, &ne).unwrap();
                                let out = g
                                    .pool_2d_back(
                                        a,
                                        af,
                                        quantgraph::Pool2dParams::new(op, k0, k1)
                                            .stride(s0, s1)
                                            .padding(p0 as f32, p1 as f32),
                                    )
                                    .unwrap();
                                let mut c = Case::new(g, out);
                                c.f32s.push((a, w.iter().map(|&v| v as f32).collect()));
                                if dt == DType::F16 {
                                    c.f16s
                                        .push((af, xf.iter().map(|&v| f16::from_f32(v)).collect()));
                                } else {
                                    c.f32s.push((af, xf));
                                }
                                let ga = c.run_threads("pool_2d_back");
                                let what =
                                    format!("pool_2d_back {op:?} k {k:?} s {s:?} p {p:?} {dt}");
                                assert_nmse(&ga, &gn, 1e-7, &what);
                                assert_maa(&gn, &ga, 1e-4, &what);
                            }
                        }
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// flash_attn_back

struct AttnDims {
    d: usize,
    n: usize,
    m: usize,
    h: usize,
    hkv: usize,
    b: usize,
}

/// f64 attention with ggml's flash_attn_back layout: q [D, N, H, B], k [D, M, Hkv, B],
/// v [M, D, Hkv, B]; q head h uses kv head h % Hkv; causal with offset M - N when `masked`.
fn attn_ref(q: &[f64], k: &[f64], v: &[f64], s: &AttnDims, masked: bool) -> Vec<f64> {
    let scale = 1.0 / (s.d as f64).sqrt();
    let mut out = vec![0f64; s.d * s.n * s.h * s.b];
    for b in 0..s.b {
        for h in 0..s.h {
            let hk = h % s.hkv;
            for i in 0..s.n {
                let mb = if masked { s.m - s.n + i + 1 } else { s.m };
                let qo = ((b * s.h + h) * s.n + i) * s.d;
                let sc: Vec<f64> = (0..mb)
                    .map(|j| {
                        let ko = ((b * s.hkv + hk) * s.m + j) * s.d;
                        (0..s.d).map(|c| k[ko + c] * q[qo + c]).sum::<f64>() * scale
                    })
                    .collect();
                let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = sc.iter().map(|&x| (x - mx).exp()).collect();
                let z: f64 = e.iter().sum();
                for c in 0..s.d {
                    let vo = ((b * s.hkv + hk) * s.d + c) * s.m;
                    out[qo + c] = (0..mb).map(|j| e[j] / z * v[vo + j]).sum();
                }
            }
        }
    }
    out
}

#[test]
fn flash_attn_back_matches_finite_differences_of_attention() {
    let s = AttnDims { d: 8, n: 3, m: 5, h: 4, hkv: 2, b: 2 };
    let (nq, nk) = (s.d * s.n * s.h * s.b, s.d * s.m * s.hkv * s.b);
    let q = uniform(nq, 110, -1.0, 1.0);
    let k = uniform(nk, 111, -1.0, 1.0);
    let v = uniform(nk, 112, -1.0, 1.0);
    let dout = uniform(nq, 113, -1.0, 1.0);
    let (q64, k64, v64, w) = (to64(&q), to64(&k), to64(&v), to64(&dout));
    for masked in [false, true] {
        let gq = numeric_grad64(&mut |x| attn_ref(x, &k64, &v64, &s, masked), &q64, &w, 1e-4);
        let gk = numeric_grad64(&mut |x| attn_ref(&q64, x, &v64, &s, masked), &k64, &w, 1e-4);
        let gv = numeric_grad64(&mut |x| attn_ref(&q64, &k64, x, &s, masked), &v64, &w, 1e-4);
        let mut g = Graph::new();
        let qi = g.input(DType::F32, &[s.d, s.n, s.h, s.b]).unwrap();
        let ki = g.input(DType::F32, &[s.d, s.m, s.hkv, s.b]).unwrap();
        let vi = g.input(DType::F32, &[s.m, s.d, s.hkv, s.b]).unwrap();
        let di = g.input(DType::F32, &[s.d, s.n, s.h, s.b]).unwrap();
        let out = g.flash_attn_back(qi, ki, vi, di, masked).unwrap();
        let lay = FlashAttnBackLayout::new(nq, nk, nk).unwrap();
        assert_eq!(g.shape(out).unwrap(), [lay.n_elements, 1, 1, 1]);
        let mut c = Case::new(g, out);
        c.f32s = vec![(qi, q.clone()), (ki, k.clone()), (vi, v.clone()), (di, dout.clone())];
        let got = c.run_threads("flash_attn_back");
        let parts =
            [(&gq, lay.offs_q / 4, "q"), (&gk, lay.offs_k / 4, "k"), (&gv, lay.offs_v / 4, "v")];
        for (gn, off, what) in parts {
            let ga = &got[off..off + gn.len()];
            let what = format!("flash_attn_back d{what} masked {masked}");
            assert_nmse(ga, gn, 1e-7, &what);
            assert_maa(gn, ga, 1e-4, &what);
        }
        // The alignment gaps are zeroed.
        assert!(got[nq..lay.offs_k / 4].iter().all(|&x| x == 0.0));
    }
}

// ---------------------------------------------------------------------------------------------
// Build-time validation

#[test]
fn backward_ops_reject_bad_shapes_and_types() {
    let mut g = Graph::new();
    let a = g.input(DType::F32, &[8, 4]).unwrap();
    let b = g.input(DType::F32, &[8, 4]).unwrap();
    let c = g.input(DType::F32, &[8, 3]).unwrap();
    let h = g.input(DType::F16, &[8, 4]).unwrap();
    let i = g.input(DType::I32, &[4]).unwrap();
    let s = g.input(DType::F32, &[1]).unwrap();
    let t = g.transpose(a).unwrap();

    let e = g.cross_entropy_loss(a, c).unwrap_err();
    assert!(e.to_string().contains("cross_entropy_loss"), "{e}");
    assert!(matches!(g.cross_entropy_loss(a, h), Err(Error::Type { .. })));
    assert!(g.cross_entropy_loss(t, t).is_err(), "transposed rows");
    assert!(g.cross_entropy_loss_back(a, a, b).is_err(), "grad must be a scalar");
    assert!(g.cross_entropy_loss_back(s, a, c).is_err());

    assert!(g.silu_back(a, c).is_err());
    let e = g.silu_back(a, h).unwrap_err();
    assert!(e.to_string().contains("silu_back") && e.to_string().contains("f16"), "{e}");
    assert!(g.silu_back(i, i).is_err());
    assert!(g.rms_norm_back(a, c, 1e-6).is_err());
    assert!(g.rms_norm_back(a, b, -1.0).is_err());
    assert!(g.rms_norm_back(h, h, 1e-6).is_err());
    assert!(g.soft_max_ext_back(a, c, 1.0, 0.0).is_err());
    let e = g.soft_max_ext_back(a, b, 1.0, 8.0).unwrap_err();
    assert!(matches!(e, Error::Param { op: "soft_max_back", .. }), "{e}");

    let pos = g.input(DType::I32, &[4]).unwrap();
    let x = g.input(DType::F32, &[8, 2, 4]).unwrap();
    assert!(g.rope_ext_back(x, pos, None, RopeParams::new(9, RopeMode::Normal, 1e4)).is_err());
    assert!(g.rope_ext_back(x, i, None, RopeParams::new(8, RopeMode::Neox, 1e4)).is_ok());
    assert!(
        g.rope_multi_back(x, pos, None, [2, 1, 1, 0], RopeParams::new(8, RopeMode::Neox, 1e4))
            .is_err()
    );

    // get_rows_back: ids type, one id per grad row, equal row lengths.
    assert!(g.get_rows_back(a, c, b).is_err());
    let i3 = g.input(DType::I32, &[3]).unwrap();
    assert!(g.get_rows_back(a, i3, b).is_err());
    let narrow = g.input(DType::F32, &[7, 4]).unwrap();
    assert!(g.get_rows_back(a, i, narrow).is_err());
    assert!(g.get_rows_back(a, i, c).is_ok());

    // im2col_back: the grad must have im2col's output shape.
    let k = g.input(DType::F16, &[3, 3, 2, 4]).unwrap();
    let grad = g.input(DType::F32, &[18, 6, 6, 1]).unwrap();
    assert!(g.im2col_back(grad, k, [6, 6, 2, 1], 1, 1, 1, 1, 1, 1, true).is_ok());
    let e = g.im2col_back(grad, k, [7, 6, 2, 1], 1, 1, 1, 1, 1, 1, true).unwrap_err();
    assert!(e.to_string().contains("im2col_back"), "{e}");
    assert!(g.im2col_back(grad, k, [6, 6, 3, 1], 1, 1, 1, 1, 1, 1, true).is_err(), "channels");
    assert!(g.im2col_back(grad, k, [6, 6, 2, 1], 0, 1, 1, 1, 1, 1, true).is_err(), "stride 0");
    assert!(g.im2col_back(h, k, [6, 6, 2, 1], 1, 1, 1, 1, 1, 1, true).is_err());
    let big = usize::MAX;
    assert!(g.im2col_back(grad, k, [6, 6, 2, 1], big, big, big, big, big, big, true).is_err());
    assert!(g.im2col_back(grad, k, [big, 6, 2, 1], 1, 1, 1, 1, 1, 1, true).is_err());
    assert!(
        g.pool_2d_back(
            grad,
            grad,
            quantgraph::Pool2dParams::new(PoolOp::Max, big, 1).stride(big, 1).padding(0.0, 0.0)
        )
        .is_err()
    );

    // pool_2d_back: the grad must have pool_2d's output shape.
    let af = g.input(DType::F32, &[10, 10, 3]).unwrap();
    let pg = g.input(DType::F32, &[4, 4, 3]).unwrap();
    assert!(
        g.pool_2d_back(
            pg,
            af,
            quantgraph::Pool2dParams::new(PoolOp::Max, 3, 3).stride(2, 2).padding(0.0, 0.0)
        )
        .is_ok()
    );
    assert!(
        g.pool_2d_back(
            pg,
            af,
            quantgraph::Pool2dParams::new(PoolOp::Max, 3, 3).stride(2, 2).padding(1.0, 0.0)
        )
        .is_err()
    );
    assert!(
        g.pool_2d_back(
            pg,
            af,
            quantgraph::Pool2dParams::new(PoolOp::Avg, 0, 3).stride(2, 2).padding(0.0, 0.0)
        )
        .is_err()
    );
    assert!(
        g.pool_2d_back(
            pg,
            af,
            quantgraph::Pool2dParams::new(PoolOp::Avg, 3, 3).stride(2, 2).padding(f32::NAN, 0.0)
        )
        .is_err()
    );
    // Padding wider than the window: whole windows in the padding get no gradient.
    for op in [PoolOp::Avg, PoolOp::Max] {
        let mut g2 = Graph::new();
        let af = g2.input(DType::F32, &[4, 3]).unwrap();
        let pg = g2.input(DType::F32, &[12, 11]).unwrap();
        let out = g2
            .pool_2d_back(
                pg,
                af,
                quantgraph::Pool2dParams::new(op, 1, 1).stride(1, 1).padding(4.0, 4.0),
            )
            .unwrap();
        let mut c = Case::new(g2, out);
        c.f32s = vec![(af, uniform(12, 1, -1.0, 1.0)), (pg, vec![1.0; 132])];
        assert_eq!(c.run_threads("pool_2d_back wide padding"), vec![1.0; 12], "{op:?}");
    }

    // flash_attn_back: v must be [M, D, ...], M >= N, heads divisible.
    let q = g.input(DType::F32, &[8, 3, 4]).unwrap();
    let kk = g.input(DType::F32, &[8, 5, 2]).unwrap();
    let vv = g.input(DType::F32, &[5, 8, 2]).unwrap();
    assert!(g.flash_attn_back(q, kk, vv, q, true).is_ok());
    assert!(g.flash_attn_back(q, kk, kk, q, true).is_err());
    let k3 = g.input(DType::F32, &[8, 5, 3]).unwrap();
    let v3 = g.input(DType::F32, &[5, 8, 3]).unwrap();
    assert!(g.flash_attn_back(q, k3, v3, q, true).is_err());
    let short = g.input(DType::F32, &[8, 2, 2]).unwrap();
    let vs = g.input(DType::F32, &[2, 8, 2]).unwrap();
    let e = g.flash_attn_back(q, short, vs, q, false).unwrap_err();
    assert!(e.to_string().contains("flash_attn_back"), "{e}");
}
