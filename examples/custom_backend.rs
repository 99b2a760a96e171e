//! Adding your own backend: a device with its own memory (here a `Vec` standing in for GPU
//! memory) that computes F32 `add` and `scale`, registered beside the CPU and given part of a
//! graph by the scheduler, which copies tensors across at the split points.
//!
//! ```sh
//! cargo run --example custom_backend
//! ```

use quantgraph::backend::register;
use quantgraph::sched::Scheduler;
use quantgraph::{
    AbortHook, Backend, BackendPlan, Buffer, BufferType, CpuBackend, DType, Device, DeviceCaps,
    DeviceMemory, DeviceType, Error, Graph, Op, Plan, Registry, Result, Storage, TensorId,
};
use std::sync::{Arc, Mutex};

/// The device's memory: the CPU reaches it only through `read` and `write`.
struct MyMemory(Mutex<Vec<u8>>);

impl DeviceMemory for MyMemory {
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
}

struct MyBufferType;

impl BufferType for MyBufferType {
    fn name(&self) -> &str {
        "MYDEV"
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
        Ok(Buffer::from_device(Arc::new(MyBufferType), MyMemory(Mutex::new(vec![0; size]))))
    }
}

/// F32 add of same-shape tensors and scale, on fresh results.
fn my_supports(g: &Graph, id: TensorId) -> bool {
    let f32s = std::iter::once(id)
        .chain(g.sources(id).unwrap_or_default())
        .all(|t| g.dtype(t).is_ok_and(|d| d == DType::F32));
    let same_shape =
        g.sources(id).unwrap_or_default().iter().all(|&s| g.shape(s).ok() == g.shape(id).ok());
    f32s && same_shape
        && matches!(g.storage(id), Ok(Storage::Node))
        && matches!(g.op(id), Ok(Op::Add | Op::Scale { .. }))
}

struct MyDevice;

impl Device for MyDevice {
    fn name(&self) -> &str {
        "MYDEV"
    }
    fn description(&self) -> &str {
        "an example device"
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
        my_supports(graph, node)
    }
    fn supports_buft(&self, buft: &dyn BufferType) -> bool {
        buft.is::<MyBufferType>() // by identity
    }
    fn default_buffer_type(&self) -> Arc<dyn BufferType> {
        Arc::new(MyBufferType)
    }
    fn extra_buffer_types(&self) -> Vec<Arc<dyn BufferType>> {
        Vec::new()
    }
    fn init_backend(&self) -> Result<Box<dyn Backend>> {
        Ok(Box::new(MyBackend))
    }
}

struct MyRegistry;

impl Registry for MyRegistry {
    fn name(&self) -> &str {
        "MYDEV"
    }
    fn devices(&self) -> Vec<Arc<dyn Device>> {
        vec![Arc::new(MyDevice)]
    }
}

struct MyBackend;

impl Backend for MyBackend {
    fn name(&self) -> &str {
        "MYDEV"
    }
    fn device(&self) -> Arc<dyn Device> {
        Arc::new(MyDevice)
    }
    fn set_abort_hook(&self, _hook: Option<AbortHook>) {}
    fn plan(&self, graph: &Graph) -> Result<Box<dyn BackendPlan>> {
        // Every input and node gets its own range of one device buffer.
        let mut at = vec![None; graph.len()];
        let mut top = 0;
        for id in graph.ids() {
            if matches!(graph.op(id)?, Op::None | Op::View) {
                if !matches!(graph.storage(id)?, Storage::Input) {
                    return Err(Error::InvalidArgument("MYDEV holds inputs only".into()));
                }
            } else if !my_supports(graph, id) {
                return Err(Error::InvalidArgument(format!(
                    "MYDEV cannot run {:?}",
                    graph.name(id)
                )));
            }
            at[id.index()] = Some(top);
            top += graph.shape(id)?.iter().product::<usize>() * 4;
        }
        let arena = MyBufferType.alloc(top)?;
        Ok(Box::new(MyPlan { graph: graph.clone(), arena, at }))
    }
}

struct MyPlan {
    graph: Graph,
    arena: Buffer,
    at: Vec<Option<usize>>,
}

impl MyPlan {
    fn offset(&self, id: TensorId) -> Result<usize> {
        self.at
            .get(id.index())
            .copied()
            .flatten()
            .ok_or_else(|| Error::InvalidArgument("id".into()))
    }
    fn load(&self, id: TensorId) -> Result<Vec<f32>> {
        let mut b = vec![0u8; self.graph.shape(id)?.iter().product::<usize>() * 4];
        self.arena.read(self.offset(id)?, &mut b)?;
        Ok(b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect())
    }
}

impl BackendPlan for MyPlan {
    fn graph(&self) -> &Graph {
        &self.graph
    }
    fn set_input_bytes(&mut self, id: TensorId, data: &[u8]) -> Result<()> {
        self.arena.write(self.offset(id)?, data)
    }
    fn compute(&mut self) -> Result<()> {
        let ids: Vec<TensorId> = self.graph.ids().collect();
        for id in ids {
            let src = self.graph.sources(id)?;
            let out: Vec<f32> = match *self.graph.op(id)? {
                Op::Add => {
                    let (a, b) = (self.load(src[0])?, self.load(src[1])?);
                    a.iter().zip(&b).map(|(x, y)| x + y).collect()
                }
                Op::Scale { scale, bias, .. } => {
                    self.load(src[0])?.iter().map(|x| x * scale + bias).collect()
                }
                _ => continue,
            };
            let bytes: Vec<u8> = out.iter().flat_map(|x| x.to_le_bytes()).collect();
            self.arena.write(self.offset(id)?, &bytes)?;
        }
        Ok(())
    }
    fn read_bytes(&self, id: TensorId, offset: usize, out: &mut [u8]) -> Result<()> {
        self.arena.read(self.offset(id)? + offset, out)
    }
}

/// y = silu(W x) * 2 + x: the matmul and silu on the CPU, scale and add on the device.
fn build() -> Result<(Graph, TensorId, TensorId, Buffer)> {
    let w: Vec<f32> = (0..64).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1).collect();
    let wbuf = Buffer::from_host(bytemuck::cast_slice::<f32, u8>(&w).to_vec());
    let mut g = Graph::new();
    let x = g.input(DType::F32, &[8, 2])?;
    let wt = g.weight(DType::F32, &[8, 8], &wbuf, 0)?;
    let h = g.mul_mat(wt, x)?;
    let h = g.silu(h)?;
    let h = g.scale(h, 2.0)?;
    let y = g.add(h, x)?;
    g.set_output(y)?;
    Ok((g, x, y, wbuf))
}

fn main() -> Result<()> {
    register(Arc::new(MyRegistry))?;
    let names: Vec<String> =
        quantgraph::backend::devices().iter().map(|d| d.name().into()).collect();
    println!("devices: {names:?}");

    let mine: Arc<dyn Backend> = quantgraph::backend::init_by_name("MYDEV")?.into();
    let cpu: Arc<dyn Backend> = Arc::new(CpuBackend::with_threads(2)?);
    let sched = Scheduler::new(vec![mine, cpu])?; // priority order: the device first
    let (g, x, y, _w) = build()?;
    let mut plan = sched.plan(g)?;
    let xs: Vec<f32> = (0..16).map(|i| i as f32 * 0.25 - 2.0).collect();
    plan.set_input(x, &xs)?;
    plan.compute()?;
    let got = plan.output::<f32>(y)?;
    for s in 0..plan.n_splits() {
        let be = sched.backends()[plan.split_backend(s).unwrap()].name();
        let ops: Vec<&str> =
            plan.split_nodes(s).iter().map(|&id| plan.graph().op(id).unwrap().name()).collect();
        println!("split {s}: {be:5} {ops:?}, {} copies in", plan.split_copies(s));
    }
    println!("copies per compute: {}", plan.n_copies());

    // The same graph on the CPU alone gives the same numbers.
    let (g, x, y, _w) = build()?;
    let mut alone = Plan::new(g, &CpuBackend::with_threads(2)?)?;
    alone.set_input(x, &xs)?;
    alone.compute()?;
    assert_eq!(alone.output::<f32>(y)?, got.as_slice());
    println!("output matches the CPU alone: {:?}", &got[..4]);
    Ok(())
}
