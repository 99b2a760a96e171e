//! Q8_K: the activation format the K-quant, IQ and TQ weights are dotted with. `x = d * q` with
//! 8-bit `q` over a super-block of 256, plus the sum of every 16 levels (ggml's `block_q8_K`).
//!
//! ggml's CPU `from_float` for Q8_K on x86 (`quantize_row_q8_K` in arch/x86/quants.c) is
//! `quantize_row_q8_K_ref` itself, as is the generic one; this is that function.

use super::helpers::imin;
use crate::dtype::QK_K;
use crate::quant::util::nearest_int;

/// ggml's `block_q8_K`. Its `f32` field gives it 4-byte alignment; see the module notes on reading
/// blocks from byte slices of any alignment.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct BlockQ8K {
    /// Scale (a plain f32, not f16).
    pub d: f32,
    /// Levels, `-127..=127` as made by the quantizer.
    pub qs: [i8; QK_K],
    /// Sum of each group of 16 levels.
    pub bsums: [i16; QK_K / 16],
}
const _: () = assert!(size_of::<BlockQ8K>() == 292);

/// ggml's `quantize_row_q8_K_ref` for one super-block. For an all-zero block ggml sets `d` and
/// `qs` to zero and leaves `bsums` as they were; here they are zero too (they are the sums of the
/// zero levels, and a fresh block has no previous contents).
pub(crate) fn quantize_row_q8_K_ref(x: &[f32]) -> BlockQ8K {
    let mut y: BlockQ8K = bytemuck::Zeroable::zeroed();
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in &x[..QK_K] {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax == 0.0 {
        return y;
    }
    // ggml uses -127 rather than -128 so that the IQ2_XXS AVX code stays simple.
    let iscale = -127.0f32 / max;
    for (q, &v) in y.qs.iter_mut().zip(x) {
        *q = imin(127, nearest_int(iscale * v)) as i8;
    }
    for (s, q) in y.bsums.iter_mut().zip(y.qs.chunks_exact(16)) {
        *s = q.iter().map(|&v| v as i32).sum::<i32>() as i16;
    }
    y.d = 1.0 / iscale;
    y
}

/// ggml's `dequantize_row_q8_K` for one block.
pub(crate) fn dequantize_row_q8_K(b: &BlockQ8K, y: &mut [f32]) {
    for (o, &q) in y.iter_mut().zip(&b.qs) {
        *o = b.d * q as f32;
    }
}
