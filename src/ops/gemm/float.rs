//! The float family of the GEMM engine: f32 strips of [`SG_MR`] rows and f32 panels of
//! [`SG_NR`] columns, multiplied by the tier's `KernelTable::sgemm` micro-kernels (and their
//! two-strip / two-by-two forms, and the BF16-pair forms for BF16 weights).
//!
//! Rows of any type with a dequantizer are packed as f32 (F32 and F16 rows straight from their
//! bytes, the others through the row converter). Every output is the sum over K blocks of
//! [`KC`], in K order, of the kernel's partial sums.

use super::Family;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::KernelTable;
use crate::kernels::prefetch::prefetch_l2;
use crate::kernels::sgemm::{
    SG_MR, SG_NR, Sgemm2Fn, Sgemm22Fn, SgemmFn, TB_K, TB_MR, TB_PANEL_STEP, TB_STRIP_STEP,
    TileBf16Fn,
};
use crate::quant::DequantizeFn;
use std::ops::Range;

/// K values per block (a 16-column panel slice of 16 KiB stays in L1 while the task's strips,
/// 96 KiB, come from L2); a multiple of every block size.
pub(crate) const KC: usize = 256;
/// Rows per block (16 strips of 6).
pub(crate) const MC: usize = 96;
/// Columns per block (32 panels).
pub(crate) const NC: usize = 512;
/// Tile accumulators per block.
const C_TILES: usize = (MC / SG_MR) * (NC / SG_NR);
/// Per-thread scratch of a [`block`] in f32: strips, six converted rows, tile accumulators.
pub(crate) const BLOCK_SCRATCH: usize = (MC + SG_MR) * KC + C_TILES * SG_MR * SG_NR;
/// f32 values of one tile.
pub(crate) const TILE: usize = SG_MR * SG_NR;

/// Panels (of the last ones of a K block) over which the next block's rows are prefetched.
const PREFETCH_PANELS: usize = 8;

/// The rows of a strip past the block's last row.
static ZERO_ROW: [u8; KC * 4] = [0; KC * 4];

/// f32 values of one packed panel of `k` elements.
pub(crate) fn panel_floats(k: usize) -> usize {
    k * SG_NR
}

/// The BF16-pair kernels, for BF16 weights with an even `k` on a tier that has them.
pub(crate) fn bf16_pairs(
    kt: &KernelTable,
    a: DType,
    k: usize,
) -> Option<(SgemmFn, Sgemm2Fn, Sgemm22Fn)> {
    if a == DType::BF16 && k.is_multiple_of(2) { kt.sgemm_bf16 } else { None }
}

/// The BF16 tile kernels, for BF16 weights with `k` a multiple of their step on a tier that
/// has them (they take precedence over the BF16-pair kernels).
pub(crate) fn bf16_tiles(kt: &KernelTable, a: DType, k: usize) -> Option<(TileBf16Fn, fn())> {
    if a == DType::BF16 && k.is_multiple_of(TB_K) { kt.tile_bf16 } else { None }
}

/// Whether the panels for weights of type `a` hold BF16 pairs (for the BF16-pair or the BF16
/// tile kernels) rather than f32.
pub(crate) fn pair_panels(kt: &KernelTable, a: DType, k: usize) -> bool {
    bf16_pairs(kt, a, k).is_some() || bf16_tiles(kt, a, k).is_some()
}

/// K values a panel packer converts and writes at a time ([`panel_chunk`]): 16 columns of it
/// are 16 KiB, in L1. A multiple of every vec-dot block size (a chunk converts as the whole row
/// does, block by block) and even (BF16 pairs).
pub(crate) const PANEL_CHUNK: usize = 256;

/// Packs a panel of `k` K values of 16 columns, [`PANEL_CHUNK`] at a time: `fill(c, k0, chunk)`
/// writes column c's values `k0..k0 + chunk.len()` (f32, BF16 values exactly with `pairs`) into
/// `chunk`, a slice of `cols` (at least `16 * PANEL_CHUNK` f32 of scratch), and each chunk of
/// the 16 columns is then written to the panel ([`panel_chunk`]). Every float packer (mul_mat's,
/// mul_mat_id's) goes through here; they differ only in where a column's values come from.
pub(crate) fn pack_panel(
    panel: &mut [f32],
    k: usize,
    cols: &mut [f32],
    pairs: bool,
    mut fill: impl FnMut(usize, usize, &mut [f32]),
) {
    let mut k0 = 0;
    while k0 < k {
        let nk = PANEL_CHUNK.min(k - k0);
        for c in 0..SG_NR {
            fill(c, k0, &mut cols[c * PANEL_CHUNK..][..nk]);
        }
        panel_chunk(panel, k0, nk, cols, pairs);
        k0 += nk;
    }
}

/// Writes K values `k0..k0 + nk` of a panel's 16 columns from `cols` (column c's values at
/// `c * PANEL_CHUNK..`), in the panel's order: group kk holds the 16 columns' value kk, or
/// (`pairs`: BF16 pairs, the columns holding BF16 values exactly) slot j holds value 2j in its
/// low half and 2j + 1 in its high half (`k0` and `nk` even). A column at a time would write one
/// 64-byte line per value, walking a long K's panel (about 1 MiB at K = 14336) once per column.
fn panel_chunk(panel: &mut [f32], k0: usize, nk: usize, cols: &[f32], pairs: bool) {
    if pairs {
        let out = &mut panel[k0 / 2 * SG_NR..][..nk / 2 * SG_NR];
        for (j, group) in out.chunks_exact_mut(SG_NR).enumerate() {
            for (c, slot) in group.iter_mut().enumerate() {
                let two = &cols[c * PANEL_CHUNK + 2 * j..][..2];
                let bits = (two[0].to_bits() >> 16) | (two[1].to_bits() & 0xFFFF_0000);
                *slot = f32::from_bits(bits);
            }
        }
    } else {
        let out = &mut panel[k0 * SG_NR..][..nk * SG_NR];
        for (kk, group) in out.chunks_exact_mut(SG_NR).enumerate() {
            for (c, slot) in group.iter_mut().enumerate() {
                *slot = cols[c * PANEL_CHUNK + kk];
            }
        }
    }
}

/// The micro-kernels a sweep uses: one tile, two strips by one panel, two by two (absent where
/// the tier has none). The wider forms give the same bits as the one-tile kernel.
#[derive(Clone, Copy)]
pub(crate) struct Kernels {
    one: SgemmFn,
    two: Option<Sgemm2Fn>,
    two_by_two: Option<Sgemm22Fn>,
    /// K values per strip group: 2 for BF16 pairs, else 1.
    div: usize,
}

impl Kernels {
    /// The f32 kernels of a tier.
    pub(crate) fn f32(kt: &KernelTable) -> Kernels {
        Kernels { one: kt.sgemm, two: kt.sgemm2, two_by_two: kt.sgemm22, div: 1 }
    }

    /// The kernels for weights of `dtype` with rows of `k` elements: BF16 pairs where they
    /// apply, else f32.
    pub(crate) fn for_weights(kt: &KernelTable, dtype: DType, k: usize) -> Kernels {
        match bf16_pairs(kt, dtype, k) {
            Some((one, two, four)) => {
                Kernels { one, two: Some(two), two_by_two: Some(four), div: 2 }
            }
            None => Kernels::f32(kt),
        }
    }
}

/// Strips of one sweep: strip `st` at `data[st * stride..]`, `n` of them.
pub(crate) struct Strips<'a> {
    pub data: &'a [f32],
    pub stride: usize,
    pub n: usize,
}

/// Multiplies `kc` K groups of every strip with every panel (`panel(q)`: panel q's `kc` groups,
/// `n_panels` of them) into the tiles (tile `(q, st)` at `(q * strips.n + st) * TILE`), adding to
/// them with `acc`. `before_panel(q)` runs before panel q is used and `before_strip(q, st)`
/// before strip st meets it (prefetch hooks; the products do not depend on them). Panels go in
/// pairs where the tier has a two-by-two kernel, strips in pairs where it has a two-strip one:
/// the same bits as one tile at a time.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sweep<'p>(
    kern: Kernels,
    kc: usize,
    strips: &Strips<'_>,
    panel: impl Fn(usize) -> &'p [f32],
    n_panels: usize,
    tiles: &mut [f32],
    acc: bool,
    mut before_panel: impl FnMut(usize),
    mut before_strip: impl FnMut(usize, usize),
) {
    let n_strips = strips.n;
    let strip = |st: usize| &strips.data[st * strips.stride..][..kc * SG_MR];
    let mut p = 0;
    while p < n_panels {
        let group = if kern.two_by_two.is_some() && p + 1 < n_panels { 2 } else { 1 };
        for q in p..p + group {
            before_panel(q);
        }
        let mut st = 0;
        if let (2, Some(k22)) = (group, kern.two_by_two) {
            let (left, right) = tiles.split_at_mut((p + 1) * n_strips * TILE);
            let tp = &mut left[p * n_strips * TILE..][..n_strips * TILE];
            let tq = &mut right[..n_strips * TILE];
            let (b0, b1) = (panel(p), panel(p + 1));
            for (pp, pq) in tp.chunks_exact_mut(2 * TILE).zip(tq.chunks_exact_mut(2 * TILE)) {
                before_strip(p, st);
                before_strip(p, st + 1);
                let (t00, t10) = pp.split_at_mut(TILE);
                let (t01, t11) = pq.split_at_mut(TILE);
                let out = [tile_of(t00), tile_of(t01), tile_of(t10), tile_of(t11)];
                k22(kc, [strip(st), strip(st + 1)], [b0, b1], out, acc);
                st += 2;
            }
            if st < n_strips {
                before_strip(p, st);
                for (q, t) in [(p, tp), (p + 1, tq)] {
                    (kern.one)(kc, strip(st), panel(q), tile_of(&mut t[st * TILE..][..TILE]), acc);
                }
            }
            p += 2;
            continue;
        }
        let b = panel(p);
        let tp = &mut tiles[p * n_strips * TILE..][..n_strips * TILE];
        if let Some(k2) = kern.two {
            for pair in tp.chunks_exact_mut(2 * TILE) {
                before_strip(p, st);
                before_strip(p, st + 1);
                let (t0, t1) = pair.split_at_mut(TILE);
                k2(kc, strip(st), strip(st + 1), b, tile_of(t0), tile_of(t1), acc);
                st += 2;
            }
        }
        while st < n_strips {
            before_strip(p, st);
            (kern.one)(kc, strip(st), b, tile_of(&mut tp[st * TILE..][..TILE]), acc);
            st += 1;
        }
        p += 1;
    }
}

fn tile_of(t: &mut [f32]) -> &mut [f32; TILE] {
    t.try_into().expect("tile")
}

/// Packs `kc` f32 values of up to [`SG_MR`] rows into a strip: `row(r)` is row r's bytes (at
/// least `kc` little-endian f32, any alignment), rows from `nrows` on are zero.
pub(crate) fn pack_f32_strip<'r>(
    kt: &KernelTable,
    kc: usize,
    nrows: usize,
    row: impl Fn(usize) -> &'r [u8],
    out: &mut [f32],
) {
    let mut k0 = 0;
    while k0 < kc {
        // KC values at a time: the zero row's length.
        let n = KC.min(kc - k0);
        let rows: [&[u8]; SG_MR] = std::array::from_fn(|r| {
            if r < nrows { &row(r)[k0 * 4..(k0 + n) * 4] } else { &ZERO_ROW[..n * 4] }
        });
        (kt.sgemm_pack)(n, rows, &mut out[k0 * SG_MR..(k0 + n) * SG_MR]);
        k0 += n;
    }
}

/// A block of the float family: rows `rows` of weights of `dtype` (`a_row(i)` is row i's first
/// byte, `k` elements in whole blocks) against `ncols` columns packed in `panels` (panel p at
/// `p * panel_floats(k)`).
pub(crate) struct FloatBlock<'a, R: Fn(usize) -> *const u8> {
    kt: &'a KernelTable,
    dtype: DType,
    k: usize,
    rows: Range<usize>,
    a_row: R,
    panels: &'a [f32],
    ncols: usize,
    kern: Kernels,
    deq: DequantizeFn,
    strips: &'a mut [f32],
    row_bufs: &'a mut [f32],
}

impl<'a, R: Fn(usize) -> *const u8> FloatBlock<'a, R> {
    /// Splits `scratch` (at least [`BLOCK_SCRATCH`] f32) into the block's strips and row
    /// buffers; returns the block and the tile area.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        kt: &'a KernelTable,
        dtype: DType,
        k: usize,
        rows: Range<usize>,
        a_row: R,
        panels: &'a [f32],
        ncols: usize,
        scratch: &'a mut [f32],
    ) -> Result<(FloatBlock<'a, R>, &'a mut [f32])> {
        check_block(k, &rows, panels, ncols, scratch)?;
        let deq =
            super::super::get_rows::row_converter(kt, dtype).ok_or_else(|| Error::Unsupported {
                op: "mul_mat",
                backend: "CPU".into(),
                msg: format!("no {dtype} -> f32"),
            })?;
        let (strips, rest) = scratch[..BLOCK_SCRATCH].split_at_mut(MC * KC);
        let (row_bufs, tiles) = rest.split_at_mut(SG_MR * KC);
        let kern = Kernels::for_weights(kt, dtype, k);
        let blk =
            FloatBlock { kt, dtype, k, rows, a_row, panels, ncols, kern, deq, strips, row_bufs };
        Ok((blk, tiles))
    }
}

impl<R: Fn(usize) -> *const u8> Family for FloatBlock<'_, R> {
    const MR: usize = SG_MR;
    const NR: usize = SG_NR;

    fn rows(&self) -> Range<usize> {
        self.rows.clone()
    }

    fn ncols(&self) -> usize {
        self.ncols
    }

    fn steps(&self) -> usize {
        self.k.div_ceil(KC)
    }

    /// Strip t holds rows i0 + 6t.., group kk of it element k0 + kk of its 6 rows (missing rows
    /// zero). F32 and F16 rows are read in place (F16 widened by the packer), BF16 pairs move
    /// as 4-byte units; the other types are first converted to f32 in the row buffers.
    fn pack_step(&mut self, s: usize) -> Result<()> {
        let (k0, kc) = (s * KC, KC.min(self.k - s * KC));
        let (blck, ts) = (self.dtype.block_size(), self.dtype.type_size());
        let in_place = matches!(self.dtype, DType::F32 | DType::F16) || self.kern.div == 2;
        let (i0, i1) = (self.rows.start, self.rows.end);
        for st in 0..(i1 - i0).div_ceil(SG_MR) {
            let mut rows: [&[u8]; SG_MR] = [&ZERO_ROW[..]; SG_MR];
            let mut bufs = self.row_bufs.chunks_exact_mut(KC);
            for (r, row) in rows.iter_mut().enumerate() {
                let i = i0 + st * SG_MR + r;
                let buf = bufs.next().expect("SG_MR row buffers");
                if i >= i1 {
                    continue;
                }
                // SAFETY: `a_row(i)` starts a row of k elements in whole blocks (FloatBlock's
                // contract); k0 and kc are multiples of the block size (KC is), so bytes
                // [k0 / blck * ts, (k0 + kc) / blck * ts) lie inside it.
                let bytes = unsafe {
                    std::slice::from_raw_parts((self.a_row)(i).add(k0 / blck * ts), kc / blck * ts)
                };
                if in_place {
                    *row = bytes;
                } else {
                    (self.deq)(bytes, &mut buf[..kc]);
                    *row = bytemuck::cast_slice(&buf[..kc]);
                }
            }
            let strip = &mut self.strips[st * SG_MR * KC..][..kc * SG_MR];
            if self.kern.div == 2 {
                (self.kt.sgemm_pack)(kc / 2, rows, strip);
            } else if self.dtype == DType::F16 {
                (self.kt.sgemm_pack_f16)(kc, rows, strip);
            } else {
                (self.kt.sgemm_pack)(kc, rows, strip);
            }
        }
        Ok(())
    }

    /// Each 16-column panel slice stays in L1 while every strip passes over it. The next K
    /// block's weight rows are fetched while the last panels run (a block's rows are separate
    /// streams, too many for the hardware prefetcher), and the next panel's slice while this
    /// one runs (panels stream from L3 or memory).
    fn multiply_step(&mut self, s: usize, tiles: &mut [f32]) {
        let (k, div) = (self.k, self.kern.div);
        let (k0, kc) = (s * KC, KC.min(k - s * KC));
        let (i0, i1) = (self.rows.start, self.rows.end);
        let n_strips = (i1 - i0).div_ceil(SG_MR);
        let n_panels = self.ncols.div_ceil(SG_NR);
        let (blck, ts) = (self.dtype.block_size(), self.dtype.type_size());
        let next = k0 + kc;
        let window = n_panels.min(PREFETCH_PANELS);
        let (seg, seg_len) = (next / blck * ts, KC.min(k.saturating_sub(next)) / blck * ts);
        let (k0d, kcd) = (k0 / div, kc / div);
        let panels = self.panels;
        let a_row = &self.a_row;
        let panel_at = |q: usize| {
            let base = q * panel_floats(k) + k0d * SG_NR;
            &panels[base..base + kcd * SG_NR]
        };
        let before_panel = |q: usize| {
            if next < k && q + window >= n_panels {
                let w = q + window - n_panels;
                let (r0, r1) = ((i1 - i0) * w / window, (i1 - i0) * (w + 1) / window);
                for i in i0 + r0..i0 + r1 {
                    let row = a_row(i).wrapping_add(seg);
                    for off in (0..seg_len).step_by(64) {
                        prefetch_l2(row.wrapping_add(off));
                    }
                }
            }
        };
        let group = |p: usize| {
            if self.kern.two_by_two.is_some() && p + 1 < n_panels { 2 } else { 1 }
        };
        let before_strip = |p: usize, st: usize| {
            // The slice after this sweep's group of panels (or the first panel's slice of the
            // next K block), a line range per strip.
            let (np, nk0) = if p + group(p) < n_panels { (p + group(p), k0) } else { (0, next) };
            if nk0 >= k {
                return;
            }
            let nb = np * panel_floats(k) + nk0 / div * SG_NR;
            let slice = &panels[nb..nb + KC.min(k - nk0) / div * SG_NR];
            let lines = (slice.len() * 4).div_ceil(64);
            for l in (lines * st / n_strips)..(lines * (st + 1) / n_strips) {
                prefetch_l2(slice.as_ptr().wrapping_add(l * 16) as *const u8);
            }
        };
        let strips = Strips { data: self.strips, stride: SG_MR * KC, n: n_strips };
        sweep(
            self.kern,
            kcd,
            &strips,
            panel_at,
            n_panels,
            tiles,
            k0 > 0,
            before_panel,
            before_strip,
        );
    }
}

/// A block of BF16 weights on the BF16 tile kernels: strips of [`TB_MR`] rows, each K step's
/// strip the rows' BF16 values as they lie, [`TB_K`] of each row per strip step (the tile
/// unit's A layout), against panels of BF16 pairs (its B layout); 16 x 16 tiles.
struct TileBf16Block<'a, R: Fn(usize) -> *const u8> {
    kern: TileBf16Fn,
    k: usize,
    rows: Range<usize>,
    a_row: R,
    panels: &'a [f32],
    ncols: usize,
    strips: &'a mut [u16],
}

impl<R: Fn(usize) -> *const u8> Family for TileBf16Block<'_, R> {
    const MR: usize = TB_MR;
    const NR: usize = SG_NR;

    fn rows(&self) -> Range<usize> {
        self.rows.clone()
    }

    fn ncols(&self) -> usize {
        self.ncols
    }

    fn steps(&self) -> usize {
        self.k.div_ceil(KC)
    }

    /// Strip t, step j holds rows i0 + 16 t.. at K values k0 + 32 j.. (missing rows zero).
    fn pack_step(&mut self, s: usize) -> Result<()> {
        let (k0, kc) = (s * KC, KC.min(self.k - s * KC));
        let (i0, i1) = (self.rows.start, self.rows.end);
        // The strips as bytes: the tile unit reads the BF16 values as they lie in memory.
        let bytes = bytemuck::cast_slice_mut::<u16, u8>(self.strips);
        for (st, strip) in
            bytes.chunks_exact_mut(2 * TB_MR * KC).take((i1 - i0).div_ceil(TB_MR)).enumerate()
        {
            for r in 0..TB_MR {
                let i = i0 + st * TB_MR + r;
                let dst = |j: usize| 2 * (j * TB_STRIP_STEP + r * TB_K);
                if i >= i1 {
                    for j in 0..kc / TB_K {
                        strip[dst(j)..dst(j) + 2 * TB_K].fill(0);
                    }
                    continue;
                }
                // SAFETY: `a_row(i)` starts a row of k BF16 values (the block's contract) and
                // k0 + kc <= k, so bytes [2 k0, 2 (k0 + kc)) lie inside it.
                let row =
                    unsafe { std::slice::from_raw_parts((self.a_row)(i).add(2 * k0), 2 * kc) };
                for (j, src) in row.chunks_exact(2 * TB_K).enumerate() {
                    strip[dst(j)..dst(j) + 2 * TB_K].copy_from_slice(src);
                }
            }
        }
        Ok(())
    }

    /// Two strips by two panels per call, each panel slice (8 KiB) in L1 while the strips pass.
    fn multiply_step(&mut self, s: usize, tiles: &mut [f32]) {
        let (k0, kc) = (s * KC, KC.min(self.k - s * KC));
        let n_strips = (self.rows.len()).div_ceil(TB_MR);
        let n_panels = self.ncols.div_ceil(SG_NR);
        let steps = kc / TB_K;
        let t = TB_MR * SG_NR;
        let strips = &*self.strips;
        let strip = |st: usize| &strips[st * TB_MR * KC..][..steps * TB_STRIP_STEP];
        let panel = |q: usize| {
            let base = q * panel_floats(self.k) + k0 / 2 * SG_NR;
            &self.panels[base..base + steps * TB_PANEL_STEP]
        };
        // Fillers for the tile slots of a call with fewer than two strips or panels.
        let mut spare = [[0f32; 256]; 3];
        for p in (0..n_panels).step_by(2) {
            let np = 2.min(n_panels - p);
            let b = [panel(p), panel(p + np - 1)];
            let (left, right) = tiles[p * n_strips * t..].split_at_mut(n_strips * t);
            for st in (0..n_strips).step_by(2) {
                let ns = 2.min(n_strips - st);
                let a = [strip(st), strip(st + ns - 1)];
                // Tiles (st, p), (st, p + 1), (st + 1, p), (st + 1, p + 1) of the kernel's
                // order, those of this call first.
                let (l0, l1) = left[st * t..(st + ns) * t].split_at_mut(t);
                let (r0, r1) = if np == 2 {
                    let (r0, r1) = right[st * t..(st + ns) * t].split_at_mut(t);
                    (Some(r0), (ns == 2).then_some(r1))
                } else {
                    (None, None)
                };
                let mut fill = spare.iter_mut();
                let mut tile = |x| tile_or_spare(x, &mut fill);
                let mut out: [&mut [f32; 256]; 4] = match (ns, np) {
                    (2, 2) => [tile(Some(l0)), tile(r0), tile(Some(l1)), tile(r1)],
                    (1, 2) => [tile(Some(l0)), tile(r0), tile(None), tile(None)],
                    (2, _) => [tile(Some(l0)), tile(Some(l1)), tile(None), tile(None)],
                    _ => [tile(Some(l0)), tile(None), tile(None), tile(None)],
                };
                (self.kern)(steps, &a[..ns], &b[..np], &mut out[..ns * np], k0 > 0);
            }
        }
    }
}

/// Checks that a block of `rows` by `ncols` fits the row and column block sizes, that
/// `scratch` holds [`BLOCK_SCRATCH`] and that `panels` holds the block's panels of `k` values.
fn check_block(
    k: usize,
    rows: &Range<usize>,
    panels: &[f32],
    ncols: usize,
    scratch: &[f32],
) -> Result<()> {
    if rows.len() > MC
        || ncols > NC
        || scratch.len() < BLOCK_SCRATCH
        || panels.len() < ncols.div_ceil(SG_NR) * panel_floats(k)
    {
        return Err(Error::Buffer("float GEMM block larger than its buffers".into()));
    }
    Ok(())
}

/// `x` as a 16 x 16 tile, or (absent) the next spare one.
fn tile_or_spare<'x>(
    x: Option<&'x mut [f32]>,
    spare: &mut impl Iterator<Item = &'x mut [f32; 256]>,
) -> &'x mut [f32; 256] {
    match x {
        Some(x) => x.try_into().expect("16 x 16 tile"),
        None => spare.next().expect("three spare tiles"),
    }
}

/// One block of the float GEMM: weight rows `rows` (at most [`MC`]; `a_row(i)` is row i's first
/// byte, `k` elements of `dtype` in whole blocks) times the `ncols` columns packed in `panels`
/// (at most [`NC`]; panel p at `p * panel_floats(k)`), the results handed to `store(i, column,
/// run)` once per column and run of rows (up to 256, [`super::Store::ColumnMajor`]): `run[r]` is
/// output `(i + r, column)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn block<R: Fn(usize) -> *const u8>(
    kt: &KernelTable,
    dtype: DType,
    k: usize,
    rows: Range<usize>,
    a_row: R,
    panels: &[f32],
    ncols: usize,
    scratch: &mut [f32],
    store: impl FnMut(usize, usize, &[f32]),
) -> Result<()> {
    if let Some((kern, release)) = bf16_tiles(kt, dtype, k) {
        check_block(k, &rows, panels, ncols, scratch)?;
        // The strips (MC rows of KC BF16 values) in the f32 strip area, the tiles after it.
        let (strips, tiles) = scratch[..BLOCK_SCRATCH].split_at_mut(MC * KC);
        let strips = &mut bytemuck::cast_slice_mut::<f32, u16>(strips)[..MC * KC];
        let mut fam = TileBf16Block { kern, k, rows, a_row, panels, ncols, strips };
        let _state = super::KernelState::claim(Some(release));
        return super::block(&mut fam, tiles, super::Store::ColumnMajor, store);
    }
    let (mut fam, tiles) = FloatBlock::new(kt, dtype, k, rows, a_row, panels, ncols, scratch)?;
    super::block(&mut fam, tiles, super::Store::ColumnMajor, store)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The panel layouts written one value at a time: element kk of column c at `kk * 16 + c`,
    /// or with `pairs` elements 2j and 2j + 1 of column c in the low and high halves of slot
    /// `j * 16 + c`.
    fn reference(panel: &mut [f32], c: usize, col: &[f32], pairs: bool) {
        if pairs {
            for (j, two) in col.chunks_exact(2).enumerate() {
                let lo = two[0].to_bits() >> 16;
                panel[j * SG_NR + c] = f32::from_bits(lo | (two[1].to_bits() & 0xFFFF_0000));
            }
        } else {
            for (kk, &v) in col.iter().enumerate() {
                panel[kk * SG_NR + c] = v;
            }
        }
    }

    /// A panel packed in chunks holds each value where the layout puts it, in both layouts (f32,
    /// and BF16 pairs, which only CPUs with AVX512_BF16 or AMX-BF16 run in the GEMM), for a K
    /// longer than a chunk and not a multiple of it.
    #[test]
    fn chunks_fill_the_panel_layout() {
        let k = 2 * PANEL_CHUNK + 70;
        let cols_all: Vec<Vec<f32>> = (0..SG_NR)
            .map(|c| {
                // BF16 values exactly (the pair layout keeps the upper halves).
                crate::testdata::rand_f32(k, 40 + c as u64)
                    .into_iter()
                    .map(|v| f32::from_bits(v.to_bits() & 0xFFFF_0000))
                    .collect()
            })
            .collect();
        for pairs in [false, true] {
            let mut want = vec![0f32; panel_floats(k)];
            for (c, v) in cols_all.iter().enumerate() {
                reference(&mut want, c, v, pairs);
            }
            let mut got = vec![f32::NAN; panel_floats(k)];
            let mut cols = vec![0f32; SG_NR * PANEL_CHUNK];
            pack_panel(&mut got, k, &mut cols, pairs, |c, k0, chunk| {
                chunk.copy_from_slice(&cols_all[c][k0..k0 + chunk.len()]);
            });
            let used = if pairs { k / 2 * SG_NR } else { k * SG_NR };
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got[..used]), bits(&want[..used]), "pairs {pairs}");
        }
    }
}
