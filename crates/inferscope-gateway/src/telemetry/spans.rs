//! Spans from a finished `RequestRecord`: a SERVER span for the inbound request and a CLIENT child
//! for the upstream attempt, built after the fact with the real start and end times (the end is the
//! end of the stream, not of the headers) and the ids fixed when the request arrived.

use super::names as n;
use super::Settings;
use crate::config::TelemetryFormat;
use crate::meter::NONE;
use crate::meter::{Outcome, RequestRecord};
use opentelemetry::trace::{
    Event, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue, Value};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn ctx(rec: &RequestRecord, span: u64) -> SpanContext {
    SpanContext::new(
        TraceId::from(rec.meta.trace.trace_id),
        SpanId::from(span),
        TraceFlags::SAMPLED,
        false,
        TraceState::default(),
    )
}

/// The instrumentation scope of every span (built once).
pub(super) fn scope() -> InstrumentationScope {
    InstrumentationScope::builder(n::SCOPE)
        .with_version(env!("CARGO_PKG_VERSION"))
        .build()
}

fn span(
    rec: &RequestRecord,
    id: u64,
    parent: Option<u64>,
    remote_parent: bool,
    kind: SpanKind,
    scope: &InstrumentationScope,
) -> SpanData {
    SpanData {
        span_context: ctx(rec, id),
        parent_span_id: SpanId::from(parent.unwrap_or(0)),
        parent_span_is_remote: remote_parent,
        span_kind: kind,
        name: Cow::Borrowed(""),
        start_time: rec.meta.ts,
        end_time: rec.wall(rec.t_end()),
        attributes: Vec::new(),
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status: Status::Unset,
        instrumentation_scope: scope.clone(),
    }
}

/// Whether the outcome is an error for span status and `error.type`, and its type.
fn error_type(rec: &RequestRecord) -> Option<String> {
    match rec.outcome {
        Outcome::Ok | Outcome::ClientError if rec.status < 500 => None,
        Outcome::BackendError if rec.status >= 500 => Some(rec.status.to_string()),
        o => Some(rec.error.unwrap_or(o.as_str()).to_string()),
    }
}

/// The spans of one sampled request (empty when not sampled).
pub(super) fn build(
    rec: &RequestRecord,
    s: &Settings,
    listen: SocketAddr,
    scope: &InstrumentationScope,
) -> Vec<SpanData> {
    let m = &rec.meta;
    if !m.trace.sampled {
        return Vec::new();
    }
    let err = error_type(rec);
    let mut out = Vec::with_capacity(2);

    // SERVER span: the inbound HTTP request as the client saw it.
    let mut server = span(
        rec,
        m.trace.server_span,
        m.trace.parent,
        m.trace.parent.is_some(),
        SpanKind::Server,
        scope,
    );
    server.name = Cow::Owned(format!("{} {}", m.method, m.path));
    server.attributes = vec![
        KeyValue::new(n::HTTP_REQUEST_METHOD, m.method.to_string()),
        KeyValue::new(n::URL_PATH, Value::from(Arc::clone(&m.path))),
        KeyValue::new(n::HTTP_RESPONSE_STATUS_CODE, i64::from(rec.status)),
        KeyValue::new(n::SERVER_ADDRESS, listen.ip().to_string()),
        KeyValue::new(n::SERVER_PORT, i64::from(listen.port())),
        KeyValue::new(n::IS_REQUEST_ID, Value::from(Arc::clone(&m.request_id))),
        KeyValue::new(n::IS_ROUTE, Value::from(Arc::clone(&m.route))),
        KeyValue::new(n::IS_OUTCOME, rec.outcome.as_str()),
    ];
    if let Some(k) = &crate::facts::Facts::of(m).key {
        server
            .attributes
            .push(KeyValue::new(n::IS_CLIENT_KEY, Value::from(Arc::clone(k))));
    }
    if let Some(e) = &err {
        server
            .attributes
            .push(KeyValue::new(n::ERROR_TYPE, e.clone()));
        server.status = Status::error(e.clone());
    }
    out.push(server);

    // One CLIENT span per failed attempt that was retried elsewhere.
    for at in &crate::facts::Facts::of(m).attempts {
        let mut failed = span(
            rec,
            at.span_id,
            Some(m.trace.server_span),
            false,
            SpanKind::Client,
            scope,
        );
        failed.start_time = rec.wall(at.t_sent);
        failed.end_time = rec.wall(at.t_end);
        let op = m.params.operation.unwrap_or("http");
        failed.name = Cow::Owned(if m.model.as_ref() == NONE {
            op.to_string()
        } else {
            format!("{op} {}", m.model)
        });
        let err = at
            .status
            .map_or_else(|| at.error.to_string(), |s| s.to_string());
        failed.attributes = vec![
            KeyValue::new(n::GEN_AI_OPERATION_NAME, op),
            KeyValue::new(n::IS_BACKEND, Value::from(Arc::clone(&at.backend))),
            KeyValue::new(n::ERROR_TYPE, err.clone()),
        ];
        if let Some(st) = at.status {
            failed
                .attributes
                .push(KeyValue::new(n::HTTP_RESPONSE_STATUS_CODE, i64::from(st)));
        }
        failed.status = Status::error(err);
        out.push(failed);
    }

    // CLIENT span: the upstream attempt, from the upstream send to the end of the stream.
    let Some(t_sent) = m.t_sent else { return out };
    let mut client = span(
        rec,
        m.trace.client_span,
        Some(m.trace.server_span),
        false,
        SpanKind::Client,
        scope,
    );
    client.start_time = rec.wall(t_sent);
    let op = m.params.operation.unwrap_or("http");
    client.name = Cow::Owned(if m.model.as_ref() == NONE {
        op.to_string()
    } else {
        format!("{op} {}", m.model)
    });
    let mut a = vec![
        KeyValue::new(n::GEN_AI_OPERATION_NAME, op),
        KeyValue::new(n::GEN_AI_REQUEST_STREAM, m.stream),
        KeyValue::new(n::IS_REQUEST_ID, Value::from(Arc::clone(&m.request_id))),
        KeyValue::new(n::IS_ROUTE, Value::from(Arc::clone(&m.route))),
        KeyValue::new(n::IS_BACKEND, Value::from(Arc::clone(&m.backend))),
        KeyValue::new(n::IS_VARIANT, Value::from(Arc::clone(&m.variant))),
        KeyValue::new(n::IS_PURPOSE, m.purpose.as_str()),
        KeyValue::new(n::IS_OUTCOME, rec.outcome.as_str()),
        KeyValue::new(n::HTTP_RESPONSE_STATUS_CODE, i64::from(rec.status)),
        KeyValue::new(n::IS_E2E, secs(rec.e2e)),
    ];
    if m.variant_forced {
        a.push(KeyValue::new(n::IS_VARIANT_FORCED, true));
    }
    if m.model.as_ref() != NONE {
        a.push(KeyValue::new(
            n::GEN_AI_REQUEST_MODEL,
            Value::from(Arc::clone(&m.model)),
        ));
    }
    if let Some(b) = &crate::facts::Facts::of(m).upstream {
        a.push(KeyValue::new(
            n::GEN_AI_PROVIDER_NAME,
            Value::from(Arc::clone(&b.provider)),
        ));
        if !s.genai_latest_only {
            a.push(KeyValue::new(
                n::GEN_AI_SYSTEM,
                Value::from(Arc::clone(&b.provider)),
            ));
        }
        if let Some(host) = &b.address {
            a.push(KeyValue::new(
                n::SERVER_ADDRESS,
                Value::from(Arc::clone(host)),
            ));
        }
        if let Some(port) = b.port {
            a.push(KeyValue::new(n::SERVER_PORT, i64::from(port)));
        }
    }
    let p = &m.params;
    if let Some(v) = p.max_tokens {
        a.push(KeyValue::new(n::GEN_AI_REQUEST_MAX_TOKENS, v as i64));
    }
    if let Some(v) = p.temperature {
        a.push(KeyValue::new(n::GEN_AI_REQUEST_TEMPERATURE, v));
    }
    if let Some(v) = p.top_p {
        a.push(KeyValue::new(n::GEN_AI_REQUEST_TOP_P, v));
    }
    let r = &rec.response;
    if let Some(v) = &r.id {
        a.push(KeyValue::new(n::GEN_AI_RESPONSE_ID, v.clone()));
    }
    if let Some(v) = &r.model {
        a.push(KeyValue::new(n::GEN_AI_RESPONSE_MODEL, v.clone()));
    }
    if let Some(f) = &rec.finish_reason {
        a.push(KeyValue::new(
            n::GEN_AI_RESPONSE_FINISH_REASONS,
            Value::Array(opentelemetry::Array::String(vec![f
                .as_str()
                .to_string()
                .into()])),
        ));
    }
    let tokens = [
        (n::GEN_AI_USAGE_INPUT_TOKENS, rec.input_tokens),
        (n::GEN_AI_USAGE_OUTPUT_TOKENS, rec.output_tokens),
        (
            n::GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
            r.cached_input_tokens,
        ),
        (n::GEN_AI_USAGE_REASONING_OUTPUT_TOKENS, r.reasoning_tokens),
    ];
    for (k, v) in tokens {
        if let Some(v) = v {
            a.push(KeyValue::new(k, v as i64));
        }
    }
    if let Some(t) = rec.tokens_source {
        a.push(KeyValue::new(n::IS_TOKENS_SOURCE, t.as_str()));
    }
    if let Some(t) = rec.event_tokens {
        a.push(KeyValue::new(n::IS_EVENT_TOKENS, t.as_str()));
    }
    if let Some(e) = crate::facts::Facts::of(&rec.meta).engine {
        let load = [
            (n::IS_BACKEND_RUNNING, e.running),
            (n::IS_BACKEND_QUEUE_DEPTH, e.waiting),
            (n::IS_BACKEND_KV_CACHE_USAGE, e.kv_cache_usage),
        ];
        for (k, v) in load {
            if let Some(v) = v {
                a.push(KeyValue::new(k, f64::from(v)));
            }
        }
    }
    let engine = rec.response.engine.unwrap_or_default();
    let joined = rec.engine_joined();
    match (rec.engine_span.get(), joined) {
        (Some(_), Some((_, starved))) => {
            a.push(KeyValue::new(n::IS_ENGINE_SPAN, "joined"));
            if let Some(s) = starved {
                a.push(KeyValue::new(n::IS_STARVED, s));
            }
            for (k, b) in [
                (n::IS_TTFT_REST, rec.ttft_breakdown()),
                (n::IS_E2E_REST, rec.e2e_breakdown()),
            ] {
                if let Some(b) = b {
                    a.push(KeyValue::new(k, b.rest_us as f64 / 1e6));
                }
            }
        }
        (Some(_), None) => a.push(KeyValue::new(n::IS_ENGINE_SPAN, "missing")),
        (None, _) => {}
    }
    let durations = [
        (n::IS_ENGINE_QUEUE, joined.and_then(|(s, _)| s.queue)),
        (
            n::IS_ENGINE_PREFILL,
            joined.map_or(engine.prefill, |(s, _)| s.prefill),
        ),
        (
            n::IS_ENGINE_DECODE,
            joined.map_or(engine.decode, |(s, _)| s.decode),
        ),
        (n::GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK, rec.ttfc),
        (n::IS_TTFC, rec.ttfc),
        (n::IS_TTFT, rec.ttft),
        (n::IS_TPOT, rec.tpot),
        (n::IS_UPSTREAM_TTFT, rec.upstream_ttft),
        (n::IS_OVERHEAD, rec.overhead),
        (n::IS_ACCEPT_DELAY, rec.meta.accept_delay),
        (n::IS_FORWARD_LAG, rec.forward_lag),
    ];
    a.push(KeyValue::new(n::IS_CLOCK, rec.meta.clock.as_str()));
    for (k, v) in durations {
        if let Some(v) = v {
            a.push(KeyValue::new(k, secs(v)));
        }
    }
    if let Some(itl) = rec.itl_summary() {
        let s = |us: u64| secs(Duration::from_micros(us));
        a.push(KeyValue::new(n::IS_ITL_P50, s(itl.p50_us)));
        a.push(KeyValue::new(n::IS_ITL_P99, s(itl.p99_us)));
        a.push(KeyValue::new(n::IS_ITL_MAX, s(itl.max_us)));
        a.push(KeyValue::new(n::IS_ITL_COUNT, itl.count as i64));
    }
    if let Some(e) = &err {
        a.push(KeyValue::new(n::ERROR_TYPE, e.clone()));
        client.status = Status::error(e.clone());
    }
    if s.capture_content.is_some() {
        if let Some(input) = &p.input_content {
            a.push(KeyValue::new(n::GEN_AI_INPUT_MESSAGES, input.clone()));
        }
        if let Some(text) = &r.output_content {
            let msg = serde_json::json!([{
                "role": "assistant",
                "parts": [{"type": "text", "content": text}],
                "finish_reason": rec.finish_reason.as_ref().map(|f| f.as_str()),
            }]);
            a.push(KeyValue::new(n::GEN_AI_OUTPUT_MESSAGES, msg.to_string()));
        }
    }
    if s.format == TelemetryFormat::OpenInference {
        openinference(rec, s, &mut a);
    }
    client.attributes = a;
    if let Some(ttft) = rec.ttft {
        client.events.events.push(Event::new(
            n::EVENT_FIRST_TOKEN,
            rec.wall(m.t0 + ttft),
            vec![KeyValue::new(n::IS_TTFT, secs(ttft))],
            0,
        ));
    }
    out.push(client);
    out
}

/// The OpenInference attribute set (Arize Phoenix) for the upstream LLM call.
fn openinference(rec: &RequestRecord, s: &Settings, a: &mut Vec<KeyValue>) {
    let m = &rec.meta;
    a.push(KeyValue::new(n::OI_SPAN_KIND, "LLM"));
    if m.model.as_ref() != NONE {
        a.push(KeyValue::new(
            n::OI_LLM_MODEL_NAME,
            Value::from(Arc::clone(&m.model)),
        ));
    }
    if let Some(b) = &crate::facts::Facts::of(m).upstream {
        a.push(KeyValue::new(
            n::OI_LLM_PROVIDER,
            Value::from(Arc::clone(&b.provider)),
        ));
    }
    let params = serde_json::json!({
        "max_tokens": m.params.max_tokens,
        "temperature": m.params.temperature,
        "top_p": m.params.top_p,
        "stream": m.stream,
    });
    a.push(KeyValue::new(
        n::OI_LLM_INVOCATION_PARAMETERS,
        params.to_string(),
    ));
    if let Some(i) = rec.input_tokens {
        a.push(KeyValue::new(n::OI_TOKEN_COUNT_PROMPT, i as i64));
    }
    if let Some(o) = rec.output_tokens {
        a.push(KeyValue::new(n::OI_TOKEN_COUNT_COMPLETION, o as i64));
    }
    if let (Some(i), Some(o)) = (rec.input_tokens, rec.output_tokens) {
        a.push(KeyValue::new(n::OI_TOKEN_COUNT_TOTAL, (i + o) as i64));
    }
    if s.capture_content.is_some() {
        if let Some(input) = &m.params.input_content {
            a.push(KeyValue::new(n::OI_INPUT_VALUE, input.clone()));
        }
        if let Some(text) = &rec.response.output_content {
            a.push(KeyValue::new(n::OI_OUTPUT_VALUE, text.clone()));
        }
    }
}

/// A standalone gateway event: a zero-length INTERNAL span in a new trace, with one event.
pub(super) fn event(
    name: &'static str,
    attrs: Vec<(&'static str, String)>,
    scope: &InstrumentationScope,
) -> SpanData {
    let now = std::time::SystemTime::now();
    let ids = crate::util::stable_hash(&format!("{now:?}{name}").into_bytes());
    let attributes: Vec<KeyValue> = attrs
        .into_iter()
        .map(|(k, v)| KeyValue::new(k, v))
        .collect();
    SpanData {
        span_context: SpanContext::new(
            TraceId::from(u128::from(ids) << 64 | u128::from(ids.rotate_left(17) | 1)),
            SpanId::from(ids | 1),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        ),
        parent_span_id: SpanId::from(0),
        parent_span_is_remote: false,
        span_kind: SpanKind::Internal,
        name: Cow::Borrowed(name),
        start_time: now,
        end_time: now,
        attributes: attributes.clone(),
        dropped_attributes_count: 0,
        events: {
            let mut e = SpanEvents::default();
            e.events.push(Event::new(name, now, attributes, 0));
            e
        },
        links: SpanLinks::default(),
        status: Status::Unset,
        instrumentation_scope: scope.clone(),
    }
}
