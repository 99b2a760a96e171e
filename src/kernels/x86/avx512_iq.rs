//! AVX-512 forms of the i-quant dots whose AVX2 kernels build each grid vector from scalar table
//! reads and inserts (IQ3_XXS, IQ2_S, IQ1_M): here one gather fetches the grid rows of 64
//! weights, the sign bits become a mask register, and `vpdpwssd` applies the sub-block scales.
//!
//! Each kernel gives the AVX2 tier's bits (`avx2_iq.rs`, ggml's AVX2 order): the AVX2 kernel's two
//! 8-lane integer accumulators (first and second 32 weights of each 64) are the low and high
//! halves of one 16-lane accumulator here, every lane summing the same exact products (no `i16`
//! step can saturate: grid values are at most 62, activations at most 128 in magnitude); the
//! halves are added before the float steps, which are the AVX2 kernel's.
//!
//! Blocks are read from byte slices with `chunks_exact`, so a wrong length only shortens the walk;
//! the unsafe code is the gathers, whose indices are bounded by their bit widths.

// ggml's names (`vec_dot_iq3_xxs_q8_K`) so the code reads next to ggml's.
#![allow(non_snake_case)]

use super::avx2_iq::{IQ1_DELTA, Q8K_QS, Q8K_SIZE, fp16, load128, load256, rd_f32, rd_u32, rd_u64};
use super::avx2_quants::{STREAM_PF, hsum_float_8, prefetch_lines};
use crate::dtype::{DType, QK_K};
use crate::kernels::KernelTable;
use crate::quant::VecDotFn;
use crate::quant::iq::grids::{IQ1S_GRID, IQ2S_GRID, IQ3XXS_GRID};
use crate::quant::iq::iq1::BlockIQ1M;
use crate::quant::iq::iq2::BlockIQ2S;
use crate::quant::iq::iq3::BlockIQ3XXS;
use std::arch::x86_64::*;
use std::mem::{offset_of, size_of};

/// Registers the dots (called by the AVX-512 tier's `plug` on a CPU with AVX512_VNNI; BMI2 is
/// checked here).
pub(super) fn plug(t: &mut KernelTable) {
    if !std::arch::is_x86_feature_detected!("bmi2") {
        return;
    }
    // AMD's 16-lane gathers are slow: on Zen 4 (4096 x 1 x 14336, 2 threads, 3 alternating
    // rounds) the AVX2 tier's scalar table reads decode IQ3_XXS in 3.0-3.2 ms against the gather
    // form's 3.8-4.2, and IQ1_M in 2.1-2.7 against 2.6-3.1; IQ2_S was a tie (1.97-2.69 against
    // 2.07-2.60) and keeps its gather form. Zen 5 was not measured and takes the same choice.
    let slow_gathers = super::amd_family().is_some();
    for (d, plain, stream) in DOTS {
        if slow_gathers && d != DType::IQ2_S {
            continue;
        }
        t.set_vec_dot(d, plain);
        if let Some(stream) = stream {
            t.set_vec_dot_stream(d, stream);
        }
    }
}

/// The dots of this file: type, plain form, streaming form (IQ1_M keeps the AVX2 tier's
/// streaming dot: a prefetch measured no gain there).
const DOTS: [(DType, VecDotFn, Option<VecDotFn>); 3] = [
    (DType::IQ3_XXS, vec_dot_iq3_xxs_q8_K, Some(vec_dot_iq3_xxs_q8_K_stream)),
    (DType::IQ2_S, vec_dot_iq2_s_q8_K, Some(vec_dot_iq2_s_q8_K_stream)),
    (DType::IQ1_M, vec_dot_iq1_m_q8_K, None),
];

macro_rules! safe_wrappers {
    ($($name:ident => $body:path;)*) => {$(
        /// Dot product (`VecDotFn`) on the AVX-512 tier.
        fn $name(n: usize, x: &[u8], y: &[u8]) -> f32 {
            // SAFETY: this function only enters a `KernelTable` through `plug`, which the
            // AVX-512 tier calls after AVX-512 F/BW/DQ/VL, AVX2, FMA, F16C and AVX512_VNNI were
            // detected, and which checks BMI2 itself.
            unsafe { $body(n, x, y) }
        }
    )*};
}
safe_wrappers! {
    vec_dot_iq3_xxs_q8_K => iq3_xxs_avx512::<0>;
    vec_dot_iq3_xxs_q8_K_stream => iq3_xxs_avx512::<STREAM_PF>;
    vec_dot_iq2_s_q8_K => iq2_s_avx512::<0>;
    vec_dot_iq2_s_q8_K_stream => iq2_s_avx512::<STREAM_PF>;
    vec_dot_iq1_m_q8_K => iq1_m_avx512;
}

/// 64 bytes of `b` from `off` as a vector (any alignment).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn load512(b: &[u8], off: usize) -> __m512i {
    let s = &b[off..off + 64];
    // SAFETY: `s` is 64 readable bytes (the slice index checked it); `loadu` needs no alignment.
    unsafe { _mm512_loadu_si512(s.as_ptr().cast()) }
}

/// The 8 bytes of `b` from `off` zero-extended to eight `i32` lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
fn bytes8_to_i32(b: &[u8], off: usize) -> __m256i {
    _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(rd_u64(b, off) as i64))
}

/// The sum of the low and high eight lanes: the AVX2 kernels' `sumi1 + sumi2`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx2")]
fn fold_halves(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v))
}

/// One step's products of 64 weights added to `sumi`: the activations `q8` negated where `neg`
/// has a bit, times the unsigned grid codes in pairs (`vpmaddubsw`, exact: at most 2 x 62 x
/// 128), times the scale words `sc` (`vpdpwssd`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn signed_step(sumi: __m512i, q8: __m512i, neg: u64, grid: __m512i, sc: __m512i) -> __m512i {
    let q8s = _mm512_mask_sub_epi8(q8, neg, _mm512_setzero_si512(), q8);
    _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(grid, q8s), sc)
}

/// A block's end: its integer sums (the AVX2 kernel's `sumi1 + sumi2`) converted and
/// multiplied by the block's scale `d` into the eight float lanes `acc`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx2,fma")]
fn end_block(acc: __m256, d: f32, sumi: __m512i) -> __m256 {
    _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(fold_halves(sumi)), acc)
}

/// A 16-lane `vpermd` index repeating lane `a` in the low eight lanes and `b` in the high.
const fn pair_index(a: i32, b: i32) -> [i32; 16] {
    [a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b]
}

/// A 32-lane `vpermw` index repeating words `a`, `b`, `c`, `e` eight times each.
const fn quad_index(a: i16, b: i16, c: i16, e: i16) -> [i16; 32] {
    let mut v = [0i16; 32];
    let mut i = 0;
    while i < 8 {
        v[i] = a;
        v[8 + i] = b;
        v[16 + i] = c;
        v[24 + i] = e;
        i += 1;
    }
    v
}

#[inline]
#[target_feature(enable = "avx512f")]
fn index32(v: &[i32; 16]) -> __m512i {
    // SAFETY: `v` is 64 readable bytes; `loadu` needs no alignment.
    unsafe { _mm512_loadu_si512(v.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx512f")]
fn index16(v: &[i16; 32]) -> __m512i {
    // SAFETY: `v` is 64 readable bytes; `loadu` needs no alignment.
    unsafe { _mm512_loadu_si512(v.as_ptr().cast()) }
}

/// Runs `$body` once for each listed value of `$k`, written out (constant offsets and indices).
macro_rules! unroll {
    ($k:ident in [$($v:literal),*] $body:block) => {{
        $({
            let $k: usize = $v;
            $body
        })*
    }};
}

// ---------------------------------------------------------------------------------------------
// IQ3_XXS

/// The 64 sign bits of one IQ3_XXS step from its two 32-bit scale-and-sign words (`w`, low word
/// first): each 7-bit field becomes a byte whose bit 7 makes its popcount even, the entry of
/// ggml's `keven_signs_q2xs` (bit `j` of byte `g` negates weight `8 g + j`).
#[inline]
#[target_feature(enable = "bmi2")]
fn keven_mask(w: u64) -> u64 {
    let m = _pdep_u64(_pext_u64(w, 0x0fff_ffff_0fff_ffff), 0x7f7f_7f7f_7f7f_7f7f);
    // Parity of each byte folded into its bit 0 (shifts of at most 3 stay inside the low nibble
    // once the first step has folded the high one in).
    let mut p = m ^ (m >> 4);
    p ^= p >> 2;
    p ^= p >> 1;
    m | (p & 0x0101_0101_0101_0101) << 7
}

/// `ggml_vec_dot_iq3_xxs_q8_K`, bitwise the AVX2 tier's.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")]
fn iq3_xxs_avx512<const PF: usize>(n: usize, x: &[u8], y: &[u8]) -> f32 {
    const XS: usize = size_of::<BlockIQ3XXS>();
    const QS: usize = offset_of!(BlockIQ3XXS, qs);
    const GAS: usize = QS + QK_K / 4;
    const STEP: [[i32; 16]; 4] =
        [pair_index(0, 1), pair_index(2, 3), pair_index(4, 5), pair_index(6, 7)];
    let mut accumf = _mm256_setzero_ps();
    for (xb, yb) in x.chunks_exact(XS).zip(y.chunks_exact(Q8K_SIZE)).take(n / QK_K) {
        if PF > 0 {
            prefetch_lines::<XS>(xb.as_ptr(), PF);
        }
        let d = fp16(rd_u32(xb, 0)) * rd_f32(yb, 0);
        // Sub-block j's scale 2 (a_j >> 28) + 1 in both i16 halves of i32 lane j.
        let a = _mm256_srli_epi32::<28>(load256(xb, GAS));
        let ls = _mm256_add_epi32(_mm256_slli_epi32::<1>(a), _mm256_set1_epi32(1));
        let ls = _mm512_castsi256_si512(_mm256_or_si256(ls, _mm256_slli_epi32::<16>(ls)));
        let mut sumi = _mm512_setzero_si512();
        unroll!(k in [0, 1, 2, 3] {
            let q8 = load512(yb, Q8K_QS + 64 * k);
            let idx = _mm512_cvtepu8_epi32(load128(xb, QS + 16 * k));
            // SAFETY: every index is a byte, below 256 = IQ3XXS_GRID.len(); scale 4 steps u32s.
            let grid = unsafe { _mm512_i32gather_epi32::<4>(idx, IQ3XXS_GRID.as_ptr().cast()) };
            let neg = keven_mask(rd_u64(xb, GAS + 8 * k));
            let sc = _mm512_permutexvar_epi32(index32(&STEP[k]), ls);
            sumi = signed_step(sumi, q8, neg, grid, sc);
        });
        accumf = end_block(accumf, d, sumi);
    }
    0.25 * hsum_float_8(accumf)
}

// ---------------------------------------------------------------------------------------------
// IQ2_S

/// `ggml_vec_dot_iq2_s_q8_K`, bitwise the AVX2 tier's.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")]
fn iq2_s_avx512<const PF: usize>(n: usize, x: &[u8], y: &[u8]) -> f32 {
    const XS: usize = size_of::<BlockIQ2S>();
    const QS: usize = offset_of!(BlockIQ2S, qs);
    const SIGNS: usize = QS + QK_K / 8;
    const QH: usize = offset_of!(BlockIQ2S, qh);
    const SCALES: usize = offset_of!(BlockIQ2S, scales);
    // Words of `scales16`: sub-block j's first-16 scale is word j, its second-16 scale word 8 + j.
    const STEP: [[i16; 32]; 4] = [
        quad_index(0, 8, 1, 9),
        quad_index(2, 10, 3, 11),
        quad_index(4, 12, 5, 13),
        quad_index(6, 14, 7, 15),
    ];
    let m4 = _mm_set1_epi8(0xf);
    let hshift = _mm256_set_epi32(14, 12, 10, 8, 6, 4, 2, 0);
    let m3 = _mm256_set1_epi32(3);
    let mut accumf = _mm256_setzero_ps();
    for (xb, yb) in x.chunks_exact(XS).zip(y.chunks_exact(Q8K_SIZE)).take(n / QK_K) {
        if PF > 0 {
            prefetch_lines::<XS>(xb.as_ptr(), PF);
        }
        let d = fp16(rd_u32(xb, 0)) * rd_f32(yb, 0);
        let aux64 = rd_u64(xb, SCALES);
        let scales8 = _mm_add_epi8(
            _mm_slli_epi16(_mm_and_si128(_mm_set_epi64x((aux64 >> 4) as i64, aux64 as i64), m4), 1),
            _mm_set1_epi8(1),
        );
        let scales16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(scales8));
        let mut sumi = _mm512_setzero_si512();
        unroll!(s in [0, 1, 2, 3] {
            let ib32 = 2 * s;
            let q8 = load512(yb, Q8K_QS + 32 * ib32);
            // Grid index l: qs byte l, bits 2l..2l+2 of the two qh bytes (as one u16) above it.
            let h = (xb[QH + ib32] as u32 | (xb[QH + ib32 + 1] as u32) << 8) as i32;
            let hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(h), hshift), m3);
            let idx = _mm256_or_si256(bytes8_to_i32(xb, QS + 4 * ib32), _mm256_slli_epi32::<8>(hi));
            // SAFETY: every index is below 2^10 = IQ2S_GRID.len() (a byte and two bits above
            // it); scale 8 steps u64s.
            let grid = unsafe { _mm512_i32gather_epi64::<8>(idx, IQ2S_GRID.as_ptr().cast()) };
            let neg = rd_u64(xb, SIGNS + 4 * ib32);
            let sc = _mm512_permutexvar_epi16(index16(&STEP[s]), scales16);
            sumi = signed_step(sumi, q8, neg, grid, sc);
        });
        accumf = end_block(accumf, d, sumi);
    }
    0.125 * hsum_float_8(accumf)
}

// ---------------------------------------------------------------------------------------------
// IQ1_M

/// `ggml_vec_dot_iq1_m_q8_K`, bitwise the AVX2 tier's. The grid's levels -1, 0, 1 are shifted to
/// 0, 1, 2 for `vpmaddubsw` and the pair sums of the activations taken off again; those pair sums,
/// negated by the groups' delta signs, are the delta part. For activation levels -127..=127 (all
/// that ggml's and this crate's Q8_K quantizers write) the integers are the AVX2 kernel's; a
/// level of -128 against a grid level of -1 gives +128 here (the exact product, as the portable
/// kernel), where the AVX2 kernel's `vpsignb` trick wraps to -128.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")]
fn iq1_m_avx512(n: usize, x: &[u8], y: &[u8]) -> f32 {
    const XS: usize = size_of::<BlockIQ1M>();
    const QS: usize = offset_of!(BlockIQ1M, qs);
    const QH: usize = offset_of!(BlockIQ1M, qh);
    const SCALES: usize = offset_of!(BlockIQ1M, scales);
    // Scale j (sub-block j / 2, half j % 2) is bits 3 (j % 4).. of u16 j / 4.
    const STEP: [[i16; 32]; 4] = [
        quad_index(0, 1, 2, 3),
        quad_index(4, 5, 6, 7),
        quad_index(8, 9, 10, 11),
        quad_index(12, 13, 14, 15),
    ];
    let word_of = _mm256_set_epi16(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    let shift_of = _mm256_set_epi16(9, 6, 3, 0, 9, 6, 3, 0, 9, 6, 3, 0, 9, 6, 3, 0);
    let qh_shift = _mm256_set_epi32(28, 24, 20, 16, 12, 8, 4, 0);
    let m7 = _mm256_set1_epi32(7);
    let ones8 = _mm512_set1_epi8(1);
    let zero = _mm512_setzero_si512();
    let mut accum1 = _mm256_setzero_ps();
    let mut accum2 = _mm256_setzero_ps();
    for (xb, yb) in x.chunks_exact(XS).zip(y.chunks_exact(Q8K_SIZE)).take(n / QK_K) {
        let sc64 = rd_u64(xb, SCALES);
        let sc = [sc64 as u16, (sc64 >> 16) as u16, (sc64 >> 32) as u16, (sc64 >> 48) as u16];
        let scale =
            (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
        let w = _mm256_permutexvar_epi16(word_of, _mm256_set1_epi64x(sc64 as i64));
        let w = _mm256_and_si256(_mm256_srlv_epi16(w, shift_of), _mm256_set1_epi16(7));
        let scales16 = _mm512_castsi256_si512(_mm256_add_epi16(
            _mm256_slli_epi16::<1>(w),
            _mm256_set1_epi16(1),
        ));
        let mut sumi1 = _mm512_setzero_si512();
        let mut sumi2 = _mm512_setzero_si512();
        unroll!(s in [0, 1, 2, 3] {
            let ib = 2 * s;
            let q8 = load512(yb, Q8K_QS + 32 * ib);
            // Grid index l: qs byte l, bits 4l..4l+3 of the four qh bytes above it.
            let qh32 = rd_u32(xb, QH + 2 * ib);
            let hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(qh32 as i32), qh_shift), m7);
            let idx = _mm256_or_si256(bytes8_to_i32(xb, QS + 4 * ib), _mm256_slli_epi32::<8>(hi));
            // SAFETY: every index is below 2^11 = IQ1S_GRID.len() (a byte and three bits above
            // it); scale 8 steps u64s.
            let grid = unsafe { _mm512_i32gather_epi64::<8>(idx, IQ1S_GRID.as_ptr().cast()) };
            let pairs = _mm512_maddubs_epi16(ones8, q8);
            let dot1 = _mm512_sub_epi16(_mm512_maddubs_epi16(_mm512_add_epi8(grid, ones8), q8), pairs);
            // Group l's delta sign is bit 4l + 3: one mask bit for each of its four words.
            let neg = ((qh32 >> 3) & 0x1111_1111).wrapping_mul(15);
            let dot2 = _mm512_mask_sub_epi16(pairs, neg, zero, pairs);
            let sc = _mm512_permutexvar_epi16(index16(&STEP[s]), scales16);
            sumi1 = _mm512_dpwssd_epi32(sumi1, dot1, sc);
            sumi2 = _mm512_dpwssd_epi32(sumi2, dot2, sc);
        });
        let d = rd_f32(yb, 0) * fp16(scale as u32);
        accum1 = end_block(accum1, d, sumi1);
        accum2 = end_block(accum2, d, sumi2);
    }
    hsum_float_8(accum1) + IQ1_DELTA * hsum_float_8(accum2)
}

#[cfg(test)]
mod tests {
    use super::super::test_util::avx2_and_avx512;
    use crate::dtype::DType;

    /// The AVX-512 IQ3_XXS, IQ2_S and IQ1_M dots (plain and streaming) give the AVX2 tier's
    /// bits: random blocks (any index, sign and scale bits), activations of any level a Q8_K
    /// block holds, block counts 1 to 56.
    #[test]
    fn avx512_iq_dots_give_the_avx2_tiers_bits() {
        let Some((t2, _)) = avx2_and_avx512(true) else { return };
        if !std::arch::is_x86_feature_detected!("bmi2") {
            return;
        }
        let mut r = crate::testdata::Xorshift64::from_state(0x5EED_1234_F00D_BEEF);
        for (d, plain, stream) in super::DOTS {
            // Taken from the list, not the table: on AMD the table keeps some AVX2 dots. IQ1_M
            // has no AVX-512 streaming form (its second pair is its plain form again).
            let pairs = [
                (t2.vec_dot(d).unwrap(), plain),
                (t2.vec_dot_stream(d).unwrap(), stream.unwrap_or(plain)),
            ];
            for nb in [1usize, 2, 3, 7, 56] {
                let n = 256 * nb;
                for _ in 0..4 {
                    let mut bytes =
                        |len: usize| -> Vec<u8> { (0..len).map(|_| r.next_u64() as u8).collect() };
                    let mut x = bytes(d.row_size(n).unwrap());
                    let mut y = bytes(DType::Q8_K.row_size(n).unwrap());
                    let (xs, ys) = (x.len() / nb, y.len() / nb);
                    for b in 0..nb {
                        // Finite scales: the f32 activation scale's and the f16 weight scale's
                        // exponents kept below all-ones (IQ1_M's f16 is spread over the scale
                        // words' top nibbles; its byte 7 holds the exponent's top bits).
                        y[ys * b + 3] &= 0xBF;
                        // Levels in -127..=127, as ggml's Q8_K quantizer writes them (with -128
                        // the AVX2 IQ1_M kernel's sign trick would wrap).
                        for q in &mut y[ys * b + 4..ys * b + 4 + 256] {
                            if *q == 0x80 {
                                *q = 0x81;
                            }
                        }
                        match d {
                            DType::IQ1_M => x[xs * b + xs - 1] &= 0xBF,
                            _ => x[xs * b + 1] &= 0xBB,
                        }
                    }
                    for (k2, k5) in pairs {
                        let (a, b) = (k2(n, &x, &y), k5(n, &x, &y));
                        assert_eq!(a.to_bits(), b.to_bits(), "{d} nb={nb}: {a} vs {b}");
                    }
                }
            }
        }
    }
}
