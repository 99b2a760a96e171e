//! Float GEMM micro-kernel (portable tier; the AVX2 twin is `x86/avx2_sgemm.rs`).
//!
//! A micro-kernel multiplies one packed strip of [`SG_MR`] weight rows (`a`: `kc` groups of 6 f32,
//! value `r` of group `k` holding row `r`'s element `k`) by one packed activation panel (`bp`: `kc`
//! groups of [`SG_NR`] f32, value `c` of group `k` holding column `c`'s element `k`) and writes
//! `out[r * SG_NR + c] = sum_k a[k][r] * bp[k][c]`, accumulated in k order from zero, then added
//! to `out` (when `acc`) or stored. The `mul_mat` driver (`ops/mul_mat_f.rs`) sums these partial
//! sums block by block of `kc`, in the same order whatever the thread count.

/// Weight rows per micro-kernel call.
pub(crate) const SG_MR: usize = 6;
/// Activation columns per packed panel.
pub(crate) const SG_NR: usize = 16;

/// See the module docs; with `acc` the products are added to `out` instead of replacing it.
/// Panics if a slice is shorter than `kc` groups (an internal bug).
pub(crate) type SgemmFn =
    fn(kc: usize, a: &[f32], bp: &[f32], out: &mut [f32; SG_MR * SG_NR], acc: bool);

/// Two strips against one panel: `sgemm(kc, a0, bp, out0, acc)` then `sgemm(kc, a1, bp, out1,
/// acc)`, the same sums in the same order (a tier with wide registers keeps both tiles'
/// accumulators live at once).
pub(crate) type Sgemm2Fn = fn(
    kc: usize,
    a0: &[f32],
    a1: &[f32],
    bp: &[f32],
    out0: &mut [f32; SG_MR * SG_NR],
    out1: &mut [f32; SG_MR * SG_NR],
    acc: bool,
);

/// Two strips against two panels: tile `2 s + p` is strip `s` by panel `p`, the same sums in the
/// same order as four `sgemm` calls.
pub(crate) type Sgemm22Fn =
    fn(kc: usize, a: [&[f32]; 2], bp: [&[f32]; 2], out: [&mut [f32; SG_MR * SG_NR]; 4], acc: bool);

// BF16 pairs (`KernelTable::sgemm_bf16`: one strip, two strips, two by two): the same
// signatures with `kc` counting pairs of K values; every f32 slot of the strips and the panel holds two BF16 values (element
// 2j in the low half, 2j + 1 in the high half) as raw bits, and the kernel sums their products
// with the CPU's BF16 dot-product instruction.

/// Packs `kc` elements of [`SG_MR`] rows into a weight strip: `out[k * SG_MR + r] = rows[r][k]`.
/// Each row holds at least `kc` little-endian f32 (`kc * 4` bytes, any alignment); `out` at least
/// `kc * SG_MR` values. Pure data movement: every tier writes the same values.
pub(crate) type PackStripFn = fn(kc: usize, rows: [&[u8]; SG_MR], out: &mut [f32]);

/// As [`PackStripFn`] for F16 rows (`kc * 2` bytes each), converted to f32 on the way.
pub(crate) type PackStripF16Fn = fn(kc: usize, rows: [&[u8]; SG_MR], out: &mut [f32]);

/// Checks the slice lengths every strip packer relies on (`es` bytes per element).
#[inline(always)]
pub(crate) fn check_pack_es(kc: usize, es: usize, rows: &[&[u8]; SG_MR], out: &[f32]) {
    assert!(rows.iter().all(|r| r.len() >= kc * es), "pack_strip: row too short");
    assert!(out.len() >= kc * SG_MR, "pack_strip: strip too short");
}

/// Portable F16 strip packer.
pub(crate) fn pack_strip_f16(kc: usize, rows: [&[u8]; SG_MR], out: &mut [f32]) {
    check_pack_es(kc, 2, &rows, out);
    for (r, row) in rows.iter().enumerate() {
        for (g, v) in out[..kc * SG_MR].chunks_exact_mut(SG_MR).zip(row.chunks_exact(2)) {
            g[r] = crate::quant::util::fp16_to_fp32(u16::from_le_bytes([v[0], v[1]]));
        }
    }
}

/// Checks the slice lengths every strip packer relies on.
#[inline(always)]
pub(crate) fn check_pack(kc: usize, rows: &[&[u8]; SG_MR], out: &[f32]) {
    assert!(rows.iter().all(|r| r.len() >= kc * 4), "pack_strip: row too short");
    assert!(out.len() >= kc * SG_MR, "pack_strip: strip too short");
}

/// Portable strip packer.
pub(crate) fn pack_strip(kc: usize, rows: [&[u8]; SG_MR], out: &mut [f32]) {
    check_pack(kc, &rows, out);
    for (r, row) in rows.iter().enumerate() {
        for (g, v) in out[..kc * SG_MR].chunks_exact_mut(SG_MR).zip(row.chunks_exact(4)) {
            g[r] = f32::from_le_bytes([v[0], v[1], v[2], v[3]]);
        }
    }
}

/// Rounds every value to the nearest F16 (ties to even, as ggml's F16C conversion) and back.
pub(crate) fn round_f16(x: &mut [f32]) {
    use crate::quant::util::{fp16_to_fp32, fp32_to_fp16};
    for v in x {
        *v = fp16_to_fp32(fp32_to_fp16(*v));
    }
}

/// Rounds every value to the nearest BF16 (ggml's `GGML_FP32_TO_BF16`, NaN kept quiet) and back.
pub(crate) fn round_bf16(x: &mut [f32]) {
    use crate::quant::util::{bf16_to_fp32, fp32_to_bf16};
    for v in x {
        *v = bf16_to_fp32(fp32_to_bf16(*v));
    }
}

/// Checks the slice lengths every tier relies on.
#[inline(always)]
pub(crate) fn check(kc: usize, a: &[f32], bp: &[f32]) {
    assert!(a.len() >= kc * SG_MR, "sgemm: weight strip too short");
    assert!(bp.len() >= kc * SG_NR, "sgemm: activation panel too short");
}

/// Portable micro-kernel (plain multiply and add, vectorised by the compiler where it can).
pub(crate) fn sgemm_6x16(
    kc: usize,
    a: &[f32],
    bp: &[f32],
    out: &mut [f32; SG_MR * SG_NR],
    acc: bool,
) {
    check(kc, a, bp);
    let mut t = [0f32; SG_MR * SG_NR];
    for k in 0..kc {
        let b: &[f32; SG_NR] = bp[k * SG_NR..(k + 1) * SG_NR].try_into().unwrap();
        for r in 0..SG_MR {
            let av = a[k * SG_MR + r];
            let o = &mut t[r * SG_NR..(r + 1) * SG_NR];
            for c in 0..SG_NR {
                o[c] += av * b[c];
            }
        }
    }
    for (o, v) in out.iter_mut().zip(t) {
        *o = if acc { *o + v } else { v };
    }
}

/// Rows of a BF16 tile strip and columns of a BF16 tile panel (`KernelTable::tile_bf16`).
pub(crate) const TB_MR: usize = 16;
/// K values per step of the BF16 tile kernels (one A tile row: 32 BF16 values).
pub(crate) const TB_K: usize = 32;
/// BF16 values of one strip step: 16 rows of [`TB_K`].
pub(crate) const TB_STRIP_STEP: usize = TB_MR * TB_K;
/// f32 slots of one panel step: [`TB_K`] / 2 rows of BF16 pairs, 16 columns each.
pub(crate) const TB_PANEL_STEP: usize = TB_K / 2 * SG_NR;

/// BF16 tile products (`KernelTable::tile_bf16`): `a.len()` strips (1 or 2) by `b.len()`
/// panels (1 or 2) over `steps` steps of [`TB_K`] K values into the 16 x 16 f32 tiles `out`
/// (tile `s * b.len() + p` is strip `s` by panel `p`, element `(r, c)` at `r * 16 + c`).
///
/// A strip step is [`TB_STRIP_STEP`] BF16 values (raw bits), row `r` of the step's 32 K values
/// at `r * 32`; a panel step [`TB_PANEL_STEP`] f32 slots, BF16 pair `j` of column `c` at `j *
/// 16 + c` (element 2j in the low half, 2j + 1 in the high half: `float::pack_panel` with
/// pairs). Each tile starts from `out` (`acc`) or zero and every product is added to it in f32
/// (each BF16 product is exact in f32); the order and intermediate precision of the sums are
/// the tile unit's (AMX `tdpbf16ps` documents neither exactly), so a kernel is held to the f32
/// error bound of its sums around [`tile_bf16_portable`], which adds the products one at a
/// time in K order.
pub(crate) type TileBf16Fn =
    fn(steps: usize, a: &[&[u16]], b: &[&[f32]], out: &mut [&mut [f32; 256]], acc: bool);

/// Checks the shapes every BF16 tile kernel relies on.
#[inline(always)]
pub(crate) fn check_tile_bf16(steps: usize, a: &[&[u16]], b: &[&[f32]], out: &[&mut [f32; 256]]) {
    assert!((1..=2).contains(&a.len()) && (1..=2).contains(&b.len()), "tile_bf16: 1 or 2");
    assert_eq!(out.len(), a.len() * b.len(), "tile_bf16: one tile per strip and panel");
    assert!(a.iter().all(|s| s.len() >= steps * TB_STRIP_STEP), "tile_bf16: strip too short");
    assert!(b.iter().all(|p| p.len() >= steps * TB_PANEL_STEP), "tile_bf16: panel too short");
}

/// A BF16 value as f32, subnormals as (signed) zero.
#[cfg(test)]
fn bf16_daz(bits: u16) -> f32 {
    let b = if bits & 0x7F80 == 0 { bits & 0x8000 } else { bits };
    f32::from_bits(u32::from(b) << 16)
}

/// An f32 with subnormals as (signed) zero.
#[cfg(test)]
fn f32_ftz(x: f32) -> f32 {
    if x.is_subnormal() { f32::from_bits(x.to_bits() & 0x8000_0000) } else { x }
}

/// The portable twin of the BF16 tile kernels ([`TileBf16Fn`]): the products of each tile
/// element added one at a time in K order (the tests' reference; no tier runs it).
#[cfg(test)]
pub(crate) fn tile_bf16_portable(
    steps: usize,
    a: &[&[u16]],
    b: &[&[f32]],
    out: &mut [&mut [f32; 256]],
    acc: bool,
) {
    check_tile_bf16(steps, a, b, out);
    let np = b.len();
    for (t, tile) in out.iter_mut().enumerate() {
        let (sa, pb) = (a[t / np], b[t % np]);
        for r in 0..TB_MR {
            for c in 0..SG_NR {
                let mut x = if acc { tile[r * SG_NR + c] } else { 0.0 };
                for j in 0..steps {
                    let (ar, bp) = (&sa[j * TB_STRIP_STEP + r * TB_K..], &pb[j * TB_PANEL_STEP..]);
                    for kp in 0..TB_K / 2 {
                        let pair = bp[kp * SG_NR + c].to_bits();
                        for h in 0..2 {
                            let bv = bf16_daz((pair >> (16 * h)) as u16);
                            x = f32_ftz(bf16_daz(ar[2 * kp + h]).mul_add(bv, x));
                        }
                    }
                }
                tile[r * SG_NR + c] = x;
            }
        }
    }
}
