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
use std::sync::Arc;
use std::task::{Context, Poll};

/// Largest export accepted (compressed or not), bytes.
const MAX_EXPORT: usize = 16 << 20;

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
        return Err("the export is larger than 16 MiB once inflated");
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

/// Receives one export where the admin token allows it.
pub(super) async fn receive(
    State(state): State<Arc<AdminState>>,
    req: axum::extract::Request,
) -> Response<GrpcReply> {
    if !super::authorized(&state, &req) {
        return unauthorized(req.uri().path());
    }
    let is_grpc = req.uri().path() == receive::GRPC_PATH;
    let (parts, body) = req.into_parts();
    let ctype = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if is_grpc && !ctype.starts_with("application/grpc") {
        return http(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "send Content-Type: application/grpc\n",
        );
    }
    if !is_grpc && !ctype.starts_with("application/x-protobuf") {
        return http(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "OTLP/HTTP exports are read as protobuf: send Content-Type: application/x-protobuf\n",
        );
    }
    let bytes = match http_body_util::Limited::new(body, MAX_EXPORT)
        .collect()
        .await
    {
        Ok(c) => c.to_bytes(),
        Err(_) if is_grpc => return grpc(8, "the export is larger than 16 MiB"),
        Err(_) => {
            return http(
                StatusCode::PAYLOAD_TOO_LARGE,
                "the export is larger than 16 MiB\n",
            )
        }
    };
    let spans = if is_grpc {
        grpc_spans(&parts.headers, &bytes)
    } else if header_is(&parts.headers, header::CONTENT_ENCODING, "gzip") {
        gunzip(&bytes)
            .map_err(BadExport::Frame)
            .and_then(|b| receive::decode(&b))
    } else {
        receive::decode(bytes.chunk())
    };
    match spans {
        Ok(spans) => {
            state.recorder.engine_spans(spans);
            if is_grpc {
                grpc(0, "")
            } else {
                // An empty ExportTraceServiceResponse.
                http(StatusCode::OK, "")
            }
        }
        Err(e) if is_grpc => grpc(3, &e.to_string()),
        Err(e) => http(StatusCode::BAD_REQUEST, &format!("{e}\n")),
    }
}

fn grpc_spans(
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Vec<crate::meter::EngineSpan>, BadExport> {
    // A compressed message (flag 1) under `grpc-encoding: gzip`.
    if body.first() == Some(&1) && header_is(headers, "grpc-encoding", "gzip") {
        let mut plain = body.to_vec();
        plain[0] = 0;
        let inner = receive::grpc_message(&plain)?;
        let inflated = gunzip(inner).map_err(BadExport::Frame)?;
        return receive::decode(&inflated);
    }
    receive::decode(receive::grpc_message(body)?)
}
