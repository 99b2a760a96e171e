//! AVX2 + FMA float GEMM micro-kernel: a 6 x 16 register tile (12 accumulators), six weight values
//! broadcast against two 8-lane loads of the packed activation panel per step. Same contract as
//! the portable `sgemm_6x16` in `../sgemm.rs`.

use std::arch::x86_64::*;

use crate::kernels::sgemm::{SG_MR, SG_NR, check};

/// See `crate::kernels::sgemm`. Installed by `plug_avx2` only on CPUs with AVX2 and FMA.
pub(crate) fn sgemm_6x16(
    kc: usize,
    a: &[f32],
    bp: &[f32],
    out: &mut [f32; SG_MR * SG_NR],
    acc: bool,
) {
    check(kc, a, bp);
    // SAFETY: `check` proved the strip holds `kc * 6` values and the panel `kc * 16`; `out`
    // holds 6 x 16. `plug_avx2` installs this function only after AVX2 and FMA were detected.
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
