//! The process-wide list of device registries (ggml's `ggml_backend_register` and the
//! `ggml_backend_dev_*` lookups). The CPU registers itself; users add their own at run time.

use super::{Backend, CpuRegistry, Device, Registry};
use crate::error::{Error, Result};
use std::sync::{Arc, RwLock};

static REGISTRIES: RwLock<Vec<Arc<dyn Registry>>> = RwLock::new(Vec::new());

fn with_list<R>(f: impl FnOnce(&mut Vec<Arc<dyn Registry>>) -> R) -> R {
    let mut list = match REGISTRIES.write() {
        Ok(l) => l,
        Err(e) => e.into_inner(),
    };
    if list.is_empty() {
        list.push(Arc::new(CpuRegistry));
    }
    f(&mut list)
}

/// Adds a registry to the process-wide list, after those already there. `Err` when one of the
/// same name is registered.
///
/// ```
/// use quantgraph::backend::{registries, register};
/// assert_eq!(registries()[0].name(), "CPU");
/// assert!(register(std::sync::Arc::new(quantgraph::CpuRegistry)).is_err()); // already there
/// ```
pub fn register(reg: Arc<dyn Registry>) -> Result<()> {
    with_list(|list| {
        if list.iter().any(|r| r.name() == reg.name()) {
            return Err(Error::arg(format!("register: a registry named '{}' exists", reg.name())));
        }
        list.push(reg);
        Ok(())
    })
}

/// The registries, in the order they were registered (the CPU's first).
pub fn registries() -> Vec<Arc<dyn Registry>> {
    with_list(|list| list.clone())
}

/// Every device of every registry, in registry order.
pub fn devices() -> Vec<Arc<dyn Device>> {
    registries().iter().flat_map(|r| r.devices()).collect()
}

/// The first device named `name` ("CPU").
pub fn device_by_name(name: &str) -> Option<Arc<dyn Device>> {
    devices().into_iter().find(|d| d.name() == name)
}

/// Starts a backend on the first device named `name`.
pub fn init_by_name(name: &str) -> Result<Box<dyn Backend>> {
    device_by_name(name)
        .ok_or_else(|| Error::arg(format!("init_by_name: no device named '{name}'")))?
        .init_backend()
}
