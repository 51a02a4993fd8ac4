//! Real OTLP receivers for tests: gRPC (tonic, with the opentelemetry-proto services) and
//! HTTP/protobuf (hyper), both keeping every export request and the headers it came with.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::{
    LogsService, LogsServiceServer,
};
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

/// Everything a receiver got.
#[derive(Clone, Default)]
pub struct Collected {
    pub traces: Arc<Mutex<Vec<ExportTraceServiceRequest>>>,
    pub metrics: Arc<Mutex<Vec<ExportMetricsServiceRequest>>>,
    pub logs: Arc<Mutex<Vec<ExportLogsServiceRequest>>>,
    /// Value of the `authorization` header/metadata of each export.
    pub auth: Arc<Mutex<Vec<Option<String>>>>,
}

impl Collected {
    /// Every span received, with its resource's attributes.
    pub fn spans(&self) -> Vec<(Vec<KeyValue>, Span)> {
        let mut out = Vec::new();
        for req in self.traces.lock().unwrap().iter() {
            for rs in &req.resource_spans {
                let res = rs
                    .resource
                    .as_ref()
                    .map(|r| r.attributes.clone())
                    .unwrap_or_default();
                for ss in &rs.scope_spans {
                    for s in &ss.spans {
                        out.push((res.clone(), s.clone()));
                    }
                }
            }
        }
        out
    }

    /// Every metric received, by name.
    pub fn metric(&self, name: &str) -> Vec<opentelemetry_proto::tonic::metrics::v1::Metric> {
        let mut out = Vec::new();
        for req in self.metrics.lock().unwrap().iter() {
            for rm in &req.resource_metrics {
                for sm in &rm.scope_metrics {
                    out.extend(sm.metrics.iter().filter(|m| m.name == name).cloned());
                }
            }
        }
        out
    }
}

/// An attribute's value as a JSON-ish string (for assertions), or None.
pub fn attr(attrs: &[KeyValue], key: &str) -> Option<any_value::Value> {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.clone())
        .and_then(|v: AnyValue| v.value)
}

pub fn attr_str(attrs: &[KeyValue], key: &str) -> Option<String> {
    match attr(attrs, key)? {
        any_value::Value::StringValue(s) => Some(s),
        _ => None,
    }
}

pub fn attr_i64(attrs: &[KeyValue], key: &str) -> Option<i64> {
    match attr(attrs, key)? {
        any_value::Value::IntValue(i) => Some(i),
        _ => None,
    }
}

pub fn attr_f64(attrs: &[KeyValue], key: &str) -> Option<f64> {
    match attr(attrs, key)? {
        any_value::Value::DoubleValue(f) => Some(f),
        _ => None,
    }
}

#[tonic::async_trait]
impl TraceService for Collected {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let auth = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        self.auth.lock().unwrap().push(auth);
        self.traces.lock().unwrap().push(req.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

#[tonic::async_trait]
impl MetricsService for Collected {
    async fn export(
        &self,
        req: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        self.metrics.lock().unwrap().push(req.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse {
            partial_success: None,
        }))
    }
}

#[tonic::async_trait]
impl LogsService for Collected {
    async fn export(
        &self,
        req: tonic::Request<ExportLogsServiceRequest>,
    ) -> Result<tonic::Response<ExportLogsServiceResponse>, tonic::Status> {
        self.logs.lock().unwrap().push(req.into_inner());
        Ok(tonic::Response::new(ExportLogsServiceResponse {
            partial_success: None,
        }))
    }
}

impl Collected {
    /// Every log record received.
    pub fn log_records(&self) -> Vec<opentelemetry_proto::tonic::logs::v1::LogRecord> {
        self.logs
            .lock()
            .unwrap()
            .iter()
            .flat_map(|r| &r.resource_logs)
            .flat_map(|rl| &rl.scope_logs)
            .flat_map(|sl| sl.log_records.clone())
            .collect()
    }
}

/// An OTLP/gRPC receiver on a loopback port.
pub async fn start_grpc() -> (SocketAddr, Collected) {
    start_grpc_with(None).await
}

/// An OTLP/gRPC receiver, over TLS with `identity` (certificate and key PEM) when given.
pub async fn start_grpc_with(identity: Option<(Vec<u8>, Vec<u8>)>) -> (SocketAddr, Collected) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let c = Collected::default();
    let mut builder = tonic::transport::Server::builder();
    if let Some((cert, key)) = identity {
        builder = builder
            .tls_config(
                tonic::transport::ServerTlsConfig::new()
                    .identity(tonic::transport::Identity::from_pem(cert, key)),
            )
            .unwrap();
    }
    let server = builder
        .add_service(TraceServiceServer::new(c.clone()))
        .add_service(MetricsServiceServer::new(c.clone()))
        .add_service(LogsServiceServer::new(c.clone()));
    tokio::spawn(server.serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)));
    (addr, c)
}

/// An OTLP/HTTP (protobuf) receiver on a loopback port: `POST /v1/traces`, `POST /v1/metrics`.
pub async fn start_http() -> (SocketAddr, Collected) {
    start_http_with(None).await
}

/// An OTLP/HTTP receiver, over TLS when given.
pub async fn start_http_with(
    tls: Option<std::sync::Arc<inferscope::tls::ServerTls>>,
) -> (SocketAddr, Collected) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let c = Collected::default();
    let svc_c = c.clone();
    let service = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
        let c = svc_c.clone();
        async move {
            let path = req.uri().path().to_owned();
            let auth = req
                .headers()
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let ctype_ok = req
                .headers()
                .get("content-type")
                .is_some_and(|v| v == "application/x-protobuf");
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let reply = |status: u16, b: Vec<u8>| {
                let mut r = http::Response::new(Full::new(Bytes::from(b)));
                *r.status_mut() = http::StatusCode::from_u16(status).unwrap();
                r.headers_mut().insert(
                    "content-type",
                    http::HeaderValue::from_static("application/x-protobuf"),
                );
                Ok::<_, std::convert::Infallible>(r)
            };
            if !ctype_ok {
                return reply(415, Vec::new());
            }
            match path.as_str() {
                "/v1/traces" => {
                    c.auth.lock().unwrap().push(auth);
                    c.traces
                        .lock()
                        .unwrap()
                        .push(ExportTraceServiceRequest::decode(body).unwrap());
                    reply(
                        200,
                        ExportTraceServiceResponse {
                            partial_success: None,
                        }
                        .encode_to_vec(),
                    )
                }
                "/v1/metrics" => {
                    c.metrics
                        .lock()
                        .unwrap()
                        .push(ExportMetricsServiceRequest::decode(body).unwrap());
                    reply(
                        200,
                        ExportMetricsServiceResponse {
                            partial_success: None,
                        }
                        .encode_to_vec(),
                    )
                }
                "/v1/logs" => {
                    c.logs
                        .lock()
                        .unwrap()
                        .push(ExportLogsServiceRequest::decode(body).unwrap());
                    reply(
                        200,
                        ExportLogsServiceResponse {
                            partial_success: None,
                        }
                        .encode_to_vec(),
                    )
                }
                _ => reply(404, Vec::new()),
            }
        }
    });
    tokio::spawn(inferscope::server::run(
        listener,
        service,
        inferscope::server::ServerOptions {
            tls,
            ..inferscope::server::ServerOptions::default()
        },
        std::future::pending(),
    ));
    (addr, c)
}
