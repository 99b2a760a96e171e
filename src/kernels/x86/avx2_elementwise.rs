//! AVX2 (+FMA, F16C) elementwise kernels for the LLM ops: add/sub/mul/div, SiLU and fused SwiGLU
//! with software prefetch, GELU through ggml's f16 table with gathers, neox rope rotation,
//! attention score scaling and a row max. Same names and contracts as the twins in `../scalar.rs`;
//! installed by [`plug`], which takes an `Avx2` token (only detection makes one).

use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::avx2::{v_expf, v_expf_poly};
use super::avx2_quants::hsum_float_8;
use crate::kernels::prefetch::prefetch_l1;
use crate::kernels::{KernelTable, scalar, tables};

/// Installs the entries this file implements (called by `plug_avx2`).
pub(crate) fn plug(t: &mut KernelTable, _: super::Avx2) {
    t.add_f32 = add_f32;
    t.sub_f32 = sub_f32;
    t.mul_f32 = mul_f32;
    t.div_f32 = div_f32;
    t.silu_f32 = silu_f32;
    t.gelu_f32 = gelu_f32;
    t.swiglu_f32 = swiglu_f32;
    t.swiglu_f32_stream = swiglu_f32_stream;
    t.rope_rotate_f32 = rope_rotate_f32;
    t.scale_add_f32 = scale_add_f32;
    t.max_f32 = max_f32;
    t.attend_f16 = Some(attend_f16);
}

/// How far ahead (in f32 elements, 4 KiB) the streaming kernels prefetch their inputs. The op
/// tensors of an LLM step (MiB each) come from L3 or memory, and the hardware prefetcher of the
/// machines measured leaves the loads waiting; one prefetch per 64-byte line and input stream.
const PREFETCH: usize = 1024;

/// Prefetches the line `PREFETCH` elements past `p + i` (an address hint: never faults, so the
/// wrapping arithmetic may point past the end of the row).
#[inline(always)]
fn prefetch_ahead(p: *const f32, i: usize) {
    // SAFETY: prefetch only hints the cache; it reads nothing architecturally and never faults,
    // and `wrapping_add` keeps the address computation defined.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(i + PREFETCH) as *const i8) };
}

macro_rules! binary_kernels {
    ($($name:ident => $intr:ident, $op:tt;)*) => {$(
        /// Elementwise kernel over `n` f32 values, two vectors per step with the inputs
        /// prefetched ahead; the same single operation per element as the scalar twin.
        ///
        /// # Safety
        /// As `scalar::add_f32`: valid pointers for `n` elements, exact aliasing only; and the CPU
        /// supports AVX2/FMA/F16C.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(crate) unsafe fn $name(n: usize, dst: *mut f32, a: *const f32, b: *const f32) {
            let mut i = 0;
            while i + 16 <= n {
                prefetch_ahead(a, i);
                prefetch_ahead(b, i);
                // SAFETY: i + 16 <= n keeps both vectors' loads and stores inside the n
                // elements; each lane group is loaded before it is stored (exact aliasing).
                unsafe {
                    let x0 = _mm256_loadu_ps(a.add(i));
                    let y0 = _mm256_loadu_ps(b.add(i));
                    let x1 = _mm256_loadu_ps(a.add(i + 8));
                    let y1 = _mm256_loadu_ps(b.add(i + 8));
                    _mm256_storeu_ps(dst.add(i), $intr(x0, y0));
                    _mm256_storeu_ps(dst.add(i + 8), $intr(x1, y1));
                }
                i += 16;
            }
            while i + 8 <= n {
                // SAFETY: i + 8 <= n.
                unsafe {
                    let x = _mm256_loadu_ps(a.add(i));
                    _mm256_storeu_ps(dst.add(i), $intr(x, _mm256_loadu_ps(b.add(i))));
                }
                i += 8;
            }
            while i < n {
                // SAFETY: i < n.
                unsafe { *dst.add(i) = *a.add(i) $op *b.add(i) };
                i += 1;
            }
        }
    )*};
}
binary_kernels! {
    add_f32 => _mm256_add_ps, +;
    sub_f32 => _mm256_sub_ps, -;
    mul_f32 => _mm256_mul_ps, *;
    div_f32 => _mm256_div_ps, /;
}

/// The fast path of exp(-x) with the operations of `v_expf(0 - x)`, the negation folded into
/// the first two fused multiply-adds (exact, so the same bits; one instruction less per vector),
/// and the mask of the rare lanes (near overflow / underflow) for which it does not hold.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn v_expf_neg_fast(x: __m256) -> (__m256, __m256) {
    let r = _mm256_set1_ps(f32::from_bits(0x4b40_0000)); // 0x1.8p23
    let z = _mm256_fnmadd_ps(x, _mm256_set1_ps(f32::from_bits(0x3fb8_aa3b)), r); // -x / ln2 + r
    let n = _mm256_sub_ps(z, r);
    let b = _mm256_fnmadd_ps(
        n,
        _mm256_set1_ps(f32::from_bits(0x35bf_be8e)), // ln2 low part
        _mm256_fnmsub_ps(n, _mm256_set1_ps(f32::from_bits(0x3f31_7200)), x), // -x - n ln2 high
    );
    let e = _mm256_slli_epi32::<23>(_mm256_castps_si256(z));
    let k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1.0))));
    let abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
    let c = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(126.0)));
    let j = v_expf_poly(b);
    (_mm256_fmadd_ps(j, k, k), _mm256_castsi256_ps(c))
}

/// exp(-x), same bits as `v_expf(0 - x)`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn v_expf_neg(x: __m256) -> __m256 {
    let (e, c) = v_expf_neg_fast(x);
    if _mm256_movemask_ps(c) == 0 {
        return e;
    }
    // Rare lanes near overflow/underflow: the full `v_expf` handles them (same bits).
    v_expf(_mm256_sub_ps(_mm256_setzero_ps(), x))
}

/// silu of two vectors with one test for the rare lanes: the fast part of `v_expf_neg` for
/// both, and the full `v_silu` for both when any lane of either needs it (same bits).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn v_silu2(x0: __m256, x1: __m256) -> (__m256, __m256) {
    let (e0, c0) = v_expf_neg_fast(x0);
    let (e1, c1) = v_expf_neg_fast(x1);
    if _mm256_movemask_ps(_mm256_or_ps(c0, c1)) != 0 {
        return (v_silu(x0), v_silu(x1));
    }
    let one = _mm256_set1_ps(1.0);
    (_mm256_div_ps(x0, _mm256_add_ps(one, e0)), _mm256_div_ps(x1, _mm256_add_ps(one, e1)))
}

/// silu(x) = x / (1 + exp(-x)) over one vector, ggml's `ggml_v_silu` operations.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn v_silu(x: __m256) -> __m256 {
    _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), v_expf_neg(x)))
}

/// SiLU over `n` f32 (the bits of ggml's `x / (1 + v_expf(-x))` per vector), two vectors per step, input
/// prefetched ahead.
///
/// # Safety
/// As `scalar::silu_f32`, and the CPU supports AVX2/FMA/F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn silu_f32(n: usize, dst: *mut f32, a: *const f32) {
    let mut i = 0;
    while i + 16 <= n {
        prefetch_ahead(a, i);
        // SAFETY: i + 16 <= n keeps both groups' loads and stores inside the n elements; loads
        // precede stores (exact aliasing is fine).
        unsafe {
            let (s0, s1) = v_silu2(_mm256_loadu_ps(a.add(i)), _mm256_loadu_ps(a.add(i + 8)));
            _mm256_storeu_ps(dst.add(i), s0);
            _mm256_storeu_ps(dst.add(i + 8), s1);
        }
        i += 16;
    }
    while i + 8 <= n {
        // SAFETY: i + 8 <= n.
        unsafe { _mm256_storeu_ps(dst.add(i), v_silu(_mm256_loadu_ps(a.add(i)))) };
        i += 8;
    }
    while i < n {
        // SAFETY: i < n.
        unsafe { *dst.add(i) = scalar::silu(*a.add(i)) };
        i += 1;
    }
}

/// SwiGLU in one pass: silu(x) = x / (1 + exp(-x)) with ggml's vector exp, times g (the same
/// operations, in the same order, as the silu kernel followed by the multiply kernel); two
/// vectors per step, both inputs prefetched ahead.
///
/// # Safety
/// As `scalar::swiglu_f32`, and the CPU supports AVX2/FMA/F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn swiglu_f32(n: usize, dst: *mut f32, x: *const f32, g: *const f32) {
    // SAFETY: the caller's guarantees.
    unsafe { swiglu::<false>(n, dst, x, g) }
}

/// [`swiglu_f32`] writing with non-temporal stores wherever the destination is 32-byte aligned,
/// for outputs larger than the caches (`ops::glu`): the same bits, without reading every
/// destination line before writing it. 11008 x 512 on 2 cores of an AMD Zen 3, old and new
/// binaries alternating (`bench -- op swiglu 2 50|100`, 26 rounds in three runs): median 1.12x
/// (rounds 0.75-1.50); on one core, bound by the arithmetic, 1.01x.
///
/// # Safety
/// As [`swiglu_f32`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn swiglu_f32_stream(n: usize, dst: *mut f32, x: *const f32, g: *const f32) {
    // SAFETY: the caller's guarantees.
    unsafe { swiglu::<true>(n, dst, x, g) };
    // The streamed stores are weakly ordered: they reach memory before this row is reported
    // done (the pool's barrier comes after).
    _mm_sfence();
}

/// The SwiGLU loop; `STREAM`: the main steps' stores are non-temporal where aligned.
///
/// # Safety
/// As [`swiglu_f32`].
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn swiglu<const STREAM: bool>(n: usize, dst: *mut f32, x: *const f32, g: *const f32) {
    let mut i = 0;
    while i + 16 <= n {
        prefetch_ahead(x, i);
        prefetch_ahead(g, i);
        // SAFETY: i + 16 <= n keeps both groups' loads and stores inside the n elements; the
        // loads of a lane group precede its store (exact aliasing is fine); a streamed store
        // writes the 32 bytes at dst + i (and at dst + i + 8), which it checked are aligned.
        unsafe {
            let (s0, s1) = v_silu2(_mm256_loadu_ps(x.add(i)), _mm256_loadu_ps(x.add(i + 8)));
            let y0 = _mm256_mul_ps(s0, _mm256_loadu_ps(g.add(i)));
            let y1 = _mm256_mul_ps(s1, _mm256_loadu_ps(g.add(i + 8)));
            if STREAM && (dst.add(i) as usize).is_multiple_of(32) {
                _mm256_stream_ps(dst.add(i), y0);
                _mm256_stream_ps(dst.add(i + 8), y1);
            } else {
                _mm256_storeu_ps(dst.add(i), y0);
                _mm256_storeu_ps(dst.add(i + 8), y1);
            }
        }
        i += 16;
    }
    while i + 8 <= n {
        // SAFETY: i + 8 <= n.
        unsafe {
            let s = v_silu(_mm256_loadu_ps(x.add(i)));
            _mm256_storeu_ps(dst.add(i), _mm256_mul_ps(s, _mm256_loadu_ps(g.add(i))));
        }
        i += 8;
    }
    while i < n {
        // SAFETY: i < n.
        unsafe { *dst.add(i) = scalar::silu(*x.add(i)) * *g.add(i) };
        i += 1;
    }
}

/// ggml's f16 GELU table widened to f32 (65536 entries, indexed by the f16 bits of the input), so
/// one 32-bit gather per lane replaces the table load and the f16 -> f32 conversion.
fn gelu_table_f32() -> &'static [f32] {
    static T: OnceLock<Box<[f32]>> = OnceLock::new();
    T.get_or_init(|| {
        tables::gelu_table().iter().map(|&h| crate::quant::util::fp16_to_fp32(h)).collect()
    })
}

/// GELU with ggml's semantics (`ggml_vec_gelu_f32` with GGML_GELU_FP16): 0 for x <= -10, x for
/// x >= 10, else the table entry of x rounded to f16 (F16C, round to nearest even).
///
/// # Safety
/// As `scalar::gelu_f32`, and the CPU supports AVX2/FMA/F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn gelu_f32(n: usize, dst: *mut f32, a: *const f32) {
    let t = gelu_table_f32();
    debug_assert_eq!(t.len(), 65536);
    let (lo, hi) = (_mm256_set1_ps(-10.0), _mm256_set1_ps(10.0));
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n keeps the load and the store inside the n elements; the gather
        // indices are f16 bit patterns zero-extended to 32 bits, so below 65536 = t.len().
        unsafe {
            let x = _mm256_loadu_ps(a.add(i));
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
            let v = _mm256_i32gather_ps::<4>(t.as_ptr(), _mm256_cvtepu16_epi32(h));
            let v = _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LE_OQ>(x, lo), v);
            let v = _mm256_blendv_ps(v, x, _mm256_cmp_ps::<_CMP_GE_OQ>(x, hi));
            _mm256_storeu_ps(dst.add(i), v);
        }
        i += 8;
    }
    while i < n {
        // SAFETY: i < n.
        unsafe { *dst.add(i) = scalar::gelu(*a.add(i)) };
        i += 1;
    }
}

/// Neox-style pair rotation without FMA (bit-identical to the scalar twin).
///
/// # Safety
/// As `scalar::rope_rotate_f32`, and the CPU supports AVX2/FMA/F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn rope_rotate_f32(
    n: usize,
    d0: *mut f32,
    d1: *mut f32,
    x0: *const f32,
    x1: *const f32,
    cos: *const f32,
    sin: *const f32,
) {
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n keeps every 8-lane access inside the n elements; all four loads of
        // a lane group precede its two stores.
        unsafe {
            let (a, b) = (_mm256_loadu_ps(x0.add(i)), _mm256_loadu_ps(x1.add(i)));
            let (c, s) = (_mm256_loadu_ps(cos.add(i)), _mm256_loadu_ps(sin.add(i)));
            let r0 = _mm256_sub_ps(_mm256_mul_ps(a, c), _mm256_mul_ps(b, s));
            let r1 = _mm256_add_ps(_mm256_mul_ps(a, s), _mm256_mul_ps(b, c));
            _mm256_storeu_ps(d0.add(i), r0);
            _mm256_storeu_ps(d1.add(i), r1);
        }
        i += 8;
    }
    if i < n {
        // SAFETY: the remaining n - i elements of every array, same contract.
        unsafe {
            scalar::rope_rotate_f32(
                n - i,
                d0.add(i),
                d1.add(i),
                x0.add(i),
                x1.add(i),
                cos.add(i),
                sin.add(i),
            )
        };
    }
}

/// dst = a * scale (+ dst when `add`): multiply then add, as the scalar twin.
///
/// # Safety
/// As `scalar::scale_add_f32`, and the CPU supports AVX2/FMA/F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn scale_add_f32(n: usize, dst: *mut f32, a: *const f32, scale: f32, add: bool) {
    let s = _mm256_set1_ps(scale);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n keeps the accesses inside the n elements.
        unsafe {
            let x = _mm256_mul_ps(_mm256_loadu_ps(a.add(i)), s);
            let x = if add { _mm256_add_ps(x, _mm256_loadu_ps(dst.add(i))) } else { x };
            _mm256_storeu_ps(dst.add(i), x);
        }
        i += 8;
    }
    if i < n {
        // SAFETY: the remaining n - i elements, same contract.
        unsafe { scalar::scale_add_f32(n - i, dst.add(i), a.add(i), scale, add) };
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn max_f32_avx2(x: &[f32]) -> f32 {
    let mut m = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut c = x.chunks_exact(8);
    for v in &mut c {
        // SAFETY: the chunk holds 8 f32. max_ps returns its second operand when the first is
        // NaN, so NaN inputs are skipped, as `f32::max` does.
        m = _mm256_max_ps(unsafe { _mm256_loadu_ps(v.as_ptr()) }, m);
    }
    let mut lanes = [0f32; 8];
    // SAFETY: lanes holds 8 f32.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), m) };
    lanes.iter().chain(c.remainder()).fold(f32::NEG_INFINITY, |a, &b| a.max(b))
}

/// Largest of `x` (NaN ignored); max is exact, so the order does not change the value.
fn max_f32(x: &[f32]) -> f32 {
    // SAFETY: private, installed only by `plug`, which takes an `Avx2` token (AVX2/FMA/F16C).
    unsafe { max_f32_avx2(x) }
}

/// KV rows ahead that the decode loop prefetches (K and V stream from memory in a decode step).
const ATTEND_PF_ROWS: usize = 16;

/// flash_attn_ext's decode loop over F16 K and V in blocks of 8 positions (the AVX-512 tier's
/// loop at 256 bits): the 8 scores (8 lanes per K row, reduced per row), one rescale of the
/// accumulator when the block raises the max, the probabilities with ggml's vector exp, and the
/// V rows accumulated into up to 64 accumulator floats held in registers across the block. Head
/// sizes are multiples of 16.
///
/// # Safety
/// As [`crate::kernels::AttendF16Fn`]; `q.len()` and `acc.len()` are multiples of 16; the CPU
/// supports AVX2/FMA/F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn attend_f16(
    a: &crate::kernels::AttendF16<'_>,
    m: &mut f32,
    s: &mut f32,
    acc: &mut [f32],
) {
    let (dk, dv) = (a.q.len(), acc.len());
    debug_assert!(dk % 16 == 0 && dv % 16 == 0);
    let q = a.q.as_ptr();
    let mut j0 = 0;
    while j0 < a.n {
        let nb = (a.n - j0).min(8);
        let mut sc = [f32::NEG_INFINITY; 8];
        for (j, x) in sc.iter_mut().enumerate().take(nb) {
            let pf = j0 + j + ATTEND_PF_ROWS;
            if pf < a.n {
                prefetch_l1(a.k.wrapping_add(pf * a.k_stride), 2 * dk);
                prefetch_l1(a.v.wrapping_add(pf * a.v_stride), 2 * dv);
            }
            let mv = a.mask.map_or(0.0, |mk| mk[j0 + j]);
            if mv == f32::NEG_INFINITY {
                continue;
            }
            // SAFETY: row j0 + j < n of K holds dk halves (the contract).
            let kr = unsafe { a.k.add((j0 + j) * a.k_stride) as *const u16 };
            let (mut d0, mut d1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let mut i = 0;
            while i < dk {
                // SAFETY: dk is a multiple of 16, so i + 16 <= dk halves of the K row and
                // floats of q.
                unsafe {
                    let k0 = _mm256_cvtph_ps(_mm_loadu_si128(kr.add(i).cast()));
                    let k1 = _mm256_cvtph_ps(_mm_loadu_si128(kr.add(i + 8).cast()));
                    d0 = _mm256_fmadd_ps(k0, _mm256_loadu_ps(q.add(i)), d0);
                    d1 = _mm256_fmadd_ps(k1, _mm256_loadu_ps(q.add(i + 8)), d1);
                }
                i += 16;
            }
            let mut v = hsum_float_8(_mm256_add_ps(d0, d1)) * a.scale;
            if a.softcap != 0.0 {
                v = a.softcap * v.tanh();
            }
            *x = v + mv;
        }
        if !crate::kernels::attend_block_max(&sc[..nb], m, s, acc) {
            j0 += nb;
            continue;
        }
        // exp(x - m) = exp(-(m - x)); masked lanes (x = -inf) give exp(-inf) = 0.
        // SAFETY: sc holds 8 floats.
        let xs = unsafe { _mm256_loadu_ps(sc.as_ptr()) };
        let p = v_expf(_mm256_sub_ps(xs, _mm256_set1_ps(*m)));
        *s += hsum_float_8(p);
        let mut pa = [0f32; 8];
        // SAFETY: pa holds 8 floats.
        unsafe { _mm256_storeu_ps(pa.as_mut_ptr(), p) };
        // SAFETY: row j0 of V and the following nb - 1 rows exist (j0 + nb <= n).
        let v0 = unsafe { a.v.add(j0 * a.v_stride) };
        let mut c0 = 0;
        while c0 < dv {
            let w = ((dv - c0) / 8).min(8);
            // SAFETY: c0 + 8 w <= dv for acc and every V row (rows of dv halves).
            unsafe {
                match w {
                    8 => v_chunk::<8>(acc, c0, &pa[..nb], v0, a.v_stride),
                    6 => v_chunk::<6>(acc, c0, &pa[..nb], v0, a.v_stride),
                    4 => v_chunk::<4>(acc, c0, &pa[..nb], v0, a.v_stride),
                    _ => v_chunk::<2>(acc, c0, &pa[..nb], v0, a.v_stride),
                }
            }
            c0 += 8 * w;
        }
        j0 += nb;
    }
}

/// `acc[c0 .. c0 + 8 W] += sum_j p[j] * V row j` (F16 rows `stride` bytes apart from `v`), the
/// `W` accumulator vectors held in registers across the rows.
///
/// # Safety
/// `c0 + 8 W <= acc.len()` and every one of the `p.len()` V rows holds `c0 + 8 W` halves; the
/// CPU supports AVX2/FMA/F16C.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn v_chunk<const W: usize>(
    acc: &mut [f32],
    c0: usize,
    p: &[f32],
    v: *const u8,
    stride: usize,
) {
    let pa = acc.as_mut_ptr();
    let mut r = [_mm256_setzero_ps(); W];
    for (t, x) in r.iter_mut().enumerate() {
        // SAFETY: c0 + 8 W <= acc.len() (the contract).
        *x = unsafe { _mm256_loadu_ps(pa.add(c0 + 8 * t)) };
    }
    for (j, &pj) in p.iter().enumerate() {
        let pv = _mm256_set1_ps(pj);
        // SAFETY: row j of V holds c0 + 8 W halves (the contract).
        let vr = unsafe { v.add(j * stride) as *const u16 };
        for (t, x) in r.iter_mut().enumerate() {
            // SAFETY: as above, halves c0 + 8 t .. c0 + 8 t + 8 of the row.
            let h = unsafe { _mm256_cvtph_ps(_mm_loadu_si128(vr.add(c0 + 8 * t).cast())) };
            *x = _mm256_fmadd_ps(h, pv, *x);
        }
    }
    for (t, x) in r.iter().enumerate() {
        // SAFETY: as for the loads.
        unsafe { _mm256_storeu_ps(pa.add(c0 + 8 * t), *x) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn avx2() -> bool {
        crate::kernels::Isa::Avx2.is_supported()
    }

    fn data(n: usize, seed: u32, amp: f32) -> Vec<f32> {
        let mut r = crate::testdata::Xorshift32::new(seed);
        (0..n).map(|_| r.next_f32() * amp).collect()
    }

    #[test]
    fn swiglu_matches_silu_then_mul_bitwise_and_scalar_closely() {
        if !avx2() {
            return;
        }
        for n in [0usize, 1, 7, 8, 9, 31, 100, 4099] {
            let x = data(n, 1, 12.0);
            let g = data(n, 2, 3.0);
            let (mut a, mut b, mut c) = (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
            // SAFETY: every buffer holds n f32; AVX2 checked above.
            unsafe {
                swiglu_f32(n, a.as_mut_ptr(), x.as_ptr(), g.as_ptr());
                b.copy_from_slice(&silu_reference(&x));
                mul_f32(n, b.as_mut_ptr(), b.as_ptr(), g.as_ptr());
                scalar::swiglu_f32(n, c.as_mut_ptr(), x.as_ptr(), g.as_ptr());
            }
            assert_eq!(
                a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                b.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
            for (p, q) in a.iter().zip(&c) {
                assert!((p - q).abs() <= 1e-6 * q.abs().max(1e-3), "swiglu {p} vs {q}");
            }
            // In place over x.
            let mut y = x.clone();
            // SAFETY: as above; dst equals x exactly.
            unsafe { swiglu_f32(n, y.as_mut_ptr(), y.as_ptr(), g.as_ptr()) };
            assert_eq!(y, a);
            // The streaming form, into a destination at every offset from a 32-byte boundary
            // (streamed steps where aligned, plain stores elsewhere).
            let mut buf = vec![0f32; n + 16];
            let base = buf.as_ptr().align_offset(32);
            for off in 0..8 {
                let d = &mut buf[base + off..base + off + n];
                // SAFETY: as above; `d` holds n f32 apart from x and g.
                unsafe { swiglu_f32_stream(n, d.as_mut_ptr(), x.as_ptr(), g.as_ptr()) };
                let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(d), bits(&a), "stream n={n} off={off}");
            }
        }
    }

    /// SiLU by ggml's plain vector formula, one vector at a time (`x / (1 + v_expf(0 - x))`,
    /// the tail through `scalar::silu`): the bits the fast kernels must give.
    fn silu_reference(x: &[f32]) -> Vec<f32> {
        #[target_feature(enable = "avx2,fma,f16c")]
        fn run(x: &[f32], out: &mut [f32]) {
            let n8 = x.len() / 8 * 8;
            for (o, c) in out[..n8].chunks_exact_mut(8).zip(x.chunks_exact(8)) {
                // SAFETY: both chunks hold 8 f32.
                unsafe {
                    let v = _mm256_loadu_ps(c.as_ptr());
                    let e = v_expf(_mm256_sub_ps(_mm256_setzero_ps(), v));
                    let y = _mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0), e));
                    _mm256_storeu_ps(o.as_mut_ptr(), y);
                }
            }
            for i in n8..x.len() {
                out[i] = scalar::silu(x[i]);
            }
        }
        assert!(avx2(), "silu_reference needs AVX2");
        let mut out = vec![0f32; x.len()];
        // SAFETY: AVX2, FMA and F16C checked just above.
        unsafe { run(x, &mut out) };
        out
    }

    #[test]
    fn binary_match_scalar_and_silu_matches_the_plain_formula_bitwise() {
        if !avx2() {
            return;
        }
        let mut x = data(5000, 8, 30.0);
        // Lanes on the slow path of the exp (|x| past 87), infinities and signed zeros.
        x.extend([-0.0, 0.0, 88.0, -88.0, 90.0, -90.0, 104.0, -104.0, 200.0, -200.0, 1e-30]);
        x.extend([f32::INFINITY, f32::NEG_INFINITY, 87.5, -87.5, 126.0, -126.0]);
        let y = data(x.len(), 9, 4.0);
        type Pair = (BinaryF32, BinaryF32);
        use crate::kernels::BinaryF32;
        let pairs: [Pair; 4] = [
            (add_f32, scalar::add_f32),
            (sub_f32, scalar::sub_f32),
            (mul_f32, scalar::mul_f32),
            (div_f32, scalar::div_f32),
        ];
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        for n in [0usize, 1, 7, 8, 15, 16, 17, 33, 4096, x.len()] {
            let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
            for (new, old) in pairs {
                // SAFETY: buffers hold n f32; AVX2 checked above.
                unsafe {
                    new(n, a.as_mut_ptr(), x.as_ptr(), y.as_ptr());
                    old(n, b.as_mut_ptr(), x.as_ptr(), y.as_ptr());
                }
                assert_eq!(bits(&a), bits(&b), "n={n}");
            }
            // SAFETY: as above.
            unsafe { silu_f32(n, a.as_mut_ptr(), x.as_ptr()) };
            assert_eq!(bits(&a), bits(&silu_reference(&x[..n])), "silu n={n}");
            // In place, as the ops run them on a reused buffer.
            let mut z = x[..n].to_vec();
            // SAFETY: dst equals the source exactly.
            unsafe { silu_f32(n, z.as_mut_ptr(), z.as_ptr()) };
            assert_eq!(bits(&z), bits(&a));
        }
    }

    #[test]
    fn gelu_gather_matches_scalar_bitwise() {
        if !avx2() {
            return;
        }
        let mut x = data(5000, 3, 14.0);
        x.extend([-10.0, 10.0, -10.001, 10.001, 0.0, -0.0, 1e-8, 65504.0, -65504.0, 1e6, -1e6]);
        x.extend([f32::INFINITY, f32::NEG_INFINITY, 9.999, -9.999, 65520.0, -65520.0]);
        for n in [0usize, 3, 8, 13, x.len()] {
            let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
            // SAFETY: buffers hold n f32; AVX2 checked above.
            unsafe {
                gelu_f32(n, a.as_mut_ptr(), x.as_ptr());
                scalar::gelu_f32(n, b.as_mut_ptr(), x.as_ptr());
            }
            for i in 0..n {
                assert_eq!(a[i].to_bits(), b[i].to_bits(), "gelu({})", x[i]);
            }
        }
    }

    #[test]
    fn rope_rotate_scale_add_and_max_match_scalar_bitwise() {
        if !avx2() {
            return;
        }
        for n in [0usize, 1, 5, 8, 17, 64, 67] {
            let (x0, x1) = (data(n, 4, 2.0), data(n, 5, 2.0));
            let (c, s) = (data(n, 6, 1.0), data(n, 7, 1.0));
            let (mut a0, mut a1, mut b0, mut b1) =
                (vec![0f32; n], vec![0f32; n], vec![0f32; n], vec![0f32; n]);
            // SAFETY: buffers hold n f32; AVX2 checked above.
            unsafe {
                rope_rotate_f32(
                    n,
                    a0.as_mut_ptr(),
                    a1.as_mut_ptr(),
                    x0.as_ptr(),
                    x1.as_ptr(),
                    c.as_ptr(),
                    s.as_ptr(),
                );
                scalar::rope_rotate_f32(
                    n,
                    b0.as_mut_ptr(),
                    b1.as_mut_ptr(),
                    x0.as_ptr(),
                    x1.as_ptr(),
                    c.as_ptr(),
                    s.as_ptr(),
                );
            }
            assert_eq!(a0, b0);
            assert_eq!(a1, b1);
            for add in [false, true] {
                let (mut p, mut q) = (x1.clone(), x1.clone());
                // SAFETY: buffers hold n f32; AVX2 checked above.
                unsafe {
                    scale_add_f32(n, p.as_mut_ptr(), x0.as_ptr(), 0.37, add);
                    scalar::scale_add_f32(n, q.as_mut_ptr(), x0.as_ptr(), 0.37, add);
                }
                assert_eq!(p, q);
            }
            let mut m = x0.clone();
            if n > 2 {
                m[1] = f32::NAN;
                m[n - 1] = f32::NEG_INFINITY;
            }
            assert_eq!(max_f32(&m).to_bits(), scalar::max_f32(&m).to_bits(), "n={n}");
        }
        let all_inf = [f32::NEG_INFINITY; 19];
        assert_eq!(max_f32(&all_inf), f32::NEG_INFINITY);
    }
}
