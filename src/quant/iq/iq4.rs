//! IQ4_NL (blocks of 32, one f16 scale) and IQ4_XS (super-blocks of 256 with 6-bit sub-block
//! scales): 4-bit indices into the non-linear table `kvalues_iq4nl`.

use super::grids::KVALUES_IQ4NL;
use super::{BlockQ8_0, BlockQ8K, best_index_int8, blocks, quantize_rows};
use crate::dtype::QK_K;
use crate::error::Result;
use crate::quant::util::{fp16_to_fp32, fp32_to_fp16, nearest_int};
use bytemuck::{Pod, Zeroable};

/// ggml's `QK4_NL`.
pub(crate) const QK4_NL: usize = 32;

/// ggml's `block_iq4_nl`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub(crate) struct BlockIQ4NL {
    pub d: u16,
    pub qs: [u8; QK4_NL / 2],
}
const _: () = assert!(size_of::<BlockIQ4NL>() == 18);

/// ggml's `block_iq4_xs`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub(crate) struct BlockIQ4XS {
    pub d: u16,
    pub scales_h: u16,
    pub scales_l: [u8; QK_K / 64],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockIQ4XS>() == 136);

/// The outputs of [`quantize_row_iq4_nl_impl`] for one super-block.
struct Iq4Out<'a> {
    dh: &'a mut u16,
    q4: &'a mut [u8],
    scales_h: &'a mut u16,
    scales_l: &'a mut [u8],
}

/// ggml's `quantize_row_iq4_nl_impl` over one super-block `x` of `block_size` sub-blocks.
/// `ntry > 0` searches scales around the first guess (the reference quantizers use 7); `ntry = -1`
/// is the CPU converter's single pass. `big_l` is ggml's `L` scratch, which its callers keep across
/// blocks: the CPU pass leaves it untouched for an all-zero block and packs the previous block's
/// indices (ggml's behaviour; the scale is 0, so the values are 0 either way).
fn quantize_row_iq4_nl_impl(
    block_size: usize,
    x: &[f32],
    out: Iq4Out<'_>,
    quant_weights: Option<&[f32]>,
    ntry: i32,
    big_l: &mut [u8],
) {
    let values = &KVALUES_IQ4NL;
    let super_block_size = x.len();
    let nb = super_block_size / block_size;
    let mut scales = [0f32; QK_K / 32];
    let mut weight = [0f32; 32];

    let mut sigma2 = 0.0f32;
    for &v in x {
        sigma2 += v * v;
    }
    sigma2 *= 2.0 / super_block_size as f32;

    out.q4.fill(0);
    *out.dh = fp32_to_fp16(0.0);

    let (mut max_scale, mut amax_scale) = (0.0f32, 0.0f32);
    for ib in 0..nb {
        let xb = &x[ib * block_size..(ib + 1) * block_size];
        let lb = &mut big_l[ib * block_size..(ib + 1) * block_size];
        let weight = &mut weight[..block_size];
        match quant_weights {
            Some(qw) => {
                let qw = &qw[ib * block_size..(ib + 1) * block_size];
                for j in 0..block_size {
                    weight[j] = qw[j] * (sigma2 + xb[j] * xb[j]).sqrt();
                }
            }
            None => {
                for j in 0..block_size {
                    weight[j] = xb[j] * xb[j];
                }
            }
        }
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in xb {
            let ax = v.abs();
            if ax > amax {
                amax = ax;
                max = v;
            }
        }
        if amax < 1e-15 {
            scales[ib] = 0.0;
            continue;
        }
        let v0 = values[0] as f32;
        let mut d = if ntry > 0 { -max / v0 } else { max / v0 };
        let mut id = 1.0 / d;
        let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
        for j in 0..block_size {
            let al = id * xb[j];
            let l = best_index_int8(values, al);
            lb[j] = l as u8;
            let q = values[l] as f32;
            let w = weight[j];
            sumqx += w * q * xb[j];
            sumq2 += w * q * q;
        }
        d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
        let mut best = d * sumqx;
        for itry in -ntry..=ntry {
            id = (itry + values[0] as i32) as f32 / max;
            sumqx = 0.0;
            sumq2 = 0.0;
            for j in 0..block_size {
                let al = id * xb[j];
                let l = best_index_int8(values, al);
                let q = values[l] as f32;
                let w = weight[j];
                sumqx += w * q * xb[j];
                sumq2 += w * q * q;
            }
            if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        let abs_d = d.abs();
        if abs_d > amax_scale {
            amax_scale = abs_d;
            max_scale = d;
        }
    }

    if nb > 1 {
        *out.scales_h = 0;
        let d = -max_scale / 32.0;
        *out.dh = fp32_to_fp16(d);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for ib in 0..nb {
            let mut l = nearest_int(id * scales[ib]);
            l = l.clamp(-32, 31);
            let dl = d * l as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            let xb = &x[ib * block_size..(ib + 1) * block_size];
            for j in 0..block_size {
                big_l[ib * block_size + j] = best_index_int8(values, idl * xb[j]) as u8;
            }
            let l = (l + 32) as u8;
            let (l_l, l_h) = (l & 0xf, l >> 4);
            if ib % 2 == 0 {
                out.scales_l[ib / 2] = l_l;
            } else {
                out.scales_l[ib / 2] |= l_l << 4;
            }
            *out.scales_h |= (l_h as u16) << (2 * (ib % 8));
        }
    } else {
        *out.dh = fp32_to_fp16(scales[0]);
        if ntry > 0 {
            let id = if scales[0] != 0.0 { 1.0 / scales[0] } else { 0.0 };
            for j in 0..super_block_size {
                big_l[j] = best_index_int8(values, id * x[j]) as u8;
            }
        }
    }

    for i in 0..super_block_size / 32 {
        for j in 0..16 {
            out.q4[16 * i + j] = big_l[32 * i + j] | (big_l[32 * i + 16 + j] << 4);
        }
    }
}

fn iq4_nl_block(x: &[f32], qw: Option<&[f32]>, ntry: i32, big_l: &mut [u8]) -> BlockIQ4NL {
    let mut b = BlockIQ4NL::zeroed();
    let (mut unused_h, mut unused_l) = (0u16, [0u8; 0]);
    let out =
        Iq4Out { dh: &mut b.d, q4: &mut b.qs, scales_h: &mut unused_h, scales_l: &mut unused_l };
    quantize_row_iq4_nl_impl(32, x, out, qw, ntry, big_l);
    b
}

fn iq4_xs_block(x: &[f32], qw: Option<&[f32]>) -> BlockIQ4XS {
    let mut b = BlockIQ4XS::zeroed();
    let mut big_l = [0u8; QK_K];
    let out = Iq4Out {
        dh: &mut b.d,
        q4: &mut b.qs,
        scales_h: &mut b.scales_h,
        scales_l: &mut b.scales_l,
    };
    quantize_row_iq4_nl_impl(32, x, out, qw, 7, &mut big_l);
    b
}

/// ggml's `quantize_iq4_nl` (the reference quantizer used by `ggml_quantize_chunk`).
pub(crate) fn quantize_iq4_nl(
    src: &[f32],
    dst: &mut [u8],
    n_per_row: usize,
    imatrix: Option<&[f32]>,
) -> Result<()> {
    quantize_rows::<BlockIQ4NL>(src, dst, n_per_row, imatrix, QK4_NL, |x, qw| {
        Ok(iq4_nl_block(x, qw, 7, &mut [0u8; QK4_NL]))
    })
}

/// ggml-cpu's `quantize_row_iq4_nl` (`quantize_row_iq4_nl_ref`): the CPU's `from_float`, a single
/// pass without the scale search. It gives different bytes from [`quantize_iq4_nl`], which is what
/// `ggml_quantize_chunk` (and so `quant::quantize`) uses.
pub(crate) fn quantize_row_iq4_nl(src: &[f32], dst: &mut [u8]) {
    let mut big_l = [0u8; QK4_NL];
    for (x, out) in src.chunks_exact(QK4_NL).zip(dst.chunks_exact_mut(size_of::<BlockIQ4NL>())) {
        out.copy_from_slice(bytemuck::bytes_of(&iq4_nl_block(x, None, -1, &mut big_l)));
    }
}

/// ggml's `quantize_iq4_xs`.
pub(crate) fn quantize_iq4_xs(
    src: &[f32],
    dst: &mut [u8],
    n_per_row: usize,
    imatrix: Option<&[f32]>,
) -> Result<()> {
    quantize_rows::<BlockIQ4XS>(src, dst, n_per_row, imatrix, QK_K, |x, qw| Ok(iq4_xs_block(x, qw)))
}

/// ggml-cpu's `quantize_row_iq4_xs` (`from_float`): the reference quantizer on one row.
pub(crate) fn quantize_row_iq4_xs(src: &[f32], dst: &mut [u8]) {
    for (x, out) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(size_of::<BlockIQ4XS>())) {
        out.copy_from_slice(bytemuck::bytes_of(&iq4_xs_block(x, None)));
    }
}

/// ggml's `dequantize_row_iq4_nl`.
pub(crate) fn dequantize_row_iq4_nl(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<BlockIQ4NL>(src).zip(dst.chunks_exact_mut(QK4_NL)) {
        let d = fp16_to_fp32(b.d);
        for j in 0..QK4_NL / 2 {
            y[j] = d * KVALUES_IQ4NL[(b.qs[j] & 0xf) as usize] as f32;
            y[j + QK4_NL / 2] = d * KVALUES_IQ4NL[(b.qs[j] >> 4) as usize] as f32;
        }
    }
}

/// ggml's `dequantize_row_iq4_xs`.
pub(crate) fn dequantize_row_iq4_xs(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<BlockIQ4XS>(src).zip(dst.chunks_exact_mut(QK_K)) {
        let d = fp16_to_fp32(b.d);
        for (ib, (y, qs)) in y.chunks_exact_mut(32).zip(b.qs.chunks_exact(16)).enumerate() {
            let ls = ((b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf) as i32
                | ((((b.scales_h >> (2 * ib)) & 3) as i32) << 4);
            let dl = d * (ls - 32) as f32;
            for j in 0..16 {
                y[j] = dl * KVALUES_IQ4NL[(qs[j] & 0xf) as usize] as f32;
                y[j + 16] = dl * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as f32;
            }
        }
    }
}

/// ggml's `ggml_vec_dot_iq4_nl_q8_0_generic`.
pub(crate) fn vec_dot_iq4_nl_q8_0(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let nb = n / QK4_NL;
    let mut sumf = 0.0f32;
    for (bx, by) in blocks::<BlockIQ4NL>(x).zip(blocks::<BlockQ8_0>(y)).take(nb) {
        let d = fp16_to_fp32(by.d) * fp16_to_fp32(bx.d);
        let (mut sumi1, mut sumi2) = (0i32, 0i32);
        for j in 0..QK4_NL / 2 {
            sumi1 += by.qs[j] as i32 * KVALUES_IQ4NL[(bx.qs[j] & 0xf) as usize] as i32;
            sumi2 += by.qs[j + QK4_NL / 2] as i32 * KVALUES_IQ4NL[(bx.qs[j] >> 4) as usize] as i32;
        }
        sumf += d * (sumi1 + sumi2) as f32;
    }
    sumf
}

/// ggml's `ggml_vec_dot_iq4_xs_q8_K_generic`.
pub(crate) fn vec_dot_iq4_xs_q8_K(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let nb = n / QK_K;
    let mut sumf = 0.0f32;
    for (bx, by) in blocks::<BlockIQ4XS>(x).zip(blocks::<BlockQ8K>(y)).take(nb) {
        let d4d8 = fp16_to_fp32(bx.d) * by.d;
        let mut h = bx.scales_h;
        for ib in (0..QK_K / 32).step_by(2) {
            let ls1 = ((bx.scales_l[ib / 2] & 0xf) as u16 | ((h << 4) & 0x30)) as i32;
            let ls2 = ((bx.scales_l[ib / 2] >> 4) as u16 | ((h << 2) & 0x30)) as i32;
            h >>= 4;
            for (half, ls) in [ls1, ls2].into_iter().enumerate() {
                let dl = d4d8 * (ls - 32) as f32;
                let qs = &bx.qs[16 * (ib + half)..16 * (ib + half + 1)];
                let q8 = &by.qs[32 * (ib + half)..32 * (ib + half + 1)];
                let (mut sumi1, mut sumi2) = (0i32, 0i32);
                for j in 0..16 {
                    sumi1 += q8[j] as i32 * KVALUES_IQ4NL[(qs[j] & 0xf) as usize] as i32;
                    sumi2 += q8[j + 16] as i32 * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as i32;
                }
                sumf += dl * (sumi1 + sumi2) as f32;
            }
        }
    }
    sumf
}
