//! Row normalisations on F32 (ggml's ops.cpp): rms_norm (f64 sum of squares), the fused
//! rms_norm * weight, norm, group_norm and l2_norm.

use super::node::{DstRows, InOut, Slices};
use super::{NodeCtx, split};
use crate::error::Result;

pub(crate) fn rms_norm(ctx: &NodeCtx<'_>, ith: usize, eps: f32) -> Result<()> {
    let a = ctx.src(0);
    let kt = ctx.kt;
    let ne0 = ctx.dst().ne[0];
    let scale_of = |sum: f64| 1.0 / ((sum / ne0 as f64) as f32 + eps).sqrt();
    let mut rows = ctx.dst_rows(ith);
    for r in rows.range() {
        match rows.io::<f32>(a, r).slices() {
            Ok(Slices::Same(y)) => {
                let scale = scale_of((kt.sum_sq_f64)(y));
                y.iter_mut().for_each(|v| *v *= scale);
            }
            Ok(Slices::Two(x, y)) => {
                let scale = scale_of((kt.sum_sq_f64)(x));
                y.iter_mut().zip(x).for_each(|(v, &x)| *v = x * scale);
            }
            Err(mut io) => {
                let mut sum = 0f64;
                for i in 0..ne0 {
                    let v = io.src(i);
                    sum += (v * v) as f64;
                }
                let mean = (sum / ne0 as f64) as f32;
                let scale = 1.0 / (mean + eps).sqrt();
                for i in 0..ne0 {
                    let v = io.src(i) * scale;
                    io.set(i, v);
                }
            }
        }
    }
    Ok(())
}

/// norm on F32 rows (ggml's ggml_compute_forward_norm_f32): f64 sums for the mean and the
/// centred variance, f32 scale.
pub(crate) fn norm(ctx: &NodeCtx<'_>, ith: usize, eps: f32) -> Result<()> {
    let a = ctx.src(0);
    let ne0 = ctx.dst().ne[0];
    let mut rows = ctx.dst_rows(ith);
    for r in rows.range() {
        let mut io = rows.io::<f32>(a, r);
        let mut sum = 0f64;
        for i in 0..ne0 {
            sum += io.src(i) as f64;
        }
        let mean = (sum as f32) / ne0 as f32;
        let mut var = 0f64;
        for i in 0..ne0 {
            let v = io.src(i) - mean;
            io.set(i, v);
            var += (v * v) as f64;
        }
        let variance = (var / ne0 as f64) as f32;
        let scale = 1.0 / (variance + eps).sqrt();
        for i in 0..ne0 {
            let v = io.dst(i) * scale;
            io.set(i, v);
        }
    }
    Ok(())
}

/// rms_norm(src0) * src1 in one pass (ggml's RMS_NORM + MUL CPU fusion): y = x * scale * w.
pub(crate) fn rms_norm_mul(ctx: &NodeCtx<'_>, ith: usize, eps: f32) -> Result<()> {
    let (a, w, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    let kt = ctx.kt;
    let ne0 = d.ne[0];
    let scale_of = |sum: f64| 1.0 / ((sum / ne0 as f64) as f32 + eps).sqrt();
    let mut rows = ctx.dst_rows(ith);
    for r in rows.range() {
        let (i1, i2, i3) = r.i();
        // Rows of a and w are contiguous F32 (build-time check); w's row indices are reduced
        // modulo its shape.
        let w = w.row_of::<f32>(i1 % w.ne[1], i2 % w.ne[2], i3 % w.ne[3]);
        match rows.io::<f32>(a, r).slices() {
            Ok(Slices::Same(y)) => {
                let scale = scale_of((kt.sum_sq_f64)(y));
                y.iter_mut().zip(w).for_each(|(v, &w)| *v = *v * scale * w);
            }
            Ok(Slices::Two(x, y)) => {
                let scale = scale_of((kt.sum_sq_f64)(x));
                for ((v, &x), &w) in y.iter_mut().zip(x).zip(w) {
                    *v = x * scale * w;
                }
            }
            Err(InOut::Two(x, mut y)) => {
                // A strided destination.
                let x = x.as_slice().expect("rms_norm_mul: contiguous rows (build check)");
                let scale = scale_of((kt.sum_sq_f64)(x));
                for i in 0..ne0 {
                    y.set(i, x[i] * scale * w[i]);
                }
            }
            Err(InOut::Same(_)) => {
                // In place the destination has a's contiguous rows.
                unreachable!("rms_norm_mul: strided in-place rows");
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
            // The flat rows of channels start..end of sample i3.
            let base = ne1 * n_channels * i3;
            // SAFETY: groups are split between workers, so these channels' rows belong to this
            // worker alone, and it holds one group's rows at a time.
            let mut rows = unsafe { DstRows::new(d, base + ne1 * start, base + ne1 * end) };
            let mut sum = 0f64;
            for r in rows.range() {
                let io = rows.io::<f32>(a, r);
                let mut s = 0f64;
                for i0 in 0..ne0 {
                    s += io.src(i0) as f64;
                }
                sum += s;
            }
            let mean = (sum / n) as f32;
            let mut sum2 = 0f64;
            for r in rows.range() {
                let mut io = rows.io::<f32>(a, r);
                let mut s = 0f64;
                for i0 in 0..ne0 {
                    let v = io.src(i0) - mean;
                    io.set(i0, v);
                    s += (v * v) as f64;
                }
                sum2 += s;
            }
            let variance = (sum2 / n) as f32;
            let scale = 1.0 / (variance + eps).sqrt();
            for r in rows.range() {
                let mut y = rows.out::<f32>(r);
                for i0 in 0..ne0 {
                    let v = y.get(i0) * scale;
                    y.set(i0, v);
                }
            }
        }
    }
    Ok(())
}

/// l2_norm (ggml's ggml_compute_forward_l2_norm_f32): x / max(sqrt(f64 sum of squares), eps).
pub(crate) fn l2_norm(ctx: &NodeCtx<'_>, ith: usize, eps: f32) -> Result<()> {
    let a = ctx.src(0);
    let ne0 = ctx.dst().ne[0];
    let mut rows = ctx.dst_rows(ith);
    for r in rows.range() {
        let mut io = rows.io::<f32>(a, r);
        let mut sum = 0f64;
        for i in 0..ne0 {
            let v = io.src(i);
            sum += (v * v) as f64;
        }
        let scale = 1.0 / (sum as f32).sqrt().max(eps);
        for i in 0..ne0 {
            let v = io.src(i) * scale;
            io.set(i, v);
        }
    }
    Ok(())
}
