//! pool_1d and pool_2d on F32 / F16 inputs with F32 results (ggml's ops.cpp): max starts from
//! `-f32::MAX`; pool_1d's average divides by the in-range count, pool_2d's by `k0 * k1`. ggml runs
//! these on one thread; here output rows are split over threads (each element has one owner and
//! one fixed summation order).

use super::{NodeCtx, TView};
use crate::dtype::DType;
use crate::error::Result;
use crate::graph::PoolOp;
use crate::quant::util::fp16_to_fp32;

/// Row (i1, i2, i3) of `a` as f32 or F16 bits (rows are contiguous, build check); the other
/// slice is empty.
#[inline(always)]
fn row<const F32: bool>(a: &TView, i1: usize, i2: usize, i3: usize) -> (&[f32], &[u16]) {
    if F32 { (a.row_of::<f32>(i1, i2, i3), &[]) } else { (&[], a.row_of::<u16>(i1, i2, i3)) }
}

/// Element `j` of a row from [`row`].
#[inline(always)]
fn at<const F32: bool>(row: (&[f32], &[u16]), j: usize) -> f32 {
    if F32 { row.0[j] } else { fp16_to_fp32(row.1[j]) }
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
    let f32_in = a.dtype == DType::F32;
    let mut rows = ctx.dst_rows(ith);
    for r in rows.range() {
        // The row indices are below both shapes (same dims 1..3); dst is a fresh F32 tensor.
        let (i1, i2, i3) = r.i();
        let src = if f32_in { row::<true>(a, i1, i2, i3) } else { row::<false>(a, i1, i2, i3) };
        let dst = rows.row::<f32>(r);
        for ow in 0..d.ne[0] {
            let base = (ow * s) as i64 - p as i64;
            let mut res = if op == PoolOp::Max { -f32::MAX } else { 0.0 };
            let mut count = 0u32;
            for ki in 0..k as i64 {
                let j = base + ki;
                if !(0..iw).contains(&j) {
                    continue;
                }
                let j = j as usize;
                let v = if f32_in { at::<true>(src, j) } else { at::<false>(src, j) };
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
            dst[ow] = res;
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
    let (a, d) = (ctx.src(0), ctx.dst());
    // ggml stores the float padding in an int32 parameter: truncation.
    let (p0, p1) = (p[0] as i64, p[1] as i64);
    let (iw, ih) = (a.ne[0] as i64, a.ne[1] as i64);
    let ka = (k[0] * k[1]) as f32;
    let mut rows = ctx.dst_rows(ith);
    for r in rows.range() {
        // dst is a fresh F32 tensor.
        let (oy, i2, i3) = r.i();
        let dst = rows.row::<f32>(r);
        let iy = (oy * s[1]) as i64 - p1;
        for ox in 0..d.ne[0] {
            let ix = (ox * s[0]) as i64 - p0;
            let mut res = if op == PoolOp::Max { -f32::MAX } else { 0.0 };
            for ky in 0..k[1] as i64 {
                let y = iy + ky;
                if !(0..ih).contains(&y) {
                    continue;
                }
                // 0 <= y < ne[1], (i2, i3) shared with dst.
                let src = row::<F32>(a, y as usize, i2, i3);
                for kx in 0..k[0] as i64 {
                    let x = ix + kx;
                    if !(0..iw).contains(&x) {
                        continue;
                    }
                    let v = at::<F32>(src, x as usize);
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
            dst[ox] = res;
        }
    }
    Ok(())
}
