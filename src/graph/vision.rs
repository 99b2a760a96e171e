//! Convolution, pooling and vision builders (ggml's im2col, im2col_3d, col2im_1d, conv_2d_direct,
//! conv_3d_direct, conv_2d_dw_direct, conv_transpose_1d, conv_transpose_2d_p0, pool_1d, pool_2d,
//! win_part, win_unpart, get_rel_pos, add_rel_pos). Shapes, parameter order and output types are
//! ggml's; every check ggml asserts (and the ones it leaves to chance) is an `Err` here.

use super::{Graph, Op, Pool2dParams, TensorId};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Pooling function (ggml's `enum ggml_op_pool`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PoolOp {
    /// Largest value of the window (padding never wins: the start value is `-f32::MAX`).
    Max,
    /// Mean of the window. pool_1d divides by the number of in-range elements, pool_2d by
    /// `k0 * k1` (padding counts as zeros), as ggml's CPU backend does.
    Avg,
}

/// Stride, padding and dilation of a 2D convolution along width (0) and height (1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dParams {
    /// Stride along width.
    pub s0: usize,
    /// Stride along height.
    pub s1: usize,
    /// Zero padding on both sides of the width.
    pub p0: usize,
    /// Zero padding on both sides of the height.
    pub p1: usize,
    /// Dilation along width.
    pub d0: usize,
    /// Dilation along height.
    pub d1: usize,
}

impl Conv2dParams {
    /// Stride 1, no padding, dilation 1.
    pub const DEFAULT: Conv2dParams = Conv2dParams { s0: 1, s1: 1, p0: 0, p1: 0, d0: 1, d1: 1 };

    /// The same stride, padding and dilation on both axes.
    pub fn square(s: usize, p: usize, d: usize) -> Conv2dParams {
        Conv2dParams { s0: s, s1: s, p0: p, p1: p, d0: d, d1: d }
    }
}

impl Default for Conv2dParams {
    fn default() -> Self {
        Conv2dParams::DEFAULT
    }
}

/// Stride, padding and dilation of a 3D convolution along width, height and depth, plus ggml's
/// channel bookkeeping: dim 3 of the input holds `n * c` planes (batch-major), dim 3 of the
/// kernel `oc * c`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv3dParams {
    /// Strides (width, height, depth).
    pub s: [usize; 3],
    /// Zero padding on both sides (width, height, depth).
    pub p: [usize; 3],
    /// Dilations (width, height, depth).
    pub d: [usize; 3],
    /// Input channels.
    pub c: usize,
    /// Batch size (conv_3d; im2col_3d derives it from the input).
    pub n: usize,
    /// Output channels (conv_3d; im2col_3d derives it from the kernel).
    pub oc: usize,
}

/// ggml's `ggml_calc_conv_output_size` with C's truncating division; `None` when the result
/// is not positive or does not fit.
fn conv_out(ins: usize, ks: usize, s: usize, p: usize, d: usize) -> Option<usize> {
    let (ins, ks, s, p, d) = (ins as i128, ks as i128, s as i128, p as i128, d as i128);
    let v = (ins + 2 * p - d * (ks - 1) - 1) / s + 1;
    if v > 0 && v <= u32::MAX as i128 { Some(v as usize) } else { None }
}

/// ggml's `ggml_calc_pool_output_size`, computed in f32 as ggml does (padding is a float there).
fn pool_out(ins: usize, ks: usize, s: usize, p: f32) -> Option<usize> {
    let v = ((ins as f32 + 2.0 * p - ks as f32) / s as f32 + 1.0) as i64;
    if v > 0 && v <= u32::MAX as i64 { Some(v as usize) } else { None }
}

fn check_positive(op: &'static str, what: &[(&str, usize)]) -> Result<()> {
    for &(name, v) in what {
        if v == 0 || v > i32::MAX as usize {
            return Err(Error::param(op, format!("{name} = {v} must be in 1..=2^31-1")));
        }
    }
    Ok(())
}

fn check_padding(op: &'static str, what: &[(&str, usize)]) -> Result<()> {
    for &(name, v) in what {
        if v > i32::MAX as usize / 4 {
            return Err(Error::param(op, format!("padding {name} = {v} is too large")));
        }
    }
    Ok(())
}

impl Graph {
    /// Every vision op refuses empty tensors (ggml's size formulas assume at least one element).
    fn non_empty(&self, op: &'static str, ids: &[TensorId]) -> Result<()> {
        for &id in ids {
            let t = self.get(op, id)?;
            if t.nelements() == 0 {
                return Err(Error::shape(op, format!("{} is empty", t.describe(id))));
            }
        }
        Ok(())
    }

    fn float_kernel(&self, op: &'static str, a: TensorId, what: &str) -> Result<DType> {
        let t = self.get(op, a)?;
        if !matches!(t.dtype, DType::F32 | DType::F16) {
            return Err(Error::ty(op, format!("{what} {} must be F32 or F16", t.describe(a))));
        }
        Ok(t.dtype)
    }

    fn f32_input(&self, op: &'static str, b: TensorId, what: &str) -> Result<()> {
        let t = self.get(op, b)?;
        if t.dtype != DType::F32 {
            return Err(Error::ty(op, format!("{what} {} must be F32", t.describe(b))));
        }
        Ok(())
    }

    fn out_size_err(&self, op: &'static str, a: TensorId, b: TensorId, extra: String) -> Error {
        Error::shape(
            op,
            format!(
                "input {} is too small for kernel {} with {extra}",
                self.t(b).describe(b),
                self.t(a).describe(a)
            ),
        )
    }

    /// ggml_im2col: unfolds the patches of `b` that a kernel shaped like `a` sees into rows.
    /// 2D (`is_2d`): `a` [KW, KH, IC, *], `b` [W, H, IC, N] -> [IC*KH*KW, OW, OH, N].
    /// 1D: `a` [KW, IC, *], `b` [W, IC, N, 1] -> [IC*KW, OW, N, 1] (s1, p1, d1 unused).
    /// Only `a`'s shape is read. `dst_type` is F32 (with `b` F32) or F16 (with `b` F32 or F16).
    pub fn im2col(
        &mut self,
        a: TensorId,
        b: TensorId,
        p: Conv2dParams,
        is_2d: bool,
        dst_type: DType,
    ) -> Result<TensorId> {
        const OP: &str = "im2col";
        self.non_empty(OP, &[a, b])?;
        let (ta, tb) = (self.get(OP, a)?, self.get(OP, b)?);
        match (dst_type, tb.dtype) {
            (DType::F32, DType::F32) | (DType::F16, DType::F32 | DType::F16) => {}
            _ => {
                return Err(Error::ty(
                    OP,
                    format!(
                        "input {} to {dst_type}: ggml converts F32 to F32 or F16, F16 to F16",
                        tb.describe(b)
                    ),
                ));
            }
        }
        if !tb.rows_contiguous() {
            return Err(Error::shape(OP, format!("rows of {} must be contiguous", tb.describe(b))));
        }
        check_positive(OP, &[("s0", p.s0), ("d0", p.d0)])?;
        check_padding(OP, &[("p0", p.p0), ("p1", p.p1)])?;
        let ne = if is_2d {
            check_positive(OP, &[("s1", p.s1), ("d1", p.d1)])?;
            if ta.ne[2] != tb.ne[2] {
                return Err(Error::shape(
                    OP,
                    format!(
                        "kernel {} and input {} need the same channels (ne[2])",
                        ta.describe(a),
                        tb.describe(b)
                    ),
                ));
            }
            let oh = conv_out(tb.ne[1], ta.ne[1], p.s1, p.p1, p.d1);
            let ow = conv_out(tb.ne[0], ta.ne[0], p.s0, p.p0, p.d0);
            let (Some(oh), Some(ow)) = (oh, ow) else {
                return Err(self.out_size_err(OP, a, b, format!("{p:?}")));
            };
            let k = ta.ne[2]
                .checked_mul(ta.ne[1])
                .and_then(|v| v.checked_mul(ta.ne[0]))
                .ok_or(Error::Overflow { what: "im2col row" })?;
            [k, ow, oh, tb.ne[3]]
        } else {
            if ta.ne[1] != tb.ne[1] || tb.ne[3] != 1 {
                return Err(Error::shape(
                    OP,
                    format!(
                        "1D: kernel {} and input {} need the same channels (ne[1]) and input ne[3] == 1",
                        ta.describe(a),
                        tb.describe(b)
                    ),
                ));
            }
            let Some(ow) = conv_out(tb.ne[0], ta.ne[0], p.s0, p.p0, p.d0) else {
                return Err(self.out_size_err(OP, a, b, format!("{p:?}")));
            };
            let k = ta.ne[1].checked_mul(ta.ne[0]).ok_or(Error::Overflow { what: "im2col row" })?;
            [k, ow, tb.ne[2], 1]
        };
        self.node(Op::Im2col { p, is_2d }, dst_type, ne, &[a, b])
    }

    /// ggml_im2col_3d: `a` [KW, KH, KD, OC*IC], `b` [W, H, D, N*IC] ->
    /// [IC*KD*KH*KW, OW, OH, OD*N]; `c` is IC (`p.n` and `p.oc` are ignored and derived).
    /// `dst_type` F32 or F16; `b` F32.
    pub fn im2col_3d(
        &mut self,
        a: TensorId,
        b: TensorId,
        p: Conv3dParams,
        dst_type: DType,
    ) -> Result<TensorId> {
        const OP: &str = "im2col_3d";
        self.non_empty(OP, &[a, b])?;
        let (ta, tb) = (self.get(OP, a)?, self.get(OP, b)?);
        if !matches!(dst_type, DType::F32 | DType::F16) || tb.dtype != DType::F32 {
            return Err(Error::ty(
                OP,
                format!("input {} to {dst_type}: input F32, result F32 or F16", tb.describe(b)),
            ));
        }
        check_positive(OP, &[("c", p.c)])?;
        check_positive(OP, &[("s0", p.s[0]), ("s1", p.s[1]), ("s2", p.s[2])])?;
        check_positive(OP, &[("d0", p.d[0]), ("d1", p.d[1]), ("d2", p.d[2])])?;
        check_padding(OP, &[("p0", p.p[0]), ("p1", p.p[1]), ("p2", p.p[2])])?;
        // Only the input's dim 3 must hold whole batches; the kernel's OC is never read (ggml).
        if tb.ne[3] % p.c != 0 {
            return Err(Error::shape(
                OP,
                format!("input {}: ne[3] must be a multiple of IC = {}", tb.describe(b), p.c),
            ));
        }
        let n = tb.ne[3] / p.c;
        let od = conv_out(tb.ne[2], ta.ne[2], p.s[2], p.p[2], p.d[2]);
        let oh = conv_out(tb.ne[1], ta.ne[1], p.s[1], p.p[1], p.d[1]);
        let ow = conv_out(tb.ne[0], ta.ne[0], p.s[0], p.p[0], p.d[0]);
        let (Some(od), Some(oh), Some(ow)) = (od, oh, ow) else {
            return Err(self.out_size_err(OP, a, b, format!("{p:?}")));
        };
        let k = [ta.ne[0], ta.ne[1], ta.ne[2], p.c]
            .iter()
            .try_fold(1usize, |acc, &v| acc.checked_mul(v))
            .ok_or(Error::Overflow { what: "im2col_3d row" })?;
        let ne3 = od.checked_mul(n).ok_or(Error::Overflow { what: "im2col_3d" })?;
        let p = Conv3dParams { n, oc: ta.ne[3] / p.c, ..p };
        self.node(Op::Im2col3d(p), dst_type, [k, ow, oh, ne3], &[a, b])
    }

    /// ggml_col2im_1d: scatter-adds GEMM columns `a` [K*OC, T_in] (F32, F16 or BF16, contiguous)
    /// into a signal [T_out, OC] of the same type, T_out = (T_in - 1)*s0 + K - 2*p0, cropping
    /// `p0` from both sides. Sums in f32.
    pub fn col2im_1d(&mut self, a: TensorId, s0: usize, oc: usize, p0: usize) -> Result<TensorId> {
        const OP: &str = "col2im_1d";
        self.non_empty(OP, &[a])?;
        let ta = self.get(OP, a)?;
        if !matches!(ta.dtype, DType::F32 | DType::F16 | DType::BF16) {
            return Err(Error::ty(OP, format!("{} must be F32, F16 or BF16", ta.describe(a))));
        }
        if ta.ne[2] != 1 || ta.ne[3] != 1 || !ta.is_contiguous() {
            return Err(Error::shape(
                OP,
                format!("{} must be a contiguous matrix", ta.describe(a)),
            ));
        }
        check_positive(OP, &[("s0", s0), ("oc", oc)])?;
        check_padding(OP, &[("p0", p0)])?;
        let k = ta.ne[0] / oc;
        let t_out = (ta.ne[1] as i128 - 1) * s0 as i128 + k as i128 - 2 * p0 as i128;
        if k * oc != ta.ne[0] || k == 0 || t_out <= 0 || t_out > u32::MAX as i128 {
            return Err(Error::shape(
                OP,
                format!(
                    "{}: ne[0] must be K*oc with K >= 1 (oc = {oc}) and T_out = {t_out} positive",
                    ta.describe(a)
                ),
            ));
        }
        let dt = ta.dtype;
        self.node(Op::Col2im1d { s0, oc, p0 }, dt, [t_out as usize, oc, 1, 1], &[a])
    }

    /// ggml_conv_2d_direct: kernel `a` [KW, KH, IC, OC] (F32 or F16, contiguous), input `b`
    /// [W, H, IC, N] (F32, any strides, e.g. a CWHN permutation) -> [OW, OH, OC, N] F32.
    /// With an F16 kernel the input is rounded to F16 (ggml multiplies in the kernel's type).
    ///
    /// ```
    /// use quantgraph::{Conv2dParams, CpuBackend, DType, Graph, Plan};
    /// let mut g = Graph::new();
    /// let x = g.input(DType::F32, &[4, 4, 1, 1])?; // a 4x4 image, one channel
    /// let k = g.input(DType::F32, &[3, 3, 1, 2])?; // two 3x3 filters
    /// let y = g.conv_2d(k, x, Conv2dParams::square(1, 1, 1))?; // stride 1, pad 1, dilation 1
    /// assert_eq!(g.shape(y)?, [4, 4, 2, 1]);
    /// g.set_output(y)?;
    /// let mut plan = Plan::new(g, &CpuBackend::with_threads(1)?)?;
    /// plan.set_input(x, &[1.0f32; 16])?;
    /// let mut w = vec![0.0f32; 18];
    /// w[4] = 1.0; // filter 0: identity
    /// w[9..].fill(1.0); // filter 1: 3x3 box sum
    /// plan.set_input(k, &w)?;
    /// plan.compute()?;
    /// let out = plan.output::<f32>(y)?;
    /// assert_eq!(out[5], 1.0);
    /// assert_eq!((out[16], out[16 + 5]), (4.0, 9.0)); // corner and interior box sums
    /// # Ok::<(), quantgraph::Error>(())
    /// ```
    pub fn conv_2d(&mut self, a: TensorId, b: TensorId, p: Conv2dParams) -> Result<TensorId> {
        const OP: &str = "conv_2d";
        self.non_empty(OP, &[a, b])?;
        self.float_kernel(OP, a, "kernel")?;
        self.f32_input(OP, b, "input")?;
        let (ta, tb) = (self.t(a), self.t(b));
        if !ta.is_contiguous() {
            return Err(Error::shape(OP, format!("kernel {} must be contiguous", ta.describe(a))));
        }
        if ta.ne[2] != tb.ne[2] {
            return Err(Error::shape(
                OP,
                format!(
                    "kernel {} and input {} need the same channels (ne[2])",
                    ta.describe(a),
                    tb.describe(b)
                ),
            ));
        }
        check_positive(OP, &[("s0", p.s0), ("s1", p.s1), ("d0", p.d0), ("d1", p.d1)])?;
        check_padding(OP, &[("p0", p.p0), ("p1", p.p1)])?;
        let ow = conv_out(tb.ne[0], ta.ne[0], p.s0, p.p0, p.d0);
        let oh = conv_out(tb.ne[1], ta.ne[1], p.s1, p.p1, p.d1);
        let (Some(ow), Some(oh)) = (ow, oh) else {
            return Err(self.out_size_err(OP, a, b, format!("{p:?}")));
        };
        let ne = [ow, oh, ta.ne[3], tb.ne[3]];
        self.node(Op::Conv2d(p), DType::F32, ne, &[a, b])
    }

    /// ggml_conv_3d_direct: kernel `a` [KW, KH, KD, OC*C] (F32 or F16, contiguous), input `b`
    /// [W, H, D, N*C] (F32) -> [OW, OH, OD, N*OC] F32, with `p.c`, `p.n`, `p.oc` as in ggml.
    pub fn conv_3d(&mut self, a: TensorId, b: TensorId, p: Conv3dParams) -> Result<TensorId> {
        const OP: &str = "conv_3d";
        self.non_empty(OP, &[a, b])?;
        self.float_kernel(OP, a, "kernel")?;
        self.f32_input(OP, b, "input")?;
        let (ta, tb) = (self.t(a), self.t(b));
        if !ta.is_contiguous() {
            return Err(Error::shape(OP, format!("kernel {} must be contiguous", ta.describe(a))));
        }
        check_positive(OP, &[("c", p.c), ("n", p.n), ("oc", p.oc)])?;
        check_positive(OP, &[("s0", p.s[0]), ("s1", p.s[1]), ("s2", p.s[2])])?;
        check_positive(OP, &[("d0", p.d[0]), ("d1", p.d[1]), ("d2", p.d[2])])?;
        check_padding(OP, &[("p0", p.p[0]), ("p1", p.p[1]), ("p2", p.p[2])])?;
        if p.c.checked_mul(p.oc) != Some(ta.ne[3]) || p.c.checked_mul(p.n) != Some(tb.ne[3]) {
            return Err(Error::shape(
                OP,
                format!(
                    "kernel {} needs ne[3] = c*oc = {}*{}, input {} ne[3] = c*n = {}*{}",
                    ta.describe(a),
                    p.c,
                    p.oc,
                    tb.describe(b),
                    p.c,
                    p.n
                ),
            ));
        }
        let ow = conv_out(tb.ne[0], ta.ne[0], p.s[0], p.p[0], p.d[0]);
        let oh = conv_out(tb.ne[1], ta.ne[1], p.s[1], p.p[1], p.d[1]);
        let od = conv_out(tb.ne[2], ta.ne[2], p.s[2], p.p[2], p.d[2]);
        let (Some(ow), Some(oh), Some(od)) = (ow, oh, od) else {
            return Err(self.out_size_err(OP, a, b, format!("{p:?}")));
        };
        let ne3 = p.oc.checked_mul(p.n).ok_or(Error::Overflow { what: "conv_3d" })?;
        self.node(Op::Conv3d(p), DType::F32, [ow, oh, od, ne3], &[a, b])
    }

    /// ggml_conv_2d_dw_direct: depthwise convolution, kernel `a` [KW, KH, 1, C] (F32 or F16),
    /// input `b` [W, H, C, N] (F32) -> [OW, OH, C, N] F32. `b` is either contiguous (WHCN) or
    /// channels-innermost (CWHN, a permuted view with `nb[2]` the element size); a CWHN input
    /// gives a CWHN result (a permuted, non-contiguous tensor, as in ggml).
    pub fn conv_2d_dw(&mut self, a: TensorId, b: TensorId, p: Conv2dParams) -> Result<TensorId> {
        const OP: &str = "conv_2d_dw";
        self.non_empty(OP, &[a, b])?;
        self.float_kernel(OP, a, "kernel")?;
        self.f32_input(OP, b, "input")?;
        let (ta, tb) = (self.t(a), self.t(b));
        if ta.ne[2] != 1 || ta.ne[3] != tb.ne[2] {
            return Err(Error::shape(
                OP,
                format!(
                    "kernel {} must be [KW, KH, 1, C] with C = input {} ne[2]",
                    ta.describe(a),
                    tb.describe(b)
                ),
            ));
        }
        let ts = 4;
        let cwhn = tb.nb[0] > tb.nb[2] && tb.nb[1] > tb.nb[0] && tb.nb[2] == ts;
        let packed_cwhn = cwhn
            && tb.nb[0] == tb.ne[2] * ts
            && tb.nb[1] == tb.ne[0] * tb.nb[0]
            && tb.nb[3] == tb.ne[1] * tb.nb[1];
        if !tb.is_contiguous() && !packed_cwhn {
            return Err(Error::shape(
                OP,
                format!(
                    "input {} must be contiguous (WHCN) or packed channels-first (CWHN), strides {:?}",
                    tb.describe(b),
                    tb.nb
                ),
            ));
        }
        check_positive(OP, &[("s0", p.s0), ("s1", p.s1), ("d0", p.d0), ("d1", p.d1)])?;
        check_padding(OP, &[("p0", p.p0), ("p1", p.p1)])?;
        let ow = conv_out(tb.ne[0], ta.ne[0], p.s0, p.p0, p.d0);
        let oh = conv_out(tb.ne[1], ta.ne[1], p.s1, p.p1, p.d1);
        let (Some(ow), Some(oh)) = (ow, oh) else {
            return Err(self.out_size_err(OP, a, b, format!("{p:?}")));
        };
        let ne = [ow, oh, tb.ne[2], tb.ne[3]];
        let keep_cwhn = packed_cwhn && !tb.is_contiguous();
        let id = self.node(Op::Conv2dDw(p), DType::F32, ne, &[a, b])?;
        if keep_cwhn {
            // ggml keeps the caller's layout: the result is CWHN too (dims 0..2 permuted strides
            // over the same bytes).
            let t = &mut self.tensors[id.index()];
            t.nb[0] = ne[2] * ts;
            t.nb[1] = ne[0] * t.nb[0];
            t.nb[2] = ts;
        }
        Ok(id)
    }

    /// ggml_conv_transpose_1d: kernel `a` [K, Cout, Cin] (F32 or F16), input `b` [L, Cin]
    /// (F32) -> [(L-1)*s0 + K, Cout] F32. ggml only implements `p0 == 0` and `d0 == 1`; other
    /// values are refused.
    pub fn conv_transpose_1d(
        &mut self,
        a: TensorId,
        b: TensorId,
        s0: usize,
        p0: usize,
        d0: usize,
    ) -> Result<TensorId> {
        const OP: &str = "conv_transpose_1d";
        self.non_empty(OP, &[a, b])?;
        self.float_kernel(OP, a, "kernel")?;
        self.f32_input(OP, b, "input")?;
        let (ta, tb) = (self.t(a), self.t(b));
        if tb.ne[2] != 1 || tb.ne[3] != 1 || ta.ne[3] != 1 || ta.ne[2] != tb.ne[1] {
            return Err(Error::shape(
                OP,
                format!(
                    "kernel {} must be [K, Cout, Cin, 1] and input {} [L, Cin, 1, 1]",
                    ta.describe(a),
                    tb.describe(b)
                ),
            ));
        }
        if p0 != 0 || d0 != 1 {
            return Err(Error::param(
                OP,
                format!("p0 = {p0}, d0 = {d0}: only p0 = 0 and d0 = 1 are implemented (as ggml)"),
            ));
        }
        check_positive(OP, &[("s0", s0)])?;
        let ol = (tb.ne[0] - 1)
            .checked_mul(s0)
            .and_then(|v| v.checked_add(ta.ne[0]))
            .ok_or(Error::Overflow { what: "conv_transpose_1d" })?;
        let ne = [ol, ta.ne[1], 1, 1];
        self.node(Op::ConvTranspose1d { s0 }, DType::F32, ne, &[a, b])
    }

    /// ggml_conv_transpose_2d_p0: kernel `a` [KW, KH, Cout, Cin] (F32 or F16), input `b`
    /// [W, H, Cin, N] (F32) -> [(W-1)*stride + KW, (H-1)*stride + KH, Cout, N] F32. (ggml's CPU
    /// kernel only fills batch 0; here every batch is computed.)
    pub fn conv_transpose_2d(
        &mut self,
        a: TensorId,
        b: TensorId,
        stride: usize,
    ) -> Result<TensorId> {
        const OP: &str = "conv_transpose_2d";
        self.non_empty(OP, &[a, b])?;
        self.float_kernel(OP, a, "kernel")?;
        self.f32_input(OP, b, "input")?;
        let (ta, tb) = (self.t(a), self.t(b));
        if ta.ne[3] != tb.ne[2] {
            return Err(Error::shape(
                OP,
                format!(
                    "kernel {} ne[3] must equal input {} ne[2] (Cin)",
                    ta.describe(a),
                    tb.describe(b)
                ),
            ));
        }
        check_positive(OP, &[("stride", stride)])?;
        let out = |i: usize, k: usize| {
            (i - 1)
                .checked_mul(stride)
                .and_then(|v| v.checked_add(k))
                .ok_or(Error::Overflow { what: "conv_transpose_2d" })
        };
        let ne = [out(tb.ne[0], ta.ne[0])?, out(tb.ne[1], ta.ne[1])?, ta.ne[2], tb.ne[3]];
        self.node(Op::ConvTranspose2d { stride }, DType::F32, ne, &[a, b])
    }

    /// ggml_pool_1d: pools windows of `k0` elements, stride `s0`, padding `p0` along dim 0 of
    /// `a` (F32 or F16, contiguous rows) -> F32 [(W + 2*p0 - k0)/s0 + 1, ...].
    pub fn pool_1d(
        &mut self,
        a: TensorId,
        op: PoolOp,
        k0: usize,
        s0: usize,
        p0: usize,
    ) -> Result<TensorId> {
        const OP: &str = "pool_1d";
        self.non_empty(OP, &[a])?;
        let ta = self.get(OP, a)?;
        if !matches!(ta.dtype, DType::F32 | DType::F16) || !ta.rows_contiguous() {
            return Err(Error::ty(
                OP,
                format!("{} must be F32 or F16 with contiguous rows", ta.describe(a)),
            ));
        }
        check_positive(OP, &[("k0", k0), ("s0", s0)])?;
        check_padding(OP, &[("p0", p0)])?;
        let Some(ow) = pool_out(ta.ne[0], k0, s0, p0 as f32) else {
            return Err(Error::shape(
                OP,
                format!("{} too small for k0 = {k0}, s0 = {s0}, p0 = {p0}", ta.describe(a)),
            ));
        };
        let ne = [ow, ta.ne[1], ta.ne[2], ta.ne[3]];
        self.node(Op::Pool1d { op, k0, s0, p0 }, DType::F32, ne, &[a])
    }

    /// ggml_pool_2d: pools `k0 x k1` windows, strides `s0, s1`, padding `p0, p1` (see
    /// [`Pool2dParams`]) over dims 0 and 1 of `a` (F32 or F16, contiguous rows) -> F32. As in
    /// ggml the padding is a float for the output size and truncated to an integer for the
    /// window offsets.
    pub fn pool_2d(&mut self, a: TensorId, params: Pool2dParams) -> Result<TensorId> {
        const OP: &str = "pool_2d";
        let Pool2dParams { op, k0, k1, s0, s1, p0, p1 } = params;
        self.non_empty(OP, &[a])?;
        let ta = self.get(OP, a)?;
        if !matches!(ta.dtype, DType::F32 | DType::F16) || !ta.rows_contiguous() {
            return Err(Error::ty(
                OP,
                format!("{} must be F32 or F16 with contiguous rows", ta.describe(a)),
            ));
        }
        check_positive(OP, &[("k0", k0), ("k1", k1), ("s0", s0), ("s1", s1)])?;
        for (name, v) in [("p0", p0), ("p1", p1)] {
            if !(v.is_finite() && (0.0..=1e6).contains(&v)) {
                return Err(Error::param(OP, format!("{name} = {v} must be in 0..=1e6")));
            }
        }
        let ow = pool_out(ta.ne[0], k0, s0, p0);
        let oh = pool_out(ta.ne[1], k1, s1, p1);
        let (Some(ow), Some(oh)) = (ow, oh) else {
            return Err(Error::shape(
                OP,
                format!(
                    "{} too small for k = ({k0}, {k1}), s = ({s0}, {s1}), p = ({p0}, {p1})",
                    ta.describe(a)
                ),
            ));
        };
        let ne = [ow, oh, ta.ne[2], ta.ne[3]];
        self.node(Op::Pool2d { op, k: [k0, k1], s: [s0, s1], p: [p0, p1] }, DType::F32, ne, &[a])
    }

    /// ggml_win_part: splits `a` [C, W, H, 1] (F32) into zero-padded `w x w` windows
    /// -> [C, w, w, npx*npy], window index `py*npx + px`.
    pub fn win_part(&mut self, a: TensorId, w: usize) -> Result<TensorId> {
        const OP: &str = "win_part";
        self.non_empty(OP, &[a])?;
        let ta = self.get(OP, a)?;
        if ta.dtype != DType::F32 || ta.ne[3] != 1 {
            return Err(Error::ty(OP, format!("{} must be F32 with ne[3] == 1", ta.describe(a))));
        }
        check_positive(OP, &[("w", w)])?;
        let npx = ta.ne[1].div_ceil(w);
        let npy = ta.ne[2].div_ceil(w);
        let np = npx.checked_mul(npy).ok_or(Error::Overflow { what: "win_part" })?;
        let ne = [ta.ne[0], w, w, np];
        self.node(Op::WinPart { npx, npy, w }, DType::F32, ne, &[a])
    }

    /// ggml_win_unpart: joins `w x w` windows `a` [C, w, w, np] (F32, from win_part) back into
    /// [C, w0, h0], dropping the padding. `np` must cover ceil(w0/w) * ceil(h0/w) windows.
    pub fn win_unpart(&mut self, a: TensorId, w0: usize, h0: usize, w: usize) -> Result<TensorId> {
        const OP: &str = "win_unpart";
        self.non_empty(OP, &[a])?;
        let ta = self.get(OP, a)?;
        if ta.dtype != DType::F32 {
            return Err(Error::ty(OP, format!("{} must be F32", ta.describe(a))));
        }
        check_positive(OP, &[("w", w), ("w0", w0), ("h0", h0)])?;
        let need = w0.div_ceil(w).checked_mul(h0.div_ceil(w));
        if ta.ne[1] != w || ta.ne[2] != w || need.is_none_or(|n| ta.ne[3] < n) {
            return Err(Error::shape(
                OP,
                format!(
                    "{} must be [C, {w}, {w}, >= {}] to cover {w0} x {h0}",
                    ta.describe(a),
                    need.unwrap_or(usize::MAX)
                ),
            ));
        }
        let ne = [ta.ne[0], w0, h0, 1];
        self.node(Op::WinUnpart { w }, DType::F32, ne, &[a])
    }

    /// ggml_get_rel_pos: relative position embeddings `a` [C, 2*qh - 1] (F16 or BF16) picked for
    /// every (query, key) pair -> [C, kh, qh] in `a`'s type, `out[:, k, q] = a[:, (kh - 1 - k) +
    /// q]`; ggml requires `qh == kh`. (ggml labels a BF16 input's result F16 while copying the
    /// BF16 values; here it keeps the BF16 type, so the values read back are the same.)
    pub fn get_rel_pos(&mut self, a: TensorId, qh: usize, kh: usize) -> Result<TensorId> {
        const OP: &str = "get_rel_pos";
        self.non_empty(OP, &[a])?;
        let ta = self.get(OP, a)?;
        if !matches!(ta.dtype, DType::F16 | DType::BF16) || !ta.rows_contiguous() {
            return Err(Error::ty(
                OP,
                format!("{} must be F16 or BF16 with contiguous rows", ta.describe(a)),
            ));
        }
        let dtype = ta.dtype;
        check_positive(OP, &[("qh", qh), ("kh", kh)])?;
        if qh != kh || ta.ne[1] != 2 * qh - 1 || ta.ne[2] != 1 || ta.ne[3] != 1 {
            return Err(Error::shape(
                OP,
                format!(
                    "{} with qh = {qh}, kh = {kh}: need qh == kh and a [C, 2*qh - 1]",
                    ta.describe(a)
                ),
            ));
        }
        let ne = [ta.ne[0], kh, qh, 1];
        self.node(Op::GetRelPos, dtype, ne, &[a])
    }

    /// ggml_add_rel_pos: adds decomposed relative positions to attention scores `a`
    /// [W*W, W*H, B] (F32, contiguous): `pw` and `ph` [W, W, H, B] (F32, contiguous, same shape)
    /// give `out[kh*W + kw, r, b] = a[kh*W + kw, r, b] + ph[kh, r, b] + pw[kw, r, b]`.
    pub fn add_rel_pos(&mut self, a: TensorId, pw: TensorId, ph: TensorId) -> Result<TensorId> {
        const OP: &str = "add_rel_pos";
        self.non_empty(OP, &[a, pw, ph])?;
        let (ta, tw, th) = (self.get(OP, a)?, self.get(OP, pw)?, self.get(OP, ph)?);
        for (t, id) in [(ta, a), (tw, pw), (th, ph)] {
            if t.dtype != DType::F32 || !t.is_contiguous() {
                return Err(Error::ty(OP, format!("{} must be contiguous F32", t.describe(id))));
            }
        }
        if tw.ne != th.ne
            || tw.ne[3] != ta.ne[2]
            || tw.ne[0].checked_mul(tw.ne[0]) != Some(ta.ne[0])
            || tw.ne[1].checked_mul(tw.ne[2]) != Some(ta.ne[1])
            || ta.ne[3] != 1
        {
            return Err(Error::shape(
                OP,
                format!(
                    "a {}, pw {}, ph {}: need pw == ph shape [W, X, Y, B] with a [W*W, X*Y, B, 1]",
                    ta.describe(a),
                    tw.describe(pw),
                    th.describe(ph)
                ),
            ));
        }
        let ne = ta.ne;
        self.node(Op::AddRelPos, DType::F32, ne, &[a, pw, ph])
    }
}
