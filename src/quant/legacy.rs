//! ggml's original block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the activation format Q8_1
//! (src/ggml-common.h, src/ggml-quants.c, src/ggml-cpu/quants.c, src/ggml-cpu/arch/x86/quants.c).
//!
//! Quantizers replicate ggml's float operations one for one (no fused multiply-add, the same
//! evaluation order, x86's float-to-int conversion for out-of-range values), so every input,
//! including NaN and infinities, gives ggml's bytes. The Q8_0/Q8_1 activation converters emulate
//! ggml's AVX2 `quantize_row_q8_0` / `quantize_row_q8_1`, the code that produced ggml's matmul inputs
//! on x86, in portable Rust.

use bytemuck::{Pod, Zeroable};

use super::FormatFns;
use super::fp::fp32_to_fp16_f16c;
use super::util::{fp16_to_fp32, fp32_to_fp16, nearest_int};
use crate::dtype::DType;
use crate::error::Result;

pub(crate) const QK4_0: usize = 32;
pub(crate) const QK4_1: usize = 32;
pub(crate) const QK5_0: usize = 32;
pub(crate) const QK5_1: usize = 32;
pub(crate) const QK8_0: usize = 32;
pub(crate) const QK8_1: usize = 32;

/// `block_q4_0`: 32 weights as 4-bit offsets from -8, one f16 scale.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub(crate) struct BlockQ4_0 {
    pub d: u16,
    pub qs: [u8; QK4_0 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);

/// `block_q4_1`: 32 weights as 4-bit steps above a minimum.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub(crate) struct BlockQ4_1 {
    pub d: u16,
    pub m: u16,
    pub qs: [u8; QK4_1 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);

/// `block_q5_0`: like Q4_0 with a fifth bit per weight in `qh`, offsets from -16.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub(crate) struct BlockQ5_0 {
    pub d: u16,
    pub qh: [u8; 4],
    pub qs: [u8; QK5_0 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);

/// `block_q5_1`: like Q4_1 with a fifth bit per weight in `qh`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub(crate) struct BlockQ5_1 {
    pub d: u16,
    pub m: u16,
    pub qh: [u8; 4],
    pub qs: [u8; QK5_1 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 24);

/// `block_q8_0`: 32 signed bytes and an f16 scale; also the activation type of Q4_0, Q5_0, Q8_0,
/// MXFP4, NVFP4, Q1_0, Q2_0 and IQ4_NL.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub(crate) struct BlockQ8_0 {
    pub d: u16,
    pub qs: [i8; QK8_0],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);

/// `block_q8_1`: Q8_0 plus `s = d * sum(qs)`; the activation type of Q4_1 and Q5_1.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub(crate) struct BlockQ8_1 {
    pub d: u16,
    pub s: u16,
    pub qs: [i8; QK8_1],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_1>() == 36);

// ------------------------------------------------------------------------------------------------
// Helpers shared by the format modules of this family.

/// Runs `f` on `bytes` viewed as blocks. Borrowed in place when the bytes are aligned for `B`,
/// otherwise copied, so misaligned user buffers work. `bytes.len()` is a multiple of the block
/// size (checked by the caller).
pub(crate) fn with_blocks<B: Pod, R>(bytes: &[u8], f: impl FnOnce(&[B]) -> R) -> R {
    debug_assert_eq!(bytes.len() % std::mem::size_of::<B>(), 0);
    match bytemuck::try_cast_slice::<u8, B>(bytes) {
        Ok(blocks) => f(blocks),
        Err(_) => {
            let mut owned = vec![B::zeroed(); bytes.len() / std::mem::size_of::<B>()];
            bytemuck::cast_slice_mut::<B, u8>(&mut owned).copy_from_slice(bytes);
            f(&owned)
        }
    }
}

/// Runs `f` on `bytes` viewed as mutable blocks, through a copy when they are misaligned.
pub(crate) fn with_blocks_mut<B: Pod>(bytes: &mut [u8], f: impl FnOnce(&mut [B])) {
    debug_assert_eq!(bytes.len() % std::mem::size_of::<B>(), 0);
    match bytemuck::try_cast_slice_mut::<u8, B>(bytes) {
        Ok(blocks) => f(blocks),
        Err(_) => {
            let mut owned = vec![B::zeroed(); bytes.len() / std::mem::size_of::<B>()];
            f(&mut owned);
            bytes.copy_from_slice(bytemuck::cast_slice(&owned));
        }
    }
}

/// C's float-to-int conversion as x86 executes it (`cvttss2si`): truncation toward zero, and
/// `INT_MIN` for NaN and out-of-range values. ggml stores such conversions into `int8_t` /
/// `uint8_t`, which keeps the low byte (`as i8` / `as u8` on the result).
#[inline(always)]
pub(crate) fn cvtt_i32(f: f32) -> i32 {
    if (-2147483648.0..2147483648.0).contains(&f) { f as i32 } else { i32::MIN }
}

/// C's `MAX(a, b)` macro and SSE's `maxps` (`a > b ? a : b`): when either operand is NaN the
/// second one is returned, which decides where a NaN input survives a block maximum.
#[inline(always)]
pub(crate) fn c_max(a: f32, b: f32) -> f32 {
    if a > b { a } else { b }
}

/// Blocks of `qk` values of a row of floats as fixed-size arrays.
#[inline(always)]
fn float_blocks<const N: usize>(src: &[f32]) -> impl Iterator<Item = &[f32; N]> {
    src.chunks_exact(N).map(|c| c.try_into().expect("chunks_exact gives N elements"))
}

/// ggml's per-row importance weights: `qw[j] * sqrt(sigma2 + x[j]^2)` with `sigma2` the row's
/// mean square.
fn row_sigma2(row: &[f32]) -> f32 {
    let mut sum_x2 = 0.0f32;
    for &v in row {
        sum_x2 += v * v;
    }
    sum_x2 / row.len() as f32
}

fn block_weights(xb: &[f32; 32], qw: &[f32], sigma2: f32) -> [f32; 32] {
    let mut w = [0.0f32; 32];
    for j in 0..32 {
        w[j] = qw[j] * (sigma2 + xb[j] * xb[j]).sqrt();
    }
    w
}

/// ggml's `make_qx_quants` (src/ggml-quants.c) for the importance-weighted symmetric formats:
/// `rmse_type == 1` with explicit weights, which is how `quantize_q4_0`/`quantize_q5_0` call it.
/// Fills `l` with `q + nmax` and returns the scale.
fn make_qx_quants(nmax: i32, x: &[f32; 32], l: &mut [i8; 32], qw: &[f32; 32]) -> f32 {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < 1e-15 {
        *l = [0; 32];
        return 0.0;
    }
    let clamp = |v: i32| v.clamp(-nmax, nmax - 1);
    let mut iscale = -(nmax as f32) / max;
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..32 {
        let q = clamp(nearest_int(iscale * x[i]));
        l[i] = (q + nmax) as i8;
        let lf = q as f32;
        sumlx += qw[i] * x[i] * lf;
        suml2 += qw[i] * lf * lf;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for i in 0..32 {
            let lf = clamp(nearest_int(iscale * x[i])) as f32;
            sumlx += qw[i] * x[i] * lf;
            suml2 += qw[i] * lf * lf;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..32 {
                l[i] = (nmax + clamp(nearest_int(iscale * x[i]))) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// ggml's `make_qkx3_quants` as `quantize_q4_1`/`quantize_q5_1` call it (weights given,
/// `rmin = -0.9`, `rdelta = 0.05`, `nstep = 36`, squared error). Returns `(scale, -min)`.
fn make_qkx3_quants(nmax: i32, x: &[f32; 32], w: &[f32; 32], l: &mut [u8; 32]) -> (f32, f32) {
    const RMIN: f32 = -0.9;
    const RDELTA: f32 = 0.05;
    const NSTEP: i32 = 36;
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = w[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..32 {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max <= min {
        *l = [0; 32];
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_mad = 0.0f32;
    for i in 0..32 {
        let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = q as u8;
        let diff = scale * q as f32 + min - x[i];
        best_mad += w[i] * (diff * diff);
    }
    let mut laux = [0u8; 32];
    for is in 0..=NSTEP {
        iscale = (RMIN + RDELTA * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..32 {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = q as u8;
            let lf = q as f32;
            sum_l += w[i] * lf;
            sum_l2 += w[i] * lf * lf;
            sum_xl += w[i] * lf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut mad = 0.0f32;
            for i in 0..32 {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                mad += w[i] * (diff * diff);
            }
            if mad < best_mad {
                *l = laux;
                best_mad = mad;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Packs quants `l[j]` and `l[j + 16]` (their low four bits) into the low and high nibble of byte
/// `j`, ggml's `qs` layout for all four formats.
fn pack_nibbles(l: &[u8; 32]) -> [u8; 16] {
    std::array::from_fn(|j| (l[j] & 0x0F) | ((l[j + 16] & 0x0F) << 4))
}

/// Packs the 5th bits of 32 quants the way ggml lays out `qh` (bit j for element j).
fn pack_qh(l: &[u8; 32]) -> [u8; 4] {
    let mut qh = 0u32;
    for j in 0..16 {
        qh |= u32::from((l[j] & 0x10) >> 4) << j;
        qh |= u32::from((l[j + 16] & 0x10) >> 4) << (j + 16);
    }
    qh.to_le_bytes()
}

/// Low nibble of every byte of a word.
const NIBBLES: u64 = 0x0F0F_0F0F_0F0F_0F0F;

/// The 4-bit quants of a block in element order (low nibbles are elements 0..16), eight bytes
/// at a time: the integer GEMM unpacks every weight block with this, so it is kept to a few
/// word operations rather than a loop over bytes.
#[inline(always)]
pub(crate) fn unpack_nibbles(qs: &[u8; 16]) -> [u8; 32] {
    let [w0, w1] = bytemuck::cast::<[u8; 16], [u64; 2]>(*qs).map(u64::from_le);
    let words = [w0 & NIBBLES, w1 & NIBBLES, (w0 >> 4) & NIBBLES, (w1 >> 4) & NIBBLES];
    bytemuck::cast(words.map(u64::to_le))
}

/// Bit `i` of `b` as 0x10 in byte `i` of the result (little-endian byte order): the byte of
/// `b` copied into every byte, each byte masked to its own bit, then every non-zero byte
/// turned into 0x80 (adding 0x7F cannot carry out of a byte holding at most 0x80) and shifted
/// to 0x10.
#[inline(always)]
fn spread_bits_0x10(b: u8) -> u64 {
    let t = (b as u64 * 0x0101_0101_0101_0101) & 0x8040_2010_0804_0201;
    ((t + 0x7F7F_7F7F_7F7F_7F7F) & 0x8080_8080_8080_8080) >> 3
}

/// The 5-bit quants of a block in element order: nibbles plus the bit of `qh` (bit `j` of the
/// little-endian `qh` is bit 4 of element `j`).
#[inline(always)]
pub(crate) fn unpack_q5(qs: &[u8; 16], qh: [u8; 4]) -> [u8; 32] {
    let [w0, w1] = bytemuck::cast::<[u8; 16], [u64; 2]>(*qs).map(u64::from_le);
    let words = [
        w0 & NIBBLES | spread_bits_0x10(qh[0]),
        w1 & NIBBLES | spread_bits_0x10(qh[1]),
        (w0 >> 4) & NIBBLES | spread_bits_0x10(qh[2]),
        (w1 >> 4) & NIBBLES | spread_bits_0x10(qh[3]),
    ];
    bytemuck::cast(words.map(u64::to_le))
}

/// `sum((v[j] - offset) * q[j])`, the integer part of every dot product of this family (exact,
/// so its order does not matter).
#[inline(always)]
fn dot_quants(v: &[u8; 32], offset: i32, q: &[i8; 32]) -> i32 {
    v.iter().zip(q).map(|(&a, &b)| (a as i32 - offset) * b as i32).sum()
}

/// Writes `(v[j] - offset) * d` (symmetric formats) for every block.
fn dequantize_sym<B: Pod>(
    src: &[u8],
    dst: &mut [f32],
    offset: i32,
    f: impl Fn(&B) -> (u16, [u8; 32]),
) {
    with_blocks::<B, _>(src, |x| {
        for (b, y) in x.iter().zip(dst.chunks_exact_mut(32)) {
            let (d, v) = f(b);
            let d = fp16_to_fp32(d);
            for (o, &q) in y.iter_mut().zip(&v) {
                *o = (q as i32 - offset) as f32 * d;
            }
        }
    })
}

/// Writes `v[j] * d + m` (formats with a minimum) for every block.
fn dequantize_asym<B: Pod>(src: &[u8], dst: &mut [f32], f: impl Fn(&B) -> (u16, u16, [u8; 32])) {
    with_blocks::<B, _>(src, |x| {
        for (b, y) in x.iter().zip(dst.chunks_exact_mut(32)) {
            let (d, m, v) = f(b);
            let (d, m) = (fp16_to_fp32(d), fp16_to_fp32(m));
            for (o, &q) in y.iter_mut().zip(&v) {
                *o = q as f32 * d + m;
            }
        }
    })
}

/// `ggml_vec_dot_q{4,5}_0_q8_0`: per block `(d_x * d_y) * sum((v - offset) * q)`.
fn vec_dot_sym<B: Pod>(x: &[u8], y: &[u8], offset: i32, f: impl Fn(&B) -> (u16, [u8; 32])) -> f32 {
    with_blocks::<B, _>(x, |x| {
        with_blocks::<BlockQ8_0, _>(y, |y| {
            let mut sumf = 0.0f32;
            for (bx, by) in x.iter().zip(y) {
                let (d, v) = f(bx);
                let sumi = dot_quants(&v, offset, &by.qs);
                sumf += (fp16_to_fp32(d) * fp16_to_fp32(by.d)) * sumi as f32;
            }
            sumf
        })
    })
}

/// `ggml_vec_dot_q{4,5}_1_q8_1`: per block `(d_x * d_y) * sum(v * q) + m_x * s_y`.
fn vec_dot_asym<B: Pod>(x: &[u8], y: &[u8], f: impl Fn(&B) -> (u16, u16, [u8; 32])) -> f32 {
    with_blocks::<B, _>(x, |x| {
        with_blocks::<BlockQ8_1, _>(y, |y| {
            let mut sumf = 0.0f32;
            for (bx, by) in x.iter().zip(y) {
                let (d, m, v) = f(bx);
                let sumi = dot_quants(&v, 0, &by.qs);
                sumf += (fp16_to_fp32(d) * fp16_to_fp32(by.d)) * sumi as f32
                    + fp16_to_fp32(m) * fp16_to_fp32(by.s);
            }
            sumf
        })
    })
}

/// The value of largest magnitude in a block (the first one on ties), which sets the scale of
/// `quantize_row_q{4,5}_0_ref`.
fn signed_abs_max(x: &[f32; 32]) -> f32 {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// A block's `(min, max)` as `quantize_row_q{4,5}_1_ref` find them.
fn min_max(x: &[f32; 32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// `quantize_q4_0` .. `quantize_q5_1`: the reference quantizer without an importance matrix;
/// with one, each row gets weights `qw[j] * sqrt(sigma2 + x[j]^2)` and `block` quantizes each
/// block of 32 with its weights.
fn quantize_legacy<B: Pod>(
    dtype: DType,
    src: &[f32],
    dst: &mut [u8],
    n_per_row: usize,
    imatrix: Option<&[f32]>,
    reference: fn(&[f32], &mut [B]),
    block: impl Fn(&[f32; 32], &[f32; 32], &mut B),
) -> Result<()> {
    let Some(qw) = imatrix else {
        with_blocks_mut(dst, |y| reference(src, y));
        return Ok(());
    };
    let row_bytes = dtype.row_bytes(n_per_row);
    for (row, out) in src.chunks_exact(n_per_row).zip(dst.chunks_exact_mut(row_bytes)) {
        let sigma2 = row_sigma2(row);
        with_blocks_mut::<B>(out, |y| {
            for (ib, (xb, yb)) in float_blocks::<32>(row).zip(y).enumerate() {
                let w = block_weights(xb, &qw[ib * 32..], sigma2);
                block(xb, &w, yb);
            }
        });
    }
    Ok(())
}

/// The importance-weighted block quantizer of Q4_0 and Q5_0: scale and quants `q + nmax`.
fn imatrix_block_sym(nmax: i32, xb: &[f32; 32], w: &[f32; 32]) -> (u16, [u8; 32]) {
    let mut l = [0i8; 32];
    let d = make_qx_quants(nmax, xb, &mut l, w);
    (fp32_to_fp16(d), l.map(|v| v as u8))
}

/// The importance-weighted block quantizer of Q4_1 and Q5_1: scale, minimum and quants.
fn imatrix_block_asym(nmax: i32, xb: &[f32; 32], w: &[f32; 32]) -> (u16, u16, [u8; 32]) {
    let mut l = [0u8; 32];
    let (d, m) = make_qkx3_quants(nmax, xb, w, &mut l);
    (fp32_to_fp16(d), fp32_to_fp16(-m), l)
}

// ------------------------------------------------------------------------------------------------
// Q4_0

/// `quantize_row_q4_0_ref`.
pub(crate) fn quantize_row_q4_0_ref(src: &[f32], dst: &mut [BlockQ4_0]) {
    for (x, y) in float_blocks::<QK4_0>(src).zip(dst) {
        let d = signed_abs_max(x) / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        y.d = fp32_to_fp16(d);
        let q = |v: f32| (cvtt_i32(v * id + 8.5) as i8).min(15) as u8;
        for j in 0..16 {
            y.qs[j] = q(x[j]) | q(x[j + 16]) << 4;
        }
    }
}

fn quantize_q4_0(
    src: &[f32],
    dst: &mut [u8],
    n_per_row: usize,
    imatrix: Option<&[f32]>,
) -> Result<()> {
    let reference = quantize_row_q4_0_ref;
    quantize_legacy(
        DType::Q4_0,
        src,
        dst,
        n_per_row,
        imatrix,
        reference,
        |xb, w, y: &mut BlockQ4_0| {
            let (d, l) = imatrix_block_sym(8, xb, w);
            y.d = d;
            y.qs = pack_nibbles(&l);
        },
    )
}

fn dequantize_q4_0(src: &[u8], dst: &mut [f32]) {
    dequantize_sym(src, dst, 8, |b: &BlockQ4_0| (b.d, unpack_nibbles(&b.qs)))
}

/// `ggml_vec_dot_q4_0_q8_0`.
pub(crate) fn vec_dot_q4_0_q8_0(_n: usize, x: &[u8], y: &[u8]) -> f32 {
    vec_dot_sym(x, y, 8, |b: &BlockQ4_0| (b.d, unpack_nibbles(&b.qs)))
}

// ------------------------------------------------------------------------------------------------
// Q4_1

/// `quantize_row_q4_1_ref`.
pub(crate) fn quantize_row_q4_1_ref(src: &[f32], dst: &mut [BlockQ4_1]) {
    for (x, y) in float_blocks::<QK4_1>(src).zip(dst) {
        let (min, max) = min_max(x);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        y.d = fp32_to_fp16(d);
        y.m = fp32_to_fp16(min);
        let q = |v: f32| (cvtt_i32((v - min) * id + 0.5) as i8).min(15) as u8;
        for j in 0..16 {
            y.qs[j] = q(x[j]) | q(x[j + 16]) << 4;
        }
    }
}

fn quantize_q4_1(
    src: &[f32],
    dst: &mut [u8],
    n_per_row: usize,
    imatrix: Option<&[f32]>,
) -> Result<()> {
    let reference = quantize_row_q4_1_ref;
    quantize_legacy(
        DType::Q4_1,
        src,
        dst,
        n_per_row,
        imatrix,
        reference,
        |xb, w, y: &mut BlockQ4_1| {
            let (d, m, l) = imatrix_block_asym(15, xb, w);
            (y.d, y.m) = (d, m);
            y.qs = pack_nibbles(&l);
        },
    )
}

fn dequantize_q4_1(src: &[u8], dst: &mut [f32]) {
    dequantize_asym(src, dst, |b: &BlockQ4_1| (b.d, b.m, unpack_nibbles(&b.qs)))
}

/// `ggml_vec_dot_q4_1_q8_1`.
pub(crate) fn vec_dot_q4_1_q8_1(_n: usize, x: &[u8], y: &[u8]) -> f32 {
    vec_dot_asym(x, y, |b: &BlockQ4_1| (b.d, b.m, unpack_nibbles(&b.qs)))
}

// ------------------------------------------------------------------------------------------------
// Q5_0

/// `quantize_row_q5_0_ref`.
pub(crate) fn quantize_row_q5_0_ref(src: &[f32], dst: &mut [BlockQ5_0]) {
    for (x, y) in float_blocks::<QK5_0>(src).zip(dst) {
        let d = signed_abs_max(x) / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        y.d = fp32_to_fp16(d);
        let l = x.map(|v| (cvtt_i32(v * id + 16.5) as i8).min(31) as u8);
        y.qs = pack_nibbles(&l);
        y.qh = pack_qh(&l);
    }
}

fn quantize_q5_0(
    src: &[f32],
    dst: &mut [u8],
    n_per_row: usize,
    imatrix: Option<&[f32]>,
) -> Result<()> {
    let reference = quantize_row_q5_0_ref;
    quantize_legacy(
        DType::Q5_0,
        src,
        dst,
        n_per_row,
        imatrix,
        reference,
        |xb, w, y: &mut BlockQ5_0| {
            let (d, l) = imatrix_block_sym(16, xb, w);
            y.d = d;
            y.qs = pack_nibbles(&l);
            y.qh = pack_qh(&l);
        },
    )
}

fn dequantize_q5_0(src: &[u8], dst: &mut [f32]) {
    dequantize_sym(src, dst, 16, |b: &BlockQ5_0| (b.d, unpack_q5(&b.qs, b.qh)))
}

/// `ggml_vec_dot_q5_0_q8_0`.
pub(crate) fn vec_dot_q5_0_q8_0(_n: usize, x: &[u8], y: &[u8]) -> f32 {
    vec_dot_sym(x, y, 16, |b: &BlockQ5_0| (b.d, unpack_q5(&b.qs, b.qh)))
}

// ------------------------------------------------------------------------------------------------
// Q5_1

/// `quantize_row_q5_1_ref`.
pub(crate) fn quantize_row_q5_1_ref(src: &[f32], dst: &mut [BlockQ5_1]) {
    for (x, y) in float_blocks::<QK5_1>(src).zip(dst) {
        let (min, max) = min_max(x);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        y.d = fp32_to_fp16(d);
        y.m = fp32_to_fp16(min);
        let l = x.map(|v| cvtt_i32((v - min) * id + 0.5) as u8);
        y.qs = pack_nibbles(&l);
        y.qh = pack_qh(&l);
    }
}

fn quantize_q5_1(
    src: &[f32],
    dst: &mut [u8],
    n_per_row: usize,
    imatrix: Option<&[f32]>,
) -> Result<()> {
    let reference = quantize_row_q5_1_ref;
    quantize_legacy(
        DType::Q5_1,
        src,
        dst,
        n_per_row,
        imatrix,
        reference,
        |xb, w, y: &mut BlockQ5_1| {
            let (d, m, l) = imatrix_block_asym(31, xb, w);
            (y.d, y.m) = (d, m);
            y.qs = pack_nibbles(&l);
            y.qh = pack_qh(&l);
        },
    )
}

fn dequantize_q5_1(src: &[u8], dst: &mut [f32]) {
    dequantize_asym(src, dst, |b: &BlockQ5_1| (b.d, b.m, unpack_q5(&b.qs, b.qh)))
}

/// `ggml_vec_dot_q5_1_q8_1`.
pub(crate) fn vec_dot_q5_1_q8_1(_n: usize, x: &[u8], y: &[u8]) -> f32 {
    vec_dot_asym(x, y, |b: &BlockQ5_1| (b.d, b.m, unpack_q5(&b.qs, b.qh)))
}

// ------------------------------------------------------------------------------------------------
// Q8_0 and Q8_1

/// `quantize_row_q8_0_ref`: `roundf` (half away from zero) of `x / d`.
pub(crate) fn quantize_row_q8_0_ref(src: &[f32], dst: &mut [BlockQ8_0]) {
    for (x, y) in float_blocks::<QK8_0>(src).zip(dst) {
        let mut amax = 0.0f32;
        for &v in x {
            amax = c_max(amax, v.abs());
        }
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        y.d = fp32_to_fp16(d);
        for (q, &v) in y.qs.iter_mut().zip(x) {
            *q = cvtt_i32((v * id).round()) as i8;
        }
    }
}

/// What ggml's AVX2 `quantize_row_q8_0`/`q8_1` compute for one block: the f32 scale, and the
/// quants as 32-bit integers before the saturating packs (`cvtps_epi32` of the rounded values).
///
/// The block maximum goes through the same `maxps` tree (8 lanes, then halves), so NaN inputs pick
/// the same operand; the multiplier is `127 / max` rather than `1 / d`, and rounding is to nearest
/// even.
fn q8_avx2_block(x: &[f32; 32]) -> (f32, [i32; 32]) {
    let mut lanes = [0.0f32; 8];
    for (l, m) in lanes.iter_mut().enumerate() {
        *m = x[l].abs();
        for k in 1..4 {
            *m = c_max(*m, x[8 * k + l].abs());
        }
    }
    let m4: [f32; 4] = std::array::from_fn(|j| c_max(lanes[4 + j], lanes[j]));
    let max = c_max(c_max(m4[0], m4[2]), c_max(m4[1], m4[3]));
    let d = max / 127.0;
    let id = if max != 0.0 { 127.0 / max } else { 0.0 };
    let q = x.map(|v| {
        let r = (v * id).round_ties_even();
        // cvtps_epi32: the "integer indefinite" value for NaN and out-of-range inputs.
        if (-2147483648.0..2147483648.0).contains(&r) { r as i32 } else { i32::MIN }
    });
    (d, q)
}

/// ggml's x86 AVX2 `quantize_row_q8_0`, the CPU `from_float` of Q8_0.
pub(crate) fn quantize_row_q8_0(src: &[f32], dst: &mut [BlockQ8_0]) {
    for (x, y) in float_blocks::<QK8_0>(src).zip(dst) {
        let (d, q) = q8_avx2_block(x);
        y.d = fp32_to_fp16_f16c(d);
        y.qs = q.map(|v| v.clamp(-128, 127) as i8);
    }
}

/// ggml's x86 AVX2 `quantize_row_q8_1`, the CPU `from_float` of Q8_1.
pub(crate) fn quantize_row_q8_1(src: &[f32], dst: &mut [BlockQ8_1]) {
    for (x, y) in float_blocks::<QK8_1>(src).zip(dst) {
        let (d, q) = q8_avx2_block(x);
        y.d = fp32_to_fp16_f16c(d);
        let sum = q.iter().fold(0i32, |a, &v| a.wrapping_add(v));
        y.s = fp32_to_fp16_f16c(d * sum as f32);
        y.qs = q.map(|v| v.clamp(-128, 127) as i8);
    }
}

/// `quantize_row_q8_1_ref` (ggml's `from_float_ref` of Q8_1; the CPU uses the AVX2 converter).
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn quantize_row_q8_1_ref(src: &[f32], dst: &mut [BlockQ8_1]) {
    for (x, y) in float_blocks::<QK8_1>(src).zip(dst) {
        let mut amax = 0.0f32;
        for &v in x {
            amax = c_max(amax, v.abs());
        }
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        y.d = fp32_to_fp16(d);
        let mut sum = 0i32;
        for (q, &v) in y.qs.iter_mut().zip(x) {
            *q = cvtt_i32((v * id).round()) as i8;
            sum += *q as i32;
        }
        y.s = fp32_to_fp16(sum as f32 * d);
    }
}

fn quantize_q8_0(
    src: &[f32],
    dst: &mut [u8],
    _n_per_row: usize,
    _imatrix: Option<&[f32]>,
) -> Result<()> {
    // ggml's quantize_q8_0 ignores the importance matrix.
    with_blocks_mut(dst, |y| quantize_row_q8_0_ref(src, y));
    Ok(())
}

fn from_float_q8_0(src: &[f32], dst: &mut [u8]) {
    with_blocks_mut(dst, |y| quantize_row_q8_0(src, y));
}

fn from_float_q8_1(src: &[f32], dst: &mut [u8]) {
    with_blocks_mut(dst, |y| quantize_row_q8_1(src, y));
}

fn dequantize_q8_0(src: &[u8], dst: &mut [f32]) {
    with_blocks::<BlockQ8_0, _>(src, |x| {
        for (b, y) in x.iter().zip(dst.chunks_exact_mut(QK8_0)) {
            let d = fp16_to_fp32(b.d);
            for (o, &q) in y.iter_mut().zip(&b.qs) {
                *o = q as f32 * d;
            }
        }
    })
}

/// `ggml_vec_dot_q8_0_q8_0`.
pub(crate) fn vec_dot_q8_0_q8_0(_n: usize, x: &[u8], y: &[u8]) -> f32 {
    with_blocks::<BlockQ8_0, _>(x, |x| {
        with_blocks::<BlockQ8_0, _>(y, |y| {
            let mut sumf = 0.0f32;
            for (bx, by) in x.iter().zip(y) {
                let sumi: i32 = bx.qs.iter().zip(&by.qs).map(|(&a, &b)| a as i32 * b as i32).sum();
                sumf += sumi as f32 * (fp16_to_fp32(bx.d) * fp16_to_fp32(by.d));
            }
            sumf
        })
    })
}

// ------------------------------------------------------------------------------------------------
// Format table entries.

pub(crate) const Q4_0_FNS: FormatFns = FormatFns {
    quantize: Some(quantize_q4_0),
    requires_imatrix: false,
    dequantize: Some(dequantize_q4_0),
    from_float: None,
    vec_dot: Some(vec_dot_q4_0_q8_0),
};

pub(crate) const Q4_1_FNS: FormatFns = FormatFns {
    quantize: Some(quantize_q4_1),
    requires_imatrix: false,
    dequantize: Some(dequantize_q4_1),
    from_float: None,
    vec_dot: Some(vec_dot_q4_1_q8_1),
};

pub(crate) const Q5_0_FNS: FormatFns = FormatFns {
    quantize: Some(quantize_q5_0),
    requires_imatrix: false,
    dequantize: Some(dequantize_q5_0),
    from_float: None,
    vec_dot: Some(vec_dot_q5_0_q8_0),
};

pub(crate) const Q5_1_FNS: FormatFns = FormatFns {
    quantize: Some(quantize_q5_1),
    requires_imatrix: false,
    dequantize: Some(dequantize_q5_1),
    from_float: None,
    vec_dot: Some(vec_dot_q5_1_q8_1),
};

pub(crate) const Q8_0_FNS: FormatFns = FormatFns {
    quantize: Some(quantize_q8_0),
    requires_imatrix: false,
    dequantize: Some(dequantize_q8_0),
    from_float: Some(from_float_q8_0),
    vec_dot: Some(vec_dot_q8_0_q8_0),
};

/// Q8_1 is an activation format only: ggml has no `to_float` and `ggml_quantize_chunk` refuses it.
/// The values `d * q` of Q8_1 blocks (ggml has no public Q8_1 dequantizer; the GEMM path of
/// `mul_mat` uses this to expand converted activations). `src` holds whole blocks.
pub(crate) fn q8_1_values(src: &[u8], dst: &mut [f32]) {
    let bs = std::mem::size_of::<BlockQ8_1>();
    for (raw, out) in src.chunks_exact(bs).zip(dst.chunks_exact_mut(QK8_1)) {
        let b: BlockQ8_1 = bytemuck::pod_read_unaligned(raw);
        let d = fp16_to_fp32(b.d);
        for (o, &q) in out.iter_mut().zip(&b.qs) {
            *o = d * q as f32;
        }
    }
}

pub(crate) const Q8_1_FNS: FormatFns = FormatFns {
    quantize: None,
    requires_imatrix: false,
    dequantize: None,
    from_float: Some(from_float_q8_1),
    vec_dot: None,
};

#[cfg(test)]
mod tests {
    /// The word forms give the byte-by-byte definition for every nibble and high-bit pattern.
    #[test]
    fn word_unpackers_match_the_definition() {
        let mut st = 0x9E37_79B9u32;
        for case in 0..2000u32 {
            let mut qs = [0u8; 16];
            for q in &mut qs {
                st ^= st << 13;
                st ^= st >> 17;
                st ^= st << 5;
                *q = st as u8;
            }
            let qh = if case < 256 { [case as u8; 4] } else { st.to_le_bytes() };
            let n: [u8; 32] =
                std::array::from_fn(|j| if j < 16 { qs[j] & 0x0F } else { qs[j - 16] >> 4 });
            assert_eq!(super::unpack_nibbles(&qs), n);
            let h = u32::from_le_bytes(qh);
            let q5: [u8; 32] = std::array::from_fn(|j| n[j] | (((h >> j) << 4) & 0x10) as u8);
            assert_eq!(super::unpack_q5(&qs, qh), q5, "qh {qh:?}");
        }
    }

    use super::*;

    fn blocks<B: Pod>(n: usize) -> Vec<B> {
        vec![B::zeroed(); n]
    }

    #[test]
    fn q8_1_cpu_converter_matches_reference_on_plain_data() {
        // Away from rounding ties the AVX2 converter and the reference agree on the quants; the sum
        // field is d * sum(qs) in both.
        let x: Vec<f32> = (0..256).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.0173).collect();
        let mut a = blocks::<BlockQ8_1>(8);
        let mut b = blocks::<BlockQ8_1>(8);
        quantize_row_q8_1(&x, &mut a);
        quantize_row_q8_1_ref(&x, &mut b);
        let mut same = 0;
        for (p, q) in a.iter().zip(&b) {
            assert_eq!(p.d, q.d);
            if p.qs == q.qs {
                assert_eq!(p.s, q.s);
                same += 1;
            }
        }
        assert!(same >= 6, "{same} of 8 blocks agree");
    }

    #[test]
    fn cvtt_matches_x86_for_invalid_inputs() {
        assert_eq!(cvtt_i32(f32::NAN), i32::MIN);
        assert_eq!(cvtt_i32(f32::INFINITY), i32::MIN);
        assert_eq!(cvtt_i32(-3e9), i32::MIN);
        assert_eq!(cvtt_i32(-2147483648.0), i32::MIN);
        assert_eq!(cvtt_i32(2147483520.0), 2147483520);
        assert_eq!(cvtt_i32(-7.9), -7);
        assert_eq!(cvtt_i32(200.0) as i8, -56);
    }

    #[test]
    fn make_qx_quants_all_zero_block() {
        let mut l = [5i8; 32];
        assert_eq!(make_qx_quants(8, &[0.0; 32], &mut l, &[1.0; 32]), 0.0);
        assert_eq!(l, [0; 32]);
    }
}

/// The scalar dot products of every format in this family against ggml's portable
/// `ggml_vec_dot_*_generic` kernels on the edge rows of tests/data/legacy (see the README there).
#[cfg(test)]
mod generic_dot_tests {
    use crate::dtype::DType;

    fn read(name: &str) -> Vec<u8> {
        let p =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/legacy").join(name);
        std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    #[test]
    fn scalar_vec_dot_matches_ggml_generic_bit_for_bit() {
        const N: usize = 256;
        const ROWS: usize = 12;
        let q8_0 = read("edge.cpu.q8_0.bin");
        let q8_1 = read("edge.cpu.q8_1.bin");
        let q8_k = read("edge.q8_K.bin");
        for name in [
            "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "mxfp4", "nvfp4", "q1_0", "q2_0", "tq1_0",
            "tq2_0",
        ] {
            let dtype = DType::from_name(name).unwrap();
            let w = read(&format!("edge.{name}.bin"));
            let want: Vec<f32> = read(&format!("edge.dot.{name}.f32"))
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            let act = match dtype.vec_dot_type() {
                DType::Q8_0 => &q8_0,
                DType::Q8_1 => &q8_1,
                _ => &q8_k,
            };
            let vd = crate::quant::format(dtype).vec_dot.unwrap();
            let xr = dtype.row_size(N).unwrap();
            let yr = dtype.vec_dot_type().row_size(N).unwrap();
            for r in 0..ROWS {
                let got = vd(N, &w[r * xr..(r + 1) * xr], &act[r * yr..(r + 1) * yr]);
                assert!(
                    got.to_bits() == want[r].to_bits() || (got.is_nan() && want[r].is_nan()),
                    "{name} row {r}: {got} vs ggml {}",
                    want[r]
                );
            }
        }
    }
}
