//! AVX2 kernels for repacked weights (needs AVX2, FMA and F16C); the scalar twins are in
//! `kernels/repack.rs`, which also describes the contract.
//!
//! One 32-byte load of an interleaved quant field holds 4 consecutive elements of each of the 8
//! rows (two nibbles per byte: 2 steps of 4 elements). Each step multiplies it with the matching 4
//! activation levels broadcast to all rows (`maddubs`), so one instruction does 32
//! multiply-adds, and the 8 rows' block sums come out in the 8 lanes of one register. The
//! unsigned Q4_0 nibbles (and MXFP4 values shifted by +12) sum in 16 bits across steps and are
//! corrected with the activation block's level sum; IQ4_NL's signed values use the sign trick.
//!
//! The wrappers are private: [`plug`] installs them only after `Isa::Avx2.is_supported()` was
//! checked, which is what makes their `unsafe` calls sound.

use std::arch::x86_64::*;

use crate::dtype::DType;
use crate::kernels::KernelTable;
use crate::kernels::repack::{
    KIND_IQ4_NL, KIND_MXFP4, KIND_Q2_K, KIND_Q4_0, KIND_Q4_K, KIND_Q6_K, KIND_TQ2_0, Q8K_BSUMS,
    Q8K_BYTES, Q8K_QS, REPACK_NC, Y0_BYTES, k_group_bytes, k_offset, k_subblocks, q2_qs,
};
use crate::quant::fp4::{KVALUES_MXFP4, e8m0_to_fp32_half};
use crate::quant::iq::grids::KVALUES_IQ4NL;

/// Registers this file's kernels in `t` (called by `plug_avx2` for a supported CPU).
pub(crate) fn plug(t: &mut KernelTable, _: super::Avx2) {
    t.set_repack(DType::Q4_0, gemm_q4_0_x8);
    t.set_repack(DType::IQ4_NL, gemm_iq4_nl_x8);
    t.set_repack(DType::MXFP4, gemm_mxfp4_x8);
    t.set_repack(DType::Q4_K, gemm_q4_k_x8);
    t.set_repack(DType::Q6_K, gemm_q6_k_x8);
    t.set_repack(DType::Q2_K, gemm_q2_k_x8);
    t.set_repack(DType::TQ2_0, gemm_tq2_0_x8);
    t.set_from_float(DType::Q8_K, from_float_q8_k);
}

fn gemm_tq2_0_x8(x: &[u8], y: &[&[u8]], acc: &mut [[f32; 8]]) {
    kq::<KIND_TQ2_0, 2>(x, y, acc);
}

fn gemm_q4_k_x8(x: &[u8], y: &[&[u8]], acc: &mut [[f32; 8]]) {
    kq::<KIND_Q4_K, 2>(x, y, acc);
}

fn gemm_q6_k_x8(x: &[u8], y: &[&[u8]], acc: &mut [[f32; 8]]) {
    kq::<KIND_Q6_K, 0>(x, y, acc);
}

fn gemm_q2_k_x8(x: &[u8], y: &[&[u8]], acc: &mut [[f32; 8]]) {
    kq::<KIND_Q2_K, 2>(x, y, acc);
}

/// The repacked K-quant (and TQ2_0) kernels with a decode prefetch `AHEAD` group blocks ahead,
/// for tiers whose memory system wants another distance (the same arithmetic and bits).
pub(super) fn kq_kernel<const KIND: u8, const AHEAD: usize>(
    x: &[u8],
    y: &[&[u8]],
    acc: &mut [[f32; 8]],
) {
    kq::<KIND, AHEAD>(x, y, acc);
}

#[inline(always)]
fn kq<const KIND: u8, const AHEAD: usize>(x: &[u8], y: &[&[u8]], acc: &mut [[f32; 8]]) {
    let gb = k_group_bytes(KIND);
    let nb = x.len() / gb;
    assert!(acc.len() == y.len(), "repack kernel: bad column count");
    assert!(y.iter().all(|c| c.len() >= nb * Q8K_BYTES), "repack kernel: activations too short");
    for b in 0..nb {
        let xb = &x[b * gb..(b + 1) * gb];
        if y.len() <= REPACK_NC {
            // Decode streams the weights once: ask for the block AHEAD blocks on, line by line
            // (a hint; addresses past the end are never dereferenced). On Zen 3 (the AVX2
            // tier's distances): two blocks ahead, but Q6_K's blocks are bigger (26 lines a
            // group) and asking for the current block's lines all at once measured 6-9% faster
            // than two blocks ahead (paired in-process runs, 4096 and 16384 x 14336 weights),
            // and no prefetch at all slower than either.
            let ahead = xb.as_ptr().wrapping_add(AHEAD * gb);
            for l in (0..gb).step_by(64) {
                // SAFETY: prefetching is a hint with no memory access semantics.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(l) as *const i8) };
            }
        }
        // SAFETY: `plug` installs these wrappers only on CPUs with AVX2, FMA and F16C; xb is one
        // whole group block and every y row holds block b (checked above).
        unsafe { kq_block::<KIND>(xb, b, y, acc) };
    }
}

/// The unsigned levels of a whole group block, step by step (elements 4s..4s + 4 of the 8 rows).
///
/// # Safety
/// AVX2 is available and `p` points at a whole group block of `KIND`.
/// Low and high nibbles of a 32-byte load: levels 0..15 of two steps.
#[inline]
#[target_feature(enable = "avx2")]
fn nibbles(raw: __m256i) -> [__m256i; 2] {
    let m4 = _mm256_set1_epi8(0x0F);
    [_mm256_and_si256(raw, m4), _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4)]
}

/// The four 2-bit fields (bits 0-1, 2-3, 4-5, 6-7) of a 32-byte load: Q2_K / TQ2_0 levels of
/// the four 32-element quarters.
#[inline]
#[target_feature(enable = "avx2")]
fn crumbs(raw: __m256i) -> [__m256i; 4] {
    let m3 = _mm256_set1_epi8(3);
    [
        _mm256_and_si256(raw, m3),
        _mm256_and_si256(_mm256_srli_epi16(raw, 2), m3),
        _mm256_and_si256(_mm256_srli_epi16(raw, 4), m3),
        _mm256_and_si256(_mm256_srli_epi16(raw, 6), m3),
    ]
}

/// Q6_K levels (+32) of the four 32-element quarters from the low-bit loads `qa` (quarters 0, 2)
/// and `qb` (1, 3) and the high-bit load `qh`.
#[inline]
#[target_feature(enable = "avx2")]
fn q6_levels(qa: __m256i, qb: __m256i, qh: __m256i) -> [__m256i; 4] {
    let m30 = _mm256_set1_epi8(0x30);
    let [la, ha] = nibbles(qa);
    let [lb, hb] = nibbles(qb);
    [
        _mm256_or_si256(la, _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30)),
        _mm256_or_si256(lb, _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30)),
        _mm256_or_si256(ha, _mm256_and_si256(qh, m30)),
        _mm256_or_si256(hb, _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30)),
    ]
}

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn k_levels<const KIND: u8>(p: *const u8) -> [__m256i; 64] {
    // SAFETY: every load below stays inside the group block (layout in backend::repack).
    let ld = |o: usize| unsafe { _mm256_loadu_si256(p.add(o) as *const __m256i) };
    let mut u = [_mm256_setzero_si256(); 64];
    match KIND {
        KIND_Q4_K => {
            for j in 0..4 {
                for s in 0..8 {
                    [u[16 * j + s], u[16 * j + 8 + s]] = nibbles(ld(128 + 32 * (8 * j + s)));
                }
            }
        }
        KIND_Q2_K | KIND_TQ2_0 => {
            for n in 0..2 {
                for lc in 0..8 {
                    let q = crumbs(ld(q2_qs(KIND) + 32 * (8 * n + lc)));
                    for (t, v) in q.into_iter().enumerate() {
                        u[32 * n + 8 * t + lc] = v;
                    }
                }
            }
        }
        _ => {
            for n in 0..2 {
                for lc in 0..8 {
                    let q = q6_levels(
                        ld(144 + 32 * (16 * n + lc)),
                        ld(144 + 32 * (16 * n + 8 + lc)),
                        ld(1168 + 32 * (8 * n + lc)),
                    );
                    for (t, v) in q.into_iter().enumerate() {
                        u[32 * n + 8 * t + lc] = v;
                    }
                }
            }
        }
    }
    u
}

/// One super-block of one 8-row group against every activation row.
///
/// # Safety
/// AVX2, FMA and F16C are available; `xb` is one group block of `KIND`; every `y` row holds at
/// least `b + 1` Q8_K blocks; `acc.len() == y.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kq_block<const KIND: u8>(xb: &[u8], b: usize, y: &[&[u8]], acc: &mut [[f32; 8]]) {
    let direct = y.len() <= REPACK_NC;
    let p = xb.as_ptr();
    // Scales duplicated into both 16-bit halves of each row's 32-bit lane; the bsum weights of
    // sub-blocks (2q, 2q + 1) side by side in each row's lane. The scales are stored transposed
    // (8 bytes per sub-block, one per row), so each sub-block's are one 8-byte load.
    // SAFETY: every load below stays inside the group block.
    let ld8 = |o: usize| unsafe { _mm_loadl_epi64(p.add(o) as *const __m128i) };
    let mut sc16 = [_mm_setzero_si128(); 16];
    let mut w16 = [_mm_setzero_si128(); 16];
    let (dv, dminv);
    match KIND {
        KIND_Q4_K => {
            let q: [__m128i; 12] = std::array::from_fn(|j| ld8(32 + 8 * j));
            let m63 = _mm_set1_epi8(63);
            let m0f = _mm_set1_epi8(0x0F);
            let m03 = _mm_set1_epi8(3);
            let top2 = |v: __m128i| _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(v, 6), m03), 4);
            for j in 0..8 {
                let (sc, m) = if j < 4 {
                    (_mm_and_si128(q[j], m63), _mm_and_si128(q[j + 4], m63))
                } else {
                    (
                        _mm_or_si128(_mm_and_si128(q[j + 4], m0f), top2(q[j - 4])),
                        _mm_or_si128(_mm_and_si128(_mm_srli_epi16(q[j + 4], 4), m0f), top2(q[j])),
                    )
                };
                sc16[j] = _mm_cvtepu8_epi16(sc);
                w16[j] = _mm_cvtepu8_epi16(m);
            }
            // SAFETY: 8 f16 scales at 0 and 8 f16 mins at 16.
            unsafe {
                dv = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
                dminv = _mm256_cvtph_ps(_mm_loadu_si128(p.add(16) as *const __m128i));
            }
        }
        KIND_Q2_K => {
            let m0f = _mm_set1_epi8(0x0F);
            for j in 0..16 {
                let v = ld8(32 + 8 * j);
                sc16[j] = _mm_cvtepu8_epi16(_mm_and_si128(v, m0f));
                w16[j] = _mm_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(v, 4), m0f));
            }
            // SAFETY: 8 f16 scales at 0 and 8 f16 mins at 16.
            unsafe {
                dv = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
                dminv = _mm256_cvtph_ps(_mm_loadu_si128(p.add(16) as *const __m128i));
            }
        }
        KIND_TQ2_0 => {
            sc16 = [_mm_set1_epi16(1); 16];
            w16 = sc16;
            // SAFETY: 8 f16 scales at 0.
            dv = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(p as *const __m128i) });
            dminv = _mm256_setzero_ps();
        }
        _ => {
            for j in 0..16 {
                sc16[j] = _mm_cvtepi8_epi16(ld8(16 + 8 * j));
                w16[j] = sc16[j];
            }
            // SAFETY: 8 f16 scales at 0.
            dv = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(p as *const __m128i) });
            dminv = _mm256_setzero_ps();
        }
    }
    let scv: [__m256i; 16] = std::array::from_fn(|j| {
        _mm256_set_m128i(_mm_unpackhi_epi16(sc16[j], sc16[j]), _mm_unpacklo_epi16(sc16[j], sc16[j]))
    });
    let wp: [__m256i; 8] = std::array::from_fn(|q| {
        let (a, b) = (w16[(2 * q) % 16], w16[(2 * q + 1) % 16]);
        _mm256_set_m128i(_mm_unpackhi_epi16(a, b), _mm_unpacklo_epi16(a, b))
    });
    // Few columns: the levels are decoded where they are used; many: once for all of them.
    // SAFETY: p is a whole group block (caller contract).
    let u = if direct { None } else { Some(unsafe { k_levels::<KIND>(p) }) };
    let ks = KBlock { p, u: u.as_ref(), scv: &scv, wp: &wp, dv, dminv };
    for (yq, aq) in y.chunks(REPACK_NC).zip(acc.chunks_mut(REPACK_NC)) {
        // SAFETY: same contract as this function, for a quad of columns.
        unsafe {
            match (yq.len(), direct) {
                (1, _) => kq_cols::<KIND, 1, true>(&ks, b, yq, aq),
                (2, _) => kq_cols::<KIND, 2, true>(&ks, b, yq, aq),
                (3, _) => kq_cols::<KIND, 3, true>(&ks, b, yq, aq),
                (_, true) => kq_cols::<KIND, 4, true>(&ks, b, yq, aq),
                _ => kq_cols::<KIND, 4, false>(&ks, b, yq, aq),
            }
        }
    }
}

/// How far ahead the single-column kernels prefetch weights. Paired in-process runs of 4096 x 14336
/// decode (2 threads, the distance switched between computes of one plan) measured 8 KiB at
/// 1.13-1.23x the former 1 KiB for Q4_0, MXFP4 and IQ4_NL (16 KiB: 1.1-1.3x, less steady).
pub(super) const PREFETCH_BYTES: usize = 8192;

q0_repack_driver!();

/// # Safety
/// AVX2, FMA and F16C are available; `x` points at `nb` group blocks; `y` has NC rows of at least
/// `nb` [`Y0`](crate::kernels::repack::Y0) blocks; `acc` has NC entries.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q0_kernel<const KIND: u8, const NC: usize>(
    nb: usize,
    x: *const u8,
    y: &[&[u8]],
    acc: &mut [[f32; 8]],
) {
    let gb = q0_group_bytes(KIND);
    let qo = if KIND == KIND_MXFP4 { 8 } else { 16 };
    let yp: [*const u8; NC] = std::array::from_fn(|c| y[c].as_ptr());
    // SAFETY: acc has NC entries of 8 floats (caller contract).
    let mut av: [__m256; NC] = std::array::from_fn(|c| unsafe { _mm256_loadu_ps(acc[c].as_ptr()) });
    let ones = _mm256_set1_epi16(1);
    let lut = if KIND == KIND_IQ4_NL {
        // SAFETY: the table has 16 bytes.
        unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const _)) }
    } else {
        let shifted: [u8; 16] = std::array::from_fn(|i| (KVALUES_MXFP4[i] as i32 + 12) as u8);
        // SAFETY: 16 bytes.
        unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(shifted.as_ptr() as *const _)) }
    };
    for b in 0..nb {
        // SAFETY: b < nb group blocks of gb bytes (caller contract).
        let xb = unsafe { x.add(b * gb) };
        if NC == 1 {
            // Decode streams the weights once: ask for the lines a few blocks ahead (a hint; an
            // address past the end is never dereferenced).
            _mm_prefetch::<_MM_HINT_T0>(xb.wrapping_add(PREFETCH_BYTES) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(xb.wrapping_add(PREFETCH_BYTES + 64) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(xb.wrapping_add(PREFETCH_BYTES + 128) as *const i8);
        }
        let dx = if KIND == KIND_MXFP4 {
            // SAFETY: the block starts with 8 E8M0 bytes.
            let e = |r: usize| e8m0_to_fp32_half(unsafe { *xb.add(r) });
            _mm256_setr_ps(e(0), e(1), e(2), e(3), e(4), e(5), e(6), e(7))
        } else {
            // SAFETY: the block starts with 8 f16 scales (16 bytes).
            _mm256_cvtph_ps(unsafe { _mm_loadu_si128(xb as *const __m128i) })
        };
        let mut xs = [_mm256_setzero_si256(); 8];
        for p in 0..4 {
            // SAFETY: the quants follow the scales: 4 loads of 32 bytes inside the block.
            let raw = unsafe { _mm256_loadu_si256(xb.add(qo + 32 * p) as *const __m256i) };
            let [lo, hi] = nibbles(raw);
            if KIND == KIND_Q4_0 {
                xs[p] = lo;
                xs[4 + p] = hi;
            } else {
                xs[p] = _mm256_shuffle_epi8(lut, lo);
                xs[4 + p] = _mm256_shuffle_epi8(lut, hi);
            }
        }
        let ax: [__m256i; 8] =
            if KIND == KIND_IQ4_NL { std::array::from_fn(|s| _mm256_abs_epi8(xs[s])) } else { xs };
        for c in 0..NC {
            // SAFETY: b < nb activation blocks of Y0_BYTES in row c (caller contract).
            let yb = unsafe { yp[c].add(b * Y0_BYTES) };
            // SAFETY: Y0 = {d: f32, sum: i32, qs: [i8; 32]}, all inside the block.
            let (dy, ysum) = unsafe {
                ((yb as *const f32).read_unaligned(), (yb.add(4) as *const i32).read_unaligned())
            };
            // SAFETY: step s reads bytes 8 + 4s .. 12 + 4s of the block.
            let bc = |s: usize| unsafe {
                _mm256_set1_epi32((yb.add(8 + 4 * s) as *const i32).read_unaligned())
            };
            let sumi = if KIND == KIND_Q4_0 {
                // 8 steps of at most 2 * 15 * 128 per 16-bit lane: no overflow.
                let mut a16 = _mm256_maddubs_epi16(xs[0], bc(0));
                for s in 1..8 {
                    a16 = _mm256_add_epi16(a16, _mm256_maddubs_epi16(xs[s], bc(s)));
                }
                _mm256_sub_epi32(_mm256_madd_epi16(a16, ones), _mm256_set1_epi32(8 * ysum))
            } else if KIND == KIND_MXFP4 {
                // Values + 12 <= 24: 4 steps of at most 2 * 24 * 128 per 16-bit lane.
                let mut lo = _mm256_maddubs_epi16(xs[0], bc(0));
                let mut hi = _mm256_maddubs_epi16(xs[4], bc(4));
                for s in 1..4 {
                    lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(xs[s], bc(s)));
                    hi = _mm256_add_epi16(hi, _mm256_maddubs_epi16(xs[4 + s], bc(4 + s)));
                }
                let s32 =
                    _mm256_add_epi32(_mm256_madd_epi16(lo, ones), _mm256_madd_epi16(hi, ones));
                _mm256_sub_epi32(s32, _mm256_set1_epi32(12 * ysum))
            } else {
                // Signed values: |x| times y with x's sign moved onto y; each step is widened to
                // 32 bits before summing (2 * 127 * 127 per 16-bit lane). Exact because the
                // activations come from the Q8_0 converter, whose levels stay in -127..=127
                // (negating -128 would wrap).
                let mut s32 = _mm256_setzero_si256();
                for s in 0..8 {
                    let p = _mm256_maddubs_epi16(ax[s], _mm256_sign_epi8(bc(s), xs[s]));
                    s32 = _mm256_add_epi32(s32, _mm256_madd_epi16(p, ones));
                }
                s32
            };
            let sc = _mm256_mul_ps(dx, _mm256_set1_ps(dy));
            av[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), sc, av[c]);
        }
    }
    for c in 0..NC {
        // SAFETY: acc has NC entries of 8 floats.
        unsafe { _mm256_storeu_ps(acc[c].as_mut_ptr(), av[c]) };
    }
}

/// A decoded group block: levels (unless decoded on the fly), scales and bsum weights.
struct KBlock<'a> {
    p: *const u8,
    u: Option<&'a [__m256i; 64]>,
    scv: &'a [__m256i; 16],
    wp: &'a [__m256i; 8],
    dv: __m256,
    dminv: __m256,
}

/// The block's integer sums `sum_sb scale[sb] * dot(levels[sb], y[sb])` for NC activation rows,
/// decoding the levels where they are used (few columns: nothing to share a decoded copy with).
///
/// # Safety
/// AVX2 is available, `p` points at a whole group block of `KIND` and every `yb[c]` at a whole
/// Q8_K block.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn k_isum_direct<const KIND: u8, const NC: usize>(
    p: *const u8,
    yb: &[*const u8; NC],
    scv: &[__m256i; 16],
) -> [__m256i; NC] {
    // SAFETY: offsets stay inside the group block (layout in backend::repack).
    let ld = |o: usize| unsafe { _mm256_loadu_si256(p.add(o) as *const __m256i) };
    // SAFETY: step s reads levels 4s..4s + 4 of each activation block.
    let bc = |c: usize, s: usize| unsafe {
        _mm256_set1_epi32((yb[c].add(Q8K_QS + 4 * s) as *const i32).read_unaligned())
    };
    let mut isum = [_mm256_setzero_si256(); NC];
    let z = _mm256_setzero_si256();
    match KIND {
        KIND_Q4_K => {
            for j in 0..4 {
                let (mut lo, mut hi) = ([z; NC], [z; NC]);
                for s in 0..8 {
                    let [ul, uh] = nibbles(ld(128 + 32 * (8 * j + s)));
                    for c in 0..NC {
                        lo[c] =
                            _mm256_add_epi16(lo[c], _mm256_maddubs_epi16(ul, bc(c, 16 * j + s)));
                        hi[c] = _mm256_add_epi16(
                            hi[c],
                            _mm256_maddubs_epi16(uh, bc(c, 16 * j + 8 + s)),
                        );
                    }
                }
                for c in 0..NC {
                    let v = _mm256_add_epi32(
                        _mm256_madd_epi16(lo[c], scv[2 * j]),
                        _mm256_madd_epi16(hi[c], scv[2 * j + 1]),
                    );
                    isum[c] = _mm256_add_epi32(isum[c], v);
                }
            }
        }
        KIND_Q2_K | KIND_TQ2_0 => {
            for n in 0..2 {
                for half in 0..2 {
                    let mut a = [[z; NC]; 4];
                    for l4 in 0..4 {
                        let lc = 4 * half + l4;
                        let u = crumbs(ld(q2_qs(KIND) + 32 * (8 * n + lc)));
                        for (j, uj) in u.iter().enumerate() {
                            for c in 0..NC {
                                let y = bc(c, 32 * n + 8 * j + lc);
                                a[j][c] = _mm256_add_epi16(a[j][c], _mm256_maddubs_epi16(*uj, y));
                            }
                        }
                    }
                    for (j, aj) in a.iter().enumerate() {
                        for c in 0..NC {
                            let v = _mm256_madd_epi16(aj[c], scv[8 * n + 2 * j + half]);
                            isum[c] = _mm256_add_epi32(isum[c], v);
                        }
                    }
                }
            }
        }
        _ => {
            for n in 0..2 {
                // Steps lc, lc + 1 of the four 32-element quarters t: sub-blocks 8n + 2t + lc / 4.
                for lp in 0..4 {
                    let (mut a0, mut a1, mut a2, mut a3) = ([z; NC], [z; NC], [z; NC], [z; NC]);
                    for l2 in 0..2 {
                        let lc = 2 * lp + l2;
                        let [u0, u1, u2, u3] = q6_levels(
                            ld(144 + 32 * (16 * n + lc)),
                            ld(144 + 32 * (16 * n + 8 + lc)),
                            ld(1168 + 32 * (8 * n + lc)),
                        );
                        let s0 = 32 * n + lc;
                        for c in 0..NC {
                            a0[c] = _mm256_add_epi16(a0[c], _mm256_maddubs_epi16(u0, bc(c, s0)));
                            a1[c] =
                                _mm256_add_epi16(a1[c], _mm256_maddubs_epi16(u1, bc(c, s0 + 8)));
                            a2[c] =
                                _mm256_add_epi16(a2[c], _mm256_maddubs_epi16(u2, bc(c, s0 + 16)));
                            a3[c] =
                                _mm256_add_epi16(a3[c], _mm256_maddubs_epi16(u3, bc(c, s0 + 24)));
                        }
                    }
                    let sb = 8 * n + lp / 2;
                    for c in 0..NC {
                        let v01 = _mm256_add_epi32(
                            _mm256_madd_epi16(a0[c], scv[sb]),
                            _mm256_madd_epi16(a1[c], scv[sb + 2]),
                        );
                        let v23 = _mm256_add_epi32(
                            _mm256_madd_epi16(a2[c], scv[sb + 4]),
                            _mm256_madd_epi16(a3[c], scv[sb + 6]),
                        );
                        isum[c] = _mm256_add_epi32(isum[c], _mm256_add_epi32(v01, v23));
                    }
                }
            }
        }
    }
    isum
}

/// NC activation rows against one decoded group block; each level load serves NC rows.
///
/// # Safety
/// As [`kq_block`]; `y.len() == acc.len() == NC`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kq_cols<const KIND: u8, const NC: usize, const DIRECT: bool>(
    k: &KBlock<'_>,
    b: usize,
    y: &[&[u8]],
    acc: &mut [[f32; 8]],
) {
    // SAFETY: every row holds block b (caller contract).
    let yb: [*const u8; NC] = std::array::from_fn(|c| unsafe { y[c].as_ptr().add(b * Q8K_BYTES) });
    let nsb = k_subblocks(KIND);
    // Steps (4 elements of the 8 rows) per sub-block, and steps summed in 16 bits before the
    // scale is applied (levels up to 15, 3 and 63: 8, 4 and 2 steps stay below 2^15).
    let sbs = 64 / nsb;
    let maxs = match KIND {
        KIND_Q4_K => 8,
        KIND_Q2_K => 4,
        // Levels up to 3: 32 steps of at most 2 * 3 * 128.
        KIND_TQ2_0 => 32,
        _ => 2,
    };
    let mut isum = [_mm256_setzero_si256(); NC];
    if DIRECT {
        // SAFETY: k.p is a whole group block and yb[c] whole Q8_K blocks (caller contract).
        isum = unsafe { k_isum_direct::<KIND, NC>(k.p, &yb, k.scv) };
    }
    // The shared path reads the levels `kq_block` decoded once (no zeroed stand-in: 2 KiB a call).
    let u = if DIRECT { None } else { k.u };
    for sb in 0..u.map_or(0, |_| nsb) {
        for h in 0..sbs / maxs {
            let mut a16 = [_mm256_setzero_si256(); NC];
            for t in 0..maxs {
                let s = sb * sbs + h * maxs + t;
                let us = u.map_or(_mm256_setzero_si256(), |u| u[s]);
                for c in 0..NC {
                    // SAFETY: step s reads levels 4s..4s + 4 of block b of row c.
                    let yv = unsafe {
                        _mm256_set1_epi32(
                            (yb[c].add(Q8K_QS + 4 * s) as *const i32).read_unaligned(),
                        )
                    };
                    a16[c] = _mm256_add_epi16(a16[c], _mm256_maddubs_epi16(us, yv));
                }
            }
            for c in 0..NC {
                isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(a16[c], k.scv[sb]));
            }
        }
    }
    for c in 0..NC {
        // SAFETY: d and the 16 sums of 16 levels are inside block b of row c.
        let dy = unsafe { (yb[c] as *const f32).read_unaligned() };
        let mut iw = _mm256_setzero_si256();
        if KIND == KIND_TQ2_0 {
            // SAFETY: the 16 sums (32 bytes) are inside the activation block.
            let bs = unsafe { _mm256_loadu_si256(yb[c].add(Q8K_BSUMS) as *const __m256i) };
            let s = _mm256_madd_epi16(bs, _mm256_set1_epi16(1));
            let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
            iw = _mm256_broadcastd_epi32(s);
        } else if KIND == KIND_Q4_K {
            // The sums of the eight 32-element sub-blocks (`k_ysum`; at most 32 * 128, so 16 bits
            // hold them), paired as the 16-bit halves of one i32 for `wp`: the pair (2q, 2q + 1)
            // is i32 lane [0, 1, 4, 5][q] of `p`, broadcast by one permute.
            // SAFETY: the 16 sums (32 bytes) are inside the activation block.
            let bs = unsafe { _mm256_loadu_si256(yb[c].add(Q8K_BSUMS) as *const __m256i) };
            let s = _mm256_madd_epi16(bs, _mm256_set1_epi16(1));
            let p = _mm256_packs_epi32(s, s);
            for (q, w) in k.wp.iter().enumerate().take(nsb / 2) {
                let lane = [0, 1, 4, 5][q];
                let v = _mm256_permutevar8x32_epi32(p, _mm256_set1_epi32(lane));
                iw = _mm256_add_epi32(iw, _mm256_madd_epi16(*w, v));
            }
        } else {
            // Sub-blocks of 16: the sums of sub-blocks (2q, 2q + 1) are the i32 at 4q.
            for (q, w) in k.wp.iter().enumerate() {
                // SAFETY: the 16 sums (32 bytes) are inside the activation block.
                let v = unsafe {
                    _mm256_set1_epi32((yb[c].add(Q8K_BSUMS + 4 * q) as *const i32).read_unaligned())
                };
                iw = _mm256_add_epi32(iw, _mm256_madd_epi16(*w, v));
            }
        }
        // SAFETY: acc[c] has 8 floats.
        let mut av = unsafe { _mm256_loadu_ps(acc[c].as_ptr()) };
        let sd = _mm256_mul_ps(k.dv, _mm256_set1_ps(dy));
        if k_offset(KIND) > 0 {
            let v = _mm256_sub_epi32(
                isum[c],
                _mm256_mullo_epi32(iw, _mm256_set1_epi32(k_offset(KIND))),
            );
            av = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), sd, av);
        } else {
            av = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[c]), sd, av);
            let sm = _mm256_mul_ps(k.dminv, _mm256_set1_ps(-dy));
            av = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iw), sm, av);
        }
        // SAFETY: acc[c] has 8 floats.
        unsafe { _mm256_storeu_ps(acc[c].as_mut_ptr(), av) };
    }
}

/// Q8_K's CPU `from_float` (activations of the K-quants): the same bytes as
/// `quantize_row_q8_K_ref` (ggml's reference), with the scaling and rounding done 8 at a time.
pub(crate) fn from_float_q8_k(src: &[f32], dst: &mut [u8]) {
    for (x, y) in src.chunks_exact(256).zip(dst.chunks_exact_mut(Q8K_BYTES)) {
        // SAFETY: only placed in a table after AVX2 was detected; x has 256 values and y 292
        // bytes (chunks_exact).
        unsafe { q8_k_block(x, y) };
    }
}

/// # Safety
/// AVX2 is available; `x` has 256 values and `y` 292 bytes.
#[target_feature(enable = "avx2")]
unsafe fn q8_k_block(x: &[f32], y: &mut [u8]) {
    // The largest magnitude; NaN never wins (max keeps its second operand on NaN).
    let sign = _mm256_set1_ps(-0.0);
    let mut am = _mm256_setzero_ps();
    for c in x.chunks_exact(8) {
        // SAFETY: 8 values.
        let v = unsafe { _mm256_loadu_ps(c.as_ptr()) };
        am = _mm256_max_ps(_mm256_andnot_ps(sign, v), am);
    }
    let mut lanes = [0f32; 8];
    // SAFETY: 8 floats.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), am) };
    let amax = lanes.iter().fold(0f32, |a, &b| if b > a { b } else { a });
    y.fill(0);
    if amax == 0.0 {
        return;
    }
    // The reference keeps the first value reaching the largest magnitude, with its sign.
    let max = x.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
    let iscale = -127.0f32 / max;
    let (is, magic) = (_mm256_set1_ps(iscale), _mm256_set1_ps(12582912.0));
    let (mask, bias) = (_mm256_set1_epi32(0x007f_ffff), _mm256_set1_epi32(0x0040_0000));
    let top = _mm256_set1_epi32(127);
    // packs_epi32 then packs_epi16 leave the 32 bytes as 4-byte groups 0 2 4 6 1 3 5 7.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let (flip, zero) = (_mm256_set1_epi8(-128), _mm256_setzero_si256());
    let mut sums = [0i16; 16];
    let qs = &mut y[Q8K_QS..Q8K_QS + 256];
    for ((c, q), s) in x.chunks_exact(32).zip(qs.chunks_exact_mut(32)).zip(sums.chunks_exact_mut(2))
    {
        let mut n = [_mm256_setzero_si256(); 4];
        for (e, n) in n.iter_mut().enumerate() {
            // SAFETY: 8 values at 8 e of the 32.
            let v = unsafe { _mm256_loadu_ps(c.as_ptr().add(8 * e)) };
            // nearest_int(iscale * v): the product rounded to f32, then the 1.5 * 2^23 trick.
            // |iscale * v| <= 127 and a NaN gives 0..=127 (its quiet bit is the trick's bias),
            // so the packs below never saturate: the bytes are the reference's int8 casts.
            let t = _mm256_castps_si256(_mm256_add_ps(_mm256_mul_ps(is, v), magic));
            *n = _mm256_min_epi32(_mm256_sub_epi32(_mm256_and_si256(t, mask), bias), top);
        }
        let b = _mm256_packs_epi16(_mm256_packs_epi32(n[0], n[1]), _mm256_packs_epi32(n[2], n[3]));
        let b = _mm256_permutevar8x32_epi32(b, order);
        // SAFETY: 32 bytes.
        unsafe { _mm256_storeu_si256(q.as_mut_ptr() as *mut __m256i, b) };
        // Each 16-level sum: the two 8-byte sums of (level + 128) less 16 * 128.
        let sad = _mm256_sad_epu8(_mm256_xor_si256(b, flip), zero);
        let mut w = [0i64; 4];
        // SAFETY: 4 i64.
        unsafe { _mm256_storeu_si256(w.as_mut_ptr() as *mut __m256i, sad) };
        s[0] = (w[0] + w[1] - 16 * 128) as i16;
        s[1] = (w[2] + w[3] - 16 * 128) as i16;
    }
    y[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    y[Q8K_BSUMS..].copy_from_slice(bytemuck::cast_slice(&sums));
}

#[cfg(test)]
mod tests {
    #[test]
    fn q8_k_from_float_matches_the_reference() {
        if !crate::kernels::Isa::Avx2.is_supported() {
            return;
        }
        let mut x: Vec<f32> =
            (0..256 * 8).map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 0.37).collect();
        x[256..512].fill(0.0);
        x[600] = f32::NAN;
        x[700] = 1e30;
        x[1100] = -3000.0;
        x[1101] = 3000.0;
        // A NaN with a payload and an infinity (which makes the block's scale 0).
        x[1600] = f32::from_bits(0x7fa0_1234);
        x[1900] = f32::INFINITY;
        let mut want = vec![0u8; 292 * 8];
        crate::quant::quantize_for_dot(crate::dtype::DType::Q8_K, &x, &mut want).unwrap();
        let mut got = vec![0u8; 292 * 8];
        super::from_float_q8_k(&x, &mut got);
        assert_eq!(got, want);
    }
}
