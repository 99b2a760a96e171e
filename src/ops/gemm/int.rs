//! The integer family of the GEMM engine: weight rows unpacked per 256-element step into bands
//! of [`IG_MR`] rows (`WBand`: unsigned codes, sub-block scales and mins), activations packed
//! into int8 panels of [`IG_NR`] columns per step (`ABlock`: levels, block sums, scales), and
//! the tier's `KernelTable::igemm` micro-kernels summing int8 products exactly in int32 per
//! sub-block and applying the scales in f32 (`kernels::igemm`). Each output is the sum over
//! steps in K order.

use super::Family;
use crate::dtype::{DType, QK_K};
use crate::error::{Error, Result};
use crate::kernels::igemm::{
    ABlock, IG_MR, IG_NR, IgemmFn, IgemmKernels, IgemmPairFn, IgemmTripleFn, Kind, RowFn,
    UnpackStepFn, WBand, pack_q8_blocks_column, pack_q8k_column,
};
use crate::kernels::prefetch::{prefetch_l1, prefetch_l2_range};
use crate::quant::unpack::{IntFormat, Unpack, UnpackFn};
use std::ops::Range;

/// Weight rows per block (at most; fewer when that gives each thread several blocks). A block
/// reads its columns' panels once per step, from L3 for a long K, while its 32 unpacked bands
/// (about 100 KiB) stay in L2: 256 rows read the panels a quarter as often as 64 did, 10-25%
/// faster at 4096 x 512 x 14336 on Zen 4.
pub(crate) const MC: usize = 256;
/// Columns per block (32 panels): the block's f32 tile is `MC * NC * 4` = 512 KiB, in L2.
pub(crate) const NC: usize = 512;

/// Rows ahead whose step [`IntBlock::pack_step`] asks for while unpacking one.
const AHEAD: usize = 4;

/// Bytes of one Q8_K block.
pub(crate) const Q8K_BYTES: usize = 292;

/// 256-element steps of K (the last one padded for block types).
pub(crate) fn k_steps(k: usize) -> usize {
    k.div_ceil(QK_K)
}

/// Regroups one column's row in the activation type (`q8`: Q8_K, Q8_0 or Q8_1, whole blocks)
/// into column `c` of a panel's blocks (one per 256 elements).
pub(crate) fn pack_column(fmt: &IntFormat, q8: &[u8], blocks: &mut [ABlock], c: usize) {
    use crate::quant::legacy::{BlockQ8_0, BlockQ8_1};
    match fmt.act {
        DType::Q8_K => {
            // Q8_K's fields read where they lie (d: 4 bytes, qs: 256, bsums: 32), not copied
            // out as a whole block.
            for (blk, q) in blocks.iter_mut().zip(q8.chunks_exact(Q8K_BYTES)) {
                let d: f32 = bytemuck::pod_read_unaligned(&q[..4]);
                let qs: &[i8; QK_K] =
                    bytemuck::cast_slice::<u8, i8>(&q[4..4 + QK_K]).try_into().expect("256 levels");
                let bsums: [i16; 16] = bytemuck::pod_read_unaligned(&q[4 + QK_K..]);
                // The signed forms sum `(code - 128) * level` without the level sums: they must be
                // the levels' own for the other tiers to agree.
                let from_levels = fmt.narrow_sums || fmt.fold || fmt.sign.is_some();
                pack_q8k_column(blk, c, qs, &bsums, d, fmt.sub, fmt.bias, from_levels);
            }
        }
        DType::Q8_1 => {
            let bs = size_of::<BlockQ8_1>();
            for (blk, q) in blocks.iter_mut().zip(q8.chunks(8 * bs)) {
                pack_q8_blocks_column(blk, c, q, bs, true, fmt.sub, fmt.bias);
            }
        }
        _ => {
            // The block types' other activation type (`int_format` gives only these three).
            debug_assert_eq!(fmt.act, DType::Q8_0);
            let bs = size_of::<BlockQ8_0>();
            for (blk, q) in blocks.iter_mut().zip(q8.chunks(8 * bs)) {
                pack_q8_blocks_column(blk, c, q, bs, false, fmt.sub, fmt.bias);
            }
        }
    }
}

/// Zeroes column `c` of a panel's blocks (a padding column: its level sums and scale are 0).
pub(crate) fn zero_column(blocks: &mut [ABlock], c: usize) {
    for blk in blocks {
        for g in 0..QK_K / 4 {
            blk.codes[g * 64 + c * 4..g * 64 + c * 4 + 4].fill(0);
        }
        for i in 0..8 {
            blk.bsum_pairs[i * IG_NR + c] = 0;
        }
        blk.pairs_bad[c] = 0;
        for j in 0..16 {
            blk.bsums[j * IG_NR + c] = 0;
            blk.ds[j * IG_NR + c] = 0.0;
            blk.ms[j * IG_NR + c] = 0.0;
        }
        blk.d[c] = 0.0;
    }
}

/// Bytes of one row's step of repacked weights at most (8 IQ4_NL / Q4_0 / MXFP4 blocks, or one
/// Q4_K / Q6_K / Q2_K / TQ2_0 super-block).
const REPACK_STEP_MAX: usize = 256;

/// Unpacks one row's step (`src`: its `nblk` weight blocks of `bsize` bytes, ggml's layout) into
/// row `rr` of `band` with the tier's unpacker where it has one (`fast` for a block type,
/// `fast_super` for a super-block type; the same codes and scales), else the portable one; a
/// partial step's rest is zero padding.
fn unpack_step(
    fmt: &IntFormat,
    (fast, fast_super): (Option<UnpackStepFn>, Option<UnpackFn>),
    src: &[u8],
    bsize: usize,
    nblk: usize,
    band: &mut WBand,
    rr: usize,
) {
    let codes: &mut [u8; QK_K] =
        (&mut band.codes[rr * QK_K..(rr + 1) * QK_K]).try_into().expect("256 codes");
    match fmt.unpack {
        Unpack::Super(portable) => {
            let unpack = fast_super.unwrap_or(portable);
            let scales: &mut [i32; 16] =
                (&mut band.scales[rr * 16..rr * 16 + 16]).try_into().expect("16 scales");
            let mins: &mut [i32; 16] =
                (&mut band.mins[rr * 16..rr * 16 + 16]).try_into().expect("16 mins");
            let (dd, dmin) = unpack(&src[..bsize], codes, scales, mins);
            if fmt.shift != 0 {
                // The recentred form (`IntFormat::recentred`): the same code minus bias.
                for c in codes.iter_mut() {
                    *c = c.wrapping_sub(fmt.shift);
                }
            }
            if fmt.widen {
                // Sub-block j of 32 is sub-blocks 2 j and 2 j + 1 of 16 (from the top, in place).
                for j in (0..16).rev() {
                    scales[j] = scales[j / 2];
                    mins[j] = mins[j / 2];
                }
            }
            band.d[rr] = dd;
            band.dmin[rr] = dmin;
            if fmt.mins_bias != 0 {
                // The integer-scaled form of a format with a bias (`IntFormat::int_scaled`).
                for (m, &s) in mins.iter_mut().zip(scales.iter()) {
                    *m = fmt.mins_bias * s;
                }
                band.dmin[rr] = dd;
            }
            band.pair_up(rr);
        }
        Unpack::Blocks { elems, f } => {
            let ns = elems / fmt.sub;
            let scales: &mut [f32; 16] =
                (&mut band.fscales[rr * 16..rr * 16 + 16]).try_into().expect("16 scales");
            let mins: &mut [f32; 16] =
                (&mut band.fmins[rr * 16..rr * 16 + 16]).try_into().expect("16 mins");
            match fast {
                // 32-element blocks, one scale each (the types the tiers have these for).
                Some(unpack) if elems == 32 && ns == 1 => unpack(src, nblk, codes, scales, mins),
                _ => {
                    for (b, blk) in src.chunks_exact(bsize).take(nblk).enumerate() {
                        f(
                            blk,
                            &mut codes[b * elems..(b + 1) * elems],
                            &mut scales[b * ns..(b + 1) * ns],
                            &mut mins[b * ns..(b + 1) * ns],
                        );
                    }
                }
            }
            codes[nblk * elems..].fill(0);
            scales[nblk * ns..].fill(0.0);
            mins[nblk * ns..].fill(0.0);
        }
    }
}

/// Asks for `blk`'s bytes `at..at + len` (clamped to the block) in L2.
#[inline]
fn prefetch_slice_l2(blk: &ABlock, at: usize, len: usize) {
    let at = at.min(size_of::<ABlock>());
    let len = len.min(size_of::<ABlock>() - at);
    prefetch_l2_range((blk as *const ABlock).cast::<u8>().wrapping_add(at), len);
}

/// Bytes of scratch a [`block`] needs: the bands, then the tiles.
pub(crate) const BLOCK_SCRATCH: usize = (MC / IG_MR) * size_of::<WBand>() + MC * NC * 4;

fn layout(e: bytemuck::PodCastError) -> Error {
    Error::Buffer(format!("integer GEMM scratch layout: {e}"))
}

/// A block of the integer family: weight rows `rows` (`a_row(i)` points at row `i`'s `k`
/// elements in whole blocks of `bsize` bytes) against `ncols` packed columns (`ab`:
/// panel-major, `k_steps(k)` blocks per panel). With `repacked` (the weights' type, stored in
/// CPU_REPACK's 8-row groups), `rows` starts at a multiple of 8 and `a_row(i)` of a group's
/// first row points at the group; each step's group blocks are brought back to ggml's blocks
/// before unpacking, so the results are bitwise those of the plain layout.
pub(crate) struct IntBlock<'a, R: Fn(usize) -> *const u8> {
    fmt: &'a IntFormat,
    /// The tier's step unpacker of the weight type, if it has one.
    fast: Option<UnpackStepFn>,
    /// The tier's super-block unpacker of the weight type, if it has one.
    fast_super: Option<UnpackFn>,
    kernel: IgemmFn,
    pair: Option<IgemmPairFn>,
    triple: Option<IgemmTripleFn>,
    /// The tier's per-thread kernel state (`IgemmKernels::release`), claimed for the block.
    _state: super::KernelState,
    /// The writer of what the kernels read of each unpacked row beside its codes
    /// (`IgemmKernels::row_writer`: signed weights, folded weights or block-diagonal codes).
    writer: Option<RowFn>,
    bsize: usize,
    repacked: Option<DType>,
    k: usize,
    rows: Range<usize>,
    a_row: R,
    ab: &'a [ABlock],
    ncols: usize,
    bands: &'a mut [WBand],
}

impl<'a, R: Fn(usize) -> *const u8> IntBlock<'a, R> {
    /// Splits `scratch` ([`BLOCK_SCRATCH`] bytes, 64-byte aligned) into the bands and the tile
    /// area (returned as f32).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        fmt: &'a IntFormat,
        dtype: DType,
        kernels: &IgemmKernels,
        bsize: usize,
        repacked: Option<DType>,
        k: usize,
        rows: Range<usize>,
        a_row: R,
        ab: &'a [ABlock],
        ncols: usize,
        scratch: &'a mut [u8],
    ) -> Result<(IntBlock<'a, R>, &'a mut [f32])> {
        let np = ncols.div_ceil(IG_NR);
        if ab.len() < np * k_steps(k) || rows.len() > MC || ncols > NC {
            return Err(Error::Buffer("mul_mat: integer GEMM task larger than its buffers".into()));
        }
        if repacked.is_some() && (!rows.start.is_multiple_of(IG_MR) || bsize > REPACK_STEP_MAX) {
            return Err(Error::Buffer(
                "mul_mat: integer GEMM task not on repacked row groups".into(),
            ));
        }
        if scratch.len() < BLOCK_SCRATCH {
            return Err(Error::Buffer("mul_mat: integer GEMM scratch too small".into()));
        }
        let (bands_bytes, tile_bytes) =
            scratch[..BLOCK_SCRATCH].split_at_mut((MC / IG_MR) * size_of::<WBand>());
        let bands: &mut [WBand] = bytemuck::try_cast_slice_mut(bands_bytes).map_err(layout)?;
        let tiles: &mut [f32] = bytemuck::try_cast_slice_mut(tile_bytes).map_err(layout)?;
        let nbands = rows.len().div_ceil(IG_MR);
        let bands = &mut bands[..nbands];
        // Padding rows of the last band stay zero (codes, scales, mins and float scales).
        if !rows.len().is_multiple_of(IG_MR) {
            bands[nbands - 1] = bytemuck::Zeroable::zeroed();
        }
        // A folded form only on kernels that fold (`mul_mat_q::tier_form` makes it so, and
        // `IgemmKernels::for_format` then names their writer): the other tiers' integer pairs
        // rely on the narrow formats' 16-bit bounds.
        if fmt.fold && (kernels.fold_scales.is_none() || kernels.row_writer.is_none()) {
            return Err(Error::Buffer(
                "mul_mat: folded integer form on kernels that do not fold".into(),
            ));
        }
        let kind = Kind::of(fmt).index();
        let (kernel, pair, triple) = (kernels.one[kind], kernels.two[kind], kernels.three[kind]);
        let (fast, fast_super) = ((kernels.unpack)(dtype), (kernels.unpack_super)(dtype));
        // A block starts from no kernel state of this thread's (the AMX tier's tile
        // configuration is loaded anew by its first kernel call) and gives it back on drop.
        let state = super::KernelState::claim(kernels.release);
        let blk = IntBlock {
            fmt,
            fast,
            fast_super,
            kernel,
            pair,
            triple,
            _state: state,
            writer: kernels.row_writer,
            bsize,
            repacked,
            k,
            rows,
            a_row,
            ab,
            ncols,
            bands,
        };
        Ok((blk, tiles))
    }

    /// K values of step `s` that are not padding (a block-type row's last step is partial).
    fn step_len(&self, s: usize) -> usize {
        (self.k - s * QK_K).min(QK_K)
    }
}

impl<R: Fn(usize) -> *const u8> Family for IntBlock<'_, R> {
    const MR: usize = IG_MR;
    const NR: usize = IG_NR;

    fn rows(&self) -> Range<usize> {
        self.rows.clone()
    }

    fn ncols(&self) -> usize {
        self.ncols
    }

    fn steps(&self) -> usize {
        k_steps(self.k)
    }

    fn pack_step(&mut self, kb: usize) -> Result<()> {
        let (fmt, bsize, i1) = (self.fmt, self.bsize, self.rows.end);
        let len = self.step_len(kb);
        // Weight blocks per whole step and in this one.
        let (per, nblk) = match fmt.unpack {
            Unpack::Super(_) => (1, 1),
            Unpack::Blocks { elems, .. } => (QK_K / elems, len / elems),
        };
        let step_bytes = nblk * bsize;
        let nkb = k_steps(self.k);
        // Bytes of the next step (a row's last step may be shorter).
        let next_bytes = match fmt.unpack {
            _ if kb + 1 >= nkb => 0,
            Unpack::Super(_) => bsize,
            Unpack::Blocks { elems, .. } => self.step_len(kb + 1) / elems * bsize,
        };
        // Repacked weights: one band's step in ggml's blocks, row by row (each use rewrites
        // what it reads).
        let mut plain = [0u8; IG_MR * REPACK_STEP_MAX];
        for (bi, band) in self.bands.iter_mut().enumerate() {
            let r0 = self.rows.start + bi * IG_MR;
            if let Some(dt) = self.repacked {
                if step_bytes > REPACK_STEP_MAX {
                    return Err(Error::Buffer(format!("mul_mat: {dt} step too large")));
                }
                let mut group = [0u8; IG_MR * REPACK_STEP_MAX];
                let group = &mut group[..IG_MR * bsize];
                for b in 0..nblk {
                    // SAFETY: r0 is a group's first row (rows.start and the bands are multiples
                    // of 8); the group holds k / block-size blocks of 8 rows, and
                    // kb * per + b < k / block-size.
                    let src = unsafe {
                        std::slice::from_raw_parts(
                            (self.a_row)(r0).add((kb * per + b) * bsize * IG_MR),
                            bsize * IG_MR,
                        )
                    };
                    crate::quant::repack::plain_group_block(dt, src, group)?;
                    for (rr, blk) in group.chunks_exact(bsize).enumerate() {
                        plain[rr * step_bytes + b * bsize..][..bsize].copy_from_slice(blk);
                    }
                }
            }
            for rr in 0..(i1 - r0).min(IG_MR) {
                let src = if self.repacked.is_some() {
                    &plain[rr * step_bytes..(rr + 1) * step_bytes]
                } else {
                    // SAFETY: a_row(i) points at k / block-size whole blocks of bsize bytes;
                    // this step's blocks kb * per .. kb * per + nblk are among them.
                    unsafe {
                        std::slice::from_raw_parts(
                            (self.a_row)(r0 + rr).add(kb * per * bsize),
                            step_bytes,
                        )
                    }
                };
                if self.repacked.is_none() && r0 + rr + AHEAD < i1 {
                    // This step of a row a few ahead: the next-step hint below is often
                    // evicted again before its step comes.
                    let ahead = (self.a_row)(r0 + rr + AHEAD).wrapping_add(kb * per * bsize);
                    prefetch_l1(ahead, step_bytes);
                }
                if self.repacked.is_none() && next_bytes > 0 {
                    // The row's next step, asked for now: a step reads MC rows a little each,
                    // more streams than the hardware prefetcher follows, and the unpacking
                    // otherwise waits on memory (the weights of a short prompt come from DRAM).
                    let next = (self.a_row)(r0 + rr).wrapping_add((kb + 1) * per * bsize);
                    prefetch_l1(next, next_bytes);
                }
                unpack_step(fmt, (self.fast, self.fast_super), src, bsize, nblk, band, rr);
                if let Some(write) = self.writer {
                    write(band, rr, fmt.bias);
                }
            }
        }
        Ok(())
    }

    fn multiply_step(&mut self, kb: usize, tiles: &mut [f32]) {
        let (nkb, len) = (k_steps(self.k), self.step_len(kb));
        let nbands = self.bands.len();
        let tiles: &mut [[[f32; IG_NR]; IG_MR]] = bytemuck::cast_slice_mut(
            &mut tiles[..self.ncols.div_ceil(IG_NR) * nbands * IG_MR * IG_NR],
        );
        if kb == 0 {
            tiles.fill([[0.0; IG_NR]; IG_MR]);
        }
        let np = self.ncols.div_ceil(IG_NR);
        // Each band's slice of the next panels' blocks (from L3 or memory), asked for in L2
        // while this group's bands run.
        let slice = size_of::<ABlock>().div_ceil(64 * nbands) * 64;
        let mut p = 0;
        // Panels in threes, then in pairs, where the tier has those forms (same bits).
        if let Some(three) = self.triple {
            while p + 2 < np {
                let a = [p, p + 1, p + 2].map(|q| &self.ab[q * nkb + kb]);
                let next = [p + 3, p + 4, p + 5].map(|q| self.ab.get(q * nkb + kb));
                let (lo, rest) = tiles.split_at_mut((p + 1) * nbands);
                let (mid, hi) = rest.split_at_mut(nbands);
                for (bi, band) in self.bands.iter().enumerate() {
                    for blk in next.into_iter().flatten() {
                        prefetch_slice_l2(blk, bi * slice, slice);
                    }
                    three(band, a, [&mut lo[p * nbands + bi], &mut mid[bi], &mut hi[bi]], len);
                }
                p += 3;
            }
        }
        if let Some(pair) = self.pair {
            while p + 1 < np {
                let (a0, a1) = (&self.ab[p * nkb + kb], &self.ab[(p + 1) * nkb + kb]);
                let (lo, hi) = tiles.split_at_mut((p + 1) * nbands);
                let next = [(p + 2) * nkb + kb, (p + 3) * nkb + kb].map(|i| self.ab.get(i));
                for (bi, band) in self.bands.iter().enumerate() {
                    for blk in next.into_iter().flatten() {
                        prefetch_slice_l2(blk, bi * slice, slice);
                    }
                    pair(band, [a0, a1], [&mut lo[p * nbands + bi], &mut hi[bi]], len);
                }
                p += 2;
            }
        }
        for p in p..np {
            let a = &self.ab[p * nkb + kb];
            for (bi, band) in self.bands.iter().enumerate() {
                (self.kernel)(band, a, &mut tiles[p * nbands + bi], len);
            }
        }
    }
}

/// One block of the integer GEMM (see [`IntBlock`]; rows at most [`MC`], columns at most
/// [`NC`]), calling `store(i, j, run)` once per column and run of rows (up to 256,
/// `Store::ColumnMajor`): `run[r]` is output `(i + r, j)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn block<R: Fn(usize) -> *const u8>(
    fmt: &IntFormat,
    dtype: DType,
    kernels: &IgemmKernels,
    bsize: usize,
    repacked: Option<DType>,
    k: usize,
    rows: Range<usize>,
    a_row: R,
    ab: &[ABlock],
    ncols: usize,
    scratch: &mut [u8],
    store: impl FnMut(usize, usize, &[f32]),
) -> Result<()> {
    let (mut fam, tiles) =
        IntBlock::new(fmt, dtype, kernels, bsize, repacked, k, rows, a_row, ab, ncols, scratch)?;
    super::block(&mut fam, tiles, super::Store::ColumnMajor, store)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::igemm::SCALAR;
    use crate::quant::unpack::int_format;

    /// Runs `block` over `m` weight rows of `dtype` (`a_q`) and the Q8_K columns `b_q` with
    /// format `fmt` and kernels `kernels`; outputs column-major.
    fn run(
        fmt: &IntFormat,
        dtype: DType,
        kernels: &IgemmKernels,
        k: usize,
        a_q: &[u8],
        b_q: &[u8],
    ) -> Vec<f32> {
        let (ra, rb) = (dtype.row_bytes(k), DType::Q8_K.row_bytes(k));
        let (m, n, nkb) = (a_q.len() / ra, b_q.len() / rb, k_steps(k));
        let mut ab = vec![<ABlock as bytemuck::Zeroable>::zeroed(); n.div_ceil(IG_NR) * nkb];
        for (j, col) in b_q.chunks_exact(rb).enumerate() {
            let p = j / IG_NR;
            pack_column(fmt, col, &mut ab[p * nkb..(p + 1) * nkb], j % IG_NR);
        }
        // 64-byte aligned scratch.
        let mut bands = vec![
            <WBand as bytemuck::Zeroable>::zeroed();
            BLOCK_SCRATCH.div_ceil(size_of::<WBand>())
        ];
        let scratch: &mut [u8] = bytemuck::cast_slice_mut(&mut bands);
        let mut out = vec![0f32; m * n];
        let a_row = |i: usize| a_q.as_ptr().wrapping_add(i * ra);
        block(
            fmt,
            dtype,
            kernels,
            dtype.type_size(),
            None,
            k,
            0..m,
            a_row,
            &ab,
            n,
            scratch,
            |i, j, run| {
                for (r, v) in run.iter().enumerate().filter(|(r, _)| i + r < m) {
                    out[j * m + i + r] = *v;
                }
            },
        )
        .unwrap();
        out
    }

    /// The integer-scaled forms (`IntFormat::int_scaled`) of every super-block format whose
    /// sums are scaled per sub-block (in f32, or by Q3_K's and IQ1_M's `vpmulld`) give the
    /// plain forms' results up to the float roundings (the same integer products; a bias
    /// carried as mins, sub-blocks of 32 split into 16), on the portable kernels and on the
    /// AVX2 `vpmaddubsw` kernels (which run some of them, bit for bit the portable ones), with
    /// partial bands and panels. A format with neither mins nor a bias has no such form.
    #[test]
    fn int_scaled_forms_match_the_plain_forms() {
        let mut sets = vec![("portable", SCALAR)];
        #[cfg(target_arch = "x86_64")]
        if let Some(k) = crate::kernels::avx2_igemm_maddubs() {
            assert!(k.int_scaled.is_some());
            sets.push(("AVX2 maddubs", k));
        }
        let no_bias =
            crate::quant::unpack::IntFormat::superblock(16, 0, false, 63, |_, _, _, _| (1.0, 0.0));
        assert!(no_bias.int_scaled().is_none(), "mins the unpacker would not write");
        let (k, m, n) = (512, 13, 21);
        let types = [
            DType::Q6_K,
            DType::IQ2_XS,
            DType::IQ2_S,
            DType::IQ3_S,
            DType::IQ1_S,
            DType::IQ2_XXS,
            DType::IQ3_XXS,
            DType::TQ1_0,
            DType::TQ2_0,
            DType::Q4_K,
            DType::Q5_K,
            DType::Q3_K,
            DType::IQ1_M,
        ];
        for dtype in types {
            let w = crate::testdata::rand_f32(m * k, 11);
            let mut a_q = vec![0u8; dtype.row_bytes(k) * m];
            let imatrix = vec![1.0f32; k];
            crate::quant::quantize_with_imatrix(dtype, &w, k, &imatrix, &mut a_q).unwrap();
            let x = crate::testdata::rand_f32(n * k, 12);
            let mut b_q = vec![0u8; DType::Q8_K.row_bytes(k) * n];
            crate::quant::quantize_for_dot(DType::Q8_K, &x, &mut b_q).unwrap();
            // The form the `vpmaddubsw` tier takes codes up to 127 in (IQ2: recentred).
            let plain = int_format(dtype).unwrap();
            let plain = if plain.max_code > 127 { plain.recentred().unwrap() } else { plain };
            let kind = Kind::of(&plain);
            assert!(matches!(kind, Kind::Flt16 | Kind::Flt32 | Kind::Flt32Min | Kind::Int16));
            let form = plain.int_scaled().expect("an integer-scaled form");
            assert_eq!(
                (Kind::of(&form), form.bias, form.mins_bias, form.widen),
                (Kind::Int16Min, 0, if plain.has_min { 0 } else { plain.bias }, plain.sub == 32)
            );
            let want = run(&plain, dtype, &SCALAR, k, &a_q, &b_q);
            let scale = want.iter().fold(0f32, |s, v| s.max(v.abs()));
            let portable = run(&form, dtype, &SCALAR, k, &a_q, &b_q);
            for (name, kernels) in &sets {
                let kernels = kernels.for_format(&form).unwrap();
                let got = run(&form, dtype, &kernels, k, &a_q, &b_q);
                for (i, ((g, p), w)) in got.iter().zip(&portable).zip(&want).enumerate() {
                    assert_eq!(g.to_bits(), p.to_bits(), "{dtype} {name} output {i}");
                    assert!((g - w).abs() <= 1e-5 * scale, "{dtype} {name} output {i}: {g} vs {w}");
                }
            }
        }
    }

    /// The formats the AVX2 `vpmaddubsw` tier runs in the integer-scaled form (where it
    /// measured faster, `avx2_igemm::int_scaled_pays`), and those it leaves on the float kinds.
    #[test]
    fn maddubs_tier_takes_the_integer_scaled_forms_that_pay() {
        #[cfg(target_arch = "x86_64")]
        if let Some(k) = crate::kernels::avx2_igemm_maddubs() {
            let takes = k.int_scaled.expect("the maddubs tier runs integer-scaled forms");
            let taken = [
                DType::Q5_K,
                DType::Q6_K,
                DType::IQ1_S,
                DType::IQ1_M,
                DType::IQ2_XS,
                DType::IQ2_S,
                DType::IQ3_S,
            ];
            let left = [
                DType::Q3_K,
                DType::Q4_K,
                DType::TQ1_0,
                DType::TQ2_0,
                DType::IQ2_XXS,
                DType::IQ3_XXS,
            ];
            for (dtype, want) in
                taken.iter().map(|&d| (d, true)).chain(left.iter().map(|&d| (d, false)))
            {
                let plain = int_format(dtype).unwrap();
                let plain =
                    if plain.max_code > k.max_code { plain.recentred().unwrap() } else { plain };
                let form = plain.int_scaled().expect("an integer-scaled form");
                assert_eq!(takes(&form), want, "{dtype}");
            }
        }
    }
}
