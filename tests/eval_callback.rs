//! The per-node eval callback: it sees every computed node's name, op and result in order, and
//! stopping a compute from it leaves the plan usable.

use quantgraph::sched::Scheduler;
use quantgraph::{CpuBackend, DType, Error, Graph, Plan, TensorId};
use std::sync::{Arc, Mutex};

/// y = softmax(scale(w x) + b), every node named.
fn small_graph() -> (Graph, TensorId, TensorId) {
    let mut g = Graph::new();
    let w = g.input(DType::F32, &[4, 3]).unwrap();
    g.set_name(w, "w").unwrap();
    let x = g.input(DType::F32, &[4, 2]).unwrap();
    let y = g.mul_mat(w, x).unwrap();
    g.set_name(y, "wx").unwrap();
    let y = g.scale(y, 0.5).unwrap();
    g.set_name(y, "scaled").unwrap();
    let t = g.transpose(y).unwrap(); // a view: not computed, not shown
    let t = g.cont(t).unwrap();
    g.set_name(t, "transposed").unwrap();
    let y = g.soft_max(t).unwrap();
    g.set_name(y, "probs").unwrap();
    g.set_output(y).unwrap();
    (g, w, x)
}

type Seen = Arc<Mutex<Vec<(String, String, [usize; 4], Vec<f32>)>>>;

fn recorder(seen: &Seen) -> quantgraph::EvalCallback {
    let seen = seen.clone();
    Box::new(move |n| {
        let vals: Vec<f32> =
            n.data.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        seen.lock().unwrap().push((n.name.unwrap_or("?").into(), n.op.name().into(), n.ne, vals));
        true
    })
}

#[test]
fn the_callback_sees_every_node_in_order_with_its_result() {
    for threads in [1, 2] {
        let (g, w, x) = small_graph();
        let probs = g.find("probs").unwrap();
        let mut p = Plan::new(g, &CpuBackend::with_threads(threads).unwrap()).unwrap();
        let seen: Seen = Arc::default();
        p.set_eval_callback(Some(recorder(&seen)));
        let wv: Vec<f32> = (0..12).map(|i| i as f32 * 0.1).collect();
        p.set_input(w, &wv).unwrap();
        p.set_input(x, &[1.0f32, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0]).unwrap();
        p.compute().unwrap();
        let seen = seen.lock().unwrap();
        let got: Vec<(&str, &str, [usize; 4])> =
            seen.iter().map(|(n, o, ne, _)| (n.as_str(), o.as_str(), *ne)).collect();
        assert_eq!(
            got,
            [
                ("wx", "mul_mat", [3, 2, 1, 1]),
                ("scaled", "scale", [3, 2, 1, 1]),
                ("transposed", "dup", [2, 3, 1, 1]),
                ("probs", "soft_max", [2, 3, 1, 1]),
            ],
            "{threads} threads"
        );
        // Results as computed: w's column 0 and 1 (rows of 4), halved.
        assert_eq!(seen[0].3, [0.0, 0.4, 0.8, 0.1, 0.5, 0.90000004]);
        assert_eq!(seen[1].3, [0.0, 0.2, 0.4, 0.05, 0.25, 0.45000002]);
        assert_eq!(seen[3].3, p.output::<f32>(probs).unwrap());
    }
}

#[test]
fn stopping_from_the_callback_ends_the_compute_and_the_plan_still_works() {
    let (g, w, x) = small_graph();
    let probs = g.find("probs").unwrap();
    let mut p = Plan::new(g, &CpuBackend::with_threads(2).unwrap()).unwrap();
    p.set_input(w, &[0.25f32; 12]).unwrap();
    p.set_input(x, &[1.0f32; 8]).unwrap();
    p.compute().unwrap();
    let want = p.output::<f32>(probs).unwrap().to_vec();

    let calls = Arc::new(Mutex::new(Vec::new()));
    let c = calls.clone();
    p.set_eval_callback(Some(Box::new(move |n| {
        c.lock().unwrap().push(n.name.unwrap_or("?").to_string());
        n.name != Some("scaled")
    })));
    p.set_input(x, &[2.0f32; 8]).unwrap();
    match p.compute() {
        Err(Error::Stopped { node }) => assert!(node.contains("'scaled'"), "{node}"),
        r => panic!("expected Stopped, got {r:?}"),
    }
    assert_eq!(*calls.lock().unwrap(), ["wx", "scaled"], "no node ran after the stop");

    // Stopping many times: every worker must leave at the same node, or the compute hangs.
    for _ in 0..300 {
        p.set_eval_callback(Some(Box::new(|n| n.name != Some("wx"))));
        assert!(matches!(p.compute(), Err(Error::Stopped { .. })));
    }

    // The plan computes again, with and without the callback.
    p.set_input(x, &[1.0f32; 8]).unwrap();
    p.set_eval_callback(None);
    p.compute().unwrap();
    assert_eq!(p.output::<f32>(probs).unwrap(), want);
    p.set_eval_callback(Some(Box::new(|_| true)));
    p.compute().unwrap();
    assert_eq!(p.output::<f32>(probs).unwrap(), want);
}

#[test]
fn a_panicking_callback_is_an_error_not_a_crash() {
    let (g, w, x) = small_graph();
    let mut p = Plan::new(g, &CpuBackend::with_threads(2).unwrap()).unwrap();
    p.set_input(w, &[0.25f32; 12]).unwrap();
    p.set_input(x, &[1.0f32; 8]).unwrap();
    p.set_eval_callback(Some(Box::new(|_| panic!("boom"))));
    let e = p.compute().unwrap_err().to_string();
    assert!(e.contains("eval callback") && e.contains("boom"), "{e}");
    p.set_eval_callback(None);
    p.compute().unwrap();
}

#[test]
fn the_scheduler_passes_the_callback_to_every_split() {
    let (g, w, x) = small_graph();
    let be = |n| Arc::new(CpuBackend::with_threads(n).unwrap()) as Arc<dyn quantgraph::Backend>;
    let mut p = Scheduler::new(vec![be(1), be(2)]).unwrap().plan(g).unwrap();
    let seen: Seen = Arc::default();
    p.set_eval_callback(Some(recorder(&seen))).unwrap();
    p.set_input(w, &[0.25f32; 12]).unwrap();
    p.set_input(x, &[1.0f32; 8]).unwrap();
    p.compute().unwrap();
    let names: Vec<String> = seen.lock().unwrap().iter().map(|s| s.0.clone()).collect();
    assert_eq!(names, ["wx", "scaled", "transposed", "probs"]);
}
