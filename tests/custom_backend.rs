//! A second backend implemented outside the crate, through the public traits only: a "device"
//! whose memory the CPU cannot address (a `Vec` behind [`DeviceMemory`]) and that computes F32
//! add, mul (with ggml's broadcast) and scale. A llama-style block runs through the scheduler on
//! it and the CPU, with the split points and copies the assignment rules give, and the outputs
//! equal the CPU's alone.

use quantgraph::backend::{device_by_name, register};
use quantgraph::sched::Scheduler;
use quantgraph::testdata::rand_f32;
use quantgraph::{
    AbortHook, Backend, BackendPlan, Buffer, BufferType, CpuBackend, DType, Device, DeviceCaps,
    DeviceMemory, DeviceType, Error, Graph, Op, Plan, Registry, Result, Storage, TensorId,
};
use std::any::Any;
use std::sync::{Arc, Mutex};

// ---------------------------------------------------------------------------------------------
// The device: memory, buffer type, device, registry, backend, plan.

/// Device memory: bytes the CPU only reaches through `read` and `write`.
struct ToyMemory(Mutex<Vec<u8>>);

impl DeviceMemory for ToyMemory {
    fn size(&self) -> usize {
        self.0.lock().unwrap().len()
    }
    fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.0.lock().unwrap()[offset..offset + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        out.copy_from_slice(&self.0.lock().unwrap()[offset..offset + out.len()]);
        Ok(())
    }
    fn copy_from(&self, dst: usize, src: &Buffer, src_off: usize, len: usize) -> Result<bool> {
        // Device to device without the host, when both are ours.
        let Some(m) = src.device_memory() else { return Ok(false) };
        let Some(m) = (m as &dyn Any).downcast_ref::<ToyMemory>() else { return Ok(false) };
        let bytes = m.0.lock().unwrap()[src_off..src_off + len].to_vec();
        self.write(dst, &bytes)?;
        Ok(true)
    }
}

struct ToyBufferType;

impl BufferType for ToyBufferType {
    fn name(&self) -> &str {
        "TOY"
    }
    fn alignment(&self) -> usize {
        16
    }
    fn max_size(&self) -> usize {
        1 << 30
    }
    fn is_host(&self) -> bool {
        false
    }
    fn alloc(&self, size: usize) -> Result<Buffer> {
        Ok(Buffer::from_device(Arc::new(ToyBufferType), ToyMemory(Mutex::new(vec![0; size]))))
    }
}

/// The ops the device computes: F32 add, mul and scale on contiguous tensors.
fn toy_supports(g: &Graph, id: TensorId) -> bool {
    let contiguous = |t: TensorId| {
        let (ne, nb) = (g.shape(t).unwrap(), g.strides(t).unwrap());
        let mut next = 4;
        (0..4).all(|d| {
            let ok = ne[d] == 1 || nb[d] == next;
            next *= ne[d];
            ok
        })
    };
    let srcs = g.sources(id).unwrap();
    let f32s = std::iter::once(id)
        .chain(srcs.iter().copied())
        .all(|t| g.dtype(t).unwrap() == DType::F32 && contiguous(t));
    let op = g.op(id).unwrap();
    f32s && matches!(op, Op::Add | Op::Mul | Op::Scale { .. })
        && matches!(g.storage(id).unwrap(), Storage::Node)
}

struct ToyDevice;

impl Device for ToyDevice {
    fn name(&self) -> &str {
        "TOY"
    }
    fn description(&self) -> &str {
        "an add/mul/scale device with its own memory"
    }
    fn memory(&self) -> (usize, usize) {
        (1 << 30, 1 << 30)
    }
    fn device_type(&self) -> DeviceType {
        DeviceType::Accel
    }
    fn caps(&self) -> DeviceCaps {
        DeviceCaps::default()
    }
    fn supports_op(&self, graph: &Graph, node: TensorId) -> bool {
        toy_supports(graph, node)
    }
    fn supports_buft(&self, buft: &dyn BufferType) -> bool {
        buft.is::<ToyBufferType>()
    }
    fn default_buffer_type(&self) -> Arc<dyn BufferType> {
        Arc::new(ToyBufferType)
    }
    fn extra_buffer_types(&self) -> Vec<Arc<dyn BufferType>> {
        Vec::new()
    }
    fn init_backend(&self) -> Result<Box<dyn Backend>> {
        Ok(Box::new(ToyBackend::default()))
    }
}

struct ToyRegistry;

impl Registry for ToyRegistry {
    fn name(&self) -> &str {
        "TOY"
    }
    fn devices(&self) -> Vec<Arc<dyn Device>> {
        vec![Arc::new(ToyDevice)]
    }
}

#[derive(Default)]
struct ToyBackend {
    abort: Mutex<Option<AbortHook>>,
}

impl Backend for ToyBackend {
    fn name(&self) -> &str {
        "TOY"
    }
    fn device(&self) -> Arc<dyn Device> {
        Arc::new(ToyDevice)
    }
    fn set_abort_hook(&self, hook: Option<AbortHook>) {
        *self.abort.lock().unwrap() = hook;
    }
    fn plan(&self, graph: &Graph) -> Result<Box<dyn BackendPlan>> {
        ToyPlan::new(graph, self.abort.lock().unwrap().clone()).map(|p| Box::new(p) as _)
    }
}

/// A graph on the device: every input and node gets its own range of one device buffer.
struct ToyPlan {
    graph: Graph,
    /// Per tensor: (buffer, byte offset) of its first element (inputs and nodes: one device
    /// buffer for the plan).
    at: Vec<Option<(Buffer, usize)>>,
    abort: Option<AbortHook>,
}

impl ToyPlan {
    fn new(graph: &Graph, abort: Option<AbortHook>) -> Result<ToyPlan> {
        let mut offsets = vec![None; graph.len()];
        let mut top = 0usize;
        for id in graph.ids() {
            match graph.storage(id)? {
                Storage::Input | Storage::Node => {
                    let n =
                        graph.shape(id)?.iter().product::<usize>() * graph.dtype(id)?.type_size();
                    offsets[id.index()] = Some(top);
                    top += n.next_multiple_of(16);
                }
                _ => {}
            }
            if !matches!(graph.op(id)?, Op::None | Op::View) && !toy_supports(graph, id) {
                return Err(Error::Unsupported {
                    op: graph.op(id)?.name(),
                    backend: "TOY".into(),
                    msg: format!("node {:?}", graph.name(id)),
                });
            }
        }
        let arena = ToyBufferType.alloc(top.max(16))?;
        let mut at = vec![None; graph.len()];
        for id in graph.ids() {
            at[id.index()] = match graph.storage(id)? {
                Storage::Input | Storage::Node => {
                    Some((arena.clone(), offsets[id.index()].unwrap()))
                }
                Storage::Weight { buffer, offset } | Storage::State { buffer, offset } => {
                    Some((buffer.clone(), offset))
                }
                Storage::View { root, offset } => {
                    let (b, o) = at[root.index()].clone().expect("root placed before its views");
                    Some((b, o + offset))
                }
                _ => None,
            };
        }
        Ok(ToyPlan { graph: graph.clone(), at, abort })
    }

    fn load(&self, id: TensorId) -> Result<Vec<f32>> {
        let n: usize = self.graph.shape(id)?.iter().product();
        let (b, o) = self.at[id.index()].clone().expect("placed");
        let mut bytes = vec![0u8; n * 4];
        b.read(o, &mut bytes)?;
        Ok(bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect())
    }
}

impl BackendPlan for ToyPlan {
    fn graph(&self) -> &Graph {
        &self.graph
    }
    fn set_input_bytes(&mut self, id: TensorId, data: &[u8]) -> Result<()> {
        let (b, o) =
            self.at[id.index()].clone().ok_or_else(|| Error::InvalidArgument("id".into()))?;
        b.write(o, data)
    }
    fn compute(&mut self) -> Result<()> {
        let ids: Vec<TensorId> = self.graph.ids().collect();
        for id in ids {
            let op = self.graph.op(id)?.clone();
            if matches!(op, Op::None | Op::View) {
                continue;
            }
            if self.abort.as_ref().is_some_and(|h| h()) {
                return Err(Error::Aborted);
            }
            let src = self.graph.sources(id)?;
            let a = self.load(src[0])?;
            let out: Vec<f32> = match op {
                Op::Scale { scale, bias, .. } => a.iter().map(|x| x * scale + bias).collect(),
                Op::Add | Op::Mul => {
                    // ggml's broadcast: b repeats over a in every dimension it divides.
                    let (na, nb) = (self.graph.shape(src[0])?, self.graph.shape(src[1])?);
                    let b = self.load(src[1])?;
                    let mut out = vec![0f32; a.len()];
                    for (i, o) in out.iter_mut().enumerate() {
                        let (mut r, mut j, mut stride) = (i, 0, 1);
                        for d in 0..4 {
                            j += (r % na[d]) % nb[d] * stride;
                            r /= na[d];
                            stride *= nb[d];
                        }
                        *o = if matches!(op, Op::Add) { a[i] + b[j] } else { a[i] * b[j] };
                    }
                    out
                }
                _ => unreachable!("refused at plan time"),
            };
            let bytes: Vec<u8> = out.iter().flat_map(|x| x.to_le_bytes()).collect();
            self.set_input_bytes(id, &bytes)?;
        }
        Ok(())
    }
    fn read_bytes(&self, id: TensorId, offset: usize, out: &mut [u8]) -> Result<()> {
        let (b, o) =
            self.at[id.index()].clone().ok_or_else(|| Error::InvalidArgument("id".into()))?;
        b.read(o + offset, out)
    }
}

// ---------------------------------------------------------------------------------------------
// A llama-style block.

const D: usize = 64;
const FF: usize = 96;
const T: usize = 6;

struct Weights {
    /// The two norm weights, in `norm_buf` (device or host memory).
    norm_buf: Buffer,
    mats: Vec<(Buffer, [usize; 2])>,
}

fn weights(norm_buft: &dyn BufferType) -> Weights {
    let norm_buf = norm_buft.alloc(2 * D * 4).unwrap();
    let norms: Vec<f32> = rand_f32(2 * D, 7).iter().map(|x| 1.0 + 0.2 * x).collect();
    norm_buf.write_f32(0, &norms).unwrap();
    let shapes = [[D, D], [D, D], [D, D], [D, D], [D, FF], [D, FF], [FF, D]];
    let mats = shapes
        .iter()
        .enumerate()
        .map(|(i, &ne)| {
            let v: Vec<f32> =
                rand_f32(ne[0] * ne[1], 20 + i as u64).iter().map(|x| x * 0.2).collect();
            (Buffer::from_host(bytemuck::cast_slice::<f32, u8>(&v).to_vec()), ne)
        })
        .collect();
    Weights { norm_buf, mats }
}

/// x -> norm -> attention (q k v, scaled softmax) -> residual -> norm -> SwiGLU -> residual.
fn block(w: &Weights) -> (Graph, TensorId, TensorId) {
    let mut g = Graph::new();
    let name = |g: &mut Graph, id: TensorId, n: &str| g.set_name(id, n).unwrap();
    let x = g.input(DType::F32, &[D, T]).unwrap();
    let mat = |g: &mut Graph, k: usize| {
        let (b, ne) = &w.mats[k];
        g.weight(DType::F32, ne, b, 0).unwrap()
    };
    let attn_norm = g.weight(DType::F32, &[D], &w.norm_buf, 0).unwrap();
    let ffn_norm = g.weight(DType::F32, &[D], &w.norm_buf, D * 4).unwrap();
    let h = g.rms_norm(x, 1e-5).unwrap();
    name(&mut g, h, "norm");
    let h = g.mul(h, attn_norm).unwrap();
    name(&mut g, h, "attn_norm");
    let (wq, wk, wv, wo) = (mat(&mut g, 0), mat(&mut g, 1), mat(&mut g, 2), mat(&mut g, 3));
    let q = g.mul_mat(wq, h).unwrap();
    name(&mut g, q, "q");
    let k = g.mul_mat(wk, h).unwrap();
    name(&mut g, k, "k");
    let v = g.mul_mat(wv, h).unwrap();
    name(&mut g, v, "v");
    let kq = g.mul_mat(k, q).unwrap();
    name(&mut g, kq, "kq");
    let kq = g.scale(kq, 1.0 / (D as f32).sqrt()).unwrap();
    name(&mut g, kq, "kq_scaled");
    let kq = g.soft_max(kq).unwrap();
    name(&mut g, kq, "kq_soft_max");
    let vt = g.transpose(v).unwrap();
    let vt = g.cont(vt).unwrap();
    name(&mut g, vt, "vt");
    let att = g.mul_mat(vt, kq).unwrap();
    name(&mut g, att, "att");
    let o = g.mul_mat(wo, att).unwrap();
    name(&mut g, o, "attn_out");
    let x1 = g.add(o, x).unwrap();
    name(&mut g, x1, "attn_residual");
    let h2 = g.rms_norm(x1, 1e-5).unwrap();
    name(&mut g, h2, "norm2");
    let h2 = g.mul(h2, ffn_norm).unwrap();
    name(&mut g, h2, "ffn_norm");
    let (wg, wu, wd) = (mat(&mut g, 4), mat(&mut g, 5), mat(&mut g, 6));
    let gate = g.mul_mat(wg, h2).unwrap();
    name(&mut g, gate, "gate");
    let up = g.mul_mat(wu, h2).unwrap();
    name(&mut g, up, "up");
    let act = g.silu(gate).unwrap();
    name(&mut g, act, "silu");
    let ff = g.mul(act, up).unwrap();
    name(&mut g, ff, "ffn_mul");
    let dn = g.mul_mat(wd, ff).unwrap();
    name(&mut g, dn, "down");
    let out = g.add(dn, x1).unwrap();
    name(&mut g, out, "out");
    g.set_output(out).unwrap();
    (g, x, out)
}

fn cpu_alone(x_data: &[f32]) -> Vec<f32> {
    let w = weights(&quantgraph::CpuBufferType);
    let (g, x, out) = block(&w);
    let mut p = Plan::new(g, &CpuBackend::with_threads(2).unwrap()).unwrap();
    p.set_input(x, x_data).unwrap();
    p.compute().unwrap();
    p.output::<f32>(out).unwrap().to_vec()
}

#[test]
fn a_device_backend_and_the_cpu_split_a_block_and_match_the_cpu_alone() {
    let x_data = rand_f32(D * T, 3);
    let want = cpu_alone(&x_data);

    let toy: Arc<dyn Backend> = Arc::new(ToyBackend::default());
    let cpu: Arc<dyn Backend> = Arc::new(CpuBackend::with_threads(2).unwrap());
    let sched = Scheduler::new(vec![toy.clone(), cpu]).unwrap();
    let w = weights(&*toy.default_buffer_type());
    assert!(w.norm_buf.is_device() && w.norm_buf.buffer_type().is::<ToyBufferType>());
    let (g, x, out) = block(&w);
    let mut plan = sched.plan(g).unwrap();

    // Add, mul and scale run on the device (its buffer holds the norm weights); everything else
    // on the CPU. Each change of backend is a split point.
    let expected: &[(&str, &[&str])] = &[
        ("CPU", &["norm"]),
        ("TOY", &["attn_norm"]),
        ("CPU", &["q", "k", "v", "kq"]),
        ("TOY", &["kq_scaled"]),
        ("CPU", &["kq_soft_max", "vt", "att", "attn_out"]),
        ("TOY", &["attn_residual"]),
        ("CPU", &["norm2"]),
        ("TOY", &["ffn_norm"]),
        ("CPU", &["gate", "up", "silu"]),
        ("TOY", &["ffn_mul"]),
        ("CPU", &["down"]),
        ("TOY", &["out"]),
    ];
    let names = ["TOY", "CPU"];
    let got: Vec<(&str, Vec<&str>)> = (0..plan.n_splits())
        .map(|s| {
            let nodes = plan.split_nodes(s).iter().map(|&id| plan.graph().name(id).unwrap());
            (names[plan.split_backend(s).unwrap()], nodes.collect())
        })
        .collect();
    let want_splits: Vec<(&str, Vec<&str>)> =
        expected.iter().map(|(b, n)| (*b, n.to_vec())).collect();
    assert_eq!(got, want_splits);
    // One copy per tensor a split reads from another: the norm's result into the device, the
    // device's result back, ...; two where a split reads two foreign tensors (x and attn_out into
    // the residual add, silu and up into the ffn mul, down and the first residual into out).
    let copies: Vec<usize> = (0..plan.n_splits()).map(|s| plan.split_copies(s)).collect();
    assert_eq!(copies, [0, 1, 1, 1, 2, 2, 1, 1, 1, 2, 1, 2]);
    assert_eq!(plan.n_copies(), 15);
    assert_eq!(plan.backend_name_of(out), Some("TOY"));
    assert_eq!(plan.backend_of(x), None, "inputs are not computed");

    for _ in 0..2 {
        plan.set_input(x, &x_data).unwrap();
        plan.compute().unwrap();
        assert_eq!(plan.output::<f32>(out).unwrap(), want);
    }
}

#[test]
fn weights_in_device_memory_are_copied_for_ops_the_device_cannot_run() {
    // A matrix in device memory feeding mul_mat (which the device lacks): the CPU runs it and
    // reads a copy of the weight, taken each compute.
    let toy: Arc<dyn Backend> = Arc::new(ToyBackend::default());
    let cpu: Arc<dyn Backend> = Arc::new(CpuBackend::with_threads(1).unwrap());
    let wdata = rand_f32(D * 8, 5);
    let wbuf = toy.default_buffer_type().alloc(D * 8 * 4).unwrap();
    wbuf.write_f32(0, &wdata).unwrap();
    let mut g = Graph::new();
    let w = g.weight(DType::F32, &[D, 8], &wbuf, 0).unwrap();
    let x = g.input(DType::F32, &[D, 2]).unwrap();
    let y = g.mul_mat(w, x).unwrap();
    let y = g.scale(y, 0.5).unwrap();
    g.set_output(y).unwrap();

    // The CPU alone cannot read device memory: a clear error naming the buffer.
    let e = Plan::new(g.clone(), &CpuBackend::with_threads(1).unwrap()).err().unwrap();
    assert!(e.to_string().contains("'TOY'") && e.to_string().contains("not host memory"), "{e}");

    let mut plan = Scheduler::new(vec![toy, cpu]).unwrap().plan(g.clone()).unwrap();
    assert_eq!(plan.n_splits(), 2);
    assert_eq!((plan.split_copies(0), plan.split_copies(1)), (1, 1));
    let xd = rand_f32(D * 2, 6);
    plan.set_input(x, &xd).unwrap();
    plan.compute().unwrap();
    let got = plan.output::<f32>(y).unwrap();
    let mut want = vec![0f32; 16];
    for (c, o) in want.chunks_mut(8).enumerate() {
        for (r, v) in o.iter_mut().enumerate() {
            let dot: f64 =
                (0..D).map(|k| wdata[r * D + k] as f64 * xd[c * D + k] as f64).sum::<f64>();
            *v = (dot * 0.5) as f32;
        }
    }
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() < 1e-4, "{a} vs {b}");
    }
}

#[test]
fn buffers_copy_between_device_and_host_memory() {
    let toy = ToyBufferType.alloc(32).unwrap();
    let toy2 = ToyBufferType.alloc(32).unwrap();
    let host = Buffer::alloc(32).unwrap();
    let data: Vec<u8> = (0..32).collect();
    host.write(0, &data).unwrap();
    host.copy_to(4, &toy, 0, 16).unwrap(); // host -> device
    toy.copy_to(0, &toy2, 8, 16).unwrap(); // device -> device (the device's own path)
    let back = Buffer::alloc(32).unwrap();
    toy2.copy_to(8, &back, 0, 16).unwrap(); // device -> host
    let mut out = [0u8; 16];
    back.read(0, &mut out).unwrap();
    assert_eq!(out.as_slice(), &data[4..20]);
    assert!(toy.with_bytes(|_| ()).is_err(), "device memory has no host slice");
    assert!(toy.copy_to(30, &host, 0, 4).is_err(), "range checked");
    // Identity, not name: a host buffer type named "TOY" is still not the device's.
    struct Impostor;
    impl BufferType for Impostor {
        fn name(&self) -> &str {
            "TOY"
        }
        fn alignment(&self) -> usize {
            16
        }
        fn max_size(&self) -> usize {
            64
        }
        fn is_host(&self) -> bool {
            false
        }
        fn alloc(&self, size: usize) -> Result<Buffer> {
            Buffer::alloc(size)
        }
    }
    assert!(!ToyDevice.supports_buft(&Impostor));
    assert!(ToyDevice.supports_buft(&ToyBufferType));
    assert!(!CpuBackend::new().unwrap().supports_buft(&ToyBufferType));
}

#[test]
fn a_registered_device_is_found_and_started_by_name() {
    register(Arc::new(ToyRegistry)).unwrap();
    assert!(register(Arc::new(ToyRegistry)).is_err(), "registered once");
    let names: Vec<String> =
        quantgraph::backend::devices().iter().map(|d| d.name().into()).collect();
    assert_eq!(names[0], "CPU");
    assert!(names.contains(&"TOY".to_string()));
    let be: Arc<dyn Backend> = device_by_name("TOY").unwrap().init_backend().unwrap().into();
    assert_eq!(be.name(), "TOY");
    let cpu: Arc<dyn Backend> = quantgraph::backend::init_by_name("CPU").unwrap().into();
    let mut g = Graph::new();
    let x = g.input(DType::F32, &[5]).unwrap();
    let y = g.scale(x, 3.0).unwrap();
    let z = g.sqr(y).unwrap();
    g.set_output(z).unwrap();
    let mut p = Scheduler::new(vec![be, cpu]).unwrap().plan(g).unwrap();
    assert_eq!((p.n_splits(), p.n_copies()), (2, 1));
    p.set_input(x, &[1.0f32, 2.0, 3.0, 4.0, 5.0]).unwrap();
    p.compute().unwrap();
    assert_eq!(p.output::<f32>(z).unwrap(), [9.0, 36.0, 81.0, 144.0, 225.0]);
}
