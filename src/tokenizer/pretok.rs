//! Pre-tokenizers: the regular expressions llama.cpp applies before BPE (`tokenizer.ggml.pre`),
//! written as hand-rolled matchers over characters.
//!
//! Each pattern is a leftmost-first alternation that splits a piece of text into words; several
//! patterns run in turn, each one on every piece the previous one produced, and text a pattern
//! does not match stays as a piece of its own (llama.cpp's `unicode_regex_split`). The matchers
//! give the same splits as the regular expressions (commented at each matcher), in linear time
//! and without a regex engine: the patterns need Unicode categories and a `(?!\S)` lookahead.

use super::unicode::{Flags, flags};

/// The pre-tokenizer of a BPE vocabulary, from `tokenizer.ggml.pre`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PreTokenizer {
    /// llama.cpp's default (an empty or `"default"` value).
    Default,
    /// GPT-2's pattern (`gpt-2`, `phi-2`, `mpt`, `olmo`, ...).
    Gpt2,
    /// Llama 3's pattern (`llama-bpe`, `llama3`, `llama-v3`, ...): digits in groups of up to 3.
    Llama3,
    /// Qwen 2's pattern (`qwen2`, `deepseek-r1-qwen`, `megrez`, ...): Llama 3's with single digits.
    Qwen2,
    /// Single digits, then GPT-2's pattern (`smollm`, `starcoder`, `refact`, `command-r`, ...).
    Smollm,
}

impl PreTokenizer {
    /// The pre-tokenizer llama.cpp uses for a `tokenizer.ggml.pre` value, or `None` for one it
    /// implements differently (or not at all).
    pub fn from_name(name: &str) -> Option<PreTokenizer> {
        Some(match name {
            "" | "default" => PreTokenizer::Default,
            "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es"
            | "jina-v2-de" | "a.x-4.0" | "mellum" | "modern-bert" | "mpt" | "olmo" | "jais"
            | "trillion" | "granite-docling" | "exaone4" => PreTokenizer::Gpt2,
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" | "jina-v5-nano" => PreTokenizer::Llama3,
            "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" | "stablelm2"
            | "hunyuan" | "solar-open" => PreTokenizer::Qwen2,
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
            | "minerva-7b" | "mellum2" => PreTokenizer::Smollm,
            _ => return None,
        })
    }

    /// llama.cpp's `ignore_merges`: a word that is a token as a whole is not merged.
    pub(crate) fn ignore_merges(self) -> bool {
        self == PreTokenizer::Llama3
    }

    /// Splits `text` into words (character ranges in `chars`).
    pub(crate) fn split(self, chars: &[char]) -> Vec<(usize, usize)> {
        let f: Vec<Flags> = chars.iter().map(|&c| flags(c)).collect();
        let t = Text { c: chars, f: &f };
        let whole = vec![(0, chars.len())];
        match self {
            PreTokenizer::Default => {
                let p = t.run(&whole, |t, lo, hi, i| {
                    // [\p{P}\$\+<=>\^~\|]+
                    let is = |j: usize| t.f[j].punct || "$+<=>^~|".contains(t.c[j]);
                    let _ = lo;
                    if !is(i) {
                        return None;
                    }
                    let mut e = i;
                    while e < hi && is(e) {
                        e += 1;
                    }
                    Some(e)
                });
                let p = t.run(&p, gpt2);
                // \p{N}+
                let p = t.run(&p, |t, _, hi, i| {
                    if !t.f[i].number {
                        return None;
                    }
                    let mut e = i;
                    while e < hi && t.f[e].number {
                        e += 1;
                    }
                    Some(e)
                });
                // [0-9][0-9][0-9]
                t.run(&p, |t, _, hi, i| {
                    (i + 3 <= hi && t.c[i..i + 3].iter().all(|c| c.is_ascii_digit()))
                        .then_some(i + 3)
                })
            }
            PreTokenizer::Gpt2 => t.run(&whole, gpt2),
            PreTokenizer::Smollm => {
                // \p{N}
                let p = t.run(&whole, |t, _, _, i| t.f[i].number.then_some(i + 1));
                t.run(&p, gpt2)
            }
            PreTokenizer::Llama3 => t.run(&whole, |t, lo, hi, i| llama3(t, lo, hi, i, 3)),
            PreTokenizer::Qwen2 => t.run(&whole, |t, lo, hi, i| llama3(t, lo, hi, i, 1)),
        }
    }
}

struct Text<'a> {
    c: &'a [char],
    f: &'a [Flags],
}

/// A matcher: given a piece `[lo, hi)` and a start `i` in it, the end of the match at `i`, if any.
type Matcher<'m> = dyn Fn(&Text, usize, usize, usize) -> Option<usize> + 'm;

impl Text<'_> {
    /// Applies one pattern to every piece: each match becomes a piece, and so does each run of
    /// unmatched text between matches.
    fn run<F>(&self, pieces: &[(usize, usize)], m: F) -> Vec<(usize, usize)>
    where
        F: Fn(&Text, usize, usize, usize) -> Option<usize>,
    {
        let m: &Matcher = &m;
        let mut out = Vec::with_capacity(pieces.len());
        for &(lo, hi) in pieces {
            let mut gap = lo;
            let mut i = lo;
            while i < hi {
                match m(self, lo, hi, i) {
                    Some(e) if e > i => {
                        if gap < i {
                            out.push((gap, i));
                        }
                        out.push((i, e));
                        i = e;
                        gap = e;
                    }
                    _ => i += 1,
                }
            }
            if gap < hi {
                out.push((gap, hi));
            }
        }
        out
    }
}

/// `'s|'t|'re|'ve|'m|'ll|'d` (case-insensitive when `fold`).
fn contraction(t: &Text, hi: usize, i: usize, fold: bool) -> Option<usize> {
    if t.c[i] != '\'' || i + 1 >= hi {
        return None;
    }
    let low = |j: usize| if fold { t.c[j].to_ascii_lowercase() } else { t.c[j] };
    let a = low(i + 1);
    if matches!(a, 's' | 't' | 'm' | 'd') {
        return Some(i + 2);
    }
    if i + 2 < hi && matches!((a, low(i + 2)), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
        return Some(i + 3);
    }
    None
}

fn other(f: Flags) -> bool {
    !(f.space || f.letter || f.number)
}

/// The number of whitespace characters from `i` and the end of the last `\r`/`\n` among them.
fn space_run(t: &Text, hi: usize, i: usize) -> (usize, Option<usize>) {
    let mut n = 0;
    let mut last_nl = None;
    while i + n < hi && t.f[i + n].space {
        if matches!(t.c[i + n], '\r' | '\n') {
            last_nl = Some(i + n + 1);
        }
        n += 1;
    }
    (n, last_nl)
}

/// `\s+(?!\S)`, then (when `plain` is set) `\s+`, at a run of `n` whitespace characters.
fn trailing_space(hi: usize, i: usize, n: usize, plain: bool) -> Option<usize> {
    if n == 0 {
        None
    } else if i + n == hi {
        Some(hi)
    } else if n > 1 {
        // Leave the last one for the word after it.
        Some(i + n - 1)
    } else if plain {
        Some(i + 1)
    } else {
        None
    }
}

/// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`
fn gpt2(t: &Text, _lo: usize, hi: usize, i: usize) -> Option<usize> {
    if let Some(e) = contraction(t, hi, i, false) {
        return Some(e);
    }
    let j = if t.c[i] == ' ' && i + 1 < hi { i + 1 } else { i };
    let run = |pred: &dyn Fn(Flags) -> bool| {
        let mut e = j;
        while e < hi && pred(t.f[e]) {
            e += 1;
        }
        e
    };
    if t.f[j].letter {
        return Some(run(&|f| f.letter));
    }
    if t.f[j].number {
        return Some(run(&|f| f.number));
    }
    if other(t.f[j]) {
        return Some(run(&other));
    }
    let (n, _) = space_run(t, hi, i);
    trailing_space(hi, i, n, false)
}

/// Llama 3 (`max_digits` 3) and Qwen 2 (`max_digits` 1):
/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}|
/// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
fn llama3(t: &Text, _lo: usize, hi: usize, i: usize, max_digits: usize) -> Option<usize> {
    if let Some(e) = contraction(t, hi, i, true) {
        return Some(e);
    }
    let (c, f) = (t.c[i], t.f[i]);
    let letters_from = |mut e: usize| {
        while e < hi && t.f[e].letter {
            e += 1;
        }
        e
    };
    if f.letter {
        return Some(letters_from(i + 1));
    }
    if !matches!(c, '\r' | '\n') && !f.number && i + 1 < hi && t.f[i + 1].letter {
        return Some(letters_from(i + 2));
    }
    if f.number {
        let mut e = i;
        while e < hi && e - i < max_digits && t.f[e].number {
            e += 1;
        }
        return Some(e);
    }
    let j = if c == ' ' && i + 1 < hi { i + 1 } else { i };
    if other(t.f[j]) {
        let mut e = j;
        while e < hi && other(t.f[e]) {
            e += 1;
        }
        while e < hi && matches!(t.c[e], '\r' | '\n') {
            e += 1;
        }
        return Some(e);
    }
    let (n, last_nl) = space_run(t, hi, i);
    if let Some(e) = last_nl {
        return Some(e);
    }
    trailing_space(hi, i, n, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(p: PreTokenizer, s: &str) -> Vec<String> {
        let c: Vec<char> = s.chars().collect();
        p.split(&c).into_iter().map(|(a, b)| c[a..b].iter().collect()).collect()
    }

    #[test]
    fn gpt2_splits_words_numbers_and_space_runs() {
        assert_eq!(
            words(PreTokenizer::Gpt2, "Hello world's 123  x!!\n\nok   "),
            ["Hello", " world", "'s", " 123", " ", " x", "!!", "\n", "\n", "ok", "   "]
        );
    }

    #[test]
    fn smollm_isolates_digits() {
        assert_eq!(words(PreTokenizer::Smollm, "ab 2024x"), ["ab", " ", "2", "0", "2", "4", "x"]);
    }

    #[test]
    fn llama3_groups_digits_and_newlines() {
        assert_eq!(
            words(PreTokenizer::Llama3, "I'M 1234567 ok.\n\n  hi\tthere"),
            ["I", "'M", " ", "123", "456", "7", " ok", ".\n\n", " ", " hi", "\tthere"]
        );
        assert_eq!(words(PreTokenizer::Qwen2, "x 12"), ["x", " ", "1", "2"]);
    }

    #[test]
    fn default_splits_punctuation_then_digit_triples() {
        assert_eq!(words(PreTokenizer::Default, "a+=b 12345"), ["a", "+=", "b", " ", "123", "45"]);
    }
}
