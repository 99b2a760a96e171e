//! flash_attn_ext: online-softmax attention (ggml's ggml_compute_forward_flash_attn_ext_f16).
//! Q rows are converted once into K's vec-dot type; V rows are accumulated in f32 for every V type
//! (ggml accumulates F16 V in f16; f32 is at least as accurate).
//!
//! Two paths, chosen from the shapes only (never the thread count), so results do not depend on
//! the number of threads:
//! - many query rows: one pass per row, rows handed out through the chunk counter;
//! - few query rows over a long KV (decode): the KV is cut into fixed chunks of `KV_CHUNK`;
//!   phase 0 computes a partial (max, sum, V accumulator) per (row, chunk), phase 1 combines the
//!   partials of each row in chunk order.

use super::{NodeCtx, split};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::FlashAttnParams;
use crate::kernels::prefetch::prefetch_l1;
use crate::ops::node::{ExecNode, TView, align_up};
use crate::quant::util::fp16_to_fp32;
use std::sync::atomic::Ordering;

const KV_CHUNK: usize = 256;
/// Below this many query rows a long KV is split into chunks.
const SPLIT_ROWS: usize = 64;
/// From this many queries per head, F32/F16/BF16 K/V take the tiled path.
const TILED_ROWS: usize = 8;

struct Shape {
    dk: usize,
    dv: usize,
    n_q: usize,
    n_head: usize,
    n_kv: usize,
    rows: usize,
    chunks: usize,
}

fn shape(node: &ExecNode) -> Shape {
    let q = node.src[0].as_ref().map(|t| t.ne).unwrap_or([0; 4]);
    let k = node.src[1].as_ref().map(|t| t.ne).unwrap_or([0; 4]);
    let v = node.src[2].as_ref().map(|t| t.ne).unwrap_or([0; 4]);
    let rows = q[1] * q[2] * q[3];
    let n_kv = k[1];
    let chunks = if rows < SPLIT_ROWS && n_kv > KV_CHUNK { n_kv.div_ceil(KV_CHUNK) } else { 1 };
    Shape { dk: q[0], dv: v[0], n_q: q[1], n_head: q[2], n_kv, rows, chunks }
}

pub(crate) fn phases(node: &ExecNode) -> u8 {
    if tiled(node) {
        return if super::flash_attn_tiled::prepack_bytes(node) > 0 { 2 } else { 1 };
    }
    if shape(node).chunks > 1 { 2 } else { 1 }
}

/// Per-thread scratch: Q in K's vec-dot type, one V row in f32, the V accumulator, Q widened
/// back to f32 (the F16 kernel's operand).
fn scratch_bytes(node: &ExecNode) -> usize {
    let s = shape(node);
    let kd = node.src[1].as_ref().map(|t| t.dtype.vec_dot_type()).unwrap_or(DType::F32);
    align_up(kd.row_bytes(s.dk), 64) + align_up(s.dv * 4, 64) * 2 + align_up(s.dk * 4, 64)
}

fn partial_floats(s: &Shape) -> usize {
    s.dv + 2
}

/// Whether the tiled many-rows path (`flash_attn_tiled.rs`) runs this node.
fn tiled(node: &ExecNode) -> bool {
    shape(node).chunks == 1
        && shape(node).n_q >= TILED_ROWS
        && super::flash_attn_tiled::applies(node)
}

pub(crate) fn work_size(node: &ExecNode, nth: usize) -> usize {
    if tiled(node) {
        return super::flash_attn_tiled::prepack_bytes(node)
            + nth * align_up(super::flash_attn_tiled::scratch_bytes(node), 64);
    }
    let s = shape(node);
    let partials = if s.chunks > 1 { s.rows * s.chunks * partial_floats(&s) * 4 } else { 0 };
    align_up(partials, 64) + nth * scratch_bytes(node)
}

struct Row {
    m: f32,
    s: f32,
}

/// Attention of one query row over kv range [c0, c1), accumulating into `acc` (dv floats).
#[allow(clippy::too_many_arguments)]
fn attend(
    ctx: &NodeCtx<'_>,
    p: &FlashAttnParams,
    sh: &Shape,
    row: usize,
    c0: usize,
    c1: usize,
    qbuf: &mut [u8],
    qf: &mut [f32],
    vbuf: &mut [f32],
    acc: &mut [f32],
) -> Result<Row> {
    let (q, k, v) = (ctx.src(0), ctx.src(1), ctx.src(2));
    let mask = ctx.node.src[3].as_ref();
    let kt = ctx.kt;
    let unsupported =
        |msg: String| Error::Unsupported { op: "flash_attn_ext", backend: "CPU".into(), msg };
    let vd = k.dtype.vec_dot_type();
    let dot = kt.vec_dot(k.dtype).ok_or_else(|| unsupported(format!("no {} dot", k.dtype)))?;
    let conv = kt.activation_converter(vd).ok_or_else(|| unsupported(format!("no f32 -> {vd}")))?;
    let v_to_f32 = super::get_rows::row_converter(ctx.kt, v.dtype)
        .ok_or_else(|| unsupported(format!("no {} -> f32", v.dtype)))?;
    let iq1 = row % sh.n_q;
    let iq2 = (row / sh.n_q) % sh.n_head;
    let iq3 = row / (sh.n_q * sh.n_head);
    let (ik2, ik3) = (iq2 / (q.ne[2] / k.ne[2]), iq3 / (q.ne[3] / k.ne[3]));
    let slope = super::alibi_slope(p.max_bias, sh.n_head, iq2);
    let scale = if p.logit_softcap != 0.0 { p.scale / p.logit_softcap } else { p.scale };
    // SAFETY: (iq1, iq2, iq3) are below q's shape; q rows are contiguous F32 of dk values.
    let qrow = unsafe { std::slice::from_raw_parts(q.row(iq1, iq2, iq3) as *const f32, sh.dk) };
    conv(qrow, qbuf);
    let krow_bytes = k.dtype.row_bytes(sh.dk);
    let vrow_bytes = v.dtype.row_bytes(sh.dv);
    acc.fill(0.0);
    let (mut m, mut s) = (f32::NEG_INFINITY, 0f32);
    if let Some(kernel) = kt.attend_f16.filter(|_| {
        k.dtype == DType::F16
            && v.dtype == DType::F16
            && sh.dk.is_multiple_of(16)
            && sh.dv.is_multiple_of(16)
    }) {
        // The tier's F16 loop: Q widened from its f16 rounding, the mask converted a block at a
        // time (times the ALiBi slope), positions in fixed blocks from c0.
        (kt.f16_bytes_to_f32)(qbuf, qf);
        let mut mbuf = [0f32; MASK_BLOCK];
        let mut b0 = c0;
        while b0 < c1 {
            let n = (c1 - b0).min(MASK_BLOCK);
            let mvals = match mask {
                Some(mt) => {
                    // SAFETY: iq1 < mask.ne[1] and b0 + n <= n_kv <= mask.ne[0] (build check);
                    // dims 2, 3 reduced modulo the mask's; mask rows are contiguous.
                    let pm = unsafe { mt.row(iq1, iq2 % mt.ne[2], iq3 % mt.ne[3]) };
                    let es = mt.dtype.type_size();
                    // SAFETY: as above, n elements of the row from b0.
                    let raw = unsafe { std::slice::from_raw_parts(pm.add(b0 * es), n * es) };
                    if mt.dtype == DType::F16 {
                        (kt.f16_bytes_to_f32)(raw, &mut mbuf[..n]);
                    } else {
                        for (o, c) in mbuf[..n].iter_mut().zip(raw.chunks_exact(4)) {
                            *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                        }
                    }
                    for x in &mut mbuf[..n] {
                        *x *= slope;
                    }
                    Some(&mbuf[..n])
                }
                None => None,
            };
            let args = crate::kernels::AttendF16 {
                q: qf,
                // SAFETY: b0 < n_kv and (ik2, ik3) index k and v (broadcast checked at build).
                k: unsafe { k.row(b0, ik2, ik3) },
                k_stride: k.nb[1],
                // SAFETY: as for k; v has k's dims 1..3.
                v: unsafe { v.row(b0, ik2, ik3) },
                v_stride: v.nb[1],
                n,
                mask: mvals,
                scale,
                softcap: p.logit_softcap,
            };
            // SAFETY: rows b0 .. b0 + n of k and v exist, each dk / dv F16 values (contiguous
            // rows, build check); acc holds dv floats and qf dk.
            unsafe { kernel(&args, &mut m, &mut s, acc) };
            b0 += n;
        }
        return Ok(Row { m, s });
    }
    for ic in c0..c1 {
        let mv = match mask {
            // SAFETY: iq1 < mask.ne[1], ic < n_kv <= mask.ne[0] (build check); dims 2, 3 reduced
            // modulo the mask's.
            Some(mt) => unsafe {
                let pm = mt.row(iq1, iq2 % mt.ne[2], iq3 % mt.ne[3]);
                let raw = if mt.dtype == DType::F16 {
                    fp16_to_fp32(*(pm as *const u16).add(ic))
                } else {
                    *(pm as *const f32).add(ic)
                };
                slope * raw
            },
            None => 0.0,
        };
        if mv == f32::NEG_INFINITY {
            continue;
        }
        if ic + PREFETCH_ROWS < c1 {
            // SAFETY: ic + PREFETCH_ROWS < c1 <= n_kv, so both rows lie inside k and v.
            unsafe {
                prefetch_l1(k.row(ic + PREFETCH_ROWS, ik2, ik3), krow_bytes);
                prefetch_l1(v.row(ic + PREFETCH_ROWS, ik2, ik3), vrow_bytes);
            }
        }
        // SAFETY: ic < n_kv, (ik2, ik3) below k's dims 2, 3 (broadcast checked at build).
        let krow = unsafe { std::slice::from_raw_parts(k.row(ic, ik2, ik3), krow_bytes) };
        let mut x = dot(sh.dk, krow, qbuf) * scale;
        if p.logit_softcap != 0.0 {
            x = p.logit_softcap * x.tanh();
        }
        x += mv;
        // SAFETY: as for k; v has k's dims 1..3.
        let vrow = unsafe { std::slice::from_raw_parts(v.row(ic, ik2, ik3), vrow_bytes) };
        let (mut ms, mut vs) = (1.0f32, 1.0f32);
        if x > m {
            ms = (m - x).exp();
            m = x;
            for a in acc.iter_mut() {
                *a *= ms;
            }
        } else {
            vs = (x - m).exp();
        }
        if v.dtype == DType::F16 {
            (kt.mad_f16)(acc, vrow, vs);
        } else {
            v_to_f32(vrow, vbuf);
            (kt.mad_f32)(acc, vbuf, vs);
        }
        s = s * ms + vs;
    }
    Ok(Row { m, s })
}

/// Mask values `attend` converts at a time for the tier's F16 kernel.
const MASK_BLOCK: usize = 256;

/// How many KV rows ahead `attend` asks for the K and V rows it will read (a decode step streams
/// K and V from memory; the hardware prefetcher alone leaves the core waiting).
const PREFETCH_ROWS: usize = 16;

/// Folds the sink logit of head `h` into (m, s, acc) as ggml does.
fn add_sink(ctx: &NodeCtx<'_>, h: usize, r: &mut Row, acc: &mut [f32]) {
    add_sink_to(ctx, h, &mut r.m, &mut r.s, acc)
}

/// [`add_sink`] on a bare (max, sum) pair.
fn add_sink_to(ctx: &NodeCtx<'_>, h: usize, m: &mut f32, s: &mut f32, acc: &mut [f32]) {
    if let Some(sk) = ctx.node.src[4].as_ref() {
        // SAFETY: sinks is a contiguous F32 vector of n_head values (build check) and h < n_head.
        let x = unsafe { *(sk.ptr as *const f32).add(h) };
        if x > *m {
            let ms = (*m - x).exp();
            *m = x;
            for a in acc.iter_mut() {
                *a *= ms;
            }
            *s = *s * ms + 1.0;
        } else {
            *s += (x - *m).exp();
        }
    }
}

fn write_out(d: &TView, sh: &Shape, row: usize, acc: &[f32], s: f32) {
    let iq1 = row % sh.n_q;
    let iq2 = (row / sh.n_q) % sh.n_head;
    let iq3 = row / (sh.n_q * sh.n_head);
    let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
    // SAFETY: dst is [dv, n_head, n_q, b] contiguous F32; (iq2, iq1, iq3) are below its dims 1..3;
    // each row is written by exactly one worker.
    unsafe {
        let out = std::slice::from_raw_parts_mut(d.row(iq2, iq1, iq3) as *mut f32, sh.dv);
        for (o, &a) in out.iter_mut().zip(acc) {
            *o = a * inv;
        }
    }
}

pub(crate) fn compute(ctx: &NodeCtx<'_>, phase: u8, ith: usize, p: &FlashAttnParams) -> Result<()> {
    if tiled(ctx.node) {
        let pre = super::flash_attn_tiled::prepack_bytes(ctx.node);
        if pre > 0 && phase == 0 {
            return super::flash_attn_tiled::pack_kv(ctx, ith);
        }
        let sb = align_up(super::flash_attn_tiled::scratch_bytes(ctx.node), 64);
        debug_assert!(pre + (ith + 1) * sb <= ctx.work_len);
        // SAFETY: work_size reserved the prepacked area, then nth areas of `sb` bytes (64-byte
        // aligned, as the work buffer is); this worker uses only area `ith`.
        let scratch = unsafe { ctx.work.add(pre + ith * sb) } as *mut f32;
        return super::flash_attn_tiled::compute(ctx, p, scratch, |h, m, s, acc| {
            add_sink_to(ctx, h, m, s, acc)
        });
    }
    let sh = shape(ctx.node);
    let d = ctx.dst();
    let pf = partial_floats(&sh);
    let partial_bytes = if sh.chunks > 1 { align_up(sh.rows * sh.chunks * pf * 4, 64) } else { 0 };
    let sb = scratch_bytes(ctx.node);
    let kd = ctx.src(1).dtype.vec_dot_type();
    let qb = align_up(kd.row_bytes(sh.dk), 64);
    debug_assert!(partial_bytes + (ith + 1) * sb <= ctx.work_len);
    // SAFETY: the work buffer holds the partials then nth scratch areas of `sb` bytes (work_size);
    // this worker uses only its own scratch area.
    let (qbuf, vbuf, acc, qf) = unsafe {
        let base = ctx.work.add(partial_bytes + ith * sb);
        let vb = align_up(sh.dv * 4, 64);
        (
            std::slice::from_raw_parts_mut(base, kd.row_bytes(sh.dk)),
            std::slice::from_raw_parts_mut(base.add(qb) as *mut f32, sh.dv),
            std::slice::from_raw_parts_mut(base.add(qb + vb) as *mut f32, sh.dv),
            std::slice::from_raw_parts_mut(base.add(qb + 2 * vb) as *mut f32, sh.dk),
        )
    };
    if sh.chunks == 1 {
        loop {
            let row = ctx.counter.fetch_add(1, Ordering::Relaxed);
            if row >= sh.rows {
                return Ok(());
            }
            let mut r = attend(ctx, p, &sh, row, 0, sh.n_kv, qbuf, qf, vbuf, acc)?;
            add_sink(ctx, (row / sh.n_q) % sh.n_head, &mut r, acc);
            write_out(d, &sh, row, acc, r.s);
        }
    }
    let partials = ctx.work as *mut f32;
    if phase == 0 {
        loop {
            let item = ctx.counter.fetch_add(1, Ordering::Relaxed);
            if item >= sh.rows * sh.chunks {
                return Ok(());
            }
            let (row, chunk) = (item / sh.chunks, item % sh.chunks);
            let c0 = chunk * KV_CHUNK;
            let c1 = (c0 + KV_CHUNK).min(sh.n_kv);
            let r = attend(ctx, p, &sh, row, c0, c1, qbuf, qf, vbuf, acc)?;
            // SAFETY: item < rows * chunks, and each partial holds pf floats inside the partials
            // area; each item is taken by exactly one worker.
            unsafe {
                let dst = std::slice::from_raw_parts_mut(partials.add(item * pf), pf);
                dst[0] = r.m;
                dst[1] = r.s;
                dst[2..].copy_from_slice(acc);
            }
        }
    }
    // Phase 1: combine each row's partials in chunk order.
    let (r0, r1) = split(sh.rows, ith, ctx.nth);
    for row in r0..r1 {
        // SAFETY: phase 0 wrote all rows * chunks partials before the barrier; this worker reads
        // its rows' partials only.
        let parts = unsafe {
            std::slice::from_raw_parts(partials.add(row * sh.chunks * pf), sh.chunks * pf)
        };
        let m = parts.chunks_exact(pf).map(|c| c[0]).fold(f32::NEG_INFINITY, f32::max);
        acc.fill(0.0);
        let mut s = 0f32;
        if m != f32::NEG_INFINITY {
            for c in parts.chunks_exact(pf) {
                if c[0] == f32::NEG_INFINITY {
                    continue;
                }
                let w = (c[0] - m).exp();
                s += c[1] * w;
                for (a, &x) in acc.iter_mut().zip(&c[2..]) {
                    *a = x.mul_add(w, *a);
                }
            }
        }
        let mut r = Row { m, s };
        add_sink(ctx, (row / sh.n_q) % sh.n_head, &mut r, acc);
        write_out(d, &sh, row, acc, r.s);
    }
    Ok(())
}
