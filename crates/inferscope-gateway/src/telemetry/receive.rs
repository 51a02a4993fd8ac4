//! The OTLP trace receiver's decoding: an export request (OTLP/HTTP protobuf, or the message of
//! an OTLP/gRPC call) read into the engine spans it carries — spans with the GenAI latency
//! attributes vLLM puts on its `llm_request` span. Other spans are skipped.

use crate::meter::EngineSpan;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value::Value, KeyValue};
use prost::Message;
use std::sync::Arc;
use std::time::Duration;

/// The gRPC method an OTLP/gRPC exporter calls.
pub const GRPC_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";
/// The OTLP/HTTP path of traces.
pub const HTTP_PATH: &str = "/v1/traces";

/// An export that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BadExport {
    /// Not an OTLP trace export.
    #[error("not an OTLP ExportTraceServiceRequest: {0}")]
    Decode(#[from] prost::DecodeError),
    /// A gRPC frame that is not one whole uncompressed message.
    #[error("{0}")]
    Frame(&'static str),
}

/// The engine spans of an OTLP/HTTP protobuf body.
pub fn decode(body: &[u8]) -> Result<Vec<EngineSpan>, BadExport> {
    Ok(engine_spans(&ExportTraceServiceRequest::decode(body)?))
}

/// The message of one gRPC request body: a flag byte (0: uncompressed), a 4-byte big-endian
/// length, the message.
pub fn grpc_message(body: &[u8]) -> Result<&[u8], BadExport> {
    let [flag, a, b, c, d, rest @ ..] = body else {
        return Err(BadExport::Frame("a gRPC message needs a 5-byte prefix"));
    };
    if *flag != 0 {
        return Err(BadExport::Frame(
            "compressed gRPC messages are not accepted: export uncompressed",
        ));
    }
    let len = u32::from_be_bytes([*a, *b, *c, *d]) as usize;
    if rest.len() != len {
        return Err(BadExport::Frame("a gRPC body must be one whole message"));
    }
    Ok(rest)
}

/// The spans of `req` that carry engine latencies.
pub fn engine_spans(req: &ExportTraceServiceRequest) -> Vec<EngineSpan> {
    let spans = req
        .resource_spans
        .iter()
        .flat_map(|r| &r.scope_spans)
        .flat_map(|s| &s.spans);
    let mut out = Vec::new();
    for s in spans {
        let (Ok(trace), Ok(parent)) = (
            <[u8; 16]>::try_from(s.trace_id.as_slice()),
            <[u8; 8]>::try_from(s.parent_span_id.as_slice()),
        ) else {
            continue;
        };
        let mut e = EngineSpan {
            trace_id: u128::from_be_bytes(trace),
            parent: u64::from_be_bytes(parent),
            ..EngineSpan::default()
        };
        let mut latencies = false;
        for KeyValue { key, value, .. } in &s.attributes {
            let v = value.as_ref().and_then(|v| v.value.as_ref());
            let slot = match key.as_str() {
                "gen_ai.request.id" => {
                    if let Some(Value::StringValue(id)) = v {
                        e.request_id = Some(Arc::from(id.as_str()));
                    }
                    continue;
                }
                "gen_ai.latency.time_in_queue" => &mut e.queue,
                "gen_ai.latency.time_in_model_prefill" => &mut e.prefill,
                "gen_ai.latency.time_in_model_decode" => &mut e.decode,
                "gen_ai.latency.time_to_first_token" => &mut e.ttft,
                "gen_ai.latency.e2e" => &mut e.e2e,
                _ => continue,
            };
            let seconds = match v {
                Some(Value::DoubleValue(x)) => *x,
                Some(Value::IntValue(x)) => *x as f64,
                _ => continue,
            };
            // A clock that went back reads as zero, not as a panic or a huge number.
            *slot = Duration::try_from_secs_f64(seconds.max(0.0)).ok();
            latencies = true;
        }
        if latencies {
            out.push(e);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::AnyValue;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

    fn kv(k: &str, v: Value) -> KeyValue {
        KeyValue {
            key: k.into(),
            value: Some(AnyValue { value: Some(v) }),
            ..Default::default()
        }
    }

    fn export(spans: Vec<Span>) -> Vec<u8> {
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
        .encode_to_vec()
    }

    #[test]
    fn reads_vllm_latencies_and_skips_other_spans() {
        let llm = Span {
            trace_id: 7u128.to_be_bytes().to_vec(),
            parent_span_id: 9u64.to_be_bytes().to_vec(),
            name: "llm_request".into(),
            attributes: vec![
                kv("gen_ai.request.id", Value::StringValue("chatcmpl-1".into())),
                kv("gen_ai.latency.time_in_queue", Value::DoubleValue(0.25)),
                kv(
                    "gen_ai.latency.time_in_model_prefill",
                    Value::DoubleValue(0.5),
                ),
                kv(
                    "gen_ai.latency.time_in_model_decode",
                    Value::DoubleValue(-1.0),
                ),
                kv("gen_ai.usage.prompt_tokens", Value::IntValue(12)),
            ],
            ..Default::default()
        };
        let other = Span {
            trace_id: 7u128.to_be_bytes().to_vec(),
            parent_span_id: 1u64.to_be_bytes().to_vec(),
            name: "http".into(),
            ..Default::default()
        };
        let rootless = Span {
            trace_id: vec![1, 2],
            ..llm.clone()
        };
        let got = decode(&export(vec![other, llm, rootless])).unwrap_or_default();
        assert_eq!(
            got,
            vec![EngineSpan {
                trace_id: 7,
                parent: 9,
                request_id: Some(Arc::from("chatcmpl-1")),
                queue: Some(Duration::from_millis(250)),
                prefill: Some(Duration::from_millis(500)),
                decode: Some(Duration::ZERO),
                ttft: None,
                e2e: None,
            }]
        );
        assert!(decode(b"\xff\xff\xff").is_err());
    }

    #[test]
    fn a_grpc_body_is_one_whole_uncompressed_message() {
        assert_eq!(
            grpc_message(&[0, 0, 0, 0, 2, 8, 1]).ok(),
            Some(&[8u8, 1][..])
        );
        assert!(grpc_message(&[1, 0, 0, 0, 2, 8, 1]).is_err());
        assert!(grpc_message(&[0, 0, 0, 0, 3, 8, 1]).is_err());
        assert!(grpc_message(&[0, 0]).is_err());
    }
}
