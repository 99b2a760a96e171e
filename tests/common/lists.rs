//! The lists of types and ops that several integration tests iterate over, kept in one place so
//! that a new type or op is added once. Only the public API is used (tests/common/random_graph.rs,
//! which the fuzz target shares, includes this file too).
#![allow(dead_code)]

use quantgraph::{DType, GluOp, UnaryOp};

/// The float types.
pub const FLOAT_TYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// The float types and the legacy, FP4, 1-bit/2-bit and ternary block types: every type whose
/// reference quantizer needs no importance matrix and no K-quant super-blocks.
pub const QUANTIZABLE: [DType; 14] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::MXFP4,
    DType::NVFP4,
    DType::Q1_0,
    DType::Q2_0,
    DType::TQ1_0,
    DType::TQ2_0,
];

/// Every K-quant weight type.
pub const K_TYPES: [DType; 5] = [DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K];

/// Every block-quantized weight type with a dot product (what mul_mat, mul_mat_id and out_prod
/// take as weights), in type-id order.
pub const QUANT_WEIGHT_TYPES: [DType; 25] = [
    DType::Q1_0,
    DType::Q2_0,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::MXFP4,
    DType::NVFP4,
    DType::Q2_K,
    DType::Q3_K,
    DType::Q4_K,
    DType::Q5_K,
    DType::Q6_K,
    DType::TQ1_0,
    DType::TQ2_0,
    DType::IQ2_XXS,
    DType::IQ2_XS,
    DType::IQ3_XXS,
    DType::IQ1_S,
    DType::IQ1_M,
    DType::IQ4_NL,
    DType::IQ4_XS,
    DType::IQ3_S,
    DType::IQ2_S,
];

/// The K and V types flash_attn_ext (and the lightning indexer's K) read.
pub const KV_TYPES: [DType; 9] = [
    DType::F16,
    DType::F32,
    DType::BF16,
    DType::Q8_0,
    DType::Q5_1,
    DType::Q5_0,
    DType::Q4_1,
    DType::Q4_0,
    DType::IQ4_NL,
];

/// Every unary op without parameters (all but xIELU).
pub const UNARY_PLAIN: [UnaryOp; 21] = [
    UnaryOp::Relu,
    UnaryOp::Gelu,
    UnaryOp::Silu,
    UnaryOp::Abs,
    UnaryOp::Sgn,
    UnaryOp::Neg,
    UnaryOp::Step,
    UnaryOp::Tanh,
    UnaryOp::Elu,
    UnaryOp::Sigmoid,
    UnaryOp::GeluQuick,
    UnaryOp::Hardswish,
    UnaryOp::Hardsigmoid,
    UnaryOp::Exp,
    UnaryOp::Expm1,
    UnaryOp::Softplus,
    UnaryOp::GeluErf,
    UnaryOp::Floor,
    UnaryOp::Ceil,
    UnaryOp::Round,
    UnaryOp::Trunc,
];

/// Every gated linear unit.
pub const GLU_OPS: [GluOp; 7] = [
    GluOp::Reglu,
    GluOp::Geglu,
    GluOp::Swiglu,
    GluOp::SwigluOai,
    GluOp::GegluErf,
    GluOp::GegluQuick,
    GluOp::SwigluClamp,
];

/// The xIELU parameters the tests give `Graph::xielu`: (alpha_n, alpha_p, beta, eps).
pub const XIELU: (f32, f32, f32, f32) = (0.8, 0.8, 0.5, -1e-6);

/// Every unary op: [`UNARY_PLAIN`] and xIELU with what ggml_xielu stores for [`XIELU`].
pub fn all_unary() -> Vec<UnaryOp> {
    let softplus = |x: f64| if x > 20.0 { x } else { (1.0 + x.exp()).ln() };
    let (an, ap, b, e) = XIELU;
    let xielu = UnaryOp::Xielu {
        alpha_n: b + softplus(an as f64) as f32,
        alpha_p: softplus(ap as f64) as f32,
        beta: b,
        eps: e,
    };
    UNARY_PLAIN.into_iter().chain([xielu]).collect()
}
