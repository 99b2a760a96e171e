//! Gradients built by `Graph::build_backward` against central finite differences: one case per
//! differentiable op (broadcasts, views, permutes and reused tensors included), then random
//! graphs mixing them. The ops compute in F32, so the numerical derivative is the 4-point
//! stencil `(8 (f(x+h) - f(x-h)) - (f(x+2h) - f(x-2h))) / 12h` with h = 1e-2 on a loss kept
//! near 1 (`sum(y * r)` with small random weights r): its rounding noise is about 1e-4 and its
//! truncation error far below that, so an analytic gradient within 2e-3 + 1% passes and a wrong
//! rule (off by a factor, a sign, a missing accumulation) fails.

use quantgraph::testdata::{Xorshift64, uniform};
use quantgraph::{
    Conv2dParams, CpuBackend, DType, Graph, Plan, Pool2dParams, PoolOp, Result, RopeMode,
    RopeParams, TensorId, UnaryOp,
};

enum Data {
    F32(Vec<f32>),
    I32(Vec<i32>),
}

/// A graph under construction with the data of its inputs.
struct Case {
    g: Graph,
    params: Vec<(TensorId, Vec<f32>)>,
    consts: Vec<(TensorId, Data)>,
    seed: u64,
}

impl Case {
    fn new(seed: u64) -> Case {
        Case { g: Graph::new(), params: Vec::new(), consts: Vec::new(), seed }
    }

    fn next_seed(&mut self) -> u64 {
        self.seed = self.seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.seed
    }

    /// A parameter with values uniform in [lo, hi).
    fn param_in(&mut self, ne: &[usize], lo: f32, hi: f32) -> TensorId {
        let n = ne.iter().product();
        let v = uniform(n, self.next_seed(), lo, hi);
        self.param_with(ne, v)
    }

    fn param(&mut self, ne: &[usize]) -> TensorId {
        self.param_in(ne, -1.0, 1.0)
    }

    /// A parameter whose values stay at least 0.1 away from 0 (for abs, relu, sgn, step).
    fn param_off_zero(&mut self, ne: &[usize]) -> TensorId {
        let n = ne.iter().product();
        let v = uniform(n, self.next_seed(), 0.1, 1.0);
        let s = uniform(n, self.next_seed(), -1.0, 1.0);
        let v = v.iter().zip(&s).map(|(a, b)| if *b < 0.0 { -a } else { *a }).collect();
        self.param_with(ne, v)
    }

    fn param_with(&mut self, ne: &[usize], v: Vec<f32>) -> TensorId {
        let id = self.g.input(DType::F32, ne).unwrap();
        self.params.push((id, v));
        id
    }

    fn konst_in(&mut self, ne: &[usize], lo: f32, hi: f32) -> TensorId {
        let n = ne.iter().product();
        let v = uniform(n, self.next_seed(), lo, hi);
        let id = self.g.input(DType::F32, ne).unwrap();
        self.consts.push((id, Data::F32(v)));
        id
    }

    fn ids(&mut self, ne: &[usize], v: Vec<i32>) -> TensorId {
        let id = self.g.input(DType::I32, ne).unwrap();
        self.consts.push((id, Data::I32(v)));
        id
    }
}

fn set_all(plan: &mut Plan, case: &Case, params: &[Vec<f32>]) {
    for ((id, _), v) in case.params.iter().zip(params) {
        plan.set_input(*id, v).unwrap();
    }
    // A constant only read for its shape (repeat_back's `like`) is not an input of the plan.
    for (id, d) in &case.consts {
        let _ = match d {
            Data::F32(v) => plan.set_input(*id, v),
            Data::I32(v) => plan.set_input(*id, v),
        };
    }
}

/// Builds `y = build(case)`, the loss `sum(y * r)`, its gradients, and compares every
/// parameter's gradient with finite differences.
fn check(name: &str, seed: u64, build: impl FnOnce(&mut Case) -> Result<TensorId>) {
    let mut c = Case::new(seed);
    let y = build(&mut c).unwrap_or_else(|e| panic!("{name}: building the forward graph: {e}"));
    let ne = c.g.shape(y).unwrap();
    let n: usize = ne.iter().product();
    let r = c.konst_in(&ne, -1.0 / (n as f32).sqrt(), 1.0 / (n as f32).sqrt());
    let yr = c.g.mul(y, r).unwrap();
    let loss = c.g.sum(yr).unwrap();
    for i in 0..c.params.len() {
        c.g.set_param(c.params[i].0).unwrap();
    }
    c.g.set_loss(loss).unwrap();
    c.g.build_backward().unwrap_or_else(|e| panic!("{name}: build_backward: {e}"));
    // Random graphs may leave a parameter unused: it has no gradient, and is not compared.
    if !name.starts_with("random") {
        assert!(
            c.params.iter().all(|(p, _)| c.g.grad(*p).is_some()),
            "{name}: a gradient is missing"
        );
    }
    c.params.retain(|(p, _)| c.g.grad(*p).is_some());
    assert!(!c.params.is_empty(), "{name}: no parameter has a gradient");
    let grads: Vec<TensorId> = c.params.iter().map(|(p, _)| c.g.grad(*p).unwrap()).collect();
    let graph = std::mem::take(&mut c.g);
    let mut plan = Plan::new(graph, &CpuBackend::with_threads(1).unwrap())
        .unwrap_or_else(|e| panic!("{name}: plan: {e}"));
    let mut values: Vec<Vec<f32>> = c.params.iter().map(|(_, v)| v.clone()).collect();
    set_all(&mut plan, &c, &values);
    plan.compute().unwrap();
    let analytic: Vec<Vec<f32>> =
        grads.iter().map(|&g| plan.output::<f32>(g).unwrap().to_vec()).collect();
    let h = 1e-2f32;
    let f = |plan: &mut Plan, values: &[Vec<f32>]| -> f64 {
        set_all(plan, &c, values);
        plan.compute().unwrap();
        plan.output::<f32>(loss).unwrap()[0] as f64
    };
    let mut worst = 0f64;
    for p in 0..values.len() {
        for i in 0..values[p].len() {
            let x = values[p][i];
            let mut at = |d: f32| {
                values[p][i] = x + d;
                f(&mut plan, &values)
            };
            let (f1, fm1, f2, fm2) = (at(h), at(-h), at(2.0 * h), at(-2.0 * h));
            values[p][i] = x;
            let num = (8.0 * (f1 - fm1) - (f2 - fm2)) / (12.0 * h as f64);
            let got = analytic[p][i] as f64;
            let err = (got - num).abs();
            worst = worst.max(err);
            assert!(
                err <= 2e-3 + 1e-2 * num.abs(),
                "{name}: d loss / d param{p}[{i}]: backward graph {got}, finite differences {num}"
            );
        }
    }
    assert!(worst.is_finite(), "{name}: no gradient compared");
}

#[test]
fn binary_ops_with_broadcast() {
    check("add", 1, |c| {
        let a = c.param(&[4, 3, 2]);
        let b = c.param(&[4, 3, 2]);
        c.g.add(a, b)
    });
    check("add broadcast", 2, |c| {
        let a = c.param(&[4, 3, 2]);
        let b = c.param(&[4, 1, 2]);
        c.g.add(a, b)
    });
    check("sub broadcast", 3, |c| {
        let a = c.param(&[4, 3, 2]);
        let b = c.param(&[1, 3, 1]);
        c.g.sub(a, b)
    });
    check("mul broadcast", 4, |c| {
        let a = c.param(&[4, 3, 2]);
        let b = c.param(&[4, 1, 1]);
        c.g.mul(a, b)
    });
    check("div broadcast", 5, |c| {
        let a = c.param(&[4, 3, 2]);
        let b = c.param_in(&[4, 3, 1], 0.8, 2.0);
        c.g.div(a, b)
    });
    check("div same shape", 6, |c| {
        let a = c.param(&[5, 3]);
        let b = c.param_in(&[5, 3], -2.0, -0.8);
        c.g.div(a, b)
    });
    check("add1", 7, |c| {
        let a = c.param(&[5, 3]);
        let b = c.param(&[1]);
        c.g.add1(a, b)
    });
    check("acc", 8, |c| {
        let a = c.param(&[6, 4]);
        let b = c.param(&[3, 2]);
        c.g.acc(a, b, [24, 48, 48], 8)
    });
    check("set", 9, |c| {
        let a = c.param(&[6, 4]);
        let b = c.param(&[2, 3]);
        c.g.set(a, b, [24, 72, 72], 4)
    });
}

#[test]
fn elementwise_ops() {
    check("scale_bias", 10, |c| {
        let a = c.param(&[7, 2]);
        c.g.scale_bias(a, -1.5, 0.25)
    });
    check("sqr", 11, |c| {
        let a = c.param(&[7, 2]);
        c.g.sqr(a)
    });
    check("sqrt", 12, |c| {
        let a = c.param_in(&[7, 2], 0.5, 2.0);
        c.g.sqrt(a)
    });
    check("log", 13, |c| {
        let a = c.param_in(&[7, 2], 0.5, 2.0);
        c.g.log(a)
    });
    check("sin", 14, |c| {
        let a = c.param(&[7, 2]);
        c.g.sin(a)
    });
    check("cos", 15, |c| {
        let a = c.param(&[7, 2]);
        c.g.cos(a)
    });
    let unary = [
        UnaryOp::Abs,
        UnaryOp::Neg,
        UnaryOp::Relu,
        UnaryOp::Silu,
        UnaryOp::Exp,
        UnaryOp::Expm1,
        UnaryOp::Softplus,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
    ];
    for (k, u) in unary.into_iter().enumerate() {
        check(u.name(), 20 + k as u64, |c| {
            let a = c.param_off_zero(&[7, 3]);
            c.g.unary(a, u)
        });
    }
    // sgn and step are flat: the gradient flows only through the other factor.
    for (k, u) in [UnaryOp::Sgn, UnaryOp::Step].into_iter().enumerate() {
        check(u.name(), 30 + k as u64, |c| {
            let a = c.param_off_zero(&[7, 3]);
            let s = c.g.unary(a, u)?;
            c.g.mul(s, a)
        });
    }
    check("swiglu split", 32, |c| {
        let a = c.param(&[6, 3]);
        let b = c.param(&[6, 3]);
        c.g.swiglu(a, Some(b))
    });
}

#[test]
fn reductions_and_repeats() {
    check("sum", 40, |c| {
        let a = c.param(&[5, 3, 2]);
        c.g.sum(a)
    });
    check("sum_rows", 41, |c| {
        let a = c.param(&[5, 3, 2]);
        c.g.sum_rows(a)
    });
    check("mean", 42, |c| {
        let a = c.param(&[5, 3, 2]);
        c.g.mean(a)
    });
    check("repeat", 43, |c| {
        let a = c.param(&[2, 3, 1]);
        c.g.repeat(a, [4, 6, 2, 1])
    });
    check("repeat_back", 44, |c| {
        let a = c.param(&[4, 6, 2]);
        let like = c.konst_in(&[2, 3, 1], 0.0, 1.0);
        c.g.repeat_back(a, like)
    });
    check("rms_norm", 45, |c| {
        let a = c.param(&[8, 3]);
        c.g.rms_norm(a, 1e-5)
    });
    check("soft_max", 46, |c| {
        let a = c.param(&[6, 3, 2]);
        c.g.soft_max(a)
    });
    check("soft_max_ext mask and scale", 47, |c| {
        let a = c.param(&[6, 3, 2]);
        let m = c.konst_in(&[6, 3], -1.0, 0.0);
        c.g.soft_max_ext(a, Some(m), 0.7, 0.0)
    });
    check("diag_mask_inf then soft_max", 48, |c| {
        let a = c.param(&[4, 4, 2]);
        let m = c.g.diag_mask_inf(a, 0)?;
        c.g.soft_max(m)
    });
    check("diag_mask_zero", 49, |c| {
        let a = c.param(&[4, 4, 2]);
        c.g.diag_mask_zero(a, 1)
    });
    check("cross_entropy_loss", 50, |c| {
        let a = c.param(&[5, 4]);
        let mut labels = uniform(20, 77, 0.0, 1.0);
        for row in labels.chunks_mut(5) {
            let s: f32 = row.iter().sum();
            row.iter_mut().for_each(|v| *v /= s);
        }
        let l = c.g.input(DType::F32, &[5, 4])?;
        c.consts.push((l, Data::F32(labels)));
        c.g.cross_entropy_loss(a, l)
    });
}

#[test]
fn views_permutes_and_copies() {
    check("transpose then cont", 60, |c| {
        let a = c.param(&[4, 3, 2]);
        let t = c.g.transpose(a)?;
        c.g.cont(t)
    });
    check("permute used directly", 61, |c| {
        let a = c.param(&[4, 3, 2, 2]);
        let b = c.param(&[2, 4, 2, 3]);
        let p = c.g.permute(a, [1, 3, 0, 2])?;
        c.g.mul(p, b)
    });
    check("reshape", 62, |c| {
        let a = c.param(&[6, 4]);
        let r = c.g.reshape(a, &[3, 8])?;
        let s = c.konst_in(&[3, 8], -1.0, 1.0);
        c.g.mul(r, s)
    });
    check("strided view", 63, |c| {
        let a = c.param(&[6, 4]);
        // Columns 1..4 of rows 1 and 3.
        let v = c.g.view_2d(a, [3, 2], 48, 28)?;
        c.g.sqr(v)
    });
    check("two overlapping views", 64, |c| {
        let a = c.param(&[12]);
        let v1 = c.g.view_1d(a, 8, 0)?;
        let v2 = c.g.view_1d(a, 8, 16)?;
        c.g.mul(v1, v2)
    });
    check("cpy into another shape", 65, |c| {
        let a = c.param(&[4, 3]);
        let dst = c.konst_in(&[3, 4], 0.0, 1.0);
        let s = c.g.sin(a)?;
        c.g.cpy(s, dst)
    });
    check("cont_reshape of a transpose", 66, |c| {
        let a = c.param(&[4, 3]);
        let t = c.g.transpose(a)?;
        c.g.cont_reshape(t, &[12])
    });
    check("get_rows", 67, |c| {
        let a = c.param(&[5, 4]);
        let ids = c.ids(&[6], vec![3, 0, 3, 1, 2, 3]);
        c.g.get_rows(a, ids)
    });
}

#[test]
fn matrix_products() {
    check("mul_mat", 70, |c| {
        let a = c.param(&[5, 4]);
        let b = c.param(&[5, 3]);
        c.g.mul_mat(a, b)
    });
    check("mul_mat batched", 71, |c| {
        let a = c.param(&[5, 4, 2, 2]);
        let b = c.param(&[5, 3, 2, 2]);
        c.g.mul_mat(a, b)
    });
    check("mul_mat broadcast dim 2", 72, |c| {
        let a = c.param(&[5, 4, 2]);
        let b = c.param(&[5, 3, 6]);
        c.g.mul_mat(a, b)
    });
    check("mul_mat broadcast dim 3", 73, |c| {
        let a = c.param(&[5, 4, 1, 2]);
        let b = c.param(&[5, 3, 1, 4]);
        c.g.mul_mat(a, b)
    });
    check("mul_mat of a transposed view", 74, |c| {
        let a = c.param(&[5, 4]);
        let b = c.param(&[3, 5]);
        let bt = c.g.transpose(b)?;
        let bt = c.g.cont(bt)?;
        c.g.mul_mat(a, bt)
    });
    check("two-layer perceptron", 75, |c| {
        let x = c.konst_in(&[6, 4], -1.0, 1.0);
        let w1 = c.param(&[6, 5]);
        let b1 = c.param(&[5]);
        let w2 = c.param(&[5, 3]);
        let h = c.g.mul_mat(w1, x)?;
        let h = c.g.add(h, b1)?;
        let h = c.g.tanh_(h)?;
        c.g.mul_mat(w2, h)
    });
}

trait Tanh {
    fn tanh_(&mut self, a: TensorId) -> Result<TensorId>;
}
impl Tanh for Graph {
    fn tanh_(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary(a, UnaryOp::Tanh)
    }
}

#[test]
fn rope_im2col_and_pooling() {
    for (k, mode) in [RopeMode::Normal, RopeMode::Neox].into_iter().enumerate() {
        check("rope", 80 + k as u64, |c| {
            let a = c.param(&[8, 2, 3]);
            let pos = c.ids(&[3], vec![0, 5, 11]);
            c.g.rope_ext(a, pos, None, RopeParams::new(8, mode, 10000.0))
        });
    }
    check("im2col 2-D", 82, |c| {
        let kernel = c.konst_in(&[3, 2, 2, 1], -1.0, 1.0);
        let x = c.param(&[5, 4, 2, 1]);
        let p = Conv2dParams { s0: 2, s1: 1, p0: 1, p1: 0, d0: 1, d1: 1 };
        c.g.im2col(kernel, x, p, true, DType::F32)
    });
    check("im2col 1-D", 83, |c| {
        let kernel = c.konst_in(&[3, 2, 1], -1.0, 1.0);
        let x = c.param(&[7, 2, 1]);
        let p = Conv2dParams { s0: 1, s1: 1, p0: 1, p1: 0, d0: 2, d1: 1 };
        c.g.im2col(kernel, x, p, false, DType::F32)
    });
    check("pool_2d avg", 84, |c| {
        let x = c.param(&[6, 4, 2]);
        c.g.pool_2d(x, Pool2dParams::new(PoolOp::Avg, 2, 2).stride(2, 1))
    });
    check("pool_2d max", 85, |c| {
        // Values 0.1 apart so no window's maximum changes within the finite difference step.
        let mut r = Xorshift64::new(85);
        let mut v: Vec<f32> = (0..48).map(|i| i as f32 * 0.1 - 2.4).collect();
        for i in (1..v.len()).rev() {
            v.swap(i, (r.next_u64() % (i as u64 + 1)) as usize);
        }
        let x = c.param_with(&[6, 4, 2], v);
        c.g.pool_2d(x, Pool2dParams::new(PoolOp::Max, 2, 2))
    });
}

#[test]
fn reused_tensors_accumulate() {
    check("x used four times", 90, |c| {
        let x = c.param(&[5, 2]);
        let a = c.g.mul(x, x)?;
        let b = c.g.sin(x)?;
        let d = c.g.add(a, b)?;
        let t = c.g.transpose(x)?;
        let t = c.g.cont(t)?;
        let t = c.g.reshape(t, &[5, 2])?;
        c.g.sub(d, t)
    });
    check("shared intermediate", 91, |c| {
        let x = c.param(&[4, 3]);
        let w = c.param(&[4, 1]);
        let h = c.g.mul(x, w)?;
        let s = c.g.soft_max(h)?;
        let e = c.g.mul(s, h)?;
        let r = c.g.sum_rows(h)?;
        c.g.add(e, r)
    });
}

/// Random graphs over [3, 3, 2, 2] tensors (square, so transposes and products keep the shape):
/// each step applies one of 28 ops (every differentiable family: binary ops with and without
/// broadcast parameters, unary functions, norms, softmax, products, reductions, views, permutes,
/// reshapes, get_rows, set, acc, cpy) to random earlier tensors, so tensors are reused; the
/// output sums several of them.
#[test]
fn random_graphs_match_finite_differences() {
    const NE: [usize; 4] = [3, 3, 2, 2];
    for seed in 1..=40u64 {
        check(&format!("random graph {seed}"), 1000 + seed, |c| {
            let mut r = Xorshift64::new(seed * 7919);
            let mut pick = |n: usize| (r.next_u64() % n as u64) as usize;
            let mut pool = vec![c.param(&NE), c.param(&NE)];
            let bcast = [c.param(&[3, 1, 2, 1]), c.param(&[1, 3, 1, 2]), c.param(&[1])];
            for _ in 0..8 {
                let a = pool[pick(pool.len())];
                let b = pool[pick(pool.len())];
                let op = pick(28);
                let y = match op {
                    0 => c.g.add(a, b)?,
                    1 => c.g.sub(a, b)?,
                    2 => c.g.mul(a, b)?,
                    3 => {
                        let q = c.g.sqr(b)?;
                        let q = c.g.scale_bias(q, 1.0, 1.0)?;
                        c.g.div(a, q)?
                    }
                    4 => {
                        let p = bcast[pick(2)];
                        match pick(4) {
                            0 => c.g.add(a, p)?,
                            1 => c.g.sub(a, p)?,
                            2 => c.g.mul(a, p)?,
                            _ => {
                                let q = c.g.sqr(p)?;
                                let q = c.g.scale_bias(q, 1.0, 1.0)?;
                                c.g.div(a, q)?
                            }
                        }
                    }
                    5 => c.g.add1(a, bcast[2])?,
                    6 => c.g.sin(a)?,
                    7 => c.g.unary(a, UnaryOp::Tanh)?,
                    8 => c.g.unary(a, UnaryOp::Sigmoid)?,
                    9 => c.g.silu(a)?,
                    10 => c.g.rms_norm(a, 1e-6)?,
                    11 => c.g.soft_max(a)?,
                    12 => {
                        let t = c.g.transpose(a)?;
                        c.g.mul(t, b)?
                    }
                    13 => {
                        let t = c.g.permute(a, [1, 0, 3, 2])?;
                        c.g.cont(t)?
                    }
                    14 => {
                        let m = c.g.mul_mat(a, b)?;
                        c.g.scale(m, 0.5)?
                    }
                    15 => {
                        let s = c.g.sum_rows(a)?;
                        let s = c.g.scale(s, 0.3)?;
                        c.g.add(b, s)?
                    }
                    16 => {
                        let v = c.g.reshape(a, &[9, 4])?;
                        let v = c.g.sqr(v)?;
                        let v = c.g.scale(v, 0.5)?;
                        c.g.reshape(v, &NE)?
                    }
                    17 => c.g.cos(a)?,
                    18 => {
                        let s = c.g.scale(a, 0.3)?;
                        c.g.unary(s, UnaryOp::Exp)?
                    }
                    19 => c.g.unary(a, UnaryOp::Softplus)?,
                    20 | 21 => {
                        let q = c.g.sqr(a)?;
                        let q = c.g.scale_bias(q, 1.0, 1.0)?;
                        if op == 20 { c.g.sqrt(q)? } else { c.g.log(q)? }
                    }
                    22 => {
                        let m = c.g.mean(a)?;
                        c.g.repeat(m, NE)?
                    }
                    23 => c.g.swiglu(a, Some(b))?,
                    24 => {
                        // Rows of a picked with repeats (the gradient sums them back).
                        let flat = c.g.reshape(a, &[3, 12])?;
                        let ids: Vec<i32> = (0..12).map(|_| pick(12) as i32).collect();
                        let ids = c.ids(&[12], ids);
                        let r = c.g.get_rows(flat, ids)?;
                        c.g.reshape(r, &NE)?
                    }
                    25 | 26 => {
                        // Two rows of b written (set) or added (acc) into rows 2 and 3 of a.
                        let v = c.g.view_2d(b, [3, 2], 12, 12)?;
                        let v = c.g.cont(v)?;
                        if op == 25 {
                            c.g.set(a, v, [12, 36, 72], 24)?
                        } else {
                            c.g.acc(a, v, [12, 36, 72], 24)?
                        }
                    }
                    _ => {
                        let s = c.g.sin(a)?;
                        let dst = c.konst_in(&[9, 4], 0.0, 1.0);
                        let d = c.g.cpy(s, dst)?;
                        let d = c.g.scale_bias(d, 1.0, 0.5)?;
                        c.g.reshape(d, &NE)?
                    }
                };
                pool.push(y);
            }
            let mut out = pool[pool.len() - 1];
            for _ in 0..2 {
                let other = pool[2 + pick(pool.len() - 2)];
                out = c.g.add(out, other)?;
            }
            Ok(out)
        });
    }
}

#[test]
fn ops_without_gradient_are_refused_by_name() {
    let mut g = Graph::new();
    let x = g.input(DType::F32, &[4]).unwrap();
    let y = g.gelu(x).unwrap();
    let l = g.sum(y).unwrap();
    g.set_param(x).unwrap();
    g.set_loss(l).unwrap();
    let e = g.build_backward().unwrap_err().to_string();
    assert!(e.contains("gelu"), "{e}");

    // An in-place node on the path is refused too.
    let mut g = Graph::new();
    let x = g.input(DType::F32, &[4]).unwrap();
    let s = g.sqr(x).unwrap();
    let y = g.sqr_inplace(s).unwrap();
    let l = g.sum(y).unwrap();
    g.set_param(x).unwrap();
    g.set_loss(l).unwrap();
    let e = g.build_backward().unwrap_err().to_string();
    assert!(e.contains("sqr") && e.contains("in place"), "{e}");
}

#[test]
fn marks_are_checked() {
    let mut g = Graph::new();
    let x = g.input(DType::F32, &[4]).unwrap();
    let unused = g.input(DType::F32, &[4]).unwrap();
    let y = g.sqr(x).unwrap();
    assert!(g.set_param(y).unwrap_err().to_string().contains("leaf"));
    assert!(g.set_loss(y).is_err(), "a loss must be a scalar");
    assert!(g.build_backward().is_err(), "no parameters yet");
    g.set_param(x).unwrap();
    g.set_param(unused).unwrap();
    assert!(g.build_backward().is_err(), "no loss yet");
    let l = g.sum(y).unwrap();
    g.set_loss(l).unwrap();
    g.build_backward().unwrap();
    assert!(g.grad(x).is_some());
    assert_eq!(g.grad(unused), None, "the loss does not depend on it");
    assert!(g.build_backward().is_err(), "runs once");
    assert!(g.set_param(unused).is_err(), "marks come before build_backward");
}
