//! AVX2 register-tile matmul kernels for Q8_0 and Q4_0 weights against Q8_0 activations (needs
//! AVX2, FMA and F16C), in the spirit of ggml's `tinyBLAS_Q0_AVX` (llamafile/sgemm.cpp).
//!
//! A tile of `R` weight rows by `C` activation rows loads each weight block once for `C` outputs
//! and each activation block once for `R` outputs. Every output keeps its own 8-lane accumulator,
//! fed in the same order and with the same operations as `vec_dot_*_avx2` in `avx2_quants.rs`, and
//! is reduced with the same `hsum_float_8`; so a tile returns bit for bit what the AVX2 `vec_dot`
//! returns for each pair, whatever the tile shape or the thread that computes it.
//!
//! The wrappers are private: [`plug`] installs them only after `Isa::Avx2.is_supported()` was
//! checked, which is what makes their `unsafe` calls sound.

use std::arch::x86_64::*;
use std::mem::{offset_of, size_of};

use super::avx2_quants::{
    bytes_from_nibbles_32, fp16_to_fp32, hsum_float_8, mul_sum_i8_pairs_float, rd_u16,
};
use crate::dtype::DType;
use crate::kernels::{GEMM_MR, GEMM_NR, KernelTable};
use crate::quant::legacy::{BlockQ4_0, BlockQ8_0};

const _: () = assert!(GEMM_MR == 4 && GEMM_NR == 2, "update the tile dispatch below");

/// Registers the tile kernels of this file in `t` (called by `plug_avx2` for a supported CPU).
pub(crate) fn plug(t: &mut KernelTable, _: super::Avx2) {
    t.set_gemm(DType::Q4_0, gemm_q4_0_q8_0);
    t.set_gemm(DType::Q8_0, gemm_q8_0_q8_0);
}

/// Q4_0 weights against Q8_0 activations: `out[c * x.len() + r] = vec_dot_q4_0_q8_0(x[r], y[c])`.
fn gemm_q4_0_q8_0(k: usize, x: &[&[u8]], y: &[&[u8]], out: &mut [f32]) {
    gemm_q0::<true>(k, x, y, out);
}

/// Q8_0 weights against Q8_0 activations: `out[c * x.len() + r] = vec_dot_q8_0_q8_0(x[r], y[c])`.
fn gemm_q8_0_q8_0(k: usize, x: &[&[u8]], y: &[&[u8]], out: &mut [f32]) {
    gemm_q0::<false>(k, x, y, out);
}

q0_tile_driver!(tile_q0_avx2);

/// `R x C` dot products of `nb` blocks each: `R` Q4_0 (when `Q4`) or Q8_0 weight rows against `C`
/// Q8_0 activation rows. Result `[c][r]`.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; every `x[r]` points to `nb` readable weight blocks and
/// every `y[c]` to `nb` readable Q8_0 blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_q0_avx2<const Q4: bool, const R: usize, const C: usize>(
    nb: usize,
    x: [*const u8; R],
    y: [*const u8; C],
) -> [[f32; R]; C] {
    const YB: usize = size_of::<BlockQ8_0>();
    let xb = x_block::<Q4>();
    let mut acc = [[_mm256_setzero_ps(); R]; C];
    for ib in 0..nb {
        let mut qx = [_mm256_setzero_si256(); R];
        let mut dx = [0.0f32; R];
        for r in 0..R {
            // SAFETY: block `ib < nb` of row `r` is readable (caller), and each read stays inside
            // that block: field offset plus read length is at most the block size.
            unsafe {
                let bx = x[r].add(ib * xb);
                if Q4 {
                    dx[r] = fp16_to_fp32(rd_u16(bx.add(offset_of!(BlockQ4_0, d))));
                    let q = _mm_loadu_si128(bx.add(offset_of!(BlockQ4_0, qs)).cast());
                    qx[r] = _mm256_sub_epi8(bytes_from_nibbles_32(q), _mm256_set1_epi8(8));
                } else {
                    dx[r] = fp16_to_fp32(rd_u16(bx.add(offset_of!(BlockQ8_0, d))));
                    qx[r] = _mm256_loadu_si256(bx.add(offset_of!(BlockQ8_0, qs)).cast());
                }
            }
        }
        for c in 0..C {
            // SAFETY: block `ib < nb` of activation row `c` is readable (caller); both reads stay
            // inside the 34-byte Q8_0 block.
            let (dy, qy) = unsafe {
                let by = y[c].add(ib * YB);
                (
                    fp16_to_fp32(rd_u16(by.add(offset_of!(BlockQ8_0, d)))),
                    _mm256_loadu_si256(by.add(offset_of!(BlockQ8_0, qs)).cast()),
                )
            };
            for r in 0..R {
                // Same operations and order as vec_dot_q{4,8}_0_q8_0_avx2: bitwise equal results.
                let d = _mm256_set1_ps(dx[r] * dy);
                acc[c][r] = _mm256_fmadd_ps(d, mul_sum_i8_pairs_float(qx[r], qy), acc[c][r]);
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
