//! Custom ops (ggml_map_custom1/2/3, ggml_custom): Rust closures run by the executor's workers.
//! A closure gets its worker's share of the output rows as `&mut [f32]`, so it cannot race with
//! the other workers; a closure that panics or returns `Err` makes compute return `Err`, and the
//! pool and plan stay usable.

use super::{Graph, MAX_SRC, Op, TensorId};
use crate::dtype::DType;
use crate::error::{Error, Result};
use std::ops::Range;
use std::sync::Arc;

/// What a custom op closure sees on one worker.
pub struct CustomArgs<'a> {
    /// This worker's index, below `nth`.
    pub ith: usize,
    /// Number of workers running this op (at most the op's `n_tasks`).
    pub nth: usize,
    /// The sources, contiguous F32, whole.
    pub srcs: &'a [&'a [f32]],
    /// Shapes of the sources (ggml order).
    pub src_shapes: &'a [[usize; 4]],
    /// Shape of the output.
    pub dst_shape: [usize; 4],
    /// Output rows (flat row index over dims 1..3) this worker owns.
    pub rows: Range<usize>,
    /// Those rows, `rows.len() * dst_shape[0]` values.
    pub dst: &'a mut [f32],
}

/// A custom op body.
pub type CustomFn = Arc<dyn Fn(CustomArgs<'_>) -> std::result::Result<(), String> + Send + Sync>;

/// A custom op node's closure, name and task limit.
#[derive(Clone)]
pub struct CustomOp {
    pub(crate) name: Arc<str>,
    pub(crate) f: CustomFn,
    pub(crate) n_tasks: usize,
}

impl std::fmt::Debug for CustomOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CustomOp")
            .field("name", &self.name)
            .field("n_tasks", &self.n_tasks)
            .finish()
    }
}

impl PartialEq for CustomOp {
    fn eq(&self, o: &CustomOp) -> bool {
        Arc::ptr_eq(&self.f, &o.f) && self.name == o.name && self.n_tasks == o.n_tasks
    }
}

impl Graph {
    /// A custom op over up to 6 contiguous F32 sources producing an F32 tensor of shape `ne`.
    /// `n_tasks` limits how many workers run it (`None` = all).
    pub fn custom(
        &mut self,
        name: &str,
        srcs: &[TensorId],
        ne: [usize; 4],
        n_tasks: Option<usize>,
        f: CustomFn,
    ) -> Result<TensorId> {
        if srcs.len() > MAX_SRC {
            return Err(Error::param("custom", format!("{name}: at most {MAX_SRC} sources")));
        }
        for &s in srcs {
            let t = self.get("custom", s)?;
            if t.dtype != DType::F32 || !t.is_contiguous() {
                return Err(Error::ty(
                    "custom",
                    format!(
                        "{name}: source {} must be contiguous F32 (add cont/cast)",
                        t.describe(s)
                    ),
                ));
            }
        }
        if n_tasks == Some(0) {
            return Err(Error::param("custom", format!("{name}: n_tasks must be at least 1")));
        }
        let op = CustomOp { name: name.into(), f, n_tasks: n_tasks.unwrap_or(usize::MAX) };
        self.node(Op::Custom(op), DType::F32, ne, srcs)
    }

    /// ggml_map_custom1: `f` over `a`, output shaped like `a`.
    pub fn map_custom1(
        &mut self,
        a: TensorId,
        name: &str,
        n_tasks: Option<usize>,
        f: CustomFn,
    ) -> Result<TensorId> {
        let ne = self.get("custom", a)?.ne;
        self.custom(name, &[a], ne, n_tasks, f)
    }

    /// ggml_map_custom2: `f` over `a` and `b`, output shaped like `a`.
    pub fn map_custom2(
        &mut self,
        a: TensorId,
        b: TensorId,
        name: &str,
        n_tasks: Option<usize>,
        f: CustomFn,
    ) -> Result<TensorId> {
        let ne = self.get("custom", a)?.ne;
        self.custom(name, &[a, b], ne, n_tasks, f)
    }

    /// ggml_map_custom3: `f` over `a`, `b` and `c`, output shaped like `a`.
    pub fn map_custom3(
        &mut self,
        a: TensorId,
        b: TensorId,
        c: TensorId,
        name: &str,
        n_tasks: Option<usize>,
        f: CustomFn,
    ) -> Result<TensorId> {
        let ne = self.get("custom", a)?.ne;
        self.custom(name, &[a, b, c], ne, n_tasks, f)
    }
}

/// One source of a typed custom op ([`Graph::custom_any`]): its type, shape, strides and the
/// bytes it spans (from its first element to the end of its last, ggml's `ggml_nbytes`).
#[derive(Clone, Copy, Debug)]
pub struct CustomSrc<'a> {
    /// Element type.
    pub dtype: DType,
    /// Shape (ggml order).
    pub ne: [usize; 4],
    /// Byte strides (ggml order; `nb[0]` is the type size for block types).
    pub nb: [usize; 4],
    /// The bytes the tensor spans.
    pub data: &'a [u8],
}

impl<'a> CustomSrc<'a> {
    /// Row `(i1, i2, i3)` as bytes when the tensor's rows are contiguous (`nb[0]` is the type
    /// size); `None` for an index out of range or strided elements.
    pub fn row(&self, i1: usize, i2: usize, i3: usize) -> Option<&'a [u8]> {
        if i1 >= self.ne[1] || i2 >= self.ne[2] || i3 >= self.ne[3] {
            return None;
        }
        if self.nb[0] != self.dtype.type_size() {
            return None;
        }
        let off = i1 * self.nb[1] + i2 * self.nb[2] + i3 * self.nb[3];
        self.data.get(off..off + self.dtype.row_bytes(self.ne[0]))
    }
}

/// What a typed custom op closure sees on one worker.
pub struct CustomAnyArgs<'a> {
    /// This worker's index, below `nth`.
    pub ith: usize,
    /// Number of workers running this op (at most the op's `n_tasks`).
    pub nth: usize,
    /// The sources, whole, read-only.
    pub srcs: &'a [CustomSrc<'a>],
    /// Type of the output.
    pub dst_dtype: DType,
    /// Shape of the output (contiguous).
    pub dst_shape: [usize; 4],
    /// Output rows (flat row index over dims 1..3) this worker owns: the executor's even split,
    /// or what the op's [`CustomSplitFn`] gave this worker.
    pub rows: Range<usize>,
    /// Those rows' bytes, `rows.len()` rows of `dst_dtype.row_bytes(dst_shape[0])` bytes.
    pub dst: &'a mut [u8],
}

/// A typed custom op body.
pub type CustomAnyFn =
    Arc<dyn Fn(CustomAnyArgs<'_>) -> std::result::Result<(), String> + Send + Sync>;

/// A custom op's own split of the output rows: `(ith, nth, nrows)` -> the rows worker `ith`
/// owns. The ranges of all workers must be disjoint and within `0..nrows` (rows nobody owns keep
/// whatever the buffer held); the executor checks this before running the op and returns an
/// `Err` naming the op otherwise.
pub type CustomSplitFn = Arc<dyn Fn(usize, usize, usize) -> Range<usize> + Send + Sync>;

/// Options of a typed custom op.
#[derive(Clone, Default)]
#[non_exhaustive]
pub struct CustomAnyParams {
    /// At most this many workers run it (`None`: all).
    pub n_tasks: Option<usize>,
    /// The op's own split of the output rows (`None`: the executor's even split).
    pub split: Option<CustomSplitFn>,
}

impl CustomAnyParams {
    /// All workers, even split.
    pub fn new() -> CustomAnyParams {
        CustomAnyParams::default()
    }

    /// At most `n` workers.
    pub fn n_tasks(mut self, n: usize) -> CustomAnyParams {
        self.n_tasks = Some(n);
        self
    }

    /// The op's own split of the output rows.
    pub fn split(mut self, f: CustomSplitFn) -> CustomAnyParams {
        self.split = Some(f);
        self
    }
}

/// A typed custom op node's closure, split, name and task limit.
#[derive(Clone)]
pub struct CustomAnyOp {
    pub(crate) name: Arc<str>,
    pub(crate) f: CustomAnyFn,
    pub(crate) split: Option<CustomSplitFn>,
    pub(crate) n_tasks: usize,
}

impl std::fmt::Debug for CustomAnyOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CustomAnyOp")
            .field("name", &self.name)
            .field("n_tasks", &self.n_tasks)
            .field("own_split", &self.split.is_some())
            .finish()
    }
}

impl PartialEq for CustomAnyOp {
    fn eq(&self, o: &CustomAnyOp) -> bool {
        let same_split = match (&self.split, &o.split) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        Arc::ptr_eq(&self.f, &o.f) && same_split && self.name == o.name && self.n_tasks == o.n_tasks
    }
}

impl Graph {
    /// A custom op on sources of any type and layout (ggml_custom_4d), producing a contiguous
    /// tensor of `dtype` and shape `ne`. Block types need `ne[0]` a whole number of blocks and,
    /// as sources, contiguous rows. See [`CustomAnyParams`] for the task limit and the op's own
    /// split of the output rows.
    pub fn custom_any(
        &mut self,
        name: &str,
        srcs: &[TensorId],
        dtype: DType,
        ne: [usize; 4],
        params: CustomAnyParams,
        f: CustomAnyFn,
    ) -> Result<TensorId> {
        const OP: &str = "custom";
        if srcs.len() > MAX_SRC {
            return Err(Error::param(OP, format!("{name}: at most {MAX_SRC} sources")));
        }
        for &s in srcs {
            let t = self.get(OP, s)?;
            if t.dtype.block_size() > 1 && !t.rows_contiguous() {
                return Err(Error::shape(
                    OP,
                    format!("{name}: block-type source {} needs contiguous rows", t.describe(s)),
                ));
            }
        }
        if !ne[0].is_multiple_of(dtype.block_size()) {
            return Err(Error::shape(
                OP,
                format!("{name}: output ne[0] = {} is not a whole number of {dtype} blocks", ne[0]),
            ));
        }
        if params.n_tasks == Some(0) {
            return Err(Error::param(OP, format!("{name}: n_tasks must be at least 1")));
        }
        let op = CustomAnyOp {
            name: name.into(),
            f,
            split: params.split,
            n_tasks: params.n_tasks.unwrap_or(usize::MAX),
        };
        self.node(Op::CustomAny(op), dtype, ne, srcs)
    }
}
