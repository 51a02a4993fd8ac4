//! Assembles a running gateway from a config: in-process simulators, the router, the recorder, the
//! tower stack, the data and admin listeners — and tears it down in order on shutdown (stop
//! accepting, drain in-flight streams, flush the access log, then stop admin and simulators).

use crate::accesslog::AccessLog;
use crate::admin::{self, AdminState};
use crate::config::{sim_profile, Config};
use crate::proxy::{Gateway, Ids, InFlightLimitLayer, ProxyService, RequestIdLayer, TraceOptions};
use crate::recorder::Recorder;
use crate::route::Router;
use crate::server::{self, ServerOptions};
use crate::sim::{self, SimHandle, SimOptions};
use crate::stats::Stats;
use crate::telemetry::{self, Telemetry};
use anyhow::Context as _;
use http::Uri;
use hyper_util::service::TowerToHyperService;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Most distinct (route, model, backend, variant) groups kept; beyond it new model names are
/// counted under `__other__`.
const MAX_GROUPS: usize = 1024;

/// Listen-address overrides from the command line.
#[derive(Debug, Clone, Copy, Default)]
pub struct Overrides {
    /// Replaces `listen`.
    pub listen: Option<SocketAddr>,
    /// Replaces `admin.listen`.
    pub admin: Option<SocketAddr>,
}

/// A running gateway.
#[derive(Debug)]
pub struct Running {
    /// Bound data-plane address.
    pub data_addr: SocketAddr,
    /// Bound admin address.
    pub admin_addr: SocketAddr,
    /// Stats and the access log.
    pub recorder: Arc<Recorder>,
    /// In-process simulators, by backend name.
    pub sims: HashMap<String, SimHandle>,
    stop: watch::Sender<bool>,
    accepting: Arc<AtomicBool>,
    done: JoinHandle<bool>,
}

impl Running {
    /// Begins a graceful shutdown (idempotent).
    pub fn shutdown(&self) {
        self.accepting.store(false, Ordering::Relaxed);
        let _ = self.stop.send(true);
    }

    /// Waits for the shutdown to complete. True when every in-flight request finished in time.
    pub async fn wait(self) -> bool {
        self.done.await.unwrap_or(false)
    }
}

async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// Starts everything `config` describes and returns once the listeners are bound.
pub async fn start(config: Arc<Config>, overrides: Overrides) -> anyhow::Result<Running> {
    let (stop_data, data_rx) = watch::channel(false);
    let (stop_rest, rest_rx) = watch::channel(false);

    let mut sims = HashMap::new();
    let mut bases = HashMap::new();
    for b in &config.backends {
        let base: Uri = match (&b.url, &b.sim) {
            (Some(url), _) => url
                .parse()
                .with_context(|| format!("backend {}: url", b.name))?,
            (None, Some(s)) => {
                let profile = sim_profile(&s.profile).map_err(anyhow::Error::msg)?;
                let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
                let mut opts = SimOptions::new(profile);
                opts.seed = s.seed;
                let handle = sim::spawn(listener, opts, stopped(rest_rx.clone()))?;
                let uri = format!("http://{}", handle.addr).parse()?;
                sims.insert(b.name.clone(), handle);
                uri
            }
            (None, None) => anyhow::bail!("backend {} has neither url nor sim", b.name),
        };
        bases.insert(b.name.clone(), base);
    }
    let router = Arc::new(Router::new(&config, &bases).map_err(anyhow::Error::msg)?);
    crate::route::spawn_probes(&config, router.backends());

    let data_listener = TcpListener::bind(overrides.listen.unwrap_or(config.listen))
        .await
        .context("binding the data-plane listener")?;
    let admin_listener = TcpListener::bind(overrides.admin.unwrap_or(config.admin.listen))
        .await
        .context("binding the admin listener")?;
    let data_addr = data_listener.local_addr()?;
    let admin_addr = admin_listener.local_addr()?;

    let log = match &config.access_log {
        Some(a) => AccessLog::open(&a.path, a.queue)
            .await
            .with_context(|| format!("opening access log {}", a.path.display()))?,
        None => AccessLog::disabled(),
    };
    let settings = telemetry::resolve(config.telemetry.as_ref(), |k| std::env::var(k).ok())
        .map_err(|e| anyhow::anyhow!("telemetry: {e}"))?;
    let trace = TraceOptions {
        enabled: settings.is_some(),
        sample_ratio: settings.as_ref().map_or(1.0, |s| s.sample_ratio),
        capture_content: settings.as_ref().and_then(|s| s.capture_content),
    };
    let telemetry = match settings {
        Some(s) => Some(Telemetry::start(s, data_addr).map_err(anyhow::Error::msg)?),
        None => None,
    };
    let recorder = Arc::new(Recorder::new(Stats::new(MAX_GROUPS), log, telemetry));
    let ids = Arc::new(Ids::default());
    let limits = config.limits.clone();
    let gateway = Arc::new(Gateway::new(
        Arc::clone(&router),
        Arc::clone(&recorder),
        limits.clone(),
        Arc::clone(&ids),
        trace,
    ));

    // The data-plane stack, outermost first. (The HTTP/1 header-read timeout is enforced by the
    // connection itself, see `ServerOptions::header_read_timeout`.)
    let stack = tower::ServiceBuilder::new()
        // Every response, gateway-made ones included, carries x-inferscope-request-id.
        .layer(RequestIdLayer::new(ids))
        // Caps requests in flight, counted until their body ends; over it the proxy answers 503.
        .layer(InFlightLimitLayer::new(limits.max_concurrent_requests))
        .service(ProxyService::new(gateway));
    let data_service = TowerToHyperService::new(stack);

    let accepting = Arc::new(AtomicBool::new(true));
    let admin_state = Arc::new(AdminState {
        recorder: Arc::clone(&recorder),
        router,
        accepting: Arc::clone(&accepting),
    });
    let admin_service =
        hyper::service::service_fn(move |req| admin::handle(Arc::clone(&admin_state), req));
    let admin_opts = ServerOptions {
        header_read_timeout: Some(limits.header_read_timeout),
        grace: std::time::Duration::from_secs(2),
    };
    let admin_task = tokio::spawn(server::run(
        admin_listener,
        admin_service,
        admin_opts,
        stopped(rest_rx),
    ));

    let data_opts = ServerOptions {
        header_read_timeout: Some(limits.header_read_timeout),
        grace: limits.shutdown_grace,
    };
    let data_task = tokio::spawn(server::run(
        data_listener,
        data_service,
        data_opts,
        stopped(data_rx.clone()),
    ));

    let rec = Arc::clone(&recorder);
    let mut stop_rx = data_rx;
    let done = tokio::spawn(async move {
        let _ = stop_rx.wait_for(|s| *s).await;
        let drained = data_task.await.unwrap_or(false);
        if !drained {
            tracing::warn!("shutdown grace period ended with requests still in flight");
        }
        rec.log.flush().await;
        if let Some(t) = &rec.telemetry {
            t.shutdown().await;
        }
        let _ = stop_rest.send(true);
        let _ = admin_task.await;
        drained
    });

    Ok(Running {
        data_addr,
        admin_addr,
        recorder,
        sims,
        stop: stop_data,
        accepting,
        done,
    })
}
