//! AVX-512 forms of K-quant dot products (`KernelTable::vec_dot`) holding two 32-level groups
//! of a block in one 512-bit register where the AVX2 kernels hold them in two 256-bit ones.
//! Each gives the AVX2 tier's bits: the same 16-bit pair sums and 32-bit lanes (a register's
//! two halves are added before the conversion, an exact integer sum), then the AVX2 kernel's
//! float steps in its order.

#![allow(non_snake_case)] // ggml's names (`vec_dot_q3_K_q8_K`), as in `avx2_quants`.

use std::arch::x86_64::*;
use std::mem::{offset_of, size_of};

use super::avx2_quants::{
    F16_TO_F32, STREAM_PF, hsum_float_8, prefetch_stream, rd_f32, rd_u16, rd_u32,
    scale_shuffle_q3k, whole_blocks,
};
use crate::dtype::{DType, QK_K};
use crate::kernels::KernelTable;
use crate::quant::kquants::{BlockQ2K, BlockQ3K, BlockQ8K};

const Q2B: usize = size_of::<BlockQ2K>();
const Q3B: usize = size_of::<BlockQ3K>();
const Q8KB: usize = size_of::<BlockQ8K>();

/// Registers the dots (called by the AVX-512 tier's `plug`, which checked the tier). One
/// process, the previous dots and these computing one plan in turn, 4096 x 1 x 14336, 2 threads
/// of an Emerald Rapids Xeon, each order twice in L3 (40 computes) and once or twice from
/// memory (6 passes over 1 GiB of weight copies): Q3_K against the AVX2-width two-row form with
/// masked high bits 1.07-1.22x in L3, 1.05-1.15x from memory; Q2_K against the AVX2 one-row
/// dot 1.08-1.25x and 1.11-1.25x.
pub(super) fn plug(t: &mut KernelTable, _: super::Avx512) {
    t.set_vec_dot(DType::Q2_K, vec_dot_q2_K_q8_K);
    t.set_vec_dot_stream(DType::Q2_K, vec_dot_q2_K_q8_K_stream);
    t.set_vec_dot2_stream(DType::Q2_K, vec_dot2_q2_K_q8_K_stream);
    t.set_vec_dot(DType::Q3_K, vec_dot_q3_K_q8_K);
    t.set_vec_dot_stream(DType::Q3_K, vec_dot_q3_K_q8_K_stream);
    t.set_vec_dot2_stream(DType::Q3_K, vec_dot2_q3_K_q8_K_stream);
}

/// `ggml_vec_dot_q3_K_q8_K`, bitwise the AVX2 tier's.
fn vec_dot_q3_K_q8_K(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let nb = whole_blocks(n, QK_K, x, Q3B, y, Q8KB);
    // SAFETY: `whole_blocks` caps `nb` so that `x` holds `nb` Q3_K blocks and `y` `nb` Q8_K
    // blocks, all the kernel reads; `plug` installs this only on a CPU with the AVX-512 tier.
    unsafe { q3_K_q8_K_rows::<0, 1>(nb, [x.as_ptr()], y.as_ptr())[0] }
}

/// `vec_dot_q3_K_q8_K` prefetching the weights `STREAM_PF` bytes ahead (decode).
fn vec_dot_q3_K_q8_K_stream(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let nb = whole_blocks(n, QK_K, x, Q3B, y, Q8KB);
    // SAFETY: as `vec_dot_q3_K_q8_K`.
    unsafe { q3_K_q8_K_rows::<STREAM_PF, 1>(nb, [x.as_ptr()], y.as_ptr())[0] }
}

/// Two rows of `vec_dot_q3_K_q8_K_stream` (`KernelTable::vec_dot2_stream`).
fn vec_dot2_q3_K_q8_K_stream(n: usize, x: [&[u8]; 2], y: &[u8]) -> [f32; 2] {
    let nb =
        whole_blocks(n, QK_K, x[0], Q3B, y, Q8KB).min(whole_blocks(n, QK_K, x[1], Q3B, y, Q8KB));
    // SAFETY: `whole_blocks` caps `nb` so that both rows hold `nb` Q3_K blocks and `y` `nb`
    // Q8_K blocks; `plug` installs this only on a CPU with the AVX-512 tier.
    unsafe { q3_K_q8_K_rows::<STREAM_PF, 2>(nb, x.map(<[u8]>::as_ptr), y.as_ptr()) }
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
    const KMASK1: u32 = 0x0303_0303;
    const KMASK2: u32 = 0x0f0f_0f0f;
    let m3 = _mm512_set1_epi8(3);
    let m4 = _mm512_set1_epi8(4);
    let shuffles = q3k_shuffles();
    // High bit `k` in the low half's bytes, `4 + k` in the high half's.
    let bits: [__m512i; 4] = std::array::from_fn(|k| {
        let lo = _mm256_set1_epi8((1u8 << k) as i8);
        let hi = _mm256_set1_epi8((1u8 << (4 + k)) as i8);
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
    });
    let mut acc = [_mm256_setzero_ps(); R];
    for i in 0..nb {
        // SAFETY: block `i < nb` of `y` is readable; the reads cover its d (0..4) and its
        // 256 levels (4..260).
        let (yd, q8) = unsafe {
            let by = y.add(i * Q8KB);
            let qs = by.add(offset_of!(BlockQ8K, qs));
            (rd_f32(by.add(offset_of!(BlockQ8K, d))), q8k_pairs(qs))
        };
        // `maddubs(4, q8)` of every group, shared by the rows.
        let four_q8 = q8.map(|q| _mm512_maddubs_epi16(m4, q));
        for r in 0..R {
            if PF > 0 {
                prefetch_stream::<Q3B>(x[r], i, PF);
            }
            // SAFETY: block `i < nb` of row `r` is readable; the reads cover its hmask (0..32),
            // qs (32..96), scales (96..108) and d (108..110).
            let (hbits, q3bits, aux, xd) = unsafe {
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

            let scales128 = _mm_set_epi32(
                (((aux[1] >> 4) & KMASK2) | (((aux[2] >> 6) & KMASK1) << 4)) as i32,
                (((aux[0] >> 4) & KMASK2) | (((aux[2] >> 4) & KMASK1) << 4)) as i32,
                ((aux[1] & KMASK2) | (((aux[2] >> 2) & KMASK1) << 4)) as i32,
                ((aux[0] & KMASK2) | ((aux[2] & KMASK1) << 4)) as i32,
            );
            let scales128 = _mm_sub_epi8(scales128, _mm_set1_epi8(32));
            let scales = lanes_0011(_mm256_cvtepi8_epi16(scales128));

            let q3l = [
                _mm512_and_si512(q3bits, m3),
                _mm512_and_si512(_mm512_srli_epi16::<2>(q3bits), m3),
                _mm512_and_si512(_mm512_srli_epi16::<4>(q3bits), m3),
                _mm512_and_si512(_mm512_srli_epi16::<6>(q3bits), m3),
            ];
            let p: [__m512i; 4] = std::array::from_fn(|k| {
                // Codes `q3l + 4` where the high bit is set; with `maddubs(4, q8)` subtracted,
                // ggml's 16-bit pair sums exactly (every one below 2 * 7 * 128 in magnitude).
                let set = _mm512_test_epi8_mask(hbits, bits[k]);
                let q3u = _mm512_mask_add_epi8(q3l[k], set, q3l[k], m4);
                let p16 = _mm512_sub_epi16(_mm512_maddubs_epi16(q3u, q8[k]), four_q8[k]);
                _mm512_madd_epi16(_mm512_shuffle_epi8(scales, shuffles[k]), p16)
            });
            acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(halves_sum(p)), acc[r]);
        }
    }
    std::array::from_fn(|r| hsum_float_8(acc[r]))
}

/// The 256 levels of a Q8_K block as four registers: register `k` holds group `k` (levels
/// `32k..32k + 32`) in its low half and group `4 + k` in its high half.
///
/// # Safety
/// `qs` is valid for reading 256 bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn q8k_pairs(qs: *const u8) -> [__m512i; 4] {
    std::array::from_fn(|k| {
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
    std::array::from_fn(|k| _mm512_broadcast_i64x4(scale_shuffle_q3k(k as i8)))
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

/// `ggml_vec_dot_q2_K_q8_K`, bitwise the AVX2 tier's.
fn vec_dot_q2_K_q8_K(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let nb = whole_blocks(n, QK_K, x, Q2B, y, Q8KB);
    // SAFETY: `whole_blocks` caps `nb` so that `x` holds `nb` Q2_K blocks and `y` `nb` Q8_K
    // blocks, all the kernel reads; `plug` installs this only on a CPU with the AVX-512 tier.
    unsafe { q2_K_q8_K_rows::<0, 1>(nb, [x.as_ptr()], y.as_ptr())[0] }
}

/// `vec_dot_q2_K_q8_K` prefetching the weights `STREAM_PF` bytes ahead (decode).
fn vec_dot_q2_K_q8_K_stream(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let nb = whole_blocks(n, QK_K, x, Q2B, y, Q8KB);
    // SAFETY: as `vec_dot_q2_K_q8_K`.
    unsafe { q2_K_q8_K_rows::<STREAM_PF, 1>(nb, [x.as_ptr()], y.as_ptr())[0] }
}

/// Two rows of `vec_dot_q2_K_q8_K_stream` (`KernelTable::vec_dot2_stream`).
fn vec_dot2_q2_K_q8_K_stream(n: usize, x: [&[u8]; 2], y: &[u8]) -> [f32; 2] {
    let nb =
        whole_blocks(n, QK_K, x[0], Q2B, y, Q8KB).min(whole_blocks(n, QK_K, x[1], Q2B, y, Q8KB));
    // SAFETY: `whole_blocks` caps `nb` so that both rows hold `nb` Q2_K blocks and `y` `nb`
    // Q8_K blocks; `plug` installs this only on a CPU with the AVX-512 tier.
    unsafe { q2_K_q8_K_rows::<STREAM_PF, 2>(nb, x.map(<[u8]>::as_ptr), y.as_ptr()) }
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
    let m3 = _mm512_set1_epi8(3);
    let m4 = _mm_set1_epi8(0xF);
    let shuffles = q3k_shuffles();
    let mut acc = [_mm256_setzero_ps(); R];
    for i in 0..nb {
        // SAFETY: block `i < nb` of `y` is readable; the reads cover its d (0..4), levels
        // (4..260) and bsums (260..292).
        let (yd, q8, bsums) = unsafe {
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
            // SAFETY: block `i < nb` of row `r` is readable; the reads cover its scales (0..16),
            // qs (16..80), d and dmin (80..84).
            let (xd, xdmin, mins_and_scales, q2bits) = unsafe {
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
            let q2l = [
                _mm512_and_si512(q2bits, m3),
                _mm512_and_si512(_mm512_srli_epi16::<2>(q2bits), m3),
                _mm512_and_si512(_mm512_srli_epi16::<4>(q2bits), m3),
                _mm512_and_si512(_mm512_srli_epi16::<6>(q2bits), m3),
            ];
            let p: [__m512i; 4] = std::array::from_fn(|k| {
                let p16 = _mm512_maddubs_epi16(q2l[k], q8[k]);
                _mm512_madd_epi16(_mm512_shuffle_epi8(scales, shuffles[k]), p16)
            });
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(halves_sum(p)), acc[r]);
        }
    }
    std::array::from_fn(|r| hsum_float_8(acc[r]))
}
