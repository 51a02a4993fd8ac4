//! The admin plane (its own listener; API clients never reach it): `GET /metrics` (Prometheus),
//! `GET /stats` (JSON), `GET /experiments` (A/B comparisons), `POST /feedback` (quality signals),
//! `POST /experiments/reset` (guardrail reset), `GET /healthz` (the process is up), `GET /readyz`
//! (routes can be served and the gateway is not draining), `GET /` (the dashboard: one page
//! embedded in the binary that polls `/stats`, `/experiments` and `/metrics`), and an OTLP trace
//! receiver for engines' spans (`POST /v1/traces`, gRPC `TraceService/Export`: `otlp`).
//!
//! The routes are an axum [`router`]; `app` serves it with the same accept loop as the data plane.

mod otlp;

pub use otlp::Receiver;

use crate::recorder::Recorder;
use crate::route::Router;
use crate::stats::{write_prometheus, Scalar};
use crate::util::prometheus::{Labels, Writer};
use axum::extract::State;
use axum::response::IntoResponse as _;
use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Reload outcomes, shown in `/metrics`.
#[derive(Debug, Default)]
pub struct ReloadCounters {
    /// Reloads applied.
    pub ok: std::sync::atomic::AtomicU64,
    /// Reloads rejected.
    pub failed: std::sync::atomic::AtomicU64,
    /// Listener certificates reloaded.
    pub tls_ok: std::sync::atomic::AtomicU64,
    /// Listener certificate reloads rejected (the running certificate kept serving).
    pub tls_failed: std::sync::atomic::AtomicU64,
}

/// What the admin endpoints read.
#[derive(Debug)]
pub struct AdminState {
    /// Stats and counters.
    pub recorder: Arc<Recorder>,
    /// Requests in flight (the data plane's metering).
    pub metering: Arc<crate::meter::Metering>,
    /// The current router (readiness, backend health, experiments).
    pub routes: Arc<crate::route::RouterSlot>,
    /// Where feedback reaches the guardrails.
    pub observer: Arc<crate::route::Observer>,
    /// Config reloads that succeeded and failed.
    pub reloads: Arc<ReloadCounters>,
    /// False once draining has begun.
    pub accepting: Arc<AtomicBool>,
    /// The data plane's connection counters.
    pub connections: Arc<crate::server::ConnCounters>,
    /// The admin listener's own connection counters (its TLS handshake failures are shown).
    pub admin_connections: Arc<crate::server::ConnCounters>,
    /// Bearer token every endpoint but `/healthz` and `/readyz` requires, when set.
    pub token: Option<String>,
    /// Per-key counters and unauthorized requests.
    pub limiter: Arc<crate::access::Limiter>,
    /// The admin listener's bound address and the extra `Host` names allowed (DNS rebinding).
    pub hosts: (std::net::SocketAddr, Vec<String>),
    /// How late the gateway's timers fire.
    pub heartbeat: Arc<crate::clock::Heartbeat>,
    /// Requests are timed from kernel receive stamps.
    pub kernel_clock: bool,
    /// The OTLP receiver's turns and counters.
    pub receiver: Receiver,
    /// Failed admin token checks per address (guessing is throttled and logged).
    pub token_failures: crate::access::FailedChecks,
}

/// Failed admin token checks an address may make a minute; past them its requests are refused
/// (429) without a check until the minute ends.
pub const TOKEN_FAILURES_PER_MINUTE: u32 = 30;

/// Whether `host` (a `Host` header or h2 authority) names this listener: a loopback address or
/// `localhost`, the listen IP (any IP when bound to all interfaces), or a configured name. A
/// rebinding attack reaches the listener under a name of the attacker's: refused.
pub fn host_allowed(host: &str, listen: std::net::SocketAddr, allowed: &[String]) -> bool {
    let Ok(auth) = host.parse::<http::uri::Authority>() else {
        return false;
    };
    let name = auth.host().trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = name.parse::<std::net::IpAddr>() {
        return ip.is_loopback() || ip == listen.ip() || listen.ip().is_unspecified();
    }
    name.eq_ignore_ascii_case("localhost") || allowed.iter().any(|a| a.eq_ignore_ascii_case(name))
}

/// Compares without stopping at the first difference (the time taken does not tell how much of a
/// guessed token was right).
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for (i, x) in a.iter().enumerate() {
        diff |= x ^ b.get(i).copied().unwrap_or(0);
    }
    diff == 0
}

/// Why a request's token was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No token, or not the admin token.
    Unauthorized,
    /// Its address failed `TOKEN_FAILURES_PER_MINUTE` checks this minute: not checked.
    Throttled,
}

/// Probes stay open (kubelets and load balancers carry no token), and so does the dashboard page
/// (static: a browser cannot send a bearer token when navigating; the page asks for the token
/// and sends it with every request for data); the rest needs the token. Failed checks are
/// counted per address: past `TOKEN_FAILURES_PER_MINUTE` the address is refused unchecked for
/// the rest of the minute, and the gateway's log says so (at most every 10 s).
pub(crate) fn check_token<B>(state: &AdminState, req: &Request<B>) -> Result<(), Refusal> {
    let Some(token) = &state.token else {
        return Ok(());
    };
    if matches!(
        req.uri().path(),
        "/healthz" | "/readyz" | "/" | "/dashboard"
    ) {
        return Ok(());
    }
    let peer = req
        .extensions()
        .get::<crate::server::ClientAddr>()
        .map(|a| a.0.ip());
    if peer.is_some_and(|a| state.token_failures.throttled(a, TOKEN_FAILURES_PER_MINUTE)) {
        return Err(Refusal::Throttled);
    }
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| crate::access::bearer_credentials(v.as_bytes()));
    if given.is_some_and(|given| same_secret(given.trim().as_bytes(), token.as_bytes())) {
        return Ok(());
    }
    state
        .token_failures
        .failed(peer, "admin requests without the admin token");
    Err(Refusal::Unauthorized)
}

/// Whether the request names this listener as its `Host` (DNS rebinding). Machines' paths
/// (probes, Prometheus) may name it as they like.
pub(crate) fn host_ok<B>(state: &AdminState, req: &Request<B>) -> bool {
    if matches!(req.uri().path(), "/healthz" | "/readyz" | "/metrics") {
        return true;
    }
    let host = req
        .uri()
        .authority()
        .map(|a| a.as_str().to_owned())
        .or_else(|| {
            req.headers()
                .get(header::HOST)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        });
    host.is_none_or(|h| host_allowed(&h, state.hosts.0, &state.hosts.1))
}

/// The dashboard's Content-Security-Policy: its one inline script runs because the policy names
/// the script's SHA-256, so no other inline script (an injected one included) can; computed once.
fn dashboard_policy(page: &str) -> HeaderValue {
    static POLICY: std::sync::OnceLock<HeaderValue> = std::sync::OnceLock::new();
    POLICY
        .get_or_init(|| {
            use base64::Engine as _;
            let hashes: String = page
                .split("<script>")
                .skip(1)
                .filter_map(|s| s.split_once("</script>").map(|(body, _)| body))
                .map(|body| {
                    let d = ring::digest::digest(&ring::digest::SHA256, body.as_bytes());
                    let b = base64::engine::general_purpose::STANDARD.encode(d.as_ref());
                    format!(" 'sha256-{b}'")
                })
                .collect();
            HeaderValue::try_from(format!(
                "default-src 'none'; script-src{hashes}; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'"
            ))
            .unwrap_or(HeaderValue::from_static("default-src 'none'"))
        })
        .clone()
}

/// The dashboard page: self-contained (its script and styles inline, no other origin), allowed
/// to talk to this listener only, never framed.
fn dashboard() -> Response<Full<Bytes>> {
    const PAGE: &str = include_str!("dashboard.html");
    let mut r = reply(StatusCode::OK, "text/html; charset=utf-8", PAGE);
    let h = r.headers_mut();
    h.insert(header::CONTENT_SECURITY_POLICY, dashboard_policy(PAGE));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    r
}

/// Whether the query string has `key=value`.
fn query_has(uri: &http::Uri, key: &str, value: &str) -> bool {
    uri.query().is_some_and(|q| {
        q.split('&')
            .any(|kv| kv.split_once('=') == Some((key, value)))
    })
}

/// A JSON error body.
fn json_error(status: StatusCode, msg: &str) -> Response<Full<Bytes>> {
    reply(
        status,
        "application/json",
        serde_json::json!({"error": {"message": msg}}).to_string(),
    )
}

fn reply(status: StatusCode, ctype: &'static str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// The admin API as an axum `Router`: the pages behind one guard (token, `Host`, JSON for state
/// changes), the OTLP receivers behind the same token and `Host` checks made by the receiver
/// itself (a gRPC client needs its refusal as a gRPC status).
pub fn router(state: Arc<AdminState>) -> axum::Router {
    use axum::routing::{get, post};
    let pages = axum::Router::new()
        .route("/", get(page))
        .route("/dashboard", get(page))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/stats", get(stats))
        .route("/stats/runs/{id}", get(run_stats))
        .route("/metrics", get(metrics))
        .route("/experiments", get(experiments))
        .route("/feedback", post(feedback))
        .route("/experiments/reset", post(reset))
        .route("/experiments/quality", post(quality))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            guard,
        ));
    let receivers = axum::Router::new()
        .route(crate::telemetry::receive::HTTP_PATH, post(otlp::receive))
        .route(crate::telemetry::receive::GRPC_PATH, post(otlp::receive))
        .method_not_allowed_fallback(method_not_allowed);
    pages.merge(receivers).with_state(state)
}

/// What every page passes before its handler: the admin token (where one is set), a `Host` that
/// names this listener (DNS rebinding; machines' paths excepted), and for a state change a JSON
/// body (which a browser cannot send cross-site without a preflight).
async fn guard(
    State(state): State<Arc<AdminState>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    match check_token(&state, &req) {
        Ok(()) => {}
        Err(Refusal::Throttled) => {
            let mut r = json_error(
                StatusCode::TOO_MANY_REQUESTS,
                "too many failed admin token checks from this address: wait a minute",
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("60"));
            return r.into_response();
        }
        Err(Refusal::Unauthorized) => {
            let mut r = json_error(
                StatusCode::UNAUTHORIZED,
                "the admin API needs Authorization: Bearer <admin token>",
            );
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return r.into_response();
        }
    }
    // Machines (probes, Prometheus) name the listener as they like; the pages a browser can be
    // tricked into reading need a Host that is ours.
    if !host_ok(&state, &req) {
        return json_error(
            StatusCode::MISDIRECTED_REQUEST,
            "this Host is not the admin listener's: add it to admin.allowed_hosts",
        )
        .into_response();
    }
    if req.method() == Method::POST {
        let json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().starts_with("application/json"));
        if !json {
            return json_error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "send Content-Type: application/json",
            )
            .into_response();
        }
    }
    next.run(req).await
}

async fn page() -> Response<Full<Bytes>> {
    dashboard()
}

async fn healthz() -> Response<Full<Bytes>> {
    reply(StatusCode::OK, "text/plain", "ok\n")
}

async fn not_found() -> Response<Full<Bytes>> {
    reply(
        StatusCode::NOT_FOUND,
        "text/plain",
        "not found: try / (the dashboard), /stats, /metrics, /experiments, /healthz, /readyz\n",
    )
}

async fn method_not_allowed() -> Response<Full<Bytes>> {
    reply(
        StatusCode::METHOD_NOT_ALLOWED,
        "text/plain",
        "method not allowed\n",
    )
}

async fn readyz(State(state): State<Arc<AdminState>>) -> Response<Full<Bytes>> {
    if !state.accepting.load(Ordering::Relaxed) {
        reply(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "draining\n")
    } else if !state.routes.load().ready() {
        reply(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "a route has no backend\n",
        )
    } else {
        reply(StatusCode::OK, "text/plain", "ready\n")
    }
}

async fn experiments(State(state): State<Arc<AdminState>>) -> Response<Full<Bytes>> {
    // Bootstrap intervals take a moment: off the runtime's worker threads.
    let router = state.routes.load();
    let rec = Arc::clone(&state.recorder);
    let doc = tokio::task::spawn_blocking(move || experiments_json(&router, &rec))
        .await
        .unwrap_or_else(|_| "null".to_string());
    reply(StatusCode::OK, "application/json", doc)
}

/// `GET /stats`: the statistics document and beside it the gateway's own state; with
/// `?format=hdr`, every histogram whole (`stats::hdr`).
/// `/stats/runs/{id}`: the figures of one benchmark run's requests (`x-inferscope-run`).
async fn run_stats(
    State(state): State<Arc<AdminState>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response<Full<Bytes>> {
    match state.recorder.runs.get(&id) {
        Some(t) => reply(
            StatusCode::OK,
            "application/json",
            serde_json::to_string(&t).unwrap_or_default(),
        ),
        None => json_error(
            StatusCode::NOT_FOUND,
            "no such run: the gateway keeps the 16 newest runs, tagged x-inferscope-run on a route with purpose_header: true",
        ),
    }
}

async fn stats(State(state): State<Arc<AdminState>>, uri: http::Uri) -> Response<Full<Bytes>> {
    if query_has(&uri, "format", "hdr") {
        // Compressing every histogram takes milliseconds: off the worker threads.
        let snap = state.recorder.stats.snapshot();
        let doc = tokio::task::spawn_blocking(move || {
            serde_json::to_string(&crate::stats::hdr::export(&snap)).unwrap_or_default()
        })
        .await
        .unwrap_or_default();
        return reply(StatusCode::OK, "application/json", doc);
    }
    /// `/stats`: the statistics document, and beside it the gateway's own state.
    #[derive(serde::Serialize)]
    struct Doc {
        #[serde(flatten)]
        stats: crate::stats::StatsDoc,
        in_flight: i64,
        access_log_dropped: u64,
        backends: serde_json::Value,
        keys: serde_json::Value,
        instrument: serde_json::Value,
    }
    let router = state.routes.load();
    let snap = state.recorder.stats.snapshot();
    let doc = Doc {
        stats: snap.doc(),
        in_flight: state.metering.in_flight(),
        access_log_dropped: state.recorder.log.dropped(),
        backends: backend_json(&router, &snap),
        keys: keys_json(&state.limiter),
        instrument: instrument_json(&state),
    };
    reply(
        StatusCode::OK,
        "application/json",
        serde_json::to_string(&doc).unwrap_or_default(),
    )
}

/// `GET /metrics`: Prometheus text, or protobuf with native histograms where the scraper asks.
async fn metrics(
    State(state): State<Arc<AdminState>>,
    headers: http::HeaderMap,
) -> Response<Full<Bytes>> {
    let proto = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(crate::util::prometheus::accepts_protobuf);
    // Milliseconds of CPU with many groups (native histograms most): off the runtime's worker
    // threads.
    let router = state.routes.load();
    let rendered = tokio::task::spawn_blocking(move || metrics_body(&state, &router, proto)).await;
    match rendered {
        Ok((ctype, body)) => reply(StatusCode::OK, ctype, body),
        Err(_) => json_error(StatusCode::INTERNAL_SERVER_ERROR, "rendering failed"),
    }
}

/// The whole Prometheus exposition (text, or protobuf with native histograms): the stats series,
/// gateway-wide counters and gauges, backend and guardrail state.
fn metrics_body(state: &AdminState, router: &Router, protobuf: bool) -> (&'static str, Bytes) {
    use std::sync::atomic::Ordering::Relaxed;
    let rec = &state.recorder;
    let gauge = |name, help, value: f64| Scalar {
        name,
        kind: "gauge",
        help,
        value,
    };
    let counter = |name, help, value: u64| Scalar {
        name,
        kind: "counter",
        help,
        value: value as f64,
    };
    let ready = state.accepting.load(Relaxed) && router.ready();
    let mut scalars = vec![
        gauge(
            "inferscope_in_flight_requests",
            "Requests started and not yet finished.",
            state.metering.in_flight() as f64,
        ),
        gauge(
            "inferscope_ready",
            "1 when the gateway accepts traffic and every route has a backend.",
            f64::from(u8::from(ready)),
        ),
        counter(
            "inferscope_config_reloads_total",
            "Config reloads applied (SIGHUP or a change of the file).",
            state.reloads.ok.load(Relaxed),
        ),
        counter(
            "inferscope_config_reload_failures_total",
            "Config reloads rejected (invalid config); the previous config kept serving.",
            state.reloads.failed.load(Relaxed),
        ),
        counter(
            "inferscope_tls_reloads_total",
            "Listener certificates reloaded (SIGHUP or a change of a file).",
            state.reloads.tls_ok.load(Relaxed),
        ),
        counter(
            "inferscope_tls_reload_failures_total",
            "Listener certificate reloads rejected (unreadable, not a regular file, too large, invalid); the running certificate kept serving.",
            state.reloads.tls_failed.load(Relaxed),
        ),
    ];
    scalars.extend(rec.log.scalars());
    scalars.extend(state.connections.scalars());
    scalars.push(counter(
        "inferscope_admin_connections_evicted_total",
        "Admin connections closed at the admin listener's connection cap to make room for a new one, because they had waited longest (250 ms at least) for their first request head (trickled heads: slowloris).",
        state.admin_connections.evicted.load(Relaxed),
    ));
    scalars.push(counter(
        "inferscope_tls_handshake_failures_total",
        "TLS handshakes on the data plane or the admin listener that failed or timed out (e.g. no client certificate the CA signed).",
        state.connections.tls_failures.load(Relaxed)
            + state.admin_connections.tls_failures.load(Relaxed),
    ));
    if let Some(t) = &rec.telemetry {
        scalars.extend(t.counters.scalars());
    }
    let mut w = if protobuf {
        Writer::protobuf()
    } else {
        Writer::new()
    };
    let snap = rec.stats.snapshot();
    write_prometheus(&mut w, &snap, &scalars);
    router.write_prometheus(&snap, &mut w);
    state.limiter.write_prometheus(&mut w);
    rec.join_counts().write_prometheus(&mut w);
    state.receiver.write_prometheus(&mut w);
    rec.experiments.write_journal_metrics(&mut w);
    let name = "inferscope_auth_throttled_total";
    w.family(
        name,
        "counter",
        "Requests refused (429) without a credential check because their address failed too many this minute: the data plane's keys (auth.max_failures_per_minute) or the admin token (30 a minute).",
    );
    for (plane, n) in [
        ("data", state.limiter.auth_throttled_total()),
        ("admin", state.token_failures.throttled.load(Relaxed)),
    ] {
        w.sample(name, &Labels::new(&[("plane", plane)]), n);
    }
    instrument_metrics(state, &mut w);
    w.into_body()
}

/// Per-backend health and load, for `/stats`.
fn backend_json(router: &Router, snap: &crate::stats::Snapshot) -> serde_json::Value {
    let list: Vec<serde_json::Value> = router
        .backends()
        .iter()
        .map(|b| {
            let s = b.status();
            let roofline = crate::route::roofline(b, snap);
            serde_json::json!({
                "backend": s.name.as_ref(),
                "available": s.available,
                "probe_healthy": s.probe_healthy,
                "ejected": s.ejected,
                "ejections_total": s.ejections_total,
                "rate_limited": s.rate_limited,
                "rate_limited_total": s.rate_limited_total,
                "in_flight": s.in_flight,
                "queued": s.queued,
                "ewma_ttft_ms": s.ewma_ttft_ms,
                "ewma_tpot_ms": s.ewma_tpot_ms,
                "scrape": scrape_json(&s),
                "roofline": roofline,
            })
        })
        .collect();
    list.into()
}

/// The backend's own metrics as last scraped (`metrics:`): `null` without a scrape.
fn scrape_json(s: &crate::route::BackendStatus) -> serde_json::Value {
    let Some((v, age)) = &s.scraped else {
        return if s.scrapes == (0, 0) && s.scrapes_before_first == 0 {
            serde_json::Value::Null
        } else {
            serde_json::json!({
                "ok_total": s.scrapes.0, "failed_total": s.scrapes.1,
                "before_first_answer_total": s.scrapes_before_first,
            })
        };
    };
    let engine = v.engine.as_ref().map(|e| {
        serde_json::json!({
            "running": e.running,
            "waiting": e.waiting,
            "kv_cache_usage": e.kv_cache_usage,
            "prefix_cache_hit_rate": e.prefix_cache_hit_rate,
            "prefill_seconds": e.prefill_seconds,
            "queue_seconds": e.queue_seconds,
        })
    });
    let gpu = v.gpu.as_ref().map(crate::route::engine::GpuView::to_json);
    serde_json::json!({
        "age_ms": age.as_secs_f64() * 1e3,
        "fresh": s.scrape_fresh,
        "ok_total": s.scrapes.0,
        "failed_total": s.scrapes.1,
        "before_first_answer_total": s.scrapes_before_first,
        "engine": engine,
        "gpu": gpu,
    })
}

/// The gateway as a measuring instrument: its clock source, how late its timers fire (waiting
/// for a CPU), wall-clock steps seen, the runtime's load.
fn instrument_json(state: &AdminState) -> serde_json::Value {
    let (p50, p99, max) = state.heartbeat.quantiles_us();
    let (timer_beats, frame_beats) = state.heartbeat.beats();
    let ms = |us: u64| us as f64 / 1000.0;
    let rt = tokio::runtime::Handle::current().metrics();
    serde_json::json!({
        "clock": if state.kernel_clock { "kernel" } else { "user" },
        "clock_steps": crate::clock::CLOCK_STEPS.load(std::sync::atomic::Ordering::Relaxed),
        "heartbeat": {
            "tick_ms": state.heartbeat.tick.as_secs_f64() * 1000.0,
            "lateness_ms": { "p50": ms(p50), "p99": ms(p99), "max": ms(max) },
            "beats": timer_beats + frame_beats,
            "timer_beats": timer_beats,
            "frame_beats": frame_beats,
        },
        "runtime": {
            "workers": rt.num_workers(),
            "alive_tasks": rt.num_alive_tasks(),
            "global_queue_depth": rt.global_queue_depth(),
        },
    })
}

/// The gateway as an instrument (its heartbeat, clock steps) and the runtime's load.
fn instrument_metrics(state: &AdminState, w: &mut Writer) {
    let none = Labels::new(&[]);
    state.heartbeat.write_prometheus(w);
    let rt = tokio::runtime::Handle::current().metrics();
    let busy: f64 = (0..rt.num_workers())
        .map(|i| rt.worker_total_busy_duration(i).as_secs_f64())
        .sum();
    let series: [(&str, &str, &str, f64); 4] = [
        (
            "inferscope_runtime_workers",
            "gauge",
            "Tokio worker threads.",
            rt.num_workers() as f64,
        ),
        (
            "inferscope_runtime_alive_tasks",
            "gauge",
            "Tokio tasks alive.",
            rt.num_alive_tasks() as f64,
        ),
        (
            "inferscope_runtime_global_queue_depth",
            "gauge",
            "Tasks waiting in the runtime's global queue.",
            rt.global_queue_depth() as f64,
        ),
        (
            "inferscope_runtime_busy_seconds_total",
            "counter",
            "Time the runtime's workers spent running tasks (not parked), summed over workers.",
            busy,
        ),
    ];
    for (name, kind, help, v) in series {
        w.family(name, kind, help);
        w.sample(name, &none, v);
    }
}

/// Per client key (by name): requests, refusals, errors, tokens; and requests without a valid key.
fn keys_json(limiter: &crate::access::Limiter) -> serde_json::Value {
    let keys: Vec<serde_json::Value> = limiter
        .key_counts()
        .iter()
        .map(|(name, c)| {
            serde_json::json!({
                "key": name.as_ref(),
                "requests": c.requests,
                "rate_limited": c.rate_limited,
                "errors": c.errors,
                "input_tokens": c.input_tokens,
                "output_tokens": c.output_tokens,
            })
        })
        .collect();
    serde_json::json!({
        "unauthorized": limiter.unauthorized.load(std::sync::atomic::Ordering::Relaxed),
        "by_key": keys,
    })
}

/// Each variant's GPU power, watts, and the output tokens per second its GPUs produced, both
/// over the last minute: the power is the sum over its backends of their GPUs' mean power from a
/// fresh scrape; the tokens are every request those backends answered in the window (live,
/// eval, bench: all of them drew the power). Left out for a variant one of whose backends has no
/// GPU figures, or serves another variant too (its GPUs' energy would not be this variant's
/// alone).
fn variant_energy(
    x: &crate::route::Experiment,
    stats: &crate::stats::Stats,
) -> std::collections::BTreeMap<String, (f64, f64)> {
    let arms: Vec<(&str, &[Arc<crate::route::Backend>])> =
        x.split.named().map(|(n, p)| (n, p.backends())).collect();
    let shared = |b: &crate::route::Backend| {
        arms.iter()
            .filter(|(_, bs)| bs.iter().any(|o| o.name == b.name))
            .count()
            > 1
    };
    arms.iter()
        .filter_map(|(name, backends)| {
            let (mut watts, mut tokens, mut secs) = (0.0, 0u64, 0.0f64);
            for b in *backends {
                if shared(b) {
                    return None;
                }
                watts += b.fresh_scrape()?.gpu.as_ref()?.mean_watts()?;
                let (t, s) = stats.window_output_tokens(&b.name);
                tokens += t;
                secs = secs.max(s);
            }
            let per_s = if secs > 0.0 {
                tokens as f64 / secs
            } else {
                0.0
            };
            (!backends.is_empty()).then(|| ((*name).to_owned(), (watts, per_s)))
        })
        .collect()
}

/// Every experiment: per-variant summaries and comparisons with the control.
fn experiments_json(router: &Router, rec: &Recorder) -> String {
    use crate::experiment::ExperimentView;
    #[derive(serde::Serialize)]
    struct Doc {
        experiments: Vec<ExperimentView>,
    }
    let experiments = router
        .routes()
        .iter()
        .filter_map(|r| match &r.target {
            crate::route::Target::Experiment(x) => {
                // A decision the gateway reports is kept when it changed.
                let mut v = experiment_view(&r.name, x, rec);
                for row in &v.verdicts {
                    rec.experiments.decisions.note(&r.name, row);
                }
                v.decided = rec.experiments.decisions.last(&r.name);
                Some(v)
            }
            crate::route::Target::Pool(_) => None,
        })
        .collect();
    serde_json::to_string(&Doc { experiments }).unwrap_or_default()
}

/// One experiment as `/experiments` has it: its summary with costs and energy, what its
/// comparisons leave out, feedback, guardrails, quality results, and its verdict rows.
fn experiment_view(
    route: &Arc<str>,
    x: &crate::route::Experiment,
    rec: &Recorder,
) -> crate::experiment::ExperimentView {
    use crate::experiment::{quality, ExperimentView, ShadowView};
    let arms = rec.experiments.arms(route);
    let mut summary = crate::experiment::summarize(&x.name, &x.control, &arms, x.horizon);
    quality::add_costs(&mut summary, &x.prices);
    quality::add_energy(&mut summary, &variant_energy(x, &rec.stats));
    let feedback = rec.experiments.feedback.summary(route);
    let results = rec.experiments.quality.results(route);
    let shadow = x.shadow.as_ref().map(|sh| {
        let ag = sh.agreement();
        (sh.variant.as_ref(), ag.exact, ag.pairs)
    });
    let verdicts = quality::verdicts(
        &summary,
        &results,
        &feedback,
        shadow,
        x.accept.as_deref(),
        quality::ResultsFrom::Posted,
    );
    ExperimentView {
        summary,
        route: route.to_string(),
        left_out: rec.experiments.left_out(route),
        feedback,
        guardrails: x.guard.as_ref().map(|g| g.view()),
        quality: results,
        accept: x.accept.as_deref().map(|a| a.limits().collect()),
        verdicts,
        shadow: x.shadow.as_deref().map(ShadowView::of),
        promotion: x.promotion.as_ref().map(|p| p.view()),
        decided: rec.experiments.decisions.last(route),
    }
}

/// Rolls back again what was rolled back before a restart or a reload (`rollbacks`, read from
/// the state directory), where the route's experiment still has the variant.
pub fn reapply_rollbacks(router: &Router, rollbacks: &crate::experiment::InForce) {
    let promotion = |route: &str| router.experiment(route).and_then(|x| x.promotion.clone());
    for (route, variant) in &rollbacks.pardoned {
        if let Some(g) = router.guardrails(route) {
            g.pardon(variant);
        }
        if let Some(p) = promotion(route) {
            p.hold(variant);
        }
    }
    for (route, variant, rule) in &rollbacks.tripped {
        if let Some(g) = router.guardrails(route) {
            if g.trip(variant, rule).is_some() {
                tracing::info!(route = %route, variant = %variant, "rolled back as before the restart");
            }
        }
    }
    for (route, variant, share) in &rollbacks.promoted {
        let known = router
            .experiment(route)
            .is_some_and(|x| x.split.by_name(variant).is_some());
        if let (true, Some(p)) = (known, promotion(route)) {
            p.restore(variant, *share);
            tracing::info!(route = %route, variant = %variant, share, "promoted as before the restart");
        }
    }
}

/// Every second, and at once when a result is posted: each experiment that acts on its verdict
/// (`on_reject: fallback`, `on_accept: promote`) is judged once, a variant whose decision changed
/// has it kept (`verdicts.jsonl` in the state directory), and the fallback and the promotion act
/// on the decisions. (Other experiments are judged when `/experiments` is read: the bootstrap
/// intervals cost too much to compute every second for nothing.)
pub fn act_on_verdicts(router: &Router, rec: &Recorder) {
    for r in router.routes() {
        let crate::route::Target::Experiment(x) = &r.target else {
            continue;
        };
        if x.accept.is_none() || !(x.fallback_on_reject || x.promotion.is_some()) {
            continue;
        }
        let rows = experiment_view(&r.name, x, rec).verdicts;
        for row in &rows {
            rec.experiments.decisions.note(&r.name, row);
        }
        fall_back_on_rejects(&r.name, x, &rows, rec);
        promote_on_accepts(&r.name, x, &rows, rec);
    }
}

/// `on_reject: fallback`: a variant whose verdict is `reject` is rolled back to the control (a
/// guardrail trip, with the broken limits as its rule: logged, counted, an OpenTelemetry event,
/// on the dashboard, undone by `POST /experiments/reset`, after which the same evidence does not
/// roll it back again: the next posted result may).
fn fall_back_on_rejects(
    route: &str,
    x: &crate::route::Experiment,
    rows: &[crate::experiment::quality::VerdictRow],
    rec: &Recorder,
) {
    use crate::experiment::quality::{Decision, State};
    let Some(guard) = x.guard.as_ref().filter(|_| x.fallback_on_reject) else {
        return;
    };
    for row in rows {
        if row.decision != Some(Decision::Reject) || guard.tripped(&row.variant) {
            continue;
        }
        let broken: Vec<String> = row
            .checks
            .iter()
            .filter(|c| c.state == State::Broken)
            .map(|c| match &c.suite {
                Some(s) => format!("{} {} on {s}", c.limit, c.max),
                None => format!("{} {}", c.limit, c.max),
            })
            .collect();
        let rule = format!("verdict: reject ({})", broken.join(", "));
        if let Some(trip) = guard.trip(&row.variant, &rule) {
            rec.guardrail_tripped(route, &row.variant, &trip);
        }
    }
}

/// `on_accept: promote`: a variant whose verdict is `accept` is ramped up one step when due (the
/// first at once, the next after each hold); `undecided` holds the ramp, `reject` stops it. Each
/// change is logged (by the promotion), kept in the state directory, counted and exported as an
/// OpenTelemetry event.
fn promote_on_accepts(
    route: &str,
    x: &crate::route::Experiment,
    rows: &[crate::experiment::quality::VerdictRow],
    rec: &Recorder,
) {
    use crate::experiment::quality::Decision;
    let Some(p) = x.promotion.as_ref() else {
        return;
    };
    for row in rows {
        let tripped = x.guard.as_ref().is_some_and(|g| g.tripped(&row.variant));
        let share = match row.decision {
            Some(Decision::Accept) if !tripped => {
                p.advance(&row.variant, x.split.share(&row.variant) * 100.0)
            }
            Some(Decision::Reject) => p.stop(&row.variant).then_some(0),
            _ => None,
        };
        if let Some(share) = share {
            rec.promoted(route, &row.variant, share);
        }
    }
}

/// `POST /feedback {request_id, name, value}`.
async fn feedback(
    State(state): State<Arc<AdminState>>,
    req: axum::extract::Request,
) -> Response<Full<Bytes>> {
    use crate::experiment::FeedbackError;
    use http_body_util::BodyExt;
    let error = |status: StatusCode, msg: &str| {
        let body = serde_json::json!({"error": {"message": msg}}).to_string();
        reply(status, "application/json", body)
    };
    let Ok(body) = http_body_util::Limited::new(req.into_body(), 64 * 1024)
        .collect()
        .await
    else {
        return error(
            StatusCode::BAD_REQUEST,
            "could not read the body (at most 64 KiB)",
        );
    };
    match state
        .recorder
        .experiments
        .feedback
        .post(&body.to_bytes())
        .await
    {
        Ok((route, variant, name, value)) => {
            // Feedback-based guardrail rules see the signal at once.
            state.observer.feedback(&route, &variant, &name, value);
            reply(
                StatusCode::OK,
                "application/json",
                serde_json::json!({"variant": variant.as_ref()}).to_string(),
            )
        }
        Err(e) => {
            let status = match e {
                FeedbackError::Invalid(_) => StatusCode::BAD_REQUEST,
                FeedbackError::UnknownRequest => StatusCode::NOT_FOUND,
                FeedbackError::Duplicate(_) => StatusCode::CONFLICT,
                FeedbackError::Storage(_) => StatusCode::INTERNAL_SERVER_ERROR,
            };
            error(status, &e.to_string())
        }
    }
}

/// `POST /experiments/quality`: an eval's result (`inferscope eval --json`), kept for the route
/// it names or whose `match` takes its model and path, and joined into `/experiments`' verdicts.
async fn quality(
    State(state): State<Arc<AdminState>>,
    req: axum::extract::Request,
) -> Response<Full<Bytes>> {
    use crate::experiment::quality::{QualityError, QualityResult};
    use http_body_util::BodyExt;
    let Ok(body) = http_body_util::Limited::new(req.into_body(), 1024 * 1024)
        .collect()
        .await
    else {
        return json_error(
            StatusCode::BAD_REQUEST,
            "could not read the body (at most 1 MiB)",
        );
    };
    let result = match QualityResult::parse(&body.to_bytes()) {
        Ok(r) => r,
        Err(e) => return json_error(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let router = state.routes.load();
    let route = match (&result.route, &result.model) {
        (Some(name), _) => router.routes().iter().find(|r| *r.name == **name),
        (None, Some(model)) => router.route_for(
            Some(model),
            result.path.as_deref().unwrap_or("/v1/chat/completions"),
        ),
        (None, None) => {
            return json_error(StatusCode::BAD_REQUEST, "name the `route` or the `model`");
        }
    };
    let refuse = |msg: String| json_error(StatusCode::NOT_FOUND, &msg);
    let Some(route) = route else {
        return refuse(match &result.route {
            Some(name) => format!("no route `{name}`"),
            None => format!(
                "no route takes model `{}`",
                result.model.as_deref().unwrap_or_default()
            ),
        });
    };
    let crate::route::Target::Experiment(x) = &route.target else {
        return refuse(format!("route `{}` runs no experiment", route.name));
    };
    if let Some(v) = result
        .variants
        .iter()
        .find(|v| x.split.by_name(&v.variant).is_none())
    {
        return refuse(format!(
            "experiment `{}` has no variant `{}`",
            x.name, v.variant
        ));
    }
    if *x.control != *result.control {
        return json_error(
            StatusCode::BAD_REQUEST,
            &format!(
                "the result's control is `{}`, the experiment's `{}`: run the eval with the control first in --variants",
                result.control, x.control
            ),
        );
    }
    let name = Arc::clone(&route.name);
    match state.recorder.experiments.quality.post(&name, result).await {
        Ok(()) => {
            // A result that turns the verdict to reject rolls back at once where asked to (a
            // variant a person put back too: this is new evidence).
            if let Some(g) = &x.guard {
                g.clear_pardons();
            }
            if let Some(p) = &x.promotion {
                p.clear_holds();
            }
            if x.guard.is_some() || x.promotion.is_some() {
                state.recorder.experiments.rollbacks.evidence(&name);
            }
            act_on_verdicts(&router, &state.recorder);
            reply(
                StatusCode::OK,
                "application/json",
                serde_json::to_string(&crate::experiment::quality::Filed {
                    route: name.to_string(),
                    experiment: x.name.to_string(),
                })
                .unwrap_or_default(),
            )
        }
        Err(e @ QualityError::Full(_)) => json_error(StatusCode::CONFLICT, &e.to_string()),
        Err(e @ QualityError::Store(_)) => {
            json_error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string())
        }
        Err(e) => json_error(StatusCode::BAD_REQUEST, &e.to_string()),
    }
}

/// `POST /experiments/reset {"route": "...", "variant": "..."}` (variant optional: all).
async fn reset(
    State(state): State<Arc<AdminState>>,
    req: axum::extract::Request,
) -> Response<Full<Bytes>> {
    use http_body_util::BodyExt;
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        route: String,
        #[serde(default)]
        variant: Option<String>,
    }
    let error = |status: StatusCode, msg: &str| {
        reply(
            status,
            "application/json",
            serde_json::json!({"error": {"message": msg}}).to_string(),
        )
    };
    let Ok(bytes) = http_body_util::Limited::new(req.into_body(), 4096)
        .collect()
        .await
    else {
        return error(StatusCode::BAD_REQUEST, "could not read the body");
    };
    let Ok(b) = serde_json::from_slice::<Body>(&bytes.to_bytes()) else {
        return error(
            StatusCode::BAD_REQUEST,
            "expected {\"route\": NAME, \"variant\": NAME (optional)}",
        );
    };
    let router = state.routes.load();
    let Some(x) = router
        .experiment(&b.route)
        .filter(|x| x.guard.is_some() || x.promotion.is_some())
    else {
        return error(
            StatusCode::NOT_FOUND,
            "no experiment with guardrails, on_reject or on_accept on that route",
        );
    };
    // What will be put back, kept on disk first: a reset answered is a reset that survives a
    // restart, and one that cannot be kept changes nothing.
    let mut reset = x
        .guard
        .as_ref()
        .map(|g| g.tripped_among(b.variant.as_deref()))
        .unwrap_or_default();
    let promoted = x
        .promotion
        .as_ref()
        .and_then(|p| p.promoted())
        .map(|(v, _)| v.to_string())
        .filter(|v| b.variant.as_deref().is_none_or(|want| want == v));
    if let Some(v) = &promoted {
        if !reset.contains(v) {
            reset.push(v.clone());
        }
    }
    if let Err(e) = state
        .recorder
        .experiments
        .rollbacks
        .reset(&b.route, &reset)
        .await
    {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!(
                "not reset: it could not be kept in the state directory ({e}); nothing changed"
            ),
        );
    }
    if let Some(g) = &x.guard {
        g.reset(b.variant.as_deref());
    }
    // A promotion undone: the configured split, held until new evidence.
    let unpromoted = x
        .promotion
        .as_ref()
        .and_then(|p| p.reset(b.variant.as_deref()));
    reply(
        StatusCode::OK,
        "application/json",
        serde_json::json!({"reset": reset, "unpromoted": unpromoted}).to_string(),
    )
}
