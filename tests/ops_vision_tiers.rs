//! conv_2d and conv_3d on every kernel tier this CPU has (the AVX2 tier uses a register tile and
//! F16C rounding, the scalar tier plain dot products): each tier within the conv NMSE limit of
//! the other and bitwise identical across thread counts. A separate test binary because the tier
//! is process-wide.

mod common;

use common::nmse;
use quantgraph::kernels::{Isa, set_isa};
use quantgraph::testdata::rand_f32;
use quantgraph::{Conv2dParams, Conv3dParams, CpuBackend, DType, Graph, Plan};

fn run(kt: DType, three_d: bool, threads: usize) -> Vec<f32> {
    let mut g = Graph::new();
    let (x, k, out) = if three_d {
        let x = g.input(DType::F32, &[9, 8, 7, 6]).unwrap();
        let k = g.input(kt, &[3, 2, 3, 15]).unwrap();
        let p = Conv3dParams { s: [1, 2, 1], p: [1, 0, 1], d: [1, 1, 2], c: 3, n: 2, oc: 5 };
        (x, k, g.conv_3d(k, x, p).unwrap())
    } else {
        let x = g.input(DType::F32, &[23, 17, 13, 2]).unwrap();
        let k = g.input(kt, &[3, 3, 13, 7]).unwrap();
        (x, k, g.conv_2d(k, x, Conv2dParams::square(1, 1, 1)).unwrap())
    };
    g.set_output(out).unwrap();
    let xn: usize = g.shape(x).unwrap().iter().product();
    let kn: usize = g.shape(k).unwrap().iter().product();
    let mut p = Plan::with_guards(g, &CpuBackend::with_threads(threads).unwrap(), 64).unwrap();
    p.set_input(x, &rand_f32(xn, 1)).unwrap();
    let kv = rand_f32(kn, 2);
    if kt == DType::F16 {
        let h: Vec<half::f16> = kv.iter().map(|&v| half::f16::from_f32(v)).collect();
        p.set_input(k, &h).unwrap();
    } else {
        p.set_input(k, &kv).unwrap();
    }
    p.compute().unwrap();
    p.check_guards().unwrap();
    p.output::<f32>(out).unwrap().to_vec()
}

#[test]
fn conv_tiers_agree_and_are_thread_invariant() {
    for kt in [DType::F32, DType::F16] {
        for three_d in [false, true] {
            let mut per_tier = Vec::new();
            for isa in Isa::ALL.into_iter().filter(|i| i.is_supported()) {
                set_isa(isa).unwrap();
                let one = run(kt, three_d, 1);
                for t in [2, 3] {
                    let got = run(kt, three_d, t);
                    assert!(
                        got.iter().zip(&one).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{kt} 3d={three_d} {isa:?}: {t} threads differ"
                    );
                }
                per_tier.push(one);
            }
            let base: Vec<f64> = per_tier[0].iter().map(|&v| v as f64).collect();
            for other in &per_tier[1..] {
                let e = nmse(other, &base);
                assert!(e < 5e-4, "{kt} 3d={three_d}: tiers differ, nmse {e:e}");
            }
        }
    }
    set_isa(Isa::best()).unwrap();
}
