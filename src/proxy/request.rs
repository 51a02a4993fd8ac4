//! Request-side helpers: reading the bounded JSON body of inference endpoints, the
//! `stream_options.include_usage` injection, hop-by-hop header removal, and ids.

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName};
use serde_json::Value;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// What the gateway learned from an inference request body, and the body to forward.
#[derive(Debug)]
pub struct Inspected {
    /// `model`, when the body names one.
    pub model: Option<String>,
    /// `stream: true`.
    pub stream: bool,
    /// The gateway added `include_usage`, so the usage-only chunk must be cut from the response.
    pub strip_usage: bool,
    /// The body to forward (the original bytes unless usage was injected).
    pub body: Bytes,
}

/// Reads what measurement needs from a JSON request body and, for a streaming OpenAI request that
/// does not ask for usage, asks for it. A body that is not a JSON object is forwarded untouched.
pub fn inspect(body: Bytes, openai: bool) -> Inspected {
    let mut out = Inspected {
        model: None,
        stream: false,
        strip_usage: false,
        body,
    };
    let Ok(Value::Object(mut v)) = serde_json::from_slice::<Value>(&out.body) else {
        return out;
    };
    out.model = v.get("model").and_then(Value::as_str).map(str::to_owned);
    out.stream = v.get("stream").and_then(Value::as_bool).unwrap_or(false);
    if !(openai && out.stream) {
        return out;
    }
    match v.get_mut("stream_options") {
        Some(Value::Object(opts)) => {
            if opts.get("include_usage").and_then(Value::as_bool) == Some(true) {
                return out;
            }
            opts.insert("include_usage".into(), Value::Bool(true));
            if let Ok(b) = serde_json::to_vec(&v) {
                out.body = Bytes::from(b);
                out.strip_usage = true;
            }
        }
        Some(_) => {} // a non-object stream_options is the backend's to reject
        None => {
            // Append the option before the closing brace, keeping the client's bytes as they are.
            if let Some(end) = out.body.iter().rposition(|b| *b == b'}') {
                const ADD: &[u8] = br#","stream_options":{"include_usage":true}"#;
                let mut b = BytesMut::with_capacity(out.body.len() + ADD.len());
                b.extend_from_slice(&out.body[..end]);
                b.extend_from_slice(ADD);
                b.extend_from_slice(&out.body[end..]);
                out.body = b.freeze();
                out.strip_usage = true;
            }
        }
    }
    out
}

/// Removes hop-by-hop headers (RFC 9110 §7.6.1), including those the `Connection` header names.
pub fn remove_hop_headers(h: &mut HeaderMap) {
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::try_from(n.trim()).ok())
        .collect();
    for n in named {
        h.remove(n);
    }
    for n in [
        header::CONNECTION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::PROXY_AUTHORIZATION,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
    ] {
        h.remove(n);
    }
}

/// Process-unique id source: a random prefix (so ids differ across restarts and replicas) and a
/// counter.
#[derive(Debug)]
pub struct Ids {
    prefix: u64,
    counter: AtomicU64,
    traces: AtomicU64,
}

impl Default for Ids {
    fn default() -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let seed = nanos ^ (u64::from(std::process::id()) << 32);
        Self {
            prefix: crate::route::fnv1a(&seed.to_le_bytes()),
            counter: AtomicU64::new(0),
            traces: AtomicU64::new(0),
        }
    }
}

impl Ids {
    /// A new request id: 16 hex digits of prefix, then the counter.
    pub fn request_id(&self) -> String {
        format!(
            "{:016x}-{}",
            self.prefix,
            self.counter.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// A new W3C trace id (32 hex digits, never all zero).
    pub fn trace_id(&self) -> String {
        let n = self.traces.fetch_add(1, Ordering::Relaxed);
        let a = crate::route::fnv1a(&(self.prefix ^ n).to_le_bytes());
        let b = crate::route::fnv1a(&a.to_le_bytes()) | 1;
        format!("{a:016x}{b:016x}")
    }
}

/// The trace id of a valid W3C `traceparent` header (`00-<trace-id>-<parent-id>-<flags>`).
pub fn traceparent_trace_id(h: &HeaderMap) -> Option<&str> {
    let v = h.get("traceparent")?.to_str().ok()?;
    let mut parts = v.split('-');
    let (version, trace, parent, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let valid = hex(version, 2)
        && version != "ff"
        && hex(trace, 32)
        && trace.bytes().any(|b| b != b'0')
        && hex(parent, 16)
        && hex(flags, 2);
    valid.then_some(trace)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn injects_usage_only_when_missing_and_keeps_bytes() {
        let body = Bytes::from_static(br#"{"model": "m", "stream": true, "messages": []}"#);
        let i = inspect(body, true);
        assert!(i.strip_usage && i.stream);
        assert_eq!(i.model.as_deref(), Some("m"));
        assert_eq!(&i.body[..], &br#"{"model": "m", "stream": true, "messages": [],"stream_options":{"include_usage":true}}"#[..]);

        let asked =
            Bytes::from_static(br#"{"stream":true,"stream_options":{"include_usage":true}}"#);
        let i = inspect(asked.clone(), true);
        assert!(!i.strip_usage);
        assert_eq!(i.body, asked);

        let off =
            Bytes::from_static(br#"{"stream":true,"stream_options":{"include_usage":false}}"#);
        let i = inspect(off, true);
        assert!(i.strip_usage);
        let v: Value = serde_json::from_slice(&i.body).unwrap_or_default();
        assert_eq!(
            v.pointer("/stream_options/include_usage"),
            Some(&Value::Bool(true))
        );

        let plain = Bytes::from_static(br#"{"stream":false}"#);
        assert!(!inspect(plain, true).strip_usage);
        assert!(!inspect(Bytes::from_static(b"not json"), true).strip_usage);
        assert!(!inspect(Bytes::from_static(br#"{"stream":true}"#), false).strip_usage);
    }

    #[test]
    fn traceparent_parsing() {
        let mut h = HeaderMap::new();
        h.insert(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
                .parse()
                .unwrap_or(http::HeaderValue::from_static("")),
        );
        assert_eq!(
            traceparent_trace_id(&h),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        h.insert(
            "traceparent",
            http::HeaderValue::from_static(
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            ),
        );
        assert_eq!(traceparent_trace_id(&h), None);
        let ids = Ids::default();
        assert_ne!(ids.trace_id(), ids.trace_id());
        assert_eq!(ids.trace_id().len(), 32);
    }
}
