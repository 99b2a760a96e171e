//! pool_1d and pool_2d on F32 / F16 inputs with F32 results (ggml's ops.cpp): max starts from
//! `-f32::MAX`; pool_1d's average divides by the in-range count, pool_2d's by `k0 * k1`. ggml runs
//! these on one thread; here output rows are split over threads (each element has one owner and
//! one fixed summation order).

use super::{NodeCtx, split, unravel_row};
use crate::dtype::DType;
use crate::error::Result;
use crate::graph::PoolOp;
use crate::quant::util::fp16_to_fp32;

/// Element `j` of a row of `dt` (F32 or F16).
///
/// # Safety
/// `row` is valid for `j + 1` elements of `dt`.
#[inline(always)]
unsafe fn at(row: *const u8, dt: DType, j: usize) -> f32 {
    // SAFETY: per the contract; unaligned because views can start anywhere.
    unsafe {
        if dt == DType::F32 {
            (row.add(4 * j) as *const f32).read_unaligned()
        } else {
            fp16_to_fp32((row.add(2 * j) as *const u16).read_unaligned())
        }
    }
}

pub(crate) fn pool_1d(
    ctx: &NodeCtx<'_>,
    ith: usize,
    op: PoolOp,
    k: usize,
    s: usize,
    p: usize,
) -> Result<()> {
    let (a, d) = (ctx.src(0), ctx.dst());
    let iw = a.ne[0] as i64;
    let (r0, r1) = split(d.nrows(), ith, ctx.nth);
    for r in r0..r1 {
        let (i1, i2, i3) = unravel_row(r, &d.ne);
        // SAFETY: the row indices are below both shapes (same dims 1..3); own rows only.
        let (src, dst) = unsafe { (a.row(i1, i2, i3) as *const u8, d.row(i1, i2, i3) as *mut f32) };
        for ow in 0..d.ne[0] {
            let base = (ow * s) as i64 - p as i64;
            let mut res = if op == PoolOp::Max { -f32::MAX } else { 0.0 };
            let mut count = 0u32;
            for ki in 0..k as i64 {
                let j = base + ki;
                if !(0..iw).contains(&j) {
                    continue;
                }
                // SAFETY: 0 <= j < ne[0]; rows are contiguous (build check).
                let v = unsafe { at(src, a.dtype, j as usize) };
                match op {
                    PoolOp::Avg => res += v,
                    // std::max(v, res) as ggml: NaN inputs propagate.
                    PoolOp::Max => res = if v < res { res } else { v },
                }
                count += 1;
            }
            if op == PoolOp::Avg {
                res = if count > 0 { res / count as f32 } else { 0.0 };
            }
            // SAFETY: ow < dst.ne[0] in a contiguous row this worker owns.
            unsafe { dst.add(ow).write_unaligned(res) };
        }
    }
    Ok(())
}

pub(crate) fn pool_2d(
    ctx: &NodeCtx<'_>,
    ith: usize,
    op: PoolOp,
    k: [usize; 2],
    s: [usize; 2],
    p: [f32; 2],
) -> Result<()> {
    // One monomorphised loop per (input type, op): no type or op branch per element.
    match (ctx.src(0).dtype == DType::F32, op) {
        (true, PoolOp::Max) => pool_2d_impl::<true, true>(ctx, ith, k, s, p),
        (true, PoolOp::Avg) => pool_2d_impl::<true, false>(ctx, ith, k, s, p),
        (false, PoolOp::Max) => pool_2d_impl::<false, true>(ctx, ith, k, s, p),
        (false, PoolOp::Avg) => pool_2d_impl::<false, false>(ctx, ith, k, s, p),
    }
}

fn pool_2d_impl<const F32: bool, const MAX: bool>(
    ctx: &NodeCtx<'_>,
    ith: usize,
    k: [usize; 2],
    s: [usize; 2],
    p: [f32; 2],
) -> Result<()> {
    let op = if MAX { PoolOp::Max } else { PoolOp::Avg };
    let dt = if F32 { DType::F32 } else { DType::F16 };
    let (a, d) = (ctx.src(0), ctx.dst());
    // ggml stores the float padding in an int32 parameter: truncation.
    let (p0, p1) = (p[0] as i64, p[1] as i64);
    let (iw, ih) = (a.ne[0] as i64, a.ne[1] as i64);
    let ka = (k[0] * k[1]) as f32;
    let (r0, r1) = split(d.nrows(), ith, ctx.nth);
    for r in r0..r1 {
        let (oy, i2, i3) = unravel_row(r, &d.ne);
        // SAFETY: row indices below dst's shape; own rows only.
        let dst = unsafe { d.row(oy, i2, i3) as *mut f32 };
        let iy = (oy * s[1]) as i64 - p1;
        for ox in 0..d.ne[0] {
            let ix = (ox * s[0]) as i64 - p0;
            let mut res = if op == PoolOp::Max { -f32::MAX } else { 0.0 };
            for ky in 0..k[1] as i64 {
                let y = iy + ky;
                if !(0..ih).contains(&y) {
                    continue;
                }
                // SAFETY: 0 <= y < ne[1], (i2, i3) shared with dst: the row is inside a.
                let src = unsafe { a.row(y as usize, i2, i3) as *const u8 };
                for kx in 0..k[0] as i64 {
                    let x = ix + kx;
                    if !(0..iw).contains(&x) {
                        continue;
                    }
                    // SAFETY: 0 <= x < ne[0]; contiguous rows (build check).
                    let v = unsafe { at(src, dt, x as usize) };
                    match op {
                        PoolOp::Avg => res += v,
                        // std::max(v, res) as ggml: NaN inputs propagate.
                        PoolOp::Max => res = if v < res { res } else { v },
                    }
                }
            }
            if op == PoolOp::Avg {
                res /= ka;
            }
            // SAFETY: ox < dst.ne[0] in a row this worker owns.
            unsafe { dst.add(ox).write_unaligned(res) };
        }
    }
    Ok(())
}
