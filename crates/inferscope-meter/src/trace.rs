//! W3C trace context: continue the client's `traceparent`, or start a trace; decide sampling once,
//! at the start, so what is propagated upstream and what is exported agree.

use crate::util::ids::{hex, hex_str};
use http::HeaderMap;
use std::sync::Arc;

/// The W3C trace-context header, built at compile time (a `&str` key is parsed at every use).
pub const TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");

/// Trace and span ids of one request, fixed when the request arrives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TraceContext {
    /// Trace id (continued from the client's `traceparent`, or new).
    pub trace_id: u128,
    /// The client's span id, when the client sent a valid `traceparent`.
    pub parent: Option<u64>,
    /// Id of the gateway's SERVER span for the request.
    pub server_span: u64,
    /// Id of the CLIENT span for the upstream attempt (the `parent-id` sent upstream).
    pub client_span: u64,
    /// Whether spans of this trace are recorded and the upstream is told so.
    pub sampled: bool,
}

impl TraceContext {
    /// Builds the context: `ids` yields fresh non-zero ids; `ratio` samples new traces.
    pub fn start(headers: &HeaderMap, mut ids: impl FnMut() -> u64, ratio: f64) -> Self {
        let (trace_id, parent, parent_sampled) = match parse_traceparent(headers) {
            Some((t, p, sampled)) => (t, Some(p), Some(sampled)),
            None => ((u128::from(ids()) << 64) | u128::from(ids()), None, None),
        };
        // Parent-based: a client's decision stands; otherwise the trace id decides, the same way
        // the OpenTelemetry ratio sampler does, so every replica agrees.
        let sampled = parent_sampled.unwrap_or_else(|| sample(trace_id, ratio));
        Self {
            trace_id,
            parent,
            server_span: ids(),
            client_span: ids(),
            sampled,
        }
    }

    /// 32 lowercase hex digits.
    pub(crate) fn trace_id_hex(&self) -> Arc<str> {
        hex_str(&hex::<32>(self.trace_id))
    }

    /// The `traceparent` to send upstream: this trace, the CLIENT span as parent, flagged sampled
    /// when `force` or when this trace is.
    pub fn upstream_traceparent_sampled(&self, force: bool) -> String {
        let mut s = String::with_capacity(55);
        for part in [
            &b"00-"[..],
            &hex::<32>(self.trace_id),
            b"-",
            &hex::<16>(u128::from(self.client_span)),
            b"-",
            &hex::<2>(u128::from(self.sampled || force)),
        ] {
            // Hex digits and dashes: ASCII.
            s.push_str(std::str::from_utf8(part).unwrap_or_default());
        }
        s
    }
}

fn sample(trace_id: u128, ratio: f64) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    if ratio <= 0.0 {
        return false;
    }
    // The low 63 bits of the trace id against the ratio, as TraceIdRatioBased does.
    let low = (trace_id as u64) >> 1;
    (low as f64) < ratio * (u64::MAX >> 1) as f64
}

/// `(trace id, parent span id, sampled)` of a valid `traceparent` header.
pub(crate) fn parse_traceparent(h: &HeaderMap) -> Option<(u128, u64, bool)> {
    let v = h.get(TRACEPARENT)?.to_str().ok()?.trim();
    let mut parts = v.split('-');
    let (version, trace, parent, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let lower_hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    if !(lower_hex(version, 2)
        && version != "ff"
        && lower_hex(trace, 32)
        && lower_hex(parent, 16)
        && lower_hex(flags, 2))
    {
        return None;
    }
    if version == "00" && parts.next().is_some() {
        return None;
    }
    let trace = u128::from_str_radix(trace, 16).ok().filter(|t| *t != 0)?;
    let parent = u64::from_str_radix(parent, 16).ok().filter(|p| *p != 0)?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    Some((trace, parent, flags & 1 == 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(tp: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Ok(v) = http::HeaderValue::from_str(tp) {
            h.insert("traceparent", v);
        }
        h
    }

    #[test]
    fn continues_a_valid_traceparent() {
        let mut n = 0u64;
        let ids = || {
            n += 1;
            n
        };
        let h = headers("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        let c = TraceContext::start(&h, ids, 0.0);
        assert_eq!(&*c.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(c.parent, Some(0x00f0_67aa_0ba9_02b7));
        assert!(c.sampled, "the client's sampled flag wins over ratio 0");
        assert_eq!(
            c.upstream_traceparent_sampled(false),
            format!(
                "00-4bf92f3577b34da6a3ce929d0e0e4736-{:016x}-01",
                c.client_span
            )
        );
    }

    #[test]
    fn rejects_invalid_traceparents() {
        for bad in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            assert_eq!(parse_traceparent(&headers(bad)), None, "{bad}");
        }
    }

    #[test]
    fn ratio_sampling_is_a_function_of_the_trace_id() {
        let n = 10_000u64;
        let sampled = (0..n)
            .filter(|i| sample(u128::from(crate::util::stable_hash(&i.to_le_bytes())), 0.25))
            .count();
        assert!(
            (2300..=2700).contains(&sampled),
            "{sampled} of {n} at ratio 0.25"
        );
        assert!(sample(7, 1.0) && !sample(7, 0.0));
    }
}
