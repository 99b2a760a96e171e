//! Convolutions (ggml's ops.cpp): im2col (1D, 2D) and im2col_3d, col2im_1d, the direct conv_2d
//! and conv_3d (the kernel packed as f32 rows into the work buffer; then tiles of 8 output
//! positions unfolded into per-thread scratch and multiplied with every kernel row in the tier's
//! 4x2 register tile, `KernelTable::conv`), depthwise
//! conv_2d_dw (WHCN and CWHN),
//! and conv_transpose_1d / conv_transpose_2d (operands permuted into the work buffer, then each
//! thread accumulates whole output planes in ggml's order). Every output element is produced by
//! one thread with a fixed operation order, so results do not depend on the thread count.

use super::{NodeCtx, split};
use crate::dtype::DType;
use crate::error::Result;
use crate::graph::{Conv2dParams, Conv3dParams};
use crate::plan::{ExecNode, TView, align_up};
use crate::quant::util::{bf16_to_fp32, fp16_to_fp32, fp32_to_bf16, fp32_to_fp16};
use std::sync::atomic::Ordering;

/// Output positions per work chunk of conv_2d / conv_3d.
const TILE_P: usize = 8;

/// Where the patch of one output position lies in the input: sizes, strides (bytes) and the
/// convolution parameters, with depth and height degenerate (size 1) for 2D and 1D.
#[derive(Clone, Copy)]
struct Patch {
    iw: i64,
    ih: i64,
    id: i64,
    kw: usize,
    kh: usize,
    kd: usize,
    ow: usize,
    oh: usize,
    od: usize,
    s: [i64; 3],
    p: [i64; 3],
    d: [i64; 3],
    ic: usize,
    n: usize,
    /// Byte strides of the input: x, y, z, channel, batch.
    sx: usize,
    sy: usize,
    sz: usize,
    sc: usize,
    sn: usize,
}

impl Patch {
    fn from_2d(p: &Conv2dParams, kernel: &[usize; 4], b: &TView, is_2d: bool) -> Patch {
        let i = |v: usize| v as i64;
        if is_2d {
            Patch {
                iw: i(b.ne[0]),
                ih: i(b.ne[1]),
                id: 1,
                kw: kernel[0],
                kh: kernel[1],
                kd: 1,
                ow: 0,
                oh: 0,
                od: 1,
                s: [i(p.s0), i(p.s1), 1],
                p: [i(p.p0), i(p.p1), 0],
                d: [i(p.d0), i(p.d1), 1],
                ic: b.ne[2],
                n: b.ne[3],
                sx: b.nb[0],
                sy: b.nb[1],
                sz: 0,
                sc: b.nb[2],
                sn: b.nb[3],
            }
        } else {
            Patch {
                iw: i(b.ne[0]),
                ih: 1,
                id: 1,
                kw: kernel[0],
                kh: 1,
                kd: 1,
                ow: 0,
                oh: 1,
                od: 1,
                s: [i(p.s0), 1, 1],
                p: [i(p.p0), 0, 0],
                d: [i(p.d0), 1, 1],
                ic: b.ne[1],
                n: b.ne[2],
                sx: b.nb[0],
                sy: 0,
                sz: 0,
                sc: b.nb[1],
                sn: b.nb[2],
            }
        }
    }

    fn from_3d(p: &Conv3dParams, kernel: &[usize; 4], b: &TView) -> Patch {
        let i = |v: usize| v as i64;
        Patch {
            iw: i(b.ne[0]),
            ih: i(b.ne[1]),
            id: i(b.ne[2]),
            kw: kernel[0],
            kh: kernel[1],
            kd: kernel[2],
            ow: 0,
            oh: 0,
            od: 0,
            s: [i(p.s[0]), i(p.s[1]), i(p.s[2])],
            p: [i(p.p[0]), i(p.p[1]), i(p.p[2])],
            d: [i(p.d[0]), i(p.d[1]), i(p.d[2])],
            ic: p.c,
            n: b.ne[3] / p.c,
            sx: b.nb[0],
            sy: b.nb[1],
            sz: b.nb[2],
            sc: b.nb[3],
            sn: b.nb[3] * p.c,
        }
    }

    fn with_out(mut self, ow: usize, oh: usize, od: usize) -> Patch {
        (self.ow, self.oh, self.od) = (ow, oh, od);
        self
    }

    fn row_len(&self) -> usize {
        self.ic * self.kd * self.kh * self.kw
    }

    fn positions(&self) -> usize {
        self.n * self.od * self.oh * self.ow
    }

    /// (batch, z, y, x) of flat output position `q` (x fastest).
    #[inline(always)]
    fn unravel(&self, q: usize) -> (usize, usize, usize, usize) {
        let ox = q % self.ow;
        let oy = (q / self.ow) % self.oh;
        let oz = (q / (self.ow * self.oh)) % self.od;
        (q / (self.ow * self.oh * self.od), oz, oy, ox)
    }

    /// Calls `put(k, Some(address))` for every in-range element of the patch of output position
    /// `q`, `put(k, None)` for padding, with `k` running over `row_len()` in ggml's order
    /// (channel, kd, kh, kw).
    ///
    /// # Safety
    /// `base` is the input's address and `q < positions()`; the strides and sizes describe that
    /// input (validated when the graph was built).
    #[inline(always)]
    unsafe fn fill(
        &self,
        base: *const u8,
        q: usize,
        mut put: impl FnMut(usize, Option<*const u8>),
    ) {
        let (n, oz, oy, ox) = self.unravel(q);
        let mut k = 0;
        for c in 0..self.ic {
            // SAFETY: n < batch and c < channels, so the plane start is inside the input.
            let pc = unsafe { base.add(n * self.sn + c * self.sc) };
            for kz in 0..self.kd {
                let z = oz as i64 * self.s[2] + kz as i64 * self.d[2] - self.p[2];
                let zin = (0..self.id).contains(&z);
                for ky in 0..self.kh {
                    let y = oy as i64 * self.s[1] + ky as i64 * self.d[1] - self.p[1];
                    let yin = zin && (0..self.ih).contains(&y);
                    for kx in 0..self.kw {
                        let x = ox as i64 * self.s[0] + kx as i64 * self.d[0] - self.p[0];
                        if yin && (0..self.iw).contains(&x) {
                            let off =
                                x as usize * self.sx + y as usize * self.sy + z as usize * self.sz;
                            // SAFETY: x, y, z were checked against the input's sizes just above.
                            put(k, Some(unsafe { pc.add(off) }));
                        } else {
                            put(k, None);
                        }
                        k += 1;
                    }
                }
            }
        }
    }
}

impl Patch {
    /// The patch of output position `q` as f32 values (F32 input), row by row: the in-range
    /// columns of each (channel, kd, kh) row are one strided (or, for unit stride and dilation,
    /// contiguous) copy, the rest zeros.
    ///
    /// # Safety
    /// As [`Patch::fill`], with an F32 input; `out.len() == row_len()`.
    unsafe fn fill_f32(&self, base: *const u8, q: usize, out: &mut [f32]) {
        let (n, oz, oy, ox) = self.unravel(q);
        let kw = self.kw;
        let x0 = ox as i64 * self.s[0] - self.p[0];
        let d0 = self.d[0];
        // kx is in range when 0 <= x0 + kx*d0 < iw.
        let lo = if x0 >= 0 { 0 } else { ((-x0 + d0 - 1) / d0).min(kw as i64) as usize };
        let hi =
            if x0 >= self.iw { 0 } else { (((self.iw - 1 - x0) / d0) + 1).min(kw as i64) as usize };
        let hi = hi.max(lo);
        let contiguous = d0 == 1 && self.sx == 4;
        let mut k = 0;
        for c in 0..self.ic {
            // SAFETY: n < batch and c < channels: the plane start is inside the input.
            let pc = unsafe { base.add(n * self.sn + c * self.sc) };
            for kz in 0..self.kd {
                let z = oz as i64 * self.s[2] + kz as i64 * self.d[2] - self.p[2];
                let zin = (0..self.id).contains(&z);
                for ky in 0..self.kh {
                    let y = oy as i64 * self.s[1] + ky as i64 * self.d[1] - self.p[1];
                    let row = &mut out[k..k + kw];
                    k += kw;
                    if !(zin && (0..self.ih).contains(&y)) || lo == hi {
                        row.iter_mut().for_each(|v| *v = 0.0);
                        continue;
                    }
                    // SAFETY: y and z are in range; for lo <= kx < hi, x = x0 + kx*d0 is in
                    // 0..iw by the choice of lo and hi.
                    unsafe {
                        let pr = pc.add(z as usize * self.sz + y as usize * self.sy);
                        if contiguous && hi - lo >= 16 {
                            row[..lo].iter_mut().for_each(|v| *v = 0.0);
                            row[hi..].iter_mut().for_each(|v| *v = 0.0);
                            let src = pr.add((x0 + lo as i64) as usize * 4);
                            std::ptr::copy_nonoverlapping(
                                src,
                                row[lo..hi].as_mut_ptr() as *mut u8,
                                (hi - lo) * 4,
                            );
                        } else {
                            // Small kernels: a plain loop beats a memcpy call per row.
                            for (kx, v) in row.iter_mut().enumerate() {
                                *v = if kx >= lo && kx < hi {
                                    let x = (x0 + kx as i64 * d0) as usize;
                                    (pr.add(x * self.sx) as *const f32).read_unaligned()
                                } else {
                                    0.0
                                };
                            }
                        }
                    }
                }
            }
        }
    }
}

impl Patch {
    /// [`Patch::fill_f32`] for `np <= TILE_P` consecutive output positions `q0..q0 + np` of one
    /// output row (same batch, z and y): each (channel, kd, kh) input row is located once for the
    /// whole tile, and the column bounds of every position are computed once.
    ///
    /// # Safety
    /// As [`Patch::fill_f32`]; `unravel(q0).3 + np <= ow` and `tile.len() >= np * row_len()`.
    unsafe fn fill_tile_f32(&self, base: *const u8, q0: usize, np: usize, tile: &mut [f32]) {
        let (n, oz, oy, ox0) = self.unravel(q0);
        debug_assert!(ox0 + np <= self.ow && np <= TILE_P);
        let (kw, kn, d0) = (self.kw, self.row_len(), self.d[0]);
        let mut x0 = [0i64; TILE_P];
        let mut lo = [0usize; TILE_P];
        let mut hi = [0usize; TILE_P];
        for j in 0..np {
            let x = (ox0 + j) as i64 * self.s[0] - self.p[0];
            let l = if x >= 0 { 0 } else { ((-x + d0 - 1) / d0).min(kw as i64) as usize };
            let h = if x >= self.iw {
                0
            } else {
                (((self.iw - 1 - x) / d0) + 1).min(kw as i64) as usize
            };
            (x0[j], lo[j], hi[j]) = (x, l, h.max(l));
        }
        let mut k = 0;
        for c in 0..self.ic {
            // SAFETY: n < batch and c < channels: the plane start is inside the input.
            let pc = unsafe { base.add(n * self.sn + c * self.sc) };
            for kz in 0..self.kd {
                let z = oz as i64 * self.s[2] + kz as i64 * self.d[2] - self.p[2];
                let zin = (0..self.id).contains(&z);
                for ky in 0..self.kh {
                    let y = oy as i64 * self.s[1] + ky as i64 * self.d[1] - self.p[1];
                    let inside = zin && (0..self.ih).contains(&y);
                    for j in 0..np {
                        let row = &mut tile[j * kn + k..j * kn + k + kw];
                        if !inside {
                            row.iter_mut().for_each(|v| *v = 0.0);
                            continue;
                        }
                        // SAFETY: y and z are in range; for lo[j] <= kx < hi[j] the column
                        // x0[j] + kx*d0 is in 0..iw by the choice of the bounds.
                        unsafe {
                            let pr = pc.add(z as usize * self.sz + y as usize * self.sy);
                            for (kx, v) in row.iter_mut().enumerate() {
                                *v = if kx >= lo[j] && kx < hi[j] {
                                    let x = (x0[j] + kx as i64 * d0) as usize;
                                    (pr.add(x * self.sx) as *const f32).read_unaligned()
                                } else {
                                    0.0
                                };
                            }
                        }
                    }
                    k += kw;
                }
            }
        }
    }
}

#[inline(always)]
fn round_f16(v: f32) -> f32 {
    fp16_to_fp32(fp32_to_fp16(v))
}

/// Reads element `i` of a little-endian F32 / F16 / BF16 array as f32.
///
/// # Safety
/// `p` is valid for element `i` of `dt`.
#[inline(always)]
unsafe fn load(p: *const u8, dt: DType, i: usize) -> f32 {
    // SAFETY: per the contract; unaligned reads because views may sit at any byte offset.
    unsafe {
        match dt {
            DType::F32 => (p.add(4 * i) as *const f32).read_unaligned(),
            DType::F16 => fp16_to_fp32((p.add(2 * i) as *const u16).read_unaligned()),
            _ => bf16_to_fp32((p.add(2 * i) as *const u16).read_unaligned()),
        }
    }
}

/// Work bytes of im2col / im2col_3d: one f32 row per thread when F32 input becomes F16.
pub(crate) fn im2col_work_size(node: &ExecNode, nth: usize) -> usize {
    match node.src[1].as_ref() {
        Some(b) if b.dtype == DType::F32 && node.dst.dtype == DType::F16 => {
            nth * align_up(node.dst.ne[0] * 4, 64)
        }
        _ => 0,
    }
}

/// im2col and im2col_3d: one output row per output position, rows split over threads.
fn im2col_rows(ctx: &NodeCtx<'_>, ith: usize, g: Patch) -> Result<()> {
    let (b, d) = (ctx.src(1), ctx.dst());
    let k = g.row_len();
    debug_assert_eq!(k, d.ne[0]);
    let (r0, r1) = split(g.positions(), ith, ctx.nth);
    let to_f16 = ctx.kt.conv.to_f16;
    for q in r0..r1 {
        // Output rows are contiguous and numbered like the output positions.
        // SAFETY: q < positions = dst rows (dst is a fresh contiguous, 64-byte aligned tensor, so
        // every f32 row is aligned); the row holds k elements of dst's type; this worker owns
        // rows r0..r1 and its own scratch row in the work buffer (im2col_work_size).
        unsafe {
            let row = d.ptr.add(q * d.nb[1]);
            match (d.dtype, b.dtype) {
                (DType::F32, _) => {
                    let out = std::slice::from_raw_parts_mut(row as *mut f32, k);
                    g.fill_f32(b.ptr, q, out);
                }
                (_, DType::F32) => {
                    debug_assert!(im2col_work_size(ctx.node, ctx.nth) <= ctx.work_len);
                    let scratch = std::slice::from_raw_parts_mut(
                        ctx.work.add(ith * align_up(k * 4, 64)) as *mut f32,
                        k,
                    );
                    g.fill_f32(b.ptr, q, scratch);
                    to_f16(scratch, std::slice::from_raw_parts_mut(row, 2 * k));
                }
                _ => {
                    let out = row as *mut u16;
                    let f32_in = b.dtype == DType::F32;
                    g.fill(b.ptr, q, |i, s| {
                        let v = match s {
                            None => 0,
                            Some(s) if f32_in => fp32_to_fp16((s as *const f32).read_unaligned()),
                            Some(s) => (s as *const u16).read_unaligned(),
                        };
                        out.add(i).write_unaligned(v);
                    });
                }
            }
        }
    }
    Ok(())
}

pub(crate) fn im2col(ctx: &NodeCtx<'_>, ith: usize, p: &Conv2dParams, is_2d: bool) -> Result<()> {
    let (a, d) = (ctx.src(0), ctx.dst());
    let g = Patch::from_2d(p, &a.ne, ctx.src(1), is_2d);
    let g = if is_2d { g.with_out(d.ne[1], d.ne[2], 1) } else { g.with_out(d.ne[1], 1, 1) };
    im2col_rows(ctx, ith, g)
}

pub(crate) fn im2col_3d(ctx: &NodeCtx<'_>, ith: usize, p: &Conv3dParams) -> Result<()> {
    let (a, b, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    let g = Patch::from_3d(p, &a.ne, b);
    let g = g.with_out(d.ne[1], d.ne[2], d.ne[3] / g.n);
    im2col_rows(ctx, ith, g)
}

pub(crate) fn col2im_1d(
    ctx: &NodeCtx<'_>,
    ith: usize,
    s0: usize,
    oc: usize,
    p0: usize,
) -> Result<()> {
    let (a, d) = (ctx.src(0), ctx.dst());
    let (k_oc, t_in, t_out) = (a.ne[0], a.ne[1] as i64, d.ne[0]);
    let k = (k_oc / oc) as i64;
    let s = s0 as i64;
    let (e0, e1) = split(oc * t_out, ith, ctx.nth);
    for e in e0..e1 {
        let (c, t) = (e / t_out, e % t_out);
        let t_abs = (t + p0) as i64;
        // Inputs t_in with t_in * s + kk == t_abs for 0 <= kk < K (ceil division for the low end;
        // the numerator can be negative, so use div_euclid).
        let lo = (t_abs - k + 1 + s - 1).div_euclid(s).max(0);
        let hi = (t_abs / s).min(t_in - 1);
        let mut sum = 0f32;
        for ti in lo..=hi {
            let kk = t_abs - ti * s;
            if (0..k).contains(&kk) {
                // SAFETY: a is a contiguous [K*OC, T_in] matrix (build check): c*K + kk < K*OC
                // and ti < T_in.
                sum += unsafe {
                    load(a.ptr, a.dtype, (c * k as usize + kk as usize) + ti as usize * k_oc)
                };
            }
        }
        // SAFETY: t < T_out, c < OC: inside the contiguous result; own elements only.
        unsafe {
            let o = d.ptr.add(t * d.nb[0] + c * d.nb[1]);
            match d.dtype {
                DType::F32 => (o as *mut f32).write_unaligned(sum),
                DType::F16 => (o as *mut u16).write_unaligned(fp32_to_fp16(sum)),
                _ => (o as *mut u16).write_unaligned(fp32_to_bf16(sum)),
            }
        }
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------------
// conv_2d / conv_3d: packed f32 kernel, per-thread im2col tiles, one dot product per output.

/// (output channels, kernel row length) of a conv_2d / conv_3d node.
fn conv_dims(node: &ExecNode) -> (usize, usize) {
    let (Some(a), Some(b)) = (node.src[0].as_ref(), node.src[1].as_ref()) else { return (0, 0) };
    match &node.op {
        crate::graph::Op::Conv3d(p) => (p.oc, a.ne[0] * a.ne[1] * a.ne[2] * p.c),
        _ => (a.ne[3], a.ne[0] * a.ne[1] * b.ne[2]),
    }
}

fn conv_kernel_bytes(node: &ExecNode) -> usize {
    let (oc, kn) = conv_dims(node);
    align_up(oc * kn * 4, 64)
}

fn conv_tile_bytes(node: &ExecNode) -> usize {
    // TILE_P f32 patch rows.
    align_up(TILE_P * conv_dims(node).1 * 4, 64)
}

pub(crate) fn conv_work_size(node: &ExecNode, nth: usize) -> usize {
    conv_kernel_bytes(node) + nth * conv_tile_bytes(node)
}

/// Phase 0: the kernel as f32 rows [OC][row_len] in the work buffer. Phase 1: tiles of output
/// positions handed out by the chunk counter; each is unfolded into the thread's scratch (rounded
/// to f16 for an F16 kernel, as ggml multiplies in the kernel's type) and dotted with every kernel
/// row.
fn conv_nd(
    ctx: &NodeCtx<'_>,
    phase: u8,
    ith: usize,
    g: Patch,
    out_strides: [usize; 5],
) -> Result<()> {
    let (a, b, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    let (oc, kn) = conv_dims(ctx.node);
    debug_assert_eq!(kn, g.row_len());
    debug_assert!(conv_work_size(ctx.node, ctx.nth) <= ctx.work_len);
    let kernel_ptr = ctx.work as *mut f32;
    if phase == 0 {
        // The kernel is contiguous (build check): element i of the flat kernel is row i / kn.
        let (e0, e1) = split(oc * kn, ith, ctx.nth);
        for i in e0..e1 {
            // SAFETY: i < oc*kn = the kernel's element count; the work buffer starts with
            // oc*kn f32 slots (conv_work_size) and this worker writes only its range.
            unsafe { kernel_ptr.add(i).write(load(a.ptr, a.dtype, i)) };
        }
        return Ok(());
    }
    // The tier's 4x2 register tile and F16 rounding (read once per node, not per chunk).
    let (tile4x2, round_f16) = (ctx.kt.conv.tile_f32_4x2, ctx.kt.conv.round_f16);
    // SAFETY: the kernel block (phase 0, finished before the barrier) holds oc*kn f32 values,
    // read-only from now on.
    let kernel = unsafe { std::slice::from_raw_parts(kernel_ptr as *const f32, oc * kn) };
    // SAFETY: each thread's scratch is a disjoint block of TILE_P*kn f32 after the kernel block
    // (conv_tile_bytes).
    let tile_rows = unsafe {
        let t = ctx.work.add(conv_kernel_bytes(ctx.node) + ith * conv_tile_bytes(ctx.node));
        std::slice::from_raw_parts_mut(t as *mut f32, TILE_P * kn)
    };
    let total = g.positions();
    let chunks = total.div_ceil(TILE_P);
    let [sx, sy, sz, soc, sn] = out_strides;
    loop {
        let c = ctx.counter.fetch_add(1, Ordering::Relaxed);
        if c >= chunks {
            break;
        }
        let (q0, q1) = (c * TILE_P, ((c + 1) * TILE_P).min(total));
        // Positions of one output row share their input rows: unfold them together (small
        // kernels), else one at a time.
        let one_row = g.unravel(q0).3 + (q1 - q0) <= g.ow && g.kw < 16;
        if one_row {
            // SAFETY: q0..q1 lie in one output row (checked above); b is the node's F32 input.
            unsafe { g.fill_tile_f32(b.ptr, q0, q1 - q0, tile_rows) };
        }
        for q in q0..q1 {
            let row = &mut tile_rows[(q - q0) * kn..(q - q0 + 1) * kn];
            if !one_row {
                // SAFETY: q < positions; b is the node's F32 input described by g.
                unsafe { g.fill_f32(b.ptr, q, row) };
            }
            if a.dtype == DType::F16 {
                // ggml multiplies in the kernel's type: the patch goes through f16.
                round_f16(row);
            }
        }
        let np = q1 - q0;
        let mut offs = [0usize; TILE_P];
        for (j, o) in offs.iter_mut().enumerate().take(np) {
            let (n, oz, oy, ox) = g.unravel(q0 + j);
            *o = ox * sx + oy * sy + oz * sz + n * sn;
        }
        let krow = |o: usize| &kernel[o * kn..(o + 1) * kn];
        let prow = |j: usize| &tile_rows[j * kn..(j + 1) * kn];
        for o in (0..oc).step_by(4) {
            let a4: [&[f32]; 4] = std::array::from_fn(|r| krow((o + r).min(oc - 1)));
            for j in (0..np).step_by(2) {
                let b2: [&[f32]; 2] = std::array::from_fn(|c| prow((j + c).min(np - 1)));
                let mut out = [0f32; 8];
                tile4x2(kn, a4, b2, &mut out);
                for r in 0..(oc - o).min(4) {
                    for c in 0..(np - j).min(2) {
                        // SAFETY: (position, channel) indices are below dst's shape; each
                        // position belongs to exactly one chunk, taken by one worker.
                        unsafe {
                            (d.ptr.add(offs[j + c] + (o + r) * soc) as *mut f32)
                                .write_unaligned(out[r * 2 + c])
                        };
                    }
                }
            }
        }
    }
    Ok(())
}

pub(crate) fn conv_2d(ctx: &NodeCtx<'_>, phase: u8, ith: usize, p: &Conv2dParams) -> Result<()> {
    let (a, d) = (ctx.src(0), ctx.dst());
    let g = Patch::from_2d(p, &a.ne, ctx.src(1), true).with_out(d.ne[0], d.ne[1], 1);
    conv_nd(ctx, phase, ith, g, [d.nb[0], d.nb[1], 0, d.nb[2], d.nb[3]])
}

pub(crate) fn conv_3d(ctx: &NodeCtx<'_>, phase: u8, ith: usize, p: &Conv3dParams) -> Result<()> {
    let (a, b, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    let g = Patch::from_3d(p, &a.ne, b).with_out(d.ne[0], d.ne[1], d.ne[2]);
    conv_nd(ctx, phase, ith, g, [d.nb[0], d.nb[1], d.nb[2], d.nb[3], p.oc * d.nb[3]])
}

// ------------------------------------------------------------------------------------------------
// conv_2d_dw

pub(crate) fn conv_2d_dw(ctx: &NodeCtx<'_>, ith: usize, p: &Conv2dParams) -> Result<()> {
    let (a, b, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    let (iw, ih) = (b.ne[0] as i64, b.ne[1] as i64);
    let (kw, kh) = (a.ne[0], a.ne[1]);
    let (ow, oh, ch, nb) = (d.ne[0], d.ne[1], d.ne[2], d.ne[3]);
    let one = |c: usize, n: usize, oy: usize, ox: usize| -> f32 {
        let mut sum = 0f32;
        for ky in 0..kh {
            let y = (oy * p.s1 + ky * p.d1) as i64 - p.p1 as i64;
            if !(0..ih).contains(&y) {
                continue;
            }
            for kx in 0..kw {
                let x = (ox * p.s0 + kx * p.d0) as i64 - p.p0 as i64;
                if !(0..iw).contains(&x) {
                    continue;
                }
                // SAFETY: kx, ky, c are below the kernel's shape and x, y, c, n below the input's
                // (checked above and at build time); strides come from the tensors.
                unsafe {
                    let kv = load(a.ptr.add(kx * a.nb[0] + ky * a.nb[1] + c * a.nb[3]), a.dtype, 0);
                    let sv = (b.ptr.add(
                        x as usize * b.nb[0] + y as usize * b.nb[1] + c * b.nb[2] + n * b.nb[3],
                    ) as *const f32)
                        .read_unaligned();
                    sum += kv * sv;
                }
            }
        }
        sum
    };
    let out = |c: usize, n: usize, oy: usize, ox: usize| {
        // SAFETY: indices below dst's shape; the caller's split gives each element one owner.
        unsafe { d.ptr.add(ox * d.nb[0] + oy * d.nb[1] + c * d.nb[2] + n * d.nb[3]) as *mut f32 }
    };
    if b.nb[2] == 4 && b.nb[0] > b.nb[2] {
        // CWHN: rows (oy, n), channels innermost.
        let (r0, r1) = split(oh * nb, ith, ctx.nth);
        for r in r0..r1 {
            let (oy, n) = (r % oh, r / oh);
            for ox in 0..ow {
                for c in 0..ch {
                    // SAFETY: see `out`.
                    unsafe { out(c, n, oy, ox).write_unaligned(one(c, n, oy, ox)) };
                }
            }
        }
    } else {
        // WHCN: whole planes (c, n).
        let (r0, r1) = split(ch * nb, ith, ctx.nth);
        for r in r0..r1 {
            let (c, n) = (r % ch, r / ch);
            for oy in 0..oh {
                for ox in 0..ow {
                    // SAFETY: see `out`.
                    unsafe { out(c, n, oy, ox).write_unaligned(one(c, n, oy, ox)) };
                }
            }
        }
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------------
// conv_transpose_1d / conv_transpose_2d

/// Element counts of the permuted kernel and input in the work buffer.
fn convt_parts(node: &ExecNode) -> (usize, usize) {
    let (Some(a), Some(b)) = (node.src[0].as_ref(), node.src[1].as_ref()) else { return (0, 0) };
    match node.op {
        crate::graph::Op::ConvTranspose1d { .. } => {
            (a.ne[0] * a.ne[1] * a.ne[2], b.ne[0] * b.ne[1])
        }
        _ => (a.nelements(), b.nelements()),
    }
}

pub(crate) fn convt_work_size(node: &ExecNode, _nth: usize) -> usize {
    let (nk, ns) = convt_parts(node);
    align_up(nk * 4, 64) + ns * 4
}

/// conv_transpose_1d. Phase 0 permutes the kernel [K, Cout, Cin] to [Cout][K][Cin] and the input
/// [L, Cin] to [L][Cin] (f32; through f16 for an F16 kernel, as ggml). Phase 1: each output
/// channel row is zeroed and accumulated in ggml's order (input position, then tap).
pub(crate) fn conv_transpose_1d(ctx: &NodeCtx<'_>, phase: u8, ith: usize, s0: usize) -> Result<()> {
    let (a, b, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    let (k, cout, cin, l) = (a.ne[0], a.ne[1], a.ne[2], b.ne[0]);
    let (nk, ns) = convt_parts(ctx.node);
    debug_assert!(convt_work_size(ctx.node, ctx.nth) <= ctx.work_len);
    let wk = ctx.work as *mut f32;
    // SAFETY: the input block follows the kernel block inside the work buffer (convt_work_size).
    let ws = unsafe { ctx.work.add(align_up(nk * 4, 64)) as *mut f32 };
    let f16 = a.dtype == DType::F16;
    if phase == 0 {
        let (u0, u1) = split(cout * k + l, ith, ctx.nth);
        for u in u0..u1 {
            for ci in 0..cin {
                // SAFETY: unit u < cout*k names (oc, tap) or an input position below l; every
                // index is inside its tensor and inside the work blocks; units are disjoint.
                unsafe {
                    if u < cout * k {
                        let (oc, t) = (u / k, u % k);
                        let v =
                            load(a.ptr.add(t * a.nb[0] + oc * a.nb[1] + ci * a.nb[2]), a.dtype, 0);
                        wk.add((oc * k + t) * cin + ci).write(v);
                    } else {
                        let i = u - cout * k;
                        let v =
                            (b.ptr.add(i * b.nb[0] + ci * b.nb[1]) as *const f32).read_unaligned();
                        ws.add(i * cin + ci).write(if f16 { round_f16(v) } else { v });
                    }
                }
            }
        }
        return Ok(());
    }
    let dot = ctx.kt.dot_f32;
    // SAFETY: both blocks were filled in phase 0 and are read-only now.
    let (kern, src) = unsafe {
        (
            std::slice::from_raw_parts(wk as *const f32, nk),
            std::slice::from_raw_parts(ws as *const f32, ns),
        )
    };
    let (r0, r1) = split(cout, ith, ctx.nth);
    for oc in r0..r1 {
        // SAFETY: row oc of the fresh contiguous result (d.ne[0] f32), owned by this worker.
        let row =
            unsafe { std::slice::from_raw_parts_mut(d.ptr.add(oc * d.nb[1]) as *mut f32, d.ne[0]) };
        row.fill(0.0);
        for i in 0..l {
            let sv = &src[i * cin..(i + 1) * cin];
            for t in 0..k {
                let kv = &kern[(oc * k + t) * cin..(oc * k + t + 1) * cin];
                row[i * s0 + t] += dot(sv, kv);
            }
        }
    }
    Ok(())
}

/// conv_transpose_2d. Phase 0 permutes the kernel [KW, KH, Cout, Cin] to [Cout][KH][KW][Cin]
/// and the input [W, H, Cin, N] to [N][H][W][Cin]. Phase 1: each (Cout, batch) plane is zeroed
/// and accumulated in ggml's order (input row, input column, tap row, tap column).
pub(crate) fn conv_transpose_2d(
    ctx: &NodeCtx<'_>,
    phase: u8,
    ith: usize,
    stride: usize,
) -> Result<()> {
    let (a, b, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    let (kw, kh, cout, cin) = (a.ne[0], a.ne[1], a.ne[2], a.ne[3]);
    let (w, h, n) = (b.ne[0], b.ne[1], b.ne[3]);
    let (nk, ns) = convt_parts(ctx.node);
    debug_assert!(convt_work_size(ctx.node, ctx.nth) <= ctx.work_len);
    let wk = ctx.work as *mut f32;
    // SAFETY: the input block follows the kernel block inside the work buffer (convt_work_size).
    let ws = unsafe { ctx.work.add(align_up(nk * 4, 64)) as *mut f32 };
    let f16 = a.dtype == DType::F16;
    let kpos = cout * kh * kw;
    if phase == 0 {
        let (u0, u1) = split(kpos + n * h * w, ith, ctx.nth);
        for u in u0..u1 {
            for ci in 0..cin {
                // SAFETY: unit u names a kernel tap (oc, ky, kx) or an input pixel (n, y, x), all
                // below their tensors' shapes; destinations are disjoint per unit and inside the
                // work blocks.
                unsafe {
                    if u < kpos {
                        let (kx, ky, oc) = (u % kw, (u / kw) % kh, u / (kw * kh));
                        let v = load(
                            a.ptr.add(kx * a.nb[0] + ky * a.nb[1] + oc * a.nb[2] + ci * a.nb[3]),
                            a.dtype,
                            0,
                        );
                        wk.add(u * cin + ci).write(v);
                    } else {
                        let v = u - kpos;
                        let (x, y, bn) = (v % w, (v / w) % h, v / (w * h));
                        let s = (b.ptr.add(x * b.nb[0] + y * b.nb[1] + ci * b.nb[2] + bn * b.nb[3])
                            as *const f32)
                            .read_unaligned();
                        ws.add(v * cin + ci).write(if f16 { round_f16(s) } else { s });
                    }
                }
            }
        }
        return Ok(());
    }
    let dot = ctx.kt.dot_f32;
    // SAFETY: both blocks were filled in phase 0 and are read-only now.
    let (kern, src) = unsafe {
        (
            std::slice::from_raw_parts(wk as *const f32, nk),
            std::slice::from_raw_parts(ws as *const f32, ns),
        )
    };
    let (ow, oh) = (d.ne[0], d.ne[1]);
    let (r0, r1) = split(cout * n, ith, ctx.nth);
    for r in r0..r1 {
        let (oc, bn) = (r % cout, r / cout);
        // SAFETY: plane (oc, bn) of the fresh contiguous result, ow*oh f32, owned by this worker.
        let plane = unsafe {
            std::slice::from_raw_parts_mut(
                d.ptr.add(oc * d.nb[2] + bn * d.nb[3]) as *mut f32,
                ow * oh,
            )
        };
        plane.fill(0.0);
        for y in 0..h {
            for x in 0..w {
                let px = ((bn * h + y) * w + x) * cin;
                let sv = &src[px..px + cin];
                for ky in 0..kh {
                    for kx in 0..kw {
                        let kp = ((oc * kh + ky) * kw + kx) * cin;
                        plane[(y * stride + ky) * ow + x * stride + kx] +=
                            dot(sv, &kern[kp..kp + cin]);
                    }
                }
            }
        }
    }
    Ok(())
}
