//! Assembles a running gateway from a config: in-process simulators, the router, the recorder, the
//! tower stack, the data and admin listeners — and tears it down in order on shutdown (stop
//! accepting, drain in-flight streams, flush the access log, then stop admin and simulators).

use crate::accesslog::AccessLog;
use crate::admin::{self, AdminState, ReloadCounters};
use crate::config::{sim_profile, Config};
use crate::meter::{MeterLayer, MeterSettings, Metering, RecordSink};
use crate::proxy::{Gateway, InFlightLimitLayer, ProxyService, TraceOptions};
use crate::recorder::Recorder;
use crate::route::{Observer, Router, RouterSlot};
use crate::server::{self, ServerOptions};
use crate::sim::{self, SimHandle, SimOptions};
use crate::stats::Stats;
use crate::telemetry::{self, Telemetry};
use crate::util::Ids;
use anyhow::Context as _;
use http::Uri;
use hyper_util::service::TowerToHyperService;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Most distinct (route, model, backend, variant) groups kept; beyond it new model names are
/// counted under `__other__`.
const MAX_GROUPS: usize = 1024;

/// The heartbeat's tick: a stall of a few tens of milliseconds shows as nearly its length. The
/// timer runs only while requests are in flight, and sleeps longer while frames beat for it
/// (`clock::Heartbeat`).
const HEARTBEAT_TICK: std::time::Duration = std::time::Duration::from_millis(10);

/// Listen-address overrides from the command line.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// Replaces `listen`.
    pub listen: Option<SocketAddr>,
    /// Replaces `admin.listen`.
    pub admin: Option<SocketAddr>,
    /// The file the config came from: enables reload on SIGHUP and on change.
    pub config_path: Option<std::path::PathBuf>,
}

/// Why a reload was not applied (the running config keeps serving).
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The gateway runs the embedded default.
    #[error("no config file to reload (running the embedded default)")]
    NoFile,
    /// The file is invalid.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// Backends or routes could not be built (a simulator did not start, a key is missing).
    #[error("{0:#}")]
    Build(anyhow::Error),
}

/// Re-reads the config file and swaps routes and backends in, keeping what cannot change live.
#[derive(Debug)]
pub struct Reloader {
    path: Option<std::path::PathBuf>,
    current: parking_lot::Mutex<Arc<Config>>,
    sims: tokio::sync::Mutex<HashMap<String, (String, u64, SimHandle)>>,
    routes: Arc<RouterSlot>,
    stop_sims: watch::Receiver<bool>,
    /// Modification time of the file as last loaded (so the watcher does not load it twice).
    loaded_mtime: parking_lot::Mutex<Option<std::time::SystemTime>>,
    /// The last rejection's text: the same file rejected again for the same reason (the watcher
    /// saw the edit, then the operator sent SIGHUP) is logged once.
    last_rejection: parking_lot::Mutex<Option<String>>,
    /// Reloads applied and rejected, of the config and of the listener certificates (`/metrics`).
    pub counters: Arc<ReloadCounters>,
    keys: Arc<arc_swap::ArcSwapOption<crate::access::Keys>>,
    limiter: Arc<crate::access::Limiter>,
    /// Where the rollbacks in force are kept (rolled back again in each new router).
    recorder: Arc<Recorder>,
}

impl Reloader {
    /// Loads the file again; applies it when valid, else keeps the running config. In-flight
    /// requests finish on the gateway they started with.
    pub async fn reload(&self) -> Result<(), ReloadError> {
        let Some(path) = &self.path else {
            return Err(ReloadError::NoFile);
        };
        *self.loaded_mtime.lock() = file_mtime(path);
        let result = async {
            let new = crate::config::load(path)?;
            let old = Arc::clone(&self.current.lock());
            for (what, same) in [
                ("listen", old.listen == new.listen),
                ("tls", old.tls == new.tls),
                (
                    "admin",
                    format!("{:?}", old.admin) == format!("{:?}", new.admin),
                ),
                (
                    "access_log",
                    format!("{:?}", old.access_log) == format!("{:?}", new.access_log),
                ),
                (
                    "telemetry",
                    format!("{:?}", old.telemetry) == format!("{:?}", new.telemetry),
                ),
                (
                    "limits",
                    format!("{:?}", old.limits) == format!("{:?}", new.limits),
                ),
            ] {
                if !same {
                    tracing::warn!(
                        section = what,
                        "changed in the config file; takes effect on restart"
                    );
                }
            }
            let keys = load_keys(new.auth.as_ref())
                .await
                .map_err(ReloadError::Build)?;
            let mut sims = self.sims.lock().await;
            let router = build_router(&new, &mut sims, &self.stop_sims)
                .await
                .map_err(ReloadError::Build)?;
            self.keys.store(keys);
            self.limiter.configure(new.rate_limits.as_ref());
            let router = Arc::new(router);
            crate::route::spawn_probes(&new, router.backends());
            crate::route::spawn_scrapes(&new, router.backends());
            admin::reapply_rollbacks(&router, &self.recorder.experiments.rollbacks.in_force());
            self.routes.store(router);
            *self.current.lock() = new;
            Ok::<(), ReloadError>(())
        }
        .await;
        match &result {
            Ok(()) => {
                self.counters.ok.fetch_add(1, Ordering::Relaxed);
                *self.last_rejection.lock() = None;
                tracing::info!(path = %path.display(), "config reloaded");
            }
            Err(e) => {
                self.counters.failed.fetch_add(1, Ordering::Relaxed);
                let text = e.to_string();
                if self.last_rejection.lock().replace(text.clone()).as_ref() == Some(&text) {
                    tracing::debug!(error = %text, "config reload rejected again for the same reason");
                } else {
                    tracing::error!(error = %text, "config reload rejected; the previous config keeps serving");
                }
            }
        }
        result
    }
}

/// Resolves every backend's address (starting simulators not already running with the same
/// profile and seed) and builds the router.
async fn build_router(
    config: &Config,
    sims: &mut HashMap<String, (String, u64, SimHandle)>,
    stop: &watch::Receiver<bool>,
) -> anyhow::Result<Router> {
    let mut bases = HashMap::new();
    for b in &config.backends {
        let https = b.url.as_deref().is_some_and(|u| u.starts_with("https://"));
        let tls = if https {
            let files = b.tls.clone().unwrap_or_default().files();
            let built = tokio::task::spawn_blocking(move || {
                crate::tls::ClientTls::new(&files, &[b"http/1.1"])
            })
            .await?
            .with_context(|| format!("backend {}: tls", b.name))?;
            Some(Arc::new(built))
        } else {
            None
        };
        let base: Uri = match (&b.url, &b.sim) {
            (Some(url), _) => url
                .parse()
                .with_context(|| format!("backend {}: url", b.name))?,
            (None, Some(s)) => {
                let reuse = sims
                    .get(&b.name)
                    .filter(|(p, seed, _)| *p == s.profile && *seed == s.seed);
                let addr = match reuse {
                    Some((_, _, h)) => h.addr,
                    None => {
                        let profile = sim_profile(&s.profile)?;
                        let listener = server::bind_loopback()?;
                        let mut opts = SimOptions::new(profile);
                        opts.seed = s.seed;
                        let handle = sim::spawn(listener, opts, stopped(stop.clone()))?;
                        let addr = handle.addr;
                        sims.insert(b.name.clone(), (s.profile.clone(), s.seed, handle));
                        addr
                    }
                };
                format!("http://{addr}").parse()?
            }
            (None, None) => anyhow::bail!("backend {} has neither url nor sim", b.name),
        };
        bases.insert(b.name.clone(), (base, tls));
    }
    Ok(Router::new(config, &bases)?)
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
    /// Config reloads (SIGHUP, file changes, or a direct call).
    pub reloader: Arc<Reloader>,
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

/// Starts `config` with both listeners on free loopback ports (tests, benchmarks, tools).
pub async fn start_local(config: Config) -> anyhow::Result<Running> {
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let overrides = Overrides {
        listen: Some(any),
        admin: Some(any),
        config_path: None,
    };
    start(Arc::new(config), overrides).await
}

/// Starts everything `config` describes and returns once the listeners are bound.
pub async fn start(config: Arc<Config>, overrides: Overrides) -> anyhow::Result<Running> {
    let (stop_data, data_rx) = watch::channel(false);
    let (stop_rest, rest_rx) = watch::channel(false);

    let mut sim_table = HashMap::new();
    let router = build_router(&config, &mut sim_table, &rest_rx).await?;
    let sims: HashMap<String, SimHandle> = sim_table
        .iter()
        .map(|(k, v)| (k.clone(), v.2.clone()))
        .collect();
    let router = Arc::new(router);
    crate::route::spawn_probes(&config, router.backends());
    crate::route::spawn_scrapes(&config, router.backends());

    let backlog = config.limits.listen_backlog;
    if let Some(cap) = server::somaxconn().filter(|&cap| cap < backlog) {
        tracing::warn!(
            configured = backlog,
            effective = cap,
            "limits.listen_backlog is capped by the kernel (raise net.core.somaxconn)"
        );
    }
    let data_listener = server::bind(overrides.listen.unwrap_or(config.listen), backlog)
        .context("binding the data-plane listener")?;
    let admin_listener = server::bind(overrides.admin.unwrap_or(config.admin.listen), backlog)
        .context("binding the admin listener")?;
    let data_addr = data_listener.local_addr()?;
    let admin_addr = admin_listener.local_addr()?;
    if let Some(refusal) = crate::config::admin_exposure(&config.admin, admin_addr) {
        anyhow::bail!("admin.listen: {refusal}");
    }
    let admin_token = match &config.admin.token_env {
        Some(var) => Some(
            std::env::var(var)
                .with_context(|| format!("admin.token_env: environment variable {var}"))?,
        ),
        None => None,
    };
    if config.admin.allow_unauthenticated && admin_token.is_none() && !admin_addr.ip().is_loopback()
    {
        let receiver = if config.backends.iter().any(|b| b.engine_spans.is_some()) {
            " and its OTLP span receiver"
        } else {
            ""
        };
        tracing::warn!(
            admin = %admin_addr,
            "admin.allow_unauthenticated: the admin API{receiver} answer anyone who can reach {admin_addr} without a token (measurements, experiments, resets, posted results)"
        );
    }

    let data_tls = server_tls(config.tls.as_ref(), "tls").await?;
    let admin_tls = server_tls(config.admin.tls.as_ref(), "admin.tls").await?;
    let admin_connections = Arc::new(server::ConnCounters::default());
    let tls_listeners: Vec<_> = data_tls.iter().chain(admin_tls.iter()).cloned().collect();

    let log = match &config.access_log {
        Some(a) => {
            let rotation = a.rotate.as_ref().map(|r| crate::accesslog::Rotation {
                max_bytes: r.max_bytes,
                max_age: r.max_age,
                keep: r.keep,
            });
            AccessLog::open_with(&a.path, a.queue, rotation)
                .await
                .with_context(|| format!("opening access log {}", a.path.display()))?
        }
        None => AccessLog::disabled(),
    };
    let settings = telemetry::resolve(config.telemetry.as_ref(), |k| std::env::var(k).ok())
        .context("telemetry")?;
    let trace = TraceOptions {
        enabled: settings.is_some(),
        capture_content: settings.as_ref().and_then(|s| s.capture_content),
    };
    let mut meter_settings = MeterSettings::default();
    meter_settings.sample_ratio = settings.as_ref().map_or(1.0, |s| s.sample_ratio);
    meter_settings.max_event_bytes = config.limits.max_event_bytes;
    let telemetry = match settings {
        Some(s) => Some(Telemetry::start(s, data_addr)?),
        None => None,
    };
    let recorder = Arc::new(Recorder::new(Stats::new(MAX_GROUPS), log, telemetry));
    if let Some(f) = &config.feedback {
        recorder
            .experiments
            .feedback
            .persist_to(&f.path)
            .with_context(|| format!("feedback.path {}", f.path.display()))?;
    }
    let mut rollbacks = crate::experiment::InForce::default();
    if let Some(dir) = &config.state_dir {
        let kept = std::fs::create_dir_all(dir).and_then(|()| {
            let n = recorder
                .experiments
                .quality
                .persist_to(&dir.join("quality.jsonl"))?;
            rollbacks = recorder
                .experiments
                .rollbacks
                .persist_to(&dir.join("rollbacks.jsonl"))?;
            recorder
                .experiments
                .decisions
                .persist_to(&dir.join("verdicts.jsonl"))?;
            Ok(n)
        });
        match kept {
            Ok(n) => {
                tracing::info!(
                "state kept in {}: {n} quality results, {} rollbacks and {} promotions read back",
                std::path::absolute(dir).unwrap_or_else(|_| dir.clone()).display(),
                rollbacks.tripped.len(),
                rollbacks.promoted.len()
            )
            }
            Err(e) => anyhow::bail!("state_dir {}: {e}", dir.display()),
        }
    }
    // The routing side learns from records through its observer; a guardrail trip becomes an
    // OpenTelemetry event (weakly: the recorder owns the observer).
    admin::reapply_rollbacks(&router, &rollbacks);
    let routes = Arc::new(RouterSlot::new(router));
    let weak = Arc::downgrade(&recorder);
    let observer = Arc::new(Observer::new(
        Arc::clone(&routes),
        Box::new(move |route, variant, trip| {
            if let Some(r) = weak.upgrade() {
                r.guardrail_tripped(route, variant, trip);
            }
        }),
    ));
    let keys = Arc::new(arc_swap::ArcSwapOption::new(
        load_keys(config.auth.as_ref()).await?,
    ));
    let limiter = Arc::new(crate::access::Limiter::new(config.rate_limits.as_ref()));
    recorder.observe_with(vec![
        Arc::clone(&observer) as Arc<dyn RecordSink>,
        Arc::clone(&limiter) as Arc<dyn RecordSink>,
    ]);
    let limits = config.limits.clone();
    let heartbeat = Arc::new(crate::clock::Heartbeat::new(
        HEARTBEAT_TICK,
        limits.lateness_warning,
    ));
    let metering = Metering::with_heartbeat(
        Arc::clone(&recorder),
        Arc::new(Ids::default()),
        meter_settings,
        Some(Arc::clone(&heartbeat)),
    );
    let slots = Arc::new(crate::proxy::Slots::new(
        limits.max_concurrent_requests,
        limits.overload_at,
    ));
    let gateway = Arc::new(
        Gateway::new(
            Arc::clone(&routes),
            Arc::clone(&metering),
            limits.clone(),
            trace,
        )
        .with_access(Arc::clone(&keys), Arc::clone(&limiter))
        .with_slots(Arc::clone(&slots))
        .with_span_expectations({
            let rec = Arc::downgrade(&recorder);
            crate::proxy::SpanExpect(Arc::new(move |trace, span| {
                if let Some(r) = rec.upgrade() {
                    r.expect_span(trace, span);
                }
            }))
        }),
    );

    // The data-plane stack, outermost first. (The HTTP/1 header-read timeout is enforced by the
    // connection itself, see `ServerOptions::header_read_timeout`.)
    let stack = tower::ServiceBuilder::new()
        // Measures and records every request, those refused inside included; every response
        // carries x-inferscope-request-id.
        .layer(MeterLayer::with_metering(Arc::clone(&metering)))
        // Caps requests in flight, counted until their body ends; over it: 503, `rejected`.
        .layer(InFlightLimitLayer::over(slots))
        .service(ProxyService::new(gateway));
    let data_service = TowerToHyperService::new(stack);

    let accepting = Arc::new(AtomicBool::new(true));
    let connections = Arc::new(server::ConnCounters::default());
    let reloader = Arc::new(Reloader {
        recorder: Arc::clone(&recorder),
        path: overrides.config_path.clone(),
        current: parking_lot::Mutex::new(Arc::clone(&config)),
        sims: tokio::sync::Mutex::new(sim_table),
        routes: Arc::clone(&routes),
        stop_sims: rest_rx.clone(),
        loaded_mtime: parking_lot::Mutex::new(
            overrides.config_path.as_deref().and_then(file_mtime),
        ),
        last_rejection: parking_lot::Mutex::default(),
        counters: Arc::default(),
        keys,
        limiter: Arc::clone(&limiter),
    });
    if reloader.path.is_some() || !tls_listeners.is_empty() {
        tokio::spawn(watch_config(
            Arc::clone(&reloader),
            tls_listeners,
            data_rx.clone(),
        ));
    }
    // Registered before `start` returns, so a SIGUSR1 sent once it is listening never finds the
    // default action (terminate) in place.
    #[cfg(unix)]
    if let Ok(usr1) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())
    {
        tokio::spawn(reopen_log_on_usr1(
            usr1,
            Arc::clone(&recorder),
            data_rx.clone(),
        ));
    }
    let admin_state = Arc::new(AdminState {
        recorder: Arc::clone(&recorder),
        metering: Arc::clone(&metering),
        routes: Arc::clone(&routes),
        observer,
        reloads: Arc::clone(&reloader.counters),
        accepting: Arc::clone(&accepting),
        connections: Arc::clone(&connections),
        admin_connections: Arc::clone(&admin_connections),
        token: admin_token,
        limiter,
        hosts: (admin_addr, config.admin.allowed_hosts.clone()),
        heartbeat: Arc::clone(&heartbeat),
        kernel_clock: limits.kernel_clock,
        receiver: admin::Receiver::default(),
        token_failures: crate::access::FailedChecks::default(),
    });
    let busy = Arc::clone(&metering);
    tokio::spawn(
        Arc::clone(&heartbeat).run(move || busy.in_flight() <= 0, stopped(data_rx.clone())),
    );
    // `on_reject: fallback`: verdicts judged every second (latency moves with traffic; a posted
    // eval result is judged at once, by the admin API).
    tokio::spawn({
        let (routes, rec) = (Arc::clone(&routes), Arc::downgrade(&recorder));
        let stop = stopped(data_rx.clone());
        async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
            tokio::pin!(stop);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    () = &mut stop => return,
                }
                let Some(rec) = rec.upgrade() else { return };
                admin::act_on_verdicts(&routes.load(), &rec);
            }
        }
    });
    let admin_service = hyper_util::service::TowerToHyperService::new(admin::router(admin_state));
    let admin_opts = ServerOptions {
        header_read_timeout: Some(limits.header_read_timeout),
        idle_timeout: Some(limits.client_idle_timeout),
        max_connections: ADMIN_CONNECTIONS,
        grace: std::time::Duration::from_secs(2),
        counters: Arc::clone(&admin_connections),
        tls: admin_tls.clone(),
        // Trickled heads cannot hold every admin connection: at the cap, the one that has
        // waited longest (250 ms at least) for its first head makes room for a new one, so
        // probes, which send theirs at once, get in well within a kubelet's 1 s timeout.
        evict_waiting_heads: Some(std::time::Duration::from_millis(250)),
        ..ServerOptions::default()
    };
    let admin_task = tokio::spawn(server::run(
        admin_listener,
        admin_service,
        admin_opts,
        stopped(rest_rx),
    ));

    let data_connections = server::connections_within_fd_limit(limits.max_connections);
    if data_connections < limits.max_connections {
        let fd_limit = server::fd_limit().map_or(0, |l| l.0);
        if limits.max_connections == crate::config::Limits::default().max_connections {
            // The default, not a number anyone asked for: said, not warned.
            tracing::info!(
                default = limits.max_connections,
                effective = data_connections,
                fd_limit,
                "max_connections is what the open-file limit holds"
            );
        } else {
            tracing::warn!(
                configured = limits.max_connections,
                effective = data_connections,
                fd_limit,
                "max_connections lowered to what the open-file limit holds (raise `ulimit -n`)"
            );
        }
    }
    let refused_to = Arc::clone(&metering);
    let cut = Arc::clone(&metering);
    let data_opts = ServerOptions {
        header_read_timeout: Some(limits.header_read_timeout),
        idle_timeout: Some(limits.client_idle_timeout),
        max_connections: data_connections,
        max_headers: limits.max_header_count,
        max_header_bytes: limits.max_header_bytes,
        h2_max_streams: limits.h2_max_streams,
        grace: limits.shutdown_grace,
        on_refused: Some(Arc::new(move |r| refused_to.refused_by_http(&r))),
        counters: Arc::clone(&connections),
        on_cut: Some(Arc::new(move || cut.cut_at_shutdown())),
        tls: data_tls.clone(),
        kernel_clock: limits.kernel_clock,
        overload_at: limits.overload_at,
        evict_waiting_heads: None,
    };
    let data_task = tokio::spawn(server::run(
        data_listener,
        data_service,
        data_opts,
        stopped(data_rx.clone()),
    ));

    // Records waiting for their engine's span: written out when it comes or its wait ends; once
    // the data plane has drained, spans get up to a second more.
    let (drained_tx, drained_rx) = tokio::sync::oneshot::channel::<()>();
    let joins = tokio::spawn(Arc::clone(&recorder).run_joins(
        std::time::Duration::from_millis(100),
        std::time::Duration::from_secs(1),
        async {
            let _ = drained_rx.await;
        },
    ));
    let rec = Arc::clone(&recorder);
    let mut stop_rx = data_rx;
    let done = tokio::spawn(async move {
        let _ = stop_rx.wait_for(|s| *s).await;
        let drained = data_task.await.unwrap_or(false);
        if !drained {
            tracing::warn!("shutdown grace period ended with requests still in flight");
        }
        let _ = drained_tx.send(());
        let _ = joins.await;
        rec.log.close().await;
        rec.experiments.flush_journals().await;
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
        reloader,
    })
}

/// Connections the admin listener holds open at once.
const ADMIN_CONNECTIONS: usize = 64;

/// Client keys (reading `key_file`s off the runtime); `None` without an `auth` section.
async fn load_keys(
    auth: Option<&crate::config::AuthConfig>,
) -> anyhow::Result<Option<Arc<crate::access::Keys>>> {
    let Some(a) = auth.cloned() else {
        return Ok(None);
    };
    let keys = tokio::task::spawn_blocking(move || {
        crate::access::Keys::load(&a, |v| std::env::var(v).ok())
    })
    .await??;
    Ok(Some(Arc::new(keys)))
}

/// A listener's TLS, loaded off the runtime.
async fn server_tls(
    c: Option<&crate::config::ServerTlsConfig>,
    section: &'static str,
) -> anyhow::Result<Option<Arc<crate::tls::ServerTls>>> {
    let Some(c) = c else { return Ok(None) };
    let files = c.files();
    let tls = tokio::task::spawn_blocking(move || crate::tls::ServerTls::load(files))
        .await?
        .with_context(|| section)?;
    Ok(Some(Arc::new(tls)))
}

/// Reloads listener certificates (SIGHUP, or a changed file): off the runtime, keeping the
/// running ones when the new files are bad.
async fn reload_tls(tls: &[Arc<crate::tls::ServerTls>], forced: bool, counters: &ReloadCounters) {
    for t in tls {
        let t2 = Arc::clone(t);
        let t = Arc::clone(t);
        let outcome = tokio::task::spawn_blocking(move || {
            let r = if forced {
                Some(t.reload())
            } else {
                t.reload_if_changed()
            };
            (r, t.files().cert.clone())
        })
        .await;
        match outcome {
            Ok((Some(Ok(())), cert)) => {
                counters.tls_ok.fetch_add(1, Ordering::Relaxed);
                t2.note_rejection(None);
                tracing::info!(cert = %cert.display(), "TLS certificate reloaded")
            }
            Ok((Some(Err(e)), _)) => {
                counters.tls_failed.fetch_add(1, Ordering::Relaxed);
                let text = e.to_string();
                if t2.note_rejection(Some(text.clone())) {
                    tracing::error!(error = %text, "TLS reload rejected; the running certificate stays")
                } else {
                    tracing::debug!(error = %text, "TLS reload rejected again for the same reason")
                }
            }
            _ => {}
        }
    }
}

fn file_mtime(p: &std::path::Path) -> Option<std::time::SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// Reopens the access log on SIGUSR1 (logrotate's `postrotate`), until the gateway stops.
#[cfg(unix)]
async fn reopen_log_on_usr1(
    mut usr1: tokio::signal::unix::Signal,
    recorder: Arc<Recorder>,
    stop: watch::Receiver<bool>,
) {
    let stop = stopped(stop);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = usr1.recv() => recorder.log.reopen().await,
            () = &mut stop => return,
        }
    }
}

/// Reloads the config and listener certificates on SIGHUP, and each when its files'
/// modification times differ from those last loaded (checked every second), until the gateway
/// stops.
async fn watch_config(
    reloader: Arc<Reloader>,
    tls: Vec<Arc<crate::tls::ServerTls>>,
    stop: watch::Receiver<bool>,
) {
    let path = reloader.path.clone();
    #[cfg(unix)]
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    let stop = stopped(stop);
    tokio::pin!(stop);
    loop {
        #[cfg(unix)]
        let hup_fired = async {
            match hup.as_mut() {
                Some(h) => {
                    h.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        #[cfg(not(unix))]
        let hup_fired = std::future::pending::<()>();
        tokio::select! {
            () = hup_fired => {
                tracing::info!("SIGHUP: reloading the config and certificates");
                if path.is_some() {
                    let _ = reloader.reload().await;
                }
                reload_tls(&tls, true, &reloader.counters).await;
            }
            _ = tick.tick() => {
                if let Some(path) = &path {
                    let loaded = *reloader.loaded_mtime.lock();
                    if file_mtime(path) != loaded {
                        let _ = reloader.reload().await;
                    }
                }
                reload_tls(&tls, false, &reloader.counters).await;
            }
            () = &mut stop => return,
        }
    }
}
