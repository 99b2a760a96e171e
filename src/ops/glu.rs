//! Gated linear units on F32/F16 (ggml's ggml_compute_forward_{reglu,geglu,swiglu,swiglu_oai,
//! geglu_erf,geglu_quick}): dst = act(x) * g, where x and g are the two halves of each src0 row
//! (fused form, swapped or not) or the rows of src0 and src1 (split form). Split by rows.

use super::node::Elem;
use super::{NodeCtx, TView};
use crate::dtype::DType;
use crate::error::Result;
use crate::graph::GluOp;
use crate::kernels::{scalar, tables};
use crate::quant::util::{bf16_to_fp32, fp16_to_fp32, fp32_to_bf16, fp32_to_fp16};

/// Output bytes from which F32 SwiGLU streams its stores (output and inputs then exceed a 32 MiB
/// L3; a smaller output stays cached for the next op).
const STREAM_MIN_BYTES: usize = 16 << 20;

pub(crate) fn compute(
    ctx: &NodeCtx<'_>,
    ith: usize,
    op: GluOp,
    swapped: bool,
    alpha: f32,
    limit: f32,
) -> Result<()> {
    let a = ctx.src(0);
    let b = ctx.node.src[1].as_ref();
    let d = ctx.dst();
    let nc = d.ne[0];
    let dt = d.dtype;
    let f16 = dt == DType::F16;
    // BF16 rows use ggml's exact GELU formulas (vec.h's _bf16 kernels), not the f16 tables.
    let bf16 = dt == DType::BF16;
    // The f16 tables are built on first use, so only the ops that read them fetch them (a
    // SwiGLU compute then never builds, and allocates, a GELU table).
    let gelu_t: &[u16] =
        if matches!(op, GluOp::Geglu) && !bf16 { tables::gelu_table() } else { &[] };
    let quick_t: &[u16] =
        if matches!(op, GluOp::GegluQuick) && !bf16 { tables::gelu_quick_table() } else { &[] };
    // (x bits for the f16 table paths, x, g) -> result, as ggml's vec.h does per type.
    let f = |xh: u16, x: f32, g: f32| -> f32 {
        match op {
            GluOp::Reglu => {
                if x > 0.0 {
                    x * g
                } else {
                    0.0
                }
            }
            GluOp::Geglu => {
                if bf16 {
                    tables::gelu_f32(x) * g
                } else if f16 {
                    fp16_to_fp32(gelu_t[xh as usize]) * g
                } else if x <= -10.0 {
                    0.0
                } else if x >= 10.0 {
                    x * g
                } else {
                    tables::gelu_lookup(gelu_t, x) * g
                }
            }
            GluOp::Swiglu => scalar::silu(x) * g,
            GluOp::SwigluOai => {
                let x = x.min(limit);
                let g = g.clamp(-limit, limit);
                x / (1.0 + (alpha * -x).exp()) * (g + 1.0)
            }
            GluOp::SwigluClamp => {
                let x = x.min(limit);
                let g = g.clamp(-limit, limit);
                x / (1.0 + (-x).exp()) * g
            }
            GluOp::GegluErf => {
                0.5 * x * (1.0 + super::unary::erf_f32(x * std::f32::consts::FRAC_1_SQRT_2)) * g
            }
            GluOp::GegluQuick => {
                if bf16 {
                    tables::gelu_quick_f32(x) * g
                } else if f16 {
                    fp16_to_fp32(quick_t[xh as usize]) * g
                } else {
                    tables::gelu_quick_lookup(quick_t, x) * g
                }
            }
        }
    };
    let kt = ctx.kt;
    // F32 SwiGLU is one fused vector pass per row (silu, then the multiply, in registers).
    let fast_swiglu = op == GluOp::Swiglu && !f16 && d.nb[0] == 4;
    // An output larger than the caches (with its two inputs) is written past them: the same
    // bits, without reading every destination line first (11008 x 512, 2 threads: 2.5 -> 1.6 ms).
    let swiglu_f32 =
        if d.nelements() * 4 >= STREAM_MIN_BYTES { kt.swiglu_f32_stream } else { kt.swiglu_f32 };
    // Rows of src0 (and src1) are contiguous (build-time check); the fused form's halves are
    // columns [0, nc) and [nc, 2 nc) of a row with ne[0] >= 2 nc.
    let mut rows = ctx.dst_rows(ith);
    for r in rows.range() {
        let (i1, i2, i3) = r.i();
        if dt == DType::F32 {
            let (x, g) = pair::<f32>(a, b, swapped, nc, i1, i2, i3);
            let mut out = rows.out::<f32>(r);
            if fast_swiglu {
                // SAFETY: x, g and the contiguous destination row hold nc f32 each (row
                // accessors); the destination is a fresh tensor, apart from both sources.
                unsafe { swiglu_f32(nc, out.as_mut_ptr(), x.as_ptr(), g.as_ptr()) };
                continue;
            }
            for i in 0..nc {
                out.set(i, f(0, x[i], g[i]));
            }
        } else {
            // F16 or BF16: through f32 as ggml's vec.h (the f16 tables index by x's bits).
            let (x, g) = pair::<u16>(a, b, swapped, nc, i1, i2, i3);
            let to: fn(u16) -> f32 = if f16 { fp16_to_fp32 } else { bf16_to_fp32 };
            let from: fn(f32) -> u16 = if f16 { fp32_to_fp16 } else { fp32_to_bf16 };
            let mut out = rows.out::<u16>(r);
            for i in 0..nc {
                let xh = if f16 { x[i] } else { 0 };
                out.set(i, from(f(xh, to(x[i]), to(g[i]))));
            }
        }
    }
    Ok(())
}

/// The (x, g) rows of nc elements for dst row (i1, i2, i3): the split form's two sources, or the
/// two halves of src0's row (swapped or not).
fn pair<'a, T: Elem>(
    a: &'a TView,
    b: Option<&'a TView>,
    swapped: bool,
    nc: usize,
    i1: usize,
    i2: usize,
    i3: usize,
) -> (&'a [T], &'a [T]) {
    let ra = a.row_of::<T>(i1, i2, i3);
    match b {
        Some(b) => (&ra[..nc], &b.row_of::<T>(i1, i2, i3)[..nc]),
        None => {
            let (lo, hi) = (&ra[..nc], &ra[nc..2 * nc]);
            if swapped { (hi, lo) } else { (lo, hi) }
        }
    }
}
