//! One upstream server and what the gateway knows about it right now: requests in flight, its
//! admission queue, active-probe health, passive outlier ejection, and EWMAs of the TTFT and
//! TPOT measured through it (for latency-aware balancing).

use crate::config::OutlierConfig;
use http::uri::PathAndQuery;
use http::{HeaderValue, Uri};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Weight of a new sample in the TTFT/TPOT moving averages.
const EWMA_ALPHA: f64 = 0.3;

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Per-backend admission: a concurrency cap with a bounded, timed queue.
#[derive(Debug)]
struct Limiter {
    permits: Arc<Semaphore>,
    max_queue: usize,
    queue_timeout: Duration,
    queued: AtomicUsize,
}

/// Why a backend did not admit a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Busy {
    /// The queue was full: answer 429.
    QueueFull,
    /// The wait exceeded `queue_timeout`: answer 503.
    QueueTimeout,
}

/// One upstream inference server.
#[derive(Debug)]
pub struct Backend {
    /// Configured name.
    pub name: Arc<str>,
    /// Base URI: scheme, authority, and the API root path when the URL has one.
    pub base: Uri,
    /// TLS for `https://` backends, offering HTTP/1.1 (probes, scrapes, WebSocket upgrades, and
    /// requests unless `http2`).
    pub tls: Option<Arc<crate::tls::ClientTls>>,
    /// Requests go over HTTP/2 (`http2: true`).
    pub http2: bool,
    /// How long an idle HTTP/1.1 connection to it stays pooled (`idle_timeout`).
    pub idle_timeout: Duration,
    /// The chunk shapes its streams share (`dialect::Shapes`).
    pub shapes: Arc<crate::dialect::Shapes>,
    /// With `http2` over TLS: the same settings offering `h2` first, then `http/1.1`.
    tls_h2: Option<Arc<crate::tls::ClientTls>>,
    /// Provider label.
    pub provider: Arc<str>,
    /// The key header sent upstream (`Authorization: Bearer …` or e.g. `x-api-key`), from
    /// `api_key_env`; marked sensitive.
    pub authorization: Option<(http::HeaderName, HeaderValue)>,
    /// Share for the weighted balancer.
    pub weight: u32,
    /// What records say about it (provider, host, port).
    pub info: crate::facts::Upstream,
    limiter: Option<Limiter>,
    outlier: OutlierConfig,
    in_flight: AtomicUsize,
    probe_healthy: AtomicBool,
    consecutive_failures: AtomicU32,
    ejections_in_a_row: AtomicU32,
    ejected_until_ms: AtomicU64,
    /// Rests after a 429 until then (ms since the process's clock origin).
    busy_until_ms: AtomicU64,
    rate_limited_total: AtomicU64,
    ejections_total: AtomicU64,
    ewma_ttft_us: AtomicU64,
    ewma_tpot_us: AtomicU64,
    /// Its engine sends a span per request (`engine_spans:`): traces are propagated to it
    /// sampled, and records wait for the span.
    pub engine_spans: Option<Arc<crate::config::EngineSpansConfig>>,
    /// The latest scrape of its metrics endpoints (`metrics:`), if any answered.
    scraped: arc_swap::ArcSwapOption<super::engine::Scraped>,
    /// Scrapes older than this are not used.
    stale_after: Duration,
    /// What its roofline needs: the model and the GPUs' peaks.
    pub roofline: Option<(crate::config::ModelSpec, crate::stats::roofline::Peak)>,
    scrapes_ok: AtomicU64,
    scrapes_failed: AtomicU64,
    scrapes_before_first: AtomicU64,
}

/// Holds a backend's in-flight slot (and queue permit) until dropped with the response.
#[derive(Debug)]
pub struct BackendGuard {
    backend: Arc<Backend>,
    _permit: Option<OwnedSemaphorePermit>,
}

impl BackendGuard {
    /// The backend it counts against.
    pub fn backend(&self) -> &Arc<Backend> {
        &self.backend
    }
}

impl Drop for BackendGuard {
    fn drop(&mut self) {
        self.backend.in_flight.fetch_sub(1, Relaxed);
    }
}

/// The paths an engine (vLLM, SGLang) serves at its host's root, beside its OpenAI API.
const ENGINE_ROOT_PATHS: [&str; 7] = [
    "/tokenize",
    "/detokenize",
    "/health",
    "/metrics",
    "/version",
    "/ping",
    "/get_model_info",
];

/// `pq` under the API root `root` (see `Backend::upstream_path`).
pub(super) fn join_root(root: &str, pq: Option<&PathAndQuery>) -> Option<PathAndQuery> {
    let root = root.trim_end_matches('/');
    if root.is_empty() {
        return pq.cloned();
    }
    let full = pq.map_or("/", |p| p.as_str());
    // `http://host:8000/v1` (the OpenAI SDK's and LiteLLM's habit) names an engine's API: its
    // own paths are at the host's root, not under `/v1` (vLLM answers `/v1/tokenize` 404).
    if root == "/v1" && pq.is_some_and(|p| ENGINE_ROOT_PATHS.contains(&p.path())) {
        return pq.cloned();
    }
    let rest = match full.strip_prefix("/v1") {
        Some(r) if r.is_empty() || r.starts_with(['/', '?']) => r,
        _ => full,
    };
    PathAndQuery::try_from(format!("{root}{rest}")).ok()
}

/// A point-in-time view of a backend, for `/stats` and `/metrics`.
#[derive(Debug, Clone, PartialEq)]
pub struct BackendStatus {
    /// The backend's `name:` in the config.
    pub name: Arc<str>,
    /// Usable now (probe healthy and not ejected).
    pub available: bool,
    /// Last active-probe verdict (true without probes).
    pub probe_healthy: bool,
    /// Ejected by passive outlier detection.
    pub ejected: bool,
    /// Times ejected since start.
    pub ejections_total: u64,
    /// Resting after a 429 until its `Retry-After` passes.
    pub rate_limited: bool,
    /// 429 answers since start.
    pub rate_limited_total: u64,
    /// Requests in flight.
    pub in_flight: usize,
    /// Requests waiting in its queue.
    pub queued: usize,
    /// TTFT moving average, milliseconds (0 before any sample).
    pub ewma_ttft_ms: f64,
    /// TPOT moving average, milliseconds (0 before any sample).
    pub ewma_tpot_ms: f64,
    /// The latest scrape of its metrics, fresh or not, and its age.
    pub scraped: Option<(Arc<super::engine::Scraped>, Duration)>,
    /// Whether that scrape is within the staleness bound.
    pub scrape_fresh: bool,
    /// Scrapes where every endpoint answered, and where one did not (after the first that did).
    pub scrapes: (u64, u64),
    /// Scrapes that failed before any answered (a backend still starting): not failures.
    pub scrapes_before_first: u64,
}

impl Backend {
    /// Reaches the backend over TLS.
    pub fn with_tls(mut self, tls: Option<Arc<crate::tls::ClientTls>>) -> Self {
        self.tls = tls;
        let http2 = self.http2;
        self.with_http2(http2)
    }

    /// Sends requests over HTTP/2 (`http2: true`) or HTTP/1.1.
    pub fn with_http2(mut self, http2: bool) -> Self {
        self.http2 = http2;
        self.tls_h2 = match (&self.tls, http2) {
            (Some(t), true) => Some(Arc::new(t.with_alpn(&[b"h2", b"http/1.1"]))),
            _ => None,
        };
        self
    }

    /// Pools idle HTTP/1.1 connections to it this long (`idle_timeout`).
    pub fn with_idle_timeout(mut self, idle_timeout: Duration) -> Self {
        self.idle_timeout = idle_timeout;
        self
    }

    /// The TLS settings requests use (offering `h2` when `http2`).
    pub fn request_tls(&self) -> Option<&Arc<crate::tls::ClientTls>> {
        self.tls_h2.as_ref().or(self.tls.as_ref())
    }

    /// Places it on a roofline.
    pub fn with_roofline(
        mut self,
        r: Option<(crate::config::ModelSpec, crate::stats::roofline::Peak)>,
    ) -> Self {
        self.roofline = r;
        self
    }

    /// Expects its engine's spans (`engine_spans:`).
    pub fn with_engine_spans(mut self, c: Option<crate::config::EngineSpansConfig>) -> Self {
        self.engine_spans = c.map(Arc::new);
        self
    }

    /// Uses scrapes of its metrics for this long.
    pub fn with_stale_after(mut self, d: Duration) -> Self {
        self.stale_after = d;
        self
    }

    /// Takes a scrape's result: `ok` when every configured endpoint answered; `view` when any did.
    pub fn scraped(&self, ok: bool, view: Option<super::engine::Scraped>) {
        if ok {
            self.scrapes_ok.fetch_add(1, Relaxed);
        } else if self.scrapes_ok.load(Relaxed) == 0 {
            // A backend that has not answered yet is starting, not failing.
            self.scrapes_before_first.fetch_add(1, Relaxed);
        } else {
            self.scrapes_failed.fetch_add(1, Relaxed);
        }
        self.scraped.store(view.map(|mut v| {
            v.in_flight = self.in_flight();
            Arc::new(v)
        }));
    }

    /// `engine::queue_score` of a fresh scrape.
    pub fn queue_score(&self) -> Option<(f64, f64, f64)> {
        super::engine::queue_score(&*self.fresh_scrape()?, self.in_flight())
    }

    /// The latest scrape, if it is fresh (no older than the staleness bound).
    pub fn fresh_scrape(&self) -> Option<Arc<super::engine::Scraped>> {
        let s = self.scraped.load_full()?;
        (s.at.elapsed() <= self.stale_after).then_some(s)
    }

    /// The engine's load as a request sent now finds it (a fresh scrape only).
    pub fn engine_load(&self) -> Option<crate::facts::EngineLoad> {
        let s = self.scraped.load();
        super::engine::at_request(s.as_deref()?, Instant::now(), self.stale_after)
    }

    /// The upstream path and query for a request's: the request's own, under the base URL's API
    /// root when it has one. An OpenAI-style root stands for the gateway's `/v1`
    /// (`https://host/api/v1` sends `/v1/chat/completions` to `/api/v1/chat/completions`); other
    /// paths go under the root whole (`/health` to `/api/v1/health`) — but under a bare `/v1`
    /// (an engine's URL as the OpenAI SDK takes it) an engine's own paths (`/tokenize`,
    /// `/detokenize`, `/health`, `/metrics`, `/version`) go to the host's root, where it serves
    /// them.
    pub fn upstream_path(&self, pq: Option<&PathAndQuery>) -> Option<PathAndQuery> {
        join_root(self.base.path(), pq)
    }

    /// A backend with no traffic yet, healthy until shown otherwise.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        name: &str,
        base: Uri,
        provider: &str,
        authorization: Option<(http::HeaderName, HeaderValue)>,
        weight: u32,
        max_concurrency: Option<usize>,
        max_queue: usize,
        queue_timeout: Duration,
        outlier: OutlierConfig,
    ) -> Self {
        let provider: Arc<str> = provider.into();
        let info = crate::facts::Upstream {
            provider: Arc::clone(&provider),
            address: base.host().map(Arc::from),
            port: base.port_u16(),
        };
        Self {
            name: name.into(),
            base,
            tls: None,
            http2: false,
            idle_timeout: Duration::from_secs(4),
            shapes: Arc::default(),
            tls_h2: None,
            provider,
            authorization,
            weight,
            info,
            limiter: max_concurrency.map(|n| Limiter {
                permits: Arc::new(Semaphore::new(n)),
                max_queue,
                queue_timeout,
                queued: AtomicUsize::new(0),
            }),
            outlier,
            in_flight: AtomicUsize::new(0),
            probe_healthy: AtomicBool::new(true),
            consecutive_failures: AtomicU32::new(0),
            ejections_in_a_row: AtomicU32::new(0),
            ejected_until_ms: AtomicU64::new(0),
            busy_until_ms: AtomicU64::new(0),
            rate_limited_total: AtomicU64::new(0),
            ejections_total: AtomicU64::new(0),
            engine_spans: None,
            scraped: arc_swap::ArcSwapOption::empty(),
            stale_after: Duration::from_secs(15),
            roofline: None,
            scrapes_ok: AtomicU64::new(0),
            scrapes_failed: AtomicU64::new(0),
            scrapes_before_first: AtomicU64::new(0),
            ewma_ttft_us: AtomicU64::new(0f64.to_bits()),
            ewma_tpot_us: AtomicU64::new(0f64.to_bits()),
        }
    }

    /// Usable now: the last probe passed, it is not ejected and not resting after a 429.
    pub fn available(&self) -> bool {
        self.probe_healthy.load(Relaxed) && !self.ejected() && !self.resting()
    }

    fn resting(&self) -> bool {
        self.busy_until_ms.load(Relaxed) > now_ms()
    }

    /// The backend answered 429: balancers skip it for `rest` (its `Retry-After`). Not a
    /// failure: it counts toward no ejection.
    pub fn mark_rate_limited(&self, rest: Duration) {
        let until = now_ms() + u64::try_from(rest.as_millis()).unwrap_or(u64::MAX);
        self.busy_until_ms.fetch_max(until, Relaxed);
        self.rate_limited_total.fetch_add(1, Relaxed);
    }

    fn ejected(&self) -> bool {
        self.ejected_until_ms.load(Relaxed) > now_ms()
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Relaxed)
    }

    /// Score for latency-aware balancing: expected latency (EWMA TTFT plus ten tokens' worth of
    /// TPOT) times the requests already in flight. An unmeasured backend scores 0, so it is tried.
    pub fn latency_score(&self) -> f64 {
        let ttft = f64::from_bits(self.ewma_ttft_us.load(Relaxed));
        let tpot = f64::from_bits(self.ewma_tpot_us.load(Relaxed));
        (ttft + 10.0 * tpot) * (1.0 + self.in_flight() as f64)
    }

    /// Admits a request: at once, or after waiting in the bounded queue.
    pub async fn admit(self: &Arc<Self>) -> Result<BackendGuard, Busy> {
        let permit = match &self.limiter {
            None => None,
            Some(l) => match Arc::clone(&l.permits).try_acquire_owned() {
                Ok(p) => Some(p),
                Err(_) => {
                    if l.queued.fetch_add(1, Relaxed) >= l.max_queue {
                        l.queued.fetch_sub(1, Relaxed);
                        return Err(Busy::QueueFull);
                    }
                    let waited = tokio::time::timeout(
                        l.queue_timeout,
                        Arc::clone(&l.permits).acquire_owned(),
                    )
                    .await;
                    l.queued.fetch_sub(1, Relaxed);
                    match waited {
                        Ok(Ok(p)) => Some(p),
                        _ => return Err(Busy::QueueTimeout),
                    }
                }
            },
        };
        self.in_flight.fetch_add(1, Relaxed);
        Ok(BackendGuard {
            backend: Arc::clone(self),
            _permit: permit,
        })
    }

    /// A request through this backend went well: reset failures, fold in its latencies.
    pub fn observe_success(&self, ttft: Option<Duration>, tpot: Option<Duration>) {
        self.consecutive_failures.store(0, Relaxed);
        if !self.ejected() {
            self.ejections_in_a_row.store(0, Relaxed);
        }
        let fold = |cell: &AtomicU64, d: Option<Duration>| {
            if let Some(d) = d {
                let x = d.as_secs_f64() * 1e6;
                let old = f64::from_bits(cell.load(Relaxed));
                let new = if old == 0.0 {
                    x
                } else {
                    old + EWMA_ALPHA * (x - old)
                };
                cell.store(new.to_bits(), Relaxed);
            }
        };
        fold(&self.ewma_ttft_us, ttft);
        fold(&self.ewma_tpot_us, tpot);
    }

    /// A request through this backend failed (5xx, connect error, broken stream, timeout). Enough
    /// in a row eject it for an exponentially growing time.
    pub fn observe_failure(&self) {
        let n = self.consecutive_failures.fetch_add(1, Relaxed) + 1;
        let threshold = self.outlier.consecutive_failures;
        if threshold == 0 || n < threshold || self.ejected() {
            return;
        }
        let k = self.ejections_in_a_row.fetch_add(1, Relaxed).min(16);
        let length = (self.outlier.base_ejection * 2u32.pow(k)).min(self.outlier.max_ejection);
        self.ejected_until_ms.store(
            now_ms() + u64::try_from(length.as_millis()).unwrap_or(u64::MAX),
            Relaxed,
        );
        self.ejections_total.fetch_add(1, Relaxed);
        self.consecutive_failures.store(0, Relaxed);
        tracing::warn!(backend = %self.name, for_ms = length.as_millis() as u64, "backend ejected after consecutive failures");
    }

    /// Records an active-probe verdict (thresholds applied by the prober).
    pub fn set_probe_healthy(&self, healthy: bool) {
        if self.probe_healthy.swap(healthy, Relaxed) != healthy {
            tracing::warn!(backend = %self.name, healthy, "active health probe changed state");
        }
    }

    /// The current view, for `/stats` and `/metrics`.
    pub fn status(&self) -> BackendStatus {
        BackendStatus {
            name: Arc::clone(&self.name),
            available: self.available(),
            probe_healthy: self.probe_healthy.load(Relaxed),
            ejected: self.ejected(),
            ejections_total: self.ejections_total.load(Relaxed),
            rate_limited: self.resting(),
            rate_limited_total: self.rate_limited_total.load(Relaxed),
            in_flight: self.in_flight(),
            queued: self.limiter.as_ref().map_or(0, |l| l.queued.load(Relaxed)),
            ewma_ttft_ms: f64::from_bits(self.ewma_ttft_us.load(Relaxed)) / 1000.0,
            ewma_tpot_ms: f64::from_bits(self.ewma_tpot_us.load(Relaxed)) / 1000.0,
            scraped: self.scraped.load_full().map(|s| {
                let age = s.at.elapsed();
                (s, age)
            }),
            scrape_fresh: self.fresh_scrape().is_some(),
            scrapes: (
                self.scrapes_ok.load(Relaxed),
                self.scrapes_failed.load(Relaxed),
            ),
            scrapes_before_first: self.scrapes_before_first.load(Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engines_own_paths_go_to_its_root_under_a_bare_v1() {
        let j = |root: &str, p: &'static str| {
            join_root(root, Some(&PathAndQuery::from_static(p))).map(|p| p.to_string())
        };
        assert_eq!(
            j("/v1", "/v1/chat/completions").as_deref(),
            Some("/v1/chat/completions")
        );
        assert_eq!(j("/v1/", "/tokenize").as_deref(), Some("/tokenize"));
        assert_eq!(j("/v1", "/metrics").as_deref(), Some("/metrics"));
        assert_eq!(j("/v1", "/health?x=1").as_deref(), Some("/health?x=1"));
        // A hosted API under its own root keeps its paths under it.
        assert_eq!(j("/api/v1", "/health").as_deref(), Some("/api/v1/health"));
        assert_eq!(
            j("/api/v1", "/v1/models").as_deref(),
            Some("/api/v1/models")
        );
        assert_eq!(j("/v1", "/other").as_deref(), Some("/v1/other"));
    }

    fn backend(threshold: u32) -> Arc<Backend> {
        let outlier = OutlierConfig {
            consecutive_failures: threshold,
            base_ejection: Duration::from_secs(10),
            max_ejection: Duration::from_secs(25),
        };
        Arc::new(Backend::new(
            "b",
            Uri::from_static("http://127.0.0.1:1"),
            "vllm",
            None,
            1,
            Some(1),
            1,
            Duration::from_millis(50),
            outlier,
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn consecutive_failures_eject_with_exponential_backoff() {
        let b = backend(3);
        b.observe_failure();
        b.observe_failure();
        assert!(b.available(), "two failures are below the threshold");
        b.observe_failure();
        assert!(!b.available());
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(b.available(), "first ejection lasts 10 s");
        for _ in 0..3 {
            b.observe_failure();
        }
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(!b.available(), "second ejection lasts 20 s");
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(b.available());
        b.observe_success(Some(Duration::from_millis(100)), None);
        for _ in 0..3 {
            b.observe_failure();
        }
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(
            b.available(),
            "a success after recovery resets the backoff to 10 s"
        );
        assert_eq!(b.status().ejections_total, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn queue_full_and_queue_timeout() {
        let b = backend(0);
        let first = b.admit().await.unwrap_or_else(|_| panic!("admitted"));
        assert_eq!(b.in_flight(), 1);
        let waiting = tokio::spawn({
            let b = Arc::clone(&b);
            async move { b.admit().await.map(|_| ()) }
        });
        tokio::task::yield_now().await;
        assert_eq!(b.status().queued, 1);
        assert_eq!(
            b.admit().await.err(),
            Some(Busy::QueueFull),
            "queue of 1 is full"
        );
        tokio::time::advance(Duration::from_millis(60)).await;
        assert_eq!(
            waiting.await.ok().and_then(|r| r.err()),
            Some(Busy::QueueTimeout)
        );
        drop(first);
        assert_eq!(b.in_flight(), 0);
        assert!(b.admit().await.is_ok());
    }

    #[test]
    fn ewma_moves_toward_new_samples() {
        let b = backend(0);
        b.observe_success(
            Some(Duration::from_millis(100)),
            Some(Duration::from_millis(10)),
        );
        b.observe_success(
            Some(Duration::from_millis(200)),
            Some(Duration::from_millis(10)),
        );
        let s = b.status();
        assert!((s.ewma_ttft_ms - 130.0).abs() < 1e-6, "{}", s.ewma_ttft_ms);
        assert!((b.latency_score() - (130_000.0 + 100_000.0)).abs() < 1e-3);
    }
}
