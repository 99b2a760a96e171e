//! Q3_K: `x = d * (scale - 32) * q` with 3-bit signed `q` (2 low bits in `qs`, the high bit in
//! `hmask`), 16 sub-blocks of 16 with 6-bit scales (ggml's `block_q3_K`, 3.4375 bits per weight).

use super::helpers::{clamp_c, make_q3_quants, make_qx_quants};
use super::vec_dot_blocks;
use crate::dtype::QK_K;
use crate::quant::util::{fp16_to_fp32, fp32_to_fp16, nearest_int};

/// ggml's `block_q3_K`.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct BlockQ3K {
    /// High bit of each level: bit `k` of byte `m` is element `m + 32*k`; set means "no -4".
    pub hmask: [u8; QK_K / 8],
    /// Low 2 bits of each level, packed as in Q2_K.
    pub qs: [u8; QK_K / 4],
    /// 16 six-bit scales (offset by 32): low nibbles in bytes 0..8, high 2 bits in bytes 8..12.
    pub scales: [u8; 12],
    /// Super-block scale (f16 bits).
    pub d: u16,
}
const _: () = assert!(size_of::<BlockQ3K>() == 110);

/// Stores 6-bit value `l` (0..64) as scale `j` of the packed 12 bytes.
fn set_scale(scales: &mut [u8; 12], j: usize, l: i32) {
    if j < 8 {
        scales[j] = (l & 0xF) as u8;
    } else {
        scales[j - 8] |= ((l & 0xF) << 4) as u8;
    }
    let hi = l >> 4;
    scales[j % 4 + 8] |= (hi << (2 * (j / 4))) as u8;
}

/// Scale `j` as the quantizer reads it back: `-32..32`.
fn get_scale(scales: &[u8; 12], j: usize) -> i32 {
    let lo = if j < 8 { scales[j] & 0xF } else { scales[j - 8] >> 4 } as i32;
    (lo | ((((scales[8 + j % 4] >> (2 * (j / 4))) & 3) as i32) << 4)) - 32
}

/// ggml's 16 signed scales (still offset by 32) unpacked from 12 bytes with its `kmask` shuffle.
pub(crate) fn unpack_scales(packed: &[u8; 12]) -> [i8; 16] {
    const KMASK1: u32 = 0x0303_0303;
    const KMASK2: u32 = 0x0f0f_0f0f;
    let word = |k: usize| {
        u32::from_le_bytes([packed[4 * k], packed[4 * k + 1], packed[4 * k + 2], packed[4 * k + 3]])
    };
    let (a0, a1, tmp) = (word(0), word(1), word(2));
    let aux = [
        (a0 & KMASK2) | ((tmp & KMASK1) << 4),
        (a1 & KMASK2) | (((tmp >> 2) & KMASK1) << 4),
        ((a0 >> 4) & KMASK2) | (((tmp >> 4) & KMASK1) << 4),
        ((a1 >> 4) & KMASK2) | (((tmp >> 6) & KMASK1) << 4),
    ];
    let mut out = [0i8; 16];
    for (k, a) in aux.iter().enumerate() {
        for (o, b) in out[4 * k..4 * k + 4].iter_mut().zip(a.to_le_bytes()) {
            *o = b as i8;
        }
    }
    out
}

/// The shared tail of both quantizers: final levels from the stored scales (sub-blocks with a zero
/// scale keep `l`), then the high bits into `hmask` and the low bits into `qs`.
fn finish(x: &[f32], y: &mut BlockQ3K, l: &mut [i8; QK_K]) {
    let d_all = fp16_to_fp32(y.d);
    for j in 0..QK_K / 16 {
        let d = d_all * get_scale(&y.scales, j) as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let q = clamp_c(nearest_int(x[16 * j + ii] / d), -4, 3);
            l[16 * j + ii] = (q + 4) as i8;
        }
    }
    y.hmask = [0; QK_K / 8];
    for (j, lj) in l.iter_mut().enumerate() {
        if *lj > 3 {
            y.hmask[j % (QK_K / 8)] |= 1u8 << (j / (QK_K / 8));
            *lj -= 4;
        }
    }
    for j in (0..QK_K).step_by(128) {
        for i in 0..32 {
            let v = l[j + i] as i32
                | ((l[j + i + 32] as i32) << 2)
                | ((l[j + i + 64] as i32) << 4)
                | ((l[j + i + 96] as i32) << 6);
            y.qs[j / 4 + i] = v as u8;
        }
    }
}

/// ggml's `quantize_row_q3_K_ref` for one super-block.
pub(crate) fn quantize_row_q3_K_ref(x: &[f32]) -> BlockQ3K {
    let mut y: BlockQ3K = bytemuck::Zeroable::zeroed();
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; QK_K / 16];

    let mut max_scale = 0.0f32;
    let mut amax = 0.0f32;
    for j in 0..QK_K / 16 {
        scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16], true);
        let scale = scales[j].abs();
        if scale > amax {
            amax = scale;
            max_scale = scales[j];
        }
    }

    y.scales = [0; 12];
    if max_scale != 0.0 {
        let iscale = -32.0f32 / max_scale;
        for (j, &s) in scales.iter().enumerate() {
            // ggml stores the rounded value in an int8_t before clamping.
            let q = nearest_int(iscale * s) as i8;
            set_scale(&mut y.scales, j, clamp_c(q as i32, -32, 31) + 32);
        }
        y.d = fp32_to_fp16(1.0 / iscale);
    } else {
        y.d = fp32_to_fp16(0.0);
    }
    finish(x, &mut y, &mut l);
    y
}

/// ggml's `quantize_row_q3_K_impl` (with an importance matrix) for one super-block.
pub(crate) fn quantize_row_q3_K_impl(x: &[f32], qw: &[f32]) -> BlockQ3K {
    let mut y: BlockQ3K = bytemuck::Zeroable::zeroed();
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; QK_K / 16];
    let mut weight = [0f32; 16];
    let mut sw = [0f32; QK_K / 16];
    let mut ls = [0i8; QK_K / 16];

    let mut sumx2 = 0.0f32;
    for &v in &x[..QK_K] {
        sumx2 += v * v;
    }
    let sigma2 = 2.0 * sumx2 / QK_K as f32;
    for j in 0..QK_K / 16 {
        let xs = &x[16 * j..16 * j + 16];
        for ((w, &q), &v) in weight.iter_mut().zip(&qw[16 * j..16 * j + 16]).zip(xs) {
            *w = q * (sigma2 + v * v).sqrt();
        }
        let mut sumw = 0.0f32;
        for &w in &weight {
            sumw += w;
        }
        sw[j] = sumw;
        scales[j] = make_qx_quants(4, xs, &mut l[16 * j..16 * j + 16], 1, Some(&weight));
    }

    y.scales = [0; 12];
    let d_block = make_qx_quants(32, &scales, &mut ls, 1, Some(&sw));
    for (j, &lj) in ls.iter().enumerate() {
        set_scale(&mut y.scales, j, lj as i32);
    }
    y.d = fp32_to_fp16(d_block);
    finish(x, &mut y, &mut l);
    y
}

/// ggml's `dequantize_row_q3_K` for one block.
pub(crate) fn dequantize_row_q3_K(b: &BlockQ3K, y: &mut [f32]) {
    let d_all = fp16_to_fp32(b.d);
    let scales = unpack_scales(&b.scales);
    let mut out = y.iter_mut();
    let mut is = 0;
    let mut m = 1u8;
    for n in 0..QK_K / 128 {
        let q = &b.qs[32 * n..32 * n + 32];
        for shift in [0, 2, 4, 6] {
            for half in [0, 16] {
                let dl = d_all * (scales[is] as i32 - 32) as f32;
                is += 1;
                let hm = &b.hmask[half..half + 16];
                // The finite side first, so `zip` never pulls an output it cannot fill.
                for ((&qv, &h), o) in q[half..half + 16].iter().zip(hm).zip(out.by_ref()) {
                    let v = ((qv >> shift) & 3) as i32 - if h & m != 0 { 0 } else { 4 };
                    *o = dl * v as f32;
                }
            }
            m = m.wrapping_shl(1);
        }
    }
}

/// ggml's `ggml_vec_dot_q3_K_q8_K_generic`.
pub(crate) fn vec_dot_q3_K_q8_K(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut sums = [0f32; 8];
    let mut aux8 = [0i8; QK_K];
    vec_dot_blocks::<BlockQ3K>(n, x, y, |xb, yb| {
        let mut aux32 = [0i32; 8];
        for (idx, a) in aux8.iter_mut().enumerate() {
            let (k, rest) = (idx / 128, idx % 128);
            let (shift, l) = (2 * (rest / 32), rest % 32);
            let bit = 1u8 << (idx / 32);
            let low = ((xb.qs[32 * k + l] >> shift) & 3) as i8;
            *a = low - if xb.hmask[l] & bit != 0 { 0 } else { 4 };
        }
        let scales = unpack_scales(&xb.scales);
        for (j, (q8, a)) in yb.qs.chunks_exact(16).zip(aux8.chunks_exact(16)).enumerate() {
            let s = scales[j] as i32 - 32;
            for half in [0, 8] {
                for l in 0..8 {
                    let p = q8[half + l] as i16 * a[half + l] as i16;
                    aux32[l] += s * p as i32;
                }
            }
        }
        let d = fp16_to_fp32(xb.d) * yb.d;
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
    });
    let mut sumf = 0.0f32;
    for s in sums {
        sumf += s;
    }
    sumf
}
