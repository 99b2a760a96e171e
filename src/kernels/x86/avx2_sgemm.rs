//! AVX2 + FMA float GEMM micro-kernel: a 6 x 16 register tile (12 accumulators), six weight values
//! broadcast against two 8-lane loads of the packed activation panel per step. Same contract as
//! the portable `sgemm_6x16` in `../sgemm.rs`.

use std::arch::x86_64::*;

use crate::kernels::KernelTable;
use crate::kernels::sgemm::{SG_MR, SG_NR, check, check_pack, check_pack_es};

/// Installs this file's entries (called by `plug_avx2`). The wrappers below are private and
/// leave this file only through here, so holding `Avx2` is what makes calling them sound.
pub(crate) fn plug(t: &mut KernelTable, _: super::Avx2) {
    t.sgemm = sgemm_6x16;
    t.sgemm_pack = pack_strip;
    t.sgemm_pack_f16 = pack_strip_f16;
    t.round_f16 = round_f16;
    t.round_bf16 = round_bf16;
}

/// See `crate::kernels::sgemm`. Installed only by `plug` (an `Avx2` token: AVX2, FMA, F16C).
fn sgemm_6x16(kc: usize, a: &[f32], bp: &[f32], out: &mut [f32; SG_MR * SG_NR], acc: bool) {
    check(kc, a, bp);
    // SAFETY: `check` proved the strip holds `kc * 6` values and the panel `kc * 16`; `out`
    // holds 6 x 16. Installed only by `plug`, which takes an `Avx2` token.
    unsafe { tile(kc, a.as_ptr(), bp.as_ptr(), out.as_mut_ptr(), acc) }
}

/// # Safety
/// AVX2 and FMA are available; `a` holds `kc * 6` f32, `bp` `kc * 16` and `out` `6 * 16`.
#[target_feature(enable = "avx2,fma")]
unsafe fn tile(kc: usize, a: *const f32, bp: *const f32, out: *mut f32, acc: bool) {
    let mut c0 = [_mm256_setzero_ps(); SG_MR];
    let mut c1 = [_mm256_setzero_ps(); SG_MR];
    // Two k steps per iteration: fewer loop instructions per FMA (the 6x16 tile is close to
    // the front end's width on Zen 2).
    let step = |k: usize, c0: &mut [__m256; SG_MR], c1: &mut [__m256; SG_MR]| {
        // SAFETY: k < kc: group k of the panel and of the strip are in bounds (contract).
        unsafe {
            let b0 = _mm256_loadu_ps(bp.add(k * SG_NR));
            let b1 = _mm256_loadu_ps(bp.add(k * SG_NR + 8));
            let ak = a.add(k * SG_MR);
            for r in 0..SG_MR {
                let av = _mm256_broadcast_ss(&*ak.add(r));
                c0[r] = _mm256_fmadd_ps(av, b0, c0[r]);
                c1[r] = _mm256_fmadd_ps(av, b1, c1[r]);
            }
        }
    };
    let mut k = 0;
    while k + 4 <= kc {
        step(k, &mut c0, &mut c1);
        step(k + 1, &mut c0, &mut c1);
        step(k + 2, &mut c0, &mut c1);
        step(k + 3, &mut c0, &mut c1);
        k += 4;
    }
    while k < kc {
        step(k, &mut c0, &mut c1);
        k += 1;
    }
    for r in 0..SG_MR {
        // SAFETY: `out` holds 6 rows of 16 (contract).
        unsafe {
            let (o0, o1) = (out.add(r * SG_NR), out.add(r * SG_NR + 8));
            if acc {
                _mm256_storeu_ps(o0, _mm256_add_ps(_mm256_loadu_ps(o0), c0[r]));
                _mm256_storeu_ps(o1, _mm256_add_ps(_mm256_loadu_ps(o1), c1[r]));
            } else {
                _mm256_storeu_ps(o0, c0[r]);
                _mm256_storeu_ps(o1, c1[r]);
            }
        }
    }
}

/// See `crate::kernels::sgemm::PackStripFn`: eight elements of the six rows at a time, transposed
/// in registers (the 8 x 8 unpack / shuffle / lane-permute transpose with two zero rows).
fn pack_strip(kc: usize, rows: [&[u8]; SG_MR], out: &mut [f32]) {
    check_pack(kc, &rows, out);
    let whole = kc / 8 * 8;
    // SAFETY: `check_pack` proved each row holds `kc` f32 and `out` `kc * 6`; the loop reads
    // elements below `whole <= kc` and writes groups below `whole`. Installed only by `plug`,
    // which takes an `Avx2` token.
    unsafe { pack8::<false>(whole, rows.map(|r| r.as_ptr()), out.as_mut_ptr()) };
    for k in whole..kc {
        for (r, row) in rows.iter().enumerate() {
            let v = &row[k * 4..k * 4 + 4];
            out[k * SG_MR + r] = f32::from_le_bytes([v[0], v[1], v[2], v[3]]);
        }
    }
}

/// See `crate::kernels::sgemm::PackStripF16Fn`: as [`pack_strip`], each row's eight halves
/// widened by F16C before the transpose.
fn pack_strip_f16(kc: usize, rows: [&[u8]; SG_MR], out: &mut [f32]) {
    check_pack_es(kc, 2, &rows, out);
    let whole = kc / 8 * 8;
    // SAFETY: `check_pack_es` proved each row holds `kc` halves and `out` `kc * 6` values; the
    // loop stays below `whole <= kc`. Installed only by `plug` (an `Avx2` token: AVX2, F16C).
    unsafe { pack8::<true>(whole, rows.map(|r| r.as_ptr()), out.as_mut_ptr()) };
    for k in whole..kc {
        for (r, row) in rows.iter().enumerate() {
            let h = u16::from_le_bytes([row[k * 2], row[k * 2 + 1]]);
            out[k * SG_MR + r] = crate::quant::util::fp16_to_fp32(h);
        }
    }
}

/// # Safety
/// AVX2 and F16C are available; each row holds `whole` elements (f32, or f16 with `F16`; a
/// multiple of 8), `out` `whole * 6` f32.
#[target_feature(enable = "avx2,f16c")]
unsafe fn pack8<const F16: bool>(whole: usize, rows: [*const u8; SG_MR], out: *mut f32) {
    let z = _mm256_setzero_ps();
    // Lanes 0..6 of a group: the last of every 8 groups is stored under this mask so nothing is
    // written past the strip; the others overlap the next group's first two lanes, which that
    // group's store then overwrites.
    let mask = _mm256_setr_epi32(-1, -1, -1, -1, -1, -1, 0, 0);
    let mut k = 0;
    while k < whole {
        // SAFETY: k + 8 <= whole: elements k..k + 8 of each row and groups k..k + 8 of `out`
        // are in bounds (contract); the overlapping stores stay below group k + 7's end.
        unsafe {
            let ld = |r: usize| {
                if F16 {
                    _mm256_cvtph_ps(_mm_loadu_si128(rows[r].add(k * 2) as *const __m128i))
                } else {
                    _mm256_loadu_ps(rows[r].add(k * 4) as *const f32)
                }
            };
            let (r0, r1, r2, r3, r4, r5) = (ld(0), ld(1), ld(2), ld(3), ld(4), ld(5));
            let t0 = _mm256_unpacklo_ps(r0, r1);
            let t1 = _mm256_unpackhi_ps(r0, r1);
            let t2 = _mm256_unpacklo_ps(r2, r3);
            let t3 = _mm256_unpackhi_ps(r2, r3);
            let t4 = _mm256_unpacklo_ps(r4, r5);
            let t5 = _mm256_unpackhi_ps(r4, r5);
            let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
            let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
            let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
            let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
            let s4 = _mm256_shuffle_ps::<0x44>(t4, z);
            let s5 = _mm256_shuffle_ps::<0xEE>(t4, z);
            let s6 = _mm256_shuffle_ps::<0x44>(t5, z);
            let s7 = _mm256_shuffle_ps::<0xEE>(t5, z);
            let o = out.add(k * SG_MR);
            _mm256_storeu_ps(o, _mm256_permute2f128_ps::<0x20>(s0, s4));
            _mm256_storeu_ps(o.add(SG_MR), _mm256_permute2f128_ps::<0x20>(s1, s5));
            _mm256_storeu_ps(o.add(2 * SG_MR), _mm256_permute2f128_ps::<0x20>(s2, s6));
            _mm256_storeu_ps(o.add(3 * SG_MR), _mm256_permute2f128_ps::<0x20>(s3, s7));
            _mm256_storeu_ps(o.add(4 * SG_MR), _mm256_permute2f128_ps::<0x31>(s0, s4));
            _mm256_storeu_ps(o.add(5 * SG_MR), _mm256_permute2f128_ps::<0x31>(s1, s5));
            _mm256_storeu_ps(o.add(6 * SG_MR), _mm256_permute2f128_ps::<0x31>(s2, s6));
            _mm256_maskstore_ps(o.add(7 * SG_MR), mask, _mm256_permute2f128_ps::<0x31>(s3, s7));
        }
        k += 8;
    }
}

/// See `crate::kernels::sgemm::round_f16`: eight values at a time through F16C (the same
/// round-to-nearest-even conversion ggml's F16C `from_float` does).
fn round_f16(x: &mut [f32]) {
    let whole = x.len() / 8 * 8;
    let (body, tail) = x.split_at_mut(whole);
    for c in body.chunks_exact_mut(8) {
        // SAFETY: the chunk holds 8 f32; this function is installed only by `plug`, which takes
        // an `Avx2` token (AVX2, F16C).
        unsafe { round_f16_8(c.as_mut_ptr()) };
    }
    crate::kernels::sgemm::round_f16(tail);
}

/// # Safety
/// F16C is available and `p` points to 8 f32.
#[target_feature(enable = "avx2,f16c")]
unsafe fn round_f16_8(p: *mut f32) {
    // SAFETY: `p` holds 8 f32 (contract).
    unsafe {
        let h = _mm256_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT }>(_mm256_loadu_ps(p));
        _mm256_storeu_ps(p, _mm256_cvtph_ps(h));
    }
}

/// See `crate::kernels::sgemm::round_bf16`: ggml's rounding (add 0x7fff plus the lowest kept
/// bit, keep the high half; NaN keeps its high half with the quiet bit set) on 8 lanes.
fn round_bf16(x: &mut [f32]) {
    let whole = x.len() / 8 * 8;
    let (body, tail) = x.split_at_mut(whole);
    for c in body.chunks_exact_mut(8) {
        // SAFETY: the chunk holds 8 f32; this function is installed only by `plug`, which takes
        // an `Avx2` token (AVX2).
        unsafe { round_bf16_8(c.as_mut_ptr()) };
    }
    crate::kernels::sgemm::round_bf16(tail);
}

/// # Safety
/// AVX2 is available and `p` points to 8 f32.
#[target_feature(enable = "avx2")]
unsafe fn round_bf16_8(p: *mut f32) {
    // SAFETY: `p` holds 8 f32 (contract).
    unsafe {
        let u = _mm256_loadu_si256(p as *const __m256i);
        let abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fff_ffff));
        let nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f80_0000));
        let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(u), _mm256_set1_epi32(1));
        let r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
        let hi = _mm256_set1_epi32(0xffff_0000u32 as i32);
        let rounded = _mm256_and_si256(r, hi);
        let quiet = _mm256_or_si256(_mm256_and_si256(u, hi), _mm256_set1_epi32(0x0040_0000));
        _mm256_storeu_si256(p as *mut __m256i, _mm256_blendv_epi8(rounded, quiet, nan));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::sgemm as portable;

    fn avx2() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c")
    }

    /// Awkward f32 bit patterns: NaNs (quiet, signalling, with payloads), infinities, zeros,
    /// subnormals of both precisions, ties, and pseudo-random bits.
    fn values(n: usize) -> Vec<f32> {
        let special = [
            0x7fc0_0000u32,
            0x7f80_0001,
            0xffc1_2345,
            0x7f80_0000,
            0xff80_0000,
            0,
            0x8000_0000,
            0x0000_0001,
            0x0080_0000,
            0x3380_0000,
            0x3800_0000,
            0x477f_f000,
            0x477f_efff,
            0x3f80_8000,
            0x3f81_8000,
            0x3f80_7fff,
            0x7f7f_ffff,
            0x3f80_1000,
        ];
        let mut r = crate::testdata::Xorshift32::from_state(0x9e37_79b9);
        (0..n)
            .map(|i| {
                let s = r.next_u32();
                f32::from_bits(if i < special.len() { special[i] } else { s })
            })
            .collect()
    }

    #[test]
    fn rounding_matches_the_portable_tier_bitwise() {
        if !avx2() {
            return;
        }
        for n in [0, 1, 7, 8, 9, 100, 4099] {
            let x = values(n);
            for (simd, scalar) in [
                (round_f16 as fn(&mut [f32]), portable::round_f16 as fn(&mut [f32])),
                (round_bf16, portable::round_bf16),
            ] {
                let (mut a, mut b) = (x.clone(), x.clone());
                simd(&mut a);
                scalar(&mut b);
                // NaN payloads may differ (F16C keeps the top payload bits, the portable
                // conversion ggml's generic build uses gives the canonical NaN); NaN stays NaN.
                let bits = |v: &[f32]| {
                    v.iter()
                        .map(|f| if f.is_nan() { u32::MAX } else { f.to_bits() })
                        .collect::<Vec<_>>()
                };
                assert_eq!(bits(&a), bits(&b), "n = {n}");
            }
        }
    }

    #[test]
    fn strip_packing_matches_the_portable_tier() {
        if !avx2() {
            return;
        }
        for kc in [1, 7, 8, 9, 16, 23, 256] {
            let data: Vec<Vec<u8>> = (0..SG_MR)
                .map(|r| values(kc + r).iter().skip(r).flat_map(|v| v.to_le_bytes()).collect())
                .collect();
            let rows: [&[u8]; SG_MR] = std::array::from_fn(|r| &data[r][..]);
            // A guard value after the strip catches a write past its end.
            let (mut a, mut b) = (vec![-7.0f32; kc * SG_MR + 8], vec![-7.0f32; kc * SG_MR + 8]);
            pack_strip(kc, rows, &mut a[..kc * SG_MR]);
            portable::pack_strip(kc, rows, &mut b[..kc * SG_MR]);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b), "kc = {kc}");
            assert!(a[kc * SG_MR..].iter().all(|&g| g == -7.0));
            // The same bytes read as halves (NaNs included: F16C and the table widen alike).
            let (mut a, mut b) = (vec![-7.0f32; kc * SG_MR + 8], vec![-7.0f32; kc * SG_MR + 8]);
            pack_strip_f16(kc, rows, &mut a[..kc * SG_MR]);
            portable::pack_strip_f16(kc, rows, &mut b[..kc * SG_MR]);
            assert_eq!(bits(&a), bits(&b), "f16 kc = {kc}");
            assert!(a[kc * SG_MR..].iter().all(|&g| g == -7.0));
        }
    }
}
