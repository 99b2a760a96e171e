//! Q5_K: `x = d * scale * q - dmin * min` with 5-bit `q` (4 low bits in `qs`, the fifth in `qh`),
//! 8 sub-blocks of 32 with 6-bit scales and mins as in Q4_K (ggml's `block_q5_K`, 5.5 bits per
//! weight).

use super::helpers::get_scale_min_k4;
use super::q4_k::{dot_k4_block, quantize_k4_impl, quantize_k4_ref};
use super::vec_dot_blocks;
use crate::dtype::QK_K;
use crate::quant::util::fp16_to_fp32;

/// ggml's `block_q5_K`.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct BlockQ5K {
    /// Super-block scale for the scales (f16 bits).
    pub d: u16,
    /// Super-block scale for the mins (f16 bits).
    pub dmin: u16,
    /// 8 six-bit scales and 8 six-bit mins (see `get_scale_min_k4`).
    pub scales: [u8; 12],
    /// Fifth bit: bit `2k` (`2k+1`) of byte `l` belongs to element `l` (`l + 32`) of the k-th 64.
    pub qh: [u8; QK_K / 8],
    /// Low 4 bits, packed as in Q4_K.
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockQ5K>() == 176);

fn pack_q5(l: &[u8; QK_K], y: &mut BlockQ5K) {
    y.qh = [0; QK_K / 8];
    for (k, n) in (0..QK_K).step_by(64).enumerate() {
        let (m1, m2) = (1u8 << (2 * k), 2u8 << (2 * k));
        for j in 0..32 {
            let mut l1 = l[n + j];
            if l1 > 15 {
                l1 -= 16;
                y.qh[j] |= m1;
            }
            let mut l2 = l[n + j + 32];
            if l2 > 15 {
                l2 -= 16;
                y.qh[j] |= m2;
            }
            y.qs[n / 2 + j] = l1 | (l2 << 4);
        }
    }
}

/// ggml's `quantize_row_q5_K_ref` for one super-block.
pub(crate) fn quantize_row_q5_K_ref(x: &[f32]) -> BlockQ5K {
    let mut l = [0u8; QK_K];
    let (d, dmin, scales) = quantize_k4_ref(x, 31, -0.5, 15, &mut l);
    let mut y = BlockQ5K { d, dmin, scales, qh: [0; QK_K / 8], qs: [0; QK_K / 2] };
    pack_q5(&l, &mut y);
    y
}

/// ggml's `quantize_row_q5_K_impl` (with an importance matrix) for one super-block.
pub(crate) fn quantize_row_q5_K_impl(x: &[f32], qw: &[f32]) -> BlockQ5K {
    let mut l = [0u8; QK_K];
    let (d, dmin, scales) = quantize_k4_impl(x, Some(qw), 31, true, &mut l);
    let mut y = BlockQ5K { d, dmin, scales, qh: [0; QK_K / 8], qs: [0; QK_K / 2] };
    pack_q5(&l, &mut y);
    y
}

/// ggml's `dequantize_row_q5_K` for one block.
pub(crate) fn dequantize_row_q5_K(b: &BlockQ5K, y: &mut [f32]) {
    let d = fp16_to_fp32(b.d);
    let min = fp16_to_fp32(b.dmin);
    for (j, (ql, out)) in b.qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (sc1, m1) = get_scale_min_k4(2 * j, &b.scales);
        let (sc2, m2) = get_scale_min_k4(2 * j + 1, &b.scales);
        let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
        let (u1, u2) = (1u8 << (2 * j), 2u8 << (2 * j));
        let (lo, hi) = out.split_at_mut(32);
        for (l, (o, p)) in lo.iter_mut().zip(hi.iter_mut()).enumerate() {
            let h = b.qh[l];
            let q1 = (ql[l] & 0xF) as i32 + if h & u1 != 0 { 16 } else { 0 };
            let q2 = (ql[l] >> 4) as i32 + if h & u2 != 0 { 16 } else { 0 };
            *o = d1 * q1 as f32 - m1;
            *p = d2 * q2 as f32 - m2;
        }
    }
}

/// ggml's `ggml_vec_dot_q5_K_q8_K_generic`.
pub(crate) fn vec_dot_q5_K_q8_K(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut sums = [0f32; 8];
    let mut sumf = 0.0f32;
    let mut aux8 = [0i8; QK_K];
    vec_dot_blocks::<BlockQ5K>(n, x, y, |xb, yb| {
        for (j, (q, a)) in xb.qs.chunks_exact(32).zip(aux8.chunks_exact_mut(64)).enumerate() {
            let (m1, m2) = (1u8 << (2 * j), 2u8 << (2 * j));
            for (l, &qv) in q.iter().enumerate() {
                let h = xb.qh[l];
                a[l] = (qv & 0xF) as i8 + if h & m1 != 0 { 16 } else { 0 };
                a[l + 32] = (qv >> 4) as i8 + if h & m2 != 0 { 16 } else { 0 };
            }
        }
        sumf -= dot_k4_block(&aux8, &xb.scales, xb.d, xb.dmin, yb, &mut sums);
    });
    for s in sums {
        sumf += s;
    }
    sumf
}
