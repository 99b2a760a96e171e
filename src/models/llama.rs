//! A llama-architecture model runner: token embedding, `n_layer` blocks of RMS norm, rotary
//! attention with grouped KV heads and SwiGLU feed-forward, final norm and output projection, with
//! llama.cpp's tensor names (`token_embd`, `blk.N.attn_q`, ...). The KV cache lives in state
//! buffers written with `set_rows`, so a decode step only computes the new token.
//!
//! A step attends over the cache cells in use rounded up to a multiple of
//! [`DEFAULT_KV_STEP`] (views of the cache of that length, a mask of that length), not over the
//! whole `n_ctx` cache: one planned decode graph is kept per length, built when first needed.
//! A prompt reuses the plan of the previous one when its shape is the same, and otherwise lays
//! its graph out in that plan's arena ([`Plan::replan`]), so prompts do not allocate and map
//! fresh memory on every call.
//!
//! Each cache cell records what it holds: nothing, or a token of one sequence at one position.
//! [`Llama::forward_batch`] runs tokens of several sequences in one graph (the cells a token may
//! attend to are those of its own sequence at its position or before); `forward` is sequence 0
//! with its tokens in cells `0..n_past`.

use super::WeightRef;
use crate::backend::{Buffer, CpuBackend};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::{FlashAttnParams, Graph, RopeMode, RopeParams, TensorId};
use crate::plan::Plan;
use std::collections::{BTreeMap, HashMap};

/// Hyperparameters (llama.cpp's `llama.*` GGUF keys).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LlamaConfig {
    /// `llama.embedding_length`
    pub n_embd: usize,
    /// `llama.block_count`
    pub n_layer: usize,
    /// `llama.attention.head_count`
    pub n_head: usize,
    /// `llama.attention.head_count_kv`
    pub n_head_kv: usize,
    /// `llama.feed_forward_length`
    pub n_ff: usize,
    /// rows of `token_embd`
    pub n_vocab: usize,
    /// `llama.context_length` (also the KV cache size)
    pub n_ctx: usize,
    /// `llama.rope.freq_base`
    pub rope_base: f32,
    /// `llama.attention.layer_norm_rms_epsilon`
    pub eps: f32,
}

impl LlamaConfig {
    /// Head size.
    pub fn head_dim(&self) -> usize {
        self.n_embd / self.n_head
    }

    fn validate(&self) -> Result<()> {
        let c = self;
        if c.n_head == 0
            || c.n_head_kv == 0
            || !c.n_embd.is_multiple_of(c.n_head)
            || !c.n_head.is_multiple_of(c.n_head_kv)
            || !c.head_dim().is_multiple_of(2)
            || c.n_layer == 0
            || c.n_ctx == 0
            || c.n_vocab == 0
        {
            return Err(Error::param("llama", format!("inconsistent hyperparameters {c:?}")));
        }
        Ok(())
    }
}

/// What a model of another llama.cpp architecture does differently from llama (its graph
/// differences, read from the GGUF by [`crate::models::load`]). `ArchParams::default()` is llama.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ArchParams {
    /// Head size, when it is not `n_embd / n_head` (`*.attention.key_length`).
    pub head_dim: Option<usize>,
    /// Rotary embedding layout: `Normal` for llama, `Neox` for qwen2, qwen3 and gemma3.
    pub rope_mode: RopeMode,
    /// Factor applied to the token embeddings (gemma3: `sqrt(n_embd)`).
    pub embd_scale: f32,
    /// Attention scale, when it is not `1 / sqrt(head_dim)`.
    pub attn_scale: Option<f32>,
    /// Feed-forward gate: GELU (gemma3) instead of SiLU.
    pub ffn_gelu: bool,
    /// Sliding-window attention: the window, and per block whether it uses it (gemma3).
    pub swa_window: usize,
    /// Per block: true for a sliding-window block (length `n_layer`, or empty for none).
    pub swa_layers: Vec<bool>,
    /// Rope base of the sliding-window blocks.
    pub rope_base_swa: f32,
}

impl Default for ArchParams {
    fn default() -> ArchParams {
        ArchParams {
            head_dim: None,
            rope_mode: RopeMode::Normal,
            embd_scale: 1.0,
            attn_scale: None,
            ffn_gelu: false,
            swa_window: 0,
            swa_layers: Vec::new(),
            rope_base_swa: 10000.0,
        }
    }
}

/// The weights of one block.
struct Layer {
    attn_norm: WeightRef,
    wq: WeightRef,
    wk: WeightRef,
    wv: WeightRef,
    wo: WeightRef,
    ffn_norm: WeightRef,
    gate: WeightRef,
    up: WeightRef,
    down: WeightRef,
    /// Optional per architecture: Q/K/V biases (qwen2), per-head Q/K norms (qwen3, gemma3),
    /// norms after attention and after the feed-forward (gemma3).
    bq: Option<WeightRef>,
    bk: Option<WeightRef>,
    bv: Option<WeightRef>,
    q_norm: Option<WeightRef>,
    k_norm: Option<WeightRef>,
    post_attn_norm: Option<WeightRef>,
    post_ffw_norm: Option<WeightRef>,
}

/// A loaded model with its KV cache.
pub struct Llama {
    cfg: LlamaConfig,
    arch: ArchParams,
    tok_embd: WeightRef,
    output_norm: WeightRef,
    output: WeightRef,
    layers: Vec<Layer>,
    /// Per layer: K and V caches, F16 [head_dim * n_head_kv, n_ctx].
    cache: Vec<(Buffer, Buffer)>,
    backend: CpuBackend,
    /// What each cache cell holds (`n_ctx` cells), `None` when free.
    cells: Vec<Option<Cell>>,
    /// Tokens cached per sequence, at positions `0..len`.
    seq_lens: BTreeMap<u32, usize>,
    /// One past the highest cell in use.
    cells_end: usize,
    /// The cache holds sequence 0 only, its token at position p in cell p: the layout the
    /// single-sequence steps (`forward`) attend over.
    contiguous: bool,
    /// Attention covers the cells in use rounded up to a multiple of this.
    kv_step: usize,
    /// Planned decode steps, one per attended length (index: length / `kv_step`, rounded up).
    decode: Vec<Option<Step>>,
    /// The last prompt's planned step; its arena is reused by the next prompt.
    prefill: Option<Step>,
    /// The last batch's planned step ([`Llama::forward_batch`]); reused as the prompt's is.
    batch: Option<Step>,
    /// Set by [`Llama::reserve`]: one plan whose arena every step is laid out in.
    reserved: Option<Plan>,
}

/// The graph of one model step ([`Llama::step_graph`]) and its tensors.
#[non_exhaustive]
pub struct LlamaStep {
    /// The graph: embedding, every block (writing K and V into the cache at `pos`), output.
    pub graph: Graph,
    /// Input: I32 token ids, `[n_tokens]`.
    pub tokens: TensorId,
    /// Input: I32 positions, `[n_tokens]` (the cache rows the step's K and V go to).
    pub pos: TensorId,
    /// Input: F32 attention mask, `[n_kv, n_tokens rounded up to 4]` (`n_kv` = `n_ctx` for
    /// [`Llama::step_graph`]): 0 where token i may attend to cache row j, -inf elsewhere.
    pub mask: TensorId,
    /// Input, when some block attends over a sliding window: the same mask with -inf also
    /// `swa_window` or more positions back.
    pub mask_swa: Option<TensorId>,
    /// Output: F32 logits, `[n_vocab, n_tokens]` (or `[n_vocab, 1]` for `last_only`).
    pub logits: TensorId,
    n_tokens: usize,
    /// Batched steps only: I32 cache cells the new K and V rows go to (`pos` then only
    /// feeds the rope).
    cells: Option<TensorId>,
    /// Batched steps only: I32 indices of the tokens whose logits are computed.
    out_ids: Option<TensorId>,
    /// First cell of the sliding-window blocks' view (0 in the public graphs).
    swa_start: usize,
}

/// Which tokens of a step get logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outputs {
    /// Every token.
    All,
    /// The last token.
    Last,
    /// A batched step ([`Llama::forward_batch`]): this many tokens, picked by an `out_ids`
    /// input; K and V go to the cells of a `cells` input.
    Rows(usize),
}

impl Outputs {
    fn of(last_only: bool) -> Outputs {
        if last_only { Outputs::Last } else { Outputs::All }
    }
}

/// What a cache cell holds: a token of sequence `seq` at position `pos`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cell {
    seq: u32,
    pos: u32,
}

/// Tokens of one or more sequences run together by [`Llama::forward_batch`]: each token with
/// its sequence id and whether its logits are wanted. Each sequence continues after the tokens
/// the model has cached for it, in the order its tokens appear in the batch.
///
/// ```
/// use quantgraph::models::llama::Batch;
///
/// let mut b = Batch::new();
/// b.add_seq(0, &[1, 2, 3], true); // a prompt of sequence 0, logits of its last token
/// b.push(7, 1, true); // one decode token of sequence 1
/// assert_eq!((b.len(), b.n_outputs()), (4, 2));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    tokens: Vec<u32>,
    seqs: Vec<u32>,
    logits: Vec<bool>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Batch {
        Batch::default()
    }

    /// Adds `token` of sequence `seq`; `want_logits` asks for its logits.
    pub fn push(&mut self, token: u32, seq: u32, want_logits: bool) -> &mut Batch {
        self.tokens.push(token);
        self.seqs.push(seq);
        self.logits.push(want_logits);
        self
    }

    /// Adds `tokens` of sequence `seq`, in order; `logits_last` asks for the logits of the
    /// last of them.
    pub fn add_seq(&mut self, seq: u32, tokens: &[u32], logits_last: bool) -> &mut Batch {
        for (i, &t) in tokens.iter().enumerate() {
            self.push(t, seq, logits_last && i + 1 == tokens.len());
        }
        self
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the batch has no token.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Number of tokens whose logits are wanted.
    pub fn n_outputs(&self) -> usize {
        self.logits.iter().filter(|&&l| l).count()
    }

    /// Removes every token (keeping the allocations).
    pub fn clear(&mut self) {
        self.tokens.clear();
        self.seqs.clear();
        self.logits.clear();
    }
}

/// Cells of the cache a step attends over by default: the cells in use rounded up to a
/// multiple of this (see [`Llama::set_kv_step`]). A multiple of flash attention's KV chunk, so
/// the chunks a decode step is cut into are the same as over the whole cache.
pub const DEFAULT_KV_STEP: usize = 256;

/// A planned step for `n_tokens` tokens.
struct Step {
    n_tokens: usize,
    /// Cache cells attended over.
    n_kv: usize,
    out: Outputs,
    plan: Plan,
    tokens: TensorId,
    pos: TensorId,
    mask: TensorId,
    /// The sliding-window mask, when some block uses one.
    mask_swa: Option<TensorId>,
    /// First cache cell the sliding-window blocks attend over (their mask's first column).
    swa_start: usize,
    logits: TensorId,
    /// Batched steps: the cells input.
    cells: Option<TensorId>,
    /// Batched steps: the output rows input.
    out_ids: Option<TensorId>,
}

impl Step {
    /// The step of `s`'s tensors, computed by `plan` (planned from `s.graph`).
    fn new(s: &LlamaStep, plan: Plan, n_kv: usize, out: Outputs) -> Step {
        let n_tokens = s.n_tokens;
        let (tokens, pos, mask, mask_swa, logits) = (s.tokens, s.pos, s.mask, s.mask_swa, s.logits);
        let (cells, out_ids, swa_start) = (s.cells, s.out_ids, s.swa_start);
        Step {
            n_tokens,
            n_kv,
            out,
            plan,
            tokens,
            pos,
            mask,
            mask_swa,
            swa_start,
            logits,
            cells,
            out_ids,
        }
    }
}

fn take(w: &HashMap<String, WeightRef>, name: &str) -> Result<WeightRef> {
    w.get(name).cloned().ok_or_else(|| Error::arg(format!("llama: missing tensor '{name}'")))
}

/// A weight must have exactly the shape the hyperparameters give it (`[ne0, ne1]`, higher dims 1):
/// an `output.weight` with more or fewer rows than the vocabulary would give the wrong number of
/// logits.
fn expect_shape(name: &str, w: &WeightRef, ne: [usize; 2]) -> Result<()> {
    if w.ne != [ne[0], ne[1], 1, 1] {
        return Err(Error::arg(format!(
            "llama: tensor '{name}' is {} {:?}, the hyperparameters need [{}, {}, 1, 1]",
            w.dtype, w.ne, ne[0], ne[1]
        )));
    }
    Ok(())
}

impl Llama {
    /// A model from its hyperparameters and weights by llama.cpp name. `output.weight` may be
    /// absent (tied embeddings).
    pub fn new(
        cfg: LlamaConfig,
        weights: &HashMap<String, WeightRef>,
        backend: &CpuBackend,
    ) -> Result<Llama> {
        Llama::new_arch(cfg, ArchParams::default(), weights, backend)
    }

    /// A model of a llama-like architecture ([`ArchParams`]): the optional tensors its
    /// architecture has (`attn_q.bias`, `attn_q_norm`, `post_attention_norm`, ...) are used
    /// where present.
    pub fn new_arch(
        cfg: LlamaConfig,
        arch: ArchParams,
        weights: &HashMap<String, WeightRef>,
        backend: &CpuBackend,
    ) -> Result<Llama> {
        cfg.validate()?;
        if !arch.swa_layers.is_empty() && arch.swa_layers.len() != cfg.n_layer {
            return Err(Error::param(
                "llama",
                format!(
                    "{} sliding-window flags for {} blocks",
                    arch.swa_layers.len(),
                    cfg.n_layer
                ),
            ));
        }
        let hd = arch.head_dim.unwrap_or(cfg.head_dim());
        if hd == 0 || !hd.is_multiple_of(2) {
            return Err(Error::param(
                "llama",
                format!("head size {hd} is not a positive even number"),
            ));
        }
        let c = &cfg;
        // Every tensor is found and its shape checked against the hyperparameters before
        // anything is allocated: a block count or size the weights do not back is an `Err`, not
        // an allocation of the size the metadata claims. Nine tensors per block also bound the
        // block count by the number of weights given.
        if c.n_layer > weights.len() / 9 {
            return Err(Error::arg(format!(
                "llama: block_count {} needs {} blk.N tensors, only {} tensors were given",
                c.n_layer,
                c.n_layer.saturating_mul(9),
                weights.len()
            )));
        }
        let tok_embd = take(weights, "token_embd.weight")?;
        let output = weights.get("output.weight").cloned().unwrap_or_else(|| tok_embd.clone());
        let (e, q, kv) = (c.n_embd, hd * c.n_head, hd * c.n_head_kv);
        expect_shape("token_embd.weight", &tok_embd, [e, c.n_vocab])?;
        expect_shape("output.weight", &output, [e, c.n_vocab])?;
        let mut layers = Vec::new();
        for i in 0..c.n_layer {
            let t = |n: &str, ne: [usize; 2]| {
                let name = format!("blk.{i}.{n}.weight");
                let w = take(weights, &name)?;
                expect_shape(&name, &w, ne)?;
                Ok::<_, Error>(w)
            };
            let opt = |n: &str, kind: &str, ne: [usize; 2]| {
                let name = format!("blk.{i}.{n}.{kind}");
                match weights.get(&name) {
                    None => Ok(None),
                    Some(w) => expect_shape(&name, w, ne).map(|_| Some(w.clone())),
                }
            };
            layers.push(Layer {
                bq: opt("attn_q", "bias", [q, 1])?,
                bk: opt("attn_k", "bias", [kv, 1])?,
                bv: opt("attn_v", "bias", [kv, 1])?,
                q_norm: opt("attn_q_norm", "weight", [hd, 1])?,
                k_norm: opt("attn_k_norm", "weight", [hd, 1])?,
                post_attn_norm: opt("post_attention_norm", "weight", [e, 1])?,
                post_ffw_norm: opt("post_ffw_norm", "weight", [e, 1])?,
                attn_norm: t("attn_norm", [e, 1])?,
                wq: t("attn_q", [e, q])?,
                wk: t("attn_k", [e, kv])?,
                wv: t("attn_v", [e, kv])?,
                wo: t("attn_output", [q, e])?,
                ffn_norm: t("ffn_norm", [e, 1])?,
                gate: t("ffn_gate", [e, c.n_ff])?,
                up: t("ffn_up", [e, c.n_ff])?,
                down: t("ffn_down", [c.n_ff, e])?,
            });
        }
        let kv_row = DType::F16.row_size(kv)?;
        let bytes = kv_row.checked_mul(c.n_ctx).ok_or(Error::Overflow { what: "kv cache" })?;
        bytes
            .checked_mul(2 * c.n_layer)
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or(Error::Overflow { what: "kv cache" })?;
        let mut cache = Vec::with_capacity(c.n_layer);
        for _ in 0..c.n_layer {
            cache.push((Buffer::alloc(bytes)?, Buffer::alloc(bytes)?));
        }
        let m = Llama {
            cfg,
            arch,
            tok_embd,
            output_norm: take(weights, "output_norm.weight")?,
            output,
            layers,
            cache,
            backend: backend.clone(),
            cells: vec![None; c.n_ctx],
            seq_lens: BTreeMap::new(),
            cells_end: 0,
            contiguous: true,
            kv_step: DEFAULT_KV_STEP,
            decode: Vec::new(),
            prefill: None,
            batch: None,
            reserved: None,
        };
        // Build once to validate every shape now rather than at the first token.
        m.build(1, m.cfg.n_ctx, Outputs::All)?;
        Ok(m)
    }

    /// The hyperparameters.
    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    /// The architecture's differences from llama.
    pub fn arch(&self) -> &ArchParams {
        &self.arch
    }

    fn hd(&self) -> usize {
        self.arch.head_dim.unwrap_or(self.cfg.head_dim())
    }

    fn is_swa(&self, layer: usize) -> bool {
        self.arch.swa_window > 0 && self.arch.swa_layers.get(layer).copied().unwrap_or(false)
    }

    fn add_bias(g: &mut Graph, x: TensorId, b: &Option<WeightRef>) -> Result<TensorId> {
        match b {
            Some(b) => {
                let bt = Self::weight(g, b)?;
                g.add(x, bt)
            }
            None => Ok(x),
        }
    }

    fn norm_opt(g: &mut Graph, x: TensorId, w: &Option<WeightRef>, eps: f32) -> Result<TensorId> {
        match w {
            Some(w) => {
                let wt = Self::weight(g, w)?;
                g.rms_norm_mul(x, wt, eps)
            }
            None => Ok(x),
        }
    }

    /// Sets how many cache cells a step attends over: the cells in use (cached and new tokens)
    /// rounded up to a multiple of `cells` (default [`DEFAULT_KV_STEP`]); `cells >= n_ctx`
    /// attends over the whole cache on every step. Cells past the ones in use are masked out
    /// and flash attention skips masked cells, so the logits do not depend on it (see
    /// ARCHITECTURE.md for the one case where the kernel path changes); smaller steps mean less
    /// attention work and more planned decode graphs kept (one per length). `Err` for 0.
    pub fn set_kv_step(&mut self, cells: usize) -> Result<()> {
        if cells == 0 {
            return Err(Error::param("llama", "kv step of 0 cells"));
        }
        self.kv_step = cells;
        self.decode.clear();
        self.prefill = None;
        self.batch = None;
        Ok(())
    }

    /// The cache cells a step attends over when the cells `0..used` may be in use.
    fn kv_len(&self, used: usize) -> usize {
        used.div_ceil(self.kv_step).saturating_mul(self.kv_step).min(self.cfg.n_ctx).max(used)
    }

    /// The first cache cell the sliding-window blocks of a step of `t` tokens over `n_kv` cells
    /// attend over (sequence 0 alone, in cells 0..n_past at their positions), rounded down to
    /// a multiple of [`DEFAULT_KV_STEP`]: no token of the step sees a cell before it, as
    /// llama.cpp's sliding-window cache keeps only the window. `n_kv` is `kv_len(n_past + t)`,
    /// less than `kv_step` above `n_past + t`, so `n_past >= n_kv + 1 - kv_step - t` and the first
    /// token, at `n_past`, sees positions from `n_past + 1 - window` on. A function of the shape
    /// only, so a planned step is reused as before.
    fn swa_start(&self, t: usize, n_kv: usize, out: Outputs) -> usize {
        let w = self.arch.swa_window;
        if w == 0
            || matches!(out, Outputs::Rows(_))
            || !(0..self.cfg.n_layer).any(|i| self.is_swa(i))
        {
            return 0;
        }
        let lowest_past = (n_kv + 1).saturating_sub(self.kv_step + t);
        let start = (lowest_past + 1).saturating_sub(w);
        start / DEFAULT_KV_STEP * DEFAULT_KV_STEP
    }

    /// Tokens in the KV cache of sequence 0, the one `forward` runs.
    pub fn n_past(&self) -> usize {
        self.seq_len(0)
    }

    /// Tokens in the KV cache of sequence `seq` (0 for one it has none of).
    pub fn seq_len(&self, seq: u32) -> usize {
        self.seq_lens.get(&seq).copied().unwrap_or(0)
    }

    /// Cache cells holding no token of any sequence.
    pub fn n_free_cells(&self) -> usize {
        self.cfg.n_ctx - self.seq_lens.values().sum::<usize>()
    }

    /// Forgets the KV cache, every sequence.
    pub fn reset(&mut self) {
        self.cells[..self.cells_end].fill(None);
        self.seq_lens.clear();
        self.cells_end = 0;
        self.contiguous = true;
    }

    /// Forgets sequence `seq`: its cells are free for the tokens of later steps, and it starts
    /// again at position 0. Nothing happens for a sequence with no cached token.
    pub fn seq_rm(&mut self, seq: u32) {
        if self.seq_lens.remove(&seq).is_none() {
            return;
        }
        let mut end = 0;
        let mut contiguous = true;
        for (j, c) in self.cells[..self.cells_end].iter_mut().enumerate() {
            if let Some(cell) = *c {
                if cell.seq == seq {
                    *c = None;
                    continue;
                }
                end = j + 1;
                contiguous &= cell.seq == 0 && cell.pos as usize == j;
            }
        }
        self.cells_end = end;
        // Sequence 0 in cells 0..n_past and nothing else: `forward` takes its own steps again.
        self.contiguous = contiguous && end == self.seq_len(0);
    }

    fn weight(g: &mut Graph, w: &WeightRef) -> Result<TensorId> {
        let nd = if w.ne[3] > 1 {
            4
        } else if w.ne[2] > 1 {
            3
        } else if w.ne[1] > 1 {
            2
        } else {
            1
        };
        g.weight(w.dtype, &w.ne[..nd], &w.buffer, w.offset)
    }

    fn mm(g: &mut Graph, w: &WeightRef, x: TensorId) -> Result<TensorId> {
        let wt = Self::weight(g, w)?;
        g.mul_mat(wt, x)
    }

    /// Lays every later step out in one arena, planned once for a prompt of `max_tokens`
    /// tokens (the worst case; [`Plan::reserve`]): prompts of 1 to `max_tokens` tokens and
    /// decode steps then reuse it ([`Plan::replan`]) instead of each planning and allocating
    /// their own, and so do batches of up to `max_tokens` tokens ([`Llama::forward_batch`]).
    /// A longer prompt is an `Err` naming what does not fit.
    pub fn reserve(&mut self, max_tokens: usize) -> Result<()> {
        let ctx = self.cfg.n_ctx;
        let single = || self.step_graph(max_tokens, false).map(|s| s.graph);
        let batched =
            || self.build_graph(max_tokens, ctx, 0, Outputs::Rows(max_tokens)).map(|s| s.graph);
        // Batches ([`Llama::forward_batch`]) of as many tokens have a few more inputs: the
        // arena is planned for the batched graph and checked against the other, or the other
        // way round should that not fit.
        let mut plan = Plan::reserve(batched()?, &self.backend)?;
        if plan.replan(single()?).is_err() {
            plan = Plan::reserve(single()?, &self.backend)?;
            plan.replan(batched()?)?;
        }
        self.reserved = Some(plan);
        self.decode.clear();
        self.prefill = None;
        self.batch = None;
        Ok(())
    }

    /// The graph of one step: `n_tokens` new tokens attending over the cache, with the logits
    /// of every new token or (`last_only`) of the last one. `forward` builds and plans these;
    /// this is for callers who plan and compute steps themselves.
    /// The graph attends over the whole cache; see [`Llama::step_graph_kv`] for fewer cells.
    pub fn step_graph(&self, n_tokens: usize, last_only: bool) -> Result<LlamaStep> {
        self.build_graph(n_tokens, self.cfg.n_ctx, 0, Outputs::of(last_only))
    }

    /// Like [`Llama::step_graph`], attending over the first `n_kv` cells of the cache only
    /// (the masks are then `[n_kv, n_tokens rounded up to 4]`). `Err` when `n_kv` is 0 or more
    /// than `n_ctx`.
    pub fn step_graph_kv(
        &self,
        n_tokens: usize,
        n_kv: usize,
        last_only: bool,
    ) -> Result<LlamaStep> {
        self.build_graph(n_tokens, n_kv, 0, Outputs::of(last_only))
    }

    /// The planned step for `t` new tokens attending over the first `n_kv` cells of the cache
    /// (masked past `n_past + t`), with the logits `out` asks for.
    fn build(&self, t: usize, n_kv: usize, out: Outputs) -> Result<Step> {
        let mut s = self.build_graph(t, n_kv, self.swa_start(t, n_kv, out), out)?;
        let plan = Plan::new(std::mem::take(&mut s.graph), &self.backend)?;
        Ok(Step::new(&s, plan, n_kv, out))
    }

    /// The graph of a step over cells `0..n_kv`, the sliding-window blocks over
    /// `swa_start..n_kv` only (every cell before it masked for every token of the step).
    fn build_graph(
        &self,
        t: usize,
        n_kv: usize,
        swa_start: usize,
        out: Outputs,
    ) -> Result<LlamaStep> {
        let c = &self.cfg;
        let (hd, nh, nkv, ctx) = (self.hd(), c.n_head, c.n_head_kv, c.n_ctx);
        if n_kv == 0 || n_kv > ctx || swa_start >= n_kv {
            let window = if swa_start > 0 {
                format!(", sliding-window blocks from cell {swa_start}")
            } else {
                String::new()
            };
            return Err(Error::param(
                "llama",
                format!("attending over {n_kv} cells of a cache of {ctx}{window}"),
            ));
        }
        let mut g = Graph::with_capacity(32 * c.n_layer + 16);
        let tokens = g.input(DType::I32, &[t])?;
        let pos = g.input(DType::I32, &[t])?;
        // A batched step writes K and V to the cells it is given; the others to their positions.
        let cells = match out {
            Outputs::Rows(_) => Some(g.input(DType::I32, &[t])?),
            Outputs::All | Outputs::Last => None,
        };
        let rows = cells.unwrap_or(pos);
        let mask32 = g.input(DType::F32, &[n_kv, t.next_multiple_of(4)])?;
        let mask = g.cast(mask32, DType::F16)?;
        let any_swa = (0..c.n_layer).any(|i| self.is_swa(i));
        let (mask_swa32, mask_swa) = if any_swa {
            let m32 = g.input(DType::F32, &[n_kv - swa_start, t.next_multiple_of(4)])?;
            (Some(m32), Some(g.cast(m32, DType::F16)?))
        } else {
            (None, None)
        };
        let emb = Self::weight(&mut g, &self.tok_embd)?;
        let mut x = g.get_rows(emb, tokens)?;
        if self.arch.embd_scale != 1.0 {
            x = g.scale(x, self.arch.embd_scale)?;
        }
        let a = &self.arch;
        let fa = FlashAttnParams::new(a.attn_scale.unwrap_or(1.0 / (hd as f32).sqrt()));
        for (il, (l, (kb, vb))) in self.layers.iter().zip(&self.cache).enumerate() {
            let swa = self.is_swa(il);
            let rope =
                RopeParams::new(hd, a.rope_mode, if swa { a.rope_base_swa } else { c.rope_base });
            let mask = match (swa, mask_swa) {
                (true, Some(m)) => m,
                _ => mask,
            };
            let an = Self::weight(&mut g, &l.attn_norm)?;
            let h = g.rms_norm_mul(x, an, c.eps)?;
            let q = Self::mm(&mut g, &l.wq, h)?;
            let k = Self::mm(&mut g, &l.wk, h)?;
            let v = Self::mm(&mut g, &l.wv, h)?;
            let q = Self::add_bias(&mut g, q, &l.bq)?;
            let k = Self::add_bias(&mut g, k, &l.bk)?;
            let v = Self::add_bias(&mut g, v, &l.bv)?;
            let q = g.reshape(q, &[hd, nh, t])?;
            let k = g.reshape(k, &[hd, nkv, t])?;
            let q = Self::norm_opt(&mut g, q, &l.q_norm, c.eps)?;
            let k = Self::norm_opt(&mut g, k, &l.k_norm, c.eps)?;
            let q = g.rope_ext(q, pos, None, rope)?;
            let k = g.rope_ext(k, pos, None, rope)?;
            // Write this step's K and V rows into the caches at their cells.
            let kc = g.state(DType::F16, &[hd * nkv, ctx], kb, 0)?;
            let vc = g.state(DType::F16, &[hd * nkv, ctx], vb, 0)?;
            let k2 = g.reshape(k, &[hd * nkv, t])?;
            g.set_rows(kc, k2, rows)?;
            g.set_rows(vc, v, rows)?;
            // Attend over the first n_kv cells: [hd, nkv, n_kv] viewed as [hd, n_kv, nkv].
            // Sliding-window blocks: cells swa_start..n_kv.
            let row = DType::F16.row_size(hd)?;
            let first = if swa { swa_start } else { 0 };
            let (len, off) = (n_kv - first, first * row * nkv);
            let kview = g.view_3d(kc, [hd, nkv, len], [row, row * nkv], off)?;
            let vview = g.view_3d(vc, [hd, nkv, len], [row, row * nkv], off)?;
            let kview = g.permute(kview, [0, 2, 1, 3])?;
            let vview = g.permute(vview, [0, 2, 1, 3])?;
            let qp = g.permute(q, [0, 2, 1, 3])?;
            let qp = g.cont(qp)?;
            let att = g.flash_attn_ext(qp, kview, vview, Some(mask), None, fa)?;
            let att = g.reshape(att, &[hd * nh, t])?;
            let o = Self::mm(&mut g, &l.wo, att)?;
            let o = Self::norm_opt(&mut g, o, &l.post_attn_norm, c.eps)?;
            let x1 = g.add(o, x)?;
            let fnw = Self::weight(&mut g, &l.ffn_norm)?;
            let h2 = g.rms_norm_mul(x1, fnw, c.eps)?;
            let gt = Self::mm(&mut g, &l.gate, h2)?;
            let up = Self::mm(&mut g, &l.up, h2)?;
            let ff = if a.ffn_gelu { g.geglu(gt, Some(up))? } else { g.swiglu(gt, Some(up))? };
            let dn = Self::mm(&mut g, &l.down, ff)?;
            let dn = Self::norm_opt(&mut g, dn, &l.post_ffw_norm, c.eps)?;
            x = g.add(dn, x1)?;
        }
        let mut out_ids = None;
        match out {
            Outputs::Last if t > 1 => {
                // Only the last token's hidden state goes through the output projection.
                let row = DType::F32.row_size(c.n_embd)?;
                x = g.view_2d(x, [c.n_embd, 1], row, (t - 1) * row)?;
            }
            Outputs::Rows(n) => {
                // Only the hidden states of the tokens whose logits are wanted.
                let ids = g.input(DType::I32, &[n])?;
                x = g.get_rows(x, ids)?;
                out_ids = Some(ids);
            }
            Outputs::All | Outputs::Last => {}
        }
        let on = Self::weight(&mut g, &self.output_norm)?;
        let h = g.rms_norm_mul(x, on, c.eps)?;
        let logits = Self::mm(&mut g, &self.output, h)?;
        g.set_output(logits)?;
        Ok(LlamaStep {
            graph: g,
            tokens,
            pos,
            mask: mask32,
            mask_swa: mask_swa32,
            swa_start,
            logits,
            n_tokens: t,
            cells,
            out_ids,
        })
    }

    fn run(&mut self, step: &mut Step, tokens: &[u32]) -> Result<Vec<f32>> {
        let (t, ctx, n_kv) = (tokens.len(), self.cfg.n_ctx, step.n_kv);
        let n_past = self.seq_len(0);
        if n_past + t > ctx {
            return Err(Error::arg(format!(
                "llama: {n_past} cached + {t} new tokens exceed the context of {ctx}"
            )));
        }
        self.check_vocab(tokens)?;
        let ids: Vec<i32> = tokens.iter().map(|&tk| tk as i32).collect();
        let pos: Vec<i32> = (0..t).map(|i| (n_past + i) as i32).collect();
        if n_past + t > n_kv {
            return Err(Error::arg(format!(
                "llama: {n_past} cached + {t} new tokens exceed the {n_kv} cells the step attends over"
            )));
        }
        let tp = t.next_multiple_of(4);
        let mut mask = vec![f32::NEG_INFINITY; n_kv * tp];
        for i in 0..t {
            mask[i * n_kv..i * n_kv + n_past + i + 1].fill(0.0);
        }
        step.plan.set_input(step.tokens, &ids)?;
        step.plan.set_input(step.pos, &pos)?;
        step.plan.set_input(step.mask, &mask)?;
        if let Some(ms) = step.mask_swa {
            // The causal mask, and nothing `swa_window` or more positions back, over cells
            // swa_start..n_kv (every cell before it is that far back for every token).
            let (w, s0) = (self.arch.swa_window, step.swa_start);
            if s0 > 0 && s0 > (n_past + 1).saturating_sub(w) {
                return Err(Error::arg(format!(
                    "llama: a step whose sliding window starts at cell {s0} cannot run after \
                     {n_past} cached tokens"
                )));
            }
            let n = n_kv - s0;
            let mut m = vec![f32::NEG_INFINITY; n * tp];
            for i in 0..t {
                let p = n_past + i;
                let lo = (p + 1).saturating_sub(w).max(s0);
                m[i * n + lo - s0..i * n + p + 1 - s0].fill(0.0);
            }
            step.plan.set_input(ms, &m)?;
        }
        step.plan.compute()?;
        // Sequence 0's tokens at positions n_past.., each in the cell of its position.
        for p in n_past..n_past + t {
            self.cells[p] = Some(Cell { seq: 0, pos: p as u32 });
        }
        self.seq_lens.insert(0, n_past + t);
        self.cells_end = n_past + t;
        Ok(step.plan.output::<f32>(step.logits)?.to_vec())
    }

    fn check_vocab(&self, tokens: &[u32]) -> Result<()> {
        if let Some(&bad) = tokens.iter().find(|&&tk| tk as usize >= self.cfg.n_vocab) {
            return Err(Error::arg(format!(
                "llama: token {bad} is outside the vocabulary of {}",
                self.cfg.n_vocab
            )));
        }
        Ok(())
    }

    /// Runs `tokens` through the model after what is cached; returns the logits of every new
    /// token (\[n_vocab\] per token, in order).
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.forward_with(tokens, false)
    }

    /// Runs `tokens` through the model after what is cached; returns the logits of the last
    /// one only (\[n_vocab\]), as llama.cpp computes by default when it processes a prompt:
    /// the output projection runs for one token instead of all of them.
    pub fn forward_last(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.forward_with(tokens, true)
    }

    fn forward_with(&mut self, tokens: &[u32], last_only: bool) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(Error::arg("llama: no tokens"));
        }
        if !self.contiguous {
            // Other sequences share the cache (or sequence 0 is not in cells 0..n_past):
            // sequence 0's tokens as a batch.
            let mut b = Batch::new();
            for (i, &tk) in tokens.iter().enumerate() {
                b.push(tk, 0, !last_only || i + 1 == tokens.len());
            }
            return self.forward_batch(&b);
        }
        let (t, ctx, n_past) = (tokens.len(), self.cfg.n_ctx, self.seq_len(0));
        if n_past + t > ctx {
            return Err(Error::arg(format!(
                "llama: {n_past} cached + {t} new tokens exceed the context of {ctx}"
            )));
        }
        let n_kv = self.kv_len(n_past + t);
        let out = Outputs::of(last_only);
        if let Some(plan) = self.reserved.take() {
            let mut step = self.reserved_step(plan, t, n_kv, out)?;
            let r = self.run(&mut step, tokens);
            self.reserved = Some(step.plan);
            return r;
        }
        if t == 1 {
            // One planned decode step per attended length, kept.
            let slot = n_kv.div_ceil(self.kv_step);
            if self.decode.len() <= slot {
                self.decode.resize_with(slot + 1, || None);
            }
            let mut step = match self.decode[slot].take() {
                Some(s) if s.n_kv == n_kv => s,
                _ => self.build(1, n_kv, Outputs::All)?,
            };
            let r = self.run(&mut step, tokens);
            self.decode[slot] = Some(step);
            return r;
        }
        let old = self.prefill.take();
        let mut step = self.reuse_step(old, t, n_kv, out)?;
        let r = self.run(&mut step, tokens);
        self.prefill = Some(step);
        r
    }

    /// The step laid out in the reserved arena `plan` (taken from `self.reserved`, and put
    /// back there when the step cannot be built or does not fit).
    fn reserved_step(
        &mut self,
        mut plan: Plan,
        t: usize,
        n_kv: usize,
        out: Outputs,
    ) -> Result<Step> {
        let mut s = match self.build_graph(t, n_kv, self.swa_start(t, n_kv, out), out) {
            Ok(s) => s,
            Err(e) => {
                self.reserved = Some(plan);
                return Err(e);
            }
        };
        // On failure `replan` keeps the plan as it was: it stays the reserve.
        if let Err(e) = plan.replan(std::mem::take(&mut s.graph)) {
            self.reserved = Some(plan);
            return Err(e);
        }
        Ok(Step::new(&s, plan, n_kv, out))
    }

    /// The step for a shape: `old` as it is when it has that shape; else laid out in `old`'s
    /// arena when it fits, or planned anew (that arena then serves the steps after it).
    fn reuse_step(&self, old: Option<Step>, t: usize, n_kv: usize, out: Outputs) -> Result<Step> {
        match old {
            Some(s) if (s.n_tokens, s.n_kv, s.out) == (t, n_kv, out) => Ok(s),
            old => {
                let swa_start = self.swa_start(t, n_kv, out);
                let mut s = self.build_graph(t, n_kv, swa_start, out)?;
                let g = std::mem::take(&mut s.graph);
                let plan = match old {
                    Some(mut o) => match o.plan.replan(g) {
                        Ok(()) => o.plan,
                        Err(_) => {
                            drop(o);
                            s = self.build_graph(t, n_kv, swa_start, out)?;
                            Plan::reserve(std::mem::take(&mut s.graph), &self.backend)?
                        }
                    },
                    None => Plan::reserve(g, &self.backend)?,
                };
                Ok(Step::new(&s, plan, n_kv, out))
            }
        }
    }

    /// Runs the tokens of `batch` in one step, each after the tokens cached for its sequence
    /// (so a sequence's positions continue where it stopped; a new one starts at 0), and
    /// returns the logits (\[n_vocab\] each) of the tokens flagged in the batch, in batch order;
    /// none when no token is flagged.
    ///
    /// The new tokens take the lowest free cache cells. A token attends to the cells of its own
    /// sequence at its position or before (within the window on sliding-window blocks), so
    /// sequences do not see each other; the rope uses positions, the cache writes use cells.
    /// Only the flagged tokens go through the output norm and projection. The planned step of
    /// the last batch is reused for a batch of the same shape, its arena for another shape
    /// (the reserved arena after [`Llama::reserve`]).
    ///
    /// `Err`, with the cache as it was, for an empty batch, a token outside the vocabulary, a
    /// sequence whose positions would pass `n_ctx`, or more new tokens than free cells.
    ///
    /// ```
    /// use quantgraph::models::llama::{Batch, Llama, LlamaConfig, WeightTypes, synthetic_gguf};
    /// use quantgraph::{CpuBackend, GgufFile};
    ///
    /// let cfg = LlamaConfig {
    ///     n_embd: 32, n_layer: 1, n_head: 2, n_head_kv: 1, n_ff: 64, n_vocab: 20, n_ctx: 16,
    ///     rope_base: 10000.0, eps: 1e-5,
    /// };
    /// let file = GgufFile::from_bytes(&synthetic_gguf(&cfg, WeightTypes::default(), 1)?)?;
    /// let mut model = Llama::from_gguf(&file, None, &CpuBackend::with_threads(1)?)?;
    /// let mut b = Batch::new();
    /// b.add_seq(0, &[1, 2, 3], true).add_seq(1, &[4, 5], true);
    /// let logits = model.forward_batch(&b)?; // the last token of each prompt
    /// assert_eq!(logits.len(), 2 * 20);
    /// assert_eq!((model.seq_len(0), model.seq_len(1)), (3, 2));
    /// model.seq_rm(0);
    /// assert_eq!(model.seq_len(0), 0);
    /// # Ok::<(), quantgraph::Error>(())
    /// ```
    pub fn forward_batch(&mut self, batch: &Batch) -> Result<Vec<f32>> {
        let (t, ctx) = (batch.len(), self.cfg.n_ctx);
        if t == 0 {
            return Err(Error::arg("llama: forward_batch: empty batch"));
        }
        self.check_vocab(&batch.tokens)?;
        // Each sequence's next position, and each token's.
        let mut next: BTreeMap<u32, usize> = BTreeMap::new();
        let mut pos = Vec::with_capacity(t);
        for &s in &batch.seqs {
            let p = next.entry(s).or_insert_with(|| self.seq_len(s));
            pos.push(*p);
            *p += 1;
        }
        for (&s, &end) in &next {
            if end > ctx {
                let cached = self.seq_len(s);
                return Err(Error::arg(format!(
                    "llama: sequence {s}: {cached} cached + {} new tokens exceed the context of \
                     {ctx}",
                    end - cached
                )));
            }
        }
        let free = self.n_free_cells();
        if t > free {
            return Err(Error::arg(format!(
                "llama: the batch needs {t} free cache cells, {free} of {ctx} are free"
            )));
        }
        let cells: Vec<usize> = (0..ctx).filter(|&j| self.cells[j].is_none()).take(t).collect();
        let mut rows: Vec<i32> = (0..t).filter(|&i| batch.logits[i]).map(|i| i as i32).collect();
        let n_out = rows.len();
        if n_out == 0 {
            // The graph needs an output: the last token's logits, not returned.
            rows.push(t as i32 - 1);
        }
        let end = cells.iter().map(|&c| c + 1).fold(self.cells_end, usize::max);
        let n_kv = self.kv_len(end);
        for i in 0..t {
            self.cells[cells[i]] = Some(Cell { seq: batch.seqs[i], pos: pos[i] as u32 });
        }
        match self.run_batch(batch, &pos, &cells, &rows, n_kv) {
            Err(e) => {
                for &c in &cells {
                    self.cells[c] = None;
                }
                Err(e)
            }
            Ok(logits) => {
                self.seq_lens.extend(next);
                self.cells_end = end;
                self.contiguous &= (0..t).all(|i| batch.seqs[i] == 0 && cells[i] == pos[i]);
                Ok(if n_out == 0 { Vec::new() } else { logits })
            }
        }
    }

    /// Plans (or reuses) and computes a batched step; the cells metadata already holds the
    /// batch's tokens.
    fn run_batch(
        &mut self,
        batch: &Batch,
        pos: &[usize],
        cells: &[usize],
        rows: &[i32],
        n_kv: usize,
    ) -> Result<Vec<f32>> {
        let t = batch.len();
        let out = Outputs::Rows(rows.len());
        let reserved = self.reserved.is_some();
        let mut step = match self.reserved.take() {
            Some(plan) => self.reserved_step(plan, t, n_kv, out)?,
            None => {
                let old = self.batch.take();
                self.reuse_step(old, t, n_kv, out)?
            }
        };
        let r = self.fill_and_compute(&mut step, batch, pos, cells, rows);
        if reserved {
            self.reserved = Some(step.plan);
        } else {
            self.batch = Some(step);
        }
        r
    }

    fn fill_and_compute(
        &self,
        step: &mut Step,
        batch: &Batch,
        pos: &[usize],
        cells: &[usize],
        rows: &[i32],
    ) -> Result<Vec<f32>> {
        let (t, n_kv) = (batch.len(), step.n_kv);
        let (Some(cells_in), Some(out_ids)) = (step.cells, step.out_ids) else {
            return Err(Error::arg("llama: a batched step without its cells and output inputs"));
        };
        let ids: Vec<i32> = batch.tokens.iter().map(|&tk| tk as i32).collect();
        let pos32: Vec<i32> = pos.iter().map(|&p| p as i32).collect();
        let cells32: Vec<i32> = cells.iter().map(|&c| c as i32).collect();
        // Token i may attend to cell j when it holds its sequence at its position or before
        // (and, for the sliding-window mask, fewer than `swa_window` positions back).
        let tp = t.next_multiple_of(4);
        let window = step.mask_swa.map(|_| self.arch.swa_window);
        let mut mask = vec![f32::NEG_INFINITY; n_kv * tp];
        let mut mask_swa = vec![f32::NEG_INFINITY; if window.is_some() { n_kv * tp } else { 0 }];
        for i in 0..t {
            let (s, p) = (batch.seqs[i], pos[i]);
            for (j, c) in self.cells[..n_kv].iter().enumerate() {
                let Some(c) = c else { continue };
                let cp = c.pos as usize;
                if c.seq != s || cp > p {
                    continue;
                }
                mask[i * n_kv + j] = 0.0;
                if window.is_some_and(|w| p - cp < w) {
                    mask_swa[i * n_kv + j] = 0.0;
                }
            }
        }
        step.plan.set_input(step.tokens, &ids)?;
        step.plan.set_input(step.pos, &pos32)?;
        step.plan.set_input(cells_in, &cells32)?;
        step.plan.set_input(out_ids, rows)?;
        step.plan.set_input(step.mask, &mask)?;
        if let Some(ms) = step.mask_swa {
            step.plan.set_input(ms, &mask_swa)?;
        }
        step.plan.compute()?;
        Ok(step.plan.output::<f32>(step.logits)?.to_vec())
    }

    /// Greedy generation: feeds `prompt`, then `n` tokens each picked by argmax.
    pub fn generate(&mut self, prompt: &[u32], n: usize) -> Result<Vec<u32>> {
        let logits = self.forward_last(prompt)?;
        let nv = self.cfg.n_vocab;
        // `Llama::new` checked that the output projection has n_vocab rows.
        let mut next = argmax(&logits[logits.len().saturating_sub(nv)..]);
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(next);
            if out.len() == n {
                break;
            }
            let l = self.forward(&[next])?;
            next = argmax(&l);
        }
        Ok(out)
    }
}

/// Index of the largest value (the first on ties).
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

pub(crate) fn meta_usize(md: &crate::gguf::Metadata, key: &str) -> Result<usize> {
    use crate::gguf::Value;
    let v =
        md.get(key).ok_or_else(|| Error::Gguf(format!("llama: metadata key '{key}' not found")))?;
    let n: i128 = match v {
        Value::U8(x) => *x as i128,
        Value::I8(x) => *x as i128,
        Value::U16(x) => *x as i128,
        Value::I16(x) => *x as i128,
        Value::U32(x) => *x as i128,
        Value::I32(x) => *x as i128,
        Value::U64(x) => *x as i128,
        Value::I64(x) => *x as i128,
        _ => {
            return Err(Error::Gguf(format!(
                "llama: '{key}' has type {}, not an integer",
                v.type_name()
            )));
        }
    };
    usize::try_from(n).map_err(|_| Error::Gguf(format!("llama: '{key}' = {n} is out of range")))
}

pub(crate) fn meta_f32(md: &crate::gguf::Metadata, key: &str, default: f32) -> Result<f32> {
    use crate::gguf::Value;
    match md.get(key) {
        None => Ok(default),
        Some(Value::F32(x)) => Ok(*x),
        Some(Value::F64(x)) => Ok(*x as f32),
        Some(v) => {
            Err(Error::Gguf(format!("llama: '{key}' has type {}, not a float", v.type_name())))
        }
    }
}

impl LlamaConfig {
    /// Reads the hyperparameters of a llama GGUF (`general.architecture` = "llama"). `n_ctx`
    /// overrides `llama.context_length` (the KV cache size).
    pub fn from_gguf(file: &crate::gguf::GgufFile, n_ctx: Option<usize>) -> Result<LlamaConfig> {
        let arch = file.metadata().get_str("general.architecture")?;
        if arch != "llama" {
            return Err(Error::Gguf(format!("llama: architecture is '{arch}', not 'llama'")));
        }
        LlamaConfig::from_gguf_keys(file, n_ctx, "llama")
    }

    /// Like [`LlamaConfig::from_gguf`], for a model that may be split over several files.
    pub fn from_gguf_model(
        model: &crate::gguf::GgufModel,
        n_ctx: Option<usize>,
    ) -> Result<LlamaConfig> {
        let md = model.metadata();
        let arch = md.get_str("general.architecture")?;
        if arch != "llama" {
            return Err(Error::Gguf(format!("llama: architecture is '{arch}', not 'llama'")));
        }
        LlamaConfig::from_parts(md, model.tensor("token_embd.weight"), n_ctx, "llama")
    }

    /// Reads the hyperparameters under the key prefix of another llama-like architecture
    /// (`qwen2.embedding_length`, ...), whatever `general.architecture` says.
    pub fn from_gguf_keys(
        file: &crate::gguf::GgufFile,
        n_ctx: Option<usize>,
        prefix: &str,
    ) -> Result<LlamaConfig> {
        LlamaConfig::from_parts(file.metadata(), file.tensor("token_embd.weight"), n_ctx, prefix)
    }

    fn from_parts(
        md: &crate::gguf::Metadata,
        emb: Option<&crate::gguf::TensorInfo>,
        n_ctx: Option<usize>,
        prefix: &str,
    ) -> Result<LlamaConfig> {
        let k = |name: &str| format!("{prefix}.{name}");
        let emb =
            emb.ok_or_else(|| Error::Gguf("llama: missing tensor 'token_embd.weight'".into()))?;
        let n_head = meta_usize(md, &k("attention.head_count"))?;
        let cfg = LlamaConfig {
            n_embd: meta_usize(md, &k("embedding_length"))?,
            n_layer: meta_usize(md, &k("block_count"))?,
            n_head,
            n_head_kv: meta_usize(md, &k("attention.head_count_kv")).unwrap_or(n_head),
            n_ff: meta_usize(md, &k("feed_forward_length"))?,
            n_vocab: emb.ne()[1],
            n_ctx: match n_ctx {
                Some(c) => c,
                None => meta_usize(md, &k("context_length"))?,
            },
            rope_base: meta_f32(md, &k("rope.freq_base"), 10000.0)?,
            eps: meta_f32(md, &k("attention.layer_norm_rms_epsilon"), 1e-5)?,
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

impl Llama {
    /// Loads a llama model from a GGUF file; the weights stay in the file's (memory-mapped)
    /// buffer, shared, not copied.
    pub fn from_gguf(
        file: &crate::gguf::GgufFile,
        n_ctx: Option<usize>,
        backend: &CpuBackend,
    ) -> Result<Llama> {
        let cfg = LlamaConfig::from_gguf(file, n_ctx)?;
        Llama::new(cfg, &weights_of(file), backend)
    }

    /// Loads a llama model from a [`GgufModel`](crate::gguf::GgufModel): one file or every shard
    /// of a split model; each weight stays in its shard's (memory-mapped) buffer.
    pub fn from_gguf_model(
        model: &crate::gguf::GgufModel,
        n_ctx: Option<usize>,
        backend: &CpuBackend,
    ) -> Result<Llama> {
        let cfg = LlamaConfig::from_gguf_model(model, n_ctx)?;
        let mut weights = HashMap::new();
        for shard in model.shards() {
            for t in shard.tensors() {
                weights.insert(
                    t.name().to_string(),
                    WeightRef {
                        dtype: t.dtype(),
                        ne: t.ne(),
                        buffer: shard.buffer().clone(),
                        offset: t.offset(),
                    },
                );
            }
        }
        Llama::new(cfg, &weights, backend)
    }

    /// Like [`Llama::from_gguf`], but every matrix that only feeds `mul_mat` (attention, FFN and
    /// output projections) and that the device can repack (see
    /// [`CpuRepackBufferType`](crate::CpuRepackBufferType): Q4_0, IQ4_NL, MXFP4, Q4_K, Q6_K, TQ2_0,
    /// Q2_K) is copied once into one CPU_REPACK buffer in the interleaved layout; the others stay
    /// in the file's buffer. Returns the model and the bytes repacked (the mapped file's pages of
    /// those tensors are no longer touched, so only one copy stays resident).
    pub fn from_gguf_repacked(
        file: &crate::gguf::GgufFile,
        n_ctx: Option<usize>,
        backend: &CpuBackend,
    ) -> Result<(Llama, usize)> {
        let cfg = LlamaConfig::from_gguf(file, n_ctx)?;
        let (weights, total) = repacked_weights(file)?;
        Ok((Llama::new(cfg, &weights, backend)?, total))
    }
}

/// The tensors of a GGUF file as weights, in the file's (memory-mapped) buffer.
pub(crate) fn weights_of(file: &crate::gguf::GgufFile) -> HashMap<String, WeightRef> {
    let mut weights = HashMap::new();
    for t in file.tensors() {
        weights.insert(
            t.name().to_string(),
            WeightRef {
                dtype: t.dtype(),
                ne: t.ne(),
                buffer: file.buffer().clone(),
                offset: t.offset(),
            },
        );
    }
    weights
}

/// The tensors of a GGUF file as weights, the repackable matrices copied into one CPU_REPACK
/// buffer (see [`Llama::from_gguf_repacked`]); also returns the bytes repacked.
pub(crate) fn repacked_weights(
    file: &crate::gguf::GgufFile,
) -> Result<(HashMap<String, WeightRef>, usize)> {
    use crate::backend::{BufferType, CpuRepackBufferType};
    let buft = CpuRepackBufferType;
    let matmul_only = |name: &str| {
        name == "output.weight"
            || ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]
                .iter()
                .any(|m| name.starts_with("blk.") && name.ends_with(&format!(".{m}.weight")))
    };
    let mut picked = Vec::new();
    let mut total = 0usize;
    for t in file.tensors() {
        let nd = t.ne().iter().rposition(|&d| d != 1).map_or(1, |i| i + 1);
        if matmul_only(t.name()) && buft.supports_tensor(t.dtype(), &t.ne()[..nd]) {
            let bytes = t.dtype().row_size(t.ne()[0])? * t.ne()[1..].iter().product::<usize>();
            picked.push((t, total, bytes));
            total = crate::plan::align_up(total + bytes, buft.alignment());
        }
    }
    if picked.is_empty() {
        return Ok((weights_of(file), 0));
    }
    let rbuf = buft.alloc(total)?;
    let mut weights = weights_of(file);
    for &(t, off, bytes) in &picked {
        file.buffer().with_bytes(|all| {
            let src = all.get(t.offset()..t.offset() + bytes).ok_or_else(|| {
                Error::arg(format!("llama: tensor '{}' lies outside the file", t.name()))
            })?;
            rbuf.set_tensor(off, t.dtype(), &t.ne(), src)
        })??;
        weights.insert(
            t.name().to_string(),
            WeightRef { dtype: t.dtype(), ne: t.ne(), buffer: rbuf.clone(), offset: off },
        );
    }
    Ok((weights, total))
}

/// Tensor types of a synthetic model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightTypes {
    /// `token_embd`
    pub embd: DType,
    /// `attn_q/k/v/output`
    pub attn: DType,
    /// `ffn_gate/up/down`
    pub ffn: DType,
    /// `output`
    pub output: DType,
}

impl WeightTypes {
    /// Every matrix in one type.
    pub fn all(t: DType) -> WeightTypes {
        WeightTypes { embd: t, attn: t, ffn: t, output: t }
    }
}

impl Default for WeightTypes {
    /// A typical mixed quantization: F16 embedding, Q8_0 attention and output, Q4_0 FFN.
    fn default() -> WeightTypes {
        WeightTypes { embd: DType::F16, attn: DType::Q8_0, ffn: DType::Q4_0, output: DType::Q8_0 }
    }
}

/// Writes a deterministic random llama model as GGUF bytes (for demos, tests and benchmarks):
/// matrices in the given types, norms in F32, llama.cpp's names and keys.
pub fn synthetic_gguf(cfg: &LlamaConfig, types: WeightTypes, seed: u64) -> Result<Vec<u8>> {
    cfg.validate()?;
    let mut w = crate::gguf::GgufWriter::new();
    w.add("general.architecture", "llama")?;
    w.add("general.name", "quantgraph synthetic llama")?;
    w.add("llama.embedding_length", cfg.n_embd as u32)?;
    w.add("llama.block_count", cfg.n_layer as u32)?;
    w.add("llama.attention.head_count", cfg.n_head as u32)?;
    w.add("llama.attention.head_count_kv", cfg.n_head_kv as u32)?;
    w.add("llama.feed_forward_length", cfg.n_ff as u32)?;
    w.add("llama.context_length", cfg.n_ctx as u32)?;
    w.add("llama.rope.freq_base", cfg.rope_base)?;
    w.add("llama.attention.layer_norm_rms_epsilon", cfg.eps)?;
    // One stream for every tensor, in the order they are written.
    let mut r = crate::testdata::Xorshift64::new(seed);
    let mut rand = |n: usize, scale: f32, offset: f32| -> Vec<f32> {
        (0..n).map(|_| r.next_f32() * scale + offset).collect()
    };
    let add = |w: &mut crate::gguf::GgufWriter,
               name: &str,
               ne: &[usize],
               ty: DType,
               v: Vec<f32>|
     -> Result<()> {
        let mut bytes = vec![0u8; ty.row_size(v.len())?];
        if crate::quant::quantize_for_dot(ty, &v, &mut bytes).is_err() {
            crate::quant::quantize(ty, &v, &mut bytes)?;
        }
        w.add_tensor_owned(name, ty, ne, bytes)?;
        Ok(())
    };
    let (d, kv, ff) = (cfg.n_embd, cfg.head_dim() * cfg.n_head_kv, cfg.n_ff);
    let s = |fan_in: usize| 1.0 / (fan_in as f32).sqrt();
    let (wtype, ftype) = (types.attn, types.ffn);
    add(
        &mut w,
        "token_embd.weight",
        &[d, cfg.n_vocab],
        types.embd,
        rand(d * cfg.n_vocab, 1.0, 0.0),
    )?;
    for i in 0..cfg.n_layer {
        let n = |x: &str| format!("blk.{i}.{x}.weight");
        add(&mut w, &n("attn_norm"), &[d], DType::F32, rand(d, 0.1, 1.0))?;
        add(&mut w, &n("attn_q"), &[d, d], wtype, rand(d * d, s(d), 0.0))?;
        add(&mut w, &n("attn_k"), &[d, kv], wtype, rand(d * kv, s(d), 0.0))?;
        add(&mut w, &n("attn_v"), &[d, kv], wtype, rand(d * kv, s(d), 0.0))?;
        add(&mut w, &n("attn_output"), &[d, d], wtype, rand(d * d, s(d), 0.0))?;
        add(&mut w, &n("ffn_norm"), &[d], DType::F32, rand(d, 0.1, 1.0))?;
        add(&mut w, &n("ffn_gate"), &[d, ff], ftype, rand(d * ff, s(d), 0.0))?;
        add(&mut w, &n("ffn_up"), &[d, ff], ftype, rand(d * ff, s(d), 0.0))?;
        add(&mut w, &n("ffn_down"), &[ff, d], ftype, rand(ff * d, s(ff), 0.0))?;
    }
    add(&mut w, "output_norm.weight", &[d], DType::F32, rand(d, 0.1, 1.0))?;
    add(
        &mut w,
        "output.weight",
        &[d, cfg.n_vocab],
        types.output,
        rand(d * cfg.n_vocab, s(d), 0.0),
    )?;
    w.to_vec()
}
