//! `GgufFile`: memory-mapped, copied and owned loading agree; tensors bind zero-copy as graph
//! weights and compute the same numbers as the bytes they came from; writer round trips.

use quantgraph::gguf::{GgufFile, GgufWriter, Value};
use quantgraph::{CpuBackend, DType, Graph, Plan};

fn tmp_path(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("quantgraph-gguf-file-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn weights(k: usize, m: usize) -> Vec<f32> {
    (0..k * m).map(|i| ((i * 29 % 23) as f32 - 11.0) / 8.0).collect()
}

fn sample_file() -> Vec<u8> {
    let (k, m) = (64, 3);
    let w = weights(k, m);
    let mut q = vec![0u8; DType::Q8_0.row_size(k * m).unwrap()];
    quantgraph::quant::quantize(DType::Q8_0, &w, &mut q).unwrap();
    let mut gw = GgufWriter::new();
    gw.add("general.architecture", "test").unwrap();
    gw.add("test.k", k as u32).unwrap();
    gw.add_tensor_owned("w.f32", DType::F32, &[k, m], f32_bytes(&w)).unwrap();
    gw.add_tensor_owned("w.q8_0", DType::Q8_0, &[k, m], q).unwrap();
    gw.add_tensor_owned("odd", DType::F32, &[3], f32_bytes(&[1.0, 2.0, 3.0])).unwrap();
    gw.to_vec().unwrap()
}

#[test]
fn open_from_bytes_and_from_vec_agree() {
    let bytes = sample_file();
    let path = tmp_path("agree.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let mapped = GgufFile::open(&path).unwrap();
    let copied = GgufFile::from_bytes(&bytes).unwrap();
    let owned = GgufFile::from_vec(bytes.clone()).unwrap();
    for f in [&mapped, &copied, &owned] {
        assert_eq!(f.buffer().len(), bytes.len());
        assert!(!f.buffer().is_writable());
        assert_eq!(f.metadata(), mapped.metadata());
        assert_eq!(f.tensors(), mapped.tensors());
        for t in f.tensors() {
            let data = f.tensor_data(t.name()).unwrap();
            assert_eq!(data, &bytes[t.offset()..t.offset() + t.size()]);
        }
    }
    assert_eq!(mapped.metadata().get_u32("test.k").unwrap(), 64);
    let t = mapped.tensor("w.q8_0").unwrap();
    assert_eq!(
        (t.dtype(), t.shape(), t.size(), t.n_elements()),
        (DType::Q8_0, &[64, 3][..], 204, 192)
    );
    assert_eq!(t.offset(), mapped.gguf().data_offset() + t.data_offset() as usize);
    assert!(mapped.tensor("missing").is_none());
    assert!(mapped.tensor_data("missing").is_err());
    let _ = std::fs::remove_file(&path);
}

#[test]
fn bound_weights_compute_from_the_map() {
    let path = tmp_path("bind.gguf");
    std::fs::write(&path, sample_file()).unwrap();
    let file = GgufFile::open(&path).unwrap();
    let (k, m) = (64usize, 3usize);
    let w = weights(k, m);
    let x: Vec<f32> = (0..k).map(|i| (i as f32 * 0.37).sin()).collect();
    let want: Vec<f64> =
        (0..m).map(|r| (0..k).map(|i| w[r * k + i] as f64 * x[i] as f64).sum()).collect();

    let mut g = Graph::new();
    let wf = file.bind(&mut g, "w.f32").unwrap();
    let wq = file.bind(&mut g, "w.q8_0").unwrap();
    let xi = g.input(DType::F32, &[k, 1]).unwrap();
    let yf = g.mul_mat(wf, xi).unwrap();
    let yq = g.mul_mat(wq, xi).unwrap();
    g.set_output(yf).unwrap();
    g.set_output(yq).unwrap();
    assert!(file.bind(&mut g, "nope").is_err());
    drop(file); // the graph keeps the map alive
    let backend = CpuBackend::with_threads(1).unwrap();
    let mut plan = Plan::new(g, &backend).unwrap();
    plan.set_input(xi, &x).unwrap();
    plan.compute().unwrap();
    let (of, oq) = (plan.output::<f32>(yf).unwrap(), plan.output::<f32>(yq).unwrap());
    for r in 0..m {
        assert!((of[r] as f64 - want[r]).abs() < 1e-4, "f32 row {r}: {} vs {}", of[r], want[r]);
        assert!((oq[r] as f64 - want[r]).abs() < 0.05 * want[r].abs().max(1.0), "q8_0 row {r}");
    }
    let _ = std::fs::remove_file(&path);
}

#[test]
fn writer_round_trips_and_pads_like_ggml() {
    let bytes = sample_file();
    let f = GgufFile::from_bytes(&bytes).unwrap();
    // rewriting a file read here gives the same bytes
    let mut w = GgufWriter::new();
    w.add_all(f.metadata()).unwrap();
    for t in f.tensors() {
        w.add_tensor_from_buffer(t.name(), t.dtype(), t.shape(), f.buffer(), t.offset()).unwrap();
    }
    assert_eq!(w.to_vec().unwrap(), bytes);
    // ggml's layout: data section aligned, each tensor padded to the alignment, file padded too
    assert_eq!(f.gguf().data_offset() % 32, 0);
    let offs: Vec<u64> = f.tensors().iter().map(|t| t.data_offset()).collect();
    assert_eq!(offs, [0, 768, 768 + 224]);
    assert_eq!(bytes.len(), f.gguf().data_offset() + 768 + 224 + 32);
    // files written to disk read back the same
    let path = tmp_path("rewrite.gguf");
    let n = w.write_file(&path).unwrap();
    assert_eq!(n as usize, bytes.len());
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn version_2_reads_and_files_without_tensors() {
    let mut bytes = sample_file();
    bytes[4] = 2;
    assert_eq!(GgufFile::from_bytes(&bytes).unwrap().version(), 2);

    let mut w = GgufWriter::new();
    w.add("general.name", "empty").unwrap();
    w.add("list", Value::from(vec![1i32, 2, 3])).unwrap();
    let f = GgufFile::from_vec(w.to_vec().unwrap()).unwrap();
    assert!(f.tensors().is_empty());
    assert_eq!(f.metadata().get_arr::<i32>("list").unwrap(), &[1, 2, 3]);
    assert!(f.metadata().get_str("list").is_err());
    assert!(f.metadata().get_arr::<u32>("list").is_err());
    assert!(f.metadata().get_arr::<i32>("general.name").is_err());
    let e = f.metadata().get_i64("nope").unwrap_err().to_string();
    assert!(e.contains("'nope' not found"), "{e}");
    let e = f.metadata().get_u32("general.name").unwrap_err().to_string();
    assert!(e.contains("has type str, not u32"), "{e}");

    // the smallest file: header only
    let f = GgufFile::from_bytes(&GgufWriter::new().to_vec().unwrap()).unwrap();
    assert!(f.metadata().is_empty() && f.tensors().is_empty());
}

#[test]
fn alignment_is_honoured_by_writer_and_reader() {
    let mut w = GgufWriter::new();
    w.set_alignment(128).unwrap();
    w.add_tensor_owned("a", DType::F32, &[3], f32_bytes(&[1.0, 2.0, 3.0])).unwrap();
    w.add_tensor_owned("b", DType::F32, &[1], f32_bytes(&[4.0])).unwrap();
    let f = GgufFile::from_vec(w.to_vec().unwrap()).unwrap();
    assert_eq!(f.alignment(), 128);
    assert_eq!(f.metadata().get_u32("general.alignment").unwrap(), 128);
    assert_eq!(f.tensor("b").unwrap().data_offset(), 128);
    assert!(f.tensors().iter().all(|t| t.offset() % 128 == 0));
}
