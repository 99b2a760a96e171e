//! AVX2 kernels for repacked weights (needs AVX2, FMA and F16C); the scalar twins are in
//! `kernels/repack.rs`, which also describes the contract.
//!
//! One 32-byte load of an interleaved quant field holds 4 consecutive elements of each of the 8
//! rows (two nibbles per byte: 2 steps of 4 elements). Each step multiplies it with the matching 4
//! activation levels broadcast to all rows (`maddubs`), so one instruction does 32
//! multiply-adds, and the 8 rows' block sums come out in the 8 lanes of one register. The
//! unsigned Q4_0 nibbles (and MXFP4 values shifted by +12) sum in 16 bits across steps and are
//! corrected with the activation block's level sum; IQ4_NL's signed values use the sign trick.
//!
//! The wrappers are private: [`plug`] installs them only after `Isa::Avx2.is_supported()` was
//! checked, which is what makes their `unsafe` calls sound.

use std::arch::x86_64::*;

use crate::dtype::DType;
use crate::kernels::KernelTable;
use crate::kernels::repack::{KIND_IQ4_NL, KIND_MXFP4, KIND_Q4_0, REPACK_NC, Y0_BYTES};
use crate::quant::fp4::{KVALUES_MXFP4, e8m0_to_fp32_half};
use crate::quant::iq::grids::KVALUES_IQ4NL;

/// Registers this file's kernels in `t` (called by `plug_avx2` for a supported CPU).
pub(crate) fn plug(t: &mut KernelTable) {
    t.set_repack(DType::Q4_0, gemm_q4_0_x8);
    t.set_repack(DType::IQ4_NL, gemm_iq4_nl_x8);
    t.set_repack(DType::MXFP4, gemm_mxfp4_x8);
}

fn gemm_q4_0_x8(x: &[u8], y: &[&[u8]], acc: &mut [[f32; 8]]) {
    q0::<KIND_Q4_0>(x, y, acc);
}

fn gemm_iq4_nl_x8(x: &[u8], y: &[&[u8]], acc: &mut [[f32; 8]]) {
    q0::<KIND_IQ4_NL>(x, y, acc);
}

fn gemm_mxfp4_x8(x: &[u8], y: &[&[u8]], acc: &mut [[f32; 8]]) {
    q0::<KIND_MXFP4>(x, y, acc);
}

const fn q0_group_bytes(kind: u8) -> usize {
    if kind == KIND_MXFP4 { 136 } else { 144 }
}

#[inline(always)]
fn q0<const KIND: u8>(x: &[u8], y: &[&[u8]], acc: &mut [[f32; 8]]) {
    let nb = x.len() / q0_group_bytes(KIND);
    assert!(acc.len() == y.len() && y.len() <= REPACK_NC, "repack kernel: bad column count");
    assert!(y.iter().all(|c| c.len() >= nb * Y0_BYTES), "repack kernel: activations too short");
    // SAFETY: `plug` installs these wrappers only on CPUs with AVX2, FMA and F16C; x holds `nb`
    // group blocks and every y row `nb` activation blocks (checked above); acc has y.len() rows.
    unsafe {
        match y.len() {
            1 => q0_kernel::<KIND, 1>(nb, x.as_ptr(), y, acc),
            2 => q0_kernel::<KIND, 2>(nb, x.as_ptr(), y, acc),
            3 => q0_kernel::<KIND, 3>(nb, x.as_ptr(), y, acc),
            4 => q0_kernel::<KIND, 4>(nb, x.as_ptr(), y, acc),
            _ => {}
        }
    }
}

/// # Safety
/// AVX2, FMA and F16C are available; `x` points at `nb` group blocks; `y` has NC rows of at least
/// `nb` [`Y0`](crate::kernels::repack::Y0) blocks; `acc` has NC entries.
#[target_feature(enable = "avx2,fma,f16c")]
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
    let m4 = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let lut = if KIND == KIND_IQ4_NL {
        // SAFETY: the table has 16 bytes.
        unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const _)) }
    } else {
        let shifted: [u8; 16] = std::array::from_fn(|i| (KVALUES_MXFP4[i] as i32 + 12) as u8);
        // SAFETY: 16 bytes.
        unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(shifted.as_ptr() as *const _)) }
    };
    for b in 0..nb {
        // SAFETY: b < nb group blocks of gb bytes (caller contract).
        let xb = unsafe { x.add(b * gb) };
        let dx = if KIND == KIND_MXFP4 {
            // SAFETY: the block starts with 8 E8M0 bytes.
            let e = |r: usize| e8m0_to_fp32_half(unsafe { *xb.add(r) });
            _mm256_setr_ps(e(0), e(1), e(2), e(3), e(4), e(5), e(6), e(7))
        } else {
            // SAFETY: the block starts with 8 f16 scales (16 bytes).
            _mm256_cvtph_ps(unsafe { _mm_loadu_si128(xb as *const __m128i) })
        };
        let mut xs = [_mm256_setzero_si256(); 8];
        for p in 0..4 {
            // SAFETY: the quants follow the scales: 4 loads of 32 bytes inside the block.
            let raw = unsafe { _mm256_loadu_si256(xb.add(qo + 32 * p) as *const __m256i) };
            let lo = _mm256_and_si256(raw, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
            if KIND == KIND_Q4_0 {
                xs[p] = lo;
                xs[4 + p] = hi;
            } else {
                xs[p] = _mm256_shuffle_epi8(lut, lo);
                xs[4 + p] = _mm256_shuffle_epi8(lut, hi);
            }
        }
        let ax: [__m256i; 8] =
            if KIND == KIND_IQ4_NL { std::array::from_fn(|s| _mm256_abs_epi8(xs[s])) } else { xs };
        for c in 0..NC {
            // SAFETY: b < nb activation blocks of Y0_BYTES in row c (caller contract).
            let yb = unsafe { yp[c].add(b * Y0_BYTES) };
            // SAFETY: Y0 = {d: f32, sum: i32, qs: [i8; 32]}, all inside the block.
            let (dy, ysum) = unsafe {
                ((yb as *const f32).read_unaligned(), (yb.add(4) as *const i32).read_unaligned())
            };
            // SAFETY: step s reads bytes 8 + 4s .. 12 + 4s of the block.
            let bc = |s: usize| unsafe {
                _mm256_set1_epi32((yb.add(8 + 4 * s) as *const i32).read_unaligned())
            };
            let sumi = if KIND == KIND_Q4_0 {
                // 8 steps of at most 2 * 15 * 128 per 16-bit lane: no overflow.
                let mut a16 = _mm256_maddubs_epi16(xs[0], bc(0));
                for s in 1..8 {
                    a16 = _mm256_add_epi16(a16, _mm256_maddubs_epi16(xs[s], bc(s)));
                }
                _mm256_sub_epi32(_mm256_madd_epi16(a16, ones), _mm256_set1_epi32(8 * ysum))
            } else if KIND == KIND_MXFP4 {
                // Values + 12 <= 24: 4 steps of at most 2 * 24 * 128 per 16-bit lane.
                let mut lo = _mm256_maddubs_epi16(xs[0], bc(0));
                let mut hi = _mm256_maddubs_epi16(xs[4], bc(4));
                for s in 1..4 {
                    lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(xs[s], bc(s)));
                    hi = _mm256_add_epi16(hi, _mm256_maddubs_epi16(xs[4 + s], bc(4 + s)));
                }
                let s32 =
                    _mm256_add_epi32(_mm256_madd_epi16(lo, ones), _mm256_madd_epi16(hi, ones));
                _mm256_sub_epi32(s32, _mm256_set1_epi32(12 * ysum))
            } else {
                // Signed values: |x| times y with x's sign moved onto y; each step is widened to
                // 32 bits before summing (2 * 127 * 127 per 16-bit lane).
                let mut s32 = _mm256_setzero_si256();
                for s in 0..8 {
                    let p = _mm256_maddubs_epi16(ax[s], _mm256_sign_epi8(bc(s), xs[s]));
                    s32 = _mm256_add_epi32(s32, _mm256_madd_epi16(p, ones));
                }
                s32
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
