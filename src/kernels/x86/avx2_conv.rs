//! AVX2 tier of the convolution kernels (`../conv.rs`, same names): the F16 rounding of patch
//! rows and the F32 -> F16 conversion of im2col, with F16C. Needs AVX2, FMA and F16C.

use crate::kernels::conv::ConvKernels;
use std::arch::x86_64::*;

/// The AVX2 set (the `conv` entry of the tier's table), for a CPU that `cpu` proves runs it.
pub(crate) fn kernels(cpu: super::Avx2) -> ConvKernels {
    let _ = cpu;
    ConvKernels { round_f16, to_f16 }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn round_f16_avx2(x: &mut [f32]) {
    let n8 = x.len() & !7;
    let mut i = 0;
    while i < n8 {
        // SAFETY: i + 8 <= x.len().
        unsafe {
            let p = x.as_mut_ptr().add(i);
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(p));
            _mm256_storeu_ps(p, _mm256_cvtph_ps(h));
        }
        i += 8;
    }
    for v in &mut x[n8..] {
        *v = crate::quant::util::fp16_to_fp32(crate::quant::util::fp32_to_fp16(*v));
    }
}

/// Rounds every value to the nearest F16 and back (F16C, round to nearest even: ggml's
/// `GGML_CPU_FP32_TO_FP16` on x86), for convolutions with F16 kernels.
fn round_f16(x: &mut [f32]) {
    // SAFETY: this function is private and leaves this file only through `kernels`, which takes
    // an `Avx2` token (made only for a CPU with AVX2, FMA and F16C).
    unsafe { round_f16_avx2(x) }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn to_f16_avx2(src: &[f32], dst: &mut [u8]) {
    let n = src.len().min(dst.len() / 2);
    let n8 = n & !7;
    let mut i = 0;
    while i < n8 {
        // SAFETY: i + 8 <= n: 8 floats of src and 16 bytes of dst are in bounds.
        unsafe {
            let h =
                _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(src.as_ptr().add(i)));
            _mm_storeu_si128(dst.as_mut_ptr().add(2 * i) as *mut __m128i, h);
        }
        i += 8;
    }
    for j in n8..n {
        let h = crate::quant::util::fp32_to_fp16(src[j]);
        dst[2 * j..2 * j + 2].copy_from_slice(&h.to_le_bytes());
    }
}

/// F32 to F16 (little-endian bytes) with F16C, round to nearest even (ggml's
/// `GGML_CPU_FP32_TO_FP16` on x86); converts `min(src.len(), dst.len() / 2)` values.
fn to_f16(src: &[f32], dst: &mut [u8]) {
    // SAFETY: this function is private and leaves this file only through `kernels`, which takes
    // an `Avx2` token (made only for a CPU with AVX2, FMA and F16C).
    unsafe { to_f16_avx2(src, dst) }
}

#[cfg(test)]
mod tests {
    #[test]
    fn to_f16_matches_the_portable_conversion() {
        let Some(cpu) = super::super::Avx2::detect() else { return };
        let x: Vec<f32> = (0..1003)
            .map(|i| (i as f32 - 500.0) * 1.37e-2 + (i as f32).cos() * 9e4 / (1 + i) as f32)
            .collect();
        let mut got = vec![0u8; 2 * x.len()];
        (super::kernels(cpu).to_f16)(&x, &mut got);
        for (i, &v) in x.iter().enumerate() {
            let h = crate::quant::util::fp32_to_fp16(v);
            assert_eq!(&got[2 * i..2 * i + 2], &h.to_le_bytes(), "{v}");
        }
    }

    #[test]
    fn round_f16_matches_the_portable_conversion() {
        let Some(cpu) = super::super::Avx2::detect() else { return };
        let mut x: Vec<f32> = (0..1000)
            .map(|i| (i as f32 - 500.0) * 0.37e-3 + (i as f32).sin() * 70000.0 / (1 + i) as f32)
            .collect();
        x.extend([0.0, -0.0, 65504.0, 65520.0, 1e-8, 6.1e-5, f32::INFINITY, -1e9]);
        let want: Vec<f32> = x
            .iter()
            .map(|&v| crate::quant::util::fp16_to_fp32(crate::quant::util::fp32_to_fp16(v)))
            .collect();
        (super::kernels(cpu).round_f16)(&mut x);
        assert_eq!(x, want);
    }
}
