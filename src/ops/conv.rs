//! Convolutions (ggml's ops.cpp): im2col (1D, 2D) and im2col_3d, col2im_1d, conv_2d and conv_3d
//! (im2col + GEMM on the engine's float family: the kernel packed as f32 rows into the work
//! buffer, each task's output positions unfolded straight into panels), depthwise
//! conv_2d_dw (WHCN and CWHN),
//! and conv_transpose_1d / conv_transpose_2d (operands permuted into the work buffer, then each
//! thread accumulates whole output planes in ggml's order). Every output element is produced by
//! one thread with a fixed operation order, so results do not depend on the thread count.

use super::gemm::float::{self, FloatBlock, panel_floats};
use super::gemm::{self, Grid, Store, Task};
use super::{NodeCtx, split};
use crate::dtype::DType;
use crate::error::Result;
use crate::graph::{Conv2dParams, Conv3dParams};
use crate::kernels::sgemm::SG_NR;
use crate::ops::node::{ExecNode, TView, align_up};
use crate::quant::util::{bf16_to_fp32, fp16_to_fp32, fp32_to_bf16, fp32_to_fp16};

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
    /// im2col straight into a GEMM panel (element `k` of column `c` at `panel[k * 16 + c]`):
    /// columns `c0..c0 + np` get the patches of the `np` consecutive output positions from `q0`,
    /// which lie in one output row (same batch, z and y). For each (channel, kd, kh, kw) the
    /// positions read one input row at stride `s0`, a contiguous run for unit stride, with the
    /// out-of-range ones (padding) zero.
    ///
    /// # Safety
    /// As [`Patch::fill_f32`]; `unravel(q0).3 + np <= ow`, `c0 + np <= 16` and
    /// `panel.len() >= row_len() * 16`.
    unsafe fn fill_panel_f32(
        &self,
        base: *const u8,
        q0: usize,
        np: usize,
        c0: usize,
        panel: &mut [f32],
    ) {
        let (n, oz, oy, ox0) = self.unravel(q0);
        debug_assert!(ox0 + np <= self.ow && c0 + np <= SG_NR);
        let (s0, d0) = (self.s[0], self.d[0]);
        let unit = s0 == 1 && self.sx == 4;
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
                    for kx in 0..self.kw {
                        let out = &mut panel[k * SG_NR + c0..k * SG_NR + c0 + np];
                        k += 1;
                        // Position j reads column xb + j * s0: in range for j in jlo..jhi.
                        let xb = ox0 as i64 * s0 + kx as i64 * d0 - self.p[0];
                        let jlo = if xb >= 0 { 0 } else { (-xb + s0 - 1) / s0 };
                        let jhi = if xb >= self.iw { 0 } else { (self.iw - xb + s0 - 1) / s0 };
                        let (jlo, jhi) = (jlo.min(np as i64) as usize, jhi.min(np as i64) as usize);
                        if !inside || jlo >= jhi {
                            out.fill(0.0);
                            continue;
                        }
                        out[..jlo].fill(0.0);
                        out[jhi..].fill(0.0);
                        // SAFETY: y and z are in range; for jlo <= j < jhi the column
                        // xb + j * s0 is in 0..iw by the choice of the bounds.
                        unsafe {
                            let pr = pc.add(z as usize * self.sz + y as usize * self.sy);
                            let first = pr.add((xb + jlo as i64 * s0) as usize * self.sx);
                            if unit {
                                std::ptr::copy_nonoverlapping(
                                    first,
                                    out[jlo..jhi].as_mut_ptr() as *mut u8,
                                    (jhi - jlo) * 4,
                                );
                            } else {
                                let step = s0 as usize * self.sx;
                                for (t, v) in out[jlo..jhi].iter_mut().enumerate() {
                                    *v = (first.add(t * step) as *const f32).read_unaligned();
                                }
                            }
                        }
                    }
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

/// (output channels, kernel row length) of a conv_2d / conv_3d node: the kernel is [KW, KH, C,
/// OC] for conv_2d, [KW, KH, KD, C * OC] for conv_3d (`p3`).
pub(crate) fn conv_dims(node: &ExecNode, p3: Option<&Conv3dParams>) -> (usize, usize) {
    let (Some(a), Some(b)) = (node.src[0].as_ref(), node.src[1].as_ref()) else { return (0, 0) };
    match p3 {
        Some(p) => (p.oc, a.ne[0] * a.ne[1] * a.ne[2] * p.c),
        None => (a.ne[3], a.ne[0] * a.ne[1] * b.ne[2]),
    }
}

fn conv_kernel_bytes((oc, kn): (usize, usize)) -> usize {
    align_up(oc * kn * 4, 64)
}

/// f32 values of packed patch panels one task may hold (256 KiB, within L2).
const PANEL_BUDGET: usize = 64 << 10;

/// Output positions per GEMM task: as many 16-column panels of `kn` values as fit the budget
/// (at least one, at most the engine's column block).
fn conv_cols(kn: usize) -> usize {
    (PANEL_BUDGET / kn.max(1) / SG_NR * SG_NR).clamp(SG_NR, float::NC)
}

/// Per-thread scratch: the task's patch panels, then the engine's block scratch.
fn conv_scratch_bytes((_, kn): (usize, usize)) -> usize {
    align_up(conv_cols(kn) * kn * 4, 64) + align_up(float::BLOCK_SCRATCH * 4, 64)
}

/// Work bytes of a conv_2d / conv_3d node with `dims` (`conv_dims`).
pub(crate) fn conv_work_size(dims: (usize, usize), nth: usize) -> usize {
    conv_kernel_bytes(dims) + nth * conv_scratch_bytes(dims)
}

/// im2col + GEMM on the engine's float family. Phase 0: the kernel as f32 rows [OC][row_len]
/// in the work buffer (the A rows). Phase 1: the engine's tasks of kernel rows by output
/// positions; each task unfolds its positions' patches (rounded to f16 for an F16 kernel, as
/// ggml multiplies in the kernel's type) straight into panels and runs the block.
fn conv_nd(
    ctx: &NodeCtx<'_>,
    phase: u8,
    ith: usize,
    g: Patch,
    out_strides: [usize; 5],
    dims: (usize, usize),
) -> Result<()> {
    let (a, b, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    let (oc, kn) = dims;
    debug_assert_eq!(kn, g.row_len());
    if conv_work_size(dims, ctx.nth) > ctx.work_len {
        return Err(crate::error::Error::Buffer("conv: work buffer smaller than planned".into()));
    }
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
    let round_f16 = ctx.kt.conv.round_f16;
    let nc = conv_cols(kn);
    let sb = conv_scratch_bytes(dims);
    // SAFETY: each thread's scratch is a disjoint, 64-byte aligned block of `sb` bytes after the
    // kernel block (conv_work_size); worker ith alone uses block ith.
    let scratch = unsafe {
        let t = ctx.work.add(conv_kernel_bytes(dims) + ith * sb);
        std::slice::from_raw_parts_mut(t as *mut f32, sb / 4)
    };
    let (panels, block) = scratch.split_at_mut(align_up(nc * kn * 4, 64) / 4);
    let a_row = |i: usize| {
        // Row i < oc of the kernel block (phase 0): a pointer only, read by the engine.
        kernel_ptr.wrapping_add(i * kn) as *const u8
    };
    let [sx, sy, sz, soc, sn] = out_strides;
    let grid = Grid::new(oc, g.positions(), 1, float::MC, nc);
    grid.run(ctx.counter, |Task { rows, cols, .. }| {
        let used = cols.len();
        // Padding columns of the last panel are zero (their results are not stored).
        if !used.is_multiple_of(SG_NR) {
            panels[(used / SG_NR) * panel_floats(kn)..][..panel_floats(kn)].fill(0.0);
        }
        // im2col into the panels, a run of positions at a time within one panel and one
        // output row.
        let mut q = cols.start;
        while q < cols.end {
            let c = q - cols.start;
            let ox = g.unravel(q).3;
            let np = (SG_NR - c % SG_NR).min(g.ow - ox).min(cols.end - q);
            let panel = &mut panels[(c / SG_NR) * panel_floats(kn)..][..panel_floats(kn)];
            // SAFETY: q..q + np lie in one output row (np <= ow - ox) and in columns
            // c % 16.. of one panel of kn * 16 values; b is the node's F32 input described by g.
            unsafe { g.fill_panel_f32(b.ptr, q, np, c % SG_NR, panel) };
            q += np;
        }
        if a.dtype == DType::F16 {
            // ggml multiplies in the kernel's type: the patches go through f16.
            round_f16(&mut panels[..used.div_ceil(SG_NR) * panel_floats(kn)]);
        }
        let mut offs = [0usize; float::NC];
        for (c, o) in offs.iter_mut().enumerate().take(used) {
            let (n, oz, oy, ox) = g.unravel(cols.start + c);
            *o = ox * sx + oy * sy + oz * sz + n * sn;
        }
        let store = |o: usize, c0: usize, run: &[f32]| {
            for (c, &v) in (c0..).zip(run) {
                // SAFETY: (position, channel) indices are below dst's shape; each position and
                // channel belongs to exactly one task, taken by one worker.
                unsafe { (d.ptr.add(offs[c] + o * soc) as *mut f32).write_unaligned(v) };
            }
        };
        let (mut fam, tiles) =
            FloatBlock::new(ctx.kt, DType::F32, kn, rows, a_row, panels, used, block)?;
        gemm::block(&mut fam, tiles, Store::RowMajor, store)
    })
}

pub(crate) fn conv_2d(ctx: &NodeCtx<'_>, phase: u8, ith: usize, p: &Conv2dParams) -> Result<()> {
    let (a, d) = (ctx.src(0), ctx.dst());
    let g = Patch::from_2d(p, &a.ne, ctx.src(1), true).with_out(d.ne[0], d.ne[1], 1);
    conv_nd(ctx, phase, ith, g, [d.nb[0], d.nb[1], 0, d.nb[2], d.nb[3]], conv_dims(ctx.node, None))
}

pub(crate) fn conv_3d(ctx: &NodeCtx<'_>, phase: u8, ith: usize, p: &Conv3dParams) -> Result<()> {
    let (a, b, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    let g = Patch::from_3d(p, &a.ne, b).with_out(d.ne[0], d.ne[1], d.ne[2]);
    let dims = conv_dims(ctx.node, Some(p));
    conv_nd(ctx, phase, ith, g, [d.nb[0], d.nb[1], d.nb[2], d.nb[3], p.oc * d.nb[3]], dims)
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

/// Element counts of the permuted kernel and input in the work buffer (`one_d`:
/// conv_transpose_1d, else conv_transpose_2d).
fn convt_parts(node: &ExecNode, one_d: bool) -> (usize, usize) {
    let (Some(a), Some(b)) = (node.src[0].as_ref(), node.src[1].as_ref()) else { return (0, 0) };
    if one_d {
        (a.ne[0] * a.ne[1] * a.ne[2], b.ne[0] * b.ne[1])
    } else {
        (a.nelements(), b.nelements())
    }
}

/// Work bytes of a conv_transpose_1d (`one_d`) or conv_transpose_2d node.
pub(crate) fn convt_work_size(node: &ExecNode, one_d: bool) -> usize {
    let (nk, ns) = convt_parts(node, one_d);
    align_up(nk * 4, 64) + ns * 4
}

/// conv_transpose_1d. Phase 0 permutes the kernel [K, Cout, Cin] to [Cout][K][Cin] and the input
/// [L, Cin] to [L][Cin] (f32; through f16 for an F16 kernel, as ggml). Phase 1: each output
/// channel row is zeroed and accumulated in ggml's order (input position, then tap).
pub(crate) fn conv_transpose_1d(ctx: &NodeCtx<'_>, phase: u8, ith: usize, s0: usize) -> Result<()> {
    let (a, b, d) = (ctx.src(0), ctx.src(1), ctx.dst());
    let (k, cout, cin, l) = (a.ne[0], a.ne[1], a.ne[2], b.ne[0]);
    let (nk, ns) = convt_parts(ctx.node, true);
    debug_assert!(convt_work_size(ctx.node, true) <= ctx.work_len);
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
    let (nk, ns) = convt_parts(ctx.node, false);
    debug_assert!(convt_work_size(ctx.node, false) <= ctx.work_len);
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
