//! Row normalisations on F32 (ggml's ops.cpp): rms_norm (f64 sum of squares), the fused
//! rms_norm * weight, norm, group_norm and l2_norm.

use super::{NodeCtx, split, unravel_row};
use crate::error::Result;

pub(crate) fn rms_norm(ctx: &NodeCtx<'_>, ith: usize, eps: f32) -> Result<()> {
    let (a, d) = (ctx.src(0), ctx.dst());
    let kt = ctx.kt;
    let ne0 = d.ne[0];
    let (r0, r1) = split(d.nrows(), ith, ctx.nth);
    for r in r0..r1 {
        let (i1, i2, i3) = unravel_row(r, &d.ne);
        // SAFETY: indices below the shared shape; rows validated at plan time; own rows only;
        // every element is read before the same element is written (in place is exact aliasing).
        unsafe {
            let pa = a.row(i1, i2, i3);
            let pd = d.row(i1, i2, i3);
            if a.nb[0] == 4 && d.nb[0] == 4 {
                let sum = (kt.sum_sq_f64)(std::slice::from_raw_parts(pa as *const f32, ne0));
                let scale = 1.0 / ((sum / ne0 as f64) as f32 + eps).sqrt();
                let (xs, ys) = (pa as *const f32, pd as *mut f32);
                for i in 0..ne0 {
                    *ys.add(i) = *xs.add(i) * scale;
                }
                continue;
            }
            let x = |i: usize| *(pa.add(i * a.nb[0]) as *const f32);
            let mut sum = 0f64;
            for i in 0..ne0 {
                let v = x(i);
                sum += (v * v) as f64;
            }
            let mean = (sum / ne0 as f64) as f32;
            let scale = 1.0 / (mean + eps).sqrt();
            for i in 0..ne0 {
                *(pd.add(i * d.nb[0]) as *mut f32) = x(i) * scale;
            }
        }
    }
    Ok(())
}

/// norm on F32 rows (ggml's ggml_compute_forward_norm_f32): f64 sums for the mean and the
/// centred variance, f32 scale.
pub(crate) fn norm(ctx: &NodeCtx<'_>, ith: usize, eps: f32) -> Result<()> {
    let (a, d) = (ctx.src(0), ctx.dst());
    let ne0 = d.ne[0];
    let (r0, r1) = split(d.nrows(), ith, ctx.nth);
    for r in r0..r1 {
        let (i1, i2, i3) = unravel_row(r, &d.ne);
        // SAFETY: indices below the shared shape; own rows; each element of the row is read
        // before the same element is written (in place is exact aliasing).
        unsafe {
            let (pa, pd) = (a.row(i1, i2, i3), d.row(i1, i2, i3));
            let x = |i: usize| (pa.add(i * a.nb[0]) as *const f32).read_unaligned();
            let y = |i: usize| pd.add(i * d.nb[0]) as *mut f32;
            let mut sum = 0f64;
            for i in 0..ne0 {
                sum += x(i) as f64;
            }
            let mean = (sum as f32) / ne0 as f32;
            let mut var = 0f64;
            for i in 0..ne0 {
                let v = x(i) - mean;
                y(i).write_unaligned(v);
                var += (v * v) as f64;
            }
            let variance = (var / ne0 as f64) as f32;
            let scale = 1.0 / (variance + eps).sqrt();
            for i in 0..ne0 {
                y(i).write_unaligned(y(i).read_unaligned() * scale);
            }
        }
    }
    Ok(())
}

/// rms_norm(src0) * src1 in one pass (ggml's RMS_NORM + MUL CPU fusion): y = x * scale * w.
pub(crate) fn rms_norm_mul(ctx: &NodeCtx<'_>, ith: usize, eps: f32) -> Result<()> {
    let (a, w, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    let kt = ctx.kt;
    let ne0 = d.ne[0];
    let (r0, r1) = split(d.nrows(), ith, ctx.nth);
    for r in r0..r1 {
        let (i1, i2, i3) = unravel_row(r, &d.ne);
        // SAFETY: rows of a and w are contiguous F32 (build-time check); w's row indices are
        // reduced modulo its shape; own dst rows; x[i] is read before y[i] is written.
        unsafe {
            let pa = a.row(i1, i2, i3) as *const f32;
            let pw = w.row(i1 % w.ne[1], i2 % w.ne[2], i3 % w.ne[3]) as *const f32;
            let pd = d.row(i1, i2, i3);
            let sum = (kt.sum_sq_f64)(std::slice::from_raw_parts(pa, ne0));
            let mean = (sum / ne0 as f64) as f32;
            let scale = 1.0 / (mean + eps).sqrt();
            if d.nb[0] == 4 {
                let ys = pd as *mut f32;
                for i in 0..ne0 {
                    *ys.add(i) = *pa.add(i) * scale * *pw.add(i);
                }
                continue;
            }
            for i in 0..ne0 {
                (pd.add(i * d.nb[0]) as *mut f32).write_unaligned(*pa.add(i) * scale * *pw.add(i));
            }
        }
    }
    Ok(())
}

/// group_norm (ggml's ggml_compute_forward_group_norm_f32): groups of ceil(ne2 / n_groups)
/// channels, statistics per (group, sample) in f64; work split by groups.
pub(crate) fn group_norm(ctx: &NodeCtx<'_>, ith: usize, n_groups: usize, eps: f32) -> Result<()> {
    let (a, d) = (ctx.src(0), ctx.dst());
    let (ne0, ne1, n_channels) = (d.ne[0], d.ne[1], d.ne[2]);
    let per_group = n_channels.div_ceil(n_groups);
    let (g0, g1) = split(n_groups, ith, ctx.nth);
    for g in g0..g1 {
        let start = g * per_group;
        let end = (start + per_group).min(n_channels);
        if start >= end {
            continue;
        }
        let n = (ne0 * ne1 * (end - start)) as f64;
        for i3 in 0..d.ne[3] {
            // SAFETY: channels start..end < ne2, rows below ne1, i3 below ne3; rows of a are
            // contiguous F32 (build-time check); dst rows of these channels belong to this
            // worker's groups only; every x is read before the same y is written.
            unsafe {
                let mut sum = 0f64;
                for i2 in start..end {
                    for i1 in 0..ne1 {
                        let x = a.row(i1, i2, i3) as *const f32;
                        let mut s = 0f64;
                        for i0 in 0..ne0 {
                            s += *x.add(i0) as f64;
                        }
                        sum += s;
                    }
                }
                let mean = (sum / n) as f32;
                let mut sum2 = 0f64;
                for i2 in start..end {
                    for i1 in 0..ne1 {
                        let x = a.row(i1, i2, i3) as *const f32;
                        let y = d.row(i1, i2, i3);
                        let mut s = 0f64;
                        for i0 in 0..ne0 {
                            let v = *x.add(i0) - mean;
                            (y.add(i0 * d.nb[0]) as *mut f32).write_unaligned(v);
                            s += (v * v) as f64;
                        }
                        sum2 += s;
                    }
                }
                let variance = (sum2 / n) as f32;
                let scale = 1.0 / (variance + eps).sqrt();
                for i2 in start..end {
                    for i1 in 0..ne1 {
                        let y = d.row(i1, i2, i3);
                        for i0 in 0..ne0 {
                            let p = y.add(i0 * d.nb[0]) as *mut f32;
                            p.write_unaligned(p.read_unaligned() * scale);
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// l2_norm (ggml's ggml_compute_forward_l2_norm_f32): x / max(sqrt(f64 sum of squares), eps).
pub(crate) fn l2_norm(ctx: &NodeCtx<'_>, ith: usize, eps: f32) -> Result<()> {
    let (a, d) = (ctx.src(0), ctx.dst());
    let ne0 = d.ne[0];
    let (r0, r1) = split(d.nrows(), ith, ctx.nth);
    for r in r0..r1 {
        let (i1, i2, i3) = unravel_row(r, &d.ne);
        // SAFETY: indices below the shared shape; own rows; read before write.
        unsafe {
            let (pa, pd) = (a.row(i1, i2, i3), d.row(i1, i2, i3));
            let x = |i: usize| (pa.add(i * a.nb[0]) as *const f32).read_unaligned();
            let mut sum = 0f64;
            for i in 0..ne0 {
                let v = x(i);
                sum += (v * v) as f64;
            }
            let scale = 1.0 / (sum as f32).sqrt().max(eps);
            for i in 0..ne0 {
                (pd.add(i * d.nb[0]) as *mut f32).write_unaligned(x(i) * scale);
            }
        }
    }
    Ok(())
}
