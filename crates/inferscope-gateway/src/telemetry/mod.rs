//! OpenTelemetry: one trace per request (a SERVER span and a CLIENT span per upstream attempt,
//! GenAI semantic conventions), GenAI metrics, exported over OTLP (gRPC or HTTP/protobuf).
//!
//! Never on the data path: finished records reach the telemetry task through a bounded queue
//! (full → dropped and counted), spans are built and exported there in batches with a timeout,
//! and metric instruments are recorded there too. A slow or dead collector costs a proxied request
//! nothing but a failed `try_send`. Failures are counted and logged at most once a minute.

mod http_client;
mod logs;
mod metrics;
pub mod names;
pub mod receive;
mod spans;

pub use crate::config::telemetry::{parse_pairs, resolve, Protocol, Settings, SettingsError};

use crate::meter::RequestRecord;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_otlp::{SpanExporter, WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::metrics::periodic_reader_with_async_runtime::PeriodicReader;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::{SpanData, SpanExporter as _};
use opentelemetry_sdk::Resource;
use parking_lot::Mutex;
use std::fmt::Display;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// Export health, shown in `/metrics`.
#[derive(Debug, Default)]
pub struct Counters {
    /// Spans exported successfully.
    pub spans_exported: AtomicU64,
    /// Span export calls that failed or timed out.
    pub span_export_failures: AtomicU64,
    /// Metric export calls that succeeded.
    pub metric_exports: AtomicU64,
    /// Metric export calls that failed.
    pub metric_export_failures: AtomicU64,
    /// Finished requests dropped because the telemetry queue was full.
    pub dropped: AtomicU64,
    last_log: Mutex<Option<Instant>>,
}

impl Counters {
    fn export_failed(&self, signal: &str, e: &dyn Display) {
        let c = if signal == "metrics" {
            &self.metric_export_failures
        } else {
            &self.span_export_failures
        };
        c.fetch_add(1, Ordering::Relaxed);
        let mut last = self.last_log.lock();
        if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
            *last = Some(Instant::now());
            tracing::warn!(signal, error = %e, "OTLP export failed (logged at most once a minute; see inferscope_telemetry_export_failures_total)");
        }
    }

    fn exported_metrics(&self) {
        self.metric_exports.fetch_add(1, Ordering::Relaxed);
    }

    /// The export-health counters, for `/metrics`.
    pub fn scalars(&self) -> impl Iterator<Item = crate::stats::Scalar> {
        const NAMES: [&str; 4] = [
            "inferscope_telemetry_spans_exported_total",
            "inferscope_telemetry_span_export_failures_total",
            "inferscope_telemetry_metric_export_failures_total",
            "inferscope_telemetry_dropped_total",
        ];
        const HELP: [&str; 4] = [
            "Spans exported over OTLP.",
            "OTLP span exports that failed or timed out.",
            "OTLP metric exports that failed.",
            "Finished requests not exported because the telemetry queue was full.",
        ];
        let values = [
            &self.spans_exported,
            &self.span_export_failures,
            &self.metric_export_failures,
            &self.dropped,
        ]
        .map(|c| c.load(Ordering::Relaxed) as f64);
        (0..4).map(move |i| crate::stats::Scalar {
            name: NAMES[i],
            kind: "counter",
            help: HELP[i],
            value: values[i],
        })
    }
}

enum Msg {
    Record(Arc<RequestRecord>),
    Event(&'static str, Vec<(&'static str, String)>),
    Flush(oneshot::Sender<()>),
}

/// A running telemetry pipeline.
#[derive(Debug)]
pub struct Telemetry {
    tx: mpsc::Sender<Msg>,
    /// Export health.
    pub counters: Arc<Counters>,
    /// Effective settings.
    pub settings: Arc<Settings>,
    meters: Option<SdkMeterProvider>,
    logs: Option<opentelemetry_sdk::logs::SdkLoggerProvider>,
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Msg")
    }
}

fn resource(s: &Settings) -> Resource {
    Resource::builder()
        .with_service_name(s.service_name.clone())
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .with_attributes(
            s.resource
                .iter()
                .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
        )
        .build()
}

/// The configured headers as gRPC metadata (validated when the settings were resolved).
fn grpc_metadata(s: &Settings) -> opentelemetry_otlp::tonic_types::metadata::MetadataMap {
    let mut h = http::HeaderMap::new();
    for (k, v) in &s.headers {
        if let (Ok(k), Ok(v)) = (
            http::HeaderName::try_from(k.as_str()),
            http::HeaderValue::try_from(v.as_str()),
        ) {
            h.insert(k, v);
        }
    }
    opentelemetry_otlp::tonic_types::metadata::MetadataMap::from_headers(h)
}

/// An OTLP exporter could not be built.
#[derive(Debug, thiserror::Error)]
#[error("building the OTLP {signal} exporter: {error}")]
pub struct ExporterError {
    signal: &'static str,
    error: String,
}

/// How the exporters reach the endpoint: gRPC's TLS settings, or the HTTP client.
struct Transport {
    grpc_tls: Option<opentelemetry_otlp::tonic_types::transport::ClientTlsConfig>,
    http: Option<Arc<http_client::ExportClient>>,
}

impl Transport {
    fn new(s: &Settings) -> Result<Self, ExporterError> {
        let fail = |error: String| ExporterError {
            signal: "TLS",
            error,
        };
        Ok(match s.protocol {
            Protocol::Grpc => Self {
                grpc_tls: s.tls.as_ref().map(grpc_tls).transpose().map_err(fail)?,
                http: None,
            },
            Protocol::HttpProtobuf => {
                let tls = match &s.tls {
                    Some(files) => Some(Arc::new(
                        crate::tls::ClientTls::new(files, &[b"http/1.1"])
                            .map_err(|e| fail(e.to_string()))?,
                    )),
                    None => None,
                };
                Self {
                    grpc_tls: None,
                    http: Some(Arc::new(http_client::ExportClient::new(tls, s.timeout))),
                }
            }
        })
    }
}

/// tonic's TLS settings from ours.
fn grpc_tls(
    files: &crate::tls::ClientFiles,
) -> Result<opentelemetry_otlp::tonic_types::transport::ClientTlsConfig, String> {
    use opentelemetry_otlp::tonic_types::transport::{Certificate, ClientTlsConfig, Identity};
    let read = |p: &std::path::Path| {
        crate::util::fs::read(p, crate::util::fs::PEM_CAP)
            .map_err(|e| format!("{}: {e}", p.display()))
    };
    let mut t = match files.roots {
        crate::tls::Roots::Webpki => ClientTlsConfig::new().with_webpki_roots(),
        crate::tls::Roots::Native => ClientTlsConfig::new().with_native_roots(),
        crate::tls::Roots::None => ClientTlsConfig::new(),
    };
    if let Some(ca) = &files.ca_file {
        t = t.ca_certificate(Certificate::from_pem(read(ca)?));
    }
    if let (Some(c), Some(k)) = (&files.cert, &files.key) {
        t = t.identity(Identity::from_pem(read(c)?, read(k)?));
    }
    if let Some(n) = &files.server_name {
        t = t.domain_name(n.clone());
    }
    Ok(t)
}

impl Transport {
    /// A gRPC exporter builder set up for `endpoint`: timeout, metadata, TLS.
    fn grpc<B: WithExportConfig + WithTonicConfig>(
        &self,
        s: &Settings,
        b: B,
        endpoint: String,
    ) -> B {
        let b = b
            .with_endpoint(endpoint)
            .with_timeout(s.timeout)
            .with_metadata(grpc_metadata(s));
        match &self.grpc_tls {
            Some(tls) => b.with_tls_config(tls.clone()),
            None => b,
        }
    }

    /// An OTLP/HTTP exporter builder set up for `endpoint`: protobuf, timeout, headers, the
    /// client (plain or TLS).
    fn http<B: WithExportConfig + WithHttpConfig>(
        &self,
        s: &Settings,
        b: B,
        endpoint: String,
    ) -> B {
        let b = b
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(endpoint)
            .with_timeout(s.timeout)
            .with_headers(s.headers.clone().into_iter().collect());
        match &self.http {
            Some(c) => b.with_http_client(SharedClient(Arc::clone(c))),
            None => b,
        }
    }
}

/// The access-log records' pipeline: the OTLP log exporter behind the SDK's batch processor on
/// the tokio runtime, with the spans' batching settings.
fn log_provider(
    s: &Settings,
    t: &Transport,
) -> Result<opentelemetry_sdk::logs::SdkLoggerProvider, ExporterError> {
    use opentelemetry_otlp::LogExporter;
    use opentelemetry_sdk::logs::{
        log_processor_with_async_runtime::BatchLogProcessor, BatchConfigBuilder,
    };
    let exporter = match s.protocol {
        Protocol::Grpc => t
            .grpc(
                s,
                LogExporter::builder().with_tonic(),
                s.signal_endpoint("logs"),
            )
            .build(),
        Protocol::HttpProtobuf => t
            .http(
                s,
                LogExporter::builder().with_http(),
                s.signal_endpoint("logs"),
            )
            .build(),
    }
    .map_err(|error| ExporterError {
        signal: "log",
        error: error.to_string(),
    })?;
    let batch = BatchConfigBuilder::default()
        .with_max_queue_size(s.batch.max_queue)
        .with_max_export_batch_size(s.batch.max_batch.min(s.batch.max_queue))
        .with_scheduled_delay(s.batch.interval)
        .build();
    let processor = BatchLogProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio)
        .with_batch_config(batch)
        .build();
    Ok(opentelemetry_sdk::logs::SdkLoggerProvider::builder()
        .with_resource(resource(s))
        .with_log_processor(processor)
        .build())
}

fn span_exporter(s: &Settings, t: &Transport) -> Result<SpanExporter, ExporterError> {
    let built = match s.protocol {
        Protocol::Grpc => t
            .grpc(
                s,
                SpanExporter::builder().with_tonic(),
                s.signal_endpoint("traces"),
            )
            .build(),
        Protocol::HttpProtobuf => t
            .http(
                s,
                SpanExporter::builder().with_http(),
                s.signal_endpoint("traces"),
            )
            .build(),
    };
    built.map_err(|error| ExporterError {
        signal: "span",
        error: error.to_string(),
    })
}

/// One export client shared by the span and metric exporters.
#[derive(Debug, Clone)]
struct SharedClient(Arc<http_client::ExportClient>);

impl opentelemetry_http::HttpClient for SharedClient {
    fn send_bytes<'life0, 'async_trait>(
        &'life0 self,
        request: http::Request<bytes::Bytes>,
    ) -> std::pin::Pin<
        Box<
            dyn std::future::Future<
                    Output = Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError>,
                > + Send
                + 'async_trait,
        >,
    >
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        self.0.send_bytes(request)
    }
}

fn meter_provider(
    s: &Settings,
    t: &Transport,
    interval: Duration,
    counters: &Arc<Counters>,
) -> Result<SdkMeterProvider, ExporterError> {
    let b = opentelemetry_otlp::MetricExporter::builder();
    let exporter = match s.protocol {
        Protocol::Grpc => t
            .grpc(s, b.with_tonic(), s.signal_endpoint("metrics"))
            .build(),
        Protocol::HttpProtobuf => t
            .http(s, b.with_http(), s.signal_endpoint("metrics"))
            .build(),
    }
    .map_err(|error| ExporterError {
        signal: "metric",
        error: error.to_string(),
    })?;
    let exporter = metrics::CountingExporter {
        inner: exporter,
        counters: Arc::clone(counters),
    };
    let reader = PeriodicReader::builder(exporter, opentelemetry_sdk::runtime::Tokio)
        .with_interval(interval)
        .build();
    let mut b = SdkMeterProvider::builder()
        .with_resource(resource(s))
        .with_reader(reader);
    if s.exponential_histograms {
        use opentelemetry_sdk::metrics::{Aggregation, Instrument, InstrumentKind, Stream};
        b = b.with_view(|i: &Instrument| {
            (i.kind() == InstrumentKind::Histogram)
                .then(|| {
                    Stream::builder()
                        .with_aggregation(Aggregation::Base2ExponentialHistogram {
                            max_size: 160,
                            max_scale: 20,
                            record_min_max: true,
                        })
                        .build()
                        .ok()
                })
                .flatten()
        });
    }
    Ok(b.build())
}

impl Telemetry {
    /// Starts the pipeline on the current tokio runtime. `listen` is the data-plane address
    /// reported on SERVER spans.
    pub fn start(settings: Settings, listen: SocketAddr) -> Result<Self, ExporterError> {
        let counters = Arc::new(Counters::default());
        let transport = Transport::new(&settings)?;
        let mut exporter = span_exporter(&settings, &transport)?;
        exporter.set_resource(&resource(&settings));
        let meters = match settings.metrics_interval {
            Some(interval) => Some(meter_provider(&settings, &transport, interval, &counters)?),
            None => None,
        };
        let instruments = meters
            .as_ref()
            .map(|m| metrics::Instruments::new(&m.meter(names::SCOPE)));
        let logs = if settings.export_logs {
            Some(log_provider(&settings, &transport)?)
        } else {
            None
        };
        let access_logs = logs.as_ref().map(logs::AccessLogs::new);
        let settings = Arc::new(settings);
        let (tx, rx) = mpsc::channel(settings.batch.max_queue);
        tokio::spawn(run(
            rx,
            exporter,
            Arc::clone(&settings),
            listen,
            instruments,
            access_logs,
            Arc::clone(&counters),
        ));
        tracing::info!(endpoint = %settings.endpoint, protocol = ?settings.protocol, "OpenTelemetry export on");
        Ok(Self {
            tx,
            counters,
            settings,
            meters,
            logs,
        })
    }

    /// Queues a finished request; never waits (a full queue drops it and counts the drop).
    pub fn submit(&self, rec: Arc<RequestRecord>) {
        if self.tx.try_send(Msg::Record(rec)).is_err() {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Exports a gateway event (e.g. a guardrail trip) as a zero-length INTERNAL span carrying an
    /// event of the same name; never waits.
    pub fn event(&self, name: &'static str, attrs: Vec<(&'static str, String)>) {
        if self.tx.try_send(Msg::Event(name, attrs)).is_err() {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Exports everything queued so far, then the final metrics, and stops the metric reader.
    /// Bounded by the export timeout.
    pub async fn shutdown(&self) {
        let (ack, done) = oneshot::channel();
        let limit = self.settings.timeout + Duration::from_secs(1);
        if tokio::time::timeout(limit, self.tx.send(Msg::Flush(ack)))
            .await
            .is_ok_and(|r| r.is_ok())
        {
            let _ = tokio::time::timeout(limit, done).await;
        }
        // The SDK's shutdown blocks until the reader's last export: keep it off the runtime's
        // worker threads.
        if let Some(meters) = self.meters.clone() {
            let _ = tokio::time::timeout(
                limit,
                tokio::task::spawn_blocking(move || meters.shutdown()),
            )
            .await;
        }
        if let Some(logs) = self.logs.clone() {
            let _ =
                tokio::time::timeout(limit, tokio::task::spawn_blocking(move || logs.shutdown()))
                    .await;
        }
    }
}

impl Drop for Telemetry {
    /// Without `shutdown`, the SDK's providers shut down when their last handle drops, blocking
    /// the dropping thread until their export tasks answer — on a runtime's own thread (a
    /// current-thread runtime being torn down) they never would. Shut them down on a thread of
    /// their own instead (a no-op after `shutdown`).
    fn drop(&mut self) {
        let meters = self.meters.take();
        let logs = self.logs.take();
        if meters.is_some() || logs.is_some() {
            let _ = std::thread::Builder::new()
                .name("otel-shutdown".into())
                .spawn(move || {
                    if let Some(m) = meters {
                        let _ = m.shutdown();
                    }
                    if let Some(l) = logs {
                        let _ = l.shutdown();
                    }
                });
        }
    }
}

impl crate::meter::RecordSink for Telemetry {
    fn record(&self, rec: &Arc<RequestRecord>) {
        self.submit(Arc::clone(rec));
    }
}

async fn run(
    mut rx: mpsc::Receiver<Msg>,
    exporter: SpanExporter,
    settings: Arc<Settings>,
    listen: SocketAddr,
    instruments: Option<metrics::Instruments>,
    access_logs: Option<logs::AccessLogs>,
    counters: Arc<Counters>,
) {
    let mut batch: Vec<SpanData> = Vec::with_capacity(settings.batch.max_batch);
    let scope = spans::scope();
    let mut tick = tokio::time::interval(settings.batch.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            msg = rx.recv() => match msg {
                Some(Msg::Record(rec)) => {
                    if let Some(i) = &instruments {
                        i.record(&rec);
                    }
                    if let Some(l) = &access_logs {
                        l.emit(&rec);
                    }
                    batch.extend(spans::build(&rec, &settings, listen, &scope));
                    if batch.len() >= settings.batch.max_batch {
                        export(&exporter, &mut batch, &settings, &counters).await;
                    }
                }
                Some(Msg::Event(name, attrs)) => {
                    batch.push(spans::event(name, attrs, &scope));
                }
                Some(Msg::Flush(ack)) => {
                    export(&exporter, &mut batch, &settings, &counters).await;
                    let _ = ack.send(());
                }
                None => {
                    export(&exporter, &mut batch, &settings, &counters).await;
                    break;
                }
            },
            _ = tick.tick() => export(&exporter, &mut batch, &settings, &counters).await,
        }
    }
}

async fn export(
    exporter: &SpanExporter,
    batch: &mut Vec<SpanData>,
    s: &Settings,
    counters: &Counters,
) {
    if batch.is_empty() {
        return;
    }
    let spans = std::mem::replace(batch, Vec::with_capacity(s.batch.max_batch));
    let n = spans.len() as u64;
    match tokio::time::timeout(s.timeout, exporter.export(spans)).await {
        Ok(Ok(())) => {
            counters.spans_exported.fetch_add(n, Ordering::Relaxed);
        }
        Ok(Err(e)) => counters.export_failed("traces", &e),
        Err(_) => counters.export_failed("traces", &"timed out"),
    }
}
