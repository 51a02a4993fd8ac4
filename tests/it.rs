//! The integration tests that run the gateway, one module per subject, in one test binary: one
//! link of the crate (with tonic, axum and the OTel SDK) instead of one per file. Lane 1 is
//! `cargo test`; lane 2, the tests marked `#[ignore = "needs …"]` (an outside program), is
//! `cargo test -- --ignored`, one subject `cargo test --test it sdk:: -- --ignored`.
//!
//! Kept apart, each in its own binary: `contracts` and `layering` (named by their
//! `UPDATE_GOLDEN=1` commands), `alloc` (a counting global allocator), `fuzz` (bolero's
//! `BOLERO_*` settings), `vllm` (behind the `vllm-tests` feature).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

mod abuse;
mod accesslog;
mod admin;
mod bench;
mod clock;
mod config;
mod container;
mod dashboard;
mod deploy;
mod dialects;
mod embed;
mod engine;
mod engine_spans;
mod experiments;
mod fleet;
mod hostile;
mod hostile_admin;
mod http2;
mod humaneval;
mod keys;
mod lifecycle;
mod lm_eval;
mod measurement;
mod outcomes;
mod percentiles;
mod report_html;
mod resilience;
mod roofline;
mod sdk;
mod secrets;
mod signals;
mod soak;
mod telemetry;
mod tls;
mod upstream;
mod websocket;
