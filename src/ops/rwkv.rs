//! The RWKV-6, gated-linear-attention and RWKV-7 recurrences on F32 (ggml's
//! ggml_compute_forward_rwkv_wkv6_f32 / _gla_f32 / _rwkv_wkv7_f32). Heads are split between
//! workers; a worker runs every token for its heads. The output is [S*H, T + S*n_seqs]: the
//! per-token outputs, then the final state of every sequence, [S, S, H] each. The state is updated
//! in place in the output (copied from the input state at each sequence's first token), which
//! computes exactly what ggml's separate previous/current pointers do.

use super::{NodeCtx, split};
use crate::error::Result;

/// Runs `token(state_of_head, y_of_token_and_head, t, h)` for every token of every sequence over
/// this worker's heads, with the state initialised from source `state_src`.
fn drive(
    ctx: &NodeCtx<'_>,
    ith: usize,
    state_src: usize,
    mut token: impl FnMut(&mut [f32], &mut [f32], usize, usize),
) -> Result<()> {
    let (v, st, d) = (ctx.src(1), ctx.src(state_src), ctx.dst());
    let (s, h, t, n_seqs) = (v.ne[0], v.ne[1], v.ne[2], st.ne[1]);
    let c = s * h;
    let per_seq = t / n_seqs;
    let head_state = s * s;
    let (h0, h1) = split(h, ith, ctx.nth);
    if h0 >= h1 {
        return Ok(());
    }
    let out = d.ptr as *mut f32;
    let sin = st.ptr as *const f32;
    for seq in 0..n_seqs {
        // SAFETY: the output holds T*C outputs then n_seqs states of S*S*H floats; the input state
        // holds the same n_seqs states (build-time check); heads h0..h1 are this worker's.
        unsafe {
            let base = seq * head_state * h + h0 * head_state;
            std::ptr::copy_nonoverlapping(
                sin.add(base),
                out.add(c * t + base),
                (h1 - h0) * head_state,
            );
        }
        for tt in seq * per_seq..(seq + 1) * per_seq {
            for hh in h0..h1 {
                // SAFETY: token tt < T, head hh of this worker: the y slice [tt][hh] and the state
                // [seq][hh] are disjoint parts of the output no other worker touches.
                let (state, y) = unsafe {
                    (
                        std::slice::from_raw_parts_mut(
                            out.add(c * t + (seq * h + hh) * head_state),
                            head_state,
                        ),
                        std::slice::from_raw_parts_mut(out.add(tt * c + hh * s), s),
                    )
                };
                token(state, y, tt, hh);
            }
        }
    }
    Ok(())
}

/// A contiguous [S, H, T] F32 source as a slice.
fn tokens<'a>(ctx: &'a NodeCtx<'_>, i: usize) -> &'a [f32] {
    // The builder checked this source is contiguous F32 with ne = [S, H, T, 1].
    ctx.src(i).as_slice::<f32>()
}

pub(crate) fn wkv6(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let rk = &ctx.kt.recurrent;
    let (k, v, r, tf, td) =
        (tokens(ctx, 0), tokens(ctx, 1), tokens(ctx, 2), tokens(ctx, 3), tokens(ctx, 4));
    let (s, h) = (ctx.src(1).ne[0], ctx.src(1).ne[1]);
    drive(ctx, ith, 5, |state, y, t, hh| {
        y.fill(0.0);
        let o = t * s * h + hh * s;
        let vv = &v[o..o + s];
        // Four rows at a time (y and v loaded once), the same order as one row at a time.
        let at = |x: &[f32], b: usize| [x[b], x[b + 1], x[b + 2], x[b + 3]];
        let mut i = 0;
        while i + 4 <= s {
            (rk.wkv6_rows4)(
                &mut state[i * s..(i + 4) * s],
                y,
                vv,
                at(k, o + i),
                at(r, o + i),
                at(tf, hh * s + i),
                at(td, o + i),
            );
            i += 4;
        }
        for i in i..s {
            (rk.wkv6_row)(
                &mut state[i * s..(i + 1) * s],
                y,
                vv,
                k[o + i],
                r[o + i],
                tf[hh * s + i],
                td[o + i],
            );
        }
    })
}

pub(crate) fn gla(ctx: &NodeCtx<'_>, ith: usize, scale: f32) -> Result<()> {
    let rk = &ctx.kt.recurrent;
    let (k, v, q, g) = (tokens(ctx, 0), tokens(ctx, 1), tokens(ctx, 2), tokens(ctx, 3));
    let (s, h) = (ctx.src(1).ne[0], ctx.src(1).ne[1]);
    drive(ctx, ith, 4, |state, y, t, hh| {
        y.fill(0.0);
        let o = t * s * h + hh * s;
        let vv = &v[o..o + s];
        for i in 0..s {
            (rk.gla_row)(
                &mut state[i * s..(i + 1) * s],
                y,
                vv,
                k[o + i],
                q[o + i] * scale,
                g[o + i],
            );
        }
    })
}

pub(crate) fn wkv7(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let rk = &ctx.kt.recurrent;
    let (r, w, k, v, a, b) = (
        tokens(ctx, 0),
        tokens(ctx, 1),
        tokens(ctx, 2),
        tokens(ctx, 3),
        tokens(ctx, 4),
        tokens(ctx, 5),
    );
    let (s, h) = (ctx.src(1).ne[0], ctx.src(1).ne[1]);
    drive(ctx, ith, 6, |state, y, t, hh| {
        let o = t * s * h + hh * s;
        let rows = [&r[o..o + s], &w[o..o + s], &k[o..o + s], &a[o..o + s], &b[o..o + s]];
        for i in 0..s {
            y[i] = (rk.wkv7_row)(&mut state[i * s..(i + 1) * s], rows, v[o + i]);
        }
    })
}
