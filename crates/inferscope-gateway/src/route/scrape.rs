//! Scraping each backend's metrics endpoints (`metrics: { url, gpu_url, interval }`): one task per
//! backend, ending by itself when its backend is dropped (e.g. after a config reload).

use super::engine::{EngineView, GpuView, Scraped};
use super::Backend;
use crate::config::GpuSource;
use crate::config::{Config, MetricsConfig};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::time::Instant;

/// Largest exposition read (vLLM's is tens of KiB; a DCGM exporter's on eight GPUs, a few
/// hundred).
const MAX_EXPOSITION: usize = 8 << 20;

/// How far back rates, means and the busy batch size are taken: `/stats`'s window.
const WINDOW: Duration = Duration::from_secs(60);

/// Starts one scrape task per backend that configures `metrics:`.
pub fn spawn_scrapes(config: &Config, backends: &[Arc<Backend>]) {
    for b in &config.backends {
        let (Some(m), Some(backend)) = (&b.metrics, backends.iter().find(|x| *x.name == *b.name))
        else {
            continue;
        };
        tokio::spawn(run(Arc::downgrade(backend), m.clone()));
    }
}

/// GETs `url` (a path under the backend's base, or an absolute `http(s)://` URL) and returns the
/// body of a 2xx answer as text.
async fn fetch(b: &Backend, url: &str, timeout: Duration) -> Option<String> {
    let (status, body) = tokio::time::timeout(timeout, super::probe::get(b, url, MAX_EXPOSITION))
        .await
        .ok()??;
    status
        .is_success()
        .then(|| String::from_utf8_lossy(&body).into_owned())
}

async fn run(backend: Weak<Backend>, cfg: MetricsConfig) {
    let mut tick = tokio::time::interval(cfg.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The views of the last minute (the stats window): rates and means are taken over it.
    let mut history: std::collections::VecDeque<(Instant, EngineView)> = Default::default();
    // NVML's "no GPU" is said once, not every interval.
    let mut said_no_gpu = false;
    // Busy batch sizes over the same minute, for the roofline.
    let mut batches: std::collections::VecDeque<(Instant, f64)> = Default::default();
    // The GPUs' energy counter over the same minute: its mean power.
    let mut energy: std::collections::VecDeque<(Instant, f64)> = Default::default();
    loop {
        tick.tick().await;
        let Some(b) = backend.upgrade() else { return };
        let engine = match &cfg.url {
            Some(u) => fetch(&b, u, cfg.timeout).await,
            None => None,
        };
        let gpu = match &cfg.gpu_url {
            Some(GpuSource::Nvml) => match tokio::task::spawn_blocking(super::nvml::read).await {
                Ok(Ok(view)) => Some(view),
                Ok(Err(why)) => {
                    if !said_no_gpu {
                        tracing::warn!(backend = %b.name, "{why}");
                        said_no_gpu = true;
                    }
                    None
                }
                Err(_) => None,
            },
            Some(GpuSource::Url(u)) => fetch(&b, u, cfg.timeout).await.map(|t| GpuView::parse(&t)),
            None => None,
        };
        let ok =
            (cfg.url.is_none() || engine.is_some()) && (cfg.gpu_url.is_none() || gpu.is_some());
        let now = Instant::now();
        let old = |t: &Instant| now.duration_since(*t) > WINDOW;
        while history.front().is_some_and(|(t, _)| old(t)) {
            history.pop_front();
        }
        while batches.front().is_some_and(|(t, _)| old(t)) {
            batches.pop_front();
        }
        while energy.front().is_some_and(|(t, _)| old(t)) {
            energy.pop_front();
        }
        let mut gpu = gpu;
        if let Some(g) = &mut gpu {
            if let Some(j) = g.energy_joules {
                // A counter that went back (a driver reload) starts the minute again.
                if energy.back().is_some_and(|(_, last)| j < *last) {
                    energy.clear();
                }
                energy.push_back((now, j));
            }
            g.energy_watts = match (energy.front(), energy.back()) {
                (Some((t0, j0)), Some((t1, j1))) if t1 > t0 => {
                    Some((j1 - j0) / t1.duration_since(*t0).as_secs_f64())
                }
                _ => None,
            };
        }
        let mut engine = engine.map(|t| EngineView::parse(&t, history.front().map(|(_, v)| v)));
        if let Some(e) = &mut engine {
            if let Some(r) = e.running.filter(|r| *r > 0.0) {
                batches.push_back((now, r));
            }
            e.busy_batch = (!batches.is_empty())
                .then(|| batches.iter().map(|b| b.1).sum::<f64>() / batches.len() as f64);
        }
        if let Some(e) = &engine {
            history.push_back((now, e.clone()));
        }
        b.scraped(
            ok,
            (engine.is_some() || gpu.is_some()).then(|| Scraped {
                at: Instant::now(),
                engine,
                gpu,
                in_flight: 0, // the backend's, when stored
            }),
        );
    }
}
