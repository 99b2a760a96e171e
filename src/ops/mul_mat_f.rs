//! `mul_mat` with several columns as a cache-blocked f32 GEMM on the `KernelTable::sgemm`
//! micro-kernel, for every weight type that has a dequantizer.
//!
//! The arithmetic is ggml's: activations are first rounded through the weight type's vec-dot type
//! (Q8_0, Q8_1, Q8_K, F16, BF16: ggml's `from_float`), so each output is the sum over blocks of
//! (weight value) x (converted activation value), the same products ggml's integer kernels form,
//! summed in f32 instead of int32 and scaled per element instead of per block (differences of a
//! few f32 roundings).
//!
//! Phase 0 packs the activations (all threads): each batch's columns in panels of 16, element `k`
//! of the 16 columns side by side, in f32. Phase 1 hands out blocks of `MC` weight rows by `NC`
//! columns through the node's counter; a block walks K in steps of `KC`, dequantizing its weight
//! rows into f32 strips of 6 (element k of the 6 rows side by side) and running the micro-kernel
//! on every (16-column panel, strip) pair, panel by panel. Every output is the sum over K blocks, in K order, of the kernel's partial
//! sums: the same operations whatever the thread count.

use super::{NodeCtx, split};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::KernelTable;
use crate::kernels::prefetch::prefetch_l2;
use crate::kernels::sgemm::{SG_MR, SG_NR, Sgemm2Fn, SgemmFn};
use crate::plan::{ExecNode, TView, align_up};
use crate::quant::DequantizeFn;
use std::sync::atomic::Ordering;

/// K values per block (a 16-column panel slice of 16 KiB stays in L1 while the task's strips,
/// 96 KiB, come from L2); a multiple of every block size.
const KC: usize = 256;
/// Weight rows per task (16 strips of 6).
pub(crate) const MC: usize = 96;
/// Columns per task (32 panels).
pub(crate) const NC: usize = 512;
/// Tile accumulators per task.
const C_TILES: usize = (MC / SG_MR) * (NC / SG_NR);
/// Fewer columns than this use the dot-product path (the panels would be mostly padding).
pub(crate) const MIN_N: usize = 6;
/// Packed activations larger than this (4 bytes per element of b) use the dot-product path, whose
/// work buffer holds b in the vec-dot type, so a huge batch does not need a huge work buffer.
pub(crate) const MAX_PACKED: usize = 256 << 20;

fn is_float(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::BF16)
}

/// f32 values of rows in the vec-dot type `vd`.
pub(crate) fn vd_to_f32(vd: DType) -> Option<DequantizeFn> {
    match vd {
        DType::Q8_1 => Some(crate::quant::legacy::q8_1_values),
        d => crate::quant::format(d).dequantize,
    }
}

/// Whether this node takes the GEMM path.
pub(crate) fn applies(node: &ExecNode) -> bool {
    let (Some(a), Some(b)) = (node.src[0].as_ref(), node.src[1].as_ref()) else {
        return false;
    };
    if node.dst.ne[1] < MIN_N || a.ne[0] == 0 || packed_bytes(b) > MAX_PACKED {
        return false;
    }
    !int_dot_is_faster(a.dtype)
        && types_ok(a.dtype, b.dtype)
        && (b.dtype == DType::F32 || b.nb[0] == b.dtype.type_size())
}

/// Types whose integer dot product outruns this GEMM: TQ2_0's kernel does a 256-element block in
/// about 4 ns per thread (`bench vec-dot tq2_0 4096 31 --kernel`: 118 GFLOPS a thread, against
/// the ~65-70 a thread this FMA-bound GEMM reaches), so its prefill takes `mul_mat`'s 16 x 16
/// tiles of dot products (side by side at 4096 x 512 x 14336, 2 threads: see CHANGELOG).
pub(crate) fn int_dot_is_faster(a: DType) -> bool {
    a == DType::TQ2_0
}

/// Whether weights of type `a` against activations of type `b` can take the GEMM (b F32, or F16
/// / BF16 for float weights, or already in the vec-dot type).
pub(crate) fn types_ok(a: DType, b: DType) -> bool {
    if is_float(a) {
        return is_float(b);
    }
    let vd = a.vec_dot_type();
    let f = crate::quant::format(a);
    f.dequantize.is_some()
        && f.vec_dot.is_some()
        && KC.is_multiple_of(a.block_size())
        && KC.is_multiple_of(vd.block_size())
        && vd_to_f32(vd).is_some()
        && (b == DType::F32 && crate::quant::format(vd).from_float.is_some() || b == vd)
}

pub(crate) fn panel_floats(k: usize) -> usize {
    k * SG_NR
}

fn b_batches(b: &TView) -> usize {
    b.ne[2] * b.ne[3]
}

fn packed_bytes(b: &TView) -> usize {
    align_up(b_batches(b) * b.ne[1].div_ceil(SG_NR) * panel_floats(b.ne[0]) * 4, 64)
}

/// Per-thread scratch: the packed strip and one dequantized row segment (phase 1), or one f32
/// activation row and its vec-dot conversion (phase 0).
fn scratch_bytes(node: &ExecNode) -> usize {
    let (a, b) = (node.src[0].as_ref().expect("a"), node.src[1].as_ref().expect("b"));
    let k = b.ne[0];
    let strip = align_up(BLOCK_SCRATCH * 4, 64);
    let pack = align_up(k * 4, 64) + align_up(a.dtype.vec_dot_type().row_bytes(k), 64);
    strip.max(pack)
}

pub(crate) fn work_size(node: &ExecNode, nth: usize) -> usize {
    let b = node.src[1].as_ref().expect("mul_mat b");
    packed_bytes(b) + nth * scratch_bytes(node)
}

/// Worker `ith`'s scratch area.
///
/// # Safety
/// Only worker `ith` calls this, once per phase (no other reference to the area exists).
unsafe fn scratch<'a>(ctx: &NodeCtx<'_>, ith: usize) -> &'a mut [u8] {
    let b = ctx.src(1);
    let sb = scratch_bytes(ctx.node);
    let off = packed_bytes(b) + ith * sb;
    debug_assert!(off + sb <= ctx.work_len);
    // SAFETY: work_size reserved nth scratch areas of `sb` bytes after the packed area; worker
    // `ith` alone uses area `ith` (the work buffer and every area are 64-byte aligned).
    unsafe { std::slice::from_raw_parts_mut(ctx.work.add(off), sb) }
}

fn unsupported(what: String) -> Error {
    Error::Unsupported { op: "mul_mat", backend: "CPU".into(), msg: what }
}

/// BF16 weights with an even K take the tier's BF16-pair kernels (`KernelTable::sgemm_bf16`),
/// where it has them: phase 0 packs the activations (rounded to BF16, as ggml) as BF16 pairs, and
/// the weight rows are packed as they are. `kt` is the compute's table (`NodeCtx::kt`), so the
/// packing and the GEMM phases agree on the layout.
pub(crate) fn bf16_pairs(kt: &KernelTable, a: DType, k: usize) -> Option<(SgemmFn, Sgemm2Fn)> {
    if a == DType::BF16 && k.is_multiple_of(2) { kt.sgemm_bf16 } else { None }
}

/// Writes column `c` of a panel: `col`'s values, or (`pairs`: BF16 pairs, `col` holding BF16
/// values exactly) two per slot, element 2j in the low half and 2j + 1 in the high half.
pub(crate) fn panel_column(panel: &mut [f32], c: usize, col: &[f32], pairs: bool) {
    if pairs {
        for (kp, two) in col.chunks_exact(2).enumerate() {
            let bits = (two[0].to_bits() >> 16) | (two[1].to_bits() & 0xFFFF_0000);
            panel[kp * SG_NR + c] = f32::from_bits(bits);
        }
    } else {
        for (kk, &v) in col.iter().enumerate() {
            panel[kk * SG_NR + c] = v;
        }
    }
}

/// Phase 0: packs b into 16-column f32 panels, through the weight type's vec-dot type.
pub(crate) fn pack(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (a, b) = (ctx.src(0), ctx.src(1));
    let (k, n) = (b.ne[0], b.ne[1]);
    let n16 = n.div_ceil(SG_NR);
    let units = b_batches(b) * n16;
    let vd = a.dtype.vec_dot_type();
    let quant = !is_float(a.dtype);
    let (to_vd, from_vd) = if quant {
        let to = ctx.kt.activation_converter(vd);
        let from = vd_to_f32(vd);
        match (to, from) {
            (Some(t), Some(f)) => (Some(t), Some(f)),
            _ => return Err(unsupported(format!("no f32 <-> {vd} conversion"))),
        }
    } else {
        (None, None)
    };
    // F16/BF16 weights: activations take that precision (a product of two such values is exact).
    let table = ctx.kt;
    let round: Option<fn(&mut [f32])> = match a.dtype {
        DType::F16 => Some(table.round_f16),
        DType::BF16 => Some(table.round_bf16),
        _ => None,
    };
    let pairs = bf16_pairs(ctx.kt, a.dtype, k).is_some();
    // SAFETY: this is worker ith, in its one call for phase 0.
    let sc = unsafe { scratch(ctx, ith) };
    let (rowb, vdb) = sc.split_at_mut(align_up(k * 4, 64));
    let rowf: &mut [f32] = bytemuck::cast_slice_mut(&mut rowb[..k * 4]);
    let vdb = &mut vdb[..vd.row_bytes(k)];
    let (u0, u1) = split(units, ith, ctx.nth);
    for u in u0..u1 {
        let (batch, p) = (u / n16, u % n16);
        let (i2, i3) = (batch % b.ne[2], batch / b.ne[2]);
        // SAFETY: unit u < batches * n16 owns floats [u * k * 16, (u + 1) * k * 16) of the packed
        // area, which work_size reserved at the start of the (64-byte aligned) work buffer.
        let panel = unsafe {
            std::slice::from_raw_parts_mut(
                (ctx.work as *mut f32).add(u * panel_floats(k)),
                panel_floats(k),
            )
        };
        for c in 0..SG_NR {
            let col = p * SG_NR + c;
            if col >= n {
                for kk in 0..k {
                    panel[kk * SG_NR + c] = 0.0;
                }
                continue;
            }
            // SAFETY: col < n = b.ne[1], (i2, i3) below b's dims 2 and 3; the row's elements
            // (k values at stride nb[0], or vd.row_bytes(k) contiguous bytes) lie inside b
            // (extent validated at plan time).
            unsafe {
                let row = b.row(col, i2, i3);
                if b.dtype == vd && quant {
                    let bytes = std::slice::from_raw_parts(row, vd.row_bytes(k));
                    from_vd.expect("quant")(bytes, rowf);
                } else {
                    if b.dtype == DType::F32 && b.nb[0] == 4 {
                        std::ptr::copy_nonoverlapping(row, rowf.as_mut_ptr() as *mut u8, k * 4);
                    } else {
                        for (kk, v) in rowf.iter_mut().enumerate() {
                            *v = super::elementwise::ld(row.add(kk * b.nb[0]), b.dtype);
                        }
                    }
                    if let (Some(t), Some(f)) = (to_vd, from_vd) {
                        t(rowf, vdb);
                        f(vdb, rowf);
                    }
                }
            }
            if let Some(round) = round {
                round(rowf);
            }
            panel_column(panel, c, rowf, pairs);
        }
    }
    Ok(())
}

/// Per-thread scratch of [`gemm_block`] in f32: strips, six converted rows, tile accumulators.
pub(crate) const BLOCK_SCRATCH: usize = (MC + SG_MR) * KC + C_TILES * SG_MR * SG_NR;

/// Panels (of the last ones of a K block) over which the next block's rows are prefetched.
const PREFETCH_PANELS: usize = 8;

/// The rows of a strip past the block's last row.
static ZERO_ROW: [u8; KC * 4] = [0; KC * 4];

/// One task of the GEMM: weight rows `i0..i1` (at most `MC`; `a_row(i)` is row i's first byte,
/// `k` elements of `dtype` in whole blocks) times the `ncols` columns packed in `panels` (at most
/// `NC`; panel p at `p * k * 16`), each result handed to `store(i, column, value)` once. Walks K
/// in steps of `KC`, summing the kernel's partial sums in K order.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_block(
    kt: &KernelTable,
    dtype: DType,
    k: usize,
    i0: usize,
    i1: usize,
    a_row: impl Fn(usize) -> *const u8,
    panels: &[f32],
    ncols: usize,
    scratch: &mut [f32],
    mut store: impl FnMut(usize, usize, f32),
) -> Result<()> {
    debug_assert!(
        i1 - i0 <= MC && ncols <= NC && panels.len() >= ncols.div_ceil(SG_NR) * k * SG_NR
    );
    let bf16 = bf16_pairs(kt, dtype, k);
    // With BF16 pairs every K count below (K blocks, panel and strip offsets) is in pairs.
    let div = if bf16.is_some() { 2 } else { 1 };
    let (kernel, kernel2, kernel22) = match bf16 {
        Some((one, two)) => (one, Some(two), None),
        None => (kt.sgemm, kt.sgemm2, kt.sgemm22),
    };
    let deq = row_loader(kt, dtype).ok_or_else(|| unsupported(format!("no {dtype} -> f32")))?;
    let (blck, ts) = (dtype.block_size(), dtype.type_size());
    let (pack, pack_f16) = (kt.sgemm_pack, kt.sgemm_pack_f16);
    let (strips, rest) = scratch[..BLOCK_SCRATCH].split_at_mut(MC * KC);
    let (row_bufs, ctiles) = rest.split_at_mut(SG_MR * KC);
    let n_strips = (i1 - i0).div_ceil(SG_MR);
    let n_panels = ncols.div_ceil(SG_NR);
    let mut k0 = 0;
    while k0 < k {
        let kc = KC.min(k - k0);
        // Pack the rows: strip t holds rows i0 + 6t.., group kk of it element k0 + kk of its 6
        // rows (missing rows zero). F32 and F16 rows are read in place (F16 widened by the
        // packer); the other types are first converted to f32 in `row_bufs`.
        for st in 0..n_strips {
            let mut rows: [&[u8]; SG_MR] = [&ZERO_ROW[..]; SG_MR];
            let mut bufs = row_bufs.chunks_exact_mut(KC);
            for (r, row) in rows.iter_mut().enumerate() {
                let i = i0 + st * SG_MR + r;
                let buf = bufs.next().expect("SG_MR row buffers");
                if i >= i1 {
                    continue;
                }
                // SAFETY: `a_row(i)` starts a row of k elements in whole blocks (caller); k0
                // and kc are multiples of the block size (KC is), so bytes
                // [k0 / blck * ts, (k0 + kc) / blck * ts) lie inside it.
                let bytes = unsafe {
                    std::slice::from_raw_parts(a_row(i).add(k0 / blck * ts), kc / blck * ts)
                };
                if dtype == DType::F32 || dtype == DType::F16 || bf16.is_some() {
                    *row = bytes;
                } else {
                    deq(bytes, &mut buf[..kc]);
                    *row = bytemuck::cast_slice(&buf[..kc]);
                }
            }
            let strip = &mut strips[st * SG_MR * KC..][..kc * SG_MR];
            if bf16.is_some() {
                // The rows' BF16 pairs move as 4-byte units: the f32 packer's transpose.
                pack(kc / 2, rows, strip);
            } else if dtype == DType::F16 {
                pack_f16(kc, rows, strip);
            } else {
                pack(kc, rows, strip);
            }
        }
        // Each 16-column panel slice stays in L1 while every strip passes over it; the partial
        // sums go to the tile accumulators.
        // The next K block's weight rows are fetched while the last panels run (a block's rows
        // are `i1 - i0` separate streams, too many for the hardware prefetcher).
        let next = k0 + kc;
        let window = n_panels.min(PREFETCH_PANELS);
        let (seg, seg_len) = (next / blck * ts, KC.min(k.saturating_sub(next)) / blck * ts);
        let (k0d, kcd) = (k0 / div, kc / div);
        let mut p = 0;
        while p < n_panels {
            // Two panels at a time where the tier has a 2 x 2 tile kernel (same bits).
            let group = if kernel22.is_some() && p + 1 < n_panels { 2 } else { 1 };
            for q in p..p + group {
                if next < k && q + window >= n_panels {
                    let w = q + window - n_panels;
                    let (r0, r1) = ((i1 - i0) * w / window, (i1 - i0) * (w + 1) / window);
                    for i in i0 + r0..i0 + r1 {
                        let row = a_row(i).wrapping_add(seg);
                        for off in (0..seg_len).step_by(64) {
                            prefetch_l2(row.wrapping_add(off));
                        }
                    }
                }
            }
            let panel_at = |q: usize| {
                let base = q * panel_floats(k) + k0d * SG_NR;
                &panels[base..base + kcd * SG_NR]
            };
            // The next panel's slice (or the first panel's of the next K block), a line range
            // per strip, is fetched while this group runs: panels stream from L3 or memory.
            let (np, nk0) = if p + group < n_panels { (p + group, k0) } else { (0, next) };
            let next_slice = if nk0 < k {
                let nb = np * panel_floats(k) + nk0 / div * SG_NR;
                &panels[nb..nb + KC.min(k - nk0) / div * SG_NR]
            } else {
                &panels[..0]
            };
            let lines = (next_slice.len() * 4).div_ceil(64);
            let fetch = |st: usize| {
                for l in (lines * st / n_strips)..(lines * (st + 1) / n_strips) {
                    prefetch_l2(next_slice.as_ptr().wrapping_add(l * 16) as *const u8);
                }
            };
            let strip = |st: usize| &strips[st * SG_MR * KC..][..kcd * SG_MR];
            const T: usize = SG_MR * SG_NR;
            let mut st = 0;
            if let (2, Some(kernel22)) = (group, kernel22) {
                let (left, right) = ctiles.split_at_mut((p + 1) * (MC / SG_MR) * T);
                let tp = &mut left[p * (MC / SG_MR) * T..][..n_strips * T];
                let tq = &mut right[..n_strips * T];
                let (b0, b1) = (panel_at(p), panel_at(p + 1));
                for (pp, pq) in tp.chunks_exact_mut(2 * T).zip(tq.chunks_exact_mut(2 * T)) {
                    fetch(st);
                    fetch(st + 1);
                    let (t00, t10) = pp.split_at_mut(T);
                    let (t01, t11) = pq.split_at_mut(T);
                    let tiles = [t00, t01, t10, t11].map(|t| t.try_into().expect("tile"));
                    kernel22(kcd, [strip(st), strip(st + 1)], [b0, b1], tiles, k0 > 0);
                    st += 2;
                }
                if st < n_strips {
                    fetch(st);
                    for (q, tiles) in [(p, tp), (p + 1, tq)] {
                        let tile: &mut [f32; T] =
                            (&mut tiles[st * T..][..T]).try_into().expect("tile");
                        kernel(kcd, strip(st), panel_at(q), tile, k0 > 0);
                    }
                }
                p += 2;
                continue;
            }
            let panel = panel_at(p);
            let tiles = &mut ctiles[p * (MC / SG_MR) * T..][..n_strips * T];
            if let Some(kernel2) = kernel2 {
                // Two strips per call where the tier has the registers (same bits).
                for pair in tiles.chunks_exact_mut(2 * T) {
                    fetch(st);
                    fetch(st + 1);
                    let (t0, t1) = pair.split_at_mut(T);
                    let (t0, t1) = (t0.try_into().expect("tile"), t1.try_into().expect("tile"));
                    kernel2(kcd, strip(st), strip(st + 1), panel, t0, t1, k0 > 0);
                    st += 2;
                }
            }
            while st < n_strips {
                fetch(st);
                let tile: &mut [f32; T] = (&mut tiles[st * T..][..T]).try_into().expect("tile");
                kernel(kcd, strip(st), panel, tile, k0 > 0);
                st += 1;
            }
            p += 1;
        }
        k0 += kc;
    }
    for p in 0..n_panels {
        let cols = SG_NR.min(ncols - p * SG_NR);
        for st in 0..n_strips {
            let s = i0 + st * SG_MR;
            let tile = &ctiles[(p * (MC / SG_MR) + st) * SG_MR * SG_NR..];
            for c in 0..cols {
                for r in 0..SG_MR.min(i1 - s) {
                    store(s + r, p * SG_NR + c, tile[r * SG_NR + c]);
                }
            }
        }
    }
    Ok(())
}

/// Phase 1: the blocked GEMM, one `MC x NC` block per task.
pub(crate) fn compute(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (a, b, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    let (k, m, n) = (a.ne[0], d.ne[0], d.ne[1]);
    let n16 = n.div_ceil(SG_NR);
    let (r2, r3) = (b.ne[2] / a.ne[2], b.ne[3] / a.ne[3]);
    let blocks_m = m.div_ceil(MC);
    let blocks_n = n.div_ceil(NC);
    let per_batch = blocks_m * blocks_n;
    let total = per_batch * d.ne[2] * d.ne[3];
    // SAFETY: this is worker ith, in its one call for phase 1.
    let sc = unsafe { scratch(ctx, ith) };
    let scf: &mut [f32] = bytemuck::cast_slice_mut(&mut sc[..BLOCK_SCRATCH * 4]);
    // SAFETY: phase 0 filled the packed area and the barrier between phases published it; it is
    // only read from now on.
    let packed = unsafe { std::slice::from_raw_parts(ctx.work as *const f32, packed_bytes(b) / 4) };
    loop {
        let t = ctx.counter.fetch_add(1, Ordering::Relaxed);
        if t >= total {
            return Ok(());
        }
        let batch = t / per_batch;
        let (bm, bn) = ((t % per_batch) % blocks_m, (t % per_batch) / blocks_m);
        let (i2, i3) = (batch % d.ne[2], batch / d.ne[2]);
        let (ia2, ia3) = (i2 / r2, i3 / r3);
        let (i0, i1) = (bm * MC, ((bm + 1) * MC).min(m));
        let (j0, j1) = (bn * NC, ((bn + 1) * NC).min(n));
        let base = ((i3 * b.ne[2] + i2) * n16 + j0 / SG_NR) * panel_floats(k);
        let panels = &packed[base..base + (j1 - j0).div_ceil(SG_NR) * panel_floats(k)];
        // SAFETY: rows i < m of batch (ia2, ia3) exist and hold k elements (plan-time checks).
        let a_row = |i: usize| unsafe { a.row(i, ia2, ia3) as *const u8 };
        gemm_block(ctx.kt, a.dtype, k, i0, i1, a_row, panels, j1 - j0, scf, |i, c, v| {
            // SAFETY: (i, j0 + c) is inside this task's block of dst, which only this worker
            // writes; the indices are below dst's shape.
            unsafe {
                let e = d.ptr.add(i * d.nb[0] + (j0 + c) * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3])
                    as *mut f32;
                e.write_unaligned(v);
            }
        })?;
    }
}

/// Converts a run of whole blocks of `dtype` to f32 (F16 through the tier's F16C converter).
fn row_loader(kt: &KernelTable, dtype: DType) -> Option<DequantizeFn> {
    super::get_rows::row_converter(kt, dtype)
}
