//! Every unary, binary and gather op (and the row ops beside them) on views that start at an
//! aligned but nonzero offset of a larger tensor, with rows that are not adjacent, gives the
//! bits it gives on a contiguous copy of the same values; in place too. This runs in the test
//! profile, where debug assertions are on: a misaligned or out-of-bounds element access in a
//! driver panics (and fails the compute) instead of passing silently.

mod common;

use common::{XIELU, all_unary};
use half::{bf16, f16};
use quantgraph::testdata::rand_f32;
use quantgraph::{CpuBackend, DType, Graph, Plan, Result, SortOrder, TensorId, UnaryOp};

/// The tensor the views are cut from.
const PARENT: [usize; 4] = [13, 6, 3, 2];
/// The views' shape.
const SUB: [usize; 4] = [9, 4, 2, 2];
/// Where the views start in the parent, in elements: (3, 1, 1, 0).
const AT: [usize; 4] = [3, 1, 1, 0];

/// An operand: its type and the values of the parent tensor.
struct Operand {
    dt: DType,
    parent: Vec<f32>,
}

impl Operand {
    fn new(dt: DType, seed: u64) -> Operand {
        let n = PARENT.iter().product();
        let parent = if dt == DType::I32 {
            // Small non-negative values, so that they serve as row ids too.
            (0..n).map(|i| ((i as u64 * 7 + seed) % SUB[1] as u64) as f32).collect()
        } else {
            rand_f32(n, seed).iter().map(|v| v * 3.0).collect()
        };
        Operand { dt, parent }
    }

    /// The values the view sees, in its logical order.
    fn sub(&self) -> Vec<f32> {
        let mut out = Vec::new();
        for i3 in 0..SUB[3] {
            for i2 in 0..SUB[2] {
                for i1 in 0..SUB[1] {
                    for i0 in 0..SUB[0] {
                        let j = [i0 + AT[0], i1 + AT[1], i2 + AT[2], i3 + AT[3]];
                        let k = j[0] + PARENT[0] * (j[1] + PARENT[1] * (j[2] + PARENT[2] * j[3]));
                        out.push(self.parent[k]);
                    }
                }
            }
        }
        out
    }
}

/// `v` as the bytes of a `dt` tensor.
fn bytes(dt: DType, v: &[f32]) -> Vec<u8> {
    match dt {
        DType::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::F16 => v.iter().flat_map(|&x| f16::from_f32(x).to_le_bytes()).collect(),
        DType::BF16 => v.iter().flat_map(|&x| bf16::from_f32(x).to_le_bytes()).collect(),
        DType::I32 => v.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect(),
        _ => unreachable!("test operand type {dt}"),
    }
}

/// Runs `build` once on views into parent tensors and once on contiguous inputs holding the
/// views' values, and checks that both give the same bytes (the result through `cont`, so that
/// in-place results, which are views themselves, can be read).
fn check(
    what: &str,
    operands: &[Operand],
    build: impl Fn(&mut Graph, &[TensorId]) -> Result<TensorId>,
) {
    let run = |views: bool| -> Vec<u8> {
        let mut g = Graph::new();
        let mut ins = Vec::new();
        let mut args = Vec::new();
        for o in operands {
            if views {
                let p = g.input(o.dt, &PARENT).unwrap();
                let ts = o.dt.type_size();
                let nb = [
                    ts,
                    ts * PARENT[0],
                    ts * PARENT[0] * PARENT[1],
                    ts * PARENT[0] * PARENT[1] * PARENT[2],
                ];
                let offset: usize = (0..4).map(|d| AT[d] * nb[d]).sum();
                let v = g.view_4d(p, SUB, [nb[1], nb[2], nb[3]], offset).unwrap();
                ins.push((p, bytes(o.dt, &o.parent)));
                args.push(v);
            } else {
                let x = g.input(o.dt, &SUB).unwrap();
                ins.push((x, bytes(o.dt, &o.sub())));
                args.push(x);
            }
        }
        let y = build(&mut g, &args).unwrap_or_else(|e| panic!("{what}: {e}"));
        let y = g.cont(y).unwrap();
        g.set_output(y).unwrap();
        let mut p = Plan::with_guards(g, &CpuBackend::with_threads(3).unwrap(), 64).unwrap();
        for (id, b) in &ins {
            p.set_input_bytes(*id, b).unwrap();
        }
        p.compute().unwrap_or_else(|e| panic!("{what}: {e}"));
        p.check_guards().unwrap();
        p.output_bytes(y).unwrap().to_vec()
    };
    assert_eq!(run(true), run(false), "{what}: a view gives other bits than a contiguous copy");
}

fn unary(g: &mut Graph, a: TensorId, op: UnaryOp, inplace: bool) -> Result<TensorId> {
    match (op, inplace) {
        (UnaryOp::Xielu { .. }, false) => {
            let (an, ap, b, e) = XIELU;
            g.xielu(a, an, ap, b, e)
        }
        (_, false) => g.unary(a, op),
        (_, true) => g.unary_inplace(a, op),
    }
}

#[test]
fn every_unary_op_on_offset_views() {
    for op in all_unary() {
        let f32_f16_only =
            matches!(op, UnaryOp::Gelu | UnaryOp::GeluQuick | UnaryOp::GeluErf | UnaryOp::Silu);
        for dt in [DType::F32, DType::F16, DType::BF16] {
            if dt == DType::BF16 && f32_f16_only {
                continue;
            }
            for inplace in [false, true] {
                let what = format!("{} {dt} inplace={inplace}", op.name());
                check(&what, &[Operand::new(dt, 1)], |g, a| unary(g, a[0], op, inplace));
            }
        }
    }
}

#[test]
fn elementwise_maps_on_offset_views() {
    type Build = fn(&mut Graph, TensorId) -> Result<TensorId>;
    let ops: [(&str, Build); 14] = [
        ("scale", |g, a| g.scale(a, -1.5)),
        ("scale_bias", |g, a| g.scale_bias(a, 0.5, 0.25)),
        ("sqr", |g, a| g.sqr(a)),
        ("sqrt", |g, a| g.sqrt(a)),
        ("log", |g, a| g.log(a)),
        ("sin", |g, a| g.sin(a)),
        ("cos", |g, a| g.cos(a)),
        ("sqr_inplace", |g, a| g.sqr_inplace(a)),
        ("clamp", |g, a| g.clamp(a, -0.5, 0.75)),
        ("leaky_relu", |g, a| g.leaky_relu(a, 0.1)),
        ("leaky_relu_inplace", |g, a| g.leaky_relu_inplace(a, 0.1)),
        ("diag_mask_inf", |g, a| g.diag_mask_inf(a, 1)),
        ("diag_mask_inf_inplace", |g, a| g.diag_mask_inf_inplace(a, 1)),
        ("cast_f16", |g, a| g.cast(a, DType::F16)),
    ];
    for (name, f) in ops {
        check(name, &[Operand::new(DType::F32, 2)], |g, a| f(g, a[0]));
    }
}

#[test]
fn every_binary_op_on_offset_views() {
    type Build = fn(&mut Graph, TensorId, TensorId) -> Result<TensorId>;
    let ops: [(&str, Build); 9] = [
        ("add", |g, a, b| g.add(a, b)),
        ("sub", |g, a, b| g.sub(a, b)),
        ("mul", |g, a, b| g.mul(a, b)),
        ("div", |g, a, b| g.div(a, b)),
        ("add_inplace", |g, a, b| g.add_inplace(a, b)),
        ("sub_inplace", |g, a, b| g.sub_inplace(a, b)),
        ("mul_inplace", |g, a, b| g.mul_inplace(a, b)),
        ("div_inplace", |g, a, b| g.div_inplace(a, b)),
        ("add_cast_f32", |g, a, b| g.add_cast(a, b, DType::F32)),
    ];
    for (name, f) in ops {
        for (ta, tb) in [
            (DType::F32, DType::F32),
            (DType::F16, DType::F16),
            (DType::F16, DType::F32),
            (DType::BF16, DType::BF16),
            (DType::BF16, DType::F32),
        ] {
            if name == "add_cast_f32" && (ta == DType::F32 || tb != DType::F32) {
                continue;
            }
            let what = format!("{name} {ta} {tb}");
            let operands = [Operand::new(ta, 3), Operand::new(tb, 4)];
            check(&what, &operands, |g, a| f(g, a[0], a[1]));
        }
        // b broadcast over a: one row of a view.
        let what = format!("{name} broadcast");
        let ta = if name == "add_cast_f32" { DType::F16 } else { DType::F32 };
        let operands = [Operand::new(ta, 5), Operand::new(DType::F32, 6)];
        check(&what, &operands, |g, a| {
            let b = g.view_4d(a[1], [SUB[0], 1, 1, 1], [0, 0, 0], 0)?;
            f(g, a[0], b)
        });
    }
    // add1: a scalar taken from the view.
    let operands = [Operand::new(DType::F32, 7), Operand::new(DType::F32, 8)];
    check("add1", &operands, |g, a| {
        let s = g.view_1d(a[1], 1, 4)?;
        g.add1(a[0], s)
    });
}

#[test]
fn every_gather_op_on_offset_views() {
    type Build = fn(&mut Graph, TensorId, TensorId) -> Result<TensorId>;
    let ops: [(&str, Build); 11] = [
        ("concat0", |g, a, b| g.concat(a, b, 0)),
        ("concat1", |g, a, b| g.concat(a, b, 1)),
        ("concat2", |g, a, b| g.concat(a, b, 2)),
        ("concat3", |g, a, b| g.concat(a, b, 3)),
        ("repeat", |g, a, _| g.repeat(a, [18, 8, 4, 4])),
        ("pad", |g, a, _| g.pad(a, [2, 1, 1, 1])),
        ("pad_circular", |g, a, _| g.pad_ext(a, [1, 2, 1, 0], [2, 1, 0, 1], true)),
        ("pad_reflect_1d", |g, a, _| g.pad_reflect_1d(a, 2, 3)),
        ("roll", |g, a, _| g.roll(a, [2, -1, 1, 0])),
        ("cont", |g, a, _| g.cont(a)),
        ("repeat_back", |g, a, _| {
            let small = g.view_4d(a, [3, 2, 1, 1], strides3(g, a), 0)?;
            g.repeat_back(a, small)
        }),
    ];
    for (name, f) in ops {
        for dt in [DType::F32, DType::F16, DType::I32] {
            if dt != DType::F32 && matches!(name, "pad_reflect_1d" | "repeat_back") {
                continue;
            }
            let what = format!("{name} {dt}");
            let operands = [Operand::new(dt, 9), Operand::new(dt, 10)];
            let n = if name.starts_with("concat") { 2 } else { 1 };
            check(&what, &operands[..n], |g, a| f(g, a[0], a[n - 1]));
        }
    }
}

/// The first strides of `a` (for a view of `a` with `a`'s row layout).
fn strides3(g: &Graph, a: TensorId) -> [usize; 3] {
    let nb = g.strides(a).unwrap();
    [nb[1], nb[2], nb[3]]
}

#[test]
fn get_rows_from_offset_views_with_offset_ids() {
    for dt in [DType::F32, DType::F16, DType::BF16] {
        // The table is a view (rows of ne0 values, not adjacent); the ids are a view of an I32
        // tensor at an offset too, with values in 0..SUB[1].
        let operands = [Operand::new(dt, 11), Operand::new(DType::I32, 12)];
        check(&format!("get_rows {dt}"), &operands, |g, a| {
            let ids = g.view_4d(a[1], [3, 2, 2, 1], strides3(g, a[1]), 0)?;
            g.get_rows(a[0], ids)
        });
    }
}

#[test]
fn row_ops_on_offset_views() {
    type Build = fn(&mut Graph, TensorId) -> Result<TensorId>;
    let ops: [(&str, Build); 9] = [
        ("rms_norm", |g, a| g.rms_norm(a, 1e-5)),
        ("norm", |g, a| g.norm(a, 1e-5)),
        ("norm_inplace", |g, a| g.norm_inplace(a, 1e-5)),
        ("l2_norm", |g, a| g.l2_norm(a, 1e-5)),
        ("soft_max", |g, a| g.soft_max(a)),
        ("sum_rows", |g, a| g.sum_rows(a)),
        ("cumsum", |g, a| g.cumsum(a)),
        ("argsort", |g, a| g.argsort(a, SortOrder::Desc)),
        ("sum", |g, a| g.sum(a)),
    ];
    for (name, f) in ops {
        check(name, &[Operand::new(DType::F32, 13)], |g, a| f(g, a[0]));
    }
    let operands = [Operand::new(DType::F32, 14), Operand::new(DType::F32, 15)];
    check("swiglu split", &operands, |g, a| g.swiglu(a[0], Some(a[1])));
    check("swiglu fused", &operands[..1], |g, a| g.swiglu(a[0], None));
}

#[test]
fn misaligned_views_are_refused() {
    let mut g = Graph::new();
    for dt in [DType::F32, DType::F16, DType::I32, DType::Q8_0] {
        let a = g.input(dt, &[64, 4]).unwrap();
        let bad_offset = 1;
        assert!(g.view_1d(a, dt.block_size(), bad_offset).is_err(), "{dt} offset {bad_offset}");
        let row = dt.row_size(64).unwrap();
        assert!(g.view_2d(a, [dt.block_size(), 2], row + 1, 0).is_err(), "{dt} stride {}", row + 1);
    }
}
