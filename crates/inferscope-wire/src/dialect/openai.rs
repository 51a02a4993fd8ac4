//! OpenAI chat-completions and legacy completions: streamed chunks and whole bodies.
//!
//! The views below deserialize only what measurement needs, borrowing from the input and
//! iterating arrays without collecting them, so classifying an event allocates nothing unless a
//! string holds JSON escapes (then serde_json unescapes it into a scratch buffer).

use super::json::{push_capped, Count, Millis, NonEmpty, Num, Reason, Str};
use super::{EngineTimes, FinishReason, Observation, Usage};
use serde::de::{self, Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde::Deserialize;
use std::borrow::Cow;
use std::fmt;

/// Classifies one SSE event's data, or a whole non-streaming JSON body.
pub fn classify(data: &[u8]) -> Observation<'_> {
    let trimmed = data.trim_ascii();
    if trimmed == b"[DONE]" {
        return Observation::terminal();
    }
    match serde_json::from_slice::<ChunkView>(trimmed) {
        Ok(v) => {
            let usage = v.usage.map(|u| Usage {
                input: u.prompt_tokens.0,
                output: u.completion_tokens.0,
                cached_input: u.prompt_tokens_details.and_then(|d| d.cached_tokens),
                reasoning: u.completion_tokens_details.and_then(|d| d.reasoning_tokens),
            });
            Observation {
                id: v.id.map(|s| s.0),
                model: v.model.map(|s| s.0),
                output: v.choices.output,
                tokens: v.choices.token_ids,
                usage_only: usage.is_some() && v.choices.count == 0,
                usage,
                finish: v.choices.finish,
                engine: v.timings.and_then(TimingsView::times),
                done: false,
                error: v.error.is_some() || v.object.0,
                malformed: false,
            }
        }
        Err(_) => Observation {
            malformed: true,
            ..Observation::default()
        },
    }
}

#[derive(Deserialize)]
struct ChunkView<'a> {
    #[serde(default, borrow)]
    id: Option<Str<'a>>,
    #[serde(default, borrow)]
    model: Option<Str<'a>>,
    #[serde(default)]
    choices: Choices,
    #[serde(default)]
    usage: Option<UsageView>,
    #[serde(default)]
    error: Option<IgnoredAny>,
    #[serde(default)]
    object: IsError,
    /// llama.cpp's OpenAI layer adds its engine timings to the last chunk.
    #[serde(default)]
    timings: Option<TimingsView>,
}

/// llama.cpp's `timings` object (also on its native `/completion` responses).
#[derive(Deserialize)]
pub(super) struct TimingsView {
    #[serde(default)]
    prompt_ms: Millis,
    #[serde(default)]
    predicted_ms: Millis,
}

impl TimingsView {
    pub(super) fn times(self) -> Option<EngineTimes> {
        EngineTimes::from_nanos(self.prompt_ms.0, self.predicted_ms.0)
    }
}

#[derive(Deserialize)]
struct UsageView {
    #[serde(default)]
    prompt_tokens: Num,
    #[serde(default)]
    completion_tokens: Num,
    #[serde(default)]
    prompt_tokens_details: Option<DetailsView>,
    #[serde(default)]
    completion_tokens_details: Option<DetailsView>,
}

#[derive(Deserialize)]
struct DetailsView {
    #[serde(default)]
    cached_tokens: Option<u64>,
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

/// Appends the text an event carries (content or text of its choices) to `out`, up to `cap`
/// bytes in total. Used only when content capture is opted in.
pub fn append_content(data: &[u8], out: &mut String, cap: usize) {
    #[derive(Deserialize)]
    struct Body<'a> {
        #[serde(default, borrow)]
        choices: Vec<Choice<'a>>,
    }
    #[derive(Deserialize)]
    struct Choice<'a> {
        #[serde(default, borrow)]
        delta: Option<Msg<'a>>,
        #[serde(default, borrow)]
        message: Option<Msg<'a>>,
        #[serde(default, borrow)]
        text: Option<Cow<'a, str>>,
    }
    #[derive(Deserialize)]
    struct Msg<'a> {
        #[serde(default, borrow)]
        content: Option<Cow<'a, str>>,
    }
    let Ok(b) = serde_json::from_slice::<Body<'_>>(data) else {
        return;
    };
    for c in b.choices {
        let text = c.delta.or(c.message).and_then(|m| m.content).or(c.text);
        if let Some(t) = text {
            push_capped(out, &t, cap);
        }
    }
}

/// Summary of a `choices` array, folded while it is read.
#[derive(Default)]
struct Choices {
    count: u32,
    output: bool,
    finish: Option<FinishReason>,
    /// Tokens the choices carry by id (vLLM `return_token_ids`), when any choice lists them.
    token_ids: Option<u32>,
}

#[derive(Deserialize)]
struct ChoiceView {
    #[serde(default)]
    delta: Option<MessageView>,
    #[serde(default)]
    message: Option<MessageView>,
    #[serde(default)]
    text: NonEmpty,
    #[serde(default)]
    finish_reason: Option<Reason>,
    #[serde(default)]
    token_ids: Option<Count>,
}

#[derive(Deserialize)]
struct MessageView {
    #[serde(default)]
    content: NonEmpty,
    #[serde(default)]
    reasoning_content: NonEmpty,
    #[serde(default)]
    reasoning: NonEmpty,
    #[serde(default)]
    tool_calls: AnyToolOutput,
}

#[derive(Deserialize)]
struct ToolCallView {
    #[serde(default)]
    function: Option<FunctionView>,
}

#[derive(Deserialize)]
struct FunctionView {
    #[serde(default)]
    arguments: NonEmpty,
    #[serde(default)]
    name: NonEmpty,
}

impl MessageView {
    fn has_output(&self) -> bool {
        self.content.0 || self.reasoning_content.0 || self.reasoning.0 || self.tool_calls.0
    }
}

impl<'de> Deserialize<'de> for Choices {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Choices;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array of choices")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Choices, E> {
                Ok(Choices::default())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Choices, A::Error> {
                let mut out = Choices::default();
                while let Some(c) = seq.next_element::<ChoiceView>()? {
                    out.count += 1;
                    let msg = c.delta.as_ref().or(c.message.as_ref());
                    out.output |= c.text.0 || msg.is_some_and(MessageView::has_output);
                    if let Some(Reason(r)) = c.finish_reason {
                        out.finish = Some(r);
                    }
                    if let Some(Count(n)) = c.token_ids {
                        out.token_ids = Some(out.token_ids.unwrap_or(0).saturating_add(n));
                    }
                }
                Ok(out)
            }
        }
        d.deserialize_any(V)
    }
}

/// True when any tool call carries a non-empty function name or arguments.
#[derive(Default)]
struct AnyToolOutput(bool);

impl<'de> Deserialize<'de> for AnyToolOutput {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = AnyToolOutput;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array of tool calls or null")
            }
            fn visit_unit<E: de::Error>(self) -> Result<AnyToolOutput, E> {
                Ok(AnyToolOutput(false))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<AnyToolOutput, A::Error> {
                let mut any = false;
                while let Some(t) = seq.next_element::<ToolCallView>()? {
                    any |= t.function.is_some_and(|f| f.arguments.0 || f.name.0);
                }
                Ok(AnyToolOutput(any))
            }
        }
        d.deserialize_any(V)
    }
}

/// `"object": "error"` (vLLM's in-stream error shape).
#[derive(Default)]
struct IsError(bool);

impl<'de> Deserialize<'de> for IsError {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = IsError;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object kind")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<IsError, E> {
                Ok(IsError(s == "error"))
            }
            fn visit_unit<E: de::Error>(self) -> Result<IsError, E> {
                Ok(IsError(false))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_only_and_usage_only_chunks_are_not_output() {
        let role = classify(br#"{"id":"x","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#);
        assert!(!role.output && !role.usage_only && !role.malformed);
        let usage = classify(
            br#"{"id":"x","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":12}}"#,
        );
        assert!(usage.usage_only && !usage.output);
        assert_eq!(
            usage.usage,
            Some(Usage {
                input: Some(7),
                output: Some(12),
                ..Usage::default()
            })
        );
    }

    #[test]
    fn content_reasoning_tools_and_text_are_output() {
        for data in [
            &br#"{"choices":[{"delta":{"content":"Hi \n"}}]}"#[..],
            br#"{"choices":[{"delta":{"reasoning_content":"hm"}}]}"#,
            br#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\""}}]}}]}"#,
            br#"{"choices":[{"text":"x","index":0,"finish_reason":null}]}"#,
        ] {
            assert!(classify(data).output, "{}", String::from_utf8_lossy(data));
        }
    }

    #[test]
    fn finish_done_error_and_malformed() {
        let f = classify(br#"{"choices":[{"delta":{},"finish_reason":"length"}]}"#);
        assert_eq!(f.finish, Some(FinishReason::Length));
        assert!(classify(b" [DONE]").done);
        assert!(classify(br#"{"error":{"message":"boom"}}"#).error);
        assert!(classify(br#"{"object":"error","message":"boom"}"#).error);
        assert!(classify(br#"{"choices":[{"delta":"#).malformed);
    }

    #[test]
    fn ids_details_and_content() {
        let o = classify(br#"{"id":"chatcmpl-1","model":"llama","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":8},"completion_tokens_details":{"reasoning_tokens":2}}}"#);
        assert_eq!(o.id.as_deref(), Some("chatcmpl-1"));
        assert_eq!(o.model.as_deref(), Some("llama"));
        let u = o.usage.unwrap_or_default();
        assert_eq!((u.cached_input, u.reasoning), (Some(8), Some(2)));
        let mut s = String::new();
        append_content(
            br#"{"choices":[{"delta":{"content":"h\u00e9llo"}}]}"#,
            &mut s,
            4,
        );
        assert_eq!(s, "h\u{e9}l", "capped at a character boundary");
    }

    #[test]
    fn whole_body_message_counts() {
        let body = br#"{"choices":[{"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}"#;
        let o = classify(body);
        assert!(o.output && !o.usage_only);
        assert_eq!(o.finish, Some(FinishReason::Stop));
    }
}
