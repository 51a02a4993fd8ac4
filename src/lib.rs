//! inferscope — a streaming-aware measuring gateway for LLM inference.
//!
//! It proxies OpenAI-compatible traffic to inference backends without buffering, and measures
//! every request where the bytes are: TTFT, TTFC, TPOT, ITL, E2E, tokens, outcome.
//!
//! Module map (data flows top to bottom):
//!
//! | module | owns |
//! |---|---|
//! | [`cli`] | the clap command line; thin, calls the entry points below |
//! | [`config`] | YAML schema, `load()` → `validate()` → `Arc<Config>`, located errors, embedded default |
//! | [`app`] | assembles a running gateway from a config and shuts it down in order |
//! | [`server`] | accept loop: HTTP/1.1 + h2c, graceful drain |
//! | [`proxy`] | `ProxyService` and its tower layers, request rewrite, upstream client, gateway errors |
//! | [`route`] | route matching, backend pools, balancers, health, retries budget, experiment splits |
//! | [`experiment`] | per-variant samples, comparisons with confidence intervals, offline reports |
//! | [`sse`] | incremental zero-copy SSE and NDJSON scanners |
//! | [`dialect`] | what one event of a wire format means (output, usage, finish, error) |
//! | [`meter`] | `MeteredBody` (timestamps frames in `poll_frame`) and `RequestRecord` |
//! | [`recorder`] | where each finished record goes: stats and the access log |
//! | [`stats`] | HdrHistograms per group, sliding window, `/stats` JSON, Prometheus text |
//! | [`accesslog`] | JSONL writer task behind a bounded channel |
//! | [`telemetry`] | OpenTelemetry spans and metrics over OTLP, trace context |
//! | [`admin`] | admin HTTP API: `/metrics`, `/stats`, `/healthz`, `/readyz` |
//! | [`loadgen`] | `inferscope bench`: load generation measured by the same definitions |
//! | [`sim`] | simulated OpenAI-compatible backend with a timing model and ground truth |

pub mod accesslog;
pub mod admin;
pub mod app;
pub mod cli;
pub mod config;
pub mod dialect;
pub mod experiment;
pub mod loadgen;
pub mod meter;
pub mod proxy;
pub mod recorder;
pub mod route;
pub mod server;
pub mod sim;
pub mod sse;
pub mod stats;
pub mod telemetry;
pub mod util;
