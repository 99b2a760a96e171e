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
