//! mul_mat_id: `dst[:, s, t] = as[:, :, ids[s, t]] · b[:, s % n_b, t]` (ggml's
//! ggml_compute_forward_mul_mat_id).
//!
//! Phase 0: every thread converts its share of b's rows into the weights' vec-dot type in the work
//! buffer (once, however many experts read a row), and worker 0 groups the (slot, token) pairs by
//! expert with a counting sort over the ids (checking every id) and lays out the chunk list.
//! Experts with `MIN_N` pairs or more (prefill) take the GEMM engine (`gemm`): an extra phase packs
//! their pairs' activations into panels, and their chunks are the engine's blocks of weight rows
//! by up to 512 pairs (each output bitwise what `mul_mat`'s GEMM gives for that column).
//! Last phase: chunks (an expert and a tile of its weight rows x its pairs) are handed out through
//! the node's atomic counter. Every other output is one full-length dot product by the tier's
//! kernel (or the register-tile kernel, bitwise the same), so results do not depend on the thread
//! count.

use super::gemm::{float, int};
use super::mul_mat_f::{self, MIN_N};
use super::mul_mat_q;
use super::mul_mat_repack as mmr;
use super::{NodeCtx, split};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::KernelTable;
use crate::kernels::igemm::{ABlock, IG_NR};
use crate::kernels::repack::{act_block_bytes, group_block_bytes};
use crate::kernels::sgemm::SG_NR;
use crate::kernels::{GEMM_MR, GEMM_NR};
use crate::ops::node::{ExecNode, TView, align_up};
use crate::quant::repack::REPACK_ROWS;
use crate::quant::unpack::{IntFormat, int_format};
use std::sync::atomic::Ordering;

/// Weight rows per chunk when an expert has two or more pairs, and pairs per chunk.
const TILE: usize = 16;
/// Weight rows per chunk when an expert has a single pair (decode): nothing to share between
/// columns, so bigger chunks cut the counter traffic.
const TILE_ONE: usize = 64;

/// Byte offsets of the work buffer's parts.
struct Layout {
    /// The experts are stored repacked (CPU_REPACK): b rows are converted into the repacked
    /// kernels' activation format and the chunks are `mul_mat_repack` tasks.
    repack: bool,
    /// Converted b rows (`rb` bytes each) start at 0 when `conv`.
    conv: bool,
    rb: usize,
    /// Per-thread f32 staging rows for b rows whose address is not f32-aligned.
    scratch: usize,
    scratch_stride: usize,
    /// `n_as` pair counts (usize).
    counts: usize,
    /// `n_as + 1` chunk starts (usize): expert e owns chunks `starts[e]..starts[e + 1]`.
    starts: usize,
    /// Whether experts with at least `MIN_N` pairs take the GEMM (`mul_mat_f::gemm_block`).
    gemm: bool,
    /// f32 activation panels of those experts (`mul_mat_f` layout, 16 pairs per panel).
    panels: usize,
    /// Per-thread f32 scratch of the GEMM (`gemm_scratch` floats each).
    gemm_scratch: usize,
    /// The weights' integer form when experts with `mul_mat_q::MIN_N` pairs or more take the
    /// integer GEMM (as `mul_mat` does for such a column count).
    int: Option<IntFormat>,
    /// Whether this compute's tier has integer GEMM kernels (`int` sizes the buffers either way,
    /// so plans do not depend on the tier).
    int_on: bool,
    /// The integer GEMM's packed activation blocks (`nkb` per panel of 16 pairs).
    iblocks: usize,
    /// `n_as + 1` pair offsets (usize) into `pairs`.
    offsets: usize,
    /// `n_used * n_tokens` (slot, token) pairs (two u32), grouped by expert.
    pairs: usize,
    end: usize,
}

fn layout(node: &ExecNode, nth: usize, kt: &KernelTable) -> Option<Layout> {
    let (a, b, ids) = (node.src[0].as_ref()?, node.src[1].as_ref()?, node.src[2].as_ref()?);
    let vd = a.dtype.vec_dot_type();
    let repack = a.repacked;
    let conv = repack || b.dtype != vd;
    let k = b.ne[0];
    let rb = if repack { mmr::act_row_bytes(a.dtype, k) } else { align_up(vd.row_bytes(k), 64) };
    let mut off = 0;
    let scratch = if conv {
        off += b.ne[1] * b.ne[2] * rb;
        off
    } else {
        0
    };
    let scratch_stride = if repack { mmr::scratch_bytes(k) } else { align_up(k * 4, 64) };
    if conv {
        off += nth * scratch_stride;
    }
    let n_as = a.ne[2];
    let counts = off;
    off = align_up(off + n_as * 8, 64);
    let starts = off;
    off = align_up(off + (n_as + 1) * 8, 64);
    let offsets = off;
    off = align_up(off + (n_as + 1) * 8, 64);
    let pairs = off;
    let n_pairs = ids.ne[0] * ids.ne[1];
    off = align_up(off + n_pairs * 8, 64);
    // At most n_pairs / 16 + (experts with MIN_N pairs or more) panels.
    let n_panels = n_pairs / SG_NR + n_as.min(n_pairs / MIN_N);
    let panel_bytes = n_panels * float::panel_floats(k) * 4;
    let gemm = !repack
        && n_pairs >= MIN_N
        && panel_bytes <= mul_mat_f::MAX_PACKED
        && !mul_mat_f::int_dot_is_faster(a.dtype)
        && mul_mat_f::types_ok(a.dtype, b.dtype);
    let panels = off;
    let gemm_scratch = off;
    let nkb = int::k_steps(k);
    let n_ipanels = n_pairs / IG_NR + n_as.min(n_pairs / mul_mat_q::MIN_N);
    let iblock_bytes = n_ipanels.saturating_mul(nkb).saturating_mul(size_of::<ABlock>());
    // Repacked experts take it too, quantizing their F32 activations while packing (phase 0
    // converts b into the repacked kernels' format for the experts with fewer tokens).
    let own = b.dtype == DType::F32;
    let int = int_format(a.dtype).map(|f| mul_mat_q::tier_form(kt, f, own)).filter(|f| {
        (!repack || b.dtype == DType::F32)
            && n_pairs >= mul_mat_q::MIN_N
            && f.act == vd
            && k.is_multiple_of(vd.block_size())
            && (b.dtype == DType::F32 || b.dtype == vd)
            && iblock_bytes <= mul_mat_f::MAX_PACKED
    });
    let mut l = Layout {
        repack,
        conv,
        rb,
        scratch,
        scratch_stride,
        counts,
        starts,
        gemm,
        panels,
        gemm_scratch,
        int,
        int_on: int.is_some_and(|f| mul_mat_q::kernels_for(kt, &f).is_some()),
        iblocks: off,
        offsets,
        pairs,
        end: off,
    };
    if gemm || int.is_some() {
        l.panels = off;
        off = align_up(off + panel_bytes, 64);
        if int.is_some() {
            l.iblocks = off;
            off += iblock_bytes;
        }
        l.gemm_scratch = off;
        off += nth * gemm_scratch_bytes(k);
    }
    l.end = off;
    Some(l)
}

/// Per-thread GEMM scratch: `gemm_block`'s, or 16 f32 activation chunks while packing float
/// panels, or one f32 activation row and its integer form while packing integer panels.
fn gemm_scratch_bytes(k: usize) -> usize {
    align_up(float::BLOCK_SCRATCH.max(SG_NR * float::PANEL_CHUNK) * 4, 64)
        .max(mul_mat_q::scratch_bytes(k))
}

/// Whether expert chunks of `count` pairs take the integer GEMM.
fn int_expert(l: &Layout, count: usize) -> bool {
    l.int.is_some() && l.int_on && count >= mul_mat_q::MIN_N
}

/// Whether expert chunks of `count` pairs take the f32 GEMM.
fn gemm_expert(l: &Layout, count: usize) -> bool {
    l.gemm && count >= MIN_N && !int_expert(l, count)
}

/// The first integer-GEMM panel of expert `e` (`e == n_as`: the number of such panels).
fn first_ipanel(l: &Layout, offsets: &[usize], e: usize) -> usize {
    (0..e)
        .map(|x| offsets[x + 1] - offsets[x])
        .filter(|&count| int_expert(l, count))
        .map(|count| count.div_ceil(IG_NR))
        .sum()
}

/// The first panel of expert `e` in the panel area (`e == n_as`: the number of panels).
fn first_panel(l: &Layout, offsets: &[usize], e: usize) -> usize {
    (0..e)
        .map(|x| offsets[x + 1] - offsets[x])
        .filter(|&count| gemm_expert(l, count))
        .map(|count| count.div_ceil(SG_NR))
        .sum()
}

/// Address of the activation row of pair (slot s, token t) in the vec-dot type: converted in the
/// work buffer, or b's own row.
///
/// # Safety
/// s < ids.ne[0], t < ids.ne[1] (== b.ne[2]); phase 0 has converted the rows when `l.conv`.
unsafe fn b_row_ptr(ctx: &NodeCtx<'_>, l: &Layout, p: [u32; 2]) -> *const u8 {
    let b = ctx.src(1);
    let (s, t) = (p[0] as usize, p[1] as usize);
    let ne11 = b.ne[1];
    // SAFETY: per the contract, s % ne11 < b.ne[1] and t < b.ne[2]; the converted row index
    // t * ne11 + s % ne11 is below b's row count.
    unsafe {
        if l.conv { ctx.work.add((t * ne11 + s % ne11) * l.rb) } else { b.row(s % ne11, t, 0) }
    }
}

/// Phase 0's grouping: `n_as + 1` pair offsets per expert and the (slot, token) pairs.
///
/// # Safety
/// Phase 0 is over (worker 0 filled both regions and the barrier published them) and nobody
/// writes them any more in this compute.
unsafe fn grouping<'a>(ctx: &NodeCtx<'_>, l: &Layout) -> (&'a [usize], &'a [[u32; 2]]) {
    let (n_as, ids) = (ctx.src(0).ne[2], ctx.src(2));
    let n_pairs = ids.ne[0] * ids.ne[1];
    // SAFETY: both regions lie inside the work buffer (layout), aligned for their types, and
    // per the contract are initialised and read-only from now on.
    unsafe {
        (
            std::slice::from_raw_parts(ctx.work.add(l.offsets) as *const usize, n_as + 1),
            std::slice::from_raw_parts(ctx.work.add(l.pairs) as *const [u32; 2], n_pairs),
        )
    }
}

/// Worker `ith`'s share of the panels of every expert, where an expert with `count` pairs has
/// `panels(count)` of them: `(panel index, expert, panel index within the expert)`.
fn my_panels<'o>(
    offsets: &'o [usize],
    panels: impl Fn(usize) -> usize + 'o,
    ith: usize,
    nth: usize,
) -> impl Iterator<Item = (usize, usize, usize)> + 'o {
    let n_as = offsets.len() - 1;
    let total: usize = (0..n_as).map(|e| panels(offsets[e + 1] - offsets[e])).sum();
    let (u0, u1) = split(total, ith, nth);
    let (mut e, mut at) = (0, 0);
    (u0..u1).map(move |u| {
        // Experts are walked in order and u only grows.
        loop {
            let np = panels(offsets[e + 1] - offsets[e]);
            if u < at + np {
                break;
            }
            at += np;
            e += 1;
        }
        (u, e, u - at)
    })
}

/// Phase 1 with the GEMM: the activation panels of every GEMM expert (16 of its pairs each).
fn pack_panels(ctx: &NodeCtx<'_>, l: &Layout, ith: usize) -> Result<()> {
    let a = ctx.src(0);
    let k = a.ne[0];
    let vd = a.dtype.vec_dot_type();
    let from = mul_mat_f::vd_to_f32(vd).ok_or_else(|| unsupported(format!("no {vd} -> f32")))?;
    let pf = float::panel_floats(k);
    let bf16_pairs = float::pair_panels(ctx.kt, a.dtype, k);
    // SAFETY: pack_panels runs in phase 1, after phase 0's grouping.
    let (offsets, pairs) = unsafe { grouping(ctx, l) };
    // SAFETY: this worker's scratch lies inside the work buffer (layout) and only it uses it;
    // it holds 16 chunks of PANEL_CHUNK f32 (gemm_scratch_bytes).
    let cols = unsafe {
        std::slice::from_raw_parts_mut(
            ctx.work.add(l.gemm_scratch + ith * gemm_scratch_bytes(k)) as *mut f32,
            SG_NR * float::PANEL_CHUNK,
        )
    };
    let gemm_panels = |count| if gemm_expert(l, count) { count.div_ceil(SG_NR) } else { 0 };
    for (u, e, pi) in my_panels(offsets, gemm_panels, ith, ctx.nth) {
        let group = &pairs[offsets[e]..offsets[e + 1]];
        // SAFETY: panel u lies inside the panel area (sized for every GEMM expert's panels);
        // only this worker's share holds it.
        let panel = unsafe {
            std::slice::from_raw_parts_mut((ctx.work.add(l.panels) as *mut f32).add(u * pf), pf)
        };
        float::pack_panel(panel, k, cols, bf16_pairs, |c, k0, chunk| {
            match group.get(pi * SG_NR + c) {
                Some(&p) => {
                    // SAFETY: pairs hold checked (slot, token) indices (phase 0); the row holds
                    // vd.row_bytes(k) bytes, and k0 and the chunk's length are whole vec-dot
                    // blocks.
                    let bytes = unsafe {
                        std::slice::from_raw_parts(
                            b_row_ptr(ctx, l, p).add(vd.row_bytes(k0)),
                            vd.row_bytes(chunk.len()),
                        )
                    };
                    from(bytes, chunk);
                }
                None => chunk.fill(0.0),
            }
        });
    }
    Ok(())
}

/// Phase 1 with the integer GEMM: the activation blocks of every integer-GEMM expert (16 of its
/// pairs per panel), from the activation rows (Q8_K, Q8_0 or Q8_1) phase 0 converted.
fn pack_int_panels(ctx: &NodeCtx<'_>, l: &Layout, ith: usize) -> Result<()> {
    let Some(fmt) = l.int.as_ref().filter(|_| l.int_on) else {
        return Ok(());
    };
    let a = ctx.src(0);
    let k = a.ne[0];
    let nkb = int::k_steps(k);
    let q8_bytes = fmt.act.row_bytes(k);
    // SAFETY: pack_int_panels runs in phase 1, after phase 0's grouping.
    let (offsets, pairs) = unsafe { grouping(ctx, l) };
    // Repacked experts: phase 0 converted b for the repacked kernels, so this quantizes the F32
    // rows itself, in the worker's GEMM scratch (phase 2 uses it, not phase 1).
    let from = match l.repack {
        true => Some(
            ctx.kt
                .activation_converter(fmt.act)
                .ok_or_else(|| unsupported(format!("no f32 -> {} conversion", fmt.act)))?,
        ),
        false => None,
    };
    // SAFETY: worker ith's GEMM scratch area (layout), which only it uses.
    let scratch = unsafe {
        std::slice::from_raw_parts_mut(
            ctx.work.add(l.gemm_scratch + ith * gemm_scratch_bytes(k)),
            gemm_scratch_bytes(k),
        )
    };
    let (colf, rest) = scratch.split_at_mut(align_up(k * 4, 64));
    let colf: &mut [f32] = bytemuck::try_cast_slice_mut(&mut colf[..k * 4])
        .map_err(|e| Error::Buffer(format!("mul_mat_id: scratch layout: {e}")))?;
    let q8 = &mut rest[..q8_bytes];
    let int_panels = |count| if int_expert(l, count) { count.div_ceil(IG_NR) } else { 0 };
    for (u, e, pi) in my_panels(offsets, int_panels, ith, ctx.nth) {
        let group = &pairs[offsets[e]..offsets[e + 1]];
        // SAFETY: panel u lies inside the block area (sized for every integer expert's panels);
        // only this worker's share holds its nkb blocks.
        let blocks = unsafe {
            std::slice::from_raw_parts_mut(
                (ctx.work.add(l.iblocks) as *mut ABlock).add(u * nkb),
                nkb,
            )
        };
        for c in 0..IG_NR {
            match group.get(pi * IG_NR + c) {
                Some(&p) => {
                    if let Some(from) = from {
                        let b = ctx.src(1);
                        let (s, t) = (p[0] as usize % b.ne[1], p[1] as usize);
                        for (i, v) in colf.iter_mut().enumerate() {
                            // SAFETY: (s, t) below b's dims 1 and 2 (checked pairs), i < k:
                            // inside b; read unaligned as views may sit at any offset.
                            *v = unsafe {
                                (b.row(s, t, 0).add(i * b.nb[0]) as *const f32).read_unaligned()
                            };
                        }
                        from(colf, q8);
                        int::pack_column(fmt, q8, blocks, c);
                        continue;
                    }
                    // SAFETY: pairs hold checked (slot, token) indices (phase 0); the row is in
                    // the activation type (b's own contiguous row, or converted in phase 0),
                    // q8_bytes long.
                    let q8 = unsafe { std::slice::from_raw_parts(b_row_ptr(ctx, l, p), q8_bytes) };
                    int::pack_column(fmt, q8, blocks, c);
                }
                None => int::zero_column(blocks, c),
            }
        }
    }
    Ok(())
}

pub(crate) fn phases(node: &ExecNode, kt: &KernelTable) -> u8 {
    // Convert and group; pack the GEMM experts' activations; the chunks.
    if layout(node, 1, kt).is_some_and(|l| l.gemm || l.int.is_some()) { 3 } else { 2 }
}

pub(crate) fn work_size(node: &ExecNode, nth: usize, kt: &KernelTable) -> usize {
    layout(node, nth, kt).map_or(0, |l| l.end)
}

fn unsupported(msg: String) -> Error {
    Error::Unsupported { op: "mul_mat_id", backend: "CPU".into(), msg }
}

/// Weight rows per chunk for an expert with `count` pairs.
fn row_tile(count: usize) -> usize {
    if count == 1 { TILE_ONE } else { TILE }
}

fn chunks_of(l: &Layout, m: usize, count: usize) -> usize {
    if count == 0 {
        0
    } else if int_expert(l, count) {
        m.div_ceil(int::MC) * count.div_ceil(int::NC)
    } else if l.repack {
        (m / REPACK_ROWS).div_ceil(mmr::TASK_GROUPS) * count.div_ceil(mmr::TASK_COLS)
    } else if gemm_expert(l, count) {
        m.div_ceil(float::MC) * count.div_ceil(float::NC)
    } else {
        m.div_ceil(row_tile(count)) * count.div_ceil(TILE)
    }
}

/// Phase 0: b's rows into the weights' vec-dot type, or (repacked experts) into the repacked
/// kernels' activation format.
fn convert(ctx: &NodeCtx<'_>, l: &Layout, ith: usize) -> Result<()> {
    let (a, b) = (ctx.src(0), ctx.src(1));
    let vd = a.dtype.vec_dot_type();
    let from = if l.repack {
        mmr::converter(ctx.kt, "mul_mat_id", a.dtype)?
    } else {
        ctx.kt
            .activation_converter(vd)
            .ok_or_else(|| unsupported(format!("no f32 -> {vd} conversion")))?
    };
    debug_assert_eq!(b.dtype, DType::F32);
    let k = b.ne[0];
    let nrows = b.ne[1] * b.ne[2];
    let (r0, r1) = split(nrows, ith, ctx.nth);
    for r in r0..r1 {
        let (i1, i2) = (r % b.ne[1], r / b.ne[1]);
        // SAFETY: i1 < b.ne[1], i2 < b.ne[2] (b.ne[3] == 1); b's rows hold k contiguous f32
        // (build check). The work buffer holds nrows converted rows of `rb` bytes, then one
        // scratch area per thread (an f32 staging row, then for repacked experts a Q8_0 row;
        // layout); this worker writes only its rows and its own scratch.
        unsafe {
            let pb = b.row(i1, i2, 0);
            let s = ctx.work.add(l.scratch + ith * l.scratch_stride);
            let f = if (pb as usize).is_multiple_of(std::mem::align_of::<f32>()) {
                std::slice::from_raw_parts(pb as *const f32, k)
            } else {
                std::ptr::copy_nonoverlapping(pb, s, k * 4);
                std::slice::from_raw_parts(s as *const f32, k)
            };
            if l.repack {
                let q8 = std::slice::from_raw_parts_mut(
                    s.add(align_up(k * 4, 64)),
                    DType::Q8_0.row_bytes(k),
                );
                let out = std::slice::from_raw_parts_mut(ctx.work.add(r * l.rb), l.rb);
                mmr::convert_row(a.dtype, from, f, q8, out);
            } else {
                from(f, std::slice::from_raw_parts_mut(ctx.work.add(r * l.rb), vd.row_bytes(k)));
            }
        }
    }
    Ok(())
}

/// Worker 0: groups (slot, token) pairs by expert (token-major, as ggml) and lays out the chunks.
fn group(ctx: &NodeCtx<'_>, l: &Layout) -> Result<()> {
    let (a, ids) = (ctx.src(0), ctx.src(2));
    let n_as = a.ne[2];
    let m = a.ne[1];
    let (n_used, n_tok) = (ids.ne[0], ids.ne[1]);
    // SAFETY: the layout reserves these regions, 64-byte aligned within the 64-byte aligned work
    // buffer; only worker 0 touches them in phase 0, and the others read them after the barrier.
    let (counts, starts, offsets, pairs) = unsafe {
        (
            std::slice::from_raw_parts_mut(ctx.work.add(l.counts) as *mut usize, n_as),
            std::slice::from_raw_parts_mut(ctx.work.add(l.starts) as *mut usize, n_as + 1),
            std::slice::from_raw_parts_mut(ctx.work.add(l.offsets) as *mut usize, n_as + 1),
            std::slice::from_raw_parts_mut(ctx.work.add(l.pairs) as *mut [u32; 2], n_used * n_tok),
        )
    };
    counts.fill(0);
    let id_at = |s: usize, t: usize| -> i32 {
        // SAFETY: s < ids.ne[0], t < ids.ne[1]; the plan validated ids' extent.
        unsafe { (ids.ptr.add(s * ids.nb[0] + t * ids.nb[1]) as *const i32).read_unaligned() }
    };
    for t in 0..n_tok {
        for s in 0..n_used {
            let e = id_at(s, t);
            if e < 0 || e as usize >= n_as {
                return Err(Error::IndexOutOfRange {
                    op: "mul_mat_id",
                    tensor: format!("ids of {}", ctx.node.label()),
                    index: e as i64,
                    limit: n_as,
                });
            }
            counts[e as usize] += 1;
        }
    }
    offsets[0] = 0;
    starts[0] = 0;
    for e in 0..n_as {
        offsets[e + 1] = offsets[e] + counts[e];
        starts[e + 1] = starts[e] + chunks_of(l, m, counts[e]);
    }
    // Reuse counts as fill cursors.
    counts.copy_from_slice(&offsets[..n_as]);
    for t in 0..n_tok {
        for s in 0..n_used {
            let e = id_at(s, t) as usize;
            pairs[counts[e]] = [s as u32, t as u32];
            counts[e] += 1;
        }
    }
    Ok(())
}

pub(crate) fn compute(ctx: &NodeCtx<'_>, phase: u8, ith: usize) -> Result<()> {
    let l =
        layout(ctx.node, ctx.nth, ctx.kt).ok_or_else(|| unsupported("missing source".into()))?;
    debug_assert!(l.end <= ctx.work_len);
    if phase == 0 {
        if l.conv {
            convert(ctx, &l, ith)?;
        }
        if ith == 0 {
            group(ctx, &l)?;
        }
        return Ok(());
    }
    if (l.gemm || l.int.is_some()) && phase == 1 {
        pack_panels(ctx, &l, ith)?;
        return pack_int_panels(ctx, &l, ith);
    }
    let (a, b, ids, d) = (ctx.src(0), ctx.src(1), ctx.src(2), ctx.dst());
    let table = ctx.kt;
    let dot = table.vec_dot(a.dtype).ok_or_else(|| unsupported(format!("no {} dot", a.dtype)))?;
    let decode = super::RowDots::decode(table, a.dtype, dot);
    let gemm = table.gemm(a.dtype);
    let (k, m, n_as) = (a.ne[0], a.ne[1], a.ne[2]);
    let a_row_bytes = a.dtype.row_bytes(k);
    let b_row_bytes = a.dtype.vec_dot_type().row_bytes(k);
    let ne11 = b.ne[1];
    let n_pairs = ids.ne[0] * ids.ne[1];
    // SAFETY: worker 0 filled these regions in phase 0; the barrier between phases publishes
    // them, and nobody writes them in phase 1.
    let (starts, offsets, pairs) = unsafe {
        (
            std::slice::from_raw_parts(ctx.work.add(l.starts) as *const usize, n_as + 1),
            std::slice::from_raw_parts(ctx.work.add(l.offsets) as *const usize, n_as + 1),
            std::slice::from_raw_parts(ctx.work.add(l.pairs) as *const [u32; 2], n_pairs),
        )
    };
    if l.repack {
        return repack_chunks(ctx, &l, starts, offsets, pairs, ith);
    }
    let b_row = |p: [u32; 2]| -> &[u8] {
        let (s, t) = (p[0] as usize, p[1] as usize);
        // SAFETY: s < ids.ne[0] and t < ids.ne[1] == b.ne[2] (build check), so s % ne11 < b.ne[1];
        // the converted row index (t * ne11 + s % ne11) is below b's row count; rows are
        // `b_row_bytes` long (converted, or contiguous vd rows by build check).
        unsafe {
            let ptr = if l.conv {
                ctx.work.add((t * ne11 + s % ne11) * l.rb)
            } else {
                b.row(s % ne11, t, 0)
            };
            std::slice::from_raw_parts(ptr, b_row_bytes)
        }
    };
    // Every writer below passes i < m = dst.ne[0] and a checked (slot, token) pair.
    let dst_at = |i: usize, p: [u32; 2]| dst_elem(d, i, p);
    while let Some((e, group, local)) = next_chunk(ctx, starts, offsets, pairs) {
        if let (Some(fmt), true) = (l.int.as_ref(), int_expert(&l, group.len())) {
            int_chunk(ctx, &l, fmt, offsets, (e, group, local), ith)?;
            continue;
        }
        if gemm_expert(&l, group.len()) {
            let blocks_m = m.div_ceil(float::MC);
            let (tm, tn) = (local % blocks_m, local / blocks_m);
            let (i0, i1) = (tm * float::MC, ((tm + 1) * float::MC).min(m));
            let cols = &group[tn * float::NC..((tn + 1) * float::NC).min(group.len())];
            let pf = float::panel_floats(k);
            let p0 = first_panel(&l, offsets, e) + tn * float::NC / SG_NR;
            // SAFETY: phase 1 packed these panels and the barrier published them; the scratch
            // area is this worker's (layout).
            let (panels, scratch) = unsafe {
                (
                    std::slice::from_raw_parts(
                        (ctx.work.add(l.panels) as *const f32).add(p0 * pf),
                        cols.len().div_ceil(SG_NR) * pf,
                    ),
                    std::slice::from_raw_parts_mut(
                        ctx.work.add(l.gemm_scratch + ith * gemm_scratch_bytes(k)) as *mut f32,
                        float::BLOCK_SCRATCH,
                    ),
                )
            };
            // SAFETY: i < m and e < n_as (ids checked in phase 0): expert e's rows exist and
            // hold k elements in whole blocks (build check).
            let a_row = |i: usize| unsafe { a.row(i, e, 0) as *const u8 };
            float::block(
                ctx.kt,
                a.dtype,
                k,
                i0..i1,
                a_row,
                panels,
                cols.len(),
                scratch,
                |i, j, run| {
                    for (r, &v) in run.iter().enumerate() {
                        // SAFETY: i + r < m and the pair is checked, so the element is inside
                        // dst; it belongs to this chunk, which only this worker took (pairs
                        // are unique).
                        unsafe { *dst_at(i + r, cols[j]) = v }
                    }
                },
            )?;
            continue;
        }
        let rt = row_tile(group.len());
        let tiles_m = m.div_ceil(rt);
        let (tm, tn) = (local % tiles_m, local / tiles_m);
        let (i0, i1) = (tm * rt, ((tm + 1) * rt).min(m));
        let cols = &group[tn * TILE..((tn + 1) * TILE).min(group.len())];
        let a_row = |i: usize| -> &[u8] {
            // SAFETY: i < m = a.ne[1] and e < n_as = a.ne[2] (ids checked in phase 0); a's rows
            // are contiguous `a_row_bytes` (build check).
            unsafe { std::slice::from_raw_parts(a.row(i, e, 0), a_row_bytes) }
        };
        match gemm {
            Some(gemm) if cols.len() >= 2 => {
                for js in cols.chunks(GEMM_NR) {
                    let nc = js.len();
                    let ys: [&[u8]; GEMM_NR] = std::array::from_fn(|c| b_row(js[c.min(nc - 1)]));
                    let mut i = i0;
                    while i < i1 {
                        let nr = (i1 - i).min(GEMM_MR);
                        let xs: [&[u8]; GEMM_MR] =
                            std::array::from_fn(|r| a_row(i + r.min(nr - 1)));
                        let mut out = [0.0f32; GEMM_MR * GEMM_NR];
                        gemm(k, &xs[..nr], &ys[..nc], &mut out);
                        for (c, &p) in js.iter().enumerate() {
                            for r in 0..nr {
                                // SAFETY: i + r < m and p is checked: inside dst; the element
                                // belongs to this chunk, only this worker's (pairs unique).
                                unsafe { *dst_at(i + r, p) = out[c * nr + r] };
                            }
                        }
                        i += nr;
                    }
                }
            }
            _ => {
                // One pair: the expert's rows are read once, from memory (decode), two at a
                // time where the tier has the two-row form (as mul_mat's decode; the same bits).
                let dots = if cols.len() == 1 { decode } else { super::RowDots::one(dot) };
                // SAFETY: used during this compute only.
                let span = unsafe { a.row_span(i0..i1, e, 0) };
                for &p in cols {
                    // The pair's first element and the row stride, read once.
                    let (col, nb0) = (dst_at(0, p) as *mut u8, d.nb[0]);
                    super::dot_rows(i0..i1, k, b_row(p), dots, a_row, span, |i, v| {
                        // SAFETY: as above: i < i1 <= m, inside dst (`dst_at(i, p)` is `col` + i
                        // * nb0), this worker's element only.
                        unsafe { *(col.add(i * nb0) as *mut f32) = v }
                    });
                }
            }
        }
    }
    Ok(())
}

/// Takes the next chunk from the node's counter: its expert, the expert's pairs and the chunk's
/// index among the expert's chunks; `None` when all are taken.
fn next_chunk<'p>(
    ctx: &NodeCtx<'_>,
    starts: &[usize],
    offsets: &[usize],
    pairs: &'p [[u32; 2]],
) -> Option<(usize, &'p [[u32; 2]], usize)> {
    let c = ctx.counter.fetch_add(1, Ordering::Relaxed);
    if c >= starts[starts.len() - 1] {
        return None;
    }
    // The expert owning chunk c: the last e with starts[e] <= c (experts without pairs own no
    // chunks, so their start equals the next one's).
    let e = starts.partition_point(|&s| s <= c) - 1;
    Some((e, &pairs[offsets[e]..offsets[e + 1]], c - starts[e]))
}

/// The chunks with repacked experts: `mul_mat_repack` tasks of 8-row groups x pairs.
/// Element `i` of pair `p` = (slot, token) in mul_mat_id's contiguous dst (a pointer computed
/// without dereferencing; writers dereference it under their own SAFETY argument).
fn dst_elem(d: &TView, i: usize, p: [u32; 2]) -> *mut f32 {
    let off = i * d.nb[0] + p[0] as usize * d.nb[1] + p[1] as usize * d.nb[2];
    d.ptr.wrapping_add(off) as *mut f32
}

/// One chunk of an expert on the integer GEMM: rows `MC` at a time by up to `NC` of its pairs,
/// from the panels phase 1 packed (plain or repacked expert weights).
fn int_chunk(
    ctx: &NodeCtx<'_>,
    l: &Layout,
    fmt: &IntFormat,
    offsets: &[usize],
    (e, group, local): (usize, &[[u32; 2]], usize),
    ith: usize,
) -> Result<()> {
    let (a, d) = (ctx.src(0), ctx.dst());
    let (k, m) = (a.ne[0], a.ne[1]);
    // Every writer below passes i < m = dst.ne[0] and a checked (slot, token) pair.
    let dst_at = |i: usize, p: [u32; 2]| dst_elem(d, i, p);
    let blocks_m = m.div_ceil(int::MC);
    let (tm, tn) = (local % blocks_m, local / blocks_m);
    let (i0, i1) = (tm * int::MC, ((tm + 1) * int::MC).min(m));
    let cols = &group[tn * int::NC..((tn + 1) * int::NC).min(group.len())];
    let nkb = int::k_steps(k);
    let p0 = first_ipanel(l, offsets, e) + tn * int::NC / IG_NR;
    // SAFETY: phase 1 packed these blocks and the barrier published them; the scratch
    // area is this worker's (layout).
    let (ab, scratch) = unsafe {
        (
            std::slice::from_raw_parts(
                (ctx.work.add(l.iblocks) as *const ABlock).add(p0 * nkb),
                cols.len().div_ceil(IG_NR) * nkb,
            ),
            std::slice::from_raw_parts_mut(
                ctx.work.add(l.gemm_scratch + ith * gemm_scratch_bytes(k)),
                int::BLOCK_SCRATCH,
            ),
        )
    };
    // SAFETY: i < m and e < n_as (ids checked in phase 0): expert e's rows exist and
    // hold k elements in whole blocks (build check).
    let a_row = |i: usize| unsafe { a.row(i, e, 0) as *const u8 };
    let kernels = mul_mat_q::kernels_for(ctx.kt, fmt)
        .ok_or_else(|| unsupported(format!("no integer GEMM kernels for {}", a.dtype)))?;
    let bsize = a.dtype.type_size();
    let repacked = l.repack.then_some(a.dtype);
    int::block(
        fmt,
        a.dtype,
        &kernels,
        bsize,
        repacked,
        k,
        i0..i1,
        a_row,
        ab,
        cols.len(),
        scratch,
        |i, j, run| {
            for (r, &v) in run.iter().enumerate() {
                // SAFETY: i + r < m and the pair is checked, so the element is inside dst; it
                // belongs to this chunk, which only this worker took (pairs are unique).
                unsafe { *dst_at(i + r, cols[j]) = v }
            }
        },
    )
}

fn repack_chunks(
    ctx: &NodeCtx<'_>,
    l: &Layout,
    starts: &[usize],
    offsets: &[usize],
    pairs: &[[u32; 2]],
    ith: usize,
) -> Result<()> {
    let (a, b, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    let kern = ctx
        .kt
        .repack(a.dtype)
        .ok_or_else(|| unsupported(format!("no repacked kernel for {}", a.dtype)))?;
    let (k, m) = (a.ne[0], a.ne[1]);
    let nb = k / a.dtype.block_size();
    let gbb = group_block_bytes(a.dtype);
    let abb = act_block_bytes(a.dtype);
    let ne11 = b.ne[1];
    let groups = m / REPACK_ROWS;
    let tiles_m = groups.div_ceil(mmr::TASK_GROUPS);
    let mut acc: mmr::TaskAcc = [[0f32; 8]; mmr::TASK_GROUPS * mmr::TASK_COLS];
    while let Some((e, group, local)) = next_chunk(ctx, starts, offsets, pairs) {
        if let (Some(fmt), true) = (l.int.as_ref(), int_expert(l, group.len())) {
            int_chunk(ctx, l, fmt, offsets, (e, group, local), ith)?;
            continue;
        }
        let (tm, tn) = (local % tiles_m, local / tiles_m);
        let (g0, g1) = (tm * mmr::TASK_GROUPS, ((tm + 1) * mmr::TASK_GROUPS).min(groups));
        let cols = &group[tn * mmr::TASK_COLS..((tn + 1) * mmr::TASK_COLS).min(group.len())];
        let weights = |g: usize| -> &[u8] {
            // SAFETY: expert e < n_as (ids checked in phase 0); its repacked matrix is contiguous
            // (set_tensor, build check) and group g < m / 8 spans 8 rows of nb blocks.
            unsafe {
                let base = a.ptr.add(e * a.nb[2] + g * REPACK_ROWS * a.nb[1]);
                std::slice::from_raw_parts(base, nb * gbb)
            }
        };
        let col = |q: usize| -> &[u8] {
            let (s, t) = (cols[q][0] as usize, cols[q][1] as usize);
            // SAFETY: pairs hold checked (slot, token) indices; phase 0 converted row
            // t * ne11 + s % ne11 (below b's row count) into `rb` bytes of the work buffer.
            unsafe {
                std::slice::from_raw_parts(ctx.work.add((t * ne11 + s % ne11) * l.rb), nb * abb)
            }
        };
        let chunk = mmr::chunk_blocks(a.dtype, cols.len());
        mmr::run_task(
            kern,
            a.dtype,
            nb,
            chunk,
            weights,
            g0..g1,
            col,
            cols.len(),
            &mut acc,
            |i, q, v| {
                let p = cols[q];
                // SAFETY: rows i..i + 8 <= m and the pair's (slot, token) are below dst's dims 1
                // and 2; the elements belong to this chunk, which only this worker took, and each
                // pair appears once.
                unsafe {
                    let o =
                        d.ptr.add(i * d.nb[0] + p[0] as usize * d.nb[1] + p[1] as usize * d.nb[2]);
                    mmr::store8(o, d.nb[0], v);
                }
            },
        );
    }
    Ok(())
}

/// What `supports` checks: the weights need a dot-product kernel and, for F32 activations, a
/// converter into their vec-dot type.
/// The tier needs the experts' dot product and the activation conversion.
pub(crate) fn supports(
    graph: &crate::graph::Graph,
    t: &crate::graph::Tensor,
    kt: &KernelTable,
) -> Result<()> {
    let (Some(a), Some(b)) = (t.src[0], t.src[1]) else {
        return Err(Error::arg("mul_mat_id: missing sources"));
    };
    let (a, b) = (graph.t(a), graph.t(b));
    check_kernels(kt, a.dtype, b.dtype).map_err(|msg| Error::Unsupported {
        op: "mul_mat_id",
        backend: "CPU".into(),
        msg,
    })
}

pub(crate) fn check_kernels(
    kt: &KernelTable,
    a: DType,
    b: DType,
) -> std::result::Result<(), String> {
    let vd = a.vec_dot_type();
    if kt.vec_dot(a).is_none() || (b != vd && kt.activation_converter(vd).is_none()) {
        return Err(format!("no {a} x {vd} dot product kernel"));
    }
    Ok(())
}
