//! Gather-style data movement: concat, repeat, pad (zero / circular), pad_reflect_1d, roll. Each
//! output element is copied from one source element (or set to zero), any element type of block
//! size 1; and repeat_back, arange, timestep_embedding.

use super::node::Elem;
use super::{NodeCtx, split, unravel_row};
use crate::error::Result;
use crate::graph::Gather;

pub(crate) fn compute(ctx: &NodeCtx<'_>, ith: usize, g: &Gather) -> Result<()> {
    use crate::dtype::DType;
    // Elements are moved as they are, so only their size matters.
    match ctx.dst().dtype.type_size() {
        1 => gather::<i8>(ctx, ith, g),
        2 => gather::<u16>(ctx, ith, g),
        4 if ctx.dst().dtype == DType::I32 => gather::<i32>(ctx, ith, g),
        4 => gather::<f32>(ctx, ith, g),
        8 if ctx.dst().dtype == DType::I64 => gather::<i64>(ctx, ith, g),
        _ => gather::<f64>(ctx, ith, g),
    }
    Ok(())
}

fn gather<T: Elem>(ctx: &NodeCtx<'_>, ith: usize, g: &Gather) {
    let d = ctx.dst();
    let a = ctx.src(0);
    let mut rows = ctx.dst_rows(ith);
    for r in rows.range() {
        let (i1, i2, i3) = r.i();
        let mut out = rows.out::<T>(r);
        for i0 in 0..d.ne[0] {
            let o = [i0, i1, i2, i3];
            // Every source index below is inside that source's shape (reduced modulo, offset
            // within bounds, or reflected inside by the build-time limits).
            let src = match *g {
                Gather::Concat { dim } => {
                    if o[dim] < a.ne[dim] {
                        Some((a, o))
                    } else {
                        let mut j = o;
                        j[dim] -= a.ne[dim];
                        Some((ctx.src(1), j))
                    }
                }
                Gather::Repeat => {
                    Some((a, [i0 % a.ne[0], i1 % a.ne[1], i2 % a.ne[2], i3 % a.ne[3]]))
                }
                Gather::Pad { lp, circular } => {
                    let mut j = [0usize; 4];
                    let mut inside = true;
                    for k in 0..4 {
                        let n = a.ne[k];
                        if o[k] >= lp[k] && o[k] - lp[k] < n {
                            j[k] = o[k] - lp[k];
                        } else if circular && n > 0 {
                            j[k] = (o[k] + n - lp[k] % n) % n;
                        } else {
                            inside = false;
                        }
                    }
                    inside.then_some((a, j))
                }
                Gather::PadReflect1d { p0 } => {
                    let n = a.ne[0] as i64;
                    let mut x = i0 as i64 - p0 as i64;
                    if x < 0 {
                        x = -x;
                    }
                    if x >= n {
                        x = 2 * (n - 1) - x;
                    }
                    Some((a, [x as usize, i1, i2, i3]))
                }
                Gather::Roll { shift } => {
                    let mut j = [0usize; 4];
                    for k in 0..4 {
                        let n = a.ne[k] as i64;
                        j[k] = (o[k] as i64 - shift[k]).rem_euclid(n.max(1)) as usize;
                    }
                    Some((a, j))
                }
            };
            let v = match src {
                Some((s, j)) => s.get::<T>(j[0], j[1], j[2], j[3]),
                None => T::zeroed(),
            };
            out.set(i0, v);
        }
    }
}

/// Sum of every tile of src0 that lands on each output element, tiles in order.
pub(crate) fn repeat_back(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (a, d) = (ctx.src(0), ctx.dst());
    let reps = [a.ne[0] / d.ne[0], a.ne[1] / d.ne[1], a.ne[2] / d.ne[2], a.ne[3] / d.ne[3]];
    let mut rows = ctx.dst_rows(ith);
    for r in rows.range() {
        let (i1, i2, i3) = r.i();
        let mut out = rows.out::<f32>(r);
        for i0 in 0..d.ne[0] {
            let mut s = 0f32;
            for k3 in 0..reps[3] {
                for k2 in 0..reps[2] {
                    for k1 in 0..reps[1] {
                        for k0 in 0..reps[0] {
                            let j = [
                                i0 + k0 * d.ne[0],
                                i1 + k1 * d.ne[1],
                                i2 + k2 * d.ne[2],
                                i3 + k3 * d.ne[3],
                            ];
                            // j is below a's shape (a = tiles of dst's shape).
                            s += a.get::<f32>(j[0], j[1], j[2], j[3]);
                        }
                    }
                }
            }
            out.set(i0, s);
        }
    }
    Ok(())
}

pub(crate) fn arange(ctx: &NodeCtx<'_>, ith: usize, start: f32, step: f32) -> Result<()> {
    let d = ctx.dst();
    let (i0, i1) = split(d.ne[0], ith, ctx.nth);
    for i in i0..i1 {
        // SAFETY: i < ne[0] of a contiguous F32 vector; own range.
        unsafe { *(d.ptr as *mut f32).add(i) = start + step * i as f32 };
    }
    Ok(())
}

pub(crate) fn timestep_embedding(
    ctx: &NodeCtx<'_>,
    ith: usize,
    dim: usize,
    max_period: i32,
) -> Result<()> {
    let (t, d) = (ctx.src(0), ctx.dst());
    let half = dim / 2;
    // One dst row per timestep (contiguous F32 vector, build check).
    debug_assert_eq!(d.nrows(), t.ne[0]);
    let mut rows = ctx.dst_rows(ith);
    for i in rows.range() {
        let ts = t.get::<f32>(i.r(), 0, 0, 0);
        let e = rows.row::<f32>(i);
        for j in 0..half {
            let freq = (-(max_period as f32).ln() * j as f32 / half as f32).exp();
            let arg = ts * freq;
            e[j] = arg.cos();
            e[j + half] = arg.sin();
        }
        if !dim.is_multiple_of(2) {
            e[2 * half] = 0.0;
        }
    }
    Ok(())
}

/// set: phase 0 copies a into dst (unless in place), phase 1 writes b into dst's view.
pub(crate) fn set(
    ctx: &NodeCtx<'_>,
    phase: u8,
    ith: usize,
    nb: [usize; 3],
    offset: usize,
) -> Result<()> {
    let (a, b) = (ctx.src(0), ctx.src(1));
    if phase == 0 {
        if !a.written {
            // a and dst are contiguous with the same shape (build check).
            let mut rows = ctx.dst_rows(ith);
            for r in rows.range() {
                let (i1, i2, i3) = unravel_row(r.r(), &a.ne);
                rows.bytes(r).copy_from_slice(a.row_bytes(i1, i2, i3));
            }
        }
        return Ok(());
    }
    // F32 or I32 (build check); the bits are moved as they are.
    if b.dtype == crate::dtype::DType::I32 {
        set_view::<i32>(ctx, ith, nb, offset);
    } else {
        set_view::<f32>(ctx, ith, nb, offset);
    }
    Ok(())
}

/// set, phase 1: worker `ith`'s rows of b into dst's view (byte strides `nb`, byte `offset`).
fn set_view<T: Elem>(ctx: &NodeCtx<'_>, ith: usize, nb: [usize; 3], offset: usize) {
    let (b, d) = (ctx.src(1), ctx.dst());
    let (r0, r1) = split(b.nrows(), ith, ctx.nth);
    for r in r0..r1 {
        let (i1, i2, i3) = unravel_row(r, &b.ne);
        let off = offset + i1 * nb[0] + i2 * nb[1] + i3 * nb[2];
        for i0 in 0..b.ne[0] {
            let v = b.get::<T>(i0, i1, i2, i3);
            // SAFETY: the build-time check put the whole view (offset + extent with these
            // strides) inside dst, with the offset and strides multiples of the element size
            // (aligned); rows of b are disjoint per worker and map to distinct view elements
            // (checked at build time), so no other worker writes this element.
            unsafe { (d.ptr.add(off + i0 * size_of::<T>()) as *mut T).write(v) };
        }
    }
}
