//! AVX2 (+FMA, F16C) elementwise kernels for the LLM ops: fused SwiGLU, GELU through ggml's f16
//! table with gathers, neox rope rotation, attention score scaling and a row max. Same names and
//! contracts as the twins in `../scalar.rs`; installed by [`plug`] only when the tier is selected.

use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::avx2::v_expf;
use crate::kernels::{KernelTable, scalar, tables};

/// Overwrites the entries this file implements (called after `plug_avx2`).
pub(crate) fn plug(t: &mut KernelTable) {
    t.swiglu_f32 = swiglu_f32;
    t.rope_rotate_f32 = rope_rotate_f32;
    t.scale_add_f32 = scale_add_f32;
    t.max_f32 = max_f32;
}

/// SwiGLU in one pass: silu(x) = x / (1 + exp(-x)) with ggml's vector exp, times g (the same
/// operations, in the same order, as the silu kernel followed by the multiply kernel).
///
/// # Safety
/// As `scalar::swiglu_f32`, and the CPU supports AVX2/FMA/F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn swiglu_f32(n: usize, dst: *mut f32, x: *const f32, g: *const f32) {
    let one = _mm256_set1_ps(1.0);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n keeps the loads and the store inside the n elements; the loads
        // of a lane group precede its store (exact aliasing is fine).
        unsafe {
            let v = _mm256_loadu_ps(x.add(i));
            let e = v_expf(_mm256_sub_ps(_mm256_setzero_ps(), v));
            let s = _mm256_div_ps(v, _mm256_add_ps(one, e));
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
pub(crate) fn max_f32(x: &[f32]) -> f32 {
    // SAFETY: only placed in a table after AVX2/FMA/F16C were detected.
    unsafe { max_f32_avx2(x) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn avx2() -> bool {
        crate::kernels::Isa::Avx2.is_supported()
    }

    fn data(n: usize, seed: u32, amp: f32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                ((s >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0) * amp
            })
            .collect()
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
                super::super::avx2::silu_vexp_f32(n, b.as_mut_ptr(), x.as_ptr());
                super::super::avx2::mul_f32(n, b.as_mut_ptr(), b.as_ptr(), g.as_ptr());
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
