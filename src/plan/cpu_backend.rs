//! The CPU backend as a [`Backend`]: its plans are [`Plan`]s. The `CpuBackend` type and its
//! threads live in the `backend` layer; the trait implementation lives here, beside the plan it
//! returns.

use super::Plan;
use crate::backend::{
    AbortHook, Backend, BackendPlan, BufferType, CpuBackend, CpuDevice, Device, EvalCallback,
};
use crate::error::{Error, Result};
use crate::graph::{Graph, TensorId};
use crate::kernels::CpuFeatures;
use std::sync::Arc;
use std::sync::atomic::Ordering;

impl Backend for CpuBackend {
    fn name(&self) -> &str {
        "CPU"
    }
    fn device(&self) -> Arc<dyn Device> {
        Arc::new(CpuDevice::new())
    }
    fn features(&self) -> Vec<(&'static str, String)> {
        let mut f = CpuFeatures::detect().list();
        f.push(("ISA", self.isa().name().to_string()));
        f
    }
    fn n_threads(&self) -> usize {
        self.shared.n_threads.load(Ordering::Relaxed)
    }
    fn set_n_threads(&self, n: usize) -> Result<()> {
        self.set_threads(n)
    }
    fn set_abort_hook(&self, hook: Option<AbortHook>) {
        self.set_abort(hook)
    }
    fn supports_op(&self, graph: &Graph, node: TensorId) -> bool {
        // This backend's own tier decides, as its plans do.
        crate::ops::supports(graph, node, self.kernel_table()).is_ok()
    }
    fn supports_buft(&self, buft: &dyn BufferType) -> bool {
        CpuDevice::new().supports_buft(buft)
    }
    fn default_buffer_type(&self) -> Arc<dyn BufferType> {
        Arc::new(crate::backend::CpuBufferType)
    }
    fn plan(&self, graph: &Graph) -> Result<Box<dyn BackendPlan>> {
        Ok(Box::new(Plan::new(graph.clone(), self)?))
    }
}

impl BackendPlan for Plan {
    fn graph(&self) -> &Graph {
        Plan::graph(self)
    }
    fn set_input_bytes(&mut self, id: TensorId, data: &[u8]) -> Result<()> {
        Plan::set_input_bytes(self, id, data)
    }
    fn compute(&mut self) -> Result<()> {
        Plan::compute(self)
    }
    fn read_bytes(&self, id: TensorId, offset: usize, out: &mut [u8]) -> Result<()> {
        let bytes = self.output_bytes(id)?;
        let src = offset.checked_add(out.len()).and_then(|end| bytes.get(offset..end));
        let src = src.ok_or_else(|| {
            Error::arg(format!(
                "read_bytes: bytes {offset}..{} are outside {} ({} bytes)",
                offset.saturating_add(out.len()),
                self.graph().describe(id),
                bytes.len()
            ))
        })?;
        out.copy_from_slice(src);
        Ok(())
    }
    fn host_bytes(&self, id: TensorId) -> Option<&[u8]> {
        self.output_bytes(id).ok()
    }
    fn set_eval_callback(&mut self, cb: Option<EvalCallback>) -> Result<()> {
        Plan::set_eval_callback(self, cb);
        Ok(())
    }
}
