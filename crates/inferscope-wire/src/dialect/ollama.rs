//! Ollama's native API: `/api/chat` and `/api/generate`, NDJSON lines when streaming (the
//! default) and one JSON object otherwise. The line with `"done": true` carries the counts
//! (`prompt_eval_count`, `eval_count`) and the engine's own timings in nanoseconds
//! (`prompt_eval_duration`, `eval_duration`). An `error` line is an error.

use super::json::{push_capped, read, tag, NonEmpty, Num, Present, Str, Tag};
use super::{EngineTimes, FinishReason, Observation, Usage};
use serde::Deserialize;
use std::borrow::Cow;

#[derive(Deserialize)]
struct LineView<'a> {
    #[serde(default, borrow)]
    model: Option<Str<'a>>,
    /// `/api/chat`'s message.
    #[serde(default)]
    message: Option<MessageView>,
    /// `/api/generate`'s text.
    #[serde(default)]
    response: NonEmpty,
    #[serde(default)]
    thinking: NonEmpty,
    #[serde(default)]
    done: bool,
    #[serde(default, borrow)]
    done_reason: Tag<'a>,
    #[serde(default)]
    prompt_eval_count: Num,
    #[serde(default)]
    eval_count: Num,
    #[serde(default)]
    prompt_eval_duration: Num,
    #[serde(default)]
    eval_duration: Num,
    #[serde(default)]
    error: Present,
}

#[derive(Deserialize)]
struct MessageView {
    #[serde(default)]
    content: NonEmpty,
    #[serde(default)]
    thinking: NonEmpty,
    #[serde(default)]
    tool_calls: NonEmpty,
}

/// Classifies one NDJSON line, or a whole non-streaming body.
pub(super) fn classify(data: &[u8]) -> Observation<'_> {
    let Some(v) = read::<LineView<'_>>(data) else {
        return Observation::malformed();
    };
    let message = v
        .message
        .as_ref()
        .is_some_and(|m| m.content.0 || m.thinking.0 || m.tool_calls.0);
    let mut o = Observation {
        model: v.model.map(|s| s.0),
        output: message || v.response.0 || v.thinking.0,
        error: v.error.0,
        done: v.done,
        ..Observation::default()
    };
    if v.done {
        o.usage = Some(Usage {
            input: v.prompt_eval_count.0,
            output: v.eval_count.0,
            ..Usage::default()
        });
        o.engine = EngineTimes::from_nanos(v.prompt_eval_duration.0, v.eval_duration.0);
        let r = tag(&v.done_reason);
        let tools = v.message.as_ref().is_some_and(|m| m.tool_calls.0);
        o.finish = match r {
            "" => None,
            "stop" if tools => Some(FinishReason::ToolCalls),
            r => Some(FinishReason::parse(r)),
        };
    }
    o
}

/// Appends the text a line carries (`message.content` or `response`).
pub(super) fn append_content(data: &[u8], out: &mut String, cap: usize) {
    #[derive(Deserialize)]
    struct Body<'a> {
        #[serde(default, borrow)]
        message: Option<Msg<'a>>,
        #[serde(default, borrow)]
        response: Option<Cow<'a, str>>,
    }
    #[derive(Deserialize)]
    struct Msg<'a> {
        #[serde(default, borrow)]
        content: Option<Cow<'a, str>>,
    }
    let Some(b) = read::<Body<'_>>(data) else {
        return;
    };
    if let Some(t) = b.message.and_then(|m| m.content).or(b.response) {
        push_capped(out, &t, cap);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn documented_lines() {
        let l = classify(br#"{"model":"llama3.2","created_at":"2023-08-04T08:52:19.385406455-07:00","message":{"role":"assistant","content":"The"},"done":false}"#);
        assert!(l.output && !l.done && l.usage.is_none());
        assert_eq!(l.model.as_deref(), Some("llama3.2"));
        let g = classify(br#"{"model":"llama3.2","created_at":"x","response":"The","done":false}"#);
        assert!(g.output);
        let last = classify(br#"{"model":"llama3.2","created_at":"x","message":{"role":"assistant","content":""},"done":true,"done_reason":"length","total_duration":4883583458,"load_duration":1334875,"prompt_eval_count":26,"prompt_eval_duration":342546000,"eval_count":282,"eval_duration":4535599000}"#);
        assert!(last.done && !last.output);
        assert_eq!(last.finish, Some(FinishReason::Length));
        assert_eq!(
            last.usage,
            Some(Usage {
                input: Some(26),
                output: Some(282),
                ..Usage::default()
            })
        );
        assert_eq!(
            last.engine,
            Some(EngineTimes {
                prefill: Some(Duration::from_nanos(342_546_000)),
                decode: Some(Duration::from_nanos(4_535_599_000)),
            })
        );
        assert!(classify(br#"{"error":"model 'x' not found"}"#).error);
        let mut s = String::new();
        append_content(
            br#"{"message":{"role":"assistant","content":"a\u00e9"},"done":false}"#,
            &mut s,
            9,
        );
        append_content(br#"{"response":"b","done":false}"#, &mut s, 9);
        assert_eq!(s, "a\u{e9}b");
    }
}
