//! add, sub, mul, div with b broadcast over a (ggml's binary-ops.cpp); F32 here, the F16/BF16
//! combinations and add with a quantized a in elementwise.rs.

use super::{NodeCtx, split, unravel_row};
use crate::error::Result;
use crate::kernels::{BinaryF32, KernelTable};

/// The four broadcast binary ops.
#[derive(Clone, Copy)]
pub(crate) enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
}

impl BinOp {
    fn kernel(self, kt: &KernelTable) -> BinaryF32 {
        match self {
            BinOp::Add => kt.add_f32,
            BinOp::Sub => kt.sub_f32,
            BinOp::Mul => kt.mul_f32,
            BinOp::Div => kt.div_f32,
        }
    }

    /// The op on two f32 values.
    pub(crate) fn scalar(self) -> fn(f32, f32) -> f32 {
        match self {
            BinOp::Add => |x, y| x + y,
            BinOp::Sub => |x, y| x - y,
            BinOp::Mul => |x, y| x * y,
            BinOp::Div => |x, y| x / y,
        }
    }
}

pub(crate) fn compute(ctx: &NodeCtx<'_>, ith: usize, op: BinOp) -> Result<()> {
    let (a, b, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    if a.dtype.is_quantized() {
        // Only add takes a quantized a (build check).
        return super::elementwise::add_quant(ctx, ith, false);
    }
    if a.dtype != crate::dtype::DType::F32 || b.dtype != crate::dtype::DType::F32 {
        return super::elementwise::binary_mixed(ctx, ith, op.scalar());
    }
    let (kernel, scalar) = (op.kernel(ctx.kt), op.scalar());
    let ne0 = d.ne[0];
    let (r0, r1) = split(d.nrows(), ith, ctx.nth);
    let fast = a.nb[0] == 4 && b.nb[0] == 4 && d.nb[0] == 4;
    for r in r0..r1 {
        let (i1, i2, i3) = unravel_row(r, &d.ne);
        // SAFETY: (i1, i2, i3) < dst's ne, a has dst's shape, and the b indices are reduced modulo
        // b's ne; the plan validated all rows lie in their tensors' memory. Each worker writes only
        // its own rows of dst; dst may equal a exactly (in place), which the kernels allow.
        unsafe {
            let pd = d.row(i1, i2, i3) as *mut f32;
            let pa = a.row(i1, i2, i3) as *const f32;
            let pb = b.row(i1 % b.ne[1], i2 % b.ne[2], i3 % b.ne[3]) as *const f32;
            if fast {
                let nb0 = b.ne[0];
                let reps = ne0 / nb0;
                for k in 0..reps {
                    kernel(nb0, pd.add(k * nb0), pa.add(k * nb0), pb);
                }
            } else {
                let (sa, sb, sd) = (a.nb[0], b.nb[0], d.nb[0]);
                for i0 in 0..ne0 {
                    let x = *((pa as *const u8).add(i0 * sa) as *const f32);
                    let y = *((pb as *const u8).add((i0 % b.ne[0]) * sb) as *const f32);
                    *((pd as *mut u8).add(i0 * sd) as *mut f32) = scalar(x, y);
                }
            }
        }
    }
    Ok(())
}
