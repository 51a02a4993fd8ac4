//! Wire formats: which endpoint speaks which dialect, and what one event of it means for
//! measurement (output? usage? finish reason? error?).
//!
//! Only the OpenAI chat-completions and legacy completions formats are classified today; the
//! other known inference endpoints are recognised (their request bodies are read for `model`)
//! and measured by timing alone until their dialects land.

mod openai;

pub use openai::{append_content, classify};

/// A wire format whose events the meter classifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// OpenAI chat completions and legacy completions (what vLLM, SGLang, TGI's OpenAI layer and
    /// hosted OpenAI-compatible APIs speak).
    OpenAi,
}

impl Dialect {
    /// What one event (or one whole non-streaming body) of this dialect means for measurement.
    pub fn classify(self, data: &[u8]) -> Observation<'_> {
        match self {
            Dialect::OpenAi => openai::classify(data),
        }
    }

    /// Appends the output text an event (or body) carries to `out`, up to `cap` bytes in all.
    pub fn append_content(self, data: &[u8], out: &mut String, cap: usize) {
        match self {
            Dialect::OpenAi => openai::append_content(data, out, cap),
        }
    }
}

/// The known inference endpoints whose JSON request body the gateway reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`
    ChatCompletions,
    /// `/v1/completions`
    Completions,
    /// `/v1/responses` (recognised; events not yet classified)
    Responses,
    /// `/v1/messages` (recognised; events not yet classified)
    Messages,
    /// TGI `/generate_stream` (recognised; events not yet classified)
    GenerateStream,
    /// Ollama `/api/chat` (recognised; events not yet classified)
    OllamaChat,
    /// Ollama `/api/generate` (recognised; events not yet classified)
    OllamaGenerate,
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
            "/api/chat" => Self::OllamaChat,
            "/api/generate" => Self::OllamaGenerate,
            _ => return None,
        })
    }

    /// True for the OpenAI formats whose events `classify` understands and whose streaming
    /// requests accept `stream_options.include_usage`.
    pub fn is_openai(self) -> bool {
        matches!(self, Self::ChatCompletions | Self::Completions)
    }

    /// The dialect the meter classifies this endpoint's events by (`None`: timed only, every
    /// event counts as output).
    pub fn dialect(self) -> Option<Dialect> {
        self.is_openai().then_some(Dialect::OpenAi)
    }

    /// Name used for `gen_ai.operation.name`-style labels.
    pub fn operation(self) -> &'static str {
        match self {
            Self::ChatCompletions | Self::Responses | Self::Messages | Self::OllamaChat => "chat",
            Self::Completions | Self::GenerateStream | Self::OllamaGenerate => "text_completion",
        }
    }
}

/// Why generation stopped, as the backend reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// `stop`
    Stop,
    /// `length`
    Length,
    /// `tool_calls`
    ToolCalls,
    /// `content_filter`
    ContentFilter,
    /// Anything else, kept verbatim.
    Other(Box<str>),
}

impl FinishReason {
    /// Parses a reported reason (allocates only for unusual values).
    pub fn parse(s: &str) -> Self {
        match s {
            "stop" => Self::Stop,
            "length" => Self::Length,
            "tool_calls" => Self::ToolCalls,
            "content_filter" => Self::ContentFilter,
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
    /// Usage reported in this event.
    pub usage: Option<Usage>,
    /// A chunk with no choices and a usage object (the one `include_usage` adds).
    pub usage_only: bool,
    /// Finish reason reported in this event.
    pub finish: Option<FinishReason>,
    /// The terminal `[DONE]` sentinel.
    pub done: bool,
    /// An error object inside the stream.
    pub error: bool,
    /// The data was not the JSON this dialect expects.
    pub malformed: bool,
}
