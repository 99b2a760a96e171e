//! cpy / dup / cont / cast: plain types (F32, F16, BF16, I32) element by element in logical order
//! with any layouts; block types row by row through f32 (dequantize, then ggml's CPU `from_float`
//! or reference quantizer), or as raw bytes when both sides have the same type.

use super::elementwise::{ld, st};
use super::{NodeCtx, split, unravel_row};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::KernelTable;
use crate::ops::node::{ExecNode, align_up};

fn row_path(node: &ExecNode) -> bool {
    match (node.src[0].as_ref(), Some(&node.dst)) {
        (Some(a), Some(d)) => {
            a.dtype != d.dtype && !(crate::graph::plain(a.dtype) && crate::graph::plain(d.dtype))
        }
        _ => false,
    }
}

pub(crate) fn work_size(node: &ExecNode, nth: usize) -> usize {
    if row_path(node) { nth * align_up(node.dst.ne[0] * 4, 64) } else { 0 }
}

/// Writes a row of f32 values as `dt`: plain types element by element, block types through the
/// table `kt`'s CPU `from_float` (ggml's) or else the reference quantizer. `dst` holds
/// exactly one row of `src.len()` elements of `dt`.
pub(crate) fn store_row(
    kt: &KernelTable,
    op: &'static str,
    dt: DType,
    src: &[f32],
    dst: &mut [u8],
) -> Result<()> {
    if dt.block_size() == 1 {
        let ts = dt.type_size();
        debug_assert!(dst.len() >= src.len() * ts);
        for (i, &v) in src.iter().enumerate() {
            // SAFETY: dst holds src.len() elements of ts bytes (the contract).
            unsafe { st(dst.as_mut_ptr().add(i * ts), dt, v) };
        }
        Ok(())
    } else if let Some(ff) = kt.activation_converter(dt) {
        ff(src, dst);
        Ok(())
    } else if let Some(q) = crate::quant::format(dt).quantize {
        q(src, dst, src.len(), None)?;
        Ok(())
    } else {
        Err(Error::ty(op, format!("cannot write {dt} rows")))
    }
}

pub(crate) fn compute(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (a, d) = (ctx.src(0), ctx.dst());
    let (r0, r1) = split(a.nrows(), ith, ctx.nth);
    if a.dtype == d.dtype && a.dtype.block_size() > 1 {
        let bytes = a.dtype.row_bytes(a.ne[0]);
        for r in r0..r1 {
            let (i1, i2, i3) = unravel_row(r, &a.ne);
            let (j1, j2, j3) = unravel_row(r, &d.ne);
            // SAFETY: both tensors have the same row count and row length (build check); indices
            // are in range; rows of `bytes` validated; each worker copies its own rows.
            unsafe { std::ptr::copy_nonoverlapping(a.row(i1, i2, i3), d.row(j1, j2, j3), bytes) };
        }
        return Ok(());
    }
    if row_path(ctx.node) {
        let ne0 = a.ne[0];
        let stride = align_up(ne0 * 4, 64);
        debug_assert!((ith + 1) * stride <= ctx.work_len);
        // SAFETY: the work buffer holds nth rows of ne0 f32 (work_size); this one is ours.
        let tmp =
            unsafe { std::slice::from_raw_parts_mut(ctx.work.add(ith * stride) as *mut f32, ne0) };
        let to_f32 = super::get_rows::row_converter(ctx.kt, a.dtype);
        let from_f32 = ctx.kt.activation_converter(d.dtype);
        let (sa, sd) = (a.dtype.row_bytes(ne0), d.dtype.row_bytes(ne0));
        for r in r0..r1 {
            let (i1, i2, i3) = unravel_row(r, &a.ne);
            let (j1, j2, j3) = unravel_row(r, &d.ne);
            // SAFETY: equal row counts and lengths, contiguous rows (build check); own rows only;
            // an F32 row is read as ne0 f32 only when its address is 4-byte aligned (checked).
            unsafe {
                let src = std::slice::from_raw_parts(a.row(i1, i2, i3), sa);
                if let (DType::F32, Some(ff)) = (a.dtype, from_f32) {
                    // F32 rows go to the CPU quantizer as they are (no copy into the scratch
                    // row): the same input values, so the same bytes.
                    if (src.as_ptr() as usize).is_multiple_of(4) && d.dtype.block_size() > 1 {
                        let dst = std::slice::from_raw_parts_mut(d.row(j1, j2, j3), sd);
                        ff(std::slice::from_raw_parts(src.as_ptr() as *const f32, ne0), dst);
                        continue;
                    }
                }
                match to_f32 {
                    Some(c) => c(src, tmp),
                    None => {
                        return Err(Error::ty("cpy", format!("cannot read {} rows", a.dtype)));
                    }
                }
                let dst = std::slice::from_raw_parts_mut(d.row(j1, j2, j3), sd);
                store_row(ctx.kt, "cpy", d.dtype, tmp, dst)?;
            }
        }
        return Ok(());
    }
    let same = a.dtype == d.dtype;
    let ts = a.dtype.type_size();
    let ne0 = a.ne[0];
    for r in r0..r1 {
        let (i1, i2, i3) = unravel_row(r, &a.ne);
        // Flat index of the row's first element, mapped into dst's shape.
        let mut k = r * ne0;
        let mut j = [0usize; 4];
        j[0] = k % d.ne[0];
        k /= d.ne[0];
        j[1] = k % d.ne[1];
        k /= d.ne[1];
        j[2] = k % d.ne[2];
        j[3] = k / d.ne[2];
        // SAFETY: a's indices are below its ne; j walks dst's shape in order and stays below its
        // ne because both tensors have the same number of elements; extents validated at plan
        // time. Each worker writes the dst elements of its own src rows (disjoint flat ranges).
        unsafe {
            let pa = a.row(i1, i2, i3);
            for i0 in 0..ne0 {
                let sp = pa.add(i0 * a.nb[0]);
                let dp =
                    d.ptr.add(j[0] * d.nb[0] + j[1] * d.nb[1] + j[2] * d.nb[2] + j[3] * d.nb[3]);
                if same {
                    std::ptr::copy_nonoverlapping(sp, dp, ts);
                } else {
                    st(dp, d.dtype, ld(sp, a.dtype));
                }
                j[0] += 1;
                if j[0] == d.ne[0] {
                    j[0] = 0;
                    j[1] += 1;
                    if j[1] == d.ne[1] {
                        j[1] = 0;
                        j[2] += 1;
                        if j[2] == d.ne[2] {
                            j[2] = 0;
                            j[3] += 1;
                        }
                    }
                }
            }
        }
    }
    Ok(())
}
