//! `RequestRecord`: everything measured about one request, produced exactly once. Plain data:
//! labels, timings, counts — no handles to live objects.

use super::trace::TraceContext;
use inferscope_wire::dialect::FinishReason;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::time::Instant;

/// Label used where a dimension does not apply (no route matched, no variant, no model…).
pub const NONE: &str = "-";

/// How a request ended (docs/ARCHITECTURE.md §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Completed normally.
    Ok,
    /// The backend answered 4xx: the request itself was refused (bad prompt, unknown model…).
    ClientError,
    /// Status ≥ 500, an error event inside the stream, or the backend could not be reached.
    BackendError,
    /// The body ended (or broke) without a terminal event.
    Truncated,
    /// A gateway timeout fired.
    Timeout,
    /// The client went away before the response was complete.
    ClientCancelled,
    /// The gateway refused the request (limits, body too large, no route).
    Rejected,
    /// The gateway itself failed.
    GatewayError,
    /// Still running when the shutdown grace period ended: cut by the gateway.
    Shutdown,
    /// The backend answered 429 (and no other backend could take the request).
    RateLimited,
}

impl Outcome {
    /// Every outcome, in the order used for counters.
    pub const ALL: [Outcome; 10] = [
        Outcome::Ok,
        Outcome::ClientError,
        Outcome::BackendError,
        Outcome::Truncated,
        Outcome::Timeout,
        Outcome::ClientCancelled,
        Outcome::Rejected,
        Outcome::GatewayError,
        Outcome::Shutdown,
        Outcome::RateLimited,
    ];

    /// Counts toward an error rate: every outcome but `ok`, `client_cancelled` and `shutdown`
    /// (the client or the operator ended those).
    pub(crate) fn is_error(self) -> bool {
        !matches!(
            self,
            Outcome::Ok | Outcome::ClientCancelled | Outcome::Shutdown
        )
    }

    /// The share of `counts` (indexed by `index`, `requests` in all) that are errors.
    pub fn error_rate(counts: &[u64; Outcome::ALL.len()], requests: u64) -> f64 {
        let bad: u64 = Outcome::ALL
            .iter()
            .filter(|o| o.is_error())
            .map(|o| counts[o.index()])
            .sum();
        if requests == 0 {
            0.0
        } else {
            bad as f64 / requests as f64
        }
    }

    /// Parses a logged label (`as_str`'s inverse).
    pub fn parse(label: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.as_str() == label)
    }

    /// The stable label used in logs, JSON and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::ClientError => "client_error",
            Outcome::BackendError => "backend_error",
            Outcome::Truncated => "truncated",
            Outcome::Timeout => "timeout",
            Outcome::ClientCancelled => "client_cancelled",
            Outcome::Rejected => "rejected",
            Outcome::GatewayError => "gateway_error",
            Outcome::Shutdown => "shutdown",
            Outcome::RateLimited => "rate_limited",
        }
    }

    /// Index into `ALL`.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// Where the token counts came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokensSource {
    /// The backend's `usage` object (or its dialect's final counts).
    Usage,
    /// The sum of the per-event counts the backend reported (TGI token events, token ids).
    Events,
    /// Counted output events (one per event): the backend reported no count.
    Counted,
}

impl TokensSource {
    /// The stable label.
    pub fn as_str(self) -> &'static str {
        match self {
            TokensSource::Usage => "usage",
            TokensSource::Events => "events",
            TokensSource::Counted => "counted",
        }
    }
}

/// How many tokens each output event carried, as far as the record knows: what per-event
/// (inter-token) gaps mean per token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventTokens {
    /// The backend reported every output event's count (token ids, TGI token events,
    /// per-chunk cumulative usage): a gap's tokens are known exactly.
    Exact,
    /// Only the total is known (final usage): tokens per event are the total over the events.
    Derived,
    /// Nothing reported: one token per event is assumed.
    Assumed,
}

impl EventTokens {
    /// The stable label.
    pub fn as_str(self) -> &'static str {
        match self {
            EventTokens::Exact => "exact",
            EventTokens::Derived => "derived",
            EventTokens::Assumed => "assumed",
        }
    }
}

/// One inter-token gap: the time between two successive output events, and how many tokens the
/// later event carried (1 unless the backend reports per-chunk usage), so per-token ITL is
/// `gap / tokens`. Eight bytes: a stream keeps one per output event, and ten thousand streams
/// at once keep them all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ItlSample {
    /// Gap since the previous output event, in microseconds (saturating at ~71 minutes).
    gap_us: u32,
    /// Tokens in the later event.
    pub tokens: u32,
}

impl ItlSample {
    /// A gap (kept to the microsecond) before an event carrying `tokens` tokens.
    pub fn new(gap: Duration, tokens: u32) -> Self {
        Self::from_nanos(u64::try_from(gap.as_nanos()).unwrap_or(u64::MAX), tokens)
    }

    /// A gap of `ns` nanoseconds (kept to the microsecond, as `new`).
    pub fn from_nanos(ns: u64, tokens: u32) -> Self {
        Self {
            gap_us: u32::try_from(ns / 1000).unwrap_or(u32::MAX),
            tokens,
        }
    }

    /// Gap since the previous output event.
    pub fn gap(&self) -> Duration {
        Duration::from_micros(u64::from(self.gap_us))
    }

    /// Gap since the previous output event, in whole microseconds.
    pub fn gap_us(&self) -> u64 {
        u64::from(self.gap_us)
    }
}

/// Gaps a stream keeps one by one, in order (32 KiB); later gaps are counted in a histogram.
pub const MAX_ITL_SAMPLES: usize = 4096;

/// A stream's inter-token gaps, bounded however long it runs: the first `MAX_ITL_SAMPLES` one by
/// one and in order (the access log's `itl_us`), every later one in a histogram of the same 3
/// significant digits `/stats` keeps (about 90 KiB, only for streams that long), so every
/// percentile of the stream's gaps is still the one `/stats` would report for them.
#[derive(Debug, Clone, Default)]
pub struct Gaps {
    samples: Vec<ItlSample>,
    more: Option<Box<hdrhistogram::Histogram<u32>>>,
}

impl Gaps {
    /// Room for `n` gaps one by one before the first reallocation.
    pub fn with_capacity(n: usize) -> Self {
        Self {
            samples: Vec::with_capacity(n.min(MAX_ITL_SAMPLES)),
            more: None,
        }
    }

    /// Adds one gap.
    #[inline]
    pub fn push(&mut self, s: ItlSample) {
        if self.samples.len() < MAX_ITL_SAMPLES {
            self.samples.push(s);
            return;
        }
        self.push_more(s.gap_us());
    }

    #[cold]
    fn push_more(&mut self, us: u64) {
        use crate::util::quantile::{DIGITS, MAX_US};
        if self.more.is_none() {
            self.more = hdrhistogram::Histogram::new_with_bounds(1, MAX_US, DIGITS)
                .ok()
                .map(Box::new);
        }
        if let Some(h) = &mut self.more {
            h.saturating_record(us.min(MAX_US));
        }
    }

    /// The first gaps, one by one, in order.
    pub fn samples(&self) -> &[ItlSample] {
        &self.samples
    }

    /// Gaps counted beyond `samples()`.
    pub fn more(&self) -> u64 {
        self.more.as_ref().map_or(0, |h| h.len())
    }

    /// Number of gaps.
    pub fn len(&self) -> u64 {
        self.samples.len() as u64 + self.more()
    }

    /// No gaps.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Every gap as (µs, how many): the samples one each, then the histogram's buckets (at
    /// their highest equivalent value, as histograms report them).
    pub fn for_each_us(&self, mut f: impl FnMut(u64, u64)) {
        for s in &self.samples {
            f(s.gap_us(), 1);
        }
        if let Some(h) = &self.more {
            for v in h.iter_recorded() {
                f(
                    h.highest_equivalent(v.value_iterated_to()),
                    u64::from(v.count_at_value()),
                );
            }
        }
    }
}

impl From<Vec<ItlSample>> for Gaps {
    fn from(v: Vec<ItlSample>) -> Self {
        let mut g = Gaps::with_capacity(v.len());
        for s in v {
            g.push(s);
        }
        g
    }
}

impl FromIterator<ItlSample> for Gaps {
    fn from_iter<I: IntoIterator<Item = ItlSample>>(it: I) -> Self {
        let mut g = Gaps::default();
        for s in it {
            g.push(s);
        }
        g
    }
}

/// One request's inter-token gaps summarized by the one percentile rule (`stats::quantile`):
/// what `/stats` would report for these gaps alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ItlSummary {
    /// Median gap, µs.
    pub p50_us: u64,
    /// 99th percentile gap, µs.
    pub p99_us: u64,
    /// Largest gap, µs (rounded as the histograms round it).
    pub max_us: u64,
    /// Number of gaps.
    pub count: u64,
}

/// What the request asked for, as far as telemetry reports it.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct RequestParams {
    /// `chat` or `text_completion` (`gen_ai.operation.name`), for known inference endpoints.
    pub operation: Option<&'static str>,
    /// `max_completion_tokens` or `max_tokens`.
    pub max_tokens: Option<u64>,
    /// The request's `temperature`, where it set one.
    pub temperature: Option<f64>,
    /// The request's `top_p`, where it set one.
    pub top_p: Option<f64>,
    /// Input messages in the GenAI conventions' JSON shape, only when content capture is on.
    pub input_content: Option<String>,
}

/// What the response said about itself, beyond timing.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ResponseInfo {
    /// Response id (`chatcmpl-…`).
    pub id: Option<String>,
    /// The model that answered.
    pub model: Option<String>,
    /// Prompt tokens served from the prefix cache.
    pub cached_input_tokens: Option<u64>,
    /// Reasoning tokens.
    pub reasoning_tokens: Option<u64>,
    /// Output text, only when content capture is on (capped).
    pub output_content: Option<String>,
    /// Prefill and decode time the engine itself reported (Ollama, llama.cpp).
    pub engine: Option<inferscope_wire::dialect::EngineTimes>,
}

/// Why a request was sent. Only live traffic is what users felt: the rest has its own groups in
/// `/stats`, its own value in the log and spans, and stays out of the live rollups, rates, served
/// tokens, goodput and experiment comparisons (a shadow copy has its own arm there, `VARIANT:shadow`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Purpose {
    /// Clients' traffic (the default).
    #[default]
    Live,
    /// A copy the gateway sent to an experiment's shadow variant.
    Shadow,
    /// An eval's question (`inferscope eval`).
    Eval,
    /// A benchmark's request (`inferscope bench`).
    Bench,
}

impl Purpose {
    /// Every purpose, in order.
    pub const ALL: [Purpose; 4] = [
        Purpose::Live,
        Purpose::Shadow,
        Purpose::Eval,
        Purpose::Bench,
    ];

    /// The name in the log, `/stats`, labels and the request header.
    pub fn as_str(self) -> &'static str {
        match self {
            Purpose::Live => "live",
            Purpose::Shadow => "shadow",
            Purpose::Eval => "eval",
            Purpose::Bench => "bench",
        }
    }

    /// A purpose a client may declare (`x-inferscope-purpose`): `live`, `eval` or `bench`
    /// (shadow copies are the gateway's own).
    pub fn declared(value: &[u8]) -> Option<Self> {
        [Purpose::Live, Purpose::Eval, Purpose::Bench]
            .into_iter()
            .find(|p| value.eq_ignore_ascii_case(p.as_str().as_bytes()))
    }

    /// Parses a logged name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == name)
    }
}

/// Request header declaring a request's `Purpose` (honoured where `purpose_header: true`).
pub const PURPOSE_HEADER: &str = "x-inferscope-purpose";

/// What is known about a request before its response body flows: who, where, when.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RequestMeta {
    /// Wall-clock time the request head was accepted (for the log's `ts`).
    pub ts: SystemTime,
    /// Monotonic `t0`: the request's arrival — the kernel's receive stamp of its first byte when
    /// `clock` is `Kernel`, else when the gateway's service was called.
    pub t0: Instant,
    /// Where `t0` comes from.
    pub clock: crate::clock::Source,
    /// Kernel arrival → the gateway's service call: how long the request waited for the gateway
    /// (a process waiting for a CPU, a full accept queue). With `clock` `Kernel` only.
    pub accept_delay: Option<Duration>,
    /// The upstream connection's latest kernel receive stamp (`clock::pack`), read by the meter at
    /// each frame.
    pub upstream_rx: Option<Arc<std::sync::atomic::AtomicU64>>,
    /// `x-inferscope-request-id`.
    pub request_id: Arc<str>,
    /// W3C trace id (continued from the client's `traceparent`, or new), as hex.
    pub trace_id: Arc<str>,
    /// Trace and span ids, and the sampling decision.
    pub trace: TraceContext,
    /// Request parameters telemetry reports.
    pub params: RequestParams,
    /// Why the request was sent: live traffic, or a shadow copy, an eval's or a benchmark's.
    pub purpose: Purpose,
    /// The client forced the experiment's variant (`x-inferscope-variant`): not a random draw
    /// from the split, so not in the experiment's comparisons.
    pub variant_forced: bool,
    /// Route name (`-` when none matched).
    pub route: Arc<str>,
    /// Requested model (`-` when the body named none).
    pub model: Arc<str>,
    /// Backend name (`-` before one was chosen).
    pub backend: Arc<str>,
    /// Experiment variant (`-` outside experiments).
    pub variant: Arc<str>,
    /// HTTP method.
    pub method: http::Method,
    /// Client-side protocol version (HTTP/1.1 or HTTP/2).
    pub version: http::Version,
    /// Request path (without query).
    pub path: Arc<str>,
    /// The client's address (the connection's peer), when known.
    pub client: Option<std::net::SocketAddr>,
    /// The client asked for a streamed response, or the response was one (SSE, NDJSON).
    pub stream: bool,
    /// Request body bytes (read bodies exactly; streamed-through ones by `content-length`).
    pub bytes_in: u64,
    /// Monotonic `t_sent`: upstream request handed to the connection.
    pub t_sent: Option<Instant>,
    /// Monotonic `t_hdr`: upstream response head received.
    pub t_hdr: Option<Instant>,
    /// The route's latency objectives, once routed.
    pub slo: Option<crate::Slo>,
    /// What the service inside the layer attaches for its own sinks (the gateway: the backend
    /// that answered, the attempts retried, the client key, the engine's load, the shadow pair,
    /// the backend's engine-span settings). The meter carries it to the record and never reads
    /// it.
    pub extensions: http::Extensions,
}

impl RequestMeta {
    /// A request accepted now, with every label `-` until it is known.
    pub fn new(method: http::Method, path: &str) -> Self {
        let none: Arc<str> = Arc::from(NONE);
        Self {
            ts: SystemTime::now(),
            t0: Instant::now(),
            clock: crate::clock::Source::User,
            accept_delay: None,
            upstream_rx: None,
            request_id: Arc::clone(&none),
            trace_id: Arc::clone(&none),
            trace: TraceContext::default(),
            params: RequestParams::default(),
            purpose: Purpose::Live,
            variant_forced: false,
            route: Arc::clone(&none),
            model: Arc::clone(&none),
            backend: Arc::clone(&none),
            variant: none,
            method,
            version: http::Version::HTTP_11,
            path: Arc::from(path),
            client: None,
            stream: false,
            bytes_in: 0,
            t_sent: None,
            t_hdr: None,
            slo: None,
            extensions: http::Extensions::new(),
        }
    }
}

/// Latency objectives a request is judged by (`RequestRecord::slo_met`): each set one is a
/// ceiling on time to first token, time per output token, every inter-token gap, end to end.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Slo {
    /// Time to first token.
    pub ttft: Option<Duration>,
    /// Time per output token after the first.
    pub tpot: Option<Duration>,
    /// Every gap between output events.
    pub itl: Option<Duration>,
    /// End to end.
    pub e2e: Option<Duration>,
}

/// Everything measured about one request. Durations are `None` when they do not apply.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RequestRecord {
    /// Who, where and when.
    pub meta: RequestMeta,
    /// Status sent to the client.
    pub status: u16,
    /// How it ended.
    pub outcome: Outcome,
    /// `t_tok1 − t0`.
    pub ttft: Option<Duration>,
    /// `t_chunk1 − t0`.
    pub ttfc: Option<Duration>,
    /// `(t_tokN − t_tok1) / (n_out − 1)`, when `n_out > 1`.
    pub tpot: Option<Duration>,
    /// `t_end − t0`.
    pub e2e: Duration,
    /// `t_tok1 − t_sent`.
    pub upstream_ttft: Option<Duration>,
    /// Largest delay between an upstream read's kernel stamp and the hand-off of a frame it
    /// brought to the client connection: a lower bound on how long the gateway held any frame
    /// (the latest read may be later than the one that carried the frame).
    pub forward_lag: Option<Duration>,
    /// The longest a frame carrying one of the timed events (first chunk, first token, last
    /// token, end) waited between being handed to the server and the connection's next write
    /// attempt: the gateway's own lateness after the meter saw the frame (`None`: the server
    /// keeps no write clock, as under an embedding app's own server).
    pub handoff_lag: Option<Duration>,
    /// `(t_sent − t0)` plus time spent observing frames.
    pub overhead: Option<Duration>,
    /// The gaps between output events (bounded: see `Gaps`).
    pub itl: Gaps,
    /// Prompt tokens.
    pub input_tokens: Option<u64>,
    /// Output tokens.
    pub output_tokens: Option<u64>,
    /// Where `output_tokens` came from.
    pub tokens_source: Option<TokensSource>,
    /// What an inter-token gap means per token (streamed responses with output).
    pub event_tokens: Option<EventTokens>,
    /// Why generation stopped.
    pub finish_reason: Option<FinishReason>,
    /// Response body bytes sent to the client.
    pub bytes_out: u64,
    /// Events whose data was not the expected JSON (forwarded untouched all the same).
    pub malformed_events: u32,
    /// A bounded error kind (`upstream_connect`, `body_too_large`…), never a raw message.
    pub error: Option<&'static str>,
    /// Response id, model, token details, captured output.
    pub response: ResponseInfo,
    /// The engine's own span of the request, joined after the record was made (set once, by
    /// the recorder, when the backend sends its spans: `RequestMeta::engine_spans`).
    pub engine_span: std::sync::OnceLock<EngineJoin>,
}

/// The engine's span of one request, as received over OTLP (vLLM's `llm_request`): its parent
/// is the gateway's CLIENT span, its durations the engine's own.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineSpan {
    /// Trace id.
    pub trace_id: u128,
    /// Parent span id: the `traceparent` the gateway sent.
    pub parent: u64,
    /// `gen_ai.request.id` (vLLM: the response id).
    pub request_id: Option<Arc<str>>,
    /// `gen_ai.latency.time_in_queue`: waiting for the scheduler.
    pub queue: Option<Duration>,
    /// `gen_ai.latency.time_in_model_prefill`: scheduled → first token.
    pub prefill: Option<Duration>,
    /// `gen_ai.latency.time_in_model_decode`: first → last token.
    pub decode: Option<Duration>,
    /// `gen_ai.latency.time_to_first_token`: the engine's arrival → first token.
    pub ttft: Option<Duration>,
    /// `gen_ai.latency.e2e`: the engine's arrival → done.
    pub e2e: Option<Duration>,
}

/// What became of a record's wait for its engine's span.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineJoin {
    /// The span arrived.
    Joined {
        /// The span.
        span: EngineSpan,
        /// Its queue time was `starved_factor` × the window's median or more (`None`: too few
        /// requests in the window to judge, or no queue time).
        starved: Option<bool>,
    },
    /// None arrived within `engine_spans.wait`.
    Missing,
}

/// Where a request's time went, from the gateway's measurements and the engine's span. The
/// parts add up to the whole the gateway measured; `rest` is what neither accounts for — the
/// network both ways and the engine's HTTP server, tokenizer and detokenizer — and is negative
/// only when the engine's numbers and the gateway's disagree.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Breakdown {
    /// The gateway's own time: before the upstream send, and holding the frames.
    pub gateway: Duration,
    /// The engine's queue.
    pub queue: Duration,
    /// The engine's prefill.
    pub prefill: Duration,
    /// The engine's decode (zero in the TTFT's breakdown).
    pub decode: Duration,
    /// The remainder, µs (signed).
    pub rest_us: i64,
}

fn rest_us(whole: Duration, parts: &[Duration]) -> i64 {
    // Saturating: parts come from another process (an engine's span), and `Iterator::sum` of
    // Durations panics on overflow — in the access-log writer and the span exporter.
    let sum = parts
        .iter()
        .fold(Duration::ZERO, |a, b| a.saturating_add(*b));
    i64::try_from(whole.as_micros()).unwrap_or(i64::MAX)
        - i64::try_from(sum.as_micros()).unwrap_or(i64::MAX)
}

impl RequestRecord {
    /// A record for a request that ended before any upstream body flowed.
    pub fn without_body(
        meta: RequestMeta,
        status: u16,
        outcome: Outcome,
        error: Option<&'static str>,
        bytes_out: u64,
    ) -> Self {
        let e2e = meta.t0.elapsed();
        let overhead = meta.t_sent.map(|t| t.saturating_duration_since(meta.t0));
        Self {
            meta,
            status,
            outcome,
            ttft: None,
            ttfc: None,
            tpot: None,
            e2e,
            upstream_ttft: None,
            forward_lag: None,
            handoff_lag: None,
            overhead,
            itl: Gaps::default(),
            input_tokens: None,
            output_tokens: None,
            tokens_source: None,
            event_tokens: None,
            finish_reason: None,
            bytes_out,
            malformed_events: 0,
            error,
            response: ResponseInfo::default(),
            engine_span: std::sync::OnceLock::new(),
        }
    }

    /// The engine's span, when one was joined.
    pub fn engine_joined(&self) -> Option<(&EngineSpan, Option<bool>)> {
        match self.engine_span.get()? {
            EngineJoin::Joined { span, starved } => Some((span, *starved)),
            EngineJoin::Missing => None,
        }
    }

    /// The TTFT's parts: the gateway's (before the send, and holding the first token),
    /// the engine's queue and prefill, the rest. With a joined span and a first token only.
    pub fn ttft_breakdown(&self) -> Option<Breakdown> {
        let (span, _) = self.engine_joined()?;
        let (ttft, upstream) = (self.ttft?, self.upstream_ttft?);
        let (queue, prefill) = (span.queue?, span.prefill?);
        let gateway = ttft.saturating_sub(upstream);
        Some(Breakdown {
            gateway,
            queue,
            prefill,
            decode: Duration::ZERO,
            rest_us: rest_us(ttft, &[gateway, queue, prefill]),
        })
    }

    /// The E2E's parts: the gateway's overhead, the engine's queue, prefill and decode, the
    /// rest. With a joined span only.
    pub fn e2e_breakdown(&self) -> Option<Breakdown> {
        let (span, _) = self.engine_joined()?;
        let gateway = self.overhead?;
        let (queue, prefill) = (span.queue?, span.prefill?);
        let decode = span.decode.unwrap_or_default();
        Some(Breakdown {
            gateway,
            queue,
            prefill,
            decode,
            rest_us: rest_us(self.e2e, &[gateway, queue, prefill, decode]),
        })
    }

    /// Wall-clock time of a monotonic instant of this request (for exporters that need it).
    pub fn wall(&self, t: Instant) -> SystemTime {
        self.meta.ts + t.saturating_duration_since(self.meta.t0)
    }

    /// Monotonic end of the request.
    pub fn t_end(&self) -> Instant {
        self.meta.t0 + self.e2e
    }

    /// Whether the request met its route's latency objectives (`None`: the route has none).
    /// Only an `ok` outcome can; a response that showed no token before its end (non-streamed,
    /// or no output) is judged on TTFT by its end; one token has no TPOT to miss.
    pub fn slo_met(&self) -> Option<bool> {
        let slo = self.meta.slo?;
        if self.outcome != Outcome::Ok {
            return Some(false);
        }
        let within = |limit: Option<Duration>, d: Option<Duration>| {
            limit.is_none_or(|l| d.is_none_or(|d| d <= l))
        };
        let itl_ok = slo.itl.is_none_or(|l| {
            let l = crate::util::quantile::duration_us(l);
            let mut ok = true;
            self.itl.for_each_us(|us, _| ok &= us <= l);
            ok
        });
        Some(
            within(slo.ttft, Some(self.ttft.unwrap_or(self.e2e)))
                && within(slo.tpot, self.tpot)
                && within(slo.e2e, Some(self.e2e))
                && itl_ok,
        )
    }

    /// The ITL summary the access log and spans carry (`None` without gaps).
    pub fn itl_summary(&self) -> Option<ItlSummary> {
        use crate::util::quantile;
        if self.itl.more() == 0 {
            let mut v: Vec<u64> = self.itl.samples().iter().map(ItlSample::gap_us).collect();
            v.sort_unstable();
            return Some(ItlSummary {
                p50_us: quantile::of_sorted_us(&v, 0.5)?,
                p99_us: quantile::of_sorted_us(&v, 0.99)?,
                max_us: quantile::of_sorted_us(&v, 1.0)?,
                count: v.len() as u64,
            });
        }
        // A stream past `MAX_ITL_SAMPLES`: one histogram of all its gaps, as /stats keeps them.
        let mut h =
            hdrhistogram::Histogram::<u64>::new_with_bounds(1, quantile::MAX_US, quantile::DIGITS)
                .ok()?;
        self.itl
            .for_each_us(|us, n| h.saturating_record_n(us.min(quantile::MAX_US), n));
        let at = |q: f64| h.highest_equivalent(h.value_at_quantile(q));
        Some(ItlSummary {
            p50_us: at(0.5),
            p99_us: at(0.99),
            max_us: at(1.0),
            count: h.len(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_stay_bounded_and_keep_the_percentiles_of_every_gap() {
        let n = 3 * MAX_ITL_SAMPLES as u64;
        let gap = |i: u64| Duration::from_micros(1000 + (i * 7919) % 5000);
        let g: Gaps = (0..n).map(|i| ItlSample::new(gap(i), 1)).collect();
        assert_eq!(g.samples().len(), MAX_ITL_SAMPLES);
        assert_eq!((g.more(), g.len()), (n - MAX_ITL_SAMPLES as u64, n));
        let mut counted = 0;
        g.for_each_us(|_, c| counted += c);
        assert_eq!(counted, n);
        // The summary is what a 3-digit histogram of every gap reports (as /stats does).
        let mut r = RequestRecord::without_body(
            RequestMeta::new(http::Method::POST, "/"),
            200,
            Outcome::Ok,
            None,
            0,
        );
        r.itl = g;
        let s = r.itl_summary().unwrap_or_else(|| unreachable!());
        let mut all: Vec<u64> = (0..n).map(|i| gap(i).as_micros() as u64).collect();
        all.sort_unstable();
        use crate::util::quantile::of_sorted_us;
        assert_eq!(s.count, n);
        assert_eq!(Some(s.p50_us), of_sorted_us(&all, 0.5));
        assert_eq!(Some(s.p99_us), of_sorted_us(&all, 0.99));
        assert_eq!(Some(s.max_us), of_sorted_us(&all, 1.0));
    }
}
