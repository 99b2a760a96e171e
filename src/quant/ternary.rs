//! The ternary formats of BitNet b1.58 / TriLM: TQ1_0 (five trits per byte in base 3, 1.69 bits
//! per weight) and TQ2_0 (2 bits per trit), 256 weights per block with one f16 scale, as ggml
//! defines them (src/ggml-common.h, src/ggml-quants.c, src/ggml-cpu/quants.c). Both are dotted
//! against Q8_K. ggml ignores the importance matrix for both.

use bytemuck::{Pod, Zeroable};

use super::FormatFns;
use super::kquants::BlockQ8K;
use super::legacy::{with_blocks, with_blocks_mut};
use super::util::{fp16_to_fp32, fp32_to_fp16};
use crate::dtype::QK_K;
use crate::error::Result;

/// `block_tq1_0`: `qs` holds 240 trits, five per byte (48 bytes), `qh` 16 more, four per byte.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub(crate) struct BlockTq1_0 {
    pub qs: [u8; (QK_K - 4 * QK_K / 64) / 5],
    pub qh: [u8; QK_K / 64],
    pub d: u16,
}
const _: () = assert!(std::mem::size_of::<BlockTq1_0>() == 54);

/// `block_tq2_0`: trit + 1 in 2 bits.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub(crate) struct BlockTq2_0 {
    pub qs: [u8; QK_K / 4],
    pub d: u16,
}
const _: () = assert!(std::mem::size_of::<BlockTq2_0>() == 66);

const POW3: [u8; 6] = [1, 3, 9, 27, 81, 243];

/// `lroundf(v) + 1` as ggml evaluates it into an `int`: glibc's `lroundf` gives `LONG_MIN` for NaN
/// and out-of-range values, and the conversion to `int` keeps the low 32 bits.
#[inline(always)]
fn trit(v: f32) -> i32 {
    let r = v.round();
    let l = if (-9.223372e18..9.223372e18).contains(&r) { r as i64 } else { i64::MIN };
    (l as i32).wrapping_add(1)
}

/// The block's maximum magnitude with C's `MAX(amax, |v|)` (a NaN only survives in last place).
fn block_amax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |amax, &v| if amax > v.abs() { amax } else { v.abs() })
}

/// Packs trits (each 0..=2, most significant first) into one byte the way ggml does: base-3
/// digits scaled by 256/243 with ceiling division, so `(q * 3^n * 3) >> 8` recovers digit `n`.
#[inline(always)]
fn pack_trits(trits: impl Iterator<Item = i32>) -> u8 {
    let mut q = 0u8;
    for t in trits {
        q = q.wrapping_mul(3).wrapping_add(t as u8);
    }
    (q as u16 * 256).div_ceil(243) as u8
}

/// Digit `n` of a packed byte, as ggml's dequantizer extracts it (0..=2).
#[inline(always)]
fn unpack_trit(q: u8, n: usize) -> i32 {
    trit_of(q, n) as i32
}

/// Trit `n` (0..=4) of a TQ1_0 byte, 0..=2: ggml's `(uint16_t)(q * pow3[n]) * 3 >> 8` with the
/// product taken modulo 256.
#[inline(always)]
pub(crate) fn trit_of(q: u8, n: usize) -> u8 {
    let q = q.wrapping_mul(POW3[n]);
    ((q as u16 * 3) >> 8) as u8
}

// ------------------------------------------------------------------------------------------------
// TQ1_0

/// `quantize_row_tq1_0_ref`.
pub(crate) fn quantize_row_tq1_0_ref(src: &[f32], dst: &mut [BlockTq1_0]) {
    for (x, y) in src.chunks_exact(QK_K).zip(dst) {
        let d = block_amax(x);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        y.d = fp32_to_fp16(d);
        // 32 bytes of five trits: elements m + 32 n.
        for m in 0..32 {
            y.qs[m] = pack_trits((0..5).map(|n| trit(x[m + n * 32] * id)));
        }
        // 16 bytes of five trits: elements 160 + m + 16 n.
        let x2 = &x[160..240];
        for m in 0..16 {
            y.qs[32 + m] = pack_trits((0..5).map(|n| trit(x2[m + n * 16] * id)));
        }
        // 4 bytes of four trits, shifted up to the most significant digit.
        let x3 = &x[240..256];
        for j in 0..4 {
            let q = pack_trits((0..4).map(|m| trit(x3[j + m * 4] * id)).chain(std::iter::once(0)));
            y.qh[j] = q;
        }
    }
}

fn quantize_tq1_0(src: &[f32], dst: &mut [u8], _n: usize, _imatrix: Option<&[f32]>) -> Result<()> {
    with_blocks_mut(dst, |y| quantize_row_tq1_0_ref(src, y));
    Ok(())
}

/// The trit (0..=2) of element `k` of a TQ1_0 block, in ggml's element order.
#[inline(always)]
pub(crate) fn tq1_trit(b: &BlockTq1_0, k: usize) -> i32 {
    match k {
        0..160 => unpack_trit(b.qs[k % 32], k / 32),
        160..240 => unpack_trit(b.qs[32 + (k - 160) % 16], (k - 160) / 16),
        _ => unpack_trit(b.qh[(k - 240) % 4], (k - 240) / 4),
    }
}

fn dequantize_tq1_0(src: &[u8], dst: &mut [f32]) {
    with_blocks::<BlockTq1_0, _>(src, |x| {
        for (b, y) in x.iter().zip(dst.chunks_exact_mut(QK_K)) {
            let d = fp16_to_fp32(b.d);
            for (k, o) in y.iter_mut().enumerate() {
                *o = (tq1_trit(b, k) - 1) as f32 * d;
            }
        }
    })
}

/// `ggml_vec_dot_tq1_0_q8_K`.
pub(crate) fn vec_dot_tq1_0_q8_k(_n: usize, x: &[u8], y: &[u8]) -> f32 {
    with_blocks::<BlockTq1_0, _>(x, |x| {
        with_blocks::<BlockQ8K, _>(y, |y| {
            let mut sumf = 0.0f32;
            for (bx, by) in x.iter().zip(y) {
                let mut sum = 0i32;
                for (k, &q) in by.qs.iter().enumerate() {
                    sum += (tq1_trit(bx, k) - 1) * q as i32;
                }
                sumf += sum as f32 * (fp16_to_fp32(bx.d) * by.d);
            }
            sumf
        })
    })
}

// ------------------------------------------------------------------------------------------------
// TQ2_0

/// `quantize_row_tq2_0_ref`.
pub(crate) fn quantize_row_tq2_0_ref(src: &[f32], dst: &mut [BlockTq2_0]) {
    for (x, y) in src.chunks_exact(QK_K).zip(dst) {
        let d = block_amax(x);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        y.d = fp32_to_fp16(d);
        for (half, xh) in x.chunks_exact(128).enumerate() {
            for m in 0..32 {
                let mut q = 0u8;
                for n in 0..4 {
                    q = q.wrapping_add(((trit(xh[m + n * 32] * id) & 3) << (2 * n)) as u8);
                }
                y.qs[half * 32 + m] = q;
            }
        }
    }
}

fn quantize_tq2_0(src: &[f32], dst: &mut [u8], _n: usize, _imatrix: Option<&[f32]>) -> Result<()> {
    with_blocks_mut(dst, |y| quantize_row_tq2_0_ref(src, y));
    Ok(())
}

/// The 2-bit code (0..=3) of element `k` of a TQ2_0 block.
#[inline(always)]
fn tq2_code(b: &BlockTq2_0, k: usize) -> i32 {
    let (j, l, m) = (k / 128, (k % 128) / 32, k % 32);
    ((b.qs[j * 32 + m] >> (2 * l)) & 3) as i32
}

fn dequantize_tq2_0(src: &[u8], dst: &mut [f32]) {
    with_blocks::<BlockTq2_0, _>(src, |x| {
        for (b, y) in x.iter().zip(dst.chunks_exact_mut(QK_K)) {
            let d = fp16_to_fp32(b.d);
            for (k, o) in y.iter_mut().enumerate() {
                *o = (tq2_code(b, k) - 1) as f32 * d;
            }
        }
    })
}

/// `ggml_vec_dot_tq2_0_q8_K`.
pub(crate) fn vec_dot_tq2_0_q8_k(_n: usize, x: &[u8], y: &[u8]) -> f32 {
    with_blocks::<BlockTq2_0, _>(x, |x| {
        with_blocks::<BlockQ8K, _>(y, |y| {
            let mut sumf = 0.0f32;
            for (bx, by) in x.iter().zip(y) {
                let mut sumi = 0i32;
                for (k, &q) in by.qs.iter().enumerate() {
                    sumi += q as i32 * (tq2_code(bx, k) - 1);
                }
                sumf += sumi as f32 * (by.d * fp16_to_fp32(bx.d));
            }
            sumf
        })
    })
}

// ------------------------------------------------------------------------------------------------
// Format table entries.

pub(crate) const TQ1_0_FNS: FormatFns = FormatFns {
    quantize: Some(quantize_tq1_0),
    requires_imatrix: false,
    dequantize: Some(dequantize_tq1_0),
    from_float: None,
    vec_dot: Some(vec_dot_tq1_0_q8_k),
};

pub(crate) const TQ2_0_FNS: FormatFns = FormatFns {
    quantize: Some(quantize_tq2_0),
    requires_imatrix: false,
    dequantize: Some(dequantize_tq2_0),
    from_float: None,
    vec_dot: Some(vec_dot_tq2_0_q8_k),
};
