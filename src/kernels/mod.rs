//! Compute kernels and their run-time dispatch.
//!
//! Every ISA tier is compiled into every binary: the portable files (`scalar.rs`, `recurrent.rs`,
//! `conv.rs`, ..., always present) and one file per (arch, tier) under `x86/` with the same
//! function names. [`CpuFeatures::detect`] runs once; a `KernelTable` of function pointers is
//! filled from the portable kernels and then overwritten tier by tier (each tier's `plug`) up to
//! the tier it is built for. No feature check happens inside a loop, and no kernel is reached
//! other than through a table: the `x86` module is private to this one.
//!
//! A plan runs the table of its backend's tier: the one given to `CpuBackend::with_isa`, or the
//! process-wide default, which is the best tier this CPU has, lowered by the environment variable
//! `QUANTGRAPH_ISA=scalar|avx2|avx512|amx` (read once) or by [`set_isa`].

pub(crate) mod conv;
pub(crate) mod gemm;
pub(crate) mod igemm;
pub(crate) mod prefetch;
pub(crate) mod recurrent;
pub(crate) mod repack;
pub(crate) mod scalar;
pub(crate) mod sgemm;
pub(crate) mod tables;
// Private: a tier's kernels are reached only through the tables its `plug` fills.
#[cfg(target_arch = "x86_64")]
mod x86;
/// The AVX2 `vpmaddubsw` integer kernels, for tests on CPUs whose AVX2 tier installs others.
#[cfg(all(test, target_arch = "x86_64"))]
pub(crate) use x86::avx2_igemm_maddubs;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::quant::{FromFloatFn, VecDotFn};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};

/// A SIMD tier. Higher tiers include the lower ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Isa {
    /// Portable Rust, no `std::arch`.
    Scalar = 0,
    /// x86-64 with AVX2, FMA and F16C.
    Avx2 = 1,
    /// x86-64 with AVX-512 F, BW, DQ and VL on top of AVX2 (Skylake-X, Ice Lake, Zen 4, Zen 5).
    Avx512 = 2,
    /// x86-64 with AMX-INT8 tiles on top of the AVX-512 tier with AVX-512 VNNI (Intel Xeon from
    /// Sapphire Rapids on), where the operating system lets the process use the tile data
    /// (Linux): the AVX-512 tier with the integer GEMM (quantized matmul with several activation
    /// columns) on the tile unit, and BF16 weights' GEMM on the f32 kernels (these cores run
    /// `vdpbf16ps` at half their FMA rate).
    Amx = 3,
}

impl Isa {
    /// Every tier this crate knows, lowest first.
    pub const ALL: [Isa; 4] = [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Amx];

    /// Lower-case name as accepted by `QUANTGRAPH_ISA`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Amx => "amx",
        }
    }

    /// Parses a tier name (`scalar`, `avx2`, `avx512`, `amx`).
    pub fn from_name(s: &str) -> Option<Isa> {
        Isa::ALL.into_iter().find(|i| i.name().eq_ignore_ascii_case(s.trim()))
    }

    /// True when this CPU can run the tier.
    pub fn is_supported(self) -> bool {
        let f = CpuFeatures::detect();
        match self {
            Isa::Scalar => true,
            Isa::Avx2 => f.avx2 && f.fma && f.f16c,
            Isa::Avx512 => Isa::Avx2.is_supported() && avx512_tier_features(),
            Isa::Amx => Isa::Avx512.is_supported() && f.avx512_vnni && f.amx_int8,
        }
    }

    /// The highest tier this CPU supports.
    pub fn best() -> Isa {
        Isa::ALL.into_iter().rev().find(|i| i.is_supported()).unwrap_or(Isa::Scalar)
    }
}

/// AVX-512 F, BW, DQ and VL, the subsets the AVX-512 tier's kernels use.
#[cfg(target_arch = "x86_64")]
fn avx512_tier_features() -> bool {
    use std::arch::is_x86_feature_detected as has;
    has!("avx512f") && has!("avx512bw") && has!("avx512dq") && has!("avx512vl")
}

#[cfg(not(target_arch = "x86_64"))]
fn avx512_tier_features() -> bool {
    false
}

/// CPU features found at run time, named as ggml's CPU backend reports them
/// (`ggml_backend_cpu_get_features`). The fields are a report: the tiers' `plug` functions check
/// the features their kernels need themselves, once, when a kernel table is filled.
/// A field is false when the feature is absent or not probed on this architecture.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct CpuFeatures {
    /// SSE3 (x86). Reported only: every x86 tier implies it.
    pub sse3: bool,
    /// SSSE3 (x86). Reported only: every x86 tier implies it.
    pub ssse3: bool,
    /// AVX, 256-bit float vectors (x86). Reported only: implied by the AVX2 tier.
    pub avx: bool,
    /// AVX-VNNI, `vpdpbusd` on 256-bit vectors (x86): the AVX2 tier's integer GEMM (quantized
    /// matmul with several activation columns) uses it instead of `vpmaddubsw` when present.
    pub avx_vnni: bool,
    /// AVX2, 256-bit integer vectors (x86). With `fma` and `f16c` it enables [`Isa::Avx2`], the
    /// tier with the x86 dot products, GEMM tiles, repacked matmul, elementwise, recurrent and
    /// convolution kernels.
    pub avx2: bool,
    /// F16C, f16 <-> f32 conversion (`vcvtph2ps`, `vcvtps2ph`): needed by [`Isa::Avx2`] for F16
    /// tensors and the f16 scales of quantized blocks. On aarch64, the FP16 extension (`fp16`).
    pub f16c: bool,
    /// FMA3, fused multiply-add (x86): needed by [`Isa::Avx2`].
    pub fma: bool,
    /// BMI2 (x86): its `pdep` speeds up the AVX2 tier's IQ1_M and IQ3_S dot products, used only
    /// where `pdep` is fast (not on AMD before Zen 3, where it is microcoded).
    pub bmi2: bool,
    /// AVX-512 Foundation (x86; ggml's `AVX512` flag). [`Isa::Avx512`] also needs AVX-512 BW,
    /// DQ and VL, which are checked but not reported separately.
    pub avx512: bool,
    /// AVX-512 VBMI, byte permutes (x86). Reported only: no kernel uses it.
    pub avx512_vbmi: bool,
    /// AVX-512 VNNI, `vpdpbusd` on 512-bit vectors (x86): the AVX-512 tier's integer GEMM,
    /// Q4_0/Q8_0 GEMM tiles and repacked Q4_0, IQ4_NL and MXFP4 kernels use it when present.
    pub avx512_vnni: bool,
    /// AVX-512 BF16, `vdpbf16ps` (x86): the AVX-512 tier's BF16 matmul kernels.
    pub avx512_bf16: bool,
    /// AMX-TILE and AMX-INT8, the tile unit's int8 products (x86), with the operating system's
    /// permission to use the tile data (asked for here, once; Linux only, false elsewhere).
    /// With AVX-512 VNNI it enables [`Isa::Amx`].
    pub amx_int8: bool,
    /// AMX-BF16, the tile unit's BF16 products (x86), reported where [`amx_int8`](Self::amx_int8)
    /// is (the same tile data permission): the AMX tier's BF16 prefill uses it.
    pub amx_bf16: bool,
    /// NEON (aarch64). Reported only: aarch64 runs the portable scalar tier.
    pub neon: bool,
    /// The dot product extension, `sdot`/`udot` (aarch64). Reported only.
    pub dotprod: bool,
    /// The int8 matrix multiply extension (I8MM, `smmla`; aarch64). Reported only.
    pub matmul_int8: bool,
    /// SVE, scalable vectors (aarch64). Reported only.
    pub sve: bool,
    /// The CPU's brand string ("AMD EPYC ...", "Intel(R) Xeon(R) ..."), or "CPU" when unknown.
    pub brand: String,
}

impl CpuFeatures {
    /// Detects the features of this CPU once; later calls return the cached result.
    pub fn detect() -> &'static CpuFeatures {
        static F: OnceLock<CpuFeatures> = OnceLock::new();
        F.get_or_init(detect_features)
    }

    /// ggml's feature list: `(name, value)` pairs, "1" for a present flag.
    pub fn list(&self) -> Vec<(&'static str, String)> {
        let flags = [
            ("SSE3", self.sse3),
            ("SSSE3", self.ssse3),
            ("AVX", self.avx),
            ("AVX_VNNI", self.avx_vnni),
            ("AVX2", self.avx2),
            ("F16C", self.f16c),
            ("FMA", self.fma),
            ("BMI2", self.bmi2),
            ("AVX512", self.avx512),
            ("AVX512_VBMI", self.avx512_vbmi),
            ("AVX512_VNNI", self.avx512_vnni),
            ("AVX512_BF16", self.avx512_bf16),
            ("AMX_INT8", self.amx_int8),
            ("AMX_BF16", self.amx_bf16),
            ("NEON", self.neon),
            ("DOTPROD", self.dotprod),
            ("MATMUL_INT8", self.matmul_int8),
            ("SVE", self.sve),
        ];
        flags.into_iter().filter(|(_, on)| *on).map(|(n, _)| (n, "1".to_string())).collect()
    }
}

#[cfg(target_arch = "x86_64")]
fn detect_features() -> CpuFeatures {
    use std::arch::is_x86_feature_detected as has;
    let amx = x86::amx_usable();
    CpuFeatures {
        sse3: has!("sse3"),
        ssse3: has!("ssse3"),
        avx: has!("avx"),
        avx_vnni: has!("avxvnni"),
        avx2: has!("avx2"),
        f16c: has!("f16c"),
        fma: has!("fma"),
        bmi2: has!("bmi2"),
        avx512: has!("avx512f"),
        avx512_vbmi: has!("avx512vbmi"),
        avx512_vnni: has!("avx512vnni"),
        avx512_bf16: has!("avx512bf16"),
        amx_int8: amx,
        amx_bf16: amx && x86::amx_bf16(),
        brand: brand_string(),
        ..Default::default()
    }
}

#[cfg(target_arch = "x86_64")]
fn brand_string() -> String {
    use std::arch::x86_64::__cpuid;
    // cpuid exists on every x86_64 CPU; leaf 0x8000_0000 reports the highest extended leaf, and
    // leaves 0x8000_0002..=4 are read only when that maximum includes them.
    let max = __cpuid(0x8000_0000).eax;
    if max < 0x8000_0004 {
        return "CPU".into();
    }
    let mut bytes = Vec::with_capacity(48);
    for leaf in 0x8000_0002u32..=0x8000_0004 {
        let r = __cpuid(leaf);
        for v in [r.eax, r.ebx, r.ecx, r.edx] {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
    }
    let s = String::from_utf8_lossy(&bytes).trim_matches(char::from(0)).trim().to_string();
    if s.is_empty() { "CPU".into() } else { s }
}

#[cfg(target_arch = "aarch64")]
fn detect_features() -> CpuFeatures {
    use std::arch::is_aarch64_feature_detected as has;
    CpuFeatures {
        neon: has!("neon"),
        dotprod: has!("dotprod"),
        matmul_int8: has!("i8mm"),
        sve: has!("sve"),
        f16c: has!("fp16"),
        brand: "CPU".into(),
        ..Default::default()
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn detect_features() -> CpuFeatures {
    CpuFeatures { brand: "CPU".into(), ..Default::default() }
}

/// `n` f32 elementwise binary kernel: `dst[i] = a[i] op b[i]`; pointers may alias exactly (in place).
pub(crate) type BinaryF32 = unsafe fn(n: usize, dst: *mut f32, a: *const f32, b: *const f32);
/// `n` f32 elementwise unary kernel: `dst[i] = f(a[i])`; pointers may alias exactly (in place).
pub(crate) type UnaryF32 = unsafe fn(n: usize, dst: *mut f32, a: *const f32);
/// f32 dot product of two equal-length slices.
pub(crate) type DotF32 = fn(a: &[f32], b: &[f32]) -> f32;
/// f16 bits to f32, `src.len() == dst.len()`.
pub(crate) type F16ToF32 = fn(src: &[u16], dst: &mut [f32]);
/// In-place `x = exp(x - max)` over `n` values, returning the f64 sum (softmax's inner loop).
pub(crate) type ExpSubSum = unsafe fn(n: usize, dst: *mut f32, max: f32) -> f64;
/// (n, d0, d1, x0, x1, cos, sin): see `scalar::rope_rotate_f32`.
pub(crate) type RopeRotateF32 =
    unsafe fn(usize, *mut f32, *mut f32, *const f32, *const f32, *const f32, *const f32);
/// One query's flash-attention inner loop over F16 K and V rows (see [`AttendF16`]).
///
/// # Safety
/// The pointers in `AttendF16` are valid for the rows it names; `acc.len()` is the V row length.
pub(crate) type AttendF16Fn =
    unsafe fn(a: &AttendF16<'_>, m: &mut f32, s: &mut f32, acc: &mut [f32]);

/// The operands of [`AttendF16Fn`]: `n` KV positions whose K row `j` (`q.len()` halves) starts at
/// `k + j * k_stride` bytes and V row `j` (`acc.len()` halves) at `v + j * v_stride`. Scores are
/// `x_j = (q . k_j) * scale`, then `softcap * tanh(x_j)` when `softcap != 0`, plus `mask[j]`
/// (`-inf` skips a position); the online softmax state (max `m`, sum `s`, accumulator `acc`)
/// goes on from the caller's. `q` holds the query rounded to f16 (K's vec-dot type), widened.
pub(crate) struct AttendF16<'a> {
    pub q: &'a [f32],
    pub k: *const u8,
    pub k_stride: usize,
    pub v: *const u8,
    pub v_stride: usize,
    pub n: usize,
    pub mask: Option<&'a [f32]>,
    pub scale: f32,
    pub softcap: f32,
}

/// The width-independent step of the tiers' F16 decode loops ([`AttendF16Fn`]) for one block of
/// scores `sc` (masked positions `-inf`): `false` when the block adds nothing, because every
/// position is masked or a score is NaN (NaN in Q or K; the sum and the accumulator become NaN,
/// as ggml's do); otherwise raises the running max `m` to the block's, rescaling the sum `s` and
/// the accumulator `acc` once, and returns `true`.
#[inline(always)]
pub(crate) fn attend_block_max(sc: &[f32], m: &mut f32, s: &mut f32, acc: &mut [f32]) -> bool {
    if sc.iter().any(|x| x.is_nan()) {
        *s = f32::NAN;
        acc.fill(f32::NAN);
        return false;
    }
    let bmax = sc.iter().fold(f32::NEG_INFINITY, |b, &x| b.max(x));
    if bmax == f32::NEG_INFINITY {
        return false;
    }
    if bmax > *m {
        let ms = (*m - bmax).exp();
        *m = bmax;
        for a in acc.iter_mut() {
            *a *= ms;
        }
        *s *= ms;
    }
    true
}

/// (n, dst, a, scale, add): see `scalar::scale_add_f32`.
pub(crate) type ScaleAddF32 = unsafe fn(usize, *mut f32, *const f32, f32, bool);

/// A register tile of dot products: `out[c * x.len() + r] = vec_dot(k, x[r], y[c])` for
/// `x.len() <= GEMM_MR` weight rows and `y.len() <= GEMM_NR` activation rows in the weight type's
/// vec-dot type. Each output is bitwise what the same tier's `vec_dot` returns for that pair.
pub(crate) type GemmFn = fn(k: usize, x: &[&[u8]], y: &[&[u8]], out: &mut [f32]);
/// Two weight rows against one activation row: each result bitwise what the same tier's
/// `vec_dot_stream` returns for that row. Decode (mul_mat with up to 4 columns) runs a task's
/// rows as two streams, its first half against its second: the rows share the activation's
/// loads, and the two accumulator chains hide the multiply-add latency that bounds a one-row loop
/// of small blocks. Paired in-process A/B (the form switched between computes of one plan,
/// 4096 x 1 x 14336, 2 threads of an Emerald Rapids Xeon, medians of 40 computes, two runs):
/// Q4_0 1.21-1.23x in L3 and 1.18-1.22x from memory, Q8_0 1.16-1.19x and 1.12x; pairs of
/// neighbouring rows instead gained in L3 (1.12x, 1.20x) but not from memory (0.95x, 1.02x).
pub(crate) type VecDot2Fn = fn(n: usize, x: [&[u8]; 2], y: &[u8]) -> [f32; 2];
/// A run of [`VecDot2Fn`] calls in one: `out[t] = dot2(n, [&x[0][t * stride..], &x[1][t *
/// stride..]], y)` for every `t < out.len()`, bitwise (each pair's operations are the two-row
/// form's). Decode of short rows (K = 576: 18 Q8_0 blocks) spent a fifth of its two-row dot's
/// time outside the block loop, in the call, the prologue and the constants; one call per run
/// pays those once. A run whose slices do not hold every row falls back to one call per pair.
pub(crate) type VecDotPairsFn =
    fn(n: usize, x: [&[u8]; 2], stride: usize, y: &[u8], out: &mut [[f32; 2]]);

/// Weight rows per gemm tile.
pub(crate) const GEMM_MR: usize = 4;
/// Activation rows (output columns) per gemm tile.
pub(crate) const GEMM_NR: usize = 2;

const N_TYPES: usize = 43;

/// Function pointers for one ISA tier, filled once per tier. Op drivers read the table of their
/// plan (`NodeCtx::kt`); [`table`] is the default tier's.
pub(crate) struct KernelTable {
    isa: Isa,
    vec_dot: [Option<VecDotFn>; N_TYPES],
    /// Variants of `vec_dot` for weight rows read once from memory (decode): the same results,
    /// with software prefetch where it measured faster; `None` means use `vec_dot`.
    vec_dot_stream: [Option<VecDotFn>; N_TYPES],
    /// Types whose `vec_dot_stream` (and `gemm`) sum in an order of their own instead of
    /// `vec_dot`'s ([`set_vec_dot_stream_own_order`](Self::set_vec_dot_stream_own_order)).
    stream_own_order: [bool; N_TYPES],
    /// Two-row forms of `vec_dot_stream` (bitwise its results), where a tier has one.
    vec_dot2_stream: [Option<VecDot2Fn>; N_TYPES],
    /// Runs of `vec_dot2_stream` calls in one call (bitwise its results), where a tier has them.
    vec_dot_pairs: [Option<VecDotPairsFn>; N_TYPES],
    from_float: [Option<FromFloatFn>; N_TYPES],
    /// Row dequantizers (ggml's `to_float`): the format's, or a tier's with the same floats.
    to_f32: [Option<crate::quant::DequantizeFn>; N_TYPES],
    gemm: [Option<GemmFn>; N_TYPES],
    pub(crate) dot_f32: DotF32,
    pub(crate) add_f32: BinaryF32,
    pub(crate) sub_f32: BinaryF32,
    pub(crate) mul_f32: BinaryF32,
    pub(crate) div_f32: BinaryF32,
    pub(crate) silu_f32: UnaryF32,
    pub(crate) gelu_f32: UnaryF32,
    pub(crate) relu_f32: UnaryF32,
    pub(crate) exp_sub_sum_f32: ExpSubSum,
    pub(crate) f16_to_f32: F16ToF32,
    pub(crate) sum_sq_f64: fn(&[f32]) -> f64,
    pub(crate) f16_bytes_to_f32: fn(&[u8], &mut [f32]),
    pub(crate) mad_f16: fn(&mut [f32], &[u8], f32),
    pub(crate) mad_f32: fn(&mut [f32], &[f32], f32),
    /// Float GEMM micro-kernel (F32/F16/BF16 `mul_mat` with several columns).
    pub(crate) sgemm: sgemm::SgemmFn,
    /// Two strips at once, the same bits as two `sgemm` calls (tiers with 32 vector registers).
    pub(crate) sgemm2: Option<sgemm::Sgemm2Fn>,
    /// Two strips by two panels, the same bits as four `sgemm` calls.
    pub(crate) sgemm22: Option<sgemm::Sgemm22Fn>,
    /// BF16 weights against BF16 activations in pairs of K values (see `kernels::sgemm`), one
    /// strip, two strips and two strips by two panels per call, where the CPU has a BF16
    /// dot-product instruction.
    pub(crate) sgemm_bf16: Option<(sgemm::SgemmFn, sgemm::Sgemm2Fn, sgemm::Sgemm22Fn)>,
    /// BF16 weights against BF16 activations on a tile unit (16 x 16 tiles, steps of 32 K
    /// values; see `sgemm::TileBf16Fn`), with the function that gives the tile state back
    /// when a block ends.
    pub(crate) tile_bf16: Option<(sgemm::TileBf16Fn, fn())>,
    /// Weight strip packer of the float GEMM (a 6-row transpose).
    pub(crate) sgemm_pack: sgemm::PackStripFn,
    pub(crate) sgemm_pack_f16: sgemm::PackStripF16Fn,
    /// Activation rounding through F16 / BF16 for the float GEMM (in place).
    pub(crate) round_f16: fn(&mut [f32]),
    pub(crate) round_bf16: fn(&mut [f32]),
    /// Integer GEMM micro-kernels (weights with an integer form, several columns), where the
    /// tier has kernels faster than its f32 GEMM on dequantized weights: AVX-512 VNNI; on the
    /// AVX2 tier AVX-VNNI, or `vpmaddubsw` for codes up to 127 (`IgemmKernels::max_code`). The
    /// portable twin (`igemm::SCALAR`) ran at a quarter of the portable f32 GEMM's speed, so the
    /// portable tier keeps that GEMM.
    pub(crate) igemm: Option<igemm::IgemmKernels>,
    /// GEMM kernels on CPU_REPACK weights, per type (kernels/repack.rs and the tiers').
    repack: [Option<repack::RepackGemmFn>; N_TYPES],
    // Fused and contiguous elementwise and attention kernels of the op drivers.
    /// dst = silu(x) * g (fused SwiGLU).
    pub(crate) swiglu_f32: BinaryF32,
    /// `swiglu_f32`'s bits with stores that bypass the caches where a tier has them, for
    /// outputs larger than the caches (the op driver decides).
    pub(crate) swiglu_f32_stream: BinaryF32,
    /// Neox pair rotation (rope).
    pub(crate) rope_rotate_f32: RopeRotateF32,
    /// dst = a * scale (+ dst): attention scores.
    pub(crate) scale_add_f32: ScaleAddF32,
    /// Row max (NaN ignored).
    pub(crate) max_f32: fn(&[f32]) -> f32,
    /// flash_attn_ext's per-query loop over F16 K/V (head sizes multiples of 16), where a tier
    /// has one; otherwise the driver's generic loop runs.
    pub(crate) attend_f16: Option<AttendF16Fn>,
    /// Inner loops of the recurrent ops (ssm_scan, rwkv_wkv6/7, gated_linear_attn).
    pub(crate) recurrent: recurrent::RecurrentKernels,
    /// The direct convolutions' register tile and F16 conversions (conv_2d/3d, im2col).
    pub(crate) conv: conv::ConvKernels,
}

impl KernelTable {
    fn build(isa: Isa) -> KernelTable {
        let mut t = KernelTable {
            isa: Isa::Scalar,
            vec_dot: [None; N_TYPES],
            vec_dot_stream: [None; N_TYPES],
            stream_own_order: [false; N_TYPES],
            vec_dot2_stream: [None; N_TYPES],
            vec_dot_pairs: [None; N_TYPES],
            from_float: [None; N_TYPES],
            to_f32: [None; N_TYPES],
            gemm: [None; N_TYPES],
            dot_f32: scalar::dot_f32,
            add_f32: scalar::add_f32,
            sub_f32: scalar::sub_f32,
            mul_f32: scalar::mul_f32,
            div_f32: scalar::div_f32,
            silu_f32: scalar::silu_f32,
            gelu_f32: scalar::gelu_f32,
            relu_f32: scalar::relu_f32,
            exp_sub_sum_f32: scalar::exp_sub_sum_f32,
            f16_to_f32: scalar::f16_to_f32,
            sum_sq_f64: scalar::sum_sq_f64,
            f16_bytes_to_f32: scalar::f16_bytes_to_f32,
            mad_f16: scalar::mad_f16,
            mad_f32: scalar::mad_f32,
            sgemm: sgemm::sgemm_6x16,
            sgemm2: None,
            sgemm22: None,
            sgemm_bf16: None,
            tile_bf16: None,
            sgemm_pack: sgemm::pack_strip,
            sgemm_pack_f16: sgemm::pack_strip_f16,
            round_f16: sgemm::round_f16,
            round_bf16: sgemm::round_bf16,
            igemm: None,
            repack: [None; N_TYPES],
            swiglu_f32: scalar::swiglu_f32,
            swiglu_f32_stream: scalar::swiglu_f32,
            rope_rotate_f32: scalar::rope_rotate_f32,
            scale_add_f32: scalar::scale_add_f32,
            max_f32: scalar::max_f32,
            attend_f16: None,
            recurrent: recurrent::PORTABLE,
            conv: conv::PORTABLE,
        };
        for d in DType::ALL {
            if let Some(f) = repack::scalar_kernel(d) {
                t.set_repack(d, f);
            }
        }
        for d in DType::ALL {
            let f = crate::quant::format(d);
            if let Some(v) = f.vec_dot {
                t.set_vec_dot(d, v);
            }
            if let Some(v) = f.from_float {
                t.set_from_float(d, v);
            }
            t.to_f32[d.ggml_id() as usize] = f.dequantize;
        }
        t.set_gemm(DType::Q4_0, gemm::gemm_q4_0_q8_0);
        t.set_gemm(DType::Q8_0, gemm::gemm_q8_0_q8_0);
        // A tier plugs in only with the token that detection makes for a CPU that runs it.
        #[cfg(target_arch = "x86_64")]
        if let Some(cpu) = x86::Avx2::detect().filter(|_| isa >= Isa::Avx2) {
            x86::plug_avx2(&mut t, cpu);
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(cpu) = x86::Avx512::detect().filter(|_| isa >= Isa::Avx512) {
            x86::avx512::plug(&mut t, cpu);
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(cpu) = x86::Amx::detect().filter(|_| isa >= Isa::Amx) {
            x86::plug_amx(&mut t, cpu);
        }
        t.isa = isa;
        t
    }

    /// The dot-product kernel for weights of type `d` against `d.vec_dot_type()`.
    pub(crate) fn vec_dot(&self, d: DType) -> Option<VecDotFn> {
        self.vec_dot[d.ggml_id() as usize]
    }

    /// The kernel for weight rows streamed once from memory (decode), bitwise the same results
    /// as [`vec_dot`](Self::vec_dot) unless it was set by
    /// [`set_vec_dot_stream_own_order`](Self::set_vec_dot_stream_own_order) (BF16 on the AVX-512
    /// tier of a CPU with AVX512_BF16: there mul_mat takes `vdpbf16ps` for every batch size,
    /// ggml's order on such CPUs, while `vec_dot` keeps ggml's AVX2 order).
    pub(crate) fn vec_dot_stream(&self, d: DType) -> Option<VecDotFn> {
        self.vec_dot_stream[d.ggml_id() as usize].or_else(|| self.vec_dot(d))
    }

    /// The activation converter into vec-dot type `d`.
    pub(crate) fn activation_converter(&self, d: DType) -> Option<FromFloatFn> {
        self.from_float[d.ggml_id() as usize]
    }

    /// The row dequantizer of type `d` (the same floats in every tier).
    pub(crate) fn to_f32(&self, d: DType) -> Option<crate::quant::DequantizeFn> {
        self.to_f32[d.ggml_id() as usize]
    }

    pub(crate) fn set_to_f32(&mut self, d: DType, f: crate::quant::DequantizeFn) {
        self.to_f32[d.ggml_id() as usize] = Some(f);
    }

    /// The register-tile kernel for weights of type `d` against `d.vec_dot_type()`, if any.
    pub(crate) fn gemm(&self, d: DType) -> Option<GemmFn> {
        self.gemm[d.ggml_id() as usize]
    }

    /// The kernel for weights of type `d` stored repacked (CPU_REPACK), if any.
    pub(crate) fn repack(&self, d: DType) -> Option<repack::RepackGemmFn> {
        self.repack[d.ggml_id() as usize]
    }

    pub(crate) fn set_repack(&mut self, d: DType, f: repack::RepackGemmFn) {
        self.repack[d.ggml_id() as usize] = Some(f);
    }

    pub(crate) fn set_gemm(&mut self, d: DType, f: GemmFn) {
        self.gemm[d.ggml_id() as usize] = Some(f);
    }

    pub(crate) fn set_vec_dot(&mut self, d: DType, f: VecDotFn) {
        let i = d.ggml_id() as usize;
        self.vec_dot[i] = Some(f);
        // Without a streaming variant the two-row form belongs to this dot (Q1_0's): a tier that
        // replaces the dot drops it, as `set_vec_dot_stream` does for its own.
        if self.vec_dot_stream[i].is_none() {
            self.vec_dot2_stream[i] = None;
            self.vec_dot_pairs[i] = None;
        }
    }

    pub(crate) fn set_vec_dot_stream(&mut self, d: DType, f: VecDotFn) {
        self.vec_dot_stream[d.ggml_id() as usize] = Some(f);
        self.stream_own_order[d.ggml_id() as usize] = false;
        // A two-row form belongs to the streaming dot it was written with.
        self.vec_dot2_stream[d.ggml_id() as usize] = None;
        self.vec_dot_pairs[d.ggml_id() as usize] = None;
    }

    /// The two-row form of [`vec_dot_stream`](Self::vec_dot_stream) for `d`, if the tier has one.
    pub(crate) fn vec_dot2_stream(&self, d: DType) -> Option<VecDot2Fn> {
        self.vec_dot2_stream[d.ggml_id() as usize]
    }

    /// Sets the two-row form of the streaming dot for `d`: set after it, and bitwise its results.
    pub(crate) fn set_vec_dot2_stream(&mut self, d: DType, f: VecDot2Fn) {
        self.vec_dot2_stream[d.ggml_id() as usize] = Some(f);
        // A run form belongs to the two-row form it was written with.
        self.vec_dot_pairs[d.ggml_id() as usize] = None;
    }

    /// The run form of [`vec_dot2_stream`](Self::vec_dot2_stream) for `d`, if the tier has one.
    pub(crate) fn vec_dot_pairs(&self, d: DType) -> Option<VecDotPairsFn> {
        self.vec_dot_pairs[d.ggml_id() as usize]
    }

    /// Sets the run form of the two-row dot for `d`: set after it, and bitwise its results.
    pub(crate) fn set_vec_dot_pairs(&mut self, d: DType, f: VecDotPairsFn) {
        debug_assert!(self.vec_dot2_stream(d).is_some(), "{d}: a run form without a two-row form");
        self.vec_dot_pairs[d.ggml_id() as usize] = Some(f);
    }

    /// A matmul dot for `d` (decode) that sums in an order of its own, not `vec_dot`'s; the
    /// tier's `gemm` for `d` must then follow the same order (its tiles are compared with it).
    pub(crate) fn set_vec_dot_stream_own_order(&mut self, d: DType, f: VecDotFn) {
        self.vec_dot_stream[d.ggml_id() as usize] = Some(f);
        self.stream_own_order[d.ggml_id() as usize] = true;
        self.vec_dot2_stream[d.ggml_id() as usize] = None;
        self.vec_dot_pairs[d.ggml_id() as usize] = None;
    }

    /// Whether `d`'s streaming dot sums in its own order (see
    /// [`set_vec_dot_stream_own_order`](Self::set_vec_dot_stream_own_order)); the tests read it.
    #[cfg(test)]
    pub(crate) fn stream_own_order(&self, d: DType) -> bool {
        self.stream_own_order[d.ggml_id() as usize]
    }

    pub(crate) fn set_from_float(&mut self, d: DType, f: FromFloatFn) {
        self.from_float[d.ggml_id() as usize] = Some(f);
    }
}

/// Dot product of `n` elements: `x` in `dtype`, `y` in `dtype.vec_dot_type()` (as made by
/// [`crate::quant::quantize_for_dot`]). Uses the fastest kernel this CPU supports (this module's tables).
// Inline: in a caller's loop the table and per-type lookups become loop-invariant and leave the
// loop, and the `Result` stays in registers instead of going through memory.
#[inline]
pub fn vec_dot(dtype: DType, n: usize, x: &[u8], y: &[u8]) -> Result<f32> {
    // Fast path: plain arithmetic checks, no `Result` plumbing, for callers in loops; the error
    // path is out of line, so this one is a few loads and compares around the kernel call.
    if let Some(k) = table().vec_dot(dtype)
        && crate::quant::fits(dtype, n, x.len())
        && crate::quant::fits(dtype.vec_dot_type(), n, y.len())
    {
        return Ok(k(n, x, y));
    }
    vec_dot_error(dtype, n, x, y)
}

/// Why [`vec_dot`] cannot run: no kernel, or lengths that do not fit `n`.
#[cold]
#[inline(never)]
fn vec_dot_error(dtype: DType, n: usize, x: &[u8], y: &[u8]) -> Result<f32> {
    let vd = dtype.vec_dot_type();
    let k = table().vec_dot(dtype);
    if k.is_none() {
        return Err(Error::Quant { dtype, msg: "no dot product for this type".into() });
    }
    crate::quant::rows_of(dtype, n, x.len(), "vec_dot x")?;
    crate::quant::rows_of(vd, n, y.len(), "vec_dot y")?;
    Err(Error::arg(format!("vec_dot {dtype}: lengths do not fit n = {n}")))
}

/// Dot product of `n` elements with the `vec_dot` kernel of tier `isa`, whatever tier is selected:
/// `x` in `dtype`, `y` in `dtype.vec_dot_type()`, checked like [`crate::quant::vec_dot`]. Lets
/// tests and benchmarks compare every tier this CPU has in one process.
///
/// ```
/// use quantgraph::{DType, kernels::{Isa, vec_dot_with}};
/// let x: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
/// assert_eq!(vec_dot_with(Isa::Scalar, DType::F32, 2, &x, &x).unwrap(), 5.0);
/// ```
pub fn vec_dot_with(isa: Isa, dtype: DType, n: usize, x: &[u8], y: &[u8]) -> Result<f32> {
    let t = table_for(isa)
        .ok_or_else(|| Error::arg(format!("ISA {} is not supported by this CPU", isa.name())))?;
    let k = t
        .vec_dot(dtype)
        .ok_or_else(|| Error::Quant { dtype, msg: "no dot product for this type".into() })?;
    for (what, d, bytes) in [("x", dtype, x), ("y", dtype.vec_dot_type(), y)] {
        let need = d.row_size(n)?;
        if need != bytes.len() {
            return Err(Error::arg(format!(
                "vec_dot {what} {d}: {n} elements need {need} bytes, the buffer has {}",
                bytes.len()
            )));
        }
    }
    Ok(k(n, x, y))
}

/// 255 = not chosen yet (read the environment on first use).
static SELECTED: AtomicU8 = AtomicU8::new(u8::MAX);

fn slot(isa: Isa) -> &'static OnceLock<KernelTable> {
    static TABLES: [OnceLock<KernelTable>; Isa::ALL.len()] =
        [OnceLock::new(), OnceLock::new(), OnceLock::new(), OnceLock::new()];
    &TABLES[isa as usize]
}

/// The table for `isa`, or `None` when this CPU cannot run it. Tests use this to compare tiers.
pub(crate) fn table_for(isa: Isa) -> Option<&'static KernelTable> {
    isa.is_supported().then(|| slot(isa).get_or_init(|| KernelTable::build(isa)))
}

fn initial_isa() -> Isa {
    let best = Isa::best();
    match std::env::var("QUANTGRAPH_ISA") {
        Ok(v) => match Isa::from_name(&v) {
            Some(i) if i <= best => i,
            _ => best,
        },
        Err(_) => best,
    }
}

/// The process-wide default tier: the best this CPU has, lowered by `QUANTGRAPH_ISA` or
/// [`set_isa`].
#[inline]
pub fn selected_isa() -> Isa {
    match SELECTED.load(Ordering::Relaxed) {
        0 => Isa::Scalar,
        1 => Isa::Avx2,
        2 => Isa::Avx512,
        3 => Isa::Amx,
        _ => select_initial_isa(),
    }
}

/// First use: reads the environment once (out of line, off the per-call path).
#[cold]
#[inline(never)]
fn select_initial_isa() -> Isa {
    let i = initial_isa();
    SELECTED.store(i as u8, Ordering::Relaxed);
    i
}

/// Sets the process-wide default tier: plans built later on a backend that did not choose a tier
/// (`CpuBackend::with_isa`) run it. Plans keep the table they were built with. To compare tiers
/// in one process, prefer one backend per tier (`CpuBackend::with_isa`), which does not affect
/// other code. Fails when the CPU does not support `isa`.
pub fn set_isa(isa: Isa) -> Result<()> {
    if !isa.is_supported() {
        return Err(Error::arg(format!("ISA {} is not supported by this CPU", isa.name())));
    }
    SELECTED.store(isa as u8, Ordering::Relaxed);
    Ok(())
}

/// The kernel table of the process-wide default tier ([`selected_isa`]).
#[inline]
pub(crate) fn table() -> &'static KernelTable {
    // The selected tier is always supported, so a table already built for it is the answer: one
    // load on the per-call path (vec_dot), the feature check only on first use.
    match slot(selected_isa()).get() {
        Some(t) => t,
        None => build_selected_table(),
    }
}

/// First use of the selected tier's table.
#[cold]
#[inline(never)]
fn build_selected_table() -> &'static KernelTable {
    let isa = selected_isa();
    // The selected tier is always supported: `initial_isa` and `set_isa` only pick supported ones.
    table_for(isa)
        .unwrap_or_else(|| slot(Isa::Scalar).get_or_init(|| KernelTable::build(Isa::Scalar)))
}

/// One tier's `vec_dot` kernel bound to a weight type and a row length, with the lengths checked
/// once at [`VecDotKernel::new`]. [`VecDotKernel::dot`] then costs two length compares around the
/// kernel call, as close to ggml's `type_traits_cpu[t].vec_dot(n, ...)` as a safe call gets; the
/// benchmarks use it to time the kernel itself next to ggml's.
///
/// ```
/// use quantgraph::{DType, kernels::{Isa, VecDotKernel}};
/// let k = VecDotKernel::new(Isa::Scalar, DType::F32, 2).unwrap();
/// let x: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
/// assert_eq!(k.dot(&x, &x).unwrap(), 5.0);
/// assert!(k.dot(&x[..4], &x).is_err());
/// ```
#[derive(Clone, Copy)]
pub struct VecDotKernel {
    kernel: VecDotFn,
    dtype: DType,
    n: usize,
    x_len: usize,
    y_len: usize,
}

impl VecDotKernel {
    /// The `vec_dot` kernel of tier `isa` for `dtype` rows of `n` elements (against
    /// `dtype.vec_dot_type()`). Fails when the CPU lacks the tier, the type has no dot product or
    /// `n` is not a whole number of blocks of both types.
    pub fn new(isa: Isa, dtype: DType, n: usize) -> Result<Self> {
        let t = table_for(isa).ok_or_else(|| {
            Error::arg(format!("ISA {} is not supported by this CPU", isa.name()))
        })?;
        let kernel = t
            .vec_dot(dtype)
            .ok_or_else(|| Error::Quant { dtype, msg: "no dot product for this type".into() })?;
        let (x_len, y_len) = (dtype.row_size(n)?, dtype.vec_dot_type().row_size(n)?);
        Ok(Self { kernel, dtype, n, x_len, y_len })
    }

    /// Dot product of one `x` row (in the bound type) with one `y` row (in its vec-dot type).
    /// Fails when a slice does not hold exactly the bound number of elements.
    #[inline]
    pub fn dot(&self, x: &[u8], y: &[u8]) -> Result<f32> {
        if x.len() == self.x_len && y.len() == self.y_len {
            Ok((self.kernel)(self.n, x, y))
        } else {
            Err(self.length_error(x.len(), y.len()))
        }
    }

    #[cold]
    #[inline(never)]
    fn length_error(&self, x: usize, y: usize) -> Error {
        Error::arg(format!(
            "vec_dot {}: n = {} needs {} + {} bytes, the buffers have {x} + {y}",
            self.dtype, self.n, self.x_len, self.y_len
        ))
    }
}

#[cfg(test)]
mod stream_tests {
    use super::*;

    /// A two-row form goes with the dot it was written against: replacing that dot (the plain
    /// one where the type has no streaming variant, else the streaming one) drops it.
    #[test]
    fn replacing_a_dot_drops_its_two_row_form() {
        let two: VecDot2Fn = |_, _, _| [0.0; 2];
        let one: VecDotFn = |_, _, _| 0.0;
        let mut t = KernelTable::build(Isa::Scalar);
        for d in [DType::Q1_0, DType::Q4_0] {
            t.set_vec_dot(d, one);
            t.set_vec_dot2_stream(d, two);
            assert!(t.vec_dot2_stream(d).is_some());
        }
        t.set_vec_dot_stream(DType::Q4_0, one);
        t.set_vec_dot2_stream(DType::Q4_0, two);
        // Q1_0 has no streaming variant: its two-row form pairs with the plain dot.
        t.set_vec_dot(DType::Q1_0, one);
        assert!(t.vec_dot2_stream(DType::Q1_0).is_none());
        // Q4_0's pairs with its streaming dot, which a new plain dot leaves in place.
        t.set_vec_dot(DType::Q4_0, one);
        assert!(t.vec_dot2_stream(DType::Q4_0).is_some());
        t.set_vec_dot_stream(DType::Q4_0, one);
        assert!(t.vec_dot2_stream(DType::Q4_0).is_none());
    }

    /// Every tier's decode variant (a prefetch ahead of the weight row) gives the plain dot
    /// product's bits, on random blocks of every type that has one.
    #[test]
    fn stream_dots_are_bitwise_the_plain_ones() {
        let mut r = crate::testdata::Xorshift64::from_state(0x9E37_79B9_7F4A_7C15);
        let k = 4 * 256;
        let mut checked = 0;
        for isa in Isa::ALL {
            let Some(t) = table_for(isa) else { continue };
            for d in DType::ALL {
                let Some(stream) = t.vec_dot_stream[d.ggml_id() as usize] else { continue };
                if t.stream_own_order(d) {
                    // Tested by its tier (BF16: `avx512_bf16_dots_follow_ggmls_avx512_bf16_order`).
                    continue;
                }
                let plain = t.vec_dot(d).expect("a stream variant has a plain dot");
                let (Ok(xb), Ok(yb)) = (d.row_size(k), d.vec_dot_type().row_size(k)) else {
                    continue;
                };
                for _ in 0..4 {
                    // Random bytes with the top bit of every other byte cleared, so that most
                    // f16 scales are finite (a few infinite or NaN ones are fine: same steps).
                    let mut bytes = |n: usize| -> Vec<u8> {
                        (0..n)
                            .map(|i| (r.next_u64() as u8) & if i % 2 == 1 { 0x3F } else { 0xFF })
                            .collect()
                    };
                    let (x, y) = (bytes(xb), bytes(yb));
                    let (a, b) = (plain(k, &x, &y), stream(k, &x, &y));
                    assert_eq!(a.to_bits(), b.to_bits(), "{isa:?} {d}: {a} vs {b}");
                }
                checked += 1;
            }
        }
        assert!(checked > 0, "no stream variants on this CPU");
    }
}
