//! Reductions and sorting (ggml's ops.cpp): sum, sum_rows, mean, cumsum, argmax, count_equal,
//! argsort, top_k. Row-wise ops split rows between workers; sum runs on worker 0 (as ggml);
//! count_equal counts per worker into the work buffer and adds the counts in a second phase.

use super::{NodeCtx, split, unravel_row};
use crate::dtype::DType;
use crate::error::Result;
use crate::graph::SortOrder;
use crate::ops::node::ExecNode;
use std::cmp::Ordering;

/// count_equal's work buffer: one count per thread.
pub(crate) fn count_equal_work_size(_node: &ExecNode, nth: usize) -> usize {
    nth * 8
}

/// top_k's work buffer: an index scratch row per thread.
pub(crate) fn top_k_work_size(node: &ExecNode, nth: usize) -> usize {
    let n = node.src[0].as_ref().map_or(0, |a| a.ne[0]);
    nth * crate::ops::node::align_up(n * 4, 64)
}

/// Sum of all elements (ggml_compute_forward_sum): F32 rows summed in f64 into an f64 total;
/// F16 rows summed in f32 into an f32 total, as ggml.
pub(crate) fn sum(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    if ith != 0 {
        return Ok(());
    }
    let (a, d) = (ctx.src(0), ctx.dst());
    let (mut s64, mut s32) = (0f64, 0f32);
    // Rows of no elements add nothing; an empty [0, 2^40] has 2^40 of them to walk.
    let rows = if a.ne[0] == 0 { 0 } else { a.nrows() };
    for r in 0..rows {
        let (i1, i2, i3) = unravel_row(r, &a.ne);
        let (mut r64, mut r32) = (0f64, 0f32);
        for i0 in 0..a.ne[0] {
            let v = a.load(i0, i1, i2, i3);
            r64 += v as f64;
            r32 += v;
        }
        s64 += r64;
        s32 += r32;
    }
    let v = if matches!(a.dtype, DType::F16 | DType::BF16) { s32 } else { s64 as f32 };
    // dst is a one-element tensor of a's type; worker 0 owns its one row.
    debug_assert_eq!(d.nelements(), 1);
    ctx.dst_rows(ith).store(0, 0, v);
    Ok(())
}

/// Per-row f64 sum of row (i1, i2, i3) of the F32 tensor `a`, rounded to f32 (ggml_vec_sum_f32).
fn row_sum(a: &crate::ops::node::TView, i1: usize, i2: usize, i3: usize) -> f32 {
    let mut s = 0f64;
    for i0 in 0..a.ne[0] {
        s += a.get::<f32>(i0, i1, i2, i3) as f64;
    }
    s as f32
}

/// sum_rows and mean: [n, a, b, c] -> [1, a, b, c].
pub(crate) fn sum_rows(ctx: &NodeCtx<'_>, ith: usize, mean: bool) -> Result<()> {
    let a = ctx.src(0);
    let mut rows = ctx.dst_rows(ith);
    for r in rows.range() {
        // dst's rows map one to one onto a's.
        let (i1, i2, i3) = r.i();
        let mut s = row_sum(a, i1, i2, i3);
        if mean {
            s /= a.ne[0] as f32;
        }
        rows.out::<f32>(r).set(0, s);
    }
    Ok(())
}

/// Running f32 sum along each row (ggml_vec_cumsum_f32).
pub(crate) fn cumsum(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (a, d) = (ctx.src(0), ctx.dst());
    let mut rows = ctx.dst_rows(ith);
    for r in rows.range() {
        let (i1, i2, i3) = r.i();
        let mut out = rows.out::<f32>(r);
        let mut acc = 0f32;
        for i0 in 0..d.ne[0] {
            let v = a.get::<f32>(i0, i1, i2, i3);
            acc = if i0 == 0 { v } else { acc + v };
            out.set(i0, acc);
        }
    }
    Ok(())
}

/// argmax of each row (ggml_vec_argmax_f32: running C MAX, ties and later maxima win).
pub(crate) fn argmax(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (a, d) = (ctx.src(0), ctx.dst());
    let (r0, r1) = split(a.ne[1], ith, ctx.nth);
    for i1 in r0..r1 {
        let mut max = f32::NEG_INFINITY;
        let mut idx = 0i32;
        for i0 in 0..a.ne[0] {
            // a is a matrix (build-time check).
            let x = a.get::<f32>(i0, i1, 0, 0);
            max = if max > x { max } else { x };
            if max == x {
                idx = i0 as i32;
            }
        }
        assert!(i1 < d.ne[0] && d.dtype == DType::I32);
        // SAFETY: dst is I32 [ne1] (build check; aligned like every tensor) and i1 < ne1, so
        // element i1 is inside it; workers split ne1, so no other worker writes it.
        unsafe { (d.ptr.add(i1 * d.nb[0]) as *mut i32).write(idx) };
    }
    Ok(())
}

/// count_equal, phase 0: each worker counts its rows into its work slot; phase 1: worker 0 adds.
pub(crate) fn count_equal(ctx: &NodeCtx<'_>, phase: u8, ith: usize) -> Result<()> {
    let (a, b, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    if phase == 0 {
        // As in `sum`: empty rows count nothing, however many there are.
        let rows = if a.ne[0] == 0 { 0 } else { a.nrows() };
        let (r0, r1) = split(rows, ith, ctx.nth);
        let mut n = 0i64;
        for r in r0..r1 {
            let (i1, i2, i3) = unravel_row(r, &a.ne);
            for i0 in 0..a.ne[0] {
                // a and b share the shape (build-time check); I32 elements.
                n += (a.get::<i32>(i0, i1, i2, i3) == b.get::<i32>(i0, i1, i2, i3)) as i64;
            }
        }
        ctx.scratch::<i64>(ith, 8, 1)[0] = n;
    } else if ith == 0 {
        assert!(ctx.work_len >= ctx.nth * 8);
        let slots = ctx.work as *const i64;
        // SAFETY: the work buffer (64-byte aligned) holds nth i64 slots (asserted); every
        // worker wrote its slot before the barrier between the phases and none writes now.
        let total: i64 = (0..ctx.nth).map(|t| unsafe { slots.add(t).read() }).sum();
        // dst is one I64.
        debug_assert_eq!(d.nelements(), 1);
        ctx.dst_rows(ith).out::<i64>(0).set(0, total);
    }
    Ok(())
}

/// Total order used for sorting: ggml's `<` on values (with -0 == +0), then the index, so that
/// the result does not depend on the sort algorithm. NaNs sort last ascending.
#[inline]
fn cmp_values(x: f32, y: f32) -> Ordering {
    let k = |v: f32| if v == 0.0 { 0.0 } else { v };
    k(x).total_cmp(&k(y))
}

/// Fills `idx` (`a.ne[0]` elements) with 0..n sorted by the values of row (i1, i2, i3) of the
/// F32 tensor `a`.
fn sort_row(
    a: &crate::ops::node::TView,
    i1: usize,
    i2: usize,
    i3: usize,
    idx: &mut [i32],
    order: SortOrder,
) {
    let v = |i: i32| a.get::<f32>(i as usize, i1, i2, i3);
    for (j, x) in idx.iter_mut().enumerate() {
        *x = j as i32;
    }
    idx.sort_unstable_by(|&p, &q| {
        let o = cmp_values(v(p), v(q));
        let o = if order == SortOrder::Desc { o.reverse() } else { o };
        o.then(p.cmp(&q))
    });
}

/// argsort of each row into I32 dst rows (contiguous, fresh).
pub(crate) fn argsort(ctx: &NodeCtx<'_>, ith: usize, order: SortOrder) -> Result<()> {
    let a = ctx.src(0);
    let mut rows = ctx.dst_rows(ith);
    for r in rows.range() {
        // dst is a fresh contiguous I32 tensor of a's shape.
        let (i1, i2, i3) = r.i();
        sort_row(a, i1, i2, i3, rows.row::<i32>(r), order);
    }
    Ok(())
}

/// top_k: the indices of the k largest of each row, largest first, then (as ggml does to stress
/// that the order is not significant) the first two swapped.
pub(crate) fn top_k(ctx: &NodeCtx<'_>, ith: usize, k: usize) -> Result<()> {
    let a = ctx.src(0);
    let n = a.ne[0];
    let tmp = ctx.scratch::<i32>(ith, crate::ops::node::align_up(n * 4, 64), n);
    let mut rows = ctx.dst_rows(ith);
    for r in rows.range() {
        // dst is a fresh contiguous I32 [k, ...] tensor.
        let (i1, i2, i3) = r.i();
        sort_row(a, i1, i2, i3, tmp, SortOrder::Desc);
        let out = rows.row::<i32>(r);
        out.copy_from_slice(&tmp[..k]);
        if k > 1 {
            out.swap(0, 1);
        }
    }
    Ok(())
}
