//! The OpenAI Responses API (`/v1/responses`): streamed typed events and whole response bodies.
//!
//! A stream is `response.created`, `response.in_progress`, item and part events, the deltas
//! (`response.output_text.delta`, `response.reasoning_text.delta`,
//! `response.reasoning_summary_text.delta`, `response.function_call_arguments.delta`,
//! `response.refusal.delta`…: any `*.delta` with a non-empty `delta` is output), and one
//! terminal event: `response.completed` or `response.incomplete` (with usage) or
//! `response.failed`. An `error` event is an error. There is no `[DONE]`.

use super::json::{push_capped, read, tag, NonEmpty, Num, Present, Str, Tag};
use super::{FinishReason, Observation, Usage};
use serde::Deserialize;
use std::borrow::Cow;

#[derive(Deserialize)]
struct EventView<'a> {
    #[serde(default, borrow, rename = "type")]
    kind: Tag<'a>,
    #[serde(default)]
    delta: NonEmpty,
    #[serde(default, borrow)]
    response: Option<ResponseView<'a>>,
    /// `"response"` on a whole (non-streaming) body, which is then read as a `ResponseView`.
    #[serde(default, borrow)]
    object: Tag<'a>,
}

/// A response object: inside `response.*` events, or a whole body.
#[derive(Deserialize)]
struct ResponseView<'a> {
    #[serde(default, borrow)]
    id: Option<Str<'a>>,
    #[serde(default, borrow)]
    model: Option<Str<'a>>,
    #[serde(default, borrow)]
    status: Tag<'a>,
    #[serde(default, borrow)]
    output: Vec<ItemView<'a>>,
    #[serde(default)]
    usage: Option<UsageView>,
    #[serde(default, borrow)]
    incomplete_details: Option<Incomplete<'a>>,
    #[serde(default)]
    error: Present,
}

#[derive(Deserialize)]
struct ItemView<'a> {
    #[serde(default, borrow, rename = "type")]
    kind: Tag<'a>,
    #[serde(default)]
    content: NonEmpty,
    #[serde(default)]
    arguments: NonEmpty,
}

#[derive(Deserialize)]
struct Incomplete<'a> {
    #[serde(default, borrow)]
    reason: Tag<'a>,
}

#[derive(Deserialize)]
struct UsageView {
    #[serde(default)]
    input_tokens: Num,
    #[serde(default)]
    output_tokens: Num,
    #[serde(default)]
    input_tokens_details: Option<Details>,
    #[serde(default)]
    output_tokens_details: Option<Details>,
}

#[derive(Deserialize)]
struct Details {
    #[serde(default)]
    cached_tokens: Num,
    #[serde(default)]
    reasoning_tokens: Num,
}

impl UsageView {
    fn usage(&self) -> Usage {
        Usage {
            input: self.input_tokens.0,
            output: self.output_tokens.0,
            cached_input: self
                .input_tokens_details
                .as_ref()
                .and_then(|d| d.cached_tokens.0),
            reasoning: self
                .output_tokens_details
                .as_ref()
                .and_then(|d| d.reasoning_tokens.0),
        }
    }
}

impl<'a> ResponseView<'a> {
    /// A finished response's facts: usage, output, finish reason, failure; the end.
    fn finish(self, o: &mut Observation<'a>) {
        o.usage = self.usage.as_ref().map(UsageView::usage);
        o.output = self.output.iter().any(|i| i.content.0 || i.arguments.0);
        let tool = self
            .output
            .iter()
            .any(|i| matches!(tag(&i.kind), "function_call" | "custom_tool_call"));
        o.finish = match tag(&self.status) {
            "completed" if tool => Some(FinishReason::ToolCalls),
            "completed" => Some(FinishReason::Stop),
            "incomplete" => Some(FinishReason::parse(
                self.incomplete_details
                    .as_ref()
                    .map_or("incomplete", |i| tag(&i.reason)),
            )),
            _ => None,
        };
        o.error = tag(&self.status) == "failed" || self.error.0;
        o.done = true;
        o.id = self.id.map(|s| s.0);
        o.model = self.model.map(|s| s.0);
    }
}

/// Classifies one event's data, or a whole response body.
pub(super) fn classify(data: &[u8]) -> Observation<'_> {
    let Some(v) = read::<EventView<'_>>(data) else {
        return Observation::malformed();
    };
    let mut o = Observation::default();
    let kind = tag(&v.kind);
    match kind {
        "response.created" | "response.in_progress" | "response.queued" => {
            if let Some(r) = v.response {
                o.id = r.id.map(|s| s.0);
                o.model = r.model.map(|s| s.0);
            }
        }
        "response.completed" | "response.incomplete" | "response.failed" => {
            if let Some(r) = v.response {
                r.finish(&mut o);
                // The deltas carried the output already.
                o.output = false;
            }
            o.done = true;
            o.error |= kind == "response.failed";
        }
        "error" => o.error = true,
        // A whole body: read once more, as the response it is (once per request).
        "" if tag(&v.object) == "response" => match read::<ResponseView<'_>>(data) {
            Some(r) => r.finish(&mut o),
            None => return Observation::malformed(),
        },
        k => o.output = k.ends_with(".delta") && v.delta.0,
    }
    o
}

/// Appends the text a text delta (or a whole response's output text) carries.
pub(super) fn append_content(data: &[u8], out: &mut String, cap: usize) {
    #[derive(Deserialize)]
    struct Body<'a> {
        #[serde(default, borrow, rename = "type")]
        kind: Option<Cow<'a, str>>,
        #[serde(default, borrow)]
        delta: Option<Cow<'a, str>>,
        #[serde(default, borrow)]
        output: Vec<Item<'a>>,
    }
    #[derive(Deserialize)]
    struct Item<'a> {
        #[serde(default, borrow)]
        content: Vec<Part<'a>>,
    }
    #[derive(Deserialize)]
    struct Part<'a> {
        #[serde(default, borrow)]
        text: Option<Cow<'a, str>>,
    }
    let Some(b) = read::<Body<'_>>(data) else {
        return;
    };
    if b.kind.as_deref() == Some("response.output_text.delta") {
        if let Some(d) = b.delta {
            push_capped(out, &d, cap);
        }
        return;
    }
    for part in b.output.into_iter().flat_map(|i| i.content) {
        if let Some(t) = part.text {
            push_capped(out, &t, cap);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_documented_stream() {
        let c = classify(br#"{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","status":"in_progress","model":"gpt-x","output":[],"usage":null}}"#);
        assert_eq!(c.id.as_deref(), Some("resp_1"));
        assert!(!c.output && !c.done);
        assert!(!classify(br#"{"type":"response.content_part.added","sequence_number":2,"item_id":"m","output_index":0,"content_index":0,"part":{"type":"output_text","text":""}}"#).output);
        assert!(classify(br#"{"type":"response.output_text.delta","sequence_number":3,"item_id":"m","output_index":0,"content_index":0,"delta":"Hi"}"#).output);
        assert!(
            classify(br#"{"type":"response.reasoning_summary_text.delta","delta":"hm"}"#).output
        );
        assert!(
            classify(br#"{"type":"response.function_call_arguments.delta","delta":"{\""}"#).output
        );
        assert!(!classify(br#"{"type":"response.output_text.delta","delta":""}"#).output);
        assert!(!classify(br#"{"type":"response.output_text.done","text":"Hi"}"#).output);
        let done = classify(br#"{"type":"response.completed","sequence_number":9,"response":{"id":"resp_1","object":"response","status":"completed","model":"gpt-x","output":[{"type":"message","content":[{"type":"output_text","text":"Hi"}]}],"usage":{"input_tokens":5,"input_tokens_details":{"cached_tokens":2},"output_tokens":7,"output_tokens_details":{"reasoning_tokens":3},"total_tokens":12}}}"#);
        assert!(done.done && !done.output && !done.error);
        assert_eq!(done.finish, Some(FinishReason::Stop));
        assert_eq!(
            done.usage,
            Some(Usage {
                input: Some(5),
                output: Some(7),
                cached_input: Some(2),
                reasoning: Some(3)
            })
        );
        let inc = classify(br#"{"type":"response.incomplete","response":{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"output":[],"usage":{"input_tokens":5,"output_tokens":16}}}"#);
        assert_eq!(inc.finish, Some(FinishReason::Length));
        assert!(inc.done);
        let failed = classify(br#"{"type":"response.failed","response":{"status":"failed","error":{"code":"server_error","message":"x"}}}"#);
        assert!(failed.error && failed.done);
        assert!(classify(br#"{"type":"error","code":"rate_limit_exceeded","message":"slow down","sequence_number":1}"#).error);
    }

    #[test]
    fn a_whole_response() {
        let body = br#"{"id":"resp_2","object":"response","status":"completed","model":"gpt-x","output":[{"type":"function_call","name":"f","arguments":"{}"}],"usage":{"input_tokens":3,"output_tokens":2}}"#;
        let o = classify(body);
        assert!(o.output && o.done);
        assert_eq!(o.finish, Some(FinishReason::ToolCalls));
        let mut s = String::new();
        append_content(br#"{"object":"response","output":[{"type":"message","content":[{"type":"output_text","text":"ok"}]}]}"#, &mut s, 10);
        assert_eq!(s, "ok");
    }
}
