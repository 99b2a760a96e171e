//! The integer GEMM's data layouts and its portable micro-kernel.
//!
//! Weights of the Q8_K-family types are unpacked (see `quant::unpack`) into bands of
//! [`IG_MR`] rows of one 256-element super-block: unsigned codes, integer sub-block scales and
//! mins, and the two float scales per row ([`WBand`]). Activations are Q8_K blocks regrouped in
//! panels of [`IG_NR`] columns ([`ABlock`]): for every 4 consecutive K values, the 4 levels of
//! each of the 16 columns side by side (64 bytes, one `vpdpbusd` operand), plus per-sub-block
//! level sums, already multiplied by the weight type's code bias where it has one.
//!
//! A micro-kernel adds one band x one panel x one super-block to an 8 x 16 f32 tile:
//!
//! ```text
//! s1[r][c] = sum_j scales[r][j] * (sum_{i in j} codes[r][i] * a[c][i] - bias * bsum[j][c])
//! s2[r][c] = sum_j mins[r][j] * bsum[j][c]                          (types with mins)
//! acc[r][c] += (d[r] * s1 - dmin[r] * s2) * da[c]                  (f32, one fused step)
//! ```
//!
//! The integer sums are exact (wrapping arithmetic, which the format bounds keep from wrapping),
//! so every tier that forms the same float expression gives the same bits: `f = s1 * d`, then
//! `f = fma(-dmin, s2, f)` for types with mins, then `acc = acc + f * da` with the product rounded
//! first. The K walk is in super-block order whatever the thread count.
//!
//! Block types (Q8_0 / Q8_1 activations) have float scales per sub-block `j` of 16 or 32 on both
//! sides (`fscales`, `ds`), so their kernels scale every sub-block's integer sum in f32:
//!
//! ```text
//! f = (sum_{i in j} codes[r][i] * a[c][i] - bias * bsum[j][c]) * ds[j][c]
//! acc[r][c] = fma(f, fscales[r][j], acc[r][c])
//! acc[r][c] = fma(ms[j][c], fmins[r][j], acc[r][c])                (Q4_1, Q5_1: Q8_1's s)
//! ```
//!
//! A row shorter than a whole number of super-blocks ends in a padded one: codes, scales and
//! sums 0, which adds exactly 0.

use crate::dtype::{DType, QK_K};

/// Weight rows per micro-kernel band.
pub(crate) const IG_MR: usize = 8;
/// Activation columns per panel.
pub(crate) const IG_NR: usize = 16;

/// One band of [`IG_MR`] weight rows over one super-block, unpacked.
#[repr(C, align(64))]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct WBand {
    /// Codes of row `r` at `codes[r * 256..]`.
    pub codes: [u8; IG_MR * QK_K],
    /// Scale of sub-block `j` of row `r` at `scales[r * 16 + j]`.
    pub scales: [i32; IG_MR * 16],
    /// Min of sub-block `j` of row `r` at `mins[r * 16 + j]` (types with mins).
    pub mins: [i32; IG_MR * 16],
    pub d: [f32; IG_MR],
    pub dmin: [f32; IG_MR],
    /// Float scale of sub-block `j` of row `r` at `fscales[r * 16 + j]` (block types).
    pub fscales: [f32; IG_MR * 16],
    /// Float min of sub-block `j` of row `r` at `fmins[r * 16 + j]` (block types with mins).
    pub fmins: [f32; IG_MR * 16],
    /// Scales of sub-blocks `2 i` (low 16 bits) and `2 i + 1` (high 16 bits) of row `r` at
    /// `scale_pairs[r * 8 + i]`, as `vpdpwssd` takes them ([`WBand::pair_up`]; read by kernels
    /// for `IntFormat::narrow_sums` forms, whose scales fit 16 bits).
    pub scale_pairs: [i32; IG_MR * 8],
    /// Mins of sub-blocks `2 i` and `2 i + 1` of row `r` at `min_pairs[r * 8 + i]`, the same way
    /// (read by kernels for types with mins, whose mins are at most 6 bits).
    pub min_pairs: [i32; IG_MR * 8],
}
const _: () = assert!(size_of::<WBand>() == 4672);

impl WBand {
    /// Writes row `r`'s `scale_pairs` and `min_pairs` from its `scales` and `mins` (once per
    /// unpacked row, so the kernels, which run once per panel, read them ready).
    pub(crate) fn pair_up(&mut self, r: usize) {
        for i in 0..8 {
            let (j, o) = (r * 16 + 2 * i, r * 8 + i);
            self.scale_pairs[o] = pair_i16(self.scales[j], self.scales[j + 1]);
            self.min_pairs[o] = pair_i16(self.mins[j], self.mins[j + 1]);
        }
    }
}

/// One panel of [`IG_NR`] activation columns over one super-block.
#[repr(C, align(64))]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct ABlock {
    /// Level `4g + e` of column `c` at `codes[g * 64 + c * 4 + e]`.
    pub codes: [i8; QK_K * IG_NR],
    /// Per sub-block `j` and column `c` at `bsums[j * 16 + c]`: the sum of the sub-block's levels
    /// (types with mins), or that sum times the code bias (the others).
    pub bsums: [i32; 16 * IG_NR],
    /// Types with mins: the level sums of sub-blocks `2 i` (low 16 bits) and `2 i + 1` (high 16
    /// bits) of column `c` at `bsum_pairs[i * 16 + c]`, as `vpdpwssd` takes them; not written
    /// (and not read) for the other types.
    pub bsum_pairs: [i32; 8 * IG_NR],
    /// Nonzero for a column whose level sums do not all fit 16 bits (Q8_K rows given as they are
    /// may carry any `bsums`; quantized ones have at most 32 * 128 per sub-block): kernels then
    /// take the 32-bit products for the whole panel.
    pub pairs_bad: [i32; IG_NR],
    /// Q8_K scale of each column (0 for padding columns).
    pub d: [f32; IG_NR],
    /// Q8_0 / Q8_1 scale of sub-block `j`, column `c` at `ds[j * 16 + c]` (block types).
    pub ds: [f32; 16 * IG_NR],
    /// Q8_1's `s` (the block's scale times its level sum) of sub-block `j`, column `c` at
    /// `ms[j * 16 + c]` (block types with mins).
    pub ms: [f32; 16 * IG_NR],
}
const _: () = assert!(size_of::<ABlock>() == 7808);

/// One band x one panel x one super-block into `acc[r][c]` (see the module notes), of which the
/// first `len` K values (a multiple of 32, at most 256) are not padding: the block-type kernels
/// skip the sub-blocks past [`used_subs`] (super-block types always pass 256). Every tier's kernel gives the same bits as [`igemm_generic`].
pub(crate) type IgemmFn = fn(w: &WBand, a: &ABlock, acc: &mut [[f32; IG_NR]; IG_MR], len: usize);

/// One band x two panels: the same as [`IgemmFn`] on `(a[0], acc[0])` then `(a[1], acc[1])`, bit
/// for bit (a tier with the registers reads the band's codes once for both panels).
pub(crate) type IgemmPairFn =
    fn(w: &WBand, a: [&ABlock; 2], acc: [&mut [[f32; IG_NR]; IG_MR]; 2], len: usize);

/// Sub-blocks of `sub` elements a kernel walks for `len` K values: those holding data, rounded
/// up to a pair (the SIMD kernels take two at a time; a padding sub-block adds exact zeros).
#[inline(always)]
pub(crate) fn used_subs(len: usize, sub: usize) -> usize {
    len.div_ceil(sub).next_multiple_of(2).min(QK_K / sub)
}

/// The kernels of one tier, for the four (sub-block size, mins) combinations with integer
/// scales and the three with float scales (no block type has mins per 16).
#[derive(Clone, Copy)]
pub(crate) struct IgemmKernels {
    pub sub16: IgemmFn,
    pub sub16_min: IgemmFn,
    pub sub32: IgemmFn,
    pub sub32_min: IgemmFn,
    pub blk16: IgemmFn,
    pub blk32: IgemmFn,
    pub blk32_min: IgemmFn,
    /// Two-panel forms of the seven kernels (`sub16`, `sub16_min`, `sub32`, `sub32_min`,
    /// `blk16`, `blk32`, `blk32_min`), where the tier has them.
    pub pairs: Option<[IgemmPairFn; 7]>,
    /// A two-panel form of `sub16_min` for bands whose scales are all 1 (`IntFormat::unit_scales`):
    /// a whole step's products summed before the mins, where the tier has one.
    pub unit_pair: Option<IgemmPairFn>,
    /// A two-panel form of `sub16` for formats whose corrected sub-block sums fit 16 bits
    /// (`IntFormat::narrow_sums`): two sub-blocks scaled by one 16-bit pair product, where the
    /// tier has one.
    pub narrow_pair: Option<IgemmPairFn>,
    /// The largest weight code the kernels multiply exactly (`IntFormat::max_code` above it
    /// takes the f32 GEMM).
    pub max_code: u8,
    /// The tier's whole-step unpacker of a block type, where it has one (the same codes,
    /// scales and mins as the type's `quant::unpack` function per block).
    pub unpack: fn(DType) -> Option<UnpackStepFn>,
    /// The tier's unpacker of a super-block type, where it has one (the same codes, scales and
    /// mins as the type's `quant::unpack` function).
    pub unpack_super: fn(DType) -> Option<crate::quant::unpack::UnpackFn>,
}

/// Unpacks a row's step of `nblk` (at most 8) weight blocks of 32 elements in ggml's layout
/// (`src`) into codes `32 b..32 b + 32`, `scales[b]` and (types with mins) `mins[b]` of block
/// `b`, leaving the rest as it was.
pub(crate) type UnpackStepFn = fn(
    src: &[u8],
    nblk: usize,
    codes: &mut [u8; QK_K],
    scales: &mut [f32; 16],
    mins: &mut [f32; 16],
);

/// For tiers without step unpackers.
#[cfg(test)]
pub(crate) fn no_unpack(_: DType) -> Option<UnpackStepFn> {
    None
}

/// For tiers without super-block unpackers.
#[cfg(test)]
pub(crate) fn no_unpack_super(_: DType) -> Option<crate::quant::unpack::UnpackFn> {
    None
}

impl IgemmKernels {
    /// The kernel for sub-blocks of `sub` elements, with or without mins, with integer or float
    /// (`float_scales`) sub-block scales.
    pub(crate) fn get(&self, sub: usize, has_min: bool, float_scales: bool) -> IgemmFn {
        match (float_scales, sub, has_min) {
            (false, 16, false) => self.sub16,
            (false, 16, true) => self.sub16_min,
            (false, _, false) => self.sub32,
            (false, _, true) => self.sub32_min,
            (true, 16, _) => self.blk16,
            (true, _, false) => self.blk32,
            (true, _, true) => self.blk32_min,
        }
    }

    /// The two-panel kernel for weights of format `fmt`, where the tier has one: the unit-scale
    /// pair for `IntFormat::unit_scales` forms, the narrow pair for `IntFormat::narrow_sums`
    /// forms, else [`IgemmKernels::get_pair`]'s.
    pub(crate) fn pair_for(&self, fmt: &crate::quant::unpack::IntFormat) -> Option<IgemmPairFn> {
        let int16 = fmt.sub == 16 && !fmt.float_scales();
        match (self.unit_pair, self.narrow_pair) {
            (Some(unit), _) if fmt.unit_scales && int16 && fmt.has_min => Some(unit),
            (_, Some(narrow)) if fmt.narrow_sums && int16 && !fmt.has_min => Some(narrow),
            _ => self.get_pair(fmt.sub, fmt.has_min, fmt.float_scales()),
        }
    }

    /// The two-panel form of [`IgemmKernels::get`]'s kernel, where the tier has one.
    pub(crate) fn get_pair(
        &self,
        sub: usize,
        has_min: bool,
        float_scales: bool,
    ) -> Option<IgemmPairFn> {
        let p = self.pairs?;
        Some(match (float_scales, sub, has_min) {
            (false, 16, false) => p[0],
            (false, 16, true) => p[1],
            (false, _, false) => p[2],
            (false, _, true) => p[3],
            (true, 16, _) => p[4],
            (true, _, false) => p[5],
            (true, _, true) => p[6],
        })
    }

    /// Every (sub, has_min, float_scales) combination `get` distinguishes, in the order of
    /// `pairs`.
    #[cfg(test)]
    pub(crate) const KINDS: [(usize, bool, bool); 7] = [
        (16, false, false),
        (16, true, false),
        (32, false, false),
        (32, true, false),
        (16, false, true),
        (32, false, true),
        (32, true, true),
    ];
}

/// The portable kernels: the reference every SIMD kernel is tested against bit for bit.
#[cfg(test)]
pub(crate) const SCALAR: IgemmKernels = IgemmKernels {
    sub16: igemm_generic::<16, false>,
    sub16_min: igemm_generic::<16, true>,
    sub32: igemm_generic::<32, false>,
    sub32_min: igemm_generic::<32, true>,
    blk16: igemm_blocks_generic::<16, false>,
    blk32: igemm_blocks_generic::<32, false>,
    blk32_min: igemm_blocks_generic::<32, true>,
    pairs: None,
    unit_pair: None,
    narrow_pair: None,
    max_code: 255,
    unpack: no_unpack,
    unpack_super: no_unpack_super,
};

/// Sums of `w` row `r`'s codes times panel `a`'s levels over sub-block `j` of `SUB` elements,
/// per column (wrapping, as `vpdpbusd`).
#[cfg(test)]
fn raw_sums<const SUB: usize>(w: &WBand, a: &ABlock, r: usize, j: usize) -> [i32; IG_NR] {
    let codes = &w.codes[r * QK_K..(r + 1) * QK_K];
    let mut raw = [0i32; IG_NR];
    for g in j * SUB / 4..(j + 1) * SUB / 4 {
        let wq = &codes[4 * g..4 * g + 4];
        let aq = &a.codes[g * 64..g * 64 + 64];
        for c in 0..IG_NR {
            let mut s = 0i32;
            for e in 0..4 {
                s += wq[e] as i32 * aq[c * 4 + e] as i32;
            }
            raw[c] = raw[c].wrapping_add(s);
        }
    }
    raw
}

/// The float-scale micro-kernel in plain Rust (module notes).
#[cfg(test)]
pub(crate) fn igemm_blocks_generic<const SUB: usize, const MIN: bool>(
    w: &WBand,
    a: &ABlock,
    acc: &mut [[f32; IG_NR]; IG_MR],
    len: usize,
) {
    for (r, row) in acc.iter_mut().enumerate() {
        for j in 0..used_subs(len, SUB) {
            let raw = raw_sums::<SUB>(w, a, r, j);
            let (ws, wm) = (w.fscales[r * 16 + j], w.fmins[r * 16 + j]);
            for (c, v) in row.iter_mut().enumerate() {
                let corr = if MIN { raw[c] } else { raw[c].wrapping_sub(a.bsums[j * IG_NR + c]) };
                let f = corr as f32 * a.ds[j * IG_NR + c];
                *v = f.mul_add(ws, *v);
                if MIN {
                    *v = a.ms[j * IG_NR + c].mul_add(wm, *v);
                }
            }
        }
    }
}

/// The micro-kernel in plain Rust: the definition every SIMD kernel is tested against.
#[cfg(test)]
pub(crate) fn igemm_generic<const SUB: usize, const MIN: bool>(
    w: &WBand,
    a: &ABlock,
    acc: &mut [[f32; IG_NR]; IG_MR],
    len: usize,
) {
    // Super-block types fill every step.
    debug_assert_eq!(len, QK_K);
    let nsub = QK_K / SUB;
    for r in 0..IG_MR {
        let mut s1 = [0i32; IG_NR];
        let mut s2 = [0i32; IG_NR];
        for j in 0..nsub {
            let raw = raw_sums::<SUB>(w, a, r, j);
            let bs = &a.bsums[j * IG_NR..(j + 1) * IG_NR];
            let (sc, mn) = (w.scales[r * 16 + j], w.mins[r * 16 + j]);
            for c in 0..IG_NR {
                if MIN {
                    s1[c] = s1[c].wrapping_add(sc.wrapping_mul(raw[c]));
                    s2[c] = s2[c].wrapping_add(mn.wrapping_mul(bs[c]));
                } else {
                    s1[c] = s1[c].wrapping_add(sc.wrapping_mul(raw[c].wrapping_sub(bs[c])));
                }
            }
        }
        let (d, dmin) = (w.d[r], w.dmin[r]);
        for c in 0..IG_NR {
            let mut f = s1[c] as f32 * d;
            if MIN {
                f = (-dmin).mul_add(s2[c] as f32, f);
            }
            acc[r][c] += f * a.d[c];
        }
    }
}

/// `lo` in the low and `hi` in the high 16 bits (exact when both fit 16 bits).
#[inline(always)]
pub(crate) fn pair_i16(lo: i32, hi: i32) -> i32 {
    (lo & 0xFFFF) | (hi << 16)
}

/// Writes column `c`'s first `npairs` level-sum pairs from its `bsums`, and whether they all fit
/// 16 bits (`pairs_bad`).
pub(crate) fn pack_pairs(a: &mut ABlock, c: usize, npairs: usize) {
    let mut bad = 0;
    for i in 0..npairs {
        let (lo, hi) = (a.bsums[2 * i * IG_NR + c], a.bsums[(2 * i + 1) * IG_NR + c]);
        if i16::try_from(lo).is_err() || i16::try_from(hi).is_err() {
            bad = 1;
        }
        a.bsum_pairs[i * IG_NR + c] = pair_i16(lo, hi);
    }
    a.pairs_bad[c] = bad;
}

/// Whether every column of `a` has its level-sum pairs (see [`ABlock::pairs_bad`]).
#[inline(always)]
pub(crate) fn pairs_fit(a: &ABlock) -> bool {
    a.pairs_bad.iter().all(|&b| b == 0)
}

/// Regroups one Q8_K block of column `c` into panel block `a` (levels, sums per `sub` times
/// `bias` where the weight type has one, scale). The sums are the block's `bsums`, or with
/// `from_levels` (`IntFormat::narrow_sums`) the sums of its levels.
#[allow(clippy::too_many_arguments)]
pub(crate) fn pack_q8k_column(
    a: &mut ABlock,
    c: usize,
    qs: &[i8; QK_K],
    bsums16: &[i16; 16],
    d: f32,
    sub: usize,
    bias: i32,
    from_levels: bool,
) {
    for g in 0..QK_K / 4 {
        a.codes[g * 64 + c * 4..g * 64 + c * 4 + 4].copy_from_slice(&qs[4 * g..4 * g + 4]);
    }
    let per = sub / 16;
    for j in 0..QK_K / sub {
        let s: i32 = if from_levels {
            qs[j * sub..(j + 1) * sub].iter().map(|&v| v as i32).sum()
        } else {
            bsums16[j * per..(j + 1) * per].iter().map(|&v| v as i32).sum()
        };
        a.bsums[j * IG_NR + c] = if bias != 0 { s * bias } else { s };
    }
    if bias == 0 {
        pack_pairs(a, c, QK_K / sub / 2);
    } else {
        a.pairs_bad[c] = 0;
    }
    a.d[c] = d;
}

/// Regroups the Q8_0 / Q8_1 blocks of one column's row into column `c` of panel block `a`:
/// `q8` holds at most 8 whole blocks of `bsize` bytes from the super-block's start (ggml's
/// layout: f16 `d`, with `has_s` Q8_1's f16 `s`, then the 32 levels last), packed with scales
/// per `sub` (16 or 32) and level sums times `bias`; the rest of the super-block's column is
/// zeroed (a row's last, partial super-block).
pub(crate) fn pack_q8_blocks_column(
    a: &mut ABlock,
    c: usize,
    q8: &[u8],
    bsize: usize,
    has_s: bool,
    sub: usize,
    bias: i32,
) {
    use crate::quant::util::fp16_to_fp32;
    let n = (q8.len() / bsize).min(QK_K / 32);
    a.pairs_bad[c] = 0;
    let per = 32 / sub;
    for (b, blk) in q8.chunks_exact(bsize).take(n).enumerate() {
        let d = fp16_to_fp32(u16::from_le_bytes([blk[0], blk[1]]));
        let s = if has_s { fp16_to_fp32(u16::from_le_bytes([blk[2], blk[3]])) } else { 0.0 };
        let qs: &[u8; 32] = blk[bsize - 32..].try_into().expect("32 levels");
        for (e, four) in qs.chunks_exact(4).enumerate() {
            let g = b * 8 + e;
            a.codes[g * 64 + c * 4..g * 64 + c * 4 + 4].copy_from_slice(bytemuck::cast_slice(four));
        }
        for (h, part) in qs.chunks_exact(sub).enumerate() {
            let j = b * per + h;
            let sum: i32 = part.iter().map(|&v| v as i8 as i32).sum();
            a.bsums[j * IG_NR + c] = sum * bias;
            a.ds[j * IG_NR + c] = d;
            a.ms[j * IG_NR + c] = s;
        }
    }
    for g in n * 8..QK_K / 4 {
        a.codes[g * 64 + c * 4..g * 64 + c * 4 + 4].fill(0);
    }
    for j in n * per..QK_K / sub {
        a.bsums[j * IG_NR + c] = 0;
        a.ds[j * IG_NR + c] = 0.0;
        a.ms[j * IG_NR + c] = 0.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{Isa, table_for};

    /// The kernel sets a tier's table may not hold on this CPU (the AVX2 tier installs one of
    /// two).
    fn extra_kernels() -> Vec<(String, IgemmKernels)> {
        #[cfg(target_arch = "x86_64")]
        if let Some(k) = crate::kernels::x86::avx2_igemm_maddubs() {
            return vec![("AVX2 maddubs".into(), k)];
        }
        Vec::new()
    }

    /// The narrow pair (`IntFormat::narrow_sums`) against the portable `sub16` on both panels,
    /// with Q3_K's codes (0..=7, bias 4, scales -32..=31) and IQ1_M's (128 +- 9, bias 128,
    /// scales 1..=15), and level sums taken from the levels as the packer takes them for such
    /// formats; `extreme`: the codes farthest from the bias and every level -128.
    fn narrow_pair_is_sub16(name: &str, narrow: IgemmPairFn, w: &WBand, a: &ABlock, extreme: bool) {
        for (bias, lo, hi, smin, smax) in [(4i32, 0u8, 7u8, -32i32, 31i32), (128, 119, 137, 1, 15)]
        {
            let mut w = *w;
            for (i, c) in w.codes.iter_mut().enumerate() {
                let span = (hi - lo) as usize + 1;
                *c = if extreme { lo } else { lo + ((*c as usize + i) % span) as u8 };
            }
            for (i, v) in w.scales.iter_mut().enumerate() {
                let span = smax - smin + 1;
                *v = if extreme { smin } else { smin + (v.rem_euclid(span) + i as i32) % span };
            }
            for row in 0..IG_MR {
                w.pair_up(row);
            }
            let mut a2 = *a;
            a2.codes.reverse();
            let panels: Vec<ABlock> = [*a, a2]
                .iter()
                .map(|p| {
                    let mut p = *p;
                    if extreme {
                        p.codes.fill(-128);
                    }
                    for c in 0..IG_NR {
                        for j in 0..16 {
                            let s: i32 = (4 * j..4 * j + 4)
                                .flat_map(|g| p.codes[g * 64 + c * 4..g * 64 + c * 4 + 4].to_vec())
                                .map(|v| v as i32)
                                .sum();
                            p.bsums[j * IG_NR + c] = s * bias;
                        }
                    }
                    p
                })
                .collect();
            let mut want = [[[0.5f32; IG_NR]; IG_MR], [[0.25f32; IG_NR]; IG_MR]];
            for (p, acc) in panels.iter().zip(want.iter_mut()) {
                (SCALAR.sub16)(&w, p, acc, 256);
            }
            let (mut g1, mut g2) = ([[0.5f32; IG_NR]; IG_MR], [[0.25f32; IG_NR]; IG_MR]);
            narrow(&w, [&panels[0], &panels[1]], [&mut g1, &mut g2], 256);
            for (x, y) in want.iter().flatten().flatten().zip(g1.iter().chain(&g2).flatten()) {
                assert_eq!(x.to_bits(), y.to_bits(), "{name} narrow pair, bias {bias}");
            }
        }
    }

    /// A Q8_K block whose `bsums` disagree with its levels: the narrow formats' panels take the
    /// levels' sums (the bound their kernels rely on), the others the block's `bsums`.
    #[test]
    fn narrow_formats_take_level_sums_from_the_levels() {
        let qs: [i8; QK_K] = std::array::from_fn(|i| (i as i32 * 37 % 255 - 127) as i8);
        let wrong = [1000i16; 16];
        for (from_levels, want) in [(true, None), (false, Some(1000 * 4))] {
            let mut a: ABlock = bytemuck::Zeroable::zeroed();
            pack_q8k_column(&mut a, 3, &qs, &wrong, 1.0, 16, 4, from_levels);
            for j in 0..16 {
                let levels: i32 = qs[16 * j..16 * j + 16].iter().map(|&v| v as i32).sum();
                assert_eq!(a.bsums[j * IG_NR + 3], want.unwrap_or(levels * 4), "sub-block {j}");
            }
        }
    }

    /// Random bands and panels, with extremes (codes 255, levels -128/127, scales at the format
    /// bound) mixed in; every tier with integer kernels gives the portable kernel's bits.
    #[test]
    fn igemm_tiers_are_bitwise_the_portable_kernel() {
        let mut r = crate::testdata::Xorshift64::from_state(0x2545_F491_4F6C_DD1D);
        for case in 0..24 {
            let mut w: WBand = bytemuck::Zeroable::zeroed();
            let mut a: ABlock = bytemuck::Zeroable::zeroed();
            let extreme = case % 3 == 0;
            for c in w.codes.iter_mut() {
                *c = if extreme { 255 } else { r.next_u64() as u8 };
            }
            for v in w.scales.iter_mut().chain(w.mins.iter_mut()) {
                *v = (r.next_u64() % 256) as i32 - 128;
            }
            for row in 0..IG_MR {
                w.pair_up(row);
            }
            for (d, dm) in w.d.iter_mut().zip(w.dmin.iter_mut()) {
                *d = (r.next_u64() % 1000) as f32 * 1e-4;
                *dm = (r.next_u64() % 1000) as f32 * 1e-4;
            }
            for v in w.fscales.iter_mut().chain(w.fmins.iter_mut()) {
                *v = ((r.next_u64() % 2000) as f32 - 1000.0) * 1e-4;
            }
            for v in a.ds.iter_mut().chain(a.ms.iter_mut()) {
                *v = (r.next_u64() % 1000) as f32 * 1e-3;
            }
            for q in a.codes.iter_mut() {
                *q = if extreme { -128 } else { r.next_u64() as i8 };
            }
            for b in a.bsums.iter_mut() {
                *b = (r.next_u64() % 8192) as i32 - 4096;
            }
            // Sums outside 16 bits (Q8_K rows given as they are) in some cases: the kernels
            // must then not use the pairs.
            if case % 4 == 1 {
                for b in a.bsums.iter_mut().step_by(7) {
                    *b = *b * 16 + 1;
                }
            }
            // As the packer writes them (the kernels with mins read the pairs).
            for c in 0..IG_NR {
                pack_pairs(&mut a, c, 8);
            }
            assert_eq!(pairs_fit(&a), case % 4 != 1);
            for d in a.d.iter_mut() {
                *d = (r.next_u64() % 1000) as f32 * 1e-3;
            }
            let mut sets: Vec<(String, IgemmKernels)> = Isa::ALL
                .iter()
                .filter_map(|&i| table_for(i).and_then(|t| t.igemm).map(|k| (format!("{i:?}"), k)))
                .collect();
            sets.extend(extra_kernels());
            for (name, k) in sets {
                // Codes as large as the kernels take (extremes stay extreme).
                let mut w = w;
                for c in w.codes.iter_mut() {
                    *c &= k.max_code;
                }
                // The unit-scale pair: sub16_min's integers when every scale is 1.
                if let Some(unit) = k.unit_pair {
                    let mut wu = w;
                    wu.scales.fill(1);
                    for row in 0..IG_MR {
                        wu.pair_up(row);
                    }
                    let mut a2 = a;
                    a2.d.reverse();
                    a2.bsums.reverse();
                    for c in 0..IG_NR {
                        pack_pairs(&mut a2, c, 8);
                    }
                    let (mut w1, mut w2) = ([[0.5f32; IG_NR]; IG_MR], [[0.25f32; IG_NR]; IG_MR]);
                    (SCALAR.sub16_min)(&wu, &a, &mut w1, 256);
                    (SCALAR.sub16_min)(&wu, &a2, &mut w2, 256);
                    let (mut g1, mut g2) = ([[0.5f32; IG_NR]; IG_MR], [[0.25f32; IG_NR]; IG_MR]);
                    unit(&wu, [&a, &a2], [&mut g1, &mut g2], 256);
                    let all = w1.iter().chain(&w2).flatten();
                    for (x, y) in all.zip(g1.iter().chain(&g2).flatten()) {
                        assert_eq!(x.to_bits(), y.to_bits(), "{name} unit pair");
                    }
                }
                if let Some(narrow) = k.narrow_pair {
                    narrow_pair_is_sub16(&name, narrow, &w, &a, extreme);
                }
                for (sub, min, fl) in IgemmKernels::KINDS {
                    // Whole steps, and (block types) the partial last steps of rows.
                    let lens: &[usize] = if fl { &[256, 32, 64, 160] } else { &[256] };
                    for &len in lens {
                        let mut want = [[0.5f32; IG_NR]; IG_MR];
                        let mut got = want;
                        (SCALAR.get(sub, min, fl))(&w, &a, &mut want, len);
                        (k.get(sub, min, fl))(&w, &a, &mut got, len);
                        let same = want.iter().flatten().zip(got.iter().flatten());
                        for (x, y) in same {
                            assert_eq!(x.to_bits(), y.to_bits(), "{name} {sub} {min} {fl} {len}");
                        }
                        // The two-panel form: each panel as the one-panel kernel gives it
                        // (the second panel is the first with its columns reversed).
                        if let Some(pair) = k.get_pair(sub, min, fl) {
                            let mut a2 = a;
                            a2.d.reverse();
                            a2.ds.reverse();
                            a2.ms.reverse();
                            a2.bsums.reverse();
                            for c in 0..IG_NR {
                                pack_pairs(&mut a2, c, 8);
                            }
                            a2.codes.reverse();
                            let mut want2 = [[0.25f32; IG_NR]; IG_MR];
                            (SCALAR.get(sub, min, fl))(&w, &a2, &mut want2, len);
                            let (mut g1, mut g2) =
                                ([[0.5f32; IG_NR]; IG_MR], [[0.25f32; IG_NR]; IG_MR]);
                            pair(&w, [&a, &a2], [&mut g1, &mut g2], len);
                            let all = want.iter().chain(&want2).flatten();
                            for (x, y) in all.zip(g1.iter().chain(&g2).flatten()) {
                                assert_eq!(
                                    x.to_bits(),
                                    y.to_bits(),
                                    "{name} pair {sub} {min} {len}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
