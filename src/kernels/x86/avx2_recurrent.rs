//! AVX2 + FMA builds of the recurrent ops' inner loops (`../recurrent.rs`): the same portable
//! bodies compiled with the features enabled, so LLVM vectorises them with 256-bit FMAs, and
//! `ssm_scan_row` written with intrinsics. Same operations in the same order as the portable set,
//! so the results are bitwise equal. Needs AVX2 and FMA.

use crate::kernels::recurrent::{
    LANES, RecurrentKernels, gla_row_body, reduce16, wkv6_row_body, wkv6_rows4_body, wkv7_row_body,
};

/// `ssm_scan_row_body` written with intrinsics (LLVM's vectoriser splits the 16 lane
/// accumulators badly): the same operations in the same order, lanes 0..8 and 8..16 in two
/// registers, then the same tail and reduction tree.
#[target_feature(enable = "avx2,fma")]
fn ssm_scan_row_avx2(s: &mut [f32], b: &[f32], c: &[f32], da: f32, x_dt: f32) -> f32 {
    use std::arch::x86_64::*;
    let n = s.len().min(b.len()).min(c.len());
    let full = n / LANES * LANES;
    let (vda, vx) = (_mm256_set1_ps(da), _mm256_set1_ps(x_dt));
    let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let (ps, pb, pc) = (s.as_mut_ptr(), b.as_ptr(), c.as_ptr());
    let mut i = 0;
    while i < full {
        // SAFETY: i + 16 <= full <= n, and n is at most the length of each slice.
        unsafe {
            let st0 = _mm256_add_ps(
                _mm256_mul_ps(_mm256_loadu_ps(ps.add(i)), vda),
                _mm256_mul_ps(_mm256_loadu_ps(pb.add(i)), vx),
            );
            let st1 = _mm256_add_ps(
                _mm256_mul_ps(_mm256_loadu_ps(ps.add(i + 8)), vda),
                _mm256_mul_ps(_mm256_loadu_ps(pb.add(i + 8)), vx),
            );
            _mm256_storeu_ps(ps.add(i), st0);
            _mm256_storeu_ps(ps.add(i + 8), st1);
            a0 = _mm256_fmadd_ps(st0, _mm256_loadu_ps(pc.add(i)), a0);
            a1 = _mm256_fmadd_ps(st1, _mm256_loadu_ps(pc.add(i + 8)), a1);
        }
        i += LANES;
    }
    let mut acc = [0f32; LANES];
    // SAFETY: acc holds 16 floats: two stores of 8.
    unsafe {
        _mm256_storeu_ps(acc.as_mut_ptr(), a0);
        _mm256_storeu_ps(acc.as_mut_ptr().add(8), a1);
    }
    for i in full..n {
        let st = s[i] * da + b[i] * x_dt;
        s[i] = st;
        acc[i - full] = st.mul_add(c[i], acc[i - full]);
    }
    reduce16(acc)
}
#[target_feature(enable = "avx2,fma")]
fn wkv6_row_avx2(s: &mut [f32], out: &mut [f32], v: &[f32], k: f32, r: f32, tf: f32, td: f32) {
    wkv6_row_body(s, out, v, k, r, tf, td)
}
#[target_feature(enable = "avx2,fma")]
fn wkv6_rows4_avx2(
    s: &mut [f32],
    out: &mut [f32],
    v: &[f32],
    k: [f32; 4],
    r: [f32; 4],
    tf: [f32; 4],
    td: [f32; 4],
) {
    wkv6_rows4_body(s, out, v, k, r, tf, td)
}
#[target_feature(enable = "avx2,fma")]
fn gla_row_avx2(s: &mut [f32], out: &mut [f32], v: &[f32], k: f32, q: f32, g: f32) {
    gla_row_body(s, out, v, k, q, g)
}
#[target_feature(enable = "avx2,fma")]
fn wkv7_row_avx2(s: &mut [f32], rwkab: [&[f32]; 5], v: f32) -> f32 {
    wkv7_row_body(s, rwkab, v)
}

fn ssm_scan_row(s: &mut [f32], b: &[f32], c: &[f32], da: f32, x_dt: f32) -> f32 {
    // SAFETY: this function is private; the only way out of this file is `kernels`, which takes
    // an `Avx2` token, made only for a CPU with the AVX2 tier (AVX2, FMA).
    unsafe { ssm_scan_row_avx2(s, b, c, da, x_dt) }
}
fn wkv6_row(s: &mut [f32], out: &mut [f32], v: &[f32], k: f32, r: f32, tf: f32, td: f32) {
    // SAFETY: as above.
    unsafe { wkv6_row_avx2(s, out, v, k, r, tf, td) }
}
fn wkv6_rows4(
    s: &mut [f32],
    out: &mut [f32],
    v: &[f32],
    k: [f32; 4],
    r: [f32; 4],
    tf: [f32; 4],
    td: [f32; 4],
) {
    // SAFETY: as above.
    unsafe { wkv6_rows4_avx2(s, out, v, k, r, tf, td) }
}
fn gla_row(s: &mut [f32], out: &mut [f32], v: &[f32], k: f32, q: f32, g: f32) {
    // SAFETY: as above.
    unsafe { gla_row_avx2(s, out, v, k, q, g) }
}
fn wkv7_row(s: &mut [f32], rwkab: [&[f32]; 5], v: f32) -> f32 {
    // SAFETY: as above.
    unsafe { wkv7_row_avx2(s, rwkab, v) }
}

/// The AVX2 set (the `recurrent` entry of the tier's table), for a CPU that `cpu` proves runs it.
pub(crate) fn kernels(cpu: super::Avx2) -> RecurrentKernels {
    let _ = cpu;
    RecurrentKernels { ssm_scan_row, wkv6_row, wkv6_rows4, gla_row, wkv7_row }
}
