//! Elementwise drivers on F32/F16/BF16 and quantized rows (ggml's ops.cpp, unary-ops.cpp, binary-ops.cpp): mixed-type
//! add/sub/mul/div, add1, add_id, acc, clamp, leaky_relu, sqr, sqrt, log, sin, cos, fill, tri,
//! diag, diag_mask_inf/zero. Every driver splits dst rows between workers (ggml's contiguous
//! split), so each output element is written by one worker with one fixed arithmetic.

use super::{NodeCtx, split, unravel_row};
use crate::dtype::DType;
use crate::error::{Error, Result};

use crate::ops::node::{ExecNode, align_up};
use crate::quant::util::{bf16_to_fp32, fp16_to_fp32};

/// Loads one F32, F16, BF16 or I32 element as f32.
///
/// # Safety
/// `p` points at one readable element of type `dt` (one of those four).
#[inline(always)]
pub(crate) unsafe fn ld(p: *const u8, dt: DType) -> f32 {
    // SAFETY: per the contract; unaligned reads tolerate any view offset.
    unsafe {
        match dt {
            DType::F16 => fp16_to_fp32((p as *const u16).read_unaligned()),
            DType::BF16 => bf16_to_fp32((p as *const u16).read_unaligned()),
            DType::I32 => (p as *const i32).read_unaligned() as f32,
            _ => (p as *const f32).read_unaligned(),
        }
    }
}

/// dst = f(src0) elementwise over worker `ith`'s rows; src0 and dst have the same shape, F32,
/// F16 or BF16 each, any strides (dst may be src0's memory exactly: in place).
pub(crate) fn map_float(ctx: &NodeCtx<'_>, ith: usize, f: impl Fn(f32) -> f32) -> Result<()> {
    let (a, d) = (ctx.src(0), ctx.dst());
    let mut rows = ctx.dst_rows(ith);
    if a.dtype == DType::F32 && d.dtype == DType::F32 {
        for r in rows.range() {
            rows.io::<f32>(a, r).map(&f);
        }
        return Ok(());
    }
    for r in rows.range() {
        let (i1, i2, i3) = r.i();
        for i0 in 0..d.ne[0] {
            let v = f(rows.load(a, i0, i1, i2, i3));
            rows.store(r, i0, v);
        }
    }
    Ok(())
}

/// F16 -> F16 through a 65536-entry table indexed by the input bits (ggml's gelu f16 path).
pub(crate) fn map_f16_table(ctx: &NodeCtx<'_>, ith: usize, table: &[u16]) -> Result<()> {
    let a = ctx.src(0);
    debug_assert!(a.dtype == DType::F16 && ctx.dst().dtype == DType::F16 && table.len() == 65536);
    let mut rows = ctx.dst_rows(ith);
    for r in rows.range() {
        rows.io::<u16>(a, r).map(|h| table[h as usize]);
    }
    Ok(())
}

/// sqr, sqrt, log, sin, cos, clamp, leaky_relu: ggml's f32 formulas, one monomorphised loop each.
/// ggml's clamp: MAX(MIN(x, max), min) with C's ternary MIN/MAX.
pub(crate) fn clamp(ctx: &NodeCtx<'_>, ith: usize, min: f32, max: f32) -> Result<()> {
    map_float(ctx, ith, move |x| {
        let m = if x < max { x } else { max };
        if m > min { m } else { min }
    })
}

/// ggml's leaky_relu: max(x, 0) + slope * min(x, 0).
pub(crate) fn leaky_relu(ctx: &NodeCtx<'_>, ith: usize, ns: f32) -> Result<()> {
    map_float(ctx, ith, move |x| {
        (if x > 0.0 { x } else { 0.0 }) + ns * if x < 0.0 { x } else { 0.0 }
    })
}

fn internal(ctx: &NodeCtx<'_>, msg: &str) -> Error {
    Error::Unsupported { op: ctx.node.op.name(), backend: "CPU".into(), msg: msg.into() }
}

/// add/sub/mul/div when a type is F16 or BF16 (F16+F16, F16+F32, BF16+BF16, BF16+F32; the
/// result in a's type, or F32 through add_cast): b broadcast over a in all four dims, converted
/// through f32 as ggml's `apply_binary_op`.
pub(crate) fn binary_mixed(ctx: &NodeCtx<'_>, ith: usize, f: fn(f32, f32) -> f32) -> Result<()> {
    let (a, b, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    let mut rows = ctx.dst_rows(ith);
    for r in rows.range() {
        let (i1, i2, i3) = r.i();
        let (j1, j2, j3) = (i1 % b.ne[1], i2 % b.ne[2], i3 % b.ne[3]);
        for i0 in 0..d.ne[0] {
            let x = rows.load(a, i0, i1, i2, i3);
            let y = rows.load(b, i0 % b.ne[0], j1, j2, j3);
            rows.store(r, i0, f(x, y));
        }
    }
    Ok(())
}

/// Work-buffer bytes of add/add1 with a quantized `a`: one f32 row per worker.
pub(crate) fn quant_row_work_size(node: &ExecNode, nth: usize) -> usize {
    match node.src[0].as_ref() {
        Some(a) if a.dtype.is_quantized() => nth * align_up(a.ne[0] * 4, 64),
        _ => 0,
    }
}

/// add (an F32 `b` of `a`'s shape) or add1 (an F32 scalar) with a block-quantized `a`
/// (ggml's add_q_f32 / add1_q_f32): each row is dequantized into the worker's scratch row, `b`
/// is added, and the sum is written as dst's type (requantized, or F32/F16/BF16 for add_cast).
pub(crate) fn add_quant(ctx: &NodeCtx<'_>, ith: usize, scalar_b: bool) -> Result<()> {
    let (a, b, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    let op = ctx.node.op.name();
    let ne0 = a.ne[0];
    let tmp = ctx.scratch::<f32>(ith, align_up(ne0 * 4, 64), ne0);
    let to_f32 = super::get_rows::row_converter(ctx.kt, a.dtype)
        .ok_or_else(|| internal(ctx, "no dequantizer for a"))?;
    // add1's b has one element (build-time check).
    let scalar = scalar_b.then(|| b.load(0, 0, 0, 0));
    let mut rows = ctx.dst_rows(ith);
    for r in rows.range() {
        let (i1, i2, i3) = unravel_row(r.r(), &a.ne);
        // a and dst have the same shape and contiguous rows (build-time check); in place, a's
        // row is the destination row, converted before it is overwritten.
        if a.written {
            to_f32(rows.bytes(r), tmp);
        } else {
            to_f32(a.row_bytes(i1, i2, i3), tmp);
        }
        match scalar {
            Some(v) => tmp.iter_mut().for_each(|x| *x += v),
            // b: F32 with a's shape and contiguous rows (build-time check).
            None => tmp.iter_mut().zip(b.row_of::<f32>(i1, i2, i3)).for_each(|(x, y)| *x += y),
        }
        super::cpy::store_row(ctx.kt, op, d.dtype, tmp, rows.bytes(r))?;
    }
    Ok(())
}

/// a + b[0] (ggml_compute_forward_add1): the scalar is read in its own type.
pub(crate) fn add1(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    if ctx.src(0).dtype.is_quantized() {
        return add_quant(ctx, ith, true);
    }
    // b has exactly one element (build-time check).
    let v = ctx.src(1).load(0, 0, 0, 0);
    map_float(ctx, ith, move |x| x + v)
}

/// dst[:, i1, i2] = a[:, i1, i2] + b[:, ids[i1, i2]] (ggml_compute_forward_add_id_f32).
pub(crate) fn add_id(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (a, b, ids) = (ctx.src(0), ctx.src(1), ctx.src(2));
    let mut rows = ctx.dst_rows(ith);
    for r in rows.range() {
        let (i1, i2, _) = r.i();
        // ids is [a.ne1, a.ne2] (build-time check), so (i1, i2) index it.
        let id = ids.get::<i32>(i1, i2, 0, 0);
        if id < 0 || id as usize >= b.ne[1] {
            return Err(Error::IndexOutOfRange {
                op: "add_id",
                tensor: ctx.node.label(),
                index: id as i64,
                limit: b.ne[1],
            });
        }
        // Rows of b are contiguous F32 (build-time check).
        let pb = b.row_of::<f32>(id as usize, 0, 0);
        let mut io = rows.io::<f32>(a, r);
        for (i0, &y) in pb.iter().enumerate().take(io.len()) {
            let v = io.src(i0) + y;
            io.set(i0, v);
        }
    }
    Ok(())
}

/// acc, phase 0: dst = a (skipped in place); phase 1: dst view += b, split by b's rows.
pub(crate) fn acc(
    ctx: &NodeCtx<'_>,
    phase: u8,
    ith: usize,
    nb: [usize; 3],
    offset: usize,
) -> Result<()> {
    let (a, b, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    if phase == 0 {
        if a.written {
            return Ok(()); // in place: dst is a
        }
        // a and dst are contiguous F32 of the same shape (build-time check).
        let mut rows = ctx.dst_rows(ith);
        for r in rows.range() {
            let (i1, i2, i3) = unravel_row(r.r(), &a.ne);
            rows.row::<f32>(r).copy_from_slice(a.row_of::<f32>(i1, i2, i3));
        }
        return Ok(());
    }
    let (r0, r1) = split(b.nrows(), ith, ctx.nth);
    for r in r0..r1 {
        let (i1, i2, i3) = unravel_row(r, &b.ne);
        let off = offset + i1 * nb[0] + i2 * nb[1] + i3 * nb[2];
        // b rows are contiguous F32 (build-time check).
        let pb = b.row_of::<f32>(i1, i2, i3);
        // SAFETY: the builder checked that every element of the strided view lies inside a
        // (and dst, which has a's contiguous layout), that its offset and strides are multiples
        // of 4 (so the F32 elements are aligned) and that distinct elements of the view are
        // distinct bytes, so workers, which own distinct rows of b, write disjoint elements.
        unsafe {
            let pd = d.ptr.add(off) as *mut f32;
            for (i0, &y) in pb.iter().enumerate() {
                *pd.add(i0) += y;
            }
        }
    }
    Ok(())
}

/// Every element of dst = value (ggml_compute_forward_fill).
pub(crate) fn fill(ctx: &NodeCtx<'_>, ith: usize, value: f32) -> Result<()> {
    let mut rows = ctx.dst_rows(ith);
    for r in rows.range() {
        for i0 in 0..ctx.dst().ne[0] {
            rows.store(r, i0, value);
        }
    }
    Ok(())
}

/// Row-wise "copy or replace": dst[i0, i1, ..] = keep(i0, i1) ? a[...] : fill (tri,
/// diag_mask_inf, diag_mask_zero). In place the copy is a no-op.
fn masked_copy(ctx: &NodeCtx<'_>, ith: usize, keep: impl Fn(usize, usize) -> bool, fill: f32) {
    let (a, d) = (ctx.src(0), ctx.dst());
    let mut rows = ctx.dst_rows(ith);
    for r in rows.range() {
        let (i1, i2, i3) = r.i();
        for i0 in 0..d.ne[0] {
            let v = if keep(i0, i1) { rows.load(a, i0, i1, i2, i3) } else { fill };
            rows.store(r, i0, v);
        }
    }
}

pub(crate) fn tri(ctx: &NodeCtx<'_>, ith: usize, kind: crate::graph::TriType) -> Result<()> {
    masked_copy(ctx, ith, |i0, i1| kind.keeps(i0, i1), 0.0);
    Ok(())
}

pub(crate) fn diag_mask(ctx: &NodeCtx<'_>, ith: usize, n_past: usize, value: f32) -> Result<()> {
    // ggml: columns i >= n_past with i > n_past + row are replaced.
    masked_copy(ctx, ith, |i0, i1| i0 <= n_past + i1, value);
    Ok(())
}

/// [n, 1, p, q] -> [n, n, p, q] with a on the diagonal (ggml_compute_forward_diag_f32).
pub(crate) fn diag(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (a, d) = (ctx.src(0), ctx.dst());
    let mut rows = ctx.dst_rows(ith);
    for r in rows.range() {
        let (i1, i2, i3) = r.i();
        for i0 in 0..d.ne[0] {
            // a is [n, 1, p, q] and dst [n, n, p, q]; i1 < n indexes a's row.
            let v = if i0 == i1 { a.load(i1, 0, i2, i3) } else { 0.0 };
            rows.store(r, i0, v);
        }
    }
    Ok(())
}
