//! Integer forms of the block types whose vec-dot type is Q8_0 or Q8_1 (see the parent module):
//! unsigned codes, a float scale per 16 or 32 elements and, for Q4_1 / Q5_1, a float min.
//! Each scale is the float the type's dequantizer multiplies by, so `scale * (code - bias)`
//! (`+ min`) is its weight exactly.

use super::{BlockUnpackFn, IntFormat, Unpack};
use crate::dtype::DType;
use crate::quant::fp4::{BlockMxfp4, BlockNvfp4, KVALUES_MXFP4, e8m0_to_fp32_half, ue4m3_to_fp32};
use crate::quant::legacy::{
    BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, unpack_nibbles, unpack_q5,
};
use crate::quant::lowbit::{BlockQ1_0, BlockQ2_0};
use crate::quant::util::fp16_to_fp32;

/// MXFP4 / NVFP4 levels (doubled E2M1 values, -12..=12) made unsigned.
const FP4_BIAS: i32 = 12;

pub(super) fn int_format(d: DType) -> Option<IntFormat> {
    type Row = (usize, usize, i32, bool, u8, BlockUnpackFn);
    let (elems, sub, bias, has_min, max_code, f): Row = match d {
        DType::Q4_0 => (32, 32, 8, false, 15, unpack_q4_0),
        DType::Q4_1 => (32, 32, 0, true, 15, unpack_q4_1),
        DType::Q5_0 => (32, 32, 16, false, 31, unpack_q5_0),
        DType::Q5_1 => (32, 32, 0, true, 31, unpack_q5_1),
        DType::Q8_0 => (32, 32, 128, false, 255, unpack_q8_0),
        DType::IQ4_NL => (32, 32, 128, false, 255, unpack_iq4_nl),
        DType::MXFP4 => (32, 32, FP4_BIAS, false, 24, unpack_mxfp4),
        DType::NVFP4 => (64, 16, FP4_BIAS, false, 24, unpack_nvfp4),
        DType::Q1_0 => (128, 32, 1, false, 2, unpack_q1_0),
        DType::Q2_0 => (64, 32, 1, false, 3, unpack_q2_0),
        _ => return None,
    };
    let act = d.vec_dot_type();
    debug_assert!(act == DType::Q8_0 || act == DType::Q8_1);
    Some(IntFormat {
        sub,
        bias,
        has_min,
        max_code,
        act,
        unpack: Unpack::Blocks { elems, f },
        unit_scales: false,
        narrow_sums: false,
        fold: false,
        widen: false,
        radius: None,
        shift: 0,
        // `kvalues_iq4nl` starts at -127.
        min_code: if d == DType::IQ4_NL { 1 } else { 0 },
        sign: None,
        int_scaled: false,
        mins_bias: 0,
    })
}

fn block<T: bytemuck::AnyBitPattern>(b: &[u8]) -> T {
    bytemuck::pod_read_unaligned(b)
}

fn unpack_q4_0(b: &[u8], codes: &mut [u8], scales: &mut [f32], _: &mut [f32]) {
    let x: BlockQ4_0 = block(b);
    codes.copy_from_slice(&unpack_nibbles(&x.qs));
    scales[0] = fp16_to_fp32(x.d);
}

fn unpack_q4_1(b: &[u8], codes: &mut [u8], scales: &mut [f32], mins: &mut [f32]) {
    let x: BlockQ4_1 = block(b);
    codes.copy_from_slice(&unpack_nibbles(&x.qs));
    scales[0] = fp16_to_fp32(x.d);
    mins[0] = fp16_to_fp32(x.m);
}

fn unpack_q5_0(b: &[u8], codes: &mut [u8], scales: &mut [f32], _: &mut [f32]) {
    let x: BlockQ5_0 = block(b);
    codes.copy_from_slice(&unpack_q5(&x.qs, x.qh));
    scales[0] = fp16_to_fp32(x.d);
}

fn unpack_q5_1(b: &[u8], codes: &mut [u8], scales: &mut [f32], mins: &mut [f32]) {
    let x: BlockQ5_1 = block(b);
    codes.copy_from_slice(&unpack_q5(&x.qs, x.qh));
    scales[0] = fp16_to_fp32(x.d);
    mins[0] = fp16_to_fp32(x.m);
}

/// Q8_0: the signed levels plus 128.
fn unpack_q8_0(b: &[u8], codes: &mut [u8], scales: &mut [f32], _: &mut [f32]) {
    let x: BlockQ8_0 = block(b);
    // Byte-wise, so the same in either byte order.
    let words = bytemuck::cast::<[i8; 32], [u64; 4]>(x.qs).map(|w| w ^ 0x8080_8080_8080_8080);
    codes.copy_from_slice(&bytemuck::cast::<[u64; 4], [u8; 32]>(words));
    scales[0] = fp16_to_fp32(x.d);
}

/// Low nibbles are elements 0..16, high nibbles 16..32, each looked up in `lut`.
fn nibbles_lut(qs: &[u8; 16], lut: &[u8; 16], codes: &mut [u8]) {
    let (lo, hi) = codes.split_at_mut(16);
    for ((l, h), &q) in lo.iter_mut().zip(hi.iter_mut()).zip(qs) {
        *l = lut[(q & 0xf) as usize];
        *h = lut[(q >> 4) as usize];
    }
}

/// IQ4_NL: `kvalues_iq4nl` plus 128.
fn unpack_iq4_nl(b: &[u8], codes: &mut [u8], scales: &mut [f32], _: &mut [f32]) {
    let x: crate::quant::iq::iq4::BlockIQ4NL = block(b);
    nibbles_lut(&x.qs, &super::IQ4NL_CODES, codes);
    scales[0] = fp16_to_fp32(x.d);
}

/// MXFP4 / NVFP4 levels plus [`FP4_BIAS`]: their unsigned codes.
pub(crate) const FP4_CODES: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (KVALUES_MXFP4[i] as i32 + FP4_BIAS) as u8;
        i += 1;
    }
    t
};

/// MXFP4: doubled E2M1 levels plus 12, the E8M0 scale halved (as its dequantizer).
fn unpack_mxfp4(b: &[u8], codes: &mut [u8], scales: &mut [f32], _: &mut [f32]) {
    let x: BlockMxfp4 = block(b);
    nibbles_lut(&x.qs, &FP4_CODES, codes);
    scales[0] = e8m0_to_fp32_half(x.e);
}

/// NVFP4: four sub-blocks of 16, each with its UE4M3 scale; within one, low nibbles are
/// elements 0..8 and high nibbles 8..16.
fn unpack_nvfp4(b: &[u8], codes: &mut [u8], scales: &mut [f32], _: &mut [f32]) {
    let x: BlockNvfp4 = block(b);
    let lut = FP4_CODES;
    for (s, out) in codes.chunks_exact_mut(16).enumerate() {
        let (lo, hi) = out.split_at_mut(8);
        for ((l, h), &q) in lo.iter_mut().zip(hi.iter_mut()).zip(&x.qs[8 * s..8 * s + 8]) {
            *l = lut[(q & 0xf) as usize];
            *h = lut[(q >> 4) as usize];
        }
        scales[s] = ue4m3_to_fp32(x.d[s]);
    }
}

/// Q1_0: bit set means +d, clear -d: codes 2 and 0 with bias 1.
fn unpack_q1_0(b: &[u8], codes: &mut [u8], scales: &mut [f32], _: &mut [f32]) {
    let x: BlockQ1_0 = block(b);
    for (j, c) in codes.iter_mut().enumerate() {
        *c = ((x.qs[j / 8] >> (j % 8)) & 1) << 1;
    }
    scales.fill(fp16_to_fp32(x.d));
}

/// Q2_0: 2-bit codes with bias 1.
fn unpack_q2_0(b: &[u8], codes: &mut [u8], scales: &mut [f32], _: &mut [f32]) {
    let x: BlockQ2_0 = block(b);
    for (j, c) in codes.iter_mut().enumerate() {
        *c = (x.qs[j / 4] >> ((j % 4) * 2)) & 3;
    }
    scales.fill(fp16_to_fp32(x.d));
}
