//! AVX-512 (F, BW, DQ, VL + VNNI) kernels for the repacked Q4_0, IQ4_NL and MXFP4 weights (the
//! layout and contract of `kernels/repack.rs`; the AVX2 twins are in `avx2_repack.rs`).
//!
//! A group block holds 8 steps of 4 elements of 8 rows. Two steps share one 512-bit register (a
//! 64-byte load of two consecutive 32-byte quant loads gives steps p and p + 1 after the nibble
//! split), their activation bytes are spread over the two halves by one permute, and one
//! `vpdpbusd` does 64 multiply-adds with 32-bit sums; the two halves are added at the end of the
//! block. Levels are unsigned (IQ4_NL's shifted by +128, MXFP4's by +12, the shift times the
//! activation sum subtracted). The integer block sums are exactly the AVX2 kernels' (no saturation in either), and
//! the float scale-and-accumulate is the same 8-lane multiply-add per block and column, so the
//! accumulators come out bitwise the AVX2 tier's.
//!
//! [`plug`] installs the wrappers only when `Isa::Avx512` is supported and the CPU has
//! AVX512_VNNI, which is what makes their `unsafe` calls sound.

use std::arch::x86_64::*;

use crate::dtype::DType;
use crate::kernels::KernelTable;
use crate::kernels::repack::{KIND_IQ4_NL, KIND_MXFP4, KIND_Q4_0, REPACK_NC, Y0_BYTES};
use crate::quant::fp4::{KVALUES_MXFP4, e8m0_to_fp32_half};
use crate::quant::iq::grids::KVALUES_IQ4NL;

/// Registers the kernels (called by the AVX-512 tier's `plug` on a CPU with AVX512_VNNI).
pub(crate) fn plug(t: &mut KernelTable, _: super::Avx512) {
    t.set_repack(DType::Q4_0, gemm_q4_0_x8);
    t.set_repack(DType::IQ4_NL, gemm_iq4_nl_x8);
    t.set_repack(DType::MXFP4, gemm_mxfp4_x8);
}

/// How far ahead the single-column kernels prefetch weights: the AVX2 twins' distance.
use super::avx2_repack::PREFETCH_BYTES;

q0_repack_driver!();

/// # Safety
/// The AVX-512 tier and VNNI are available; `x` points at `nb` group blocks; `y` has NC rows of
/// at least `nb` Y0 blocks; `acc` has NC entries.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q0_kernel<const KIND: u8, const NC: usize>(
    nb: usize,
    x: *const u8,
    y: &[&[u8]],
    acc: &mut [[f32; 8]],
) {
    let gb = q0_group_bytes(KIND);
    let qo = if KIND == KIND_MXFP4 { 8 } else { 16 };
    let yp: [*const u8; NC] = std::array::from_fn(|c| y[c].as_ptr());
    // SAFETY: acc has NC entries of 8 floats (caller contract).
    let mut av: [__m256; NC] = std::array::from_fn(|c| unsafe { _mm256_loadu_ps(acc[c].as_ptr()) });
    // The levels as unsigned bytes: IQ4_NL's (-127..=113) shifted by +128 and MXFP4's by +12;
    // the shift times the activation block's sum comes off the 32-bit block sum (exact), which
    // spares the sign trick's two operations per step.
    let shifted: [u8; 16] = std::array::from_fn(|i| {
        if KIND == KIND_IQ4_NL {
            (KVALUES_IQ4NL[i] as i32 + 128) as u8
        } else {
            (KVALUES_MXFP4[i] as i32 + 12) as u8
        }
    });
    // SAFETY: 16 bytes.
    let lut = unsafe { _mm512_broadcast_i32x4(_mm_loadu_si128(shifted.as_ptr() as *const _)) };
    let m4 = _mm512_set1_epi8(0x0F);
    // The step pairs of the four level registers: (0, 1), (4, 5), (2, 3), (6, 7).
    let pair = |a: i32, b: i32| _mm512_setr_epi32(a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b);
    let idx = [pair(0, 1), pair(4, 5), pair(2, 3), pair(6, 7)];
    for b in 0..nb {
        // SAFETY: b < nb group blocks of gb bytes (caller contract).
        let xb = unsafe { x.add(b * gb) };
        if NC == 1 {
            // Decode streams the weights once: ask for the lines a few blocks ahead (a hint; an
            // address past the end is never dereferenced).
            _mm_prefetch::<_MM_HINT_T0>(xb.wrapping_add(PREFETCH_BYTES) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(xb.wrapping_add(PREFETCH_BYTES + 64) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(xb.wrapping_add(PREFETCH_BYTES + 128) as *const i8);
        }
        let dx = if KIND == KIND_MXFP4 {
            // SAFETY: the block starts with 8 E8M0 bytes.
            let e = |r: usize| e8m0_to_fp32_half(unsafe { *xb.add(r) });
            _mm256_setr_ps(e(0), e(1), e(2), e(3), e(4), e(5), e(6), e(7))
        } else {
            // SAFETY: the block starts with 8 f16 scales (16 bytes).
            _mm256_cvtph_ps(unsafe { _mm_loadu_si128(xb as *const __m128i) })
        };
        // SAFETY: the 128 quant bytes follow the scales inside the block.
        let (r01, r23) = unsafe {
            (_mm512_loadu_si512(xb.add(qo).cast()), _mm512_loadu_si512(xb.add(qo + 64).cast()))
        };
        let lv = |r: __m512i| {
            let (lo, hi) =
                (_mm512_and_si512(r, m4), _mm512_and_si512(_mm512_srli_epi16::<4>(r), m4));
            if KIND == KIND_Q4_0 {
                (lo, hi)
            } else {
                (_mm512_shuffle_epi8(lut, lo), _mm512_shuffle_epi8(lut, hi))
            }
        };
        let ((x01, x45), (x23, x67)) = (lv(r01), lv(r23));
        let xs = [x01, x45, x23, x67];
        for c in 0..NC {
            // SAFETY: b < nb activation blocks of Y0_BYTES in row c (caller contract).
            let yb = unsafe { yp[c].add(b * Y0_BYTES) };
            // SAFETY: Y0 = {d: f32, sum: i32, qs: [i8; 32]}, all inside the block.
            let (dy, ysum, yq) = unsafe {
                (
                    (yb as *const f32).read_unaligned(),
                    (yb.add(4) as *const i32).read_unaligned(),
                    _mm512_castsi256_si512(_mm256_loadu_si256(yb.add(8).cast())),
                )
            };
            let mut s = _mm512_setzero_si512();
            for i in 0..4 {
                s = _mm512_dpbusd_epi32(s, xs[i], _mm512_permutexvar_epi32(idx[i], yq));
            }
            let s8 = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64::<1>(s));
            let sumi = match KIND {
                KIND_Q4_0 => _mm256_sub_epi32(s8, _mm256_set1_epi32(8 * ysum)),
                KIND_MXFP4 => _mm256_sub_epi32(s8, _mm256_set1_epi32(12 * ysum)),
                _ => _mm256_sub_epi32(s8, _mm256_set1_epi32(128 * ysum)),
            };
            let sc = _mm256_mul_ps(dx, _mm256_set1_ps(dy));
            av[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), sc, av[c]);
        }
    }
    for c in 0..NC {
        // SAFETY: acc has NC entries of 8 floats.
        unsafe { _mm256_storeu_ps(acc[c].as_mut_ptr(), av[c]) };
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::avx2_and_avx512;
    use crate::dtype::DType;
    use crate::testdata::Xorshift32;

    /// Random group blocks (finite scales) against random activation blocks: the AVX-512 kernels
    /// give the AVX2 kernels' accumulators bit for bit, for 1 to 6 columns (chunks of 4).
    #[test]
    fn avx512_repack_q4_0_family_gives_the_avx2_tiers_bits() {
        let Some((t2, t5)) = avx2_and_avx512(true) else { return };
        let mut rng = Xorshift32::from_state(0x2545_f491);
        for (dt, gb) in [(DType::Q4_0, 144usize), (DType::IQ4_NL, 144), (DType::MXFP4, 136)] {
            let nb = 5;
            let mut x: Vec<u8> = (0..nb * gb).map(|_| rng.next_u32() as u8).collect();
            for b in 0..nb {
                for r in 0..8 {
                    if dt == DType::MXFP4 {
                        x[b * gb + r] = 120 + (rng.next_u32() % 16) as u8; // E8M0 near 1
                    } else {
                        x[b * gb + 2 * r + 1] = 0x38 + (rng.next_u32() % 8) as u8; // f16 high byte
                    }
                }
            }
            let ys: Vec<Vec<u8>> = (0..6)
                .map(|_| {
                    let mut v = vec![0u8; nb * 40];
                    for b in 0..nb {
                        let blk = &mut v[b * 40..(b + 1) * 40];
                        // Q8_0 levels (-127..=127), as the activation converter writes them.
                        let q: Vec<i8> =
                            (0..32).map(|_| ((rng.next_u32() % 255) as i8).max(-127)).collect();
                        let sum: i32 = q.iter().map(|&v| v as i32).sum();
                        blk[0..4].copy_from_slice(
                            &(0.01f32 + (rng.next_u32() % 100) as f32 * 1e-4).to_le_bytes(),
                        );
                        blk[4..8].copy_from_slice(&sum.to_le_bytes());
                        for (d, &v) in blk[8..].iter_mut().zip(&q) {
                            *d = v as u8;
                        }
                    }
                    v
                })
                .collect();
            let yr: Vec<&[u8]> = ys.iter().map(|v| &v[..]).collect();
            for nc in 1..=6 {
                let init: Vec<[f32; 8]> = (0..nc).map(|c| [c as f32 * 0.5; 8]).collect();
                let (mut a2, mut a5) = (init.clone(), init.clone());
                (t2.repack(dt).unwrap())(&x, &yr[..nc], &mut a2);
                (t5.repack(dt).unwrap())(&x, &yr[..nc], &mut a5);
                let bits =
                    |v: &[[f32; 8]]| v.iter().flatten().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a2), bits(&a5), "{dt} nc={nc}");
            }
        }
    }
}
