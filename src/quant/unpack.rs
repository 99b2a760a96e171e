//! Weights as unsigned 8-bit codes with sub-block scales: the form the integer GEMM multiplies
//! against int8 activations. Two families:
//!
//! - **Super-blocks** (K-quants, IQ and ternary formats; Q8_K activations): integer sub-block
//!   scales and mins, two float scales per 256 elements ([`Unpack::Super`], below).
//! - **Blocks** (legacy, IQ4_NL, MXFP4, NVFP4, Q1_0, Q2_0; Q8_0 / Q8_1 activations): a float scale
//!   per 16 or 32 elements, and a float min per block for Q4_1 / Q5_1 ([`Unpack::Blocks`]):
//!   `w[i] = scales[i / sub] * (codes[i] - bias) + mins[i / sub]`.
//!
//! Element `i` of a 256-element super-block is, for the values one super-block `unpack` returns,
//!
//! ```text
//! w[i] = d * scales[i / sub] * (codes[i] - bias) - dmin * mins[i / sub]
//! ```
//!
//! which is the value the type's dequantizer gives (up to the order of the f32 roundings). With
//! Q8_K activations `a` (scale `da`, sums of every 16 levels `bsums`) the dot product of one
//! super-block is then exact integer arithmetic before two float scalings:
//! `da * (d * sum_j scales[j] * (sum_i codes[i] a[i] - bias * bsum_j) - dmin * sum_j mins[j] * bsum_j)`.
//! Every code is at most 255 and `|scales| * max(codes)` stays below 2^15, so the int32 sums cannot
//! overflow for any block (the bound is tested per type).

use crate::dtype::{DType, QK_K};
use crate::quant::util::fp16_to_fp32;

mod blocks;
pub(crate) use blocks::FP4_CODES;

/// Unpacks one super-block (`block` is exactly the type's block size) into 256 codes and
/// `256 / sub` scales and mins (the rest of the arrays is left as it was); returns `(d, dmin)`.
pub(crate) type UnpackFn = fn(
    block: &[u8],
    codes: &mut [u8; QK_K],
    scales: &mut [i32; 16],
    mins: &mut [i32; 16],
) -> (f32, f32);

/// Unpacks one block of a Q8_0-family type (`block` is exactly the type's block size) into its
/// codes (`codes.len()` is the block's element count) and one float scale (and min) per `sub`
/// elements (`scales.len()`, `mins.len()`: elements / sub; mins untouched without them).
pub(crate) type BlockUnpackFn =
    fn(block: &[u8], codes: &mut [u8], scales: &mut [f32], mins: &mut [f32]);

/// The two families of integer forms (module notes).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Unpack {
    /// One 256-element super-block per call, integer scales.
    Super(UnpackFn),
    /// One block of `elems` elements (32, 64 or 128) per call, float scales.
    Blocks { elems: usize, f: BlockUnpackFn },
}

/// How one weight type maps onto the integer form.
#[derive(Clone, Copy, Debug)]
pub(crate) struct IntFormat {
    /// Elements per scale: 16 or 32.
    pub sub: usize,
    /// Constant subtracted from every code (signed levels made unsigned); 0 for types with mins.
    pub bias: i32,
    /// Whether the type has per-sub-block mins (`dmin * mins[j]`, or the float `mins[j]`).
    pub has_min: bool,
    /// The largest code the type's unpacker writes (kernels that multiply codes only up to 127
    /// exactly leave larger ones to the f32 GEMM).
    pub max_code: u8,
    /// The activation type the products take (the weight type's vec-dot type): Q8_K for
    /// super-blocks, Q8_0 or Q8_1 for blocks.
    pub act: DType,
    pub unpack: Unpack,
    /// The unpacker folds every sub-block scale into the codes and writes scales of 1 (Q2_K:
    /// 2-bit codes times 4-bit scales fit a byte), so a kernel may sum a whole step's products
    /// before any scaling; the integers are the same either way.
    pub unit_scales: bool,
    /// Every sub-block's bias-corrected sum `sum_i (codes[i] - bias) * a[i]` fits 16 bits for
    /// any weight bytes and any int8 levels (Q3_K: `|code - 4| <= 4`, IQ1_M: `|code - 128| <= 9`,
    /// times 16 levels of magnitude at most 128), so a kernel may scale two sub-blocks' sums
    /// with one 16-bit pair product (`vpdpwssd`); the integers are the same. The panels then
    /// take their level sums from the levels themselves (`igemm::pack_q8k_column`), which
    /// keeps the bound for Q8_K rows given with other `bsums`.
    pub narrow_sums: bool,
    /// The form a folding tier runs ([`IntFormat::for_tier`]): the kernels read the folded
    /// weights, and the format's kind is an integer one (`igemm::Kind::of`). The panels then
    /// take their level sums from the levels, as for `narrow_sums` (the folded products have
    /// no `bsums` to disagree with, the one-panel kernels do).
    pub fold: bool,
    /// The unpacker writes one scale (and min) per 32 elements, which the integer GEMM repeats
    /// per 16 after unpacking (the folded form of a format with sub-blocks of 32, whose `sub`
    /// is then 16).
    pub widen: bool,
    /// Every code the unpacker writes lies within this distance of `bias` for any weight bytes
    /// (the IQ1-IQ3 grids: their codes are 128 plus a signed grid value), where such a bound is
    /// known and smaller than the bias; see [`IntFormat::recentred`].
    pub radius: Option<u8>,
    /// Subtracted (wrapping) from every code after unpacking: the recentred form's shift
    /// ([`IntFormat::recentred`]); 0 in every other form.
    pub shift: u8,
    /// The smallest code the unpacker writes for any weight bytes (IQ4_NL / IQ4_XS: 1, their
    /// levels `kvalues_iq4nl` are at least -127; the IQ1-IQ3 grids: `bias - radius`; 0 for the
    /// others), see [`IntFormat::signed`].
    pub min_code: u8,
    /// The signed form a tier runs, if any ([`IntFormat::signed`]); `None` in every other form.
    pub sign: Option<Sign>,
    /// The integer-scaled form ([`IntFormat::int_scaled`]).
    pub int_scaled: bool,
    /// In the integer-scaled form of a format with a code bias, that bias, which the unpacker
    /// turns into mins `mins_bias * scales[j]` with `dmin = d`; 0 in every other form.
    pub mins_bias: i32,
}

/// How a signed form multiplies the signed weights `w = code - 128` by the levels `a` with an
/// unsigned x signed byte product (`vpmaddubsw`): the sign of one operand moves onto the other,
/// `w * a = |a| * (sign(a) * w) = |w| * (sign(w) * a)`. Moving a sign negates a byte, which is
/// exact for every byte but -128: each way needs that value absent from the operand it negates.
/// Either way a pair of products is at most `2 * 128 * 127 = 32512` in size, inside int16.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sign {
    /// `|a| * (sign(a) * w)`: the weights are never -128 (`IntFormat::min_code` at least 1);
    /// any levels.
    OnWeights,
    /// `|w| * (sign(w) * a)`: the levels are never -128 (activations this crate quantized from
    /// f32, whose levels lie in -127..=127 for finite inputs); any weights.
    OnLevels,
}

impl IntFormat {
    /// A super-block form (Q8_K activations).
    pub(crate) fn superblock(
        sub: usize,
        bias: i32,
        has_min: bool,
        max_code: u8,
        f: UnpackFn,
    ) -> IntFormat {
        IntFormat {
            sub,
            bias,
            has_min,
            max_code,
            act: DType::Q8_K,
            unpack: Unpack::Super(f),
            unit_scales: false,
            narrow_sums: false,
            fold: false,
            widen: false,
            radius: None,
            shift: 0,
            min_code: 0,
            sign: None,
            int_scaled: false,
            mins_bias: 0,
        }
    }

    /// The form a tier runs: where it folds scales into its weights (`folding`: the integer
    /// kernels' `fold_scales`), every super-block format as sub-blocks of 16 with integer scaled
    /// sums (`fold`; a format with sub-blocks of 32 has its scales repeated, `widen`); else the
    /// format as it is. Every super-block format's `(codes[i] - bias) * scales[i / sub]` lies
    /// within 2^14 in magnitude for any weight bytes (tested), the bound of the folded weights'
    /// two bytes; the block formats' float scales do not fold.
    pub(crate) fn for_tier(self, folding: bool) -> IntFormat {
        if !folding || self.float_scales() {
            return self;
        }
        IntFormat { fold: true, widen: self.sub == 32, sub: 16, ..self }
    }

    /// The form whose codes are centred on `radius` instead of `bias`: every code shifted down
    /// by `bias - radius` after unpacking (`shift`), the bias `radius`, the largest code
    /// `2 * radius`. The products `(code - bias) * level` and so every sum are the same
    /// integers; tiers whose kernels take only codes up to 127 (`vpmaddubsw`) run the IQ1-IQ3
    /// grids in this form. `None` where the format has no such bound.
    pub(crate) fn recentred(self) -> Option<IntFormat> {
        let r = self.radius?;
        (self.shift == 0 && (r as i32) < self.bias).then(|| IntFormat {
            bias: r as i32,
            max_code: 2 * r,
            min_code: self.min_code.saturating_sub((self.bias - r as i32) as u8),
            shift: (self.bias - r as i32) as u8,
            ..self
        })
    }

    /// The signed form ([`Sign`]) of a format whose codes are signed bytes plus 128 and that has
    /// no mins (Q8_0, IQ4_NL, IQ4_XS): the same codes, scales and integer sums, for kernels that
    /// multiply codes only up to 127 as unsigned bytes (`vpmaddubsw`) and take signed weights
    /// instead. `own_levels`: the activation levels come from this crate's f32 quantizers (never
    /// -128 for finite inputs), not from rows given already quantized. `None` where neither
    /// way holds.
    pub(crate) fn signed(self, own_levels: bool) -> Option<IntFormat> {
        if self.bias != 128 || self.has_min || self.shift != 0 || self.sign.is_some() {
            return None;
        }
        let sign = if self.min_code >= 1 {
            Sign::OnWeights
        } else if own_levels {
            Sign::OnLevels
        } else {
            return None;
        };
        Some(IntFormat { sign: Some(sign), ..self })
    }

    /// The integer-scaled form of a super-block format whose sums are scaled per sub-block
    /// (`igemm::Kind::Flt*`: Q4_K, Q5_K, Q6_K, the IQ1-IQ3 grids, TQ1_0, TQ2_0; and the narrow
    /// formats' `Kind::Int16`, Q3_K and IQ1_M, on tiers whose integer kind does not fold): the
    /// same codes and scales in sub-blocks of 16 (those of 32 repeated, `widen`) and the
    /// integer kind with mins (`Kind::Int16Min`, `int_scaled`), whose sub-block sums are scaled
    /// in int32 (in their 16-bit widening, on the tiers that ask for this form) and summed per
    /// super-block. A format with a code bias has it carried as mins: no bias, mins
    /// `bias * scales[j]` with `dmin = d` (the unpacker writes them, `mins_bias`), so that
    /// `d * scales[j] * (codes[i] - bias) = d * scales[j] * codes[i] - dmin * mins[j]` and the
    /// bias comes off once per super-block. The sums stay exact: `|scales| * 255 < 2^15` for
    /// every super-block format (tested), so a super-block's scaled sum is below
    /// `256 * 2^15 * 128 = 2^30` and the mins (a bias is at most the largest code; the formats'
    /// own mins are at most 8 bits) fit 16 bits. For the tiers whose kernels ask for it
    /// (`IgemmKernels::int_scaled`); `None` for the other formats.
    pub(crate) fn int_scaled(self) -> Option<IntFormat> {
        let flt = !self.unit_scales;
        let plain = !self.fold && !self.widen && self.sign.is_none() && !self.int_scaled;
        // Without mins the bias becomes them, so there must be one (else the mins the kernel
        // reads would be whatever the unpacker left there).
        let bias_ok = if self.has_min {
            self.bias == 0
        } else {
            self.bias > 0 && self.bias <= self.max_code as i32
        };
        (!self.float_scales() && flt && plain && bias_ok).then_some(IntFormat {
            bias: 0,
            has_min: true,
            mins_bias: if self.has_min { 0 } else { self.bias },
            int_scaled: true,
            sub: 16,
            widen: self.sub == 32,
            ..self
        })
    }

    /// Whether the scales are floats (the block family).
    pub(crate) fn float_scales(&self) -> bool {
        matches!(self.unpack, Unpack::Blocks { .. })
    }
}

/// The integer form of `d`: every type whose vec-dot type is Q8_K, Q8_0 or Q8_1 and has one.
pub(crate) fn int_format(d: DType) -> Option<IntFormat> {
    let f = |sub, bias, has_min, max, unpack| {
        Some(IntFormat::superblock(sub, bias, has_min, max, unpack))
    };
    match d {
        DType::Q2_K => Some(IntFormat {
            unit_scales: true,
            ..IntFormat::superblock(16, 0, true, 45, unpack_q2_K as UnpackFn)
        }),
        DType::Q3_K => Some(IntFormat {
            narrow_sums: true,
            ..IntFormat::superblock(16, 4, false, 7, unpack_q3_K as UnpackFn)
        }),
        DType::Q4_K => f(32, 0, true, 15, unpack_q4_K),
        DType::Q5_K => f(32, 0, true, 31, unpack_q5_K),
        DType::Q6_K => f(16, 32, false, 63, unpack_q6_K),
        DType::IQ4_XS => Some(IntFormat {
            min_code: 1,
            ..IntFormat::superblock(32, 128, false, 255, unpack_iq4_xs as UnpackFn)
        }),
        DType::TQ1_0 => f(32, 1, false, 2, unpack_tq1_0),
        DType::TQ2_0 => f(32, 1, false, 3, unpack_tq2_0),
        DType::Q4_0
        | DType::Q4_1
        | DType::Q5_0
        | DType::Q5_1
        | DType::Q8_0
        | DType::IQ4_NL
        | DType::MXFP4
        | DType::NVFP4
        | DType::Q1_0
        | DType::Q2_0 => blocks::int_format(d),
        _ => crate::quant::iq::unpack::int_format(d),
    }
}

fn block<T: bytemuck::AnyBitPattern>(b: &[u8]) -> T {
    bytemuck::pod_read_unaligned(b)
}

#[allow(non_snake_case)]
#[inline(always)]
pub(crate) fn unpack_q2_K(
    b: &[u8],
    codes: &mut [u8; QK_K],
    scales: &mut [i32; 16],
    mins: &mut [i32; 16],
) -> (f32, f32) {
    let x: crate::quant::kquants::BlockQ2K = block(b);
    for (j, &sc) in x.scales.iter().enumerate() {
        scales[j] = 1;
        mins[j] = (sc >> 4) as i32;
    }
    // Element l + 32*k of each 128 sits in bits 2k..2k+2 of byte l of its 32; each code is
    // multiplied by its 16-element sub-block's 4-bit scale (at most 3 * 15 = 45, `unit_scales`).
    for (n, out) in codes.chunks_exact_mut(128).enumerate() {
        let q = &x.qs[32 * n..32 * n + 32];
        for (k, o) in out.chunks_exact_mut(32).enumerate() {
            for (h, o) in o.chunks_exact_mut(16).enumerate() {
                let sc = x.scales[8 * n + 2 * k + h] & 0xF;
                for (o, &v) in o.iter_mut().zip(&q[16 * h..]) {
                    *o = ((v >> (2 * k)) & 3) * sc;
                }
            }
        }
    }
    (fp16_to_fp32(x.d), fp16_to_fp32(x.dmin))
}

#[allow(non_snake_case)]
#[inline(always)]
pub(crate) fn unpack_q3_K(
    b: &[u8],
    codes: &mut [u8; QK_K],
    scales: &mut [i32; 16],
    _: &mut [i32; 16],
) -> (f32, f32) {
    let x: crate::quant::kquants::BlockQ3K = block(b);
    for (s, v) in scales.iter_mut().zip(crate::quant::kquants::q3_k_scales(&x.scales)) {
        *s = v as i32 - 32;
    }
    // Low 2 bits as in Q2_K; the high bit (set means "no -4") adds 4 to the biased code.
    for (n, out) in codes.chunks_exact_mut(128).enumerate() {
        let q = &x.qs[32 * n..32 * n + 32];
        for (k, o) in out.chunks_exact_mut(32).enumerate() {
            let bit = 1u8 << (4 * n + k);
            for ((o, &v), &h) in o.iter_mut().zip(q).zip(&x.hmask) {
                *o = ((v >> (2 * k)) & 3) | if h & bit != 0 { 4 } else { 0 };
            }
        }
    }
    (fp16_to_fp32(x.d), 0.0)
}

/// Q4_K / Q5_K scales and mins: 8 six-bit pairs.
fn k4_scales(packed: &[u8; 12], scales: &mut [i32; 16], mins: &mut [i32; 16]) {
    for j in 0..8 {
        let (s, m) = crate::quant::kquants::helpers::get_scale_min_k4(j, packed);
        scales[j] = s as i32;
        mins[j] = m as i32;
    }
}

#[allow(non_snake_case)]
#[inline(always)]
pub(crate) fn unpack_q4_K(
    b: &[u8],
    codes: &mut [u8; QK_K],
    scales: &mut [i32; 16],
    mins: &mut [i32; 16],
) -> (f32, f32) {
    let x: crate::quant::kquants::BlockQ4K = block(b);
    k4_scales(&x.scales, scales, mins);
    for (q, out) in x.qs.chunks_exact(32).zip(codes.chunks_exact_mut(64)) {
        let (lo, hi) = out.split_at_mut(32);
        for ((l, h), &v) in lo.iter_mut().zip(hi.iter_mut()).zip(q) {
            *l = v & 0xF;
            *h = v >> 4;
        }
    }
    (fp16_to_fp32(x.d), fp16_to_fp32(x.dmin))
}

#[allow(non_snake_case)]
#[inline(always)]
pub(crate) fn unpack_q5_K(
    b: &[u8],
    codes: &mut [u8; QK_K],
    scales: &mut [i32; 16],
    mins: &mut [i32; 16],
) -> (f32, f32) {
    let x: crate::quant::kquants::BlockQ5K = block(b);
    k4_scales(&x.scales, scales, mins);
    for (j, (q, out)) in x.qs.chunks_exact(32).zip(codes.chunks_exact_mut(64)).enumerate() {
        let (lo, hi) = out.split_at_mut(32);
        for (((l, h), &v), &b) in lo.iter_mut().zip(hi.iter_mut()).zip(q).zip(&x.qh) {
            *l = (v & 0xF) | (((b >> (2 * j)) & 1) << 4);
            *h = (v >> 4) | (((b >> (2 * j + 1)) & 1) << 4);
        }
    }
    (fp16_to_fp32(x.d), fp16_to_fp32(x.dmin))
}

#[allow(non_snake_case)]
#[inline(always)]
pub(crate) fn unpack_q6_K(
    b: &[u8],
    codes: &mut [u8; QK_K],
    scales: &mut [i32; 16],
    _: &mut [i32; 16],
) -> (f32, f32) {
    let x: crate::quant::kquants::BlockQ6K = block(b);
    for (s, &v) in scales.iter_mut().zip(&x.scales) {
        *s = v as i32;
    }
    for (k, out) in codes.chunks_exact_mut(128).enumerate() {
        let (ql, qh) = (&x.ql[64 * k..64 * k + 64], &x.qh[32 * k..32 * k + 32]);
        let (o01, o23) = out.split_at_mut(64);
        let (o0, o1) = o01.split_at_mut(32);
        let (o2, o3) = o23.split_at_mut(32);
        for l in 0..32 {
            let h = qh[l];
            o0[l] = (ql[l] & 0xF) | ((h & 3) << 4);
            o1[l] = (ql[l + 32] & 0xF) | (((h >> 2) & 3) << 4);
            o2[l] = (ql[l] >> 4) | (((h >> 4) & 3) << 4);
            o3[l] = (ql[l + 32] >> 4) | (((h >> 6) & 3) << 4);
        }
    }
    (fp16_to_fp32(x.d), 0.0)
}

/// `kvalues_iq4nl` plus 128: the unsigned codes of IQ4_NL and IQ4_XS (bias 128).
pub(crate) const IQ4NL_CODES: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (crate::quant::iq::grids::KVALUES_IQ4NL[i] as i32 + 128) as u8;
        i += 1;
    }
    t
};

/// IQ4_XS's eight 6-bit sub-block scales (4 low bits in `scales_l`, 2 high in `scales_h`) minus
/// 32, into `scales[..8]`.
pub(crate) fn iq4_xs_scales(scales_h: u16, scales_l: &[u8; 4], scales: &mut [i32; 16]) {
    for (ib, s) in scales[..8].iter_mut().enumerate() {
        let ls = ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf) as i32
            | ((((scales_h >> (2 * ib)) & 3) as i32) << 4);
        *s = ls - 32;
    }
}

fn unpack_iq4_xs(
    b: &[u8],
    codes: &mut [u8; QK_K],
    scales: &mut [i32; 16],
    _: &mut [i32; 16],
) -> (f32, f32) {
    let x: crate::quant::iq::iq4::BlockIQ4XS = block(b);
    iq4_xs_scales(x.scales_h, &x.scales_l, scales);
    let lut = IQ4NL_CODES;
    for (out, qs) in codes.chunks_exact_mut(32).zip(x.qs.chunks_exact(16)) {
        let (lo, hi) = out.split_at_mut(16);
        for ((l, h), &q) in lo.iter_mut().zip(hi.iter_mut()).zip(qs) {
            *l = lut[(q & 0xf) as usize];
            *h = lut[(q >> 4) as usize];
        }
    }
    (fp16_to_fp32(x.d), 0.0)
}

/// TQ1_0: trits 0..=2 are the codes (bias 1), one scale of 1. Trit `n` of every byte of a
/// run of bytes fills a run of codes (`ternary::tq1_trit`'s element order), loops the compiler
/// does many bytes at a time (the integer GEMM's TQ1_0 prefill, 4096 x 512 x 14336 on Zen 4, 2
/// threads: 530 GFLOPS with a `tq1_trit` call per element, 700 with these loops in AVX2).
pub(crate) fn unpack_tq1_0(
    b: &[u8],
    codes: &mut [u8; QK_K],
    scales: &mut [i32; 16],
    _: &mut [i32; 16],
) -> (f32, f32) {
    use crate::quant::ternary::trit_of;
    let x: crate::quant::ternary::BlockTq1_0 = block(b);
    let (head, rest) = codes.split_at_mut(160);
    let (mid, tail) = rest.split_at_mut(80);
    for (n, out) in head.chunks_exact_mut(32).enumerate() {
        for (o, &q) in out.iter_mut().zip(&x.qs[..32]) {
            *o = trit_of(q, n);
        }
    }
    for (n, out) in mid.chunks_exact_mut(16).enumerate() {
        for (o, &q) in out.iter_mut().zip(&x.qs[32..]) {
            *o = trit_of(q, n);
        }
    }
    for (n, out) in tail.chunks_exact_mut(4).enumerate() {
        for (o, &q) in out.iter_mut().zip(&x.qh) {
            *o = trit_of(q, n);
        }
    }
    scales[..8].fill(1);
    (fp16_to_fp32(x.d), 0.0)
}

/// TQ2_0: the 2-bit codes (trit + 1), one scale of 1.
fn unpack_tq2_0(
    b: &[u8],
    codes: &mut [u8; QK_K],
    scales: &mut [i32; 16],
    _: &mut [i32; 16],
) -> (f32, f32) {
    let x: crate::quant::ternary::BlockTq2_0 = block(b);
    for (n, out) in codes.chunks_exact_mut(128).enumerate() {
        let q = &x.qs[32 * n..32 * n + 32];
        for (k, o) in out.chunks_exact_mut(32).enumerate() {
            for (o, &v) in o.iter_mut().zip(q) {
                *o = (v >> (2 * k)) & 3;
            }
        }
    }
    scales[..8].fill(1);
    (fp16_to_fp32(x.d), 0.0)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Rebuilds the f32 weights of one row from its integer form.
    pub(crate) fn rebuild(dtype: DType, row: &[u8]) -> Vec<f32> {
        let f = int_format(dtype).expect("integer form");
        let bs = dtype.type_size();
        let mut out = Vec::new();
        let unpack = match f.unpack {
            Unpack::Super(u) => u,
            Unpack::Blocks { elems, f: u } => {
                for b in row.chunks_exact(bs) {
                    let mut codes = vec![0u8; elems];
                    let (mut sc, mut mn) = (vec![0f32; elems / f.sub], vec![0f32; elems / f.sub]);
                    u(b, &mut codes, &mut sc, &mut mn);
                    for (i, &c) in codes.iter().enumerate() {
                        let j = i / f.sub;
                        assert!(c <= f.max_code, "{dtype}: code {c} above {}", f.max_code);
                        let m = if f.has_min { mn[j] } else { 0.0 };
                        out.push(sc[j] * (c as i32 - f.bias) as f32 + m);
                    }
                }
                return out;
            }
        };
        for b in row.chunks_exact(bs) {
            let (mut codes, mut sc, mut mn) = ([0u8; QK_K], [0i32; 16], [0i32; 16]);
            let (d, dmin) = unpack(b, &mut codes, &mut sc, &mut mn);
            for (i, &c) in codes.iter().enumerate() {
                let j = i / f.sub;
                assert!(c <= f.max_code, "{dtype}: code {c} above {}", f.max_code);
                assert!(sc[j].unsigned_abs() * 255 < 1 << 15, "{dtype}: scale {} too large", sc[j]);
                assert!(mn[j].unsigned_abs() * 255 < 1 << 15, "{dtype}: min {} too large", mn[j]);
                let m = if f.has_min { dmin * mn[j] as f32 } else { 0.0 };
                out.push(d * sc[j] as f32 * (c as i32 - f.bias) as f32 - m);
            }
        }
        out
    }

    /// The integer form of `dtype` gives the dequantizer's weights (relative 1e-6) for random rows.
    pub(crate) fn check_type(dtype: DType) {
        let n = 4 * QK_K;
        let mut r = crate::testdata::Xorshift32::from_state(0x9E37_79B9);
        let x: Vec<f32> =
            (0..n).map(|_| (r.next_u32() as f32 / u32::MAX as f32 - 0.5) * 3.0).collect();
        let mut q = vec![0u8; dtype.row_bytes(n)];
        let imat = vec![1.0f32; n];
        let im = crate::quant::format(dtype).requires_imatrix.then_some(&imat[..]);
        (crate::quant::format(dtype).quantize.expect("quantize"))(&x, &mut q, n, im).unwrap();
        let mut want = vec![0f32; n];
        (crate::quant::format(dtype).dequantize.expect("dequantize"))(&q, &mut want);
        let got = rebuild(dtype, &q);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= 1e-6 * w.abs().max(1e-3), "{dtype} element {i}: {g} vs {w}");
        }
    }

    #[test]
    fn kquant_integer_forms_rebuild_the_dequantized_weights() {
        for d in [DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K] {
            check_type(d);
        }
    }

    #[test]
    fn block_integer_forms_rebuild_the_dequantized_weights() {
        for d in [
            DType::Q4_0,
            DType::Q4_1,
            DType::Q5_0,
            DType::Q5_1,
            DType::Q8_0,
            DType::IQ4_NL,
            DType::MXFP4,
            DType::NVFP4,
            DType::Q1_0,
            DType::Q2_0,
        ] {
            check_type(d);
        }
    }

    /// Calls `check(codes, scales)` on 2000 unpacked blocks of super-block format `d`: random
    /// bytes, with every fourth block all ones and every fourth all zeros.
    fn for_unpacked_blocks(d: DType, seed: u64, mut check: impl FnMut(&[u8; QK_K], &[i32; 16])) {
        let f = int_format(d).expect("an integer form");
        let Unpack::Super(unpack) = f.unpack else { panic!("{d}: not a super-block form") };
        for_any_blocks(d, seed, |b| {
            let (mut codes, mut sc, mut mn) = ([0u8; QK_K], [0i32; 16], [0i32; 16]);
            unpack(b, &mut codes, &mut sc, &mut mn);
            check(&codes, &sc);
        });
    }

    /// 2000 blocks of type `d`: all bits set, all clear, and random bytes (seeded by `seed`).
    fn for_any_blocks(d: DType, seed: u64, mut each: impl FnMut(&[u8])) {
        let mut r = crate::testdata::Xorshift64::from_state(seed);
        for case in 0..2000 {
            let b: Vec<u8> = (0..d.type_size())
                .map(|_| match case % 4 {
                    0 => 0xFF,
                    1 => 0,
                    _ => r.next_u64() as u8,
                })
                .collect();
            each(&b);
        }
    }

    /// `IntFormat::narrow_sums` holds for any bytes: every code within `limit` of the bias and
    /// every scale within 16 bits, so `sub * limit * 128` (the largest corrected sum) fits 16 bits;
    /// Q3_K and IQ1_M are the narrow forms.
    #[test]
    fn narrow_forms_keep_their_sums_within_16_bits_for_any_bytes() {
        let mut narrow = Vec::new();
        for d in DType::ALL {
            let Some(f) = int_format(d) else { continue };
            if !f.narrow_sums {
                continue;
            }
            narrow.push(d);
            let mut limit = 0i32;
            for_unpacked_blocks(d, 0x5DEE_CE66_D1CE_4E5B, |codes, sc| {
                limit = codes.iter().fold(limit, |m, &c| m.max((c as i32 - f.bias).abs()));
                assert!(sc.iter().all(|s| s.unsigned_abs() < 1 << 15), "{d}: scales {sc:?}");
            });
            assert!(f.sub as i32 * limit * 128 < 1 << 15, "{d}: codes up to {limit} from the bias");
        }
        assert_eq!(narrow, [DType::Q3_K, DType::IQ1_M]);
    }

    /// `IntFormat::radius` holds for any bytes, so the recentred form's codes (shifted down by
    /// `bias - radius`) lie in `0..=2 * radius`; every IQ1-IQ3 grid has one, within 127.
    #[test]
    fn grid_codes_stay_within_their_radius() {
        let mut with = Vec::new();
        for d in DType::ALL {
            let Some(f) = int_format(d) else { continue };
            let Some(r) = f.radius else {
                assert!(f.recentred().is_none(), "{d}");
                continue;
            };
            with.push(d);
            let c = f.recentred().expect("a recentred form");
            assert_eq!((c.bias, c.max_code, c.shift as i32), (r as i32, 2 * r, f.bias - r as i32));
            assert!(c.max_code <= 127, "{d}: recentred codes up to {}", c.max_code);
            assert!(c.recentred().is_none(), "{d}: recentred twice");
            let mut far = 0;
            for_unpacked_blocks(d, 0x2545_F491_4F6C_DD1D, |codes, _| {
                for &code in codes.iter() {
                    far = far.max((code as i32 - f.bias).abs());
                    let shifted = code.wrapping_sub(c.shift);
                    assert!(shifted <= c.max_code, "{d}: code {code} -> {shifted}");
                    assert_eq!(shifted as i32 - c.bias, code as i32 - f.bias, "{d}");
                }
            });
            assert!(far <= r as i32, "{d}: codes up to {far} from the bias, radius {r}");
        }
        use DType::*;
        assert_eq!(with, [IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ3_S, IQ2_S, IQ1_M]);
    }

    /// `IntFormat::min_code` holds for any bytes (IQ4_NL, IQ4_XS and the IQ1-IQ3 grids never
    /// write code 0, the weight -128 that `Sign::OnWeights` cannot negate), and
    /// `IntFormat::signed` gives the sign forms to the bias-128 formats without mins only: Q8_0's
    /// weights reach -128, so it takes `Sign::OnLevels`, and only with levels quantized from f32.
    #[test]
    fn signed_forms_keep_their_bounds_for_any_bytes() {
        let mut signed = Vec::new();
        for d in DType::ALL {
            let Some(f) = int_format(d) else { continue };
            let mut lowest = 255u8;
            for_any_blocks(d, 0x5851_F42D_4C95_7F2D, |b| {
                let mut codes = [0u8; QK_K];
                match f.unpack {
                    Unpack::Super(unpack) => {
                        unpack(b, &mut codes, &mut [0; 16], &mut [0; 16]);
                    }
                    Unpack::Blocks { elems, f: unpack } => {
                        let (mut sc, mut mn) = ([0f32; 8], [0f32; 8]);
                        let n = elems / f.sub;
                        unpack(b, &mut codes[..elems], &mut sc[..n], &mut mn[..n]);
                        codes[elems..].fill(255);
                    }
                }
                lowest = lowest.min(*codes.iter().min().expect("codes"));
            });
            assert!(lowest >= f.min_code, "{d}: code {lowest} below {}", f.min_code);
            let (theirs, own) = (f.signed(false), f.signed(true));
            if let Some(s) = own {
                assert_eq!((f.bias, f.has_min), (128, false), "{d}");
                assert!(s.signed(true).is_none(), "{d}: signed twice");
                let want = if f.min_code >= 1 { Sign::OnWeights } else { Sign::OnLevels };
                assert_eq!(s.sign, Some(want), "{d}");
                assert_eq!(theirs.map(|t| t.sign), (want == Sign::OnWeights).then_some(s.sign));
                signed.push((d, want));
            } else {
                assert!(theirs.is_none(), "{d}");
            }
        }
        use DType::*;
        let on_weights = [IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ4_NL, IQ3_S, IQ2_S, IQ4_XS, IQ1_M];
        let want: Vec<_> = [(Q8_0, Sign::OnLevels)]
            .into_iter()
            .chain(on_weights.map(|d| (d, Sign::OnWeights)))
            .collect();
        assert_eq!(signed, want);
    }

    /// The folded forms' bound (`IntFormat::for_tier`) holds for any bytes: every super-block
    /// form's scaled, bias-corrected codes within 2^14; the folding tier's form of each.
    #[test]
    fn super_block_forms_keep_their_scaled_codes_within_14_bits_for_any_bytes() {
        let mut folded = 0;
        for d in DType::ALL {
            let Some(f) = int_format(d) else { continue };
            let t = f.for_tier(true);
            assert_eq!(t.fold, !f.float_scales(), "{d}");
            assert!(!f.for_tier(false).fold, "{d}");
            if !t.fold {
                continue;
            }
            assert_eq!((t.sub, t.widen), (16, f.sub == 32), "{d}");
            folded += 1;
            for_unpacked_blocks(d, 0x9E37_79B9_7F4A_7C15, |codes, sc| {
                for (i, &c) in codes.iter().enumerate() {
                    let v = (c as i32 - f.bias) * sc[i / f.sub];
                    assert!(v.abs() < 1 << 14, "{d}: folded weight {v}");
                }
            });
        }
        assert!(folded >= 15, "{folded} folded forms");
    }

    /// TQ1_0's codes, written a run of bytes at a time, are `tq1_trit` of every element, for
    /// any bytes (not only those the quantizer writes).
    #[test]
    fn tq1_0_codes_are_the_trits_of_any_bytes() {
        let mut r = crate::testdata::Xorshift64::from_state(0x7131_0C0D);
        for _ in 0..64 {
            let b: Vec<u8> = (0..DType::TQ1_0.type_size()).map(|_| r.next_u64() as u8).collect();
            let (mut codes, mut scales, mut mins) = ([0u8; QK_K], [0i32; 16], [0i32; 16]);
            unpack_tq1_0(&b, &mut codes, &mut scales, &mut mins);
            let x: crate::quant::ternary::BlockTq1_0 = block(&b);
            for (k, &c) in codes.iter().enumerate() {
                assert_eq!(c as i32, crate::quant::ternary::tq1_trit(&x, k), "element {k}");
            }
        }
    }

    #[test]
    fn iq4_xs_and_ternary_integer_forms_rebuild_the_dequantized_weights() {
        for d in [DType::IQ4_XS, DType::TQ1_0, DType::TQ2_0] {
            check_type(d);
        }
    }
}
