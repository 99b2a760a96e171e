//! The K-quants: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and their activation type Q8_K, byte-for-byte as
//! ggml (block layouts from src/ggml-common.h, quantizers and dequantizers from
//! src/ggml-quants.c, scalar dot products from src/ggml-cpu/quants.c).
//!
//! One file per type holds its block struct, the reference quantizer (`quantize_row_*_ref`), the
//! importance-matrix quantizer (`quantize_row_*_impl`), `dequantize_row_*` and the scalar
//! `vec_dot_*_q8_K`. The scale searches they share live in [`helpers`].
//!
//! # Byte slices and alignment
//! The public API hands us `&[u8]`, which may start at any address, while `BlockQ8K` needs 4-byte
//! and the other blocks 2-byte alignment. Rather than casting the slice (which fails on a misaligned
//! start), every block is read with [`bytemuck::pod_read_unaligned`] into a stack copy and written
//! back with [`bytemuck::bytes_of`]. A block is 84 to 292 bytes, small against the work done on it,
//! and this needs no allocation and no `unsafe` and accepts any alignment.
//!
//! # For other formats
//! The IQ and TQ dot products read their activations with `blocks::<BlockQ8K>(y)` (or make them
//! with [`quantize_row_q8_K_ref`]); the scale searches in [`helpers`] (`make_qx_quants`,
//! `make_qkx3_quants`, `make_qp_quants`, ...) are ggml's and may be called by any format.

#![allow(non_snake_case)] // ggml's names (`quantize_row_q4_K_ref`) so the code reads next to ggml's.

pub(crate) mod helpers;
mod q2_k;
mod q3_k;
mod q4_k;
mod q5_k;
mod q6_k;
mod q8_k;

pub(crate) use q2_k::BlockQ2K;
pub(crate) use q3_k::{BlockQ3K, unpack_scales as q3_k_scales};
pub(crate) use q4_k::BlockQ4K;
pub(crate) use q5_k::BlockQ5K;
pub(crate) use q6_k::BlockQ6K;
pub(crate) use q8_k::{BlockQ8K, quantize_row_q8_K_ref};

use super::FormatFns;
use crate::dtype::QK_K;
use crate::error::{Error, Result};
use bytemuck::Pod;

/// The blocks of `bytes` (a whole number of them), read one by one, whatever the alignment.
#[inline]
pub(crate) fn blocks<T: Pod>(bytes: &[u8]) -> impl Iterator<Item = T> + '_ {
    bytes.chunks_exact(size_of::<T>()).map(bytemuck::pod_read_unaligned)
}

/// Quantizes `src` block by block with `f` into `dst` (a whole number of `T` blocks).
fn quantize_blocks<T: Pod>(src: &[f32], dst: &mut [u8], f: impl Fn(&[f32]) -> T) {
    let sz = size_of::<T>();
    for (x, out) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(sz)) {
        out.copy_from_slice(bytemuck::bytes_of(&f(x)));
    }
}

/// Dequantizes the `T` blocks of `src` with `f` into `dst` (`QK_K` floats per block).
fn dequantize_blocks<T: Pod>(src: &[u8], dst: &mut [f32], f: impl Fn(&T, &mut [f32])) {
    for (b, y) in blocks::<T>(src).zip(dst.chunks_exact_mut(QK_K)) {
        f(&b, y);
    }
}

/// ggml's `quantize_qX_K`: without an importance matrix the whole input is one run of blocks for
/// the reference quantizer; with one, each row of `n_per_row` is quantized with the matching
/// `imatrix` entries (`quant_weights + QK_K*i` for block `i` of the row).
fn quantize_rows<T: Pod>(
    src: &[f32],
    dst: &mut [u8],
    n_per_row: usize,
    imatrix: Option<&[f32]>,
    reference: impl Fn(&[f32]) -> T,
    weighted: impl Fn(&[f32], &[f32]) -> T,
) -> Result<()> {
    if n_per_row == 0 || !n_per_row.is_multiple_of(QK_K) || !src.len().is_multiple_of(n_per_row) {
        return Err(Error::arg(format!(
            "K-quant rows must be whole super-blocks of {QK_K}: {} values, rows of {n_per_row}",
            src.len()
        )));
    }
    let sz = size_of::<T>();
    if dst.len() != src.len() / QK_K * sz {
        return Err(Error::arg(format!(
            "K-quant output: {} values need {} bytes, the buffer has {}",
            src.len(),
            src.len() / QK_K * sz,
            dst.len()
        )));
    }
    match imatrix {
        None => quantize_blocks(src, dst, reference),
        Some(qw) => {
            if qw.len() < n_per_row {
                return Err(Error::arg(format!(
                    "imatrix has {} entries, rows have {n_per_row}",
                    qw.len()
                )));
            }
            let row_bytes = n_per_row / QK_K * sz;
            for (xrow, yrow) in src.chunks_exact(n_per_row).zip(dst.chunks_exact_mut(row_bytes)) {
                let blocks_in = xrow.chunks_exact(QK_K).zip(qw.chunks_exact(QK_K));
                for ((x, w), out) in blocks_in.zip(yrow.chunks_exact_mut(sz)) {
                    out.copy_from_slice(bytemuck::bytes_of(&weighted(x, w)));
                }
            }
        }
    }
    Ok(())
}

/// `n` elements of `x` (blocks `X`) dotted with `y` (Q8_K blocks) by `f`, block by block.
fn vec_dot_blocks<X: Pod>(n: usize, x: &[u8], y: &[u8], mut f: impl FnMut(&X, &BlockQ8K)) {
    let nb = n / QK_K;
    for (bx, by) in blocks::<X>(x).zip(blocks::<BlockQ8K>(y)).take(nb) {
        f(&bx, &by);
    }
}

macro_rules! k_format {
    ($name:ident, $block:ty, $r:path, $w:path, $deq:path, $dot:path, $doc:literal) => {
        #[doc = $doc]
        pub(crate) const $name: FormatFns = FormatFns {
            quantize: Some(|src, dst, n_per_row, imatrix| {
                quantize_rows::<$block>(src, dst, n_per_row, imatrix, $r, $w)
            }),
            requires_imatrix: false,
            dequantize: Some(|src, dst| dequantize_blocks::<$block>(src, dst, $deq)),
            // ggml's CPU `from_float` for these types is the reference quantizer (`quantize`
            // gives its bytes); `quantize_for_dot` only takes vec-dot types.
            from_float: None,
            vec_dot: Some($dot),
        };
    };
}

k_format!(
    Q2_K_FNS,
    BlockQ2K,
    q2_k::quantize_row_q2_K_ref,
    q2_k::quantize_row_q2_K_impl,
    q2_k::dequantize_row_q2_K,
    q2_k::vec_dot_q2_K_q8_K,
    "Q2_K: 16 sub-blocks of 16 with 4-bit scales and mins, 2-bit levels."
);
k_format!(
    Q3_K_FNS,
    BlockQ3K,
    q3_k::quantize_row_q3_K_ref,
    q3_k::quantize_row_q3_K_impl,
    q3_k::dequantize_row_q3_K,
    q3_k::vec_dot_q3_K_q8_K,
    "Q3_K: 16 sub-blocks of 16 with 6-bit scales, 3-bit symmetric levels."
);
k_format!(
    Q4_K_FNS,
    BlockQ4K,
    q4_k::quantize_row_q4_K_ref,
    q4_k::quantize_row_q4_K_impl,
    q4_k::dequantize_row_q4_K,
    q4_k::vec_dot_q4_K_q8_K,
    "Q4_K: 8 sub-blocks of 32 with 6-bit scales and mins, 4-bit levels."
);
k_format!(
    Q5_K_FNS,
    BlockQ5K,
    q5_k::quantize_row_q5_K_ref,
    q5_k::quantize_row_q5_K_impl,
    q5_k::dequantize_row_q5_K,
    q5_k::vec_dot_q5_K_q8_K,
    "Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins, 5-bit levels."
);
k_format!(
    Q6_K_FNS,
    BlockQ6K,
    q6_k::quantize_row_q6_K_ref,
    q6_k::quantize_row_q6_K_impl,
    q6_k::dequantize_row_q6_K,
    q6_k::vec_dot_q6_K_q8_K,
    "Q6_K: 16 sub-blocks of 16 with 8-bit scales, 6-bit symmetric levels."
);

/// Q8_K: the activation type of the K-quants (and IQ/TQ types). ggml has no `ggml_quantize_chunk`
/// or `to_float` for it, only the CPU's `from_float` (`quantize_row_q8_K`, which on x86 is the
/// reference) and `dequantize_row_q8_K`, both provided here.
pub(crate) const Q8_K_FNS: FormatFns = FormatFns {
    quantize: None,
    requires_imatrix: false,
    dequantize: Some(|src, dst| dequantize_blocks::<BlockQ8K>(src, dst, q8_k::dequantize_row_q8_K)),
    from_float: Some(|src, dst| quantize_blocks(src, dst, quantize_row_q8_K_ref)),
    vec_dot: None,
};

#[cfg(test)]
mod tests;
