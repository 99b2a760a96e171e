//! AVX2 tier (needs AVX2, FMA and F16C; checked once by `Isa::Avx2.is_supported()` before any of
//! these entries enter a `KernelTable`).

use crate::kernels::{KernelTable, scalar};

/// Installs this file's entries (called by `plug_avx2`). The wrappers below are private and
/// leave this file only through here, so holding `Avx2` is what makes calling them sound.
pub(crate) fn plug(t: &mut KernelTable, _: super::Avx2) {
    t.dot_f32 = dot_f32;
    t.exp_sub_sum_f32 = exp_sub_sum_f32;
    t.f16_to_f32 = f16_to_f32;
    t.sum_sq_f64 = sum_sq_f64;
    t.f16_bytes_to_f32 = f16_bytes_to_f32;
    t.mad_f16 = mad_f16;
    t.mad_f32 = mad_f32;
    t.set_from_float(crate::dtype::DType::Q8_0, from_float_q8_0);
    t.set_from_float(crate::dtype::DType::Q8_1, from_float_q8_1);
    t.relu_f32 = relu_f32;
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_f32_avx2(a: &[f32], b: &[f32]) -> f32 {
    scalar::dot_f32_body(a, b)
}

/// Dot product of two f32 slices.
fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    // SAFETY: private, installed only by `plug`, which takes an `Avx2` token (AVX2/FMA/F16C).
    unsafe { dot_f32_avx2(a, b) }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn sum_sq_f64_avx2(x: &[f32]) -> f64 {
    scalar::sum_sq_f64_body(x)
}

/// Sum of squares in f64 (AVX2 build of the scalar body).
fn sum_sq_f64(x: &[f32]) -> f64 {
    // SAFETY: private, installed only by `plug`, which takes an `Avx2` token (AVX2/FMA/F16C).
    unsafe { sum_sq_f64_avx2(x) }
}

macro_rules! unary_kernels {
    ($($name:ident => $f:path;)*) => {$(
        /// Elementwise kernel over `n` f32 values (AVX2 build of the scalar body).
        ///
        /// # Safety
        /// As the scalar version, and the CPU supports AVX2/FMA/F16C.
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $name(n: usize, dst: *mut f32, a: *const f32) {
            for i in 0..n {
                // SAFETY: i < n and the caller guarantees n valid elements behind both pointers.
                unsafe { *dst.add(i) = $f(*a.add(i)) };
            }
        }
    )*};
}
unary_kernels! {
    relu_f32 => scalar::relu;
}

/// The polynomial of ggml's vector expf: p(b) - 1 for the reduced argument b, so that
/// exp = 2^n * (1 + p) is formed as `fma(j, k, k)` (shared by every variant of the exp).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn v_expf_poly(b: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let u = _mm256_mul_ps(b, b);
    _mm256_fmadd_ps(
        _mm256_fmadd_ps(
            _mm256_fmadd_ps(
                _mm256_set1_ps(f32::from_bits(0x3c07_2010)),
                b,
                _mm256_set1_ps(f32::from_bits(0x3d2b_9f17)),
            ),
            u,
            _mm256_fmadd_ps(
                _mm256_set1_ps(f32::from_bits(0x3e2a_af33)),
                b,
                _mm256_set1_ps(f32::from_bits(0x3eff_fedb)),
            ),
        ),
        u,
        _mm256_mul_ps(_mm256_set1_ps(f32::from_bits(0x3f7f_fff6)), b),
    )
}

/// Vector expf with about 1 ulp accuracy: exp(x) = 2^n * p(b) where n = round(x / ln 2) and b the
/// reduced argument, with the coefficients and the overflow/underflow handling of the ARM
/// optimized-routines algorithm that ggml's `ggml_v_expf` uses (results match it bit for bit).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn v_expf(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let r = _mm256_set1_ps(f32::from_bits(0x4b40_0000)); // 0x1.8p23
    let z = _mm256_fmadd_ps(x, _mm256_set1_ps(f32::from_bits(0x3fb8_aa3b)), r); // 1/ln2
    let n = _mm256_sub_ps(z, r);
    let b = _mm256_fnmadd_ps(
        n,
        _mm256_set1_ps(f32::from_bits(0x35bf_be8e)), // ln2 low part
        _mm256_fnmadd_ps(n, _mm256_set1_ps(f32::from_bits(0x3f31_7200)), x), // ln2 high part
    );
    let e = _mm256_slli_epi32::<23>(_mm256_castps_si256(z));
    let k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1.0))));
    let abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
    let c = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(126.0)));
    let j = v_expf_poly(b);
    if _mm256_movemask_ps(_mm256_castsi256_ps(c)) == 0 {
        return _mm256_fmadd_ps(j, k, k);
    }
    let g = _mm256_and_si256(
        _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps())),
        _mm256_set1_epi32(0x8200_0000u32 as i32),
    );
    let s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f00_0000)));
    let s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    let d = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(192.0)));
    _mm256_or_ps(
        _mm256_and_ps(_mm256_castsi256_ps(d), _mm256_mul_ps(s1, s1)),
        _mm256_andnot_ps(
            _mm256_castsi256_ps(d),
            _mm256_or_ps(
                _mm256_and_ps(
                    _mm256_castsi256_ps(c),
                    _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1),
                ),
                _mm256_andnot_ps(_mm256_castsi256_ps(c), _mm256_fmadd_ps(k, j, k)),
            ),
        ),
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
fn f16_to_f32_avx2(src: &[u16], dst: &mut [f32]) {
    use std::arch::x86_64::*;
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n <= both lengths.
        unsafe {
            let h = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        }
        i += 8;
    }
    for k in i..n {
        dst[k] = crate::quant::util::fp16_to_fp32(src[k]);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn f16_bytes_to_f32_avx2(src: &[u8], dst: &mut [f32]) {
    use std::arch::x86_64::*;
    let n = (src.len() / 2).min(dst.len());
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n: 16 bytes of src and 8 floats of dst are in bounds.
        unsafe {
            let h = _mm_loadu_si128(src.as_ptr().add(2 * i) as *const __m128i);
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        }
        i += 8;
    }
    for k in i..n {
        dst[k] = crate::quant::util::fp16_to_fp32(u16::from_le_bytes([src[2 * k], src[2 * k + 1]]));
    }
}

/// f16 little-endian bytes to f32 with F16C.
fn f16_bytes_to_f32(src: &[u8], dst: &mut [f32]) {
    // SAFETY: private, installed only by `plug`, which takes an `Avx2` token (AVX2/FMA/F16C).
    unsafe { f16_bytes_to_f32_avx2(src, dst) }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn mad_f16_avx2(acc: &mut [f32], v: &[u8], s: f32) {
    use std::arch::x86_64::*;
    let n = (v.len() / 2).min(acc.len());
    let vs = _mm256_set1_ps(s);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n: 16 bytes of v and 8 floats of acc are in bounds.
        unsafe {
            let h = _mm256_cvtph_ps(_mm_loadu_si128(v.as_ptr().add(2 * i) as *const __m128i));
            let a = _mm256_loadu_ps(acc.as_ptr().add(i));
            _mm256_storeu_ps(acc.as_mut_ptr().add(i), _mm256_fmadd_ps(h, vs, a));
        }
        i += 8;
    }
    for k in i..n {
        let h = crate::quant::util::fp16_to_fp32(u16::from_le_bytes([v[2 * k], v[2 * k + 1]]));
        acc[k] = h.mul_add(s, acc[k]);
    }
}

/// acc += f16(v) * s with F16C and FMA.
fn mad_f16(acc: &mut [f32], v: &[u8], s: f32) {
    // SAFETY: private, installed only by `plug`, which takes an `Avx2` token (AVX2/FMA/F16C).
    unsafe { mad_f16_avx2(acc, v, s) }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn mad_f32_avx2(acc: &mut [f32], v: &[f32], s: f32) {
    scalar::mad_f32_body(acc, v, s)
}

/// acc += v * s (AVX2 build of the scalar body).
fn mad_f32(acc: &mut [f32], v: &[f32], s: f32) {
    // SAFETY: private, installed only by `plug`, which takes an `Avx2` token (AVX2/FMA/F16C).
    unsafe { mad_f32_avx2(acc, v, s) }
}

/// f16 bits to f32 with F16C.
fn f16_to_f32(src: &[u16], dst: &mut [f32]) {
    // SAFETY: private, installed only by `plug`, which takes an `Avx2` token (AVX2/FMA/F16C).
    unsafe { f16_to_f32_avx2(src, dst) }
}

/// One block of ggml's AVX2 `quantize_row_q8_0`/`q8_1`: the f16 scale bits, the packed quants
/// and the sum of the unpacked 32-bit quants (for Q8_1).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn q8_block(x: &[f32]) -> (u16, [i8; 32], i32, f32) {
    use std::arch::x86_64::*;
    debug_assert!(x.len() >= 32);
    // SAFETY: the caller passes at least 32 floats (one block).
    let v = unsafe {
        [
            _mm256_loadu_ps(x.as_ptr()),
            _mm256_loadu_ps(x.as_ptr().add(8)),
            _mm256_loadu_ps(x.as_ptr().add(16)),
            _mm256_loadu_ps(x.as_ptr().add(24)),
        ]
    };
    let sign = _mm256_set1_ps(-0.0);
    let mut max_abs = _mm256_andnot_ps(sign, v[0]);
    for vk in &v[1..] {
        max_abs = _mm256_max_ps(max_abs, _mm256_andnot_ps(sign, *vk));
    }
    let mut m4 = _mm_max_ps(_mm256_extractf128_ps::<1>(max_abs), _mm256_castps256_ps128(max_abs));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    let max = _mm_cvtss_f32(m4);
    let d = max / 127.0;
    let dh = _mm_extract_epi16::<0>(_mm_cvtps_ph::<0>(_mm_set_ss(d))) as u16;
    let id = _mm256_set1_ps(if max != 0.0 { 127.0 / max } else { 0.0 });
    let q: [__m256i; 4] = std::array::from_fn(|k| {
        _mm256_cvtps_epi32(_mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(v[k], id),
        ))
    });
    let sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    let mut lanes = [0i32; 8];
    // SAFETY: lanes holds 8 i32.
    unsafe { _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, sum) };
    let total = lanes.iter().fold(0i32, |a, &b| a.wrapping_add(b));
    let p01 = _mm256_packs_epi32(q[0], q[1]);
    let p23 = _mm256_packs_epi32(q[2], q[3]);
    let p = _mm256_packs_epi16(p01, p23);
    let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    let mut out = [0i8; 32];
    // SAFETY: out holds 32 bytes.
    unsafe { _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, p) };
    (dh, out, total, d)
}

/// ggml's AVX2 `quantize_row_q8_0` (Q8_0's CPU `from_float`): same bytes as the scalar emulation.
fn from_float_q8_0(src: &[f32], dst: &mut [u8]) {
    // SAFETY: private, installed only by `plug`, which takes an `Avx2` token (AVX2/FMA/F16C).
    unsafe { from_float_q8_0_avx2(src, dst) }
}

/// The row loop compiled for AVX2 too, so `q8_block` inlines into it (no call per block).
#[target_feature(enable = "avx2,fma,f16c")]
fn from_float_q8_0_avx2(src: &[f32], dst: &mut [u8]) {
    for (x, y) in src.chunks_exact(32).zip(dst.chunks_exact_mut(34)) {
        let (dh, q, _, _) = q8_block(x);
        y[..2].copy_from_slice(&dh.to_le_bytes());
        y[2..].copy_from_slice(bytemuck::cast_slice(&q));
    }
}

/// ggml's AVX2 `quantize_row_q8_1` (Q8_1's CPU `from_float`).
fn from_float_q8_1(src: &[f32], dst: &mut [u8]) {
    // SAFETY: private, installed only by `plug`, which takes an `Avx2` token (AVX2/FMA/F16C).
    unsafe { from_float_q8_1_avx2(src, dst) }
}

/// The row loop compiled for AVX2 too, so `q8_block` and the f16 conversion inline into it.
#[target_feature(enable = "avx2,fma,f16c")]
fn from_float_q8_1_avx2(src: &[f32], dst: &mut [u8]) {
    use std::arch::x86_64::*;
    for (x, y) in src.chunks_exact(32).zip(dst.chunks_exact_mut(36)) {
        let (dh, q, total, d) = q8_block(x);
        let sh = _mm_extract_epi16::<0>(_mm_cvtps_ph::<0>(_mm_set_ss(d * total as f32))) as u16;
        y[..2].copy_from_slice(&dh.to_le_bytes());
        y[2..4].copy_from_slice(&sh.to_le_bytes());
        y[4..].copy_from_slice(bytemuck::cast_slice(&q));
    }
}

/// dst[i] = exp(dst[i] - max) for `n` values; returns their sum (f64 over 8-lane partial sums,
/// as ggml's `ggml_vec_soft_max_f32`).
///
/// # Safety
/// `dst` is valid for `n` reads and writes; the CPU supports AVX2/FMA/F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn exp_sub_sum_f32(n: usize, dst: *mut f32, max: f32) -> f64 {
    use std::arch::x86_64::*;
    let mut sum = 0f64;
    let mut i = 0;
    let m = _mm256_set1_ps(max);
    while i + 8 <= n {
        // SAFETY: i + 8 <= n.
        unsafe {
            let v = v_expf(_mm256_sub_ps(_mm256_loadu_ps(dst.add(i)), m));
            _mm256_storeu_ps(dst.add(i), v);
            let h = _mm_add_ps(_mm256_extractf128_ps::<1>(v), _mm256_castps256_ps128(v));
            let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
            let h = _mm_add_ss(h, _mm_movehdup_ps(h));
            sum += _mm_cvtss_f32(h) as f64;
        }
        i += 8;
    }
    while i < n {
        // SAFETY: i < n.
        unsafe {
            let v = (*dst.add(i) - max).exp();
            *dst.add(i) = v;
            sum += v as f64;
        }
        i += 1;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::Isa;
    use crate::kernels::x86::avx2_elementwise::{
        add_f32, div_f32, gelu_f32, mul_f32, silu_f32, sub_f32,
    };

    #[test]
    fn v_expf_is_accurate_across_the_range() {
        if !Isa::Avx2.is_supported() {
            eprintln!("skipped: no AVX2");
            return;
        }
        let mut xs: Vec<f32> = (-2000..=2000).map(|i| i as f32 * 0.0517).collect();
        xs.extend([
            -104.0,
            -87.5,
            -0.0,
            0.0,
            1e-30,
            88.0,
            88.7,
            89.0,
            120.0,
            -150.0,
            f32::NEG_INFINITY,
        ]);
        for chunk in xs.chunks(8) {
            let mut v = [0f32; 8];
            v[..chunk.len()].copy_from_slice(chunk);
            let mut out = [0f32; 8];
            // SAFETY: AVX2 checked above; v and out hold 8 f32.
            unsafe {
                use std::arch::x86_64::*;
                _mm256_storeu_ps(out.as_mut_ptr(), v_expf(_mm256_loadu_ps(v.as_ptr())));
            }
            for (x, y) in v.iter().zip(out) {
                let want = (*x as f64).exp();
                if want > f32::MAX as f64 {
                    assert!(y.is_infinite(), "exp({x}) = {y}");
                } else if want < 1e-38 {
                    assert!(y.abs() < 1e-37, "exp({x}) = {y}");
                } else {
                    assert!(((y as f64 - want) / want).abs() < 3e-7, "exp({x}) = {y}, want {want}");
                }
            }
        }
    }

    #[test]
    fn elementwise_and_dot_match_scalar() {
        if !Isa::Avx2.is_supported() {
            eprintln!("skipped: no AVX2");
            return;
        }
        type Bin = unsafe fn(usize, *mut f32, *const f32, *const f32);
        type Un = unsafe fn(usize, *mut f32, *const f32);
        let bins: [(&str, Bin, Bin); 4] = [
            ("add", add_f32, scalar::add_f32),
            ("sub", sub_f32, scalar::sub_f32),
            ("mul", mul_f32, scalar::mul_f32),
            ("div", div_f32, scalar::div_f32),
        ];
        let uns: [(&str, Un, Un); 2] =
            [("gelu", gelu_f32, scalar::gelu_f32), ("relu", relu_f32, scalar::relu_f32)];
        for n in [0usize, 1, 7, 8, 9, 31, 100] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 5.0).collect();
            let b: Vec<f32> = (0..n).map(|i| 1.5 + (i as f32 * 0.11).cos()).collect();
            for (name, f, g) in bins {
                let (mut x, mut y) = (vec![0f32; n], vec![0f32; n]);
                // SAFETY: n elements behind every pointer; AVX2 checked above.
                unsafe {
                    f(n, x.as_mut_ptr(), a.as_ptr(), b.as_ptr());
                    g(n, y.as_mut_ptr(), a.as_ptr(), b.as_ptr());
                }
                assert_eq!(x, y, "{name} n={n}");
            }
            for (name, f, g) in uns {
                let (mut x, mut y) = (vec![0f32; n], vec![0f32; n]);
                // SAFETY: as above.
                unsafe {
                    f(n, x.as_mut_ptr(), a.as_ptr());
                    g(n, y.as_mut_ptr(), a.as_ptr());
                }
                assert_eq!(x, y, "{name} n={n}");
            }
            let (p, q) = (dot_f32(&a, &b), scalar::dot_f32(&a, &b));
            let mag: f32 = a.iter().zip(&b).map(|(x, y)| (x * y).abs()).sum();
            assert!((p - q).abs() <= 1e-6 * mag.max(1e-30), "dot n={n}: {p} vs {q}");
        }
    }

    #[test]
    fn f16_rows_mad_and_sum_sq_match_scalar() {
        if !Isa::Avx2.is_supported() {
            eprintln!("skipped: no AVX2");
            return;
        }
        for n in [0usize, 1, 7, 8, 9, 33, 128] {
            let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.913).cos() * 7.0).collect();
            let h: Vec<u8> =
                x.iter().flat_map(|&v| half::f16::from_f32(v).to_bits().to_le_bytes()).collect();
            // Odd byte offset: the kernels must not assume alignment.
            let mut hb = vec![0u8; h.len() + 1];
            hb[1..].copy_from_slice(&h);
            let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
            f16_bytes_to_f32(&hb[1..], &mut a);
            scalar::f16_bytes_to_f32(&h, &mut b);
            assert_eq!(a, b, "f16 row n={n}");
            let (mut c, mut d) = (x.clone(), x.clone());
            mad_f16(&mut c, &hb[1..], 0.37);
            scalar::mad_f16(&mut d, &h, 0.37);
            assert_eq!(c, d, "mad_f16 n={n}");
            let (mut e, mut f) = (x.clone(), x.clone());
            mad_f32(&mut e, &b, -1.5);
            scalar::mad_f32(&mut f, &b, -1.5);
            assert_eq!(e, f, "mad_f32 n={n}");
            let (p, q) = (sum_sq_f64(&x), scalar::sum_sq_f64(&x));
            assert!((p - q).abs() <= 1e-12 * q.abs(), "sum_sq n={n}: {p} vs {q}");
        }
    }

    #[test]
    fn q8_converters_give_the_scalar_tiers_bytes() {
        if !Isa::Avx2.is_supported() {
            eprintln!("skipped: no AVX2");
            return;
        }
        use crate::dtype::DType;
        let mut x: Vec<f32> =
            (0..32 * 40).map(|i| ((i as f32 * 0.7311).sin() * 3.0).powi(3)).collect();
        // Edge blocks: zeros, a NaN, infinities, huge, tiny, exact halves.
        x[32..64].fill(0.0);
        x[70] = f32::NAN;
        x[100] = f32::INFINITY;
        x[140] = -f32::INFINITY;
        for (k, v) in x[160..192].iter_mut().enumerate() {
            *v = 1e30 * (k as f32 - 16.0);
        }
        for (k, v) in x[192..224].iter_mut().enumerate() {
            *v = 1e-30 * (k as f32 - 16.0);
        }
        for (k, v) in x[224..256].iter_mut().enumerate() {
            *v = (k as f32 - 16.0) * 0.5 * (127.0 / 8.0) / 127.0 * 16.0;
        }
        for (dt, f) in [
            (DType::Q8_0, from_float_q8_0 as fn(&[f32], &mut [u8])),
            (DType::Q8_1, from_float_q8_1),
        ] {
            let n = dt.row_size(x.len()).unwrap();
            let (mut a, mut b) = (vec![0u8; n], vec![0u8; n]);
            f(&x, &mut a);
            (crate::quant::format(dt).from_float.unwrap())(&x, &mut b);
            assert_eq!(a, b, "{dt}");
        }
    }

    #[test]
    fn silu_and_softmax_exp_match_scalar() {
        if !Isa::Avx2.is_supported() {
            eprintln!("skipped: no AVX2");
            return;
        }
        for n in [1usize, 7, 8, 9, 16, 17, 25, 100] {
            let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 12.0).collect();
            let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
            // SAFETY: n elements behind each pointer; AVX2 checked above.
            unsafe {
                silu_f32(n, a.as_mut_ptr(), x.as_ptr());
                scalar::silu_f32(n, b.as_mut_ptr(), x.as_ptr());
            }
            for (p, q) in a.iter().zip(&b) {
                assert!((p - q).abs() <= 1e-6 * q.abs().max(1e-3), "silu {p} vs {q}");
            }
            let (mut c, mut d) = (x.clone(), x.clone());
            // SAFETY: as above.
            let (s1, s2) = unsafe {
                (
                    exp_sub_sum_f32(n, c.as_mut_ptr(), 12.0),
                    scalar::exp_sub_sum_f32(n, d.as_mut_ptr(), 12.0),
                )
            };
            assert!((s1 - s2).abs() <= 1e-6 * s2.abs(), "sum {s1} vs {s2}");
            for (p, q) in c.iter().zip(&d) {
                assert!((p - q).abs() <= 1e-6 * q.abs().max(1e-30), "exp {p} vs {q}");
            }
        }
    }
}
