//! Hostile input through the public API: every case must come back as a precise `Err` (or a
//! correct result), never a panic, an abort, undefined behaviour or a hang. One test per class:
//! misaligned views and files, self-overlapping destinations, zero dimensions and size overflow
//! at build and plan time, values accepted that were wrong, model files that would abort, and
//! thread counts that would take seconds to refuse.

use quantgraph::models::llama::{Llama, LlamaConfig, WeightTypes, synthetic_gguf};
use quantgraph::{
    Backend, Buffer, CpuBackend, DType, Error, FlashAttnParams, GgufFile, GgufWriter, Graph,
    MAX_THREADS, Plan,
};

fn shape_err(e: Error, op: &str, words: &[&str]) {
    match &e {
        Error::Shape { op: o, msg } => {
            assert_eq!(*o, op, "{e}");
            for w in words {
                assert!(msg.contains(w), "'{w}' missing from: {e}");
            }
        }
        _ => panic!("expected a {op} shape error, got {e:?}"),
    }
}

// ---- 1. Misaligned views and tensors ------------------------------------------------------------

#[test]
fn misaligned_views_are_refused_with_dtype_offset_and_stride() {
    let mut g = Graph::new();
    let x = g.input(DType::F32, &[16, 4]).unwrap();
    let h = g.input(DType::F16, &[16, 4]).unwrap();
    let ids = g.input(DType::I32, &[8]).unwrap();
    let q = g.input(DType::Q4_0, &[64, 2]).unwrap();
    let q8k = g.input(DType::Q8_K, &[256, 2]).unwrap();

    // Offsets that are not a multiple of the element's alignment.
    let e = g.view_1d(x, 4, 2).unwrap_err();
    shape_err(e, "view_1d", &["f32", "offset 2", "multiples of 4"]);
    let e = g.view_1d(h, 4, 1).unwrap_err();
    shape_err(e, "view_1d", &["f16", "offset 1", "multiples of 2"]);
    let e = g.view_1d(ids, 2, 2).unwrap_err();
    shape_err(e, "view_1d", &["i32", "offset 2"]);
    let e = g.view_1d(q, 32, 1).unwrap_err();
    shape_err(e, "view_1d", &["q4_0", "offset 1"]);
    let e = g.view_2d(q8k, [256, 1], 292, 2).unwrap_err();
    shape_err(e, "view_2d", &["q8_K", "offset 2", "multiples of 4"]);
    // A view of a view adds up the offsets: 4 + 2 is misaligned for f32.
    let v = g.view_1d(x, 8, 4).unwrap();
    let e = g.view_1d(v, 2, 2).unwrap_err();
    shape_err(e, "view_1d", &["offset 6"]);

    // Strides.
    let e = g.view_2d(x, [2, 4], 6, 0).unwrap_err();
    shape_err(e, "view_2d", &["f32", "nb[1] = 6", "alignment 4"]);
    let e = g.view_3d(h, [2, 2, 2], [4, 9], 0).unwrap_err();
    shape_err(e, "view_3d", &["f16", "nb[2] = 9"]);
    let e = g.view_4d(x, [2, 2, 2, 2], [8, 16, 34], 0).unwrap_err();
    shape_err(e, "view_4d", &["nb[3] = 34"]);

    // Aligned ones still work, and a stride of a one-element dim is never used.
    g.view_1d(x, 4, 4).unwrap();
    g.view_1d(h, 4, 2).unwrap();
    g.view_1d(q, 32, 18).unwrap();
    g.view_2d(x, [2, 1], 6, 0).unwrap();
}

#[test]
fn misaligned_weights_and_gguf_tensors_are_refused() {
    // A caller buffer bound at an odd offset.
    let buf = Buffer::alloc(64).unwrap();
    let mut g = Graph::new();
    let e = g.weight(DType::F32, &[4], &buf, 2).unwrap_err();
    shape_err(e, "weight", &["f32", "byte offset 2", "multiple of 4"]);
    let e = g.state(DType::F16, &[4], &buf, 3).unwrap_err();
    shape_err(e, "state", &["f16", "byte offset 3"]);
    g.weight(DType::F32, &[4], &buf, 4).unwrap();
    // Borrowed memory that itself starts at an odd address: offset 0 is not enough, the address
    // is what the kernels dereference.
    struct OddStart(Vec<u8>);
    impl AsRef<[u8]> for OddStart {
        fn as_ref(&self) -> &[u8] {
            let skip = (4 - self.0.as_ptr() as usize % 4) % 4 + 1; // 1 past a multiple of 4
            &self.0[skip..skip + 32]
        }
    }
    let odd = Buffer::from_host(OddStart(vec![0; 40]));
    let e = g.weight(DType::F32, &[4], &odd, 0).unwrap_err();
    shape_err(e, "weight", &["f32", "byte offset 0", "misaligned"]);
    g.weight(DType::F32, &[4], &odd, 3).unwrap();
    g.weight(DType::I8, &[4], &odd, 0).unwrap();

    // A GGUF file with general.alignment = 1 and an f32 tensor after an odd number of bytes.
    let f32s: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let file = (1..4)
        .map(|pad| {
            let mut w = GgufWriter::new();
            w.set_alignment(1).unwrap();
            w.add_tensor_owned("pad", DType::I8, &[pad], vec![0; pad]).unwrap();
            w.add_tensor("w", DType::F32, &[4], &f32s).unwrap();
            GgufFile::from_bytes(&w.to_vec().unwrap()).unwrap()
        })
        .find(|f| !f.tensor("w").unwrap().offset().is_multiple_of(4))
        .unwrap();
    let off = file.tensor("w").unwrap().offset();
    let mut g = Graph::new();
    let e = file.bind(&mut g, "w").unwrap_err();
    shape_err(e, "weight", &["f32", &format!("byte offset {off}"), "general.alignment"]);
    // The byte tensor itself needs no alignment.
    file.bind(&mut g, "pad").unwrap();
}

/// An empty weight reads no byte, so the placeholder address of an empty buffer is not refused
/// as misaligned; its product plans and computes to an empty output.
#[test]
fn empty_weights_bind_and_multiply() {
    let be = CpuBackend::with_threads(2).unwrap();
    for dt in [DType::F32, DType::Q4_0, DType::Q4_K] {
        let empty = Buffer::from_host(Vec::<u8>::new());
        let mut g = Graph::new();
        let w = g.weight(dt, &[256, 0], &empty, 0).unwrap();
        let x = g.input(DType::F32, &[256, 3]).unwrap();
        let y = g.mul_mat(w, x).unwrap();
        g.set_output(y).unwrap();
        let mut plan = Plan::new(g, &be).unwrap();
        plan.set_input(x, &[0.5f32; 256 * 3]).unwrap();
        plan.compute().unwrap();
        assert!(plan.output_bytes(y).unwrap().is_empty(), "{dt}");
    }
    // A weight with bytes at an empty buffer is still refused (it does not fit).
    let mut g = Graph::new();
    let e = g.weight(DType::F32, &[4], &Buffer::from_host(Vec::<u8>::new()), 0).unwrap_err();
    shape_err(e, "weight", &["f32", "buffer has 0 bytes"]);
}

#[test]
fn an_empty_reduction_is_refused_by_name() {
    // K = 0: no element per row. The refusal names the empty dimension, not a layout.
    let mut g = Graph::new();
    let empty = Buffer::from_host(Vec::<u8>::new());
    for dt in [DType::F32, DType::Q4_0] {
        let w = g.weight(dt, &[0, 4], &empty, 0).unwrap();
        let x = g.input(DType::F32, &[0, 3]).unwrap();
        let e = g.mul_mat(w, x).unwrap_err();
        shape_err(e, "mul_mat", &["ne[0] is 0", "[0, 4, 1, 1]"]);
        let ws = g.weight(dt, &[0, 4, 2], &empty, 0).unwrap();
        let xs = g.input(DType::F32, &[0, 1, 3]).unwrap();
        let ids = g.input(DType::I32, &[1, 3]).unwrap();
        let e = g.mul_mat_id(ws, xs, ids).unwrap_err();
        shape_err(e, "mul_mat_id", &["ne[0] is 0"]);
    }
}

// ---- 2. Destinations that overlap themselves ----------------------------------------------------

#[test]
fn destinations_whose_rows_overlap_are_refused() {
    let mut g = Graph::new();
    let src = g.input(DType::F32, &[64, 4]).unwrap();
    let dst = g.input(DType::F32, &[64, 4]).unwrap();
    // Rows of 256 bytes, 4 bytes apart, or all at the same place.
    for nb1 in [4, 0] {
        let v = g.view_2d(dst, [64, 4], nb1, 0).unwrap(); // reading such a view is fine
        let e = g.cpy(src, v).unwrap_err();
        shape_err(e, "cpy", &["more than once", &format!("{nb1}")]);
        let e = g.unary_inplace(v, quantgraph::UnaryOp::Relu).unwrap_err();
        shape_err(e, "relu", &["more than once"]);
    }
    // set_rows into an overlapping cache view.
    let rows = g.input(DType::F32, &[64, 2]).unwrap();
    let ids = g.input(DType::I32, &[2]).unwrap();
    let v = g.view_2d(dst, [64, 4], 128, 0).unwrap();
    let e = g.set_rows(v, rows, ids).unwrap_err();
    shape_err(e, "set_rows", &["more than once"]);

    // set and acc write b through caller strides into a copy of a: rows of b must not land on
    // the same bytes either.
    let small = g.input(DType::F32, &[8, 4]).unwrap();
    let e = g.set(dst, small, [16, 64, 64], 0).unwrap_err();
    shape_err(e, "set", &["more than once", "stride of 16 bytes inside a span of 32"]);
    let e = g.acc(dst, small, [0, 128, 128], 0).unwrap_err();
    shape_err(e, "acc", &["more than once"]);
    let e = g.acc_inplace(dst, small, [16, 128, 128], 0).unwrap_err();
    shape_err(e, "acc", &["more than once"]);
    g.set(dst, small, [32, 128, 128], 0).unwrap();
    g.acc(dst, small, [256, 1024, 1024], 0).unwrap();

    // Disjoint strided and transposed destinations are still accepted and computed.
    let wide = g.input(DType::F32, &[64, 8]).unwrap();
    let every_other = g.view_2d(wide, [64, 4], 512, 0).unwrap();
    let c = g.cpy(src, every_other).unwrap();
    g.set_output(c).unwrap();
    let sq = g.input(DType::F32, &[4, 4]).unwrap();
    let sq_dst = g.input(DType::F32, &[4, 4]).unwrap();
    let t = g.transpose(sq_dst).unwrap();
    let ct = g.cpy(sq, t).unwrap();
    let out = g.cont(ct).unwrap();
    g.set_output(out).unwrap();
    let mut p = Plan::new(g, &CpuBackend::with_threads(2).unwrap()).unwrap();
    p.set_input(src, &vec![1.0f32; 256]).unwrap();
    p.set_input(wide, &vec![0.0f32; 512]).unwrap();
    let m: Vec<f32> = (0..16).map(|i| i as f32).collect();
    p.set_input(sq, &m).unwrap();
    p.set_input(sq_dst, &[0.0f32; 16]).unwrap();
    p.compute().unwrap();
    assert_eq!(p.output::<f32>(out).unwrap(), &m[..]);
}

#[test]
fn sources_sharing_memory_with_the_destination_are_refused() {
    // cpy of a tensor onto itself handed the same address to both sides of a non-overlapping
    // copy (undefined behaviour, caught as an abort by the standard library's checks), and a
    // source overlapping its destination at another offset made workers race.
    let mut g = Graph::new();
    let x = g.input(DType::F32, &[8, 4]).unwrap();
    let y = g.rms_norm(x, 1e-5).unwrap();
    let e = g.cpy(y, y).unwrap_err();
    shape_err(e, "cpy", &["source", "shares memory with the destination", "bytes 0..128"]);
    let head = g.view_2d(y, [8, 3], 32, 0).unwrap();
    let tail = g.view_2d(y, [8, 3], 32, 32).unwrap();
    let e = g.cpy(head, tail).unwrap_err();
    shape_err(e, "cpy", &["bytes 0..96", "bytes 32..128"]);
    // State tensors bound to the same caller buffer overlap as well.
    let buf = Buffer::alloc(256).unwrap();
    let s0 = g.state(DType::F32, &[16], &buf, 0).unwrap();
    let s1 = g.state(DType::F32, &[16], &buf, 32).unwrap();
    let e = g.cpy(s0, s1).unwrap_err();
    shape_err(e, "cpy", &["shares memory"]);
    // In-place ops, set_rows and acc: no source may overlap the memory written...
    let e = g.add_inplace(tail, head).unwrap_err();
    shape_err(e, "add", &["shares memory"]);
    let row = g.view_2d(x, [8, 1], 32, 0).unwrap();
    let e = g.mul_inplace(x, row).unwrap_err();
    shape_err(e, "mul", &["shares memory"]);
    let e = g.acc_inplace(y, head, [32, 96, 96], 0).unwrap_err();
    shape_err(e, "acc", &["shares memory"]);
    let ids = g.input(DType::I32, &[3]).unwrap();
    let e = g.set_rows(y, head, ids).unwrap_err();
    shape_err(e, "set_rows", &["rows", "shares memory"]);
    // ...but an elementwise op may read exactly the elements it writes, and disjoint parts of
    // one tensor copy into each other.
    let sq = g.mul_inplace(y, y).unwrap();
    let lo = g.view_2d(x, [8, 2], 32, 0).unwrap();
    let hi = g.view_2d(x, [8, 2], 32, 64).unwrap();
    let c = g.cpy(lo, hi).unwrap();
    g.set_output(sq).unwrap();
    g.set_output(c).unwrap();
    let mut p = Plan::new(g, &CpuBackend::with_threads(2).unwrap()).unwrap();
    p.set_input(x, &[2.0f32; 32]).unwrap();
    p.compute().unwrap();
    assert!(p.output::<f32>(sq).unwrap().iter().all(|&v| (v - 1.0).abs() < 1e-5));
}

// ---- 3. Zero dimensions and arena overflow at build and plan time --------------------------------

#[test]
fn zero_dims_and_plan_size_overflow_return_errors() {
    let mut g = Graph::new();
    let a = g.input(DType::F32, &[4, 3, 2]).unwrap();
    let b = g.input(DType::F32, &[4, 5, 2]).unwrap();
    let a0 = g.view_3d(a, [4, 3, 0], [16, 48], 0).unwrap();
    let e = g.mul_mat(a0, b).unwrap_err();
    shape_err(e, "mul_mat", &["dividing"]);

    let s = g.input(DType::F32, &[8, 4, 2]).unwrap();
    let m = g.input(DType::F32, &[8, 4, 1]).unwrap();
    let m0 = g.view_3d(m, [8, 4, 0], [32, 128], 0).unwrap();
    let e = g.soft_max_ext(s, Some(m0), 1.0, 0.0).unwrap_err();
    shape_err(e, "soft_max_ext", &["mask"]);

    let q = g.input(DType::F32, &[8, 2, 2]).unwrap();
    let k = g.input(DType::F16, &[8, 4, 1]).unwrap();
    let v = g.input(DType::F16, &[8, 4, 1]).unwrap();
    let k0 = g.view_3d(k, [8, 4, 0], [16, 64], 0).unwrap();
    let v0 = g.view_3d(v, [8, 4, 0], [16, 64], 0).unwrap();
    let fa = FlashAttnParams::new(0.5);
    let e = g.flash_attn_ext(q, k0, v0, None, None, fa).unwrap_err();
    shape_err(e, "flash_attn_ext", &["divide"]);
    let fm = g.input(DType::F16, &[4, 2, 1]).unwrap();
    let fm0 = g.view_3d(fm, [4, 2, 0], [8, 16], 0).unwrap();
    let e = g.flash_attn_ext(q, k, v, Some(fm0), None, fa).unwrap_err();
    shape_err(e, "flash_attn_ext", &["mask"]);

    let dst = g.input(DType::F32, &[8, 4, 2]).unwrap();
    let rows = g.input(DType::F32, &[8, 2, 2]).unwrap();
    let ids = g.input(DType::I32, &[2, 1]).unwrap();
    let ids0 = g.view_2d(ids, [2, 0], 8, 0).unwrap();
    let e = g.set_rows(dst, rows, ids0).unwrap_err();
    shape_err(e, "set_rows", &["ids"]);

    // Empty results compute to nothing (a cpy of [0, 4] used to divide by its ne[0] of 0).
    let mut g = Graph::new();
    let a = g.input(DType::F32, &[0, 4]).unwrap();
    let d = g.input(DType::F16, &[0, 4]).unwrap();
    let c = g.cpy(a, d).unwrap();
    let s = g.sum(a).unwrap();
    g.set_output(c).unwrap();
    g.set_output(s).unwrap();
    let mut p = Plan::new(g, &CpuBackend::with_threads(2).unwrap()).unwrap();
    p.set_input::<f32>(a, &[]).unwrap();
    p.set_input_bytes(d, &[]).unwrap();
    p.compute().unwrap();
    assert_eq!(p.output::<f32>(s).unwrap(), &[0.0]);

    // An empty tensor still counts its rows: [0, 2^40, 2^40] would make ne[1] * ne[2] overflow
    // (and a row count times a row size in work-buffer sizes), so it is refused like a full one.
    let mut g = Graph::new();
    let e = g.input(DType::F32, &[0, 1 << 40, 1 << 40]).unwrap_err();
    assert!(matches!(e, Error::Overflow { what: "tensor element count" }), "{e:?}");
    let x = g.input(DType::F32, &[4]).unwrap();
    let e = g.view_4d(x, [0, 1 << 31, 1 << 31, 1], [0, 0, 0], 0).unwrap_err();
    assert!(matches!(e, Error::Overflow { what: "view element count" }), "{e:?}");
    // Reductions of an empty tensor with many rows return at once instead of walking 2^50
    // empty rows (sum, count_equal) or asking for a partial sum per row (cross_entropy_loss).
    let a = g.input(DType::F32, &[0, 1 << 30, 1 << 20]).unwrap();
    let ia = g.input(DType::I32, &[0, 1 << 30, 1 << 20]).unwrap();
    let s = g.sum(a).unwrap();
    let ce = g.cross_entropy_loss(a, a).unwrap();
    let eq = g.count_equal(ia, ia).unwrap();
    for y in [s, ce, eq] {
        g.set_output(y).unwrap();
    }
    let start = std::time::Instant::now();
    let mut p = Plan::new(g, &CpuBackend::with_threads(2).unwrap()).unwrap();
    p.set_input::<f32>(a, &[]).unwrap();
    p.set_input::<i32>(ia, &[]).unwrap();
    p.compute().unwrap();
    assert!(start.elapsed() < std::time::Duration::from_secs(5));
    assert_eq!(p.output::<f32>(s).unwrap(), &[0.0]);
    assert_eq!(p.output::<f32>(ce).unwrap()[0], 0.0);
    assert_eq!(p.output::<i64>(eq).unwrap(), &[0]);

    // Three live 2^62-byte tensors do not fit an arena: Err before allocating, not a wrapped size.
    let mut g = Graph::new();
    let x = g.input(DType::F32, &[1 << 60]).unwrap();
    let y = g.scale(x, 2.0).unwrap();
    let z = g.add(y, x).unwrap();
    g.set_output(y).unwrap();
    g.set_output(z).unwrap();
    let be = CpuBackend::with_threads(1).unwrap();
    let e = Plan::new(g.clone(), &be).err().unwrap();
    assert!(matches!(e, Error::Overflow { what: "plan arena size" }), "{e:?}");
    let e = Plan::with_guards(g, &be, usize::MAX - 3).err().unwrap();
    assert!(matches!(e, Error::Overflow { what: "plan guard size" }), "{e:?}");
    let mut g = Graph::new();
    let x = g.input(DType::F32, &[16]).unwrap();
    let y = g.scale(x, 2.0).unwrap();
    g.set_output(y).unwrap();
    let e = Plan::with_guards(g, &be, usize::MAX / 4).err().unwrap();
    assert!(matches!(e, Error::Overflow { what: "plan arena size" }), "{e:?}");
}

// ---- 4. Accepted but wrong ------------------------------------------------------------------------

#[test]
fn overflowing_views_foreign_ids_and_mismatched_shapes_are_errors() {
    let mut g = Graph::new();
    let x = g.input(DType::F32, &[4]).unwrap();
    // Zero strides keep the byte span tiny, but 2^80 elements do not fit a usize.
    let e = g.view_4d(x, [1, 1 << 40, 1 << 40, 1 << 8], [0, 0, 0], 0).unwrap_err();
    assert!(matches!(e, Error::Overflow { what: "view element count" }), "{e:?}");

    // A TensorId from another graph, even one whose number exists here.
    let mut other = Graph::new();
    let foreign = other.input(DType::F32, &[4]).unwrap();
    assert_eq!(foreign.index(), x.index());
    let e = g.silu(foreign).unwrap_err();
    match &e {
        Error::InvalidArgument(m) => assert!(m.contains("another graph"), "{e}"),
        _ => panic!("{e:?}"),
    }
    assert!(g.shape(foreign).is_err());
    assert!(g.name(foreign).is_none());
    // set_output refuses it, and the graph stays usable.
    let y = g.silu(x).unwrap();
    g.set_output(y).unwrap();
    let e = g.set_output(foreign).unwrap_err();
    assert!(e.to_string().contains("set_output") && e.to_string().contains("another graph"), "{e}");
    assert!(Plan::new(g.clone(), &CpuBackend::with_threads(1).unwrap()).is_ok());
    // Clones share ids: planning the original graph's ids through a clone still works.
    let mut h = Graph::new();
    let hx = h.input(DType::F32, &[2]).unwrap();
    let hy = h.scale(hx, 3.0).unwrap();
    h.set_output(hy).unwrap();
    let mut p = Plan::new(h.clone(), &CpuBackend::with_threads(1).unwrap()).unwrap();
    p.set_input(hx, &[1.0f32, 2.0]).unwrap();
    p.compute().unwrap();
    assert_eq!(p.output::<f32>(hy).unwrap(), &[3.0, 6.0]);
    assert!(p.set_input(foreign, &[0.0f32; 4]).is_err());

    // get_rows_back: one id per gradient row.
    let mut g = Graph::new();
    let grad = g.input(DType::F32, &[4, 3]).unwrap();
    let ids = g.input(DType::I32, &[2]).unwrap();
    let like = g.input(DType::F32, &[4, 5]).unwrap();
    let e = g.get_rows_back(grad, ids, like).unwrap_err();
    shape_err(e, "get_rows_back", &["one id per grad row"]);
}

fn small_cfg() -> LlamaConfig {
    LlamaConfig {
        n_embd: 64,
        n_layer: 2,
        n_head: 4,
        n_head_kv: 2,
        n_ff: 96,
        n_vocab: 40,
        n_ctx: 16,
        rope_base: 10000.0,
        eps: 1e-5,
    }
}

/// Rewrites a GGUF with `meta` overriding metadata and `tensor` replacing tensors by name.
fn rewrite(
    file: &GgufFile,
    meta: &[(&str, u64)],
    tensor: Option<(&str, DType, Vec<usize>, Vec<u8>)>,
) -> GgufFile {
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata().iter() {
        match meta.iter().find(|(m, _)| *m == k) {
            Some(&(_, n)) => w.add(k, n).unwrap(),
            None => w.add(k, v.clone()).unwrap(),
        };
    }
    for t in file.tensors() {
        match &tensor {
            Some((name, dt, ne, data)) if *name == t.name() => {
                w.add_tensor_owned(name, *dt, ne, data.clone()).unwrap()
            }
            _ => w
                .add_tensor_owned(
                    t.name(),
                    t.dtype(),
                    t.shape(),
                    file.tensor_data(t.name()).unwrap(),
                )
                .unwrap(),
        };
    }
    GgufFile::from_bytes(&w.to_vec().unwrap()).unwrap()
}

#[test]
fn llama_output_rows_must_match_the_vocabulary() {
    let c = small_cfg();
    let file =
        GgufFile::from_vec(synthetic_gguf(&c, WeightTypes::all(DType::F32), 3).unwrap()).unwrap();
    let be = CpuBackend::with_threads(1).unwrap();
    for rows in [c.n_vocab + 8, c.n_vocab - 8] {
        let data = vec![0u8; c.n_embd * rows * 4];
        let f =
            rewrite(&file, &[], Some(("output.weight", DType::F32, vec![c.n_embd, rows], data)));
        let e = Llama::from_gguf(&f, None, &be).err().unwrap();
        let m = e.to_string();
        assert!(m.contains("output.weight") && m.contains(&format!("{rows}")), "{m}");
        assert!(m.contains(&format!("[{}, {}, 1, 1]", c.n_embd, c.n_vocab)), "{m}");
    }
    // The untouched file still loads and runs.
    let mut m = Llama::from_gguf(&file, None, &be).unwrap();
    assert_eq!(m.forward(&[1, 2]).unwrap().len(), 2 * c.n_vocab);
}

// ---- 5. Would abort: hyperparameters the file does not back ----------------------------------------

#[test]
fn llama_huge_block_count_is_refused_before_allocating() {
    let c = small_cfg();
    let file =
        GgufFile::from_vec(synthetic_gguf(&c, WeightTypes::all(DType::F32), 5).unwrap()).unwrap();
    let be = CpuBackend::with_threads(1).unwrap();
    // 2 blocks of 9 tensors plus 3 others: even one block more than the file holds is refused
    // by counting, before any block is looked up or any cache allocated.
    for n in [(1u64 << 32) - 1, 1 << 40, 3] {
        let f = rewrite(&file, &[("llama.block_count", n)], None);
        let e = Llama::from_gguf(&f, None, &be).err().unwrap();
        let m = e.to_string();
        assert!(m.contains(&format!("block_count {n}")) && m.contains("21 tensors"), "{m}");
    }
    // A context the cache cannot hold: Err, not a multi-TiB allocation.
    let e = Llama::from_gguf(&file, Some(usize::MAX / 2), &be).err().unwrap();
    assert!(matches!(e, Error::Overflow { what: "kv cache" }), "{e:?}");
}

// ---- 6. Thread counts ------------------------------------------------------------------------------

#[test]
fn thread_counts_above_the_maximum_are_refused_at_once() {
    let start = std::time::Instant::now();
    let be = CpuBackend::with_threads(1).unwrap();
    let e = be.set_n_threads(10_000).unwrap_err();
    assert!(e.to_string().contains("10000") && e.to_string().contains("512"), "{e}");
    assert_eq!(be.n_threads(), 1);
    let e = be.set_n_threads(MAX_THREADS + 1).unwrap_err();
    assert!(e.to_string().contains("513"), "{e}");
    assert!(CpuBackend::with_threads(4000).is_err());
    assert!(start.elapsed() < std::time::Duration::from_secs(2));
    // The backend still works.
    be.set_n_threads(2).unwrap();
    assert_eq!(be.n_threads(), 2);
}

// ---- 7. Hangs: unbounded loops and computes that wait on themselves ---------------------------------

#[test]
fn dsv4_hc_comb_iteration_count_is_bounded() {
    let mut g = Graph::new();
    let mixes = g.input(DType::F32, &[24, 2]).unwrap();
    let scale = g.input(DType::F32, &[3]).unwrap();
    let base = g.input(DType::F32, &[24]).unwrap();
    for n in [i32::MAX, quantgraph::DSV4_HC_MAX_ITER + 1] {
        let e = g.dsv4_hc_comb(mixes, scale, base, 1e-6, n).unwrap_err();
        match &e {
            Error::Param { op, msg } => {
                assert_eq!(*op, "dsv4_hc_comb");
                assert!(msg.contains(&format!("n_iter = {n}")) && msg.contains("1024"), "{e}");
            }
            _ => panic!("{e:?}"),
        }
    }
    // The largest count accepted runs in a moment.
    let y = g.dsv4_hc_comb(mixes, scale, base, 1e-6, quantgraph::DSV4_HC_MAX_ITER).unwrap();
    g.set_output(y).unwrap();
    let mut p = Plan::new(g, &CpuBackend::with_threads(1).unwrap()).unwrap();
    p.set_input(mixes, &[0.5f32; 48]).unwrap();
    p.set_input(scale, &[1.0f32; 3]).unwrap();
    p.set_input(base, &[0.0f32; 24]).unwrap();
    let start = std::time::Instant::now();
    p.compute().unwrap();
    assert!(start.elapsed() < std::time::Duration::from_secs(5));
    // Uniform logits stay uniform: every entry 1/4.
    assert!(p.output::<f32>(y).unwrap().iter().all(|v| (v - 0.25).abs() < 1e-3));
}

/// A plan on `be` whose custom op runs `inner` on worker 0 and records its result.
fn nesting_plan(
    be: &CpuBackend,
    inner: impl Fn() -> quantgraph::Result<()> + Send + Sync + 'static,
    seen: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) -> (Plan, quantgraph::TensorId) {
    let body: quantgraph::CustomFn = std::sync::Arc::new(move |a| {
        if a.ith == 0 {
            let r = inner();
            seen.lock().unwrap().push(match r {
                Ok(()) => "ok".into(),
                Err(e) => e.to_string(),
            });
        }
        a.dst.fill(1.0);
        Ok(())
    });
    let mut g = Graph::new();
    let x = g.input(DType::F32, &[8, 4]).unwrap();
    let y = g.map_custom1(x, "nested", None, body).unwrap();
    g.set_output(y).unwrap();
    let mut p = Plan::new(g, be).unwrap();
    p.set_input(x, &[0.0f32; 32]).unwrap();
    (p, x)
}

#[test]
fn a_compute_nested_back_through_another_backend_is_an_error_not_a_deadlock() {
    use std::sync::{Arc, Mutex, mpsc};
    // a (backend X) -> b (backend Y) -> c (backend X again): X's team is busy running a, so c
    // would wait for a, which waits for b, which waits for c.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let x = CpuBackend::with_threads(2).unwrap();
        let y = CpuBackend::with_threads(2).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (c_plan, _) = nesting_plan(&x, || Ok(()), seen.clone());
        let c_plan = Arc::new(Mutex::new(c_plan));
        let (b_plan, _) = nesting_plan(&y, move || c_plan.lock().unwrap().compute(), seen.clone());
        let b_plan = Arc::new(Mutex::new(b_plan));
        let (mut a_plan, _) =
            nesting_plan(&x, move || b_plan.lock().unwrap().compute(), seen.clone());
        let r = a_plan.compute().map_err(|e| e.to_string());
        let log = seen.lock().unwrap().clone();
        let _ = tx.send((r, log));
    });
    let (r, log) = rx.recv_timeout(std::time::Duration::from_secs(60)).expect("deadlocked");
    assert_eq!(r, Ok(()));
    // c refused (inside b), then b finished, then a.
    assert_eq!(log.len(), 2, "{log:?}");
    assert!(log[0].contains("through a compute on another backend"), "{log:?}");
    assert_eq!(log[1], "ok");
}
