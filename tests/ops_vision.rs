//! Convolution, pooling and vision ops against plain f64 references, with test-backend-ops'
//! shapes and NMSE limits, guard bytes around every tensor, and bitwise-equal results on 1, 2
//! and 3 threads; build-time errors on bad shapes and parameters; a small CNN end to end.

mod common;

use common::{each, nmse};
use half::{bf16, f16};
use quantgraph::testdata::rand_f32;
use quantgraph::{
    Conv2dParams, Conv3dParams, CpuBackend, DType, Error, Graph, Plan, PoolOp, ScaleMode, TensorId,
};

/// Input data in the tensor's type, plus the f32 values it holds (for the reference).
struct Input {
    id: TensorId,
    bytes: Vec<u8>,
    vals: Vec<f32>,
}

/// A graph input of type `dt` filled with pseudo-random values in [-1, 1).
fn input(g: &mut Graph, dt: DType, ne: [usize; 4], seed: u64) -> Input {
    let id = g.input(dt, &ne).unwrap();
    let n: usize = ne.iter().product();
    let raw = rand_f32(n, seed);
    let (bytes, vals): (Vec<u8>, Vec<f32>) = match dt {
        DType::F32 => (bytemuck::cast_slice(&raw).to_vec(), raw),
        DType::F16 => {
            let h: Vec<f16> = raw.iter().map(|&v| f16::from_f32(v)).collect();
            (bytemuck::cast_slice(&h).to_vec(), h.iter().map(|v| v.to_f32()).collect())
        }
        DType::BF16 => {
            let h: Vec<bf16> = raw.iter().map(|&v| bf16::from_f32(v)).collect();
            (bytemuck::cast_slice(&h).to_vec(), h.iter().map(|v| v.to_f32()).collect())
        }
        _ => unreachable!(),
    };
    Input { id, bytes, vals }
}

/// Element (i0, i1, i2, i3) of a contiguous tensor of shape `ne`.
fn at(v: &[f32], ne: [usize; 4], i: [usize; 4]) -> f64 {
    v[i[0] + ne[0] * (i[1] + ne[1] * (i[2] + ne[2] * i[3]))] as f64
}

/// Computes `out` on 1, 2 and 3 threads in guarded plans; checks the guards, that all three
/// results are bitwise equal, and the NMSE against `want`. Returns the 1-thread result.
fn check(
    g: &Graph,
    ins: &[&Input],
    out: TensorId,
    want: &[f64],
    limit: f64,
    what: &str,
) -> Vec<f32> {
    let mut first: Option<Vec<u32>> = None;
    let mut result = Vec::new();
    for threads in [1, 2, 3] {
        let mut g = g.clone();
        g.set_output(out).unwrap();
        let mut p = Plan::with_guards(g, &CpuBackend::with_threads(threads).unwrap(), 64).unwrap();
        for i in ins {
            p.set_input_bytes(i.id, &i.bytes).unwrap();
        }
        p.compute().unwrap();
        p.check_guards().unwrap_or_else(|e| panic!("{what}: {e}"));
        let got: Vec<f32> = match p.graph().dtype(out).unwrap() {
            DType::F32 => p.output::<f32>(out).unwrap().to_vec(),
            DType::F16 => p.output::<f16>(out).unwrap().iter().map(|v| v.to_f32()).collect(),
            DType::BF16 => p.output::<bf16>(out).unwrap().iter().map(|v| v.to_f32()).collect(),
            t => panic!("{what}: unexpected output type {t}"),
        };
        let bits: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
        match &first {
            None => {
                let e = nmse(&got, want);
                assert!(e <= limit, "{what}: nmse {e:e} > {limit:e}");
                first = Some(bits);
                result = got;
            }
            Some(f) => assert!(*f == bits, "{what}: {threads} threads differ from 1 thread"),
        }
    }
    result
}

fn conv_out(ins: usize, ks: usize, s: usize, p: usize, d: usize) -> i64 {
    (ins as i64 + 2 * p as i64 - d as i64 * (ks as i64 - 1) - 1) / s as i64 + 1
}

// ------------------------------------------------------------------------------------------------
// im2col

#[allow(clippy::too_many_arguments)]
fn im2col_case(
    tin: DType,
    tker: DType,
    tdst: DType,
    ne_in: [usize; 4],
    ne_k: [usize; 4],
    p: Conv2dParams,
    is_2d: bool,
) {
    let what = format!("im2col {tin}/{tker}->{tdst} {ne_in:?} {ne_k:?} {p:?} 2d={is_2d}");
    let mut g = Graph::new();
    let x = input(&mut g, tin, ne_in, 1);
    let k = input(&mut g, tker, ne_k, 9);
    let out = g.im2col(k.id, x.id, p, is_2d, tdst).unwrap();
    let ne = g.shape(out).unwrap();
    let mut want = vec![0f64; ne.iter().product()];
    for (j, [e, ow, oh, n]) in each(ne).enumerate() {
        let v = if is_2d {
            let (kw, kh) = (ne_k[0], ne_k[1]);
            let (c, ky, kx) = (e / (kw * kh), (e / kw) % kh, e % kw);
            let x_ = (ow * p.s0 + kx * p.d0) as i64 - p.p0 as i64;
            let y_ = (oh * p.s1 + ky * p.d1) as i64 - p.p1 as i64;
            if x_ < 0 || y_ < 0 || x_ >= ne_in[0] as i64 || y_ >= ne_in[1] as i64 {
                0.0
            } else {
                at(&x.vals, ne_in, [x_ as usize, y_ as usize, c, n])
            }
        } else {
            let kw = ne_k[0];
            let (c, kx) = (e / kw, e % kw);
            let x_ = (ow * p.s0 + kx * p.d0) as i64 - p.p0 as i64;
            if x_ < 0 || x_ >= ne_in[0] as i64 {
                0.0
            } else {
                at(&x.vals, ne_in, [x_ as usize, c, oh, 0])
            }
        };
        want[j] = if tdst == DType::F16 { f16::from_f64(v).to_f64() } else { v };
    }
    let got = check(&g, &[&x, &k], out, &want, 1e-7, &what);
    if tdst == DType::F16 || tin == DType::F32 {
        // im2col only moves (and for F16 results rounds) values: exact.
        assert!(got.iter().zip(&want).all(|(a, b)| *a as f64 == *b), "{what}: not exact");
    }
}

#[test]
fn im2col_2d_every_type_combination() {
    let p = Conv2dParams::square(1, 1, 1);
    for (tin, tdst) in
        [(DType::F32, DType::F32), (DType::F32, DType::F16), (DType::F16, DType::F16)]
    {
        for tker in [DType::F32, DType::F16] {
            im2col_case(tin, tker, tdst, [10, 10, 3, 1], [3, 3, 3, 1], p, true);
        }
        im2col_case(tin, DType::F16, tdst, [12, 12, 2, 32], [3, 3, 2, 32], p, true);
        im2col_case(
            tin,
            DType::F16,
            tdst,
            [5, 5, 1, 32],
            [3, 4, 1, 32],
            Conv2dParams::DEFAULT,
            true,
        );
        im2col_case(
            tin,
            DType::F16,
            tdst,
            [2, 2, 1536, 3],
            [2, 2, 1536, 4],
            Conv2dParams::DEFAULT,
            true,
        );
        // test-backend-ops' big kernel (33x34) on a smaller image to keep the suite fast.
        im2col_case(tin, DType::F16, tdst, [40, 40, 2, 1], [33, 34, 2, 1], p, true);
    }
}

#[test]
fn im2col_2d_strides_paddings_dilations() {
    for s0 in [1, 3] {
        for s1 in [1, 3] {
            for p0 in [0, 3] {
                for p1 in [0, 3] {
                    for d0 in [1, 3] {
                        for d1 in [1, 3] {
                            let p = Conv2dParams { s0, s1, p0, p1, d0, d1 };
                            im2col_case(
                                DType::F32,
                                DType::F32,
                                DType::F32,
                                [20, 20, 2, 2],
                                [3, 3, 2, 2],
                                p,
                                true,
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn im2col_1d() {
    for s0 in [1, 3] {
        for p0 in [0, 3] {
            for d0 in [1, 3] {
                let p = Conv2dParams { s0, p0, d0, ..Conv2dParams::DEFAULT };
                for (tin, tdst) in
                    [(DType::F32, DType::F32), (DType::F32, DType::F16), (DType::F16, DType::F16)]
                {
                    im2col_case(tin, DType::F32, tdst, [20, 2, 2, 1], [3, 2, 2, 1], p, false);
                }
            }
        }
    }
    let p = Conv2dParams { s0: 1, p0: 1, ..Conv2dParams::DEFAULT };
    im2col_case(DType::F32, DType::F16, DType::F16, [300, 16, 1, 1], [3, 16, 8, 1], p, false);
}

#[test]
fn im2col_3d_cases() {
    let run = |tdst: DType, ne_in: [usize; 4], ne_k: [usize; 4], p: Conv3dParams, view: bool| {
        let what = format!("im2col_3d {tdst} {ne_in:?} {ne_k:?} {p:?} view={view}");
        let mut g = Graph::new();
        let x = input(&mut g, DType::F32, ne_in, 2);
        let src = if view {
            let nb = g.strides(x.id).unwrap();
            g.view_4d(
                x.id,
                [ne_in[0] - 2, ne_in[1] - 2, ne_in[2] - 2, ne_in[3] - 2],
                [nb[1], nb[2], nb[3]],
                0,
            )
            .unwrap()
        } else {
            x.id
        };
        let sne = g.shape(src).unwrap();
        let k = input(&mut g, DType::F16, ne_k, 3);
        let out = g.im2col_3d(k.id, src, p, tdst).unwrap();
        let ne = g.shape(out).unwrap();
        let ic = p.c;
        let n = sne[3] / ic;
        let od = ne[3] / n;
        let (kw, kh, kd) = (ne_k[0], ne_k[1], ne_k[2]);
        let mut want = vec![0f64; ne.iter().product()];
        for (j, [e, ow, oh, q]) in each(ne).enumerate() {
            let (bn, oz) = (q / od, q % od);
            let (c, kz, ky, kx) = (e / (kw * kh * kd), (e / (kw * kh)) % kd, (e / kw) % kh, e % kw);
            let x_ = (ow * p.s[0] + kx * p.d[0]) as i64 - p.p[0] as i64;
            let y_ = (oh * p.s[1] + ky * p.d[1]) as i64 - p.p[1] as i64;
            let z_ = (oz * p.s[2] + kz * p.d[2]) as i64 - p.p[2] as i64;
            let inside = x_ >= 0
                && y_ >= 0
                && z_ >= 0
                && x_ < sne[0] as i64
                && y_ < sne[1] as i64
                && z_ < sne[2] as i64;
            // The view keeps the parent's strides: index the parent.
            let v = if inside {
                at(&x.vals, ne_in, [x_ as usize, y_ as usize, z_ as usize, bn * ic + c])
            } else {
                0.0
            };
            want[j] = if tdst == DType::F16 { f16::from_f64(v).to_f64() } else { v };
        }
        check(&g, &[&x, &k], out, &want, 1e-7, &what);
    };
    let base = Conv3dParams { s: [1; 3], p: [1; 3], d: [1; 3], c: 3, n: 0, oc: 0 };
    for tdst in [DType::F32, DType::F16] {
        run(tdst, [10, 10, 10, 9], [3, 3, 3, 1], base, false);
    }
    for (s, pd, d, ic, v) in [
        (1, 0, 1, 1, false),
        (3, 3, 1, 1, true),
        (1, 3, 3, 1, true),
        (3, 0, 3, 3, false),
        (1, 3, 1, 3, false),
    ] {
        let p = Conv3dParams { s: [s, 1, s], p: [pd, 0, pd], d: [d, d, 1], c: ic, n: 0, oc: 0 };
        run(DType::F32, [20, 20, 10, 3], [3, 3, 3, 3], p, v);
    }
}

// ------------------------------------------------------------------------------------------------
// col2im_1d

#[test]
fn col2im_1d_cases() {
    let cases = [
        (16, 32, 197, 8, 0),
        (4, 3, 7, 2, 0),
        (1, 5, 13, 1, 0),
        (6, 4, 11, 3, 1),
        (2, 3, 9, 3, 0),
        (5, 4, 11, 2, 0),
        (8, 4, 13, 4, 2),
        (4, 3, 1, 2, 0),
        (16, 1, 197, 8, 0),
        (1, 5, 13, 3, 0),
        (8, 2, 3, 2, 5),
    ];
    for dt in [DType::F32, DType::F16, DType::BF16] {
        for (k, oc, t_in, s0, p0) in cases {
            let what = format!("col2im_1d {dt} K={k} OC={oc} T={t_in} s={s0} p={p0}");
            let mut g = Graph::new();
            let a = input(&mut g, dt, [k * oc, t_in, 1, 1], 3);
            let out = g.col2im_1d(a.id, s0, oc, p0).unwrap();
            let ne = g.shape(out).unwrap();
            assert_eq!(ne, [(t_in - 1) * s0 + k - 2 * p0, oc, 1, 1], "{what}");
            let mut want = vec![0f64; ne[0] * ne[1]];
            for ti in 0..t_in {
                for c in 0..oc {
                    for kk in 0..k {
                        let t = (ti * s0 + kk) as i64 - p0 as i64;
                        if t >= 0 && (t as usize) < ne[0] {
                            want[t as usize + c * ne[0]] += a.vals[c * k + kk + ti * k * oc] as f64;
                        }
                    }
                }
            }
            let limit = if dt == DType::F32 { 1e-7 } else { 5e-4 };
            check(&g, &[&a], out, &want, limit, &what);
        }
    }
}

// ------------------------------------------------------------------------------------------------
// conv_2d

/// f64 reference of ggml_conv_2d_direct: x [W, H, C, N], k [KW, KH, C, OC].
fn conv2d_ref(
    x: &[f32],
    xn: [usize; 4],
    k: &[f32],
    kn: [usize; 4],
    p: Conv2dParams,
    ne: [usize; 4],
) -> Vec<f64> {
    let mut want = vec![0f64; ne.iter().product()];
    for (j, [ox, oy, oc, n]) in each(ne).enumerate() {
        let mut s = 0f64;
        for c in 0..kn[2] {
            for ky in 0..kn[1] {
                let y = (oy * p.s1 + ky * p.d1) as i64 - p.p1 as i64;
                if y < 0 || y >= xn[1] as i64 {
                    continue;
                }
                for kx in 0..kn[0] {
                    let xx = (ox * p.s0 + kx * p.d0) as i64 - p.p0 as i64;
                    if xx < 0 || xx >= xn[0] as i64 {
                        continue;
                    }
                    s += at(x, xn, [xx as usize, y as usize, c, n]) * at(k, kn, [kx, ky, c, oc]);
                }
            }
        }
        want[j] = s;
    }
    want
}

fn conv2d_case(ne_in: [usize; 4], ne_k: [usize; 4], kt: DType, p: Conv2dParams, cwhn: bool) {
    let what = format!("conv_2d {kt} {ne_in:?} {ne_k:?} {p:?} cwhn={cwhn}");
    let mut g = Graph::new();
    let (x, src) = if cwhn {
        // Channels innermost in memory, permuted back to [W, H, C, N] (test-backend-ops' layout).
        let x = input(&mut g, DType::F32, [ne_in[2], ne_in[0], ne_in[1], ne_in[3]], 4);
        let v = g.permute(x.id, [2, 0, 1, 3]).unwrap();
        (x, v)
    } else {
        let x = input(&mut g, DType::F32, ne_in, 4);
        let id = x.id;
        (x, id)
    };
    let k = input(&mut g, kt, ne_k, 5);
    let out = g.conv_2d(k.id, src, p).unwrap();
    let ne = g.shape(out).unwrap();
    let xv: Vec<f32> = if cwhn {
        // Back to WHCN order for the reference.
        let cn = [ne_in[2], ne_in[0], ne_in[1], ne_in[3]];
        each(ne_in).map(|[w, h, c, n]| at(&x.vals, cn, [c, w, h, n]) as f32).collect()
    } else {
        x.vals.clone()
    };
    let want = conv2d_ref(&xv, ne_in, &k.vals, ne_k, p, ne);
    check(&g, &[&x, &k], out, &want, 5e-4, &what);
}

#[test]
fn conv_2d_test_backend_ops_sweep() {
    // A subset of test-backend-ops' sweep (s1 = 5, p0 = 5, d0 = 2, d1 = 4, batch 2).
    let (s1, p0, d0, d1) = (5, 5, 2, 4);
    let mut n = 0;
    for s0 in [1, 3] {
        for p1 in [2, 5] {
            for (cin, cout) in [(1, 1), (25, 12), (1, 12), (25, 1)] {
                for (kh, kw) in [(1, 1), (2, 3), (3, 11), (11, 2)] {
                    for (h, w) in [(1, 1), (133, 1), (1, 141), (133, 141)] {
                        if conv_out(w, kw, s0, p0, d0) <= 0 || conv_out(h, kh, s1, p1, d1) <= 0 {
                            continue;
                        }
                        // Keep the big images for the small kernels (the suite must stay fast).
                        if h * w > 1000 && (cin * kh * kw > 75 || cout > 1 && kw * kh > 6) {
                            continue;
                        }
                        n += 1;
                        let p = Conv2dParams { s0, s1, p0, p1, d0, d1 };
                        let kt = if n % 2 == 0 { DType::F32 } else { DType::F16 };
                        conv2d_case([w, h, cin, 2], [kw, kh, cin, cout], kt, p, n % 3 == 0);
                    }
                }
            }
        }
    }
    assert!(n > 40, "{n} cases");
}

#[test]
fn conv_2d_every_kernel_type_and_layout() {
    let p = Conv2dParams::square(1, 1, 1);
    for kt in [DType::F32, DType::F16] {
        for cwhn in [false, true] {
            if !cwhn {
                conv2d_case([64, 64, 16, 1], [3, 3, 16, 16], kt, Conv2dParams::DEFAULT, cwhn);
            }
            conv2d_case([19, 19, 8, 1], [4, 4, 8, 130], kt, Conv2dParams::DEFAULT, cwhn);
            conv2d_case([24, 20, 7, 1], [3, 3, 7, 9], kt, p, cwhn);
            conv2d_case(
                [17, 13, 5, 2],
                [5, 3, 5, 4],
                kt,
                Conv2dParams { s0: 2, s1: 3, p0: 2, p1: 1, d0: 2, d1: 1 },
                cwhn,
            );
        }
    }
}

// ------------------------------------------------------------------------------------------------
// conv_3d

#[allow(clippy::too_many_arguments)]
fn conv3d_case(
    n: usize,
    ic: usize,
    id: usize,
    ih: usize,
    iw: usize,
    oc: usize,
    k: [usize; 3],
    s: [usize; 3],
    pd: [usize; 3],
    d: [usize; 3],
    kt: DType,
) {
    let p = Conv3dParams { s, p: pd, d, c: ic, n, oc };
    let what = format!("conv_3d {kt} N={n} IC={ic} D,H,W={id},{ih},{iw} OC={oc} K={k:?} {p:?}");
    let mut g = Graph::new();
    let xn = [iw, ih, id, ic * n];
    let kn = [k[0], k[1], k[2], ic * oc];
    let x = input(&mut g, DType::F32, xn, 6);
    let kk = input(&mut g, kt, kn, 7);
    let out = g.conv_3d(kk.id, x.id, p).unwrap();
    let ne = g.shape(out).unwrap();
    let mut want = vec![0f64; ne.iter().product()];
    for (j, [ox, oy, oz, q]) in each(ne).enumerate() {
        let (bn, o) = (q / oc, q % oc);
        let mut acc = 0f64;
        for c in 0..ic {
            for kz in 0..k[2] {
                let z = (oz * s[2] + kz * d[2]) as i64 - pd[2] as i64;
                for ky in 0..k[1] {
                    let y = (oy * s[1] + ky * d[1]) as i64 - pd[1] as i64;
                    for kx in 0..k[0] {
                        let xx = (ox * s[0] + kx * d[0]) as i64 - pd[0] as i64;
                        if xx < 0
                            || y < 0
                            || z < 0
                            || xx >= iw as i64
                            || y >= ih as i64
                            || z >= id as i64
                        {
                            continue;
                        }
                        acc += at(&x.vals, xn, [xx as usize, y as usize, z as usize, bn * ic + c])
                            * at(&kk.vals, kn, [kx, ky, kz, o * ic + c]);
                    }
                }
            }
        }
        want[j] = acc;
    }
    check(&g, &[&x, &kk], out, &want, 5e-4, &what);
}

#[test]
fn conv_3d_cases() {
    for kt in [DType::F32, DType::F16] {
        for (n, ic, oc, s0, p1, d2) in
            [(1, 1, 1, 1, 0, 1), (2, 3, 4, 2, 1, 1), (1, 3, 1, 1, 1, 2), (2, 1, 4, 2, 0, 2)]
        {
            conv3d_case(n, ic, 18, 22, 20, oc, [3, 3, 3], [s0; 3], [p1; 3], [d2; 3], kt);
            // test-backend-ops' asymmetric kernel and parameters
            conv3d_case(n, ic, 18, 22, 20, oc, [5, 1, 3], [2, 1, 1], [2, 0, 1], [1, 1, 2], kt);
        }
        conv3d_case(1, 4, 8, 8, 8, 8, [1, 1, 1], [1; 3], [0; 3], [1; 3], kt);
    }
}

// ------------------------------------------------------------------------------------------------
// conv_2d_dw

#[test]
fn conv_2d_dw_whcn_and_cwhn() {
    let cases = [
        ([17, 34, 9, 1], [3, 3, 1, 9], 1, 0, 1),
        ([32, 8, 64, 1], [3, 3, 1, 64], 2, 1, 1),
        ([9, 7, 5, 2], [3, 2, 1, 5], 1, 2, 2),
    ];
    for kt in [DType::F32, DType::F16] {
        for (ne_in, ne_k, s, pd, d) in cases {
            for cwhn in [false, true] {
                let p = Conv2dParams::square(s, pd, d);
                let what = format!("conv_2d_dw {kt} {ne_in:?} {ne_k:?} {p:?} cwhn={cwhn}");
                let mut g = Graph::new();
                let (x, k, src, ker) = if cwhn {
                    let x = input(&mut g, DType::F32, [ne_in[2], ne_in[0], ne_in[1], ne_in[3]], 8);
                    let k = input(&mut g, kt, [ne_k[3], ne_k[0], ne_k[1], 1], 9);
                    let src = g.permute(x.id, [2, 0, 1, 3]).unwrap();
                    let ker = g.permute(k.id, [3, 0, 1, 2]).unwrap();
                    (x, k, src, ker)
                } else {
                    let x = input(&mut g, DType::F32, ne_in, 8);
                    let k = input(&mut g, kt, ne_k, 9);
                    let (a, b) = (x.id, k.id);
                    (x, k, a, b)
                };
                assert_eq!(g.shape(ker).unwrap(), ne_k);
                let y = g.conv_2d_dw(ker, src, p).unwrap();
                let ne = g.shape(y).unwrap();
                // A CWHN input gives a CWHN result (not contiguous); compare in WHCN order.
                assert_eq!(g.strides(y).unwrap()[2] == 4, cwhn, "{what}: result layout");
                let out = if cwhn { g.cont(y).unwrap() } else { y };
                let xs = |w: usize, h: usize, c: usize, n: usize| {
                    if cwhn {
                        at(&x.vals, [ne_in[2], ne_in[0], ne_in[1], ne_in[3]], [c, w, h, n])
                    } else {
                        at(&x.vals, ne_in, [w, h, c, n])
                    }
                };
                let ks = |w: usize, h: usize, c: usize| {
                    if cwhn {
                        at(&k.vals, [ne_k[3], ne_k[0], ne_k[1], 1], [c, w, h, 0])
                    } else {
                        at(&k.vals, ne_k, [w, h, 0, c])
                    }
                };
                let mut want = vec![0f64; ne.iter().product()];
                for (j, [ox, oy, c, n]) in each(ne).enumerate() {
                    let mut acc = 0f64;
                    for ky in 0..ne_k[1] {
                        let yy = (oy * s + ky * d) as i64 - pd as i64;
                        for kx in 0..ne_k[0] {
                            let xx = (ox * s + kx * d) as i64 - pd as i64;
                            if xx >= 0 && yy >= 0 && xx < ne_in[0] as i64 && yy < ne_in[1] as i64 {
                                acc += xs(xx as usize, yy as usize, c, n) * ks(kx, ky, c);
                            }
                        }
                    }
                    want[j] = acc;
                }
                check(&g, &[&x, &k], out, &want, 1e-7, &what);
            }
        }
    }
}

// ------------------------------------------------------------------------------------------------
// conv_transpose_1d / 2d

fn convt1d_case(ne_in: [usize; 2], ne_k: [usize; 3], s0: usize, kt: DType) {
    let what = format!("conv_transpose_1d {kt} {ne_in:?} {ne_k:?} s0={s0}");
    let mut g = Graph::new();
    let x = input(&mut g, DType::F32, [ne_in[0], ne_in[1], 1, 1], 10);
    let k = input(&mut g, kt, [ne_k[0], ne_k[1], ne_k[2], 1], 11);
    let out = g.conv_transpose_1d(k.id, x.id, s0, 0, 1).unwrap();
    let ne = g.shape(out).unwrap();
    let (kw, cout, cin) = (ne_k[0], ne_k[1], ne_k[2]);
    assert_eq!(ne, [(ne_in[0] - 1) * s0 + kw, cout, 1, 1], "{what}");
    let mut want = vec![0f64; ne[0] * ne[1]];
    for o in 0..cout {
        for i in 0..ne_in[0] {
            for t in 0..kw {
                let mut acc = 0f64;
                for c in 0..cin {
                    acc += x.vals[i + c * ne_in[0]] as f64 * k.vals[t + kw * (o + cout * c)] as f64;
                }
                want[i * s0 + t + o * ne[0]] += acc;
            }
        }
    }
    check(
        &g,
        &[&x, &k],
        out,
        &want,
        1e-7_f64.max(if kt == DType::F16 { 5e-4 } else { 0.0 }),
        &what,
    );
}

#[test]
fn conv_transpose_1d_cases() {
    for cout in [1, 9] {
        for cin in [1, 7] {
            for kw in [1, 3, 1337] {
                for l in [1, 2, 13] {
                    for s0 in [1, 2, 3] {
                        convt1d_case([l, cin], [kw, cout, cin], s0, DType::F32);
                    }
                }
            }
        }
    }
    for kt in [DType::F32, DType::F16] {
        convt1d_case([197, 32], [16, 32, 32], 1, kt);
        for (ne_in, ne_k, s0) in [
            ([3, 2], [2, 3, 2], 3),
            ([3, 2], [2, 3, 2], 2),
            ([3, 2], [2, 3, 2], 1),
            ([3, 2], [3, 2, 2], 2),
            ([3, 2], [3, 2, 2], 1),
            ([3, 2], [3, 1, 2], 1),
            ([2, 1], [3, 1, 1], 1),
        ] {
            convt1d_case(ne_in, ne_k, s0, kt);
        }
    }
}

fn convt2d_case(ne_in: [usize; 4], ne_k: [usize; 4], stride: usize, kt: DType) {
    let what = format!("conv_transpose_2d {kt} {ne_in:?} {ne_k:?} stride={stride}");
    let mut g = Graph::new();
    let x = input(&mut g, DType::F32, ne_in, 12);
    let k = input(&mut g, kt, ne_k, 13);
    let out = g.conv_transpose_2d(k.id, x.id, stride).unwrap();
    let ne = g.shape(out).unwrap();
    let mut want = vec![0f64; ne.iter().product()];
    for [xx, yy, c, n] in each(ne_in) {
        let xv = at(&x.vals, ne_in, [xx, yy, c, n]);
        for [kx, ky, o, _] in each([ne_k[0], ne_k[1], ne_k[2], 1]) {
            let (ox, oy) = (xx * stride + kx, yy * stride + ky);
            want[ox + ne[0] * (oy + ne[1] * (o + ne[2] * n))] +=
                xv * at(&k.vals, ne_k, [kx, ky, o, c]);
        }
    }
    check(&g, &[&x, &k], out, &want, 5e-4, &what);
}

#[test]
fn conv_transpose_2d_cases() {
    for kt in [DType::F32, DType::F16] {
        convt2d_case([3, 2, 3, 1], [2, 2, 1, 3], 1, kt);
        convt2d_case([10, 10, 9, 1], [3, 3, 1, 9], 2, kt);
        convt2d_case([16, 16, 16, 1], [3, 3, 8, 16], 1, kt);
        convt2d_case([5, 4, 3, 2], [3, 2, 4, 3], 3, kt); // batch 2
    }
    // test-backend-ops' [129, 63, 35] input, cropped in width and height to stay fast.
    convt2d_case([33, 15, 35, 1], [3, 3, 48, 35], 1, DType::F16);
}

// ------------------------------------------------------------------------------------------------
// pooling

#[test]
fn pool_2d_sweep() {
    for dt in [DType::F32, DType::F16] {
        for op in [PoolOp::Avg, PoolOp::Max] {
            for k0 in [1, 3] {
                for k1 in [1, 3] {
                    for s0 in [1, 2] {
                        for s1 in [1, 2] {
                            for p0 in [0usize, 1] {
                                for p1 in [0usize, 1] {
                                    pool2d_case(
                                        dt,
                                        op,
                                        [10, 10, 3, 1],
                                        [k0, k1],
                                        [s0, s1],
                                        [p0, p1],
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
        pool2d_case(dt, PoolOp::Max, [9, 7, 2, 3], [2, 2], [2, 2], [0, 0]);
        pool2d_case(dt, PoolOp::Avg, [9, 7, 2, 3], [4, 3], [3, 2], [2, 1]);
    }
}

fn pool2d_case(
    dt: DType,
    op: PoolOp,
    ne_in: [usize; 4],
    k: [usize; 2],
    s: [usize; 2],
    p: [usize; 2],
) {
    let what = format!("pool_2d {dt} {op:?} {ne_in:?} k={k:?} s={s:?} p={p:?}");
    let mut g = Graph::new();
    let x = input(&mut g, dt, ne_in, 14);
    let out = g
        .pool_2d(
            x.id,
            quantgraph::Pool2dParams::new(op, k[0], k[1])
                .stride(s[0], s[1])
                .padding(p[0] as f32, p[1] as f32),
        )
        .unwrap();
    let ne = g.shape(out).unwrap();
    for d in 0..2 {
        assert_eq!(ne[d] as i64, (ne_in[d] + 2 * p[d] - k[d]) as i64 / s[d] as i64 + 1, "{what}");
    }
    let mut want = vec![0f64; ne.iter().product()];
    for (j, [ox, oy, c, n]) in each(ne).enumerate() {
        let mut acc = if op == PoolOp::Max { -(f32::MAX as f64) } else { 0.0 };
        for ky in 0..k[1] {
            for kx in 0..k[0] {
                let xx = (ox * s[0] + kx) as i64 - p[0] as i64;
                let yy = (oy * s[1] + ky) as i64 - p[1] as i64;
                if xx >= 0 && yy >= 0 && xx < ne_in[0] as i64 && yy < ne_in[1] as i64 {
                    let v = at(&x.vals, ne_in, [xx as usize, yy as usize, c, n]);
                    acc = if op == PoolOp::Max { acc.max(v) } else { acc + v };
                }
            }
        }
        want[j] = if op == PoolOp::Avg { acc / (k[0] * k[1]) as f64 } else { acc };
    }
    check(&g, &[&x], out, &want, 1e-7, &what);
}

#[test]
fn pool_1d_sweep() {
    for dt in [DType::F32, DType::F16] {
        for op in [PoolOp::Avg, PoolOp::Max] {
            for k0 in [1, 2, 3] {
                for s0 in [1, 2, 3] {
                    for p0 in [0, 1, 2, 3] {
                        for ne_in in [[10, 3, 2, 1], [11, 1, 3, 2], [128, 2, 1, 3]] {
                            let what =
                                format!("pool_1d {dt} {op:?} {ne_in:?} k={k0} s={s0} p={p0}");
                            let mut g = Graph::new();
                            let x = input(&mut g, dt, ne_in, 15);
                            let out = g.pool_1d(x.id, op, k0, s0, p0).unwrap();
                            let ne = g.shape(out).unwrap();
                            let mut want = vec![0f64; ne.iter().product()];
                            for (j, [ow, i1, i2, i3]) in each(ne).enumerate() {
                                let mut acc =
                                    if op == PoolOp::Max { -(f32::MAX as f64) } else { 0.0 };
                                let mut cnt = 0;
                                for kk in 0..k0 {
                                    let xx = (ow * s0 + kk) as i64 - p0 as i64;
                                    if xx >= 0 && xx < ne_in[0] as i64 {
                                        let v = at(&x.vals, ne_in, [xx as usize, i1, i2, i3]);
                                        acc = if op == PoolOp::Max { acc.max(v) } else { acc + v };
                                        cnt += 1;
                                    }
                                }
                                want[j] = match op {
                                    PoolOp::Avg if cnt > 0 => acc / cnt as f64,
                                    PoolOp::Avg => 0.0,
                                    _ => acc,
                                };
                            }
                            check(&g, &[&x], out, &want, 1e-7, &what);
                        }
                    }
                }
            }
        }
    }
}

// ------------------------------------------------------------------------------------------------
// windows and relative positions

#[test]
fn win_part_and_unpart_roundtrip() {
    for (c, w0, h0, w) in [(8, 14, 13, 4), (3, 10, 10, 5), (5, 7, 9, 14)] {
        let what = format!("win_part C={c} {w0}x{h0} w={w}");
        let mut g = Graph::new();
        let x = input(&mut g, DType::F32, [c, w0, h0, 1], 16);
        let parts = g.win_part(x.id, w).unwrap();
        let ne = g.shape(parts).unwrap();
        let npx = w0.div_ceil(w);
        assert_eq!(ne, [c, w, w, npx * h0.div_ceil(w)], "{what}");
        let mut want = vec![0f64; ne.iter().product()];
        for (j, [i0, i1, i2, i3]) in each(ne).enumerate() {
            let (xx, yy) = ((i3 % npx) * w + i1, (i3 / npx) * w + i2);
            if xx < w0 && yy < h0 {
                want[j] = at(&x.vals, [c, w0, h0, 1], [i0, xx, yy, 0]);
            }
        }
        check(&g, &[&x], parts, &want, 1e-7, &what);
        let back = g.win_unpart(parts, w0, h0, w).unwrap();
        let want: Vec<f64> = x.vals.iter().map(|&v| v as f64).collect();
        let got = check(&g, &[&x], back, &want, 0.0, &format!("win_unpart of {what}"));
        assert_eq!(got, x.vals);
    }
}

#[test]
fn get_rel_pos_picks_rows() {
    for (c, q, dt) in
        [(16, 7, DType::F16), (5, 1, DType::F16), (3, 14, DType::BF16), (8, 3, DType::BF16)]
    {
        let mut g = Graph::new();
        let a = input(&mut g, dt, [c, 2 * q - 1, 1, 1], 17);
        let out = g.get_rel_pos(a.id, q, q).unwrap();
        assert_eq!(g.dtype(out).unwrap(), dt);
        let ne = g.shape(out).unwrap();
        assert_eq!(ne, [c, q, q, 1]);
        let want: Vec<f64> =
            each(ne).map(|[i0, k, qq, _]| a.vals[i0 + c * (q - 1 - k + qq)] as f64).collect();
        check(&g, &[&a], out, &want, 0.0, &format!("get_rel_pos C={c} q={q}"));
    }
}

#[test]
fn add_rel_pos_matches_reference_and_runs_in_place() {
    for (w, x_, y_, b) in [(5, 5, 5, 3), (4, 2, 6, 1), (1, 3, 1, 2)] {
        let what = format!("add_rel_pos W={w} X={x_} Y={y_} B={b}");
        let mut g = Graph::new();
        let a0 = input(&mut g, DType::F32, [w * w, x_ * y_, b, 1], 18);
        let pw = input(&mut g, DType::F32, [w, x_, y_, b], 19);
        let ph = input(&mut g, DType::F32, [w, x_, y_, b], 20);
        // Feed it an intermediate so the plan may run it in place.
        let a = g.scale(a0.id, 1.0).unwrap();
        let out = g.add_rel_pos(a, pw.id, ph.id).unwrap();
        let ne = g.shape(out).unwrap();
        let want: Vec<f64> = each(ne)
            .map(|[e, r, bb, _]| {
                let (k1, k0) = (e / w, e % w);
                let row = r + x_ * y_ * bb;
                a0.vals[e + w * w * row] as f64
                    + ph.vals[k1 + w * row] as f64
                    + pw.vals[k0 + w * row] as f64
            })
            .collect();
        check(&g, &[&a0, &pw, &ph], out, &want, 1e-7, &what);
        let mut g2 = g.clone();
        g2.set_output(out).unwrap();
        let mut p = Plan::new(g2, &CpuBackend::with_threads(2).unwrap()).unwrap();
        assert!(p.stats().n_inplace >= 1, "{what}: add_rel_pos should reuse its input");
        p.set_input(a0.id, &a0.vals).unwrap();
        p.set_input(pw.id, &pw.vals).unwrap();
        p.set_input(ph.id, &ph.vals).unwrap();
        p.compute().unwrap();
        assert!(nmse(p.output::<f32>(out).unwrap(), &want) <= 1e-7, "{what} in place");
    }
}

// ------------------------------------------------------------------------------------------------
// build-time errors

fn expect_err(r: quantgraph::Result<TensorId>, needle: &str) {
    match r {
        Ok(_) => panic!("expected an error mentioning {needle:?}"),
        Err(e) => {
            let s = e.to_string();
            assert!(s.contains(needle), "{s:?} does not mention {needle:?}");
            assert!(
                matches!(e, Error::Shape { .. } | Error::Type { .. } | Error::Param { .. }),
                "{e:?}"
            );
        }
    }
}

#[test]
fn bad_shapes_types_and_params_are_refused_at_build_time() {
    let mut g = Graph::new();
    let img = g.input(DType::F32, &[8, 8, 3, 1]).unwrap();
    let img16 = g.input(DType::F16, &[8, 8, 3, 1]).unwrap();
    let k = g.input(DType::F32, &[3, 3, 3, 4]).unwrap();
    let k_q = g.input(DType::Q8_0, &[32, 3, 3, 4]).unwrap();
    let k_big = g.input(DType::F32, &[9, 9, 3, 4]).unwrap();
    let k_c2 = g.input(DType::F32, &[3, 3, 2, 4]).unwrap();
    let p = Conv2dParams::DEFAULT;
    expect_err(g.im2col(k_c2, img, p, true, DType::F32), "im2col");
    expect_err(g.im2col(k_big, img, p, true, DType::F32), "too small");
    expect_err(g.im2col(k, img16, p, true, DType::F32), "im2col");
    expect_err(g.im2col(k, img, p, true, DType::Q8_0), "im2col");
    expect_err(g.im2col(k, img, Conv2dParams { s0: 0, ..p }, true, DType::F32), "s0");
    expect_err(g.im2col(k, img, Conv2dParams { d1: 0, ..p }, true, DType::F32), "d1");
    expect_err(g.conv_2d(k_c2, img, p), "channels");
    expect_err(g.conv_2d(k_q, img, p), "F32 or F16");
    expect_err(g.conv_2d(k, img16, p), "F32");
    expect_err(g.conv_2d(k_big, img, p), "too small");
    let kt = g.transpose(k).unwrap();
    let kt = g.cont(kt).unwrap();
    let kt = g.transpose(kt).unwrap();
    expect_err(g.conv_2d(kt, img, p), "contiguous");
    let p3 = Conv3dParams { s: [1; 3], p: [0; 3], d: [1; 3], c: 3, n: 1, oc: 4 };
    let vol = g.input(DType::F32, &[6, 6, 6, 3]).unwrap();
    let k3 = g.input(DType::F32, &[3, 3, 3, 12]).unwrap();
    g.conv_3d(k3, vol, p3).unwrap();
    expect_err(g.conv_3d(k3, vol, Conv3dParams { oc: 5, ..p3 }), "c*oc");
    expect_err(g.conv_3d(k3, vol, Conv3dParams { n: 2, ..p3 }), "c*n");
    expect_err(g.im2col_3d(k3, vol, Conv3dParams { c: 2, ..p3 }, DType::F32), "IC");
    let kdw = g.input(DType::F32, &[3, 3, 1, 3]).unwrap();
    g.conv_2d_dw(kdw, img, p).unwrap();
    expect_err(g.conv_2d_dw(k, img, p), "[KW, KH, 1, C]");
    let odd = g.permute(img, [1, 0, 2, 3]).unwrap();
    expect_err(g.conv_2d_dw(kdw, odd, p), "contiguous");
    let sig = g.input(DType::F32, &[10, 3, 1, 1]).unwrap();
    let kt1 = g.input(DType::F32, &[4, 5, 3, 1]).unwrap();
    g.conv_transpose_1d(kt1, sig, 2, 0, 1).unwrap();
    expect_err(g.conv_transpose_1d(kt1, sig, 2, 1, 1), "p0 = 1");
    expect_err(g.conv_transpose_1d(kt1, sig, 2, 0, 2), "d0 = 2");
    expect_err(g.conv_transpose_1d(k, sig, 1, 0, 1), "conv_transpose_1d");
    expect_err(g.conv_transpose_2d(k_c2, img, 1), "Cin");
    let kt2 = g.input(DType::F32, &[3, 3, 4, 3]).unwrap();
    g.conv_transpose_2d(kt2, img, 2).unwrap();
    expect_err(g.conv_transpose_2d(kt2, img, 0), "stride");
    expect_err(g.pool_1d(img, PoolOp::Max, 9, 1, 0), "too small");
    expect_err(g.pool_1d(img, PoolOp::Max, 0, 1, 0), "k0");
    expect_err(
        g.pool_2d(
            img,
            quantgraph::Pool2dParams::new(PoolOp::Avg, 3, 3).stride(1, 0).padding(0.0, 0.0),
        ),
        "s1",
    );
    expect_err(
        g.pool_2d(
            img,
            quantgraph::Pool2dParams::new(PoolOp::Avg, 3, 3).stride(1, 1).padding(-1.0, 0.0),
        ),
        "p0",
    );
    expect_err(
        g.pool_2d(
            img,
            quantgraph::Pool2dParams::new(PoolOp::Avg, 3, 9).stride(1, 1).padding(0.0, 0.0),
        ),
        "too small",
    );
    let cols = g.input(DType::F32, &[12, 5, 1, 1]).unwrap();
    g.col2im_1d(cols, 2, 3, 0).unwrap();
    expect_err(g.col2im_1d(cols, 2, 5, 0), "K*oc");
    expect_err(g.col2im_1d(cols, 2, 3, 9), "T_out");
    expect_err(g.col2im_1d(cols, 0, 3, 0), "s0");
    expect_err(g.col2im_1d(img, 1, 1, 0), "matrix");
    let batch = g.input(DType::F32, &[4, 8, 8, 2]).unwrap();
    expect_err(g.win_part(batch, 2), "ne[3] == 1");
    let hw = g.input(DType::F32, &[4, 10, 10, 1]).unwrap();
    let parts = g.win_part(hw, 4).unwrap();
    expect_err(g.win_part(hw, 0), "w = 0");
    expect_err(g.win_unpart(parts, 10, 10, 5), "win_unpart");
    expect_err(g.win_unpart(parts, 13, 10, 4), "win_unpart");
    let rp = g.input(DType::F16, &[8, 13, 1, 1]).unwrap();
    g.get_rel_pos(rp, 7, 7).unwrap();
    expect_err(g.get_rel_pos(rp, 7, 6), "qh == kh");
    expect_err(g.get_rel_pos(rp, 6, 6), "qh == kh");
    let rp32 = g.input(DType::F32, &[8, 13, 1, 1]).unwrap();
    expect_err(g.get_rel_pos(rp32, 7, 7), "F16");
    let sc = g.input(DType::F32, &[25, 25, 3, 1]).unwrap();
    let pw = g.input(DType::F32, &[5, 5, 5, 3]).unwrap();
    let ph = g.input(DType::F32, &[5, 5, 5, 2]).unwrap();
    g.add_rel_pos(sc, pw, pw).unwrap();
    expect_err(g.add_rel_pos(sc, pw, ph), "pw == ph");
    expect_err(g.add_rel_pos(img, pw, pw), "add_rel_pos");
    let empty = g.input(DType::F32, &[0, 3, 1, 1]).unwrap();
    expect_err(g.conv_transpose_1d(kt1, empty, 1, 0, 1), "empty");
    expect_err(g.pool_1d(empty, PoolOp::Avg, 1, 1, 0), "empty");
    expect_err(g.im2col(k, empty, p, false, DType::F32), "empty");
}

// ------------------------------------------------------------------------------------------------
// a small CNN end to end

/// conv_2d(3x3, pad 1) -> group_norm -> gelu -> max pool 2x2 -> nearest upscale x2 ->
/// conv_2d(3x3, stride 2) -> avg pool 2x2 (padding 1), against f64 throughout.
#[test]
fn small_cnn_end_to_end() {
    let (w, h, c0, c1, c2, n) = (16usize, 12usize, 3usize, 8usize, 5usize, 2usize);
    let mut g = Graph::new();
    let x = input(&mut g, DType::F32, [w, h, c0, n], 30);
    let k1 = input(&mut g, DType::F16, [3, 3, c0, c1], 31);
    let k2 = input(&mut g, DType::F32, [3, 3, c1, c2], 32);
    let y = g.conv_2d(k1.id, x.id, Conv2dParams::square(1, 1, 1)).unwrap();
    let y = g.group_norm(y, 2, 1e-5).unwrap();
    let y = g.gelu(y).unwrap();
    let y = g
        .pool_2d(y, quantgraph::Pool2dParams::new(PoolOp::Max, 2, 2).stride(2, 2).padding(0.0, 0.0))
        .unwrap();
    let y = g.upscale(y, 2, ScaleMode::Nearest).unwrap();
    let y = g.conv_2d(k2.id, y, Conv2dParams::square(2, 0, 1)).unwrap();
    let out = g
        .pool_2d(y, quantgraph::Pool2dParams::new(PoolOp::Avg, 2, 2).stride(2, 2).padding(1.0, 1.0))
        .unwrap();

    // f64 reference
    let conv = |xs: &[f64], xn: [usize; 4], k: &[f32], kn: [usize; 4], s: usize, p: usize| {
        let ow = conv_out(xn[0], kn[0], s, p, 1) as usize;
        let oh = conv_out(xn[1], kn[1], s, p, 1) as usize;
        let ne = [ow, oh, kn[3], xn[3]];
        let xf: Vec<f32> = xs.iter().map(|&v| v as f32).collect();
        let _ = xf;
        let mut o = vec![0f64; ne.iter().product()];
        for (j, [ox, oy, oc, b]) in each(ne).enumerate() {
            let mut acc = 0f64;
            for [kx, ky, c, _] in each([kn[0], kn[1], kn[2], 1]) {
                let xx = (ox * s + kx) as i64 - p as i64;
                let yy = (oy * s + ky) as i64 - p as i64;
                if xx >= 0 && yy >= 0 && xx < xn[0] as i64 && yy < xn[1] as i64 {
                    let xi = xx as usize + xn[0] * (yy as usize + xn[1] * (c + xn[2] * b));
                    acc += xs[xi] * at(k, kn, [kx, ky, c, oc]);
                }
            }
            o[j] = acc;
        }
        (o, ne)
    };
    let xs: Vec<f64> = x.vals.iter().map(|&v| v as f64).collect();
    let (mut y, ne) = conv(&xs, [w, h, c0, n], &k1.vals, [3, 3, c0, c1], 1, 1);
    // group_norm: 2 groups of 4 channels per sample
    let plane = ne[0] * ne[1];
    for b in 0..n {
        for gi in 0..2 {
            let start = (b * c1 + gi * 4) * plane;
            let v = &mut y[start..start + 4 * plane];
            let mean = v.iter().sum::<f64>() / v.len() as f64;
            let var = v.iter().map(|a| (a - mean) * (a - mean)).sum::<f64>() / v.len() as f64;
            for a in v.iter_mut() {
                *a = (*a - mean) / (var + 1e-5).sqrt();
            }
        }
    }
    let gelu = |v: f64| {
        0.5 * v * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v)).tanh())
    };
    let y: Vec<f64> = y.into_iter().map(gelu).collect();
    let pn = [ne[0] / 2, ne[1] / 2, ne[2], ne[3]];
    let pooled: Vec<f64> = each(pn)
        .map(|[px, py, c, b]| {
            let mut m = f64::MIN;
            for [dx, dy, _, _] in each([2, 2, 1, 1]) {
                m = m.max(y[(2 * px + dx) + ne[0] * ((2 * py + dy) + ne[1] * (c + ne[2] * b))]);
            }
            m
        })
        .collect();
    let un = [pn[0] * 2, pn[1] * 2, pn[2], pn[3]];
    let up: Vec<f64> = each(un)
        .map(|[ux, uy, c, b]| pooled[ux / 2 + pn[0] * (uy / 2 + pn[1] * (c + pn[2] * b))])
        .collect();
    let (z, zn) = conv(&up, un, &k2.vals, [3, 3, c1, c2], 2, 0);
    let on = g.shape(out).unwrap();
    let want: Vec<f64> = each(on)
        .map(|[ox, oy, c, b]| {
            let mut acc = 0f64;
            for [dx, dy, _, _] in each([2, 2, 1, 1]) {
                let xx = (2 * ox + dx) as i64 - 1;
                let yy = (2 * oy + dy) as i64 - 1;
                if xx >= 0 && yy >= 0 && xx < zn[0] as i64 && yy < zn[1] as i64 {
                    acc += z[xx as usize + zn[0] * (yy as usize + zn[1] * (c + zn[2] * b))];
                }
            }
            acc / 4.0
        })
        .collect();
    // F16 first kernel and ggml's f16 GELU table: the conv limit.
    check(&g, &[&x, &k1, &k2], out, &want, 5e-4, "small CNN");
}
