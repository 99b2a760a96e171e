//! ggml's f16 lookup tables for GELU and quick GELU (`ggml_table_gelu_f16`,
//! `ggml_table_gelu_quick_f16`, filled in `ggml_cpu_init`): one f16 result per f16 input bit
//! pattern. ggml's CPU backend computes GELU and quick GELU through them (GGML_GELU_FP16,
//! GGML_GELU_QUICK_FP16 in vec.h), so results are bit-exact only if we do the same. Built once, on
//! first use. Needs no CPU feature.

use crate::quant::util::{fp16_to_fp32, fp32_to_fp16};
use std::sync::OnceLock;

pub(crate) const GELU_COEF_A: f32 = 0.044715;
pub(crate) const GELU_QUICK_COEF: f32 = -1.702;
pub(crate) const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// ggml_gelu_f32 as ggml's default x86 build computes it: GCC contracts `1 + A*x*x` into one
/// fused multiply-add (checked against `gcc -O3 -march=native`; the tables' bits depend on it).
#[inline]
pub(crate) fn gelu_f32(x: f32) -> f32 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (GELU_COEF_A * x).mul_add(x, 1.0)).tanh())
}

/// ggml_gelu_quick_f32.
#[inline]
pub(crate) fn gelu_quick_f32(x: f32) -> f32 {
    x * (1.0 / (1.0 + (GELU_QUICK_COEF * x).exp()))
}

/// f32 -> f16 as F16C's `vcvtps2ph` (what ggml's table initialisation uses on x86): the portable
/// conversion, except that NaNs keep their payload.
fn to_f16_hw(v: f32) -> u16 {
    if v.is_nan() {
        let b = v.to_bits();
        (((b >> 16) & 0x8000) | 0x7E00 | ((b >> 13) & 0x3FF)) as u16
    } else {
        fp32_to_fp16(v)
    }
}

fn build(f: fn(f32) -> f32) -> Box<[u16]> {
    (0..=u16::MAX).map(|i| to_f16_hw(f(fp16_to_fp32(i)))).collect()
}

/// GELU of every f16 value, indexed by its bits.
pub(crate) fn gelu_table() -> &'static [u16] {
    static T: OnceLock<Box<[u16]>> = OnceLock::new();
    T.get_or_init(|| build(gelu_f32))
}

/// Quick GELU of every f16 value, indexed by its bits.
pub(crate) fn gelu_quick_table() -> &'static [u16] {
    static T: OnceLock<Box<[u16]>> = OnceLock::new();
    T.get_or_init(|| build(gelu_quick_f32))
}

/// ggml's `ggml_vec_gelu_f32` with GGML_GELU_FP16: saturates outside [-10, 10], else looks up the
/// f16-rounded input.
#[inline(always)]
pub(crate) fn gelu_lookup(t: &[u16], x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        fp16_to_fp32(t[fp32_to_fp16(x) as usize])
    }
}

/// ggml's `ggml_vec_gelu_quick_f32` with GGML_GELU_QUICK_FP16 (no saturation).
#[inline(always)]
pub(crate) fn gelu_quick_lookup(t: &[u16], x: f32) -> f32 {
    fp16_to_fp32(t[fp32_to_fp16(x) as usize])
}
