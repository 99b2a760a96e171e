//! Portable kernels: the reference tier, always present. Needs no CPU feature.
//!
//! The bodies are `#[inline(always)]` so that the x86 tiers can compile the same loops under
//! `#[target_feature]` and get them vectorised for that tier.

/// Eight-lane accumulation: a fixed reduction order the compiler can vectorise.
#[inline(always)]
pub(crate) fn dot_f32_body(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; 16];
    let mut ca = a.chunks_exact(16);
    let mut cb = b.chunks_exact(16);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for l in 0..16 {
            acc[l] = x[l].mul_add(y[l], acc[l]);
        }
    }
    for (l, (x, y)) in ca.remainder().iter().zip(cb.remainder()).enumerate() {
        acc[l] = x.mul_add(*y, acc[l]);
    }
    let mut s8 = [0f32; 8];
    for l in 0..8 {
        s8[l] = acc[l] + acc[l + 8];
    }
    let s4 = [s8[0] + s8[4], s8[1] + s8[5], s8[2] + s8[6], s8[3] + s8[7]];
    (s4[0] + s4[2]) + (s4[1] + s4[3])
}

/// Dot product of two f32 slices.
pub(crate) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    dot_f32_body(a, b)
}

macro_rules! binary_kernels {
    ($($name:ident => |$x:ident, $y:ident| $e:expr;)*) => {$(
        /// Elementwise kernel over `n` f32 values.
        ///
        /// # Safety
        /// `a` and `b` must be valid for `n` reads and `dst` for `n` writes; `dst` may equal `a`
        /// or `b` (in place) but must not partially overlap them.
        pub(crate) unsafe fn $name(n: usize, dst: *mut f32, a: *const f32, b: *const f32) {
            for i in 0..n {
                // SAFETY: i < n and the caller guarantees n valid elements behind each pointer;
                // reading before writing the same index keeps exact aliasing correct.
                unsafe {
                    let $x = *a.add(i);
                    let $y = *b.add(i);
                    *dst.add(i) = $e;
                }
            }
        }
    )*};
}
binary_kernels! {
    add_f32 => |x, y| x + y;
    sub_f32 => |x, y| x - y;
    mul_f32 => |x, y| x * y;
    div_f32 => |x, y| x / y;
}

pub(crate) const GELU_COEF_A: f32 = 0.044715;
pub(crate) const SQRT_2_OVER_PI: f32 = 0.797_884_6;

#[inline(always)]
pub(crate) fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

#[inline(always)]
pub(crate) fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)).tanh())
}

#[inline(always)]
pub(crate) fn relu(x: f32) -> f32 {
    if x > 0.0 { x } else { 0.0 }
}

macro_rules! unary_kernels {
    ($($name:ident => $f:path;)*) => {$(
        /// Elementwise kernel over `n` f32 values.
        ///
        /// # Safety
        /// `a` must be valid for `n` reads and `dst` for `n` writes; `dst` may equal `a` (in place)
        /// but must not partially overlap it.
        pub(crate) unsafe fn $name(n: usize, dst: *mut f32, a: *const f32) {
            for i in 0..n {
                // SAFETY: i < n and the caller guarantees n valid elements behind both pointers.
                unsafe { *dst.add(i) = $f(*a.add(i)) };
            }
        }
    )*};
}
unary_kernels! {
    silu_f32 => silu;
    gelu_f32 => gelu;
    relu_f32 => relu;
}

/// Reads `n` little-endian f32 from possibly unaligned bytes, as a slice when aligned.
#[inline(always)]
pub(crate) fn as_f32s<'a>(b: &'a [u8], tmp: &'a mut Vec<f32>) -> &'a [f32] {
    match bytemuck::try_cast_slice::<u8, f32>(b) {
        Ok(s) => s,
        Err(_) => {
            tmp.clear();
            tmp.extend(b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])));
            tmp
        }
    }
}

/// F32 x F32 dot over bytes (the `VecDotFn` for F32 weights).
pub(crate) fn vec_dot_f32(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (mut tx, mut ty) = (Vec::new(), Vec::new());
    let xs = as_f32s(&x[..n * 4], &mut tx);
    let ys = as_f32s(&y[..n * 4], &mut ty);
    dot_f32(xs, ys)
}

#[inline(always)]
pub(crate) fn vec_dot_f16_body(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let h = |b: &[u8], i: usize| {
        crate::quant::util::fp16_to_fp32(u16::from_le_bytes([b[2 * i], b[2 * i + 1]]))
    };
    let mut acc = [0f32; 8];
    let full = n / 8 * 8;
    let mut i = 0;
    while i < full {
        for l in 0..8 {
            acc[l] = h(x, i + l).mul_add(h(y, i + l), acc[l]);
        }
        i += 8;
    }
    for (l, j) in (full..n).enumerate() {
        acc[l] = h(x, j).mul_add(h(y, j), acc[l]);
    }
    let s4 = [acc[0] + acc[4], acc[1] + acc[5], acc[2] + acc[6], acc[3] + acc[7]];
    (s4[0] + s4[2]) + (s4[1] + s4[3])
}

/// F16 x F16 dot with f32 accumulation.
pub(crate) fn vec_dot_f16(n: usize, x: &[u8], y: &[u8]) -> f32 {
    vec_dot_f16_body(n, x, y)
}

/// BF16 x BF16 dot with f32 accumulation.
pub(crate) fn vec_dot_bf16(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let h = |b: &[u8], i: usize| {
        crate::quant::util::bf16_to_fp32(u16::from_le_bytes([b[2 * i], b[2 * i + 1]]))
    };
    let mut acc = [0f32; 8];
    for i in 0..n {
        acc[i % 8] = h(x, i).mul_add(h(y, i), acc[i % 8]);
    }
    let s4 = [acc[0] + acc[4], acc[1] + acc[5], acc[2] + acc[6], acc[3] + acc[7]];
    (s4[0] + s4[2]) + (s4[1] + s4[3])
}

/// f32 -> F32 "conversion" (a copy).
pub(crate) fn from_float_f32(src: &[f32], dst: &mut [u8]) {
    dst[..src.len() * 4].copy_from_slice(bytemuck::cast_slice(src));
}

/// f32 -> F16, round to nearest even.
pub(crate) fn from_float_f16(src: &[f32], dst: &mut [u8]) {
    for (d, &s) in dst.chunks_exact_mut(2).zip(src) {
        d.copy_from_slice(&crate::quant::util::fp32_to_fp16(s).to_le_bytes());
    }
}

/// f32 -> BF16, round to nearest even.
pub(crate) fn from_float_bf16(src: &[f32], dst: &mut [u8]) {
    for (d, &s) in dst.chunks_exact_mut(2).zip(src) {
        d.copy_from_slice(&crate::quant::util::fp32_to_bf16(s).to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_f32_odd_lengths() {
        for n in [0usize, 1, 7, 15, 16, 17, 33, 100] {
            let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 3.0).collect();
            let b: Vec<f32> = (0..n).map(|i| 1.0 - i as f32 * 0.25).collect();
            let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            let got = dot_f32(&a, &b) as f64;
            assert!((got - want).abs() <= 1e-4 * want.abs().max(1.0), "n={n} {got} {want}");
        }
    }
}
