//! The executor: every worker of the backend's pool walks the node list, does its share
//! `(ith, nth)` of each node (phase by phase), and meets the others at a spinning barrier between
//! phases. Errors, panics and the abort hook raise a flag before the barrier, so every worker sees
//! it after the barrier and all stop at the same node.

use super::ExecNode;
use crate::backend::pool::{SpinBarrier, Workers};
use crate::error::{Error, Result};
use crate::ops::NodeCtx;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

struct Shared<'a> {
    barrier: SpinBarrier,
    /// The step (phase index across the whole graph) at which workers stop; `usize::MAX` = never.
    /// A request made at step s is made before barrier s, and every worker compares with its own
    /// step after that barrier, so all stop at the same barrier.
    stop_at: AtomicUsize,
    error: Mutex<Option<Error>>,
    /// Chunk counters for ops that hand out work dynamically. Step s uses `counters[s % 2]`; worker
    /// 0 zeroes the other one before barrier s, when no worker can still be using it.
    counters: [AtomicUsize; 2],
    hook: Option<&'a (dyn Fn() -> bool + Send + Sync)>,
    /// The plan's kernel table, the same for every node, phase and worker of the compute.
    kt: &'static crate::kernels::KernelTable,
    /// The eval callback, run by worker 0 after each node while the others wait.
    eval: Option<&'a (dyn Fn(&ExecNode) -> bool + Sync)>,
    /// Set by worker 0 when the eval callback stops the compute; read after the barrier that
    /// follows the callback.
    halted: AtomicBool,
    /// Per node: computed this time (`None`: all).
    active: Option<&'a [bool]>,
}

impl Shared<'_> {
    fn fail(&self, step: usize, e: Error) {
        self.record(e);
        self.stop_at.fetch_min(step, Ordering::AcqRel);
    }

    /// Keeps the first error of the compute.
    fn record(&self, e: Error) {
        if let Ok(mut slot) = self.error.lock()
            && slot.is_none()
        {
            *slot = Some(e);
        }
    }

    fn stopped(&self, step: usize) -> bool {
        self.stop_at.load(Ordering::Acquire) <= step
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".into()
    }
}

fn worker(
    nodes: &[ExecNode],
    sh: &Shared<'_>,
    ith: usize,
    nth: usize,
    work: *mut u8,
    work_len: usize,
) {
    let mut step = 0usize;
    for (i, node) in nodes.iter().enumerate() {
        // Every worker reads the same flags, so all skip the same nodes (and their barriers).
        if sh.active.is_some_and(|a| !a[i]) {
            continue;
        }
        for phase in 0..node.phases {
            if !sh.stopped(step) {
                let ctx = NodeCtx {
                    node,
                    work,
                    work_len,
                    counter: &sh.counters[step % 2],
                    nth,
                    kt: sh.kt,
                    ith,
                    taken: Default::default(),
                };
                let r = catch_unwind(AssertUnwindSafe(|| crate::ops::compute(&ctx, phase, ith)));
                match r {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => sh.fail(step, e),
                    Err(p) => sh.fail(
                        step,
                        Error::Panicked { name: node.label(), msg: panic_message(p.as_ref()) },
                    ),
                }
            }
            if ith == 0 {
                // Zero the next step's counter; the barrier publishes it.
                sh.counters[(step + 1) % 2].store(0, Ordering::Relaxed);
                if phase + 1 == node.phases
                    && let Some(h) = sh.hook
                {
                    // A panicking hook counts as a request to stop (the other workers are
                    // waiting at the barrier; unwinding past it would strand them).
                    if catch_unwind(AssertUnwindSafe(h)).unwrap_or(true) {
                        sh.fail(step, Error::Aborted);
                    }
                }
            }
            sh.barrier.wait();
            if sh.stopped(step) {
                return;
            }
            if let Some(ev) = sh.eval
                && phase + 1 == node.phases
            {
                // Every worker is past the node, none has started the next one: worker 0 shows
                // the result while the others wait, so it is neither being written nor reused.
                if ith == 0 {
                    let stop = match catch_unwind(AssertUnwindSafe(|| ev(node))) {
                        Ok(true) => None,
                        Ok(false) => Some(Error::Stopped { node: node.label() }),
                        Err(p) => Some(Error::Panicked {
                            name: "eval callback".into(),
                            msg: panic_message(p.as_ref()),
                        }),
                    };
                    // Not `fail`: a worker still between the barrier above and its check of
                    // `stop_at` would leave now and strand worker 0 at the barrier below. The
                    // halt flag is read only after it.
                    if let Some(e) = stop {
                        sh.record(e);
                        sh.halted.store(true, Ordering::Release);
                    }
                }
                sh.barrier.wait();
                if sh.halted.load(Ordering::Acquire) {
                    return;
                }
            }
            step += 1;
        }
    }
}

/// The caller's hooks into a compute.
pub(crate) struct Hooks<'a> {
    /// Polled after each node; `true` stops the compute.
    pub abort: Option<&'a (dyn Fn() -> bool + Send + Sync)>,
    /// The eval callback (see `Shared::eval`).
    pub eval: Option<&'a (dyn Fn(&ExecNode) -> bool + Sync)>,
    /// Per node: whether this compute runs it (`None`: all); nodes only an unselected
    /// `forward_select` branch needs are skipped.
    pub active: Option<&'a [bool]>,
}

pub(crate) fn run(
    nodes: &[ExecNode],
    workers: &Workers,
    nth: usize,
    kt: &'static crate::kernels::KernelTable,
    work: *mut u8,
    work_len: usize,
    hooks: Hooks<'_>,
) -> Result<()> {
    let Hooks { abort: hook, eval, active } = hooks;
    if active.is_some_and(|a| a.len() != nodes.len()) {
        return Err(Error::arg("compute: node flags do not match the plan"));
    }
    let sh = Shared {
        barrier: SpinBarrier::new(nth),
        stop_at: AtomicUsize::new(usize::MAX),
        error: Mutex::new(None),
        counters: [AtomicUsize::new(0), AtomicUsize::new(0)],
        hook,
        kt,
        eval,
        halted: AtomicBool::new(false),
        active,
    };
    let work = WorkPtr(work);
    if nth == 1 {
        worker(nodes, &sh, 0, 1, work.get(), work_len);
    } else {
        let job = |ith: usize| {
            let w = &work;
            worker(nodes, &sh, ith, nth, w.get(), work_len)
        };
        workers.run(nth, &job)?;
    }
    match sh.error.into_inner() {
        Ok(Some(e)) => Err(e),
        Ok(None) => Ok(()),
        Err(p) => Err(p.into_inner().unwrap_or(Error::Aborted)),
    }
}

struct WorkPtr(*mut u8);
impl WorkPtr {
    fn get(&self) -> *mut u8 {
        self.0
    }
}
// SAFETY: the work buffer is owned by the plan for the whole compute; each op gives every worker
// its own disjoint slice of it (or a shared read-only part after a barrier).
unsafe impl Sync for WorkPtr {}
// SAFETY: as above.
unsafe impl Send for WorkPtr {}
