//! The graph builder: tensors held by id in ggml's shape order (`ne[0]` innermost, up to 4 dims, byte
//! strides `nb`), leaf tensors (inputs, weights, state), views, and op nodes. Every op method checks
//! shapes, types and parameters and returns `Result<TensorId>`, so that a [`crate::Plan`] only ever
//! sees valid layouts.

mod attention;
mod autodiff;
mod custom;
mod elementwise;
mod moe;
mod movement;
mod ops;
mod recurrent;
mod rope;
mod train;
mod vision;

pub use attention::FlashAttnParams;
pub use custom::{
    CustomAnyArgs, CustomAnyFn, CustomAnyOp, CustomAnyParams, CustomArgs, CustomFn, CustomOp,
    CustomSplitFn, CustomSrc,
};
pub use elementwise::{GluOp, SortOrder, TriType};
pub use movement::{Gather, ScaleMode};
pub(crate) use ops::plain;
pub use ops::{MatMulHint, Op, UnaryOp};
pub use rope::{RopeMode, RopeParams};
pub use train::{FlashAttnBackLayout, Im2colBackParams, Pool2dParams};
pub use vision::{Conv2dParams, Conv3dParams, PoolOp};

use crate::buffer::Buffer;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Maximum number of dimensions (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;
/// Maximum number of source tensors of one node (ggml's `GGML_MAX_SRC`).
pub const MAX_SRC: usize = 10;
/// Most normalisation rounds [`Graph::dsv4_hc_comb`] accepts. Each round runs for every token
/// inside one node, between abort-hook polls, so the count is bounded: ggml's `i32::MAX` would
/// keep a compute busy for minutes per token.
pub const DSV4_HC_MAX_ITER: i32 = 1024;

/// A handle to a tensor inside one [`Graph`]. It remembers which graph made it (clones of a graph
/// share their handles), so a handle passed to another graph is refused instead of silently
/// naming that graph's tensor with the same number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId {
    pub(crate) idx: u32,
    pub(crate) graph: u32,
}

impl TensorId {
    /// Position of the tensor in its graph (creation order).
    pub fn index(self) -> usize {
        self.idx as usize
    }
}

/// Source of graph ids. Wraps after 2^32 graphs; handles are only compared within one process,
/// so a clash needs two live graphs 2^32 creations apart.
static NEXT_GRAPH_ID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);

fn next_graph_id() -> u32 {
    NEXT_GRAPH_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Where a leaf tensor's data lives.
#[derive(Clone)]
pub(crate) enum Leaf {
    /// Not a leaf: the result of an op (or a view of another tensor).
    None,
    /// Data copied in by the caller before each compute (`Plan::set_input`).
    Input,
    /// Read-only data in a caller-owned buffer (model weights).
    Weight { buffer: Buffer, offset: usize },
    /// Mutable data in a caller-owned buffer that persists across computes (a KV cache).
    State { buffer: Buffer, offset: usize },
}

/// Where a tensor's data lives ([`Graph::storage`]).
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum Storage<'a> {
    /// An input: the caller copies its data in before each compute.
    Input,
    /// Read-only data in a caller-owned buffer at a byte offset.
    Weight {
        /// The buffer.
        buffer: &'a Buffer,
        /// Byte offset of the tensor in it.
        offset: usize,
    },
    /// Mutable data in a caller-owned buffer that persists across computes.
    State {
        /// The buffer.
        buffer: &'a Buffer,
        /// Byte offset of the tensor in it.
        offset: usize,
    },
    /// Memory of another tensor: a view, or an op that writes in place into its source.
    View {
        /// The tensor that owns the memory (never a view itself).
        root: TensorId,
        /// Byte offset into the root.
        offset: usize,
    },
    /// The fresh result of an op.
    Node,
}

/// One tensor of a graph.
#[derive(Clone)]
pub(crate) struct Tensor {
    pub dtype: DType,
    pub ne: [usize; MAX_DIMS],
    pub nb: [usize; MAX_DIMS],
    pub op: Op,
    pub src: [Option<TensorId>; MAX_SRC],
    /// For views: the tensor whose memory this one uses (always a non-view root) and the offset.
    pub view_src: Option<TensorId>,
    pub view_offs: usize,
    pub leaf: Leaf,
    pub name: Option<Box<str>>,
    pub output: bool,
}

impl Tensor {
    pub(crate) fn nelements(&self) -> usize {
        self.ne.iter().product()
    }

    pub(crate) fn nrows(&self) -> usize {
        self.ne[1] * self.ne[2] * self.ne[3]
    }

    /// Bytes spanned by the tensor (ggml's `ggml_nbytes`), 0 for an empty tensor.
    pub(crate) fn nbytes(&self) -> usize {
        nbytes_of(self.dtype, &self.ne, &self.nb)
    }

    /// Rows are contiguous blocks of `ne[0]` elements (`nb[0]` is the type size).
    pub(crate) fn rows_contiguous(&self) -> bool {
        self.nb[0] == self.dtype.type_size()
    }

    /// ggml's `ggml_is_contiguous`: the elements are packed in order with no gaps.
    pub(crate) fn is_contiguous(&self) -> bool {
        is_contiguous(self.dtype, &self.ne, &self.nb)
    }

    pub(crate) fn srcs(&self) -> impl Iterator<Item = TensorId> + '_ {
        self.src.iter().flatten().copied()
    }

    pub(crate) fn label(&self, id: TensorId) -> String {
        match &self.name {
            Some(n) => format!("'{n}'"),
            None => format!("#{}", id.idx),
        }
    }

    pub(crate) fn describe(&self, id: TensorId) -> String {
        format!("{} {} {}", self.label(id), self.dtype, shape_str(&self.ne))
    }
}

pub(crate) fn shape_str(ne: &[usize; MAX_DIMS]) -> String {
    format!("[{}, {}, {}, {}]", ne[0], ne[1], ne[2], ne[3])
}

/// Strides of a packed tensor. Saturates instead of overflowing: shapes that big are then refused
/// by the size checks (`checked_shape`, `checked_nbytes`) rather than panicking here.
pub(crate) fn contiguous_strides(dtype: DType, ne: &[usize; MAX_DIMS]) -> [usize; MAX_DIMS] {
    let mut nb = [0; MAX_DIMS];
    nb[0] = dtype.type_size();
    nb[1] = (ne[0] / dtype.block_size()).saturating_mul(dtype.type_size());
    for i in 2..MAX_DIMS {
        nb[i] = nb[i - 1].saturating_mul(ne[i - 1]);
    }
    nb
}

pub(crate) fn nbytes_of(dtype: DType, ne: &[usize; MAX_DIMS], nb: &[usize; MAX_DIMS]) -> usize {
    checked_nbytes(dtype, ne, nb).unwrap_or(usize::MAX)
}

/// ggml's `ggml_nbytes` with overflow checks: the bytes spanned from the first element to the end
/// of the last one.
pub(crate) fn checked_nbytes(
    dtype: DType,
    ne: &[usize; MAX_DIMS],
    nb: &[usize; MAX_DIMS],
) -> Option<usize> {
    if ne.contains(&0) {
        return Some(0);
    }
    let bs = dtype.block_size();
    let (mut bytes, first) =
        if bs == 1 { (dtype.type_size(), 0) } else { ((ne[0] / bs).checked_mul(nb[0])?, 1) };
    for i in first..MAX_DIMS {
        bytes = (ne[i] - 1).checked_mul(nb[i])?.checked_add(bytes)?;
    }
    Some(bytes)
}

pub(crate) fn is_contiguous(dtype: DType, ne: &[usize; MAX_DIMS], nb: &[usize; MAX_DIMS]) -> bool {
    let mut next = dtype.type_size();
    for i in 0..MAX_DIMS {
        if ne[i] != 1 {
            if nb[i] != next {
                return false;
            }
            next = if i == 0 { dtype.row_bytes(ne[0]) } else { next * ne[i] };
        }
    }
    true
}

/// Checked element count and byte size of a new contiguous tensor.
fn checked_shape(op: &'static str, dtype: DType, ne: &[usize]) -> Result<[usize; MAX_DIMS]> {
    if ne.is_empty() || ne.len() > MAX_DIMS {
        return Err(Error::shape(op, format!("{} dims given, 1 to {MAX_DIMS} allowed", ne.len())));
    }
    let mut out = [1usize; MAX_DIMS];
    out[..ne.len()].copy_from_slice(ne);
    if out[0] % dtype.block_size() != 0 {
        return Err(Error::shape(
            op,
            format!(
                "ne[0] = {} is not a multiple of {dtype}'s block size {}",
                out[0],
                dtype.block_size()
            ),
        ));
    }
    let mut bytes = (out[0] / dtype.block_size())
        .checked_mul(dtype.type_size())
        .ok_or(Error::Overflow { what: "tensor size" })?;
    for &n in &out[1..] {
        bytes = bytes.checked_mul(n).ok_or(Error::Overflow { what: "tensor size" })?;
    }
    if bytes > isize::MAX as usize {
        return Err(Error::Overflow { what: "tensor size" });
    }
    if !counts_fit(dtype, &out) {
        return Err(Error::Overflow { what: "tensor element count" });
    }
    Ok(out)
}

/// True when the tensor would fit in memory with every zero dim read as 1. An empty tensor
/// spans no bytes, but kernels and work-buffer sizes still count its rows (`ne[1] * ne[2] *
/// ne[3]`, times a row or element size), so an empty `[0, 2^40, 2^40]` must not make those
/// products overflow any more than a full tensor can.
fn counts_fit(dtype: DType, ne: &[usize; MAX_DIMS]) -> bool {
    let row = (ne[0] / dtype.block_size()).saturating_mul(dtype.type_size()).max(dtype.type_size());
    ne[1..]
        .iter()
        .try_fold(row, |n, &d| n.checked_mul(d.max(1)))
        .is_some_and(|n| n <= isize::MAX as usize)
}

/// A view's byte offset (from its root) and its strides must be multiples of the type's
/// alignment, or kernels would read `f32`s, `f16`s, ids or blocks at misaligned addresses.
fn check_view_align(
    op: &'static str,
    dtype: DType,
    ne: &[usize; MAX_DIMS],
    nb: &[usize; MAX_DIMS],
    offs: usize,
) -> Result<()> {
    let a = dtype.align();
    if !offs.is_multiple_of(a) {
        return Err(Error::shape(
            op,
            format!(
                "{dtype} view {} at byte offset {offs} is misaligned: {dtype} data needs offsets that are multiples of {a}",
                shape_str(ne)
            ),
        ));
    }
    if let Some(d) = (0..MAX_DIMS).find(|&d| ne[d] > 1 && !nb[d].is_multiple_of(a)) {
        return Err(Error::shape(
            op,
            format!(
                "{dtype} view {} has stride nb[{d}] = {} bytes, not a multiple of {dtype}'s alignment {a}",
                shape_str(ne),
                nb[d]
            ),
        ));
    }
    Ok(())
}

/// A tensor an op writes must not reach the same byte through two different indices, or two
/// workers (or one kernel's reads and writes) race on it.
pub(crate) fn check_no_self_overlap(op: &'static str, t: &Tensor, id: TensorId) -> Result<()> {
    check_disjoint_layout(op, t.dtype, &t.ne, &t.nb, || t.describe(id))
}

/// Sufficient test that a layout maps distinct indices to distinct bytes: with the dims of more
/// than one element sorted by stride, each stride clears everything the smaller ones span.
/// (Interleavings that pass this test are the layouts ggml builds; a stride inside the span of a
/// smaller one means two indices share bytes.) `what` names the written tensor.
pub(crate) fn check_disjoint_layout(
    op: &'static str,
    dtype: DType,
    ne: &[usize; MAX_DIMS],
    nb: &[usize; MAX_DIMS],
    what: impl FnOnce() -> String,
) -> Result<()> {
    if ne.contains(&0) {
        return Ok(());
    }
    let bs = dtype.block_size();
    let mut dims = [(0usize, 0usize); MAX_DIMS];
    let mut n = 0;
    for d in 0..MAX_DIMS {
        let count = if d == 0 { ne[0] / bs } else { ne[d] };
        if count > 1 {
            dims[n] = (count, nb[d]);
            n += 1;
        }
    }
    let dims = &mut dims[..n];
    dims.sort_by_key(|&(_, s)| s);
    let mut span = dtype.type_size();
    for &(count, stride) in dims.iter() {
        if stride < span {
            return Err(Error::shape(
                op,
                format!(
                    "destination {} with strides {nb:?} writes some bytes more than once (a stride of {stride} bytes inside a span of {span}); writing it would race",
                    what()
                ),
            ));
        }
        span = (count - 1).saturating_mul(stride).saturating_add(span);
    }
    Ok(())
}

/// Where a tensor's bytes live, for overlap tests: the arena memory of a root tensor, or a
/// caller buffer.
enum Memory<'a> {
    Root(TensorId),
    Buffer(&'a Buffer),
}

impl Memory<'_> {
    fn same(&self, other: &Memory<'_>) -> bool {
        match (self, other) {
            (Memory::Root(a), Memory::Root(b)) => a == b,
            (Memory::Buffer(a), Memory::Buffer(b)) => a.same(b),
            _ => false,
        }
    }
}

/// ggml's "b divides a" test for broadcast dims, false for a zero divisor instead of a division
/// by zero.
pub(crate) fn divides(d: usize, n: usize) -> bool {
    d != 0 && n.is_multiple_of(d)
}

/// A computation graph under construction. Tensors are created in topological order: an op can
/// only refer to tensors that already exist, and a [`crate::Plan`] runs nodes in creation order.
///
/// ```
/// use quantgraph::{DType, Graph};
/// let mut g = Graph::new();
/// let x = g.input(DType::F32, &[4, 2])?;
/// let y = g.input(DType::F32, &[4, 1])?;
/// let z = g.add(x, y)?; // y broadcast over rows
/// let z = g.silu(z)?;
/// g.set_output(z)?;
/// # Ok::<(), quantgraph::Error>(())
/// ```
#[derive(Clone)]
pub struct Graph {
    pub(crate) tensors: Vec<Tensor>,
    /// Parameters, losses and gradients for automatic differentiation.
    autodiff: autodiff::AutoDiff,
    /// Stamped into every `TensorId` this graph hands out.
    id: u32,
}

impl Default for Graph {
    fn default() -> Graph {
        Graph::new()
    }
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Graph {
        Graph::with_capacity(0)
    }

    /// An empty graph with room for `n` tensors.
    pub fn with_capacity(n: usize) -> Graph {
        Graph {
            tensors: Vec::with_capacity(n),
            autodiff: autodiff::AutoDiff::default(),
            id: next_graph_id(),
        }
    }

    /// The id of this graph's tensor number `i` (callers guarantee `i < len`).
    pub(crate) fn id_at(&self, i: usize) -> TensorId {
        TensorId { idx: i as u32, graph: self.id }
    }

    /// The position of `id` in this graph, if it is one of this graph's tensors.
    fn index_of(&self, id: TensorId) -> Option<usize> {
        (id.graph == self.id && id.index() < self.tensors.len()).then_some(id.index())
    }

    /// Number of tensors (leaves, views and nodes).
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// True when the graph has no tensor.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    pub(crate) fn t(&self, id: TensorId) -> &Tensor {
        &self.tensors[id.index()]
    }

    pub(crate) fn get(&self, op: &'static str, id: TensorId) -> Result<&Tensor> {
        match self.index_of(id) {
            Some(i) => Ok(&self.tensors[i]),
            None if id.graph != self.id => Err(Error::arg(format!(
                "{op}: tensor id {} belongs to another graph (graph {}, this is graph {})",
                id.idx, id.graph, self.id
            ))),
            None => Err(Error::arg(format!(
                "{op}: tensor id {} is not in this graph ({} tensors)",
                id.idx,
                self.tensors.len()
            ))),
        }
    }

    /// Type of a tensor.
    pub fn dtype(&self, id: TensorId) -> Result<DType> {
        Ok(self.get("dtype", id)?.dtype)
    }

    /// Shape (`ne`) of a tensor, ggml order.
    pub fn shape(&self, id: TensorId) -> Result<[usize; MAX_DIMS]> {
        Ok(self.get("shape", id)?.ne)
    }

    /// Byte strides (`nb`) of a tensor.
    pub fn strides(&self, id: TensorId) -> Result<[usize; MAX_DIMS]> {
        Ok(self.get("strides", id)?.nb)
    }

    /// The op that produces a tensor (`Op::None` for leaves).
    pub fn op(&self, id: TensorId) -> Result<&Op> {
        Ok(&self.get("op", id)?.op)
    }

    /// Ids of a node's sources.
    pub fn sources(&self, id: TensorId) -> Result<Vec<TensorId>> {
        Ok(self.get("sources", id)?.srcs().collect())
    }

    /// Names a tensor (shown in error messages and findable with [`Graph::find`]).
    pub fn set_name(&mut self, id: TensorId, name: &str) -> Result<TensorId> {
        self.get("set_name", id)?;
        self.tensors[id.index()].name = Some(name.into());
        Ok(id)
    }

    /// A tensor's name, if it has one.
    pub fn name(&self, id: TensorId) -> Option<&str> {
        self.index_of(id).and_then(|i| self.tensors[i].name.as_deref())
    }

    /// The first tensor with this name.
    pub fn find(&self, name: &str) -> Option<TensorId> {
        self.tensors.iter().position(|t| t.name.as_deref() == Some(name)).map(|i| self.id_at(i))
    }

    /// Marks a tensor as an output: it is computed, kept alive to the end of the graph and readable
    /// with `Plan::output`. Every op feeding an output runs; others are skipped. `Err` for an id
    /// that is not one of this graph's tensors.
    pub fn set_output(&mut self, id: TensorId) -> Result<()> {
        let i = self.index_of(id).ok_or_else(|| {
            self.get("set_output", id).err().unwrap_or_else(|| Error::arg("set_output: unknown id"))
        })?;
        self.tensors[i].output = true;
        Ok(())
    }
    /// True when `id` was marked with [`Graph::set_output`].
    pub fn is_output(&self, id: TensorId) -> bool {
        self.index_of(id).is_some_and(|i| self.tensors[i].output)
    }

    /// Where a tensor's data lives: what a backend needs to place and read it.
    pub fn storage(&self, id: TensorId) -> Result<Storage<'_>> {
        let t = self.get("storage", id)?;
        Ok(match (&t.leaf, t.view_src) {
            (Leaf::Input, _) => Storage::Input,
            (Leaf::Weight { buffer, offset }, _) => Storage::Weight { buffer, offset: *offset },
            (Leaf::State { buffer, offset }, _) => Storage::State { buffer, offset: *offset },
            (Leaf::None, Some(root)) => Storage::View { root, offset: t.view_offs },
            (Leaf::None, None) => Storage::Node,
        })
    }

    /// Ids of every tensor in creation order (a valid evaluation order).
    pub fn ids(&self) -> impl Iterator<Item = TensorId> + '_ {
        (0..self.tensors.len()).map(|i| self.id_at(i))
    }

    /// Per tensor (by index): true when a plan must compute or hold it: outputs, writes into
    /// state buffers, and everything they depend on.
    pub(crate) fn needed(&self) -> Vec<bool> {
        self.reached(false)
    }

    /// Like [`Graph::needed`], but a `forward_select` node depends only on its selected branch:
    /// what a compute runs.
    pub(crate) fn active(&self) -> Vec<bool> {
        self.reached(true)
    }

    fn reached(&self, follow_selection: bool) -> Vec<bool> {
        let n = self.tensors.len();
        let mut needed = vec![false; n];
        for (i, t) in self.tensors.iter().enumerate() {
            let writes_state = !matches!(t.op, Op::None | Op::View)
                && t.view_src
                    .is_some_and(|r| matches!(self.tensors[r.index()].leaf, Leaf::State { .. }));
            if t.output || writes_state {
                needed[i] = true;
            }
        }
        for i in (0..n).rev() {
            if needed[i] {
                let t = &self.tensors[i];
                if let (true, Op::ForwardSelect { idx }) = (follow_selection, &t.op) {
                    if let Some(s) = t.src[*idx] {
                        needed[s.index()] = true;
                    }
                    continue;
                }
                for s in t.srcs() {
                    needed[s.index()] = true;
                }
                if let Some(r) = t.view_src {
                    needed[r.index()] = true;
                }
            }
        }
        needed
    }

    /// Appends a tensor as it is (a scheduler copying nodes into per-backend graphs); the
    /// caller gives sources and view roots that are this graph's ids.
    pub(crate) fn push_raw(&mut self, t: Tensor) -> Result<TensorId> {
        self.push(t)
    }

    fn push(&mut self, t: Tensor) -> Result<TensorId> {
        let idx = u32::try_from(self.tensors.len())
            .map_err(|_| Error::arg("graph: more than 2^32 tensors"))?;
        self.tensors.push(t);
        Ok(TensorId { idx, graph: self.id })
    }

    fn leaf(
        &mut self,
        op: &'static str,
        dtype: DType,
        ne: &[usize],
        leaf: Leaf,
    ) -> Result<TensorId> {
        let ne = checked_shape(op, dtype, ne)?;
        let nb = contiguous_strides(dtype, &ne);
        self.push(Tensor {
            dtype,
            ne,
            nb,
            op: Op::None,
            src: [None; MAX_SRC],
            view_src: None,
            view_offs: 0,
            leaf,
            name: None,
            output: false,
        })
    }

    /// An input tensor whose data the caller copies in before each compute (`Plan::set_input`).
    pub fn input(&mut self, dtype: DType, ne: &[usize]) -> Result<TensorId> {
        self.leaf("input", dtype, ne, Leaf::Input)
    }

    fn bound(
        &mut self,
        op: &'static str,
        dtype: DType,
        ne: &[usize],
        buffer: &Buffer,
        offset: usize,
        state: bool,
    ) -> Result<TensorId> {
        let ne4 = checked_shape(op, dtype, ne)?;
        let nb = contiguous_strides(dtype, &ne4);
        let bytes = nbytes_of(dtype, &ne4, &nb);
        let end = offset.checked_add(bytes).ok_or(Error::Overflow { what: "tensor offset" })?;
        if end > buffer.len() {
            return Err(Error::shape(
                op,
                format!(
                    "{dtype} {} needs bytes {offset}..{end} but the buffer has {} bytes",
                    shape_str(&ne4),
                    buffer.len()
                ),
            ));
        }
        let a = dtype.align();
        // An empty tensor reads no byte, so its address (an empty buffer's is only a
        // placeholder) has nothing to be aligned for.
        if bytes > 0 && !(buffer.ptr() as usize).wrapping_add(offset).is_multiple_of(a) {
            return Err(Error::shape(
                op,
                format!(
                    "{dtype} {} at byte offset {offset} of buffer '{}' is misaligned: {dtype} data needs an address that is a multiple of {a} (a GGUF file with general.alignment below {a} can place tensors like this)",
                    shape_str(&ne4),
                    buffer.name()
                ),
            ));
        }
        if state && !buffer.is_writable() {
            return Err(Error::Buffer(format!(
                "{op}: buffer '{}' is read-only; state tensors need a writable buffer",
                buffer.name()
            )));
        }
        if buffer.is_repacked() {
            if state {
                return Err(Error::Buffer(format!(
                    "{op}: buffer '{}' holds repacked weights; state tensors need a plain buffer",
                    buffer.name()
                )));
            }
            if !buffer.holds_repacked(offset, dtype, &ne4) {
                return Err(Error::Buffer(format!(
                    "{op}: no {dtype} {} was stored at offset {offset} of repacked buffer '{}' \
                     (store it with Buffer::set_tensor first, with the same type and shape)",
                    shape_str(&ne4),
                    buffer.name()
                )));
            }
        }
        let leaf = if state {
            Leaf::State { buffer: buffer.clone(), offset }
        } else {
            Leaf::Weight { buffer: buffer.clone(), offset }
        };
        self.leaf(op, dtype, ne, leaf)
    }

    /// A read-only tensor stored in `buffer` at byte `offset` (model weights). The buffer is shared,
    /// not copied, and is kept alive by the graph and its plans.
    pub fn weight(
        &mut self,
        dtype: DType,
        ne: &[usize],
        buffer: &Buffer,
        offset: usize,
    ) -> Result<TensorId> {
        self.bound("weight", dtype, ne, buffer, offset, false)
    }

    /// A mutable tensor stored in `buffer` at byte `offset` whose contents persist across computes
    /// (a KV cache). Ops write into it through views, e.g. `g.cpy(k_cur, g.view_1d(cache, ..)?)`.
    pub fn state(
        &mut self,
        dtype: DType,
        ne: &[usize],
        buffer: &Buffer,
        offset: usize,
    ) -> Result<TensorId> {
        self.bound("state", dtype, ne, buffer, offset, true)
    }

    /// The root tensor whose memory `id` uses (itself when it is not a view).
    pub(crate) fn root(&self, id: TensorId) -> TensorId {
        self.t(id).view_src.unwrap_or(id)
    }

    /// A new op node with a fresh contiguous result.
    pub(crate) fn node(
        &mut self,
        op: Op,
        dtype: DType,
        ne: [usize; MAX_DIMS],
        srcs: &[TensorId],
    ) -> Result<TensorId> {
        let mut src = [None; MAX_SRC];
        for (s, &id) in src.iter_mut().zip(srcs) {
            *s = Some(id);
        }
        self.node_opt(op, dtype, ne, &src)
    }

    /// A new op node whose sources sit at fixed positions, some of them absent.
    pub(crate) fn node_opt(
        &mut self,
        op: Op,
        dtype: DType,
        ne: [usize; MAX_DIMS],
        srcs: &[Option<TensorId>],
    ) -> Result<TensorId> {
        // Every result shape goes through the same size check as leaves, so no builder can make a
        // tensor whose strides overflow, whatever parameters the caller gave.
        let ne = checked_shape("node", dtype, &ne)?;
        let nb = contiguous_strides(dtype, &ne);
        for (pos, s) in srcs.iter().enumerate() {
            if let Some(s) = *s {
                self.get(op.name(), s)?;
                self.check_repacked_use(&op, pos, s)?;
            }
        }
        let mut src = [None; MAX_SRC];
        src[..srcs.len()].copy_from_slice(srcs);
        self.push(Tensor {
            dtype,
            ne,
            nb,
            op,
            src,
            view_src: None,
            view_offs: 0,
            leaf: Leaf::None,
            name: None,
            output: false,
        })
    }

    /// The memory `id` lives in and the byte range it spans there (empty for an empty tensor).
    fn byte_range(&self, id: TensorId) -> (Memory<'_>, usize, usize) {
        let t = self.t(id);
        let root = self.root(id);
        let view_offs = if t.view_src.is_some() { t.view_offs } else { 0 };
        let (mem, start) = match &self.t(root).leaf {
            Leaf::Weight { buffer, offset } | Leaf::State { buffer, offset } => {
                (Memory::Buffer(buffer), offset.saturating_add(view_offs))
            }
            Leaf::None | Leaf::Input => (Memory::Root(root), view_offs),
        };
        (mem, start, start.saturating_add(t.nbytes()))
    }

    /// True when `a` and `b` may touch the same bytes: they live in the same memory and their
    /// byte ranges intersect.
    pub(crate) fn overlaps(&self, a: TensorId, b: TensorId) -> bool {
        let (ma, sa, ea) = self.byte_range(a);
        let (mb, sb, eb) = self.byte_range(b);
        ma.same(&mb) && sa < ea && sb < eb && sa < eb && sb < ea
    }

    /// True when `a` and `b` are the same elements of the same memory (type, shape, strides
    /// and start), so an elementwise op reading one and writing the other touches each element
    /// from one worker only.
    pub(crate) fn same_layout(&self, a: TensorId, b: TensorId) -> bool {
        let (ta, tb) = (self.t(a), self.t(b));
        let (ma, sa, _) = self.byte_range(a);
        let (mb, sb, _) = self.byte_range(b);
        ma.same(&mb) && sa == sb && ta.dtype == tb.dtype && ta.ne == tb.ne && ta.nb == tb.nb
    }

    /// An op that writes `dst` while reading `src` needs the two apart: workers write their share
    /// of `dst` while others still read `src`, and a copy between overlapping ranges is undefined.
    pub(crate) fn check_apart(
        &self,
        op: &'static str,
        dst: TensorId,
        src: TensorId,
        what: &str,
    ) -> Result<()> {
        if !self.overlaps(dst, src) {
            return Ok(());
        }
        let (_, sd, ed) = self.byte_range(dst);
        let (_, ss, es) = self.byte_range(src);
        Err(Error::shape(
            op,
            format!(
                "{what} {} (bytes {ss}..{es}) shares memory with the destination {} (bytes {sd}..{ed}); copy it with cont first",
                self.t(src).describe(src),
                self.t(dst).describe(dst)
            ),
        ))
    }

    /// True when `id` is a weight stored in a CPU_REPACK buffer (interleaved layout).
    pub(crate) fn is_repacked(&self, id: TensorId) -> bool {
        matches!(&self.t(self.root(id)).leaf, Leaf::Weight { buffer, .. } if buffer.is_repacked())
    }

    /// Repacked weights are only readable by the repacked matmuls: as the first source of
    /// `mul_mat` or `mul_mat_id`, whole (not through a view).
    fn check_repacked_use(&self, op: &Op, pos: usize, s: TensorId) -> Result<()> {
        if !self.is_repacked(s) {
            return Ok(());
        }
        if matches!(op, Op::MulMat | Op::MulMatId) && pos == 0 && self.t(s).view_src.is_none() {
            return Ok(());
        }
        Err(Error::Unsupported {
            op: op.name(),
            backend: "CPU".into(),
            msg: format!(
                "{} is stored in a repacked buffer; repacked weights can only be the first \
                 source of mul_mat or mul_mat_id (keep this tensor in a plain buffer)",
                self.t(s).describe(s)
            ),
        })
    }

    /// A view of `a` with the given shape, strides and byte offset; checked against `a`'s extent.
    fn make_view(
        &mut self,
        op: &'static str,
        a: TensorId,
        ne: [usize; MAX_DIMS],
        nb: [usize; MAX_DIMS],
        offset: usize,
        kind: Op,
    ) -> Result<TensorId> {
        let src = self.get(op, a)?;
        self.check_repacked_use(&kind, 1, a)?;
        let dtype = src.dtype;
        let root = src.view_src.unwrap_or(a);
        let base = if src.view_src.is_some() { src.view_offs } else { 0 };
        let root_bytes = self.t(root).nbytes();
        let offs = base.checked_add(offset).ok_or(Error::Overflow { what: "view offset" })?;
        let span = checked_nbytes(dtype, &ne, &nb).ok_or(Error::Overflow { what: "view size" })?;
        let end = offs.checked_add(span).ok_or(Error::Overflow { what: "view size" })?;
        if end > root_bytes {
            return Err(Error::shape(
                op,
                format!(
                    "view {} with strides {:?} at offset {offset} of {} reaches byte {end}, past its {root_bytes} bytes",
                    shape_str(&ne),
                    nb,
                    self.t(a).describe(a)
                ),
            ));
        }
        if !ne[0].is_multiple_of(dtype.block_size()) {
            return Err(Error::shape(
                op,
                format!("ne[0] = {} is not a multiple of {dtype}'s block size", ne[0]),
            ));
        }
        // The element count must fit too: with zero or tiny strides (or a zero dim) a huge shape
        // spans few bytes, but row and element counts are still computed from it.
        if !counts_fit(dtype, &ne) {
            return Err(Error::Overflow { what: "view element count" });
        }
        // Roots start aligned (arena, `Graph::weight` / `Graph::state` check their address), so
        // an aligned offset and aligned strides keep every element aligned for the kernels.
        check_view_align(op, dtype, &ne, &nb, offs)?;
        self.push(Tensor {
            dtype,
            ne,
            nb,
            op: kind,
            src: [Some(a), None, None, None, None, None, None, None, None, None],
            view_src: Some(root),
            view_offs: offs,
            leaf: Leaf::None,
            name: None,
            output: false,
        })
    }

    /// ggml_view_1d: `ne0` elements of `a` starting at byte `offset`.
    pub fn view_1d(&mut self, a: TensorId, ne0: usize, offset: usize) -> Result<TensorId> {
        let dt = self.get("view_1d", a)?.dtype;
        let ne = [ne0, 1, 1, 1];
        self.make_view("view_1d", a, ne, contiguous_strides(dt, &ne), offset, Op::View)
    }

    /// ggml_view_2d: rows of `ne0` elements, `nb1` bytes apart.
    pub fn view_2d(
        &mut self,
        a: TensorId,
        ne: [usize; 2],
        nb1: usize,
        offset: usize,
    ) -> Result<TensorId> {
        let dt = self.get("view_2d", a)?.dtype;
        let full = [ne[0], ne[1], 1, 1];
        let mut nb = contiguous_strides(dt, &full);
        nb[1] = nb1;
        // Dims 2 and 3 have one element, so these strides never move a pointer.
        nb[2] = nb1.saturating_mul(ne[1]);
        nb[3] = nb[2];
        self.make_view("view_2d", a, full, nb, offset, Op::View)
    }

    /// ggml_view_3d.
    pub fn view_3d(
        &mut self,
        a: TensorId,
        ne: [usize; 3],
        nb: [usize; 2],
        offset: usize,
    ) -> Result<TensorId> {
        let dt = self.get("view_3d", a)?.dtype;
        let full = [ne[0], ne[1], ne[2], 1];
        let mut st = contiguous_strides(dt, &full);
        st[1] = nb[0];
        st[2] = nb[1];
        st[3] = nb[1].saturating_mul(ne[2]); // dim 3 has one element
        self.make_view("view_3d", a, full, st, offset, Op::View)
    }

    /// ggml_view_4d: any shape with byte strides `nb1..nb3` at byte `offset`.
    pub fn view_4d(
        &mut self,
        a: TensorId,
        ne: [usize; 4],
        nb: [usize; 3],
        offset: usize,
    ) -> Result<TensorId> {
        let dt = self.get("view_4d", a)?.dtype;
        let st = [dt.type_size(), nb[0], nb[1], nb[2]];
        self.make_view("view_4d", a, ne, st, offset, Op::View)
    }

    /// ggml_reshape: same elements, new shape; `a` must be contiguous.
    pub fn reshape(&mut self, a: TensorId, ne: &[usize]) -> Result<TensorId> {
        let t = self.get("reshape", a)?;
        let dt = t.dtype;
        if !t.is_contiguous() {
            return Err(Error::shape(
                "reshape",
                format!("{} is not contiguous; use cont first", t.describe(a)),
            ));
        }
        let ne4 = checked_shape("reshape", dt, ne)?;
        if ne4.iter().product::<usize>() != t.nelements() {
            return Err(Error::shape(
                "reshape",
                format!(
                    "{} has {} elements, {} has {}",
                    t.describe(a),
                    t.nelements(),
                    shape_str(&ne4),
                    ne4.iter().product::<usize>()
                ),
            ));
        }
        self.make_view("reshape", a, ne4, contiguous_strides(dt, &ne4), 0, Op::View)
    }

    /// ggml_permute: axis `i` of `a` becomes axis `axes[i]` of the result.
    pub fn permute(&mut self, a: TensorId, axes: [usize; 4]) -> Result<TensorId> {
        let t = self.get("permute", a)?;
        let mut seen = [false; 4];
        for &ax in &axes {
            if ax >= 4 || seen[ax] {
                return Err(Error::param(
                    "permute",
                    format!("axes {axes:?} are not a permutation of 0..4"),
                ));
            }
            seen[ax] = true;
        }
        if t.dtype.block_size() != 1 && axes[0] != 0 {
            return Err(Error::shape(
                "permute",
                format!("cannot move dim 0 of block-quantized {}", t.describe(a)),
            ));
        }
        let mut ne = [0; 4];
        let mut nb = [0; 4];
        for i in 0..4 {
            ne[axes[i]] = t.ne[i];
            nb[axes[i]] = t.nb[i];
        }
        self.make_view("permute", a, ne, nb, 0, Op::View)
    }

    /// ggml_transpose: swaps dims 0 and 1.
    pub fn transpose(&mut self, a: TensorId) -> Result<TensorId> {
        self.permute(a, [1, 0, 2, 3])
    }
}
