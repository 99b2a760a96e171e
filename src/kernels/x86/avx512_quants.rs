//! AVX-512 forms of quantized dot products (`KernelTable::vec_dot`) with VNNI, each giving the
//! AVX2 tier's bits: the same integer lanes and the same float steps, with two blocks in one
//! 512-bit register where the AVX2 kernel holds them in two 256-bit ones.

use std::arch::x86_64::*;
use std::mem::{offset_of, size_of};

use super::avx2_quants::{
    E8M0_TO_FP32_HALF, STREAM_PF, hsum_float_8, kvalues_fp4_plus_12, mxfp4_last_block,
    prefetch_stream, rd_u16, whole_blocks,
};
use super::avx512_kquants::iq4_sign_trick;
use crate::dtype::DType;
use crate::kernels::KernelTable;
use crate::quant::fp4::BlockMxfp4;
use crate::quant::iq::iq4::BlockIQ4NL;
use crate::quant::legacy::BlockQ8_0;

const XB: usize = size_of::<BlockMxfp4>();
const YB: usize = size_of::<BlockQ8_0>();

/// Registers the dots (called by the AVX-512 tier's `plug` on a CPU with AVX512_VNNI).
pub(super) fn plug_vnni(t: &mut KernelTable) {
    // 4096 x 1 x 14336 MXFP4 on Zen 4, 2 threads, 4 alternating rounds, medians: the AVX2 dot
    // 2.81 ms, this one 2.11 (ggml 2.77). Reading the Q8_0 scales by F16C rather than the
    // 256 KiB table mattered: with the table this kernel read 2.47 ms.
    t.set_vec_dot(DType::MXFP4, vec_dot_mxfp4_q8_0);
    // Decode with the weights streamed from memory (`bench decode-stream mxfp4 4096 14336 2 5`,
    // 1 GiB of copies, Emerald Rapids, 4 alternating rounds): 8.6-9.5 GB/s without a prefetch,
    // 13.7-16.3 with; with the weights in L3 (`matmul mxfp4 4096 1 14336`) the same within the
    // noise (medians 2.4 and 2.35 ms).
    t.set_vec_dot_stream(DType::MXFP4, vec_dot_mxfp4_q8_0_stream);
    // Two rows at a time (see `VecDot2Fn`): one-process A/B, 4096 x 1 x 14336, 2 threads, two
    // runs: 1.13-1.14x in L3, 1.12x from memory.
    t.set_vec_dot2_stream(DType::MXFP4, vec_dot2_mxfp4_q8_0_stream);
    // IQ4_NL with two blocks per register: old and new binaries alternating, 4096 x 1 x 14336,
    // 2 threads, Emerald Rapids, against the AVX2-width VNNI two-row form it replaces (itself
    // 1.04-1.09x the AVX2 dot): 1.11-1.48x in L3 (3 rounds), 1.00-1.06x from memory (2).
    t.set_vec_dot(DType::IQ4_NL, vec_dot_iq4_nl_q8_0);
    t.set_vec_dot_stream(DType::IQ4_NL, vec_dot_iq4_nl_q8_0_stream);
    t.set_vec_dot2_stream(DType::IQ4_NL, vec_dot2_iq4_nl_q8_0_stream);
}

const NLB: usize = size_of::<BlockIQ4NL>();

/// Two f16 scales widened by F16C into lanes 0 and 1: exact, as the AVX2 kernels' table, and
/// without that table's 256 KiB of cache lines (IQ4_NL decode from memory, 1 thread, Zen 4:
/// 12.5 GB/s with the table, 13.5 with this; MXFP4's Q8_0 scales likewise).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
#[inline]
fn f16_pair(d0: u16, d1: u16) -> __m128 {
    _mm_cvtph_ps(_mm_cvtsi32_si128(d0 as i32 | (d1 as i32) << 16))
}

/// `ggml_vec_dot_iq4_nl_q8_0`, bitwise the AVX2 tier's.
fn vec_dot_iq4_nl_q8_0(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let nb = whole_blocks(n, 32, x, NLB, y, YB);
    // SAFETY: `whole_blocks` caps `nb` so that `x` holds `nb` IQ4_NL blocks and `y` `nb` Q8_0
    // blocks, all the kernel reads; `plug_vnni` installs this only on a CPU with the AVX-512
    // tier and AVX512_VNNI.
    unsafe { iq4_nl_q8_0_rows::<0, 1>(nb, [x.as_ptr()], y.as_ptr())[0] }
}

/// `vec_dot_iq4_nl_q8_0` prefetching the weights `STREAM_PF` bytes ahead (decode).
fn vec_dot_iq4_nl_q8_0_stream(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let nb = whole_blocks(n, 32, x, NLB, y, YB);
    // SAFETY: as `vec_dot_iq4_nl_q8_0`.
    unsafe { iq4_nl_q8_0_rows::<STREAM_PF, 1>(nb, [x.as_ptr()], y.as_ptr())[0] }
}

/// Two rows of `vec_dot_iq4_nl_q8_0_stream` (`KernelTable::vec_dot2_stream`).
fn vec_dot2_iq4_nl_q8_0_stream(n: usize, x: [&[u8]; 2], y: &[u8]) -> [f32; 2] {
    let nb = whole_blocks(n, 32, x[0], NLB, y, YB).min(whole_blocks(n, 32, x[1], NLB, y, YB));
    // SAFETY: `whole_blocks` caps `nb` so that both rows hold `nb` IQ4_NL blocks and `y` `nb`
    // Q8_0 blocks; `plug_vnni` installs this only on a CPU with the AVX-512 tier and VNNI.
    unsafe { iq4_nl_q8_0_rows::<STREAM_PF, 2>(nb, x.map(<[u8]>::as_ptr), y.as_ptr()) }
}

/// The AVX2 tier's IQ4_NL loop with VNNI (ggml's lanes and float order: blocks in pairs, the
/// first's sums in one 8-lane accumulator and the second's in another) over `R` weight rows
/// against one activation row, with blocks `ib` and `ib + 1` in the low and high halves of one
/// register, so that the two accumulators are the halves of one. ggml's sign trick becomes
/// the levels' magnitudes by one lookup times the activations negated under a mask where the
/// level is negative (`avx512_kquants::iq4_sign_trick`: the same bytes, a -128 activation
/// wrapping alike); each four products
/// summed by `vpdpbusd`; an odd last block as ggml's scalar tail.
///
/// # Safety
/// The CPU supports the AVX-512 tier and AVX512_VNNI; each row of `x` holds `nb` IQ4_NL blocks
/// and `y` `nb` Q8_0 blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn iq4_nl_q8_0_rows<const PF: usize, const R: usize>(
    nb: usize,
    x: [*const u8; R],
    y: *const u8,
) -> [f32; R] {
    let zero = _mm512_setzero_si512();
    let spread = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    let mut acc = [_mm512_setzero_ps(); R];
    let mut ib = 0;
    while ib + 1 < nb {
        // SAFETY: blocks `ib` and `ib + 1 < nb` of `y` are readable; every read stays inside
        // its block.
        let (dy, q8) = unsafe {
            let by = y.add(ib * YB);
            let (d, yq) = (offset_of!(BlockQ8_0, d), offset_of!(BlockQ8_0, qs));
            (
                f16_pair(rd_u16(by.add(d)), rd_u16(by.add(YB + d))),
                _mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(_mm256_loadu_si256(by.add(yq).cast())),
                    _mm256_loadu_si256(by.add(YB + yq).cast()),
                ),
            )
        };
        for r in 0..R {
            if PF > 0 {
                // Two blocks are 36 bytes: one hint per pair still reaches every line.
                prefetch_stream::<NLB>(x[r], ib, PF);
            }
            // SAFETY: blocks `ib` and `ib + 1 < nb` of row `r` are readable; every read stays
            // inside its block.
            let (dx, q4) = unsafe {
                let bx = x[r].add(ib * NLB);
                let (d, qs) = (offset_of!(BlockIQ4NL, d), offset_of!(BlockIQ4NL, qs));
                (
                    f16_pair(rd_u16(bx.add(d)), rd_u16(bx.add(NLB + d))),
                    _mm256_set_m128i(
                        _mm_loadu_si128(bx.add(NLB + qs).cast()),
                        _mm_loadu_si128(bx.add(qs).cast()),
                    ),
                )
            };
            let (magnitudes, q8s) = iq4_sign_trick(q4, q8);
            let p = _mm512_dpbusd_epi32(zero, magnitudes, q8s);
            // `dy0 * dx0` over the low eight lanes, `dy1 * dx1` over the high eight.
            let scale = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_mul_ps(dy, dx)));
            acc[r] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(p), acc[r]);
        }
        ib += 2;
    }
    std::array::from_fn(|r| {
        let (a1, a2) = (_mm512_castps512_ps256(acc[r]), _mm512_extractf32x8_ps::<1>(acc[r]));
        let sumf = hsum_float_8(_mm256_add_ps(a1, a2));
        // SAFETY: the caller's guarantees make block `ib` of each side readable when `ib < nb`
        // (rows of `nb` blocks); past `nb` the slices are empty and the tail adds nothing.
        let (xb, yb) = unsafe {
            let left = nb - ib;
            (
                std::slice::from_raw_parts(x[r].add(ib * NLB), left * NLB),
                std::slice::from_raw_parts(y.add(ib * YB), left * YB),
            )
        };
        super::avx2_iq::iq4_nl_last_block(xb, yb, sumf)
    })
}

/// Two rows of `vec_dot_mxfp4_q8_0_stream` (`KernelTable::vec_dot2_stream`).
fn vec_dot2_mxfp4_q8_0_stream(n: usize, x: [&[u8]; 2], y: &[u8]) -> [f32; 2] {
    let nb = whole_blocks(n, 32, x[0], XB, y, YB).min(whole_blocks(n, 32, x[1], XB, y, YB));
    // SAFETY: `whole_blocks` caps `nb` so that both rows hold `nb` MXFP4 blocks and `y` `nb`
    // Q8_0 blocks; `plug_vnni` installs this only on a CPU with the AVX-512 tier and VNNI.
    unsafe { mxfp4_q8_0_2::<STREAM_PF>(nb, x.map(<[u8]>::as_ptr), y.as_ptr()) }
}

/// `ggml_vec_dot_mxfp4_q8_0`, bitwise the AVX2 tier's.
fn vec_dot_mxfp4_q8_0(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let nb = whole_blocks(n, 32, x, XB, y, YB);
    // SAFETY: `whole_blocks` caps `nb` so that `x` holds `nb` MXFP4 blocks and `y` `nb` Q8_0
    // blocks, which is all the kernel reads; `plug_vnni` installs this only on a CPU with the
    // AVX-512 tier and AVX512_VNNI.
    unsafe { mxfp4_q8_0::<0>(nb, x.as_ptr(), y.as_ptr()) }
}

/// `vec_dot_mxfp4_q8_0` prefetching the weights `STREAM_PF` bytes ahead (decode).
fn vec_dot_mxfp4_q8_0_stream(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let nb = whole_blocks(n, 32, x, XB, y, YB);
    // SAFETY: as `vec_dot_mxfp4_q8_0`.
    unsafe { mxfp4_q8_0::<STREAM_PF>(nb, x.as_ptr(), y.as_ptr()) }
}

/// The AVX2 kernel's steps for two blocks at a time in one register: the 32 nibbles of blocks
/// `ib` and `ib + 1` looked up into `kvalues + 12` codes (one `vpshufb` for both), each 4-byte
/// group's sum `sum (code - 12) * q8` by two `vpdpbusd` (the same integers as the AVX2
/// kernel's `vpmaddubsw` / `vpmaddwd` lanes), converted and multiplied into one accumulator whose
/// low eight lanes are the AVX2 kernel's first accumulator and high eight its second; then its
/// reduction and odd last block.
///
/// # Safety
/// The CPU supports the AVX-512 tier and AVX512_VNNI; `x` holds `nb` MXFP4 blocks and `y` `nb`
/// Q8_0 blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn mxfp4_q8_0<const PF: usize>(nb: usize, x: *const u8, y: *const u8) -> f32 {
    // SAFETY: the caller's guarantees are the helper's.
    unsafe { mxfp4_q8_0_rows::<PF, 1>(nb, [x], y)[0] }
}

/// [`mxfp4_q8_0`] for two weight rows against one activation row (`KernelTable::vec_dot2_stream`),
/// each result bitwise that function's.
///
/// # Safety
/// As [`mxfp4_q8_0`], for both rows.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn mxfp4_q8_0_2<const PF: usize>(nb: usize, x: [*const u8; 2], y: *const u8) -> [f32; 2] {
    // SAFETY: the caller's guarantees are the helper's.
    unsafe { mxfp4_q8_0_rows::<PF, 2>(nb, x, y) }
}

/// The loop of [`mxfp4_q8_0`] over `R` weight rows against one activation row: each row's
/// operations and their order are the one-row loop's; the rows share the activation's loads.
///
/// # Safety
/// As [`mxfp4_q8_0`], for every row of `x`.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn mxfp4_q8_0_rows<const PF: usize, const R: usize>(
    nb: usize,
    x: [*const u8; R],
    y: *const u8,
) -> [f32; R] {
    let values = _mm512_broadcast_i32x4(kvalues_fp4_plus_12());
    let m4b = _mm256_set1_epi8(0x0F);
    let twelve = _mm512_set1_epi8(12);
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); R];
    let spread = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    let mut ib = 0;
    while ib + 1 < nb {
        // SAFETY: blocks `ib` and `ib + 1 < nb` of `y` are readable; every read stays inside
        // its block.
        let (d0, d1, q8) = unsafe {
            let by = y.add(ib * YB);
            let (d, yq) = (offset_of!(BlockQ8_0, d), offset_of!(BlockQ8_0, qs));
            (
                rd_u16(by.add(d)),
                rd_u16(by.add(YB + d)),
                _mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(_mm256_loadu_si256(by.add(yq).cast())),
                    _mm256_loadu_si256(by.add(YB + yq).cast()),
                ),
            )
        };
        // The two Q8_0 scales widened by F16C (exact, as the AVX2 kernel's table).
        let dd = f16_pair(d0, d1);
        let corr = _mm512_dpbusd_epi32(zero, twelve, q8);
        for r in 0..R {
            if PF > 0 {
                // Two blocks are 34 bytes: one hint per pair still reaches every line.
                prefetch_stream::<XB>(x[r], ib, PF);
            }
            // SAFETY: blocks `ib` and `ib + 1 < nb` of row `r` are readable; every read stays
            // inside its block.
            let (e0, e1, q4) = unsafe {
                let bx = x[r].add(ib * XB);
                let (e, qs) = (offset_of!(BlockMxfp4, e), offset_of!(BlockMxfp4, qs));
                (
                    *bx.add(e),
                    *bx.add(XB + e),
                    _mm256_set_m128i(
                        _mm_loadu_si128(bx.add(XB + qs).cast()),
                        _mm_loadu_si128(bx.add(qs).cast()),
                    ),
                )
            };
            // Low nibbles [block ib, block ib + 1], high nibbles the same; put in the order of
            // the levels: [ib low, ib high, ib + 1 low, ib + 1 high].
            let lo = _mm256_and_si256(q4, m4b);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q4), m4b);
            let both = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
            let idx = _mm512_shuffle_i64x2::<0b11_01_10_00>(both, both);
            let u = _mm512_shuffle_epi8(values, idx);
            let p = _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, u, q8), corr);
            // The blocks' E8M0 halves times the Q8_0 scales, each spread over its eight lanes.
            let ee = _mm_set_ps(
                0.0,
                0.0,
                E8M0_TO_FP32_HALF[e1 as usize],
                E8M0_TO_FP32_HALF[e0 as usize],
            );
            let s01 = _mm512_castps128_ps512(_mm_mul_ps(dd, ee));
            let scale = _mm512_permutexvar_ps(spread, s01);
            acc[r] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(p), acc[r]);
        }
        ib += 2;
    }
    std::array::from_fn(|r| {
        let (a1, a2) = (_mm512_castps512_ps256(acc[r]), _mm512_extractf32x8_ps::<1>(acc[r]));
        let sumf = hsum_float_8(_mm256_add_ps(a1, a2));
        // SAFETY: the caller's guarantees cover block `ib < nb` of row `r`.
        if ib < nb { unsafe { mxfp4_last_block(x[r], y, ib, sumf) } } else { sumf }
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_util::avx2_and_avx512;
    use crate::dtype::DType;

    /// The AVX-512 tier's Q5_0, Q5_1 and K-quant (Q2_K to Q6_K) dots and, with VNNI, its
    /// MXFP4, Q4_0, Q4_1, Q8_0 and IQ4_NL dots and the VNNI forms of Q2_K and Q3_K (plain and
    /// streaming; the two-row forms too) give the AVX2 tier's bits: random blocks (any weight
    /// scale, any levels including -128), even and odd block counts. The forms without VNNI
    /// that the VNNI ones replace in the table (masked Q5_1, Q2_K, Q3_K) are checked directly.
    #[test]
    fn avx512_quantized_dots_give_the_avx2_tiers_bits() {
        use crate::kernels::{VecDot2Fn, VecDotFn};
        let Some((t2, t5)) = avx2_and_avx512(false) else { return };
        let vnni = std::arch::is_x86_feature_detected!("avx512vnni");
        let mut r = crate::testdata::Xorshift64::from_state(0x1234_5678_9ABC_DEF1);
        let mut types = vec![
            DType::Q5_0,
            DType::Q5_1,
            DType::Q2_K,
            DType::Q3_K,
            DType::Q4_K,
            DType::Q5_K,
            DType::Q6_K,
            DType::IQ4_XS,
        ];
        if vnni {
            types.extend([DType::MXFP4, DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::IQ4_NL]);
        }
        type Forms = (DType, VecDotFn, VecDotFn, Option<VecDot2Fn>);
        let mut forms: Vec<Forms> = types
            .into_iter()
            .map(|d| {
                let (k2, k5) = (t2.vec_dot(d).unwrap(), t5.vec_dot(d).unwrap());
                assert_ne!(k2 as usize, k5 as usize, "{d}: no AVX-512 dot installed");
                if d != DType::Q5_0 && d != DType::MXFP4 {
                    assert!(t5.vec_dot2_stream(d).is_some(), "{d}: no two-row form");
                }
                (d, k5, t5.vec_dot_stream(d).unwrap(), t5.vec_dot2_stream(d))
            })
            .collect();
        forms.push(super::super::avx2_quants::masked_q5_1_forms());
        if vnni {
            // Replaced by the VNNI forms in the table.
            forms.extend(super::super::avx512_kquants::forms_without_vnni());
        }
        for (d, k5, s5, two) in forms {
            let (k2, s2) = (t2.vec_dot(d).unwrap(), t2.vec_dot_stream(d).unwrap());
            let vd = d.vec_dot_type();
            let yb = vd.type_size();
            for nb in [1usize, 2, 3, 8, 33, 448] {
                let n = d.block_size() * nb;
                for _ in 0..4 {
                    let mut bytes =
                        |len: usize| -> Vec<u8> { (0..len).map(|_| r.next_u64() as u8).collect() };
                    let x = bytes(d.row_size(n).unwrap());
                    let x1 = bytes(d.row_size(n).unwrap());
                    let mut y = bytes(vd.row_size(n).unwrap());
                    // Finite activation scales (and Q8_1 sums) of either sign (f16 exponent
                    // below 31), levels of any value.
                    for b in 0..nb {
                        if vd == DType::Q8_K {
                            // Q8_K's f32 scale: exponent below 255.
                            y[yb * b + 3] &= 0xBB;
                            continue;
                        }
                        y[yb * b + 1] &= 0xBB;
                        if vd == DType::Q8_1 {
                            y[yb * b + 3] &= 0xBB;
                        }
                    }
                    // The same bits; a NaN (two NaN scales met) may carry either one's
                    // payload, as the compiler orders the operands.
                    let same = |a: f32, b: f32, what: &str| {
                        assert!(
                            a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                            "{d} {what} nb={nb}: {a} vs {b}"
                        );
                    };
                    same(k2(n, &x, &y), k5(n, &x, &y), "plain");
                    same(s2(n, &x, &y), s5(n, &x, &y), "stream");
                    if let Some(two) = two {
                        let [p, q] = two(n, [&x, &x1], &y);
                        same(p, s2(n, &x, &y), "two-row");
                        same(q, s2(n, &x1, &y), "two-row");
                    }
                }
            }
        }
    }
}
