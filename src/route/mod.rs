//! Routing: the first route whose match holds takes the request; its target is a plain backend
//! pool (round-robin) or an experiment split between variants (each a pool).
//!
//! The split is deterministic: with a sticky key the variant is a stable hash of the key (the same
//! on every replica and across restarts, no shared state); without one, requests are spread by a
//! strided counter that gives each variant exactly its weight in every cycle of `total` requests,
//! interleaved. Health-aware and latency-aware balancing, shadow traffic and guardrails are later
//! work; `Pool::pick` is the seam for them.

mod split;

pub use split::{fnv1a, Split};

use crate::config::{Config, RouteConfig};
use http::{HeaderMap, HeaderValue, Uri};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Label used where a dimension does not apply (no variant, no model…).
pub const NONE: &str = "-";

/// One upstream inference server.
#[derive(Debug)]
pub struct Backend {
    /// Configured name.
    pub name: Arc<str>,
    /// Base URI (scheme and authority).
    pub base: Uri,
    /// Provider label.
    pub provider: Arc<str>,
    /// `Authorization` value sent upstream, from `api_key_env`.
    pub authorization: Option<HeaderValue>,
}

/// A set of interchangeable backends.
#[derive(Debug)]
pub struct Pool {
    backends: Vec<Arc<Backend>>,
    next: AtomicUsize,
}

impl Pool {
    fn new(backends: Vec<Arc<Backend>>) -> Self {
        Self {
            backends,
            next: AtomicUsize::new(0),
        }
    }

    /// The next backend, round-robin.
    pub fn pick(&self) -> Option<Arc<Backend>> {
        let n = self.backends.len();
        (n > 0).then(|| Arc::clone(&self.backends[self.next.fetch_add(1, Ordering::Relaxed) % n]))
    }

    /// Backends in the pool.
    pub fn backends(&self) -> &[Arc<Backend>] {
        &self.backends
    }
}

/// Where a route sends traffic.
#[derive(Debug)]
pub enum Target {
    /// One pool.
    Pool(Pool),
    /// An experiment: variants with weights.
    Experiment(Split<Pool>),
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
}

impl Route {
    fn matches(&self, model: Option<&str>, path: &str) -> bool {
        self.model.as_deref().is_none_or(|m| model == Some(m))
            && self
                .path_prefix
                .as_deref()
                .is_none_or(|p| path.starts_with(p))
    }
}

/// The outcome of routing one request.
#[derive(Debug)]
pub struct Selection {
    /// Route name.
    pub route: Arc<str>,
    /// Chosen backend.
    pub backend: Arc<Backend>,
    /// Experiment variant, or `-`.
    pub variant: Arc<str>,
}

/// All routes, in match order.
#[derive(Debug)]
pub struct Router {
    routes: Vec<Route>,
}

impl Router {
    /// Builds the router from a validated config and each backend's resolved base URI (simulated
    /// backends get theirs when they start).
    pub fn new(config: &Config, bases: &HashMap<String, Uri>) -> Result<Self, String> {
        let mut backends = HashMap::new();
        for b in &config.backends {
            let base = bases
                .get(&b.name)
                .cloned()
                .ok_or_else(|| format!("backend `{}` has no address", b.name))?;
            let authorization = match &b.api_key_env {
                Some(var) => {
                    let key = std::env::var(var).map_err(|_| {
                        format!(
                            "backend `{}`: environment variable {var} is not set",
                            b.name
                        )
                    })?;
                    let mut v = HeaderValue::try_from(format!("Bearer {key}")).map_err(|_| {
                        format!("backend `{}`: {var} is not a valid header value", b.name)
                    })?;
                    v.set_sensitive(true);
                    Some(v)
                }
                None => None,
            };
            let backend = Backend {
                name: b.name.as_str().into(),
                base,
                provider: b.provider.as_deref().unwrap_or("openai").into(),
                authorization,
            };
            backends.insert(b.name.clone(), Arc::new(backend));
        }
        let pool = |names: &[String]| {
            Pool::new(
                names
                    .iter()
                    .filter_map(|n| backends.get(n).cloned())
                    .collect(),
            )
        };
        let routes = config
            .routes
            .iter()
            .map(|r: &RouteConfig| {
                let target = match &r.experiment {
                    None => Target::Pool(pool(&r.backends)),
                    Some(x) => Target::Experiment(Split::new(
                        x.sticky_key
                            .as_deref()
                            .and_then(|k| k.strip_prefix("header:"))
                            .and_then(|h| http::HeaderName::try_from(h).ok()),
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
                    )),
                };
                Route {
                    name: r.name.as_str().into(),
                    model: r.matcher.model.clone(),
                    path_prefix: r.matcher.path_prefix.clone(),
                    target,
                }
            })
            .collect();
        Ok(Self { routes })
    }

    /// Routes a request by its body's `model`, its path and (for sticky splits) its headers.
    pub fn select(
        &self,
        model: Option<&str>,
        path: &str,
        headers: &HeaderMap,
    ) -> Option<Selection> {
        let route = self.routes.iter().find(|r| r.matches(model, path))?;
        let (pool, variant) = match &route.target {
            Target::Pool(p) => (p, Arc::from(NONE)),
            Target::Experiment(s) => {
                let (name, pool) = s.choose(headers);
                (pool, Arc::clone(name))
            }
        };
        Some(Selection {
            route: Arc::clone(&route.name),
            backend: pool.pick()?,
            variant,
        })
    }

    /// True when every route has at least one backend to send to.
    pub fn ready(&self) -> bool {
        self.routes.iter().all(|r| match &r.target {
            Target::Pool(p) => !p.backends().is_empty(),
            Target::Experiment(s) => s.arms().all(|p| !p.backends().is_empty()),
        })
    }
}
