//! The YAML schema. Key names are a contract (docs/ARCHITECTURE.md §4, pinned by
//! tests/contracts.rs); unknown keys are rejected; every default lives here, in the `Default` impls
//! (structs whose keys are all optional take `#[serde(default)]` as a whole). Durations are
//! humantime strings: `250ms`, `1.5s`, `2m`, `1h`, `1m 30s`.

use schemars::JsonSchema;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The data plane's address when the config names none (`listen:`).
pub const DEFAULT_LISTEN: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::LOCALHOST,
    8080,
));

/// The admin plane's address when the config names none (`admin.listen:`).
pub const DEFAULT_ADMIN_LISTEN: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::LOCALHOST,
    9464,
));

/// An experiment's fixed horizon when it names none (`min_samples:`), and `report`'s.
pub const DEFAULT_MIN_SAMPLES: usize = 200;
/// The most of a variant's requests one client weighs in a comparison, by default.
pub const DEFAULT_MAX_CLIENT_SHARE: f64 = 0.2;

/// The whole gateway configuration.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Data-plane listen address.
    #[serde(default = "defaults::listen")]
    pub listen: SocketAddr,
    /// Terminate TLS on the data plane (absent: plain HTTP).
    #[serde(default)]
    pub tls: Option<ServerTlsConfig>,
    /// Client API keys on the data plane (absent: no authentication).
    #[serde(default)]
    pub auth: Option<AuthConfig>,
    /// Request and token rate limits (absent: none).
    #[serde(default)]
    pub rate_limits: Option<RateLimitsConfig>,
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
    /// A directory for what must survive a restart: the eval results posted to
    /// `POST /experiments/quality` (`quality.jsonl`), and the variants rolled back (guardrails,
    /// `on_reject: fallback`), put back and promoted (`on_accept: promote`) (`rollbacks.jsonl`),
    /// and each change of a variant's verdict decision with its checks (`verdicts.jsonl`); each
    /// synced before it is acknowledged, read back at start. Absent: kept in memory, and a
    /// restart forgets them.
    #[serde(default)]
    pub state_dir: Option<PathBuf>,
    /// OpenTelemetry export (traces and metrics over OTLP). Absent: the `OTEL_*` environment
    /// variables decide; with neither, telemetry is off.
    #[serde(default)]
    pub telemetry: Option<TelemetryConfig>,
    /// Inference backends.
    pub backends: Vec<BackendConfig>,
    /// Routes, first match wins.
    pub routes: Vec<RouteConfig>,
}

/// Defaults of keys in structs that also have required keys (so cannot default as a whole).
mod defaults {
    pub(super) fn auth_failures_per_minute() -> u32 {
        30
    }
    use std::net::SocketAddr;
    use std::time::Duration;

    pub(super) fn bytes_per_param() -> f64 {
        2.0
    }

    pub(super) fn listen() -> SocketAddr {
        super::DEFAULT_LISTEN
    }
    pub(super) fn log_queue() -> usize {
        65_536
    }
    pub(super) fn rotate_keep() -> usize {
        5
    }
    pub(super) fn weight() -> u32 {
        1
    }
    pub(super) fn max_queue() -> usize {
        128
    }
    pub(super) fn api_key_header() -> String {
        "authorization".into()
    }
    pub(super) fn queue_timeout() -> Duration {
        Duration::from_secs(2)
    }
    pub(super) fn idle_timeout() -> Duration {
        Duration::from_secs(4)
    }
    pub(super) fn min_samples() -> usize {
        super::DEFAULT_MIN_SAMPLES
    }
    pub(super) fn max_client_share() -> f64 {
        super::DEFAULT_MAX_CLIENT_SHARE
    }
    pub(super) fn shadow_concurrency() -> usize {
        16
    }
    pub(super) fn guard_window() -> Duration {
        Duration::from_secs(60)
    }
    pub(super) fn guard_samples() -> usize {
        50
    }
    pub(super) fn promote_steps() -> Vec<u32> {
        vec![25, 50, 100]
    }
    pub(super) fn promote_hold() -> Duration {
        Duration::from_secs(600)
    }
}

impl GuardrailsConfig {
    /// No rule: what an experiment whose only rollback is its verdict's (`on_reject:
    /// fallback`) holds.
    pub fn without_rules() -> Self {
        Self {
            window: defaults::guard_window(),
            min_samples: defaults::guard_samples(),
            rules: Vec::new(),
        }
    }
}

/// Admin listener.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Admin listen address (`/metrics`, `/stats`, `/healthz`, `/readyz`).
    pub listen: SocketAddr,
    /// Environment variable holding the admin bearer token: every endpoint but `/healthz` and
    /// `/readyz` then requires `Authorization: Bearer <token>`.
    pub token_env: Option<String>,
    /// Serve a non-loopback admin address without a token (refused otherwise).
    pub allow_unauthenticated: bool,
    /// Terminate TLS on the admin listener; with a required client certificate (mTLS) it counts
    /// as authentication for a non-loopback address.
    pub tls: Option<ServerTlsConfig>,
    /// Extra `Host` names the browser-facing admin pages answer to (besides the listen address,
    /// `localhost` and loopback addresses): the names a proxy in front of it uses.
    pub allowed_hosts: Vec<String>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            listen: DEFAULT_ADMIN_LISTEN,
            token_env: None,
            allow_unauthenticated: false,
            tls: None,
            allowed_hosts: Vec::new(),
        }
    }
}

/// Client authentication on the data plane.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// The keys accepted, as `Authorization: Bearer KEY` (OpenAI SDKs) or `x-api-key: KEY`
    /// (Anthropic SDKs).
    pub keys: Vec<ApiKeyConfig>,
    /// Send the client's own `Authorization` / `x-api-key` on to the backend (default: removed,
    /// so a gateway key never reaches a backend; a backend `api_key_env` replaces it either way).
    #[serde(default)]
    pub forward_client_key: bool,
    /// Failed key checks one client address may make per minute; past them its requests get
    /// 429 `auth_throttled` without a key check until the minute is over (0: no limit).
    #[serde(default = "defaults::auth_failures_per_minute")]
    pub max_failures_per_minute: u32,
}

/// One client key: a name (what stats, log and spans show) and where its secret comes from —
/// exactly one of `sha256`, `key_env`, `key_file`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyConfig {
    /// Name shown instead of the key.
    pub name: String,
    /// Lower-case hex SHA-256 of the key (`printf %s "$KEY" | sha256sum`).
    #[serde(default)]
    pub sha256: Option<String>,
    /// Environment variable holding the key.
    #[serde(default)]
    pub key_env: Option<String>,
    /// File holding the key (surrounding whitespace ignored).
    #[serde(default)]
    pub key_file: Option<PathBuf>,
}

/// Rate limits: per key (each key its own bucket) and per route (shared by its clients).
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RateLimitsConfig {
    /// Applied to every authenticated key separately (needs `auth`).
    #[serde(default)]
    pub per_key: Option<RateLimit>,
    /// Per key name: replaces `per_key` for that key.
    #[serde(default)]
    pub keys: std::collections::BTreeMap<String, RateLimit>,
    /// Per route name: one bucket per route, shared by everyone.
    #[serde(default)]
    pub routes: std::collections::BTreeMap<String, RateLimit>,
}

/// A limit: requests per minute and tokens (prompt + output) per minute; either may be absent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// Requests per minute (bursts up to this many).
    #[serde(default)]
    pub requests_per_minute: Option<u64>,
    /// Tokens per minute, charged from each response's measured usage once it ends.
    #[serde(default)]
    pub tokens_per_minute: Option<u64>,
}

/// Access log settings.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AccessLogConfig {
    /// File to append JSON lines to; `-` is standard output.
    pub path: PathBuf,
    /// Records that may wait for the writer before new ones are dropped (and counted).
    #[serde(default = "defaults::log_queue")]
    pub queue: usize,
    /// Rotate the file by size and age (absent: never; SIGUSR1 reopens it either way).
    #[serde(default)]
    pub rotate: Option<RotateConfig>,
}

/// Access-log rotation: the file is renamed to `PATH.1` (older ones shift, `keep` are kept)
/// before a write would pass `max_bytes`, or once it is `max_age` old.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RotateConfig {
    /// Largest file, bytes.
    #[serde(default)]
    pub max_bytes: Option<u64>,
    /// Oldest file (e.g. `1h`, `1d`).
    #[serde(default, with = "super::duration::option")]
    #[schemars(with = "Option<super::duration::Text>")]
    pub max_age: Option<Duration>,
    /// Rotated files kept.
    #[serde(default = "defaults::rotate_keep")]
    pub keep: usize,
}

/// Feedback storage.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FeedbackConfig {
    /// JSONL file feedback is appended to (synced before it is acknowledged).
    pub path: PathBuf,
}

/// Limits and timeouts of the data plane.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Largest JSON request body read from a known inference endpoint (413 above it).
    pub max_request_body_bytes: usize,
    /// Requests (including their streaming bodies) in flight at once; more get 503.
    pub max_concurrent_requests: usize,
    /// An HTTP/1 request head must arrive within this.
    #[serde(with = "super::duration")]
    #[schemars(with = "super::duration::Text")]
    pub header_read_timeout: Duration,
    /// Connecting to a backend must succeed within this.
    #[serde(with = "super::duration")]
    #[schemars(with = "super::duration::Text")]
    pub connect_timeout: Duration,
    /// On SIGTERM/SIGINT, in-flight streams may take this long to finish.
    #[serde(with = "super::duration")]
    #[schemars(with = "super::duration::Text")]
    pub shutdown_grace: Duration,
    /// Longest SSE/NDJSON line the scanner keeps (longer ones are forwarded, not measured).
    pub max_event_bytes: usize,
    /// Client connections open at once (data plane); at the cap new ones wait in the backlog.
    pub max_connections: usize,
    /// Connections the kernel completes and holds until the gateway accepts them (the listen
    /// backlog of the data and admin listeners; the kernel caps it at `net.core.somaxconn`).
    /// Past it a new connection's SYN is dropped and its client waits a second to retry.
    pub listen_backlog: u32,
    /// A client connection with no request open is closed after this long without a byte.
    #[serde(with = "super::duration")]
    #[schemars(with = "super::duration::Text")]
    pub client_idle_timeout: Duration,
    /// Most header fields in a request head (431 beyond it).
    pub max_header_count: usize,
    /// Largest request head in bytes (431 beyond it; h2: the header list size).
    pub max_header_bytes: usize,
    /// Concurrent HTTP/2 streams per client connection.
    pub h2_max_streams: u32,
    /// Longest silence while reading a request body that the gateway reads (408 beyond it).
    #[serde(with = "super::duration")]
    #[schemars(with = "super::duration::Text")]
    pub body_read_timeout: Duration,
    /// Slowest average rate a request body may arrive at, after its first 5 s (408 below it;
    /// 0 turns the check off).
    pub body_min_bytes_per_sec: u64,
    /// Request bodies held in memory at once across all requests; beyond it new inference
    /// requests get 503 with `Retry-After`.
    pub max_buffered_body_bytes: usize,
    /// Fraction of `max_concurrent_requests` (and of `max_connections`) taken from which the
    /// gateway is under pressure: a client address (or key) holding its fair share — the slots
    /// divided by the clients holding any — gets 503 `client_share` (a new connection from it is
    /// closed), and request bodies must keep 8× `body_min_bytes_per_sec` after 1 s. A lone
    /// client's share is every slot. 1 turns it off.
    pub overload_at: f64,
    /// Longest model name kept for stats, labels and logs (longer ones are cut, marked `…`).
    pub max_model_name_bytes: usize,
    /// Time requests from the kernel's receive stamp of their first byte (Linux), not from when
    /// the gateway got to them, and read upstream sockets with stamps (forward lag, upstream
    /// TTFT without the gateway's wait); off: the gateway's own clock.
    pub kernel_clock: bool,
    /// The heartbeat's lateness (a frame handed on after its read's kernel stamp, or the timer
    /// waking after its deadline) above which the gateway warns that its numbers are suspect (it
    /// waits for a CPU).
    #[serde(with = "super::duration")]
    #[schemars(with = "super::duration::Text")]
    pub lateness_warning: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_request_body_bytes: 16 << 20,
            max_concurrent_requests: 10_000,
            header_read_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            shutdown_grace: Duration::from_secs(30),
            max_event_bytes: crate::sse::DEFAULT_MAX_LINE,
            max_connections: 10_000,
            // `server::DEFAULT_BACKLOG`, the simulators' (config sits below `server`).
            listen_backlog: 4096,
            client_idle_timeout: Duration::from_secs(60),
            max_header_count: 100,
            max_header_bytes: 64 << 10,
            h2_max_streams: 256,
            body_read_timeout: Duration::from_secs(30),
            body_min_bytes_per_sec: 1024,
            max_buffered_body_bytes: 1 << 30,
            overload_at: 0.75,
            max_model_name_bytes: 256,
            kernel_clock: true,
            lateness_warning: Duration::from_millis(50),
        }
    }
}

/// One inference backend: a URL, or a simulator run inside the gateway.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    /// Unique name (a label on every metric).
    pub name: String,
    /// Base URL: `http://host:port` or `https://host[:port]`, optionally with the API root path
    /// of an OpenAI-compatible service (`https://api.example.com/v1`,
    /// `https://openrouter.ai/api/v1`): that path stands for the gateway's `/v1`.
    #[serde(default)]
    pub url: Option<String>,
    /// TLS settings for an `https://` URL (absent: verified against the bundled Mozilla roots).
    #[serde(default)]
    pub tls: Option<ClientTlsConfig>,
    /// Speak HTTP/2 to it: with prior knowledge over `http://` (h2c: the backend must accept
    /// HTTP/2 without an upgrade), offered by ALPN over `https://` (HTTP/1.1 when the backend
    /// picks it). Requests share multiplexed connections; WebSocket upgrades stay on HTTP/1.1.
    #[serde(default)]
    pub http2: bool,
    /// How long an idle HTTP/1.1 connection to it stays pooled for the next request. Below the
    /// backend's own keep-alive timeout, so the backend never closes a connection just as the
    /// gateway sends on it (a request lost to that race fails: it cannot be known whether the
    /// backend read it). The default, 4 s, is under uvicorn's 5 s (vLLM, SGLang, llama.cpp's
    /// server are 5 s too); raise it for backends that keep connections longer (hosted APIs over
    /// TLS, where a new connection costs a handshake). A shorter `Keep-Alive: timeout=N` from
    /// the backend wins. `0s`: no connection is reused.
    #[serde(default = "defaults::idle_timeout", with = "super::duration")]
    #[schemars(with = "super::duration::Text")]
    pub idle_timeout: Duration,
    /// Run a simulated backend in-process instead of `url`.
    #[serde(default)]
    pub sim: Option<SimBackend>,
    /// Provider label (`vllm`, `tgi`, `sglang`, `openai`…), for `gen_ai.provider.name`.
    #[serde(default)]
    pub provider: Option<String>,
    /// Environment variable holding an API key sent upstream (replacing the client's).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Header the key goes in: `authorization` (as `Bearer KEY`, OpenAI-style; the default) or
    /// another, sent as the bare key (`x-api-key` for Anthropic).
    #[serde(default = "defaults::api_key_header")]
    pub api_key_header: String,
    /// Relative share for the `weighted` balancer.
    #[serde(default = "defaults::weight")]
    pub weight: u32,
    /// Requests in flight to this backend at once; more wait in a queue (absent: unlimited).
    #[serde(default)]
    pub max_concurrency: Option<usize>,
    /// Requests that may wait for this backend; beyond it: 429 with `Retry-After`.
    #[serde(default = "defaults::max_queue")]
    pub max_queue: usize,
    /// Longest wait in the queue; beyond it: 503 with `Retry-After`.
    #[serde(default = "defaults::queue_timeout", with = "super::duration")]
    #[schemars(with = "super::duration::Text")]
    pub queue_timeout: Duration,
    /// Active health probe (absent: passive health only).
    #[serde(default)]
    pub probe: Option<ProbeConfig>,
    /// Passive outlier ejection.
    #[serde(default)]
    pub outlier: OutlierConfig,
    /// Scrape the backend's own metrics (engine queue, KV cache, GPUs) and join them to requests.
    #[serde(default)]
    pub metrics: Option<MetricsConfig>,
    /// Receive the engine's own span of each request over OTLP (vLLM `--otlp-traces-endpoint`
    /// pointed at the admin listener) and join it to the request's record: engine queue,
    /// prefill and decode time per request, and requests starved in the engine's queue.
    #[serde(default)]
    pub engine_spans: Option<EngineSpansConfig>,
    /// The model it serves, for its roofline (with `gpu`).
    #[serde(default)]
    pub model: Option<ModelSpec>,
    /// Its GPUs, for its roofline (with `model`).
    #[serde(default)]
    pub gpu: Option<GpuSpec>,
    /// What its output costs, for the experiment verdict's money per million tokens.
    #[serde(default)]
    pub price: Option<PriceConfig>,
}

/// `price:` of a backend — one of the two, in `currency`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PriceConfig {
    /// A hosted API's list price per million output tokens.
    pub per_million_output_tokens: Option<f64>,
    /// What one of its GPUs costs per hour (times `gpu.count`): the cost per million tokens is
    /// then what the tokens it served cost at the load it saw (idle time included).
    pub per_gpu_hour: Option<f64>,
    /// The currency of the price, as the cost line names it (ISO 4217: `USD`, `EUR`; absent:
    /// `USD`, as list prices are quoted).
    #[serde(default)]
    pub currency: Option<String>,
}

impl PriceConfig {
    /// The currency, `USD` where none is given.
    pub fn currency(&self) -> &str {
        self.currency.as_deref().unwrap_or("USD")
    }
}

/// The GPU presets `gpu.preset` knows (their numbers: `route::roofline::PRESETS`).
pub const GPU_PRESETS: [&str; 5] = ["a100", "h100", "h200", "l4", "l40s"];

/// The model a backend serves, as its roofline needs it.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// Parameters, in billions.
    pub params_b: f64,
    /// Bytes per parameter as served: 2 for FP16/BF16, 1 for INT8/FP8, 0.5 for INT4.
    #[serde(default = "defaults::bytes_per_param")]
    pub bytes_per_param: f64,
    /// KV-cache bytes per token (2 × layers × KV heads × head size × bytes); absent: the KV
    /// traffic is left out of the decode bytes (a lower bound).
    #[serde(default)]
    pub kv_bytes_per_token: Option<f64>,
}

/// A backend's GPUs: a preset (`a100`, `h100`, `h200`, `l4`, `l40s`) and/or numbers, which win.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct GpuSpec {
    /// One of the presets.
    pub preset: Option<String>,
    /// HBM bandwidth of one GPU, GB/s.
    pub hbm_gb_s: Option<f64>,
    /// Dense FP16/BF16 tensor throughput of one GPU, TFLOP/s.
    pub tflops: Option<f64>,
    /// GPUs serving the model (tensor parallel); absent or 0: one.
    pub count: u32,
}

/// `engine_spans:` of a backend: how long a record waits for its engine's span, and when a
/// request counts as starved in the engine's queue.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct EngineSpansConfig {
    /// How long a finished request's access-log line and span wait for the engine's span (vLLM
    /// exports in batches every 5 s); past it they are written without (`engine_span:
    /// missing`). Statistics other than the engine's parts never wait.
    #[serde(with = "super::duration")]
    #[schemars(with = "super::duration::Text")]
    pub wait: Duration,
    /// A request is starved when its engine queue time exceeds this many times the median
    /// queue time of the backend's requests joined within `starved_window` before it…
    pub starved_factor: f64,
    /// …over this window…
    #[serde(with = "super::duration")]
    #[schemars(with = "super::duration::Text")]
    pub starved_window: Duration,
    /// …and is at least this long (an idle engine's microsecond queues starve nobody).
    #[serde(with = "super::duration")]
    #[schemars(with = "super::duration::Text")]
    pub starved_min: Duration,
}

impl Default for EngineSpansConfig {
    fn default() -> Self {
        Self {
            wait: Duration::from_secs(10),
            starved_factor: 4.0,
            starved_window: Duration::from_secs(60),
            starved_min: Duration::from_millis(100),
        }
    }
}

/// Scraping a backend's Prometheus endpoints: its engine's (vLLM, SGLang, TGI, llama.cpp) and
/// its GPUs' exporter (NVIDIA DCGM exporter, nvidia_gpu_exporter).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// The engine's endpoint: a path under the backend's URL (`/metrics`), an absolute URL, or
    /// null for none.
    pub url: Option<String>,
    /// The GPU exporter's endpoint (absent: none), e.g. `http://gpu-host:9400/metrics`; or
    /// `nvml`: this host's GPUs, read directly (builds with the `nvml` feature).
    pub gpu_url: Option<super::forms::GpuSource>,
    /// Time between scrapes.
    #[serde(with = "super::duration")]
    #[schemars(with = "super::duration::Text")]
    pub interval: Duration,
    /// A scrape slower than this fails.
    #[serde(with = "super::duration")]
    #[schemars(with = "super::duration::Text")]
    pub timeout: Duration,
    /// Values older than this are not used (by requests' records and the balancer); absent:
    /// three intervals.
    #[serde(with = "super::duration::option")]
    #[schemars(with = "Option<super::duration::Text>")]
    pub stale_after: Option<Duration>,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            url: Some("/metrics".into()),
            gpu_url: None,
            interval: Duration::from_secs(5),
            timeout: Duration::from_secs(2),
            stale_after: None,
        }
    }
}

impl MetricsConfig {
    /// How old a scrape may be and still be used.
    pub fn stale_after(&self) -> Duration {
        self.stale_after.unwrap_or(self.interval * 3)
    }
}

/// Which built-in roots verify an upstream's certificate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RootsConfig {
    /// Mozilla's roots, bundled in the binary.
    #[default]
    Webpki,
    /// The host's certificate store.
    Native,
    /// None: only `ca_file`.
    None,
}

/// TLS towards an upstream (a backend, an OTLP collector).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClientTlsConfig {
    /// Built-in roots trusted.
    #[serde(default)]
    pub roots: RootsConfig,
    /// PEM CA bundle trusted as well (a private CA).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate chain (for upstreams that require one).
    #[serde(default)]
    pub cert: Option<PathBuf>,
    /// Its PEM private key.
    #[serde(default)]
    pub key: Option<PathBuf>,
    /// Name sent in SNI and verified against the certificate instead of the URL's host.
    #[serde(default)]
    pub server_name: Option<String>,
}

impl ClientTlsConfig {
    /// The files as the TLS layer takes them.
    pub fn files(&self) -> crate::tls::ClientFiles {
        crate::tls::ClientFiles {
            roots: match self.roots {
                RootsConfig::Webpki => crate::tls::Roots::Webpki,
                RootsConfig::Native => crate::tls::Roots::Native,
                RootsConfig::None => crate::tls::Roots::None,
            },
            ca_file: self.ca_file.clone(),
            cert: self.cert.clone(),
            key: self.key.clone(),
            server_name: self.server_name.clone(),
        }
    }
}

/// TLS termination on a listener.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServerTlsConfig {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
    /// PEM CA bundle that client certificates must chain to (mTLS).
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
    /// With `client_ca`: `required` (default) refuses clients without a certificate; `optional`
    /// verifies one only when presented.
    #[serde(default)]
    pub client_auth: ClientAuth,
}

/// Whether a client certificate is required.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuth {
    /// No certificate, no connection.
    #[default]
    Required,
    /// Verified when presented.
    Optional,
}

impl ServerTlsConfig {
    /// The files as the TLS layer takes them.
    pub fn files(&self) -> crate::tls::ServerFiles {
        crate::tls::ServerFiles {
            cert: self.cert.clone(),
            key: self.key.clone(),
            client_ca: self.client_ca.clone(),
            client_cert_required: self.client_auth == ClientAuth::Required,
        }
    }
}

/// Active health probing of a backend.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ProbeConfig {
    /// Path probed with GET (e.g. `/health` for vLLM, `/v1/models`).
    pub path: String,
    /// Time between probes.
    #[serde(with = "super::duration")]
    #[schemars(with = "super::duration::Text")]
    pub interval: Duration,
    /// A probe slower than this fails.
    #[serde(with = "super::duration")]
    #[schemars(with = "super::duration::Text")]
    pub timeout: Duration,
    /// Consecutive failures that mark the backend unhealthy.
    pub unhealthy_threshold: u32,
    /// Consecutive successes that mark it healthy again.
    pub healthy_threshold: u32,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        Self {
            path: "/health".into(),
            interval: Duration::from_secs(5),
            timeout: Duration::from_secs(1),
            unhealthy_threshold: 3,
            healthy_threshold: 2,
        }
    }
}

/// Passive outlier ejection: consecutive failures (5xx, connect errors, timeouts) eject the
/// backend for `base_ejection × 2^(ejections so far)`, capped at `max_ejection`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct OutlierConfig {
    /// Consecutive failures that eject (0 disables ejection).
    pub consecutive_failures: u32,
    /// First ejection's length.
    #[serde(with = "super::duration")]
    #[schemars(with = "super::duration::Text")]
    pub base_ejection: Duration,
    /// Longest ejection.
    #[serde(with = "super::duration")]
    #[schemars(with = "super::duration::Text")]
    pub max_ejection: Duration,
}

impl Default for OutlierConfig {
    fn default() -> Self {
        Self {
            consecutive_failures: 5,
            base_ejection: Duration::from_secs(10),
            max_ejection: Duration::from_secs(300),
        }
    }
}

/// An in-process simulated backend.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SimBackend {
    /// `fp16`, `int8`, or a profile YAML file.
    pub profile: String,
    /// Seed of the simulator's random choices.
    #[serde(default)]
    pub seed: u64,
}

/// A route: which requests, and where they go.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
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
    /// Latency objectives: a request meets them when it succeeded and every one set held
    /// (goodput).
    #[serde(default)]
    pub slo: Option<SloConfig>,
    /// Honour the `x-inferscope-purpose` request header (`live`, `eval`, `bench`: the gateway's
    /// own tools send it). Off by default: a client could move its traffic out of the live
    /// statistics. Without it every client request is live.
    #[serde(default)]
    pub purpose_header: bool,
}

/// A route's latency objectives (each optional, at least one set). A request meets them when
/// its outcome is `ok` and each set objective held: TTFT (a response that showed no token before
/// its end, such as a non-streamed one, is judged by its end), TPOT (none with one token), every
/// inter-token gap, end to end.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SloConfig {
    /// Time to first token.
    #[serde(default, with = "super::duration::option")]
    #[schemars(with = "Option<super::duration::Text>")]
    pub ttft: Option<Duration>,
    /// Time per output token after the first.
    #[serde(default, with = "super::duration::option")]
    #[schemars(with = "Option<super::duration::Text>")]
    pub tpot: Option<Duration>,
    /// Every gap between output events.
    #[serde(default, with = "super::duration::option")]
    #[schemars(with = "Option<super::duration::Text>")]
    pub itl: Option<Duration>,
    /// End to end.
    #[serde(default, with = "super::duration::option")]
    #[schemars(with = "Option<super::duration::Text>")]
    pub e2e: Option<Duration>,
}

impl From<SloConfig> for crate::meter::Slo {
    fn from(c: SloConfig) -> Self {
        let mut slo = Self::default();
        slo.ttft = c.ttft;
        slo.tpot = c.tpot;
        slo.itl = c.itl;
        slo.e2e = c.e2e;
        slo
    }
}

/// Backend choice within a pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
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
    /// Power of two choices on what the backends' engines report (`metrics:`): the shorter
    /// queue (waiting requests plus those sent since the scrape), then the emptier KV cache,
    /// then the smaller batch. A candidate without a fresh scrape makes the choice
    /// `latency_aware`'s.
    LeastQueue,
}

/// Retry policy. Retries happen only before any response byte reached the client, only with a
/// replayable request body, and never to a backend already tried.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// Extra attempts after the first (0 disables retries).
    pub attempts: u32,
    /// Upstream statuses that are retried (connect errors and closed connections always are).
    pub statuses: Vec<u16>,
    /// Retries may add at most this fraction of extra load over time …
    pub budget_ratio: f64,
    /// … but at least this many retries per second are always allowed.
    pub min_per_second: u32,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            attempts: 2,
            statuses: vec![502, 503, 504],
            budget_ratio: 0.2,
            min_per_second: 10,
        }
    }
}

/// Response timeouts (each may be `0s` to disable).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TimeoutsConfig {
    /// No response head within this: 504. No first output token within this (from the request's
    /// arrival): the stream is ended, outcome `timeout`.
    #[serde(with = "super::duration")]
    #[schemars(with = "super::duration::Text")]
    pub first_token: Duration,
    /// No upstream bytes for this long once streaming: the stream is ended, outcome `timeout`.
    #[serde(with = "super::duration")]
    #[schemars(with = "super::duration::Text")]
    pub idle: Duration,
    /// The whole request must finish within this (0s: no limit).
    #[serde(with = "super::duration")]
    #[schemars(with = "super::duration::Text")]
    pub total: Duration,
}

impl Default for TimeoutsConfig {
    fn default() -> Self {
        Self {
            first_token: Duration::from_secs(120),
            idle: Duration::from_secs(60),
            total: Duration::ZERO,
        }
    }
}

/// Route matching; every given condition must hold. An empty match accepts everything.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct MatchConfig {
    /// The request body's `model`.
    pub model: Option<String>,
    /// The request path starts with this.
    pub path_prefix: Option<String>,
}

/// A traffic split between variants.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExperimentConfig {
    /// Experiment name.
    pub name: String,
    /// `header:NAME`, `api_key` (the client's bearer token) or `body:user` (the JSON body's
    /// `user`): requests with the same key go to the same variant. Without a key: random.
    #[serde(default)]
    pub sticky_key: Option<super::forms::StickyKey>,
    /// Honour the `x-inferscope-variant` request header (forcing a variant, as `inferscope eval`
    /// does). Off by default: any client could then pick its variant. Forced requests are logged
    /// `variant_forced` and kept out of the comparisons (they are not a random draw).
    #[serde(default)]
    pub allow_override: bool,
    /// Name the variant that served in each response's `x-inferscope-variant` header. Off by
    /// default: a client that knows its arm can steer the comparison (hang up on the arm it
    /// does not want, or with a header sticky key pick its arm). A request that forced its
    /// variant (`allow_override`) is answered with it either way.
    #[serde(default)]
    pub expose_variant: bool,
    /// Fixed horizon: no verdict until every variant has this many samples of a metric.
    #[serde(default = "defaults::min_samples")]
    pub min_samples: usize,
    /// No one client — its key's name where `auth` is on, else its address, never a header it
    /// chooses — weighs more than this share of a variant's requests in a comparison (past it
    /// a seeded choice of its requests is left out; with too few clients for the share, none
    /// outweighs the next-largest). 1: unbounded, for one trusted caller (an application
    /// server) that sends every request.
    #[serde(default = "defaults::max_client_share")]
    pub max_client_share: f64,
    /// SLOs that roll a variant back to the control when breached.
    #[serde(default)]
    pub guardrails: Option<GuardrailsConfig>,
    /// Copies of a fraction of the requests sent to a shadow variant (measured, discarded).
    #[serde(default)]
    pub shadow: Option<ShadowConfig>,
    /// Thresholds the joined verdict (latency, quality) is judged against.
    #[serde(default)]
    pub accept: Option<AcceptConfig>,
    /// What the gateway does itself when a variant's verdict turns `reject` (a limit of
    /// `accept:` broken on its interval): `fallback` moves its traffic to the control, as a
    /// guardrail trip does (undone by `POST /experiments/reset`). Absent: nothing; a person acts.
    #[serde(default)]
    pub on_reject: Option<OnReject>,
    /// What the gateway does itself when a variant's verdict is `accept` (every limit of
    /// `accept:` met on its interval): `promote` ramps its share of the traffic up through
    /// `promote.steps`, holding each for `promote.hold` and going on only while the verdict
    /// stays `accept` (undone by `POST /experiments/reset`). Absent: nothing; a person acts.
    #[serde(default)]
    pub on_accept: Option<OnAccept>,
    /// The ramp of `on_accept: promote` (absent: 25, 50, 100% held 10 minutes each).
    #[serde(default)]
    pub promote: Option<PromoteConfig>,
    /// The variants.
    pub variants: Vec<VariantConfig>,
}

/// `experiment.on_accept:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnAccept {
    /// The accepted variant's share of the traffic is ramped up by steps.
    Promote,
}

/// `experiment.promote:` — the steps an accepted variant's share is ramped through.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromoteConfig {
    /// The variant's share of the experiment's traffic at each step, in percent, rising; the
    /// last (usually 100) ends the ramp. Shares below its configured weight are skipped.
    #[serde(default = "defaults::promote_steps")]
    pub steps: Vec<u32>,
    /// How long each step is held before the next, while the verdict stays `accept`.
    #[serde(default = "defaults::promote_hold", with = "super::duration")]
    #[schemars(with = "super::duration::Text")]
    pub hold: Duration,
}

impl Default for PromoteConfig {
    fn default() -> Self {
        Self {
            steps: defaults::promote_steps(),
            hold: defaults::promote_hold(),
        }
    }
}

/// `experiment.on_reject:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnReject {
    /// The rejected variant's traffic goes to the control.
    Fallback,
}

/// `experiment.accept:` — when a variant is good enough. Each limit is judged on its 95%
/// interval: met when the whole interval is inside, broken when the whole interval is outside,
/// undecided while the interval straddles it (or the data is missing).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AcceptConfig {
    /// Largest median TTFT change against the control, in percent (`0`: no slower).
    pub ttft_change_max: Option<f64>,
    /// Largest median TPOT change, in percent (`-10`: at least 10% faster).
    pub tpot_change_max: Option<f64>,
    /// Largest median end-to-end latency change, in percent.
    pub e2e_change_max: Option<f64>,
    /// Largest accuracy drop on any posted suite (`eval`), in percentage points.
    pub accuracy_drop_max_points: Option<f64>,
    /// Largest perplexity rise on any posted corpus (`eval --perplexity`).
    pub ppl_rise_max: Option<f64>,
    /// Largest change in GPU energy per output token against the control, in percent (`-20`: at
    /// least 20% less energy a token). Where both variants' backends own their GPUs and report
    /// power (`gpu_url`, `nvml`); judged on the last minute's point estimate (no interval).
    pub energy_change_max: Option<f64>,
}

impl AcceptConfig {
    /// Every limit set, by key.
    pub fn limits(&self) -> impl Iterator<Item = (&'static str, f64)> {
        [
            ("ttft_change_max", self.ttft_change_max),
            ("tpot_change_max", self.tpot_change_max),
            ("e2e_change_max", self.e2e_change_max),
            ("accuracy_drop_max_points", self.accuracy_drop_max_points),
            ("ppl_rise_max", self.ppl_rise_max),
            ("energy_change_max", self.energy_change_max),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k, v?)))
    }
}

/// Shadow traffic of an experiment.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ShadowConfig {
    /// The variant that receives the copies.
    pub variant: String,
    /// Fraction of the experiment's requests copied (0..=1).
    pub fraction: f64,
    /// Copies in flight at once; beyond it copies are not sent (and counted).
    #[serde(default = "defaults::shadow_concurrency")]
    pub max_concurrency: usize,
}

/// Guardrails of an experiment.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GuardrailsConfig {
    /// Sliding window the rules are evaluated over.
    #[serde(default = "defaults::guard_window", with = "super::duration")]
    #[schemars(with = "super::duration::Text")]
    pub window: Duration,
    /// No rule is judged on fewer samples than this in the window.
    #[serde(default = "defaults::guard_samples")]
    pub min_samples: usize,
    /// The SLOs.
    pub rules: Vec<GuardRule>,
}

/// One SLO: `metric` must stay at most `max` (and/or at least `min`).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GuardRule {
    /// Variant it applies to (absent: every variant but the control).
    #[serde(default)]
    pub variant: Option<String>,
    /// `ttft_p99_ms`, `tpot_p50_ms`, `e2e_p90_ms` (p50/p90/p95/p99), `error_rate` or
    /// `feedback:NAME`.
    pub metric: super::forms::GuardMetric,
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
#[derive(Debug, Clone, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// False turns telemetry off even when `OTEL_EXPORTER_OTLP_ENDPOINT` is set.
    pub enabled: Option<bool>,
    /// The OTLP receiver.
    pub otlp: OtlpConfig,
    /// `service.name` (else `OTEL_SERVICE_NAME`, else `inferscope`).
    pub service_name: Option<String>,
    /// Extra resource attributes (merged over `OTEL_RESOURCE_ATTRIBUTES`).
    pub resource: std::collections::BTreeMap<String, String>,
    /// Ratio of new traces sampled, 0..=1 (else `OTEL_TRACES_SAMPLER_ARG`, else 1). A client's
    /// `traceparent` decides for its own trace (parent-based).
    pub sample_ratio: Option<f64>,
    /// Attribute set on spans.
    pub format: TelemetryFormat,
    /// Record prompts and completions on spans (`gen_ai.input.messages`, `gen_ai.output.messages`).
    pub capture_content: bool,
    /// Cap on each captured content attribute, in bytes.
    pub max_content_bytes: usize,
    /// Batching of span export.
    pub batch: BatchConfig,
    /// How often metrics are exported.
    #[serde(with = "super::duration")]
    #[schemars(with = "super::duration::Text")]
    pub metrics_interval: Duration,
    /// Export metrics too (off for trace-only receivers such as Jaeger and Langfuse).
    pub export_metrics: bool,
    /// Aggregation of the exported histograms: `explicit` (the GenAI advisory buckets) or
    /// `exponential` (base-2 exponential histograms, which collectors merge across replicas
    /// without bucket guesses); else `OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION`.
    pub histograms: Option<HistogramAggregation>,
    /// Export every access-log line as an OTLP log record too (attributes: the access-log
    /// fields), so a collector can land each request in ClickHouse, Loki or S3.
    pub export_logs: bool,
}

/// How exported histograms aggregate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum HistogramAggregation {
    /// Explicit bucket boundaries (the GenAI conventions' advisory ones).
    Explicit,
    /// Base-2 exponential buckets (160 at most, scale chosen by the SDK).
    Exponential,
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
            max_content_bytes: 16 * 1024,
            batch: BatchConfig::default(),
            metrics_interval: Duration::from_secs(10),
            export_metrics: true,
            histograms: None,
            export_logs: false,
        }
    }
}

/// OTLP receiver settings.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct OtlpConfig {
    /// Base endpoint, e.g. `http://127.0.0.1:4317` (gRPC) or `http://127.0.0.1:4318` (HTTP).
    pub endpoint: Option<String>,
    /// `grpc` or `http/protobuf`.
    pub protocol: Option<String>,
    /// Headers sent with every export (authentication for hosted receivers).
    pub headers: std::collections::BTreeMap<String, String>,
    /// Export timeout.
    #[serde(with = "super::duration::option")]
    #[schemars(with = "Option<super::duration::Text>")]
    pub timeout: Option<Duration>,
    /// TLS for an `https://` endpoint (absent: the bundled Mozilla roots; the standard
    /// `OTEL_EXPORTER_OTLP_CERTIFICATE`, `_CLIENT_CERTIFICATE` and `_CLIENT_KEY` variables fill in
    /// what this leaves out).
    pub tls: Option<ClientTlsConfig>,
}

/// Which attribute conventions spans follow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct BatchConfig {
    /// Finished requests waiting for export; beyond it they are dropped (and counted).
    pub max_queue: usize,
    /// Requests per export call.
    pub max_batch: usize,
    /// Longest wait before a partial batch is exported.
    #[serde(with = "super::duration")]
    #[schemars(with = "super::duration::Text")]
    pub interval: Duration,
}

impl Default for BatchConfig {
    fn default() -> Self {
        Self {
            max_queue: 8192,
            max_batch: 512,
            interval: Duration::from_secs(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_apply_per_key_and_per_section() {
        let limits: Limits = serde_yaml_ng::from_str("connect_timeout: 1.5s").unwrap_or_default();
        assert_eq!(limits.connect_timeout, Duration::from_millis(1500));
        assert_eq!(limits.header_read_timeout, Duration::from_secs(30));
        assert_eq!(limits.max_request_body_bytes, 16 << 20);
    }
}
