//! AVX-512 forms of the K-quant and IQ4_XS dot products (`KernelTable::vec_dot`, 256-element
//! blocks against Q8_K) holding two 32-level groups of a block in one 512-bit register where the
//! AVX2 kernels hold them in two 256-bit ones.
//! Each gives the AVX2 tier's bits: the same 16-bit pair sums and 32-bit lanes (a register's
//! two halves are added before the conversion, an exact integer sum), then the AVX2 kernel's
//! float steps in its order. The IQ4 lookup ([`iq4_sign_trick`]) is shared with the IQ4_NL dot
//! in `avx512_quants`.

#![allow(non_snake_case)] // ggml's names (`vec_dot_q3_K_q8_K`), as in `avx2_quants`.

use std::arch::x86_64::*;
use std::mem::{offset_of, size_of};

use super::avx2_quants::{
    F16_TO_F32, PF_4K_L2, STREAM_PF, hsum_float_8, k4_scales_and_mins, opaque, prefetch_stream,
    prefetch_stream_at, q3k_scales, rd_f32, rd_u16, rd_u32, scale_shuffle, scale_shuffle_k4,
    scale_shuffle_q3k, whole_blocks,
};
use crate::dtype::{DType, QK_K};
use crate::kernels::{KernelTable, VecDot2Fn};
use crate::quant::VecDotFn;
use crate::quant::iq::grids::KVALUES_IQ4NL;
use crate::quant::iq::iq4::BlockIQ4XS;
use crate::quant::kquants::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};

const Q2B: usize = size_of::<BlockQ2K>();
const Q3B: usize = size_of::<BlockQ3K>();
const Q4B: usize = size_of::<BlockQ4K>();
const Q5B: usize = size_of::<BlockQ5K>();
const Q6B: usize = size_of::<BlockQ6K>();
const IQ4XSB: usize = size_of::<BlockIQ4XS>();
const Q8KB: usize = size_of::<BlockQ8K>();

/// `[e(0), e(1), e(2), e(3)]` with `k` bound to each index in turn, written out: the kernels'
/// per-group values. `std::array::from_fn` over a closure is not always inlined into a
/// `target_feature` function, and a call per group with its vectors passed through memory
/// measured Q6_K's dot at half its speed.
macro_rules! per_group {
    (|$k:ident| $e:expr) => {
        [
            {
                let $k = 0usize;
                $e
            },
            {
                let $k = 1usize;
                $e
            },
            {
                let $k = 2usize;
                $e
            },
            {
                let $k = 3usize;
                $e
            },
        ]
    };
}

/// Registers the dots (called by the AVX-512 tier's `plug`, which checked the tier).
///
/// One process, the previous dots and these computing one plan in turn (4096 x 1 x 14336, 2
/// threads, Emerald Rapids Xeon; each order twice in L3 over 40 computes, 3 runs from memory
/// over 6 passes of 1 GiB of weight copies), ratio of times old / new, in L3 and from memory:
/// - Q2_K against the AVX2 one-row dot: 1.08-1.25x, 1.11-1.25x;
/// - Q3_K against the AVX2-width two-row form with masked high bits: 1.07-1.22x, 1.05-1.15x;
/// - Q4_K against the AVX2 one-row dot: 1.08-1.25x, 1.17-1.24x;
/// - Q5_K against the AVX2-width two-row form with masked fifth bits: 0.91-1.16x (median of 8
///   runs 1.09), 1.06-1.18x;
/// - Q6_K against the AVX2 one-row dot: 1.37-1.48x, 1.16-1.26x;
/// - IQ4_XS against the AVX2 one-row dot: 1.24-1.41x, 1.25-1.55x (its one-row form 1.21-1.50x
///   in L3, 5-10% slower than the two-row).
pub(super) fn plug(t: &mut KernelTable, _: super::Avx512) {
    t.set_vec_dot(DType::Q2_K, vec_dot_q2_K_q8_K);
    t.set_vec_dot_stream(DType::Q2_K, vec_dot_q2_K_q8_K_stream);
    t.set_vec_dot2_stream(DType::Q2_K, vec_dot2_q2_K_q8_K_stream);
    t.set_vec_dot(DType::Q3_K, vec_dot_q3_K_q8_K);
    t.set_vec_dot_stream(DType::Q3_K, vec_dot_q3_K_q8_K_stream);
    t.set_vec_dot2_stream(DType::Q3_K, vec_dot2_q3_K_q8_K_stream);
    // AMD family 0x19 (in this tier Zen 4) prefetches these 4 KiB ahead instead of `PF_8K`:
    // Zen 4, `decode-stream T 4096 14336 2 5`, 4 alternating rounds, medians: q4_K 25.4 -> 27.1
    // GB/s, q5_K 25.5 -> 27.7, q6_K 25.1 -> 27.2 (in L3 within the noise: 0.96 -> 1.03 ms, 1.28
    // -> 1.18, 1.59 -> 1.50); and into L2 (`PF_4K_L2`).
    let near = super::amd_family() == Some(0x19);
    type Forms = [(DType, VecDotFn, VecDotFn, VecDot2Fn); 3];
    let forms: Forms = if near {
        [
            (
                DType::Q4_K,
                vec_dot_q4_K_q8_K,
                vec_dot_q4_K_q8_K_stream4k,
                vec_dot2_q4_K_q8_K_stream4k,
            ),
            (
                DType::Q5_K,
                vec_dot_q5_K_q8_K,
                vec_dot_q5_K_q8_K_stream4k,
                vec_dot2_q5_K_q8_K_stream4k,
            ),
            (
                DType::Q6_K,
                vec_dot_q6_K_q8_K,
                vec_dot_q6_K_q8_K_stream4k,
                vec_dot2_q6_K_q8_K_stream4k,
            ),
        ]
    } else {
        [
            (
                DType::Q4_K,
                vec_dot_q4_K_q8_K,
                vec_dot_q4_K_q8_K_stream8k,
                vec_dot2_q4_K_q8_K_stream8k,
            ),
            (
                DType::Q5_K,
                vec_dot_q5_K_q8_K,
                vec_dot_q5_K_q8_K_stream8k,
                vec_dot2_q5_K_q8_K_stream8k,
            ),
            (
                DType::Q6_K,
                vec_dot_q6_K_q8_K,
                vec_dot_q6_K_q8_K_stream8k,
                vec_dot2_q6_K_q8_K_stream8k,
            ),
        ]
    };
    for (d, plain, stream, two) in forms {
        t.set_vec_dot(d, plain);
        t.set_vec_dot_stream(d, stream);
        t.set_vec_dot2_stream(d, two);
    }
    t.set_vec_dot(DType::IQ4_XS, vec_dot_iq4_xs_q8_K);
    t.set_vec_dot_stream(DType::IQ4_XS, vec_dot_iq4_xs_q8_K_stream);
    t.set_vec_dot2_stream(DType::IQ4_XS, vec_dot2_iq4_xs_q8_K_stream);
}

/// Registers the forms that need AVX512_VNNI (called by the AVX-512 tier's `plug` on a CPU
/// with it), replacing [`plug`]'s.
pub(super) fn plug_vnni(t: &mut KernelTable) {
    t.set_vec_dot(DType::Q2_K, vec_dot_q2_K_q8_K_vnni);
    t.set_vec_dot_stream(DType::Q2_K, vec_dot_q2_K_q8_K_vnni_stream);
    t.set_vec_dot2_stream(DType::Q2_K, vec_dot2_q2_K_q8_K_vnni_stream);
    t.set_vec_dot(DType::Q3_K, vec_dot_q3_K_q8_K_vnni);
    t.set_vec_dot_stream(DType::Q3_K, vec_dot_q3_K_q8_K_vnni_stream);
    t.set_vec_dot2_stream(DType::Q3_K, vec_dot2_q3_K_q8_K_vnni_stream);
}

/// The Q2_K and Q3_K forms without VNNI (plain, streaming, two-row), which [`plug_vnni`]
/// replaces where the CPU has AVX512_VNNI, for the tests to compare with the AVX2 tier there
/// too. Callers check for the AVX-512 tier before calling them.
#[cfg(test)]
pub(super) fn forms_without_vnni() -> [(DType, VecDotFn, VecDotFn, Option<VecDot2Fn>); 2] {
    [
        (DType::Q2_K, vec_dot_q2_K_q8_K, vec_dot_q2_K_q8_K_stream, Some(vec_dot2_q2_K_q8_K_stream)),
        (DType::Q3_K, vec_dot_q3_K_q8_K, vec_dot_q3_K_q8_K_stream, Some(vec_dot2_q3_K_q8_K_stream)),
    ]
}

/// The safe entry points of an `R`-row kernel `$rows::<PF, R>(nb, x, y)` over blocks of `$xb`
/// bytes against Q8_K blocks: the plain dot, the decode dot prefetching the weights `$pf` bytes
/// ahead, and its two-row form (`KernelTable::vec_dot2_stream`).
macro_rules! entry_points {
    ($($ty:literal: $rows:ident, $xb:expr, $pf:expr => $plain:ident, $stream:ident, $two:ident;)*) => {$(
        #[doc = concat!("`ggml_vec_dot_", $ty, "_q8_K`, bitwise the AVX2 tier's.")]
        fn $plain(n: usize, x: &[u8], y: &[u8]) -> f32 {
            let nb = whole_blocks(n, QK_K, x, $xb, y, Q8KB);
            // SAFETY: `whole_blocks` caps `nb` so that `x` holds `nb` weight blocks and `y`
            // `nb` Q8_K blocks, all the kernel reads; `plug` (`plug_vnni` for the VNNI forms)
            // installs this only on a CPU with the features `$rows` enables.
            unsafe { $rows::<0, 1>(nb, [x.as_ptr()], y.as_ptr())[0] }
        }

        stream_points! { $ty: $rows, $xb, $pf => $stream, $two; }
    )*};
}

/// The decode entry points of an `R`-row kernel (see `entry_points!`): the dot prefetching the
/// weights `$pf` bytes ahead and its two-row form.
macro_rules! stream_points {
    ($($ty:literal: $rows:ident, $xb:expr, $pf:expr => $stream:ident, $two:ident;)*) => {$(
        #[doc = concat!("`ggml_vec_dot_", $ty, "_q8_K` prefetching the weights ahead (decode).")]
        fn $stream(n: usize, x: &[u8], y: &[u8]) -> f32 {
            let nb = whole_blocks(n, QK_K, x, $xb, y, Q8KB);
            // SAFETY: `whole_blocks` caps `nb` so that `x` holds `nb` weight blocks and `y`
            // `nb` Q8_K blocks, all the kernel reads; `plug` (`plug_vnni` for the VNNI forms)
            // installs this only on a CPU with the features `$rows` enables.
            unsafe { $rows::<{ $pf }, 1>(nb, [x.as_ptr()], y.as_ptr())[0] }
        }

        #[doc = concat!("Two rows of the ", $ty, " decode dot (`KernelTable::vec_dot2_stream`).")]
        fn $two(n: usize, x: [&[u8]; 2], y: &[u8]) -> [f32; 2] {
            let nb = whole_blocks(n, QK_K, x[0], $xb, y, Q8KB)
                .min(whole_blocks(n, QK_K, x[1], $xb, y, Q8KB));
            // SAFETY: `whole_blocks` caps `nb` so that both rows hold `nb` weight blocks and `y`
            // `nb` Q8_K blocks; `plug` (`plug_vnni` for the VNNI forms) installs this only on a
            // CPU with the features `$rows` enables.
            unsafe { $rows::<{ $pf }, 2>(nb, x.map(<[u8]>::as_ptr), y.as_ptr()) }
        }
    )*};
}

entry_points! {
    "q2_K": q2_K_q8_K_rows, Q2B, STREAM_PF
        => vec_dot_q2_K_q8_K, vec_dot_q2_K_q8_K_stream, vec_dot2_q2_K_q8_K_stream;
    "q3_K": q3_K_q8_K_rows, Q3B, STREAM_PF
        => vec_dot_q3_K_q8_K, vec_dot_q3_K_q8_K_stream, vec_dot2_q3_K_q8_K_stream;
    "q4_K": q4_K_q8_K_rows, Q4B, PF_8K
        => vec_dot_q4_K_q8_K, vec_dot_q4_K_q8_K_stream8k, vec_dot2_q4_K_q8_K_stream8k;
    "q5_K": q5_K_q8_K_rows, Q5B, PF_8K
        => vec_dot_q5_K_q8_K, vec_dot_q5_K_q8_K_stream8k, vec_dot2_q5_K_q8_K_stream8k;
    "q6_K": q6_K_q8_K_rows, Q6B, PF_8K
        => vec_dot_q6_K_q8_K, vec_dot_q6_K_q8_K_stream8k, vec_dot2_q6_K_q8_K_stream8k;
    "iq4_xs": iq4_xs_q8_K_rows, IQ4XSB, STREAM_PF
        => vec_dot_iq4_xs_q8_K, vec_dot_iq4_xs_q8_K_stream, vec_dot2_iq4_xs_q8_K_stream;
    "q2_K": q2_K_q8_K_rows_vnni, Q2B, STREAM_PF
        => vec_dot_q2_K_q8_K_vnni, vec_dot_q2_K_q8_K_vnni_stream, vec_dot2_q2_K_q8_K_vnni_stream;
    "q3_K": q3_K_q8_K_rows_vnni, Q3B, STREAM_PF
        => vec_dot_q3_K_q8_K_vnni, vec_dot_q3_K_q8_K_vnni_stream, vec_dot2_q3_K_q8_K_vnni_stream;
}

// The Q4_K, Q5_K and Q6_K decode forms with the nearer prefetch, for Zen 3 / Zen 4 (`plug`).
stream_points! {
    "q4_K": q4_K_q8_K_rows, Q4B, PF_4K_L2
        => vec_dot_q4_K_q8_K_stream4k, vec_dot2_q4_K_q8_K_stream4k;
    "q5_K": q5_K_q8_K_rows, Q5B, PF_4K_L2
        => vec_dot_q5_K_q8_K_stream4k, vec_dot2_q5_K_q8_K_stream4k;
    "q6_K": q6_K_q8_K_rows, Q6B, PF_4K_L2
        => vec_dot_q6_K_q8_K_stream4k, vec_dot2_q6_K_q8_K_stream4k;
}

/// The Q3_K loop of the AVX2 tier (ggml's lanes and float order, high bits through mask
/// registers) over `R` weight rows against one activation row, with the 32-level groups `k` and
/// `4 + k` of a block in the low and high halves of one register: group `k` of the 2-bit codes
/// is bits `2k` of the first 32 bytes, group `4 + k` of the next 32 (one 64-byte load, one
/// shift), both high-bit groups test the same 32 mask bytes (bits `k` and `4 + k`), and the
/// scales' 128-bit lanes are the AVX2 kernel's `scales[0]` twice, then `scales[1]` twice.
///
/// # Safety
/// The CPU supports the AVX-512 tier (F, BW, DQ, VL) on top of AVX2, FMA and F16C; each row of
/// `x` holds `nb` Q3_K blocks and `y` `nb` Q8_K blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
unsafe fn q3_K_q8_K_rows<const PF: usize, const R: usize>(
    nb: usize,
    x: [*const u8; R],
    y: *const u8,
) -> [f32; R] {
    // SAFETY: the caller's guarantees are the loop's; the features are this function's.
    unsafe { q3_K_loop::<false, PF, R>(nb, x, y) }
}

/// [`q3_K_q8_K_rows`] with VNNI: the same 32-bit lanes by other integer steps. Each four
/// levels' sum `sum q3 * q8` (ggml's two 16-bit pair sums added, no more than `4 * 4 * 128` in
/// magnitude) comes from one `vpdpbusd` of the codes `q3l + 4 * high bit` (0..=7) started from
/// `-4 * sum q8` (per activation block, shared by the rows); [`paired_scaled_sums`] scales and
/// adds them. A group's high bits come to bit 2 by one 64-bit rotate (bit `k` of the low
/// half's bytes, `4 + k` of the high half's, each staying in its byte) and join the two low
/// bits by one `vpternlogd`. Zen 4, 4096 x 1 x 512 (in L2), 1 thread: 0.084 -> 0.076 ms.
///
/// # Safety
/// The CPU supports the AVX-512 tier (F, BW, DQ, VL) and AVX512_VNNI on top of AVX2, FMA and
/// F16C; each row of `x` holds `nb` Q3_K blocks and `y` `nb` Q8_K blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q3_K_q8_K_rows_vnni<const PF: usize, const R: usize>(
    nb: usize,
    x: [*const u8; R],
    y: *const u8,
) -> [f32; R] {
    // SAFETY: the caller's guarantees are the loop's; the features are this function's.
    unsafe { q3_K_loop::<true, PF, R>(nb, x, y) }
}

/// The body of [`q3_K_q8_K_rows`] (`VNNI` false) and [`q3_K_q8_K_rows_vnni`], without target
/// features of its own so that each caller compiles it with its own (a VNNI instruction
/// cannot be inlined into a function without that feature).
///
/// # Safety
/// Called from a function with the AVX-512 tier's features, and AVX512_VNNI when `VNNI`; each
/// row of `x` holds `nb` Q3_K blocks and `y` `nb` Q8_K blocks.
#[inline(always)]
unsafe fn q3_K_loop<const VNNI: bool, const PF: usize, const R: usize>(
    nb: usize,
    x: [*const u8; R],
    y: *const u8,
) -> [f32; R] {
    // SAFETY: the caller runs with the features named above (and VNNI's when `VNNI`); every
    // block read stays inside block `i < nb` of its row, as the caller guarantees.
    unsafe {
        let m4 = _mm512_set1_epi8(4);
        let zero = _mm512_setzero_si512();
        let shuffles = q3k_shuffles();
        let paired = paired_shuffles();
        // High bit `k` in the low half's bytes, `4 + k` in the high half's.
        let bits: [__m512i; 4] = per_group!(|k| {
            let lo = _mm256_set1_epi8((1u8 << k) as i8);
            let hi = _mm256_set1_epi8((1u8 << (4 + k)) as i8);
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
        });
        // The rotations (left, per 64 bits) that bring those bits to bit 2 of their byte.
        let rotate: [__m512i; 4] = per_group!(|k| {
            let (lo, hi) = ((66 - k as i64) % 64, 62 - k as i64);
            _mm512_set_epi64(hi, hi, hi, hi, lo, lo, lo, lo)
        });
        let mut acc = [_mm256_setzero_ps(); R];
        for i in 0..nb {
            // In bounds: block `i < nb` of `y`: its d (0..4) and its 256 levels (4..260).
            let (yd, q8) = {
                let by = y.add(i * Q8KB);
                let qs = by.add(offset_of!(BlockQ8K, qs));
                (rd_f32(by.add(offset_of!(BlockQ8K, d))), q8k_pairs(qs))
            };
            // Shared by the rows: `-4 * sum q8` of every four levels (VNNI), else
            // `maddubs(4, q8)` of every group.
            let shared = if VNNI {
                per_group!(|k| _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, m4, q8[k])))
            } else {
                per_group!(|k| _mm512_maddubs_epi16(m4, q8[k]))
            };
            for r in 0..R {
                if PF > 0 {
                    prefetch_stream::<Q3B>(x[r], i, PF);
                }
                // In bounds: block `i < nb` of row `r`: its hmask (0..32), qs (32..96), scales
                // (96..108) and d (108..110).
                let (hbits, q3bits, aux, xd) = {
                    let bx = x[r].add(i * Q3B);
                    let sc = bx.add(offset_of!(BlockQ3K, scales));
                    (
                        _mm512_broadcast_i64x4(_mm256_loadu_si256(
                            bx.add(offset_of!(BlockQ3K, hmask)).cast(),
                        )),
                        _mm512_loadu_si512(bx.add(offset_of!(BlockQ3K, qs)).cast()),
                        [rd_u32(sc), rd_u32(sc.add(4)), rd_u32(sc.add(8))],
                        rd_u16(bx.add(offset_of!(BlockQ3K, d))),
                    )
                };
                let d = _mm256_set1_ps(yd * F16_TO_F32[xd as usize]);

                let scales = lanes_0011(_mm256_cvtepi8_epi16(q3k_scales(aux)));

                let q3l = two_bit_fields(q3bits);
                let sumi = if VNNI {
                    paired_scaled_sums(
                        per_group!(|k| {
                            // Bit 2 from the rotated high bits, bits 0 and 1 from `q3l` (bit 2
                            // clear there).
                            let hb = _mm512_rolv_epi64(hbits, rotate[k]);
                            let codes = _mm512_ternarylogic_epi32::<0xCA>(m4, hb, q3l[k]);
                            _mm512_dpbusd_epi32(shared[k], codes, q8[k])
                        }),
                        scales,
                        paired,
                    )
                } else {
                    halves_sum(per_group!(|k| {
                        // Codes `q3l + 4` where the high bit is set; with `maddubs(4, q8)`
                        // subtracted, ggml's 16-bit pair sums exactly (every one below
                        // 2 * 7 * 128 in magnitude).
                        let set = _mm512_test_epi8_mask(hbits, bits[k]);
                        let q3u = _mm512_mask_add_epi8(q3l[k], set, q3l[k], m4);
                        let p16 = _mm512_sub_epi16(_mm512_maddubs_epi16(q3u, q8[k]), shared[k]);
                        _mm512_madd_epi16(_mm512_shuffle_epi8(scales, shuffles[k]), p16)
                    }))
                };
                acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc[r]);
            }
        }
        std::array::from_fn(|r| hsum_float_8(acc[r]))
    }
}

/// Bits `2k` and `2k + 1` of every byte of `q` in register `k`: a Q2_K/Q3_K block's 2-bit codes
/// of group `k` (low half) and `4 + k` (high half) from its 64 code bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
#[inline]
fn two_bit_fields(q: __m512i) -> [__m512i; 4] {
    let m3 = _mm512_set1_epi8(3);
    [
        _mm512_and_si512(q, m3),
        _mm512_and_si512(_mm512_srli_epi16::<2>(q), m3),
        _mm512_and_si512(_mm512_srli_epi16::<4>(q), m3),
        _mm512_and_si512(_mm512_srli_epi16::<6>(q), m3),
    ]
}

/// [`q3k_shuffles`] for [`paired_scaled_sums`]: groups `2m` and `2m + 1`'s joined, group
/// `2m`'s scale in the low 16 bits of each 32-bit lane and `2m + 1`'s in the high 16.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
#[inline]
fn paired_shuffles() -> [__m512i; 2] {
    let s = q3k_shuffles();
    let low = _mm512_set1_epi32(0xFFFF);
    [
        _mm512_ternarylogic_epi32::<0xCA>(low, s[0], s[1]),
        _mm512_ternarylogic_epi32::<0xCA>(low, s[2], s[3]),
    ]
}

/// The AVX2 kernels' `sumi` of a Q2_K/Q3_K block from its four groups' 32-bit sums of four
/// levels each (`sums[k]`: group `k` in the low half, `4 + k` in the high half, every sum within
/// 16 bits) and its 16-bit scales as [`lanes_0011`] lays them out: two groups' sums packed in
/// one register (group `2m` in the low 16 bits of each 32-bit lane, `2m + 1` in the high 16),
/// so that one `vpmaddwd` against their scales in the same places (`shuffles` from
/// [`paired_shuffles`]) scales both and adds them, lane for lane ggml's `madd(scales, p16)`;
/// then the two halves added.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
#[inline]
fn paired_scaled_sums(sums: [__m512i; 4], scales: __m512i, shuffles: [__m512i; 2]) -> __m256i {
    let pack = |a: __m512i, b: __m512i| {
        _mm512_mask_blend_epi16(0xAAAA_AAAA, a, _mm512_slli_epi32::<16>(b))
    };
    let s = _mm512_add_epi32(
        _mm512_madd_epi16(pack(sums[0], sums[1]), _mm512_shuffle_epi8(scales, shuffles[0])),
        _mm512_madd_epi16(pack(sums[2], sums[3]), _mm512_shuffle_epi8(scales, shuffles[1])),
    );
    _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64::<1>(s))
}

/// The 256 levels of a Q8_K block as four registers: register `k` holds group `k` (levels
/// `32k..32k + 32`) in its low half and group `4 + k` in its high half.
///
/// # Safety
/// `qs` is valid for reading 256 bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn q8k_pairs(qs: *const u8) -> [__m512i; 4] {
    per_group!(|k| {
        // SAFETY: `32k + 32 <= 128` and `128 + 32k + 32 <= 256` bytes, inside the caller's 256.
        let (lo, hi) = unsafe {
            (
                _mm256_loadu_si256(qs.add(32 * k).cast()),
                _mm256_loadu_si256(qs.add(128 + 32 * k).cast()),
            )
        };
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
    })
}

/// ggml's `get_scale_shuffle_q3k(k)` for both halves of a register.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
#[inline]
fn q3k_shuffles() -> [__m512i; 4] {
    per_group!(|k| _mm512_broadcast_i64x4(scale_shuffle_q3k(k as i8)))
}

/// The sixteen 16-bit scales of a block (eight in each 128-bit lane of `all`) as the AVX2
/// kernels' `scales[0]` (the low lane twice) in the low half and `scales[1]` in the high half.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
#[inline]
fn lanes_0011(all: __m256i) -> __m512i {
    let all = _mm512_castsi256_si512(all);
    _mm512_shuffle_i64x2::<0b01_01_00_00>(all, all)
}

/// The AVX2 kernels' `sumi` of a block: the four groups' 32-bit sums, the low and high halves
/// (the AVX2 kernels' `j = 0` and `j = 1`) added lane by lane (exact integers).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
#[inline]
fn halves_sum(p: [__m512i; 4]) -> __m256i {
    let s = _mm512_add_epi32(_mm512_add_epi32(p[0], p[1]), _mm512_add_epi32(p[2], p[3]));
    _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64::<1>(s))
}

/// The Q2_K loop of the AVX2 tier (ggml's lanes and float order: the mins' term, then the
/// scaled sums) over `R` weight rows against one activation row, groups `k` and `4 + k` of a
/// block in one register as in [`q3_K_q8_K_rows`].
///
/// # Safety
/// The CPU supports the AVX-512 tier (F, BW, DQ, VL) on top of AVX2, FMA and F16C; each row of
/// `x` holds `nb` Q2_K blocks and `y` `nb` Q8_K blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
unsafe fn q2_K_q8_K_rows<const PF: usize, const R: usize>(
    nb: usize,
    x: [*const u8; R],
    y: *const u8,
) -> [f32; R] {
    // SAFETY: the caller's guarantees are the loop's; the features are this function's.
    unsafe { q2_K_loop::<false, PF, R>(nb, x, y) }
}

/// [`q2_K_q8_K_rows`] with VNNI: each four levels' sum `sum q2 * q8` by one `vpdpbusd` (ggml's
/// two 16-bit pair sums added; no more than `4 * 3 * 128` in magnitude), scaled and added by
/// [`paired_scaled_sums`]: the same 32-bit lanes. Zen 4, 4096 x 1 x 512 (in L2), 1 thread:
/// 0.061 -> 0.058 ms.
///
/// # Safety
/// The CPU supports the AVX-512 tier (F, BW, DQ, VL) and AVX512_VNNI on top of AVX2, FMA and
/// F16C; each row of `x` holds `nb` Q2_K blocks and `y` `nb` Q8_K blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q2_K_q8_K_rows_vnni<const PF: usize, const R: usize>(
    nb: usize,
    x: [*const u8; R],
    y: *const u8,
) -> [f32; R] {
    // SAFETY: the caller's guarantees are the loop's; the features are this function's.
    unsafe { q2_K_loop::<true, PF, R>(nb, x, y) }
}

/// The body of [`q2_K_q8_K_rows`] (`VNNI` false) and [`q2_K_q8_K_rows_vnni`], without target
/// features of its own so that each caller compiles it with its own (a VNNI instruction
/// cannot be inlined into a function without that feature).
///
/// # Safety
/// Called from a function with the AVX-512 tier's features, and AVX512_VNNI when `VNNI`; each
/// row of `x` holds `nb` Q2_K blocks and `y` `nb` Q8_K blocks.
#[inline(always)]
unsafe fn q2_K_loop<const VNNI: bool, const PF: usize, const R: usize>(
    nb: usize,
    x: [*const u8; R],
    y: *const u8,
) -> [f32; R] {
    // SAFETY: the caller runs with the features named above (and VNNI's when `VNNI`); every
    // block read stays inside block `i < nb` of its row, as the caller guarantees.
    unsafe {
        let m4 = _mm_set1_epi8(0xF);
        let shuffles = q3k_shuffles();
        let paired = paired_shuffles();
        let zero = _mm512_setzero_si512();
        let mut acc = [_mm256_setzero_ps(); R];
        for i in 0..nb {
            // In bounds: block `i < nb` of `y`: its d (0..4), levels (4..260) and bsums
            // (260..292).
            let (yd, q8, bsums) = {
                let by = y.add(i * Q8KB);
                (
                    rd_f32(by.add(offset_of!(BlockQ8K, d))),
                    q8k_pairs(by.add(offset_of!(BlockQ8K, qs))),
                    _mm256_loadu_si256(by.add(offset_of!(BlockQ8K, bsums)).cast()),
                )
            };
            for r in 0..R {
                if PF > 0 {
                    prefetch_stream::<Q2B>(x[r], i, PF);
                }
                // In bounds: block `i < nb` of row `r`: its scales (0..16), qs (16..80), d and
                // dmin (80..84).
                let (xd, xdmin, mins_and_scales, q2bits) = {
                    let bx = x[r].add(i * Q2B);
                    (
                        rd_u16(bx.add(offset_of!(BlockQ2K, d))),
                        rd_u16(bx.add(offset_of!(BlockQ2K, dmin))),
                        _mm_loadu_si128(bx.add(offset_of!(BlockQ2K, scales)).cast()),
                        _mm512_loadu_si512(bx.add(offset_of!(BlockQ2K, qs)).cast()),
                    )
                };
                let d = yd * F16_TO_F32[xd as usize];
                let dmin = -yd * F16_TO_F32[xdmin as usize];

                let scales8 = _mm_and_si128(mins_and_scales, m4);
                let mins8 = _mm_and_si128(_mm_srli_epi16::<4>(mins_and_scales), m4);
                let prod = _mm256_madd_epi16(_mm256_cvtepi8_epi16(mins8), bsums);
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(prod), acc[r]);

                let scales = lanes_0011(_mm256_cvtepi8_epi16(scales8));
                let q2l = two_bit_fields(q2bits);
                let sumi = if VNNI {
                    let sums = per_group!(|k| _mm512_dpbusd_epi32(zero, q2l[k], q8[k]));
                    paired_scaled_sums(sums, scales, paired)
                } else {
                    halves_sum(per_group!(|k| {
                        let p16 = _mm512_maddubs_epi16(q2l[k], q8[k]);
                        _mm512_madd_epi16(_mm512_shuffle_epi8(scales, shuffles[k]), p16)
                    }))
                };
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc[r]);
            }
        }
        std::array::from_fn(|r| hsum_float_8(acc[r]))
    }
}

/// How far ahead (bytes) the Q4_K, Q5_K and Q6_K decode forms prefetch the weight rows: twice
/// the other dots' `STREAM_PF`. Measured with the AVX2-width dots on Zen 5, 4096 x 14336 decode,
/// 2 threads, alternating binaries, 4 KiB -> 8 KiB: q6_K 142-144 -> 167-173 GFLOPS, q5_K
/// 145-146 -> 160-162, q4_K 202-208 -> 214-215 (q3_K, q2_K gained nothing clear).
const PF_8K: usize = 8192;

/// The levels of a Q8_K block as the Q4_K/Q5_K forms pair them: group `2j` and `2j + 2` with
/// `j` in the low halves of registers 0 and 2, `2j + 1` and `2j + 3` in 1 and 3 (the low and
/// high nibbles of the 64 code bytes `64m..64m + 64`, `m` = register / 2).
///
/// # Safety
/// `qs` is valid for reading 256 bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn q8k_nibble_pairs(qs: *const u8) -> [__m512i; 4] {
    const GROUPS: [(usize, usize); 4] = [(0, 2), (1, 3), (4, 6), (5, 7)];
    per_group!(|g| {
        let (a, b) = GROUPS[g];
        // SAFETY: groups `a, b < 8` of 32 bytes lie inside the caller's 256.
        let (lo, hi) = unsafe {
            (_mm256_loadu_si256(qs.add(32 * a).cast()), _mm256_loadu_si256(qs.add(32 * b).cast()))
        };
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
    })
}

/// A Q8_K block as the Q4_K/Q5_K forms take it: its scale, its levels as
/// [`q8k_nibble_pairs`] pairs them, and the sums of each 32 levels (ggml's `q8s`: pairs of its
/// 16-level sums added).
///
/// # Safety
/// `by` is valid for reading one Q8_K block.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn q8k_nibble_block(by: *const u8) -> (f32, [__m512i; 4], __m128i) {
    // SAFETY: the reads cover the block's d (0..4), levels (4..260) and bsums (260..292).
    let (yd, q8, q8sums) = unsafe {
        (
            rd_f32(by.add(offset_of!(BlockQ8K, d))),
            q8k_nibble_pairs(by.add(offset_of!(BlockQ8K, qs))),
            _mm256_loadu_si256(by.add(offset_of!(BlockQ8K, bsums)).cast()),
        )
    };
    let q8s = _mm_hadd_epi16(_mm256_castsi256_si128(q8sums), _mm256_extracti128_si256::<1>(q8sums));
    (yd, q8, q8s)
}

/// ggml's `get_scale_shuffle_k4` for the groups of [`q8k_nibble_pairs`]: scale `a` in the low
/// half, `b` in the high half.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
#[inline]
fn k4_shuffles() -> [__m512i; 4] {
    const GROUPS: [(u8, u8); 4] = [(0, 2), (1, 3), (4, 6), (5, 7)];
    per_group!(|g| {
        let (a, b) = GROUPS[g];
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(scale_shuffle_k4(a)), scale_shuffle_k4(b))
    })
}

/// The low and high nibbles of the 128 code bytes of a Q4_K/Q5_K block, as
/// [`q8k_nibble_pairs`] orders their groups.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
#[inline]
fn nibbles(q: [__m512i; 2]) -> [__m512i; 4] {
    let m4 = _mm512_set1_epi8(0xF);
    [
        _mm512_and_si512(q[0], m4),
        _mm512_and_si512(_mm512_srli_epi16::<4>(q[0]), m4),
        _mm512_and_si512(q[1], m4),
        _mm512_and_si512(_mm512_srli_epi16::<4>(q[1]), m4),
    ]
}

/// A K-quant block's eight 6-bit scales and mins (`k4_scales_and_mins` of its 12 bytes at
/// `sc`) widened to 16 bits: the scales in the low 128-bit lane, the mins in the high one.
///
/// # Safety
/// `sc` is valid for reading 12 bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn k4_mins_and_scales(sc: *const u8) -> __m256i {
    // SAFETY: the three 4-byte reads cover the caller's 12 bytes.
    let utmp = unsafe { [rd_u32(sc), rd_u32(sc.add(4)), rd_u32(sc.add(8)), 0] };
    let u = k4_scales_and_mins(utmp);
    _mm256_cvtepu8_epi16(_mm_set_epi32(u[3] as i32, u[2] as i32, u[1] as i32, u[0] as i32))
}

/// The Q4_K loop of the AVX2 tier (ggml's lanes and float order: the mins in their own
/// 4-lane accumulator, added after the scaled sums' reduction) over `R` weight rows against one
/// activation row, two 32-level groups per register as [`q8k_nibble_pairs`] pairs them.
///
/// # Safety
/// The CPU supports the AVX-512 tier (F, BW, DQ, VL) on top of AVX2, FMA and F16C; each row of
/// `x` holds `nb` Q4_K blocks and `y` `nb` Q8_K blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
unsafe fn q4_K_q8_K_rows<const PF: usize, const R: usize>(
    nb: usize,
    x: [*const u8; R],
    y: *const u8,
) -> [f32; R] {
    let shuffles = k4_shuffles();
    let mut acc = [_mm256_setzero_ps(); R];
    let mut acc_m = [_mm_setzero_ps(); R];
    for i in 0..nb {
        // SAFETY: block `i < nb` of `y` is readable.
        let (yd, q8, q8s) = unsafe { q8k_nibble_block(y.add(i * Q8KB)) };
        for r in 0..R {
            if PF > 0 {
                prefetch_stream_at::<Q4B, PF>(x[r], i);
            }
            // SAFETY: block `i < nb` of row `r` is readable; the reads cover its d, dmin
            // (0..4), scales (4..16) and qs (16..144).
            let (xd, xdmin, mins_and_scales, q4) = unsafe {
                let bx = x[r].add(i * Q4B);
                let qs = bx.add(offset_of!(BlockQ4K, qs));
                (
                    rd_u16(bx.add(offset_of!(BlockQ4K, d))),
                    rd_u16(bx.add(offset_of!(BlockQ4K, dmin))),
                    k4_mins_and_scales(bx.add(offset_of!(BlockQ4K, scales))),
                    [_mm512_loadu_si512(qs.cast()), _mm512_loadu_si512(qs.add(64).cast())],
                )
            };
            let d = yd * F16_TO_F32[xd as usize];
            let dmin = -yd * F16_TO_F32[xdmin as usize];
            let prod = _mm_madd_epi16(_mm256_extracti128_si256::<1>(mins_and_scales), q8s);
            acc_m[r] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m[r]);

            let scales = _mm512_broadcast_i32x4(_mm256_castsi256_si128(mins_and_scales));
            let q4l = nibbles(q4);
            let p: [__m512i; 4] = per_group!(|k| {
                let p16 = _mm512_maddubs_epi16(q4l[k], q8[k]);
                _mm512_madd_epi16(_mm512_shuffle_epi8(scales, shuffles[k]), p16)
            });
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(halves_sum(p)), acc[r]);
        }
    }
    std::array::from_fn(|r| {
        let m = acc_m[r];
        let m = _mm_add_ps(m, _mm_movehl_ps(m, m));
        let m = _mm_add_ss(m, _mm_movehdup_ps(m));
        hsum_float_8(acc[r]) + _mm_cvtss_f32(m)
    })
}

/// The Q5_K loop of the AVX2 tier (ggml's lanes and float order: the mins summed in a scalar
/// per block, added after the scaled sums' reduction; the fifth bits through a mask test and a
/// masked add of 16) over `R` weight rows against one activation row, two 32-level groups per
/// register as [`q8k_nibble_pairs`] pairs them; group `g`'s fifth bits are bit `g` of the 32
/// high-bit bytes.
///
/// # Safety
/// The CPU supports the AVX-512 tier (F, BW, DQ, VL) on top of AVX2, FMA and F16C; each row of
/// `x` holds `nb` Q5_K blocks and `y` `nb` Q8_K blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
unsafe fn q5_K_q8_K_rows<const PF: usize, const R: usize>(
    nb: usize,
    x: [*const u8; R],
    y: *const u8,
) -> [f32; R] {
    const GROUPS: [(u8, u8); 4] = [(0, 2), (1, 3), (4, 6), (5, 7)];
    let m16 = _mm512_set1_epi8(16);
    let shuffles = k4_shuffles();
    let bits: [__m512i; 4] = per_group!(|g| {
        let (a, b) = GROUPS[g];
        let lo = _mm256_set1_epi8((1u8 << a) as i8);
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), _mm256_set1_epi8((1u8 << b) as i8))
    });
    let mut acc = [_mm256_setzero_ps(); R];
    let mut summs = [0.0f32; R];
    for i in 0..nb {
        // SAFETY: block `i < nb` of `y` is readable.
        let (yd, q8, q8s) = unsafe { q8k_nibble_block(y.add(i * Q8KB)) };
        for r in 0..R {
            if PF > 0 {
                prefetch_stream_at::<Q5B, PF>(x[r], i);
            }
            // SAFETY: block `i < nb` of row `r` is readable; the reads cover its d, dmin
            // (0..4), scales (4..16), qh (16..48) and qs (48..176).
            let (xd, xdmin, mins_and_scales, hbits, q5) = unsafe {
                let bx = x[r].add(i * Q5B);
                let qs = bx.add(offset_of!(BlockQ5K, qs));
                (
                    rd_u16(bx.add(offset_of!(BlockQ5K, d))),
                    rd_u16(bx.add(offset_of!(BlockQ5K, dmin))),
                    k4_mins_and_scales(bx.add(offset_of!(BlockQ5K, scales))),
                    _mm512_broadcast_i64x4(_mm256_loadu_si256(
                        bx.add(offset_of!(BlockQ5K, qh)).cast(),
                    )),
                    [_mm512_loadu_si512(qs.cast()), _mm512_loadu_si512(qs.add(64).cast())],
                )
            };
            let d = yd * F16_TO_F32[xd as usize];
            let dmin = -yd * F16_TO_F32[xdmin as usize];
            let prod = _mm_madd_epi16(_mm256_extracti128_si256::<1>(mins_and_scales), q8s);
            let mzero = _mm_setzero_si128();
            let hsum = _mm_hadd_epi32(_mm_hadd_epi32(prod, mzero), mzero);
            summs[r] = dmin.mul_add(_mm_cvtsi128_si32(hsum) as f32, summs[r]);

            let scales = _mm512_broadcast_i32x4(_mm256_castsi256_si128(mins_and_scales));
            let q5l = nibbles(q5);
            let p: [__m512i; 4] = per_group!(|k| {
                let set = _mm512_test_epi8_mask(hbits, bits[k]);
                let q5 = _mm512_mask_add_epi8(q5l[k], set, q5l[k], m16);
                let p16 = _mm512_maddubs_epi16(q5, q8[k]);
                _mm512_madd_epi16(_mm512_shuffle_epi8(scales, shuffles[k]), p16)
            });
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(halves_sum(p)), acc[r]);
        }
    }
    std::array::from_fn(|r| hsum_float_8(acc[r]) + summs[r])
}

/// The Q6_K loop of the AVX2 tier (ggml's lanes and float order: the levels' +32 taken off
/// through the activation sums, then one FMA per block) over `R` weight rows against one
/// activation row. Register pairs follow the AVX2 kernel's `j` half of a block: the 64 low-bit
/// bytes `64j..64j + 64` give groups `4j` and `4j + 1` (low nibbles) and `4j + 2` and `4j + 3`
/// (high nibbles), whose activations are 64 contiguous bytes each; the 32 high-bit bytes of
/// `j`, in both halves, give each group its two bits by one variable shift (each half its own
/// count) and a mask.
///
/// # Safety
/// The CPU supports the AVX-512 tier (F, BW, DQ, VL) on top of AVX2, FMA and F16C; each row of
/// `x` holds `nb` Q6_K blocks and `y` `nb` Q8_K blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
unsafe fn q6_K_q8_K_rows<const PF: usize, const R: usize>(
    nb: usize,
    x: [*const u8; R],
    y: *const u8,
) -> [f32; R] {
    let m15 = _mm512_set1_epi8(15);
    let m48 = _mm512_set1_epi8(48);
    // Bits 0-1 (low half) and 2-3 (high half) of a high-bit byte up to bits 4-5; bits 4-5
    // and 6-7 likewise, by a right shift of 0 and 2. 16-bit shifts: what crosses into the
    // neighbouring byte falls outside the mask.
    let up = _mm512_inserti64x4::<1>(_mm512_set1_epi16(4), _mm256_set1_epi16(2));
    let down = _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi16(2));
    // The AVX2 kernel's scale shuffles of groups `2g` and `2g + 1` (g = 0..4) in one register.
    let shuffles: [__m256i; 4] = per_group!(|g| {
        let (a, b) = (scale_shuffle(2 * g as u8), scale_shuffle(2 * g as u8 + 1));
        _mm256_set_m128i(b, a)
    });
    let mut acc = [_mm256_setzero_ps(); R];
    for i in 0..nb {
        // SAFETY: block `i < nb` of `y` is readable; the reads cover its d (0..4), levels
        // (4..260) and bsums (260..292).
        let (yd, q8, q8sums) = unsafe {
            let by = y.add(i * Q8KB);
            let qs = by.add(offset_of!(BlockQ8K, qs));
            let q8: [__m512i; 4] = per_group!(|g| _mm512_loadu_si512(qs.add(64 * g).cast()));
            (
                rd_f32(by.add(offset_of!(BlockQ8K, d))),
                q8,
                _mm256_loadu_si256(by.add(offset_of!(BlockQ8K, bsums)).cast()),
            )
        };
        for r in 0..R {
            if PF > 0 {
                prefetch_stream_at::<Q6B, PF>(x[r], i);
            }
            // SAFETY: block `i < nb` of row `r` is readable; the reads cover its ql (0..128),
            // qh (128..192), scales (192..208) and d (208..210).
            let (ql, qh, scales, xd) = unsafe {
                let bx = x[r].add(i * Q6B);
                let ql = bx.add(offset_of!(BlockQ6K, ql));
                let qh = bx.add(offset_of!(BlockQ6K, qh));
                (
                    [_mm512_loadu_si512(ql.cast()), _mm512_loadu_si512(ql.add(64).cast())],
                    [
                        _mm512_broadcast_i64x4(_mm256_loadu_si256(qh.cast())),
                        _mm512_broadcast_i64x4(_mm256_loadu_si256(qh.add(32).cast())),
                    ],
                    _mm_loadu_si128(bx.add(offset_of!(BlockQ6K, scales)).cast()),
                    rd_u16(bx.add(offset_of!(BlockQ6K, d))),
                )
            };
            let d = _mm256_set1_ps(yd * F16_TO_F32[xd as usize]);
            let scales_16 = _mm256_cvtepi8_epi16(scales);
            // The levels are stored +32: subtract 32 * scale * (sum of each 16 y levels).
            let q8sclsub = _mm256_slli_epi32::<5>(_mm256_madd_epi16(q8sums, scales_16));
            let scales2 = _mm256_broadcastsi128_si256(scales);

            let p: [__m512i; 4] = per_group!(|g| {
                let (j, high) = (g / 2, g % 2 == 1);
                let (lbits, hbits) = if high {
                    (
                        _mm512_srli_epi16::<4>(ql[j]),
                        _mm512_and_si512(_mm512_srlv_epi16(qh[j], down), m48),
                    )
                } else {
                    (ql[j], _mm512_and_si512(_mm512_sllv_epi16(qh[j], up), m48))
                };
                let q6 = _mm512_or_si512(_mm512_and_si512(lbits, m15), hbits);
                let p16 = _mm512_maddubs_epi16(q6, q8[g]);
                // The control goes through `opaque`, as in the AVX2 kernel, so that the
                // compiler keeps one `vpshufb`.
                let sc = _mm256_shuffle_epi8(scales2, opaque(shuffles[g]));
                _mm512_madd_epi16(_mm512_cvtepi8_epi16(sc), p16)
            });
            let sumi = _mm256_sub_epi32(halves_sum(p), q8sclsub);
            acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc[r]);
        }
    }
    std::array::from_fn(|r| hsum_float_8(acc[r]))
}

/// ggml's `mul_add_epi8` operands for IQ4 levels: the 32 code bytes of two 16-byte sub-blocks
/// (`codes`: low nibbles the first 16 levels of each, high nibbles the next 16) against their 64
/// activations. Returns `|level|` by one lookup and the activations negated under a mask where
/// the level is negative (bit 3 of the index clear: the levels are sorted, checked at compile
/// time below): the bytes of ggml's `sign(x, x)` and `sign(y, x)`, a -128 activation wrapping
/// alike.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
#[inline]
pub(super) fn iq4_sign_trick(codes: __m256i, q8: __m512i) -> (__m512i, __m512i) {
    // SAFETY: `IQ4NL_MAGNITUDES` is 16 readable bytes; `loadu` needs no alignment.
    let magnitudes =
        _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(IQ4NL_MAGNITUDES.as_ptr().cast()) });
    // Low nibbles in lanes 0 and 2, high nibbles in 1 and 3.
    let nibble_shift = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);
    let z = _mm512_castsi256_si512(codes);
    let idx = _mm512_and_si512(
        _mm512_srlv_epi64(_mm512_shuffle_i64x2::<0b01_01_00_00>(z, z), nibble_shift),
        _mm512_set1_epi8(0x0f),
    );
    let neg = _mm512_testn_epi8_mask(idx, _mm512_set1_epi8(0x08));
    let q8s = _mm512_mask_sub_epi8(q8, neg, _mm512_setzero_si512(), q8);
    (_mm512_shuffle_epi8(magnitudes, idx), q8s)
}

/// `|level|` of the 16 IQ4_NL levels (`kvalues_iq4nl`).
static IQ4NL_MAGNITUDES: [u8; 16] = {
    let mut m = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        m[i] = KVALUES_IQ4NL[i].unsigned_abs();
        i += 1;
    }
    m
};

// The IQ4_NL levels are sorted: an index's level is negative exactly when its bit 3 is clear,
// which `iq4_sign_trick` tests instead of its sign.
const _: () = {
    let mut i = 0;
    while i < 16 {
        assert!((KVALUES_IQ4NL[i] < 0) == (i < 8));
        i += 1;
    }
};

/// The IQ4_XS loop of the AVX2 tier (ggml's lanes and float order) over `R` weight rows against
/// one activation row, sub-blocks `2p` and `2p + 1` of a block in one register (the AVX2
/// kernel's `sumi1` lanes in the low half, `sumi2`'s in the high one). The AVX2 kernel's
/// `maddubs(|level|, sign(q8, level))` (ggml's `mul_add_epi8`) becomes the levels' magnitudes
/// by one lookup times the activations negated under a mask where the level is negative: the
/// same bytes (a -128 activation wraps alike), the same pair sums. The eight 6-bit scales are
/// formed once per block in a vector and spread to each pair's two halves by `vpermw`.
///
/// # Safety
/// The CPU supports the AVX-512 tier (F, BW, DQ, VL) on top of AVX2, FMA and F16C; each row of
/// `x` holds `nb` IQ4_XS blocks and `y` `nb` Q8_K blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
unsafe fn iq4_xs_q8_K_rows<const PF: usize, const R: usize>(
    nb: usize,
    x: [*const u8; R],
    y: *const u8,
) -> [f32; R] {
    let zero = _mm512_setzero_si512();
    // `vpermw` indices: scale `2p` in the low 16 words, `2p + 1` in the high 16.
    let spread: [__m512i; 4] = per_group!(|p| {
        let lo = _mm256_set1_epi16(2 * p as i16);
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), _mm256_set1_epi16(2 * p as i16 + 1))
    });
    // Bits `2i` and `2i + 1` of `scales_h` into word `i`.
    let h_shift = _mm_set_epi16(14, 12, 10, 8, 6, 4, 2, 0);
    let mut accum = [_mm256_setzero_ps(); R];
    for i in 0..nb {
        // SAFETY: block `i < nb` of `y` is readable: its d (0..4) and levels (4..260).
        let (yd, q8) = unsafe {
            let by = y.add(i * Q8KB);
            let qs = by.add(offset_of!(BlockQ8K, qs));
            let q8: [__m512i; 4] = per_group!(|p| _mm512_loadu_si512(qs.add(64 * p).cast()));
            (rd_f32(by.add(offset_of!(BlockQ8K, d))), q8)
        };
        for r in 0..R {
            if PF > 0 {
                prefetch_stream::<IQ4XSB>(x[r], i, PF);
            }
            // SAFETY: block `i < nb` of row `r` is readable; the reads cover its d (0..2),
            // scales_h (2..4), scales_l (4..8) and qs (8..136).
            let (xd, sh, sl, qs) = unsafe {
                let bx = x[r].add(i * IQ4XSB);
                let qs = bx.add(offset_of!(BlockIQ4XS, qs));
                let qs: [__m256i; 4] = per_group!(|p| _mm256_loadu_si256(qs.add(32 * p).cast()));
                (
                    rd_u16(bx.add(offset_of!(BlockIQ4XS, d))),
                    rd_u16(bx.add(offset_of!(BlockIQ4XS, scales_h))),
                    rd_u32(bx.add(offset_of!(BlockIQ4XS, scales_l))),
                    qs,
                )
            };
            // ggml's `ls = (low nibble | high bits << 4) - 32`, sub-block `i` in word `i`.
            let slv = _mm_cvtsi32_si128(sl as i32);
            let m4 = _mm_set1_epi8(0x0f);
            let nib = _mm_unpacklo_epi8(
                _mm_and_si128(slv, m4),
                _mm_and_si128(_mm_srli_epi16::<4>(slv), m4),
            );
            let high = _mm_and_si128(
                _mm_srlv_epi16(_mm_set1_epi16(sh as i16), h_shift),
                _mm_set1_epi16(3),
            );
            let ls = _mm_sub_epi16(
                _mm_or_si128(_mm_cvtepu8_epi16(nib), _mm_slli_epi16::<4>(high)),
                _mm_set1_epi16(32),
            );
            let ls = _mm512_castsi128_si512(ls);
            let mut sumi = zero;
            for p in 0..4 {
                let (magnitudes, q8s) = iq4_sign_trick(qs[p], q8[p]);
                let p16 = _mm512_maddubs_epi16(magnitudes, q8s);
                sumi = _mm512_add_epi32(
                    sumi,
                    _mm512_madd_epi16(p16, _mm512_permutexvar_epi16(spread[p], ls)),
                );
            }
            let sumi = _mm256_add_epi32(
                _mm512_castsi512_si256(sumi),
                _mm512_extracti64x4_epi64::<1>(sumi),
            );
            let d = F16_TO_F32[xd as usize] * yd;
            accum[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), accum[r]);
        }
    }
    std::array::from_fn(|r| hsum_float_8(accum[r]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::Isa;

    /// Both prefetch distances' decode entry points of Q4_K, Q5_K and Q6_K (a CPU installs one
    /// of them) give the plain dot's bits, one row and two rows at a time, on random blocks.
    #[test]
    fn both_prefetch_distances_give_the_plain_dots() {
        if !Isa::Avx512.is_supported() {
            eprintln!("skipped: no AVX-512 tier on this CPU");
            return;
        }
        type Entry = (VecDotFn, VecDot2Fn);
        let cases: [(DType, VecDotFn, [Entry; 2]); 3] = [
            (
                DType::Q4_K,
                vec_dot_q4_K_q8_K,
                [
                    (vec_dot_q4_K_q8_K_stream4k, vec_dot2_q4_K_q8_K_stream4k),
                    (vec_dot_q4_K_q8_K_stream8k, vec_dot2_q4_K_q8_K_stream8k),
                ],
            ),
            (
                DType::Q5_K,
                vec_dot_q5_K_q8_K,
                [
                    (vec_dot_q5_K_q8_K_stream4k, vec_dot2_q5_K_q8_K_stream4k),
                    (vec_dot_q5_K_q8_K_stream8k, vec_dot2_q5_K_q8_K_stream8k),
                ],
            ),
            (
                DType::Q6_K,
                vec_dot_q6_K_q8_K,
                [
                    (vec_dot_q6_K_q8_K_stream4k, vec_dot2_q6_K_q8_K_stream4k),
                    (vec_dot_q6_K_q8_K_stream8k, vec_dot2_q6_K_q8_K_stream8k),
                ],
            ),
        ];
        let mut r = crate::testdata::Xorshift64::from_state(0x0DD_BA11_5EED);
        let k = 3 * QK_K;
        for (d, plain, entries) in cases {
            // Random bytes with the top bits of every other byte cleared: mostly finite scales.
            let mut bytes = |n: usize| -> Vec<u8> {
                (0..n)
                    .map(|i| (r.next_u64() as u8) & if i % 2 == 1 { 0x3F } else { 0xFF })
                    .collect()
            };
            let (x0, x1) = (bytes(d.row_size(k).unwrap()), bytes(d.row_size(k).unwrap()));
            let y = bytes(DType::Q8_K.row_size(k).unwrap());
            let want = [plain(k, &x0, &y).to_bits(), plain(k, &x1, &y).to_bits()];
            for (i, (one, two)) in entries.into_iter().enumerate() {
                assert_eq!(one(k, &x0, &y).to_bits(), want[0], "{d} distance {i}: one row");
                let got = two(k, [&x0, &x1], &y).map(f32::to_bits);
                assert_eq!(got, want, "{d} distance {i}: two rows");
            }
        }
    }
}
