//! The GEMM engine: one packing, blocking and task scheme for every matrix product of the CPU
//! backend, with two micro-kernel families plugged into it.
//!
//! A product C = A B^T has `m` rows of A (weights, query rows, convolution kernels), `n` columns
//! (activations, key/value positions, output pixels) and a shared dimension `k`.
//!
//! - **Panels (B).** The columns are packed once into panels of `NR` columns, element `k` of the
//!   `NR` columns side by side: f32 for the float family ([`float::pack_panel`]), int8 blocks
//!   with their scales and level sums for the integer family ([`int::pack_column`]).
//! - **Strips (A).** A task packs its rows, step by step along K, into strips of `MR` rows: f32
//!   (dequantized where needed) or unpacked integer codes with their sub-block scales.
//! - **Blocking.** [`block`] walks K in the family's steps; each step packs the task's strips and
//!   multiplies every strip with every panel into `MR x NR` f32 tiles, summing the steps in K
//!   order; at the end it hands every result to the caller's `store` once.
//! - **Tasks.** [`Grid`] numbers the `mc x nc` blocks of a (batched) product; workers take them
//!   through the node's counter ([`Grid::run`]). Each output is computed by one task in a fixed
//!   order, so results do not depend on the thread count.
//!
//! Users: `mul_mat` (`mul_mat_f` with the float family, `mul_mat_q` with the integer family),
//! `mul_mat_id` (both, per expert), the tiled flash attention (the float family's strips,
//! panels and [`float::sweep`] for S = Q K^T and P V) and `conv_2d` / `conv_3d` (im2col into
//! panels, then [`block`] over the kernel rows).

pub(crate) mod float;
pub(crate) mod int;

use crate::error::Result;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};

/// One micro-kernel family over one block of rows and columns: how a K step's strips are packed
/// and multiplied. Tile `(p, st)` (panel `p`, strip `st`) is `tiles[(p * n_strips + st) * MR *
/// NR..]`, element `(r, c)` at `r * NR + c`.
pub(crate) trait Family {
    /// Rows per strip.
    const MR: usize;
    /// Columns per panel.
    const NR: usize;
    /// The block's rows (at most the family's row-block size).
    fn rows(&self) -> Range<usize>;
    /// The block's columns (at most the family's column-block size).
    fn ncols(&self) -> usize;
    /// Number of K steps.
    fn steps(&self) -> usize;
    /// Packs every strip of step `s`.
    fn pack_step(&mut self, s: usize) -> Result<()>;
    /// Multiplies step `s`'s strips with every panel into the tiles (step 0 starts them).
    fn multiply_step(&mut self, s: usize, tiles: &mut [f32]);
}

/// The order in which [`block`] hands out its results: the one that writes the destination
/// contiguously.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Store {
    /// Panel by panel, each column's rows of up to 256 (several strips) in one run, rows
    /// fastest (`mul_mat`'s dst: rows are contiguous). The panel's tiles are transposed into a
    /// buffer first: reading the tiles column by column across strips, as an earlier version
    /// did, made a q4_K prefill's stores a third slower than tile by tile; with the buffer, the
    /// whole-column runs measured 1.00-1.05x against tile by tile (q5_0 1.05 at K = 576, q4_K
    /// 1.00 on one thread and 1.03 on two at K = 4096).
    ColumnMajor,
    /// Row by row, columns fastest (convolutions: output positions are contiguous).
    RowMajor,
}

/// Runs one block: every K step packed and multiplied in order, then each result of the block
/// handed to `store` once, in runs: `store(row, column, run)` gives `run[i]` for `(row + i,
/// column)` with [`Store::ColumnMajor`], for `(row, column + i)` with [`Store::RowMajor`]
/// (`column` counted from the block's first).
pub(crate) fn block<F: Family>(
    fam: &mut F,
    tiles: &mut [f32],
    order: Store,
    mut store: impl FnMut(usize, usize, &[f32]),
) -> Result<()> {
    let rows = fam.rows();
    let ncols = fam.ncols();
    let n_strips = rows.len().div_ceil(F::MR);
    let n_panels = ncols.div_ceil(F::NR);
    let t = F::MR * F::NR;
    if tiles.len() < n_strips * n_panels * t {
        return Err(crate::error::Error::Buffer("GEMM block larger than its tile buffer".into()));
    }
    for s in 0..fam.steps() {
        fam.pack_step(s)?;
        fam.multiply_step(s, tiles);
    }
    let tile = |p: usize, r: usize| &tiles[(p * n_strips + r / F::MR) * t..][..t];
    match order {
        Store::ColumnMajor => {
            // Column by column, each column's rows of up to COL_ROWS in one run: the panel's
            // tiles are transposed into a local buffer first (a run read back as a vector
            // right after its elements were stored one by one would wait for those stores: no
            // store-to-load forwarding over several stores), then each run written in one
            // piece, front to back, which the hardware prefetcher follows (a strip's 8 rows
            // per column jumped from column to column).
            const { assert!(F::NR <= MAX_NR && F::MR <= COL_ROWS) };
            let per = COL_ROWS / F::MR;
            let mut cols = [[0f32; COL_ROWS]; MAX_NR];
            for p in 0..n_panels {
                let nc = F::NR.min(ncols - p * F::NR);
                for st0 in (0..n_strips).step_by(per) {
                    let st1 = (st0 + per).min(n_strips);
                    for st in st0..st1 {
                        let r0 = st * F::MR;
                        let nr = F::MR.min(rows.len() - r0);
                        let tile = &tiles[(p * n_strips + st) * t..][..t];
                        let at = (st - st0) * F::MR;
                        for (rr, row) in tile.chunks_exact(F::NR).take(nr).enumerate() {
                            for (c, &v) in row[..nc].iter().enumerate() {
                                cols[c][at + rr] = v;
                            }
                        }
                    }
                    let (r0, r1) = (st0 * F::MR, (st1 * F::MR).min(rows.len()));
                    for (c, col) in cols[..nc].iter().enumerate() {
                        store(rows.start + r0, p * F::NR + c, &col[..r1 - r0]);
                    }
                }
            }
        }
        Store::RowMajor => {
            for (r, i) in rows.clone().enumerate() {
                for p in 0..n_panels {
                    let run = &tile(p, r)[(r % F::MR) * F::NR..][..F::NR];
                    store(i, p * F::NR, &run[..F::NR.min(ncols - p * F::NR)]);
                }
            }
        }
    }
    Ok(())
}

/// A tier's per-thread kernel state (the AMX tile configuration), given back when a block
/// claims it and again when the guard drops, on every way out of the block: no block runs on
/// a configuration that other code of the thread loaded, and none is left behind.
pub(crate) struct KernelState(Option<fn()>);

impl KernelState {
    /// Gives the state back now (`release`, where the kernels keep some) and on drop.
    pub(crate) fn claim(release: Option<fn()>) -> KernelState {
        if let Some(release) = release {
            release();
        }
        KernelState(release)
    }
}

impl Drop for KernelState {
    fn drop(&mut self) {
        if let Some(release) = self.0 {
            release();
        }
    }
}

/// The most columns a family's panel may have.
const MAX_NR: usize = 16;
/// The most rows of one column [`block`] hands out in one run.
const COL_ROWS: usize = 256;

/// Writes `run` to the f32 elements at `p`, `p + stride`, .. (bytes): one copy where they are
/// contiguous.
///
/// # Safety
/// The `run.len()` elements at `p + i * stride` are writable f32 (any alignment) that nothing
/// else accesses meanwhile.
#[inline]
pub(crate) unsafe fn write_run(p: *mut u8, stride: usize, run: &[f32]) {
    if stride == 4 {
        // A run of one strip's rows (8 or 6: a block that is one strip high) as fixed-size
        // moves rather than a `memcpy` call, which is what one move of the whole array compiled
        // to; longer runs are one copy.
        if let Ok(r) = <&[f32; 8]>::try_from(run) {
            let [a, b] = [[r[0], r[1], r[2], r[3]], [r[4], r[5], r[6], r[7]]];
            // SAFETY: the caller's bound, for the run's 32 bytes in two pieces.
            unsafe {
                (p as *mut [f32; 4]).write_unaligned(a);
                (p.add(16) as *mut [f32; 4]).write_unaligned(b);
            };
        } else if let Ok(r) = <&[f32; 6]>::try_from(run) {
            let (a, b) = ([r[0], r[1], r[2], r[3]], [r[4], r[5]]);
            // SAFETY: the caller's bound, for the run's 24 bytes in two pieces.
            unsafe {
                (p as *mut [f32; 4]).write_unaligned(a);
                (p.add(16) as *mut [f32; 2]).write_unaligned(b);
            };
        } else {
            // SAFETY: the caller's bound, for the run's bytes in one piece.
            unsafe { std::ptr::copy_nonoverlapping(run.as_ptr() as *const u8, p, run.len() * 4) };
        }
    } else {
        for (i, &v) in run.iter().enumerate() {
            // SAFETY: the caller's bound, element i.
            unsafe { (p.add(i * stride) as *mut f32).write_unaligned(v) };
        }
    }
}

/// The blocks of a batched product: `batches` products of `m` rows by `n` columns, cut into
/// blocks of `mc` rows by `nc` columns, numbered row block fastest, then column block, then batch;
/// the last `tail` blocks are each cut in two by columns ([`Grid::split_tail`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Grid {
    pub m: usize,
    pub n: usize,
    pub batches: usize,
    pub mc: usize,
    pub nc: usize,
    /// Blocks at the end cut in two (0: none).
    tail: usize,
    /// Multiple of which a cut block's second half starts (panel width).
    align: usize,
}

/// One block of a [`Grid`].
#[derive(Clone, Debug)]
pub(crate) struct Task {
    pub batch: usize,
    pub rows: Range<usize>,
    pub cols: Range<usize>,
}

impl Grid {
    /// `batches` products of `m x n` in blocks of `mc x nc`, none cut.
    pub(crate) fn new(m: usize, n: usize, batches: usize, mc: usize, nc: usize) -> Grid {
        Grid { m, n, batches, mc, nc, tail: 0, align: 0 }
    }

    fn blocks_m(&self) -> usize {
        self.m.div_ceil(self.mc)
    }

    fn per_batch(&self) -> usize {
        self.blocks_m() * self.n.div_ceil(self.nc)
    }

    /// Number of tasks: the blocks, with each of the last `tail` counted twice.
    pub(crate) fn tasks(&self) -> usize {
        self.per_batch() * self.batches + self.tail
    }

    /// Task `t` (below [`Grid::tasks`]): a block, or a column half of one of the last `tail`.
    pub(crate) fn task(&self, t: usize) -> Task {
        let whole = self.per_batch() * self.batches - self.tail;
        if t < whole {
            return self.block(t);
        }
        let (u, half) = ((t - whole) / 2, (t - whole) % 2);
        let mut task = self.block(whole + u);
        let mid = task.cols.start + (task.cols.len() / 2).div_ceil(self.align) * self.align;
        task.cols = if half == 0 { task.cols.start..mid } else { mid..task.cols.end };
        task
    }

    /// Cuts each of the last `k` blocks in two by columns (the second half starting at a multiple
    /// of `align` columns), where the last column block is at least `2 * align` wide: the workers'
    /// last tasks are then shorter, so one slowed worker leaves the others less time idle at the
    /// end. A cut block's weights are unpacked once per half; its results keep their bits (each
    /// output is still one task's, summed in K order).
    pub(crate) fn split_tail(mut self, k: usize, align: usize) -> Grid {
        if self.tasks() == 0 {
            return self;
        }
        let last = self.n - (self.n.div_ceil(self.nc) - 1) * self.nc;
        if align > 0 && last >= 2 * align {
            self.tail = k.min(self.blocks_m());
            self.align = align;
        }
        self
    }

    /// Block `t` of the grid's numbering.
    fn block(&self, t: usize) -> Task {
        let (pb, bm) = (self.per_batch(), self.blocks_m());
        let (batch, local) = (t / pb, t % pb);
        let (tm, tn) = (local % bm, local / bm);
        Task {
            batch,
            rows: tm * self.mc..((tm + 1) * self.mc).min(self.m),
            cols: tn * self.nc..((tn + 1) * self.nc).min(self.n),
        }
    }

    /// Takes blocks from `counter` until none is left, running `f` on each; stops at the first
    /// error.
    pub(crate) fn run(
        &self,
        counter: &AtomicUsize,
        mut f: impl FnMut(Task) -> Result<()>,
    ) -> Result<()> {
        let total = self.tasks();
        loop {
            let t = counter.fetch_add(1, Ordering::Relaxed);
            if t >= total {
                return Ok(());
            }
            f(self.task(t))?;
        }
    }

    /// Halves `mc` (not below `min_mc`) while there are fewer than four blocks per thread.
    pub(crate) fn balanced(mut self, min_mc: usize, nth: usize) -> Grid {
        while self.mc > min_mc && self.tasks() < 4 * nth {
            self.mc /= 2;
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A family whose tiles hold each output's own coordinates, for the order of the stores.
    struct Coords {
        rows: Range<usize>,
        ncols: usize,
    }

    impl Family for Coords {
        const MR: usize = 6;
        const NR: usize = 16;
        fn rows(&self) -> Range<usize> {
            self.rows.clone()
        }
        fn ncols(&self) -> usize {
            self.ncols
        }
        fn steps(&self) -> usize {
            1
        }
        fn pack_step(&mut self, _: usize) -> Result<()> {
            Ok(())
        }
        fn multiply_step(&mut self, _: usize, tiles: &mut [f32]) {
            let n_strips = self.rows.len().div_ceil(Self::MR);
            for (i, v) in tiles.iter_mut().enumerate() {
                let (tile, e) = (i / (Self::MR * Self::NR), i % (Self::MR * Self::NR));
                let (p, st) = (tile / n_strips, tile % n_strips);
                let (r, c) = (st * Self::MR + e / Self::NR, p * Self::NR + e % Self::NR);
                *v = (r * 1000 + c) as f32;
            }
        }
    }

    /// Column-major stores hand out every result once, at its own row and column, in runs of
    /// at most `COL_ROWS` rows: blocks of one run per column, of several (more rows than
    /// one run holds), and partial strips and panels.
    #[test]
    fn column_runs_cover_every_result_once() {
        for (m, n) in [(300, 20), (257, 16), (6, 1), (5, 33)] {
            let mut fam = Coords { rows: 10..10 + m, ncols: n };
            let mut tiles = vec![0f32; m.div_ceil(6) * n.div_ceil(16) * 96];
            let mut seen = vec![0u8; m * n];
            block(&mut fam, &mut tiles, Store::ColumnMajor, |i, j, run| {
                assert!(run.len() <= COL_ROWS, "run of {}", run.len());
                for (r, &v) in run.iter().enumerate() {
                    let row = i - 10 + r;
                    assert_eq!(v, (row * 1000 + j) as f32, "{m} x {n}: ({row}, {j})");
                    seen[j * m + row] += 1;
                }
            })
            .unwrap();
            assert!(seen.iter().all(|&s| s == 1), "{m} x {n}: every result once");
        }
    }

    #[test]
    fn grid_covers_every_element_once() {
        for (m, n, batches, mc, nc) in
            [(1, 1, 1, 96, 512), (97, 513, 2, 96, 512), (8, 40, 3, 4, 16)]
        {
            for (k, align) in [(0, 0), (2, 16), (5, 4)] {
                let g = Grid::new(m, n, batches, mc, nc).split_tail(k, align);
                let mut seen = vec![0u8; m * n * batches];
                for t in 0..g.tasks() {
                    let task = g.task(t);
                    for i in task.rows.clone() {
                        for j in task.cols.clone() {
                            seen[(task.batch * n + j) * m + i] += 1;
                        }
                    }
                }
                assert!(seen.iter().all(|&s| s == 1), "{g:?}");
            }
        }
    }

    #[test]
    fn write_run_writes_contiguous_and_strided_runs() {
        for (stride, len) in [(4usize, 8usize), (4, 6), (4, 3), (12, 8), (8, 5)] {
            let mut buf = [-1.0f32; 3 * 8 + 1];
            let run: Vec<f32> = (0..len).map(|i| i as f32 + 0.5).collect();
            // One float in, so the run starts unaligned for the 8-float move.
            let p = buf[1..].as_mut_ptr() as *mut u8;
            // SAFETY: the run's elements lie at p + i * stride, i < len, inside buf[1..] (at most
            // 7 * 12 bytes = 21 floats in, of 24); nothing else touches buf meanwhile.
            unsafe { write_run(p, stride, &run) };
            let step = stride / 4;
            for (i, v) in buf[1..].iter().enumerate() {
                let want = if i % step == 0 && i / step < len {
                    i as f32 / step as f32 + 0.5
                } else {
                    -1.0
                };
                assert_eq!(*v, want, "stride {stride}, len {len}, element {i}");
            }
            assert_eq!(buf[0], -1.0);
        }
    }

    #[test]
    fn an_empty_grid_stays_empty_when_its_tail_is_split() {
        for (m, n, batches) in [(0, 512, 1), (64, 0, 1), (64, 512, 0)] {
            let g = Grid::new(m, n, batches, 32, 512).split_tail(2, 16);
            assert_eq!(g.tasks(), 0, "{g:?}");
        }
    }

    #[test]
    fn balanced_grid_keeps_blocks_on_multiples() {
        let g = Grid::new(200, 8, 1, 64, 512).balanced(8, 2);
        assert_eq!(g.mc, 16);
        assert!(g.tasks() >= 8);
        let g = Grid::new(8, 8, 1, 64, 512).balanced(8, 4);
        assert_eq!(g.mc, 8);
    }
}
