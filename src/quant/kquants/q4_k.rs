//! Q4_K: `x = d * scale * q - dmin * min` with 4-bit `q`, 8 sub-blocks of 32 with 6-bit scales
//! and mins packed in 12 bytes (ggml's `block_q4_K`, 4.5 bits per weight).

use super::helpers::{
    clamp_c, get_scale_min_k4, make_qkx2_quants, make_qkx3_quants, make_qp_quants,
};
use super::{BlockQ8K, vec_dot_blocks};
use crate::dtype::QK_K;
use crate::quant::util::{fp16_to_fp32, fp32_to_fp16, nearest_int};

/// ggml's `block_q4_K`.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct BlockQ4K {
    /// Super-block scale for the scales (f16 bits).
    pub d: u16,
    /// Super-block scale for the mins (f16 bits).
    pub dmin: u16,
    /// 8 six-bit scales and 8 six-bit mins (see `get_scale_min_k4`).
    pub scales: [u8; 12],
    /// 4-bit levels: byte `l` of each 32 holds elements `l` (low) and `l + 32` (high) of its 64.
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockQ4K>() == 144);

/// Packs the 6-bit scale `ls` and min `lm` of sub-block `j` (0..8) as ggml does (including its
/// truncation of values above 63, which only the importance-matrix path can produce).
pub(crate) fn set_scale_min_k4(scales: &mut [u8; 12], j: usize, ls: u8, lm: u8) {
    if j < 4 {
        scales[j] = ls;
        scales[j + 4] = lm;
    } else {
        scales[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
        scales[j - 4] |= (ls >> 4) << 6;
        scales[j] |= (lm >> 4) << 6;
    }
}

/// Final `nmax`-level quantization of the 8 sub-blocks of 32 from the stored scales and mins;
/// sub-blocks whose scale is zero keep `l`. Shared with Q5_K.
pub(crate) fn requantize_k4(
    x: &[f32],
    d: u16,
    dmin: u16,
    scales: &[u8; 12],
    nmax: i32,
    l: &mut [u8; QK_K],
) {
    for j in 0..QK_K / 32 {
        let (sc, m) = get_scale_min_k4(j, scales);
        let dj = fp16_to_fp32(d) * sc as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = fp16_to_fp32(dmin) * m as f32;
        for ii in 0..32 {
            let q = nearest_int((x[32 * j + ii] + dm) / dj);
            l[32 * j + ii] = clamp_c(q, 0, nmax) as u8;
        }
    }
}

/// The reference quantizer of Q4_K and Q5_K (they differ in `nmax` and the search parameters):
/// per sub-block scale and min by `make_qkx2_quants`, then both quantized to 6 bits against their
/// maxima. Returns the block's `d`, `dmin`, packed scales and levels.
pub(crate) fn quantize_k4_ref(
    x: &[f32],
    nmax: i32,
    rmin: f32,
    nstep: i32,
    l: &mut [u8; QK_K],
) -> (u16, u16, [u8; 12]) {
    let mut laux = [0u8; 32];
    let mut weights = [0f32; 32];
    let mut mins = [0f32; QK_K / 32];
    let mut scales = [0f32; QK_K / 32];
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for j in 0..QK_K / 32 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let lj = &mut l[32 * j..32 * j + 32];
        let sm = make_qkx2_quants(nmax, xs, &weights, lj, &mut laux, rmin, 0.1, nstep, false);
        scales[j] = sm.scale;
        mins[j] = sm.min;
        if sm.scale > max_scale {
            max_scale = sm.scale;
        }
        if sm.min > max_min {
            max_min = sm.min;
        }
    }

    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut packed = [0u8; 12];
    for j in 0..QK_K / 32 {
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        set_scale_min_k4(&mut packed, j, ls, lm);
    }
    let d = fp32_to_fp16(max_scale / 63.0);
    let dmin = fp32_to_fp16(max_min / 63.0);
    requantize_k4(x, d, dmin, &packed, nmax, l);
    (d, dmin, packed)
}

/// The importance-matrix quantizer of Q4_K and Q5_K (`quantize_row_q{4,5}_K_impl`): scale and min
/// per sub-block by `make_qkx3_quants`, then both quantized with `make_qp_quants` weighted by the
/// sub-block's total weight. `clamp63` is Q5_K's extra `MIN(63, ...)`.
pub(crate) fn quantize_k4_impl(
    x: &[f32],
    qw: Option<&[f32]>,
    nmax: i32,
    clamp63: bool,
    l: &mut [u8; QK_K],
) -> (u16, u16, [u8; 12]) {
    let mut laux = [0u8; 32];
    let mut ls = [0u8; QK_K / 32];
    let mut lm = [0u8; QK_K / 32];
    let mut weights = [0f32; 32];
    let mut sw = [0f32; QK_K / 32];
    let mut mins = [0f32; QK_K / 32];
    let mut scales = [0f32; QK_K / 32];

    let mut sum_x2 = 0.0f32;
    for &v in &x[..QK_K] {
        sum_x2 += v * v;
    }
    let sigma2 = 2.0 * sum_x2 / QK_K as f32;
    let av_x = sigma2.sqrt();
    for j in 0..QK_K / 32 {
        let xs = &x[32 * j..32 * j + 32];
        match qw {
            Some(qw) => {
                for ((w, &q), &v) in weights.iter_mut().zip(&qw[32 * j..32 * j + 32]).zip(xs) {
                    *w = q * (sigma2 + v * v).sqrt();
                }
            }
            None => {
                for (w, v) in weights.iter_mut().zip(xs) {
                    *w = av_x + v.abs();
                }
            }
        }
        let mut sumw = 0.0f32;
        for &w in &weights {
            sumw += w;
        }
        sw[j] = sumw;
        let lj = &mut l[32 * j..32 * j + 32];
        let sm = make_qkx3_quants(nmax, xs, Some(&weights), lj, &mut laux, -0.9, 0.05, 36, false);
        scales[j] = sm.scale;
        mins[j] = sm.min;
    }

    let d_block = make_qp_quants(63, &scales, &mut ls, &sw);
    let m_block = make_qp_quants(63, &mins, &mut lm, &sw);
    let mut packed = [0u8; 12];
    for j in 0..QK_K / 32 {
        let (s, m) = if clamp63 { (ls[j].min(63), lm[j].min(63)) } else { (ls[j], lm[j]) };
        set_scale_min_k4(&mut packed, j, s, m);
    }
    let d = fp32_to_fp16(d_block);
    let dmin = fp32_to_fp16(m_block);
    requantize_k4(x, d, dmin, &packed, nmax, l);
    (d, dmin, packed)
}

fn pack_q4(l: &[u8; QK_K], qs: &mut [u8; QK_K / 2]) {
    for j in (0..QK_K).step_by(64) {
        for i in 0..32 {
            qs[j / 2 + i] = l[j + i] | (l[j + i + 32] << 4);
        }
    }
}

/// ggml's `quantize_row_q4_K_ref` for one super-block.
pub(crate) fn quantize_row_q4_K_ref(x: &[f32]) -> BlockQ4K {
    let mut l = [0u8; QK_K];
    let (d, dmin, scales) = quantize_k4_ref(x, 15, -1.0, 20, &mut l);
    let mut y = BlockQ4K { d, dmin, scales, qs: [0; QK_K / 2] };
    pack_q4(&l, &mut y.qs);
    y
}

/// ggml's `quantize_row_q4_K_impl` (with an importance matrix) for one super-block.
pub(crate) fn quantize_row_q4_K_impl(x: &[f32], qw: &[f32]) -> BlockQ4K {
    let mut l = [0u8; QK_K];
    let (d, dmin, scales) = quantize_k4_impl(x, Some(qw), 15, false, &mut l);
    let mut y = BlockQ4K { d, dmin, scales, qs: [0; QK_K / 2] };
    pack_q4(&l, &mut y.qs);
    y
}

/// ggml's `dequantize_row_q4_K` for one block.
pub(crate) fn dequantize_row_q4_K(b: &BlockQ4K, y: &mut [f32]) {
    let d = fp16_to_fp32(b.d);
    let min = fp16_to_fp32(b.dmin);
    for (j, (q, out)) in b.qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (sc1, m1) = get_scale_min_k4(2 * j, &b.scales);
        let (sc2, m2) = get_scale_min_k4(2 * j + 1, &b.scales);
        let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
        let (lo, hi) = out.split_at_mut(32);
        for ((o, p), &qv) in lo.iter_mut().zip(hi.iter_mut()).zip(q) {
            *o = d1 * (qv & 0xF) as f32 - m1;
            *p = d2 * (qv >> 4) as f32 - m2;
        }
    }
}

/// The integer core shared by the Q4_K and Q5_K dot products (`a` holds the unsigned levels):
/// accumulates `d * sum(scale * q8 * a)` into `sums` and returns `dmin * sum(bsums * min)`.
pub(crate) fn dot_k4_block(
    a: &[i8; QK_K],
    scales12: &[u8; 12],
    d: u16,
    dmin: u16,
    yb: &BlockQ8K,
    sums: &mut [f32; 8],
) -> f32 {
    let mut sc = [0u8; 8];
    let mut mins = [0u8; 8];
    for j in 0..8 {
        (sc[j], mins[j]) = get_scale_min_k4(j, scales12);
    }
    let mut sumi = 0i32;
    for j in 0..QK_K / 16 {
        sumi += yb.bsums[j] as i32 * mins[j / 2] as i32;
    }
    let mut aux32 = [0i32; 8];
    for (j, (q8, a)) in yb.qs.chunks_exact(32).zip(a.chunks_exact(32)).enumerate() {
        let scale = sc[j] as i32;
        for k in 0..4 {
            for l in 0..8 {
                let p = q8[8 * k + l] as i16 * a[8 * k + l] as i16;
                aux32[l] += scale * p as i32;
            }
        }
    }
    let dd = fp16_to_fp32(d) * yb.d;
    for l in 0..8 {
        sums[l] += dd * aux32[l] as f32;
    }
    fp16_to_fp32(dmin) * yb.d * sumi as f32
}

/// ggml's `ggml_vec_dot_q4_K_q8_K_generic`.
pub(crate) fn vec_dot_q4_K_q8_K(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut sums = [0f32; 8];
    let mut sumf = 0.0f32;
    let mut aux8 = [0i8; QK_K];
    vec_dot_blocks::<BlockQ4K>(n, x, y, |xb, yb| {
        for (q, a) in xb.qs.chunks_exact(32).zip(aux8.chunks_exact_mut(64)) {
            for (l, &qv) in q.iter().enumerate() {
                a[l] = (qv & 0xF) as i8;
                a[l + 32] = (qv >> 4) as i8;
            }
        }
        sumf -= dot_k4_block(&aux8, &xb.scales, xb.d, xb.dmin, yb, &mut sums);
    });
    for s in sums {
        sumf += s;
    }
    sumf
}
