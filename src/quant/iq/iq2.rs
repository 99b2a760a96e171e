//! IQ2_XXS (2.0625 bpw), IQ2_XS (2.3125 bpw) and IQ2_S (2.5625 bpw): groups of 8 magnitudes taken
//! from the E8-lattice grids `iq2xxs_grid` / `iq2xs_grid` / `iq2s_grid`, with sign bits.

use super::grids::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, KSIGNS_IQ2XS};
use super::search::{self, Lookup, Search};
use super::{
    BlockQ8K, aborts, all_signs, blocks, check_scale, even_signs, fit_odd, fmax, imatrix_weights,
    make_qp_quants, pack_levels, quantize_rows, quantize_rows_imatrix, scale_nibbles, sign_f,
    sign_i, sum_sq,
};
use crate::dtype::{DType, QK_K};
use crate::error::Result;
use crate::quant::util::{fp16_to_fp32, fp32_to_fp16, nearest_int};
use bytemuck::{Pod, Zeroable};

/// ggml's `block_iq2_xxs`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub(crate) struct BlockIQ2XXS {
    pub d: u16,
    pub qs: [u16; QK_K / 8],
}
const _: () = assert!(size_of::<BlockIQ2XXS>() == 66);

/// ggml's `block_iq2_xs`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub(crate) struct BlockIQ2XS {
    pub d: u16,
    pub qs: [u16; QK_K / 8],
    pub scales: [u8; QK_K / 32],
}
const _: () = assert!(size_of::<BlockIQ2XS>() == 74);

/// ggml's `block_iq2_s`: `qs` holds 32 low index bytes then 32 sign bytes.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub(crate) struct BlockIQ2S {
    pub d: u16,
    pub qs: [u8; QK_K / 4],
    pub qh: [u8; QK_K / 32],
    pub scales: [u8; QK_K / 32],
}
const _: () = assert!(size_of::<BlockIQ2S>() == 82);

/// The two little-endian u32 words ggml `memcpy`s out of four u16 `qs` entries.
#[inline(always)]
fn aux32(qs: &[u16]) -> [u32; 2] {
    [qs[0] as u32 | (qs[1] as u32) << 16, qs[2] as u32 | (qs[3] as u32) << 16]
}

/// Snaps levels `l` (one group of 8) to the grid as the search loops do: on-grid keys stay,
/// others move to their best neighbour. Returns whether the key was on the grid.
fn snap8(
    dtype: DType,
    s: &Search<8>,
    xval: &[f32],
    waux: &[f32],
    scale: f32,
    l: &mut [i8],
) -> Result<(bool, usize)> {
    match s.lookup(pack_levels(l, 2)) {
        Some(Lookup::OnGrid(g)) => Ok((true, g)),
        Some(Lookup::Near(nb)) => s
            .best_neighbour(nb, xval, waux, scale, l)
            .map(|g| (false, g))
            .ok_or_else(|| aborts(dtype, "no grid neighbour")),
        None => Err(aborts(dtype, "point outside the grid map")),
    }
}

/// The grid index of levels that must be on the grid (ggml aborts otherwise).
fn on_grid<const N: usize>(dtype: DType, s: &Search<N>, l: &[i8], bits: u32) -> Result<usize> {
    match s.lookup(pack_levels(l, bits)) {
        Some(Lookup::OnGrid(g)) => Ok(g),
        _ => Err(aborts(dtype, "found point not on grid")),
    }
}

/// `clamp(nearest_int(0.5 * (id * x - 1)), 0, kmax)`, the level of one magnitude.
#[inline(always)]
fn level(id: f32, x: f32, kmax: i32) -> i8 {
    nearest_int(0.5 * (id * x - 1.0)).clamp(0, kmax) as i8
}

// ---------------------------------------------------------------------------------------------
// IQ2_XXS

fn iq2_xxs_block(xbl: &[f32], qw_bl: &[f32]) -> Result<BlockIQ2XXS> {
    const DT: DType = DType::IQ2_XXS;
    const KMAXQ: i32 = 3;
    let s = search::iq2xxs();
    let mut y = BlockIQ2XXS::zeroed();
    let mut q2 = [0u32; 2 * (QK_K / 32)];
    let mut scales = [0f32; QK_K / 32];
    let (mut weight, mut xval, mut waux) = ([0f32; 32], [0f32; 32], [0f32; 32]);
    let (mut l, mut laux) = ([0i8; 32], [0i8; 32]);
    let mut block_signs = [0u8; 4];

    let sigma2 = sum_sq(xbl) / QK_K as f32;
    let mut max_scale = 0.0f32;
    for ib in 0..QK_K / 32 {
        let xb = &xbl[32 * ib..32 * ib + 32];
        imatrix_weights(&qw_bl[32 * ib..32 * ib + 32], xb, sigma2, &mut weight);
        for i in 0..32 {
            waux[i] = weight[i].sqrt();
        }
        even_signs(xb, &weight, &mut xval, &mut block_signs);
        let mut max = xval[0];
        for &v in &xval[1..] {
            max = fmax(max, v);
        }
        if max < 1e-15 {
            scales[ib] = 0.0;
            l.fill(0);
            continue;
        }
        let mut scale = make_qp_quants(KMAXQ + 1, &xval, &mut l, &weight);
        let eff_max = scale * KMAXQ as f32;
        if eff_max <= 0.0 {
            scales[ib] = 0.0;
            l.fill(0);
            continue;
        }
        let mut best = 0.0f32;
        for is in -6..=6 {
            let id = ((2 * KMAXQ - 1) as f32 + is as f32 * 0.1) / eff_max;
            let this_scale = 1.0 / id;
            for k in 0..4 {
                for i in 0..8 {
                    laux[8 * k + i] = level(id, xval[8 * k + i], KMAXQ - 1);
                }
                let r = 8 * k..8 * k + 8;
                snap8(DT, s, &xval[r.clone()], &waux[r.clone()], this_scale, &mut laux[r])?;
            }
            let (sumqx, sumq2) = fit_odd(&weight, &xval, &laux);
            if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                scale = sumqx / sumq2;
                best = scale * sumqx;
                l = laux;
            }
        }
        if scale > 0.0 {
            let id = 1.0 / scale;
            for k in 0..4 {
                let r = 8 * k..8 * k + 8;
                let mut lk = [0i8; 8];
                for i in 0..8 {
                    lk[i] = level(id, xval[8 * k + i], KMAXQ - 1);
                }
                let (_, g) = snap8(DT, s, &xval[r.clone()], &waux[r.clone()], scale, &mut lk)?;
                s.levels(g, &mut l[r]);
            }
            let (sumqx, sumq2) = fit_odd(&weight, &xval, &l);
            if sumq2 > 0.0 {
                scale = sumqx / sumq2;
            }
        }
        if scale < 0.0 {
            scale = -scale;
            for b in &mut block_signs {
                *b = !*b & 127;
            }
        }
        for k in 0..4 {
            let g = on_grid(DT, s, &l[8 * k..8 * k + 8], 2)?;
            q2[2 * ib] |= (g as u32) << (8 * k);
            q2[2 * ib + 1] |= (block_signs[k] as u32) << (7 * k);
        }
        check_scale(DT, scale)?;
        scales[ib] = scale;
        max_scale = fmax(max_scale, scale);
    }
    if max_scale == 0.0 {
        return Ok(y);
    }
    let d = max_scale / 31.0;
    y.d = fp32_to_fp16(d);
    let id = 1.0 / d;
    for ib in 0..QK_K / 32 {
        let l = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 15);
        q2[2 * ib + 1] |= (l as u32) << 28;
    }
    for (i, w) in q2.iter().enumerate() {
        y.qs[2 * i] = *w as u16;
        y.qs[2 * i + 1] = (*w >> 16) as u16;
    }
    Ok(y)
}

/// ggml's `quantize_iq2_xxs`; ggml requires an importance matrix.
pub(crate) fn quantize_iq2_xxs(
    src: &[f32],
    dst: &mut [u8],
    n_per_row: usize,
    imatrix: Option<&[f32]>,
) -> Result<()> {
    quantize_rows_imatrix(DType::IQ2_XXS, src, dst, n_per_row, imatrix, iq2_xxs_block)
}

/// ggml's `dequantize_row_iq2_xxs`.
pub(crate) fn dequantize_row_iq2_xxs(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<BlockIQ2XXS>(src).zip(dst.chunks_exact_mut(QK_K)) {
        let d = fp16_to_fp32(b.d);
        for (ib32, y) in y.chunks_exact_mut(32).enumerate() {
            let aux = aux32(&b.qs[4 * ib32..4 * ib32 + 4]);
            let db = d * (0.5 + (aux[1] >> 28) as f32) * 0.25;
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let grid = IQ2XXS_GRID[(aux[0] >> (8 * l)) as u8 as usize].to_le_bytes();
                let signs = KSIGNS_IQ2XS[((aux[1] >> (7 * l)) & 127) as usize];
                for j in 0..8 {
                    y[j] = db * grid[j] as f32 * sign_f(signs, j);
                }
            }
        }
    }
}

/// ggml's `ggml_vec_dot_iq2_xxs_q8_K_generic`.
pub(crate) fn vec_dot_iq2_xxs_q8_K(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in blocks::<BlockIQ2XXS>(x).zip(blocks::<BlockQ8K>(y)).take(n / QK_K) {
        let d = fp16_to_fp32(bx.d) * by.d;
        let mut bsum = 0i32;
        for ib32 in 0..QK_K / 32 {
            let aux = aux32(&bx.qs[4 * ib32..4 * ib32 + 4]);
            let ls = (2 * (aux[1] >> 28) + 1) as i32;
            let mut sumi = 0i32;
            for l in 0..4 {
                let grid = IQ2XXS_GRID[(aux[0] >> (8 * l)) as u8 as usize].to_le_bytes();
                let signs = KSIGNS_IQ2XS[((aux[1] >> (7 * l)) & 127) as usize];
                let q8 = &by.qs[32 * ib32 + 8 * l..32 * ib32 + 8 * l + 8];
                for j in 0..8 {
                    sumi += grid[j] as i32 * q8[j] as i32 * sign_i(signs, j);
                }
            }
            bsum += sumi * ls;
        }
        sumf += d * bsum as f32;
    }
    0.125 * sumf
}

/// What differs between ggml's IQ2_XS and IQ2_S block quantizers, which otherwise run the same
/// scale search over groups of 16.
struct Iq2x16 {
    dtype: DType,
    search: &'static Search<8>,
    /// IQ2_XS stores 7 sign bits per group of 8 (an even number of negatives, see `even_signs`);
    /// IQ2_S stores all 8.
    even_signs: bool,
    /// A group of 16 whose largest magnitude is below this is all zero.
    zero_below: f32,
}

/// The scale search of `quantize_row_iq2_xs_impl` / `quantize_row_iq2_s_impl` over one super-block:
/// returns the scale of each group of 16 and their maximum, and hands each group of 8 to
/// `store(index of the group of 8, grid index, sign bits)`. Without an importance matrix the weights
/// are `0.25 * sigma2 + x^2` (IQ2_S only).
fn iq2_x16_search(
    var: &Iq2x16,
    xbl: &[f32],
    qw_bl: Option<&[f32]>,
    sigma2: f32,
    mut store: impl FnMut(usize, usize, u8),
) -> Result<([f32; QK_K / 16], f32)> {
    const KMAXQ: i32 = 3;
    let (dt, s) = (var.dtype, var.search);
    let sign_mask = if var.even_signs { 127 } else { 255 };
    let mut scales = [0f32; QK_K / 16];
    let (mut weight, mut xval, mut waux) = ([0f32; 16], [0f32; 16], [0f32; 16]);
    let (mut l, mut laux) = ([0i8; 16], [0i8; 16]);
    let mut block_signs = [0u8; 2];

    let mut max_scale = 0.0f32;
    for ib in 0..QK_K / 16 {
        let xb = &xbl[16 * ib..16 * ib + 16];
        match qw_bl {
            Some(qw) => imatrix_weights(&qw[16 * ib..16 * ib + 16], xb, sigma2, &mut weight),
            None => {
                for i in 0..16 {
                    weight[i] = 0.25 * sigma2 + xb[i] * xb[i];
                }
            }
        }
        for i in 0..16 {
            waux[i] = weight[i].sqrt();
        }
        if var.even_signs {
            even_signs(xb, &weight, &mut xval, &mut block_signs);
        } else {
            all_signs(xb, &mut xval, &mut block_signs);
        }
        let mut max = xval[0];
        for &v in &xval[1..] {
            max = fmax(max, v);
        }
        l.fill(0);
        if max < var.zero_below {
            scales[ib] = 0.0;
            continue;
        }
        let mut best = 0.0f32;
        let mut scale = max / (2 * KMAXQ - 1) as f32;
        let mut is_on_grid = [true; 2];
        let mut is_on_grid_aux = [true; 2];
        for is in -9..=9 {
            let id = ((2 * KMAXQ - 1) as f32 + is as f32 * 0.1) / max;
            let this_scale = 1.0 / id;
            for k in 0..2 {
                let r = 8 * k..8 * k + 8;
                for i in r.clone() {
                    laux[i] = level(id, xval[i], KMAXQ - 1);
                }
                let (on, _) =
                    snap8(dt, s, &xval[r.clone()], &waux[r.clone()], this_scale, &mut laux[r])?;
                is_on_grid_aux[k] = on;
            }
            let (sumqx, sumq2) = fit_odd(&weight, &xval, &laux);
            if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                scale = sumqx / sumq2;
                best = scale * sumqx;
                l = laux;
                is_on_grid = is_on_grid_aux;
            }
        }
        if is_on_grid.contains(&false) && scale > 0.0 {
            let id = 1.0 / scale;
            for k in 0..2 {
                if is_on_grid[k] {
                    continue;
                }
                let r = 8 * k..8 * k + 8;
                for i in r.clone() {
                    l[i] = level(id, xval[i], KMAXQ - 1);
                }
                snap8(dt, s, &xval[r.clone()], &waux[r.clone()], scale, &mut l[r])?;
            }
            let (sumqx, sumq2) = fit_odd(&weight, &xval, &l);
            if sumq2 > 0.0 {
                scale = sumqx / sumq2;
            }
        }
        if scale < 0.0 {
            scale = -scale;
            for b in &mut block_signs {
                *b = !*b & sign_mask;
            }
        }
        for k in 0..2 {
            let g = on_grid(dt, s, &l[8 * k..8 * k + 8], 2)?;
            store(2 * ib + k, g, block_signs[k]);
        }
        check_scale(dt, scale)?;
        scales[ib] = scale;
        max_scale = fmax(max_scale, scale);
    }
    Ok((scales, max_scale))
}

// ---------------------------------------------------------------------------------------------
// IQ2_XS

fn iq2_xs_block(xbl: &[f32], qw_bl: &[f32]) -> Result<BlockIQ2XS> {
    let v = Iq2x16 {
        dtype: DType::IQ2_XS,
        search: search::iq2xs(),
        even_signs: true,
        zero_below: 1e-15,
    };
    let mut y = BlockIQ2XS::zeroed();
    let mut q2 = [0u16; 2 * (QK_K / 16)];
    let sigma2 = sum_sq(xbl) / QK_K as f32;
    let (scales, max_scale) = iq2_x16_search(&v, xbl, Some(qw_bl), sigma2, |i8, g, signs| {
        q2[i8] = g as u16 | (signs as u16) << 9;
    })?;
    if max_scale == 0.0 {
        return Ok(y);
    }
    let d = max_scale / 31.0;
    y.d = fp32_to_fp16(d);
    scale_nibbles(&scales, 1.0 / d, &mut y.scales);
    y.qs = q2;
    Ok(y)
}

/// ggml's `quantize_iq2_xs`; ggml requires an importance matrix.
pub(crate) fn quantize_iq2_xs(
    src: &[f32],
    dst: &mut [u8],
    n_per_row: usize,
    imatrix: Option<&[f32]>,
) -> Result<()> {
    quantize_rows_imatrix(DType::IQ2_XS, src, dst, n_per_row, imatrix, iq2_xs_block)
}

/// ggml's `dequantize_row_iq2_xs`.
pub(crate) fn dequantize_row_iq2_xs(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<BlockIQ2XS>(src).zip(dst.chunks_exact_mut(QK_K)) {
        let d = fp16_to_fp32(b.d);
        for (ib32, y) in y.chunks_exact_mut(32).enumerate() {
            let db = [
                d * (0.5 + (b.scales[ib32] & 0xf) as f32) * 0.25,
                d * (0.5 + (b.scales[ib32] >> 4) as f32) * 0.25,
            ];
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let q = b.qs[4 * ib32 + l];
                let grid = IQ2XS_GRID[(q & 511) as usize].to_le_bytes();
                let signs = KSIGNS_IQ2XS[(q >> 9) as usize];
                for j in 0..8 {
                    y[j] = db[l / 2] * grid[j] as f32 * sign_f(signs, j);
                }
            }
        }
    }
}

/// ggml's `ggml_vec_dot_iq2_xs_q8_K_generic`.
pub(crate) fn vec_dot_iq2_xs_q8_K(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in blocks::<BlockIQ2XS>(x).zip(blocks::<BlockQ8K>(y)).take(n / QK_K) {
        let d = fp16_to_fp32(bx.d) * by.d;
        let mut bsum = 0i32;
        for ib32 in 0..QK_K / 32 {
            let ls =
                [2 * (bx.scales[ib32] & 0xf) as i32 + 1, 2 * (bx.scales[ib32] >> 4) as i32 + 1];
            for (half, &ls) in ls.iter().enumerate() {
                let mut sumi = 0i32;
                for l in 2 * half..2 * half + 2 {
                    let q = bx.qs[4 * ib32 + l];
                    let grid = IQ2XS_GRID[(q & 511) as usize].to_le_bytes();
                    let signs = KSIGNS_IQ2XS[(q >> 9) as usize];
                    let q8 = &by.qs[32 * ib32 + 8 * l..32 * ib32 + 8 * l + 8];
                    for j in 0..8 {
                        sumi += grid[j] as i32 * q8[j] as i32 * sign_i(signs, j);
                    }
                }
                bsum += sumi * ls;
            }
        }
        sumf += d * bsum as f32;
    }
    0.125 * sumf
}

// ---------------------------------------------------------------------------------------------
// IQ2_S

fn iq2_s_block(xbl: &[f32], qw_bl: Option<&[f32]>) -> Result<BlockIQ2S> {
    let v =
        Iq2x16 { dtype: DType::IQ2_S, search: search::iq2s(), even_signs: false, zero_below: 1e-8 };
    let mut y = BlockIQ2S::zeroed();
    y.d = fp32_to_fp16(0.0);
    let sigma2 = 2.0 * sum_sq(xbl) / QK_K as f32;
    let (scales, max_scale) = iq2_x16_search(&v, xbl, qw_bl, sigma2, |i8, g, signs| {
        y.qs[i8] = g as u8;
        y.qh[i8 / 4] |= ((g >> 8) << (2 * (i8 % 4))) as u8;
        y.qs[QK_K / 8 + i8] = signs;
    })?;
    if max_scale == 0.0 {
        return Ok(y);
    }
    let d = max_scale / 31.0;
    y.d = fp32_to_fp16(d * 0.9875);
    scale_nibbles(&scales, 1.0 / d, &mut y.scales);
    Ok(y)
}

/// ggml's `quantize_iq2_s`.
pub(crate) fn quantize_iq2_s(
    src: &[f32],
    dst: &mut [u8],
    n_per_row: usize,
    imatrix: Option<&[f32]>,
) -> Result<()> {
    quantize_rows::<BlockIQ2S>(src, dst, n_per_row, imatrix, QK_K, iq2_s_block)
}

/// ggml's `dequantize_row_iq2_s`.
pub(crate) fn dequantize_row_iq2_s(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<BlockIQ2S>(src).zip(dst.chunks_exact_mut(QK_K)) {
        let d = fp16_to_fp32(b.d);
        for (ib32, y) in y.chunks_exact_mut(32).enumerate() {
            let db = [
                d * (0.5 + (b.scales[ib32] & 0xf) as f32) * 0.25,
                d * (0.5 + (b.scales[ib32] >> 4) as f32) * 0.25,
            ];
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let dl = db[l / 2];
                let idx =
                    b.qs[4 * ib32 + l] as usize | ((b.qh[ib32] as usize) << (8 - 2 * l)) & 0x300;
                let grid = IQ2S_GRID[idx].to_le_bytes();
                let signs = b.qs[QK_K / 8 + 4 * ib32 + l];
                for j in 0..8 {
                    y[j] = dl * grid[j] as f32 * sign_f(signs, j);
                }
            }
        }
    }
}

/// ggml's `ggml_vec_dot_iq2_s_q8_K_generic`.
pub(crate) fn vec_dot_iq2_s_q8_K(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in blocks::<BlockIQ2S>(x).zip(blocks::<BlockQ8K>(y)).take(n / QK_K) {
        let d = fp16_to_fp32(bx.d) * by.d;
        let mut bsum = 0i32;
        for ib32 in 0..QK_K / 32 {
            let ls1 = 1 + 2 * (bx.scales[ib32] & 0xf) as i32;
            let ls2 = 1 + 2 * (bx.scales[ib32] >> 4) as i32;
            let mut sumi = [0i32; 2];
            for l in 0..4 {
                let idx =
                    bx.qs[4 * ib32 + l] as usize | ((bx.qh[ib32] as usize) << (8 - 2 * l)) & 0x300;
                let grid = IQ2S_GRID[idx].to_le_bytes();
                let signs = bx.qs[QK_K / 8 + 4 * ib32 + l];
                let q8 = &by.qs[32 * ib32 + 8 * l..32 * ib32 + 8 * l + 8];
                for j in 0..8 {
                    sumi[l / 2] += q8[j] as i32 * grid[j] as i32 * sign_i(signs, j);
                }
            }
            bsum += ls1 * sumi[0] + ls2 * sumi[1];
        }
        sumf += d * bsum as f32;
    }
    0.125 * sumf
}
