//! IQ1_S (1.5625 bpw) and IQ1_M (1.75 bpw): groups of 8 ternary values from `iq1s_grid` plus a
//! per-block shift of ±`IQ1S_DELTA`.

use super::grids::IQ1S_GRID;
use super::search::{self, Lookup, Search};
use super::{
    BlockQ8K, aborts, blocks, check_scale, fmax, imatrix_weights, pack_levels, quantize_rows,
    quantize_rows_imatrix, sum_sq,
};
use crate::dtype::{DType, QK_K};
use crate::error::Result;
use crate::quant::util::{fp16_to_fp32, fp32_to_fp16, nearest_int};
use bytemuck::{Pod, Zeroable};

/// ggml's `IQ1S_DELTA` (and `IQ1M_DELTA`, the same value).
const IQ1S_DELTA: f32 = 0.125;
const IQ1M_DELTA: f32 = 0.125;

/// ggml's `block_iq1_s`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub(crate) struct BlockIQ1S {
    pub d: u16,
    pub qs: [u8; QK_K / 8],
    pub qh: [u16; QK_K / 32],
}
const _: () = assert!(size_of::<BlockIQ1S>() == 50);

/// ggml's `block_iq1_m`: the f16 super-block scale is spread over the top nibbles of the four
/// little-endian u16 words of `scales`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub(crate) struct BlockIQ1M {
    pub qs: [u8; QK_K / 8],
    pub qh: [u8; QK_K / 16],
    pub scales: [u8; QK_K / 32],
}
const _: () = assert!(size_of::<BlockIQ1M>() == 56);

/// The grid point as signed bytes (-1, 0, 1), as ggml reads `iq1s_grid` through `int8_t *`.
#[inline(always)]
fn grid_i8(index: usize) -> [i8; 8] {
    IQ1S_GRID[index].to_le_bytes().map(|b| b as i8)
}

/// The quant values for levels 0, 1, 2 with a positive and a negative shift.
const X_P: [f32; 3] = [-1.0 + IQ1S_DELTA, IQ1S_DELTA, 1.0 + IQ1S_DELTA];
const X_M: [f32; 3] = [-1.0 - IQ1S_DELTA, -IQ1S_DELTA, 1.0 - IQ1S_DELTA];

/// Indices of `x` in ascending order of value, ties (and NaN) keeping their order: the order of
/// ggml's `qsort` with `iq1_sort_helper` under glibc's stable merge sort.
fn sorted_indices<const N: usize>(x: &[f32]) -> [usize; N] {
    let mut idx: [usize; N] = std::array::from_fn(|i| i);
    for i in 1..N {
        let mut j = i;
        while j > 0 && x[idx[j]] < x[idx[j - 1]] {
            idx.swap(j, j - 1);
            j -= 1;
        }
    }
    idx
}

/// ggml's `iq1_find_best_neighbour2`. `None` when no distance compares below `f32::MAX` (NaN or
/// overflowing data): ggml then scans the whole grid reading out of bounds and asserts.
fn find_best_neighbour2(
    neighbours: &[u16],
    s: &Search<8>,
    xval: &[f32],
    weight: &[f32],
    scale: f32,
    xg: &[f32; 3],
    l: &mut [i8],
) -> Option<usize> {
    let mut best_score = f32::MAX;
    let mut grid_index = None;
    for &j in neighbours {
        let pg = &s.grid[j as usize];
        let mut d2 = 0.0f32;
        for i in 0..8 {
            let q = xg[((pg[i] - 1) / 2) as usize];
            let w = weight[i];
            let diff = scale * q - xval[i];
            d2 += w * diff * diff;
        }
        if d2 < best_score {
            best_score = d2;
            grid_index = Some(j as usize);
        }
    }
    let g = grid_index?;
    s.levels(g, &mut l[..8]);
    Some(g)
}

/// Grid index of each group of 8 levels, moving off-grid groups to their best neighbour.
/// `xx(k)` is the shifted quant table of group `k`. Returns the indices and whether all were on
/// the grid.
fn snap_groups<const G: usize>(
    dtype: DType,
    s: &Search<8>,
    xb: &[f32],
    weight: &[f32],
    scale: f32,
    l: &mut [i8],
    xx: impl Fn(usize) -> &'static [f32; 3],
) -> Result<([usize; G], bool)> {
    let mut index = [0usize; G];
    let mut all_on_grid = true;
    for k in 0..G {
        let r = 8 * k..8 * k + 8;
        index[k] = match s.lookup(pack_levels(&l[r.clone()], 2)) {
            Some(Lookup::OnGrid(g)) => g,
            Some(Lookup::Near(nb)) => {
                all_on_grid = false;
                find_best_neighbour2(
                    nb,
                    s,
                    &xb[r.clone()],
                    &weight[r.clone()],
                    scale,
                    xx(k),
                    &mut l[r],
                )
                .ok_or_else(|| aborts(dtype, "did not find grid point"))?
            }
            None => return Err(aborts(dtype, "point outside the grid map")),
        };
    }
    Ok((index, all_on_grid))
}

/// Refit of the scale after snapping: `(sum w*q*x, sum w*q*q)` over the chosen grid points.
fn refit(
    s: &Search<8>,
    index: &[usize],
    xb: &[f32],
    weight: &[f32],
    xx: impl Fn(usize) -> &'static [f32; 3],
) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
    for (k, &g) in index.iter().enumerate() {
        let pg = &s.grid[g];
        for j in 0..8 {
            let w = weight[8 * k + j];
            let q = xx(k)[((pg[j] - 1) / 2) as usize];
            sumqx += w * q * xb[8 * k + j];
            sumq2 += w * q * q;
        }
    }
    (sumqx, sumq2)
}

/// Levels 0/1/2 of the elements below `i1`, between `i1` and `i2`, and from `i2` on in sorted
/// order.
fn split_levels(idx: &[usize], i1: usize, i2: usize, l: &mut [i8]) {
    for (j, &i) in idx.iter().enumerate() {
        l[i] = if j < i1 {
            0
        } else if j < i2 {
            1
        } else {
            2
        };
    }
}

// ---------------------------------------------------------------------------------------------
// IQ1_S

fn iq1_s_block(xbl: &[f32], qw_bl: &[f32]) -> Result<BlockIQ1S> {
    const DT: DType = DType::IQ1_S;
    const BS: usize = 32;
    let s = search::iq1s();
    let mut y = BlockIQ1S::zeroed();
    y.d = fp32_to_fp16(0.0);
    let mut scales = [0f32; QK_K / BS];
    let mut shifts = [0i8; QK_K / BS];
    let mut weight = [0f32; BS];
    let mut l = [0i8; BS];
    let sigma2 = 2.0 * sum_sq(xbl) / QK_K as f32;
    let mut max_scale = 0.0f32;
    for ib in 0..QK_K / BS {
        let xb = &xbl[BS * ib..BS * ib + BS];
        imatrix_weights(&qw_bl[BS * ib..BS * ib + BS], xb, sigma2, &mut weight);
        let mut max = xb[0].abs();
        for &v in &xb[1..] {
            max = fmax(max, v.abs());
        }
        if max < 1e-12 {
            scales[ib] = 0.0;
            shifts[ib] = 1;
            continue;
        }
        let idx = sorted_indices::<BS>(xb);
        let mut sumx = [0f32; BS + 1];
        let mut sumw = [0f32; BS + 1];
        for j in 0..BS {
            let i = idx[j];
            sumx[j + 1] = sumx[j] + weight[i] * xb[i];
            sumw[j + 1] = sumw[j] + weight[i];
        }
        let mut best_score = -f32::MAX;
        let mut scale = max;
        let mut best: Option<(usize, usize, i8)> = None;
        for i1 in 0..=BS {
            for i2 in i1..=BS {
                for (xs, shift) in [(&X_P, 1i8), (&X_M, -1i8)] {
                    let sumqx = (sumx[i1] - sumx[0]) * xs[0]
                        + (sumx[i2] - sumx[i1]) * xs[1]
                        + (sumx[BS] - sumx[i2]) * xs[2];
                    let sumq2 = (sumw[i1] - sumw[0]) * xs[0] * xs[0]
                        + (sumw[i2] - sumw[i1]) * xs[1] * xs[1]
                        + (sumw[BS] - sumw[i2]) * xs[2] * xs[2];
                    if sumq2 > 0.0 && sumqx * sumqx > best_score * sumq2 {
                        scale = sumqx / sumq2;
                        best_score = scale * sumqx;
                        best = Some((i1, i2, shift));
                    }
                }
            }
        }
        let Some((besti1, besti2, mut best_shift)) = best else {
            scales[ib] = 0.0;
            shifts[ib] = 1;
            continue;
        };
        split_levels(&idx, besti1, besti2, &mut l);
        if scale < 0.0 {
            for v in &mut l {
                *v = 2 - *v;
            }
            scale = -scale;
            best_shift = -best_shift;
        }
        let xx: &'static [f32; 3] = if best_shift == 1 { &X_P } else { &X_M };
        let (index, all_on_grid) = snap_groups::<4>(DT, s, xb, &weight, scale, &mut l, |_| xx)?;
        if !all_on_grid {
            let (sumqx, sumq2) = refit(s, &index, xb, &weight, |_| xx);
            if sumqx > 0.0 && sumq2 > 0.0 {
                scale = sumqx / sumq2;
            }
        }
        let mut h = 0u16;
        for k in 0..4 {
            y.qs[4 * ib + k] = index[k] as u8;
            h |= ((index[k] >> 8) << (3 * k)) as u16;
        }
        y.qh[ib] = h;
        check_scale(DT, scale)?;
        scales[ib] = scale;
        shifts[ib] = best_shift;
        max_scale = fmax(max_scale, scale);
    }
    if max_scale == 0.0 {
        return Ok(y);
    }
    let d = max_scale / 15.0;
    y.d = fp32_to_fp16(d * 1.125);
    let id = 1.0 / d;
    for ib in 0..QK_K / BS {
        let mut l = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 7);
        if shifts[ib] == -1 {
            l |= 8;
        }
        y.qh[ib] |= (l << 12) as u16;
    }
    Ok(y)
}

/// ggml's `quantize_iq1_s`; ggml requires an importance matrix.
pub(crate) fn quantize_iq1_s(
    src: &[f32],
    dst: &mut [u8],
    n_per_row: usize,
    imatrix: Option<&[f32]>,
) -> Result<()> {
    quantize_rows_imatrix(DType::IQ1_S, src, dst, n_per_row, imatrix, iq1_s_block)
}

/// ggml's `dequantize_row_iq1_s`.
pub(crate) fn dequantize_row_iq1_s(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<BlockIQ1S>(src).zip(dst.chunks_exact_mut(QK_K)) {
        let d = fp16_to_fp32(b.d);
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let qh = b.qh[ib];
            let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
            let delta = if qh & 0x8000 != 0 { -IQ1S_DELTA } else { IQ1S_DELTA };
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let grid =
                    grid_i8(b.qs[4 * ib + l] as usize | (((qh >> (3 * l)) & 7) as usize) << 8);
                for j in 0..8 {
                    y[j] = dl * (grid[j] as f32 + delta);
                }
            }
        }
    }
}

/// ggml's `ggml_vec_dot_iq1_s_q8_K_generic`.
pub(crate) fn vec_dot_iq1_s_q8_K(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in blocks::<BlockIQ1S>(x).zip(blocks::<BlockQ8K>(y)).take(n / QK_K) {
        let (mut sumi, mut sumi1) = (0i32, 0i32);
        for ib in 0..QK_K / 32 {
            let qh = bx.qh[ib];
            let ls = 2 * ((qh >> 12) & 7) as i32 + 1;
            let delta = if qh & 0x8000 != 0 { -1 } else { 1 };
            let mut lsum = 0i32;
            for l in 0..4 {
                let grid =
                    grid_i8(bx.qs[4 * ib + l] as usize | (((qh >> (3 * l)) & 7) as usize) << 8);
                let q8 = &by.qs[32 * ib + 8 * l..32 * ib + 8 * l + 8];
                for j in 0..8 {
                    lsum += q8[j] as i32 * grid[j] as i32;
                }
            }
            sumi += ls * lsum;
            sumi1 += ls * delta * (by.bsums[2 * ib] as i32 + by.bsums[2 * ib + 1] as i32);
        }
        sumf += fp16_to_fp32(bx.d) * by.d * (sumi as f32 + IQ1S_DELTA * sumi1 as f32);
    }
    sumf
}

// ---------------------------------------------------------------------------------------------
// IQ1_M

/// The four little-endian u16 scale words of an IQ1_M block.
#[inline(always)]
pub(crate) fn iq1m_sc(b: &BlockIQ1M) -> [u16; 4] {
    std::array::from_fn(|i| u16::from_le_bytes([b.scales[2 * i], b.scales[2 * i + 1]]))
}

/// The f16 bits of an IQ1_M super-block scale.
#[inline(always)]
pub(crate) fn iq1m_scale(sc: &[u16; 4]) -> u16 {
    (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000)
}

/// The shifted quant table of group `k` (0 or 1) of a block of 16 with shift pattern `shift`
/// (0: +,+  1: +,-  2: -,+  3: -,-).
fn iq1m_xx(shift: i8, k: usize) -> &'static [f32; 3] {
    let plus = if k == 0 { shift < 2 } else { shift % 2 == 0 };
    if plus { &X_P } else { &X_M }
}

fn iq1_m_block(xbl: &[f32], qw_bl: Option<&[f32]>) -> Result<BlockIQ1M> {
    const DT: DType = DType::IQ1_M;
    const BS: usize = 16;
    const MASKS: [u8; 4] = [0x00, 0x80, 0x08, 0x88];
    let s = search::iq1s();
    let mut y = BlockIQ1M::zeroed();
    let mut scales = [0f32; QK_K / BS];
    let mut shifts = [0i8; QK_K / BS];
    let mut weight = [0f32; BS];
    let mut l = [0i8; BS];
    let sigma2 = 2.0 * sum_sq(xbl) / QK_K as f32;
    let weights = |ib: usize, xb: &[f32], weight: &mut [f32; BS]| match qw_bl {
        Some(qw) => imatrix_weights(&qw[BS * ib..BS * ib + BS], xb, sigma2, weight),
        None => {
            for i in 0..BS {
                weight[i] = xb[i] * xb[i];
            }
        }
    };
    let mut max_scale = 0.0f32;
    for ib in 0..QK_K / BS {
        let xb = &xbl[BS * ib..BS * ib + BS];
        weights(ib, xb, &mut weight);
        let mut max = xb[0].abs();
        for &v in &xb[1..] {
            max = fmax(max, v.abs());
        }
        if max < 1e-7 {
            scales[ib] = 0.0;
            shifts[ib] = 0;
            continue;
        }
        let idx = sorted_indices::<BS>(xb);
        let mut best_score = -f32::MAX;
        let mut scale = max;
        let mut best: Option<(usize, usize, i8)> = None;
        for i1 in 0..=BS {
            for i2 in i1..=BS {
                let mut sumqx = [0f32; 4];
                let mut sumq2 = [0f32; 4];
                for (j, &i) in idx.iter().enumerate() {
                    let g = if j < i1 {
                        0
                    } else if j < i2 {
                        1
                    } else {
                        2
                    };
                    let w = weight[i];
                    for k in 0..4 {
                        let v =
                            if i < BS / 2 { iq1m_xx(k as i8, 0) } else { iq1m_xx(k as i8, 1) }[g];
                        sumqx[k] += w * v * xb[i];
                        sumq2[k] += w * v * v;
                    }
                }
                for k in 0..4 {
                    if sumq2[k] > 0.0 && sumqx[k] * sumqx[k] > best_score * sumq2[k] {
                        scale = sumqx[k] / sumq2[k];
                        best_score = scale * sumqx[k];
                        best = Some((i1, i2, k as i8));
                    }
                }
            }
        }
        let Some((besti1, besti2, mut best_k)) = best else {
            scales[ib] = 0.0;
            shifts[ib] = 0;
            continue;
        };
        split_levels(&idx, besti1, besti2, &mut l);
        if scale < 0.0 {
            for v in &mut l {
                *v = 2 - *v;
            }
            scale = -scale;
            best_k = 3 - best_k;
        }
        let (index, all_on_grid) =
            snap_groups::<2>(DT, s, xb, &weight, scale, &mut l, |k| iq1m_xx(best_k, k))?;
        if !all_on_grid {
            let (sumqx, sumq2) = refit(s, &index, xb, &weight, |k| iq1m_xx(best_k, k));
            if sumqx > 0.0 && sumq2 > 0.0 {
                scale = sumqx / sumq2;
            }
        }
        y.qs[2 * ib] = index[0] as u8;
        y.qs[2 * ib + 1] = index[1] as u8;
        y.qh[ib] = ((index[0] >> 8) | ((index[1] >> 8) << 4)) as u8;
        check_scale(DT, scale)?;
        scales[ib] = scale;
        shifts[ib] = best_k;
        max_scale = fmax(max_scale, scale);
    }
    if max_scale == 0.0 {
        return Ok(y);
    }
    let mut sc = [0u16; 4];
    let mut d = max_scale / 15.0;
    let id = 1.0 / d;
    let (mut sumqx_f, mut sumq2_f) = (0.0f32, 0.0f32);
    for ib in 0..QK_K / BS {
        let l = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 7);
        sc[ib / 4] |= (l << (3 * (ib % 4))) as u16;
        y.qh[ib] |= MASKS[(shifts[ib] & 3) as usize];
        let xb = &xbl[BS * ib..BS * ib + BS];
        weights(ib, xb, &mut weight);
        for k in 0..2 {
            let xx = iq1m_xx(shifts[ib], k);
            let g = y.qs[2 * ib + k] as usize + (((y.qh[ib] as usize) << (8 - 4 * k)) & 0x700);
            let pg = &s.grid[g];
            for j in 0..8 {
                let w = weight[8 * k + j];
                let q = xx[((pg[j] - 1) / 2) as usize] * (2 * l + 1) as f32;
                sumqx_f += w * q * xb[8 * k + j];
                sumq2_f += w * q * q;
            }
        }
    }
    if sumq2_f > 0.0 {
        d = sumqx_f / sumq2_f;
    }
    let s16 = fp32_to_fp16(d * 1.1125);
    sc[0] |= (s16 & 0x000f) << 12;
    sc[1] |= (s16 & 0x00f0) << 8;
    sc[2] |= (s16 & 0x0f00) << 4;
    sc[3] |= s16 & 0xf000;
    for (i, w) in sc.iter().enumerate() {
        y.scales[2 * i..2 * i + 2].copy_from_slice(&w.to_le_bytes());
    }
    Ok(y)
}

/// ggml's `quantize_iq1_m` (ggml quantizes it without an importance matrix at this commit).
pub(crate) fn quantize_iq1_m(
    src: &[f32],
    dst: &mut [u8],
    n_per_row: usize,
    imatrix: Option<&[f32]>,
) -> Result<()> {
    quantize_rows::<BlockIQ1M>(src, dst, n_per_row, imatrix, QK_K, iq1_m_block)
}

/// ggml's `dequantize_row_iq1_m`.
pub(crate) fn dequantize_row_iq1_m(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<BlockIQ1M>(src).zip(dst.chunks_exact_mut(QK_K)) {
        let sc = iq1m_sc(&b);
        let d = fp16_to_fp32(iq1m_scale(&sc));
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let s = sc[ib / 2] >> (6 * (ib % 2));
            let dl1 = d * (2 * (s & 7) + 1) as f32;
            let dl2 = d * (2 * ((s >> 3) & 7) + 1) as f32;
            let qs = &b.qs[4 * ib..4 * ib + 4];
            let qh = &b.qh[2 * ib..2 * ib + 2];
            let idx = [
                qs[0] as usize | ((qh[0] as usize) << 8) & 0x700,
                qs[1] as usize | ((qh[0] as usize) << 4) & 0x700,
                qs[2] as usize | ((qh[1] as usize) << 8) & 0x700,
                qs[3] as usize | ((qh[1] as usize) << 4) & 0x700,
            ];
            let delta = [
                if qh[0] & 0x08 != 0 { -IQ1M_DELTA } else { IQ1M_DELTA },
                if qh[0] & 0x80 != 0 { -IQ1M_DELTA } else { IQ1M_DELTA },
                if qh[1] & 0x08 != 0 { -IQ1M_DELTA } else { IQ1M_DELTA },
                if qh[1] & 0x80 != 0 { -IQ1M_DELTA } else { IQ1M_DELTA },
            ];
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let grid = grid_i8(idx[l]);
                let dl = if l < 2 { dl1 } else { dl2 };
                for j in 0..8 {
                    y[j] = dl * (grid[j] as f32 + delta[l]);
                }
            }
        }
    }
}

/// ggml's `ggml_vec_dot_iq1_m_q8_K_generic`.
pub(crate) fn vec_dot_iq1_m_q8_K(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in blocks::<BlockIQ1M>(x).zip(blocks::<BlockQ8K>(y)).take(n / QK_K) {
        let sc = iq1m_sc(&bx);
        let scale = iq1m_scale(&sc);
        let (mut sumi1, mut sumi2) = (0i32, 0i32);
        for ib in 0..QK_K / 32 {
            let qs = &bx.qs[4 * ib..4 * ib + 4];
            let qh = &bx.qh[2 * ib..2 * ib + 2];
            let delta = [
                if qh[0] & 0x08 != 0 { -1 } else { 1 },
                if qh[0] & 0x80 != 0 { -1 } else { 1 },
                if qh[1] & 0x08 != 0 { -1 } else { 1 },
                if qh[1] & 0x80 != 0 { -1 } else { 1 },
            ];
            let (mut sum1, mut sum2) = ([0i32; 2], [0i32; 2]);
            for l in 0..4 {
                let g = qs[l] as usize | (((qh[l / 2] as usize) << (8 - 4 * (l % 2))) & 0x700);
                let grid = grid_i8(g);
                let q8 = &by.qs[32 * ib + 8 * l..32 * ib + 8 * l + 8];
                let (mut lsum1, mut lsum2) = (0i32, 0i32);
                for j in 0..8 {
                    lsum1 += q8[j] as i32 * grid[j] as i32;
                    lsum2 += q8[j] as i32;
                }
                sum1[l / 2] += lsum1;
                sum2[l / 2] += lsum2 * delta[l];
            }
            let ls1 = 2 * ((sc[ib / 2] >> (6 * (ib % 2))) & 0x7) as i32 + 1;
            let ls2 = 2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3)) & 0x7) as i32 + 1;
            sumi1 += sum1[0] * ls1 + sum1[1] * ls2;
            sumi2 += sum2[0] * ls1 + sum2[1] * ls2;
        }
        sumf += fp16_to_fp32(scale) * by.d * (sumi1 as f32 + IQ1M_DELTA * sumi2 as f32);
    }
    sumf
}
