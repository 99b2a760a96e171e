//! AVX-512 tier (needs AVX-512 F, BW, DQ and VL on top of the AVX2 tier; checked once by
//! `Isa::Avx512.is_supported()` before [`plug`] installs anything). Same names and contracts as
//! the twins in `../scalar.rs` and `avx2_elementwise.rs`.
//!
//! Every kernel here gives the same bits as the AVX2 tier's: the binary kernels do one IEEE
//! operation per element, and SiLU / SwiGLU run the AVX2 tier's vector exp (ggml's
//! `ggml_v_expf` operations) on 16 lanes, with the AVX2 tier's scalar tail for the last `n % 8`
//! elements. (ggml's own AVX-512 build forms 2^n with `vscalefps` instead, which can differ from
//! its AVX2 build in the last bit; both are within test-backend-ops' limits.)

use std::arch::x86_64::*;

use super::avx2_quants::{bf16_tail, f32x8_reduce, hsum_float_8};
use crate::dtype::DType;
use crate::kernels::prefetch::prefetch_l1;
use crate::kernels::sgemm::{self, SG_MR, SG_NR};
use crate::kernels::{AttendF16, KernelTable, scalar};
use crate::quant::util::fp16_to_fp32;

/// Overwrites the entries this tier implements (called after the AVX2 tier's `plug_avx2`).
pub(crate) fn plug(t: &mut KernelTable, cpu: super::Avx512) {
    t.add_f32 = add_f32;
    t.sub_f32 = sub_f32;
    t.mul_f32 = mul_f32;
    t.div_f32 = div_f32;
    t.silu_f32 = silu_f32;
    t.swiglu_f32 = swiglu_f32;
    t.swiglu_f32_stream = swiglu_f32_stream;
    t.mad_f16 = mad_f16;
    t.mad_f32 = mad_f32;
    t.set_vec_dot(DType::F32, vec_dot_f32);
    t.set_vec_dot_stream(DType::F32, vec_dot_f32_stream);
    t.set_vec_dot(DType::F16, vec_dot_f16);
    t.set_gemm(DType::F32, gemm_float::<EF32>);
    t.set_gemm(DType::F16, gemm_float::<EF16>);
    t.set_gemm(DType::BF16, gemm_float::<EBF16>);
    t.attend_f16 = Some(attend_f16_avx512);
    t.sgemm2 = Some(sgemm_12x16);
    t.sgemm22 = Some(sgemm_12x32);
    if std::arch::is_x86_feature_detected!("avx512bf16") {
        t.sgemm_bf16 = Some((sgemm_bf16_6x16, sgemm_bf16_12x16, sgemm_bf16_12x32));
        // BF16 mul_mat with few columns by `vdpbf16ps` as well, in the order of ggml's
        // AVX512_BF16 build (`bf16_dp_tile`); the public `vec_dot` keeps ggml's AVX2 order.
        // 4096 x 1 x 14336 on Zen 4, 2 threads, 5 alternating rounds, medians: the AVX2 dot
        // 5.06 ms, this one 4.82 (ggml 4.58); neither a prefetch ahead nor a bit-exact AVX-512
        // form of the AVX2 order (64-byte loads widened by unpacks) was faster.
        t.set_vec_dot_stream_own_order(DType::BF16, vec_dot_bf16_dp);
        t.set_gemm(DType::BF16, gemm_float::<EBF16_DP>);
    }
    super::avx2_quants::plug_masked(t, cpu);
    super::avx512_kquants::plug(t, cpu);
    super::avx2_quants::plug_vnni_dots(t, cpu);
    // The AVX2 repacked K-quant kernels with the decode prefetch further ahead: on Zen 5,
    // 4096x14336 repacked decode, 2 threads, alternating binaries: q6_K 86-94 GFLOPS with the
    // AVX2 tier's distance (the current block) -> 163-173 at 8 blocks (4 and 16 alike), q4_K
    // 202-213 (2 blocks) -> 244-274 at 8; q2_K and tq2_0 unchanged within the noise.
    t.set_repack(
        DType::Q6_K,
        super::avx2_repack::kq_kernel::<{ crate::kernels::repack::KIND_Q6_K }, RK_AHEAD>,
    );
    t.set_repack(
        DType::Q4_K,
        super::avx2_repack::kq_kernel::<{ crate::kernels::repack::KIND_Q4_K }, RK_AHEAD>,
    );
    t.set_repack(
        DType::Q2_K,
        super::avx2_repack::kq_kernel::<{ crate::kernels::repack::KIND_Q2_K }, RK_AHEAD>,
    );
    t.set_repack(
        DType::TQ2_0,
        super::avx2_repack::kq_kernel::<{ crate::kernels::repack::KIND_TQ2_0 }, RK_AHEAD>,
    );
    if std::arch::is_x86_feature_detected!("avx512vnni") {
        t.igemm = Some(super::avx512_igemm::VNNI);
        super::avx512_quants::plug_vnni(t);
        super::avx512_kquants::plug_vnni(t);
        super::avx512_iq::plug(t);
        super::avx512_gemm::plug(t, cpu);
        super::avx512_repack::plug(t, cpu);
    }
    t.set_to_f32(DType::Q4_0, dequantize_q4_0);
    t.set_to_f32(DType::Q8_0, dequantize_q8_0);
}

/// The lanes `[0, k)` of a 16-lane mask, `k <= 16`.
#[inline(always)]
fn first_lanes(k: usize) -> __mmask16 {
    debug_assert!(k <= 16);
    ((1u32 << k) - 1) as __mmask16
}

macro_rules! binary_kernels {
    ($($name:ident => $intr:ident;)*) => {$(
        /// Elementwise kernel over `n` f32 values, two 16-lane vectors per step and a masked
        /// tail; one IEEE operation per element (the bits of the scalar and AVX2 twins). No
        /// software prefetch: on Zen 5 the AVX2 tier's 4 KiB-ahead prefetch cost 5-15% (add, mul,
        /// swiglu 4096x512 / 11008x512, alternating runs); the hardware prefetcher keeps up.
        ///
        /// # Safety
        /// As `scalar::add_f32`: valid pointers for `n` elements, exact aliasing only; and the CPU
        /// supports the AVX-512 tier.
        #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
        pub(crate) unsafe fn $name(n: usize, dst: *mut f32, a: *const f32, b: *const f32) {
            let mut i = 0;
            while i + 32 <= n {
                // SAFETY: i + 32 <= n keeps both vectors' loads and stores inside the n
                // elements; each lane group is loaded before it is stored (exact aliasing).
                unsafe {
                    let x0 = _mm512_loadu_ps(a.add(i));
                    let y0 = _mm512_loadu_ps(b.add(i));
                    let x1 = _mm512_loadu_ps(a.add(i + 16));
                    let y1 = _mm512_loadu_ps(b.add(i + 16));
                    _mm512_storeu_ps(dst.add(i), $intr(x0, y0));
                    _mm512_storeu_ps(dst.add(i + 16), $intr(x1, y1));
                }
                i += 32;
            }
            while i + 16 <= n {
                // SAFETY: i + 16 <= n.
                unsafe {
                    let x = _mm512_loadu_ps(a.add(i));
                    _mm512_storeu_ps(dst.add(i), $intr(x, _mm512_loadu_ps(b.add(i))));
                }
                i += 16;
            }
            if i < n {
                let m = first_lanes(n - i);
                // SAFETY: the mask covers lanes i..n only; masked-off lanes are neither read
                // nor written (no fault past the end).
                unsafe {
                    let x = _mm512_maskz_loadu_ps(m, a.add(i));
                    let y = _mm512_maskz_loadu_ps(m, b.add(i));
                    _mm512_mask_storeu_ps(dst.add(i), m, $intr(x, y));
                }
            }
        }
    )*};
}
binary_kernels! {
    add_f32 => _mm512_add_ps;
    sub_f32 => _mm512_sub_ps;
    mul_f32 => _mm512_mul_ps;
    div_f32 => _mm512_div_ps;
}

/// p(b) - 1 of ggml's vector expf (`avx2::v_expf_poly` on 16 lanes).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
#[inline]
fn v_expf_poly(b: __m512) -> __m512 {
    let c = |bits: u32| _mm512_set1_ps(f32::from_bits(bits));
    let u = _mm512_mul_ps(b, b);
    _mm512_fmadd_ps(
        _mm512_fmadd_ps(
            _mm512_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)),
            u,
            _mm512_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)),
        ),
        u,
        _mm512_mul_ps(c(0x3f7f_fff6), b),
    )
}

/// exp(-x) on 16 lanes with the operations of `avx2_elementwise::v_expf_neg` (the negation folded
/// into the first two fused multiply-adds, exact), including the rare lanes near overflow and
/// underflow (`avx2::v_expf`'s second path, lane for lane through masks).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
#[inline]
fn v_expf_neg(x: __m512) -> __m512 {
    let c = |bits: u32| _mm512_set1_ps(f32::from_bits(bits));
    let r = c(0x4b40_0000); // 0x1.8p23
    let z = _mm512_fnmadd_ps(x, c(0x3fb8_aa3b), r); // -x / ln2 + r
    let n = _mm512_sub_ps(z, r);
    let b = _mm512_fnmadd_ps(n, c(0x35bf_be8e), _mm512_fnmsub_ps(n, c(0x3f31_7200), x));
    let e = _mm512_slli_epi32::<23>(_mm512_castps_si512(z));
    let k = _mm512_castsi512_ps(_mm512_add_epi32(e, _mm512_castps_si512(_mm512_set1_ps(1.0))));
    let abs_n = _mm512_abs_ps(n);
    let rare = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(abs_n, _mm512_set1_ps(126.0));
    let j = v_expf_poly(b);
    let fast = _mm512_fmadd_ps(j, k, k);
    if rare == 0 {
        return fast;
    }
    // avx2::v_expf's rare path for the argument -x (whose n, z, b and e are the ones above).
    let le0 = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, _mm512_setzero_ps());
    let g = _mm512_maskz_mov_epi32(le0, _mm512_set1_epi32(0x8200_0000u32 as i32));
    let s1 = _mm512_castsi512_ps(_mm512_add_epi32(g, _mm512_set1_epi32(0x7f00_0000)));
    let s2 = _mm512_castsi512_ps(_mm512_sub_epi32(e, g));
    let huge = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(abs_n, _mm512_set1_ps(192.0));
    let scaled = _mm512_mul_ps(_mm512_fmadd_ps(s2, j, s2), s1);
    let v = _mm512_mask_blend_ps(rare, fast, scaled);
    _mm512_mask_blend_ps(huge, v, _mm512_mul_ps(s1, s1))
}

/// silu(x) = x / (1 + exp(-x)) on 16 lanes (ggml's `ggml_v_silu` operations).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
#[inline]
fn v_silu(x: __m512) -> __m512 {
    _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0), v_expf_neg(x)))
}

/// Runs `f` over `[0, n)` in steps of 32 and 16 lanes, with a masked step for the lanes below
/// `n & !7`, and `tail` for the last `n % 8` elements: the split of the AVX2 tier (vector exp
/// for every element of a whole 8-lane group, the scalar function after), so the bits agree.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
#[inline]
fn silu_like(
    n: usize,
    mut step2: impl FnMut(usize),
    mut step_masked: impl FnMut(usize, __mmask16),
    mut tail: impl FnMut(usize),
) {
    let n8 = n & !7;
    let mut i = 0;
    while i + 32 <= n8 {
        step2(i);
        i += 32;
    }
    while i < n8 {
        step_masked(i, first_lanes((n8 - i).min(16)));
        i += 16;
    }
    for k in n8..n {
        tail(k);
    }
}

/// SiLU over `n` f32, bitwise the AVX2 tier's `silu_f32`.
///
/// # Safety
/// As `scalar::silu_f32`, and the CPU supports the AVX-512 tier.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn silu_f32(n: usize, dst: *mut f32, a: *const f32) {
    silu_like(
        n,
        |i| {
            // SAFETY: silu_like passes i + 32 <= n; loads precede stores (exact aliasing).
            unsafe {
                let s0 = v_silu(_mm512_loadu_ps(a.add(i)));
                let s1 = v_silu(_mm512_loadu_ps(a.add(i + 16)));
                _mm512_storeu_ps(dst.add(i), s0);
                _mm512_storeu_ps(dst.add(i + 16), s1);
            }
        },
        |i, m| {
            // SAFETY: the mask covers lanes below n only; masked-off lanes are not accessed.
            unsafe {
                let s = v_silu(_mm512_maskz_loadu_ps(m, a.add(i)));
                _mm512_mask_storeu_ps(dst.add(i), m, s);
            }
        },
        // SAFETY: silu_like passes k < n.
        |k| unsafe { *dst.add(k) = scalar::silu(*a.add(k)) },
    );
}

/// SwiGLU in one pass, silu(x) * g, bitwise the AVX2 tier's `swiglu_f32`.
///
/// # Safety
/// As `scalar::swiglu_f32`, and the CPU supports the AVX-512 tier.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn swiglu_f32(n: usize, dst: *mut f32, x: *const f32, g: *const f32) {
    // SAFETY: the caller's guarantees.
    unsafe { swiglu::<false>(n, dst, x, g) }
}

/// [`swiglu_f32`] with non-temporal stores where the destination is 64-byte aligned: the same
/// bits, written past the caches (no read for ownership), for outputs larger than they are.
///
/// # Safety
/// As `scalar::swiglu_f32`, and the CPU supports the AVX-512 tier.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn swiglu_f32_stream(n: usize, dst: *mut f32, x: *const f32, g: *const f32) {
    // SAFETY: the caller's guarantees.
    unsafe { swiglu::<true>(n, dst, x, g) };
    // The streamed stores are weakly ordered: they reach memory before this row is reported
    // done (the pool's barrier comes after).
    _mm_sfence();
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn swiglu<const STREAM: bool>(n: usize, dst: *mut f32, x: *const f32, g: *const f32) {
    silu_like(
        n,
        |i| {
            // SAFETY: silu_like passes i + 32 <= n; a lane group's loads precede its store; a
            // streamed store writes the 64 aligned bytes at dst + i (and + 16), inside dst.
            unsafe {
                let s0 = v_silu(_mm512_loadu_ps(x.add(i)));
                let s1 = v_silu(_mm512_loadu_ps(x.add(i + 16)));
                let y0 = _mm512_mul_ps(s0, _mm512_loadu_ps(g.add(i)));
                let y1 = _mm512_mul_ps(s1, _mm512_loadu_ps(g.add(i + 16)));
                if STREAM && (dst.add(i) as usize).is_multiple_of(64) {
                    _mm512_stream_ps(dst.add(i), y0);
                    _mm512_stream_ps(dst.add(i + 16), y1);
                } else {
                    _mm512_storeu_ps(dst.add(i), y0);
                    _mm512_storeu_ps(dst.add(i + 16), y1);
                }
            }
        },
        |i, m| {
            // SAFETY: the mask covers lanes below n only; masked-off lanes are not accessed.
            unsafe {
                let s = v_silu(_mm512_maskz_loadu_ps(m, x.add(i)));
                let y = _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, g.add(i)));
                _mm512_mask_storeu_ps(dst.add(i), m, y);
            }
        },
        // SAFETY: silu_like passes k < n.
        |k| unsafe { *dst.add(k) = scalar::silu(*x.add(k)) * *g.add(k) },
    );
}

/// The low and high eight lanes of a 16-lane vector.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
#[inline]
fn halves(v: __m512) -> (__m256, __m256) {
    (_mm512_castps512_ps256(v), _mm512_extractf32x8_ps::<1>(v))
}

/// ggml's AVX2 float dot product (`avx2_quants::vec_dot_f32_avx2` / `vec_dot_f16_avx2`) with
/// its four 8-lane accumulators held as two 16-lane ones: elements `32 k + 0..16` feed the
/// accumulators c0 | c1 and `32 k + 16..32` feed c2 | c3, so every lane sums the same products
/// in the same order, and the final reduction is the AVX2 one; the bits are the AVX2 tier's.
/// `load(i)` widens the 16 elements at `i` to f32.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
#[inline]
fn dot_paired(
    np: usize,
    load_x: impl Fn(usize) -> __m512,
    load_y: impl Fn(usize) -> __m512,
) -> f32 {
    let (mut a, mut b) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut i = 0;
    while i < np {
        a = _mm512_fmadd_ps(load_x(i), load_y(i), a);
        b = _mm512_fmadd_ps(load_x(i + 16), load_y(i + 16), b);
        i += 32;
    }
    let ((c0, c1), (c2, c3)) = (halves(a), halves(b));
    f32x8_reduce([c0, c1, c2, c3])
}

/// # Safety
/// The CPU supports the AVX-512 tier; `x` and `y` are valid for reading `4 * n` bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
unsafe fn vec_dot_f32_avx512<const PF: usize>(n: usize, x: *const f32, y: *const f32) -> f32 {
    let np = n & !31;
    // SAFETY: dot_paired loads 16 elements at i and i + 16 for i + 32 <= np <= n.
    let mut sumf = dot_paired(
        np,
        |i| unsafe {
            // Once per 32 elements (`dot_paired` loads at i and i + 16).
            if PF > 0 && i % 32 == 0 {
                // A hint only: never faults, and `wrapping_add` keeps the address defined.
                let p = x.add(i).cast::<u8>().wrapping_add(PF);
                _mm_prefetch::<_MM_HINT_T0>(p.cast());
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64).cast());
            }
            _mm512_loadu_ps(x.add(i))
        },
        |i| unsafe { _mm512_loadu_ps(y.add(i)) },
    );
    for i in np..n {
        // SAFETY: i < n.
        let (a, b) = unsafe { (x.add(i).read_unaligned(), y.add(i).read_unaligned()) };
        sumf = a.mul_add(b, sumf);
    }
    sumf
}

/// # Safety
/// The CPU supports the AVX-512 tier; `x` and `y` are valid for reading `2 * n` bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
unsafe fn vec_dot_f16_avx512(n: usize, x: *const u16, y: *const u16) -> f32 {
    let np = n & !31;
    let load = |p: *const u16| {
        // SAFETY: dot_paired loads 16 halves at i and i + 16 for i + 32 <= np <= n.
        move |i: usize| unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.add(i).cast())) }
    };
    let mut sumf = dot_paired(np, load(x), load(y)) as f64;
    for i in np..n {
        // SAFETY: i < n.
        let (a, b) = unsafe { (x.add(i).read_unaligned(), y.add(i).read_unaligned()) };
        sumf += (fp16_to_fp32(a) * fp16_to_fp32(b)) as f64;
    }
    sumf as f32
}

/// `vec_dot_f32` prefetching each weight row 2 KiB ahead (`KernelTable::vec_dot_stream`: rows
/// read once, from L3 or memory; the same bits, a prefetch changes no arithmetic). On 2 Emerald
/// Rapids cores, interleaved rounds: 4096 x 1 x 14336 11.1-13.7 ms without, 9.5-11.6 at 2 KiB
/// (1, 4 and 8 KiB in between; such long rows now decode on the register tiles, see
/// `ops::mul_mat`); for the rows it still serves, 4096 x 1 x 4096 1.58-2.79 ms without,
/// 1.45-2.77 with (4 rounds, 1.01-1.09x), and 49152 x 1 x 576 within the noise (0.87-1.46x).
fn vec_dot_f32_stream(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let n = n.min(x.len() / 4).min(y.len() / 4);
    // SAFETY: as `vec_dot_f32`.
    unsafe { vec_dot_f32_avx512::<2048>(n, x.as_ptr().cast(), y.as_ptr().cast()) }
}
/// `ggml_vec_dot_f32`, bitwise the AVX2 tier's.
fn vec_dot_f32(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let n = n.min(x.len() / 4).min(y.len() / 4);
    // SAFETY: both slices hold n f32; installed only when the AVX-512 tier is supported.
    unsafe { vec_dot_f32_avx512::<0>(n, x.as_ptr().cast(), y.as_ptr().cast()) }
}

/// `ggml_vec_dot_f16`, bitwise the AVX2 tier's.
fn vec_dot_f16(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let n = n.min(x.len() / 2).min(y.len() / 2);
    // SAFETY: both slices hold n halves; installed only when the AVX-512 tier is supported.
    unsafe { vec_dot_f16_avx512(n, x.as_ptr().cast(), y.as_ptr().cast()) }
}

/// Weight rows prefetched this many bytes ahead by the float decode tiles.
const FLOAT_TILE_PF: usize = 2048;

/// Element types of the float tiles.
const EF32: u8 = 0;
const EF16: u8 = 1;
const EBF16: u8 = 2;
/// BF16 by `vdpbf16ps` ([`bf16_dp_tile`]; only where the CPU has AVX512_BF16).
const EBF16_DP: u8 = 3;

/// `R x C` float dot products (element type `E`: F32, F16 or BF16), each output bitwise the AVX2
/// tier's `vec_dot` (ggml's four 8-lane accumulators held as two 16-lane ones, the AVX2
/// reduction of that type, the same scalar tail); each activation vector is loaded once for the
/// `R` rows, and each weight row is prefetched ahead. Result `[c][r]`.
///
/// # Safety
/// The CPU supports the AVX-512 tier; every pointer is valid for `n` elements.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
unsafe fn float_tile<const E: u8, const R: usize, const C: usize>(
    n: usize,
    x: [*const u8; R],
    y: [*const u8; C],
) -> [[f32; R]; C] {
    let es = if E == EF32 { 4 } else { 2 };
    // SAFETY: every call passes one of the caller's pointers, which hold n elements, and
    // i + 16 <= np <= n.
    let load = |p: *const u8, i: usize| unsafe {
        match E {
            EF16 => _mm512_cvtph_ps(_mm256_loadu_si256(p.add(2 * i).cast())),
            EBF16 => {
                let h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.add(2 * i).cast()));
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(h))
            }
            _ => _mm512_loadu_ps(p.add(4 * i).cast()),
        }
    };
    let np = n & !31;
    let mut acc = [[[_mm512_setzero_ps(); 2]; R]; C];
    let mut i = 0;
    while i < np {
        for xr in x {
            for line in 0..(32 * es) / 64 {
                let ahead = xr.wrapping_add(i * es + FLOAT_TILE_PF + 64 * line);
                _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8);
            }
        }
        for h in 0..2 {
            let xv: [__m512; R] = std::array::from_fn(|r| load(x[r], i + 16 * h));
            for c in 0..C {
                let yv = load(y[c], i + 16 * h);
                for r in 0..R {
                    acc[c][r][h] = _mm512_fmadd_ps(xv[r], yv, acc[c][r][h]);
                }
            }
        }
        i += 32;
    }
    let mut res = [[0f32; R]; C];
    for c in 0..C {
        for r in 0..R {
            let ((c0, c1), (c2, c3)) = (halves(acc[c][r][0]), halves(acc[c][r][1]));
            res[c][r] = if E == EBF16 {
                // avx2_quants::bf16_finish's reduction and f64 tail.
                let cs = _mm256_add_ps(_mm256_add_ps(c0, c2), _mm256_add_ps(c1, c3));
                // SAFETY: x[r] and y[c] hold n elements (contract).
                unsafe {
                    bf16_tail(x[r].cast(), y[c].cast(), np, n, hsum_float_8(cs) as f64) as f32
                }
            } else if E == EF16 {
                let red = f32x8_reduce([c0, c1, c2, c3]);
                let mut sumf = red as f64;
                for t in np..n {
                    // SAFETY: t < n.
                    let (a, b) = unsafe {
                        (
                            (x[r] as *const u16).add(t).read_unaligned(),
                            (y[c] as *const u16).add(t).read_unaligned(),
                        )
                    };
                    sumf += (fp16_to_fp32(a) * fp16_to_fp32(b)) as f64;
                }
                sumf as f32
            } else {
                let mut sumf = f32x8_reduce([c0, c1, c2, c3]);
                for t in np..n {
                    // SAFETY: t < n.
                    let (a, b) = unsafe {
                        (
                            (x[r] as *const f32).add(t).read_unaligned(),
                            (y[c] as *const f32).add(t).read_unaligned(),
                        )
                    };
                    sumf = a.mul_add(b, sumf);
                }
                sumf
            };
        }
    }
    res
}

/// [`float_tile`], or [`bf16_dp_tile`] for `EBF16_DP`.
///
/// # Safety
/// As the tiles': the AVX-512 tier is supported (and AVX512_BF16 for `EBF16_DP`); every pointer
/// is valid for `n` elements.
#[inline(always)]
unsafe fn tile<const E: u8, const R: usize, const C: usize>(
    n: usize,
    x: [*const u8; R],
    y: [*const u8; C],
) -> [[f32; R]; C] {
    // SAFETY: the caller's contract is the tiles'.
    unsafe {
        if E == EBF16_DP { bf16_dp_tile::<R, C>(n, x, y) } else { float_tile::<E, R, C>(n, x, y) }
    }
}

/// `R x C` BF16 dot products in the order of ggml's `ggml_vec_dot_bf16` built with
/// `__AVX512BF16__`: per output two 16-lane accumulators, elements `64 k + 0..32` into the first
/// and `64 k + 32..64` into the second by `vdpbf16ps` (each lane adds the products of its pair of
/// elements; the instruction reads denormal inputs as zero); each accumulator summed by halves
/// (the pairing of the C compilers' `_mm512_reduce_add_ps`: its two halves added, then
/// `hsum_float_8`) and added in f64, then the elements past the last whole 64 one by one in f64
/// (`bf16_tail`). One instruction per 32 elements and no widening (the AVX2-order dot widens
/// with four more operations per 32 elements; see `plug` for the timings). The order differs
/// from the AVX2 dot's, so the results equal the other tiers' within rounding, not bitwise. Each
/// activation vector is loaded once for the `R` rows. Result `[c][r]`.
///
/// # Safety
/// The CPU supports the AVX-512 tier and AVX512_BF16; every pointer is valid for `n` BF16
/// elements.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma,f16c")]
unsafe fn bf16_dp_tile<const R: usize, const C: usize>(
    n: usize,
    x: [*const u8; R],
    y: [*const u8; C],
) -> [[f32; R]; C] {
    // SAFETY: every call passes one of the caller's pointers, which hold n elements (2 n
    // bytes), with i + 32 <= np <= n; the transmute reinterprets 32 BF16 values as the
    // instruction's operand type.
    let load = |p: *const u8, i: usize| unsafe {
        std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(p.add(2 * i).cast()))
    };
    let np = n & !63;
    let mut acc = [[[_mm512_setzero_ps(); 2]; R]; C];
    let mut i = 0;
    while i < np {
        for h in 0..2 {
            let xv: [__m512bh; R] = std::array::from_fn(|r| load(x[r], i + 32 * h));
            for c in 0..C {
                let yv = load(y[c], i + 32 * h);
                for r in 0..R {
                    acc[c][r][h] = _mm512_dpbf16_ps(acc[c][r][h], xv[r], yv);
                }
            }
        }
        i += 64;
    }
    let mut res = [[0f32; R]; C];
    for c in 0..C {
        for r in 0..R {
            let (lo0, hi0) = halves(acc[c][r][0]);
            let (lo1, hi1) = halves(acc[c][r][1]);
            let mut sumf = hsum_float_8(_mm256_add_ps(lo0, hi0)) as f64;
            sumf += hsum_float_8(_mm256_add_ps(lo1, hi1)) as f64;
            // SAFETY: x[r] and y[c] hold n elements (contract).
            let sumf = unsafe { bf16_tail(x[r].cast(), y[c].cast(), np, n, sumf) };
            res[c][r] = sumf as f32;
        }
    }
    res
}

/// The BF16 dot of the matmul kernels (`KernelTable::vec_dot_stream`) by `vdpbf16ps`
/// ([`bf16_dp_tile`]).
fn vec_dot_bf16_dp(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let n = n.min(x.len() / 2).min(y.len() / 2);
    // SAFETY: both slices hold n BF16 values; installed only when the AVX-512 tier and
    // AVX512_BF16 are supported.
    unsafe { bf16_dp_tile::<1, 1>(n, [x.as_ptr()], [y.as_ptr()])[0][0] }
}

/// The float `GemmFn` of this tier: tiles of up to 4 weight rows by 2 activation rows.
fn gemm_float<const E: u8>(k: usize, x: &[&[u8]], y: &[&[u8]], out: &mut [f32]) {
    let es = if E == EF32 { 4 } else { 2 };
    let n = x.iter().chain(y).fold(k, |n, s| n.min(s.len() / es));
    debug_assert_eq!(n, k, "gemm slices too short");
    let rows = x.len();
    assert!(out.len() >= rows * y.len(), "gemm output too short");
    macro_rules! run {
        ($r:literal, $c:literal) => {{
            let xp: [*const u8; $r] = std::array::from_fn(|i| x[i].as_ptr());
            let yp: [*const u8; $c] = std::array::from_fn(|i| y[i].as_ptr());
            // SAFETY: every slice holds n elements (capped above); installed only when the
            // AVX-512 tier is supported, and with `EBF16_DP` only when AVX512_BF16 is too.
            let res = unsafe { tile::<E, $r, $c>(n, xp, yp) };
            for c in 0..$c {
                out[c * $r..c * $r + $r].copy_from_slice(&res[c]);
            }
        }};
    }
    match (rows, y.len()) {
        (4, 2) => run!(4, 2),
        (4, 1) => run!(4, 1),
        (3, 2) => run!(3, 2),
        (3, 1) => run!(3, 1),
        (2, 2) => run!(2, 2),
        (2, 1) => run!(2, 1),
        (1, 2) => run!(1, 2),
        _ => {
            for (c, yc) in y.iter().enumerate() {
                for (r, xr) in x.iter().enumerate() {
                    // SAFETY: as above, one pair.
                    let res = unsafe { tile::<E, 1, 1>(n, [xr.as_ptr()], [yc.as_ptr()]) };
                    out[c * rows + r] = res[0][0];
                }
            }
        }
    }
}

/// acc += f16(v) * s, one fused multiply-add per element (the AVX2 tier's bits).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
fn mad_f16_avx512(acc: &mut [f32], v: &[u8], s: f32) {
    let n = (v.len() / 2).min(acc.len());
    let vs = _mm512_set1_ps(s);
    let (pv, pa) = (v.as_ptr() as *const u16, acc.as_mut_ptr());
    // Whole vectors unmasked: a masked store does not forward to the next call's load of the
    // same accumulator (flash attention calls this once per KV row), which stalls.
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: i + 16 <= n: 32 bytes of v and 16 floats of acc are in bounds.
        unsafe {
            let h = _mm512_cvtph_ps(_mm256_loadu_si256(pv.add(i).cast()));
            let a = _mm512_loadu_ps(pa.add(i));
            _mm512_storeu_ps(pa.add(i), _mm512_fmadd_ps(h, vs, a));
        }
        i += 16;
    }
    if i < n {
        let m = first_lanes(n - i);
        // SAFETY: the mask covers elements i..n of both slices only.
        unsafe {
            let h = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, pv.add(i).cast()));
            let a = _mm512_maskz_loadu_ps(m, pa.add(i));
            _mm512_mask_storeu_ps(pa.add(i), m, _mm512_fmadd_ps(h, vs, a));
        }
    }
}

/// acc += f16(v) * s.
pub(crate) fn mad_f16(acc: &mut [f32], v: &[u8], s: f32) {
    // SAFETY: only placed in a table after the AVX-512 tier was detected.
    unsafe { mad_f16_avx512(acc, v, s) }
}

/// acc += v * s, one fused multiply-add per element (the AVX2 tier's bits).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
fn mad_f32_avx512(acc: &mut [f32], v: &[f32], s: f32) {
    let n = v.len().min(acc.len());
    let vs = _mm512_set1_ps(s);
    let (pv, pa) = (v.as_ptr(), acc.as_mut_ptr());
    // Whole vectors unmasked (see mad_f16_avx512).
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: i + 16 <= n: 16 floats of v and of acc are in bounds.
        unsafe {
            let x = _mm512_loadu_ps(pv.add(i));
            let a = _mm512_loadu_ps(pa.add(i));
            _mm512_storeu_ps(pa.add(i), _mm512_fmadd_ps(x, vs, a));
        }
        i += 16;
    }
    if i < n {
        let m = first_lanes(n - i);
        // SAFETY: the mask covers elements i..n of both slices only.
        unsafe {
            let x = _mm512_maskz_loadu_ps(m, pv.add(i));
            let a = _mm512_maskz_loadu_ps(m, pa.add(i));
            _mm512_mask_storeu_ps(pa.add(i), m, _mm512_fmadd_ps(x, vs, a));
        }
    }
}

/// acc += v * s.
pub(crate) fn mad_f32(acc: &mut [f32], v: &[f32], s: f32) {
    // SAFETY: only placed in a table after the AVX-512 tier was detected.
    unsafe { mad_f32_avx512(acc, v, s) }
}

/// `acc[c0..c0 + 16 W] += sum_j p[j] * v_j[c0..]` over the rows with `p[j] != 0`, the
/// accumulator chunk held in W registers across the rows.
///
/// # Safety
/// `acc` has at least `c0 + 16 W` elements; V row `j < p.len()` starts at `v + j * stride` bytes
/// and holds at least `c0 + 16 W` halves.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn v_chunk<const W: usize>(
    acc: &mut [f32],
    c0: usize,
    p: &[f32],
    v: *const u8,
    stride: usize,
) {
    let pa = acc.as_mut_ptr();
    let mut r = [_mm512_setzero_ps(); W];
    for (t, x) in r.iter_mut().enumerate() {
        // SAFETY: c0 + 16 t + 16 <= c0 + 16 W <= acc.len().
        *x = unsafe { _mm512_loadu_ps(pa.add(c0 + 16 * t)) };
    }
    for (j, &pj) in p.iter().enumerate() {
        if pj == 0.0 {
            continue;
        }
        let pv = _mm512_set1_ps(pj);
        // SAFETY: row j of V holds c0 + 16 W halves (the contract).
        let vr = unsafe { v.add(j * stride) as *const u16 };
        for (t, x) in r.iter_mut().enumerate() {
            // SAFETY: as above, halves c0 + 16 t .. c0 + 16 t + 16 of the row.
            let h = unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(vr.add(c0 + 16 * t).cast())) };
            *x = _mm512_fmadd_ps(h, pv, *x);
        }
    }
    for (t, x) in r.iter().enumerate() {
        // SAFETY: as for the loads.
        unsafe { _mm512_storeu_ps(pa.add(c0 + 16 * t), *x) };
    }
}

/// Group blocks ahead that the repacked K-quant kernels prefetch on this tier.
const RK_AHEAD: usize = 8;

/// KV rows ahead that the decode loop prefetches (16-32 measured alike on Zen 5; none was up to
/// 10% slower in some runs).
const ATTEND_PF_ROWS: usize = 16;

/// flash_attn_ext's decode loop over F16 K and V in blocks of 16 positions: the 16 scores (16
/// lanes per K row, reduced per row), one rescale of the accumulator when the block raises the
/// max, the probabilities with the vector exp, and the V rows accumulated into up to 128
/// accumulator floats held in registers across the block. Head sizes are multiples of 16.
///
/// # Safety
/// As [`crate::kernels::AttendF16Fn`]; `q.len()` and `acc.len()` are multiples of 16.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
unsafe fn attend_f16_avx512(a: &AttendF16<'_>, m: &mut f32, s: &mut f32, acc: &mut [f32]) {
    let (dk, dv) = (a.q.len(), acc.len());
    debug_assert!(dk % 16 == 0 && dv % 16 == 0);
    let q = a.q.as_ptr();
    let mut j0 = 0;
    while j0 < a.n {
        let nb = (a.n - j0).min(16);
        let mut sc = [f32::NEG_INFINITY; 16];
        for (j, x) in sc.iter_mut().enumerate().take(nb) {
            let pf = j0 + j + ATTEND_PF_ROWS;
            if pf < a.n {
                // Rows ATTEND_PF_ROWS ahead, K and V: a decode step streams both from memory.
                prefetch_l1(a.k.wrapping_add(pf * a.k_stride), 2 * dk);
                prefetch_l1(a.v.wrapping_add(pf * a.v_stride), 2 * dv);
            }
            let mv = a.mask.map_or(0.0, |mk| mk[j0 + j]);
            if mv == f32::NEG_INFINITY {
                continue;
            }
            // SAFETY: row j0 + j < n of K holds dk halves (the contract).
            let kr = unsafe { a.k.add((j0 + j) * a.k_stride) as *const u16 };
            let (mut d0, mut d1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
            let mut i = 0;
            while i + 32 <= dk {
                // SAFETY: i + 32 <= dk halves of the K row and floats of q.
                unsafe {
                    let k0 = _mm512_cvtph_ps(_mm256_loadu_si256(kr.add(i).cast()));
                    let k1 = _mm512_cvtph_ps(_mm256_loadu_si256(kr.add(i + 16).cast()));
                    d0 = _mm512_fmadd_ps(k0, _mm512_loadu_ps(q.add(i)), d0);
                    d1 = _mm512_fmadd_ps(k1, _mm512_loadu_ps(q.add(i + 16)), d1);
                }
                i += 32;
            }
            if i < dk {
                // SAFETY: dk is a multiple of 16, so i + 16 <= dk.
                unsafe {
                    let k0 = _mm512_cvtph_ps(_mm256_loadu_si256(kr.add(i).cast()));
                    d0 = _mm512_fmadd_ps(k0, _mm512_loadu_ps(q.add(i)), d0);
                }
            }
            let mut v = _mm512_reduce_add_ps(_mm512_add_ps(d0, d1)) * a.scale;
            if a.softcap != 0.0 {
                v = a.softcap * v.tanh();
            }
            *x = v + mv;
        }
        // SAFETY: sc holds 16 floats.
        let xs = unsafe { _mm512_loadu_ps(sc.as_ptr()) };
        if !crate::kernels::attend_block_max(&sc[..nb], m, s, acc) {
            j0 += nb;
            continue;
        }
        // exp(x - m) = exp(-(m - x)); masked lanes (x = -inf) give exp(-inf) = 0.
        let p = v_expf_neg(_mm512_sub_ps(_mm512_set1_ps(*m), xs));
        *s += _mm512_reduce_add_ps(p);
        let mut pa = [0f32; 16];
        // SAFETY: pa holds 16 floats.
        unsafe { _mm512_storeu_ps(pa.as_mut_ptr(), p) };
        // SAFETY: row j0 of V and the following nb - 1 rows exist (j0 + nb <= n).
        let v0 = unsafe { a.v.add(j0 * a.v_stride) };
        let mut c0 = 0;
        while c0 < dv {
            let w = ((dv - c0) / 16).min(8);
            // SAFETY: c0 + 16 w <= dv for acc and every V row (rows of dv halves).
            unsafe {
                match w {
                    8 => v_chunk::<8>(acc, c0, &pa[..nb], v0, a.v_stride),
                    7 => v_chunk::<7>(acc, c0, &pa[..nb], v0, a.v_stride),
                    6 => v_chunk::<6>(acc, c0, &pa[..nb], v0, a.v_stride),
                    5 => v_chunk::<5>(acc, c0, &pa[..nb], v0, a.v_stride),
                    4 => v_chunk::<4>(acc, c0, &pa[..nb], v0, a.v_stride),
                    3 => v_chunk::<3>(acc, c0, &pa[..nb], v0, a.v_stride),
                    2 => v_chunk::<2>(acc, c0, &pa[..nb], v0, a.v_stride),
                    _ => v_chunk::<1>(acc, c0, &pa[..nb], v0, a.v_stride),
                }
            }
            c0 += 16 * w;
        }
        j0 += nb;
    }
}

/// Two 6 x 16 float GEMM tiles (`KernelTable::sgemm2`): twelve 16-lane accumulators, one per
/// row of either strip, each summing its products in k order from zero as the 6 x 16 kernels do
/// (the same bits); the panel group is loaded once for both strips and every strip value is a
/// broadcast folded into its multiply-add.
fn sgemm_12x16(
    kc: usize,
    a0: &[f32],
    a1: &[f32],
    bp: &[f32],
    out0: &mut [f32; SG_MR * SG_NR],
    out1: &mut [f32; SG_MR * SG_NR],
    acc: bool,
) {
    sgemm::check(kc, a0, bp);
    sgemm::check(kc, a1, bp);
    // SAFETY: `check` proved both strips hold `kc * 6` values and the panel `kc * 16`; the tiles
    // hold 6 x 16; installed only when the AVX-512 tier is supported.
    unsafe {
        tile_12x16(
            kc,
            [a0.as_ptr(), a1.as_ptr()],
            bp.as_ptr(),
            [out0.as_mut_ptr(), out1.as_mut_ptr()],
            acc,
        )
    }
}

/// # Safety
/// The AVX-512 tier is supported; `a[s]` holds `kc * 6` f32, `bp` `kc * 16`, `out[s]` 6 x 16.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
unsafe fn tile_12x16(kc: usize, a: [*const f32; 2], bp: *const f32, out: [*mut f32; 2], acc: bool) {
    let mut c = [[_mm512_setzero_ps(); SG_MR]; 2];
    let step = |k: usize, c: &mut [[__m512; SG_MR]; 2]| {
        // SAFETY: k < kc: group k of the panel and of both strips are in bounds (contract).
        unsafe {
            let b = _mm512_loadu_ps(bp.add(k * SG_NR));
            for (s, cs) in c.iter_mut().enumerate() {
                let ak = a[s].add(k * SG_MR);
                for (r, x) in cs.iter_mut().enumerate() {
                    *x = _mm512_fmadd_ps(_mm512_set1_ps(*ak.add(r)), b, *x);
                }
            }
        }
    };
    let mut k = 0;
    while k + 2 <= kc {
        step(k, &mut c);
        step(k + 1, &mut c);
        k += 2;
    }
    if k < kc {
        step(k, &mut c);
    }
    for (s, cs) in c.iter().enumerate() {
        for (r, x) in cs.iter().enumerate() {
            // SAFETY: out[s] holds 6 rows of 16 (contract).
            unsafe {
                let o = out[s].add(r * SG_NR);
                let v = if acc { _mm512_add_ps(_mm512_loadu_ps(o), *x) } else { *x };
                _mm512_storeu_ps(o, v);
            }
        }
    }
}

/// Two strips by two panels (`KernelTable::sgemm22`): 24 accumulators, each row's sums in k
/// order from zero as the 6 x 16 kernels (the same bits); per k, two panel loads and 12
/// broadcasts feed 24 multiply-adds.
fn sgemm_12x32(
    kc: usize,
    a: [&[f32]; 2],
    bp: [&[f32]; 2],
    out: [&mut [f32; SG_MR * SG_NR]; 4],
    acc: bool,
) {
    let (a, bp, o) = ptrs_2x2(kc, a, bp, out);
    // SAFETY: `ptrs_2x2` checked that both strips hold `kc * 6` values and both panels `kc *
    // 16`; the four tiles hold 6 x 16; installed only when the AVX-512 tier is supported.
    unsafe { tile_12x32(kc, a, bp, o, acc) }
}

/// The pointers of a two-by-two call (`Sgemm22Fn`) after `sgemm::check` of every strip and
/// panel: strips, panels, tiles (strip s, panel p at `2 s + p`).
#[allow(clippy::type_complexity)]
fn ptrs_2x2(
    kc: usize,
    a: [&[f32]; 2],
    bp: [&[f32]; 2],
    out: [&mut [f32; SG_MR * SG_NR]; 4],
) -> ([*const f32; 2], [*const f32; 2], [*mut f32; 4]) {
    for (s, p) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
        sgemm::check(kc, a[s], bp[p]);
    }
    (a.map(<[f32]>::as_ptr), bp.map(<[f32]>::as_ptr), out.map(|t| t.as_mut_ptr()))
}

/// # Safety
/// The AVX-512 tier is supported; `a[s]` holds `kc * 6` f32, `bp[p]` `kc * 16`, `out[t]` 6 x 16.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
unsafe fn tile_12x32(
    kc: usize,
    a: [*const f32; 2],
    bp: [*const f32; 2],
    out: [*mut f32; 4],
    acc: bool,
) {
    // c[s][p][r]: strip s, panel p, row r.
    let mut c = [[[_mm512_setzero_ps(); SG_MR]; 2]; 2];
    for k in 0..kc {
        // SAFETY: k < kc: group k of both panels and both strips are in bounds (contract).
        unsafe {
            let b = [_mm512_loadu_ps(bp[0].add(k * SG_NR)), _mm512_loadu_ps(bp[1].add(k * SG_NR))];
            for (s, cs) in c.iter_mut().enumerate() {
                let ak = a[s].add(k * SG_MR);
                for r in 0..SG_MR {
                    let av = _mm512_set1_ps(*ak.add(r));
                    cs[0][r] = _mm512_fmadd_ps(av, b[0], cs[0][r]);
                    cs[1][r] = _mm512_fmadd_ps(av, b[1], cs[1][r]);
                }
            }
        }
    }
    for (s, cs) in c.iter().enumerate() {
        for (p, cp) in cs.iter().enumerate() {
            for (r, x) in cp.iter().enumerate() {
                // SAFETY: out[2 s + p] holds 6 rows of 16 (contract).
                unsafe {
                    let o = out[2 * s + p].add(r * SG_NR);
                    let v = if acc { _mm512_add_ps(_mm512_loadu_ps(o), *x) } else { *x };
                    _mm512_storeu_ps(o, v);
                }
            }
        }
    }
}

/// BF16 pairs, one strip (`KernelTable::sgemm_bf16`): `kc` pairs of K values.
fn sgemm_bf16_6x16(kc: usize, a: &[f32], bp: &[f32], out: &mut [f32; SG_MR * SG_NR], acc: bool) {
    sgemm::check(kc, a, bp);
    // SAFETY: `check` proved the strip holds `kc * 6` slots and the panel `kc * 16`; the tile
    // holds 6 x 16; installed only on CPUs with the AVX-512 tier and AVX512_BF16.
    unsafe { tile_bf16::<1, 1>(kc, [a.as_ptr()], [bp.as_ptr()], [[out.as_mut_ptr()]], acc) }
}

/// BF16 pairs, two strips (`KernelTable::sgemm_bf16`).
fn sgemm_bf16_12x16(
    kc: usize,
    a0: &[f32],
    a1: &[f32],
    bp: &[f32],
    out0: &mut [f32; SG_MR * SG_NR],
    out1: &mut [f32; SG_MR * SG_NR],
    acc: bool,
) {
    sgemm::check(kc, a0, bp);
    sgemm::check(kc, a1, bp);
    // SAFETY: as `sgemm_bf16_6x16`, for both strips and tiles.
    unsafe {
        tile_bf16::<2, 1>(
            kc,
            [a0.as_ptr(), a1.as_ptr()],
            [bp.as_ptr()],
            [[out0.as_mut_ptr()], [out1.as_mut_ptr()]],
            acc,
        )
    }
}

/// BF16 pairs, two strips by two panels (`KernelTable::sgemm_bf16`'s third kernel): 24
/// accumulators, each panel load and row broadcast feeding two `vdpbf16ps`; the same bits as
/// four `sgemm_bf16_6x16` calls (each tile's sums in the same order).
fn sgemm_bf16_12x32(
    kc: usize,
    a: [&[f32]; 2],
    bp: [&[f32]; 2],
    out: [&mut [f32; SG_MR * SG_NR]; 4],
    acc: bool,
) {
    let (a, bp, [o00, o01, o10, o11]) = ptrs_2x2(kc, a, bp, out);
    // SAFETY: `ptrs_2x2` checked that both strips hold `kc * 6` slots and both panels `kc *
    // 16`; the four tiles hold 6 x 16; installed only on CPUs with the AVX-512 tier and
    // AVX512_BF16.
    unsafe { tile_bf16::<2, 2>(kc, a, bp, [[o00, o01], [o10, o11]], acc) }
}

/// `S` strips of 6 rows by `P` 16-column panels in BF16 pairs: per pair of K values, each
/// panel's 16 pairs in one register and each row's pair broadcast into `vdpbf16ps` (two products
/// added into the row's 16 column sums, odd element first, as the instruction defines; denormal
/// inputs read as zero). Every tile's sums are the one-strip, one-panel form's.
///
/// # Safety
/// The AVX-512 tier and AVX512_BF16 are available; `a[s]` holds `kc * 6` slots, `bp[p]` `kc *
/// 16`, `out[s][p]` 6 x 16 floats.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma,f16c")]
unsafe fn tile_bf16<const S: usize, const P: usize>(
    kc: usize,
    a: [*const f32; S],
    bp: [*const f32; P],
    out: [[*mut f32; P]; S],
    acc: bool,
) {
    // c[s][p][r]: strip s, panel p, row r.
    let mut c = [[[_mm512_setzero_ps(); SG_MR]; P]; S];
    let mut k = 0;
    while k < kc {
        // SAFETY: k < kc: pair group k of every panel and every strip is in bounds; the
        // transmutes reinterpret 64 bytes of packed BF16 pairs as the instruction's operand type.
        unsafe {
            let b: [__m512bh; P] = std::array::from_fn(|p| {
                std::mem::transmute::<__m512, __m512bh>(_mm512_loadu_ps(bp[p].add(k * SG_NR)))
            });
            for (s, cs) in c.iter_mut().enumerate() {
                let ak = a[s].add(k * SG_MR) as *const i32;
                for r in 0..SG_MR {
                    let av =
                        std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(*ak.add(r)));
                    for (p, cp) in cs.iter_mut().enumerate() {
                        cp[r] = _mm512_dpbf16_ps(cp[r], av, b[p]);
                    }
                }
            }
        }
        k += 1;
    }
    for (s, cs) in c.iter().enumerate() {
        for (p, cp) in cs.iter().enumerate() {
            for (r, x) in cp.iter().enumerate() {
                // SAFETY: out[s][p] holds 6 rows of 16 (contract).
                unsafe {
                    let o = out[s][p].add(r * SG_NR);
                    let v = if acc { _mm512_add_ps(_mm512_loadu_ps(o), *x) } else { *x };
                    _mm512_storeu_ps(o, v);
                }
            }
        }
    }
}

/// Bytes per Q4_0 block (f16 scale, 16 bytes of nibbles) and per Q8_0 block (f16, 32 i8).
const Q4_0_BYTES: usize = 18;
const Q8_0_BYTES: usize = 34;

/// `dequantize_row_q4_0`: (q - 8) * d, low nibbles first; the same floats as ggml's (an exact
/// int -> float conversion and one multiply per element).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
fn dequantize_q4_0_avx512(src: &[u8], dst: &mut [f32]) {
    let nb = (src.len() / Q4_0_BYTES).min(dst.len() / 32);
    let (ps, pd) = (src.as_ptr(), dst.as_mut_ptr());
    let (mask, eight) = (_mm_set1_epi8(0x0F), _mm512_set1_epi32(8));
    for i in 0..nb {
        // SAFETY: block i's 18 bytes are inside src and its 32 floats inside dst (i < nb).
        unsafe {
            let b = ps.add(i * Q4_0_BYTES);
            let d = _mm512_set1_ps(fp16_to_fp32((b as *const u16).read_unaligned()));
            let q = _mm_loadu_si128(b.add(2).cast());
            let lo = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_and_si128(q, mask)), eight);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(q), mask);
            let hi = _mm512_sub_epi32(_mm512_cvtepu8_epi32(hi), eight);
            _mm512_storeu_ps(pd.add(32 * i), _mm512_mul_ps(_mm512_cvtepi32_ps(lo), d));
            _mm512_storeu_ps(pd.add(32 * i + 16), _mm512_mul_ps(_mm512_cvtepi32_ps(hi), d));
        }
    }
}

/// `dequantize_row_q8_0`: q * d, the same floats as ggml's.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
fn dequantize_q8_0_avx512(src: &[u8], dst: &mut [f32]) {
    let nb = (src.len() / Q8_0_BYTES).min(dst.len() / 32);
    let (ps, pd) = (src.as_ptr(), dst.as_mut_ptr());
    for i in 0..nb {
        // SAFETY: block i's 34 bytes are inside src and its 32 floats inside dst (i < nb).
        unsafe {
            let b = ps.add(i * Q8_0_BYTES);
            let d = _mm512_set1_ps(fp16_to_fp32((b as *const u16).read_unaligned()));
            for h in 0..2 {
                let q = _mm512_cvtepi8_epi32(_mm_loadu_si128(b.add(2 + 16 * h).cast()));
                _mm512_storeu_ps(pd.add(32 * i + 16 * h), _mm512_mul_ps(_mm512_cvtepi32_ps(q), d));
            }
        }
    }
}

fn dequantize_q4_0(src: &[u8], dst: &mut [f32]) {
    // SAFETY: only placed in a table after the AVX-512 tier was detected.
    unsafe { dequantize_q4_0_avx512(src, dst) }
}

fn dequantize_q8_0(src: &[u8], dst: &mut [f32]) {
    // SAFETY: only placed in a table after the AVX-512 tier was detected.
    unsafe { dequantize_q8_0_avx512(src, dst) }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::avx2_and_avx512;
    use crate::dtype::DType;
    use crate::testdata::Xorshift32;

    /// Inputs covering the vector exp's fast lanes, its rare lanes (|x| > 87, overflow and
    /// underflow of exp(-x)), infinities, NaN and signed zeros, at lengths around every step.
    fn inputs(n: usize) -> Vec<f32> {
        let special = [0.0, -0.0, 1.0, -1.0, 88.0, -88.0, 90.0, -90.0, 150.0, -150.0, 200.0];
        let mut r = Xorshift32::from_state(0x9E37_79B9);
        (0..n)
            .map(|i| {
                if i % 13 == 5 {
                    return special[i % special.len()];
                }
                if i == 7 {
                    return f32::INFINITY;
                }
                if i == 9 {
                    return f32::NAN;
                }
                (r.next_u32() as f32 / u32::MAX as f32 - 0.5) * 40.0
            })
            .collect()
    }

    #[test]
    fn avx512_elementwise_kernels_give_the_avx2_tiers_bits() {
        let Some((t2, t5)) = avx2_and_avx512(false) else { return };
        for n in [0usize, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 63, 64, 100, 1000, 3001] {
            let a = inputs(n);
            let b: Vec<f32> = inputs(n + 3)[3..].iter().map(|x| x * 0.5 + 0.25).collect();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            type Bin = crate::kernels::BinaryF32;
            let pairs: [(&str, Bin, Bin); 5] = [
                ("add", t2.add_f32, t5.add_f32),
                ("sub", t2.sub_f32, t5.sub_f32),
                ("mul", t2.mul_f32, t5.mul_f32),
                ("div", t2.div_f32, t5.div_f32),
                ("swiglu", t2.swiglu_f32, t5.swiglu_f32),
            ];
            for (name, k2, k5) in pairs {
                let (mut d2, mut d5) = (vec![0f32; n], vec![0f32; n]);
                // SAFETY: every slice holds n elements; no overlap.
                unsafe {
                    k2(n, d2.as_mut_ptr(), a.as_ptr(), b.as_ptr());
                    k5(n, d5.as_mut_ptr(), a.as_ptr(), b.as_ptr());
                }
                assert_eq!(bits(&d2), bits(&d5), "{name} n={n}");
            }
            let (mut d2, mut d5) = (vec![0f32; n], a.clone());
            // SAFETY: n elements each; the AVX-512 call runs in place (exact aliasing allowed).
            unsafe {
                (t2.silu_f32)(n, d2.as_mut_ptr(), a.as_ptr());
                (t5.silu_f32)(n, d5.as_mut_ptr(), d5.as_ptr());
            }
            assert_eq!(bits(&d2), bits(&d5), "silu n={n}");
            // The streaming SwiGLU into a 64-byte aligned destination (its streamed steps).
            let mut buf = vec![0f32; n + 16];
            let off = buf.as_ptr().align_offset(64);
            let d5 = &mut buf[off..off + n];
            // SAFETY: n elements each; no overlap.
            unsafe { (t5.swiglu_f32_stream)(n, d5.as_mut_ptr(), a.as_ptr(), b.as_ptr()) };
            let mut d2 = vec![0f32; n];
            // SAFETY: as above.
            unsafe { (t2.swiglu_f32)(n, d2.as_mut_ptr(), a.as_ptr(), b.as_ptr()) };
            assert_eq!(bits(&d2), bits(d5), "swiglu stream n={n}");

            // Float dot products and multiply-adds.
            let h = |v: &[f32]| -> Vec<u8> {
                v.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect()
            };
            let f = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
            let a_small: Vec<f32> =
                a.iter().map(|x| if x.is_finite() { x * 0.01 } else { 1.0 }).collect();
            let b_small: Vec<f32> =
                b.iter().map(|x| if x.is_finite() { x * 0.01 } else { 2.0 }).collect();
            for (dt, xa, xb) in
                [(DType::F32, f(&a_small), f(&b_small)), (DType::F16, h(&a_small), h(&b_small))]
            {
                let (k2, k5) = (t2.vec_dot(dt).unwrap(), t5.vec_dot(dt).unwrap());
                assert_eq!(k2(n, &xa, &xb).to_bits(), k5(n, &xa, &xb).to_bits(), "dot {dt} n={n}");
            }
            let (mut m2, mut m5) = (b_small.clone(), b_small.clone());
            (t2.mad_f16)(&mut m2, &h(&a_small), 0.37);
            (t5.mad_f16)(&mut m5, &h(&a_small), 0.37);
            assert_eq!(bits(&m2), bits(&m5), "mad_f16 n={n}");
            (t2.mad_f32)(&mut m2, &a_small, -1.5);
            (t5.mad_f32)(&mut m5, &a_small, -1.5);
            assert_eq!(bits(&m2), bits(&m5), "mad_f32 n={n}");
        }
    }

    /// The float decode tiles give the AVX2 tier's bits for every shape and length.
    #[test]
    fn avx512_float_tiles_give_the_avx2_tiers_bits() {
        let Some((t2, t5)) = avx2_and_avx512(false) else { return };
        for n in [1usize, 31, 32, 33, 64, 100, 4096 + 7] {
            let rows: Vec<Vec<f32>> = (0..6)
                .map(|r| {
                    inputs(n + r)
                        .iter()
                        .skip(r)
                        .map(|x| if x.is_finite() { x * 0.05 } else { 0.5 })
                        .collect()
                })
                .collect();
            for dt in [DType::F32, DType::F16, DType::BF16] {
                let enc = |v: &[f32]| -> Vec<u8> {
                    match dt {
                        DType::F16 => {
                            v.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect()
                        }
                        DType::BF16 => {
                            v.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect()
                        }
                        _ => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                    }
                };
                let bytes: Vec<Vec<u8>> = rows.iter().map(|v| enc(v)).collect();
                let xs: Vec<&[u8]> = bytes[..4].iter().map(|v| &v[..]).collect();
                let ys: Vec<&[u8]> = bytes[4..].iter().map(|v| &v[..]).collect();
                // A type whose decode dots have their own order (BF16 with AVX512_BF16: see
                // `avx512_bf16_dots_follow_ggmls_avx512_bf16_order`).
                if t5.stream_own_order(dt) {
                    continue;
                }
                for r in 1..=4 {
                    for c in 1..=2 {
                        let (mut o2, mut o5) = ([0f32; 8], [0f32; 8]);
                        (t2.gemm(dt).unwrap())(n, &xs[..r], &ys[..c], &mut o2);
                        (t5.gemm(dt).unwrap())(n, &xs[..r], &ys[..c], &mut o5);
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&o2), bits(&o5), "{dt} n={n} {r}x{c}");
                    }
                }
            }
        }
    }

    /// With AVX512_BF16, the matmul kernels' BF16 dot (`vdpbf16ps`) and its tiles: every tile
    /// output is bitwise the dot of its row and column; the dot equals the same order written
    /// out in scalar code (each pair's two products added to the lane, ggml's reduction and
    /// tail), and an f64 sum of the exact products and the AVX2 tier's dot within f32 rounding of
    /// the magnitudes summed.
    #[test]
    fn avx512_bf16_dots_follow_ggmls_avx512_bf16_order() {
        let Some((t2, t5)) = avx2_and_avx512(false) else { return };
        if !std::arch::is_x86_feature_detected!("avx512bf16") {
            return;
        }
        let enc = |v: &[f32]| -> Vec<u8> {
            v.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect()
        };
        let dec = |b: &[u8], i: usize| {
            f32::from_bits((u16::from_le_bytes([b[2 * i], b[2 * i + 1]]) as u32) << 16)
        };
        // ggml's AVX512_BF16 order in scalar code: lane l of accumulator h takes, per 64
        // elements, the pair at 64 k + 32 h + 2 l (odd element first, each product exact in
        // f32 and added with one rounding).
        let scalar = |n: usize, x: &[u8], y: &[u8]| -> f32 {
            let np = n & !63;
            let mut acc = [[0f32; 16]; 2];
            for k in (0..np).step_by(64) {
                for (h, a) in acc.iter_mut().enumerate() {
                    for (l, v) in a.iter_mut().enumerate() {
                        let e = k + 32 * h + 2 * l;
                        *v += dec(x, e + 1) * dec(y, e + 1);
                        *v += dec(x, e) * dec(y, e);
                    }
                }
            }
            let halves = |v: [f32; 16]| {
                let s8: Vec<f32> = (0..8).map(|i| v[i] + v[i + 8]).collect();
                let s4: Vec<f32> = (0..4).map(|i| s8[i] + s8[i + 4]).collect();
                let s2 = [s4[0] + s4[2], s4[1] + s4[3]];
                s2[0] + s2[1]
            };
            let mut sumf = halves(acc[0]) as f64;
            sumf += halves(acc[1]) as f64;
            for t in np..n {
                sumf += (dec(x, t) * dec(y, t)) as f64;
            }
            sumf as f32
        };
        let dot5 = t5.vec_dot_stream(DType::BF16).unwrap();
        let dot2 = t2.vec_dot(DType::BF16).unwrap();
        for n in [1usize, 31, 63, 64, 65, 100, 128, 4096 + 7] {
            let rows: Vec<Vec<u8>> = (0..6)
                .map(|r| {
                    let v: Vec<f32> = inputs(n + r)
                        .iter()
                        .skip(r)
                        .map(|x| if x.is_finite() { x * 0.05 } else { 0.5 })
                        .collect();
                    enc(&v)
                })
                .collect();
            let xs: Vec<&[u8]> = rows[..4].iter().map(|v| &v[..]).collect();
            let ys: Vec<&[u8]> = rows[4..].iter().map(|v| &v[..]).collect();
            for r in 1..=4 {
                for c in 1..=2 {
                    let mut o = [0f32; 8];
                    (t5.gemm(DType::BF16).unwrap())(n, &xs[..r], &ys[..c], &mut o);
                    for cc in 0..c {
                        for rr in 0..r {
                            let want = dot5(n, xs[rr], ys[cc]);
                            assert_eq!(o[cc * r + rr].to_bits(), want.to_bits(), "n={n} {r}x{c}");
                        }
                    }
                }
            }
            for (x, y) in [(xs[0], ys[0]), (xs[3], ys[1])] {
                let got = dot5(n, x, y);
                assert_eq!(got.to_bits(), scalar(n, x, y).to_bits(), "n={n}: scalar order");
                let (exact, mag) = (0..n).fold((0f64, 0f64), |(s, m), i| {
                    let p = dec(x, i) as f64 * dec(y, i) as f64;
                    (s + p, m + p.abs())
                });
                let (got, avx2) = (got as f64, dot2(n, x, y) as f64);
                assert!((got - exact).abs() <= 1e-6 * mag, "n={n}: {got} vs {exact}");
                assert!((got - avx2).abs() <= 1e-6 * mag, "n={n}: {got} vs AVX2 {avx2}");
            }
        }
    }

    /// The two-strip GEMM kernel gives the AVX2 tier's two 6 x 16 tiles bit for bit, with and
    /// without accumulation, for odd and even depths.
    #[test]
    fn avx512_sgemm2_gives_two_avx2_tiles() {
        use crate::kernels::sgemm::{SG_MR, SG_NR};
        let Some((t2, t5)) = avx2_and_avx512(false) else { return };
        let k2 = t5.sgemm2.unwrap();
        for kc in [1usize, 2, 3, 7, 64, 255, 256] {
            let a0: Vec<f32> = inputs(kc * SG_MR).iter().map(|x| x.clamp(-30.0, 30.0)).collect();
            let a1: Vec<f32> = a0.iter().rev().map(|x| x * 0.5 - 1.0).collect();
            let bp: Vec<f32> =
                inputs(kc * SG_NR + 5)[5..].iter().map(|x| x.clamp(-9.0, 9.0)).collect();
            for acc in [false, true] {
                let init: [f32; SG_MR * SG_NR] = std::array::from_fn(|i| i as f32 * 0.25 - 3.0);
                let (mut w0, mut w1, mut g0, mut g1) = (init, init, init, init);
                (t2.sgemm)(kc, &a0, &bp, &mut w0, acc);
                (t2.sgemm)(kc, &a1, &bp, &mut w1, acc);
                k2(kc, &a0, &a1, &bp, &mut g0, &mut g1, acc);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&w0), bits(&g0), "strip 0 kc={kc} acc={acc}");
                assert_eq!(bits(&w1), bits(&g1), "strip 1 kc={kc} acc={acc}");
                // Two strips by two panels.
                let bq: Vec<f32> = bp.iter().map(|x| x * -0.75 + 0.5).collect();
                let (mut w2, mut w3) = (init, init);
                (t2.sgemm)(kc, &a0, &bq, &mut w2, acc);
                (t2.sgemm)(kc, &a1, &bq, &mut w3, acc);
                let mut g = [init; 4];
                let [g00, g01, g10, g11] = &mut g;
                (t5.sgemm22.unwrap())(kc, [&a0, &a1], [&bp, &bq], [g00, g01, g10, g11], acc);
                for (t, want) in [(0, &w0), (1, &w2), (2, &w1), (3, &w3)] {
                    assert_eq!(bits(&g[t]), bits(want), "2x2 tile {t} kc={kc} acc={acc}");
                }
            }
        }
    }

    /// The BF16-pair kernels for two strips, and two strips by two panels, give the one-strip
    /// kernel's tiles bit for bit, with and without accumulation.
    #[test]
    fn avx512_bf16_pair_tiles_give_the_one_strip_tiles() {
        use crate::kernels::sgemm::{SG_MR, SG_NR};
        let Some((_, t5)) = avx2_and_avx512(false) else { return };
        let Some((one, two, four)) = t5.sgemm_bf16 else {
            eprintln!("skipped: no AVX512_BF16 on this CPU");
            return;
        };
        // Slots of two BF16 values (finite, mixed magnitudes and signs).
        let pairs = |n: usize, seed: usize, scale: f32| -> Vec<f32> {
            let v: Vec<f32> = inputs(2 * n + seed)[seed..]
                .iter()
                .map(|x| if x.is_finite() { x.clamp(-40.0, 40.0) * scale } else { 0.75 })
                .collect();
            v.chunks_exact(2)
                .map(|p| f32::from_bits((p[0].to_bits() >> 16) | (p[1].to_bits() & 0xFFFF_0000)))
                .collect()
        };
        for kc in [1usize, 2, 7, 128] {
            let (a0, a1) = (pairs(kc * SG_MR, 0, 1.0), pairs(kc * SG_MR, 3, -0.5));
            let (b0, b1) = (pairs(kc * SG_NR, 5, 0.25), pairs(kc * SG_NR, 9, 2.0));
            for acc in [false, true] {
                let init: [f32; SG_MR * SG_NR] = std::array::from_fn(|i| i as f32 * 0.5 - 7.0);
                let mut want = [init; 4];
                for (t, (a, b)) in
                    [(&a0, &b0), (&a0, &b1), (&a1, &b0), (&a1, &b1)].iter().enumerate()
                {
                    one(kc, a, b, &mut want[t], acc);
                }
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                let (mut g0, mut g1) = (init, init);
                two(kc, &a0, &a1, &b0, &mut g0, &mut g1, acc);
                assert_eq!(bits(&g0), bits(&want[0]), "two strips, strip 0 kc={kc} acc={acc}");
                assert_eq!(bits(&g1), bits(&want[2]), "two strips, strip 1 kc={kc} acc={acc}");
                let mut g = [init; 4];
                let [g00, g01, g10, g11] = &mut g;
                four(kc, [&a0, &a1], [&b0, &b1], [g00, g01, g10, g11], acc);
                for t in 0..4 {
                    assert_eq!(bits(&g[t]), bits(&want[t]), "2x2 tile {t} kc={kc} acc={acc}");
                }
            }
        }
    }

    /// The AVX-512 dequantizers give the format's (ggml's) floats, bit for bit.
    #[test]
    fn avx512_dequantizers_give_the_formats_floats() {
        let Some((_, t5)) = avx2_and_avx512(false) else { return };
        let v: Vec<f32> =
            inputs(32 * 37).iter().map(|x| if x.is_finite() { *x } else { 3.0 }).collect();
        for dt in [DType::Q4_0, DType::Q8_0] {
            let mut q = vec![0u8; v.len() / 32 * dt.type_size()];
            crate::quant::quantize(dt, &v, &mut q).unwrap();
            // A block with a NaN scale and one with an infinite one, as data can hold.
            q[0..2].copy_from_slice(&0x7e00u16.to_le_bytes());
            q[dt.type_size()..dt.type_size() + 2].copy_from_slice(&0x7c00u16.to_le_bytes());
            let (mut want, mut got) = (vec![0f32; v.len()], vec![0f32; v.len()]);
            (crate::quant::format(dt).dequantize.unwrap())(&q, &mut want);
            (t5.to_f32(dt).unwrap())(&q, &mut got);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&want), bits(&got), "{dt}");
        }
    }
}
