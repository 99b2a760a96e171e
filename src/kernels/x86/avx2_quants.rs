//! AVX2 `vec_dot` kernels (needs AVX2, FMA and F16C) for the float, legacy, FP4, low-bit, ternary
//! and K-quant formats, after ggml's `src/ggml-cpu/arch/x86/quants.c` and `src/ggml-cpu/vec.cpp`.
//!
//! Each kernel keeps ggml's AVX2 lane layout and float accumulation order, so on the same bytes it
//! returns what ggml's x86 build returns (and the float dots return exactly the bits of the scalar
//! emulations in `crate::quant::fp`). The integer parts may use other instructions than ggml's when
//! they give the same integers per lane: where ggml multiplies signed weights by Q8_0 activations
//! with the sign trick, which wraps on a -128 activation (NaN or infinite inputs make those), these
//! kernels use unsigned levels minus an offset and get the exact sums of ggml's generic code; Q4_0
//! and Q5_0 also take a block with a non-finite scale as a whole, as the generic code does. Only
//! Q8_0 x Q8_0 keeps the sign trick (both sides signed), as ggml's AVX2 code has it. Q2_0 has no AVX2 version in ggml: its kernel here
//! vectorises the integer sums and applies the scales in the order of ggml's generic kernel (the one
//! ggml runs on x86), so it too returns ggml's bits and the scalar tier's.
//!
//! Every kernel is an `unsafe fn` over raw block pointers plus a safe wrapper with the
//! [`VecDotFn`](crate::quant::VecDotFn) signature. The wrappers are private: [`plug`] puts them in a
//! `KernelTable` only after `Isa::Avx2.is_supported()` was checked, which is what makes their
//! `unsafe` calls sound.

#![allow(non_snake_case)] // ggml's names (`vec_dot_q4_K_q8_K`) so the code reads next to ggml's.

use std::arch::x86_64::*;
use std::mem::{offset_of, size_of};

use crate::dtype::{DType, QK_K};
use crate::kernels::KernelTable;
use crate::quant::fp4::{BlockMxfp4, BlockNvfp4, KVALUES_MXFP4};
use crate::quant::kquants::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
use crate::quant::legacy::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1};
use crate::quant::lowbit::{BlockQ1_0, BlockQ2_0};
use crate::quant::ternary::{BlockTq1_0, BlockTq2_0};

/// Registers every kernel of this file in `t` (called by `plug_avx2` for a supported CPU).
pub(crate) fn plug(t: &mut KernelTable, _: super::Avx2) {
    t.set_vec_dot(DType::F32, vec_dot_f32);
    t.set_vec_dot(DType::F16, vec_dot_f16);
    t.set_vec_dot(DType::BF16, vec_dot_bf16);
    t.set_vec_dot(DType::Q4_0, vec_dot_q4_0_q8_0);
    t.set_vec_dot(DType::Q4_1, vec_dot_q4_1_q8_1);
    t.set_vec_dot(DType::Q5_0, vec_dot_q5_0_q8_0);
    t.set_vec_dot(DType::Q5_1, vec_dot_q5_1_q8_1);
    t.set_vec_dot(DType::Q8_0, vec_dot_q8_0_q8_0);
    t.set_vec_dot(DType::MXFP4, vec_dot_mxfp4_q8_0);
    t.set_vec_dot(DType::NVFP4, vec_dot_nvfp4_q8_0);
    t.set_vec_dot(DType::Q1_0, vec_dot_q1_0_q8_0);
    t.set_vec_dot(DType::Q2_0, vec_dot_q2_0_q8_0);
    t.set_vec_dot(DType::TQ1_0, vec_dot_tq1_0_q8_K);
    t.set_vec_dot(DType::TQ2_0, vec_dot_tq2_0_q8_K);
    t.set_vec_dot(DType::Q2_K, vec_dot_q2_K_q8_K);
    t.set_vec_dot(DType::Q3_K, vec_dot_q3_K_q8_K);
    t.set_vec_dot(DType::Q4_K, vec_dot_q4_K_q8_K);
    t.set_vec_dot(DType::Q5_K, vec_dot_q5_K_q8_K);
    t.set_vec_dot(DType::Q6_K, vec_dot_q6_K_q8_K);
    t.set_gemm(DType::F32, gemm_f32);
    t.set_gemm(DType::F16, gemm_f16);
    t.set_gemm(DType::BF16, gemm_bf16);
    // Decode variants (same arithmetic, a software prefetch of the weight row ahead; see
    // `STREAM_PF`). F16 and BF16 measured best at 1 KiB ahead on Zen 5 (6-18% less time than
    // without), at 4 KiB on Zen 4 (3 alternating rounds of 4096 x 1 x 14336, 2 threads, medians:
    // f16 6.06 ms at 1 KiB, 5.31 at 4 KiB; bf16 6.05, 5.55); they take 4 KiB.
    t.set_vec_dot_stream(DType::F16, vec_dot_f16_stream);
    t.set_vec_dot_stream(DType::BF16, vec_dot_bf16_stream);
    t.set_vec_dot_stream(DType::Q4_0, vec_dot_q4_0_q8_0_stream);
    t.set_vec_dot_stream(DType::Q8_0, vec_dot_q8_0_q8_0_stream);
    t.set_vec_dot_stream(DType::Q4_1, vec_dot_q4_1_q8_1_stream);
    t.set_vec_dot_stream(DType::Q5_1, vec_dot_q5_1_q8_1_stream);
    t.set_vec_dot_stream(DType::Q5_0, vec_dot_q5_0_q8_0_stream);
    t.set_vec_dot_stream(DType::NVFP4, vec_dot_nvfp4_q8_0_stream);
    t.set_vec_dot_stream(DType::MXFP4, vec_dot_mxfp4_q8_0_stream);
    // Zen 4 (AMD family 0x19 with AVX-512) prefetches into L2 (`PF_4K_L2`).
    let zen4 = super::amd_family() == Some(0x19) && std::arch::is_x86_feature_detected!("avx512f");
    t.set_vec_dot_stream(
        DType::TQ2_0,
        if zen4 { vec_dot_tq2_0_q8_K_stream_l2 } else { vec_dot_tq2_0_q8_K_stream },
    );
    t.set_vec_dot_stream(DType::Q2_K, vec_dot_q2_K_q8_K_stream);
    t.set_vec_dot_stream(DType::Q3_K, vec_dot_q3_K_q8_K_stream);
    t.set_vec_dot_stream(DType::Q4_K, vec_dot_q4_K_q8_K_stream);
    t.set_vec_dot_stream(DType::Q5_K, vec_dot_q5_K_q8_K_stream);
    t.set_vec_dot_stream(DType::Q6_K, vec_dot_q6_K_q8_K_stream);
    // Two-row forms of streaming dots (set after them: see `VecDot2Fn`), where they measured
    // faster (paired in-process A/B, 4096 x 1 x 14336, 2 threads, two runs, in L3 / from
    // memory): q4_1 1.22-1.25x / 1.24-1.25x, q5_1 1.06-1.11x / 1.13-1.16x. Q5_0 (0.98-1.05x),
    // Q4_K (0.99-1.04x) and Q6_K (0.88-0.97x in L3, 1.02-1.06x from memory) measured no gain and
    // keep one row at a time.
    // F16 and BF16 decode two rows at a time too: the rows share the activation's conversions.
    // Zen 3, 2 threads, `decode-stream T 4096 14336 2 5`, 8 alternating rounds, medians: f16
    // 4.56 -> 4.10 ms (1.11x, 25 -> 29 GB/s), bf16 5.05 -> 4.89 ms (1.05x).
    t.set_vec_dot2_stream(DType::F16, vec_dot2_f16_stream);
    t.set_vec_dot2_stream(DType::BF16, vec_dot2_bf16_stream);
    t.set_vec_dot2_stream(DType::Q4_0, vec_dot2_q4_0_q8_0_stream);
    // Q1_0 (no prefetching variant) two rows at a time: the rows share the activation blocks'
    // loads and scales. Zen 3, 2 threads, old and new binaries alternating: `decode-stream q1_0
    // 4096 14336 2 5` 1.04x (8 rounds, 0.97-1.14), `matmul q1_0 4096 1 14336 2 30` 1.09x (6
    // rounds, 1.00-1.10).
    t.set_vec_dot2_stream(DType::Q1_0, vec_dot2_q1_0_q8_0);
    t.set_vec_dot2_stream(DType::Q5_0, vec_dot2_q5_0_q8_0_stream);
    t.set_vec_dot2_stream(DType::Q8_0, vec_dot2_q8_0_q8_0_stream);
    t.set_vec_dot2_stream(DType::Q4_1, vec_dot2_q4_1_q8_1_stream);
    t.set_vec_dot2_stream(DType::Q5_1, vec_dot2_q5_1_q8_1_stream);
    t.set_vec_dot2_stream(DType::MXFP4, vec_dot2_mxfp4_q8_0_stream);
    t.set_vec_dot2_stream(DType::NVFP4, vec_dot2_nvfp4_q8_0_stream);
    // Their run forms (`VecDotPairsFn`): one call per run of row pairs.
    t.set_vec_dot_pairs(DType::Q1_0, vec_dot_pairs_q1_0_q8_0);
    t.set_vec_dot_pairs(DType::Q4_0, vec_dot_pairs_q4_0_q8_0_stream);
    t.set_vec_dot_pairs(DType::Q5_0, vec_dot_pairs_q5_0_q8_0_stream);
    t.set_vec_dot_pairs(DType::Q8_0, vec_dot_pairs_q8_0_q8_0_stream);
    t.set_vec_dot_pairs(DType::Q4_1, vec_dot_pairs_q4_1_q8_1_stream);
    t.set_vec_dot_pairs(DType::Q5_1, vec_dot_pairs_q5_1_q8_1_stream);
    t.set_vec_dot_pairs(DType::MXFP4, vec_dot_pairs_mxfp4_q8_0_stream);
    t.set_vec_dot_pairs(DType::NVFP4, vec_dot_pairs_nvfp4_q8_0_stream);
}

/// The Q5_0 and Q5_1 dots with the fifth bits applied through AVX-512 mask registers (one
/// masked move a block instead of ggml's five-instruction byte expansion; the same integers and
/// bits), called by the AVX-512 tier's `plug`. 4096 x 1 x 14336, 2 threads of an Emerald Rapids
/// Xeon, plans of both tiers in one process computing in turn (40 computes in L3, 6 of 33
/// weight copies from memory), two runs: q5_1 1.08-1.14x in L3 and 1.07-1.09x from memory,
/// q5_0 1.04x and 0.97-1.09x.
pub(super) fn plug_masked(t: &mut KernelTable, _: super::Avx512) {
    t.set_vec_dot(DType::Q5_0, vec_dot_q5_0_q8_0_m);
    t.set_vec_dot(DType::Q5_1, vec_dot_q5_1_q8_1_m);
    t.set_vec_dot_stream(DType::Q5_0, vec_dot_q5_0_q8_0_m_stream);
    t.set_vec_dot_stream(DType::Q5_1, vec_dot_q5_1_q8_1_m_stream);
    t.set_vec_dot2_stream(DType::Q5_0, vec_dot2_q5_0_q8_0_m_stream);
    t.set_vec_dot2_stream(DType::Q5_1, vec_dot2_q5_1_q8_1_m_stream);
    t.set_vec_dot_pairs(DType::Q5_0, vec_dot_pairs_q5_0_q8_0_m_stream);
    t.set_vec_dot_pairs(DType::Q5_1, vec_dot_pairs_q5_1_q8_1_m_stream);
}

/// The AVX-512 VNNI forms of the Q4_0, Q4_1, Q5_1 and Q8_0 dots (plain, streaming and
/// two-row), where the CPU has AVX-512 VNNI (called by the AVX-512 tier's `plug` after
/// `plug_masked`, whose Q5_1 forms these replace). The same bits: `vpdpbusd` sums each four
/// products exactly, as `maddubs` + `madd` do for these operands. One process, the AVX2 and
/// the VNNI two-row dots in turn, 4096 x 1 x 14336, 2 threads, each order once: in L3 q4_0
/// 1.03-1.10x, q4_1 1.03-1.04x, q5_1 1.01-1.02x, q8_0 1.03-1.04x; from memory 1.02-1.08x,
/// 1.05-1.12x, 1.04-1.32x, 0.99-1.01x. (IQ4_NL's AVX-512 VNNI form is
/// `avx512_quants::plug_vnni`'s.)
pub(super) fn plug_vnni_dots(t: &mut KernelTable, _: super::Avx512) {
    if !std::arch::is_x86_feature_detected!("avx512vnni") {
        return;
    }
    t.set_vec_dot(DType::Q4_0, vec_dot_q4_0_q8_0_v);
    t.set_vec_dot(DType::Q4_1, vec_dot_q4_1_q8_1_v);
    t.set_vec_dot(DType::Q5_1, vec_dot_q5_1_q8_1_v);
    t.set_vec_dot(DType::Q8_0, vec_dot_q8_0_q8_0_v);
    t.set_vec_dot_stream(DType::Q4_0, vec_dot_q4_0_q8_0_v_stream);
    t.set_vec_dot_stream(DType::Q4_1, vec_dot_q4_1_q8_1_v_stream);
    t.set_vec_dot_stream(DType::Q5_1, vec_dot_q5_1_q8_1_v_stream);
    t.set_vec_dot_stream(DType::Q8_0, vec_dot_q8_0_q8_0_v_stream);
    t.set_vec_dot2_stream(DType::Q4_0, vec_dot2_q4_0_q8_0_v_stream);
    t.set_vec_dot2_stream(DType::Q4_1, vec_dot2_q4_1_q8_1_v_stream);
    t.set_vec_dot2_stream(DType::Q5_1, vec_dot2_q5_1_q8_1_v_stream);
    t.set_vec_dot2_stream(DType::Q8_0, vec_dot2_q8_0_q8_0_v_stream);
    t.set_vec_dot_pairs(DType::Q4_0, vec_dot_pairs_q4_0_q8_0_v_stream);
    t.set_vec_dot_pairs(DType::Q4_1, vec_dot_pairs_q4_1_q8_1_v_stream);
    t.set_vec_dot_pairs(DType::Q5_1, vec_dot_pairs_q5_1_q8_1_v_stream);
    t.set_vec_dot_pairs(DType::Q8_0, vec_dot_pairs_q8_0_q8_0_v_stream);
}

/// The masked Q5_1 forms without VNNI (plain, streaming, two-row), which `plug_vnni_dots`
/// replaces where the CPU has AVX-512 VNNI, for the tests to compare with the AVX2 tier there
/// too. Callers check for the AVX-512 tier before calling them.
#[cfg(test)]
pub(super) fn masked_q5_1_forms()
-> (DType, crate::kernels::VecDotFn, crate::kernels::VecDotFn, Option<crate::kernels::VecDot2Fn>) {
    (
        DType::Q5_1,
        vec_dot_q5_1_q8_1_m,
        vec_dot_q5_1_q8_1_m_stream,
        Some(vec_dot2_q5_1_q8_1_m_stream),
    )
}

// ------------------------------------------------------------------------------------------------
// Safe wrappers.

/// Prefetches the line `d` bytes past `p` into L1 (a hint: never faults, never changes a result).
#[inline(always)]
fn prefetch_ahead(p: *const u8, d: usize) {
    // SAFETY: prefetch reads nothing architecturally and never faults; `wrapping_add` keeps the
    // address computation defined past the end of the row.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(d) as *const i8) };
}

/// Prefetches the lines of one `XB`-byte block `d` bytes past `p` (a hint, as [`prefetch_ahead`]).
#[inline(always)]
pub(super) fn prefetch_lines<const XB: usize>(p: *const u8, d: usize) {
    prefetch_lines_to::<XB, false>(p, d);
}

/// [`prefetch_lines`] into L1 or, with `L2`, into L2 only (`_MM_HINT_T1`).
#[inline(always)]
fn prefetch_lines_to<const XB: usize, const L2: bool>(p: *const u8, d: usize) {
    let mut off = 0;
    while off < XB {
        if L2 {
            // SAFETY: as `prefetch_ahead`: no architectural read, no fault, wrapping address.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(off + d) as *const i8) };
        } else {
            prefetch_ahead(p.wrapping_add(off), d);
        }
        off += 64;
    }
}

/// Prefetches, `d` bytes ahead, the stream of `XB`-byte blocks that block `ib` of `x` belongs to:
/// every line of a block of 64 bytes or more, and for a smaller block its first byte (so every
/// line is asked for, some twice: asking once every `64 / XB` blocks instead measured up to 20%
/// slower for Q4_1, the modulo and branch costing more than the repeated hints). A hint, as
/// [`prefetch_ahead`].
#[inline(always)]
pub(super) fn prefetch_stream<const XB: usize>(x: *const u8, ib: usize, d: usize) {
    if XB >= 64 {
        prefetch_lines::<XB>(x.wrapping_add(ib * XB), d);
    } else {
        prefetch_ahead(x.wrapping_add(ib * XB), d);
    }
}

/// [`prefetch_stream`] for blocks of 64 bytes or more into L2 (`_MM_HINT_T1`) rather than L1 (a
/// hint: never faults, never changes a result).
#[inline(always)]
fn prefetch_stream_l2<const XB: usize>(x: *const u8, ib: usize, d: usize) {
    const { assert!(XB >= 64) };
    prefetch_lines_to::<XB, true>(x.wrapping_add(ib * XB), d);
}

/// The decode forms that prefetch 4 KiB ahead into L2 rather than L1 (an odd distance asks
/// [`prefetch_stream_at`] for L2): on Zen 4 the Q4_K, Q5_K and Q6_K forms of the AVX-512 tier
/// (`avx512_kquants::plug`) and TQ2_0's (`plug`). Zen 4, `decode-stream T 4096 14336 2 5`, L1
/// and L2 hints alternating, medians: in a quiet phase (3 rounds) q4_K 25.1 -> 30.4 GB/s, q5_K
/// 27.1 -> 30.3, q6_K 28.7 -> 31.9, tq2_0 26.8 -> 31.3; with the memory contended (4-5 rounds,
/// every round's ratio above 1) 22.6 -> 25.5, 21.5 -> 25.4, 24.5 -> 31.6, 18.5 -> 22.5. The
/// legacy dots and Q2_K lost with the L2 hint under contention (ratios 0.7-0.9) and keep L1.
pub(super) const PF_4K_L2: usize = STREAM_PF + 1;

/// A decode form's prefetch `PF` bytes ahead: into L1 for an even `PF`, into L2 for an odd one
/// (`PF - 1` bytes ahead; see [`PF_4K_L2`]).
#[inline(always)]
pub(super) fn prefetch_stream_at<const XB: usize, const PF: usize>(x: *const u8, ib: usize) {
    if PF % 2 == 1 {
        prefetch_stream_l2::<XB>(x, ib, PF - 1);
    } else {
        prefetch_stream::<XB>(x, ib, PF);
    }
}

/// How far ahead (bytes) the decode variants of the Q4_1, Q5_0, Q5_1, K-quant, NVFP4, TQ2_0 and
/// IQ4/IQ3_S/IQ2_S kernels prefetch the weight row. Paired in-process runs of 4096 x 14336 decode (2
/// threads, the kernel switched between computes of one plan) measured 1-16 KiB: 4 KiB was best or
/// within 2% of best for all of them, 1.2-1.6x the kernel without prefetch (Q4_K/Q5_K/Q6_K/TQ2_0
/// ~1.3-1.6x, Q4_1/Q5_1/Q2_K/Q3_K/Q5_0/IQ3_S ~1.2x, IQ4_NL/IQ4_XS/NVFP4 ~1.3x). The gain depends
/// on how loaded the memory is: in the test machine's fast phases Q5_0 measured no gain (and no loss).
/// Q1_0, Q2_0, IQ1_M, IQ1_S, IQ2_XS and IQ3_XXS gained nothing (or lost up to 10%) with the
/// weights in L3 and keep their plain kernels in this tier; so does F32, whose decode is bound by
/// memory bandwidth. MXFP4 measured no gain in L3 on Zen 5 but prefetches (two rows at a time)
/// since a Zen 3 run from memory: 1.17x (6 alternating rounds of two binaries, medians, 2.28 ->
/// 1.89 ms, every round ahead). Q4_0 and Q8_0 did not gain on Zen 5 but do on Zen 4 (4096 x 1 x 14336, 3
/// alternating rounds, medians: q4_0 2.99 -> 2.19 ms, q8_0 4.37 -> 2.73 ms), so they prefetch too.
pub(super) const STREAM_PF: usize = 4096;

/// How many whole blocks of `n / per_block` both slices really hold. The `VecDotFn` contract makes
/// this `n / per_block`; taking the minimum keeps the kernels in bounds even if it were broken.
#[inline(always)]
pub(super) fn whole_blocks(
    n: usize,
    per_block: usize,
    x: &[u8],
    xb: usize,
    y: &[u8],
    yb: usize,
) -> usize {
    let nb = n / per_block;
    debug_assert!(x.len() >= nb * xb && y.len() >= nb * yb, "vec_dot slices too short");
    nb.min(x.len() / xb).min(y.len() / yb)
}

/// Puts back this tier's BF16 matmul dots (the GEMM tiles and the streaming dot, ggml's AVX2
/// order) over a later tier's.
pub(super) fn plug_bf16(t: &mut KernelTable, _: super::Avx2) {
    t.set_gemm(DType::BF16, gemm_bf16);
    t.set_vec_dot_stream(DType::BF16, vec_dot_bf16_stream);
}

/// Safe two-row streaming dots (`KernelTable::vec_dot2_stream`) over a kernel taking
/// `(nb, [x0, x1], y)`.
/// One-row entry points (`unsafe fn name<PF>(nb, x, y) -> f32`) of `R`-row forms that need
/// the features `$features`, as the one-row wrappers take them.
macro_rules! one_row {
    ($features:literal: $($name:ident => $rows:ident;)*) => {$(
        /// One row of the `R`-row form.
        ///
        /// # Safety
        /// As the `R`-row form, for one row.
        #[target_feature(enable = $features)]
        unsafe fn $name<const PF: usize>(nb: usize, x: *const u8, y: *const u8) -> f32 {
            // SAFETY: the caller's guarantees.
            unsafe { $rows::<PF, 1>(nb, [x], y)[0] }
        }
    )*};
}

/// An entry `name + pairs => kernel, ...` also gets the run form `pairs`
/// (`KernelTable::vec_dot_pairs`) of the two-row form `name`, its loop compiled with the
/// kernels' `$features` (which let it inline them).
macro_rules! wrappers2 {
    ($features:literal; $($(#[$doc:meta])* $name:ident $(+ $pairs:ident)? => $kernel:path,
       $per_block:expr, $xb:expr, $yb:expr;)*) => {$(
        $(#[$doc])*
        fn $name(n: usize, x: [&[u8]; 2], y: &[u8]) -> [f32; 2] {
            let nb = whole_blocks(n, $per_block, x[0], $xb, y, $yb)
                .min(whole_blocks(n, $per_block, x[1], $xb, y, $yb));
            // SAFETY: `whole_blocks` caps `nb` so that both weight rows hold `nb` blocks of `$xb`
            // bytes and `y` `nb` blocks of `$yb` bytes; `plug` installs this only where AVX2,
            // FMA and F16C are supported, a kernel that also needs the AVX-512 tier
            // (`*_masked*`) only `plug_masked` does, which takes the tier's proof, and one that
            // needs AVX-512 VNNI too (`*_vnni*`) only `plug_vnni_dots`, after detecting it.
            unsafe { $kernel(nb, x.map(<[u8]>::as_ptr), y.as_ptr()) }
        }
        $(
            /// The run form of the two-row form above (`VecDotPairsFn`).
            fn $pairs(n: usize, x: [&[u8]; 2], stride: usize, y: &[u8], out: &mut [[f32; 2]]) {
                /// Every pair of the run, the constants and the prologue once.
                ///
                /// # Safety
                /// The CPU supports `$features` (all the kernel needs); `y` holds `nb` blocks of
                /// `$yb` bytes and both `x` hold `nb` blocks of `$xb` bytes at `t * stride` for
                /// every `t < out.len()`.
                #[target_feature(enable = $features)]
                unsafe fn run(
                    nb: usize,
                    x: [*const u8; 2],
                    stride: usize,
                    y: *const u8,
                    out: &mut [[f32; 2]],
                ) {
                    for (t, o) in out.iter_mut().enumerate() {
                        // SAFETY: the caller's guarantees, for pair `t`.
                        *o = unsafe { $kernel(nb, x.map(|p| p.add(t * stride)), y) };
                    }
                }
                let nb = n / $per_block;
                // The last pair's rows end inside both slices (no overflow on any input).
                let holds = |s: &[u8]| {
                    out.len().checked_sub(1).is_none_or(|last| {
                        last.checked_mul(stride)
                            .and_then(|o| o.checked_add(nb * $xb))
                            .is_some_and(|end| end <= s.len())
                    })
                };
                if y.len() < nb * $yb || !holds(x[0]) || !holds(x[1]) {
                    // Rows cut short: one two-row call per pair, on what each row holds.
                    for (t, o) in out.iter_mut().enumerate() {
                        let at = t.saturating_mul(stride);
                        let rows = x.map(|s| s.get(at..).unwrap_or_default());
                        *o = $name(n, rows, y);
                    }
                    return;
                }
                // SAFETY: checked just above: `y` holds `nb` blocks and each `x` holds `nb`
                // blocks at every `t * stride`, `t < out.len()` (the last one ends inside, the
                // earlier ones start before it); this is installed only where the two-row form
                // is, after the same feature checks, and `$features` are the kernel's. With every
                // row whole, the two-row form would take the same `nb` (`whole_blocks`), so the
                // bits are its.
                unsafe { run(nb, x.map(<[u8]>::as_ptr), stride, y.as_ptr(), out) }
            }
        )?
    )*};
}

/// Two half-precision weight rows against one activation row (F16 or BF16 elements, 2 bytes).
macro_rules! half_pairs {
    ($($(#[$doc:meta])* $name:ident => $kernel:path;)*) => {$(
        $(#[$doc])*
        fn $name(n: usize, x: [&[u8]; 2], y: &[u8]) -> [f32; 2] {
            let n = whole_blocks(n, 1, x[0], 2, y, 2).min(whole_blocks(n, 1, x[1], 2, y, 2));
            // SAFETY: `whole_blocks` caps `n` so that both weight rows and `y` hold `n` elements
            // of 2 bytes; `plug` installs this only where AVX2, FMA and F16C are supported.
            unsafe { $kernel(n, x[0].as_ptr(), x[1].as_ptr(), y.as_ptr()) }
        }
    )*};
}

half_pairs! {
    /// Two rows of `vec_dot_f16_stream`.
    vec_dot2_f16_stream => vec_dot_f16_x2_avx2::<STREAM_PF>;
    /// Two rows of `vec_dot_bf16_stream`.
    vec_dot2_bf16_stream => vec_dot_bf16_x2_avx2::<STREAM_PF>;
}

wrappers2! {
    "avx2,fma,f16c";
    /// Two rows of `vec_dot_q4_0_q8_0_stream`.
    vec_dot2_q4_0_q8_0_stream + vec_dot_pairs_q4_0_q8_0_stream => vec_dot2_q4_0_q8_0_avx2::<STREAM_PF>, 32, size_of::<BlockQ4_0>(), size_of::<BlockQ8_0>();
    /// Two rows of `vec_dot_q5_0_q8_0_stream`.
    vec_dot2_q5_0_q8_0_stream + vec_dot_pairs_q5_0_q8_0_stream => vec_dot2_q5_0_q8_0_avx2::<STREAM_PF>, 32, size_of::<BlockQ5_0>(), size_of::<BlockQ8_0>();
    /// Two rows of `vec_dot_q8_0_q8_0_stream`.
    vec_dot2_q8_0_q8_0_stream + vec_dot_pairs_q8_0_q8_0_stream => vec_dot2_q8_0_q8_0_avx2::<STREAM_PF>, 32, size_of::<BlockQ8_0>(), size_of::<BlockQ8_0>();
    /// Two rows of `vec_dot_q4_1_q8_1_stream`.
    vec_dot2_q4_1_q8_1_stream + vec_dot_pairs_q4_1_q8_1_stream => q4_1_q8_1_rows::<STREAM_PF, 2, false>, 32, size_of::<BlockQ4_1>(), size_of::<BlockQ8_1>();
    /// Two rows of `vec_dot_q5_1_q8_1_stream`.
    vec_dot2_q5_1_q8_1_stream + vec_dot_pairs_q5_1_q8_1_stream => q5_1_q8_1_rows::<STREAM_PF, 2, false, false>, 32, size_of::<BlockQ5_1>(), size_of::<BlockQ8_1>();
    /// Two rows of `vec_dot_mxfp4_q8_0_stream`.
    vec_dot2_mxfp4_q8_0_stream + vec_dot_pairs_mxfp4_q8_0_stream => mxfp4_q8_0_rows::<STREAM_PF, 2>, 32, size_of::<BlockMxfp4>(), size_of::<BlockQ8_0>();
    /// Two rows of `vec_dot_q1_0_q8_0`.
    vec_dot2_q1_0_q8_0 + vec_dot_pairs_q1_0_q8_0 => q1_0_q8_0_rows::<2>, 128, size_of::<BlockQ1_0>(), 4 * size_of::<BlockQ8_0>();
    /// Two rows of `vec_dot_nvfp4_q8_0_stream`.
    vec_dot2_nvfp4_q8_0_stream + vec_dot_pairs_nvfp4_q8_0_stream => nvfp4_q8_0_rows::<STREAM_PF, 2>, 64, size_of::<BlockNvfp4>(), 2 * size_of::<BlockQ8_0>();
}

macro_rules! wrappers {
    ($($(#[$doc:meta])* $name:ident => $kernel:path, $per_block:expr, $xb:expr, $yb:expr;)*) => {$(
        $(#[$doc])*
        fn $name(n: usize, x: &[u8], y: &[u8]) -> f32 {
            let nb = whole_blocks(n, $per_block, x, $xb, y, $yb);
            // SAFETY: `whole_blocks` caps `nb` so that `x` holds `nb` units of `$xb` bytes and `y`
            // `nb` units of `$yb` bytes, which is all the kernel reads; `plug` only installs this
            // wrapper after the CPU was found to support AVX2, FMA and F16C, a kernel that also
            // needs the AVX-512 tier (`*_masked*`) only `plug_masked` does, which takes the
            // tier's proof, and one that needs AVX-512 VNNI too (`*_vnni*`) only
            // `plug_vnni_dots`, after detecting it.
            unsafe { $kernel(nb, x.as_ptr(), y.as_ptr()) }
        }
    )*};
}

wrappers! {
    /// `ggml_vec_dot_f32` (AVX2 build).
    vec_dot_f32 => vec_dot_f32_avx2, 1, 4, 4;
    /// `ggml_vec_dot_f16` (AVX2 + F16C build).
    vec_dot_f16 => vec_dot_f16_avx2::<0>, 1, 2, 2;
    /// `ggml_vec_dot_bf16` (AVX2 build).
    vec_dot_bf16 => vec_dot_bf16_avx2::<0>, 1, 2, 2;
    /// `ggml_vec_dot_q4_0_q8_0`.
    vec_dot_q4_0_q8_0 => vec_dot_q4_0_q8_0_avx2::<0>, 32, size_of::<BlockQ4_0>(), size_of::<BlockQ8_0>();
    /// `ggml_vec_dot_q4_1_q8_1`.
    vec_dot_q4_1_q8_1 => vec_dot_q4_1_q8_1_avx2::<0>, 32, size_of::<BlockQ4_1>(), size_of::<BlockQ8_1>();
    /// `ggml_vec_dot_q5_0_q8_0`.
    vec_dot_q5_0_q8_0 => vec_dot_q5_0_q8_0_avx2::<0>, 32, size_of::<BlockQ5_0>(), size_of::<BlockQ8_0>();
    /// `ggml_vec_dot_q5_1_q8_1`.
    vec_dot_q5_1_q8_1 => vec_dot_q5_1_q8_1_avx2::<0>, 32, size_of::<BlockQ5_1>(), size_of::<BlockQ8_1>();
    /// `vec_dot_f16` prefetching the weights 4 KiB ahead, for rows streamed once from memory.
    vec_dot_f16_stream => vec_dot_f16_avx2::<STREAM_PF>, 1, 2, 2;
    /// `vec_dot_bf16` prefetching the weights 4 KiB ahead.
    vec_dot_bf16_stream => vec_dot_bf16_avx2::<STREAM_PF>, 1, 2, 2;
    /// `vec_dot_q4_0_q8_0` prefetching the weights 4 KiB ahead.
    vec_dot_q4_0_q8_0_stream => vec_dot_q4_0_q8_0_avx2::<STREAM_PF>, 32, size_of::<BlockQ4_0>(), size_of::<BlockQ8_0>();
    /// `vec_dot_q8_0_q8_0` prefetching the weights 4 KiB ahead.
    vec_dot_q8_0_q8_0_stream => vec_dot_q8_0_q8_0_avx2::<STREAM_PF>, 32, size_of::<BlockQ8_0>(), size_of::<BlockQ8_0>();
    /// `vec_dot_q4_1_q8_1` prefetching the weights 4 KiB ahead.
    vec_dot_q4_1_q8_1_stream => vec_dot_q4_1_q8_1_avx2::<STREAM_PF>, 32, size_of::<BlockQ4_1>(), size_of::<BlockQ8_1>();
    /// `vec_dot_q5_1_q8_1` prefetching the weights 4 KiB ahead.
    vec_dot_q5_1_q8_1_stream => vec_dot_q5_1_q8_1_avx2::<STREAM_PF>, 32, size_of::<BlockQ5_1>(), size_of::<BlockQ8_1>();
    /// `ggml_vec_dot_q8_0_q8_0`.
    vec_dot_q8_0_q8_0 => vec_dot_q8_0_q8_0_avx2::<0>, 32, size_of::<BlockQ8_0>(), size_of::<BlockQ8_0>();
    /// `ggml_vec_dot_mxfp4_q8_0`.
    vec_dot_mxfp4_q8_0 => vec_dot_mxfp4_q8_0_avx2::<0>, 32, size_of::<BlockMxfp4>(), size_of::<BlockQ8_0>();
    /// `ggml_vec_dot_nvfp4_q8_0`: one NVFP4 block against two Q8_0 blocks.
    vec_dot_nvfp4_q8_0 => vec_dot_nvfp4_q8_0_avx2::<0>, 64, size_of::<BlockNvfp4>(), 2 * size_of::<BlockQ8_0>();
    /// `ggml_vec_dot_q1_0_q8_0`: one Q1_0 block against four Q8_0 blocks.
    vec_dot_q1_0_q8_0 => vec_dot_q1_0_q8_0_avx2, 128, size_of::<BlockQ1_0>(), 4 * size_of::<BlockQ8_0>();
    /// `ggml_vec_dot_q2_0_q8_0` (ggml has no AVX2 version): one Q2_0 block against two Q8_0 blocks.
    vec_dot_q2_0_q8_0 => vec_dot_q2_0_q8_0_avx2, 64, size_of::<BlockQ2_0>(), 2 * size_of::<BlockQ8_0>();
    /// `ggml_vec_dot_tq1_0_q8_K`.
    vec_dot_tq1_0_q8_K => vec_dot_tq1_0_q8_K_avx2, QK_K, size_of::<BlockTq1_0>(), size_of::<BlockQ8K>();
    /// `ggml_vec_dot_tq2_0_q8_K`.
    vec_dot_tq2_0_q8_K => vec_dot_tq2_0_q8_K_avx2::<0>, QK_K, size_of::<BlockTq2_0>(), size_of::<BlockQ8K>();
    /// `ggml_vec_dot_q2_K_q8_K`.
    vec_dot_q2_K_q8_K => vec_dot_q2_K_q8_K_avx2::<0>, QK_K, size_of::<BlockQ2K>(), size_of::<BlockQ8K>();
    /// `ggml_vec_dot_q3_K_q8_K`.
    vec_dot_q3_K_q8_K => vec_dot_q3_K_q8_K_avx2::<0>, QK_K, size_of::<BlockQ3K>(), size_of::<BlockQ8K>();
    /// `ggml_vec_dot_q4_K_q8_K`.
    vec_dot_q4_K_q8_K => vec_dot_q4_K_q8_K_avx2::<0>, QK_K, size_of::<BlockQ4K>(), size_of::<BlockQ8K>();
    /// `ggml_vec_dot_q5_K_q8_K`.
    vec_dot_q5_K_q8_K => vec_dot_q5_K_q8_K_avx2::<0>, QK_K, size_of::<BlockQ5K>(), size_of::<BlockQ8K>();
    /// `ggml_vec_dot_q6_K_q8_K`.
    vec_dot_q6_K_q8_K => vec_dot_q6_K_q8_K_avx2::<0>, QK_K, size_of::<BlockQ6K>(), size_of::<BlockQ8K>();
    /// `vec_dot_q5_0_q8_0` prefetching the weights 4 KiB bytes ahead.
    vec_dot_q5_0_q8_0_stream => vec_dot_q5_0_q8_0_avx2::<STREAM_PF>, 32, size_of::<BlockQ5_0>(), size_of::<BlockQ8_0>();
    /// `vec_dot_mxfp4_q8_0` prefetching the weights 4 KiB ahead.
    vec_dot_mxfp4_q8_0_stream => vec_dot_mxfp4_q8_0_avx2::<STREAM_PF>, 32, size_of::<BlockMxfp4>(), size_of::<BlockQ8_0>();
    /// `vec_dot_nvfp4_q8_0` prefetching the weights 4 KiB bytes ahead.
    vec_dot_nvfp4_q8_0_stream => vec_dot_nvfp4_q8_0_avx2::<STREAM_PF>, 64, size_of::<BlockNvfp4>(), 2 * size_of::<BlockQ8_0>();
    /// `vec_dot_tq2_0_q8_K` prefetching the weights 4 KiB bytes ahead.
    vec_dot_tq2_0_q8_K_stream => vec_dot_tq2_0_q8_K_avx2::<STREAM_PF>, QK_K, size_of::<BlockTq2_0>(), size_of::<BlockQ8K>();
    /// `vec_dot_tq2_0_q8_K` prefetching the weights 4 KiB ahead into L2 (`PF_4K_L2`).
    vec_dot_tq2_0_q8_K_stream_l2 => vec_dot_tq2_0_q8_K_avx2::<PF_4K_L2>, QK_K, size_of::<BlockTq2_0>(), size_of::<BlockQ8K>();
    /// `vec_dot_q2_K_q8_K` prefetching the weights 4 KiB bytes ahead.
    vec_dot_q2_K_q8_K_stream => vec_dot_q2_K_q8_K_avx2::<STREAM_PF>, QK_K, size_of::<BlockQ2K>(), size_of::<BlockQ8K>();
    /// `vec_dot_q3_K_q8_K` prefetching the weights 4 KiB bytes ahead.
    vec_dot_q3_K_q8_K_stream => vec_dot_q3_K_q8_K_avx2::<STREAM_PF>, QK_K, size_of::<BlockQ3K>(), size_of::<BlockQ8K>();
    /// `vec_dot_q4_K_q8_K` prefetching the weights 4 KiB bytes ahead.
    vec_dot_q4_K_q8_K_stream => vec_dot_q4_K_q8_K_avx2::<STREAM_PF>, QK_K, size_of::<BlockQ4K>(), size_of::<BlockQ8K>();
    /// `vec_dot_q5_K_q8_K` prefetching the weights 4 KiB bytes ahead.
    vec_dot_q5_K_q8_K_stream => vec_dot_q5_K_q8_K_avx2::<STREAM_PF>, QK_K, size_of::<BlockQ5K>(), size_of::<BlockQ8K>();
    /// `vec_dot_q6_K_q8_K` prefetching the weights 4 KiB bytes ahead.
    vec_dot_q6_K_q8_K_stream => vec_dot_q6_K_q8_K_avx2::<STREAM_PF>, QK_K, size_of::<BlockQ6K>(), size_of::<BlockQ8K>();
}

wrappers! {
    /// `vec_dot_q4_0_q8_0` by `vpdpbusd` (`plug_vnni_dots`).
    vec_dot_q4_0_q8_0_v => vec_dot_q4_0_q8_0_vnni::<0>, 32, size_of::<BlockQ4_0>(), size_of::<BlockQ8_0>();
    /// `vec_dot_q4_0_q8_0_stream` by `vpdpbusd` (`plug_vnni_dots`).
    vec_dot_q4_0_q8_0_v_stream => vec_dot_q4_0_q8_0_vnni::<STREAM_PF>, 32, size_of::<BlockQ4_0>(), size_of::<BlockQ8_0>();
    /// `vec_dot_q4_1_q8_1` by `vpdpbusd` (`plug_vnni_dots`).
    vec_dot_q4_1_q8_1_v => vec_dot_q4_1_q8_1_vnni1::<0>, 32, size_of::<BlockQ4_1>(), size_of::<BlockQ8_1>();
    /// `vec_dot_q4_1_q8_1_stream` by `vpdpbusd` (`plug_vnni_dots`).
    vec_dot_q4_1_q8_1_v_stream => vec_dot_q4_1_q8_1_vnni1::<STREAM_PF>, 32, size_of::<BlockQ4_1>(), size_of::<BlockQ8_1>();
    /// `vec_dot_q5_1_q8_1` by `vpdpbusd` and mask registers (`plug_vnni_dots`).
    vec_dot_q5_1_q8_1_v => vec_dot_q5_1_q8_1_vnni1::<0>, 32, size_of::<BlockQ5_1>(), size_of::<BlockQ8_1>();
    /// `vec_dot_q5_1_q8_1_stream` by `vpdpbusd` and mask registers (`plug_vnni_dots`).
    vec_dot_q5_1_q8_1_v_stream => vec_dot_q5_1_q8_1_vnni1::<STREAM_PF>, 32, size_of::<BlockQ5_1>(), size_of::<BlockQ8_1>();
    /// `vec_dot_q8_0_q8_0` by `vpdpbusd` (`plug_vnni_dots`).
    vec_dot_q8_0_q8_0_v => vec_dot_q8_0_q8_0_vnni1::<0>, 32, size_of::<BlockQ8_0>(), size_of::<BlockQ8_0>();
    /// `vec_dot_q8_0_q8_0_stream` by `vpdpbusd` (`plug_vnni_dots`).
    vec_dot_q8_0_q8_0_v_stream => vec_dot_q8_0_q8_0_vnni1::<STREAM_PF>, 32, size_of::<BlockQ8_0>(), size_of::<BlockQ8_0>();
    /// `vec_dot_q5_0_q8_0` through mask registers (`plug_masked`).
    vec_dot_q5_0_q8_0_m => vec_dot_q5_0_q8_0_masked::<0>, 32, size_of::<BlockQ5_0>(), size_of::<BlockQ8_0>();
    /// `vec_dot_q5_0_q8_0_stream` through mask registers (`plug_masked`).
    vec_dot_q5_0_q8_0_m_stream => vec_dot_q5_0_q8_0_masked::<STREAM_PF>, 32, size_of::<BlockQ5_0>(), size_of::<BlockQ8_0>();
    /// `vec_dot_q5_1_q8_1` through mask registers (`plug_masked`).
    vec_dot_q5_1_q8_1_m => vec_dot_q5_1_q8_1_masked1::<0>, 32, size_of::<BlockQ5_1>(), size_of::<BlockQ8_1>();
    /// `vec_dot_q5_1_q8_1_stream` through mask registers (`plug_masked`).
    vec_dot_q5_1_q8_1_m_stream => vec_dot_q5_1_q8_1_masked1::<STREAM_PF>, 32, size_of::<BlockQ5_1>(), size_of::<BlockQ8_1>();
}

wrappers2! {
    "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c";
    /// `vec_dot2_q5_0_q8_0_stream` through mask registers (`plug_masked`).
    vec_dot2_q5_0_q8_0_m_stream + vec_dot_pairs_q5_0_q8_0_m_stream => vec_dot2_q5_0_q8_0_masked::<STREAM_PF>, 32, size_of::<BlockQ5_0>(), size_of::<BlockQ8_0>();
    /// `vec_dot2_q5_1_q8_1_stream` through mask registers (`plug_masked`).
    vec_dot2_q5_1_q8_1_m_stream + vec_dot_pairs_q5_1_q8_1_m_stream => vec_dot_q5_1_q8_1_masked::<STREAM_PF, 2>, 32, size_of::<BlockQ5_1>(), size_of::<BlockQ8_1>();
}

wrappers2! {
    "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c";
    /// Two rows of `vec_dot_q4_0_q8_0_v_stream` (`plug_vnni_dots`).
    vec_dot2_q4_0_q8_0_v_stream + vec_dot_pairs_q4_0_q8_0_v_stream => vec_dot2_q4_0_q8_0_vnni::<STREAM_PF>, 32, size_of::<BlockQ4_0>(), size_of::<BlockQ8_0>();
    /// Two rows of `vec_dot_q4_1_q8_1_v_stream` (`plug_vnni_dots`).
    vec_dot2_q4_1_q8_1_v_stream + vec_dot_pairs_q4_1_q8_1_v_stream => vec_dot_q4_1_q8_1_vnni::<STREAM_PF, 2>, 32, size_of::<BlockQ4_1>(), size_of::<BlockQ8_1>();
    /// Two rows of `vec_dot_q5_1_q8_1_v_stream` (`plug_vnni_dots`).
    vec_dot2_q5_1_q8_1_v_stream + vec_dot_pairs_q5_1_q8_1_v_stream => vec_dot_q5_1_q8_1_vnni::<STREAM_PF, 2>, 32, size_of::<BlockQ5_1>(), size_of::<BlockQ8_1>();
    /// Two rows of `vec_dot_q8_0_q8_0_v_stream` (`plug_vnni_dots`).
    vec_dot2_q8_0_q8_0_v_stream + vec_dot_pairs_q8_0_q8_0_v_stream => vec_dot_q8_0_q8_0_vnni::<STREAM_PF, 2>, 32, size_of::<BlockQ8_0>(), size_of::<BlockQ8_0>();
}

// ------------------------------------------------------------------------------------------------
// Unaligned scalar reads.

/// # Safety
/// `p` is valid for reading 2 bytes.
#[inline(always)]
pub(super) unsafe fn rd_u16(p: *const u8) -> u16 {
    // SAFETY: the caller guarantees 2 readable bytes; `read_unaligned` needs no alignment.
    unsafe { p.cast::<u16>().read_unaligned() }
}

/// # Safety
/// `p` is valid for reading 4 bytes.
#[inline(always)]
pub(super) unsafe fn rd_u32(p: *const u8) -> u32 {
    // SAFETY: the caller guarantees 4 readable bytes; `read_unaligned` needs no alignment.
    unsafe { p.cast::<u32>().read_unaligned() }
}

/// # Safety
/// `p` is valid for reading 8 bytes.
#[inline(always)]
unsafe fn rd_u64(p: *const u8) -> u64 {
    // SAFETY: the caller guarantees 8 readable bytes; `read_unaligned` needs no alignment.
    unsafe { p.cast::<u64>().read_unaligned() }
}

/// # Safety
/// `p` is valid for reading 4 bytes.
#[inline(always)]
pub(super) unsafe fn rd_f32(p: *const u8) -> f32 {
    // SAFETY: the caller guarantees 4 readable bytes; `read_unaligned` needs no alignment.
    unsafe { p.cast::<f32>().read_unaligned() }
}

// ------------------------------------------------------------------------------------------------
// Register helpers (ggml's names).

/// `GGML_CPU_FP16_TO_FP32` on an F16C machine (`_cvtsh_ss`).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn fp16_to_fp32(h: u16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

/// Every f16 as f32, exactly as F16C's `vcvtph2ps` converts it (signalling NaNs come out quiet).
///
/// Kernels read block scales from this table, as ggml's x86 CPU code does (`ggml_table_f32_f16`),
/// rather than converting each one: a scalar `vcvtph2ps` needs a `vpinsrw` into an arbitrary
/// register, which can chain every block's scale onto the accumulator's latency (a false
/// dependency), and a broadcast conversion costs twice the micro-ops of two table loads. Built at
/// compile time from the bits; a test checks it against the instruction.
pub(super) static F16_TO_F32: [f32; 1 << 16] = {
    let mut t = [0.0f32; 1 << 16];
    let mut h = 0usize;
    while h < 1 << 16 {
        t[h] = crate::quant::util::fp16_to_fp32(h as u16);
        h += 1;
    }
    t
};

/// `GGML_CPU_FP16_TO_FP32(h)` in all eight lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn fp16_splat(h: u16) -> __m256 {
    _mm256_set1_ps(F16_TO_F32[h as usize])
}

/// Up to four f16 values, the first in the low 16 bits of `packed`, as f32.
#[inline(always)]
fn fp16x4_to_fp32(packed: u64) -> [f32; 4] {
    std::array::from_fn(|i| F16_TO_F32[(packed >> (16 * i)) as u16 as usize])
}

/// Two f16 values as f32.
#[inline(always)]
fn fp16x2_to_fp32(a: u16, b: u16) -> (f32, f32) {
    (F16_TO_F32[a as usize], F16_TO_F32[b as usize])
}

/// `hsum_float_8`: the horizontal sum of 8 floats in ggml's order.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn hsum_float_8(x: __m256) -> f32 {
    let mut r = _mm_add_ps(_mm256_extractf128_ps::<1>(x), _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}

/// `GGML_F32x8_REDUCE` over four accumulators.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn f32x8_reduce(s: [__m256; 4]) -> f32 {
    let s0 = _mm256_add_ps(_mm256_add_ps(s[0], s[2]), _mm256_add_ps(s[1], s[3]));
    let t0 = _mm_add_ps(_mm256_castps256_ps128(s0), _mm256_extractf128_ps::<1>(s0));
    let t1 = _mm_hadd_ps(t0, t0);
    _mm_cvtss_f32(_mm_hadd_ps(t1, t1))
}

/// `bytes_from_nibbles_32`: 16 bytes of nibble pairs to 32 bytes in 0..=15, low nibbles first.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn bytes_from_nibbles_32(packed: __m128i) -> __m256i {
    // Both halves hold the 16 bytes; the high half's 64-bit words shifted right by 4 bring each
    // byte's high nibble to its low bits (the bits shifted in from the next byte are masked off).
    // Two operations after the broadcast (which folds into the load), where the halves built
    // apart take three.
    let bytes =
        _mm256_srlv_epi64(_mm256_broadcastsi128_si256(packed), _mm256_set_epi64x(4, 4, 0, 0));
    _mm256_and_si256(bytes, _mm256_set1_epi8(0x0F))
}

/// The 32 values of 16 packed nibbles looked up in the 16-entry table `values` (in both halves):
/// the low nibbles' values in the low half, the high nibbles' in the high half (ggml's layout of
/// IQ4_NL and MXFP4 blocks). One table lookup on the 256-bit register of
/// [`bytes_from_nibbles_32`].
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn nibble_values_32(values: __m256i, packed: __m128i) -> __m256i {
    _mm256_shuffle_epi8(values, bytes_from_nibbles_32(packed))
}

/// `bytes_from_bits_32`: bit `j` of `x` to byte `j`, 0xFF when set.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn bytes_from_bits_32(x: u32) -> __m256i {
    let shuf = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0x0000_0000_0000_0000,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x as i32), shuf);
    let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe));
    _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
}

/// `mul_sum_us8_pairs_float`: unsigned times signed bytes, groups of four summed, as floats.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn mul_sum_us8_pairs_float(ax: __m256i, sy: __m256i) -> __m256 {
    let dot = _mm256_maddubs_epi16(ax, sy);
    _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_set1_epi16(1), dot))
}

/// `mul_sum_i8_pairs_float`: signed times signed bytes, groups of four summed, as floats.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn mul_sum_i8_pairs_float(x: __m256i, y: __m256i) -> __m256 {
    mul_sum_us8_pairs_float(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
}

/// This helper, and the legacy loops that take `VNNI` or `MASK` (`q4_0_q8_0_rows`,
/// `q5_1_q8_1_rows`, `f16_scaled_rows` and the rest), are `#[inline(always)]` without target
/// features, to be called only from functions with AVX2, FMA and F16C enabled (and, for `VNNI`
/// or `MASK`, the AVX-512 features): so their AVX-512 forms are compiled inside the AVX-512 entry
/// points. As `#[target_feature(enable = "avx2,fma,f16c")]` functions they could not take in the
/// AVX-512 instructions (`dpbusd_zero`, `masked_16`), and where the compiler left a long loop out
/// of line each block paid a call: Q4_0 decode on Zen 4 at 4096 x 1 x 14336, 2 threads, read
/// 5.2-5.8 ms that way and 1.35-1.43 ms inlined, Q5_1 5.2-6.2 and 1.77-1.83.
///
/// Unsigned times signed bytes, groups of four summed in int32: with `VNNI` one `vpdpbusd`,
/// else `maddubs` and `madd` by ones (the same integers: no 16-bit pair sum of the callers'
/// operands saturates, see each caller).
///
/// # Safety
/// With `VNNI`, the CPU supports AVX-512 VNNI and VL.
#[inline(always)]
pub(super) unsafe fn us8_sums<const VNNI: bool>(ax: __m256i, sy: __m256i) -> __m256i {
    // SAFETY: the caller runs with AVX2 enabled, and with `VNNI` with AVX-512 VNNI and VL.
    unsafe {
        if VNNI {
            dpbusd_zero(ax, sy)
        } else {
            _mm256_madd_epi16(_mm256_set1_epi16(1), _mm256_maddubs_epi16(ax, sy))
        }
    }
}

/// `vpdpbusd` into zero: unsigned times signed bytes, groups of four summed in int32, exactly.
#[target_feature(enable = "avx512f,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
fn dpbusd_zero(ax: __m256i, sy: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, sy)
}

/// [`mul_sum_us8_pairs_float`] through [`us8_sums`] (the same floats).
///
/// # Safety
/// As [`us8_sums`].
#[inline(always)]
unsafe fn us8_sums_float<const VNNI: bool>(ax: __m256i, sy: __m256i) -> __m256 {
    // SAFETY: the caller's guarantee (AVX2 enabled, and `us8_sums`'s).
    unsafe { _mm256_cvtepi32_ps(us8_sums::<VNNI>(ax, sy)) }
}

/// `sum(x * y)` over each group of four bytes, for `x = u - off` with unsigned `u` and signed `y`:
/// `maddubs(u, y) - maddubs(off, y)`. The same lanes as ggml's `mul_sum_i8_pairs` sign trick and
/// the same integers, but exact when `y` holds -128 (the sign trick negates it to -128: ggml's AVX2
/// kernels wrap there, its generic ones and the format definition do not). Every 16-bit
/// intermediate stays below 2 * 31 * 128.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn mul_sum_offset_u8_i8(u: __m256i, off: i8, y: __m256i) -> __m256i {
    mul_sum_offset_pairs(u, offset_pairs(off, y), y)
}

/// `maddubs(off, y)`: the offset's pair sums of [`mul_sum_offset_u8_i8`], computed once for the
/// weight rows that share the activations `y`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn offset_pairs(off: i8, y: __m256i) -> __m256i {
    _mm256_maddubs_epi16(_mm256_set1_epi8(off), y)
}

/// [`mul_sum_offset_u8_i8`] with the offset's pair sums `offp` ([`offset_pairs`] of `y`) given.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn mul_sum_offset_pairs(u: __m256i, offp: __m256i, y: __m256i) -> __m256i {
    let p = _mm256_sub_epi16(_mm256_maddubs_epi16(u, y), offp);
    _mm256_madd_epi16(p, _mm256_set1_epi16(1))
}

/// `hsum_i32_8`: the sum of eight i32 lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn hsum_i32_8(a: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256::<1>(a));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s)))
}

/// `kvalues_fp4` plus 12 (so 0..=24, unsigned) as a register.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn kvalues_fp4_plus_12() -> __m128i {
    const K: [i8; 16] = {
        let mut k = KVALUES_MXFP4;
        let mut i = 0;
        while i < 16 {
            k[i] += 12;
            i += 1;
        }
        k
    };
    let k = K;
    _mm_setr_epi8(
        k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7], k[8], k[9], k[10], k[11], k[12], k[13],
        k[14], k[15],
    )
}

/// `GGML_CPU_UE4M3_TO_FP32` as ggml's CPU backend has it: a table of `ggml_ue4m3_to_fp32` (halved
/// UE4M3 scales; 0 and 0x7F are zero, the top bit is ignored). Every entry is exact in f32.
static UE4M3_TO_FP32: [f32; 256] = {
    let mut t = [0.0f32; 256];
    let mut x = 1;
    while x < 256 {
        if x != 0x7F {
            let exp = ((x >> 3) & 0xF) as i32;
            let man = (x & 0x7) as f32;
            // 2^(exp - 7) with exp in 1..=15, built from its bits.
            let p2 = f32::from_bits(((exp - 7 + 127) as u32) << 23);
            let raw = if exp == 0 { man * (1.0 / 512.0) } else { (1.0 + man / 8.0) * p2 };
            t[x] = raw * 0.5;
        }
        x += 1;
    }
    t
};

/// `GGML_CPU_E8M0_TO_FP32_HALF` as ggml's CPU backend has it: a table of `ggml_e8m0_to_fp32_half`.
pub(super) static E8M0_TO_FP32_HALF: [f32; 256] = {
    let mut t = [0.0f32; 256];
    let mut e = 0;
    while e < 256 {
        let bits = if e < 2 { 0x0020_0000u32 << e } else { (e as u32 - 1) << 23 };
        t[e] = f32::from_bits(bits);
        e += 1;
    }
    t
};

/// ggml's `get_scale_shuffle_q3k(i)`: in the low half the 16-bit scale `2i`, in the high half
/// `2i + 1`, for a 256-bit register holding eight 16-bit scales in each half.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn scale_shuffle_q3k(i: i8) -> __m256i {
    let (a, b) = (4 * i, 4 * i + 2);
    let lo = _mm_set1_epi16(i16::from_le_bytes([a as u8, a as u8 + 1]));
    let hi = _mm_set1_epi16(i16::from_le_bytes([b as u8, b as u8 + 1]));
    _mm256_set_m128i(hi, lo)
}

/// ggml's `get_scale_shuffle_k4(i)`: the 16-bit scale `i` in every lane.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn scale_shuffle_k4(i: u8) -> __m256i {
    _mm256_set1_epi16(i16::from_le_bytes([2 * i, 2 * i + 1]))
}

/// ggml's `get_scale_shuffle(i)`: byte `2i` eight times, then byte `2i + 1` eight times.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn scale_shuffle(i: u8) -> __m128i {
    _mm_set_epi64x(i64::from_le_bytes([2 * i + 1; 8]), i64::from_le_bytes([2 * i; 8]))
}

// ------------------------------------------------------------------------------------------------
// Float dots. `n` elements, any `n`; same order as the scalar emulations in `quant::fp`.

/// Two weight rows against one activation row: (n, x0, x1, y) -> the two dots.
type PairDot = unsafe fn(usize, *const u8, *const u8, *const u8) -> [f32; 2];
/// One weight row against one activation row: (n, x, y) -> the dot.
type OneDot = unsafe fn(usize, *const u8, *const u8) -> f32;

/// A `GemmFn` over float rows of `elem` bytes: weight rows two at a time through `two`, an odd
/// last one through `one`; `out[c * x.len() + r]` is whatever `one(x[r], y[c])` gives, which the
/// pair kernels match bit for bit. Decode (fewer than 6 columns; more take the GEMM) is bound by
/// memory, and two weight streams a thread keep more lines in flight than one.
///
/// # Safety
/// `two` and `one` may be called: the CPU has their target features.
unsafe fn gemm_float_pairs(
    k: usize,
    x: &[&[u8]],
    y: &[&[u8]],
    out: &mut [f32],
    elem: usize,
    two: PairDot,
    one: OneDot,
) {
    let n = x.iter().chain(y).fold(k, |n, s| n.min(s.len() / elem));
    debug_assert_eq!(n, k, "gemm slices too short");
    let rows = x.len();
    assert!(out.len() >= rows * y.len(), "gemm output too short");
    for (c, yc) in y.iter().enumerate() {
        let o = &mut out[c * rows..(c + 1) * rows];
        let mut r = 0;
        while r + 2 <= rows {
            // SAFETY: every slice holds `n` elements (capped above); the caller vouches for the
            // target features.
            o[r..r + 2]
                .copy_from_slice(&unsafe { two(n, x[r].as_ptr(), x[r + 1].as_ptr(), yc.as_ptr()) });
            r += 2;
        }
        if r < rows {
            // SAFETY: as above.
            o[r] = unsafe { one(n, x[r].as_ptr(), yc.as_ptr()) };
        }
    }
}

/// F32 weight rows against F32 activation rows (`GemmFn`), bitwise `vec_dot_f32` for each pair.
fn gemm_f32(k: usize, x: &[&[u8]], y: &[&[u8]], out: &mut [f32]) {
    // SAFETY: `plug` installs this wrapper only after AVX2, FMA and F16C were detected.
    unsafe { gemm_float_pairs(k, x, y, out, 4, vec_dot_f32_x2_avx2, vec_dot_f32_avx2) }
}

/// F16 weight rows against F16 activation rows (`GemmFn`), bitwise `vec_dot_f16` for each pair;
/// prefetching 1 KiB ahead as the decode variant.
fn gemm_f16(k: usize, x: &[&[u8]], y: &[&[u8]], out: &mut [f32]) {
    // SAFETY: as `gemm_f32`.
    unsafe {
        gemm_float_pairs(k, x, y, out, 2, vec_dot_f16_x2_avx2::<1024>, vec_dot_f16_avx2::<1024>)
    }
}

/// BF16 weight rows against BF16 activation rows (`GemmFn`), bitwise `vec_dot_bf16` for each
/// pair; prefetching 1 KiB ahead as the decode variant.
fn gemm_bf16(k: usize, x: &[&[u8]], y: &[&[u8]], out: &mut [f32]) {
    // SAFETY: as `gemm_f32`.
    unsafe {
        gemm_float_pairs(k, x, y, out, 2, vec_dot_bf16_x2_avx2::<1024>, vec_dot_bf16_avx2::<1024>)
    }
}

/// [`vec_dot_f32_avx2`] for two weight rows against one activation row, each row with its own
/// accumulators fed in the same order: bitwise the two single results.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; `x0`, `x1` and `y` are valid for reading `4 * n` bytes.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_f32_x2_avx2(n: usize, x0: *const u8, x1: *const u8, y: *const u8) -> [f32; 2] {
    let (x0, x1, y) = (x0.cast::<f32>(), x1.cast::<f32>(), y.cast::<f32>());
    let np = n & !31;
    let mut s0 = [_mm256_setzero_ps(); 4];
    let mut s1 = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i < np {
        for j in 0..4 {
            // SAFETY: i + 8 * j + 8 <= i + 32 <= np <= n elements are readable in each row.
            let (a0, a1, b) = unsafe {
                (
                    _mm256_loadu_ps(x0.add(i + 8 * j)),
                    _mm256_loadu_ps(x1.add(i + 8 * j)),
                    _mm256_loadu_ps(y.add(i + 8 * j)),
                )
            };
            s0[j] = _mm256_fmadd_ps(a0, b, s0[j]);
            s1[j] = _mm256_fmadd_ps(a1, b, s1[j]);
        }
        i += 32;
    }
    let mut r = [f32x8_reduce(s0), f32x8_reduce(s1)];
    for i in np..n {
        // SAFETY: i < n.
        let (a0, a1, b) = unsafe {
            (x0.add(i).read_unaligned(), x1.add(i).read_unaligned(), y.add(i).read_unaligned())
        };
        r[0] = a0.mul_add(b, r[0]);
        r[1] = a1.mul_add(b, r[1]);
    }
    r
}

/// # Safety
/// The CPU supports AVX2, FMA and F16C; `x` and `y` are valid for reading `4 * n` bytes.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_f32_avx2(n: usize, x: *const u8, y: *const u8) -> f32 {
    let (x, y) = (x.cast::<f32>(), y.cast::<f32>());
    let np = n & !31;
    let mut sum = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i < np {
        for (j, s) in sum.iter_mut().enumerate() {
            // SAFETY: i + 8 * j + 8 <= i + 32 <= np <= n elements are readable.
            let (a, b) =
                unsafe { (_mm256_loadu_ps(x.add(i + 8 * j)), _mm256_loadu_ps(y.add(i + 8 * j))) };
            *s = _mm256_fmadd_ps(a, b, *s);
        }
        i += 32;
    }
    let mut sumf = f32x8_reduce(sum);
    for i in np..n {
        // SAFETY: i < n.
        let (a, b) = unsafe { (x.add(i).read_unaligned(), y.add(i).read_unaligned()) };
        sumf = a.mul_add(b, sumf);
    }
    sumf
}

/// [`vec_dot_f16_avx2`] for two weight rows against one activation row, each row with its own
/// accumulators fed in the same order: bitwise the two single results.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; `x0`, `x1` and `y` are valid for reading `2 * n` bytes.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_f16_x2_avx2<const PF: usize>(
    n: usize,
    x0: *const u8,
    x1: *const u8,
    y: *const u8,
) -> [f32; 2] {
    let (x0, x1, y) = (x0.cast::<u16>(), x1.cast::<u16>(), y.cast::<u16>());
    let np = n & !31;
    let mut s0 = [_mm256_setzero_ps(); 4];
    let mut s1 = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i < np {
        if PF > 0 {
            prefetch_ahead(x0.wrapping_add(i).cast(), PF);
            prefetch_ahead(x1.wrapping_add(i).cast(), PF);
        }
        for j in 0..4 {
            // SAFETY: i + 8 * j + 8 <= np <= n elements are readable in each row.
            let (a0, a1, b) = unsafe {
                (
                    _mm256_cvtph_ps(_mm_loadu_si128(x0.add(i + 8 * j).cast())),
                    _mm256_cvtph_ps(_mm_loadu_si128(x1.add(i + 8 * j).cast())),
                    _mm256_cvtph_ps(_mm_loadu_si128(y.add(i + 8 * j).cast())),
                )
            };
            s0[j] = _mm256_fmadd_ps(a0, b, s0[j]);
            s1[j] = _mm256_fmadd_ps(a1, b, s1[j]);
        }
        i += 32;
    }
    let mut r = [f32x8_reduce(s0) as f64, f32x8_reduce(s1) as f64];
    for i in np..n {
        // SAFETY: i < n.
        let (a0, a1, b) = unsafe {
            (x0.add(i).read_unaligned(), x1.add(i).read_unaligned(), y.add(i).read_unaligned())
        };
        r[0] += (fp16_to_fp32(a0) * fp16_to_fp32(b)) as f64;
        r[1] += (fp16_to_fp32(a1) * fp16_to_fp32(b)) as f64;
    }
    [r[0] as f32, r[1] as f32]
}

/// `PF > 0`: prefetch the line `PF` bytes ahead of each 64 bytes of `x` (a hint; no effect on the
/// result).
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; `x` and `y` are valid for reading `2 * n` bytes.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_f16_avx2<const PF: usize>(n: usize, x: *const u8, y: *const u8) -> f32 {
    let (x, y) = (x.cast::<u16>(), y.cast::<u16>());
    let np = n & !31;
    let mut sum = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i < np {
        if PF > 0 {
            prefetch_ahead(x.wrapping_add(i).cast(), PF);
        }
        for (j, s) in sum.iter_mut().enumerate() {
            // SAFETY: i + 8 * j + 8 <= np <= n elements are readable.
            let (a, b) = unsafe {
                (
                    _mm256_cvtph_ps(_mm_loadu_si128(x.add(i + 8 * j).cast())),
                    _mm256_cvtph_ps(_mm_loadu_si128(y.add(i + 8 * j).cast())),
                )
            };
            *s = _mm256_fmadd_ps(a, b, *s);
        }
        i += 32;
    }
    let mut sumf = f32x8_reduce(sum) as f64;
    for i in np..n {
        // SAFETY: i < n.
        let (a, b) = unsafe { (x.add(i).read_unaligned(), y.add(i).read_unaligned()) };
        sumf += (fp16_to_fp32(a) * fp16_to_fp32(b)) as f64;
    }
    sumf as f32
}

/// # Safety
/// The CPU supports AVX2, FMA and F16C; `x` and `y` are valid for reading `2 * n` bytes.
///
/// ggml's order: four accumulators of eight lanes, accumulator `j` lane `l` summing the products
/// of elements `32 k + 8 j + l` in turn, then `(c0 + c2) + (c1 + c3)` and `hsum_float_8`. ggml
/// widens each eight halves with `vpmovzxwd` and `vpslld`; here one `vpunpck{l,h}wd` against zero
/// widens eight, in the lane order of the 256-bit unpacks: `lo` holds elements 0..4 and 8..12 of
/// 16, `hi` 4..8 and 12..16. The accumulators keep that layout (`a[0]` is the low halves of ggml's
/// c0 and c1, `a[1]` their high halves, `a[2]` and `a[3]` the same for c2 and c3), so each lane
/// sums the very same products in the very same order; the halves are put back in place once, at
/// the end.
///
/// `PF > 0`: prefetch the line `PF` bytes ahead of each 64 bytes of `x`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_bf16_avx2<const PF: usize>(n: usize, x: *const u8, y: *const u8) -> f32 {
    let (x, y) = (x.cast::<u16>(), y.cast::<u16>());
    let np = n & !31;
    let mut a = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i < np {
        if PF > 0 {
            prefetch_ahead(x.wrapping_add(i).cast(), PF);
        }
        for h in 0..2 {
            // SAFETY: i + 16 * h + 16 <= i + 32 <= np <= n elements are readable.
            let (vx, vy) = unsafe {
                (
                    _mm256_loadu_si256(x.add(i + 16 * h).cast()),
                    _mm256_loadu_si256(y.add(i + 16 * h).cast()),
                )
            };
            let ((xl, xh), (yl, yh)) = (widen_bf16(vx), widen_bf16(vy));
            a[2 * h] = _mm256_fmadd_ps(xl, yl, a[2 * h]);
            a[2 * h + 1] = _mm256_fmadd_ps(xh, yh, a[2 * h + 1]);
        }
        i += 32;
    }
    // SAFETY: x and y hold n elements (caller contract).
    unsafe { bf16_finish(a, x, y, np, n) }
}

/// [`vec_dot_bf16_avx2`] for two weight rows against one activation row, each row with its own
/// accumulators fed in the same order: bitwise the two single results.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; `x0`, `x1` and `y` are valid for reading `2 * n` bytes.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_bf16_x2_avx2<const PF: usize>(
    n: usize,
    x0: *const u8,
    x1: *const u8,
    y: *const u8,
) -> [f32; 2] {
    let (x0, x1, y) = (x0.cast::<u16>(), x1.cast::<u16>(), y.cast::<u16>());
    let np = n & !31;
    let mut a = [[_mm256_setzero_ps(); 4]; 2];
    let mut i = 0;
    while i < np {
        if PF > 0 {
            prefetch_ahead(x0.wrapping_add(i).cast(), PF);
            prefetch_ahead(x1.wrapping_add(i).cast(), PF);
        }
        for h in 0..2 {
            // SAFETY: i + 16 * h + 16 <= i + 32 <= np <= n elements are readable in each row.
            let (v0, v1, vy) = unsafe {
                (
                    _mm256_loadu_si256(x0.add(i + 16 * h).cast()),
                    _mm256_loadu_si256(x1.add(i + 16 * h).cast()),
                    _mm256_loadu_si256(y.add(i + 16 * h).cast()),
                )
            };
            let (yl, yh) = widen_bf16(vy);
            for (acc, v) in a.iter_mut().zip([v0, v1]) {
                let (xl, xh) = widen_bf16(v);
                acc[2 * h] = _mm256_fmadd_ps(xl, yl, acc[2 * h]);
                acc[2 * h + 1] = _mm256_fmadd_ps(xh, yh, acc[2 * h + 1]);
            }
        }
        i += 32;
    }
    // SAFETY: x0, x1 and y hold n elements (caller contract).
    unsafe { [bf16_finish(a[0], x0, y, np, n), bf16_finish(a[1], x1, y, np, n)] }
}

/// Eight BF16 values of each 128-bit lane of `v` widened to f32 (`vpunpck{l,h}wd` against zero):
/// `lo` holds elements 0..4 and 8..12 of 16, `hi` 4..8 and 12..16 (see [`vec_dot_bf16_avx2`]).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn widen_bf16(v: __m256i) -> (__m256, __m256) {
    let zero = _mm256_setzero_si256();
    (
        _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v)),
        _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v)),
    )
}

/// The end of [`vec_dot_bf16_avx2`]: the accumulators put back in ggml's layout and reduced as
/// ggml does, then the tail `np..n` in f64.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; `x` and `y` hold `n` elements.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn bf16_finish(a: [__m256; 4], x: *const u16, y: *const u16, np: usize, n: usize) -> f32 {
    let c0 = _mm256_permute2f128_ps::<0x20>(a[0], a[1]);
    let c1 = _mm256_permute2f128_ps::<0x31>(a[0], a[1]);
    let c2 = _mm256_permute2f128_ps::<0x20>(a[2], a[3]);
    let c3 = _mm256_permute2f128_ps::<0x31>(a[2], a[3]);
    let c = _mm256_add_ps(_mm256_add_ps(c0, c2), _mm256_add_ps(c1, c3));
    // SAFETY: x and y hold n elements (contract).
    unsafe { bf16_tail(x, y, np, n, hsum_float_8(c) as f64) as f32 }
}

/// `sumf` plus the products of BF16 elements `np..n` of `x` and `y`, each product taken in f32
/// and added in f64: the scalar tail of ggml's `ggml_vec_dot_bf16` in every build.
///
/// # Safety
/// `x` and `y` are valid for reading `n` BF16 elements.
pub(super) unsafe fn bf16_tail(
    x: *const u16,
    y: *const u16,
    np: usize,
    n: usize,
    sumf: f64,
) -> f64 {
    let widen = |v: u16| f32::from_bits((v as u32) << 16);
    (np..n).fold(sumf, |s, i| {
        // SAFETY: i < n.
        let (a, b) = unsafe { (x.add(i).read_unaligned(), y.add(i).read_unaligned()) };
        s + (widen(a) * widen(b)) as f64
    })
}

// ------------------------------------------------------------------------------------------------
// Legacy formats against Q8_0 / Q8_1. `nb` blocks on each side.

/// # Safety
/// The CPU supports AVX2, FMA and F16C; `x` holds `nb` Q4_0 blocks and `y` `nb` Q8_0 blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_q4_0_q8_0_avx2<const PF: usize>(nb: usize, x: *const u8, y: *const u8) -> f32 {
    // First without the per-block test for a non-finite scale (a tenth of the loop's work). A
    // non-finite scale makes the fast result non-finite (0 * inf and NaN give NaN, anything else
    // an infinity), and a finite result means every scale was finite, where both loops do the very
    // same operations; so the checked loop only has to run when the fast result is not finite.
    // SAFETY: the caller's guarantees are the helper's.
    unsafe { q4_0_q8_0_dot::<PF, false>(nb, x, y) }
}

/// [`vec_dot_q4_0_q8_0_avx2`] and its checked loop; `VNNI` as [`us8_sums`].
///
/// # Safety
/// As [`vec_dot_q4_0_q8_0_avx2`]; with `VNNI`, as [`us8_sums`].
#[inline(always)]
unsafe fn q4_0_q8_0_dot<const PF: usize, const VNNI: bool>(
    nb: usize,
    x: *const u8,
    y: *const u8,
) -> f32 {
    // SAFETY: the caller's guarantees are the helper's.
    let [fast] = unsafe { q4_0_q8_0_rows::<false, PF, 1, VNNI>(nb, [x], y) };
    if fast.is_finite() {
        fast
    } else {
        // SAFETY: as above.
        unsafe { q4_0_q8_0_rows::<true, PF, 1, VNNI>(nb, [x], y)[0] }
    }
}

/// [`vec_dot_q4_0_q8_0_avx2`] for two weight rows against one activation row, each result
/// bitwise that function's.
///
/// # Safety
/// As [`vec_dot_q4_0_q8_0_avx2`], for both rows.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn vec_dot2_q4_0_q8_0_avx2<const PF: usize>(
    nb: usize,
    x: [*const u8; 2],
    y: *const u8,
) -> [f32; 2] {
    // SAFETY: the caller's guarantees are the helper's.
    unsafe { q4_0_q8_0_dot2::<PF, false>(nb, x, y) }
}

/// [`vec_dot2_q4_0_q8_0_avx2`]; `VNNI` as [`us8_sums`].
///
/// # Safety
/// As [`vec_dot2_q4_0_q8_0_avx2`]; with `VNNI`, as [`us8_sums`].
#[inline(always)]
unsafe fn q4_0_q8_0_dot2<const PF: usize, const VNNI: bool>(
    nb: usize,
    x: [*const u8; 2],
    y: *const u8,
) -> [f32; 2] {
    // SAFETY: the caller's guarantees are the helper's.
    let fast = unsafe { q4_0_q8_0_rows::<false, PF, 2, VNNI>(nb, x, y) };
    // SAFETY: as above, for row `r`.
    finite_or(fast, |r| unsafe { q4_0_q8_0_dot::<PF, VNNI>(nb, x[r], y) })
}

/// Each row's result of an unchecked multi-row loop where it is finite, else `checked(r)`: the
/// one-row function, whose checked loop handles blocks with a non-finite scale (see
/// [`q4_0_q8_0_dot`]).
#[inline(always)]
fn finite_or<const R: usize>(fast: [f32; R], checked: impl Fn(usize) -> f32) -> [f32; R] {
    std::array::from_fn(|r| if fast[r].is_finite() { fast[r] } else { checked(r) })
}

/// The Q4_0 loop over `R` weight rows against one activation row ([`f16_scaled_rows`]).
///
/// # Safety
/// As [`vec_dot_q4_0_q8_0_avx2`], for every row of `x`; with `VNNI`, as [`us8_sums`].
#[inline(always)]
unsafe fn q4_0_q8_0_rows<const CHECK: bool, const PF: usize, const R: usize, const VNNI: bool>(
    nb: usize,
    x: [*const u8; R],
    y: *const u8,
) -> [f32; R] {
    // SAFETY: the caller's guarantees; `sums` reads the block's 16 bytes of nibbles.
    unsafe {
        f16_scaled_rows::<CHECK, PF, R, { size_of::<BlockQ4_0>() }, _>(
            nb,
            x,
            y,
            // The offset's sums (8 times each four levels; with `VNNI` in int32, else the pair
            // sums in int16), shared by the rows.
            // SAFETY: the caller's guarantee covers `VNNI`.
            |yq| if VNNI { us8_sums::<VNNI>(_mm256_set1_epi8(8), yq) } else { offset_pairs(8, yq) },
            |bx, yq, off| {
                // SAFETY: `bx` is a whole Q4_0 block (`f16_scaled_rows`).
                let xq = _mm_loadu_si128(bx.add(offset_of!(BlockQ4_0, qs)).cast());
                if VNNI {
                    // The same integers as `mul_sum_offset_u8_i8` (exact int32 sums).
                    // SAFETY: the caller's guarantee covers `VNNI`.
                    _mm256_sub_epi32(us8_sums::<VNNI>(bytes_from_nibbles_32(xq), yq), *off)
                } else {
                    mul_sum_offset_pairs(bytes_from_nibbles_32(xq), *off, yq)
                }
            },
        )
    }
}

/// The loop of the 32-element block types that start with an f16 scale (Q4_0, Q5_0) against
/// Q8_0 activations, over `R` weight rows (each row's operations and their order are the
/// one-row loop's, so every result is bitwise the same; the rows share the activation loads and
/// run independent accumulator chains): per activation block `shared(levels)` once, per row
/// `sums(block, levels, shared)` the block's int32 sums, scaled by the two f16 scales' product.
/// `CHECK` sets blocks with a non-finite scale aside (see [`q4_0_q8_0_dot`]).
///
/// # Safety
/// Called from a function with AVX2, FMA and F16C enabled (see [`us8_sums`] on why this loop
/// has no target features of its own); every row of `x` holds `nb` blocks of `XB` bytes whose
/// first two are the f16 scale, `y` `nb` Q8_0 blocks; `sums` reads only inside the block it is
/// given.
#[inline(always)]
unsafe fn f16_scaled_rows<
    const CHECK: bool,
    const PF: usize,
    const R: usize,
    const XB: usize,
    S,
>(
    nb: usize,
    x: [*const u8; R],
    y: *const u8,
    shared: impl Fn(__m256i) -> S,
    sums: impl Fn(*const u8, __m256i, &S) -> __m256i,
) -> [f32; R] {
    // SAFETY: the caller runs with AVX2, FMA and F16C enabled (and with what its `shared` and
    // `sums` need); every block read stays inside block `ib < nb` of its row, as the caller
    // guarantees.
    unsafe {
        const YB: usize = size_of::<BlockQ8_0>();
        let mut acc = [_mm256_setzero_ps(); R];
        let mut special = [0.0f32; R];
        for ib in 0..nb {
            // In bounds: block `ib < nb` of `y` is readable.
            let (yd, yq) = q8_0_block(y.add(ib * YB));
            let dy = F16_TO_F32[yd as usize];
            let s = shared(yq);
            for r in 0..R {
                if PF > 0 {
                    prefetch_stream::<XB>(x[r], ib, PF);
                }
                // In bounds: block `ib < nb` of row `r` is readable: its first two bytes, and what
                // `sums` reads inside it.
                let (xd, sumi) = {
                    let bx = x[r].add(ib * XB);
                    (rd_u16(bx), sums(bx, yq, &s))
                };
                let dx = F16_TO_F32[xd as usize];
                let d = dx * dy;
                if !CHECK || d.is_finite() {
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc[r]);
                } else {
                    // An infinite or NaN scale: per-lane products would make 0 * inf = NaN where the
                    // block's total is not zero; take the total, as ggml's generic code does.
                    special[r] += hsum_i32_8(sumi) as f32 * dx * dy;
                }
            }
        }
        std::array::from_fn(|r| hsum_float_8(acc[r]) + special[r])
    }
}

/// # Safety
/// The CPU supports AVX2, FMA and F16C; `x` holds `nb` Q4_1 blocks and `y` `nb` Q8_1 blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_q4_1_q8_1_avx2<const PF: usize>(nb: usize, x: *const u8, y: *const u8) -> f32 {
    // SAFETY: the caller's guarantees are the helper's.
    unsafe { q4_1_q8_1_rows::<PF, 1, false>(nb, [x], y)[0] }
}

/// The Q4_1 loop over `R` weight rows against one activation row: each row's operations and
/// their order are the one-row loop's (see [`q4_0_q8_0_rows`]).
///
/// # Safety
/// As [`vec_dot_q4_1_q8_1_avx2`], for every row of `x`; with `VNNI`, as [`us8_sums`].
#[inline(always)]
unsafe fn q4_1_q8_1_rows<const PF: usize, const R: usize, const VNNI: bool>(
    nb: usize,
    x: [*const u8; R],
    y: *const u8,
) -> [f32; R] {
    // SAFETY: the caller runs with AVX2, FMA and F16C enabled (and with what `VNNI` needs);
    // every block read stays inside block `ib < nb` of its row, as the caller guarantees.
    unsafe {
        const XB: usize = size_of::<BlockQ4_1>();
        const YB: usize = size_of::<BlockQ8_1>();
        let mut acc = [_mm256_setzero_ps(); R];
        let mut summs = [0.0f32; R];
        for ib in 0..nb {
            // In bounds: block `ib < nb` of `y` is readable.
            let (yd, ys, yq) = q8_1_block(y.add(ib * YB));
            for r in 0..R {
                if PF > 0 {
                    prefetch_stream::<XB>(x[r], ib, PF);
                }
                // In bounds: block `ib < nb` of row `r` is readable; every read stays inside it.
                let (xd, xm, xq) = {
                    let bx = x[r].add(ib * XB);
                    (
                        rd_u16(bx.add(offset_of!(BlockQ4_1, d))),
                        rd_u16(bx.add(offset_of!(BlockQ4_1, m))),
                        _mm_loadu_si128(bx.add(offset_of!(BlockQ4_1, qs)).cast()),
                    )
                };
                let (m, s) = fp16x2_to_fp32(xm, ys);
                summs[r] = m.mul_add(s, summs[r]);
                let d0d1 = _mm256_set1_ps(F16_TO_F32[xd as usize] * F16_TO_F32[yd as usize]);
                // Pair sums below 2 * 15 * 128: `VNNI` gives the same integers.
                // In bounds: the caller's guarantee covers `VNNI`.
                let xy = { us8_sums_float::<VNNI>(bytes_from_nibbles_32(xq), yq) };
                acc[r] = _mm256_fmadd_ps(d0d1, xy, acc[r]);
            }
        }
        std::array::from_fn(|r| hsum_float_8(acc[r]) + summs[r])
    }
}

/// # Safety
/// The CPU supports AVX2, FMA and F16C; `x` holds `nb` Q5_0 blocks and `y` `nb` Q8_0 blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_q5_0_q8_0_avx2<const PF: usize>(nb: usize, x: *const u8, y: *const u8) -> f32 {
    // SAFETY: the caller's guarantees are the helper's (without `MASK`).
    unsafe { q5_0_q8_0_dot::<PF, false>(nb, x, y) }
}

/// [`vec_dot_q5_0_q8_0_avx2`] with the fifth bits applied through AVX-512 mask registers
/// ([`q5_clear16`]): the same integers, the same bits.
///
/// # Safety
/// The CPU supports the AVX-512 tier (F, BW, DQ, VL) on top of AVX2, FMA and F16C; `x` holds
/// `nb` Q5_0 blocks and `y` `nb` Q8_0 blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
unsafe fn vec_dot_q5_0_q8_0_masked<const PF: usize>(nb: usize, x: *const u8, y: *const u8) -> f32 {
    // SAFETY: the caller's guarantees are the helper's, with `MASK`'s.
    unsafe { q5_0_q8_0_dot::<PF, true>(nb, x, y) }
}

/// The Q5_0 dot: as for Q4_0, the checked loop only when the unchecked one gives a non-finite
/// result.
///
/// # Safety
/// As [`vec_dot_q5_0_q8_0_avx2`]; with `MASK`, as [`vec_dot_q5_0_q8_0_masked`].
#[inline(always)]
unsafe fn q5_0_q8_0_dot<const PF: usize, const MASK: bool>(
    nb: usize,
    x: *const u8,
    y: *const u8,
) -> f32 {
    // SAFETY: the caller's guarantees are the helper's.
    let fast = unsafe { q5_0_q8_0_rows::<false, PF, 1, MASK>(nb, [x], y)[0] };
    if fast.is_finite() {
        fast
    } else {
        // SAFETY: as above.
        unsafe { q5_0_q8_0_rows::<true, PF, 1, MASK>(nb, [x], y)[0] }
    }
}

/// Q5_0's correction bytes: 16 where a level's fifth bit (bit `j` of `qh` for level `j`) is
/// clear, else 0. `MASK`: one AVX-512 masked move; else ggml's byte expansion of the bits.
///
/// # Safety
/// With `MASK`, the CPU supports AVX-512 BW and VL.
#[inline(always)]
unsafe fn q5_clear16<const MASK: bool>(qh: u32) -> __m256i {
    // SAFETY: the caller runs with AVX2 enabled, and with `MASK` with AVX-512 BW and VL.
    unsafe {
        if MASK {
            masked_16::<true>(qh)
        } else {
            _mm256_andnot_si256(bytes_from_bits_32(qh), _mm256_set1_epi8(0x10))
        }
    }
}

/// Q5_1's levels: the nibbles plus 16 where the fifth bit is set (`MASK`: an AVX-512 masked
/// add; else ggml's byte expansion of the bits, or-ed in).
///
/// # Safety
/// With `MASK`, the CPU supports AVX-512 BW and VL.
#[inline(always)]
unsafe fn q5_levels<const MASK: bool>(nibbles: __m256i, qh: u32) -> __m256i {
    // SAFETY: the caller runs with AVX2 enabled, and with `MASK` with AVX-512 BW and VL.
    unsafe {
        if MASK {
            _mm256_add_epi8(nibbles, masked_16::<false>(qh))
        } else {
            let hi = _mm256_and_si256(bytes_from_bits_32(qh), _mm256_set1_epi8(0x10));
            _mm256_or_si256(nibbles, hi)
        }
    }
}

/// 16 in byte `j` where bit `j` of `qh` is set (`CLEAR`: where it is clear), else 0.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
fn masked_16<const CLEAR: bool>(qh: u32) -> __m256i {
    let bits = if CLEAR { !qh } else { qh };
    _mm256_maskz_mov_epi8(_cvtu32_mask32(bits), _mm256_set1_epi8(0x10))
}

/// A Q8_0 block's f16 scale and 32 levels.
///
/// # Safety
/// `by` starts a readable Q8_0 block; the caller runs with AVX2 enabled.
#[inline(always)]
unsafe fn q8_0_block(by: *const u8) -> (u16, __m256i) {
    // SAFETY: both reads stay inside the block (the caller's guarantee), with AVX2 enabled.
    unsafe {
        (
            rd_u16(by.add(offset_of!(BlockQ8_0, d))),
            _mm256_loadu_si256(by.add(offset_of!(BlockQ8_0, qs)).cast()),
        )
    }
}

/// A Q8_1 block's f16 scale, f16 scaled sum and 32 levels.
///
/// # Safety
/// `by` starts a readable Q8_1 block; the caller runs with AVX2 enabled.
#[inline(always)]
unsafe fn q8_1_block(by: *const u8) -> (u16, u16, __m256i) {
    // SAFETY: the three reads stay inside the block (the caller's guarantee), with AVX2 enabled.
    unsafe {
        (
            rd_u16(by.add(offset_of!(BlockQ8_1, d))),
            rd_u16(by.add(offset_of!(BlockQ8_1, s))),
            _mm256_loadu_si256(by.add(offset_of!(BlockQ8_1, qs)).cast()),
        )
    }
}

/// The Q5_0 loop over `R` weight rows against one activation row ([`f16_scaled_rows`]).
///
/// # Safety
/// As [`q5_0_q8_0_dot`], for every row of `x`.
#[inline(always)]
unsafe fn q5_0_q8_0_rows<const CHECK: bool, const PF: usize, const R: usize, const MASK: bool>(
    nb: usize,
    x: [*const u8; R],
    y: *const u8,
) -> [f32; R] {
    // SAFETY: the caller's guarantees; `sums` reads the block's fifth bits and nibbles.
    unsafe {
        f16_scaled_rows::<CHECK, PF, R, { size_of::<BlockQ5_0>() }, _>(
            nb,
            x,
            y,
            |_| (),
            |bx, yq, _| {
                // SAFETY: `bx` is a whole Q5_0 block (`f16_scaled_rows`).
                let (xh, xq) = (
                    rd_u32(bx.add(offset_of!(BlockQ5_0, qh))),
                    _mm_loadu_si128(bx.add(offset_of!(BlockQ5_0, qs)).cast()),
                );
                // Level = nibble + 16 * bit - 16 = nibble - 16 * (bit clear): the nibbles times
                // y less 16 y where the fifth bit is clear, so the bit never has to be merged
                // into the nibble (one instruction a block less than ggml's). Every 16-bit
                // partial stays below 2 * 16 * 128.
                // SAFETY: the caller's guarantee covers `MASK`.
                let clear16 = q5_clear16::<MASK>(xh);
                let p = _mm256_sub_epi16(
                    _mm256_maddubs_epi16(bytes_from_nibbles_32(xq), yq),
                    _mm256_maddubs_epi16(clear16, yq),
                );
                _mm256_madd_epi16(p, _mm256_set1_epi16(1))
            },
        )
    }
}

/// [`q5_0_q8_0_dot`] for two weight rows against one activation row, each result bitwise that
/// function's: the unchecked loop for both, the one-row function for a row whose result is not
/// finite.
///
/// # Safety
/// As [`q5_0_q8_0_dot`], for both rows.
#[inline(always)]
unsafe fn q5_0_q8_0_dot2<const PF: usize, const MASK: bool>(
    nb: usize,
    x: [*const u8; 2],
    y: *const u8,
) -> [f32; 2] {
    // SAFETY: the caller's guarantees are the helper's.
    let fast = unsafe { q5_0_q8_0_rows::<false, PF, 2, MASK>(nb, x, y) };
    // SAFETY: as above, for row `r`.
    finite_or(fast, |r| unsafe { q5_0_q8_0_dot::<PF, MASK>(nb, x[r], y) })
}

/// Two rows of [`vec_dot_q5_0_q8_0_avx2`].
///
/// # Safety
/// As [`vec_dot_q5_0_q8_0_avx2`], for both rows.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn vec_dot2_q5_0_q8_0_avx2<const PF: usize>(
    nb: usize,
    x: [*const u8; 2],
    y: *const u8,
) -> [f32; 2] {
    // SAFETY: the caller's guarantees are the helper's (without `MASK`).
    unsafe { q5_0_q8_0_dot2::<PF, false>(nb, x, y) }
}

/// Two rows of [`vec_dot_q5_0_q8_0_masked`].
///
/// # Safety
/// As [`vec_dot_q5_0_q8_0_masked`], for both rows.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
unsafe fn vec_dot2_q5_0_q8_0_masked<const PF: usize>(
    nb: usize,
    x: [*const u8; 2],
    y: *const u8,
) -> [f32; 2] {
    // SAFETY: the caller's guarantees are the helper's, with `MASK`'s.
    unsafe { q5_0_q8_0_dot2::<PF, true>(nb, x, y) }
}

/// `PF > 0`: prefetch the line `PF` bytes ahead of every other block of `x`.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; `x` holds `nb` Q5_1 blocks and `y` `nb` Q8_1 blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_q5_1_q8_1_avx2<const PF: usize>(nb: usize, x: *const u8, y: *const u8) -> f32 {
    // SAFETY: the caller's guarantees are the helper's (without `MASK`).
    unsafe { q5_1_q8_1_rows::<PF, 1, false, false>(nb, [x], y)[0] }
}

/// [`vec_dot_q5_1_q8_1_avx2`] for `R` rows with the fifth bits applied through AVX-512 mask
/// registers ([`q5_levels`]): the same integers, the same bits.
///
/// # Safety
/// The CPU supports the AVX-512 tier (F, BW, DQ, VL) on top of AVX2, FMA and F16C; every row of
/// `x` holds `nb` Q5_1 blocks and `y` `nb` Q8_1 blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
unsafe fn vec_dot_q5_1_q8_1_masked<const PF: usize, const R: usize>(
    nb: usize,
    x: [*const u8; R],
    y: *const u8,
) -> [f32; R] {
    // SAFETY: the caller's guarantees are the helper's, with `MASK`'s.
    unsafe { q5_1_q8_1_rows::<PF, R, true, false>(nb, x, y) }
}

/// One row of [`vec_dot_q5_1_q8_1_masked`].
///
/// # Safety
/// As [`vec_dot_q5_1_q8_1_masked`].
unsafe fn vec_dot_q5_1_q8_1_masked1<const PF: usize>(nb: usize, x: *const u8, y: *const u8) -> f32 {
    // SAFETY: the caller's guarantees are the callee's.
    unsafe { vec_dot_q5_1_q8_1_masked::<PF, 1>(nb, [x], y)[0] }
}

/// The Q5_1 loop over `R` weight rows against one activation row: each row's operations and
/// their order are the one-row loop's (see [`q4_0_q8_0_rows`]).
///
/// # Safety
/// As [`vec_dot_q5_1_q8_1_avx2`], for every row of `x`; with `MASK`, as
/// [`vec_dot_q5_1_q8_1_masked`]; with `VNNI`, as [`us8_sums`].
#[inline(always)]
unsafe fn q5_1_q8_1_rows<const PF: usize, const R: usize, const MASK: bool, const VNNI: bool>(
    nb: usize,
    x: [*const u8; R],
    y: *const u8,
) -> [f32; R] {
    // SAFETY: the caller runs with AVX2, FMA and F16C enabled (and with what `VNNI` or `MASK`
    // needs); every block read stays inside block `ib < nb` of its row, as the caller guarantees.
    unsafe {
        const XB: usize = size_of::<BlockQ5_1>();
        const YB: usize = size_of::<BlockQ8_1>();
        let mut acc = [_mm256_setzero_ps(); R];
        let mut summs = [0.0f32; R];
        for ib in 0..nb {
            // In bounds: block `ib < nb` of `y` is readable.
            let (yd, ys, yq) = q8_1_block(y.add(ib * YB));
            let dy = fp16_splat(yd);
            for r in 0..R {
                if PF > 0 {
                    prefetch_stream::<XB>(x[r], ib, PF);
                }
                // In bounds: block `ib < nb` of row `r` is readable; every read stays inside it.
                let (xd, xm, xh, xq) = {
                    let bx = x[r].add(ib * XB);
                    (
                        rd_u16(bx.add(offset_of!(BlockQ5_1, d))),
                        rd_u16(bx.add(offset_of!(BlockQ5_1, m))),
                        rd_u32(bx.add(offset_of!(BlockQ5_1, qh))),
                        _mm_loadu_si128(bx.add(offset_of!(BlockQ5_1, qs)).cast()),
                    )
                };
                let dx = fp16_splat(xd);
                let (m, s) = fp16x2_to_fp32(xm, ys);
                summs[r] = m.mul_add(s, summs[r]);
                // In bounds: the caller's guarantee covers `MASK`.
                let qx = { q5_levels::<MASK>(bytes_from_nibbles_32(xq), xh) };
                // Pair sums below 2 * 31 * 128: `VNNI` gives the same integers.
                // In bounds: the caller's guarantee covers `VNNI`.
                let q = { us8_sums_float::<VNNI>(qx, yq) };
                acc[r] = _mm256_fmadd_ps(q, _mm256_mul_ps(dx, dy), acc[r]);
            }
        }
        std::array::from_fn(|r| hsum_float_8(acc[r]) + summs[r])
    }
}

/// # Safety
/// The CPU supports AVX2, FMA and F16C; `x` and `y` each hold `nb` Q8_0 blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_q8_0_q8_0_avx2<const PF: usize>(nb: usize, x: *const u8, y: *const u8) -> f32 {
    // SAFETY: the caller's guarantees are the helper's.
    unsafe { q8_0_q8_0_rows::<PF, 1, false>(nb, [x], y)[0] }
}

/// [`vec_dot_q8_0_q8_0_avx2`] for two weight rows against one activation row, each result
/// bitwise that function's.
///
/// # Safety
/// As [`vec_dot_q8_0_q8_0_avx2`], for both rows.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn vec_dot2_q8_0_q8_0_avx2<const PF: usize>(
    nb: usize,
    x: [*const u8; 2],
    y: *const u8,
) -> [f32; 2] {
    // SAFETY: the caller's guarantees are the helper's.
    unsafe { q8_0_q8_0_rows::<PF, 2, false>(nb, x, y) }
}

/// The Q8_0 loop over `R` weight rows against one activation row: each row's operations and
/// their order are the one-row loop's (see [`q4_0_q8_0_rows`]).
///
/// # Safety
/// As [`vec_dot_q8_0_q8_0_avx2`], for every row of `x`; with `VNNI`, as [`us8_sums`].
#[inline(always)]
unsafe fn q8_0_q8_0_rows<const PF: usize, const R: usize, const VNNI: bool>(
    nb: usize,
    x: [*const u8; R],
    y: *const u8,
) -> [f32; R] {
    // SAFETY: the caller runs with AVX2, FMA and F16C enabled (and with what `VNNI` needs);
    // every block read stays inside block `ib < nb` of its row, as the caller guarantees.
    unsafe {
        const B: usize = size_of::<BlockQ8_0>();
        let mut acc = [_mm256_setzero_ps(); R];
        for ib in 0..nb {
            // In bounds: block `ib < nb` of `y` is readable.
            let (yd, yq) = q8_0_block(y.add(ib * B));
            let dy = F16_TO_F32[yd as usize];
            for r in 0..R {
                if PF > 0 {
                    prefetch_stream::<B>(x[r], ib, PF);
                }
                // In bounds: block `ib < nb` of row `r` is readable.
                let (xd, xq) = q8_0_block(x[r].add(ib * B));
                let d = _mm256_set1_ps(F16_TO_F32[xd as usize] * dy);
                // ggml's sign trick; its pair sums stay inside 16 bits (|x| <= 128 against
                // sign(y, x) <= 127 where |x| is 128), so `VNNI` gives the same integers.
                let (ax, sy) = (_mm256_sign_epi8(xq, xq), _mm256_sign_epi8(yq, xq));
                // In bounds: the caller's guarantee covers `VNNI`.
                let xy = { us8_sums_float::<VNNI>(ax, sy) };
                acc[r] = _mm256_fmadd_ps(d, xy, acc[r]);
            }
        }
        std::array::from_fn(|r| hsum_float_8(acc[r]))
    }
}

/// The AVX-512 VNNI forms of the 32-element block dots (`plug_vnni_dots`): each loop with its
/// groups of four products summed by `vpdpbusd` (`us8_sums`), the same integers and the same
/// bits as the AVX2 forms.
///
/// # Safety
/// The CPU supports AVX-512 F, BW, DQ, VL and VNNI on top of AVX2, FMA and F16C; `x` holds
/// `nb` Q4_0 blocks and `y` `nb` Q8_0 blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn vec_dot_q4_0_q8_0_vnni<const PF: usize>(nb: usize, x: *const u8, y: *const u8) -> f32 {
    // SAFETY: the caller's guarantees, `VNNI`'s included.
    unsafe { q4_0_q8_0_dot::<PF, true>(nb, x, y) }
}

/// Two rows of [`vec_dot_q4_0_q8_0_vnni`].
///
/// # Safety
/// As [`vec_dot_q4_0_q8_0_vnni`], for both rows.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn vec_dot2_q4_0_q8_0_vnni<const PF: usize>(
    nb: usize,
    x: [*const u8; 2],
    y: *const u8,
) -> [f32; 2] {
    // SAFETY: the caller's guarantees, `VNNI`'s included.
    unsafe { q4_0_q8_0_dot2::<PF, true>(nb, x, y) }
}

/// The AVX-512 VNNI form of the Q4_1 loop for `R` rows.
///
/// # Safety
/// As [`vec_dot_q4_0_q8_0_vnni`], with `R` rows of Q4_1 blocks and Q8_1 activations.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn vec_dot_q4_1_q8_1_vnni<const PF: usize, const R: usize>(
    nb: usize,
    x: [*const u8; R],
    y: *const u8,
) -> [f32; R] {
    // SAFETY: the caller's guarantees, `VNNI`'s included.
    unsafe { q4_1_q8_1_rows::<PF, R, true>(nb, x, y) }
}

/// The AVX-512 VNNI form of the Q5_1 loop for `R` rows, its fifth bits through mask registers.
///
/// # Safety
/// As [`vec_dot_q4_0_q8_0_vnni`], with `R` rows of Q5_1 blocks and Q8_1 activations.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn vec_dot_q5_1_q8_1_vnni<const PF: usize, const R: usize>(
    nb: usize,
    x: [*const u8; R],
    y: *const u8,
) -> [f32; R] {
    // SAFETY: the caller's guarantees, `MASK`'s and `VNNI`'s included.
    unsafe { q5_1_q8_1_rows::<PF, R, true, true>(nb, x, y) }
}

/// The AVX-512 VNNI form of the Q8_0 loop for `R` rows.
///
/// # Safety
/// As [`vec_dot_q4_0_q8_0_vnni`], with `R` rows of Q8_0 blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn vec_dot_q8_0_q8_0_vnni<const PF: usize, const R: usize>(
    nb: usize,
    x: [*const u8; R],
    y: *const u8,
) -> [f32; R] {
    // SAFETY: the caller's guarantees, `VNNI`'s included.
    unsafe { q8_0_q8_0_rows::<PF, R, true>(nb, x, y) }
}

one_row! {
    "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c":
    vec_dot_q4_1_q8_1_vnni1 => vec_dot_q4_1_q8_1_vnni;
    vec_dot_q5_1_q8_1_vnni1 => vec_dot_q5_1_q8_1_vnni;
    vec_dot_q8_0_q8_0_vnni1 => vec_dot_q8_0_q8_0_vnni;
}

// ------------------------------------------------------------------------------------------------
// FP4 formats against Q8_0.

/// `PF > 0`: prefetch the line `PF` bytes ahead of every block of `x`.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; `x` holds `nb` MXFP4 blocks and `y` `nb` Q8_0 blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_mxfp4_q8_0_avx2<const PF: usize>(nb: usize, x: *const u8, y: *const u8) -> f32 {
    // SAFETY: the caller's guarantees are the helper's.
    unsafe { mxfp4_q8_0_rows::<PF, 1>(nb, [x], y)[0] }
}

/// The MXFP4 loop over `R` weight rows against one activation row: each row's operations and
/// their order are ggml's one-row loop's (blocks in pairs on two accumulators, an odd count's
/// last block added after the sum), so every result is bitwise the one-row result; the rows
/// share the activation loads.
///
/// # Safety
/// As [`vec_dot_mxfp4_q8_0_avx2`], for every row of `x`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn mxfp4_q8_0_rows<const PF: usize, const R: usize>(
    nb: usize,
    x: [*const u8; R],
    y: *const u8,
) -> [f32; R] {
    const XB: usize = size_of::<BlockMxfp4>();
    const YB: usize = size_of::<BlockQ8_0>();
    let values = _mm256_broadcastsi128_si256(kvalues_fp4_plus_12());
    let lookup = |q4: __m128i| nibble_values_32(values, q4);
    let mut accum1 = [_mm256_setzero_ps(); R];
    let mut accum2 = [_mm256_setzero_ps(); R];
    let mut ib = 0;
    while ib + 1 < nb {
        // SAFETY: blocks `ib` and `ib + 1 < nb` of `y` are readable; every read stays inside
        // its block.
        let (d0, d1, q8_1, q8_2) = unsafe {
            let by = y.add(ib * YB);
            let yq = offset_of!(BlockQ8_0, qs);
            (
                rd_u16(by.add(offset_of!(BlockQ8_0, d))),
                rd_u16(by.add(YB + offset_of!(BlockQ8_0, d))),
                _mm256_loadu_si256(by.add(yq).cast()),
                _mm256_loadu_si256(by.add(YB + yq).cast()),
            )
        };
        let (dy0, dy1) = (F16_TO_F32[d0 as usize], F16_TO_F32[d1 as usize]);
        let (off_1, off_2) = (offset_pairs(12, q8_1), offset_pairs(12, q8_2));
        for r in 0..R {
            if PF > 0 {
                prefetch_stream::<XB>(x[r], ib, PF);
                prefetch_stream::<XB>(x[r], ib + 1, PF);
            }
            // SAFETY: blocks `ib` and `ib + 1 < nb` of row `r` are readable; every read stays
            // inside its block.
            let (e0, e1, q4_1, q4_2) = unsafe {
                let bx = x[r].add(ib * XB);
                let qs = offset_of!(BlockMxfp4, qs);
                (
                    *bx.add(offset_of!(BlockMxfp4, e)),
                    *bx.add(XB + offset_of!(BlockMxfp4, e)),
                    _mm_loadu_si128(bx.add(qs).cast()),
                    _mm_loadu_si128(bx.add(XB + qs).cast()),
                )
            };
            let p_1 = mul_sum_offset_pairs(lookup(q4_1), off_1, q8_1);
            let p_2 = mul_sum_offset_pairs(lookup(q4_2), off_2, q8_2);
            let scale0 = _mm256_set1_ps(dy0 * E8M0_TO_FP32_HALF[e0 as usize]);
            let scale1 = _mm256_set1_ps(dy1 * E8M0_TO_FP32_HALF[e1 as usize]);
            accum1[r] = _mm256_fmadd_ps(scale0, _mm256_cvtepi32_ps(p_1), accum1[r]);
            accum2[r] = _mm256_fmadd_ps(scale1, _mm256_cvtepi32_ps(p_2), accum2[r]);
        }
        ib += 2;
    }
    let mut out = [0.0f32; R];
    for r in 0..R {
        let sumf = hsum_float_8(_mm256_add_ps(accum1[r], accum2[r]));
        // SAFETY: the caller's guarantees cover block `ib < nb` of row `r`.
        out[r] = if ib < nb { unsafe { mxfp4_last_block(x[r], y, ib, sumf) } } else { sumf };
    }
    out
}

/// `sumf` plus the product of MXFP4 block `ib` of `x` and Q8_0 block `ib` of `y`, as ggml's dot
/// adds an odd count's last block.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; `x` holds at least `ib + 1` MXFP4 blocks and `y`
/// `ib + 1` Q8_0 blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn mxfp4_last_block(x: *const u8, y: *const u8, ib: usize, sumf: f32) -> f32 {
    const XB: usize = size_of::<BlockMxfp4>();
    const YB: usize = size_of::<BlockQ8_0>();
    // SAFETY: block `ib` of each side is readable, 17 and 34 bytes (contract).
    let (bx, by) =
        unsafe { (&*x.add(ib * XB).cast::<[u8; XB]>(), &*y.add(ib * YB).cast::<[u8; YB]>()) };
    let qs = &bx[offset_of!(BlockMxfp4, qs)..];
    let q8 = &by[offset_of!(BlockQ8_0, qs)..];
    let d = fp16_to_fp32(u16::from_le_bytes([by[0], by[1]]))
        * E8M0_TO_FP32_HALF[bx[offset_of!(BlockMxfp4, e)] as usize];
    let (mut s1, mut s2) = (0i32, 0i32);
    for j in 0..16 {
        s1 += q8[j] as i8 as i32 * KVALUES_MXFP4[(qs[j] & 0x0F) as usize] as i32;
        s2 += q8[j + 16] as i8 as i32 * KVALUES_MXFP4[(qs[j] >> 4) as usize] as i32;
    }
    d.mul_add((s1 + s2) as f32, sumf)
}

/// `PF > 0`: prefetch the line `PF` bytes ahead of every block of `x`.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; `x` holds `nb` NVFP4 blocks and `y` `2 * nb` Q8_0 blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_nvfp4_q8_0_avx2<const PF: usize>(nb: usize, x: *const u8, y: *const u8) -> f32 {
    // SAFETY: the caller's guarantees are the helper's.
    unsafe { nvfp4_q8_0_rows::<PF, 1>(nb, [x], y)[0] }
}

/// The NVFP4 loop over `R` weight rows against one activation row: each row's operations and
/// their order are ggml's one-row loop's (one accumulator, two fused steps a block), so every
/// result is bitwise the one-row result; the rows share the activation loads and the offset's
/// pair sums.
///
/// # Safety
/// As [`vec_dot_nvfp4_q8_0_avx2`], for every row of `x`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn nvfp4_q8_0_rows<const PF: usize, const R: usize>(
    nb: usize,
    x: [*const u8; R],
    y: *const u8,
) -> [f32; R] {
    const XB: usize = size_of::<BlockNvfp4>();
    const YB: usize = size_of::<BlockQ8_0>();
    let values = _mm256_broadcastsi128_si256(kvalues_fp4_plus_12());
    // Sub-block pair (2k, 2k+1) as 32 values in the order of one Q8_0 block: low nibbles of the
    // first 8 bytes, their high nibbles, then the same for the next 8 bytes. Each half takes its
    // 8 bytes twice; its second 64-bit word shifted right by 4 brings the high nibbles down (the
    // bits from the next byte masked off), then one table lookup.
    let twice = _mm256_set_epi8(
        15, 14, 13, 12, 11, 10, 9, 8, 15, 14, 13, 12, 11, 10, 9, 8, //
        7, 6, 5, 4, 3, 2, 1, 0, 7, 6, 5, 4, 3, 2, 1, 0,
    );
    let shifts = _mm256_set_epi64x(4, 0, 4, 0);
    let m4b = _mm256_set1_epi8(0x0F);
    let lookup = |q4: __m128i| {
        let b = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(q4), twice);
        _mm256_shuffle_epi8(values, _mm256_and_si256(_mm256_srlv_epi64(b, shifts), m4b))
    };
    let mut accum = [_mm256_setzero_ps(); R];
    for ib in 0..nb {
        // SAFETY: blocks `2 ib`, `2 ib + 1 < 2 nb` of `y` are readable; every read stays inside
        // its block.
        let (dy0, dy1, q8_01, q8_23) = unsafe {
            let by = y.add(2 * ib * YB);
            let yq = offset_of!(BlockQ8_0, qs);
            (
                rd_u16(by.add(offset_of!(BlockQ8_0, d))),
                rd_u16(by.add(YB + offset_of!(BlockQ8_0, d))),
                _mm256_loadu_si256(by.add(yq).cast()),
                _mm256_loadu_si256(by.add(YB + yq).cast()),
            )
        };
        let (dy0, dy1) = fp16x2_to_fp32(dy0, dy1);
        let (off_01, off_23) = (offset_pairs(12, q8_01), offset_pairs(12, q8_23));
        for r in 0..R {
            if PF > 0 {
                prefetch_stream::<XB>(x[r], ib, PF);
            }
            // SAFETY: block `ib < nb` of row `r` is readable; every read stays inside it.
            let (sc, q4_01, q4_23) = unsafe {
                let bx = x[r].add(ib * XB);
                let qs = offset_of!(BlockNvfp4, qs);
                (
                    bx.add(offset_of!(BlockNvfp4, d)).cast::<[u8; 4]>().read(),
                    _mm_loadu_si128(bx.add(qs).cast()),
                    _mm_loadu_si128(bx.add(qs + 16).cast()),
                )
            };
            let p_1 = mul_sum_offset_pairs(lookup(q4_01), off_01, q8_01);
            let p_2 = mul_sum_offset_pairs(lookup(q4_23), off_23, q8_23);
            let s0 = UE4M3_TO_FP32[sc[0] as usize] * dy0;
            let s1 = UE4M3_TO_FP32[sc[1] as usize] * dy0;
            let s2 = UE4M3_TO_FP32[sc[2] as usize] * dy1;
            let s3 = UE4M3_TO_FP32[sc[3] as usize] * dy1;
            let scales01 = _mm256_set_m128(_mm_set1_ps(s1), _mm_set1_ps(s0));
            let scales23 = _mm256_set_m128(_mm_set1_ps(s3), _mm_set1_ps(s2));
            accum[r] = _mm256_fmadd_ps(scales01, _mm256_cvtepi32_ps(p_1), accum[r]);
            accum[r] = _mm256_fmadd_ps(scales23, _mm256_cvtepi32_ps(p_2), accum[r]);
        }
    }
    let mut out = [0.0f32; R];
    for r in 0..R {
        out[r] = hsum_float_8(accum[r]);
    }
    out
}

// ------------------------------------------------------------------------------------------------
// Low-bit formats against Q8_0.

/// `ggml_vec_dot_q1_0_q8_0` with ggml's AVX2 arithmetic: y is negated where the weight bit is clear
/// and the bytes summed, so the result is ggml's, bit for bit, on every valid Q8_0 row. A -128
/// activation byte (the Q8_0 quantizer never writes one: its range is -127..=127) under a clear bit
/// wraps to -128 instead of 128, exactly as in ggml's AVX2 kernel; the scalar tier follows ggml's
/// portable code and gives 128. Being exact there would cost an extra operation per 32 values.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; `x` holds `nb` Q1_0 blocks and `y` `4 * nb` Q8_0 blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_q1_0_q8_0_avx2(nb: usize, x: *const u8, y: *const u8) -> f32 {
    // SAFETY: the caller's guarantees are the helper's.
    unsafe { q1_0_q8_0_rows::<1>(nb, [x], y)[0] }
}

/// The Q1_0 loop over `R` weight rows against one activation row: the rows share the Q8_0
/// blocks' loads and scales, and each row's operations and their order are the one-row loop's.
///
/// # Safety
/// As [`vec_dot_q1_0_q8_0_avx2`], for every row of `x`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn q1_0_q8_0_rows<const R: usize>(nb: usize, x: [*const u8; R], y: *const u8) -> [f32; R] {
    const XB: usize = size_of::<BlockQ1_0>();
    const YB: usize = size_of::<BlockQ8_0>();
    let all_ones = _mm256_set1_epi8(-1);
    let (ones_8, ones_16) = (_mm256_set1_epi8(1), _mm256_set1_epi16(1));
    // The block's 16 code bytes, complemented, sit in both lanes; Q8_0 block k takes code bytes
    // 4k..4k+3, each spread over 8 output bytes by one shuffle (no broadcast from a register per
    // Q8_0 block, as ggml does).
    let byte_shuf = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3,
        3, 3,
    );
    let bit_masks = _mm256_set1_epi64x(i64::from_le_bytes([1, 2, 4, 8, 16, 32, 64, 128]));
    let sat7f = _mm256_set1_epi8(0x7f);
    let mut acc = [_mm256_setzero_ps(); R];
    for ib in 0..nb {
        let mut codes = [all_ones; R];
        let mut d0 = [0u16; R];
        for r in 0..R {
            // SAFETY: block `ib < nb` of row `r` is readable; the 2-byte scale and the 16 code
            // bytes are inside it.
            unsafe {
                let bx = x[r].add(ib * XB);
                d0[r] = rd_u16(bx.add(offset_of!(BlockQ1_0, d)));
                codes[r] = _mm256_xor_si256(
                    _mm256_broadcastsi128_si256(_mm_loadu_si128(
                        bx.add(offset_of!(BlockQ1_0, qs)).cast(),
                    )),
                    all_ones,
                );
            }
        }
        let mut acc_block = [_mm256_setzero_ps(); R];
        for k in 0..4 {
            // SAFETY: Q8_0 block `4 ib + k < 4 nb` of `y` is readable; the function runs with
            // AVX2 enabled.
            let (yd, qy) = unsafe { q8_0_block(y.add((4 * ib + k) * YB)) };
            let dy = fp16_splat(yd);
            let sh = _mm256_add_epi8(byte_shuf, _mm256_set1_epi8(4 * k as i8));
            for r in 0..R {
                // x = +1 where the bit is set, -1 where it is clear. Where the bit is clear the
                // complemented code keeps a bit of `bit_masks` (1..=128), which the saturating
                // add lifts to 128..=255: negative as i8. Where it is set the sum is 127:
                // positive. `sign` then negates y where x = -1, like ggml's xor/sub.
                let neg = _mm256_adds_epu8(
                    _mm256_and_si256(_mm256_shuffle_epi8(codes[r], sh), bit_masks),
                    sat7f,
                );
                let sy = _mm256_sign_epi8(qy, neg);
                let s32 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones_8, sy), ones_16);
                acc_block[r] = if k == 0 {
                    _mm256_mul_ps(dy, _mm256_cvtepi32_ps(s32))
                } else {
                    _mm256_fmadd_ps(dy, _mm256_cvtepi32_ps(s32), acc_block[r])
                };
            }
        }
        for r in 0..R {
            acc[r] = _mm256_fmadd_ps(fp16_splat(d0[r]), acc_block[r], acc[r]);
        }
    }
    let mut out = [0.0; R];
    for r in 0..R {
        out[r] = hsum_float_8(acc[r]);
    }
    out
}

/// # Safety
/// The CPU supports AVX2, FMA and F16C; `x` holds `nb` Q2_0 blocks and `y` `2 * nb` Q8_0 blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_q2_0_q8_0_avx2(nb: usize, x: *const u8, y: *const u8) -> f32 {
    const XB: usize = size_of::<BlockQ2_0>();
    const YB: usize = size_of::<BlockQ8_0>();
    // Byte j of a Q8_0 block pairs with code j % 4 of byte j / 4 of the 8 code bytes.
    let byte_shuf = _mm256_setr_epi8(
        0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7,
        7, 7,
    );
    // Codes 0 and 1 of a byte stay in its low nibble (masks 0x03, 0x0C), codes 2 and 3 are taken
    // from the high nibble; the nibble then indexes a table where c and 4c both map to c (the value is c - 1).
    let m_lo = _mm256_set1_epi32(0x0000_0C03);
    let m_hi = _mm256_set1_epi32(0x0C03_0000);
    let lut = _mm256_setr_epi8(
        0, 1, 2, 3, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 0, 1, 2, 3, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0,
        0, 0,
    );
    // Each Q8_0 half is summed in integers and the scales are applied in scalar floats in the
    // order of ggml's (generic) kernel, so the result has its bits and the scalar tier's.
    let mut sumf = 0.0f32;
    for ib in 0..nb {
        // SAFETY: block `ib < nb` of `x` is readable; both reads stay inside it.
        let (d0, qs) = unsafe {
            let bx = x.add(ib * XB);
            (rd_u16(bx.add(offset_of!(BlockQ2_0, d))), bx.add(offset_of!(BlockQ2_0, qs)))
        };
        let mut sums = [_mm256_setzero_si256(); 2];
        let mut dys = [0u16; 2];
        for (k, (s, dy)) in sums.iter_mut().zip(&mut dys).enumerate() {
            // SAFETY: `qs` has 16 readable bytes (k < 2), and Q8_0 block `2 ib + k < 2 nb` of `y`
            // is readable; every read stays inside its block.
            let (codes, yd, qy) = unsafe {
                let by = y.add((2 * ib + k) * YB);
                (
                    rd_u64(qs.add(8 * k)),
                    rd_u16(by.add(offset_of!(BlockQ8_0, d))),
                    _mm256_loadu_si256(by.add(offset_of!(BlockQ8_0, qs)).cast()),
                )
            };
            let v = _mm256_shuffle_epi8(_mm256_set1_epi64x(codes as i64), byte_shuf);
            let nib = _mm256_or_si256(
                _mm256_and_si256(v, m_lo),
                _mm256_and_si256(_mm256_srli_epi16::<4>(v), m_hi),
            );
            let code = _mm256_shuffle_epi8(lut, nib);
            *s = mul_sum_offset_u8_i8(code, 1, qy);
            *dy = yd;
        }
        // Both horizontal integer sums at once: lanes 0 and 1 of `t`.
        let h = _mm256_hadd_epi32(sums[0], sums[1]);
        let w = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
        let t = _mm_hadd_epi32(w, w);
        let (s0, s1) = (_mm_cvtsi128_si32(t), _mm_extract_epi32::<1>(t));
        // Unfused, as ggml's golden results show (and as the scalar tier computes).
        let [d0, dy0, dy1, _] =
            fp16x4_to_fp32(d0 as u64 | (dys[0] as u64) << 16 | (dys[1] as u64) << 32);
        let mut sumi = 0.0f32;
        sumi += dy0 * s0 as f32;
        sumi += dy1 * s1 as f32;
        sumf += d0 * sumi;
    }
    sumf
}

// ------------------------------------------------------------------------------------------------
// Ternary formats against Q8_K.

/// `q * 3` rounded down to its top two bits, per byte: digit extraction of a base-3 packed byte
/// after it was multiplied by a power of three (ggml's halving-add trick). The saturated value
/// goes through [`opaque`]: seeing the whole expression, the compiler turns the subtract and the
/// inner average into a max, a shift and a mask (two instructions more than ggml's, eight times a
/// block).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn tq1_top_trit(q: __m256i) -> __m256i {
    let q = opaque(_mm256_subs_epu8(q, _mm256_set1_epi8(1)));
    let q = _mm256_avg_epu8(q, _mm256_avg_epu8(q, _mm256_setzero_si256()));
    _mm256_and_si256(_mm256_srli_epi16::<6>(q), _mm256_set1_epi8(3))
}

/// `v` unchanged, but the compiler cannot see where it came from, so it keeps the instructions
/// written after it as they are (see [`tq1_top_trit`]). Also for constant `vpshufb` controls,
/// which the compiler otherwise rewrites into two or three other shuffles each.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn opaque(mut v: __m256i) -> __m256i {
    // SAFETY: an empty template: no instruction runs, no memory, stack or flag is touched; the
    // compiler only has to assume that `v` may have changed.
    unsafe {
        std::arch::asm!("/* {v} */", v = inout(ymm_reg) v, options(pure, nomem, nostack, preserves_flags));
    }
    v
}

/// [`opaque`] for a 128-bit vector.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn opaque128(mut v: __m128i) -> __m128i {
    // SAFETY: as in `opaque`: an empty template that touches nothing.
    unsafe {
        std::arch::asm!("/* {v} */", v = inout(xmm_reg) v, options(pure, nomem, nostack, preserves_flags));
    }
    v
}

/// `x * 9` per byte, wrapping.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn mul9_epi8(x: __m256i) -> __m256i {
    _mm256_add_epi8(_mm256_and_si256(_mm256_slli_epi16::<3>(x), _mm256_set1_epi8(-8)), x)
}

/// # Safety
/// The CPU supports AVX2, FMA and F16C; `x` holds `nb` TQ1_0 blocks and `y` `nb` Q8_K blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_tq1_0_q8_K_avx2(nb: usize, x: *const u8, y: *const u8) -> f32 {
    const XB: usize = size_of::<BlockTq1_0>();
    const YB: usize = size_of::<BlockQ8K>();
    let mut sumf = _mm256_setzero_ps();
    for i in 0..nb {
        // SAFETY: block `i < nb` of each side is readable; the x reads cover bytes 0..48 (qs),
        // 48..52 (qh) and 52..54 (d) of 54, the y reads bytes 0..4 (d), 4..260 (qs) and
        // 260..292 (bsums) of 292.
        let (xq32, xq16, qh, xd, yd, q8, bsums) = unsafe {
            let (bx, by) = (x.add(i * XB), y.add(i * YB));
            let q8 = load_q8k_levels(by.add(offset_of!(BlockQ8K, qs)));
            (
                _mm256_loadu_si256(bx.add(offset_of!(BlockTq1_0, qs)).cast()),
                _mm_loadu_si128(bx.add(offset_of!(BlockTq1_0, qs) + 32).cast()),
                rd_u32(bx.add(offset_of!(BlockTq1_0, qh))),
                rd_u16(bx.add(offset_of!(BlockTq1_0, d))),
                rd_f32(by.add(offset_of!(BlockQ8K, d))),
                q8,
                _mm256_loadu_si256(by.add(offset_of!(BlockQ8K, bsums)).cast()),
            )
        };
        // First 32 bytes: five trits each, for elements 0..160.
        let qx0 = xq32;
        let qx1 = _mm256_add_epi8(qx0, _mm256_add_epi8(qx0, qx0));
        let qx2 = mul9_epi8(qx0);
        let qx3 = mul9_epi8(qx1);
        let qx4 = mul9_epi8(qx2);
        let p0 = _mm256_maddubs_epi16(tq1_top_trit(qx0), q8[0]);
        let p1 = _mm256_maddubs_epi16(tq1_top_trit(qx1), q8[1]);
        let p2 = _mm256_maddubs_epi16(tq1_top_trit(qx2), q8[2]);
        let p3 = _mm256_maddubs_epi16(tq1_top_trit(qx3), q8[3]);
        let p4 = _mm256_maddubs_epi16(tq1_top_trit(qx4), q8[4]);
        let mut sumi0 = _mm256_add_epi16(p0, p1);
        let mut sumi1 = _mm256_add_epi16(p2, p3);
        let mut sumi2 = p4;

        // Next 16 bytes (elements 160..240) and the 4 bytes of four trits (240..256).
        let h0 = _mm256_castsi128_si256(xq16);
        let h1 = _mm256_add_epi8(h0, _mm256_add_epi8(h0, h0));
        let h2 = mul9_epi8(h0);
        let h3 = mul9_epi8(h1);
        let h4 = mul9_epi8(h2);
        let qx01 = _mm256_set_m128i(_mm256_castsi256_si128(h1), xq16);
        let qx23 = _mm256_set_m128i(_mm256_castsi256_si128(h3), _mm256_castsi256_si128(h2));
        let qx5_l = _mm256_cvtepu8_epi16(_mm_set1_epi32(qh as i32));
        let qx5_l = _mm256_mullo_epi16(
            qx5_l,
            _mm256_set_epi16(27, 27, 27, 27, 9, 9, 9, 9, 3, 3, 3, 3, 1, 1, 1, 1),
        );
        let qx5_l = _mm256_and_si256(qx5_l, _mm256_set1_epi16(0xFF));
        let qx5 =
            _mm_packus_epi16(_mm256_castsi256_si128(qx5_l), _mm256_extracti128_si256::<1>(qx5_l));
        let qx45 = _mm256_set_m128i(qx5, _mm256_castsi256_si128(h4));
        sumi0 = _mm256_add_epi16(sumi0, _mm256_maddubs_epi16(tq1_top_trit(qx01), q8[5]));
        sumi1 = _mm256_add_epi16(sumi1, _mm256_maddubs_epi16(tq1_top_trit(qx23), q8[6]));
        sumi2 = _mm256_add_epi16(sumi2, _mm256_maddubs_epi16(tq1_top_trit(qx45), q8[7]));

        let d = _mm256_set1_ps(yd * F16_TO_F32[xd as usize]);
        let s = _mm256_sub_epi16(sumi0, bsums);
        let s = _mm256_add_epi16(s, _mm256_add_epi16(sumi1, sumi2));
        let s = _mm256_madd_epi16(s, _mm256_set1_epi16(1));
        sumf = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, sumf);
    }
    hsum_float_8(sumf)
}

/// # Safety
/// The CPU supports AVX2, FMA and F16C; `x` holds `nb` TQ2_0 blocks and `y` `nb` Q8_K blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_tq2_0_q8_K_avx2<const PF: usize>(nb: usize, x: *const u8, y: *const u8) -> f32 {
    const XB: usize = size_of::<BlockTq2_0>();
    const YB: usize = size_of::<BlockQ8K>();
    let m3 = _mm256_set1_epi8(3);
    let mut sumf = _mm256_setzero_ps();
    for i in 0..nb {
        if PF > 0 {
            prefetch_stream_at::<{ size_of::<BlockTq2_0>() }, PF>(x, i);
        }
        // SAFETY: block `i < nb` of each side is readable; reads stay inside it (see offsets).
        let (bx, by) = unsafe { (x.add(i * XB), y.add(i * YB)) };
        let mut sumi0 = _mm256_setzero_si256();
        let mut sumi1 = _mm256_setzero_si256();
        for j in 0..2 {
            // SAFETY: x bytes 32 j .. 32 j + 32 < 64 of `qs`; y bytes 128 j .. 128 j + 128 of its
            // 256 levels.
            let (qx, qy) = unsafe {
                let yq = by.add(offset_of!(BlockQ8K, qs) + 128 * j);
                (
                    _mm256_loadu_si256(bx.add(offset_of!(BlockTq2_0, qs) + 32 * j).cast()),
                    [
                        _mm256_loadu_si256(yq.cast()),
                        _mm256_loadu_si256(yq.add(32).cast()),
                        _mm256_loadu_si256(yq.add(64).cast()),
                        _mm256_loadu_si256(yq.add(96).cast()),
                    ],
                )
            };
            let q0 = _mm256_and_si256(qx, m3);
            let q1 = _mm256_and_si256(_mm256_srli_epi16::<2>(qx), m3);
            let q2 = _mm256_and_si256(_mm256_srli_epi16::<4>(qx), m3);
            let q3 = _mm256_and_si256(_mm256_srli_epi16::<6>(qx), m3);
            let p0 = _mm256_maddubs_epi16(q0, qy[0]);
            let p1 = _mm256_maddubs_epi16(q1, qy[1]);
            let p2 = _mm256_maddubs_epi16(q2, qy[2]);
            let p3 = _mm256_maddubs_epi16(q3, qy[3]);
            sumi0 = _mm256_add_epi16(sumi0, _mm256_add_epi16(p0, p1));
            sumi1 = _mm256_add_epi16(sumi1, _mm256_add_epi16(p2, p3));
        }
        // SAFETY: `bsums` (32 bytes at 260) and `d` lie inside the blocks.
        let (bsums, yd, xd) = unsafe {
            (
                _mm256_loadu_si256(by.add(offset_of!(BlockQ8K, bsums)).cast()),
                rd_f32(by.add(offset_of!(BlockQ8K, d))),
                rd_u16(bx.add(offset_of!(BlockTq2_0, d))),
            )
        };
        let d = _mm256_set1_ps(yd * F16_TO_F32[xd as usize]);
        let s = _mm256_sub_epi16(_mm256_add_epi16(sumi0, sumi1), bsums);
        let s = _mm256_madd_epi16(s, _mm256_set1_epi16(1));
        sumf = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, sumf);
    }
    hsum_float_8(sumf)
}

// ------------------------------------------------------------------------------------------------
// K-quants against Q8_K.

/// The 256 levels of a Q8_K block in eight registers.
///
/// # Safety
/// `qs` is valid for reading 256 bytes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load_q8k_levels(qs: *const u8) -> [__m256i; 8] {
    // SAFETY: the eight 32-byte reads cover exactly the 256 readable bytes.
    unsafe {
        [
            _mm256_loadu_si256(qs.cast()),
            _mm256_loadu_si256(qs.add(32).cast()),
            _mm256_loadu_si256(qs.add(64).cast()),
            _mm256_loadu_si256(qs.add(96).cast()),
            _mm256_loadu_si256(qs.add(128).cast()),
            _mm256_loadu_si256(qs.add(160).cast()),
            _mm256_loadu_si256(qs.add(192).cast()),
            _mm256_loadu_si256(qs.add(224).cast()),
        ]
    }
}

/// # Safety
/// The CPU supports AVX2, FMA and F16C; `x` holds `nb` Q2_K blocks and `y` `nb` Q8_K blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_q2_K_q8_K_avx2<const PF: usize>(nb: usize, x: *const u8, y: *const u8) -> f32 {
    const XB: usize = size_of::<BlockQ2K>();
    const YB: usize = size_of::<BlockQ8K>();
    let m3 = _mm256_set1_epi8(3);
    let m4 = _mm_set1_epi8(0xF);
    let shuffles =
        [scale_shuffle_q3k(0), scale_shuffle_q3k(1), scale_shuffle_q3k(2), scale_shuffle_q3k(3)];
    let mut acc = _mm256_setzero_ps();
    for i in 0..nb {
        if PF > 0 {
            prefetch_stream::<{ size_of::<BlockQ2K>() }>(x, i, PF);
        }
        // SAFETY: block `i < nb` of each side is readable; the reads cover x's scales (0..16),
        // qs (16..80), d and dmin (80..84) and y's d, qs and bsums, all inside the blocks.
        let (xd, xdmin, mins_and_scales, q2, yd, q8, bsums) = unsafe {
            let (bx, by) = (x.add(i * XB), y.add(i * YB));
            (
                rd_u16(bx.add(offset_of!(BlockQ2K, d))),
                rd_u16(bx.add(offset_of!(BlockQ2K, dmin))),
                _mm_loadu_si128(bx.add(offset_of!(BlockQ2K, scales)).cast()),
                [
                    _mm256_loadu_si256(bx.add(offset_of!(BlockQ2K, qs)).cast()),
                    _mm256_loadu_si256(bx.add(offset_of!(BlockQ2K, qs) + 32).cast()),
                ],
                rd_f32(by.add(offset_of!(BlockQ8K, d))),
                load_q8k_levels(by.add(offset_of!(BlockQ8K, qs))),
                _mm256_loadu_si256(by.add(offset_of!(BlockQ8K, bsums)).cast()),
            )
        };
        let (xd, xdmin) = fp16x2_to_fp32(xd, xdmin);
        let d = yd * xd;
        let dmin = -yd * xdmin;

        let scales8 = _mm_and_si128(mins_and_scales, m4);
        let mins8 = _mm_and_si128(_mm_srli_epi16::<4>(mins_and_scales), m4);
        let mins = _mm256_cvtepi8_epi16(mins8);
        let prod = _mm256_madd_epi16(mins, bsums);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(prod), acc);

        let all_scales = _mm256_cvtepi8_epi16(scales8);
        let l_scales = _mm256_castsi256_si128(all_scales);
        let h_scales = _mm256_extracti128_si256::<1>(all_scales);
        let scales = [_mm256_set_m128i(l_scales, l_scales), _mm256_set_m128i(h_scales, h_scales)];

        let mut sumi = _mm256_setzero_si256();
        for j in 0..2 {
            let q2bits = q2[j];
            let q2_0 = _mm256_and_si256(q2bits, m3);
            let q2_1 = _mm256_and_si256(_mm256_srli_epi16::<2>(q2bits), m3);
            let q2_2 = _mm256_and_si256(_mm256_srli_epi16::<4>(q2bits), m3);
            let q2_3 = _mm256_and_si256(_mm256_srli_epi16::<6>(q2bits), m3);
            let p0 = _mm256_maddubs_epi16(q2_0, q8[4 * j]);
            let p1 = _mm256_maddubs_epi16(q2_1, q8[4 * j + 1]);
            let p2 = _mm256_maddubs_epi16(q2_2, q8[4 * j + 2]);
            let p3 = _mm256_maddubs_epi16(q2_3, q8[4 * j + 3]);
            let p0 = _mm256_madd_epi16(_mm256_shuffle_epi8(scales[j], shuffles[0]), p0);
            let p1 = _mm256_madd_epi16(_mm256_shuffle_epi8(scales[j], shuffles[1]), p1);
            let p2 = _mm256_madd_epi16(_mm256_shuffle_epi8(scales[j], shuffles[2]), p2);
            let p3 = _mm256_madd_epi16(_mm256_shuffle_epi8(scales[j], shuffles[3]), p3);
            let p0 = _mm256_add_epi32(p0, p1);
            let p2 = _mm256_add_epi32(p2, p3);
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p2));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_float_8(acc)
}

/// A Q3_K block's sixteen 6-bit scales (its 12 scale bytes as three words) minus 32, as
/// ggml's AVX2 code unpacks them: scale `i` in byte `i`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn q3k_scales(aux: [u32; 3]) -> __m128i {
    const KMASK1: u32 = 0x0303_0303;
    const KMASK2: u32 = 0x0f0f_0f0f;
    let scales = _mm_set_epi32(
        (((aux[1] >> 4) & KMASK2) | (((aux[2] >> 6) & KMASK1) << 4)) as i32,
        (((aux[0] >> 4) & KMASK2) | (((aux[2] >> 4) & KMASK1) << 4)) as i32,
        ((aux[1] & KMASK2) | (((aux[2] >> 2) & KMASK1) << 4)) as i32,
        ((aux[0] & KMASK2) | ((aux[2] & KMASK1) << 4)) as i32,
    );
    _mm_sub_epi8(scales, _mm_set1_epi8(32))
}

/// # Safety
/// The CPU supports AVX2, FMA and F16C; `x` holds `nb` Q3_K blocks and `y` `nb` Q8_K blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_q3_K_q8_K_avx2<const PF: usize>(nb: usize, x: *const u8, y: *const u8) -> f32 {
    const XB: usize = size_of::<BlockQ3K>();
    const YB: usize = size_of::<BlockQ8K>();
    let m3 = _mm256_set1_epi8(3);
    let m4 = _mm256_set1_epi8(4);
    let zero = _mm256_setzero_si256();
    let shuffles =
        [scale_shuffle_q3k(0), scale_shuffle_q3k(1), scale_shuffle_q3k(2), scale_shuffle_q3k(3)];
    let mut acc = _mm256_setzero_ps();
    for i in 0..nb {
        if PF > 0 {
            prefetch_stream::<{ size_of::<BlockQ3K>() }>(x, i, PF);
        }
        // SAFETY: block `i < nb` of each side is readable; the reads cover x's hmask (0..32),
        // qs (32..96), scales (96..108) and d (108..110) and y's d, qs and bsums.
        let (hbits, q3, aux, xd, yd, q8) = unsafe {
            let (bx, by) = (x.add(i * XB), y.add(i * YB));
            let sc = bx.add(offset_of!(BlockQ3K, scales));
            (
                _mm256_loadu_si256(bx.add(offset_of!(BlockQ3K, hmask)).cast()),
                [
                    _mm256_loadu_si256(bx.add(offset_of!(BlockQ3K, qs)).cast()),
                    _mm256_loadu_si256(bx.add(offset_of!(BlockQ3K, qs) + 32).cast()),
                ],
                [rd_u32(sc), rd_u32(sc.add(4)), rd_u32(sc.add(8))],
                rd_u16(bx.add(offset_of!(BlockQ3K, d))),
                rd_f32(by.add(offset_of!(BlockQ8K, d))),
                load_q8k_levels(by.add(offset_of!(BlockQ8K, qs))),
            )
        };
        let d = _mm256_set1_ps(yd * F16_TO_F32[xd as usize]);

        let scales128 = q3k_scales(aux);
        let all_scales = _mm256_cvtepi8_epi16(scales128);
        let l_scales = _mm256_castsi256_si128(all_scales);
        let h_scales = _mm256_extracti128_si256::<1>(all_scales);
        let scales = [_mm256_set_m128i(l_scales, l_scales), _mm256_set_m128i(h_scales, h_scales)];

        let mut sumi = _mm256_setzero_si256();
        for j in 0..2 {
            let q3bits = q3[j];
            // 4 where the high bit is clear (ggml's "-4 unless set"), 0 where it is set.
            let high = |bit: u32| {
                let mask = _mm256_set1_epi8((1u8 << bit) as i8);
                _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, mask), zero), m4)
            };
            let b = 4 * j as u32;
            let q3l = [
                _mm256_and_si256(q3bits, m3),
                _mm256_and_si256(_mm256_srli_epi16::<2>(q3bits), m3),
                _mm256_and_si256(_mm256_srli_epi16::<4>(q3bits), m3),
                _mm256_and_si256(_mm256_srli_epi16::<6>(q3bits), m3),
            ];
            let mut p = [zero; 4];
            for k in 0..4 {
                let q8k = q8[4 * j + k];
                let q8s = _mm256_maddubs_epi16(high(b + k as u32), q8k);
                let p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(q3l[k], q8k), q8s);
                p[k] = _mm256_madd_epi16(_mm256_shuffle_epi8(scales[j], shuffles[k]), p16);
            }
            let p0 = _mm256_add_epi32(p[0], p[1]);
            let p2 = _mm256_add_epi32(p[2], p[3]);
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p2));
        }
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_float_8(acc)
}

/// The 6-bit scales and mins of Q4_K/Q5_K unpacked as ggml's AVX2 code does: eight scales in the
/// low 16 bytes, eight mins in the high ones.
#[inline(always)]
pub(super) fn k4_scales_and_mins(mut utmp: [u32; 4]) -> [u32; 4] {
    const KMASK1: u32 = 0x3f3f_3f3f;
    const KMASK2: u32 = 0x0f0f_0f0f;
    const KMASK3: u32 = 0x0303_0303;
    utmp[3] = ((utmp[2] >> 4) & KMASK2) | (((utmp[1] >> 6) & KMASK3) << 4);
    let uaux = utmp[1] & KMASK1;
    utmp[1] = (utmp[2] & KMASK2) | (((utmp[0] >> 6) & KMASK3) << 4);
    utmp[2] = uaux;
    utmp[0] &= KMASK1;
    utmp
}

/// # Safety
/// The CPU supports AVX2, FMA and F16C; `x` holds `nb` Q4_K blocks and `y` `nb` Q8_K blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_q4_K_q8_K_avx2<const PF: usize>(nb: usize, x: *const u8, y: *const u8) -> f32 {
    const XB: usize = size_of::<BlockQ4K>();
    const YB: usize = size_of::<BlockQ8K>();
    let m4 = _mm256_set1_epi8(0xF);
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for i in 0..nb {
        if PF > 0 {
            prefetch_stream::<{ size_of::<BlockQ4K>() }>(x, i, PF);
        }
        // SAFETY: block `i < nb` of each side is readable; the reads cover x's d, dmin (0..4),
        // scales (4..16) and qs (16..144), and y's d, qs and bsums.
        let (xd, xdmin, utmp, q4, yd, q8, q8sums) = unsafe {
            let (bx, by) = (x.add(i * XB), y.add(i * YB));
            let sc = bx.add(offset_of!(BlockQ4K, scales));
            let qs = bx.add(offset_of!(BlockQ4K, qs));
            (
                rd_u16(bx.add(offset_of!(BlockQ4K, d))),
                rd_u16(bx.add(offset_of!(BlockQ4K, dmin))),
                [rd_u32(sc), rd_u32(sc.add(4)), rd_u32(sc.add(8)), 0],
                [
                    _mm256_loadu_si256(qs.cast()),
                    _mm256_loadu_si256(qs.add(32).cast()),
                    _mm256_loadu_si256(qs.add(64).cast()),
                    _mm256_loadu_si256(qs.add(96).cast()),
                ],
                rd_f32(by.add(offset_of!(BlockQ8K, d))),
                load_q8k_levels(by.add(offset_of!(BlockQ8K, qs))),
                _mm256_loadu_si256(by.add(offset_of!(BlockQ8K, bsums)).cast()),
            )
        };
        let (xd, xdmin) = fp16x2_to_fp32(xd, xdmin);
        let d = yd * xd;
        let dmin = -yd * xdmin;
        let u = k4_scales_and_mins(utmp);
        let mins_and_scales =
            _mm256_cvtepu8_epi16(_mm_set_epi32(u[3] as i32, u[2] as i32, u[1] as i32, u[0] as i32));

        let q8s =
            _mm_hadd_epi16(_mm256_castsi256_si128(q8sums), _mm256_extracti128_si256::<1>(q8sums));
        let prod = _mm_madd_epi16(_mm256_extracti128_si256::<1>(mins_and_scales), q8s);
        acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m);

        let sc128 = _mm256_castsi256_si128(mins_and_scales);
        let scales = _mm256_set_m128i(sc128, sc128);

        let mut sumi = _mm256_setzero_si256();
        for j in 0..4 {
            let scale_l = _mm256_shuffle_epi8(scales, opaque(scale_shuffle_k4(2 * j as u8)));
            let scale_h = _mm256_shuffle_epi8(scales, opaque(scale_shuffle_k4(2 * j as u8 + 1)));
            let q4l = _mm256_and_si256(q4[j], m4);
            let q4h = _mm256_and_si256(_mm256_srli_epi16::<4>(q4[j]), m4);
            let p16l = _mm256_madd_epi16(scale_l, _mm256_maddubs_epi16(q4l, q8[2 * j]));
            let p16h = _mm256_madd_epi16(scale_h, _mm256_maddubs_epi16(q4h, q8[2 * j + 1]));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p16l, p16h));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    let acc_m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
    let acc_m = _mm_add_ss(acc_m, _mm_movehdup_ps(acc_m));
    hsum_float_8(acc) + _mm_cvtss_f32(acc_m)
}

/// # Safety
/// The CPU supports AVX2, FMA and F16C; `x` holds `nb` Q5_K blocks and `y` `nb` Q8_K blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_q5_K_q8_K_avx2<const PF: usize>(nb: usize, x: *const u8, y: *const u8) -> f32 {
    const XB: usize = size_of::<BlockQ5K>();
    const YB: usize = size_of::<BlockQ8K>();
    let m4 = _mm256_set1_epi8(0xF);
    let m16 = _mm256_set1_epi8(16);
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0.0f32;
    for i in 0..nb {
        if PF > 0 {
            prefetch_stream::<{ size_of::<BlockQ5K>() }>(x, i, PF);
        }
        // SAFETY: block `i < nb` of each side is readable; the reads cover x's d, dmin (0..4),
        // scales (4..16), qh (16..48) and qs (48..176), and y's d, qs and bsums.
        let (xd, xdmin, utmp, hbits, q5, yd, q8, q8sums) = unsafe {
            let (bx, by) = (x.add(i * XB), y.add(i * YB));
            let sc = bx.add(offset_of!(BlockQ5K, scales));
            let qs = bx.add(offset_of!(BlockQ5K, qs));
            (
                rd_u16(bx.add(offset_of!(BlockQ5K, d))),
                rd_u16(bx.add(offset_of!(BlockQ5K, dmin))),
                [rd_u32(sc), rd_u32(sc.add(4)), rd_u32(sc.add(8)), 0],
                _mm256_loadu_si256(bx.add(offset_of!(BlockQ5K, qh)).cast()),
                [
                    _mm256_loadu_si256(qs.cast()),
                    _mm256_loadu_si256(qs.add(32).cast()),
                    _mm256_loadu_si256(qs.add(64).cast()),
                    _mm256_loadu_si256(qs.add(96).cast()),
                ],
                rd_f32(by.add(offset_of!(BlockQ8K, d))),
                load_q8k_levels(by.add(offset_of!(BlockQ8K, qs))),
                _mm256_loadu_si256(by.add(offset_of!(BlockQ8K, bsums)).cast()),
            )
        };
        let (xd, xdmin) = fp16x2_to_fp32(xd, xdmin);
        let d = yd * xd;
        let dmin = -yd * xdmin;
        let u = k4_scales_and_mins(utmp);
        let mins_and_scales =
            _mm256_cvtepu8_epi16(_mm_set_epi32(u[3] as i32, u[2] as i32, u[1] as i32, u[0] as i32));

        let q8s =
            _mm_hadd_epi16(_mm256_castsi256_si128(q8sums), _mm256_extracti128_si256::<1>(q8sums));
        let prod = _mm_madd_epi16(_mm256_extracti128_si256::<1>(mins_and_scales), q8s);
        let mzero = _mm_setzero_si128();
        let hsum = _mm_hadd_epi32(_mm_hadd_epi32(prod, mzero), mzero);
        summs = dmin.mul_add(_mm_cvtsi128_si32(hsum) as f32, summs);

        let sc128 = _mm256_castsi256_si128(mins_and_scales);
        let scales = _mm256_set_m128i(sc128, sc128);

        let mut sumi = _mm256_setzero_si256();
        for j in 0..4 {
            let scale_0 = _mm256_shuffle_epi8(scales, opaque(scale_shuffle_k4(2 * j as u8)));
            let scale_1 = _mm256_shuffle_epi8(scales, opaque(scale_shuffle_k4(2 * j as u8 + 1)));
            // 16 where bit 2j (2j + 1) of the high-bit byte is set.
            let h0 = _mm256_set1_epi8((1u8 << (2 * j)) as i8);
            let h1 = _mm256_set1_epi8((2u8 << (2 * j)) as i8);
            let q5h_0 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, h0), h0), m16);
            let q5h_1 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, h1), h1), m16);
            let q5_0 = _mm256_add_epi8(_mm256_and_si256(q5[j], m4), q5h_0);
            let q5_1 = _mm256_add_epi8(_mm256_and_si256(_mm256_srli_epi16::<4>(q5[j]), m4), q5h_1);
            let p16_0 = _mm256_madd_epi16(scale_0, _mm256_maddubs_epi16(q5_0, q8[2 * j]));
            let p16_1 = _mm256_madd_epi16(scale_1, _mm256_maddubs_epi16(q5_1, q8[2 * j + 1]));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p16_0, p16_1));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_float_8(acc) + summs
}

/// # Safety
/// The CPU supports AVX2, FMA and F16C; `x` holds `nb` Q6_K blocks and `y` `nb` Q8_K blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_q6_K_q8_K_avx2<const PF: usize>(nb: usize, x: *const u8, y: *const u8) -> f32 {
    const XB: usize = size_of::<BlockQ6K>();
    const YB: usize = size_of::<BlockQ8K>();
    let m3 = _mm256_set1_epi8(3);
    let m15 = _mm256_set1_epi8(15);
    let mut acc = _mm256_setzero_ps();
    for i in 0..nb {
        if PF > 0 {
            prefetch_stream::<{ size_of::<BlockQ6K>() }>(x, i, PF);
        }
        // SAFETY: block `i < nb` of each side is readable; the reads cover x's ql (0..128),
        // qh (128..192), scales (192..208) and d (208..210), and y's d, qs and bsums.
        let (ql, qh, scales, xd, yd, q8, q8sums) = unsafe {
            let (bx, by) = (x.add(i * XB), y.add(i * YB));
            let ql = bx.add(offset_of!(BlockQ6K, ql));
            let qh = bx.add(offset_of!(BlockQ6K, qh));
            (
                [
                    _mm256_loadu_si256(ql.cast()),
                    _mm256_loadu_si256(ql.add(32).cast()),
                    _mm256_loadu_si256(ql.add(64).cast()),
                    _mm256_loadu_si256(ql.add(96).cast()),
                ],
                [_mm256_loadu_si256(qh.cast()), _mm256_loadu_si256(qh.add(32).cast())],
                _mm_loadu_si128(bx.add(offset_of!(BlockQ6K, scales)).cast()),
                rd_u16(bx.add(offset_of!(BlockQ6K, d))),
                rd_f32(by.add(offset_of!(BlockQ8K, d))),
                load_q8k_levels(by.add(offset_of!(BlockQ8K, qs))),
                _mm256_loadu_si256(by.add(offset_of!(BlockQ8K, bsums)).cast()),
            )
        };
        let d = _mm256_set1_ps(yd * F16_TO_F32[xd as usize]);
        let scales_16 = _mm256_cvtepi8_epi16(scales);
        // The levels are stored +32: subtract 32 * scale * (sum of each 16 y levels).
        let q8sclsub = _mm256_slli_epi32::<5>(_mm256_madd_epi16(q8sums, scales_16));

        let mut sumi = _mm256_setzero_si256();
        for j in 0..2 {
            let q4bits1 = ql[2 * j];
            let q4bits2 = ql[2 * j + 1];
            let q4bits_h = qh[j];
            let q4h_0 = _mm256_slli_epi16::<4>(_mm256_and_si256(q4bits_h, m3));
            let q4h_1 = _mm256_slli_epi16::<2>(_mm256_and_si256(q4bits_h, _mm256_set1_epi8(12)));
            let q4h_2 = _mm256_and_si256(q4bits_h, _mm256_set1_epi8(48));
            let q4h_3 = _mm256_srli_epi16::<2>(_mm256_and_si256(q4bits_h, _mm256_set1_epi8(-64)));
            let q4_0 = _mm256_or_si256(_mm256_and_si256(q4bits1, m15), q4h_0);
            let q4_1 = _mm256_or_si256(_mm256_and_si256(q4bits2, m15), q4h_1);
            let q4_2 =
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(q4bits1), m15), q4h_2);
            let q4_3 =
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(q4bits2), m15), q4h_3);

            let p16_0 = _mm256_maddubs_epi16(q4_0, q8[4 * j]);
            let p16_1 = _mm256_maddubs_epi16(q4_1, q8[4 * j + 1]);
            let p16_2 = _mm256_maddubs_epi16(q4_2, q8[4 * j + 2]);
            let p16_3 = _mm256_maddubs_epi16(q4_3, q8[4 * j + 3]);

            let is = 4 * j as u8;
            // The shuffle control goes through `opaque128`: as a constant, the compiler rewrites
            // each `vpshufb` into two or three other shuffles (ten extra shuffles a block).
            let sc = |k: u8| {
                _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, opaque128(scale_shuffle(is + k))))
            };
            let p16_0 = _mm256_madd_epi16(sc(0), p16_0);
            let p16_1 = _mm256_madd_epi16(sc(1), p16_1);
            let p16_2 = _mm256_madd_epi16(sc(2), p16_2);
            let p16_3 = _mm256_madd_epi16(sc(3), p16_3);
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p16_0, p16_1));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p16_2, p16_3));
        }
        let sumi = _mm256_sub_epi32(sumi, q8sclsub);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_float_8(acc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::Xorshift64;

    #[test]
    fn f16_table_matches_f16c() {
        if !crate::kernels::Isa::Avx2.is_supported() {
            return;
        }
        #[target_feature(enable = "avx2,fma,f16c")]
        fn check() {
            for h in 0..=u16::MAX {
                let want = fp16_to_fp32(h);
                assert_eq!(F16_TO_F32[h as usize].to_bits(), want.to_bits(), "{h:#06x}");
            }
        }
        // SAFETY: the CPU was just found to support AVX2, FMA and F16C.
        unsafe { check() }
    }

    #[test]
    fn stream_variants_give_the_plain_kernels_bits() {
        if !crate::kernels::Isa::Avx2.is_supported() {
            return;
        }
        let mut r = Xorshift64::from_state(0x9E37_79B9_7F4A_7C15);
        // Every type whose AVX2 (or AVX-512) table has a decode (stream) variant, IQ kernels
        // included.
        let mut checked = Vec::new();
        let tiers =
            [crate::kernels::Isa::Avx2, crate::kernels::Isa::Avx512, crate::kernels::Isa::Amx];
        for (t, ty) in tiers
            .iter()
            .filter_map(|&i| crate::kernels::table_for(i))
            .flat_map(|t| DType::ALL.into_iter().map(move |ty| (t, ty)))
        {
            let (Some(plain), Some(stream)) = (t.vec_dot(ty), t.vec_dot_stream(ty)) else {
                continue;
            };
            if plain as usize == stream as usize {
                continue;
            }
            if t.stream_own_order(ty) {
                // In its own order (BF16's `vdpbf16ps`, tested in `avx512.rs`).
                continue;
            }
            checked.push(ty);
            for n in [256, 512, 4096, 14336 + 256] {
                let x: Vec<f32> = (0..n).map(|_| r.next_f32()).collect();
                let y: Vec<f32> = (0..n).map(|_| r.next_f32()).collect();
                let mut xq = vec![0u8; ty.row_size(n).unwrap()];
                if crate::quant::quantize(ty, &x, &mut xq).is_err() {
                    crate::quant::quantize_for_dot(ty, &x, &mut xq).unwrap();
                }
                let vd = ty.vec_dot_type();
                let mut yq = vec![0u8; vd.row_size(n).unwrap()];
                crate::quant::quantize_for_dot(vd, &y, &mut yq).unwrap();
                let (a, b) = (plain(n, &xq, &yq), stream(n, &xq, &yq));
                assert_eq!(a.to_bits(), b.to_bits(), "{ty} n={n}");
            }
        }
        // The types measured to gain from prefetching (see `STREAM_PF` and `plug`).
        for ty in [DType::F16, DType::BF16, DType::Q5_1, DType::Q5_0, DType::Q4_K, DType::Q6_K] {
            assert!(checked.contains(&ty), "{ty} has no stream variant");
        }
        assert!(checked.contains(&DType::IQ4_NL) && checked.contains(&DType::IQ3_S), "{checked:?}");
    }

    /// The block types with two-row and run forms on the AVX2 tier (IQ4_NL has a two-row form
    /// only: its run form measured no gain).
    const AVX2_BLOCK_PAIRS: [DType; 8] = [
        DType::Q1_0,
        DType::Q4_0,
        DType::Q5_0,
        DType::Q8_0,
        DType::Q4_1,
        DType::Q5_1,
        DType::MXFP4,
        DType::NVFP4,
    ];

    /// The run forms give every pair the two-row form's bits: rows back to back and with a
    /// stride longer than a row, runs of 0 to 5 pairs, a non-finite scale in one row; and a run
    /// whose slices end inside its last rows takes what each row holds, as the two-row form does.
    #[test]
    fn run_forms_give_the_two_row_bits() {
        let mut r = Xorshift64::from_state(0x0DD5_EED5_51F1_5EED);
        let tiers =
            [crate::kernels::Isa::Avx2, crate::kernels::Isa::Avx512, crate::kernels::Isa::Amx];
        let mut checked = Vec::new();
        for t in tiers.iter().filter_map(|&i| crate::kernels::table_for(i)) {
            for ty in DType::ALL {
                let Some(pairs) = t.vec_dot_pairs(ty) else { continue };
                let two = t.vec_dot2_stream(ty).expect("a run form has a two-row form");
                checked.push(ty);
                let nb = 3;
                let n = ty.block_size() * nb;
                let rb = ty.row_size(n).unwrap();
                let y: Vec<f32> = (0..n).map(|_| r.next_f32()).collect();
                let mut yq = vec![0u8; ty.vec_dot_type().row_size(n).unwrap()];
                crate::quant::quantize_for_dot(ty.vec_dot_type(), &y, &mut yq).unwrap();
                for (count, pad) in [(0, 0), (1, 0), (2, 5), (5, 0), (5, 17)] {
                    let stride = rb + pad;
                    let mut streams = [(); 2].map(|_| vec![0u8; count * stride]);
                    for s in &mut streams {
                        for row in s.chunks_mut(stride) {
                            let x: Vec<f32> = (0..n).map(|_| r.next_f32()).collect();
                            crate::quant::quantize(ty, &x, &mut row[..rb]).unwrap();
                        }
                    }
                    if count > 1 && ty != DType::MXFP4 {
                        // An infinite scale in the second stream's second row (f16 0x7C00; the
                        // first field of these block types).
                        let at = stride + ty.type_size();
                        streams[1][at..at + 2].copy_from_slice(&0x7C00u16.to_le_bytes());
                    }
                    // Whole, then both streams cut inside their last row's last block (in
                    // release builds: debug builds assert that dot slices are whole).
                    let cuts = [0, if cfg!(debug_assertions) { 0 } else { ty.type_size() / 2 }];
                    for cut in cuts {
                        let (a, b) = (&streams[0], &streams[1]);
                        let x =
                            [&a[..a.len().saturating_sub(cut)], &b[..b.len() - cut.min(b.len())]];
                        let mut out = vec![[f32::NAN; 2]; count];
                        pairs(n, x, stride, &yq, &mut out);
                        for (i, got) in out.iter().enumerate() {
                            let rows = x.map(|s| s.get(i * stride..).unwrap_or_default());
                            let want = two(n, rows, &yq);
                            assert_eq!(
                                got.map(f32::to_bits),
                                want.map(f32::to_bits),
                                "{ty} pairs={count} pad={pad} cut={cut} pair {i}"
                            );
                        }
                    }
                }
            }
        }
        if crate::kernels::Isa::Avx2.is_supported() {
            for ty in AVX2_BLOCK_PAIRS {
                assert!(checked.contains(&ty), "{ty}: {checked:?}");
            }
        }
    }

    /// The two-row streaming dots give each row the one-row streaming dot's bits, non-finite
    /// weight scales (Q4_0's checked loop) and odd block counts included.
    #[test]
    fn two_row_dots_give_the_one_row_bits() {
        let mut r = Xorshift64::from_state(0x51F1_5EED_0DD5_EED5);
        let tiers =
            [crate::kernels::Isa::Avx2, crate::kernels::Isa::Avx512, crate::kernels::Isa::Amx];
        let mut checked = Vec::new();
        for t in tiers.iter().filter_map(|&i| crate::kernels::table_for(i)) {
            for ty in DType::ALL {
                let Some(two) = t.vec_dot2_stream(ty) else { continue };
                let one = t.vec_dot_stream(ty).unwrap();
                checked.push(ty);
                for nb in [1usize, 2, 7, 56] {
                    let n = ty.block_size() * nb;
                    let rows: Vec<Vec<u8>> = (0..2)
                        .map(|_| {
                            let x: Vec<f32> = (0..n).map(|_| r.next_f32()).collect();
                            let mut xq = vec![0u8; ty.row_size(n).unwrap()];
                            crate::quant::quantize(ty, &x, &mut xq).unwrap();
                            xq
                        })
                        .collect();
                    let y: Vec<f32> = (0..n).map(|_| r.next_f32()).collect();
                    let mut yq = vec![0u8; ty.vec_dot_type().row_size(n).unwrap()];
                    crate::quant::quantize_for_dot(ty.vec_dot_type(), &y, &mut yq).unwrap();
                    // As quantized, then with an infinite and a NaN scale in the second row's
                    // last block (f16 0x7C00, 0x7E00, the block's first field but for Q2_K,
                    // Q3_K and Q6_K; for MXFP4 the E8M0 byte, 0xFE the largest and 0xFF NaN).
                    let scale_at = match ty {
                        DType::Q2_K => offset_of!(BlockQ2K, d),
                        DType::Q3_K => offset_of!(BlockQ3K, d),
                        DType::Q6_K => offset_of!(BlockQ6K, d),
                        _ => 0,
                    };
                    for special in [None, Some(0x7C00u16), Some(0x7E00)] {
                        let mut rows = rows.clone();
                        if let Some(h) = special {
                            let at = (nb - 1) * ty.type_size() + scale_at;
                            if ty == DType::MXFP4 {
                                rows[1][at] = if h == 0x7C00 { 0xFE } else { 0xFF };
                            } else {
                                rows[1][at..at + 2].copy_from_slice(&h.to_le_bytes());
                            }
                        }
                        let got = two(n, [&rows[0], &rows[1]], &yq);
                        for (i, row) in rows.iter().enumerate() {
                            let want = one(n, row, &yq);
                            assert_eq!(
                                got[i].to_bits(),
                                want.to_bits(),
                                "{ty} nb={nb} row {i} {special:?}: {} vs {want}",
                                got[i]
                            );
                        }
                    }
                }
            }
        }
        if crate::kernels::Isa::Avx2.is_supported() {
            for ty in [DType::F16, DType::BF16, DType::IQ4_NL].into_iter().chain(AVX2_BLOCK_PAIRS) {
                assert!(checked.contains(&ty), "{ty}: {checked:?}");
            }
        }
        if super::super::test_util::avx2_and_avx512(false).is_some() {
            for ty in
                [DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_XS]
            {
                assert!(checked.contains(&ty), "{ty}: {checked:?}");
            }
        }
        if super::super::test_util::avx2_and_avx512(true).is_some() {
            assert!(checked.contains(&DType::MXFP4), "MXFP4: {checked:?}");
        }
    }

    #[test]
    fn float_gemms_give_vec_dot_bits() {
        if !crate::kernels::Isa::Avx2.is_supported() {
            return;
        }
        let mut r = Xorshift64::from_state(0x0F1E_2D3C_4B5A_6978);
        type Gemm = fn(usize, &[&[u8]], &[&[u8]], &mut [f32]);
        type Kind = (fn(f32) -> Vec<u8>, Gemm, fn(usize, &[u8], &[u8]) -> f32);
        let kinds: [Kind; 3] = [
            (|v| v.to_le_bytes().to_vec(), gemm_f32, vec_dot_f32),
            (|v| half::f16::from_f32(v).to_le_bytes().to_vec(), gemm_f16, vec_dot_f16),
            (|v| half::bf16::from_f32(v).to_le_bytes().to_vec(), gemm_bf16, vec_dot_bf16),
        ];
        for (enc, gemm, dot) in kinds {
            for k in [7, 32, 100, 14336 + 7] {
                let mut row = || (0..k).flat_map(|_| enc(r.next_f32())).collect::<Vec<u8>>();
                let rows: Vec<Vec<u8>> = (0..5).map(|_| row()).collect();
                let cols: Vec<Vec<u8>> = (0..2).map(|_| row()).collect();
                for nr in 1..=5 {
                    for nc in 1..=2 {
                        let x: Vec<&[u8]> = rows[..nr].iter().map(|r| r.as_slice()).collect();
                        let y: Vec<&[u8]> = cols[..nc].iter().map(|c| c.as_slice()).collect();
                        let mut out = vec![0f32; nr * nc];
                        gemm(k, &x, &y, &mut out);
                        for c in 0..nc {
                            for r in 0..nr {
                                let want = dot(k, x[r], y[c]);
                                let got = out[c * nr + r];
                                assert_eq!(got.to_bits(), want.to_bits(), "k={k} {nr}x{nc}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn e8m0_table_matches_the_format_definition() {
        for e in 0..=255u8 {
            let want = crate::quant::fp4::e8m0_to_fp32_half(e);
            assert_eq!(E8M0_TO_FP32_HALF[e as usize].to_bits(), want.to_bits(), "{e}");
        }
    }

    #[test]
    fn ue4m3_table_matches_the_format_definition() {
        for x in 0..=255u8 {
            let want = crate::quant::fp4::ue4m3_to_fp32(x);
            assert_eq!(UE4M3_TO_FP32[x as usize].to_bits(), want.to_bits(), "{x:#04x}");
        }
    }
}
