//! Compute drivers, one file per op family. Each reads its node's parameters, splits the work by
//! `(ith, nth)` and calls kernels from its plan's `KernelTable` (`NodeCtx::kt`), never through the
//! process-wide default. Shapes and types were checked when the graph was built, so drivers only
//! `debug_assert!`; what only the data can tell (an index out of range) returns `Err`.

mod backward;
mod binary;
mod conv;
mod cpy;
mod custom;
mod delta_net;
mod dsv4;
mod elementwise;
mod flash_attn;
mod flash_attn_tiled;
mod gather;
mod gemm;
mod get_rows;
mod glu;
mod mul_mat;
mod mul_mat_f;
mod mul_mat_id;
mod mul_mat_q;
mod mul_mat_repack;
mod node;
mod norm;
mod out_prod;
mod pool;
mod reduce;
mod rope;
mod rwkv;
mod set_rows;
mod softmax;
mod ssm;
mod train;
mod unary;
mod upscale;
mod window;

pub(crate) use node::{ExecNode, TView, align_up};

use crate::error::{Error, Result};
use crate::graph::{Graph, Op, TensorId};
use crate::kernels::KernelTable;
use std::sync::atomic::AtomicUsize;

/// What a worker gets for one node.
pub(crate) struct NodeCtx<'a> {
    pub node: &'a ExecNode,
    /// The plan's work buffer (shared by all threads; ops carve it up).
    pub work: *mut u8,
    pub work_len: usize,
    /// A chunk counter, zero at the start of every phase.
    pub counter: &'a AtomicUsize,
    pub nth: usize,
    /// The plan's kernel table (the backend's tier, fixed when the plan was built). Ops read
    /// every kernel here, never through the process-wide default, so all phases, workers and
    /// computes of a plan agree on the tier and on the data layouts it implies.
    pub kt: &'static KernelTable,
}

impl NodeCtx<'_> {
    pub(crate) fn src(&self, i: usize) -> &TView {
        // Builders guarantee the sources each op reads; a missing one is an internal bug that the
        // executor turns into an error through catch_unwind.
        self.node.src[i].as_ref().expect("op source present")
    }
    pub(crate) fn dst(&self) -> &TView {
        &self.node.dst
    }
}

/// Rows `[start, end)` of `n` for worker `ith` of `nth` (ggml's contiguous split).
pub(crate) fn split(n: usize, ith: usize, nth: usize) -> (usize, usize) {
    let per = n.div_ceil(nth);
    let start = (per * ith).min(n);
    (start, (start + per).min(n))
}

/// ggml's ALiBi slope for head `h` of `n_head` (1 when `max_bias` is 0), as soft_max and
/// flash_attn_ext compute it.
pub(crate) fn alibi_slope(max_bias: f32, n_head: usize, h: usize) -> f32 {
    if max_bias <= 0.0 {
        return 1.0;
    }
    let n_head_log2 = 1u32 << (n_head as u32).max(1).ilog2();
    let h = h as u32;
    if h < n_head_log2 {
        2f32.powf(-max_bias / n_head_log2 as f32).powi(h as i32 + 1)
    } else {
        2f32.powf(-(max_bias / 2.0) / n_head_log2 as f32).powi(2 * (h - n_head_log2) as i32 + 1)
    }
}

/// Decomposes a flat row index into (i1, i2, i3).
#[inline(always)]
pub(crate) fn unravel_row(r: usize, ne: &[usize; 4]) -> (usize, usize, usize) {
    let i1 = r % ne[1];
    let i2 = (r / ne[1]) % ne[2];
    let i3 = r / (ne[1] * ne[2]);
    (i1, i2, i3)
}

/// Checks that the CPU backend can run node `id` (its kernels exist for these types).
pub(crate) fn supports(graph: &Graph, id: TensorId, kt: &KernelTable) -> Result<()> {
    let t = graph.get("supports_op", id)?;
    let unsupported =
        |msg: String| Error::Unsupported { op: t.op.name(), backend: "CPU".into(), msg };
    match &t.op {
        Op::MulMat => {
            let a = graph.t(t.src[0].expect("mul_mat a"));
            let vd = a.dtype.vec_dot_type();
            if kt.vec_dot(a.dtype).is_none() || kt.activation_converter(vd).is_none() {
                return Err(unsupported(format!("no {} x {vd} dot product kernel", a.dtype)));
            }
            Ok(())
        }
        Op::GetRows => {
            let a = graph.t(t.src[0].expect("get_rows a"));
            if get_rows::row_converter(kt, a.dtype).is_none() {
                return Err(unsupported(format!("cannot convert {} rows to f32", a.dtype)));
            }
            Ok(())
        }
        Op::MulMatId => {
            let a = graph.t(t.src[0].expect("mul_mat_id as"));
            let b = graph.t(t.src[1].expect("mul_mat_id b"));
            mul_mat_id::check_kernels(kt, a.dtype, b.dtype).map_err(unsupported)
        }
        _ => Ok(()),
    }
}

/// Number of barrier-separated phases of a node.
pub(crate) fn phases(node: &ExecNode, kt: &KernelTable) -> u8 {
    match node.op {
        Op::MulMat => mul_mat::phases(node),
        Op::FlashAttnExt(_) => flash_attn::phases(node),
        Op::Set { .. } => 2,
        // acc: copy, then accumulate; count_equal: count, then add the per-thread counts.
        Op::Acc { .. } | Op::CountEqual => 2,
        // convert b and group it by expert, then the expert chunks
        Op::MulMatId => mul_mat_id::phases(node, kt),
        // per-row loss terms, then their sum in row order
        Op::CrossEntropyLoss => 2,
        // pack the operands into the work buffer, then compute
        Op::Conv2d(_) | Op::Conv3d(_) | Op::ConvTranspose1d { .. } | Op::ConvTranspose2d { .. } => {
            2
        }
        _ => 1,
    }
}

/// Work-buffer bytes a node needs with `nth` threads.
pub(crate) fn work_size(node: &ExecNode, nth: usize, kt: &KernelTable) -> usize {
    match node.op {
        Op::MulMat => mul_mat::work_size(node, nth),
        Op::Add | Op::Add1 => elementwise::quant_row_work_size(node, nth),
        Op::Rope(_) => rope::work_size(node, nth),
        Op::Cpy | Op::Dup => cpy::work_size(node, nth),
        Op::SetRows => set_rows::work_size(node, nth),
        Op::SoftMax { .. } => softmax::work_size(node, nth),
        Op::FlashAttnExt(_) => flash_attn::work_size(node, nth),
        Op::CountEqual | Op::TopK { .. } => reduce::work_size(node, nth),
        Op::MulMatId => mul_mat_id::work_size(node, nth, kt),
        Op::OutProd => out_prod::work_size(node, nth),
        Op::GatedDeltaNet { .. } => delta_net::gdn_work_size(node, nth),
        Op::LightningIndexer => dsv4::li_work_size(node, nth),
        Op::CrossEntropyLoss => train::work_size(node, nth),
        Op::RopeBack(_) => rope::work_size(node, nth),
        Op::FlashAttnBack { .. } => backward::flash_attn_back_work_size(node, nth),
        Op::Conv2d(_) | Op::Conv3d(_) => conv::conv_work_size(node, nth),
        Op::Im2col { .. } | Op::Im2col3d(_) => conv::im2col_work_size(node, nth),
        Op::ConvTranspose1d { .. } | Op::ConvTranspose2d { .. } => conv::convt_work_size(node, nth),
        _ => 0,
    }
}

/// Runs worker `ith`'s share of `phase` of the node.
pub(crate) fn compute(ctx: &NodeCtx<'_>, phase: u8, ith: usize) -> Result<()> {
    match &ctx.node.op {
        Op::None | Op::View => Ok(()),
        Op::Add | Op::Sub | Op::Mul | Op::Div => binary::compute(ctx, ith),
        Op::Scale { scale, bias } => unary::scale(ctx, ith, *scale, *bias),
        Op::Unary(u) => unary::compute(ctx, ith, *u),
        Op::RmsNorm { eps } => norm::rms_norm(ctx, ith, *eps),
        Op::SoftMax { scale, max_bias } => softmax::compute(ctx, ith, *scale, *max_bias),
        Op::GetRows => get_rows::compute(ctx, ith),
        Op::Cpy | Op::Dup => cpy::compute(ctx, ith),
        Op::MulMat => mul_mat::compute(ctx, phase, ith),
        Op::Rope(p) => rope::compute(ctx, ith, p),
        Op::FlashAttnExt(p) => flash_attn::compute(ctx, phase, ith, p),
        Op::SetRows => set_rows::compute(ctx, ith),
        Op::Gather(g) => gather::compute(ctx, ith, g),
        Op::RepeatBack => gather::repeat_back(ctx, ith),
        Op::Custom(op) => custom::compute(ctx, ith, op),
        Op::Upscale(m) => upscale::compute(ctx, ith, *m),
        Op::Set { nb, offset } => gather::set(ctx, phase, ith, *nb, *offset),
        Op::Arange { start, step } => gather::arange(ctx, ith, *start, *step),
        Op::TimestepEmbedding { dim, max_period } => {
            gather::timestep_embedding(ctx, ith, *dim, *max_period)
        }
        // Elementwise, GLU, norms, reductions and sorting.
        Op::Add1 => elementwise::add1(ctx, ith),
        Op::AddId => elementwise::add_id(ctx, ith),
        Op::Acc { nb1, nb2, nb3, offset } => {
            elementwise::acc(ctx, phase, ith, [*nb1, *nb2, *nb3], *offset)
        }
        Op::Clamp { .. }
        | Op::LeakyRelu { .. }
        | Op::Sqr
        | Op::Sqrt
        | Op::Log
        | Op::Sin
        | Op::Cos => elementwise::simple(ctx, ith),
        Op::Fill { value } => elementwise::fill(ctx, ith, *value),
        Op::Tri(kind) => elementwise::tri(ctx, ith, *kind),
        Op::Diag => elementwise::diag(ctx, ith),
        Op::DiagMaskInf { n_past } => elementwise::diag_mask(ctx, ith, *n_past, f32::NEG_INFINITY),
        Op::DiagMaskZero { n_past } => elementwise::diag_mask(ctx, ith, *n_past, 0.0),
        Op::Glu { op, swapped, alpha, limit } => {
            glu::compute(ctx, ith, *op, *swapped, *alpha, *limit)
        }
        Op::Norm { eps } => norm::norm(ctx, ith, *eps),
        Op::RmsNormMul { eps } => norm::rms_norm_mul(ctx, ith, *eps),
        Op::GroupNorm { n_groups, eps } => norm::group_norm(ctx, ith, *n_groups, *eps),
        Op::L2Norm { eps } => norm::l2_norm(ctx, ith, *eps),
        Op::Sum => reduce::sum(ctx, ith),
        Op::SumRows => reduce::sum_rows(ctx, ith, false),
        Op::Mean => reduce::sum_rows(ctx, ith, true),
        Op::Cumsum => reduce::cumsum(ctx, ith),
        Op::Argmax => reduce::argmax(ctx, ith),
        Op::CountEqual => reduce::count_equal(ctx, phase, ith),
        Op::Argsort(order) => reduce::argsort(ctx, ith, *order),
        Op::TopK { k } => reduce::top_k(ctx, ith, *k),
        // Mixture of experts.
        Op::MulMatId => mul_mat_id::compute(ctx, phase, ith),
        Op::OutProd => out_prod::compute(ctx, ith),
        // State-space, recurrent and other sequence-mixing ops.
        Op::SsmConv => ssm::ssm_conv(ctx, ith),
        Op::SsmScan { k } => ssm::ssm_scan(ctx, ith, *k),
        Op::RwkvWkv6 => rwkv::wkv6(ctx, ith),
        Op::GatedLinearAttn { scale } => rwkv::gla(ctx, ith, *scale),
        Op::RwkvWkv7 => rwkv::wkv7(ctx, ith),
        Op::SolveTri => delta_net::solve_tri(ctx, ith),
        Op::GatedDeltaNet { k } => delta_net::gated_delta_net(ctx, ith, *k),
        Op::LightningIndexer => dsv4::lightning_indexer(ctx, ith),
        Op::Dsv4HcComb { eps, n_iter } => dsv4::hc_comb(ctx, ith, *eps, *n_iter),
        Op::Dsv4HcPre => dsv4::hc_pre(ctx, ith),
        Op::Dsv4HcPost => dsv4::hc_post(ctx, ith),
        // Training: losses, optimizer steps and backward ops.
        Op::CrossEntropyLoss => train::cross_entropy_loss(ctx, phase, ith),
        Op::CrossEntropyLossBack => train::cross_entropy_loss_back(ctx, ith),
        Op::OptStepAdamw => train::opt_step_adamw(ctx, ith),
        Op::OptStepSgd => train::opt_step_sgd(ctx, ith),
        Op::SiluBack => backward::silu_back(ctx, ith),
        Op::RmsNormBack { eps } => backward::rms_norm_back(ctx, ith, *eps),
        Op::SoftMaxBack { scale, .. } => backward::soft_max_back(ctx, ith, *scale),
        Op::RopeBack(p) => rope::compute_back(ctx, ith, p),
        Op::GetRowsBack => backward::get_rows_back(ctx, ith),
        Op::Im2colBack(p) => backward::im2col_back(ctx, ith, p),
        Op::Pool2dBack(p) => backward::pool_2d_back(ctx, ith, p),
        Op::FlashAttnBack { masked } => backward::flash_attn_back(ctx, ith, *masked),
        // Vision: convolution, pooling, windows.
        Op::Im2col { p, is_2d } => conv::im2col(ctx, ith, p, *is_2d),
        Op::Im2col3d(p) => conv::im2col_3d(ctx, ith, p),
        Op::Col2im1d { s0, oc, p0 } => conv::col2im_1d(ctx, ith, *s0, *oc, *p0),
        Op::Conv2d(p) => conv::conv_2d(ctx, phase, ith, p),
        Op::Conv3d(p) => conv::conv_3d(ctx, phase, ith, p),
        Op::Conv2dDw(p) => conv::conv_2d_dw(ctx, ith, p),
        Op::ConvTranspose1d { s0 } => conv::conv_transpose_1d(ctx, phase, ith, *s0),
        Op::ConvTranspose2d { stride } => conv::conv_transpose_2d(ctx, phase, ith, *stride),
        Op::Pool1d { op, k0, s0, p0 } => pool::pool_1d(ctx, ith, *op, *k0, *s0, *p0),
        Op::Pool2d { op, k, s, p } => pool::pool_2d(ctx, ith, *op, *k, *s, *p),
        Op::WinPart { npx, w, .. } => window::win_part(ctx, ith, *npx, *w),
        Op::WinUnpart { w } => window::win_unpart(ctx, ith, *w),
        Op::GetRelPos => window::get_rel_pos(ctx, ith),
        Op::AddRelPos => window::add_rel_pos(ctx, ith),
    }
}
