//! x86-64 tiers. Each file is one tier with the same function names as `../scalar.rs`.

/// The shape dispatch of the Q4_0 / Q8_0 register tiles (`avx2_gemm.rs`, `avx512_gemm.rs`):
/// `x_block`, `gemm_q0` (caps the block count by what every slice holds, picks the `R x C`
/// instance, one output at a time for other shapes) and `tile` (runs `$kernel::<Q4, R, C>` and
/// stores `out[c * R + r]`). The invoking file's `plug` installs the wrappers only on a CPU with
/// `$kernel`'s features, which makes the call sound.
/// The wrappers of the repacked Q4_0-family kernels (`avx2_repack.rs`, `avx512_repack.rs`):
/// `gemm_{q4_0,iq4_nl,mxfp4}_x8`, `q0_group_bytes` and `q0` (length checks, then the invoking
/// file's `q0_kernel::<KIND, NC>` on chunks of up to `REPACK_NC` columns). The invoking file's
/// `plug` installs the wrappers only on a CPU with `q0_kernel`'s features.
macro_rules! q0_repack_driver {
    () => {
        fn gemm_q4_0_x8(x: &[u8], y: &[&[u8]], acc: &mut [[f32; 8]]) {
            q0::<KIND_Q4_0>(x, y, acc);
        }

        fn gemm_iq4_nl_x8(x: &[u8], y: &[&[u8]], acc: &mut [[f32; 8]]) {
            q0::<KIND_IQ4_NL>(x, y, acc);
        }

        fn gemm_mxfp4_x8(x: &[u8], y: &[&[u8]], acc: &mut [[f32; 8]]) {
            q0::<KIND_MXFP4>(x, y, acc);
        }

        const fn q0_group_bytes(kind: u8) -> usize {
            if kind == KIND_MXFP4 { 136 } else { 144 }
        }

        #[inline(always)]
        fn q0<const KIND: u8>(x: &[u8], y: &[&[u8]], acc: &mut [[f32; 8]]) {
            let nb = x.len() / q0_group_bytes(KIND);
            assert!(acc.len() == y.len(), "repack kernel: bad column count");
            assert!(
                y.iter().all(|c| c.len() >= nb * Y0_BYTES),
                "repack kernel: activations too short"
            );
            for (y, acc) in y.chunks(REPACK_NC).zip(acc.chunks_mut(REPACK_NC)) {
                // SAFETY: `plug` installs these wrappers only on CPUs with the kernel's target
                // features; x holds `nb` group blocks and every y row `nb` activation blocks
                // (checked above); acc has y.len() rows.
                unsafe {
                    match y.len() {
                        1 => q0_kernel::<KIND, 1>(nb, x.as_ptr(), y, acc),
                        2 => q0_kernel::<KIND, 2>(nb, x.as_ptr(), y, acc),
                        3 => q0_kernel::<KIND, 3>(nb, x.as_ptr(), y, acc),
                        _ => q0_kernel::<KIND, 4>(nb, x.as_ptr(), y, acc),
                    }
                }
            }
        }
    };
}

macro_rules! q0_tile_driver {
    ($kernel:ident) => {
        const fn x_block<const Q4: bool>() -> usize {
            if Q4 { size_of::<BlockQ4_0>() } else { size_of::<BlockQ8_0>() }
        }

        #[inline(always)]
        fn gemm_q0<const Q4: bool>(k: usize, x: &[&[u8]], y: &[&[u8]], out: &mut [f32]) {
            // Cap the block count by what every slice really holds, so the kernel stays in
            // bounds even if a caller broke the contract (`k / 32` whole blocks in each slice).
            let mut nb = k / 32;
            for xr in x {
                nb = nb.min(xr.len() / x_block::<Q4>());
            }
            for yc in y {
                nb = nb.min(yc.len() / size_of::<BlockQ8_0>());
            }
            debug_assert_eq!(nb, k / 32, "gemm slices too short");
            let rows = x.len();
            assert!(out.len() >= rows * y.len(), "gemm output too short");
            match (rows, y.len()) {
                (4, 2) => tile::<Q4, 4, 2>(nb, x, y, out),
                (4, 1) => tile::<Q4, 4, 1>(nb, x, y, out),
                (3, 2) => tile::<Q4, 3, 2>(nb, x, y, out),
                (3, 1) => tile::<Q4, 3, 1>(nb, x, y, out),
                (2, 2) => tile::<Q4, 2, 2>(nb, x, y, out),
                (2, 1) => tile::<Q4, 2, 1>(nb, x, y, out),
                (1, 2) => tile::<Q4, 1, 2>(nb, x, y, out),
                _ => {
                    // Any other shape (larger than the register tile, or empty): one output at
                    // a time.
                    for (c, yc) in y.iter().enumerate() {
                        for (r, xr) in x.iter().enumerate() {
                            let mut o = [0.0f32];
                            tile::<Q4, 1, 1>(nb, &[xr], &[yc], &mut o);
                            out[c * rows + r] = o[0];
                        }
                    }
                }
            }
        }

        /// Runs the `R x C` kernel on the first `R` slices of `x` and `C` of `y`, each holding
        /// at least `nb` blocks (checked by `gemm_q0`), and stores the results at
        /// `out[c * R + r]`.
        #[inline(always)]
        fn tile<const Q4: bool, const R: usize, const C: usize>(
            nb: usize,
            x: &[&[u8]],
            y: &[&[u8]],
            out: &mut [f32],
        ) {
            let xp: [*const u8; R] = std::array::from_fn(|r| x[r].as_ptr());
            let yp: [*const u8; C] = std::array::from_fn(|c| y[c].as_ptr());
            // SAFETY: `gemm_q0` capped `nb` so that each of these `R` weight rows holds `nb`
            // blocks of `x_block::<Q4>()` bytes and each of the `C` activation rows `nb` Q8_0
            // blocks, which is all the kernel reads; `plug` installs the wrappers only on a CPU
            // with the kernel's target features.
            let acc = unsafe { $kernel::<Q4, R, C>(nb, xp, yp) };
            for c in 0..C {
                out[c * R..c * R + R].copy_from_slice(&acc[c]);
            }
        }
    };
}

mod amx_bf16;
mod amx_igemm;
pub(crate) mod avx2;
mod avx2_conv;
pub(crate) mod avx2_elementwise; // swiglu, gelu gather, rope rotation, attention scores
mod avx2_gemm;
mod avx2_igemm;
pub(crate) mod avx2_iq;
mod avx2_quants;
mod avx2_recurrent;
mod avx2_repack;
mod avx2_sgemm;
mod avx2_unpack;
pub(crate) mod avx512;
mod avx512_gemm;
mod avx512_igemm;
mod avx512_iq;
mod avx512_kquants;
mod avx512_quants;
mod avx512_repack;

use super::{Isa, KernelTable};

/// Proof that this CPU runs the AVX2 tier (AVX2, FMA and F16C). Only [`Avx2::detect`] makes one,
/// so a function that takes an `Avx2` runs on such a CPU: the tier's `plug` functions take one,
/// and the kernels they install rest their `// SAFETY:` argument on it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx2(());

impl Avx2 {
    /// `Some` exactly when this CPU supports the AVX2 tier.
    pub(crate) fn detect() -> Option<Avx2> {
        Isa::Avx2.is_supported().then_some(Avx2(()))
    }
}

/// Proof that this CPU runs the AVX-512 tier (AVX-512 F, BW, DQ and VL on top of the AVX2 tier).
/// Only [`Avx512::detect`] makes one.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx512(());

impl Avx512 {
    /// `Some` exactly when this CPU supports the AVX-512 tier.
    pub(crate) fn detect() -> Option<Avx512> {
        Isa::Avx512.is_supported().then_some(Avx512(()))
    }
}

/// Proof that this CPU runs the AMX tier (AMX-INT8 with the tile data permitted, on top of the
/// AVX-512 tier with AVX-512 VNNI). Only [`Amx::detect`] makes one.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Amx(());

impl Amx {
    /// `Some` exactly when this CPU supports the AMX tier.
    pub(crate) fn detect() -> Option<Amx> {
        Isa::Amx.is_supported().then_some(Amx(()))
    }

    /// The AMX tier includes the AVX2 tier.
    pub(crate) fn avx2(self) -> Avx2 {
        Avx2(())
    }
}

/// Overwrites the table entries that the AMX tier implements (over the AVX-512 tier's).
pub(crate) fn plug_amx(t: &mut KernelTable, cpu: Amx) {
    t.igemm = Some(amx_igemm::AMX);
    // The Intel cores with AMX run `vdpbf16ps` at about half their f32 FMA rate, so BF16
    // weights take the f32 GEMM kernels (BF16 widened exactly) here: 4096 x 512 x 14336 BF16
    // prefill on 2 Emerald Rapids cores, 4 alternating rounds, 112 -> 147 GFLOPS (1.43).
    t.sgemm_bf16 = None;
    // Where the tile unit multiplies BF16 as well (AMX-BF16), BF16 prefill with K a multiple
    // of 32 takes it instead: 4096 x 512 x 14336 on 2 Emerald Rapids cores, 3 alternating
    // rounds, the f32 kernels 255-293 ms, the tiles 49-68 ms.
    if super::CpuFeatures::detect().amx_bf16 {
        t.tile_bf16 = Some((amx_bf16::tile_bf16, amx_igemm::release));
    }
    // And the AVX2 tier's widening dots for few columns: 4096 x 1 x 14336 BF16 there, 4
    // interleaved rounds, medians: `vdpbf16ps` 6.65 ms, widening 3.77 (ggml 5.87).
    avx2_quants::plug_bf16(t, cpu.avx2());
}

/// Whether this CPU has AMX-BF16 (CPUID leaf 7 sub-leaf 0, EDX bit 22); the tile data
/// permission is `amx_usable`'s (`CpuFeatures::amx_bf16` asks for both).
pub(crate) fn amx_bf16() -> bool {
    std::arch::x86_64::__cpuid(0).eax >= 7
        && std::arch::x86_64::__cpuid_count(7, 0).edx & (1 << 22) != 0
}

/// Whether this CPU has AMX-TILE and AMX-INT8 and the operating system lets this process use
/// the tile data. On Linux the permission is asked for (`arch_prctl(ARCH_REQ_XCOMP_PERM,
/// XFEATURE_XTILEDATA)`), which is process-wide and is asked for once, by
/// `CpuFeatures::detect`.
pub(crate) fn amx_usable() -> bool {
    // CPUID leaf 7 sub-leaf 0, EDX bit 24: AMX-TILE; bit 25: AMX-INT8.
    let max = std::arch::x86_64::__cpuid(0).eax;
    if max < 7 {
        return false;
    }
    let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
    if edx & (3 << 24) != 3 << 24 {
        return false;
    }
    request_tile_data()
}

#[cfg(target_os = "linux")]
fn request_tile_data() -> bool {
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    let ret: i64;
    // SAFETY: the arch_prctl system call with ARCH_REQ_XCOMP_PERM only extends the set of
    // extended-state components the process may use; it reads and writes no user memory. The
    // kernel clobbers rcx and r11 (declared) and returns in rax.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret == 0
}

#[cfg(not(target_os = "linux"))]
fn request_tile_data() -> bool {
    false
}

/// The CPU family (with the extended family added, as CPUID leaf 1 reports it) on an AMD or
/// Hygon CPU, `None` on other vendors: for kernels whose speed differs by vendor (microcoded
/// `pdep` before Zen 3, slow gathers).
pub(crate) fn amd_family() -> Option<u32> {
    use std::arch::x86_64::__cpuid;
    let v = __cpuid(0);
    let vendor: Vec<u8> = [v.ebx, v.edx, v.ecx].iter().flat_map(|r| r.to_le_bytes()).collect();
    if vendor != *b"AuthenticAMD" && vendor != *b"HygonGenuine" {
        return None;
    }
    let eax = __cpuid(1).eax;
    let base = (eax >> 8) & 0xf;
    Some(if base == 0xf { base + ((eax >> 20) & 0xff) } else { base })
}

/// Overwrites the table entries that the AVX2 (+FMA, F16C) tier implements.
pub(crate) fn plug_avx2(t: &mut KernelTable, cpu: Avx2) {
    avx2::plug(t, cpu);
    avx2_quants::plug(t, cpu);
    avx2_iq::plug(t, cpu);
    avx2_gemm::plug(t, cpu);
    avx2_sgemm::plug(t, cpu);
    avx2_repack::plug(t, cpu);
    t.igemm = Some(if std::arch::is_x86_feature_detected!("avxvnni") {
        avx2_igemm::AVX_VNNI
    } else {
        avx2_igemm::MADDUBS
    });
    avx2_elementwise::plug(t, cpu);
    t.recurrent = avx2_recurrent::kernels(cpu);
    t.conv = avx2_conv::kernels(cpu);
}

/// The AVX2 `vpmaddubsw` integer GEMM kernels where the CPU can run them (the tier installs the
/// AVX-VNNI ones instead where it has those).
#[cfg(test)]
pub(crate) fn avx2_igemm_maddubs() -> Option<crate::kernels::igemm::IgemmKernels> {
    (std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma"))
        .then_some(avx2_igemm::MADDUBS)
}

/// Test support shared by the tier files' tests.
#[cfg(test)]
pub(crate) mod test_util {
    use crate::kernels::{Isa, KernelTable, table_for};

    /// The AVX2 and AVX-512 tables, to compare a kernel of the AVX-512 tier with its AVX2 twin;
    /// `None` (the test says it skips) on a CPU without the AVX-512 tier, or without
    /// AVX512_VNNI when `vnni`.
    pub(crate) fn avx2_and_avx512(
        vnni: bool,
    ) -> Option<(&'static KernelTable, &'static KernelTable)> {
        let ok = Isa::Avx512.is_supported()
            && (!vnni || std::arch::is_x86_feature_detected!("avx512vnni"));
        if !ok {
            eprintln!("skipped: no AVX-512{} on this CPU", if vnni { " VNNI" } else { "" });
            return None;
        }
        Some((table_for(Isa::Avx2)?, table_for(Isa::Avx512)?))
    }
}
