//! Block formats of every ggml type: reference quantize, dequantize, the CPU's activation conversion
//! (`from_float`) and a scalar `vec_dot`, byte-for-byte as ggml (src/ggml-quants.c, src/ggml-cpu/).
//!
//! Each format module fills one `FormatFns` entry; `format` is the table the rest of the crate
//! (kernels, ops, GGUF) talks to, like ggml's `type_traits` / `type_traits_cpu`. SIMD versions of
//! `vec_dot` live in `crate::kernels` and are chosen at run time.

pub(crate) mod fp;
pub(crate) mod fp4;
pub(crate) mod iq;
pub(crate) mod kquants;
pub(crate) mod legacy;
pub(crate) mod lowbit;
pub mod repack;
pub(crate) mod ternary;
pub(crate) mod unpack;
pub(crate) mod util;

use crate::dtype::DType;
use crate::error::{Error, Result};
/// The dot-product kernels live with the other kernels; this is their public path.
pub use crate::kernels::vec_dot;

/// Reference quantizer for whole rows (`ggml_quantize_chunk`): `src` holds `src.len() / n_per_row`
/// rows, `dst` exactly that many rows of the type's row size. `imatrix`, when given, has
/// `n_per_row` entries. Lengths are checked by the caller.
pub(crate) type QuantizeFn =
    fn(src: &[f32], dst: &mut [u8], n_per_row: usize, imatrix: Option<&[f32]>) -> Result<()>;
/// Dequantize whole blocks: `src.len()` is a multiple of the type size and `dst.len()` the matching
/// number of elements. Lengths are checked by the caller.
pub(crate) type DequantizeFn = fn(src: &[u8], dst: &mut [f32]);
/// The CPU's conversion of activations into a vec-dot type (ggml's `from_float`). Same length
/// contract as [`DequantizeFn`], reversed.
pub(crate) type FromFloatFn = fn(src: &[f32], dst: &mut [u8]);
/// Dot product of `n` elements: `x` in the weight type, `y` in its `vec_dot_type`. `n` is a multiple
/// of both block sizes and the slices hold exactly `n` elements. Checked by the caller.
pub(crate) type VecDotFn = fn(n: usize, x: &[u8], y: &[u8]) -> f32;

/// What one type can do, as plain function pointers (scalar versions).
#[derive(Clone, Copy, Default)]
pub(crate) struct FormatFns {
    pub quantize: Option<QuantizeFn>,
    /// ggml refuses to quantize these types without an importance matrix.
    pub requires_imatrix: bool,
    pub dequantize: Option<DequantizeFn>,
    pub from_float: Option<FromFloatFn>,
    pub vec_dot: Option<VecDotFn>,
}

/// The format table entry for `dtype`; every field is `None` for what the type cannot do.
pub(crate) fn format(dtype: DType) -> FormatFns {
    match dtype {
        // Float, legacy, FP4, low-bit and ternary formats.
        DType::F32 => fp::F32_FNS,
        DType::F16 => fp::F16_FNS,
        DType::BF16 => fp::BF16_FNS,
        DType::Q4_0 => legacy::Q4_0_FNS,
        DType::Q4_1 => legacy::Q4_1_FNS,
        DType::Q5_0 => legacy::Q5_0_FNS,
        DType::Q5_1 => legacy::Q5_1_FNS,
        DType::Q8_0 => legacy::Q8_0_FNS,
        DType::Q8_1 => legacy::Q8_1_FNS,
        DType::MXFP4 => fp4::MXFP4_FNS,
        DType::NVFP4 => fp4::NVFP4_FNS,
        DType::Q1_0 => lowbit::Q1_0_FNS,
        DType::Q2_0 => lowbit::Q2_0_FNS,
        DType::TQ1_0 => ternary::TQ1_0_FNS,
        DType::TQ2_0 => ternary::TQ2_0_FNS,
        // K-quants and their activation type (quant/kquants/).
        DType::Q2_K => kquants::Q2_K_FNS,
        DType::Q3_K => kquants::Q3_K_FNS,
        DType::Q4_K => kquants::Q4_K_FNS,
        DType::Q5_K => kquants::Q5_K_FNS,
        DType::Q6_K => kquants::Q6_K_FNS,
        DType::Q8_K => kquants::Q8_K_FNS,
        // i-quants (src/quant/iq/)
        DType::IQ2_XXS
        | DType::IQ2_XS
        | DType::IQ2_S
        | DType::IQ3_XXS
        | DType::IQ3_S
        | DType::IQ1_S
        | DType::IQ1_M
        | DType::IQ4_NL
        | DType::IQ4_XS => iq::format(dtype).unwrap_or_default(),
        _ => FormatFns::default(),
    }
}

pub(crate) fn rows_of(dtype: DType, n_elems: usize, n_bytes: usize, what: &str) -> Result<()> {
    let need = dtype.row_size(n_elems)?;
    if need != n_bytes {
        return Err(Error::arg(format!(
            "{what} {dtype}: {n_elems} elements need {need} bytes, the buffer has {n_bytes}"
        )));
    }
    Ok(())
}

/// Quantizes `src` into `dst` with ggml's reference quantizer (no importance matrix), giving the
/// same bytes as `ggml_quantize_chunk`. `src.len()` must be a multiple of the block size and `dst`
/// exactly `dtype.row_size(src.len())` bytes.
pub fn quantize(dtype: DType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    let f = format(dtype);
    let q = f.quantize.ok_or_else(|| Error::Quant {
        dtype,
        msg: "this type has no quantizer (it is a vec-dot-only or integer type)".into(),
    })?;
    if f.requires_imatrix {
        return Err(Error::Quant {
            dtype,
            msg: "ggml can only quantize this type with an importance matrix; use quantize_with_imatrix"
                .into(),
        });
    }
    rows_of(dtype, src.len(), dst.len(), "quantize")?;
    if src.is_empty() {
        return Ok(());
    }
    q(src, dst, src.len(), None)
}

/// Quantizes rows of `n_per_row` elements with an importance matrix (`imatrix.len() == n_per_row`),
/// the same bytes as `ggml_quantize_chunk` given the same `quant_weights`.
pub fn quantize_with_imatrix(
    dtype: DType,
    src: &[f32],
    n_per_row: usize,
    imatrix: &[f32],
    dst: &mut [u8],
) -> Result<()> {
    let f = format(dtype);
    let q = f.quantize.ok_or_else(|| Error::Quant {
        dtype,
        msg: "this type has no quantizer (it is a vec-dot-only or integer type)".into(),
    })?;
    if n_per_row == 0 || !src.len().is_multiple_of(n_per_row) {
        return Err(Error::arg(format!(
            "quantize_with_imatrix {dtype}: {} values are not whole rows of {n_per_row}",
            src.len()
        )));
    }
    if imatrix.len() != n_per_row {
        return Err(Error::arg(format!(
            "quantize_with_imatrix {dtype}: imatrix has {} entries, rows have {n_per_row}",
            imatrix.len()
        )));
    }
    let rows = src.len() / n_per_row;
    let row = dtype.row_size(n_per_row)?;
    let need = row.checked_mul(rows).ok_or(Error::Overflow { what: "quantized size" })?;
    if dst.len() != need {
        return Err(Error::arg(format!(
            "quantize_with_imatrix {dtype}: {rows} rows need {need} bytes, the buffer has {}",
            dst.len()
        )));
    }
    q(src, dst, n_per_row, Some(imatrix))
}

/// Dequantizes `src` (whole blocks of `dtype`) into `dst`, the same floats as ggml's `to_float`.
pub fn dequantize(dtype: DType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    let d = format(dtype).dequantize.ok_or_else(|| Error::Quant {
        dtype,
        msg: "this type cannot be converted to f32".into(),
    })?;
    rows_of(dtype, dst.len(), src.len(), "dequantize")?;
    d(src, dst);
    Ok(())
}

/// Converts activations into a vec-dot type (`DType::Q8_0`, `Q8_1`, `Q8_K`, `F16`, `BF16`, `F32`)
/// exactly as ggml's CPU backend does before a dot product (`type_traits_cpu[..].from_float`).
pub fn quantize_for_dot(dtype: DType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    let ff = format(dtype).from_float.ok_or_else(|| Error::Quant {
        dtype,
        msg: "not a vec-dot type (use Q8_0, Q8_1, Q8_K, F16, BF16 or F32)".into(),
    })?;
    rows_of(dtype, src.len(), dst.len(), "quantize_for_dot")?;
    ff(src, dst);
    Ok(())
}

/// True when `len` bytes hold exactly `n` elements of `d`.
#[inline(always)]
pub(crate) fn fits(d: DType, n: usize, len: usize) -> bool {
    let bs = d.block_size();
    // Every ggml block size is a power of two: a mask and a shift instead of two divisions.
    if bs.is_power_of_two() {
        n & (bs - 1) == 0 && (n >> bs.trailing_zeros()).checked_mul(d.type_size()) == Some(len)
    } else {
        n.is_multiple_of(bs) && (n / bs).checked_mul(d.type_size()) == Some(len)
    }
}

#[cfg(test)]
mod align_tests {
    use super::*;
    use std::mem::align_of;

    /// `DType::align` is what graph building checks offsets and strides against; it must be the
    /// alignment of the struct the kernels view the bytes as.
    #[test]
    fn dtype_align_matches_block_structs() {
        let blocks: [(DType, usize); 31] = [
            (DType::F32, align_of::<f32>()),
            (DType::F16, align_of::<half::f16>()),
            (DType::BF16, align_of::<half::bf16>()),
            (DType::I8, align_of::<i8>()),
            (DType::I16, align_of::<i16>()),
            (DType::I32, align_of::<i32>()),
            (DType::I64, align_of::<i64>()),
            (DType::F64, align_of::<f64>()),
            (DType::Q4_0, align_of::<legacy::BlockQ4_0>()),
            (DType::Q4_1, align_of::<legacy::BlockQ4_1>()),
            (DType::Q5_0, align_of::<legacy::BlockQ5_0>()),
            (DType::Q5_1, align_of::<legacy::BlockQ5_1>()),
            (DType::Q8_0, align_of::<legacy::BlockQ8_0>()),
            (DType::Q8_1, align_of::<legacy::BlockQ8_1>()),
            (DType::Q2_K, align_of::<kquants::BlockQ2K>()),
            (DType::Q3_K, align_of::<kquants::BlockQ3K>()),
            (DType::Q4_K, align_of::<kquants::BlockQ4K>()),
            (DType::Q5_K, align_of::<kquants::BlockQ5K>()),
            (DType::Q6_K, align_of::<kquants::BlockQ6K>()),
            (DType::Q8_K, align_of::<kquants::BlockQ8K>()),
            (DType::IQ2_XXS, align_of::<iq::iq2::BlockIQ2XXS>()),
            (DType::IQ2_XS, align_of::<iq::iq2::BlockIQ2XS>()),
            (DType::IQ2_S, align_of::<iq::iq2::BlockIQ2S>()),
            (DType::IQ3_XXS, align_of::<iq::iq3::BlockIQ3XXS>()),
            (DType::IQ3_S, align_of::<iq::iq3::BlockIQ3S>()),
            (DType::IQ1_S, align_of::<iq::iq1::BlockIQ1S>()),
            (DType::IQ1_M, align_of::<iq::iq1::BlockIQ1M>()),
            (DType::IQ4_NL, align_of::<iq::iq4::BlockIQ4NL>()),
            (DType::IQ4_XS, align_of::<iq::iq4::BlockIQ4XS>()),
            (DType::MXFP4, align_of::<fp4::BlockMxfp4>()),
            (DType::NVFP4, align_of::<fp4::BlockNvfp4>()),
        ];
        for (d, a) in blocks {
            assert_eq!(d.align(), a, "{d}");
        }
        let rest = [
            (DType::TQ1_0, align_of::<ternary::BlockTq1_0>()),
            (DType::TQ2_0, align_of::<ternary::BlockTq2_0>()),
            (DType::Q1_0, align_of::<lowbit::BlockQ1_0>()),
            (DType::Q2_0, align_of::<lowbit::BlockQ2_0>()),
        ];
        for (d, a) in rest {
            assert_eq!(d.align(), a, "{d}");
        }
        for d in DType::ALL {
            assert!(d.type_size().is_multiple_of(d.align()), "{d}");
        }
    }
}
