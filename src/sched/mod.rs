//! The scheduler (ggml's `ggml_backend_sched`): runs one graph across several backends.
//!
//! Given backends in priority order, [`Scheduler::plan`] assigns every node that runs: a node
//! goes to the first backend that supports its op and can use the buffers its weights (and, for
//! an op writing into a state buffer, its destination) live in; when none can use the buffers,
//! the first that supports the op takes it and the weights are copied. Weights stay where their
//! buffer is. Consecutive nodes of one backend form a split; each split becomes a graph of its
//! own, planned by its backend. A tensor a split reads but does not hold (an earlier split's
//! result, a graph input kept by another split, a weight in a buffer its backend cannot use) is
//! an input of the split, copied in before the split runs. Copies are always of whole tensors
//! that own their memory; views are rebuilt on top of the copy.

use crate::backend::{Backend, BackendPlan, Buffer, EvalCallback, NodeEval};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::{Graph, Leaf, MAX_SRC, Op, Tensor, TensorId};
use crate::plan::Element;
use std::sync::Arc;

/// Backends in priority order, ready to plan graphs across them.
///
/// ```
/// use quantgraph::{CpuBackend, DType, Graph};
/// use quantgraph::sched::Scheduler;
/// use std::sync::Arc;
/// let mut g = Graph::new();
/// let x = g.input(DType::F32, &[4])?;
/// let y = g.scale(x, 2.0)?;
/// g.set_output(y)?;
/// let sched = Scheduler::new(vec![Arc::new(CpuBackend::with_threads(1)?)])?;
/// let mut plan = sched.plan(g)?;
/// plan.set_input(x, &[1.0f32, 2.0, 3.0, 4.0])?;
/// plan.compute()?;
/// assert_eq!(plan.output::<f32>(y)?, vec![2.0, 4.0, 6.0, 8.0]);
/// assert_eq!((plan.n_splits(), plan.n_copies()), (1, 0));
/// # Ok::<(), quantgraph::Error>(())
/// ```
#[derive(Clone)]
pub struct Scheduler {
    backends: Vec<Arc<dyn Backend>>,
}

/// Where a copy reads from.
enum Source {
    /// A tensor of an earlier split's plan (marked as an output there).
    Split { split: usize, id: TensorId },
    /// A weight or state tensor in a buffer the split's backend cannot use.
    Buffer { buffer: Buffer, offset: usize, dtype: DType, ne: [usize; 4] },
}

struct Copy {
    from: Source,
    /// The input of the split's graph it fills.
    to: TensorId,
    nbytes: usize,
}

struct Split {
    backend: usize,
    /// The nodes of the scheduled graph this split computes, in order.
    nodes: Vec<TensorId>,
    plan: Box<dyn BackendPlan>,
    copies: Vec<Copy>,
}

/// A graph planned across the backends of a [`Scheduler`]: splits in order, each a plan of its
/// backend, with the copies between them. Computes any number of times.
pub struct SchedPlan {
    graph: Graph,
    names: Vec<String>,
    /// Per tensor of `graph`: the backend that computes it (nodes only).
    assign: Vec<Option<usize>>,
    splits: Vec<Split>,
    /// Per tensor of `graph`: the split and local id that takes its data (inputs).
    input_at: Vec<Option<(usize, TensorId)>>,
    /// Per tensor of `graph`: the split and local id to read it from after a compute (outputs).
    output_at: Vec<Option<(usize, TensorId)>>,
    /// Host bytes for copies that cannot borrow their source.
    staging: Vec<u8>,
}

impl Scheduler {
    /// A scheduler over `backends`, highest priority first (put the CPU last, as ggml does, so
    /// it takes whatever the others cannot).
    pub fn new(backends: Vec<Arc<dyn Backend>>) -> Result<Scheduler> {
        if backends.is_empty() {
            return Err(Error::arg("Scheduler: no backends"));
        }
        Ok(Scheduler { backends })
    }

    /// The backends, in priority order.
    pub fn backends(&self) -> &[Arc<dyn Backend>] {
        &self.backends
    }

    /// Assigns, splits and plans `graph` (see the module documentation). `Err` when a node no
    /// backend supports, or an op writing into a buffer no backend that supports the op can
    /// use; the error names the node.
    pub fn plan(&self, graph: Graph) -> Result<SchedPlan> {
        let n = graph.len();
        let needed = graph.needed();
        let assign = self.assign(&graph, &needed)?;
        // Consecutive nodes of one backend form a split.
        let mut parts: Vec<(usize, Vec<usize>)> = Vec::new();
        for (i, a) in assign.iter().enumerate() {
            let Some(b) = *a else { continue };
            match parts.last_mut() {
                Some((pb, nodes)) if *pb == b => nodes.push(i),
                _ => parts.push((b, vec![i])),
            }
        }
        if parts.is_empty() {
            return Err(Error::arg(
                "scheduler: the graph has no node to compute (call set_output)",
            ));
        }
        let mut bld = Builder {
            graph: &graph,
            backends: &self.backends,
            split_backend: parts.iter().map(|p| p.0).collect(),
            graphs: Vec::new(),
            maps: Vec::new(),
            copies: Vec::new(),
            loc: vec![None; n],
            input_at: vec![None; n],
        };
        for (s, (_, nodes)) in parts.iter().enumerate() {
            bld.graphs.push(Graph::new());
            bld.maps.push(vec![None; n]);
            bld.copies.push(Vec::new());
            for &i in nodes {
                bld.node(s, i)?;
            }
        }
        // Outputs are read from the split holding their memory's latest contents.
        let mut output_at = vec![None; n];
        for i in 0..n {
            let t = &graph.tensors[i];
            if !t.output {
                continue;
            }
            let root = t.view_src.map_or(i, |r| r.index());
            let holder = match (bld.loc[root], &t.leaf) {
                (Some((s, _)), _) => s,
                // An input only read as an output: the first split keeps it.
                (None, Leaf::Input) => 0,
                // Weights and state are read from their buffers.
                _ => continue,
            };
            let local = bld.resolve(holder, i)?;
            bld.graphs[holder].set_output(local)?;
            output_at[i] = Some((holder, local));
        }
        let Builder { graphs, copies, input_at, .. } = bld;
        let mut splits = Vec::with_capacity(parts.len());
        let mut staging = 0;
        for (((b, nodes), g), copies) in parts.into_iter().zip(graphs).zip(copies) {
            let plan = self.backends[b].plan(&g).map_err(|e| match e {
                Error::InvalidArgument(m) => Error::arg(format!(
                    "scheduler: planning a split on backend {}: {m}",
                    self.backends[b].name()
                )),
                e => e,
            })?;
            staging = copies.iter().map(|c| c.nbytes).fold(staging, usize::max);
            splits.push(Split {
                backend: b,
                nodes: nodes.into_iter().map(|i| graph.id_at(i)).collect(),
                plan,
                copies,
            });
        }
        Ok(SchedPlan {
            names: self.backends.iter().map(|b| b.name().to_string()).collect(),
            graph,
            assign,
            splits,
            input_at,
            output_at,
            staging: vec![0; staging],
        })
    }

    /// The backend of every node that runs (`None` for leaves, views and skipped nodes).
    fn assign(&self, graph: &Graph, needed: &[bool]) -> Result<Vec<Option<usize>>> {
        let mut assign = vec![None; graph.len()];
        for (i, t) in graph.tensors.iter().enumerate() {
            if !needed[i] || matches!(t.op, Op::None | Op::View) {
                continue;
            }
            let id = graph.id_at(i);
            let buffer_of = |r: TensorId| match &graph.tensors[r.index()].leaf {
                Leaf::Weight { buffer, .. } | Leaf::State { buffer, .. } => Some(buffer),
                _ => None,
            };
            // A node writing into a caller's buffer (a KV cache) must run where that buffer is.
            let dst = t.view_src.and_then(buffer_of);
            let srcs: Vec<&Buffer> = t.srcs().filter_map(|s| buffer_of(graph.root(s))).collect();
            let can_use = |b: &Arc<dyn Backend>, buf: &Buffer| b.supports_buft(&*buf.buffer_type());
            let supports: Vec<bool> =
                self.backends.iter().map(|b| b.supports_op(graph, id)).collect();
            let best = (0..self.backends.len()).find(|&k| {
                let b = &self.backends[k];
                supports[k]
                    && dst.is_none_or(|d| can_use(b, d))
                    && srcs.iter().all(|s| can_use(b, s))
            });
            let pick = match (best, dst) {
                (Some(k), _) => k,
                (None, None) => match supports.iter().position(|&s| s) {
                    Some(k) => k,
                    None => {
                        return Err(Error::Unsupported {
                            op: t.op.name(),
                            backend: self.names(),
                            msg: format!("no backend supports {}", graph.describe(id)),
                        });
                    }
                },
                (None, Some(d)) => {
                    return Err(Error::Unsupported {
                        op: t.op.name(),
                        backend: self.names(),
                        msg: format!(
                            "{} writes into buffer '{}', and no backend that supports the op \
                             can use that buffer type",
                            graph.describe(id),
                            d.name()
                        ),
                    });
                }
            };
            assign[i] = Some(pick);
        }
        Ok(assign)
    }

    fn names(&self) -> String {
        self.backends.iter().map(|b| b.name()).collect::<Vec<_>>().join(", ")
    }
}

/// Builds the split graphs in order.
struct Builder<'a> {
    graph: &'a Graph,
    backends: &'a [Arc<dyn Backend>],
    split_backend: Vec<usize>,
    graphs: Vec<Graph>,
    /// Per split, per tensor of the scheduled graph: its id in the split's graph.
    maps: Vec<Vec<Option<TensorId>>>,
    copies: Vec<Vec<Copy>>,
    /// Per root of the scheduled graph: the split (and local id) holding its latest contents.
    loc: Vec<Option<(usize, TensorId)>>,
    input_at: Vec<Option<(usize, TensorId)>>,
}

impl Builder<'_> {
    /// Adds node `i` to split `s`.
    fn node(&mut self, s: usize, i: usize) -> Result<()> {
        let t = &self.graph.tensors[i];
        let mut src = [None; MAX_SRC];
        for (k, x) in t.src.iter().enumerate() {
            if let Some(x) = x {
                src[k] = Some(self.resolve(s, x.index())?);
            }
        }
        let view_src = match t.view_src {
            Some(r) => Some(self.resolve_root(s, r.index())?),
            None => None,
        };
        let local = self.graphs[s].push_raw(Tensor {
            src,
            view_src,
            leaf: Leaf::None,
            output: false,
            ..t.clone()
        })?;
        self.maps[s][i] = Some(local);
        // An op writing in place into an arena tensor is kept even when later splits read
        // the tensor it wrote into rather than its result.
        if let Some(r) = t.view_src
            && matches!(self.graph.tensors[r.index()].leaf, Leaf::None | Leaf::Input)
        {
            self.graphs[s].set_output(local)?;
        }
        match (t.view_src, view_src) {
            // Written in place: that root's latest contents are now in this split.
            (Some(r), Some(lr)) => self.loc[r.index()] = Some((s, lr)),
            _ => self.loc[i] = Some((s, local)),
        }
        Ok(())
    }

    /// The id in split `s` of tensor `x` of the scheduled graph, importing it if needed.
    fn resolve(&mut self, s: usize, x: usize) -> Result<TensorId> {
        if let Some(l) = self.maps[s][x] {
            return Ok(l);
        }
        let t = &self.graph.tensors[x];
        let Some(r) = t.view_src else { return self.resolve_root(s, x) };
        // A view (or an in-place result computed elsewhere): rebuilt over the local root.
        let lr = self.resolve_root(s, r.index())?;
        let a = match (&t.op, t.src[0]) {
            (Op::View, Some(a)) => self.resolve(s, a.index())?,
            _ => lr,
        };
        let mut src = [None; MAX_SRC];
        src[0] = Some(a);
        let local = self.graphs[s].push_raw(Tensor {
            op: Op::View,
            src,
            view_src: Some(lr),
            leaf: Leaf::None,
            output: false,
            ..t.clone()
        })?;
        self.maps[s][x] = Some(local);
        Ok(local)
    }

    /// The id in split `s` of root `r` (a tensor owning its memory), importing it if needed.
    fn resolve_root(&mut self, s: usize, r: usize) -> Result<TensorId> {
        if let Some(l) = self.maps[s][r] {
            return Ok(l);
        }
        let t = &self.graph.tensors[r];
        let as_input = Tensor {
            op: Op::None,
            src: [None; MAX_SRC],
            view_src: None,
            view_offs: 0,
            leaf: Leaf::Input,
            output: false,
            ..t.clone()
        };
        let local = match &t.leaf {
            Leaf::Weight { buffer, offset } | Leaf::State { buffer, offset } => {
                let b = &self.backends[self.split_backend[s]];
                if b.supports_buft(&*buffer.buffer_type()) {
                    self.graphs[s].push_raw(Tensor { output: false, ..t.clone() })?
                } else {
                    let local = self.graphs[s].push_raw(as_input)?;
                    self.copies[s].push(Copy {
                        from: Source::Buffer {
                            buffer: buffer.clone(),
                            offset: *offset,
                            dtype: t.dtype,
                            ne: t.ne,
                        },
                        to: local,
                        nbytes: t.nbytes(),
                    });
                    local
                }
            }
            _ => match self.loc[r] {
                None if matches!(t.leaf, Leaf::Input) => {
                    let local = self.graphs[s].push_raw(as_input)?;
                    self.loc[r] = Some((s, local));
                    self.input_at[r] = Some((s, local));
                    local
                }
                Some((from, id)) if from != s => {
                    let local = self.graphs[s].push_raw(as_input)?;
                    self.graphs[from].set_output(id)?;
                    self.copies[s].push(Copy {
                        from: Source::Split { split: from, id },
                        to: local,
                        nbytes: t.nbytes(),
                    });
                    local
                }
                _ => {
                    return Err(Error::arg(format!(
                        "scheduler: {} is read before it is computed",
                        self.graph.describe(self.graph.id_at(r))
                    )));
                }
            },
        };
        self.maps[s][r] = Some(local);
        Ok(local)
    }
}

impl SchedPlan {
    /// Copies values into an input tensor of the scheduled graph.
    pub fn set_input<T: Element>(&mut self, id: TensorId, data: &[T]) -> Result<()> {
        crate::plan::input_of_type::<T>(&self.graph, id)?;
        self.set_input_bytes(id, bytemuck::cast_slice(data))
    }

    /// Copies raw bytes into an input tensor (its type's bytes, contiguous).
    pub fn set_input_bytes(&mut self, id: TensorId, data: &[u8]) -> Result<()> {
        self.graph.get("set_input", id)?;
        let Some((s, local)) = self.input_at[id.index()] else {
            return Err(Error::arg(format!(
                "set_input: {} is not an input that a computed node reads",
                self.graph.describe(id)
            )));
        };
        self.splits[s].plan.set_input_bytes(local, data)
    }

    /// Runs the splits in order, copying each split's inputs in first. Allocates nothing of its
    /// own. On error the plan stays usable.
    pub fn compute(&mut self) -> Result<()> {
        let SchedPlan { splits, staging, .. } = self;
        for s in 0..splits.len() {
            let (done, rest) = splits.split_at_mut(s);
            let cur = &mut rest[0];
            for c in &cur.copies {
                let tmp = &mut staging[..c.nbytes];
                match &c.from {
                    Source::Split { split, id } => {
                        let src = &done[*split].plan;
                        if let Some(bytes) = src.host_bytes(*id) {
                            cur.plan.set_input_bytes(c.to, bytes)?;
                        } else {
                            src.read_bytes(*id, 0, tmp)?;
                            cur.plan.set_input_bytes(c.to, tmp)?;
                        }
                    }
                    Source::Buffer { buffer, offset, dtype, ne } => {
                        if buffer.is_device() || buffer.is_repacked() {
                            buffer.get_tensor(*offset, *dtype, ne, tmp)?;
                            cur.plan.set_input_bytes(c.to, tmp)?;
                        } else {
                            buffer.with_bytes(|b| {
                                cur.plan.set_input_bytes(c.to, &b[*offset..*offset + c.nbytes])
                            })??;
                        }
                    }
                }
            }
            cur.plan.compute()?;
        }
        Ok(())
    }

    /// Copies the bytes of an output (or input) tensor into `out` (its whole size).
    pub fn read_output_bytes(&self, id: TensorId, out: &mut [u8]) -> Result<()> {
        self.graph.get("output", id)?;
        let Some((s, local)) = self.output_at[id.index()] else {
            return Err(Error::arg(format!(
                "output: {} is not an output of this plan (mark it with set_output)",
                self.graph.describe(id)
            )));
        };
        let nbytes = self.graph.t(id).nbytes();
        if out.len() != nbytes {
            return Err(Error::arg(format!(
                "output: {} has {nbytes} bytes, got room for {}",
                self.graph.describe(id),
                out.len()
            )));
        }
        self.splits[s].plan.read_bytes(local, 0, out)
    }

    /// The values of an output tensor after `compute`.
    pub fn output<T: Element>(&self, id: TensorId) -> Result<Vec<T>> {
        let t = self.graph.get("output", id)?;
        if t.dtype != T::DTYPE {
            return Err(Error::arg(format!("output: {} is not {}", t.describe(id), T::DTYPE)));
        }
        let mut v = vec![T::zeroed(); t.nelements()];
        self.read_output_bytes(id, bytemuck::cast_slice_mut(&mut v))?;
        Ok(v)
    }

    /// Installs (or removes) one eval callback for every split (ggml's
    /// `ggml_backend_sched_set_eval_callback`): it sees each computed node of every split in
    /// order, with the node's id and name in its split's graph. `Err` when a split's backend has
    /// no eval callback.
    pub fn set_eval_callback(&mut self, cb: Option<EvalCallback>) -> Result<()> {
        let shared = cb.map(|cb| Arc::new(std::sync::Mutex::new(cb)));
        for s in &mut self.splits {
            let each: Option<EvalCallback> = shared.clone().map(|f| {
                Box::new(move |n: &NodeEval<'_>| match f.lock() {
                    Ok(mut f) => (*f)(n),
                    Err(_) => false,
                }) as EvalCallback
            });
            s.plan.set_eval_callback(each)?;
        }
        Ok(())
    }

    /// The scheduled graph.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The backend (its index in the scheduler's list) that computes node `id`; `None` for
    /// leaves, views and nodes no output needs.
    pub fn backend_of(&self, id: TensorId) -> Option<usize> {
        self.graph.get("backend_of", id).ok()?;
        self.assign[id.index()]
    }

    /// The name of the backend that computes node `id`.
    pub fn backend_name_of(&self, id: TensorId) -> Option<&str> {
        self.backend_of(id).map(|b| self.names[b].as_str())
    }

    /// Number of splits (runs of consecutive nodes on one backend).
    pub fn n_splits(&self) -> usize {
        self.splits.len()
    }

    /// The backend index of split `s`.
    pub fn split_backend(&self, s: usize) -> Option<usize> {
        self.splits.get(s).map(|x| x.backend)
    }

    /// The nodes (ids of the scheduled graph) split `s` computes, in order.
    pub fn split_nodes(&self, s: usize) -> &[TensorId] {
        self.splits.get(s).map_or(&[], |x| &x.nodes)
    }

    /// The plan of split `s` (its graph and statistics).
    pub fn split_plan(&self, s: usize) -> Option<&dyn BackendPlan> {
        self.splits.get(s).map(|x| &*x.plan)
    }

    /// Tensor copies into split `s` per compute.
    pub fn split_copies(&self, s: usize) -> usize {
        self.splits.get(s).map_or(0, |x| x.copies.len())
    }

    /// Tensor copies per compute, over all splits (ggml's `n_copies` of the split inputs).
    pub fn n_copies(&self) -> usize {
        self.splits.iter().map(|s| s.copies.len()).sum()
    }
}
