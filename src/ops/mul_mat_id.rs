//! mul_mat_id: `dst[:, s, t] = as[:, :, ids[s, t]] · b[:, s % n_b, t]` (ggml's
//! ggml_compute_forward_mul_mat_id).
//!
//! Phase 0: every thread converts its share of b's rows into the weights' vec-dot type in the work
//! buffer (once, however many experts read a row), and worker 0 groups the (slot, token) pairs by
//! expert with a counting sort over the ids (checking every id) and lays out the chunk list.
//! Phase 1: chunks (an expert and a tile of its weight rows x its pairs) are handed out through the
//! node's atomic counter. Every output is one full-length dot product by the tier's kernel (or the
//! register-tile kernel, bitwise the same), so results do not depend on the thread count.

use super::{NodeCtx, split};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::{GEMM_MR, GEMM_NR};
use crate::plan::{ExecNode, align_up};
use std::sync::atomic::Ordering;

/// Weight rows per chunk when an expert has two or more pairs, and pairs per chunk.
const TILE: usize = 16;
/// Weight rows per chunk when an expert has a single pair (decode): nothing to share between
/// columns, so bigger chunks cut the counter traffic.
const TILE_ONE: usize = 64;

/// Byte offsets of the work buffer's parts.
struct Layout {
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
    /// `n_as + 1` pair offsets (usize) into `pairs`.
    offsets: usize,
    /// `n_used * n_tokens` (slot, token) pairs (two u32), grouped by expert.
    pairs: usize,
    end: usize,
}

fn layout(node: &ExecNode, nth: usize) -> Option<Layout> {
    let (a, b, ids) = (node.src[0].as_ref()?, node.src[1].as_ref()?, node.src[2].as_ref()?);
    let vd = a.dtype.vec_dot_type();
    let conv = b.dtype != vd;
    let k = b.ne[0];
    let rb = align_up(vd.row_bytes(k), 64);
    let mut off = 0;
    let scratch = if conv {
        off += b.ne[1] * b.ne[2] * rb;
        off
    } else {
        0
    };
    let scratch_stride = align_up(k * 4, 64);
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
    off = align_up(off + ids.ne[0] * ids.ne[1] * 8, 64);
    Some(Layout { conv, rb, scratch, scratch_stride, counts, starts, offsets, pairs, end: off })
}

pub(crate) fn phases(_node: &ExecNode) -> u8 {
    2
}

pub(crate) fn work_size(node: &ExecNode, nth: usize) -> usize {
    layout(node, nth).map_or(0, |l| l.end)
}

fn unsupported(msg: String) -> Error {
    Error::Unsupported { op: "mul_mat_id", backend: "CPU".into(), msg }
}

/// Weight rows per chunk for an expert with `count` pairs.
fn row_tile(count: usize) -> usize {
    if count == 1 { TILE_ONE } else { TILE }
}

fn chunks_of(m: usize, count: usize) -> usize {
    if count == 0 { 0 } else { m.div_ceil(row_tile(count)) * count.div_ceil(TILE) }
}

fn convert(ctx: &NodeCtx<'_>, l: &Layout, ith: usize) -> Result<()> {
    let (a, b) = (ctx.src(0), ctx.src(1));
    let vd = a.dtype.vec_dot_type();
    let from = crate::kernels::table()
        .activation_converter(vd)
        .ok_or_else(|| unsupported(format!("no f32 -> {vd} conversion")))?;
    debug_assert_eq!(b.dtype, DType::F32);
    let k = b.ne[0];
    let nrows = b.ne[1] * b.ne[2];
    let (r0, r1) = split(nrows, ith, ctx.nth);
    for r in r0..r1 {
        let (i1, i2) = (r % b.ne[1], r / b.ne[1]);
        // SAFETY: i1 < b.ne[1], i2 < b.ne[2] (b.ne[3] == 1); b's rows hold k contiguous f32
        // (build check). The work buffer holds nrows converted rows of `rb` bytes, then one
        // staging row per thread (layout); this worker writes only its rows and its own staging.
        unsafe {
            let pb = b.row(i1, i2, 0);
            let out = std::slice::from_raw_parts_mut(ctx.work.add(r * l.rb), vd.row_bytes(k));
            if (pb as usize) % std::mem::align_of::<f32>() == 0 {
                from(std::slice::from_raw_parts(pb as *const f32, k), out);
            } else {
                let s = ctx.work.add(l.scratch + ith * l.scratch_stride) as *mut f32;
                std::ptr::copy_nonoverlapping(pb, s as *mut u8, k * 4);
                from(std::slice::from_raw_parts(s, k), out);
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
        starts[e + 1] = starts[e] + chunks_of(m, counts[e]);
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
    let l = layout(ctx.node, ctx.nth).ok_or_else(|| unsupported("missing source".into()))?;
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
    let (a, b, ids, d) = (ctx.src(0), ctx.src(1), ctx.src(2), ctx.dst());
    let table = crate::kernels::table();
    let dot = table.vec_dot(a.dtype).ok_or_else(|| unsupported(format!("no {} dot", a.dtype)))?;
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
    let total = starts[n_as];
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
    let dst_at = |i: usize, p: [u32; 2]| -> *mut f32 {
        // SAFETY: i < m = dst.ne[0], (slot, token) below dst's dims 1 and 2; dst is contiguous.
        unsafe {
            d.ptr.add(i * d.nb[0] + p[0] as usize * d.nb[1] + p[1] as usize * d.nb[2]) as *mut f32
        }
    };
    loop {
        let c = ctx.counter.fetch_add(1, Ordering::Relaxed);
        if c >= total {
            break;
        }
        // The expert owning chunk c: the last e with starts[e] <= c (experts without pairs own
        // no chunks, so their start equals the next one's).
        let e = starts.partition_point(|&s| s <= c) - 1;
        let group = &pairs[offsets[e]..offsets[e + 1]];
        let rt = row_tile(group.len());
        let tiles_m = m.div_ceil(rt);
        let local = c - starts[e];
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
                                // SAFETY: the element (i + r, pair p) belongs to this chunk, which
                                // only this worker took; each pair appears once in `pairs`.
                                unsafe { *dst_at(i + r, p) = out[c * nr + r] };
                            }
                        }
                        i += nr;
                    }
                }
            }
            _ => {
                for &p in cols {
                    let y = b_row(p);
                    for i in i0..i1 {
                        // SAFETY: as above: this chunk's element, written by this worker only.
                        unsafe { *dst_at(i, p) = dot(k, a_row(i), y) };
                    }
                }
            }
        }
    }
    Ok(())
}

/// What `supports` checks: the weights need a dot-product kernel and, for F32 activations, a
/// converter into their vec-dot type.
pub(crate) fn check_kernels(a: DType, b: DType) -> std::result::Result<(), String> {
    let kt = crate::kernels::table();
    let vd = a.vec_dot_type();
    if kt.vec_dot(a).is_none() || (b != vd && kt.activation_converter(vd).is_none()) {
        return Err(format!("no {a} x {vd} dot product kernel"));
    }
    Ok(())
}
