//! Reverse-mode automatic differentiation (ggml's `ggml_set_param`, `ggml_set_loss`,
//! `ggml_build_backward_expand` and `ggml_graph_get_grad`): [`Graph::build_backward`] walks the
//! forward nodes from the last to the first and appends, for every node the loss depends on, the
//! nodes that compute its sources' gradients, with the rules of ggml's `ggml_compute_backward`
//! (src/ggml.c). Gradients of a tensor used several times are summed; broadcast sources get their
//! gradient summed over the broadcast tiles (`repeat_back`); views, reshapes and permutes route
//! the gradient back to the viewed elements.
//!
//! Where ggml's rule is wrong (the gradient of `add1`'s scalar is a mean in ggml, a sum here;
//! `sub` and `div` with a broadcast divisor, `mean` over several rows) the mathematically right
//! gradient is built instead. Nodes whose gradient ggml does not define are refused with an `Err`
//! naming the op.

use super::{GluOp, Graph, Op, TensorId, UnaryOp, shape_str};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Which gradients `build_backward` builds: the marks set by [`Graph::set_param`] and
/// [`Graph::set_loss`], and the result, per tensor index.
#[derive(Clone, Default)]
pub(crate) struct AutoDiff {
    params: Vec<TensorId>,
    losses: Vec<TensorId>,
    /// `(tensor, gradient)` for every parameter that has a gradient, after `build_backward`.
    grads: Vec<(TensorId, TensorId)>,
    /// Number of forward tensors when `build_backward` ran (0: not run).
    n_forward: usize,
}

/// Gradient sums of one backward pass, indexed by tensor position.
struct Grads(Vec<Option<TensorId>>);

impl Graph {
    /// Marks a leaf tensor (an input, weight or state, F32) as a trainable parameter
    /// (ggml_set_param): [`Graph::build_backward`] computes the loss's gradient with respect to
    /// it, readable through [`Graph::grad`].
    pub fn set_param(&mut self, id: TensorId) -> Result<()> {
        const OP: &str = "set_param";
        let t = self.get(OP, id)?;
        if !matches!(t.op, Op::None) {
            return Err(Error::arg(format!(
                "{OP}: {} is the result of op '{}'; parameters are leaf tensors (input, weight or state)",
                t.describe(id),
                t.op.name()
            )));
        }
        if t.dtype != DType::F32 {
            return Err(Error::ty(OP, format!("parameter {} must be F32", t.describe(id))));
        }
        if self.autodiff.n_forward != 0 {
            return Err(Error::arg(format!(
                "{OP}: build_backward already ran on this graph; mark {} before it",
                t.describe(id)
            )));
        }
        if !self.autodiff.params.contains(&id) {
            self.autodiff.params.push(id);
        }
        Ok(())
    }

    /// Marks an F32 scalar (one element) as a loss to minimise (ggml_set_loss), and as an output.
    /// With several losses, the gradients are those of their sum.
    pub fn set_loss(&mut self, id: TensorId) -> Result<()> {
        const OP: &str = "set_loss";
        let t = self.get(OP, id)?;
        if t.dtype != DType::F32 || t.nelements() != 1 {
            return Err(Error::shape(
                OP,
                format!("the loss {} must be an F32 scalar (one element)", t.describe(id)),
            ));
        }
        if self.autodiff.n_forward != 0 {
            return Err(Error::arg(format!(
                "{OP}: build_backward already ran on this graph; mark {} before it",
                t.describe(id)
            )));
        }
        if !self.autodiff.losses.contains(&id) {
            self.autodiff.losses.push(id);
        }
        self.set_output(id)
    }

    /// True when `id` was marked with [`Graph::set_param`].
    pub fn is_param(&self, id: TensorId) -> bool {
        self.autodiff.params.contains(&id)
    }

    /// The tensors marked with [`Graph::set_param`], in marking order.
    pub fn params(&self) -> &[TensorId] {
        &self.autodiff.params
    }

    /// The tensors marked with [`Graph::set_loss`], in marking order.
    pub fn losses(&self) -> &[TensorId] {
        &self.autodiff.losses
    }

    /// The gradient of the loss with respect to parameter `id` (ggml_graph_get_grad), after
    /// [`Graph::build_backward`]: a contiguous F32 tensor of `id`'s shape, marked as an output.
    /// `None` before `build_backward`, for a tensor that is not a parameter, and for a parameter
    /// the loss does not depend on.
    pub fn grad(&self, id: TensorId) -> Option<TensorId> {
        self.autodiff.grads.iter().find(|(p, _)| *p == id).map(|&(_, g)| g)
    }

    /// ggml_build_backward_expand: appends to the graph the nodes that compute the gradient of the
    /// losses ([`Graph::set_loss`], seeded with 1) with respect to every parameter
    /// ([`Graph::set_param`]), and marks each parameter's gradient as an output
    /// ([`Graph::grad`]). Runs once per graph.
    ///
    /// Gradients follow ggml's `ggml_compute_backward`, built from ordinary ops and the `*_back`
    /// ops: dup/cont, cpy, views (reshape, permute, transpose, strided views of contiguous
    /// tensors), add, add1, acc, sub, mul, div, scale, sqr, sqrt, log, sin, cos, sum, sum_rows,
    /// mean, repeat, repeat_back, rms_norm, mul_mat, set, get_rows, diag_mask_inf/zero,
    /// soft_max_ext (no mask gradient), rope, im2col, pool_2d, cross_entropy_loss, split swiglu,
    /// and the unary ops abs, sgn, neg, step, relu, silu, exp, expm1, softplus, tanh and sigmoid.
    /// Any other op on the path from a parameter to a loss is refused with an `Err` naming it, as
    /// are non-F32 tensors on that path and ops computed in place.
    ///
    /// ```
    /// use quantgraph::{CpuBackend, DType, Graph, Plan};
    /// let mut g = Graph::new();
    /// let x = g.input(DType::F32, &[3])?;
    /// let y = g.sqr(x)?;
    /// let loss = g.sum(y)?;
    /// g.set_param(x)?;
    /// g.set_loss(loss)?;
    /// g.build_backward()?;
    /// let dx = g.grad(x).unwrap();
    /// let mut plan = Plan::new(g, &CpuBackend::with_threads(1)?)?;
    /// plan.set_input(x, &[1.0f32, -2.0, 3.0])?;
    /// plan.compute()?;
    /// assert_eq!(plan.output::<f32>(dx)?, &[2.0, -4.0, 6.0]);
    /// # Ok::<(), quantgraph::Error>(())
    /// ```
    pub fn build_backward(&mut self) -> Result<()> {
        const OP: &str = "build_backward";
        if self.autodiff.n_forward != 0 {
            return Err(Error::arg(format!("{OP}: the backward graph was already built")));
        }
        if self.autodiff.params.is_empty() {
            return Err(Error::arg(format!("{OP}: no parameters (mark them with set_param)")));
        }
        if self.autodiff.losses.is_empty() {
            return Err(Error::arg(format!("{OP}: no loss (mark it with set_loss)")));
        }
        let n = self.tensors.len();
        // Which forward tensors carry a gradient: the parameters, and every node that reads one
        // through a differentiable source.
        let mut needs = vec![false; n];
        for i in 0..n {
            let id = self.id_at(i);
            let t = &self.tensors[i];
            if t.dtype == DType::I32 {
                continue;
            }
            needs[i] = self.autodiff.params.contains(&id)
                || t.src
                    .iter()
                    .enumerate()
                    .any(|(k, s)| s.is_some_and(|s| needs[s.index()]) && !ignored_src(&t.op, k));
        }
        let mut grads = Grads(vec![None; n]);
        for &l in &self.autodiff.losses.clone() {
            if !needs[l.index()] {
                continue;
            }
            let one = self.fill(l, 1.0)?;
            grads.add_or_set(self, l, one)?;
        }
        for i in (0..n).rev() {
            let Some(g) = grads.0[i] else { continue };
            if !needs[i] {
                continue;
            }
            let id = self.id_at(i);
            self.backward_node(id, g, &needs, &mut grads)?;
        }
        let mut out = Vec::new();
        for &p in &self.autodiff.params.clone() {
            let Some(mut g) = grads.0[p.index()] else { continue };
            if !self.t(g).is_contiguous() || g == p || self.t(g).view_src.is_some() {
                g = self.cont(g)?;
            }
            let name = format!("grad for {}", self.t(p).label(p));
            self.set_name(g, &name)?;
            self.set_output(g)?;
            out.push((p, g));
        }
        self.autodiff.grads = out;
        self.autodiff.n_forward = n;
        Ok(())
    }

    /// Adds the gradients of `node`'s sources, given the gradient `g` of `node`.
    fn backward_node(
        &mut self,
        node: TensorId,
        g: TensorId,
        needs: &[bool],
        grads: &mut Grads,
    ) -> Result<()> {
        let t = self.t(node).clone();
        let src = t.src;
        // Source k needs a gradient.
        let want = |k: usize| src[k].is_some_and(|s| needs[s.index()]) && !ignored_src(&t.op, k);
        if !(0..super::MAX_SRC).any(want) {
            return Ok(());
        }
        let unsupported = |why: &str| {
            Error::arg(format!(
                "build_backward: no gradient for op '{}' ({}){why}",
                t.op.name(),
                t.describe(node)
            ))
        };
        if t.dtype != DType::F32 {
            return Err(unsupported(": gradients are computed for F32 tensors only"));
        }
        for k in (0..super::MAX_SRC).filter(|&k| want(k)) {
            let s = src[k].expect("wanted sources exist");
            if self.t(s).dtype != DType::F32 {
                return Err(Error::ty(
                    "build_backward",
                    format!(
                        "source {} of {} needs a gradient but is not F32",
                        self.t(s).describe(s),
                        t.describe(node)
                    ),
                ));
            }
        }
        if t.view_src.is_some() && !matches!(t.op, Op::View | Op::Cpy) {
            return Err(unsupported(": the op runs in place; build it with the out-of-place form"));
        }
        let s0 = src[0].unwrap_or(node);
        let s1 = src[1].unwrap_or(node);
        let same = |g: &Graph, a: TensorId, b: TensorId| g.t(a).ne == g.t(b).ne;
        match &t.op {
            Op::None => {}
            Op::Dup => {
                let d = if same(self, node, s0) { g } else { self.reshape_grad(g, s0)? };
                grads.add_or_set(self, s0, d)?;
            }
            Op::Cpy => {
                if want(0) {
                    let d = self.reshape_grad(g, s0)?;
                    grads.add_or_set(self, s0, d)?;
                }
            }
            Op::View => {
                let d = self.view_grad(node, g, s0)?;
                match d {
                    ViewGrad::Add(d) => grads.add_or_set(self, s0, d)?,
                    ViewGrad::Acc { nb, offset } => grads.acc_or_set(self, s0, g, nb, offset)?,
                }
            }
            Op::Add | Op::Sub => {
                if want(0) {
                    grads.add_or_set(self, s0, g)?;
                }
                if want(1) {
                    let d = if same(self, s0, s1) { g } else { self.repeat_back(g, s1)? };
                    if matches!(t.op, Op::Add) {
                        grads.add_or_set(self, s1, d)?;
                    } else {
                        grads.sub_or_set(self, s1, d)?;
                    }
                }
            }
            Op::Add1 => {
                if want(0) {
                    grads.add_or_set(self, s0, g)?;
                }
                if want(1) {
                    let d = self.sum(g)?;
                    let d = self.reshape_grad(d, s1)?;
                    grads.add_or_set(self, s1, d)?;
                }
            }
            Op::Acc { nb1, nb2, nb3, offset } => {
                if want(0) {
                    grads.add_or_set(self, s0, g)?;
                }
                if want(1) {
                    let ne = self.t(s1).ne;
                    let v = self.view_4d(g, ne, [*nb1, *nb2, *nb3], *offset)?;
                    let d = self.cont(v)?;
                    grads.add_or_set(self, s1, d)?;
                }
            }
            Op::Mul => {
                if want(0) {
                    let d = self.mul(g, s1)?;
                    grads.add_or_set(self, s0, d)?;
                }
                if want(1) {
                    let d = self.mul(s0, g)?;
                    let d = if same(self, s0, s1) { d } else { self.repeat_back(d, s1)? };
                    grads.add_or_set(self, s1, d)?;
                }
            }
            Op::Div => {
                if want(0) {
                    let d = self.div(g, s1)?;
                    grads.add_or_set(self, s0, d)?;
                }
                if want(1) {
                    let q = self.div(node, s1)?;
                    let d = self.mul(g, q)?;
                    let d = if same(self, s0, s1) { d } else { self.repeat_back(d, s1)? };
                    grads.sub_or_set(self, s1, d)?;
                }
            }
            Op::Scale { scale, .. } => {
                let d = self.scale(g, *scale)?;
                grads.add_or_set(self, s0, d)?;
            }
            Op::Sqr => {
                let d = self.mul(s0, g)?;
                let d = self.scale(d, 2.0)?;
                grads.add_or_set(self, s0, d)?;
            }
            Op::Sqrt => {
                let d = self.div(g, node)?;
                let d = self.scale(d, 0.5)?;
                grads.add_or_set(self, s0, d)?;
            }
            Op::Log => {
                let d = self.div(g, s0)?;
                grads.add_or_set(self, s0, d)?;
            }
            Op::Sin => {
                let c = self.cos(s0)?;
                let d = self.mul(g, c)?;
                grads.add_or_set(self, s0, d)?;
            }
            Op::Cos => {
                let sn = self.sin(s0)?;
                let d = self.mul(g, sn)?;
                grads.sub_or_set(self, s0, d)?;
            }
            Op::Sum | Op::SumRows => {
                let ne = self.t(s0).ne;
                let d = self.repeat(g, ne)?;
                grads.add_or_set(self, s0, d)?;
            }
            Op::Mean => {
                let ne = self.t(s0).ne;
                let d = self.scale(g, 1.0 / ne[0] as f32)?;
                let d = self.repeat(d, ne)?;
                grads.add_or_set(self, s0, d)?;
            }
            Op::Gather(super::Gather::Repeat) => {
                let d = self.repeat_back(g, s0)?;
                grads.add_or_set(self, s0, d)?;
            }
            Op::RepeatBack => {
                let ne = self.t(s0).ne;
                let d = self.repeat(g, ne)?;
                grads.add_or_set(self, s0, d)?;
            }
            Op::RmsNorm { eps } => {
                let g = self.contiguous(g)?;
                let d = self.rms_norm_back(g, s0, *eps)?;
                grads.add_or_set(self, s0, d)?;
            }
            Op::MulMat => {
                if want(0) {
                    let d = self.out_prod(s1, g)?;
                    let d = self.mul_mat_broadcast_back(d, s0)?;
                    grads.add_or_set(self, s0, d)?;
                }
                if want(1) {
                    let gt = self.transpose(g)?;
                    let d = self.out_prod(s0, gt)?;
                    grads.add_or_set(self, s1, d)?;
                }
            }
            Op::Set { nb, offset } => {
                let ne1 = self.t(s1).ne;
                let v = self.view_4d(g, ne1, *nb, *offset)?;
                if want(0) {
                    let neg = self.unary(v, UnaryOp::Neg)?;
                    let g = self.contiguous(g)?;
                    let d = self.acc(g, neg, *nb, *offset)?;
                    grads.add_or_set(self, s0, d)?;
                }
                if want(1) {
                    let d = self.cont(v)?;
                    grads.add_or_set(self, s1, d)?;
                }
            }
            Op::GetRows => {
                let g = self.contiguous(g)?;
                let d = self.get_rows_back(g, s1, s0)?;
                grads.add_or_set(self, s0, d)?;
            }
            Op::DiagMaskInf { n_past } | Op::DiagMaskZero { n_past } => {
                let d = self.diag_mask_zero(g, *n_past)?;
                grads.add_or_set(self, s0, d)?;
            }
            Op::SoftMax { scale, max_bias } => {
                if want(1) || want(2) {
                    return Err(unsupported(": no gradient for the mask or the sinks"));
                }
                let g = self.contiguous(g)?;
                let d = self.soft_max_ext_back(g, node, *scale, *max_bias)?;
                grads.add_or_set(self, s0, d)?;
            }
            Op::Rope(p) => {
                if want(2) {
                    return Err(unsupported(": no gradient for the frequency factors"));
                }
                let g = self.contiguous(g)?;
                let d = if p.mode.is_multi() {
                    self.rope_multi_back(g, s1, src[2], p.sections, **p)?
                } else {
                    self.rope_ext_back(g, s1, src[2], **p)?
                };
                grads.add_or_set(self, s0, d)?;
            }
            Op::Im2col { p, is_2d } => {
                let ne = self.t(s1).ne;
                let g = self.contiguous(g)?;
                let d = self.im2col_back(g, s0, ne, p.s0, p.s1, p.p0, p.p1, p.d0, p.d1, *is_2d)?;
                grads.add_or_set(self, s1, d)?;
            }
            Op::Pool2d { op, k, s, p } => {
                let params = super::Pool2dParams::new(*op, k[0], k[1])
                    .stride(s[0], s[1])
                    .padding(p[0], p[1]);
                let g = self.contiguous(g)?;
                let d = self.pool_2d_back(g, s0, params)?;
                grads.add_or_set(self, s0, d)?;
            }
            Op::CrossEntropyLoss => {
                if want(1) {
                    return Err(unsupported(": no gradient for the labels"));
                }
                let d = self.cross_entropy_loss_back(g, s0, s1)?;
                grads.add_or_set(self, s0, d)?;
            }
            Op::Glu { op: GluOp::Swiglu, .. } if src[1].is_some() => {
                if want(0) {
                    let gs = self.mul(g, s1)?;
                    let d = self.silu_back(gs, s0)?;
                    grads.add_or_set(self, s0, d)?;
                }
                if want(1) {
                    let a = self.silu(s0)?;
                    let d = self.mul(a, g)?;
                    grads.add_or_set(self, s1, d)?;
                }
            }
            Op::Unary(u) => self.unary_backward(*u, node, s0, g, grads, &unsupported)?,
            _ => return Err(unsupported("")),
        }
        Ok(())
    }

    fn unary_backward(
        &mut self,
        u: UnaryOp,
        node: TensorId,
        s0: TensorId,
        g: TensorId,
        grads: &mut Grads,
        unsupported: &dyn Fn(&str) -> Error,
    ) -> Result<()> {
        let d = match u {
            UnaryOp::Abs => {
                let sg = self.unary(s0, UnaryOp::Sgn)?;
                self.mul(sg, g)?
            }
            UnaryOp::Neg => return grads.sub_or_set(self, s0, g),
            UnaryOp::Relu => {
                let st = self.unary(s0, UnaryOp::Step)?;
                self.mul(st, g)?
            }
            UnaryOp::Silu => {
                let g = self.contiguous(g)?;
                self.silu_back(g, s0)?
            }
            UnaryOp::Exp => self.mul(node, g)?,
            UnaryOp::Expm1 => {
                let e = self.unary(s0, UnaryOp::Exp)?;
                self.mul(g, e)?
            }
            UnaryOp::Softplus => {
                let sg = self.unary(s0, UnaryOp::Sigmoid)?;
                self.mul(g, sg)?
            }
            // Not in ggml's list; derived from the output: tanh' = 1 - y^2, sigmoid' = y - y^2.
            UnaryOp::Tanh => {
                let y2 = self.sqr(node)?;
                let gy2 = self.mul(g, y2)?;
                self.sub(g, gy2)?
            }
            UnaryOp::Sigmoid => {
                let y2 = self.sqr(node)?;
                let dy = self.sub(node, y2)?;
                self.mul(g, dy)?
            }
            // Sgn and Step are piecewise constant: their sources are ignored (`ignored_src`).
            _ => return Err(unsupported("")),
        };
        grads.add_or_set(self, s0, d)
    }

    /// `g` itself when contiguous, else a contiguous copy (for ops that need packed rows).
    fn contiguous(&mut self, g: TensorId) -> Result<TensorId> {
        if self.t(g).is_contiguous() { Ok(g) } else { self.cont(g) }
    }

    /// `g`'s elements in `like`'s shape (same count, logical order).
    fn reshape_grad(&mut self, g: TensorId, like: TensorId) -> Result<TensorId> {
        let ne = self.t(like).ne;
        if self.t(g).ne == ne {
            return Ok(g);
        }
        let g = self.contiguous(g)?;
        self.reshape(g, &ne)
    }

    /// mul_mat's weight gradient `d` (b's batch shape) summed down to `a`'s batch shape: batch
    /// `i` of b uses batch `i / r` of a (ggml's broadcast), so consecutive groups are summed.
    fn mul_mat_broadcast_back(&mut self, d: TensorId, a: TensorId) -> Result<TensorId> {
        let (td, ta) = (self.t(d).clone(), self.t(a).clone());
        if td.ne == ta.ne {
            return Ok(d);
        }
        let (r2, r3) = (td.ne[2] / ta.ne[2], td.ne[3] / ta.ne[3]);
        if r3 == 1 && td.ne[3] == 1 {
            // [k, m, q * r2] seen as [k, m, q, r2] with batch i2 * r2 + i3, summed over i3.
            let nb = [td.nb[1], td.nb[2] * r2, td.nb[2]];
            let v = self.view_4d(d, [ta.ne[0], ta.ne[1], ta.ne[2], r2], nb, 0)?;
            let v = self.cont(v)?;
            let mut ne = ta.ne;
            ne[3] = 1;
            let s = self.repeat_back_to(v, ne)?;
            return self.reshape(s, &ta.ne);
        }
        if r2 == 1 && ta.ne[2] == 1 {
            // [k, m, 1, r * r3] seen as [k, m, r, r3] the same way.
            let nb = [td.nb[1], td.nb[3] * r3, td.nb[3]];
            let v = self.view_4d(d, [ta.ne[0], ta.ne[1], ta.ne[3], r3], nb, 0)?;
            let v = self.cont(v)?;
            let s = self.repeat_back_to(v, [ta.ne[0], ta.ne[1], ta.ne[3], 1])?;
            return self.reshape(s, &ta.ne);
        }
        Err(Error::arg(format!(
            "build_backward: no gradient for mul_mat's {} broadcast over both dims 2 and 3 of {}",
            ta.describe(a),
            shape_str(&td.ne)
        )))
    }

    /// repeat_back of `a` down to the shape `ne` (each dim dividing `a`'s).
    fn repeat_back_to(&mut self, a: TensorId, ne: [usize; 4]) -> Result<TensorId> {
        let ta = self.t(a);
        if ta.dtype != DType::F32 || (0..4).any(|d| ne[d] == 0 || !ta.ne[d].is_multiple_of(ne[d])) {
            return Err(Error::shape(
                "repeat_back",
                format!("{} is not F32 tiles of {}", ta.describe(a), shape_str(&ne)),
            ));
        }
        self.node(Op::RepeatBack, DType::F32, ne, &[a])
    }

    /// The gradient of a view's source: a permute of `g`, a reshape, or `g` added into zeros at
    /// the view's place.
    fn view_grad(&mut self, view: TensorId, g: TensorId, s: TensorId) -> Result<ViewGrad> {
        let (tv, ts) = (self.t(view).clone(), self.t(s).clone());
        let offs_of = |t: &super::Tensor| if t.view_src.is_some() { t.view_offs } else { 0 };
        let (ov, os) = (offs_of(&tv), offs_of(&ts));
        let full = tv.nelements() == ts.nelements() && ov == os;
        if full && tv.is_contiguous() && ts.is_contiguous() {
            return Ok(ViewGrad::Add(self.reshape_grad(g, s)?));
        }
        if full && let Some(axes) = permutation_of(&ts.ne, &ts.nb, &tv.ne, &tv.nb) {
            // Axis i of s became axis axes[i] of the view: move it back.
            let mut back = [0; 4];
            for i in 0..4 {
                back[axes[i]] = i;
            }
            return Ok(ViewGrad::Add(self.permute(g, back)?));
        }
        if ts.is_contiguous() && tv.nb[0] == tv.dtype.type_size() && ov >= os {
            return Ok(ViewGrad::Acc { nb: [tv.nb[1], tv.nb[2], tv.nb[3]], offset: ov - os });
        }
        Err(Error::arg(format!(
            "build_backward: no gradient for view {} with strides {:?} of {} with strides {:?}: \
             views of non-contiguous tensors need a cont first",
            tv.describe(view),
            tv.nb,
            ts.describe(s),
            ts.nb
        )))
    }
}

/// How a view passes its gradient to its source.
enum ViewGrad {
    /// The source's gradient is this tensor (same shape as the source).
    Add(TensorId),
    /// The view's gradient lands at these strides and byte offset of the source.
    Acc { nb: [usize; 3], offset: usize },
}

/// The axes of a permute that turns layout (ne_s, nb_s) into (ne_v, nb_v): axis i of the source
/// is axis `axes[i]` of the view. Dims of one element may go anywhere.
fn permutation_of(
    ne_s: &[usize; 4],
    nb_s: &[usize; 4],
    ne_v: &[usize; 4],
    nb_v: &[usize; 4],
) -> Option<[usize; 4]> {
    let mut axes = [usize::MAX; 4];
    let mut used = [false; 4];
    // Dims with more than one element must match exactly (size and stride).
    for i in 0..4 {
        if ne_s[i] == 1 {
            continue;
        }
        let j = (0..4).find(|&j| !used[j] && ne_v[j] == ne_s[i] && nb_v[j] == nb_s[i])?;
        axes[i] = j;
        used[j] = true;
    }
    for i in 0..4 {
        if axes[i] == usize::MAX {
            let j = (0..4).find(|&j| !used[j] && ne_v[j] == 1)?;
            axes[i] = j;
            used[j] = true;
        }
    }
    Some(axes)
}

/// Sources whose gradient never matters (ggml's `ignore_src`): im2col's kernel (shape only),
/// cpy's destination, get_rows' ids, rope's positions, and the input of the piecewise constant
/// sgn and step.
fn ignored_src(op: &Op, k: usize) -> bool {
    match op {
        Op::Im2col { .. } | Op::Im2colBack(_) => k == 0,
        Op::Unary(UnaryOp::Sgn | UnaryOp::Step) => k == 0,
        Op::Cpy | Op::GetRows | Op::GetRowsBack | Op::Rope(_) => k == 1,
        _ => false,
    }
}

impl Grads {
    fn check(g: &Graph, src: TensorId, d: TensorId) -> Result<()> {
        if g.t(src).ne != g.t(d).ne {
            return Err(Error::shape(
                "build_backward",
                format!(
                    "gradient {} does not have the shape of {} (internal rule error)",
                    g.t(d).describe(d),
                    g.t(src).describe(src)
                ),
            ));
        }
        Ok(())
    }

    /// ggml_add_or_set: the first gradient of `src` is `d`, later ones are added.
    fn add_or_set(&mut self, g: &mut Graph, src: TensorId, d: TensorId) -> Result<()> {
        Self::check(g, src, d)?;
        let slot = &mut self.0[src.index()];
        *slot = Some(match *slot {
            Some(old) => g.add(old, d)?,
            None => d,
        });
        Ok(())
    }

    /// ggml_sub_or_set: subtracts `d` from the gradient of `src` (or sets it to `-d`).
    fn sub_or_set(&mut self, g: &mut Graph, src: TensorId, d: TensorId) -> Result<()> {
        Self::check(g, src, d)?;
        let slot = &mut self.0[src.index()];
        *slot = Some(match *slot {
            Some(old) => g.sub(old, d)?,
            None => g.unary(d, UnaryOp::Neg)?,
        });
        Ok(())
    }

    /// ggml_acc_or_set: adds `d` into the gradient of `src` at the view with strides `nb` and
    /// byte `offset` (starting from zeros).
    fn acc_or_set(
        &mut self,
        g: &mut Graph,
        src: TensorId,
        d: TensorId,
        nb: [usize; 3],
        offset: usize,
    ) -> Result<()> {
        let d = g.contiguous(d)?;
        let slot = &mut self.0[src.index()];
        let base = match *slot {
            Some(old) => g.contiguous(old)?,
            None => g.fill(src, 0.0)?,
        };
        *slot = Some(g.acc(base, d, nb, offset)?);
        Ok(())
    }
}
