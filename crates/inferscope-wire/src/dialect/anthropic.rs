//! Anthropic Messages (`/v1/messages`): streamed typed events and whole message bodies.
//!
//! A stream is `message_start` (id, model, input usage), then per content block
//! `content_block_start` / `content_block_delta`… / `content_block_stop`, `ping`s anywhere,
//! `message_delta` (stop reason, cumulative output usage) and `message_stop`. A text,
//! thinking or tool-input delta is output. An `error` event is an error. Input tokens are the
//! uncached, cache-read and cache-creation counts together (the GenAI conventions' rule);
//! cache reads are the cached part.

use super::json::{push_capped, read, tag, NonEmpty, Num, Present, Str, Tag};
use super::{FinishReason, Observation, Usage};
use serde::Deserialize;
use std::borrow::Cow;

#[derive(Deserialize)]
struct EventView<'a> {
    #[serde(default, borrow, rename = "type")]
    kind: Tag<'a>,
    /// `message_start`'s message.
    #[serde(default, borrow)]
    message: Option<MessageView<'a>>,
    /// `content_block_delta`'s or `message_delta`'s delta.
    #[serde(default, borrow)]
    delta: Option<DeltaView<'a>>,
    /// `message_delta`'s usage, or a whole message's.
    #[serde(default)]
    usage: Option<UsageView>,
    #[serde(default)]
    error: Present,
    // A whole (non-streaming) message's fields.
    #[serde(default, borrow)]
    id: Option<Str<'a>>,
    #[serde(default, borrow)]
    model: Option<Str<'a>>,
    #[serde(default)]
    content: NonEmpty,
    #[serde(default, borrow)]
    stop_reason: Tag<'a>,
}

#[derive(Deserialize)]
struct MessageView<'a> {
    #[serde(default, borrow)]
    id: Option<Str<'a>>,
    #[serde(default, borrow)]
    model: Option<Str<'a>>,
    #[serde(default)]
    usage: Option<UsageView>,
}

#[derive(Deserialize)]
struct DeltaView<'a> {
    #[serde(default)]
    text: NonEmpty,
    #[serde(default)]
    partial_json: NonEmpty,
    #[serde(default)]
    thinking: NonEmpty,
    #[serde(default, borrow)]
    stop_reason: Tag<'a>,
}

#[derive(Deserialize)]
struct UsageView {
    #[serde(default)]
    input_tokens: Num,
    #[serde(default)]
    output_tokens: Num,
    #[serde(default)]
    cache_read_input_tokens: Num,
    #[serde(default)]
    cache_creation_input_tokens: Num,
}

impl UsageView {
    fn usage(&self, with_output: bool) -> Usage {
        let (i, r, c) = (
            self.input_tokens.0,
            self.cache_read_input_tokens.0,
            self.cache_creation_input_tokens.0,
        );
        let input = i.map(|i| i + r.unwrap_or(0) + c.unwrap_or(0));
        Usage {
            input,
            output: self.output_tokens.0.filter(|_| with_output),
            cached_input: r,
            reasoning: None,
        }
    }
}

fn reason(t: &Tag<'_>) -> Option<FinishReason> {
    let s = tag(t);
    (!s.is_empty()).then(|| FinishReason::parse(s))
}

/// Classifies one event's data, or a whole message body.
pub(super) fn classify(data: &[u8]) -> Observation<'_> {
    let Some(v) = read::<EventView<'_>>(data) else {
        return Observation::malformed();
    };
    let mut o = Observation::default();
    match tag(&v.kind) {
        "message_start" => {
            if let Some(m) = v.message {
                o.id = m.id.map(|s| s.0);
                o.model = m.model.map(|s| s.0);
                // Its output count is a placeholder; the real one comes in `message_delta`.
                o.usage = m.usage.map(|u| u.usage(false));
            }
        }
        "content_block_delta" => {
            o.output = v
                .delta
                .is_some_and(|d| d.text.0 || d.partial_json.0 || d.thinking.0);
        }
        "message_delta" => {
            o.finish = v.delta.as_ref().and_then(|d| reason(&d.stop_reason));
            o.usage = v.usage.map(|u| u.usage(true));
        }
        "message_stop" => o.done = true,
        "error" => o.error = true,
        "message" => {
            o.id = v.id.map(|s| s.0);
            o.model = v.model.map(|s| s.0);
            o.output = v.content.0;
            o.usage = v.usage.map(|u| u.usage(true));
            o.finish = reason(&v.stop_reason);
            o.done = true;
        }
        // ping, content_block_start/stop, and event types added later.
        _ => o.error = v.error.0,
    }
    o
}

/// Appends the text a delta (or a whole message's text blocks) carries.
pub(super) fn append_content(data: &[u8], out: &mut String, cap: usize) {
    #[derive(Deserialize)]
    struct Body<'a> {
        #[serde(default, borrow)]
        delta: Option<Text<'a>>,
        #[serde(default, borrow)]
        content: Vec<Text<'a>>,
    }
    #[derive(Deserialize)]
    struct Text<'a> {
        #[serde(default, borrow)]
        text: Option<Cow<'a, str>>,
    }
    let Some(b) = read::<Body<'_>>(data) else {
        return;
    };
    for t in b.delta.into_iter().chain(b.content) {
        if let Some(t) = t.text {
            push_capped(out, &t, cap);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_documented_stream() {
        let start = classify(br#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude-x","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_read_input_tokens":100,"output_tokens":1}}}"#);
        assert_eq!(start.id.as_deref(), Some("msg_1"));
        assert_eq!(start.model.as_deref(), Some("claude-x"));
        let u = start.usage.unwrap_or_default();
        assert_eq!(
            (u.input, u.cached_input, u.output),
            (Some(125), Some(100), None)
        );
        assert!(!start.output && !start.done);
        assert!(!classify(br#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#).output);
        assert!(!classify(br#"{"type": "ping"}"#).output);
        assert!(classify(br#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}"#).output);
        assert!(classify(br#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"a"}}"#).output);
        assert!(classify(br#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hm"}}"#).output);
        assert!(!classify(br#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"abc"}}"#).output);
        let d = classify(br#"{"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence":null},"usage":{"output_tokens":15}}"#);
        assert_eq!(d.finish, Some(FinishReason::Length));
        assert_eq!(d.usage.and_then(|u| u.output), Some(15));
        assert!(classify(br#"{"type":"message_stop"}"#).done);
        assert!(
            classify(
                br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#
            )
            .error
        );
        assert!(classify(b"{\"type\":").malformed);
    }

    #[test]
    fn a_whole_message() {
        let body = br#"{"id":"msg_2","type":"message","role":"assistant","model":"claude-x","content":[{"type":"text","text":"Hi there"}],"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":4}}"#;
        let o = classify(body);
        assert!(o.output && o.done);
        assert_eq!(o.finish, Some(FinishReason::ToolCalls));
        assert_eq!(o.usage.and_then(|u| u.output), Some(4));
        let mut s = String::new();
        append_content(body, &mut s, 100);
        assert_eq!(s, "Hi there");
    }
}
