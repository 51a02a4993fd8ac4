//! The proxy: `ProxyService` (the innermost tower service), its layers, request rewriting and the
//! pooled upstream client (`upstream`).

mod error;
mod layers;
mod request;
mod service;
mod shadow;
mod upstream;

pub use error::{Blame, ProxyError};
pub use layers::{Admission, InFlightLimitLayer, RequestId, RequestIdLayer, REQUEST_ID_HEADER};
pub use request::{inspect, remove_hop_headers, Inspected};
pub use service::{Gateway, GatewaySlot, ProxyBody, ProxyService, TraceOptions, VARIANT_HEADER};
pub use upstream::{UpstreamBody, UpstreamClient, UpstreamError, UpstreamResponseBody};
