//! State-space, recurrent and misc ops (ssm_conv, ssm_scan, rwkv_wkv6/7, gated_linear_attn,
//! gated_delta_net, solve_tri, lightning_indexer, dsv4_hc_*) against plain f64 references, with
//! test-backend-ops' shapes and NMSE limits, guard bytes around every tensor, thread-count
//! invariance (1, 2 and 3 threads bitwise equal) and build-time errors on bad inputs. Ends with a
//! Mamba-2 block (mul_mat, ssm_conv, silu, ssm_scan) checked end to end.

mod common;

use common::nmse;
use quantgraph::testdata::{rand_f32, uniform};
use quantgraph::{CpuBackend, DType, Error, Graph, Plan, TensorId};

/// Input data for one tensor.
enum Data {
    F32(Vec<f32>),
    I32(Vec<i32>),
    Bytes(Vec<u8>),
}

fn run(g: &Graph, inputs: &[(TensorId, &Data)], out: TensorId, nth: usize) -> Vec<f32> {
    let be = CpuBackend::with_threads(nth).unwrap();
    let mut g = g.clone();
    g.set_output(out).unwrap();
    let mut p = Plan::with_guards(g, &be, 64).unwrap();
    for (id, d) in inputs {
        match d {
            Data::F32(v) => p.set_input(*id, v).unwrap(),
            Data::I32(v) => p.set_input(*id, v).unwrap(),
            Data::Bytes(v) => p.set_input_bytes(*id, v).unwrap(),
        }
    }
    p.compute().unwrap();
    p.check_guards().unwrap();
    p.output::<f32>(out).unwrap().to_vec()
}

/// Runs with 1, 2 and 3 threads, checks the three results are bitwise equal, returns one.
fn run_threads(g: &Graph, inputs: &[(TensorId, &Data)], out: TensorId) -> Vec<f32> {
    let r1 = run(g, inputs, out, 1);
    for nth in [2, 3] {
        let r = run(g, inputs, out, nth);
        assert!(
            r.iter().zip(&r1).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{nth} threads differ from 1 thread"
        );
    }
    r1
}

fn check(what: &str, got: &[f32], want: &[f64], limit: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let e = nmse(got, want);
    assert!(e <= limit, "{what}: nmse {e:e} > {limit:e}");
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

// ---------------------------------------------------------------------------------------------
// ssm_conv

fn ssm_conv_ref(sx: &[f32], c: &[f32], ne_a: [usize; 3], d_conv: usize) -> Vec<f64> {
    let [ncs, d_inner, n_s] = ne_a;
    let n_t = ncs + 1 - d_conv;
    let mut y = vec![0f64; d_inner * n_t * n_s];
    for s in 0..n_s {
        for t in 0..n_t {
            for i in 0..d_inner {
                let mut sum = 0f64;
                for k in 0..d_conv {
                    sum += sx[(s * d_inner + i) * ncs + t + k] as f64 * c[i * d_conv + k] as f64;
                }
                y[(s * n_t + t) * d_inner + i] = sum;
            }
        }
    }
    y
}

#[test]
fn ssm_conv_matches_reference() {
    let mut cases = vec![([10usize, 10, 10], 3usize)];
    for d_conv in [3usize, 4, 9] {
        for d_inner in [1024usize, 1536] {
            cases.push(([d_conv, d_inner, 1], d_conv));
            cases.push(([2 * d_conv, d_inner, 1], d_conv));
            cases.push(([d_conv, d_inner, 4], d_conv));
            cases.push(([d_conv - 1 + 64, d_inner, 1], d_conv));
            cases.push(([d_conv - 1 + 64, d_inner, 4], d_conv));
        }
    }
    for (i, (ne_a, d_conv)) in cases.into_iter().enumerate() {
        let mut g = Graph::new();
        let sx = g.input(DType::F32, &ne_a).unwrap();
        let c = g.input(DType::F32, &[d_conv, ne_a[1]]).unwrap();
        let y = g.ssm_conv(sx, c).unwrap();
        let n_t = ne_a[0] + 1 - d_conv;
        assert_eq!(g.shape(y).unwrap(), [ne_a[1], n_t, ne_a[2], 1]);
        let a = rand_f32(ne_a.iter().product(), 10 + i as u64);
        let w = rand_f32(d_conv * ne_a[1], 20 + i as u64);
        let (da, dw) = (Data::F32(a.clone()), Data::F32(w.clone()));
        let inputs = [(sx, &da), (c, &dw)];
        let got = if i % 4 == 0 { run_threads(&g, &inputs, y) } else { run(&g, &inputs, y, 2) };
        check(
            &format!("ssm_conv {ne_a:?} d_conv {d_conv}"),
            &got,
            &ssm_conv_ref(&a, &w, ne_a, d_conv),
            1e-7,
        );
    }
}

#[test]
fn ssm_conv_rejects_bad_shapes() {
    let mut g = Graph::new();
    let sx = g.input(DType::F32, &[6, 8, 2]).unwrap();
    let c_bad_inner = g.input(DType::F32, &[4, 7]).unwrap();
    let c_too_long = g.input(DType::F32, &[8, 8]).unwrap();
    let c_f16 = g.input(DType::F16, &[4, 8]).unwrap();
    let sx4 = g.input(DType::F32, &[6, 8, 2, 2]).unwrap();
    let c = g.input(DType::F32, &[4, 8]).unwrap();
    assert!(matches!(g.ssm_conv(sx, c_bad_inner), Err(Error::Shape { .. })));
    assert!(matches!(g.ssm_conv(sx, c_too_long), Err(Error::Shape { .. })));
    assert!(matches!(g.ssm_conv(sx, c_f16), Err(Error::Type { .. })));
    assert!(matches!(g.ssm_conv(sx4, c), Err(Error::Shape { .. })));
    let sxt = g.transpose(sx).unwrap();
    assert!(g.ssm_conv(sxt, c).is_err());
    assert!(g.ssm_conv(sx, c).is_ok());
}

// ---------------------------------------------------------------------------------------------
// ssm_scan

struct Scan {
    d_state: usize,
    head_dim: usize,
    n_head: usize,
    n_group: usize,
    n_tok: usize,
    n_seqs: usize,
    k: usize,
}

/// f64 reference: y then k state slots, as ggml lays them out. Slots never written are 0.
#[allow(clippy::too_many_arguments)]
fn ssm_scan_ref(
    p: &Scan,
    s0: &[f32],
    x: impl Fn(usize, usize, usize, usize) -> f32,
    dt: &[f32],
    a: &[f32],
    b: impl Fn(usize, usize, usize, usize) -> f32,
    c: impl Fn(usize, usize, usize, usize) -> f32,
    ids: &[i32],
) -> Vec<f64> {
    let (nc, nr, nh, ng, nt, ns) = (p.d_state, p.head_dim, p.n_head, p.n_group, p.n_tok, p.n_seqs);
    let seq = nc * nr * nh;
    let ny = nr * nh * nt * ns;
    let mut out = vec![0f64; ny + p.k * seq * ns];
    let a_per_state = a.len() == nc * nh;
    for q in 0..ns {
        let mut st: Vec<f64> = f64s(&s0[ids[q] as usize * seq..(ids[q] as usize + 1) * seq]);
        for t in 0..nt {
            for h in 0..nh {
                let dtv = dt[(q * nt + t) * nh + h] as f64;
                let sp = if dtv > 20.0 { dtv } else { (1.0 + dtv.exp()).ln() };
                let gi = h / (nh / ng);
                for i1 in 0..nr {
                    let xdt = x(i1, h, t, q) as f64 * sp;
                    let mut sum = 0f64;
                    for i0 in 0..nc {
                        let av = if a_per_state { a[h * nc + i0] } else { a[h] } as f64;
                        let idx = (h * nr + i1) * nc + i0;
                        st[idx] = st[idx] * (sp * av).exp() + b(i0, gi, t, q) as f64 * xdt;
                        sum += st[idx] * c(i0, gi, t, q) as f64;
                    }
                    out[((q * nt + t) * nh + h) * nr + i1] = sum;
                }
            }
            let slot = nt - 1 - t;
            if slot < p.k {
                let o = ny + (slot * ns + q) * seq;
                out[o..o + seq].copy_from_slice(&st);
            }
        }
    }
    out
}

fn ssm_scan_case(p: &Scan, overlap: bool, seed: u64, threads: bool) -> Vec<f32> {
    let (nc, nr, nh, ng, nt, ns) = (p.d_state, p.head_dim, p.n_head, p.n_group, p.n_tok, p.n_seqs);
    let mut g = Graph::new();
    let s = g.input(DType::F32, &[nc, nr, nh, ns]).unwrap();
    let dt = g.input(DType::F32, &[nh, nt, ns]).unwrap();
    let a_ne0 = if nr > 1 { 1 } else { nc };
    let a = g.input(DType::F32, &[a_ne0, nh]).unwrap();
    let ids = g.input(DType::I32, &[ns]).unwrap();
    let sd = rand_f32(nc * nr * nh * ns, seed);
    let dtd = rand_f32(nh * nt * ns, seed + 1);
    let ad = uniform(a_ne0 * nh, seed + 2, -1.0, -0.5);
    // ids: a permutation of 0..ns
    let idd: Vec<i32> = (0..ns as i32).map(|i| (i * 3 + 1) % ns as i32).collect();
    let mut datas = vec![
        (s, Data::F32(sd.clone())),
        (dt, Data::F32(dtd.clone())),
        (a, Data::F32(ad.clone())),
        (ids, Data::I32(idd.clone())),
    ];
    let (x, b, c, want) = if overlap {
        // x, B and C are overlapping views of one tensor, as test-backend-ops' xbc_overlap.
        assert_eq!(nr, nc);
        let ne = [nc, nh, nt, 2 * ns];
        let xbc = g.input(DType::F32, &ne).unwrap();
        let nb = g.strides(xbc).unwrap();
        let x = g.view_4d(xbc, [nr, nh, nt, ns], [nb[1], nb[2], nb[3]], nb[3]).unwrap();
        let b = g.view_4d(xbc, [nc, ng, nt, ns], [nb[1], nb[2], nb[3]], 0).unwrap();
        let c = g.view_4d(xbc, [nc, ng, nt, ns], [nb[1], nb[2], nb[3]], 2 * nb[3]).unwrap();
        let d = rand_f32(ne.iter().product(), seed + 3);
        let at = |off: usize, i0: usize, i1: usize, i2: usize, i3: usize| {
            d[off + ((i3 * nt + i2) * nh + i1) * nc + i0]
        };
        let seq = nc * nh * nt;
        let want = ssm_scan_ref(
            p,
            &sd,
            |i0, i1, i2, i3| at(seq, i0, i1, i2, i3),
            &dtd,
            &ad,
            |i0, i1, i2, i3| at(0, i0, i1, i2, i3),
            |i0, i1, i2, i3| at(2 * seq, i0, i1, i2, i3),
            &idd,
        );
        datas.push((xbc, Data::F32(d)));
        (x, b, c, want)
    } else {
        let x = g.input(DType::F32, &[nr, nh, nt, ns]).unwrap();
        let b = g.input(DType::F32, &[nc, ng, nt, ns]).unwrap();
        let c = g.input(DType::F32, &[nc, ng, nt, ns]).unwrap();
        let xd = rand_f32(nr * nh * nt * ns, seed + 4);
        let bd = rand_f32(nc * ng * nt * ns, seed + 5);
        let cd = rand_f32(nc * ng * nt * ns, seed + 6);
        let want = ssm_scan_ref(
            p,
            &sd,
            |i0, i1, i2, i3| xd[((i3 * nt + i2) * nh + i1) * nr + i0],
            &dtd,
            &ad,
            |i0, i1, i2, i3| bd[((i3 * nt + i2) * ng + i1) * nc + i0],
            |i0, i1, i2, i3| cd[((i3 * nt + i2) * ng + i1) * nc + i0],
            &idd,
        );
        datas.extend([(x, Data::F32(xd)), (b, Data::F32(bd)), (c, Data::F32(cd))]);
        (x, b, c, want)
    };
    let y = g.ssm_scan(s, x, dt, a, b, c, ids, p.k).unwrap();
    let inputs: Vec<(TensorId, &Data)> = datas.iter().map(|(id, d)| (*id, d)).collect();
    let got = if threads { run_threads(&g, &inputs, y) } else { run(&g, &inputs, y, 2) };
    let limit = if nr > 1 { 2e-7 } else { 1e-7 };
    check(
        &format!(
            "ssm_scan d_state {nc} head_dim {nr} n_head {nh} n_group {ng} tokens {nt} seqs {ns} K {} overlap {overlap}",
            p.k
        ),
        &got,
        &want,
        limit,
    );
    got
}

#[test]
fn ssm_scan_mamba1_and_mamba2_match_reference() {
    let sc = |d_state, head_dim, n_head, n_group, n_tok, n_seqs, k| Scan {
        d_state,
        head_dim,
        n_head,
        n_group,
        n_tok,
        n_seqs,
        k,
    };
    // test-backend-ops: Mamba-1, Mamba-2, Falcon-H1, x/B/C overlap, rollback snapshots.
    ssm_scan_case(&sc(16, 1, 1024, 1, 32, 4, 1), false, 1, true);
    ssm_scan_case(&sc(128, 64, 16, 2, 32, 4, 1), false, 2, true);
    ssm_scan_case(&sc(256, 64, 8, 2, 32, 4, 1), false, 3, false);
    ssm_scan_case(&sc(128, 128, 4, 4, 16, 2, 1), true, 4, true);
    ssm_scan_case(&sc(128, 64, 16, 2, 4, 2, 4), false, 5, true);
    ssm_scan_case(&sc(128, 64, 16, 2, 8, 2, 3), false, 6, false);
    // Odd sizes: d_state not a multiple of the vector width, 3 heads per group.
    ssm_scan_case(&sc(19, 5, 6, 2, 7, 3, 2), false, 7, true);
    // Fewer tokens than snapshot slots: the older slots are zero.
    let got = ssm_scan_case(&sc(16, 4, 4, 1, 2, 2, 4), false, 8, true);
    let (ny, seq) = (4 * 4 * 2 * 2, 16 * 4 * 4);
    assert!(got[ny + 2 * seq * 2..].iter().all(|&v| v == 0.0));
}

#[test]
fn ssm_scan_snapshots_equal_prefix_states() {
    // test-backend-ops' ssm_scan_rollback: slot j of a K-slot scan is the final state of a
    // 1-slot scan over the first n_tok - j tokens; here bitwise.
    let (nc, nr, nh, ng, nt, ns, kk) = (32usize, 64, 16, 2, 8, 2, 3);
    let sd = rand_f32(nc * nr * nh * ns, 1);
    let xd = rand_f32(nr * nh * nt * ns, 2);
    let dtd = rand_f32(nh * nt * ns, 3);
    let ad = uniform(nh, 4, -1.0, -0.5);
    let bd = rand_f32(nc * ng * nt * ns, 5);
    let cd = rand_f32(nc * ng * nt * ns, 6);
    let idd = vec![1i32, 0];
    let scan = |tokens: usize, k: usize| {
        let mut g = Graph::new();
        let s = g.input(DType::F32, &[nc, nr, nh, ns]).unwrap();
        let x = g.input(DType::F32, &[nr, nh, tokens, ns]).unwrap();
        let dt = g.input(DType::F32, &[nh, tokens, ns]).unwrap();
        let a = g.input(DType::F32, &[1, nh]).unwrap();
        let b = g.input(DType::F32, &[nc, ng, tokens, ns]).unwrap();
        let c = g.input(DType::F32, &[nc, ng, tokens, ns]).unwrap();
        let ids = g.input(DType::I32, &[ns]).unwrap();
        let y = g.ssm_scan(s, x, dt, a, b, c, ids, k).unwrap();
        let prefix = |v: &[f32], per_tok: usize| -> Vec<f32> {
            (0..ns)
                .flat_map(|q| v[q * nt * per_tok..(q * nt + tokens) * per_tok].to_vec())
                .collect()
        };
        let d = [
            (s, Data::F32(sd.clone())),
            (x, Data::F32(prefix(&xd, nr * nh))),
            (dt, Data::F32(prefix(&dtd, nh))),
            (a, Data::F32(ad.clone())),
            (b, Data::F32(prefix(&bd, nc * ng))),
            (c, Data::F32(prefix(&cd, nc * ng))),
            (ids, Data::I32(idd.clone())),
        ];
        let inputs: Vec<(TensorId, &Data)> = d.iter().map(|(id, d)| (*id, d)).collect();
        run(&g, &inputs, y, 2)
    };
    let full = scan(nt, kk);
    let (ny, st) = (nr * nh * nt * ns, nc * nr * nh * ns);
    for slot in 0..kk {
        let pre = scan(nt - slot, 1);
        let pny = nr * nh * (nt - slot) * ns;
        assert_eq!(&full[ny + slot * st..ny + (slot + 1) * st], &pre[pny..pny + st], "slot {slot}");
    }
}

#[test]
fn ssm_scan_rejects_bad_inputs_and_ids() {
    let mut g = Graph::new();
    let s = g.input(DType::F32, &[16, 4, 4, 2]).unwrap();
    let x = g.input(DType::F32, &[4, 4, 3, 2]).unwrap();
    let dt = g.input(DType::F32, &[4, 3, 2]).unwrap();
    let a = g.input(DType::F32, &[1, 4]).unwrap();
    let a1 = g.input(DType::F32, &[16, 4]).unwrap();
    let a_bad = g.input(DType::F32, &[5, 4]).unwrap();
    let b = g.input(DType::F32, &[16, 2, 3, 2]).unwrap();
    let c = g.input(DType::F32, &[16, 2, 3, 2]).unwrap();
    let b3 = g.input(DType::F32, &[16, 3, 3, 2]).unwrap();
    let ids = g.input(DType::I32, &[2]).unwrap();
    let ids_f = g.input(DType::F32, &[2]).unwrap();
    let dt_bad = g.input(DType::F32, &[4, 2, 2]).unwrap();
    assert!(matches!(g.ssm_scan(s, x, dt, a, b, c, ids, 0), Err(Error::Param { .. })));
    assert!(matches!(g.ssm_scan(s, x, dt, a1, b, c, ids, 2), Err(Error::Param { .. })));
    assert!(matches!(g.ssm_scan(s, x, dt, a_bad, b, c, ids, 1), Err(Error::Shape { .. })));
    assert!(matches!(g.ssm_scan(s, x, dt, a, b3, b3, ids, 1), Err(Error::Shape { .. })));
    assert!(matches!(g.ssm_scan(s, x, dt, a, b, b3, ids, 1), Err(Error::Shape { .. })));
    assert!(matches!(g.ssm_scan(s, x, dt, a, b, c, ids_f, 1), Err(Error::Type { .. })));
    assert!(matches!(g.ssm_scan(s, x, dt_bad, a, b, c, ids, 1), Err(Error::Shape { .. })));
    let xt = g.permute(x, [1, 0, 2, 3]).unwrap();
    assert!(matches!(g.ssm_scan(s, xt, dt, a, b, c, ids, 1), Err(Error::Shape { .. })));
    // An id out of range is data: compute returns Err and the plan stays usable.
    let y = g.ssm_scan(s, x, dt, a, b, c, ids, 1).unwrap();
    g.set_output(y).unwrap();
    let mut p = Plan::with_guards(g, &CpuBackend::with_threads(2).unwrap(), 64).unwrap();
    for (id, n) in [(s, 16 * 4 * 4 * 2), (x, 4 * 4 * 3 * 2), (dt, 24), (a, 4), (b, 192), (c, 192)] {
        p.set_input(id, &rand_f32(n, 1)).unwrap();
    }
    p.set_input(ids, &[0i32, 2]).unwrap();
    assert!(matches!(p.compute(), Err(Error::IndexOutOfRange { index: 2, limit: 2, .. })));
    p.set_input(ids, &[1i32, 0]).unwrap();
    p.compute().unwrap();
}

// ---------------------------------------------------------------------------------------------
// rwkv_wkv6, gated_linear_attn, rwkv_wkv7

/// Output + final states of the linear-attention recurrences, ggml's layout.
/// `step(state of one head [S*S], token offset, head, y of this token and head)`.
fn linear_attn_ref(
    s: usize,
    h: usize,
    t: usize,
    n_seqs: usize,
    state0: &[f32],
    mut step: impl FnMut(&mut [f64], usize, usize, &mut [f64]),
) -> Vec<f64> {
    let c = s * h;
    let mut out = vec![0f64; c * (t + s * n_seqs)];
    let per = t / n_seqs;
    for q in 0..n_seqs {
        for hh in 0..h {
            let so = q * s * s * h + hh * s * s;
            let mut st = f64s(&state0[so..so + s * s]);
            for tt in q * per..(q + 1) * per {
                let mut y = vec![0f64; s];
                step(&mut st, tt * c + hh * s, hh, &mut y);
                out[tt * c + hh * s..tt * c + (hh + 1) * s].copy_from_slice(&y);
            }
            out[c * t + so..c * t + so + s * s].copy_from_slice(&st);
        }
    }
    out
}

const RWKV_SHAPES: [(usize, usize, usize, usize); 4] =
    [(32, 64, 1, 1), (32, 64, 32, 1), (32, 64, 32, 4), (32, 64, 128, 4)];

#[test]
fn rwkv_wkv6_matches_reference() {
    for (i, &(h, s, n_seq_tokens, n_seqs)) in RWKV_SHAPES.iter().chain(&[(3, 19, 5, 2)]).enumerate()
    {
        let t = n_seq_tokens * n_seqs;
        let mut g = Graph::new();
        let ins: Vec<TensorId> = (0..4).map(|_| g.input(DType::F32, &[s, h, t]).unwrap()).collect();
        let tf = g.input(DType::F32, &[s, h]).unwrap();
        let st = g.input(DType::F32, &[s * s * h, n_seqs]).unwrap();
        let (k, v, r, td) = (ins[0], ins[1], ins[2], ins[3]);
        let y = g.rwkv_wkv6(k, v, r, tf, td, st).unwrap();
        assert_eq!(g.shape(y).unwrap(), [s * h, t + s * n_seqs, 1, 1]);
        let d: Vec<Vec<f32>> = (0..4).map(|j| rand_f32(s * h * t, 100 * i as u64 + j)).collect();
        let tfd = rand_f32(s * h, 7);
        let sd = rand_f32(s * s * h * n_seqs, 8);
        let want = linear_attn_ref(s, h, t, n_seqs, &sd, |st, o, hh, y| {
            for i in 0..s {
                let (kk, rr, ww) = (d[0][o + i] as f64, d[2][o + i] as f64, d[3][o + i] as f64);
                let u = tfd[hh * s + i] as f64;
                for j in 0..s {
                    let kv = kk * d[1][o + j] as f64;
                    y[j] += rr * (u * kv + st[i * s + j]);
                    st[i * s + j] = st[i * s + j] * ww + kv;
                }
            }
        });
        let datas: Vec<Data> =
            d.iter().map(|v| Data::F32(v.clone())).chain([Data::F32(tfd), Data::F32(sd)]).collect();
        let inputs: Vec<(TensorId, &Data)> =
            [k, v, r, td, tf, st].into_iter().zip(datas.iter()).collect();
        let got =
            if i == 2 || i == 4 { run_threads(&g, &inputs, y) } else { run(&g, &inputs, y, 2) };
        check(
            &format!("rwkv_wkv6 H {h} S {s} tokens {n_seq_tokens} seqs {n_seqs}"),
            &got,
            &want,
            1e-7,
        );
    }
}

#[test]
fn gated_linear_attn_matches_reference() {
    for (i, &(h, s, n_seq_tokens, n_seqs)) in RWKV_SHAPES.iter().chain(&[(3, 19, 5, 2)]).enumerate()
    {
        let t = n_seq_tokens * n_seqs;
        let scale = (s as f32).powf(-0.5);
        let mut g = Graph::new();
        let ins: Vec<TensorId> = (0..4).map(|_| g.input(DType::F32, &[s, h, t]).unwrap()).collect();
        let st = g.input(DType::F32, &[s * s * h, n_seqs]).unwrap();
        let (k, v, q, gg) = (ins[0], ins[1], ins[2], ins[3]);
        let y = g.gated_linear_attn(k, v, q, gg, st, scale).unwrap();
        let d: Vec<Vec<f32>> = (0..4).map(|j| rand_f32(s * h * t, 200 * i as u64 + j)).collect();
        let sd = rand_f32(s * s * h * n_seqs, 9);
        let want = linear_attn_ref(s, h, t, n_seqs, &sd, |st, o, _, y| {
            for i in 0..s {
                let (kk, qq, gv) =
                    (d[0][o + i] as f64, (d[2][o + i] * scale) as f64, d[3][o + i] as f64);
                for j in 0..s {
                    let temp = st[i * s + j] * gv + kk * d[1][o + j] as f64;
                    y[j] += temp * qq;
                    st[i * s + j] = temp;
                }
            }
        });
        let datas: Vec<Data> =
            d.iter().map(|v| Data::F32(v.clone())).chain([Data::F32(sd)]).collect();
        let inputs: Vec<(TensorId, &Data)> =
            [k, v, q, gg, st].into_iter().zip(datas.iter()).collect();
        let got =
            if i == 2 || i == 4 { run_threads(&g, &inputs, y) } else { run(&g, &inputs, y, 2) };
        check(
            &format!("gated_linear_attn H {h} S {s} tokens {n_seq_tokens} seqs {n_seqs}"),
            &got,
            &want,
            1e-7,
        );
    }
}

fn l2_rows(v: &mut [f32], n: usize) {
    for row in v.chunks_exact_mut(n) {
        let norm = row.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
        let inv = 1.0 / norm.max(1e-7);
        for x in row {
            *x = (*x as f64 * inv) as f32;
        }
    }
}

#[test]
fn rwkv_wkv7_matches_reference() {
    let shapes = [
        (32usize, 64usize, 1usize, 1usize),
        (32, 64, 1, 4),
        (32, 64, 32, 1),
        (32, 64, 32, 4),
        (32, 64, 128, 4),
        (3, 19, 5, 2),
    ];
    for (i, &(h, s, n_seq_tokens, n_seqs)) in shapes.iter().enumerate() {
        let t = n_seq_tokens * n_seqs;
        let mut g = Graph::new();
        let ins: Vec<TensorId> = (0..6).map(|_| g.input(DType::F32, &[s, h, t]).unwrap()).collect();
        let st = g.input(DType::F32, &[s * s * h, n_seqs]).unwrap();
        let y = g.rwkv_wkv7(ins[0], ins[1], ins[2], ins[3], ins[4], ins[5], st).unwrap();
        let mut d: Vec<Vec<f32>> =
            (0..6).map(|j| rand_f32(s * h * t, 300 * i as u64 + j)).collect();
        // test-backend-ops l2-normalises a and b (the state can blow up otherwise).
        l2_rows(&mut d[4], s);
        l2_rows(&mut d[5], s);
        let sd = rand_f32(s * s * h * n_seqs, 10);
        let want = linear_attn_ref(s, h, t, n_seqs, &sd, |st, o, _, y| {
            let at = |m: usize, j: usize| d[m][o + j] as f64;
            for i in 0..s {
                let row = &mut st[i * s..(i + 1) * s];
                let sa: f64 = (0..s).map(|j| at(4, j) * row[j]).sum();
                let vi = at(3, i);
                let mut res = 0f64;
                for j in 0..s {
                    row[j] = row[j] * at(1, j) + vi * at(2, j) + sa * at(5, j);
                    res += row[j] * at(0, j);
                }
                y[i] = res;
            }
        });
        let datas: Vec<Data> =
            d.iter().map(|v| Data::F32(v.clone())).chain([Data::F32(sd)]).collect();
        let ids: Vec<TensorId> = ins.iter().copied().chain([st]).collect();
        let inputs: Vec<(TensorId, &Data)> = ids.into_iter().zip(datas.iter()).collect();
        let got =
            if i == 3 || i == 5 { run_threads(&g, &inputs, y) } else { run(&g, &inputs, y, 2) };
        check(
            &format!("rwkv_wkv7 H {h} S {s} tokens {n_seq_tokens} seqs {n_seqs}"),
            &got,
            &want,
            5e-3,
        );
    }
}

#[test]
fn rwkv_family_rejects_bad_inputs() {
    let mut g = Graph::new();
    let x = g.input(DType::F32, &[8, 2, 6]).unwrap();
    let x5 = g.input(DType::F32, &[8, 2, 5]).unwrap();
    let tf = g.input(DType::F32, &[8, 2]).unwrap();
    let tf_bad = g.input(DType::F32, &[8, 3]).unwrap();
    let st = g.input(DType::F32, &[128, 2]).unwrap();
    let st4 = g.input(DType::F32, &[128, 4]).unwrap();
    let st_bad = g.input(DType::F32, &[100, 2]).unwrap();
    let xf16 = g.input(DType::F16, &[8, 2, 6]).unwrap();
    assert!(g.rwkv_wkv6(x, x, x, tf, x, st).is_ok());
    assert!(matches!(g.rwkv_wkv6(x, x5, x, tf, x, st), Err(Error::Shape { .. })));
    assert!(matches!(g.rwkv_wkv6(x, x, x, tf_bad, x, st), Err(Error::Shape { .. })));
    assert!(matches!(g.rwkv_wkv6(x, x, x, tf, x, st_bad), Err(Error::Shape { .. })));
    // 6 tokens cannot be split into 4 sequences
    assert!(matches!(g.rwkv_wkv6(x, x, x, tf, x, st4), Err(Error::Shape { .. })));
    assert!(matches!(g.rwkv_wkv6(x, xf16, x, tf, x, st), Err(Error::Type { .. })));
    assert!(matches!(g.gated_linear_attn(x, x, x, x, st, f32::NAN), Err(Error::Param { .. })));
    assert!(matches!(g.gated_linear_attn(x, x, x5, x, st, 1.0), Err(Error::Shape { .. })));
    assert!(matches!(g.rwkv_wkv7(x, x, x, x, x, x5, st), Err(Error::Shape { .. })));
    let xt = g.transpose(x).unwrap();
    assert!(matches!(g.rwkv_wkv7(x, x, x, x, xt, x, st), Err(Error::Shape { .. })));
}

// ---------------------------------------------------------------------------------------------
// solve_tri

#[test]
fn solve_tri_matches_reference() {
    let cases: [([usize; 4], usize); 9] = [
        ([10, 10, 4, 3], 3),
        ([11, 11, 1, 1], 5),
        ([17, 17, 2, 4], 9),
        ([30, 30, 7, 1], 8),
        ([42, 42, 5, 2], 10),
        ([64, 64, 2, 2], 64),
        ([79, 79, 5, 3], 417),
        ([128, 128, 4, 2], 32),
        ([80, 80, 2, 8], 81),
    ];
    for (ci, (ne_a, kc)) in cases.into_iter().enumerate() {
        let [n, _, p, q] = ne_a;
        let mut g = Graph::new();
        let a = g.input(DType::F32, &ne_a).unwrap();
        let b = g.input(DType::F32, &[kc, n, p, q]).unwrap();
        let x = g.solve_tri(a, b, true, true, false).unwrap();
        // test-backend-ops' init_tensor_tril(0.1, 1): lower triangle with diagonal in [0.1, 1].
        let mut ad = uniform(n * n * p * q, 40 + ci as u64, 0.1, 1.0);
        for (idx, v) in ad.iter_mut().enumerate() {
            if idx % n > (idx / n) % n {
                *v = 0.0;
            }
        }
        let bd = rand_f32(kc * n * p * q, 50 + ci as u64);
        let mut want = vec![0f64; kc * n * p * q];
        for m in 0..p * q {
            let (am, bm) = (&ad[m * n * n..(m + 1) * n * n], &bd[m * n * kc..(m + 1) * n * kc]);
            let xm = &mut want[m * n * kc..(m + 1) * n * kc];
            for col in 0..kc {
                for row in 0..n {
                    let mut sum = 0f64;
                    for t in 0..row {
                        sum += am[row * n + t] as f64 * xm[t * kc + col];
                    }
                    xm[row * kc + col] =
                        (bm[row * kc + col] as f64 - sum) / am[row * n + row] as f64;
                }
            }
        }
        let (da, db) = (Data::F32(ad), Data::F32(bd));
        let inputs = [(a, &da), (b, &db)];
        let got = if ci % 3 == 0 { run_threads(&g, &inputs, x) } else { run(&g, &inputs, x, 2) };
        check(&format!("solve_tri {ne_a:?} k {kc}"), &got, &want, 1e-7);
    }
}

#[test]
fn solve_tri_rejects_bad_inputs() {
    let mut g = Graph::new();
    let a = g.input(DType::F32, &[8, 8, 2]).unwrap();
    let b = g.input(DType::F32, &[3, 8, 2]).unwrap();
    let b_rows = g.input(DType::F32, &[3, 7, 2]).unwrap();
    let b_batch = g.input(DType::F32, &[3, 8, 3]).unwrap();
    let a_rect = g.input(DType::F32, &[8, 7, 2]).unwrap();
    assert!(g.solve_tri(a, b, true, true, false).is_ok());
    assert!(matches!(g.solve_tri(a, b, false, true, false), Err(Error::Param { .. })));
    assert!(matches!(g.solve_tri(a, b, true, false, false), Err(Error::Param { .. })));
    assert!(matches!(g.solve_tri(a, b, true, true, true), Err(Error::Param { .. })));
    assert!(matches!(g.solve_tri(a, b_rows, true, true, false), Err(Error::Shape { .. })));
    assert!(matches!(g.solve_tri(a, b_batch, true, true, false), Err(Error::Shape { .. })));
    assert!(matches!(g.solve_tri(a_rect, b, true, true, false), Err(Error::Shape { .. })));
    let bt = g.transpose(b).unwrap();
    assert!(g.solve_tri(a, bt, true, true, false).is_err());
}

// ---------------------------------------------------------------------------------------------
// gated_delta_net

struct Gdn {
    heads: usize,
    s: usize,
    nt: usize,
    ns: usize,
    v_repeat: usize,
    permuted: bool,
    kda: bool,
    k: usize,
}

fn gdn_case(p: &Gdn, seed: u64, threads: bool) {
    let (hk, s, nt, ns) = (p.heads, p.s, p.nt, p.ns);
    let hv = hk * p.v_repeat;
    let mut g = Graph::new();
    // q, k, v: [S, H, T, n_seqs], or created [S, T, H, n_seqs] and permuted (non-contiguous).
    let make = |g: &mut Graph, hh: usize| -> (TensorId, TensorId) {
        if p.permuted {
            let t = g.input(DType::F32, &[s, nt, hh, ns]).unwrap();
            (t, g.permute(t, [0, 2, 1, 3]).unwrap())
        } else {
            let t = g.input(DType::F32, &[s, hh, nt, ns]).unwrap();
            (t, t)
        }
    };
    let (qi, q) = make(&mut g, hk);
    let (ki, k) = make(&mut g, hk);
    let (vi, v) = make(&mut g, hv);
    let g_ne0 = if p.kda { s } else { 1 };
    let gt = g.input(DType::F32, &[g_ne0, hv, nt, ns]).unwrap();
    let beta = g.input(DType::F32, &[1, hv, nt, ns]).unwrap();
    let state = g.input(DType::F32, &[s, s, hv, ns]).unwrap();
    let out = g.gated_delta_net(q, k, v, gt, beta, state, p.k).unwrap();
    assert_eq!(g.shape(out).unwrap(), [s * hv, nt * ns + p.k * s * ns, 1, 1]);
    // memory index of logical (i, h, t, q) in an input made by `make`
    let mem = |i: usize, h: usize, t: usize, qq: usize, hh: usize| {
        if p.permuted { ((qq * hh + h) * nt + t) * s + i } else { ((qq * nt + t) * hh + h) * s + i }
    };
    let mut qd = rand_f32(s * hk * nt * ns, seed);
    let mut kd = rand_f32(s * hk * nt * ns, seed + 1);
    // q and k are l2-normalised rows in the models (and in test-backend-ops).
    l2_rows(&mut qd, s);
    l2_rows(&mut kd, s);
    let vd = uniform(s * hv * nt * ns, seed + 2, -0.3, 5.0);
    let gd = uniform(g_ne0 * hv * nt * ns, seed + 3, -20.0, -1e-4);
    let bd = uniform(hv * nt * ns, seed + 4, 0.0, 1.0);
    let sd = rand_f32(s * s * hv * ns, seed + 5);
    let attn = s * hv * nt * ns;
    let snap = s * s * hv * ns;
    let mut want = vec![0f64; attn + p.k * snap];
    let scale = 1.0 / (s as f64).sqrt();
    for iq in 0..ns {
        for h in 0..hv {
            let pair = (iq * hv + h) * s * s;
            // m[i][j] = S[i][j] = state[j*S + i]
            let mut m = vec![vec![0f64; s]; s];
            for i in 0..s {
                for j in 0..s {
                    m[i][j] = sd[pair + j * s + i] as f64;
                }
            }
            let (hq, sq) = (h % hk, iq);
            for t in 0..nt {
                let qv: Vec<f64> = (0..s).map(|i| qd[mem(i, hq, t, sq, hk)] as f64).collect();
                let kv: Vec<f64> = (0..s).map(|i| kd[mem(i, hq, t, sq, hk)] as f64).collect();
                let vv: Vec<f64> = (0..s).map(|i| vd[mem(i, h, t, iq, hv)] as f64).collect();
                let gb = ((iq * nt + t) * hv + h) * g_ne0;
                let bv = bd[(iq * nt + t) * hv + h] as f64;
                for i in 0..s {
                    let e = (gd[gb + if p.kda { i } else { 0 }] as f64).exp();
                    for j in 0..s {
                        m[i][j] *= e;
                    }
                }
                let delta: Vec<f64> = (0..s)
                    .map(|j| (vv[j] - (0..s).map(|i| m[i][j] * kv[i]).sum::<f64>()) * bv)
                    .collect();
                for i in 0..s {
                    for j in 0..s {
                        m[i][j] += kv[i] * delta[j];
                    }
                }
                for j in 0..s {
                    want[((iq * nt + t) * hv + h) * s + j] =
                        (0..s).map(|i| m[i][j] * qv[i]).sum::<f64>() * scale;
                }
                let slot = nt - 1 - t;
                if slot < p.k {
                    for i in 0..s {
                        for j in 0..s {
                            want[attn + slot * snap + pair + j * s + i] = m[i][j];
                        }
                    }
                }
            }
        }
    }
    let datas = [
        (qi, Data::F32(qd)),
        (ki, Data::F32(kd)),
        (vi, Data::F32(vd)),
        (gt, Data::F32(gd)),
        (beta, Data::F32(bd)),
        (state, Data::F32(sd)),
    ];
    let inputs: Vec<(TensorId, &Data)> = datas.iter().map(|(id, d)| (*id, d)).collect();
    let got = if threads { run_threads(&g, &inputs, out) } else { run(&g, &inputs, out, 2) };
    check(
        &format!(
            "gated_delta_net heads {hk} S {s} tokens {nt} seqs {ns} v_repeat {} permuted {} kda {} K {}",
            p.v_repeat, p.permuted, p.kda, p.k
        ),
        &got,
        &want,
        1e-7,
    );
}

#[test]
fn gated_delta_net_matches_reference() {
    #[allow(clippy::too_many_arguments)]
    let c = |heads, s, nt, ns, v_repeat, permuted, kda, k| Gdn {
        heads,
        s,
        nt,
        ns,
        v_repeat,
        permuted,
        kda,
        k,
    };
    let cases = [
        c(32, 128, 1, 1, 1, false, false, 1),
        c(32, 16, 1, 1, 1, true, true, 1),
        c(16, 64, 1, 2, 1, false, false, 1),
        c(4, 64, 4, 2, 1, false, false, 1),
        c(8, 32, 4, 2, 2, false, false, 1),
        c(4, 64, 4, 2, 1, true, false, 1),
        c(4, 64, 4, 2, 1, false, true, 1),
        c(8, 32, 4, 2, 2, false, true, 1),
        c(4, 16, 4, 2, 1, true, true, 1),
        c(4, 64, 64, 1, 1, false, false, 1),
        c(4, 64, 33, 1, 1, false, true, 1),
        c(4, 16, 2, 1, 1, false, false, 2),
        c(4, 64, 4, 2, 1, false, false, 4),
        c(8, 32, 4, 2, 2, false, true, 4),
        c(4, 32, 8, 1, 1, false, false, 3),
        c(4, 16, 2, 1, 1, false, false, 4),
        c(3, 19, 5, 2, 2, true, true, 3),
    ];
    for (i, p) in cases.iter().enumerate() {
        gdn_case(p, 1000 + 10 * i as u64, i % 4 == 1 || i == cases.len() - 1);
    }
}

#[test]
fn gated_delta_net_rejects_bad_inputs() {
    let mut g = Graph::new();
    let qk = g.input(DType::F32, &[16, 2, 3, 1]).unwrap();
    let v = g.input(DType::F32, &[16, 4, 3, 1]).unwrap();
    let gate = g.input(DType::F32, &[1, 4, 3, 1]).unwrap();
    let gate_bad = g.input(DType::F32, &[2, 4, 3, 1]).unwrap();
    let beta = g.input(DType::F32, &[1, 4, 3, 1]).unwrap();
    let st = g.input(DType::F32, &[16, 16, 4, 1]).unwrap();
    let st_bad = g.input(DType::F32, &[16, 16, 2, 1]).unwrap();
    let q3 = g.input(DType::F32, &[16, 3, 3, 1]).unwrap();
    let q_s = g.input(DType::F32, &[8, 2, 3, 1]).unwrap();
    assert!(g.gated_delta_net(qk, qk, v, gate, beta, st, 1).is_ok());
    assert!(matches!(g.gated_delta_net(qk, qk, v, gate, beta, st, 0), Err(Error::Param { .. })));
    assert!(matches!(g.gated_delta_net(q3, q3, v, gate, beta, st, 1), Err(Error::Shape { .. })));
    assert!(matches!(g.gated_delta_net(q_s, q_s, v, gate, beta, st, 1), Err(Error::Shape { .. })));
    assert!(matches!(g.gated_delta_net(qk, q3, v, gate, beta, st, 1), Err(Error::Shape { .. })));
    assert!(matches!(
        g.gated_delta_net(qk, qk, v, gate_bad, beta, st, 1),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        g.gated_delta_net(qk, qk, v, gate, gate_bad, st, 1),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        g.gated_delta_net(qk, qk, v, gate, beta, st_bad, 1),
        Err(Error::Shape { .. })
    ));
}

// ---------------------------------------------------------------------------------------------
// lightning_indexer

fn k_bytes(dt: DType, v: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let mut b = vec![0u8; dt.row_size(v.len()).unwrap()];
    quantgraph::quant::quantize(dt, v, &mut b).unwrap();
    let mut back = vec![0f32; v.len()];
    quantgraph::quant::dequantize(dt, &b, &mut back).unwrap();
    (b, back)
}

#[allow(clippy::too_many_arguments)]
fn lightning_case(
    hsk: usize,
    nh: usize,
    kv: usize,
    nb: usize,
    ns: usize,
    nm: usize,
    tk: DType,
    threads: bool,
) {
    let mut g = Graph::new();
    let q = g.input(DType::F32, &[hsk, nh, nb, ns]).unwrap();
    let k = g.input(tk, &[hsk, 1, kv, ns]).unwrap();
    let w = g.input(DType::F32, &[nh, nb, 1, ns]).unwrap();
    let m = g.input(DType::F16, &[kv, nb, 1, nm]).unwrap();
    let out = g.lightning_indexer(q, k, w, m).unwrap();
    assert_eq!(g.shape(out).unwrap(), [kv, nb, 1, ns]);
    let seed = (hsk * 7 + nh * 5 + kv * 3 + nb + ns * 11 + nm * 13) as u64;
    let qd = rand_f32(hsk * nh * nb * ns, seed);
    let (kb, kd) = k_bytes(tk, &rand_f32(hsk * kv * ns, seed + 1));
    let wd = rand_f32(nh * nb * ns, seed + 2);
    let md: Vec<half::f16> =
        rand_f32(kv * nb * nm, seed + 3).iter().map(|&x| half::f16::from_f32(x)).collect();
    let mut want = vec![0f64; kv * nb * ns];
    for s in 0..ns {
        for t in 0..nb {
            for ik in 0..kv {
                let mut score = 0f64;
                for h in 0..nh {
                    let qo = ((s * nb + t) * nh + h) * hsk;
                    let ko = (s * kv + ik) * hsk;
                    let dot: f64 = (0..hsk).map(|i| qd[qo + i] as f64 * kd[ko + i] as f64).sum();
                    score += dot.max(0.0) * wd[(s * nb + t) * nh + h] as f64;
                }
                want[(s * nb + t) * kv + ik] = score + md[((s % nm) * nb + t) * kv + ik].to_f64();
            }
        }
    }
    let mb: Vec<u8> = md.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect();
    let datas =
        [(q, Data::F32(qd)), (k, Data::Bytes(kb)), (w, Data::F32(wd)), (m, Data::Bytes(mb))];
    let inputs: Vec<(TensorId, &Data)> = datas.iter().map(|(id, d)| (*id, d)).collect();
    let got = if threads { run_threads(&g, &inputs, out) } else { run(&g, &inputs, out, 2) };
    check(
        &format!("lightning_indexer {hsk} {nh} kv {kv} nb {nb} ns {ns} nm {nm} {tk}"),
        &got,
        &want,
        1e-6,
    );
}

#[test]
fn lightning_indexer_matches_reference_for_every_k_type() {
    let types = common::KV_TYPES;
    for (i, &tk) in types.iter().enumerate() {
        for (nh, ns, nm) in [(32usize, 1usize, 1usize), (64, 4, 4), (32, 4, 1)] {
            lightning_case(128, nh, 256, 1, ns, nm, tk, i == 1 && ns == 4);
        }
    }
    for kv in [1usize, 7, 8, 63, 64, 65] {
        lightning_case(
            128,
            64,
            kv,
            32,
            4,
            1,
            if kv % 2 == 0 { DType::Q8_0 } else { DType::F16 },
            kv == 7,
        );
    }
}

#[test]
fn lightning_indexer_rejects_bad_inputs() {
    let mut g = Graph::new();
    let q = g.input(DType::F32, &[16, 4, 3, 2]).unwrap();
    let k = g.input(DType::F16, &[16, 1, 10, 2]).unwrap();
    let w = g.input(DType::F32, &[4, 3, 1, 2]).unwrap();
    let m = g.input(DType::F16, &[10, 3, 1, 1]).unwrap();
    let m32 = g.input(DType::F32, &[10, 3, 1, 1]).unwrap();
    let m_bad = g.input(DType::F16, &[9, 3, 1, 1]).unwrap();
    let k_i32 = g.input(DType::I32, &[16, 1, 10, 2]).unwrap();
    let w_bad = g.input(DType::F32, &[5, 3, 1, 2]).unwrap();
    let k2 = g.input(DType::F16, &[16, 2, 10, 2]).unwrap();
    assert!(g.lightning_indexer(q, k, w, m).is_ok());
    assert!(matches!(g.lightning_indexer(q, k, w, m32), Err(Error::Type { .. })));
    assert!(matches!(g.lightning_indexer(q, k, w, m_bad), Err(Error::Shape { .. })));
    assert!(matches!(g.lightning_indexer(q, k_i32, w, m), Err(Error::Type { .. })));
    assert!(matches!(g.lightning_indexer(q, k, w_bad, m), Err(Error::Shape { .. })));
    assert!(matches!(g.lightning_indexer(q, k2, w, m), Err(Error::Shape { .. })));
}

// ---------------------------------------------------------------------------------------------
// DeepSeek-V4 hyper-connections

#[test]
fn dsv4_hc_comb_matches_reference() {
    const HC: usize = 4;
    for (n_tokens, n_iter) in [(1usize, 1i32), (17, 4), (257, 8), (17, 20)] {
        let eps = 1e-6f32;
        let mut g = Graph::new();
        let mixes = g.input(DType::F32, &[24, n_tokens]).unwrap();
        let scale = g.input(DType::F32, &[3]).unwrap();
        let base = g.input(DType::F32, &[24]).unwrap();
        let out = g.dsv4_hc_comb(mixes, scale, base, eps, n_iter).unwrap();
        assert_eq!(g.shape(out).unwrap(), [4, 4, n_tokens, 1]);
        let md = uniform(24 * n_tokens, n_tokens as u64, -2.0, 2.0);
        let sd = uniform(3, 2, -0.5, 0.5);
        let bd = uniform(24, 3, -0.25, 0.25);
        let e = eps as f64;
        let mut want = vec![0f64; 16 * n_tokens];
        for t in 0..n_tokens {
            let mut c = [[0f64; HC]; HC]; // c[s][d]
            for s in 0..HC {
                let l: Vec<f64> = (0..HC)
                    .map(|d| {
                        md[t * 24 + 8 + d + HC * s] as f64 * sd[2] as f64
                            + bd[8 + d + HC * s] as f64
                    })
                    .collect();
                let mx = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = l.iter().map(|v| (v - mx).exp()).sum();
                for d in 0..HC {
                    c[s][d] = (l[d] - mx).exp() / z + e;
                }
            }
            let cols = |c: &mut [[f64; HC]; HC]| {
                for d in 0..HC {
                    let sum: f64 = e + (0..HC).map(|s| c[s][d]).sum::<f64>();
                    for s in 0..HC {
                        c[s][d] /= sum;
                    }
                }
            };
            let rows = |c: &mut [[f64; HC]; HC]| {
                for s in 0..HC {
                    let sum: f64 = e + c[s].iter().sum::<f64>();
                    for d in 0..HC {
                        c[s][d] /= sum;
                    }
                }
            };
            cols(&mut c);
            for _ in 1..n_iter {
                rows(&mut c);
                cols(&mut c);
            }
            for s in 0..HC {
                for d in 0..HC {
                    want[t * 16 + s * HC + d] = c[s][d];
                }
            }
        }
        let datas = [(mixes, Data::F32(md)), (scale, Data::F32(sd)), (base, Data::F32(bd))];
        let inputs: Vec<(TensorId, &Data)> = datas.iter().map(|(id, d)| (*id, d)).collect();
        let got = run_threads(&g, &inputs, out);
        check(&format!("dsv4_hc_comb tokens {n_tokens} n_iter {n_iter}"), &got, &want, 1e-7);
    }
}

#[test]
fn dsv4_hc_pre_and_post_match_reference() {
    const HC: usize = 4;
    for (n_embd, nt) in [(1usize, 1usize), (31, 17), (128, 257), (4096, 21)] {
        let mut g = Graph::new();
        let x3 = g.input(DType::F32, &[n_embd, HC, nt]).unwrap();
        let w = g.input(DType::F32, &[HC, nt]).unwrap();
        let pre = g.dsv4_hc_pre(x3, w).unwrap();
        let x2 = g.input(DType::F32, &[n_embd, nt]).unwrap();
        let post = g.input(DType::F32, &[HC, nt]).unwrap();
        let comb = g.input(DType::F32, &[HC, HC, nt]).unwrap();
        let postmix = g.dsv4_hc_post(x2, x3, post, Some(comb)).unwrap();
        let xd = rand_f32(n_embd * HC * nt, 1);
        let wd = uniform(HC * nt, 2, 0.0, 1.0);
        let x2d = rand_f32(n_embd * nt, 3);
        let pd = uniform(HC * nt, 4, 0.0, 2.0);
        let cd = uniform(HC * HC * nt, 5, 0.0, 1.0);
        let mut want_pre = vec![0f64; n_embd * nt];
        let mut want_post = vec![0f64; n_embd * HC * nt];
        for t in 0..nt {
            for i in 0..n_embd {
                want_pre[t * n_embd + i] = (0..HC)
                    .map(|h| xd[(t * HC + h) * n_embd + i] as f64 * wd[t * HC + h] as f64)
                    .sum();
                for d in 0..HC {
                    let mut sum = x2d[t * n_embd + i] as f64 * pd[t * HC + d] as f64;
                    for s in 0..HC {
                        sum +=
                            xd[(t * HC + s) * n_embd + i] as f64 * cd[(t * HC + s) * HC + d] as f64;
                    }
                    want_post[(t * HC + d) * n_embd + i] = sum;
                }
            }
        }
        let datas = [
            (x3, Data::F32(xd)),
            (w, Data::F32(wd)),
            (x2, Data::F32(x2d)),
            (post, Data::F32(pd)),
            (comb, Data::F32(cd)),
        ];
        let inputs: Vec<(TensorId, &Data)> = datas.iter().map(|(id, d)| (*id, d)).collect();
        let got = run_threads(&g, &inputs[..2], pre);
        check(&format!("dsv4_hc_pre {n_embd} {nt}"), &got, &want_pre, 1e-7);
        let post_inputs: Vec<(TensorId, &Data)> =
            inputs.iter().copied().filter(|(id, _)| *id != w).collect();
        let got = run_threads(&g, &post_inputs, postmix);
        check(&format!("dsv4_hc_post {n_embd} {nt}"), &got, &want_post, 1e-7);
    }
}

#[test]
fn dsv4_hc_pre_gated_and_identity_post_match_reference() {
    const HC: usize = 4;
    for (n_embd, nt) in [(1usize, 1usize), (33, 7), (256, 19)] {
        let mut g = Graph::new();
        let x3 = g.input(DType::F32, &[n_embd, HC, nt]).unwrap();
        // The gate is read through a permuted view: [n_embd, nt, HC] stored, [n_embd, HC, nt]
        // seen, so its strides are not the contiguous ones.
        let gate_st = g.input(DType::F32, &[n_embd, nt, HC]).unwrap();
        let gate = g.permute(gate_st, [0, 2, 1, 3]).unwrap();
        let scale = 0.75f32;
        let pre = g.dsv4_hc_pre_gated(x3, gate, scale).unwrap();
        let x2 = g.input(DType::F32, &[n_embd, nt]).unwrap();
        let post = g.input(DType::F32, &[HC, nt]).unwrap();
        let postmix = g.dsv4_hc_post(x2, x3, post, None).unwrap();
        let xd = rand_f32(n_embd * HC * nt, 11);
        let gd = rand_f32(n_embd * HC * nt, 12);
        let x2d = rand_f32(n_embd * nt, 13);
        let pd = uniform(HC * nt, 14, 0.0, 2.0);
        let mut want_pre = vec![0f64; n_embd * nt];
        let mut want_post = vec![0f64; n_embd * HC * nt];
        for t in 0..nt {
            for i in 0..n_embd {
                let mut sum = 0f64;
                for h in 0..HC {
                    let gv = gd[(h * nt + t) * n_embd + i] as f64;
                    sum += xd[(t * HC + h) * n_embd + i] as f64 / (1.0 + (-gv).exp());
                }
                want_pre[t * n_embd + i] = scale as f64 * sum;
                for d in 0..HC {
                    want_post[(t * HC + d) * n_embd + i] = x2d[t * n_embd + i] as f64
                        * pd[t * HC + d] as f64
                        + xd[(t * HC + d) * n_embd + i] as f64;
                }
            }
        }
        let datas = [
            (x3, Data::F32(xd)),
            (gate_st, Data::F32(gd)),
            (x2, Data::F32(x2d)),
            (post, Data::F32(pd)),
        ];
        let inputs: Vec<(TensorId, &Data)> = datas.iter().map(|(id, d)| (*id, d)).collect();
        let got = run_threads(&g, &inputs[..2], pre);
        check(&format!("dsv4_hc_pre_gated {n_embd} {nt}"), &got, &want_pre, 1e-7);
        let post_inputs: Vec<(TensorId, &Data)> =
            inputs.iter().copied().filter(|(id, _)| *id != gate_st).collect();
        let got = run_threads(&g, &post_inputs, postmix);
        check(&format!("dsv4_hc_post identity {n_embd} {nt}"), &got, &want_post, 1e-7);
    }
    let mut g = Graph::new();
    let x3 = g.input(DType::F32, &[8, 4, 5]).unwrap();
    let gate_bad = g.input(DType::F32, &[8, 4, 6]).unwrap();
    let gate16 = g.input(DType::F16, &[8, 4, 5]).unwrap();
    assert!(matches!(g.dsv4_hc_pre_gated(x3, gate_bad, 1.0), Err(Error::Shape { .. })));
    assert!(matches!(g.dsv4_hc_pre_gated(x3, gate16, 1.0), Err(Error::Type { .. })));
    assert!(matches!(g.dsv4_hc_pre_gated(x3, x3, f32::NAN), Err(Error::Param { .. })));
}

#[test]
fn dsv4_ops_reject_bad_inputs() {
    let mut g = Graph::new();
    let mixes = g.input(DType::F32, &[24, 5]).unwrap();
    let mixes_hc3 = g.input(DType::F32, &[15, 5]).unwrap();
    let scale = g.input(DType::F32, &[3]).unwrap();
    let scale2 = g.input(DType::F32, &[2]).unwrap();
    let base = g.input(DType::F32, &[24]).unwrap();
    assert!(g.dsv4_hc_comb(mixes, scale, base, 1e-6, 2).is_ok());
    assert!(matches!(g.dsv4_hc_comb(mixes, scale, base, 1e-6, 0), Err(Error::Param { .. })));
    assert!(matches!(g.dsv4_hc_comb(mixes_hc3, scale, base, 1e-6, 1), Err(Error::Shape { .. })));
    assert!(matches!(g.dsv4_hc_comb(mixes, scale2, base, 1e-6, 1), Err(Error::Shape { .. })));
    let x3 = g.input(DType::F32, &[8, 4, 5]).unwrap();
    let w = g.input(DType::F32, &[4, 5]).unwrap();
    let w_bad = g.input(DType::F32, &[4, 6]).unwrap();
    let x16 = g.input(DType::F16, &[8, 4, 5]).unwrap();
    assert!(g.dsv4_hc_pre(x3, w).is_ok());
    assert!(matches!(g.dsv4_hc_pre(x3, w_bad), Err(Error::Shape { .. })));
    assert!(matches!(g.dsv4_hc_pre(x16, w), Err(Error::Type { .. })));
    let x2 = g.input(DType::F32, &[8, 5]).unwrap();
    let comb = g.input(DType::F32, &[4, 4, 5]).unwrap();
    let comb_bad = g.input(DType::F32, &[4, 3, 5]).unwrap();
    assert!(g.dsv4_hc_post(x2, x3, w, Some(comb)).is_ok());
    assert!(matches!(g.dsv4_hc_post(x2, x3, w, Some(comb_bad)), Err(Error::Shape { .. })));
    assert!(matches!(g.dsv4_hc_post(x2, x3, w_bad, Some(comb)), Err(Error::Shape { .. })));
}

// ---------------------------------------------------------------------------------------------
// A Mamba-2 block end to end

#[test]
fn mamba2_block_matches_f64_reference() {
    // d_model 64, d_inner 128 = 8 heads of 16, d_state 32, d_conv 4, 1 group, 12 tokens.
    let (dm, p, nh, ds, dc, nt) = (64usize, 16usize, 8usize, 32usize, 4usize, 12usize);
    let di = p * nh;
    let mut g = Graph::new();
    let xin = g.input(DType::F32, &[dm, nt]).unwrap();
    let w_x = g.input(DType::F32, &[dm, di]).unwrap();
    let w_z = g.input(DType::F32, &[dm, di]).unwrap();
    let w_b = g.input(DType::F32, &[dm, ds]).unwrap();
    let w_c = g.input(DType::F32, &[dm, ds]).unwrap();
    let w_dt = g.input(DType::F32, &[dm, nh]).unwrap();
    let conv_w = g.input(DType::F32, &[dc, di]).unwrap();
    let conv_state = g.input(DType::F32, &[dc - 1, di]).unwrap();
    let a = g.input(DType::F32, &[1, nh]).unwrap();
    let s0 = g.input(DType::F32, &[ds, p, nh, 1]).unwrap();
    let ids = g.input(DType::I32, &[1]).unwrap();
    let w_out = g.input(DType::F32, &[di, dm]).unwrap();

    let xx = g.mul_mat(w_x, xin).unwrap(); // [di, nt]
    let z = g.mul_mat(w_z, xin).unwrap();
    let xt = g.transpose(xx).unwrap();
    let xt = g.cont(xt).unwrap(); // [nt, di]
    let sx = g.concat(conv_state, xt, 0).unwrap(); // [dc - 1 + nt, di]
    let sx = g.reshape(sx, &[dc - 1 + nt, di, 1]).unwrap();
    let conv = g.ssm_conv(sx, conv_w).unwrap(); // [di, nt, 1]
    let conv = g.silu(conv).unwrap();
    let xs = g.reshape(conv, &[p, nh, nt, 1]).unwrap();
    let b = g.mul_mat(w_b, xin).unwrap();
    let b = g.reshape(b, &[ds, 1, nt, 1]).unwrap();
    let c = g.mul_mat(w_c, xin).unwrap();
    let c = g.reshape(c, &[ds, 1, nt, 1]).unwrap();
    let dt = g.mul_mat(w_dt, xin).unwrap();
    let dt = g.reshape(dt, &[nh, nt, 1]).unwrap();
    let scan = g.ssm_scan(s0, xs, dt, a, b, c, ids, 1).unwrap();
    let y = g.view_1d(scan, di * nt, 0).unwrap();
    let y = g.reshape(y, &[di, nt]).unwrap();
    let zs = g.silu(z).unwrap();
    let y = g.mul(y, zs).unwrap();
    let out = g.mul_mat(w_out, y).unwrap(); // [dm, nt]

    let sc = |n: usize, seed: u64, s: f32| -> Vec<f32> {
        rand_f32(n, seed).iter().map(|v| v * s).collect()
    };
    let d_xin = rand_f32(dm * nt, 1);
    let d_wx = sc(dm * di, 2, 0.2);
    let d_wz = sc(dm * di, 3, 0.2);
    let d_wb = sc(dm * ds, 4, 0.2);
    let d_wc = sc(dm * ds, 5, 0.2);
    let d_wdt = sc(dm * nh, 6, 0.2);
    let d_cw = sc(dc * di, 7, 0.5);
    let d_cs = rand_f32((dc - 1) * di, 8);
    let d_a = uniform(nh, 9, -1.0, -0.5);
    let d_s0 = sc(ds * p * nh, 10, 0.5);
    let d_wo = sc(di * dm, 11, 0.1);

    // f64 reference of the whole block
    let mm = |w: &[f32], k: usize, m: usize| -> Vec<f64> {
        let mut r = vec![0f64; m * nt];
        for t in 0..nt {
            for i in 0..m {
                r[t * m + i] = (0..k).map(|j| w[i * k + j] as f64 * d_xin[t * k + j] as f64).sum();
            }
        }
        r
    };
    let silu = |v: f64| v / (1.0 + (-v).exp());
    let (rx, rz, rb, rc, rdt) = (
        mm(&d_wx, dm, di),
        mm(&d_wz, dm, di),
        mm(&d_wb, dm, ds),
        mm(&d_wc, dm, ds),
        mm(&d_wdt, dm, nh),
    );
    let mut xconv = vec![0f64; di * nt];
    for t in 0..nt {
        for i in 0..di {
            let mut sum = 0f64;
            for kk in 0..dc {
                let pos = t + kk; // position in [conv_state | x]
                let v = if pos < dc - 1 {
                    d_cs[i * (dc - 1) + pos] as f64
                } else {
                    rx[(pos - (dc - 1)) * di + i]
                };
                sum += v * d_cw[i * dc + kk] as f64;
            }
            xconv[t * di + i] = silu(sum);
        }
    }
    let mut st = f64s(&d_s0);
    let mut y = vec![0f64; di * nt];
    for t in 0..nt {
        for h in 0..nh {
            let dtv = rdt[t * nh + h];
            let sp = if dtv > 20.0 { dtv } else { (1.0 + dtv.exp()).ln() };
            let da = (sp * d_a[h] as f64).exp();
            for i1 in 0..p {
                let xdt = xconv[t * di + h * p + i1] * sp;
                let mut sum = 0f64;
                for i0 in 0..ds {
                    let idx = (h * p + i1) * ds + i0;
                    st[idx] = st[idx] * da + rb[t * ds + i0] * xdt;
                    sum += st[idx] * rc[t * ds + i0];
                }
                y[t * di + h * p + i1] = sum * silu(rz[t * di + h * p + i1]);
            }
        }
    }
    let mut want = vec![0f64; dm * nt];
    for t in 0..nt {
        for i in 0..dm {
            want[t * dm + i] = (0..di).map(|j| d_wo[i * di + j] as f64 * y[t * di + j]).sum();
        }
    }
    let datas = [
        (xin, Data::F32(d_xin.clone())),
        (w_x, Data::F32(d_wx)),
        (w_z, Data::F32(d_wz)),
        (w_b, Data::F32(d_wb)),
        (w_c, Data::F32(d_wc)),
        (w_dt, Data::F32(d_wdt)),
        (conv_w, Data::F32(d_cw)),
        (conv_state, Data::F32(d_cs)),
        (a, Data::F32(d_a)),
        (s0, Data::F32(d_s0)),
        (ids, Data::I32(vec![0])),
        (w_out, Data::F32(d_wo)),
    ];
    let inputs: Vec<(TensorId, &Data)> = datas.iter().map(|(id, d)| (*id, d)).collect();
    let got = run_threads(&g, &inputs, out);
    check("mamba2 block", &got, &want, 1e-6);
}
