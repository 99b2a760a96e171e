//! Random graphs through the public API: random ops (unary, broadcast binary, mul_mat and
//! mul_mat_id on every weight type, repacked weights, softmax, norms, rope, get_rows, set_rows,
//! cpy, views with random offsets and strides, permutes, reshapes, concat, flash attention, ...)
//! on random shapes and parameters. Building, planning and computing must each return `Ok` or
//! `Err`, never panic or hang, and every `Ok` result must be bitwise the same on one thread, two
//! threads and a plan with guard bytes around every tensor.
//!
//! The cases are byte strings read by tests/common/random_graph.rs, the decoder the
//! `graph_builder` fuzz target uses too. `QG_PROPTEST_CASES=N` runs N cases instead of the
//! default (for long runs).

#[path = "common/random_graph.rs"]
mod random_graph;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use random_graph::{Outcome, Trace, run_case};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Cases per run by default: about 15 s of the test profile on two cores.
const DEFAULT_CASES: u32 = 1500;
/// A case still running after this long counts as a hang.
const HANG: Duration = Duration::from_secs(120);

fn cases() -> u32 {
    std::env::var("QG_PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(DEFAULT_CASES)
}

/// Runs one case on its own thread (so a hang is reported rather than waited on) and turns a
/// panic, a hang or a disagreement into a failure that prints the builder calls.
fn check(bytes: &[u8]) -> Result<Outcome, String> {
    if std::env::var_os("QG_TRACE").is_some() {
        eprintln!("case bytes {bytes:?}");
    }
    let trace: Trace = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    let (b, t) = (bytes.to_vec(), trace.clone());
    std::thread::spawn(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_case(&b, &t)));
        let _ = tx.send(r);
    });
    let verdict = match rx.recv_timeout(HANG) {
        Ok(Ok(Ok(o))) => return Ok(o),
        Ok(Ok(Err(finding))) => finding,
        Ok(Err(p)) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            format!("panicked: {msg}")
        }
        Err(_) => format!("still running after {HANG:?}"),
    };
    let steps = trace.lock().unwrap_or_else(|e| e.into_inner()).join("\n  ");
    Err(format!("{verdict}\ncase bytes {bytes:?}\n  {steps}"))
}

#[test]
fn random_graphs_never_panic_and_agree_across_threads() {
    let n = cases();
    let config = Config { cases: n, failure_persistence: None, ..Config::default() };
    // The default run draws the same cases every time (CI must not depend on luck); a long
    // run (`QG_PROPTEST_CASES`) or `QG_PROPTEST_RANDOM=1` draws new ones.
    let random = std::env::var_os("QG_PROPTEST_RANDOM").is_some()
        || std::env::var_os("QG_PROPTEST_CASES").is_some();
    let mut runner = if random {
        TestRunner::new(config)
    } else {
        TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha))
    };
    let totals = Mutex::new([0usize; 7]);
    let start = Instant::now();
    let r = runner.run(&proptest::collection::vec(any::<u8>(), 1..200), |bytes| {
        let o = check(&bytes).map_err(TestCaseError::fail)?;
        let mut t = totals.lock().unwrap();
        for (slot, v) in t.iter_mut().zip([
            1,
            o.calls,
            o.calls_ok,
            o.planned as usize,
            o.plan_ok as usize,
            o.computed as usize,
            o.compute_ok as usize,
        ]) {
            *slot += v;
        }
        Ok(())
    });
    let t = totals.into_inner().unwrap();
    eprintln!(
        "random graphs: {} cases in {:.1?}: {} builder calls ({} Ok), {} planned ({} Ok), {} computed ({} Ok on every run)",
        t[0],
        start.elapsed(),
        t[1],
        t[2],
        t[3],
        t[4],
        t[5],
        t[6]
    );
    if let Err(e) = r {
        panic!("{e}");
    }
}

/// A few fixed byte strings that reach the main paths, so they run whatever the random seed.
#[test]
fn fixed_graphs_run() {
    for bytes in [
        vec![0u8; 8],
        vec![2, 7, 9, 9, 3, 3, 3, 4, 1, 0, 0, 0, 0, 0],
        (0..=255).collect(),
        (0..200).map(|i| (i * 37 % 251) as u8).collect(),
    ] {
        if let Err(e) = check(&bytes) {
            panic!("{e}");
        }
    }
}

/// Runs the case in `QG_CASE` (its bytes, comma separated, as a failure prints them); with
/// `QG_TRACE=1 cargo test --test random_graphs replay -- --nocapture` the builder calls print as
/// they are made.
#[test]
fn replay() {
    let Ok(case) = std::env::var("QG_CASE") else { return };
    let bytes: Vec<u8> = case
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().expect("bytes 0..=255"))
        .collect();
    match check(&bytes) {
        Ok(o) => eprintln!("{o:?}"),
        Err(e) => panic!("{e}"),
    }
}
