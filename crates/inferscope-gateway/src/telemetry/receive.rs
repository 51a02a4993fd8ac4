//! The OTLP trace receiver's decoding: an export request (OTLP/HTTP protobuf, or the message of
//! an OTLP/gRPC call) read into the engine spans it carries — spans with the GenAI latency
//! attributes vLLM puts on its `llm_request` span. Other spans are skipped.
//!
//! The export is walked in place rather than decoded into `opentelemetry-proto`'s messages:
//! a message decoder materialises every span, and an empty span is 2 bytes on the wire but
//! ~440 in memory, so 16 KiB of gzip'd empty spans (16 MiB inflated) took the gateway to 3.7 GB
//! and 6 s of decoding. Walking allocates only for the engine spans kept (at most
//! `MAX_SPANS_PER_EXPORT`), whatever the export holds, and reads the largest export taken (4 MiB)
//! in milliseconds. What it reads is checked against `prost`'s decoding of the same messages in
//! the tests below.

use crate::meter::EngineSpan;
use std::sync::Arc;
use std::time::Duration;

/// The gRPC method an OTLP/gRPC exporter calls.
pub const GRPC_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";
/// The OTLP/HTTP path of traces.
pub const HTTP_PATH: &str = "/v1/traces";

/// Engine spans kept from one export; the rest are counted (`Decoded::dropped`). vLLM's batch
/// span processor exports at most 512 at a time.
pub const MAX_SPANS_PER_EXPORT: usize = 1 << 16;
/// Longest engine duration believed: a longer one (a forged or broken span: 1e19 s) is left out
/// of the span, and the span counted in `Decoded::out_of_range`.
pub const MAX_ENGINE_DURATION: Duration = Duration::from_secs(24 * 3600);
/// Longest `gen_ai.request.id` kept (longer ones are left out of the span: the id is only
/// shown, never joined on).
pub const MAX_REQUEST_ID_BYTES: usize = 256;

/// An export that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BadExport {
    /// Not an OTLP trace export.
    #[error("not an OTLP ExportTraceServiceRequest: {0}")]
    Decode(&'static str),
    /// A gRPC frame that is not one whole uncompressed message.
    #[error("{0}")]
    Frame(&'static str),
}

/// What one export held.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Decoded {
    /// Its engine spans (at most `MAX_SPANS_PER_EXPORT`).
    pub spans: Vec<EngineSpan>,
    /// Engine spans past `MAX_SPANS_PER_EXPORT`, not kept.
    pub dropped: u64,
    /// Engine spans with a duration past `MAX_ENGINE_DURATION` or not a number (that duration
    /// left out).
    pub out_of_range: u64,
}

/// The engine spans of an OTLP/HTTP protobuf body.
pub fn decode(body: &[u8]) -> Result<Decoded, BadExport> {
    let mut out = Decoded::default();
    // ExportTraceServiceRequest { repeated ResourceSpans resource_spans = 1; }
    let mut request = Fields(body);
    while let Some((field, v)) = request.next_field()? {
        let Some(resource) = v.message_at(field, 1)? else {
            continue;
        };
        // ResourceSpans { Resource resource = 1; repeated ScopeSpans scope_spans = 2; … }
        let mut resource = Fields(resource);
        while let Some((field, v)) = resource.next_field()? {
            let Some(scope) = v.message_at(field, 2)? else {
                continue;
            };
            // ScopeSpans { InstrumentationScope scope = 1; repeated Span spans = 2; … }
            let mut scope = Fields(scope);
            while let Some((field, v)) = scope.next_field()? {
                if let Some(span) = v.message_at(field, 2)? {
                    read_span(span, &mut out)?;
                }
            }
        }
    }
    Ok(out)
}

/// One `Span`: kept when it carries a trace id, a parent span id and a latency attribute.
fn read_span(span: &[u8], out: &mut Decoded) -> Result<(), BadExport> {
    let (mut trace, mut parent) = (None, None);
    let mut e = EngineSpan::default();
    let (mut latencies, mut out_of_range) = (false, false);
    let mut fields = Fields(span);
    while let Some((field, v)) = fields.next_field()? {
        match (field, v) {
            // bytes trace_id = 1; bytes parent_span_id = 4
            (1, Value::Len(b)) => trace = <[u8; 16]>::try_from(b).ok(),
            (4, Value::Len(b)) => parent = <[u8; 8]>::try_from(b).ok(),
            // repeated KeyValue attributes = 9
            (9, Value::Len(kv)) => match attribute(kv)? {
                Attribute::RequestId(id) => e.request_id = id.map(Arc::from),
                Attribute::Latency(slot, seconds) => {
                    latencies = true;
                    let d = engine_duration(seconds);
                    out_of_range |= d.is_none();
                    *match slot {
                        Slot::Queue => &mut e.queue,
                        Slot::Prefill => &mut e.prefill,
                        Slot::Decode => &mut e.decode,
                        Slot::Ttft => &mut e.ttft,
                        Slot::E2e => &mut e.e2e,
                    } = d;
                }
                Attribute::Other => {}
            },
            (1 | 4 | 9, _) => {
                return Err(BadExport::Decode("a span field has the wrong wire type"))
            }
            _ => {}
        }
    }
    let (Some(trace), Some(parent), true) = (trace, parent, latencies) else {
        return Ok(());
    };
    out.out_of_range += u64::from(out_of_range);
    if out.spans.len() >= MAX_SPANS_PER_EXPORT {
        out.dropped += 1;
        return Ok(());
    }
    e.trace_id = u128::from_be_bytes(trace);
    e.parent = u64::from_be_bytes(parent);
    out.spans.push(e);
    Ok(())
}

/// `seconds` as an engine's duration: a clock that went back reads as zero; not a number, or
/// past `MAX_ENGINE_DURATION`, is no engine's time (`None`).
fn engine_duration(seconds: f64) -> Option<Duration> {
    if seconds.is_nan() {
        return None;
    }
    Duration::try_from_secs_f64(seconds.max(0.0))
        .ok()
        .filter(|d| *d <= MAX_ENGINE_DURATION)
}

#[derive(Debug, Clone, Copy)]
enum Slot {
    Queue,
    Prefill,
    Decode,
    Ttft,
    E2e,
}

enum Attribute<'a> {
    /// The id, or `None` where it is too long (or not UTF-8) to keep.
    RequestId(Option<&'a str>),
    Latency(Slot, f64),
    Other,
}

/// One `KeyValue { string key = 1; AnyValue value = 2; }`, where its key is one the receiver
/// reads. Read as protobuf reads it: the last key wins, and the values of a repeated `value`
/// field merge (the oneof's last member wins).
fn attribute(kv: &[u8]) -> Result<Attribute<'_>, BadExport> {
    let mut key = None;
    let mut fields = Fields(kv);
    while let Some((field, v)) = fields.next_field()? {
        match (field, v) {
            (1, Value::Len(k)) => key = Some(k),
            (2, Value::Len(_)) => {}
            (1 | 2, _) => return Err(BadExport::Decode("an attribute has the wrong wire type")),
            _ => {}
        }
    }
    let slot = match key.unwrap_or_default() {
        b"gen_ai.request.id" => None,
        b"gen_ai.latency.time_in_queue" => Some(Slot::Queue),
        b"gen_ai.latency.time_in_model_prefill" => Some(Slot::Prefill),
        b"gen_ai.latency.time_in_model_decode" => Some(Slot::Decode),
        b"gen_ai.latency.time_to_first_token" => Some(Slot::Ttft),
        b"gen_ai.latency.e2e" => Some(Slot::E2e),
        _ => return Ok(Attribute::Other),
    };
    let mut read = Attribute::Other;
    let mut fields = Fields(kv);
    while let Some((field, v)) = fields.next_field()? {
        let (2, Value::Len(value)) = (field, v) else {
            continue;
        };
        // AnyValue { oneof: string_value = 1; bool_value = 2; int_value = 3; double_value = 4;
        // array_value = 5; kvlist_value = 6; bytes_value = 7 }
        let mut any = Fields(value);
        while let Some((field, v)) = any.next_field()? {
            read = match (slot, field, v) {
                (None, 1, Value::Len(s)) => match std::str::from_utf8(s) {
                    Ok(id) if id.len() <= MAX_REQUEST_ID_BYTES => Attribute::RequestId(Some(id)),
                    _ => Attribute::RequestId(None),
                },
                (Some(slot), 3, Value::Varint(x)) => Attribute::Latency(slot, x as i64 as f64),
                (Some(slot), 4, Value::Fixed64(x)) => Attribute::Latency(slot, f64::from_bits(x)),
                (_, 1..=7, _) => Attribute::Other,
                // An unknown field is no member of the oneof.
                _ => continue,
            };
        }
    }
    Ok(read)
}

/// A field's value on the wire.
#[derive(Debug, Clone, Copy)]
enum Value<'a> {
    Varint(u64),
    Fixed64(u64),
    Len(&'a [u8]),
    Fixed32,
}

impl<'a> Value<'a> {
    /// The bytes of the embedded message at field `want`, when this is that field.
    fn message_at(self, field: u32, want: u32) -> Result<Option<&'a [u8]>, BadExport> {
        match (field == want, self) {
            (false, _) => Ok(None),
            (true, Value::Len(b)) => Ok(Some(b)),
            (true, _) => Err(BadExport::Decode("a message field has the wrong wire type")),
        }
    }
}

/// The fields of one protobuf message, in order, borrowed from its bytes.
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn varint(&mut self) -> Result<u64, BadExport> {
        let mut x = 0u64;
        for (i, &b) in self.0.iter().enumerate().take(10) {
            x |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                self.0 = &self.0[i + 1..];
                return Ok(x);
            }
        }
        Err(BadExport::Decode(
            "a varint runs past its message or 10 bytes",
        ))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], BadExport> {
        if n > self.0.len() {
            return Err(BadExport::Decode(
                "a field runs past the end of its message",
            ));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    /// The next field's number and value; `None` at the end of the message.
    fn next_field(&mut self) -> Result<Option<(u32, Value<'a>)>, BadExport> {
        if self.0.is_empty() {
            return Ok(None);
        }
        let tag = self.varint()?;
        let field = u32::try_from(tag >> 3).unwrap_or(0);
        if field == 0 {
            return Err(BadExport::Decode("field number 0"));
        }
        let value = match tag & 7 {
            0 => Value::Varint(self.varint()?),
            1 => {
                let b = self.take(8)?;
                Value::Fixed64(u64::from_le_bytes(b.try_into().unwrap_or_default()))
            }
            2 => {
                let n = usize::try_from(self.varint()?).unwrap_or(usize::MAX);
                Value::Len(self.take(n)?)
            }
            5 => {
                self.take(4)?;
                Value::Fixed32
            }
            _ => return Err(BadExport::Decode("an unknown or group wire type")),
        };
        Ok(Some((field, value)))
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
    use prost::Message;

    fn kv(k: &str, v: any_value::Value) -> KeyValue {
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

    /// What `prost` decodes the same export to, read as the receiver reads a span: the
    /// reference the walker is held to.
    fn by_prost(body: &[u8]) -> Option<Vec<EngineSpan>> {
        let req = ExportTraceServiceRequest::decode(body).ok()?;
        let mut out = Vec::new();
        for s in req
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| &s.spans)
        {
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
            for a in &s.attributes {
                let v = a.value.as_ref().and_then(|v| v.value.as_ref());
                let slot = match a.key.as_str() {
                    "gen_ai.request.id" => {
                        if let Some(any_value::Value::StringValue(id)) = v {
                            e.request_id =
                                (id.len() <= MAX_REQUEST_ID_BYTES).then(|| Arc::from(id.as_str()));
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
                    Some(any_value::Value::DoubleValue(x)) => *x,
                    Some(any_value::Value::IntValue(x)) => *x as f64,
                    _ => continue,
                };
                *slot = engine_duration(seconds);
                latencies = true;
            }
            if latencies {
                out.push(e);
            }
        }
        Some(out)
    }

    fn llm(trace: u128, parent: u64, attributes: Vec<KeyValue>) -> Span {
        Span {
            trace_id: trace.to_be_bytes().to_vec(),
            parent_span_id: parent.to_be_bytes().to_vec(),
            name: "llm_request".into(),
            attributes,
            ..Default::default()
        }
    }

    #[test]
    fn reads_vllm_latencies_and_skips_other_spans() {
        use any_value::Value::*;
        let span = llm(
            7,
            9,
            vec![
                kv("gen_ai.request.id", StringValue("chatcmpl-1".into())),
                kv("gen_ai.latency.time_in_queue", DoubleValue(0.25)),
                kv("gen_ai.latency.time_in_model_prefill", DoubleValue(0.5)),
                kv("gen_ai.latency.time_in_model_decode", DoubleValue(-1.0)),
                kv("gen_ai.usage.prompt_tokens", IntValue(12)),
            ],
        );
        let other = Span {
            trace_id: 7u128.to_be_bytes().to_vec(),
            parent_span_id: 1u64.to_be_bytes().to_vec(),
            name: "http".into(),
            ..Default::default()
        };
        let rootless = Span {
            trace_id: vec![1, 2],
            ..span.clone()
        };
        let body = export(vec![other, span, rootless]);
        let got = decode(&body).unwrap_or_default();
        assert_eq!(
            got.spans,
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
        assert_eq!(Some(got.spans), by_prost(&body));
        assert!(decode(b"\xff\xff\xff").is_err());
    }

    #[test]
    fn forged_durations_and_ids_are_left_out_and_counted() {
        use any_value::Value::*;
        let body = export(vec![llm(
            1,
            2,
            vec![
                kv("gen_ai.request.id", StringValue("x".repeat(1 << 20))),
                kv("gen_ai.latency.time_in_queue", DoubleValue(1e19)),
                kv(
                    "gen_ai.latency.time_in_model_prefill",
                    DoubleValue(f64::NAN),
                ),
                kv("gen_ai.latency.time_in_model_decode", IntValue(i64::MAX)),
                kv("gen_ai.latency.e2e", DoubleValue(2.0)),
            ],
        )]);
        let got = decode(&body).unwrap_or_default();
        assert_eq!(got.out_of_range, 1);
        let s = &got.spans[0];
        assert_eq!(
            (s.request_id.as_deref(), s.queue, s.prefill, s.decode, s.e2e),
            (None, None, None, None, Some(Duration::from_secs(2)))
        );
        assert_eq!(Some(got.spans), by_prost(&body));
    }

    #[test]
    fn millions_of_empty_spans_cost_no_memory_and_engine_spans_are_capped() {
        // 8 M empty spans in 16 MiB: nothing kept, nothing allocated per span.
        let mut scope = Vec::new();
        for _ in 0..(8 << 20) {
            scope.extend_from_slice(&[0x12, 0x00]);
        }
        let body = wrap(wrap(scope, 2), 1);
        let got = decode(&body).unwrap_or_default();
        assert_eq!((got.spans.len(), got.dropped), (0, 0));
        // Engine spans past the cap are counted, not kept.
        let one = export(vec![llm(
            1,
            2,
            vec![kv("gen_ai.latency.e2e", any_value::Value::DoubleValue(1.0))],
        )]);
        let span = ExportTraceServiceRequest::decode(one.as_slice())
            .map(|r| r.resource_spans[0].scope_spans[0].spans[0].encode_to_vec())
            .unwrap_or_default();
        let mut scope = Vec::new();
        for _ in 0..MAX_SPANS_PER_EXPORT + 5 {
            scope.extend(wrap(span.clone(), 2));
        }
        let got = decode(&wrap(wrap(scope, 2), 1)).unwrap_or_default();
        assert_eq!((got.spans.len(), got.dropped), (MAX_SPANS_PER_EXPORT, 5));
    }

    /// `inner` as field `field` (length-delimited) of a message.
    fn wrap(inner: Vec<u8>, field: u8) -> Vec<u8> {
        let mut out = vec![(field << 3) | 2];
        let mut n = inner.len();
        while n >= 0x80 {
            out.push((n as u8) | 0x80);
            n >>= 7;
        }
        out.push(n as u8);
        out.extend(inner);
        out
    }

    #[test]
    fn the_walker_reads_what_prost_decodes_and_refuses_what_it_refuses() {
        use any_value::Value::*;
        // Generated exports: spans of every shape the receiver meets, encoded, then cut short,
        // a byte overwritten, or left whole; the walker and prost must agree on each.
        let mut rng = crate::util::Rng::new(11);
        let mut pick = |n: u64| rng.next_u64() % n;
        let (mut agreed, mut refused) = (0, 0);
        for _ in 0..3000 {
            let spans = (0..pick(4))
                .map(|_| {
                    let keys = [
                        "gen_ai.request.id",
                        "gen_ai.latency.time_in_queue",
                        "gen_ai.latency.e2e",
                        "gen_ai.latency.time_to_first_token",
                        "other",
                    ];
                    let attributes = (0..pick(5))
                        .map(|_| {
                            let v = match pick(5) {
                                0 => StringValue("id".into()),
                                1 => DoubleValue((pick(2000) as f64 - 100.0) / 7.0),
                                2 => IntValue(pick(5) as i64),
                                3 => BoolValue(true),
                                _ => DoubleValue(1e300),
                            };
                            kv(keys[pick(keys.len() as u64) as usize], v)
                        })
                        .collect();
                    let mut s = llm(u128::from(pick(9)), pick(9), attributes);
                    if pick(6) == 0 {
                        s.parent_span_id.clear();
                    }
                    s
                })
                .collect();
            let mut body = export(spans);
            match pick(3) {
                0 if !body.is_empty() => {
                    let i = pick(body.len() as u64) as usize;
                    body.truncate(i);
                }
                1 if !body.is_empty() => {
                    let i = pick(body.len() as u64) as usize;
                    body[i] = pick(256) as u8;
                }
                _ => {}
            }
            match (decode(&body), by_prost(&body)) {
                (Ok(ours), Some(theirs)) => {
                    assert_eq!(ours.spans, theirs, "{body:?}");
                    agreed += 1;
                }
                (Err(_), None) => refused += 1,
                // prost checks what the walker skips (UTF-8 in names, nested values): a body it
                // refuses may still be walked, never the other way round.
                (Ok(_), None) => refused += 1,
                (Err(e), Some(_)) => panic!("walker refused what prost read: {e} {body:?}"),
            }
        }
        assert!(agreed > 1000 && refused > 100, "{agreed} {refused}");
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
