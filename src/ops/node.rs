//! The node contract between the plan and the op drivers: a node with every tensor resolved to
//! an address and a layout ([`TView`]), as the plan hands it to `ops::compute`.

use crate::dtype::DType;
use crate::graph::{MAX_SRC, Op, TensorId};

/// `n` rounded up to a multiple of `a`.
pub(crate) fn align_up(n: usize, a: usize) -> usize {
    n.div_ceil(a) * a
}

/// A tensor's address and layout as the kernels see it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TView {
    pub ptr: *mut u8,
    pub dtype: DType,
    pub ne: [usize; 4],
    pub nb: [usize; 4],
    /// Weights stored in a CPU_REPACK buffer (8-row interleaved layout, `quant::repack`).
    pub repacked: bool,
}

impl TView {
    pub(crate) fn nrows(&self) -> usize {
        self.ne[1] * self.ne[2] * self.ne[3]
    }
    pub(crate) fn nelements(&self) -> usize {
        self.ne.iter().product()
    }
    /// Address of element row (i1, i2, i3).
    ///
    /// # Safety
    /// The indices are below `ne[1..4]`; the plan validated that every such row lies inside the
    /// tensor's memory.
    #[inline(always)]
    pub(crate) unsafe fn row(&self, i1: usize, i2: usize, i3: usize) -> *mut u8 {
        // SAFETY: per the contract, the offset stays inside the tensor's allocation.
        unsafe { self.ptr.add(i1 * self.nb[1] + i2 * self.nb[2] + i3 * self.nb[3]) }
    }
}

/// One node to run, with everything resolved at plan time.
pub(crate) struct ExecNode {
    pub id: TensorId,
    pub op: Op,
    pub dst: TView,
    pub src: [Option<TView>; MAX_SRC],
    pub phases: u8,
}

impl ExecNode {
    /// A placeholder naming the node in compute-time errors; `Plan::compute` replaces it with the
    /// full description (formatting it for every node at plan time would cost more than planning).
    pub(crate) fn label(&self) -> String {
        format!("#{}", self.id.idx)
    }
}

// SAFETY: the raw pointers inside point into the plan's arena and into buffers the plan keeps alive;
// workers only write disjoint parts of a node's destination (see exec.rs).
unsafe impl Send for ExecNode {}
// SAFETY: as above.
unsafe impl Sync for ExecNode {}
