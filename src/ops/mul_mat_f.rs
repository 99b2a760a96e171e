//! Float `mul_mat` for several columns: F32, F16 and BF16 weights against F32, F16 or BF16
//! activations, as a cache-blocked GEMM on the `KernelTable::sgemm` micro-kernel.
//!
//! Phase 0 packs the activations (all threads): each batch's columns in panels of 16, element `k`
//! of the 16 columns side by side, in f32, rounded to F16/BF16 first for F16/BF16 weights (as
//! ggml's conversion into the vec-dot type does). Phase 1 hands out blocks of
//! `MC` weight rows by `NC` columns through the node's counter; a block walks K in steps of `KC`,
//! packing strips of 6 weight rows (converted to f32, element k of the 6 rows side by side) and
//! running the micro-kernel on each 16-column panel. Every output is the sum over K blocks, in K order, of
//! the kernel's partial sums: the same operations whatever the thread count.

use super::{NodeCtx, split};
use crate::dtype::DType;
use crate::error::Result;
use crate::kernels::sgemm::{SG_MR, SG_NR};
use crate::plan::{ExecNode, TView, align_up};
use crate::quant::util::{bf16_to_fp32, fp16_to_fp32, fp32_to_bf16, fp32_to_fp16};
use std::sync::atomic::Ordering;

/// K values per block (a 16-column panel slice of 16 KiB, a weight strip of 6 KiB).
const KC: usize = 512;
/// Weight rows per task (8 strips of 6).
const MC: usize = 48;
/// Columns per task (8 panels).
const NC: usize = 256;
/// Fewer columns than this use the dot-product path (the panels would be mostly padding).
pub(crate) const MIN_N: usize = 6;

fn is_float(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::BF16)
}

/// Whether this node takes the float GEMM path.
pub(crate) fn applies(node: &ExecNode) -> bool {
    match (node.src[0].as_ref(), node.src[1].as_ref()) {
        (Some(a), Some(b)) => {
            is_float(a.dtype) && is_float(b.dtype) && node.dst.ne[1] >= MIN_N && a.ne[0] > 0
        }
        _ => false,
    }
}

fn panel_floats(k: usize) -> usize {
    k * SG_NR
}

fn b_batches(b: &TView) -> usize {
    b.ne[2] * b.ne[3]
}

/// Per-thread scratch: the packed strip and one converted row.
fn strip_bytes() -> usize {
    align_up((SG_MR + 1) * KC * 4, 64)
}

fn packed_bytes(b: &TView) -> usize {
    b_batches(b) * b.ne[1].div_ceil(SG_NR) * panel_floats(b.ne[0]) * 4
}

pub(crate) fn work_size(node: &ExecNode, nth: usize) -> usize {
    let b = node.src[1].as_ref().expect("mul_mat b");
    align_up(packed_bytes(b), 64) + nth * strip_bytes()
}

/// Phase 0: packs b into 16-column f32 panels.
pub(crate) fn pack(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let b = ctx.src(1);
    let (k, n) = (b.ne[0], b.ne[1]);
    let n16 = n.div_ceil(SG_NR);
    let units = b_batches(b) * n16;
    debug_assert!(packed_bytes(b) <= ctx.work_len);
    let contiguous_f32 = b.dtype == DType::F32 && b.nb[0] == 4;
    // Activations take the weight type's precision, as ggml's conversion into the vec-dot type
    // does (a product of two F16 or BF16 values is exact in f32).
    let round: fn(f32) -> f32 = match ctx.src(0).dtype {
        DType::F16 => |v| fp16_to_fp32(fp32_to_fp16(v)),
        DType::BF16 => |v| bf16_to_fp32(fp32_to_bf16(v)),
        _ => |v| v,
    };
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
        for c in 0..SG_NR {
            let col = p * SG_NR + c;
            if col >= n {
                for kk in 0..k {
                    panel[kk * SG_NR + c] = 0.0;
                }
                continue;
            }
            // SAFETY: col < n = b.ne[1], (i2, i3) below b's dims 2 and 3; elements kk < k = ne[0]
            // at stride nb[0] lie inside the row (extent validated at plan time).
            unsafe {
                let row = b.row(col, i2, i3);
                if contiguous_f32 {
                    let src = row as *const f32;
                    for kk in 0..k {
                        panel[kk * SG_NR + c] = round(src.add(kk).read_unaligned());
                    }
                } else {
                    for kk in 0..k {
                        panel[kk * SG_NR + c] =
                            round(super::elementwise::ld(row.add(kk * b.nb[0]), b.dtype));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Phase 1: the blocked GEMM.
pub(crate) fn compute(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (a, b, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    let table = crate::kernels::table();
    let kernel = table.sgemm;
    let (k, m, n) = (a.ne[0], d.ne[0], d.ne[1]);
    let n16 = n.div_ceil(SG_NR);
    let (r2, r3) = (b.ne[2] / a.ne[2], b.ne[3] / a.ne[3]);
    let blocks_m = m.div_ceil(MC);
    let blocks_n = n.div_ceil(NC);
    let per_batch = blocks_m * blocks_n;
    let total = per_batch * d.ne[2] * d.ne[3];
    let strip_off = align_up(packed_bytes(b), 64) + ith * strip_bytes();
    debug_assert!(strip_off + strip_bytes() <= ctx.work_len);
    // SAFETY: this thread's scratch ((SG_MR + 1) * KC f32) lies inside the work buffer
    // (work_size) and no other thread touches it.
    let scratch = unsafe {
        std::slice::from_raw_parts_mut(ctx.work.add(strip_off) as *mut f32, (SG_MR + 1) * KC)
    };
    let (strip, row_buf) = scratch.split_at_mut(SG_MR * KC);
    // SAFETY: phase 0 filled the packed area and the barrier between phases published it; it is
    // only read from now on.
    let packed = unsafe { std::slice::from_raw_parts(ctx.work as *const f32, packed_bytes(b) / 4) };
    let mut out = [0.0f32; SG_MR * SG_NR];
    loop {
        let t = ctx.counter.fetch_add(1, Ordering::Relaxed);
        if t >= total {
            break;
        }
        let batch = t / per_batch;
        let (bm, bn) = ((t % per_batch) % blocks_m, (t % per_batch) / blocks_m);
        let (i2, i3) = (batch % d.ne[2], batch / d.ne[2]);
        let (ia2, ia3) = (i2 / r2, i3 / r3);
        let (i0, i1) = (bm * MC, ((bm + 1) * MC).min(m));
        let (j0, j1) = (bn * NC, ((bn + 1) * NC).min(n));
        let b_batch = i3 * b.ne[2] + i2;
        let mut k0 = 0;
        while k0 < k {
            let kc = KC.min(k - k0);
            let mut s = i0;
            while s < i1 {
                let rows = SG_MR.min(i1 - s);
                // Strip layout: group k holds element k of the 6 rows (missing rows zero).
                for r in 0..SG_MR {
                    if r < rows {
                        // SAFETY: row s + r < m of batch (ia2, ia3) exists and holds k >= k0 + kc
                        // contiguous elements (plan-time extent check).
                        unsafe { load_row(a, s + r, ia2, ia3, k0, &mut row_buf[..kc]) };
                        for kk in 0..kc {
                            strip[kk * SG_MR + r] = row_buf[kk];
                        }
                    } else {
                        for kk in 0..kc {
                            strip[kk * SG_MR + r] = 0.0;
                        }
                    }
                }
                let mut p = j0 / SG_NR;
                while p * SG_NR < j1 {
                    let base = (b_batch * n16 + p) * panel_floats(k) + k0 * SG_NR;
                    kernel(kc, &strip[..kc * SG_MR], &packed[base..base + kc * SG_NR], &mut out);
                    let cols = SG_NR.min(j1 - p * SG_NR);
                    for c in 0..cols {
                        let j = p * SG_NR + c;
                        for r in 0..rows {
                            // SAFETY: (s + r, j) is inside this task's block of dst, which only
                            // this worker writes; the indices are below dst's shape.
                            unsafe {
                                let e = d.ptr.add(
                                    (s + r) * d.nb[0] + j * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3],
                                ) as *mut f32;
                                let v = out[r * SG_NR + c];
                                if k0 == 0 {
                                    e.write_unaligned(v);
                                } else {
                                    e.write_unaligned(e.read_unaligned() + v);
                                }
                            }
                        }
                    }
                    p += 1;
                }
                s += rows;
            }
            k0 += kc;
        }
    }
    Ok(())
}

/// Converts elements `[k0, k0 + dst.len())` of weight row `(i1, i2, i3)` to f32.
///
/// # Safety
/// The row exists and holds at least `k0 + dst.len()` elements of `a.dtype` (contiguous).
unsafe fn load_row(a: &TView, i1: usize, i2: usize, i3: usize, k0: usize, dst: &mut [f32]) {
    let ts = a.dtype.type_size();
    // SAFETY: per the contract.
    unsafe {
        let p = a.row(i1, i2, i3).add(k0 * ts);
        match a.dtype {
            DType::F16 => {
                let bytes = std::slice::from_raw_parts(p, dst.len() * 2);
                (crate::kernels::table().f16_bytes_to_f32)(bytes, dst);
            }
            DType::BF16 => {
                for (i, o) in dst.iter_mut().enumerate() {
                    let h = (p.add(2 * i) as *const u16).read_unaligned();
                    *o = f32::from_bits((h as u32) << 16);
                }
            }
            _ => std::ptr::copy_nonoverlapping(p, dst.as_mut_ptr() as *mut u8, dst.len() * 4),
        }
    }
}
