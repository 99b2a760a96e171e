//! `mul_mat` with the Hadamard hint (ggml's `ggml_compute_forward_fwht`): each row of b, scaled
//! by `1 / sqrt(n)`, goes through the fast Walsh-Hadamard transform, the product with the
//! normalised Sylvester Hadamard matrix. The weights are not read. Rows are split between
//! workers; each row is transformed by one worker in ggml's order (scale, then butterflies of
//! span 1, 2, 4, ...), so results do not depend on the thread count.

use super::NodeCtx;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::quant::util::fp16_to_fp32;

/// One row in place: the butterflies `(u, v) -> (u + v, u - v)` over spans 1, 2, 4, ... n / 2.
fn transform(row: &mut [f32]) {
    let n = row.len();
    let mut len = 1;
    while len < n {
        for pair in row.chunks_exact_mut(2 * len) {
            let (lo, hi) = pair.split_at_mut(len);
            for (u, v) in lo.iter_mut().zip(hi.iter_mut()) {
                let (a, b) = (*u, *v);
                *u = a + b;
                *v = a - b;
            }
        }
        len <<= 1;
    }
}

pub(crate) fn fwht(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (b, d) = (ctx.src(1), ctx.dst());
    let n = b.ne[0];
    if !n.is_power_of_two() || d.ne[0] != n {
        // The hint's builder checked both; a plan built from a changed graph fails here.
        return Err(Error::shape("mul_mat", format!("Hadamard form with b rows of {n}")));
    }
    let scale = 1.0 / (n as f32).sqrt();
    // b's rows are contiguous F32 or F16 (the hint's check); dst is a fresh F32 tensor of b's
    // shape, so row r of both has the same (i1, i2, i3).
    let mut rows = ctx.dst_rows(ith);
    for r in rows.range() {
        let (i1, i2, i3) = r.i();
        let out = rows.row::<f32>(r);
        match b.dtype {
            DType::F32 => {
                let src = b.row_of::<f32>(i1, i2, i3);
                out.iter_mut().zip(src).for_each(|(o, &x)| *o = x * scale);
            }
            DType::F16 => {
                let src = b.row_of::<u16>(i1, i2, i3);
                out.iter_mut().zip(src).for_each(|(o, &h)| *o = fp16_to_fp32(h) * scale);
            }
            dt => return Err(Error::ty("mul_mat", format!("Hadamard form of a {dt} b"))),
        }
        transform(out);
    }
    Ok(())
}
