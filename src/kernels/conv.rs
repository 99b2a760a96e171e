//! Kernels of the direct convolutions (conv_2d, conv_3d) and im2col, portable versions: a 4x2
//! register tile of dot products, rounding a patch row through F16 (F16 kernels multiply in
//! their type, as ggml does) and the F32 -> F16 row conversion of im2col. The AVX2 tier's
//! versions, with the same names and results, are in `x86/avx2_conv.rs`. A tier's set is the
//! `conv` entry of its `KernelTable`. Needs no CPU feature.

use crate::quant::fp::fp32_to_fp16_f16c;
use crate::quant::util::fp16_to_fp32;

/// `out[r * 2 + c] = dot(a[r][..k], b[c][..k])` for 4 kernel rows and 2 patch rows. Each output
/// depends only on its two rows (not on its place in the tile), so duplicated rows fill tails.
/// Every row holds at least `k` values.
pub(crate) type ConvTileFn = fn(k: usize, a: [&[f32]; 4], b: [&[f32]; 2], out: &mut [f32; 8]);

/// Function pointers for one tier (the `conv` entry of a `KernelTable`).
#[derive(Clone, Copy)]
pub(crate) struct ConvKernels {
    /// See [`ConvTileFn`].
    pub tile_f32_4x2: ConvTileFn,
    /// Rounds every value to the nearest F16 (round to nearest even) and back.
    pub round_f16: fn(x: &mut [f32]),
    /// F32 to F16 little-endian bytes (round to nearest even); converts
    /// `min(src.len(), dst.len() / 2)` values.
    pub to_f16: fn(src: &[f32], dst: &mut [u8]),
}

/// See [`ConvTileFn`]: eight portable dot products (`scalar::dot_f32`).
pub(crate) fn tile_f32_4x2(k: usize, a: [&[f32]; 4], b: [&[f32]; 2], out: &mut [f32; 8]) {
    for r in 0..4 {
        for c in 0..2 {
            out[r * 2 + c] = super::scalar::dot_f32(&a[r][..k], &b[c][..k]);
        }
    }
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
pub(crate) const PORTABLE: ConvKernels = ConvKernels { tile_f32_4x2, round_f16, to_f16 };

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{Isa, table_for};

    fn row(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| {
                (i as f32 - n as f32 / 2.0) * 1.37e-2 + ((i * 7 + seed * 13) as f32).cos() * 3.0
            })
            .collect()
    }

    /// Every tier's tile gives each output of a 4x2 block within f32 rounding of the f64 dot.
    #[test]
    fn every_tier_tile_matches_f64_dots_with_tails() {
        for isa in Isa::ALL.into_iter().filter(|i| i.is_supported()) {
            let tile = table_for(isa).expect("supported tier").conv.tile_f32_4x2;
            for k in [1usize, 7, 8, 9, 31, 576, 1001] {
                let rows: Vec<Vec<f32>> = (0..6).map(|r| row(k, r)).collect();
                let a = [&rows[0][..], &rows[1][..], &rows[2][..], &rows[3][..]];
                let b = [&rows[4][..], &rows[5][..]];
                let mut out = [0f32; 8];
                tile(k, a, b, &mut out);
                for r in 0..4 {
                    for c in 0..2 {
                        let want: f64 = (0..k).map(|i| a[r][i] as f64 * b[c][i] as f64).sum();
                        let mag: f64 =
                            (0..k).map(|i| (a[r][i] as f64 * b[c][i] as f64).abs()).sum();
                        assert!(
                            (out[r * 2 + c] as f64 - want).abs() <= 1e-5 * (1.0 + mag),
                            "{isa:?} k={k} r={r} c={c}: {} vs {want}",
                            out[r * 2 + c]
                        );
                    }
                }
            }
        }
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
