//! What the bytes of an LLM inference stream mean: the lowest layer of inferscope.
//!
//! - [`sse`]: incremental, zero-copy scanners for Server-Sent Events and NDJSON streams, which
//!   observe bytes forwarded elsewhere and keep only an incomplete line's tail;
//! - [`dialect`]: what one event (or one whole non-streamed body) of each wire format means for
//!   measurement — output or not, how many tokens, usage, finish reason, error, the end — in six
//!   dialects (OpenAI chat and completions, the Responses API, Anthropic Messages, TGI, Ollama and
//!   llama.cpp native), read into borrowed views so classifying allocates nothing;
//! - [`text`]: byte tests shared with the JSON writers above this crate.
//!
//! No clocks, no I/O, no HTTP: the meter above this crate timestamps what these classify. The
//! crate depends on serde, serde_json, memchr and arc-swap (the learned chunk shapes) only.

// What is `pub` inside is the crate's API: anything else is `pub(crate)`.
#![warn(unreachable_pub)]
#![forbid(unsafe_code)]

pub mod dialect;
pub mod sse;
pub mod text;
