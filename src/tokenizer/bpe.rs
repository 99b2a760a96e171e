//! Byte-pair merging of one pre-tokenized word (llama.cpp's `llm_tokenizer_bpe_session`): start
//! from the word's characters, repeatedly merge the adjacent pair with the lowest merge rank
//! (leftmost on ties), until no adjacent pair has a rank.

use super::{Sym, char_syms};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Merges `word` and returns its final symbols as strings, in order. `rank` gives the merge
/// rank of a pair of adjacent symbols, if they merge.
pub(crate) fn merge<'w>(word: &'w str, rank: &dyn Fn(&str, &str) -> Option<u32>) -> Vec<&'w str> {
    let mut syms = char_syms(word);
    let text = |s: &Sym| &word[s.start..s.start + s.len];
    // (rank, left index) ordered smallest first; the right index and the pair's text let a
    // popped entry be recognised as outdated.
    let mut queue: BinaryHeap<Reverse<(u32, usize, usize, usize)>> = BinaryHeap::new();
    let push = |q: &mut BinaryHeap<_>, syms: &[Sym], l: Option<usize>, r: Option<usize>| {
        let (Some(l), Some(r)) = (l, r) else { return };
        if let Some(rank) = rank(text(&syms[l]), text(&syms[r])) {
            q.push(Reverse((rank, l, r, syms[l].len + syms[r].len)));
        }
    };
    for i in 1..syms.len() {
        push(&mut queue, &syms, Some(i - 1), Some(i));
    }
    while let Some(Reverse((_, l, r, size))) = queue.pop() {
        let (ls, rs) = (syms[l], syms[r]);
        // Outdated: one side already merged away or grown since the pair was queued.
        if ls.len == 0 || rs.len == 0 || ls.next != Some(r) || ls.len + rs.len != size {
            continue;
        }
        syms[l].len += rs.len;
        syms[r].len = 0;
        syms[l].next = rs.next;
        if let Some(n) = rs.next {
            syms[n].prev = Some(l);
        }
        push(&mut queue, &syms, syms[l].prev, Some(l));
        push(&mut queue, &syms, Some(l), syms[l].next);
    }
    syms.iter().filter(|s| s.len > 0).map(text).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn merges_lowest_rank_first() {
        let mut r = HashMap::new();
        for (i, (a, b)) in [("l", "o"), ("lo", "w"), ("e", "r"), ("low", "er")].iter().enumerate() {
            r.insert((a.to_string(), b.to_string()), i as u32);
        }
        let rank = |a: &str, b: &str| r.get(&(a.to_string(), b.to_string())).copied();
        assert_eq!(merge("lower", &rank), ["lower"]);
        assert_eq!(merge("lowes", &rank), ["low", "e", "s"]);
        assert_eq!(merge("x", &rank), ["x"]);
    }
}
