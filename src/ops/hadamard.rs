//! `mul_mat` with the Hadamard hint (ggml's `ggml_compute_forward_fwht`): each row of b, scaled
//! by `1 / sqrt(n)`, goes through the fast Walsh-Hadamard transform, the product with the
//! normalised Sylvester Hadamard matrix. The weights are not read. Rows are split between
//! workers; each row is transformed by one worker in ggml's order (scale, then butterflies of
//! span 1, 2, 4, ...), so results do not depend on the thread count.

use super::{NodeCtx, split};
use crate::dtype::DType;
use crate::error::{Error, Result};

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
    if !n.is_power_of_two() || d.ne[0] != n || d.nb[0] != 4 {
        // The hint's builder checked both; a plan built from a changed graph fails here.
        return Err(Error::shape("mul_mat", format!("Hadamard form with b rows of {n}")));
    }
    let scale = 1.0 / (n as f32).sqrt();
    let nr = b.ne[1] * b.ne[2] * b.ne[3];
    let (r0, r1) = split(nr, ith, ctx.nth);
    for r in r0..r1 {
        let (i1, i2, i3) = (r % b.ne[1], (r / b.ne[1]) % b.ne[2], r / (b.ne[1] * b.ne[2]));
        // SAFETY: (i1, i2, i3) is below d's dims ([n, b.ne[1], b.ne[2], b.ne[3]]); d's elements
        // are f32 at a 4-aligned offset (nb[0] = 4, plan memory), its row holds n floats, and
        // row r is this worker's alone (rows split by `split`).
        let out = unsafe {
            std::slice::from_raw_parts_mut(
                d.ptr.add(i1 * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3]) as *mut f32,
                n,
            )
        };
        // SAFETY: (i1, i2, i3) is below b's dims.
        let src = unsafe { b.row(i1, i2, i3) };
        match b.dtype {
            DType::F32 => {
                for (j, o) in out.iter_mut().enumerate() {
                    // SAFETY: b's rows are contiguous (checked by the hint): element j < n of
                    // row (i1, i2, i3) is inside b; read unaligned since views may sit anywhere.
                    *o = unsafe { (src.add(j * 4) as *const f32).read_unaligned() } * scale;
                }
            }
            DType::F16 => {
                for (j, o) in out.iter_mut().enumerate() {
                    // SAFETY: as above, 2-byte elements.
                    let h = unsafe { (src.add(j * 2) as *const u16).read_unaligned() };
                    *o = half::f16::from_bits(h).to_f32() * scale;
                }
            }
            dt => {
                return Err(Error::ty("mul_mat", format!("Hadamard form of a {dt} b")));
            }
        }
        transform(out);
    }
    Ok(())
}
