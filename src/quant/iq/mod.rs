//! ggml's "i-quants": IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS.
//!
//! Each format has its block struct (ggml-common.h layout), the reference quantizer that gives the
//! bytes of `ggml_quantize_chunk` (src/ggml-quants.c), `dequantize_row_*` and the scalar dot product
//! against its vec-dot type (`ggml_vec_dot_*_generic` in src/ggml-cpu/quants.c). Float expressions
//! are evaluated in ggml's order, without fused multiply-adds, so results match bit for bit.
//!
//! Where ggml aborts the process on data it cannot quantize (`GGML_ASSERT(scale >= 0)`, "point not
//! on grid", no grid neighbour found: reachable with NaN, infinite or overflowing inputs or a
//! degenerate importance matrix) the quantizers return [`Error::Quant`] instead, and so they do
//! where ggml would index its grid map out of bounds (undefined behaviour in C).

// ggml's names (`vec_dot_iq2_xxs_q8_K`, `BlockQ8_0`) are kept so the code reads next to ggml's.
#![allow(non_snake_case)]
// Index loops mirror ggml's loops over parallel arrays; iterator chains would obscure the port.
#![allow(clippy::needless_range_loop)]

pub(crate) mod grids;
pub(crate) mod iq1;
pub(crate) mod iq2;
pub(crate) mod iq3;
pub(crate) mod iq4;
mod search;
pub(crate) mod unpack;

use super::FormatFns;
use crate::dtype::DType;
use crate::error::{Error, Result};
use bytemuck::Pod;

// The activation blocks of the IQ dot products: `block_q8_K` (all but IQ4_NL) and `block_q8_0`.
pub(crate) use crate::quant::kquants::BlockQ8K;
pub(crate) use crate::quant::legacy::BlockQ8_0;

/// The format table entries of the IQ types; `None` for every other type.
pub(crate) fn format(dtype: DType) -> Option<FormatFns> {
    let f = match dtype {
        DType::IQ2_XXS => FormatFns {
            quantize: Some(iq2::quantize_iq2_xxs),
            requires_imatrix: true,
            dequantize: Some(iq2::dequantize_row_iq2_xxs),
            from_float: None,
            vec_dot: Some(iq2::vec_dot_iq2_xxs_q8_K),
        },
        DType::IQ2_XS => FormatFns {
            quantize: Some(iq2::quantize_iq2_xs),
            requires_imatrix: true,
            dequantize: Some(iq2::dequantize_row_iq2_xs),
            from_float: None,
            vec_dot: Some(iq2::vec_dot_iq2_xs_q8_K),
        },
        DType::IQ2_S => FormatFns {
            quantize: Some(iq2::quantize_iq2_s),
            requires_imatrix: false,
            dequantize: Some(iq2::dequantize_row_iq2_s),
            from_float: None,
            vec_dot: Some(iq2::vec_dot_iq2_s_q8_K),
        },
        DType::IQ3_XXS => FormatFns {
            quantize: Some(iq3::quantize_iq3_xxs),
            requires_imatrix: false,
            dequantize: Some(iq3::dequantize_row_iq3_xxs),
            from_float: None,
            vec_dot: Some(iq3::vec_dot_iq3_xxs_q8_K),
        },
        DType::IQ3_S => FormatFns {
            quantize: Some(iq3::quantize_iq3_s),
            requires_imatrix: false,
            dequantize: Some(iq3::dequantize_row_iq3_s),
            from_float: None,
            vec_dot: Some(iq3::vec_dot_iq3_s_q8_K),
        },
        DType::IQ1_S => FormatFns {
            quantize: Some(iq1::quantize_iq1_s),
            requires_imatrix: true,
            dequantize: Some(iq1::dequantize_row_iq1_s),
            from_float: None,
            vec_dot: Some(iq1::vec_dot_iq1_s_q8_K),
        },
        // ggml_quantize_requires_imatrix has IQ1_M commented out at this commit.
        DType::IQ1_M => FormatFns {
            quantize: Some(iq1::quantize_iq1_m),
            requires_imatrix: false,
            dequantize: Some(iq1::dequantize_row_iq1_m),
            from_float: None,
            vec_dot: Some(iq1::vec_dot_iq1_m_q8_K),
        },
        DType::IQ4_NL => FormatFns {
            quantize: Some(iq4::quantize_iq4_nl),
            requires_imatrix: false,
            dequantize: Some(iq4::dequantize_row_iq4_nl),
            from_float: Some(iq4::quantize_row_iq4_nl),
            vec_dot: Some(iq4::vec_dot_iq4_nl_q8_0),
        },
        DType::IQ4_XS => FormatFns {
            quantize: Some(iq4::quantize_iq4_xs),
            requires_imatrix: false,
            dequantize: Some(iq4::dequantize_row_iq4_xs),
            from_float: Some(iq4::quantize_row_iq4_xs),
            vec_dot: Some(iq4::vec_dot_iq4_xs_q8_K),
        },
        _ => return None,
    };
    Some(f)
}

/// Blocks of `B` read from bytes of any alignment (`bytes.len()` is a multiple of the block size;
/// a trailing partial block is ignored).
#[inline]
fn blocks<B: Pod>(bytes: &[u8]) -> impl Iterator<Item = B> + '_ {
    bytes.chunks_exact(size_of::<B>()).map(bytemuck::pod_read_unaligned::<B>)
}

/// `±1` for bit `j` of a sign byte.
#[inline(always)]
fn sign_f(signs: u8, j: usize) -> f32 {
    if signs & grids::KMASK_IQ2XS[j] != 0 { -1.0 } else { 1.0 }
}

/// `±1` for bit `j` of a sign byte, as an integer.
#[inline(always)]
fn sign_i(signs: u8, j: usize) -> i32 {
    if signs & grids::KMASK_IQ2XS[j] != 0 { -1 } else { 1 }
}

/// The error of the types ggml only quantizes with an importance matrix.
fn missing_imatrix(dtype: DType) -> Error {
    Error::Quant { dtype, msg: "ggml can only quantize this type with an importance matrix".into() }
}

/// The error for input on which ggml aborts the process.
#[cold]
fn aborts(dtype: DType, what: &str) -> Error {
    Error::Quant { dtype, msg: format!("ggml aborts on this data ({what})") }
}

/// ggml's `GGML_ASSERT(scale >= 0)` after a block's search (a NaN scale fails it too).
#[inline]
fn check_scale(dtype: DType, scale: f32) -> Result<()> {
    if scale.is_nan() || scale < 0.0 { Err(aborts(dtype, "negative or NaN scale")) } else { Ok(()) }
}

/// Runs `quantize_block` on every `QK_K` super-block of every row, writing block structs `B`.
/// `imatrix` (when given) has `n_per_row` entries; block `ibl` of each row sees its `QK_K` slice.
fn quantize_rows<B: Pod>(
    src: &[f32],
    dst: &mut [u8],
    n_per_row: usize,
    imatrix: Option<&[f32]>,
    block_elems: usize,
    mut quantize_block: impl FnMut(&[f32], Option<&[f32]>) -> Result<B>,
) -> Result<()> {
    let bsz = size_of::<B>();
    if n_per_row == 0 || !n_per_row.is_multiple_of(block_elems) {
        return Err(Error::arg(format!(
            "rows of {n_per_row} values are not whole blocks of {block_elems}"
        )));
    }
    if imatrix.is_some_and(|w| w.len() < n_per_row) {
        return Err(Error::arg(format!(
            "the importance matrix has fewer than {n_per_row} entries"
        )));
    }
    for (row, qrow) in
        src.chunks_exact(n_per_row).zip(dst.chunks_exact_mut(n_per_row / block_elems * bsz))
    {
        for (ibl, (xb, out)) in
            row.chunks_exact(block_elems).zip(qrow.chunks_exact_mut(bsz)).enumerate()
        {
            let qw = imatrix.map(|w| &w[ibl * block_elems..(ibl + 1) * block_elems]);
            let blk = quantize_block(xb, qw)?;
            out.copy_from_slice(bytemuck::bytes_of(&blk));
        }
    }
    Ok(())
}

/// `quantize_rows` for the types ggml quantizes only with an importance matrix (IQ2_XXS, IQ2_XS,
/// IQ1_S): refuses to run without one, and hands each super-block its `QK_K` weights.
fn quantize_rows_imatrix<B: Pod>(
    dtype: DType,
    src: &[f32],
    dst: &mut [u8],
    n_per_row: usize,
    imatrix: Option<&[f32]>,
    quantize_block: impl Fn(&[f32], &[f32]) -> Result<B>,
) -> Result<()> {
    let imatrix = imatrix.ok_or_else(|| missing_imatrix(dtype))?;
    quantize_rows::<B>(src, dst, n_per_row, Some(imatrix), crate::dtype::QK_K, |x, qw| {
        quantize_block(x, qw.unwrap_or(&[]))
    })
}

/// The 4-bit scales of IQ2_XS, IQ2_S and IQ3_S: `nearest_int(0.5 * (id * scale - 1))` clamped to
/// 0..=15, two a byte (the first in the low nibble).
fn scale_nibbles(scales: &[f32], id: f32, out: &mut [u8]) {
    let l = |s: f32| crate::quant::util::nearest_int(0.5 * (id * s - 1.0)).clamp(0, 15) as u8;
    for (o, s) in out.iter_mut().zip(scales.chunks_exact(2)) {
        *o = l(s[0]) | l(s[1]) << 4;
    }
}

/// ggml's `MAX(a, b)` macro: `a > b ? a : b` (so a NaN `b` wins and a NaN `a` loses).
#[inline(always)]
fn fmax(a: f32, b: f32) -> f32 {
    if a > b { a } else { b }
}

/// ggml's `best_index_int8`: the index of the nearest of the sorted `val` (ties to the upper one,
/// NaN to the last).
#[inline]
fn best_index_int8(val: &[i8; 16], x: f32) -> usize {
    if x <= val[0] as f32 {
        return 0;
    }
    if x >= val[15] as f32 {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < val[mav] as f32 {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - (val[mu - 1] as f32) < val[mu] as f32 - x { mu - 1 } else { mu }
}

/// Splits `xb` (groups of 8) into magnitudes `xval` and sign bits, and, as ggml's IQ2_XXS/IQ2_XS/
/// IQ3_XXS quantizers do, flips the least important element of a group with an odd number of
/// negatives so every group has an even number of sign bits (7 stored bits, the 8th implied).
fn even_signs(xb: &[f32], weight: &[f32], xval: &mut [f32], signs: &mut [u8]) {
    for (k, s_out) in signs.iter_mut().enumerate() {
        let (x8, w8, v8) =
            (&xb[8 * k..8 * k + 8], &weight[8 * k..8 * k + 8], &mut xval[8 * k..8 * k + 8]);
        let mut nflip = 0;
        let mut s = 0u8;
        for i in 0..8 {
            if x8[i] >= 0.0 {
                v8[i] = x8[i];
            } else {
                v8[i] = -x8[i];
                nflip += 1;
                s |= 1 << i;
            }
        }
        if nflip % 2 == 1 {
            let mut imin = 0;
            let mut min = w8[0] * x8[0] * x8[0];
            for i in 1..8 {
                let ax = w8[i] * x8[i] * x8[i];
                if ax < min {
                    min = ax;
                    imin = i;
                }
            }
            v8[imin] = -v8[imin];
            s ^= 1 << imin;
        }
        *s_out = s & 127;
    }
}

/// Magnitudes and plain sign bits of groups of 8 (IQ2_S, IQ3_S store all 8 signs).
fn all_signs(xb: &[f32], xval: &mut [f32], signs: &mut [u8]) {
    for (k, s_out) in signs.iter_mut().enumerate() {
        let mut s = 0u8;
        for i in 0..8 {
            let x = xb[8 * k + i];
            if x >= 0.0 {
                xval[8 * k + i] = x;
            } else {
                xval[8 * k + i] = -x;
                s |= 1 << i;
            }
        }
        *s_out = s;
    }
}

/// `sum(x^2)` over a super-block in ggml's order.
#[inline]
fn sum_sq(x: &[f32]) -> f32 {
    let mut s = 0.0f32;
    for &v in x {
        s += v * v;
    }
    s
}

/// ggml's importance weights `qw[i] * sqrt(sigma2 + x[i]^2)`.
#[inline]
fn imatrix_weights(qw: &[f32], xb: &[f32], sigma2: f32, weight: &mut [f32]) {
    for ((w, &q), &x) in weight.iter_mut().zip(qw).zip(xb) {
        *w = q * (sigma2 + x * x).sqrt();
    }
}

/// `(sum w*x*q, sum w*q*q)` with `q = 2*l + 1`, the weighted fit of the IQ2/IQ3 quantizers.
#[inline]
fn fit_odd(weight: &[f32], xval: &[f32], l: &[i8]) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
    for i in 0..l.len() {
        let w = weight[i];
        let q = (2 * l[i] as i32 + 1) as f32;
        sumqx += w * xval[i] * q;
        sumq2 += w * q * q;
    }
    (sumqx, sumq2)
}

/// Packs per-element levels (`bits` bits each) into a grid-map key as ggml does with a `uint16_t`.
#[inline]
fn pack_levels(l: &[i8], bits: u32) -> usize {
    let mut u = 0u16;
    for (i, &v) in l.iter().enumerate() {
        u |= ((v as i32) << (bits * i as u32)) as u16;
    }
    u as usize
}

/// ggml's `make_qp_quants` (non-negative `x`, levels `0..=nmax` written to `l`), returns the scale.
fn make_qp_quants(nmax: i32, x: &[f32], l: &mut [i8], quant_weights: &[f32]) -> f32 {
    let n = x.len();
    let mut max = 0.0f32;
    for &v in x {
        max = fmax(max, v);
    }
    if max < 1e-15 {
        l[..n].fill(0);
        return 0.0;
    }
    // ggml's L is uint8_t here; keep its truncation by storing the low byte.
    let mut iscale = nmax as f32 / max;
    for i in 0..n {
        l[i] = crate::quant::util::nearest_int(iscale * x[i]) as i8;
    }
    let lu = |v: i8| v as u8 as f32;
    let scale = 1.0 / iscale;
    let mut best_mse = 0.0f32;
    for i in 0..n {
        let diff = x[i] - scale * lu(l[i]);
        let w = quant_weights[i];
        best_mse += w * diff * diff;
    }
    for is in -4..=4 {
        if is == 0 {
            continue;
        }
        let iscale_is = (0.1f32 * is as f32 + nmax as f32) / max;
        let scale_is = 1.0 / iscale_is;
        let mut mse = 0.0f32;
        for i in 0..n {
            let li = crate::quant::util::nearest_int(iscale_is * x[i]).min(nmax);
            let diff = x[i] - scale_is * li as f32;
            let w = quant_weights[i];
            mse += w * diff * diff;
        }
        if mse < best_mse {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..n {
        let li = crate::quant::util::nearest_int(iscale * x[i]).min(nmax);
        l[i] = li as i8;
        let w = quant_weights[i];
        sumlx += w * x[i] * li as f32;
        suml2 += w * li as f32 * li as f32;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for i in 0..n {
            let w = quant_weights[i];
            let li = lu(l[i]);
            let mut slx = sumlx - w * x[i] * li;
            let mut sl2 = suml2 - w * li * li;
            if slx > 0.0 && sl2 > 0.0 {
                let new_l = crate::quant::util::nearest_int(x[i] * sl2 / slx).min(nmax);
                if new_l != l[i] as u8 as i32 {
                    slx += w * x[i] * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l[i] = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    if suml2 > 0.0 { sumlx / suml2 } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::grids::KVALUES_IQ4NL;
    use super::*;

    #[test]
    fn best_index_int8_picks_nearest_and_handles_nan() {
        let v = &KVALUES_IQ4NL;
        assert_eq!(best_index_int8(v, -1000.0), 0);
        assert_eq!(best_index_int8(v, 1000.0), 15);
        assert_eq!(best_index_int8(v, 0.0), 8); // -10 and 1: 1 is nearer
        assert_eq!(best_index_int8(v, 7.0), 9); // halfway between 1 and 13 goes up
        assert_eq!(best_index_int8(v, f32::NAN), 15);
    }

    #[test]
    fn pack_levels_truncates_like_a_u16() {
        assert_eq!(pack_levels(&[1, 2, 0, 1], 3), 1 | 2 << 3 | 1 << 9);
        assert_eq!(pack_levels(&[0, 0, 0, 0, 0, 0, 0, 4], 2), 0); // 4 << 14 leaves 16 bits
        assert_eq!(pack_levels(&[-1, 0], 2), 0xffff);
    }

    #[test]
    fn format_table_quantizers_reject_bad_shapes_without_panicking() {
        for dtype in DType::ALL {
            let Some(f) = format(dtype) else { continue };
            let q = f.quantize.unwrap();
            let mut dst = vec![0u8; 1024];
            assert!(q(&[0.5; 16], &mut dst, 16, None).is_err(), "{dtype}");
            assert!(q(&[0.5; 256], &mut dst, 0, None).is_err(), "{dtype}");
            assert!(q(&[0.5; 256], &mut dst, 256, Some(&[1.0; 8])).is_err(), "{dtype}");
        }
    }
}
