//! rope_ext / rope_multi (ggml's ggml_compute_forward_rope_flt): a per-token cache of cos/sin
//! built with ggml's accumulated theta, YaRN ramp and magnitude scaling, then pair rotation.

use super::NodeCtx;
use super::node::{Elem, InOut, Slices};
use crate::dtype::DType;
use crate::error::Result;
use crate::graph::{RopeMode, RopeParams};
use crate::ops::node::ExecNode;
use crate::quant::util::{fp16_to_fp32, fp32_to_fp16};

fn corr_dim(n_dims: usize, n_ctx_orig: i32, n_rot: f32, base: f32) -> f32 {
    n_dims as f32 * (n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
        / (2.0 * base.ln())
}

/// ggml_rope_yarn_corr_dims.
fn corr_dims(p: &RopeParams) -> [f32; 2] {
    let start = corr_dim(p.n_dims, p.n_ctx_orig, p.beta_fast, p.freq_base).floor();
    let end = corr_dim(p.n_dims, p.n_ctx_orig, p.beta_slow, p.freq_base).ceil();
    [start.max(0.0), end.min(p.n_dims as f32 - 1.0)]
}

fn yarn_ramp(low: f32, high: f32, i0: usize) -> f32 {
    let y = ((i0 / 2) as f32 - low) / (high - low).max(0.001);
    1.0 - y.clamp(0.0, 1.0)
}

/// (cos, sin) for one pair, with YaRN.
fn rope_yarn(theta_extrap: f32, p: &RopeParams, corr: [f32; 2], i0: usize) -> (f32, f32) {
    let theta_interp = p.freq_scale * theta_extrap;
    let mut theta = theta_interp;
    let mut mscale = p.attn_factor;
    if p.ext_factor != 0.0 {
        let mix = yarn_ramp(corr[0], corr[1], i0) * p.ext_factor;
        theta = theta_interp * (1.0 - mix) + theta_extrap * mix;
        mscale *= 1.0 + 0.1 * (1.0 / p.freq_scale).ln();
    }
    (theta.cos() * mscale, theta.sin() * mscale)
}

pub(crate) fn work_size(node: &ExecNode, nth: usize) -> usize {
    (node.dst.ne[0] + 16) * 4 * nth
}

/// Fills `cache[i0 / 2]` (cos) and `cache[ceil(ne0 / 2) + i0 / 2]` (sin) for pair i0 of a token at
/// `pos`: split halves so the rotation loops read them contiguously. `sin_sign` is -1 for
/// rope_back (a rotation by -theta), as ggml's cache init takes it.
fn fill_cache(
    cache: &mut [f32],
    pos: [i32; 4],
    p: &RopeParams,
    ff: Option<&[f32]>,
    corr: [f32; 2],
    sin_sign: f32,
) {
    let ne0 = cache.len();
    let theta_scale = p.freq_base.powf(-2.0 / p.n_dims as f32);
    // Pairs past the factors (unused unless vision mode) get factor 1: ggml would read past them.
    let factor = |i0: usize| ff.and_then(|f| f.get(i0 / 2).copied()).unwrap_or(1.0);
    if !p.mode.is_multi() {
        let mut theta = pos[0] as f32;
        for i0 in (0..ne0).step_by(2) {
            let (c, s) = rope_yarn(theta / factor(i0), p, corr, i0);
            cache[i0 / 2] = c;
            cache[ne0.div_ceil(2) + i0 / 2] = s * sin_sign;
            theta *= theta_scale;
        }
        return;
    }
    let sec = p.sections;
    let sect_dims = (sec[0] + sec[1] + sec[2] + sec[3]).max(1) as usize;
    let sec_w = (sec[0] + sec[1]) as usize;
    let sec_e = sec[2] as usize + sec_w;
    let base = [pos[0] as f32, pos[1] as f32, pos[2] as f32, pos[3] as f32];
    let (mut tt, mut th, mut tw, mut te) = (base[0], base[1], base[2], base[3]);
    let imrope = p.mode == RopeMode::Imrope;
    let indep = p.mode == RopeMode::Vision;
    for i0 in (0..ne0).step_by(2) {
        let sector = (i0 / 2) % sect_dims;
        if indep {
            if sector == 0 {
                tt = base[0];
            } else if sector == sec[0] as usize {
                th = base[1];
            } else if sector == sec_w {
                tw = base[2];
            } else if sector == sec_e {
                te = base[3];
            }
        }
        let theta = if imrope {
            if sector % 3 == 1 && sector < 3 * sec[1] as usize {
                th
            } else if sector % 3 == 2 && sector < 3 * sec[2] as usize {
                tw
            } else if sector.is_multiple_of(3) && sector < 3 * sec[0] as usize {
                tt
            } else {
                te
            }
        } else if sector >= sec[0] as usize && sector < sec_w {
            th
        } else if sector >= sec_w && sector < sec_w + sec[2] as usize {
            tw
        } else if sector >= sec_w + sec[2] as usize {
            te
        } else {
            tt
        };
        let (c, s) = rope_yarn(theta / factor(i0), p, corr, i0);
        cache[i0 / 2] = c;
        cache[ne0.div_ceil(2) + i0 / 2] = s * sin_sign;
        tt *= theta_scale;
        th *= theta_scale;
        tw *= theta_scale;
        te *= theta_scale;
    }
}

/// A row read and written through f32 by [`rotate`].
trait RowRw {
    fn get(&self, i: usize) -> f32;
    fn put(&mut self, i: usize, v: f32);
}

/// An F32 row rotated in place.
struct InPlace<'a>(&'a mut [f32]);
/// An F32 source row and its destination row.
struct Apart<'a>(&'a [f32], &'a mut [f32]);
/// Any other row (strided, or F16 through `to` / `from`).
struct Conv<'a, T, F, G>(InOut<'a, T>, F, G);

impl RowRw for InPlace<'_> {
    #[inline(always)]
    fn get(&self, i: usize) -> f32 {
        self.0[i]
    }
    #[inline(always)]
    fn put(&mut self, i: usize, v: f32) {
        self.0[i] = v;
    }
}

impl RowRw for Apart<'_> {
    #[inline(always)]
    fn get(&self, i: usize) -> f32 {
        self.0[i]
    }
    #[inline(always)]
    fn put(&mut self, i: usize, v: f32) {
        self.1[i] = v;
    }
}

impl<T: Elem, F: Fn(T) -> f32, G: Fn(f32) -> T> RowRw for Conv<'_, T, F, G> {
    #[inline(always)]
    fn get(&self, i: usize) -> f32 {
        (self.1)(self.0.src(i))
    }
    #[inline(always)]
    fn put(&mut self, i: usize, v: f32) {
        let v = (self.2)(v);
        self.0.set(i, v);
    }
}

/// Rotates dims `offs .. offs + n_dims` of one row (each pair read before it is written, so in
/// place works) and copies the others.
#[inline(always)]
fn rotate(
    mode: RopeMode,
    n_dims: usize,
    offs: usize,
    ne0: usize,
    cache: &[f32],
    io: &mut impl RowRw,
) {
    let half = ne0.div_ceil(2);
    let (cos, sin) = cache.split_at(half);
    // (pairs, offset of the second element, divisor from pair index to first element)
    let (n, off, scale) = match mode {
        RopeMode::Normal => (n_dims, 1, 1),
        RopeMode::Neox | RopeMode::Mrope | RopeMode::Imrope => (n_dims, n_dims / 2, 2),
        RopeMode::Vision => (ne0, n_dims, 2),
    };
    for i0 in (0..n).step_by(2) {
        let ic = offs + i0 / scale;
        let (c, s) = (cos[i0 / 2], sin[i0 / 2]);
        let (x0, x1) = (io.get(ic), io.get(ic + off));
        io.put(ic, x0 * c - x1 * s);
        io.put(ic + off, x0 * s + x1 * c);
    }
    if mode != RopeMode::Vision {
        for i0 in (0..offs).chain(offs + n_dims..ne0) {
            let v = io.get(i0);
            io.put(i0, v);
        }
    }
}

pub(crate) fn compute(ctx: &NodeCtx<'_>, ith: usize, p: &RopeParams) -> Result<()> {
    compute_dir(ctx, ith, p, 1.0)
}

/// rope_back (ggml's ggml_compute_forward_rope_back): the same rotation with sin negated.
pub(crate) fn compute_back(ctx: &NodeCtx<'_>, ith: usize, p: &RopeParams) -> Result<()> {
    compute_dir(ctx, ith, p, -1.0)
}

fn compute_dir(ctx: &NodeCtx<'_>, ith: usize, p: &RopeParams, sin_sign: f32) -> Result<()> {
    let (a, posv, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    let ff_view = ctx.node.src[2].as_ref();
    let ne0 = d.ne[0];
    let corr = corr_dims(p);
    // Positions are a contiguous I32 vector, freq_factors a contiguous F32 row of >= n_dims/2
    // values (build check).
    let pos = posv.row_of::<i32>(0, 0, 0);
    let ff = ff_view.map(|f| f.row_of::<f32>(0, 0, 0));
    let cache = ctx.scratch::<f32>(ith, (ne0 + 16) * 4, 2 * ne0.div_ceil(2));
    let n2 = d.ne[2];
    let mut rows = ctx.dst_rows(ith);
    let mut last_i2 = usize::MAX;
    let f16 = d.dtype == DType::F16;
    let (n_dims, offs) = (p.n_dims, p.n_offs);
    // Neox, mrope and imrope pair element i with i + n_dims / 2 (see `rotate`).
    let neox_like = matches!(p.mode, RopeMode::Neox | RopeMode::Mrope | RopeMode::Imrope);
    let kt = ctx.kt;
    let fill = |cache: &mut [f32], i2: usize| {
        let pp = if p.mode.is_multi() {
            [pos[i2], pos[i2 + n2], pos[i2 + 2 * n2], pos[i2 + 3 * n2]]
        } else {
            [pos[i2], 0, 0, 0]
        };
        fill_cache(cache, pp, p, ff, corr, sin_sign);
    };
    if neox_like
        && !f16
        && let Some(ptrs) = rows.row_ptrs::<f32>(a)
    {
        // The two halves of the rotated dims are contiguous runs: one vector pass per row.
        let (h, half) = (n_dims / 2, ne0.div_ceil(2));
        assert!(offs + 2 * h <= ne0 && h <= half && 2 * half <= cache.len());
        for (r, ys, xs) in ptrs {
            let (_, i2, _) = r.i();
            if i2 != last_i2 {
                fill(cache, i2);
                last_i2 = i2;
            }
            let (cos, sin) = (cache.as_ptr(), cache[half..].as_ptr());
            // SAFETY: both rows hold ne0 >= offs + 2 h contiguous f32 (`row_ptrs`; asserted),
            // equal or apart; cos and sin hold h values each (asserted). The rest of the row
            // (before offs, after offs + n_dims), when the rotation does not cover it, is copied
            // unless the rows are one (in place).
            unsafe {
                let (x, y) = (xs.add(offs), ys.add(offs));
                (kt.rope_rotate_f32)(h, y, y.add(h), x, x.add(h), cos, sin);
                if n_dims < ne0 && !std::ptr::eq(xs, ys) {
                    std::ptr::copy_nonoverlapping(xs, ys, offs);
                    let end = offs + n_dims;
                    std::ptr::copy_nonoverlapping(xs.add(end), ys.add(end), ne0 - end);
                }
            }
        }
        return Ok(());
    }
    for r in rows.range() {
        let (_, i2, _) = r.i();
        if i2 != last_i2 {
            fill(cache, i2);
            last_i2 = i2;
        }
        // Rows hold ne0 contiguous elements (build check); in place, pairs are read before
        // they are written. The rotation reads n_dims / 2 <= ceil(ne0 / 2) cos and sin values
        // of the cache.
        if f16 {
            let mut io = Conv(rows.io::<u16>(a, r), fp16_to_fp32, fp32_to_fp16);
            rotate(p.mode, n_dims, offs, ne0, cache, &mut io);
            continue;
        }
        // Rows of the neox-like modes took the vector pass above (rows are contiguous, build
        // check); the other modes rotate element by element.
        match rows.io::<f32>(a, r).slices() {
            Ok(Slices::Same(y)) => rotate(p.mode, n_dims, offs, ne0, cache, &mut InPlace(y)),
            Ok(Slices::Two(x, y)) => rotate(p.mode, n_dims, offs, ne0, cache, &mut Apart(x, y)),
            Err(io) => rotate(p.mode, n_dims, offs, ne0, cache, &mut Conv(io, |x| x, |x| x)),
        }
    }
    Ok(())
}
