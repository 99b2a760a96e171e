//! add, sub, mul, div with b broadcast over a (ggml's binary-ops.cpp); F32 here, the F16/BF16
//! combinations and add with a quantized a in elementwise.rs.

use super::NodeCtx;
use super::node::Row;
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
    let (a, b) = (ctx.src(0), ctx.src(1));
    if a.dtype.is_quantized() {
        // Only add takes a quantized a (build check).
        return super::elementwise::add_quant(ctx, ith, false);
    }
    if a.dtype != crate::dtype::DType::F32 || b.dtype != crate::dtype::DType::F32 {
        return super::elementwise::binary_mixed(ctx, ith, op.scalar());
    }
    let (kernel, scalar) = (op.kernel(ctx.kt), op.scalar());
    // b shares the destination's memory only in place, as a's exact twin (graph build), so
    // its row is the destination row.
    assert!(!b.written || a.written);
    let nb0 = b.ne[0];
    let ne0 = a.ne[0];
    let mut rows = ctx.dst_rows(ith);
    let b_rows = b.written || b.ne[0] <= 1 || b.nb[0] == 4;
    if b_rows && let Some(ptrs) = rows.row_ptrs::<f32>(a) {
        for (r, pd, pa) in ptrs {
            let (i1, i2, i3) = r.i();
            let pb = if b.written {
                pa
            } else {
                b.row_of::<f32>(i1 % b.ne[1], i2 % b.ne[2], i3 % b.ne[3]).as_ptr()
            };
            for k in 0..ne0 / nb0 {
                // SAFETY: the rows of dst and a hold ne0 = reps * nb0 contiguous f32
                // (`row_ptrs`) and b's row nb0 (`row_of`); dst equals a (and b) exactly or is
                // apart from them, which the kernel contract allows.
                unsafe { kernel(nb0, pd.add(k * nb0), pa.add(k * nb0), pb) };
            }
        }
        return Ok(());
    }
    for r in rows.range() {
        let (i1, i2, i3) = r.i();
        let (j1, j2, j3) = (i1 % b.ne[1], i2 % b.ne[2], i3 % b.ne[3]);
        let brow = (!b.written).then(|| Row::<f32>::new(b, j1, j2, j3));
        // Strided rows: element by element.
        let mut io = rows.io::<f32>(a, r);
        for i0 in 0..ne0 {
            let x = io.src(i0);
            let y = match &brow {
                Some(br) => br.get(i0 % nb0),
                None => x,
            };
            io.set(i0, scalar(x, y));
        }
    }
    Ok(())
}
