//! Interop with the reference Python package `gguf` (llama.cpp's gguf-py), driven through
//! tests/gguf_interop.py: files its `GGUFWriter` writes read here identically, files written here
//! read identically in its `GGUFReader`, and `gguf.quants.quantize` gives our quantizer's bytes.
//!
//! Without python3 + gguf + numpy these tests print why and pass, except under `CI=true`, where
//! they fail (CI installs the package: `python3 -m pip install gguf numpy`).

use quantgraph::DType;
use quantgraph::gguf::{Array, GgufFile, GgufWriter, Metadata, Value, ValueType};
use serde_json::{Value as Json, json};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gguf_interop.py")
}

/// True when python3 can import gguf and numpy; otherwise skips (or fails under CI=true).
fn have_python_gguf(test: &str) -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import gguf, numpy"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        let msg = "python3 with the `gguf` and `numpy` packages is not available \
                   (python3 -m pip install gguf numpy)";
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("{test}: {msg}; under CI=true this test must run");
        }
        // Straight to stderr, past the test harness's output capture, so the skip is seen.
        let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {msg}");
    }
    ok
}

fn run_py(args: &[&str]) {
    let out = Command::new("python3").arg(script()).args(args).output().expect("run python3");
    assert!(
        out.status.success(),
        "gguf_interop.py {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn tmp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("quantgraph-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A scalar in the script's JSON encoding (floats as bit patterns).
fn scalar_json(v: &Value) -> Json {
    match v {
        Value::U8(x) => json!(x),
        Value::I8(x) => json!(x),
        Value::U16(x) => json!(x),
        Value::I16(x) => json!(x),
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        Value::F32(x) => json!(x.to_bits()),
        Value::Bool(x) => json!(x),
        Value::String(x) => json!(x),
        Value::U64(x) => json!(x),
        Value::I64(x) => json!(x),
        Value::F64(x) => json!(x.to_bits()),
        Value::Array(_) => unreachable!("arrays are not scalars"),
    }
}

fn array_json(a: &Array) -> Json {
    fn each<T: Clone>(v: &[T], f: impl Fn(T) -> Value) -> Json {
        Json::Array(v.iter().cloned().map(|x| scalar_json(&f(x))).collect())
    }
    match a {
        Array::U8(v) => each(v, Value::U8),
        Array::I8(v) => each(v, Value::I8),
        Array::U16(v) => each(v, Value::U16),
        Array::I16(v) => each(v, Value::I16),
        Array::U32(v) => each(v, Value::U32),
        Array::I32(v) => each(v, Value::I32),
        Array::F32(v) => each(v, Value::F32),
        Array::Bool(v) => each(v, Value::Bool),
        Array::String(v) => each(v, Value::String),
        Array::U64(v) => each(v, Value::U64),
        Array::I64(v) => each(v, Value::I64),
        Array::F64(v) => each(v, Value::F64),
    }
}

fn kv_json(m: &Metadata) -> Json {
    Json::Array(
        m.iter()
            .map(|(k, v)| match v {
                Value::Array(a) => json!({
                    "key": k, "type": ValueType::Array.id(), "elem": a.elem_type().id(),
                    "value": array_json(a)
                }),
                v => json!({"key": k, "type": v.value_type().id(), "elem": null,
                            "value": scalar_json(v)}),
            })
            .collect(),
    )
}

fn tensors_json(file: &GgufFile) -> Json {
    Json::Array(
        file.tensors()
            .iter()
            .map(|t| {
                json!({
                    "name": t.name(), "type": t.dtype().ggml_id(), "shape": t.shape(),
                    "data": hex(&file.tensor_data(t.name()).unwrap()),
                })
            })
            .collect(),
    )
}

#[test]
fn python_written_file_reads_identically() {
    if !have_python_gguf("python_written_file_reads_identically") {
        return;
    }
    let dir = tmp_dir("py-write");
    let (gguf_path, json_path) = (dir.join("py.gguf"), dir.join("py.json"));
    run_py(&["write", gguf_path.to_str().unwrap(), json_path.to_str().unwrap()]);
    let expected: Json = serde_json::from_slice(&std::fs::read(&json_path).unwrap()).unwrap();

    let file = GgufFile::open(&gguf_path).unwrap();
    assert_eq!(file.version(), 3);
    assert_eq!(kv_json(file.metadata()), expected["kv"]);
    assert_eq!(tensors_json(&file), expected["tensors"]);

    // every value type came through, and the typed getters agree with the stored types
    let m = file.metadata();
    assert_eq!(m.get_u8("t.u8").unwrap(), 255);
    assert_eq!(m.get_i8("t.i8").unwrap(), -128);
    assert_eq!(m.get_u16("t.u16").unwrap(), 65535);
    assert_eq!(m.get_i16("t.i16").unwrap(), -32768);
    assert_eq!(m.get_u32("t.u32").unwrap(), u32::MAX);
    assert_eq!(m.get_i32("t.i32").unwrap(), i32::MIN);
    assert_eq!(m.get_f32("t.f32").unwrap(), -1.5);
    assert!(m.get_f32("t.f32_nan").unwrap().is_nan());
    assert!(m.get_bool("t.bool_true").unwrap());
    assert_eq!(m.get_str("t.str").unwrap(), "héllo wörld ✓");
    assert_eq!(m.get_u64("t.u64").unwrap(), u64::MAX);
    assert_eq!(m.get_i64("t.i64").unwrap(), i64::MIN);
    assert_eq!(m.get_f64("t.f64").unwrap(), std::f64::consts::PI);
    assert_eq!(m.get_arr::<f32>("a.f32").unwrap(), &[0.5, -2.25, 1e30]);
    assert_eq!(m.get_arr::<String>("a.str").unwrap()[3], "日本");
    assert!(m.get_u32("t.u64").is_err());
    assert!(m.get_arr::<u32>("a.i32").is_err());

    // tensors are aligned in the buffer and usable as graph weights
    for t in file.tensors() {
        assert_eq!(t.offset() % file.alignment(), 0, "{}", t.name());
    }
    let mut g = quantgraph::Graph::new();
    for name in ["f32", "q4_0", "q8_0", "cube"] {
        file.bind(&mut g, name).unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Metadata with every value type and array type, as the writer tests use it.
fn all_types_metadata() -> Metadata {
    let mut m = Metadata::new();
    m.insert("general.architecture", "quantgraph").unwrap();
    m.insert("v.u8", 7u8).unwrap();
    m.insert("v.i8", -7i8).unwrap();
    m.insert("v.u16", 700u16).unwrap();
    m.insert("v.i16", -700i16).unwrap();
    m.insert("v.u32", 70000u32).unwrap();
    m.insert("v.i32", -70000i32).unwrap();
    m.insert("v.f32", 0.1f32).unwrap();
    m.insert("v.f32_nan", f32::NAN).unwrap();
    m.insert("v.bool", true).unwrap();
    m.insert("v.str", "ünïcödé").unwrap();
    m.insert("v.u64", u64::MAX - 1).unwrap();
    m.insert("v.i64", i64::MIN + 1).unwrap();
    m.insert("v.f64", -1e300f64).unwrap();
    m.insert("a.u8", vec![1u8, 2, 3]).unwrap();
    m.insert("a.i8", vec![-1i8, 2]).unwrap();
    m.insert("a.u16", vec![1u16, 65535]).unwrap();
    m.insert("a.i16", vec![-1i16]).unwrap();
    m.insert("a.u32", vec![5u32, 6, 7]).unwrap();
    m.insert("a.i32", vec![-5i32, 6]).unwrap();
    m.insert("a.f32", vec![1.5f32, -0.0, f32::INFINITY]).unwrap();
    m.insert("a.bool", vec![false, true]).unwrap();
    m.insert("a.str", vec!["x".to_string(), String::new(), "▁word".into()]).unwrap();
    m.insert("a.u64", vec![u64::MAX]).unwrap();
    m.insert("a.i64", vec![i64::MIN, 0]).unwrap();
    m.insert("a.f64", vec![0.25f64, f64::NEG_INFINITY]).unwrap();
    m
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn our_file_reads_identically_in_python() {
    if !have_python_gguf("our_file_reads_identically_in_python") {
        return;
    }
    let dir = tmp_dir("rs-write");
    for alignment in [32u32, 64] {
        let (gguf_path, json_path) = (dir.join("rs.gguf"), dir.join("rs.json"));
        let meta = all_types_metadata();
        let src: Vec<f32> = (0..3 * 256).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
        let mut tensors: Vec<(&str, DType, Vec<usize>, Vec<u8>)> = Vec::new();
        tensors.push(("t.f32", DType::F32, vec![256, 3], f32_bytes(&src)));
        let f16: Vec<u8> = src.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect();
        tensors.push(("t.f16", DType::F16, vec![256, 3], f16));
        for dt in [DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q6_K] {
            let mut q = vec![0u8; dt.row_size(src.len()).unwrap()];
            quantgraph::quant::quantize(dt, &src, &mut q).unwrap();
            tensors.push((dt.name(), dt, vec![256, 3], q));
        }
        tensors.push(("t.odd", DType::F32, vec![3, 1, 1, 5], f32_bytes(&src[..15])));

        let mut w = GgufWriter::new();
        if alignment != 32 {
            w.set_alignment(alignment).unwrap();
        }
        w.add_all(&meta).unwrap();
        for (name, dt, ne, data) in &tensors {
            w.add_tensor(name, *dt, ne, data).unwrap();
        }
        w.write_file(&gguf_path).unwrap();
        run_py(&["read", gguf_path.to_str().unwrap(), json_path.to_str().unwrap()]);
        let got: Json = serde_json::from_slice(&std::fs::read(&json_path).unwrap()).unwrap();

        let mut expected_meta = Metadata::new();
        if alignment != 32 {
            expected_meta.insert("general.alignment", alignment).unwrap();
        }
        for (k, v) in meta.iter() {
            expected_meta.insert(k, v.clone()).unwrap();
        }
        assert_eq!(got["kv"], kv_json(&expected_meta));
        assert_eq!(got["alignment"], json!(alignment));
        let expected_tensors: Vec<Json> = tensors
            .iter()
            .map(|(name, dt, ne, data)| {
                json!({"name": name, "type": dt.ggml_id(), "shape": ne, "data": hex(data),
                       "n_bytes": data.len()})
            })
            .collect();
        assert_eq!(got["tensors"], Json::Array(expected_tensors));

        // and our own reader agrees with itself
        let back = GgufFile::open(&gguf_path).unwrap();
        assert_eq!(back.alignment(), alignment as usize);
        assert_eq!(kv_json(back.metadata()), kv_json(&expected_meta));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn python_quantize_matches_ours_for_every_type_it_supports() {
    if !have_python_gguf("python_quantize_matches_ours_for_every_type_it_supports") {
        return;
    }
    let dir = tmp_dir("py-quant");
    let path = dir.join("quant.gguf");
    run_py(&["quant", path.to_str().unwrap()]);
    let file = GgufFile::open(&path).unwrap();
    let types = file.metadata().get_arr::<String>("interop.quantized_types").unwrap().to_vec();
    for must in ["F16", "Q4_0", "Q8_0"] {
        assert!(types.iter().any(|t| t == must), "python quantized {types:?}");
    }
    let mut checked = Vec::new();
    for t in file.tensors() {
        let Some(name) = t.name().strip_prefix("q.") else { continue };
        let src_t = file.tensor(&format!("src.{name}")).unwrap();
        assert_eq!(src_t.dtype(), DType::F32);
        let src: Vec<f32> = file
            .tensor_data(src_t.name())
            .unwrap()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let dt = t.dtype();
        assert_eq!(t.shape(), src_t.shape(), "{name}");
        let ours = match dt {
            DType::F16 => src.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect(),
            _ => {
                let mut q = vec![0u8; dt.row_size(src.len()).unwrap()];
                quantgraph::quant::quantize(dt, &src, &mut q).unwrap();
                q
            }
        };
        let theirs = file.tensor_data(t.name()).unwrap();
        assert_eq!(ours.len(), theirs.len(), "{dt}");
        if let Some(i) = ours.iter().zip(&theirs).position(|(a, b)| a != b) {
            panic!("{dt}: first differing byte at {i} (block {})", i / dt.type_size());
        }
        checked.push(dt.name());
    }
    eprintln!("bit-exact with gguf.quants.quantize: {checked:?}");
    assert_eq!(checked.len(), types.len());
    let _ = std::fs::remove_dir_all(&dir);
}
