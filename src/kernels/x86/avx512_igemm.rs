//! Integer GEMM micro-kernels (`kernels::igemm`) with AVX-512 VNNI (`vpdpbusd`). Needs AVX-512
//! F, BW, DQ, VL and VNNI; `plug` installs them only where the CPU has those.
//!
//! One zmm lane per activation column: for each 4 K values, one load of a panel's 64 level
//! bytes serves the band's rows, each row's 4 codes broadcast into a `vpdpbusd` (unsigned codes
//! times signed levels, summed in int32 without saturation). The float kinds' kernels
//! ([`vnni_multi`]) take one, two or three panels at once (8, 8 or 12 independent `vpdpbusd`
//! chains, which hide the instruction's latency), start every chain from minus the panel's bias
//! sums (so the corrected sums need no subtraction per row) and scale each sub-block's sums in
//! f32; the integer kinds' ([`vnni`], [`vnni_narrow`], [`vnni_unit`]) keep the scaled sums in
//! int32. The integer sums equal the portable kernels', and the float steps are the same
//! operations in the same order (`add_rows`), so the bits are the same.

use std::arch::x86_64::*;

use crate::dtype::QK_K;
use crate::kernels::igemm::{ABlock, IG_MR, IG_NR, IgemmKernels, Tile, WBand, used_subs};

/// The raw int32 sums of sub-blocks `j` and `j + 1` (of `SUB` elements) for the band's 8 rows x
/// the panel's 16 columns: `[sub-block][row]`, one lane per column. Two sub-blocks at a time give
/// 16 independent `vpdpbusd` chains, which hide the instruction's latency. Expanded inside the
/// kernels (it needs their target features); `j + 1 < used_subs(..)`, which is even.
macro_rules! pair_sums {
    ($w:expr, $a:expr, $j:expr, $sub:expr) => {{
        let (wc, ac) = ($w.codes.as_ptr(), $a.codes.as_ptr());
        let mut raw = [[_mm512_setzero_si512(); IG_MR]; 2];
        for g in $j * $sub / 4..($j + 1) * $sub / 4 {
            let g2 = g + $sub / 4;
            // SAFETY: g, g2 < 64 (sub-blocks j, j + 1 < 256 / SUB), so the 64 bytes at g * 64
            // and g2 * 64 are inside `a.codes` (4096 bytes, 64-byte aligned).
            let (av0, av1) = unsafe {
                (
                    _mm512_load_si512(ac.add(g * 64) as *const __m512i),
                    _mm512_load_si512(ac.add(g2 * 64) as *const __m512i),
                )
            };
            for r in 0..IG_MR {
                // SAFETY: r < 8 and 4 * g2 + 4 <= 256: both 4-byte groups are inside row r's
                // codes.
                let (w0, w1) = unsafe {
                    (
                        (wc.add(r * QK_K + 4 * g) as *const i32).read_unaligned(),
                        (wc.add(r * QK_K + 4 * g2) as *const i32).read_unaligned(),
                    )
                };
                raw[0][r] = _mm512_dpbusd_epi32(raw[0][r], _mm512_set1_epi32(w0), av0);
                raw[1][r] = _mm512_dpbusd_epi32(raw[1][r], _mm512_set1_epi32(w1), av1);
            }
        }
        raw
    }};
}

/// Adds the mins' sums `sum_j mins[r][j] * bsums[j][c]` of the `nsub` sub-blocks to `s2` (an
/// array of `R` sums) for rows `r0..r0 + R`: by sub-block pairs when the panel's level sums fit
/// 16 bits (one `vpdpwssd` per row on the panel's level-sum pairs and the row's two mins; mins
/// are at most 6 bits), else one `vpmulld` per sub-block; the same integers either way.
/// Expanded inside the kernels (it needs their target features, and a call would take the
/// sums through memory).
macro_rules! mins_sums {
    ($w:expr, $a:expr, $nsub:expr, $r0:expr, $s2:ident) => {
        let (w, a): (&WBand, &ABlock) = ($w, $a);
        if crate::kernels::igemm::pairs_fit(a) {
            for i in 0..$nsub / 2 {
                // SAFETY: i < 8: the 16 entries at i * 16 are inside `a.bsum_pairs` (128
                // entries, 64-byte aligned rows of 16).
                let bs = unsafe {
                    _mm512_load_si512(a.bsum_pairs.as_ptr().add(i * IG_NR) as *const __m512i)
                };
                for (r, s) in $s2.iter_mut().enumerate() {
                    let mn = _mm512_set1_epi32(w.min_pairs[($r0 + r) * 8 + i]);
                    *s = _mm512_dpwssd_epi32(*s, bs, mn);
                }
            }
        } else {
            for j in 0..$nsub {
                // SAFETY: j < 16: the 16 sums at j * 16 are inside `a.bsums` (256 entries,
                // 64-byte aligned rows of 16).
                let bp = unsafe { a.bsums.as_ptr().add(j * IG_NR) };
                // SAFETY: as above.
                let bs = unsafe { _mm512_load_si512(bp as *const __m512i) };
                for (r, s) in $s2.iter_mut().enumerate() {
                    let mn = _mm512_set1_epi32(w.mins[($r0 + r) * 16 + j]);
                    *s = _mm512_add_epi32(*s, _mm512_mullo_epi32(bs, mn));
                }
            }
        }
    };
}

pub(super) use mins_sums;

/// Adds `(sums[r] * d[r] - dmin[r] * s2[r]) * da` (with `MIN`; else `sums[r] * d[r] * da`,
/// each product rounded) to tile rows `r0..r0 + R` at `out`, for `R` f32 `sums` and int32
/// mins' sums `s2` of panel `a`: the super-block kinds' float steps (`igemm` module notes).
/// Expanded inside the kernels (it needs their target features).
macro_rules! add_rows {
    ($w:expr, $a:expr, $out:expr, $r0:expr, $sums:expr, $s2:expr, $min:expr) => {
        let (w, a, out): (&WBand, &ABlock, *mut f32) = ($w, $a, $out);
        // SAFETY: `a.d` holds 16 floats.
        let da = unsafe { _mm512_loadu_ps(a.d.as_ptr()) };
        for (r, &sum) in $sums.iter().enumerate() {
            let ri = $r0 + r;
            let mut f = _mm512_mul_ps(sum, _mm512_set1_ps(w.d[ri]));
            if $min {
                f = _mm512_fnmadd_ps(_mm512_set1_ps(w.dmin[ri]), _mm512_cvtepi32_ps($s2[r]), f);
            }
            // SAFETY: `out` points at a tile's 8 rows of 16 floats; ri < 8.
            let row = unsafe { out.add(ri * IG_NR) };
            // SAFETY: as above.
            unsafe {
                _mm512_storeu_ps(row, _mm512_add_ps(_mm512_loadu_ps(row), _mm512_mul_ps(f, da)))
            };
        }
    };
}
pub(super) use add_rows;

/// Minus panel `a`'s bias sums of sub-block `j` (`j < 16`), one lane per column: where a
/// corrected sum's chain starts (or what is added to a raw sum). Expanded inside the kernels.
macro_rules! neg_bsums {
    ($a:expr, $j:expr) => {{
        // SAFETY: j < 16: the 16 sums at j * 16 are inside `bsums` (256 entries, 64-byte
        // aligned rows of 16).
        let bs = unsafe { _mm512_load_si512($a.bsums.as_ptr().add($j * IG_NR) as *const __m512i) };
        _mm512_sub_epi32(_mm512_setzero_si512(), bs)
    }};
}

/// The f32 sums a float kind's pass over rows `r0..r0 + R` of `P` panels starts from (`P`, `R`
/// from the kernel): the tiles' rows at `out` for the block kinds (which add every sub-block
/// to the tile), else zero. Expanded inside the kernels.
macro_rules! start_sums {
    ($out:expr, $r0:expr, $blk:expr) => {{
        let mut s = [[_mm512_setzero_ps(); R]; P];
        if $blk {
            for p in 0..P {
                for r in 0..R {
                    // SAFETY: out[p] points at a tile's 8 rows of 16 floats; r0 + r < 8.
                    s[p][r] = unsafe { _mm512_loadu_ps($out[p].add(($r0 + r) * IG_NR)) };
                }
            }
        }
        s
    }};
}
pub(super) use start_sums;

/// Adds sub-block `j`'s corrected int32 sums `raw` (`[panel][row]`, rows `r0..r0 + R`) to the
/// f32 sums `s` in the float kinds' order (`igemm` module notes): the block kinds scale by the
/// panel's `ds` and fma the row's float scale (and with `MIN`, Q8_1's `ms` times the row's float
/// min); the super-block float kinds fma the row's float scale. Expanded inside the kernels.
macro_rules! scale_sub {
    ($w:expr, $a:expr, $j:expr, $r0:expr, $raw:expr, $s:expr, $min:expr, $blk:expr) => {
        let (w, j) = ($w, $j);
        if $blk {
            for p in 0..P {
                // SAFETY: j < 16: the 16 entries at j * 16 are inside `ds` and `ms` (256
                // entries each).
                let (ds, ms) = unsafe {
                    (
                        _mm512_loadu_ps($a[p].ds.as_ptr().add(j * IG_NR)),
                        _mm512_loadu_ps($a[p].ms.as_ptr().add(j * IG_NR)),
                    )
                };
                for r in 0..R {
                    let ri = $r0 + r;
                    let f = _mm512_mul_ps(_mm512_cvtepi32_ps($raw[p][r]), ds);
                    let sc = _mm512_set1_ps(w.fscales[ri * 16 + j]);
                    $s[p][r] = _mm512_fmadd_ps(f, sc, $s[p][r]);
                    if $min {
                        let mn = _mm512_set1_ps(w.fmins[ri * 16 + j]);
                        $s[p][r] = _mm512_fmadd_ps(ms, mn, $s[p][r]);
                    }
                }
            }
        } else {
            for r in 0..R {
                let sc = _mm512_set1_ps(w.fscales[($r0 + r) * 16 + j]);
                for p in 0..P {
                    $s[p][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps($raw[p][r]), sc, $s[p][r]);
                }
            }
        }
    };
}
pub(super) use scale_sub;

/// Ends a float kind's pass over rows `r0..r0 + R`: the block kinds store their sums back to
/// the tiles; the super-block float kinds take the mins' sums (with `MIN`) and add their float
/// steps (`add_rows`). Expanded inside the kernels.
macro_rules! finish_sums {
    ($w:expr, $a:expr, $out:expr, $r0:expr, $s:expr, $nsub:expr, $min:expr, $blk:expr) => {
        for p in 0..P {
            if $blk {
                for r in 0..R {
                    // SAFETY: out[p] points at a tile's 8 rows of 16 floats; r0 + r < 8.
                    unsafe { _mm512_storeu_ps($out[p].add(($r0 + r) * IG_NR), $s[p][r]) };
                }
                continue;
            }
            // The mins' sums do not depend on the products: a pass of their own keeps the
            // product loop's register set to the raw and scaled sums.
            let mut s2 = [_mm512_setzero_si512(); R];
            if $min {
                mins_sums!($w, $a[p], $nsub, $r0, s2);
            }
            add_rows!($w, $a[p], $out[p], $r0, $s[p], s2, $min);
        }
    };
}
pub(super) use finish_sums;

/// The AVX-512 VNNI kernels, by `igemm::Kind`.
pub(crate) const VNNI: IgemmKernels = IgemmKernels {
    one: [
        vnni::<16, false>,
        vnni::<16, true>,
        multi1::<16, false, false>,
        multi1::<16, true, false>,
        multi1::<32, false, false>,
        multi1::<32, true, false>,
        multi1::<16, false, true>,
        multi1::<32, false, true>,
        multi1::<32, true, true>,
    ],
    two: [
        Some(vnni_narrow),
        Some(vnni_unit::<2>),
        Some(vnni_multi::<2, 4, 16, false, false>),
        Some(vnni_multi::<2, 4, 16, true, false>),
        Some(vnni_multi::<2, 4, 32, false, false>),
        Some(vnni_multi::<2, 4, 32, true, false>),
        Some(vnni_multi::<2, 4, 16, false, true>),
        Some(vnni_multi::<2, 4, 32, false, true>),
        Some(vnni_multi::<2, 4, 32, true, true>),
    ],
    three: [
        None,
        Some(vnni_unit::<3>),
        Some(vnni_multi::<3, 4, 16, false, false>),
        Some(vnni_multi::<3, 4, 16, true, false>),
        Some(vnni_multi::<3, 4, 32, false, false>),
        Some(vnni_multi::<3, 4, 32, true, false>),
        Some(vnni_multi::<3, 4, 16, false, true>),
        Some(vnni_multi::<3, 4, 32, false, true>),
        Some(vnni_multi::<3, 4, 32, true, true>),
    ],
    max_code: 255,
    narrow: None,
    signed: None,
    row_writer: None,
    unpack: super::avx2_unpack::unpack_for,
    unpack_super: super::avx2_unpack::unpack_super_for,
    release: None,
    expand_codes: false,
    fold_scales: None,
    int_scaled: None,
};

fn vnni<const SUB: usize, const MIN: bool>(
    w: &WBand,
    a: &ABlock,
    acc: &mut [[f32; IG_NR]; IG_MR],
    len: usize,
) {
    // SAFETY: `plug` installs this kernel only on a CPU with AVX-512 F/BW/DQ/VL and VNNI; the
    // references cover every byte the kernel reads and writes (fixed-size arrays).
    unsafe { vnni_kernel::<SUB, MIN>(w, a, acc, len) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")]
fn vnni_kernel<const SUB: usize, const MIN: bool>(
    w: &WBand,
    a: &ABlock,
    acc: &mut [[f32; IG_NR]; IG_MR],
    len: usize,
) {
    // Super-block types fill every step (len is 256): a constant trip count lets the
    // compiler unroll the sub-block loop.
    debug_assert_eq!(len, QK_K);
    let nsub = QK_K / SUB;
    let mut s1 = [_mm512_setzero_si512(); IG_MR];
    let mut s2 = [_mm512_setzero_si512(); IG_MR];
    for j in (0..nsub).step_by(2) {
        let raw = pair_sums!(w, a, j, SUB);
        for (h, raw) in raw.iter().enumerate() {
            let jh = j + h;
            // SAFETY: jh < 16: the 16 sums at jh * 16 are inside `a.bsums` (256 entries,
            // 64-byte aligned rows of 16).
            let bs =
                unsafe { _mm512_load_si512(a.bsums.as_ptr().add(jh * IG_NR) as *const __m512i) };
            for r in 0..IG_MR {
                let sc = _mm512_set1_epi32(w.scales[r * 16 + jh]);
                let corr = if MIN { raw[r] } else { _mm512_sub_epi32(raw[r], bs) };
                s1[r] = _mm512_add_epi32(s1[r], _mm512_mullo_epi32(corr, sc));
            }
        }
    }
    // The mins' sums do not depend on the products: a second pass keeps the first one's
    // register set to the raw and block sums.
    if MIN {
        mins_sums!(w, a, nsub, 0, s2);
    }
    let mut sums = [_mm512_setzero_ps(); IG_MR];
    for (f, &v) in sums.iter_mut().zip(&s1) {
        *f = _mm512_cvtepi32_ps(v);
    }
    add_rows!(w, a, acc.as_mut_ptr() as *mut f32, 0, sums, s2, MIN);
}

/// Adds the products of K group `g` (4 values; `g < 64`) for band rows `r0..r0 + R` and the
/// `P` panels `a` into `sums` (`[panel][row]`, `R` and `P` from its shape): one load of each
/// panel's 64 level bytes and one broadcast of each row's 4 codes feed `P x R` `vpdpbusd`.
/// Expanded inside the two- and three-panel kernels (it needs their target features); `wc`
/// points at the band's codes.
macro_rules! group_products {
    ($a:expr, $wc:expr, $r0:expr, $g:expr, $sums:ident) => {
        let mut av = [_mm512_setzero_si512(); P];
        for (p, av) in av.iter_mut().enumerate() {
            // SAFETY: g < 64: the 64 bytes at g * 64 are inside the panel's codes (4096 bytes,
            // 64-byte aligned).
            *av = unsafe { _mm512_load_si512($a[p].codes.as_ptr().add($g * 64).cast()) };
        }
        for r in 0..R {
            // SAFETY: r0 + r < 8 and 4 * g + 4 <= 256: inside row r0 + r's codes.
            let w0 = unsafe { ($wc.add(($r0 + r) * QK_K + 4 * $g) as *const i32).read_unaligned() };
            let wv = _mm512_set1_epi32(w0);
            for p in 0..P {
                $sums[p][r] = _mm512_dpbusd_epi32($sums[p][r], wv, av[p]);
            }
        }
    };
}

/// Rows of the band [`vnni_narrow`] takes per pass: 4 rows x 2 panels of even and odd raw
/// sums and of integer scaled sums stay in registers (8 rows would need 48 and spill).
const X2_ROWS: usize = 4;

/// `Kind::Int16`'s two-panel kernel (see `igemm::IgemmPairFn`; `IntFormat::narrow_sums`, no
/// mins): each of the band's 4-code broadcasts feeds both panels' `vpdpbusd`, the band's rows
/// [`X2_ROWS`] at a time; sub-blocks in pairs, the two corrected sums of each row and column put
/// side by side as 16-bit halves and scaled by one `vpdpwssd` against the row's two scales (the
/// same integers: each corrected sum fits 16 bits). The float steps are those of [`vnni`], per
/// panel and row.
fn vnni_narrow(w: &WBand, a: [&ABlock; 2], acc: [&mut Tile; 2], len: usize) {
    // SAFETY: as `vnni`.
    unsafe { vnni_narrow_kernel(w, a, acc, len) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")]
fn vnni_narrow_kernel(w: &WBand, a: [&ABlock; 2], acc: [&mut Tile; 2], len: usize) {
    const SUB: usize = 16;
    // Panels and rows per pass (read by `group_products`).
    const P: usize = 2;
    const R: usize = X2_ROWS;
    debug_assert_eq!(len, QK_K);
    let nsub = QK_K / SUB;
    let wc = w.codes.as_ptr();
    let out: [*mut f32; P] = acc.map(|t| t.as_mut_ptr() as *mut f32);
    for r0 in (0..IG_MR).step_by(R) {
        let mut s1 = [[_mm512_setzero_si512(); R]; P];
        for j in (0..nsub).step_by(2) {
            // The chains start from minus the bias sums, so they end as the corrected sums.
            let mut even = [[_mm512_setzero_si512(); R]; P];
            let mut odd = [[_mm512_setzero_si512(); R]; P];
            for p in 0..P {
                let (nb0, nb1) = (neg_bsums!(a[p], j), neg_bsums!(a[p], j + 1));
                even[p] = [nb0; R];
                odd[p] = [nb1; R];
            }
            for g in j * SUB / 4..(j + 1) * SUB / 4 {
                group_products!(a, wc, r0, g, even);
            }
            for g in (j + 1) * SUB / 4..(j + 2) * SUB / 4 {
                group_products!(a, wc, r0, g, odd);
            }
            for p in 0..P {
                for r in 0..R {
                    let (c0, c1) = (even[p][r], odd[p][r]);
                    // Low halves c0, high halves c1 (each within 16 bits).
                    let both =
                        _mm512_mask_blend_epi16(0xAAAA_AAAA, c0, _mm512_slli_epi32::<16>(c1));
                    let sc = _mm512_set1_epi32(w.scale_pairs[(r0 + r) * 8 + j / 2]);
                    s1[p][r] = _mm512_dpwssd_epi32(s1[p][r], both, sc);
                }
            }
        }
        for p in 0..P {
            let mut sums = [_mm512_setzero_ps(); R];
            for (f, &v) in sums.iter_mut().zip(&s1[p]) {
                *f = _mm512_cvtepi32_ps(v);
            }
            let no_mins = [_mm512_setzero_si512(); R];
            add_rows!(w, a[p], out[p], r0, sums, no_mins, false);
        }
    }
}

/// `Kind::Int16Min`'s kernel for `P` (two or three) panels (`IntFormat::unit_scales`: every
/// scale 1, no bias): the whole step's products go into one int32 sum per row and column,
/// scaled by nothing (the same integers as [`vnni`]'s), the band's rows 4 at a time (`4 P`
/// chains); then the mins' sums and the float steps of [`vnni`], per panel and row.
fn vnni_unit<const P: usize>(w: &WBand, a: [&ABlock; P], acc: [&mut Tile; P], len: usize) {
    // SAFETY: as `vnni`.
    unsafe { vnni_unit_kernel::<P>(w, a, acc, len) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")]
fn vnni_unit_kernel<const P: usize>(w: &WBand, a: [&ABlock; P], acc: [&mut Tile; P], len: usize) {
    const R: usize = 4;
    debug_assert_eq!(len, QK_K);
    let nsub = QK_K / 16;
    let wc = w.codes.as_ptr();
    let out: [*mut f32; P] = acc.map(|t| t.as_mut_ptr() as *mut f32);
    for r0 in (0..IG_MR).step_by(R) {
        let mut s1 = [[_mm512_setzero_si512(); R]; P];
        for g in 0..QK_K / 4 {
            group_products!(a, wc, r0, g, s1);
        }
        for p in 0..P {
            let mut s2 = [_mm512_setzero_si512(); R];
            mins_sums!(w, a[p], nsub, r0, s2);
            let mut sums = [_mm512_setzero_ps(); R];
            for (f, &v) in sums.iter_mut().zip(&s1[p]) {
                *f = _mm512_cvtepi32_ps(v);
            }
            add_rows!(w, a[p], out[p], r0, sums, s2, true);
        }
    }
}

/// The one-panel form of [`vnni_multi`] (all 8 rows per pass: 8 chains).
fn multi1<const SUB: usize, const MIN: bool, const BLK: bool>(
    w: &WBand,
    a: &ABlock,
    acc: &mut Tile,
    len: usize,
) {
    vnni_multi::<1, IG_MR, SUB, MIN, BLK>(w, [a], [acc], len)
}

/// The float kinds' kernel for `P` panels (`igemm::IgemmFn`, `IgemmPairFn`, `IgemmTripleFn`),
/// the band's rows `R` at a time: `P x R` raw sums and as many f32 sums stay in registers (at
/// most 24 of the 32). Per group of 4 K values, `P` panel loads and `R` code broadcasts feed
/// `P x R` `vpdpbusd`. `BLK`: the block kinds (the tile's rows take every sub-block's scaled
/// sums in sub-block order); else the super-block float kinds (each sub-block's sum times its
/// float scale, then the row and column scales once per step).
fn vnni_multi<
    const P: usize,
    const R: usize,
    const SUB: usize,
    const MIN: bool,
    const BLK: bool,
>(
    w: &WBand,
    a: [&ABlock; P],
    acc: [&mut Tile; P],
    len: usize,
) {
    // SAFETY: as `vnni`.
    unsafe { vnni_multi_kernel::<P, R, SUB, MIN, BLK>(w, a, acc, len) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")]
fn vnni_multi_kernel<
    const P: usize,
    const R: usize,
    const SUB: usize,
    const MIN: bool,
    const BLK: bool,
>(
    w: &WBand,
    a: [&ABlock; P],
    acc: [&mut Tile; P],
    len: usize,
) {
    debug_assert!(IG_MR.is_multiple_of(R) && (BLK || len == QK_K));
    let nsub = if BLK { used_subs(len, SUB) } else { QK_K / SUB };
    let wc = w.codes.as_ptr();
    let out: [*mut f32; P] = acc.map(|t| t.as_mut_ptr() as *mut f32);
    for r0 in (0..IG_MR).step_by(R) {
        let mut s = start_sums!(out, r0, BLK);
        for j in 0..nsub {
            let mut raw = [[_mm512_setzero_si512(); R]; P];
            if !MIN {
                for (p, raw) in raw.iter_mut().enumerate() {
                    *raw = [neg_bsums!(a[p], j); R];
                }
            }
            for g in j * SUB / 4..(j + 1) * SUB / 4 {
                group_products!(a, wc, r0, g, raw);
            }
            scale_sub!(w, a, j, r0, raw, s, MIN, BLK);
        }
        finish_sums!(w, a, out, r0, s, nsub, MIN, BLK);
    }
}
