//! Copies between every convertible type, set_rows into a KV-cache-like state buffer.

mod common;

use common::{each, nmse};
use quantgraph::testdata::rand_f32;
use quantgraph::{Buffer, CpuBackend, DType, Error, Graph, Plan};

/// F32 -> T -> F32 through graph copies equals quantize/dequantize through the quant API
/// (the CPU from_float for vec-dot types, the reference quantizer otherwise).
#[test]
fn cast_to_and_from_every_quantizable_type_matches_the_quant_api() {
    let n = 256usize;
    let rows = 3usize;
    let x: Vec<f32> = rand_f32(n * rows, 41).iter().map(|v| v * 3.0).collect();
    for t in DType::ALL {
        let mut g = Graph::new();
        let a = g.input(DType::F32, &[n, rows]).unwrap();
        let q = match g.cast(a, t) {
            Ok(q) => q,
            Err(e) => {
                // Types without a non-imatrix quantizer or a dequantizer are refused clearly.
                assert!(
                    t.is_integer() && t != DType::I32
                        || t == DType::F64
                        || t == DType::Q8_1
                        || t == DType::Q8_K
                        || matches!(t, DType::IQ2_XXS | DType::IQ2_XS | DType::IQ1_S),
                    "{t}: {e}"
                );
                continue;
            }
        };
        let back = match g.cast(q, DType::F32) {
            Ok(b) => b,
            Err(e) => {
                assert_eq!(t, DType::Q8_1, "only q8_1 has no f32 conversion in ggml: {e}");
                continue;
            }
        };
        g.set_output(back).unwrap();
        let mut p = Plan::with_guards(g, &CpuBackend::with_threads(2).unwrap(), 64).unwrap();
        p.set_input(a, &x).unwrap();
        p.compute().unwrap();
        let got = p.output::<f32>(back).unwrap().to_vec();
        let mut want = vec![0f32; n * rows];
        if t == DType::I32 {
            want = x.iter().map(|&v| v as i32 as f32).collect();
        } else {
            let mut bytes = vec![0u8; t.row_size(n * rows).unwrap()];
            if quantgraph::quant::quantize_for_dot(t, &x, &mut bytes).is_err() {
                quantgraph::quant::quantize(t, &x, &mut bytes).unwrap();
            }
            quantgraph::quant::dequantize(t, &bytes, &mut want).unwrap();
        }
        if t == DType::IQ4_NL {
            // ggml's CPU converter for IQ4_NL differs from its reference quantizer; both are close.
            let w64: Vec<f64> = want.iter().map(|&v| v as f64).collect();
            assert!(nmse(&got, &w64) < 1e-4, "{t}");
        } else {
            assert_eq!(got, want, "{t}");
        }
    }
}

#[test]
fn bf16_and_i32_copies_with_permuted_layouts() {
    let mut g = Graph::new();
    let a = g.input(DType::F32, &[4, 3, 2]).unwrap();
    let p = g.permute(a, [1, 0, 2, 3]).unwrap();
    let b = g.cast(p, DType::BF16).unwrap();
    let c = g.cast(b, DType::F32).unwrap();
    let i = g.cast(c, DType::I32).unwrap();
    g.set_output(c).unwrap();
    g.set_output(i).unwrap();
    let x: Vec<f32> = (0..24).map(|v| v as f32 * 1.25 - 7.0).collect();
    let mut plan = Plan::with_guards(g, &CpuBackend::with_threads(3).unwrap(), 64).unwrap();
    plan.set_input(a, &x).unwrap();
    plan.compute().unwrap();
    let got = plan.output::<f32>(c).unwrap().to_vec();
    let ints = plan.output::<i32>(i).unwrap().to_vec();
    for j in 0..24 {
        let (i0, i1, i2) = (j % 3, (j / 3) % 4, j / 12);
        let v = x[i2 * 12 + i0 * 4 + i1];
        assert_eq!(got[j], half::bf16::from_f32(v).to_f32(), "{j}");
        assert_eq!(ints[j], got[j] as i32);
    }
}

#[test]
fn set_rows_writes_a_kv_cache_and_checks_ids() {
    for (cache_t, id_t) in
        [(DType::F16, DType::I64), (DType::Q8_0, DType::I32), (DType::F32, DType::I32)]
    {
        let (n, slots) = (64usize, 8usize);
        let cache = Buffer::alloc(cache_t.row_size(n).unwrap() * slots).unwrap();
        let x = rand_f32(n * 3, 42);
        let mut g = Graph::new();
        let kv = g.state(cache_t, &[n, slots], &cache, 0).unwrap();
        let b = g.input(DType::F32, &[n, 3]).unwrap();
        let ids = g.input(id_t, &[3]).unwrap();
        let w = g.set_rows(kv, b, ids).unwrap();
        let _ = w;
        let all = g.cast(kv, DType::F32).unwrap();
        g.set_output(all).unwrap();
        let mut p = Plan::with_guards(g, &CpuBackend::with_threads(2).unwrap(), 64).unwrap();
        p.set_input(b, &x).unwrap();
        if id_t == DType::I64 {
            p.set_input(ids, &[5i64, 1, 5]).unwrap();
        } else {
            p.set_input(ids, &[5i32, 1, 5]).unwrap();
        }
        p.compute().unwrap();
        let got = p.output::<f32>(all).unwrap().to_vec();
        let conv = |row: &[f32]| -> Vec<f32> {
            let mut bytes = vec![0u8; cache_t.row_size(n).unwrap()];
            quantgraph::quant::quantize_for_dot(cache_t, row, &mut bytes).unwrap();
            let mut out = vec![0f32; n];
            quantgraph::quant::dequantize(cache_t, &bytes, &mut out).unwrap();
            out
        };
        assert_eq!(&got[n..2 * n], &conv(&x[n..2 * n])[..], "{cache_t} row 1");
        assert_eq!(
            &got[5 * n..6 * n],
            &conv(&x[2 * n..3 * n])[..],
            "{cache_t}: last repeated id wins"
        );
        assert!(got[..n].iter().all(|&v| v == 0.0), "{cache_t}: untouched rows stay zero");
        // Out of range: Err, plan usable.
        if id_t == DType::I64 {
            p.set_input(ids, &[8i64, 0, 1]).unwrap();
        } else {
            p.set_input(ids, &[8i32, 0, 1]).unwrap();
        }
        assert!(matches!(p.compute(), Err(Error::IndexOutOfRange { index: 8, limit: 8, .. })));
    }
    // Bad shapes at build time.
    let mut g = Graph::new();
    let a = g.input(DType::F16, &[8, 4]).unwrap();
    let b = g.input(DType::F32, &[7, 2]).unwrap();
    let ids = g.input(DType::I32, &[2]).unwrap();
    assert!(g.set_rows(a, b, ids).is_err());
    let b = g.input(DType::F32, &[8, 2]).unwrap();
    let fids = g.input(DType::F32, &[2]).unwrap();
    assert!(g.set_rows(a, b, fids).is_err());
    assert!(g.set_rows(a, b, ids).is_ok());
}

fn at(v: &[f32], ne: [usize; 4], i: [usize; 4]) -> f32 {
    v[((i[3] * ne[2] + i[2]) * ne[1] + i[1]) * ne[0] + i[0]]
}

fn run(
    g: Graph,
    ins: &[(quantgraph::TensorId, Vec<f32>)],
    out: quantgraph::TensorId,
    nth: usize,
) -> Vec<f32> {
    let mut p = Plan::with_guards(g, &CpuBackend::with_threads(nth).unwrap(), 64).unwrap();
    for (id, v) in ins {
        p.set_input(*id, v).unwrap();
    }
    p.compute().unwrap();
    p.check_guards().unwrap();
    p.output::<f32>(out).unwrap().to_vec()
}

#[test]
fn concat_repeat_pad_roll_match_index_references() {
    let ne = [5usize, 7, 3, 2];
    let x = rand_f32(ne.iter().product(), 51);
    for dim in 0..4 {
        let mut nb = ne;
        nb[dim] = 2;
        let y = rand_f32(nb.iter().product(), 52 + dim as u64);
        let mut g = Graph::new();
        let a = g.input(DType::F32, &ne).unwrap();
        let b = g.input(DType::F32, &nb).unwrap();
        let c = g.concat(a, b, dim).unwrap();
        g.set_output(c).unwrap();
        let got = run(g, &[(a, x.clone()), (b, y.clone())], c, 3);
        let mut one = ne;
        one[dim] += 2;
        let want: Vec<f32> = each(one)
            .map(|i| {
                if i[dim] < ne[dim] {
                    at(&x, ne, i)
                } else {
                    let mut j = i;
                    j[dim] -= ne[dim];
                    at(&y, nb, j)
                }
            })
            .collect();
        assert_eq!(got, want, "concat dim {dim}");
    }
    // repeat of a permuted view, repeat_back sums the tiles back.
    let mut g = Graph::new();
    let a = g.input(DType::F32, &[3, 2]).unwrap();
    let t = g.transpose(a).unwrap(); // [2, 3]
    let r = g.repeat(t, [4, 3, 2, 1]).unwrap();
    let rb = g.repeat_back(r, t).unwrap();
    g.set_output(r).unwrap();
    g.set_output(rb).unwrap();
    let xa: Vec<f32> = (0..6).map(|v| v as f32).collect();
    let mut p = Plan::with_guards(g, &CpuBackend::with_threads(2).unwrap(), 64).unwrap();
    p.set_input(a, &xa).unwrap();
    p.compute().unwrap();
    let want: Vec<f32> =
        each([4, 3, 2, 1]).map(|i| at(&xa, [3, 2, 1, 1], [i[1], i[0] % 2, 0, 0])).collect();
    assert_eq!(p.output::<f32>(r).unwrap(), &want[..]);
    let back: Vec<f32> =
        each([2, 3, 1, 1]).map(|i| 4.0 * at(&xa, [3, 2, 1, 1], [i[1], i[0], 0, 0])).collect();
    assert_eq!(p.output::<f32>(rb).unwrap(), &back[..]);

    // zero pad, circular pad, reflect pad, roll.
    let ne = [4usize, 3, 2, 1];
    let x = rand_f32(24, 53);
    let mut g = Graph::new();
    let a = g.input(DType::F32, &ne).unwrap();
    let pz = g.pad_ext(a, [1, 0, 2, 0], [2, 1, 0, 1], false).unwrap();
    let pc = g.pad_ext(a, [2, 1, 0, 0], [3, 2, 1, 0], true).unwrap();
    let pr = g.pad_reflect_1d(a, 3, 2).unwrap();
    let ro = g.roll(a, [1, -2, 1, 0]).unwrap();
    for t in [pz, pc, pr, ro] {
        g.set_output(t).unwrap();
    }
    let mut p = Plan::with_guards(g, &CpuBackend::with_threads(2).unwrap(), 64).unwrap();
    p.set_input(a, &x).unwrap();
    p.compute().unwrap();
    let wz: Vec<f32> = each([7, 4, 4, 2])
        .map(|i| {
            let (lp, inb) = ([1, 0, 2, 0], |k: usize, v: usize| {
                v >= [1, 0, 2, 0][k] && v - [1, 0, 2, 0][k] < ne[k]
            });
            if (0..4).all(|k| inb(k, i[k])) {
                at(&x, ne, [i[0] - lp[0], i[1] - lp[1], i[2] - lp[2], i[3] - lp[3]])
            } else {
                0.0
            }
        })
        .collect();
    assert_eq!(p.output::<f32>(pz).unwrap(), &wz[..], "zero pad");
    let wc: Vec<f32> = each([9, 6, 3, 1])
        .map(|i| {
            let lp = [2i64, 1, 0, 0];
            let j: Vec<usize> =
                (0..4).map(|k| (i[k] as i64 - lp[k]).rem_euclid(ne[k] as i64) as usize).collect();
            at(&x, ne, [j[0], j[1], j[2], j[3]])
        })
        .collect();
    assert_eq!(p.output::<f32>(pc).unwrap(), &wc[..], "circular pad");
    let wr: Vec<f32> = each([9, 3, 2, 1])
        .map(|i| {
            let mut v = i[0] as i64 - 3;
            v = v.abs();
            if v >= 4 {
                v = 6 - v;
            }
            at(&x, ne, [v as usize, i[1], i[2], i[3]])
        })
        .collect();
    assert_eq!(p.output::<f32>(pr).unwrap(), &wr[..], "reflect pad");
    let wo: Vec<f32> = each(ne)
        .map(|i| {
            let s = [1i64, -2, 1, 0];
            let j: Vec<usize> =
                (0..4).map(|k| (i[k] as i64 - s[k]).rem_euclid(ne[k] as i64) as usize).collect();
            at(&x, ne, [j[0], j[1], j[2], j[3]])
        })
        .collect();
    assert_eq!(p.output::<f32>(ro).unwrap(), &wo[..], "roll");
}

#[test]
fn arange_and_timestep_embedding() {
    let mut g = Graph::new();
    let r = g.arange(1.0, 4.0, 0.5).unwrap();
    let t = g.input(DType::F32, &[3]).unwrap();
    let e = g.timestep_embedding(t, 7, 10000).unwrap();
    g.set_output(r).unwrap();
    g.set_output(e).unwrap();
    let mut p = Plan::with_guards(g, &CpuBackend::with_threads(2).unwrap(), 64).unwrap();
    p.set_input(t, &[0.0f32, 1.0, 250.0]).unwrap();
    p.compute().unwrap();
    assert_eq!(p.output::<f32>(r).unwrap(), &[1.0, 1.5, 2.0, 2.5, 3.0, 3.5]);
    let got = p.output::<f32>(e).unwrap().to_vec();
    let mut want = Vec::new();
    for ts in [0.0f64, 1.0, 250.0] {
        let mut row = vec![0f64; 7];
        for j in 0..3 {
            let f = (-(10000f64).ln() * j as f64 / 3.0).exp();
            row[j] = (ts * f).cos();
            row[j + 3] = (ts * f).sin();
        }
        want.extend(row);
    }
    assert!(nmse(&got, &want) < 1e-7);
    let mut g = Graph::new();
    assert!(g.arange(2.0, 1.0, 1.0).is_err());
    let a = g.input(DType::F32, &[4, 3]).unwrap();
    let b = g.input(DType::F32, &[4, 2]).unwrap();
    assert!(g.concat(a, b, 0).is_err(), "dim 1 differs");
    assert!(g.concat(a, b, 1).is_ok());
    assert!(g.roll(a, [4, 0, 0, 0]).is_err());
    assert!(g.pad_reflect_1d(a, 4, 0).is_err());
    assert!(g.repeat(a, [6, 3, 1, 1]).is_err());
}

#[test]
fn custom_ops_run_closures_and_survive_panics() {
    use quantgraph::CustomArgs;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let fail = Arc::new(AtomicBool::new(false));
    let f2 = fail.clone();
    let body: quantgraph::CustomFn = Arc::new(move |a: CustomArgs<'_>| {
        if f2.load(Ordering::Relaxed) && a.ith == 0 {
            panic!("boom in worker {}", a.ith);
        }
        let ne0 = a.dst_shape[0];
        for (k, r) in a.rows.clone().enumerate() {
            for i in 0..ne0 {
                a.dst[k * ne0 + i] = a.srcs[0][r * ne0 + i] * 2.0 + a.srcs[1][i];
            }
        }
        Ok(())
    });
    let errs: quantgraph::CustomFn = Arc::new(|_a: CustomArgs<'_>| Err("refused".to_string()));
    for n_tasks in [None, Some(1)] {
        let mut g = Graph::new();
        let x = g.input(DType::F32, &[5, 4]).unwrap();
        let b = g.input(DType::F32, &[5]).unwrap();
        let y = g.map_custom2(x, b, "twice_plus", n_tasks, body.clone()).unwrap();
        g.set_output(y).unwrap();
        let mut p = Plan::with_guards(g, &CpuBackend::with_threads(3).unwrap(), 64).unwrap();
        let xv = rand_f32(20, 61);
        let bv = rand_f32(5, 62);
        p.set_input(x, &xv).unwrap();
        p.set_input(b, &bv).unwrap();
        p.compute().unwrap();
        let want: Vec<f32> = (0..20).map(|k| xv[k] * 2.0 + bv[k % 5]).collect();
        assert_eq!(p.output::<f32>(y).unwrap(), &want[..]);
        fail.store(true, Ordering::Relaxed);
        let e = p.compute().unwrap_err();
        assert!(matches!(e, Error::Panicked { .. }) && e.to_string().contains("boom"), "{e}");
        fail.store(false, Ordering::Relaxed);
        p.compute().unwrap();
        assert_eq!(p.output::<f32>(y).unwrap(), &want[..]);
    }
    let mut g = Graph::new();
    let x = g.input(DType::F32, &[5, 4]).unwrap();
    let y = g.map_custom1(x, "refuser", None, errs).unwrap();
    g.set_output(y).unwrap();
    let mut p = Plan::with_guards(g, &CpuBackend::with_threads(2).unwrap(), 64).unwrap();
    p.set_input(x, &[0.0f32; 20]).unwrap();
    assert!(p.compute().unwrap_err().to_string().contains("refused"));
    custom_sources_must_be_f32().unwrap();
}

fn custom_sources_must_be_f32() -> Result<(), Error> {
    let mut g = Graph::new();
    let x = g.input(DType::I32, &[4])?;
    let body: quantgraph::CustomFn = std::sync::Arc::new(|_a| Ok(()));
    assert!(g.map_custom1(x, "ints", None, body).is_err(), "custom sources must be F32");
    Ok(())
}

#[test]
fn interpolate_nearest_bilinear_bicubic_antialias() {
    use quantgraph::ScaleMode;
    let ine = [5usize, 4, 2, 1];
    let x = rand_f32(ine.iter().product(), 81);
    let px = |xx: i64, yy: i64, c: usize| -> f64 {
        let xx = xx.clamp(0, 4) as usize;
        let yy = yy.clamp(0, 3) as usize;
        x[(c * 4 + yy) * 5 + xx] as f64
    };
    let cases: [(ScaleMode, [usize; 4]); 6] = [
        (ScaleMode::Nearest, [10, 8, 2, 1]),
        (ScaleMode::Bilinear { align_corners: false, antialias: false }, [9, 7, 2, 1]),
        (ScaleMode::Bilinear { align_corners: true, antialias: false }, [9, 7, 2, 1]),
        (ScaleMode::Bicubic { align_corners: false }, [11, 6, 2, 1]),
        (ScaleMode::Bicubic { align_corners: true }, [11, 6, 2, 1]),
        (ScaleMode::Bilinear { align_corners: false, antialias: true }, [3, 2, 2, 1]),
    ];
    for (mode, one) in cases {
        let mut g = Graph::new();
        let a = g.input(DType::F32, &ine).unwrap();
        let y = g.interpolate(a, one, mode).unwrap();
        g.set_output(y).unwrap();
        let got = run(g, &[(a, x.clone())], y, 2);
        let (sx, sy) = (one[0] as f64 / 5.0, one[1] as f64 / 4.0);
        let want: Vec<f64> = each(one)
            .map(|i| {
                let c = i[2];
                let (fx, fy) = (i[0] as f64, i[1] as f64);
                match mode {
                    ScaleMode::Nearest => px((fx / sx).floor() as i64, (fy / sy).floor() as i64, c),
                    ScaleMode::Bilinear { align_corners, antialias: false } => {
                        let (srcx, srcy) = if align_corners {
                            (fx * 4.0 / (one[0] - 1) as f64, fy * 3.0 / (one[1] - 1) as f64)
                        } else {
                            (((fx + 0.5) / sx - 0.5).max(0.0), ((fy + 0.5) / sy - 0.5).max(0.0))
                        };
                        let (x0, y0) = (srcx.floor(), srcy.floor());
                        let (dx, dy) = (srcx - x0, srcy - y0);
                        let (x0, y0) = (x0 as i64, y0 as i64);
                        px(x0, y0, c) * (1.0 - dx) * (1.0 - dy)
                            + px(x0 + 1, y0, c) * dx * (1.0 - dy)
                            + px(x0, y0 + 1, c) * (1.0 - dx) * dy
                            + px(x0 + 1, y0 + 1, c) * dx * dy
                    }
                    ScaleMode::Bicubic { align_corners } => {
                        let (srcx, srcy) = if align_corners {
                            (fx * 4.0 / (one[0] - 1) as f64, fy * 3.0 / (one[1] - 1) as f64)
                        } else {
                            ((fx + 0.5) / sx - 0.5, (fy + 0.5) / sy - 0.5)
                        };
                        let a = -0.75f64;
                        let k = |t: f64| {
                            let t = t.abs();
                            if t <= 1.0 {
                                (a + 2.0) * t * t * t - (a + 3.0) * t * t + 1.0
                            } else if t < 2.0 {
                                a * t * t * t - 5.0 * a * t * t + 8.0 * a * t - 4.0 * a
                            } else {
                                0.0
                            }
                        };
                        let (x0, y0) = (srcx.floor(), srcy.floor());
                        let mut v = 0.0;
                        for yo in -1..=2 {
                            for xo in -1..=2 {
                                let w = k(srcx - (x0 + xo as f64)) * k(srcy - (y0 + yo as f64));
                                v += w * px(x0 as i64 + xo, y0 as i64 + yo, c);
                            }
                        }
                        v
                    }
                    ScaleMode::Bilinear { antialias: true, .. } => {
                        // PyTorch's antialiased bilinear: triangle filter widened by 1/scale.
                        let (cx, cy) = ((fx + 0.5) / sx, (fy + 0.5) / sy);
                        let (supx, supy) = ((1.0 / sx).max(1.0), (1.0 / sy).max(1.0));
                        let (mut v, mut tw) = (0.0, 0.0);
                        for yy in 0..4i64 {
                            let wy = (1.0 - ((yy as f64 - cy + 0.5) / supy).abs()).max(0.0);
                            for xx in 0..5i64 {
                                let w = (1.0 - ((xx as f64 - cx + 0.5) / supx).abs()).max(0.0) * wy;
                                if w > 0.0 {
                                    v += w * px(xx, yy, c);
                                    tw += w;
                                }
                            }
                        }
                        v / tw
                    }
                    other => panic!("no reference for {other:?}"),
                }
            })
            .collect();
        let e = nmse(&got, &want);
        assert!(e < 1e-7, "{mode:?}: nmse {e}");
    }
    let mut g = Graph::new();
    let a = g.input(DType::F32, &ine).unwrap();
    assert!(g.upscale(a, 1, ScaleMode::Nearest).is_err());
    let h = g.cast(a, DType::F16).unwrap();
    assert!(g.upscale(h, 2, ScaleMode::Nearest).is_err(), "F32 only");
}

#[test]
fn set_writes_a_strided_view_into_a_copy() {
    let mut g = Graph::new();
    let a = g.input(DType::F32, &[6, 4]).unwrap();
    let b = g.input(DType::F32, &[2, 3]).unwrap();
    // b's 3 rows of 2 go to a's rows 1..4, columns 3..5.
    let s = g.set(a, b, [24, 72, 72], 24 + 12).unwrap();
    let s1 = g.set_1d(a, b, 4).unwrap();
    g.set_output(s).unwrap();
    g.set_output(s1).unwrap();
    let xa: Vec<f32> = (0..24).map(|v| v as f32).collect();
    let xb: Vec<f32> = (0..6).map(|v| 100.0 + v as f32).collect();
    let mut p = Plan::with_guards(g, &CpuBackend::with_threads(3).unwrap(), 64).unwrap();
    p.set_input(a, &xa).unwrap();
    p.set_input(b, &xb).unwrap();
    p.compute().unwrap();
    p.check_guards().unwrap();
    let mut want = xa.clone();
    for r in 0..3 {
        for c in 0..2 {
            want[(r + 1) * 6 + 3 + c] = xb[r * 2 + c];
        }
    }
    assert_eq!(p.output::<f32>(s).unwrap(), &want[..]);
    let mut want1 = xa.clone();
    want1[1..7].copy_from_slice(&xb);
    assert_eq!(p.output::<f32>(s1).unwrap(), &want1[..]);
    let mut g = Graph::new();
    let a = g.input(DType::F32, &[6, 4]).unwrap();
    let b = g.input(DType::F32, &[2, 3]).unwrap();
    assert!(g.set(a, b, [24, 72, 72], 24 * 3).is_err(), "past the end");
}
