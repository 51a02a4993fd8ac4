//! `ProxyService`: one request through its phases — admit, read (inference bodies only), route,
//! forward, wrap the response body in a meter. Every request leaves exactly one record: the meter
//! writes it when the body ends, `fail` when the gateway answers itself, and `Pending`'s drop when
//! the client goes away before a response exists.

use super::error::ProxyError;
use super::layers::{Admission, RequestId};
use super::request::{inspect, remove_hop_headers};
use super::upstream::{UpstreamClient, UpstreamResponseBody};
use crate::config::Limits;
use crate::dialect::Endpoint;
use crate::meter::{
    Attempt, Deadlines, Framing, Guards, Meter, MeterOptions, MeteredBody, Outcome, RequestMeta,
    RequestRecord,
};
use crate::recorder::Recorder;
use crate::route::{Router, NONE};
use crate::sse::{NdjsonScanner, SseScanner};
use crate::telemetry::TraceContext;
use crate::util::Ids;
use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, Uri, Version};
use http_body::Body as _;
use http_body_util::{BodyExt, Either, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;

/// Body sent to the client: the metered upstream body, or a gateway-made error.
pub type ProxyBody = Either<MeteredBody<UpstreamResponseBody>, Full<Bytes>>;
/// Response header naming the experiment variant that served the request.
pub const VARIANT_HEADER: &str = "x-inferscope-variant";

/// How long an idle upstream connection stays pooled.
const UPSTREAM_IDLE: Duration = Duration::from_secs(90);

/// What the data path does for tracing.
#[derive(Debug, Clone, Copy, Default)]
pub struct TraceOptions {
    /// Telemetry is on: send our `traceparent` upstream.
    pub enabled: bool,
    /// Ratio of new traces sampled.
    pub sample_ratio: f64,
    /// Capture prompts and completions up to this many bytes.
    pub capture_content: Option<usize>,
}

/// Everything requests share.
#[derive(Debug)]
pub struct Gateway {
    /// Tracing behaviour.
    pub trace: TraceOptions,
    /// Routes and backends.
    pub router: Arc<Router>,
    /// Where records go.
    pub recorder: Arc<Recorder>,
    /// Limits.
    pub limits: Limits,
    /// Id source.
    pub ids: Arc<Ids>,
    pub(super) client: UpstreamClient,
}

impl Gateway {
    /// A gateway over `router`, recording into `recorder`.
    pub fn new(
        router: Arc<Router>,
        recorder: Arc<Recorder>,
        limits: Limits,
        ids: Arc<Ids>,
        trace: TraceOptions,
    ) -> Self {
        let client = UpstreamClient::new(limits.connect_timeout, UPSTREAM_IDLE);
        Self {
            trace,
            router,
            recorder,
            limits,
            ids,
            client,
        }
    }
}

impl Gateway {
    /// The same gateway with another router (a reloaded config): shares the recorder, the ids and
    /// the upstream connection pool.
    pub fn with_router(&self, router: Arc<Router>) -> Self {
        Self {
            trace: self.trace,
            router,
            recorder: Arc::clone(&self.recorder),
            limits: self.limits.clone(),
            ids: Arc::clone(&self.ids),
            client: self.client.clone(),
        }
    }
}

/// The current gateway, replaceable while requests run: each request takes the gateway current
/// when it arrives and finishes on it, whatever happens to the slot meanwhile. Reading it is one
/// atomic load (`arc-swap`), no lock on the request path.
#[derive(Debug)]
pub struct GatewaySlot(arc_swap::ArcSwap<Gateway>);

impl GatewaySlot {
    /// A slot holding `gw`.
    pub fn new(gw: Arc<Gateway>) -> Self {
        Self(arc_swap::ArcSwap::new(gw))
    }

    /// The current gateway.
    pub fn load(&self) -> Arc<Gateway> {
        self.0.load_full()
    }

    /// Replaces the gateway for requests arriving from now on.
    pub fn store(&self, gw: Arc<Gateway>) {
        self.0.store(gw);
    }
}

/// The innermost service of the data plane.
#[derive(Debug, Clone)]
pub struct ProxyService {
    slot: Arc<GatewaySlot>,
}

impl ProxyService {
    /// A service over the gateway in `slot`.
    pub fn new(slot: Arc<GatewaySlot>) -> Self {
        Self { slot }
    }
}

impl tower::Service<Request<Incoming>> for ProxyService {
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        let gw = self.slot.load();
        Box::pin(async move { Ok(proxy(gw, req).await) })
    }
}

/// A request's meta until its response exists. Dropped with the meta still inside means the
/// client went away first: that is recorded as `client_cancelled`.
struct Pending {
    meta: Option<RequestMeta>,
    recorder: Arc<Recorder>,
}

impl Pending {
    fn meta(&mut self) -> &mut RequestMeta {
        self.meta.get_or_insert_with(unreachable_meta)
    }

    fn take(&mut self) -> RequestMeta {
        self.meta.take().unwrap_or_else(unreachable_meta)
    }

    /// Answers with a gateway-made error and records it.
    fn fail(mut self, err: ProxyError) -> Response<ProxyBody> {
        let (status, outcome, kind) = (err.status(), err.outcome(), err.kind());
        let resp = err.into_response();
        let len = resp.body().size_hint().exact().unwrap_or(0);
        let rec =
            RequestRecord::without_body(self.take(), status.as_u16(), outcome, Some(kind), len);
        self.recorder.record(rec);
        resp.map(Either::Right)
    }
}

/// `Pending` always holds its meta until taken, and is never used after; this only keeps the
/// type total without a panic.
fn unreachable_meta() -> RequestMeta {
    RequestMeta::new(Method::GET, NONE)
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(meta) = self.meta.take() {
            let rec = RequestRecord::without_body(
                meta,
                499,
                Outcome::ClientCancelled,
                Some("client_disconnected"),
                0,
            );
            self.recorder.record(rec);
        }
    }
}

async fn proxy(gw: Arc<Gateway>, req: Request<Incoming>) -> Response<ProxyBody> {
    let t0 = Instant::now();
    let (mut parts, body) = req.into_parts();
    let request_id = match parts.extensions.remove::<RequestId>() {
        Some(RequestId(id)) => id,
        None => gw.ids.request_id().into(),
    };
    let trace = TraceContext::start(&parts.headers, || gw.ids.span_id(), gw.trace.sample_ratio);
    let trace_id: Arc<str> = trace.trace_id_hex().into();
    let bytes_in = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    gw.recorder.started();
    let mut meta = RequestMeta::new(parts.method.clone(), parts.uri.path());
    meta.version = parts.version;
    meta.t0 = t0;
    meta.request_id = request_id;
    meta.trace_id = trace_id;
    meta.trace = trace;
    meta.bytes_in = bytes_in.unwrap_or(0);
    let mut pending = Pending {
        meta: Some(meta),
        recorder: Arc::clone(&gw.recorder),
    };

    // Phase 1: admission.
    let permit = match parts.extensions.remove::<Admission>() {
        Some(Admission::Admitted(p)) => Some(p),
        Some(Admission::Full) => return pending.fail(ProxyError::Overloaded),
        None => None,
    };

    // Phase 2: read the body of known inference endpoints (bounded); stream everything else.
    let endpoint = (parts.method == Method::POST)
        .then(|| Endpoint::from_path(parts.uri.path()))
        .flatten();
    // `replay` is the body to send again on a retry: inference bodies are held anyway, and a
    // request without a body has nothing to hold; a streamed body cannot be replayed.
    let mut user = None;
    let (upstream_body, model, strip_usage, replay) = match endpoint {
        Some(ep) => {
            let limit = gw.limits.max_request_body_bytes;
            if bytes_in.is_some_and(|n| n > limit as u64) {
                return pending.fail(ProxyError::BodyTooLarge(limit));
            }
            let bytes = match Limited::new(body, limit).collect().await {
                Ok(c) => c.to_bytes(),
                Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
                    return pending.fail(ProxyError::BodyTooLarge(limit))
                }
                Err(_) => return pending.fail(ProxyError::BodyRead),
            };
            pending.meta().bytes_in = bytes.len() as u64;
            let mut ins = inspect(bytes, ep.is_openai(), gw.trace.capture_content);
            ins.params.operation = Some(ep.operation());
            pending.meta().stream = ins.stream;
            pending.meta().params = std::mem::take(&mut ins.params);
            if ins.body.len() as u64 != pending.meta().bytes_in {
                parts.headers.remove(header::CONTENT_LENGTH);
            }
            let replay = Some(ins.body.clone());
            user = ins.user.take();
            (
                Either::Left(Full::new(ins.body)),
                ins.model,
                ins.strip_usage,
                replay,
            )
        }
        None if has_no_body(&parts) => {
            let empty = Bytes::new();
            (
                Either::Left(Full::new(empty.clone())),
                None,
                false,
                Some(empty),
            )
        }
        None => (Either::Right(body), None, false, None),
    };
    if let Some(m) = &model {
        pending.meta().model = m.as_str().into();
    }

    // Phase 3: route.
    let Some(sel) = gw.router.select(
        model.as_deref(),
        user.as_deref(),
        parts.uri.path(),
        &parts.headers,
    ) else {
        return pending.fail(ProxyError::NoRoute);
    };
    let route = Arc::clone(&sel.route);
    route.budget.deposit();
    {
        let m = pending.meta();
        m.route = Arc::clone(&route.name);
        m.variant = Arc::clone(&sel.variant);
        m.guard = sel.guard.clone();
    }

    // Shadow: maybe send a copy to the shadow variant; never awaited by this request.
    let mut capture_output = gw.trace.capture_content;
    if let (crate::route::Target::Experiment(x), Some(bytes), Some(ep)) =
        (&route.target, &replay, endpoint)
    {
        if let Some(sh) = x.shadow.as_ref().filter(|sh| *sh.variant != *sel.variant) {
            if let Some(permit) = sh.admit() {
                let pair = crate::experiment::shadow::Pair::new(Arc::clone(sh));
                pending.meta().shadow_pair = Some(Arc::clone(&pair));
                let cap = crate::experiment::shadow::MAX_COMPARED;
                capture_output = Some(capture_output.map_or(cap, |c| c.max(cap)));
                let copy = super::shadow::Copy {
                    method: parts.method.clone(),
                    path_and_query: parts.uri.path_and_query().cloned(),
                    headers: parts.headers.clone(),
                    body: bytes.clone(),
                    model: model.clone(),
                    stream: pending.meta().stream,
                    endpoint: ep,
                };
                tokio::spawn(super::shadow::send(
                    Arc::clone(&gw),
                    Arc::clone(&route),
                    Arc::clone(sh),
                    permit,
                    pair,
                    copy,
                ));
            }
        }
    }

    // Phase 4: forward; fail over to another backend before any response byte reached the client
    // when that is safe (the body can be sent again, attempts and the retry budget allow).
    let client_version = parts.version;
    let path_and_query = parts.uri.path_and_query().cloned();
    let mut headers = std::mem::take(&mut parts.headers);
    remove_hop_headers(&mut headers);
    headers.remove(header::HOST);
    let first_token_at = nonzero(route.timeouts.first_token).map(|d| t0 + d);
    let max_attempts = if replay.is_some() {
        1 + route.retry.attempts as usize
    } else {
        1
    };
    let mut first_body = Some(upstream_body);
    let mut backend = sel.backend;
    let mut tried: Vec<Arc<str>> = Vec::new();
    let (resp, backend_guard) = loop {
        tried.push(Arc::clone(&backend.name));
        {
            let m = pending.meta();
            m.backend = Arc::clone(&backend.name);
            m.upstream = Some(Arc::clone(&backend));
        }
        let guard = match backend.admit().await {
            Ok(g) => g,
            Err(busy) => return pending.fail(ProxyError::Busy(busy)),
        };
        let body = match (first_body.take(), &replay) {
            (Some(b), _) => b,
            (None, Some(bytes)) => Either::Left(Full::new(bytes.clone())),
            (None, None) => return pending.fail(ProxyError::BadUpstreamRequest),
        };
        let mut uri = backend.base.clone().into_parts();
        uri.path_and_query = path_and_query.clone();
        let Ok(uri) = Uri::from_parts(uri) else {
            return pending.fail(ProxyError::BadUpstreamRequest);
        };
        let mut h = headers.clone();
        if let Some(auth) = &backend.authorization {
            h.insert(header::AUTHORIZATION, auth.clone());
        }
        if gw.trace.enabled {
            // The backend's spans join this trace as children of this attempt's CLIENT span.
            if let Ok(v) = HeaderValue::try_from(pending.meta().trace.upstream_traceparent()) {
                h.insert("traceparent", v);
            }
        }
        let mut up = Request::new(body);
        *up.method_mut() = parts.method.clone();
        *up.uri_mut() = uri;
        *up.version_mut() = Version::HTTP_11;
        *up.headers_mut() = h;
        let t_sent = Instant::now();
        pending.meta().t_sent = Some(t_sent);
        let sent = gw.client.request(up);
        let result = match first_token_at {
            Some(at) => match tokio::time::timeout_at(at, sent).await {
                Ok(r) => r,
                Err(_) => return pending.fail(ProxyError::UpstreamTimeout),
            },
            None => sent.await,
        };
        let (failure, retriable_resp) = match result {
            Err(e) => (Some(ProxyError::Upstream(e)), None),
            Ok(r) if route.retry.statuses.contains(&r.status().as_u16()) => (None, Some(r)),
            Ok(r) => break (r, guard),
        };
        // Another attempt only if one is allowed, another backend exists and the budget agrees.
        let next = (tried.len() < max_attempts)
            .then(|| {
                route
                    .pool(sel.variant_index)
                    .and_then(|p| p.pick(route.balancer, &tried))
            })
            .flatten()
            .filter(|_| route.budget.try_withdraw());
        match (next, retriable_resp, failure) {
            (Some(next), r, f) => {
                backend.observe_failure();
                let m = pending.meta();
                m.attempts.push(Attempt {
                    backend: Arc::clone(&backend.name),
                    span_id: m.trace.client_span,
                    t_sent,
                    t_end: Instant::now(),
                    status: r.as_ref().map(|r| r.status().as_u16()),
                    error: f.as_ref().map_or("upstream_status", ProxyError::kind),
                });
                m.trace.client_span = gw.ids.span_id();
                drop(r);
                drop(guard);
                backend = next;
            }
            // No retry possible: the client gets the backend's own answer…
            (None, Some(r), _) => break (r, guard),
            // … or the gateway's error.
            (None, None, Some(f)) => return pending.fail(f),
            (None, None, None) => return pending.fail(ProxyError::BadUpstreamRequest),
        }
    };
    pending.meta().t_hdr = Some(Instant::now());

    // Phase 5: respond through the meter.
    let (mut rparts, rbody) = resp.into_parts();
    remove_hop_headers(&mut rparts.headers);
    rparts.version = client_version;
    let ctype = rparts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let classify = endpoint.is_some_and(Endpoint::is_openai);
    let framing = framing_for(ctype, classify, gw.limits.max_event_bytes);
    let strip = strip_usage && matches!(framing, Framing::Sse(_));
    if strip {
        rparts.headers.remove(header::CONTENT_LENGTH);
    }
    let variant = Arc::clone(&pending.meta().variant);
    if variant.as_ref() != NONE {
        if let Ok(v) = HeaderValue::try_from(variant.as_ref()) {
            rparts.headers.insert(super::VARIANT_HEADER, v);
        }
    }
    let status = rparts.status.as_u16();
    let opts = MeterOptions {
        classify,
        strip_usage: strip,
        capture_output,
        deadlines: Deadlines {
            first_token: first_token_at,
            idle: nonzero(route.timeouts.idle),
            total: nonzero(route.timeouts.total).map(|d| t0 + d),
        },
    };
    let meter = Meter::new(
        pending.take(),
        status,
        framing,
        opts,
        Arc::clone(&gw.recorder),
        Guards {
            global: permit,
            backend: Some(backend_guard),
        },
    );
    Response::from_parts(rparts, Either::Left(MeteredBody::new(rbody, meter)))
}

fn nonzero(d: Duration) -> Option<Duration> {
    (!d.is_zero()).then_some(d)
}

/// The request carries no body (so it can be sent again as-is).
fn has_no_body(parts: &http::request::Parts) -> bool {
    let length = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok());
    !parts.headers.contains_key(header::TRANSFER_ENCODING) && length.is_none_or(|l| l.trim() == "0")
}

/// How a response body with content type `ctype` is cut into events.
pub(super) fn framing_for(ctype: &str, classify: bool, max_line: usize) -> Framing {
    if ctype.starts_with("text/event-stream") {
        Framing::Sse(SseScanner::new(max_line))
    } else if ctype.starts_with("application/x-ndjson") {
        Framing::Ndjson(NdjsonScanner::new(max_line))
    } else if classify && ctype.starts_with("application/json") {
        Framing::Json {
            parts: Vec::new(),
            len: 0,
        }
    } else {
        Framing::Opaque
    }
}
