//! Elementwise ops on F32: scale (with bias) and the activations (ggml's unary-ops.cpp, vec.h).

use super::NodeCtx;
use crate::error::Result;
use crate::graph::UnaryOp;

/// dst = f(src0) over worker `ith`'s F32 rows: through `kernel` where both rows are contiguous
/// (the kernel allows exact aliasing, so in place passes the row twice), else element by element.
fn map_rows(
    ctx: &NodeCtx<'_>,
    ith: usize,
    kernel: Option<crate::kernels::UnaryF32>,
    elem: impl Fn(f32) -> f32,
) -> Result<()> {
    let a = ctx.src(0);
    let n = a.ne[0];
    let mut rows = ctx.dst_rows(ith);
    if let Some(k) = kernel
        && let Some(ptrs) = rows.row_ptrs::<f32>(a)
    {
        for (_, pd, pa) in ptrs {
            // SAFETY: both pointers start contiguous rows of n f32 (`row_ptrs`), equal or
            // apart, which is what the kernel contract asks.
            unsafe { k(n, pd, pa) };
        }
        return Ok(());
    }
    for r in rows.range() {
        rows.io::<f32>(a, r).map(&elem);
    }
    Ok(())
}

pub(crate) fn scale(ctx: &NodeCtx<'_>, ith: usize, s: f32, b: f32) -> Result<()> {
    let a = ctx.src(0);
    if a.dtype == crate::dtype::DType::BF16 {
        // ggml's scale_bf16: through f32, rounded back to BF16 once.
        use crate::quant::util::{bf16_to_fp32, fp32_to_bf16};
        let mut rows = ctx.dst_rows(ith);
        for r in rows.range() {
            rows.io::<u16>(a, r).map(|h| fp32_to_bf16(s * bf16_to_fp32(h) + b));
        }
        return Ok(());
    }
    map_rows(ctx, ith, None, move |x: f32| x * s + b)
}

/// Applies a unary op elementwise with ggml's f32 formulas (unary-ops.cpp / vec.h), one
/// monomorphised loop per op. GELU and quick GELU go through ggml's f16 tables.
fn map_unary(ctx: &NodeCtx<'_>, ith: usize, op: UnaryOp) -> Result<()> {
    use super::elementwise::map_float as m;
    use crate::kernels::{scalar, tables};
    match op {
        UnaryOp::Relu => m(ctx, ith, scalar::relu),
        UnaryOp::Silu => m(ctx, ith, scalar::silu),
        UnaryOp::Gelu => {
            let t = tables::gelu_table();
            m(ctx, ith, move |x| tables::gelu_lookup(t, x))
        }
        UnaryOp::GeluQuick => {
            let t = tables::gelu_quick_table();
            m(ctx, ith, move |x| tables::gelu_quick_lookup(t, x))
        }
        UnaryOp::Abs => m(ctx, ith, f32::abs),
        UnaryOp::Sgn => m(ctx, ith, |x| {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                0.0
            }
        }),
        UnaryOp::Neg => m(ctx, ith, |x: f32| -x),
        UnaryOp::Step => m(ctx, ith, |x| if x > 0.0 { 1.0 } else { 0.0 }),
        UnaryOp::Tanh => m(ctx, ith, f32::tanh),
        UnaryOp::Elu => m(ctx, ith, |x: f32| if x > 0.0 { x } else { x.exp_m1() }),
        UnaryOp::Sigmoid => m(ctx, ith, |x: f32| 1.0 / (1.0 + (-x).exp())),
        UnaryOp::Hardswish => m(ctx, ith, |x: f32| x * 1f32.min(0f32.max((x + 3.0) / 6.0))),
        UnaryOp::Hardsigmoid => m(ctx, ith, |x: f32| 1f32.min(0f32.max((x + 3.0) / 6.0))),
        UnaryOp::Exp => m(ctx, ith, f32::exp),
        UnaryOp::Expm1 => m(ctx, ith, |x: f32| x.exp() - 1.0),
        UnaryOp::Softplus => m(ctx, ith, |x: f32| if x > 20.0 { x } else { (1.0 + x.exp()).ln() }),
        UnaryOp::GeluErf => {
            m(ctx, ith, |x: f32| 0.5 * x * (1.0 + erff(x * std::f32::consts::FRAC_1_SQRT_2)))
        }
        UnaryOp::Xielu { alpha_n, alpha_p, beta, eps } => m(ctx, ith, move |x: f32| {
            if x > 0.0 {
                alpha_p * x * x + beta * x
            } else {
                ((x.min(eps)).exp_m1() - x) * alpha_n + beta * x
            }
        }),
        UnaryOp::Floor => m(ctx, ith, f32::floor),
        UnaryOp::Ceil => m(ctx, ith, f32::ceil),
        UnaryOp::Round => m(ctx, ith, f32::round),
        UnaryOp::Trunc => m(ctx, ith, f32::trunc),
    }
}

// SAFETY: `erff` is C99's `float erff(float)`, in the C library every Rust std target links;
// the declaration matches that signature, and the function reads no memory and is defined for
// every input (NaN included), so calling it is safe.
unsafe extern "C" {
    /// The C library's `erff` (what ggml calls; Rust's std has no stable erf).
    safe fn erff(x: f32) -> f32;
}

/// The C library's single-precision error function.
pub(crate) fn erf_f32(x: f32) -> f32 {
    erff(x)
}

/// An f32 row kernel and its per-element twin for strided rows.
type KernelPair = (crate::kernels::UnaryF32, fn(f32) -> f32);

pub(crate) fn compute(ctx: &NodeCtx<'_>, ith: usize, op: UnaryOp) -> Result<()> {
    use crate::dtype::DType;
    use crate::kernels::{scalar, tables};
    let (a, d) = (ctx.src(0), ctx.dst());
    let f32_io = a.dtype == DType::F32 && d.dtype == DType::F32;
    let kt = ctx.kt;
    let kernel: Option<KernelPair> = match op {
        UnaryOp::Relu if f32_io => Some((kt.relu_f32, scalar::relu)),
        UnaryOp::Gelu if f32_io => Some((kt.gelu_f32, scalar::gelu)),
        UnaryOp::Silu if f32_io => Some((kt.silu_f32, scalar::silu)),
        _ => None,
    };
    if let Some((k, f)) = kernel {
        return map_rows(ctx, ith, Some(k), f);
    }
    match op {
        UnaryOp::Gelu if a.dtype == DType::F16 && d.dtype == DType::F16 => {
            super::elementwise::map_f16_table(ctx, ith, tables::gelu_table())
        }
        UnaryOp::GeluQuick if a.dtype == DType::F16 && d.dtype == DType::F16 => {
            super::elementwise::map_f16_table(ctx, ith, tables::gelu_quick_table())
        }
        _ => map_unary(ctx, ith, op),
    }
}
