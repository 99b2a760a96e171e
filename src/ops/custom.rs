//! Runs a custom op closure on this worker's rows.

use super::{DstRows, NodeCtx, split};
use crate::error::{Error, Result};
use crate::graph::{
    CustomAnyArgs, CustomAnyOp, CustomArgs, CustomOp, CustomSplitFn, CustomSrc, MAX_SRC,
};

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

/// The rows each of `nth` workers owns under the op's own split, checked: in range and
/// disjoint.
fn checked_split(op: &CustomAnyOp, f: &CustomSplitFn, nth: usize, nrows: usize) -> Result<()> {
    let mut spans: Vec<(usize, usize)> = (0..nth)
        .map(|j| {
            let r = f(j, nth, nrows);
            (r.start, r.end)
        })
        .filter(|&(a, b)| a < b)
        .collect();
    spans.sort_unstable();
    let bad = spans.iter().any(|&(_, b)| b > nrows) || spans.windows(2).any(|w| w[0].1 > w[1].0);
    if bad {
        return Err(Error::Panicked {
            name: op.name.to_string(),
            msg: format!(
                "its split gives rows outside 0..{nrows} or to two workers at once: {spans:?}"
            ),
        });
    }
    Ok(())
}

pub(crate) fn compute_any(ctx: &NodeCtx<'_>, ith: usize, op: &CustomAnyOp) -> Result<()> {
    let nth = ctx.nth.min(op.n_tasks);
    if ith >= nth {
        return Ok(());
    }
    let d = ctx.dst();
    let mut srcs = [CustomSrc { dtype: d.dtype, ne: [0; 4], nb: [0; 4], data: &[] }; MAX_SRC];
    let mut n = 0;
    for s in ctx.node.src.iter().flatten() {
        let bytes = crate::graph::nbytes_of(s.dtype, &s.ne, &s.nb);
        // SAFETY: the plan placed the source's `nbytes` bytes (validated extent) at `ptr`; they
        // are only read while the node runs.
        let data = unsafe { std::slice::from_raw_parts(s.ptr as *const u8, bytes) };
        srcs[n] = CustomSrc { dtype: s.dtype, ne: s.ne, nb: s.nb, data };
        n += 1;
    }
    let nrows = d.nrows();
    let rows = match &op.split {
        Some(f) => {
            checked_split(op, f, nth, nrows)?;
            let r = f(ith, nth, nrows);
            if r.start < r.end { r } else { 0..0 }
        }
        None => {
            let (r0, r1) = split(nrows, ith, nth);
            r0..r1
        }
    };
    let rb = d.dtype.row_bytes(d.ne[0]);
    // SAFETY: dst is a fresh contiguous tensor of nrows rows of rb bytes (custom_any's output);
    // rows [start, end) are within 0..nrows and no other worker owns them (checked_split, or the
    // executor's even split).
    let dst =
        unsafe { std::slice::from_raw_parts_mut(d.ptr.add(rows.start * rb), rows.len() * rb) };
    let args = CustomAnyArgs {
        ith,
        nth,
        srcs: &srcs[..n],
        dst_dtype: d.dtype,
        dst_shape: d.ne,
        rows,
        dst,
    };
    (op.f)(args).map_err(|msg| Error::Panicked { name: op.name.to_string(), msg })
}
