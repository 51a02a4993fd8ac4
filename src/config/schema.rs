//! The YAML schema. Key names are a contract (DESIGN §4); unknown keys are rejected; every default
//! lives here.

use serde::{Deserialize, Deserializer};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The whole gateway configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Data-plane listen address.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// Admin plane.
    #[serde(default)]
    pub admin: AdminConfig,
    /// JSONL access log.
    #[serde(default)]
    pub access_log: Option<AccessLogConfig>,
    /// Limits and timeouts.
    #[serde(default)]
    pub limits: Limits,
    /// Where `POST /feedback` appends accepted quality signals (JSON lines); absent: kept in memory.
    #[serde(default)]
    pub feedback: Option<FeedbackConfig>,
    /// OpenTelemetry export (traces and metrics over OTLP). Absent: the `OTEL_*` environment
    /// variables decide; with neither, telemetry is off.
    #[serde(default)]
    pub telemetry: Option<TelemetryConfig>,
    /// Inference backends.
    pub backends: Vec<BackendConfig>,
    /// Routes, first match wins.
    pub routes: Vec<RouteConfig>,
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8080))
}

/// Admin listener.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Admin listen address (`/metrics`, `/stats`, `/healthz`, `/readyz`).
    #[serde(default = "default_admin")]
    pub listen: SocketAddr,
}

fn default_admin() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9464))
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            listen: default_admin(),
        }
    }
}

/// Access log settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessLogConfig {
    /// File to append JSON lines to; `-` is standard output.
    pub path: PathBuf,
    /// Records that may wait for the writer before new ones are dropped (and counted).
    #[serde(default = "default_queue")]
    pub queue: usize,
}

fn default_queue() -> usize {
    65_536
}

/// Feedback storage.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeedbackConfig {
    /// JSONL file feedback is appended to (synced before it is acknowledged).
    pub path: PathBuf,
}

/// Limits and timeouts of the data plane.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Largest JSON request body read from a known inference endpoint (413 above it).
    #[serde(default = "default_body")]
    pub max_request_body_bytes: usize,
    /// Requests (including their streaming bodies) in flight at once; more get 503.
    #[serde(default = "default_concurrency")]
    pub max_concurrent_requests: usize,
    /// An HTTP/1 request head must arrive within this.
    #[serde(default = "d30s", deserialize_with = "duration")]
    pub header_read_timeout: Duration,
    /// Connecting to a backend must succeed within this.
    #[serde(default = "d5s", deserialize_with = "duration")]
    pub connect_timeout: Duration,
    /// On SIGTERM/SIGINT, in-flight streams may take this long to finish.
    #[serde(default = "d30s", deserialize_with = "duration")]
    pub shutdown_grace: Duration,
    /// Longest SSE/NDJSON line the scanner keeps (longer ones are forwarded, not measured).
    #[serde(default = "default_line")]
    pub max_event_bytes: usize,
}

fn default_body() -> usize {
    16 << 20
}
fn default_concurrency() -> usize {
    10_000
}
fn default_line() -> usize {
    crate::sse::DEFAULT_MAX_LINE
}
fn d30s() -> Duration {
    Duration::from_secs(30)
}
fn d5s() -> Duration {
    Duration::from_secs(5)
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_request_body_bytes: default_body(),
            max_concurrent_requests: default_concurrency(),
            header_read_timeout: d30s(),
            connect_timeout: d5s(),
            shutdown_grace: d30s(),
            max_event_bytes: default_line(),
        }
    }
}

/// One inference backend: a URL, or a simulator run inside the gateway.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    /// Unique name (a label on every metric).
    pub name: String,
    /// Base URL, `http://host:port` (TLS upstreams arrive with the TLS work).
    #[serde(default)]
    pub url: Option<String>,
    /// Run a simulated backend in-process instead of `url`.
    #[serde(default)]
    pub sim: Option<SimBackend>,
    /// Provider label (`vllm`, `tgi`, `sglang`, `openai`…), for `gen_ai.provider.name`.
    #[serde(default)]
    pub provider: Option<String>,
    /// Environment variable holding an API key sent as `Authorization: Bearer`.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Relative share for the `weighted` balancer.
    #[serde(default = "one_u32")]
    pub weight: u32,
    /// Requests in flight to this backend at once; more wait in a queue (absent: unlimited).
    #[serde(default)]
    pub max_concurrency: Option<usize>,
    /// Requests that may wait for this backend; beyond it: 429 with `Retry-After`.
    #[serde(default = "default_max_queue")]
    pub max_queue: usize,
    /// Longest wait in the queue; beyond it: 503 with `Retry-After`.
    #[serde(default = "d2s", deserialize_with = "duration")]
    pub queue_timeout: Duration,
    /// Active health probe (absent: passive health only).
    #[serde(default)]
    pub probe: Option<ProbeConfig>,
    /// Passive outlier ejection.
    #[serde(default)]
    pub outlier: OutlierConfig,
}

fn one_u32() -> u32 {
    1
}
fn default_max_queue() -> usize {
    128
}
fn d2s() -> Duration {
    Duration::from_secs(2)
}

/// Active health probing of a backend.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeConfig {
    /// Path probed with GET (e.g. `/health` for vLLM, `/v1/models`).
    #[serde(default = "default_probe_path")]
    pub path: String,
    /// Time between probes.
    #[serde(default = "d5s", deserialize_with = "duration")]
    pub interval: Duration,
    /// A probe slower than this fails.
    #[serde(default = "d1s_probe", deserialize_with = "duration")]
    pub timeout: Duration,
    /// Consecutive failures that mark the backend unhealthy.
    #[serde(default = "three")]
    pub unhealthy_threshold: u32,
    /// Consecutive successes that mark it healthy again.
    #[serde(default = "two")]
    pub healthy_threshold: u32,
}

fn default_probe_path() -> String {
    "/health".into()
}
fn d1s_probe() -> Duration {
    Duration::from_secs(1)
}
fn three() -> u32 {
    3
}
fn two() -> u32 {
    2
}

/// Passive outlier ejection: consecutive failures (5xx, connect errors, timeouts) eject the
/// backend for `base_ejection × 2^(ejections so far)`, capped at `max_ejection`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutlierConfig {
    /// Consecutive failures that eject (0 disables ejection).
    #[serde(default = "five")]
    pub consecutive_failures: u32,
    /// First ejection's length.
    #[serde(default = "d10s_outlier", deserialize_with = "duration")]
    pub base_ejection: Duration,
    /// Longest ejection.
    #[serde(default = "d300s", deserialize_with = "duration")]
    pub max_ejection: Duration,
}

fn five() -> u32 {
    5
}
fn d10s_outlier() -> Duration {
    Duration::from_secs(10)
}
fn d300s() -> Duration {
    Duration::from_secs(300)
}

impl Default for OutlierConfig {
    fn default() -> Self {
        Self {
            consecutive_failures: five(),
            base_ejection: d10s_outlier(),
            max_ejection: d300s(),
        }
    }
}

/// An in-process simulated backend.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimBackend {
    /// `fp16`, `int8`, or a profile YAML file.
    pub profile: String,
    /// Seed of the simulator's random choices.
    #[serde(default)]
    pub seed: u64,
}

/// A route: which requests, and where they go.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// Unique name (a label on every metric).
    pub name: String,
    /// What the route accepts.
    #[serde(rename = "match", default)]
    pub matcher: MatchConfig,
    /// A plain pool of backends (round-robin).
    #[serde(default)]
    pub backends: Vec<String>,
    /// Or an experiment splitting traffic between variants.
    #[serde(default)]
    pub experiment: Option<ExperimentConfig>,
    /// How a backend is chosen within a pool.
    #[serde(default)]
    pub balancer: Balancer,
    /// Retries and failover before any response byte reached the client.
    #[serde(default)]
    pub retry: RetryConfig,
    /// Timeouts of the response.
    #[serde(default)]
    pub timeouts: TimeoutsConfig,
}

/// Backend choice within a pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Balancer {
    /// Each backend in turn.
    #[default]
    RoundRobin,
    /// The backend with the fewest requests in flight.
    LeastOutstanding,
    /// In proportion to each backend's `weight`.
    Weighted,
    /// Power of two choices on the TTFT/TPOT this gateway measures (EWMA), penalised by the
    /// requests in flight.
    LatencyAware,
}

/// Retry policy. Retries happen only before any response byte reached the client, only with a
/// replayable request body, and never to a backend already tried.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryConfig {
    /// Extra attempts after the first (0 disables retries).
    #[serde(default = "two")]
    pub attempts: u32,
    /// Upstream statuses that are retried (connect errors and closed connections always are).
    #[serde(default = "default_retry_statuses")]
    pub statuses: Vec<u16>,
    /// Retries may add at most this fraction of extra load over time …
    #[serde(default = "default_budget_ratio")]
    pub budget_ratio: f64,
    /// … but at least this many retries per second are always allowed.
    #[serde(default = "default_min_retries")]
    pub min_per_second: u32,
}

fn default_retry_statuses() -> Vec<u16> {
    vec![502, 503, 504]
}
fn default_budget_ratio() -> f64 {
    0.2
}
fn default_min_retries() -> u32 {
    10
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            attempts: two(),
            statuses: default_retry_statuses(),
            budget_ratio: default_budget_ratio(),
            min_per_second: default_min_retries(),
        }
    }
}

/// Response timeouts (each may be `0s` to disable).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeoutsConfig {
    /// No response head within this: 504. No first output token within this (from the request's
    /// arrival): the stream is ended, outcome `timeout`.
    #[serde(default = "d120s", deserialize_with = "duration")]
    pub first_token: Duration,
    /// No upstream bytes for this long once streaming: the stream is ended, outcome `timeout`.
    #[serde(default = "d60s", deserialize_with = "duration")]
    pub idle: Duration,
    /// The whole request must finish within this (0s: no limit).
    #[serde(default = "d0s", deserialize_with = "duration")]
    pub total: Duration,
}

fn d120s() -> Duration {
    Duration::from_secs(120)
}
fn d60s() -> Duration {
    Duration::from_secs(60)
}
fn d0s() -> Duration {
    Duration::ZERO
}

impl Default for TimeoutsConfig {
    fn default() -> Self {
        Self {
            first_token: d120s(),
            idle: d60s(),
            total: d0s(),
        }
    }
}

/// Route matching; every given condition must hold. An empty match accepts everything.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatchConfig {
    /// The request body's `model`.
    #[serde(default)]
    pub model: Option<String>,
    /// The request path starts with this.
    #[serde(default)]
    pub path_prefix: Option<String>,
}

/// A traffic split between variants.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExperimentConfig {
    /// Experiment name.
    pub name: String,
    /// `header:NAME`, `api_key` (the client's bearer token) or `body:user` (the JSON body's
    /// `user`): requests with the same key go to the same variant. Without a key: random.
    #[serde(default)]
    pub sticky_key: Option<String>,
    /// Honour the `x-inferscope-variant` request header (forcing a variant, e.g. for evals).
    #[serde(default = "yes")]
    pub allow_override: bool,
    /// Fixed horizon: no verdict until every variant has this many samples of a metric.
    #[serde(default = "default_min_samples")]
    pub min_samples: usize,
    /// SLOs that roll a variant back to the control when breached.
    #[serde(default)]
    pub guardrails: Option<GuardrailsConfig>,
    /// Copies of a fraction of the requests sent to a shadow variant (measured, discarded).
    #[serde(default)]
    pub shadow: Option<ShadowConfig>,
    /// The variants.
    pub variants: Vec<VariantConfig>,
}

/// Shadow traffic of an experiment.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShadowConfig {
    /// The variant that receives the copies.
    pub variant: String,
    /// Fraction of the experiment's requests copied (0..=1).
    pub fraction: f64,
    /// Copies in flight at once; beyond it copies are not sent (and counted).
    #[serde(default = "default_shadow_concurrency")]
    pub max_concurrency: usize,
}

fn default_shadow_concurrency() -> usize {
    16
}

/// Guardrails of an experiment.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuardrailsConfig {
    /// Sliding window the rules are evaluated over.
    #[serde(default = "d60s", deserialize_with = "duration")]
    pub window: Duration,
    /// No rule is judged on fewer samples than this in the window.
    #[serde(default = "default_guard_samples")]
    pub min_samples: usize,
    /// The SLOs.
    pub rules: Vec<GuardRule>,
}

fn default_guard_samples() -> usize {
    50
}

/// One SLO: `metric` must stay at most `max` (and/or at least `min`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuardRule {
    /// Variant it applies to (absent: every variant but the control).
    #[serde(default)]
    pub variant: Option<String>,
    /// `ttft_p99_ms`, `tpot_p50_ms`, `e2e_p90_ms` (p50/p90/p95/p99) or `error_rate`.
    pub metric: String,
    /// Upper bound.
    #[serde(default)]
    pub max: Option<f64>,
    /// Lower bound.
    #[serde(default)]
    pub min: Option<f64>,
}

impl GuardRule {
    /// The rule as text, e.g. `int8 ttft_p99_ms <= 500`.
    pub fn describe(&self) -> String {
        let who = self.variant.as_deref().unwrap_or("any");
        match (self.max, self.min) {
            (Some(max), Some(min)) => format!("{who} {min} <= {} <= {max}", self.metric),
            (Some(max), None) => format!("{who} {} <= {max}", self.metric),
            (None, Some(min)) => format!("{who} {} >= {min}", self.metric),
            (None, None) => format!("{who} {}", self.metric),
        }
    }
}

/// One arm of an experiment.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VariantConfig {
    /// Variant name (a label on every metric).
    pub name: String,
    /// Its backend pool.
    pub backends: Vec<String>,
    /// Relative share of traffic.
    pub weight: u32,
    /// The baseline the others are compared against.
    #[serde(default)]
    pub control: bool,
}

/// `telemetry:` — every key optional; unset ones fall back to `OTEL_*` variables, then defaults.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// False turns telemetry off even when `OTEL_EXPORTER_OTLP_ENDPOINT` is set.
    #[serde(default)]
    pub enabled: Option<bool>,
    /// The OTLP receiver.
    #[serde(default)]
    pub otlp: OtlpConfig,
    /// `service.name` (else `OTEL_SERVICE_NAME`, else `inferscope`).
    #[serde(default)]
    pub service_name: Option<String>,
    /// Extra resource attributes (merged over `OTEL_RESOURCE_ATTRIBUTES`).
    #[serde(default)]
    pub resource: std::collections::BTreeMap<String, String>,
    /// Ratio of new traces sampled, 0..=1 (else `OTEL_TRACES_SAMPLER_ARG`, else 1). A client's
    /// `traceparent` decides for its own trace (parent-based).
    #[serde(default)]
    pub sample_ratio: Option<f64>,
    /// Attribute set on spans.
    #[serde(default)]
    pub format: TelemetryFormat,
    /// Record prompts and completions on spans (`gen_ai.input.messages`, `gen_ai.output.messages`).
    #[serde(default)]
    pub capture_content: bool,
    /// Cap on each captured content attribute, in bytes.
    #[serde(default = "default_content_cap")]
    pub max_content_bytes: usize,
    /// Batching of span export.
    #[serde(default)]
    pub batch: BatchConfig,
    /// How often metrics are exported.
    #[serde(default = "d10s", deserialize_with = "duration")]
    pub metrics_interval: Duration,
    /// Export metrics too (off for trace-only receivers such as Jaeger and Langfuse).
    #[serde(default = "yes")]
    pub export_metrics: bool,
}

fn yes() -> bool {
    true
}

fn default_min_samples() -> usize {
    200
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            enabled: None,
            otlp: OtlpConfig::default(),
            service_name: None,
            resource: std::collections::BTreeMap::new(),
            sample_ratio: None,
            format: TelemetryFormat::default(),
            capture_content: false,
            max_content_bytes: default_content_cap(),
            batch: BatchConfig::default(),
            metrics_interval: d10s(),
            export_metrics: true,
        }
    }
}

fn default_content_cap() -> usize {
    16 * 1024
}
fn d10s() -> Duration {
    Duration::from_secs(10)
}

/// OTLP receiver settings.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OtlpConfig {
    /// Base endpoint, e.g. `http://127.0.0.1:4317` (gRPC) or `http://127.0.0.1:4318` (HTTP).
    #[serde(default)]
    pub endpoint: Option<String>,
    /// `grpc` or `http/protobuf`.
    #[serde(default)]
    pub protocol: Option<String>,
    /// Headers sent with every export (authentication for hosted receivers).
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    /// Export timeout.
    #[serde(default, deserialize_with = "opt_duration")]
    pub timeout: Option<Duration>,
}

/// Which attribute conventions spans follow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum TelemetryFormat {
    /// OpenTelemetry GenAI semantic conventions.
    #[default]
    #[serde(rename = "genai")]
    GenAi,
    /// OpenInference (Arize Phoenix), in addition to the `inferscope.*` attributes.
    #[serde(rename = "openinference")]
    OpenInference,
}

/// Span batching.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchConfig {
    /// Finished requests waiting for export; beyond it they are dropped (and counted).
    #[serde(default = "default_queue_spans")]
    pub max_queue: usize,
    /// Requests per export call.
    #[serde(default = "default_batch")]
    pub max_batch: usize,
    /// Longest wait before a partial batch is exported.
    #[serde(default = "d1s", deserialize_with = "duration")]
    pub interval: Duration,
}

fn default_queue_spans() -> usize {
    8192
}
fn default_batch() -> usize {
    512
}
fn d1s() -> Duration {
    Duration::from_secs(1)
}

impl Default for BatchConfig {
    fn default() -> Self {
        Self {
            max_queue: default_queue_spans(),
            max_batch: default_batch(),
            interval: d1s(),
        }
    }
}

fn opt_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    duration(d).map(Some)
}

/// Parses `250ms`, `5s`, `2m`, `1h` (whole or decimal numbers).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("`{s}` needs a unit (ms, s, m, h)"))?;
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("`{s}`: unknown unit `{unit}` (use ms, s, m, h)")),
    };
    Duration::try_from_secs_f64(secs).map_err(|_| format!("`{s}` is out of range"))
}

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    parse_duration(&s).map_err(serde::de::Error::custom)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("5 parsecs").is_err());
    }
}
