//! Runs a custom op closure on this worker's rows.

use super::{DstRows, NodeCtx, split};
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
        // Custom sources are contiguous F32 (build check).
        srcs[n] = s.as_slice::<f32>();
        shapes[n] = s.ne;
        n += 1;
    }
    let (r0, r1) = split(d.nrows(), ith, nth);
    // dst is a fresh contiguous F32 tensor.
    // SAFETY: workers `ith < nth` (the op's task count) get disjoint `split` ranges, once each.
    let mut rows = unsafe { DstRows::new(d, r0, r1) };
    let dst = rows.all::<f32>();
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
