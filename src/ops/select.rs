//! forward_select: copies the selected branch (source `idx`) into the result, row by row. The
//! executor does not run the nodes only the other branches need.

use super::NodeCtx;
use crate::error::{Error, Result};

pub(crate) fn compute(ctx: &NodeCtx<'_>, ith: usize, idx: usize) -> Result<()> {
    let src = ctx.node.src.get(idx).and_then(|s| s.as_ref()).ok_or_else(|| {
        Error::arg(format!("forward_select: branch {idx} is not a source of {}", ctx.node.label()))
    })?;
    // The branch has the result's type and shape and contiguous rows (build check).
    let mut rows = ctx.dst_rows(ith);
    for r in rows.range() {
        let (i1, i2, i3) = r.i();
        rows.bytes(r).copy_from_slice(src.row_bytes(i1, i2, i3));
    }
    Ok(())
}
