//! flash_attn_ext (ggml_flash_attn_ext): fused softmax(Q K^T * scale + mask) V with online softmax,
//! validated at build time.

use super::{Graph, Op, TensorId};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Parameters of a flash-attention node (ggml's op_params and sinks).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FlashAttnParams {
    /// Multiplies Q K^T (usually 1/sqrt(head_dim)).
    pub scale: f32,
    /// ALiBi: > 0 turns on per-head slopes applied to the mask (needs a mask).
    pub max_bias: f32,
    /// > 0: logits become `softcap * tanh(logits / softcap)`.
    pub logit_softcap: f32,
}

impl FlashAttnParams {
    /// Plain attention with this scale.
    pub fn new(scale: f32) -> FlashAttnParams {
        FlashAttnParams { scale, max_bias: 0.0, logit_softcap: 0.0 }
    }
}

/// K types: a dot product with the query converted to the type's vec-dot type.
fn k_type_ok(d: DType) -> bool {
    let kt = crate::kernels::table();
    kt.vec_dot(d).is_some() && kt.activation_converter(d.vec_dot_type()).is_some()
}

/// V types: rows that convert to f32.
fn v_type_ok(d: DType) -> bool {
    d == DType::F16 || crate::kernels::table().to_f32(d).is_some()
}

impl Graph {
    /// Fused attention (ggml_flash_attn_ext). `q` F32 [dk, n_q, n_head, b]; `k` [dk, n_kv,
    /// n_head_kv, b'] of any type with a dot product (F32, F16, BF16 and every quantized type;
    /// `dk` a whole number of blocks of k's type and of its vec-dot type) and `v` [dv, n_kv,
    /// n_head_kv, b'] of any type that converts to f32, broadcast over heads (GQA) and batch; `mask` F16 or F32 [>= n_kv, >= n_q,
    /// dividing n_head, dividing b\]; `sinks` F32 \[n_head\]. The result is F32 \[dv, n_head, n_q, b\]
    /// (heads before queries, as ggml).
    pub fn flash_attn_ext(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        mask: Option<TensorId>,
        sinks: Option<TensorId>,
        p: FlashAttnParams,
    ) -> Result<TensorId> {
        const OP: &str = "flash_attn_ext";
        let (tq, tk, tv) = (self.get(OP, q)?, self.get(OP, k)?, self.get(OP, v)?);
        if tq.dtype != DType::F32 {
            return Err(Error::ty(OP, format!("q {} must be F32", tq.describe(q))));
        }
        if !k_type_ok(tk.dtype) || !v_type_ok(tv.dtype) {
            return Err(Error::ty(
                OP,
                format!(
                    "k {} needs a dot product with its vec-dot type and v {} a conversion to f32",
                    tk.describe(k),
                    tv.describe(v)
                ),
            ));
        }
        if tk.ne[0] % tk.dtype.block_size() != 0 || tv.ne[0] % tv.dtype.block_size() != 0 {
            return Err(Error::shape(
                OP,
                format!(
                    "head sizes must be whole blocks: k {}, v {}",
                    tk.describe(k),
                    tv.describe(v)
                ),
            ));
        }
        for (t, id) in [(tq, q), (tk, k), (tv, v)] {
            if !t.rows_contiguous() {
                return Err(Error::shape(
                    OP,
                    format!("rows of {} are not contiguous", t.describe(id)),
                ));
            }
        }
        if tk.ne[0] != tq.ne[0] {
            return Err(Error::shape(
                OP,
                format!("head sizes differ: q {} vs k {}", tq.describe(q), tk.describe(k)),
            ));
        }
        if tv.ne[1] != tk.ne[1] || tv.ne[2] != tk.ne[2] || tv.ne[3] != tk.ne[3] {
            return Err(Error::shape(
                OP,
                format!("k {} and v {} disagree", tk.describe(k), tv.describe(v)),
            ));
        }
        if !super::divides(tk.ne[2], tq.ne[2]) || !super::divides(tk.ne[3], tq.ne[3]) {
            return Err(Error::shape(
                OP,
                format!("k/v heads {} must divide q heads {}", tk.describe(k), tq.describe(q)),
            ));
        }
        let vd = tk.dtype.vec_dot_type();
        if tq.ne[0] % vd.block_size() != 0 {
            return Err(Error::shape(
                OP,
                format!("head size {} is not a multiple of {vd}'s block", tq.ne[0]),
            ));
        }
        if !p.scale.is_finite()
            || !p.max_bias.is_finite()
            || p.max_bias < 0.0
            || !p.logit_softcap.is_finite()
            || p.logit_softcap < 0.0
        {
            return Err(Error::param(OP, format!("{p:?}")));
        }
        let (n_kv, n_q, n_head, nb) = (tk.ne[1], tq.ne[1], tq.ne[2], tq.ne[3]);
        match mask {
            Some(m) => {
                let tm = self.get(OP, m)?;
                if !matches!(tm.dtype, DType::F16 | DType::F32) || !tm.rows_contiguous() {
                    return Err(Error::ty(
                        OP,
                        format!("mask {} must be F16 or F32 with contiguous rows", tm.describe(m)),
                    ));
                }
                if tm.ne[0] < n_kv
                    || tm.ne[1] < n_q
                    || !super::divides(tm.ne[2], n_head)
                    || !super::divides(tm.ne[3], nb)
                {
                    return Err(Error::shape(
                        OP,
                        format!(
                            "mask {} must be at least [{n_kv}, {n_q}] and divide heads {n_head} and batch {nb}",
                            tm.describe(m)
                        ),
                    ));
                }
            }
            None if p.max_bias > 0.0 => {
                return Err(Error::param(OP, "max_bias > 0 (ALiBi) needs a mask"));
            }
            None => {}
        }
        if let Some(s) = sinks {
            let ts = self.get(OP, s)?;
            if ts.dtype != DType::F32 || ts.ne[0] != n_head || ts.ne[1] * ts.ne[2] * ts.ne[3] != 1 {
                return Err(Error::shape(
                    OP,
                    format!("sinks {} must be F32 [{n_head}]", ts.describe(s)),
                ));
            }
        }
        let ne = [tv.ne[0], n_head, n_q, nb];
        self.node_opt(
            Op::FlashAttnExt(p),
            DType::F32,
            ne,
            &[Some(q), Some(k), Some(v), mask, sinks],
        )
    }
}
