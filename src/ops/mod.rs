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
mod hadamard;
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
mod select;
mod set_rows;
mod softmax;
mod ssm;
mod train;
mod unary;
mod upscale;
mod window;

pub(crate) use node::{DstRows, ExecNode, TView, align_up};

use crate::error::Result;
use crate::graph::{Graph, Op, Tensor, TensorId};
use crate::kernels::KernelTable;
use std::cell::Cell;
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
    /// This worker's index (`< nth`).
    pub ith: usize,
    /// Whether this worker has taken its destination rows / its scratch in this phase: each is
    /// lent once, so a worker never holds two `&mut` to the same memory.
    pub taken: [Cell<bool>; 2],
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
    /// Marks lending `k` (0: rows, 1: scratch) as taken; panics on a second take.
    fn take(&self, k: usize, ith: usize) {
        assert!(ith == self.ith && ith < self.nth, "worker {} asked for {ith}'s share", self.ith);
        assert!(!self.taken[k].replace(true), "a worker's share is lent once per phase");
    }
    /// Worker `ith`'s share of the destination's rows (ggml's contiguous split), once per phase.
    pub(crate) fn dst_rows(&self, ith: usize) -> DstRows<'_> {
        self.take(0, ith);
        let d = self.dst();
        let (r0, r1) = split(d.nrows(), ith, self.nth);
        // SAFETY: each worker has its own `NodeCtx` with a distinct `ith < nth` (checked by
        // `take`, which also lends the rows once per phase), and `split` gives distinct indices
        // disjoint ranges.
        unsafe { DstRows::new(d, r0, r1) }
    }
    /// Worker `ith`'s scratch: `n` values of `T` at byte `ith * stride` of the work buffer
    /// (each op's `work_size` reserves `nth` such slots), once per phase.
    #[allow(clippy::mut_from_ref)] // lent once per worker and phase (`take`)
    pub(crate) fn scratch<T: node::Elem>(&self, ith: usize, stride: usize, n: usize) -> &mut [T] {
        self.take(1, ith);
        assert!(n * size_of::<T>() <= stride && (ith + 1) * stride <= self.work_len);
        if n == 0 {
            return &mut [];
        }
        // SAFETY: slot `ith` lies inside the work buffer (asserted); the buffer is 64-byte
        // aligned and op strides are multiples of T's alignment (checked in debug builds
        // below); workers have distinct `ith` (their own `NodeCtx`), so slots never overlap,
        // and `take` lends a worker's slot once per phase.
        unsafe {
            let p = self.work.add(ith * stride) as *mut T;
            debug_assert!(p.is_aligned());
            std::slice::from_raw_parts_mut(p, n)
        }
    }
}

/// The order in which workers claim a node's tasks through its counter. `runs` = 1 is task order;
/// with `runs` = the worker count (decode: one weight stream per core), the tasks are laid out as
/// that many contiguous runs and claim `q` takes task `q / runs` of run `q % runs`, so workers
/// that keep pace each walk a run of their own front to back, and one that falls behind leaves
/// the rest of its run to the others, claim by claim. Every task is handed out exactly once.
pub(crate) struct Claims {
    total: usize,
    runs: usize,
    per_run: usize,
}

impl Claims {
    pub(crate) fn new(total: usize, runs: usize) -> Claims {
        let runs = runs.max(1);
        Claims { total, runs, per_run: total.div_ceil(runs) }
    }

    /// The next task for this worker, `None` when all are taken.
    pub(crate) fn next(&self, counter: &AtomicUsize) -> Option<usize> {
        loop {
            let q = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if q >= self.per_run * self.runs {
                return None;
            }
            let t = (q % self.runs) * self.per_run + q / self.runs;
            if t < self.total {
                return Some(t);
            }
        }
    }
}

/// The dot products a decode matmul runs per weight row: the one-row dot, and where the tier has
/// them its two-row form (`VecDot2Fn`) and that form's run form (`VecDotPairsFn`).
#[derive(Clone, Copy)]
pub(crate) struct RowDots {
    pub(crate) dot: crate::quant::VecDotFn,
    pub(crate) dot2: Option<crate::kernels::VecDot2Fn>,
    pub(crate) pairs: Option<crate::kernels::VecDotPairsFn>,
}

impl RowDots {
    /// The plain dot alone.
    pub(crate) fn one(dot: crate::quant::VecDotFn) -> Self {
        RowDots { dot, dot2: None, pairs: None }
    }

    /// The tier's decode dots for `t`: its streaming dot (else `dot`), two-row and run forms.
    pub(crate) fn decode(
        kt: &crate::kernels::KernelTable,
        t: crate::dtype::DType,
        dot: crate::quant::VecDotFn,
    ) -> Self {
        RowDots {
            dot: kt.vec_dot_stream(t).unwrap_or(dot),
            dot2: kt.vec_dot2_stream(t),
            pairs: kt.vec_dot_pairs(t),
        }
    }
}

/// Pairs per run-form call in [`dot_rows`] (the results wait in a stack array).
const PAIRS_PER_CALL: usize = 64;

/// The dot products of weight rows `rows` (`a_row(i)`, `k` elements) with one activation row
/// `y`, each handed to `store(i, value)`: with the tier's two-row form (`VecDot2Fn`, decode) the
/// range's first half against its second, so each of the two streams reads consecutive rows and
/// its prefetch runs on into its next row (pairs of neighbouring rows measured no gain from
/// memory), an odd last row and every row without it by the one-row dot. `span`, where the
/// caller has it, holds the rows' bytes from row `rows.start` on, row `i` at `(i - rows.start) *
/// stride`: then the two-row form's run form takes up to [`PAIRS_PER_CALL`] pairs per call. The
/// same bits every way.
pub(crate) fn dot_rows<'a>(
    rows: std::ops::Range<usize>,
    k: usize,
    y: &[u8],
    dots: RowDots,
    a_row: impl Fn(usize) -> &'a [u8],
    span: Option<(&'a [u8], usize)>,
    mut store: impl FnMut(usize, f32),
) {
    let mut rest = rows.clone();
    if let Some(dot2) = dots.dot2 {
        let half = rows.len() / 2;
        if let (Some(pairs), Some((span, stride))) = (dots.pairs, span) {
            let mut out = [[0.0f32; 2]; PAIRS_PER_CALL];
            let mut t = 0;
            while t < half {
                let c = (half - t).min(PAIRS_PER_CALL);
                let at = |i: usize| span.get(i.saturating_mul(stride)..).unwrap_or(&[]);
                pairs(k, [at(t), at(half + t)], stride, y, &mut out[..c]);
                for (u, [va, vb]) in out[..c].iter().enumerate() {
                    store(rows.start + t + u, *va);
                    store(rows.start + half + t + u, *vb);
                }
                t += c;
            }
        } else {
            for t in 0..half {
                let (ia, ib) = (rows.start + t, rows.start + half + t);
                let [va, vb] = dot2(k, [a_row(ia), a_row(ib)], y);
                store(ia, va);
                store(ib, vb);
            }
        }
        rest.start += 2 * half;
    }
    for i in rest {
        store(i, (dots.dot)(k, a_row(i), y));
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

/// Elements `k0..k1` of the f32 row of `b` at `pb`: the row itself where it is contiguous and
/// 4-byte aligned (a slice over it), else gathered element by element into `scratch` (views may
/// sit at any offset and stride).
///
/// # Safety
/// `b` is F32, `pb` points at one of its rows and `k1 <= b.ne[0]` (the row's elements lie inside
/// b's data, as plan-time validation ensures), `scratch` holds at least `k1 - k0` values, and the
/// row is not written while the returned slice lives.
pub(crate) unsafe fn f32_run<'a>(
    b: &TView,
    pb: *const u8,
    (k0, k1): (usize, usize),
    scratch: &'a mut [f32],
) -> &'a [f32] {
    debug_assert_eq!(b.dtype, crate::dtype::DType::F32);
    if b.nb[0] == 4 && (pb as usize).is_multiple_of(4) {
        // SAFETY: a contiguous, aligned row of at least k1 f32 (caller contract).
        return unsafe { &std::slice::from_raw_parts(pb as *const f32, k1)[k0..] };
    }
    let run = &mut scratch[..k1 - k0];
    for (i, v) in run.iter_mut().enumerate() {
        // SAFETY: k0 + i < k1 <= ne[0]: inside the row (caller contract); read unaligned.
        *v = unsafe { (pb.add((k0 + i) * b.nb[0]) as *const f32).read_unaligned() };
    }
    run
}

/// Decomposes a flat row index into (i1, i2, i3).
#[inline(always)]
pub(crate) fn unravel_row(r: usize, ne: &[usize; 4]) -> (usize, usize, usize) {
    let i1 = r % ne[1];
    let i2 = (r / ne[1]) % ne[2];
    let i3 = r / (ne[1] * ne[2]);
    (i1, i2, i3)
}

// The op registry.

/// Work bytes of a node for `nth` workers on a tier.
type WorkFn = fn(&ExecNode, usize, &KernelTable) -> usize;
/// Phases of a node (each ends at a barrier).
type PhasesFn = fn(&ExecNode, &KernelTable) -> u8;
/// Whether a tier has the kernels a node needs (checked when planning).
type SupportsFn = fn(&Graph, &Tensor, &KernelTable) -> Result<()>;

/// The common answers, named so that every registry entry states its choice.
const NO_WORK: WorkFn = |_, _, _| 0;
const ONE_PHASE: PhasesFn = |_, _| 1;
const TWO_PHASES: PhasesFn = |_, _| 2;
const ANY_TIER: SupportsFn = |_, _, _| Ok(());

/// The registry: for every `Op`, whether it may run in place, its phases, work size, support rule
/// and driver, in one entry.
/// It expands to `can_inplace`, `phases`, `work_size`, `supports` and `compute`, each an
/// exhaustive match: an op without an entry, or an entry without one of the five, does not
/// compile. Patterns
/// bind the op's parameters; every field is a function or a closure called in the op's arm, so
/// it can use them.
macro_rules! registry {
    ($($pat:pat => {
        inplace: $inplace:expr,
        phases: $phases:expr,
        work: $work:expr,
        supports: $supports:expr,
        run: $run:expr $(,)?
    }),* $(,)?) => {
        /// True for ops whose result may take over the memory of their first source when that
        /// source is not used afterwards (ggml-alloc's `ggml_op_can_inplace`).
        pub(crate) fn can_inplace(op: &Op) -> bool {
            #[allow(unused_variables)]
            match op {
                $($pat => $inplace,)*
            }
        }

        /// Phases of a node.
        pub(crate) fn phases(node: &ExecNode, kt: &KernelTable) -> u8 {
            #[allow(unused_variables)]
            match &node.op {
                $($pat => ($phases)(node, kt),)*
            }
        }

        /// Work-buffer bytes of a node for `nth` workers.
        pub(crate) fn work_size(node: &ExecNode, nth: usize, kt: &KernelTable) -> usize {
            #[allow(unused_variables)]
            match &node.op {
                $($pat => ($work)(node, nth, kt),)*
            }
        }

        /// Whether tier `kt` can run node `id` of `graph`.
        pub(crate) fn supports(graph: &Graph, id: TensorId, kt: &KernelTable) -> Result<()> {
            let t = graph.get("supports_op", id)?;
            #[allow(unused_variables)]
            match &t.op {
                $($pat => ($supports)(graph, t, kt),)*
            }
        }

        /// Runs worker `ith`'s share of phase `phase` of a node.
        pub(crate) fn compute(ctx: &NodeCtx<'_>, phase: u8, ith: usize) -> Result<()> {
            #[allow(unused_variables)]
            match &ctx.node.op {
                $($pat => ($run)(ctx, phase, ith),)*
            }
        }
    };
}

registry! {
    Op::None | Op::View => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER, run: |ctx, phase, ith| Ok(())
    },
    Op::Add => {
        inplace: true,
        phases: ONE_PHASE,
        work: |n, nth, _| elementwise::quant_row_work_size(n, nth),
        supports: ANY_TIER,
        run: |ctx, phase, ith| binary::compute(ctx, ith, binary::BinOp::Add)
    },
    Op::Sub => {
        inplace: true,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| binary::compute(ctx, ith, binary::BinOp::Sub)
    },
    Op::Mul => {
        inplace: true,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| binary::compute(ctx, ith, binary::BinOp::Mul)
    },
    Op::Div => {
        inplace: true,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| binary::compute(ctx, ith, binary::BinOp::Div)
    },
    Op::Scale { scale, bias } => {
        inplace: true,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| unary::scale(ctx, ith, *scale, *bias)
    },
    Op::Unary(u) => {
        inplace: true,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| unary::compute(ctx, ith, *u)
    },
    Op::RmsNorm { eps } => {
        inplace: true,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| norm::rms_norm(ctx, ith, *eps)
    },
    Op::SoftMax { scale, max_bias } => {
        inplace: true,
        phases: ONE_PHASE,
        work: |n, nth, _| softmax::work_size(n, nth),
        supports: ANY_TIER,
        run: |ctx, phase, ith| softmax::compute(ctx, ith, *scale, *max_bias)
    },
    Op::GetRows => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: get_rows::supports,
        run: |ctx, phase, ith| get_rows::compute(ctx, ith)
    },
    Op::Cpy | Op::Dup => {
        inplace: false,
        phases: ONE_PHASE,
        work: |n, nth, _| cpy::work_size(n, nth),
        supports: ANY_TIER,
        run: |ctx, phase, ith| cpy::compute(ctx, ith)
    },
    Op::MulMatHadamard => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| hadamard::fwht(ctx, ith)
    },
    Op::MulMat => {
        inplace: false,
        phases: |n, _| mul_mat::phases(n),
        work: |n, nth, _| mul_mat::work_size(n, nth),
        supports: mul_mat::supports,
        run: |ctx, phase, ith| mul_mat::compute(ctx, phase, ith)
    },
    Op::Rope(p) => {
        inplace: true,
        phases: ONE_PHASE,
        work: |n, nth, _| rope::work_size(n, nth),
        supports: ANY_TIER,
        run: |ctx, phase, ith| rope::compute(ctx, ith, p)
    },
    Op::FlashAttnExt(p) => {
        inplace: false,
        phases: |n, _| flash_attn::phases(n),
        work: |n, nth, _| flash_attn::work_size(n, nth),
        supports: ANY_TIER,
        run: |ctx, phase, ith| flash_attn::compute(ctx, phase, ith, p)
    },
    Op::SetRows => {
        inplace: false,
        phases: ONE_PHASE,
        work: |n, nth, _| set_rows::work_size(n, nth),
        supports: ANY_TIER,
        run: |ctx, phase, ith| set_rows::compute(ctx, ith)
    },
    Op::Gather(g) => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| gather::compute(ctx, ith, g)
    },
    Op::RepeatBack => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| gather::repeat_back(ctx, ith)
    },
    Op::Custom(op) => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| custom::compute(ctx, ith, op)
    },
    Op::ForwardSelect { idx } => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| select::compute(ctx, ith, *idx)
    },
    Op::CustomAny(op) => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| custom::compute_any(ctx, ith, op)
    },
    Op::Upscale(m) => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| upscale::compute(ctx, ith, *m)
    },
    Op::Set { nb, offset } => {
        inplace: false,
        phases: TWO_PHASES, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| gather::set(ctx, phase, ith, *nb, *offset)
    },
    Op::Arange { start, step } => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| gather::arange(ctx, ith, *start, *step)
    },
    Op::TimestepEmbedding { dim, max_period } => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| gather::timestep_embedding(ctx, ith, *dim, *max_period)
    },
    Op::Add1 => {
        inplace: true,
        phases: ONE_PHASE,
        work: |n, nth, _| elementwise::quant_row_work_size(n, nth),
        supports: ANY_TIER,
        run: |ctx, phase, ith| elementwise::add1(ctx, ith)
    },
    Op::AddId => {
        inplace: true,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| elementwise::add_id(ctx, ith)
    },
    Op::Acc { nb1, nb2, nb3, offset } => {
        inplace: false,
        phases: TWO_PHASES, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| elementwise::acc(ctx, phase, ith, [*nb1, *nb2, *nb3], *offset)
    },
    Op::Clamp { min, max } => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| elementwise::clamp(ctx, ith, *min, *max)
    },
    Op::LeakyRelu { negative_slope } => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| elementwise::leaky_relu(ctx, ith, *negative_slope)
    },
    Op::Sqr => {
        inplace: true,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| elementwise::map_float(ctx, ith, |x| x * x)
    },
    Op::Sqrt => {
        inplace: true,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| elementwise::map_float(ctx, ith, f32::sqrt)
    },
    Op::Log => {
        inplace: true,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| elementwise::map_float(ctx, ith, f32::ln)
    },
    Op::Sin => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| elementwise::map_float(ctx, ith, f32::sin)
    },
    Op::Cos => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| elementwise::map_float(ctx, ith, f32::cos)
    },
    Op::Fill { value } => {
        inplace: true,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| elementwise::fill(ctx, ith, *value)
    },
    Op::Tri(kind) => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| elementwise::tri(ctx, ith, *kind)
    },
    Op::Diag => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| elementwise::diag(ctx, ith)
    },
    Op::DiagMaskInf { n_past } => {
        inplace: true,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| elementwise::diag_mask(ctx, ith, *n_past, f32::NEG_INFINITY)
    },
    Op::DiagMaskZero { n_past } => {
        inplace: true,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| elementwise::diag_mask(ctx, ith, *n_past, 0.0)
    },
    Op::Glu { op, swapped, alpha, limit } => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| glu::compute(ctx, ith, *op, *swapped, *alpha, *limit)
    },
    Op::Norm { eps } => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| norm::norm(ctx, ith, *eps)
    },
    Op::RmsNormMul { eps } => {
        inplace: true,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| norm::rms_norm_mul(ctx, ith, *eps)
    },
    Op::GroupNorm { n_groups, eps } => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| norm::group_norm(ctx, ith, *n_groups, *eps)
    },
    Op::L2Norm { eps } => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| norm::l2_norm(ctx, ith, *eps)
    },
    Op::Sum => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| reduce::sum(ctx, ith)
    },
    Op::SumRows => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| reduce::sum_rows(ctx, ith, false)
    },
    Op::Mean => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| reduce::sum_rows(ctx, ith, true)
    },
    Op::Cumsum => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| reduce::cumsum(ctx, ith)
    },
    Op::Argmax => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| reduce::argmax(ctx, ith)
    },
    Op::CountEqual => {
        inplace: false,
        phases: TWO_PHASES,
        work: |n, nth, _| reduce::count_equal_work_size(n, nth),
        supports: ANY_TIER,
        run: |ctx, phase, ith| reduce::count_equal(ctx, phase, ith)
    },
    Op::Argsort(order) => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| reduce::argsort(ctx, ith, *order)
    },
    Op::TopK { k } => {
        inplace: false,
        phases: ONE_PHASE,
        work: |n, nth, _| reduce::top_k_work_size(n, nth),
        supports: ANY_TIER,
        run: |ctx, phase, ith| reduce::top_k(ctx, ith, *k)
    },
    Op::MulMatId => {
        inplace: false,
        phases: mul_mat_id::phases,
        work: mul_mat_id::work_size,
        supports: mul_mat_id::supports,
        run: |ctx, phase, ith| mul_mat_id::compute(ctx, phase, ith)
    },
    Op::OutProd => {
        inplace: false,
        phases: ONE_PHASE,
        work: |n, nth, _| out_prod::work_size(n, nth),
        supports: ANY_TIER,
        run: |ctx, phase, ith| out_prod::compute(ctx, ith)
    },
    Op::SsmConv => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| ssm::ssm_conv(ctx, ith)
    },
    Op::SsmScan { k } => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| ssm::ssm_scan(ctx, ith, *k)
    },
    Op::RwkvWkv6 => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| rwkv::wkv6(ctx, ith)
    },
    Op::GatedLinearAttn { scale } => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| rwkv::gla(ctx, ith, *scale)
    },
    Op::RwkvWkv7 => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| rwkv::wkv7(ctx, ith)
    },
    Op::SolveTri => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| delta_net::solve_tri(ctx, ith)
    },
    Op::GatedDeltaNet { k } => {
        inplace: false,
        phases: ONE_PHASE,
        work: |n, nth, _| delta_net::gdn_work_size(n, nth),
        supports: ANY_TIER,
        run: |ctx, phase, ith| delta_net::gated_delta_net(ctx, ith, *k)
    },
    Op::LightningIndexer => {
        inplace: false,
        phases: ONE_PHASE,
        work: |n, nth, _| dsv4::li_work_size(n, nth),
        supports: ANY_TIER,
        run: |ctx, phase, ith| dsv4::lightning_indexer(ctx, ith)
    },
    Op::Dsv4HcComb { eps, n_iter } => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| dsv4::hc_comb(ctx, ith, *eps, *n_iter)
    },
    Op::Dsv4HcPre { scale, gated } => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| dsv4::hc_pre(ctx, ith, *scale, *gated)
    },
    Op::Dsv4HcPost => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| dsv4::hc_post(ctx, ith)
    },
    Op::CrossEntropyLoss => {
        inplace: false,
        phases: TWO_PHASES,
        work: |n, nth, _| train::work_size(n, nth),
        supports: ANY_TIER,
        run: |ctx, phase, ith| train::cross_entropy_loss(ctx, phase, ith)
    },
    Op::CrossEntropyLossBack => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| train::cross_entropy_loss_back(ctx, ith)
    },
    Op::OptStepAdamw => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| train::opt_step_adamw(ctx, ith)
    },
    Op::OptStepSgd => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| train::opt_step_sgd(ctx, ith)
    },
    Op::SiluBack => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| backward::silu_back(ctx, ith)
    },
    Op::RmsNormBack { eps } => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| backward::rms_norm_back(ctx, ith, *eps)
    },
    Op::SoftMaxBack { scale, .. } => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| backward::soft_max_back(ctx, ith, *scale)
    },
    Op::RopeBack(p) => {
        inplace: false,
        phases: ONE_PHASE,
        work: |n, nth, _| rope::work_size(n, nth),
        supports: ANY_TIER,
        run: |ctx, phase, ith| rope::compute_back(ctx, ith, p)
    },
    Op::GetRowsBack => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| backward::get_rows_back(ctx, ith)
    },
    Op::Im2colBack(p) => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| backward::im2col_back(ctx, ith, p)
    },
    Op::Pool2dBack(p) => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| backward::pool_2d_back(ctx, ith, p)
    },
    Op::FlashAttnBack { masked } => {
        inplace: false,
        phases: ONE_PHASE,
        work: |n, nth, _| backward::flash_attn_back_work_size(n, nth),
        supports: ANY_TIER,
        run: |ctx, phase, ith| backward::flash_attn_back(ctx, ith, *masked)
    },
    Op::Im2col { p, is_2d } => {
        inplace: false,
        phases: ONE_PHASE,
        work: |n, nth, _| conv::im2col_work_size(n, nth),
        supports: ANY_TIER,
        run: |ctx, phase, ith| conv::im2col(ctx, ith, p, *is_2d)
    },
    Op::Im2col3d(p) => {
        inplace: false,
        phases: ONE_PHASE,
        work: |n, nth, _| conv::im2col_work_size(n, nth),
        supports: ANY_TIER,
        run: |ctx, phase, ith| conv::im2col_3d(ctx, ith, p)
    },
    Op::Col2im1d { s0, oc, p0 } => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| conv::col2im_1d(ctx, ith, *s0, *oc, *p0)
    },
    Op::Conv2d(p) => {
        inplace: false,
        phases: TWO_PHASES,
        work: |n, nth, _| conv::conv_work_size(conv::conv_dims(n, None), nth),
        supports: ANY_TIER,
        run: |ctx, phase, ith| conv::conv_2d(ctx, phase, ith, p)
    },
    Op::Conv3d(p) => {
        inplace: false,
        phases: TWO_PHASES,
        work: |n, nth, _| conv::conv_work_size(conv::conv_dims(n, Some(p)), nth),
        supports: ANY_TIER,
        run: |ctx, phase, ith| conv::conv_3d(ctx, phase, ith, p)
    },
    Op::Conv2dDw(p) => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| conv::conv_2d_dw(ctx, ith, p)
    },
    Op::ConvTranspose1d { s0 } => {
        inplace: false,
        phases: TWO_PHASES,
        work: |n, _, _| conv::convt_work_size(n, true),
        supports: ANY_TIER,
        run: |ctx, phase, ith| conv::conv_transpose_1d(ctx, phase, ith, *s0)
    },
    Op::ConvTranspose2d { stride } => {
        inplace: false,
        phases: TWO_PHASES,
        work: |n, _, _| conv::convt_work_size(n, false),
        supports: ANY_TIER,
        run: |ctx, phase, ith| conv::conv_transpose_2d(ctx, phase, ith, *stride)
    },
    Op::Pool1d { op, k0, s0, p0 } => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| pool::pool_1d(ctx, ith, *op, *k0, *s0, *p0)
    },
    Op::Pool2d { op, k, s, p } => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| pool::pool_2d(ctx, ith, *op, *k, *s, *p)
    },
    Op::WinPart { npx, w, .. } => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| window::win_part(ctx, ith, *npx, *w)
    },
    Op::WinUnpart { w } => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| window::win_unpart(ctx, ith, *w)
    },
    Op::GetRelPos => {
        inplace: false,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| window::get_rel_pos(ctx, ith)
    },
    Op::AddRelPos => {
        inplace: true,
        phases: ONE_PHASE, work: NO_WORK, supports: ANY_TIER,
        run: |ctx, phase, ith| window::add_rel_pos(ctx, ith)
    },
}

#[cfg(test)]
mod claims_tests {
    use super::Claims;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn every_task_is_claimed_once_and_runs_alternate() {
        for (total, runs) in [(0, 2), (1, 2), (7, 2), (8, 3), (10, 1), (5, 8)] {
            let (c, counter) = (Claims::new(total, runs), AtomicUsize::new(0));
            let mut seen = Vec::new();
            while let Some(t) = c.next(&counter) {
                seen.push(t);
            }
            let mut sorted = seen.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..total).collect::<Vec<_>>(), "{total} tasks, {runs} runs");
            if (total, runs) == (7, 2) {
                // Two workers in step: one takes 0, 1, 2, 3 and the other 4, 5, 6.
                assert_eq!(seen, [0, 4, 1, 5, 2, 6, 3]);
            }
        }
    }
}

#[cfg(test)]
mod dot_rows_tests {
    use super::{PAIRS_PER_CALL, RowDots, dot_rows};

    /// A stand-in dot that tells rows apart: their first `n` bytes, weighted by position.
    fn dot(n: usize, x: &[u8], y: &[u8]) -> f32 {
        x.iter()
            .zip(y)
            .take(n)
            .enumerate()
            .map(|(i, (&a, &b))| (i + 1) as f32 * a as f32 * b as f32)
            .sum()
    }

    /// `dot_rows` hands every row its own dot product, the same with the run form (several calls
    /// of it for one range, an odd last row), with the two-row form and with the one-row dot
    /// alone.
    #[test]
    fn dot_rows_gives_every_row_its_dot_every_way() {
        let dots = RowDots {
            dot,
            dot2: Some(|n, x, y| x.map(|x| dot(n, x, y))),
            pairs: Some(|n, x, stride, y, out| {
                for (t, o) in out.iter_mut().enumerate() {
                    *o = x.map(|x| dot(n, &x[t * stride..], y));
                }
            }),
        };
        let (n, rb) = (3, 5);
        let rows = 2 * PAIRS_PER_CALL + 9;
        let a: Vec<u8> = (0..rows * rb).map(|i| (i * 7 % 251) as u8).collect();
        let y = [3u8, 1, 2];
        let a_row = |i: usize| &a[i * rb..(i + 1) * rb];
        for range in [3..rows, 0..0, 5..6, 4..8] {
            for (how, dots, span) in
                [("runs", dots, true), ("pairs", dots, false), ("one", RowDots::one(dot), true)]
            {
                let mut got = vec![f32::NAN; rows];
                let span = span.then(|| (&a[range.start * rb..], rb));
                dot_rows(range.clone(), n, &y, dots, a_row, span, |i, v| got[i] = v);
                for (i, got) in got.iter().enumerate() {
                    let want = if range.contains(&i) { dot(n, a_row(i), &y) } else { f32::NAN };
                    assert_eq!(got.to_bits(), want.to_bits(), "{how} {range:?} row {i}");
                }
            }
        }
    }
}
