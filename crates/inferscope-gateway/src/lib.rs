//! The inferscope gateway: everything a running gateway is, above the measuring layer.
//!
//! Module map, lowest layer first (a module uses only lower ones; docs/ARCHITECTURE.md §2):
//!
//! | module | owns |
//! |---|---|
//! | [`facts`] | what the gateway learns about a request as it routes it (backend, retries, key, engine load, shadow pair), carried in the meter's `RequestMeta::extensions` |
//! | [`accesslog`] | JSONL writer task behind a bounded queue; the line as its readers take it back |
//! | [`stats`] | the meter's statistics core under its name here, and the roofline |
//! | [`experiment`] | per-variant samples, comparisons, guardrails, shadow agreement, feedback, quality verdicts |
//! | [`access`] | API keys, per-key rate limits and budgets |
//! | [`telemetry`] | OpenTelemetry spans, metrics and logs over OTLP; engines' spans received |
//! | [`route`] | route matching, pools, balancers, backend health, experiment splits, the routing observer |
//! | [`recorder`] | the gateway's sinks for finished records |
//! | [`proxy`] | `ProxyService` and its phases, the in-flight limit, the upstream client, gateway errors |
//! | [`admin`] | admin HTTP API: `/metrics`, `/stats`, `/experiments`, `/feedback`, `/healthz`, `/readyz` |
//! | [`app`] | assembles a running gateway from a config and shuts it down in order |

// What is `pub` inside is the crate's API: anything else is `pub(crate)`.
#![warn(unreachable_pub)]

pub mod access;
pub mod accesslog;
pub mod admin;
pub mod app;
pub mod experiment;
pub mod facts;
pub mod proxy;
pub mod recorder;
pub mod route;
pub mod stats;
pub mod telemetry;

// The layers below under the names the modules use.
use inferscope_config as config;
use inferscope_meter as meter;
use inferscope_meter::clock;
use inferscope_server::{server, tls, util};
use inferscope_sim as sim;
use inferscope_wire::dialect;
