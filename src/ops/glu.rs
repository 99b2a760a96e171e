//! Gated linear units on F32/F16 (ggml's ggml_compute_forward_{reglu,geglu,swiglu,swiglu_oai,
//! geglu_erf,geglu_quick}): dst = act(x) * g, where x and g are the two halves of each src0 row
//! (fused form, swapped or not) or the rows of src0 and src1 (split form). Split by rows.

use super::elementwise::{ld, st};
use super::{NodeCtx, split, unravel_row};
use crate::dtype::DType;
use crate::error::Result;
use crate::graph::GluOp;
use crate::kernels::{scalar, tables};
use crate::quant::util::fp16_to_fp32;

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
    // The f16 tables are built on first use, so only the ops that read them fetch them (a
    // SwiGLU compute then never builds, and allocates, a GELU table).
    let gelu_t: &[u16] = if matches!(op, GluOp::Geglu) { tables::gelu_table() } else { &[] };
    let quick_t: &[u16] =
        if matches!(op, GluOp::GegluQuick) { tables::gelu_quick_table() } else { &[] };
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
                if f16 {
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
                if f16 {
                    fp16_to_fp32(quick_t[xh as usize]) * g
                } else {
                    tables::gelu_quick_lookup(quick_t, x) * g
                }
            }
        }
    };
    let ts = dt.type_size();
    let kt = ctx.kt;
    // F32 SwiGLU is one fused vector pass per row (silu, then the multiply, in registers).
    let fast_swiglu = op == GluOp::Swiglu && !f16 && d.nb[0] == 4;
    let (r0, r1) = split(d.nrows(), ith, ctx.nth);
    for r in r0..r1 {
        let (i1, i2, i3) = unravel_row(r, &d.ne);
        // SAFETY: rows of src0 (and src1) are contiguous (build-time check); the fused form's
        // halves are columns [0, nc) and [nc, 2 nc) of a row with ne[0] >= 2 nc; dst has the
        // same rows; each worker writes its own rows of dst, a fresh tensor.
        unsafe {
            let pa = a.row(i1, i2, i3);
            let (px, pg) = match b {
                Some(b) => (pa, b.row(i1, i2, i3)),
                None if swapped => (pa.add(nc * ts), pa),
                None => (pa, pa.add(nc * ts)),
            };
            let pd = d.row(i1, i2, i3);
            if fast_swiglu {
                let (pd, px, pg) = (pd as *mut f32, px as *const f32, pg as *const f32);
                (kt.swiglu_f32)(nc, pd, px, pg);
                continue;
            }
            for i in 0..nc {
                let xp = px.add(i * ts);
                let xh = if f16 { (xp as *const u16).read_unaligned() } else { 0 };
                let v = f(xh, ld(xp, dt), ld(pg.add(i * ts), dt));
                st(pd.add(i * d.nb[0]), dt, v);
            }
        }
    }
    Ok(())
}
