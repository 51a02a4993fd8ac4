//! Scoring as EleutherAI's lm-evaluation-harness scores (its `local-completions` model, the
//! harness's defaults), so that an accuracy from `inferscope eval --scoring loglikelihood` is the
//! number a model card quotes:
//!
//! - **Multiple choice** (MMLU): each choice's continuation (`" A"`, `" B"`, …, the target
//!   delimiter `" "` before the letter) is scored by its log-likelihood after the prompt, asked
//!   one choice per request on `/v1/completions` with `echo: true, logprobs: 1, max_tokens: 1,
//!   temperature: 0`. `acc` is right when the most likely choice is the answer; `acc_norm`
//!   divides each log-likelihood by its choice's length in characters first (equal for
//!   letters).
//! - **GSM8K**: the prompt `Question: …\nAnswer:` after the answered shots, completed greedily
//!   (256 tokens at most, stopped at `Question:`, `</s>`, `<|im_end|>`), and the answer taken
//!   two ways: `strict-match` (the number after `#### `) and `flexible-extract` (the last number
//!   in the reply), each compared with the reference as text after dropping `,`, `$`, everything
//!   up to `#### ` and a final `.`, ignoring case.
//!
//! The prompt goes as token ids from the backend's own tokenizer (`/tokenize`, with
//! `add_special_tokens: false`): no start-of-text token is added, as the harness adds none by
//! default (`add_bos_token=False`). A context's trailing whitespace moves to the continuation,
//! the continuation's tokens are the whole text's after the context's, and a sequence longer
//! than the harness's 2,047 tokens (its `max_length` of 2,048 less the generated token) loses
//! tokens from the left, as the harness's do.

use serde_json::Value;

/// The longest sequence scored: the harness's `max_length` (2,048) less the one generated token.
pub const MAX_LENGTH: usize = 2047;

/// Tokens a GSM8K answer may take (the harness's `max_gen_toks`).
pub const MAX_GEN_TOKS: usize = 256;

/// Where a GSM8K completion stops (the harness's `until`).
pub const GSM8K_STOP: [&str; 3] = ["Question:", "</s>", "<|im_end|>"];

/// The seed each request carries (the harness's; greedy answers do not depend on it).
pub const SEED: u64 = 1234;

/// What a regex filter gives when it finds nothing (the harness's fallback).
pub const INVALID: &str = "[invalid]";

/// The context and continuation as the harness encodes them: the context's trailing whitespace
/// moved to the front of the continuation.
pub fn split_pair<'a>(context: &'a str, continuation: &str) -> (&'a str, String) {
    let kept = context.trim_end();
    let moved = &context[kept.len()..];
    (kept, format!("{moved}{continuation}"))
}

/// The sequence sent for one choice and where its continuation starts in it: the context's
/// tokens then the whole text's tokens past them, cut from the left to `MAX_LENGTH`.
pub fn sequence(context: &[u64], whole: &[u64]) -> (Vec<u64>, usize) {
    let continuation = whole.get(context.len()..).unwrap_or(&[]);
    let total = context.len() + continuation.len();
    let cut = total.saturating_sub(MAX_LENGTH);
    let seq: Vec<u64> = context
        .iter()
        .chain(continuation)
        .skip(cut)
        .copied()
        .collect();
    (seq, context.len().saturating_sub(cut))
}

/// The log-likelihood of tokens `from..to` of an echoed completion (`choices[0].logprobs`);
/// `None` when the answer holds no number for one of them.
pub fn continuation_logprob(answer: &Value, from: usize, to: usize) -> Option<f64> {
    let lps = answer
        .pointer("/choices/0/logprobs/token_logprobs")?
        .as_array()?;
    if from == 0 || from >= to || lps.len() < to {
        return None;
    }
    lps[from..to].iter().map(Value::as_f64).sum()
}

/// The index of the largest value, the first on ties (as `numpy.argmax`).
fn argmax(values: impl Iterator<Item = f64>) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for (i, v) in values.enumerate() {
        if best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    best.map(|b| b.0)
}

/// The choice `acc` picks: the most likely.
pub fn pick(lls: &[f64]) -> Option<usize> {
    argmax(lls.iter().copied())
}

/// The choice `acc_norm` picks: the most likely per character of the choice.
pub fn pick_normalized(lls: &[f64], choices: &[&str]) -> Option<usize> {
    argmax(
        lls.iter()
            .zip(choices)
            .map(|(ll, c)| ll / c.chars().count().max(1) as f64),
    )
}

fn is_class(c: char) -> bool {
    c.is_ascii_digit() || matches!(c, '$' | '.' | ',')
}

/// The strict answer: the first `#### (-?[0-9.,]+)` (as the harness's `strict-match` filter).
pub fn strict_match(reply: &str) -> String {
    let mut from = 0;
    while let Some(at) = reply[from..].find("#### ") {
        let rest = &reply[from + at + 5..];
        let sign = usize::from(rest.starts_with('-'));
        let run: usize = rest[sign..]
            .chars()
            .take_while(|c| c.is_ascii_digit() || matches!(c, '.' | ','))
            .map(char::len_utf8)
            .sum();
        if run > 0 {
            return rest[..sign + run].trim().to_owned();
        }
        from += at + 1;
    }
    INVALID.to_owned()
}

/// The flexible answer: the last match of `(-?[$0-9.,]{2,})|(-?[0-9]+)` (as the harness's
/// `flexible-extract` filter, which takes the last of Python's `re.findall`).
pub fn flexible_extract(reply: &str) -> String {
    let chars: Vec<(usize, char)> = reply.char_indices().collect();
    let end_of = |k: usize| chars.get(k).map_or(reply.len(), |c| c.0);
    let mut last: Option<(usize, usize)> = None;
    let mut i = 0;
    while i < chars.len() {
        let sign = usize::from(chars[i].1 == '-');
        let run = chars[i + sign..]
            .iter()
            .take_while(|c| is_class(c.1))
            .count();
        if run >= 2 {
            last = Some((i, i + sign + run));
            i += sign + run;
            continue;
        }
        let digits = chars[i + sign..]
            .iter()
            .take_while(|c| c.1.is_ascii_digit())
            .count();
        if digits >= 1 {
            last = Some((i, i + sign + digits));
            i += sign + digits;
            continue;
        }
        i += 1;
    }
    match last {
        Some((a, b)) => reply[chars[a].0..end_of(b)].trim().to_owned(),
        None => INVALID.to_owned(),
    }
}

/// A GSM8K answer or reference as the harness's `exact_match` compares them: without `,` and
/// `$`, without everything up to the last `#### `, without a final `.` (before at most one
/// line break, as Python's `$`), lower-cased.
pub fn normalize(text: &str) -> String {
    let mut t: String = text.chars().filter(|c| !matches!(c, ',' | '$')).collect();
    if let Some(at) = t.rfind("#### ") {
        t.replace_range(..at + 5, "");
    }
    let body_end = t.strip_suffix('\n').map_or(t.len(), str::len);
    if t[..body_end].ends_with('.') {
        t.remove(body_end - 1);
    }
    t.to_lowercase()
}

/// Whether an extracted answer equals the reference (a GSM8K solution ending `#### N`).
pub fn exact_match(extracted: &str, reference: &str) -> bool {
    normalize(extracted) == normalize(reference)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn trailing_space_moves_to_the_continuation() {
        assert_eq!(split_pair("Answer:", " A"), ("Answer:", " A".to_owned()));
        assert_eq!(split_pair("Answer: ", "A"), ("Answer:", " A".to_owned()));
    }

    #[test]
    fn the_sequence_is_the_context_then_the_whole_texts_tail_cut_from_the_left() {
        assert_eq!(sequence(&[1, 2, 3], &[1, 2, 3, 9]), (vec![1, 2, 3, 9], 3));
        // The whole text may tokenize the boundary otherwise: the context's tokens are kept.
        assert_eq!(sequence(&[1, 2, 3], &[1, 2, 7, 9]), (vec![1, 2, 3, 9], 3));
        let long: Vec<u64> = (0..2100).collect();
        let (seq, ctx) = sequence(&long[..2099], &long);
        assert_eq!((seq.len(), ctx, seq[0]), (MAX_LENGTH, MAX_LENGTH - 1, 53));
    }

    #[test]
    fn the_continuations_log_likelihood_skips_the_context_and_the_generated_token() {
        let a =
            json!({"choices": [{"logprobs": {"token_logprobs": [null, -1.0, -2.0, -0.5, -9.0]}}]});
        assert_eq!(continuation_logprob(&a, 3, 4), Some(-0.5));
        assert_eq!(continuation_logprob(&a, 2, 4), Some(-2.5));
        assert_eq!(
            continuation_logprob(&a, 0, 4),
            None,
            "the first token has none"
        );
        assert_eq!(continuation_logprob(&a, 3, 9), None);
        assert_eq!(continuation_logprob(&json!({"choices": []}), 1, 2), None);
    }

    #[test]
    fn acc_takes_the_first_maximum_and_acc_norm_divides_by_length() {
        assert_eq!(pick(&[-2.0, -1.0, -1.0]), Some(1));
        assert_eq!(pick(&[]), None);
        assert_eq!(
            pick_normalized(&[-4.0, -3.0], &[" long one", " b"]),
            Some(0)
        );
    }

    /// Expected values from Python's `re` with the harness's patterns.
    #[test]
    fn extraction_agrees_with_the_harness_patterns() {
        assert_eq!(strict_match("so #### 1,200.\n"), "1,200.");
        assert_eq!(strict_match("#### x then #### -3"), "-3");
        assert_eq!(strict_match("#### -x"), INVALID);
        assert_eq!(strict_match("72"), INVALID);
        assert_eq!(flexible_extract("costs $1,200. Then 5 more"), "5");
        assert_eq!(flexible_extract("-7 and 3.5"), "3.5");
        assert_eq!(flexible_extract("it is $5"), "$5");
        assert_eq!(flexible_extract("a-1"), "-1");
        assert_eq!(flexible_extract(".."), "..");
        assert_eq!(flexible_extract("none here"), INVALID);
        assert_eq!(flexible_extract("é 12 ü"), "12");
        assert_eq!(normalize("Natalia sold 48/2 = 24.\n#### 72"), "72");
        assert_eq!(normalize("$1,200."), "1200");
        assert!(exact_match("1,200.", "x\n#### 1200"));
        assert!(
            !exact_match("1200.0", "#### 1200"),
            "compared as text, as the harness does"
        );
        assert!(!exact_match(INVALID, "#### 1200"));
    }
}
