//! The simulator's language model for prompt log-probabilities (OpenAI completions with `echo`
//! and `logprobs`, as `inferscope eval --perplexity` asks for them).
//!
//! A token is a word with the whitespace before it (as GPT-style tokenizers split English). Its
//! surprisal is fixed by the word — 0.5 to 4.5 nats from a stable hash, so every variant reads
//! the same text the same way — plus the profile's `nll_shift` (a quantized model's loss of
//! quality: perplexity × e^shift) and a seeded jitter of ±`JITTER` nats per token and request.
//! The first token has no log-probability, as with real servers.

use crate::util::hash::stable_hash;
use crate::util::rng::Rng;
use serde_json::{json, Value};

/// The simulator's tokenizer vocabulary, grown as texts are tokenized.
#[derive(Debug, Default)]
pub struct Vocab {
    ids: std::collections::HashMap<String, u64>,
    tokens: Vec<String>,
}

impl Vocab {
    /// The ids of `text`'s tokens.
    pub fn encode(&mut self, text: &str) -> Vec<u64> {
        tokens(text)
            .into_iter()
            .map(|(_, t)| {
                if let Some(id) = self.ids.get(t) {
                    return *id;
                }
                let id = self.tokens.len() as u64;
                self.tokens.push(t.to_owned());
                self.ids.insert(t.to_owned(), id);
                id
            })
            .collect()
    }

    /// The text of `ids`; `None` if one was never given out.
    pub fn decode(&self, ids: &[u64]) -> Option<String> {
        ids.iter()
            .map(|id| {
                self.tokens
                    .get(usize::try_from(*id).ok()?)
                    .map(String::as_str)
            })
            .collect()
    }
}

/// Per-token noise, nats (either way).
pub const JITTER: f64 = 0.05;

/// One token's surprisal before shift and jitter, nats.
pub fn base_nll(word: &str) -> f64 {
    let h = stable_hash(word.to_lowercase().as_bytes());
    0.5 + 4.0 * (h >> 11) as f64 / (1u64 << 53) as f64
}

/// The tokens of `text`: (character offset, token text), each word with the whitespace before it.
pub fn tokens(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut start: Option<usize> = None; // byte index where the current token began
    let mut in_word = false;
    for (i, c) in text.char_indices() {
        if c.is_whitespace() {
            if in_word {
                if let Some(s) = start.take() {
                    out.push((s, &text[s..i]));
                }
                in_word = false;
            }
            start.get_or_insert(i);
        } else {
            start.get_or_insert(i);
            in_word = true;
        }
    }
    if let (Some(s), true) = (start, in_word) {
        out.push((s, &text[s..]));
    }
    // Byte offsets to character offsets (OpenAI's `text_offset` counts characters).
    let mut chars = 0;
    let mut last = 0;
    out.into_iter()
        .map(|(b, t)| {
            chars += text[last..b].chars().count();
            last = b;
            (chars, t)
        })
        .collect()
}

/// Surprisal of a quiz choice's letter the model favours, and of one it does not, nats: the
/// favoured letter is about 90% likely.
pub const FAVOURED_NLL: (f64, f64) = (0.1, 3.0);

/// The `logprobs` object of an echoed completion: the prompt's tokens with their log-probabilities
/// (the first `null`), then the generated text's, at offsets into `prompt + generated`. A prompt
/// ending in a quiz choice's letter (`favours`: the letter the model believes) scores that
/// letter by `FAVOURED_NLL`, as a model that knows the answer would.
pub fn echo(prompt: &str, generated: &str, shift: f64, seed: u64, favours: Option<char>) -> Value {
    let mut rng = Rng::new(seed ^ 0x1096_u64.rotate_left(40));
    let mut toks = Vec::new();
    let mut lps = Vec::new();
    let mut offsets = Vec::new();
    let prompt_chars = prompt.chars().count();
    let last = tokens(prompt).len().saturating_sub(1);
    for (part, at) in [(prompt, 0), (generated, prompt_chars)] {
        for (offset, t) in tokens(part) {
            let letter = favours.filter(|_| at == 0 && toks.len() == last).map(|f| {
                if t.trim().starts_with(f) {
                    FAVOURED_NLL.0
                } else {
                    FAVOURED_NLL.1
                }
            });
            let lp = if toks.is_empty() {
                Value::Null
            } else {
                let word = letter.unwrap_or_else(|| base_nll(t.trim()));
                let nll = word + shift + (rng.unit() * 2.0 - 1.0) * JITTER;
                json!(-nll.max(0.0))
            };
            toks.push(Value::from(t));
            lps.push(lp);
            offsets.push(Value::from(at + offset));
        }
    }
    json!({"tokens": toks, "token_logprobs": lps, "text_offset": offsets, "top_logprobs": null})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vocabulary_round_trips() {
        let mut v = Vocab::default();
        let ids = v.encode("the cat and the  dog");
        assert_eq!(ids, [0, 1, 2, 3, 4], "\"the\" first is not \" the\"");
        assert_eq!(v.encode(" the"), [3]);
        assert_eq!(v.decode(&ids).as_deref(), Some("the cat and the  dog"));
        assert_eq!(v.decode(&[99]), None);
    }

    #[test]
    fn tokens_carry_their_leading_space_and_character_offsets() {
        let t = tokens("Über den  Fluss\nhin");
        let texts: Vec<&str> = t.iter().map(|x| x.1).collect();
        assert_eq!(texts, ["Über", " den", "  Fluss", "\nhin"]);
        let at: Vec<usize> = t.iter().map(|x| x.0).collect();
        assert_eq!(at, [0, 4, 8, 15]);
        assert!(tokens("  ").is_empty());
    }

    #[test]
    fn the_shift_raises_every_surprisal_and_the_first_token_has_none() {
        let base = echo("the cat sat on the mat", " today", 0.0, 1, None);
        let worse = echo("the cat sat on the mat", " today", 0.5, 1, None);
        let lp = |v: &Value| -> Vec<Option<f64>> {
            v["token_logprobs"]
                .as_array()
                .unwrap_or(&Vec::new())
                .iter()
                .map(Value::as_f64)
                .collect()
        };
        let (a, b) = (lp(&base), lp(&worse));
        assert_eq!(a.len(), 7);
        assert_eq!((a[0], b[0]), (None, None));
        for (x, y) in a.iter().zip(&b).skip(1) {
            let (x, y) = (x.unwrap_or(0.0), y.unwrap_or(0.0));
            assert!((x - y - 0.5).abs() < 1e-9, "{x} {y}");
        }
        assert_eq!(base["text_offset"][6], 22);
    }
}
