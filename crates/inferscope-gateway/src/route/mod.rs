//! Routing: the first route whose match holds takes the request; its target is a backend pool or
//! an experiment split between variants (each a pool); within a pool a balancer picks a backend
//! among the available ones (probe-healthy and not ejected).
//!
//! The split is deterministic: with a sticky key the variant is a stable hash of the key (the same
//! on every replica and across restarts, no shared state); without one, requests are spread by a
//! strided counter that gives each variant exactly its weight in every cycle of `total` requests,
//! interleaved. An experiment's guardrails can roll a variant back to the control; its shadow
//! policy sends copies to a shadow variant.
//!
//! Routing learns from finished requests through `Observer`, a `RecordSink`: backend health and
//! latency, guardrails and shadow agreement are fed from the records, looked up by name in the
//! current router — nothing on the measuring side calls into routing.

mod backend;
pub mod engine;
pub mod nvml;
mod observer;
mod probe;
mod prometheus;
mod scrape;
mod split;

pub use crate::meter::NONE;
pub use backend::{Backend, BackendGuard, BackendStatus, Busy};
pub use observer::{Observer, TripReporter};
pub use probe::spawn_probes;
pub use prometheus::roofline;
pub use scrape::spawn_scrapes;
pub use split::Split;

use crate::config::{Balancer, Config, RetryConfig, TimeoutsConfig};
use crate::util::stable_hash;
use http::{HeaderMap, HeaderValue, Uri};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tower::retry::budget::TpsBudget;

/// Retries may add `budget_ratio` of the requests of the last `RETRY_WINDOW`, plus
/// `min_per_second` over it (tower's `TpsBudget`: a sliding window of ten slots).
pub const RETRY_WINDOW: std::time::Duration = std::time::Duration::from_secs(10);

/// The retry budget a route's retry policy describes.
pub fn retry_budget(r: &RetryConfig) -> TpsBudget {
    TpsBudget::new(RETRY_WINDOW, r.min_per_second, r.budget_ratio as f32)
}

/// The router currently serving, replaced whole on a config reload: each request routes on the
/// router current when it arrived; reading it is one atomic load.
#[derive(Debug)]
pub struct RouterSlot(arc_swap::ArcSwap<Router>);

impl RouterSlot {
    /// A slot holding `router`.
    pub fn new(router: Arc<Router>) -> Self {
        Self(arc_swap::ArcSwap::new(router))
    }

    /// The current router.
    pub fn load(&self) -> Arc<Router> {
        self.0.load_full()
    }

    /// Replaces the router for requests arriving from now on.
    pub fn store(&self, router: Arc<Router>) {
        self.0.store(router);
    }
}

/// A set of interchangeable backends.
#[derive(Debug)]
pub struct Pool {
    backends: Vec<Arc<Backend>>,
    next: AtomicU64,
}

impl Pool {
    fn new(backends: Vec<Arc<Backend>>) -> Self {
        Self {
            backends,
            next: AtomicU64::new(0),
        }
    }

    /// Backends in the pool.
    pub fn backends(&self) -> &[Arc<Backend>] {
        &self.backends
    }

    /// Picks a backend not in `exclude`, preferring available ones; when none is available, any
    /// not excluded (failing open beats refusing everything while every backend is ejected).
    pub fn pick(&self, balancer: Balancer, exclude: &[Arc<str>]) -> Option<Arc<Backend>> {
        let allowed = |b: &&Arc<Backend>| !exclude.iter().any(|e| e == &b.name);
        let mut pool: Vec<&Arc<Backend>> = self
            .backends
            .iter()
            .filter(allowed)
            .filter(|b| b.available())
            .collect();
        if pool.is_empty() {
            pool = self.backends.iter().filter(allowed).collect();
        }
        let n = pool.len();
        if n == 0 {
            return None;
        }
        let tick = self.next.fetch_add(1, Ordering::Relaxed);
        let chosen = match balancer {
            Balancer::RoundRobin => pool[(tick % n as u64) as usize],
            Balancer::LeastOutstanding => {
                // Ties broken by rotating the starting point, so equal backends share the load.
                let start = (tick % n as u64) as usize;
                (0..n)
                    .map(|i| pool[(start + i) % n])
                    .min_by_key(|b| b.in_flight())
                    .unwrap_or(pool[0])
            }
            Balancer::Weighted => {
                let total: u64 = pool.iter().map(|b| u64::from(b.weight)).sum();
                if total == 0 {
                    pool[(tick % n as u64) as usize]
                } else {
                    let mut pos = stable_hash(&tick.to_le_bytes()) % total;
                    let mut found = pool[n - 1];
                    for b in &pool {
                        if pos < u64::from(b.weight) {
                            found = b;
                            break;
                        }
                        pos -= u64::from(b.weight);
                    }
                    found
                }
            }
            Balancer::LatencyAware | Balancer::LeastQueue => {
                if n == 1 {
                    pool[0]
                } else {
                    // Power of two choices: two distinct random candidates, the lower score wins.
                    let h = stable_hash(&tick.to_le_bytes());
                    let i = (h % n as u64) as usize;
                    let j = (i + 1 + ((h >> 32) % (n as u64 - 1)) as usize) % n;
                    let (a, b) = (pool[i], pool[j]);
                    let engines = (balancer == Balancer::LeastQueue)
                        .then(|| a.queue_score().zip(b.queue_score()))
                        .flatten();
                    let b_better = match engines {
                        Some((sa, sb)) => sb.partial_cmp(&sa) == Some(std::cmp::Ordering::Less),
                        None => b.latency_score() < a.latency_score(),
                    };
                    if b_better {
                        b
                    } else {
                        a
                    }
                }
            }
        };
        Some(Arc::clone(chosen))
    }
}

/// An experiment on a route: its variants (each a pool) and how they are compared.
#[derive(Debug)]
pub struct Experiment {
    /// Experiment name.
    pub name: Arc<str>,
    /// The baseline variant.
    pub control: Arc<str>,
    /// Fixed horizon for verdicts, and one client's largest weight in them.
    pub horizon: crate::experiment::Horizon,
    /// Honour `x-inferscope-variant`.
    pub allow_override: bool,
    /// Name the serving variant in every response (else only in answers to forced requests).
    pub expose_variant: bool,
    /// SLOs that roll variants back to the control.
    pub guard: Option<Arc<crate::experiment::Guardrails>>,
    /// Shadow traffic policy.
    pub shadow: Option<Arc<crate::experiment::shadow::Shadow>>,
    /// Thresholds of the joined verdict.
    pub accept: Option<Box<crate::config::AcceptConfig>>,
    /// What each variant's output costs, where its backends are priced.
    pub prices: std::collections::BTreeMap<String, crate::experiment::quality::VariantPrice>,
    /// A `reject` verdict rolls the variant back to the control (`on_reject: fallback`).
    pub fallback_on_reject: bool,
    /// An `accept` verdict ramps the variant's share up (`on_accept: promote`).
    pub promotion: Option<Arc<crate::experiment::Promotion>>,
    /// Variants and their assignment.
    pub split: Split<Pool>,
}

/// Request header that forces a variant (when the experiment allows it).
pub use crate::experiment::VARIANT_HEADER as VARIANT_OVERRIDE;
/// The same, built at compile time (a `&str` key is parsed at every use).
const VARIANT_OVERRIDE_NAME: http::HeaderName = http::HeaderName::from_static(VARIANT_OVERRIDE);

/// Where a route sends traffic.
#[derive(Debug)]
pub enum Target {
    /// One pool.
    Pool(Pool),
    /// An experiment: variants with weights.
    Experiment(Experiment),
}

/// A configured route.
#[derive(Debug)]
pub struct Route {
    /// Route name.
    pub name: Arc<str>,
    model: Option<String>,
    path_prefix: Option<String>,
    /// Its target.
    pub target: Target,
    /// Backend choice within a pool.
    pub balancer: Balancer,
    /// Retry policy.
    pub retry: RetryConfig,
    /// Retry budget shared by the route's requests.
    pub budget: TpsBudget,
    /// Response timeouts.
    pub timeouts: TimeoutsConfig,
    /// Latency objectives (goodput).
    pub slo: Option<crate::meter::Slo>,
    /// Honour `x-inferscope-purpose`.
    pub purpose_header: bool,
}

impl Route {
    fn matches(&self, model: Option<&str>, path: &str) -> bool {
        self.model.as_deref().is_none_or(|m| model == Some(m))
            && self
                .path_prefix
                .as_deref()
                .is_none_or(|p| path.starts_with(p))
    }

    /// The pool of variant `variant` (`None` for a plain pool).
    pub fn pool(&self, variant: Option<usize>) -> Option<&Pool> {
        match (&self.target, variant) {
            (Target::Pool(p), _) => Some(p),
            (Target::Experiment(x), Some(i)) => x.split.arm(i),
            (Target::Experiment(_), None) => None,
        }
    }
}

/// The outcome of routing one request.
#[derive(Debug)]
pub struct Selection {
    /// The route.
    pub route: Arc<Route>,
    /// Chosen backend.
    pub backend: Arc<Backend>,
    /// Experiment variant index, when the route splits.
    pub variant_index: Option<usize>,
    /// Experiment variant name, or `-`.
    pub variant: Arc<str>,
    /// The variant was forced by the request's header, not drawn from the split.
    pub forced: bool,
}

/// A config the router cannot be built from (beyond what `config::validate` checks).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouterError {
    /// A backend without a resolved address.
    #[error("backend `{0}` has no address")]
    NoAddress(String),
    /// `api_key_env` names a variable that is not set.
    #[error("backend `{backend}`: environment variable {var} is not set")]
    KeyNotSet {
        /// Backend name.
        backend: String,
        /// Variable name.
        var: String,
    },
    /// The key cannot be sent in a header.
    #[error("backend `{backend}`: {var} is not a valid header value")]
    BadKey {
        /// Backend name.
        backend: String,
        /// Variable name.
        var: String,
    },
}

/// All routes, in match order, and every backend.
#[derive(Debug)]
pub struct Router {
    routes: Vec<Arc<Route>>,
    backends: Vec<Arc<Backend>>,
    by_name: HashMap<Arc<str>, Arc<Backend>>,
    none: Arc<str>,
}

impl Router {
    /// Builds the router from a validated config and each backend's resolved base URI (simulated
    /// backends get theirs when they start).
    pub fn new(
        config: &Config,
        bases: &HashMap<String, (Uri, Option<Arc<crate::tls::ClientTls>>)>,
    ) -> Result<Self, RouterError> {
        let mut by_name = HashMap::new();
        let mut all = Vec::new();
        for b in &config.backends {
            let (base, tls) = bases
                .get(&b.name)
                .cloned()
                .ok_or_else(|| RouterError::NoAddress(b.name.clone()))?;
            let authorization = match &b.api_key_env {
                Some(var) => {
                    let key = std::env::var(var).map_err(|_| RouterError::KeyNotSet {
                        backend: b.name.clone(),
                        var: var.clone(),
                    })?;
                    let bad = || RouterError::BadKey {
                        backend: b.name.clone(),
                        var: var.clone(),
                    };
                    let name =
                        http::HeaderName::try_from(b.api_key_header.as_str()).map_err(|_| bad())?;
                    let value = if name == http::header::AUTHORIZATION {
                        format!("Bearer {key}")
                    } else {
                        key
                    };
                    let mut v = HeaderValue::try_from(value).map_err(|_| bad())?;
                    v.set_sensitive(true);
                    Some((name, v))
                }
                None => None,
            };
            let backend = Arc::new(
                Backend::new(
                    &b.name,
                    base,
                    b.provider.as_deref().unwrap_or("openai"),
                    authorization,
                    b.weight,
                    b.max_concurrency,
                    b.max_queue,
                    b.queue_timeout,
                    b.outlier.clone(),
                )
                .with_tls(tls)
                .with_http2(b.http2)
                .with_idle_timeout(b.idle_timeout)
                .with_engine_spans(b.engine_spans)
                .with_roofline(
                    b.model
                        .zip(b.gpu.as_ref().and_then(crate::stats::roofline::Peak::of)),
                )
                .with_stale_after(b.metrics.as_ref().map_or(
                    std::time::Duration::from_secs(15),
                    crate::config::MetricsConfig::stale_after,
                )),
            );
            by_name.insert(Arc::clone(&backend.name), Arc::clone(&backend));
            all.push(backend);
        }
        let pool = |names: &[String]| {
            Pool::new(
                names
                    .iter()
                    .filter_map(|n| by_name.get(n.as_str()).cloned())
                    .collect(),
            )
        };
        // Keyless experiment assignment is random, and differs between processes.
        let salt = stable_hash(
            format!("{:?}{}", std::time::SystemTime::now(), std::process::id()).as_bytes(),
        );
        let routes = config
            .routes
            .iter()
            .map(|r| {
                let target = match &r.experiment {
                    None => Target::Pool(pool(&r.backends)),
                    Some(x) => Target::Experiment(Experiment {
                        name: x.name.as_str().into(),
                        control: x
                            .variants
                            .iter()
                            .find(|v| v.control)
                            .map_or("", |v| v.name.as_str())
                            .into(),
                        horizon: crate::experiment::Horizon {
                            min_samples: x.min_samples,
                            max_client_share: x.max_client_share,
                        },
                        allow_override: x.allow_override,
                        expose_variant: x.expose_variant,
                        accept: x.accept.clone().map(Box::new),
                        prices: x
                            .variants
                            .iter()
                            .filter_map(|v| {
                                let backends: Vec<&crate::config::BackendConfig> = v
                                    .backends
                                    .iter()
                                    .filter_map(|n| config.backends.iter().find(|b| b.name == *n))
                                    .collect();
                                let price =
                                    crate::experiment::quality::VariantPrice::of(&backends)?;
                                Some((v.name.clone(), price))
                            })
                            .collect(),
                        shadow: x.shadow.as_ref().and_then(|sh| {
                            let i = x.variants.iter().position(|v| v.name == sh.variant)?;
                            Some(Arc::new(crate::experiment::shadow::Shadow::new(
                                &sh.variant,
                                i,
                                sh.fraction,
                                sh.max_concurrency,
                                salt,
                            )))
                        }),
                        // A verdict's fallback rolls back as a guardrail does: it needs one.
                        guard: x
                            .guardrails
                            .clone()
                            .or_else(|| {
                                (x.on_reject == Some(crate::config::OnReject::Fallback))
                                    .then(crate::config::GuardrailsConfig::without_rules)
                            })
                            .map(|g| {
                                let control = x
                                    .variants
                                    .iter()
                                    .find(|v| v.control)
                                    .map_or("", |v| v.name.as_str());
                                Arc::new(crate::experiment::Guardrails::new(g, control))
                            }),
                        fallback_on_reject: x.on_reject == Some(crate::config::OnReject::Fallback),
                        promotion: (x.on_accept == Some(crate::config::OnAccept::Promote)).then(
                            || {
                                let control = x
                                    .variants
                                    .iter()
                                    .find(|v| v.control)
                                    .map_or("", |v| v.name.as_str());
                                Arc::new(crate::experiment::Promotion::new(
                                    &x.promote.clone().unwrap_or_default(),
                                    control,
                                ))
                            },
                        ),
                        split: Split::new(
                            x.sticky_key.clone(),
                            x.variants
                                .iter()
                                .map(|v| {
                                    (
                                        Arc::<str>::from(v.name.as_str()),
                                        v.weight,
                                        pool(&v.backends),
                                    )
                                })
                                .collect(),
                            salt,
                        ),
                    }),
                };
                Arc::new(Route {
                    name: r.name.as_str().into(),
                    model: r.matcher.model.clone(),
                    path_prefix: r.matcher.path_prefix.clone(),
                    target,
                    balancer: r.balancer,
                    budget: retry_budget(&r.retry),
                    retry: r.retry.clone(),
                    timeouts: r.timeouts.clone(),
                    slo: r.slo.map(Into::into),
                    purpose_header: r.purpose_header,
                })
            })
            .collect();
        Ok(Self {
            routes,
            backends: all,
            by_name,
            none: Arc::from(NONE),
        })
    }

    /// Routes a request by its body's `model`, its path and, for experiments, its sticky key
    /// (headers or the body's `user`) or a forced variant.
    pub fn select(
        &self,
        model: Option<&str>,
        user: Option<&str>,
        path: &str,
        headers: &HeaderMap,
    ) -> Option<Selection> {
        let route = self.routes.iter().find(|r| r.matches(model, path))?;
        let (pool, variant, variant_index, forced) = match &route.target {
            Target::Pool(p) => (p, Arc::clone(&self.none), None, false),
            Target::Experiment(x) => {
                let forced = x
                    .allow_override
                    .then(|| {
                        headers
                            .get(VARIANT_OVERRIDE_NAME)
                            .and_then(|v| v.to_str().ok())
                    })
                    .flatten()
                    .and_then(|name| x.split.by_name(name));
                let was_forced = forced.is_some();
                let (mut i, mut name, mut pool) = match forced {
                    Some(f) => f,
                    None => {
                        let (i, name, pool, within) = x.split.choose_within(headers, user);
                        // A promoted variant takes its growing share from the control's
                        // traffic: the first `moved` of the control's users by their position
                        // in its share, so who moved at one step stays moved at the next.
                        // (Only the control's picks look: others take no lock.)
                        let promoted = x
                            .promotion
                            .as_ref()
                            .filter(|_| name.as_ref() == x.control.as_ref())
                            .and_then(|p| p.promoted());
                        match promoted {
                            Some((v, share)) => {
                                let (mine, control) = (x.split.share(&v), x.split.share(name));
                                let moved = (f64::from(share) / 100.0 - mine) / control;
                                match x.split.by_name(&v).filter(|_| within < moved) {
                                    Some(p) => p,
                                    None => (i, name, pool),
                                }
                            }
                            _ => (i, name, pool),
                        }
                    }
                };
                // A rolled-back variant's traffic goes to the control.
                if let Some(g) = x.guard.as_ref().filter(|g| g.tripped(name)) {
                    if let Some(c) = x.split.by_name(g.control()) {
                        (i, name, pool) = c;
                    }
                }
                (pool, Arc::clone(name), Some(i), was_forced)
            }
        };
        Some(Selection {
            backend: pool.pick(route.balancer, &[])?,
            route: Arc::clone(route),
            variant_index,
            variant,
            forced,
        })
    }

    /// The route a request for `model` on `path` takes.
    pub fn route_for(&self, model: Option<&str>, path: &str) -> Option<&Arc<Route>> {
        self.routes.iter().find(|r| r.matches(model, path))
    }

    /// The experiment on route `name`, if it has one.
    pub fn experiment(&self, name: &str) -> Option<&Experiment> {
        self.routes
            .iter()
            .find(|r| *r.name == *name)
            .and_then(|r| match &r.target {
                Target::Experiment(x) => Some(x),
                Target::Pool(_) => None,
            })
    }

    /// The guardrails of the experiment on route `name`, if it has any.
    pub fn guardrails(&self, name: &str) -> Option<Arc<crate::experiment::Guardrails>> {
        self.experiment(name).and_then(|x| x.guard.clone())
    }

    /// The backend called `name`.
    pub fn backend(&self, name: &str) -> Option<&Arc<Backend>> {
        self.by_name.get(name)
    }

    /// Every route.
    pub fn routes(&self) -> &[Arc<Route>] {
        &self.routes
    }

    /// Every backend.
    pub fn backends(&self) -> &[Arc<Backend>] {
        &self.backends
    }

    /// True when every route has at least one available backend in each of its pools.
    pub fn ready(&self) -> bool {
        let ok = |p: &Pool| p.backends().iter().any(|b| b.available());
        self.routes.iter().all(|r| match &r.target {
            Target::Pool(p) => ok(p),
            Target::Experiment(x) => x.split.arms().all(ok),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::OutlierConfig;
    use std::time::Duration;

    fn backends(weights: &[u32]) -> Vec<Arc<Backend>> {
        weights
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let outlier = OutlierConfig {
                    consecutive_failures: 1,
                    ..OutlierConfig::default()
                };
                Arc::new(Backend::new(
                    &format!("b{i}"),
                    Uri::from_static("http://127.0.0.1:1"),
                    "x",
                    None,
                    *w,
                    None,
                    1,
                    Duration::from_secs(1),
                    outlier,
                ))
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn retry_budget_caps_retries_over_a_sliding_window() {
        use tower::retry::budget::Budget;
        // tower's TpsBudget: a constant reserve of `min_per_second` × the 10-s window, plus
        // `budget_ratio` of the requests deposited in the window; a retry stays counted until it
        // leaves the window (where the token bucket this replaced refilled one per second).
        let b = retry_budget(&RetryConfig {
            budget_ratio: 0.2,
            min_per_second: 1,
            ..RetryConfig::default()
        });
        let mut n = 0;
        while b.withdraw() {
            n += 1;
        }
        assert_eq!(n, 10, "the reserve: ten seconds of the floor");
        for _ in 0..10 {
            b.deposit();
        }
        assert!(
            b.withdraw() && b.withdraw(),
            "ten requests at 20% earn two retries"
        );
        assert!(!b.withdraw());
        tokio::time::advance(Duration::from_secs(3)).await;
        assert!(!b.withdraw(), "retries stay counted while in the window");
        tokio::time::advance(Duration::from_secs(9)).await;
        let mut n = 0;
        while b.withdraw() {
            n += 1;
        }
        assert_eq!(n, 10, "the window has passed: the reserve again");
    }

    fn counts(pool: &Pool, balancer: Balancer, n: usize) -> Vec<usize> {
        let mut c = vec![0; pool.backends.len()];
        for _ in 0..n {
            let b = pool
                .pick(balancer, &[])
                .unwrap_or_else(|| panic!("a backend"));
            c[pool
                .backends
                .iter()
                .position(|x| x.name == b.name)
                .unwrap_or(0)] += 1;
        }
        c
    }

    #[test]
    fn round_robin_weighted_and_exclusion() {
        let pool = Pool::new(backends(&[1, 1, 1]));
        assert_eq!(
            counts(&pool, Balancer::RoundRobin, 300),
            vec![100, 100, 100]
        );
        let pool = Pool::new(backends(&[3, 1]));
        let c = counts(&pool, Balancer::Weighted, 4000);
        assert!((2800..=3200).contains(&c[0]), "{c:?} for weights 3:1");
        let only = pool
            .pick(Balancer::RoundRobin, &[Arc::from("b0")])
            .unwrap_or_else(|| panic!("b1"));
        assert_eq!(&*only.name, "b1");
        assert!(pool
            .pick(Balancer::RoundRobin, &[Arc::from("b0"), Arc::from("b1")])
            .is_none());
    }

    #[tokio::test]
    async fn ejected_backends_are_skipped_unless_all_are() {
        let pool = Pool::new(backends(&[1, 1]));
        pool.backends[0].observe_failure(); // threshold 1: ejected
        assert_eq!(counts(&pool, Balancer::RoundRobin, 10), vec![0, 10]);
        pool.backends[1].observe_failure();
        assert_eq!(
            counts(&pool, Balancer::RoundRobin, 10),
            vec![5, 5],
            "all ejected: fail open"
        );
    }

    #[tokio::test]
    async fn least_outstanding_and_latency_aware_prefer_the_idle_and_fast() {
        let pool = Pool::new(backends(&[1, 1]));
        let _busy = pool.backends[0].admit().await;
        assert_eq!(counts(&pool, Balancer::LeastOutstanding, 10), vec![0, 10]);
        let pool = Pool::new(backends(&[1, 1]));
        pool.backends[0].observe_success(
            Some(Duration::from_millis(500)),
            Some(Duration::from_millis(50)),
        );
        pool.backends[1].observe_success(
            Some(Duration::from_millis(50)),
            Some(Duration::from_millis(10)),
        );
        assert_eq!(
            counts(&pool, Balancer::LatencyAware, 10),
            vec![0, 10],
            "two of two compared: the fast one wins"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn least_queue_follows_the_engines_and_falls_back_when_stale() {
        use engine::{EngineView, Scraped};
        let scrape = |waiting: f64, kv: f64| Scraped {
            at: tokio::time::Instant::now(),
            engine: Some(EngineView::parse(
                &format!(
                    "vllm:num_requests_running 8\nvllm:num_requests_waiting {waiting}\n\
                     vllm:kv_cache_usage_perc {kv}\n"
                ),
                None,
            )),
            gpu: None,
            in_flight: 0,
        };
        let pool = Pool::new(backends(&[1, 1]));
        // b1 measured faster by this gateway, but its engine has a queue.
        pool.backends[0].observe_success(Some(Duration::from_millis(500)), None);
        pool.backends[1].observe_success(Some(Duration::from_millis(50)), None);
        pool.backends[0].scraped(true, Some(scrape(0.0, 0.9)));
        pool.backends[1].scraped(true, Some(scrape(4.0, 0.1)));
        assert_eq!(counts(&pool, Balancer::LeastQueue, 10), vec![10, 0]);
        // No queue anywhere: the emptier KV cache.
        pool.backends[1].scraped(true, Some(scrape(0.0, 0.1)));
        assert_eq!(counts(&pool, Balancer::LeastQueue, 10), vec![0, 10]);
        // Requests sent since the scrape count as queued.
        let _held: Vec<_> = [
            pool.backends[1].admit().await,
            pool.backends[1].admit().await,
        ]
        .into_iter()
        .collect();
        assert_eq!(counts(&pool, Balancer::LeastQueue, 10), vec![10, 0]);
        // Past the staleness bound (15 s by default) the scrapes are not used: latency_aware's
        // choice (b1 measured faster, even with two in flight).
        tokio::time::advance(Duration::from_secs(16)).await;
        assert_eq!(counts(&pool, Balancer::LeastQueue, 10), vec![0, 10]);
    }
}
