//! Training builders: the cross-entropy loss and its gradient, the AdamW and SGD
//! optimizer steps (in-place updates of `State` tensors), and ggml's dedicated backward ops:
//! silu_back, rms_norm_back, soft_max_ext_back, rope_ext_back / rope_multi_back, get_rows_back,
//! im2col_back, pool_2d_back and flash_attn_back. Shapes, parameter order and layouts are ggml's
//! (src/ggml.c at d99724f); what ggml only asserts, or does not check, is refused here with `Err`.

use super::{Graph, Leaf, MAX_SRC, Op, RopeParams, Tensor, TensorId, shape_str};
use crate::dtype::DType;
use crate::error::{Error, Result};

pub use super::vision::PoolOp;

/// Parameters of an im2col_back node (ggml's op_params `s0, s1, p0, p1, d0, d1, is_2D`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Im2colBackParams {
    /// Stride along width.
    pub s0: usize,
    /// Stride along height (2-D only).
    pub s1: usize,
    /// Padding along width.
    pub p0: usize,
    /// Padding along height (2-D only).
    pub p1: usize,
    /// Dilation along width.
    pub d0: usize,
    /// Dilation along height (2-D only).
    pub d1: usize,
    /// 2-D (image [IW, IH, IC, N]) or 1-D (signal [IW, IC, N]).
    pub is_2d: bool,
}

/// Parameters of [`Graph::pool_2d`] and [`Graph::pool_2d_back`] (ggml's op_params `op, k0, k1,
/// s0, s1, p0, p1`). Paddings are floats as in ggml: they set the output size, and the window
/// offsets use their integer part.
///
/// ```
/// use quantgraph::{PoolOp, Pool2dParams};
/// let p = Pool2dParams::new(PoolOp::Avg, 3, 3).stride(2, 2).padding(1.0, 1.0);
/// assert_eq!((p.k0, p.s1, p.p0), (3, 2, 1.0));
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct Pool2dParams {
    /// Pooling function.
    pub op: PoolOp,
    /// Window width.
    pub k0: usize,
    /// Window height.
    pub k1: usize,
    /// Stride along width.
    pub s0: usize,
    /// Stride along height.
    pub s1: usize,
    /// Padding along width (0 ..= 1e6).
    pub p0: f32,
    /// Padding along height (0 ..= 1e6).
    pub p1: f32,
}

impl Pool2dParams {
    /// `k0 x k1` windows moved by their own size (ggml's usual pooling), no padding.
    pub fn new(op: PoolOp, k0: usize, k1: usize) -> Pool2dParams {
        Pool2dParams { op, k0, k1, s0: k0, s1: k1, p0: 0.0, p1: 0.0 }
    }

    /// The strides along width and height.
    pub fn stride(mut self, s0: usize, s1: usize) -> Pool2dParams {
        (self.s0, self.s1) = (s0, s1);
        self
    }

    /// The paddings along width and height.
    pub fn padding(mut self, p0: f32, p1: f32) -> Pool2dParams {
        (self.p0, self.p1) = (p0, p1);
        self
    }
}

/// Byte offsets of the three gradients inside the packed result of [`Graph::flash_attn_back`]
/// (ggml's layout: each block padded to 16 bytes, `GGML_MEM_ALIGN`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FlashAttnBackLayout {
    /// Offset of d/dq (q's shape, contiguous): always 0.
    pub offs_q: usize,
    /// Offset of d/dk (k's shape, contiguous).
    pub offs_k: usize,
    /// Offset of d/dv (v's shape, contiguous).
    pub offs_v: usize,
    /// Elements of the packed F32 result.
    pub n_elements: usize,
}

impl FlashAttnBackLayout {
    /// The layout for q, k and v with these element counts.
    pub fn new(elem_q: usize, elem_k: usize, elem_v: usize) -> Result<FlashAttnBackLayout> {
        let pad = |n: usize| -> Result<usize> {
            n.checked_mul(4)
                .and_then(|b| b.checked_next_multiple_of(16))
                .ok_or(Error::Overflow { what: "flash_attn_back result size" })
        };
        let offs_k = pad(elem_q)?;
        let offs_v = offs_k
            .checked_add(pad(elem_k)?)
            .ok_or(Error::Overflow { what: "flash_attn_back result size" })?;
        let end = offs_v
            .checked_add(pad(elem_v)?)
            .ok_or(Error::Overflow { what: "flash_attn_back result size" })?;
        Ok(FlashAttnBackLayout { offs_q: 0, offs_k, offs_v, n_elements: end / 4 })
    }
}

/// ggml_calc_conv_output_size, in checked signed arithmetic (C's truncating division); 0 when
/// the parameters are too large to mean anything.
fn conv_out(ins: usize, ks: usize, s: usize, p: usize, d: usize) -> i64 {
    let (ins, ks, s, p, d) = (ins as i128, ks as i128, s as i128, p as i128, d as i128);
    let num = d.checked_mul(ks - 1).and_then(|dk| (ins + 2 * p).checked_sub(dk + 1));
    match num {
        Some(num) if s > 0 => i64::try_from(num / s + 1).unwrap_or(0),
        _ => 0,
    }
}

/// ggml_calc_pool_output_size with its float padding.
fn pool_out(ins: usize, ks: usize, s: usize, p: f32) -> i64 {
    ((ins as f32 + 2.0 * p - ks as f32) / s as f32) as i64 + 1
}

impl Graph {
    fn check_f32(&self, op: &'static str, what: &str, id: TensorId) -> Result<()> {
        let t = self.get(op, id)?;
        if t.dtype != DType::F32 {
            return Err(Error::ty(op, format!("{what} {} must be F32", t.describe(id))));
        }
        Ok(())
    }

    fn check_same_shape(
        &self,
        op: &'static str,
        a: TensorId,
        b: TensorId,
        what: &str,
    ) -> Result<()> {
        let (ta, tb) = (self.get(op, a)?, self.get(op, b)?);
        if ta.ne != tb.ne {
            return Err(Error::shape(
                op,
                format!("{what}: {} and {} differ in shape", ta.describe(a), tb.describe(b)),
            ));
        }
        Ok(())
    }

    fn check_contiguous(&self, op: &'static str, what: &str, id: TensorId) -> Result<()> {
        let t = self.get(op, id)?;
        if !t.is_contiguous() {
            return Err(Error::shape(op, format!("{what} {} must be contiguous", t.describe(id))));
        }
        Ok(())
    }

    fn check_rows(&self, op: &'static str, what: &str, id: TensorId) -> Result<()> {
        let t = self.get(op, id)?;
        if !t.rows_contiguous() {
            return Err(Error::shape(
                op,
                format!("rows of {what} {} are not contiguous", t.describe(id)),
            ));
        }
        Ok(())
    }

    /// ggml_cross_entropy_loss: `-1/nrows * sum(labels * log_softmax(logits))` over rows, as an
    /// F32 scalar of shape `[1]`. `a` (logits) and `b` (labels, rows usually summing to 1) are
    /// F32 with the same shape and contiguous rows. The sum runs in a fixed row order, so the
    /// result does not depend on the thread count.
    pub fn cross_entropy_loss(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        const OP: &str = "cross_entropy_loss";
        self.check_f32(OP, "logits", a)?;
        self.check_f32(OP, "labels", b)?;
        self.check_same_shape(OP, a, b, "logits and labels")?;
        self.check_rows(OP, "logits", a)?;
        self.check_rows(OP, "labels", b)?;
        self.node(Op::CrossEntropyLoss, DType::F32, [1, 1, 1, 1], &[a, b])
    }

    /// ggml_cross_entropy_loss_back: the gradient of [`Graph::cross_entropy_loss`] with respect to
    /// the logits, `(softmax(b) - c) * a / nrows`. `a` is the F32 scalar gradient of the loss,
    /// `b` the logits and `c` the labels (F32, same shape, contiguous). The result has `b`'s shape.
    pub fn cross_entropy_loss_back(
        &mut self,
        a: TensorId,
        b: TensorId,
        c: TensorId,
    ) -> Result<TensorId> {
        const OP: &str = "cross_entropy_loss_back";
        for (what, id) in [("grad", a), ("logits", b), ("labels", c)] {
            self.check_f32(OP, what, id)?;
            self.check_contiguous(OP, what, id)?;
        }
        let ta = self.get(OP, a)?;
        if ta.nelements() != 1 {
            return Err(Error::shape(OP, format!("grad {} must be a scalar", ta.describe(a))));
        }
        self.check_same_shape(OP, b, c, "logits and labels")?;
        let ne = self.t(b).ne;
        self.node(Op::CrossEntropyLossBack, DType::F32, ne, &[a, b, c])
    }

    /// The caller buffer and byte range of a tensor stored in a `State` leaf (or a view of one).
    fn state_range(&self, id: TensorId) -> Option<(crate::buffer::Buffer, usize, usize)> {
        let t = self.t(id);
        let root = self.root(id);
        match &self.t(root).leaf {
            Leaf::State { buffer, offset } => {
                let start = offset + if t.view_src.is_some() { t.view_offs } else { 0 };
                Some((buffer.clone(), start, start + t.nbytes()))
            }
            _ => None,
        }
    }

    /// Checks the sources of an optimizer step: `written` must live in `State` buffers and no
    /// source may share bytes with a written tensor (workers update rows in place).
    fn check_opt_sources(
        &self,
        op: &'static str,
        written: &[(&str, TensorId)],
        read: &[(&str, TensorId)],
    ) -> Result<()> {
        let mut ranges = Vec::new();
        for &(what, id) in written {
            super::check_no_self_overlap(op, self.t(id), id)?;
            match self.state_range(id) {
                Some(r) => ranges.push((what, id, r)),
                None => {
                    return Err(Error::arg(format!(
                        "{op}: {what} {} is updated in place and must be a state tensor (Graph::state)",
                        self.t(id).describe(id)
                    )));
                }
            }
        }
        for (i, (wa, ia, (ba, sa, ea))) in ranges.iter().enumerate() {
            let others = ranges[i + 1..]
                .iter()
                .map(|(w, id, r)| (*w, *id, Some(r.clone())))
                .chain(read.iter().map(|&(w, id)| (w, id, self.state_range(id))));
            for (wb, ib, rb) in others {
                if let Some((bb, sb, eb)) = rb
                    && ba.same(&bb)
                    && *sa < eb
                    && sb < *ea
                {
                    return Err(Error::arg(format!(
                        "{op}: {wa} {} and {wb} {} overlap in buffer '{}'",
                        self.t(*ia).describe(*ia),
                        self.t(ib).describe(ib),
                        ba.name()
                    )));
                }
            }
        }
        Ok(())
    }

    /// A node that updates `a` in place: its result is a view of `a`'s memory.
    fn inplace_node(&mut self, op: Op, a: TensorId, srcs: &[TensorId]) -> Result<TensorId> {
        let ta = self.t(a);
        let (dtype, ne, nb) = (ta.dtype, ta.ne, ta.nb);
        let root = self.root(a);
        let offs = if ta.view_src.is_some() { ta.view_offs } else { 0 };
        let mut src = [None; MAX_SRC];
        for (s, &id) in src.iter_mut().zip(srcs) {
            *s = Some(id);
        }
        self.push(Tensor {
            dtype,
            ne,
            nb,
            op,
            src,
            view_src: Some(root),
            view_offs: offs,
            leaf: Leaf::None,
            name: None,
            output: false,
        })
    }

    /// ggml_opt_step_adamw: one AdamW step on the parameters `a`, updating `a` and the moments `m`
    /// and `v` in place (all three `State` tensors, F32, same shape, contiguous rows, not
    /// overlapping). `grad` is the gradient (same shape); `adamw_params` is an F32 tensor of 7
    /// values: alpha, beta1, beta2, eps, wd, beta1h, beta2h, where `beta1h = 1/(1 - beta1^t)` and
    /// `beta2h = 1/(1 - beta2^t)` for step t, as ggml-opt computes them. Per element:
    /// `m = m*beta1 + g*(1-beta1)`, `v = v*beta2 + g^2*(1-beta2)`,
    /// `a = a*(1 - alpha*wd) - alpha * (m*beta1h) / (sqrt(v*beta2h) + eps)`.
    /// The result is a view of `a`; the plan always runs it (it writes state).
    pub fn opt_step_adamw(
        &mut self,
        a: TensorId,
        grad: TensorId,
        m: TensorId,
        v: TensorId,
        adamw_params: TensorId,
    ) -> Result<TensorId> {
        const OP: &str = "opt_step_adamw";
        for (what, id) in [("params", a), ("grad", grad), ("m", m), ("v", v)] {
            self.check_f32(OP, what, id)?;
            self.check_rows(OP, what, id)?;
        }
        self.check_same_shape(OP, a, grad, "params and grad")?;
        self.check_same_shape(OP, a, m, "params and m")?;
        self.check_same_shape(OP, a, v, "params and v")?;
        self.check_f32(OP, "adamw_params", adamw_params)?;
        self.check_contiguous(OP, "adamw_params", adamw_params)?;
        let tp = self.t(adamw_params);
        if tp.nelements() != 7 {
            return Err(Error::shape(
                OP,
                format!("adamw_params {} must hold 7 values", tp.describe(adamw_params)),
            ));
        }
        self.check_opt_sources(
            OP,
            &[("params", a), ("m", m), ("v", v)],
            &[("grad", grad), ("adamw_params", adamw_params)],
        )?;
        self.inplace_node(Op::OptStepAdamw, a, &[a, grad, m, v, adamw_params])
    }

    /// ggml_opt_step_sgd: `a = a*(1 - alpha*wd) - alpha*grad` in place on the `State` tensor `a`
    /// (F32, contiguous rows); `sgd_params` is an F32 tensor of 2 values: alpha, wd. The result is
    /// a view of `a`; the plan always runs it (it writes state).
    pub fn opt_step_sgd(
        &mut self,
        a: TensorId,
        grad: TensorId,
        sgd_params: TensorId,
    ) -> Result<TensorId> {
        const OP: &str = "opt_step_sgd";
        for (what, id) in [("params", a), ("grad", grad)] {
            self.check_f32(OP, what, id)?;
            self.check_rows(OP, what, id)?;
        }
        self.check_same_shape(OP, a, grad, "params and grad")?;
        self.check_f32(OP, "sgd_params", sgd_params)?;
        self.check_contiguous(OP, "sgd_params", sgd_params)?;
        let tp = self.t(sgd_params);
        if tp.nelements() != 2 {
            return Err(Error::shape(
                OP,
                format!("sgd_params {} must hold 2 values", tp.describe(sgd_params)),
            ));
        }
        self.check_opt_sources(
            OP,
            &[("params", a)],
            &[("grad", grad), ("sgd_params", sgd_params)],
        )?;
        self.inplace_node(Op::OptStepSgd, a, &[a, grad, sgd_params])
    }

    /// ggml_silu_back: the gradient of silu, `a * s * (1 + b*(1 - s))` with `s = sigmoid(b)`,
    /// where `a` is the gradient of silu's output and `b` silu's input. Both F32 or both F16,
    /// same shape, contiguous rows; the result has `a`'s type and shape.
    pub fn silu_back(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        const OP: &str = "silu_back";
        let (ta, tb) = (self.get(OP, a)?, self.get(OP, b)?);
        if !matches!(ta.dtype, DType::F32 | DType::F16) || ta.dtype != tb.dtype {
            return Err(Error::ty(
                OP,
                format!("{} and {}: both must be F32 or both F16", ta.describe(a), tb.describe(b)),
            ));
        }
        self.check_same_shape(OP, a, b, "grad and x")?;
        self.check_rows(OP, "grad", a)?;
        self.check_rows(OP, "x", b)?;
        let (dt, ne) = (ta.dtype, ta.ne);
        self.node(Op::SiluBack, dt, ne, &[a, b])
    }

    /// ggml_rms_norm_back: the gradient of `rms_norm(b, eps)` given the gradient `a` of its
    /// output: `(a - b * sum(b*a) / (sum(b*b) + eps*n)) / sqrt(mean(b*b) + eps)` per row. F32,
    /// same shape, contiguous rows.
    pub fn rms_norm_back(&mut self, a: TensorId, b: TensorId, eps: f32) -> Result<TensorId> {
        const OP: &str = "rms_norm_back";
        if !(eps >= 0.0 && eps.is_finite()) {
            return Err(Error::param(OP, format!("eps = {eps} must be finite and >= 0")));
        }
        self.check_f32(OP, "grad", a)?;
        self.check_f32(OP, "x", b)?;
        self.check_same_shape(OP, a, b, "grad and x")?;
        self.check_rows(OP, "grad", a)?;
        self.check_rows(OP, "x", b)?;
        let ne = self.t(a).ne;
        self.node(Op::RmsNormBack { eps }, DType::F32, ne, &[a, b])
    }

    /// ggml_soft_max_ext_back: the gradient of `soft_max_ext(x, mask, scale, max_bias)` given the
    /// gradient `a` of its output and the output `b` itself: `scale * b * (a - dot(b, a))` per
    /// row. F32, same shape, contiguous. ggml's CPU backend only implements `max_bias == 0`; other
    /// values are refused.
    pub fn soft_max_ext_back(
        &mut self,
        a: TensorId,
        b: TensorId,
        scale: f32,
        max_bias: f32,
    ) -> Result<TensorId> {
        const OP: &str = "soft_max_back";
        if !scale.is_finite() {
            return Err(Error::param(OP, format!("scale = {scale} is not finite")));
        }
        if max_bias != 0.0 {
            return Err(Error::param(
                OP,
                format!("max_bias = {max_bias}: only 0 is supported (as in ggml's CPU backend)"),
            ));
        }
        self.check_f32(OP, "grad", a)?;
        self.check_f32(OP, "y", b)?;
        self.check_same_shape(OP, a, b, "grad and y")?;
        self.check_contiguous(OP, "grad", a)?;
        self.check_contiguous(OP, "y", b)?;
        let ne = self.t(a).ne;
        self.node(Op::SoftMaxBack { scale, max_bias }, DType::F32, ne, &[a, b])
    }

    /// ggml_rope_ext_back: the gradient of [`Graph::rope_ext`], a rotation of `a` (the gradient
    /// of rope's output) by `-theta`. Same arguments, checks and result shape as `rope_ext`.
    pub fn rope_ext_back(
        &mut self,
        a: TensorId,
        pos: TensorId,
        freq_factors: Option<TensorId>,
        p: RopeParams,
    ) -> Result<TensorId> {
        let id = self.rope_ext(a, pos, freq_factors, p)?;
        self.tensors[id.index()].op = Op::RopeBack(Box::new(p));
        Ok(id)
    }

    /// ggml_rope_multi_back: the gradient of [`Graph::rope_multi`] (rotation by `-theta`).
    pub fn rope_multi_back(
        &mut self,
        a: TensorId,
        pos: TensorId,
        freq_factors: Option<TensorId>,
        sections: [i32; 4],
        p: RopeParams,
    ) -> Result<TensorId> {
        let id = self.rope_multi(a, pos, freq_factors, sections, p)?;
        let op = match &self.tensors[id.index()].op {
            Op::Rope(q) => Op::RopeBack(q.clone()),
            _ => return Err(Error::arg("rope_multi_back: rope_multi built no rope node")),
        };
        self.tensors[id.index()].op = op;
        Ok(id)
    }

    /// ggml_get_rows_back: the gradient of `get_rows(c, b)`: rows of `a` ([n, k], F32 or F16)
    /// summed into the rows `b` (I32 vector of k ids) of an F32 result shaped like `c` ([n, m],
    /// used only for its shape). Out-of-range ids make compute return `Err`.
    pub fn get_rows_back(&mut self, a: TensorId, b: TensorId, c: TensorId) -> Result<TensorId> {
        const OP: &str = "get_rows_back";
        let (ta, tb, tc) = (self.get(OP, a)?, self.get(OP, b)?, self.get(OP, c)?);
        if !matches!(ta.dtype, DType::F32 | DType::F16) {
            return Err(Error::ty(OP, format!("grad {} must be F32 or F16", ta.describe(a))));
        }
        if tb.dtype != DType::I32 {
            return Err(Error::ty(OP, format!("ids {} must be I32", tb.describe(b))));
        }
        let matrix = |t: &Tensor| t.ne[2] == 1 && t.ne[3] == 1;
        if !matrix(ta)
            || !matrix(tc)
            || tb.ne[1..] != [1, 1, 1]
            || ta.ne[0] != tc.ne[0]
            || ta.ne[1] != tb.ne[0]
        {
            return Err(Error::shape(
                OP,
                format!(
                    "grad {}, ids {}, like {}: need matrices with equal ne[0], a vector of ids and one id per grad row",
                    ta.describe(a),
                    tb.describe(b),
                    tc.describe(c)
                ),
            ));
        }
        if !ta.rows_contiguous() || !tb.is_contiguous() {
            return Err(Error::shape(OP, "grad rows and ids must be contiguous"));
        }
        let ne = [tc.ne[0], tc.ne[1], 1, 1];
        self.node(Op::GetRowsBack, DType::F32, ne, &[a, b])
    }

    /// ggml_im2col_back: the gradient of `im2col(b, x, ...)` with respect to the input `x` of
    /// shape `ne` ([IW, IH, IC, N] in 2-D, [IW, IC, N, 1] in 1-D), given the gradient `a` (F32,
    /// contiguous) of im2col's output ([IC*KH*KW, OW, OH, N] or [IC*KW, OW, N, 1]). `b` is the
    /// kernel ([KW, KH, IC, OC] or [KW, IC, OC], F32 or F16), used only for its shape. The result
    /// is F32 of shape `ne`.
    #[allow(clippy::too_many_arguments)]
    pub fn im2col_back(
        &mut self,
        a: TensorId,
        b: TensorId,
        ne: [usize; 4],
        s0: usize,
        s1: usize,
        p0: usize,
        p1: usize,
        d0: usize,
        d1: usize,
        is_2d: bool,
    ) -> Result<TensorId> {
        const OP: &str = "im2col_back";
        let (ta, tb) = (self.get(OP, a)?, self.get(OP, b)?);
        if ta.dtype != DType::F32 || !matches!(tb.dtype, DType::F32 | DType::F16) {
            return Err(Error::ty(
                OP,
                format!(
                    "grad {} must be F32 and kernel {} F32 or F16",
                    ta.describe(a),
                    tb.describe(b)
                ),
            ));
        }
        if !ta.is_contiguous() {
            return Err(Error::shape(OP, format!("grad {} must be contiguous", ta.describe(a))));
        }
        if s0 == 0 || d0 == 0 || (is_2d && (s1 == 0 || d1 == 0)) {
            return Err(Error::param(
                OP,
                format!("strides ({s0}, {s1}) and dilations ({d0}, {d1}) must be > 0"),
            ));
        }
        let (iw, ih, ic, n) =
            if is_2d { (ne[0], ne[1], ne[2], ne[3]) } else { (ne[0], 1, ne[1], ne[2]) };
        let (kw, kh) = if is_2d { (tb.ne[0], tb.ne[1]) } else { (tb.ne[0], 1) };
        let kernel_ic = if is_2d { tb.ne[2] } else { tb.ne[1] };
        let ow = conv_out(iw, kw, s0, p0, d0);
        let oh = if is_2d { conv_out(ih, kh, s1, p1, d1) } else { 1 };
        let cols = ic.checked_mul(kh).and_then(|v| v.checked_mul(kw)).unwrap_or(0);
        let want = if is_2d {
            [cols, ow.max(0) as usize, oh.max(0) as usize, n]
        } else {
            [cols, ow.max(0) as usize, n, 1]
        };
        if (!is_2d && ne[3] != 1)
            || kernel_ic != ic
            || cols == 0
            || ow <= 0
            || oh <= 0
            || ta.ne != want
        {
            return Err(Error::shape(
                OP,
                format!(
                    "grad {}, kernel {}, input shape {}, {}: the grad must be im2col's output shape {} (output size {ow} x {oh}) and the kernel must have {ic} channels",
                    ta.describe(a),
                    tb.describe(b),
                    shape_str(&ne),
                    if is_2d { "2-D" } else { "1-D" },
                    shape_str(&want)
                ),
            ));
        }
        let p = Im2colBackParams { s0, s1, p0, p1, d0, d1, is_2d };
        self.node(Op::Im2colBack(p), DType::F32, ne, &[a, b])
    }

    /// ggml_pool_2d_back: the gradient of `pool_2d(af, p)` with respect
    /// to its input `af` ([IW, IH, C, N], F32 or F16), given the gradient `a` (F32, contiguous)
    /// of its output. Max pooling routes each gradient to the first largest element of its
    /// window; average pooling spreads it over the window (padding included). Paddings are
    /// truncated to integers for the window offsets, as ggml does. The result is F32 shaped like
    /// `af`.
    pub fn pool_2d_back(&mut self, a: TensorId, af: TensorId, p: Pool2dParams) -> Result<TensorId> {
        const OP: &str = "pool_2d_back";
        let Pool2dParams { k0, k1, s0, s1, p0, p1, .. } = p;
        let (ta, tf) = (self.get(OP, a)?, self.get(OP, af)?);
        if ta.dtype != DType::F32 || !matches!(tf.dtype, DType::F32 | DType::F16) {
            return Err(Error::ty(
                OP,
                format!(
                    "grad {} must be F32 and input {} F32 or F16",
                    ta.describe(a),
                    tf.describe(af)
                ),
            ));
        }
        if !ta.is_contiguous() || !tf.rows_contiguous() {
            return Err(Error::shape(
                OP,
                format!(
                    "grad {} must be contiguous and input {} have contiguous rows",
                    ta.describe(a),
                    tf.describe(af)
                ),
            ));
        }
        if k0 == 0
            || k1 == 0
            || s0 == 0
            || s1 == 0
            || k0 > i32::MAX as usize
            || k1 > i32::MAX as usize
        {
            return Err(Error::param(
                OP,
                format!("kernel ({k0}, {k1}) and stride ({s0}, {s1}) must be > 0"),
            ));
        }
        if !(p0.is_finite() && p1.is_finite() && p0 >= 0.0 && p1 >= 0.0 && p0 < 1e9 && p1 < 1e9) {
            return Err(Error::param(OP, format!("padding ({p0}, {p1}) must be finite and >= 0")));
        }
        let ow = pool_out(tf.ne[0], k0, s0, p0);
        let oh = pool_out(tf.ne[1], k1, s1, p1);
        if ow <= 0 || oh <= 0 || ta.ne != [ow as usize, oh as usize, tf.ne[2], tf.ne[3]] {
            return Err(Error::shape(
                OP,
                format!(
                    "grad {} must be pool_2d's output shape [{ow}, {oh}, {}, {}] for input {}",
                    ta.describe(a),
                    tf.ne[2],
                    tf.ne[3],
                    tf.describe(af)
                ),
            ));
        }
        let ne = tf.ne;
        self.node(Op::Pool2dBack(p), DType::F32, ne, &[a, af])
    }

    /// ggml_flash_attn_back with the semantics of ggml's CPU kernel: the gradients of the
    /// (pre-`flash_attn_ext`) attention `out[:, i] = sum_j softmax_j(k_j . q_i / sqrt(D)) v[j, :]`
    /// with `q` [D, N, H, B], `k` [D, M, Hkv, B], `v` [M, D, Hkv, B] (transposed: one row per
    /// dim), `d` [D, N, H, B] the gradient of the output, H a multiple of Hkv, M >= N. With
    /// `masked`, query i sees keys `j <= M - N + i`. All F32 with contiguous rows.
    ///
    /// The result is one F32 vector holding d/dq, d/dk and d/dv, each contiguous in its tensor's
    /// shape, at the offsets of [`FlashAttnBackLayout`] (ggml's packing). ggml's own builder
    /// aborts at this commit ("TODO: adapt to ggml_flash_attn_ext() changes"); its CPU kernel is
    /// the definition used here.
    pub fn flash_attn_back(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        d: TensorId,
        masked: bool,
    ) -> Result<TensorId> {
        const OP: &str = "flash_attn_back";
        for (what, id) in [("q", q), ("k", k), ("v", v), ("d", d)] {
            self.check_f32(OP, what, id)?;
            self.check_rows(OP, what, id)?;
        }
        let (tq, tk, tv, td) = (self.t(q), self.t(k), self.t(v), self.t(d));
        let (dd, n, m, h, hkv, bt) = (tq.ne[0], tq.ne[1], tk.ne[1], tq.ne[2], tk.ne[2], tq.ne[3]);
        if tk.ne[0] != dd
            || tv.ne != [m, dd, hkv, bt]
            || tk.ne[3] != bt
            || td.ne != tq.ne
            || hkv == 0
            || h % hkv != 0
            || m < n
        {
            return Err(Error::shape(
                OP,
                format!(
                    "q {}, k {}, v {}, d {}: need k [D, M, Hkv, B], v [M, D, Hkv, B], d like q, H a multiple of Hkv and M >= N",
                    tq.describe(q),
                    tk.describe(k),
                    tv.describe(v),
                    td.describe(d)
                ),
            ));
        }
        let lay = FlashAttnBackLayout::new(tq.nelements(), tk.nelements(), tv.nelements())?;
        let op = Op::FlashAttnBack { masked };
        self.node(op, DType::F32, [lay.n_elements, 1, 1, 1], &[q, k, v, d])
    }
}
