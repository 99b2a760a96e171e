//! ssm_conv and ssm_scan on F32 (ggml's ggml_compute_forward_ssm_conv_f32 / _ssm_scan_f32).
//! ssm_conv splits the d_inner rows between workers; ssm_scan splits the heads, each worker
//! running every token of every sequence for its heads (a head's recurrence is independent of
//! the others), so results do not depend on the thread count.

use super::{NodeCtx, split};
use crate::error::{Error, Result};

pub(crate) fn ssm_conv(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (sx, c, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    let nc = c.ne[0];
    let (n_inner, n_t, n_s) = (d.ne[0], d.ne[1], d.ne[2]);
    let (r0, r1) = split(n_inner, ith, ctx.nth);
    for i3 in 0..n_s {
        for i2 in 0..n_t {
            for i1 in r0..r1 {
                // SAFETY: i1 < d_inner = sx.ne[1] = c.ne[1], i3 < sx.ne[2]; the window
                // i2..i2 + nc lies inside the packed sx row of ne[0] = n_t + nc - 1 floats; c is
                // contiguous; dst element (i1, i2, i3) is this worker's (rows split by i1).
                unsafe {
                    let s = sx.ptr.add(i1 * sx.nb[1] + i3 * sx.nb[2]) as *const f32;
                    let w = c.ptr.add(i1 * c.nb[1]) as *const f32;
                    let mut sum = 0f32;
                    for i0 in 0..nc {
                        sum += *s.add(i2 + i0) * *w.add(i0);
                    }
                    *(d.ptr.add(i1 * d.nb[0] + i2 * d.nb[1] + i3 * d.nb[2]) as *mut f32) = sum;
                }
            }
        }
    }
    Ok(())
}

/// ggml's softplus: log(1 + exp(x)), passed through above 20.
#[inline]
pub(crate) fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { (1.0 + x.exp()).ln() }
}

pub(crate) fn ssm_scan(ctx: &NodeCtx<'_>, ith: usize, k_slots: usize) -> Result<()> {
    let (s0, x, dt, a, b, c, ids, d) = (
        ctx.src(0),
        ctx.src(1),
        ctx.src(2),
        ctx.src(3),
        ctx.src(4),
        ctx.src(5),
        ctx.src(6),
        ctx.dst(),
    );
    let rk = &ctx.kt.recurrent;
    let nc = s0.ne[0]; // d_state
    let nr = s0.ne[1]; // head_dim
    let nh = x.ne[1];
    let ng = b.ne[1];
    let nt = x.ne[2];
    let ns = x.ne[3];
    let s_off = x.nelements(); // in floats
    let seq_state = nc * nr * nh; // floats per sequence state (s is contiguous)
    let head_state = nc * nr;
    let mamba2 = a.ne[0] == 1;
    let (h0, h1) = split(nh, ith, ctx.nth);
    let out = d.ptr as *mut f32;
    for i3 in 0..ns {
        // SAFETY: i3 < ids.ne[0]; ids is a packed I32 vector (build-time check).
        let id = unsafe { *(ids.ptr as *const i32).add(i3) };
        if id < 0 || id as usize >= s0.ne[3] {
            return Err(Error::IndexOutOfRange {
                op: "ssm_scan",
                tensor: ctx.node.label(),
                index: id as i64,
                limit: s0.ne[3],
            });
        }
        // SAFETY: the output holds y (s_off floats) then k_slots * ns sequence states; this
        // worker only touches heads h0..h1 of them.
        let s_base = unsafe { out.add(s_off + i3 * seq_state) };
        if h1 > h0 {
            // The recurrence runs in place in the output state: start from the chosen s0 row.
            // SAFETY: s0 is contiguous with ne[3] > id sequences; the ranges are heads h0..h1.
            unsafe {
                let src = (s0.ptr as *const f32).add(id as usize * seq_state + h0 * head_state);
                std::ptr::copy_nonoverlapping(
                    src,
                    s_base.add(h0 * head_state),
                    (h1 - h0) * head_state,
                );
            }
        }
        for i2 in 0..nt {
            // SAFETY: (i2, i3) below x's, dt's, B's and C's dims 2 and 3; their dims 0 and 1 are
            // packed (build-time check), so the slices below stay inside each tensor.
            let (xs, dts, bs, cs) = unsafe {
                (
                    std::slice::from_raw_parts(
                        x.ptr.add(i2 * x.nb[2] + i3 * x.nb[3]) as *const f32,
                        nr * nh,
                    ),
                    std::slice::from_raw_parts(
                        dt.ptr.add(i2 * dt.nb[1] + i3 * dt.nb[2]) as *const f32,
                        nh,
                    ),
                    std::slice::from_raw_parts(
                        b.ptr.add(i2 * b.nb[2] + i3 * b.nb[3]) as *const f32,
                        nc * ng,
                    ),
                    std::slice::from_raw_parts(
                        c.ptr.add(i2 * c.nb[2] + i3 * c.nb[3]) as *const f32,
                        nc * ng,
                    ),
                )
            };
            // A is contiguous [1 or d_state, n_head].
            let av = &a.as_slice::<f32>()[..a.ne[0] * nh];
            // SAFETY: y for (i2, i3) is nr * nh floats inside the output's first s_off floats.
            let y = unsafe { out.add((i3 * nt + i2) * nh * nr) };
            for h in h0..h1 {
                let dt_sp = softplus(dts[h]);
                let g = h / (nh / ng);
                let (bg, cg) = (&bs[g * nc..(g + 1) * nc], &cs[g * nc..(g + 1) * nc]);
                // SAFETY: head h of sequence i3's output state is this worker's (heads split).
                let st = unsafe {
                    std::slice::from_raw_parts_mut(s_base.add(h * head_state), head_state)
                };
                if mamba2 {
                    let da = (dt_sp * av[h]).exp();
                    for i1 in 0..nr {
                        let ii = i1 + h * nr;
                        let x_dt = xs[ii] * dt_sp;
                        let sum =
                            (rk.ssm_scan_row)(&mut st[i1 * nc..(i1 + 1) * nc], bg, cg, da, x_dt);
                        // SAFETY: ii < nr * nh; y element (ii) of this token is this worker's.
                        unsafe { *y.add(ii) = sum };
                    }
                } else {
                    let ah = &av[h * nc..(h + 1) * nc];
                    for i1 in 0..nr {
                        let ii = i1 + h * nr;
                        let x_dt = xs[ii] * dt_sp;
                        let row = &mut st[i1 * nc..(i1 + 1) * nc];
                        let mut sum = 0f32;
                        for i0 in 0..nc {
                            let v = row[i0] * (dt_sp * ah[i0]).exp() + bg[i0] * x_dt;
                            sum += v * cg[i0];
                            row[i0] = v;
                        }
                        // SAFETY: as above.
                        unsafe { *y.add(ii) = sum };
                    }
                }
            }
            let slot = nt - 1 - i2;
            if k_slots > 1 && slot > 0 && slot < k_slots && h1 > h0 {
                // SAFETY: slot < k_slots, so the snapshot lies inside the output; heads h0..h1
                // of it are this worker's; it does not overlap the live state (slot > 0).
                unsafe {
                    let snap = out.add(s_off + (slot * ns + i3) * seq_state);
                    std::ptr::copy_nonoverlapping(
                        s_base.add(h0 * head_state),
                        snap.add(h0 * head_state),
                        (h1 - h0) * head_state,
                    );
                }
            }
        }
        // Slots older than the token count are never written by ggml; zero them so the output
        // never shows stale memory.
        for slot in nt.max(1)..k_slots {
            // SAFETY: as for the snapshots above.
            unsafe {
                let snap = out.add(s_off + (slot * ns + i3) * seq_state);
                std::ptr::write_bytes(snap.add(h0 * head_state), 0, (h1 - h0) * head_state);
            }
        }
    }
    Ok(())
}
