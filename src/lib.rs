//! inferscope — a streaming-aware measuring gateway for LLM inference.
//!
//! It proxies OpenAI-compatible traffic to inference backends without buffering, and measures
//! every request where the bytes are: TTFT, TTFC, TPOT, ITL, E2E, tokens, outcome.
//!
//! Module map, lowest layer first (a module uses only lower ones; docs/ARCHITECTURE.md §2):
//!
//! | module | owns |
//! |---|---|
//! | [`sse`] | incremental zero-copy SSE and NDJSON scanners (the `inferscope-wire` crate) |
//! | [`dialect`] | what one event of a wire format means (output, tokens, usage, finish, error, the end), in six dialects (the `inferscope-wire` crate) |
//! | [`meter`] | `MeterLayer` (measure any tower HTTP service), `RecordSink`, `Annotations`, `MeteredBody`, `RequestRecord` (the `inferscope-meter` crate) |
//! | [`clock`] | kernel receive stamps, the heartbeat (the `inferscope-meter` crate) |
//! | [`util`] | time formatting, error chains, labels, bounded reads, fair shares; the meter crate's percentile rule, ids, hash, RNG and Prometheus writer (the `inferscope-server` crate) |
//! | [`tls`] | rustls both ways (the `inferscope-server` crate) |
//! | [`facts`] | what the gateway learns about a request as it routes it (backend, retries, key, engine load, shadow pair), carried in the meter's `RequestMeta::extensions` |
//! | [`server`] | accept loop: HTTP/1.1 + h2c, connection limits, graceful drain (the `inferscope-server` crate) |
//! | [`sim`] | simulated backend speaking every dialect, with a timing model and ground truth (the `inferscope-sim` crate) |
//! | [`config`] | YAML schema, `load()` → `validate()` → `Arc<Config>`, located errors, embedded default (the `inferscope-config` crate) |
//! | [`stats`] | HdrHistograms per group, sliding window, `/stats` JSON, Prometheus series (the `inferscope-meter` crate), the roofline |
//! | [`accesslog`] | JSONL writer task behind a bounded queue |
//! | [`experiment`] | per-variant samples, comparisons, guardrails, shadow agreement, feedback, eval, reports |
//! | [`loadgen`] | `inferscope bench`: load generation measured by the same definitions |
//! | [`telemetry`] | OpenTelemetry spans and metrics over OTLP |
//! | [`route`] | route matching, pools, balancers, backend health, experiment splits, the routing observer |
//! | [`recorder`] | the gateway's sinks for finished records |
//! | [`proxy`] | `ProxyService` and its phases, the in-flight limit, the upstream client, gateway errors |
//! | [`admin`] | admin HTTP API: `/metrics`, `/stats`, `/experiments`, `/feedback`, `/healthz`, `/readyz` |
//! | [`app`] | assembles a running gateway from a config and shuts it down in order |
//! | [`cli`] | the clap command line; thin, calls the entry points above |

// What is `pub` inside is the crate's API: anything else is `pub(crate)`.
#![warn(unreachable_pub)]

pub mod access;
pub mod accesslog;
pub mod admin;
pub mod app;
pub mod cli;
pub mod experiment;
pub mod facts;
pub mod loadgen;
pub mod proxy;
pub mod recorder;
pub mod route;
pub mod stats;
pub mod telemetry;

// The wire layer, a crate of its own (crates/inferscope-wire), under its module names here.
pub use inferscope_wire::{dialect, sse};

// The measuring layer, its record, the clock and the statistics core: crates/inferscope-meter.
pub use inferscope_meter as meter;
pub use inferscope_meter::clock;

// Serving and connecting (the accept loop, TLS both ways) and the shared utilities:
// crates/inferscope-server.
pub use inferscope_server::{server, tls, util};

// The simulated backend: crates/inferscope-sim.
pub use inferscope_sim as sim;

// The configuration: crates/inferscope-config.
pub use inferscope_config as config;
