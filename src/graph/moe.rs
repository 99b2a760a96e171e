//! Mixture-of-experts matmul and outer product builders: mul_mat_id (ggml_mul_mat_id) and out_prod
//! (ggml_out_prod), with ggml's shape rules and the types ggml's CPU backend accepts, checked at
//! build time.

use super::{Graph, Op, TensorId};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Types ggml's CPU `out_prod` accepts for `a` (src0): F32, F16, and the quantized types its
/// `ggml_compute_forward_out_prod` dequantizes (not BF16, nor the activation-only Q8_1 and Q8_K,
/// on which ggml aborts).
pub(crate) fn out_prod_type_ok(d: DType) -> bool {
    matches!(
        d,
        DType::F32
            | DType::F16
            | DType::Q1_0
            | DType::Q2_0
            | DType::Q4_0
            | DType::Q4_1
            | DType::Q5_0
            | DType::Q5_1
            | DType::Q8_0
            | DType::MXFP4
            | DType::NVFP4
            | DType::Q2_K
            | DType::Q3_K
            | DType::Q4_K
            | DType::Q5_K
            | DType::Q6_K
            | DType::TQ1_0
            | DType::TQ2_0
            | DType::IQ2_XXS
            | DType::IQ2_XS
            | DType::IQ3_XXS
            | DType::IQ1_S
            | DType::IQ1_M
            | DType::IQ4_NL
            | DType::IQ4_XS
            | DType::IQ3_S
            | DType::IQ2_S
    ) && (d == DType::F32 || d == DType::F16 || crate::quant::format(d).dequantize.is_some())
}

impl Graph {
    /// Matrix products with experts picked per token (ggml_mul_mat_id).
    ///
    /// `as_` holds one weight matrix per expert, `[k, m, n_expert]` in any type with a dot product;
    /// `b` is F32 (or `as_`'s vec-dot type) `[k, n_b, n_tokens]` with `n_b` 1 or `n_used` (slot `s`
    /// reads row `s % n_b`); `ids` is I32 `[n_used, n_tokens]` (may be a strided view) naming the
    /// expert of each slot. The result is F32 `[m, n_used, n_tokens]` with
    /// `dst[:, s, t] = as_[:, :, ids[s, t]] · b[:, s % n_b, t]`. An id outside `0..n_expert` makes
    /// compute return `Err`.
    ///
    /// `as_` may live in a CPU_REPACK buffer ([`CpuRepackBufferType`](crate::CpuRepackBufferType),
    /// 3-D tensors are repacked expert by expert); `b` must then be F32, and each output equals
    /// that expert's repacked `mul_mat` bit for bit.
    ///
    /// ```
    /// use quantgraph::{CpuBackend, DType, Graph, Plan};
    /// let mut g = Graph::new();
    /// let experts = g.input(DType::F32, &[2, 1, 3])?; // k = 2, m = 1, three experts
    /// let x = g.input(DType::F32, &[2, 1, 1])?; // one token, b shared by the slots
    /// let ids = g.input(DType::I32, &[2, 1])?; // two experts used
    /// let y = g.mul_mat_id(experts, x, ids)?; // [1, 2, 1]
    /// g.set_output(y)?;
    /// let mut p = Plan::new(g, &CpuBackend::with_threads(1)?)?;
    /// p.set_input(experts, &[1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0])?;
    /// p.set_input(x, &[3.0f32, 4.0])?;
    /// p.set_input(ids, &[2i32, 0])?;
    /// p.compute()?;
    /// assert_eq!(p.output::<f32>(y)?, &[7.0, 3.0]);
    /// # Ok::<(), quantgraph::Error>(())
    /// ```
    pub fn mul_mat_id(&mut self, as_: TensorId, b: TensorId, ids: TensorId) -> Result<TensorId> {
        const OP: &str = "mul_mat_id";
        let ta = self.get(OP, as_)?;
        let tb = self.get(OP, b)?;
        let ti = self.get(OP, ids)?;
        let (ds, db, di) = (ta.describe(as_), tb.describe(b), ti.describe(ids));
        if ti.dtype != DType::I32 {
            return Err(Error::ty(OP, format!("ids {di} must be I32")));
        }
        if ta.ne[0] == 0 {
            return Err(Error::shape(
                OP,
                format!(
                    "as {ds} x b {db}: the shared dimension ne[0] is 0; mul_mat_id needs at least one element per row"
                ),
            ));
        }
        if ta.ne[1] > 1 && ta.nb[0] > ta.nb[1] {
            return Err(Error::shape(OP, format!("as {ds} is transposed; use cont first")));
        }
        if !ta.rows_contiguous() {
            return Err(Error::shape(OP, format!("rows of as {ds} are not contiguous")));
        }
        if ta.ne[3] != 1 || tb.ne[3] != 1 || ti.ne[2] != 1 || ti.ne[3] != 1 {
            return Err(Error::shape(
                OP,
                format!("as {ds} and b {db} must be 3-D, ids {di} 2-D (one matrix per expert)"),
            ));
        }
        if ta.ne[0] != tb.ne[0] {
            return Err(Error::shape(OP, format!("as {ds} x b {db}: need equal ne[0]")));
        }
        if ti.ne[1] != tb.ne[2] {
            return Err(Error::shape(
                OP,
                format!("ids {di} need one expert list per token: ids.ne[1] == b.ne[2] ({db})"),
            ));
        }
        if tb.ne[1] == 0 || ti.ne[0] % tb.ne[1] != 0 {
            return Err(Error::shape(
                OP,
                format!(
                    "b {db} cannot be broadcast over the slots of ids {di}: b.ne[1] must divide ids.ne[0]"
                ),
            ));
        }
        let vd = ta.dtype.vec_dot_type();
        let kt = crate::kernels::table();
        if kt.vec_dot(ta.dtype).is_none()
            || !(tb.dtype == DType::F32 || tb.dtype == vd)
            || (tb.dtype != vd && kt.activation_converter(vd).is_none())
        {
            return Err(Error::ty(
                OP,
                format!(
                    "as {ds} x b {db}: as needs a dot product with {vd}, b must be F32 or {vd}"
                ),
            ));
        }
        if ta.ne[0] % vd.block_size() != 0 {
            return Err(Error::shape(
                OP,
                format!(
                    "k = {} is not a multiple of {vd}'s block size {}",
                    ta.ne[0],
                    vd.block_size()
                ),
            ));
        }
        if !tb.rows_contiguous() {
            return Err(Error::shape(OP, format!("rows of b {db} are not contiguous")));
        }
        if self.is_repacked(as_) && (tb.dtype != DType::F32 || kt.repack(ta.dtype).is_none()) {
            return Err(Error::ty(
                OP,
                format!(
                    "as {ds} is stored repacked: b {db} must be F32 (and the CPU needs a repacked {} kernel)",
                    ta.dtype
                ),
            ));
        }
        let ne = [ta.ne[1], ti.ne[0], tb.ne[2], 1];
        self.node(Op::MulMatId, DType::F32, ne, &[as_, b, ids])
    }

    /// Outer products summed over k (ggml_out_prod): `a` `[m, k, p, q]`, `b` F32 `[n, k, p*r,
    /// q*s]` (any strides, e.g. a transposed view) give F32 `[m, n, p*r, q*s]` with
    /// `dst[i, j] = sum_l a[i, l] * b[j, l]`. `a` is F32 (broadcast over dims 2 and 3), or F16 or
    /// a quantized type (dims 2 and 3 equal to b's, as ggml's CPU backend requires).
    ///
    /// ```
    /// use quantgraph::{CpuBackend, DType, Graph, Plan};
    /// let mut g = Graph::new();
    /// let a = g.input(DType::F32, &[2, 1])?; // m = 2, k = 1
    /// let b = g.input(DType::F32, &[3, 1])?; // n = 3
    /// let y = g.out_prod(a, b)?; // [2, 3]
    /// g.set_output(y)?;
    /// let mut p = Plan::new(g, &CpuBackend::with_threads(1)?)?;
    /// p.set_input(a, &[1.0f32, 2.0])?;
    /// p.set_input(b, &[1.0f32, 10.0, 100.0])?;
    /// p.compute()?;
    /// assert_eq!(p.output::<f32>(y)?, &[1.0, 2.0, 10.0, 20.0, 100.0, 200.0]);
    /// # Ok::<(), quantgraph::Error>(())
    /// ```
    pub fn out_prod(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        const OP: &str = "out_prod";
        let ta = self.get(OP, a)?;
        let tb = self.get(OP, b)?;
        let (da, db) = (ta.describe(a), tb.describe(b));
        if !out_prod_type_ok(ta.dtype) || tb.dtype != DType::F32 {
            return Err(Error::ty(
                OP,
                format!("a {da}, b {db}: a must be F32, F16 or quantized, b F32"),
            ));
        }
        if ta.ne[1] != tb.ne[1] {
            return Err(Error::shape(OP, format!("a {da}, b {db}: need a.ne[1] == b.ne[1] (k)")));
        }
        let bcast_ok = if ta.dtype == DType::F32 {
            ta.ne[2] != 0 && ta.ne[3] != 0 && tb.ne[2] % ta.ne[2] == 0 && tb.ne[3] % ta.ne[3] == 0
        } else {
            ta.ne[2] == tb.ne[2] && ta.ne[3] == tb.ne[3]
        };
        if !bcast_ok {
            return Err(Error::shape(
                OP,
                format!(
                    "a {da}, b {db}: dims 2 and 3 of a must {}",
                    if ta.dtype == DType::F32 {
                        "divide b's"
                    } else {
                        "equal b's for F16 and quantized a"
                    }
                ),
            ));
        }
        if ta.ne[1] > 1 && ta.nb[0] > ta.nb[1] {
            return Err(Error::shape(OP, format!("a {da} is transposed; use cont first")));
        }
        if !ta.rows_contiguous() {
            return Err(Error::shape(OP, format!("rows of a {da} are not contiguous")));
        }
        let ne = [ta.ne[0], tb.ne[0], tb.ne[2], tb.ne[3]];
        self.node(Op::OutProd, DType::F32, ne, &[a, b])
    }
}
