//! Tokenizers from GGUF metadata against llama.cpp's `llama-tokenize` (ids recorded by
//! tests/tokenizer_reference.py in tests/data/tokenizer/) on a corpus with ASCII, accents, CJK,
//! emoji, digits, whitespace runs and special tokens; decoding back to the same text.

use quantgraph::GgufFile;
use quantgraph::tokenizer::{PreTokenizer, StreamDecoder, Tokenizer, TokenizerKind};
use std::path::{Path, PathBuf};

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tokenizer")
}

fn corpus() -> Vec<String> {
    serde_json::from_str(&std::fs::read_to_string(data().join("corpus.json")).unwrap()).unwrap()
}

struct Reference {
    parse_special: Vec<Vec<u32>>,
    no_parse_special: Vec<Vec<u32>>,
}

fn reference(name: &str) -> Reference {
    let v: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(data().join(format!("{name}.json"))).unwrap(),
    )
    .unwrap();
    let ids = |k: &str| -> Vec<Vec<u32>> {
        v[k].as_array()
            .unwrap()
            .iter()
            .map(|l| l.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect())
            .collect()
    };
    Reference { parse_special: ids("parse_special"), no_parse_special: ids("no_parse_special") }
}

fn load(path: &Path) -> Tokenizer {
    Tokenizer::from_gguf(&GgufFile::open(path).unwrap()).unwrap()
}

/// Every corpus entry gives llama.cpp's ids, with and without special-token parsing.
fn check_against_llama_cpp(tok: &Tokenizer, name: &str) {
    let r = reference(name);
    let c = corpus();
    assert_eq!(c.len(), r.parse_special.len());
    let mut bad = Vec::new();
    for (i, text) in c.iter().enumerate() {
        for (parse, want) in [(true, &r.parse_special[i]), (false, &r.no_parse_special[i])] {
            let got = tok.encode(text, true, parse);
            if &got != want {
                bad.push(format!(
                    "{name} {text:?} parse_special={parse}\n  got  {got:?}\n  want {want:?}"
                ));
            }
        }
    }
    assert!(bad.is_empty(), "{} mismatches:\n{}", bad.len(), bad.join("\n"));
}

/// decode(encode(x)) == x for text without special tokens (encoded without BOS, decoded as
/// llama.cpp's detokenizer does).
fn check_roundtrip(tok: &Tokenizer) {
    for text in corpus() {
        let ids = tok.encode(&text, false, false);
        assert_eq!(tok.decode(&ids, true), text, "{:?}", tok.kind());
        // Streaming gives the same text, one token at a time, never a broken character.
        let mut s = StreamDecoder::new();
        let mut streamed = String::new();
        for &id in &ids {
            let piece = s.push(tok, id, true).unwrap();
            assert!(!piece.contains('\u{FFFD}'), "{piece:?}");
            streamed.push_str(&piece);
        }
        streamed.push_str(&s.flush());
        // The streamed text has no space-prefix or clean-up rules: compare with the pieces.
        let pieces: Vec<u8> =
            ids.iter().flat_map(|&i| tok.piece(i, true).unwrap().to_vec()).collect();
        assert_eq!(streamed, String::from_utf8(pieces).unwrap());
    }
}

#[test]
fn smollm_bpe_matches_llama_cpp() {
    let tok = load(&data().join("smollm-vocab.gguf"));
    assert_eq!(tok.kind(), TokenizerKind::Bpe(PreTokenizer::Smollm));
    assert!(!tok.add_bos());
    check_against_llama_cpp(&tok, "smollm");
    check_roundtrip(&tok);
    let im_end = tok.token_id("<|im_end|>").unwrap();
    assert!(tok.is_eog(im_end));
    assert_eq!(tok.eot(), Some(im_end));
}

#[test]
fn gpt2_bpe_matches_llama_cpp() {
    let tok = load(&data().join("gpt-2-vocab.gguf"));
    assert_eq!(tok.kind(), TokenizerKind::Bpe(PreTokenizer::Gpt2));
    check_against_llama_cpp(&tok, "gpt-2");
    check_roundtrip(&tok);
}

#[test]
fn llama_spm_matches_llama_cpp() {
    let tok = load(&data().join("llama-spm-vocab.gguf"));
    assert_eq!(tok.kind(), TokenizerKind::Spm);
    assert!(tok.add_bos());
    check_against_llama_cpp(&tok, "llama-spm");
    check_roundtrip(&tok);
}

/// Llama 3 and Qwen 2 from trimmed copies of llama.cpp's vocabularies (the same ids and special
/// tokens, only the tokens and merges the corpus uses; `llama-tokenize` gives the reference ids
/// on them too). Written by the ignored unit test `tokenizer::tests::write_trimmed_vocabularies`.
#[test]
fn llama3_and_qwen2_bpe_match_llama_cpp_on_trimmed_vocabularies() {
    for (name, pre) in [("llama-bpe", PreTokenizer::Llama3), ("qwen2", PreTokenizer::Qwen2)] {
        let tok = load(&data().join(format!("{name}-trimmed.gguf")));
        assert_eq!(tok.kind(), TokenizerKind::Bpe(pre));
        check_against_llama_cpp(&tok, name);
        check_roundtrip(&tok);
    }
    let tok = load(&data().join("llama-bpe-trimmed.gguf"));
    assert!(tok.add_bos());
    assert!(tok.is_eog(tok.token_id("<|eot_id|>").unwrap()));
}

/// The full Llama 3 and Qwen 2 vocabularies (6-8 MB, not kept here) are read from
/// llama.cpp's `models/` folder, named by `QUANTGRAPH_LLAMA_CPP_VOCABS`, when it is set.
fn big_vocab(name: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("QUANTGRAPH_LLAMA_CPP_VOCABS")?;
    let p = Path::new(&dir).join(format!("ggml-vocab-{name}.gguf"));
    p.exists().then_some(p)
}

#[test]
fn llama3_and_qwen2_bpe_match_llama_cpp_when_present() {
    for (name, pre) in [("llama-bpe", PreTokenizer::Llama3), ("qwen2", PreTokenizer::Qwen2)] {
        let Some(p) = big_vocab(name) else {
            eprintln!("QUANTGRAPH_LLAMA_CPP_VOCABS not set: {name} vocabulary not checked");
            continue;
        };
        let tok = load(&p);
        assert_eq!(tok.kind(), TokenizerKind::Bpe(pre));
        check_against_llama_cpp(&tok, name);
        check_roundtrip(&tok);
    }
}

/// llama.cpp's own tokenizer tests (`models/ggml-vocab-*.gguf.inp` / `.out`, ids from the
/// original Hugging Face tokenizers), for every vocabulary present.
#[test]
fn llama_cpp_vocab_tests_when_present() {
    let Some(dir) = std::env::var_os("QUANTGRAPH_LLAMA_CPP_VOCABS") else {
        eprintln!("QUANTGRAPH_LLAMA_CPP_VOCABS not set: llama.cpp's vocabulary tests not run");
        return;
    };
    for name in ["llama-spm", "gpt-2", "llama-bpe", "qwen2", "starcoder", "refact", "command-r"] {
        let base = Path::new(&dir).join(format!("ggml-vocab-{name}.gguf"));
        let (Ok(inp), Ok(out)) = (
            std::fs::read_to_string(base.with_extension("gguf.inp")),
            std::fs::read_to_string(base.with_extension("gguf.out")),
        ) else {
            continue;
        };
        let tok = load(&base);
        let texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
        let ids: Vec<&str> = out.lines().collect();
        assert!(texts.len() >= ids.len(), "{name}");
        for (t, want) in texts.iter().zip(&ids) {
            let want: Vec<u32> = want.split_whitespace().map(|x| x.parse().unwrap()).collect();
            assert_eq!(tok.encode(t, false, false), want, "{name} {t:?}");
        }
    }
}

#[test]
fn stream_decoder_holds_split_characters() {
    let tok = load(&data().join("llama-spm-vocab.gguf"));
    // 🦙 has no token in this vocabulary: four byte tokens.
    let ids = tok.encode("🦙", false, false);
    assert!(ids.len() >= 4, "{ids:?}");
    let mut s = StreamDecoder::new();
    let mut parts = Vec::new();
    for &id in &ids {
        parts.push(s.push(&tok, id, false).unwrap());
    }
    assert_eq!(parts.concat(), " 🦙");
    assert!(parts[..parts.len() - 1].iter().all(|p| p.is_empty() || p == " "), "{parts:?}");
    // A character cut short is shown as U+FFFD when flushed.
    let mut s = StreamDecoder::new();
    assert_eq!(s.push(&tok, ids[1], false).unwrap(), "");
    assert_eq!(s.flush(), "\u{FFFD}");
}

#[test]
fn special_tokens_and_bos_rules() {
    let tok = load(&data().join("llama-spm-vocab.gguf"));
    let bos = tok.bos().unwrap();
    assert_eq!(tok.encode("", true, true), [bos]);
    assert!(tok.encode("", false, true).is_empty());
    // Control tokens decode to nothing unless asked.
    let ids = tok.encode("<s>hi", false, true);
    assert_eq!(ids[0], bos);
    // As llama.cpp: the space prefix is only removed from a first token that is text.
    assert_eq!(tok.decode(&ids, false), " hi");
    assert_eq!(tok.decode(&ids, true), "<s> hi");
    assert!(tok.piece(tok.n_tokens() as u32, true).is_err());
}

#[test]
fn unsupported_tokenizers_are_named() {
    let mut w = quantgraph::GgufWriter::new();
    w.add("tokenizer.ggml.model", "bert").unwrap();
    w.add("tokenizer.ggml.tokens", vec!["a".to_string()]).unwrap();
    let f = GgufFile::from_vec(w.to_vec().unwrap()).unwrap();
    let e = Tokenizer::from_gguf(&f).unwrap_err().to_string();
    assert!(e.contains("'bert'"), "{e}");
    let mut w = quantgraph::GgufWriter::new();
    w.add("tokenizer.ggml.model", "gpt2").unwrap();
    w.add("tokenizer.ggml.pre", "nonesuch").unwrap();
    w.add("tokenizer.ggml.tokens", vec!["a".to_string()]).unwrap();
    w.add("tokenizer.ggml.merges", Vec::<String>::new()).unwrap();
    let f = GgufFile::from_vec(w.to_vec().unwrap()).unwrap();
    let e = Tokenizer::from_gguf(&f).unwrap_err().to_string();
    assert!(e.contains("'nonesuch'"), "{e}");
}
