//! flash_attn_ext for many query rows with F32/F16/BF16 K and V: a tiled path on the float GEMM
//! micro-kernel (`KernelTable::sgemm`).
//!
//! A task is `QB` query rows of one (head, batch). It walks the KV in blocks of `KVB` positions:
//! S = Q K^T for the block (K rows packed into 6-row strips, Q into 16-row panels), scale,
//! softcap and mask, an online-softmax update of each row's (max, sum) with the output rows
//! rescaled, then O += P V (P packed into 6-row strips, V into 16-column panels). Blocks whose
//! mask is -inf for every row of the task are skipped (the causal half of a prefill). Tasks are
//! handed out through the node's counter and each output row is produced by one task in one fixed
//! order, so results do not depend on the thread count. Q and the S/P products stay in f32 (ggml
//! rounds Q to F16 for F16 K; f32 is at least as accurate).

use super::NodeCtx;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::FlashAttnParams;
use crate::kernels::sgemm::{SG_MR, SG_NR};
use crate::plan::{ExecNode, align_up};
use std::sync::atomic::Ordering;

/// Query rows per task (8 panels of 16; K and V are converted once per task, so more rows
/// amortise that better).
const QB: usize = 96;
/// KV positions per block (16 strips of 6).
const KVB: usize = 96;

const _: () = assert!(QB % SG_NR == 0 && QB % SG_MR == 0 && KVB % SG_MR == 0);

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
    let row = take((SG_MR * dk).max(dv16));
    Layout { dk, dv, dv16, qp, ks, sb, ps, vp, o, ms, row, total: at }
}

/// Per-thread scratch bytes.
pub(crate) fn scratch_bytes(node: &ExecNode) -> usize {
    layout(node).total * 4
}

/// With more than one query block per head, K and V of every KV head are packed once (phase 0)
/// when they take at most this many bytes; otherwise each task packs the blocks it reads.
const PREPACK_MAX: usize = 128 << 20;

/// The prepacked K/V layout, in f32 units: per head, `n6 / 6` K strips of `dk * 6`, then per
/// head `dv16 / 16` V panels of `n6 * 16` (kv rows padded to a multiple of 6 with zeros).
struct Prepack {
    heads: usize,
    n6: usize,
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
    let n6 = k.ne[1].div_ceil(SG_MR) * SG_MR;
    let (k_head, v_head) = (n6 * dk, n6 * dv16);
    let v_off = align_up(heads * k_head, 16);
    let total = (v_off + heads * v_head) * 4;
    (total <= PREPACK_MAX).then_some(Prepack { heads, n6, k_head, v_head, v_off })
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
    let k_to_f32 = super::get_rows::row_converter(k.dtype).ok_or_else(|| unsupported(k.dtype))?;
    let v_to_f32 = super::get_rows::row_converter(v.dtype).ok_or_else(|| unsupported(v.dtype))?;
    let strips = pp.n6 / SG_MR;
    let (u0, u1) = super::split(pp.heads * strips, ith, ctx.nth);
    // The conversion row lives in this worker's scratch area (after the prepacked area).
    let l = layout(ctx.node);
    let at = prepack_bytes(ctx.node) + ith * align_up(scratch_bytes(ctx.node), 64);
    debug_assert!(at + l.total * 4 <= ctx.work_len);
    // SAFETY: work_size reserved nth scratch areas after the prepacked area; area `ith` is this
    // worker's, and its row region holds max(6 dk, dv16) f32.
    let row = unsafe {
        std::slice::from_raw_parts_mut((ctx.work.add(at) as *mut f32).add(l.row), dk.max(dv16))
    };
    for u in u0..u1 {
        let (h, st) = (u / strips, u % strips);
        let (ik2, ik3) = (h % k.ne[2], h / k.ne[2]);
        // SAFETY: unit u owns K strip `st` of head h and rows 6 st..6 st + 6 of each of the
        // head's V panels; all lie inside the prepacked area (prepack_bytes) at the start of the
        // work buffer, and no other worker writes them.
        let kstrip = unsafe {
            std::slice::from_raw_parts_mut(
                (ctx.work as *mut f32).add(h * pp.k_head + st * dk * SG_MR),
                dk * SG_MR,
            )
        };
        for r in 0..SG_MR {
            let j = st * SG_MR + r;
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
            for (g, &x) in kstrip.chunks_exact_mut(SG_MR).zip(&row[..dk]) {
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
                // SAFETY: see the strip above: row j of panel pv of head h belongs to this unit.
                unsafe {
                    let at = pp.v_off + h * pp.v_head + pv * pp.n6 * SG_NR + j * SG_NR;
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
    let table = crate::kernels::table();
    let kernel = table.sgemm;
    let unsupported = |t: DType| Error::Unsupported {
        op: "flash_attn_ext",
        backend: "CPU".into(),
        msg: format!("no {t} -> f32"),
    };
    let k_to_f32 = super::get_rows::row_converter(k.dtype).ok_or_else(|| unsupported(k.dtype))?;
    let v_to_f32 = super::get_rows::row_converter(v.dtype).ok_or_else(|| unsupported(v.dtype))?;
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
    let mut out = [0f32; SG_MR * SG_NR];
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
        // Pack Q: panel c / 16 holds element d of rows c at [d * 16 + c % 16] (missing rows 0).
        for c in 0..QB {
            let panel = l.qp + (c / SG_NR) * dk * SG_NR;
            for dd in 0..dk {
                buf[panel + dd * SG_NR + c % SG_NR] = if c < nq {
                    // SAFETY: row q0 + c < n_q of head iq2, batch iq3 exists; q rows are
                    // contiguous F32 of dk values (build check).
                    unsafe { (q.row(q0 + c, iq2, iq3) as *const f32).add(dd).read_unaligned() }
                } else {
                    0.0
                };
            }
        }
        buf[l.o..l.o + QB * dv16].fill(0.0);
        buf[l.ms..l.ms + QB].fill(f32::NEG_INFINITY);
        buf[l.ms + QB..l.ms + 2 * QB].fill(0.0);
        let mut j0 = 0;
        while j0 < n_kv {
            let nj = KVB.min(n_kv - j0);
            // S block: scaled logits, then softcap and mask; rows = queries, columns = kv.
            // The mask first: a block masked out for every query of the task is skipped.
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
                    for x in srow.iter_mut() {
                        *x *= slope;
                        any |= *x != f32::NEG_INFINITY;
                    }
                }
            }
            if !any {
                j0 += nj;
                continue;
            }
            // Pack K: strip r / 6 holds element d of kv rows at [d * 6 + r % 6] (missing 0).
            let kv_head = ik3 * k.ne[2] + ik2;
            for st in 0..if pre.is_some() { 0 } else { nj.div_ceil(SG_MR) } {
                let tmp = &mut buf[l.row..l.row + SG_MR * dk];
                for r in 0..SG_MR {
                    let j = st * SG_MR + r;
                    let t = &mut tmp[r * dk..(r + 1) * dk];
                    if j < nj {
                        // SAFETY: kv row j0 + j < n_kv of (ik2, ik3) exists with dk elements of
                        // k.dtype, contiguous (build check).
                        let kr = unsafe {
                            std::slice::from_raw_parts(
                                k.row(j0 + j, ik2, ik3),
                                k.dtype.row_bytes(dk),
                            )
                        };
                        k_to_f32(kr, t);
                    } else {
                        t.fill(0.0);
                    }
                }
                let (head, tail) = buf.split_at_mut(l.row);
                let tmp = &tail[..SG_MR * dk];
                let strip = &mut head[l.ks + st * dk * SG_MR..l.ks + (st + 1) * dk * SG_MR];
                for (dd, g) in strip.chunks_exact_mut(SG_MR).enumerate() {
                    for (r, x) in g.iter_mut().enumerate() {
                        *x = tmp[r * dk + dd];
                    }
                }
            }
            for st in 0..nj.div_ceil(SG_MR) {
                for pq in 0..nq.div_ceil(SG_NR) {
                    let b0 = l.qp + pq * dk * SG_NR;
                    let kstrip = match &pre {
                        Some(pp) => {
                            let a0 = kv_head * pp.k_head + (j0 / SG_MR + st) * dk * SG_MR;
                            &packed[a0..a0 + dk * SG_MR]
                        }
                        None => &buf[l.ks + st * dk * SG_MR..l.ks + (st + 1) * dk * SG_MR],
                    };
                    kernel(dk, kstrip, &buf[b0..b0 + dk * SG_NR], &mut out, false);
                    for rr in 0..SG_MR.min(nj - st * SG_MR) {
                        for cc in 0..SG_NR.min(nq - pq * SG_NR) {
                            let (c, j) = (pq * SG_NR + cc, st * SG_MR + rr);
                            let mut x = out[rr * SG_NR + cc] * scale;
                            if p.logit_softcap != 0.0 {
                                x = p.logit_softcap * x.tanh();
                            }
                            let e = &mut buf[l.sb + c * KVB + j];
                            *e = if mask.is_some() { x + *e } else { x };
                        }
                    }
                }
            }
            // Online softmax per query row (P overwrites S in place).
            for c in 0..nq {
                let srow = l.sb + c * KVB;
                let bmax = buf[srow..srow + nj].iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
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
            // P into 6-row strips: strip c / 6 holds kv j of rows at [j * 6 + c % 6].
            {
                let (lo, hi) = buf.split_at_mut(l.ps);
                for qs in 0..nq.div_ceil(SG_MR) {
                    let strip = &mut hi[qs * KVB * SG_MR..qs * KVB * SG_MR + nj * SG_MR];
                    for (j, g) in strip.chunks_exact_mut(SG_MR).enumerate() {
                        for (r, x) in g.iter_mut().enumerate() {
                            let c = qs * SG_MR + r;
                            *x = if c < nq { lo[l.sb + c * KVB + j] } else { 0.0 };
                        }
                    }
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
            // O += P V.
            for qs in 0..nq.div_ceil(SG_MR) {
                for pv in 0..dv16 / SG_NR {
                    let a0 = l.ps + qs * KVB * SG_MR;
                    let vpanel = match &pre {
                        Some(pp) => {
                            let b0 =
                                pp.v_off + kv_head * pp.v_head + pv * pp.n6 * SG_NR + j0 * SG_NR;
                            &packed[b0..b0 + nj * SG_NR]
                        }
                        None => &buf[l.vp + pv * KVB * SG_NR..l.vp + pv * KVB * SG_NR + nj * SG_NR],
                    };
                    kernel(nj, &buf[a0..a0 + nj * SG_MR], vpanel, &mut out, false);
                    for rr in 0..SG_MR.min(nq - qs * SG_MR) {
                        let orow = l.o + (qs * SG_MR + rr) * dv16 + pv * SG_NR;
                        for cc in 0..SG_NR {
                            buf[orow + cc] += out[rr * SG_NR + cc];
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
