//! AVX2 tier (needs AVX2, FMA and F16C; checked once by `Isa::Avx2.is_supported()` before any of
//! these entries enter a `KernelTable`).

use crate::kernels::scalar;

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_f32_avx2(a: &[f32], b: &[f32]) -> f32 {
    scalar::dot_f32_body(a, b)
}

/// Dot product of two f32 slices.
pub(crate) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    // SAFETY: this function is only placed in a table after AVX2/FMA/F16C were detected.
    unsafe { dot_f32_avx2(a, b) }
}

macro_rules! binary_kernels {
    ($($name:ident => $op:tt;)*) => {$(
        /// Elementwise kernel over `n` f32 values (AVX2).
        ///
        /// # Safety
        /// As `scalar::add_f32`: valid pointers for `n` elements, exact aliasing only; and the CPU
        /// supports AVX2/FMA/F16C.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(crate) unsafe fn $name(n: usize, dst: *mut f32, a: *const f32, b: *const f32) {
            let mut i = 0;
            while i + 8 <= n {
                // SAFETY: i + 8 <= n keeps the 8-lane loads and store within the n elements.
                unsafe {
                    use std::arch::x86_64::*;
                    let x = _mm256_loadu_ps(a.add(i));
                    let y = _mm256_loadu_ps(b.add(i));
                    _mm256_storeu_ps(dst.add(i), binary_kernels!(@op $op, x, y));
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
    (@op +, $x:ident, $y:ident) => { _mm256_add_ps($x, $y) };
    (@op -, $x:ident, $y:ident) => { _mm256_sub_ps($x, $y) };
    (@op *, $x:ident, $y:ident) => { _mm256_mul_ps($x, $y) };
    (@op /, $x:ident, $y:ident) => { _mm256_div_ps($x, $y) };
}
binary_kernels! {
    add_f32 => +;
    sub_f32 => -;
    mul_f32 => *;
    div_f32 => /;
}

macro_rules! unary_kernels {
    ($($name:ident => $f:path;)*) => {$(
        /// Elementwise kernel over `n` f32 values (AVX2 build of the scalar body).
        ///
        /// # Safety
        /// As the scalar version, and the CPU supports AVX2/FMA/F16C.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(crate) unsafe fn $name(n: usize, dst: *mut f32, a: *const f32) {
            for i in 0..n {
                // SAFETY: i < n and the caller guarantees n valid elements behind both pointers.
                unsafe { *dst.add(i) = $f(*a.add(i)) };
            }
        }
    )*};
}
unary_kernels! {
    silu_f32 => scalar::silu;
    gelu_f32 => scalar::gelu;
    relu_f32 => scalar::relu;
}
