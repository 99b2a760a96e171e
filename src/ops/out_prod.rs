//! out_prod: `dst[:, j, i2, i3] = sum_l a[:, l, i2 / r2, i3 / r3] * b[j, l, i2, i3]` (ggml's
//! ggml_compute_forward_out_prod), for F32, F16 and quantized `a` (dequantized row by row).
//!
//! Threads split dst's rows `(j, i2, i3)` with `split`. Each dst row is produced by one thread,
//! accumulating over `l` in increasing order with the tier's `mad` kernel, so results do not depend
//! on the thread count. Rows are taken in blocks of one batch so that a dequantized row of `a`
//! serves the whole block.

use super::{NodeCtx, get_rows::row_converter, split};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::node::{ExecNode, align_up};

/// dst rows that share each converted row of `a`.
const BLOCK: usize = 16;

fn scratch_stride(node: &ExecNode) -> usize {
    node.src[0].as_ref().map_or(0, |a| align_up(a.ne[0] * 4, 64))
}

pub(crate) fn work_size(node: &ExecNode, nth: usize) -> usize {
    nth * scratch_stride(node)
}

pub(crate) fn compute(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (a, b, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    let table = ctx.kt;
    let conv = row_converter(ctx.kt, a.dtype).ok_or_else(|| Error::Unsupported {
        op: "out_prod",
        backend: "CPU".into(),
        msg: format!("no f32 conversion for {}", a.dtype),
    })?;
    let (m, n, k) = (d.ne[0], d.ne[1], a.ne[1]);
    // max(1): an empty a (dims 2, 3 of 0) has an empty dst and no rows to walk.
    let (dps2, dps3) = (d.ne[2] / a.ne[2].max(1), d.ne[3] / a.ne[3].max(1));
    let a_row_bytes = a.dtype.row_bytes(m);
    let nr = n * d.ne[2] * d.ne[3];
    let (r0, r1) = split(nr, ith, ctx.nth);
    debug_assert!((ith + 1) * scratch_stride(ctx.node) <= ctx.work_len);
    // SAFETY: the work buffer holds one `scratch_stride` slice per thread (work_size), 64-byte
    // aligned; this worker uses only its own.
    let scratch = unsafe {
        std::slice::from_raw_parts_mut(ctx.work.add(ith * scratch_stride(ctx.node)) as *mut f32, m)
    };
    let mut r = r0;
    while r < r1 {
        let (j0, i2, i3) = (r % n, (r / n) % d.ne[2], r / (n * d.ne[2]));
        // A block never crosses a batch, so all its rows read the same matrix of `a`.
        let j1 = (j0 + BLOCK).min(n).min(j0 + (r1 - r));
        // SAFETY: j < n, i2 < d.ne[2], i3 < d.ne[3]; dst is a fresh contiguous F32 tensor, and rows
        // r..r + (j1 - j0) are this worker's (split).
        let dst_row =
            |j: usize| unsafe { std::slice::from_raw_parts_mut(d.row(j, i2, i3) as *mut f32, m) };
        for j in j0..j1 {
            dst_row(j).fill(0.0);
        }
        for l in 0..k {
            // SAFETY: l < k = a.ne[1]; i2 / dps2 < a.ne[2] and i3 / dps3 < a.ne[3] (broadcast
            // checked at build); a's rows are contiguous (build check), `a_row_bytes` long.
            let ar =
                unsafe { std::slice::from_raw_parts(a.row(l, i2 / dps2, i3 / dps3), a_row_bytes) };
            let row: &[f32] = match a.dtype {
                DType::F32
                    if (ar.as_ptr() as usize).is_multiple_of(std::mem::align_of::<f32>()) =>
                {
                    // SAFETY: aligned, m contiguous f32 (a_row_bytes == 4 * m).
                    unsafe { std::slice::from_raw_parts(ar.as_ptr() as *const f32, m) }
                }
                _ => {
                    conv(ar, scratch);
                    scratch
                }
            };
            for j in j0..j1 {
                // SAFETY: j < n = b.ne[0], l < b.ne[1], (i2, i3) < b's dims 2, 3 (dst's shape is
                // b's); the plan validated b's extent for any strides.
                let s = unsafe {
                    (b.ptr.add(j * b.nb[0] + l * b.nb[1] + i2 * b.nb[2] + i3 * b.nb[3])
                        as *const f32)
                        .read_unaligned()
                };
                (table.mad_f32)(dst_row(j), row, s);
            }
        }
        r += j1 - j0;
    }
    Ok(())
}
