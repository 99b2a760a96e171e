//! Elementwise ops on F32: scale (with bias) and the activations (ggml's unary-ops.cpp, vec.h).

use super::{NodeCtx, split, unravel_row};
use crate::error::Result;
use crate::graph::UnaryOp;

/// Applies `row_fn` (contiguous rows) or `elem` (strided) to every row of src 0 into dst.
fn map_rows(
    ctx: &NodeCtx<'_>,
    ith: usize,
    row_fn: &dyn Fn(usize, *mut f32, *const f32),
    elem: &dyn Fn(f32) -> f32,
) -> Result<()> {
    let (a, d) = (ctx.src(0), ctx.dst());
    let ne0 = d.ne[0];
    let (r0, r1) = split(d.nrows(), ith, ctx.nth);
    for r in r0..r1 {
        let (i1, i2, i3) = unravel_row(r, &d.ne);
        // SAFETY: indices below dst's ne (= a's ne); rows validated at plan time; each worker
        // writes its own rows; exact aliasing (in place) is allowed by the kernels.
        unsafe {
            let pd = d.row(i1, i2, i3);
            let pa = a.row(i1, i2, i3);
            if a.nb[0] == 4 && d.nb[0] == 4 {
                row_fn(ne0, pd as *mut f32, pa as *const f32);
            } else {
                for i0 in 0..ne0 {
                    let x = *(pa.add(i0 * a.nb[0]) as *const f32);
                    *(pd.add(i0 * d.nb[0]) as *mut f32) = elem(x);
                }
            }
        }
    }
    Ok(())
}

pub(crate) fn scale(ctx: &NodeCtx<'_>, ith: usize, s: f32, b: f32) -> Result<()> {
    let f = move |x: f32| x * s + b;
    map_rows(
        ctx,
        ith,
        &|n, d, a| {
            for i in 0..n {
                // SAFETY: map_rows passes n valid elements behind both pointers.
                unsafe { *d.add(i) = f(*a.add(i)) };
            }
        },
        &f,
    )
}

pub(crate) fn compute(ctx: &NodeCtx<'_>, ith: usize, op: UnaryOp) -> Result<()> {
    use crate::kernels::scalar;
    let kt = crate::kernels::table();
    let (k, f): (crate::kernels::UnaryF32, fn(f32) -> f32) = match op {
        UnaryOp::Relu => (kt.relu_f32, scalar::relu),
        UnaryOp::Gelu => (kt.gelu_f32, scalar::gelu),
        UnaryOp::Silu => (kt.silu_f32, scalar::silu),
    };
    // SAFETY: map_rows passes n valid elements behind both pointers (exact aliasing only).
    map_rows(ctx, ith, &|n, d, a| unsafe { k(n, d, a) }, &f)
}
