//! Character classes of the pre-tokenizers (Unicode general categories L, N, P and White_Space)
//! and GPT-2's byte-to-character map.
//!
//! The category tables come from `regex-syntax`'s Unicode data (the same tables the `regex` crate
//! matches `\p{L}` with), turned once into sorted range lists searched by bisection.

use std::sync::OnceLock;

/// What a pre-tokenizer needs to know about one character.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Flags {
    /// General category L (Lu, Ll, Lt, Lm, Lo).
    pub letter: bool,
    /// General category N (Nd, Nl, No).
    pub number: bool,
    /// General category P (Pc, Pd, Ps, Pe, Pi, Pf, Po).
    pub punct: bool,
    /// The White_Space property (`\s`).
    pub space: bool,
}

struct Tables {
    letter: Vec<(u32, u32)>,
    number: Vec<(u32, u32)>,
    punct: Vec<(u32, u32)>,
}

fn ranges(class: &str) -> Vec<(u32, u32)> {
    use regex_syntax::hir::{Class, HirKind};
    // The patterns are constants that regex-syntax always accepts with its gencat tables on;
    // an empty table would only make every character "other", never a crash.
    let Ok(hir) = regex_syntax::parse(class) else { return Vec::new() };
    match hir.kind() {
        HirKind::Class(Class::Unicode(c)) => {
            c.ranges().iter().map(|r| (r.start() as u32, r.end() as u32)).collect()
        }
        _ => Vec::new(),
    }
}

fn tables() -> &'static Tables {
    static T: OnceLock<Tables> = OnceLock::new();
    T.get_or_init(|| Tables {
        letter: ranges(r"\p{L}"),
        number: ranges(r"\p{N}"),
        punct: ranges(r"\p{P}"),
    })
}

fn in_ranges(r: &[(u32, u32)], c: u32) -> bool {
    let i = r.partition_point(|&(_, end)| end < c);
    i < r.len() && r[i].0 <= c
}

/// The classes of `c`.
pub(crate) fn flags(c: char) -> Flags {
    if c.is_ascii() {
        return Flags {
            letter: c.is_ascii_alphabetic(),
            number: c.is_ascii_digit(),
            punct: c.is_ascii_punctuation() && !"$+<=>^`|~".contains(c),
            space: c.is_whitespace(),
        };
    }
    let t = tables();
    let u = c as u32;
    Flags {
        letter: in_ranges(&t.letter, u),
        number: in_ranges(&t.number, u),
        punct: in_ranges(&t.punct, u),
        space: c.is_whitespace(),
    }
}

/// GPT-2's reversible map from bytes to printable characters: printable Latin-1 bytes map to
/// themselves, the others to U+0100 onwards in byte order.
pub(crate) fn byte_to_char() -> &'static [char; 256] {
    static M: OnceLock<[char; 256]> = OnceLock::new();
    M.get_or_init(|| {
        let mut m = ['\0'; 256];
        let printable =
            |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
        let mut n = 0;
        for b in 0..256u32 {
            m[b as usize] = if printable(b) {
                char::from_u32(b).unwrap_or('\0')
            } else {
                n += 1;
                char::from_u32(255 + n).unwrap_or('\0')
            };
        }
        m
    })
}

/// The byte a GPT-2 byte character stands for.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    let u = c as u32;
    let printable = |b: u32| {
        (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b)
    };
    if printable(u) {
        return Some(u as u8);
    }
    if (0x100..0x100 + 68).contains(&u) {
        let m = byte_to_char();
        return m.iter().position(|&x| x == c).map(|b| b as u8);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_of_sample_characters() {
        assert!(flags('é').letter && !flags('é').number);
        assert!(flags('中').letter);
        assert!(flags('٣').number && !flags('٣').letter); // Arabic-Indic digit three
        assert!(flags('Ⅻ').number); // Roman numeral, Nl
        assert!(!flags('🦙').letter && !flags('🦙').number && !flags('🦙').punct);
        assert!(flags('。').punct);
        assert!(flags('\u{3000}').space && flags('\u{a0}').space);
        assert!(flags('!').punct && !flags('$').punct);
    }

    #[test]
    fn gpt2_byte_map_roundtrips() {
        let m = byte_to_char();
        assert_eq!(m[b'A' as usize], 'A');
        assert_eq!(m[b' ' as usize], 'Ġ');
        assert_eq!(m[b'\n' as usize], 'Ċ');
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(m[b as usize]), Some(b));
        }
        assert_eq!(char_to_byte('中'), None);
    }
}
