//! IQ3_XXS (3.0625 bpw) and IQ3_S (3.4375 bpw): groups of 4 magnitudes taken from the D4-lattice
//! grids `iq3xxs_grid` / `iq3s_grid`, with sign bits.

use super::grids::{IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS};
use super::search::{self, Lookup, Search};
use super::{
    BlockQ8K, aborts, all_signs, blocks, check_scale, even_signs, fit_odd, fmax, imatrix_weights,
    pack_levels, quantize_rows, scale_nibbles, sign_f, sign_i, sum_sq,
};
use crate::dtype::{DType, QK_K};
use crate::error::Result;
use crate::quant::util::{fp16_to_fp32, fp32_to_fp16, nearest_int};
use bytemuck::{Pod, Zeroable};

/// ggml's `block_iq3_xxs`: 64 grid-index bytes, then 8 little-endian u32 of 4×7 sign bits and a
/// 4-bit scale.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub(crate) struct BlockIQ3XXS {
    pub d: u16,
    pub qs: [u8; 3 * QK_K / 8],
}
const _: () = assert!(size_of::<BlockIQ3XXS>() == 98);

/// ggml's `block_iq3_s`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub(crate) struct BlockIQ3S {
    pub d: u16,
    pub qs: [u8; QK_K / 4],
    pub qh: [u8; QK_K / 32],
    pub signs: [u8; QK_K / 8],
    pub scales: [u8; QK_K / 64],
}
const _: () = assert!(size_of::<BlockIQ3S>() == 110);

#[inline(always)]
fn level(id: f32, x: f32) -> i8 {
    nearest_int(0.5 * (id * x - 1.0)).clamp(0, 7) as i8
}

/// Moves an off-grid group of 4 levels to its best neighbour; returns whether it was on the grid.
fn snap4(
    dtype: DType,
    s: &Search<4>,
    xval: &[f32],
    waux: &[f32],
    scale: f32,
    l: &mut [i8],
) -> Result<(bool, usize)> {
    match s.lookup(pack_levels(l, 3)) {
        Some(Lookup::OnGrid(g)) => Ok((true, g)),
        Some(Lookup::Near(nb)) => s
            .best_neighbour(nb, xval, waux, scale, l)
            .map(|g| (false, g))
            .ok_or_else(|| aborts(dtype, "no grid neighbour")),
        None => Err(aborts(dtype, "point outside the grid map")),
    }
}

/// What the shared IQ3 search (ggml's `quantize_row_iq3_xxs_impl` and `quantize_row_iq3_s_impl`)
/// finds for one block of 32: grid indices of its 8 groups, the sign bytes and the scale.
struct Iq3Block {
    index: [usize; 8],
    signs: [u8; 4],
    scale: f32,
}

/// The scale search for one block of 32 (`None`: an all-zero block, skipped by ggml).
fn iq3_search(
    dtype: DType,
    s: &Search<4>,
    xb: &[f32],
    weight: &[f32],
    xxs: bool,
) -> Result<Option<Iq3Block>> {
    const KMAXQ: i32 = 8;
    let mut waux = [0f32; 32];
    for i in 0..32 {
        waux[i] = weight[i].sqrt();
    }
    let mut xval = [0f32; 32];
    let mut block_signs = [0u8; 4];
    if xxs {
        even_signs(xb, weight, &mut xval, &mut block_signs);
    } else {
        all_signs(xb, &mut xval, &mut block_signs);
    }
    let mut max = xval[0];
    for &v in &xval[1..] {
        max = fmax(max, v);
    }
    let mut l = [0i8; 32];
    let mut laux = [0i8; 32];
    let skip = if xxs { max < 1e-8 } else { max == 0.0 };
    if skip {
        return Ok(None);
    }
    let mut best = 0.0f32;
    let mut scale = max / (2 * KMAXQ - 1) as f32;
    // IQ3_XXS starts from "all on grid", IQ3_S from "none on grid" (so it always re-snaps).
    let mut is_on_grid = [xxs; 8];
    let mut is_on_grid_aux = [true; 8];
    let nis = if xxs { 15 } else { 9 };
    for is in -nis..=nis {
        let id = ((2 * KMAXQ - 1) as f32 + is as f32 * 0.2) / max;
        let this_scale = 1.0 / id;
        for k in 0..8 {
            let r = 4 * k..4 * k + 4;
            for i in r.clone() {
                laux[i] = level(id, xval[i]);
            }
            let (on, _) =
                snap4(dtype, s, &xval[r.clone()], &waux[r.clone()], this_scale, &mut laux[r])?;
            is_on_grid_aux[k] = on;
        }
        let (sumqx, sumq2) = fit_odd(weight, &xval, &laux);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            l = laux;
            is_on_grid = is_on_grid_aux;
        }
    }
    if is_on_grid.contains(&false) && scale > 0.0 {
        let id = 1.0 / scale;
        for k in 0..8 {
            // ggml's IQ3_S re-snaps every group (its `continue` is commented out).
            if xxs && is_on_grid[k] {
                continue;
            }
            let r = 4 * k..4 * k + 4;
            let mut lk = [0i8; 4];
            for i in 0..4 {
                lk[i] = level(id, xval[4 * k + i]);
            }
            let (_, g) = snap4(dtype, s, &xval[r.clone()], &waux[r.clone()], scale, &mut lk)?;
            s.levels(g, &mut l[r]);
        }
        let (sumqx, sumq2) = fit_odd(weight, &xval, &l);
        if sumq2 > 0.0 {
            scale = sumqx / sumq2;
        }
    }
    if scale < 0.0 {
        scale = -scale;
        for b in &mut block_signs {
            *b = if xxs { !*b & 127 } else { !*b };
        }
    }
    let mut index = [0usize; 8];
    for (k, g) in index.iter_mut().enumerate() {
        *g = match s.lookup(pack_levels(&l[4 * k..4 * k + 4], 3)) {
            Some(Lookup::OnGrid(g)) => g,
            _ => return Err(aborts(dtype, "found point not on grid")),
        };
    }
    Ok(Some(Iq3Block { index, signs: block_signs, scale }))
}

/// The blocks of 32 of one super-block, each weighted (importance matrix or `x^2`, with
/// `sigma2 = 2 * mean(x^2)`) and searched; `store(ib, block)` records each quantized block.
/// Returns the scales (0 for all-zero blocks) and their maximum.
fn iq3_blocks(
    dtype: DType,
    s: &Search<4>,
    xbl: &[f32],
    qw_bl: Option<&[f32]>,
    xxs: bool,
    mut store: impl FnMut(usize, &Iq3Block),
) -> Result<([f32; QK_K / 32], f32)> {
    let mut scales = [0f32; QK_K / 32];
    let mut weight = [0f32; 32];
    let sigma2 = 2.0 * sum_sq(xbl) / QK_K as f32;
    let mut max_scale = 0.0f32;
    for ib in 0..QK_K / 32 {
        let xb = &xbl[32 * ib..32 * ib + 32];
        match qw_bl {
            Some(qw) => imatrix_weights(&qw[32 * ib..32 * ib + 32], xb, sigma2, &mut weight),
            None => {
                for i in 0..32 {
                    weight[i] = xb[i] * xb[i];
                }
            }
        }
        let Some(b) = iq3_search(dtype, s, xb, &weight, xxs)? else {
            scales[ib] = 0.0;
            continue;
        };
        store(ib, &b);
        check_scale(dtype, b.scale)?;
        scales[ib] = b.scale;
        max_scale = fmax(max_scale, b.scale);
    }
    Ok((scales, max_scale))
}

// ---------------------------------------------------------------------------------------------
// IQ3_XXS

fn iq3_xxs_block(xbl: &[f32], qw_bl: Option<&[f32]>) -> Result<BlockIQ3XXS> {
    const DT: DType = DType::IQ3_XXS;
    let s = search::iq3xxs();
    let mut y = BlockIQ3XXS::zeroed();
    let mut q3 = [0u8; 3 * (QK_K / 8)];
    let mut scales_and_signs = [0u32; QK_K / 32];
    let (scales, max_scale) = iq3_blocks(DT, s, xbl, qw_bl, true, |ib, b| {
        for k in 0..8 {
            q3[8 * ib + k] = b.index[k] as u8;
        }
        scales_and_signs[ib] = b.signs[0] as u32
            | (b.signs[1] as u32) << 7
            | (b.signs[2] as u32) << 14
            | (b.signs[3] as u32) << 21;
    })?;
    if max_scale == 0.0 {
        return Ok(y);
    }
    let d = max_scale / 31.0;
    y.d = fp32_to_fp16(d * 1.0125);
    let id = 1.0 / d;
    for ib in 0..QK_K / 32 {
        let l = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 15);
        scales_and_signs[ib] |= (l as u32) << 28;
    }
    for (ib, w) in scales_and_signs.iter().enumerate() {
        q3[QK_K / 4 + 4 * ib..QK_K / 4 + 4 * ib + 4].copy_from_slice(&w.to_le_bytes());
    }
    y.qs = q3;
    Ok(y)
}

/// ggml's `quantize_iq3_xxs`.
pub(crate) fn quantize_iq3_xxs(
    src: &[f32],
    dst: &mut [u8],
    n_per_row: usize,
    imatrix: Option<&[f32]>,
) -> Result<()> {
    quantize_rows::<BlockIQ3XXS>(src, dst, n_per_row, imatrix, QK_K, iq3_xxs_block)
}

/// ggml's `dequantize_row_iq3_xxs`.
pub(crate) fn dequantize_row_iq3_xxs(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<BlockIQ3XXS>(src).zip(dst.chunks_exact_mut(QK_K)) {
        let d = fp16_to_fp32(b.d);
        for (ib32, y) in y.chunks_exact_mut(32).enumerate() {
            let o = QK_K / 4 + 4 * ib32;
            let aux = u32::from_le_bytes([b.qs[o], b.qs[o + 1], b.qs[o + 2], b.qs[o + 3]]);
            let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
            let qs = &b.qs[8 * ib32..8 * ib32 + 8];
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
                let grid1 = IQ3XXS_GRID[qs[2 * l] as usize].to_le_bytes();
                let grid2 = IQ3XXS_GRID[qs[2 * l + 1] as usize].to_le_bytes();
                for j in 0..4 {
                    y[j] = db * grid1[j] as f32 * sign_f(signs, j);
                    y[j + 4] = db * grid2[j] as f32 * sign_f(signs, j + 4);
                }
            }
        }
    }
}

/// ggml's `ggml_vec_dot_iq3_xxs_q8_K_generic`.
pub(crate) fn vec_dot_iq3_xxs_q8_K(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in blocks::<BlockIQ3XXS>(x).zip(blocks::<BlockQ8K>(y)).take(n / QK_K) {
        let d = fp16_to_fp32(bx.d) * by.d;
        let mut bsum = 0i32;
        for ib32 in 0..QK_K / 32 {
            let o = QK_K / 4 + 4 * ib32;
            let aux = u32::from_le_bytes([bx.qs[o], bx.qs[o + 1], bx.qs[o + 2], bx.qs[o + 3]]);
            let ls = (2 * (aux >> 28) + 1) as i32;
            let q3 = &bx.qs[8 * ib32..8 * ib32 + 8];
            let mut sumi = 0i32;
            for l in 0..4 {
                let grid1 = IQ3XXS_GRID[q3[2 * l] as usize].to_le_bytes();
                let grid2 = IQ3XXS_GRID[q3[2 * l + 1] as usize].to_le_bytes();
                let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
                let q8 = &by.qs[32 * ib32 + 8 * l..32 * ib32 + 8 * l + 8];
                for j in 0..4 {
                    sumi += grid1[j] as i32 * q8[j] as i32 * sign_i(signs, j);
                    sumi += grid2[j] as i32 * q8[j + 4] as i32 * sign_i(signs, j + 4);
                }
            }
            bsum += sumi * ls;
        }
        sumf += d * bsum as f32;
    }
    0.25 * sumf
}

// ---------------------------------------------------------------------------------------------
// IQ3_S

fn iq3_s_block(xbl: &[f32], qw_bl: Option<&[f32]>) -> Result<BlockIQ3S> {
    const DT: DType = DType::IQ3_S;
    let s = search::iq3s();
    let mut y = BlockIQ3S::zeroed();
    y.d = fp32_to_fp16(0.0);
    // ggml advances its `qs` and `signs` write pointers only past blocks it quantizes, so after an
    // all-zero block of 32 the following blocks' indices and signs land one slot early (while `qh`
    // and the scales stay in place). Reproduced for identical bytes.
    let (mut qs_at, mut signs_at) = (0usize, 0usize);
    let (scales, max_scale) = iq3_blocks(DT, s, xbl, qw_bl, false, |ib, b| {
        for k in 0..8 {
            y.qs[qs_at + k] = b.index[k] as u8;
            y.qh[ib] |= ((b.index[k] >> 8) << k) as u8;
        }
        y.signs[signs_at..signs_at + 4].copy_from_slice(&b.signs);
        qs_at += 8;
        signs_at += 4;
    })?;
    if max_scale == 0.0 {
        return Ok(y);
    }
    let d = max_scale / 31.0;
    y.d = fp32_to_fp16(d * 1.033);
    scale_nibbles(&scales, 1.0 / d, &mut y.scales);
    Ok(y)
}

/// ggml's `quantize_iq3_s`.
pub(crate) fn quantize_iq3_s(
    src: &[f32],
    dst: &mut [u8],
    n_per_row: usize,
    imatrix: Option<&[f32]>,
) -> Result<()> {
    quantize_rows::<BlockIQ3S>(src, dst, n_per_row, imatrix, QK_K, iq3_s_block)
}

/// The 9-bit grid index of element pair `l` (0..4) of an IQ3_S half-block with high bits `qh`.
#[inline(always)]
pub(crate) fn iq3s_index(qs: &[u8], qh: u8, l: usize) -> (usize, usize) {
    let qh = qh as usize;
    (
        qs[2 * l] as usize | ((qh << (8 - 2 * l)) & 256),
        qs[2 * l + 1] as usize | ((qh << (7 - 2 * l)) & 256),
    )
}

/// ggml's `dequantize_row_iq3_s`.
pub(crate) fn dequantize_row_iq3_s(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<BlockIQ3S>(src).zip(dst.chunks_exact_mut(QK_K)) {
        let d = fp16_to_fp32(b.d);
        for (ib32, y) in y.chunks_exact_mut(32).enumerate() {
            let sc = b.scales[ib32 / 2];
            let db = d * (1 + 2 * if ib32 % 2 == 0 { sc & 0xf } else { sc >> 4 }) as f32;
            let qs = &b.qs[8 * ib32..8 * ib32 + 8];
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let (i1, i2) = iq3s_index(qs, b.qh[ib32], l);
                let (grid1, grid2) = (IQ3S_GRID[i1].to_le_bytes(), IQ3S_GRID[i2].to_le_bytes());
                let signs = b.signs[4 * ib32 + l];
                for j in 0..4 {
                    y[j] = db * grid1[j] as f32 * sign_f(signs, j);
                    y[j + 4] = db * grid2[j] as f32 * sign_f(signs, j + 4);
                }
            }
        }
    }
}

/// ggml's `ggml_vec_dot_iq3_s_q8_K_generic`.
pub(crate) fn vec_dot_iq3_s_q8_K(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in blocks::<BlockIQ3S>(x).zip(blocks::<BlockQ8K>(y)).take(n / QK_K) {
        let d = fp16_to_fp32(bx.d) * by.d;
        let mut bsum = 0i32;
        for ib32 in 0..QK_K / 32 {
            let sc = bx.scales[ib32 / 2];
            let ls = (2 * if ib32 % 2 == 0 { sc & 0xf } else { sc >> 4 } as u32 + 1) as i32;
            let qs = &bx.qs[8 * ib32..8 * ib32 + 8];
            let mut sumi = 0i32;
            for l in 0..4 {
                let (i1, i2) = iq3s_index(qs, bx.qh[ib32], l);
                let (grid1, grid2) = (IQ3S_GRID[i1].to_le_bytes(), IQ3S_GRID[i2].to_le_bytes());
                let signs = bx.signs[4 * ib32 + l];
                let q8 = &by.qs[32 * ib32 + 8 * l..32 * ib32 + 8 * l + 8];
                for j in 0..4 {
                    sumi += grid1[j] as i32 * q8[j] as i32 * sign_i(signs, j);
                    sumi += grid2[j] as i32 * q8[j + 4] as i32 * sign_i(signs, j + 4);
                }
            }
            bsum += sumi * ls;
        }
        sumf += d * bsum as f32;
    }
    sumf
}
