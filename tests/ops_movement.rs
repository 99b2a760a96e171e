//! Copies between every convertible type, set_rows into a KV-cache-like state buffer.

mod common;

use common::{nmse, rand_f32};
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
        g.set_output(back);
        let mut p = Plan::new(g, &CpuBackend::with_threads(2).unwrap()).unwrap();
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
    g.set_output(c);
    g.set_output(i);
    let x: Vec<f32> = (0..24).map(|v| v as f32 * 1.25 - 7.0).collect();
    let mut plan = Plan::new(g, &CpuBackend::with_threads(3).unwrap()).unwrap();
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
        g.set_output(all);
        let mut p = Plan::new(g, &CpuBackend::with_threads(2).unwrap()).unwrap();
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
