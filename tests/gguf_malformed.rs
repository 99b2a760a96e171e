//! A corpus of malformed GGUF files, built byte by byte: every one must give `Err` (naming what is
//! wrong), never a panic. Plus the happy paths the corpus is a mutation of.

use quantgraph::gguf::{Gguf, GgufFile, GgufWriter};
use quantgraph::{DType, Error};

/// A raw GGUF file under construction, so tests can write what no honest writer would.
#[derive(Default)]
struct Raw(Vec<u8>);

impl Raw {
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
}

#[derive(Clone)]
struct TensorSpec {
    name: String,
    dims: Vec<u64>,
    ty: u32,
    offset: u64,
}

/// Everything a file is made of; each case mutates one field of [`Spec::valid`].
#[derive(Clone)]
struct Spec {
    magic: [u8; 4],
    version: u32,
    n_tensors: Option<u64>,
    n_kv: Option<u64>,
    /// Encoded (key, type, value) entries.
    kvs: Vec<Vec<u8>>,
    tensors: Vec<TensorSpec>,
    alignment: usize,
    /// Bytes of data after the padded header.
    data_len: usize,
}

fn kv_u32(key: &str, v: u32) -> Vec<u8> {
    let mut r = Raw::default();
    r.str(key).u32(4).u32(v);
    r.0
}

fn kv_str(key: &str, v: &str) -> Vec<u8> {
    let mut r = Raw::default();
    r.str(key).u32(8).str(v);
    r.0
}

fn kv_f32_array(key: &str, v: &[f32]) -> Vec<u8> {
    let mut r = Raw::default();
    r.str(key).u32(9).u32(6).u64(v.len() as u64);
    for x in v {
        r.bytes(&x.to_le_bytes());
    }
    r.0
}

fn tensor(name: &str, dims: &[u64], ty: DType, offset: u64) -> TensorSpec {
    TensorSpec { name: name.into(), dims: dims.to_vec(), ty: ty.ggml_id(), offset }
}

impl Spec {
    /// Two tensors: a Q8_0 [32, 2] (68 bytes at 0) and an F32 [4] (16 bytes at 96), and three
    /// metadata pairs. The file ends exactly at the last tensor's last byte, so every truncation
    /// of it is malformed.
    fn valid() -> Spec {
        Spec {
            magic: *b"GGUF",
            version: 3,
            n_tensors: None,
            n_kv: None,
            kvs: vec![
                kv_u32("general.a", 1),
                kv_str("general.name", "hi"),
                kv_f32_array("general.scores", &[1.0, 2.0]),
            ],
            tensors: vec![
                tensor("t0", &[32, 2], DType::Q8_0, 0),
                tensor("t1", &[4], DType::F32, 96),
            ],
            alignment: 32,
            data_len: 96 + 16,
        }
    }

    fn build(&self) -> Vec<u8> {
        let mut r = Raw::default();
        r.bytes(&self.magic).u32(self.version);
        r.u64(self.n_tensors.unwrap_or(self.tensors.len() as u64));
        r.u64(self.n_kv.unwrap_or(self.kvs.len() as u64));
        for kv in &self.kvs {
            r.bytes(kv);
        }
        for t in &self.tensors {
            r.str(&t.name).u32(t.dims.len() as u32);
            for &d in &t.dims {
                r.u64(d);
            }
            r.u32(t.ty).u64(t.offset);
        }
        while r.0.len() % self.alignment != 0 {
            r.0.push(0);
        }
        let start = r.0.len();
        r.0.extend((0..self.data_len).map(|i| (i * 7 + start) as u8));
        r.0
    }
}

#[track_caller]
fn assert_err(bytes: &[u8], needle: &str) {
    match Gguf::parse(bytes) {
        Ok(_) => panic!("accepted a malformed file (expected an error containing {needle:?})"),
        Err(Error::Gguf(msg)) => {
            assert!(msg.contains(needle), "error {msg:?} does not mention {needle:?}")
        }
        Err(e) => panic!("expected Error::Gguf containing {needle:?}, got {e:?}"),
    }
}

#[track_caller]
fn assert_spec_err(f: impl FnOnce(&mut Spec), needle: &str) {
    let mut s = Spec::valid();
    f(&mut s);
    assert_err(&s.build(), needle);
}

#[test]
fn valid_base_file_parses() {
    let bytes = Spec::valid().build();
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.metadata().len(), 3);
    assert_eq!(g.metadata().get_arr::<f32>("general.scores").unwrap(), &[1.0, 2.0]);
    let t0 = g.tensor("t0").unwrap();
    assert_eq!((t0.dtype(), t0.shape(), t0.size()), (DType::Q8_0, &[32usize, 2][..], 68));
    assert_eq!(t0.offset(), g.data_offset());
    assert_eq!(g.tensor("t1").unwrap().offset(), g.data_offset() + 96);
    assert_eq!(g.data_offset() % 32, 0);
    assert_eq!(g.data_offset() + 96 + 16, bytes.len());
}

#[test]
fn truncated_at_every_byte_is_an_error() {
    let bytes = Spec::valid().build();
    for len in 0..bytes.len() {
        assert!(Gguf::parse(&bytes[..len]).is_err(), "prefix of {len} bytes was accepted");
    }
    // sections: magic, version, counts, kv key, kv value, tensor info, data
    assert_err(&bytes[..2], "truncated reading magic");
    assert_err(&bytes[..6], "truncated reading version");
    assert_err(&bytes[..12], "truncated reading tensor count");
    assert_err(&bytes[..20], "truncated reading metadata count");
    // counts are checked against the bytes left before anything is allocated
    assert_err(&bytes[..30], "metadata count 3 is more than the 6 bytes left");
    assert_err(&bytes[..70], "tensor count 2 is more than the 46 bytes left");
    // header 24 bytes, pairs at 24, 49 and 83, tensor infos at 129 and 171, data at 224
    assert_eq!(bytes.len(), 224 + 112);
    assert_err(&bytes[..100], "key of metadata pair 2");
    assert_err(&bytes[..120], "element count of array 'general.scores'");
    assert_err(&bytes[..125], "element count of array 'general.scores' is 2, more than");
    assert_err(&bytes[..150], "dimension 0 of tensor 't0'");
    assert_err(&bytes[..200], "data offset of tensor 't1'");
    assert_err(&bytes[..210], "file ends before the data section");
    assert_err(&bytes[..300], "tensor 't1' data 96..112");
}

#[test]
fn bad_magic_and_versions() {
    assert_spec_err(|s| s.magic = *b"GGUG", "bad magic");
    assert_spec_err(|s| s.magic = *b"\0\0\0\0", "bad magic");
    assert_spec_err(|s| s.version = 1, "version 1 is not supported");
    assert_spec_err(|s| s.version = 0, "unknown GGUF version 0");
    assert_spec_err(|s| s.version = 4, "unknown GGUF version 4");
    assert_spec_err(|s| s.version = 3u32.swap_bytes(), "big-endian");
    // version 2 has the same layout and is read
    let mut s = Spec::valid();
    s.version = 2;
    assert_eq!(Gguf::parse(&s.build()).unwrap().version(), 2);
}

#[test]
fn huge_or_negative_counts() {
    assert_spec_err(|s| s.n_tensors = Some(u64::MAX), "tensor count -1 is negative");
    assert_spec_err(|s| s.n_kv = Some(1 << 63), "is negative");
    assert_spec_err(|s| s.n_tensors = Some(1 << 40), "tensor count 1099511627776 is more than");
    assert_spec_err(|s| s.n_kv = Some(1 << 40), "metadata count 1099511627776 is more than");
    assert_spec_err(|s| s.n_kv = Some(i64::MAX as u64), "metadata count");
    // one more pair or tensor than present: runs into the next section or the end
    assert_spec_err(|s| s.n_kv = Some(4), "");
    assert_spec_err(|s| s.n_tensors = Some(3), "");
}

#[test]
fn huge_string_and_array_lengths() {
    let mut r = Raw::default();
    r.u64(u64::MAX).bytes(b"key");
    assert_spec_err(|s| s.kvs[0] = r.0.clone(), "string length 18446744073709551615 exceeds");
    let mut r = Raw::default();
    r.u64(1 << 31).bytes(b"key");
    assert_spec_err(|s| s.kvs[0] = r.0.clone(), "exceeds the maximum");
    let mut r = Raw::default();
    r.u64(1000).bytes(b"key");
    assert_spec_err(|s| s.kvs[0] = r.0.clone(), "truncated reading key of metadata pair 0");
    // a string value longer than the file
    let mut r = Raw::default();
    r.str("k").u32(8).u64(1 << 20);
    assert_spec_err(|s| s.kvs[1] = r.0.clone(), "value of metadata key 'k'");
    // arrays whose element counts the file cannot hold, and whose byte size overflows
    for (elem, n) in [(10u32, 1u64 << 61), (0, 1 << 40), (8, 1 << 40), (8, u64::MAX), (12, 1 << 62)]
    {
        let mut r = Raw::default();
        r.str("arr").u32(9).u32(elem).u64(n);
        assert_spec_err(|s| s.kvs[2] = r.0.clone(), "element count of array 'arr'");
    }
    // an array of strings whose element lengths are huge
    let mut r = Raw::default();
    r.str("arr").u32(9).u32(8).u64(2).u64(1).bytes(b"x").u64(u64::MAX);
    assert_spec_err(|s| s.kvs[2] = r.0.clone(), "element 1 of array 'arr'");
    // tensor name length past the end
    let mut s = Spec::valid();
    s.tensors[1].name = "t1".into();
    let mut bytes = s.build();
    let pos = bytes.windows(2).rposition(|w| w == b"t1").unwrap() - 8;
    bytes[pos..pos + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert_err(&bytes, "name of tensor 1");
}

#[test]
fn bad_type_ids() {
    let mut r = Raw::default();
    r.str("k").u32(13).u32(0);
    assert_spec_err(|s| s.kvs[0] = r.0.clone(), "metadata key 'k' has invalid type id 13");
    let mut r = Raw::default();
    r.str("k").u32(u32::MAX).u32(0);
    assert_spec_err(|s| s.kvs[0] = r.0.clone(), "invalid type id 4294967295");
    let mut r = Raw::default();
    r.str("arr").u32(9).u32(77).u64(0);
    assert_spec_err(|s| s.kvs[2] = r.0.clone(), "array 'arr' has invalid element type id 77");
    let mut r = Raw::default();
    r.str("arr").u32(9).u32(9).u64(1).u32(4).u64(0);
    assert_spec_err(|s| s.kvs[2] = r.0.clone(), "nested arrays are not allowed");
    for id in [4u32, 5, 31, 36, 39 + 4, 1000, u32::MAX] {
        assert_spec_err(|s| s.tensors[1].ty = id, &format!("unknown ggml type id {id}"));
    }
}

#[test]
fn bad_values() {
    let mut r = Raw::default();
    r.str("b").u32(7).bytes(&[2]);
    assert_spec_err(|s| s.kvs[0] = r.0.clone(), "bool value 2 is neither 0 nor 1");
    let mut r = Raw::default();
    r.str("arr").u32(9).u32(7).u64(3).bytes(&[0, 1, 255]);
    assert_spec_err(|s| s.kvs[2] = r.0.clone(), "bool value 255");
    let mut r = Raw::default();
    r.str("s").u32(8).u64(2).bytes(&[0xff, 0xfe]);
    assert_spec_err(|s| s.kvs[1] = r.0.clone(), "not valid UTF-8");
    let mut r = Raw::default();
    r.str("").u32(4).u32(0);
    assert_spec_err(|s| s.kvs[0] = r.0.clone(), "empty key");
}

#[test]
fn bad_dimensions() {
    assert_spec_err(|s| s.tensors[1].dims = vec![4, 1, 1, 1, 1], "'t1' has 5 dimensions");
    assert_spec_err(|s| s.tensors[1].dims = vec![1; 100], "100 dimensions");
    assert_spec_err(|s| s.tensors[1].dims = vec![u64::MAX], "dimension 0 is -1");
    assert_spec_err(|s| s.tensors[1].dims = vec![1 << 32, 1 << 32], "element count overflows");
    assert_spec_err(|s| s.tensors[1].dims = vec![1 << 62, 2], "element count overflows");
    assert_spec_err(|s| s.tensors[1].dims = vec![1, 1 << 62, 4], "element count overflows");
    // fits in i64 elements but not in bytes
    assert_spec_err(|s| s.tensors[1].dims = vec![1 << 61, 2], "byte size overflows");
    assert_spec_err(|s| s.tensors[0].dims = vec![33, 2], "not a multiple of the block size 32");
    // large but representable: must fail on the file's size, not allocate
    assert_spec_err(|s| s.tensors[1].dims = vec![1 << 40], "outside the file");
    // zero-sized tensors are fine
    let mut s = Spec::valid();
    s.tensors[1].dims = vec![0, 5];
    assert_eq!(Gguf::parse(&s.build()).unwrap().tensor("t1").unwrap().size(), 0);
}

#[test]
fn bad_offsets() {
    assert_spec_err(|s| s.tensors[1].offset = 100, "data offset 100 is not a multiple of");
    assert_spec_err(|s| s.tensors[1].offset = 8, "not a multiple of the alignment 32");
    assert_spec_err(|s| s.tensors[1].offset = 32, "'t0' (bytes");
    assert_spec_err(|s| s.tensors[1].offset = 32, "overlaps tensor 't1'");
    assert_spec_err(|s| s.tensors[1].offset = 0, "overlaps");
    assert_spec_err(|s| s.tensors[1].offset = 128, "outside the file");
    assert_spec_err(|s| s.tensors[1].offset = 1 << 40, "outside the file");
    assert_spec_err(|s| s.tensors[1].offset = u64::MAX - 31, "outside the file");
    assert_spec_err(|s| s.data_len = 0, "outside the file");
    // file ends inside the padding before the data section
    let mut s = Spec::valid();
    s.data_len = 0;
    let mut bytes = s.build();
    while bytes.len().is_multiple_of(32) {
        bytes.pop();
    }
    assert_err(&bytes, "file ends before the data section");
    // out of order but disjoint is accepted (ggml's writer never does it, the format allows it)
    let mut s = Spec::valid();
    s.tensors[0].offset = 32;
    s.tensors[1].offset = 0;
    assert!(Gguf::parse(&s.build()).is_ok());
}

#[test]
fn duplicate_names_and_keys() {
    assert_spec_err(|s| s.kvs[1] = kv_u32("general.a", 2), "duplicate metadata key 'general.a'");
    assert_spec_err(|s| s.tensors[1].name = "t0".into(), "duplicate tensor name 't0'");
}

#[test]
fn long_tensor_names() {
    assert_spec_err(|s| s.tensors[1].name = "x".repeat(64), "is 64 bytes long, the limit is 63");
    let mut s = Spec::valid();
    s.tensors[1].name = "x".repeat(63);
    assert!(Gguf::parse(&s.build()).is_ok());
}

#[test]
fn bad_alignment() {
    for a in [0u32, 3, 48, u32::MAX] {
        assert_spec_err(|s| s.kvs[0] = kv_u32("general.alignment", a), "not a power of two");
    }
    let mut r = Raw::default();
    r.str("general.alignment").u32(10).u64(32);
    assert_spec_err(|s| s.kvs[0] = r.0.clone(), "must have type u32 but has type u64");
    assert_spec_err(
        |s| s.kvs[0] = kv_str("general.alignment", "32"),
        "must have type u32 but has type str",
    );
    // alignment 64: offsets must be multiples of 64
    assert_spec_err(
        |s| {
            s.kvs[0] = kv_u32("general.alignment", 64);
            s.alignment = 64;
        },
        "not a multiple of the alignment 64",
    );
    let mut s = Spec::valid();
    s.kvs[0] = kv_u32("general.alignment", 64);
    s.alignment = 64;
    s.tensors[1].offset = 128;
    s.data_len = 128 + 16;
    let g = Gguf::parse(&s.build()).unwrap();
    assert_eq!((g.alignment(), g.data_offset() % 64), (64, 0));
}

#[test]
fn errors_from_files_name_the_path() {
    let dir = std::env::temp_dir().join(format!("quantgraph-malformed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.gguf");
    let mut s = Spec::valid();
    s.version = 1;
    std::fs::write(&path, s.build()).unwrap();
    let e = GgufFile::open(&path).unwrap_err().to_string();
    assert!(e.contains("bad.gguf") && e.contains("version 1"), "{e}");
    let e = GgufFile::open(dir.join("missing.gguf")).unwrap_err();
    assert!(matches!(e, Error::Io(_)) && e.to_string().contains("missing.gguf"), "{e}");
    std::fs::write(&path, b"").unwrap();
    assert!(GgufFile::open(&path).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn writer_refuses_what_the_reader_would() {
    let data = [0u8; 16];
    let mut w = GgufWriter::new();
    w.add("k", 1u32).unwrap();
    assert!(w.add("k", 2u32).is_err());
    assert!(w.add("", 2u32).is_err());
    assert!(w.set_alignment(48).is_err());
    assert!(w.add("general.alignment", 64u64).is_err());
    assert!(w.add_tensor("t", DType::F32, &[4], &data[..12]).is_err());
    assert!(w.add_tensor("t", DType::Q4_0, &[4], &data).is_err());
    assert!(w.add_tensor("t", DType::F32, &[1, 1, 1, 1, 4], &data).is_err());
    assert!(w.add_tensor(&"n".repeat(64), DType::F32, &[4], &data).is_err());
    w.add_tensor("t", DType::F32, &[4], &data).unwrap();
    assert!(w.add_tensor("t", DType::F32, &[4], &data).is_err());
    assert!(GgufFile::from_bytes(&w.to_vec().unwrap()).is_ok());
}
