//! Whole-step unpackers of the legacy block types for the integer GEMM (AVX2): the codes, float
//! scales and mins that `quant::unpack`'s per-block functions write, for up to 8 blocks (one
//! 256-element step) per call, without a call per block. ggml's `bytes_from_nibbles_32` and
//! `bytes_from_bits_32` (ggml-cpu/arch/x86/quants.c) are the same byte moves.

use std::arch::x86_64::*;

use crate::dtype::{DType, QK_K};
use crate::kernels::igemm::UnpackStepFn;
use crate::quant::iq::grids::KVALUES_IQ4NL;
use crate::quant::util::fp16_to_fp32;

const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q5_0: u8 = 2;
const Q5_1: u8 = 3;
const Q8_0: u8 = 4;
const IQ4_NL: u8 = 5;

/// The step unpacker of `d`, for the types this file has one for.
pub(crate) fn unpack_for(d: DType) -> Option<UnpackStepFn> {
    Some(match d {
        DType::Q4_0 => step::<Q4_0>,
        DType::Q4_1 => step::<Q4_1>,
        DType::Q5_0 => step::<Q5_0>,
        DType::Q5_1 => step::<Q5_1>,
        DType::Q8_0 => step::<Q8_0>,
        DType::IQ4_NL => step::<IQ4_NL>,
        _ => return None,
    })
}

/// Bytes of one block of `KIND` (ggml's block structs: `d`, then `m`, `qh`, `qs`).
const fn block_bytes(kind: u8) -> usize {
    match kind {
        Q4_0 | IQ4_NL => 18,
        Q4_1 => 20,
        Q5_0 => 22,
        Q5_1 => 24,
        _ => 34,
    }
}

/// Offset of `qs` in a block of `KIND` (4-bit and 5-bit kinds; its last 16 bytes).
const fn qs_at(kind: u8) -> usize {
    match kind {
        Q4_0 | IQ4_NL => 2,
        Q4_1 => 4,
        Q5_0 => 6,
        _ => 8,
    }
}

fn step<const KIND: u8>(
    src: &[u8],
    nblk: usize,
    codes: &mut [u8; QK_K],
    scales: &mut [f32; 16],
    mins: &mut [f32; 16],
) {
    // At most the blocks `src` holds and a step holds (32 codes each); callers pass exactly
    // these, the clamp makes the bound hold for any input.
    let nblk = nblk.min(src.len() / block_bytes(KIND)).min(QK_K / 32);
    // SAFETY: this file's unpackers are installed only in the AVX2 and AVX-512 tiers' integer
    // kernels (`plug_avx2`, `avx512::plug`), which run on CPUs with AVX2; `nblk` blocks lie
    // inside `src` and their 32 codes each inside `codes`.
    unsafe { step_avx2::<KIND>(src.as_ptr(), nblk, codes, scales, mins) }
}

#[target_feature(enable = "avx2")]
unsafe fn step_avx2<const KIND: u8>(
    src: *const u8,
    nblk: usize,
    codes: &mut [u8; QK_K],
    scales: &mut [f32; 16],
    mins: &mut [f32; 16],
) {
    let m4 = _mm_set1_epi8(0x0F);
    let shuf =
        _mm256_set_epi64x(0x0303_0303_0303_0303, 0x0202_0202_0202_0202, 0x0101_0101_0101_0101, 0);
    let bit_mask = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    let ones = _mm256_set1_epi64x(-1);
    let b16 = _mm256_set1_epi8(0x10);
    let lut = if KIND == IQ4_NL {
        let lut = KVALUES_IQ4NL.map(|v| (v as i32 + 128) as u8);
        // SAFETY: 16 bytes read from a 16-byte array.
        unsafe { _mm_loadu_si128(lut.as_ptr() as *const __m128i) }
    } else {
        _mm_setzero_si128()
    };
    for b in 0..nblk {
        // The caller's bound puts block b's block_bytes(KIND) bytes inside src: every read
        // below is at an offset plus length within them.
        let at = b * block_bytes(KIND);
        // SAFETY: at + 2 <= the block's end (every block starts with its f16 scale).
        scales[b] = fp16_to_fp32(unsafe { (src.add(at) as *const u16).read_unaligned() });
        if KIND == Q4_1 || KIND == Q5_1 {
            // SAFETY: the min is bytes 2..4 of these blocks.
            mins[b] = fp16_to_fp32(unsafe { (src.add(at + 2) as *const u16).read_unaligned() });
        }
        let v = if KIND == Q8_0 {
            // SAFETY: Q8_0's 32 levels are bytes 2..34 of its 34.
            let q = unsafe { _mm256_loadu_si256(src.add(at + 2) as *const __m256i) };
            _mm256_xor_si256(q, _mm256_set1_epi8(-128))
        } else {
            // SAFETY: qs is the last 16 bytes of the block (qs_at + 16 == block_bytes).
            let q = unsafe { _mm_loadu_si128(src.add(at + qs_at(KIND)) as *const __m128i) };
            let (mut lo, mut hi) = (_mm_and_si128(q, m4), _mm_and_si128(_mm_srli_epi16(q, 4), m4));
            if KIND == IQ4_NL {
                lo = _mm_shuffle_epi8(lut, lo);
                hi = _mm_shuffle_epi8(lut, hi);
            }
            let v = _mm256_set_m128i(hi, lo);
            if KIND == Q5_0 || KIND == Q5_1 {
                // SAFETY: qh is the 4 bytes before qs.
                let qh = unsafe { (src.add(at + qs_at(KIND) - 4) as *const u32).read_unaligned() };
                // Byte j holds qh's byte j / 8; it is all ones exactly when bit j of qh is set.
                let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(u32::from_le(qh) as i32), shuf);
                let bits = _mm256_cmpeq_epi8(_mm256_or_si256(bytes, bit_mask), ones);
                _mm256_or_si256(v, _mm256_and_si256(bits, b16))
            } else {
                v
            }
        };
        // SAFETY: b < nblk <= 8, so codes[32 b..32 b + 32] is inside the 256 codes.
        unsafe { _mm256_storeu_si256(codes.as_mut_ptr().add(b * 32) as *mut __m256i, v) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::unpack::{Unpack, int_format};

    #[test]
    fn step_unpackers_write_what_the_block_unpackers_write() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            eprintln!("skipped: no AVX2");
            return;
        }
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for d in [DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::IQ4_NL] {
            let fast = unpack_for(d).unwrap();
            let Unpack::Blocks { elems, f } = int_format(d).unwrap().unpack else { panic!() };
            let bs = d.type_size();
            for nblk in [8usize, 5, 1] {
                let mut src = vec![0u8; nblk * bs];
                for x in src.iter_mut() {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                    *x = (seed >> 56) as u8;
                }
                // Finite scales: f16 bytes below the exponent of infinity.
                for blk in src.chunks_exact_mut(bs) {
                    blk[1] &= 0x7b;
                    if d == DType::Q4_1 || d == DType::Q5_1 {
                        blk[3] &= 0x7b;
                    }
                }
                let (mut c0, mut s0, mut m0) = ([0u8; QK_K], [0f32; 16], [0f32; 16]);
                let (mut c1, mut s1, mut m1) = ([0u8; QK_K], [0f32; 16], [0f32; 16]);
                for (b, blk) in src.chunks_exact(bs).enumerate() {
                    f(blk, &mut c0[b * elems..][..elems], &mut s0[b..b + 1], &mut m0[b..b + 1]);
                }
                fast(&src, nblk, &mut c1, &mut s1, &mut m1);
                assert_eq!(c0, c1, "{d} codes, {nblk} blocks");
                assert_eq!(s0.map(f32::to_bits), s1.map(f32::to_bits), "{d} scales");
                assert_eq!(m0.map(f32::to_bits), m1.map(f32::to_bits), "{d} mins");
            }
        }
    }
}
