//! A simulated inference backend speaking every dialect the gateway measures (`wire`): OpenAI
//! `/v1/chat/completions` and `/v1/completions`, the Responses API `/v1/responses`, Anthropic
//! `/v1/messages`, TGI `/generate_stream` and `/generate`, Ollama `/api/chat` and `/api/generate`,
//! llama.cpp `/completion` — streaming and not — plus `/v1/models` and `/health`, with a timing
//! model (see `profile`) deterministic under a seed. It keeps ground truth for verification: per
//! request, the exact bytes it sent and the instant each chunk left, readable in-process through
//! `SimHandle`. Faults (refuse, error status, die or stall after K chunks, malformed events, a
//! slow first token) are injected per `Faults`.

// What is `pub` inside is the crate's API: anything else is `pub(crate)`.
#![warn(unreachable_pub)]

mod faults;
mod handler;
pub mod logprob;
mod profile;
pub mod quiz;
mod spans;
mod wire;

pub use crate::util::Rng;
pub use faults::Faults;
pub use profile::{InvalidProfile, Profile};
pub use spans::SpanExport;

// The layers below under the names the modules use.
use inferscope_server::{server, tls, util};
use inferscope_wire::dialect;

use crate::server::ServerOptions;
use parking_lot::Mutex;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;

/// Simulator settings.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// Timing model.
    pub profile: Profile,
    /// Seed for every random choice; request `i` (in arrival order) uses `seed + i`.
    pub seed: u64,
    /// Model id listed by `/v1/models`.
    pub model: String,
    /// Keep per-request ground truth (bytes and send instants) in memory.
    pub record_truth: bool,
    /// Precede every streamed event with an SSE comment `: t_us=N`, N being microseconds from the
    /// request's arrival to the write — ground truth for an out-of-process observer. SSE clients
    /// ignore comments; off by default.
    pub truth_comments: bool,
    /// Serve the API under this root instead of `/v1` (a hosted API's shape: `/api/v1`).
    pub api_root: Option<String>,
    /// Require this key, as `Authorization: Bearer KEY` or `x-api-key: KEY`; 401 otherwise.
    pub api_key: Option<String>,
    /// Serve over TLS.
    pub tls: Option<Arc<crate::tls::ServerTls>>,
    /// Last `Authorization` / `x-api-key` header values seen (for tests that check what reached
    /// the backend).
    pub keep_credentials: bool,
    /// Answer HTTP/2 only (prior knowledge over plain TCP, as gRPC-style servers speak): an
    /// HTTP/1.1 request gets no answer, its connection closes.
    pub http2_only: bool,
    /// Streams one HTTP/2 connection may have open (`SETTINGS_MAX_CONCURRENT_STREAMS`).
    pub h2_max_streams: u32,
    /// Export an engine span per request over OTLP, as vLLM's `--otlp-traces-endpoint` does.
    pub spans: Option<SpanExport>,
}

impl SimOptions {
    /// Options for a built-in profile, seed 0, model `demo`, no ground truth.
    pub fn new(profile: Profile) -> Self {
        Self {
            profile,
            seed: 0,
            model: "demo".into(),
            record_truth: false,
            truth_comments: false,
            api_root: None,
            api_key: None,
            tls: None,
            keep_credentials: false,
            http2_only: false,
            h2_max_streams: 256,
            spans: None,
        }
    }
}

/// What a chunk the simulator sent was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkKind {
    /// Role-only first delta (no output).
    Role,
    /// Output tokens.
    Content {
        /// Tokens in this chunk.
        tokens: u32,
    },
    /// Empty delta with `finish_reason`.
    Finish,
    /// Usage-only chunk (`choices: []`), sent when `stream_options.include_usage` was set.
    Usage,
    /// `data: [DONE]`.
    Done,
    /// A whole non-streaming body.
    Body,
}

/// One write of the simulator: when it left, what it was, where its bytes are in `Truth::bytes`.
#[derive(Debug, Clone)]
pub struct Sent {
    /// Instant the chunk was handed to the connection.
    pub at: Instant,
    /// What it was.
    pub kind: ChunkKind,
    /// Its range in `Truth::bytes`.
    pub range: std::ops::Range<usize>,
}

/// Ground truth of one request, as the simulator saw it.
#[derive(Debug, Clone)]
pub struct Truth {
    /// Request index in arrival order.
    pub index: u64,
    /// Request path.
    pub path: String,
    /// The request body as received.
    pub request: Vec<u8>,
    /// The `traceparent` header the request carried.
    pub traceparent: Option<String>,
    /// Instant the request head was handled.
    pub arrival: Instant,
    /// The HTTP version it came over.
    pub version: http::Version,
    /// The address of the connection it came on (one per connection).
    pub peer: Option<std::net::SocketAddr>,
    /// Every write, in order.
    pub sent: Vec<Sent>,
    /// Every byte of the response body, in order.
    pub bytes: Vec<u8>,
    /// Prompt tokens the simulator counted.
    pub prompt_tokens: u64,
    /// Output tokens generated.
    pub output_tokens: u64,
    /// The id the response carried.
    pub response_id: Option<String>,
    /// Instant it left the queue for the batch (at arrival without `max_batch` or a queue hold).
    pub admitted: Option<Instant>,
    /// Instant its first output token was produced.
    pub first_token: Option<Instant>,
    /// Instant its last output token was produced.
    pub last_token: Option<Instant>,
    /// The client went away before the response was complete.
    pub cancelled: bool,
    /// The response was sent completely.
    pub completed: bool,
}

impl Truth {
    fn new(
        index: u64,
        path: String,
        request: Vec<u8>,
        traceparent: Option<String>,
        arrival: Instant,
    ) -> Self {
        Self {
            index,
            path,
            request,
            traceparent,
            arrival,
            version: http::Version::HTTP_11,
            peer: None,
            sent: Vec::new(),
            bytes: Vec::new(),
            prompt_tokens: 0,
            output_tokens: 0,
            response_id: None,
            admitted: None,
            first_token: None,
            last_token: None,
            cancelled: false,
            completed: false,
        }
    }

    /// Instant the first content chunk left, relative to arrival (the true TTFT).
    pub fn ttft(&self) -> Option<Duration> {
        self.sent
            .iter()
            .find(|s| matches!(s.kind, ChunkKind::Content { .. }))
            .map(|s| s.at - self.arrival)
    }

    /// Where its time went in the engine (the engine span's numbers), once it produced a token.
    pub fn engine(&self) -> Option<EngineTruth> {
        let (admitted, first) = (self.admitted?, self.first_token?);
        Some(EngineTruth {
            queue: admitted - self.arrival,
            prefill: first - admitted,
            decode: self.last_token.unwrap_or(first) - first,
        })
    }

    /// Send instants of the content chunks.
    pub fn content_times(&self) -> Vec<Instant> {
        self.sent
            .iter()
            .filter(|s| matches!(s.kind, ChunkKind::Content { .. }))
            .map(|s| s.at)
            .collect()
    }
}

/// A request's time in the simulated engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineTruth {
    /// Arrival → admitted to the batch.
    pub queue: Duration,
    /// Admitted → first token.
    pub prefill: Duration,
    /// First → last token.
    pub decode: Duration,
}

/// The simulated engine's counters, exposed at `/metrics` with vLLM's metric names.
#[derive(Debug, Default)]
struct EngineCounters {
    /// Tokens held by the streams in flight (prompt and output so far).
    kv_tokens: AtomicU64,
    prompt_tokens: AtomicU64,
    generation_tokens: AtomicU64,
    /// Sum of prefill times (scheduling to first token), µs, and how many.
    prefill_us: AtomicU64,
    prefills: AtomicU64,
    /// Time requests waited for a slot in the batch, and how many were scheduled.
    queue_us: AtomicU64,
    scheduled: AtomicU64,
}

#[derive(Debug)]
struct SimState {
    opts: SimOptions,
    faults: parking_lot::RwLock<Faults>,
    next_index: AtomicU64,
    active: AtomicUsize,
    /// What `/metrics` reports, under vLLM's names.
    engine: EngineCounters,
    /// The batch's slots (`max_batch`); requests waiting for one.
    batch: Option<Arc<tokio::sync::Semaphore>>,
    waiting: AtomicUsize,
    truth: Mutex<Vec<Truth>>,
    /// Bumped whenever a request finishes (completed or cancelled), for waiters.
    finished: watch::Sender<u64>,
    /// Credential headers seen, when `keep_credentials`.
    credentials: Mutex<Vec<(String, String)>>,
    /// `/tokenize`'s vocabulary: each token (a word with the whitespace before it) gets the next
    /// id the first time it is seen; prompts given as ids are read back through it.
    vocab: Mutex<logprob::Vocab>,
    /// Finished requests' spans, to the exporter (`spans`).
    spans: Option<tokio::sync::mpsc::UnboundedSender<opentelemetry_proto::tonic::trace::v1::Span>>,
    span_ids: Mutex<crate::util::Rng>,
}

/// In-process access to a running simulator's ground truth.
#[derive(Debug, Clone)]
pub struct SimHandle {
    state: Arc<SimState>,
    /// Address it listens on.
    pub addr: SocketAddr,
}

impl SimHandle {
    /// Ground truth of every request so far, in arrival order of completion.
    pub fn truth(&self) -> Vec<Truth> {
        let mut v = self.state.truth.lock().clone();
        v.sort_by_key(|t| t.index);
        v
    }

    /// Replaces the injected faults; requests arriving from now on see the new ones.
    pub fn set_faults(&self, f: Faults) {
        *self.state.faults.write() = f;
    }

    /// Credential headers (`authorization`, `x-api-key`) of every request so far, with
    /// `keep_credentials`.
    pub fn credentials(&self) -> Vec<(String, String)> {
        self.state.credentials.lock().clone()
    }

    /// Streams currently being generated.
    pub fn active(&self) -> usize {
        self.state.active.load(Ordering::Relaxed)
    }

    /// Waits until at least `n` requests have finished (completed or cancelled), up to `limit`.
    /// Returns whether they did.
    pub async fn wait_finished(&self, n: u64, limit: Duration) -> bool {
        let mut rx = self.state.finished.subscribe();
        tokio::time::timeout(limit, rx.wait_for(|v| *v >= n))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

/// Serves the simulator on `listener` until `shutdown` resolves.
pub fn spawn(
    listener: TcpListener,
    opts: SimOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<SimHandle> {
    let addr = listener.local_addr()?;
    let (finished, _) = watch::channel(0);
    let batch = opts
        .profile
        .max_batch
        .map(|n| Arc::new(tokio::sync::Semaphore::new(n.max(1) as usize)));
    let spans = opts.spans.clone().map(|to| {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(spans::export(to, rx));
        tx
    });
    let span_ids = Mutex::new(crate::util::Rng::new(opts.seed ^ 0x5BA2));
    let state = Arc::new(SimState {
        spans,
        span_ids,
        faults: parking_lot::RwLock::new(opts.profile.faults.clone()),
        opts,
        next_index: AtomicU64::new(0),
        active: AtomicUsize::new(0),
        engine: EngineCounters::default(),
        batch,
        waiting: AtomicUsize::new(0),
        truth: Mutex::new(Vec::new()),
        finished,
        credentials: Mutex::new(Vec::new()),
        vocab: Mutex::new(logprob::Vocab::default()),
    });
    let svc_state = Arc::clone(&state);
    let service = hyper::service::service_fn(move |req| {
        let state = Arc::clone(&svc_state);
        // An error makes hyper drop the connection without a response: the `refuse` fault.
        async move { handler::handle(state, req).await.ok_or(handler::Refused) }
    });
    let opts = ServerOptions {
        header_read_timeout: None,
        idle_timeout: None,
        grace: Duration::from_secs(5),
        tls: state.opts.tls.clone(),
        // Its truth is its own clock's; stamped reads would only add cost to benchmarks.
        kernel_clock: false,
        h2_max_streams: state.opts.h2_max_streams,
        ..ServerOptions::default()
    };
    tokio::spawn(server::run(listener, service, opts, shutdown));
    Ok(SimHandle { state, addr })
}
