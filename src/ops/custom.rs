//! Runs a custom op closure on this worker's rows.

use super::{NodeCtx, split};
use crate::error::{Error, Result};
use crate::graph::{CustomArgs, CustomOp, MAX_SRC};

pub(crate) fn compute(ctx: &NodeCtx<'_>, ith: usize, op: &CustomOp) -> Result<()> {
    let nth = ctx.nth.min(op.n_tasks);
    if ith >= nth {
        return Ok(());
    }
    let d = ctx.dst();
    let mut srcs: [&[f32]; MAX_SRC] = [&[]; MAX_SRC];
    let mut shapes = [[0usize; 4]; MAX_SRC];
    let mut n = 0;
    for s in ctx.node.src.iter().flatten() {
        // SAFETY: custom sources are contiguous F32 (build check) of nelements values, read-only
        // for the duration of the node.
        srcs[n] = unsafe { std::slice::from_raw_parts(s.ptr as *const f32, s.nelements()) };
        shapes[n] = s.ne;
        n += 1;
    }
    let (r0, r1) = split(d.nrows(), ith, nth);
    let ne0 = d.ne[0];
    // SAFETY: dst is a fresh contiguous F32 tensor; rows [r0, r1) belong to this worker only.
    let dst = unsafe {
        std::slice::from_raw_parts_mut((d.ptr as *mut f32).add(r0 * ne0), (r1 - r0) * ne0)
    };
    let args = CustomArgs {
        ith,
        nth,
        srcs: &srcs[..n],
        src_shapes: &shapes[..n],
        dst_shape: d.ne,
        rows: r0..r1,
        dst,
    };
    (op.f)(args).map_err(|msg| Error::Panicked { name: op.name.to_string(), msg })
}
