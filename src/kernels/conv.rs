//! Kernels of the convolutions (conv_2d, conv_3d) and im2col, portable versions: rounding a
//! patch row through F16 (F16 kernels multiply in their type, as ggml does) and the F32 -> F16
//! row conversion of im2col (the products run on the GEMM engine). The AVX2 tier's
//! versions, with the same names and results, are in `x86/avx2_conv.rs`. A tier's set is the
//! `conv` entry of its `KernelTable`. Needs no CPU feature.

use crate::quant::fp::fp32_to_fp16_f16c;
use crate::quant::util::fp16_to_fp32;

/// Function pointers for one tier (the `conv` entry of a `KernelTable`).
#[derive(Clone, Copy)]
pub(crate) struct ConvKernels {
    /// Rounds every value to the nearest F16 (round to nearest even) and back.
    pub round_f16: fn(x: &mut [f32]),
    /// F32 to F16 little-endian bytes (round to nearest even); converts
    /// `min(src.len(), dst.len() / 2)` values.
    pub to_f16: fn(src: &[f32], dst: &mut [u8]),
}

/// F16 rounding as F16C's `vcvtps2ph` does it (a NaN keeps its payload), then back to F32.
pub(crate) fn round_f16(x: &mut [f32]) {
    for v in x {
        *v = fp16_to_fp32(fp32_to_fp16_f16c(*v));
    }
}

/// F32 to F16 bytes as F16C's `vcvtps2ph` does it (the F16 format's `from_float`).
pub(crate) fn to_f16(src: &[f32], dst: &mut [u8]) {
    for (d, &v) in dst.chunks_exact_mut(2).zip(src) {
        d.copy_from_slice(&fp32_to_fp16_f16c(v).to_le_bytes());
    }
}

/// The portable set.
pub(crate) const PORTABLE: ConvKernels = ConvKernels { round_f16, to_f16 };

#[cfg(test)]
mod tests {
    use super::*;

    fn row(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| {
                (i as f32 - n as f32 / 2.0) * 1.37e-2 + ((i * 7 + seed * 13) as f32).cos() * 3.0
            })
            .collect()
    }

    /// The portable conversions give the F16 format's bytes (a NaN keeps its payload, as F16C).
    #[test]
    fn portable_f16_conversions_match_the_f16_format() {
        let mut x = row(1003, 1);
        x.extend([0.0, -0.0, 65504.0, 65520.0, 1e-8, 6.1e-5, f32::INFINITY, -1e9]);
        x.push(f32::from_bits(0x7fc1_2345));
        let from = crate::quant::format(crate::dtype::DType::F16).from_float.expect("F16");
        let (mut want, mut got) = (vec![0u8; 2 * x.len()], vec![0u8; 2 * x.len()]);
        from(&x, &mut want);
        to_f16(&x, &mut got);
        assert_eq!(got, want);
        let mut r = x.clone();
        round_f16(&mut r);
        let back: Vec<u32> = want
            .chunks_exact(2)
            .map(|c| fp16_to_fp32(u16::from_le_bytes([c[0], c[1]])).to_bits())
            .collect();
        assert_eq!(r.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), back);
    }
}
