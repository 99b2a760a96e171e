//! `Plan`: a graph made ready to run on a backend. Building a plan checks every node with the
//! device's `supports_op`, places every intermediate tensor in one arena by liveness (reusing the
//! memory of a source that dies at the node for ops that can run in place, as ggml-alloc does),
//! sizes the work buffer, and resolves every tensor's address. `compute` then runs any number of
//! times with new inputs and allocates nothing.

mod alloc;
mod cpu_backend;
pub(crate) mod exec;

use crate::backend::{
    AbortHook, Backend, Buffer, BufferGuard, CpuBackend, CpuShared, EvalCallback, NodeEval,
};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::{Graph, Leaf, MAX_SRC, Op, TensorId};
use crate::kernels::KernelTable;
pub(crate) use crate::ops::{ExecNode, TView, align_up};
use alloc::ArenaAlloc;
use std::sync::Arc;

/// Sizes found while planning (for tests, benchmarks and curious users).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PlanStats {
    /// Nodes that compute something (views excluded).
    pub n_nodes: usize,
    /// Arena bytes holding inputs and intermediates.
    pub arena_bytes: usize,
    /// What the intermediates would take without any reuse.
    pub intermediate_bytes: usize,
    /// Nodes placed in the memory of their dying first source.
    pub n_inplace: usize,
    /// Work buffer bytes.
    pub work_bytes: usize,
}

struct InputSlot {
    id: TensorId,
    offset: usize,
    nbytes: usize,
    set: bool,
}

/// A graph ready to compute on a [`CpuBackend`].
///
/// ```
/// use quantgraph::{CpuBackend, DType, Graph, Plan};
/// let mut g = Graph::new();
/// let x = g.input(DType::F32, &[3])?;
/// let y = g.scale(x, 2.0)?;
/// g.set_output(y)?;
/// let mut plan = Plan::new(g, &CpuBackend::with_threads(1)?)?;
/// plan.set_input(x, &[1.0f32, 2.0, 3.0])?;
/// plan.compute()?;
/// assert_eq!(plan.output::<f32>(y)?, &[2.0, 4.0, 6.0]);
/// # Ok::<(), quantgraph::Error>(())
/// ```
pub struct Plan {
    graph: Graph,
    nodes: Vec<ExecNode>,
    /// Per tensor: its address, or null when the plan does not use it.
    addrs: Vec<*mut u8>,
    arena: Buffer,
    work: Buffer,
    /// The work buffer is a reserve ([`Plan::replan`]): never reallocated.
    fixed_work: bool,
    /// Thread count the work buffer was sized for.
    work_nth: usize,
    inputs: Vec<InputSlot>,
    /// External buffers to hold while computing: (buffer, needs write access).
    buffers: Vec<(Buffer, bool)>,
    guards: Vec<BufferGuard>,
    shared: Arc<CpuShared>,
    /// The kernel table of the backend's tier, chosen when the plan was built.
    kt: &'static KernelTable,
    abort: Option<AbortHook>,
    eval: Option<EvalCallback>,
    stats: PlanStats,
    /// Guard regions (offset, length) in the arena, for `with_guards` plans.
    guards_at: Vec<(usize, usize)>,
    /// Per node: whether a compute runs it under the current `forward_select` choices (`None`
    /// when the graph has no such node: every node runs).
    active: Option<Vec<bool>>,
}

/// Tensor `id` of `graph`, when it holds elements of type `T` (for `set_input`).
pub(crate) fn input_of_type<T: Element>(
    graph: &Graph,
    id: TensorId,
) -> Result<&crate::graph::Tensor> {
    let t = graph.get("set_input", id)?;
    if t.dtype != T::DTYPE {
        return Err(Error::arg(format!(
            "set_input: {} holds {}, got {} values",
            t.describe(id),
            t.dtype,
            T::DTYPE
        )));
    }
    Ok(t)
}

const GUARD_BYTE: u8 = 0xA5;

// SAFETY: the raw addresses point into the arena and buffers owned by this plan; a `Plan` is used
// through `&mut self` for computing, so moving it across threads is sound.
unsafe impl Send for Plan {}

/// Rust types that can be read from or written to tensors.
pub trait Element: bytemuck::Pod {
    /// The tensor type holding this element type.
    const DTYPE: DType;
}
impl Element for f32 {
    const DTYPE: DType = DType::F32;
}
impl Element for f64 {
    const DTYPE: DType = DType::F64;
}
impl Element for i8 {
    const DTYPE: DType = DType::I8;
}
impl Element for i16 {
    const DTYPE: DType = DType::I16;
}
impl Element for i32 {
    const DTYPE: DType = DType::I32;
}
impl Element for i64 {
    const DTYPE: DType = DType::I64;
}
impl Element for half::f16 {
    const DTYPE: DType = DType::F16;
}
impl Element for half::bf16 {
    const DTYPE: DType = DType::BF16;
}

impl Plan {
    /// Plans `graph` for `backend`: checks every needed node, lays out memory and sizes the work
    /// buffer. Nodes that no output depends on (and that write no state) are left out.
    pub fn new(graph: Graph, backend: &CpuBackend) -> Result<Plan> {
        Plan::build(graph, backend, 0)
    }

    /// A plan for overrun tests: every input and intermediate gets its own arena region (no reuse,
    /// nothing in place) framed by `guard` bytes of a fixed pattern; every `compute` then checks
    /// them ([`Plan::check_guards`]) and returns `Err` if an op wrote outside its output.
    pub fn with_guards(graph: Graph, backend: &CpuBackend, guard: usize) -> Result<Plan> {
        let guard = alloc::checked_align_up(guard.max(1), crate::buffer::BUFFER_ALIGNMENT)
            .map_err(|_| Error::Overflow { what: "plan guard size" })?;
        Plan::build(graph, backend, guard)
    }

    /// Checks the guard bytes of a plan made with [`Plan::with_guards`].
    pub fn check_guards(&self) -> Result<()> {
        self.arena.with_bytes(|b| {
            for &(start, len) in &self.guards_at {
                if let Some(k) = b[start..start + len].iter().position(|&x| x != GUARD_BYTE) {
                    return Err(Error::Buffer(format!(
                        "guard byte at arena offset {} was overwritten",
                        start + k
                    )));
                }
            }
            Ok(())
        })?
    }

    fn build(graph: Graph, backend: &CpuBackend, guard: usize) -> Result<Plan> {
        // One kernel table for the plan's life: support checks, phase counts, work sizes and
        // every compute agree on the tier.
        let kt = backend.kernel_table();
        Plan::build_with(graph, backend.shared.clone(), kt, backend.n_threads(), guard, None)
    }

    /// Plans `worst`, the largest graph of a family (the longest prompt of a model): the same
    /// as [`Plan::new`], named for what comes next. Its arena and work buffer are the reserve
    /// that [`Plan::replan`] fits every smaller graph of the family into, as ggml-alloc's
    /// `ggml_gallocr_reserve` does.
    pub fn reserve(worst: Graph, backend: &CpuBackend) -> Result<Plan> {
        Plan::new(worst, backend)
    }

    /// Replaces the plan's graph with `graph`, laid out in the arena and work buffer this plan
    /// already has: no tensor memory is allocated, and `compute` then allocates nothing either.
    /// Meant for graphs of the same shape family as the one reserved (a prompt of another
    /// length, a decode step). Inputs must be set again. `Err` when `graph` does not fit,
    /// naming the first tensor past the arena or the node whose work buffer is too small; the
    /// plan then keeps its previous graph. The abort hook and eval callback stay installed.
    ///
    /// ```
    /// use quantgraph::{CpuBackend, DType, Graph, Plan, TensorId};
    /// fn graph(n: usize) -> quantgraph::Result<(Graph, TensorId, TensorId)> {
    ///     let mut g = Graph::new();
    ///     let x = g.input(DType::F32, &[n])?;
    ///     let y = g.scale(x, 2.0)?;
    ///     g.set_output(y)?;
    ///     Ok((g, x, y))
    /// }
    /// let (g, _, _) = graph(64)?;
    /// let mut plan = Plan::reserve(g, &CpuBackend::with_threads(1)?)?;
    /// let (g, x, y) = graph(3)?;
    /// plan.replan(g)?;
    /// plan.set_input(x, &[1.0f32, 2.0, 3.0])?;
    /// plan.compute()?;
    /// assert_eq!(plan.output::<f32>(y)?, &[2.0, 4.0, 6.0]);
    /// assert!(plan.replan(graph(1000)?.0).is_err()); // does not fit
    /// # Ok::<(), quantgraph::Error>(())
    /// ```
    pub fn replan(&mut self, graph: Graph) -> Result<()> {
        if !self.guards_at.is_empty() {
            return Err(Error::arg("replan: a plan with guards cannot take another graph"));
        }
        let nth = self.shared.pool().n_threads();
        let reserve = (self.arena.clone(), self.work.clone());
        let mut p = Plan::build_with(graph, self.shared.clone(), self.kt, nth, 0, Some(reserve))?;
        p.abort = self.abort.take();
        p.eval = self.eval.take();
        *self = p;
        Ok(())
    }

    fn build_with(
        graph: Graph,
        shared: Arc<CpuShared>,
        kt: &'static KernelTable,
        nth: usize,
        guard: usize,
        reserve: Option<(Buffer, Buffer)>,
    ) -> Result<Plan> {
        let n = graph.tensors.len();
        // A region with its two guards; `Err` rather than a wrapped size for huge tensors.
        let framed = |nbytes: usize| {
            guard
                .checked_mul(2)
                .and_then(|g| g.checked_add(nbytes))
                .ok_or(Error::Overflow { what: "plan arena size" })
        };
        let mut guards_at: Vec<(usize, usize)> = Vec::new();
        // 1. What runs: outputs, writes into state buffers, and everything they depend on.
        let needed = graph.needed();
        if !needed.iter().any(|&x| x) {
            return Err(Error::arg("plan: the graph has no output (call Graph::set_output)"));
        }

        // 2. Check support and find each root's last use.
        let root = |id: TensorId| graph.tensors[id.index()].view_src.unwrap_or(id);
        let mut last_use = vec![0usize; n];
        for i in 0..n {
            if !needed[i] {
                continue;
            }
            let t = &graph.tensors[i];
            let id = graph.id_at(i);
            if !matches!(t.op, Op::None | Op::View) {
                crate::ops::supports(&graph, id, kt)?;
            }
            if let Leaf::Weight { buffer, .. } | Leaf::State { buffer, .. } = &t.leaf
                && buffer.is_device()
            {
                return Err(Error::Unsupported {
                    op: "plan",
                    backend: "CPU".into(),
                    msg: format!(
                        "{} is stored in buffer '{}', which is not host memory (plan the graph \
                         with a Scheduler that has that buffer's backend)",
                        t.describe(id),
                        buffer.name()
                    ),
                });
            }
            for s in t.srcs() {
                let r = root(s);
                last_use[r.index()] = last_use[r.index()].max(i);
            }
            if let Some(r) = t.view_src {
                last_use[r.index()] = last_use[r.index()].max(i);
            }
            if t.output {
                last_use[root(id).index()] = usize::MAX;
            }
        }

        // 3. Place memory: inputs first (permanent), then intermediates by liveness.
        let mut arena = ArenaAlloc::default();
        let mut offset = vec![usize::MAX; n];
        let mut inputs = Vec::new();
        for (i, t) in graph.tensors.iter().enumerate() {
            if needed[i] && matches!(t.leaf, Leaf::Input) {
                let nbytes = t.nbytes();
                offset[i] = arena.alloc(framed(nbytes)?)? + guard;
                if guard > 0 {
                    guards_at.push((offset[i] - guard, guard));
                    guards_at.push((offset[i] + nbytes, guard));
                }
                inputs.push(InputSlot {
                    id: graph.id_at(i),
                    offset: offset[i],
                    nbytes,
                    set: false,
                });
            }
        }
        let mut stats = PlanStats::default();
        // Roots whose memory was handed to an in-place successor.
        let mut moved = vec![false; n];
        let is_arena_node = |t: &crate::graph::Tensor| {
            t.view_src.is_none() && matches!(t.leaf, Leaf::None) && !matches!(t.op, Op::None)
        };
        for i in 0..n {
            if !needed[i] {
                continue;
            }
            let t = &graph.tensors[i];
            if is_arena_node(t) {
                let nbytes = t.nbytes();
                stats.intermediate_bytes = stats.intermediate_bytes.saturating_add(
                    alloc::checked_align_up(nbytes, crate::buffer::BUFFER_ALIGNMENT)?,
                );
                let mut placed = false;
                if crate::ops::can_inplace(&t.op)
                    && guard == 0
                    && let Some(s0) = t.src[0]
                {
                    let p = &graph.tensors[s0.index()];
                    if is_arena_node(p)
                        && !p.output
                        && last_use[s0.index()] == i
                        && !moved[s0.index()]
                        && p.dtype == t.dtype
                        && p.ne == t.ne
                        && p.nb == t.nb
                        && t.srcs().skip(1).all(|s| root(s) != s0)
                    {
                        offset[i] = offset[s0.index()];
                        moved[s0.index()] = true;
                        stats.n_inplace += 1;
                        placed = true;
                    }
                }
                if !placed {
                    offset[i] = arena.alloc(framed(nbytes)?)? + guard;
                    if guard > 0 {
                        guards_at.push((offset[i] - guard, guard));
                        guards_at.push((offset[i] + nbytes, guard));
                    }
                }
            }
            // Free roots whose last use is this node.
            let mut free_root = |r: TensorId| {
                let rt = &graph.tensors[r.index()];
                if guard == 0
                    && last_use[r.index()] == i
                    && is_arena_node(rt)
                    && !moved[r.index()]
                    && !rt.output
                {
                    moved[r.index()] = true; // freed: never free twice
                    arena.free(offset[r.index()], rt.nbytes());
                }
            };
            for s in t.srcs() {
                free_root(root(s));
            }
            if let Some(r) = t.view_src {
                free_root(r);
            }
        }
        stats.arena_bytes = arena.peak;

        let (arena_buf, work) = match reserve {
            Some((a, w)) if arena.peak <= a.len() => (a, Some(w)),
            Some((a, _)) => {
                let past = (0..n)
                    .filter(|&i| offset[i] != usize::MAX)
                    .map(|i| (i, offset[i], offset[i].saturating_add(graph.tensors[i].nbytes())))
                    .filter(|&(_, _, end)| end > a.len())
                    .min_by_key(|&(_, start, _)| start);
                let what = past.map_or(String::new(), |(i, start, end)| {
                    format!(
                        ": {} (arena bytes {start}..{end}) is past it",
                        graph.describe(graph.id_at(i))
                    )
                });
                return Err(Error::Buffer(format!(
                    "replan: the graph needs {} arena bytes, {} more than the {} reserved{what}; \
                     reserve with a larger graph",
                    arena.peak,
                    arena.peak - a.len(),
                    a.len()
                )));
            }
            None => (Buffer::alloc_named(arena.peak, "CPU_Arena")?, None),
        };
        for &(start, len) in &guards_at {
            let pattern = vec![GUARD_BYTE; len];
            arena_buf.write(start, &pattern)?;
        }
        let abase = arena_buf.ptr();

        // 4. Addresses.
        let mut addrs = vec![std::ptr::null_mut::<u8>(); n];
        let mut buffers: Vec<(Buffer, bool)> = Vec::new();
        for i in 0..n {
            if !needed[i] {
                continue;
            }
            let t = &graph.tensors[i];
            let base = |j: usize| -> *mut u8 {
                let r = &graph.tensors[j];
                match &r.leaf {
                    Leaf::Weight { buffer, offset } | Leaf::State { buffer, offset } => {
                        // SAFETY: the graph checked offset + nbytes <= buffer.len() when binding.
                        unsafe { buffer.ptr().add(*offset) }
                    }
                    // SAFETY: offsets come from the allocator, inside the arena's `peak` bytes.
                    _ => unsafe { abase.add(offset[j]) },
                }
            };
            addrs[i] = match t.view_src {
                // SAFETY: the graph checked at view creation that view_offs + extent <= the root's
                // nbytes, and the root's memory is at least that large.
                Some(r) => unsafe { base(r.index()).add(t.view_offs) },
                None => base(i),
            };
            if let Leaf::Weight { buffer, .. } | Leaf::State { buffer, .. } = &t.leaf {
                let write = matches!(t.leaf, Leaf::State { .. });
                match buffers.iter_mut().find(|(b, _)| b.same(buffer)) {
                    Some(e) => e.1 |= write,
                    None => buffers.push((buffer.clone(), write)),
                }
            }
        }

        // 5. Exec nodes and work sizes.
        let mut nodes = Vec::new();
        let view = |j: usize| {
            let t = &graph.tensors[j];
            TView {
                ptr: addrs[j],
                dtype: t.dtype,
                ne: t.ne,
                nb: t.nb,
                repacked: graph.is_repacked(graph.id_at(j)),
                written: false,
            }
        };
        for i in 0..n {
            let t = &graph.tensors[i];
            // A node with an empty result has nothing to write (kernels index rows by the
            // result's dims, which may be 0); leaving it out keeps them from dividing by zero.
            if !needed[i] || matches!(t.op, Op::None | Op::View) || t.nelements() == 0 {
                continue;
            }
            let id = graph.id_at(i);
            let dst = TView { written: true, ..view(i) };
            let mut src = [None; MAX_SRC];
            for (k, s) in t.src.iter().enumerate() {
                // A source sharing bytes with the destination is written by the node too (in
                // place); the typed accessors lend it out only through the destination's rows.
                src[k] = s.map(|s| {
                    let v = view(s.index());
                    TView { written: v.overlaps(&dst), ..v }
                });
            }
            let node = ExecNode { id, op: t.op.clone(), dst, src, phases: 1 };
            let phases = crate::ops::phases(&node, kt);
            let node = ExecNode { phases, ..node };
            nodes.push(node);
        }
        stats.n_nodes = nodes.len();
        let mut plan = Plan {
            graph,
            nodes,
            addrs,
            arena: arena_buf,
            fixed_work: work.is_some(),
            work: match work {
                Some(w) => w,
                None => Buffer::alloc_named(0, "CPU_Work")?,
            },
            work_nth: 0,
            inputs,
            buffers,
            guards: Vec::new(),
            shared,
            kt,
            abort: None,
            eval: None,
            stats,
            guards_at,
            active: None,
        };
        plan.update_active();
        plan.guards.reserve(plan.buffers.len());
        plan.size_work(nth)?;
        Ok(plan)
    }

    /// Recomputes which nodes a compute runs from the `forward_select` choices.
    fn update_active(&mut self) {
        if !self.nodes.iter().any(|n| matches!(n.op, Op::ForwardSelect { .. })) {
            self.active = None;
            return;
        }
        let reached = self.graph.active();
        self.active = Some(self.nodes.iter().map(|n| reached[n.id.index()]).collect());
    }

    /// Chooses the branch a `forward_select` node (see
    /// [`Graph::forward_select`](crate::Graph::forward_select)) copies from the next compute on;
    /// the nodes only the other branches need are not run. No planning again: every branch was
    /// planned.
    pub fn set_select(&mut self, node: TensorId, idx: usize) -> Result<()> {
        self.graph.set_selected(node, idx)?;
        for n in self.nodes.iter_mut().filter(|n| n.id == node) {
            n.op = Op::ForwardSelect { idx };
        }
        self.update_active();
        Ok(())
    }

    /// How many nodes the next compute runs (all of them unless `forward_select` branches are
    /// left out).
    pub fn n_active_nodes(&self) -> usize {
        match &self.active {
            Some(a) => a.iter().filter(|&&x| x).count(),
            None => self.nodes.len(),
        }
    }

    fn size_work(&mut self, nth: usize) -> Result<()> {
        let mut need = 0usize;
        let mut largest = None;
        for node in &self.nodes {
            let w = crate::ops::work_size(node, nth, self.kt);
            if w > need {
                (need, largest) = (w, Some(node.id));
            }
        }
        if self.fixed_work && need > self.work.len() {
            return Err(Error::Buffer(format!(
                "replan: {} needs {need} work bytes on {nth} threads, the reserve has {}; \
                 reserve with a larger graph (or the same thread count)",
                largest.map_or(String::new(), |id| self.graph.describe(id)),
                self.work.len()
            )));
        }
        if need > self.work.len() || self.work.is_empty() {
            self.work = Buffer::alloc_named(need.max(64), "CPU_Work")?;
        }
        self.work_nth = nth;
        self.stats.work_bytes = self.work.len();
        Ok(())
    }

    /// Sizes found while planning.
    pub fn stats(&self) -> PlanStats {
        self.stats
    }

    /// The graph this plan runs.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Installs an abort hook for this plan only (overrides the backend's).
    pub fn set_abort_hook(&mut self, hook: Option<AbortHook>) {
        self.abort = hook;
    }

    /// Installs (or removes with `None`) the eval callback: called after every node of each
    /// compute with the node's name, op and result; returning `false` stops the compute with
    /// [`Error::Stopped`] (the plan stays usable).
    ///
    /// ```
    /// use quantgraph::{CpuBackend, DType, Graph, Plan};
    /// use std::sync::{Arc, Mutex};
    /// let mut g = Graph::new();
    /// let x = g.input(DType::F32, &[2])?;
    /// let y = g.scale(x, 2.0)?;
    /// g.set_name(y, "y")?;
    /// g.set_output(y)?;
    /// let mut plan = Plan::new(g, &CpuBackend::with_threads(2)?)?;
    /// let seen = Arc::new(Mutex::new(Vec::new()));
    /// let s = seen.clone();
    /// plan.set_eval_callback(Some(Box::new(move |n| {
    ///     let v: &[f32] = bytemuck::cast_slice(n.data);
    ///     s.lock().unwrap().push((n.name.unwrap_or("").to_string(), v.to_vec()));
    ///     true
    /// })));
    /// plan.set_input(x, &[1.0f32, 2.0])?;
    /// plan.compute()?;
    /// assert_eq!(*seen.lock().unwrap(), vec![("y".to_string(), vec![2.0f32, 4.0])]);
    /// # Ok::<(), quantgraph::Error>(())
    /// ```
    pub fn set_eval_callback(&mut self, cb: Option<EvalCallback>) {
        self.eval = cb;
    }

    /// Copies raw bytes into an input tensor (its type's bytes, contiguous). Allocates nothing.
    pub fn set_input_bytes(&mut self, id: TensorId, data: &[u8]) -> Result<()> {
        self.graph.get("set_input", id)?;
        let Some(k) = self.inputs.iter().position(|s| s.id == id) else {
            return Err(Error::arg(format!(
                "set_input: {} is not an input of this plan (or no output uses it)",
                self.graph.describe(id)
            )));
        };
        let slot = &mut self.inputs[k];
        if data.len() != slot.nbytes {
            return Err(Error::arg(format!(
                "set_input: {} takes {} bytes, got {}",
                self.graph.describe(id),
                slot.nbytes,
                data.len()
            )));
        }
        self.arena.write(slot.offset, data)?;
        slot.set = true;
        Ok(())
    }

    /// Copies values into an input tensor; the element type must match the tensor's type.
    pub fn set_input<T: Element>(&mut self, id: TensorId, data: &[T]) -> Result<()> {
        let t = input_of_type::<T>(&self.graph, id)?;
        if data.len() != t.nelements() {
            return Err(Error::arg(format!(
                "set_input: {} takes {} values, got {}",
                t.describe(id),
                t.nelements(),
                data.len()
            )));
        }
        self.set_input_bytes(id, bytemuck::cast_slice(data))
    }

    /// Address and size of a readable output; `want` (if given) must be its type.
    fn check_readable(&self, id: TensorId, want: Option<DType>) -> Result<(*const u8, usize)> {
        let t = self.graph.get("output", id)?;
        let p = self.addrs.get(id.index()).copied().unwrap_or(std::ptr::null_mut());
        if p.is_null() {
            return Err(Error::arg(format!(
                "output: {} is not computed by this plan (mark it with set_output)",
                t.describe(id)
            )));
        }
        if let Some(want) = want.filter(|&w| w != t.dtype) {
            return Err(Error::arg(format!("output: {} is not {want}", t.describe(id))));
        }
        if !t.is_contiguous() {
            return Err(Error::arg(format!(
                "output: {} is not contiguous; add a cont node",
                t.describe(id)
            )));
        }
        let root = self.graph.root(id);
        if !matches!(self.graph.t(root).leaf, Leaf::None | Leaf::Input) {
            return Err(Error::arg(format!(
                "output: {} lives in a caller buffer; read that buffer instead",
                t.describe(id)
            )));
        }
        // Plan::new keeps the root of every output alive to the end, so an output view (an
        // in-place op's result) is readable even when its root was not marked itself.
        if !t.output
            && !self.graph.t(root).output
            && !matches!(self.graph.t(root).leaf, Leaf::Input)
        {
            return Err(Error::arg(format!(
                "output: {} was not marked as an output, so its memory may have been reused",
                t.describe(id)
            )));
        }
        Ok((p as *const u8, t.nbytes()))
    }

    /// The contents of an output (or input) tensor after `compute`, as a typed slice.
    pub fn output<T: Element>(&self, id: TensorId) -> Result<&[T]> {
        let (p, nbytes) = self.check_readable(id, Some(T::DTYPE))?;
        if !(p as usize).is_multiple_of(std::mem::align_of::<T>()) {
            return Err(Error::arg("output: tensor is not aligned for this element type"));
        }
        // SAFETY: p points at nbytes of the plan's arena (checked contiguous, live for &self, and
        // not reused because the root is an output); alignment checked above; `compute` needs
        // `&mut self`, so nothing writes while the slice is borrowed.
        Ok(unsafe { std::slice::from_raw_parts(p as *const T, nbytes / std::mem::size_of::<T>()) })
    }

    /// The bytes of an output (or input) tensor of any type after `compute`, in ggml's layout
    /// (for quantized results: whole blocks, rows in order).
    pub fn output_bytes(&self, id: TensorId) -> Result<&[u8]> {
        let (p, nbytes) = self.check_readable(id, None)?;
        // SAFETY: as in `output`: nbytes of the live arena, not reused, not written while the
        // slice is borrowed; bytes need no alignment.
        Ok(unsafe { std::slice::from_raw_parts(p, nbytes) })
    }

    /// Runs the graph on the backend's thread pool. On error (abort hook, an index out of range in
    /// the data, a custom op failing) the plan and its buffers stay usable.
    pub fn compute(&mut self) -> Result<()> {
        if let Some(s) = self.inputs.iter().find(|s| !s.set) {
            return Err(Error::arg(format!(
                "compute: input {} was never set",
                self.graph.t(s.id).describe(s.id)
            )));
        }
        let pool = self.shared.pool();
        let nth = pool.n_threads();
        if nth != self.work_nth {
            self.size_work(nth)?;
        }
        self.guards.clear();
        for (b, write) in &self.buffers {
            let g = if *write { b.lock_write() } else { b.lock_read() };
            match g {
                Ok(g) => self.guards.push(g),
                Err(e) => {
                    self.guards.clear();
                    return Err(e);
                }
            }
        }
        let hook = self.abort.clone().or_else(|| self.shared.abort_hook());
        let res = match self.eval.as_mut() {
            None => exec::run(
                &self.nodes,
                &pool,
                nth,
                self.kt,
                self.work.ptr(),
                self.work.len(),
                exec::Hooks { abort: hook.as_deref(), eval: None, active: self.active.as_deref() },
            ),
            Some(cb) => {
                let cb = std::sync::Mutex::new(cb);
                let graph = &self.graph;
                let show = |node: &ExecNode| {
                    let t = graph.t(node.id);
                    let d = &node.dst;
                    // SAFETY: the executor calls this after every worker finished the node and
                    // before any starts the next one, so the result's `nbytes` bytes (inside the
                    // arena or a buffer the plan holds, checked at plan time) are not written
                    // while the slice lives; it does not escape the call.
                    let data = unsafe { std::slice::from_raw_parts(d.ptr, t.nbytes()) };
                    let ev = NodeEval {
                        id: node.id,
                        name: t.name.as_deref(),
                        op: &node.op,
                        dtype: d.dtype,
                        ne: d.ne,
                        nb: d.nb,
                        data,
                    };
                    match cb.lock() {
                        Ok(mut f) => (**f)(&ev),
                        Err(_) => false,
                    }
                };
                exec::run(
                    &self.nodes,
                    &pool,
                    nth,
                    self.kt,
                    self.work.ptr(),
                    self.work.len(),
                    exec::Hooks {
                        abort: hook.as_deref(),
                        eval: Some(&show),
                        active: self.active.as_deref(),
                    },
                )
            }
        };
        self.guards.clear();
        res.map_err(|e| self.relabel(e))?;
        // A guarded plan (overrun tests) checks its guard bytes after every compute.
        if !self.guards_at.is_empty() {
            self.check_guards()?;
        }
        Ok(())
    }

    /// Replaces a node placeholder ("#17") in a compute error with the node's description.
    fn relabel(&self, e: Error) -> Error {
        let describe = |label: String| {
            label
                .strip_prefix('#')
                .and_then(|n| n.parse::<u32>().ok())
                .filter(|&n| (n as usize) < self.graph.len())
                .map(|n| self.graph.describe(self.graph.id_at(n as usize)))
                .unwrap_or(label)
        };
        match e {
            Error::IndexOutOfRange { op, tensor, index, limit } => {
                Error::IndexOutOfRange { op, tensor: describe(tensor), index, limit }
            }
            Error::Panicked { name, msg } => Error::Panicked { name: describe(name), msg },
            Error::Stopped { node } => Error::Stopped { node: describe(node) },
            e => e,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_check_flags_a_corrupted_guard() {
        let mut g = Graph::new();
        let x = g.input(DType::F32, &[16]).unwrap();
        let y = g.scale(x, 2.0).unwrap();
        g.set_output(y).unwrap();
        let mut p = Plan::with_guards(g, &CpuBackend::with_threads(2).unwrap(), 64).unwrap();
        p.set_input(x, &[1.0f32; 16]).unwrap();
        p.compute().unwrap();
        p.check_guards().unwrap();
        let (start, _) = p.guards_at[1];
        p.arena.write(start + 3, &[0]).unwrap();
        let e = p.check_guards().unwrap_err().to_string();
        assert!(e.contains(&format!("{}", start + 3)), "{e}");
    }
}
