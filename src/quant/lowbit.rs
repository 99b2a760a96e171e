//! The 1- and 2-bit formats Q1_0 (128 signs and a mean-magnitude scale) and Q2_0 (64 values in
//! {-1, 0, 1, 2} times the block's maximum magnitude), as ggml defines them (src/ggml-common.h,
//! src/ggml-quants.c, src/ggml-cpu/quants.c). Both are dotted against Q8_0.
//!
//! ggml's `quantize_q1_0`/`quantize_q2_0` accept an importance matrix but quantize row by row with
//! the reference code, so the bytes do not depend on it; the same holds here.

use bytemuck::{Pod, Zeroable};

use super::FormatFns;
use super::legacy::{BlockQ8_0, cvtt_i32, with_blocks, with_blocks_mut};
use super::util::{fp16_to_fp32, fp32_to_fp16};
use crate::error::Result;

pub(crate) const QK1_0: usize = 128;
pub(crate) const QK2_0: usize = 64;

/// `block_q1_0`: bit j of `qs` is 1 when element j is >= 0.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub(crate) struct BlockQ1_0 {
    pub d: u16,
    pub qs: [u8; QK1_0 / 8],
}
const _: () = assert!(std::mem::size_of::<BlockQ1_0>() == 18);

/// `block_q2_0`: 2-bit codes, element j at bits `2 * (j % 4)` of byte `j / 4`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub(crate) struct BlockQ2_0 {
    pub d: u16,
    pub qs: [u8; QK2_0 / 4],
}
const _: () = assert!(std::mem::size_of::<BlockQ2_0>() == 18);

// ------------------------------------------------------------------------------------------------
// Q1_0

/// `quantize_row_q1_0_ref`.
pub(crate) fn quantize_row_q1_0_ref(src: &[f32], dst: &mut [BlockQ1_0]) {
    for (x, y) in src.chunks_exact(QK1_0).zip(dst) {
        let mut sum_abs = 0.0f32;
        for &v in x {
            sum_abs += v.abs();
        }
        y.d = fp32_to_fp16(sum_abs / QK1_0 as f32);
        y.qs = [0; QK1_0 / 8];
        for (j, &v) in x.iter().enumerate() {
            if v >= 0.0 {
                y.qs[j / 8] |= 1 << (j % 8);
            }
        }
    }
}

fn quantize_q1_0(src: &[f32], dst: &mut [u8], _n: usize, _imatrix: Option<&[f32]>) -> Result<()> {
    with_blocks_mut(dst, |y| quantize_row_q1_0_ref(src, y));
    Ok(())
}

fn dequantize_q1_0(src: &[u8], dst: &mut [f32]) {
    with_blocks::<BlockQ1_0, _>(src, |x| {
        for (b, y) in x.iter().zip(dst.chunks_exact_mut(QK1_0)) {
            let d = fp16_to_fp32(b.d);
            for (j, o) in y.iter_mut().enumerate() {
                *o = if (b.qs[j / 8] >> (j % 8)) & 1 != 0 { d } else { -d };
            }
        }
    })
}

/// `ggml_vec_dot_q1_0_q8_0`: one Q1_0 block spans four Q8_0 blocks.
pub(crate) fn vec_dot_q1_0_q8_0(_n: usize, x: &[u8], y: &[u8]) -> f32 {
    with_blocks::<BlockQ1_0, _>(x, |x| {
        with_blocks::<BlockQ8_0, _>(y, |y| {
            let mut sumf = 0.0f32;
            for (bx, by) in x.iter().zip(y.chunks_exact(4)) {
                let d0 = fp16_to_fp32(bx.d);
                let mut sumi = 0.0f32;
                for (k, yb) in by.iter().enumerate() {
                    let mut s = 0i32;
                    for (j, &q) in yb.qs.iter().enumerate() {
                        let bit = (bx.qs[k * 4 + j / 8] >> (j % 8)) & 1;
                        s += if bit != 0 { q as i32 } else { -(q as i32) };
                    }
                    sumi += fp16_to_fp32(yb.d) * s as f32;
                }
                sumf += d0 * sumi;
            }
            sumf
        })
    })
}

// ------------------------------------------------------------------------------------------------
// Q2_0

/// `quantize_row_q2_0_ref`.
pub(crate) fn quantize_row_q2_0_ref(src: &[f32], dst: &mut [BlockQ2_0]) {
    for (x, y) in src.chunks_exact(QK2_0).zip(dst) {
        let mut amax = 0.0f32;
        for &v in x {
            let a = v.abs();
            if a > amax {
                amax = a;
            }
        }
        let d = amax;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        y.d = fp32_to_fp16(d);
        y.qs = [0; QK2_0 / 4];
        for (j, &w) in x.iter().enumerate() {
            // `(int)roundf(w * id) + 1`, clamped to 0..=3.
            let q = cvtt_i32((w * id).round()).wrapping_add(1).clamp(0, 3) as u8;
            y.qs[j / 4] |= q << ((j % 4) * 2);
        }
    }
}

fn quantize_q2_0(src: &[f32], dst: &mut [u8], _n: usize, _imatrix: Option<&[f32]>) -> Result<()> {
    with_blocks_mut(dst, |y| quantize_row_q2_0_ref(src, y));
    Ok(())
}

fn dequantize_q2_0(src: &[u8], dst: &mut [f32]) {
    with_blocks::<BlockQ2_0, _>(src, |x| {
        for (b, y) in x.iter().zip(dst.chunks_exact_mut(QK2_0)) {
            let d = fp16_to_fp32(b.d);
            for (j, o) in y.iter_mut().enumerate() {
                let q = (b.qs[j / 4] >> ((j % 4) * 2)) & 3;
                *o = (q as i32 - 1) as f32 * d;
            }
        }
    })
}

/// `ggml_vec_dot_q2_0_q8_0`: one Q2_0 block spans two Q8_0 blocks.
pub(crate) fn vec_dot_q2_0_q8_0(_n: usize, x: &[u8], y: &[u8]) -> f32 {
    with_blocks::<BlockQ2_0, _>(x, |x| {
        with_blocks::<BlockQ8_0, _>(y, |y| {
            let mut sumf = 0.0f32;
            for (bx, by) in x.iter().zip(y.chunks_exact(2)) {
                let d0 = fp16_to_fp32(bx.d);
                let mut sumi = 0.0f32;
                for (k, yb) in by.iter().enumerate() {
                    let mut s = 0i32;
                    for (j, &q) in yb.qs.iter().enumerate() {
                        let code = (bx.qs[k * 8 + j / 4] >> ((j % 4) * 2)) & 3;
                        s += (code as i32 - 1) * q as i32;
                    }
                    sumi += fp16_to_fp32(yb.d) * s as f32;
                }
                sumf += d0 * sumi;
            }
            sumf
        })
    })
}

// ------------------------------------------------------------------------------------------------
// Format table entries.

pub(crate) const Q1_0_FNS: FormatFns = FormatFns {
    quantize: Some(quantize_q1_0),
    requires_imatrix: false,
    dequantize: Some(dequantize_q1_0),
    from_float: None,
    vec_dot: Some(vec_dot_q1_0_q8_0),
};

pub(crate) const Q2_0_FNS: FormatFns = FormatFns {
    quantize: Some(quantize_q2_0),
    requires_imatrix: false,
    dequantize: Some(dequantize_q2_0),
    from_float: None,
    vec_dot: Some(vec_dot_q2_0_q8_0),
};
