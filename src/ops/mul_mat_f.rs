//! `mul_mat` with several columns as a cache-blocked f32 GEMM on the `KernelTable::sgemm`
//! micro-kernel, for every weight type that has a dequantizer.
//!
//! The arithmetic is ggml's: activations are first rounded through the weight type's vec-dot type
//! (Q8_0, Q8_1, Q8_K, F16, BF16: ggml's `from_float`), so each output is the sum over blocks of
//! (weight value) x (converted activation value), the same products ggml's integer kernels form,
//! summed in f32 instead of int32 and scaled per element instead of per block (differences of a
//! few f32 roundings).
//!
//! Phase 0 packs the activations (all threads) into the GEMM engine's f32 panels of 16 columns
//! (`gemm::float::pack_panel`, 256 K values of the 16 columns at a time). Phase 1 runs the
//! engine's float blocks (`gemm::float`): `MC` weight rows by `NC` columns per task, K in steps
//! of `KC`, the weight rows dequantized into strips of 6. Every output is the sum over K blocks,
//! in K order, of the kernel's partial sums: the same operations whatever the thread count.

use super::gemm::float::{self, BLOCK_SCRATCH, KC, MC, NC, PANEL_CHUNK, panel_floats};
use super::gemm::{Grid, Task};
use super::{NodeCtx, split};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::sgemm::SG_NR;
use crate::ops::node::{ExecNode, TView, align_up};
use crate::quant::DequantizeFn;

/// Fewer columns than this use the dot-product path (the panels would be mostly padding).
pub(crate) const MIN_N: usize = 6;
/// Packed activations larger than this (4 bytes per element of b) use the dot-product path, whose
/// work buffer holds b in the vec-dot type, so a huge batch does not need a huge work buffer.
pub(crate) const MAX_PACKED: usize = 256 << 20;

fn is_float(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::BF16)
}

/// f32 values of rows in the vec-dot type `vd`.
pub(crate) fn vd_to_f32(vd: DType) -> Option<DequantizeFn> {
    match vd {
        DType::Q8_1 => Some(crate::quant::legacy::q8_1_values),
        d => crate::quant::format(d).dequantize,
    }
}

/// Whether this node takes the GEMM path.
pub(crate) fn applies(node: &ExecNode) -> bool {
    let (Some(a), Some(b)) = (node.src[0].as_ref(), node.src[1].as_ref()) else {
        return false;
    };
    if node.dst.ne[1] < MIN_N || a.ne[0] == 0 || packed_bytes(b) > MAX_PACKED {
        return false;
    }
    !int_dot_is_faster(a.dtype)
        && types_ok(a.dtype, b.dtype)
        && (b.dtype == DType::F32 || b.nb[0] == b.dtype.type_size())
}

/// Types whose integer dot product outruns this GEMM: TQ2_0's kernel does a 256-element block in
/// about 4 ns per thread (`bench vec-dot tq2_0 4096 31 --kernel`: 118 GFLOPS a thread, against
/// the ~65-70 a thread this FMA-bound GEMM reaches), so its prefill takes `mul_mat`'s 16 x 16
/// tiles of dot products (side by side at 4096 x 512 x 14336, 2 threads: see CHANGELOG).
pub(crate) fn int_dot_is_faster(a: DType) -> bool {
    a == DType::TQ2_0
}

/// Whether weights of type `a` against activations of type `b` can take the GEMM (b F32, or F16
/// / BF16 for float weights, or already in the vec-dot type).
pub(crate) fn types_ok(a: DType, b: DType) -> bool {
    if is_float(a) {
        return is_float(b);
    }
    let vd = a.vec_dot_type();
    let f = crate::quant::format(a);
    f.dequantize.is_some()
        && f.vec_dot.is_some()
        && KC.is_multiple_of(a.block_size())
        && KC.is_multiple_of(vd.block_size())
        && vd_to_f32(vd).is_some()
        && (b == DType::F32 && crate::quant::format(vd).from_float.is_some() || b == vd)
}

fn b_batches(b: &TView) -> usize {
    b.ne[2] * b.ne[3]
}

fn packed_bytes(b: &TView) -> usize {
    align_up(b_batches(b) * b.ne[1].div_ceil(SG_NR) * panel_floats(b.ne[0]) * 4, 64)
}

/// Per-thread scratch: the packed strip and one dequantized row segment (phase 1), or one chunk
/// of 16 f32 activation columns ([`PANEL_CHUNK`] values each) and one column chunk's vec-dot
/// conversion (phase 0).
fn scratch_bytes(node: &ExecNode) -> usize {
    let a = node.src[0].as_ref().expect("a");
    let strip = align_up(BLOCK_SCRATCH * 4, 64);
    let pack = align_up(SG_NR * PANEL_CHUNK * 4, 64)
        + align_up(a.dtype.vec_dot_type().row_bytes(PANEL_CHUNK), 64);
    strip.max(pack)
}

pub(crate) fn work_size(node: &ExecNode, nth: usize) -> usize {
    let b = node.src[1].as_ref().expect("mul_mat b");
    packed_bytes(b) + nth * scratch_bytes(node)
}

/// Worker `ith`'s scratch area.
///
/// # Safety
/// Only worker `ith` calls this, once per phase (no other reference to the area exists).
unsafe fn scratch<'a>(ctx: &NodeCtx<'_>, ith: usize) -> &'a mut [u8] {
    let b = ctx.src(1);
    let sb = scratch_bytes(ctx.node);
    let off = packed_bytes(b) + ith * sb;
    debug_assert!(off + sb <= ctx.work_len);
    // SAFETY: work_size reserved nth scratch areas of `sb` bytes after the packed area; worker
    // `ith` alone uses area `ith` (the work buffer and every area are 64-byte aligned).
    unsafe { std::slice::from_raw_parts_mut(ctx.work.add(off), sb) }
}

fn unsupported(what: String) -> Error {
    Error::Unsupported { op: "mul_mat", backend: "CPU".into(), msg: what }
}

/// BF16 weights with an even K take the tier's BF16-pair kernels (`KernelTable::sgemm_bf16`),
/// where it has them: phase 0 packs the activations (rounded to BF16, as ggml) as BF16 pairs, and
/// the weight rows are packed as they are. `kt` is the compute's table (`NodeCtx::kt`), so the
/// packing and the GEMM phases agree on the layout.
/// Phase 0: packs b into 16-column f32 panels, through the weight type's vec-dot type.
pub(crate) fn pack(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (a, b) = (ctx.src(0), ctx.src(1));
    let (k, n) = (b.ne[0], b.ne[1]);
    let n16 = n.div_ceil(SG_NR);
    let units = b_batches(b) * n16;
    let vd = a.dtype.vec_dot_type();
    let quant = !is_float(a.dtype);
    let (to_vd, from_vd) = if quant {
        let to = ctx.kt.activation_converter(vd);
        let from = vd_to_f32(vd);
        match (to, from) {
            (Some(t), Some(f)) => (Some(t), Some(f)),
            _ => return Err(unsupported(format!("no f32 <-> {vd} conversion"))),
        }
    } else {
        (None, None)
    };
    // F16/BF16 weights: activations take that precision (a product of two such values is exact).
    let table = ctx.kt;
    let round: Option<fn(&mut [f32])> = match a.dtype {
        DType::F16 => Some(table.round_f16),
        DType::BF16 => Some(table.round_bf16),
        _ => None,
    };
    let pairs = float::pair_panels(ctx.kt, a.dtype, k);
    // SAFETY: this is worker ith, in its one call for phase 0.
    let sc = unsafe { scratch(ctx, ith) };
    let (colb, vdb) = sc.split_at_mut(align_up(SG_NR * PANEL_CHUNK * 4, 64));
    let cols: &mut [f32] = bytemuck::cast_slice_mut(&mut colb[..SG_NR * PANEL_CHUNK * 4]);
    let (u0, u1) = split(units, ith, ctx.nth);
    for u in u0..u1 {
        let (batch, p) = (u / n16, u % n16);
        let (i2, i3) = (batch % b.ne[2], batch / b.ne[2]);
        // SAFETY: unit u < batches * n16 owns floats [u * k * 16, (u + 1) * k * 16) of the packed
        // area, which work_size reserved at the start of the (64-byte aligned) work buffer.
        let panel = unsafe {
            std::slice::from_raw_parts_mut(
                (ctx.work as *mut f32).add(u * panel_floats(k)),
                panel_floats(k),
            )
        };
        float::pack_panel(panel, k, cols, pairs, |c, k0, chunk| {
            let col = p * SG_NR + c;
            if col >= n {
                chunk.fill(0.0);
                return;
            }
            let nk = chunk.len();
            // SAFETY: col < n = b.ne[1], (i2, i3) below b's dims 2 and 3; the chunk's elements
            // (nk values from k0 at stride nb[0], or their vd.row_bytes(nk) bytes from
            // vd.row_bytes(k0), whole blocks as k0 and nk are multiples of the block size) lie
            // inside b's row (extent validated at plan time).
            unsafe {
                let row = b.row(col, i2, i3);
                if b.dtype == vd && quant {
                    let bytes =
                        std::slice::from_raw_parts(row.add(vd.row_bytes(k0)), vd.row_bytes(nk));
                    from_vd.expect("quant")(bytes, chunk);
                } else {
                    if b.dtype == DType::F32 && b.nb[0] == 4 {
                        std::ptr::copy_nonoverlapping(
                            row.add(k0 * 4),
                            chunk.as_mut_ptr() as *mut u8,
                            nk * 4,
                        );
                    } else {
                        for (kk, v) in chunk.iter_mut().enumerate() {
                            *v = super::elementwise::ld(row.add((k0 + kk) * b.nb[0]), b.dtype);
                        }
                    }
                    if let (Some(t), Some(f)) = (to_vd, from_vd) {
                        let vdb = &mut vdb[..vd.row_bytes(nk)];
                        t(chunk, vdb);
                        f(vdb, chunk);
                    }
                }
            }
            if let Some(round) = round {
                round(chunk);
            }
        });
    }
    Ok(())
}

/// Phase 1: the engine's float blocks of `MC x NC`.
pub(crate) fn compute(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (a, b, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    let (k, m, n) = (a.ne[0], d.ne[0], d.ne[1]);
    let n16 = n.div_ceil(SG_NR);
    let (r2, r3) = (b.ne[2] / a.ne[2], b.ne[3] / a.ne[3]);
    let grid = Grid::new(m, n, d.ne[2] * d.ne[3], MC, NC);
    // SAFETY: this worker ith, in its one call for phase 1.
    let sc = unsafe { scratch(ctx, ith) };
    let scf: &mut [f32] = bytemuck::cast_slice_mut(&mut sc[..BLOCK_SCRATCH * 4]);
    // SAFETY: phase 0 filled the packed area and the barrier between phases published it; it is
    // only read from now on.
    let packed = unsafe { std::slice::from_raw_parts(ctx.work as *const f32, packed_bytes(b) / 4) };
    grid.run(ctx.counter, |Task { batch, rows, cols }| {
        let (i2, i3) = (batch % d.ne[2], batch / d.ne[2]);
        let (ia2, ia3) = (i2 / r2, i3 / r3);
        let j0 = cols.start;
        let base = ((i3 * b.ne[2] + i2) * n16 + j0 / SG_NR) * panel_floats(k);
        let panels = &packed[base..base + cols.len().div_ceil(SG_NR) * panel_floats(k)];
        // SAFETY: rows i < m of batch (ia2, ia3) exist and hold k elements (plan-time checks).
        let a_row = |i: usize| unsafe { a.row(i, ia2, ia3) as *const u8 };
        float::block(ctx.kt, a.dtype, k, rows, a_row, panels, cols.len(), scf, |i, c, run| {
            // SAFETY: (i.., j0 + c) is inside this task's block of dst, which only this worker
            // writes; the indices are below dst's shape.
            unsafe {
                let e = d.ptr.add(i * d.nb[0] + (j0 + c) * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3]);
                super::gemm::write_run(e, d.nb[0], run);
            }
        })
    })
}
