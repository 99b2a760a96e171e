//! AVX-512 (F, BW, DQ, VL + VNNI) register-tile kernels for Q4_0 and Q8_0 weights against Q8_0
//! activations: the AVX2 tier's `avx2_gemm.rs` tiles with the integer part of two blocks at a
//! time in one 512-bit `vpdpbusd`. The integers are the AVX2 kernels' (the same sign trick and
//! the same four-byte groups, no saturation in either), and the float accumulation stays one
//! 8-lane multiply-add per block in block order, so every output is bitwise what the AVX2 tier
//! (and ggml's AVX2 `vec_dot`) returns.
//!
//! [`plug`] installs the wrappers only when `Isa::Avx512` is supported and the CPU has
//! AVX512_VNNI, which is what makes their `unsafe` calls sound.

use std::arch::x86_64::*;
use std::mem::{offset_of, size_of};

use super::avx2_quants::{F16_TO_F32, bytes_from_nibbles_32, hsum_float_8, rd_u16};
use crate::dtype::DType;
use crate::kernels::{GEMM_MR, GEMM_NR, KernelTable};
use crate::quant::legacy::{BlockQ4_0, BlockQ8_0};

const _: () = assert!(GEMM_MR == 4 && GEMM_NR == 2, "update the tile dispatch below");

/// Registers the tiles (called by the AVX-512 tier's `plug` on a CPU with AVX512_VNNI).
pub(crate) fn plug(t: &mut KernelTable, _: super::Avx512) {
    t.set_gemm(DType::Q4_0, gemm_q4_0_q8_0);
    t.set_gemm(DType::Q8_0, gemm_q8_0_q8_0);
}

fn gemm_q4_0_q8_0(k: usize, x: &[&[u8]], y: &[&[u8]], out: &mut [f32]) {
    gemm_q0::<true>(k, x, y, out);
}

fn gemm_q8_0_q8_0(k: usize, x: &[&[u8]], y: &[&[u8]], out: &mut [f32]) {
    gemm_q0::<false>(k, x, y, out);
}

/// How far ahead (bytes) each weight row is prefetched: the rows of a decode step stream from
/// memory, four at a time, more streams than the hardware prefetcher follows well (q8_0
/// 4096x14336 decode on Zen 5: 73 GFLOPS without, 92-102 at 2 KiB, 89-104 at 4 KiB).
const PF: usize = 2048;

q0_tile_driver!(tile_q0_avx512);

/// The quants of weight block `ib` of row `bx` as 32 signed bytes (Q4_0: nibbles - 8, low
/// nibbles first; Q8_0: as stored) and its scale.
///
/// # Safety
/// Block `ib` of `bx` is readable.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn x_quants<const Q4: bool>(bx: *const u8, ib: usize) -> (__m256i, f32) {
    // SAFETY: the reads stay inside block ib (field offset plus length <= block size).
    unsafe {
        let b = bx.add(ib * x_block::<Q4>());
        if Q4 {
            let d = F16_TO_F32[rd_u16(b.add(offset_of!(BlockQ4_0, d))) as usize];
            let q = _mm_loadu_si128(b.add(offset_of!(BlockQ4_0, qs)).cast());
            (_mm256_sub_epi8(bytes_from_nibbles_32(q), _mm256_set1_epi8(8)), d)
        } else {
            let d = F16_TO_F32[rd_u16(b.add(offset_of!(BlockQ8_0, d))) as usize];
            (_mm256_loadu_si256(b.add(offset_of!(BlockQ8_0, qs)).cast()), d)
        }
    }
}

/// Block `ib` of Q8_0 activation row `by`: quants and scale.
///
/// # Safety
/// Block `ib` of `by` is readable.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn y_quants(by: *const u8, ib: usize) -> (__m256i, f32) {
    // SAFETY: both reads stay inside the 34-byte block ib.
    unsafe {
        let b = by.add(ib * size_of::<BlockQ8_0>());
        let d = F16_TO_F32[rd_u16(b.add(offset_of!(BlockQ8_0, d))) as usize];
        (_mm256_loadu_si256(b.add(offset_of!(BlockQ8_0, qs)).cast()), d)
    }
}

/// ggml's `mul_sum_i8_pairs` integers for 64 bytes (two blocks): `|x|` times `y` with `x`'s
/// sign, summed over each group of four bytes (`vpsignb`'s zero case needs no care: `|x|` is 0
/// there).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
fn dot_i8x64(x: __m512i, y: __m512i) -> __m512i {
    let neg = _mm512_movepi8_mask(x);
    let sy = _mm512_mask_sub_epi8(y, neg, _mm512_setzero_si512(), y);
    _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(x), sy)
}

/// The same for one block (32 bytes).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
fn dot_i8x32(x: __m256i, y: __m256i) -> __m256i {
    let neg = _mm256_movepi8_mask(x);
    let sy = _mm256_mask_sub_epi8(y, neg, _mm256_setzero_si256(), y);
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(x), sy)
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// `R x C` dot products of `nb` blocks each, result `[c][r]`; bitwise the AVX2 tile's.
///
/// # Safety
/// The CPU has the AVX-512 tier and AVX512_VNNI; every `x[r]` points to `nb` readable weight
/// blocks and every `y[c]` to `nb` readable Q8_0 blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile_q0_avx512<const Q4: bool, const R: usize, const C: usize>(
    nb: usize,
    x: [*const u8; R],
    y: [*const u8; C],
) -> [[f32; R]; C] {
    let xb = x_block::<Q4>();
    let mut acc = [[_mm256_setzero_ps(); R]; C];
    let mut ib = 0;
    while ib + 2 <= nb {
        let mut qx = [_mm512_setzero_si512(); R];
        let mut dx = [[0.0f32; 2]; R];
        for r in 0..R {
            // Prefetch a hint ahead (never faults; the address may pass the row's end).
            let ahead = x[r].wrapping_add(ib * xb + PF);
            _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8);
            // SAFETY: blocks ib, ib + 1 < nb of row r are readable (caller).
            let ((q0, d0), (q1, d1)) =
                unsafe { (x_quants::<Q4>(x[r], ib), x_quants::<Q4>(x[r], ib + 1)) };
            qx[r] = join(q0, q1);
            dx[r] = [d0, d1];
        }
        for c in 0..C {
            // SAFETY: blocks ib, ib + 1 < nb of activation row c are readable (caller).
            let ((y0, e0), (y1, e1)) = unsafe { (y_quants(y[c], ib), y_quants(y[c], ib + 1)) };
            let qy = join(y0, y1);
            for r in 0..R {
                let s = _mm512_cvtepi32_ps(dot_i8x64(qx[r], qy));
                let (lo, hi) = (_mm512_castps512_ps256(s), _mm512_extractf32x8_ps::<1>(s));
                // The AVX2 order: block ib's multiply-add, then block ib + 1's.
                let a = _mm256_fmadd_ps(_mm256_set1_ps(dx[r][0] * e0), lo, acc[c][r]);
                acc[c][r] = _mm256_fmadd_ps(_mm256_set1_ps(dx[r][1] * e1), hi, a);
            }
        }
        ib += 2;
    }
    if ib < nb {
        let mut qx = [_mm256_setzero_si256(); R];
        let mut dx = [0.0f32; R];
        for r in 0..R {
            // SAFETY: block ib < nb of row r is readable.
            (qx[r], dx[r]) = unsafe { x_quants::<Q4>(x[r], ib) };
        }
        for c in 0..C {
            // SAFETY: block ib < nb of activation row c is readable.
            let (qy, e) = unsafe { y_quants(y[c], ib) };
            for r in 0..R {
                let s = _mm256_cvtepi32_ps(dot_i8x32(qx[r], qy));
                acc[c][r] = _mm256_fmadd_ps(_mm256_set1_ps(dx[r] * e), s, acc[c][r]);
            }
        }
    }
    let mut res = [[0.0f32; R]; C];
    for c in 0..C {
        for r in 0..R {
            res[c][r] = hsum_float_8(acc[c][r]);
        }
    }
    res
}

#[cfg(test)]
mod tests {
    use super::super::test_util::avx2_and_avx512;
    use crate::dtype::DType;
    use crate::testdata::Xorshift32;

    /// Every tile shape gives the AVX2 tier's bits, for odd and even block counts, on rows with
    /// -128 activations, zero weights and extreme scales.
    #[test]
    fn avx512_vnni_tiles_give_the_avx2_tiers_bits() {
        let Some((t2, t5)) = avx2_and_avx512(true) else { return };
        let mut r = Xorshift32::from_state(0x1234_5678);
        for dt in [DType::Q4_0, DType::Q8_0] {
            for nb in [1usize, 2, 3, 8, 33] {
                let k = nb * 32;
                let row = |r: &mut Xorshift32, tsz: usize| -> Vec<u8> {
                    (0..nb * tsz)
                        .map(|i| if i % tsz == 1 { 0x3c } else { r.next_u32() as u8 })
                        .collect::<Vec<u8>>()
                };
                let xs: Vec<Vec<u8>> = (0..4).map(|_| row(&mut r, dt.type_size())).collect();
                let mut ys: Vec<Vec<u8>> = (0..2).map(|_| row(&mut r, 34)).collect();
                ys[1][2] = 0x80; // a -128 activation
                let xr: Vec<&[u8]> = xs.iter().map(|v| &v[..]).collect();
                let yr: Vec<&[u8]> = ys.iter().map(|v| &v[..]).collect();
                for r in 1..=4 {
                    for c in 1..=2 {
                        let (mut o2, mut o5) = ([0f32; 8], [0f32; 8]);
                        (t2.gemm(dt).unwrap())(k, &xr[..r], &yr[..c], &mut o2);
                        (t5.gemm(dt).unwrap())(k, &xr[..r], &yr[..c], &mut o5);
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&o2), bits(&o5), "{dt} nb={nb} {r}x{c}");
                    }
                }
            }
        }
    }
}
