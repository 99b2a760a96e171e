//! ggml's dedicated backward ops on the CPU: silu_back, rms_norm_back, soft_max_back,
//! get_rows_back, im2col_back, pool_2d_back and flash_attn_back (rope_back lives in rope.rs,
//! sharing the forward's cos/sin cache). Every output element is produced by one worker in a
//! fixed order, so results do not depend on the thread count.

use super::{NodeCtx, split};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::{Im2colBackParams, Pool2dParams, PoolOp};
use crate::ops::node::{ExecNode, align_up};
use crate::quant::util::{fp16_to_fp32, fp32_to_fp16};

#[inline(always)]
fn silu_grad(x: f32, dy: f32) -> f32 {
    let s = 1.0 / (1.0 + (-x).exp());
    dy * s * (1.0 + x * (1.0 - s))
}

pub(crate) fn silu_back(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (g, x, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    let kt = ctx.kt;
    let nc = d.ne[0];
    let mut rows = ctx.dst_rows(ith);
    for r in rows.range() {
        // Same shapes, contiguous rows (build check); dst is a fresh node.
        let (i1, i2, i3) = r.i();
        if d.dtype == DType::F16 {
            let (gs, xs) = (g.row_of::<u16>(i1, i2, i3), x.row_of::<u16>(i1, i2, i3));
            let ds = rows.row::<u16>(r);
            for i in 0..nc {
                ds[i] = fp32_to_fp16(silu_grad(fp16_to_fp32(xs[i]), fp16_to_fp32(gs[i])));
            }
        } else {
            let (gs, xs) = (g.row_of::<f32>(i1, i2, i3), x.row_of::<f32>(i1, i2, i3));
            let ds = rows.row::<f32>(r);
            // exp(-x) through the selected exp kernel, then the rest elementwise.
            for (o, &v) in ds.iter_mut().zip(xs) {
                *o = -v;
            }
            // SAFETY: `ds` holds nc f32.
            unsafe { (kt.exp_sub_sum_f32)(nc, ds.as_mut_ptr(), 0.0) };
            for i in 0..nc {
                let s = 1.0 / (1.0 + ds[i]);
                ds[i] = gs[i] * s * (1.0 + xs[i] * (1.0 - s));
            }
        }
    }
    Ok(())
}

pub(crate) fn rms_norm_back(ctx: &NodeCtx<'_>, ith: usize, eps: f32) -> Result<()> {
    let (g, x, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    let nc = d.ne[0];
    let mut rows = ctx.dst_rows(ith);
    for r in rows.range() {
        // Same shapes, contiguous F32 rows (build check); dst is a fresh node.
        let (i1, i2, i3) = r.i();
        let (dz, xs) = (g.row_of::<f32>(i1, i2, i3), x.row_of::<f32>(i1, i2, i3));
        let dx = rows.row::<f32>(r);
        let (mut sum_xx, mut sum_xdz) = (0f64, 0f64);
        for i in 0..nc {
            sum_xx += (xs[i] * xs[i]) as f64;
            sum_xdz += (xs[i] * dz[i]) as f64;
        }
        let mean_eps = sum_xx as f32 / nc as f32 + eps;
        let sum_eps = sum_xx as f32 + eps * nc as f32;
        let rrms = 1.0 / mean_eps.sqrt();
        let scale_x = (-sum_xdz) as f32 / sum_eps;
        for i in 0..nc {
            dx[i] = (dz[i] + xs[i] * scale_x) * rrms;
        }
    }
    Ok(())
}

pub(crate) fn soft_max_back(ctx: &NodeCtx<'_>, ith: usize, scale: f32) -> Result<()> {
    let (g, y, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    let kt = ctx.kt;
    let nc = d.ne[0];
    let mut rows = ctx.dst_rows(ith);
    for r in rows.range() {
        // Same shapes, contiguous F32 rows (build check); dst is a fresh node.
        let (i1, i2, i3) = r.i();
        let (dy, ys) = (g.row_of::<f32>(i1, i2, i3), y.row_of::<f32>(i1, i2, i3));
        let dx = rows.row::<f32>(r);
        // ggml's ggml_vec_dot_f32, through the selected kernel.
        let dot = (kt.dot_f32)(ys, dy);
        for i in 0..nc {
            dx[i] = (dy[i] - dot) * ys[i] * scale;
        }
    }
    Ok(())
}

/// Each worker zeroes its own result rows, then adds every grad row whose id falls among them,
/// in id order (ggml runs this op on one thread).
pub(crate) fn get_rows_back(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (g, ids, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    let m = d.ne[1];
    // ids is a contiguous I32 vector (build check).
    let ids = ids.as_slice::<i32>();
    if let Some(&bad) = ids.iter().find(|&&r| r < 0 || r as usize >= m) {
        return Err(Error::IndexOutOfRange {
            op: "get_rows_back",
            tensor: ctx.node.label(),
            index: bad as i64,
            limit: m,
        });
    }
    // dst is a fresh contiguous F32 [nc, m]: its flat rows are the m rows.
    debug_assert_eq!(d.nrows(), m);
    let mut rows = ctx.dst_rows(ith);
    let mine = rows.flat();
    for r in mine.clone() {
        rows.row::<f32>(r).fill(0.0);
    }
    for (i, &r) in ids.iter().enumerate() {
        let r = r as usize;
        if !mine.contains(&r) {
            continue;
        }
        // i < g.ne[1] (one id per grad row, build check); grad rows are contiguous.
        let out = rows.row::<f32>(r);
        if g.dtype == DType::F16 {
            for (o, &h) in out.iter_mut().zip(g.row_of::<u16>(i, 0, 0)) {
                *o += fp16_to_fp32(h);
            }
        } else {
            for (o, &v) in out.iter_mut().zip(g.row_of::<f32>(i, 0, 0)) {
                *o += v;
            }
        }
    }
    Ok(())
}

/// The gradient of im2col (ggml's ggml_compute_forward_im2col_back_f32), computed by scattering
/// each column entry back onto the input element it was copied from, so no division is needed.
/// Work is split over (image, channel) planes; each plane is summed in one fixed order.
pub(crate) fn im2col_back(ctx: &NodeCtx<'_>, ith: usize, p: &Im2colBackParams) -> Result<()> {
    let (g, k, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    let ne = d.ne;
    let (n, ic, ih, iw) =
        if p.is_2d { (ne[3], ne[2], ne[1], ne[0]) } else { (ne[2], ne[1], 1, ne[0]) };
    let (kh, kw) = if p.is_2d { (k.ne[1], k.ne[0]) } else { (1, k.ne[0]) };
    let (oh, ow) = if p.is_2d { (g.ne[2], g.ne[1]) } else { (1, g.ne[1]) };
    let (s0, s1, p0, p1, d0, d1) =
        (p.s0 as i64, p.s1 as i64, p.p0 as i64, p.p1 as i64, p.d0 as i64, p.d1 as i64);
    let cols = ic * kh * kw;
    // grad is contiguous F32 of [cols, ow, oh, n] (build check).
    let grad = g.as_slice::<f32>();
    let (c0, c1) = split(n * ic, ith, ctx.nth);
    if c0 >= c1 {
        return Ok(());
    }
    let plane_len = ih * iw;
    // SAFETY: dst is a fresh contiguous F32 tensor whose (image, channel) planes of ih * iw
    // elements sit at index plane * ih * iw in either layout ([iw, ih, ic, n] or [iw, ic, n]);
    // this worker owns planes c0..c1.
    let out = unsafe {
        std::slice::from_raw_parts_mut(
            (d.ptr as *mut f32).add(c0 * plane_len),
            (c1 - c0) * plane_len,
        )
    };
    out.fill(0.0);
    // Columns outer and channels inner, so the gradient is read in memory order; each plane
    // still receives its terms in (oy, ox, ky, kx) order whatever the split.
    for b in c0 / ic..=(c1 - 1) / ic {
        let lo = c0.max(b * ic) - b * ic;
        let hi = c1.min((b + 1) * ic) - b * ic;
        for oy in 0..oh {
            for ox in 0..ow {
                let col = ((b * oh + oy) * ow + ox) * cols;
                for c in lo..hi {
                    let taps = &grad[col + c * kh * kw..col + (c + 1) * kh * kw];
                    let po = (b * ic + c - c0) * plane_len;
                    let plane = &mut out[po..po + plane_len];
                    for ky in 0..kh {
                        let y = if p.is_2d { oy as i64 * s1 + ky as i64 * d1 - p1 } else { 0 };
                        if y < 0 || y >= ih as i64 {
                            continue;
                        }
                        let orow = &mut plane[y as usize * iw..(y as usize + 1) * iw];
                        for kx in 0..kw {
                            let x = ox as i64 * s0 + kx as i64 * d0 - p0;
                            if x >= 0 && x < iw as i64 {
                                orow[x as usize] += taps[ky * kw + kx];
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// ggml's ggml_compute_forward_pool_2d_back, split over (channel, sample) planes.
pub(crate) fn pool_2d_back(ctx: &NodeCtx<'_>, ith: usize, p: &Pool2dParams) -> Result<()> {
    let (g, f, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    let (iw, ih) = (d.ne[0] as i64, d.ne[1] as i64);
    let (ow, oh) = (g.ne[0], g.ne[1]);
    let planes = d.ne[2] * d.ne[3];
    let ka = (p.k0 * p.k1) as f32;
    let f16 = f.dtype == DType::F16;
    let (r0, r1) = split(planes, ith, ctx.nth);
    for plane in r0..r1 {
        let (i2, i3) = (plane % d.ne[2], plane / d.ne[2]);
        // SAFETY: dst is a fresh contiguous F32 tensor of `planes` planes of iw * ih; own planes.
        let out = unsafe {
            std::slice::from_raw_parts_mut(
                (d.ptr as *mut f32).add(plane * (iw * ih) as usize),
                (iw * ih) as usize,
            )
        };
        out.fill(0.0);
        // grad is contiguous F32 [ow, oh, planes] (build check).
        let gp = &g.as_slice::<f32>()[plane * ow * oh..][..ow * oh];
        for oy in 0..oh {
            let iy = oy as i64 * p.s1 as i64 - p.p1 as i64;
            // Window rows and columns clamped to the input (padding contributes nothing).
            let (ky0, ky1) = ((-iy).max(0), (ih - iy).min(p.k1 as i64));
            for ox in 0..ow {
                let grad0 = gp[oy * ow + ox];
                let ix = ox as i64 * p.s0 as i64 - p.p0 as i64;
                let (kx0, kx1) = ((-ix).max(0), (iw - ix).min(p.k0 as i64));
                match p.op {
                    PoolOp::Max => {
                        let mut best: Option<usize> = None;
                        let mut maxval = -f32::MAX;
                        for ky in ky0..ky1 {
                            let y = (iy + ky) as usize;
                            // 0 <= y < ih (clamped); af has contiguous rows.
                            let (r16, r32): (&[u16], &[f32]) = if f16 {
                                (f.row_of::<u16>(y, i2, i3), &[])
                            } else {
                                (&[], f.row_of::<f32>(y, i2, i3))
                            };
                            for kx in kx0..kx1 {
                                // 0 <= x < iw (clamped).
                                let x = (ix + kx) as usize;
                                let v = if f16 { fp16_to_fp32(r16[x]) } else { r32[x] };
                                // The first largest element wins, as in ggml.
                                if v > maxval {
                                    maxval = v;
                                    best = Some(y * iw as usize + x);
                                }
                            }
                        }
                        if let Some(i) = best {
                            out[i] += grad0;
                        }
                    }
                    PoolOp::Avg => {
                        let gr = grad0 / ka;
                        for ky in ky0..ky1 {
                            let o = (iy + ky) as usize * iw as usize;
                            let x0 = (ix + kx0).clamp(0, iw);
                            let (x0, x1) = (x0 as usize, (ix + kx1).clamp(x0, iw) as usize);
                            for v in &mut out[o + x0..o + x1] {
                                *v += gr;
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// Per-thread S and SM rows of M floats.
pub(crate) fn flash_attn_back_work_size(node: &ExecNode, nth: usize) -> usize {
    let m = node.src[1].as_ref().map_or(0, |k| k.ne[1]);
    nth * 2 * align_up(m * 4, 64)
}

/// ggml's ggml_compute_forward_flash_attn_back_f32, split over (kv head, batch) like ggml: each
/// worker owns the q heads that share its kv head, so all its writes are disjoint from others'.
pub(crate) fn flash_attn_back(ctx: &NodeCtx<'_>, ith: usize, masked: bool) -> Result<()> {
    let (q, k, v, dd, dst) = (ctx.src(0), ctx.src(1), ctx.src(2), ctx.src(3), ctx.dst());
    let (dh, n, m) = (q.ne[0], q.ne[1], k.ne[1]);
    let (h, hkv, nb) = (q.ne[2], k.ne[2], q.ne[3]);
    let p = m - n;
    let kt = ctx.kt;
    let lay = crate::graph::FlashAttnBackLayout::new(q.nelements(), k.nelements(), v.nelements())?;
    let base = dst.ptr as *mut f32;
    let stride = align_up(m * 4, 64);
    debug_assert!((ith + 1) * 2 * stride <= ctx.work_len);
    // SAFETY: the work buffer holds nth pairs of M-float rows (work size); this pair is ours.
    let (s, sm) = unsafe {
        let w = ctx.work.add(ith * 2 * stride);
        (
            std::slice::from_raw_parts_mut(w as *mut f32, m),
            std::slice::from_raw_parts_mut(w.add(stride) as *mut f32, m),
        )
    };
    // Packed result: gq [dh, n, h, nb], gk [dh, m, hkv, nb], gv [m, dh, hkv, nb].
    let gq = |i1: usize, i2: usize, i3: usize| ((i3 * h + i2) * n + i1) * dh;
    let gk = |i1: usize, i2: usize, i3: usize| lay.offs_k / 4 + ((i3 * hkv + i2) * m + i1) * dh;
    let gv = |i1: usize, i2: usize, i3: usize| lay.offs_v / 4 + ((i3 * hkv + i2) * dh + i1) * m;
    if ith == 0 {
        // Zero the alignment gaps between the blocks (no worker owns them).
        let gaps = [
            (q.nelements(), lay.offs_k / 4),
            (lay.offs_k / 4 + k.nelements(), lay.offs_v / 4),
            (lay.offs_v / 4 + v.nelements(), lay.n_elements),
        ];
        for (a, b) in gaps {
            for i in a..b {
                // SAFETY: i < n_elements, the result's length; no worker writes the gaps.
                unsafe { *base.add(i) = 0.0 };
            }
        }
    }
    let nrep = h / hkv;
    let scale = 1.0 / (dh as f32).sqrt();
    let (r0, r1) = split(hkv * nb, ith, ctx.nth);
    for ir in r0..r1 {
        let (ik2, ik3) = (ir % hkv, ir / hkv);
        // Every unsafe block below relies on the same facts: indices stay below the shapes checked
        // at build time; rows are contiguous F32; this worker owns the gk/gv blocks (ik2, ik3) and
        // the gq blocks of q heads ik2 + irep * hkv, which no other worker touches.
        // SAFETY: zeroing this worker's own gk, gv and gq blocks (see above).
        unsafe {
            for j in 0..m {
                std::slice::from_raw_parts_mut(base.add(gk(j, ik2, ik3)), dh).fill(0.0);
            }
            for c in 0..dh {
                std::slice::from_raw_parts_mut(base.add(gv(c, ik2, ik3)), m).fill(0.0);
            }
            for irep in 0..nrep {
                let iq2 = ik2 + irep * hkv;
                for i1 in 0..n {
                    std::slice::from_raw_parts_mut(base.add(gq(i1, iq2, ik3)), dh).fill(0.0);
                }
            }
        }
        for irep in 0..nrep {
            let iq2 = ik2 + irep * hkv;
            for iq1 in 0..n {
                let qrow = &q.row_of::<f32>(iq1, iq2, ik3)[..dh];
                let krow = |j: usize| &k.row_of::<f32>(j, ik2, ik3)[..dh];
                let vrow = |c: usize| &v.row_of::<f32>(c, ik2, ik3)[..m];
                // d may have any element stride.
                let dval = |c: usize| dd.get::<f32>(c, iq1, iq2, ik3);
                let mb = if masked { p + iq1 + 1 } else { m };
                // S = k . q * scale, softmax over the visible keys.
                let mut max = f32::NEG_INFINITY;
                for j in 0..mb {
                    s[j] = (kt.dot_f32)(krow(j), qrow) * scale;
                    max = max.max(s[j]);
                }
                let mut sum = 0f64;
                for j in 0..mb {
                    sm[j] = (s[j] - max).exp();
                    sum += sm[j] as f64;
                }
                let inv = (1.0 / sum) as f32;
                for x in &mut sm[..mb] {
                    *x *= inv;
                }
                // S = d @ v (the gradient of SM), then S = SM * (S - dot(SM, S)) * scale.
                s[..mb].fill(0.0);
                for c in 0..dh {
                    (kt.mad_f32)(&mut s[..mb], &vrow(c)[..mb], dval(c));
                }
                let mut dot = 0f64;
                for j in 0..mb {
                    dot += (sm[j] * s[j]) as f64;
                }
                let dot = dot as f32;
                for j in 0..mb {
                    s[j] = (s[j] - dot) * sm[j] * scale;
                }
                // SAFETY: see above; the gq, gk and gv rows are disjoint blocks of the result.
                unsafe {
                    let oq = std::slice::from_raw_parts_mut(base.add(gq(iq1, iq2, ik3)), dh);
                    for j in 0..mb {
                        (kt.mad_f32)(oq, krow(j), s[j]);
                    }
                    for j in 0..mb {
                        let ok = std::slice::from_raw_parts_mut(base.add(gk(j, ik2, ik3)), dh);
                        (kt.mad_f32)(ok, qrow, s[j]);
                    }
                    for c in 0..dh {
                        let ov = std::slice::from_raw_parts_mut(base.add(gv(c, ik2, ik3)), mb);
                        (kt.mad_f32)(ov, &sm[..mb], dval(c));
                    }
                }
            }
        }
    }
    Ok(())
}
