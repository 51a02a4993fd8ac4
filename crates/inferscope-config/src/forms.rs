//! The config's small languages — `sticky_key: header:x-user-id`, a guardrail's
//! `metric: ttft_p99_ms`, `gpu_url: nvml` — parsed into enums while the YAML is read, so a wrong
//! value is refused with the parser's own line, column and key, and nothing downstream parses a
//! string again.

use serde::de::{self, Deserialize, Deserializer, Visitor};
use std::fmt;
use std::marker::PhantomData;

/// `Deserialize` through `TryFrom<String>`, refusing inside the string's own visit so that the
/// YAML parser marks the value's line and column (a `try_from` container attribute would fail
/// after the string is read, marked at the enclosing mapping). In the JSON Schema: a string
/// matching `pattern`.
macro_rules! from_string {
    ($t:ident, $pattern:literal) => {
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_str(Parsed(PhantomData))
            }
        }

        impl schemars::JsonSchema for $t {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($t).into()
            }

            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({ "type": "string", "pattern": $pattern })
            }
        }
    };
}

struct Parsed<T>(PhantomData<T>);

impl<T: TryFrom<String, Error = String>> Visitor<'_> for Parsed<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<T, E> {
        T::try_from(s.to_string()).map_err(E::custom)
    }
}

from_string!(
    StickyKey,
    "^(header:[!#$%&'*+.^_`|~0-9A-Za-z-]+|api_key|body:user)$"
);
from_string!(
    GuardMetric,
    "^((ttft|tpot|e2e)_p(50|90|95|99)_ms|error_rate|feedback:.+)$"
);
from_string!(GpuSource, "^(nvml|/.*|https?://.+)$");

/// Where an experiment's sticky key comes from (`sticky_key:`): requests with the same key go to
/// the same variant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StickyKey {
    /// `header:NAME`: a request header's value.
    Header(http::HeaderName),
    /// `api_key`: the client's bearer token, hashed, never stored.
    ApiKey,
    /// `body:user`: the JSON body's `user` field.
    BodyUser,
}

impl TryFrom<String> for StickyKey {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        match s.as_str() {
            "api_key" => Ok(Self::ApiKey),
            "body:user" => Ok(Self::BodyUser),
            _ => s
                .strip_prefix("header:")
                .and_then(|h| http::HeaderName::try_from(h).ok())
                .map(Self::Header)
                .ok_or_else(|| format!("`{s}`: use `header:NAME`, `api_key` or `body:user`")),
        }
    }
}

/// A latency a guardrail can watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuardLatency {
    /// Time to first token.
    Ttft,
    /// Time per output token.
    Tpot,
    /// End to end.
    E2e,
}

impl GuardLatency {
    fn as_str(self) -> &'static str {
        match self {
            GuardLatency::Ttft => "ttft",
            GuardLatency::Tpot => "tpot",
            GuardLatency::E2e => "e2e",
        }
    }
}

/// What a guardrail rule watches (`metric:`) over its window.
#[derive(Debug, Clone, PartialEq)]
pub enum GuardMetric {
    /// `ttft_p99_ms`, `tpot_p50_ms`, `e2e_p90_ms` (any of p50, p90, p95, p99): a percentile,
    /// milliseconds.
    Latency {
        /// Which latency.
        of: GuardLatency,
        /// Which percentile: 50, 90, 95 or 99.
        percentile: u8,
    },
    /// `error_rate`: errors over requests.
    ErrorRate,
    /// `feedback:NAME`: the mean of a feedback signal.
    Feedback(String),
}

impl TryFrom<String> for GuardMetric {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        if s == "error_rate" {
            return Ok(Self::ErrorRate);
        }
        if let Some(name) = s.strip_prefix("feedback:").filter(|n| !n.is_empty()) {
            return Ok(Self::Feedback(name.to_string()));
        }
        let latency = s
            .strip_suffix("_ms")
            .and_then(|r| r.rsplit_once("_p"))
            .and_then(|(name, q)| {
                let of = match name {
                    "ttft" => GuardLatency::Ttft,
                    "tpot" => GuardLatency::Tpot,
                    "e2e" => GuardLatency::E2e,
                    _ => return None,
                };
                let percentile = ["50", "90", "95", "99"]
                    .contains(&q)
                    .then(|| q.parse().ok())??;
                Some(Self::Latency { of, percentile })
            });
        latency.ok_or_else(|| {
            format!("`{s}`: use ttft_p99_ms, tpot_p50_ms, e2e_p90_ms (p50/p90/p95/p99), error_rate or feedback:NAME")
        })
    }
}

impl fmt::Display for GuardMetric {
    /// As written in the config.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GuardMetric::Latency { of, percentile } => {
                write!(f, "{}_p{percentile}_ms", of.as_str())
            }
            GuardMetric::ErrorRate => f.write_str("error_rate"),
            GuardMetric::Feedback(name) => write!(f, "feedback:{name}"),
        }
    }
}

/// Where a backend's GPU figures come from (`metrics.gpu_url:`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuSource {
    /// `nvml`: this host's GPUs, read directly (builds with the `nvml` feature).
    Nvml,
    /// A GPU exporter's Prometheus endpoint: a path under the backend's URL, or an http(s) URL.
    Url(String),
}

impl TryFrom<String> for GpuSource {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        if s == "nvml" {
            return if cfg!(feature = "nvml") {
                Ok(Self::Nvml)
            } else {
                Err("nvml needs a build with NVML support (cargo build --features nvml)".into())
            };
        }
        check_scrape_url(&s)?;
        Ok(Self::Url(s))
    }
}

/// A scrape endpoint: a path (`/metrics`) or an http(s) URL with a host.
pub(super) fn check_scrape_url(u: &str) -> Result<(), String> {
    let ok = u.starts_with('/')
        || u.parse::<http::Uri>()
            .is_ok_and(|x| matches!(x.scheme_str(), Some("http" | "https")) && x.host().is_some());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{u}` is neither a path (`/metrics`) nor an http(s) URL"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_form_reads_back_as_written_and_a_wrong_one_says_what_is_accepted() {
        for s in [
            "ttft_p99_ms",
            "tpot_p50_ms",
            "e2e_p95_ms",
            "error_rate",
            "feedback:thumbs",
        ] {
            let m = GuardMetric::try_from(s.to_string());
            assert_eq!(m.map(|m| m.to_string()), Ok(s.to_string()));
        }
        for s in ["ttft_p98_ms", "itl_p99_ms", "ttft_p99", "feedback:", "p99"] {
            let e = GuardMetric::try_from(s.to_string())
                .err()
                .unwrap_or_default();
            assert!(e.contains("use ttft_p99_ms"), "{s}: {e}");
        }
        assert_eq!(
            StickyKey::try_from("header:X-User-Id".to_string()),
            Ok(StickyKey::Header(http::HeaderName::from_static(
                "x-user-id"
            )))
        );
        assert_eq!(
            StickyKey::try_from("api_key".to_string()),
            Ok(StickyKey::ApiKey)
        );
        assert!(StickyKey::try_from("header:bad name".to_string()).is_err());
        assert!(StickyKey::try_from("cookie:x".to_string()).is_err());
        assert_eq!(
            GpuSource::try_from("http://gpu:9400/metrics".to_string()),
            Ok(GpuSource::Url("http://gpu:9400/metrics".into()))
        );
        assert!(GpuSource::try_from("ftp://x/metrics".to_string()).is_err());
    }
}
