//! `peak` and `bandwidth`: the machine's f32 FMA and int8 dot-product peaks and its copy
//! bandwidth, the references the GFLOPS and GB/s columns are read against.

use crate::measure::median;
use std::time::Instant;

/// The f32 FMA peak of `threads` threads: 12 independent FMA chains per thread, 16-lane where
/// the CPU has AVX-512 (the width quantgraph's AVX-512 tier uses), else 8-lane (AVX2); median of
/// 5 runs of about 0.1 s. Prefill f32 matmul is compared against this number.
pub fn fma_peak(threads: usize) -> f64 {
    #[cfg(target_arch = "x86_64")]
    fn per_thread(iters: u64) -> u64 {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn chains(iters: u64) -> f32 {
            use std::arch::x86_64::*;
            let mut acc = [_mm256_set1_ps(0.5); 12];
            let (m, a) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
            for _ in 0..iters {
                for v in acc.iter_mut() {
                    *v = _mm256_fmadd_ps(*v, m, a);
                }
            }
            let mut s = [0f32; 8];
            let mut t = acc[0];
            for v in &acc[1..] {
                t = _mm256_add_ps(t, *v);
            }
            // SAFETY: `s` holds 8 f32.
            unsafe { _mm256_storeu_ps(s.as_mut_ptr(), t) };
            s.iter().sum()
        }
        #[target_feature(enable = "avx512f")]
        unsafe fn chains16(iters: u64) -> f32 {
            use std::arch::x86_64::*;
            let mut acc = [_mm512_set1_ps(0.5); 12];
            let (m, a) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
            for _ in 0..iters {
                for v in acc.iter_mut() {
                    *v = _mm512_fmadd_ps(*v, m, a);
                }
            }
            let mut t = acc[0];
            for v in &acc[1..] {
                t = _mm512_add_ps(t, *v);
            }
            _mm512_reduce_add_ps(t)
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: AVX-512 F detected just above.
            let v = unsafe { chains16(iters) };
            std::hint::black_box(v);
            iters * 12 * 16 * 2
        } else if std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: AVX2/FMA detected just above.
            let v = unsafe { chains(iters) };
            std::hint::black_box(v);
            iters * 12 * 8 * 2
        } else {
            0
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    fn per_thread(_iters: u64) -> u64 {
        0
    }
    per_second_on_threads(threads, per_thread)
}

/// Median over 5 runs of `threads` threads each calling `work(5_000_000)`: the operations they
/// report, in billions per second.
fn per_second_on_threads(threads: usize, work: fn(u64) -> u64) -> f64 {
    let iters = 5_000_000u64;
    let mut runs = Vec::new();
    for _ in 0..5 {
        let t0 = Instant::now();
        let ops: u64 = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads.max(1)).map(|_| s.spawn(move || work(iters))).collect();
            hs.into_iter().map(|h| h.join().unwrap_or(0)).sum()
        });
        runs.push(ops as f64 / t0.elapsed().as_secs_f64() / 1e9);
    }
    median(runs)
}

/// The int8 dot-product peak of `threads` threads where the CPU has AVX-512 VNNI: 12 independent
/// `vpdpbusd` chains per thread, each instruction 64 multiply-adds (128 operations, counted as
/// GFLOPS are); median of 5 runs. Quantized prefill (the integer GEMM) is compared against it.
pub fn int8_peak(threads: usize) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    fn per_thread(iters: u64) -> u64 {
        #[target_feature(enable = "avx512f,avx512vnni")]
        unsafe fn chains(iters: u64) -> i32 {
            use std::arch::x86_64::*;
            let mut acc = [_mm512_set1_epi32(1); 12];
            let (u, s) = (_mm512_set1_epi8(3), _mm512_set1_epi8(-2));
            for _ in 0..iters {
                for v in acc.iter_mut() {
                    *v = _mm512_dpbusd_epi32(*v, u, s);
                }
            }
            let mut t = acc[0];
            for v in &acc[1..] {
                t = _mm512_add_epi32(t, *v);
            }
            _mm512_reduce_add_epi32(t)
        }
        // SAFETY: int8_peak runs this only where AVX-512 F and VNNI were detected.
        let v = unsafe { chains(iters) };
        std::hint::black_box(v);
        iters * 12 * 64 * 2
    }
    #[cfg(not(target_arch = "x86_64"))]
    fn per_thread(_iters: u64) -> u64 {
        0
    }
    #[cfg(target_arch = "x86_64")]
    if !(std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512vnni"))
    {
        return None;
    }
    #[cfg(not(target_arch = "x86_64"))]
    return None;
    Some(per_second_on_threads(threads, per_thread))
}

/// The int8 dot-product peak of `threads` threads with AVX2 only (no VNNI): 12 independent
/// chains per thread of `vpmaddubsw` (32 byte multiply-adds, counted as 64 operations) and the
/// `vpaddw` that sums its pairs in int16, the least an AVX2 integer GEMM spends on them (the
/// kernels widen to int32 with `vpmaddwd` once per several such steps where the codes allow, once
/// per step where they do not); median of 5 runs. Quantized prefill is compared against it on
/// CPUs without VNNI.
pub fn int8_maddubs_peak(threads: usize) -> Option<f64> {
    maddubs_chains::<false>(threads)
}

/// The int8 dot-product peak of `threads` threads with AVX2 only for 8-bit weight codes: as
/// [`int8_maddubs_peak`], but each `vpmaddubsw` widened at once by a `vpmaddwd` and summed by a
/// `vpaddd`, the least an AVX2 kernel spends on weights of up to 8 bits against int8 levels (two
/// of their products fill int16, so no two steps share a widening). Where both multiplies issue
/// on the same ports it is half of [`int8_maddubs_peak`]; the signed forms (Q8_0 and the IQ
/// types on CPUs without VNNI) are bound by it.
pub fn int8_maddubs_wide_peak(threads: usize) -> Option<f64> {
    maddubs_chains::<true>(threads)
}

/// 12 chains per thread of `vpmaddubsw` plus `vpaddw` (`WIDE = false`) or plus `vpmaddwd` and
/// `vpaddd` (`WIDE = true`); `None` without AVX2.
fn maddubs_chains<const WIDE: bool>(threads: usize) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    fn per_thread<const WIDE: bool>(iters: u64) -> u64 {
        #[target_feature(enable = "avx2")]
        unsafe fn chains<const WIDE: bool>(iters: u64) -> i32 {
            use std::arch::x86_64::*;
            let mut acc = [_mm256_set1_epi32(1); 12];
            let u = _mm256_set1_epi8(3);
            let ones = _mm256_set1_epi16(1);
            for _ in 0..iters {
                for v in acc.iter_mut() {
                    // The chain's own bytes as the signed operand, so nothing is loop-invariant
                    // (12 chains cover the instructions' latency).
                    let p = _mm256_maddubs_epi16(u, *v);
                    *v = if WIDE {
                        _mm256_add_epi32(*v, _mm256_madd_epi16(p, ones))
                    } else {
                        _mm256_add_epi16(*v, p)
                    };
                }
            }
            let mut t = acc[0];
            for v in &acc[1..] {
                t = _mm256_add_epi16(t, *v);
            }
            _mm256_extract_epi32::<0>(t)
        }
        // SAFETY: maddubs_chains runs this only where AVX2 was detected.
        let v = unsafe { chains::<WIDE>(iters) };
        std::hint::black_box(v);
        iters * 12 * 32 * 2
    }
    #[cfg(not(target_arch = "x86_64"))]
    fn per_thread<const WIDE: bool>(_iters: u64) -> u64 {
        0
    }
    #[cfg(target_arch = "x86_64")]
    if !std::arch::is_x86_feature_detected!("avx2") {
        return None;
    }
    #[cfg(not(target_arch = "x86_64"))]
    return None;
    Some(per_second_on_threads(threads, per_thread::<WIDE>))
}

/// The peak that bounds prefill of `ty` weights, as `(name, value)`: the int8 dot-product peak
/// ([`int8_peak`], or [`int8_maddubs_peak`] without VNNI) for weights whose activations are int8
/// (every quantized type), the BF16 tile peak for BF16 where the AMX tier runs, else the f32 FMA
/// peak; `None` where the CPU lacks the instructions of either int8 peak.
pub fn bounding_peak(ty: quantgraph::DType, threads: usize) -> Option<(&'static str, f64)> {
    use quantgraph::DType;
    if ty.is_quantized() {
        return int8_peak(threads)
            .map(|g| ("int8", g))
            .or_else(|| int8_maddubs_peak(threads).map(|g| ("int8_maddubs", g)));
    }
    if ty == DType::BF16
        && let Some(g) = amx_bf16_peak(threads)
    {
        return Some(("amx_bf16", g));
    }
    Some(("fma", fma_peak(threads)))
}

/// The int8 tile peak of `threads` threads where the crate runs its AMX tier (AMX-INT8 with
/// the tile data permitted): 4 independent `tdpbusd` chains per thread on full 16 x 16 x 64
/// tiles, each instruction 16384 multiply-adds; median of 5 runs. The AMX tier's quantized
/// prefill rows are compared against it as well as against [`int8_peak`].
pub fn amx_peak(threads: usize) -> Option<f64> {
    if !quantgraph::kernels::Isa::Amx.is_supported() {
        return None;
    }
    Some(per_second_on_threads(threads, tile_chains::<false>))
}

/// The BF16 tile peak (GFLOPS) where the AMX tier runs and the CPU has AMX-BF16: 4 independent
/// `tdpbf16ps` chains per thread on full 16 x 16 x 32 tiles, each instruction 8192
/// multiply-adds; median of 5 runs. The AMX tier's BF16 prefill is compared against it.
pub fn amx_bf16_peak(threads: usize) -> Option<f64> {
    if !(quantgraph::kernels::CpuFeatures::detect().amx_bf16
        && quantgraph::kernels::Isa::Amx.is_supported())
    {
        return None;
    }
    Some(per_second_on_threads(threads, tile_chains::<true>))
}

/// Runs 4 chains of tile products (`tdpbf16ps` with `BF16`, else `tdpbusd`) for about `iters`
/// products per chain; returns the operations done (two per multiply-add).
fn tile_chains<const BF16: bool>(iters: u64) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::asm;
        #[repr(C, align(64))]
        struct Config([u8; 64]);
        #[repr(C, align(64))]
        struct Rows([u8; 1024]);
        // Palette 1, tiles 0..7 all 16 rows of 64 bytes.
        let mut c = [0u8; 64];
        c[0] = 1;
        for t in 0..8 {
            c[16 + 2 * t] = 64;
            c[48 + t] = 16;
        }
        let cfg = Config(c);
        // Int8: small codes and levels; BF16: every value 0x3F3F (about 0.75), a normal number.
        let (a, b) = if BF16 {
            (Rows([0x3F; 1024]), Rows([0x3F; 1024]))
        } else {
            (Rows([3; 1024]), Rows([0xFE; 1024]))
        };
        let mut out = Rows([0; 1024]);
        let n = (iters / 16).max(1);
        macro_rules! chains {
            ($op:literal) => {
                // SAFETY: callers run this only where the crate's AMX tier is supported (and,
                // for `tdpbf16ps`, AMX-BF16) with the tile data permitted for this process; the
                // configuration is a valid palette 1 one; the loads read 16 rows of 64 bytes
                // inside `a` and `b` and the store writes 16 rows of 64 bytes inside `out`; the
                // tile state is released before returning.
                unsafe {
                    asm!(
                        "ldtilecfg [{cfg}]",
                        "tileloadd tmm4, [{a} + {s}]",
                        "tileloadd tmm5, [{b} + {s}]",
                        "tilezero tmm0",
                        "tilezero tmm1",
                        "tilezero tmm2",
                        "tilezero tmm3",
                        "2:",
                        concat!($op, " tmm0, tmm4, tmm5"),
                        concat!($op, " tmm1, tmm4, tmm5"),
                        concat!($op, " tmm2, tmm4, tmm5"),
                        concat!($op, " tmm3, tmm4, tmm5"),
                        "dec {n}",
                        "jnz 2b",
                        "tilestored [{o} + {s}], tmm0",
                        "tilerelease",
                        cfg = in(reg) cfg.0.as_ptr(),
                        a = in(reg) a.0.as_ptr(),
                        b = in(reg) b.0.as_ptr(),
                        o = in(reg) out.0.as_mut_ptr(),
                        s = in(reg) 64usize,
                        n = inout(reg) n => _,
                        options(nostack),
                    );
                }
            };
        }
        if BF16 {
            chains!("tdpbf16ps");
        } else {
            chains!("tdpbusd");
        }
        std::hint::black_box(&out);
        // Multiply-adds per instruction: 16 x 16 x 64 int8, 16 x 16 x 32 BF16.
        n * 4 * 16 * 16 * if BF16 { 32 } else { 64 } * 2
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = iters;
        0
    }
}

/// Measures memory bandwidth (GB/s) with a multi-threaded copy of 256 MiB, the same run's
/// reference for the GB/s columns.
pub fn bandwidth(threads: usize) -> f64 {
    let n = 32 << 20; // f64 elements: 256 MiB per side
    let src = vec![1.0f64; n];
    let mut dst = vec![0.0f64; n];
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("pool");
    let mut times = Vec::new();
    for _ in 0..5 {
        let t0 = Instant::now();
        pool.install(|| {
            use rayon::prelude::*;
            dst.par_chunks_mut(1 << 16)
                .zip(src.par_chunks(1 << 16))
                .for_each(|(d, s)| d.copy_from_slice(s));
        });
        times.push(t0.elapsed().as_secs_f64());
    }
    std::hint::black_box(&dst);
    2.0 * (n * 8) as f64 / median(times) / 1e9
}

/// Measures read bandwidth (GB/s): every thread sums its share of a 1 GiB buffer, larger than
/// the last-level caches of the machines this runs on, reading four streams at once with a
/// software prefetch ahead of each (the best of the forms tried); the reference for
/// `decode-stream`.
pub fn read_bandwidth(threads: usize) -> f64 {
    let n = 128 << 20; // u64 elements: 1 GiB
    let src: Vec<u64> = (0..n as u64).collect();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("pool");
    // Four streams per 2 MiB chunk, each prefetched 8 KiB (1024 elements) ahead: on Emerald
    // Rapids (2 threads, 3 rounds) 21-27 GB/s, where one stream without prefetch read 12-13 and
    // four with prefetches 512 B ahead 17-23.
    const STREAMS: usize = 4;
    const AHEAD: usize = 1024;
    let mut times = Vec::new();
    for _ in 0..5 {
        let t0 = Instant::now();
        let s = pool.install(|| {
            use rayon::prelude::*;
            src.par_chunks(1 << 18)
                .map(|c| {
                    let len = c.len() / STREAMS;
                    let mut acc = [0u64; 8];
                    for i in (0..len.saturating_sub(7)).step_by(8) {
                        for st in 0..STREAMS {
                            let at = st * len + i;
                            prefetch(c.as_ptr().wrapping_add(at + AHEAD));
                            // Eight lanes so the sums vectorize; wrapping: only the reads matter.
                            for (a, x) in acc.iter_mut().zip(&c[at..at + 8]) {
                                *a = a.wrapping_add(*x);
                            }
                        }
                    }
                    acc.iter().fold(0u64, |s, a| s.wrapping_add(*a))
                })
                .reduce(|| 0, u64::wrapping_add)
        });
        std::hint::black_box(s);
        times.push(t0.elapsed().as_secs_f64());
    }
    (n * 8) as f64 / median(times) / 1e9
}

/// A hint to bring the line at `p` into L1 (no-op off x86-64).
#[inline(always)]
fn prefetch(p: *const u64) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing architecturally and never faults, whatever the address
    // (`p` may point past the buffer); SSE is part of x86-64's baseline.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
