//! Float GEMM micro-kernel (portable tier; the AVX2 twin is `x86/avx2_sgemm.rs`).
//!
//! A micro-kernel multiplies one packed strip of [`SG_MR`] weight rows (`a`: `kc` groups of 6 f32,
//! value `r` of group `k` holding row `r`'s element `k`) by one packed activation panel (`bp`: `kc`
//! groups of [`SG_NR`] f32, value `c` of group `k` holding column `c`'s element `k`) and writes
//! `out[r * SG_NR + c] = sum_k a[k][r] * bp[k][c]`, accumulated in k order from zero, then added
//! to `out` (when `acc`) or stored. The `mul_mat` driver (`ops/mul_mat_f.rs`) sums these partial
//! sums block by block of `kc`, in the same order whatever the thread count.

/// Weight rows per micro-kernel call.
pub(crate) const SG_MR: usize = 6;
/// Activation columns per packed panel.
pub(crate) const SG_NR: usize = 16;

/// See the module docs; with `acc` the products are added to `out` instead of replacing it.
/// Panics if a slice is shorter than `kc` groups (an internal bug).
pub(crate) type SgemmFn =
    fn(kc: usize, a: &[f32], bp: &[f32], out: &mut [f32; SG_MR * SG_NR], acc: bool);

/// Checks the slice lengths every tier relies on.
#[inline(always)]
pub(crate) fn check(kc: usize, a: &[f32], bp: &[f32]) {
    assert!(a.len() >= kc * SG_MR, "sgemm: weight strip too short");
    assert!(bp.len() >= kc * SG_NR, "sgemm: activation panel too short");
}

/// Portable micro-kernel (plain multiply and add, vectorised by the compiler where it can).
pub(crate) fn sgemm_6x16(
    kc: usize,
    a: &[f32],
    bp: &[f32],
    out: &mut [f32; SG_MR * SG_NR],
    acc: bool,
) {
    check(kc, a, bp);
    let mut t = [0f32; SG_MR * SG_NR];
    for k in 0..kc {
        let b: &[f32; SG_NR] = bp[k * SG_NR..(k + 1) * SG_NR].try_into().unwrap();
        for r in 0..SG_MR {
            let av = a[k * SG_MR + r];
            let o = &mut t[r * SG_NR..(r + 1) * SG_NR];
            for c in 0..SG_NR {
                o[c] += av * b[c];
            }
        }
    }
    for (o, v) in out.iter_mut().zip(t) {
        *o = if acc { *o + v } else { v };
    }
}
