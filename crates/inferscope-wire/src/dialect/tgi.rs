//! Hugging Face TGI's native API: `generate_stream` (one SSE event per generated token, the
//! last with `generated_text` and, when asked for, `details`) and `generate` (one JSON body).
//!
//! Every token event is one token, so per-event counts are exact without usage. A streamed
//! request reports its input length and finish reason only with `parameters.details: true`.

use super::json::{push_capped, read, tag, NonEmpty, Num, Present, Tag};
use super::{FinishReason, Observation, Usage};
use serde::Deserialize;
use std::borrow::Cow;

#[derive(Deserialize)]
struct EventView<'a> {
    #[serde(default)]
    token: Present,
    #[serde(default)]
    generated_text: Option<NonEmpty>,
    #[serde(default, borrow)]
    details: Option<DetailsView<'a>>,
    #[serde(default)]
    error: Present,
}

#[derive(Deserialize)]
struct DetailsView<'a> {
    #[serde(default, borrow)]
    finish_reason: Tag<'a>,
    #[serde(default)]
    generated_tokens: Num,
    #[serde(default)]
    input_length: Num,
}

/// Classifies one `generate_stream` event, or a whole `generate` body.
pub(super) fn classify(data: &[u8]) -> Observation<'_> {
    let Some(v) = read::<EventView<'_>>(data) else {
        return Observation::malformed();
    };
    let mut o = Observation {
        error: v.error.0,
        ..Observation::default()
    };
    if let Some(d) = &v.details {
        o.usage = Some(Usage {
            input: d.input_length.0,
            output: d.generated_tokens.0,
            ..Usage::default()
        });
        let r = tag(&d.finish_reason);
        o.finish = (!r.is_empty()).then(|| FinishReason::parse(r));
    }
    if v.token.0 {
        // One event, one generated token (a special one such as EOS included: it was decoded).
        o.output = true;
        o.tokens = Some(1);
        o.done = v.generated_text.is_some();
    } else if let Some(text) = v.generated_text {
        // A whole `generate` body.
        o.output = text.0;
        o.done = true;
    }
    o
}

/// Appends the text a token event (or a whole body) carries; special tokens are not text.
pub(super) fn append_content(data: &[u8], out: &mut String, cap: usize) {
    #[derive(Deserialize)]
    struct Body<'a> {
        #[serde(default, borrow)]
        token: Option<Token<'a>>,
        #[serde(default, borrow)]
        generated_text: Option<Cow<'a, str>>,
    }
    #[derive(Deserialize)]
    struct Token<'a> {
        #[serde(default, borrow)]
        text: Option<Cow<'a, str>>,
        #[serde(default)]
        special: bool,
    }
    let Some(b) = read::<Body<'_>>(data) else {
        return;
    };
    match (b.token, b.generated_text) {
        (Some(t), _) if !t.special => {
            if let Some(t) = t.text {
                push_capped(out, &t, cap);
            }
        }
        (None, Some(t)) => push_capped(out, &t, cap),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_documented_stream_and_body() {
        let t = classify(br#"{"index":1,"token":{"id":3923,"text":" What","logprob":-0.5,"special":false},"generated_text":null,"details":null}"#);
        assert!(t.output && !t.done);
        assert_eq!(t.tokens, Some(1));
        let last = classify(br#"{"index":4,"token":{"id":2,"text":"</s>","logprob":-0.1,"special":true},"generated_text":" What is it","details":{"finish_reason":"eos_token","generated_tokens":4,"seed":null,"input_length":7}}"#);
        assert!(last.output && last.done);
        assert_eq!(last.finish, Some(FinishReason::Stop));
        assert_eq!(last.usage.and_then(|u| u.output), Some(4));
        assert_eq!(last.usage.and_then(|u| u.input), Some(7));
        assert!(classify(br#"{"error":"Input validation error","error_type":"validation"}"#).error);
        let body = br#"{"generated_text":"Hi","details":{"finish_reason":"length","generated_tokens":2,"seed":null,"prefill":[],"tokens":[]}}"#;
        let o = classify(body);
        assert!(o.output && o.done);
        assert_eq!(o.finish, Some(FinishReason::Length));
        let mut s = String::new();
        append_content(
            br#"{"token":{"id":2,"text":"</s>","special":true},"generated_text":"x"}"#,
            &mut s,
            9,
        );
        append_content(body, &mut s, 9);
        assert_eq!(s, "Hi");
    }
}
