//! `inferscope bench`: a load generator that speaks the gateway's metric language. Requests come
//! from a dataset (ShareGPT JSON, JSONL prompts) or are synthetic; arrivals are open-loop (Poisson
//! or constant rate) or closed-loop (fixed concurrency). Each response is measured client-side by
//! the gateway's definitions (docs/ARCHITECTURE.md §4), with the same SSE scanner and dialect:
//! TTFT, TTFC, TPOT, ITL, E2E, tokens, goodput under SLOs.
//!
//! The direct vs inferscope vs nginx comparison that drives this load generator as a separate
//! process is `benches/e2e_compare.rs`.

pub mod dataset;
pub mod hardware;
pub mod pyrandom;
pub mod workload;

pub use workload::{synthetic_prompts, Prompt};

use crate::dialect;
use crate::sse::SseScanner;
use crate::util::quantile;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::fmt::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// How requests arrive.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arrivals {
    /// Open loop: this many requests per second, exponentially distributed gaps.
    Poisson(f64),
    /// Open loop: evenly spaced.
    Constant(f64),
    /// Closed loop: this many requests in flight, each sent when the previous one ends.
    Concurrency(usize),
}

/// How an open-loop run paces its requests besides the rate, and which of them it measures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pacing {
    /// Gamma-distributed gaps of this shape (vLLM's `--burstiness`): 1 is Poisson, below 1
    /// burstier, above 1 more even. Poisson arrivals only.
    pub burstiness: f64,
    /// At most this many requests in flight (vLLM's `--max-concurrency`): an arrival past it
    /// waits for a slot, and its clock starts when it is sent.
    pub max_concurrency: Option<usize>,
    /// The rate rises linearly from a tenth of its value to all of it over this long.
    pub ramp_up: Option<Duration>,
    /// Requests sent in this first stretch of the run are sent but left out of the figures.
    pub warmup_time: Duration,
    /// Requests sent in this last stretch of the sending are sent but left out of the figures.
    pub cooldown_time: Duration,
}

impl Default for Pacing {
    fn default() -> Self {
        Self {
            burstiness: 1.0,
            max_concurrency: None,
            ramp_up: None,
            warmup_time: Duration::ZERO,
            cooldown_time: Duration::ZERO,
        }
    }
}

/// A gamma-distributed variate of `shape` and scale 1 (Marsaglia and Tsang; shapes below 1 by
/// the boost `G(k + 1) · U^(1/k)`).
fn gamma(rng: &mut crate::util::Rng, shape: f64) -> f64 {
    if shape < 1.0 {
        let u = 1.0 - rng.unit();
        return gamma(rng, shape + 1.0) * u.powf(1.0 / shape);
    }
    let d = shape - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        // A standard normal by Box–Muller.
        let (u1, u2) = (1.0 - rng.unit(), rng.unit());
        let x = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        let v = (1.0 + c * x).powi(3);
        if v <= 0.0 {
            continue;
        }
        let u = 1.0 - rng.unit();
        if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
            return d * v;
        }
    }
}

/// The API a run speaks (`--endpoint`): the gateway forwards and measures all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Endpoint {
    /// OpenAI chat completions, `/v1/chat/completions`.
    #[default]
    Chat,
    /// OpenAI (legacy) completions, `/v1/completions`.
    Completions,
    /// The OpenAI Responses API, `/v1/responses`.
    Responses,
    /// Anthropic Messages, `/v1/messages`.
    Messages,
}

impl Endpoint {
    /// Parses `chat`, `completions`, `responses` or `messages`.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "chat" => Self::Chat,
            "completions" => Self::Completions,
            "responses" => Self::Responses,
            "messages" => Self::Messages,
            _ => return None,
        })
    }

    /// Its `--endpoint` name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::Completions => "completions",
            Self::Responses => "responses",
            Self::Messages => "messages",
        }
    }

    /// The path under the API root's `/v1`.
    fn path(self) -> &'static str {
        match self {
            Self::Chat => "/chat/completions",
            Self::Completions => "/completions",
            Self::Responses => "/responses",
            Self::Messages => "/messages",
        }
    }

    /// How its events (or its whole body) read.
    fn dialect(self) -> dialect::Dialect {
        match self {
            Self::Chat | Self::Completions => dialect::Dialect::OpenAi,
            Self::Responses => dialect::Dialect::Responses,
            Self::Messages => dialect::Dialect::Anthropic,
        }
    }

    /// One request's body.
    fn body(
        self,
        model: &str,
        prompt: &str,
        max_tokens: u32,
        stream: bool,
        ignore_eos: bool,
    ) -> serde_json::Value {
        let messages = json!([{"role": "user", "content": prompt}]);
        let mut body = match self {
            Self::Chat => json!({"model": model, "max_tokens": max_tokens, "messages": messages}),
            Self::Completions => {
                json!({"model": model, "max_tokens": max_tokens, "prompt": prompt})
            }
            Self::Responses => {
                json!({"model": model, "max_output_tokens": max_tokens, "input": prompt})
            }
            Self::Messages => {
                json!({"model": model, "max_tokens": max_tokens, "messages": messages})
            }
        };
        if let Some(m) = body.as_object_mut() {
            m.insert("stream".into(), stream.into());
            // Usage in the stream: OpenAI's APIs send it only when asked.
            if stream && matches!(self, Self::Chat | Self::Completions) {
                m.insert("stream_options".into(), json!({"include_usage": true}));
            }
            if ignore_eos && matches!(self, Self::Chat | Self::Completions) {
                m.insert("ignore_eos".into(), true.into());
                m.insert("min_tokens".into(), max_tokens.into());
            }
        }
        body
    }
}

/// Where `endpoint`'s requests go for base URL `base`: the URL as an OpenAI SDK takes it, with
/// or without `/v1` (`http://host:8000`, `http://host:8000/v1`, or an API root under a path such
/// as `https://proxy/openai/v1`).
pub fn endpoint_url(base: &str, endpoint: Endpoint) -> String {
    let base = base.trim_end_matches('/');
    if base.ends_with("/v1") {
        format!("{base}{}", endpoint.path())
    } else {
        format!("{base}/v1{}", endpoint.path())
    }
}

/// A benchmark run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Base URL of the gateway or backend.
    pub url: String,
    /// Model name.
    pub model: String,
    /// The API spoken.
    pub endpoint: Endpoint,
    /// The requests' prompts, each with its output length where the workload sets one (used
    /// round-robin).
    pub prompts: Vec<Prompt>,
    /// Arrival process.
    pub arrivals: Arrivals,
    /// Burstiness, a cap on requests in flight, ramp-up, and the stretches left out.
    pub pacing: Pacing,
    /// Stop after this many requests …
    pub requests: usize,
    /// … or after this long (whichever comes first): nothing is sent after it, and what is
    /// still in flight is cut then (`Failure::Unfinished` samples, counted apart).
    pub duration: Option<Duration>,
    /// Streamed responses.
    pub stream: bool,
    /// `max_tokens` of each request whose prompt sets none.
    pub max_tokens: u32,
    /// A request not answered in full within this long is a failure (`Failure::Timeout`).
    pub timeout: Option<Duration>,
    /// Ask for exactly `max_tokens`: vLLM's (and SGLang's) `ignore_eos`, with `min_tokens`, on
    /// the OpenAI endpoints, so output lengths are the workload's and not the model's choice.
    pub ignore_eos: bool,
    /// SLOs for goodput: (metric, limit) with metric `ttft`, `tpot`, `itl`, `e2e`.
    pub slo: Vec<(String, Duration)>,
    /// Extra request headers.
    pub headers: Vec<(String, String)>,
    /// Seed of the arrival process.
    pub seed: u64,
    /// Print progress to standard error.
    pub progress: bool,
    /// `None`: HTTP/1.1, one pooled connection per request in flight. `Some(k)`: HTTP/2 with prior
    /// knowledge (h2c) over `k` connections, requests spread evenly, so many thousands of streams
    /// need only `k` sockets.
    pub http2_connections: Option<usize>,
    /// Requests sent all at once before the measured run and left out of it: they open the
    /// connections the run will use (on both sides of a gateway), so the run measures a warm
    /// steady state rather than connection set-up.
    pub warmup: usize,
    /// Makes the connections (TCP, or TLS for an `https://` URL).
    pub connector: crate::tls::Connector,
}

/// One request as the client saw it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// When it was sent, seconds after the run started.
    #[serde(default)]
    pub sent_s: f64,
    /// HTTP status (0: no response).
    pub status: u16,
    /// Stream reached its terminal event (or a whole body was parsed).
    pub complete: bool,
    /// Time to first token, milliseconds (`None`: no token came).
    #[serde(rename = "ttft_ms")]
    pub ttft: Option<f64>,
    /// Time to first chunk, milliseconds (`None`: no chunk came).
    #[serde(rename = "ttfc_ms")]
    pub ttfc: Option<f64>,
    /// Time per output token after the first, milliseconds (`None`: fewer than two tokens).
    #[serde(rename = "tpot_ms")]
    pub tpot: Option<f64>,
    /// Milliseconds, one per gap between output events.
    #[serde(rename = "itl_ms")]
    pub itl: Vec<f64>,
    /// End to end, milliseconds: from sending the request to the response's last byte.
    #[serde(rename = "e2e_ms")]
    pub e2e: f64,
    /// Prompt tokens (from usage).
    pub input_tokens: u64,
    /// Output tokens (usage, else counted events).
    pub output_tokens: u64,
    /// The `max_tokens` it asked for.
    pub max_tokens: u64,
    /// The gateway said back the purpose the request declared (`x-inferscope-purpose`): it
    /// counted the request apart from live traffic.
    #[serde(skip)]
    pub purpose_taken: bool,
    /// Why it did not succeed (`None`: it did).
    pub failure: Option<Failure>,
    /// The answer came through an inferscope gateway (it carried `x-inferscope-request-id`).
    #[serde(skip)]
    pub via_gateway: bool,
    /// Sent in the warm-up or cool-down stretch: in none of the figures.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub excluded: bool,
    /// The same request timed by `vllm bench serve`'s definitions (streamed requests): what
    /// `--format vllm` writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vllm: Option<VllmTimes>,
}

/// One streamed request as `vllm bench serve` times it: every event whose `choices` is not
/// empty counts — the role chunk and a finish chunk with no text too — and the trailing usage
/// chunk and `[DONE]` do not. Milliseconds from the send.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VllmTimes {
    /// The first event with choices (vLLM's TTFT: our TTFC where the role chunk comes first).
    pub ttft_ms: f64,
    /// Between consecutive events with choices (vLLM's ITL).
    pub itl_ms: Vec<f64>,
    /// The last event with choices (vLLM's E2E latency: the usage chunk and `[DONE]` after it
    /// are not waited for).
    pub latency_ms: f64,
}

/// Whether an event's JSON has a non-empty `choices` array, as `vllm bench serve` tells a chunk
/// that counts (`if choices := data.get("choices")`).
fn has_choices(data: &[u8]) -> bool {
    let Some(at) = memchr::memmem::find(data, b"\"choices\"") else {
        return false;
    };
    let mut rest = data[at + 9..]
        .iter()
        .skip_while(|b| b.is_ascii_whitespace());
    if rest.next() != Some(&b':') {
        return false;
    }
    let mut rest = rest.skip_while(|b| b.is_ascii_whitespace());
    if rest.next() != Some(&b'[') {
        return false;
    }
    rest.find(|b| !b.is_ascii_whitespace())
        .is_some_and(|b| *b != b']')
}

/// Why a request did not succeed, with what the client saw.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Failure {
    /// No response: the connection or the request failed.
    Connect {
        /// The error and its causes.
        error: String,
    },
    /// A status other than 2xx.
    Status {
        /// The status.
        status: u16,
        /// The start of the body (at most `FAILURE_BODY` bytes, lossy UTF-8).
        body: String,
    },
    /// The response body failed part way.
    Cut {
        /// The error and its causes.
        error: String,
    },
    /// Not answered in full within `--timeout`.
    Timeout {
        /// The limit, milliseconds.
        after_ms: u64,
    },
    /// The stream ended without its last event (`[DONE]`, `message_stop`, `response.completed`).
    Incomplete,
    /// A whole (non-streamed) body that is not the API's answer.
    Malformed {
        /// The start of the body.
        body: String,
    },
    /// In flight when `--duration` ended: cut, and left out of the figures (neither a success
    /// nor a failure).
    Unfinished,
}

/// Bytes of a failed response's body kept as its example.
pub const FAILURE_BODY: usize = 200;

impl Failure {
    /// What failures are grouped by: the kind, and the status for `Status`.
    pub fn reason(&self) -> String {
        match self {
            Failure::Connect { .. } => "connect".into(),
            Failure::Status { status, .. } => format!("status {status}"),
            Failure::Cut { .. } => "stream cut".into(),
            Failure::Timeout { .. } => "timeout".into(),
            Failure::Incomplete => "incomplete".into(),
            Failure::Malformed { .. } => "malformed body".into(),
            Failure::Unfinished => "unfinished".into(),
        }
    }

    /// The details of this one.
    pub fn detail(&self) -> String {
        match self {
            Failure::Connect { error } | Failure::Cut { error } => error.clone(),
            Failure::Status { body, .. } | Failure::Malformed { body } => body.clone(),
            Failure::Timeout { after_ms } => format!("not answered in full within {after_ms} ms"),
            Failure::Incomplete => "the stream ended without its last event".into(),
            Failure::Unfinished => "in flight when --duration ended".into(),
        }
    }
}

/// An error and its causes, `: `-joined.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    crate::util::errors::chain(e)
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}

/// The first `FAILURE_BODY` bytes, lossy, as a label: controls replaced, a cut marked.
fn body_head(b: &[u8]) -> String {
    crate::util::label::bounded(&String::from_utf8_lossy(b), FAILURE_BODY).into_owned()
}

impl Sample {
    fn ok(&self) -> bool {
        (200..300).contains(&self.status) && self.complete
    }

    fn meets(&self, slo: &[(String, Duration)]) -> bool {
        self.ok()
            && slo.iter().all(|(m, limit)| {
                let l = limit.as_secs_f64() * 1000.0;
                match m.as_str() {
                    "ttft" => self.ttft.is_some_and(|v| v <= l),
                    "tpot" => self.tpot.is_none_or(|v| v <= l),
                    "itl" => self.itl.iter().all(|v| *v <= l),
                    "e2e" => self.e2e <= l,
                    _ => true,
                }
            })
    }
}

/// An SLO list that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SloError {
    /// A part without `=`.
    #[error("`{0}`: expected METRIC=DURATION")]
    Syntax(String),
    /// A metric other than ttft, tpot, itl, e2e.
    #[error("`{0}`: SLO metrics are ttft, tpot, itl, e2e")]
    UnknownMetric(String),
    /// A bad duration.
    #[error(transparent)]
    Duration(#[from] crate::config::BadDuration),
}

/// Parses `ttft=200ms,tpot=30ms`.
pub fn parse_slo(s: &str) -> Result<Vec<(String, Duration)>, SloError> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let (k, v) = p
                .split_once('=')
                .ok_or_else(|| SloError::Syntax(p.into()))?;
            let k = k.trim().to_lowercase();
            if !["ttft", "tpot", "itl", "e2e"].contains(&k.as_str()) {
                return Err(SloError::UnknownMetric(k));
            }
            Ok((k, crate::config::parse_duration(v)?))
        })
        .collect()
}

async fn one(
    client: &Client<crate::tls::Connector, Full<Bytes>>,
    o: &BenchOptions,
    prompt: &Prompt,
) -> Sample {
    let Some(limit) = o.timeout else {
        return attempt(client, o, prompt).await;
    };
    match tokio::time::timeout(limit, attempt(client, o, prompt)).await {
        Ok(s) => s,
        Err(_) => Sample {
            e2e: limit.as_secs_f64() * 1000.0,
            max_tokens: u64::from(prompt.output_tokens.unwrap_or(o.max_tokens)),
            failure: Some(Failure::Timeout {
                after_ms: u64::try_from(limit.as_millis()).unwrap_or(u64::MAX),
            }),
            ..Sample::default()
        },
    }
}

/// One request, sent and read to its end.
async fn attempt(
    client: &Client<crate::tls::Connector, Full<Bytes>>,
    o: &BenchOptions,
    prompt: &Prompt,
) -> Sample {
    let max_tokens = prompt.output_tokens.unwrap_or(o.max_tokens);
    let body = o
        .endpoint
        .body(&o.model, &prompt.text, max_tokens, o.stream, o.ignore_eos);
    let mut req = http::Request::post(endpoint_url(&o.url, o.endpoint))
        .header("content-type", "application/json");
    if o.endpoint == Endpoint::Messages {
        req = req.header("anthropic-version", "2023-06-01");
    }
    for (k, v) in &o.headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let mut s = Sample {
        max_tokens: u64::from(max_tokens),
        ..Sample::default()
    };
    let req = match req.body(Full::new(Bytes::from(body.to_string()))) {
        Ok(r) => r,
        Err(e) => {
            s.failure = Some(Failure::Connect {
                error: format!("the request could not be made: {}", error_chain(&e)),
            });
            return s;
        }
    };
    let t0 = Instant::now();
    let ms = |t: Instant| t.saturating_duration_since(t0).as_secs_f64() * 1000.0;
    let resp = match client.request(req).await {
        Ok(r) => r,
        Err(e) => {
            s.e2e = ms(Instant::now());
            s.failure = Some(Failure::Connect {
                error: error_chain(&e),
            });
            return s;
        }
    };
    s.status = resp.status().as_u16();
    s.purpose_taken = resp.headers().contains_key(crate::meter::PURPOSE_HEADER);
    s.via_gateway = resp.headers().contains_key(crate::meter::REQUEST_ID_HEADER);
    let dialect = o.endpoint.dialect();
    let mut body = resp.into_body();
    if !(200..300).contains(&s.status) {
        // The start of what it said, for the report.
        let mut head = Vec::new();
        while head.len() < FAILURE_BODY {
            match body.frame().await {
                Some(Ok(f)) => {
                    if let Ok(d) = f.into_data() {
                        head.extend_from_slice(&d);
                    }
                }
                _ => break,
            }
        }
        s.e2e = ms(Instant::now());
        s.failure = Some(Failure::Status {
            status: s.status,
            body: body_head(&head),
        });
        return s;
    }
    let mut scanner = SseScanner::default();
    let (mut first, mut last): (Option<Instant>, Option<Instant>) = (None, None);
    // vLLM's clock: the events with choices.
    let mut vllm: Option<(VllmTimes, Instant)> = None;
    let mut events = 0u64;
    let mut usage_out = None;
    let mut whole = Vec::new();
    let mut cut = None;
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(f) => f,
            Err(e) => {
                cut = Some(error_chain(&e));
                break;
            }
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let now = Instant::now();
        if !o.stream {
            whole.extend_from_slice(&data);
            continue;
        }
        scanner.feed(&data, |ev| {
            s.ttfc.get_or_insert(ms(now));
            if has_choices(ev.data) {
                match &mut vllm {
                    None => {
                        vllm = Some((
                            VllmTimes {
                                ttft_ms: ms(now),
                                ..VllmTimes::default()
                            },
                            now,
                        ));
                    }
                    Some((v, prev)) => {
                        v.itl_ms
                            .push(now.saturating_duration_since(*prev).as_secs_f64() * 1000.0);
                        *prev = now;
                    }
                }
            }
            let obs = dialect.classify(ev.data);
            s.complete |= obs.done;
            if let Some(u) = obs.usage {
                usage_out = u.output.or(usage_out);
                s.input_tokens = u.input.unwrap_or(s.input_tokens);
            }
            if obs.output {
                events += 1;
                match last {
                    Some(l) => s
                        .itl
                        .push(now.saturating_duration_since(l).as_secs_f64() * 1000.0),
                    None => first = Some(now),
                }
                last = Some(now);
            }
        });
    }
    s.e2e = ms(Instant::now());
    s.vllm = vllm.map(|(mut v, last)| {
        v.latency_ms = ms(last);
        v
    });
    if o.stream {
        s.ttft = first.map(ms);
        s.output_tokens = usage_out.unwrap_or(events);
        if let (Some(f), Some(l)) = (first, last) {
            if s.output_tokens > 1 {
                s.tpot = Some(
                    l.saturating_duration_since(f).as_secs_f64() * 1000.0
                        / (s.output_tokens - 1) as f64,
                );
            }
        }
    } else {
        let obs = dialect.classify(&whole);
        s.complete = cut.is_none() && !obs.malformed;
        if let Some(u) = obs.usage {
            s.output_tokens = u.output.unwrap_or(0);
            s.input_tokens = u.input.unwrap_or(0);
        }
        if cut.is_none() && obs.malformed {
            s.failure = Some(Failure::Malformed {
                body: body_head(&whole),
            });
        }
    }
    if let Some(error) = cut {
        s.complete = false;
        s.failure = Some(Failure::Cut { error });
    } else if !s.complete && s.failure.is_none() {
        s.failure = Some(Failure::Incomplete);
    }
    s
}

/// The serving engine as it describes itself, read before a run: what the field's reports attach
/// to TTFT, TPOT and tokens/s. Each part is what answered; a gateway or a hosted API answers few.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineInfo {
    /// Which engine answered (`vllm`, `sglang`, `tensorrt-llm`, `tgi`, `llama.cpp`, `ollama`),
    /// told by the names on its `/metrics` or the paths that described it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    /// Its `/version` (vLLM's, SGLang's, `trtllm-serve`'s).
    #[serde(
        default,
        alias = "vllm_version",
        skip_serializing_if = "Option::is_none"
    )]
    pub version: Option<String>,
    /// `/v1/models`: the models served, with `max_model_len` where the engine says it (vLLM).
    #[serde(default)]
    pub models: Vec<ServedModel>,
    /// The labels of vLLM's `vllm:cache_config_info` series on `/metrics`: block size, cache
    /// dtype, GPU memory utilisation, GPU and CPU blocks, prefix caching…
    #[serde(default)]
    pub cache_config: std::collections::BTreeMap<String, String>,
    /// The engine's own description where it has one, by path, as it wrote it: TGI's `/info`,
    /// SGLang's `/get_server_info`, llama.cpp's `/props`, Ollama's `/api/show` of the model,
    /// `trtllm-serve`'s latest iteration statistics (its JSON `/metrics`).
    #[serde(default)]
    pub server_info: std::collections::BTreeMap<String, serde_json::Value>,
}

/// One model of `/v1/models`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServedModel {
    /// Its id (what `--model` names).
    pub id: String,
    /// The longest prompt plus output it takes, tokens.
    #[serde(default)]
    pub max_model_len: Option<u64>,
}

impl EngineInfo {
    /// Nothing answered.
    pub fn is_empty(&self) -> bool {
        self.version.is_none()
            && self.engine.is_none()
            && self.models.is_empty()
            && self.cache_config.is_empty()
            && self.server_info.is_empty()
    }

    /// One line for the terminal: the version, the models, the main cache settings.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        let name = match self.engine.as_deref() {
            Some("vllm") => "vLLM",
            Some("sglang") => "SGLang",
            Some("tensorrt-llm") => "TensorRT-LLM",
            Some("tgi") => "TGI",
            Some("llama.cpp") => "llama.cpp",
            Some("ollama") => "Ollama",
            _ => "engine",
        };
        match (&self.engine, &self.version) {
            (_, Some(v)) => parts.push(format!("{name} {v}")),
            (Some(_), None) => parts.push(name.to_owned()),
            _ => {}
        }
        for m in &self.models {
            parts.push(match m.max_model_len {
                Some(n) => format!("{} (max_model_len {n})", m.id),
                None => m.id.clone(),
            });
        }
        // The cache settings a reader weighs first (all of them are in the report).
        parts.extend(
            [
                "block_size",
                "cache_dtype",
                "gpu_memory_utilization",
                "num_gpu_blocks",
                "enable_prefix_caching",
            ]
            .iter()
            .filter_map(|k| Some(format!("{k}={}", self.cache_config.get(*k)?))),
        );
        parts.extend(self.server_info.keys().map(|p| format!("{p} read")));
        parts.join(", ")
    }
}

/// Reads what the engine behind `o.url` says of itself (each request bounded to 2 s; what does
/// not answer is left out). `o.headers` go with each (an API key).
pub async fn engine_info(o: &BenchOptions) -> EngineInfo {
    let base = o.url.trim_end_matches('/');
    let root = base.strip_suffix("/v1").unwrap_or(base);
    let client: Client<crate::tls::Connector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build(o.connector.clone());
    let headers = without_run(&o.headers);
    let get = |path: &str| {
        let (url, client, headers) = (format!("{root}{path}"), client.clone(), headers.clone());
        async move { get_body(&client, &url, &headers, 4 << 20).await.ok() }
    };
    let mut info = EngineInfo::default();
    #[derive(Deserialize)]
    struct Version {
        version: String,
    }
    #[derive(Deserialize)]
    struct Models {
        data: Vec<ServedModel>,
    }
    if let Some(b) = get("/version").await {
        info.version = serde_json::from_slice::<Version>(&b)
            .ok()
            .map(|v| v.version);
    }
    if let Some(b) = get("/v1/models").await {
        info.models = serde_json::from_slice::<Models>(&b)
            .map(|m| m.data)
            .unwrap_or_default();
    }
    if let Some(b) = get("/metrics").await {
        let text = String::from_utf8_lossy(&b);
        // The engine by its metric names; trtllm-serve answers JSON, its iteration statistics.
        info.engine = [
            ("vllm:", "vllm"),
            ("sglang:", "sglang"),
            ("trtllm_", "tensorrt-llm"),
            ("trtllm:", "tensorrt-llm"),
            ("nv_trt_llm_", "tensorrt-llm"),
            ("tgi_", "tgi"),
            ("llamacpp:", "llama.cpp"),
        ]
        .iter()
        .find(|(prefix, _)| {
            crate::util::promtext::samples(&text).any(|s| s.name.starts_with(prefix))
        })
        .map(|(_, name)| (*name).to_owned());
        if let Ok(serde_json::Value::Array(stats)) = serde_json::from_slice::<serde_json::Value>(&b)
        {
            if let Some(latest) = stats.into_iter().rev().find(|v| v.get("iter").is_some()) {
                info.engine = Some("tensorrt-llm".into());
                info.server_info.insert("/metrics".into(), latest);
            }
        }
        let series =
            crate::util::promtext::samples(&text).find(|s| s.name == "vllm:cache_config_info");
        info.cache_config = series.map_or_else(Default::default, |s| {
            crate::util::promtext::pairs(s.labels)
                .filter(|(k, _)| *k != "engine")
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        });
    }
    for path in ["/info", "/get_server_info", "/props"] {
        if let Some(v) = get(path)
            .await
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .filter(serde_json::Value::is_object)
        {
            info.server_info.insert(path.to_owned(), v);
        }
    }
    // Ollama describes a model on POST: its details (family, parameter size, quantization
    // level), parameters and model info; its modelfile, template and licence are left out.
    let show = async {
        let mut req = http::Request::post(format!("{root}/api/show"))
            .header("content-type", "application/json");
        for (k, v) in &without_run(&o.headers) {
            req = req.header(k.as_str(), v.as_str());
        }
        let req = req
            .body(Full::new(Bytes::from(
                json!({"model": o.model}).to_string(),
            )))
            .ok()?;
        let resp = client.request(req).await.ok()?;
        if !resp.status().is_success() {
            return None;
        }
        let b = http_body_util::Limited::new(resp.into_body(), 4 << 20)
            .collect()
            .await
            .ok()?
            .to_bytes();
        let mut v: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&b).ok()?;
        for bulky in ["modelfile", "template", "license", "tensors"] {
            v.remove(bulky);
        }
        Some(serde_json::Value::Object(v))
    };
    if let Some(v) = tokio::time::timeout(Duration::from_secs(2), show)
        .await
        .ok()
        .flatten()
        .filter(|v| v.get("details").is_some())
    {
        info.server_info.insert("/api/show".to_owned(), v);
    }
    // Where the metrics did not tell, the paths that described the engine do.
    if info.engine.is_none() {
        info.engine = [
            ("/get_server_info", "sglang"),
            ("/info", "tgi"),
            ("/props", "llama.cpp"),
            ("/api/show", "ollama"),
        ]
        .iter()
        .find(|(path, _)| info.server_info.contains_key(*path))
        .map(|(_, name)| (*name).to_owned());
    }
    info
}

/// `GET url` with `headers`: the body of a 2xx answer (at most `limit` bytes, within two
/// seconds), or why not.
pub(crate) async fn get_body(
    client: &Client<crate::tls::Connector, Full<Bytes>>,
    url: &str,
    headers: &[(String, String)],
    limit: usize,
) -> Result<Bytes, String> {
    let mut req = http::Request::get(url);
    for (k, v) in headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let req = req
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    let read = async {
        let resp = client.request(req).await.map_err(|e| error_chain(&e))?;
        if !resp.status().is_success() {
            return Err(format!("status {}", resp.status().as_u16()));
        }
        http_body_util::Limited::new(resp.into_body(), limit)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .map_err(|e| e.to_string())
    };
    tokio::time::timeout(Duration::from_secs(2), read)
        .await
        .map_err(|_| "no answer in 2 s".to_string())?
}

/// Runs the benchmark; returns every sample and the wall time of the run.
pub async fn run(o: &BenchOptions) -> (Vec<Sample>, Duration) {
    let http = o.connector.clone();
    // One client per HTTP/2 connection: a client multiplexes everything onto one connection per
    // host, and a server caps the streams of a connection (nginx: 128, hyper: 200).
    let clients: Arc<Vec<Client<crate::tls::Connector, Full<Bytes>>>> =
        Arc::new(match o.http2_connections {
            None => vec![Client::builder(TokioExecutor::new())
                .pool_max_idle_per_host(4096)
                .build(http)],
            Some(k) => (0..k.max(1))
                .map(|_| {
                    Client::builder(TokioExecutor::new())
                        .http2_only(true)
                        .http2_initial_stream_window_size(1 << 20)
                        .build(http.clone())
                })
                .collect(),
        });
    let o = Arc::new(o.clone());
    let samples = Arc::new(Mutex::new(Vec::with_capacity(o.requests)));
    let issued = Arc::new(AtomicUsize::new(0));
    if o.warmup > 0 {
        // Not the run's requests: untagged, so a gateway does not count them under its id.
        let untagged = Arc::new(BenchOptions {
            headers: without_run(&o.headers),
            ..(*o).clone()
        });
        let warm: Vec<_> = (0..o.warmup)
            .map(|i| {
                let client = clients[i % clients.len()].clone();
                let o = Arc::clone(&untagged);
                tokio::spawn(async move {
                    one(&client, &o, &o.prompts[i % o.prompts.len()]).await;
                })
            })
            .collect();
        for w in warm {
            let _ = w.await;
        }
    }
    let start = Instant::now();
    let deadline = o.duration.map(|d| start + d);
    let more = {
        let issued = Arc::clone(&issued);
        let o = Arc::clone(&o);
        move || {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return None;
            }
            let i = issued.fetch_add(1, Ordering::Relaxed);
            (i < o.requests).then_some(i)
        }
    };
    let progress = o.progress.then(|| {
        let (samples, o) = (Arc::clone(&samples), Arc::clone(&o));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let done = samples.lock().len();
                let width = 30;
                let filled = (done * width / o.requests.max(1)).min(width);
                eprint!(
                    "\r[{}{}] {done}/{} requests, {:.0} s",
                    "#".repeat(filled),
                    " ".repeat(width - filled),
                    o.requests,
                    start.elapsed().as_secs_f64()
                );
            }
        })
    });
    let mut tasks = Vec::new();
    // When each request is sent: its sample carries it, for the warm-up and cool-down cuts.
    let sent = move |s: &mut Sample, at: Instant| {
        s.sent_s = at.saturating_duration_since(start).as_secs_f64();
    };
    match o.arrivals {
        Arrivals::Concurrency(c) => {
            for t in 0..c.max(1) {
                let (client, o, samples, more) = (
                    clients[t % clients.len()].clone(),
                    Arc::clone(&o),
                    Arc::clone(&samples),
                    more.clone(),
                );
                tasks.push(tokio::spawn(async move {
                    while let Some(i) = more() {
                        let at = Instant::now();
                        let mut s = one(&client, &o, &o.prompts[i % o.prompts.len()]).await;
                        sent(&mut s, at);
                        samples.lock().push(s);
                    }
                }));
            }
        }
        Arrivals::Poisson(rate) | Arrivals::Constant(rate) => {
            let mut rng = crate::util::Rng::new(o.seed);
            let slots = o
                .pacing
                .max_concurrency
                .map(|n| Arc::new(tokio::sync::Semaphore::new(n.max(1))));
            let mut at = start;
            loop {
                // Every request sent: the run drains now, not one more gap from now (that idle
                // gap would be counted in its duration and lower its throughput).
                if issued.load(Ordering::Relaxed) >= o.requests {
                    break;
                }
                // Asked after the wait: nothing leaves once the run's time is up.
                tokio::time::sleep_until(at).await;
                let Some(i) = more() else { break };
                // The rate now: during a ramp-up, from a tenth of it to all of it.
                let now_rate = match o.pacing.ramp_up {
                    Some(r) if !r.is_zero() => {
                        let f = at.saturating_duration_since(start).as_secs_f64() / r.as_secs_f64();
                        rate * f.clamp(0.1, 1.0)
                    }
                    _ => rate,
                };
                let gap = match o.arrivals {
                    Arrivals::Poisson(_) if (o.pacing.burstiness - 1.0).abs() > f64::EPSILON => {
                        // vLLM's gamma arrivals: shape k, scale 1 / (rate · k), mean 1 / rate.
                        let k = o.pacing.burstiness.max(1e-3);
                        gamma(&mut rng, k) / (now_rate * k)
                    }
                    Arrivals::Poisson(_) => -(1.0 - rng.unit()).ln() / now_rate,
                    _ => 1.0 / now_rate,
                };
                at += Duration::from_secs_f64(gap);
                let client = clients[i % clients.len()].clone();
                let (o, samples, slots) = (Arc::clone(&o), Arc::clone(&samples), slots.clone());
                tasks.push(tokio::spawn(async move {
                    // Past the cap, the request waits for a slot; its clock starts when sent.
                    let _slot = match &slots {
                        Some(s) => Some(Arc::clone(s).acquire_owned().await),
                        None => None,
                    };
                    let at = Instant::now();
                    let mut s = one(&client, &o, &o.prompts[i % o.prompts.len()]).await;
                    sent(&mut s, at);
                    samples.lock().push(s);
                }));
            }
        }
    }
    // The sending is over: the warm-up and cool-down stretches are known.
    let sending = start.elapsed().as_secs_f64();
    // Drained, or with --duration cut when it ends.
    let drained = {
        let all = async {
            for t in tasks.iter_mut() {
                let _ = t.await;
            }
        };
        match deadline {
            Some(d) => tokio::time::timeout_at(d, all).await.is_ok(),
            None => {
                all.await;
                true
            }
        }
    };
    if !drained {
        for t in &tasks {
            t.abort();
        }
        for t in tasks {
            let _ = t.await;
        }
        // The requests sent whose sample never came: each one cut.
        let sent = issued.load(Ordering::Relaxed).min(o.requests);
        let mut v = samples.lock();
        let cut = sent.saturating_sub(v.len());
        v.extend((0..cut).map(|_| Sample {
            failure: Some(Failure::Unfinished),
            ..Sample::default()
        }));
    }
    if let Some(p) = progress {
        p.abort();
        eprintln!();
    }
    let wall = start.elapsed();
    let mut v = std::mem::take(&mut *samples.lock());
    let (warm, cool) = (
        o.pacing.warmup_time.as_secs_f64(),
        o.pacing.cooldown_time.as_secs_f64(),
    );
    if warm > 0.0 || cool > 0.0 {
        for s in v
            .iter_mut()
            .filter(|s| s.failure != Some(Failure::Unfinished))
        {
            s.excluded = s.sent_s < warm || s.sent_s > sending - cool;
        }
    }
    (v, wall)
}

/// A distribution of one client-side metric, milliseconds (percentiles by the gateway's one
/// rule, so client-side and `/stats` numbers compare).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Dist {
    /// Mean, three decimals.
    pub mean: f64,
    /// 50th percentile (the one percentile rule, `util::quantile`).
    pub median: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Standard deviation (of the population, as numpy's `std` and vLLM's report take it).
    #[serde(default)]
    pub std: f64,
}

impl Dist {
    /// Of `v` (sorted in place), `None` when empty.
    /// The distribution of `v` (sorted in place); `None` when empty.
    pub fn of_samples(v: &mut [f64]) -> Option<Self> {
        Self::of(v)
    }

    fn of(v: &mut [f64]) -> Option<Self> {
        if v.is_empty() {
            return None;
        }
        v.sort_unstable_by(f64::total_cmp);
        let q = |p: f64| quantile::of_sorted_ms(v, p);
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
        let three = |x: f64| (x * 1000.0).round() / 1000.0;
        Some(Self {
            mean: three(mean),
            median: q(0.5)?,
            p90: q(0.9)?,
            p99: q(0.99)?,
            std: three(var.sqrt()),
        })
    }
}

/// What was run, as the report keeps it: enough to repeat the run and to read its numbers
/// without the command line at hand (no credentials: headers are left out).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    /// When the run started, RFC 3339 UTC.
    pub date: String,
    /// The `inferscope` version that ran it.
    pub inferscope_version: String,
    /// Where the requests went (the endpoint's full URL).
    pub url: String,
    /// The API: `chat`, `completions`, `responses` or `messages`.
    pub endpoint: String,
    /// The model asked for.
    pub model: String,
    /// The dataset file (`None`: synthetic prompts).
    pub dataset: Option<String>,
    /// SHA-256 of the dataset file, hex.
    pub dataset_sha256: Option<String>,
    /// How the requests were drawn: layout, lengths counted by what, entries kept and dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<workload::Sampled>,
    /// Seed of the arrivals and of synthetic prompts.
    pub seed: u64,
    /// `poisson`, `constant` or `concurrency`.
    pub arrivals: String,
    /// Offered requests per second (open loop).
    pub rate: Option<f64>,
    /// Requests in flight (closed loop).
    pub concurrency: Option<usize>,
    /// The gamma shape of the gaps (Poisson arrivals; 1: Poisson).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burstiness: Option<f64>,
    /// The cap on requests in flight of an open-loop run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<usize>,
    /// The ramp-up, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ramp_up_s: Option<f64>,
    /// The warm-up stretch left out, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup_time_s: Option<f64>,
    /// The cool-down stretch left out, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cooldown_time_s: Option<f64>,
    /// `--requests`.
    pub max_requests: usize,
    /// `--duration`, seconds.
    pub max_duration_s: Option<f64>,
    /// `max_tokens` of each request whose prompt sets none.
    pub max_tokens: u32,
    /// `ignore_eos` (and `min_tokens`) sent.
    pub ignore_eos: bool,
    /// `--timeout`, seconds.
    pub timeout_s: Option<f64>,
    /// Streamed requests.
    pub stream: bool,
    /// Requests sent first and left out.
    pub warmup: usize,
    /// What the user said of the run (`--label quant=int8`).
    pub labels: std::collections::BTreeMap<String, String>,
    /// The id its requests carried (`x-inferscope-run`): a gateway tallies them apart under it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
}

impl RunInfo {
    /// The run `o` describes, starting now; `dataset`: its path and contents.
    pub fn of(o: &BenchOptions, dataset: Option<(&str, &[u8])>, version: &str) -> Self {
        let (arrivals, rate, concurrency) = match o.arrivals {
            Arrivals::Poisson(r) => ("poisson", Some(r), None),
            Arrivals::Constant(r) => ("constant", Some(r), None),
            Arrivals::Concurrency(c) => ("concurrency", None, Some(c)),
        };
        RunInfo {
            date: crate::util::time::rfc3339(std::time::SystemTime::now()),
            inferscope_version: version.to_owned(),
            url: endpoint_url(&o.url, o.endpoint),
            endpoint: o.endpoint.name().to_owned(),
            model: o.model.clone(),
            dataset: dataset.map(|(path, _)| path.to_owned()),
            dataset_sha256: dataset.map(|(_, bytes)| sha256_hex(bytes)),
            workload: None,
            seed: o.seed,
            arrivals: arrivals.to_owned(),
            rate,
            concurrency,
            burstiness: matches!(o.arrivals, Arrivals::Poisson(_)).then_some(o.pacing.burstiness),
            max_concurrency: o.pacing.max_concurrency.filter(|_| rate.is_some()),
            ramp_up_s: o
                .pacing
                .ramp_up
                .filter(|_| rate.is_some())
                .map(|d| d.as_secs_f64()),
            warmup_time_s: Some(o.pacing.warmup_time.as_secs_f64()).filter(|s| *s > 0.0),
            cooldown_time_s: Some(o.pacing.cooldown_time.as_secs_f64()).filter(|s| *s > 0.0),
            max_requests: o.requests,
            max_duration_s: o.duration.map(|d| d.as_secs_f64()),
            max_tokens: o.max_tokens,
            ignore_eos: o.ignore_eos,
            timeout_s: o.timeout.map(|d| d.as_secs_f64()),
            stream: o.stream,
            warmup: o.warmup,
            labels: std::collections::BTreeMap::new(),
            run_id: o
                .headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(crate::stats::runs::RUN_HEADER))
                .map(|(_, v)| v.clone()),
        }
    }
}

/// `headers` without the run id (`x-inferscope-run`): for the requests that are not the run's
/// own (warm-up, counting tokens, reading the engine).
pub fn without_run(headers: &[(String, String)]) -> Vec<(String, String)> {
    headers
        .iter()
        .filter(|(k, _)| !k.eq_ignore_ascii_case(crate::stats::runs::RUN_HEADER))
        .cloned()
        .collect()
}

/// A new run id: `bench-` and the start in Unix milliseconds, and four hex digits that tell
/// apart runs started in the same millisecond.
pub fn new_run_id() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let n = RUNS.fetch_add(1, Ordering::Relaxed) as u64;
    let mut rng = crate::util::Rng::new(
        ms as u64 ^ u64::from(std::process::id()).rotate_left(32) ^ n.rotate_left(48),
    );
    format!("bench-{ms}-{:04x}", rng.next_u64() & 0xffff)
}

/// SHA-256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .fold(String::new(), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// A benchmark run's report (vLLM `bench serve`'s names, the gateway's definitions): what
/// `inferscope bench` prints and writes with `--out`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    /// What was run (set by the command line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<RunInfo>,
    /// The engine as it described itself before the run (set by the command line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineInfo>,
    /// Wall time of the run, seconds.
    pub duration_s: f64,
    /// Requests finished (after warm-up; those cut when `--duration` ended are `cut_at_end`).
    pub requests: usize,
    /// Of those, answered in full.
    pub successful: usize,
    /// The rest.
    pub failed: usize,
    /// The failed ones by reason, most frequent first, each with one example.
    #[serde(default)]
    pub failures: Vec<FailureCount>,
    /// Requests still in flight when `--duration` ended: cut, and in none of the figures.
    #[serde(default)]
    pub cut_at_end: usize,
    /// The share of the requests that met every SLO (`None`: no `--slo`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slo_attainment: Option<f64>,
    /// Requests sent in the warm-up or cool-down stretch (`--warmup-time`, `--cooldown-time`):
    /// answered, and in none of the figures, which are over the rest's own span.
    #[serde(default)]
    pub excluded: usize,
    /// Output tokens of the successful requests, as measured (usage, else events counted).
    #[serde(default)]
    pub total_output_tokens: u64,
    /// Output tokens those requests asked for (`max_tokens` each): with `ignore_eos`, what
    /// `total_output_tokens` should be.
    #[serde(default)]
    pub requested_output_tokens: u64,
    /// Prompt tokens of the successful requests (usage).
    #[serde(default)]
    pub total_input_tokens: u64,
    /// Successful requests per second.
    pub request_throughput: f64,
    /// Output tokens per second.
    pub output_token_throughput: f64,
    /// Prompt and output tokens per second.
    pub total_token_throughput: f64,
    /// Requests per second that met every `--slo` (`None`: no SLO given).
    pub goodput: Option<f64>,
    /// The SLOs, as `metric<=Nms`.
    pub slo: Vec<String>,
    /// Time to first token.
    pub ttft_ms: Option<Dist>,
    /// Time to first chunk.
    pub ttfc_ms: Option<Dist>,
    /// Time per output token.
    pub tpot_ms: Option<Dist>,
    /// Inter-token latency (every gap).
    pub itl_ms: Option<Dist>,
    /// End to end.
    pub e2e_ms: Option<Dist>,
    /// `--percentiles`: per metric (`ttft`, `tpot`, `itl`, `e2e`), each asked percentile
    /// (`p95`, `p99.9`), milliseconds, by the gateway's rule.
    #[serde(default)]
    pub percentiles: std::collections::BTreeMap<String, std::collections::BTreeMap<String, f64>>,
    /// `--sweep`: the rate this row was offered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<f64>,
    /// `--gpu`: where the run sits on the roofline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roofline: Option<crate::stats::roofline::Assessment>,
    /// `--compare-gateway`: the gateway's figures over this run's own requests (its
    /// `/stats/runs/{run_id}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<crate::stats::TallyStats>,
    /// `--gpu-metrics`, `--engine-metrics`: the engine and the GPUs through the run, and the
    /// energy per output token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware: Option<hardware::Hardware>,
    /// `--per-request`: every request as the client saw it, in the order they ended (those cut
    /// by `--duration` included, as failures `unfinished`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_request: Vec<Sample>,
}

/// Failed requests of one reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureCount {
    /// `connect`, `status 404`, `stream cut`, `incomplete`, `malformed body`.
    pub reason: String,
    /// Requests that failed so.
    pub count: usize,
    /// The first of them.
    pub example: Failure,
}

/// The failures of `samples` by reason, most frequent first (then by reason).
fn failure_counts(samples: &[Sample]) -> Vec<FailureCount> {
    let mut by: Vec<FailureCount> = Vec::new();
    for f in samples.iter().filter_map(|s| s.failure.as_ref()) {
        let reason = f.reason();
        match by.iter_mut().find(|c| c.reason == reason) {
            Some(c) => c.count += 1,
            None => by.push(FailureCount {
                reason,
                count: 1,
                example: f.clone(),
            }),
        }
    }
    by.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.reason.cmp(&b.reason)));
    by
}

/// The report (vLLM `bench serve` style, the gateway's definitions).
pub fn summarize(samples: &[Sample], wall: Duration, slo: &[(String, Duration)]) -> BenchReport {
    let unfinished = |s: &Sample| s.failure == Some(Failure::Unfinished);
    let cut_at_end = samples.iter().filter(|s| unfinished(s)).count();
    let excluded = samples.iter().filter(|s| s.excluded).count();
    let finished: Vec<Sample> = samples
        .iter()
        .filter(|s| !unfinished(s) && !s.excluded)
        .cloned()
        .collect();
    let samples = &finished[..];
    // With stretches left out, rates are over the measured requests' own span: from the first
    // one's sending to the last one's end.
    let secs = match excluded {
        0 => wall.as_secs_f64(),
        _ => {
            let first = samples
                .iter()
                .map(|s| s.sent_s)
                .fold(f64::INFINITY, f64::min);
            let last = samples
                .iter()
                .map(|s| s.sent_s + s.e2e / 1000.0)
                .fold(0.0, f64::max);
            (last - first).max(0.0)
        }
    }
    .max(1e-9);
    let ok: Vec<&Sample> = samples.iter().filter(|s| s.ok()).collect();
    let out: u64 = ok.iter().map(|s| s.output_tokens).sum();
    let inp: u64 = ok.iter().map(|s| s.input_tokens).sum();
    let collect =
        |f: &dyn Fn(&Sample) -> Option<f64>| ok.iter().filter_map(|s| f(s)).collect::<Vec<f64>>();
    let mut itl: Vec<f64> = ok.iter().flat_map(|s| s.itl.iter().copied()).collect();
    let good = samples.iter().filter(|s| s.meets(slo)).count();
    BenchReport {
        run: None,
        engine: None,
        duration_s: secs,
        requests: samples.len(),
        successful: ok.len(),
        failed: samples.len() - ok.len(),
        failures: failure_counts(samples),
        cut_at_end,
        excluded,
        total_output_tokens: out,
        requested_output_tokens: ok.iter().map(|s| s.max_tokens).sum(),
        total_input_tokens: inp,
        request_throughput: ok.len() as f64 / secs,
        output_token_throughput: out as f64 / secs,
        total_token_throughput: (out + inp) as f64 / secs,
        goodput: (!slo.is_empty()).then(|| good as f64 / secs),
        slo_attainment: (!slo.is_empty() && !samples.is_empty())
            .then(|| good as f64 / samples.len() as f64),
        slo: slo
            .iter()
            .map(|(k, d)| format!("{k}<={}ms", d.as_millis()))
            .collect(),
        ttft_ms: Dist::of(&mut collect(&|s| s.ttft)),
        ttfc_ms: Dist::of(&mut collect(&|s| s.ttfc)),
        tpot_ms: Dist::of(&mut collect(&|s| s.tpot)),
        itl_ms: Dist::of(&mut itl),
        e2e_ms: Dist::of(&mut collect(&|s| Some(s.e2e))),
        percentiles: Default::default(),
        rate: None,
        roofline: None,
        gateway: None,
        hardware: None,
        per_request: Vec::new(),
    }
}

/// The run as `vllm bench serve --save-result` writes its file, key for key where the figure is
/// the same (what reads those files reads this): per request `input_lens`, `output_lens`,
/// `ttfts`, `itls`, `latencies` (seconds) and `errors`; `mean_`, `median_`, `std_` and
/// `p{N}_` of `ttft`, `tpot`, `itl` and `e2el` in milliseconds over the successful requests,
/// with vLLM's percentile rule (numpy's linear interpolation, not the gateway's); the counts,
/// throughputs and run description, and `cut_at_end` (not vLLM's: what `--duration` cut). TPOT
/// is the gateway's (first to last token over the tokens between), where vLLM's runs from the
/// first token to the response's end. Not kept, so not written: `generated_texts`,
/// `start_times`, `queue_times`.
pub fn vllm_result(
    samples: &[Sample],
    report: &BenchReport,
    percentiles: &[f64],
) -> serde_json::Map<String, serde_json::Value> {
    let finished: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.failure != Some(Failure::Unfinished) && !s.excluded)
        .collect();
    let ok: Vec<&Sample> = finished.iter().copied().filter(|s| s.ok()).collect();
    let secs = |ms: f64| ms / 1000.0;
    let mut m = serde_json::Map::new();
    let mut put = |k: &str, v: serde_json::Value| {
        m.insert(k.to_owned(), v);
    };
    if let Some(run) = &report.run {
        // vLLM's name of the API (`--backend`), where it has one.
        let backend = match run.endpoint.as_str() {
            "chat" => "openai-chat",
            "completions" => "openai",
            other => other,
        };
        put("date", json!(run.date));
        put("backend", json!(backend));
        put("endpoint_type", json!(backend));
        put("model_id", json!(run.model));
        put("num_prompts", json!(run.max_requests));
        put("request_rate", run.rate.map_or(json!("inf"), |r| json!(r)));
        put("burstiness", json!(run.burstiness));
        put(
            "max_concurrency",
            json!(run.max_concurrency.or(run.concurrency)),
        );
        for (k, v) in &run.labels {
            put(k, json!(v));
        }
    }
    put("duration", json!(report.duration_s));
    put("completed", json!(report.successful));
    put("failed", json!(report.failed));
    // Not vLLM's: the requests `--duration` cut, which are in neither count nor any figure.
    put("cut_at_end", json!(report.cut_at_end));
    put("total_input_tokens", json!(report.total_input_tokens));
    put("total_output_tokens", json!(report.total_output_tokens));
    put("request_throughput", json!(report.request_throughput));
    put(
        "request_goodput",
        report.goodput.map_or(serde_json::Value::Null, |g| json!(g)),
    );
    put("output_throughput", json!(report.output_token_throughput));
    put(
        "total_token_throughput",
        json!(report.total_token_throughput),
    );
    put(
        "input_lens",
        json!(finished.iter().map(|s| s.input_tokens).collect::<Vec<_>>()),
    );
    put(
        "output_lens",
        json!(finished.iter().map(|s| s.output_tokens).collect::<Vec<_>>()),
    );
    // vLLM's definitions, where it has them (streamed requests: `Sample::vllm`): TTFT to the
    // first event with choices, ITL between such events, E2E to the last of them, TPOT their
    // (E2E − TTFT) over the output tokens after the first. A request without them (not
    // streamed) is timed as ours: TTFT 0 (vLLM's for a non-streamed endpoint), E2E ours.
    let ttft = |s: &Sample| s.vllm.as_ref().map(|v| v.ttft_ms);
    let latency = |s: &Sample| s.vllm.as_ref().map_or(s.e2e, |v| v.latency_ms);
    fn itl(s: &Sample) -> &[f64] {
        s.vllm.as_ref().map_or(&[][..], |v| &v.itl_ms[..])
    }
    let tpot = |s: &Sample| {
        let v = s.vllm.as_ref()?;
        (s.output_tokens > 1).then(|| (v.latency_ms - v.ttft_ms) / (s.output_tokens - 1) as f64)
    };
    put(
        "definitions",
        json!("vLLM's (vllm bench serve): ttft to the first chunk with choices (the role chunk counts), itl between chunks with choices, latency to the last of them, tpot (latency - ttft) / (output tokens - 1); inferscope's own are in its own format"),
    );
    put(
        "ttfts",
        json!(finished
            .iter()
            .map(|s| ttft(s).map_or(0.0, secs))
            .collect::<Vec<_>>()),
    );
    put(
        "itls",
        json!(finished
            .iter()
            .map(|s| itl(s).iter().copied().map(secs).collect::<Vec<_>>())
            .collect::<Vec<_>>()),
    );
    put(
        "latencies",
        json!(finished
            .iter()
            .map(|s| secs(latency(s)))
            .collect::<Vec<_>>()),
    );
    put(
        "errors",
        json!(finished
            .iter()
            .map(|s| s.failure.as_ref().map_or(String::new(), |f| format!(
                "{}: {}",
                f.reason(),
                f.detail()
            )))
            .collect::<Vec<_>>()),
    );
    let metrics: [(&str, Vec<f64>); 4] = [
        ("ttft", ok.iter().filter_map(|s| ttft(s)).collect()),
        ("tpot", ok.iter().filter_map(|s| tpot(s)).collect()),
        (
            "itl",
            ok.iter().flat_map(|s| itl(s).iter().copied()).collect(),
        ),
        ("e2el", ok.iter().map(|s| latency(s)).collect()),
    ];
    for (name, mut v) in metrics {
        v.sort_unstable_by(f64::total_cmp);
        let n = v.len() as f64;
        let mean = if v.is_empty() {
            0.0
        } else {
            v.iter().sum::<f64>() / n
        };
        let std = if v.is_empty() {
            0.0
        } else {
            (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt()
        };
        put(&format!("mean_{name}_ms"), json!(mean));
        put(
            &format!("median_{name}_ms"),
            json!(linear_percentile(&v, 50.0)),
        );
        put(&format!("std_{name}_ms"), json!(std));
        for p in percentiles {
            put(
                &format!("{}_{name}_ms", percentile_name(*p)),
                json!(linear_percentile(&v, *p)),
            );
        }
    }
    m
}

/// numpy's default percentile of sorted `v` (linear interpolation between closest ranks), 0
/// when empty, as vLLM's bench reports it.
fn linear_percentile(v: &[f64], p: f64) -> f64 {
    let Some(last) = v.len().checked_sub(1) else {
        return 0.0;
    };
    let rank = (p / 100.0).clamp(0.0, 1.0) * last as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (rank - lo as f64)
}

/// The percentiles `ps` (0–100) of each metric over the successful requests of `samples`, by
/// the gateway's rule (`util::quantile`), milliseconds: `ttft` → `p99` → value.
pub fn percentiles(
    samples: &[Sample],
    ps: &[f64],
) -> std::collections::BTreeMap<String, std::collections::BTreeMap<String, f64>> {
    let ok: Vec<&Sample> = samples.iter().filter(|s| s.ok()).collect();
    let metrics: [(&str, Vec<f64>); 4] = [
        ("ttft", ok.iter().filter_map(|s| s.ttft).collect()),
        ("tpot", ok.iter().filter_map(|s| s.tpot).collect()),
        (
            "itl",
            ok.iter().flat_map(|s| s.itl.iter().copied()).collect(),
        ),
        ("e2e", ok.iter().map(|s| s.e2e).collect()),
    ];
    metrics
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(name, mut v)| {
            v.sort_unstable_by(f64::total_cmp);
            let row = ps
                .iter()
                .filter_map(|p| Some((percentile_name(*p), quantile::of_sorted_ms(&v, p / 100.0)?)))
                .collect();
            (name.to_owned(), row)
        })
        .collect()
}

/// `p99`, `p99.9`: a percentile's key, as vLLM writes it.
fn percentile_name(p: f64) -> String {
    if p.fract() == 0.0 {
        format!("p{p:.0}")
    } else {
        format!("p{p}")
    }
}

/// The report as a table; with `gateway` (the gateway's figures for the same requests), side by
/// side.
pub fn render(r: &BenchReport, gateway: Option<&crate::stats::TallyStats>) -> String {
    let mut out = String::new();
    let f = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.2}"));
    let _ = writeln!(
        out,
        "requests: {} ({} successful, {} failed) in {} s",
        r.requests,
        r.successful,
        r.failed,
        f(Some(r.duration_s))
    );
    if r.cut_at_end > 0 {
        let _ = writeln!(
            out,
            "  cut: {} in flight when --duration ended (in none of the figures)",
            r.cut_at_end
        );
    }
    if r.excluded > 0 {
        let _ = writeln!(
            out,
            "  excluded: {} sent in the warm-up or cool-down stretch (in none of the figures)",
            r.excluded
        );
    }
    for c in &r.failures {
        let _ = writeln!(
            out,
            "  failed: {} × {}, e.g. {}",
            c.count,
            c.reason,
            crate::util::label::bounded(&c.example.detail(), FAILURE_BODY)
        );
    }
    if r.successful > 0 {
        let _ = writeln!(
            out,
            "output tokens: {} of {} asked for; input tokens: {}",
            r.total_output_tokens, r.requested_output_tokens, r.total_input_tokens
        );
    }
    let _ = writeln!(
        out,
        "request throughput: {} req/s; output tokens: {} tok/s; total tokens: {} tok/s",
        f(Some(r.request_throughput)),
        f(Some(r.output_token_throughput)),
        f(Some(r.total_token_throughput))
    );
    if let Some(g) = r.goodput {
        let _ = writeln!(
            out,
            "goodput ({}): {} req/s",
            serde_json::Value::from(r.slo.clone()),
            f(Some(g))
        );
    }
    if let Some(g) = gateway {
        let _ = writeln!(
            out,
            "gateway: {} of this run's {} requests recorded under its run id (Δ: the client's figure minus the gateway's)",
            g.requests,
            r.requests
        );
    }
    let _ = writeln!(
        out,
        "\n| metric (ms) | mean | median | p90 | p99 |{}",
        if gateway.is_some() {
            " gateway p50 | Δ p50 | gateway p99 | Δ p99 |"
        } else {
            ""
        }
    );
    let _ = writeln!(
        out,
        "|---|---|---|---|---|{}",
        if gateway.is_some() {
            "---|---|---|---|"
        } else {
            ""
        }
    );
    type Gateway = fn(&crate::stats::TallyStats) -> Option<crate::stats::LatencyStats>;
    let rows: [(&str, Option<Dist>, Gateway); 5] = [
        ("TTFT", r.ttft_ms, |t| t.ttft),
        ("TTFC", r.ttfc_ms, |t| t.ttfc),
        ("TPOT", r.tpot_ms, |t| t.tpot),
        ("ITL", r.itl_ms, |t| t.itl),
        ("E2E", r.e2e_ms, |t| t.e2e),
    ];
    let delta = |a: Option<f64>, b: Option<f64>| {
        a.zip(b)
            .map_or("-".to_string(), |(a, b)| format!("{:+.2}", a - b))
    };
    for (name, d, gw) in rows {
        let mut line = format!(
            "| {name} | {} | {} | {} | {} |",
            f(d.map(|d| d.mean)),
            f(d.map(|d| d.median)),
            f(d.map(|d| d.p90)),
            f(d.map(|d| d.p99))
        );
        if let Some(g) = gateway {
            let l = gw(g);
            let (p50, p99) = (l.map(|l| l.p50), l.map(|l| l.p99));
            let _ = write!(
                line,
                " {} | {} | {} | {} |",
                f(p50),
                delta(d.map(|d| d.median), p50),
                f(p99),
                delta(d.map(|d| d.p99), p99)
            );
        }
        let _ = writeln!(out, "{line}");
    }
    out
}

/// The columns of `--format csv`, one row per request.
pub const CSV_COLUMNS: &str = "sent_s,status,ok,failure,excluded,input_tokens,output_tokens,max_tokens,ttft_ms,ttfc_ms,tpot_ms,itl_mean_ms,itl_max_ms,e2e_ms";

/// `samples` as CSV for a spreadsheet: `CSV_COLUMNS`, one row per request (an empty cell where
/// there is no value), the failure's reason quoted where it needs it.
pub fn csv(samples: &[Sample]) -> String {
    let mut out = String::with_capacity(64 * (samples.len() + 1));
    out.push_str(CSV_COLUMNS);
    out.push('\n');
    let num = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x:.3}"));
    for s in samples {
        let reason = s.failure.as_ref().map(Failure::reason).unwrap_or_default();
        let reason = if reason.contains([',', '"', '\n']) {
            format!("\"{}\"", reason.replace('"', "\"\""))
        } else {
            reason
        };
        let itl_mean = (!s.itl.is_empty()).then(|| s.itl.iter().sum::<f64>() / s.itl.len() as f64);
        let itl_max = s.itl.iter().copied().reduce(f64::max);
        let _ = writeln!(
            out,
            "{:.6},{},{},{reason},{},{},{},{},{},{},{},{},{},{:.3}",
            s.sent_s,
            s.status,
            u8::from(s.ok()),
            u8::from(s.excluded),
            s.input_tokens,
            s.output_tokens,
            s.max_tokens,
            num(s.ttft),
            num(s.ttfc),
            num(s.tpot),
            num(itl_mean),
            num(itl_max),
            s.e2e,
        );
    }
    out
}

/// A sweep as CSV: one row per rate.
pub fn csv_sweep(rows: &[BenchReport]) -> String {
    let mut out = String::from("rate,achieved_req_s,output_tok_s,ttft_p50_ms,ttft_p99_ms,tpot_p50_ms,tpot_p99_ms,itl_p99_ms,e2e_p50_ms,e2e_p99_ms,goodput_req_s,slo_attainment,requests,failed\n");
    let num = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x:.3}"));
    for r in rows {
        let _ = writeln!(
            out,
            "{},{:.3},{:.3},{},{},{},{},{},{},{},{},{},{},{}",
            num(r.rate),
            r.request_throughput,
            r.output_token_throughput,
            num(r.ttft_ms.map(|d| d.median)),
            num(r.ttft_ms.map(|d| d.p99)),
            num(r.tpot_ms.map(|d| d.median)),
            num(r.tpot_ms.map(|d| d.p99)),
            num(r.itl_ms.map(|d| d.p99)),
            num(r.e2e_ms.map(|d| d.median)),
            num(r.e2e_ms.map(|d| d.p99)),
            num(r.goodput),
            num(r.slo_attainment),
            r.requests,
            r.failed,
        );
    }
    out
}

/// `--sweep-to-knee`: the rates a sweep to saturation runs, each chosen from what the last
/// showed — doubling from the start until a rate misses the SLOs (halving instead when the start
/// already misses them), then bisecting between the highest rate that met them and the lowest
/// that did not.
#[derive(Debug, Clone, PartialEq)]
pub struct KneeSearch {
    next: Option<f64>,
    good: Option<f64>,
    bad: Option<f64>,
    bisections_left: u32,
    doublings_left: u32,
}

impl KneeSearch {
    /// From `start` requests per second, with `bisections` steps between the last good and
    /// the first bad rate once both are known (and at most 16 doublings or halvings).
    pub fn new(start: f64, bisections: u32) -> Self {
        Self {
            next: Some(start),
            good: None,
            bad: None,
            bisections_left: bisections,
            doublings_left: 16,
        }
    }

    /// The rate to run next (`None`: the search is over).
    pub fn next(&self) -> Option<f64> {
        self.next
    }

    /// What the run at `rate` showed: whether it met the SLOs.
    pub fn record(&mut self, rate: f64, met: bool) {
        if met {
            self.good = Some(self.good.map_or(rate, |g| g.max(rate)));
        } else {
            self.bad = Some(self.bad.map_or(rate, |b| b.min(rate)));
        }
        self.next = match (self.good, self.bad) {
            (Some(g), Some(b)) if self.bisections_left > 0 && g < b => {
                self.bisections_left -= 1;
                Some((g + b) / 2.0)
            }
            (Some(_), Some(_)) => None,
            (Some(g), None) if self.doublings_left > 0 => {
                self.doublings_left -= 1;
                Some(g * 2.0)
            }
            (None, Some(b)) if self.doublings_left > 0 => {
                self.doublings_left -= 1;
                Some(b / 2.0)
            }
            _ => None,
        };
    }
}

/// A sweep's runs and the capacity they show (`--sweep … --out`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepReport {
    /// One run per rate, by rate.
    pub runs: Vec<BenchReport>,
    /// The knee: `None` without `--slo`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<Capacity>,
}

/// The highest offered rate at which the SLOs held: goodput's knee.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Capacity {
    /// Requests per second (`None`: not even the lowest rate swept met the SLOs).
    pub rate: Option<f64>,
    /// The share of requests that had to meet every SLO (`--slo-attainment`).
    pub attainment: f64,
    /// The SLOs.
    pub slo: Vec<String>,
    /// The first rate above it, and the share that met the SLOs there (`None`: every rate swept
    /// met them: the capacity is higher still).
    pub next: Option<(f64, f64)>,
}

/// The capacity `rows` show: the highest rate whose requests met the SLOs at `attainment` or
/// better, every lower rate swept having met them too (a rate that fails ends the search, so a
/// lucky run above a failing one does not count). `None` without SLOs.
pub fn capacity(rows: &[BenchReport], attainment: f64) -> Option<Capacity> {
    let mut by_rate: Vec<(f64, f64)> = rows
        .iter()
        .filter_map(|r| Some((r.rate?, r.slo_attainment.unwrap_or(0.0))))
        .collect();
    let slo = rows.iter().find(|r| r.goodput.is_some())?.slo.clone();
    by_rate.sort_by(|a, b| a.0.total_cmp(&b.0));
    let first_short = by_rate.iter().position(|(_, a)| *a < attainment);
    let met = &by_rate[..first_short.unwrap_or(by_rate.len())];
    Some(Capacity {
        rate: met.last().map(|(r, _)| *r),
        attainment,
        slo,
        next: first_short.map(|i| by_rate[i]),
    })
}

impl Capacity {
    /// One line for the terminal.
    pub fn words(&self) -> String {
        let slo = self.slo.join(", ");
        let share = self.attainment * 100.0;
        match (self.rate, self.next) {
            (Some(r), Some((n, a))) => format!(
                "capacity: {r:.2} req/s, the highest rate swept at which {share:.0}% of requests met {slo} (at {n:.2} req/s {:.0}% did)",
                a * 100.0
            ),
            (Some(r), None) => format!(
                "capacity: at least {r:.2} req/s: {share:.0}% of requests met {slo} at every rate swept (sweep higher for the knee)"
            ),
            (None, Some((n, a))) => format!(
                "capacity: below {n:.2} req/s, the lowest rate swept ({:.0}% of requests met {slo}, {share:.0}% needed)",
                a * 100.0
            ),
            (None, None) => "capacity: no rate swept".into(),
        }
    }
}

/// One row per swept rate.
pub fn render_sweep(rows: &[BenchReport]) -> String {
    let f = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.2}"));
    let mut out = String::from("| rate req/s | achieved req/s | output tok/s | TTFT p50 | TTFT p99 | TPOT p50 | TPOT p99 | E2E p99 | goodput req/s | met SLOs | failed |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            f(r.rate),
            f(Some(r.request_throughput)),
            f(Some(r.output_token_throughput)),
            f(r.ttft_ms.map(|d| d.median)),
            f(r.ttft_ms.map(|d| d.p99)),
            f(r.tpot_ms.map(|d| d.median)),
            f(r.tpot_ms.map(|d| d.p99)),
            f(r.e2e_ms.map(|d| d.p99)),
            f(r.goodput),
            r.slo_attainment
                .map_or("-".into(), |a| format!("{:.0}%", a * 100.0)),
            r.failed
        );
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::{capacity, gamma, has_choices, linear_percentile, BenchReport, Dist};

    #[test]
    fn a_chunk_counts_for_vllm_when_its_choices_are_not_empty() {
        assert!(has_choices(
            br#"{"id":"c","choices":[{"index":0,"delta":{"role":"assistant"}}]}"#
        ));
        assert!(has_choices(br#"{"choices" : [ {"text":""} ]}"#));
        assert!(!has_choices(
            br#"{"id":"c","choices":[],"usage":{"completion_tokens":3}}"#
        ));
        assert!(!has_choices(br#"{"choices": [ ] }"#));
        assert!(!has_choices(br#"{"type":"message_start"}"#));
    }

    #[test]
    fn gamma_variates_have_their_shapes_mean_and_variance() {
        for k in [0.25, 1.0, 4.0] {
            let mut rng = crate::util::Rng::new(9);
            let n = 40_000;
            let v: Vec<f64> = (0..n).map(|_| gamma(&mut rng, k)).collect();
            let mean = v.iter().sum::<f64>() / n as f64;
            let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
            assert!((mean - k).abs() < 0.05 * k.max(1.0), "k {k}: mean {mean}");
            assert!((var - k).abs() < 0.1 * k.max(1.0), "k {k}: variance {var}");
        }
    }

    #[test]
    fn a_knee_search_doubles_then_bisects() {
        use super::KneeSearch;
        // Met up to 20 req/s: 4, 8, 16 meet, 32 misses; then 24 misses, 20 meets, 22 misses.
        let knee = 20.0;
        let mut k = KneeSearch::new(4.0, 3);
        let mut ran = Vec::new();
        while let Some(r) = k.next() {
            ran.push(r);
            k.record(r, r <= knee);
        }
        assert_eq!(ran, [4.0, 8.0, 16.0, 32.0, 24.0, 20.0, 22.0]);
        // A start that already misses: halves until one meets, then bisects.
        let mut k = KneeSearch::new(8.0, 1);
        let mut ran = Vec::new();
        while let Some(r) = k.next() {
            ran.push(r);
            k.record(r, r <= 3.0);
        }
        assert_eq!(ran, [8.0, 4.0, 2.0, 3.0]);
        // Never missing: stops after its doublings.
        let mut k = KneeSearch::new(1.0, 3);
        let mut n = 0;
        while let Some(r) = k.next() {
            n += 1;
            k.record(r, true);
        }
        assert_eq!(n, 17);
    }

    #[test]
    fn capacity_is_the_last_rate_before_the_first_that_fails() {
        let row = |rate: f64, attained: f64| {
            let mut r = super::summarize(&[], std::time::Duration::from_secs(1), &[]);
            r.rate = Some(rate);
            r.goodput = Some(0.0);
            r.slo = vec!["ttft<=200ms".into()];
            r.slo_attainment = Some(attained);
            r
        };
        let rows: Vec<BenchReport> = vec![
            row(4.0, 0.95),
            row(1.0, 1.0),
            row(8.0, 0.6),
            row(16.0, 0.92),
        ];
        let c = capacity(&rows, 0.9).unwrap();
        // 16 req/s met the SLOs by luck above a failing 8: not counted.
        assert_eq!((c.rate, c.next), (Some(4.0), Some((8.0, 0.6))));
        assert!(c.words().starts_with("capacity: 4.00 req/s, the highest rate swept at which 90% of requests met ttft<=200ms (at 8.00 req/s 60% did)"), "{}", c.words());
        let none = capacity(&[row(1.0, 0.5)], 0.9).unwrap();
        assert_eq!(none.rate, None);
        assert!(none.words().starts_with("capacity: below 1.00 req/s"));
        let mut no_slo = row(1.0, 1.0);
        no_slo.goodput = None;
        assert_eq!(capacity(&[no_slo], 0.9), None);
    }

    #[test]
    fn a_distribution_has_its_population_std() {
        // numpy.std([1, 2, 3, 4]) = sqrt(1.25)
        let d = Dist::of(&mut [4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!((d.mean, d.std), (2.5, 1.118));
        assert_eq!(Dist::of(&mut [5.0]).unwrap().std, 0.0);
        assert!(Dist::of(&mut []).is_none());
    }

    #[test]
    fn percentiles_for_vllm_files_follow_numpy() {
        // numpy.percentile([1, 2, 3, 4], [0, 50, 90, 99, 100]) = 1, 2.5, 3.7, 3.97, 4
        let v = [1.0, 2.0, 3.0, 4.0];
        let got: Vec<f64> = [0.0, 50.0, 90.0, 99.0, 100.0]
            .iter()
            .map(|p| linear_percentile(&v, *p))
            .collect();
        for (g, want) in got.iter().zip([1.0, 2.5, 3.7, 3.97, 4.0]) {
            assert!((g - want).abs() < 1e-9, "{got:?}");
        }
        assert_eq!(linear_percentile(&[], 50.0), 0.0);
        assert_eq!(linear_percentile(&[7.0], 99.0), 7.0);
    }
}
