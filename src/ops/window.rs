//! SAM-style window and relative-position ops (ggml's ops.cpp): win_part, win_unpart,
//! get_rel_pos (F16) and add_rel_pos (F32). Rows are split over threads.

use super::NodeCtx;
use super::node::Row;
use crate::error::Result;

/// win_part: dst [C, w, w, npx*npy] from src [C, W, H]: window `py*npx + px`, zero outside.
pub(crate) fn win_part(ctx: &NodeCtx<'_>, ith: usize, npx: usize, w: usize) -> Result<()> {
    let (a, d) = (ctx.src(0), ctx.dst());
    let c = d.ne[0];
    let mut rows = ctx.dst_rows(ith);
    for r in rows.range() {
        let (i1, i2, i3) = r.i();
        let (px, py) = (i3 % npx, i3 / npx);
        let (x, y) = (px * w + i1, py * w + i2);
        // dst is a fresh F32 tensor; the source row is read only when (x, y) is inside a's
        // dims 1 and 2.
        let dst = rows.row::<f32>(r);
        if x < a.ne[1] && y < a.ne[2] {
            let src = Row::<f32>::new(a, x, y, 0);
            for (i, v) in dst.iter_mut().enumerate().take(c) {
                *v = src.get(i);
            }
        } else {
            dst.fill(0.0);
        }
    }
    Ok(())
}

/// win_unpart: dst [C, w0, h0] from windows src [C, w, w, np].
pub(crate) fn win_unpart(ctx: &NodeCtx<'_>, ith: usize, w: usize) -> Result<()> {
    let (a, d) = (ctx.src(0), ctx.dst());
    let c = d.ne[0];
    let npx = d.ne[1].div_ceil(w);
    let mut rows = ctx.dst_rows(ith);
    for r in rows.range() {
        let (i1, i2, _) = r.i();
        let win = (i2 / w) * npx + i1 / w;
        // The window index is below a.ne[3] and (i1 % w, i2 % w) below a's dims 1, 2 (build
        // checks: a is [C, w, w, >= npx*npy]).
        let src = Row::<f32>::new(a, i1 % w, i2 % w, win);
        for (i, v) in rows.row::<f32>(r).iter_mut().enumerate().take(c) {
            *v = src.get(i);
        }
    }
    Ok(())
}

/// get_rel_pos: dst[:, k, q] = a[:, (kh - 1 - k) + q] (F16 bits copied).
pub(crate) fn get_rel_pos(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (a, d) = (ctx.src(0), ctx.dst());
    let (c, kh) = (d.ne[0], d.ne[1]);
    let mut rows = ctx.dst_rows(ith);
    for r in rows.range() {
        let (k, q, _) = r.i();
        // pos <= 2*kh - 2 < a.ne[1] (build check qh == kh, a.ne[1] == 2*qh - 1); rows are
        // contiguous F16 or BF16 and dst has a's type (build check).
        let pos = kh - 1 - k + q;
        rows.row::<u16>(r)[..c].copy_from_slice(&a.row_of::<u16>(pos, 0, 0)[..c]);
    }
    Ok(())
}

/// add_rel_pos: out[kh*W + kw, r] = a[kh*W + kw, r] + ph[kh, r] + pw[kw, r], the two additions
/// in the order ggml's loop makes them (ph first when kh <= kw).
pub(crate) fn add_rel_pos(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (a, pw, ph) = (ctx.src(0), ctx.src(1), ctx.src(2));
    let wd = pw.ne[0];
    // All four tensors are contiguous F32 (build check); row r of a / dst holds W*W values
    // and pw / ph hold W values per row r (pw.ne[1]*pw.ne[2] == a.ne[1], pw.ne[3] == a.ne[2]).
    let (pw, ph) = (pw.as_slice::<f32>(), ph.as_slice::<f32>());
    let mut rows = ctx.dst_rows(ith);
    for r in rows.range() {
        let (pwr, phr) = (&pw[r.r() * wd..][..wd], &ph[r.r() * wd..][..wd]);
        // In place, each element is read before it is written.
        let mut io = rows.io::<f32>(a, r);
        for k1 in 0..wd {
            let h = phr[k1];
            for k0 in 0..wd {
                let e = k1 * wd + k0;
                let v = io.src(e);
                let w = pwr[k0];
                io.set(e, if k1 <= k0 { (v + h) + w } else { (v + w) + h });
            }
        }
    }
    Ok(())
}
