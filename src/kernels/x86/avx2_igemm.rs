//! Integer GEMM micro-kernels (`kernels::igemm`) for the AVX2 tier, in two forms:
//!
//! - [`AVX_VNNI`]: `vpdpbusd` on ymm (AVX-VNNI: Alder Lake and later, Zen 5), every code.
//! - [`MADDUBS`]: plain AVX2, `vpmaddubsw` (pairs of unsigned code x signed level, summed in
//!   int16 with saturation), the pair sums of several groups of 4 K values added in int16
//!   (`vpaddw`), then widened by `vpmaddwd` against ones. A pair sum stays inside int16 only while
//!   codes are at most 127 (127 * 128 * 2 = 32512), so these kernels declare `max_code` 127 (the
//!   IQ1-IQ3 grids come recentred, `IntFormat::recentred`, codes up to 124); narrower codes take
//!   forms that add more groups before widening (`maddubs_for_codes`), which halves the
//!   multiplier work or better (`vpmaddwd` runs on the same units as `vpmaddubsw`). The formats
//!   whose codes are signed bytes plus 128 (Q8_0, IQ4_NL, IQ4_XS) take the signed forms
//!   ([`signed_set`], `IntFormat::signed`): the sign of one operand moved onto the other with
//!   `vpsignb`, so the unsigned operand is a magnitude of at most 128 and the other at most 127.
//!
//! Both work on 4 of the band's 8 rows at a time (8 ymm registers of partial sums, two panel
//! halves, the broadcast codes) and keep the block sums and scaled sums in memory; most
//! `vpmaddubsw` kernels for codes below 64 (the float-scaled super-block kinds, the block kinds,
//! the integer kinds with mins) also have a two-panel form (2 rows by 4 column halves per pass:
//! each broadcast of codes serves four products, [`pair_set`]), and the signed forms work on 2
//! rows. The integer sums equal the
//! portable kernel's and the float steps are the same operations in the same order, so the bits
//! are the same.

use std::arch::x86_64::*;

use crate::dtype::QK_K;
use crate::kernels::igemm::{
    ABlock, IG_MR, IG_NR, IgemmFn, IgemmKernels, IgemmPairFn, RowFn, WBand, pairs_fit, used_subs,
};
use crate::quant::unpack::Sign;

/// The kernel body for one (sub-block size `SUB`, mins `MIN`, block kind `FL`, float-scaled
/// super-block kind `SF`) combination (`igemm::Kind`), expanded inside each form's
/// `#[target_feature]` function. The products of unsigned codes and signed levels are summed
/// in partial sums of `$groups` groups of 4 K values: `$step(part, codes, levels)` adds a
/// group's products to a partial sum, `$flush(raw, part, scale)` adds a partial sum times
/// `scale` into the sub-block's int32 sums. With `$scaled` the integer kind with mins
/// (`Kind::Int16Min`, whose scales fit 16 bits: 1 for the unit-scale formats) passes the
/// sub-block's scale there and adds the result unscaled, else the scale is 1 and the sums are
/// scaled afterwards (`vpmulld`). The signed forms (`$signed`, see [`signed_set`]) also pass
/// `$levels`, applied to each loaded pair of level vectors, and `($src, $codes)`: `$src(w)`
/// names the band's byte arrays (8 rows of 256) whose 4 bytes at a row's group are broadcast,
/// and `$codes` makes the step's operand of those broadcasts (the unsigned kernels: [`CODES`],
/// the codes); their products are the bias-corrected ones. `$rows` rows per pass
/// against `$panels` panels (`$a`, `$acc`: arrays of that many), whose `2 * $panels` column
/// halves share each broadcast of a row's codes; each panel's operations are the one-panel
/// kernel's, in its order.
macro_rules! body {
    ($w:expr, $a:expr, $acc:expr, $len:expr, $groups:expr, $step:expr, $flush:expr,
     $scaled:expr) => {
        body!($w, [$a], [$acc], $len, $groups, $step, $flush, $scaled, |l| l, CODES, false, 4, 1)
    };
    ($w:expr, $a:expr, $acc:expr, $len:expr, $groups:expr, $step:expr, $flush:expr,
     $scaled:expr, $levels:expr, $codes:expr, $signed:expr, $rows:literal,
     $panels:literal) => {{
        // Rows per pass (a divisor of IG_MR), panels per call, column halves per pass.
        const ROWS: usize = $rows;
        const P: usize = $panels;
        const H: usize = 2 * P;
        let (w, a, acc): (&WBand, [&ABlock; P], [&mut [[f32; IG_NR]; IG_MR]; P]) = ($w, $a, $acc);
        let (step, flush, levels, (src, codes)) = ($step, $flush, $levels, $codes);
        // The byte arrays the codes are broadcast from, 2048 bytes each (8 rows of 256).
        let src: [&[u8; IG_MR * QK_K]; _] = src(w);
        // Block types may end in a partial step; super-block types fill every step, and a
        // constant trip count lets the compiler unroll their sub-block loop.
        let nsub = if FL { used_subs($len, SUB) } else { QK_K / SUB };
        let ac: [*const i8; P] = std::array::from_fn(|p| a[p].codes.as_ptr());
        let zero = _mm256_setzero_si256();
        let ld_i = |p: &[i32], off: usize| {
            debug_assert!(off + 8 <= p.len());
            // SAFETY: callers pass off + 8 <= p.len() (sub-block j < 16, half h < 2: 16j + 8h + 8
            // <= 256).
            unsafe { _mm256_loadu_si256(p.as_ptr().add(off) as *const __m256i) }
        };
        let ld_f = |p: &[f32], off: usize| {
            debug_assert!(off + 8 <= p.len());
            // SAFETY: as ld_i.
            unsafe { _mm256_loadu_ps(p.as_ptr().add(off)) }
        };
        // Groups of 4 K values per partial sum (at most a sub-block's).
        let part_groups = if $groups > SUB / 4 { SUB / 4 } else { $groups };
        // One pass per 4 rows: both halves of the columns share each broadcast of the codes (on
        // Zen 3 a loop of one broadcast per `vpmaddubsw` ran at 0.65x the speed of one per two).
        // The partial sums take 8 registers; the sums scaled once per sub-block stay in memory
        // (`vmem`), so that the compiler does not hold them in registers and spill the partial
        // sums instead: integer kinds' scaled sums (as i32 lanes), float-scaled kinds' scaled
        // sums, block kinds' tile rows, per row and half.
        let mut scaled = [[_mm256_setzero_ps(); H]; ROWS];
        let pairs_ok = MIN && !FL && a.iter().all(|a| pairs_fit(a));
        let fold = $scaled && MIN && !FL && !SF;
        for rb in (0..IG_MR).step_by(ROWS) {
            for (r, pair) in scaled.iter_mut().enumerate() {
                for (q, v) in pair.iter_mut().enumerate() {
                    let (p, h) = (q / 2, q % 2);
                    let start = if FL { ld_f(&acc[p][rb + r], 8 * h) } else { _mm256_setzero_ps() };
                    vmem(v, Some(start));
                }
            }
            for j in 0..nsub {
                let mut raw = [[zero; H]; ROWS];
                for g0 in (j * SUB / 4..(j + 1) * SUB / 4).step_by(part_groups) {
                    let mut part = [[zero; H]; ROWS];
                    for g in g0..g0 + part_groups {
                        let l: [_; H] = std::array::from_fn(|q| {
                            let p = ac[q / 2].wrapping_add(g * 64 + 32 * (q % 2));
                            // SAFETY: g < 64 and q % 2 < 2: the 32 bytes at g * 64 + 32 (q % 2)
                            // are inside panel q / 2's `codes` (4096 bytes).
                            let v = unsafe { _mm256_loadu_si256(p as *const __m256i) };
                            levels(v)
                        });
                        for (r, part) in part.iter_mut().enumerate() {
                            let off = (rb + r) * QK_K + 4 * g;
                            let c = codes(src.map(|b| {
                                let p = b.as_ptr().wrapping_add(off) as *const i32;
                                // SAFETY: rb + r < 8 and 4 * g + 4 <= 256: row rb + r's bytes
                                // 4 g..4 g + 4, inside the 2048.
                                _mm256_set1_epi32(unsafe { p.read_unaligned() })
                            }));
                            for q in 0..H {
                                part[q] = step(part[q], c, l[q]);
                            }
                        }
                    }
                    for (r, (raw, part)) in raw.iter_mut().zip(&part).enumerate() {
                        let sc = if fold { w.scales[(rb + r) * 16 + j] } else { 1 };
                        for q in 0..H {
                            raw[q] = flush(raw[q], part[q], sc);
                        }
                    }
                }
                for (r, raw) in raw.iter().enumerate() {
                    let rr = rb + r;
                    for (q, &raw) in raw.iter().enumerate() {
                        let (a, h) = (a[q / 2], q % 2);
                        let off = j * IG_NR + 8 * h;
                        // The signed forms' sums are bias-corrected already.
                        let corr = if MIN || $signed {
                            raw
                        } else {
                            _mm256_sub_epi32(raw, ld_i(&a.bsums, off))
                        };
                        let slot = &mut scaled[r][q];
                        let o = vmem(slot, None);
                        let o = if FL {
                            let f = _mm256_mul_ps(_mm256_cvtepi32_ps(corr), ld_f(&a.ds, off));
                            let sc = _mm256_set1_ps(w.fscales[rr * 16 + j]);
                            let mut o = _mm256_fmadd_ps(f, sc, o);
                            if MIN {
                                let m = _mm256_set1_ps(w.fmins[rr * 16 + j]);
                                o = _mm256_fmadd_ps(ld_f(&a.ms, off), m, o);
                            }
                            o
                        } else if SF {
                            let sc = _mm256_set1_ps(w.fscales[rr * 16 + j]);
                            _mm256_fmadd_ps(_mm256_cvtepi32_ps(corr), sc, o)
                        } else {
                            // The integer sums in the same bytes.
                            let o = _mm256_castps_si256(o);
                            let prod = if fold {
                                corr
                            } else {
                                _mm256_mullo_epi32(corr, _mm256_set1_epi32(w.scales[rr * 16 + j]))
                            };
                            _mm256_castsi256_ps(_mm256_add_epi32(o, prod))
                        };
                        vmem(slot, Some(o));
                    }
                }
            }
            for r in 0..ROWS {
                let rr = rb + r;
                for q in 0..H {
                    let (pi, h) = (q / 2, q % 2);
                    let a = a[pi];
                    let v = vmem(&mut scaled[r][q], None);
                    if FL {
                        let p = acc[pi][rr][8 * h..].as_mut_ptr();
                        // SAFETY: 8 * h + 8 <= 16: inside row rr.
                        unsafe { _mm256_storeu_ps(p, v) };
                        continue;
                    }
                    let sum = if SF { v } else { _mm256_cvtepi32_ps(_mm256_castps_si256(v)) };
                    let mut f = _mm256_mul_ps(sum, _mm256_set1_ps(w.d[rr]));
                    if MIN {
                        // sum_j mins[j] * bsums[j]: two sub-blocks per `vpmaddwd` where the
                        // level sums fit 16 bits (the mins do: `WBand::min_pairs`), else one
                        // `vpmulld` each. The same integers (the pair sums are exact).
                        let mut s2 = zero;
                        if pairs_ok {
                            for i in 0..nsub / 2 {
                                let mn = _mm256_set1_epi32(w.min_pairs[rr * 8 + i]);
                                let bs = ld_i(&a.bsum_pairs, i * IG_NR + 8 * h);
                                s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(bs, mn));
                            }
                        } else {
                            for j in 0..nsub {
                                let mn = _mm256_set1_epi32(w.mins[rr * 16 + j]);
                                let bs = ld_i(&a.bsums, j * IG_NR + 8 * h);
                                s2 = _mm256_add_epi32(s2, _mm256_mullo_epi32(bs, mn));
                            }
                        }
                        let m = _mm256_cvtepi32_ps(s2);
                        f = _mm256_fnmadd_ps(_mm256_set1_ps(w.dmin[rr]), m, f);
                    }
                    let da = ld_f(&a.d, 8 * h);
                    let p = acc[pi][rr][8 * h..].as_mut_ptr();
                    // SAFETY: 8 * h + 8 <= 16: inside row rr.
                    unsafe {
                        _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), _mm256_mul_ps(f, da)))
                    };
                }
            }
        }
    }};
}

/// The byte arrays of a band whose 4 bytes at a row's group `body` broadcasts (rows of 256).
type CodeSrc<const N: usize> = fn(&WBand) -> [&[u8; IG_MR * QK_K]; N];

/// The unsigned kernels' `($src, $codes)` in `body`: the codes, broadcast.
const CODES: (CodeSrc<1>, fn([__m256i; 1]) -> __m256i) = (|w| [&w.codes], |[c]| c);

/// Reads (`v` `None`) or writes `slot` through memory: a volatile access, which the compiler
/// keeps as one load or store where it would otherwise hold the value in a register.
#[inline(always)]
fn vmem(slot: &mut __m256, v: Option<__m256>) -> __m256 {
    let p: *mut __m256 = slot;
    match v {
        // SAFETY: `p` comes from a reference: valid, aligned and not aliased for the access.
        None => unsafe { p.read_volatile() },
        Some(v) => {
            // SAFETY: as above.
            unsafe { p.write_volatile(v) };
            v
        }
    }
}

/// The nine kinds' one-panel forms of a kernel family (in `Kind` order), with extra const
/// parameters after the kind's.
macro_rules! one_set {
    ($wrap:ident $(, $extra:expr)*) => {
        [
            $wrap::<16, false, false, false $(, $extra)*>,
            $wrap::<16, true, false, false $(, $extra)*>,
            $wrap::<16, false, false, true $(, $extra)*>,
            $wrap::<16, true, false, true $(, $extra)*>,
            $wrap::<32, false, false, true $(, $extra)*>,
            $wrap::<32, true, false, true $(, $extra)*>,
            $wrap::<16, false, true, false $(, $extra)*>,
            $wrap::<32, false, true, false $(, $extra)*>,
            $wrap::<32, true, true, false $(, $extra)*>,
        ]
    };
}

macro_rules! kernel_set {
    ($name:ident, $one:expr, $max:expr, $narrow:expr, $signed:expr, $int_scaled:expr) => {
        pub(crate) const $name: IgemmKernels = IgemmKernels {
            one: $one,
            two: [None; 9],
            three: [None; 9],
            max_code: $max,
            narrow: $narrow,
            signed: $signed,
            row_writer: None,
            unpack: super::avx2_unpack::unpack_for,
            unpack_super: super::avx2_unpack::unpack_super_for,
            release: None,
            expand_codes: false,
            fold_scales: None,
            int_scaled: $int_scaled,
        };
    };
}

kernel_set!(AVX_VNNI, one_set!(avx_vnni), 255, None, None, None);
kernel_set!(
    MADDUBS,
    one_set!(maddubs, 1),
    127,
    Some(maddubs_for_codes),
    Some(signed_set),
    Some(int_scaled_pays)
);

/// The integer-scaled forms (`IntFormat::int_scaled`) the `vpmaddubsw` kernels run: their
/// `Kind::Int16Min` scales each partial sum in its `vpmaddwd` widening (`maddubs_flush`) where
/// the `Kind::Flt*` kinds widen against ones and scale each sub-block's sum in f32 (and Q3_K's
/// and IQ1_M's `Kind::Int16` by a `vpmulld` per sub-block). The formats with codes of 16 and
/// more: with sub-blocks of 16 all of them (Q6_K, IQ2_XS, IQ2_S, IQ1_M), of those with 32,
/// which the form splits into sub-blocks of 16 (twice the sums per step), the codes up to 31
/// (Q5_K, and IQ3_S and IQ1_S recentred: 4 groups per widening, so the widenings do not
/// grow). One thread, `matmul T 1024 512 4096 1 5`, best GFLOPS against the format's own kind,
/// alternating, 6-8 rounds: q6_K 1.08 (1.17 on two threads at 4096 x 512 x 14336), iq2_s
/// 1.08, iq2_xs 1.07, iq3_s 1.25, iq1_s 1.15, q5_K 1.19, iq1_m 1.15 (1.15 on two threads over 8
/// rounds, 0.89 over 4 at 2048 x 512 x 8192); not taken: q4_K 0.84,
/// tq2_0 0.85 and tq1_0 0.89 (8 groups per widening, which the split halves), q3_K 0.99 (0.97
/// on two threads), iq2_xxs 0.93 and iq3_xxs 0.97 (one group per widening).
fn int_scaled_pays(f: &crate::quant::unpack::IntFormat) -> bool {
    f.max_code >= 16 && (!f.widen || f.max_code <= 31)
}

/// The `vpmaddubsw` kernels for the signed forms (`IntFormat::signed`: Q8_0, IQ4_NL, IQ4_XS,
/// whose codes reach 255): one group of 4 K values per widening, each pair of products at most
/// `2 * 128 * 127` in size. Only the kinds without mins are used (`IgemmKernels::for_format`).
fn signed_set(sign: Sign) -> ([IgemmFn; 9], RowFn) {
    match sign {
        Sign::OnWeights => {
            (one_set!(maddubs_signed, true), |w, r, _| w.sign_row(r, Sign::OnWeights))
        }
        Sign::OnLevels => {
            (one_set!(maddubs_signed, false), |w, r, _| w.sign_row(r, Sign::OnLevels))
        }
    }
}

/// The two-panel `vpmaddubsw` forms for `G` groups per partial sum: two rows by both panels'
/// four column halves per pass, so each broadcast of codes serves four products; `None` where a
/// kind keeps one panel per call. One band against two panels in L1 on a Zen 3 core, best of 7 x
/// 100000 calls, against two one-panel calls (2-3 runs): with G = 8, Flt32Min 1.15-1.26x, Flt32
/// 1.33-1.35x, Int16 1.11-1.29x, the block kinds 0.95-1.00x (their per-sub-block float steps
/// weigh more than the broadcasts); with G = 4, Blk16 1.13-1.17x, Flt32/Flt32Min 0.98-1.04x;
/// with G = 2, Flt16 1.11-1.16x, Int16Min 1.02x. In a whole GEMM (alternating binaries, best times): Q4_K 1.11x on
/// one thread (8 rounds, 1.04-1.58), 1.33x on two (6 rounds), TQ2_0 1.03x; Q3_K (Int16) 1.10x
/// on one thread, 1.34x on two; NVFP4 (Blk16, G = 4) 1.09x on one (every round 1.06-1.11), 1.04x
/// on two; Q6_K (Flt16, G = 2, its form alone) 1.11x on one thread (8 rounds, 1.09-1.18), 1.16x
/// on two (6 rounds); Q5_K (G = 4) 0.97x, which keeps one panel. The `Int16Min` forms for G = 2
/// and 4 serve the integer-scaled forms (`int_scaled_pays`: Q6_K, Q5_K, IQ3_S, IQ1_S, IQ1_M) and Q2_K
/// (1.04x in a whole GEMM on two threads, 6 rounds). The block kinds (one float step per
/// block of 32) with G = 4, against their one-panel kernels in a whole GEMM, best GFLOPS,
/// alternating: Q5_0 1.13x on one thread (6 rounds), 1.20x on two (4096 x 512 x 14336, 4 rounds,
/// every round >= 1.16), 1.13x at 1536 x 512 x 576; Q5_1 1.16x / 1.23x; MXFP4 1.43x / 1.27x
/// (every two-thread round >= 1.17); with G = 8 Q4_0 1.07x on one thread, 1.11x and 1.02x on two
/// (4 and 6 rounds), Q4_1 1.02x, 1.01x and 1.03x: small, but not below. With G = 1 (codes up
/// to 127: the IQ2 grids and IQ3_XXS, `Flt32` and the integer-scaled `Int16Min`), one thread 8
/// rounds: IQ2_XS 1.05x, IQ3_XXS 1.03x; two threads at 2048 x 512 x 8192, 4 rounds: IQ2_S 1.30x
/// (0.84-1.68), IQ2_XXS 1.20x (every round >= 1.15). The integer kinds' pair slot means their 16-bit
/// forms (`IgemmKernels::two`): these give the one-panel bits for any data, which holds that.
macro_rules! pair_set {
    (8) => {
        [
            Some(maddubs_pair::<16, false, false, false, 8> as IgemmPairFn),
            None,
            Some(maddubs_pair::<16, false, false, true, 8> as IgemmPairFn),
            Some(maddubs_pair::<16, true, false, true, 8> as IgemmPairFn),
            Some(maddubs_pair::<32, false, false, true, 8> as IgemmPairFn),
            Some(maddubs_pair::<32, true, false, true, 8> as IgemmPairFn),
            None,
            Some(maddubs_pair::<32, false, true, false, 8> as IgemmPairFn),
            Some(maddubs_pair::<32, true, true, false, 8> as IgemmPairFn),
        ]
    };
    (2) => {
        [
            None,
            Some(maddubs_pair::<16, true, false, false, 2> as IgemmPairFn),
            Some(maddubs_pair::<16, false, false, true, 2> as IgemmPairFn),
            None,
            None,
            None,
            None,
            None,
            None,
        ]
    };
    (1) => {
        [
            None,
            Some(maddubs_pair::<16, true, false, false, 1> as IgemmPairFn),
            None,
            None,
            Some(maddubs_pair::<32, false, false, true, 1> as IgemmPairFn),
            None,
            None,
            None,
            None,
        ]
    };
    (4) => {
        [
            None,
            Some(maddubs_pair::<16, true, false, false, 4> as IgemmPairFn),
            None,
            None,
            None,
            None,
            Some(maddubs_pair::<16, false, true, false, 4> as IgemmPairFn),
            Some(maddubs_pair::<32, false, true, false, 4> as IgemmPairFn),
            Some(maddubs_pair::<32, true, true, false, 4> as IgemmPairFn),
        ]
    };
}

/// The `vpmaddubsw` kernels for codes up to `max_code`: as many groups of 4 K values summed in
/// int16 before widening as keep every int16 lane exact. A lane holds, per group, the products
/// of two codes and two levels (at most `2 * max_code * 128` in size), so `G` groups are exact
/// while `G * 2 * max_code * 128 <= 32767`: 8 groups (a whole 32-element sub-block) for codes
/// up to 15 (30720), 4 for 31 (31744), 2 for 63 (32256), 1 for 127 (32512).
fn maddubs_for_codes(max_code: u8) -> ([IgemmFn; 9], [Option<IgemmPairFn>; 9]) {
    match max_code {
        0..=15 => (one_set!(maddubs, 8), pair_set!(8)),
        16..=31 => (one_set!(maddubs, 4), pair_set!(4)),
        32..=63 => (one_set!(maddubs, 2), pair_set!(2)),
        _ => (one_set!(maddubs, 1), pair_set!(1)),
    }
}

fn avx_vnni<const SUB: usize, const MIN: bool, const FL: bool, const SF: bool>(
    w: &WBand,
    a: &ABlock,
    acc: &mut [[f32; IG_NR]; IG_MR],
    len: usize,
) {
    // SAFETY: `plug` installs AVX_VNNI only on a CPU with AVX2, FMA and AVX-VNNI.
    unsafe { avx_vnni_kernel::<SUB, MIN, FL, SF>(w, a, acc, len) }
}

#[target_feature(enable = "avx2,fma,avxvnni")]
fn avx_vnni_kernel<const SUB: usize, const MIN: bool, const FL: bool, const SF: bool>(
    w: &WBand,
    a: &ABlock,
    acc: &mut [[f32; IG_NR]; IG_MR],
    len: usize,
) {
    // One int32 partial sum per sub-block: `vpdpbusd` widens every group.
    body!(
        w,
        a,
        acc,
        len,
        SUB / 4,
        |s, c, l| _mm256_dpbusd_avx_epi32(s, c, l),
        |raw, part, _| _mm256_add_epi32(raw, part),
        false
    )
}

fn maddubs<const SUB: usize, const MIN: bool, const FL: bool, const SF: bool, const G: usize>(
    w: &WBand,
    a: &ABlock,
    acc: &mut [[f32; IG_NR]; IG_MR],
    len: usize,
) {
    // SAFETY: `plug` installs MADDUBS only on a CPU with AVX2 and FMA. No int16 sum saturates
    // or wraps: the table's `max_code` (127) keeps formats with larger codes away, and
    // `maddubs_for_codes` gives `G` above 1 only to formats whose codes keep `G` groups' sums
    // inside int16.
    unsafe { maddubs_kernel::<SUB, MIN, FL, SF, G>(w, a, acc, len) }
}

#[target_feature(enable = "avx2,fma")]
fn maddubs_kernel<
    const SUB: usize,
    const MIN: bool,
    const FL: bool,
    const SF: bool,
    const G: usize,
>(
    w: &WBand,
    a: &ABlock,
    acc: &mut [[f32; IG_NR]; IG_MR],
    len: usize,
) {
    body!(w, a, acc, len, G, maddubs_step, maddubs_flush, true)
}

/// A group's `vpmaddubsw` pair sums added to an int16 partial sum (the unsigned kernels' step).
#[target_feature(enable = "avx2")]
#[inline]
fn maddubs_step(part: __m256i, codes: __m256i, levels: __m256i) -> __m256i {
    _mm256_add_epi16(part, _mm256_maddubs_epi16(codes, levels))
}

/// A partial sum widened times `sc` into the sub-block's int32 sums. `sc` fits 16 bits (see
/// `body`): exact pair products, pair sums below 2^31.
#[target_feature(enable = "avx2")]
#[inline]
fn maddubs_flush(raw: __m256i, part: __m256i, sc: i32) -> __m256i {
    debug_assert!(i16::try_from(sc).is_ok());
    _mm256_add_epi32(raw, _mm256_madd_epi16(part, _mm256_set1_epi16(sc as i16)))
}

fn maddubs_signed<
    const SUB: usize,
    const MIN: bool,
    const FL: bool,
    const SF: bool,
    const ON_WEIGHTS: bool,
>(
    w: &WBand,
    a: &ABlock,
    acc: &mut [[f32; IG_NR]; IG_MR],
    len: usize,
) {
    // SAFETY: `plug` installs MADDUBS (whose `signed_set` this is) only on a CPU with AVX2 and
    // FMA. No int16 sum saturates or wraps: `IntFormat::signed` gives `Sign::OnWeights` only to
    // formats whose weights are never -128 and `Sign::OnLevels` only to activations without
    // -128, so every negated byte is exact and a pair of products is at most 32512 in size.
    unsafe { maddubs_signed_kernel::<SUB, MIN, FL, SF, ON_WEIGHTS>(w, a, acc, len) }
}

#[target_feature(enable = "avx2,fma")]
fn maddubs_signed_kernel<
    const SUB: usize,
    const MIN: bool,
    const FL: bool,
    const SF: bool,
    const ON_WEIGHTS: bool,
>(
    w: &WBand,
    a: &ABlock,
    acc: &mut [[f32; IG_NR]; IG_MR],
    len: usize,
) {
    type Pair = (__m256i, __m256i);
    debug_assert!(!MIN, "signed forms have no mins");
    // The band's signed weights `code - 128` (and for `Sign::OnLevels` their magnitudes), as
    // `WBand::sign_row` writes them (`signed_set`).
    fn weights(w: &WBand) -> [&[u8; IG_MR * QK_K]; 1] {
        [w.signed_codes()]
    }
    fn both(w: &WBand) -> [&[u8; IG_MR * QK_K]; 2] {
        [w.code_magnitudes(), w.signed_codes()]
    }
    let widen =
        |raw, part, _: i32| _mm256_add_epi32(raw, _mm256_madd_epi16(part, _mm256_set1_epi16(1)));
    if ON_WEIGHTS {
        // |a| * (sign(a) * w): |a| once per load, the sign per product.
        body!(
            w,
            [a],
            [acc],
            len,
            1,
            |s, wv, (l, al): Pair| {
                _mm256_add_epi16(s, _mm256_maddubs_epi16(al, _mm256_sign_epi8(wv, l)))
            },
            widen,
            false,
            |l| (l, _mm256_abs_epi8(l)),
            (weights, |[c]: [__m256i; 1]| c),
            true,
            2,
            1
        )
    } else {
        // |w| * (sign(w) * a): |w| once per broadcast, the sign per product.
        body!(
            w,
            [a],
            [acc],
            len,
            1,
            |s, (aw, wv): Pair, l| {
                _mm256_add_epi16(s, _mm256_maddubs_epi16(aw, _mm256_sign_epi8(l, wv)))
            },
            widen,
            false,
            |l| l,
            (both, |[m, s]: [__m256i; 2]| (m, s)),
            true,
            2,
            1
        )
    }
}

fn maddubs_pair<
    const SUB: usize,
    const MIN: bool,
    const FL: bool,
    const SF: bool,
    const G: usize,
>(
    w: &WBand,
    a: [&ABlock; 2],
    acc: [&mut [[f32; IG_NR]; IG_MR]; 2],
    len: usize,
) {
    // SAFETY: as `maddubs` (the same tier, the same codes per `G`).
    unsafe { maddubs_pair_kernel::<SUB, MIN, FL, SF, G>(w, a, acc, len) }
}

/// [`maddubs_kernel`] on two panels at once, each panel's results bitwise the one-panel
/// kernel's (the same operations per panel, in the same order).
#[target_feature(enable = "avx2,fma")]
fn maddubs_pair_kernel<
    const SUB: usize,
    const MIN: bool,
    const FL: bool,
    const SF: bool,
    const G: usize,
>(
    w: &WBand,
    a: [&ABlock; 2],
    acc: [&mut [[f32; IG_NR]; IG_MR]; 2],
    len: usize,
) {
    body!(w, a, acc, len, G, maddubs_step, maddubs_flush, true, |l| l, CODES, false, 2, 2)
}
