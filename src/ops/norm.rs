//! rms_norm on F32 rows (ggml's ggml_compute_forward_rms_norm_f32: f64 sum of squares).

use super::{NodeCtx, split, unravel_row};
use crate::error::Result;

pub(crate) fn rms_norm(ctx: &NodeCtx<'_>, ith: usize, eps: f32) -> Result<()> {
    let (a, d) = (ctx.src(0), ctx.dst());
    let ne0 = d.ne[0];
    let (r0, r1) = split(d.nrows(), ith, ctx.nth);
    for r in r0..r1 {
        let (i1, i2, i3) = unravel_row(r, &d.ne);
        // SAFETY: indices below the shared shape; rows validated at plan time; own rows only;
        // every element is read before the same element is written (in place is exact aliasing).
        unsafe {
            let pa = a.row(i1, i2, i3);
            let pd = d.row(i1, i2, i3);
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
