//! llama.cpp server's native `/completion`: SSE events `{"content": …, "stop": false}` when
//! streaming, one JSON body otherwise. The event (or body) with `"stop": true` carries
//! `tokens_predicted`, `tokens_evaluated`, `stop_type` and the engine's `timings` (float
//! milliseconds). An event listing its `tokens` (with `return_tokens`) counts exactly.

use super::json::{push_capped, read, tag, Count, NonEmpty, Num, Present, Str, Tag};
use super::openai::TimingsView;
use super::{FinishReason, Observation, Usage};
use serde::Deserialize;
use std::borrow::Cow;

#[derive(Deserialize)]
struct EventView<'a> {
    #[serde(default)]
    content: NonEmpty,
    #[serde(default)]
    tokens: Count,
    #[serde(default)]
    stop: bool,
    #[serde(default, borrow)]
    model: Option<Str<'a>>,
    #[serde(default)]
    tokens_predicted: Num,
    #[serde(default)]
    tokens_evaluated: Num,
    #[serde(default, borrow)]
    stop_type: Tag<'a>,
    #[serde(default)]
    timings: Option<TimingsView>,
    #[serde(default)]
    error: Present,
}

/// Classifies one streamed event, or a whole body.
pub(super) fn classify(data: &[u8]) -> Observation<'_> {
    let Some(v) = read::<EventView<'_>>(data) else {
        return Observation::malformed();
    };
    let mut o = Observation {
        output: v.content.0,
        tokens: (v.tokens.0 > 0).then_some(v.tokens.0),
        error: v.error.0,
        done: v.stop,
        ..Observation::default()
    };
    if v.stop {
        o.model = v.model.map(|s| s.0);
        o.usage = Some(Usage {
            input: v.tokens_evaluated.0,
            output: v.tokens_predicted.0,
            ..Usage::default()
        });
        o.engine = v.timings.and_then(TimingsView::times);
        let r = tag(&v.stop_type);
        // `none`: stopped for no reason the server names (an aborted slot).
        o.finish = match r {
            "" | "none" => None,
            r => Some(FinishReason::parse(r)),
        };
    }
    o
}

/// Appends an event's (or a body's) `content`.
pub(super) fn append_content(data: &[u8], out: &mut String, cap: usize) {
    #[derive(Deserialize)]
    struct Body<'a> {
        #[serde(default, borrow)]
        content: Option<Cow<'a, str>>,
    }
    if let Some(t) = read::<Body<'_>>(data).and_then(|b| b.content) {
        push_capped(out, &t, cap);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn documented_events() {
        let e = classify(
            br#"{"content":" Hello","stop":false,"id_slot":0,"multimodal":false,"index":0}"#,
        );
        assert!(e.output && !e.done && e.tokens.is_none());
        let t = classify(br#"{"content":" Hi","tokens":[15043],"stop":false}"#);
        assert_eq!(t.tokens, Some(1));
        let last = classify(br#"{"content":"","id_slot":0,"stop":true,"model":"gguf","tokens_predicted":16,"tokens_evaluated":5,"stop_type":"limit","stopping_word":"","tokens_cached":20,"timings":{"prompt_n":5,"prompt_ms":12.5,"prompt_per_token_ms":2.5,"predicted_n":16,"predicted_ms":160.25,"predicted_per_token_ms":10.0}}"#);
        assert!(last.done && !last.output);
        assert_eq!(last.finish, Some(FinishReason::Length));
        assert_eq!(last.usage.and_then(|u| u.output), Some(16));
        let eng = last.engine.unwrap_or_default();
        assert_eq!(eng.prefill, Some(Duration::from_micros(12_500)));
        assert_eq!(eng.decode, Some(Duration::from_micros(160_250)));
        assert!(classify(br#"{"error":{"code":500,"message":"x","type":"server_error"}}"#).error);
    }
}
