//! `ProxyService`, the innermost service of the data plane, and `Gateway`, what every request
//! shares (routes, the upstream pool, the metering, limits).

use super::body::{BodyBudget, Pace};
use super::upstream::{UpstreamClient, UpstreamResponseBody};
use crate::config::Limits;
use crate::meter::{Batch, Metering};
use crate::route::RouterSlot;
use http::{Request, Response};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// Body sent to the client: the upstream's body, or a gateway-made error (`MeterLayer` wraps
/// either in its meter).
pub type ProxyBody = Either<UpstreamResponseBody, Full<Batch>>;

/// Response future of `ProxyService` (and of the layers between it and `MeterLayer`).
pub type ProxyFuture =
    Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Infallible>> + Send>>;

/// Response header naming the experiment variant that served the request.
pub use crate::experiment::VARIANT_HEADER;

/// How long an idle upstream HTTP/2 connection stays pooled (HTTP/1.1: each backend's
/// `idle_timeout`).
const UPSTREAM_IDLE: Duration = Duration::from_secs(90);

/// What the data path does for tracing.
#[derive(Debug, Clone, Copy, Default)]
pub struct TraceOptions {
    /// Telemetry is on: send our `traceparent` upstream.
    pub enabled: bool,
    /// Capture prompts and completions up to this many bytes.
    pub capture_content: Option<usize>,
}

/// Everything requests share. Routes change on reload (through the slot); the rest is fixed.
#[derive(Debug)]
pub struct Gateway {
    /// Routes and backends, current.
    pub routes: Arc<RouterSlot>,
    /// Where records go, ids, in-flight count (shadow copies are measured through it too).
    pub metering: Arc<Metering>,
    /// Timeouts, body caps and the other request limits of `limits:`.
    pub limits: Limits,
    /// Tracing behaviour.
    pub trace: TraceOptions,
    /// Request bodies held at once, against `limits.max_buffered_body_bytes`.
    pub body_budget: Arc<BodyBudget>,
    /// Client keys (absent: no authentication); swapped on reload.
    pub keys: Arc<arc_swap::ArcSwapOption<crate::access::Keys>>,
    /// Rate limits and per-key accounting.
    pub limiter: Arc<crate::access::Limiter>,
    /// The request slots shared with `InFlightLimitLayer`: keys' shares under pressure, and the
    /// pressure that tightens body pace (absent: neither).
    pub slots: Option<Arc<super::limit::Slots>>,
    /// Told each (trace id, CLIENT span id) sent to a backend with `engine_spans:`, so the
    /// engine's span may be held for a record still to come, and a span of a request this
    /// gateway never sent may not.
    pub expect_span: Option<SpanExpect>,
    pub(super) client: UpstreamClient,
}

/// Where the proxy says which engine spans to expect (the recorder's join).
#[derive(Clone)]
pub struct SpanExpect(pub Arc<dyn Fn(u128, u64) + Send + Sync>);

impl std::fmt::Debug for SpanExpect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SpanExpect")
    }
}

impl Gateway {
    /// A gateway routing by `routes` and measuring through `metering`. Must be created inside a
    /// Tokio runtime (the upstream pool starts its sweep).
    pub fn new(
        routes: Arc<RouterSlot>,
        metering: Arc<Metering>,
        limits: Limits,
        trace: TraceOptions,
    ) -> Self {
        let client = UpstreamClient::new(limits.connect_timeout, UPSTREAM_IDLE)
            .with_stamps(limits.kernel_clock);
        Self {
            routes,
            metering,
            body_budget: Arc::new(BodyBudget::new(limits.max_buffered_body_bytes)),
            limits,
            trace,
            keys: Arc::default(),
            limiter: Arc::default(),
            slots: None,
            expect_span: None,
            client,
        }
    }

    /// Authenticates clients with `keys` and limits them with `limiter`.
    pub fn with_access(
        mut self,
        keys: Arc<arc_swap::ArcSwapOption<crate::access::Keys>>,
        limiter: Arc<crate::access::Limiter>,
    ) -> Self {
        self.keys = keys;
        self.limiter = limiter;
        self
    }

    /// Shares `slots` with the in-flight limit in front of it.
    pub fn with_slots(mut self, slots: Arc<super::limit::Slots>) -> Self {
        self.slots = Some(slots);
        self
    }

    /// Tells `expect` of every request sent to a backend with `engine_spans:`.
    pub fn with_span_expectations(mut self, expect: SpanExpect) -> Self {
        self.expect_span = Some(expect);
        self
    }

    /// The pace client request bodies must keep.
    pub fn pace(&self) -> Pace {
        Pace {
            silence: self.limits.body_read_timeout,
            min_rate: self.limits.body_min_bytes_per_sec,
            slots: self.slots.clone(),
        }
    }
}

/// The innermost service of the data plane: one request through the proxy's phases.
#[derive(Debug, Clone)]
pub struct ProxyService {
    gw: Arc<Gateway>,
}

impl ProxyService {
    /// A service over `gw`.
    pub fn new(gw: Arc<Gateway>) -> Self {
        Self { gw }
    }
}

impl tower::Service<Request<Incoming>> for ProxyService {
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = ProxyFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Incoming>) -> ProxyFuture {
        let gw = Arc::clone(&self.gw);
        Box::pin(async move { Ok(super::phases::proxy(gw, req).await) })
    }
}

#[cfg(test)]
mod tests {
    use super::ProxyBody;
    use crate::meter::{Meter, MeteredBody};

    #[test]
    fn the_metered_body_is_small_enough_to_move() {
        // The response is moved through the server's queues several times before its first
        // frame; the meter (over a kilobyte) is boxed so those moves stay small.
        let body = std::mem::size_of::<MeteredBody<ProxyBody>>();
        let meter = std::mem::size_of::<Meter>();
        assert!(
            body < 1024 && body < meter,
            "body {body} B, meter {meter} B"
        );
    }
}
