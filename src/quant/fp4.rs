//! The 4-bit float (E2M1) formats: MXFP4 (32 values, one E8M0 power-of-two scale) and NVFP4
//! (64 values, one UE4M3 scale per 16), as ggml stores them (src/ggml-common.h, src/ggml-quants.c,
//! src/ggml-impl.h, src/ggml-cpu/quants.c). Both are dotted against Q8_0.
//!
//! ggml ignores the importance matrix for both formats.

use bytemuck::{Pod, Zeroable};

use super::FormatFns;
use super::legacy::{BlockQ8_0, cvtt_i32, with_blocks, with_blocks_mut};
use super::util::fp16_to_fp32;
use crate::error::Result;

pub(crate) const QK_MXFP4: usize = 32;
pub(crate) const QK_NVFP4: usize = 64;
pub(crate) const QK_NVFP4_SUB: usize = 16;

/// `kvalues_mxfp4` (ggml-common.h `kvalues_fp4`): the E2M1 values doubled, indexed by the 4-bit
/// code. Carried as data because the codes are part of the format.
pub(crate) const KVALUES_MXFP4: [i8; 16] =
    [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `block_mxfp4`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub(crate) struct BlockMxfp4 {
    /// E8M0 shared exponent.
    pub e: u8,
    pub qs: [u8; QK_MXFP4 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockMxfp4>() == 17);

/// `block_nvfp4`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub(crate) struct BlockNvfp4 {
    /// UE4M3 scales, one per 16-value sub-block.
    pub d: [u8; QK_NVFP4 / QK_NVFP4_SUB],
    pub qs: [u8; QK_NVFP4 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockNvfp4>() == 36);

/// `2^k` for `k` in f32's normal exponent range.
#[inline(always)]
fn exp2i(k: i32) -> f32 {
    debug_assert!((-126..=127).contains(&k));
    f32::from_bits(((k + 127) as u32) << 23)
}

/// `ggml_e8m0_to_fp32_half`: `2^(e - 128)`, i.e. half the E8M0 value (the table holds doubled
/// E2M1 values).
#[inline(always)]
pub(crate) fn e8m0_to_fp32_half(e: u8) -> f32 {
    let bits = if e < 2 { 0x0020_0000u32 << e } else { (e as u32 - 1) << 23 };
    f32::from_bits(bits)
}

/// `ggml_ue4m3_to_fp32`: an unsigned E4M3 scale (bias 7), halved like [`e8m0_to_fp32_half`].
/// 0 and 0x7F decode to 0; the top bit is ignored.
#[inline(always)]
pub(crate) fn ue4m3_to_fp32(x: u8) -> f32 {
    if x == 0 || x == 0x7F {
        return 0.0;
    }
    let exp = ((x >> 3) & 0xF) as i32;
    let man = (x & 0x7) as f32;
    let raw = if exp == 0 { man * exp2i(-9) } else { (1.0 + man / 8.0) * exp2i(exp - 7) };
    raw * 0.5
}

/// `ggml_fp32_to_ue4m3`: rounds a positive scale to UE4M3 (round half up on the mantissa,
/// saturating at 448 / 0x7E); zero, negative and NaN give 0.
pub(crate) fn fp32_to_ue4m3(x: f32) -> u8 {
    // `!(x > 0)`: zero, negatives and NaN.
    if x.is_nan() || x <= 0.0 {
        return 0;
    }
    let x = if x > 448.0 { 448.0 } else { x };
    let bits = x.to_bits();
    let fp32_exp = ((bits >> 23) & 0xFF) as i32 - 127;
    let fp32_man = ((bits >> 20) & 0x7) as i32;
    let mut exp = fp32_exp + 7;
    if exp <= 0 {
        let man = cvtt_i32(x * 512.0 + 0.5).min(7);
        return if man < 1 { 0 } else { man as u8 };
    }
    if exp >= 15 {
        return 0x7E;
    }
    let mut man = fp32_man + ((bits >> 19) & 1) as i32;
    if man > 7 {
        man = 0;
        exp += 1;
        if exp >= 15 {
            return 0x7E;
        }
    }
    ((exp << 3) | man) as u8
}

/// `best_index_mxfp4`: the code whose value times `e` is nearest to `x` (first one on ties).
#[inline(always)]
fn best_index_mxfp4(x: f32, e: f32) -> u8 {
    let mut best = 0u8;
    let mut best_err = (KVALUES_MXFP4[0] as f32 * e - x).abs();
    for (i, &k) in KVALUES_MXFP4.iter().enumerate().skip(1) {
        let err = (k as f32 * e - x).abs();
        if err < best_err {
            best = i as u8;
            best_err = err;
        }
    }
    best
}

// ------------------------------------------------------------------------------------------------
// MXFP4

/// `quantize_row_mxfp4_ref`.
pub(crate) fn quantize_row_mxfp4_ref(src: &[f32], dst: &mut [BlockMxfp4]) {
    for (x, y) in src.chunks_exact(QK_MXFP4).zip(dst) {
        let mut amax = 0.0f32;
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
            }
        }
        // ggml converts `floor(log2(amax)) - 2 + 127` straight to uint8_t.
        let e = if amax > 0.0 { cvtt_i32(amax.log2().floor() - 2.0 + 127.0) as u8 } else { 0 };
        let d = e8m0_to_fp32_half(e);
        y.e = e;
        for j in 0..QK_MXFP4 / 2 {
            y.qs[j] = best_index_mxfp4(x[j], d) | (best_index_mxfp4(x[j + QK_MXFP4 / 2], d) << 4);
        }
    }
}

fn quantize_mxfp4(src: &[f32], dst: &mut [u8], _n: usize, _imatrix: Option<&[f32]>) -> Result<()> {
    with_blocks_mut(dst, |y| quantize_row_mxfp4_ref(src, y));
    Ok(())
}

fn dequantize_mxfp4(src: &[u8], dst: &mut [f32]) {
    with_blocks::<BlockMxfp4, _>(src, |x| {
        for (b, y) in x.iter().zip(dst.chunks_exact_mut(QK_MXFP4)) {
            let d = e8m0_to_fp32_half(b.e);
            for j in 0..QK_MXFP4 / 2 {
                y[j] = KVALUES_MXFP4[(b.qs[j] & 0x0F) as usize] as f32 * d;
                y[j + QK_MXFP4 / 2] = KVALUES_MXFP4[(b.qs[j] >> 4) as usize] as f32 * d;
            }
        }
    })
}

/// `ggml_vec_dot_mxfp4_q8_0`.
pub(crate) fn vec_dot_mxfp4_q8_0(_n: usize, x: &[u8], y: &[u8]) -> f32 {
    with_blocks::<BlockMxfp4, _>(x, |x| {
        with_blocks::<BlockQ8_0, _>(y, |y| {
            let mut sumf = 0.0f32;
            for (bx, by) in x.iter().zip(y) {
                let d = fp16_to_fp32(by.d) * e8m0_to_fp32_half(bx.e);
                let (mut s1, mut s2) = (0i32, 0i32);
                for j in 0..QK_MXFP4 / 2 {
                    s1 += by.qs[j] as i32 * KVALUES_MXFP4[(bx.qs[j] & 0x0F) as usize] as i32;
                    s2 += by.qs[j + 16] as i32 * KVALUES_MXFP4[(bx.qs[j] >> 4) as usize] as i32;
                }
                sumf += d * (s1 + s2) as f32;
            }
            sumf
        })
    })
}

// ------------------------------------------------------------------------------------------------
// NVFP4

/// `quantize_row_nvfp4_ref`.
pub(crate) fn quantize_row_nvfp4_ref(src: &[f32], dst: &mut [BlockNvfp4]) {
    const HALF: usize = QK_NVFP4_SUB / 2;
    for (x, y) in src.chunks_exact(QK_NVFP4).zip(dst) {
        for (s, xb) in x.chunks_exact(QK_NVFP4_SUB).enumerate() {
            let mut amax = 0.0f32;
            for &v in xb {
                if amax < v.abs() {
                    amax = v.abs();
                }
            }
            let ue = fp32_to_ue4m3(amax / 6.0);
            y.d[s] = ue;
            let d = ue4m3_to_fp32(ue);
            for j in 0..HALF {
                y.qs[s * HALF + j] =
                    best_index_mxfp4(xb[j], d) | (best_index_mxfp4(xb[j + HALF], d) << 4);
            }
        }
    }
}

fn quantize_nvfp4(src: &[f32], dst: &mut [u8], _n: usize, _imatrix: Option<&[f32]>) -> Result<()> {
    with_blocks_mut(dst, |y| quantize_row_nvfp4_ref(src, y));
    Ok(())
}

fn dequantize_nvfp4(src: &[u8], dst: &mut [f32]) {
    const HALF: usize = QK_NVFP4_SUB / 2;
    with_blocks::<BlockNvfp4, _>(src, |x| {
        for (b, y) in x.iter().zip(dst.chunks_exact_mut(QK_NVFP4)) {
            for (s, yb) in y.chunks_exact_mut(QK_NVFP4_SUB).enumerate() {
                let d = ue4m3_to_fp32(b.d[s]);
                for j in 0..HALF {
                    let q = b.qs[s * HALF + j];
                    yb[j] = KVALUES_MXFP4[(q & 0x0F) as usize] as f32 * d;
                    yb[j + HALF] = KVALUES_MXFP4[(q >> 4) as usize] as f32 * d;
                }
            }
        }
    })
}

/// `ggml_vec_dot_nvfp4_q8_0`: one NVFP4 block spans two Q8_0 blocks.
pub(crate) fn vec_dot_nvfp4_q8_0(_n: usize, x: &[u8], y: &[u8]) -> f32 {
    const HALF: usize = QK_NVFP4_SUB / 2;
    with_blocks::<BlockNvfp4, _>(x, |x| {
        with_blocks::<BlockQ8_0, _>(y, |y| {
            let mut sumf = 0.0f32;
            for (bx, by) in x.iter().zip(y.chunks_exact(2)) {
                for s in 0..4 {
                    let d = ue4m3_to_fp32(bx.d[s]);
                    let yb = &by[s / 2];
                    let off = (s % 2) * QK_NVFP4_SUB;
                    let dy = fp16_to_fp32(yb.d);
                    let (mut lo, mut hi) = (0i32, 0i32);
                    for j in 0..HALF {
                        let q = bx.qs[s * HALF + j];
                        lo += yb.qs[off + j] as i32 * KVALUES_MXFP4[(q & 0x0F) as usize] as i32;
                        hi +=
                            yb.qs[off + j + HALF] as i32 * KVALUES_MXFP4[(q >> 4) as usize] as i32;
                    }
                    sumf += dy * d * (lo + hi) as f32;
                }
            }
            sumf
        })
    })
}

// ------------------------------------------------------------------------------------------------
// Format table entries.

pub(crate) const MXFP4_FNS: FormatFns = FormatFns {
    quantize: Some(quantize_mxfp4),
    requires_imatrix: false,
    dequantize: Some(dequantize_mxfp4),
    from_float: None,
    vec_dot: Some(vec_dot_mxfp4_q8_0),
};

pub(crate) const NVFP4_FNS: FormatFns = FormatFns {
    quantize: Some(quantize_nvfp4),
    requires_imatrix: false,
    dequantize: Some(dequantize_nvfp4),
    from_float: None,
    vec_dot: Some(vec_dot_nvfp4_q8_0),
};
