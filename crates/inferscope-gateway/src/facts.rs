//! What the gateway learns about a request as it routes and sends it — the backend that
//! answered, the attempts it retried, the client key, the engine's load, the shadow pair — for its
//! own sinks (the access log, the spans, the shadow comparison). It rides in the meter's
//! `RequestMeta::extensions`, which the meter carries to the record and never reads.

use crate::meter::RequestMeta;
use std::sync::Arc;
use tokio::time::Instant;

/// The gateway's facts about one request.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// The upstream server of the last attempt, once routed.
    pub upstream: Option<Upstream>,
    /// Earlier attempts that failed and were retried elsewhere.
    pub attempts: Vec<Attempt>,
    /// This request's answer is compared with its shadow copy's (or, for a copy, its
    /// primary's): the pair's id, shared by both records.
    pub shadow_pair: Option<u64>,
    /// Name of the client's API key (never the key), when the gateway authenticates clients.
    pub key: Option<Arc<str>>,
    /// The backend engine's load as its latest fresh scrape had it when the request was sent.
    pub engine: Option<EngineLoad>,
    /// The benchmark run the client tagged it with (`x-inferscope-run`), where the route takes
    /// the purpose header.
    pub run: Option<Arc<str>>,
}

static NONE: Facts = Facts {
    upstream: None,
    attempts: Vec::new(),
    shadow_pair: None,
    key: None,
    engine: None,
    run: None,
};

impl Facts {
    /// The facts of `meta` (none: a request the gateway attached nothing to).
    pub fn of(meta: &RequestMeta) -> &Facts {
        meta.extensions.get::<Facts>().unwrap_or(&NONE)
    }

    /// The facts of `meta`, to set.
    pub fn of_mut(meta: &mut RequestMeta) -> &mut Facts {
        meta.extensions.get_or_insert_default::<Facts>()
    }
}

/// An upstream attempt that failed before any response byte reached the client, and was retried.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// Backend tried.
    pub backend: Arc<str>,
    /// Span id the attempt was sent with (its CLIENT span).
    pub span_id: u64,
    /// When it was sent.
    pub t_sent: Instant,
    /// When it was given up.
    pub t_end: Instant,
    /// Status it answered with, if it answered.
    pub status: Option<u16>,
    /// Bounded error kind.
    pub error: &'static str,
}

/// The upstream server that answered, as telemetry reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// Provider label (`vllm`, `openai`…), for `gen_ai.provider.name`.
    pub provider: Arc<str>,
    /// Host of its base URL.
    pub address: Option<Arc<str>>,
    /// Port of its base URL.
    pub port: Option<u16>,
}

/// A backend engine's load when a request was sent to it, from the latest scrape of its metrics
/// (`metrics:`) no older than its staleness bound.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineLoad {
    /// Requests the engine was running (its batch).
    pub running: Option<f32>,
    /// Requests waiting in its queue.
    pub waiting: Option<f32>,
    /// Its KV-cache use, 0–1.
    pub kv_cache_usage: Option<f32>,
    /// Age of the scrape, milliseconds.
    pub age_ms: u32,
}

/// Who sent a request, as the gateway bounds one client's weight (in a verdict's samples, in
/// the benchmark runs it keeps): the client key's name where keys are configured (a name the
/// client proved), else the peer address — never a header the client chooses. 0 when neither
/// is known.
pub fn client_id(key: Option<&str>, addr: Option<std::net::IpAddr>) -> u64 {
    // Hashed without allocating (once per request on an experiment's route); a key and an
    // address never hash alike.
    match (key, addr) {
        (Some(k), _) => crate::util::stable_hash(k.as_bytes()).rotate_left(1) | 1,
        (None, Some(a)) => {
            let v6 = match a {
                std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                std::net::IpAddr::V6(v6) => v6,
            };
            (crate::util::stable_hash(&v6.octets()) ^ 0x5bd1_e995_5bd1_e995) | 1
        }
        (None, None) => 0,
    }
}
