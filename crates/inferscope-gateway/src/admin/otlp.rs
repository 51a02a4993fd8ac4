//! The OTLP trace receiver of the admin listener: engines (vLLM `--otlp-traces-endpoint`) or an
//! OpenTelemetry Collector send their spans here, over OTLP/gRPC
//! (`TraceService/Export`, HTTP/2 without TLS or with the admin listener's) or OTLP/HTTP
//! (`POST /v1/traces`, protobuf, gzip or not). The spans with engine latencies go to the
//! recorder, which joins them to the records of the requests they describe.

use super::AdminState;
use crate::telemetry::receive::{self, BadExport};
use axum::extract::State;
use bytes::{Buf, Bytes};
use http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// Largest export accepted, received and inflated, bytes: gRPC's default message size. An
/// engine's batch span processor exports at most 512 spans at a time (~0.5 MB).
const MAX_EXPORT: usize = 4 << 20;

/// A gRPC answer: one message, then trailers carrying the status.
#[derive(Debug, Default)]
pub(super) struct GrpcReply {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl Body for GrpcReply {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Some(d) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(d))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}

/// A gRPC answer with `code` (0: OK) — trailers-only when it is an error.
fn grpc(code: u8, message: &str) -> Response<GrpcReply> {
    let mut status = HeaderMap::new();
    status.insert("grpc-status", HeaderValue::from(u16::from(code)));
    if let Ok(m) = HeaderValue::try_from(message) {
        status.insert("grpc-message", m);
    }
    let body = if code == 0 {
        // An empty ExportTraceServiceResponse: uncompressed, zero length.
        GrpcReply {
            data: Some(Bytes::from_static(&[0, 0, 0, 0, 0])),
            trailers: Some(status.clone()),
        }
    } else {
        GrpcReply::default()
    };
    let mut r = Response::new(body);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    if code != 0 {
        r.headers_mut().extend(status);
    }
    r
}

fn http(status: StatusCode, body: &str) -> Response<GrpcReply> {
    let mut r = Response::new(GrpcReply {
        data: Some(Bytes::copy_from_slice(body.as_bytes())),
        trailers: None,
    });
    *r.status_mut() = status;
    let ctype = if status.is_success() {
        "application/x-protobuf"
    } else {
        "text/plain"
    };
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
    r
}

fn gunzip(b: &[u8]) -> Result<Vec<u8>, &'static str> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(b)
        .take(MAX_EXPORT as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|_| "the gzip body could not be read")?;
    if out.len() > MAX_EXPORT {
        return Err("the export is larger than 4 MiB once inflated");
    }
    Ok(out)
}

fn header_is(h: &HeaderMap, name: impl header::AsHeaderName, value: &str) -> bool {
    h.get(name)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case(value))
}

/// The answer to an export without the admin token: a gRPC status for a gRPC client.
fn unauthorized(path: &str) -> Response<GrpcReply> {
    const MSG: &str = "the admin API needs Authorization: Bearer <admin token> \
                       (OTEL_EXPORTER_OTLP_TRACES_HEADERS=authorization=Bearer%20<token>)";
    if path == receive::GRPC_PATH {
        return grpc(16, MSG);
    }
    let mut r = http(StatusCode::UNAUTHORIZED, MSG);
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}

/// Exports read at once: each may hold 4 MiB received and 4 MiB inflated and take a core for
/// tens of milliseconds; more wait for their turn (at most `BUSY_WAIT`, then an exporter is told
/// to retry). A stream of span bombs costs one core at most.
pub(super) const CONCURRENT_EXPORTS: usize = 1;
/// How long an export waits for its turn.
const BUSY_WAIT: Duration = Duration::from_secs(5);
/// How long a whole export body may take to arrive (a trickled body is cut at this).
const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// Bytes of exports (inflated) read a second at most, on average; an export past it waits its
/// turn as `busy` (an exporter retries). An engine exporting a span per request at 1,000 requests
/// a second sends ~1 MB a second; a stream of span bombs is held to a few percent of a core.
const READ_PER_SECOND: f64 = (8 << 20) as f64;

/// The receiver's own state: the turns for reading exports, the budget of bytes it reads, and
/// what became of each export.
#[derive(Debug)]
pub struct Receiver {
    turns: tokio::sync::Semaphore,
    /// Bytes that may still be read now (refilled at `READ_PER_SECOND` up to one second's), and
    /// when it was last refilled.
    budget: parking_lot::Mutex<(f64, std::time::Instant)>,
    /// Exports by outcome, in `OUTCOMES` order.
    outcomes: [AtomicU64; OUTCOMES.len()],
}

impl Default for Receiver {
    fn default() -> Self {
        Self {
            turns: tokio::sync::Semaphore::new(CONCURRENT_EXPORTS),
            budget: parking_lot::Mutex::new((READ_PER_SECOND, std::time::Instant::now())),
            outcomes: Default::default(),
        }
    }
}

/// What became of an export.
const OUTCOMES: [&str; 8] = [
    "accepted",
    "invalid",
    "too_large",
    "slow_body",
    "busy",
    "unauthorized",
    "misdirected",
    "not_configured",
];

impl Receiver {
    /// Whether an export may be read now (the budget is not spent).
    fn may_read(&self) -> bool {
        let mut b = self.budget.lock();
        let now = std::time::Instant::now();
        let refill = now.duration_since(b.1).as_secs_f64() * READ_PER_SECOND;
        *b = ((b.0 + refill).min(READ_PER_SECOND), now);
        b.0 > 0.0
    }

    /// `bytes` were read (inflated).
    fn spent(&self, bytes: usize) {
        self.budget.lock().0 -= bytes as f64;
    }

    fn count(&self, outcome: &str) {
        if let Some(i) = OUTCOMES.iter().position(|o| *o == outcome) {
            self.outcomes[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The receiver's series, for `/metrics`.
    pub fn write_prometheus(&self, w: &mut crate::util::prometheus::Writer) {
        use crate::util::prometheus::Labels;
        let name = "inferscope_otlp_exports_total";
        w.family(
            name,
            "counter",
            "OTLP trace exports the admin listener received, by outcome: accepted; invalid (not an OTLP trace export); too_large (past 4 MiB, received or inflated); slow_body (not whole within 10 s); busy (another export was being read for 5 s, or more than 8 MiB a second came: retry); unauthorized (no admin token, or its address used up its tries); misdirected (a Host not the admin listener's); not_configured (no backend has engine_spans:).",
        );
        for (o, n) in OUTCOMES.iter().zip(&self.outcomes) {
            w.sample(
                name,
                &Labels::new(&[("outcome", o)]),
                n.load(Ordering::Relaxed),
            );
        }
    }
}

/// An answer to a refused export: a gRPC status for a gRPC client, else an HTTP status.
fn refuse(is_grpc: bool, status: StatusCode, code: u8, msg: &str) -> Response<GrpcReply> {
    if is_grpc {
        grpc(code, msg)
    } else {
        http(status, &format!("{msg}\n"))
    }
}

/// Receives one export where a backend expects its engine's spans and the admin token and the
/// `Host` allow it. Bounded whoever sends it: its body must arrive within `BODY_TIMEOUT` and
/// hold at most 4 MiB (inflated too); at most `CONCURRENT_EXPORTS` are read at once, off the
/// runtime's workers; what it decodes to is bounded by `receive::decode`.
pub(super) async fn receive(
    State(state): State<Arc<AdminState>>,
    req: axum::extract::Request,
) -> Response<GrpcReply> {
    let is_grpc = req.uri().path() == receive::GRPC_PATH;
    let rx = &state.receiver;
    if let Err(why) = super::check_token(&state, &req) {
        rx.count("unauthorized");
        return match why {
            super::Refusal::Throttled => refuse(
                is_grpc,
                StatusCode::TOO_MANY_REQUESTS,
                8,
                "too many failed admin token checks from this address: wait a minute",
            ),
            super::Refusal::Unauthorized => unauthorized(req.uri().path()),
        };
    }
    if !super::host_ok(&state, &req) {
        rx.count("misdirected");
        return refuse(
            is_grpc,
            StatusCode::MISDIRECTED_REQUEST,
            7,
            "this Host is not the admin listener's: add it to admin.allowed_hosts",
        );
    }
    if !state
        .routes
        .load()
        .backends()
        .iter()
        .any(|b| b.engine_spans.is_some())
    {
        rx.count("not_configured");
        return refuse(
            is_grpc,
            StatusCode::NOT_FOUND,
            12,
            "no backend has engine_spans: this gateway takes no spans",
        );
    }
    let (parts, body) = req.into_parts();
    let ctype = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if is_grpc && !ctype.starts_with("application/grpc") {
        rx.count("invalid");
        return http(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "send Content-Type: application/grpc\n",
        );
    }
    if !is_grpc && !ctype.starts_with("application/x-protobuf") {
        rx.count("invalid");
        return http(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "OTLP/HTTP exports are read as protobuf: send Content-Type: application/x-protobuf\n",
        );
    }
    let Ok(Ok(_turn)) = tokio::time::timeout(BUSY_WAIT, rx.turns.acquire()).await else {
        rx.count("busy");
        return refuse(
            is_grpc,
            StatusCode::SERVICE_UNAVAILABLE,
            14,
            "other exports are being read: retry",
        );
    };
    let collected = tokio::time::timeout(
        BODY_TIMEOUT,
        http_body_util::Limited::new(body, MAX_EXPORT).collect(),
    )
    .await;
    let bytes = match collected {
        Ok(Ok(c)) => c.to_bytes(),
        Ok(Err(_)) => {
            rx.count("too_large");
            return refuse(
                is_grpc,
                StatusCode::PAYLOAD_TOO_LARGE,
                8,
                "the export is larger than 4 MiB",
            );
        }
        Err(_) => {
            rx.count("slow_body");
            return refuse(
                is_grpc,
                StatusCode::REQUEST_TIMEOUT,
                4,
                "the export did not arrive within 10 s",
            );
        }
    };
    // The body is read (an exporter writing it must not meet a closed connection); what it
    // costs to inflate and walk is what the budget holds back.
    if !rx.may_read() {
        rx.count("busy");
        return refuse(
            is_grpc,
            StatusCode::TOO_MANY_REQUESTS,
            8,
            "more than 8 MiB of exports a second: retry",
        );
    }
    let gzip = header_is(&parts.headers, header::CONTENT_ENCODING, "gzip");
    let headers = parts.headers;
    // Inflating and walking 4 MiB takes tens of milliseconds: off the runtime's workers.
    let received = bytes.len();
    let (decoded, read) = tokio::task::spawn_blocking(move || {
        if is_grpc {
            grpc_spans(&headers, &bytes)
        } else if gzip {
            match gunzip(&bytes) {
                Ok(b) => (receive::decode(&b), b.len()),
                Err(e) => (Err(BadExport::Frame(e)), MAX_EXPORT),
            }
        } else {
            (receive::decode(bytes.chunk()), bytes.len())
        }
    })
    .await
    .unwrap_or((Err(BadExport::Frame("the export could not be read")), 0));
    rx.spent(read.max(received));
    match decoded {
        Ok(d) => {
            rx.count("accepted");
            state.recorder.engine_spans(d);
            if is_grpc {
                grpc(0, "")
            } else {
                // An empty ExportTraceServiceResponse.
                http(StatusCode::OK, "")
            }
        }
        Err(BadExport::Frame(m)) if m.contains("4 MiB") => {
            rx.count("too_large");
            refuse(is_grpc, StatusCode::PAYLOAD_TOO_LARGE, 8, m)
        }
        Err(e) => {
            rx.count("invalid");
            refuse(is_grpc, StatusCode::BAD_REQUEST, 3, &e.to_string())
        }
    }
}

/// The engine spans of a gRPC body, and the bytes read to get them (inflated).
fn grpc_spans(headers: &HeaderMap, body: &[u8]) -> (Result<receive::Decoded, BadExport>, usize) {
    // A compressed message (flag 1) under `grpc-encoding: gzip`.
    if body.first() == Some(&1) && header_is(headers, "grpc-encoding", "gzip") {
        let mut plain = body.to_vec();
        plain[0] = 0;
        let inflated =
            receive::grpc_message(&plain).and_then(|inner| gunzip(inner).map_err(BadExport::Frame));
        return match inflated {
            Ok(b) => (receive::decode(&b), b.len()),
            Err(e) => (Err(e), MAX_EXPORT),
        };
    }
    (
        receive::grpc_message(body).and_then(receive::decode),
        body.len(),
    )
}
