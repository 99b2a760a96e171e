//! Numeric helpers shared by every format, each reproducing ggml's exact arithmetic
//! (src/ggml-impl.h, src/ggml-quants.c).

/// ggml's `nearest_int`: round half to even through the 1.5 * 2^23 magic-number trick. Defined for
/// every input (ggml asserts |x| <= 4194303; larger or non-finite inputs give the same bits ggml's
/// release build computes, without undefined behaviour here).
#[allow(dead_code)] // used by the format modules
#[inline(always)]
pub(crate) fn nearest_int(fval: f32) -> i32 {
    let val = fval + 12582912.0;
    (val.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// ggml's `GGML_FP16_TO_FP32` (exact; every f16 is representable as f32), in plain integer and
/// float steps that inline anywhere: exponent and mantissa moved into f32's fields and rescaled
/// by 2^112 (subnormal halves come out of the f32 subnormal range exactly), infinities and NaNs
/// (quieted, as F16C and the `half` crate give them) set apart.
/// A `const fn`, so tables of it are built at compile time (`avx2_quants::F16_TO_F32`).
#[inline(always)]
pub(crate) const fn fp16_to_fp32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let em = (h & 0x7fff) as u32;
    let bits = if em >= 0x7c00 {
        let man = em & 0x3ff;
        0x7f80_0000 | if man != 0 { 0x0040_0000 | (man << 13) } else { 0 }
    } else {
        (f32::from_bits(em << 13) * f32::from_bits(0x7780_0000)).to_bits()
    };
    f32::from_bits(sign | bits)
}

/// ggml's portable `ggml_compute_fp32_to_fp16`: round to nearest even, overflow to infinity,
/// NaN to `sign | 0x7E00`.
#[inline(always)]
pub(crate) fn fp32_to_fp16(f: f32) -> u16 {
    let scale_to_inf = f32::from_bits(0x7780_0000); // 0x1.0p+112
    let scale_to_zero = f32::from_bits(0x0880_0000); // 0x1.0p-110
    let mut base = (f.abs() * scale_to_inf) * scale_to_zero;
    let w = f.to_bits();
    let shl1_w = w.wrapping_add(w);
    let sign = w & 0x8000_0000;
    let mut bias = shl1_w & 0xFF00_0000;
    if bias < 0x7100_0000 {
        bias = 0x7100_0000;
    }
    base += f32::from_bits((bias >> 1) + 0x0780_0000);
    let bits = base.to_bits();
    let exp_bits = (bits >> 13) & 0x0000_7C00;
    let mantissa_bits = bits & 0x0000_0FFF;
    let nonsign = exp_bits + mantissa_bits;
    ((sign >> 16) | if shl1_w > 0xFF00_0000 { 0x7E00 } else { nonsign }) as u16
}

/// ggml's `GGML_BF16_TO_FP32`.
#[inline(always)]
pub(crate) fn bf16_to_fp32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// ggml's `ggml_compute_fp32_to_bf16`: round to nearest even; NaN forced quiet.
#[inline(always)]
pub(crate) fn fp32_to_bf16(s: f32) -> u16 {
    let i = s.to_bits();
    if (i & 0x7fff_ffff) > 0x7f80_0000 {
        return ((i >> 16) | 64) as u16;
    }
    (i.wrapping_add(0x7fff + ((i >> 16) & 1)) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(-2.5), -2);
        assert_eq!(nearest_int(-7.49), -7);
        let _ = nearest_int(f32::NAN); // defined, no panic
    }

    #[test]
    fn fp16_conversion_matches_ieee_rne() {
        for &x in &[0.0f32, -0.0, 1.0, 65504.0, 65520.0, 1e-8, 6.1e-5, -2.5078, 1e9] {
            assert_eq!(fp32_to_fp16(x), half::f16::from_f32(x).to_bits(), "{x}");
        }
        assert_eq!(fp32_to_fp16(f32::NAN) & 0x7E00, 0x7E00);
    }

    #[test]
    fn every_f16_converts_to_the_f32_of_the_half_crate() {
        // All 65536 halves: normal, subnormal, zeros, infinities and NaNs (quieted).
        for h in 0..=u16::MAX {
            let want = half::f16::from_bits(h).to_f32().to_bits();
            assert_eq!(fp16_to_fp32(h).to_bits(), want, "{h:#06x}");
        }
    }

    #[test]
    fn bf16_conversion_rounds_to_nearest_even() {
        assert_eq!(fp32_to_bf16(1.0), 0x3f80);
        assert_eq!(fp32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80); // tie to even
        assert_eq!(fp32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(bf16_to_fp32(0x3f80), 1.0);
    }
}
