//! Tokenizers read from a GGUF file's `tokenizer.ggml.*` metadata, with llama.cpp's vocabulary
//! code (`src/llama-vocab.cpp`) as the specification: the same ids for the same text.
//!
//! Two vocabulary types are supported:
//! - `tokenizer.ggml.model = "gpt2"`: byte-level BPE (merges from `tokenizer.ggml.merges`) after
//!   the pre-tokenizer named by `tokenizer.ggml.pre` ([`PreTokenizer`]).
//! - `tokenizer.ggml.model = "llama"`: SentencePiece-style merging by token score, with byte
//!   fallback (`<0xXX>` tokens) and a space prefix (`tokenizer.ggml.add_space_prefix`).
//!
//! Control, user-defined and unknown tokens (`tokenizer.ggml.token_type`) are found in the text
//! before anything else when `parse_special` is set (user-defined ones always); BOS and EOS are
//! added by the model's rules (`tokenizer.ggml.add_bos_token`, `add_eos_token`). Decoding turns
//! ids back into bytes; [`StreamDecoder`] turns a stream of ids into text without splitting a
//! UTF-8 character that spans tokens.
//!
//! ```no_run
//! use quantgraph::GgufFile;
//! use quantgraph::tokenizer::Tokenizer;
//!
//! let file = GgufFile::open("model.gguf")?;
//! let tok = Tokenizer::from_gguf(&file)?;
//! let ids = tok.encode("Hello world", true, true);
//! assert_eq!(tok.decode(&ids, false), "Hello world");
//! # Ok::<(), quantgraph::Error>(())
//! ```

mod bpe;
mod pretok;
mod spm;
mod unicode;

pub use pretok::PreTokenizer;

use crate::error::{Error, Result};

/// One symbol of a text being merged (BPE and SentencePiece-style): a byte range of the text,
/// linked to its neighbours.
#[derive(Clone, Copy)]
pub(crate) struct Sym {
    pub start: usize,
    pub len: usize,
    pub prev: Option<usize>,
    pub next: Option<usize>,
}

/// The symbols of `text`'s characters, each linked to its neighbours.
pub(crate) fn char_syms(text: &str) -> Vec<Sym> {
    let mut syms: Vec<Sym> = Vec::with_capacity(text.len());
    for (start, c) in text.char_indices() {
        let n = syms.len();
        syms.push(Sym {
            start,
            len: c.len_utf8(),
            prev: n.checked_sub(1),
            next: (start + c.len_utf8() < text.len()).then_some(n + 1),
        });
    }
    syms
}
use crate::gguf::{GgufFile, Metadata, Value};
use std::collections::HashMap;

/// Token attributes (llama.cpp's `llama_token_attr` bits), from `tokenizer.ggml.token_type`.
pub mod attr {
    /// `tokenizer.ggml.token_type` 2: the unknown token.
    pub const UNKNOWN: u32 = 1 << 0;
    /// Type 5: a token the model never produces.
    pub const UNUSED: u32 = 1 << 1;
    /// Type 1: an ordinary token.
    pub const NORMAL: u32 = 1 << 2;
    /// Type 3: a control token (BOS, EOS, chat markers); found in text only when parsing
    /// special tokens, decoded to text only when asked.
    pub const CONTROL: u32 = 1 << 3;
    /// Type 4: a token added by the model's authors; always found in text as a whole.
    pub const USER_DEFINED: u32 = 1 << 4;
    /// Type 6: a byte-fallback token (`<0xXX>`).
    pub const BYTE: u32 = 1 << 5;
}

/// The vocabulary type (`tokenizer.ggml.model`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TokenizerKind {
    /// `"gpt2"`: byte-level BPE after a pre-tokenizer.
    Bpe(PreTokenizer),
    /// `"llama"`: SentencePiece-style, by score, with byte fallback.
    Spm,
}

/// A tokenizer: the vocabulary, its merges or scores, its special tokens and its rules.
#[derive(Clone, Debug)]
pub struct Tokenizer {
    kind: TokenizerKind,
    tokens: Vec<String>,
    attrs: Vec<u32>,
    scores: Vec<f32>,
    ids: HashMap<String, u32>,
    ranks: HashMap<(String, String), u32>,
    /// Tokens matched in text before tokenizing: control, user-defined and unknown ones,
    /// longest first.
    special: Vec<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eog: Vec<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    clean_spaces: bool,
    /// The token of each byte: GPT-2's byte character (BPE) or `<0xXX>` (SPM).
    byte_tokens: Vec<Option<u32>>,
    /// Each token's bytes when decoded with special tokens shown.
    pieces: Vec<Vec<u8>>,
}

/// Text names of end-of-turn tokens: llama.cpp marks these as control tokens that end
/// generation, whatever their type in the file.
const EOG_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
    "[e~[",
];

/// End-of-turn names llama.cpp takes as the EOT token, in its order of preference.
const EOT_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
    "<end_of_utterance>",
];

/// Fill-in-the-middle tokens llama.cpp also treats as ending generation.
const FIM_EOG_NAMES: &[&str] = &[
    "<|fim_pad|>",
    "<fim-pad>",
    "<fim_pad>",
    "<PAD>",
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
    "<|file_sep|>",
];

fn meta_id(md: &Metadata, key: &str) -> Result<Option<u32>> {
    let n: i128 = match md.get(key) {
        None => return Ok(None),
        Some(Value::U8(x)) => *x as i128,
        Some(Value::I8(x)) => *x as i128,
        Some(Value::U16(x)) => *x as i128,
        Some(Value::I16(x)) => *x as i128,
        Some(Value::U32(x)) => *x as i128,
        Some(Value::I32(x)) => *x as i128,
        Some(Value::U64(x)) => *x as i128,
        Some(Value::I64(x)) => *x as i128,
        Some(v) => {
            return Err(Error::Gguf(format!(
                "tokenizer: '{key}' has type {}, not an integer",
                v.type_name()
            )));
        }
    };
    Ok(u32::try_from(n).ok())
}

fn meta_bool(md: &Metadata, key: &str) -> Result<Option<bool>> {
    match md.get(key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => {
            Err(Error::Gguf(format!("tokenizer: '{key}' has type {}, not a bool", v.type_name())))
        }
    }
}

/// A piece of text to tokenize, or a special token found in it.
enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

impl Tokenizer {
    /// The tokenizer of a GGUF file (its `tokenizer.ggml.*` metadata).
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer> {
        Tokenizer::from_metadata(file.metadata())
    }

    /// The tokenizer described by GGUF metadata. `Err` names the key at fault: a missing token
    /// list, an unsupported `tokenizer.ggml.model` or `tokenizer.ggml.pre`, arrays of the wrong
    /// type or length.
    pub fn from_metadata(md: &Metadata) -> Result<Tokenizer> {
        let model = md.get_str("tokenizer.ggml.model").map_err(|_| {
            Error::Gguf("tokenizer: 'tokenizer.ggml.model' is missing or not a string".into())
        })?;
        let pre_name = match md.get("tokenizer.ggml.pre") {
            Some(Value::String(s)) => s.as_str(),
            _ => "",
        };
        let kind = match model {
            "gpt2" => TokenizerKind::Bpe(PreTokenizer::from_name(pre_name).ok_or_else(|| {
                Error::Gguf(format!(
                    "tokenizer: pre-tokenizer '{pre_name}' (tokenizer.ggml.pre) is not supported"
                ))
            })?),
            "llama" => TokenizerKind::Spm,
            m => {
                return Err(Error::Gguf(format!(
                    "tokenizer: model '{m}' (tokenizer.ggml.model) is not supported; \
                     'gpt2' (BPE) and 'llama' (SentencePiece) are"
                )));
            }
        };
        let mut tokens: Vec<String> = md.get_arr::<String>("tokenizer.ggml.tokens")?.to_vec();
        let n = tokens.len();
        if n == 0 || n > i32::MAX as usize {
            return Err(Error::Gguf(format!("tokenizer: {n} tokens in tokenizer.ggml.tokens")));
        }
        for (i, t) in tokens.iter_mut().enumerate() {
            if t.is_empty() {
                *t = format!("[EMPTY_{i}]");
            }
        }
        let scores: Vec<f32> = match md.get("tokenizer.ggml.scores") {
            None => vec![0.0; n],
            Some(_) => {
                let s = md.get_arr::<f32>("tokenizer.ggml.scores")?;
                if s.len() < n {
                    return Err(Error::Gguf(format!(
                        "tokenizer: {} scores for {n} tokens",
                        s.len()
                    )));
                }
                s[..n].to_vec()
            }
        };
        let mut attrs: Vec<u32> = match md.get("tokenizer.ggml.token_type") {
            None => vec![attr::NORMAL; n],
            Some(_) => {
                let t = md.get_arr::<i32>("tokenizer.ggml.token_type")?;
                if t.len() < n {
                    return Err(Error::Gguf(format!(
                        "tokenizer: {} token types for {n} tokens",
                        t.len()
                    )));
                }
                t[..n]
                    .iter()
                    .map(|&ty| match ty {
                        1 => attr::NORMAL,
                        2 => attr::UNKNOWN,
                        3 => attr::CONTROL,
                        4 => attr::USER_DEFINED,
                        5 => attr::UNUSED,
                        6 => attr::BYTE,
                        _ => 0,
                    })
                    .collect()
            }
        };
        let mut ids = HashMap::with_capacity(n);
        for (i, t) in tokens.iter().enumerate() {
            ids.insert(t.clone(), i as u32);
        }
        let mut ranks = HashMap::new();
        if let TokenizerKind::Bpe(_) = kind {
            let merges = md.get_arr::<String>("tokenizer.ggml.merges")?;
            ranks.reserve(merges.len());
            for (i, m) in merges.iter().enumerate() {
                // llama.cpp splits at the first space after the first byte.
                let (a, b) = match m.as_bytes().iter().skip(1).position(|&c| c == b' ') {
                    Some(p) => (m[..p + 1].to_string(), m[p + 2..].to_string()),
                    None => (String::new(), String::new()),
                };
                ranks.entry((a, b)).or_insert(i as u32);
            }
        }
        let (mut add_bos, mut add_space_prefix, clean_spaces, def_bos, def_eos, def_unk) =
            match kind {
                TokenizerKind::Spm => (true, true, false, Some(1), Some(2), Some(0)),
                TokenizerKind::Bpe(p) => (
                    p == PreTokenizer::Llama3,
                    false,
                    !matches!(p, PreTokenizer::Qwen2 | PreTokenizer::Smollm),
                    Some(11),
                    Some(11),
                    None,
                ),
            };
        let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
        let pick = |key: &str, default: Option<u32>| -> Result<Option<u32>> {
            Ok(match meta_id(md, key)? {
                Some(i) if (i as usize) < n => Some(i),
                _ => in_range(default),
            })
        };
        let bos = pick("tokenizer.ggml.bos_token_id", def_bos)?;
        let eos = pick("tokenizer.ggml.eos_token_id", def_eos)?;
        let mut eot = pick("tokenizer.ggml.eot_token_id", None)?;
        let eom = pick("tokenizer.ggml.eom_token_id", None)?;
        let _unk = pick("tokenizer.ggml.unknown_token_id", def_unk)?;
        if let Some(b) = meta_bool(md, "tokenizer.ggml.add_bos_token")? {
            add_bos = b;
        }
        let add_eos = meta_bool(md, "tokenizer.ggml.add_eos_token")?.unwrap_or(false);
        if let Some(b) = meta_bool(md, "tokenizer.ggml.add_space_prefix")? {
            add_space_prefix = b;
        }
        if add_bos && bos.is_none() {
            return Err(Error::Gguf(
                "tokenizer: add_bos_token is set but there is no BOS token".into(),
            ));
        }
        if add_eos && eos.is_none() {
            return Err(Error::Gguf(
                "tokenizer: add_eos_token is set but there is no EOS token".into(),
            ));
        }
        // End-of-generation tokens by name, as llama.cpp finds them; they become control tokens.
        if eot.is_none() {
            eot = EOT_NAMES.iter().find_map(|name| ids.get(*name).copied());
        }
        let mut eog: Vec<u32> = Vec::new();
        for name in EOG_NAMES.iter().chain(FIM_EOG_NAMES) {
            if let Some(&id) = ids.get(*name) {
                attrs[id as usize] |= attr::CONTROL;
                eog.push(id);
            }
        }
        if let Some(e) = eot {
            attrs[e as usize] |= attr::CONTROL;
        }
        eog.extend([eos, eot, eom].into_iter().flatten());
        eog.sort_unstable();
        eog.dedup();
        // llama.cpp's two exceptions: "<|end|>" is a plain marker where "<|return|>" and
        // "<|call|>" (or "<|calls|>" and "<|flush|>") end turns, and "</s>" is a normal token
        // where "<|tool_response>" or "<|plamo:eos|>" exists.
        let has = |name: &str| ids.get(name).is_some_and(|i| eog.contains(i));
        let call = has("<|call|>") || has("<|calls|>");
        let end_is_marker = has("<|end|>") && call && (has("<|return|>") || has("<|flush|>"));
        let s_is_normal = has("</s>") && (has("<|tool_response>") || has("<|plamo:eos|>"));
        for (name, flag, a) in
            [("<|end|>", end_is_marker, attr::USER_DEFINED), ("</s>", s_is_normal, attr::NORMAL)]
        {
            if let (true, Some(&id)) = (flag, ids.get(name)) {
                eog.retain(|&i| i != id);
                attrs[id as usize] = a;
            }
        }
        let mut special: Vec<u32> = (0..n as u32)
            .filter(|&i| {
                attrs[i as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
            })
            .collect();
        special.sort_by_key(|&i| std::cmp::Reverse(tokens[i as usize].len()));
        let byte_tokens: Vec<Option<u32>> = (0..=255u8)
            .map(|b| match kind {
                TokenizerKind::Bpe(_) => {
                    ids.get(unicode::byte_to_char()[b as usize].to_string().as_str()).copied()
                }
                TokenizerKind::Spm => ids
                    .get(&format!("<0x{b:02X}>"))
                    .copied()
                    .or_else(|| std::str::from_utf8(&[b]).ok().and_then(|s| ids.get(s).copied())),
            })
            .collect();
        let mut t = Tokenizer {
            kind,
            tokens,
            attrs,
            scores,
            ids,
            ranks,
            special,
            bos,
            eos,
            eot,
            eog,
            add_bos,
            add_eos,
            add_space_prefix,
            clean_spaces,
            byte_tokens,
            pieces: Vec::new(),
        };
        t.pieces = (0..n as u32).map(|i| t.piece_uncached(i)).collect();
        Ok(t)
    }

    /// The vocabulary type and pre-tokenizer.
    pub fn kind(&self) -> TokenizerKind {
        self.kind
    }

    /// Number of tokens in the vocabulary.
    pub fn n_tokens(&self) -> usize {
        self.tokens.len()
    }

    /// The BOS token, if the vocabulary has one.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// The EOS token, if the vocabulary has one.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// The end-of-turn token (`<|im_end|>`, `<|eot_id|>`, ...), if the vocabulary has one.
    pub fn eot(&self) -> Option<u32> {
        self.eot
    }

    /// Whether `encode` with `add_special` puts BOS first.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// True for a token that ends generation (EOS, EOT and llama.cpp's other end tokens).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// The id of a token by its exact text in the vocabulary.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    /// The text of a token as stored in the vocabulary (GPT-2 byte characters, `▁` for spaces).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// The attribute bits of a token ([`attr`]).
    pub fn token_attr(&self, id: u32) -> Option<u32> {
        self.attrs.get(id as usize).copied()
    }

    /// Tokenizes `text`. `add_special` adds BOS / EOS as the model asks; `parse_special` finds
    /// control tokens written in the text (`<|im_start|>`) instead of tokenizing their characters.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let frags = self.partition(text, parse_special);
        let mut out = Vec::new();
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        match self.kind {
            TokenizerKind::Spm => {
                let mut prev_special = true;
                for f in frags {
                    match f {
                        Fragment::Text(s) => {
                            let mut t = String::with_capacity(s.len() + 3);
                            if self.add_space_prefix && prev_special {
                                t.push(' ');
                            }
                            t.push_str(s);
                            let t = t.replace(' ', "\u{2581}");
                            spm::tokenize(&t, self, &mut out);
                            prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
            }
            TokenizerKind::Bpe(pre) => {
                for f in frags {
                    match f {
                        Fragment::Text(s) => {
                            self.bpe_text(pre, s, &mut out, &|a, b| self.rank(a, b))
                        }
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    /// Splits `text` at the special tokens it contains, longest tokens first (llama.cpp's
    /// `tokenizer_st_partition`).
    fn partition<'a>(&self, text: &'a str, parse_special: bool) -> Vec<Fragment<'a>> {
        let mut frags = Vec::new();
        if text.is_empty() {
            return frags;
        }
        frags.push(Fragment::Text(text));
        for &id in &self.special {
            let a = self.attrs[id as usize];
            if !parse_special && a & (attr::CONTROL | attr::UNKNOWN) != 0 {
                continue;
            }
            let tt = self.tokens[id as usize].as_str();
            if !frags.iter().any(|f| matches!(f, Fragment::Text(s) if s.contains(tt))) {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                match f {
                    Fragment::Text(mut s) => {
                        while let Some(p) = s.find(tt) {
                            if p > 0 {
                                next.push(Fragment::Text(&s[..p]));
                            }
                            next.push(Fragment::Token(id));
                            s = &s[p + tt.len()..];
                        }
                        if !s.is_empty() {
                            next.push(Fragment::Text(s));
                        }
                    }
                    tok => next.push(tok),
                }
            }
            frags = next;
        }
        frags
    }

    fn rank(&self, a: &str, b: &str) -> Option<u32> {
        // The map is keyed by owned pairs; a lookup allocates the pair once.
        self.ranks.get(&(a.to_string(), b.to_string())).copied()
    }

    fn bpe_text(
        &self,
        pre: PreTokenizer,
        text: &str,
        out: &mut Vec<u32>,
        rank: &dyn Fn(&str, &str) -> Option<u32>,
    ) {
        let chars: Vec<char> = text.chars().collect();
        let map = unicode::byte_to_char();
        let mut buf = [0u8; 4];
        for (a, b) in pre.split(&chars) {
            let mut word = String::with_capacity(2 * (b - a));
            for c in &chars[a..b] {
                for &byte in c.encode_utf8(&mut buf).as_bytes() {
                    word.push(map[byte as usize]);
                }
            }
            if pre.ignore_merges()
                && let Some(&id) = self.ids.get(&word)
            {
                out.push(id);
                continue;
            }
            for sym in bpe::merge(&word, rank) {
                match self.ids.get(sym) {
                    Some(&id) => out.push(id),
                    // llama.cpp looks each byte of the symbol up as a one-byte token.
                    None => out.extend(
                        sym.bytes()
                            .filter(u8::is_ascii)
                            .filter_map(|byte| self.ids.get(&(byte as char).to_string()).copied()),
                    ),
                }
            }
        }
    }

    /// A token's bytes when decoded (llama.cpp's `token_to_piece`); control and unknown tokens
    /// give nothing unless `special`. `Err` for an id outside the vocabulary.
    pub fn piece(&self, id: u32, special: bool) -> Result<&[u8]> {
        let a = *self.attrs.get(id as usize).ok_or_else(|| {
            Error::arg(format!(
                "tokenizer: token {id} is outside the vocabulary of {}",
                self.n_tokens()
            ))
        })?;
        if !special && a & (attr::CONTROL | attr::UNKNOWN) != 0 {
            return Ok(&[]);
        }
        Ok(&self.pieces[id as usize])
    }

    fn piece_uncached(&self, id: u32) -> Vec<u8> {
        let (a, text) = (self.attrs[id as usize], &self.tokens[id as usize]);
        if a & (attr::CONTROL | attr::UNKNOWN | attr::USER_DEFINED) != 0 {
            return text.as_bytes().to_vec();
        }
        if a & attr::NORMAL != 0 {
            return match self.kind {
                TokenizerKind::Spm => text.replace('\u{2581}', " ").into_bytes(),
                TokenizerKind::Bpe(_) => {
                    let mut out = Vec::with_capacity(text.len());
                    for c in text.chars() {
                        match unicode::char_to_byte(c) {
                            Some(b) => out.push(b),
                            None => {
                                let mut u = [0u8; 4];
                                let hex: String = c
                                    .encode_utf8(&mut u)
                                    .bytes()
                                    .map(|b| format!("{b:02x}"))
                                    .collect();
                                out.extend(format!("[UNK_BYTE_0x{hex}{text}]").into_bytes());
                            }
                        }
                    }
                    out
                }
            };
        }
        if a & attr::BYTE != 0 {
            let b = text.get(3..5).and_then(|h| u8::from_str_radix(h, 16).ok());
            return b.map(|b| vec![b]).unwrap_or_default();
        }
        Vec::new()
    }

    /// The bytes of `ids` as llama.cpp's `detokenize` gives them (without removing special
    /// tokens): the space prefix of SentencePiece vocabularies removed from the first piece,
    /// and, for vocabularies that ask for it, spaces before punctuation cleaned up.
    /// `Err` for an id outside the vocabulary.
    pub fn decode_bytes(&self, ids: &[u32], special: bool) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut remove_space = self.add_space_prefix;
        for &id in ids {
            let mut p = self.piece(id, special)?;
            if remove_space && p.first() == Some(&b' ') {
                p = &p[1..];
            }
            remove_space = false;
            out.extend_from_slice(p);
        }
        if self.clean_spaces {
            clean_up_spaces(&mut out);
        }
        Ok(out)
    }

    /// Decodes `ids` to text ([`Tokenizer::decode_bytes`]), with U+FFFD for bytes that are not
    /// UTF-8 and ids outside the vocabulary skipped.
    pub fn decode(&self, ids: &[u32], special: bool) -> String {
        let ok: Vec<u32> =
            ids.iter().copied().filter(|&i| (i as usize) < self.n_tokens()).collect();
        String::from_utf8_lossy(&self.decode_bytes(&ok, special).unwrap_or_default()).into_owned()
    }
}

/// llama.cpp's `clean_up_tokenization_spaces`: " ?", " !", " .", " ," lose the space; a lone
/// apostrophe between spaces loses both; " 's", " 'm", " 're", " 've" lose the space.
fn clean_up_spaces(t: &mut Vec<u8>) {
    let pass = |t: &mut Vec<u8>, f: &dyn Fn(&[u8], usize) -> bool| {
        let mut out: Vec<u8> = Vec::with_capacity(t.len());
        for i in 0..t.len() {
            if i > 0 && t[i - 1] == b' ' && f(t, i) {
                out.pop();
            }
            out.push(t[i]);
        }
        *t = out;
    };
    pass(t, &|t, i| matches!(t[i], b'?' | b'!' | b'.' | b','));
    // " ' " -> "'"
    let mut out: Vec<u8> = Vec::with_capacity(t.len());
    let mut i = 0;
    while i < t.len() {
        let x = t[i];
        if i > 0 && x == b'\'' && i + 1 < t.len() && t[i - 1] == b' ' && t[i + 1] == b' ' {
            out.pop();
            out.push(x);
            i += 2;
            continue;
        }
        out.push(x);
        i += 1;
    }
    *t = out;
    pass(t, &|t, i| {
        t[i] == b'\''
            && i + 1 < t.len()
            && (matches!(t[i + 1], b's' | b'm')
                || (i + 2 < t.len() && matches!((t[i + 1], t[i + 2]), (b'r', b'e') | (b'v', b'e'))))
    });
}

impl spm::SpmVocab for Tokenizer {
    fn id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    fn score(&self, id: u32) -> f32 {
        self.scores[id as usize]
    }

    fn byte(&self, b: u8) -> Option<u32> {
        self.byte_tokens[b as usize]
    }
}

/// Turns generated ids into text as they come: bytes of a UTF-8 character split across tokens
/// are held until the character is complete.
#[derive(Clone, Debug, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    /// An empty decoder.
    pub fn new() -> StreamDecoder {
        StreamDecoder::default()
    }

    /// The text that `id` completes (possibly empty). `special` shows control tokens as text.
    pub fn push(&mut self, tok: &Tokenizer, id: u32, special: bool) -> Result<String> {
        self.pending.extend_from_slice(tok.piece(id, special)?);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    break;
                }
                Err(e) => {
                    let good = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&self.pending[..good]).unwrap_or_default());
                    match e.error_len() {
                        // An incomplete character at the end: wait for more bytes.
                        None => {
                            self.pending.drain(..good);
                            break;
                        }
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..good + bad);
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// The bytes still held, as text (U+FFFD for an incomplete character); empties the decoder.
    pub fn flush(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::BTreeSet;

    /// Writes `tests/data/tokenizer/NAME-trimmed.gguf` for the large BPE vocabularies: the
    /// same ids, keys and special tokens, but only the tokens the test corpus produces and the
    /// merges its words queue (in their original order, so every comparison of ranks is the
    /// same), so the corpus tokenizes exactly as with the full vocabulary. Run by hand with
    /// `QUANTGRAPH_LLAMA_CPP_VOCABS=.../llama.cpp/models cargo test --lib write_trimmed -- --ignored`.
    #[test]
    #[ignore]
    fn write_trimmed_vocabularies() {
        let dir =
            std::env::var("QUANTGRAPH_LLAMA_CPP_VOCABS").expect("QUANTGRAPH_LLAMA_CPP_VOCABS");
        let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tokenizer");
        let corpus: Vec<String> = {
            let s = std::fs::read_to_string(data.join("corpus.json")).unwrap();
            // A JSON array of strings: parse with the GGUF-free minimal route of a test.
            parse_json_strings(&s)
        };
        for name in ["llama-bpe", "qwen2"] {
            let file = GgufFile::open(format!("{dir}/ggml-vocab-{name}.gguf")).unwrap();
            let tok = Tokenizer::from_gguf(&file).unwrap();
            let TokenizerKind::Bpe(pre) = tok.kind else { panic!("{name} is not BPE") };
            let used: RefCell<BTreeSet<u32>> = RefCell::new(BTreeSet::new());
            let rec = |a: &str, b: &str| {
                let r = tok.rank(a, b);
                if let Some(r) = r {
                    used.borrow_mut().insert(r);
                }
                r
            };
            let mut keep: BTreeSet<u32> = tok.special.iter().copied().collect();
            keep.extend(tok.bos);
            keep.extend(tok.eos);
            for text in &corpus {
                for parse in [true, false] {
                    let mut out = Vec::new();
                    for f in tok.partition(text, parse) {
                        match f {
                            Fragment::Text(s) => tok.bpe_text(pre, s, &mut out, &rec),
                            Fragment::Token(id) => out.push(id),
                        }
                    }
                    keep.extend(out);
                }
            }
            let md = file.metadata();
            let merges = md.get_arr::<String>("tokenizer.ggml.merges").unwrap();
            let merges: Vec<String> =
                used.borrow().iter().map(|&r| merges[r as usize].clone()).collect();
            let tokens: Vec<String> =
                (0..tok.n_tokens() as u32)
                    .map(|i| {
                        if keep.contains(&i) {
                            tok.tokens[i as usize].clone()
                        } else {
                            String::new()
                        }
                    })
                    .collect();
            let mut w = crate::gguf::GgufWriter::new();
            for (k, v) in md.iter() {
                match k {
                    "tokenizer.ggml.tokens" => w.add(k, tokens.clone()).unwrap(),
                    "tokenizer.ggml.merges" => w.add(k, merges.clone()).unwrap(),
                    "tokenizer.chat_template" => continue,
                    _ => w.add(k, v.clone()).unwrap(),
                };
            }
            w.write_file(data.join(format!("{name}-trimmed.gguf"))).unwrap();
        }
    }

    fn parse_json_strings(s: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut chars = s.chars().peekable();
        while let Some(c) = chars.next() {
            if c != '"' {
                continue;
            }
            let mut cur = String::new();
            while let Some(c) = chars.next() {
                match c {
                    '"' => break,
                    '\\' => match chars.next().unwrap() {
                        'n' => cur.push('\n'),
                        't' => cur.push('\t'),
                        'r' => cur.push('\r'),
                        'u' => {
                            let h: String = (0..4).map(|_| chars.next().unwrap()).collect();
                            cur.push(char::from_u32(u32::from_str_radix(&h, 16).unwrap()).unwrap());
                        }
                        o => cur.push(o),
                    },
                    o => cur.push(o),
                }
            }
            out.push(cur);
        }
        out
    }
}
