//! The simulator's wire formats: each dialect's events and whole bodies, as the real servers
//! write them (OpenAI chat and completions, the Responses API, Anthropic Messages, TGI,
//! Ollama, llama.cpp), built from one generation plan.

use super::ChunkKind;
use crate::dialect::Endpoint;
use serde_json::{json, Value};
use std::time::Duration;

/// What the wire needs to know of one generation.
#[derive(Debug)]
pub(super) struct Gen {
    pub(super) index: u64,
    pub(super) ep: Endpoint,
    pub(super) model: String,
    pub(super) created: u64,
    pub(super) prompt_tokens: u64,
    pub(super) output_tokens: u64,
    pub(super) hit_max: bool,
    /// OpenAI `stream_options.include_usage`.
    pub(super) include_usage: bool,
    /// TGI `parameters.details`.
    pub(super) details: bool,
    /// Precede the content with a role-only chunk (OpenAI chat).
    pub(super) role_chunk: bool,
    /// OpenAI completions with `echo` and `logprobs`: the prompt, echoed with log-probabilities.
    pub(super) echo: Option<Echo>,
}

/// An echoed prompt and what its log-probabilities depend on (`logprob::echo`).
#[derive(Debug)]
pub(super) struct Echo {
    pub(super) prompt: String,
    pub(super) nll_shift: f64,
    pub(super) seed: u64,
    /// A quiz prompt ending in a choice's letter: the letter the model favours.
    pub(super) favours: Option<char>,
}

/// The engine's own prefill and decode time, as Ollama and llama.cpp report them.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct EngineTime {
    pub(super) prefill: Duration,
    pub(super) decode: Duration,
}

fn sse(data: &Value) -> Vec<u8> {
    format!("data: {data}\n\n").into_bytes()
}

fn typed(event: &str, data: &Value) -> Vec<u8> {
    format!("event: {event}\ndata: {data}\n\n").into_bytes()
}

fn ndjson(data: &Value) -> Vec<u8> {
    format!("{data}\n").into_bytes()
}

impl Gen {
    fn chat(&self) -> bool {
        self.ep == Endpoint::ChatCompletions
    }

    /// Whether a streamed response is NDJSON (Ollama) rather than SSE.
    pub(super) fn ndjson(&self) -> bool {
        matches!(self.ep, Endpoint::OllamaChat | Endpoint::OllamaGenerate)
    }

    /// The streamed response's content type.
    pub(super) fn stream_type(&self) -> &'static str {
        if self.ndjson() {
            "application/x-ndjson"
        } else {
            "text/event-stream"
        }
    }

    pub(super) fn id(&self) -> String {
        match self.ep {
            Endpoint::ChatCompletions => format!("chatcmpl-sim-{}", self.index),
            Endpoint::Messages => format!("msg_sim_{}", self.index),
            Endpoint::Responses => format!("resp_sim_{}", self.index),
            _ => format!("cmpl-sim-{}", self.index),
        }
    }

    fn finish_reason(&self) -> &'static str {
        match (self.ep, self.hit_max) {
            (Endpoint::Messages, true) => "max_tokens",
            (Endpoint::Messages, false) => "end_turn",
            (Endpoint::GenerateStream | Endpoint::Generate, false) => "eos_token",
            (Endpoint::LlamaCompletion, true) => "limit",
            (Endpoint::LlamaCompletion, false) => "eos",
            (_, true) => "length",
            (_, false) => "stop",
        }
    }

    fn openai_usage(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.output_tokens,
            "total_tokens": self.prompt_tokens + self.output_tokens,
        })
    }

    /// An OpenAI chunk written as the servers order it (id first), by hand: the per-token
    /// path of most benchmarks.
    fn openai_text(&self, choice: &str) -> Vec<u8> {
        let object = if self.chat() {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        format!(
            "data: {{\"id\":\"{}\",\"object\":\"{object}\",\"created\":{},\"model\":{},\"choices\":[{{\"index\":0,{choice}}}]}}\n\n",
            self.id(),
            self.created,
            Value::from(self.model.as_str())
        )
        .into_bytes()
    }

    fn openai_chunk(&self, choice: Value) -> Value {
        let object = if self.chat() {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        json!({"id": self.id(), "object": object, "created": self.created, "model": self.model,
               "choices": [choice]})
    }

    fn responses_object(&self, status: &str, text: Option<&str>) -> Value {
        let output = match text {
            Some(t) => json!([{"id": format!("msg_sim_{}", self.index), "type": "message",
                "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": t, "annotations": []}]}]),
            None => json!([]),
        };
        let usage = text.map(|_| {
            json!({"input_tokens": self.prompt_tokens,
                   "input_tokens_details": {"cached_tokens": 0},
                   "output_tokens": self.output_tokens,
                   "output_tokens_details": {"reasoning_tokens": 0},
                   "total_tokens": self.prompt_tokens + self.output_tokens})
        });
        let incomplete = (status == "incomplete").then(|| json!({"reason": "max_output_tokens"}));
        json!({"id": self.id(), "object": "response", "created_at": self.created,
               "status": status, "model": self.model, "output": output,
               "incomplete_details": incomplete, "usage": usage})
    }

    fn responses_status(&self) -> &'static str {
        if self.hit_max {
            "incomplete"
        } else {
            "completed"
        }
    }

    fn anthropic_message(&self, text: Option<&str>) -> Value {
        let content = match text {
            Some(t) => json!([{"type": "text", "text": t}]),
            None => json!([]),
        };
        let (stop, out) = match text {
            Some(_) => (Value::from(self.finish_reason()), self.output_tokens),
            None => (Value::Null, 1),
        };
        json!({"id": self.id(), "type": "message", "role": "assistant", "model": self.model,
               "content": content, "stop_reason": stop, "stop_sequence": null,
               "usage": {"input_tokens": self.prompt_tokens, "cache_creation_input_tokens": 0,
                         "cache_read_input_tokens": 0, "output_tokens": out}})
    }

    fn ollama_tail(&self, text: &str, eng: EngineTime) -> Value {
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let mut v = json!({
            "model": self.model,
            "created_at": crate::util::time::rfc3339(std::time::SystemTime::now()),
            "done": true, "done_reason": self.finish_reason(),
            "total_duration": ns(eng.prefill + eng.decode), "load_duration": 0,
            "prompt_eval_count": self.prompt_tokens, "prompt_eval_duration": ns(eng.prefill),
            "eval_count": self.output_tokens, "eval_duration": ns(eng.decode),
        });
        if self.ep == Endpoint::OllamaChat {
            v["message"] = json!({"role": "assistant", "content": text});
        } else {
            v["response"] = Value::from(text);
        }
        v
    }

    fn llamacpp_tail(&self, text: &str, eng: EngineTime) -> Value {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let per = |d: Duration, n: u64| ms(d) / n.max(1) as f64;
        json!({
            "content": text, "id_slot": 0, "stop": true, "model": self.model,
            "tokens_predicted": self.output_tokens, "tokens_evaluated": self.prompt_tokens,
            "stop_type": self.finish_reason(), "stopping_word": "", "tokens_cached": 0,
            "timings": {
                "prompt_n": self.prompt_tokens, "prompt_ms": ms(eng.prefill),
                "prompt_per_token_ms": per(eng.prefill, self.prompt_tokens),
                "predicted_n": self.output_tokens, "predicted_ms": ms(eng.decode),
                "predicted_per_token_ms": per(eng.decode, self.output_tokens),
            },
        })
    }

    fn tgi_details(&self) -> Value {
        json!({"finish_reason": self.finish_reason(), "generated_tokens": self.output_tokens,
               "seed": null, "input_length": self.prompt_tokens})
    }

    /// Events before the first token: OpenAI's role chunk, Anthropic's `message_start` …
    /// `ping`, the Responses API's `response.created` … `content_part.added`. One write.
    pub(super) fn preamble(&self) -> Option<Vec<u8>> {
        match self.ep {
            Endpoint::ChatCompletions if self.role_chunk => Some(sse(&self.openai_chunk(json!({
                "index": 0, "delta": {"role": "assistant", "content": ""},
                "logprobs": null, "finish_reason": null})))),
            Endpoint::Messages => {
                let mut b = typed(
                    "message_start",
                    &json!({"type": "message_start", "message": self.anthropic_message(None)}),
                );
                b.extend(typed(
                    "content_block_start",
                    &json!({"type": "content_block_start",
                    "index": 0, "content_block": {"type": "text", "text": ""}}),
                ));
                b.extend(typed("ping", &json!({"type": "ping"})));
                Some(b)
            }
            Endpoint::Responses => {
                let r = self.responses_object("in_progress", None);
                let item = format!("msg_sim_{}", self.index);
                let mut b = typed(
                    "response.created",
                    &json!({"type": "response.created",
                    "sequence_number": 0, "response": r}),
                );
                b.extend(typed(
                    "response.in_progress",
                    &json!({"type": "response.in_progress",
                    "sequence_number": 1, "response": r}),
                ));
                b.extend(typed(
                    "response.output_item.added",
                    &json!({
                    "type": "response.output_item.added", "sequence_number": 2, "output_index": 0,
                    "item": {"id": item, "type": "message", "status": "in_progress",
                             "role": "assistant", "content": []}}),
                ));
                b.extend(typed(
                    "response.content_part.added",
                    &json!({
                    "type": "response.content_part.added", "sequence_number": 3,
                    "item_id": item, "output_index": 0, "content_index": 0,
                    "part": {"type": "output_text", "text": "", "annotations": []}}),
                ));
                Some(b)
            }
            _ => None,
        }
    }

    /// One write of output: `words` (each one token, with its leading space); `seq` numbers the
    /// Responses API's events; `last` and `text` (everything so far) end TGI's stream.
    pub(super) fn content(&self, words: &[&str], seq: u64, last: bool, text: &str) -> Vec<u8> {
        let piece: String = words.concat();
        match self.ep {
            Endpoint::ChatCompletions => self.openai_text(&format!(
                r#""delta":{{"content":{}}},"logprobs":null,"finish_reason":null"#,
                Value::from(piece)
            )),
            Endpoint::Messages => typed(
                "content_block_delta",
                &json!({
                "type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": piece}}),
            ),
            Endpoint::Responses => typed(
                "response.output_text.delta",
                &json!({
                "type": "response.output_text.delta", "sequence_number": seq,
                "item_id": format!("msg_sim_{}", self.index), "output_index": 0,
                "content_index": 0, "delta": piece, "logprobs": []}),
            ),
            Endpoint::GenerateStream | Endpoint::Generate => {
                let mut b = Vec::new();
                for (i, w) in words.iter().enumerate() {
                    let end = last && i + 1 == words.len();
                    let details = (end && self.details).then(|| self.tgi_details());
                    b.extend(sse(&json!({"index": seq + i as u64,
                        "token": {"id": 1000 + seq + i as u64, "text": w, "logprob": -0.25,
                                  "special": false},
                        "generated_text": end.then_some(text), "details": details})));
                }
                b
            }
            Endpoint::OllamaChat => ndjson(&json!({"model": self.model,
                "created_at": crate::util::time::rfc3339(std::time::SystemTime::now()),
                "message": {"role": "assistant", "content": piece}, "done": false})),
            Endpoint::OllamaGenerate => ndjson(&json!({"model": self.model,
                "created_at": crate::util::time::rfc3339(std::time::SystemTime::now()),
                "response": piece, "done": false})),
            Endpoint::LlamaCompletion => sse(&json!({"content": piece, "stop": false,
                "id_slot": 0, "multimodal": false, "index": 0})),
            Endpoint::Completions => self.openai_text(&format!(
                r#""text":{},"logprobs":null,"finish_reason":null"#,
                Value::from(piece)
            )),
        }
    }

    /// The writes after the last token, in order, each with what it is. `seq` continues the
    /// Responses API's numbering; `text` is the whole output.
    pub(super) fn tail(&self, seq: u64, text: &str, eng: EngineTime) -> Vec<(ChunkKind, Vec<u8>)> {
        match self.ep {
            Endpoint::ChatCompletions | Endpoint::Completions => {
                let choice = if self.chat() {
                    json!({"index": 0, "delta": {}, "logprobs": null,
                           "finish_reason": self.finish_reason()})
                } else {
                    json!({"index": 0, "text": "", "logprobs": null,
                           "finish_reason": self.finish_reason()})
                };
                let mut v = vec![(ChunkKind::Finish, sse(&self.openai_chunk(choice)))];
                if self.include_usage {
                    let mut u = self.openai_chunk(Value::Null);
                    u["choices"] = json!([]);
                    u["usage"] = self.openai_usage();
                    v.push((ChunkKind::Usage, sse(&u)));
                }
                v.push((ChunkKind::Done, b"data: [DONE]\n\n".to_vec()));
                v
            }
            Endpoint::Messages => {
                let mut fin = typed(
                    "content_block_stop",
                    &json!({"type": "content_block_stop", "index": 0}),
                );
                fin.extend(typed(
                    "message_delta",
                    &json!({"type": "message_delta",
                    "delta": {"stop_reason": self.finish_reason(), "stop_sequence": null},
                    "usage": {"output_tokens": self.output_tokens}}),
                ));
                vec![
                    (ChunkKind::Finish, fin),
                    (
                        ChunkKind::Done,
                        typed("message_stop", &json!({"type": "message_stop"})),
                    ),
                ]
            }
            Endpoint::Responses => {
                let item = format!("msg_sim_{}", self.index);
                let part = json!({"type": "output_text", "text": text, "annotations": []});
                let mut fin = typed(
                    "response.output_text.done",
                    &json!({
                    "type": "response.output_text.done", "sequence_number": seq,
                    "item_id": item, "output_index": 0, "content_index": 0, "text": text,
                    "logprobs": []}),
                );
                fin.extend(typed(
                    "response.content_part.done",
                    &json!({
                    "type": "response.content_part.done", "sequence_number": seq + 1,
                    "item_id": item, "output_index": 0, "content_index": 0, "part": part}),
                ));
                let r = self.responses_object(self.responses_status(), Some(text));
                fin.extend(typed(
                    "response.output_item.done",
                    &json!({
                    "type": "response.output_item.done", "sequence_number": seq + 2,
                    "output_index": 0, "item": r["output"][0]}),
                ));
                let kind = format!("response.{}", self.responses_status());
                let done = typed(
                    &kind,
                    &json!({"type": kind, "sequence_number": seq + 3,
                    "response": r}),
                );
                vec![(ChunkKind::Finish, fin), (ChunkKind::Done, done)]
            }
            // The last token event ended the stream.
            Endpoint::GenerateStream | Endpoint::Generate => Vec::new(),
            Endpoint::OllamaChat | Endpoint::OllamaGenerate => {
                vec![(ChunkKind::Done, ndjson(&self.ollama_tail("", eng)))]
            }
            Endpoint::LlamaCompletion => {
                vec![(ChunkKind::Done, sse(&self.llamacpp_tail("", eng)))]
            }
        }
    }

    /// A whole (non-streaming) body with `text` as the output.
    pub(super) fn whole(&self, text: &str, eng: EngineTime) -> Value {
        match self.ep {
            Endpoint::ChatCompletions | Endpoint::Completions => {
                let choice = if self.chat() {
                    json!({"index": 0, "message": {"role": "assistant", "content": text},
                           "logprobs": null, "finish_reason": self.finish_reason()})
                } else if let Some(e) = &self.echo {
                    let logprobs =
                        super::logprob::echo(&e.prompt, text, e.nll_shift, e.seed, e.favours);
                    json!({"index": 0, "text": format!("{}{text}", e.prompt),
                           "logprobs": logprobs, "finish_reason": self.finish_reason()})
                } else {
                    json!({"index": 0, "text": text, "logprobs": null,
                           "finish_reason": self.finish_reason()})
                };
                let object = if self.chat() {
                    "chat.completion"
                } else {
                    "text_completion"
                };
                json!({"id": self.id(), "object": object, "created": self.created,
                       "model": self.model, "choices": [choice], "usage": self.openai_usage()})
            }
            Endpoint::Messages => self.anthropic_message(Some(text)),
            Endpoint::Responses => self.responses_object(self.responses_status(), Some(text)),
            Endpoint::GenerateStream | Endpoint::Generate => {
                let mut v = json!({"generated_text": text});
                if self.details {
                    v["details"] = self.tgi_details();
                }
                v
            }
            Endpoint::OllamaChat | Endpoint::OllamaGenerate => self.ollama_tail(text, eng),
            Endpoint::LlamaCompletion => self.llamacpp_tail(text, eng),
        }
    }
}
