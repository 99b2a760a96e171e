//! Builders for the elementwise, GLU, normalisation, reduction and sorting ops (ggml's ggml.c
//! rules): every method checks types, shapes and parameters and returns `Err` naming the op, the
//! tensors and the values at fault. `*_inplace` variants return a view of `a` (ggml's
//! `ggml_view_tensor`) whose memory the op overwrites.

use super::{Graph, Leaf, MAX_DIMS, MAX_SRC, Op, Tensor, TensorId, UnaryOp, shape_str};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Gated linear units (ggml's `GGML_GLU_OP_*`): `act(x) * g`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GluOp {
    /// relu(x) * g
    Reglu,
    /// gelu(x) * g (ggml's f16 GELU table)
    Geglu,
    /// silu(x) * g
    Swiglu,
    /// OpenAI's clamped SwiGLU: x' = min(x, limit), g' = clamp(g, -limit, limit),
    /// x' * sigmoid(alpha x') * (g' + 1).
    SwigluOai,
    /// gelu_erf(x) * g
    GegluErf,
    /// gelu_quick(x) * g (ggml's f16 quick-GELU table)
    GegluQuick,
    /// Clamped SwiGLU: x' = min(x, limit), g' = clamp(g, -limit, limit), silu(x') * g'
    /// (ggml's `GGML_GLU_OP_SWIGLU_CLAMP`).
    SwigluClamp,
}

impl GluOp {
    /// ggml's name (`ggml_glu_op_name`).
    pub fn name(self) -> &'static str {
        match self {
            GluOp::Reglu => "reglu",
            GluOp::Geglu => "geglu",
            GluOp::Swiglu => "swiglu",
            GluOp::SwigluOai => "swiglu_oai",
            GluOp::GegluErf => "geglu_erf",
            GluOp::GegluQuick => "geglu_quick",
            GluOp::SwigluClamp => "swiglu_clamp",
        }
    }
}

/// Which triangle `tri` keeps (ggml's `ggml_tri_type`); element (column i0, row i1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TriType {
    /// i0 >= i1
    UpperDiag,
    /// i0 > i1
    Upper,
    /// i0 <= i1
    LowerDiag,
    /// i0 < i1
    Lower,
}

impl TriType {
    /// True when element (column `i0`, row `i1`) is kept.
    #[inline(always)]
    pub fn keeps(self, i0: usize, i1: usize) -> bool {
        match self {
            TriType::UpperDiag => i0 >= i1,
            TriType::Upper => i0 > i1,
            TriType::LowerDiag => i0 <= i1,
            TriType::Lower => i0 < i1,
        }
    }
}

/// Sort order of `argsort` (ggml's `ggml_sort_order`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SortOrder {
    /// Smallest first.
    Asc,
    /// Largest first.
    Desc,
}

fn is_float(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16)
}

/// The types of ggml's unary-ops.cpp and binary-ops.cpp kernels: F32, F16 and BF16.
fn is_float_or_bf16(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::BF16)
}

/// A block-quantized type whose rows `add` and `add1` can read (dequantize) and write back
/// (ggml's CPU `from_float`, or the reference quantizer where it needs no importance matrix).
pub(crate) fn quant_rows_rewritable(d: DType) -> bool {
    let f = crate::quant::format(d);
    d.is_quantized()
        && f.dequantize.is_some()
        && !f.requires_imatrix
        && (f.from_float.is_some() || f.quantize.is_some())
}

fn can_repeat(b: &[usize; MAX_DIMS], a: &[usize; MAX_DIMS]) -> bool {
    (0..MAX_DIMS).all(|i| b[i] != 0 && a[i].is_multiple_of(b[i]))
}

/// ggml's `ggml_compute_softplus_f32`, used when `xielu` stores its parameters.
fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { (1.0 + x.exp()).ln() }
}

fn check_eps(op: &'static str, eps: f32) -> Result<()> {
    if eps >= 0.0 && eps.is_finite() {
        Ok(())
    } else {
        Err(Error::param(op, format!("eps = {eps} must be finite and >= 0")))
    }
}

impl Graph {
    /// A node with a fresh contiguous result, or (`inplace`) a view of `srcs[0]` that the op
    /// overwrites, as ggml's `*_inplace` builders do.
    fn finish(
        &mut self,
        op: Op,
        dtype: DType,
        ne: [usize; MAX_DIMS],
        srcs: &[TensorId],
        inplace: bool,
    ) -> Result<TensorId> {
        if !inplace {
            return self.node(op, dtype, ne, srcs);
        }
        let a = srcs[0];
        let ta = self.t(a);
        debug_assert!(ta.dtype == dtype && ta.ne == ne);
        let root = self.root(a);
        if matches!(self.t(root).leaf, Leaf::Weight { .. }) {
            return Err(Error::Buffer(format!(
                "{}: in-place destination {} is a read-only weight",
                op.name(),
                ta.describe(a)
            )));
        }
        super::check_no_self_overlap(op.name(), ta, a)?;
        // Other sources must not share bytes with `a`, except a source that is exactly `a` for
        // an elementwise op on plain elements (each element read and written by one worker).
        let elementwise =
            matches!(op, Op::Add | Op::Sub | Op::Mul | Op::Div) && !dtype.is_quantized();
        for &s in &srcs[1..] {
            if !(elementwise && self.same_layout(a, s)) {
                self.check_apart(op.name(), a, s, "source")?;
            }
        }
        let ta = self.t(a);
        let (nb, offs) = (ta.nb, if ta.view_src.is_some() { ta.view_offs } else { 0 });
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

    /// Checks an F32/F16 source of an elementwise op and returns (dtype, ne).
    fn float_src(&self, op: &'static str, a: TensorId) -> Result<(DType, [usize; MAX_DIMS])> {
        let ta = self.get(op, a)?;
        if !is_float(ta.dtype) {
            return Err(Error::ty(op, format!("{} (this op takes F32 or F16)", ta.describe(a))));
        }
        Ok((ta.dtype, ta.ne))
    }

    /// Checks an F32/F16/BF16 source of a unary-ops.cpp op and returns (dtype, ne).
    fn float_or_bf16_src(
        &self,
        op: &'static str,
        a: TensorId,
    ) -> Result<(DType, [usize; MAX_DIMS])> {
        let ta = self.get(op, a)?;
        if !is_float_or_bf16(ta.dtype) {
            return Err(Error::ty(
                op,
                format!("{} (this op takes F32, F16 or BF16)", ta.describe(a)),
            ));
        }
        Ok((ta.dtype, ta.ne))
    }

    fn f32_src(&self, op: &'static str, a: TensorId) -> Result<[usize; MAX_DIMS]> {
        let ta = self.get(op, a)?;
        if ta.dtype != DType::F32 {
            return Err(Error::ty(op, format!("{} (this op takes F32)", ta.describe(a))));
        }
        Ok(ta.ne)
    }

    fn rows_contiguous_src(&self, op: &'static str, a: TensorId) -> Result<()> {
        let ta = self.get(op, a)?;
        if ta.rows_contiguous() {
            Ok(())
        } else {
            Err(Error::shape(op, format!("rows of {} are not contiguous", ta.describe(a))))
        }
    }

    fn contiguous_src(&self, op: &'static str, a: TensorId) -> Result<()> {
        let ta = self.get(op, a)?;
        if ta.is_contiguous() {
            Ok(())
        } else {
            Err(Error::shape(op, format!("{} is not contiguous; use cont first", ta.describe(a))))
        }
    }

    // ---- unary -------------------------------------------------------------------------------

    pub(crate) fn unary_impl(
        &mut self,
        a: TensorId,
        op: UnaryOp,
        inplace: bool,
    ) -> Result<TensorId> {
        // ggml runs GELU, quick GELU, erf GELU and SiLU (ops.cpp) on F32 and F16 only; the other
        // unary ops (unary-ops.cpp) take BF16 too.
        let (dt, ne) = match op {
            UnaryOp::Gelu | UnaryOp::GeluQuick | UnaryOp::GeluErf | UnaryOp::Silu => {
                self.float_src(op.name(), a)?
            }
            _ => self.float_or_bf16_src(op.name(), a)?,
        };
        if let UnaryOp::Xielu { alpha_n, alpha_p, beta, eps } = op
            && ![alpha_n, alpha_p, beta, eps].iter().all(|v| v.is_finite())
        {
            return Err(Error::param(
                "xielu",
                format!(
                    "alpha_n = {alpha_n}, alpha_p = {alpha_p}, beta = {beta}, eps = {eps} must be finite"
                ),
            ));
        }
        self.finish(Op::Unary(op), dt, ne, &[a], inplace)
    }

    /// An elementwise function computed in the memory of `a` (ggml_unary_inplace).
    pub fn unary_inplace(&mut self, a: TensorId, op: UnaryOp) -> Result<TensorId> {
        self.unary_impl(a, op, true)
    }

    /// xIELU (ggml_xielu): stores `beta + softplus(alpha_n)`, `softplus(alpha_p)`, `beta` and
    /// `eps` as ggml does; all four must be finite.
    pub fn xielu(
        &mut self,
        a: TensorId,
        alpha_n: f32,
        alpha_p: f32,
        beta: f32,
        eps: f32,
    ) -> Result<TensorId> {
        let op = UnaryOp::Xielu {
            alpha_n: beta + softplus(alpha_n),
            alpha_p: softplus(alpha_p),
            beta,
            eps,
        };
        self.unary_impl(a, op, false)
    }

    fn simple(&mut self, op: Op, a: TensorId, inplace: bool) -> Result<TensorId> {
        // sqr, sqrt, log, sin, cos are unary-ops.cpp kernels (BF16 too); clamp, leaky_relu and
        // fill are F32/F16 only in ggml.
        let (dt, ne) = match op {
            Op::Sqr | Op::Sqrt | Op::Log | Op::Sin | Op::Cos => {
                self.float_or_bf16_src(op.name(), a)?
            }
            _ => self.float_src(op.name(), a)?,
        };
        self.finish(op, dt, ne, &[a], inplace)
    }

    /// x * x (ggml_sqr), F32, F16 or BF16.
    pub fn sqr(&mut self, a: TensorId) -> Result<TensorId> {
        self.simple(Op::Sqr, a, false)
    }
    /// sqrt(x) (ggml_sqrt), F32, F16 or BF16.
    pub fn sqrt(&mut self, a: TensorId) -> Result<TensorId> {
        self.simple(Op::Sqrt, a, false)
    }
    /// ln(x) (ggml_log), F32, F16 or BF16.
    pub fn log(&mut self, a: TensorId) -> Result<TensorId> {
        self.simple(Op::Log, a, false)
    }
    /// sin(x) (ggml_sin), F32, F16 or BF16.
    pub fn sin(&mut self, a: TensorId) -> Result<TensorId> {
        self.simple(Op::Sin, a, false)
    }
    /// cos(x) (ggml_cos), F32, F16 or BF16.
    pub fn cos(&mut self, a: TensorId) -> Result<TensorId> {
        self.simple(Op::Cos, a, false)
    }

    /// x * x in the memory of `a` (ggml_sqr_inplace).
    pub fn sqr_inplace(&mut self, a: TensorId) -> Result<TensorId> {
        self.simple(Op::Sqr, a, true)
    }
    /// sqrt(x) in the memory of `a` (ggml_sqrt_inplace).
    pub fn sqrt_inplace(&mut self, a: TensorId) -> Result<TensorId> {
        self.simple(Op::Sqrt, a, true)
    }
    /// ln(x) in the memory of `a` (ggml_log_inplace).
    pub fn log_inplace(&mut self, a: TensorId) -> Result<TensorId> {
        self.simple(Op::Log, a, true)
    }
    /// sin(x) in the memory of `a` (ggml_sin_inplace).
    pub fn sin_inplace(&mut self, a: TensorId) -> Result<TensorId> {
        self.simple(Op::Sin, a, true)
    }
    /// cos(x) in the memory of `a` (ggml_cos_inplace).
    pub fn cos_inplace(&mut self, a: TensorId) -> Result<TensorId> {
        self.simple(Op::Cos, a, true)
    }

    /// min(max(x, min), max) (ggml_clamp), F32 or F16. Unlike ggml, whose clamp always writes
    /// into `a`, the result is a new tensor; `min <= max`, neither NaN.
    pub fn clamp(&mut self, a: TensorId, min: f32, max: f32) -> Result<TensorId> {
        if min.is_nan() || max.is_nan() || min > max {
            return Err(Error::param("clamp", format!("min = {min}, max = {max}")));
        }
        self.simple(Op::Clamp { min, max }, a, false)
    }

    /// x if x > 0 else `negative_slope * x` (ggml_leaky_relu), F32 or F16.
    pub fn leaky_relu(&mut self, a: TensorId, negative_slope: f32) -> Result<TensorId> {
        self.leaky_relu_impl(a, negative_slope, false)
    }
    /// ggml_leaky_relu with `inplace` (the result takes over `a`'s memory).
    pub fn leaky_relu_inplace(&mut self, a: TensorId, negative_slope: f32) -> Result<TensorId> {
        self.leaky_relu_impl(a, negative_slope, true)
    }

    fn leaky_relu_impl(
        &mut self,
        a: TensorId,
        negative_slope: f32,
        inplace: bool,
    ) -> Result<TensorId> {
        if !negative_slope.is_finite() {
            return Err(Error::param(
                "leaky_relu",
                format!("negative_slope = {negative_slope} must be finite"),
            ));
        }
        self.simple(Op::LeakyRelu { negative_slope }, a, inplace)
    }

    /// A tensor shaped and typed like `a` (F32 or F16, contiguous) with every element `value`
    /// (ggml_fill).
    pub fn fill(&mut self, a: TensorId, value: f32) -> Result<TensorId> {
        self.fill_impl(a, value, false)
    }
    /// ggml_fill_inplace.
    pub fn fill_inplace(&mut self, a: TensorId, value: f32) -> Result<TensorId> {
        self.fill_impl(a, value, true)
    }
    fn fill_impl(&mut self, a: TensorId, value: f32, inplace: bool) -> Result<TensorId> {
        self.float_src("fill", a)?;
        self.contiguous_src("fill", a)?;
        self.simple(Op::Fill { value }, a, inplace)
    }

    // ---- binary ------------------------------------------------------------------------------

    /// ggml's CPU type combinations for add/sub/mul/div (binary-ops.cpp): F32+F32, F16+F16,
    /// F16+F32, BF16+BF16 and BF16+F32; the result has `a`'s type.
    pub(crate) fn binary_types(&self, op: &'static str, a: TensorId, b: TensorId) -> Result<DType> {
        let (ta, tb) = (self.get(op, a)?, self.get(op, b)?);
        match (ta.dtype, tb.dtype) {
            (DType::F32, DType::F32)
            | (DType::F16, DType::F16)
            | (DType::F16, DType::F32)
            | (DType::BF16, DType::BF16)
            | (DType::BF16, DType::F32) => Ok(ta.dtype),
            _ => Err(Error::ty(
                op,
                format!(
                    "{} and {} (F32+F32, F16+F16, F16+F32, BF16+BF16 or BF16+F32; add also takes a quantized a with an F32 b)",
                    ta.describe(a),
                    tb.describe(b)
                ),
            )),
        }
    }

    /// Checks ggml's `add_q_f32` case: a block-quantized `a` whose rows are rewritable, an F32
    /// `b` of the same shape, both with contiguous rows.
    fn check_add_quant(&self, op: &'static str, a: TensorId, b: TensorId) -> Result<()> {
        let (ta, tb) = (self.get(op, a)?, self.get(op, b)?);
        if !quant_rows_rewritable(ta.dtype) || tb.dtype != DType::F32 {
            return Err(Error::ty(
                op,
                format!(
                    "{} + {}: a quantized a needs an F32 b and a type with a dequantizer and a quantizer that needs no importance matrix",
                    ta.describe(a),
                    tb.describe(b)
                ),
            ));
        }
        if ta.ne != tb.ne {
            return Err(Error::shape(
                op,
                format!(
                    "{} + {}: with a quantized a, b must have a's shape (no broadcast, as ggml)",
                    ta.describe(a),
                    tb.describe(b)
                ),
            ));
        }
        self.rows_contiguous_src(op, a)?;
        self.rows_contiguous_src(op, b)
    }

    pub(super) fn binary_impl(
        &mut self,
        op: Op,
        a: TensorId,
        b: TensorId,
        inplace: bool,
    ) -> Result<TensorId> {
        let name = op.name();
        let (ta, tb) = (self.get(name, a)?, self.get(name, b)?);
        if !can_repeat(&tb.ne, &ta.ne) {
            return Err(Error::shape(
                name,
                format!("{} cannot be broadcast to {}", tb.describe(b), ta.describe(a)),
            ));
        }
        let ne = ta.ne;
        if matches!(op, Op::Add) && ta.dtype.is_quantized() {
            self.check_add_quant(name, a, b)?;
            return self.finish(op, ta.dtype, ne, &[a, b], inplace);
        }
        let dt = self.binary_types(name, a, b)?;
        self.finish(op, dt, ne, &[a, b], inplace)
    }

    /// a + b with b broadcast over a, the result in `dtype` (ggml_add_cast): `a` F16 or BF16
    /// with an F32 `b` gives F32 (or `a`'s type); a quantized `a` (rows dequantized, `b` of the
    /// same shape added, the sum written as `dtype`) gives F32, F16, BF16 or `a`'s type.
    pub fn add_cast(&mut self, a: TensorId, b: TensorId, dtype: DType) -> Result<TensorId> {
        const OP: &str = "add_cast";
        let (ta, tb) = (self.get(OP, a)?, self.get(OP, b)?);
        let ne = ta.ne;
        if ta.dtype.is_quantized() {
            self.check_add_quant(OP, a, b)?;
            if !(is_float_or_bf16(dtype) || dtype == ta.dtype) {
                return Err(Error::ty(
                    OP,
                    format!(
                        "{}: the result of a quantized add is F32, F16, BF16 or {}, not {dtype}",
                        ta.describe(a),
                        ta.dtype
                    ),
                ));
            }
            return self.node(Op::Add, dtype, ne, &[a, b]);
        }
        if !matches!(ta.dtype, DType::F16 | DType::BF16) || tb.dtype != DType::F32 {
            return Err(Error::ty(
                OP,
                format!(
                    "{} + {}: add_cast takes an F16, BF16 or quantized a and an F32 b",
                    ta.describe(a),
                    tb.describe(b)
                ),
            ));
        }
        if !(dtype == DType::F32 || dtype == ta.dtype) {
            return Err(Error::ty(
                OP,
                format!("{}: the result is F32 or {}, not {dtype}", ta.describe(a), ta.dtype),
            ));
        }
        if !can_repeat(&tb.ne, &ta.ne) {
            return Err(Error::shape(
                OP,
                format!("{} cannot be broadcast to {}", tb.describe(b), ta.describe(a)),
            ));
        }
        self.node(Op::Add, dtype, ne, &[a, b])
    }

    /// a + b computed in the memory of `a` (ggml_add_inplace).
    pub fn add_inplace(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary_impl(Op::Add, a, b, true)
    }
    /// a - b computed in the memory of `a` (ggml_sub_inplace).
    pub fn sub_inplace(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary_impl(Op::Sub, a, b, true)
    }
    /// a / b computed in the memory of `a` (ggml_div_inplace).
    pub fn div_inplace(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary_impl(Op::Div, a, b, true)
    }
    /// a * b computed in the memory of `a` (ggml_mul_inplace).
    pub fn mul_inplace(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary_impl(Op::Mul, a, b, true)
    }

    /// a + b for a one-element `b` (ggml_add1): F32+F32, F16+F16, F16+F32, BF16+BF16,
    /// BF16+F32, or a quantized `a` (rows dequantized, requantized) with an F32 scalar; rows of
    /// `a` contiguous.
    pub fn add1(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.add1_impl(a, b, false)
    }
    /// ggml_add1_inplace.
    pub fn add1_inplace(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.add1_impl(a, b, true)
    }
    fn add1_impl(&mut self, a: TensorId, b: TensorId, inplace: bool) -> Result<TensorId> {
        const OP: &str = "add1";
        let tb = self.get(OP, b)?;
        if tb.nelements() != 1 {
            return Err(Error::shape(OP, format!("b {} must have one element", tb.describe(b))));
        }
        let ta = self.get(OP, a)?;
        let dt = if ta.dtype.is_quantized() {
            if !quant_rows_rewritable(ta.dtype) || tb.dtype != DType::F32 {
                return Err(Error::ty(
                    OP,
                    format!(
                        "{} + {}: a quantized a needs an F32 scalar and a type with a dequantizer and a quantizer that needs no importance matrix",
                        ta.describe(a),
                        tb.describe(b)
                    ),
                ));
            }
            ta.dtype
        } else {
            self.binary_types(OP, a, b)?
        };
        self.rows_contiguous_src(OP, a)?;
        let ne = self.t(a).ne;
        self.finish(Op::Add1, dt, ne, &[a, b], inplace)
    }

    /// `a[:, i1, i2] + b[:, ids[i1, i2]]` (ggml_add_id, used for expert biases): `a` F32
    /// [n, m, p], `b` F32 [n, k], `ids` I32 [m, p]. Ids out of range make compute return `Err`.
    pub fn add_id(&mut self, a: TensorId, b: TensorId, ids: TensorId) -> Result<TensorId> {
        const OP: &str = "add_id";
        let (ta, tb, ti) = (self.get(OP, a)?, self.get(OP, b)?, self.get(OP, ids)?);
        if ta.dtype != DType::F32 || tb.dtype != DType::F32 || ti.dtype != DType::I32 {
            return Err(Error::ty(
                OP,
                format!(
                    "{}, {}, ids {}: need F32, F32, I32",
                    ta.describe(a),
                    tb.describe(b),
                    ti.describe(ids)
                ),
            ));
        }
        if ta.ne[0] != tb.ne[0]
            || ta.ne[1] != ti.ne[0]
            || ta.ne[2] != ti.ne[1]
            || ta.ne[3] != 1
            || tb.ne[2] != 1
            || tb.ne[3] != 1
            || ti.ne[2] != 1
            || ti.ne[3] != 1
        {
            return Err(Error::shape(
                OP,
                format!(
                    "{} + {} by ids {}: need a [n, m, p], b [n, k], ids [m, p]",
                    ta.describe(a),
                    tb.describe(b),
                    ti.describe(ids)
                ),
            ));
        }
        self.rows_contiguous_src(OP, a)?;
        self.rows_contiguous_src(OP, b)?;
        let ne = ta.ne;
        self.finish(Op::AddId, DType::F32, ne, &[a, b, ids], false)
    }

    /// `a` with `b` added into the view of `a` with byte strides `nb1..nb3` at byte `offset`
    /// (ggml_acc): both F32, `a` contiguous, rows of `b` contiguous, the view inside `a`.
    pub fn acc(
        &mut self,
        a: TensorId,
        b: TensorId,
        nb: [usize; 3],
        offset: usize,
    ) -> Result<TensorId> {
        self.acc_impl(a, b, nb, offset, false)
    }
    /// ggml_acc_inplace.
    pub fn acc_inplace(
        &mut self,
        a: TensorId,
        b: TensorId,
        nb: [usize; 3],
        offset: usize,
    ) -> Result<TensorId> {
        self.acc_impl(a, b, nb, offset, true)
    }
    fn acc_impl(
        &mut self,
        a: TensorId,
        b: TensorId,
        nb: [usize; 3],
        offset: usize,
        inplace: bool,
    ) -> Result<TensorId> {
        const OP: &str = "acc";
        let ne = self.f32_src(OP, a)?;
        let bne = self.f32_src(OP, b)?;
        self.contiguous_src(OP, a)?;
        self.rows_contiguous_src(OP, b)?;
        let (ta, tb) = (self.t(a), self.t(b));
        let a_bytes = ta.nbytes();
        // Last byte the view touches, as ggml asserts at compute time (checked here, once).
        let strides = [4usize, nb[0], nb[1], nb[2]];
        let mut last = Some(offset);
        for i in 0..MAX_DIMS {
            last = last.and_then(|l| {
                bne[i].saturating_sub(1).checked_mul(strides[i]).and_then(|x| l.checked_add(x))
            });
        }
        let fits = offset.is_multiple_of(4)
            && nb.iter().all(|s| s % 4 == 0)
            && last.and_then(|l| l.checked_add(4)).is_some_and(|end| end <= a_bytes);
        // Workers add disjoint rows of b; rows that land on the same elements would race.
        super::check_disjoint_layout(OP, DType::F32, &bne, &strides, || {
            format!("view of {} for {}", ta.describe(a), tb.describe(b))
        })?;
        if tb.nelements() > ta.nelements() || !fits || tb.nelements() == 0 {
            return Err(Error::shape(
                OP,
                format!(
                    "{} at strides {nb:?}, offset {offset} does not fit in {} ({a_bytes} bytes, F32-aligned)",
                    tb.describe(b),
                    ta.describe(a)
                ),
            ));
        }
        self.finish(
            Op::Acc { nb1: nb[0], nb2: nb[1], nb3: nb[2], offset },
            DType::F32,
            ne,
            &[a, b],
            inplace,
        )
    }

    /// Keeps one triangle of each square matrix of `a` (F32, contiguous, ne\[0\] == ne\[1\]) and
    /// zeroes the rest (ggml_tri).
    pub fn tri(&mut self, a: TensorId, kind: TriType) -> Result<TensorId> {
        const OP: &str = "tri";
        let ne = self.f32_src(OP, a)?;
        self.contiguous_src(OP, a)?;
        if ne[0] != ne[1] {
            return Err(Error::shape(
                OP,
                format!("{} is not square in dims 0, 1", self.t(a).describe(a)),
            ));
        }
        self.finish(Op::Tri(kind), DType::F32, ne, &[a], false)
    }

    /// [n, 1, p, q] -> [n, n, p, q] with the vector on the diagonal (ggml_diag), F32.
    pub fn diag(&mut self, a: TensorId) -> Result<TensorId> {
        const OP: &str = "diag";
        let ne = self.f32_src(OP, a)?;
        if ne[1] != 1 {
            return Err(Error::shape(
                OP,
                format!("{} must have ne[1] == 1", self.t(a).describe(a)),
            ));
        }
        let nne = [ne[0], ne[0], ne[2], ne[3]];
        self.finish(Op::Diag, DType::F32, nne, &[a], false)
    }

    /// Sets elements with column > n_past + row to -inf (ggml_diag_mask_inf), F32.
    pub fn diag_mask_inf(&mut self, a: TensorId, n_past: usize) -> Result<TensorId> {
        self.diag_mask(Op::DiagMaskInf { n_past }, a, false)
    }
    /// ggml_diag_mask_inf_inplace.
    pub fn diag_mask_inf_inplace(&mut self, a: TensorId, n_past: usize) -> Result<TensorId> {
        self.diag_mask(Op::DiagMaskInf { n_past }, a, true)
    }
    /// Sets elements with column > n_past + row to 0 (ggml_diag_mask_zero), F32.
    pub fn diag_mask_zero(&mut self, a: TensorId, n_past: usize) -> Result<TensorId> {
        self.diag_mask(Op::DiagMaskZero { n_past }, a, false)
    }
    fn diag_mask(&mut self, op: Op, a: TensorId, inplace: bool) -> Result<TensorId> {
        let name = op.name();
        let ne = self.f32_src(name, a)?;
        if let Op::DiagMaskInf { n_past } | Op::DiagMaskZero { n_past } = op
            && n_past > i32::MAX as usize
        {
            return Err(Error::param(name, format!("n_past = {n_past} exceeds i32")));
        }
        self.finish(op, DType::F32, ne, &[a], inplace)
    }

    // ---- GLU ---------------------------------------------------------------------------------

    /// A fused gated linear unit (ggml_glu): each row of `a` (F32 or F16, and BF16 for reglu,
    /// geglu, swiglu, geglu_erf and geglu_quick; contiguous rows) is split in halves x | g (g | x
    /// when `swapped`); the result has ne\[0\] / 2 columns and `a`'s type.
    pub fn glu(&mut self, a: TensorId, op: GluOp, swapped: bool) -> Result<TensorId> {
        self.glu_impl(a, None, op, swapped, 0.0, 0.0)
    }

    /// A gated linear unit over two tensors of the same shape and type (ggml_glu_split):
    /// `act(a) * b`.
    pub fn glu_split(&mut self, a: TensorId, b: TensorId, op: GluOp) -> Result<TensorId> {
        self.glu_impl(a, Some(b), op, false, 0.0, 0.0)
    }

    /// ggml_swiglu_oai: `b` None is the fused form; `alpha` and `limit` finite, `limit` >= 0.
    pub fn swiglu_oai(
        &mut self,
        a: TensorId,
        b: Option<TensorId>,
        alpha: f32,
        limit: f32,
    ) -> Result<TensorId> {
        self.glu_impl(a, b, GluOp::SwigluOai, false, alpha, limit)
    }

    /// ggml_swiglu_clamp: `silu(min(x, limit)) * clamp(g, -limit, limit)`; `b` None is the fused
    /// form; `limit` finite and >= 0.
    pub fn swiglu_clamp(
        &mut self,
        a: TensorId,
        b: Option<TensorId>,
        limit: f32,
    ) -> Result<TensorId> {
        self.glu_impl(a, b, GluOp::SwigluClamp, false, 0.0, limit)
    }

    /// ggml_swiglu (fused) / ggml_swiglu_split when `b` is given.
    pub fn swiglu(&mut self, a: TensorId, b: Option<TensorId>) -> Result<TensorId> {
        self.glu_impl(a, b, GluOp::Swiglu, false, 0.0, 0.0)
    }
    /// ggml_geglu (fused) / ggml_geglu_split when `b` is given.
    pub fn geglu(&mut self, a: TensorId, b: Option<TensorId>) -> Result<TensorId> {
        self.glu_impl(a, b, GluOp::Geglu, false, 0.0, 0.0)
    }
    /// ggml_reglu (fused) / ggml_reglu_split when `b` is given.
    pub fn reglu(&mut self, a: TensorId, b: Option<TensorId>) -> Result<TensorId> {
        self.glu_impl(a, b, GluOp::Reglu, false, 0.0, 0.0)
    }

    fn glu_impl(
        &mut self,
        a: TensorId,
        b: Option<TensorId>,
        op: GluOp,
        swapped: bool,
        alpha: f32,
        limit: f32,
    ) -> Result<TensorId> {
        let name = op.name();
        // BF16 for the five plain units (ggml's _bf16 kernels); the clamped SwiGLUs are F32/F16.
        let (dt, ne) = match op {
            GluOp::SwigluOai | GluOp::SwigluClamp => self.float_src(name, a)?,
            _ => self.float_or_bf16_src(name, a)?,
        };
        self.rows_contiguous_src(name, a)?;
        // Only swiglu_oai (alpha, limit) and swiglu_clamp (limit) have parameters (ggml's
        // op_params 2 and 3); the others store zeros.
        let (alpha, limit) = match op {
            GluOp::SwigluOai => (alpha, limit),
            GluOp::SwigluClamp => (0.0, limit),
            _ => (0.0, 0.0),
        };
        if !alpha.is_finite() || !limit.is_finite() || limit < 0.0 {
            return Err(Error::param(name, format!("alpha = {alpha}, limit = {limit}")));
        }
        let mut out = ne;
        let mut srcs = vec![a];
        if let Some(b) = b {
            let tb = self.get(name, b)?;
            if tb.dtype != dt || tb.ne != ne {
                return Err(Error::shape(
                    name,
                    format!(
                        "split form needs equal shapes and types: {} and {}",
                        self.t(a).describe(a),
                        tb.describe(b)
                    ),
                ));
            }
            self.rows_contiguous_src(name, b)?;
            srcs.push(b);
        } else {
            if ne[0] < 2 {
                return Err(Error::shape(
                    name,
                    format!("{} has fewer than 2 columns to split", self.t(a).describe(a)),
                ));
            }
            out[0] = ne[0] / 2;
        }
        self.finish(Op::Glu { op, swapped, alpha, limit }, dt, out, &srcs, false)
    }

    // ---- norms -------------------------------------------------------------------------------

    /// (x - mean) / sqrt(variance + eps) along rows (ggml_norm), F32.
    pub fn norm(&mut self, a: TensorId, eps: f32) -> Result<TensorId> {
        check_eps("norm", eps)?;
        let ne = self.f32_src("norm", a)?;
        self.finish(Op::Norm { eps }, DType::F32, ne, &[a], false)
    }

    /// ggml_norm_inplace.
    pub fn norm_inplace(&mut self, a: TensorId, eps: f32) -> Result<TensorId> {
        check_eps("norm", eps)?;
        let ne = self.f32_src("norm", a)?;
        self.finish(Op::Norm { eps }, DType::F32, ne, &[a], true)
    }

    /// `rms_norm(a, eps) * weight` in one pass, with the numerics of ggml's CPU fusion of
    /// RMS_NORM followed by MUL: `a` F32 with contiguous rows, `weight` F32 with contiguous rows,
    /// `weight.ne[0] == a.ne[0]`, broadcast over a's other dims.
    pub fn rms_norm_mul(&mut self, a: TensorId, weight: TensorId, eps: f32) -> Result<TensorId> {
        const OP: &str = "rms_norm_mul";
        check_eps(OP, eps)?;
        let ne = self.f32_src(OP, a)?;
        let wne = self.f32_src(OP, weight)?;
        self.rows_contiguous_src(OP, a)?;
        self.rows_contiguous_src(OP, weight)?;
        if wne[0] != ne[0] || !can_repeat(&wne, &ne) {
            return Err(Error::shape(
                OP,
                format!(
                    "weight {} does not broadcast over {} (need equal ne[0])",
                    self.t(weight).describe(weight),
                    self.t(a).describe(a)
                ),
            ));
        }
        self.finish(Op::RmsNormMul { eps }, DType::F32, ne, &[a, weight], false)
    }

    /// Normalises groups of channels (dim 2) of each sample (dim 3) (ggml_group_norm), F32 with
    /// contiguous rows; `n_groups >= 1`.
    pub fn group_norm(&mut self, a: TensorId, n_groups: usize, eps: f32) -> Result<TensorId> {
        const OP: &str = "group_norm";
        check_eps(OP, eps)?;
        let ne = self.f32_src(OP, a)?;
        self.rows_contiguous_src(OP, a)?;
        if n_groups == 0 || n_groups > i32::MAX as usize {
            return Err(Error::param(OP, format!("n_groups = {n_groups} must be >= 1")));
        }
        self.finish(Op::GroupNorm { n_groups, eps }, DType::F32, ne, &[a], false)
    }

    /// x / max(||x||, eps) along rows (ggml_l2_norm), F32.
    pub fn l2_norm(&mut self, a: TensorId, eps: f32) -> Result<TensorId> {
        check_eps("l2_norm", eps)?;
        let ne = self.f32_src("l2_norm", a)?;
        self.finish(Op::L2Norm { eps }, DType::F32, ne, &[a], false)
    }

    // ---- reductions and sorting --------------------------------------------------------------

    /// Sum of all elements (ggml_sum): F32 -> F32 \[1\] (f64 accumulation), F16 -> F16 \[1\]
    /// and BF16 -> BF16 \[1\] (f32 accumulation, as ggml).
    pub fn sum(&mut self, a: TensorId) -> Result<TensorId> {
        let (dt, _) = self.float_or_bf16_src("sum", a)?;
        self.finish(Op::Sum, dt, [1, 1, 1, 1], &[a], false)
    }

    /// Sum of each row (ggml_sum_rows): F32 [n, a, b, c] -> [1, a, b, c].
    pub fn sum_rows(&mut self, a: TensorId) -> Result<TensorId> {
        let ne = self.f32_src("sum_rows", a)?;
        self.finish(Op::SumRows, DType::F32, [1, ne[1], ne[2], ne[3]], &[a], false)
    }

    /// Mean of each row (ggml_mean): F32 [n, a, b, c] -> [1, a, b, c].
    pub fn mean(&mut self, a: TensorId) -> Result<TensorId> {
        let ne = self.f32_src("mean", a)?;
        self.finish(Op::Mean, DType::F32, [1, ne[1], ne[2], ne[3]], &[a], false)
    }

    /// Running sum along each row (ggml_cumsum), F32.
    pub fn cumsum(&mut self, a: TensorId) -> Result<TensorId> {
        let ne = self.f32_src("cumsum", a)?;
        self.finish(Op::Cumsum, DType::F32, ne, &[a], false)
    }

    /// Index of the largest element of each row (ggml_argmax): F32 matrix \[n, m\] -> I32 \[m\];
    /// ties give the last index, as ggml.
    pub fn argmax(&mut self, a: TensorId) -> Result<TensorId> {
        const OP: &str = "argmax";
        let ne = self.f32_src(OP, a)?;
        if ne[2] != 1 || ne[3] != 1 || ne[0] > i32::MAX as usize {
            return Err(Error::shape(
                OP,
                format!("{} must be a matrix with ne[0] <= 2^31 - 1", self.t(a).describe(a)),
            ));
        }
        self.finish(Op::Argmax, DType::I32, [ne[1], 1, 1, 1], &[a], false)
    }

    /// Number of positions where two I32 tensors of the same shape are equal (ggml_count_equal):
    /// I64 \[1\].
    pub fn count_equal(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        const OP: &str = "count_equal";
        let (ta, tb) = (self.get(OP, a)?, self.get(OP, b)?);
        if ta.dtype != DType::I32 || tb.dtype != DType::I32 {
            return Err(Error::ty(
                OP,
                format!("{} and {} must be I32", ta.describe(a), tb.describe(b)),
            ));
        }
        if ta.ne != tb.ne {
            return Err(Error::shape(
                OP,
                format!("{} and {} differ in shape", ta.describe(a), tb.describe(b)),
            ));
        }
        self.finish(Op::CountEqual, DType::I64, [1, 1, 1, 1], &[a, b], false)
    }

    /// Indices that sort each row of `a` (ggml_argsort): F32 -> I32 of the same shape. Equal
    /// values keep their index order.
    pub fn argsort(&mut self, a: TensorId, order: SortOrder) -> Result<TensorId> {
        const OP: &str = "argsort";
        let ne = self.f32_src(OP, a)?;
        if ne[0] > i32::MAX as usize {
            return Err(Error::shape(OP, format!("ne[0] = {} exceeds i32", ne[0])));
        }
        self.finish(Op::Argsort(order), DType::I32, ne, &[a], false)
    }

    /// Indices of the `k` largest elements of each row (ggml_top_k at ggml d99724f): F32
    /// [n, ...] -> I32 [k, ...], `1 <= k <= n`. As in ggml the order within the k is not
    /// significant: this returns them largest first with the first two swapped, as ggml does.
    pub fn top_k(&mut self, a: TensorId, k: usize) -> Result<TensorId> {
        const OP: &str = "top_k";
        let ne = self.f32_src(OP, a)?;
        if k == 0 || k > ne[0] || ne[0] > i32::MAX as usize {
            return Err(Error::param(
                OP,
                format!("k = {k} must be in 1..={} for {}", ne[0], shape_str(&ne)),
            ));
        }
        self.finish(Op::TopK { k }, DType::I32, [k, ne[1], ne[2], ne[3]], &[a], false)
    }
}
