//! The simulator's engine spans: as vLLM's `--otlp-traces-endpoint` does, one `llm_request` SERVER
//! span per finished request, child of the `traceparent` it came with, carrying the GenAI latency
//! attributes (`gen_ai.latency.time_in_queue`, `…time_in_model_prefill`, `…time_in_model_decode`,
//! `…time_to_first_token`, `…e2e`) and `gen_ai.request.id` — here the simulator's ground truth.
//! Exported over OTLP/HTTP protobuf in batches, as vLLM's batch span processor does.

use super::Truth;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, ResourceSpans, ScopeSpans, Span};
use prost::Message;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;

/// Where the spans go, and how often.
#[derive(Debug, Clone)]
pub struct SpanExport {
    /// The OTLP/HTTP traces endpoint (`http://host:port/v1/traces`).
    pub endpoint: http::Uri,
    /// Spans wait this long to go in one export (vLLM's default schedule delay is 5 s).
    pub delay: Duration,
}

/// The span of a finished request, or `None` when it has no parent trace or never reached the
/// engine's model.
pub(super) fn span_of(t: &Truth, span_id: u64) -> Option<Span> {
    let (trace, parent) = trace_and_parent(t.traceparent.as_deref()?)?;
    let e = t.engine()?;
    let wall = |at: tokio::time::Instant| {
        let ago = at.elapsed();
        (SystemTime::now() - ago)
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    };
    let secs = |k: &str, d: Duration| kv(k, Value::DoubleValue(d.as_secs_f64()));
    let mut attributes = vec![
        secs("gen_ai.latency.time_in_queue", e.queue),
        secs("gen_ai.latency.time_in_model_prefill", e.prefill),
        secs("gen_ai.latency.time_in_model_decode", e.decode),
        secs("gen_ai.latency.time_to_first_token", e.queue + e.prefill),
        secs("gen_ai.latency.e2e", e.queue + e.prefill + e.decode),
        kv(
            "gen_ai.usage.prompt_tokens",
            Value::IntValue(t.prompt_tokens as i64),
        ),
        kv(
            "gen_ai.usage.completion_tokens",
            Value::IntValue(t.output_tokens as i64),
        ),
    ];
    if let Some(id) = &t.response_id {
        attributes.push(kv("gen_ai.request.id", Value::StringValue(id.clone())));
    }
    Some(Span {
        trace_id: trace.to_be_bytes().to_vec(),
        span_id: span_id.to_be_bytes().to_vec(),
        parent_span_id: parent.to_be_bytes().to_vec(),
        name: "llm_request".into(),
        kind: SpanKind::Server as i32,
        start_time_unix_nano: wall(t.arrival),
        end_time_unix_nano: wall(t.arrival) + (e.queue + e.prefill + e.decode).as_nanos() as u64,
        attributes,
        ..Default::default()
    })
}

/// `00-<trace id>-<parent id>-<flags>`: the two ids (as an engine reads them: no more checks).
fn trace_and_parent(tp: &str) -> Option<(u128, u64)> {
    let mut parts = tp.trim().split('-');
    let (_, trace, parent) = (parts.next()?, parts.next()?, parts.next()?);
    let trace = u128::from_str_radix(trace, 16).ok().filter(|t| *t != 0)?;
    let parent = u64::from_str_radix(parent, 16).ok().filter(|p| *p != 0)?;
    Some((trace, parent))
}

fn kv(key: &str, v: Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(v) }),
        ..Default::default()
    }
}

/// Sends the spans that arrive on `rx` every `delay`, until the sender is gone.
pub(super) async fn export(to: SpanExport, mut rx: mpsc::UnboundedReceiver<Span>) {
    let mut open = true;
    while open {
        let mut spans = Vec::new();
        let deadline = tokio::time::Instant::now() + to.delay;
        while open {
            tokio::select! {
                s = rx.recv() => match s {
                    Some(s) => spans.push(s),
                    None => open = false,
                },
                () = tokio::time::sleep_until(deadline) => break,
            }
        }
        if spans.is_empty() {
            continue;
        }
        let body = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
        .encode_to_vec();
        let sent = tokio::time::timeout(Duration::from_secs(5), post(&to.endpoint, body)).await;
        match sent {
            Ok(Ok(status)) if status.is_success() => {}
            Ok(Ok(status)) => {
                tracing::warn!(%status, "the span receiver refused the simulator's spans")
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "the simulator could not export its spans"),
            Err(_) => tracing::warn!("the simulator's span export timed out"),
        }
    }
}

/// POSTs one protobuf export over a new HTTP/1.1 connection; the answer's status.
async fn post(
    to: &http::Uri,
    body: Vec<u8>,
) -> Result<http::StatusCode, Box<dyn std::error::Error + Send + Sync>> {
    let host = to.host().ok_or("no host")?;
    let port = to.port_u16().unwrap_or(80);
    let stream = tokio::net::TcpStream::connect((host.trim_matches(['[', ']']), port)).await?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let path = to.path_and_query().map_or("/v1/traces", |p| p.as_str());
    let req = http::Request::post(path)
        .header(
            http::header::HOST,
            to.authority().map_or(host, |a| a.as_str()),
        )
        .header(http::header::CONTENT_TYPE, "application/x-protobuf")
        .body(Full::new(Bytes::from(body)))?;
    let resp = sender.send_request(req).await?;
    let status = resp.status();
    let _ = resp.into_body().collect().await;
    Ok(status)
}
