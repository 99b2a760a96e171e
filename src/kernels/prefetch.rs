//! Software prefetch hints for op drivers that stream rows from memory (flash attention's K/V
//! rows, the float GEMM's next weight block). A hint has no effect on results and never faults,
//! whatever the address. These need no run-time feature check, so they are plain functions
//! rather than `KernelTable` entries: the prefetch instructions are part of x86-64's baseline
//! (SSE); on other targets the functions do nothing.

/// Calls `hint` on the first byte of every cache line the `len` bytes at `p` touch: from the
/// line holding the first to the one holding the last (an unaligned start spans one line more
/// than len / 64). The addresses are computed with `wrapping_*`, so any `p` is fine.
#[inline(always)]
fn each_line(p: *const u8, len: usize, mut hint: impl FnMut(*const u8)) {
    let line = p.wrapping_sub(p as usize % 64);
    let end = (p as usize % 64) + len;
    let mut off = 0;
    while off < end {
        hint(line.wrapping_add(off));
        off += 64;
    }
}

/// Asks for the cache lines of the `len` bytes at `p` in L1 (`prefetcht0`).
#[inline(always)]
pub(crate) fn prefetch_l1(p: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    each_line(p, len, |a| {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        // SAFETY: a prefetch reads nothing architecturally and never faults; SSE is part of
        // x86-64's baseline.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(a as *const i8) };
    });
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, len);
}

/// Asks for the cache lines of the `len` bytes at `p` in L2 (`prefetcht1`).
#[inline(always)]
pub(crate) fn prefetch_l2_range(p: *const u8, len: usize) {
    each_line(p, len, prefetch_l2);
}

/// Asks for the cache line at `p` in L2 (`prefetcht1`).
#[inline(always)]
pub(crate) fn prefetch_l2(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing architecturally and never faults; SSE is part of x86-64's
    // baseline.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(p as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
