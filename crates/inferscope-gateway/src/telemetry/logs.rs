//! The access log as OTLP log records (`telemetry.export_logs`): one record per finished request,
//! emitted from the telemetry task (never the data path), batched by the SDK's processor on the
//! runtime. Attributes are the access-log line's fields under the same names (nested ones as maps
//! and lists); the body is `METHOD PATH STATUS OUTCOME`; the record carries the request's trace
//! and SERVER span ids, so a backend can join it to the trace.

use opentelemetry::logs::{AnyValue, LogRecord as _, Logger as _, LoggerProvider as _, Severity};
use opentelemetry::{Key, SpanId, TraceFlags, TraceId};
use opentelemetry_sdk::logs::{SdkLogger, SdkLoggerProvider};
use std::collections::HashMap;

use crate::meter::{Outcome, RequestRecord};

/// The event name of every record.
pub(super) const EVENT: &str = "inferscope.access";

/// The log pipeline.
#[derive(Debug)]
pub(super) struct AccessLogs {
    logger: SdkLogger,
}

impl AccessLogs {
    /// A pipeline exporting through `provider` (built with its batch processor; its shutdown
    /// exports what is queued).
    pub(super) fn new(provider: &SdkLoggerProvider) -> Self {
        Self {
            logger: provider.logger(super::names::SCOPE),
        }
    }

    /// Emits one request's record.
    pub(super) fn emit(&self, rec: &RequestRecord) {
        let m = &rec.meta;
        let mut r = self.logger.create_log_record();
        r.set_event_name(EVENT);
        r.set_timestamp(m.ts);
        r.set_observed_timestamp(std::time::SystemTime::now());
        let (severity, text) = if rec.outcome == Outcome::Ok {
            (Severity::Info, "INFO")
        } else {
            (Severity::Warn, "WARN")
        };
        r.set_severity_number(severity);
        r.set_severity_text(text);
        r.set_body(AnyValue::from(format!(
            "{} {} {} {}",
            m.method,
            m.path,
            rec.status,
            rec.outcome.as_str()
        )));
        if let serde_json::Value::Object(fields) = crate::accesslog::line_json(rec) {
            for (k, v) in fields {
                if let Some(v) = any(v) {
                    r.add_attribute(Key::new(k), v);
                }
            }
        }
        let t = &m.trace;
        r.set_trace_context(
            TraceId::from(t.trace_id),
            SpanId::from(t.server_span),
            Some(if t.sampled {
                TraceFlags::SAMPLED
            } else {
                TraceFlags::default()
            }),
        );
        self.logger.emit(r);
    }
}

/// A JSON value as a log attribute value (`null`: left out).
fn any(v: serde_json::Value) -> Option<AnyValue> {
    use serde_json::Value as J;
    Some(match v {
        J::Null => return None,
        J::Bool(b) => AnyValue::Boolean(b),
        J::Number(n) => match n.as_i64() {
            Some(i) => AnyValue::Int(i),
            None => AnyValue::Double(n.as_f64().unwrap_or(f64::NAN)),
        },
        J::String(s) => AnyValue::from(s),
        J::Array(a) => AnyValue::ListAny(Box::new(a.into_iter().filter_map(any).collect())),
        J::Object(o) => AnyValue::Map(Box::new(
            o.into_iter()
                .filter_map(|(k, v)| Some((Key::new(k), any(v)?)))
                .collect::<HashMap<_, _>>(),
        )),
    })
}
