//! A backend's threads: the rayon pool, the team of workers that stay hot between computes, and
//! the spin barrier the executor (`plan::exec`) meets them at.

use crate::error::{Error, Result};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A sense-reversing spin barrier with yield back-off (for more threads than cores).
pub(crate) struct SpinBarrier {
    n: usize,
    count: AtomicUsize,
    generation: AtomicUsize,
}

impl SpinBarrier {
    pub(crate) fn new(n: usize) -> SpinBarrier {
        SpinBarrier { n, count: AtomicUsize::new(0), generation: AtomicUsize::new(0) }
    }

    pub(crate) fn wait(&self) {
        if self.n == 1 {
            return;
        }
        let generation = self.generation.load(Ordering::Acquire);
        if self.count.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
            self.count.store(0, Ordering::Relaxed);
            self.generation.store(generation.wrapping_add(1), Ordering::Release);
            return;
        }
        let mut spins = 0u32;
        while self.generation.load(Ordering::Acquire) == generation {
            if spins < 2000 {
                std::hint::spin_loop();
                spins += 1;
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// A backend's threads: the rayon pool and the team of workers that stay hot between computes.
pub(crate) struct Workers {
    pub(crate) pool: rayon::ThreadPool,
    team: Arc<Team>,
}

impl Workers {
    pub(crate) fn new(pool: rayon::ThreadPool, poll: Duration, affinity: Vec<usize>) -> Workers {
        let n = pool.current_num_threads();
        let slots = (0..n.max(1))
            .map(|_| Slot { state: AtomicU8::new(NOT_STARTED), thread: OnceLock::new() })
            .collect();
        Workers {
            pool,
            team: Arc::new(Team {
                next_ticket: AtomicUsize::new(0),
                serving: AtomicUsize::new(0),
                job: AtomicPtr::new(std::ptr::null_mut()),
                done: AtomicUsize::new(0),
                slots,
                poll_ns: AtomicU64::new(duration_ns(poll)),
                paused: AtomicBool::new(false),
                affinity,
            }),
        }
    }

    pub(crate) fn n_threads(&self) -> usize {
        self.pool.current_num_threads().max(1)
    }

    /// Runs `f(0)` on this thread and `f(1)` .. `f(nth - 1)` on the team (see `Team::run`).
    pub(crate) fn run(&self, nth: usize, f: &(dyn Fn(usize) + Sync)) -> Result<()> {
        self.team.run(&self.pool, nth, f)
    }

    /// How long idle workers poll for the next compute before they sleep.
    pub(crate) fn poll(&self) -> Duration {
        Duration::from_nanos(self.team.poll_ns.load(Ordering::Relaxed))
    }

    pub(crate) fn set_poll(&self, poll: Duration) {
        self.team.poll_ns.store(duration_ns(poll), Ordering::Relaxed);
    }

    /// Paused: idle workers sleep at once instead of polling (computes still run).
    pub(crate) fn set_paused(&self, paused: bool) {
        self.team.paused.store(paused, Ordering::Release);
    }

    pub(crate) fn is_paused(&self) -> bool {
        self.team.paused.load(Ordering::Acquire)
    }

    pub(crate) fn affinity(&self) -> &[usize] {
        &self.team.affinity
    }

    /// Workers asleep now (tests and diagnostics).
    pub(crate) fn n_sleeping(&self) -> usize {
        self.team.slots.iter().filter(|s| s.state.load(Ordering::Acquire) == PARKED).count()
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        // No compute runs (each holds an `Arc<Workers>`): tell every started worker to leave,
        // so its pool thread ends with the pool.
        for slot in self.team.slots.iter() {
            if slot.state.swap(EXIT, Ordering::AcqRel) == PARKED
                && let Some(t) = slot.thread.get()
            {
                t.unpark();
            }
        }
    }
}

fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The default time idle workers poll for the next compute before sleeping.
pub(crate) const DEFAULT_POLL: Duration = Duration::from_micros(300);

const NOT_STARTED: u8 = 0;
const SPINNING: u8 = 1;
const ASSIGNED: u8 = 2;
const PARKED: u8 = 3;
const EXIT: u8 = 4;

/// One worker's state: `NOT_STARTED` (no pool thread runs it yet), `SPINNING` (it polls for
/// work), `ASSIGNED` (the caller gave it the current job), `PARKED` (asleep in its pool thread
/// until the caller unparks it) or `EXIT` (the pool is going away).
#[repr(align(64))]
struct Slot {
    state: AtomicU8,
    /// The pool thread running this worker, set when it starts (before it can park).
    thread: OnceLock<std::thread::Thread>,
}

/// The caller of a compute runs worker 0 itself and hands workers 1.. the job: a worker still
/// polling from the last compute takes it at once (a compare-exchange), one that went to sleep
/// is unparked, one never started is started as a pool job (once in the pool's life: later
/// computes allocate nothing). Workers poll for `poll_ns` after a job, so a stream of computes
/// (a decode loop, a benchmark) does not pay a wake-up each time.
struct Team {
    /// A ticket lock: computes sharing the backend take the team in turn (first come, first
    /// served, so a thread computing in a loop cannot starve another).
    next_ticket: AtomicUsize,
    serving: AtomicUsize,
    /// The current job (a `JobRef` on the caller's stack), valid while its compute holds the
    /// team and until `done` reaches the number of assigned workers.
    job: AtomicPtr<()>,
    /// Workers that finished the current job.
    done: AtomicUsize,
    slots: Box<[Slot]>,
    /// How long (ns) a worker polls for the next job before it parks.
    poll_ns: AtomicU64,
    /// Paused pools do not poll.
    paused: AtomicBool,
    /// CPUs to pin worker i (i >= 1) to: `affinity[i % len]`; empty = not pinned.
    affinity: Vec<usize>,
}

/// Deepest nesting of computes (a custom op computing a plan whose custom op computes another
/// ...) that `Team::run` follows.
const MAX_NESTING: usize = 8;

/// The teams (their addresses) whose jobs the current thread's work belongs to, outermost first.
/// It travels with every job to the workers that run it, so a compute nested through another
/// backend (a -> b -> a) still sees the team it would wait for. Fixed size: compute allocates
/// nothing.
#[derive(Clone, Copy)]
struct Chain {
    teams: [usize; MAX_NESTING],
    len: usize,
}

impl Chain {
    const EMPTY: Chain = Chain { teams: [0; MAX_NESTING], len: 0 };

    fn contains(&self, team: usize) -> bool {
        self.teams[..self.len].contains(&team)
    }

    fn with(mut self, team: usize) -> Option<Chain> {
        *self.teams.get_mut(self.len)? = team;
        self.len += 1;
        Some(self)
    }
}

thread_local! {
    /// The teams this thread is working for, innermost last (empty outside any compute).
    static IN_TEAMS: std::cell::Cell<Chain> = const { std::cell::Cell::new(Chain::EMPTY) };
}

struct JobRef<'a> {
    f: &'a (dyn Fn(usize) + Sync),
    /// The caller's chain plus this team.
    chain: Chain,
}

impl Team {
    /// Runs `f(0)` here and `f(1)` .. `f(nth - 1)` on team workers, and returns when all are
    /// done, after any compute that took the team earlier. A compute started from inside one of
    /// this team's jobs (a custom op computing a plan on the same backend, directly or through
    /// computes on other backends) would wait for itself: it is an error instead.
    fn run(
        self: &Arc<Self>,
        pool: &rayon::ThreadPool,
        nth: usize,
        f: &(dyn Fn(usize) + Sync),
    ) -> Result<()> {
        let me = Arc::as_ptr(self) as usize;
        let outer = IN_TEAMS.with(|t| t.get());
        if outer.contains(me) {
            return Err(Error::arg(if outer.teams[outer.len - 1] == me {
                "compute: a plan on this backend was computed from inside one of its own \
                 computes (a custom op); use another backend for the inner graph"
            } else {
                "compute: a plan on this backend was computed from inside one of its own \
                 computes, through a compute on another backend (a -> b -> a); use another \
                 backend for the inner graph"
            }));
        }
        let chain = outer.with(me).ok_or_else(|| {
            Error::arg(format!(
                "compute: computes nested more than {MAX_NESTING} deep through custom ops"
            ))
        })?;
        assert!(nth <= self.slots.len(), "team: more workers than threads");
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        let mut spins = 0u32;
        while self.serving.load(Ordering::Acquire) != ticket {
            if spins < 2000 {
                std::hint::spin_loop();
                spins += 1;
            } else {
                std::thread::yield_now();
            }
        }
        let job = JobRef { f, chain };
        self.done.store(0, Ordering::Relaxed);
        self.job.store(&job as *const JobRef<'_> as *mut (), Ordering::Release);
        for i in 1..nth {
            let slot = &self.slots[i];
            let st = &slot.state;
            loop {
                match st.compare_exchange(SPINNING, ASSIGNED, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => break,
                    Err(PARKED) => {
                        if st
                            .compare_exchange(PARKED, ASSIGNED, Ordering::AcqRel, Ordering::Acquire)
                            .is_ok()
                        {
                            // A worker publishes its thread before it first parks.
                            if let Some(t) = slot.thread.get() {
                                t.unpark();
                            }
                            break;
                        }
                    }
                    Err(NOT_STARTED) => {
                        // Start it (the spawn publishes the job to it).
                        st.store(ASSIGNED, Ordering::Release);
                        let team = Arc::clone(self);
                        pool.spawn(move || team.work(i));
                        break;
                    }
                    // Between states (polling -> parking): look again.
                    Err(_) => std::hint::spin_loop(),
                }
            }
        }
        // Worker 0's panics are caught inside (`worker` catches the ops' and the hook's); catch
        // anything else too, so this frame never unwinds while workers still use `job`.
        IN_TEAMS.with(|t| t.set(chain));
        let r = catch_unwind(AssertUnwindSafe(|| f(0)));
        IN_TEAMS.with(|t| t.set(outer));
        let mut spins = 0u32;
        while self.done.load(Ordering::Acquire) < nth - 1 {
            if spins < 20_000 {
                std::hint::spin_loop();
                spins += 1;
            } else {
                std::thread::yield_now();
            }
        }
        self.job.store(std::ptr::null_mut(), Ordering::Relaxed);
        self.serving.fetch_add(1, Ordering::Release);
        if let Err(p) = r {
            std::panic::resume_unwind(p);
        }
        Ok(())
    }

    /// A team worker's life in a pool thread: run the assigned job, poll for the next one for
    /// `poll_ns` (not at all while paused), then park until the caller unparks it.
    fn work(&self, i: usize) {
        let slot = &self.slots[i];
        let st = &slot.state;
        let _ = slot.thread.set(std::thread::current());
        if !self.affinity.is_empty() {
            // Best effort: a CPU the process may not use leaves the thread where it was.
            let _ = pin_current_thread(self.affinity[i % self.affinity.len()]);
        }
        loop {
            let p = self.job.load(Ordering::Acquire) as *const JobRef<'_>;
            // SAFETY: this slot was ASSIGNED after `job` was stored (release / acquire through
            // the slot's compare-exchange or the spawn), and the caller keeps the JobRef alive
            // until `done` counts this worker, which happens below after the last use.
            let (f, chain) = unsafe { ((*p).f, (*p).chain) };
            let outer = IN_TEAMS.with(|t| t.replace(chain));
            let _ = catch_unwind(AssertUnwindSafe(|| f(i)));
            IN_TEAMS.with(|t| t.set(outer));
            if st.compare_exchange(ASSIGNED, SPINNING, Ordering::AcqRel, Ordering::Acquire).is_err()
            {
                // EXIT cannot come while a compute holds the pool; leave if it did anyway.
                self.done.fetch_add(1, Ordering::AcqRel);
                return;
            }
            self.done.fetch_add(1, Ordering::AcqRel);
            if !self.wait_for_job(st) {
                return;
            }
        }
    }

    /// Polls, then parks, until this worker is ASSIGNED (true) or told to exit (false).
    fn wait_for_job(&self, st: &AtomicU8) -> bool {
        let start = Instant::now();
        let poll = Duration::from_nanos(self.poll_ns.load(Ordering::Relaxed));
        let mut spins = 0u32;
        loop {
            match st.load(Ordering::Acquire) {
                ASSIGNED => return true,
                EXIT => return false,
                _ => {}
            }
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256)
                && (self.paused.load(Ordering::Relaxed) || start.elapsed() >= poll)
            {
                break;
            }
        }
        match st.compare_exchange(SPINNING, PARKED, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {}
            Err(ASSIGNED) => return true,
            Err(_) => return false,
        }
        loop {
            std::thread::park();
            match st.load(Ordering::Acquire) {
                ASSIGNED => return true,
                EXIT => return false,
                _ => {} // spurious wake-up
            }
        }
    }
}

/// Pins the calling thread to CPU `cpu` (Linux: `sched_setaffinity`).
#[cfg(target_os = "linux")]
pub(crate) fn pin_current_thread(cpu: usize) -> Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(Error::arg(format!(
            "affinity: CPU {cpu} is past the {} a set can hold",
            libc::CPU_SETSIZE
        )));
    }
    // SAFETY: cpu_set_t is plain data for which all-zero bits are the empty set; CPU_SET gets an
    // index below CPU_SETSIZE (checked above); sched_setaffinity(0, ..) reads the set we own.
    let r = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if r != 0 {
        return Err(Error::arg(format!(
            "affinity: cannot pin a thread to CPU {cpu}: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// Pinning threads is implemented on Linux only.
#[cfg(not(target_os = "linux"))]
pub(crate) fn pin_current_thread(cpu: usize) -> Result<()> {
    Err(Error::arg(format!("affinity: pinning to CPU {cpu} is implemented on Linux only")))
}
