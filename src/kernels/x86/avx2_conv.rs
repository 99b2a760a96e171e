//! AVX2 tier of the convolution kernels (`../conv.rs`, same names): the register tile for the
//! direct convolutions (conv_2d, conv_3d), 4 kernel rows against 2 unfolded patch rows with one
//! 8-lane accumulator per output, so each load feeds more than one FMA (a plain dot product needs
//! two loads per FMA); and the F16 rounding and conversion with F16C. Needs AVX2, FMA and F16C.

use crate::kernels::conv::ConvKernels;
use std::arch::x86_64::*;

/// The AVX2 set (the `conv` entry of the tier's table), for a CPU that `cpu` proves runs it.
pub(crate) fn kernels(cpu: super::Avx2) -> ConvKernels {
    let _ = cpu;
    ConvKernels { tile_f32_4x2, round_f16, to_f16 }
}

#[target_feature(enable = "avx2,fma")]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

#[target_feature(enable = "avx2,fma")]
fn tile_f32_4x2_avx2(k: usize, a: [&[f32]; 4], b: [&[f32]; 2], out: &mut [f32; 8]) {
    let n8 = k & !7;
    let mut acc = [[_mm256_setzero_ps(); 2]; 4];
    let mut i = 0;
    while i < n8 {
        // SAFETY: i + 8 <= n8 <= k, and the caller checked every slice holds at least k values.
        unsafe {
            let b0 = _mm256_loadu_ps(b[0].as_ptr().add(i));
            let b1 = _mm256_loadu_ps(b[1].as_ptr().add(i));
            for r in 0..4 {
                let av = _mm256_loadu_ps(a[r].as_ptr().add(i));
                acc[r][0] = _mm256_fmadd_ps(av, b0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(av, b1, acc[r][1]);
            }
        }
        i += 8;
    }
    for r in 0..4 {
        for c in 0..2 {
            let mut s = hsum(acc[r][c]);
            for j in n8..k {
                s = a[r][j].mul_add(b[c][j], s);
            }
            out[r * 2 + c] = s;
        }
    }
}

/// See `conv::ConvTileFn`.
///
/// # Panics
/// If a row is shorter than `k` (an internal invariant of the conv drivers).
fn tile_f32_4x2(k: usize, a: [&[f32]; 4], b: [&[f32]; 2], out: &mut [f32; 8]) {
    assert!(a.iter().chain(b.iter()).all(|s| s.len() >= k), "conv tile rows shorter than k");
    // SAFETY: this function is private and leaves this file only through `kernels`, which takes
    // an `Avx2` token (made only for a CPU with AVX2, FMA and F16C); lengths checked above.
    unsafe { tile_f32_4x2_avx2(k, a, b, out) }
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
