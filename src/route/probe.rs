//! Active health probes: `GET base + path` every interval; `unhealthy_threshold` failures in a row
//! take the backend out of rotation, `healthy_threshold` successes bring it back. A probe task ends
//! by itself when its backend is dropped (e.g. after a config reload).

use super::Backend;
use crate::config::{Config, ProbeConfig};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::sync::{Arc, Weak};

/// Starts one probe task per backend that configures `probe:`.
pub fn spawn_probes(config: &Config, backends: &[Arc<Backend>]) {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    let client: Client<HttpConnector, Empty<Bytes>> =
        Client::builder(TokioExecutor::new()).build(http);
    for b in &config.backends {
        let (Some(probe), Some(backend)) = (&b.probe, backends.iter().find(|x| *x.name == *b.name))
        else {
            continue;
        };
        tokio::spawn(run(Arc::downgrade(backend), probe.clone(), client.clone()));
    }
}

async fn run(
    backend: Weak<Backend>,
    cfg: ProbeConfig,
    client: Client<HttpConnector, Empty<Bytes>>,
) {
    let (mut ok_run, mut fail_run) = (0u32, 0u32);
    let mut tick = tokio::time::interval(cfg.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(b) = backend.upgrade() else { return };
        let uri = format!("{}{}", b.base.to_string().trim_end_matches('/'), cfg.path);
        let healthy = match uri.parse::<http::Uri>() {
            Ok(uri) => {
                let attempt = async {
                    let resp = client.get(uri).await.ok()?;
                    let ok = resp.status().is_success();
                    let _ = resp.into_body().collect().await;
                    Some(ok)
                };
                matches!(
                    tokio::time::timeout(cfg.timeout, attempt).await,
                    Ok(Some(true))
                )
            }
            Err(_) => false,
        };
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
