//! `DType`: every tensor type of ggml (`enum ggml_type`, ids 0..=42), with ggml's names, block sizes,
//! bytes per block and the type each one is dotted against on the CPU (`vec_dot_type`).
//!
//! The table mirrors ggml's `type_traits` (src/ggml.c) and `type_traits_cpu` (src/ggml-cpu/ggml-cpu.c).
//! Ids that ggml removed (4, 5, 31-33, 36-38) have no `DType`.

use crate::error::{Error, Result};

/// The super-block size of the K-quants and most IQ formats (ggml's `QK_K`).
pub const QK_K: usize = 256;

/// A tensor element type, with the same id, name and byte layout as ggml's `ggml_type`.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
#[non_exhaustive]
pub enum DType {
    /// GGML_TYPE_F32: IEEE 754 single precision, 4 bytes per element.
    F32 = 0,
    /// GGML_TYPE_F16: IEEE 754 half precision, 2 bytes per element.
    F16 = 1,
    /// GGML_TYPE_Q4_0: blocks of 32 elements, one f16 scale `d` and 32 4-bit codes `q`; an
    /// element is `(q - 8) * d` (18 bytes, 4.5 bits per weight).
    Q4_0 = 2,
    /// GGML_TYPE_Q4_1: blocks of 32 elements, f16 scale `d` and minimum `m`, 32 4-bit codes `q`; an
    /// element is `q * d + m` (20 bytes, 5 bits per weight).
    Q4_1 = 3,
    /// GGML_TYPE_Q5_0: blocks of 32 elements, f16 scale `d`, the fifth bits in 4 bytes and the low
    /// nibbles in 16; an element is `(q - 16) * d` (22 bytes, 5.5 bits per weight).
    Q5_0 = 6,
    /// GGML_TYPE_Q5_1: blocks of 32 elements, f16 scale `d` and minimum `m`, 5-bit codes (fifth bits
    /// in 4 bytes); an element is `q * d + m` (24 bytes, 6 bits per weight).
    Q5_1 = 7,
    /// GGML_TYPE_Q8_0: blocks of 32 elements, f16 scale `d` and 32 signed 8-bit codes; an element is
    /// `q * d` (34 bytes). Also the type activations are quantized to for Q4_0, Q5_0, IQ4_NL,
    /// MXFP4, NVFP4, Q1_0 and Q2_0 weights.
    Q8_0 = 8,
    /// GGML_TYPE_Q8_1: blocks of 32 elements, f16 scale `d`, f16 `s = d * sum(q)` and 32 signed
    /// 8-bit codes (36 bytes). The activation type for Q4_1 and Q5_1 weights, whose minimum
    /// multiplies `s`.
    Q8_1 = 9,
    /// GGML_TYPE_Q2_K: 256-element super-blocks of 16 sub-blocks of 16; 2-bit codes, 4-bit sub-block
    /// scales and mins, f16 super-block scale and min (84 bytes, 2.625 bits per weight).
    Q2_K = 10,
    /// GGML_TYPE_Q3_K: 256-element super-blocks of 16 sub-blocks of 16; 3-bit codes (low 2 bits plus
    /// a high-bit mask), 6-bit signed sub-block scales, f16 super-block scale (110 bytes, 3.4375
    /// bits per weight).
    Q3_K = 11,
    /// GGML_TYPE_Q4_K: 256-element super-blocks of 8 sub-blocks of 32; 4-bit codes, 6-bit sub-block
    /// scales and mins, f16 super-block scale and min (144 bytes, 4.5 bits per weight).
    Q4_K = 12,
    /// GGML_TYPE_Q5_K: 256-element super-blocks of 8 sub-blocks of 32; 5-bit codes (low nibble plus a
    /// high-bit plane), 6-bit sub-block scales and mins, f16 super-block scale and min (176 bytes,
    /// 5.5 bits per weight).
    Q5_K = 13,
    /// GGML_TYPE_Q6_K: 256-element super-blocks of 16 sub-blocks of 16; 6-bit codes (low 4 plus high
    /// 2 bits), signed 8-bit sub-block scales, f16 super-block scale (210 bytes, 6.5625 bits per
    /// weight).
    Q6_K = 14,
    /// GGML_TYPE_Q8_K: 256-element blocks with an f32 scale, 256 signed 8-bit codes and 16 i16 sums
    /// of 16 codes each (292 bytes). The activation type the K-quants, IQ2/IQ3/IQ1, IQ4_XS and
    /// ternary weights are dotted against; ggml uses it only as an intermediate.
    Q8_K = 15,
    /// GGML_TYPE_IQ2_XXS: 256-element super-blocks, f16 scale; each group of 8 is an index into
    /// the 256-entry `iq2xxs_grid` plus 7 sign bits, with a 4-bit scale per 32 (66 bytes, 2.0625
    /// bits per weight). Quantizing needs an importance matrix.
    IQ2_XXS = 16,
    /// GGML_TYPE_IQ2_XS: 256-element super-blocks, f16 scale; each group of 8 is a 9-bit index into
    /// the 512-entry `iq2xs_grid` plus 7 sign bits, with a 4-bit scale per 16 (74 bytes, 2.3125
    /// bits per weight). Quantizing needs an importance matrix.
    IQ2_XS = 17,
    /// GGML_TYPE_IQ3_XXS: 256-element super-blocks, f16 scale; each group of 4 is an index into
    /// the 256-entry `iq3xxs_grid`, signs and a 4-bit scale per 32 packed alongside (98 bytes,
    /// 3.0625 bits per weight).
    IQ3_XXS = 18,
    /// GGML_TYPE_IQ1_S: 256-element super-blocks, f16 scale; each group of 8 is an 11-bit index into
    /// the 2048-entry ternary `iq1s_grid`, with a 3-bit scale and a ±`IQ1S_DELTA` shift per 32
    /// (50 bytes, 1.5625 bits per weight). Quantizing needs an importance matrix.
    IQ1_S = 19,
    /// GGML_TYPE_IQ4_NL: blocks of 32 elements, f16 scale and 4-bit indices into the non-linear
    /// 16-value table `kvalues_iq4nl` (18 bytes, 4.5 bits per weight).
    IQ4_NL = 20,
    /// GGML_TYPE_IQ3_S: 256-element super-blocks, f16 scale; each group of 4 is a 9-bit index into
    /// the 512-entry `iq3s_grid`, with explicit sign bits and a 4-bit scale per 32 (110 bytes,
    /// 3.4375 bits per weight).
    IQ3_S = 21,
    /// GGML_TYPE_IQ2_S: 256-element super-blocks, f16 scale; each group of 8 is a 10-bit index into
    /// the 1024-entry `iq2s_grid`, with explicit sign bits and a 4-bit scale per 16 (82 bytes,
    /// 2.5625 bits per weight).
    IQ2_S = 22,
    /// GGML_TYPE_IQ4_XS: 256-element super-blocks of 8 sub-blocks of 32; 4-bit indices into
    /// `kvalues_iq4nl`, 6-bit sub-block scales, f16 super-block scale (136 bytes, 4.25 bits per
    /// weight).
    IQ4_XS = 23,
    /// GGML_TYPE_I8: signed 8-bit integer.
    I8 = 24,
    /// GGML_TYPE_I16: signed 16-bit integer.
    I16 = 25,
    /// GGML_TYPE_I32: signed 32-bit integer; the type of row ids, positions and indices (get_rows,
    /// rope, argsort, ...).
    I32 = 26,
    /// GGML_TYPE_I64: signed 64-bit integer (set_rows ids, count_equal's result).
    I64 = 27,
    /// GGML_TYPE_F64: IEEE 754 double precision, 8 bytes per element.
    F64 = 28,
    /// GGML_TYPE_IQ1_M: 256-element super-blocks; groups of 8 from the ternary `iq1s_grid` (11-bit
    /// indices), a shift per 8, 3-bit scales per 16, and the f16 super-block scale split over the
    /// top nibbles of the four 16-bit scale words, no separate `d` field (56 bytes, 1.75 bits per
    /// weight).
    IQ1_M = 29,
    /// GGML_TYPE_BF16: bfloat16, the upper 16 bits of an f32 (8-bit exponent, 7-bit mantissa).
    BF16 = 30,
    /// GGML_TYPE_TQ1_0: ternary (-1, 0, 1) 256-element blocks, five trits per byte in base 3 for 240
    /// elements and four per byte for the last 16, f16 scale (54 bytes, 1.6875 bits per weight).
    TQ1_0 = 34,
    /// GGML_TYPE_TQ2_0: ternary (-1, 0, 1) 256-element blocks, each trit + 1 in 2 bits, f16 scale
    /// (66 bytes, 2.0625 bits per weight).
    TQ2_0 = 35,
    /// GGML_TYPE_MXFP4: OCP microscaling FP4, blocks of 32 E2M1 4-bit floats sharing one E8M0
    /// power-of-two scale byte (17 bytes, 4.25 bits per weight).
    MXFP4 = 39,
    /// GGML_TYPE_NVFP4: blocks of 64 E2M1 4-bit floats in four sub-blocks of 16, each with an
    /// unsigned E4M3 scale byte (36 bytes, 4.5 bits per weight).
    NVFP4 = 40,
    /// GGML_TYPE_Q1_0: blocks of 128 elements, f16 scale `d` and one bit per element; a set bit is
    /// `+d`, a clear one `-d` (18 bytes, 1.125 bits per weight).
    Q1_0 = 41,
    /// GGML_TYPE_Q2_0: blocks of 64 elements, f16 scale `d` and 2-bit codes `q`; an element is
    /// `(q - 1) * d`, one of -d, 0, d, 2d (18 bytes, 2.25 bits per weight).
    Q2_0 = 42,
}

/// Static facts about one type: ggml's `type_traits` plus the CPU's `vec_dot_type`.
struct Traits {
    name: &'static str,
    block_size: usize,
    type_size: usize,
    quantized: bool,
    vec_dot: DType,
}

const fn t(name: &'static str, bs: usize, ts: usize, q: bool, vd: DType) -> Traits {
    Traits { name, block_size: bs, type_size: ts, quantized: q, vec_dot: vd }
}

impl DType {
    /// Every type, in ggml id order.
    pub const ALL: [DType; 35] = [
        DType::F32,
        DType::F16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q8_1,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::Q8_K,
        DType::IQ2_XXS,
        DType::IQ2_XS,
        DType::IQ3_XXS,
        DType::IQ1_S,
        DType::IQ4_NL,
        DType::IQ3_S,
        DType::IQ2_S,
        DType::IQ4_XS,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::F64,
        DType::IQ1_M,
        DType::BF16,
        DType::TQ1_0,
        DType::TQ2_0,
        DType::MXFP4,
        DType::NVFP4,
        DType::Q1_0,
        DType::Q2_0,
    ];

    #[inline]
    fn traits(self) -> Traits {
        use DType::*;
        match self {
            F32 => t("f32", 1, 4, false, F32),
            F16 => t("f16", 1, 2, false, F16),
            Q4_0 => t("q4_0", 32, 18, true, Q8_0),
            Q4_1 => t("q4_1", 32, 20, true, Q8_1),
            Q5_0 => t("q5_0", 32, 22, true, Q8_0),
            Q5_1 => t("q5_1", 32, 24, true, Q8_1),
            Q8_0 => t("q8_0", 32, 34, true, Q8_0),
            Q8_1 => t("q8_1", 32, 36, true, Q8_1),
            Q2_K => t("q2_K", QK_K, 84, true, Q8_K),
            Q3_K => t("q3_K", QK_K, 110, true, Q8_K),
            Q4_K => t("q4_K", QK_K, 144, true, Q8_K),
            Q5_K => t("q5_K", QK_K, 176, true, Q8_K),
            Q6_K => t("q6_K", QK_K, 210, true, Q8_K),
            Q8_K => t("q8_K", QK_K, 292, true, Q8_K),
            IQ2_XXS => t("iq2_xxs", QK_K, 66, true, Q8_K),
            IQ2_XS => t("iq2_xs", QK_K, 74, true, Q8_K),
            IQ3_XXS => t("iq3_xxs", QK_K, 98, true, Q8_K),
            IQ1_S => t("iq1_s", QK_K, 50, true, Q8_K),
            IQ4_NL => t("iq4_nl", 32, 18, true, Q8_0),
            IQ3_S => t("iq3_s", QK_K, 110, true, Q8_K),
            IQ2_S => t("iq2_s", QK_K, 82, true, Q8_K),
            IQ4_XS => t("iq4_xs", QK_K, 136, true, Q8_K),
            I8 => t("i8", 1, 1, false, I8),
            I16 => t("i16", 1, 2, false, I16),
            I32 => t("i32", 1, 4, false, I32),
            I64 => t("i64", 1, 8, false, I64),
            F64 => t("f64", 1, 8, false, F64),
            IQ1_M => t("iq1_m", QK_K, 56, true, Q8_K),
            BF16 => t("bf16", 1, 2, false, BF16),
            TQ1_0 => t("tq1_0", QK_K, 54, true, Q8_K),
            TQ2_0 => t("tq2_0", QK_K, 66, true, Q8_K),
            MXFP4 => t("mxfp4", 32, 17, true, Q8_0),
            NVFP4 => t("nvfp4", 64, 36, true, Q8_0),
            Q1_0 => t("q1_0", 128, 18, true, Q8_0),
            Q2_0 => t("q2_0", 64, 18, true, Q8_0),
        }
    }

    /// The type for a ggml type id, or `None` for ids ggml removed or never had.
    ///
    /// ```
    /// use quantgraph::DType;
    /// assert_eq!(DType::from_ggml_id(2), Some(DType::Q4_0));
    /// assert_eq!(DType::from_ggml_id(4), None); // Q4_2 was removed from ggml
    /// ```
    pub fn from_ggml_id(id: u32) -> Option<DType> {
        DType::ALL.iter().copied().find(|d| d.ggml_id() == id)
    }

    /// ggml's numeric id (`enum ggml_type`), as stored in GGUF files.
    pub fn ggml_id(self) -> u32 {
        self as u32
    }

    /// ggml's name (`ggml_type_name`): `"f32"`, `"q4_0"`, `"q4_K"`, `"iq4_nl"`, ...
    pub fn name(self) -> &'static str {
        self.traits().name
    }

    /// The type with ggml's name `name` (case-sensitive, as ggml prints it).
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.iter().copied().find(|d| d.name() == name)
    }

    /// Elements per block (1 for plain types, 32 for Q4_0, 256 for the K-quants).
    #[inline]
    pub fn block_size(self) -> usize {
        self.traits().block_size
    }

    /// Bytes per block (ggml's `type_size`).
    #[inline]
    pub fn type_size(self) -> usize {
        self.traits().type_size
    }

    /// Byte alignment the kernels need for this type's data: the alignment of the element type
    /// (4 for F32 and I32, 2 for F16 and BF16, 8 for I64 and F64) or of the block struct (2 for
    /// blocks with an f16 scale, 4 for Q8_K's f32 scale, 1 for byte-only blocks). Tensor
    /// offsets and strides must be multiples of it.
    ///
    /// ```
    /// use quantgraph::DType;
    /// assert_eq!(DType::F32.align(), 4);
    /// assert_eq!(DType::Q4_0.align(), 2);
    /// ```
    pub fn align(self) -> usize {
        use DType::*;
        match self {
            I8 | MXFP4 | NVFP4 | IQ1_M => 1,
            F16 | BF16 | I16 => 2,
            F32 | I32 | Q8_K => 4,
            I64 | F64 => 8,
            _ => 2,
        }
    }

    /// True for the block-quantized types (ggml's `is_quantized`).
    pub fn is_quantized(self) -> bool {
        self.traits().quantized
    }

    /// True for F32, F16, BF16 and F64.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
    }

    /// True for I8, I16, I32 and I64.
    pub fn is_integer(self) -> bool {
        matches!(self, DType::I8 | DType::I16 | DType::I32 | DType::I64)
    }

    /// The type the CPU converts activations into before a dot product with a row of `self`
    /// (ggml's `type_traits_cpu[self].vec_dot_type`).
    #[inline]
    pub fn vec_dot_type(self) -> DType {
        self.traits().vec_dot
    }

    /// Bytes of a row of `n` elements; an error when `n` is not a multiple of the block size.
    ///
    /// ```
    /// use quantgraph::DType;
    /// assert_eq!(DType::Q4_0.row_size(64).unwrap(), 36);
    /// assert!(DType::Q4_0.row_size(33).is_err());
    /// ```
    pub fn row_size(self, n: usize) -> Result<usize> {
        let bs = self.block_size();
        if !n.is_multiple_of(bs) {
            return Err(Error::BlockSize { dtype: self, n, block: bs });
        }
        (n / bs).checked_mul(self.type_size()).ok_or(Error::Overflow { what: "row size" })
    }

    /// Bytes of a row of `n` elements, for a caller that already knows `n` is a whole number of
    /// blocks (rounds down otherwise).
    pub(crate) fn row_bytes(self, n: usize) -> usize {
        n / self.block_size() * self.type_size()
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DType {
    type Err = Error;
    fn from_str(s: &str) -> Result<DType> {
        DType::from_name(s).ok_or_else(|| Error::UnknownType(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_ggml_id(d.ggml_id()), Some(d));
            assert_eq!(DType::from_name(d.name()), Some(d));
        }
        assert_eq!(DType::ALL.len(), 35);
    }

    #[test]
    fn removed_ids_are_rejected() {
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 43, 1000] {
            assert_eq!(DType::from_ggml_id(id), None, "id {id}");
        }
    }

    #[test]
    fn block_and_type_sizes_match_ggml_common_h() {
        // sizeof(block_*) from ggml-common.h's static_asserts.
        assert_eq!(DType::Q4_K.type_size(), 2 * 2 + 12 + QK_K / 2);
        assert_eq!(DType::Q5_K.type_size(), 2 * 2 + 12 + QK_K / 2 + QK_K / 8);
        assert_eq!(DType::Q6_K.type_size(), 2 + QK_K / 16 + 3 * QK_K / 4);
        assert_eq!(DType::Q8_K.type_size(), 4 + QK_K + QK_K / 16 * 2);
        assert_eq!(DType::IQ3_S.type_size(), 2 + 13 * (QK_K / 32) + 4);
        assert_eq!(DType::IQ1_M.type_size(), QK_K / 8 + QK_K / 16 + QK_K / 32);
        assert_eq!(DType::TQ1_0.type_size(), 2 + QK_K / 64 + (QK_K - 4 * QK_K / 64) / 5);
        assert_eq!(DType::NVFP4.type_size(), 4 + 32);
    }

    #[test]
    fn row_size_rejects_partial_blocks() {
        assert_eq!(DType::F32.row_size(7).unwrap(), 28);
        assert_eq!(DType::Q4_K.row_size(512).unwrap(), 288);
        let e = DType::Q4_K.row_size(100).unwrap_err().to_string();
        assert!(e.contains("q4_K") && e.contains("100") && e.contains("256"), "{e}");
    }
}
