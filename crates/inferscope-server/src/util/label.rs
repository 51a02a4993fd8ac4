//! Client-supplied strings that become label values, stats keys and log fields (model names,
//! feedback signal names): bounded in length and free of control characters, so one request
//! cannot make every later `/metrics` scrape huge or forge log structure.

use std::borrow::Cow;

/// Marks a value that was cut.
pub const CUT: char = '…';

/// Characters a label must not carry: controls (C0, DEL, C1), the bidirectional formatting
/// characters that reorder what a reader sees (U+061C, U+200E/F, U+202A–E, U+2066–9: a
/// right-to-left override makes `gpt-4` display as another name), and the line and paragraph
/// separators some viewers break lines at (U+2028/9).
pub fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
                | '\u{2028}'
                | '\u{2029}'
        )
}

/// `s` with unsafe characters (`is_unsafe`: controls, bidi controls) replaced by `?` and, when longer than `max` bytes, cut at a
/// character boundary and ended with `…` (the result is then at most `max` bytes plus the mark).
/// Borrows when nothing needed changing.
pub fn bounded(s: &str, max: usize) -> Cow<'_, str> {
    let clean = !s.chars().any(is_unsafe);
    if clean && s.len() <= max {
        return Cow::Borrowed(s);
    }
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = String::with_capacity(end + CUT.len_utf8());
    out.extend(s[..end].chars().map(|c| if is_unsafe(c) { '?' } else { c }));
    if end < s.len() {
        out.push(CUT);
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_cuts_at_a_char_boundary_and_replaces_controls() {
        assert!(matches!(bounded("llama-3", 16), Cow::Borrowed("llama-3")));
        assert_eq!(bounded("a\nb\u{1b}[31m", 64), "a?b?[31m");
        assert_eq!(
            bounded("gpt\u{202e}4-bad\u{2066}x\u{200f}", 64),
            "gpt?4-bad?x?"
        );
        assert_eq!(bounded("a\u{2028}b\u{85}", 64), "a?b?");
        assert_eq!(bounded("ééé", 3), "é…");
        assert_eq!(
            bounded(&"x".repeat(5 << 20), 256).len(),
            256 + CUT.len_utf8()
        );
    }
}
