//! Op nodes: the `Op` enum (ggml's GGML_OP_* with their parameters) and the `Graph` methods that
//! create them after checking shapes and types with ggml's rules.

use super::{Graph, TensorId, shape_str};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// What a backend may assume about a `mul_mat` node's weights (ggml's `ggml_op_hint`), set with
/// [`Graph::mul_mat_set_hint`](crate::Graph::mul_mat_set_hint).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum MatMulHint {
    /// Nothing: the dense product.
    #[default]
    None,
    /// The weights are the normalised Sylvester Hadamard matrix `H_n / sqrt(n)`
    /// (`GGML_HINT_SRC0_IS_HADAMARD`).
    Src0IsHadamard,
}

/// Elementwise functions (ggml's `GGML_UNARY_OP_*`), on F32 or F16 (the result has the input's type).
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum UnaryOp {
    /// max(x, 0)
    Relu,
    /// GELU, tanh approximation, through ggml's f16 lookup table (bit-exact with ggml).
    Gelu,
    /// x * sigmoid(x)
    Silu,
    /// |x|
    Abs,
    /// sign of x: -1, 0 or 1.
    Sgn,
    /// -x
    Neg,
    /// 1 if x > 0, else 0.
    Step,
    /// tanh(x)
    Tanh,
    /// x if x > 0, else exp(x) - 1.
    Elu,
    /// 1 / (1 + exp(-x))
    Sigmoid,
    /// x * sigmoid(1.702 x), through ggml's f16 lookup table (bit-exact with ggml).
    GeluQuick,
    /// x * clamp((x + 3) / 6, 0, 1)
    Hardswish,
    /// clamp((x + 3) / 6, 0, 1)
    Hardsigmoid,
    /// exp(x)
    Exp,
    /// exp(x) - 1
    Expm1,
    /// log(1 + exp(x)), x above 20 passed through.
    Softplus,
    /// GELU with the exact erf.
    GeluErf,
    /// xIELU with ggml's stored parameters: `alpha_n` and `alpha_p` are already passed through
    /// softplus (and `alpha_n` offset by `beta`), as `ggml_xielu` stores them.
    Xielu {
        /// Coefficient of the negative side, stored as `beta + softplus(alpha_n)` of the model's
        /// parameter: for x <= 0 the result is `(expm1(min(x, eps)) - x) * alpha_n + beta * x`.
        alpha_n: f32,
        /// Coefficient of the positive side, stored as `softplus(alpha_p)` of the model's
        /// parameter: for x > 0 the result is `alpha_p * x * x + beta * x`.
        alpha_p: f32,
        /// The linear coefficient, on both sides.
        beta: f32,
        /// Upper clamp of x inside `expm1` on the negative side (a small negative number in the
        /// models that use xIELU).
        eps: f32,
    },
    /// floor(x)
    Floor,
    /// ceil(x)
    Ceil,
    /// Round half away from zero.
    Round,
    /// Round toward zero.
    Trunc,
}

impl UnaryOp {
    /// ggml's name for the op.
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Relu => "relu",
            UnaryOp::Gelu => "gelu",
            UnaryOp::Silu => "silu",
            UnaryOp::Abs => "abs",
            UnaryOp::Sgn => "sgn",
            UnaryOp::Neg => "neg",
            UnaryOp::Step => "step",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Elu => "elu",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::GeluQuick => "gelu_quick",
            UnaryOp::Hardswish => "hardswish",
            UnaryOp::Hardsigmoid => "hardsigmoid",
            UnaryOp::Exp => "exp",
            UnaryOp::Expm1 => "expm1",
            UnaryOp::Softplus => "softplus",
            UnaryOp::GeluErf => "gelu_erf",
            UnaryOp::Xielu { .. } => "xielu",
            UnaryOp::Floor => "floor",
            UnaryOp::Ceil => "ceil",
            UnaryOp::Round => "round",
            UnaryOp::Trunc => "trunc",
        }
    }
}

/// What a graph node computes, with its parameters (ggml's `op` + `op_params`).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Op {
    /// A leaf: input, weight or state.
    None,
    /// A view (view_*, reshape, permute, transpose): no computation.
    View,
    /// Copies src0 into the memory of src1, converting the type; the node is a view of src1.
    Cpy,
    /// Copies src0 into a new contiguous tensor (dup, cont, cast).
    Dup,
    /// a + b, b broadcast over a.
    Add,
    /// a - b, b broadcast over a.
    Sub,
    /// a * b, b broadcast over a.
    Mul,
    /// a / b, b broadcast over a.
    Div,
    /// a * scale + bias.
    Scale {
        /// The factor (ggml_scale's `s`).
        scale: f32,
        /// Added after scaling (ggml_scale_bias's `b`; 0 for ggml_scale).
        bias: f32,
    },
    /// Elementwise activation.
    Unary(UnaryOp),
    /// softmax(a * scale + slope * mask) along rows; ALiBi slopes from `max_bias`.
    SoftMax {
        /// Multiplies the logits before the mask is added (1 for ggml_soft_max; `1/sqrt(d_head)`
        /// in attention). Finite.
        scale: f32,
        /// ALiBi's maximum bias, >= 0. 0 adds the mask as is (slope 1); above 0 the mask is
        /// scaled per head (dim 2) by ggml's ALiBi slope, a power of `2^(-max_bias / n)` with `n`
        /// the largest power of two not above the head count, and a mask is needed.
        max_bias: f32,
    },
    /// x / sqrt(mean(x^2) + eps) along rows.
    RmsNorm {
        /// Added to the mean of squares before the square root (1e-5 or 1e-6 in most models);
        /// finite and >= 0.
        eps: f32,
    },
    /// Rows of src0 picked by the I32 ids in src1.
    GetRows,
    /// src0 [k, m] x src1 [k, n] -> [m, n], broadcasting dims 2 and 3.
    MulMat,
    /// `mul_mat` whose weights are the normalised Hadamard matrix
    /// ([`Graph::mul_mat_set_hint`](crate::Graph::mul_mat_set_hint)): a fast Walsh-Hadamard
    /// transform of b's rows.
    MulMatHadamard,
    /// Rotary position embedding of src0 by the positions in src1 (src2: frequency factors).
    Rope(Box<super::RopeParams>),
    /// Fused attention: src q, k, v, optional mask (src 3) and sinks (src 4).
    FlashAttnExt(super::FlashAttnParams),
    /// Rows of src0 written into the rows of src2 picked by the ids in src1; a view of src2.
    SetRows,
    /// Element copies by index mapping: concat, repeat, pad, pad_reflect_1d, roll.
    Gather(super::Gather),
    /// Sum of tiles (the backward of repeat).
    RepeatBack,
    /// start + step * i.
    Arange {
        /// The first value.
        start: f32,
        /// The increment, > 0. The count, `ceil((stop - start) / step)`, is the node's `ne[0]`.
        step: f32,
    },
    /// Sinusoidal embedding of timesteps.
    TimestepEmbedding {
        /// Features per timestep (`ne[0]` of the result): `dim / 2` cosines, then `dim / 2`
        /// sines, then a zero when `dim` is odd.
        dim: usize,
        /// The longest period, > 0 (10000 in Stable Diffusion): feature `j` has frequency
        /// `max_period^(-j / (dim / 2))`.
        max_period: i32,
    },
    /// A Rust closure (map_custom1/2/3, custom).
    Custom(super::CustomOp),
    /// A typed custom op ([`Graph::custom_any`](crate::Graph::custom_any)).
    CustomAny(super::CustomAnyOp),
    /// The branch `idx` of its sources, copied
    /// ([`Graph::forward_select`](crate::Graph::forward_select)); the other branches are not
    /// computed.
    ForwardSelect {
        /// The selected source.
        idx: usize,
    },
    /// Resize (upscale / interpolate).
    Upscale(super::ScaleMode),
    /// A copy of src0 with src1 written into a strided view at a byte offset.
    Set {
        /// Byte strides `nb1, nb2, nb3` of the view of src0 that src1 is written into (ggml's
        /// `nb1..nb3`; `nb0` is the element size).
        nb: [usize; 3],
        /// Byte offset of the view's first element in src0, a multiple of the element size.
        offset: usize,
    },
    // Elementwise, GLU, norms, reductions and sorting (built in graph/elementwise.rs).
    /// a + b where b is a scalar (one element).
    Add1,
    /// a + rows of b picked by the I32 ids (`dst[:, i1, i2] = a[:, i1, i2] + b[:, ids[i1, i2]]`).
    AddId,
    /// a with b added into a strided view of it (`nb1..nb3`, `offset` in bytes).
    Acc {
        /// Byte stride of dim 1 of the view of `a` that `b` is added into (a multiple of 4: F32).
        nb1: usize,
        /// Byte stride of dim 2 of the view.
        nb2: usize,
        /// Byte stride of dim 3 of the view.
        nb3: usize,
        /// Byte offset of the view's first element in `a`, a multiple of 4.
        offset: usize,
    },
    /// min(max(x, min), max).
    Clamp {
        /// The lower bound; not NaN.
        min: f32,
        /// The upper bound, `>= min`.
        max: f32,
    },
    /// x if x > 0 else `negative_slope * x`.
    LeakyRelu {
        /// The factor for x <= 0 (0.01 in PyTorch's default).
        negative_slope: f32,
    },
    /// x * x
    Sqr,
    /// sqrt(x)
    Sqrt,
    /// ln(x)
    Log,
    /// sin(x)
    Sin,
    /// cos(x)
    Cos,
    /// Every element set to `value` (shape and type of src0).
    Fill {
        /// The value written, rounded to the tensor's type.
        value: f32,
    },
    /// Keeps one triangle of each square matrix, zeroes the rest.
    Tri(super::TriType),
    /// [n, 1, p, q] -> [n, n, p, q] with the vector on the diagonal.
    Diag,
    /// Elements with column > n_past + row set to -inf.
    DiagMaskInf {
        /// Positions already in the cache before this batch: row `i` keeps columns
        /// `0..=n_past + i`. At most `i32::MAX`.
        n_past: usize,
    },
    /// Elements with column > n_past + row set to 0.
    DiagMaskZero {
        /// As for [`Op::DiagMaskInf`].
        n_past: usize,
    },
    /// Gated linear unit: act(x) * g, fused (src0 split in halves) or split (src0, src1).
    Glu {
        /// The activation and gating (ggml's `enum ggml_glu_op`).
        op: super::GluOp,
        /// Fused form only: the gate is the first half of the row and the activation's input the
        /// second (ggml's `*_swapped`); otherwise the other way round.
        swapped: bool,
        /// swiglu_oai only: the result is `x * sigmoid(alpha * x) * (g + 1)` (alpha 1.702 in
        /// gpt-oss); 0 for the other ops.
        alpha: f32,
        /// swiglu_oai only: x is clamped to at most `limit` and the gate to `[-limit, limit]`
        /// (7 in gpt-oss), >= 0; 0 for the other ops.
        limit: f32,
    },
    /// (x - mean) / sqrt(var + eps) along rows.
    Norm {
        /// Added to the variance before the square root; finite and >= 0.
        eps: f32,
    },
    /// rms_norm(src0) * src1 in one pass (ggml's CPU RMS_NORM + MUL fusion).
    RmsNormMul {
        /// As for [`Op::RmsNorm`].
        eps: f32,
    },
    /// norm over groups of channels (dim 2), per sample (dim 3).
    GroupNorm {
        /// Groups the channels (dim 2) are split into, >= 1: each has `ceil(ne[2] / n_groups)`
        /// channels, the last ones fewer (or none).
        n_groups: usize,
        /// Added to each group's variance; finite and >= 0.
        eps: f32,
    },
    /// x / max(||x||, eps) along rows.
    L2Norm {
        /// Lower bound on the norm divided by (with `eps > 0` a zero row stays zero); finite
        /// and >= 0.
        eps: f32,
    },
    /// Sum of all elements.
    Sum,
    /// Sum of each row.
    SumRows,
    /// Mean of each row.
    Mean,
    /// Running sum along rows.
    Cumsum,
    /// Index of the largest element of each row (I32).
    Argmax,
    /// Number of equal elements of two I32 tensors (I64 scalar).
    CountEqual,
    /// Indices that sort each row (I32).
    Argsort(super::SortOrder),
    /// Indices of the `k` largest elements of each row (I32; order not significant, as ggml).
    TopK {
        /// Indices kept per row, `1..=ne[0]`; the result's `ne[0]`.
        k: usize,
    },
    // Mixture of experts (graph/moe.rs).
    /// Per-token expert matmul: src0 [k, m, n_expert] x src1 [k, 1 or n_used, n_tokens] with the
    /// experts named by the I32 ids in src2 [n_used, n_tokens] -> [m, n_used, n_tokens].
    MulMatId,
    /// Outer products summed over k: src0 [m, k] x src1 [n, k] -> [m, n], broadcasting dims 2, 3.
    OutProd,
    // State-space, recurrent and other sequence-mixing ops (graph/recurrent.rs).
    /// Depthwise causal 1-D convolution over tokens (Mamba's conv1d).
    SsmConv,
    /// Selective state-space scan (Mamba-1 and Mamba-2 layouts); `k` state snapshot slots.
    SsmScan {
        /// State snapshot slots in the result, >= 1: slot 0 is the state after the last token,
        /// slot `j` the state `j` tokens earlier. Above 1 only for Mamba-2 (scalar `A` per head).
        k: usize,
    },
    /// RWKV-6 time-mix recurrence (output and new state).
    RwkvWkv6,
    /// Gated linear attention recurrence with query scale `scale`.
    GatedLinearAttn {
        /// Multiplies the queries (often `1/sqrt(head_size)`); finite.
        scale: f32,
    },
    /// RWKV-7 generalised delta-rule recurrence.
    RwkvWkv7,
    /// Solves A X = B for lower-triangular A (left, lower, non-unit diagonal).
    SolveTri,
    /// Gated delta rule recurrence (Qwen3-Next / Kimi linear); `k` state snapshot slots.
    GatedDeltaNet {
        /// State snapshot slots, >= 1, as for [`Op::SsmScan`].
        k: usize,
    },
    /// DeepSeek sparse-attention lightning indexer scores.
    LightningIndexer,
    /// DeepSeek-V4 hyper-connection combination matrices (Sinkhorn normalised).
    Dsv4HcComb {
        /// Added after the softmax and to every normalisation sum; finite.
        eps: f32,
        /// Sinkhorn rounds, 1 to [`DSV4_HC_MAX_ITER`](crate::DSV4_HC_MAX_ITER) (DeepSeek-V4
        /// uses 20).
        n_iter: u32,
    },
    /// DeepSeek-V4 hyper-connection pre-mix: weighted sum of streams, or with `gated` a sum
    /// gated per element by `sigmoid(gate)`, times `scale`.
    Dsv4HcPre {
        /// Factor applied to the sum (1 for the plain pre-mix).
        scale: f32,
        /// True when the second source is a per-element gate \[n_embd, hc, n_tokens\].
        gated: bool,
    },
    /// DeepSeek-V4 hyper-connection post-mix (streams recombined with the layer output).
    Dsv4HcPost,
    // Training: losses, optimizer steps and backward ops (graph/train.rs).
    /// -mean over rows of sum(labels * log_softmax(logits)) (F32 scalar).
    CrossEntropyLoss,
    /// Gradient of cross_entropy_loss with respect to the logits.
    CrossEntropyLossBack,
    /// One AdamW step, in place on the params (src 0) and moments (src 2, 3).
    OptStepAdamw,
    /// One SGD step with weight decay, in place on the params (src 0).
    OptStepSgd,
    /// Gradient of silu: src0 is the output gradient, src1 silu's input.
    SiluBack,
    /// Gradient of rms_norm: src0 is the output gradient, src1 rms_norm's input.
    RmsNormBack {
        /// The forward rms_norm's `eps`.
        eps: f32,
    },
    /// Gradient of soft_max_ext: src0 is the output gradient, src1 the softmax output.
    SoftMaxBack {
        /// The forward soft_max_ext's `scale`.
        scale: f32,
        /// The forward soft_max_ext's `max_bias`; always 0 (ggml's CPU backend implements only
        /// that, and the builder refuses other values).
        max_bias: f32,
    },
    /// Gradient of rope: rotation by -theta.
    RopeBack(Box<super::RopeParams>),
    /// Gradient of get_rows: rows of src0 summed into the rows picked by the ids in src1.
    GetRowsBack,
    /// Gradient of im2col with respect to its input.
    Im2colBack(super::Im2colBackParams),
    /// Gradient of pool_2d with respect to its input (src1).
    Pool2dBack(super::Pool2dParams),
    /// Gradients of q, k and v of (pre-flash_attn_ext) attention, packed in one vector.
    FlashAttnBack {
        /// Causal masking: query `i` of N sees keys `j <= M - N + i` of M.
        masked: bool,
    },
    // Vision: convolution, pooling, windows (graph/vision.rs).
    /// Patches of src1 unfolded into rows (1D or 2D), shaped by the kernel src0.
    Im2col {
        /// Stride, padding and dilation; the 1D form uses only `s0`, `p0` and `d0`.
        p: super::Conv2dParams,
        /// 2D patches (kernel [KW, KH, IC, ..]) rather than 1D (kernel [KW, IC, ..]).
        is_2d: bool,
    },
    /// Patches of a 3D input unfolded into rows.
    Im2col3d(super::Conv3dParams),
    /// GEMM columns scatter-added back into a 1D signal.
    Col2im1d {
        /// Stride: output positions between consecutive input columns, >= 1.
        s0: usize,
        /// Output channels: src0's `ne[0]` is `K * oc` for kernel size K.
        oc: usize,
        /// Padding cropped from both ends of the output.
        p0: usize,
    },
    /// Direct 2D convolution (kernel src0, input src1).
    Conv2d(super::Conv2dParams),
    /// Direct 3D convolution.
    Conv3d(super::Conv3dParams),
    /// Depthwise 2D convolution (WHCN or CWHN input).
    Conv2dDw(super::Conv2dParams),
    /// Transposed 1D convolution (padding 0, dilation 1).
    ConvTranspose1d {
        /// Stride, >= 1: the output has `(L - 1) * s0 + K` positions.
        s0: usize,
    },
    /// Transposed 2D convolution, padding 0.
    ConvTranspose2d {
        /// Stride on both axes, >= 1: output width `(W - 1) * stride + KW`, likewise height.
        stride: usize,
    },
    /// 1D pooling along dim 0.
    Pool1d {
        /// Max or average.
        op: super::PoolOp,
        /// Window length, >= 1.
        k0: usize,
        /// Stride, >= 1.
        s0: usize,
        /// Padding on both sides (never selected by max; average divides by the in-range count).
        p0: usize,
    },
    /// 2D pooling over dims 0 and 1 (padding is a float, as ggml's parameter).
    Pool2d {
        /// Max or average.
        op: super::PoolOp,
        /// Window width and height, >= 1.
        k: [usize; 2],
        /// Strides along width and height, >= 1.
        s: [usize; 2],
        /// Padding along width and height, 0 to 1e6: used as a float for the output size and
        /// truncated for the window offsets, as ggml does.
        p: [f32; 2],
    },
    /// Split into zero-padded square windows.
    WinPart {
        /// Windows across the width (src0's `ne[1]`, W): `ceil(W / w)`.
        npx: usize,
        /// Windows across the height (src0's `ne[2]`, H): `ceil(H / w)`.
        npy: usize,
        /// Window side in elements, >= 1.
        w: usize,
    },
    /// Join square windows back.
    WinUnpart {
        /// Window side in elements, as given to win_part.
        w: usize,
    },
    /// Relative position embeddings per (query, key) pair.
    GetRelPos,
    /// Decomposed relative positions added to attention scores.
    AddRelPos,
}

impl Op {
    /// ggml's op name (`ggml_op_name` / `ggml_unary_op_name` for unary ops).
    pub fn name(&self) -> &'static str {
        match self {
            Op::None => "none",
            Op::View => "view",
            Op::Cpy => "cpy",
            Op::Dup => "dup",
            Op::Add => "add",
            Op::Sub => "sub",
            Op::Mul => "mul",
            Op::Div => "div",
            Op::Scale { .. } => "scale",
            Op::Unary(u) => u.name(),
            Op::SoftMax { .. } => "soft_max",
            Op::RmsNorm { .. } => "rms_norm",
            Op::GetRows => "get_rows",
            Op::MulMat | Op::MulMatHadamard => "mul_mat",
            Op::Rope(_) => "rope",
            Op::FlashAttnExt(_) => "flash_attn_ext",
            Op::SetRows => "set_rows",
            Op::Gather(g) => match g {
                super::Gather::Concat { .. } => "concat",
                super::Gather::Repeat => "repeat",
                super::Gather::Pad { .. } => "pad",
                super::Gather::PadReflect1d { .. } => "pad_reflect_1d",
                super::Gather::Roll { .. } => "roll",
            },
            Op::RepeatBack => "repeat_back",
            Op::Arange { .. } => "arange",
            Op::TimestepEmbedding { .. } => "timestep_embedding",
            Op::Custom(_) | Op::CustomAny(_) => "custom",
            Op::ForwardSelect { .. } => "forward_select",
            Op::Upscale(_) => "upscale",
            Op::Set { .. } => "set",
            Op::Add1 => "add1",
            Op::AddId => "add_id",
            Op::Acc { .. } => "acc",
            Op::Clamp { .. } => "clamp",
            Op::LeakyRelu { .. } => "leaky_relu",
            Op::Sqr => "sqr",
            Op::Sqrt => "sqrt",
            Op::Log => "log",
            Op::Sin => "sin",
            Op::Cos => "cos",
            Op::Fill { .. } => "fill",
            Op::Tri(_) => "tri",
            Op::Diag => "diag",
            Op::DiagMaskInf { .. } => "diag_mask_inf",
            Op::DiagMaskZero { .. } => "diag_mask_zero",
            Op::Glu { op, .. } => op.name(),
            Op::Norm { .. } => "norm",
            Op::RmsNormMul { .. } => "rms_norm_mul",
            Op::GroupNorm { .. } => "group_norm",
            Op::L2Norm { .. } => "l2_norm",
            Op::Sum => "sum",
            Op::SumRows => "sum_rows",
            Op::Mean => "mean",
            Op::Cumsum => "cumsum",
            Op::Argmax => "argmax",
            Op::CountEqual => "count_equal",
            Op::Argsort(_) => "argsort",
            Op::TopK { .. } => "top_k",
            Op::MulMatId => "mul_mat_id",
            Op::OutProd => "out_prod",
            Op::SsmConv => "ssm_conv",
            Op::SsmScan { .. } => "ssm_scan",
            Op::RwkvWkv6 => "rwkv_wkv6",
            Op::GatedLinearAttn { .. } => "gated_linear_attn",
            Op::RwkvWkv7 => "rwkv_wkv7",
            Op::SolveTri => "solve_tri",
            Op::GatedDeltaNet { .. } => "gated_delta_net",
            Op::LightningIndexer => "lightning_indexer",
            Op::Dsv4HcComb { .. } => "dsv4_hc_comb",
            Op::Dsv4HcPre { .. } => "dsv4_hc_pre",
            Op::Dsv4HcPost => "dsv4_hc_post",
            Op::CrossEntropyLoss => "cross_entropy_loss",
            Op::CrossEntropyLossBack => "cross_entropy_loss_back",
            Op::OptStepAdamw => "opt_step_adamw",
            Op::OptStepSgd => "opt_step_sgd",
            Op::SiluBack => "silu_back",
            Op::RmsNormBack { .. } => "rms_norm_back",
            Op::SoftMaxBack { .. } => "soft_max_back",
            Op::RopeBack(_) => "rope_back",
            Op::GetRowsBack => "get_rows_back",
            Op::Im2colBack(_) => "im2col_back",
            Op::Pool2dBack(_) => "pool_2d_back",
            Op::FlashAttnBack { .. } => "flash_attn_back",
            Op::Im2col { .. } => "im2col",
            Op::Im2col3d(_) => "im2col_3d",
            Op::Col2im1d { .. } => "col2im_1d",
            Op::Conv2d(_) => "conv_2d",
            Op::Conv3d(_) => "conv_3d",
            Op::Conv2dDw(_) => "conv_2d_dw",
            Op::ConvTranspose1d { .. } => "conv_transpose_1d",
            Op::ConvTranspose2d { .. } => "conv_transpose_2d",
            Op::Pool1d { .. } => "pool_1d",
            Op::Pool2d { .. } => "pool_2d",
            Op::WinPart { .. } => "win_part",
            Op::WinUnpart { .. } => "win_unpart",
            Op::GetRelPos => "get_rel_pos",
            Op::AddRelPos => "add_rel_pos",
        }
    }
}

impl Graph {
    /// a + b with b broadcast over a (ggml_add); see [`Graph::add_cast`] for the result type
    /// and the quantized `a` case (an F32 `b` of `a`'s shape, the sum requantized).
    pub fn add(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary_impl(Op::Add, a, b, false)
    }
    /// a - b with b broadcast over a (ggml_sub).
    pub fn sub(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary_impl(Op::Sub, a, b, false)
    }
    /// a * b with b broadcast over a (ggml_mul).
    pub fn mul(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary_impl(Op::Mul, a, b, false)
    }
    /// a / b with b broadcast over a (ggml_div).
    pub fn div(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary_impl(Op::Div, a, b, false)
    }

    fn unary_f32(&mut self, op: Op, a: TensorId) -> Result<TensorId> {
        let name = op.name();
        let ta = self.get(name, a)?;
        if ta.dtype != DType::F32 {
            return Err(Error::ty(name, format!("{} (this op takes F32)", ta.describe(a))));
        }
        let ne = ta.ne;
        self.node(op, DType::F32, ne, &[a])
    }

    /// a * s (ggml_scale), F32 or BF16 (the result has `a`'s type).
    pub fn scale(&mut self, a: TensorId, s: f32) -> Result<TensorId> {
        self.scale_bias(a, s, 0.0)
    }

    /// a * s + b (ggml_scale_bias), F32 or BF16 (the result has `a`'s type; BF16 is computed
    /// in f32 and rounded once).
    pub fn scale_bias(&mut self, a: TensorId, s: f32, b: f32) -> Result<TensorId> {
        let op = Op::Scale { scale: s, bias: b };
        let ta = self.get("scale", a)?;
        if ta.dtype == DType::BF16 {
            if !ta.rows_contiguous() {
                return Err(Error::shape(
                    "scale",
                    format!("rows of {} are not contiguous", ta.describe(a)),
                ));
            }
            let ne = ta.ne;
            return self.node(op, DType::BF16, ne, &[a]);
        }
        self.unary_f32(op, a)
    }

    /// An elementwise activation (ggml_unary).
    pub fn unary(&mut self, a: TensorId, op: UnaryOp) -> Result<TensorId> {
        self.unary_impl(a, op, false)
    }
    /// ggml_silu.
    pub fn silu(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary(a, UnaryOp::Silu)
    }
    /// ggml_gelu (tanh approximation).
    pub fn gelu(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary(a, UnaryOp::Gelu)
    }
    /// ggml_relu.
    pub fn relu(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary(a, UnaryOp::Relu)
    }

    /// RMS normalisation along rows (ggml_rms_norm); `eps` must be finite and >= 0.
    pub fn rms_norm(&mut self, a: TensorId, eps: f32) -> Result<TensorId> {
        if !(eps >= 0.0 && eps.is_finite()) {
            return Err(Error::param("rms_norm", format!("eps = {eps} must be finite and >= 0")));
        }
        self.unary_f32(Op::RmsNorm { eps }, a)
    }

    /// Softmax along rows (ggml_soft_max).
    pub fn soft_max(&mut self, a: TensorId) -> Result<TensorId> {
        self.soft_max_ext(a, None, 1.0, 0.0)
    }

    /// softmax(a * scale + slope * mask) along rows (ggml_soft_max_ext). The mask (F16 or F32) has
    /// `ne[0] == a.ne[0]`, at least `a.ne[1]` rows, and broadcasts over dims 2 and 3; `max_bias > 0`
    /// turns on ALiBi slopes per head (dim 2).
    pub fn soft_max_ext(
        &mut self,
        a: TensorId,
        mask: Option<TensorId>,
        scale: f32,
        max_bias: f32,
    ) -> Result<TensorId> {
        const OP: &str = "soft_max_ext";
        let ta = self.get(OP, a)?;
        if ta.dtype != DType::F32 {
            return Err(Error::ty(OP, format!("{} (a must be F32)", ta.describe(a))));
        }
        if !ta.rows_contiguous() {
            return Err(Error::shape(OP, format!("rows of {} are not contiguous", ta.describe(a))));
        }
        if !scale.is_finite() || !max_bias.is_finite() || max_bias < 0.0 {
            return Err(Error::param(OP, format!("scale = {scale}, max_bias = {max_bias}")));
        }
        let ne = ta.ne;
        if let Some(m) = mask {
            let tm = self.get(OP, m)?;
            if !matches!(tm.dtype, DType::F16 | DType::F32) {
                return Err(Error::ty(OP, format!("mask {} must be F16 or F32", tm.describe(m))));
            }
            if !tm.rows_contiguous()
                || tm.ne[0] != ne[0]
                || tm.ne[1] < ne[1]
                || !super::divides(tm.ne[2], ne[2])
                || !super::divides(tm.ne[3], ne[3])
            {
                return Err(Error::shape(
                    OP,
                    format!(
                        "mask {} does not fit {}: need contiguous rows, ne[0] == {}, ne[1] >= {}, and dims 2, 3 dividing {} and {}",
                        tm.describe(m),
                        ta.describe(a),
                        ne[0],
                        ne[1],
                        ne[2],
                        ne[3]
                    ),
                ));
            }
        } else if max_bias > 0.0 {
            return Err(Error::param(OP, "max_bias > 0 (ALiBi) needs a mask"));
        }
        self.node_opt(Op::SoftMax { scale, max_bias }, DType::F32, ne, &[Some(a), mask])
    }

    /// soft_max_ext with attention sinks (ggml_soft_max_add_sinks): `sinks` F32 \[a.ne\[2\]\] adds one
    /// extra logit per head (dim 2) to every row's normalisation.
    pub fn soft_max_ext_sinks(
        &mut self,
        a: TensorId,
        mask: Option<TensorId>,
        sinks: TensorId,
        scale: f32,
        max_bias: f32,
    ) -> Result<TensorId> {
        let ts = self.get("soft_max_ext", sinks)?;
        let n_head = self.get("soft_max_ext", a)?.ne[2];
        if ts.dtype != DType::F32 || ts.ne != [n_head, 1, 1, 1] {
            return Err(Error::shape(
                "soft_max_ext",
                format!("sinks {} must be F32 [{n_head}]", ts.describe(sinks)),
            ));
        }
        let id = self.soft_max_ext(a, mask, scale, max_bias)?;
        self.tensors[id.index()].src[2] = Some(sinks);
        Ok(id)
    }

    /// Rows of `a` selected by the I32 `ids` (ggml_get_rows): `a` is [n, rows, b, c], `ids`
    /// [k, b, c]; the result is F32 [n, k, b, c]. Out-of-range ids make compute return `Err`.
    pub fn get_rows(&mut self, a: TensorId, ids: TensorId) -> Result<TensorId> {
        const OP: &str = "get_rows";
        let ta = self.get(OP, a)?;
        let ti = self.get(OP, ids)?;
        if ti.dtype != DType::I32 {
            return Err(Error::ty(OP, format!("ids {} must be I32", ti.describe(ids))));
        }
        if !matches!(ta.dtype, DType::F32 | DType::F16 | DType::I32)
            && crate::quant::format(ta.dtype).dequantize.is_none()
        {
            return Err(Error::ty(OP, format!("{} cannot be converted to F32", ta.describe(a))));
        }
        if ti.ne[3] != 1 || ta.ne[2] != ti.ne[1] || ta.ne[3] != ti.ne[2] {
            return Err(Error::shape(
                OP,
                format!(
                    "ids {} do not fit {}: need ids.ne[1] == a.ne[2], ids.ne[2] == a.ne[3], ids.ne[3] == 1",
                    ti.describe(ids),
                    ta.describe(a)
                ),
            ));
        }
        if !ta.rows_contiguous() {
            return Err(Error::shape(OP, format!("rows of {} are not contiguous", ta.describe(a))));
        }
        let ne = [ta.ne[0], ti.ne[0], ti.ne[1], ti.ne[2]];
        // An I32 table gives I32 rows (ggml's get_rows_i32); every other type converts to F32.
        let out = if ta.dtype == DType::I32 { DType::I32 } else { DType::F32 };
        self.node(Op::GetRows, out, ne, &[a, ids])
    }

    /// Matrix product (ggml_mul_mat): `a` [k, m, p, q] (weights, any type with a dot product),
    /// `b` [k, n, p*r, q*s] F32; result F32 [m, n, p*r, q*s]. `a` is broadcast over dims 2 and 3.
    pub fn mul_mat(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        let ne = self.mul_mat_checks(a, b)?;
        self.node(Op::MulMat, DType::F32, ne, &[a, b])
    }

    /// The dense product's checks; its result shape.
    fn mul_mat_checks(&self, a: TensorId, b: TensorId) -> Result<[usize; 4]> {
        const OP: &str = "mul_mat";
        let ta = self.get(OP, a)?;
        let tb = self.get(OP, b)?;
        if ta.ne[0] != tb.ne[0]
            || !super::divides(ta.ne[2], tb.ne[2])
            || !super::divides(ta.ne[3], tb.ne[3])
        {
            return Err(Error::shape(
                OP,
                format!(
                    "{} x {}: need equal ne[0] and a's dims 2, 3 dividing b's",
                    ta.describe(a),
                    tb.describe(b)
                ),
            ));
        }
        // Rows of no elements have no layout (ne[0] = 0 makes every row stride 0, which the
        // transposition test below would misread).
        if ta.ne[0] == 0 {
            return Err(Error::shape(
                OP,
                format!(
                    "{} x {}: the shared dimension ne[0] is 0; mul_mat needs at least one element per row",
                    ta.describe(a),
                    tb.describe(b)
                ),
            ));
        }
        if ta.nb[0] > ta.nb[1] && ta.ne[1] > 1 {
            return Err(Error::shape(
                OP,
                format!("a {} is transposed; use cont first", ta.describe(a)),
            ));
        }
        if !ta.rows_contiguous() {
            return Err(Error::shape(
                OP,
                format!("rows of a {} are not contiguous", ta.describe(a)),
            ));
        }
        let vd = ta.dtype.vec_dot_type();
        let kt = crate::kernels::table();
        // BF16 activations of F32 weights are widened to f32 (ggml's CPU does the same).
        let ok_b = tb.dtype == DType::F32
            || tb.dtype == vd
            || (tb.dtype == DType::BF16 && vd == DType::F32);
        if kt.vec_dot(ta.dtype).is_none()
            || (tb.dtype != vd && kt.activation_converter(vd).is_none())
            || !ok_b
        {
            return Err(Error::ty(
                OP,
                format!(
                    "{} x {}: a needs a dot product with {vd}, b must be F32 or {vd} (or BF16 with F32 a)",
                    ta.describe(a),
                    tb.describe(b)
                ),
            ));
        }
        if tb.dtype != DType::F32 && !tb.rows_contiguous() {
            return Err(Error::shape(
                OP,
                format!("rows of b {} are not contiguous", tb.describe(b)),
            ));
        }
        if self.is_repacked(a) && tb.dtype != DType::F32 {
            return Err(Error::ty(
                OP,
                format!(
                    "{} is stored repacked: b must be F32, got {}",
                    ta.describe(a),
                    tb.describe(b)
                ),
            ));
        }
        Ok([ta.ne[1], tb.ne[1], tb.ne[2], tb.ne[3]])
    }

    /// ggml_mul_mat_set_hint: tells the backend what it may assume about a `mul_mat` node's
    /// weights. With [`MatMulHint::Src0IsHadamard`] the node computes `b`'s rows times the
    /// normalised Sylvester Hadamard matrix `H_n / sqrt(n)` with a fast Walsh-Hadamard transform
    /// (`O(n log n)` per row) and does not read `a` at all: the caller promises that `a` holds
    /// that matrix. It needs `a` F32 \[n, n\] with `n` a power of two, and `b` F32 or F16 with
    /// contiguous rows. [`MatMulHint::None`] restores the dense product.
    pub fn mul_mat_set_hint(&mut self, node: TensorId, hint: MatMulHint) -> Result<()> {
        const OP: &str = "mul_mat_set_hint";
        let t = self.get(OP, node)?;
        if !matches!(t.op, Op::MulMat | Op::MulMatHadamard) {
            return Err(Error::arg(format!(
                "{OP}: {} is a {} node, not mul_mat",
                t.describe(node),
                t.op.name()
            )));
        }
        let (a, b) = (t.src[0].expect("mul_mat a"), t.src[1].expect("mul_mat b"));
        let op = match hint {
            MatMulHint::None => {
                // The dense product's own checks (an F16 b, say, has no dense form).
                self.mul_mat_checks(a, b)?;
                Op::MulMat
            }
            MatMulHint::Src0IsHadamard => {
                self.hadamard_checks(OP, a, b)?;
                Op::MulMatHadamard
            }
        };
        let idx = self.index_of(node).expect("checked by get");
        self.tensors[idx].op = op;
        Ok(())
    }

    /// [`Graph::mul_mat`] with a hint from the start (see [`Graph::mul_mat_set_hint`]); with
    /// [`MatMulHint::Src0IsHadamard`], `b` may also be F16.
    pub fn mul_mat_with_hint(
        &mut self,
        a: TensorId,
        b: TensorId,
        hint: MatMulHint,
    ) -> Result<TensorId> {
        match hint {
            MatMulHint::None => self.mul_mat(a, b),
            MatMulHint::Src0IsHadamard => {
                self.hadamard_checks("mul_mat", a, b)?;
                let tb = self.get("mul_mat", b)?;
                let (n, ne) = (tb.ne[0], tb.ne);
                self.node(Op::MulMatHadamard, DType::F32, [n, ne[1], ne[2], ne[3]], &[a, b])
            }
        }
    }

    fn hadamard_checks(&self, op: &'static str, a: TensorId, b: TensorId) -> Result<()> {
        let (ta, tb) = (self.get(op, a)?, self.get(op, b)?);
        let n = ta.ne[0];
        if ta.dtype != DType::F32 || !matches!(tb.dtype, DType::F32 | DType::F16) {
            return Err(Error::ty(
                op,
                format!(
                    "the Hadamard form needs a F32 and b F32 or F16, got {} x {}",
                    ta.describe(a),
                    tb.describe(b)
                ),
            ));
        }
        if !n.is_power_of_two() || ta.ne != [n, n, 1, 1] || tb.ne[0] != n || !tb.rows_contiguous() {
            return Err(Error::shape(
                op,
                format!(
                    "the Hadamard form needs a [n, n] with n a power of two and b [n, ...] with contiguous rows, got {} x {}",
                    ta.describe(a),
                    tb.describe(b)
                ),
            ));
        }
        Ok(())
    }

    /// Copies `a` into the memory of `dst` (ggml_cpy), converting between F32 and F16; same number
    /// of elements, any layouts. The result is a view of `dst`: use it (or `dst`) downstream.
    pub fn cpy(&mut self, a: TensorId, dst: TensorId) -> Result<TensorId> {
        const OP: &str = "cpy";
        let ta = self.get(OP, a)?;
        let td = self.get(OP, dst)?;
        if ta.nelements() != td.nelements() {
            return Err(Error::shape(
                OP,
                format!(
                    "{} and {} have different element counts",
                    ta.describe(a),
                    td.describe(dst)
                ),
            ));
        }
        check_copy(OP, ta, td)?;
        super::check_no_self_overlap(OP, td, dst)?;
        self.check_apart(OP, dst, a, "source")?;
        if matches!(self.t(self.root(dst)).leaf, super::Leaf::Weight { .. }) {
            return Err(Error::Buffer(format!(
                "cpy: destination {} is a read-only weight",
                td.describe(dst)
            )));
        }
        let (dt, ne, nb) = (td.dtype, td.ne, td.nb);
        let root = self.root(dst);
        let offs = if self.t(dst).view_src.is_some() { self.t(dst).view_offs } else { 0 };
        let id = self.push(super::Tensor {
            dtype: dt,
            ne,
            nb,
            op: Op::Cpy,
            src: [Some(a), Some(dst), None, None, None, None, None, None, None, None],
            view_src: Some(root),
            view_offs: offs,
            leaf: super::Leaf::None,
            name: None,
            output: false,
        })?;
        Ok(id)
    }

    /// A contiguous copy of `a` (ggml_dup / ggml_cont).
    pub fn cont(&mut self, a: TensorId) -> Result<TensorId> {
        let ta = self.get("cont", a)?;
        let (dt, ne) = (ta.dtype, ta.ne);
        let mut out = ta.clone();
        out.nb = super::contiguous_strides(dt, &ne);
        check_copy("cont", ta, &out)?;
        self.node(Op::Dup, dt, ne, &[a])
    }

    /// A contiguous copy of `a` in type `dtype` (ggml_cast).
    pub fn cast(&mut self, a: TensorId, dtype: DType) -> Result<TensorId> {
        let ta = self.get("cast", a)?;
        let ne = ta.ne;
        if ne[0] % dtype.block_size() != 0 {
            return Err(Error::shape(
                "cast",
                format!("{} rows are not whole {dtype} blocks", ta.describe(a)),
            ));
        }
        let mut out = ta.clone();
        out.dtype = dtype;
        out.nb = super::contiguous_strides(dtype, &ne);
        check_copy("cast", ta, &out)?;
        self.node(Op::Dup, dtype, ne, &[a])
    }

    /// A contiguous copy of `a` with a new shape (ggml_cont_4d and friends).
    pub fn cont_reshape(&mut self, a: TensorId, ne: &[usize]) -> Result<TensorId> {
        let c = self.cont(a)?;
        self.reshape(c, ne)
    }

    /// Describes a node for messages: "add 'x' f32 [4, 3, 1, 1]".
    pub(crate) fn describe(&self, id: TensorId) -> String {
        let t = self.t(id);
        format!("{} {}", t.op.name(), t.describe(id))
    }
}

/// Plain element types a copy converts element by element.
pub(crate) fn plain(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::BF16 | DType::I32)
}

/// ggml's copy rules: plain types element by element with any layouts (floats among themselves,
/// I32 with F32); anything block-quantized row by row with equal row lengths and row counts.
pub(crate) fn check_copy(op: &'static str, a: &super::Tensor, d: &super::Tensor) -> Result<()> {
    let (from, to) = (a.dtype, d.dtype);
    let float = |t: DType| matches!(t, DType::F32 | DType::F16 | DType::BF16);
    if plain(from) && plain(to) {
        let ok = from == to
            || (float(from) && float(to))
            || matches!((from, to), (DType::I32, DType::F32) | (DType::F32, DType::I32));
        return if ok {
            Ok(())
        } else {
            Err(Error::ty(op, format!("copy from {from} to {to} is not supported")))
        };
    }
    let readable = float(from) || crate::quant::format(from).dequantize.is_some();
    let f = crate::quant::format(to);
    let writable =
        float(to) || (!f.requires_imatrix && (f.quantize.is_some() || f.from_float.is_some()));
    if !(readable && writable) || (from != to && (from.is_integer() || to.is_integer())) {
        return Err(Error::ty(op, format!("copy from {from} to {to} is not supported")));
    }
    if a.ne[0] != d.ne[0] || a.nrows() != d.nrows() || !a.rows_contiguous() || !d.rows_contiguous()
    {
        return Err(Error::shape(
            op,
            format!(
                "copies involving block types go row by row: need equal ne[0], equal row counts and contiguous rows ({} -> {})",
                shape_str(&a.ne),
                shape_str(&d.ne)
            ),
        ));
    }
    Ok(())
}

impl Graph {
    /// ggml_build_forward_select: a graph of fixed topology whose result comes from one of
    /// several branches. Every branch is built into the graph and planned, but a compute runs
    /// only the selected one (and what it depends on); the result is a copy of it. `branches`
    /// (1 to [`MAX_SRC`](crate::graph::MAX_SRC)) share type and shape and have contiguous rows;
    /// `idx` is the initial choice, changed per compute with
    /// [`Plan::set_select`](crate::Plan::set_select) without planning again.
    pub fn forward_select(&mut self, branches: &[TensorId], idx: usize) -> Result<TensorId> {
        const OP: &str = "forward_select";
        if branches.is_empty() || branches.len() > super::MAX_SRC {
            return Err(Error::param(
                OP,
                format!("{} branches: need 1 to {}", branches.len(), super::MAX_SRC),
            ));
        }
        if idx >= branches.len() {
            return Err(Error::param(OP, format!("idx = {idx} with {} branches", branches.len())));
        }
        let first = self.get(OP, branches[0])?;
        let (dtype, ne) = (first.dtype, first.ne);
        for &b in branches {
            let t = self.get(OP, b)?;
            if t.dtype != dtype || t.ne != ne || !t.rows_contiguous() {
                return Err(Error::shape(
                    OP,
                    format!(
                        "branch {} must have the type and shape of {} and contiguous rows",
                        t.describe(b),
                        self.t(branches[0]).describe(branches[0])
                    ),
                ));
            }
        }
        self.node(Op::ForwardSelect { idx }, dtype, ne, branches)
    }

    /// The selected branch of a `forward_select` node.
    pub(crate) fn set_selected(&mut self, node: TensorId, idx: usize) -> Result<()> {
        const OP: &str = "set_select";
        let t = self.get(OP, node)?;
        let Op::ForwardSelect { .. } = t.op else {
            return Err(Error::arg(format!(
                "{OP}: {} is a {} node, not forward_select",
                t.describe(node),
                t.op.name()
            )));
        };
        let n = t.srcs().count();
        if idx >= n {
            return Err(Error::param(
                OP,
                format!("idx = {idx} for {} with {n} branches", t.describe(node)),
            ));
        }
        let i = self.index_of(node).expect("checked by get");
        self.tensors[i].op = Op::ForwardSelect { idx };
        Ok(())
    }
}
