//! inferscope — a streaming-aware measuring gateway for LLM inference.
//!
//! It proxies OpenAI-compatible traffic to inference backends without buffering, and measures
//! every request where the bytes are: TTFT, TTFC, TPOT, ITL, E2E, tokens, outcome.
//!
//! This package is the command line; the workspace's crates are the layers, and each is
//! re-exported here under the names the code and the docs use (docs/ARCHITECTURE.md §2):
//!
//! | names here | crate | owns |
//! |---|---|---|
//! | [`sse`], [`dialect`] | `inferscope-wire` | incremental zero-copy SSE and NDJSON scanners; what one event of a wire format means, in six dialects |
//! | [`meter`], [`clock`] | `inferscope-meter` | `MeterLayer` (measure any tower HTTP service), its record and sinks; kernel receive stamps, the heartbeat; the statistics core |
//! | [`util`], [`tls`], [`server`] | `inferscope-server` | time, error chains, labels, bounded reads, fair shares; rustls both ways; the accept loop (HTTP/1.1 + h2c, limits, drain) |
//! | [`sim`] | `inferscope-sim` | the simulated backend speaking every dialect, with a timing model and ground truth |
//! | [`config`] | `inferscope-config` | YAML schema, `load()` → `validate()` → `Arc<Config>`, located errors, the JSON Schema, the embedded default |
//! | [`facts`], [`accesslog`], [`stats`], [`experiment`], [`access`], [`telemetry`], [`route`], [`recorder`], [`proxy`], [`admin`], [`app`] | `inferscope-gateway` | the running gateway: what it learns per request, the access log, the roofline, experiments and verdicts, keys and rate limits, OpenTelemetry, routing, the record sinks, the proxy, the admin API, the assembly |
//! | [`lab`] | `inferscope-lab` | `bench`'s load generator, eval and its sandbox, perplexity, the offline report |
//! | [`cli`] | this package | the clap command line: one file per command, each calling the entry points above |

// What is `pub` inside is the crate's API: anything else is `pub(crate)`.
#![warn(unreachable_pub)]

pub mod cli;

// The gateway: crates/inferscope-gateway, its modules under their names here.
pub use inferscope_gateway::{
    access, accesslog, admin, app, experiment, facts, proxy, recorder, route, stats, telemetry,
};

// The lab tools (bench, eval and its sandbox, perplexity, report): crates/inferscope-lab.
pub use inferscope_lab as lab;

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
