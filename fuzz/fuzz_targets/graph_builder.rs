//! Fuzzes graph building, planning and computing: the input bytes are read as a sequence of
//! `Graph` builder calls (ops, shapes, view offsets and strides, parameters) by the decoder in
//! tests/common/random_graph.rs, the one tests/random_graphs.rs runs under proptest. Every call
//! must give `Ok` or `Err`, never a panic or an abort, and the graph, when it plans and
//! computes, must give bitwise the same results on one thread, two threads and a plan with
//! guard bytes around every tensor.
#![no_main]

#[path = "../../tests/common/random_graph.rs"]
#[allow(dead_code)] // the counts are for the proptest's summary
mod random_graph;

use libfuzzer_sys::fuzz_target;
use std::sync::{Arc, Mutex};

fuzz_target!(|data: &[u8]| {
    let trace: random_graph::Trace = Arc::new(Mutex::new(Vec::new()));
    if let Err(finding) = random_graph::run_case(data, &trace) {
        let steps = trace.lock().unwrap_or_else(|e| e.into_inner()).join("\n  ");
        panic!("{finding}\n  {steps}");
    }
});
