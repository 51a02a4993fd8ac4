//! OTLP metrics: the GenAI conventions' instruments with their advisory bucket boundaries,
//! recorded from finished requests in the telemetry task (never on the data path), and an exporter
//! wrapper that counts failed exports.

use super::names as n;
use super::Counters;
use crate::meter::NONE;
use crate::meter::{Outcome, RequestRecord};
use crate::stats::{DURATION_BOUNDS, TPOT_BOUNDS, TTFT_BOUNDS};
use opentelemetry::metrics::{Histogram, Meter};
use opentelemetry::KeyValue;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::Temporality;
use std::sync::Arc;
use std::time::Duration;

/// `gen_ai.client.token.usage` advisory boundaries.
const TOKEN_BOUNDS: [f64; 14] = [
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];

/// The instruments, resolved once.
#[derive(Debug, Clone)]
pub(super) struct Instruments {
    duration: Histogram<f64>,
    ttft: Histogram<f64>,
    tpot: Histogram<f64>,
    tokens: Histogram<u64>,
}

impl Instruments {
    /// Creates the instruments on `meter`.
    pub(super) fn new(meter: &Meter) -> Self {
        Self {
            duration: meter
                .f64_histogram(n::M_REQUEST_DURATION)
                .with_unit("s")
                .with_description("Generative AI server request duration, as seen by the gateway")
                .with_boundaries(DURATION_BOUNDS.to_vec())
                .build(),
            ttft: meter
                .f64_histogram(n::M_TTFT)
                .with_unit("s")
                .with_description("Time to generate first token for successful responses")
                .with_boundaries(TTFT_BOUNDS.to_vec())
                .build(),
            tpot: meter
                .f64_histogram(n::M_TPOT)
                .with_unit("s")
                .with_description("Time per output token generated after the first token for successful responses")
                .with_boundaries(TPOT_BOUNDS.to_vec())
                .build(),
            tokens: meter
                .u64_histogram(n::M_TOKEN_USAGE)
                .with_unit("{token}")
                .with_description("Number of input and output tokens used")
                .with_boundaries(TOKEN_BOUNDS.to_vec())
                .build(),
        }
    }

    /// Records one finished request.
    pub(super) fn record(&self, rec: &RequestRecord) {
        let m = &rec.meta;
        let mut attrs = vec![
            KeyValue::new(
                n::GEN_AI_OPERATION_NAME,
                m.params.operation.unwrap_or("http"),
            ),
            KeyValue::new(n::IS_ROUTE, m.route.to_string()),
            KeyValue::new(n::IS_BACKEND, m.backend.to_string()),
            KeyValue::new(n::IS_VARIANT, m.variant.to_string()),
            KeyValue::new(n::IS_PURPOSE, m.purpose.as_str()),
        ];
        if m.model.as_ref() != NONE {
            attrs.push(KeyValue::new(n::GEN_AI_REQUEST_MODEL, m.model.to_string()));
        }
        if let Some(b) = &crate::facts::Facts::of(m).upstream {
            attrs.push(KeyValue::new(
                n::GEN_AI_PROVIDER_NAME,
                b.provider.to_string(),
            ));
            if let Some(h) = &b.address {
                attrs.push(KeyValue::new(n::SERVER_ADDRESS, h.to_string()));
            }
            if let Some(p) = b.port {
                attrs.push(KeyValue::new(n::SERVER_PORT, i64::from(p)));
            }
        }
        if let Some(model) = &rec.response.model {
            attrs.push(KeyValue::new(n::GEN_AI_RESPONSE_MODEL, model.clone()));
        }
        let ok = matches!(rec.outcome, Outcome::Ok);
        if ok {
            if let Some(t) = rec.ttft {
                self.ttft.record(t.as_secs_f64(), &attrs);
            }
            if let Some(t) = rec.tpot {
                self.tpot.record(t.as_secs_f64(), &attrs);
            }
        }
        for (kind, v) in [("input", rec.input_tokens), ("output", rec.output_tokens)] {
            if let Some(v) = v {
                let mut a = attrs.clone();
                a.push(KeyValue::new(n::GEN_AI_TOKEN_TYPE, kind));
                self.tokens.record(v, &a);
            }
        }
        if !ok {
            attrs.push(KeyValue::new(
                n::ERROR_TYPE,
                rec.error.unwrap_or(rec.outcome.as_str()),
            ));
        }
        self.duration.record(rec.e2e.as_secs_f64(), &attrs);
    }
}

/// Wraps a metric exporter to count (and rate-limit logging of) failed exports.
#[derive(Debug)]
pub(super) struct CountingExporter<E> {
    /// The real exporter.
    pub inner: E,
    /// Where failures are counted.
    pub counters: Arc<Counters>,
}

impl<E: PushMetricExporter> PushMetricExporter for CountingExporter<E> {
    async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
        let r = self.inner.export(metrics).await;
        if let Err(e) = &r {
            self.counters.export_failed("metrics", e);
        } else {
            self.counters.exported_metrics();
        }
        r
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn temporality(&self) -> Temporality {
        self.inner.temporality()
    }
}
