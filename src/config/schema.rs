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
    /// `header:NAME`: requests with the same value go to the same variant.
    #[serde(default)]
    pub sticky_key: Option<String>,
    /// The variants.
    pub variants: Vec<VariantConfig>,
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
