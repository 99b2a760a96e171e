//! `mul_mat` with several columns as an integer GEMM, for weights with an integer form
//! (`quant::unpack`): the K-quants, IQ and ternary types against Q8_K activations, the legacy
//! types, IQ4_NL, MXFP4, NVFP4, Q1_0 and Q2_0 against Q8_0 / Q8_1. int8 products are summed
//! exactly in int32 per sub-block; the scales are applied in f32 per sub-block (block types and
//! most super-block types), or in int32 with the block scales in f32 (Q2_K, Q3_K, IQ1_M, whose
//! formats allow exact 16-bit forms) (`kernels::igemm::Kind`). It runs where the tier has integer kernels for the type's codes
//! (`KernelTable::igemm`: AVX-512 VNNI, AVX-VNNI, or AVX2 `vpmaddubsw` for codes up to 127, which
//! takes the IQ1-IQ3 grids in their recentred form, `IntFormat::recentred`, and Q8_0, IQ4_NL and
//! IQ4_XS in their signed forms, `IntFormat::signed`, see `tier_form`; Q8_0 only with F32
//! activations, whose levels are never -128); the others keep the f32 GEMM of `mul_mat_f` or the
//! dot-product tiles.
//!
//! Phase 0 (all threads) quantizes b's columns to the weight type's vec-dot type with the CPU's
//! `from_float`, as ggml does (or takes b's rows as they are when already in that type), and
//! regroups them into the GEMM engine's integer panels (`gemm::int::pack_column`: 16 columns per
//! 256 elements of K; a row of a block type whose length is not a multiple of 256 ends in a
//! zero-padded one). Phase 1 runs the engine's integer blocks (`gemm::int`): up to `MC` weight
//! rows by `NC` columns per task, one super-block step at a time. Each output is the sum over
//! super-blocks in K order: the same operations whatever the thread count or the task shapes.

use super::NodeCtx;
use super::gemm::int::{self, BLOCK_SCRATCH, MC, NC, Q8K_BYTES, k_steps, pack_column};
use super::gemm::write_run;
use super::gemm::{Grid, Task};
use crate::dtype::{DType, QK_K};
use crate::error::{Error, Result};
use crate::kernels::KernelTable;
use crate::kernels::igemm::{ABlock, IG_MR, IG_NR, IgemmKernels};
use crate::ops::node::{ExecNode, TView, align_up};
use crate::quant::unpack::{IntFormat, int_format};
/// Fewer columns than this use the dot-product tiles. q4_K 4096 x N x 4096, 2 threads,
/// alternating binaries: the tiles give 98 GFLOPS at N = 4 (the integer GEMM 63); at N = 6 the
/// integer GEMM gives 81 where the f32 GEMM gave 22, at N = 16 264 against 66.
pub(crate) const MIN_N: usize = 6;

/// Whether this node takes the integer GEMM.
pub(crate) fn applies(node: &ExecNode) -> bool {
    let (Some(a), Some(b)) = (node.src[0].as_ref(), node.src[1].as_ref()) else {
        return false;
    };
    let Some(fmt) = int_format(a.dtype) else {
        return false;
    };
    (!a.repacked || crate::quant::repack::supports(a.dtype, &a.ne))
        && node.dst.ne[1] >= MIN_N
        && (b.dtype == DType::F32 || b.dtype == fmt.act && b.nb[0] == b.dtype.type_size())
        && a.ne[0] > 0
        && a.ne[0].is_multiple_of(a.dtype.block_size())
        && a.ne[0].is_multiple_of(fmt.act.block_size())
        && packed_bytes(b) <= super::mul_mat_f::MAX_PACKED
}

/// The tier's integer kernels for weights of format `fmt`, if it has kernels that multiply its
/// codes exactly.
pub(crate) fn kernels_for(kt: &KernelTable, fmt: &IntFormat) -> Option<IgemmKernels> {
    kt.igemm.and_then(|k| k.for_format(fmt))
}

/// Whether this node runs the integer GEMM with table `kt` (else the f32 GEMM or the tiles).
pub(crate) fn runs_on(node: &ExecNode, kt: &KernelTable) -> bool {
    applies(node)
        && node.src[0].as_ref().and_then(|a| int_format(a.dtype)).is_some_and(|f| {
            let own = node.src[1].as_ref().is_some_and(|b| b.dtype == DType::F32);
            kernels_for(kt, &tier_form(kt, f, own)).is_some()
        })
}

fn batches(b: &TView) -> usize {
    b.ne[2] * b.ne[3]
}

fn panels(n: usize) -> usize {
    n.div_ceil(IG_NR)
}

/// Packed activations: per batch, per panel, per super-block one `ABlock` (saturating, so a
/// huge b fails the `MAX_PACKED` check instead of wrapping).
fn packed_bytes(b: &TView) -> usize {
    batches(b)
        .saturating_mul(panels(b.ne[1]))
        .saturating_mul(k_steps(b.ne[0]))
        .saturating_mul(size_of::<ABlock>())
}

/// Per-thread scratch: phase 0 needs one f32 column and its activation blocks (Q8_K is the
/// largest per element of the three); phase 1 the unpacked bands and the f32 tile. They share
/// the area.
pub(crate) fn scratch_bytes(k: usize) -> usize {
    let pack = align_up(k * 4, 64) + align_up(k.div_ceil(32) * 36, 64).max(k_steps(k) * Q8K_BYTES);
    pack.max(BLOCK_SCRATCH)
}

pub(crate) fn work_size(node: &ExecNode, nth: usize) -> usize {
    let b = node.src[1].as_ref().expect("mul_mat b");
    packed_bytes(b) + nth * scratch_bytes(b.ne[0])
}

fn unsupported(msg: String) -> Error {
    Error::Unsupported { op: "mul_mat", backend: "CPU".into(), msg }
}

fn layout(e: bytemuck::PodCastError) -> Error {
    Error::Buffer(format!("mul_mat: integer GEMM scratch layout: {e}"))
}

/// The form of integer format `fmt` that table `kt` runs (`IntFormat::for_tier`): the packer and
/// the kernels of one node (`mul_mat`, `mul_mat_id`) take the same. `own_levels`: the node
/// quantizes its activations from f32 (`IntFormat::signed`).
pub(crate) fn tier_form(kt: &KernelTable, fmt: IntFormat, own_levels: bool) -> IntFormat {
    // Codes too wide for the tier's kernels: the recentred or the signed form where the tier
    // takes it.
    let fmt = if kernels_for(kt, &fmt).is_some() {
        fmt
    } else {
        [fmt.recentred(), fmt.signed(own_levels)]
            .into_iter()
            .flatten()
            .find(|f| kernels_for(kt, f).is_some())
            .unwrap_or(fmt)
    };
    match kernels_for(kt, &fmt) {
        Some(k) => match (fmt.int_scaled(), k.int_scaled) {
            (Some(f), Some(takes)) if takes(&f) => f,
            _ => fmt.for_tier(k.fold_scales.is_some()),
        },
        None => fmt,
    }
}

fn format_of(kt: &KernelTable, a: DType, b: DType) -> Result<IntFormat> {
    let fmt = int_format(a).ok_or_else(|| unsupported(format!("no integer form of {a}")))?;
    Ok(tier_form(kt, fmt, b == DType::F32))
}

/// The packed activation blocks as typed values.
///
/// # Safety
/// The work buffer holds `packed_bytes(b)` bytes at its start (work_size), 64-byte aligned;
/// the caller has exclusive access to the blocks it touches (phase 0: its own panels) or only
/// reads them (phase 1).
unsafe fn act_blocks(ctx: &NodeCtx<'_>) -> *mut ABlock {
    debug_assert!(packed_bytes(ctx.src(1)) <= ctx.work_len);
    debug_assert!((ctx.work as usize).is_multiple_of(64));
    ctx.work as *mut ABlock
}

/// Worker `ith`'s scratch area.
///
/// # Safety
/// Only worker `ith` calls this, once per phase.
unsafe fn scratch<'a>(ctx: &NodeCtx<'_>, ith: usize) -> &'a mut [u8] {
    let b = ctx.src(1);
    let sb = scratch_bytes(b.ne[0]);
    let off = packed_bytes(b) + ith * sb;
    debug_assert!(off + sb <= ctx.work_len);
    // SAFETY: work_size reserved nth areas of `sb` bytes after the packed blocks; worker `ith`
    // alone uses area `ith`. Every size before it is a multiple of 64 (ABlock is 7808 bytes,
    // the scratch areas are sums of 64-aligned parts), so the area is 64-byte aligned.
    unsafe { std::slice::from_raw_parts_mut(ctx.work.add(off), sb) }
}

/// Phase 0: quantize and regroup b's columns, one (batch, panel, run of K steps) unit at a
/// time. A short prompt has a single panel, so K is cut too, to give every worker a share;
/// activation blocks do not depend on each other, so the bytes are the same however it is cut.
pub(crate) fn pack(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (a, b) = (ctx.src(0), ctx.src(1));
    let fmt = format_of(ctx.kt, a.dtype, b.dtype)?;
    let from = ctx
        .kt
        .activation_converter(fmt.act)
        .ok_or_else(|| unsupported(format!("no f32 -> {} conversion", fmt.act)))?;
    let (k, n) = (b.ne[0], b.ne[1]);
    let nkb = k_steps(k);
    let np = panels(n);
    let pu = batches(b) * np;
    // K runs per panel: enough units for two per worker, whole steps each.
    let runs = (2 * ctx.nth).div_ceil(pu).clamp(1, nkb);
    // SAFETY: this worker's own scratch area (one call per phase).
    let sc = unsafe { scratch(ctx, ith) };
    let (colf, rest) = sc.split_at_mut(align_up(k * 4, 64));
    let colf: &mut [f32] = bytemuck::try_cast_slice_mut(&mut colf[..k * 4]).map_err(layout)?;
    let q8 = &mut rest[..fmt.act.row_bytes(k)];
    // SAFETY: see act_blocks; units are split between workers, so this worker alone writes the
    // blocks of its units.
    let blocks = unsafe { act_blocks(ctx) };
    let (u0, u1) = super::split(pu * runs, ith, ctx.nth);
    for u in u0..u1 {
        let (unit, run) = (u / runs, u % runs);
        let (batch, p) = (unit / np, unit % np);
        let (i2, i3) = (batch % b.ne[2], batch / b.ne[2]);
        let (s0, s1) = super::split(nkb, run, runs);
        let (k0, k1) = (s0 * QK_K, (s1 * QK_K).min(k));
        if k0 >= k1 {
            continue;
        }
        // Whole activation blocks: k0 is a multiple of 256, k1 one of the block size or k.
        let (q0, q1) = (fmt.act.row_bytes(k0), fmt.act.row_bytes(k1));
        // SAFETY: unit u's blocks s0..s1 lie inside the packed area, and only this worker
        // has them.
        let ab = unsafe { std::slice::from_raw_parts_mut(blocks.add(unit * nkb + s0), s1 - s0) };
        if (p + 1) * IG_NR > n {
            ab.fill(bytemuck::Zeroable::zeroed());
        }
        for c in 0..IG_NR.min(n - p * IG_NR) {
            let j = p * IG_NR + c;
            if b.dtype == fmt.act {
                // SAFETY: j < b.ne[1], (i2, i3) below b's dims; b's rows are contiguous blocks
                // of the activation type, row_bytes(k) >= q1 long (applies).
                let row = unsafe { std::slice::from_raw_parts(b.row(j, i2, i3), q1) };
                pack_column(&fmt, &row[q0..], ab, c);
                continue;
            }
            // SAFETY: b is F32 here (applies); j < b.ne[1], (i2, i3) below b's dims: a row of
            // b, of ne[0] >= k1 elements (extent validated at plan time); colf holds k values.
            let run = unsafe { super::f32_run(b, b.row(j, i2, i3), (k0, k1), colf) };
            let q8 = &mut q8[..q1 - q0];
            from(run, q8);
            pack_column(&fmt, q8, ab, c);
        }
    }
    Ok(())
}

/// Phase 1: the engine's blocks of `MC` rows (halved down to one band while there are fewer
/// than four per thread) by `NC` columns.
pub(crate) fn compute(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (a, b, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    let fmt = format_of(ctx.kt, a.dtype, b.dtype)?;
    let kernels = kernels_for(ctx.kt, &fmt).ok_or_else(|| {
        unsupported(format!("no integer GEMM kernels for {} in this tier", a.dtype))
    })?;
    let (k, m, n) = (a.ne[0], d.ne[0], d.ne[1]);
    let nkb = k_steps(k);
    let np = panels(n);
    let batches = d.ne[2] * d.ne[3];
    let (r2, r3) = (b.ne[2] / a.ne[2], b.ne[3] / a.ne[3]);
    let grid = Grid::new(m, n, batches, MC, NC)
        .balanced(IG_MR, ctx.nth)
        .split_tail(if ctx.nth > 1 { ctx.nth } else { 0 }, IG_NR);
    let bsize = a.dtype.type_size();
    let repacked = a.repacked.then_some(a.dtype);
    // SAFETY: this worker's own scratch area (one call per phase).
    let sc = unsafe { scratch(ctx, ith) };
    // SAFETY: see act_blocks.
    let blocks = unsafe { act_blocks(ctx) as *const ABlock };
    grid.run(ctx.counter, |Task { batch, rows, cols }| {
        let (i2, i3) = (batch % d.ne[2], batch / d.ne[2]);
        let (p0, p1) = (cols.start / IG_NR, cols.end.div_ceil(IG_NR));
        // SAFETY: phase 0 wrote every block of this batch before the barrier; phase 1 only
        // reads them; panels p0..p1 of batch `batch` lie inside the packed area.
        let ab = unsafe {
            std::slice::from_raw_parts(blocks.add((batch * np + p0) * nkb), (p1 - p0) * nkb)
        };
        // SAFETY: i < m = a.ne[1], (i2 / r2, i3 / r3) inside a (broadcast checked at build);
        // a's rows are contiguous whole blocks (build check).
        let a_row = |i: usize| unsafe { a.row(i, i2 / r2, i3 / r3) as *const u8 };
        let j0 = cols.start;
        int::block(
            &fmt,
            a.dtype,
            &kernels,
            bsize,
            repacked,
            k,
            rows,
            a_row,
            ab,
            cols.len(),
            sc,
            |i, j, run| {
                // SAFETY: i + run.len() <= m, j0 + j < n, (i2, i3) below dst's dims 2 and 3;
                // the elements belong to this task, which only this worker took.
                unsafe {
                    write_run(
                        d.ptr.add(i * d.nb[0] + (j0 + j) * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3]),
                        d.nb[0],
                        run,
                    )
                };
            },
        )
    })
}
