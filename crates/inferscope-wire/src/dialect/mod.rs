//! Wire formats: which endpoint speaks which dialect, and what one event of it means for
//! measurement (output? how many tokens? usage? finish reason? error? the end?).
//!
//! Six dialects are classified event by event: OpenAI chat and completions, the OpenAI
//! Responses API, Anthropic Messages, TGI's native `generate`, Ollama's native API and
//! llama.cpp's native `/completion`. Each reads one event's JSON into a borrowed view
//! (`json`), so classifying allocates nothing unless a string holds escapes. A stream's
//! ordinary OpenAI chunks skip the parse: `StreamClassifier` matches them byte by byte against
//! the shape of one it read in full (`shape`).

mod anthropic;
mod json;
mod llamacpp;
mod ollama;
mod openai;
mod responses;
mod shape;
mod tgi;

pub use openai::{append_content, classify};
pub use shape::{Shapes, StreamClassifier};

use std::time::Duration;

/// A wire format whose events the meter classifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// OpenAI chat completions and legacy completions (what vLLM, SGLang, TGI's OpenAI layer,
    /// llama.cpp's and Ollama's `/v1` layers and hosted OpenAI-compatible APIs speak).
    OpenAi,
    /// The OpenAI Responses API (`/v1/responses`): typed events, usage in `response.completed`.
    Responses,
    /// Anthropic Messages (`/v1/messages`): typed events, cumulative usage in `message_delta`.
    Anthropic,
    /// TGI's native `generate` / `generate_stream`: one event per token.
    Tgi,
    /// Ollama's native `/api/chat` and `/api/generate`: NDJSON, counts and engine timings in the
    /// last line.
    Ollama,
    /// llama.cpp's native `/completion`: counts and engine `timings` in the last event.
    LlamaCpp,
}

impl Dialect {
    /// Every dialect.
    pub const ALL: [Dialect; 6] = [
        Dialect::OpenAi,
        Dialect::Responses,
        Dialect::Anthropic,
        Dialect::Tgi,
        Dialect::Ollama,
        Dialect::LlamaCpp,
    ];

    /// What one event (or one whole non-streaming body) of this dialect means for measurement.
    pub fn classify(self, data: &[u8]) -> Observation<'_> {
        match self {
            Dialect::OpenAi => openai::classify(data),
            Dialect::Responses => responses::classify(data),
            Dialect::Anthropic => anthropic::classify(data),
            Dialect::Tgi => tgi::classify(data),
            Dialect::Ollama => ollama::classify(data),
            Dialect::LlamaCpp => llamacpp::classify(data),
        }
    }

    /// Appends the output text an event (or body) carries to `out`, up to `cap` bytes in all.
    pub fn append_content(self, data: &[u8], out: &mut String, cap: usize) {
        match self {
            Dialect::OpenAi => openai::append_content(data, out, cap),
            Dialect::Responses => responses::append_content(data, out, cap),
            Dialect::Anthropic => anthropic::append_content(data, out, cap),
            Dialect::Tgi => tgi::append_content(data, out, cap),
            Dialect::Ollama => ollama::append_content(data, out, cap),
            Dialect::LlamaCpp => llamacpp::append_content(data, out, cap),
        }
    }

    /// The stable label (`openai`, `responses`, `anthropic`, `tgi`, `ollama`, `llamacpp`).
    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::OpenAi => "openai",
            Dialect::Responses => "responses",
            Dialect::Anthropic => "anthropic",
            Dialect::Tgi => "tgi",
            Dialect::Ollama => "ollama",
            Dialect::LlamaCpp => "llamacpp",
        }
    }
}

/// Prefill and decode time as the engine itself reported them for one request (Ollama
/// `prompt_eval_duration` / `eval_duration`, llama.cpp `timings.prompt_ms` / `predicted_ms`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineTimes {
    /// Time the engine spent on the prompt.
    pub prefill: Option<Duration>,
    /// Time the engine spent generating.
    pub decode: Option<Duration>,
}

impl EngineTimes {
    /// From nanoseconds; `None` when neither is known.
    pub fn from_nanos(prefill: Option<u64>, decode: Option<u64>) -> Option<Self> {
        (prefill.is_some() || decode.is_some()).then(|| Self {
            prefill: prefill.map(Duration::from_nanos),
            decode: decode.map(Duration::from_nanos),
        })
    }
}

/// The names each dialect gives the output-token limit of a request.
pub const MAX_TOKENS_PARAMS: [&str; 6] = [
    "max_completion_tokens", // OpenAI chat
    "max_tokens",            // OpenAI, Anthropic
    "max_output_tokens",     // Responses API
    "max_new_tokens",        // TGI `parameters`
    "num_predict",           // Ollama `options`
    "n_predict",             // llama.cpp
];

/// A sampling parameter of a request body, wherever its dialect keeps it: at the top level
/// (OpenAI, Anthropic, llama.cpp), under `parameters` (TGI) or `options` (Ollama); the first of
/// `names` found.
pub fn request_param<'a>(
    body: &'a serde_json::Map<String, serde_json::Value>,
    names: &[&str],
) -> Option<&'a serde_json::Value> {
    let nested = body
        .get("parameters")
        .or_else(|| body.get("options"))
        .and_then(serde_json::Value::as_object);
    names
        .iter()
        .find_map(|n| body.get(*n).or_else(|| nested.and_then(|o| o.get(*n))))
}

/// The known inference endpoints whose JSON request body the gateway reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`
    ChatCompletions,
    /// `/v1/completions`
    Completions,
    /// `/v1/responses` (OpenAI Responses API)
    Responses,
    /// `/v1/messages` (Anthropic Messages)
    Messages,
    /// TGI `/generate_stream` (always streams)
    GenerateStream,
    /// TGI `/generate` (never streams)
    Generate,
    /// Ollama `/api/chat` (streams unless `"stream": false`)
    OllamaChat,
    /// Ollama `/api/generate` (streams unless `"stream": false`)
    OllamaGenerate,
    /// llama.cpp `/completion` (also `/completions` without `/v1`)
    LlamaCompletion,
}

impl Endpoint {
    /// The endpoint served at `path`, if it is a known inference endpoint.
    pub fn from_path(path: &str) -> Option<Self> {
        Some(match path.trim_end_matches('/') {
            "/v1/chat/completions" => Self::ChatCompletions,
            "/v1/completions" => Self::Completions,
            "/v1/responses" => Self::Responses,
            "/v1/messages" => Self::Messages,
            "/generate_stream" => Self::GenerateStream,
            "/generate" => Self::Generate,
            "/api/chat" => Self::OllamaChat,
            "/api/generate" => Self::OllamaGenerate,
            "/completion" | "/completions" => Self::LlamaCompletion,
            _ => return None,
        })
    }

    /// Whether a request to this endpoint streams when its body says nothing (`stream` absent):
    /// TGI's `generate_stream` always does, Ollama's API by default.
    pub fn streams_by_default(self) -> bool {
        matches!(
            self,
            Self::GenerateStream | Self::OllamaChat | Self::OllamaGenerate
        )
    }

    /// Whether `stream` in the body decides streaming (TGI's two endpoints ignore it).
    pub fn stream_in_body(self) -> bool {
        !matches!(self, Self::GenerateStream | Self::Generate)
    }

    /// True for the OpenAI formats whose events `classify` understands and whose streaming
    /// requests accept `stream_options.include_usage`.
    pub fn is_openai(self) -> bool {
        matches!(self, Self::ChatCompletions | Self::Completions)
    }

    /// The dialect the meter classifies this endpoint's events by.
    pub fn dialect(self) -> Option<Dialect> {
        Some(match self {
            Self::ChatCompletions | Self::Completions => Dialect::OpenAi,
            Self::Responses => Dialect::Responses,
            Self::Messages => Dialect::Anthropic,
            Self::GenerateStream | Self::Generate => Dialect::Tgi,
            Self::OllamaChat | Self::OllamaGenerate => Dialect::Ollama,
            Self::LlamaCompletion => Dialect::LlamaCpp,
        })
    }

    /// Name used for `gen_ai.operation.name`-style labels.
    pub fn operation(self) -> &'static str {
        match self {
            Self::ChatCompletions | Self::Responses | Self::Messages | Self::OllamaChat => "chat",
            Self::Completions
            | Self::GenerateStream
            | Self::Generate
            | Self::OllamaGenerate
            | Self::LlamaCompletion => "text_completion",
        }
    }
}

/// Why generation stopped, as the backend reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// `stop`: a natural end or a stop sequence.
    Stop,
    /// `length`: the token limit.
    Length,
    /// `tool_calls`: the model called a tool.
    ToolCalls,
    /// `content_filter`: the provider's filter cut the output.
    ContentFilter,
    /// Anything else, kept verbatim.
    Other(Box<str>),
}

impl FinishReason {
    /// Parses a reported reason (allocates only for unusual values). Each dialect's own
    /// spellings of the four common reasons map onto them (Anthropic `end_turn`,
    /// `stop_sequence`, `max_tokens`, `tool_use`, `refusal`; TGI `eos_token`; llama.cpp `eos`,
    /// `word`, `limit`); anything else is kept verbatim.
    pub fn parse(s: &str) -> Self {
        match s {
            "stop" | "end_turn" | "stop_sequence" | "eos_token" | "eos" | "word" => Self::Stop,
            "length" | "max_tokens" | "limit" | "max_output_tokens" => Self::Length,
            "tool_calls" | "tool_use" | "function_call" => Self::ToolCalls,
            "content_filter" | "refusal" => Self::ContentFilter,
            other => Self::Other(other.into()),
        }
    }

    /// The reason as the backend spelled it.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::ToolCalls => "tool_calls",
            Self::ContentFilter => "content_filter",
            Self::Other(s) => s,
        }
    }
}

/// Token counts reported by the backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub input: Option<u64>,
    /// Completion tokens.
    pub output: Option<u64>,
    /// Prompt tokens served from the prefix cache (`prompt_tokens_details.cached_tokens`).
    pub cached_input: Option<u64>,
    /// Reasoning tokens (`completion_tokens_details.reasoning_tokens`).
    pub reasoning: Option<u64>,
}

impl Observation<'_> {
    /// Data that was not the JSON its dialect expects.
    pub fn malformed() -> Self {
        Self {
            malformed: true,
            ..Self::default()
        }
    }

    /// A stream's terminal event, which says nothing else.
    pub fn terminal() -> Self {
        Self {
            done: true,
            ..Self::default()
        }
    }
}

/// What one event (or one whole non-streaming body) means for measurement. Strings borrow from
/// the event's data unless they contained escapes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observation<'a> {
    /// The response id (`chatcmpl-…`).
    pub id: Option<std::borrow::Cow<'a, str>>,
    /// The model that answered.
    pub model: Option<std::borrow::Cow<'a, str>>,
    /// The event carries output: non-empty content, reasoning, tool-call arguments or text.
    pub output: bool,
    /// Tokens this output event carries, when the backend says (token ids, one TGI token
    /// event): per-event ITL is then exact.
    pub tokens: Option<u32>,
    /// Usage reported in this event.
    pub usage: Option<Usage>,
    /// A chunk with no choices and a usage object (the one `include_usage` adds).
    pub usage_only: bool,
    /// Finish reason reported in this event.
    pub finish: Option<FinishReason>,
    /// Prefill and decode time the engine reported.
    pub engine: Option<EngineTimes>,
    /// The stream's terminal event (`[DONE]`, `message_stop`, `response.completed`, Ollama
    /// `done: true`, llama.cpp `stop: true`, TGI's event with `generated_text`).
    pub done: bool,
    /// An error object inside the stream.
    pub error: bool,
    /// The data was not the JSON this dialect expects.
    pub malformed: bool,
}
