//! Q2_K: `x = d * scale * q - dmin * min` with 2-bit `q`, 16 sub-blocks of 16 whose 4-bit scale
//! and min share a byte (ggml's `block_q2_K`, 2.625 bits per weight).

use super::helpers::{clamp_c, make_qkx2_quants, make_qkx3_quants, make_qp_quants};
use super::vec_dot_blocks;
use crate::dtype::QK_K;
use crate::quant::util::{fp16_to_fp32, fp32_to_fp16, nearest_int};

/// ggml's `block_q2_K`.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct BlockQ2K {
    /// Scale (low nibble) and min (high nibble) of each sub-block of 16.
    pub scales: [u8; QK_K / 16],
    /// 2-bit levels, four per byte: element `l + 32*k` of each 128 in bits `2k..2k+2` of byte `l`.
    pub qs: [u8; QK_K / 4],
    /// Super-block scale for the scales (f16 bits).
    pub d: u16,
    /// Super-block scale for the mins (f16 bits).
    pub dmin: u16,
}
const _: () = assert!(size_of::<BlockQ2K>() == 84);

/// Packs 2-bit levels: byte `l` of each 32 holds elements `l`, `l+32`, `l+64`, `l+96` of its 128.
fn pack_q2(l: &[u8; QK_K], qs: &mut [u8; QK_K / 4]) {
    for j in (0..QK_K).step_by(128) {
        for i in 0..32 {
            qs[j / 4 + i] =
                l[j + i] | (l[j + i + 32] << 2) | (l[j + i + 64] << 4) | (l[j + i + 96] << 6);
        }
    }
}

/// Final levels from the stored (rounded) scales; sub-blocks with a zero scale keep `l`.
fn requantize(x: &[f32], y: &BlockQ2K, dm: f32, mm: f32, l: &mut [u8; QK_K]) {
    for j in 0..QK_K / 16 {
        let d = dm * (y.scales[j] & 0xF) as f32;
        if d == 0.0 {
            continue;
        }
        let m = mm * (y.scales[j] >> 4) as f32;
        for ii in 0..16 {
            let q = nearest_int((x[16 * j + ii] + m) / d);
            l[16 * j + ii] = clamp_c(q, 0, 3) as u8;
        }
    }
}

/// ggml's `quantize_row_q2_K_ref` for one super-block of `QK_K` values.
pub(crate) fn quantize_row_q2_K_ref(x: &[f32]) -> BlockQ2K {
    let mut y: BlockQ2K = bytemuck::Zeroable::zeroed();
    let mut l = [0u8; QK_K];
    let mut laux = [0u8; 16];
    let mut weights = [0f32; 16];
    let mut mins = [0f32; QK_K / 16];
    let mut scales = [0f32; QK_K / 16];
    let q4scale = 15.0f32;

    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for j in 0..QK_K / 16 {
        let xs = &x[16 * j..16 * j + 16];
        for (w, v) in weights.iter_mut().zip(xs) {
            *w = v.abs();
        }
        let lj = &mut l[16 * j..16 * j + 16];
        let sm = make_qkx2_quants(3, xs, &weights, lj, &mut laux, -0.5, 0.1, 15, true);
        scales[j] = sm.scale;
        mins[j] = sm.min;
        if sm.scale > max_scale {
            max_scale = sm.scale;
        }
        if sm.min > max_min {
            max_min = sm.min;
        }
    }

    if max_scale > 0.0 {
        let iscale = q4scale / max_scale;
        for (s, &v) in y.scales.iter_mut().zip(&scales) {
            *s = nearest_int(iscale * v) as u8;
        }
        y.d = fp32_to_fp16(max_scale / q4scale);
    } else {
        y.scales = [0; QK_K / 16];
        y.d = fp32_to_fp16(0.0);
    }
    if max_min > 0.0 {
        let iscale = q4scale / max_min;
        for (s, &m) in y.scales.iter_mut().zip(&mins) {
            *s |= (nearest_int(iscale * m) as u8) << 4;
        }
        y.dmin = fp32_to_fp16(max_min / q4scale);
    } else {
        y.dmin = fp32_to_fp16(0.0);
    }
    requantize(x, &y, fp16_to_fp32(y.d), fp16_to_fp32(y.dmin), &mut l);
    pack_q2(&l, &mut y.qs);
    y
}

/// ggml's `quantize_row_q2_K_impl` (with an importance matrix) for one super-block; `qw` holds
/// the `QK_K` matching importance weights.
pub(crate) fn quantize_row_q2_K_impl(x: &[f32], qw: &[f32]) -> BlockQ2K {
    let mut y: BlockQ2K = bytemuck::Zeroable::zeroed();
    let mut l = [0u8; QK_K];
    let mut laux = [0u8; 16];
    let mut mins = [0f32; QK_K / 16];
    let mut scales = [0f32; QK_K / 16];
    let mut sw = [0f32; QK_K / 16];
    let mut weight = [0f32; 16];
    let mut ls = [0u8; QK_K / 16];
    let mut lm = [0u8; QK_K / 16];

    let mut sumx2 = 0.0f32;
    for &v in &x[..QK_K] {
        sumx2 += v * v;
    }
    let sigma2 = sumx2 / QK_K as f32;
    for j in 0..QK_K / 16 {
        let xs = &x[16 * j..16 * j + 16];
        for ((w, &q), &v) in weight.iter_mut().zip(&qw[16 * j..16 * j + 16]).zip(xs) {
            *w = q * (sigma2 + v * v).sqrt();
        }
        for &w in &weight {
            sw[j] += w;
        }
        let lj = &mut l[16 * j..16 * j + 16];
        let sm = make_qkx3_quants(3, xs, Some(&weight), lj, &mut laux, -0.9, 0.05, 36, false);
        scales[j] = sm.scale;
        mins[j] = sm.min;
    }

    let dm = make_qp_quants(15, &scales, &mut ls, &sw);
    let mm = make_qp_quants(15, &mins, &mut lm, &sw);
    y.d = fp32_to_fp16(dm);
    y.dmin = fp32_to_fp16(mm);
    for j in 0..QK_K / 16 {
        y.scales[j] = ls[j] | (lm[j] << 4);
    }
    requantize(x, &y, fp16_to_fp32(y.d), fp16_to_fp32(y.dmin), &mut l);
    pack_q2(&l, &mut y.qs);
    y
}

/// ggml's `dequantize_row_q2_K` for one block.
pub(crate) fn dequantize_row_q2_K(b: &BlockQ2K, y: &mut [f32]) {
    let d = fp16_to_fp32(b.d);
    let min = fp16_to_fp32(b.dmin);
    let mut out = y.iter_mut();
    let mut is = 0;
    for n in 0..QK_K / 128 {
        let q = &b.qs[32 * n..32 * n + 32];
        for shift in [0, 2, 4, 6] {
            for half in [0, 16] {
                let sc = b.scales[is];
                is += 1;
                let dl = d * (sc & 0xF) as f32;
                let ml = min * (sc >> 4) as f32;
                // The finite side first, so `zip` never pulls an output it cannot fill.
                for (&qv, o) in q[half..half + 16].iter().zip(out.by_ref()) {
                    *o = dl * ((qv >> shift) & 3) as f32 - ml;
                }
            }
        }
    }
}

/// ggml's `ggml_vec_dot_q2_K_q8_K_generic`.
pub(crate) fn vec_dot_q2_K_q8_K(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    vec_dot_blocks::<BlockQ2K>(n, x, y, |xb, yb| {
        let sc = &xb.scales;
        let mut summs = 0i32;
        for (&bs, &s) in yb.bsums.iter().zip(sc) {
            summs += bs as i32 * (s >> 4) as i32;
        }
        let dall = yb.d * fp16_to_fp32(xb.d);
        let dmin = yb.d * fp16_to_fp32(xb.dmin);

        let mut isum = 0i32;
        let mut is = 0;
        let mut q8 = &yb.qs[..];
        for k in 0..QK_K / 128 {
            let q2 = &xb.qs[32 * k..32 * k + 32];
            for shift in [0, 2, 4, 6] {
                for half in [0, 16] {
                    let d = (sc[is] & 0xF) as i32;
                    is += 1;
                    let mut isuml = 0i32;
                    for l in half..half + 16 {
                        isuml += q8[l] as i32 * ((q2[l] >> shift) & 3) as i32;
                    }
                    isum += d * isuml;
                }
                q8 = &q8[32..];
            }
        }
        sumf += dall * isum as f32 - dmin * summs as f32;
    });
    sumf
}
