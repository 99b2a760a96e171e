//! Property tests for the GGUF reader on random and mutated bytes (a bounded stand-in for the
//! `cargo fuzz` target in fuzz/): it must never panic, and whatever it accepts must describe
//! tensors inside the input, aligned and without overlap.

use proptest::prelude::*;
use quantgraph::DType;
use quantgraph::gguf::{Gguf, GgufWriter, Metadata};

/// A small valid file with metadata of several types and three tensors.
fn seed() -> Vec<u8> {
    let mut m = Metadata::new();
    m.insert("general.architecture", "llama").unwrap();
    m.insert("llama.block_count", 2u32).unwrap();
    m.insert("llama.rope.freq_base", 10000.0f32).unwrap();
    m.insert("tokenizer.ggml.tokens", vec!["<s>".to_string(), "a".into(), "b".into()]).unwrap();
    m.insert("tokenizer.ggml.scores", vec![0.0f32, -1.0, -2.0]).unwrap();
    m.insert("flag", true).unwrap();
    let q = vec![0x11u8; 2 * 34];
    let f = vec![0x22u8; 4 * 4];
    let h = vec![0x33u8; 8 * 2];
    let mut w = GgufWriter::new();
    w.add_all(&m).unwrap();
    w.add_tensor("blk.0.attn_q.weight", DType::Q8_0, &[32, 2], &q).unwrap();
    w.add_tensor("output_norm.weight", DType::F32, &[4], &f).unwrap();
    w.add_tensor("token_embd.weight", DType::F16, &[4, 2], &h).unwrap();
    w.to_vec().unwrap()
}

fn check(bytes: &[u8]) {
    if let Ok(g) = Gguf::parse(bytes) {
        let mut spans: Vec<(usize, usize)> = Vec::new();
        for t in g.tensors() {
            let end = t.offset() + t.size();
            assert!(end <= bytes.len(), "{} ends past the input", t.name());
            assert_eq!(t.offset() % g.alignment(), 0);
            assert_eq!(
                t.size(),
                t.dtype().row_size(t.ne()[0]).unwrap() * t.ne()[1..].iter().product::<usize>()
            );
            if t.size() > 0 {
                spans.push((t.offset(), end));
            }
        }
        spans.sort();
        assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0), "overlapping tensors accepted");
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    /// Overwrite one byte.
    Byte(usize, u8),
    /// Overwrite 8 bytes with an extreme little-endian u64 (lengths, counts, dims, offsets).
    Word(usize, u64),
    /// Overwrite 4 bytes with a u32 (type ids, n_dims, version).
    Half(usize, u32),
    /// Cut the file.
    Truncate(usize),
    /// Insert bytes.
    Insert(usize, Vec<u8>),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let extreme = prop_oneof![
        Just(0u64),
        Just(1),
        Just(u64::MAX),
        Just(i64::MAX as u64),
        Just(1 << 32),
        Just(1 << 40),
        Just(1 << 62),
        any::<u64>(),
        0u64..512,
    ];
    let ids = prop_oneof![0u32..16, 0u32..50, Just(u32::MAX), any::<u32>()];
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Byte(i, b)),
        (any::<usize>(), extreme).prop_map(|(i, v)| Mutation::Word(i, v)),
        (any::<usize>(), ids).prop_map(|(i, v)| Mutation::Half(i, v)),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(i, v)| Mutation::Insert(i, v)),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    let n = bytes.len().max(1);
    match m {
        Mutation::Byte(i, b) => {
            if let Some(x) = bytes.get_mut(i % n) {
                *x = *b;
            }
        }
        Mutation::Word(i, v) => {
            let i = i % n;
            if i + 8 <= bytes.len() {
                bytes[i..i + 8].copy_from_slice(&v.to_le_bytes());
            }
        }
        Mutation::Half(i, v) => {
            let i = i % n;
            if i + 4 <= bytes.len() {
                bytes[i..i + 4].copy_from_slice(&v.to_le_bytes());
            }
        }
        Mutation::Truncate(i) => bytes.truncate(i % n),
        Mutation::Insert(i, v) => {
            let i = i % n.min(bytes.len() + 1);
            bytes.splice(i..i, v.iter().copied());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn mutated_files_never_panic(muts in proptest::collection::vec(mutation(), 1..6)) {
        let mut bytes = seed();
        for m in &muts {
            apply(&mut bytes, m);
        }
        check(&bytes);
    }

    #[test]
    fn random_bytes_never_panic(mut bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        check(&bytes);
        // the same bytes behind a valid magic and version reach the counts and metadata
        let mut b = b"GGUF\x03\0\0\0".to_vec();
        b.append(&mut bytes);
        check(&b);
    }
}

#[test]
fn seed_is_valid() {
    let bytes = seed();
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.tensors().len(), 3);
    check(&bytes);
}
