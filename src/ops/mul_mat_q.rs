//! `mul_mat` with several columns as an integer GEMM, for weights with an integer form
//! (`quant::unpack`): the K-quants, IQ and ternary types against Q8_K activations, the legacy
//! types, IQ4_NL, MXFP4, NVFP4, Q1_0 and Q2_0 against Q8_0 / Q8_1. int8 products are summed
//! exactly in int32 per sub-block; the sub-block scales are applied in int32 and the block scales
//! in f32 (super-block types), or all scales in f32 per sub-block (block types)
//! (`kernels::igemm`). It runs where the tier has integer kernels for the type's codes
//! (`KernelTable::igemm`: AVX-512 VNNI, AVX-VNNI, or AVX2 `vpmaddubsw` for codes up to 127); the
//! others keep the f32 GEMM of `mul_mat_f`, which is faster there.
//!
//! Phase 0 (all threads) quantizes b's columns to the weight type's vec-dot type with the CPU's
//! `from_float`, as ggml does (or takes b's rows as they are when already in that type), and
//! regroups them into panels of 16 columns per 256 elements of K (`ABlock`; a row of a block type
//! whose length is not a multiple of 256 ends in a zero-padded one).
//! Phase 1 hands out tasks of up to [`MC`] weight rows by [`NC`] columns through the node's
//! counter; a task walks K one super-block at a time, unpacks its rows' block into bands of 8
//! (`WBand`, in the worker's scratch) and runs the micro-kernel on every (panel, band) pair into
//! an f32 tile, which it writes to dst at the end. Each output is the sum over super-blocks in K
//! order: the same operations whatever the thread count or the task shapes.

use super::NodeCtx;
use crate::dtype::{DType, QK_K};
use crate::error::{Error, Result};
use crate::kernels::KernelTable;
use crate::kernels::igemm::{
    ABlock, IG_MR, IG_NR, IgemmFn, IgemmKernels, WBand, pack_q8_blocks_column, pack_q8k_column,
};
use crate::plan::{ExecNode, TView, align_up};
use crate::quant::unpack::{IntFormat, Unpack, int_format};
use std::sync::atomic::Ordering;

/// Weight rows per task (at most; fewer when that gives each thread several tasks).
pub(crate) const MC: usize = 64;
/// Columns per task (32 panels): the task's f32 tile is `MC * NC * 4` = 128 KiB, in L2.
pub(crate) const NC: usize = 512;
/// Fewer columns than this use the dot-product tiles. q4_K 4096 x N x 4096, 2 threads,
/// alternating binaries: the tiles give 98 GFLOPS at N = 4 (the integer GEMM 63); at N = 6 the
/// integer GEMM gives 81 where the f32 GEMM gave 22, at N = 16 264 against 66.
pub(crate) const MIN_N: usize = 6;

const Q8K_BYTES: usize = 292;

/// Whether this node takes the integer GEMM.
pub(crate) fn applies(node: &ExecNode) -> bool {
    let (Some(a), Some(b)) = (node.src[0].as_ref(), node.src[1].as_ref()) else {
        return false;
    };
    let Some(fmt) = int_format(a.dtype) else {
        return false;
    };
    (!a.repacked || crate::backend::repack::supports(a.dtype, &a.ne))
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
    kt.igemm.filter(|k| fmt.max_code <= k.max_code)
}

/// Whether this node runs the integer GEMM with table `kt` (else the f32 GEMM or the tiles).
pub(crate) fn runs_on(node: &ExecNode, kt: &KernelTable) -> bool {
    applies(node)
        && node.src[0]
            .as_ref()
            .and_then(|a| int_format(a.dtype))
            .is_some_and(|f| kernels_for(kt, &f).is_some())
}

/// 256-element steps of K (the last one padded for block types).
pub(crate) fn k_steps(k: usize) -> usize {
    k.div_ceil(QK_K)
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

/// Rows per task for `m` weight rows: `MC`, halved (down to one band) while there are fewer
/// than four tasks per thread.
fn task_rows(m: usize, n: usize, batches: usize, nth: usize) -> usize {
    let mut mc = MC;
    let per_rows = batches * n.div_ceil(NC);
    while mc > IG_MR && m.div_ceil(mc) * per_rows < 4 * nth {
        mc /= 2;
    }
    mc
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

fn format_of(a: DType) -> Result<IntFormat> {
    int_format(a).ok_or_else(|| unsupported(format!("no integer form of {a}")))
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
    // alone uses area `ith`. Every size before it is a multiple of 64 (ABlock is 5184 bytes,
    // the scratch areas are sums of 64-aligned parts), so the area is 64-byte aligned.
    unsafe { std::slice::from_raw_parts_mut(ctx.work.add(off), sb) }
}

/// Phase 0: quantize and regroup b's columns, one (batch, panel) unit at a time.
pub(crate) fn pack(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (a, b) = (ctx.src(0), ctx.src(1));
    let fmt = format_of(a.dtype)?;
    let from = ctx
        .kt
        .activation_converter(fmt.act)
        .ok_or_else(|| unsupported(format!("no f32 -> {} conversion", fmt.act)))?;
    let (k, n) = (b.ne[0], b.ne[1]);
    let nkb = k_steps(k);
    let q8_bytes = fmt.act.row_bytes(k);
    let np = panels(n);
    let units = batches(b) * np;
    // SAFETY: this worker's own scratch area (one call per phase).
    let sc = unsafe { scratch(ctx, ith) };
    let (colf, rest) = sc.split_at_mut(align_up(k * 4, 64));
    let colf: &mut [f32] = bytemuck::try_cast_slice_mut(&mut colf[..k * 4]).map_err(layout)?;
    let q8 = &mut rest[..q8_bytes];
    // SAFETY: see act_blocks; units are split between workers, so this worker alone writes the
    // blocks of its units.
    let blocks = unsafe { act_blocks(ctx) };
    let (u0, u1) = super::split(units, ith, ctx.nth);
    for u in u0..u1 {
        let (batch, p) = (u / np, u % np);
        let (i2, i3) = (batch % b.ne[2], batch / b.ne[2]);
        // SAFETY: unit u's nkb blocks lie inside the packed area, and only this worker has them.
        let ab = unsafe { std::slice::from_raw_parts_mut(blocks.add(u * nkb), nkb) };
        for blk in ab.iter_mut() {
            if (p + 1) * IG_NR > n {
                *blk = bytemuck::Zeroable::zeroed();
            }
        }
        for c in 0..IG_NR.min(n - p * IG_NR) {
            let j = p * IG_NR + c;
            if b.dtype == fmt.act {
                // SAFETY: j < b.ne[1], (i2, i3) below b's dims; b's rows are contiguous blocks
                // of the activation type, q8_bytes long (applies).
                let row = unsafe { std::slice::from_raw_parts(b.row(j, i2, i3), q8_bytes) };
                pack_column(&fmt, row, ab, c);
                continue;
            }
            for (i, v) in colf.iter_mut().enumerate() {
                // SAFETY: j < b.ne[1], (i2, i3) below b's dims, i < ne[0]: inside b (extent
                // validated at plan time); read unaligned since views may sit at any offset.
                *v = unsafe { (b.row(j, i2, i3).add(i * b.nb[0]) as *const f32).read_unaligned() };
            }
            from(colf, q8);
            pack_column(&fmt, q8, ab, c);
        }
    }
    Ok(())
}

/// Regroups one column's row in the activation type (`q8`: Q8_K, Q8_0 or Q8_1, whole blocks)
/// into column `c` of a panel's blocks (one per 256 elements).
pub(crate) fn pack_column(fmt: &IntFormat, q8: &[u8], blocks: &mut [ABlock], c: usize) {
    use crate::quant::legacy::{BlockQ8_0, BlockQ8_1};
    use crate::quant::util::fp16_to_fp32;
    match fmt.act {
        DType::Q8_K => {
            for (blk, q) in blocks.iter_mut().zip(q8.chunks_exact(Q8K_BYTES)) {
                let qb: crate::quant::kquants::BlockQ8K = bytemuck::pod_read_unaligned(q);
                pack_q8k_column(blk, c, &qb.qs, &qb.bsums, qb.d, fmt.sub, fmt.bias);
            }
        }
        DType::Q8_1 => {
            for (blk, q) in blocks.iter_mut().zip(q8.chunks(8 * size_of::<BlockQ8_1>())) {
                let it = q.chunks_exact(size_of::<BlockQ8_1>()).map(|q| {
                    let qb: BlockQ8_1 = bytemuck::pod_read_unaligned(q);
                    (fp16_to_fp32(qb.d), fp16_to_fp32(qb.s), qb.qs)
                });
                pack_q8_blocks_column(blk, c, it, fmt.sub, fmt.bias);
            }
        }
        _ => {
            // The block types' other activation type (`int_format` gives only these three).
            debug_assert_eq!(fmt.act, DType::Q8_0);
            for (blk, q) in blocks.iter_mut().zip(q8.chunks(8 * size_of::<BlockQ8_0>())) {
                let it = q.chunks_exact(size_of::<BlockQ8_0>()).map(|q| {
                    let qb: BlockQ8_0 = bytemuck::pod_read_unaligned(q);
                    (fp16_to_fp32(qb.d), 0.0, qb.qs)
                });
                pack_q8_blocks_column(blk, c, it, fmt.sub, fmt.bias);
            }
        }
    }
}

/// Zeroes column `c` of a panel's blocks (a padding column: its level sums and scale are 0).
pub(crate) fn zero_column(blocks: &mut [ABlock], c: usize) {
    for blk in blocks {
        for g in 0..QK_K / 4 {
            blk.codes[g * 64 + c * 4..g * 64 + c * 4 + 4].fill(0);
        }
        for j in 0..16 {
            blk.bsums[j * IG_NR + c] = 0;
            blk.ds[j * IG_NR + c] = 0.0;
            blk.ms[j * IG_NR + c] = 0.0;
        }
        blk.d[c] = 0.0;
    }
}

/// Phase 1: the tasks.
pub(crate) fn compute(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (a, b, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    let fmt = format_of(a.dtype)?;
    let kernel = kernels_for(ctx.kt, &fmt)
        .ok_or_else(|| {
            unsupported(format!("no integer GEMM kernels for {} in this tier", a.dtype))
        })?
        .get(fmt.sub, fmt.has_min, fmt.float_scales());
    let (k, m, n) = (a.ne[0], d.ne[0], d.ne[1]);
    let nkb = k_steps(k);
    let np = panels(n);
    let nbatch = d.ne[2] * d.ne[3];
    let (r2, r3) = (b.ne[2] / a.ne[2], b.ne[3] / a.ne[3]);
    let mc = task_rows(m, n, nbatch, ctx.nth);
    let (tiles_m, tiles_n) = (m.div_ceil(mc), n.div_ceil(NC));
    let total = nbatch * tiles_m * tiles_n;
    let bsize = a.dtype.type_size();
    // SAFETY: this worker's own scratch area (one call per phase).
    let sc = unsafe { scratch(ctx, ith) };
    // SAFETY: see act_blocks.
    let blocks = unsafe { act_blocks(ctx) as *const ABlock };
    loop {
        let t = ctx.counter.fetch_add(1, Ordering::Relaxed);
        if t >= total {
            break;
        }
        let batch = t / (tiles_m * tiles_n);
        let (tm, tn) = (t % tiles_m, (t / tiles_m) % tiles_n);
        let (i2, i3) = (batch % d.ne[2], batch / d.ne[2]);
        let (i0, i1) = (tm * mc, ((tm + 1) * mc).min(m));
        let (p0, p1) = (tn * NC / IG_NR, ((tn + 1) * NC / IG_NR).min(np));
        let j0 = p0 * IG_NR;
        // SAFETY: phase 0 wrote every block of this batch before the barrier; phase 1 only
        // reads them; panels p0..p1 of batch `batch` lie inside the packed area.
        let ab = unsafe {
            std::slice::from_raw_parts(blocks.add((batch * np + p0) * nkb), (p1 - p0) * nkb)
        };
        // SAFETY: i < m = a.ne[1], (i2 / r2, i3 / r3) inside a (broadcast checked at build);
        // a's rows are contiguous whole blocks (build check).
        let a_row = |i: usize| unsafe { a.row(i, i2 / r2, i3 / r3) as *const u8 };
        let repacked = a.repacked.then_some(a.dtype);
        let ncols = (n - j0).min(NC);
        int_block(&fmt, kernel, bsize, repacked, k, i0, i1, a_row, ab, ncols, sc, |i, j, v| {
            // SAFETY: i < m, j0 + j < n, (i2, i3) below dst's dims 2 and 3; the element belongs
            // to this task, which only this worker took.
            unsafe {
                (d.ptr.add(i * d.nb[0] + (j0 + j) * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3])
                    as *mut f32)
                    .write_unaligned(v)
            };
        })?;
    }
    Ok(())
}

/// Bytes of one row's step of repacked weights at most (8 IQ4_NL / Q4_0 / MXFP4 blocks, or one
/// Q4_K / Q6_K / Q2_K / TQ2_0 super-block).
const REPACK_STEP_MAX: usize = 256;

/// Unpacks one row's step (`src`: its `nblk` weight blocks of `bsize` bytes, ggml's layout) into
/// row `rr` of `band`; a partial step's rest is zero padding.
fn unpack_step(
    fmt: &IntFormat,
    src: &[u8],
    bsize: usize,
    nblk: usize,
    band: &mut WBand,
    rr: usize,
) {
    let codes: &mut [u8; QK_K] =
        (&mut band.codes[rr * QK_K..(rr + 1) * QK_K]).try_into().expect("256 codes");
    match fmt.unpack {
        Unpack::Super(unpack) => {
            let scales: &mut [i32; 16] =
                (&mut band.scales[rr * 16..rr * 16 + 16]).try_into().expect("16 scales");
            let mins: &mut [i32; 16] =
                (&mut band.mins[rr * 16..rr * 16 + 16]).try_into().expect("16 mins");
            let (dd, dmin) = unpack(&src[..bsize], codes, scales, mins);
            band.d[rr] = dd;
            band.dmin[rr] = dmin;
        }
        Unpack::Blocks { elems, f } => {
            let ns = elems / fmt.sub;
            let scales = &mut band.fscales[rr * 16..rr * 16 + 16];
            let mins = &mut band.fmins[rr * 16..rr * 16 + 16];
            for (b, blk) in src.chunks_exact(bsize).take(nblk).enumerate() {
                f(
                    blk,
                    &mut codes[b * elems..(b + 1) * elems],
                    &mut scales[b * ns..(b + 1) * ns],
                    &mut mins[b * ns..(b + 1) * ns],
                );
            }
            codes[nblk * elems..].fill(0);
            scales[nblk * ns..].fill(0.0);
            mins[nblk * ns..].fill(0.0);
        }
    }
}

/// Bytes of scratch [`int_block`] needs.
pub(crate) const BLOCK_SCRATCH: usize = (MC / IG_MR) * size_of::<WBand>() + MC * NC * 4;

/// One task of the integer GEMM: weight rows `i0..i1` (at most [`MC`]; `a_row(i)` points at row
/// `i`'s `k` elements in whole blocks of `bsize` bytes) against `ncols` (at most [`NC`]) packed
/// columns (`ab`: panel-major, `k_steps(k)` blocks per panel), calling `write(i, j, value)` once
/// per output. With `repacked` (the weights' type, stored in CPU_REPACK's 8-row groups), `i0`
/// is a multiple of 8 and `a_row(i)` of a group's first row points at the group; each step's
/// group blocks are brought back to ggml's blocks before unpacking, so the results are bitwise
/// those of the plain layout.
#[allow(clippy::too_many_arguments)]
pub(crate) fn int_block(
    fmt: &IntFormat,
    kernel: IgemmFn,
    bsize: usize,
    repacked: Option<DType>,
    k: usize,
    i0: usize,
    i1: usize,
    a_row: impl Fn(usize) -> *const u8,
    ab: &[ABlock],
    ncols: usize,
    scratch: &mut [u8],
    mut write: impl FnMut(usize, usize, f32),
) -> Result<()> {
    debug_assert!(i1 - i0 <= MC && ncols <= NC);
    let nkb = k_steps(k);
    let np = ncols.div_ceil(IG_NR);
    let nbands = (i1 - i0).div_ceil(IG_MR);
    if ab.len() < np * nkb || i1 - i0 > MC || ncols > NC {
        return Err(Error::Buffer("mul_mat: integer GEMM task larger than its buffers".into()));
    }
    if repacked.is_some() && (!i0.is_multiple_of(IG_MR) || bsize > REPACK_STEP_MAX) {
        return Err(Error::Buffer("mul_mat: integer GEMM task not on repacked row groups".into()));
    }
    let (bands_bytes, tile_bytes) = scratch.split_at_mut((MC / IG_MR) * size_of::<WBand>());
    let bands: &mut [WBand] = bytemuck::try_cast_slice_mut(bands_bytes).map_err(layout)?;
    let tile: &mut [[[f32; IG_NR]; IG_MR]] =
        bytemuck::try_cast_slice_mut(&mut tile_bytes[..MC * NC * 4]).map_err(layout)?;
    let tile = &mut tile[..np * nbands];
    tile.fill([[0.0; IG_NR]; IG_MR]);
    let bands = &mut bands[..nbands];
    // Padding rows of the last band stay zero (codes, scales, mins and float scales).
    if !(i1 - i0).is_multiple_of(IG_MR) {
        bands[nbands - 1] = bytemuck::Zeroable::zeroed();
    }
    // Repacked weights: one band's step in ggml's blocks, row by row (each use rewrites what it
    // reads).
    let mut plain = [0u8; IG_MR * REPACK_STEP_MAX];
    for kb in 0..nkb {
        // K values of this step that are not padding (a block-type row's last step is partial).
        let len = (k - kb * QK_K).min(QK_K);
        // Weight blocks per whole step and in this one.
        let (per, nblk) = match fmt.unpack {
            Unpack::Super(_) => (1, 1),
            Unpack::Blocks { elems, .. } => (QK_K / elems, len / elems),
        };
        let step_bytes = nblk * bsize;
        for (bi, band) in bands.iter_mut().enumerate() {
            let r0 = i0 + bi * IG_MR;
            if let Some(dt) = repacked {
                if step_bytes > REPACK_STEP_MAX {
                    return Err(Error::Buffer(format!("mul_mat: {dt} step too large")));
                }
                let mut group = [0u8; IG_MR * REPACK_STEP_MAX];
                let group = &mut group[..IG_MR * bsize];
                for b in 0..nblk {
                    // SAFETY: r0 is a group's first row (i0 and the bands are multiples of 8);
                    // the group holds k / block-size blocks of 8 rows, and
                    // kb * per + b < k / block-size.
                    let src = unsafe {
                        std::slice::from_raw_parts(
                            a_row(r0).add((kb * per + b) * bsize * IG_MR),
                            bsize * IG_MR,
                        )
                    };
                    crate::backend::repack::plain_group_block(dt, src, group)?;
                    for (rr, blk) in group.chunks_exact(bsize).enumerate() {
                        plain[rr * step_bytes + b * bsize..][..bsize].copy_from_slice(blk);
                    }
                }
            }
            for rr in 0..(i1 - r0).min(IG_MR) {
                let src = if repacked.is_some() {
                    &plain[rr * step_bytes..(rr + 1) * step_bytes]
                } else {
                    // SAFETY: a_row(i) points at k / block-size whole blocks of bsize bytes;
                    // this step's blocks kb * per .. kb * per + nblk are among them.
                    unsafe {
                        std::slice::from_raw_parts(a_row(r0 + rr).add(kb * per * bsize), step_bytes)
                    }
                };
                unpack_step(fmt, src, bsize, nblk, band, rr);
            }
        }
        for p in 0..np {
            let a = &ab[p * nkb + kb];
            for (bi, band) in bands.iter().enumerate() {
                kernel(band, a, &mut tile[p * nbands + bi], len);
            }
        }
    }
    for p in 0..np {
        for c in 0..IG_NR.min(ncols - p * IG_NR) {
            for (r, i) in (i0..i1).enumerate() {
                write(i, p * IG_NR + c, tile[p * nbands + r / IG_MR][r % IG_MR][c]);
            }
        }
    }
    Ok(())
}
