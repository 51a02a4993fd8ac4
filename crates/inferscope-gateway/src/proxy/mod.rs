//! The proxy: `ProxyService` (the innermost tower service) and the per-request context that
//! carries a request through its phases (`phases`), the in-flight limit layer, request
//! preparation, the pooled upstream client and the gateway's own error answers.
//!
//! The data-plane stack, outermost first: `meter::MeterLayer` (records every request, refused
//! ones included) → `InFlightLimitLayer` (refuses above the limit; holds its permit until the
//! response body ends) → `ProxyService`.

mod body;
mod error;
mod limit;
mod phases;
mod request;
mod service;
mod tunnel;
mod upstream;

pub use body::{BodyBudget, Pace, PacedBody, Reservation, TooSlow, RATE_GRACE};
pub use error::{Blame, ProxyError};
pub use limit::{InFlightLimit, InFlightLimitLayer, Slots};
pub use request::{
    prepare_body, remove_hop_headers, upstream_headers, Prepared, TooDeep, MAX_JSON_DEPTH,
    OWN_PREFIX,
};
pub use service::{
    Gateway, ProxyBody, ProxyFuture, ProxyService, SpanExpect, TraceOptions, VARIANT_HEADER,
};
pub use upstream::{
    h1, UpstreamBodyError, UpstreamClient, UpstreamError, UpstreamRequestBody, UpstreamResponseBody,
};

/// Header marking shadow copies to the backend.
pub const SHADOW_HEADER: &str = "x-inferscope-shadow";
