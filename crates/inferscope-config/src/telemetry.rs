//! Effective telemetry settings: the `telemetry:` config, then the standard `OTEL_*` environment
//! variables, then defaults. Nothing configured means telemetry is off.

use super::schema::{BatchConfig, TelemetryConfig, TelemetryFormat};
use std::collections::BTreeMap;
use std::time::Duration;

/// OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/gRPC (default port 4317).
    Grpc,
    /// OTLP/HTTP with protobuf bodies (default port 4318; the only one Langfuse accepts).
    HttpProtobuf,
}

/// Resolved settings of an enabled telemetry pipeline.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Base endpoint (gRPC: as is; HTTP: `/v1/traces` and `/v1/metrics` are appended).
    pub endpoint: String,
    /// How the exporter sends: gRPC or HTTP with protobuf bodies.
    pub protocol: Protocol,
    /// Headers on every export.
    pub headers: BTreeMap<String, String>,
    /// TLS, for an `https://` endpoint.
    pub tls: Option<crate::tls::ClientFiles>,
    /// Export timeout.
    pub timeout: Duration,
    /// `service.name`.
    pub service_name: String,
    /// Other resource attributes.
    pub resource: BTreeMap<String, String>,
    /// Ratio of new traces sampled.
    pub sample_ratio: f64,
    /// Span attribute set.
    pub format: TelemetryFormat,
    /// Content capture cap (`None`: no capture).
    pub capture_content: Option<usize>,
    /// Span batching.
    pub batch: BatchConfig,
    /// Metric export interval; `None` when metrics are not exported.
    pub metrics_interval: Option<Duration>,
    /// Histograms exported as base-2 exponential histograms.
    pub exponential_histograms: bool,
    /// Access-log lines exported as OTLP log records.
    pub export_logs: bool,
    /// `OTEL_SEMCONV_STABILITY_OPT_IN` contains `gen_ai_latest_experimental`: emit only the latest
    /// GenAI names (otherwise `gen_ai.system` is also emitted for backends built on semconv 1.36).
    pub genai_latest_only: bool,
}

impl Settings {
    /// The endpoint of one signal (`traces`, `metrics`, `logs`): gRPC serves all on the base
    /// endpoint; OTLP/HTTP appends `/v1/{signal}`.
    pub fn signal_endpoint(&self, signal: &str) -> String {
        match self.protocol {
            Protocol::Grpc => self.endpoint.clone(),
            Protocol::HttpProtobuf => {
                format!("{}/v1/{signal}", self.endpoint.trim_end_matches('/'))
            }
        }
    }
}

/// Parses `key1=value1,key2=value2` (the `OTEL_*_HEADERS` / `OTEL_RESOURCE_ATTRIBUTES` format,
/// values percent-decoded).
pub fn parse_pairs(s: &str) -> BTreeMap<String, String> {
    s.split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), percent_decode(v.trim())))
        .filter(|(k, _)| !k.is_empty())
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What is wrong with the telemetry settings (config section and `OTEL_*` variables together).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SettingsError {
    /// `enabled: true` without an endpoint.
    #[error("telemetry is enabled but no otlp.endpoint (or OTEL_EXPORTER_OTLP_ENDPOINT) is set")]
    NoEndpoint,
    /// The endpoint is not a URI.
    #[error("otlp endpoint `{endpoint}`: {reason}")]
    BadEndpoint {
        /// As given.
        endpoint: String,
        /// Why it does not parse.
        reason: String,
    },
    /// The endpoint is neither `http://` nor `https://`.
    #[error("otlp endpoint `{0}` must be http:// or https://")]
    NotHttp(String),
    /// TLS settings given for a plain `http://` endpoint, or incomplete.
    #[error("otlp tls: {0}")]
    BadTls(String),
    /// Neither `grpc` nor `http/protobuf`.
    #[error("otlp protocol `{0}`: use grpc or http/protobuf")]
    BadProtocol(String),
    /// A header name or value HTTP does not allow.
    #[error("otlp header `{0}` is not a valid HTTP header")]
    BadHeader(String),
    /// Outside 0..=1.
    #[error("sample_ratio {0} must be between 0 and 1")]
    BadSampleRatio(f64),
    /// A zero batch or queue size.
    #[error("batch.max_queue and batch.max_batch must be greater than 0")]
    EmptyBatch,
}

/// Resolves the effective settings from the config section and an environment lookup. `Ok(None)`
/// means telemetry is off; `Err` names what is wrong.
pub fn resolve(
    cfg: Option<&TelemetryConfig>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Option<Settings>, SettingsError> {
    let default = TelemetryConfig::default();
    let c = cfg.unwrap_or(&default);
    if c.enabled == Some(false)
        || env("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
    {
        return Ok(None);
    }
    let env_endpoint = env("OTEL_EXPORTER_OTLP_ENDPOINT");
    let Some(endpoint) = c.otlp.endpoint.clone().or(env_endpoint) else {
        if cfg.is_some() && c.enabled == Some(true) {
            return Err(SettingsError::NoEndpoint);
        }
        return Ok(None);
    };
    let uri: http::Uri =
        endpoint
            .parse()
            .map_err(|e: http::uri::InvalidUri| SettingsError::BadEndpoint {
                endpoint: endpoint.clone(),
                reason: e.to_string(),
            })?;
    let tls = match uri.scheme_str() {
        Some("http") => {
            if c.otlp.tls.is_some() {
                return Err(SettingsError::BadTls(format!(
                    "`{endpoint}` is http://: tls needs https://"
                )));
            }
            None
        }
        Some("https") => {
            let mut files = c.otlp.tls.clone().unwrap_or_default().files();
            if files.ca_file.is_none() {
                files.ca_file = env("OTEL_EXPORTER_OTLP_CERTIFICATE").map(Into::into);
            }
            if files.cert.is_none() && files.key.is_none() {
                files.cert = env("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE").map(Into::into);
                files.key = env("OTEL_EXPORTER_OTLP_CLIENT_KEY").map(Into::into);
            }
            if files.cert.is_some() != files.key.is_some() {
                return Err(SettingsError::BadTls(
                    "a client certificate needs both cert and key".into(),
                ));
            }
            if files.roots == crate::tls::Roots::None && files.ca_file.is_none() {
                return Err(SettingsError::BadTls(
                    "roots: none needs a ca_file to trust".into(),
                ));
            }
            Some(files)
        }
        _ => return Err(SettingsError::NotHttp(endpoint)),
    };
    let protocol = match c
        .otlp
        .protocol
        .clone()
        .or_else(|| env("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .as_deref()
    {
        None | Some("grpc") => Protocol::Grpc,
        Some("http/protobuf") => Protocol::HttpProtobuf,
        Some(other) => return Err(SettingsError::BadProtocol(other.to_string())),
    };
    let mut headers = env("OTEL_EXPORTER_OTLP_HEADERS")
        .map(|h| parse_pairs(&h))
        .unwrap_or_default();
    headers.extend(c.otlp.headers.clone());
    for (k, v) in &headers {
        if http::HeaderName::try_from(k.as_str()).is_err()
            || http::HeaderValue::try_from(v.as_str()).is_err()
        {
            return Err(SettingsError::BadHeader(k.clone()));
        }
    }
    let timeout = match c.otlp.timeout {
        Some(t) => t,
        None => env("OTEL_EXPORTER_OTLP_TIMEOUT")
            .and_then(|ms| ms.parse::<u64>().ok())
            .map_or(Duration::from_secs(10), Duration::from_millis),
    };
    let mut resource = env("OTEL_RESOURCE_ATTRIBUTES")
        .map(|r| parse_pairs(&r))
        .unwrap_or_default();
    resource.extend(c.resource.clone());
    let service_name = c
        .service_name
        .clone()
        .or_else(|| env("OTEL_SERVICE_NAME"))
        .or_else(|| resource.remove("service.name"))
        .unwrap_or_else(|| "inferscope".into());
    resource.remove("service.name");
    let sample_ratio = match c.sample_ratio {
        Some(r) => r,
        None => env("OTEL_TRACES_SAMPLER_ARG")
            .and_then(|r| r.parse().ok())
            .unwrap_or(1.0),
    };
    if !(0.0..=1.0).contains(&sample_ratio) {
        return Err(SettingsError::BadSampleRatio(sample_ratio));
    }
    if c.batch.max_queue == 0 || c.batch.max_batch == 0 {
        return Err(SettingsError::EmptyBatch);
    }
    Ok(Some(Settings {
        endpoint,
        protocol,
        headers,
        tls,
        timeout,
        service_name,
        resource,
        sample_ratio,
        format: c.format,
        capture_content: c.capture_content.then_some(c.max_content_bytes),
        batch: c.batch.clone(),
        metrics_interval: c.export_metrics.then_some(c.metrics_interval),
        export_logs: c.export_logs,
        exponential_histograms: match c.histograms {
            Some(h) => h == super::schema::HistogramAggregation::Exponential,
            None => env("OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION")
                .is_some_and(|v| v.trim() == "base2_exponential_bucket_histogram"),
        },
        genai_latest_only: env("OTEL_SEMCONV_STABILITY_OPT_IN").is_some_and(|v| {
            v.split(',')
                .any(|t| t.trim() == "gen_ai_latest_experimental")
        }),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: BTreeMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn nothing_configured_is_off() {
        assert!(resolve(None, env(&[])).unwrap_or_default().is_none());
    }

    #[test]
    fn environment_fills_what_config_leaves_out() {
        let e = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "authorization=Basic%20abc,x-tenant=t1",
            ),
            ("OTEL_SERVICE_NAME", "gw-eu"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "deployment.environment=prod,service.name=ignored",
            ),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
        ]);
        let s = resolve(None, e)
            .unwrap_or_default()
            .unwrap_or_else(|| panic!("enabled"));
        assert_eq!(s.protocol, Protocol::HttpProtobuf);
        assert_eq!(
            s.signal_endpoint("traces"),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            s.headers.get("authorization").map(String::as_str),
            Some("Basic abc")
        );
        assert_eq!(s.service_name, "gw-eu");
        assert_eq!(
            s.resource.get("deployment.environment").map(String::as_str),
            Some("prod")
        );
        assert!(!s.resource.contains_key("service.name"));
        assert_eq!(s.sample_ratio, 0.25);
        assert_eq!(s.capture_content, None);
        assert!(!s.genai_latest_only);

        let cfg = TelemetryConfig {
            service_name: Some("from-config".into()),
            sample_ratio: Some(1.0),
            ..TelemetryConfig::default()
        };
        let e = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
            ("OTEL_SERVICE_NAME", "env"),
        ]);
        let s = resolve(Some(&cfg), e)
            .unwrap_or_default()
            .unwrap_or_else(|| panic!("enabled"));
        assert_eq!(
            (s.service_name.as_str(), s.protocol),
            ("from-config", Protocol::Grpc)
        );
    }

    #[test]
    fn bad_values_are_errors_and_disabled_wins() {
        let e = || env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")]);
        let bad = TelemetryConfig {
            sample_ratio: Some(2.0),
            ..TelemetryConfig::default()
        };
        assert!(resolve(Some(&bad), e()).is_err());
        let off = TelemetryConfig {
            enabled: Some(false),
            ..TelemetryConfig::default()
        };
        assert!(resolve(Some(&off), e()).unwrap_or_default().is_none());
        let proto = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://x:1"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ]);
        assert!(resolve(None, proto).is_err());
    }
}
