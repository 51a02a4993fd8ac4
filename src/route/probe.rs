//! Active health probes: `GET base + path` every interval; `unhealthy_threshold` failures in a row
//! take the backend out of rotation, `healthy_threshold` successes bring it back. A probe task ends
//! by itself when its backend is dropped (e.g. after a config reload).

use super::Backend;
use crate::config::{Config, ProbeConfig};
use bytes::Bytes;
use http::uri::PathAndQuery;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use std::sync::{Arc, Weak};

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

/// One probe on a connection of its own (over TLS for an `https://` backend, with the backend's
/// key): `true` when it answered 2xx.
async fn probe_once(b: &Backend, path: &str) -> Option<bool> {
    let host = b.base.host()?;
    let port = b
        .base
        .port_u16()
        .unwrap_or(if b.tls.is_some() { 443 } else { 80 });
    let pq = b.upstream_path(Some(&PathAndQuery::try_from(path).ok()?))?;
    let stream = crate::tls::connect(
        host,
        port,
        b.tls.as_deref(),
        std::time::Duration::from_secs(30),
    )
    .await
    .ok()?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    let driver = tokio::spawn(conn);
    let mut req = http::Request::get(http::Uri::from(pq))
        .header(http::header::HOST, b.base.authority()?.as_str())
        .body(Empty::<Bytes>::new())
        .ok()?;
    if let Some((name, value)) = &b.authorization {
        req.headers_mut().insert(name.clone(), value.clone());
    }
    let resp = sender.send_request(req).await.ok()?;
    let ok = resp.status().is_success();
    let _ = resp.into_body().collect().await;
    driver.abort();
    Some(ok)
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
