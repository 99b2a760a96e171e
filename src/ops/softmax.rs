//! soft_max_ext on F32 rows with an optional F16/F32 mask, ALiBi slopes and sinks
//! (ggml's ggml_compute_forward_soft_max_f32; the sum is accumulated in f64 as ggml does).

use super::{NodeCtx, split, unravel_row};
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::node::{ExecNode, align_up};

/// A per-thread f32 row for F16 masks.
pub(crate) fn work_size(node: &ExecNode, nth: usize) -> usize {
    match node.src[1].as_ref() {
        Some(m) if m.dtype == DType::F16 => nth * align_up(node.dst.ne[0] * 4, 64),
        _ => 0,
    }
}

pub(crate) fn compute(ctx: &NodeCtx<'_>, ith: usize, scale: f32, max_bias: f32) -> Result<()> {
    let (a, d) = (ctx.src(0), ctx.dst());
    let kt = ctx.kt;
    let mask = ctx.node.src[1].as_ref();
    // SAFETY: sinks, when present, is a contiguous F32 vector of ne[2] values (build check).
    let sinks = ctx.node.src[2]
        .as_ref()
        .map(|s| unsafe { std::slice::from_raw_parts(s.ptr as *const f32, s.ne[0]) });
    let ne0 = d.ne[0];
    let mrow: &mut [f32] = match mask {
        Some(m) if m.dtype == DType::F16 => {
            let stride = align_up(ne0 * 4, 64);
            debug_assert!((ith + 1) * stride <= ctx.work_len);
            // SAFETY: the work buffer holds nth rows of ne0 f32 (work_size); this one is ours.
            unsafe { std::slice::from_raw_parts_mut(ctx.work.add(ith * stride) as *mut f32, ne0) }
        }
        _ => &mut [],
    };
    let (r0, r1) = split(d.nrows(), ith, ctx.nth);
    for r in r0..r1 {
        let (i1, i2, i3) = unravel_row(r, &d.ne);
        let slope = super::alibi_slope(max_bias, d.ne[2], i2);
        // SAFETY: indices are below the shapes (the mask's dims 2, 3 reduced modulo its ne, its
        // row i1 < mask.ne[1] and ne0 <= mask.ne[0] by the build-time check); rows are contiguous
        // (build check); each worker writes its own dst rows; x[i] is read before dst[i] is
        // written (dst may equal x in place).
        unsafe {
            let x = std::slice::from_raw_parts(a.row(i1, i2, i3) as *const f32, ne0);
            let pd = d.row(i1, i2, i3) as *mut f32;
            for (i, &v) in x.iter().enumerate() {
                *pd.add(i) = v * scale;
            }
            let y = std::slice::from_raw_parts_mut(pd, ne0);
            if let Some(m) = mask {
                let pm = m.row(i1, i2 % m.ne[2], i3 % m.ne[3]);
                let mv: &[f32] = if m.dtype == DType::F16 {
                    (kt.f16_to_f32)(std::slice::from_raw_parts(pm as *const u16, ne0), mrow);
                    mrow
                } else {
                    std::slice::from_raw_parts(pm as *const f32, ne0)
                };
                for (t, &mm) in y.iter_mut().zip(mv) {
                    *t += slope * mm;
                }
            }
            let mut max = y.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            if let Some(sk) = sinks {
                max = max.max(sk[i2]);
            }
            let mut sum = (kt.exp_sub_sum_f32)(ne0, pd, max);
            if let Some(sk) = sinks {
                sum += (sk[i2] - max).exp() as f64;
            }
            let inv = (1.0 / sum) as f32;
            for t in y.iter_mut() {
                *t *= inv;
            }
        }
    }
    Ok(())
}
