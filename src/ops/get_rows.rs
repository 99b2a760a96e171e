//! get_rows: rows of src0 (any type convertible to f32) picked by I32 ids, into F32, or of an
//! I32 table into I32 (ggml's ggml_compute_forward_get_rows). Ids are data, so they are checked here.

use super::NodeCtx;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::KernelTable;

/// Converts one row of `n` elements to f32.
pub(crate) type RowToF32 = fn(src: &[u8], dst: &mut [f32]);

/// The f32 converter for rows of `dtype`, if it has one.
pub(crate) fn row_converter(kt: &KernelTable, dtype: DType) -> Option<RowToF32> {
    match dtype {
        // F16 through the plan tier's converter (F16C); every other type through the tier's
        // dequantizer (the format's, or a SIMD one giving the same floats).
        DType::F16 => Some(kt.f16_bytes_to_f32),
        d => kt.to_f32(d),
    }
}

pub(crate) fn compute(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (a, ids, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    // An I32 table: rows copied as they are (the result is I32).
    let conv = if a.dtype == DType::I32 {
        None
    } else {
        Some(row_converter(ctx.kt, a.dtype).ok_or_else(|| Error::Unsupported {
            op: "get_rows",
            backend: "CPU".into(),
            msg: format!("no f32 conversion for {}", a.dtype),
        })?)
    };
    // dst is a fresh contiguous F32 [ne0, ids.ne[0], ids.ne[1], ids.ne[2]]: flat row r of dst
    // is id r.
    debug_assert_eq!(d.nrows(), ids.nelements());
    let mut rows = ctx.dst_rows(ith);
    for r in rows.range() {
        let (i10, i11, i12) = {
            let r = r.r();
            (r % ids.ne[0], (r / ids.ne[0]) % ids.ne[1], r / (ids.ne[0] * ids.ne[1]))
        };
        let id = ids.get::<i32>(i10, i11, i12, 0);
        if id < 0 || id as usize >= a.ne[1] {
            return Err(Error::IndexOutOfRange {
                op: "get_rows",
                tensor: ctx.node.label(),
                index: id as i64,
                limit: a.ne[1],
            });
        }
        // i11 < a.ne[2] and i12 < a.ne[3] (build-time shape check); a's rows are contiguous.
        match conv {
            Some(conv) => conv(a.row_bytes(id as usize, i11, i12), rows.row::<f32>(r)),
            None => rows.row::<i32>(r).copy_from_slice(a.row_of::<i32>(id as usize, i11, i12)),
        }
    }
    Ok(())
}

/// The tier needs a row converter for the table's type.
pub(crate) fn supports(
    graph: &crate::graph::Graph,
    t: &crate::graph::Tensor,
    kt: &KernelTable,
) -> Result<()> {
    let a = graph.t(t.src[0].ok_or_else(|| crate::error::Error::arg("get_rows: no a"))?);
    if a.dtype != DType::I32 && row_converter(kt, a.dtype).is_none() {
        return Err(crate::error::Error::Unsupported {
            op: "get_rows",
            backend: "CPU".into(),
            msg: format!("cannot convert {} rows to f32", a.dtype),
        });
    }
    Ok(())
}
