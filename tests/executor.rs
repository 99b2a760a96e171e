//! The executor's team of workers: the caller runs worker 0 and hands the others the job; workers
//! stay hot between computes and go back to the pool when idle. These tests check that it stays
//! correct under the awkward uses: computes from several threads on one backend, computes spaced
//! wider than the hot window, a compute started from inside one of the backend's own computes,
//! a panicking abort hook, and a change of thread count.

use quantgraph::testdata::uniform;
use quantgraph::{Backend, CpuBackend, DType, Error, Graph, Plan, TensorId};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// y = ((x + x) * x + x ...) over `depth` nodes on 64 x 37 values; returns the plan, x and y.
fn chain(be: &CpuBackend, depth: usize) -> (Plan, TensorId, TensorId) {
    let mut g = Graph::new();
    let x = g.input(DType::F32, &[64, 37]).unwrap();
    let mut y = x;
    for i in 0..depth {
        y = if i % 2 == 0 { g.add(y, x).unwrap() } else { g.mul(y, x).unwrap() };
    }
    g.set_output(y).unwrap();
    (Plan::new(g, be).unwrap(), x, y)
}

/// 64 x 37 values in [0.5, 1.5), so the chain neither vanishes nor overflows.
fn input(seed: u64) -> Vec<f32> {
    uniform(64 * 37, seed, 0.5, 1.5)
}

fn reference(x: &[f32], depth: usize) -> Vec<f32> {
    x.iter()
        .map(|&v| {
            let mut y = v;
            for i in 0..depth {
                y = if i % 2 == 0 { y + v } else { y * v };
            }
            y
        })
        .collect()
}

#[test]
fn computes_from_several_threads_on_one_backend_all_finish_correctly() {
    for threads in [2, 3] {
        let be = Arc::new(CpuBackend::with_threads(threads).unwrap());
        let handles: Vec<_> = (0..3u64)
            .map(|t| {
                let be = be.clone();
                std::thread::spawn(move || {
                    let (mut p, x, y) = chain(&be, 7);
                    let xs = input(t);
                    let want = reference(&xs, 7);
                    p.set_input(x, &xs).unwrap();
                    for _ in 0..200 {
                        p.compute().unwrap();
                        assert_eq!(p.output::<f32>(y).unwrap(), &want[..]);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }
}

#[test]
fn computes_spaced_wider_than_the_hot_window_restart_the_workers() {
    let be = CpuBackend::with_threads(3).unwrap();
    let (mut p, x, y) = chain(&be, 5);
    let xs = input(9);
    let want = reference(&xs, 5);
    p.set_input(x, &xs).unwrap();
    for i in 0..12 {
        p.compute().unwrap();
        assert_eq!(p.output::<f32>(y).unwrap(), &want[..]);
        if i % 3 == 0 {
            std::thread::sleep(Duration::from_millis(3));
        }
    }
    // A new thread count replaces the pool and its team.
    be.set_n_threads(2).unwrap();
    p.compute().unwrap();
    assert_eq!(p.output::<f32>(y).unwrap(), &want[..]);
}

#[test]
fn a_compute_inside_a_compute_of_the_same_backend_is_an_error_not_a_deadlock() {
    let be = Arc::new(CpuBackend::with_threads(2).unwrap());
    let other = Arc::new(CpuBackend::with_threads(2).unwrap());
    let saw_error = Arc::new(AtomicBool::new(false));
    for (inner_be, same) in [(be.clone(), true), (other, false)] {
        let flag = saw_error.clone();
        let body: quantgraph::CustomFn = Arc::new(move |a| {
            if a.ith == 0 {
                let (mut p, x, y) = chain(&inner_be, 3);
                let xs = input(1);
                p.set_input(x, &xs).unwrap();
                match p.compute() {
                    Ok(()) => {
                        if p.output::<f32>(y).unwrap() != &reference(&xs, 3)[..] {
                            return Err("inner compute gave wrong values".into());
                        }
                    }
                    Err(e) => {
                        if !e.to_string().contains("inside one of its own") {
                            return Err(format!("unexpected inner error: {e}"));
                        }
                        flag.store(true, Ordering::Relaxed);
                    }
                }
            }
            a.dst[..].fill(1.0);
            Ok(())
        });
        let mut g = Graph::new();
        let x = g.input(DType::F32, &[8, 4]).unwrap();
        let y = g.map_custom1(x, "nested", None, body).unwrap();
        g.set_output(y).unwrap();
        let mut p = Plan::new(g, &be).unwrap();
        p.set_input(x, &[0.0f32; 32]).unwrap();
        saw_error.store(false, Ordering::Relaxed);
        p.compute().unwrap();
        assert_eq!(saw_error.load(Ordering::Relaxed), same, "same backend: {same}");
    }
}

#[test]
fn a_panicking_abort_hook_stops_the_compute_and_leaves_the_plan_usable() {
    let be = CpuBackend::with_threads(3).unwrap();
    let (mut p, x, y) = chain(&be, 6);
    let xs = input(4);
    p.set_input(x, &xs).unwrap();
    be.set_abort_hook(Some(Arc::new(|| panic!("hook failed"))));
    assert!(matches!(p.compute(), Err(Error::Aborted)));
    be.set_abort_hook(None);
    p.compute().unwrap();
    assert_eq!(p.output::<f32>(y).unwrap(), &reference(&xs, 6)[..]);
}

#[test]
fn typed_custom_ops_read_any_type_and_split_their_own_rows() {
    use quantgraph::{CustomAnyArgs, CustomAnyParams, CustomSplitFn};
    // F16 source read through a transposed view (strided elements), I32 source; I32 output:
    // out[i, j] = round(a[i, j]) + ids[j].
    let (r, c) = (5usize, 7usize);
    let mut g = Graph::new();
    let a = g.input(DType::F16, &[r, c]).unwrap();
    let at = g.transpose(a).unwrap();
    let ids = g.input(DType::I32, &[c]).unwrap();
    let body = Arc::new(|args: CustomAnyArgs<'_>| -> Result<(), String> {
        let (a, ids) = (&args.srcs[0], &args.srcs[1]);
        if a.dtype != DType::F16 || ids.dtype != DType::I32 || args.dst_dtype != DType::I32 {
            return Err("types".into());
        }
        let ncols = args.dst_shape[0];
        let out: &mut [i32] = bytemuck::cast_slice_mut(args.dst);
        for (k, row) in args.rows.clone().enumerate() {
            for i in 0..ncols {
                // Element (row, i) of the transposed view: a's element (i, row).
                let off = row * a.nb[0] + i * a.nb[1];
                let h = u16::from_le_bytes([a.data[off], a.data[off + 1]]);
                let v = half::f16::from_bits(h).to_f32().round() as i32;
                let id = i32::from_le_bytes(ids.data[row * 4..row * 4 + 4].try_into().unwrap());
                out[k * ncols + i] = v + id;
            }
        }
        Ok(())
    });
    // Rows handed out back to front: worker ith owns the ith block counted from the end.
    let back_to_front: CustomSplitFn = Arc::new(|ith, nth, n| {
        let per = n.div_ceil(nth);
        let end = n.saturating_sub(ith * per);
        end.saturating_sub(per)..end
    });
    let even = g
        .custom_any(
            "round_add",
            &[at, ids],
            DType::I32,
            [r, c, 1, 1],
            CustomAnyParams::new(),
            body.clone(),
        )
        .unwrap();
    let own = g
        .custom_any(
            "round_add_own_split",
            &[at, ids],
            DType::I32,
            [r, c, 1, 1],
            CustomAnyParams::new().split(back_to_front),
            body.clone(),
        )
        .unwrap();
    g.set_output(even).unwrap();
    g.set_output(own).unwrap();
    let av: Vec<half::f16> =
        uniform(r * c, 3, -20.0, 20.0).iter().map(|&x| half::f16::from_f32(x)).collect();
    let idv: Vec<i32> = (0..c as i32).map(|x| x * 100 - 300).collect();
    let mut want = vec![0i32; r * c];
    for j in 0..c {
        for i in 0..r {
            want[j * r + i] = av[j * r + i].to_f32().round() as i32 + idv[j];
        }
    }
    for nth in [1, 2, 3] {
        let mut plan = Plan::new(g.clone(), &CpuBackend::with_threads(nth).unwrap()).unwrap();
        plan.set_input(a, &av).unwrap();
        plan.set_input(ids, &idv).unwrap();
        plan.compute().unwrap();
        assert_eq!(plan.output::<i32>(even).unwrap(), &want[..], "{nth} threads");
        assert_eq!(plan.output::<i32>(own).unwrap(), &want[..], "{nth} threads, own split");
    }
    // A split that hands a row to two workers is an error naming the op; the plan stays usable.
    let mut g2 = Graph::new();
    let x = g2.input(DType::F32, &[4, 6]).unwrap();
    let overlapping: CustomSplitFn = Arc::new(|_, _, n| 0..n);
    let copy = Arc::new(|args: CustomAnyArgs<'_>| -> Result<(), String> {
        let n = args.dst.len();
        let start = args.rows.start * 16;
        args.dst.copy_from_slice(&args.srcs[0].data[start..start + n]);
        Ok(())
    });
    let y = g2
        .custom_any(
            "dup_rows",
            &[x],
            DType::F32,
            [4, 6, 1, 1],
            CustomAnyParams::new().split(overlapping),
            copy,
        )
        .unwrap();
    g2.set_output(y).unwrap();
    let mut plan = Plan::new(g2, &CpuBackend::with_threads(2).unwrap()).unwrap();
    plan.set_input(x, &[1f32; 24]).unwrap();
    let e = plan.compute().unwrap_err();
    assert!(e.to_string().contains("dup_rows"), "{e}");
    // Bad outputs are refused at build time.
    let q = g.input(DType::Q4_0, &[32, 2]).unwrap();
    let qv = g.view_2d(q, [32, 1], 18 * 2, 0).unwrap();
    let f = Arc::new(|_: CustomAnyArgs<'_>| -> Result<(), String> { Ok(()) });
    assert!(
        g.custom_any("x", &[a], DType::Q4_0, [16, 1, 1, 1], CustomAnyParams::new(), f.clone())
            .is_err()
    );
    assert!(
        g.custom_any("x", &[qv], DType::F32, [1, 1, 1, 1], CustomAnyParams::new(), f.clone())
            .is_ok()
    );
    assert!(
        g.custom_any("x", &[a], DType::F32, [1, 1, 1, 1], CustomAnyParams::new().n_tasks(0), f)
            .is_err()
    );
}

#[test]
fn forward_select_runs_only_the_chosen_branch() {
    use quantgraph::CustomArgs;
    use std::sync::atomic::AtomicUsize;
    for nth in [1, 2, 3] {
        let calls: [Arc<AtomicUsize>; 3] = Default::default();
        let mut g = Graph::new();
        let x = g.input(DType::F32, &[8, 3]).unwrap();
        let mut branches = Vec::new();
        for (b, c) in calls.iter().enumerate() {
            let c = c.clone();
            let f = Arc::new(move |a: CustomArgs<'_>| -> Result<(), String> {
                if a.ith == 0 {
                    c.fetch_add(1, Ordering::Relaxed);
                }
                let n = a.dst_shape[0];
                for (k, r) in a.rows.clone().enumerate() {
                    for i in 0..n {
                        a.dst[k * n + i] = a.srcs[0][r * n + i] * (b as f32 + 2.0);
                    }
                }
                Ok(())
            });
            let y = g.map_custom1(x, &format!("branch{b}"), None, f).unwrap();
            // A second node per branch, so a branch is a chain.
            branches.push(g.scale(y, 0.5).unwrap());
        }
        let out = g.forward_select(&branches, 1).unwrap();
        g.set_output(out).unwrap();
        let mut plan = Plan::new(g.clone(), &CpuBackend::with_threads(nth).unwrap()).unwrap();
        let xv: Vec<f32> = (0..24).map(|i| i as f32).collect();
        plan.set_input(x, &xv).unwrap();
        for (round, idx) in [1usize, 1, 0, 2, 1].into_iter().enumerate() {
            plan.set_select(out, idx).unwrap();
            assert_eq!(plan.n_active_nodes(), 3, "two nodes of one branch and the select");
            plan.compute().unwrap();
            let want: Vec<f32> = xv.iter().map(|v| v * (idx as f32 + 2.0) * 0.5).collect();
            assert_eq!(plan.output::<f32>(out).unwrap(), &want[..], "round {round}, idx {idx}");
        }
        let counts: Vec<usize> = calls.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        assert_eq!(counts, vec![1, 3, 1], "{nth} threads: each branch ran only when chosen");
        // Bad choices are errors and leave the plan as it was.
        assert!(plan.set_select(out, 3).is_err());
        assert!(plan.set_select(branches[0], 0).is_err());
        plan.compute().unwrap();
        let want: Vec<f32> = xv.iter().map(|v| v * 3.0 * 0.5).collect();
        assert_eq!(plan.output::<f32>(out).unwrap(), &want[..]);
    }
    let mut g = Graph::new();
    let a = g.input(DType::F32, &[4]).unwrap();
    let b = g.input(DType::F32, &[5]).unwrap();
    assert!(g.forward_select(&[a, b], 0).is_err(), "shapes differ");
    assert!(g.forward_select(&[a], 1).is_err(), "idx out of range");
    assert!(g.forward_select(&[], 0).is_err(), "no branches");
}
