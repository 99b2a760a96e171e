//! gated_delta_net and solve_tri on F32 (ggml's ggml_compute_forward_gated_delta_net_f32 and
//! _solve_tri_f32).
//!
//! gated_delta_net hands out (head, sequence) pairs through the chunk counter; each pair's
//! recurrence runs entirely on one worker, in place in output slot 0 (which ends up holding the
//! final state, as in ggml), with older snapshots copied out per token. solve_tri splits the
//! right-hand-side columns between workers. Neither result depends on the thread count.

use super::{NodeCtx, split};
use crate::error::Result;
use crate::ops::node::{ExecNode, align_up};
use std::sync::atomic::Ordering;

/// Per-worker scratch of gated_delta_net: the `delta` vector of S floats, cache-line padded.
fn gdn_scratch_bytes(node: &ExecNode) -> usize {
    align_up(node.src[2].as_ref().map_or(0, |v| v.ne[0]) * 4, 64)
}

pub(crate) fn gdn_work_size(node: &ExecNode, nth: usize) -> usize {
    gdn_scratch_bytes(node) * nth
}

pub(crate) fn gated_delta_net(ctx: &NodeCtx<'_>, ith: usize, k_slots: usize) -> Result<()> {
    let (q, k, v, g, beta, st, d) =
        (ctx.src(0), ctx.src(1), ctx.src(2), ctx.src(3), ctx.src(4), ctx.src(5), ctx.dst());
    let kt = ctx.kt;
    let [sv, h, nt, ns] = v.ne;
    let kda = g.ne[0] == sv && sv != 1;
    let (rq3, rk3) = (ns / q.ne[3], ns / k.ne[3]);
    let scale = 1.0 / (sv as f32).sqrt();
    let attn_elems = sv * h * nt * ns;
    let snap = sv * sv * h * ns;
    let head_state = sv * sv;
    let out = d.ptr as *mut f32;
    let sb = gdn_scratch_bytes(ctx.node);
    debug_assert!((ith + 1) * sb <= ctx.work_len);
    // SAFETY: the work buffer holds nth scratch areas of sb >= S floats (gdn_work_size); this
    // worker uses only its own.
    let delta = unsafe { std::slice::from_raw_parts_mut(ctx.work.add(ith * sb) as *mut f32, sv) };
    loop {
        let ir = ctx.counter.fetch_add(1, Ordering::Relaxed);
        if ir >= h * ns {
            break;
        }
        let (iv1, iv3) = (ir % h, ir / h);
        let (iq1, ik1) = (iv1 % q.ne[1], iv1 % k.ne[1]);
        let (iq3, ik3) = (iv3 / rq3, iv3 / rk3);
        let pair = (iv3 * h + iv1) * head_state;
        // SAFETY: slot 0 of the state part of the output, pair (iv1, iv3): taken by exactly one
        // worker through the counter.
        let s = unsafe { std::slice::from_raw_parts_mut(out.add(attn_elems + pair), head_state) };
        // The input state is contiguous [S, S, H, n_seqs].
        s.copy_from_slice(&st.as_slice::<f32>()[pair..][..head_state]);
        for t in 0..nt {
            // SAFETY: indices below each tensor's dims (build-time checks incl. the head and
            // sequence broadcasts); rows of q, k, v are packed; g and beta contiguous.
            let (qd, kd, vd, gd, bv) = unsafe {
                (
                    std::slice::from_raw_parts(
                        q.ptr.add(iq3 * q.nb[3] + t * q.nb[2] + iq1 * q.nb[1]) as *const f32,
                        sv,
                    ),
                    std::slice::from_raw_parts(
                        k.ptr.add(ik3 * k.nb[3] + t * k.nb[2] + ik1 * k.nb[1]) as *const f32,
                        sv,
                    ),
                    std::slice::from_raw_parts(
                        v.ptr.add(iv3 * v.nb[3] + t * v.nb[2] + iv1 * v.nb[1]) as *const f32,
                        sv,
                    ),
                    std::slice::from_raw_parts(
                        g.ptr.add(iv3 * g.nb[3] + t * g.nb[2] + iv1 * g.nb[1]) as *const f32,
                        g.ne[0],
                    ),
                    *(beta.ptr.add(iv3 * beta.nb[3] + t * beta.nb[2] + iv1 * beta.nb[1])
                        as *const f32),
                )
            };
            // s[j * S + i] = S[i][j]: row j of s is column j of S.
            if kda {
                for i in 0..sv {
                    delta[i] = gd[i].exp();
                }
                for row in s.chunks_exact_mut(sv) {
                    for (x, &e) in row.iter_mut().zip(delta.iter()) {
                        *x *= e;
                    }
                }
            } else {
                let e = gd[0].exp();
                for x in s.iter_mut() {
                    *x *= e;
                }
            }
            for (j, row) in s.chunks_exact(sv).enumerate() {
                delta[j] = (vd[j] - (kt.dot_f32)(row, kd)) * bv;
            }
            for (j, row) in s.chunks_exact_mut(sv).enumerate() {
                (kt.mad_f32)(row, kd, delta[j]);
            }
            // SAFETY: the output row of token t for pair (iv1, iv3) is this worker's.
            let attn = unsafe {
                std::slice::from_raw_parts_mut(out.add(((iv3 * nt + t) * h + iv1) * sv), sv)
            };
            for (j, row) in s.chunks_exact(sv).enumerate() {
                attn[j] = (kt.dot_f32)(row, qd) * scale;
            }
            let slot = nt - 1 - t;
            if k_slots > 1 && slot > 0 && slot < k_slots {
                // SAFETY: slot < k_slots: inside the output; this pair's part is this worker's.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        s.as_ptr(),
                        out.add(attn_elems + slot * snap + pair),
                        head_state,
                    );
                }
            }
        }
        // Slots older than the token count: ggml leaves them unwritten; zero them instead.
        for slot in nt.max(1)..k_slots {
            // SAFETY: as for the snapshots above.
            unsafe {
                std::ptr::write_bytes(out.add(attn_elems + slot * snap + pair), 0, head_state);
            }
        }
    }
    Ok(())
}

pub(crate) fn solve_tri(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (a, b, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    let n = a.ne[0];
    let kc = b.ne[0];
    let (p, q) = (b.ne[2], b.ne[3]);
    let nr = p * q * kc;
    let (r0, r1) = split(nr, ith, ctx.nth);
    for ir in r0..r1 {
        let i3 = ir / (p * kc);
        let i2 = (ir / kc) % p;
        let col = ir % kc;
        // SAFETY: a, b and dst are contiguous with the batch (i2, i3) in range; column `col` of
        // this batch's X is this worker's; every read of X is of an element this worker wrote.
        unsafe {
            let am = a.ptr.add(i2 * a.nb[2] + i3 * a.nb[3]) as *const f32;
            let bm = b.ptr.add(i2 * b.nb[2] + i3 * b.nb[3]) as *const f32;
            let xm = d.ptr.add(i2 * d.nb[2] + i3 * d.nb[3]) as *mut f32;
            for row in 0..n {
                let mut sum = 0f32;
                for t in 0..row {
                    sum += *am.add(row * n + t) * *xm.add(t * kc + col);
                }
                let diag = *am.add(row * n + row);
                *xm.add(row * kc + col) = (*bm.add(row * kc + col) - sum) / diag;
            }
        }
    }
    Ok(())
}
