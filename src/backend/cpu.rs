//! The CPU registry, device, buffer type and backend. The backend owns a dedicated rayon thread
//! pool; a [`crate::Plan`] built on it runs its nodes there.

use super::{
    AbortHook, Backend, BufferType, CpuBufferType, CpuRepackBufferType, Device, DeviceCaps,
    DeviceType, Registry,
};
use crate::error::{Error, Result};
use crate::graph::{Graph, TensorId};
use crate::kernels::{CpuFeatures, Isa, KernelTable};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

/// The CPU registry: one device.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuRegistry;

impl Registry for CpuRegistry {
    fn name(&self) -> &str {
        "CPU"
    }
    fn devices(&self) -> Vec<Arc<dyn Device>> {
        vec![Arc::new(CpuDevice::new())]
    }
}

/// The host CPU as a device.
#[derive(Clone, Debug)]
pub struct CpuDevice {
    description: String,
}

impl Default for CpuDevice {
    fn default() -> Self {
        CpuDevice::new()
    }
}

impl CpuDevice {
    /// The CPU device (description = the CPU brand string).
    pub fn new() -> CpuDevice {
        CpuDevice { description: CpuFeatures::detect().brand.clone() }
    }
}

fn meminfo() -> (usize, usize) {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |key: &str| {
        text.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<usize>().ok())
            .map(|kb| kb * 1024)
    };
    let total = field("MemTotal:").unwrap_or(0);
    let free = field("MemAvailable:").unwrap_or(total);
    (free, total)
}

impl Device for CpuDevice {
    fn name(&self) -> &str {
        "CPU"
    }
    fn description(&self) -> &str {
        &self.description
    }
    fn memory(&self) -> (usize, usize) {
        meminfo()
    }
    fn device_type(&self) -> DeviceType {
        DeviceType::Cpu
    }
    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            async_compute: false,
            host_buffer: false,
            buffer_from_host_ptr: true,
            events: false,
        }
    }
    fn supports_op(&self, graph: &Graph, node: TensorId) -> bool {
        // The device has no tier of its own: it answers for the default one (every tier has
        // kernels for the same types).
        crate::ops::supports(graph, node, crate::kernels::table()).is_ok()
    }
    fn supports_buft(&self, buft: &dyn BufferType) -> bool {
        buft.is_host() || buft.is::<CpuRepackBufferType>()
    }
    fn default_buffer_type(&self) -> Arc<dyn BufferType> {
        Arc::new(CpuBufferType)
    }
    fn extra_buffer_types(&self) -> Vec<Arc<dyn BufferType>> {
        vec![Arc::new(CpuRepackBufferType)]
    }
    fn init_backend(&self) -> Result<Box<dyn Backend>> {
        Ok(Box::new(CpuBackend::new()?))
    }
}

/// State shared by a backend and the plans built on it.
pub(crate) struct CpuShared {
    pub pool: RwLock<Arc<crate::backend::pool::Workers>>,
    pub n_threads: AtomicUsize,
    pub abort: Mutex<Option<AbortHook>>,
    /// The tier chosen with [`CpuBackend::with_isa`]; `None` follows the process-wide default.
    pub isa: Option<Isa>,
}

impl CpuShared {
    pub(crate) fn pool(&self) -> Arc<crate::backend::pool::Workers> {
        match self.pool.read() {
            Ok(p) => p.clone(),
            Err(e) => e.into_inner().clone(),
        }
    }
    pub(crate) fn abort_hook(&self) -> Option<AbortHook> {
        match self.abort.lock() {
            Ok(h) => h.clone(),
            Err(e) => e.into_inner().clone(),
        }
    }
}

/// Most worker threads a CPU backend runs (ggml's `GGML_MAX_N_THREADS`). Work buffers and the
/// per-node barrier scale with the thread count, so more is refused up front instead of spending
/// seconds creating threads that then fail or make planning crawl.
pub const MAX_THREADS: usize = 512;

fn check_thread_count(op: &str, n: usize) -> Result<()> {
    if n == 0 {
        return Err(Error::arg(format!("{op}: thread count must be at least 1")));
    }
    if n > MAX_THREADS {
        return Err(Error::arg(format!(
            "{op}: thread count {n} is above the maximum of {MAX_THREADS}"
        )));
    }
    Ok(())
}

fn build_pool(n: usize) -> Result<crate::backend::pool::Workers> {
    build_pool_with(&ThreadpoolParams::new(n))
}

fn build_pool_with(p: &ThreadpoolParams) -> Result<crate::backend::pool::Workers> {
    let n = p.n_threads;
    check_thread_count("Threadpool", n)?;
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(|i| format!("quantgraph-{i}"))
        .build()
        .map(|pool| crate::backend::pool::Workers::new(pool, p.poll, p.affinity.clone()))
        .map_err(|e| Error::arg(format!("cannot start {n} worker threads: {e}")))
}

/// Parameters of a CPU thread pool (ggml's `ggml_threadpool_params`).
///
/// ```
/// use quantgraph::backend::{Threadpool, ThreadpoolParams};
/// use std::time::Duration;
/// let params = ThreadpoolParams::new(2).poll(Duration::from_micros(50));
/// let pool = Threadpool::new(&params)?;
/// assert_eq!(pool.n_threads(), 2);
/// # Ok::<(), quantgraph::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ThreadpoolParams {
    /// Worker threads, 1 to [`MAX_THREADS`] (the thread calling `compute` is worker 0).
    pub n_threads: usize,
    /// How long an idle worker keeps polling for the next compute before it sleeps (ggml's
    /// `poll` level). Polling makes back-to-back computes (a decode loop) start without a
    /// wake-up; zero sleeps at once. Default 300 µs.
    pub poll: Duration,
    /// CPUs to pin the pool's threads to: worker i runs on `affinity[i % len]` (ggml's
    /// `cpumask`); the calling thread, which runs worker 0, is left alone. Empty (the default)
    /// pins nothing. Linux only; a CPU the process may not use leaves that thread unpinned.
    pub affinity: Vec<usize>,
}

impl ThreadpoolParams {
    /// `n` threads, the default poll time, no pinning.
    pub fn new(n: usize) -> ThreadpoolParams {
        ThreadpoolParams {
            n_threads: n,
            poll: crate::backend::pool::DEFAULT_POLL,
            affinity: Vec::new(),
        }
    }

    /// Sets how long idle workers poll before sleeping.
    pub fn poll(mut self, poll: Duration) -> ThreadpoolParams {
        self.poll = poll;
        self
    }

    /// Sets the CPUs to pin the pool's threads to.
    pub fn affinity(mut self, cpus: Vec<usize>) -> ThreadpoolParams {
        self.affinity = cpus;
        self
    }
}

/// A CPU thread pool (ggml's `ggml_threadpool`): threads, poll time, pause and resume. Cloning
/// shares it; give one to several backends with [`CpuBackend::with_threadpool`] and their
/// computes take its threads in turn.
///
/// ```
/// use quantgraph::backend::{Threadpool, ThreadpoolParams};
/// use quantgraph::{Backend, CpuBackend};
/// let pool = Threadpool::new(&ThreadpoolParams::new(2))?;
/// let a = CpuBackend::with_threadpool(&pool)?;
/// let b = CpuBackend::with_threadpool(&pool)?;
/// assert_eq!((a.n_threads(), b.n_threads()), (2, 2));
/// pool.pause(); // idle workers sleep at once; computes still run
/// assert!(pool.is_paused());
/// pool.resume();
/// # Ok::<(), quantgraph::Error>(())
/// ```
#[derive(Clone)]
pub struct Threadpool {
    workers: Arc<crate::backend::pool::Workers>,
}

impl std::fmt::Debug for Threadpool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Threadpool")
            .field("n_threads", &self.n_threads())
            .field("poll", &self.workers.poll())
            .field("paused", &self.is_paused())
            .field("affinity", &self.workers.affinity())
            .finish()
    }
}

impl Threadpool {
    /// Starts a pool (its threads start on the first compute that uses them).
    pub fn new(params: &ThreadpoolParams) -> Result<Threadpool> {
        Ok(Threadpool { workers: Arc::new(build_pool_with(params)?) })
    }

    /// Number of threads.
    pub fn n_threads(&self) -> usize {
        self.workers.n_threads()
    }

    /// Idle workers stop polling and sleep (ggml's `ggml_threadpool_pause`). A compute still
    /// runs on a paused pool, waking the workers it needs; they sleep again right after.
    pub fn pause(&self) {
        self.workers.set_paused(true);
    }

    /// Idle workers poll again after the next compute (ggml's `ggml_threadpool_resume`).
    pub fn resume(&self) {
        self.workers.set_paused(false);
    }

    /// True between [`Threadpool::pause`] and [`Threadpool::resume`].
    pub fn is_paused(&self) -> bool {
        self.workers.is_paused()
    }

    /// Changes how long idle workers poll before sleeping.
    pub fn set_poll(&self, poll: Duration) {
        self.workers.set_poll(poll);
    }

    /// Workers asleep right now (they sleep after polling for the poll time with no work).
    pub fn n_sleeping(&self) -> usize {
        self.workers.n_sleeping()
    }
}

/// The CPU backend: a dedicated thread pool, a thread count and an abort hook.
///
/// ```
/// use quantgraph::{Backend, CpuBackend};
/// let be = CpuBackend::with_threads(2)?;
/// assert_eq!(be.n_threads(), 2);
/// # Ok::<(), quantgraph::Error>(())
/// ```
#[derive(Clone)]
pub struct CpuBackend {
    pub(crate) shared: Arc<CpuShared>,
}

impl CpuBackend {
    /// A backend with one worker per physical core (at most [`MAX_THREADS`]).
    pub fn new() -> Result<CpuBackend> {
        CpuBackend::with_threads(num_cpus::get_physical().clamp(1, MAX_THREADS))
    }

    /// A backend with `n` worker threads, 1 to [`MAX_THREADS`], running the default SIMD tier
    /// (the best this CPU has, unless lowered by `QUANTGRAPH_ISA` or [`crate::kernels::set_isa`]).
    pub fn with_threads(n: usize) -> Result<CpuBackend> {
        CpuBackend::build(n, None)
    }

    /// A backend with `n` worker threads whose plans run the kernels of tier `isa`, whatever the
    /// process-wide default is. Backends with different tiers can live side by side, so one
    /// process can compare tiers. Fails when this CPU cannot run `isa`.
    ///
    /// ```
    /// use quantgraph::{CpuBackend, kernels::Isa};
    /// let be = CpuBackend::with_isa(2, Isa::Scalar)?;
    /// assert_eq!(be.isa(), Isa::Scalar);
    /// # Ok::<(), quantgraph::Error>(())
    /// ```
    pub fn with_isa(n: usize, isa: Isa) -> Result<CpuBackend> {
        if !isa.is_supported() {
            return Err(Error::arg(format!(
                "CpuBackend: this CPU cannot run the {} tier",
                isa.name()
            )));
        }
        CpuBackend::build(n, Some(isa))
    }

    fn build(n: usize, isa: Option<Isa>) -> Result<CpuBackend> {
        check_thread_count("CpuBackend", n)?;
        let pool = build_pool(n)?;
        Ok(CpuBackend::on(Arc::new(pool), isa))
    }

    fn on(pool: Arc<crate::backend::pool::Workers>, isa: Option<Isa>) -> CpuBackend {
        CpuBackend {
            shared: Arc::new(CpuShared {
                n_threads: AtomicUsize::new(pool.n_threads()),
                pool: RwLock::new(pool),
                abort: Mutex::new(None),
                isa,
            }),
        }
    }

    /// A backend with its own pool made from `params` (thread count, poll time, affinity).
    pub fn with_params(params: &ThreadpoolParams) -> Result<CpuBackend> {
        Ok(CpuBackend::on(Arc::new(build_pool_with(params)?), None))
    }

    /// A backend computing on `pool`, shared with whoever else holds it (other backends
    /// included): their computes take the pool's threads in turn. `set_n_threads` later gives
    /// this backend a pool of its own.
    pub fn with_threadpool(pool: &Threadpool) -> Result<CpuBackend> {
        Ok(CpuBackend::on(pool.workers.clone(), None))
    }

    /// The pool this backend computes on (pause, resume, poll time).
    pub fn threadpool(&self) -> Threadpool {
        Threadpool { workers: self.shared.pool() }
    }

    /// The SIMD tier the next plan built on this backend runs: the one chosen with
    /// [`CpuBackend::with_isa`], else the process-wide default ([`crate::kernels::selected_isa`]).
    pub fn isa(&self) -> Isa {
        self.shared.isa.unwrap_or_else(crate::kernels::selected_isa)
    }

    /// Sets the number of worker threads (the [`Backend::set_n_threads`] of this backend).
    pub(crate) fn set_threads(&self, n: usize) -> Result<()> {
        check_thread_count("set_n_threads", n)?;
        if n == self.shared.n_threads.load(Ordering::Relaxed) {
            return Ok(());
        }
        // The new pool keeps the old one's poll time and pinning.
        let cur = self.shared.pool();
        let params = ThreadpoolParams::new(n).poll(cur.poll()).affinity(cur.affinity().to_vec());
        let pool = Arc::new(build_pool_with(&params)?);
        match self.shared.pool.write() {
            Ok(mut p) => *p = pool,
            Err(e) => *e.into_inner() = pool,
        }
        self.shared.n_threads.store(n, Ordering::Relaxed);
        Ok(())
    }

    /// Installs (or removes) the backend-wide abort hook.
    pub(crate) fn set_abort(&self, hook: Option<AbortHook>) {
        match self.shared.abort.lock() {
            Ok(mut h) => *h = hook,
            Err(e) => *e.into_inner() = hook,
        }
    }

    /// The kernel table a plan built now on this backend uses.
    pub(crate) fn kernel_table(&self) -> &'static KernelTable {
        match self.shared.isa {
            // `with_isa` checked that the CPU supports the tier, so the table exists.
            Some(isa) => crate::kernels::table_for(isa).unwrap_or_else(crate::kernels::table),
            None => crate::kernels::table(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::kernels::table_for;
    use crate::plan::Plan;

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// SiLU of `x` through a plan on `be`.
    fn silu_on(be: &CpuBackend, x: &[f32]) -> Vec<f32> {
        let mut g = Graph::new();
        let xi = g.input(DType::F32, &[x.len()]).unwrap();
        let y = g.silu(xi).unwrap();
        g.set_output(y).unwrap();
        let mut p = Plan::new(g, be).unwrap();
        p.set_input(xi, x).unwrap();
        p.compute().unwrap();
        p.output::<f32>(y).unwrap().to_vec()
    }

    /// A plan on a backend made with `with_isa` runs that tier's kernels (here SiLU, whose bits
    /// differ between the portable and the vector exp), and the process-wide default stays.
    #[test]
    fn with_isa_plans_run_that_tiers_kernels() {
        let x: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.37).sin() * 12.0).collect();
        let default = crate::kernels::selected_isa();
        let mut per_tier = Vec::new();
        for isa in Isa::ALL {
            if !isa.is_supported() {
                let e = CpuBackend::with_isa(2, isa).err().expect("unsupported tier refused");
                assert!(e.to_string().contains(isa.name()), "{e}");
                continue;
            }
            let be = CpuBackend::with_isa(2, isa).unwrap();
            assert_eq!(be.isa(), isa);
            assert!(be.features().contains(&("ISA", isa.name().to_string())));
            let mut want = vec![0f32; x.len()];
            // SAFETY: `want` and `x` hold x.len() f32; the table is of a tier this CPU runs.
            unsafe { (table_for(isa).unwrap().silu_f32)(x.len(), want.as_mut_ptr(), x.as_ptr()) };
            let got = silu_on(&be, &x);
            assert_eq!(bits(&got), bits(&want), "{isa:?}");
            per_tier.push(bits(&got));
        }
        assert_eq!(crate::kernels::selected_isa(), default, "with_isa changed the default tier");
        // The check above tells tiers apart: the portable and the AVX2 SiLU differ in some bits.
        if Isa::Avx2.is_supported() {
            assert_ne!(per_tier[0], per_tier[1], "scalar and AVX2 SiLU give the same bits");
        }
    }
}
