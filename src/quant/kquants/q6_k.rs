//! Q6_K: `x = d * scale * (q - 32)` with 6-bit `q` (4 low bits in `ql`, 2 high bits in `qh`),
//! 16 sub-blocks of 16 with signed 8-bit scales (ggml's `block_q6_K`, 6.5625 bits per weight).

use super::helpers::{GROUP_MAX_EPS, clamp_c, imin, make_qx_quants};
use super::vec_dot_blocks;
use crate::dtype::QK_K;
use crate::quant::util::{fp16_to_fp32, fp32_to_fp16, nearest_int};

/// ggml's `block_q6_K`.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct BlockQ6K {
    /// Low 4 bits: per 128, byte `l` holds elements `l` / `l+64`, byte `l+32` elements `l+32` /
    /// `l+96` (low / high nibble).
    pub ql: [u8; QK_K / 2],
    /// High 2 bits: per 128, byte `l` holds elements `l`, `l+32`, `l+64`, `l+96` (bits 0, 2, 4, 6).
    pub qh: [u8; QK_K / 4],
    /// Signed scale of each sub-block of 16.
    pub scales: [i8; QK_K / 16],
    /// Super-block scale (f16 bits).
    pub d: u16,
}
const _: () = assert!(size_of::<BlockQ6K>() == 210);

/// ggml's Q6_K quantizer, shared by `quantize_row_q6_K_ref` (`qw == None`) and
/// `quantize_row_q6_K_impl` (which passes the importance weights straight to `make_qx_quants`).
fn quantize_q6_K_block(x: &[f32], qw: Option<&[f32]>) -> BlockQ6K {
    let mut y: BlockQ6K = bytemuck::Zeroable::zeroed();
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; QK_K / 16];

    let mut max_scale = 0.0f32;
    let mut max_abs_scale = 0.0f32;
    for ib in 0..QK_K / 16 {
        let w = qw.map(|w| &w[16 * ib..16 * ib + 16]);
        let scale =
            make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..16 * ib + 16], 1, w);
        scales[ib] = scale;
        let abs_scale = scale.abs();
        if abs_scale > max_abs_scale {
            max_abs_scale = abs_scale;
            max_scale = scale;
        }
    }

    if max_abs_scale < GROUP_MAX_EPS {
        y.d = fp32_to_fp16(0.0);
        return y;
    }

    let iscale = -128.0f32 / max_scale;
    y.d = fp32_to_fp16(1.0 / iscale);
    for (s, &v) in y.scales.iter_mut().zip(&scales) {
        *s = imin(127, nearest_int(iscale * v)) as i8;
    }

    let d_all = fp16_to_fp32(y.d);
    for j in 0..QK_K / 16 {
        let d = d_all * y.scales[j] as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let q = clamp_c(nearest_int(x[16 * j + ii] / d), -32, 31);
            l[16 * j + ii] = (q + 32) as i8;
        }
    }

    for (k, j) in (0..QK_K).step_by(128).enumerate() {
        let (ql, qh) = (&mut y.ql[64 * k..64 * k + 64], &mut y.qh[32 * k..32 * k + 32]);
        for i in 0..32 {
            let v = |o: usize| l[j + i + o] as i32;
            ql[i] = ((v(0) & 0xF) | ((v(64) & 0xF) << 4)) as u8;
            ql[i + 32] = ((v(32) & 0xF) | ((v(96) & 0xF) << 4)) as u8;
            qh[i] = ((v(0) >> 4) | ((v(32) >> 4) << 2) | ((v(64) >> 4) << 4) | ((v(96) >> 4) << 6))
                as u8;
        }
    }
    y
}

/// ggml's `quantize_row_q6_K_ref` for one super-block.
pub(crate) fn quantize_row_q6_K_ref(x: &[f32]) -> BlockQ6K {
    quantize_q6_K_block(x, None)
}

/// ggml's `quantize_row_q6_K_impl` (with an importance matrix) for one super-block.
pub(crate) fn quantize_row_q6_K_impl(x: &[f32], qw: &[f32]) -> BlockQ6K {
    quantize_q6_K_block(x, Some(qw))
}

/// The signed levels (`-32..32`) of one block in element order.
fn unpack_q6(b: &BlockQ6K) -> [i8; QK_K] {
    let mut a = [0i8; QK_K];
    for (k, out) in a.chunks_exact_mut(128).enumerate() {
        let (ql, qh) = (&b.ql[64 * k..64 * k + 64], &b.qh[32 * k..32 * k + 32]);
        for l in 0..32 {
            let h = qh[l];
            out[l] = ((ql[l] & 0xF) | ((h & 3) << 4)) as i8 - 32;
            out[l + 32] = ((ql[l + 32] & 0xF) | (((h >> 2) & 3) << 4)) as i8 - 32;
            out[l + 64] = ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i8 - 32;
            out[l + 96] = ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i8 - 32;
        }
    }
    a
}

/// ggml's `dequantize_row_q6_K` for one block.
pub(crate) fn dequantize_row_q6_K(b: &BlockQ6K, y: &mut [f32]) {
    let d = fp16_to_fp32(b.d);
    let q = unpack_q6(b);
    for (j, (o, qv)) in y.iter_mut().zip(q).enumerate() {
        *o = d * b.scales[j / 16] as f32 * qv as f32;
    }
}

/// ggml's `ggml_vec_dot_q6_K_q8_K_generic`.
pub(crate) fn vec_dot_q6_K_q8_K(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut sums = [0f32; 8];
    vec_dot_blocks::<BlockQ6K>(n, x, y, |xb, yb| {
        let a = unpack_q6(xb);
        let mut aux32 = [0i32; 8];
        for (j, (q8, a)) in yb.qs.chunks_exact(16).zip(a.chunks_exact(16)).enumerate() {
            let scale = xb.scales[j] as i32;
            for half in [0, 8] {
                for l in 0..8 {
                    let p = q8[half + l] as i16 * a[half + l] as i16;
                    aux32[l] += scale * p as i32;
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
