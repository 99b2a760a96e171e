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

/// Sum of squares in f64 over four lanes (a fixed order the compiler can vectorise).
#[inline(always)]
pub(crate) fn sum_sq_f64_body(x: &[f32]) -> f64 {
    let mut acc = [0f64; 4];
    let mut c = x.chunks_exact(4);
    for v in &mut c {
        for l in 0..4 {
            acc[l] += (v[l] * v[l]) as f64;
        }
    }
    for (l, v) in c.remainder().iter().enumerate() {
        acc[l] += (v * v) as f64;
    }
    (acc[0] + acc[2]) + (acc[1] + acc[3])
}

/// Sum of squares of f32 values, accumulated in f64 (rms_norm's reduction).
pub(crate) fn sum_sq_f64(x: &[f32]) -> f64 {
    sum_sq_f64_body(x)
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

#[inline(always)]
pub(crate) fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// GELU through ggml's f16 table (bit-exact with ggml's CPU backend).
#[inline(always)]
pub(crate) fn gelu(x: f32) -> f32 {
    super::tables::gelu_lookup(super::tables::gelu_table(), x)
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

/// f16 values stored as little-endian bytes (any alignment) to f32.
pub(crate) fn f16_bytes_to_f32(src: &[u8], dst: &mut [f32]) {
    for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = crate::quant::util::fp16_to_fp32(u16::from_le_bytes([c[0], c[1]]));
    }
}

/// acc[i] += f16(v[i]) * s, with `v` as little-endian bytes (any alignment).
pub(crate) fn mad_f16(acc: &mut [f32], v: &[u8], s: f32) {
    for (a, c) in acc.iter_mut().zip(v.chunks_exact(2)) {
        *a = crate::quant::util::fp16_to_fp32(u16::from_le_bytes([c[0], c[1]])).mul_add(s, *a);
    }
}

/// acc[i] += v[i] * s.
#[inline(always)]
pub(crate) fn mad_f32_body(acc: &mut [f32], v: &[f32], s: f32) {
    for (a, &x) in acc.iter_mut().zip(v) {
        *a = x.mul_add(s, *a);
    }
}

/// acc[i] += v[i] * s.
pub(crate) fn mad_f32(acc: &mut [f32], v: &[f32], s: f32) {
    mad_f32_body(acc, v, s)
}

/// f16 bits to f32.
pub(crate) fn f16_to_f32(src: &[u16], dst: &mut [f32]) {
    for (d, &h) in dst.iter_mut().zip(src) {
        *d = crate::quant::util::fp16_to_fp32(h);
    }
}

/// dst[i] = exp(dst[i] - max) for `n` values; returns their sum in f64.
///
/// # Safety
/// `dst` is valid for `n` reads and writes.
pub(crate) unsafe fn exp_sub_sum_f32(n: usize, dst: *mut f32, max: f32) -> f64 {
    let mut sum = 0f64;
    for i in 0..n {
        // SAFETY: i < n.
        unsafe {
            let v = (*dst.add(i) - max).exp();
            *dst.add(i) = v;
            sum += v as f64;
        }
    }
    sum
}

/// SwiGLU over `n` f32: dst[i] = silu(x[i]) * g[i].
///
/// # Safety
/// `x` and `g` valid for `n` reads, `dst` for `n` writes; `dst` may equal `x` or `g` exactly
/// (in place) but must not partially overlap them.
pub(crate) unsafe fn swiglu_f32(n: usize, dst: *mut f32, x: *const f32, g: *const f32) {
    for i in 0..n {
        // SAFETY: i < n; each element is read before the same element is written.
        unsafe { *dst.add(i) = silu(*x.add(i)) * *g.add(i) };
    }
}

/// Rotates `n` pairs (x0[i], x1[i]) by the angles whose cosines and sines are `cos[i]`, `sin[i]`:
/// d0[i] = x0[i] cos - x1[i] sin, d1[i] = x0[i] sin + x1[i] cos (ggml's rotate_pairs, no FMA).
///
/// # Safety
/// Every pointer is valid for `n` elements; d0 may equal x0 and d1 x1 exactly (in place); the
/// two halves do not overlap each other.
pub(crate) unsafe fn rope_rotate_f32(
    n: usize,
    d0: *mut f32,
    d1: *mut f32,
    x0: *const f32,
    x1: *const f32,
    cos: *const f32,
    sin: *const f32,
) {
    for i in 0..n {
        // SAFETY: i < n; both inputs of pair i are read before either output is written.
        unsafe {
            let (a, b, c, s) = (*x0.add(i), *x1.add(i), *cos.add(i), *sin.add(i));
            *d0.add(i) = a * c - b * s;
            *d1.add(i) = a * s + b * c;
        }
    }
}

/// Attention scores: dst[i] = a[i] * scale + dst[i] when `add` (the mask is already in dst),
/// else dst[i] = a[i] * scale. Multiply, then add: no FMA.
///
/// # Safety
/// `a` valid for `n` reads, `dst` for `n` reads and writes; no overlap.
pub(crate) unsafe fn scale_add_f32(n: usize, dst: *mut f32, a: *const f32, scale: f32, add: bool) {
    for i in 0..n {
        // SAFETY: i < n.
        unsafe {
            let x = *a.add(i) * scale;
            *dst.add(i) = if add { x + *dst.add(i) } else { x };
        }
    }
}

/// Largest of `x` (NaN ignored, like `f32::max`); -inf for an empty slice.
pub(crate) fn max_f32(x: &[f32]) -> f32 {
    x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v))
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
