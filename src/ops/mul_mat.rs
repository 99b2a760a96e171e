//! mul_mat: dst[i, j] = dot(a row i, b row j) with a broadcast over dims 2 and 3
//! (ggml's ggml_compute_forward_mul_mat). Phase 0 converts b's rows into a's vec-dot type in the
//! work buffer (all threads); phase 1 hands out 16x16 output tiles through an atomic counter.
//! A single row to convert (decode) is converted by every worker into its own slot, in the one
//! phase the node then has.
//! Each output is one dot product of the full row, so results do not depend on the thread count.
//! With two or more columns, types with a register-tile kernel (`KernelTable::gemm`) compute each
//! 16x16 tile in small blocks that share loads; every output is still bitwise the tier's `vec_dot`.

use super::{NodeCtx, split, unravel_row};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::{Graph, Tensor};
use crate::kernels::KernelTable;
use crate::kernels::{GEMM_MR, GEMM_NR};
use crate::ops::node::{ExecNode, TView};

const TILE: usize = 16;

fn needs_conversion(node: &ExecNode) -> bool {
    let (a, b) = (node.src[0].as_ref(), node.src[1].as_ref());
    match (a, b) {
        (Some(a), Some(b)) => b.dtype != a.dtype.vec_dot_type() || b.nb[0] != b.dtype.type_size(),
        _ => false,
    }
}

/// One activation row to convert on the dot-product path (decode): each worker converts it into
/// a slot of its own and goes straight on to its dot products, so the node has one phase and no
/// barrier between the conversion and the dots (the conversion of one row costs less than a
/// barrier's wait; two-phase nodes left one worker idle while the other converted).
fn private_conversion(node: &ExecNode) -> bool {
    needs_conversion(node)
        && node.src[1].as_ref().is_some_and(|b| b.nrows() == 1)
        && !super::mul_mat_repack::applies(node)
        && !super::mul_mat_q::applies(node)
        && !super::mul_mat_f::applies(node)
}

/// Bytes of one worker's slot for [`private_conversion`]: the converted row, then an f32 row.
fn private_slot_bytes(node: &ExecNode) -> usize {
    let k = node.src[1].as_ref().map_or(0, |b| b.ne[0]);
    converted_row_bytes(node) + crate::ops::node::align_up(k * 4, 64)
}

/// The tier needs the weight type's dot product and the activation conversion.
pub(crate) fn supports(graph: &Graph, t: &Tensor, kt: &KernelTable) -> Result<()> {
    let a = graph.t(t.src[0].ok_or_else(|| Error::arg("mul_mat: no a"))?);
    let vd = a.dtype.vec_dot_type();
    if kt.vec_dot(a.dtype).is_none() || kt.activation_converter(vd).is_none() {
        return Err(Error::Unsupported {
            op: "mul_mat",
            backend: "CPU".into(),
            msg: format!("no {} x {vd} dot product kernel", a.dtype),
        });
    }
    Ok(())
}

pub(crate) fn phases(node: &ExecNode) -> u8 {
    if super::mul_mat_repack::applies(node) {
        return 2;
    }
    let convert_first = needs_conversion(node) && !private_conversion(node);
    if super::mul_mat_q::applies(node) || super::mul_mat_f::applies(node) || convert_first {
        2
    } else {
        1
    }
}

fn converted_row_bytes(node: &ExecNode) -> usize {
    let (a, b) = (node.src[0].as_ref(), node.src[1].as_ref());
    match (a, b) {
        (Some(a), Some(b)) => {
            crate::ops::node::align_up(a.dtype.vec_dot_type().row_bytes(b.ne[0]), 64)
        }
        _ => 0,
    }
}

pub(crate) fn work_size(node: &ExecNode, nth: usize) -> usize {
    // The integer GEMM runs only on tiers with its kernels; the plan holds room for the path
    // every tier takes, so it does not depend on the tier selected when it was made.
    let int =
        if super::mul_mat_q::applies(node) { super::mul_mat_q::work_size(node, nth) } else { 0 };
    if super::mul_mat_repack::applies(node) {
        return int.max(super::mul_mat_repack::work_size(node, nth));
    }
    if super::mul_mat_f::applies(node) {
        return int.max(super::mul_mat_f::work_size(node, nth));
    }
    if !needs_conversion(node) {
        return int;
    }
    if private_conversion(node) {
        return int.max(nth * private_slot_bytes(node));
    }
    let b = node.src[1].as_ref().map(|b| (b.nrows(), b.ne[0])).unwrap_or((0, 0));
    int.max(b.0 * converted_row_bytes(node) + nth * crate::ops::node::align_up(b.1 * 4, 64))
}

fn convert(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (b, k) = (ctx.src(1), ctx.src(1).ne[0]);
    let rb = converted_row_bytes(ctx.node);
    let nrows = b.nrows();
    let scratch_off = nrows * rb + ith * crate::ops::node::align_up(k * 4, 64);
    debug_assert!(scratch_off + k * 4 <= ctx.work_len);
    let (r0, r1) = split(nrows, ith, ctx.nth);
    for r in r0..r1 {
        // SAFETY: the work buffer holds nrows converted rows of `rb` bytes followed by one f32
        // scratch row per thread (work_size); this worker writes only its rows and its scratch.
        unsafe {
            convert_row(ctx, r, ctx.work.add(r * rb), ctx.work.add(scratch_off) as *mut f32)
        }?;
    }
    Ok(())
}

/// Converts b's flat row `r` into a's vec-dot type at `out`, with `scratch` for an f32 copy.
///
/// # Safety
/// `r` < b's row count; `out` is valid for writes of the converted row (`vd.row_bytes(k)`),
/// `scratch` for `k` f32 (4-byte aligned), both used by this worker alone.
unsafe fn convert_row(ctx: &NodeCtx<'_>, r: usize, out: *mut u8, scratch: *mut f32) -> Result<()> {
    let (a, b) = (ctx.src(0), ctx.src(1));
    let vd = a.dtype.vec_dot_type();
    let from = ctx.kt.activation_converter(vd).ok_or_else(|| Error::Unsupported {
        op: "mul_mat",
        backend: "CPU".into(),
        msg: format!("no f32 -> {vd} conversion"),
    })?;
    let k = b.ne[0];
    let (i1, i2, i3) = unravel_row(r, &b.ne);
    // SAFETY: the caller's guarantees for `out` and `scratch`; b's indices are below its shape
    // (extent validated at plan time), so with nb[0] == 4 its row is k f32 at pb (read as a
    // slice only when pb is 4-byte aligned).
    unsafe {
        let out = std::slice::from_raw_parts_mut(out, vd.row_bytes(k));
        let scratch = std::slice::from_raw_parts_mut(scratch, k);
        let pb = b.row(i1, i2, i3);
        if b.dtype == DType::F32 {
            from(super::f32_run(b, pb, (0, k), scratch), out);
        } else if b.dtype != vd {
            // BF16 activations of F32 weights (the builder allows no other pair): widened
            // into the f32 rows the dot product reads, as ggml does.
            debug_assert!(b.dtype == DType::BF16 && vd == DType::F32);
            let dst = out.as_mut_ptr() as *mut f32;
            for i in 0..k {
                let h = (pb.add(i * b.nb[0]) as *const u16).read_unaligned();
                dst.add(i).write_unaligned(crate::quant::util::bf16_to_fp32(h));
            }
        } else {
            // Same type as vd but strided elements: gather element by element.
            let ts = b.dtype.type_size();
            for i in 0..k {
                std::ptr::copy_nonoverlapping(
                    pb.add(i * b.nb[0]),
                    out.as_mut_ptr().add(i * ts),
                    ts,
                );
            }
        }
    }
    Ok(())
}

pub(crate) fn compute(ctx: &NodeCtx<'_>, phase: u8, ith: usize) -> Result<()> {
    // The integer GEMM first: it reads repacked weights as well (prefill), the repacked kernels
    // take what it does not (decode, tiers without integer kernels).
    if super::mul_mat_q::runs_on(ctx.node, ctx.kt) {
        return if phase == 0 {
            super::mul_mat_q::pack(ctx, ith)
        } else {
            super::mul_mat_q::compute(ctx, ith)
        };
    }
    if super::mul_mat_repack::applies(ctx.node) {
        return if phase == 0 {
            super::mul_mat_repack::convert(ctx, ith)
        } else {
            super::mul_mat_repack::compute(ctx, ith)
        };
    }
    if super::mul_mat_f::applies(ctx.node) {
        return if phase == 0 {
            super::mul_mat_f::pack(ctx, ith)
        } else {
            super::mul_mat_f::compute(ctx, ith)
        };
    }
    let conv = needs_conversion(ctx.node);
    let private = private_conversion(ctx.node);
    if conv && !private && phase == 0 {
        return convert(ctx, ith);
    }
    // With one row to convert, this worker's own copy in its slot.
    let private_row = if private {
        let slot = ith * private_slot_bytes(ctx.node);
        debug_assert!(slot + private_slot_bytes(ctx.node) <= ctx.work_len);
        let rb = converted_row_bytes(ctx.node);
        // SAFETY: work_size reserved nth slots of `private_slot_bytes` (a converted row of `rb`
        // bytes, then k f32, 64-byte aligned); worker ith alone uses slot ith; b has one row.
        unsafe {
            let out = ctx.work.add(slot);
            convert_row(ctx, 0, out, out.add(rb) as *mut f32)?;
            Some(out as *const u8)
        }
    } else {
        None
    };
    let (a, b, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    let table = ctx.kt;
    let dot = table.vec_dot(a.dtype).ok_or_else(|| Error::Unsupported {
        op: "mul_mat",
        backend: "CPU".into(),
        msg: format!("no {} dot product", a.dtype),
    })?;
    // Few columns (decode): each weight row is read once, from memory; the streaming variant
    // prefetches it, and rows go two at a time where the tier has the two-row form (the same
    // bits).
    let dots = if d.ne[1] <= 4 {
        super::RowDots::decode(table, a.dtype, dot)
    } else {
        super::RowDots::one(dot)
    };
    let k = a.ne[0];
    let vd = a.dtype.vec_dot_type();
    let a_row_bytes = a.dtype.row_bytes(k);
    let b_row_bytes = vd.row_bytes(k);
    let rb = converted_row_bytes(ctx.node);
    let (m, n) = (d.ne[0], d.ne[1]);
    let (r2, r3) = (b.ne[2] / a.ne[2], b.ne[3] / a.ne[3]);
    // Rows per task: 16, or with one column (decode) enough rows for about 32 KiB of weights, as
    // long as every thread still gets several tasks. Each task costs an atomic increment on a
    // line all workers share; with short rows (q8_0 K = 576: 612 bytes) 16-row tasks spent a
    // fifth of the time there.
    let rows = if n == 1 { (32 << 10) / a_row_bytes.max(1) } else { TILE };
    let rows = rows.min(m / (4 * ctx.nth).max(1)).max(TILE);
    let tiles_m = m.div_ceil(rows);
    let tiles_n = n.div_ceil(TILE);
    let per_batch = tiles_m * tiles_n;
    let total = per_batch * d.ne[2] * d.ne[3];
    // Decode (n == 1) keeps the plain dot products, one weight row after another: the tile
    // kernels pay off only when columns share weight loads, and with one column their several
    // concurrent row streams read memory slower (q8_0 49152 x 1 x 576 on 2 threads: 2.9 ms with
    // 4-row tiles, 1.7 ms row by row). The results are the same bits either way. Long F32 rows
    // (32 KiB and more) are the exception: there a 4-row tile's streams read faster (4096 x 1 x
    // 14336 on 2 Emerald Rapids cores, alternating, medians of 5 rounds: 11.71 ms row by row,
    // 10.28 tiles), where rows of 576 did not gain (f32 49152 x 1 x 576: 2.6 / 2.9-3.2 ms) and
    // F16 rows of 28 KiB measured both ways (1.3-1.6x in 3 rounds, 0.98x in 5).
    let long_float = a.dtype == DType::F32 && a_row_bytes >= 32 << 10;
    let gemm = if n > 1 || long_float { table.gemm(a.dtype) } else { None };
    // Decode: one contiguous run of tasks per worker (`Claims`), one memory stream per core.
    // Each output is still one dot product, so the bits do not change.
    // q8_0 262144 x 1 x 640 (Gemma 3's output), 2 threads, alternating: 7.3-10.7 ms with claims
    // in task order (both workers' streams interleaved), 5.5-6.5 ms so; decode of SmolLM2 Q8_0
    // 113 -> 134 tokens/s, Q4_K_M 111 -> 142, Gemma 3 270M 67 -> 74 (medians of 3).
    let claims = super::Claims::new(total, if n == 1 { ctx.nth } else { 1 });
    while let Some(c) = claims.next(ctx.counter) {
        let batch = c / per_batch;
        let t = c % per_batch;
        let (i2, i3) = (batch % d.ne[2], batch / d.ne[2]);
        let (tm, tn) = (t % tiles_m, t / tiles_m);
        let (i0s, i0e) = (tm * rows, ((tm + 1) * rows).min(m));
        let (j0, j1) = (tn * TILE, ((tn + 1) * TILE).min(n));
        if let Some(gemm) = gemm {
            let b_row = |j: usize| -> &[u8] {
                // SAFETY: as in the loop below: j < n, and the row is `b_row_bytes` long.
                unsafe {
                    let p = if let Some(p) = private_row {
                        p
                    } else if conv {
                        ctx.work.add(((i3 * b.ne[2] + i2) * b.ne[1] + j) * rb)
                    } else {
                        b.row(j, i2, i3)
                    };
                    std::slice::from_raw_parts(p, b_row_bytes)
                }
            };
            let a_row = |i: usize| -> &[u8] {
                // SAFETY: as in the loop below: i < m and the broadcast indices are in range.
                unsafe { std::slice::from_raw_parts(a.row(i, i2 / r2, i3 / r3), a_row_bytes) }
            };
            let mut j = j0;
            while j < j1 {
                let nc = (j1 - j).min(GEMM_NR);
                let ys: [&[u8]; GEMM_NR] = std::array::from_fn(|c| b_row(j + c.min(nc - 1)));
                let mut i = i0s;
                while i < i0e {
                    let nr = (i0e - i).min(GEMM_MR);
                    let xs: [&[u8]; GEMM_MR] = std::array::from_fn(|r| a_row(i + r.min(nr - 1)));
                    let mut out = [0.0f32; GEMM_MR * GEMM_NR];
                    gemm(k, &xs[..nr], &ys[..nc], &mut out);
                    for c in 0..nc {
                        for r in 0..nr {
                            // SAFETY: i + r < i0e <= m and j + c < j1 <= n: the element belongs
                            // to this tile, which only this worker took.
                            unsafe { *(dst_elem(d, i + r, j + c, i2, i3)) = out[c * nr + r] };
                        }
                    }
                    i += nr;
                }
                j += nc;
            }
            continue;
        }
        for j in j0..j1 {
            // SAFETY: j < n = b.ne[1], (i2, i3) < b's dims 2, 3; the converted row index is b's
            // flat row index, below nrows; rows are `b_row_bytes` long (contiguous per check);
            // a private row is b's only row, converted into this worker's slot above.
            let yb = unsafe {
                let p = if let Some(p) = private_row {
                    p
                } else if conv {
                    ctx.work.add(((i3 * b.ne[2] + i2) * b.ne[1] + j) * rb)
                } else {
                    b.row(j, i2, i3)
                };
                std::slice::from_raw_parts(p, b_row_bytes)
            };
            let a_row = |i: usize| -> &[u8] {
                // SAFETY: i < i0e <= m = a.ne[1]; i2 / r2 < a.ne[2], i3 / r3 < a.ne[3]
                // (broadcast checked at build); a's rows are contiguous `a_row_bytes` (build
                // check).
                unsafe { std::slice::from_raw_parts(a.row(i, i2 / r2, i3 / r3), a_row_bytes) }
            };
            // SAFETY: used during this compute only.
            let span = unsafe { a.row_span(i0s..i0e, i2 / r2, i3 / r3) };
            // Column j's first element and stride, read once (not per stored element).
            let (col, nb0) =
                (d.ptr.wrapping_add(j * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3]), d.nb[0]);
            super::dot_rows(i0s..i0e, k, yb, dots, a_row, span, |i, v| {
                // SAFETY: i < i0e <= m and j < n: dst element (i, j, i2, i3), at `col + i * nb0`
                // (`dst_elem`), belongs to this tile, which only this worker took.
                unsafe { *(col.add(i * nb0) as *mut f32) = v }
            });
        }
    }
    Ok(())
}

/// The address of dst element (i, j, i2, i3).
///
/// # Safety
/// The indices are below dst's shape, so the address lies inside the tensor the plan placed.
#[inline(always)]
unsafe fn dst_elem(d: &TView, i: usize, j: usize, i2: usize, i3: usize) -> *mut f32 {
    // SAFETY: the caller passes indices below dst's shape.
    unsafe { d.ptr.add(i * d.nb[0] + j * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3]) as *mut f32 }
}
