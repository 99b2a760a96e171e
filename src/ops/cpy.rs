//! cpy / dup / cont / cast: plain types (F32, F16, BF16, I32) element by element in logical order
//! with any layouts; block types row by row through f32 (dequantize, then ggml's CPU `from_float`
//! or reference quantizer), or as raw bytes when both sides have the same type.

use super::node::{DstRows, Elem};
use super::{NodeCtx, TView, unravel_row};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::KernelTable;
use crate::ops::node::{ExecNode, align_up};
use crate::quant::util::{fp32_to_bf16, fp32_to_fp16};

fn row_path(node: &ExecNode) -> bool {
    match (node.src[0].as_ref(), Some(&node.dst)) {
        (Some(a), Some(d)) => {
            a.dtype != d.dtype && !(crate::graph::plain(a.dtype) && crate::graph::plain(d.dtype))
        }
        _ => false,
    }
}

pub(crate) fn work_size(node: &ExecNode, nth: usize) -> usize {
    if row_path(node) { nth * align_up(node.dst.ne[0] * 4, 64) } else { 0 }
}

/// Writes a row of f32 values as `dt`: plain types element by element, block types through the
/// table `kt`'s CPU `from_float` (ggml's) or else the reference quantizer. `dst` holds
/// exactly one row of `src.len()` elements of `dt`.
pub(crate) fn store_row(
    kt: &KernelTable,
    op: &'static str,
    dt: DType,
    src: &[f32],
    dst: &mut [u8],
) -> Result<()> {
    if dt.block_size() == 1 {
        let ts = dt.type_size();
        let bytes = dst.chunks_exact_mut(ts);
        match dt {
            DType::F32 => {
                src.iter().zip(bytes).for_each(|(v, b)| b.copy_from_slice(&v.to_ne_bytes()))
            }
            DType::F16 => src
                .iter()
                .zip(bytes)
                .for_each(|(&v, b)| b.copy_from_slice(&fp32_to_fp16(v).to_ne_bytes())),
            DType::BF16 => src
                .iter()
                .zip(bytes)
                .for_each(|(&v, b)| b.copy_from_slice(&fp32_to_bf16(v).to_ne_bytes())),
            // ggml converts with a C cast; Rust's saturating cast avoids undefined behaviour.
            DType::I32 => src
                .iter()
                .zip(bytes)
                .for_each(|(&v, b)| b.copy_from_slice(&(v as i32).to_ne_bytes())),
            _ => return Err(Error::ty(op, format!("cannot write {dt} rows"))),
        }
        Ok(())
    } else if let Some(ff) = kt.activation_converter(dt) {
        ff(src, dst);
        Ok(())
    } else if let Some(q) = crate::quant::format(dt).quantize {
        q(src, dst, src.len(), None)?;
        Ok(())
    } else {
        Err(Error::ty(op, format!("cannot write {dt} rows")))
    }
}

pub(crate) fn compute(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (a, d) = (ctx.src(0), ctx.dst());
    // Block types: both tensors have the same row count and row length (build check), so
    // flat row r of a is flat row r of dst.
    let mut rows = ctx.dst_rows(ith);
    if a.dtype == d.dtype && a.dtype.block_size() > 1 {
        for r in rows.range() {
            let (i1, i2, i3) = unravel_row(r.r(), &a.ne);
            rows.bytes(r).copy_from_slice(a.row_bytes(i1, i2, i3));
        }
        return Ok(());
    }
    if row_path(ctx.node) {
        let ne0 = a.ne[0];
        let tmp = ctx.scratch::<f32>(ith, align_up(ne0 * 4, 64), ne0);
        let to_f32 = super::get_rows::row_converter(ctx.kt, a.dtype);
        let from_f32 = ctx.kt.activation_converter(d.dtype);
        for r in rows.range() {
            let (i1, i2, i3) = unravel_row(r.r(), &a.ne);
            if let (DType::F32, Some(ff)) = (a.dtype, from_f32)
                && d.dtype.block_size() > 1
            {
                // F32 rows go to the CPU quantizer as they are (no copy into the scratch
                // row): the same input values, so the same bytes.
                ff(a.row_of::<f32>(i1, i2, i3), rows.bytes(r));
                continue;
            }
            match to_f32 {
                Some(c) => c(a.row_bytes(i1, i2, i3), tmp),
                None => {
                    return Err(Error::ty("cpy", format!("cannot read {} rows", a.dtype)));
                }
            }
            store_row(ctx.kt, "cpy", d.dtype, tmp, rows.bytes(r))?;
        }
        return Ok(());
    }
    // Plain types, element by element in logical order: each worker writes its own dst rows,
    // reading the source elements with the same flat indices (both have the same count).
    match (a.dtype, d.dtype) {
        (DType::F32, DType::F32) => copy_elems::<f32>(a, d, &mut rows),
        (DType::I32, DType::I32) => copy_elems::<i32>(a, d, &mut rows),
        (x, y) if x == y => copy_elems::<u16>(a, d, &mut rows),
        _ => convert_elems(a, d, &mut rows),
    }
    Ok(())
}

/// The source index of dst element (0, j1, j2, j3)'s flat position, in a's shape.
fn src_index(a: &TView, d: &TView, r: usize) -> [usize; 4] {
    let mut k = r * d.ne[0];
    let mut j = [0usize; 4];
    j[0] = k % a.ne[0];
    k /= a.ne[0];
    j[1] = k % a.ne[1];
    k /= a.ne[1];
    j[2] = k % a.ne[2];
    j[3] = k / a.ne[2];
    j
}

/// Steps a's index `j` to the next element in logical order.
#[inline(always)]
fn step(j: &mut [usize; 4], ne: &[usize; 4]) {
    advance(j, 1, ne);
}

/// Moves the source index `j` on by `n` elements, `n` at most what is left of its row.
#[inline(always)]
fn advance(j: &mut [usize; 4], n: usize, ne: &[usize; 4]) {
    debug_assert!(j[0] + n <= ne[0]);
    j[0] += n;
    if j[0] == ne[0] {
        j[0] = 0;
        j[1] += 1;
        if j[1] == ne[1] {
            j[1] = 0;
            j[2] += 1;
            if j[2] == ne[2] {
                j[2] = 0;
                j[3] += 1;
            }
        }
    }
}

/// Same-type copy of plain elements (the bits as they are).
fn copy_elems<T: Elem>(a: &TView, d: &TView, rows: &mut DstRows<'_>) {
    // `row_of` takes a source row of one element at any stride; a destination row of one
    // element at another stride counts as strided (`DstRows::row` refuses it).
    let unit = size_of::<T>();
    if (a.ne[0] <= 1 || a.nb[0] == unit) && d.nb[0] == unit {
        // Both sides hold their rows' elements side by side: each destination row is filled by
        // slices of source rows (one per source row it spans), the same elements in the same
        // order. A permuted copy that keeps dimension 0 (attention's heads to the front) moved
        // 2.5 ns per element element by element.
        // Fills `out` from the source's elements from index `j` on, a slice per source row.
        let fill = |out: &mut [T], j: &mut [usize; 4]| {
            let mut i0 = 0;
            while i0 < out.len() {
                let src = &a.row_of::<T>(j[1], j[2], j[3])[j[0]..];
                let n = src.len().min(out.len() - i0);
                // Both sides hold the same number of elements (build check), so a source row
                // is never empty here.
                debug_assert!(n > 0);
                if n == 0 {
                    break;
                }
                out[i0..i0 + n].copy_from_slice(&src[..n]);
                i0 += n;
                advance(j, n, &a.ne);
            }
        };
        if d.is_dense::<T>() {
            // This worker's rows are one run of the destination.
            let start = rows.flat().start;
            let out = rows.all::<T>();
            if !out.is_empty() {
                fill(out, &mut src_index(a, d, start));
            }
            return;
        }
        // Consecutive destination rows continue the source's order: the index is computed
        // (three divisions) only where a row does not follow the one before.
        let (mut j, mut next) = ([0usize; 4], usize::MAX);
        for r in rows.range() {
            if r.r() != next {
                j = src_index(a, d, r.r());
            }
            next = r.r() + 1;
            fill(rows.row::<T>(r), &mut j);
        }
        return;
    }
    for r in rows.range() {
        let mut j = src_index(a, d, r.r());
        let mut out = rows.out::<T>(r);
        for i0 in 0..d.ne[0] {
            out.set(i0, a.get::<T>(j[0], j[1], j[2], j[3]));
            step(&mut j, &a.ne);
        }
    }
}

/// Copy between plain types through f32 (ggml's conversions).
fn convert_elems(a: &TView, d: &TView, rows: &mut DstRows<'_>) {
    for r in rows.range() {
        let mut j = src_index(a, d, r.r());
        for i0 in 0..d.ne[0] {
            let v = a.load(j[0], j[1], j[2], j[3]);
            rows.store(r, i0, v);
            step(&mut j, &a.ne);
        }
    }
}
