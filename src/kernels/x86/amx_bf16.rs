//! The BF16 tile kernels (`kernels::sgemm::TileBf16Fn`) on the AMX unit (AMX-BF16): one
//! `tdpbf16ps` multiplies a 16 x 32 BF16 tile of weights (a strip step, rows of 64 bytes) by 16
//! pair rows of 16 columns (a panel step: the BF16-pair panels of the float GEMM are the
//! instruction's B layout as they lie) into a 16 x 16 f32 tile, 8192 multiply-adds in one
//! instruction. Two strips by two panels keep four sums in tmm0..tmm3 for a whole K block;
//! the tiles are loaded from the caller's tiles (or zeroed) at its start and stored at its end.
//!
//! The tile configuration is the integer kernels' (`amx_igemm`: every tile 16 rows of 64
//! bytes), loaded per thread when needed; the float GEMM gives the tile state back
//! (`KernelTable::tile_release`) when a block ends.

use std::arch::asm;

use super::amx_igemm::ensure_full_config;
use crate::kernels::sgemm::{TB_PANEL_STEP, TB_STRIP_STEP, check_tile_bf16};

/// `KernelTable::tile_bf16` on the AMX unit.
pub(crate) fn tile_bf16(
    steps: usize,
    a: &[&[u16]],
    b: &[&[f32]],
    out: &mut [&mut [f32; 256]],
    acc: bool,
) {
    check_tile_bf16(steps, a, b, out);
    ensure_full_config();
    let ap = [a[0].as_ptr(), a[a.len() - 1].as_ptr()];
    let bp = [b[0].as_ptr(), b[b.len() - 1].as_ptr()];
    let mut cp = [std::ptr::null_mut::<f32>(); 4];
    for (t, o) in out.iter_mut().enumerate() {
        // Tile register 2 s + p for strip s and panel p.
        cp[(t / b.len()) * 2 + t % b.len()] = o.as_mut_ptr();
    }
    // SAFETY: `check_tile_bf16` proved every strip holds `steps` strip steps (16 rows of 64
    // bytes each) and every panel `steps` panel steps (16 rows of 64 bytes), and `out` one
    // 16 x 16 f32 tile (16 rows of 64 bytes) per strip and panel, which `cp` points at for the
    // registers used; the tiles are configured as 16 rows of 64 bytes (`ensure_full_config`)
    // and the kernel is installed only where the CPU has AMX-BF16 with the tile data permitted.
    unsafe {
        match (a.len(), b.len()) {
            (1, 1) => tiles::<1, 1>(steps, ap, bp, cp, acc),
            (1, _) => tiles::<1, 2>(steps, ap, bp, cp, acc),
            (_, 1) => tiles::<2, 1>(steps, ap, bp, cp, acc),
            _ => tiles::<2, 2>(steps, ap, bp, cp, acc),
        }
    }
}

/// Applies `$m!(tile register, pointer)` to the sums' tile registers of `S` strips by `P`
/// panels (register 2 s + p, pointer `$c[2 s + p]`).
macro_rules! each_sum {
    ($m:ident, $c:expr) => {
        $m!("tmm0", $c[0]);
        if P == 2 {
            $m!("tmm1", $c[1]);
        }
        if S == 2 {
            $m!("tmm2", $c[2]);
            if P == 2 {
                $m!("tmm3", $c[3]);
            }
        }
    };
}

/// # Safety
/// The tiles hold the full configuration; `a[s]` (s < S) points at `steps` strip steps, `b[p]`
/// (p < P) at `steps` panel steps, `c[2 s + p]` at a writable 16 x 16 f32 tile.
unsafe fn tiles<const S: usize, const P: usize>(
    steps: usize,
    a: [*const u16; 2],
    b: [*const f32; 2],
    c: [*mut f32; 4],
    acc: bool,
) {
    macro_rules! load {
        ($t:literal, $p:expr) => {
            // SAFETY: the caller's bound: a 16 x 16 f32 tile, rows of 64 bytes.
            unsafe {
                asm!(concat!("tileloadd ", $t, ", [{p} + {s}]"), p = in(reg) $p,
                    s = in(reg) 64usize, options(nostack, readonly))
            }
        };
    }
    macro_rules! zero {
        ($t:literal, $p:expr) => {
            // SAFETY: only resets a tile register.
            unsafe { asm!(concat!("tilezero ", $t), options(nostack, nomem)) }
        };
    }
    macro_rules! store {
        ($t:literal, $p:expr) => {
            // SAFETY: the caller's bound: a writable 16 x 16 f32 tile, rows of 64 bytes.
            unsafe {
                asm!(concat!("tilestored [{p} + {s}], ", $t), p = in(reg) $p,
                    s = in(reg) 64usize, options(nostack))
            }
        };
    }
    if acc {
        each_sum!(load, c);
    } else {
        each_sum!(zero, c);
    }
    for j in 0..steps {
        // SAFETY: j < steps: strip step j (1 KiB at j * TB_STRIP_STEP values) and panel step j
        // (1 KiB at j * TB_PANEL_STEP slots) are inside the caller's bound.
        unsafe {
            let (a0, a1) = (a[0].add(j * TB_STRIP_STEP), a[1].add(j * TB_STRIP_STEP));
            let (b0, b1) = (b[0].add(j * TB_PANEL_STEP), b[1].add(j * TB_PANEL_STEP));
            asm!(
                "tileloadd tmm4, [{a0} + {s}]",
                "tileloadd tmm6, [{b0} + {s}]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                a0 = in(reg) a0, b0 = in(reg) b0, s = in(reg) 64usize,
                options(nostack, readonly),
            );
            if P == 2 {
                asm!(
                    "tileloadd tmm7, [{b1} + {s}]",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    b1 = in(reg) b1, s = in(reg) 64usize, options(nostack, readonly),
                );
            }
            if S == 2 {
                asm!(
                    "tileloadd tmm5, [{a1} + {s}]",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    a1 = in(reg) a1, s = in(reg) 64usize, options(nostack, readonly),
                );
                if P == 2 {
                    asm!("tdpbf16ps tmm3, tmm5, tmm7", options(nostack, nomem));
                }
            }
        }
    }
    each_sum!(store, c);
}

#[cfg(test)]
mod tests {
    use crate::kernels::sgemm::{TB_PANEL_STEP, TB_STRIP_STEP, TileBf16Fn, tile_bf16_portable};

    /// Every shape of the AMX kernel against the portable twin (random BF16 values of mixed
    /// signs and magnitudes, accumulating and not): each element within the f32 error bound of
    /// its sums, `2 n eps` times the sum of the magnitudes of its `n` terms (the tile unit's
    /// order of summation is its own; on this data the two differ in the last bits only).
    #[test]
    fn amx_bf16_tiles_match_the_portable_twin() {
        let Some(kt) = crate::kernels::table_for(crate::kernels::Isa::Amx) else {
            return;
        };
        let Some((f, release)) = kt.tile_bf16 else { return };
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let mut bf = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            // A normal BF16: sign, exponent 110..=140, 7 mantissa bits.
            let e = 110 + (seed >> 20) % 31;
            (((seed >> 40) & 1) << 15 | e << 7 | (seed >> 8) & 0x7F) as u16
        };
        let val = |b: u16| f32::from_bits(u32::from(b) << 16);
        for steps in [1, 3, 8] {
            let strips: Vec<Vec<u16>> =
                (0..2).map(|_| (0..steps * TB_STRIP_STEP).map(|_| bf()).collect()).collect();
            let panels: Vec<Vec<f32>> = (0..2)
                .map(|_| {
                    (0..steps * TB_PANEL_STEP)
                        .map(|_| f32::from_bits(u32::from(bf()) << 16 | u32::from(bf())))
                        .collect()
                })
                .collect();
            for (ns, np) in [(1, 1), (1, 2), (2, 1), (2, 2)] {
                for acc in [false, true] {
                    let start: Vec<[f32; 256]> = (0..ns * np)
                        .map(|t| std::array::from_fn(|i| (i as f32 - 100.0) * (t + 1) as f32))
                        .collect();
                    let run = |k: TileBf16Fn| {
                        let mut tiles = start.clone();
                        let a: Vec<&[u16]> = strips[..ns].iter().map(|s| &s[..]).collect();
                        let b: Vec<&[f32]> = panels[..np].iter().map(|p| &p[..]).collect();
                        let mut out: Vec<&mut [f32; 256]> = tiles.iter_mut().collect();
                        k(steps, &a, &b, &mut out, acc);
                        tiles
                    };
                    let (got, want) = (run(f), run(tile_bf16_portable));
                    release();
                    let n = (steps * 32 + 1) as f64;
                    for t in 0..ns * np {
                        let (sa, pb) = (&strips[t / np], &panels[t % np]);
                        for e in 0..256 {
                            let (r, c) = (e / 16, e % 16);
                            let mut mag = if acc { f64::from(start[t][e].abs()) } else { 0.0 };
                            for j in 0..steps {
                                for kp in 0..16 {
                                    let pair = pb[j * TB_PANEL_STEP + kp * 16 + c].to_bits();
                                    for h in 0..2 {
                                        let w = sa[j * TB_STRIP_STEP + r * 32 + 2 * kp + h];
                                        let x = val((pair >> (16 * h)) as u16);
                                        mag += f64::from((val(w) * x).abs());
                                    }
                                }
                            }
                            let bound = 2.0 * n * f64::from(f32::EPSILON) * mag;
                            let (g, w) = (f64::from(got[t][e]), f64::from(want[t][e]));
                            assert!(
                                (g - w).abs() <= bound,
                                "steps {steps} {ns}x{np} acc {acc} tile {t} elem {e}: {g} vs {w}"
                            );
                        }
                    }
                }
            }
        }
    }
}
