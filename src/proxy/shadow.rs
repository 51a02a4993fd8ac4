//! Sends a shadow copy of a request to the shadow variant, reads the answer to the end through
//! a meter (so it is measured like any request, labelled `VARIANT:shadow`), and drops it. Runs
//! as its own task under the shadow budget: the primary never waits for it.

use super::request::remove_hop_headers;
use super::service::{framing_for, Gateway};
use crate::dialect::Endpoint;
use crate::experiment::shadow::{Pair, Shadow, MAX_COMPARED};
use crate::meter::{
    Deadlines, Guards, Meter, MeterOptions, MeteredBody, Outcome, RequestMeta, RequestRecord,
};
use crate::route::Route;
use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Request, Uri, Version};
use http_body_util::{BodyExt, Either, Full};
use std::sync::Arc;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

/// What is copied from the primary request.
#[derive(Debug)]
pub(super) struct Copy {
    pub method: Method,
    pub path_and_query: Option<http::uri::PathAndQuery>,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub model: Option<String>,
    pub stream: bool,
    pub endpoint: Endpoint,
}

/// Header marking shadow requests to the backend.
pub const SHADOW_HEADER: &str = "x-inferscope-shadow";

pub(super) async fn send(
    gw: Arc<Gateway>,
    route: Arc<Route>,
    sh: Arc<Shadow>,
    permit: OwnedSemaphorePermit,
    pair: Arc<Pair>,
    c: Copy,
) {
    let _budget = permit;
    let t0 = Instant::now();
    let path = c
        .path_and_query
        .as_ref()
        .map_or("/", |p| p.path())
        .to_string();
    let mut meta = RequestMeta::new(c.method.clone(), &path);
    meta.t0 = t0;
    meta.request_id = gw.ids.request_id().into();
    meta.route = Arc::clone(&route.name);
    meta.variant = Arc::clone(&sh.label);
    meta.stream = c.stream;
    meta.bytes_in = c.body.len() as u64;
    meta.is_shadow = true;
    meta.shadow_pair = Some(pair);
    if let Some(m) = &c.model {
        meta.model = m.as_str().into();
    }
    gw.recorder.started();
    let fail = |meta: RequestMeta, outcome: Outcome, error: &'static str| {
        gw.recorder.record(RequestRecord::without_body(
            meta,
            0,
            outcome,
            Some(error),
            0,
        ));
    };
    let Some(backend) = route
        .pool(Some(sh.variant_index))
        .and_then(|p| p.pick(route.balancer, &[]))
    else {
        return fail(meta, Outcome::GatewayError, "no_route");
    };
    meta.backend = Arc::clone(&backend.name);
    meta.upstream = Some(Arc::clone(&backend));
    let guard = match backend.admit().await {
        Ok(g) => g,
        Err(_) => return fail(meta, Outcome::Rejected, "backend_queue_full"),
    };
    let mut uri = backend.base.clone().into_parts();
    uri.path_and_query = c.path_and_query;
    let Ok(uri) = Uri::from_parts(uri) else {
        return fail(meta, Outcome::GatewayError, "bad_upstream_request");
    };
    let mut headers = c.headers;
    remove_hop_headers(&mut headers);
    headers.remove(header::HOST);
    headers.remove(header::CONTENT_LENGTH);
    headers.remove("traceparent");
    headers.insert(SHADOW_HEADER, HeaderValue::from_static("1"));
    if let Some(auth) = &backend.authorization {
        headers.insert(header::AUTHORIZATION, auth.clone());
    }
    let mut req = Request::new(Either::Left(Full::new(c.body)));
    *req.method_mut() = c.method;
    *req.uri_mut() = uri;
    *req.version_mut() = Version::HTTP_11;
    *req.headers_mut() = headers;
    let first_token =
        (!route.timeouts.first_token.is_zero()).then(|| t0 + route.timeouts.first_token);
    meta.t_sent = Some(Instant::now());
    let sent = gw.client.request(req);
    let resp = match first_token {
        Some(at) => match tokio::time::timeout_at(at, sent).await {
            Ok(r) => r,
            Err(_) => return fail(meta, Outcome::Timeout, "upstream_timeout"),
        },
        None => sent.await,
    };
    let resp = match resp {
        Ok(r) => r,
        Err(_) => return fail(meta, Outcome::BackendError, "upstream_failed"),
    };
    meta.t_hdr = Some(Instant::now());
    let status = resp.status().as_u16();
    let ctype = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let classify = c.endpoint.is_openai();
    let opts = MeterOptions {
        classify,
        strip_usage: false,
        capture_output: Some(MAX_COMPARED),
        deadlines: Deadlines {
            first_token,
            idle: (!route.timeouts.idle.is_zero()).then_some(route.timeouts.idle),
            total: (!route.timeouts.total.is_zero()).then(|| t0 + route.timeouts.total),
        },
    };
    let framing = framing_for(&ctype, classify, gw.limits.max_event_bytes);
    let guards = Guards {
        global: None,
        backend: Some(guard),
    };
    let meter = Meter::new(
        meta,
        status,
        framing,
        opts,
        Arc::clone(&gw.recorder),
        guards,
    );
    // Read to the end (the meter records it) and discard.
    let _ = MeteredBody::new(resp.into_body(), meter).collect().await;
}
