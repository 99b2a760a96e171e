//! flash_attn_ext for many query rows with F32/F16/BF16 K and V: a tiled path on the GEMM
//! engine's float family (`gemm::float`: its strips, panels and `sweep`).
//!
//! A task is `QB` query rows of one (head, batch). It walks the KV in blocks of `KVB` positions:
//! S = Q K^T for the block (Q rows packed into 6-row strips, K rows into 16-column panels, so
//! each 6 x 16 product tile is 6 runs of 16 consecutive logits of S's rows: scaled and masked
//! with vector kernels, no transposition), an online-softmax update of each row's (max, sum)
//! with the output rows rescaled, then O += P V (P packed into 6-row strips, V into 16-column
//! panels). Blocks whose
//! mask is -inf for every row of the task are skipped (the causal half of a prefill). Tasks are
//! handed out through the node's counter and each output row is produced by one task in one fixed
//! order, so results do not depend on the thread count. Q and the S/P products stay in f32 (ggml
//! rounds Q to F16 for F16 K; f32 is at least as accurate).

use super::NodeCtx;
use super::gemm::float::{Kernels, Strips, TILE, pack_f32_strip, sweep};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::FlashAttnParams;
use crate::kernels::sgemm::{SG_MR, SG_NR};
use crate::ops::node::{ExecNode, align_up};
use std::sync::atomic::Ordering;

/// Query rows per task (16 strips of 6; K and V are converted once per task, so more rows
/// amortise that better).
const QB: usize = 96;
/// KV positions per block (6 panels of 16).
const KVB: usize = 96;

const _: () =
    assert!(QB.is_multiple_of(SG_MR) && KVB.is_multiple_of(SG_NR) && KVB.is_multiple_of(SG_MR));

fn kv_ok(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::BF16)
}

/// Whether the tiled path runs this node (the caller already chose the one-pass-per-row mode).
pub(crate) fn applies(node: &ExecNode) -> bool {
    match (node.src[1].as_ref(), node.src[2].as_ref()) {
        (Some(k), Some(v)) => kv_ok(k.dtype) && kv_ok(v.dtype),
        _ => false,
    }
}

struct Layout {
    dk: usize,
    dv: usize,
    dv16: usize,
    qp: usize,
    ks: usize,
    sb: usize,
    ps: usize,
    vp: usize,
    o: usize,
    ms: usize,
    row: usize,
    tl: usize,
    total: usize,
}

fn layout(node: &ExecNode) -> Layout {
    let dk = node.src[0].as_ref().map(|t| t.ne[0]).unwrap_or(0);
    let dv = node.src[2].as_ref().map(|t| t.ne[0]).unwrap_or(0);
    let dv16 = dv.div_ceil(SG_NR) * SG_NR;
    // Offsets in f32 units, each area 64-byte aligned.
    let mut at = 0;
    let mut take = |n: usize| {
        let o = at;
        at += align_up(n, 16);
        o
    };
    let qp = take(QB * dk);
    let ks = take(KVB * dk);
    let sb = take(QB * KVB);
    let ps = take(QB * KVB);
    let vp = take(KVB * dv16);
    let o = take(QB * dv16);
    let ms = take(2 * QB);
    let row = take(dk.max(dv16));
    // Product tiles: S's (QB / 6 strips by KVB / 16 panels) or a PV block's (by dv16 / 16).
    let tl = take(QB * KVB.max(dv16));
    Layout { dk, dv, dv16, qp, ks, sb, ps, vp, o, ms, row, tl, total: at }
}

/// Per-thread scratch bytes.
pub(crate) fn scratch_bytes(node: &ExecNode) -> usize {
    layout(node).total * 4
}

/// With more than one query block per head, K and V of every KV head are packed once (phase 0)
/// when they take at most this many bytes; otherwise each task packs the blocks it reads.
const PREPACK_MAX: usize = 128 << 20;

/// The prepacked K/V layout, in f32 units: per head, `n16 / 16` K panels of `dk * 16`, then per
/// head `dv16 / 16` V panels of `n16 * 16` (kv rows padded to a multiple of 16 with zeros).
struct Prepack {
    heads: usize,
    n16: usize,
    k_head: usize,
    v_head: usize,
    v_off: usize,
}

fn prepack(node: &ExecNode) -> Option<Prepack> {
    let (q, k, v) = (node.src[0].as_ref()?, node.src[1].as_ref()?, node.src[2].as_ref()?);
    if q.ne[1] <= QB {
        // One query block per head: each task packs its K/V blocks once anyway.
        return None;
    }
    let (dk, dv16) = (k.ne[0], v.ne[0].div_ceil(SG_NR) * SG_NR);
    let heads = k.ne[2] * k.ne[3];
    let n16 = k.ne[1].div_ceil(SG_NR) * SG_NR;
    let (k_head, v_head) = (n16 * dk, n16 * dv16);
    let v_off = align_up(heads * k_head, 16);
    let total = (v_off + heads * v_head) * 4;
    (total <= PREPACK_MAX).then_some(Prepack { heads, n16, k_head, v_head, v_off })
}

/// Bytes of the prepacked K/V area at the start of the work buffer (0: tasks pack their own).
pub(crate) fn prepack_bytes(node: &ExecNode) -> usize {
    prepack(node).map_or(0, |pp| align_up((pp.v_off + pp.heads * pp.v_head) * 4, 64))
}

/// Phase 0 (when `prepack_bytes > 0`): K strips and V panels of every KV head.
pub(crate) fn pack_kv(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (k, v) = (ctx.src(1), ctx.src(2));
    let pp = prepack(ctx.node).expect("prepacked layout");
    let (dk, dv, n_kv) = (k.ne[0], v.ne[0], k.ne[1]);
    let dv16 = dv.div_ceil(SG_NR) * SG_NR;
    let unsupported = |t: DType| Error::Unsupported {
        op: "flash_attn_ext",
        backend: "CPU".into(),
        msg: format!("no {t} -> f32"),
    };
    let k_to_f32 =
        super::get_rows::row_converter(ctx.kt, k.dtype).ok_or_else(|| unsupported(k.dtype))?;
    let v_to_f32 =
        super::get_rows::row_converter(ctx.kt, v.dtype).ok_or_else(|| unsupported(v.dtype))?;
    let panels = pp.n16 / SG_NR;
    let (u0, u1) = super::split(pp.heads * panels, ith, ctx.nth);
    // The conversion row lives in this worker's scratch area (after the prepacked area).
    let l = layout(ctx.node);
    let at = prepack_bytes(ctx.node) + ith * align_up(scratch_bytes(ctx.node), 64);
    debug_assert!(at + l.total * 4 <= ctx.work_len);
    // SAFETY: work_size reserved nth scratch areas after the prepacked area; area `ith` is this
    // worker's, and its row region holds max(dk, dv16) f32.
    let row = unsafe {
        std::slice::from_raw_parts_mut((ctx.work.add(at) as *mut f32).add(l.row), dk.max(dv16))
    };
    for u in u0..u1 {
        let (h, pk) = (u / panels, u % panels);
        let (ik2, ik3) = (h % k.ne[2], h / k.ne[2]);
        // SAFETY: unit u owns K panel `pk` of head h and rows 16 pk..16 pk + 16 of each of the
        // head's V panels; all lie inside the prepacked area (prepack_bytes) at the start of the
        // work buffer, and no other worker writes them.
        let kpanel = unsafe {
            std::slice::from_raw_parts_mut(
                (ctx.work as *mut f32).add(h * pp.k_head + pk * dk * SG_NR),
                dk * SG_NR,
            )
        };
        for r in 0..SG_NR {
            let j = pk * SG_NR + r;
            if j < n_kv {
                // SAFETY: kv row j < n_kv of (ik2, ik3) exists with dk (dv) contiguous
                // elements of k's (v's) type (build check).
                let kr = unsafe {
                    std::slice::from_raw_parts(k.row(j, ik2, ik3), k.dtype.row_bytes(dk))
                };
                k_to_f32(kr, &mut row[..dk]);
            } else {
                row[..dk].fill(0.0);
            }
            for (g, &x) in kpanel.chunks_exact_mut(SG_NR).zip(&row[..dk]) {
                g[r] = x;
            }
            if j < n_kv {
                // SAFETY: as above.
                let vr = unsafe {
                    std::slice::from_raw_parts(v.row(j, ik2, ik3), v.dtype.row_bytes(dv))
                };
                v_to_f32(vr, &mut row[..dv]);
                row[dv..dv16].fill(0.0);
            } else {
                row[..dv16].fill(0.0);
            }
            for pv in 0..dv16 / SG_NR {
                // SAFETY: see the panel above: row j of panel pv of head h belongs to this unit.
                unsafe {
                    let at = pp.v_off + h * pp.v_head + pv * pp.n16 * SG_NR + j * SG_NR;
                    std::ptr::copy_nonoverlapping(
                        row[pv * SG_NR..].as_ptr(),
                        (ctx.work as *mut f32).add(at),
                        SG_NR,
                    );
                }
            }
        }
    }
    Ok(())
}

/// Runs this worker's tasks. `scratch` is its own area of `scratch_bytes` (64-byte aligned).
pub(crate) fn compute(
    ctx: &NodeCtx<'_>,
    p: &FlashAttnParams,
    scratch: *mut f32,
    add_sink: impl Fn(usize, &mut f32, &mut f32, &mut [f32]),
) -> Result<()> {
    let (q, k, v, d) = (ctx.src(0), ctx.src(1), ctx.src(2), ctx.dst());
    let mask = ctx.node.src[3].as_ref();
    let l = layout(ctx.node);
    let (dk, dv, dv16) = (l.dk, l.dv, l.dv16);
    let table = ctx.kt;
    let kern = Kernels::f32(table);
    let unsupported = |t: DType| Error::Unsupported {
        op: "flash_attn_ext",
        backend: "CPU".into(),
        msg: format!("no {t} -> f32"),
    };
    let k_to_f32 =
        super::get_rows::row_converter(ctx.kt, k.dtype).ok_or_else(|| unsupported(k.dtype))?;
    let v_to_f32 =
        super::get_rows::row_converter(ctx.kt, v.dtype).ok_or_else(|| unsupported(v.dtype))?;
    // SAFETY: the caller hands this worker its own scratch of `l.total` f32.
    let buf = unsafe { std::slice::from_raw_parts_mut(scratch, l.total) };
    let (n_q, n_head, n_batch, n_kv) = (q.ne[1], q.ne[2], q.ne[3], k.ne[1]);
    let pre = prepack(ctx.node);
    let packed: &[f32] = match &pre {
        // SAFETY: with a prepacked layout, phase 0 filled that area and the barrier published
        // it; it is only read from now on, and it does not overlap the worker scratch areas.
        Some(pp) => unsafe {
            std::slice::from_raw_parts(ctx.work as *const f32, pp.v_off + pp.heads * pp.v_head)
        },
        None => &[],
    };
    let q_blocks = n_q.div_ceil(QB);
    let tasks = q_blocks * n_head * n_batch;
    let scale = if p.logit_softcap != 0.0 { p.scale / p.logit_softcap } else { p.scale };
    loop {
        let t = ctx.counter.fetch_add(1, Ordering::Relaxed);
        if t >= tasks {
            return Ok(());
        }
        let qb = t % q_blocks;
        let iq2 = (t / q_blocks) % n_head;
        let iq3 = t / (q_blocks * n_head);
        let q0 = qb * QB;
        let nq = QB.min(n_q - q0);
        let (ik2, ik3) = (iq2 / (q.ne[2] / k.ne[2]), iq3 / (q.ne[3] / k.ne[3]));
        let slope = super::alibi_slope(p.max_bias, n_head, iq2);
        // Pack Q into the engine's strips of 6 rows (missing rows 0).
        for qs in 0..QB / SG_MR {
            let strip = &mut buf[l.qp + qs * dk * SG_MR..][..dk * SG_MR];
            let rows = SG_MR.min(nq.saturating_sub(qs * SG_MR));
            let q_row = |r: usize| {
                // SAFETY: r < rows, so row q0 + qs * 6 + r < n_q of head iq2, batch iq3
                // exists; q rows are contiguous F32 of dk values (build check).
                unsafe { std::slice::from_raw_parts(q.row(q0 + qs * SG_MR + r, iq2, iq3), dk * 4) }
            };
            pack_f32_strip(table, dk, rows, q_row, strip);
        }
        buf[l.o..l.o + QB * dv16].fill(0.0);
        buf[l.ms..l.ms + QB].fill(f32::NEG_INFINITY);
        buf[l.ms + QB..l.ms + 2 * QB].fill(0.0);
        let kv_head = ik3 * k.ne[2] + ik2;
        let mut j0 = 0;
        while j0 < n_kv {
            let nj = KVB.min(n_kv - j0);
            let nj16 = nj.div_ceil(SG_NR);
            // S block: rows = queries, columns = kv. The mask first (scaled by the ALiBi slope):
            // a block masked out for every query of the task is skipped.
            let mut any = mask.is_none();
            if let Some(mt) = mask {
                for c in 0..nq {
                    // SAFETY: query q0 + c < n_q <= mask.ne[1] and kv j0 + nj <= n_kv <=
                    // mask.ne[0] (build check); dims 2, 3 broadcast modulo the mask's.
                    let pm = unsafe { mt.row(q0 + c, iq2 % mt.ne[2], iq3 % mt.ne[3]) };
                    let srow = &mut buf[l.sb + c * KVB..l.sb + c * KVB + nj];
                    // SAFETY: as above: nj mask values from kv j0 lie inside the mask row.
                    unsafe {
                        if mt.dtype == DType::F16 {
                            let raw = std::slice::from_raw_parts(pm.add(2 * j0), 2 * nj);
                            (table.f16_bytes_to_f32)(raw, srow);
                        } else {
                            let raw = (pm as *const f32).add(j0);
                            for (j, o) in srow.iter_mut().enumerate() {
                                *o = raw.add(j).read_unaligned();
                            }
                        }
                    }
                    // x * 1 == x for every f32, so the common slope 1 skips the pass.
                    if slope != 1.0 {
                        for x in srow.iter_mut() {
                            *x *= slope;
                        }
                    }
                    any = any || srow.iter().any(|&x| x != f32::NEG_INFINITY);
                }
            }
            if !any {
                j0 += nj;
                continue;
            }
            // Pack K: panel j / 16 holds element d of kv row j at [d * 16 + j % 16] (missing 0).
            for j in 0..if pre.is_some() { 0 } else { nj16 * SG_NR } {
                let (head, tail) = buf.split_at_mut(l.row);
                let t = &mut tail[..dk];
                if j < nj {
                    // SAFETY: kv row j0 + j < n_kv of (ik2, ik3) exists with dk elements of
                    // k.dtype, contiguous (build check).
                    let kr = unsafe {
                        std::slice::from_raw_parts(k.row(j0 + j, ik2, ik3), k.dtype.row_bytes(dk))
                    };
                    k_to_f32(kr, t);
                } else {
                    t.fill(0.0);
                }
                let panel = &mut head[l.ks + (j / SG_NR) * dk * SG_NR..][..dk * SG_NR];
                for (g, &x) in panel.chunks_exact_mut(SG_NR).zip(t.iter()) {
                    g[j % SG_NR] = x;
                }
            }
            let has_mask = mask.is_some();
            let n_strips = nq.div_ceil(SG_MR);
            {
                let (lo, tiles) = buf.split_at_mut(l.tl);
                let kpanel = |kp: usize| match &pre {
                    Some(pp) => {
                        let b0 = kv_head * pp.k_head + (j0 / SG_NR + kp) * dk * SG_NR;
                        &packed[b0..b0 + dk * SG_NR]
                    }
                    None => &lo[l.ks + kp * dk * SG_NR..l.ks + (kp + 1) * dk * SG_NR],
                };
                let strips = Strips { data: &lo[l.qp..], stride: dk * SG_MR, n: n_strips };
                sweep(kern, dk, &strips, kpanel, nj16, tiles, false, |_| {}, |_, _| {});
                for kp in 0..nj16 {
                    let cols = SG_NR.min(nj - kp * SG_NR);
                    for c in 0..nq {
                        let tile = &tiles[(kp * n_strips + c / SG_MR) * TILE..][..TILE];
                        let tile = &tile[(c % SG_MR) * SG_NR..][..cols];
                        let srow = &mut lo[l.sb + c * KVB + kp * SG_NR..][..cols];
                        if p.logit_softcap == 0.0 {
                            // SAFETY: both runs hold `cols` f32 and do not overlap (scratch
                            // vs. the tile area).
                            unsafe {
                                (table.scale_add_f32)(
                                    cols,
                                    srow.as_mut_ptr(),
                                    tile.as_ptr(),
                                    scale,
                                    has_mask,
                                )
                            };
                        } else {
                            for (e, &t) in srow.iter_mut().zip(tile) {
                                let x = p.logit_softcap * (t * scale).tanh();
                                *e = if has_mask { x + *e } else { x };
                            }
                        }
                    }
                }
            }
            // Online softmax per query row (P overwrites S in place).
            for c in 0..nq {
                let srow = l.sb + c * KVB;
                let bmax = (table.max_f32)(&buf[srow..srow + nj]);
                let m_old = buf[l.ms + c];
                let m_new = m_old.max(bmax);
                if m_new == f32::NEG_INFINITY {
                    buf[srow..srow + nj].fill(0.0);
                    continue;
                }
                // SAFETY: the row holds nj f32 inside `buf`.
                let sum = unsafe { (table.exp_sub_sum_f32)(nj, buf[srow..].as_mut_ptr(), m_new) };
                let ms = if m_old == f32::NEG_INFINITY { 0.0 } else { (m_old - m_new).exp() };
                buf[l.ms + c] = m_new;
                buf[l.ms + QB + c] = buf[l.ms + QB + c] * ms + sum as f32;
                if ms != 1.0 {
                    for o in &mut buf[l.o + c * dv16..l.o + c * dv16 + dv] {
                        *o *= ms;
                    }
                }
            }
            // P into the engine's strips of 6 rows.
            {
                let (lo, hi) = buf.split_at_mut(l.ps);
                for qs in 0..n_strips {
                    let rows = SG_MR.min(nq - qs * SG_MR);
                    let s_row = |r: usize| {
                        let c = qs * SG_MR + r;
                        bytemuck::cast_slice(&lo[l.sb + c * KVB..l.sb + c * KVB + nj])
                    };
                    let strip = &mut hi[qs * KVB * SG_MR..qs * KVB * SG_MR + nj * SG_MR];
                    pack_f32_strip(table, nj, rows, s_row, strip);
                }
            }
            // Pack V: panel d / 16 holds element d of kv row j at [j * 16 + d % 16].
            for j in 0..if pre.is_some() { 0 } else { nj } {
                // SAFETY: kv row j0 + j < n_kv of (ik2, ik3) exists with dv elements of
                // v.dtype, contiguous (build check).
                let vr = unsafe {
                    std::slice::from_raw_parts(v.row(j0 + j, ik2, ik3), v.dtype.row_bytes(dv))
                };
                v_to_f32(vr, &mut buf[l.row..l.row + dv]);
                buf[l.row + dv..l.row + dv16].fill(0.0);
                let (head, tail) = buf.split_at_mut(l.row);
                for pv in 0..dv16 / SG_NR {
                    let at = l.vp + pv * KVB * SG_NR + j * SG_NR;
                    head[at..at + SG_NR].copy_from_slice(&tail[pv * SG_NR..(pv + 1) * SG_NR]);
                }
            }
            // O += P V: the block's products into tiles, then added to the output rows.
            {
                let (lo, tiles) = buf.split_at_mut(l.tl);
                // Strips and panels lie before the output rows (layout order).
                let (los, lo) = lo.split_at_mut(l.o);
                let vpanel = |pv: usize| match &pre {
                    Some(pp) => {
                        let b0 = pp.v_off + kv_head * pp.v_head + pv * pp.n16 * SG_NR + j0 * SG_NR;
                        &packed[b0..b0 + nj * SG_NR]
                    }
                    None => &los[l.vp + pv * KVB * SG_NR..l.vp + pv * KVB * SG_NR + nj * SG_NR],
                };
                let strips = Strips { data: &los[l.ps..], stride: KVB * SG_MR, n: n_strips };
                let n_vp = dv16 / SG_NR;
                sweep(kern, nj, &strips, vpanel, n_vp, tiles, false, |_| {}, |_, _| {});
                for pv in 0..n_vp {
                    for c in 0..nq {
                        let tile = &tiles[(pv * n_strips + c / SG_MR) * TILE..][..TILE];
                        let orow = &mut lo[c * dv16 + pv * SG_NR..][..SG_NR];
                        for (o, &x) in orow.iter_mut().zip(&tile[(c % SG_MR) * SG_NR..]) {
                            *o += x;
                        }
                    }
                }
            }
            j0 += nj;
        }
        for c in 0..nq {
            let mut m = buf[l.ms + c];
            let mut s = buf[l.ms + QB + c];
            let orow = &mut buf[l.o + c * dv16..l.o + c * dv16 + dv];
            add_sink(iq2, &mut m, &mut s, orow);
            let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
            // SAFETY: dst is [dv, n_head, n_q, batch] contiguous F32; (iq2, q0 + c, iq3) are
            // below its dims 1..3; each query row belongs to exactly one task.
            unsafe {
                let dst = std::slice::from_raw_parts_mut(d.row(iq2, q0 + c, iq3) as *mut f32, dv);
                for (o, &a) in dst.iter_mut().zip(orow.iter()) {
                    *o = a * inv;
                }
            }
        }
    }
}
