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

use crate::dtype::QK_K;

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
}
const _: () = assert!(size_of::<WBand>() == 3136);

/// One panel of [`IG_NR`] activation columns over one super-block.
#[repr(C, align(64))]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct ABlock {
    /// Level `4g + e` of column `c` at `codes[g * 64 + c * 4 + e]`.
    pub codes: [i8; QK_K * IG_NR],
    /// Per sub-block `j` and column `c` at `bsums[j * 16 + c]`: the sum of the sub-block's levels
    /// (types with mins), or that sum times the code bias (the others).
    pub bsums: [i32; 16 * IG_NR],
    /// Q8_K scale of each column (0 for padding columns).
    pub d: [f32; IG_NR],
}
const _: () = assert!(size_of::<ABlock>() == 5184);

/// One band x one panel x one super-block into `acc[r][c]` (see the module notes). Every tier's
/// kernel gives the same bits as [`igemm_generic`].
pub(crate) type IgemmFn = fn(w: &WBand, a: &ABlock, acc: &mut [[f32; IG_NR]; IG_MR]);

/// The kernels of one tier, for the four (sub-block size, mins) combinations.
#[derive(Clone, Copy)]
pub(crate) struct IgemmKernels {
    pub sub16: IgemmFn,
    pub sub16_min: IgemmFn,
    pub sub32: IgemmFn,
    pub sub32_min: IgemmFn,
}

impl IgemmKernels {
    pub(crate) fn get(&self, sub: usize, has_min: bool) -> IgemmFn {
        match (sub, has_min) {
            (16, false) => self.sub16,
            (16, true) => self.sub16_min,
            (_, false) => self.sub32,
            (_, true) => self.sub32_min,
        }
    }
}

/// The portable kernels: the reference every SIMD kernel is tested against bit for bit.
#[cfg(test)]
pub(crate) const SCALAR: IgemmKernels = IgemmKernels {
    sub16: igemm_generic::<16, false>,
    sub16_min: igemm_generic::<16, true>,
    sub32: igemm_generic::<32, false>,
    sub32_min: igemm_generic::<32, true>,
};

/// The micro-kernel in plain Rust: the definition every SIMD kernel is tested against.
#[cfg(test)]
pub(crate) fn igemm_generic<const SUB: usize, const MIN: bool>(
    w: &WBand,
    a: &ABlock,
    acc: &mut [[f32; IG_NR]; IG_MR],
) {
    let nsub = QK_K / SUB;
    for r in 0..IG_MR {
        let mut s1 = [0i32; IG_NR];
        let mut s2 = [0i32; IG_NR];
        let codes = &w.codes[r * QK_K..(r + 1) * QK_K];
        for j in 0..nsub {
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

/// Regroups one Q8_K block of column `c` into panel block `a` (levels, sums per `sub` times
/// `bias` where the weight type has one, scale).
pub(crate) fn pack_q8k_column(
    a: &mut ABlock,
    c: usize,
    qs: &[i8; QK_K],
    bsums16: &[i16; 16],
    d: f32,
    sub: usize,
    bias: i32,
) {
    for g in 0..QK_K / 4 {
        a.codes[g * 64 + c * 4..g * 64 + c * 4 + 4].copy_from_slice(&qs[4 * g..4 * g + 4]);
    }
    let per = sub / 16;
    for j in 0..QK_K / sub {
        let s: i32 = bsums16[j * per..(j + 1) * per].iter().map(|&v| v as i32).sum();
        a.bsums[j * IG_NR + c] = if bias != 0 { s * bias } else { s };
    }
    a.d[c] = d;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{Isa, table_for};

    fn xorshift(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    /// Random bands and panels, with extremes (codes 255, levels -128/127, scales at the format
    /// bound) mixed in; every tier with integer kernels gives the portable kernel's bits.
    #[test]
    fn igemm_tiers_are_bitwise_the_portable_kernel() {
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        for case in 0..24 {
            let mut w: WBand = bytemuck::Zeroable::zeroed();
            let mut a: ABlock = bytemuck::Zeroable::zeroed();
            let extreme = case % 3 == 0;
            for c in w.codes.iter_mut() {
                *c = if extreme { 255 } else { xorshift(&mut s) as u8 };
            }
            for v in w.scales.iter_mut().chain(w.mins.iter_mut()) {
                *v = (xorshift(&mut s) % 256) as i32 - 128;
            }
            for (d, dm) in w.d.iter_mut().zip(w.dmin.iter_mut()) {
                *d = (xorshift(&mut s) % 1000) as f32 * 1e-4;
                *dm = (xorshift(&mut s) % 1000) as f32 * 1e-4;
            }
            for q in a.codes.iter_mut() {
                *q = if extreme { -128 } else { xorshift(&mut s) as i8 };
            }
            for b in a.bsums.iter_mut() {
                *b = (xorshift(&mut s) % 8192) as i32 - 4096;
            }
            for d in a.d.iter_mut() {
                *d = (xorshift(&mut s) % 1000) as f32 * 1e-3;
            }
            for isa in Isa::ALL {
                let Some(k) = table_for(isa).and_then(|t| t.igemm) else { continue };
                for (sub, min) in [(16, false), (16, true), (32, false), (32, true)] {
                    let mut want = [[0.5f32; IG_NR]; IG_MR];
                    let mut got = want;
                    (SCALAR.get(sub, min))(&w, &a, &mut want);
                    (k.get(sub, min))(&w, &a, &mut got);
                    let same = want.iter().flatten().zip(got.iter().flatten());
                    for (x, y) in same {
                        assert_eq!(x.to_bits(), y.to_bits(), "{isa:?} sub {sub} min {min}");
                    }
                }
            }
        }
    }
}
