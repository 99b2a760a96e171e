//! soft_max_ext on F32 rows with an optional F16/F32 mask and ALiBi slopes
//! (ggml's ggml_compute_forward_soft_max_f32; the sum is accumulated in f64 as ggml does).

use super::{NodeCtx, split, unravel_row};
use crate::dtype::DType;
use crate::error::Result;
use crate::quant::util::fp16_to_fp32;

pub(crate) fn compute(ctx: &NodeCtx<'_>, ith: usize, scale: f32, max_bias: f32) -> Result<()> {
    let (a, d) = (ctx.src(0), ctx.dst());
    let mask = ctx.node.src[1].as_ref();
    // SAFETY: sinks, when present, is a contiguous F32 vector of ne[2] values (build check).
    let sinks = ctx.node.src[2]
        .as_ref()
        .map(|s| unsafe { std::slice::from_raw_parts(s.ptr as *const f32, s.ne[0]) });
    let ne0 = d.ne[0];
    let n_head = d.ne[2] as u32;
    let n_head_log2 = if n_head == 0 { 1 } else { 1u32 << n_head.ilog2() };
    let m0 = 2f32.powf(-max_bias / n_head_log2 as f32);
    let m1 = 2f32.powf(-(max_bias / 2.0) / n_head_log2 as f32);
    let (r0, r1) = split(d.nrows(), ith, ctx.nth);
    for r in r0..r1 {
        let (i1, i2, i3) = unravel_row(r, &d.ne);
        let h = i2 as u32;
        let slope = if max_bias > 0.0 {
            if h < n_head_log2 {
                m0.powi(h as i32 + 1)
            } else {
                m1.powi(2 * (h - n_head_log2) as i32 + 1)
            }
        } else {
            1.0
        };
        // SAFETY: indices below the shapes (the mask's dims 2, 3 reduced modulo its ne, its row
        // i1 < mask.ne[1] by the build-time check); rows are contiguous (checked at build);
        // each worker writes its own dst rows; x[i] is read before dst[i] is written.
        unsafe {
            let pa = a.row(i1, i2, i3) as *const f32;
            let pd = d.row(i1, i2, i3) as *mut f32;
            let mut max = f32::NEG_INFINITY;
            for i in 0..ne0 {
                let mut v = *pa.add(i) * scale;
                if let Some(m) = mask {
                    let pm = m.row(i1, i2 % m.ne[2], i3 % m.ne[3]);
                    let mv = if m.dtype == DType::F16 {
                        fp16_to_fp32(*(pm as *const u16).add(i))
                    } else {
                        *(pm as *const f32).add(i)
                    };
                    v += slope * mv;
                }
                *pd.add(i) = v;
                max = max.max(v);
            }
            if let Some(sk) = sinks {
                max = max.max(sk[i2]);
            }
            let mut sum = (crate::kernels::table().exp_sub_sum_f32)(ne0, pd, max);
            if let Some(sk) = sinks {
                sum += (sk[i2] - max).exp() as f64;
            }
            let inv = (1.0 / sum) as f32;
            for i in 0..ne0 {
                *pd.add(i) *= inv;
            }
        }
    }
    Ok(())
}
