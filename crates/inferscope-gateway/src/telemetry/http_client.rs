//! The OTLP/HTTP exporter's client: HTTP/1.1 over the gateway's own connector (plain or TLS),
//! one kept-alive connection reused while it lasts, each export bounded by the export timeout
//! (body read included) and answers capped at 4 MiB.

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use opentelemetry_http::{HttpClient, HttpError};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

const MAX_ANSWER: usize = 4 << 20;

/// An `opentelemetry_http::HttpClient` over `crate::tls::connect`.
pub(super) struct ExportClient {
    tls: Option<Arc<crate::tls::ClientTls>>,
    timeout: Duration,
    conn: tokio::sync::Mutex<Option<SendRequest<Full<Bytes>>>>,
}

impl std::fmt::Debug for ExportClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExportClient")
            .field("tls", &self.tls.is_some())
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl ExportClient {
    /// A client; `tls` for an `https://` endpoint.
    pub(super) fn new(tls: Option<Arc<crate::tls::ClientTls>>, timeout: Duration) -> Self {
        Self {
            tls,
            timeout,
            conn: tokio::sync::Mutex::new(None),
        }
    }

    async fn send(&self, mut req: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let uri = req.uri().clone();
        let authority = uri
            .authority()
            .ok_or("export URI has no authority")?
            .clone();
        let https = uri.scheme_str() == Some("https");
        if https != self.tls.is_some() {
            return Err(format!("export URI {uri}: scheme does not match the TLS settings").into());
        }
        let mut slot = self.conn.lock().await;
        let mut sender = match slot.take() {
            Some(s) if !s.is_closed() => s,
            _ => {
                let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
                let stream =
                    crate::tls::connect(authority.host(), port, self.tls.as_deref(), self.timeout)
                        .await?;
                let (sender, conn) =
                    hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                sender
            }
        };
        sender.ready().await?;
        if let Ok(v) = http::HeaderValue::from_str(authority.as_str()) {
            req.headers_mut().insert(http::header::HOST, v);
        }
        *req.uri_mut() = http::Uri::from(
            uri.path_and_query()
                .cloned()
                .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/")),
        );
        let resp = sender.send_request(req.map(Full::new)).await?;
        let (parts, body) = resp.into_parts();
        let body = Limited::new(body, MAX_ANSWER)
            .collect()
            .await
            .map_err(|e| -> HttpError { e })?
            .to_bytes();
        *slot = Some(sender);
        Ok(Response::from_parts(parts, body))
    }
}

impl HttpClient for ExportClient {
    fn send_bytes<'life0, 'async_trait>(
        &'life0 self,
        request: Request<Bytes>,
    ) -> Pin<Box<dyn Future<Output = Result<Response<Bytes>, HttpError>> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async move {
            match tokio::time::timeout(self.timeout, self.send(request)).await {
                Ok(r) => r,
                Err(_) => Err("export timed out".into()),
            }
        })
    }
}
