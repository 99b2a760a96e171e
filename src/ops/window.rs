//! SAM-style window and relative-position ops (ggml's ops.cpp): win_part, win_unpart,
//! get_rel_pos (F16) and add_rel_pos (F32). Rows are split over threads.

use super::{NodeCtx, split, unravel_row};
use crate::error::Result;

/// win_part: dst [C, w, w, npx*npy] from src [C, W, H]: window `py*npx + px`, zero outside.
pub(crate) fn win_part(ctx: &NodeCtx<'_>, ith: usize, npx: usize, w: usize) -> Result<()> {
    let (a, d) = (ctx.src(0), ctx.dst());
    let c = d.ne[0];
    let (r0, r1) = split(d.nrows(), ith, ctx.nth);
    for r in r0..r1 {
        let (i1, i2, i3) = unravel_row(r, &d.ne);
        let (px, py) = (i3 % npx, i3 / npx);
        let (x, y) = (px * w + i1, py * w + i2);
        // SAFETY: own dst row of c contiguous f32 (fresh tensor); the source row is read only
        // when (x, y) is inside a's dims 1 and 2 (rows contiguous: F32 type checked at build).
        unsafe {
            let dst = d.row(i1, i2, i3) as *mut f32;
            if x < a.ne[1] && y < a.ne[2] {
                let src = a.row(x, y, 0) as *const u8;
                for i in 0..c {
                    dst.add(i).write((src.add(i * a.nb[0]) as *const f32).read_unaligned());
                }
            } else {
                std::ptr::write_bytes(dst, 0, c);
            }
        }
    }
    Ok(())
}

/// win_unpart: dst [C, w0, h0] from windows src [C, w, w, np].
pub(crate) fn win_unpart(ctx: &NodeCtx<'_>, ith: usize, w: usize) -> Result<()> {
    let (a, d) = (ctx.src(0), ctx.dst());
    let c = d.ne[0];
    let npx = d.ne[1].div_ceil(w);
    let (r0, r1) = split(d.nrows(), ith, ctx.nth);
    for r in r0..r1 {
        let (i1, i2, _) = unravel_row(r, &d.ne);
        let win = (i2 / w) * npx + i1 / w;
        // SAFETY: own dst row; the window index is below a.ne[3] and (i1 % w, i2 % w) below
        // a's dims 1, 2 (build checks: a is [C, w, w, >= npx*npy]).
        unsafe {
            let dst = d.row(i1, i2, 0) as *mut f32;
            let src = a.row(i1 % w, i2 % w, win) as *const u8;
            for i in 0..c {
                dst.add(i).write((src.add(i * a.nb[0]) as *const f32).read_unaligned());
            }
        }
    }
    Ok(())
}

/// get_rel_pos: dst[:, k, q] = a[:, (kh - 1 - k) + q] (F16 bits copied).
pub(crate) fn get_rel_pos(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (a, d) = (ctx.src(0), ctx.dst());
    let (c, kh) = (d.ne[0], d.ne[1]);
    let (r0, r1) = split(d.nrows(), ith, ctx.nth);
    for r in r0..r1 {
        let (k, q, _) = unravel_row(r, &d.ne);
        let pos = kh - 1 - k + q;
        // SAFETY: pos <= 2*kh - 2 < a.ne[1] (build check qh == kh, a.ne[1] == 2*qh - 1); rows
        // are contiguous F16 or BF16, 2 * c bytes, and dst has a's type (build check); own dst
        // row.
        unsafe { std::ptr::copy_nonoverlapping(a.row(pos, 0, 0), d.row(k, q, 0), 2 * c) };
    }
    Ok(())
}

/// add_rel_pos: out[kh*W + kw, r] = a[kh*W + kw, r] + ph[kh, r] + pw[kw, r], the two additions
/// in the order ggml's loop makes them (ph first when kh <= kw).
pub(crate) fn add_rel_pos(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (a, pw, ph, d) = (ctx.src(0), ctx.src(1), ctx.src(2), ctx.dst());
    let wd = pw.ne[0];
    let (r0, r1) = split(d.nrows(), ith, ctx.nth);
    for r in r0..r1 {
        let (i1, i2, i3) = unravel_row(r, &d.ne);
        // SAFETY: all four tensors are contiguous F32 (build check); row r of a / dst holds W*W
        // values and pw / ph hold W values per row r (pw.ne[1]*pw.ne[2] == a.ne[1],
        // pw.ne[3] == a.ne[2]). Each element is read before the same element is written, so
        // running in place is exact aliasing.
        unsafe {
            let (sa, sd) = (a.row(i1, i2, i3) as *const f32, d.row(i1, i2, i3) as *mut f32);
            let pwr = (pw.ptr as *const f32).add(r * wd);
            let phr = (ph.ptr as *const f32).add(r * wd);
            for k1 in 0..wd {
                let h = *phr.add(k1);
                for k0 in 0..wd {
                    let e = k1 * wd + k0;
                    let v = *sa.add(e);
                    let w = *pwr.add(k0);
                    *sd.add(e) = if k1 <= k0 { (v + h) + w } else { (v + w) + h };
                }
            }
        }
    }
    Ok(())
}
