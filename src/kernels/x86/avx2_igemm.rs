//! Integer GEMM micro-kernels (`kernels::igemm`) for the AVX2 tier, in two forms:
//!
//! - [`AVX_VNNI`]: `vpdpbusd` on ymm (AVX-VNNI: Alder Lake and later, Zen 5), every code.
//! - [`MADDUBS`]: plain AVX2, `vpmaddubsw` (pairs of unsigned code x signed level, summed in
//!   int16 with saturation) then `vpmaddwd` by ones. A pair sum stays inside int16 only while
//!   codes are at most 127 (127 * 128 * 2 = 32512), so these kernels declare `max_code` 127 and
//!   the types with larger codes (Q8_0, IQ4_NL / IQ4_XS, the IQ1-IQ3 grids) keep the f32 GEMM on
//!   such CPUs.
//!
//! Both work on 4 of the band's 8 rows at a time (16 ymm registers: 8 raw sums, two panel
//! halves, the broadcast codes) and keep the block sums and float accumulators in memory. The
//! integer sums equal the portable kernel's and the float steps are the same operations in the
//! same order, so the bits are the same.

use std::arch::x86_64::*;

use crate::dtype::QK_K;
use crate::kernels::igemm::{ABlock, IG_MR, IG_NR, IgemmKernels, WBand, used_subs};

/// The kernel body for one (sub-block size `SUB`, mins `MIN`, block kind `FL`, float-scaled
/// super-block kind `SF`) combination (`igemm::Kind`),
/// expanded inside each form's `#[target_feature]` function; `$dot(sum, codes, levels)` adds,
/// per int32 lane, the 4 products of unsigned codes and signed levels.
macro_rules! body {
    ($w:expr, $a:expr, $acc:expr, $len:expr, $dot:expr) => {{
        let (w, a, acc): (&WBand, &ABlock, &mut [[f32; IG_NR]; IG_MR]) = ($w, $a, $acc);
        let dot = $dot;
        // Block types may end in a partial step; super-block types fill every step, and a
        // constant trip count lets the compiler unroll their sub-block loop.
        let nsub = if FL { used_subs($len, SUB) } else { QK_K / SUB };
        let wc = w.codes.as_ptr();
        let ac = a.codes.as_ptr();
        let zero = _mm256_setzero_si256();
        // Integer kinds: scaled sums and mins' sums per row and half; float-scaled kinds: the
        // scaled sums in f32; block kinds: the tile.
        let mut s1 = [[zero; 2]; IG_MR];
        let mut sf = [[_mm256_setzero_ps(); 2]; IG_MR];
        let mut s2 = [[zero; 2]; IG_MR];
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
        for rb in (0..IG_MR).step_by(4) {
            for j in 0..nsub {
                let mut raw = [[zero; 2]; 4];
                for g in j * SUB / 4..(j + 1) * SUB / 4 {
                    // SAFETY: g < 64: the 64 bytes at g * 64 are inside `a.codes` (4096 bytes).
                    let (l0, l1) = unsafe {
                        (
                            _mm256_loadu_si256(ac.add(g * 64) as *const __m256i),
                            _mm256_loadu_si256(ac.add(g * 64 + 32) as *const __m256i),
                        )
                    };
                    for (r, raw) in raw.iter_mut().enumerate() {
                        // SAFETY: rb + r < 8 and 4 * g + 4 <= 256: inside row rb + r's codes.
                        let c = unsafe {
                            (wc.add((rb + r) * QK_K + 4 * g) as *const i32).read_unaligned()
                        };
                        let c = _mm256_set1_epi32(c);
                        raw[0] = dot(raw[0], c, l0);
                        raw[1] = dot(raw[1], c, l1);
                    }
                }
                for (r, raw) in raw.iter().enumerate() {
                    let rr = rb + r;
                    for (h, &raw) in raw.iter().enumerate() {
                        let off = j * IG_NR + 8 * h;
                        let corr =
                            if MIN { raw } else { _mm256_sub_epi32(raw, ld_i(&a.bsums, off)) };
                        if FL {
                            let f = _mm256_mul_ps(_mm256_cvtepi32_ps(corr), ld_f(&a.ds, off));
                            let p = acc[rr][8 * h..].as_mut_ptr();
                            // SAFETY: 8 * h + 8 <= 16: inside row rr of the tile.
                            let mut o = unsafe { _mm256_loadu_ps(p) };
                            o = _mm256_fmadd_ps(f, _mm256_set1_ps(w.fscales[rr * 16 + j]), o);
                            if MIN {
                                let m = _mm256_set1_ps(w.fmins[rr * 16 + j]);
                                o = _mm256_fmadd_ps(ld_f(&a.ms, off), m, o);
                            }
                            // SAFETY: as the load.
                            unsafe { _mm256_storeu_ps(p, o) };
                        } else if SF {
                            let sc = _mm256_set1_ps(w.fscales[rr * 16 + j]);
                            let c = _mm256_cvtepi32_ps(corr);
                            sf[rr][h] = _mm256_fmadd_ps(c, sc, sf[rr][h]);
                        } else {
                            let sc = _mm256_set1_epi32(w.scales[rr * 16 + j]);
                            s1[rr][h] = _mm256_add_epi32(s1[rr][h], _mm256_mullo_epi32(corr, sc));
                        }
                    }
                }
            }
        }
        if !FL && MIN {
            for j in 0..nsub {
                for (r, s2) in s2.iter_mut().enumerate() {
                    let mn = _mm256_set1_epi32(w.mins[r * 16 + j]);
                    for (h, s2) in s2.iter_mut().enumerate() {
                        let bs = ld_i(&a.bsums, j * IG_NR + 8 * h);
                        *s2 = _mm256_add_epi32(*s2, _mm256_mullo_epi32(bs, mn));
                    }
                }
            }
        }
        for (r, row) in acc.iter_mut().enumerate().filter(|_| !FL) {
            for h in 0..2 {
                let sum = if SF { sf[r][h] } else { _mm256_cvtepi32_ps(s1[r][h]) };
                let mut f = _mm256_mul_ps(sum, _mm256_set1_ps(w.d[r]));
                if MIN {
                    let m = _mm256_cvtepi32_ps(s2[r][h]);
                    f = _mm256_fnmadd_ps(_mm256_set1_ps(w.dmin[r]), m, f);
                }
                let da = ld_f(&a.d, 8 * h);
                let p = row[8 * h..].as_mut_ptr();
                // SAFETY: 8 * h + 8 <= 16: inside the row.
                unsafe {
                    _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), _mm256_mul_ps(f, da)))
                };
            }
        }
    }};
}

macro_rules! kernel_set {
    ($name:ident, $wrap:ident, $max:expr) => {
        pub(crate) const $name: IgemmKernels = IgemmKernels {
            one: [
                $wrap::<16, false, false, false>,
                $wrap::<16, true, false, false>,
                $wrap::<16, false, false, true>,
                $wrap::<16, true, false, true>,
                $wrap::<32, false, false, true>,
                $wrap::<32, true, false, true>,
                $wrap::<16, false, true, false>,
                $wrap::<32, false, true, false>,
                $wrap::<32, true, true, false>,
            ],
            two: [None; 9],
            three: [None; 9],
            max_code: $max,
            unpack: super::avx2_unpack::unpack_for,
            unpack_super: super::avx2_unpack::unpack_super_for,
            release: None,
            expand_codes: false,
            fold_scales: None,
        };
    };
}

kernel_set!(AVX_VNNI, avx_vnni, 255);
kernel_set!(MADDUBS, maddubs, 127);

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
    body!(w, a, acc, len, |s, c, l| _mm256_dpbusd_avx_epi32(s, c, l))
}

fn maddubs<const SUB: usize, const MIN: bool, const FL: bool, const SF: bool>(
    w: &WBand,
    a: &ABlock,
    acc: &mut [[f32; IG_NR]; IG_MR],
    len: usize,
) {
    // SAFETY: `plug` installs MADDUBS only on a CPU with AVX2 and FMA; the table's `max_code`
    // (127) keeps formats with larger codes away, so no int16 pair sum saturates.
    unsafe { maddubs_kernel::<SUB, MIN, FL, SF>(w, a, acc, len) }
}

#[target_feature(enable = "avx2,fma")]
fn maddubs_kernel<const SUB: usize, const MIN: bool, const FL: bool, const SF: bool>(
    w: &WBand,
    a: &ABlock,
    acc: &mut [[f32; IG_NR]; IG_MR],
    len: usize,
) {
    let ones = _mm256_set1_epi16(1);
    body!(w, a, acc, len, |s, c, l| {
        _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(c, l), ones))
    })
}
