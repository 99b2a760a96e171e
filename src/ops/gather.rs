//! Gather-style data movement: concat, repeat, pad (zero / circular), pad_reflect_1d, roll. Each
//! output element is copied from one source element (or set to zero), any element type of block
//! size 1; and repeat_back, arange, timestep_embedding.

use super::{NodeCtx, split, unravel_row};
use crate::error::Result;
use crate::graph::Gather;

pub(crate) fn compute(ctx: &NodeCtx<'_>, ith: usize, g: &Gather) -> Result<()> {
    let d = ctx.dst();
    let a = ctx.src(0);
    let ts = d.dtype.type_size();
    let (r0, r1) = split(d.nrows(), ith, ctx.nth);
    for r in r0..r1 {
        let (i1, i2, i3) = unravel_row(r, &d.ne);
        for i0 in 0..d.ne[0] {
            let o = [i0, i1, i2, i3];
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
            // SAFETY: o is below dst's shape; every source index computed above is below that
            // source's shape (reduced modulo, offset within bounds, or reflected inside by the
            // build-time limits); extents validated at plan time; each worker writes its own rows.
            unsafe {
                let dp = d.ptr.add(i0 * d.nb[0] + i1 * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3]);
                match src {
                    Some((s, j)) => {
                        let sp = s
                            .ptr
                            .add(j[0] * s.nb[0] + j[1] * s.nb[1] + j[2] * s.nb[2] + j[3] * s.nb[3]);
                        std::ptr::copy_nonoverlapping(sp, dp, ts);
                    }
                    None => std::ptr::write_bytes(dp, 0, ts),
                }
            }
        }
    }
    Ok(())
}

/// Sum of every tile of src0 that lands on each output element, tiles in order.
pub(crate) fn repeat_back(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (a, d) = (ctx.src(0), ctx.dst());
    let reps = [a.ne[0] / d.ne[0], a.ne[1] / d.ne[1], a.ne[2] / d.ne[2], a.ne[3] / d.ne[3]];
    let (r0, r1) = split(d.nrows(), ith, ctx.nth);
    for r in r0..r1 {
        let (i1, i2, i3) = unravel_row(r, &d.ne);
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
                            // SAFETY: j is below a's shape (a = tiles of dst's shape).
                            s += unsafe {
                                *(a.ptr.add(
                                    j[0] * a.nb[0]
                                        + j[1] * a.nb[1]
                                        + j[2] * a.nb[2]
                                        + j[3] * a.nb[3],
                                ) as *const f32)
                            };
                        }
                    }
                }
            }
            // SAFETY: (i0..i3) below dst's shape; own rows.
            unsafe { *(d.row(i1, i2, i3).add(i0 * 4) as *mut f32) = s };
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
    let (r0, r1) = split(t.ne[0], ith, ctx.nth);
    for i in r0..r1 {
        // SAFETY: i < n timesteps (contiguous F32, build check); dst row i holds dim floats; own rows.
        unsafe {
            let ts = *(t.ptr as *const f32).add(i);
            let e = d.row(i, 0, 0) as *mut f32;
            for j in 0..half {
                let freq = (-(max_period as f32).ln() * j as f32 / half as f32).exp();
                let arg = ts * freq;
                *e.add(j) = arg.cos();
                *e.add(j + half) = arg.sin();
            }
            if !dim.is_multiple_of(2) {
                *e.add(2 * half) = 0.0;
            }
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
    let (a, b, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    let ts = d.dtype.type_size();
    if phase == 0 {
        if a.ptr != d.ptr {
            let bytes = d.nelements() * ts;
            let (s0, s1) = split(bytes, ith, ctx.nth);
            // SAFETY: a and dst are contiguous with the same shape (build check), so both span
            // `bytes`; workers copy disjoint byte ranges.
            unsafe { std::ptr::copy_nonoverlapping(a.ptr.add(s0), d.ptr.add(s0), s1 - s0) };
        }
        return Ok(());
    }
    let (r0, r1) = split(b.nrows(), ith, ctx.nth);
    for r in r0..r1 {
        let (i1, i2, i3) = unravel_row(r, &b.ne);
        for i0 in 0..b.ne[0] {
            // SAFETY: the build-time check put the whole view (offset + extent with these
            // strides) inside dst; b's indices are below its shape; rows of b are disjoint per
            // worker and map to distinct view elements.
            unsafe {
                let dp = d.ptr.add(offset + i0 * ts + i1 * nb[0] + i2 * nb[1] + i3 * nb[2]);
                let sp = b.ptr.add(i0 * b.nb[0] + i1 * b.nb[1] + i2 * b.nb[2] + i3 * b.nb[3]);
                std::ptr::copy_nonoverlapping(sp, dp, ts);
            }
        }
    }
    Ok(())
}
