//! The integer GEMM's data layouts and its portable micro-kernels.
//!
//! Weights of the Q8_K-family types are unpacked (see `quant::unpack`) into bands of
//! [`IG_MR`] rows of one 256-element super-block: unsigned codes, integer sub-block scales and
//! mins, and the two float scales per row ([`WBand`]). Activations are Q8_K blocks regrouped in
//! panels of [`IG_NR`] columns ([`ABlock`]): for every 4 consecutive K values, the 4 levels of
//! each of the 16 columns side by side (64 bytes, one `vpdpbusd` operand), plus per-sub-block
//! level sums, already multiplied by the weight type's code bias where it has one.
//!
//! A micro-kernel adds one band x one panel x one super-block to an 8 x 16 f32 tile. Each
//! sub-block's bias-corrected product sum is an exact int32 (wrapping arithmetic, which the
//! format bounds keep from wrapping):
//!
//! ```text
//! raw[r][c][j] = sum_{i in j} codes[r][i] * a[c][i] - bias * bsum[j][c]
//! s2[r][c]     = sum_j mins[r][j] * bsum[j][c]                      (types with mins, exact)
//! ```
//!
//! and the kernel's [`Kind`] says how the scales are applied. Most super-block formats
//! (`Kind::Flt*`) scale each sub-block's sum in f32, one fused step per sub-block, which costs
//! two vector instructions where an int32 multiply and add cost three:
//!
//! ```text
//! s[r][c] = fma(raw[r][c][j] as f32, scales[r][j] as f32, s[r][c])   (j in order, s from 0)
//! f = s * d[r];  f = fma(-dmin[r], s2 as f32, f)  (types with mins);  acc[r][c] += f * da[c]
//! ```
//!
//! The formats whose sums allow exact 16-bit tricks (`Kind::Int*`: `IntFormat::narrow_sums`,
//! `IntFormat::unit_scales`) keep the scaled sum in int32, `s1 = sum_j scales[r][j] * raw[j]`,
//! and take `f = s1 as f32 * d[r]` in its place; so do the integer-scaled forms that the AVX2
//! `vpmaddubsw` tier runs (`IntFormat::int_scaled`: sub-blocks of 16, a bias carried as mins
//! `bias * scales[j]` with `dmin = d`; Q5_K, Q6_K, IQ2_XS, IQ2_S, IQ3_S, IQ1_S, IQ1_M), whose kernels
//! scale each sum in its 16-bit widening. Block types (Q8_0 / Q8_1 activations,
//! `Kind::Blk*`) have float scales per sub-block `j` of 16 or 32 on both sides (`fscales`, `ds`):
//!
//! ```text
//! f = raw[r][c][j] as f32 * ds[j][c]
//! acc[r][c] = fma(f, fscales[r][j], acc[r][c])
//! acc[r][c] = fma(ms[j][c], fmins[r][j], acc[r][c])                (Q4_1, Q5_1: Q8_1's s)
//! ```
//!
//! Every tier forms the same float expression in the same order for a kind, so every tier gives
//! its portable kernel's bits. The kind is the format's on every tier but one: the AMX tier
//! folds the sub-block scales of every super-block format into its weights
//! (`IntFormat::for_tier`: sub-blocks of 32 repeat their scales per 16) and sums them as the
//! integer kinds, so its results for the formats that are `Kind::Flt*` elsewhere round once per
//! step where the others round per sub-block; the K walk is in super-block order whatever the thread count. A row shorter than a
//! whole number of super-blocks ends in a padded one: codes, scales and sums 0, which adds
//! exactly 0.

use crate::dtype::{DType, QK_K};
use crate::quant::unpack::{IntFormat, Sign};

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
    /// Float scale of sub-block `j` of row `r` at `fscales[r * 16 + j]`: the block types' own,
    /// or a super-block type's integer `scales` as f32 ([`WBand::pair_up`]).
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
    /// The codes of each 64 K values `t` as a block-diagonal 16-row matrix, written only for
    /// tiers that read it (`IgemmKernels::expand_codes`, [`WBand::expand_row`]): row `h * 8 + r`
    /// of block `t` (64 bytes at `xcodes[(t * 16 + h * 8 + r) * 64..]`) holds row `r`'s codes
    /// `64 t + 32 h..64 t + 32 h + 32` at bytes `32 h..32 h + 32` and zeros elsewhere, so one
    /// product over the 64 K values against it keeps the two 32-element sub-blocks apart.
    pub xcodes: [u8; QK_K / 64 * 2 * IG_MR * 64],
}
const _: () = assert!(size_of::<WBand>() == 4672 + 4096);

impl WBand {
    /// Writes row `r`'s `scale_pairs`, `min_pairs` and (super-block types) `fscales` from its
    /// `scales` and `mins` (once per unpacked row, so the kernels, which run once per panel,
    /// read them ready).
    pub(crate) fn pair_up(&mut self, r: usize) {
        for j in r * 16..r * 16 + 16 {
            // Exact: the scales are at most 8 bits.
            self.fscales[j] = self.scales[j] as f32;
        }
        for i in 0..8 {
            let (j, o) = (r * 16 + 2 * i, r * 8 + i);
            self.scale_pairs[o] = pair_i16(self.scales[j], self.scales[j + 1]);
            self.min_pairs[o] = pair_i16(self.mins[j], self.mins[j + 1]);
        }
    }
}

impl WBand {
    /// Writes row `r`'s block-diagonal weights ([`WBand::xcodes`]) from its `codes`: the signed
    /// bytes `codes[i] - bias` (the formats' integer weights, every one inside `i8`), so a
    /// signed product sums `(code - bias) * level` and needs no level-sum correction. A partial
    /// step's padding (code 0) becomes `-bias`, against activation levels that are 0 there.
    pub(crate) fn expand_row(&mut self, r: usize, bias: i32) {
        for t in 0..QK_K / 64 {
            for h in 0..2 {
                let at = (t * 16 + h * 8 + r) * 64;
                let row = &mut self.xcodes[at..at + 64];
                row.fill(0);
                let src = r * QK_K + 64 * t + 32 * h;
                for (x, &c) in row[32 * h..32 * h + 32].iter_mut().zip(&self.codes[src..src + 32]) {
                    let v = c as i32 - bias;
                    debug_assert!(i8::try_from(v).is_ok(), "weight {v} outside i8");
                    *x = v as i8 as u8;
                }
            }
        }
    }

    /// Writes row `r`'s weights in the bytes the signed forms (`IntFormat::signed`) broadcast,
    /// into [`WBand::xcodes`] (which those tiers' kernels do not otherwise read): the signed
    /// weights `codes[i] - 128` at `xcodes[r * 256 + i]` and, for `Sign::OnLevels`, their
    /// magnitudes (128 for -128, as an unsigned byte) at `xcodes[2048 + r * 256 + i]`. The
    /// kernels then broadcast them from memory instead of deriving them per broadcast.
    pub(crate) fn sign_row(&mut self, r: usize, sign: Sign) {
        let (w, mag) = self.xcodes.split_at_mut(IG_MR * QK_K);
        let codes = &self.codes[r * QK_K..(r + 1) * QK_K];
        let w = &mut w[r * QK_K..(r + 1) * QK_K];
        for (x, &c) in w.iter_mut().zip(codes) {
            *x = c ^ 0x80;
        }
        if sign == Sign::OnLevels {
            for (m, &x) in mag[r * QK_K..(r + 1) * QK_K].iter_mut().zip(&*w) {
                *m = (x as i8).unsigned_abs();
            }
        }
    }

    /// The signed weights [`WBand::sign_row`] writes (row `r` at `r * 256`).
    pub(crate) fn signed_codes(&self) -> &[u8; IG_MR * QK_K] {
        self.xcodes.first_chunk().expect("xcodes holds two arrays of codes")
    }

    /// The magnitudes of the signed weights [`WBand::sign_row`] writes for `Sign::OnLevels`.
    pub(crate) fn code_magnitudes(&self) -> &[u8; IG_MR * QK_K] {
        self.xcodes.last_chunk().expect("xcodes holds two arrays of codes")
    }

    /// Writes row `r`'s scaled signed weights into [`WBand::xcodes`] in place of the
    /// block-diagonal codes, for the tile kernels of `Kind::Int16` (`IgemmKernels::fold_scales`; the reference of the tiers' writers):
    /// `v = (codes[i] - bias) * scales[i / 16]` split as `v = 128 * hi + lo` with `lo` in
    /// `0..128`, row `r` of block `t` (64 bytes at `xcodes[(t * 16 + r) * 64..]`) holding the
    /// `hi` bytes of K values `64 t..64 t + 64` and row `8 + r` the `lo` bytes. One signed
    /// product over 64 K values against it gives `sum hi * a` in rows 0..8 and `sum lo * a` in
    /// rows 8..16, and `128 * hi_sum + lo_sum` summed over a step is the kernel's
    /// `sum_j scales[j] * (raw[j] - bias * levels[j])` exactly (the narrow formats' bound
    /// `|v| <= 9 * 15` keeps every `hi` within a byte: any `|v| < 2^14` would).
    #[cfg(test)]
    pub(crate) fn fold_row(&mut self, r: usize, bias: i32) {
        for i in 0..QK_K {
            let v = (self.codes[r * QK_K + i] as i32 - bias) * self.scales[r * 16 + i / 16];
            debug_assert!(v.abs() < 1 << 14, "folded weight {v} outside the split's range");
            let (t, e) = (i / 64, i % 64);
            self.xcodes[(t * 16 + r) * 64 + e] = (v >> 7) as u8;
            self.xcodes[(t * 16 + IG_MR + r) * 64 + e] = (v & 127) as u8;
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
    /// (types with mins), or that sum times the code bias (the others). For the block formats
    /// the tile tier does not read it: its signed weights (`WBand::expand_row`) already carry the
    /// bias, so its sums equal the other tiers' only while this holds exactly `bias x levels`,
    /// as `pack_q8_blocks_column` writes it.
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

/// An 8 x 16 f32 tile of the output.
pub(crate) type Tile = [[f32; IG_NR]; IG_MR];

/// One band x one panel x one super-block into `acc[r][c]` (see the module notes), of which the
/// first `len` K values (a multiple of 32, at most 256) are not padding: the block-type kernels
/// skip the sub-blocks past [`used_subs`] (super-block types always pass 256). Every tier's
/// kernel of a [`Kind`] gives the same bits as the portable one ([`SCALAR`]).
pub(crate) type IgemmFn = fn(w: &WBand, a: &ABlock, acc: &mut Tile, len: usize);

/// One band x two panels: the same as [`IgemmFn`] on `(a[0], acc[0])` then `(a[1], acc[1])`, bit
/// for bit (a tier with the registers reads the band's codes once for both panels).
pub(crate) type IgemmPairFn = fn(w: &WBand, a: [&ABlock; 2], acc: [&mut Tile; 2], len: usize);

/// One band x three panels, the same way as [`IgemmPairFn`].
pub(crate) type IgemmTripleFn = fn(w: &WBand, a: [&ABlock; 3], acc: [&mut Tile; 3], len: usize);

/// Sub-blocks of `sub` elements a kernel walks for `len` K values: those holding data, rounded
/// up to a pair (the SIMD kernels take two at a time; a padding sub-block adds exact zeros).
#[inline(always)]
pub(crate) fn used_subs(len: usize, sub: usize) -> usize {
    len.div_ceil(sub).next_multiple_of(2).min(QK_K / sub)
}

/// How a micro-kernel applies the scales (module notes), with the sub-block size and whether
/// the format has mins; [`Kind::of`] picks a format's.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    /// Super-block formats with `IntFormat::narrow_sums` (sub-blocks of 16, no mins), and on a
    /// folding tier every super-block format without mins (`IntFormat::fold`): integer scaled
    /// sums.
    Int16,
    /// Super-block formats with `IntFormat::unit_scales` (sub-blocks of 16, mins), on a
    /// folding tier every super-block format with mins, and on the tiers that run them the
    /// integer-scaled forms (`IntFormat::int_scaled`): integer scaled sums.
    Int16Min,
    /// The other super-block formats: sums scaled in f32 per sub-block.
    Flt16,
    Flt16Min,
    Flt32,
    Flt32Min,
    /// Block formats (float scales on both sides).
    Blk16,
    Blk32,
    Blk32Min,
}

impl Kind {
    /// Every kind, in the order of the kernel tables.
    #[cfg(test)]
    pub(crate) const ALL: [Kind; 9] = [
        Kind::Int16,
        Kind::Int16Min,
        Kind::Flt16,
        Kind::Flt16Min,
        Kind::Flt32,
        Kind::Flt32Min,
        Kind::Blk16,
        Kind::Blk32,
        Kind::Blk32Min,
    ];

    /// The kind of a format's kernels. The integer kinds only where their pair kernels' 16-bit
    /// tricks hold (`narrow_sums` without mins, `unit_scales` with them, sub-blocks of 16),
    /// where the tier folds the scales into its weights (`IntFormat::fold`, the form of
    /// `IntFormat::for_tier`: every super-block format), or for the integer-scaled forms of the
    /// tiers whose integer kernels take any data (`IntFormat::int_scaled`).
    pub(crate) fn of(fmt: &crate::quant::unpack::IntFormat) -> Kind {
        let (sub16, min) = (fmt.sub == 16, fmt.has_min);
        if fmt.fold {
            debug_assert!(sub16, "folded forms have sub-blocks of 16");
            return if min { Kind::Int16Min } else { Kind::Int16 };
        }
        if fmt.float_scales() {
            debug_assert!(!(sub16 && min), "no block format has mins per 16");
            return match (sub16, min) {
                (true, _) => Kind::Blk16,
                (false, false) => Kind::Blk32,
                (false, true) => Kind::Blk32Min,
            };
        }
        match (sub16, min) {
            (true, false) if fmt.narrow_sums => Kind::Int16,
            (true, true) if fmt.unit_scales || fmt.int_scaled => Kind::Int16Min,
            (true, false) => Kind::Flt16,
            (true, true) => Kind::Flt16Min,
            (false, false) => Kind::Flt32,
            (false, true) => Kind::Flt32Min,
        }
    }

    /// Whether the scales are floats on both sides (the block family).
    #[cfg(test)]
    pub(crate) fn blocks(self) -> bool {
        matches!(self, Kind::Blk16 | Kind::Blk32 | Kind::Blk32Min)
    }

    /// The kind's index in the kernel tables.
    pub(crate) const fn index(self) -> usize {
        self as usize
    }
}

/// The kernels of one tier, by [`Kind`] (`Kind::index`).
#[derive(Clone, Copy)]
pub(crate) struct IgemmKernels {
    /// One-panel forms, valid for any data of the kind.
    pub one: [IgemmFn; 9],
    /// Two-panel forms, where the tier has them, each panel's results bitwise the one-panel
    /// form's. The integer kinds' need only be valid for the formats [`Kind::of`] gives those
    /// kinds: the VNNI tiers' are 16-bit forms (`Kind::Int16`: two sub-blocks' corrected sums
    /// scaled by one `vpdpwssd` against the row's two scales; `Kind::Int16Min`: a whole step's
    /// products summed before the mins); the AVX2 `vpmaddubsw` tier's are valid for any data
    /// (`avx2_igemm::pair_set`).
    pub two: [Option<IgemmPairFn>; 9],
    /// Three-panel forms, where the tier has them (`Kind::Int16Min`'s, like its pair, valid for
    /// unit-scale formats only).
    pub three: [Option<IgemmTripleFn>; 9],
    /// The largest weight code the kernels multiply exactly (`IntFormat::max_code` above it
    /// takes the f32 GEMM).
    pub max_code: u8,
    /// Faster one-panel forms for formats whose codes are at most the given `max_code`, with
    /// the two-panel forms that go with them, where the tier has such
    /// (`IgemmKernels::for_codes`).
    pub narrow: Option<NarrowFn>,
    /// One-panel forms for the signed forms of the formats whose codes are signed bytes plus
    /// 128 (`IntFormat::signed`), where the tier has such: kernels whose `max_code` is below
    /// those codes multiply them this way (valid for the kinds without mins), with the writer
    /// of the band bytes they read (`WBand::sign_row`'s).
    pub signed: Option<SignedFn>,
    /// The writer the unpacker calls on each unpacked row of a band for these kernels, where
    /// they read more than the codes: [`IgemmKernels::for_format`] picks it for the format (the
    /// signed forms' writer, `fold_scales` for a folded form, [`WBand::expand_row`] where the
    /// kernels read block-diagonal codes); the tiers' tables leave it `None`.
    pub row_writer: Option<RowFn>,
    /// The tier's whole-step unpacker of a block type, where it has one (the same codes,
    /// scales and mins as the type's `quant::unpack` function per block).
    pub unpack: fn(DType) -> Option<UnpackStepFn>,
    /// The tier's unpacker of a super-block type, where it has one (the same codes, scales and
    /// mins as the type's `quant::unpack` function).
    pub unpack_super: fn(DType) -> Option<crate::quant::unpack::UnpackFn>,
    /// Gives back the per-thread state the kernels keep (the AMX tier's tile configuration),
    /// where they keep any: the integer GEMM calls it on the worker's thread when a block
    /// starts and when it ends.
    pub release: Option<fn()>,
    /// Whether the kernels read [`WBand::xcodes`] as block-diagonal codes (`for_format` then
    /// names [`WBand::expand_row`] as the row writer).
    pub expand_codes: bool,
    /// Where `Kind::Int16`'s two- and three-panel forms read [`WBand::xcodes`] as the folded
    /// weights of [`WBand::fold_row`], the tier's writer of them (the same bytes; the unpacker
    /// then calls it for that kind's formats instead of writing the block-diagonal codes).
    pub fold_scales: Option<RowFn>,
    /// Where the tier runs the integer-scaled form of a format that has one
    /// (`IntFormat::int_scaled`, `mul_mat_q::tier_form`), which of those formats it runs so
    /// (the `vpmaddubsw` kernels: their `Kind::Int16Min` scales each partial sum in its
    /// widening, which saves the float step per sub-block of the `Kind::Flt*` kinds).
    pub int_scaled: Option<fn(&crate::quant::unpack::IntFormat) -> bool>,
}

impl IgemmKernels {
    /// The kernels for a format whose codes are at most `max_code` (at most `self.max_code`):
    /// the tier's narrow one- and two-panel forms where it has them.
    pub(crate) fn for_codes(mut self, max_code: u8) -> IgemmKernels {
        debug_assert!(max_code <= self.max_code);
        if let Some(narrow) = self.narrow {
            (self.one, self.two) = narrow(max_code);
        }
        self
    }

    /// The kernels for weights of format `fmt`, if the tier multiplies its codes exactly: its
    /// signed forms for a signed format (one panel at a time), else the forms for its codes.
    pub(crate) fn for_format(mut self, fmt: &IntFormat) -> Option<IgemmKernels> {
        if let Some(sign) = fmt.sign {
            debug_assert!(fmt.bias == 128 && !fmt.has_min, "signed forms of bias-128 formats");
            let (one, writer) = (self.signed?)(sign);
            (self.one, self.row_writer) = (one, Some(writer));
            self.two = [None; 9];
            self.three = [None; 9];
            return Some(self);
        }
        if fmt.max_code > self.max_code {
            return None;
        }
        // A folded form only on kernels that fold (`IntFormat::for_tier`).
        self.row_writer = if fmt.fold {
            Some(self.fold_scales?)
        } else if self.expand_codes {
            Some(WBand::expand_row)
        } else {
            None
        };
        Some(self.for_codes(fmt.max_code))
    }
}

/// A tier's kernels for codes up to `max_code` ([`IgemmKernels::narrow`]): one-panel forms and
/// two-panel forms (`None` where the tier has none for a kind).
pub(crate) type NarrowFn = fn(max_code: u8) -> ([IgemmFn; 9], [Option<IgemmPairFn>; 9]);

/// A tier's signed forms for a [`Sign`] ([`IgemmKernels::signed`]): one-panel kernels and the
/// writer of the band bytes they read.
pub(crate) type SignedFn = fn(Sign) -> ([IgemmFn; 9], RowFn);

/// Writes what a tier's kernels read of row `r` of a band beside its codes, once the unpacker
/// wrote them, for code bias `bias` ([`IgemmKernels::row_writer`]): the signed forms' weights
/// ([`WBand::sign_row`]), the folded weights (the tiers' `fold_scales`, tested against the
/// portable [`WBand::fold_row`]) or the block-diagonal codes ([`WBand::expand_row`]).
pub(crate) type RowFn = fn(w: &mut WBand, r: usize, bias: i32);

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

/// The portable kernels: the reference every SIMD kernel is tested against bit for bit.
#[cfg(test)]
pub(crate) const SCALAR: IgemmKernels = IgemmKernels {
    one: [
        igemm_generic::<16, false>,
        igemm_generic::<16, true>,
        igemm_float_generic::<16, false>,
        igemm_float_generic::<16, true>,
        igemm_float_generic::<32, false>,
        igemm_float_generic::<32, true>,
        igemm_blocks_generic::<16, false>,
        igemm_blocks_generic::<32, false>,
        igemm_blocks_generic::<32, true>,
    ],
    two: [None; 9],
    three: [None; 9],
    max_code: 255,
    narrow: None,
    signed: None,
    row_writer: None,
    unpack: no_unpack,
    unpack_super: no_unpack_super,
    release: None,
    expand_codes: false,
    fold_scales: None,
    int_scaled: None,
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
    acc: &mut Tile,
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

/// The integer kinds' micro-kernel in plain Rust (module notes).
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

/// The float-scaled super-block kinds' micro-kernel in plain Rust (module notes).
#[cfg(test)]
pub(crate) fn igemm_float_generic<const SUB: usize, const MIN: bool>(
    w: &WBand,
    a: &ABlock,
    acc: &mut Tile,
    len: usize,
) {
    debug_assert_eq!(len, QK_K);
    for r in 0..IG_MR {
        let mut s = [0f32; IG_NR];
        let mut s2 = [0i32; IG_NR];
        for j in 0..QK_K / SUB {
            let raw = raw_sums::<SUB>(w, a, r, j);
            let bs = &a.bsums[j * IG_NR..(j + 1) * IG_NR];
            let (sc, mn) = (w.fscales[r * 16 + j], w.mins[r * 16 + j]);
            for c in 0..IG_NR {
                let corr = if MIN { raw[c] } else { raw[c].wrapping_sub(bs[c]) };
                s[c] = (corr as f32).mul_add(sc, s[c]);
                if MIN {
                    s2[c] = s2[c].wrapping_add(mn.wrapping_mul(bs[c]));
                }
            }
        }
        let (d, dmin) = (w.d[r], w.dmin[r]);
        for c in 0..IG_NR {
            let mut f = s[c] * d;
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

    /// The signed forms (`IntFormat::signed`) against the portable kernel of each kind without
    /// mins, bit for bit, on the data each way allows: `Sign::OnWeights` with codes 1..=255 and
    /// any levels, `Sign::OnLevels` with any codes and levels -127..=127, extremes included
    /// (codes 1 or 0 and 255 against levels -128 or -127 and 127), and level sums 128 times the
    /// levels' own, as the packer writes them for these forms.
    #[test]
    fn signed_forms_are_bitwise_the_portable_kernel() {
        let mut sets: Vec<(String, IgemmKernels)> = Isa::ALL
            .iter()
            .filter_map(|&i| table_for(i).and_then(|t| t.igemm).map(|k| (format!("{i:?}"), k)))
            .collect();
        sets.extend(extra_kernels());
        sets.retain(|(_, k)| k.signed.is_some());
        let mut r = crate::testdata::Xorshift64::from_state(0x9E37_79B9_7F4A_7C15);
        for sign in [Sign::OnWeights, Sign::OnLevels] {
            let (lowest_code, lowest_level) = match sign {
                Sign::OnWeights => (1u8, i8::MIN),
                Sign::OnLevels => (0, -127),
            };
            for case in 0..12 {
                let mut w: WBand = bytemuck::Zeroable::zeroed();
                let mut a: ABlock = bytemuck::Zeroable::zeroed();
                for (i, c) in w.codes.iter_mut().enumerate() {
                    *c = match case % 3 {
                        0 => [lowest_code, 255][i % 2],
                        _ => (r.next_u64() as u8).max(lowest_code),
                    };
                }
                for (i, q) in a.codes.iter_mut().enumerate() {
                    *q = match case % 3 {
                        0 => [lowest_level, 127][(i / 3) % 2],
                        _ => (r.next_u64() as i8).max(lowest_level),
                    };
                }
                for v in w.scales.iter_mut() {
                    *v = (r.next_u64() % 256) as i32 - 128;
                }
                for row in 0..IG_MR {
                    w.pair_up(row);
                }
                for v in w.d.iter_mut().chain(&mut w.fscales).chain(&mut a.d).chain(&mut a.ds) {
                    *v = ((r.next_u64() % 2000) as f32 - 1000.0) * 1e-4;
                }
                for kind in [Kind::Int16, Kind::Flt16, Kind::Flt32, Kind::Blk16, Kind::Blk32] {
                    let sub = if matches!(kind, Kind::Flt32 | Kind::Blk32) { 32 } else { 16 };
                    for c in 0..IG_NR {
                        for j in 0..QK_K / sub {
                            let levels: i32 = (j * sub / 4..(j + 1) * sub / 4)
                                .flat_map(|g| &a.codes[g * 64 + c * 4..g * 64 + c * 4 + 4])
                                .map(|&v| v as i32)
                                .sum();
                            a.bsums[j * IG_NR + c] = 128 * levels;
                        }
                    }
                    let lens: &[usize] = if kind.blocks() { &[256, 32, 64, 160] } else { &[256] };
                    for (name, k) in &sets {
                        let (set, writer) = (k.signed.expect("signed forms"))(sign);
                        let mut wp = w;
                        for row in 0..IG_MR {
                            writer(&mut wp, row, 128);
                        }
                        for &len in lens {
                            let mut want = [[0.5f32; IG_NR]; IG_MR];
                            let mut got = want;
                            (SCALAR.one[kind.index()])(&w, &a, &mut want, len);
                            (set[kind.index()])(&wp, &a, &mut got, len);
                            for (x, y) in want.iter().flatten().zip(got.iter().flatten()) {
                                assert_eq!(
                                    x.to_bits(),
                                    y.to_bits(),
                                    "{name} {sign:?} {kind:?} case {case} len {len}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// The narrow pair and triple (`IntFormat::narrow_sums`; the triple where the tier has one)
    /// against the portable `sub16` on each panel (on the tiers that fold, `fold_scales`, on the
    /// band's folded weights, whose writer is checked against `WBand::fold_row`),
    /// with Q3_K's codes (0..=7, bias 4, scales -32..=31) and IQ1_M's (128 +- 9, bias 128,
    /// scales 1..=15) (and where the tier folds, Q6_K's and IQ2_S's), each where its codes are
    /// at most the kernels' `max_code`, and level sums taken from the levels as the packer
    /// takes them for such formats; `extreme`: the codes farthest from the bias and every
    /// level -128.
    fn narrow_pair_is_sub16(
        name: &str,
        (narrow, triple, fold): (IgemmPairFn, Option<IgemmTripleFn>, Option<RowFn>),
        max_code: u8,
        w: &WBand,
        a: &ABlock,
        extreme: bool,
    ) {
        // Q3_K's and IQ1_M's shapes; on the tiers that fold, also the other folding formats'
        // (Q6_K: codes 0..=63, bias 32, scales -128..=127; IQ2_S: 128 +- 43, scales 1..=31),
        // whose sums are past the 16-bit tricks but which those tiers run as this kind.
        let mut shapes = vec![(4i32, 0u8, 7u8, -32i32, 31i32), (128, 119, 137, 1, 15)];
        if fold.is_some() {
            shapes.extend([(32, 0, 63, -128, 127), (128, 85, 171, 1, 31)]);
        }
        // Only the codes the kernels take (the `vpmaddubsw` sets for narrow codes).
        shapes.retain(|s| s.2 <= max_code);
        for (bias, lo, hi, smin, smax) in shapes {
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
                match fold {
                    // The writer the tier names, checked against the reference.
                    Some(fold) => {
                        let mut want = w;
                        want.fold_row(row, bias);
                        fold(&mut w, row, bias);
                        assert_eq!(w.xcodes, want.xcodes, "{name} folded row {row}");
                    }
                    None => w.expand_row(row, bias),
                }
            }
            let mut a2 = *a;
            a2.codes.reverse();
            let mut a3 = *a;
            a3.codes.rotate_left(64);
            let panels: Vec<ABlock> = [*a, a2, a3]
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
            let start = [0.5f32, 0.25, -1.0].map(|v| [[v; IG_NR]; IG_MR]);
            let mut want = start;
            for (p, acc) in panels.iter().zip(want.iter_mut()) {
                (SCALAR.one[Kind::Int16.index()])(&w, p, acc, 256);
            }
            let [mut g1, mut g2, mut g3] = start;
            narrow(&w, [&panels[0], &panels[1]], [&mut g1, &mut g2], 256);
            for (x, y) in want.iter().flatten().flatten().zip(g1.iter().chain(&g2).flatten()) {
                assert_eq!(x.to_bits(), y.to_bits(), "{name} narrow pair, bias {bias}");
            }
            if let Some(triple) = triple {
                let [mut g1, mut g2, _] = start;
                triple(&w, [&panels[0], &panels[1], &panels[2]], [&mut g1, &mut g2, &mut g3], 256);
                let got = g1.iter().chain(&g2).chain(&g3).flatten();
                for (x, y) in want.iter().flatten().flatten().zip(got) {
                    assert_eq!(x.to_bits(), y.to_bits(), "{name} narrow triple, bias {bias}");
                }
            }
        }
    }

    /// The block-diagonal weights: each 64 K values as two 16-row halves, a row's first 32
    /// signed weights (code - bias) in the first half's row, its last 32 in the second's, zeros
    /// elsewhere.
    #[test]
    fn expanded_codes_are_block_diagonal() {
        let mut w: WBand = bytemuck::Zeroable::zeroed();
        w.xcodes.fill(0xAA);
        for (i, c) in w.codes.iter_mut().enumerate() {
            *c = (i % 251) as u8 + 1;
        }
        for r in 0..IG_MR {
            w.expand_row(r, 128);
        }
        for t in 0..QK_K / 64 {
            for h in 0..2 {
                for r in 0..IG_MR {
                    let row = &w.xcodes[(t * 16 + h * 8 + r) * 64..][..64];
                    for (e, &v) in row.iter().enumerate() {
                        let code = w.codes[r * QK_K + 64 * t + e] as i32;
                        let want = if e / 32 == h { (code - 128) as i8 as u8 } else { 0 };
                        assert_eq!(v, want, "t {t} h {h} r {r} e {e}");
                    }
                }
            }
        }
    }

    /// The formats' kinds: the integer kinds (whose pair and triple kernels rely on the 16-bit
    /// bounds) only for the formats that have those bounds.
    #[test]
    fn formats_take_their_kinds() {
        use crate::quant::unpack::int_format;
        let want = [
            (DType::Q2_K, Kind::Int16Min),
            (DType::Q3_K, Kind::Int16),
            (DType::IQ1_M, Kind::Int16),
            (DType::Q4_K, Kind::Flt32Min),
            (DType::Q5_K, Kind::Flt32Min),
            (DType::Q6_K, Kind::Flt16),
            (DType::IQ2_S, Kind::Flt16),
            (DType::IQ4_XS, Kind::Flt32),
            (DType::IQ3_XXS, Kind::Flt32),
            (DType::TQ2_0, Kind::Flt32),
            (DType::Q4_0, Kind::Blk32),
            (DType::Q4_1, Kind::Blk32Min),
            (DType::Q8_0, Kind::Blk32),
            (DType::MXFP4, Kind::Blk32),
        ];
        for (dt, kind) in want {
            let fmt = int_format(dt).expect("an integer form");
            assert_eq!(Kind::of(&fmt), kind, "{dt}");
        }
        for dt in DType::ALL.iter().copied() {
            if let Some(fmt) = int_format(dt) {
                let kind = Kind::of(&fmt);
                let int = matches!(kind, Kind::Int16 | Kind::Int16Min);
                assert_eq!(int, fmt.narrow_sums || fmt.unit_scales, "{dt}");
                assert_eq!(kind.blocks(), fmt.float_scales(), "{dt}");
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

    /// The band and panels a kind's kernels see from the formats (the tile tier's block
    /// kernels rely on it: `expand_codes`): for `Blk32`, codes with a bias of 128 and each
    /// sub-block's level sums times it in `bsums`, as the packer writes them; for `Blk32Min`,
    /// codes below 128 and no bias, as Q4_1 and Q5_1 have. Other kinds and tiers: as given.
    fn block_data(kind: Kind, expand: bool, w: &WBand, p: [ABlock; 3]) -> (WBand, [ABlock; 3]) {
        let (mut w, mut p) = (*w, p);
        if !expand || !matches!(kind, Kind::Blk32 | Kind::Blk32Min) {
            return (w, p);
        }
        let bias = if kind == Kind::Blk32 { 128 } else { 0 };
        if bias == 0 {
            for c in w.codes.iter_mut() {
                *c &= 127;
            }
        }
        for row in 0..IG_MR {
            w.expand_row(row, bias);
        }
        for a in p.iter_mut() {
            for c in 0..IG_NR {
                for j in 0..QK_K / 32 {
                    // Sub-block j of 32 levels is groups 8 j .. 8 j + 8 of four.
                    let levels: i32 = (8 * j..8 * j + 8)
                        .flat_map(|g| &a.codes[g * 64 + c * 4..g * 64 + c * 4 + 4])
                        .map(|&v| v as i32)
                        .sum();
                    a.bsums[j * IG_NR + c] = levels * bias;
                }
            }
        }
        (w, p)
    }

    /// Every block format's integer weights `code - bias` lie inside `i8`, the tile tier's
    /// signed block-diagonal weights (`WBand::expand_row`).
    #[test]
    fn block_formats_weights_fit_i8() {
        use crate::quant::unpack::int_format;
        for d in DType::ALL {
            let Some(fmt) = int_format(d) else { continue };
            if !fmt.float_scales() {
                continue;
            }
            let (lo, hi) = (-fmt.bias, fmt.max_code as i32 - fmt.bias);
            assert!(lo >= -128 && hi <= 127, "{d}: weights {lo}..={hi}");
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
            // The narrow-code forms, each at the widest codes it is picked for (every code the
            // mask lets through, so the extreme cases reach each form's int16 bound).
            let narrow: Vec<(String, IgemmKernels)> = sets
                .iter()
                .filter(|(_, k)| k.narrow.is_some())
                .flat_map(|(name, k)| {
                    [3u8, 7, 15, 31, 63, 127].map(|m| {
                        (
                            format!("{name} codes <= {m}"),
                            IgemmKernels { max_code: m, ..k.for_codes(m) },
                        )
                    })
                })
                .collect();
            sets.extend(narrow);
            for (name, k) in sets {
                // Codes as large as the kernels take (extremes stay extreme).
                let mut w = w;
                for c in w.codes.iter_mut() {
                    *c &= k.max_code;
                }
                // The integer-scaled forms' mins (for a bias `bias * scales[j]`, up to 255 * 128
                // in size) on the tiers that run them.
                if k.int_scaled.is_some() {
                    for m in w.mins.iter_mut() {
                        *m *= 255;
                    }
                }
                // As the unpacker leaves them (stale block-diagonal codes would fail the tile
                // kernels; bias 128 keeps any code inside i8).
                for row in 0..IG_MR {
                    if k.int_scaled.is_some() {
                        w.pair_up(row);
                    }
                    w.expand_row(row, 128);
                }
                // The second and third panels: the first with its columns reversed, and with
                // its levels rotated by one group.
                let mut a2 = a;
                a2.d.reverse();
                a2.ds.reverse();
                a2.ms.reverse();
                a2.bsums.reverse();
                a2.codes.reverse();
                let mut a3 = a;
                a3.codes.rotate_left(64);
                a3.d.rotate_left(5);
                a3.ds.rotate_left(3);
                for c in 0..IG_NR {
                    pack_pairs(&mut a2, c, 8);
                    pack_pairs(&mut a3, c, 8);
                }
                // The unit-scale forms: Int16Min's integers when every scale is 1; on the tiers
                // that fold, also Q4_K's and Q5_K's shapes (codes 0..=31, scales and mins
                // 0..=63, each repeated over two sub-blocks of 16) on the folded weights.
                let unit = Kind::Int16Min.index();
                let mut mins_shapes = vec![false];
                if k.fold_scales.is_some() {
                    mins_shapes.push(true);
                }
                for wide in mins_shapes {
                    if k.two[unit].is_none() && k.three[unit].is_none() {
                        break;
                    }
                    let mut wu = w;
                    if wide {
                        for c in wu.codes.iter_mut() {
                            *c &= 31;
                        }
                        for r in 0..IG_MR {
                            for j in 0..16 {
                                let at = r * 16 + j;
                                wu.scales[at] = w.scales[r * 16 + j / 2].rem_euclid(64);
                                wu.mins[at] = w.mins[r * 16 + j / 2].rem_euclid(64);
                            }
                        }
                    } else {
                        wu.scales.fill(1);
                    }
                    for row in 0..IG_MR {
                        wu.pair_up(row);
                        if let Some(fold) = k.fold_scales {
                            fold(&mut wu, row, 0);
                        }
                    }
                    let start = [0.5f32, 0.25, -1.0].map(|v| [[v; IG_NR]; IG_MR]);
                    let mut want = start;
                    for (p, acc) in [&a, &a2, &a3].into_iter().zip(want.iter_mut()) {
                        (SCALAR.one[unit])(&wu, p, acc, 256);
                    }
                    let check = |got: &[Tile], what: &str| {
                        let all = want.iter().flatten().flatten();
                        for (x, y) in all.zip(got.iter().flatten().flatten()) {
                            assert_eq!(x.to_bits(), y.to_bits(), "{name} unit {what} {wide}");
                        }
                    };
                    if let Some(two) = k.two[unit] {
                        let [mut g1, mut g2, _] = start;
                        two(&wu, [&a, &a2], [&mut g1, &mut g2], 256);
                        check(&[g1, g2], "pair");
                    }
                    if let Some(three) = k.three[unit] {
                        let [mut g1, mut g2, mut g3] = start;
                        three(&wu, [&a, &a2, &a3], [&mut g1, &mut g2, &mut g3], 256);
                        check(&[g1, g2, g3], "triple");
                    }
                }
                if let Some(narrow) = k.two[Kind::Int16.index()] {
                    let triple = k.three[Kind::Int16.index()];
                    let fold = k.fold_scales;
                    let kernels = (narrow, triple, fold);
                    narrow_pair_is_sub16(&name, kernels, k.max_code, &w, &a, extreme);
                }
                for kind in Kind::ALL {
                    let i = kind.index();
                    let (w, [a, a2, a3]) = block_data(kind, k.expand_codes, &w, [a, a2, a3]);
                    let panels = [a, a2, a3];
                    // Whole steps, and (block types) the partial last steps of rows.
                    let lens: &[usize] = if kind.blocks() { &[256, 32, 64, 160] } else { &[256] };
                    for &len in lens {
                        let start = [0.5f32, 0.25, -1.0].map(|v| [[v; IG_NR]; IG_MR]);
                        let mut want = start;
                        for (p, acc) in panels.iter().zip(want.iter_mut()) {
                            (SCALAR.one[i])(&w, p, acc, len);
                        }
                        let mut got = start[0];
                        (k.one[i])(&w, &a, &mut got, len);
                        for (x, y) in want[0].iter().flatten().zip(got.iter().flatten()) {
                            assert_eq!(x.to_bits(), y.to_bits(), "{name} {kind:?} {len}");
                        }
                        let check = |got: &[Tile], what: &str| {
                            let all = want.iter().flatten().flatten();
                            for (x, y) in all.zip(got.iter().flatten().flatten()) {
                                assert_eq!(
                                    x.to_bits(),
                                    y.to_bits(),
                                    "{name} {what} {kind:?} {len}"
                                );
                            }
                        };
                        // The multi-panel forms: each panel as the one-panel kernel gives it
                        // (the integer kinds' pairs take shaped data, above, but on the tiers
                        // that run the integer-scaled forms: those tiers' pairs take any data,
                        // and `Kind::Int16Min` then takes scales of 8 bits and mins of 16).
                        let shaped =
                            matches!(kind, Kind::Int16 | Kind::Int16Min) && k.int_scaled.is_none();
                        if let (Some(pair), false) = (k.two[i], shaped) {
                            let [mut g1, mut g2, _] = start;
                            pair(&w, [&a, &a2], [&mut g1, &mut g2], len);
                            check(&[g1, g2], "pair");
                        }
                        let int = matches!(kind, Kind::Int16 | Kind::Int16Min);
                        if let (Some(three), false) = (k.three[i], int) {
                            let [mut g1, mut g2, mut g3] = start;
                            three(&w, [&a, &a2, &a3], [&mut g1, &mut g2, &mut g3], len);
                            check(&[g1, g2, g3], "triple");
                        }
                    }
                }
            }
        }
    }
}
