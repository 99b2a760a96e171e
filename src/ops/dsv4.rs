//! DeepSeek ops on F32: the V4 hyper-connection ops dsv4_hc_comb / _pre / _post and the sparse
//! attention lightning_indexer (ggml's ggml_compute_forward_dsv4_hc_* and
//! _lightning_indexer). Work is split by output rows/elements; every output element is computed
//! by one worker in a fixed order.

use super::{NodeCtx, split};
use crate::error::{Error, Result};
use crate::ops::node::{ExecNode, TView, align_up};

const HC: usize = 4;

/// Reads the f32 at element (i0, i1, i2) of `t` (any strides).
///
/// # Safety
/// The indices are below `t.ne`.
#[inline(always)]
unsafe fn at(t: &TView, i0: usize, i1: usize, i2: usize) -> f32 {
    // SAFETY: per the contract the element lies inside the tensor the plan resolved.
    unsafe { *(t.ptr.add(i0 * t.nb[0] + i1 * t.nb[1] + i2 * t.nb[2]) as *const f32) }
}

/// `comb[d + HC*s]`: normalise over `s` for every `d` (ggml's norm_cols).
fn norm_cols(comb: &mut [f32; HC * HC], eps: f32) {
    for d in 0..HC {
        let mut sum = eps;
        for s in 0..HC {
            sum += comb[d + HC * s];
        }
        let inv = 1.0 / sum;
        for s in 0..HC {
            comb[d + HC * s] *= inv;
        }
    }
}

/// Normalise over `d` for every `s` (ggml's norm_rows).
fn norm_rows(comb: &mut [f32; HC * HC], eps: f32) {
    for s in 0..HC {
        let mut sum = eps;
        for d in 0..HC {
            sum += comb[d + HC * s];
        }
        let inv = 1.0 / sum;
        for d in 0..HC {
            comb[d + HC * s] *= inv;
        }
    }
}

pub(crate) fn hc_comb(ctx: &NodeCtx<'_>, ith: usize, eps: f32, n_iter: u32) -> Result<()> {
    let (mixes, scale, base, dst) = (ctx.src(0), ctx.src(1), ctx.src(2), ctx.dst());
    let nt = mixes.ne[1];
    let (t0, t1) = split(nt, ith, ctx.nth);
    // SAFETY: scale has ne[0] >= 3 (build-time check).
    let scale_comb = unsafe { at(scale, 2, 0, 0) };
    for it in t0..t1 {
        let mut comb = [0f32; HC * HC];
        for s in 0..HC {
            let mut max = f32::NEG_INFINITY;
            for d in 0..HC {
                let idx = d + HC * s;
                // SAFETY: 2*HC + idx < (2 + HC) * HC = mixes.ne[0] = base.ne[0]; it < n_tokens.
                let v = unsafe {
                    at(mixes, 2 * HC + idx, it, 0) * scale_comb + at(base, 2 * HC + idx, 0, 0)
                };
                comb[idx] = v;
                max = max.max(v);
            }
            let mut sum = 0f32;
            for d in 0..HC {
                let e = (comb[d + HC * s] - max).exp();
                comb[d + HC * s] = e;
                sum += e;
            }
            let inv = 1.0 / sum;
            for d in 0..HC {
                comb[d + HC * s] = comb[d + HC * s] * inv + eps;
            }
        }
        norm_cols(&mut comb, eps);
        for _ in 1..n_iter {
            norm_rows(&mut comb, eps);
            norm_cols(&mut comb, eps);
        }
        for s in 0..HC {
            for d in 0..HC {
                // SAFETY: dst is [HC, HC, n_tokens]; token `it` is this worker's.
                unsafe {
                    *(dst.ptr.add(d * dst.nb[0] + s * dst.nb[1] + it * dst.nb[2]) as *mut f32) =
                        comb[d + HC * s];
                }
            }
        }
    }
    Ok(())
}

pub(crate) fn hc_pre(ctx: &NodeCtx<'_>, ith: usize, scale: f32, gated: bool) -> Result<()> {
    let (x, w, dst) = (ctx.src(0), ctx.src(1), ctx.dst());
    let (n_embd, hc, nt) = (x.ne[0], x.ne[1], x.ne[2]);
    let (r0, r1) = split(n_embd * nt, ith, ctx.nth);
    for ir in r0..r1 {
        let (i0, it) = (ir % n_embd, ir / n_embd);
        let mut sum = 0f32;
        for ih in 0..hc {
            // SAFETY: i0 < n_embd, ih < hc, it < n_tokens: inside x, and inside the weights
            // ([hc, n_tokens]) or the gate ([n_embd, hc, n_tokens]) the builder checked.
            let (xv, wv) = unsafe {
                if gated {
                    (at(x, i0, ih, it), 1.0 / (1.0 + (-at(w, i0, ih, it)).exp()))
                } else {
                    (at(x, i0, ih, it), at(w, ih, it, 0))
                }
            };
            sum += xv * wv;
        }
        // SAFETY: dst element (i0, it) is this worker's.
        unsafe { *(dst.ptr.add(i0 * dst.nb[0] + it * dst.nb[1]) as *mut f32) = scale * sum };
    }
    Ok(())
}

pub(crate) fn hc_post(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (x, res, post, dst) = (ctx.src(0), ctx.src(1), ctx.src(2), ctx.dst());
    let comb = ctx.node.src[3].as_ref();
    let (n_embd, nt, hc) = (x.ne[0], x.ne[1], res.ne[1]);
    let (r0, r1) = split(n_embd * hc * nt, ith, ctx.nth);
    for ir in r0..r1 {
        let i0 = ir % n_embd;
        let d = (ir / n_embd) % hc;
        let it = ir / (n_embd * hc);
        // SAFETY: all indices are below the shapes the builder checked (comb, when present, is
        // [hc, hc, n_tokens]).
        unsafe {
            let mut sum = at(x, i0, it, 0) * at(post, d, it, 0);
            match comb {
                Some(comb) => {
                    for s in 0..hc {
                        sum += at(res, i0, s, it) * at(comb, d, s, it);
                    }
                }
                None => sum += at(res, i0, d, it),
            }
            *(dst.ptr.add(i0 * dst.nb[0] + d * dst.nb[1] + it * dst.nb[2]) as *mut f32) = sum;
        }
    }
    Ok(())
}

/// Per-worker scratch of lightning_indexer: one k row converted to f32, cache-line padded.
fn li_scratch_bytes(node: &ExecNode) -> usize {
    align_up(node.src[1].as_ref().map_or(0, |k| k.ne[0]) * 4, 64)
}

pub(crate) fn li_work_size(node: &ExecNode, nth: usize) -> usize {
    li_scratch_bytes(node) * nth
}

pub(crate) fn lightning_indexer(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (q, k, w, m, dst) = (ctx.src(0), ctx.src(1), ctx.src(2), ctx.src(3), ctx.dst());
    let kt = ctx.kt;
    let (n_embd, n_head, n_tok, n_stream) = (q.ne[0], q.ne[1], q.ne[2], q.ne[3]);
    let n_kv = k.ne[2];
    let conv = match k.dtype {
        crate::dtype::DType::F32 => None,
        dt => {
            Some(super::get_rows::row_converter(ctx.kt, dt).ok_or_else(|| Error::Unsupported {
                op: "lightning_indexer",
                backend: "CPU".into(),
                msg: format!("no f32 conversion for {dt}"),
            })?)
        }
    };
    let row_bytes = k.dtype.row_bytes(n_embd);
    let sb = li_scratch_bytes(ctx.node);
    debug_assert!((ith + 1) * sb <= ctx.work_len);
    // SAFETY: the work buffer holds nth scratch areas of sb >= n_embd floats; this one is ours.
    let scratch =
        unsafe { std::slice::from_raw_parts_mut(ctx.work.add(ith * sb) as *mut f32, n_embd) };
    let (r0, r1) = split(n_kv, ith, ctx.nth);
    for s in 0..n_stream {
        for t in 0..n_tok {
            for ik in r0..r1 {
                // SAFETY: rows of k are packed row_bytes long; ik < n_kv, s < ne3.
                let kb = unsafe {
                    std::slice::from_raw_parts(k.ptr.add(ik * k.nb[2] + s * k.nb[3]), row_bytes)
                };
                let krow: &[f32] = match conv {
                    Some(f) => {
                        f(kb, scratch);
                        scratch
                    }
                    // SAFETY: F32 rows are packed and 4-byte aligned in plan memory.
                    None => unsafe {
                        std::slice::from_raw_parts(kb.as_ptr() as *const f32, n_embd)
                    },
                };
                let mut score = 0f32;
                for hh in 0..n_head {
                    // SAFETY: (hh, t, s) below q's dims; q rows packed.
                    let qrow = unsafe {
                        std::slice::from_raw_parts(
                            q.ptr.add(hh * q.nb[1] + t * q.nb[2] + s * q.nb[3]) as *const f32,
                            n_embd,
                        )
                    };
                    let qk = (kt.dot_f32)(qrow, krow);
                    // SAFETY: weights is [n_head, n_tok, 1, ne3].
                    let wv = unsafe {
                        *(w.ptr.add(hh * w.nb[0] + t * w.nb[1] + s * w.nb[3]) as *const f32)
                    };
                    score += qk.max(0.0) * wv;
                }
                // SAFETY: mask is [n_kv, n_tok, 1, ne33] F16 with s % ne33 in range; dst element
                // (ik, t, s) is this worker's (kv split).
                unsafe {
                    let mb = *(m.ptr.add(ik * m.nb[0] + t * m.nb[1] + (s % m.ne[3]) * m.nb[3])
                        as *const u16);
                    let mv = half::f16::from_bits(mb).to_f32();
                    *(dst.ptr.add(ik * dst.nb[0] + t * dst.nb[1] + s * dst.nb[3]) as *mut f32) =
                        score + mv;
                }
            }
        }
    }
    Ok(())
}
