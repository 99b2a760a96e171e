//! Losses and optimizer steps (ggml's ggml_compute_forward_cross_entropy_loss{,_back} and
//! ggml_compute_forward_opt_step_{adamw,sgd}), split by rows. The loss keeps one partial sum per
//! row in the work buffer and adds them in row order, so it does not depend on the thread count
//! (ggml adds per-thread sums, which does).

use super::{NodeCtx, split, unravel_row};
use crate::error::Result;
use crate::kernels::KernelTable;
use crate::ops::node::{ExecNode, TView, align_up};

/// One f32 partial sum per row, then one scratch row per thread; nothing for rows of no
/// elements (`cross_entropy_loss` skips them).
pub(crate) fn work_size(node: &ExecNode, nth: usize) -> usize {
    match node.src[0].as_ref() {
        Some(a) if a.ne[0] > 0 => align_up(a.nrows() * 4, 64) + nth * align_up(a.ne[0] * 4, 64),
        _ => 0,
    }
}

/// Row `r` of an F32 source with contiguous rows (build check), as a slice.
#[inline(always)]
fn row_f32(t: &TView, r: usize) -> &[f32] {
    let (i1, i2, i3) = unravel_row(r, &t.ne);
    t.row_of::<f32>(i1, i2, i3)
}

/// ggml's per-row term: sum(labels * (logits - max - log(sum(exp(logits - max))))); `st` is
/// scratch of the row's length.
fn loss_row(kt: &KernelTable, x: &[f32], y: &[f32], st: &mut [f32]) -> f32 {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    st.copy_from_slice(x);
    // SAFETY: `st` holds x.len() f32.
    let sum = unsafe { (kt.exp_sub_sum_f32)(st.len(), st.as_mut_ptr(), max) };
    let lse = (sum as f32).ln();
    let mut acc = 0f64;
    for (&v, &l) in x.iter().zip(y) {
        acc += (((v - max) - lse) * l) as f64;
    }
    acc as f32
}

pub(crate) fn cross_entropy_loss(ctx: &NodeCtx<'_>, phase: u8, ith: usize) -> Result<()> {
    let (a, b, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    let nr = a.nrows();
    let sums = ctx.work as *mut f32;
    if a.ne[0] == 0 {
        // Every row's term is an empty sum: the loss is 0 * (-1 / nr), as the loop below gives,
        // without walking (or keeping a partial sum for) rows of no elements.
        if phase == 1 && ith == 0 {
            // SAFETY: dst is an F32 scalar.
            unsafe { *(d.ptr as *mut f32) = 0.0 * (-1.0 / nr as f32) };
        }
        return Ok(());
    }
    debug_assert!(nr * 4 <= ctx.work_len);
    if phase == 0 {
        let stride = align_up(a.ne[0] * 4, 64);
        let off = align_up(nr * 4, 64) + ith * stride;
        debug_assert!(off + stride <= ctx.work_len);
        // SAFETY: the work buffer holds nth scratch rows after the sums (work_size); ours is ith.
        let st = unsafe { std::slice::from_raw_parts_mut(ctx.work.add(off) as *mut f32, a.ne[0]) };
        let (r0, r1) = split(nr, ith, ctx.nth);
        for r in r0..r1 {
            // r < nrows of both (same shape, build check).
            let (x, y) = (row_f32(a, r), row_f32(b, r));
            let s = loss_row(ctx.kt, x, y, st);
            // SAFETY: the work buffer holds nr f32 (work_size); each worker writes its own rows.
            unsafe { *sums.add(r) = s };
        }
        return Ok(());
    }
    if ith == 0 {
        let mut total = 0f64;
        for r in 0..nr {
            // SAFETY: written in phase 0 (a barrier separates the phases), r < nr.
            total += unsafe { *sums.add(r) } as f64;
        }
        let v = total as f32 * (-1.0 / nr as f32);
        // SAFETY: dst is an F32 scalar.
        unsafe { *(d.ptr as *mut f32) = v };
    }
    Ok(())
}

pub(crate) fn cross_entropy_loss_back(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (g, a, b) = (ctx.src(0), ctx.src(1), ctx.src(2));
    let nr = a.nrows();
    // grad is an F32 scalar (build check).
    let d_by_nr = g.get::<f32>(0, 0, 0, 0) / nr as f32;
    let kt = ctx.kt;
    let nc = a.ne[0];
    let mut rows = ctx.dst_rows(ith);
    for r in rows.range() {
        // All three are contiguous with the same shape (build check); dst is a fresh node.
        let (x, y, out) = (row_f32(a, r.r()), row_f32(b, r.r()), rows.row::<f32>(r));
        let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        out.copy_from_slice(x);
        // SAFETY: `out` holds nc f32.
        let sum = unsafe { (kt.exp_sub_sum_f32)(nc, out.as_mut_ptr(), max) };
        let inv = (1.0 / sum) as f32;
        for (o, &l) in out.iter_mut().zip(y) {
            *o = (*o * inv - l) * d_by_nr;
        }
    }
    Ok(())
}

pub(crate) fn opt_step_adamw(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (w, g, m, v, pp) = (ctx.src(0), ctx.src(1), ctx.src(2), ctx.src(3), ctx.src(4));
    // adamw_params is a contiguous F32 tensor of 7 values (build check).
    let p = &pp.as_slice::<f32>()[..7];
    let (alpha, beta1, beta2, eps, wd, beta1h, beta2h) = (p[0], p[1], p[2], p[3], p[4], p[5], p[6]);
    let keep = 1.0 - alpha * wd;
    let nc = w.ne[0];
    let (r0, r1) = split(w.nrows(), ith, ctx.nth);
    for r in r0..r1 {
        let (i1, i2, i3) = unravel_row(r, &w.ne);
        // SAFETY: the four tensors share one shape with contiguous rows (build check); params, m
        // and v are distinct non-overlapping state ranges and grad does not overlap them (build
        // check), so these slices do not alias; each worker owns its rows.
        let (ws, gs, ms, vs) = unsafe {
            (
                std::slice::from_raw_parts_mut(w.row(i1, i2, i3) as *mut f32, nc),
                std::slice::from_raw_parts(g.row(i1, i2, i3) as *const f32, nc),
                std::slice::from_raw_parts_mut(m.row(i1, i2, i3) as *mut f32, nc),
                std::slice::from_raw_parts_mut(v.row(i1, i2, i3) as *mut f32, nc),
            )
        };
        for i in 0..nc {
            let gi = gs[i];
            ms[i] = ms[i] * beta1 + gi * (1.0 - beta1);
            vs[i] = vs[i] * beta2 + gi * gi * (1.0 - beta2);
            let mh = ms[i] * beta1h;
            let vh = (vs[i] * beta2h).sqrt() + eps;
            ws[i] = ws[i] * keep - alpha * mh / vh;
        }
    }
    Ok(())
}

pub(crate) fn opt_step_sgd(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (w, g, pp) = (ctx.src(0), ctx.src(1), ctx.src(2));
    // sgd_params is a contiguous F32 tensor of 2 values (build check).
    let p = &pp.as_slice::<f32>()[..2];
    let alpha = p[0];
    let keep = 1.0 - alpha * p[1];
    let nc = w.ne[0];
    let (r0, r1) = split(w.nrows(), ith, ctx.nth);
    for r in r0..r1 {
        let (i1, i2, i3) = unravel_row(r, &w.ne);
        // SAFETY: same shapes with contiguous rows; grad does not overlap the params (build
        // check); each worker owns its rows.
        let (ws, gs) = unsafe {
            (
                std::slice::from_raw_parts_mut(w.row(i1, i2, i3) as *mut f32, nc),
                std::slice::from_raw_parts(g.row(i1, i2, i3) as *const f32, nc),
            )
        };
        for (wi, &gi) in ws.iter_mut().zip(gs) {
            *wi = *wi * keep - alpha * gi;
        }
    }
    Ok(())
}
