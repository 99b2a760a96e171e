//! The integer form (see `crate::quant::unpack`) of IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS
//! and IQ3_S: signed grid values `v` become codes `128 + v`, the odd sub-block scales `2*ls + 1`
//! are the integer scales and the constant factors (0.25, 0.5 and IQ1's 1/8 delta) go into `d`.
//!
//! Each group of 8 codes is built from a whole grid entry at once: grid magnitudes are below 128,
//! so `0x80 + g` and `0x80 - g` computed on the full u64 never carry between bytes, and an 8-byte
//! sign mask picks one or the other per byte.

use super::grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};
use super::iq1::{BlockIQ1M, BlockIQ1S, iq1m_sc, iq1m_scale};
use super::iq2::{BlockIQ2S, BlockIQ2XS, BlockIQ2XXS};
use super::iq3::{BlockIQ3S, BlockIQ3XXS, iq3s_index};
use crate::dtype::{DType, QK_K};
use crate::quant::unpack::{IntFormat, UnpackFn};
use crate::quant::util::fp16_to_fp32;

/// The integer form of the IQ1/IQ2/IQ3 types; `None` for every other type.
pub(crate) fn int_format(d: DType) -> Option<IntFormat> {
    // The radius: how far a code can lie from the bias, the largest grid value (IQ1: 8 g +
    // delta with g in -1..=1 and delta +-1; IQ2 grids 8, 25, 43; IQ3_XXS 4..=62; IQ3_S 1..=15),
    // checked for any bytes by `grid_codes_stay_within_their_radius`.
    let (sub, radius, unpack): (usize, u8, UnpackFn) = match d {
        DType::IQ1_S => (32, 9, unpack_iq1_s),
        DType::IQ1_M => (16, 9, unpack_iq1_m),
        DType::IQ2_XXS => (32, 43, unpack_iq2_xxs),
        DType::IQ2_XS => (16, 43, unpack_iq2_xs),
        DType::IQ2_S => (16, 43, unpack_iq2_s),
        DType::IQ3_XXS => (32, 62, unpack_iq3_xxs),
        DType::IQ3_S => (32, 15, unpack_iq3_s),
        _ => return None,
    };
    // IQ1_M's codes are 128 + 8 g + delta (g in -1..=1, delta = +-1): within 9 of the bias.
    let narrow_sums = d == DType::IQ1_M;
    Some(IntFormat {
        narrow_sums,
        radius: Some(radius),
        min_code: BIAS as u8 - radius,
        ..IntFormat::superblock(sub, BIAS, false, 255, unpack)
    })
}

const BIAS: i32 = 128;
const B80: u64 = 0x8080_8080_8080_8080;

/// `SIGN_MASK[s]`: byte `j` is 0xFF where bit `j` of sign byte `s` is set.
static SIGN_MASK: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut i = 0;
    while i < 256 {
        let mut m = 0u64;
        let mut j = 0;
        while j < 8 {
            if (i >> j) & 1 != 0 {
                m |= 0xFF << (8 * j);
            }
            j += 1;
        }
        t[i] = m;
        i += 1;
    }
    t
};

/// `KSIGN_MASK[k] == SIGN_MASK[KSIGNS_IQ2XS[k]]`: 7 stored sign bits, the 8th their parity.
static KSIGN_MASK: [u64; 128] = {
    let mut t = [0u64; 128];
    let mut i = 0;
    while i < 128 {
        t[i] = SIGN_MASK[i | ((i.count_ones() as usize & 1) << 7)];
        i += 1;
    }
    t
};

/// The codes `128 ± g` of 8 grid magnitudes `g` (each at most 128), negated where `neg` is 0xFF.
#[inline(always)]
fn signed8(grid: u64, neg: u64) -> [u8; 8] {
    (((B80 + grid) & !neg) | ((B80 - grid) & neg)).to_le_bytes()
}

/// The codes `128 + 8*g + delta` of an `iq1s_grid` entry (bytes 0xFF, 0, 1 for g = -1, 0, 1) with
/// `delta = ±1`: `(g << 3) & 0xF8` is `8*g` mod 256 per byte, `^ 0x80` adds 128 mod 256, and the
/// results (120, 128, 136) take ±1 without carries.
#[inline(always)]
fn iq1_codes(grid: u64, minus: bool) -> [u8; 8] {
    let c = ((grid << 3) & 0xF8F8_F8F8_F8F8_F8F8) ^ B80;
    let ones = 0x0101_0101_0101_0101;
    if minus { c - ones } else { c + ones }.to_le_bytes()
}

fn block<T: bytemuck::AnyBitPattern>(b: &[u8]) -> T {
    bytemuck::pod_read_unaligned(b)
}

/// `d * (2*ls + 1) * (g + delta)` with `delta = ±1/8`: scale `2*ls + 1`, `d / 8`.
fn unpack_iq1_s(
    b: &[u8],
    codes: &mut [u8; QK_K],
    scales: &mut [i32; 16],
    _: &mut [i32; 16],
) -> (f32, f32) {
    let x: BlockIQ1S = block(b);
    for (ib, (out, &qh)) in codes.chunks_exact_mut(32).zip(&x.qh).enumerate() {
        scales[ib] = 2 * ((qh >> 12) & 7) as i32 + 1;
        let minus = qh & 0x8000 != 0;
        let qs = &x.qs[4 * ib..4 * ib + 4];
        for (l, o) in out.chunks_exact_mut(8).enumerate() {
            let idx = qs[l] as usize | (((qh >> (3 * l)) & 7) as usize) << 8;
            o.copy_from_slice(&iq1_codes(IQ1S_GRID[idx], minus));
        }
    }
    (fp16_to_fp32(x.d) * 0.125, 0.0)
}

/// As IQ1_S with a scale per 16 elements and a delta sign per 8.
fn unpack_iq1_m(
    b: &[u8],
    codes: &mut [u8; QK_K],
    scales: &mut [i32; 16],
    _: &mut [i32; 16],
) -> (f32, f32) {
    let x: BlockIQ1M = block(b);
    let sc = iq1m_sc(&x);
    for (ib, out) in codes.chunks_exact_mut(32).enumerate() {
        let s = sc[ib / 2] >> (6 * (ib % 2));
        scales[2 * ib] = 2 * (s & 7) as i32 + 1;
        scales[2 * ib + 1] = 2 * ((s >> 3) & 7) as i32 + 1;
        let qs = &x.qs[4 * ib..4 * ib + 4];
        let (h0, h1) = (x.qh[2 * ib] as usize, x.qh[2 * ib + 1] as usize);
        let groups = [
            (qs[0] as usize | (h0 << 8) & 0x700, h0 & 0x08),
            (qs[1] as usize | (h0 << 4) & 0x700, h0 & 0x80),
            (qs[2] as usize | (h1 << 8) & 0x700, h1 & 0x08),
            (qs[3] as usize | (h1 << 4) & 0x700, h1 & 0x80),
        ];
        for (o, (idx, minus)) in out.chunks_exact_mut(8).zip(groups) {
            o.copy_from_slice(&iq1_codes(IQ1S_GRID[idx], minus != 0));
        }
    }
    (fp16_to_fp32(iq1m_scale(&sc)) * 0.125, 0.0)
}

/// `d * (0.5 + ls) * 0.25` is `(d / 8) * (2*ls + 1)`.
fn unpack_iq2_xxs(
    b: &[u8],
    codes: &mut [u8; QK_K],
    scales: &mut [i32; 16],
    _: &mut [i32; 16],
) -> (f32, f32) {
    let x: BlockIQ2XXS = block(b);
    for (ib, (out, q)) in codes.chunks_exact_mut(32).zip(x.qs.chunks_exact(4)).enumerate() {
        let idx = q[0] as u32 | (q[1] as u32) << 16;
        let sg = q[2] as u32 | (q[3] as u32) << 16;
        scales[ib] = 2 * (sg >> 28) as i32 + 1;
        for (l, o) in out.chunks_exact_mut(8).enumerate() {
            let grid = IQ2XXS_GRID[(idx >> (8 * l)) as u8 as usize];
            o.copy_from_slice(&signed8(grid, KSIGN_MASK[((sg >> (7 * l)) & 127) as usize]));
        }
    }
    (fp16_to_fp32(x.d) * 0.125, 0.0)
}

/// 4-bit scales, two per byte (low nibble first), as `2*ls + 1`.
#[inline(always)]
fn nibble_scales(packed: &[u8], scales: &mut [i32]) {
    for (s, &v) in scales.chunks_exact_mut(2).zip(packed) {
        s[0] = 2 * (v & 0xF) as i32 + 1;
        s[1] = 2 * (v >> 4) as i32 + 1;
    }
}

fn unpack_iq2_xs(
    b: &[u8],
    codes: &mut [u8; QK_K],
    scales: &mut [i32; 16],
    _: &mut [i32; 16],
) -> (f32, f32) {
    let x: BlockIQ2XS = block(b);
    nibble_scales(&x.scales, scales);
    for (o, &q) in codes.chunks_exact_mut(8).zip(&x.qs) {
        let grid = IQ2XS_GRID[(q & 511) as usize];
        o.copy_from_slice(&signed8(grid, KSIGN_MASK[(q >> 9) as usize]));
    }
    (fp16_to_fp32(x.d) * 0.125, 0.0)
}

fn unpack_iq2_s(
    b: &[u8],
    codes: &mut [u8; QK_K],
    scales: &mut [i32; 16],
    _: &mut [i32; 16],
) -> (f32, f32) {
    let x: BlockIQ2S = block(b);
    nibble_scales(&x.scales, scales);
    let (qs, signs) = x.qs.split_at(QK_K / 8);
    for (ib, out) in codes.chunks_exact_mut(32).enumerate() {
        let qh = x.qh[ib] as usize;
        for (l, o) in out.chunks_exact_mut(8).enumerate() {
            let k = 4 * ib + l;
            let grid = IQ2S_GRID[qs[k] as usize | (qh << (8 - 2 * l)) & 0x300];
            o.copy_from_slice(&signed8(grid, SIGN_MASK[signs[k] as usize]));
        }
    }
    (fp16_to_fp32(x.d) * 0.125, 0.0)
}

/// `d * (0.5 + ls) * 0.5` is `(d / 4) * (2*ls + 1)`.
fn unpack_iq3_xxs(
    b: &[u8],
    codes: &mut [u8; QK_K],
    scales: &mut [i32; 16],
    _: &mut [i32; 16],
) -> (f32, f32) {
    let x: BlockIQ3XXS = block(b);
    let (qs, sas) = x.qs.split_at(QK_K / 4);
    for (ib, (out, w)) in codes.chunks_exact_mut(32).zip(sas.chunks_exact(4)).enumerate() {
        let aux = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        scales[ib] = 2 * (aux >> 28) as i32 + 1;
        let q = &qs[8 * ib..8 * ib + 8];
        for (l, o) in out.chunks_exact_mut(8).enumerate() {
            let grid = IQ3XXS_GRID[q[2 * l] as usize] as u64
                | (IQ3XXS_GRID[q[2 * l + 1] as usize] as u64) << 32;
            o.copy_from_slice(&signed8(grid, KSIGN_MASK[((aux >> (7 * l)) & 127) as usize]));
        }
    }
    (fp16_to_fp32(x.d) * 0.25, 0.0)
}

/// `d * (1 + 2*ls)`: `d` as stored.
fn unpack_iq3_s(
    b: &[u8],
    codes: &mut [u8; QK_K],
    scales: &mut [i32; 16],
    _: &mut [i32; 16],
) -> (f32, f32) {
    let x: BlockIQ3S = block(b);
    nibble_scales(&x.scales, scales);
    for (ib, out) in codes.chunks_exact_mut(32).enumerate() {
        let qs = &x.qs[8 * ib..8 * ib + 8];
        for (l, o) in out.chunks_exact_mut(8).enumerate() {
            let (i1, i2) = iq3s_index(qs, x.qh[ib], l);
            let grid = IQ3S_GRID[i1] as u64 | (IQ3S_GRID[i2] as u64) << 32;
            o.copy_from_slice(&signed8(grid, SIGN_MASK[x.signs[4 * ib + l] as usize]));
        }
    }
    (fp16_to_fp32(x.d), 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::iq::grids::KSIGNS_IQ2XS;
    use crate::quant::unpack::tests::check_type;

    #[test]
    fn ksign_masks_expand_ggml_sign_table() {
        for (k, &s) in KSIGNS_IQ2XS.iter().enumerate() {
            assert_eq!(KSIGN_MASK[k], SIGN_MASK[s as usize], "{k}");
        }
    }

    #[test]
    fn iq1_s_integer_form_rebuilds_the_dequantized_weights() {
        check_type(DType::IQ1_S);
    }

    #[test]
    fn iq1_m_integer_form_rebuilds_the_dequantized_weights() {
        check_type(DType::IQ1_M);
    }

    #[test]
    fn iq2_xxs_integer_form_rebuilds_the_dequantized_weights() {
        check_type(DType::IQ2_XXS);
    }

    #[test]
    fn iq2_xs_integer_form_rebuilds_the_dequantized_weights() {
        check_type(DType::IQ2_XS);
    }

    #[test]
    fn iq2_s_integer_form_rebuilds_the_dequantized_weights() {
        check_type(DType::IQ2_S);
    }

    #[test]
    fn iq3_xxs_integer_form_rebuilds_the_dequantized_weights() {
        check_type(DType::IQ3_XXS);
    }

    #[test]
    fn iq3_s_integer_form_rebuilds_the_dequantized_weights() {
        check_type(DType::IQ3_S);
    }
}
