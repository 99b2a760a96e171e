//! Data-movement builders beyond views and copies: set_rows.

use super::{Graph, Leaf, MAX_SRC, Op, Tensor, TensorId};
use crate::dtype::DType;
use crate::error::{Error, Result};

impl Graph {
    /// Writes the rows of `b` (F32 or F16) into the rows of `a` picked by `ids` (I32 or I64),
    /// converting to `a`'s type with ggml's CPU `from_float` (ggml_set_rows): `a[ids[i]] = b[i]`.
    /// `a` is [n, rows, p, q], `b` [n, k, p, q], `ids` [k, p', q'] with p' dividing p and q'
    /// dividing q. The result is a view of `a` (for a KV cache, `a` is a view of a state tensor).
    /// Out-of-range ids make compute return `Err`; with repeated ids the last row wins.
    pub fn set_rows(&mut self, a: TensorId, b: TensorId, ids: TensorId) -> Result<TensorId> {
        const OP: &str = "set_rows";
        let (ta, tb, ti) = (self.get(OP, a)?, self.get(OP, b)?, self.get(OP, ids)?);
        if !matches!(ti.dtype, DType::I32 | DType::I64) {
            return Err(Error::ty(OP, format!("ids {} must be I32 or I64", ti.describe(ids))));
        }
        if !matches!(tb.dtype, DType::F32 | DType::F16) {
            return Err(Error::ty(OP, format!("b {} must be F32 or F16", tb.describe(b))));
        }
        let f = crate::quant::format(ta.dtype);
        let writable = matches!(ta.dtype, DType::F32 | DType::F16 | DType::BF16)
            || f.from_float.is_some()
            || (f.quantize.is_some() && !f.requires_imatrix);
        if !writable {
            return Err(Error::ty(OP, format!("cannot convert rows to {}", ta.describe(a))));
        }
        if ta.ne[0] != tb.ne[0]
            || ta.ne[2] != tb.ne[2]
            || ta.ne[3] != tb.ne[3]
            || tb.ne[1] != ti.ne[0]
            || tb.ne[2] % ti.ne[1] != 0
            || tb.ne[3] % ti.ne[2] != 0
            || ti.ne[3] != 1
        {
            return Err(Error::shape(
                OP,
                format!(
                    "a {}, b {}, ids {}: need equal ne[0], ne[2], ne[3] for a and b, ids.ne[0] == b.ne[1], ids dims 1, 2 dividing b's, ids.ne[3] == 1",
                    ta.describe(a),
                    tb.describe(b),
                    ti.describe(ids)
                ),
            ));
        }
        if !ta.rows_contiguous() || !tb.rows_contiguous() {
            return Err(Error::shape(OP, "rows of a and b must be contiguous"));
        }
        if matches!(self.t(self.root(a)).leaf, Leaf::Weight { .. }) {
            return Err(Error::Buffer(format!(
                "set_rows: destination {} is a read-only weight",
                ta.describe(a)
            )));
        }
        let (dtype, ne, nb) = (ta.dtype, ta.ne, ta.nb);
        let root = self.root(a);
        let offs = if ta.view_src.is_some() { ta.view_offs } else { 0 };
        let mut src = [None; MAX_SRC];
        src[0] = Some(b);
        src[1] = Some(ids);
        src[2] = Some(a);
        self.push(Tensor {
            dtype,
            ne,
            nb,
            op: Op::SetRows,
            src,
            view_src: Some(root),
            view_offs: offs,
            leaf: Leaf::None,
            name: None,
            output: false,
        })
    }
}
