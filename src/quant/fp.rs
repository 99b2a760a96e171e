//! The plain float formats F32, F16 and BF16 as ggml's format table sees them: conversion from f32
//! (`ggml_quantize_chunk` and the CPU `from_float`), back to f32, and the CPU dot products
//! (src/ggml.c, src/ggml-cpu/ggml-cpu.c, src/ggml-cpu/vec.cpp).
//!
//! The dot products follow the accumulation order of ggml's AVX2 build (four 8-lane accumulators
//! with fused multiply-add, then ggml's reduction tree), so on the same inputs they return the same
//! bits as ggml's x86 CPU backend.

use super::FormatFns;
use super::legacy::{with_blocks, with_blocks_mut};
use super::util::{bf16_to_fp32, fp16_to_fp32, fp32_to_bf16, fp32_to_fp16};
use crate::error::Result;

/// F16C's `vcvtps2ph` with round-to-nearest-even, which ggml's x86 CPU code uses
/// (`GGML_CPU_FP32_TO_FP16`). Same as [`fp32_to_fp16`] for every non-NaN input; a NaN keeps its
/// sign and top payload bits (quieted) instead of becoming `0x7E00`.
#[inline(always)]
pub(crate) fn fp32_to_fp16_f16c(f: f32) -> u16 {
    if f.is_nan() {
        let w = f.to_bits();
        return ((w >> 16) & 0x8000) as u16 | 0x7E00 | ((w >> 13) & 0x03FF) as u16;
    }
    fp32_to_fp16(f)
}

/// ggml's AVX reduction of four 8-lane accumulators (`GGML_F32x8_REDUCE`).
fn reduce_f32x8(s: [[f32; 8]; 4]) -> f32 {
    let s02: [f32; 8] = std::array::from_fn(|l| s[0][l] + s[2][l]);
    let s13: [f32; 8] = std::array::from_fn(|l| s[1][l] + s[3][l]);
    let s0: [f32; 8] = std::array::from_fn(|l| s02[l] + s13[l]);
    let t: [f32; 4] = std::array::from_fn(|l| s0[l] + s0[l + 4]);
    (t[0] + t[1]) + (t[2] + t[3])
}

/// Sums `x[i] * y[i]` over the first `n & !31` elements like ggml's AVX2 `ggml_vec_dot_f32` /
/// `ggml_vec_dot_f16`: element `i` goes to accumulator `(i / 8) % 4`, lane `i % 8`, with FMA.
fn fma_lanes(np: usize, x: impl Fn(usize) -> f32, y: impl Fn(usize) -> f32) -> f32 {
    let mut sum = [[0.0f32; 8]; 4];
    for i in (0..np).step_by(32) {
        for (j, acc) in sum.iter_mut().enumerate() {
            for (l, a) in acc.iter_mut().enumerate() {
                let k = i + j * 8 + l;
                *a = x(k).mul_add(y(k), *a);
            }
        }
    }
    reduce_f32x8(sum)
}

// ------------------------------------------------------------------------------------------------
// F32

fn quantize_f32(src: &[f32], dst: &mut [u8], _n: usize, _imatrix: Option<&[f32]>) -> Result<()> {
    dst.copy_from_slice(bytemuck::cast_slice(src));
    Ok(())
}

fn dequantize_f32(src: &[u8], dst: &mut [f32]) {
    bytemuck::cast_slice_mut::<f32, u8>(dst).copy_from_slice(src);
}

fn from_float_f32(src: &[f32], dst: &mut [u8]) {
    dst.copy_from_slice(bytemuck::cast_slice(src));
}

/// `ggml_vec_dot_f32` as built for AVX2: f32 lanes with FMA, then the tail added in f32 (which
/// the compiler contracts to FMA as well).
pub(crate) fn vec_dot_f32(n: usize, x: &[u8], y: &[u8]) -> f32 {
    with_blocks::<f32, _>(x, |x| {
        with_blocks::<f32, _>(y, |y| {
            let np = n & !31;
            let mut sumf = fma_lanes(np, |i| x[i], |i| y[i]);
            for i in np..n {
                sumf = x[i].mul_add(y[i], sumf);
            }
            sumf
        })
    })
}

// ------------------------------------------------------------------------------------------------
// F16

fn quantize_f16(src: &[f32], dst: &mut [u8], _n: usize, _imatrix: Option<&[f32]>) -> Result<()> {
    with_blocks_mut::<u16>(dst, |d| {
        for (o, &v) in d.iter_mut().zip(src) {
            *o = fp32_to_fp16(v);
        }
    });
    Ok(())
}

fn dequantize_f16(src: &[u8], dst: &mut [f32]) {
    with_blocks::<u16, _>(src, |s| {
        for (o, &h) in dst.iter_mut().zip(s) {
            *o = fp16_to_fp32(h);
        }
    })
}

/// `ggml_cpu_fp32_to_fp16` (F16C).
fn from_float_f16(src: &[f32], dst: &mut [u8]) {
    with_blocks_mut::<u16>(dst, |d| {
        for (o, &v) in d.iter_mut().zip(src) {
            *o = fp32_to_fp16_f16c(v);
        }
    });
}

/// `ggml_vec_dot_f16` as built for AVX2 (F16C loads, f32 FMA lanes, tail in f64).
pub(crate) fn vec_dot_f16(n: usize, x: &[u8], y: &[u8]) -> f32 {
    with_blocks::<u16, _>(x, |x| {
        with_blocks::<u16, _>(y, |y| {
            let np = n & !31;
            let mut sumf = fma_lanes(np, |i| fp16_to_fp32(x[i]), |i| fp16_to_fp32(y[i])) as f64;
            for i in np..n {
                sumf += (fp16_to_fp32(x[i]) * fp16_to_fp32(y[i])) as f64;
            }
            sumf as f32
        })
    })
}

// ------------------------------------------------------------------------------------------------
// BF16

fn quantize_bf16(src: &[f32], dst: &mut [u8], _n: usize, _imatrix: Option<&[f32]>) -> Result<()> {
    from_float_bf16(src, dst);
    Ok(())
}

fn dequantize_bf16(src: &[u8], dst: &mut [f32]) {
    with_blocks::<u16, _>(src, |s| {
        for (o, &h) in dst.iter_mut().zip(s) {
            *o = bf16_to_fp32(h);
        }
    })
}

/// `ggml_cpu_fp32_to_bf16` and `ggml_fp32_to_bf16_row_ref` (the same rounding).
fn from_float_bf16(src: &[f32], dst: &mut [u8]) {
    with_blocks_mut::<u16>(dst, |d| {
        for (o, &v) in d.iter_mut().zip(src) {
            *o = fp32_to_bf16(v);
        }
    });
}

/// `ggml_vec_dot_bf16` as built for AVX2: four 8-lane accumulators, its own reduction order, the
/// tail in f64.
pub(crate) fn vec_dot_bf16(n: usize, x: &[u8], y: &[u8]) -> f32 {
    with_blocks::<u16, _>(x, |x| {
        with_blocks::<u16, _>(y, |y| {
            let np = n & !31;
            let mut c = [[0.0f32; 8]; 4];
            for i in (0..np).step_by(32) {
                for (j, acc) in c.iter_mut().enumerate() {
                    for (l, a) in acc.iter_mut().enumerate() {
                        let k = i + j * 8 + l;
                        *a = bf16_to_fp32(x[k]).mul_add(bf16_to_fp32(y[k]), *a);
                    }
                }
            }
            let s: [f32; 8] = std::array::from_fn(|l| (c[0][l] + c[2][l]) + (c[1][l] + c[3][l]));
            let g: [f32; 4] = std::array::from_fn(|l| s[l + 4] + s[l]);
            let mut sumf = ((g[0] + g[2]) + (g[1] + g[3])) as f64;
            for i in np..n {
                sumf += (bf16_to_fp32(x[i]) * bf16_to_fp32(y[i])) as f64;
            }
            sumf as f32
        })
    })
}

// ------------------------------------------------------------------------------------------------
// Format table entries.

pub(crate) const F32_FNS: FormatFns = FormatFns {
    quantize: Some(quantize_f32),
    requires_imatrix: false,
    dequantize: Some(dequantize_f32),
    from_float: Some(from_float_f32),
    vec_dot: Some(vec_dot_f32),
};

pub(crate) const F16_FNS: FormatFns = FormatFns {
    quantize: Some(quantize_f16),
    requires_imatrix: false,
    dequantize: Some(dequantize_f16),
    from_float: Some(from_float_f16),
    vec_dot: Some(vec_dot_f16),
};

pub(crate) const BF16_FNS: FormatFns = FormatFns {
    quantize: Some(quantize_bf16),
    requires_imatrix: false,
    dequantize: Some(dequantize_bf16),
    from_float: Some(from_float_bf16),
    vec_dot: Some(vec_dot_bf16),
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16c_nan_conversion_keeps_payload() {
        // Values printed by `_cvtss_sh(x, 0)` on an F16C machine.
        for (w, h) in [
            (0x7FEA_B000u32, 0x7F55u16),
            (0xFF80_0001, 0xFE00),
            (0x7FFF_E001, 0x7FFF),
            (0xFFFF_FFFF, 0xFFFF),
            (0x7FC0_0000, 0x7E00),
        ] {
            assert_eq!(fp32_to_fp16_f16c(f32::from_bits(w)), h, "{w:08x}");
        }
        for x in [0.0f32, -0.0, 1.0, 65504.0, 65520.0, 1e-8, 6.1e-5, f32::INFINITY, -1e9] {
            assert_eq!(fp32_to_fp16_f16c(x), fp32_to_fp16(x), "{x}");
        }
    }

    #[test]
    fn float_dots_handle_tails() {
        let x: Vec<f32> = (0..45).map(|i| i as f32 * 0.25 - 3.0).collect();
        let want: f64 = x.iter().map(|&v| (v * v) as f64).sum();
        let b: &[u8] = bytemuck::cast_slice(&x);
        assert!((vec_dot_f32(45, b, b) as f64 - want).abs() < 1e-3);
        let h: Vec<u16> = x.iter().map(|&v| fp32_to_fp16(v)).collect();
        assert!(
            (vec_dot_f16(45, bytemuck::cast_slice(&h), bytemuck::cast_slice(&h)) as f64 - want)
                .abs()
                < 1e-3
        );
        let h: Vec<u16> = x.iter().map(|&v| fp32_to_bf16(v)).collect();
        assert!(
            (vec_dot_bf16(45, bytemuck::cast_slice(&h), bytemuck::cast_slice(&h)) as f64 - want)
                .abs()
                < 1e-3
        );
    }
}
