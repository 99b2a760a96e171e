//! Whole-step unpackers for the integer GEMM (AVX2): the codes, float scales and mins that
//! `quant::unpack`'s per-block functions write for the legacy block types, IQ4_NL and MXFP4,
//! for up to 8 blocks (one 256-element step) per call, without a call per block; and IQ4_XS's
//! super-block unpacker with its table lookups done by `vpshufb`. ggml's
//! `bytes_from_nibbles_32` and `bytes_from_bits_32` (ggml-cpu/arch/x86/quants.c) are the same
//! byte moves.

use std::arch::x86_64::*;

use crate::dtype::{DType, QK_K};
use crate::kernels::igemm::UnpackStepFn;
use crate::quant::fp4::e8m0_to_fp32_half;
use crate::quant::unpack::{FP4_CODES, IQ4NL_CODES, UnpackFn, iq4_xs_scales};
use crate::quant::util::fp16_to_fp32;

const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q5_0: u8 = 2;
const Q5_1: u8 = 3;
const Q8_0: u8 = 4;
const IQ4_NL: u8 = 5;
const MXFP4: u8 = 6;

/// The step unpacker of `d`, for the types this file has one for.
pub(crate) fn unpack_for(d: DType) -> Option<UnpackStepFn> {
    Some(match d {
        DType::Q4_0 => step::<Q4_0>,
        DType::Q4_1 => step::<Q4_1>,
        DType::Q5_0 => step::<Q5_0>,
        DType::Q5_1 => step::<Q5_1>,
        DType::Q8_0 => step::<Q8_0>,
        DType::IQ4_NL => step::<IQ4_NL>,
        DType::MXFP4 => step::<MXFP4>,
        _ => return None,
    })
}

/// The super-block unpacker of `d`, for the types this file has one for.
pub(crate) fn unpack_super_for(d: DType) -> Option<UnpackFn> {
    match d {
        DType::IQ4_XS => Some(iq4_xs),
        DType::Q2_K => Some(q2_k),
        DType::Q3_K => Some(q3_k),
        DType::Q4_K => Some(q4_k),
        DType::Q5_K => Some(q5_k),
        DType::Q6_K => Some(q6_k),
        DType::TQ1_0 => Some(tq1_0),
        _ => None,
    }
}

/// `quant::unpack`'s portable unpacker of a K-quant compiled with AVX2 enabled: the same
/// code, whose byte loops the compiler then does 32 bytes at a time.
macro_rules! avx2_twin {
    ($name:ident, $portable:path) => {
        fn $name(
            b: &[u8],
            codes: &mut [u8; QK_K],
            scales: &mut [i32; 16],
            mins: &mut [i32; 16],
        ) -> (f32, f32) {
            #[target_feature(enable = "avx2")]
            fn body(
                b: &[u8],
                codes: &mut [u8; QK_K],
                scales: &mut [i32; 16],
                mins: &mut [i32; 16],
            ) -> (f32, f32) {
                $portable(b, codes, scales, mins)
            }
            // SAFETY: this file's unpackers are installed only in tiers that run on CPUs with
            // AVX2 (`plug_avx2`, `avx512::plug`).
            unsafe { body(b, codes, scales, mins) }
        }
    };
}

avx2_twin!(q2_k, crate::quant::unpack::unpack_q2_K);
avx2_twin!(q3_k, crate::quant::unpack::unpack_q3_K);
avx2_twin!(q4_k, crate::quant::unpack::unpack_q4_K);
avx2_twin!(q5_k, crate::quant::unpack::unpack_q5_K);
avx2_twin!(q6_k, crate::quant::unpack::unpack_q6_K);
avx2_twin!(tq1_0, crate::quant::unpack::unpack_tq1_0);

/// Bytes of one block of `KIND` (ggml's block structs: `d`, then `m`, `qh`, `qs`).
const fn block_bytes(kind: u8) -> usize {
    match kind {
        Q4_0 | IQ4_NL => 18,
        MXFP4 => 17,
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
        MXFP4 => 1,
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

#[target_feature(enable = "avx2,f16c")]
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
    let lut = match KIND {
        IQ4_NL => IQ4NL_CODES,
        MXFP4 => FP4_CODES,
        _ => [0; 16],
    };
    // SAFETY: 16 bytes read from a 16-byte array.
    let lut = unsafe { _mm_loadu_si128(lut.as_ptr() as *const __m128i) };
    // The blocks' f16 scales and mins, converted 8 at a time after the loop (F16C's
    // conversion is exact, as `fp16_to_fp32`).
    let (mut dh, mut mh) = ([0u16; 8], [0u16; 8]);
    for b in 0..nblk {
        // The caller's bound puts block b's block_bytes(KIND) bytes inside src: every read
        // below is at an offset plus length within them.
        let at = b * block_bytes(KIND);
        if KIND == MXFP4 {
            // SAFETY: at + 1 <= the block's end (MXFP4 blocks start with their E8M0 scale).
            scales[b] = e8m0_to_fp32_half(unsafe { *src.add(at) });
        } else {
            // SAFETY: at + 2 <= the block's end (the other blocks start with their f16 scale).
            dh[b] = unsafe { (src.add(at) as *const u16).read_unaligned() };
        }
        if KIND == Q4_1 || KIND == Q5_1 {
            // SAFETY: the min is bytes 2..4 of these blocks.
            mh[b] = unsafe { (src.add(at + 2) as *const u16).read_unaligned() };
        }
        let v = if KIND == Q8_0 {
            // SAFETY: Q8_0's 32 levels are bytes 2..34 of its 34.
            let q = unsafe { _mm256_loadu_si256(src.add(at + 2) as *const __m256i) };
            _mm256_xor_si256(q, _mm256_set1_epi8(-128))
        } else {
            // SAFETY: qs is the last 16 bytes of the block (qs_at + 16 == block_bytes).
            let q = unsafe { _mm_loadu_si128(src.add(at + qs_at(KIND)) as *const __m128i) };
            let (mut lo, mut hi) = (_mm_and_si128(q, m4), _mm_and_si128(_mm_srli_epi16(q, 4), m4));
            if KIND == IQ4_NL || KIND == MXFP4 {
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
    // Entries nblk..8 convert the zeros they hold (the caller zeroes a partial step's rest).
    // SAFETY: 16-byte reads of the 8 halves, 32-byte writes to the first 8 of 16 floats.
    unsafe {
        if KIND != MXFP4 {
            let d = _mm256_cvtph_ps(_mm_loadu_si128(dh.as_ptr() as *const __m128i));
            _mm256_storeu_ps(scales.as_mut_ptr(), d);
        }
        if KIND == Q4_1 || KIND == Q5_1 {
            let m = _mm256_cvtph_ps(_mm_loadu_si128(mh.as_ptr() as *const __m128i));
            _mm256_storeu_ps(mins.as_mut_ptr(), m);
        }
    }
}

/// IQ4_XS (136-byte blocks: f16 `d`, `scales_h`, 4 bytes `scales_l`, 128 bytes `qs`): the
/// `quant::unpack` codes (`kvalues_iq4nl` plus 128) and 6-bit scales minus 32.
fn iq4_xs(
    b: &[u8],
    codes: &mut [u8; QK_K],
    scales: &mut [i32; 16],
    _: &mut [i32; 16],
) -> (f32, f32) {
    let b: &[u8; 136] = b.try_into().expect("one IQ4_XS block");
    iq4_xs_scales(u16::from_le_bytes([b[2], b[3]]), &[b[4], b[5], b[6], b[7]], scales);
    // SAFETY: this file's unpackers are installed only in tiers that run on CPUs with AVX2
    // (`plug_avx2`, `avx512::plug`); the references are fixed-size arrays.
    unsafe { iq4_xs_codes(&b[8..].try_into().expect("128 bytes"), codes) };
    (fp16_to_fp32(u16::from_le_bytes([b[0], b[1]])), 0.0)
}

/// Two 32-element sub-blocks per 32 bytes of `qs`: the low nibbles of sub-block `ib` are its
/// first 16 codes, the high ones its last 16, each looked up in `kvalues_iq4nl` plus 128.
#[target_feature(enable = "avx2")]
fn iq4_xs_codes(qs: &[u8; 128], codes: &mut [u8; QK_K]) {
    // SAFETY: 16 bytes read from a 16-byte array.
    let lut = _mm256_broadcastsi128_si256(unsafe {
        _mm_loadu_si128(IQ4NL_CODES.as_ptr() as *const __m128i)
    });
    let m4 = _mm256_set1_epi8(0x0F);
    for i in 0..4 {
        // SAFETY: i < 4: bytes 32 i..32 i + 32 of the 128.
        let q = unsafe { _mm256_loadu_si256(qs.as_ptr().add(32 * i) as *const __m256i) };
        let lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(q, m4));
        let hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
        let p = codes.as_mut_ptr();
        // SAFETY: sub-blocks 2 i and 2 i + 1 are codes 64 i..64 i + 64 of the 256.
        unsafe {
            _mm256_storeu_si256(
                p.add(64 * i) as *mut __m256i,
                _mm256_permute2x128_si256(lo, hi, 0x20),
            );
            _mm256_storeu_si256(
                p.add(64 * i + 32) as *mut __m256i,
                _mm256_permute2x128_si256(lo, hi, 0x31),
            );
        }
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
        for d in [
            DType::Q4_0,
            DType::Q4_1,
            DType::Q5_0,
            DType::Q5_1,
            DType::Q8_0,
            DType::IQ4_NL,
            DType::MXFP4,
        ] {
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

    #[test]
    fn super_unpackers_write_what_the_portable_unpackers_write() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            eprintln!("skipped: no AVX2");
            return;
        }
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let types = [
            DType::IQ4_XS,
            DType::Q2_K,
            DType::Q3_K,
            DType::Q4_K,
            DType::Q5_K,
            DType::Q6_K,
            DType::TQ1_0,
        ];
        for d in types {
            let fast = unpack_super_for(d).unwrap();
            let Unpack::Super(f) = int_format(d).unwrap().unpack else { panic!() };
            let mut src = vec![0u8; d.type_size()];
            for _ in 0..64 {
                for x in src.iter_mut() {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                    *x = (seed >> 56) as u8;
                }
                src[1] &= 0x7b;
                let (mut c0, mut s0, mut m0) = ([0u8; QK_K], [0i32; 16], [0i32; 16]);
                let (mut c1, mut s1, mut m1) = ([0u8; QK_K], [0i32; 16], [0i32; 16]);
                let r0 = f(&src, &mut c0, &mut s0, &mut m0);
                let r1 = fast(&src, &mut c1, &mut s1, &mut m1);
                assert_eq!(c0, c1, "{d} codes");
                assert_eq!((s0, m0), (s1, m1), "{d} scales and mins");
                assert_eq!((r0.0.to_bits(), r0.1.to_bits()), (r1.0.to_bits(), r1.1.to_bits()));
            }
        }
    }
}
