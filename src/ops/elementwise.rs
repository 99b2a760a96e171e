//! Elementwise drivers on F32/F16/BF16 and quantized rows (ggml's ops.cpp, unary-ops.cpp, binary-ops.cpp): mixed-type
//! add/sub/mul/div, add1, add_id, acc, clamp, leaky_relu, sqr, sqrt, log, sin, cos, fill, tri,
//! diag, diag_mask_inf/zero. Every driver splits dst rows between workers (ggml's contiguous
//! split), so each output element is written by one worker with one fixed arithmetic.

use super::{NodeCtx, split, unravel_row};
use crate::dtype::DType;
use crate::error::{Error, Result};

use crate::ops::node::{ExecNode, TView, align_up};
use crate::quant::util::{bf16_to_fp32, fp16_to_fp32, fp32_to_bf16, fp32_to_fp16};

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

/// Stores an f32 as one F32, F16, BF16 or I32 element (halves rounded to nearest even, as ggml).
///
/// # Safety
/// `p` points at one writable element of type `dt` (one of those four).
#[inline(always)]
pub(crate) unsafe fn st(p: *mut u8, dt: DType, v: f32) {
    // SAFETY: per the contract.
    unsafe {
        match dt {
            DType::F16 => (p as *mut u16).write_unaligned(fp32_to_fp16(v)),
            DType::BF16 => (p as *mut u16).write_unaligned(fp32_to_bf16(v)),
            // ggml converts with a C cast; Rust's saturating cast avoids undefined behaviour.
            DType::I32 => (p as *mut i32).write_unaligned(v as i32),
            _ => (p as *mut f32).write_unaligned(v),
        }
    }
}

/// Address of element (i0, i1, i2, i3) of `t`.
///
/// # Safety
/// The indices are below `t.ne`; the plan validated that the tensor's extent lies in memory.
#[inline(always)]
pub(crate) unsafe fn at(t: &TView, i0: usize, i1: usize, i2: usize, i3: usize) -> *mut u8 {
    // SAFETY: per the contract.
    unsafe { t.row(i1, i2, i3).add(i0 * t.nb[0]) }
}

/// dst = f(src0) elementwise over worker `ith`'s rows; src0 and dst have the same shape, F32 or
/// F16 each, any strides (dst may be src0's memory exactly: in place).
pub(crate) fn map_float(ctx: &NodeCtx<'_>, ith: usize, f: impl Fn(f32) -> f32) -> Result<()> {
    let (a, d) = (ctx.src(0), ctx.dst());
    let ne0 = d.ne[0];
    let (r0, r1) = split(d.nrows(), ith, ctx.nth);
    for r in r0..r1 {
        let (i1, i2, i3) = unravel_row(r, &d.ne);
        // SAFETY: indices below dst's ne (= a's ne, build-time check); each worker writes its
        // own rows; each element is read before the same element is written.
        unsafe {
            let (pa, pd) = (a.row(i1, i2, i3), d.row(i1, i2, i3));
            if a.dtype == DType::F32 && d.dtype == DType::F32 && a.nb[0] == 4 && d.nb[0] == 4 {
                let (pa, pd) = (pa as *const f32, pd as *mut f32);
                for i in 0..ne0 {
                    *pd.add(i) = f(*pa.add(i));
                }
            } else {
                for i in 0..ne0 {
                    st(pd.add(i * d.nb[0]), d.dtype, f(ld(pa.add(i * a.nb[0]), a.dtype)));
                }
            }
        }
    }
    Ok(())
}

/// F16 -> F16 through a 65536-entry table indexed by the input bits (ggml's gelu f16 path).
pub(crate) fn map_f16_table(ctx: &NodeCtx<'_>, ith: usize, table: &[u16]) -> Result<()> {
    let (a, d) = (ctx.src(0), ctx.dst());
    debug_assert!(a.dtype == DType::F16 && d.dtype == DType::F16 && table.len() == 65536);
    let (r0, r1) = split(d.nrows(), ith, ctx.nth);
    for r in r0..r1 {
        let (i1, i2, i3) = unravel_row(r, &d.ne);
        for i0 in 0..d.ne[0] {
            // SAFETY: indices below the shared shape; own rows; read before write.
            unsafe {
                let h = (at(a, i0, i1, i2, i3) as *const u16).read_unaligned();
                (at(d, i0, i1, i2, i3) as *mut u16).write_unaligned(table[h as usize]);
            }
        }
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
    let (r0, r1) = split(d.nrows(), ith, ctx.nth);
    for r in r0..r1 {
        let (i1, i2, i3) = unravel_row(r, &d.ne);
        // SAFETY: a has dst's shape; b's indices are reduced modulo its shape; extents
        // validated at plan time; each worker writes its own rows; in place is exact aliasing.
        unsafe {
            let (pa, pd) = (a.row(i1, i2, i3), d.row(i1, i2, i3));
            let pb = b.row(i1 % b.ne[1], i2 % b.ne[2], i3 % b.ne[3]);
            for i0 in 0..d.ne[0] {
                let x = ld(pa.add(i0 * a.nb[0]), a.dtype);
                let y = ld(pb.add((i0 % b.ne[0]) * b.nb[0]), b.dtype);
                st(pd.add(i0 * d.nb[0]), d.dtype, f(x, y));
            }
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
    let stride = align_up(ne0 * 4, 64);
    debug_assert!((ith + 1) * stride <= ctx.work_len);
    // SAFETY: the work buffer holds nth rows of ne0 f32 (quant_row_work_size); this one is ours.
    let tmp =
        unsafe { std::slice::from_raw_parts_mut(ctx.work.add(ith * stride) as *mut f32, ne0) };
    let to_f32 = super::get_rows::row_converter(ctx.kt, a.dtype)
        .ok_or_else(|| internal(ctx, "no dequantizer for a"))?;
    // SAFETY: add1's b has one element (build-time check).
    let scalar = scalar_b.then(|| unsafe { ld(b.ptr, b.dtype) });
    let (sa, sd) = (a.dtype.row_bytes(ne0), d.dtype.row_bytes(ne0));
    let (r0, r1) = split(a.nrows(), ith, ctx.nth);
    for r in r0..r1 {
        let (i1, i2, i3) = unravel_row(r, &a.ne);
        // SAFETY: a and dst have the same shape and contiguous rows of sa / sd bytes (build-time
        // check), so (i1, i2, i3) addresses whole rows; each worker owns its rows. In place, the
        // row of a is read completely (and its slice dropped) before dst's row is written.
        unsafe {
            to_f32(std::slice::from_raw_parts(a.row(i1, i2, i3), sa), tmp);
            match scalar {
                Some(v) => tmp.iter_mut().for_each(|x| *x += v),
                None => {
                    // b: F32 with a's shape and contiguous rows (build-time check).
                    let pb = b.row(i1, i2, i3) as *const f32;
                    for (i, x) in tmp.iter_mut().enumerate() {
                        *x += pb.add(i).read_unaligned();
                    }
                }
            }
            let dst = std::slice::from_raw_parts_mut(d.row(i1, i2, i3), sd);
            super::cpy::store_row(ctx.kt, op, d.dtype, tmp, dst)?;
        }
    }
    Ok(())
}

/// a + b[0] (ggml_compute_forward_add1): the scalar is read in its own type.
pub(crate) fn add1(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    if ctx.src(0).dtype.is_quantized() {
        return add_quant(ctx, ith, true);
    }
    let b = ctx.src(1);
    // SAFETY: b has exactly one element (build-time check).
    let v = unsafe { ld(b.ptr, b.dtype) };
    map_float(ctx, ith, move |x| x + v)
}

/// dst[:, i1, i2] = a[:, i1, i2] + b[:, ids[i1, i2]] (ggml_compute_forward_add_id_f32).
pub(crate) fn add_id(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (a, b, ids, d) = (ctx.src(0), ctx.src(1), ctx.src(2), ctx.dst());
    let (r0, r1) = split(d.nrows(), ith, ctx.nth);
    for r in r0..r1 {
        let (i1, i2, i3) = unravel_row(r, &d.ne);
        // SAFETY: ids is [a.ne1, a.ne2] (build-time check), so (i1, i2) index it.
        let id = unsafe { (at(ids, i1, i2, 0, 0) as *const i32).read_unaligned() };
        if id < 0 || id as usize >= b.ne[1] {
            return Err(Error::IndexOutOfRange {
                op: "add_id",
                tensor: ctx.node.label(),
                index: id as i64,
                limit: b.ne[1],
            });
        }
        // SAFETY: id < b.ne[1] (checked); rows of a, b are contiguous F32 (build-time check) and
        // dst rows are this worker's own; in place is exact aliasing with a.
        unsafe {
            let pa = a.row(i1, i2, i3) as *const f32;
            let pb = b.row(id as usize, 0, 0) as *const f32;
            let pd = d.row(i1, i2, i3);
            for i0 in 0..d.ne[0] {
                (pd.add(i0 * d.nb[0]) as *mut f32).write_unaligned(*pa.add(i0) + *pb.add(i0));
            }
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
        if a.ptr == d.ptr {
            return Ok(());
        }
        // a and dst are contiguous F32 of the same shape (build-time check).
        let (r0, r1) = split(d.nrows(), ith, ctx.nth);
        for r in r0..r1 {
            let (i1, i2, i3) = unravel_row(r, &d.ne);
            // SAFETY: same shape, own rows, different memory (not in place).
            unsafe {
                std::ptr::copy(a.row(i1, i2, i3), d.row(i1, i2, i3), d.ne[0] * 4);
            }
        }
        return Ok(());
    }
    let (r0, r1) = split(b.nrows(), ith, ctx.nth);
    for r in r0..r1 {
        let (i1, i2, i3) = unravel_row(r, &b.ne);
        let off = offset + i1 * nb[0] + i2 * nb[1] + i3 * nb[2];
        // SAFETY: the builder checked that every element of the strided view lies inside a
        // (and dst, which has a's contiguous layout) and that distinct elements of the view are
        // distinct bytes, so workers, which own distinct rows of b, write disjoint elements; b
        // rows are contiguous F32.
        unsafe {
            let pb = b.row(i1, i2, i3) as *const f32;
            let pd = d.ptr.add(off) as *mut f32;
            for i0 in 0..b.ne[0] {
                let v = pd.add(i0).read_unaligned() + *pb.add(i0);
                pd.add(i0).write_unaligned(v);
            }
        }
    }
    Ok(())
}

/// Every element of dst = value (ggml_compute_forward_fill).
pub(crate) fn fill(ctx: &NodeCtx<'_>, ith: usize, value: f32) -> Result<()> {
    let d = ctx.dst();
    let (r0, r1) = split(d.nrows(), ith, ctx.nth);
    for r in r0..r1 {
        let (i1, i2, i3) = unravel_row(r, &d.ne);
        for i0 in 0..d.ne[0] {
            // SAFETY: indices below dst's ne; own rows.
            unsafe { st(at(d, i0, i1, i2, i3), d.dtype, value) };
        }
    }
    Ok(())
}

/// Row-wise "copy or replace": dst[i0, i1, ..] = keep(i0, i1) ? a[...] : fill (tri,
/// diag_mask_inf, diag_mask_zero). In place the copy is a no-op.
fn masked_copy(ctx: &NodeCtx<'_>, ith: usize, keep: impl Fn(usize, usize) -> bool, fill: f32) {
    let (a, d) = (ctx.src(0), ctx.dst());
    let (r0, r1) = split(d.nrows(), ith, ctx.nth);
    for r in r0..r1 {
        let (i1, i2, i3) = unravel_row(r, &d.ne);
        for i0 in 0..d.ne[0] {
            // SAFETY: a and dst share the shape; own rows; read before write.
            unsafe {
                let v = if keep(i0, i1) { ld(at(a, i0, i1, i2, i3), a.dtype) } else { fill };
                st(at(d, i0, i1, i2, i3), d.dtype, v);
            }
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
    let (r0, r1) = split(d.nrows(), ith, ctx.nth);
    for r in r0..r1 {
        let (i1, i2, i3) = unravel_row(r, &d.ne);
        for i0 in 0..d.ne[0] {
            // SAFETY: a is [n, 1, p, q] and dst [n, n, p, q]; i1 < n indexes a's row; own rows.
            unsafe {
                let v = if i0 == i1 { ld(at(a, i1, 0, i2, i3), a.dtype) } else { 0.0 };
                st(at(d, i0, i1, i2, i3), d.dtype, v);
            }
        }
    }
    Ok(())
}
