//! What the integration tests share: ggml's golden vectors in tests/data/golden (made by ggml
//! itself; see tests/data/golden/README.md), references and comparison metrics. Random inputs come
//! from `quantgraph::testdata`.
#![allow(dead_code)]

pub mod lists;
pub mod llama;

#[allow(unused_imports)] // not every test binary uses every list
pub use lists::*;
use quantgraph::DType;
use serde_json::Value;
use std::path::PathBuf;
use std::sync::OnceLock;

pub fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden")
}

pub fn manifest() -> &'static Value {
    static M: OnceLock<Value> = OnceLock::new();
    M.get_or_init(|| {
        let s = std::fs::read_to_string(data_dir().join("manifest.json")).expect("manifest.json");
        serde_json::from_str(&s).expect("manifest parses")
    })
}

pub fn read_bytes(desc: &Value) -> Vec<u8> {
    let file = desc["file"].as_str().expect("file");
    let b = std::fs::read(data_dir().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    assert_eq!(b.len() as u64, desc["nbytes"].as_u64().unwrap(), "{file} size");
    b
}

pub fn read_f32(desc: &Value) -> Vec<f32> {
    read_bytes(desc).chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

/// One type's quantization golden data.
pub struct QuantCase {
    pub dtype: DType,
    /// Bytes of ggml_quantize_chunk(x).
    pub q: Vec<u8>,
    /// Those bytes dequantized by ggml.
    pub deq: Vec<f32>,
    /// The CPU from_float bytes when they differ from the reference quantizer (iq4_nl).
    pub q_cpu: Option<Vec<u8>>,
    pub vec_dot_type: DType,
    /// y converted to the vec-dot type by ggml's CPU from_float.
    pub y_q: Vec<u8>,
    /// Per row: ggml's vec_dot(q row, y_q row) value as exact f32 bits.
    pub vec_dot: Vec<f32>,
}

pub fn quant_rows() -> (usize, usize) {
    let q = &manifest()["quant"];
    (q["rows"].as_u64().unwrap() as usize, q["n_per_row"].as_u64().unwrap() as usize)
}

pub fn quant_x() -> Vec<f32> {
    read_f32(&manifest()["quant"]["x"])
}

pub fn quant_y() -> Vec<f32> {
    read_f32(&manifest()["quant"]["y"])
}

/// Type names present in the golden quant set.
pub fn quant_types() -> Vec<String> {
    manifest()["quant"]["types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["type"].as_str().unwrap().to_string())
        .collect()
}

pub fn quant_case(name: &str) -> QuantCase {
    let t = manifest()["quant"]["types"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["type"] == name)
        .unwrap_or_else(|| panic!("no golden quant case for {name}"));
    let dtype = DType::from_name(name).unwrap();
    let vdt = DType::from_name(t["vec_dot_type"].as_str().unwrap()).unwrap();
    QuantCase {
        dtype,
        q: read_bytes(&t["q"]),
        deq: read_f32(&t["deq"]),
        q_cpu: t.get("q_cpu").map(read_bytes),
        vec_dot_type: vdt,
        y_q: read_bytes(&t["y_q"]),
        vec_dot: t["vec_dot"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| f32::from_bits(v["bits"].as_u64().unwrap() as u32))
            .collect(),
    }
}

/// One golden matmul: C = mul_mat(A [K, M] of `dtype`, B [K, N] f32) -> [M, N].
pub struct MatmulCase {
    pub dtype: DType,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: Vec<u8>,
    pub b: Vec<f32>,
    pub c: Vec<f32>,
}

pub fn matmul_cases() -> Vec<MatmulCase> {
    manifest()["matmul"]["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| MatmulCase {
            dtype: DType::from_name(c["type"].as_str().unwrap()).unwrap(),
            m: c["M"].as_u64().unwrap() as usize,
            n: c["N"].as_u64().unwrap() as usize,
            k: c["K"].as_u64().unwrap() as usize,
            a: read_bytes(&c["A"]),
            b: read_f32(&c["B"]),
            c: read_f32(&c["C"]),
        })
        .collect()
}

/// test-backend-ops' normalised mean squared error: sum((a-b)^2) / sum(b^2).
pub fn nmse(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let mut num = 0.0;
    let mut den = 0.0;
    for (g, w) in got.iter().zip(want) {
        let d = *g as f64 - w;
        num += d * d;
        den += w * w;
    }
    if den == 0.0 { num } else { num / den }
}

/// Every index (i0, i1, i2, i3) of a shape, i0 fastest (ggml's memory order).
pub fn each(ne: [usize; 4]) -> impl Iterator<Item = [usize; 4]> {
    let n: usize = ne.iter().product();
    (0..n).map(move |k| {
        [k % ne[0], (k / ne[0]) % ne[1], (k / (ne[0] * ne[1])) % ne[2], k / (ne[0] * ne[1] * ne[2])]
    })
}

/// `out[i + m * (j + n * (i2 + ne2 * i3))] = sum_k a[k, i, i2 / r2, i3 / r3] * b[k, j, i2, i3]`.
pub fn matmul_f64(a: &[f32], ane: [usize; 4], b: &[f32], bne: [usize; 4]) -> Vec<f64> {
    let (k, m, n) = (ane[0], ane[1], bne[1]);
    let (r2, r3) = (bne[2] / ane[2], bne[3] / ane[3]);
    let mut out = Vec::with_capacity(m * n * bne[2] * bne[3]);
    for i3 in 0..bne[3] {
        for i2 in 0..bne[2] {
            for j in 0..n {
                for i in 0..m {
                    let ar = &a[((i3 / r3 * ane[2] + i2 / r2) * m + i) * k..][..k];
                    let br = &b[((i3 * bne[2] + i2) * n + j) * k..][..k];
                    out.push(ar.iter().zip(br).map(|(x, y)| *x as f64 * *y as f64).sum());
                }
            }
        }
    }
    out
}

/// Every SIMD tier this CPU supports (the scalar one included).
pub fn tiers() -> Vec<quantgraph::kernels::Isa> {
    quantgraph::kernels::Isa::ALL.into_iter().filter(|i| i.is_supported()).collect()
}

/// Asserts `|got - want| <= tol * max|want|` elementwise: tiers and kernels that round
/// differently compared relative to the output's scale (single elements may cancel to near zero).
pub fn assert_close_to_scale(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    for (idx, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * scale, "{what} [{idx}]: {g} vs {w}");
    }
}

/// `mul_mat(a, b)` on tier `isa` with `threads` threads, on a plan with guard bytes (checked after
/// the compute): `a` of type `ty` and shape `ane` given as bytes, `b` F32 of shape `bne`. The tier
/// is the backend's (`CpuBackend::with_isa`), so tests may run this in parallel.
pub fn mul_mat_guarded(
    isa: quantgraph::kernels::Isa,
    threads: usize,
    ty: quantgraph::DType,
    ane: [usize; 4],
    a_bytes: &[u8],
    bne: [usize; 4],
    b: &[f32],
) -> Vec<f32> {
    let b_bytes: &[u8] = bytemuck::cast_slice(b);
    let b = (quantgraph::DType::F32, bne, b_bytes);
    mul_mat_guarded_bytes(isa, threads, (ty, ane, a_bytes), b)
}

/// [`mul_mat_guarded`] with both operands given as `(type, shape, bytes)`.
pub fn mul_mat_guarded_bytes(
    isa: quantgraph::kernels::Isa,
    threads: usize,
    (a_ty, ane, a_bytes): (quantgraph::DType, [usize; 4], &[u8]),
    (b_ty, bne, b_bytes): (quantgraph::DType, [usize; 4], &[u8]),
) -> Vec<f32> {
    use quantgraph::{CpuBackend, Graph, Plan};
    let be = CpuBackend::with_isa(threads, isa).unwrap();
    let mut g = Graph::new();
    let a_in = g.input(a_ty, &ane).unwrap();
    let b_in = g.input(b_ty, &bne).unwrap();
    let y = g.mul_mat(a_in, b_in).unwrap();
    g.set_output(y).unwrap();
    // Guard bytes around every tensor catch a kernel writing outside its output.
    let mut p = Plan::with_guards(g, &be, 64).unwrap();
    p.set_input_bytes(a_in, a_bytes).unwrap();
    p.set_input_bytes(b_in, b_bytes).unwrap();
    p.compute().unwrap();
    p.check_guards().unwrap();
    p.output::<f32>(y).unwrap().to_vec()
}
