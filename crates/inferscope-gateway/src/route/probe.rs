//! Active health probes: `GET base + path` every interval; `unhealthy_threshold` failures in a row
//! take the backend out of rotation, `healthy_threshold` successes bring it back. A probe task ends
//! by itself when its backend is dropped (e.g. after a config reload).

use super::Backend;
use crate::config::{Config, ProbeConfig};
use bytes::Bytes;
use http::uri::PathAndQuery;
use http::HeaderValue;
use http::StatusCode;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Starts one probe task per backend that configures `probe:`.
pub fn spawn_probes(config: &Config, backends: &[Arc<Backend>]) {
    for b in &config.backends {
        let (Some(probe), Some(backend)) = (&b.probe, backends.iter().find(|x| *x.name == *b.name))
        else {
            continue;
        };
        tokio::spawn(run(Arc::downgrade(backend), probe.clone()));
    }
}

/// One GET on a connection of its own, of `target`: a path under the backend's URL (over TLS
/// for an `https://` backend, with the backend's key, over HTTP/2 when it has `http2`), or an
/// absolute `http(s)://` URL of another server (HTTP/1.1; the backend's TLS settings for `https`,
/// no key). Returns the status and up to `limit` bytes of the body (`None` past it).
pub(super) async fn get(b: &Backend, target: &str, limit: usize) -> Option<(StatusCode, Bytes)> {
    let (uri, tls, own) = if target.starts_with('/') {
        let pq = b.upstream_path(Some(&PathAndQuery::try_from(target).ok()?))?;
        let mut parts = b.base.clone().into_parts();
        parts.path_and_query = Some(pq);
        (http::Uri::from_parts(parts).ok()?, b.request_tls(), true)
    } else {
        let uri: http::Uri = target.parse().ok()?;
        let tls = (uri.scheme_str() == Some("https"))
            .then_some(b.tls.as_ref())
            .flatten();
        (uri, tls, false)
    };
    let https = uri.scheme_str() == Some("https");
    if https && tls.is_none() {
        return None;
    }
    let host = uri.host()?;
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let stream = crate::tls::connect(host, port, tls.map(|t| &**t), Duration::from_secs(30))
        .await
        .ok()?;
    let h2 = own && b.http2 && (!https || stream.alpn() == Some(b"h2"));
    let mut req = http::Request::get(&uri).body(Empty::<Bytes>::new()).ok()?;
    if own {
        if let Some((name, value)) = &b.authorization {
            req.headers_mut().insert(name.clone(), value.clone());
        }
    }
    let io = TokioIo::new(stream);
    let (resp, driver) = if h2 {
        // The absolute URI gives `:scheme` and `:authority`.
        *req.version_mut() = http::Version::HTTP_2;
        let (mut sender, conn) = http2::handshake(TokioExecutor::new(), io).await.ok()?;
        let driver = tokio::spawn(conn);
        (sender.send_request(req).await, driver.abort_handle())
    } else {
        let authority = HeaderValue::from_str(uri.authority()?.as_str()).ok()?;
        *req.uri_mut() = uri.path_and_query()?.as_str().parse().ok()?;
        req.headers_mut().insert(http::header::HOST, authority);
        let (mut sender, conn) = http1::handshake(io).await.ok()?;
        let driver = tokio::spawn(conn);
        (sender.send_request(req).await, driver.abort_handle())
    };
    let resp = resp.ok()?;
    let status = resp.status();
    let body = Limited::new(resp.into_body(), limit).collect().await;
    driver.abort();
    Some((status, body.ok()?.to_bytes()))
}

/// One probe: `true` when the backend answered 2xx.
async fn probe_once(b: &Backend, path: &str) -> Option<bool> {
    // A probe's answer is read but not kept: a large one is still an answer.
    let (status, _) = get(b, path, 1 << 20).await?;
    Some(status.is_success())
}

async fn run(backend: Weak<Backend>, cfg: ProbeConfig) {
    let (mut ok_run, mut fail_run) = (0u32, 0u32);
    let mut tick = tokio::time::interval(cfg.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(b) = backend.upgrade() else { return };
        let healthy = matches!(
            tokio::time::timeout(cfg.timeout, probe_once(&b, &cfg.path)).await,
            Ok(Some(true))
        );
        if healthy {
            ok_run += 1;
            fail_run = 0;
            if ok_run >= cfg.healthy_threshold {
                b.set_probe_healthy(true);
            }
        } else {
            fail_run += 1;
            ok_run = 0;
            if fail_run >= cfg.unhealthy_threshold {
                b.set_probe_healthy(false);
            }
        }
    }
}
