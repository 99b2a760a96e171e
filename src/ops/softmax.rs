//! soft_max_ext on F32 rows with an optional F16/F32 mask, ALiBi slopes and sinks
//! (ggml's ggml_compute_forward_soft_max_f32; the sum is accumulated in f64 as ggml does).

use super::NodeCtx;
use super::node::Slices;
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
    // Sinks, when present, are a contiguous F32 vector of ne[2] values (build check).
    let sinks = ctx.node.src[2].as_ref().map(|s| s.row_of::<f32>(0, 0, 0));
    let ne0 = d.ne[0];
    let mrow: &mut [f32] = match mask {
        Some(m) if m.dtype == DType::F16 => ctx.scratch(ith, align_up(ne0 * 4, 64), ne0),
        _ => &mut [],
    };
    let mut rows = ctx.dst_rows(ith);
    for r in rows.range() {
        let (i1, i2, i3) = r.i();
        let slope = super::alibi_slope(max_bias, d.ne[2], i2);
        // Rows are contiguous (build check); in place, each x is read before it is written.
        let y = match rows.io::<f32>(a, r).slices() {
            Ok(Slices::Same(y)) => {
                y.iter_mut().for_each(|v| *v *= scale);
                y
            }
            Ok(Slices::Two(x, y)) => {
                y.iter_mut().zip(x).for_each(|(v, &x)| *v = x * scale);
                y
            }
            Err(_) => unreachable!("soft_max: strided rows"),
        };
        if let Some(m) = mask {
            // The mask's dims 2, 3 are reduced modulo its ne; its row i1 < mask.ne[1] and
            // ne0 <= mask.ne[0] (build-time check).
            let (j2, j3) = (i2 % m.ne[2], i3 % m.ne[3]);
            let mv: &[f32] = if m.dtype == DType::F16 {
                (kt.f16_to_f32)(&m.row_of::<u16>(i1, j2, j3)[..ne0], mrow);
                mrow
            } else {
                &m.row_of::<f32>(i1, j2, j3)[..ne0]
            };
            for (t, &mm) in y.iter_mut().zip(mv) {
                *t += slope * mm;
            }
        }
        let mut max = y.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if let Some(sk) = sinks {
            max = max.max(sk[i2]);
        }
        // SAFETY: y is a row of ne0 f32 this worker holds exclusively.
        let mut sum = unsafe { (kt.exp_sub_sum_f32)(ne0, y.as_mut_ptr(), max) };
        if let Some(sk) = sinks {
            sum += (sk[i2] - max).exp() as f64;
        }
        let inv = (1.0 / sum) as f32;
        for t in y.iter_mut() {
            *t *= inv;
        }
    }
    Ok(())
}
