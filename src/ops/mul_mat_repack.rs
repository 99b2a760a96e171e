//! mul_mat with repacked weights (CPU_REPACK, `quant::repack`): 8 weight rows interleaved, read
//! by the integer kernels of `kernels::repack` (one load serves 8 rows, one activation broadcast
//! serves them too).
//!
//! Phase 0 converts every activation row once (all threads) into the kernel's activation format
//! (`Y0` blocks for the 32-element types, Q8_K for the K-quants). Phase 1 hands out tasks of
//! [`TASK_GROUPS`] x 8 rows by up to [`TASK_COLS`] columns through the atomic counter; a task walks
//! K in chunks so its weights stay in L1/L2 while every column of the task uses them. Each output
//! is accumulated block by block in K order by one kernel lane, so results do not depend on the
//! thread count or on the task shape.

use super::{NodeCtx, split, unravel_row};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::KernelTable;
use crate::kernels::repack::{RepackGemmFn, act_block_bytes, group_block_bytes, q8_0_to_y0};
use crate::ops::node::{ExecNode, align_up};
use crate::quant::repack::REPACK_ROWS;

/// 8-row groups per task.
pub(crate) const TASK_GROUPS: usize = 4;
/// Columns per task.
pub(crate) const TASK_COLS: usize = 64;
/// Elements of K per chunk.
const CHUNK_K: usize = 2048;

pub(crate) fn applies(node: &ExecNode) -> bool {
    node.src[0].as_ref().is_some_and(|a| a.repacked)
}

fn is_k_type(d: DType) -> bool {
    matches!(d, DType::Q4_K | DType::Q6_K | DType::Q2_K | DType::TQ2_0)
}

pub(crate) fn act_row_bytes(a: DType, k: usize) -> usize {
    align_up(k / a.block_size() * act_block_bytes(a), 64)
}

pub(crate) fn scratch_bytes(k: usize) -> usize {
    align_up(k * 4, 64) + align_up(DType::Q8_0.row_bytes(k), 64)
}

pub(crate) fn work_size(node: &ExecNode, nth: usize) -> usize {
    let (Some(a), Some(b)) = (node.src[0].as_ref(), node.src[1].as_ref()) else { return 0 };
    b.nrows() * act_row_bytes(a.dtype, b.ne[0]) + nth * scratch_bytes(b.ne[0])
}

/// The converter into the kernel's activation format: F32 -> Q8_K for the K-quants, F32 -> Q8_0
/// (then re-laid into `Y0` blocks) for the 32-element types.
pub(crate) fn activation_target(a: DType) -> DType {
    if is_k_type(a) { DType::Q8_K } else { DType::Q8_0 }
}

/// Converts one f32 activation row (`f`, k elements) into `out` (`act_row_bytes` bytes) in the
/// kernel's format for weights of type `a`; `q8` is scratch for the Q8_0 row of the 32-element
/// types (`DType::Q8_0.row_bytes(k)` bytes).
pub(crate) fn convert_row(
    a: DType,
    from: crate::quant::FromFloatFn,
    f: &[f32],
    q8: &mut [u8],
    out: &mut [u8],
) {
    if is_k_type(a) {
        from(f, &mut out[..DType::Q8_K.row_bytes(f.len())]);
    } else {
        from(f, q8);
        q8_0_to_y0(q8, out);
    }
}

/// The f32 -> activation-format converter for weights of type `a`, or the error naming the op.
pub(crate) fn converter(
    kt: &KernelTable,
    op: &'static str,
    a: DType,
) -> Result<crate::quant::FromFloatFn> {
    let target = activation_target(a);
    kt.activation_converter(target).ok_or_else(|| Error::Unsupported {
        op,
        backend: "CPU".into(),
        msg: format!("no f32 -> {target} conversion"),
    })
}

/// Phase 0: activation rows into the kernel's format.
pub(crate) fn convert(ctx: &NodeCtx<'_>, ith: usize) -> Result<()> {
    let (a, b) = (ctx.src(0), ctx.src(1));
    let k = b.ne[0];
    let from = converter(ctx.kt, "mul_mat", a.dtype)?;
    let rb = act_row_bytes(a.dtype, k);
    let nrows = b.nrows();
    let scratch = nrows * rb + ith * scratch_bytes(k);
    debug_assert!(scratch + scratch_bytes(k) <= ctx.work_len);
    let (r0, r1) = split(nrows, ith, ctx.nth);
    for r in r0..r1 {
        let (i1, i2, i3) = unravel_row(r, &b.ne);
        // SAFETY: the work buffer holds nrows converted rows of `rb` bytes followed by one scratch
        // area per thread (work_size); this worker writes only its rows and its scratch. b is F32
        // (build check) and (i1, i2, i3) is inside its shape.
        unsafe {
            let f = std::slice::from_raw_parts_mut(ctx.work.add(scratch) as *mut f32, k);
            let pb = b.row(i1, i2, i3);
            for (i, s) in f.iter_mut().enumerate() {
                *s = (pb.add(i * b.nb[0]) as *const f32).read_unaligned();
            }
            let out = std::slice::from_raw_parts_mut(ctx.work.add(r * rb), rb);
            let q8 = std::slice::from_raw_parts_mut(
                ctx.work.add(scratch + align_up(k * 4, 64)),
                DType::Q8_0.row_bytes(k),
            );
            convert_row(a.dtype, from, f, q8, out);
        }
    }
    Ok(())
}

/// Blocks per K chunk for tasks of up to `ncols` columns: chunks keep a task's weights in cache
/// while its columns use them; with few columns (decode) there is nothing to share and each
/// group streams straight through.
pub(crate) fn chunk_blocks(a: DType, ncols: usize) -> usize {
    if ncols <= 4 { usize::MAX } else { (CHUNK_K / a.block_size()).max(1) }
}

/// Accumulators of one task.
pub(crate) type TaskAcc = [[f32; 8]; TASK_GROUPS * TASK_COLS];

/// One task: the outputs of weight groups `gs` (8 rows each; at most [`TASK_GROUPS`]) for
/// columns `0..ncols` (at most [`TASK_COLS`]), K walked in chunks of `chunk` blocks. `group(g)`
/// gives group g's repacked blocks (nb of them), `col(q)` column q's converted activations; `out(i,
/// q, v)` stores the results of rows `i..i + 8` (of the matrix) and column q. Each output is accumulated
/// block by block in K order by one kernel lane, whatever the chunking.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn run_task<'a>(
    kern: RepackGemmFn,
    a: DType,
    nb: usize,
    chunk: usize,
    group: impl Fn(usize) -> &'a [u8],
    gs: std::ops::Range<usize>,
    col: impl Fn(usize) -> &'a [u8],
    ncols: usize,
    acc: &mut TaskAcc,
    mut out: impl FnMut(usize, usize, &[f32; 8]),
) {
    debug_assert!(gs.len() <= TASK_GROUPS && (1..=TASK_COLS).contains(&ncols));
    let (gbb, abb) = (group_block_bytes(a), act_block_bytes(a));
    let acc = &mut acc[..gs.len() * ncols];
    acc.iter_mut().for_each(|a| *a = [0.0; 8]);
    let mut kb = 0;
    while kb < nb {
        let ke = kb.saturating_add(chunk).min(nb);
        for g in gs.clone() {
            let xg = &group(g)[kb * gbb..ke * gbb];
            let ys: [&[u8]; TASK_COLS] =
                std::array::from_fn(|q| if q < ncols { &col(q)[kb * abb..ke * abb] } else { &[] });
            let base = (g - gs.start) * ncols;
            kern(xg, &ys[..ncols], &mut acc[base..base + ncols]);
        }
        kb = ke;
    }
    for g in gs.clone() {
        for q in 0..ncols {
            out(g * REPACK_ROWS, q, &acc[(g - gs.start) * ncols + q]);
        }
    }
}

/// Stores 8 results at `p` with a stride of `nb0` bytes (one copy when contiguous).
///
/// # Safety
/// `p + r * nb0` for r < 8 are writable f32 slots nobody else accesses meanwhile.
#[inline(always)]
pub(crate) unsafe fn store8(p: *mut u8, nb0: usize, v: &[f32; 8]) {
    if nb0 == 4 {
        // SAFETY: the 8 slots are contiguous (caller contract).
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), p as *mut f32, 8) };
    } else {
        for (r, &x) in v.iter().enumerate() {
            // SAFETY: slot r (caller contract).
            unsafe { (p.add(r * nb0) as *mut f32).write_unaligned(x) };
        }
    }
}

/// Phase 1: the tasks.
pub(crate) fn compute(ctx: &NodeCtx<'_>, _ith: usize) -> Result<()> {
    let (a, b, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    let kern = ctx.kt.repack(a.dtype).ok_or_else(|| Error::Unsupported {
        op: "mul_mat",
        backend: "CPU".into(),
        msg: format!("no repacked kernel for {}", a.dtype),
    })?;
    let k = a.ne[0];
    let nb = k / a.dtype.block_size();
    let gbb = group_block_bytes(a.dtype);
    let abb = act_block_bytes(a.dtype);
    let rb = act_row_bytes(a.dtype, k);
    let chunk = chunk_blocks(a.dtype, d.ne[1]);
    let (m, n) = (d.ne[0], d.ne[1]);
    let groups = m / REPACK_ROWS;
    let (r2, r3) = (b.ne[2] / a.ne[2], b.ne[3] / a.ne[3]);
    let tiles_m = groups.div_ceil(TASK_GROUPS);
    let tiles_n = n.div_ceil(TASK_COLS);
    let per_batch = tiles_m * tiles_n;
    let total = per_batch * d.ne[2] * d.ne[3];
    let mut acc: TaskAcc = [[0f32; 8]; TASK_GROUPS * TASK_COLS];
    // Decode: one contiguous run of weight groups per worker (see `Claims`).
    let claims = super::Claims::new(total, if n == 1 { ctx.nth } else { 1 });
    while let Some(c) = claims.next(ctx.counter) {
        let batch = c / per_batch;
        let t = c % per_batch;
        let (i2, i3) = (batch % d.ne[2], batch / d.ne[2]);
        let (tn, tm) = (t % tiles_n, t / tiles_n);
        let (g0, g1) = (tm * TASK_GROUPS, ((tm + 1) * TASK_GROUPS).min(groups));
        let (j0, j1) = (tn * TASK_COLS, ((tn + 1) * TASK_COLS).min(n));
        let ncols = j1 - j0;
        let group = |g: usize| -> &[u8] {
            // SAFETY: the repacked weights are contiguous (set_tensor / build checks); the matrix
            // (i2 / r2, i3 / r3) is inside a's shape; group g < m / 8 spans 8 rows of nb blocks.
            unsafe {
                let base = a.ptr.add((i2 / r2) * a.nb[2] + (i3 / r3) * a.nb[3]);
                std::slice::from_raw_parts(base.add(g * REPACK_ROWS * a.nb[1]), nb * gbb)
            }
        };
        let col = |j: usize| -> &[u8] {
            // SAFETY: column j < n of batch (i2, i3) was converted in phase 0 into row
            // ((i3 * ne2 + i2) * ne1 + j) of `rb` bytes; the work buffer lives for the compute.
            unsafe {
                let row = (i3 * b.ne[2] + i2) * b.ne[1] + j;
                std::slice::from_raw_parts(ctx.work.add(row * rb), nb * abb)
            }
        };
        run_task(
            kern,
            a.dtype,
            nb,
            chunk,
            group,
            g0..g1,
            |q| col(j0 + q),
            ncols,
            &mut acc,
            |i, jj, v| {
                // SAFETY: rows i..i + 8 <= m and column j0 + jj < n: the elements belong to this
                // task's tile, which only this worker took.
                unsafe {
                    let p =
                        d.ptr.add(i * d.nb[0] + (j0 + jj) * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3]);
                    store8(p, d.nb[0], v);
                }
            },
        );
    }
    Ok(())
}
