//! SentencePiece-style merging (llama.cpp's `llm_tokenizer_spm_session`): start from the text's
//! characters, repeatedly merge the adjacent pair whose concatenation is the vocabulary token
//! with the highest score (leftmost on ties); symbols that end up as no token are split back into
//! the pairs that formed them, and what is still no token falls back to byte tokens.

use super::{Sym, char_syms};
use std::collections::{BinaryHeap, HashMap};

/// A queued pair: higher score first, then the leftmost.
#[derive(PartialEq)]
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl Eq for Bigram {}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for Bigram {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.score.total_cmp(&o.score).then(o.left.cmp(&self.left))
    }
}

/// What merging needs from the vocabulary.
pub(crate) trait SpmVocab {
    /// The id of a token by its text.
    fn id(&self, text: &str) -> Option<u32>;
    /// The score of a token.
    fn score(&self, id: u32) -> f32;
    /// The token of one byte (`<0xXX>`, else the byte itself as text).
    fn byte(&self, b: u8) -> Option<u32>;
}

/// Appends the tokens of `text` (already whitespace-escaped) to `out`.
pub(crate) fn tokenize(text: &str, vocab: &impl SpmVocab, out: &mut Vec<u32>) {
    let mut syms = char_syms(text);
    let mut queue = BinaryHeap::new();
    // The pair that formed each merged text, for splitting a non-token back (last one wins, as
    // in llama.cpp's map).
    let mut rev: HashMap<&str, (usize, usize)> = HashMap::new();
    for i in 1..syms.len() {
        push(&mut queue, &mut rev, text, vocab, &syms, Some(i - 1), Some(i));
    }
    while let Some(b) = queue.pop() {
        let (ls, rs) = (syms[b.left], syms[b.right]);
        if ls.len == 0 || rs.len == 0 || ls.len + rs.len != b.size {
            continue;
        }
        syms[b.left].len += rs.len;
        syms[b.right].len = 0;
        syms[b.left].next = rs.next;
        if let Some(n) = rs.next {
            syms[n].prev = Some(b.left);
        }
        let (p, n) = (syms[b.left].prev, syms[b.left].next);
        push(&mut queue, &mut rev, text, vocab, &syms, p, Some(b.left));
        push(&mut queue, &mut rev, text, vocab, &syms, Some(b.left), n);
    }
    let mut i = if syms.is_empty() { None } else { Some(0) };
    while let Some(k) = i {
        resegment(text, &syms, k, &rev, vocab, out, 0);
        i = syms[k].next;
    }
}

/// Queues the pair `(l, r)` when its text is a token.
fn push<'t>(
    q: &mut BinaryHeap<Bigram>,
    rev: &mut HashMap<&'t str, (usize, usize)>,
    text: &'t str,
    vocab: &impl SpmVocab,
    syms: &[Sym],
    l: Option<usize>,
    r: Option<usize>,
) {
    let (Some(l), Some(r)) = (l, r) else { return };
    let size = syms[l].len + syms[r].len;
    let s = &text[syms[l].start..syms[l].start + size];
    if let Some(id) = vocab.id(s) {
        q.push(Bigram { score: vocab.score(id), left: l, right: r, size });
        rev.insert(s, (l, r));
    }
}

fn resegment(
    text: &str,
    syms: &[Sym],
    k: usize,
    rev: &HashMap<&str, (usize, usize)>,
    vocab: &impl SpmVocab,
    out: &mut Vec<u32>,
    depth: usize,
) {
    let s = syms[k];
    let piece = &text[s.start..s.start + s.len];
    if let Some(id) = vocab.id(piece) {
        out.push(id);
        return;
    }
    // Splitting recurses at most once per merge; the depth bound only guards a map entry that
    // points back at a larger symbol.
    match rev.get(piece) {
        Some(&(l, r)) if depth < text.len() => {
            resegment(text, syms, l, rev, vocab, out, depth + 1);
            resegment(text, syms, r, rev, vocab, out, depth + 1);
        }
        _ => out.extend(piece.bytes().filter_map(|b| vocab.byte(b))),
    }
}
