//! forward_select: copies the selected branch (source `idx`) into the result, row by row. The
//! executor does not run the nodes only the other branches need.

use super::{NodeCtx, split, unravel_row};
use crate::error::{Error, Result};

pub(crate) fn compute(ctx: &NodeCtx<'_>, ith: usize, idx: usize) -> Result<()> {
    let src = ctx.node.src.get(idx).and_then(|s| s.as_ref()).ok_or_else(|| {
        Error::arg(format!("forward_select: branch {idx} is not a source of {}", ctx.node.label()))
    })?;
    let d = ctx.dst();
    let rb = d.dtype.row_bytes(d.ne[0]);
    let (r0, r1) = split(d.nrows(), ith, ctx.nth);
    for r in r0..r1 {
        let (i1, i2, i3) = unravel_row(r, &d.ne);
        // SAFETY: the branch has dst's type and shape and contiguous rows (build check), so row
        // (i1, i2, i3) of both holds `rb` bytes inside its tensor; dst is a fresh tensor, not a
        // branch, and row r is this worker's alone.
        unsafe { std::ptr::copy_nonoverlapping(src.row(i1, i2, i3), d.row(i1, i2, i3), rb) };
    }
    Ok(())
}
