//! Integer GEMM micro-kernels (`kernels::igemm`) with AMX-INT8 tiles and AVX-512. Needs
//! AMX-TILE and AMX-INT8 with the operating system's permission to use the tile data (asked
//! for once by `CpuFeatures::detect`) on top of the AVX-512 tier with VNNI; `plug` installs
//! them only where [`Amx::detect`](super::Amx::detect) finds all of that.
//!
//! A panel block's level groups are a `tdpbusd` B tile as they lie (`ABlock::codes` is the
//! VNNI layout: the 4 levels of the 16 columns per 64-byte row, 16 rows per 64 K values). The A
//! tile is 16 rows of the band (`WBand::xcodes`, written by the unpacker for this tier), in one
//! of two layouts:
//!
//! - Super-block formats (`IntFormat::for_tier`, the integer kinds) fold their sub-block scales
//!   into the weights: `v = (code - bias) * scale`, within 2^14 in magnitude, written as a `hi`
//!   and a `lo` byte (`v = 128 hi + lo`, [`fold_row`]) in rows 0..8 and 8..16 of each 64 K
//!   values. Four signed products (`tdpbssd`, 16 x 16 x 64, the unit's full shape) sum a whole
//!   step, one store per panel, and `128 hi + lo` is the portable kernel's scaled int32 sum
//!   exactly; the mins' sums and the float steps follow on AVX-512.
//! - Block formats with sub-blocks of 32, whose float scales cannot fold, take block-diagonal
//!   weights: for 64 K values, rows 0..8 hold the first 32 weights `code - bias` (signed bytes,
//!   `WBand::expand_row`) of the band's rows and zeros, rows 8..16 zeros and the last 32, so one
//!   `tdpbssd` gives two sub-blocks' bias-corrected sums apart: the portable kernel's
//!   `raw_sums` plus its `-bias * level sum` correction, the same integers, with no correction
//!   left for the vector unit (4096 x 512 x 14336, 4 alternating rounds against the unsigned
//!   codes and the correction: q4_0 1.14x, q8_0 1.17x, q5_0 1.11x, mxfp4 1.09x, iq4_nl 1.08x). A
//!   tile product costs about the same whatever its shape, and storing the sums for the vector
//!   unit costs as much again, so the full shape halves both against a product per sub-block.
//!
//! The sums go through a buffer on the stack, then AVX-512 applies the scales with the float
//! steps of the VNNI kernels (`scale_sub`, `finish_sums`, `add_rows`, `mins_sums`: the same
//! operations in the same order), so the bits are the portable kernels'.
//!
//! Tile configurations are per thread: each kernel loads its own (one per product shape) unless
//! the thread already holds it ([`ensure_config`]); [`release`], which the integer GEMM calls
//! when a block starts and ends, gives the tile state back, so a block never runs on a
//! configuration that other code of the thread loaded in between.

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::Cell;
use std::mem::MaybeUninit;

use super::avx512_igemm::{add_rows, finish_sums, mins_sums, scale_sub, start_sums};
use crate::dtype::QK_K;
use crate::kernels::igemm::{ABlock, IG_MR, IG_NR, IgemmKernels, Kind, Tile, WBand, used_subs};

/// The AMX tier's kernels, by `igemm::Kind`: the tile unit for the two- and three-panel forms
/// of the integer kinds, which this tier runs every super-block format as (`IntFormat::for_tier`:
/// the scales folded into signed weights split in two bytes, [`fold_row`], so a whole step sums
/// in the tile with one store), and for the block kinds with sub-blocks of 32 (block-diagonal
/// codes, the sums of every sub-block stored and scaled in f32); the AVX-512 VNNI kernels for
/// the rest (one-panel forms of the integer kinds, `Kind::Blk16`, and the float-scaled
/// super-block kinds, which no format takes here). Before the folding, the block-diagonal
/// products served the float-scaled kinds with sub-blocks of 32 (1.05-1.37x the VNNI kernels);
/// for sub-blocks of 16 they measured 0.50-0.73x the VNNI kernels (Q3_K, Q6_K, IQ2_S prefill, 4
/// alternating rounds: each product's 1 KiB of sums stored for the vector unit costs more than
/// the `vpdpbusd` it saves), which the folded products, one store per step, do not pay.
pub(crate) const AMX: IgemmKernels = {
    let mut k = super::avx512_igemm::VNNI;
    k.one[Kind::Blk32.index()] = one::<false>;
    k.one[Kind::Blk32Min.index()] = one::<true>;
    k.two[Kind::Int16.index()] = Some(amx_fold::<2, false>);
    k.two[Kind::Int16Min.index()] = Some(amx_fold::<2, true>);
    k.two[Kind::Blk32.index()] = Some(amx_multi::<2, false>);
    k.two[Kind::Blk32Min.index()] = Some(amx_multi::<2, true>);
    k.three[Kind::Int16.index()] = Some(amx_fold::<3, false>);
    k.three[Kind::Int16Min.index()] = Some(amx_fold::<3, true>);
    k.three[Kind::Blk32.index()] = Some(amx_multi::<3, false>);
    k.three[Kind::Blk32Min.index()] = Some(amx_multi::<3, true>);
    k.release = Some(release);
    k.expand_codes = true;
    k.fold_scales = Some(fold_row);
    k
};

/// A tile configuration (palette 1) as `ldtilecfg` reads it.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

/// The configuration with `a_rows` rows of 64 bytes in tmm3 (the band's codes) and in the sums
/// tmm0..tmm2 (up to three panels' int32), and 16 rows of 64 bytes (64 K values of a panel's
/// levels) in tmm4..tmm7 (the BF16 tile kernels, `amx_bf16`, use all eight as 16 x 64 bytes).
const fn config(a_rows: usize) -> TileConfig {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut t = 0;
    while t < 8 {
        c[16 + 2 * t] = 64;
        c[48 + t] = if t < 4 { a_rows as u8 } else { 16 };
        t += 1;
    }
    TileConfig(c)
}

/// The configurations, by [`ensure_config`]'s index: 16-row products (the band's
/// block-diagonal codes or its folded weights).
static CONFIGS: [TileConfig; 1] = [config(2 * IG_MR)];
/// [`CONFIGS`] index of the 16-row products ([`tile_sums`], [`tile_fold_sums`]).
const FULL: usize = 0;

thread_local! {
    /// One more than the [`CONFIGS`] index this thread's tiles hold (0: none of ours).
    static LOADED: Cell<usize> = const { Cell::new(0) };
}

/// Loads configuration `CFG` of [`CONFIGS`] unless this thread holds it.
#[inline(always)]
fn ensure_config<const CFG: usize>() {
    if LOADED.get() != CFG + 1 {
        let cfg = &CONFIGS[CFG];
        // SAFETY: `plug` installs the kernels that call this only where `Amx::detect` found
        // AMX-TILE with the tile data permitted; the 64 bytes at `cfg` are a valid palette-1
        // configuration (at most 16 rows of at most 64 bytes, reserved bytes zero).
        unsafe { asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly)) };
        LOADED.set(CFG + 1);
    }
}

/// Loads the configuration with every tile 16 rows of 64 bytes unless this thread holds it.
pub(super) fn ensure_full_config() {
    ensure_config::<FULL>();
}

/// Gives this thread's tile state back (`tilerelease`); the next kernel call loads its
/// configuration anew.
pub(super) fn release() {
    if LOADED.get() != 0 {
        // SAFETY: as in `ensure_config`; `tilerelease` only returns the tiles to their initial
        // state.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
        LOADED.set(0);
    }
}

/// Raw sums of one band's sub-blocks of 32, `[panel][sub-block][row]` rows of 16 int32,
/// written by the tile unit before they are read (left uninitialised: nothing reads a row the
/// tile unit did not store, and zeroing 12 KiB per call would be pure overhead).
#[repr(C, align(64))]
struct RawSums<const P: usize>([[[[i32; IG_NR]; IG_MR]; 8]; P]);

/// Where row `r` of panel `p`'s sums of sub-block `j` lies in a [`RawSums`] at `raw`.
#[inline(always)]
fn raw_at(raw: *mut i32, p: usize, j: usize, r: usize) -> *mut i32 {
    raw.wrapping_add(((p * 8 + j) * IG_MR + r) * IG_NR)
}

/// One tile product per panel (`P` of 1..=3), `$op` (`tdpbusd`: unsigned A, or `tdpbssd`:
/// signed A, both times signed B): with `ZERO` the sums tmm0.. start from zero; A
/// (tmm3) is loaded from `$w` with row stride `$ws`, panel `p`'s 16 level rows from `$a[p]`
/// (stride 64); with `STORE` the sums are stored to `$c[p]` (stride 64). Expanded inside the
/// kernels' `unsafe` blocks.
macro_rules! tile_products {
    ($op:literal, $w:expr, $ws:expr, $a:expr, $c:expr, $zero:expr, $store:expr) => {
        let (w, ws, a, c) = ($w, $ws, $a, $c);
        match P {
            1 => {
                if $zero { asm!("tilezero tmm0", options(nostack, nomem)) }
                asm!(
                    "tileloadd tmm3, [{w} + {ws}]",
                    "tileloadd tmm4, [{a0} + {s}]",
                    concat!($op, " tmm0, tmm3, tmm4"),
                    w = in(reg) w, ws = in(reg) ws, s = in(reg) 64usize, a0 = in(reg) a[0],
                    options(nostack, readonly),
                );
                if $store {
                    asm!(
                        "tilestored [{c0} + {s}], tmm0",
                        s = in(reg) 64usize, c0 = in(reg) c[0], options(nostack),
                    );
                }
            }
            2 => {
                if $zero { asm!("tilezero tmm0", "tilezero tmm1", options(nostack, nomem)) }
                asm!(
                    "tileloadd tmm3, [{w} + {ws}]",
                    "tileloadd tmm4, [{a0} + {s}]",
                    "tileloadd tmm5, [{a1} + {s}]",
                    concat!($op, " tmm0, tmm3, tmm4"),
                    concat!($op, " tmm1, tmm3, tmm5"),
                    w = in(reg) w, ws = in(reg) ws, s = in(reg) 64usize,
                    a0 = in(reg) a[0], a1 = in(reg) a[1 % P],
                    options(nostack, readonly),
                );
                if $store {
                    asm!(
                        "tilestored [{c0} + {s}], tmm0",
                        "tilestored [{c1} + {s}], tmm1",
                        s = in(reg) 64usize, c0 = in(reg) c[0], c1 = in(reg) c[1 % P],
                        options(nostack),
                    );
                }
            }
            _ => {
                if $zero {
                    asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", options(nostack, nomem))
                }
                asm!(
                    "tileloadd tmm3, [{w} + {ws}]",
                    "tileloadd tmm4, [{a0} + {s}]",
                    "tileloadd tmm5, [{a1} + {s}]",
                    "tileloadd tmm6, [{a2} + {s}]",
                    concat!($op, " tmm0, tmm3, tmm4"),
                    concat!($op, " tmm1, tmm3, tmm5"),
                    concat!($op, " tmm2, tmm3, tmm6"),
                    w = in(reg) w, ws = in(reg) ws, s = in(reg) 64usize,
                    a0 = in(reg) a[0], a1 = in(reg) a[1 % P], a2 = in(reg) a[2 % P],
                    options(nostack, readonly),
                );
                if $store {
                    asm!(
                        "tilestored [{c0} + {s}], tmm0",
                        "tilestored [{c1} + {s}], tmm1",
                        "tilestored [{c2} + {s}], tmm2",
                        s = in(reg) 64usize,
                        c0 = in(reg) c[0], c1 = in(reg) c[1 % P], c2 = in(reg) c[2 % P],
                        options(nostack),
                    );
                }
            }
        }
    };
}

/// The raw sums of sub-blocks `2 t` and `2 t + 1` (of 32 K values; `t < 4`) of band `w`
/// against the `P` panels `a` into `raw`: one signed product of the band's block-diagonal
/// weights of the 64 K values `t` (`WBand::xcodes`, 16 rows) and each panel's 16 level rows
/// gives sub-block `2 t` in rows 0..8 and `2 t + 1` in rows 8..16, stored as they are.
#[inline(always)]
fn tile_sums<const P: usize>(
    w: &WBand,
    a: [&ABlock; P],
    t: usize,
    raw: &mut MaybeUninit<RawSums<P>>,
) {
    ensure_config::<FULL>();
    debug_assert!(t < QK_K / 64 && (1..=3).contains(&P));
    {
        let ap: [*const i8; P] = a.map(|p| p.codes[t * 1024..].as_ptr());
        let cp: [*mut i32; P] =
            std::array::from_fn(|p| raw_at(raw.as_mut_ptr().cast(), p, 2 * t, 0));
        let wp = w.xcodes[t * 1024..].as_ptr();
        // SAFETY: the tiles are configured for these shapes (`ensure_config`) on a CPU with
        // AMX-INT8 (`plug`). A reads 16 rows of 64 bytes at `xcodes[t * 1024..]` and each B 16
        // rows of 64 bytes at the panel's `codes[t * 1024..]`: inside both (4096 bytes, t < 4).
        // Each store writes 16 rows of 64 bytes from `raw_at(.., p, 2 t, 0)`, the rows of
        // sub-blocks 2 t and 2 t + 1 (p < P, 2 t + 1 < 8: inside the buffer, 64-byte
        // aligned). Compiled code does not use the tile registers.
        unsafe {
            tile_products!("tdpbssd", wp, 64usize, ap, cp, true, true);
        }
    }
}

/// The folded sums of the whole step (256 K values) of band `w` against the `P` panels `a`,
/// into sub-blocks 0 and 1's rows of `raw`: four signed products of 64 K values of the band's
/// folded weights (`WBand::fold_row`: 16 rows, the `hi` bytes then the `lo` bytes) summed in
/// the tile, then stored (`hi` sums as sub-block 0, `lo` sums as sub-block 1).
#[inline(always)]
fn tile_fold_sums<const P: usize>(w: &WBand, a: [&ABlock; P], raw: &mut MaybeUninit<RawSums<P>>) {
    ensure_config::<FULL>();
    debug_assert!((2..=3).contains(&P));
    let cp: [*mut i32; P] = std::array::from_fn(|p| raw_at(raw.as_mut_ptr().cast(), p, 0, 0));
    for t in 0..QK_K / 64 {
        let ap: [*const i8; P] = a.map(|p| p.codes[t * 1024..].as_ptr());
        let wp = w.xcodes[t * 1024..].as_ptr();
        // SAFETY: as in `tile_sums` (the same 16-row shapes and the same bytes read); the
        // stores after the last product write 16 rows of 64 bytes from `raw_at(.., p, 0, 0)`,
        // the rows of sub-blocks 0 and 1.
        unsafe {
            tile_products!("tdpbssd", wp, 64usize, ap, cp, t == 0, t == QK_K / 64 - 1);
        }
    }
}

/// Row `r` of panel `p`'s raw sums of sub-block `j`, one lane per column, from sums that
/// [`tile_sums`] wrote (`p < P`, `j` below its `nsub`, `r < 8`).
#[inline(always)]
fn raw_row<const P: usize>(raw: &MaybeUninit<RawSums<P>>, p: usize, j: usize, r: usize) -> __m512i {
    debug_assert!(p < P && j < 8 && r < IG_MR);
    let at = raw_at(raw.as_ptr().cast_mut().cast(), p, j, r);
    // SAFETY: the row is 16 int32 inside the 64-byte aligned buffer (rows of 64 bytes), which
    // `tile_sums` wrote for this panel and sub-block.
    unsafe { _mm512_load_si512(at.cast()) }
}

/// The one-panel form of [`amx_multi`].
fn one<const MIN: bool>(w: &WBand, a: &ABlock, acc: &mut Tile, len: usize) {
    amx_multi::<1, MIN>(w, [a], [acc], len)
}

/// The block kinds' kernel with sub-blocks of 32 (`Kind::Blk32`, with `MIN` `Kind::Blk32Min`)
/// for `P` panels (see `vnni_multi` of the AVX-512 tier, whose float steps this repeats): the
/// tile unit's bias-corrected sums of every sub-block that holds data, then, the band's rows 4
/// at a time, each sub-block's scaling into the tile.
fn amx_multi<const P: usize, const MIN: bool>(
    w: &WBand,
    a: [&ABlock; P],
    acc: [&mut Tile; P],
    len: usize,
) {
    // SAFETY: `plug` installs this kernel only where `Amx::detect` found AMX-INT8 with the tile
    // data permitted and the AVX-512 tier with VNNI; the references cover every byte the
    // kernel reads and writes (fixed-size arrays).
    unsafe { amx_multi_kernel::<P, MIN>(w, a, acc, len) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")]
fn amx_multi_kernel<const P: usize, const MIN: bool>(
    w: &WBand,
    a: [&ABlock; P],
    acc: [&mut Tile; P],
    len: usize,
) {
    // Rows per pass (read by the shared macros).
    const R: usize = 4;
    let nsub = used_subs(len, 32);
    let mut raw = MaybeUninit::<RawSums<P>>::uninit();
    // Every product first: computing the next chunk's products while scaling this chunk's
    // sums measured 10-18% slower (6 alternating rounds).
    for t in 0..nsub / 2 {
        tile_sums::<P>(w, a, t, &mut raw);
    }
    let out: [*mut f32; P] = acc.map(|t| t.as_mut_ptr() as *mut f32);
    for r0 in (0..IG_MR).step_by(R) {
        let mut s = start_sums!(out, r0, true);
        for j in 0..nsub {
            let mut sums = [[_mm512_setzero_si512(); R]; P];
            for (p, sums) in sums.iter_mut().enumerate() {
                for (r, v) in sums.iter_mut().enumerate() {
                    *v = raw_row(&raw, p, j, r0 + r);
                }
            }
            scale_sub!(w, a, j, r0, sums, s, MIN, true);
        }
        finish_sums!(w, a, out, r0, s, nsub, MIN, true);
    }
}

/// Writes row `r` of the band's folded weights (`WBand::fold_row`, the same bytes) with
/// AVX-512: per 64 codes, two 32-lane 16-bit products of the bias-corrected codes and their
/// sub-blocks' scales, split by a shift and a mask and narrowed to bytes.
fn fold_row(w: &mut WBand, r: usize, bias: i32) {
    // SAFETY: `plug` installs the AMX table (which names this writer) only where the AVX-512
    // tier with BW runs.
    unsafe { fold_row_avx512(w, r, bias) }
}

#[target_feature(enable = "avx512f,avx512bw")]
fn fold_row_avx512(w: &mut WBand, r: usize, bias: i32) {
    assert!(r < IG_MR);
    // The narrow formats' scales and bias are far inside 16 bits; the products stay exact
    // below 2^14 in magnitude (`fold_row`'s bound).
    let (b16, low7) = (_mm512_set1_epi16(bias as i16), _mm512_set1_epi16(127));
    for t in 0..QK_K / 64 {
        let codes: &[u8; 64] = w.codes[r * QK_K + 64 * t..][..64].try_into().expect("64 codes");
        // SAFETY: `codes` is 64 bytes.
        let c = unsafe { _mm512_loadu_si512(codes.as_ptr().cast()) };
        let sc = &w.scales[r * 16 + 4 * t..][..4];
        for half in 0..2 {
            let bytes = if half == 0 {
                _mm512_castsi512_si256(c)
            } else {
                _mm512_extracti64x4_epi64::<1>(c)
            };
            let x = _mm512_sub_epi16(_mm512_cvtepu8_epi16(bytes), b16);
            let s = _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm256_set1_epi16(sc[2 * half] as i16)),
                _mm256_set1_epi16(sc[2 * half + 1] as i16),
            );
            let v = _mm512_mullo_epi16(x, s);
            let hi = _mm512_cvtepi16_epi8(_mm512_srai_epi16::<7>(v));
            let lo = _mm512_cvtepi16_epi8(_mm512_and_si512(v, low7));
            let (rh, rl) = ((t * 16 + r) * 64 + 32 * half, (t * 16 + IG_MR + r) * 64 + 32 * half);
            // SAFETY: each destination is a 32-byte slice of `xcodes`.
            unsafe {
                _mm256_storeu_si256(w.xcodes[rh..rh + 32].as_mut_ptr().cast(), hi);
                _mm256_storeu_si256(w.xcodes[rl..rl + 32].as_mut_ptr().cast(), lo);
            }
        }
    }
}

/// The integer kinds' kernel for `P` (two or three) panels on the band's folded weights
/// (`IgemmKernels::fold_scales`; `Kind::Int16`, with `MIN` `Kind::Int16Min`): the tile unit
/// sums the whole step's `hi` and `lo` products, and `128 * hi + lo` is the scaled,
/// bias-corrected int32 sum `s1` of the portable kernel exactly; then the mins' sums (with
/// `MIN`) and the float steps of the VNNI kernels, so the bits are the portable kernel's.
fn amx_fold<const P: usize, const MIN: bool>(
    w: &WBand,
    a: [&ABlock; P],
    acc: [&mut Tile; P],
    len: usize,
) {
    // SAFETY: as `amx_multi`.
    unsafe { amx_fold_kernel::<P, MIN>(w, a, acc, len) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")]
fn amx_fold_kernel<const P: usize, const MIN: bool>(
    w: &WBand,
    a: [&ABlock; P],
    acc: [&mut Tile; P],
    len: usize,
) {
    const R: usize = 4;
    debug_assert_eq!(len, QK_K);
    let mut raw = MaybeUninit::<RawSums<P>>::uninit();
    tile_fold_sums::<P>(w, a, &mut raw);
    let out: [*mut f32; P] = acc.map(|t| t.as_mut_ptr() as *mut f32);
    for p in 0..P {
        for r0 in (0..IG_MR).step_by(R) {
            let mut sums = [_mm512_setzero_ps(); R];
            for (r, f) in sums.iter_mut().enumerate() {
                let (hi, lo) = (raw_row(&raw, p, 0, r0 + r), raw_row(&raw, p, 1, r0 + r));
                *f = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32::<7>(hi), lo));
            }
            let mut s2 = [_mm512_setzero_si512(); R];
            if MIN {
                mins_sums!(w, a[p], QK_K / 16, r0, s2);
            }
            add_rows!(w, a[p], out[p], r0, sums, s2, MIN);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::igemm::RowFn;
    use crate::kernels::{Isa, table_for};

    /// The tier's table: the tile kernels for the block kinds with sub-blocks of 32 and the
    /// integer kinds' pairs and triples (on folded weights), the VNNI kernels for the other
    /// kinds, both the block-diagonal codes and the folded weights asked for and the tile state
    /// released; every super-block format runs as an integer kind here and as its own kind on
    /// the VNNI tier; and the AMX tier's table holds it where the CPU runs the tier.
    #[test]
    fn amx_table_puts_the_block_kinds_and_folded_formats_on_tiles() {
        let vnni = super::super::avx512_igemm::VNNI;
        let tiles = [Kind::Blk32, Kind::Blk32Min];
        for kind in Kind::ALL {
            let i = kind.index();
            let own = tiles.contains(&kind);
            assert_eq!(AMX.one[i] as usize != vnni.one[i] as usize, own, "{kind:?} one");
            let three = |k: &IgemmKernels| k.three[i].map(|f| f as usize);
            let two = |k: &IgemmKernels| k.two[i].map(|f| f as usize);
            let own3 = own || matches!(kind, Kind::Int16Min | Kind::Int16);
            assert_eq!(three(&AMX) != three(&vnni), own3, "{kind:?} three");
            assert_eq!(two(&AMX) != two(&vnni), own3, "{kind:?} two");
        }
        assert!(AMX.expand_codes && AMX.release.is_some() && AMX.fold_scales.is_some());
        for dt in crate::dtype::DType::ALL.iter().copied() {
            let Some(fmt) = crate::quant::unpack::int_format(dt) else { continue };
            let here = fmt.for_tier(AMX.fold_scales.is_some());
            let want = match (fmt.float_scales(), fmt.has_min) {
                (true, _) => Kind::of(&fmt),
                (false, false) => Kind::Int16,
                (false, true) => Kind::Int16Min,
            };
            assert_eq!(Kind::of(&here), want, "{dt}");
            assert_eq!(here.widen, !fmt.float_scales() && fmt.sub == 32, "{dt}");
            assert_eq!(Kind::of(&fmt.for_tier(vnni.fold_scales.is_some())), Kind::of(&fmt), "{dt}");
            // The unpacker's row writer: the tier's folding for a folded form, else the
            // block-diagonal codes; none on the VNNI tier, whose kernels read the codes only.
            let writer = |k: IgemmKernels, f| k.for_format(&f).and_then(|k| k.row_writer);
            let want = if here.fold { AMX.fold_scales } else { Some(WBand::expand_row as RowFn) };
            assert_eq!(writer(AMX, here).map(|f| f as usize), want.map(|f| f as usize), "{dt}");
            assert!(writer(vnni, fmt).is_none(), "{dt}");
        }
        if let Some(t) = table_for(Isa::Amx) {
            let k = t.igemm.expect("the AMX tier has integer kernels");
            assert!(k.expand_codes, "the AMX tier's table holds the tile kernels");
            assert!(t.sgemm_bf16.is_none(), "BF16 on the f32 kernels");
        }
    }
}
