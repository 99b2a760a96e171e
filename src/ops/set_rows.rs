//! set_rows: dst[ids[i]] = from_float(b[i]) (ggml's ggml_compute_forward_set_rows). Each worker
//! owns a range of destination rows and scans every id in order, so with repeated ids the last one
//! wins whatever the thread count.

use super::node::DstRows;
use super::{NodeCtx, split};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::node::{ExecNode, align_up};

pub(crate) fn work_size(node: &ExecNode, nth: usize) -> usize {
    nth * align_up(node.dst.ne[0] * 4, 64)
}

pub(crate) fn compute(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (b, ids, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    let ne0 = d.ne[0];
    let tmp = ctx.scratch::<f32>(ith, align_up(ne0 * 4, 64), ne0);
    let kt = ctx.kt;
    let from = kt.activation_converter(d.dtype);
    let quant = crate::quant::format(d.dtype).quantize;
    let (r0, r1) = split(d.ne[1], ith, ctx.nth);
    for i3 in 0..b.ne[3] {
        for i2 in 0..b.ne[2] {
            // Flat rows of this (i2, i3) slab; dims 2, 3 of b and dst are equal (build check).
            let base = d.ne[1] * (i2 + d.ne[2] * i3);
            // SAFETY: this worker owns rows [r0, r1) of dim 1 in every slab (a split of ne[1]
            // by worker index), and holds one slab's rows at a time.
            let mut rows = unsafe { DstRows::new(d, base + r0, base + r1) };
            for i in 0..b.ne[1] {
                // i < ids.ne[0]; dims 2, 3 reduced modulo ids' (divisibility checked).
                let (j1, j2) = (i2 % ids.ne[1], i3 % ids.ne[2]);
                let id = if ids.dtype == DType::I64 {
                    ids.get::<i64>(i, j1, j2, 0)
                } else {
                    ids.get::<i32>(i, j1, j2, 0) as i64
                };
                if id < 0 || id as usize >= d.ne[1] {
                    return Err(Error::IndexOutOfRange {
                        op: "set_rows",
                        tensor: ctx.node.label(),
                        index: id,
                        limit: d.ne[1],
                    });
                }
                let row = id as usize;
                if row < r0 || row >= r1 {
                    continue;
                }
                let r = base + row;
                if b.dtype == DType::F16 && d.dtype == DType::F16 {
                    rows.bytes(r).copy_from_slice(b.row_bytes(i, i2, i3));
                    continue;
                }
                if b.dtype == DType::F16 {
                    let src = b.row_of::<u16>(i, i2, i3);
                    for (t, &h) in tmp.iter_mut().zip(src) {
                        *t = crate::quant::util::fp16_to_fp32(h);
                    }
                } else {
                    tmp.copy_from_slice(b.row_of::<f32>(i, i2, i3));
                }
                let dst = rows.bytes(r);
                match (from, quant) {
                    (Some(f), _) => f(tmp, dst),
                    (None, Some(q)) => q(tmp, dst, ne0, None)?,
                    _ => {
                        return Err(Error::ty(
                            "set_rows",
                            format!("cannot write {} rows", d.dtype),
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}
