//! set_rows: dst[ids[i]] = from_float(b[i]) (ggml's ggml_compute_forward_set_rows). Each worker
//! owns a range of destination rows and scans every id in order, so with repeated ids the last one
//! wins whatever the thread count.

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
    let stride = align_up(ne0 * 4, 64);
    // SAFETY: the work buffer holds nth rows of ne0 f32 (work_size); this one is ours.
    let tmp =
        unsafe { std::slice::from_raw_parts_mut(ctx.work.add(ith * stride) as *mut f32, ne0) };
    let kt = ctx.kt;
    let from = kt.activation_converter(d.dtype);
    let quant = crate::quant::format(d.dtype).quantize;
    let (r0, r1) = split(d.ne[1], ith, ctx.nth);
    let out_bytes = d.dtype.row_bytes(ne0);
    for i3 in 0..b.ne[3] {
        for i2 in 0..b.ne[2] {
            for i in 0..b.ne[1] {
                // SAFETY: i < ids.ne[0]; dims 2, 3 reduced modulo ids' (divisibility checked).
                let id = unsafe {
                    let p = ids.row(i2 % ids.ne[1], i3 % ids.ne[2], 0).add(i * ids.nb[0]);
                    if ids.dtype == DType::I64 {
                        (p as *const i64).read_unaligned()
                    } else {
                        (p as *const i32).read_unaligned() as i64
                    }
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
                // SAFETY: i < b.ne[1]; (i2, i3) below b's and dst's dims 2, 3 (equal, checked);
                // row < dst.ne[1]; rows contiguous (checked); rows in [r0, r1) belong to this
                // worker only.
                unsafe {
                    let pb = b.row(i, i2, i3);
                    if b.dtype == DType::F16 && d.dtype == DType::F16 {
                        std::ptr::copy_nonoverlapping(pb, d.row(row, i2, i3), out_bytes);
                        continue;
                    }
                    if b.dtype == DType::F16 {
                        for (k, t) in tmp.iter_mut().enumerate() {
                            *t = crate::quant::util::fp16_to_fp32(
                                (pb as *const u16).add(k).read_unaligned(),
                            );
                        }
                    } else {
                        tmp.copy_from_slice(std::slice::from_raw_parts(pb as *const f32, ne0));
                    }
                    let dst = std::slice::from_raw_parts_mut(d.row(row, i2, i3), out_bytes);
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
    }
    Ok(())
}
