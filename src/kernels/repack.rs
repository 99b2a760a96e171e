//! Portable kernels for repacked weights (the scalar twins of `x86/avx2_repack.rs`).
//!
//! Weights are stored 8 rows interleaved (`backend::repack`). A kernel takes one 8-row group's
//! blocks for a range of K (`x`), the same K range of up to [`REPACK_NC`] activation rows (`y`)
//! and one accumulator per activation row holding the 8 rows' partial results, and adds each
//! block's contribution in block order: `acc[c][r] = fma(sumi, dx[r] * dy[c], acc[c][r])` with
//! `sumi` the block's exact integer dot product. Both tiers follow that formula operation for
//! operation, so they agree bit for bit, and results do not depend on how K, rows or columns are
//! split between calls.
//!
//! Activation formats: for the 32-element types (Q4_0, IQ4_NL, MXFP4) each block of Q8_0 levels
//! is stored as [`Y0`]: the scale as f32 (the f16 value of ggml's Q8_0), the sum of the 32
//! levels, then the levels. The K-quants take plain Q8_K rows.

use crate::dtype::DType;
use crate::quant::fp4::{KVALUES_MXFP4, e8m0_to_fp32_half};
use crate::quant::iq::grids::KVALUES_IQ4NL;

/// Activation rows one kernel call takes at most.
pub(crate) const REPACK_NC: usize = 4;

/// Bytes of one activation block in the [`Y0`] format.
pub(crate) const Y0_BYTES: usize = 40;

/// Kernel on repacked weights: `x` whole 8-row group blocks, `y` up to [`REPACK_NC`] activation
/// rows covering the same K range, `acc[c]` the 8 rows' accumulators for activation row `c`.
pub(crate) type RepackGemmFn = fn(x: &[u8], y: &[&[u8]], acc: &mut [[f32; 8]]);

/// A 32-element activation block: Q8_0 levels with their f32 scale and their sum.
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub(crate) struct Y0 {
    pub d: f32,
    pub sum: i32,
    pub qs: [i8; 32],
}
const _: () = assert!(size_of::<Y0>() == Y0_BYTES);

/// Converts one row of Q8_0 blocks (ggml's layout) into [`Y0`] blocks.
pub(crate) fn q8_0_to_y0(q8: &[u8], out: &mut [u8]) {
    for (src, dst) in q8.chunks_exact(34).zip(out.chunks_exact_mut(Y0_BYTES)) {
        let d = half::f16::from_bits(u16::from_le_bytes([src[0], src[1]])).to_f32();
        let mut sum = 0i32;
        for (o, &q) in dst[8..].iter_mut().zip(&src[2..]) {
            *o = q;
            sum += q as i8 as i32;
        }
        dst[..4].copy_from_slice(&d.to_le_bytes());
        dst[4..8].copy_from_slice(&sum.to_le_bytes());
    }
}

/// Bytes of one block of an 8-row group.
pub(crate) fn group_block_bytes(d: DType) -> usize {
    d.type_size() * 8
}

/// Bytes of one activation block (per weight block) for repacked weights of type `d`.
pub(crate) fn act_block_bytes(d: DType) -> usize {
    match d {
        DType::Q4_K | DType::Q6_K | DType::Q2_K => DType::Q8_K.type_size(),
        _ => Y0_BYTES,
    }
}

pub(crate) const KIND_Q4_0: u8 = 0;
pub(crate) const KIND_IQ4_NL: u8 = 1;
pub(crate) const KIND_MXFP4: u8 = 2;

#[inline(always)]
fn value<const KIND: u8>(nib: u8) -> i32 {
    match KIND {
        KIND_Q4_0 => nib as i32 - 8,
        KIND_IQ4_NL => KVALUES_IQ4NL[nib as usize] as i32,
        _ => KVALUES_MXFP4[nib as usize] as i32,
    }
}

/// Scales of the 8 rows of a block and the offset of its quants.
#[inline(always)]
pub(crate) fn q0_scales<const KIND: u8>(xb: &[u8]) -> ([f32; 8], usize) {
    if KIND == KIND_MXFP4 {
        (std::array::from_fn(|r| e8m0_to_fp32_half(xb[r])), 8)
    } else {
        let d = |r: usize| half::f16::from_bits(u16::from_le_bytes([xb[2 * r], xb[2 * r + 1]]));
        (std::array::from_fn(|r| d(r).to_f32()), 16)
    }
}

fn x8_q0<const KIND: u8>(x: &[u8], y: &[&[u8]], acc: &mut [[f32; 8]]) {
    let gb = if KIND == KIND_MXFP4 { 136 } else { 144 };
    let nb = x.len() / gb;
    for b in 0..nb {
        let xb = &x[b * gb..(b + 1) * gb];
        let (dx, qo) = q0_scales::<KIND>(xb);
        let qs = &xb[qo..];
        for (yc, a) in y.iter().zip(acc.iter_mut()) {
            let yb: &Y0 = bytemuck::from_bytes(&yc[b * Y0_BYTES..(b + 1) * Y0_BYTES]);
            for (r, ar) in a.iter_mut().enumerate() {
                let mut sumi = 0i32;
                for p in 0..4 {
                    for t in 0..4 {
                        let byte = qs[32 * p + 4 * r + t];
                        sumi += value::<KIND>(byte & 15) * yb.qs[4 * p + t] as i32
                            + value::<KIND>(byte >> 4) * yb.qs[16 + 4 * p + t] as i32;
                    }
                }
                *ar = (sumi as f32).mul_add(dx[r] * yb.d, *ar);
            }
        }
    }
}

/// Q4_0 x 8 rows against [`Y0`] activations.
pub(crate) fn gemm_q4_0_x8(x: &[u8], y: &[&[u8]], acc: &mut [[f32; 8]]) {
    x8_q0::<KIND_Q4_0>(x, y, acc);
}

/// IQ4_NL x 8 rows against [`Y0`] activations.
pub(crate) fn gemm_iq4_nl_x8(x: &[u8], y: &[&[u8]], acc: &mut [[f32; 8]]) {
    x8_q0::<KIND_IQ4_NL>(x, y, acc);
}

/// MXFP4 x 8 rows against [`Y0`] activations.
pub(crate) fn gemm_mxfp4_x8(x: &[u8], y: &[&[u8]], acc: &mut [[f32; 8]]) {
    x8_q0::<KIND_MXFP4>(x, y, acc);
}

/// The scalar kernel for repacked weights of type `d`.
pub(crate) fn scalar_kernel(d: DType) -> Option<RepackGemmFn> {
    Some(match d {
        DType::Q4_0 => gemm_q4_0_x8,
        DType::IQ4_NL => gemm_iq4_nl_x8,
        DType::MXFP4 => gemm_mxfp4_x8,
        _ => return None,
    })
}
