//! `MeterLayer` and what it is made of: `Metering` (the sink, ids, settings and in-flight count
//! every measured request shares), `Annotations` (the per-request handle inner services enrich the
//! record through) and the `RecordSink` trait finished records are handed to.

use super::batch::Parts;
use super::body::MeteredBody;
use super::measure::{Framing, MeasureOptions, Meter};
use super::record::{Outcome, RequestMeta, RequestRecord, NONE};
use super::trace::TraceContext;
use crate::util::Ids;
use http::{header, HeaderValue, Method, Request, Response};
use inferscope_wire::dialect::Endpoint;
use parking_lot::Mutex;
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::time::Instant;
use tower::{Layer, Service};

/// Header carrying the request id back to the client.
pub const REQUEST_ID_HEADER: &str = "x-inferscope-request-id";
/// The same, as a header name built at compile time (a `&str` key is parsed at every use).
const REQUEST_ID_NAME: http::HeaderName = http::HeaderName::from_static(REQUEST_ID_HEADER);

/// Where finished records go. Called once per request, on the task that finished it (often the
/// one writing the response): it must not block — queue the record if the work is slow.
pub trait RecordSink: Send + Sync + 'static {
    /// Takes one finished request's record.
    fn record(&self, rec: &Arc<RequestRecord>);
}

impl std::fmt::Debug for dyn RecordSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RecordSink")
    }
}

impl<T: RecordSink + ?Sized> RecordSink for Arc<T> {
    fn record(&self, rec: &Arc<RequestRecord>) {
        (**self).record(rec);
    }
}

/// Settings every measured request shares.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct MeterSettings {
    /// Ratio of new traces sampled (a client's `traceparent` decides for its own trace).
    pub sample_ratio: f64,
    /// Longest SSE/NDJSON line kept for measurement (longer ones are forwarded and counted).
    pub max_event_bytes: usize,
}

impl Default for MeterSettings {
    fn default() -> Self {
        Self {
            sample_ratio: 1.0,
            max_event_bytes: inferscope_wire::sse::DEFAULT_MAX_LINE,
        }
    }
}

/// What every measured request shares: where records go, the id source, settings, and how many
/// requests are in flight (started and not yet recorded).
pub struct Metering {
    sink: Box<dyn RecordSink>,
    ids: Arc<Ids>,
    settings: MeterSettings,
    in_flight: AtomicI64,
    /// The shutdown grace period has ended: requests dropped now were cut by the gateway.
    cutting: std::sync::atomic::AtomicBool,
    /// Told when a request is in flight where none was, and given frames' forward lag as beats.
    heartbeat: Option<Arc<crate::clock::Heartbeat>>,
}

impl std::fmt::Debug for Metering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metering")
            .field("settings", &self.settings)
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

impl Metering {
    /// Records go to `sink`; ids come from `ids`.
    pub fn new(sink: impl RecordSink, ids: Arc<Ids>, settings: MeterSettings) -> Arc<Self> {
        Self::with_heartbeat(sink, ids, settings, None)
    }

    /// `new`, with the gateway's heartbeat: it runs while requests are in flight and takes the
    /// forward lag of frames as beats.
    pub fn with_heartbeat(
        sink: impl RecordSink,
        ids: Arc<Ids>,
        settings: MeterSettings,
        heartbeat: Option<Arc<crate::clock::Heartbeat>>,
    ) -> Arc<Self> {
        // Meters pack their instants; every request's come after this.
        crate::clock::start();
        Arc::new(Self {
            sink: Box::new(sink),
            ids,
            settings,
            in_flight: AtomicI64::new(0),
            cutting: std::sync::atomic::AtomicBool::new(false),
            heartbeat,
        })
    }

    /// The heartbeat, when there is one.
    pub fn heartbeat(&self) -> Option<&crate::clock::Heartbeat> {
        self.heartbeat.as_deref()
    }

    /// From now on, requests that end without finishing were cut by the shutdown (the grace
    /// period is over): recorded as `shutdown`, not as the client's cancellation.
    pub fn cut_at_shutdown(&self) {
        self.cutting.store(true, Ordering::Relaxed);
    }

    /// `cut_at_shutdown` was called.
    pub fn cutting(&self) -> bool {
        self.cutting.load(Ordering::Relaxed)
    }

    /// Requests started and not yet recorded.
    pub fn in_flight(&self) -> i64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// The id source.
    pub fn ids(&self) -> &Arc<Ids> {
        &self.ids
    }

    /// The shared settings.
    pub fn settings(&self) -> &MeterSettings {
        &self.settings
    }

    /// Starts measuring a request that arrives now: `t0`, a new request id, the trace context
    /// (continued from its `traceparent`), method, path, protocol and declared body length.
    pub fn start<B>(self: &Arc<Self>, req: &Request<B>) -> Annotations {
        let now = Instant::now();
        let mut meta = RequestMeta::new(req.method().clone(), req.uri().path());
        meta.t0 = now;
        // The kernel's stamp, when the server has one: believed only if it is not in the future
        // and within a minute (the conversion has already refused clock steps).
        if let Some(crate::clock::Arrival(at)) = req.extensions().get::<crate::clock::Arrival>() {
            let at = Instant::from_std(*at);
            if at <= now && now.duration_since(at) < std::time::Duration::from_secs(60) {
                meta.t0 = at;
                meta.clock = crate::clock::Source::Kernel;
                meta.accept_delay = Some(now.duration_since(at));
                meta.ts -= now.duration_since(at);
            }
        }
        meta.version = req.version();
        meta.client = req
            .extensions()
            .get::<crate::conn::ClientAddr>()
            .map(|c| c.0);
        meta.request_id = match req.extensions().get::<tower_http::request_id::RequestId>() {
            // An id set by tower-http's `SetRequestIdLayer` outside this layer.
            Some(id) => match id.header_value().to_str() {
                Ok(s) => s.into(),
                Err(_) => self.ids.request_id(),
            },
            None => self.ids.request_id(),
        };
        let ratio = self.settings.sample_ratio;
        meta.trace = TraceContext::start(req.headers(), || self.ids.span_id(), ratio);
        meta.trace_id = meta.trace.trace_id_hex();
        meta.bytes_in = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .unwrap_or(0);
        let notes = self.start_with(meta);
        let cut = req.extensions().get::<crate::conn::StalledCut>();
        let writes = req.extensions().get::<Arc<crate::conn::WriteClock>>();
        if cut.is_some() || writes.is_some() {
            if let Some(n) = notes.0.notes.lock().as_mut() {
                n.stalled = cut.cloned();
                n.writes = writes.cloned();
            }
        }
        notes
    }

    /// Records a request the HTTP layer refused before any service saw it (a malformed or
    /// oversize head, a head that never completed): method and path are `-`, it gets a fresh id.
    pub fn refused_by_http(self: &Arc<Self>, r: &crate::conn::Refused) {
        let method = http::Method::from_bytes(b"-").unwrap_or_default();
        let mut meta = RequestMeta::new(method, NONE);
        meta.request_id = self.ids.request_id();
        meta.client = Some(r.peer);
        self.start_with(meta)
            .finish_without_response(r.status, Outcome::Rejected, r.kind);
    }

    /// Starts measuring a request the caller described itself (e.g. a shadow copy the gateway
    /// makes of a client's request).
    pub fn start_with(self: &Arc<Self>, meta: RequestMeta) -> Annotations {
        if self.in_flight.fetch_add(1, Ordering::Relaxed) == 0 {
            if let Some(h) = &self.heartbeat {
                h.busy();
            }
        }
        Annotations(Arc::new(Cell {
            notes: Mutex::new(Some(Notes {
                meta,
                measure: None,
                refused: None,
                held: Held::default(),
                stalled: None,
                writes: None,
            })),
            metering: Arc::clone(self),
        }))
    }

    /// Hands a finished record to the sink.
    pub(super) fn finish(&self, rec: RequestRecord) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.sink.record(&Arc::new(rec));
    }
}

/// Things kept alive until the response body ends (concurrency permits, backend slots).
#[derive(Default)]
pub struct Held(Vec<Box<dyn Send + Sync>>);

impl Held {
    /// Keeps `x` until the response ends.
    pub fn push(&mut self, x: impl Send + Sync + 'static) {
        self.0.push(Box::new(x));
    }
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Held({})", self.0.len())
    }
}

/// What the service told the layer about its request.
#[derive(Debug)]
struct Notes {
    meta: RequestMeta,
    measure: Option<MeasureOptions>,
    refused: Option<(Outcome, &'static str)>,
    held: Held,
    /// The server's flag for a connection it closed on a stalled client (`server::StalledCut`).
    stalled: Option<crate::conn::StalledCut>,
    /// The server's record of the connection's write attempts (`server::WriteClock`).
    writes: Option<Arc<crate::conn::WriteClock>>,
}

#[derive(Debug)]
struct Cell {
    /// `None` once the response is metered (or the request recorded without one).
    notes: Mutex<Option<Notes>>,
    metering: Arc<Metering>,
}

impl Drop for Cell {
    fn drop(&mut self) {
        // Every handle is gone and no response was metered: the client went away first (the
        // service's future was dropped). That is recorded too — with 499, as nginx logs it.
        if let Some(n) = self.notes.get_mut().take() {
            let rec = if self.metering.cutting() {
                RequestRecord::without_body(n.meta, 503, Outcome::Shutdown, Some("shutdown"), 0)
            } else {
                RequestRecord::without_body(
                    n.meta,
                    499,
                    Outcome::ClientCancelled,
                    Some("client_disconnected"),
                    0,
                )
            };
            drop(n.held);
            self.metering.finish(rec);
        }
    }
}

/// The handle a service inside `MeterLayer` enriches its request's record through: found in the
/// request's extensions (`req.extensions().get::<Annotations>()`). It is the only way to add to a
/// record; what the service does not say is measured from the response alone. Updates after the
/// response head was returned are ignored (the record's request half is fixed then).
#[derive(Debug, Clone)]
pub struct Annotations(Arc<Cell>);

impl Annotations {
    fn with<R>(&self, f: impl FnOnce(&mut Notes) -> R) -> Option<R> {
        self.0.notes.lock().as_mut().map(f)
    }

    /// Updates the request's half of the record: route, model, backend, variant, attempts,
    /// upstream send time, stream, body bytes, parameters…
    pub fn update<R>(&self, f: impl FnOnce(&mut RequestMeta) -> R) -> Option<R> {
        self.with(|n| f(&mut n.meta))
    }

    /// Says how to measure the response (dialect, injected usage chunk, content capture,
    /// deadlines). Without it the layer reads the path: POST to a known OpenAI endpoint is
    /// classified in that dialect, anything else timed only.
    pub fn measure(&self, opts: MeasureOptions) {
        self.with(|n| n.measure = Some(opts));
    }

    /// Keeps `x` alive until the response body ends (a concurrency permit: limits then count
    /// streams, not headers).
    pub fn hold(&self, x: impl Send + Sync + 'static) {
        self.with(|n| n.held.push(x));
    }

    /// Marks the response about to be returned as the service's own refusal (a limit, no route,
    /// an unreachable backend): recorded with this outcome and error kind.
    pub fn refuse(&self, outcome: Outcome, error: &'static str) {
        self.with(|n| n.refused = Some((outcome, error)));
    }

    /// Takes the record out of the response's hands for a session the request turned into (an
    /// upgraded connection such as a WebSocket): the response head then passes through
    /// unmeasured, and the record is written when the `Session` ends, with what it carried.
    /// Whatever was held stays held until then. `None` when the record was taken already.
    pub fn session(&self) -> Option<Session> {
        let notes = self.0.notes.lock().take()?;
        Some(Session {
            notes: Some(notes),
            metering: Arc::clone(&self.0.metering),
            switched: false,
        })
    }

    /// Notes that go nowhere (a service used without `MeterLayer`).
    pub fn detached() -> Self {
        struct Nowhere;
        impl RecordSink for Nowhere {
            fn record(&self, _: &Arc<RequestRecord>) {}
        }
        static NOWHERE: std::sync::OnceLock<Arc<Metering>> = std::sync::OnceLock::new();
        let m = NOWHERE.get_or_init(|| {
            Metering::new(Nowhere, Arc::new(Ids::default()), MeterSettings::default())
        });
        m.start_with(RequestMeta::new(Method::GET, super::record::NONE))
    }

    /// The request's id.
    pub fn request_id(&self) -> Option<Arc<str>> {
        self.update(|m| Arc::clone(&m.request_id))
    }

    /// The shared metering (id source, settings).
    pub fn metering(&self) -> &Arc<Metering> {
        &self.0.metering
    }

    /// Wraps the response body in a meter: the record is written when the body ends. The first
    /// call takes the notes; a response metered twice is passed through unmeasured.
    pub fn meter_response<B>(&self, resp: Response<B>) -> Response<MeteredBody<B>>
    where
        B: http_body::Body,
        B::Data: Parts,
    {
        let (parts, body) = resp.into_parts();
        let Some(mut n) = self.0.notes.lock().take() else {
            return Response::from_parts(parts, MeteredBody::unmetered(body));
        };
        n.meta.t_hdr.get_or_insert_with(Instant::now);
        let ctype = parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let opts = match n.measure {
            Some(o) => o,
            None => {
                // Nothing said: read the path, and call a streamed response a stream.
                let dialect = (n.meta.method == Method::POST)
                    .then(|| Endpoint::from_path(&n.meta.path))
                    .flatten()
                    .and_then(Endpoint::dialect);
                if ctype.starts_with("text/event-stream") {
                    n.meta.stream = true;
                }
                MeasureOptions {
                    dialect,
                    ..MeasureOptions::default()
                }
            }
        };
        let max_line = self.0.metering.settings.max_event_bytes;
        let framing = Framing::for_response(ctype, opts.dialect, max_line);
        let mut meter = Box::new(Meter::new(
            n.meta,
            parts.status.as_u16(),
            framing,
            opts,
            Arc::clone(&self.0.metering),
            n.held,
        ));
        if let Some((outcome, error)) = n.refused {
            meter.set_refused(outcome, error);
        }
        if let Some(cut) = n.stalled {
            meter.set_stalled_flag(cut);
        }
        if let Some(w) = n.writes {
            meter.set_write_clock(w);
        }
        if let Some(enc) = parts.headers.get(header::CONTENT_ENCODING) {
            meter.set_encoding(Some(enc.to_str().unwrap_or("?")));
        }
        Response::from_parts(parts, MeteredBody::new(body, meter))
    }

    /// Records the request as ended without a response body to measure (e.g. a shadow copy that
    /// failed before its backend answered), with the status it would have had.
    pub fn finish_without_response(&self, status: u16, outcome: Outcome, error: &'static str) {
        if let Some(n) = self.0.notes.lock().take() {
            let rec = RequestRecord::without_body(n.meta, status, outcome, Some(error), 0);
            drop(n.held);
            self.0.metering.finish(rec);
        }
    }
}

/// A request that became a session (`Annotations::session`): one record when it ends, its
/// duration the request's `e2e`, the bytes each way `bytes_in` and `bytes_out`. Dropped without
/// `finish` (its task cancelled), it records a cancellation, or `shutdown` while the gateway
/// cuts what is left at the end of its grace period.
#[derive(Debug)]
pub struct Session {
    notes: Option<Notes>,
    metering: Arc<Metering>,
    /// The 101 is on its way to the client (else a session dropped early never switched, and
    /// its record says 499, what nginx logs for a client that went away).
    switched: bool,
}

impl Session {
    /// Keeps `x` until the session ends.
    pub fn hold(&mut self, x: impl Send + Sync + 'static) {
        if let Some(n) = &mut self.notes {
            n.held.push(x);
        }
    }

    /// The gateway is cutting what is left at the end of its shutdown grace period.
    pub fn cutting(&self) -> bool {
        self.metering.cutting()
    }

    /// The backend switched protocols and its 101 goes back to the client.
    pub fn switched(&mut self) {
        self.switched = true;
    }

    /// Writes the session's record.
    pub fn finish(
        mut self,
        status: u16,
        outcome: Outcome,
        error: Option<&'static str>,
        bytes_in: u64,
        bytes_out: u64,
    ) {
        if let Some(mut n) = self.notes.take() {
            n.meta.bytes_in = bytes_in;
            let rec = RequestRecord::without_body(n.meta, status, outcome, error, bytes_out);
            drop(n.held);
            self.metering.finish(rec);
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(n) = self.notes.take() {
            let (outcome, error) = if self.metering.cutting() {
                (Outcome::Shutdown, "shutdown")
            } else {
                (Outcome::ClientCancelled, "client_disconnected")
            };
            let status = if self.switched { 101 } else { 499 };
            let rec = RequestRecord::without_body(n.meta, status, outcome, Some(error), 0);
            drop(n.held);
            self.metering.finish(rec);
        }
    }
}

/// A tower `Layer` that measures every request through the service it wraps and hands each
/// finished `RequestRecord` to a `RecordSink`. Outermost in a stack, it records every request —
/// also those an inner layer refuses — exactly once. Responses carry `x-inferscope-request-id`.
///
/// ```
/// use inferscope_meter::{MeterLayer, RecordSink, RequestRecord};
/// use std::sync::Arc;
///
/// struct Print;
/// impl RecordSink for Print {
///     fn record(&self, rec: &Arc<RequestRecord>) {
///         println!("{} {} ttft={:?}", rec.meta.path, rec.outcome.as_str(), rec.ttft);
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use http_body_util::{BodyExt, Full};
/// use tower::{Service, ServiceBuilder, ServiceExt};
///
/// let layer = MeterLayer::new(Print);
/// let mut svc = ServiceBuilder::new().layer(layer.clone()).service_fn(|_req: http::Request<()>| async {
///     let body = Full::new(bytes::Bytes::from_static(b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n"));
///     Ok::<_, std::convert::Infallible>(
///         http::Response::builder().header("content-type", "text/event-stream").body(body).unwrap(),
///     )
/// });
/// let req = http::Request::post("/v1/chat/completions").body(()).unwrap();
/// let resp = svc.ready().await.unwrap().call(req).await.unwrap();
/// assert!(resp.headers().contains_key("x-inferscope-request-id"));
/// let _ = resp.into_body().collect().await; // the record is written when the body ends
/// assert_eq!(layer.metering().in_flight(), 0);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct MeterLayer {
    metering: Arc<Metering>,
}

impl MeterLayer {
    /// Records go to `sink`; default settings, a fresh id source.
    pub fn new(sink: impl RecordSink) -> Self {
        Self::with_metering(Metering::new(
            sink,
            Arc::new(Ids::default()),
            MeterSettings::default(),
        ))
    }

    /// A layer over an existing `Metering` (shared with other measured paths).
    pub fn with_metering(metering: Arc<Metering>) -> Self {
        Self { metering }
    }

    /// The shared metering (in-flight count, ids).
    pub fn metering(&self) -> &Arc<Metering> {
        &self.metering
    }
}

impl<S> Layer<S> for MeterLayer {
    type Service = MeterService<S>;
    fn layer(&self, inner: S) -> MeterService<S> {
        MeterService {
            inner,
            metering: Arc::clone(&self.metering),
        }
    }
}

/// Service of `MeterLayer`.
#[derive(Debug, Clone)]
pub struct MeterService<S> {
    inner: S,
    metering: Arc<Metering>,
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for MeterService<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: http_body::Body,
    ResB::Data: Parts,
{
    type Response = Response<MeteredBody<ResB>>;
    type Error = S::Error;
    type Future = MeterFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqB>) -> Self::Future {
        let notes = self.metering.start(&req);
        let header = notes
            .request_id()
            .and_then(|id| HeaderValue::try_from(id.as_ref()).ok());
        req.extensions_mut().insert(notes.clone());
        MeterFuture {
            inner: self.inner.call(req),
            notes: Some(notes),
            header,
        }
    }
}

pin_project! {
    /// Response future of `MeterService`.
    pub struct MeterFuture<F> {
        #[pin]
        inner: F,
        notes: Option<Annotations>,
        header: Option<HeaderValue>,
    }
}

impl<F, B, E> Future for MeterFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: http_body::Body,
    B::Data: Parts,
{
    type Output = Result<Response<MeteredBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = ready!(this.inner.poll(cx));
        let Some(notes) = this.notes.take() else {
            // Polled after completion: nothing left to measure.
            return Poll::Ready(result.map(|r| r.map(MeteredBody::unmetered)));
        };
        match result {
            Ok(mut resp) => {
                if let Some(h) = this.header.take() {
                    resp.headers_mut().insert(REQUEST_ID_NAME, h);
                }
                Poll::Ready(Ok(notes.meter_response(resp)))
            }
            Err(e) => {
                notes.finish_without_response(500, Outcome::GatewayError, "service_error");
                Poll::Ready(Err(e))
            }
        }
    }
}
