//! One request through the proxy, phase by phase (pingora's model): `admit` → `read_body` →
//! `route` → `shadow` → `attempt` (the retry loop) → `respond`, each a method of the request's
//! context `Ctx`. A phase that cannot go on returns a `ProxyError`; `fail` turns it into the
//! gateway's answer and marks the record. What the record needs, each phase tells the request's
//! `Annotations`; `MeterLayer` (outside) measures the response and writes the record.
//!
//! A shadow copy goes through the same `attempt_once` and error kinds, measured through the same
//! metering, without a client.

use super::body::{read_whole, PacedBody};
use super::error::ProxyError;
use super::request::{prepare_body, remove_hop_headers, upstream_headers, MAX_JSON_DEPTH};
use super::service::{Gateway, ProxyBody, VARIANT_HEADER};
use super::upstream::{UpstreamRequestBody, UpstreamResponseBody};
use crate::dialect::Endpoint;
use crate::experiment::shadow::MAX_COMPARED;
use crate::facts::{Attempt, Facts};
use crate::meter::{
    Annotations, Deadlines, MeasureOptions, Purpose, RequestMeta, NONE, PURPOSE_HEADER,
};
use crate::route::{Backend, BackendGuard, Route, Router, Selection, Target};
use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{
    header, HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri, Version,
};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tower::retry::budget::Budget as _;

/// The proxy: runs the phases, answers with the gateway's error when one fails.
pub(super) async fn proxy(gw: Arc<Gateway>, req: Request<Incoming>) -> Response<ProxyBody> {
    let (mut cx, body) = Ctx::admit(gw, req);
    match cx.run(body).await {
        Ok(resp) => resp,
        Err(e) => cx.fail(e),
    }
}

/// `x-inferscope-purpose`, parsed once.
const PURPOSE: HeaderName = HeaderName::from_static(PURPOSE_HEADER);

/// A request on its way through the phases.
struct Ctx {
    gw: Arc<Gateway>,
    router: Arc<Router>,
    notes: Annotations,
    t0: Instant,
    method: Method,
    path_and_query: Option<PathAndQuery>,
    client_version: Version,
    /// The client's address (the connection's peer), when the server knows it.
    client: Option<std::net::IpAddr>,
    headers: HeaderMap,
    endpoint: Option<Endpoint>,
    model: Option<String>,
    user: Option<String>,
    stream: bool,
    strip_usage: bool,
    /// The purpose the client declared, where the route honours it (said back in the response).
    declared: Option<Purpose>,
    /// The body of the first attempt (the client's, streamed, when it cannot be held).
    first_body: Option<UpstreamRequestBody>,
    /// The body to send again on a retry: inference bodies are held anyway, a request without a
    /// body has nothing to hold; a streamed body cannot be replayed.
    replay: Option<Bytes>,
    capture_output: Option<usize>,
    /// The rate limit that applies, as it stood at admission (for the response headers).
    rate: Option<crate::access::RateState>,
    /// An HTTP/1.1 request to switch protocols: the client side of the upgrade and its
    /// `Upgrade` value.
    upgrade: Option<(hyper::upgrade::OnUpgrade, HeaderValue)>,
}

impl Ctx {
    /// Phase 1: take the request apart; the layers outside have admitted it and started its
    /// record (`Annotations`).
    fn admit(gw: Arc<Gateway>, mut req: Request<Incoming>) -> (Self, Incoming) {
        let upgrade = super::tunnel::is_upgrade(req.method(), req.version(), req.headers())
            .then(|| req.headers().get(header::UPGRADE).cloned())
            .flatten()
            .map(|v| (hyper::upgrade::on(&mut req), v));
        let (mut parts, body) = req.into_parts();
        // Without `MeterLayer` outside nothing is measured: the notes go nowhere.
        let notes = parts
            .extensions
            .remove::<Annotations>()
            .unwrap_or_else(Annotations::detached);
        let t0 = notes.update(|m| m.t0).unwrap_or_else(Instant::now);
        let endpoint = (parts.method == Method::POST)
            .then(|| Endpoint::from_path(parts.uri.path()))
            .flatten();
        let cx = Self {
            router: gw.routes.load(),
            capture_output: gw.trace.capture_content,
            gw,
            notes,
            t0,
            method: parts.method,
            path_and_query: parts.uri.path_and_query().cloned(),
            client_version: parts.version,
            client: parts
                .extensions
                .get::<crate::server::ClientAddr>()
                .map(|c| c.0.ip()),
            headers: parts.headers,
            endpoint,
            model: None,
            user: None,
            stream: false,
            strip_usage: false,
            declared: None,
            first_body: None,
            replay: None,
            rate: None,
            upgrade,
        };
        (cx, body)
    }

    async fn run(&mut self, body: Incoming) -> Result<Response<ProxyBody>, ProxyError> {
        if self.upgrade.is_some() {
            // Boxed: an upgrade is rare, and every request's future would otherwise be its size.
            return Box::pin(self.tunnel()).await;
        }
        self.authenticate()?;
        self.read_body(body).await?;
        let sel = self.route_admitted()?;
        self.shadow(&sel);
        let (resp, guard) = self.attempt(&sel).await?;
        Ok(self.respond(&sel.route, resp, guard))
    }

    /// An upgraded connection (WebSocket): authenticated, routed and rate-limited like any
    /// request, then handed to `tunnel` on a connection of its own. The record becomes the
    /// session's, written when it ends.
    async fn tunnel(&mut self) -> Result<Response<ProxyBody>, ProxyError> {
        self.authenticate()?;
        let sel = self.route_admitted()?;
        let (client, upgrade) = self.upgrade.take().ok_or(ProxyError::BadUpstreamRequest)?;
        upstream_headers(&mut self.headers, self.client);
        let backend = Arc::clone(&sel.backend);
        let engine = backend.engine_load();
        self.notes.update(|m| {
            m.backend = Arc::clone(&backend.name);
            let facts = Facts::of_mut(m);
            facts.upstream = Some(backend.info.clone());
            facts.engine = engine;
            m.stream = true;
            m.t_sent = Some(Instant::now());
        });
        let guard = backend.admit().await.map_err(ProxyError::Busy)?;
        self.notes.hold(guard);
        let session = self.notes.session().ok_or(ProxyError::BadUpstreamRequest)?;
        let t = &sel.route.timeouts;
        let limits = super::tunnel::Limits {
            idle: nonzero(t.idle),
            until: nonzero(t.total).map(|d| self.t0 + d),
            connect: self.gw.limits.connect_timeout,
            handshake: nonzero(t.first_token),
        };
        let headers = std::mem::take(&mut self.headers);
        let pq = self.path_and_query.clone();
        match super::tunnel::open(
            &backend,
            pq.as_ref(),
            headers,
            upgrade,
            client,
            session,
            limits,
        )
        .await
        {
            Ok(r) => Ok(r),
            Err((e, session)) => {
                // The record tells the observer (an unreachable backend counts against it).
                session.finish(e.status().as_u16(), e.outcome(), Some(e.kind()), 0, 0);
                Ok(e.into_response().map(Either::Right))
            }
        }
    }

    /// Phase 3 (`route`) and the route's rate limit.
    fn route_admitted(&mut self) -> Result<Selection, ProxyError> {
        let sel = self.route()?;
        if let Some(state) = self
            .gw
            .limiter
            .admit_route(&sel.route.name)
            .map_err(ProxyError::RateLimited)?
        {
            // A key's own limit is what its client watches; the route's when it has none.
            self.rate.get_or_insert(state);
        }
        Ok(sel)
    }

    /// Phase 1½: with client keys configured, the request must present one (its name goes into
    /// the record), and the key's rate limit must admit it — before its body is read. The
    /// credential headers then stay behind unless the operator forwards them.
    fn authenticate(&mut self) -> Result<(), ProxyError> {
        let keys = self.gw.keys.load();
        let Some(keys) = keys.as_ref() else {
            return Ok(());
        };
        let addr = self.client;
        if addr.is_some_and(|a| {
            self.gw
                .limiter
                .auth_throttled(a, keys.max_failures_per_minute)
        }) {
            return Err(ProxyError::AuthThrottled);
        }
        let Some(name) = keys.identify(&self.headers) else {
            self.gw.limiter.auth_failed(addr);
            return Err(ProxyError::Unauthorized);
        };
        if !keys.forward_client_key {
            crate::access::Keys::strip(&mut self.headers);
        }
        self.notes
            .update(|m| Facts::of_mut(m).key = Some(Arc::clone(&name)));
        if let Some(slots) = self.gw.slots.as_ref().filter(|s| s.shares_apply()) {
            // A key's share of the slots among the keys holding any (its own slot is taken
            // already). A key refused for want of room is not known (the refusal comes before
            // authentication), so keys share by what they hold, not by who waits.
            let share = slots
                .by_key
                .admit_among_holders(Arc::clone(&name), slots.max(), slots.pressured_before_one())
                .ok_or(ProxyError::ClientShare)?;
            self.notes.hold(share);
        }
        self.rate = self
            .gw
            .limiter
            .admit_key(&name)
            .map_err(ProxyError::RateLimited)?;
        Ok(())
    }

    /// Phase 2: read the body of known inference endpoints (bounded) and prepare it, and that of
    /// the tokenizer endpoints for their `model`; stream everything else.
    async fn read_body(&mut self, body: Incoming) -> Result<(), ProxyError> {
        let Some(ep) = self.endpoint else {
            let path = self.path_and_query.as_ref().map_or("/", |p| p.path());
            if self.method == Method::POST && routes_by_model(path) {
                // Not measured as inference, but routed like it: the body's `model` picks the
                // route (and the variant header the experiment's arm), so an eval's `/tokenize`
                // reaches the backend that will score the tokens.
                let bytes = self.read_held(body).await?;
                self.model = model_of(&bytes);
                let bytes_in = bytes.len() as u64;
                let model = self.model.as_deref().map(|m| {
                    crate::util::label::bounded(m, self.gw.limits.max_model_name_bytes).into()
                });
                self.notes.update(|m| {
                    m.bytes_in = bytes_in;
                    if let Some(model) = model {
                        m.model = model;
                    }
                });
                self.replay = Some(bytes.clone());
                self.first_body = Some(Either::Left(Full::new(bytes)));
                return Ok(());
            }
            if has_no_body(&self.headers) {
                let empty = Bytes::new();
                self.first_body = Some(Either::Left(Full::new(empty.clone())));
                self.replay = Some(empty);
            } else {
                self.first_body = Some(Either::Right(Box::new(PacedBody::new(
                    body,
                    self.gw.pace(),
                ))));
            }
            return Ok(());
        };
        let bytes = self.read_held(body).await?;
        let limits = &self.gw.limits;
        let read = bytes.len() as u64;
        let mut p = prepare_body(bytes, ep, self.gw.trace.capture_content)
            .map_err(|_| ProxyError::JsonTooDeep(MAX_JSON_DEPTH))?;
        p.params.operation = Some(ep.operation());
        if p.body.len() as u64 != read {
            self.headers.remove(header::CONTENT_LENGTH);
        }
        self.notes.update(|m| {
            m.bytes_in = read;
            m.stream = p.stream;
            m.params = std::mem::take(&mut p.params);
            if let Some(model) = &p.model {
                m.model = crate::util::label::bounded(model, limits.max_model_name_bytes).into();
            }
        });
        self.replay = Some(p.body.clone());
        self.first_body = Some(Either::Left(Full::new(p.body)));
        self.model = p.model;
        self.user = p.user;
        self.stream = p.stream;
        self.strip_usage = p.strip_usage;
        Ok(())
    }

    /// Reads a whole request body within the limits (size, pace, the global buffer budget). It is
    /// kept for retries until the response ends, so it is held against the budget until then.
    async fn read_held(&mut self, body: Incoming) -> Result<Bytes, ProxyError> {
        let declared = self
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        let (bytes, reservation) = read_whole(
            body,
            self.gw.limits.max_request_body_bytes,
            declared,
            self.gw.pace(),
            &self.gw.body_budget,
        )
        .await?;
        self.notes.hold(reservation);
        Ok(bytes)
    }

    /// Phase 3: pick the route, the experiment's variant and a backend.
    fn route(&mut self) -> Result<Selection, ProxyError> {
        let path = self.path_and_query.as_ref().map_or("/", |p| p.path());
        let sel = self
            .router
            .select(
                self.model.as_deref(),
                self.user.as_deref(),
                path,
                &self.headers,
            )
            .ok_or(ProxyError::NoRoute)?;
        sel.route.budget.deposit();
        // A purpose is taken from the client only where the route allows it.
        let purpose = sel
            .route
            .purpose_header
            .then(|| self.headers.get(PURPOSE))
            .flatten()
            .and_then(|v| Purpose::declared(v.as_bytes()));
        // So is the benchmark run it belongs to.
        let run = sel
            .route
            .purpose_header
            .then(|| self.headers.get(crate::stats::runs::RUN_HEADER))
            .flatten()
            .and_then(|v| crate::stats::runs::run_id(v.as_bytes()));
        self.notes.update(|m| {
            m.route = Arc::clone(&sel.route.name);
            m.variant = Arc::clone(&sel.variant);
            m.variant_forced = sel.forced;
            m.slo = sel.route.slo;
            if let Some(p) = purpose {
                m.purpose = p;
            }
            if run.is_some() {
                Facts::of_mut(m).run = run;
            }
        });
        self.declared = purpose;
        Ok(sel)
    }

    /// Phase 3½: maybe send a copy to the experiment's shadow variant; never awaited.
    fn shadow(&mut self, sel: &Selection) {
        let (Target::Experiment(x), Some(body), Some(endpoint)) =
            (&sel.route.target, &self.replay, self.endpoint)
        else {
            return;
        };
        let Some(sh) = x.shadow.as_ref().filter(|sh| *sh.variant != *sel.variant) else {
            return;
        };
        let Some((permit, pair)) = sh.admit() else {
            return;
        };
        self.notes
            .update(|m| Facts::of_mut(m).shadow_pair = Some(pair));
        self.capture_output = Some(
            self.capture_output
                .map_or(MAX_COMPARED, |c| c.max(MAX_COMPARED)),
        );
        let copy = ShadowCopy {
            method: self.method.clone(),
            client: self.client,
            path_and_query: self.path_and_query.clone(),
            headers: self.headers.clone(),
            body: body.clone(),
            model: self.model.clone(),
            stream: self.stream,
            endpoint,
            pair,
            variant_index: sh.variant_index,
            label: Arc::clone(&sh.label),
        };
        tokio::spawn(copy.send(Arc::clone(&self.gw), Arc::clone(&sel.route), permit));
    }

    /// Phase 4: send upstream; fail over to another backend before any response byte reached
    /// the client when that is safe (the body can be sent again, attempts and the retry budget
    /// allow).
    async fn attempt(
        &mut self,
        sel: &Selection,
    ) -> Result<(Response<UpstreamResponseBody>, BackendGuard), ProxyError> {
        let route = &sel.route;
        upstream_headers(&mut self.headers, self.client);
        if self.endpoint.is_some() {
            // Measured endpoints are asked for unencoded bytes: the meter reads them and the
            // usage chunk can be cut (a gzip stream would be neither). A backend that encodes
            // anyway is read through a decoded copy (`Meter::set_encoding`).
            self.headers.insert(
                header::ACCEPT_ENCODING,
                HeaderValue::from_static("identity"),
            );
        }
        let first_token_at = nonzero(route.timeouts.first_token).map(|d| self.t0 + d);
        let max_attempts = if self.replay.is_some() {
            1 + route.retry.attempts as usize
        } else {
            1
        };
        let mut backend = Arc::clone(&sel.backend);
        let mut tried: Vec<Arc<str>> = Vec::new();
        loop {
            tried.push(Arc::clone(&backend.name));
            let engine = backend.engine_load();
            self.notes.update(|m| {
                m.backend = Arc::clone(&backend.name);
                let facts = Facts::of_mut(m);
                facts.upstream = Some(backend.info.clone());
                facts.engine = engine;
                if let Some(spans) = &backend.engine_spans {
                    m.extensions.insert(Arc::clone(spans));
                }
            });
            let guard = backend.admit().await.map_err(ProxyError::Busy)?;
            let body = match (self.first_body.take(), &self.replay) {
                (Some(b), _) => b,
                (None, Some(bytes)) => Either::Left(Full::new(bytes.clone())),
                (None, None) => return Err(ProxyError::BadUpstreamRequest),
            };
            // An engine that sends its spans back is told the trace is sampled: a tracer
            // following its parent records nothing otherwise.
            let engine_spans = backend.engine_spans.is_some();
            let traceparent = (self.gw.trace.enabled || engine_spans)
                .then(|| {
                    self.notes
                        .update(|m| m.trace.upstream_traceparent_sampled(engine_spans))
                })
                .flatten();
            if let (true, Some(expect)) = (engine_spans, &self.gw.expect_span) {
                if let Some((trace, span)) = self
                    .notes
                    .update(|m| (m.trace.trace_id, m.trace.client_span))
                {
                    (expect.0)(trace, span);
                }
            }
            let (t_sent, result) = attempt_once(
                &self.gw,
                &backend,
                &self.method,
                self.path_and_query.as_ref(),
                self.headers.clone(),
                body,
                traceparent,
                first_token_at,
                &self.notes,
            )
            .await;
            let rate_limited =
                matches!(&result, Ok(r) if r.status() == StatusCode::TOO_MANY_REQUESTS);
            if let (true, Ok(r)) = (rate_limited, &result) {
                backend.mark_rate_limited(retry_after(r.headers()));
            }
            let (failure, retriable) = match result {
                // No head before the first-token deadline: answer at once, no retry.
                Err(e @ ProxyError::UpstreamTimeout) => return Err(e),
                Err(e) => (Some(e), None),
                // A rate-limited backend: another one may have room (failover where allowed).
                Ok(r) if rate_limited || route.retry.statuses.contains(&r.status().as_u16()) => {
                    (None, Some(r))
                }
                Ok(r) => return Ok((r, guard)),
            };
            // Another attempt only if one is allowed, another backend exists and the budget
            // agrees.
            let next = (tried.len() < max_attempts)
                .then(|| {
                    route
                        .pool(sel.variant_index)
                        .and_then(|p| p.pick(route.balancer, &tried))
                })
                .flatten()
                .filter(|_| route.budget.withdraw());
            match (next, retriable, failure) {
                (Some(next), r, f) => {
                    if !rate_limited {
                        backend.observe_failure();
                    }
                    let span = self.gw.metering.ids().span_id();
                    self.notes.update(|m| {
                        let span_id = m.trace.client_span;
                        Facts::of_mut(m).attempts.push(Attempt {
                            backend: Arc::clone(&backend.name),
                            span_id,
                            t_sent,
                            t_end: Instant::now(),
                            status: r.as_ref().map(|r| r.status().as_u16()),
                            error: f.as_ref().map_or("upstream_status", ProxyError::kind),
                        });
                        m.trace.client_span = span;
                    });
                    drop(r);
                    drop(guard);
                    backend = next;
                }
                // No retry possible: the client gets the backend's own answer…
                (None, Some(r), _) => return Ok((r, guard)),
                // … or the gateway's error.
                (None, None, Some(f)) => return Err(f),
                (None, None, None) => return Err(ProxyError::BadUpstreamRequest),
            }
        }
    }

    /// Phase 5: hand the backend's response on, telling the meter how to read it.
    fn respond(
        &mut self,
        route: &Route,
        resp: Response<UpstreamResponseBody>,
        guard: BackendGuard,
    ) -> Response<ProxyBody> {
        let (mut parts, body) = resp.into_parts();
        let rx = body.rx_cell();
        self.notes.update(|m| m.upstream_rx = rx);
        remove_hop_headers(&mut parts.headers);
        parts.version = self.client_version;
        let sse = parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|c| c.starts_with("text/event-stream"));
        let dialect = self.endpoint.and_then(Endpoint::dialect);
        let encoded = parts
            .headers
            .get(header::CONTENT_ENCODING)
            .is_some_and(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"));
        let strip = self.strip_usage && sse && dialect.is_some() && !encoded;
        if strip {
            parts.headers.remove(header::CONTENT_LENGTH);
        }
        // The arm that served is named to the client only where the experiment says so, or
        // when the client chose it: a client that knows its arm can steer the comparison.
        let expose =
            matches!(&route.target, crate::route::Target::Experiment(x) if x.expose_variant);
        let variant = self
            .notes
            .update(|m| (expose || m.variant_forced).then(|| Arc::clone(&m.variant)))
            .flatten();
        if let Some(v) = variant.filter(|v| v.as_ref() != NONE) {
            if let Ok(v) = HeaderValue::try_from(v.as_ref()) {
                parts.headers.insert(VARIANT_HEADER, v);
            }
        }
        // The client's tools learn that their purpose was taken (or, without it, that their
        // requests counted as live traffic).
        if let Some(p) = self.declared {
            parts
                .headers
                .insert(PURPOSE, HeaderValue::from_static(p.as_str()));
        }
        let mut how = MeasureOptions::default();
        how.dialect = dialect;
        how.shapes = Some(Arc::clone(&guard.backend().shapes));
        how.strip_usage = strip;
        how.capture_output = self.capture_output;
        how.deadlines = deadlines(route, self.t0);
        self.notes.measure(how);
        self.notes.hold(guard);
        if let Some(rate) = &self.rate {
            rate.write(&mut parts.headers);
        }
        Response::from_parts(parts, Either::Left(body))
    }

    /// The gateway answers itself: the error's response, and the record marked with its kind.
    fn fail(&self, e: ProxyError) -> Response<ProxyBody> {
        self.notes.refuse(e.outcome(), e.kind());
        e.into_response().map(Either::Right)
    }
}

/// One upstream attempt: the request built for `backend` (its base URL, key, our trace context),
/// sent, and its response head awaited until `deadline`. Returns when it was sent.
#[allow(clippy::too_many_arguments)]
async fn attempt_once(
    gw: &Gateway,
    backend: &Backend,
    method: &Method,
    path_and_query: Option<&PathAndQuery>,
    mut headers: HeaderMap,
    body: UpstreamRequestBody,
    traceparent: Option<String>,
    deadline: Option<Instant>,
    notes: &Annotations,
) -> (Instant, Result<Response<UpstreamResponseBody>, ProxyError>) {
    let mut uri = backend.base.clone().into_parts();
    uri.path_and_query = backend.upstream_path(path_and_query);
    let Ok(uri) = Uri::from_parts(uri) else {
        return (Instant::now(), Err(ProxyError::BadUpstreamRequest));
    };
    if let Some((name, value)) = &backend.authorization {
        headers.insert(name.clone(), value.clone());
    }
    // The backend's spans join this trace as children of this attempt's CLIENT span.
    if let Some(v) = traceparent.and_then(|t| HeaderValue::try_from(t).ok()) {
        headers.insert(crate::meter::trace::TRACEPARENT, v);
    }
    let mut up = Request::new(body);
    *up.method_mut() = method.clone();
    *up.uri_mut() = uri;
    *up.version_mut() = Version::HTTP_11;
    *up.headers_mut() = headers;
    let t_sent = Instant::now();
    notes.update(|m| m.t_sent = Some(t_sent));
    let sent = gw.client.request(
        up,
        backend.request_tls(),
        backend.http2,
        backend.idle_timeout,
    );
    let result = match deadline {
        Some(at) => match tokio::time::timeout_at(at, sent).await {
            Ok(r) => r.map_err(upstream_error),
            Err(_) => Err(ProxyError::UpstreamTimeout),
        },
        None => sent.await.map_err(upstream_error),
    };
    (t_sent, result)
}

/// An attempt's failure: the client's own when its streamed body was too slow, else the
/// backend's.
fn upstream_error(e: super::upstream::UpstreamError) -> ProxyError {
    if crate::util::errors::find::<super::body::TooSlow>(&e).is_some() {
        return ProxyError::BodyTimeout;
    }
    ProxyError::Upstream(e)
}

/// What is copied from a request to its shadow variant.
#[derive(Debug)]
struct ShadowCopy {
    method: Method,
    client: Option<std::net::IpAddr>,
    path_and_query: Option<PathAndQuery>,
    headers: HeaderMap,
    body: Bytes,
    model: Option<String>,
    stream: bool,
    endpoint: Endpoint,
    pair: u64,
    variant_index: usize,
    label: Arc<str>,
}

impl ShadowCopy {
    /// Sends the copy, reads the answer to the end through a meter (measured like any request,
    /// labelled `VARIANT:shadow`) and drops it. Runs as its own task under the shadow budget
    /// (`permit`): the primary never waits for it.
    async fn send(self, gw: Arc<Gateway>, route: Arc<Route>, permit: OwnedSemaphorePermit) {
        let path = self.path_and_query.as_ref().map_or("/", |p| p.path());
        let mut meta = RequestMeta::new(self.method.clone(), path);
        meta.request_id = gw.metering.ids().request_id();
        meta.route = Arc::clone(&route.name);
        meta.variant = Arc::clone(&self.label);
        meta.slo = route.slo;
        meta.stream = self.stream;
        meta.bytes_in = self.body.len() as u64;
        meta.purpose = crate::meter::Purpose::Shadow;
        Facts::of_mut(&mut meta).shadow_pair = Some(self.pair);
        if let Some(m) = &self.model {
            meta.model = crate::util::label::bounded(m, gw.limits.max_model_name_bytes).into();
        }
        let t0 = meta.t0;
        let notes = gw.metering.start_with(meta);
        notes.hold(permit);
        match self.attempt(&gw, &route, &notes, t0).await {
            Ok((resp, guard)) => {
                let mut how = MeasureOptions::default();
                how.dialect = self.endpoint.dialect();
                how.shapes = Some(Arc::clone(&guard.backend().shapes));
                how.capture_output = Some(MAX_COMPARED);
                how.deadlines = deadlines(&route, t0);
                notes.measure(how);
                notes.hold(guard);
                // Read to the end (the meter records it) and discard.
                let _ = notes.meter_response(resp).into_body().collect().await;
            }
            Err(e) => notes.finish_without_response(e.status().as_u16(), e.outcome(), e.kind()),
        }
    }

    /// The copy's single attempt, through the same steps as a client's.
    async fn attempt(
        &self,
        gw: &Gateway,
        route: &Route,
        notes: &Annotations,
        t0: Instant,
    ) -> Result<(Response<UpstreamResponseBody>, BackendGuard), ProxyError> {
        let backend = route
            .pool(Some(self.variant_index))
            .and_then(|p| p.pick(route.balancer, &[]))
            .ok_or(ProxyError::NoRoute)?;
        let engine = backend.engine_load();
        notes.update(|m| {
            m.backend = Arc::clone(&backend.name);
            let facts = Facts::of_mut(m);
            facts.upstream = Some(backend.info.clone());
            facts.engine = engine;
        });
        let guard = backend.admit().await.map_err(ProxyError::Busy)?;
        let mut headers = self.headers.clone();
        upstream_headers(&mut headers, self.client);
        headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
        headers.remove(header::CONTENT_LENGTH);
        headers.remove(crate::meter::trace::TRACEPARENT);
        headers.insert(super::SHADOW_HEADER, HeaderValue::from_static("1"));
        let first_token_at = nonzero(route.timeouts.first_token).map(|d| t0 + d);
        let (_, result) = attempt_once(
            gw,
            &backend,
            &self.method,
            self.path_and_query.as_ref(),
            headers,
            Either::Left(Full::new(self.body.clone())),
            None,
            first_token_at,
            notes,
        )
        .await;
        Ok((result?, guard))
    }
}

/// How long a backend that answered 429 rests: its `Retry-After` in seconds (an HTTP date, or
/// none, counts as 1 s), at most a minute.
fn retry_after(h: &HeaderMap) -> Duration {
    let secs = h
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(1);
    Duration::from_secs(secs.clamp(1, 60))
}

/// A route's response deadlines for a request that arrived at `t0`.
fn deadlines(route: &Route, t0: Instant) -> Deadlines {
    let mut d = Deadlines::default();
    d.first_token = nonzero(route.timeouts.first_token).map(|d| t0 + d);
    d.idle = nonzero(route.timeouts.idle);
    d.total = nonzero(route.timeouts.total).map(|d| t0 + d);
    d
}

fn nonzero(d: Duration) -> Option<Duration> {
    (!d.is_zero()).then_some(d)
}

/// The request carries no body (so it can be sent again as-is).
fn has_no_body(headers: &HeaderMap) -> bool {
    let length = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok());
    !headers.contains_key(header::TRANSFER_ENCODING) && length.is_none_or(|l| l.trim() == "0")
}

/// Paths that are not inference but belong to a model: vLLM's (and SGLang's) tokenizer endpoints,
/// routed by their body's `model` like inference so they reach the model's backend.
fn routes_by_model(path: &str) -> bool {
    matches!(
        path.trim_end_matches('/'),
        "/tokenize" | "/detokenize" | "/v1/tokenize" | "/v1/detokenize"
    )
}

/// The `model` of a JSON body, if it has one.
fn model_of(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Model {
        model: Option<String>,
    }
    serde_json::from_slice::<Model>(body).ok()?.model
}
