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
pub(crate) mod ternary;
pub(crate) mod unpack;
pub(crate) mod util;

use crate::dtype::DType;
use crate::error::{Error, Result};

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

fn rows_of(dtype: DType, n_elems: usize, n_bytes: usize, what: &str) -> Result<()> {
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

/// Dot product of `n` elements: `x` in `dtype`, `y` in `dtype.vec_dot_type()` (as made by
/// [`quantize_for_dot`]). Uses the fastest kernel this CPU supports (see `crate::kernels`).
// Inline: in a caller's loop the table and per-type lookups become loop-invariant and leave the
// loop, and the `Result` stays in registers instead of going through memory.
#[inline]
pub fn vec_dot(dtype: DType, n: usize, x: &[u8], y: &[u8]) -> Result<f32> {
    // Fast path: plain arithmetic checks, no `Result` plumbing, for callers in loops; the error
    // path is out of line, so this one is a few loads and compares around the kernel call.
    if let Some(k) = crate::kernels::table().vec_dot(dtype)
        && fits(dtype, n, x.len())
        && fits(dtype.vec_dot_type(), n, y.len())
    {
        return Ok(k(n, x, y));
    }
    vec_dot_error(dtype, n, x, y)
}

/// Why [`vec_dot`] cannot run: no kernel, or lengths that do not fit `n`.
#[cold]
#[inline(never)]
fn vec_dot_error(dtype: DType, n: usize, x: &[u8], y: &[u8]) -> Result<f32> {
    let vd = dtype.vec_dot_type();
    let k = crate::kernels::table().vec_dot(dtype);
    if k.is_none() {
        return Err(Error::Quant { dtype, msg: "no dot product for this type".into() });
    }
    rows_of(dtype, n, x.len(), "vec_dot x")?;
    rows_of(vd, n, y.len(), "vec_dot y")?;
    Err(Error::arg(format!("vec_dot {dtype}: lengths do not fit n = {n}")))
}

/// True when `len` bytes hold exactly `n` elements of `d`.
#[inline(always)]
fn fits(d: DType, n: usize, len: usize) -> bool {
    let bs = d.block_size();
    // Every ggml block size is a power of two: a mask and a shift instead of two divisions.
    if bs.is_power_of_two() {
        n & (bs - 1) == 0 && (n >> bs.trailing_zeros()).checked_mul(d.type_size()) == Some(len)
    } else {
        n.is_multiple_of(bs) && (n / bs).checked_mul(d.type_size()) == Some(len)
    }
}
