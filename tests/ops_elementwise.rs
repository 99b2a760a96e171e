//! Elementwise, GLU, norm, reduction and sorting ops against plain f64 references written here,
//! with test-backend-ops' shapes (odd sizes, broadcasts, permuted and strided views) and limits:
//! NMSE < 1e-7 for F32 results; exact for argmax / count_equal / argsort / top_k and for GELU /
//! quick GELU (ggml's f16 tables); for F16 results the reference runs on the f16-rounded inputs
//! and is rounded to f16, and the limit is NMSE < 1e-6 (rounding in f32 then to f16, as ggml,
//! may differ from rounding the f64 value by one f16 ulp on a few elements). In-place variants
//! write into views in the middle of state buffers whose other bytes must stay untouched.

mod common;

use common::{XIELU, all_unary, each, nmse};
use half::{bf16, f16};
use quantgraph::testdata::rand_f32;
use quantgraph::{
    Buffer, CpuBackend, DType, Error, GluOp, Graph, Isa, Plan, SortOrder, TensorId, TriType,
    UnaryOp,
};

fn flat(ne: [usize; 4], i: [usize; 4]) -> usize {
    ((i[3] * ne[2] + i[2]) * ne[1] + i[1]) * ne[0] + i[0]
}

fn r16(x: f64) -> f64 {
    f16::from_f64(x).to_f64()
}

fn rbf16(x: f64) -> f64 {
    bf16::from_f32(x as f32).to_f64()
}

/// `x` rounded to `dt` (F16, BF16; F32 values are exact in f64).
fn round_to(x: f64, dt: DType) -> f64 {
    match dt {
        DType::F16 => r16(x),
        DType::BF16 => rbf16(x),
        _ => x,
    }
}

/// Plans with 64 guard bytes around every tensor and checks them after the compute, so an op
/// that writes past its output (or into another tensor) fails the test.
fn plan(g: Graph, inputs: &[(TensorId, Vec<f32>)], threads: usize) -> Plan {
    let be = CpuBackend::with_threads(threads).unwrap();
    let mut p = Plan::with_guards(g, &be, 64).unwrap();
    for (id, v) in inputs {
        p.set_input(*id, v).unwrap();
    }
    p.compute().unwrap();
    p.check_guards().unwrap();
    p
}

fn run(g: Graph, inputs: &[(TensorId, Vec<f32>)], out: TensorId, threads: usize) -> Vec<f32> {
    let p = plan(g, inputs, threads);
    match p.graph().dtype(out).unwrap() {
        DType::F16 => p.output::<f16>(out).unwrap().iter().map(|h| h.to_f32()).collect(),
        DType::BF16 => p.output::<bf16>(out).unwrap().iter().map(|h| h.to_f32()).collect(),
        _ => p.output::<f32>(out).unwrap().to_vec(),
    }
}

/// An F32 input of shape `ne`, optionally cast to `dt` and viewed permuted ([1, 0, 2, 3]).
/// Returns (input id, tensor to feed the op, logical shape of that tensor).
fn source(g: &mut Graph, ne: [usize; 4], dt: DType, permuted: bool) -> (TensorId, TensorId) {
    let x = g.input(DType::F32, &ne).unwrap();
    let t = if dt == DType::F32 { x } else { g.cast(x, dt).unwrap() };
    let t = if permuted { g.permute(t, [1, 0, 2, 3]).unwrap() } else { t };
    (x, t)
}

/// Value of the op's source at logical index `i`, given the F32 data of the input (`ne`).
fn src_at(v: &[f32], ne: [usize; 4], i: [usize; 4], dt: DType, permuted: bool) -> f64 {
    let j = if permuted { [i[1], i[0], i[2], i[3]] } else { i };
    round_to(v[flat(ne, j)] as f64, dt)
}

fn logical(ne: [usize; 4], permuted: bool) -> [usize; 4] {
    if permuted { [ne[1], ne[0], ne[2], ne[3]] } else { ne }
}

fn check(what: &str, got: &[f32], want: &[f64], dt: DType) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let (want, lim): (Vec<f64>, f64) = if dt == DType::F32 {
        (want.to_vec(), 1e-7)
    } else {
        (want.iter().map(|&w| round_to(w, dt)).collect(), 1e-6)
    };
    let e = nmse(got, &want);
    assert!(e < lim, "{what}: nmse {e} >= {lim}");
}

// Abramowitz & Stegun 7.1.26 is too coarse for 1e-7; use the series / continued fraction.
fn erf(x: f64) -> f64 {
    if x.abs() < 2.5 {
        // Maclaurin series.
        let mut sum = x;
        let mut term = x;
        let x2 = x * x;
        for n in 1..200 {
            term *= -x2 / n as f64;
            let t = term / (2 * n + 1) as f64;
            sum += t;
            if t.abs() < 1e-17 {
                break;
            }
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // erfc by Lentz's continued fraction.
        let z = x.abs();
        let mut f = z;
        let mut c = z;
        let mut d = 0.0;
        for k in 1..200 {
            let a = k as f64 / 2.0;
            d = z + a * d;
            d = 1.0 / d;
            c = z + a / c;
            let delta = c * d;
            f *= delta;
            if (delta - 1.0).abs() < 1e-16 {
                break;
            }
        }
        let erfc = (-z * z).exp() / (f * std::f64::consts::PI.sqrt());
        (1.0 - erfc).copysign(x)
    }
}

fn softplus(x: f64) -> f64 {
    if x > 20.0 { x } else { (1.0 + x.exp()).ln() }
}

fn gelu_tanh(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * x * (1.0 + 0.044715 * x * x)).tanh())
}

fn gelu_quick(x: f64) -> f64 {
    x / (1.0 + (-1.702 * x).exp())
}

/// The f64 reference of a unary op. GELU and quick GELU follow ggml's table: the input is
/// rounded to f16 and so is the result (GELU saturates outside [-10, 10] in F32).
fn unary_ref(op: UnaryOp, x: f64) -> f64 {
    match op {
        UnaryOp::Abs => x.abs(),
        UnaryOp::Sgn => {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                0.0
            }
        }
        UnaryOp::Neg => -x,
        UnaryOp::Step => (x > 0.0) as i32 as f64,
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Elu => {
            if x > 0.0 {
                x
            } else {
                x.exp_m1()
            }
        }
        UnaryOp::Relu => x.max(0.0),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Gelu => {
            if x <= -10.0 {
                0.0
            } else if x >= 10.0 {
                x
            } else {
                r16(gelu_tanh(r16(x)))
            }
        }
        UnaryOp::GeluQuick => r16(gelu_quick(r16(x))),
        UnaryOp::Silu => x / (1.0 + (-x).exp()),
        UnaryOp::Hardswish => x * ((x + 3.0) / 6.0).clamp(0.0, 1.0),
        UnaryOp::Hardsigmoid => ((x + 3.0) / 6.0).clamp(0.0, 1.0),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Expm1 => x.exp_m1(),
        UnaryOp::Softplus => softplus(x),
        UnaryOp::GeluErf => 0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2)),
        UnaryOp::Xielu { alpha_n, alpha_p, beta, eps } => {
            let (an, ap, b, e) = (alpha_n as f64, alpha_p as f64, beta as f64, eps as f64);
            if x > 0.0 { ap * x * x + b * x } else { (x.min(e).exp_m1() - x) * an + b * x }
        }
        UnaryOp::Floor => x.floor(),
        UnaryOp::Ceil => x.ceil(),
        UnaryOp::Round => x.round(),
        UnaryOp::Trunc => x.trunc(),
        _ => unreachable!("unary op without a reference"),
    }
}

const SHAPES: [[usize; 4]; 3] = [[5, 7, 11, 13], [128, 2, 2, 2], [1, 1, 1, 1]];

#[test]
fn unary_all_22_f32_f16_bf16_contiguous_and_permuted() {
    let ops = all_unary();
    assert_eq!(ops.len(), 22);
    for op in ops {
        // ggml runs GELU, quick GELU, erf GELU and SiLU on F32/F16 only (ops.cpp); the others
        // (unary-ops.cpp) on BF16 too.
        let f32_f16_only =
            matches!(op, UnaryOp::Gelu | UnaryOp::GeluQuick | UnaryOp::GeluErf | UnaryOp::Silu);
        if f32_f16_only {
            let mut g = Graph::new();
            let x = g.input(DType::BF16, &[8]).unwrap();
            assert!(matches!(g.unary(x, op), Err(Error::Type { .. })), "{} BF16", op.name());
        }
        for ne in SHAPES {
            for dt in [DType::F32, DType::F16, DType::BF16] {
                if dt == DType::BF16 && f32_f16_only {
                    continue;
                }
                for permuted in [false, true] {
                    let mut g = Graph::new();
                    let (x, t) = source(&mut g, ne, dt, permuted);
                    let y = match op {
                        UnaryOp::Xielu { .. } => {
                            let (an, ap, b, e) = XIELU;
                            g.xielu(t, an, ap, b, e).unwrap()
                        }
                        _ => g.unary(t, op).unwrap(),
                    };
                    assert_eq!(g.dtype(y).unwrap(), dt);
                    g.set_output(y).unwrap();
                    let n: usize = ne.iter().product();
                    let v: Vec<f32> = rand_f32(n, 21).iter().map(|x| x * 4.0).collect();
                    let got = run(g, &[(x, v.clone())], y, 2);
                    let lne = logical(ne, permuted);
                    let want: Vec<f64> =
                        each(lne).map(|i| unary_ref(op, src_at(&v, ne, i, dt, permuted))).collect();
                    check(
                        &format!("{} {dt} {ne:?} permuted={permuted}", op.name()),
                        &got,
                        &want,
                        dt,
                    );
                }
            }
        }
    }
}

fn fnv(h: u64, v: u16) -> u64 {
    (h ^ v as u64).wrapping_mul(1_099_511_628_211)
}

/// GELU and quick GELU over every f16 bit pattern reproduce ggml's tables: the FNV-1a-style
/// hashes below were computed from ggml's `ggml_gelu_f32` / `ggml_gelu_quick_f32` compiled with
/// `gcc -O3 -march=native` (ggml's default x86 build) and F16C conversions, skipping NaN inputs.
/// F32 GELU then equals the table entry of the f16-rounded input inside (-10, 10).
#[test]
fn gelu_and_gelu_quick_match_ggml_f16_tables_bit_for_bit() {
    let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
    for (op, want_hash) in
        [(UnaryOp::Gelu, 0xfa41_036e_3df6_11a1u64), (UnaryOp::GeluQuick, 0x6fa8_04d5_1884_924d)]
    {
        let mut g = Graph::new();
        let x = g.input(DType::F16, &[256, 256]).unwrap();
        let y = g.unary(x, op).unwrap();
        g.set_output(y).unwrap();
        let mut p = Plan::with_guards(g, &CpuBackend::with_threads(3).unwrap(), 64).unwrap();
        p.set_input(x, &all).unwrap();
        p.compute().unwrap();
        let table: Vec<u16> = p.output::<f16>(y).unwrap().iter().map(|h| h.to_bits()).collect();
        let mut h = 1_469_598_103_934_665_603u64;
        for (i, &t) in table.iter().enumerate() {
            if !f16::from_bits(i as u16).is_nan() {
                h = fnv(h, t);
            }
        }
        assert_eq!(h, want_hash, "{} table differs from ggml's", op.name());
        // Every kernel tier gives the same bits (the F32 GELU kernel is in the kernel table).
        let mut tiers = Vec::new();
        let prev = quantgraph::kernels::selected_isa();
        for isa in Isa::ALL.into_iter().filter(|i| i.is_supported()) {
            quantgraph::kernels::set_isa(isa).unwrap();
            let mut g = Graph::new();
            let x = g.input(DType::F32, &[1000]).unwrap();
            let y = g.unary(x, op).unwrap();
            g.set_output(y).unwrap();
            let xs: Vec<f32> = rand_f32(1000, 6).iter().map(|x| x * 12.0).collect();
            tiers.push(run(g, &[(x, xs)], y, 2).iter().map(|v| v.to_bits()).collect::<Vec<_>>());
        }
        quantgraph::kernels::set_isa(prev).unwrap();
        assert!(tiers.windows(2).all(|w| w[0] == w[1]), "{}: tiers differ", op.name());

        // F32 path: saturation outside [-10, 10] (GELU), table lookup of the f16-rounded input.
        let mut xs: Vec<f32> = rand_f32(4096, 5).iter().map(|x| x * 14.0).collect();
        xs.extend([-10.0, 10.0, -10.001, 10.001, 0.0, -0.0, 1e-8, 65504.0, -65504.0, 1e6]);
        let mut g = Graph::new();
        let x = g.input(DType::F32, &[xs.len()]).unwrap();
        let y = g.unary(x, op).unwrap();
        g.set_output(y).unwrap();
        let got = run(g, &[(x, xs.clone())], y, 2);
        for (&x, &r) in xs.iter().zip(&got) {
            let from_table = f16::from_bits(table[f16::from_f32(x).to_bits() as usize]).to_f32();
            let want = match op {
                UnaryOp::Gelu if x <= -10.0 => 0.0,
                UnaryOp::Gelu if x >= 10.0 => x,
                _ => from_table,
            };
            assert_eq!(r.to_bits(), want.to_bits(), "{} f32 x = {x}", op.name());
        }
    }
}

#[test]
fn binary_f32_f16_bf16_combinations_broadcast_in_4_dims() {
    type F = fn(f64, f64) -> f64;
    let ops: [(&str, F); 4] = [
        ("add", |a, b| a + b),
        ("sub", |a, b| a - b),
        ("mul", |a, b| a * b),
        ("div", |a, b| a / b),
    ];
    let ne = [5usize, 7, 11, 13];
    let bshapes = [ne, [5, 1, 1, 1], [1, 7, 1, 13], [5, 1, 11, 1], [1, 1, 1, 1]];
    let combos = [
        (DType::F16, DType::F16),
        (DType::F16, DType::F32),
        (DType::F32, DType::F32),
        (DType::BF16, DType::BF16),
        (DType::BF16, DType::F32),
    ];
    for (ta, tb) in combos {
        for bne in bshapes {
            for permuted_a in [false, true] {
                for (name, f) in ops {
                    let ane = if permuted_a { [7, 5, 11, 13] } else { ne };
                    let mut g = Graph::new();
                    let (xa, a) = source(&mut g, ane, ta, permuted_a);
                    let (xb, b) = source(&mut g, bne, tb, false);
                    let c = match name {
                        "add" => g.add(a, b),
                        "sub" => g.sub(a, b),
                        "mul" => g.mul(a, b),
                        _ => g.div(a, b),
                    }
                    .unwrap();
                    assert_eq!(g.dtype(c).unwrap(), ta);
                    g.set_output(c).unwrap();
                    let va = rand_f32(ne.iter().product(), 1);
                    let vb: Vec<f32> =
                        rand_f32(bne.iter().product(), 2).iter().map(|x| x + 2.5).collect();
                    let got = run(g, &[(xa, va.clone()), (xb, vb.clone())], c, 3);
                    let want: Vec<f64> = each(ne)
                        .map(|i| {
                            let j = [i[0] % bne[0], i[1] % bne[1], i[2] % bne[2], i[3] % bne[3]];
                            f(src_at(&va, ane, i, ta, permuted_a), src_at(&vb, bne, j, tb, false))
                        })
                        .collect();
                    check(&format!("{name} {ta}+{tb} {bne:?} perm={permuted_a}"), &got, &want, ta);
                }
            }
        }
    }
    let mut g = Graph::new();
    let a = g.input(DType::F32, &[4]).unwrap();
    let b = g.input(DType::F16, &[4]).unwrap();
    assert!(matches!(g.add(a, b), Err(Error::Type { .. })), "F32 + F16 is not a ggml combination");
    let c = g.input(DType::BF16, &[4]).unwrap();
    assert!(matches!(g.mul(b, c), Err(Error::Type { .. })), "F16 * BF16 is not one either");
}

/// Simple elementwise ops with parameters: clamp, leaky_relu, sqr, sqrt, log, sin, cos.
#[test]
fn simple_elementwise_ops_f32_f16_bf16() {
    type F = Box<dyn Fn(f64) -> f64>;
    let cases: Vec<(&str, F)> = vec![
        ("clamp", Box::new(|x: f64| x.clamp(-0.5, 0.25))),
        ("leaky_relu", Box::new(|x: f64| if x > 0.0 { x } else { 0.1 * x })),
        ("sqr", Box::new(|x: f64| x * x)),
        ("sqrt", Box::new(|x: f64| x.sqrt())),
        ("log", Box::new(|x: f64| x.ln())),
        ("sin", Box::new(|x: f64| x.sin())),
        ("cos", Box::new(|x: f64| x.cos())),
    ];
    for (name, f) in &cases {
        let positive = matches!(*name, "sqrt" | "log");
        // sqr .. cos are unary-ops.cpp kernels in ggml (BF16 too); clamp and leaky_relu are not.
        let with_bf16 = !matches!(*name, "clamp" | "leaky_relu");
        if !with_bf16 {
            let mut g = Graph::new();
            let x = g.input(DType::BF16, &[8]).unwrap();
            let r = if *name == "clamp" { g.clamp(x, 0.0, 1.0) } else { g.leaky_relu(x, 0.1) };
            assert!(matches!(r, Err(Error::Type { .. })), "{name} BF16");
        }
        let types: &[DType] = if with_bf16 {
            &[DType::F32, DType::F16, DType::BF16]
        } else {
            &[DType::F32, DType::F16]
        };
        for &dt in types {
            for permuted in [false, true] {
                let ne = [5usize, 7, 11, 13];
                let mut g = Graph::new();
                let (x, t) = source(&mut g, ne, dt, permuted);
                let y = match *name {
                    "clamp" => g.clamp(t, -0.5, 0.25),
                    "leaky_relu" => g.leaky_relu(t, 0.1),
                    "sqr" => g.sqr(t),
                    "sqrt" => g.sqrt(t),
                    "log" => g.log(t),
                    "sin" => g.sin(t),
                    _ => g.cos(t),
                }
                .unwrap();
                g.set_output(y).unwrap();
                let v: Vec<f32> = rand_f32(ne.iter().product(), 3)
                    .iter()
                    .map(|&x| if positive { x.abs() * 3.0 + 0.01 } else { x * 3.0 })
                    .collect();
                let got = run(g, &[(x, v.clone())], y, 2);
                let want: Vec<f64> = each(logical(ne, permuted))
                    .map(|i| f(src_at(&v, ne, i, dt, permuted)))
                    .collect();
                check(&format!("{name} {dt} permuted={permuted}"), &got, &want, dt);
            }
        }
    }
}

#[test]
fn add1_add_id_acc_fill() {
    // add1: F32+F32, F16+F16, F16+F32, BF16+BF16, BF16+F32.
    for (ta, tb) in [
        (DType::F32, DType::F32),
        (DType::F16, DType::F16),
        (DType::F16, DType::F32),
        (DType::BF16, DType::BF16),
        (DType::BF16, DType::F32),
    ] {
        let ne = [5usize, 7, 11, 13];
        let mut g = Graph::new();
        let (xa, a) = source(&mut g, ne, ta, false);
        let (xb, b) = source(&mut g, [1, 1, 1, 1], tb, false);
        let c = g.add1(a, b).unwrap();
        g.set_output(c).unwrap();
        let va = rand_f32(ne.iter().product(), 4);
        let got = run(g, &[(xa, va.clone()), (xb, vec![0.3])], c, 3);
        let s = src_at(&[0.3], [1, 1, 1, 1], [0; 4], tb, false);
        let want: Vec<f64> = each(ne).map(|i| src_at(&va, ne, i, ta, false) + s).collect();
        check(&format!("add1 {ta}+{tb}"), &got, &want, ta);
    }

    // add_id: a [n, m, p] + b[:, ids[m, p]].
    let (n, m, p, k) = (9usize, 5usize, 3usize, 4usize);
    let mut g = Graph::new();
    let a = g.input(DType::F32, &[n, m, p]).unwrap();
    let b = g.input(DType::F32, &[n, k]).unwrap();
    let ids = g.input(DType::I32, &[m, p]).unwrap();
    let c = g.add_id(a, b, ids).unwrap();
    g.set_output(c).unwrap();
    let be = CpuBackend::with_threads(2).unwrap();
    let mut pl = Plan::with_guards(g, &be, 64).unwrap();
    let va = rand_f32(n * m * p, 5);
    let vb = rand_f32(n * k, 6);
    let vi: Vec<i32> = (0..(m * p) as i32).map(|i| (i * 7 + 1) % k as i32).collect();
    pl.set_input(a, &va).unwrap();
    pl.set_input(b, &vb).unwrap();
    pl.set_input(ids, &vi).unwrap();
    pl.compute().unwrap();
    let got = pl.output::<f32>(c).unwrap().to_vec();
    let want: Vec<f64> = each([n, m, p, 1])
        .map(|i| {
            va[flat([n, m, p, 1], i)] as f64 + vb[vi[i[1] + i[2] * m] as usize * n + i[0]] as f64
        })
        .collect();
    check("add_id", &got, &want, DType::F32);
    let mut bad = vi.clone();
    bad[3] = k as i32;
    pl.set_input(ids, &bad).unwrap();
    assert!(matches!(pl.compute(), Err(Error::IndexOutOfRange { op: "add_id", .. })));

    // acc: b [3, 4, 2] added into a [10, 6, 3] at a strided view with an offset.
    let ane = [10usize, 6, 3, 1];
    let bne = [3usize, 4, 2, 1];
    let nb = [10 * 4, 10 * 6 * 4, 10 * 6 * 3 * 4];
    let offset = (2 + 10) * 4;
    for threads in [1, 3] {
        let mut g = Graph::new();
        let a = g.input(DType::F32, &ane).unwrap();
        let b = g.input(DType::F32, &bne).unwrap();
        let c = g.acc(a, b, nb, offset).unwrap();
        g.set_output(c).unwrap();
        let va = rand_f32(ane.iter().product(), 7);
        let vb = rand_f32(bne.iter().product(), 8);
        let got = run(g, &[(a, va.clone()), (b, vb.clone())], c, threads);
        let mut want: Vec<f64> = va.iter().map(|&x| x as f64).collect();
        for i in each(bne) {
            let byte = offset + i[0] * 4 + i[1] * nb[0] + i[2] * nb[1] + i[3] * nb[2];
            want[byte / 4] += vb[flat(bne, i)] as f64;
        }
        check("acc", &got, &want, DType::F32);
    }
    let mut g = Graph::new();
    let a = g.input(DType::F32, &ane).unwrap();
    let b = g.input(DType::F32, &bne).unwrap();
    assert!(g.acc(a, b, nb, 10 * 6 * 4 * 2).is_err(), "view past the end of a");
    assert!(g.acc(a, b, nb, 10 * 6 * 4).is_ok(), "the last byte fits exactly");
    assert!(g.acc(a, b, nb, 2).is_err(), "unaligned offset");

    // fill: F32 and F16, the source's values do not matter.
    for dt in [DType::F32, DType::F16] {
        let ne = [5usize, 7, 11, 13];
        let mut g = Graph::new();
        let (x, t) = source(&mut g, ne, dt, false);
        let y = g.fill(t, -2.75).unwrap();
        g.set_output(y).unwrap();
        let got = run(g, &[(x, rand_f32(ne.iter().product(), 9))], y, 3);
        assert!(got.iter().all(|&v| v == -2.75), "fill {dt}");
    }
}

#[test]
fn tri_diag_and_diag_masks() {
    let ne = [7usize, 7, 3, 2];
    let v = rand_f32(ne.iter().product(), 10);
    for kind in [TriType::UpperDiag, TriType::Upper, TriType::LowerDiag, TriType::Lower] {
        let mut g = Graph::new();
        let x = g.input(DType::F32, &ne).unwrap();
        let y = g.tri(x, kind).unwrap();
        g.set_output(y).unwrap();
        let got = run(g, &[(x, v.clone())], y, 3);
        let want: Vec<f64> = each(ne)
            .map(|i| {
                let keep = match kind {
                    TriType::UpperDiag => i[0] >= i[1],
                    TriType::Upper => i[0] > i[1],
                    TriType::LowerDiag => i[0] <= i[1],
                    TriType::Lower => i[0] < i[1],
                    other => panic!("no reference for {other:?}"),
                };
                if keep { v[flat(ne, i)] as f64 } else { 0.0 }
            })
            .collect();
        assert_eq!(nmse(&got, &want), 0.0, "tri {kind:?}");
    }
    let mut g = Graph::new();
    let x = g.input(DType::F32, &[5, 7]).unwrap();
    assert!(g.tri(x, TriType::Lower).is_err(), "tri needs square matrices");

    // diag: [n, 1, p, q] -> [n, n, p, q].
    let dne = [6usize, 1, 3, 2];
    let dv = rand_f32(dne.iter().product(), 11);
    let mut g = Graph::new();
    let x = g.input(DType::F32, &dne).unwrap();
    let y = g.diag(x).unwrap();
    g.set_output(y).unwrap();
    let got = run(g, &[(x, dv.clone())], y, 2);
    let want: Vec<f64> = each([6, 6, 3, 2])
        .map(|i| if i[0] == i[1] { dv[flat(dne, [i[0], 0, i[2], i[3]])] as f64 } else { 0.0 })
        .collect();
    assert_eq!(nmse(&got, &want), 0.0, "diag");

    // diag_mask_inf / diag_mask_zero with n_past, on a non-square batch.
    let mne = [10usize, 4, 3, 1];
    let mv = rand_f32(mne.iter().product(), 12);
    for n_past in [0usize, 3] {
        for inf in [true, false] {
            let mut g = Graph::new();
            let x = g.input(DType::F32, &mne).unwrap();
            let y = if inf { g.diag_mask_inf(x, n_past) } else { g.diag_mask_zero(x, n_past) };
            let y = y.unwrap();
            g.set_output(y).unwrap();
            let got = run(g, &[(x, mv.clone())], y, 3);
            for i in each(mne) {
                let masked = i[0] > n_past + i[1];
                let w = if !masked {
                    mv[flat(mne, i)]
                } else if inf {
                    f32::NEG_INFINITY
                } else {
                    0.0
                };
                assert_eq!(got[flat(mne, i)], w, "diag_mask inf={inf} n_past={n_past} {i:?}");
            }
        }
    }
}

fn glu_ref(op: GluOp, x: f64, g: f64, dt: DType, alpha: f64, limit: f64) -> f64 {
    match op {
        GluOp::Reglu => x.max(0.0) * g,
        GluOp::Geglu if dt == DType::BF16 => gelu_tanh(x) * g,
        GluOp::GegluQuick if dt == DType::BF16 => gelu_quick(x) * g,
        GluOp::Geglu => {
            // ggml's table (f16 input bits; F32 saturates outside [-10, 10]).
            if dt == DType::F32 && x <= -10.0 {
                0.0
            } else if dt == DType::F32 && x >= 10.0 {
                x * g
            } else {
                r16(gelu_tanh(r16(x))) * g
            }
        }
        GluOp::Swiglu => x / (1.0 + (-x).exp()) * g,
        GluOp::SwigluOai => {
            let x = x.min(limit);
            let g = g.clamp(-limit, limit);
            x / (1.0 + (-alpha * x).exp()) * (g + 1.0)
        }
        GluOp::GegluErf => 0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2)) * g,
        GluOp::GegluQuick => r16(gelu_quick(r16(x))) * g,
        GluOp::SwigluClamp => {
            let x = x.min(limit);
            x / (1.0 + (-x).exp()) * g.clamp(-limit, limit)
        }
        _ => unreachable!(),
    }
}

#[test]
fn glu_every_op_fused_swapped_and_split_f32_f16_bf16() {
    let ops = common::GLU_OPS;
    let (alpha, limit) = (1.702f32, 0.6f32);
    for op in ops {
        for dt in [DType::F32, DType::F16, DType::BF16] {
            if dt == DType::BF16 && matches!(op, GluOp::SwigluOai | GluOp::SwigluClamp) {
                continue; // F32 / F16 only, as ggml
            }
            for form in ["fused", "swapped", "split"] {
                let ne = [2 * 7usize, 5, 3, 2];
                let hne = [7usize, 5, 3, 2];
                let mut g = Graph::new();
                let (xa, a) = source(&mut g, if form == "split" { hne } else { ne }, dt, false);
                let (xb, b) = source(&mut g, hne, dt, false);
                let y = match (op, form) {
                    (GluOp::SwigluOai, "split") => g.swiglu_oai(a, Some(b), alpha, limit),
                    (GluOp::SwigluOai, "fused") => g.swiglu_oai(a, None, alpha, limit),
                    (GluOp::SwigluOai, _) => continue, // ggml_swiglu_oai has no swapped form
                    (GluOp::SwigluClamp, "split") => g.swiglu_clamp(a, Some(b), limit),
                    (GluOp::SwigluClamp, "fused") => g.swiglu_clamp(a, None, limit),
                    (GluOp::SwigluClamp, _) => continue, // nor has ggml_swiglu_clamp
                    (_, "split") => g.glu_split(a, b, op),
                    (_, s) => g.glu(a, op, s == "swapped"),
                }
                .unwrap();
                assert_eq!(g.shape(y).unwrap(), hne);
                g.set_output(y).unwrap();
                let na: usize = if form == "split" { hne } else { ne }.iter().product();
                let va: Vec<f32> = rand_f32(na, 13).iter().map(|x| x * 3.0).collect();
                let vb: Vec<f32> = rand_f32(hne.iter().product(), 14);
                let mut inputs = vec![(xa, va.clone())];
                if form == "split" {
                    inputs.push((xb, vb.clone()));
                }
                // xb is unused in the fused forms; the plan leaves it out.
                let got = run(g, &inputs, y, 3);
                let want: Vec<f64> = each(hne)
                    .map(|i| {
                        let (x, gate) = match form {
                            "split" => {
                                (src_at(&va, hne, i, dt, false), src_at(&vb, hne, i, dt, false))
                            }
                            "fused" => (
                                src_at(&va, ne, i, dt, false),
                                src_at(&va, ne, [i[0] + 7, i[1], i[2], i[3]], dt, false),
                            ),
                            _ => (
                                src_at(&va, ne, [i[0] + 7, i[1], i[2], i[3]], dt, false),
                                src_at(&va, ne, i, dt, false),
                            ),
                        };
                        glu_ref(op, x, gate, dt, alpha as f64, limit as f64)
                    })
                    .collect();
                check(&format!("{} {dt} {form}", op.name()), &got, &want, dt);
            }
        }
    }
    let mut g = Graph::new();
    let a = g.input(DType::F32, &[8, 2]).unwrap();
    let b = g.input(DType::F32, &[8, 3]).unwrap();
    assert!(g.glu_split(a, b, GluOp::Swiglu).is_err(), "split halves must match");
    assert!(g.swiglu_oai(a, None, 1.0, -1.0).is_err(), "negative limit");
    assert!(g.swiglu_clamp(a, None, f32::INFINITY).is_err(), "infinite limit");
    let hb = g.cast(a, DType::BF16).unwrap();
    assert!(g.swiglu_clamp(hb, None, 1.0).is_err(), "no BF16 clamped SwiGLU");
    assert!(g.glu(hb, GluOp::Geglu, false).is_ok());
    let h = g.cast(a, DType::F16).unwrap();
    assert!(g.glu_split(a, h, GluOp::Reglu).is_err(), "types must match");
}

fn rows(v: &[f32], n: usize) -> impl Iterator<Item = &[f32]> {
    v.chunks(n)
}

#[test]
fn norm_rms_norm_mul_group_norm_l2_norm() {
    for ne in [[5usize, 7, 11, 13], [64, 3, 2, 1]] {
        let v: Vec<f32> = rand_f32(ne.iter().product(), 15).iter().map(|x| x * 3.0 + 0.5).collect();
        // norm, on a permuted (strided) source as well.
        for permuted in [false, true] {
            let mut g = Graph::new();
            let (x, t) = source(&mut g, ne, DType::F32, permuted);
            let y = g.norm(t, 1e-5).unwrap();
            g.set_output(y).unwrap();
            let got = run(g, &[(x, v.clone())], y, 3);
            let lne = logical(ne, permuted);
            let src: Vec<f64> =
                each(lne).map(|i| src_at(&v, ne, i, DType::F32, permuted)).collect();
            let mut want = Vec::new();
            for row in src.chunks(lne[0]) {
                let mean = row.iter().sum::<f64>() / lne[0] as f64;
                let var = row.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / lne[0] as f64;
                want.extend(row.iter().map(|x| (x - mean) / (var + 1e-5).sqrt()));
            }
            check(&format!("norm {ne:?} permuted={permuted}"), &got, &want, DType::F32);

            // l2_norm
            let mut g = Graph::new();
            let (x, t) = source(&mut g, ne, DType::F32, permuted);
            let y = g.l2_norm(t, 1e-12).unwrap();
            g.set_output(y).unwrap();
            let got = run(g, &[(x, v.clone())], y, 2);
            let mut want = Vec::new();
            for row in src.chunks(lne[0]) {
                let n2 = row.iter().map(|x| x * x).sum::<f64>().sqrt().max(1e-12);
                want.extend(row.iter().map(|x| x / n2));
            }
            check(&format!("l2_norm {ne:?} permuted={permuted}"), &got, &want, DType::F32);
        }

        // rms_norm_mul with a weight broadcast over rows and dims 2..3, and a full weight.
        for wne in [[ne[0], 1, 1, 1], [ne[0], 1, ne[2], 1], ne] {
            let mut g = Graph::new();
            let x = g.input(DType::F32, &ne).unwrap();
            let w = g.input(DType::F32, &wne).unwrap();
            let y = g.rms_norm_mul(x, w, 1e-6).unwrap();
            g.set_output(y).unwrap();
            let vw = rand_f32(wne.iter().product(), 16);
            let got = run(g, &[(x, v.clone()), (w, vw.clone())], y, 3);
            let mut want = Vec::new();
            for (r, row) in rows(&v, ne[0]).enumerate() {
                let ms = row.iter().map(|&x| x as f64 * x as f64).sum::<f64>() / ne[0] as f64;
                let (i1, i2, i3) = (r % ne[1], (r / ne[1]) % ne[2], r / (ne[1] * ne[2]));
                for (i0, &x) in row.iter().enumerate() {
                    let wi = [i0, i1 % wne[1], i2 % wne[2], i3 % wne[3]];
                    want.push(x as f64 / (ms + 1e-6).sqrt() * vw[flat(wne, wi)] as f64);
                }
            }
            check(&format!("rms_norm_mul {ne:?} w {wne:?}"), &got, &want, DType::F32);
        }
    }
    // rms_norm_mul agrees with rms_norm followed by mul (same f32 rounding of the scale).
    let ne = [33usize, 4, 3, 1];
    let mut g = Graph::new();
    let x = g.input(DType::F32, &ne).unwrap();
    let w = g.input(DType::F32, &[33]).unwrap();
    let fused = g.rms_norm_mul(x, w, 1e-6).unwrap();
    let r = g.rms_norm(x, 1e-6).unwrap();
    let unfused = g.mul(r, w).unwrap();
    g.set_output(fused).unwrap();
    g.set_output(unfused).unwrap();
    let p = plan(g, &[(x, rand_f32(33 * 12, 17)), (w, rand_f32(33, 18))], 2);
    let (a, b) = (p.output::<f32>(fused).unwrap(), p.output::<f32>(unfused).unwrap());
    let want: Vec<f64> = b.iter().map(|&v| v as f64).collect();
    assert!(nmse(a, &want) < 1e-12);

    // group_norm: groups of ceil(C / G) channels, statistics per sample.
    for (ne, groups) in [([6usize, 5, 8, 2], 4usize), ([5, 3, 7, 2], 3), ([4, 4, 5, 1], 1)] {
        let v: Vec<f32> = rand_f32(ne.iter().product(), 19).iter().map(|x| x * 2.0 + 1.0).collect();
        let mut g = Graph::new();
        let x = g.input(DType::F32, &ne).unwrap();
        let y = g.group_norm(x, groups, 1e-6).unwrap();
        g.set_output(y).unwrap();
        let got = run(g, &[(x, v.clone())], y, 3);
        let per = ne[2].div_ceil(groups);
        let mut want = vec![0f64; v.len()];
        for i3 in 0..ne[3] {
            for gi in 0..groups {
                let (c0, c1) = ((gi * per).min(ne[2]), ((gi + 1) * per).min(ne[2]));
                let idx: Vec<usize> = each(ne)
                    .filter(|i| i[3] == i3 && i[2] >= c0 && i[2] < c1)
                    .map(|i| flat(ne, i))
                    .collect();
                if idx.is_empty() {
                    continue;
                }
                let n = idx.len() as f64;
                let mean = idx.iter().map(|&k| v[k] as f64).sum::<f64>() / n;
                let var = idx.iter().map(|&k| (v[k] as f64 - mean).powi(2)).sum::<f64>() / n;
                for &k in &idx {
                    want[k] = (v[k] as f64 - mean) / (var + 1e-6).sqrt();
                }
            }
        }
        check(&format!("group_norm {ne:?} groups {groups}"), &got, &want, DType::F32);
    }
}

#[test]
fn sum_sum_rows_mean_cumsum() {
    for ne in [[5usize, 7, 11, 13], [128, 2, 2, 2]] {
        let v = rand_f32(ne.iter().product(), 20);
        for permuted in [false, true] {
            let lne = logical(ne, permuted);
            let src: Vec<f64> =
                each(lne).map(|i| src_at(&v, ne, i, DType::F32, permuted)).collect();
            for what in ["sum_rows", "mean", "cumsum"] {
                let mut g = Graph::new();
                let (x, t) = source(&mut g, ne, DType::F32, permuted);
                let y = match what {
                    "sum_rows" => g.sum_rows(t),
                    "mean" => g.mean(t),
                    _ => g.cumsum(t),
                }
                .unwrap();
                g.set_output(y).unwrap();
                let got = run(g, &[(x, v.clone())], y, 3);
                let mut want = Vec::new();
                for row in src.chunks(lne[0]) {
                    match what {
                        "sum_rows" => want.push(row.iter().sum::<f64>()),
                        "mean" => want.push(row.iter().sum::<f64>() / lne[0] as f64),
                        _ => {
                            let mut s = 0.0;
                            want.extend(row.iter().map(|x| {
                                s += x;
                                s
                            }));
                        }
                    }
                }
                check(&format!("{what} {ne:?} permuted={permuted}"), &got, &want, DType::F32);
            }
        }
        // sum: F32 (f64 accumulation), F16 and BF16 (f32 accumulation, result in the type).
        for dt in [DType::F32, DType::F16, DType::BF16] {
            let mut g = Graph::new();
            let (x, t) = source(&mut g, ne, dt, true);
            let y = g.sum(t).unwrap();
            assert_eq!(g.shape(y).unwrap(), [1, 1, 1, 1]);
            g.set_output(y).unwrap();
            let got = run(g, &[(x, v.clone())], y, 2);
            let want: f64 = each(logical(ne, true)).map(|i| src_at(&v, ne, i, dt, true)).sum();
            let lim = match dt {
                DType::F16 => 1e-5 * (ne[0] as f64),
                DType::BF16 => 1e-2 * want.abs().max(1.0),
                _ => 1e-5,
            };
            assert!(
                (got[0] as f64 - want).abs() <= lim.max(want.abs() * 1e-3),
                "sum {dt}: {got:?} {want}"
            );
        }
    }
}

#[test]
fn argmax_count_equal_argsort_top_k_exact() {
    // argmax: ties give the last index, as ggml's running MAX.
    let (n, m) = (37usize, 9usize);
    let mut v = rand_f32(n * m, 22);
    v[2 * n + 5] = 5.0;
    v[2 * n + 30] = 5.0; // tie in row 2: index 30
    let mut g = Graph::new();
    let x = g.input(DType::F32, &[n, m]).unwrap();
    let y = g.argmax(x).unwrap();
    g.set_output(y).unwrap();
    let p = plan(g, &[(x, v.clone())], 3);
    let got = p.output::<i32>(y).unwrap().to_vec();
    let want: Vec<i32> = (0..m)
        .map(|r| {
            let row = &v[r * n..(r + 1) * n];
            let mx = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            row.iter().rposition(|&x| x == mx).unwrap() as i32
        })
        .collect();
    assert_eq!(got, want);
    assert_eq!(got[2], 30);

    // count_equal over I32, across thread counts.
    let ne = [5usize, 7, 11, 13];
    let total: usize = ne.iter().product();
    let va: Vec<i32> = (0..total as i32).map(|i| (i * 31 + 7) % 5).collect();
    let vb: Vec<i32> = (0..total as i32).map(|i| (i * 17 + 3) % 5).collect();
    let want = va.iter().zip(&vb).filter(|(a, b)| a == b).count() as i64;
    for threads in [1, 2, 3] {
        let mut g = Graph::new();
        let a = g.input(DType::I32, &ne).unwrap();
        let b = g.input(DType::I32, &ne).unwrap();
        let c = g.count_equal(a, b).unwrap();
        g.set_output(c).unwrap();
        let mut p = Plan::with_guards(g, &CpuBackend::with_threads(threads).unwrap(), 64).unwrap();
        p.set_input(a, &va).unwrap();
        p.set_input(b, &vb).unwrap();
        p.compute().unwrap();
        assert_eq!(p.output::<i64>(c).unwrap(), &[want], "{threads} threads");
    }

    // argsort asc/desc and top_k on odd rows, contiguous and permuted.
    for ne in [[13usize, 7, 3, 2], [1, 5, 1, 1], [200, 3, 1, 1]] {
        let v = rand_f32(ne.iter().product(), 23);
        for permuted in [false, true] {
            let lne = logical(ne, permuted);
            let src: Vec<f64> =
                each(lne).map(|i| src_at(&v, ne, i, DType::F32, permuted)).collect();
            for order in [SortOrder::Asc, SortOrder::Desc] {
                let mut g = Graph::new();
                let (x, t) = source(&mut g, ne, DType::F32, permuted);
                let y = g.argsort(t, order).unwrap();
                g.set_output(y).unwrap();
                let p = plan(g, &[(x, v.clone())], 3);
                let got = p.output::<i32>(y).unwrap();
                for (r, row) in src.chunks(lne[0]).enumerate() {
                    let mut idx: Vec<i32> = (0..lne[0] as i32).collect();
                    idx.sort_by(|&a, &b| {
                        let o = row[a as usize].partial_cmp(&row[b as usize]).unwrap();
                        if order == SortOrder::Desc { o.reverse() } else { o }
                    });
                    assert_eq!(&got[r * lne[0]..(r + 1) * lne[0]], &idx[..], "argsort {order:?}");
                }
            }
            for k in [1usize, lne[0].min(2), lne[0].min(5), lne[0]] {
                let mut g = Graph::new();
                let (x, t) = source(&mut g, ne, DType::F32, permuted);
                let y = g.top_k(t, k).unwrap();
                g.set_output(y).unwrap();
                let p = plan(g, &[(x, v.clone())], 2);
                let got = p.output::<i32>(y).unwrap();
                for (r, row) in src.chunks(lne[0]).enumerate() {
                    let mut idx: Vec<i32> = (0..lne[0] as i32).collect();
                    idx.sort_by(|&a, &b| row[b as usize].partial_cmp(&row[a as usize]).unwrap());
                    let mut want: Vec<i32> = idx[..k].to_vec();
                    if k > 1 {
                        want.swap(0, 1); // ggml swaps the first two to show order is not meaningful
                    }
                    assert_eq!(&got[r * k..(r + 1) * k], &want[..], "top_k {k}");
                }
            }
        }
    }
}

/// In-place variants write into a strided view in the middle of a state buffer; every byte
/// outside the view's elements (including the gaps between its rows) must stay untouched.
#[test]
fn inplace_ops_write_only_their_view_of_a_state_buffer() {
    let guard = 0xA5u8;
    // The view: [7, 4, 3] F32 elements, rows 40 bytes apart (12-byte gaps), planes 200 bytes
    // apart, starting at byte 96 of a 1024-byte buffer.
    let (ne, nb1, nb2, off) = ([7usize, 4, 3, 1], 40usize, 200usize, 96usize);
    let addr = |i: [usize; 4]| off + i[0] * 4 + i[1] * nb1 + i[2] * nb2;
    type Build = fn(&mut Graph, TensorId, TensorId) -> TensorId;
    type Want = fn(f64, f64, [usize; 4]) -> f64;
    let cases: Vec<(&str, Build, Want)> = vec![
        (
            "silu",
            |g, v, _| g.unary_inplace(v, UnaryOp::Silu).unwrap(),
            |x, _, _| x / (1.0 + (-x).exp()),
        ),
        ("tanh", |g, v, _| g.unary_inplace(v, UnaryOp::Tanh).unwrap(), |x, _, _| x.tanh()),
        ("add", |g, v, b| g.add_inplace(v, b).unwrap(), |x, b, _| x + b),
        ("mul", |g, v, b| g.mul_inplace(v, b).unwrap(), |x, b, _| x * b),
        ("sub", |g, v, b| g.sub_inplace(v, b).unwrap(), |x, b, _| x - b),
        ("div", |g, v, b| g.div_inplace(v, b).unwrap(), |x, b, _| x / b),
        ("sqr", |g, v, _| g.sqr_inplace(v).unwrap(), |x, _, _| x * x),
        ("sin", |g, v, _| g.sin_inplace(v).unwrap(), |x, _, _| x.sin()),
        ("cos", |g, v, _| g.cos_inplace(v).unwrap(), |x, _, _| x.cos()),
        (
            "add1",
            |g, v, s| {
                let s = g.view_1d(s, 1, 0).unwrap();
                g.add1_inplace(v, s).unwrap()
            },
            |x, _, _| x + 0.5,
        ),
        (
            "leaky_relu",
            |g, v, _| g.leaky_relu_inplace(v, 0.25).unwrap(),
            |x, _, _| if x > 0.0 { x } else { 0.25 * x },
        ),
        (
            "diag_mask_inf",
            |g, v, _| g.diag_mask_inf_inplace(v, 1).unwrap(),
            |x, _, i| {
                if i[0] > 1 + i[1] { f64::NEG_INFINITY } else { x }
            },
        ),
        ("norm", |g, v, _| g.norm_inplace(v, 1e-5).unwrap(), |_, _, _| f64::NAN),
        (
            "fill",
            |g, v, _| {
                // fill needs a contiguous tensor: fill one contiguous row of the view in place.
                let row = g.view_1d(v, 7, 0).unwrap();
                g.fill_inplace(row, 3.5).unwrap()
            },
            |x, _, i| if i[1] == 0 && i[2] == 0 { 3.5 } else { x },
        ),
    ];
    for (name, build, f) in cases {
        let buf = Buffer::alloc(1024).unwrap();
        buf.fill(guard).unwrap();
        let vals = rand_f32(ne.iter().product(), 24);
        for i in each(ne) {
            buf.write_f32(addr(i), &[vals[flat(ne, i)] * 2.0]).unwrap();
        }
        let mut g = Graph::new();
        // The state is typed F32 over the whole buffer; the view picks the strided block.
        let st = g.state(DType::F32, &[256], &buf, 0).unwrap();
        let v = g.view_4d(st, ne, [nb1, nb2, nb2 * 3], off).unwrap();
        let b = g.input(DType::F32, &[7, 1, 3]).unwrap();
        let y = build(&mut g, v, b);
        g.set_output(y).unwrap();
        let vb: Vec<f32> = rand_f32(21, 25).iter().map(|x| x + 0.5).collect();
        let vb: Vec<f32> = if name == "add1" { vec![0.5; 21] } else { vb };
        let be = CpuBackend::with_threads(3).unwrap();
        let mut p = Plan::with_guards(g, &be, 64).unwrap();
        if p.set_input(b, &vb).is_err() {
            // b unused by this op: the plan left it out.
        }
        p.compute().unwrap();
        let bytes = buf.with_bytes(|s| s.to_vec()).unwrap();
        let mut inside = vec![false; 1024];
        for i in each(ne) {
            for k in 0..4 {
                inside[addr(i) + k] = true;
            }
        }
        for (k, &byte) in bytes.iter().enumerate() {
            if !inside[k] {
                assert_eq!(byte, guard, "{name}: byte {k} outside the view was written");
            }
        }
        let got: Vec<f32> = each(ne)
            .map(|i| f32::from_le_bytes(bytes[addr(i)..addr(i) + 4].try_into().unwrap()))
            .collect();
        let x = |i: [usize; 4]| vals[flat(ne, i)] as f64 * 2.0;
        let want: Vec<f64> = if name == "norm" {
            let mut w = Vec::new();
            for r in 0..12 {
                let row: Vec<f64> = (0..7).map(|i0| x([i0, r % 4, r / 4, 0])).collect();
                let mean = row.iter().sum::<f64>() / 7.0;
                let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 7.0;
                w.extend(row.iter().map(|v| (v - mean) / (var + 1e-5).sqrt()));
            }
            w
        } else {
            each(ne).map(|i| f(x(i), vb[i[0] + 7 * i[2]] as f64, i)).collect()
        };
        if name == "diag_mask_inf" {
            for (g, w) in got.iter().zip(&want) {
                assert!(*g as f64 == *w || (g.is_infinite() && w.is_infinite()), "{name}");
            }
        } else {
            check(name, &got, &want, DType::F32);
        }
    }

    // In place on an intermediate: the result is readable as an output, and the source's
    // memory is not handed to a later node.
    let mut g = Graph::new();
    let x = g.input(DType::F32, &[9, 4]).unwrap();
    let y = g.scale(x, 2.0).unwrap();
    let z = g.unary_inplace(y, UnaryOp::Neg).unwrap();
    let w = g.add(x, x).unwrap(); // may reuse freed memory: must not be z's
    g.set_output(z).unwrap();
    g.set_output(w).unwrap();
    let v = rand_f32(36, 28);
    let p = plan(g, &[(x, v.clone())], 2);
    let got = p.output::<f32>(z).unwrap();
    assert!(got.iter().zip(&v).all(|(g, x)| *g == -2.0 * x), "neg in place of scale");
    assert!(p.output::<f32>(w).unwrap().iter().zip(&v).all(|(g, x)| *g == 2.0 * x));

    // In place on a weight is refused.
    let w = Buffer::from_host(vec![0u8; 64]);
    let mut g = Graph::new();
    let t = g.weight(DType::F32, &[16], &w, 0).unwrap();
    assert!(matches!(g.unary_inplace(t, UnaryOp::Neg), Err(Error::Buffer(_))));
}

#[test]
fn results_are_bitwise_identical_for_1_2_3_threads() {
    let ne = [37usize, 9, 5, 3];
    let v: Vec<f32> = rand_f32(ne.iter().product(), 26).iter().map(|x| x * 5.0).collect();
    let w = rand_f32(37, 27);
    let build = |which: usize| {
        let mut g = Graph::new();
        let x = g.input(DType::F32, &ne).unwrap();
        let wt = g.input(DType::F32, &[37]).unwrap();
        let p = g.permute(x, [1, 0, 2, 3]).unwrap();
        let y = match which {
            0 => g.unary(p, UnaryOp::Gelu).unwrap(),
            1 => g.norm(p, 1e-5).unwrap(),
            2 => g.rms_norm_mul(x, wt, 1e-6).unwrap(),
            3 => g.glu(x, GluOp::Swiglu, true).unwrap(),
            4 => g.group_norm(x, 2, 1e-6).unwrap(),
            5 => g.sum_rows(p).unwrap(),
            6 => {
                let h = g.cast(x, DType::F16).unwrap();
                let s = g.unary(h, UnaryOp::GeluErf).unwrap();
                g.cast(s, DType::F32).unwrap()
            }
            _ => {
                let s = g.cumsum(p).unwrap();
                g.l2_norm(s, 1e-12).unwrap()
            }
        };
        g.set_output(y).unwrap();
        (g, x, wt, y)
    };
    for which in 0..8 {
        let mut outs = Vec::new();
        for threads in [1, 2, 3] {
            let (g, x, wt, y) = build(which);
            let mut inputs = vec![(x, v.clone())];
            if which == 2 {
                inputs.push((wt, w.clone()));
            }
            outs.push(run(g, &inputs, y, threads));
        }
        let bits = |o: &Vec<f32>| o.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&outs[0]), bits(&outs[1]), "case {which}: 1 vs 2 threads");
        assert_eq!(bits(&outs[0]), bits(&outs[2]), "case {which}: 1 vs 3 threads");
    }
}

#[test]
fn bad_parameters_and_shapes_return_err_at_build_time() {
    let mut g = Graph::new();
    let a = g.input(DType::F32, &[8, 4]).unwrap();
    let i = g.input(DType::I32, &[8, 4]).unwrap();
    let e = g.unary(i, UnaryOp::Abs).unwrap_err().to_string();
    assert!(e.contains("abs") && e.contains("i32"), "{e}");
    assert!(g.xielu(a, f32::NAN, 0.8, 0.5, 1e-6).is_err());
    assert!(g.clamp(a, 1.0, -1.0).is_err());
    assert!(g.clamp(a, f32::NAN, 1.0).is_err());
    assert!(g.leaky_relu(a, f32::INFINITY).is_err());
    assert!(g.norm(a, -1.0).is_err());
    assert!(g.l2_norm(a, f32::NAN).is_err());
    assert!(g.group_norm(a, 0, 1e-6).is_err());
    let e = g.top_k(a, 9).unwrap_err().to_string();
    assert!(e.contains("top_k") && e.contains("k = 9"), "{e}");
    assert!(g.top_k(a, 0).is_err());
    assert!(g.argsort(i, SortOrder::Asc).is_err());
    let c = g.input(DType::F32, &[8, 4, 2]).unwrap();
    assert!(g.argmax(c).is_err(), "argmax takes a matrix");
    let i2 = g.input(DType::I32, &[8, 3]).unwrap();
    assert!(g.count_equal(i, i2).is_err());
    assert!(g.count_equal(a, a).is_err());
    let b = g.input(DType::F32, &[2]).unwrap();
    assert!(g.add1(a, b).is_err(), "add1 needs a scalar");
    assert!(g.diag(a).is_err(), "diag needs ne[1] == 1");
    let w = g.input(DType::F32, &[7]).unwrap();
    assert!(g.rms_norm_mul(a, w, 1e-6).is_err());
    let one = g.input(DType::F32, &[1, 4]).unwrap();
    assert!(g.glu(one, GluOp::Geglu, false).is_err(), "nothing to split");
    let t = g.transpose(a).unwrap();
    assert!(g.fill(t, 1.0).is_err(), "fill needs a contiguous tensor");
    let ids = g.input(DType::I32, &[3, 1]).unwrap();
    let bb = g.input(DType::F32, &[8, 5]).unwrap();
    assert!(g.add_id(a, bb, ids).is_err(), "ids must be [a.ne1, a.ne2]");
}

/// test-backend-ops' `v` variants: the op reads a view of the first rows/planes of a larger
/// tensor (strided rows); GLU inputs span [-150, 150] to catch NaNs in the saturated GELU range.
#[test]
fn unary_and_glu_on_views_of_larger_tensors() {
    let ne = [6usize, 3, 2, 2];
    let big = [ne[0] * 3, ne[1] * 2, ne[2] * 5, ne[3] * 4];
    let n_big: usize = big.iter().product();
    let view_of = |g: &mut Graph, dt: DType, sub: [usize; 4]| {
        let x = g.input(DType::F32, &big).unwrap();
        let t = if dt == DType::F16 { g.cast(x, DType::F16).unwrap() } else { x };
        let nb = g.strides(t).unwrap();
        (x, g.view_4d(t, sub, [nb[1], nb[2], nb[3]], 0).unwrap())
    };
    let big_at = |v: &[f32], i: [usize; 4], dt: DType| {
        let x = v[flat(big, i)] as f64;
        if dt == DType::F16 { r16(x) } else { x }
    };
    for op in all_unary() {
        for dt in [DType::F32, DType::F16] {
            let mut g = Graph::new();
            let (x, a) = view_of(&mut g, dt, ne);
            let y = match op {
                UnaryOp::Xielu { .. } => {
                    let (an, ap, b, e) = XIELU;
                    g.xielu(a, an, ap, b, e).unwrap()
                }
                _ => g.unary(a, op).unwrap(),
            };
            g.set_output(y).unwrap();
            let v: Vec<f32> = rand_f32(n_big, 29).iter().map(|x| x * 4.0).collect();
            let got = run(g, &[(x, v.clone())], y, 3);
            let want: Vec<f64> = each(ne).map(|i| unary_ref(op, big_at(&v, i, dt))).collect();
            check(&format!("{} {dt} view", op.name()), &got, &want, dt);
        }
    }
    let glu_ne = [2 * ne[0], ne[1], ne[2], ne[3]];
    let glu_big = [glu_ne[0] * 3, glu_ne[1], glu_ne[2], glu_ne[3]];
    let n_glu: usize = glu_big.iter().product();
    for op in [GluOp::Reglu, GluOp::Geglu, GluOp::Swiglu, GluOp::GegluErf, GluOp::GegluQuick] {
        for dt in [DType::F32, DType::F16] {
            for swapped in [false, true] {
                let mut g = Graph::new();
                let x = g.input(DType::F32, &glu_big).unwrap();
                let t = if dt == DType::F16 { g.cast(x, DType::F16).unwrap() } else { x };
                let nb = g.strides(t).unwrap();
                let a = g.view_4d(t, glu_ne, [nb[1], nb[2], nb[3]], 0).unwrap();
                let y = g.glu(a, op, swapped).unwrap();
                g.set_output(y).unwrap();
                let v: Vec<f32> = rand_f32(n_glu, 30).iter().map(|x| x * 150.0).collect();
                let got = run(g, &[(x, v.clone())], y, 2);
                assert!(got.iter().all(|x| x.is_finite()), "{} {dt}: non-finite", op.name());
                let at = |i: [usize; 4]| {
                    let x = v[flat(glu_big, i)] as f64;
                    if dt == DType::F16 { r16(x) } else { x }
                };
                let want: Vec<f64> = each(ne)
                    .map(|i| {
                        let hi = [i[0] + ne[0], i[1], i[2], i[3]];
                        let (xv, gv) = if swapped { (at(hi), at(i)) } else { (at(i), at(hi)) };
                        glu_ref(op, xv, gv, dt, 0.0, 0.0)
                    })
                    .collect();
                check(&format!("{} {dt} view swapped={swapped}", op.name()), &got, &want, dt);
            }
        }
    }
}

/// add / add_cast / add1 with a quantized `a` (ggml's add_q_f32 and add1_q_f32): each row is
/// dequantized, `b` added in f32 and the sum requantized with the type's CPU quantizer (or written
/// as F32 / F16 / BF16 by add_cast). The reference is the crate's own dequantize + quantize
/// (`from_float` where ggml's CPU has one), which the golden tests hold bit-exact with ggml, so
/// the bytes must match exactly.
#[test]
fn add_and_add1_with_quantized_a_requantize_rows_bit_for_bit() {
    use quantgraph::quant;
    let types = [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::IQ4_NL,
        DType::IQ4_XS,
        DType::IQ3_S,
        DType::TQ1_0,
        DType::TQ2_0,
        DType::MXFP4,
        DType::NVFP4,
        DType::Q1_0,
        DType::Q2_0,
    ];
    let ne = [512usize, 3, 2, 1];
    let n: usize = ne.iter().product();
    let requant = |dt: DType, v: &[f32]| {
        // ggml writes the sum with the type's CPU `from_float` (quantize_for_dot: for IQ4_NL
        // that is quantize_row_iq4_nl_ref, which differs from the chunk quantizer), else with the
        // reference quantizer.
        let mut q = vec![0u8; n / dt.block_size() * dt.type_size()];
        if quant::quantize_for_dot(dt, v, &mut q).is_err() {
            quant::quantize(dt, v, &mut q).unwrap();
        }
        q
    };
    for dt in types {
        let a_f: Vec<f32> = rand_f32(n, 31).iter().map(|x| x * 2.0).collect();
        let a_q = requant(dt, &a_f);
        let mut deq = vec![0f32; n];
        quant::dequantize(dt, &a_q, &mut deq).unwrap();
        let vb = rand_f32(n, 32);
        let sum: Vec<f32> = deq.iter().zip(&vb).map(|(x, y)| x + y).collect();

        let mut g = Graph::new();
        let a = g.input(dt, &ne).unwrap();
        let b = g.input(DType::F32, &ne).unwrap();
        let s = g.input(DType::F32, &[1]).unwrap();
        let c = g.add(a, b).unwrap();
        let c32 = g.add_cast(a, b, DType::F32).unwrap();
        let c16 = g.add_cast(a, b, DType::F16).unwrap();
        let c1 = g.add1(a, s).unwrap();
        for t in [c, c32, c16, c1] {
            g.set_output(t).unwrap();
        }
        assert_eq!(g.dtype(c).unwrap(), dt);
        assert_eq!(g.dtype(c1).unwrap(), dt);
        for threads in [1, 3] {
            let be = CpuBackend::with_threads(threads).unwrap();
            let mut p = Plan::with_guards(g.clone(), &be, 64).unwrap();
            p.set_input_bytes(a, &a_q).unwrap();
            p.set_input(b, &vb).unwrap();
            p.set_input(s, &[0.75f32]).unwrap();
            p.compute().unwrap();
            p.check_guards().unwrap();
            assert_eq!(p.output_bytes(c).unwrap(), &requant(dt, &sum)[..], "add {dt}");
            let got32 = p.output::<f32>(c32).unwrap();
            assert!(got32.iter().zip(&sum).all(|(x, y)| x.to_bits() == y.to_bits()), "{dt} f32");
            let got16 = p.output::<f16>(c16).unwrap();
            assert!(got16.iter().zip(&sum).all(|(x, &y)| *x == f16::from_f32(y)), "{dt} f16");
            let sum1: Vec<f32> = deq.iter().map(|x| x + 0.75).collect();
            assert_eq!(p.output_bytes(c1).unwrap(), &requant(dt, &sum1)[..], "add1 {dt}");
        }
    }

    // In place on a quantized state (a KV-cache-like buffer): the rows are requantized in their
    // own bytes, and the bytes after the tensor stay untouched.
    for dt in [DType::Q4_0, DType::Q4_K, DType::IQ4_NL] {
        let a_f: Vec<f32> = rand_f32(n, 35).iter().map(|x| x * 2.0).collect();
        let a_q = requant(dt, &a_f);
        let buf = Buffer::alloc(a_q.len() + 64).unwrap();
        buf.fill(0xA5).unwrap();
        buf.write(0, &a_q).unwrap();
        let mut deq = vec![0f32; n];
        quant::dequantize(dt, &a_q, &mut deq).unwrap();
        let vb = rand_f32(n, 36);
        let mut g = Graph::new();
        let st = g.state(dt, &ne, &buf, 0).unwrap();
        let b = g.input(DType::F32, &ne).unwrap();
        let c = g.add_inplace(st, b).unwrap();
        g.set_output(c).unwrap();
        let mut p = Plan::new(g, &CpuBackend::with_threads(2).unwrap()).unwrap();
        p.set_input(b, &vb).unwrap();
        p.compute().unwrap();
        let bytes = buf.with_bytes(|s| s.to_vec()).unwrap();
        let sum: Vec<f32> = deq.iter().zip(&vb).map(|(x, y)| x + y).collect();
        assert_eq!(&bytes[..a_q.len()], &requant(dt, &sum)[..], "add_inplace {dt}");
        assert!(bytes[a_q.len()..].iter().all(|&x| x == 0xA5), "add_inplace {dt}: overrun");
    }

    // Misuse: broadcast b, an F16 b, a type that needs an importance matrix, a quantized result
    // of another type, and add_cast of F32 (no cast to make).
    let mut g = Graph::new();
    let a = g.input(DType::Q4_0, &[64, 4]).unwrap();
    let row = g.input(DType::F32, &[64, 1]).unwrap();
    assert!(matches!(g.add(a, row), Err(Error::Shape { .. })), "no broadcast with quantized a");
    let h = g.input(DType::F16, &[64, 4]).unwrap();
    assert!(matches!(g.add(a, h), Err(Error::Type { .. })), "quantized a needs an F32 b");
    let b = g.input(DType::F32, &[64, 4]).unwrap();
    assert!(matches!(g.add_cast(a, b, DType::Q8_0), Err(Error::Type { .. })));
    assert!(matches!(g.sub(a, b), Err(Error::Type { .. })), "only add takes a quantized a");
    let iq = g.input(DType::IQ2_XXS, &[256, 2]).unwrap();
    let b2 = g.input(DType::F32, &[256, 2]).unwrap();
    assert!(matches!(g.add(iq, b2), Err(Error::Type { .. })), "IQ2_XXS needs an imatrix");
    assert!(matches!(g.add_cast(b, b, DType::F16), Err(Error::Type { .. })));
    // add_cast F16/BF16 + F32 -> F32, broadcast allowed.
    for ta in [DType::F16, DType::BF16] {
        let mut g = Graph::new();
        // a: a permuted view of [7, 5, 11, 13] data, logically [5, 7, 11, 13].
        let (xa, a) = source(&mut g, [7, 5, 11, 13], ta, true);
        let xb = g.input(DType::F32, &[5, 1, 11, 1]).unwrap();
        let c = g.add_cast(a, xb, DType::F32).unwrap();
        assert_eq!(g.dtype(c).unwrap(), DType::F32);
        g.set_output(c).unwrap();
        let va = rand_f32(5 * 7 * 11 * 13, 33);
        let vb = rand_f32(5 * 11, 34);
        let got = run(g, &[(xa, va.clone()), (xb, vb.clone())], c, 2);
        let ane = [7, 5, 11, 13];
        let want: Vec<f64> = each([5, 7, 11, 13])
            .map(|i| {
                let j = [i[0], 0, i[2], 0];
                src_at(&va, ane, i, ta, true) + src_at(&vb, [5, 1, 11, 1], j, DType::F32, false)
            })
            .collect();
        check(&format!("add_cast {ta}+f32 -> f32"), &got, &want, DType::F32);
    }
}

#[test]
fn scale_and_scale_bias_on_bf16() {
    for (s_, b_) in [(0.75f32, 0.0f32), (-1.5, 0.25)] {
        for nth in [1, 3] {
            let ne = [13usize, 4, 3, 1];
            let mut g = Graph::new();
            let (x, a) = source(&mut g, ne, DType::BF16, false);
            let y = g.scale_bias(a, s_, b_).unwrap();
            assert_eq!(g.dtype(y).unwrap(), DType::BF16);
            g.set_output(y).unwrap();
            let v = rand_f32(ne.iter().product(), 5);
            let got = run(g, &[(x, v.clone())], y, nth);
            // One rounding to BF16 of the f32 result, as ggml's scale_bf16.
            for (k, (&gv, &xv)) in got.iter().zip(&v).enumerate() {
                let xb = bf16::from_f32(xv).to_f32();
                let want = bf16::from_f32(s_ * xb + b_).to_f32();
                assert_eq!(gv.to_bits(), want.to_bits(), "element {k}: {gv} vs {want}");
            }
        }
    }
    let mut g = Graph::new();
    let a = g.input(DType::F16, &[4]).unwrap();
    assert!(g.scale(a, 2.0).is_err(), "F16 scale is not ggml's either");
}
