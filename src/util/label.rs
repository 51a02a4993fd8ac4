//! Client-supplied strings that become label values, stats keys and log fields (model names,
//! feedback signal names): bounded in length and free of control characters, so one request
//! cannot make every later `/metrics` scrape huge or forge log structure.

use std::borrow::Cow;

/// Marks a value that was cut.
pub const CUT: char = '…';

/// `s` with control characters replaced by `?` and, when longer than `max` bytes, cut at a
/// character boundary and ended with `…` (the result is then at most `max` bytes plus the mark).
/// Borrows when nothing needed changing.
pub fn bounded(s: &str, max: usize) -> Cow<'_, str> {
    let clean = !s.chars().any(char::is_control);
    if clean && s.len() <= max {
        return Cow::Borrowed(s);
    }
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = String::with_capacity(end + CUT.len_utf8());
    out.extend(
        s[..end]
            .chars()
            .map(|c| if c.is_control() { '?' } else { c }),
    );
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
        assert_eq!(bounded("ééé", 3), "é…");
        assert_eq!(
            bounded(&"x".repeat(5 << 20), 256).len(),
            256 + CUT.len_utf8()
        );
    }
}
