//! Portable kernels for repacked weights (the scalar twins of `x86/avx2_repack.rs`).
//!
//! Weights are stored 8 rows interleaved (`quant::repack`). A kernel takes one 8-row group's
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

/// Activation rows the AVX2 kernels of the 32-element types keep in registers at once.
pub(crate) const REPACK_NC: usize = 4;

/// Bytes of one activation block in the [`Y0`] format.
pub(crate) const Y0_BYTES: usize = 40;

/// Kernel on repacked weights: `x` whole 8-row group blocks, `y` activation rows covering the same
/// K range, `acc[c]` the 8 rows' accumulators for activation row `c` (`acc.len() == y.len()`).
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
        DType::Q4_K | DType::Q6_K | DType::Q2_K | DType::TQ2_0 => DType::Q8_K.type_size(),
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

pub(crate) const KIND_Q4_K: u8 = 3;
pub(crate) const KIND_Q6_K: u8 = 4;
pub(crate) const KIND_Q2_K: u8 = 5;
pub(crate) const KIND_TQ2_0: u8 = 6;

/// Offset of the 2-bit levels in a Q2_K / TQ2_0 group block.
pub(crate) const fn q2_qs(kind: u8) -> usize {
    if kind == KIND_Q2_K { 160 } else { 16 }
}

/// What the stored levels exceed the true ones by (Q6_K: +32, TQ2_0: +1); the types with 0
/// subtract mins instead.
pub(crate) const fn k_offset(kind: u8) -> i32 {
    match kind {
        KIND_Q6_K => 32,
        KIND_TQ2_0 => 1,
        _ => 0,
    }
}

/// Bytes of one 8-row super-block group of each K type.
pub(crate) const fn k_group_bytes(kind: u8) -> usize {
    match kind {
        KIND_Q4_K => 8 * 144,
        KIND_Q6_K => 8 * 210,
        KIND_TQ2_0 => 8 * 66,
        _ => 8 * 84,
    }
}

/// Sub-blocks per super-block.
pub(crate) const fn k_subblocks(kind: u8) -> usize {
    match kind {
        KIND_Q4_K => 8,
        // No scales: two halves of 128, so the 16-bit sums run 32 steps between widenings.
        KIND_TQ2_0 => 2,
        _ => 16,
    }
}

/// Q8_K activation block: `d` at 0, levels at 4, the 16 sums of 16 levels at 260.
pub(crate) const Q8K_QS: usize = 4;
pub(crate) const Q8K_BSUMS: usize = 260;
pub(crate) const Q8K_BYTES: usize = 292;

/// The scales of one 8-row K-quant super-block group, rows last (`[sub-block][row]`).
pub(crate) struct KScales {
    /// Super-block scale of each row.
    pub d: [f32; 8],
    /// Super-block scale of the mins (Q4_K, Q2_K).
    pub dmin: [f32; 8],
    /// Integer scale of each sub-block.
    pub sc: [[i16; 8]; 16],
    /// Integer weight of each sub-block's activation sum: the mins (Q4_K, Q2_K) or the scales
    /// (Q6_K, whose levels are stored +32).
    pub w: [[i16; 8]; 16],
}

#[inline(always)]
fn f16_at(b: &[u8], o: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[o], b[o + 1]])).to_f32()
}

/// Decodes the scales of a group block (see `quant::repack` for the field order).
#[inline(always)]
pub(crate) fn k_scales<const KIND: u8>(xb: &[u8]) -> KScales {
    let mut k = KScales { d: [0.0; 8], dmin: [0.0; 8], sc: [[0; 8]; 16], w: [[0; 8]; 16] };
    for r in 0..8 {
        match KIND {
            KIND_Q4_K => {
                k.d[r] = f16_at(xb, 2 * r);
                k.dmin[r] = f16_at(xb, 16 + 2 * r);
                let q: [u8; 12] = std::array::from_fn(|j| xb[32 + 8 * j + r]);
                for j in 0..8 {
                    let (sc, m) = crate::quant::kquants::helpers::get_scale_min_k4(j, &q);
                    k.sc[j][r] = sc as i16;
                    k.w[j][r] = m as i16;
                }
            }
            KIND_TQ2_0 => {
                k.d[r] = f16_at(xb, 2 * r);
                for j in 0..16 {
                    k.sc[j][r] = 1;
                    k.w[j][r] = 1;
                }
            }
            KIND_Q6_K => {
                k.d[r] = f16_at(xb, 2 * r);
                for j in 0..16 {
                    let sc = xb[16 + 8 * j + r] as i8 as i16;
                    k.sc[j][r] = sc;
                    k.w[j][r] = sc;
                }
            }
            _ => {
                k.d[r] = f16_at(xb, 2 * r);
                k.dmin[r] = f16_at(xb, 16 + 2 * r);
                for j in 0..16 {
                    let b = xb[32 + 8 * j + r];
                    k.sc[j][r] = (b & 15) as i16;
                    k.w[j][r] = (b >> 4) as i16;
                }
            }
        }
    }
    k
}

/// Byte `i` of row `r`'s 4-byte-chunked field starting at `off`.
#[inline(always)]
fn chunked(xb: &[u8], off: usize, r: usize, i: usize) -> u8 {
    xb[off + 32 * (i / 4) + 4 * r + i % 4]
}

/// The unsigned level of element `e` of row `r` (Q6_K: level + 32).
#[inline(always)]
fn k_level<const KIND: u8>(xb: &[u8], r: usize, e: usize) -> i32 {
    match KIND {
        KIND_Q4_K => {
            let (sb, l) = (e / 32, e % 32);
            let byte = chunked(xb, 128, r, 32 * (sb / 2) + l);
            (if sb % 2 == 0 { byte & 15 } else { byte >> 4 }) as i32
        }
        KIND_Q6_K => {
            let (n, t, l) = (e / 128, (e % 128) / 32, e % 32);
            let ql = chunked(xb, 144, r, 64 * n + 32 * (t & 1) + l);
            let nib = if t < 2 { ql & 15 } else { ql >> 4 };
            let qh = chunked(xb, 1168, r, 32 * n + l);
            (nib | (((qh >> (2 * t)) & 3) << 4)) as i32
        }
        _ => {
            let (n, j, l) = (e / 128, (e % 128) / 32, e % 32);
            ((chunked(xb, q2_qs(KIND), r, 32 * n + l) >> (2 * j)) & 3) as i32
        }
    }
}

/// Sum of the activation levels of sub-block `sb` from the Q8_K sums of 16.
#[inline(always)]
pub(crate) fn k_ysum<const KIND: u8>(bsums: &[i16; 16], sb: usize) -> i32 {
    if KIND == KIND_Q4_K {
        bsums[2 * sb] as i32 + bsums[2 * sb + 1] as i32
    } else if KIND == KIND_TQ2_0 {
        bsums[8 * sb..8 * sb + 8].iter().map(|&v| v as i32).sum()
    } else {
        bsums[sb] as i32
    }
}

fn x8_k<const KIND: u8>(x: &[u8], y: &[&[u8]], acc: &mut [[f32; 8]]) {
    let gb = k_group_bytes(KIND);
    let nsb = k_subblocks(KIND);
    let sbl = 256 / nsb;
    let nb = x.len() / gb;
    for b in 0..nb {
        let xb = &x[b * gb..(b + 1) * gb];
        let k = k_scales::<KIND>(xb);
        for (yc, a) in y.iter().zip(acc.iter_mut()) {
            let yb = &yc[b * Q8K_BYTES..(b + 1) * Q8K_BYTES];
            let dy = f32::from_le_bytes([yb[0], yb[1], yb[2], yb[3]]);
            let bs: [i16; 16] = std::array::from_fn(|i| {
                i16::from_le_bytes([yb[Q8K_BSUMS + 2 * i], yb[Q8K_BSUMS + 2 * i + 1]])
            });
            for (r, ar) in a.iter_mut().enumerate() {
                let (mut isum, mut iw) = (0i32, 0i32);
                for sb in 0..nsb {
                    let mut dot = 0i32;
                    for e in sb * sbl..(sb + 1) * sbl {
                        dot += k_level::<KIND>(xb, r, e) * yb[Q8K_QS + e] as i8 as i32;
                    }
                    isum += k.sc[sb][r] as i32 * dot;
                    iw += k.w[sb][r] as i32 * k_ysum::<KIND>(&bs, sb);
                }
                if k_offset(KIND) > 0 {
                    *ar = ((isum - k_offset(KIND) * iw) as f32).mul_add(k.d[r] * dy, *ar);
                } else {
                    *ar = (isum as f32).mul_add(k.d[r] * dy, *ar);
                    *ar = (iw as f32).mul_add(k.dmin[r] * -dy, *ar);
                }
            }
        }
    }
}

/// Q4_K x 8 rows against Q8_K activations.
pub(crate) fn gemm_q4_k_x8(x: &[u8], y: &[&[u8]], acc: &mut [[f32; 8]]) {
    x8_k::<KIND_Q4_K>(x, y, acc);
}

/// Q6_K x 8 rows against Q8_K activations.
pub(crate) fn gemm_q6_k_x8(x: &[u8], y: &[&[u8]], acc: &mut [[f32; 8]]) {
    x8_k::<KIND_Q6_K>(x, y, acc);
}

/// TQ2_0 x 8 rows against Q8_K activations.
pub(crate) fn gemm_tq2_0_x8(x: &[u8], y: &[&[u8]], acc: &mut [[f32; 8]]) {
    x8_k::<KIND_TQ2_0>(x, y, acc);
}

/// Q2_K x 8 rows against Q8_K activations.
pub(crate) fn gemm_q2_k_x8(x: &[u8], y: &[&[u8]], acc: &mut [[f32; 8]]) {
    x8_k::<KIND_Q2_K>(x, y, acc);
}

/// The scalar kernel for repacked weights of type `d`.
pub(crate) fn scalar_kernel(d: DType) -> Option<RepackGemmFn> {
    Some(match d {
        DType::Q4_0 => gemm_q4_0_x8,
        DType::IQ4_NL => gemm_iq4_nl_x8,
        DType::MXFP4 => gemm_mxfp4_x8,
        DType::Q4_K => gemm_q4_k_x8,
        DType::Q6_K => gemm_q6_k_x8,
        DType::Q2_K => gemm_q2_k_x8,
        DType::TQ2_0 => gemm_tq2_0_x8,
        _ => return None,
    })
}
