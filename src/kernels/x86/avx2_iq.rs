//! AVX2 tier of the i-quant dot products (needs AVX2, FMA and F16C; `plug` is only called after
//! `Isa::Avx2.is_supported()` confirmed all three).
//!
//! One kernel per IQ type, each the counterpart of ggml's AVX2 `ggml_vec_dot_iq*_q8_K` /
//! `ggml_vec_dot_iq4_nl_q8_0` (src/ggml-cpu/arch/x86/quants.c). The integer part may be arranged
//! differently from ggml's (integer sums are exact in any order); the float part (per-block
//! `fmadd` into eight lanes, ggml's horizontal sum, the final scale) follows ggml's order so the
//! results are the same bits as ggml's AVX2 build.
//!
//! Blocks are read straight from the byte slices, which may have any alignment: vectors with
//! `loadu`, scalars with `from_le_bytes`. Each kernel walks `chunks_exact` of the block sizes, so a
//! wrong length can only shorten the walk, never read out of bounds. The unsafe code is the
//! bounds-checked `loadu`/`storeu` helpers and the wrappers' calls.

// ggml's names (`vec_dot_iq2_xxs_q8_K`) so the code reads next to ggml's.
#![allow(non_snake_case)]

use super::avx2_quants::{F16_TO_F32, opaque};
use super::avx2_quants::{STREAM_PF, nibble_values_32, prefetch_lines, us8_sums};
use crate::dtype::{DType, QK_K};
use crate::kernels::KernelTable;
use crate::quant::iq::grids::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KVALUES_IQ4NL,
};
use crate::quant::iq::iq1::{BlockIQ1M, BlockIQ1S};
use crate::quant::iq::iq2::{BlockIQ2S, BlockIQ2XS, BlockIQ2XXS};
use crate::quant::iq::iq3::{BlockIQ3S, BlockIQ3XXS};
use crate::quant::iq::iq4::{BlockIQ4NL, BlockIQ4XS, QK4_NL};
use crate::quant::kquants::BlockQ8K;
use crate::quant::legacy::BlockQ8_0;
use std::arch::x86_64::*;
use std::mem::offset_of;

/// Registers the IQ kernels of this tier.
pub(crate) fn plug(t: &mut KernelTable, _: super::Avx2) {
    t.set_vec_dot(DType::IQ2_XXS, vec_dot_iq2_xxs_q8_K);
    t.set_vec_dot(DType::IQ2_XS, vec_dot_iq2_xs_q8_K);
    t.set_vec_dot(DType::IQ2_S, vec_dot_iq2_s_q8_K);
    t.set_vec_dot(DType::IQ3_XXS, vec_dot_iq3_xxs_q8_K);
    t.set_vec_dot(DType::IQ3_S, vec_dot_iq3_s_q8_K);
    t.set_vec_dot(DType::IQ1_S, vec_dot_iq1_s_q8_K);
    t.set_vec_dot(DType::IQ1_M, vec_dot_iq1_m_q8_K);
    if fast_pdep() {
        t.set_vec_dot(DType::IQ1_M, vec_dot_iq1_m_q8_K_bmi2);
        t.set_vec_dot(DType::IQ3_S, vec_dot_iq3_s_q8_K_bmi2);
    }
    t.set_vec_dot(DType::IQ4_NL, vec_dot_iq4_nl_q8_0);
    t.set_vec_dot(DType::IQ4_XS, vec_dot_iq4_xs_q8_K);
    // Decode variants prefetching the weight row (see `STREAM_PF`). IQ2_S on Zen 4, 4096 x 1 x
    // 14336, 2 threads, alternating: 3.13 -> 2.26 ms (3 rounds), 3.02 -> 2.84 (5 rounds); IQ3_XXS
    // 4.43 -> 3.61 ms (medians of 5 noisy rounds); IQ1_M measured no gain there (3.04 -> 3.14).
    t.set_vec_dot_stream(DType::IQ2_S, vec_dot_iq2_s_q8_K_stream);
    t.set_vec_dot_stream(DType::IQ3_XXS, vec_dot_iq3_xxs_q8_K_stream);
    t.set_vec_dot_stream(DType::IQ4_NL, vec_dot_iq4_nl_q8_0_stream);
    t.set_vec_dot_stream(DType::IQ4_XS, vec_dot_iq4_xs_q8_K_stream);
    // IQ4_NL's two-row form (see `VecDot2Fn`): one-process A/B, 4096 x 1 x 14336, 2 threads,
    // three runs, in L3 / from memory: 1.06-1.10x / 1.03-1.06x.
    t.set_vec_dot2_stream(DType::IQ4_NL, vec_dot2_iq4_nl_q8_0_stream);
    t.set_vec_dot_stream(
        DType::IQ3_S,
        if fast_pdep() { vec_dot_iq3_s_q8_K_bmi2_stream } else { vec_dot_iq3_s_q8_K_stream },
    );
}

macro_rules! safe_wrappers {
    ($($name:ident => $body:path;)*) => {$(
        /// Dot product (`VecDotFn`) on the AVX2 tier.
        pub(crate) fn $name(n: usize, x: &[u8], y: &[u8]) -> f32 {
            // SAFETY: this function only enters a `KernelTable` through `plug`, which is only called
            // after AVX2, FMA and F16C were detected.
            unsafe { $body(n, x, y) }
        }
    )*};
}
safe_wrappers! {
    vec_dot_iq2_xxs_q8_K => iq2_xxs_avx2;
    vec_dot_iq2_xs_q8_K => iq2_xs_avx2;
    vec_dot_iq2_s_q8_K => iq2_s_avx2::<0>;
    vec_dot_iq2_s_q8_K_stream => iq2_s_avx2::<STREAM_PF>;
    vec_dot_iq3_xxs_q8_K => iq3_xxs_avx2::<0>;
    vec_dot_iq3_xxs_q8_K_stream => iq3_xxs_avx2::<STREAM_PF>;
    vec_dot_iq3_s_q8_K => iq3_s_avx2::<0>;
    vec_dot_iq1_s_q8_K => iq1_s_avx2;
    vec_dot_iq1_m_q8_K => iq1_m_avx2;
    vec_dot_iq4_nl_q8_0 => iq4_nl_avx2::<0>;
    vec_dot_iq4_xs_q8_K => iq4_xs_avx2::<0>;
    vec_dot_iq3_s_q8_K_stream => iq3_s_avx2::<STREAM_PF>;
    vec_dot_iq4_nl_q8_0_stream => iq4_nl_avx2::<STREAM_PF>;
    vec_dot_iq4_xs_q8_K_stream => iq4_xs_avx2::<STREAM_PF>;
}

/// Two-row streaming dot (`VecDot2Fn`) on the AVX2 tier.
fn vec_dot2_iq4_nl_q8_0_stream(n: usize, x: [&[u8]; 2], y: &[u8]) -> [f32; 2] {
    // SAFETY: this function only enters a `KernelTable` through `plug`, which is only called
    // after AVX2, FMA and F16C were detected.
    unsafe { iq4_nl2_avx2::<STREAM_PF>(n, x, y) }
}

/// Dot product (`VecDotFn`) on the AVX2 tier with BMI2's `pdep` (IQ1_M).
pub(crate) fn vec_dot_iq1_m_q8_K_bmi2(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: this function only enters a `KernelTable` through `plug`, which is only called after
    // AVX2, FMA and F16C were detected, and only registers it after `fast_pdep` detected BMI2.
    unsafe { iq1_m_avx2_bmi2(n, x, y) }
}

/// Dot product (`VecDotFn`) on the AVX2 tier with BMI2's `pdep` (IQ3_S).
pub(crate) fn vec_dot_iq3_s_q8_K_bmi2(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: as `vec_dot_iq1_m_q8_K_bmi2`: registered only after AVX2, FMA, F16C and BMI2 were
    // detected.
    unsafe { iq3_s_avx2_bmi2::<0>(n, x, y) }
}

/// `vec_dot_iq3_s_q8_K_bmi2` prefetching the weights [`STREAM_PF`] bytes ahead (decode).
pub(crate) fn vec_dot_iq3_s_q8_K_bmi2_stream(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: as `vec_dot_iq3_s_q8_K_bmi2`.
    unsafe { iq3_s_avx2_bmi2::<STREAM_PF>(n, x, y) }
}

/// True when BMI2 is present and its `pdep` is fast: not on AMD (or Hygon) before Zen 3 (family
/// 0x19), where `pdep`/`pext` are microcoded (tens of cycles instead of one uop).
fn fast_pdep() -> bool {
    std::is_x86_feature_detected!("bmi2") && super::amd_family().is_none_or(|f| f >= 0x19)
}

/// Runs `$body` once for each listed value of `$k`, written out: the compiler keeps these short
/// loops rolled, while ggml's unrolls them, and unrolled every offset and shuffle is a constant.
macro_rules! unroll {
    ($k:ident in [$($v:literal),*] $body:block) => {{
        $({
            let $k: usize = $v;
            $body
        })*
    }};
}

// Byte offsets inside the blocks (the structs are `repr(C)` copies of ggml-common.h).
pub(super) const Q8K_SIZE: usize = size_of::<BlockQ8K>();
pub(super) const Q8K_QS: usize = offset_of!(BlockQ8K, qs);
const Q8K_BSUMS: usize = offset_of!(BlockQ8K, bsums);
const Q8_0_SIZE: usize = size_of::<BlockQ8_0>();

/// ggml's `keven_signs_q2xs` as 64-bit words: for each 7-bit sign index, eight bytes of `+1` or
/// `-1`; the eighth sign is the parity of the seven stored ones (as in `ksigns_iq2xs`).
static KEVEN_SIGNS: [u64; 128] = keven_signs();

const fn keven_signs() -> [u64; 128] {
    let mut t = [0u64; 128];
    let mut i = 0;
    while i < 128 {
        let s = i as u32 | ((i as u32).count_ones() & 1) << 7;
        let mut v = 0u64;
        let mut j = 0;
        while j < 8 {
            let b: u64 = if (s >> j) & 1 != 0 { 0xff } else { 0x01 };
            v |= b << (8 * j);
            j += 1;
        }
        t[i] = v;
        i += 1;
    }
    t
}

/// 32 bytes of `b` from `off` as a vector (any alignment).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn load256(b: &[u8], off: usize) -> __m256i {
    let s = &b[off..off + 32];
    // SAFETY: `s` is 32 readable bytes (the slice index checked it); `loadu` needs no alignment.
    unsafe { _mm256_loadu_si256(s.as_ptr().cast()) }
}

/// Stores a vector into 16 u16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn store256(dst: &mut [u16; 16], v: __m256i) {
    // SAFETY: `dst` is 32 writable bytes; `storeu` needs no alignment.
    unsafe { _mm256_storeu_si256(dst.as_mut_ptr().cast(), v) }
}

/// 16 bytes of `b` from `off` as a vector (any alignment).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn load128(b: &[u8], off: usize) -> __m128i {
    let s = &b[off..off + 16];
    // SAFETY: `s` is 16 readable bytes (the slice index checked it); `loadu` needs no alignment.
    unsafe { _mm_loadu_si128(s.as_ptr().cast()) }
}

// Little-endian scalars at any alignment. Copying a whole sub-slice (rather than gathering
// bytes) lets the compiler emit one load.
#[inline(always)]
fn rd_u16(b: &[u8], off: usize) -> u16 {
    let mut a = [0u8; 2];
    a.copy_from_slice(&b[off..off + 2]);
    u16::from_le_bytes(a)
}

#[inline(always)]
pub(super) fn rd_u32(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(a)
}

#[inline(always)]
pub(super) fn rd_u64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

#[inline(always)]
pub(super) fn rd_f32(b: &[u8], off: usize) -> f32 {
    f32::from_bits(rd_u32(b, off))
}

/// The IEEE half in the low 16 bits of `w` as f32, exactly as F16C converts it (ggml's
/// `GGML_CPU_FP16_TO_FP32` on x86), read from the conversion table as ggml's x86 code does: a load
/// instead of a `vmovd` and a `vcvtph2ps` on the vector ports these kernels are short of (IQ4_NL
/// converts four scales per 64 weights).
#[inline(always)]
pub(super) fn fp16(w: u32) -> f32 {
    F16_TO_F32[w as u16 as usize]
}

/// ggml's `hsum_float_8`, in its order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum_float_8(x: __m256) -> f32 {
    let mut r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}

/// Signed bytes times signed bytes, adjacent pairs summed to i16 (ggml's `mul_add_epi8`). Exact
/// while `y` has no -128, which Q8 activations never hold.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn mul_add_epi8(x: __m256i, y: __m256i) -> __m256i {
    _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
}

/// Four 64-bit table entries as one vector, lowest first.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn set4(a: u64, b: u64, c: u64, d: u64) -> __m256i {
    // Two 128-bit halves, then one lane insert: the shape ggml's `_mm256_set_epi64x` compiles to.
    let lo = _mm_insert_epi64(_mm_cvtsi64_si128(a as i64), b as i64, 1);
    let hi = _mm_insert_epi64(_mm_cvtsi64_si128(c as i64), d as i64, 1);
    _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1)
}

/// Eight 32-bit table entries as one vector, lowest first.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn set8(v: [u32; 8]) -> __m256i {
    let half = |v: &[u32]| {
        let x = _mm_cvtsi32_si128(v[0] as i32);
        let x = _mm_insert_epi32(x, v[1] as i32, 1);
        let x = _mm_insert_epi32(x, v[2] as i32, 2);
        _mm_insert_epi32(x, v[3] as i32, 3)
    };
    _mm256_inserti128_si256(_mm256_castsi128_si256(half(&v[..4])), half(&v[4..]), 1)
}

/// The 32 sign bits in `bits` (bit `k` for byte `k`) as a byte mask, 0xff where set.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn sign_mask_32(bits: u32) -> __m256i {
    let shuf =
        _mm256_set_epi64x(0x0303_0303_0303_0303, 0x0202_0202_0202_0202, 0x0101_0101_0101_0101, 0);
    let sel = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let b = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(bits as i32), shuf), sel);
    _mm256_cmpeq_epi8(b, sel)
}

/// For bytes that are 0 or a single set bit (`and` with one-bit masks): 127 where 0, negative
/// where set (bit + 127 wraps to 128..=255), never 0. So `_mm256_sign_epi8(q8, t)` negates `q8`
/// exactly where the bit is set, with the same bits as ggml's compare-to-mask and sign trick
/// (`q8` negated, -128 wrapping to itself): one add instead of a compare, an `xor` and a `sub`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn sign_carrier(bit: __m256i) -> __m256i {
    _mm256_add_epi8(bit, _mm256_set1_epi8(127))
}

/// Bytes `b` and `b + 1` of `v` as i16, each repeated over 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn widen_pair(v: __m128i, b: u64) -> __m256i {
    let pick = _mm_set_epi64x(
        ((b + 1) * 0x0101_0101_0101_0101) as i64,
        (b * 0x0101_0101_0101_0101) as i64,
    );
    _mm256_cvtepi8_epi16(_mm_shuffle_epi8(v, pick))
}

/// `q8` with the bytes negated where `mask` is 0xff.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn apply_sign(q8: __m256i, mask: __m256i) -> __m256i {
    _mm256_sub_epi8(_mm256_xor_si256(q8, mask), mask)
}

// ---------------------------------------------------------------------------------------------
// IQ2_XXS

#[target_feature(enable = "avx2,fma,f16c")]
fn iq2_xxs_avx2(n: usize, x: &[u8], y: &[u8]) -> f32 {
    const XS: usize = size_of::<BlockIQ2XXS>();
    const QS: usize = offset_of!(BlockIQ2XXS, qs);
    let mut accumf = _mm256_setzero_ps();
    for (xb, yb) in x.chunks_exact(XS).zip(y.chunks_exact(Q8K_SIZE)).take(n / QK_K) {
        let d = fp16(rd_u32(xb, 0)) * rd_f32(yb, 0);
        let mut sumi1 = _mm256_setzero_si256();
        let mut sumi2 = _mm256_setzero_si256();
        unroll!(k in [0, 1, 2, 3] {
            let q8_1 = load256(yb, Q8K_QS + 64 * k);
            let q8_2 = load256(yb, Q8K_QS + 64 * k + 32);
            // Two sub-blocks: per sub-block a word of 4 grid bytes, then 4x7 sign bits and a scale.
            let w1 = rd_u64(xb, QS + 16 * k);
            let w2 = rd_u64(xb, QS + 16 * k + 8);
            let g = |w: u64, j: u32| IQ2XXS_GRID[(w >> (8 * j)) as u8 as usize];
            let q2_1 = set4(g(w1, 0), g(w1, 1), g(w1, 2), g(w1, 3));
            let q2_2 = set4(g(w2, 0), g(w2, 1), g(w2, 2), g(w2, 3));
            let s = |w: u64, j: u32| KEVEN_SIGNS[((w >> (32 + 7 * j)) & 127) as usize];
            let s2_1 = set4(s(w1, 0), s(w1, 1), s(w1, 2), s(w1, 3));
            let s2_2 = set4(s(w2, 0), s(w2, 1), s(w2, 2), s(w2, 3));
            let (a1, a3) = ((w1 >> 32) as u32, (w2 >> 32) as u32);
            let dot1 = _mm256_maddubs_epi16(q2_1, _mm256_sign_epi8(q8_1, s2_1));
            let dot2 = _mm256_maddubs_epi16(q2_2, _mm256_sign_epi8(q8_2, s2_2));
            let ls1 = (2 * (a1 >> 28) + 1) as i16;
            let ls2 = (2 * (a3 >> 28) + 1) as i16;
            sumi1 = _mm256_add_epi32(sumi1, _mm256_madd_epi16(dot1, _mm256_set1_epi16(ls1)));
            sumi2 = _mm256_add_epi32(sumi2, _mm256_madd_epi16(dot2, _mm256_set1_epi16(ls2)));
        });
        let sumi = _mm256_cvtepi32_ps(_mm256_add_epi32(sumi1, sumi2));
        accumf = _mm256_fmadd_ps(_mm256_set1_ps(d), sumi, accumf);
    }
    0.125 * hsum_float_8(accumf)
}

// ---------------------------------------------------------------------------------------------
// IQ2_XS

#[target_feature(enable = "avx2,fma,f16c")]
fn iq2_xs_avx2(n: usize, x: &[u8], y: &[u8]) -> f32 {
    const XS: usize = size_of::<BlockIQ2XS>();
    const QS: usize = offset_of!(BlockIQ2XS, qs);
    const SCALES: usize = offset_of!(BlockIQ2XS, scales);
    // 0x80 where the index (a nibble) has an odd number of set bits: the implied eighth sign.
    let bit_helper = _mm256_set_epi64x(
        0x0080_8000_8000_0080,
        0x8000_0080_0080_8000u64 as i64,
        0x0080_8000_8000_0080,
        0x8000_0080_0080_8000u64 as i64,
    );
    // Spread sign byte 2g (g = 0..3, or 4..7 for the second pattern) over the 8 bytes of group g.
    let sign_shuffle_1 =
        _mm256_set_epi64x(0x0606_0606_0606_0606, 0x0404_0404_0404_0404, 0x0202_0202_0202_0202, 0);
    let sign_shuffle_2 = _mm256_add_epi8(sign_shuffle_1, _mm256_set1_epi8(8));
    let bit_sel = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let m511 = _mm256_set1_epi16(511);
    let m4 = _mm_set1_epi8(0xf);
    let mut gindex = [0u16; 16];
    let mut accumf = _mm256_setzero_ps();
    for (xb, yb) in x.chunks_exact(XS).zip(y.chunks_exact(Q8K_SIZE)).take(n / QK_K) {
        let d = fp16(rd_u32(xb, 0)) * rd_f32(yb, 0);
        // Sub-block scales 2*s+1, interleaved: byte 2i the low nibble of sub-block i, 2i+1 the high.
        let stmp = _mm_set1_epi64x(rd_u64(xb, SCALES) as i64);
        let stmp =
            _mm_unpacklo_epi8(_mm_and_si128(stmp, m4), _mm_and_si128(_mm_srli_epi16(stmp, 4), m4));
        let scales = _mm_add_epi8(_mm_slli_epi16(stmp, 1), _mm_set1_epi8(1));
        let mut sumi1 = _mm256_setzero_si256();
        let mut sumi2 = _mm256_setzero_si256();
        for k in 0..QK_K / 128 {
            let q2_data = load256(xb, QS + 32 * k);
            // The 16 grid indices, masked in one vector operation (as ggml does).
            store256(&mut gindex, _mm256_and_si256(q2_data, m511));
            let gi = &gindex;
            // Sign bits 9..15 of each index word, plus their parity as bit 7.
            let partial = _mm256_srli_epi16(q2_data, 9);
            let upper = _mm256_srli_epi16(q2_data, 13);
            let odd = _mm256_shuffle_epi8(bit_helper, _mm256_xor_si256(partial, upper));
            let full = _mm256_or_si256(partial, odd);
            let full_1 = _mm256_permute2x128_si256(full, full, 0x00);
            let full_2 = _mm256_permute2x128_si256(full, full, 0x11);
            let signs = [
                _mm256_shuffle_epi8(full_1, sign_shuffle_1),
                _mm256_shuffle_epi8(full_1, sign_shuffle_2),
                _mm256_shuffle_epi8(full_2, sign_shuffle_1),
                _mm256_shuffle_epi8(full_2, sign_shuffle_2),
            ];
            let g = |j: usize| IQ2XS_GRID[(gi[j] & 511) as usize];
            let mut dot = [_mm256_setzero_si256(); 4];
            for j in 0..4 {
                let q2 = set4(g(4 * j), g(4 * j + 1), g(4 * j + 2), g(4 * j + 3));
                let q8 = load256(yb, Q8K_QS + 128 * k + 32 * j);
                let neg = sign_carrier(_mm256_and_si256(signs[j], bit_sel));
                dot[j] = _mm256_maddubs_epi16(q2, _mm256_sign_epi8(q8, neg));
            }
            // Sub-block 4k+j: its low-nibble scale for the first 16 values, high for the rest.
            let b = 8 * k as u64;
            let p0 = _mm256_madd_epi16(dot[0], widen_pair(scales, b));
            let p1 = _mm256_madd_epi16(dot[1], widen_pair(scales, b + 2));
            let p2 = _mm256_madd_epi16(dot[2], widen_pair(scales, b + 4));
            let p3 = _mm256_madd_epi16(dot[3], widen_pair(scales, b + 6));
            sumi1 = _mm256_add_epi32(sumi1, _mm256_add_epi32(p0, p2));
            sumi2 = _mm256_add_epi32(sumi2, _mm256_add_epi32(p1, p3));
        }
        let sumi = _mm256_cvtepi32_ps(_mm256_add_epi32(sumi1, sumi2));
        accumf = _mm256_fmadd_ps(_mm256_set1_ps(d), sumi, accumf);
    }
    0.125 * hsum_float_8(accumf)
}

// ---------------------------------------------------------------------------------------------
// IQ2_S

#[target_feature(enable = "avx2,fma,f16c")]
fn iq2_s_avx2<const PF: usize>(n: usize, x: &[u8], y: &[u8]) -> f32 {
    const XS: usize = size_of::<BlockIQ2S>();
    const QS: usize = offset_of!(BlockIQ2S, qs);
    const SIGNS: usize = QS + QK_K / 8;
    const QH: usize = offset_of!(BlockIQ2S, qh);
    const SCALES: usize = offset_of!(BlockIQ2S, scales);
    let m4 = _mm_set1_epi8(0xf);
    let mut accumf = _mm256_setzero_ps();
    for (xb, yb) in x.chunks_exact(XS).zip(y.chunks_exact(Q8K_SIZE)).take(n / QK_K) {
        if PF > 0 {
            prefetch_lines::<XS>(xb.as_ptr(), PF);
        }
        let d = fp16(rd_u32(xb, 0)) * rd_f32(yb, 0);
        let aux64 = rd_u64(xb, SCALES);
        // i16 lane i: 2*low nibble of scale i + 1; lane 8+i: the same for the high nibble.
        let scales8 = _mm_add_epi8(
            _mm_slli_epi16(_mm_and_si128(_mm_set_epi64x((aux64 >> 4) as i64, aux64 as i64), m4), 1),
            _mm_set1_epi8(1),
        );
        let scales16 = _mm256_cvtepi8_epi16(scales8);
        let mut sumi1 = _mm256_setzero_si256();
        let mut sumi2 = _mm256_setzero_si256();
        unroll!(ib32 in [0, 2, 4, 6] {
            let q8_1 = load256(yb, Q8K_QS + 32 * ib32);
            let q8_2 = load256(yb, Q8K_QS + 32 * ib32 + 32);
            let qs = &xb[QS + 4 * ib32..QS + 4 * ib32 + 8];
            let (h1, h2) = (xb[QH + ib32] as usize, xb[QH + ib32 + 1] as usize);
            let g = |l: usize, h: usize, s: usize| IQ2S_GRID[qs[l] as usize | ((h << s) & 0x300)];
            let q2_1 = set4(g(0, h1, 8), g(1, h1, 6), g(2, h1, 4), g(3, h1, 2));
            let q2_2 = set4(g(4, h2, 8), g(5, h2, 6), g(6, h2, 4), g(7, h2, 2));
            let s2_1 = sign_mask_32(rd_u32(xb, SIGNS + 4 * ib32));
            let s2_2 = sign_mask_32(rd_u32(xb, SIGNS + 4 * ib32 + 4));
            let dot1 = _mm256_maddubs_epi16(q2_1, apply_sign(q8_1, s2_1));
            let dot2 = _mm256_maddubs_epi16(q2_2, apply_sign(q8_2, s2_2));
            let sh1 = _mm256_set1_epi16(((2 * ib32 as i16 + 1) << 8) | (2 * ib32 as i16));
            let sh2 = _mm256_add_epi8(sh1, _mm256_set1_epi8(2));
            // Opaque controls keep these two `vpshufb`s (see `opaque`).
            let p1 = _mm256_madd_epi16(dot1, _mm256_shuffle_epi8(scales16, opaque(sh1)));
            let p2 = _mm256_madd_epi16(dot2, _mm256_shuffle_epi8(scales16, opaque(sh2)));
            sumi1 = _mm256_add_epi32(sumi1, p1);
            sumi2 = _mm256_add_epi32(sumi2, p2);
        });
        let sumi = _mm256_cvtepi32_ps(_mm256_add_epi32(sumi1, sumi2));
        accumf = _mm256_fmadd_ps(_mm256_set1_ps(d), sumi, accumf);
    }
    0.125 * hsum_float_8(accumf)
}

// ---------------------------------------------------------------------------------------------
// IQ3_XXS

#[target_feature(enable = "avx2,fma,f16c")]
fn iq3_xxs_avx2<const PF: usize>(n: usize, x: &[u8], y: &[u8]) -> f32 {
    const XS: usize = size_of::<BlockIQ3XXS>();
    const QS: usize = offset_of!(BlockIQ3XXS, qs);
    const GAS: usize = QS + QK_K / 4;
    let mut accumf = _mm256_setzero_ps();
    for (xb, yb) in x.chunks_exact(XS).zip(y.chunks_exact(Q8K_SIZE)).take(n / QK_K) {
        if PF > 0 {
            prefetch_lines::<XS>(xb.as_ptr(), PF);
        }
        let d = fp16(rd_u32(xb, 0)) * rd_f32(yb, 0);
        let mut sumi1 = _mm256_setzero_si256();
        let mut sumi2 = _mm256_setzero_si256();
        unroll!(k in [0, 1, 2, 3] {
            let q8_1 = load256(yb, Q8K_QS + 64 * k);
            let q8_2 = load256(yb, Q8K_QS + 64 * k + 32);
            let q3 = &xb[QS + 16 * k..QS + 16 * k + 16];
            // Indices read 8 at a time and split in registers: fewer loads (the kernel is short of
            // load slots: 16 grid, 8 sign-table and the activation loads per 64 weights).
            let (i1, i2) = (rd_u64(q3, 0), rd_u64(q3, 8));
            let q2_1 = set8(std::array::from_fn(|j| IQ3XXS_GRID[(i1 >> (8 * j)) as u8 as usize]));
            let q2_2 = set8(std::array::from_fn(|j| IQ3XXS_GRID[(i2 >> (8 * j)) as u8 as usize]));
            let w = rd_u64(xb, GAS + 8 * k);
            let s = |sh: u32| KEVEN_SIGNS[((w >> sh) & 127) as usize];
            let s2_1 = set4(s(0), s(7), s(14), s(21));
            let s2_2 = set4(s(32), s(39), s(46), s(53));
            let (a0, a1) = (w as u32, (w >> 32) as u32);
            let dot1 = _mm256_maddubs_epi16(q2_1, _mm256_sign_epi8(q8_1, s2_1));
            let dot2 = _mm256_maddubs_epi16(q2_2, _mm256_sign_epi8(q8_2, s2_2));
            let ls1 = (2 * (a0 >> 28) + 1) as i16;
            let ls2 = (2 * (a1 >> 28) + 1) as i16;
            sumi1 = _mm256_add_epi32(sumi1, _mm256_madd_epi16(dot1, _mm256_set1_epi16(ls1)));
            sumi2 = _mm256_add_epi32(sumi2, _mm256_madd_epi16(dot2, _mm256_set1_epi16(ls2)));
        });
        let sumi = _mm256_cvtepi32_ps(_mm256_add_epi32(sumi1, sumi2));
        accumf = _mm256_fmadd_ps(_mm256_set1_ps(d), sumi, accumf);
    }
    0.25 * hsum_float_8(accumf)
}

// ---------------------------------------------------------------------------------------------
// IQ3_S

/// The end of one IQ3_S step (sub-blocks `ib32`, `ib32 + 1`), shared by the AVX2 and BMI2 kernels:
/// signs applied to the activations, dot products with the grid values, scaled into `sumi1` and
/// `sumi2`. A macro, like `iq1m_step`, so both loops keep their code.
macro_rules! iq3s_step {
    ($xb:ident, $ib32:ident, $q8_1:ident, $q8_2:ident, $q2_1:ident, $q2_2:ident, $sumi1:ident,
     $sumi2:ident) => {
        let s2_1 = sign_mask_32(rd_u32($xb, SIGNS + 4 * $ib32));
        let s2_2 = sign_mask_32(rd_u32($xb, SIGNS + 4 * $ib32 + 4));
        let dot1 = _mm256_maddubs_epi16($q2_1, apply_sign($q8_1, s2_1));
        let dot2 = _mm256_maddubs_epi16($q2_2, apply_sign($q8_2, s2_2));
        let sc = $xb[SCALES + $ib32 / 2];
        let ls1 = 2 * (sc & 0xf) as i16 + 1;
        let ls2 = 2 * (sc >> 4) as i16 + 1;
        $sumi1 = _mm256_add_epi32($sumi1, _mm256_madd_epi16(dot1, _mm256_set1_epi16(ls1)));
        $sumi2 = _mm256_add_epi32($sumi2, _mm256_madd_epi16(dot2, _mm256_set1_epi16(ls2)));
    };
}

#[target_feature(enable = "avx2,fma,f16c")]
fn iq3_s_avx2<const PF: usize>(n: usize, x: &[u8], y: &[u8]) -> f32 {
    const XS: usize = size_of::<BlockIQ3S>();
    const QS: usize = offset_of!(BlockIQ3S, qs);
    const QH: usize = offset_of!(BlockIQ3S, qh);
    const SIGNS: usize = offset_of!(BlockIQ3S, signs);
    const SCALES: usize = offset_of!(BlockIQ3S, scales);
    let idx_shift = _mm256_set_epi32(1, 2, 3, 4, 5, 6, 7, 8);
    let mut accumf = _mm256_setzero_ps();
    for (xb, yb) in x.chunks_exact(XS).zip(y.chunks_exact(Q8K_SIZE)).take(n / QK_K) {
        if PF > 0 {
            prefetch_lines::<XS>(xb.as_ptr(), PF);
        }
        let d = fp16(rd_u32(xb, 0)) * rd_f32(yb, 0);
        let mut sumi1 = _mm256_setzero_si256();
        let mut sumi2 = _mm256_setzero_si256();
        unroll!(ib32 in [0, 2, 4, 6] {
            let q8_1 = load256(yb, Q8K_QS + 32 * ib32);
            let q8_2 = load256(yb, Q8K_QS + 32 * ib32 + 32);
            // The 16 grid indices at once (as ggml): bit k of the qh byte, moved to bit 8, joins
            // the k-th low byte; then 16 table reads through memory.
            let idx_l = _mm256_cvtepu8_epi16(load128(xb, QS + 8 * ib32));
            let h = |b: u8| {
                _mm256_and_si256(
                    _mm256_sllv_epi32(_mm256_set1_epi32(b as i32), idx_shift),
                    _mm256_set1_epi32(256),
                )
            };
            let i1 = _mm256_or_si256(
                h(xb[QH + ib32]),
                _mm256_cvtepi16_epi32(_mm256_castsi256_si128(idx_l)),
            );
            let i2 = _mm256_or_si256(
                h(xb[QH + ib32 + 1]),
                _mm256_cvtepi16_epi32(_mm256_extracti128_si256::<1>(idx_l)),
            );
            let mut idx = [0u32; 16];
            // SAFETY: `idx` is 64 writable bytes; `storeu` needs no alignment.
            unsafe {
                _mm256_storeu_si256(idx.as_mut_ptr().cast(), i1);
                _mm256_storeu_si256(idx.as_mut_ptr().add(8).cast(), i2);
            }
            // Indices are below 512 by construction; the mask lets the compiler drop the checks.
            let q2_1 = set8(std::array::from_fn(|k| IQ3S_GRID[idx[k] as usize & 511]));
            let q2_2 = set8(std::array::from_fn(|k| IQ3S_GRID[idx[8 + k] as usize & 511]));
            iq3s_step!(xb, ib32, q8_1, q8_2, q2_1, q2_2, sumi1, sumi2);
        });
        let sumi = _mm256_cvtepi32_ps(_mm256_add_epi32(sumi1, sumi2));
        accumf = _mm256_fmadd_ps(_mm256_set1_ps(d), sumi, accumf);
    }
    hsum_float_8(accumf)
}

/// `iq3_s_avx2` with the grid indices built in general registers by `pdep` (four 9-bit indices
/// per u64: the qs bytes in the low bytes of the u16 lanes, the qh bits in bit 8) instead of in
/// vectors taken apart lane by lane: fewer uops where `pdep` is one (`fast_pdep`). The same
/// integer sums and float steps, so the same bits.
#[target_feature(enable = "avx2,fma,f16c,bmi2")]
fn iq3_s_avx2_bmi2<const PF: usize>(n: usize, x: &[u8], y: &[u8]) -> f32 {
    const XS: usize = size_of::<BlockIQ3S>();
    const QS: usize = offset_of!(BlockIQ3S, qs);
    const QH: usize = offset_of!(BlockIQ3S, qh);
    const SIGNS: usize = offset_of!(BlockIQ3S, signs);
    const SCALES: usize = offset_of!(BlockIQ3S, scales);
    const LO: u64 = 0x00ff_00ff_00ff_00ff;
    const HI: u64 = 0x0100_0100_0100_0100;
    let mut accumf = _mm256_setzero_ps();
    for (xb, yb) in x.chunks_exact(XS).zip(y.chunks_exact(Q8K_SIZE)).take(n / QK_K) {
        if PF > 0 {
            prefetch_lines::<XS>(xb.as_ptr(), PF);
        }
        let d = fp16(rd_u32(xb, 0)) * rd_f32(yb, 0);
        let mut sumi1 = _mm256_setzero_si256();
        let mut sumi2 = _mm256_setzero_si256();
        unroll!(ib32 in [0, 2, 4, 6] {
            let q8_1 = load256(yb, Q8K_QS + 32 * ib32);
            let q8_2 = load256(yb, Q8K_QS + 32 * ib32 + 32);
            let qh = rd_u16(xb, QH + ib32) as u64;
            let p = |k: usize| {
                _pdep_u64(rd_u32(xb, QS + 8 * ib32 + 4 * k) as u64, LO)
                    | _pdep_u64(qh >> (4 * k), HI)
            };
            let (p0, p1, p2, p3) = (p(0), p(1), p(2), p(3));
            let g = |p: u64, l: u32| {
                let i = (p >> (16 * l)) as u16 as usize;
                debug_assert!(i < IQ3S_GRID.len());
                // SAFETY: `i` is below 512 = IQ3S_GRID.len(): the `pdep` masks fill only bits
                // 0..9 of each u16 lane. Unchecked, so each lane is one `movzx`.
                unsafe { *IQ3S_GRID.get_unchecked(i) }
            };
            let q2_1 = set8([g(p0, 0), g(p0, 1), g(p0, 2), g(p0, 3), g(p1, 0), g(p1, 1), g(p1, 2), g(p1, 3)]);
            let q2_2 = set8([g(p2, 0), g(p2, 1), g(p2, 2), g(p2, 3), g(p3, 0), g(p3, 1), g(p3, 2), g(p3, 3)]);
            iq3s_step!(xb, ib32, q8_1, q8_2, q2_1, q2_2, sumi1, sumi2);
        });
        let sumi = _mm256_cvtepi32_ps(_mm256_add_epi32(sumi1, sumi2));
        accumf = _mm256_fmadd_ps(_mm256_set1_ps(d), sumi, accumf);
    }
    hsum_float_8(accumf)
}

// ---------------------------------------------------------------------------------------------
// IQ1_S

/// ggml's `IQ1S_DELTA` / `IQ1M_DELTA`.
pub(super) const IQ1_DELTA: f32 = 0.125;

#[target_feature(enable = "avx2,fma,f16c")]
fn iq1_s_avx2(n: usize, x: &[u8], y: &[u8]) -> f32 {
    const XS: usize = size_of::<BlockIQ1S>();
    const QS: usize = offset_of!(BlockIQ1S, qs);
    const QH: usize = offset_of!(BlockIQ1S, qh);
    let mut accum = _mm256_setzero_ps();
    let mut accum1 = 0.0f32;
    for (xb, yb) in x.chunks_exact(XS).zip(y.chunks_exact(Q8K_SIZE)).take(n / QK_K) {
        let mut sumi = _mm256_setzero_si256();
        let mut sumi1 = 0i32;
        for ib in (0..QK_K / 32).step_by(2) {
            let qs = &xb[QS + 4 * ib..QS + 4 * ib + 8];
            let (h1, h2) = (rd_u16(xb, QH + 2 * ib) as usize, rd_u16(xb, QH + 2 * ib + 2) as usize);
            let g =
                |l: usize, h: usize| IQ1S_GRID[qs[l] as usize | (((h >> (3 * (l % 4))) & 7) << 8)];
            let q1b_1 = set4(g(0, h1), g(1, h1), g(2, h1), g(3, h1));
            let q1b_2 = set4(g(4, h2), g(5, h2), g(6, h2), g(7, h2));
            let q8b_1 = load256(yb, Q8K_QS + 32 * ib);
            let q8b_2 = load256(yb, Q8K_QS + 32 * ib + 32);
            let dot1 = mul_add_epi8(q1b_1, q8b_1);
            let dot2 = mul_add_epi8(q1b_2, q8b_2);
            let ls1 = 2 * ((h1 >> 12) & 7) as i16 + 1;
            let ls2 = 2 * ((h2 >> 12) & 7) as i16 + 1;
            let p1 = _mm256_madd_epi16(dot1, _mm256_set1_epi16(ls1));
            let p2 = _mm256_madd_epi16(dot2, _mm256_set1_epi16(ls2));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p1, p2));
            let bs = |j: usize| rd_u16(yb, Q8K_BSUMS + 2 * j) as i16 as i32;
            let sgn = |h: usize| if h & 0x8000 != 0 { -1 } else { 1 };
            sumi1 += (bs(2 * ib) + bs(2 * ib + 1)) * sgn(h1) * ls1 as i32
                + (bs(2 * ib + 2) + bs(2 * ib + 3)) * sgn(h2) * ls2 as i32;
        }
        let d = rd_f32(yb, 0) * fp16(rd_u32(xb, 0));
        accum = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), accum);
        accum1 += d * sumi1 as f32;
    }
    hsum_float_8(accum) + IQ1_DELTA * accum1
}

// ---------------------------------------------------------------------------------------------
// IQ1_M

/// An IQ1_M block's header, shared by the AVX2 and BMI2 kernels: the f16 block scale `$scale`
/// (four nibbles spread over the 3-bit scales' words) and the sixteen 3-bit scales as `2 s + 1`
/// in i16 lanes (`$scales`). A macro, like `iq1m_step`, so both loops keep their code.
macro_rules! iq1m_scales {
    ($xb:ident, $shift:ident, $mask:ident, $mone:ident => $scale:ident, $scales:ident) => {
        let sc64 = rd_u64($xb, SCALES);
        let sc = [sc64 as u16, (sc64 >> 16) as u16, (sc64 >> 32) as u16, (sc64 >> 48) as u16];
        let $scale =
            (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
        let $scales = _mm256_srlv_epi64(_mm256_set1_epi64x(sc64 as i64), $shift);
        let $scales =
            _mm256_add_epi16(_mm256_slli_epi16(_mm256_and_si256($scales, $mask), 1), $mone);
    };
}

/// The end of one IQ1_M step (groups `ib`, `ib + 1`), shared by the AVX2 and BMI2 kernels: the grid
/// values and delta signs against the activations, scaled per 16 levels into `sumi1` (grid) and
/// `sumi2` (delta). A macro rather than a function: as an `#[inline]` target-feature function
/// it measured 20% slower (spills and bounds checks in the unrolled loop).
macro_rules! iq1m_step {
    ($yb:ident, $ib:ident, $q1b_1:ident, $q1b_2:ident, $delta1:ident, $delta2:ident, $scales:ident,
     $idx1:ident, $idx2:ident, $mone8:ident, $mtwo8:ident, $sumi1:ident, $sumi2:ident) => {
        let q8b_1 = load256($yb, Q8K_QS + 32 * $ib);
        let q8b_2 = load256($yb, Q8K_QS + 32 * $ib + 32);
        let dot1 = mul_add_epi8($q1b_1, q8b_1);
        let dot2 = mul_add_epi8($q1b_2, q8b_2);
        let dot3 = _mm256_maddubs_epi16($mone8, _mm256_sign_epi8(q8b_1, $delta1));
        let dot4 = _mm256_maddubs_epi16($mone8, _mm256_sign_epi8(q8b_2, $delta2));
        // Opaque controls keep these two `vpshufb`s (see `opaque`).
        let scale1 = _mm256_shuffle_epi8($scales, opaque($idx1));
        let scale2 = _mm256_shuffle_epi8($scales, opaque($idx2));
        $idx1 = _mm256_add_epi8($idx1, $mtwo8);
        $idx2 = _mm256_add_epi8($idx2, $mtwo8);
        let p1 = _mm256_madd_epi16(dot1, scale1);
        let p2 = _mm256_madd_epi16(dot2, scale2);
        let p3 = _mm256_madd_epi16(dot3, scale1);
        let p4 = _mm256_madd_epi16(dot4, scale2);
        $sumi1 = _mm256_add_epi32($sumi1, _mm256_add_epi32(p1, p2));
        $sumi2 = _mm256_add_epi32($sumi2, _mm256_add_epi32(p3, p4));
    };
}

#[target_feature(enable = "avx2,fma,f16c")]
fn iq1_m_avx2(n: usize, x: &[u8], y: &[u8]) -> f32 {
    const XS: usize = size_of::<BlockIQ1M>();
    const QS: usize = offset_of!(BlockIQ1M, qs);
    const QH: usize = offset_of!(BlockIQ1M, qh);
    const SCALES: usize = offset_of!(BlockIQ1M, scales);
    let mask = _mm256_set1_epi16(0x7);
    let mone = _mm256_set1_epi16(1);
    let mone8 = _mm256_set1_epi8(1);
    let mtwo8 = _mm256_set1_epi8(2);
    // Per 64-bit lane: the 3-bit scales of even sub-blocks' first halves, odd sub-blocks' first
    // halves (low 128 bits), then the second halves (high 128 bits).
    let scales_shift = _mm256_set_epi64x(9, 3, 6, 0);
    let delta_shuf1 = _mm256_set_epi64x(0x0101_0101_0101_0101, 0x0101_0101_0101_0101, 0, 0);
    let delta_shuf2 = _mm256_add_epi8(delta_shuf1, _mm256_set1_epi8(2));
    let delta_bit = _mm256_set_epi64x(
        0x8080_8080_8080_8080u64 as i64,
        0x0808_0808_0808_0808,
        0x8080_8080_8080_8080u64 as i64,
        0x0808_0808_0808_0808,
    );
    let mut accum1 = _mm256_setzero_ps();
    let mut accum2 = _mm256_setzero_ps();
    for (xb, yb) in x.chunks_exact(XS).zip(y.chunks_exact(Q8K_SIZE)).take(n / QK_K) {
        iq1m_scales!(xb, scales_shift, mask, mone => scale, scales);
        // Shuffles repeating i16 lane ib/2 (first halves) and 4 + ib/2 (second halves) of each
        // 128-bit half, moved on by one lane per step.
        let mut scales_idx1 = _mm256_set1_epi16(0x0100);
        let mut scales_idx2 = _mm256_set1_epi16(0x0908);
        let mut sumi1 = _mm256_setzero_si256();
        let mut sumi2 = _mm256_setzero_si256();
        unroll!(ib in [0, 2, 4, 6] {
            let qs = &xb[QS + 4 * ib..QS + 4 * ib + 8];
            let qh = &xb[QH + 2 * ib..QH + 2 * ib + 4];
            let g = |l: usize| {
                let h = qh[l / 2] as usize;
                IQ1S_GRID[qs[l] as usize | ((h << (8 - 4 * (l % 2))) & 0x700)]
            };
            let q1b_1 = set4(g(0), g(1), g(2), g(3));
            let q1b_2 = set4(g(4), g(5), g(6), g(7));
            // Group l's delta sign is bit 3 (even l) or 7 (odd l) of qh[l / 2]: -1 or +1 bytes.
            let qh32 = _mm256_set1_epi32(rd_u32(xb, QH + 2 * ib) as i32);
            let bits1 = _mm256_and_si256(_mm256_shuffle_epi8(qh32, delta_shuf1), delta_bit);
            let bits2 = _mm256_and_si256(_mm256_shuffle_epi8(qh32, delta_shuf2), delta_bit);
            let delta1 = _mm256_or_si256(_mm256_cmpeq_epi8(bits1, delta_bit), mone8);
            let delta2 = _mm256_or_si256(_mm256_cmpeq_epi8(bits2, delta_bit), mone8);
            iq1m_step!(yb, ib, q1b_1, q1b_2, delta1, delta2, scales, scales_idx1, scales_idx2, mone8,
                mtwo8, sumi1, sumi2);
        });
        let d = _mm256_set1_ps(rd_f32(yb, 0) * fp16(scale as u32));
        accum1 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi1), accum1);
        accum2 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi2), accum2);
    }
    hsum_float_8(accum1) + IQ1_DELTA * hsum_float_8(accum2)
}

/// `iq1_m_avx2` with the grid indices and delta signs spread by `pdep` (as ggml's BMI2 build):
/// fewer instructions where `pdep` is one uop (`fast_pdep`); the same integer sums and float
/// steps, so the same bits.
#[target_feature(enable = "avx2,fma,f16c,bmi2")]
fn iq1_m_avx2_bmi2(n: usize, x: &[u8], y: &[u8]) -> f32 {
    const XS: usize = size_of::<BlockIQ1M>();
    const QS: usize = offset_of!(BlockIQ1M, qs);
    const QH: usize = offset_of!(BlockIQ1M, qh);
    const SCALES: usize = offset_of!(BlockIQ1M, scales);
    let mask = _mm256_set1_epi16(0x7);
    let mone = _mm256_set1_epi16(1);
    let mone8 = _mm256_set1_epi8(1);
    let mtwo8 = _mm256_set1_epi8(2);
    let scales_shift = _mm256_set_epi64x(9, 3, 6, 0);
    let mut accum1 = _mm256_setzero_ps();
    let mut accum2 = _mm256_setzero_ps();
    for (xb, yb) in x.chunks_exact(XS).zip(y.chunks_exact(Q8K_SIZE)).take(n / QK_K) {
        iq1m_scales!(xb, scales_shift, mask, mone => scale, scales);
        let mut scales_idx1 = _mm256_set1_epi16(0x0100);
        let mut scales_idx2 = _mm256_set1_epi16(0x0908);
        let mut sumi1 = _mm256_setzero_si256();
        let mut sumi2 = _mm256_setzero_si256();
        unroll!(ib in [0, 2, 4, 6] {
            // Four 11-bit grid indices per u64: the qs bytes in the low bytes of the u16 lanes,
            // the 3-bit qh nibbles (bit 3 masked off) in bits 8..11.
            let qh32 = rd_u32(xb, QH + 2 * ib) as u64;
            let idx1 = _pdep_u64(rd_u32(xb, QS + 4 * ib) as u64, 0x00ff_00ff_00ff_00ff)
                | _pdep_u64(qh32 & 0x7777, 0x0f00_0f00_0f00_0f00);
            let idx2 = _pdep_u64(rd_u32(xb, QS + 4 * ib + 4) as u64, 0x00ff_00ff_00ff_00ff)
                | _pdep_u64((qh32 >> 16) & 0x7777, 0x0f00_0f00_0f00_0f00);
            let g = |p: u64, l: u32| {
                let i = (p >> (16 * l)) as u16 as usize;
                debug_assert!(i < IQ1S_GRID.len());
                // SAFETY: `i` is below 2048 = IQ1S_GRID.len(): the `pdep` masks fill bits 0..8
                // and 8..12 of each u16 lane, and the `& 0x7777` left bit 11 clear. Unchecked (the
                // lanes a `movzx` each, as ggml's) instead of a shift and a mask per index.
                unsafe { *IQ1S_GRID.get_unchecked(i) }
            };
            let q1b_1 = set4(g(idx1, 0), g(idx1, 1), g(idx1, 2), g(idx1, 3));
            let q1b_2 = set4(g(idx2, 0), g(idx2, 1), g(idx2, 2), g(idx2, 3));
            // Group l's delta sign (bit 3 of qh nibble l) to bit 7 of byte l; sign-extended to
            // 64 bits and or-ed with 1: bytes 0x81/0xff (negative) or 0x01.
            let delta_sign = _pdep_u64(qh32 & 0x8888_8888, 0xf0f0_f0f0_f0f0_f0f0);
            let delta1 = _mm256_or_si256(
                mone8,
                _mm256_cvtepi8_epi64(_mm_cvtsi32_si128(delta_sign as i32)),
            );
            let delta2 = _mm256_or_si256(
                mone8,
                _mm256_cvtepi8_epi64(_mm_cvtsi32_si128((delta_sign >> 32) as i32)),
            );
            iq1m_step!(yb, ib, q1b_1, q1b_2, delta1, delta2, scales, scales_idx1, scales_idx2, mone8,
                mtwo8, sumi1, sumi2);
        });
        let d = _mm256_set1_ps(rd_f32(yb, 0) * fp16(scale as u32));
        accum1 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi1), accum1);
        accum2 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi2), accum2);
    }
    hsum_float_8(accum1) + IQ1_DELTA * hsum_float_8(accum2)
}

// ---------------------------------------------------------------------------------------------
// IQ4_NL, IQ4_XS

#[target_feature(enable = "avx2,fma,f16c")]
fn iq4_nl_avx2<const PF: usize>(n: usize, x: &[u8], y: &[u8]) -> f32 {
    iq4_nl_rows::<PF, 1>(n, [x], y)[0]
}

/// Two rows of [`iq4_nl_avx2`] (`KernelTable::vec_dot2_stream`), each result bitwise its.
#[target_feature(enable = "avx2,fma,f16c")]
fn iq4_nl2_avx2<const PF: usize>(n: usize, x: [&[u8]; 2], y: &[u8]) -> [f32; 2] {
    iq4_nl_rows::<PF, 2>(n, x, y)
}

/// The IQ4_NL loop over `R` weight rows against one activation row: each row's operations and
/// their order are the one-row loop's; the rows share the activation's loads.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn iq4_nl_rows<const PF: usize, const R: usize>(n: usize, x: [&[u8]; R], y: &[u8]) -> [f32; R] {
    const XS: usize = size_of::<BlockIQ4NL>();
    const QS: usize = offset_of!(BlockIQ4NL, qs);
    const Y_QS: usize = offset_of!(BlockQ8_0, qs);
    let nb = x.iter().fold((n / QK4_NL).min(y.len() / Q8_0_SIZE), |nb, x| nb.min(x.len() / XS));
    let x = x.map(|x| &x[..nb * XS]);
    let y = &y[..nb * Q8_0_SIZE];
    let values = iq4nl_values();
    let mut accum1 = [_mm256_setzero_ps(); R];
    let mut accum2 = [_mm256_setzero_ps(); R];
    let mut pairs_x = x.map(|x| x.chunks_exact(2 * XS));
    let mut pairs_y = y.chunks_exact(2 * Q8_0_SIZE);
    for yb in &mut pairs_y {
        let q8b_1 = load256(yb, Y_QS);
        let q8b_2 = load256(yb, Q8_0_SIZE + Y_QS);
        let (dy1, dy2) = (fp16(rd_u32(yb, 0)), fp16(rd_u32(yb, Q8_0_SIZE)));
        for r in 0..R {
            // Every row holds as many pairs as `y` (all cut to `nb` blocks above).
            let Some(xb) = pairs_x[r].next() else { break };
            if PF > 0 {
                prefetch_lines::<{ 2 * XS }>(xb.as_ptr(), PF);
            }
            let q4b_1 = nibble_values_32(values, load128(xb, QS));
            let q4b_2 = nibble_values_32(values, load128(xb, XS + QS));
            // ggml's sign trick, then each four products summed (`maddubs` + `madd` by ones).
            let sums = |x: __m256i, y: __m256i| {
                // SAFETY: without VNNI `us8_sums` needs only this function's features.
                unsafe { us8_sums::<false>(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)) }
            };
            let (p_1, p_2) = (sums(q4b_1, q8b_1), sums(q4b_2, q8b_2));
            let d1 = dy1 * fp16(rd_u32(xb, 0));
            let d2 = dy2 * fp16(rd_u32(xb, XS));
            accum1[r] = _mm256_fmadd_ps(_mm256_set1_ps(d1), _mm256_cvtepi32_ps(p_1), accum1[r]);
            accum2[r] = _mm256_fmadd_ps(_mm256_set1_ps(d2), _mm256_cvtepi32_ps(p_2), accum2[r]);
        }
    }
    std::array::from_fn(|r| {
        let sumf = hsum_float_8(_mm256_add_ps(accum1[r], accum2[r]));
        iq4_nl_last_block(pairs_x[r].remainder(), pairs_y.remainder(), sumf)
    })
}

/// `sumf` plus the product of an odd count's last IQ4_NL block (`xb`) and Q8_0 block (`yb`),
/// as ggml's scalar tail adds it; `sumf` itself when either slice is shorter than a block.
pub(super) fn iq4_nl_last_block(xb: &[u8], yb: &[u8], sumf: f32) -> f32 {
    const XS: usize = size_of::<BlockIQ4NL>();
    const QS: usize = offset_of!(BlockIQ4NL, qs);
    const Y_QS: usize = offset_of!(BlockQ8_0, qs);
    let (Some(xb), Some(yb)) = (xb.get(..XS), yb.get(..Q8_0_SIZE)) else { return sumf };
    let d = fp16(rd_u32(yb, 0)) * fp16(rd_u32(xb, 0));
    let (mut sumi1, mut sumi2) = (0i32, 0i32);
    for j in 0..QK4_NL / 2 {
        let q = xb[QS + j];
        sumi1 += yb[Y_QS + j] as i8 as i32 * KVALUES_IQ4NL[(q & 0xf) as usize] as i32;
        sumi2 += yb[Y_QS + j + QK4_NL / 2] as i8 as i32 * KVALUES_IQ4NL[(q >> 4) as usize] as i32;
    }
    sumf + d * (sumi1 + sumi2) as f32
}

/// `kvalues_iq4nl` in both halves of a vector, for `pshufb` lookups.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn iq4nl_values() -> __m256i {
    let v: [u8; 16] = KVALUES_IQ4NL.map(|v| v as u8);
    _mm256_broadcastsi128_si256(load128(&v, 0))
}

#[target_feature(enable = "avx2,fma,f16c")]
fn iq4_xs_avx2<const PF: usize>(n: usize, x: &[u8], y: &[u8]) -> f32 {
    const XS: usize = size_of::<BlockIQ4XS>();
    const SCALES_H: usize = offset_of!(BlockIQ4XS, scales_h);
    const SCALES_L: usize = offset_of!(BlockIQ4XS, scales_l);
    const QS: usize = offset_of!(BlockIQ4XS, qs);
    let values = iq4nl_values();
    let mut accum = _mm256_setzero_ps();
    for (xb, yb) in x.chunks_exact(XS).zip(y.chunks_exact(Q8K_SIZE)).take(n / QK_K) {
        if PF > 0 {
            prefetch_lines::<XS>(xb.as_ptr(), PF);
        }
        let mut sh = rd_u16(xb, SCALES_H);
        let mut sumi1 = _mm256_setzero_si256();
        let mut sumi2 = _mm256_setzero_si256();
        unroll!(ib in [0, 2, 4, 6] {
            let q4b_1 = nibble_values_32(values, load128(xb, QS + 16 * ib));
            let q4b_2 = nibble_values_32(values, load128(xb, QS + 16 * ib + 16));
            let q8b_1 = load256(yb, Q8K_QS + 32 * ib);
            let q8b_2 = load256(yb, Q8K_QS + 32 * ib + 32);
            let p16_1 = mul_add_epi8(q4b_1, q8b_1);
            let p16_2 = mul_add_epi8(q4b_2, q8b_2);
            let sl = xb[SCALES_L + ib / 2] as u16;
            let ls1 = ((sl & 0xf) | ((sh << 4) & 0x30)) as i16 - 32;
            let ls2 = ((sl >> 4) | ((sh << 2) & 0x30)) as i16 - 32;
            sh >>= 4;
            sumi1 = _mm256_add_epi32(sumi1, _mm256_madd_epi16(p16_1, _mm256_set1_epi16(ls1)));
            sumi2 = _mm256_add_epi32(sumi2, _mm256_madd_epi16(p16_2, _mm256_set1_epi16(ls2)));
        });
        let d = fp16(rd_u32(xb, 0)) * rd_f32(yb, 0);
        let sumi = _mm256_cvtepi32_ps(_mm256_add_epi32(sumi1, sumi2));
        accum = _mm256_fmadd_ps(_mm256_set1_ps(d), sumi, accum);
    }
    hsum_float_8(accum)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{Isa, table_for};
    use crate::quant::iq::grids::KSIGNS_IQ2XS;
    use crate::quant::util::fp32_to_fp16;
    use crate::testdata::Xorshift64;

    const TYPES: [DType; 9] = [
        DType::IQ2_XXS,
        DType::IQ2_XS,
        DType::IQ2_S,
        DType::IQ3_XXS,
        DType::IQ3_S,
        DType::IQ1_S,
        DType::IQ1_M,
        DType::IQ4_NL,
        DType::IQ4_XS,
    ];

    /// The AVX2 and scalar tables, or `None` (with a note) on a CPU without AVX2.
    fn tiers() -> Option<(&'static KernelTable, &'static KernelTable)> {
        match (table_for(Isa::Avx2), table_for(Isa::Scalar)) {
            (Some(a), Some(s)) => Some((a, s)),
            _ => {
                println!("skipped: this CPU lacks AVX2/FMA/F16C");
                None
            }
        }
    }

    /// The shared xorshift64 stream, drawn as block fields.
    struct Rng(Xorshift64);
    impl Rng {
        fn new(state: u64) -> Rng {
            Rng(Xorshift64::from_state(state))
        }
        fn byte(&mut self) -> u8 {
            self.0.next_u8()
        }
        /// Uniform in [-1, 1).
        fn unit(&mut self) -> f32 {
            self.0.next_f32()
        }
        /// A Q8 level, -127..=127 as the quantizers make them.
        fn level(&mut self) -> i8 {
            (((self.0.next_u64() >> 32) % 255) as i32 - 127) as i8
        }
    }

    /// Random but valid weight blocks: random bytes with finite f16 scales.
    fn rand_weights(dtype: DType, nb: usize, rng: &mut Rng) -> Vec<u8> {
        let bs = dtype.type_size();
        let mut v: Vec<u8> = (0..nb * bs).map(|_| rng.byte()).collect();
        for b in v.chunks_exact_mut(bs) {
            let d = fp32_to_fp16(rng.unit() * 0.05);
            if dtype == DType::IQ1_M {
                // The f16 scale sits in the top nibbles of the four u16 words of `scales`.
                let o = offset_of!(BlockIQ1M, scales);
                for i in 0..4 {
                    let nib = ((d >> (4 * i)) & 0xf) as u8;
                    b[o + 2 * i + 1] = (b[o + 2 * i + 1] & 0x0f) | nib << 4;
                }
            } else {
                b[..2].copy_from_slice(&d.to_le_bytes());
            }
        }
        v
    }

    /// Random activation blocks of `dtype.vec_dot_type()` with consistent `bsums`.
    fn rand_activations(dtype: DType, nb_weights: usize, rng: &mut Rng) -> Vec<u8> {
        let vd = dtype.vec_dot_type();
        let n = nb_weights * dtype.block_size();
        let mut out = vec![0u8; vd.row_size(n).unwrap()];
        if vd == DType::Q8_K {
            for b in out.chunks_exact_mut(Q8K_SIZE) {
                let mut blk =
                    BlockQ8K { d: rng.unit() * 0.02, qs: [0; QK_K], bsums: [0; QK_K / 16] };
                for q in blk.qs.iter_mut() {
                    *q = rng.level();
                }
                for (s, q) in blk.bsums.iter_mut().zip(blk.qs.chunks_exact(16)) {
                    *s = q.iter().map(|&v| v as i16).sum();
                }
                b.copy_from_slice(bytemuck::bytes_of(&blk));
            }
        } else {
            assert_eq!(vd, DType::Q8_0);
            for b in out.chunks_exact_mut(Q8_0_SIZE) {
                let mut blk = BlockQ8_0 { d: fp32_to_fp16(rng.unit() * 0.02), qs: [0; 32] };
                for q in blk.qs.iter_mut() {
                    *q = rng.level();
                }
                b.copy_from_slice(bytemuck::bytes_of(&blk));
            }
        }
        out
    }

    /// `sum |x_i * y_i|` of the dequantized vectors: the scale rounding errors are measured on.
    fn abs_dot(dtype: DType, n: usize, x: &[u8], y: &[u8]) -> f64 {
        let mut xf = vec![0f32; n];
        (crate::quant::format(dtype).dequantize.unwrap())(x, &mut xf);
        let mut yf = vec![0f32; n];
        (crate::quant::format(dtype.vec_dot_type()).dequantize.unwrap())(y, &mut yf);
        xf.iter().zip(&yf).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum()
    }

    /// Copies `b` to an odd address so the kernels see unaligned blocks.
    fn misaligned(b: &[u8]) -> Vec<u8> {
        let mut v = vec![0u8; b.len() + 1];
        v[1..].copy_from_slice(b);
        v
    }

    #[test]
    fn keven_signs_matches_ksigns_iq2xs() {
        for (i, &w) in KEVEN_SIGNS.iter().enumerate() {
            for j in 0..8 {
                let want = if KSIGNS_IQ2XS[i] & (1 << j) != 0 { 0xff } else { 0x01 };
                assert_eq!((w >> (8 * j)) as u8, want, "entry {i} byte {j}");
            }
        }
    }

    #[test]
    fn avx2_iq_vec_dot_matches_scalar_on_random_blocks() {
        let Some((avx2, scalar)) = tiers() else { return };
        let mut rng = Rng::new(0x9E37_79B9_7F4A_7C15);
        for dtype in TYPES {
            let fa = avx2.vec_dot(dtype).unwrap();
            let fs = scalar.vec_dot(dtype).unwrap();
            assert!(fa as usize != fs as usize, "{dtype}: the AVX2 table has the scalar kernel");
            let counts: &[usize] =
                if dtype == DType::IQ4_NL { &[1, 2, 3, 8, 129] } else { &[1, 2, 3, 16, 37] };
            for &nb in counts {
                for trial in 0..20 {
                    let n = nb * dtype.block_size();
                    let x = rand_weights(dtype, nb, &mut rng);
                    let y = rand_activations(dtype, nb, &mut rng);
                    let want = fs(n, &x, &y);
                    let got = fa(n, &x, &y);
                    let tol = 1e-6 * abs_dot(dtype, n, &x, &y).max(want.abs() as f64);
                    let err = (got as f64 - want as f64).abs();
                    assert!(
                        err <= tol,
                        "{dtype} nb={nb} trial={trial}: avx2 {got} scalar {want} (err {err:e} > {tol:e})"
                    );
                    let (xm, ym) = (misaligned(&x), misaligned(&y));
                    let got_m = fa(n, &xm[1..], &ym[1..]);
                    assert_eq!(got_m.to_bits(), got.to_bits(), "{dtype} nb={nb}: unaligned input");
                }
            }
        }
    }

    /// The BMI2 kernels against the plain AVX2 ones (bit for bit: same integer sums, same float
    /// steps) and against the scalar tier (within 1e-6 of the magnitudes, as the test above),
    /// whichever of the two `plug` registered on this CPU.
    #[test]
    fn avx2_bmi2_kernels_match_plain_avx2_and_scalar() {
        let Some((_, scalar)) = tiers() else { return };
        if !std::is_x86_feature_detected!("bmi2") {
            println!("skipped: this CPU lacks BMI2");
            return;
        }
        type Pair = (DType, crate::quant::VecDotFn, crate::quant::VecDotFn, std::ops::Range<usize>);
        let pairs: [Pair; 2] = [
            (
                DType::IQ1_M,
                vec_dot_iq1_m_q8_K,
                vec_dot_iq1_m_q8_K_bmi2,
                offset_of!(BlockIQ1M, qh)..offset_of!(BlockIQ1M, qh) + QK_K / 16,
            ),
            (
                DType::IQ3_S,
                vec_dot_iq3_s_q8_K,
                vec_dot_iq3_s_q8_K_bmi2,
                offset_of!(BlockIQ3S, qh)..offset_of!(BlockIQ3S, qh) + QK_K / 32,
            ),
        ];
        let mut rng = Rng::new(0x2545_F491_4F6C_DD1D);
        for (dtype, plain, bmi2, qh) in pairs {
            let fs = scalar.vec_dot(dtype).unwrap();
            for nb in [1, 2, 3, 16, 37] {
                for trial in 0..40 {
                    let n = nb * QK_K;
                    let mut x = rand_weights(dtype, nb, &mut rng);
                    if trial % 4 == 1 {
                        // Every qh bit set: the highest grid indices (and for IQ1_M every delta
                        // negative).
                        for b in x.chunks_exact_mut(dtype.type_size()) {
                            b[qh.clone()].fill(0xff);
                        }
                    }
                    let y = rand_activations(dtype, nb, &mut rng);
                    let (want_p, got) = (plain(n, &x, &y), bmi2(n, &x, &y));
                    assert_eq!(
                        got.to_bits(),
                        want_p.to_bits(),
                        "{dtype} nb={nb} trial={trial}: bmi2 {got} plain {want_p}"
                    );
                    let want = fs(n, &x, &y);
                    let tol = 1e-6 * abs_dot(dtype, n, &x, &y).max(want.abs() as f64);
                    let err = (got as f64 - want as f64).abs();
                    assert!(err <= tol, "{dtype} nb={nb} trial={trial}: {got} vs scalar {want}");
                    let (xm, ym) = (misaligned(&x), misaligned(&y));
                    let got_m = bmi2(n, &xm[1..], &ym[1..]);
                    assert_eq!(got_m.to_bits(), got.to_bits(), "{dtype} nb={nb}: unaligned input");
                }
            }
        }
    }

    #[test]
    fn plug_registers_the_bmi2_kernels_only_where_pdep_is_fast() {
        let Some((avx2, _)) = tiers() else { return };
        let fast = fast_pdep();
        println!("fast pdep: {fast}");
        let kernels: [(DType, crate::quant::VecDotFn, crate::quant::VecDotFn); 2] = [
            (DType::IQ1_M, vec_dot_iq1_m_q8_K, vec_dot_iq1_m_q8_K_bmi2),
            (DType::IQ3_S, vec_dot_iq3_s_q8_K, vec_dot_iq3_s_q8_K_bmi2),
        ];
        for (dtype, plain, bmi2) in kernels {
            let want = if fast { bmi2 } else { plain };
            assert_eq!(avx2.vec_dot(dtype).unwrap() as usize, want as usize, "{dtype}");
        }
    }

    #[test]
    fn avx2_iq_vec_dot_of_zero_blocks_is_zero() {
        let Some((avx2, _)) = tiers() else { return };
        let mut rng = Rng::new(7);
        for dtype in TYPES {
            let nb = 4;
            let n = nb * dtype.block_size();
            let x = rand_weights(dtype, nb, &mut rng);
            let y = vec![0u8; dtype.vec_dot_type().row_size(n).unwrap()];
            assert_eq!(avx2.vec_dot(dtype).unwrap()(n, &x, &y), 0.0, "{dtype}");
        }
    }

    #[test]
    fn avx2_iq_vec_dot_matches_ggml_golden_values() {
        let Some((avx2, _)) = tiers() else { return };
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden");
        let manifest: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap())
                .unwrap();
        let quant = &manifest["quant"];
        let n = quant["n_per_row"].as_u64().unwrap() as usize;
        let read = |desc: &serde_json::Value| {
            std::fs::read(dir.join(desc["file"].as_str().unwrap())).unwrap()
        };
        let mut checked = 0;
        for case in quant["types"].as_array().unwrap() {
            let Some(dtype) = DType::from_name(case["type"].as_str().unwrap()) else { continue };
            if !TYPES.contains(&dtype) {
                continue;
            }
            let (q, yq) = (read(&case["q"]), read(&case["y_q"]));
            let (xr, yr) = (dtype.row_size(n).unwrap(), dtype.vec_dot_type().row_size(n).unwrap());
            for v in case["vec_dot"].as_array().unwrap() {
                let row = v["row"].as_u64().unwrap() as usize;
                let want = f32::from_bits(v["bits"].as_u64().unwrap() as u32);
                let got = avx2.vec_dot(dtype).unwrap()(
                    n,
                    &q[row * xr..(row + 1) * xr],
                    &yq[row * yr..(row + 1) * yr],
                );
                let err = (got - want).abs();
                assert!(err <= 1e-4 * want.abs(), "{dtype} row {row}: avx2 {got}, ggml {want}");
                // The float steps follow ggml's AVX2 order, so the bits agree too.
                assert_eq!(got.to_bits(), want.to_bits(), "{dtype} row {row}: {got} vs {want}");
                checked += 1;
            }
        }
        assert!(checked >= 6 * 4, "only {checked} golden values found");
    }
}
