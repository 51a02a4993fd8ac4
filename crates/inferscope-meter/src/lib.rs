//! Measuring LLM inference requests where the bytes are, for any tower HTTP service: the layer
//! the inferscope gateway is built on, usable inside any other server.
//!
//! - [`MeterLayer`]: a tower `Layer` that measures every request through the service it wraps —
//!   TTFT, TTFC, TPOT, ITL, E2E, tokens, outcome — and hands each finished [`RequestRecord`] to a
//!   [`RecordSink`].
//! - [`Annotations`]: the one way a service inside the layer enriches its request's record (route,
//!   backend, variant, attempts, upstream send time…), tells the layer how to read the response
//!   (dialect, injected usage chunk, deadlines), keeps something alive until the response body ends
//!   (concurrency permits), or marks a response as its own refusal.
//! - [`MeteredBody`]: the response-body wrapper that timestamps each frame in `poll_frame`,
//!   forwards the same data at once (`Bytes`, or a [`Batch`] of them), and finalizes the record
//!   exactly once — at the end of the body, on an error, or when dropped.
//! - [`RequestRecord`]: plain data — labels, timings, counts, outcome — with no handles to live
//!   objects, so every consumer (statistics, an access log, OpenTelemetry, experiments) is a sink.
//! - [`stats::Stats`]: the statistics sink — HdrHistograms per group with a sliding window, their
//!   JSON snapshot and Prometheus series.
//! - [`clock`]: the instants the meter reads (the kernel's receive stamps where the platform has
//!   them), and [`conn`]: what an HTTP server attaches to each request for the meter.
//!
//! What the bytes of a stream mean (SSE, NDJSON, the six API dialects) is the `inferscope-wire`
//! crate, which this one reads the response with.

// What is `pub` inside is the crate's API: anything else is `pub(crate)`.
#![warn(unreachable_pub)]

pub mod clock;
pub mod conn;
pub mod stats;
pub mod util;

mod batch;
mod body;
mod layer;
mod measure;
mod record;
pub mod trace;

pub use batch::{Batch, Parts, MAX_PIECES};
pub use body::{BoxError, MeteredBody, StreamAborted};
pub use layer::{
    Annotations, Held, MeterFuture, MeterLayer, MeterService, MeterSettings, Metering, RecordSink,
    Session, REQUEST_ID_HEADER,
};
pub use measure::{Deadlines, End, Framing, MeasureOptions, Meter, StripPlan};
pub use record::{
    Breakdown, EngineJoin, EngineSpan, EventTokens, Gaps, ItlSample, ItlSummary, Outcome, Purpose,
    RequestMeta, RequestParams, RequestRecord, ResponseInfo, Slo, TokensSource, MAX_ITL_SAMPLES,
    NONE, PURPOSE_HEADER,
};
pub use trace::TraceContext;
