//! Who may use the data plane, and how much: client API keys and rate limits (checked by the
//! proxy; counted here for `/stats` and `/metrics`).
//!
//! **Keys.** A client presents its key as `Authorization: Bearer KEY` (OpenAI SDKs) or
//! `x-api-key: KEY` (Anthropic SDKs). Only SHA-256 digests are kept; a presented key is hashed and
//! looked up, so the comparison never runs over the secret itself. The key's *name* goes into the
//! request's record (stats, log, spans); the key never does. A missing or unknown key gets an
//! OpenAI-shaped 401. Unless the operator forwards them, the credential headers are removed before
//! the request goes upstream.
//!
//! **Rate limits.** Token buckets per key and per route: requests per minute (one token per
//! request, bursts up to the limit) and tokens per minute (charged from each response's measured
//! usage once it ends — a `RecordSink` — so a bucket may go below zero and then refuses until it
//! refills). A request is admitted when every bucket that applies has a request token and a
//! non-negative token balance; otherwise 429 with `Retry-After` (the time until it would be
//! admitted) and OpenAI-style `x-ratelimit-*` headers, which admitted responses carry as well.
//! Key buckets are checked before the body is read (a limited client costs no body read), route
//! buckets once the route is known. Buckets outlive config reloads; a changed limit applies to the
//! next request.

use crate::config::{ApiKeyConfig, AuthConfig, RateLimit, RateLimitsConfig};
use crate::meter::{RecordSink, RequestRecord};
use crate::util::prometheus::{Labels, Writer};
use http::{HeaderMap, HeaderName, HeaderValue};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Anthropic's key header, built at compile time (a `&str` key is parsed at every use).
const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// Why a key could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// `key_env` names a variable that is not set (or empty).
    #[error("auth key `{name}`: environment variable {var} is not set")]
    EnvNotSet {
        /// Key name.
        name: String,
        /// The environment variable `key_env` names.
        var: String,
    },
    /// `key_file` cannot be read or is empty.
    #[error("auth key `{name}`: {path}: {reason}")]
    File {
        /// Key name.
        name: String,
        /// The path `key_file` names.
        path: String,
        /// Why it could not be used (the I/O error, or "empty").
        reason: String,
    },
    /// `sha256` is not 64 hex digits.
    #[error("auth key `{0}`: sha256 must be 64 hex digits")]
    BadDigest(String),
    /// Two names for one key.
    #[error("auth keys `{0}` and `{1}` are the same key")]
    Duplicate(String, String),
}

fn digest(secret: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, secret);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

fn parse_hex(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The accepted keys, by digest.
#[derive(Debug, Default)]
pub struct Keys {
    by_digest: HashMap<[u8; 32], Arc<str>>,
    /// Send the client's credential headers upstream.
    pub forward_client_key: bool,
    /// Failed key checks one address may make per minute (0: no limit).
    pub max_failures_per_minute: u32,
}

impl Keys {
    /// Loads every key (`key_env` through `env`, `key_file` from disk: blocking reads).
    pub fn load(c: &AuthConfig, env: impl Fn(&str) -> Option<String>) -> Result<Self, KeyError> {
        let mut by_digest: HashMap<[u8; 32], Arc<str>> = HashMap::new();
        for k in &c.keys {
            let d = Self::digest_of(k, &env)?;
            if let Some(other) = by_digest.insert(d, k.name.as_str().into()) {
                return Err(KeyError::Duplicate(other.to_string(), k.name.clone()));
            }
        }
        Ok(Self {
            by_digest,
            forward_client_key: c.forward_client_key,
            max_failures_per_minute: c.max_failures_per_minute,
        })
    }

    fn digest_of(
        k: &ApiKeyConfig,
        env: &impl Fn(&str) -> Option<String>,
    ) -> Result<[u8; 32], KeyError> {
        if let Some(h) = &k.sha256 {
            return parse_hex(&h.to_ascii_lowercase())
                .ok_or_else(|| KeyError::BadDigest(k.name.clone()));
        }
        if let Some(var) = &k.key_env {
            let v =
                env(var)
                    .filter(|v| !v.trim().is_empty())
                    .ok_or_else(|| KeyError::EnvNotSet {
                        name: k.name.clone(),
                        var: var.clone(),
                    })?;
            return Ok(digest(v.trim().as_bytes()));
        }
        if let Some(p) = &k.key_file {
            let file = |reason: String| KeyError::File {
                name: k.name.clone(),
                path: p.display().to_string(),
                reason,
            };
            let text = crate::util::fs::read_to_string(p, crate::util::fs::SECRET_CAP)
                .map_err(|e| file(e.to_string()))?;
            if text.trim().is_empty() {
                return Err(file("is empty".into()));
            }
            return Ok(digest(text.trim().as_bytes()));
        }
        Err(KeyError::BadDigest(k.name.clone()))
    }

    /// The name of the key `headers` present, if it is one of ours (as `Authorization: Bearer`,
    /// the scheme in any case, or `x-api-key`).
    pub fn identify(&self, headers: &HeaderMap) -> Option<Arc<str>> {
        let bearer = headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| bearer_credentials(v.as_bytes()))
            .map(str::trim);
        let x_api_key = headers
            .get(X_API_KEY)
            .and_then(|v| v.to_str().ok())
            .map(str::trim);
        [bearer, x_api_key]
            .into_iter()
            .flatten()
            .filter(|k| !k.is_empty())
            .find_map(|k| self.by_digest.get(&digest(k.as_bytes())).cloned())
    }

    /// Removes the credential headers (before the request goes upstream).
    pub fn strip(headers: &mut HeaderMap) {
        headers.remove(http::header::AUTHORIZATION);
        headers.remove(X_API_KEY);
    }
}

/// A token bucket.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    level: f64,
    at: Instant,
}

impl Bucket {
    fn full(capacity: f64, now: Instant) -> Self {
        Self {
            level: capacity,
            at: now,
        }
    }

    /// Refills at `capacity` per minute up to `capacity`.
    fn refill(&mut self, capacity: f64, now: Instant) {
        let per_sec = capacity / 60.0;
        self.level =
            (self.level + now.duration_since(self.at).as_secs_f64() * per_sec).min(capacity);
        self.at = now;
    }

    /// Time until the level reaches `need`.
    fn wait_for(&self, capacity: f64, need: f64) -> Duration {
        if self.level >= need {
            return Duration::ZERO;
        }
        Duration::from_secs_f64((need - self.level) / (capacity / 60.0))
    }
}

#[derive(Debug, Default)]
struct Buckets {
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
}

/// What a limit looked like when a request was judged: for the `x-ratelimit-*` headers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateState {
    /// Requests per minute, remaining now, time to full.
    pub requests: Option<(u64, u64, Duration)>,
    /// Tokens per minute, remaining now, time to full.
    pub tokens: Option<(u64, u64, Duration)>,
}

impl RateState {
    /// Adds the OpenAI-style headers.
    pub fn write(&self, h: &mut HeaderMap) {
        let mut put = |name: &'static str, v: String| {
            if let Ok(v) = HeaderValue::try_from(v) {
                h.insert(HeaderName::from_static(name), v);
            }
        };
        if let Some((limit, left, reset)) = self.requests {
            put("x-ratelimit-limit-requests", limit.to_string());
            put("x-ratelimit-remaining-requests", left.to_string());
            put("x-ratelimit-reset-requests", reset_text(reset));
        }
        if let Some((limit, left, reset)) = self.tokens {
            put("x-ratelimit-limit-tokens", limit.to_string());
            put("x-ratelimit-remaining-tokens", left.to_string());
            put("x-ratelimit-reset-tokens", reset_text(reset));
        }
    }
}

/// `1.5s`, `20ms`, `2m3s` (OpenAI's reset format).
fn reset_text(d: Duration) -> String {
    let ms = d.as_millis() as u64;
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let s = d.as_secs_f64();
    if s < 60.0 {
        return format!("{}s", (s * 1000.0).round() / 1000.0);
    }
    let m = (s / 60.0).floor();
    format!("{}m{}s", m as u64, (s - m * 60.0).round() as u64)
}

/// A refusal: how long until the request would be admitted, and the limit's state.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limited {
    /// Until the buckets would admit it.
    pub retry_after: Duration,
    /// For the headers.
    pub state: RateState,
    /// `key` or `route`.
    pub scope: &'static str,
}

/// Which table a bucket is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Scope {
    Key,
    Route,
}

/// Per-key counters, for `/stats` and `/metrics`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct KeyCounts {
    /// Requests that presented the key (refused ones included).
    pub requests: u64,
    /// Of them, refused by a rate limit.
    pub rate_limited: u64,
    /// Of them, not `ok`.
    pub errors: u64,
    /// Prompt tokens charged.
    pub input_tokens: u64,
    /// Output tokens charged.
    pub output_tokens: u64,
}

/// The rate limiter and per-key accounting; lives as long as the gateway (buckets survive
/// reloads).
#[derive(Debug, Default)]
pub struct Limiter {
    config: arc_swap::ArcSwap<RateLimitsConfig>,
    buckets: Mutex<HashMap<(Scope, Arc<str>), Buckets>>,
    counts: Mutex<BTreeMap<Arc<str>, KeyCounts>>,
    /// Requests refused for a missing or unknown key.
    pub unauthorized: std::sync::atomic::AtomicU64,
    /// Failed key checks by client address, for `auth.max_failures_per_minute`.
    failures: FailedChecks,
}

/// Most addresses whose failed key checks are remembered at once (a flood of addresses cannot
/// grow the table; past it, the oldest windows are forgotten first).
const MAX_FAILING_ADDRESSES: usize = 16_384;

/// Failed credential checks per client address in one-minute windows, and a log line about them
/// at most every 10 s (with the count since the last), so a guesser neither gets unlimited tries
/// nor floods the gateway's own log. The data plane's keys and the admin token each keep one.
#[derive(Debug)]
pub struct FailedChecks {
    by_addr: Mutex<HashMap<std::net::IpAddr, (std::time::Instant, u32)>>,
    log: Mutex<crate::util::errors::Sparse>,
    /// Requests refused without a check because their address had used up its tries.
    pub throttled: std::sync::atomic::AtomicU64,
}

impl Default for FailedChecks {
    fn default() -> Self {
        Self {
            by_addr: Mutex::default(),
            log: Mutex::new(crate::util::errors::Sparse::every(
                std::time::Duration::from_secs(10),
            )),
            throttled: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

impl FailedChecks {
    /// True when `addr` has used up its failed checks (`max` a minute; 0: no limit): its
    /// request is refused without a check (and counted).
    pub fn throttled(&self, addr: std::net::IpAddr, max: u32) -> bool {
        if max == 0 {
            return false;
        }
        let now = std::time::Instant::now();
        let out = self
            .by_addr
            .lock()
            .get(&addr)
            .is_some_and(|(start, n)| now.duration_since(*start) < FAILURE_WINDOW && *n >= max);
        if out {
            self.throttled
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        out
    }

    /// Counts a failed check from `addr`, and says so in the gateway's log (sparsely) as
    /// `what`.
    pub fn failed(&self, addr: Option<std::net::IpAddr>, what: &'static str) {
        if let Some(addr) = addr {
            let now = std::time::Instant::now();
            let mut map = self.by_addr.lock();
            if map.len() >= MAX_FAILING_ADDRESSES && !map.contains_key(&addr) {
                map.retain(|_, (start, _)| now.duration_since(*start) < FAILURE_WINDOW);
            }
            if map.len() < MAX_FAILING_ADDRESSES || map.contains_key(&addr) {
                let e = map.entry(addr).or_insert((now, 0));
                if now.duration_since(e.0) >= FAILURE_WINDOW {
                    *e = (now, 0);
                }
                e.1 = e.1.saturating_add(1);
            }
        }
        if let Some(failures) = self.log.lock().hit() {
            tracing::warn!(failures, last_client = ?addr, "{what}");
        }
    }
}

/// The window failed key checks are counted in.
const FAILURE_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);

impl Limiter {
    /// A limiter for `config` (absent: no limits).
    pub fn new(config: Option<&RateLimitsConfig>) -> Self {
        let s = Self::default();
        s.configure(config);
        s
    }

    /// Applies a reloaded config; buckets keep their levels.
    pub fn configure(&self, config: Option<&RateLimitsConfig>) {
        self.config
            .store(Arc::new(config.cloned().unwrap_or_default()));
    }

    fn limit_for(&self, scope: Scope, name: &str) -> Option<RateLimit> {
        let c = self.config.load();
        match scope {
            Scope::Key => c.keys.get(name).copied().or(c.per_key),
            Scope::Route => c.routes.get(name).copied(),
        }
    }

    /// Admits one request of `key` (checked before the body is read).
    pub fn admit_key(&self, key: &Arc<str>) -> Result<Option<RateState>, Limited> {
        self.counts
            .lock()
            .entry(Arc::clone(key))
            .or_default()
            .requests += 1;
        let r = self.admit(Scope::Key, key);
        if r.is_err() {
            if let Some(c) = self.counts.lock().get_mut(key) {
                c.rate_limited += 1;
            }
        }
        r
    }

    /// True when `addr` has used up its failed key checks (`max` a minute; 0: no limit): its
    /// request is refused without a key check.
    pub fn auth_throttled(&self, addr: std::net::IpAddr, max: u32) -> bool {
        self.failures.throttled(addr, max)
    }

    /// Requests refused `auth_throttled`.
    pub fn auth_throttled_total(&self) -> u64 {
        self.failures
            .throttled
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Counts a failed key check from `addr` (and says so in the gateway's log, sparsely).
    pub fn auth_failed(&self, addr: Option<std::net::IpAddr>) {
        self.unauthorized
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.failures
            .failed(addr, "requests with a missing or unknown key");
    }

    /// Admits one request on `route`.
    pub fn admit_route(&self, route: &Arc<str>) -> Result<Option<RateState>, Limited> {
        self.admit(Scope::Route, route)
    }

    fn admit(&self, scope: Scope, name: &Arc<str>) -> Result<Option<RateState>, Limited> {
        let Some(limit) = self.limit_for(scope, name) else {
            return Ok(None);
        };
        let now = Instant::now();
        let mut all = self.buckets.lock();
        let b = all.entry((scope, Arc::clone(name))).or_default();
        let mut wait = Duration::ZERO;
        let rpm = limit.requests_per_minute.map(|n| n as f64);
        let tpm = limit.tokens_per_minute.map(|n| n as f64);
        if let Some(cap) = rpm {
            let r = b.requests.get_or_insert_with(|| Bucket::full(cap, now));
            r.refill(cap, now);
            wait = wait.max(r.wait_for(cap, 1.0));
        }
        if let Some(cap) = tpm {
            let t = b.tokens.get_or_insert_with(|| Bucket::full(cap, now));
            t.refill(cap, now);
            // A request needs a non-negative balance: what it costs is known only at its end.
            wait = wait.max(t.wait_for(cap, 0.0));
        }
        let admitted = wait.is_zero();
        if admitted {
            if let Some(r) = b.requests.as_mut() {
                r.level -= 1.0;
            }
        }
        let state = RateState {
            requests: rpm
                .zip(b.requests)
                .map(|(cap, r)| (cap as u64, r.level.max(0.0) as u64, r.wait_for(cap, cap))),
            tokens: tpm
                .zip(b.tokens)
                .map(|(cap, t)| (cap as u64, t.level.max(0.0) as u64, t.wait_for(cap, cap))),
        };
        if admitted {
            Ok(Some(state))
        } else {
            Err(Limited {
                retry_after: wait,
                state,
                scope: match scope {
                    Scope::Key => "key",
                    Scope::Route => "route",
                },
            })
        }
    }

    /// Charges `tokens` to the key's and the route's token buckets.
    fn charge(&self, key: Option<&Arc<str>>, route: &Arc<str>, tokens: u64) {
        if tokens == 0 {
            return;
        }
        let now = Instant::now();
        let targets = key
            .map(|k| (Scope::Key, k))
            .into_iter()
            .chain(std::iter::once((Scope::Route, route)));
        let mut all = self.buckets.lock();
        for (scope, name) in targets {
            let Some(cap) = self
                .limit_for(scope, name)
                .and_then(|l| l.tokens_per_minute)
                .map(|n| n as f64)
            else {
                continue;
            };
            let b = all.entry((scope, Arc::clone(name))).or_default();
            let t = b.tokens.get_or_insert_with(|| Bucket::full(cap, now));
            t.refill(cap, now);
            t.level -= tokens as f64;
        }
    }

    /// Per-key counters, by name.
    pub fn key_counts(&self) -> Vec<(Arc<str>, KeyCounts)> {
        self.counts
            .lock()
            .iter()
            .map(|(k, v)| (Arc::clone(k), *v))
            .collect()
    }

    /// Writes the per-key series (requests, refusals, errors, tokens) and the unauthorized
    /// requests, for `/metrics`.
    pub fn write_prometheus(&self, w: &mut Writer) {
        type Get = fn(&KeyCounts) -> u64;
        let all = self.key_counts();
        let series: [(&str, &str, Get); 5] = [
            (
                "inferscope_key_requests_total",
                "Requests per client key name (refused ones included).",
                |c| c.requests,
            ),
            (
                "inferscope_key_rate_limited_total",
                "Requests per client key name refused by a rate limit.",
                |c| c.rate_limited,
            ),
            (
                "inferscope_key_errors_total",
                "Requests per client key name whose outcome was not ok.",
                |c| c.errors,
            ),
            (
                "inferscope_key_input_tokens_total",
                "Prompt tokens per client key name.",
                |c| c.input_tokens,
            ),
            (
                "inferscope_key_output_tokens_total",
                "Output tokens per client key name.",
                |c| c.output_tokens,
            ),
        ];
        let labels: Vec<Labels> = all
            .iter()
            .map(|(k, _)| Labels::new(&[("key", k)]))
            .collect();
        for (name, help, get) in series {
            w.series(
                name,
                "counter",
                help,
                labels.iter().zip(all.iter().map(|(_, c)| get(c))),
            );
        }
        w.family(
            "inferscope_unauthorized_total",
            "counter",
            "Data-plane requests refused for a missing or unknown API key.",
        );
        w.sample(
            "inferscope_unauthorized_total",
            &Labels::new(&[]),
            self.unauthorized.load(std::sync::atomic::Ordering::Relaxed),
        );
    }
}

impl RecordSink for Limiter {
    fn record(&self, rec: &Arc<RequestRecord>) {
        if rec.meta.purpose == crate::meter::Purpose::Shadow {
            return;
        }
        let input = rec.input_tokens.unwrap_or(0);
        let output = rec.output_tokens.unwrap_or(0);
        if let Some(k) = &crate::facts::Facts::of(&rec.meta).key {
            let mut counts = self.counts.lock();
            let c = counts.entry(Arc::clone(k)).or_default();
            if rec.outcome != crate::meter::Outcome::Ok {
                c.errors += 1;
            }
            c.input_tokens += input;
            c.output_tokens += output;
        }
        self.charge(
            crate::facts::Facts::of(&rec.meta).key.as_ref(),
            &rec.meta.route,
            input + output,
        );
    }
}

/// The credentials of an `Authorization` value whose scheme is `Bearer` in any letter case (RFC
/// 7235 §2.1: the scheme is case-insensitive), after the spaces that follow it; `None` for another
/// scheme or a value that is not text.
pub fn bearer_credentials(value: &[u8]) -> Option<&str> {
    let value = std::str::from_utf8(value).ok()?;
    let (scheme, rest) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| rest.trim_start_matches(' '))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_bearer_scheme_is_matched_in_any_case() {
        for v in ["Bearer k", "bearer k", "BEARER  k", "bEaReR k"] {
            assert_eq!(bearer_credentials(v.as_bytes()), Some("k"), "{v}");
        }
        for v in ["Basic k", "Bearerk", "Bearer", "Token k"] {
            assert_eq!(bearer_credentials(v.as_bytes()), None, "{v}");
        }
    }

    fn limits(rpm: Option<u64>, tpm: Option<u64>) -> RateLimitsConfig {
        RateLimitsConfig {
            per_key: Some(RateLimit {
                requests_per_minute: rpm,
                tokens_per_minute: tpm,
            }),
            ..RateLimitsConfig::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn requests_per_minute_allow_a_burst_then_refill() {
        let l = Limiter::new(Some(&limits(Some(60), None)));
        let k: Arc<str> = "a".into();
        for i in 0..60 {
            let s = l.admit_key(&k).unwrap().unwrap();
            assert_eq!(s.requests.unwrap().1, 59 - i);
        }
        let refused = l.admit_key(&k).unwrap_err();
        assert!(refused.retry_after > Duration::from_millis(900));
        assert!(refused.retry_after <= Duration::from_secs(1));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(l.admit_key(&k).is_ok(), "one request's worth refilled");
        assert!(l.admit_key(&k).is_err());
        assert_eq!(l.key_counts()[0].1.rate_limited, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn tokens_are_charged_after_the_fact_and_the_debt_is_waited_out() {
        let l = Limiter::new(Some(&limits(None, Some(600))));
        let k: Arc<str> = "a".into();
        let route: Arc<str> = "main".into();
        assert!(l.admit_key(&k).is_ok());
        l.charge(Some(&k), &route, 900);
        let refused = l.admit_key(&k).unwrap_err();
        // 300 tokens in debt at 10 per second.
        assert_eq!(refused.retry_after.as_secs(), 30);
        tokio::time::advance(Duration::from_secs(30)).await;
        assert!(l.admit_key(&k).is_ok());
    }

    #[test]
    fn keys_are_found_by_either_header_and_only_digests_are_kept() {
        let c = AuthConfig {
            keys: vec![ApiKeyConfig {
                name: "team-a".into(),
                sha256: None,
                key_env: Some("K".into()),
                key_file: None,
            }],
            forward_client_key: false,
            max_failures_per_minute: 30,
        };
        let keys = Keys::load(&c, |_| Some("sk-secret".into())).unwrap();
        assert!(!format!("{keys:?}").contains("sk-secret"));
        let mut h = HeaderMap::new();
        h.insert(
            "authorization",
            HeaderValue::from_static("Bearer sk-secret"),
        );
        assert_eq!(keys.identify(&h).as_deref(), Some("team-a"));
        let mut h = HeaderMap::new();
        h.insert("x-api-key", HeaderValue::from_static("sk-secret"));
        assert_eq!(keys.identify(&h).as_deref(), Some("team-a"));
        h.insert("x-api-key", HeaderValue::from_static("sk-secreT"));
        assert_eq!(keys.identify(&h), None);
        let hashed = AuthConfig {
            keys: vec![ApiKeyConfig {
                name: "b".into(),
                sha256: Some(
                    "BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD".into(),
                ),
                key_env: None,
                key_file: None,
            }],
            forward_client_key: false,
            max_failures_per_minute: 30,
        };
        // SHA-256 of `abc`, given in upper case.
        let keys = Keys::load(&hashed, |_| None).unwrap();
        let mut h = HeaderMap::new();
        h.insert("authorization", HeaderValue::from_static("Bearer abc"));
        assert_eq!(keys.identify(&h).as_deref(), Some("b"));
        h.insert("authorization", HeaderValue::from_static("Bearer "));
        assert_eq!(keys.identify(&h), None, "an empty key is no key");
    }

    #[test]
    fn reset_texts_read_like_openai_s() {
        assert_eq!(reset_text(Duration::from_millis(20)), "20ms");
        assert_eq!(reset_text(Duration::from_millis(1500)), "1.5s");
        assert_eq!(reset_text(Duration::from_secs(123)), "2m3s");
    }
}
