//! Request handling for the simulator: parses an OpenAI request, then generates the response on
//! the profile's schedule, recording ground truth as it writes.

use super::wire::{Echo, EngineTime, Gen};
use super::{ChunkKind, Faults, Rng, Sent, SimState, Truth};
use crate::dialect::Endpoint;
use bytes::Bytes;
use http::{header, Method, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Either, Full, Limited};
use hyper::body::Incoming;
use serde_json::{json, Value};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;
use tokio::time::{sleep_until, Instant};

/// Response body of the simulator: a whole body, or chunks produced by a generator task.
pub(super) type SimBody = Either<Full<Bytes>, ChannelBody>;

/// The simulator's vocabulary: one token a word, each with its leading space.
const WORDS: [&str; 16] = [
    " the",
    " model",
    " answers",
    " quickly",
    " and",
    " tokens",
    " stream",
    " out",
    " one",
    " by",
    " while",
    " latency",
    " is",
    " measured",
    " at",
    " every",
];

/// The `refuse` fault: returned as the service's error, so hyper drops the connection unanswered.
#[derive(Debug, thiserror::Error)]
#[error("connection refused by fault injection")]
pub(super) struct Refused;

/// Body fed by an mpsc channel; dropping it tells the generator the client went away. An `Err`
/// item aborts the connection mid-body (the `die_after_chunks` fault).
#[derive(Debug)]
pub(super) struct ChannelBody(mpsc::Receiver<Result<Bytes, std::io::Error>>);

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.0.poll_recv(cx).map(|c| c.map(|b| b.map(Frame::data)))
    }
}

fn full(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<SimBody> {
    let mut r = Response::new(Either::Left(Full::new(body.into())));
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}

fn error(status: StatusCode, msg: &str) -> Response<SimBody> {
    let body = json!({"error": {"message": msg, "type": "invalid_request_error"}}).to_string();
    full(status, "application/json", body)
}

/// What one generation request asked for.
struct Plan {
    gen: Gen,
    stream: bool,
    /// The answer, when the prompt is a quiz question (` A`) or a word problem (` … #### 42`),
    /// with the space a tokenizer puts before it.
    answer: Option<String>,
}

/// Answers one request; `None` means drop the connection unanswered (`refuse`).
pub(super) async fn handle(
    state: Arc<SimState>,
    req: http::Request<Incoming>,
) -> Option<Response<SimBody>> {
    let faults = state.faults.read().clone();
    // Refused: the connection closes without an answer.
    if faults.refuse || (state.opts.http2_only && req.version() != http::Version::HTTP_2) {
        return None;
    }
    Some(respond(state, req, faults).await)
}

async fn respond(
    state: Arc<SimState>,
    req: http::Request<Incoming>,
    faults: Faults,
) -> Response<SimBody> {
    let arrival = Instant::now();
    if state.opts.keep_credentials {
        let mut seen = state.credentials.lock();
        for name in ["authorization", "x-api-key"] {
            for v in req.headers().get_all(name) {
                seen.push((
                    name.to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                ));
            }
        }
    }
    if let Some(key) = &state.opts.api_key {
        let bearer = req
            .headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let x_api_key = req.headers().get("x-api-key").and_then(|v| v.to_str().ok());
        if bearer != Some(key.as_str()) && x_api_key != Some(key.as_str()) {
            return error(StatusCode::UNAUTHORIZED, "invalid api key");
        }
    }
    let mut path = req.uri().path().to_owned();
    if let Some(root) = &state.opts.api_root {
        let root = root.trim_end_matches('/');
        match path.strip_prefix(root) {
            // `/health` lives under the root too (as a hosted API's status path would).
            Some("/health") => path = "/health".into(),
            Some(rest) if rest.is_empty() || rest.starts_with('/') => path = format!("/v1{rest}"),
            _ => return error(StatusCode::NOT_FOUND, "not under the API root"),
        }
    }
    let traceparent = req
        .headers()
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let (version, peer) = (
        req.version(),
        req.extensions()
            .get::<crate::server::ClientAddr>()
            .map(|a| a.0),
    );
    let truth = |index, path, body: &Bytes| {
        let mut t = Truth::new(index, path, body.to_vec(), traceparent.clone(), arrival);
        t.version = version;
        t.peer = peer;
        t
    };
    match (req.method(), path.as_str()) {
        // As vLLM answers it: 200 with an empty body (`content-length: 0`).
        (&Method::GET, "/health") => Response::new(Either::Left(Full::new(Bytes::new()))),
        (&Method::GET, "/metrics") => {
            full(StatusCode::OK, "text/plain; version=0.0.4", metrics(&state))
        }
        (&Method::GET, "/v1/models") => {
            let body = json!({"object": "list", "data": [{
                "id": state.opts.model, "object": "model", "owned_by": state.opts.profile.name,
            }]});
            full(StatusCode::OK, "application/json", body.to_string())
        }
        (&Method::POST, "/tokenize") => {
            let body = Limited::new(req.into_body(), 16 << 20).collect().await;
            match body
                .ok()
                .and_then(|b| serde_json::from_slice::<Value>(&b.to_bytes()).ok())
            {
                Some(v) => tokenize(&state, &v),
                None => error(StatusCode::BAD_REQUEST, "the request body is not JSON"),
            }
        }
        (&Method::POST, p) if Endpoint::from_path(p).is_some() => {
            let Some(ep) = Endpoint::from_path(p) else {
                return error(StatusCode::NOT_FOUND, "no such endpoint on the simulator");
            };
            let body = match Limited::new(req.into_body(), 16 << 20).collect().await {
                Ok(b) => b.to_bytes(),
                Err(_) => return error(StatusCode::BAD_REQUEST, "could not read the request body"),
            };
            let Ok(v) = serde_json::from_slice::<Value>(&body) else {
                return error(StatusCode::BAD_REQUEST, "the request body is not JSON");
            };
            if unknown_ids(&state, &v) {
                let msg = "the prompt has token ids this server never gave out";
                return error(StatusCode::BAD_REQUEST, msg);
            }
            let plan = plan(&state, &v, ep);
            if faults.error_rate > 0.0 {
                let mut rng = Rng::new(state.opts.seed ^ plan.gen.index.rotate_left(29) ^ 0xFA17);
                if rng.unit() < faults.error_rate {
                    let status = StatusCode::from_u16(faults.error_status.unwrap_or(503))
                        .unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
                    let mut truth = truth(plan.gen.index, path, &body);
                    truth.completed = true;
                    finish(&state, truth);
                    return error(status, "injected fault");
                }
            }
            let mut truth = truth(plan.gen.index, path, &body);
            truth.response_id = Some(plan.gen.id());
            truth.prompt_tokens = plan.gen.prompt_tokens;
            truth.output_tokens = plan.gen.output_tokens;
            if plan.stream {
                let (tx, rx) = mpsc::channel(4);
                let ctype = plan.gen.stream_type();
                tokio::spawn(generate(state, plan, truth, tx, faults));
                let mut r = Response::new(Either::Right(ChannelBody(rx)));
                let h = r.headers_mut();
                h.insert(header::CONTENT_TYPE, http::HeaderValue::from_static(ctype));
                h.insert(
                    header::CACHE_CONTROL,
                    http::HeaderValue::from_static("no-cache"),
                );
                r
            } else {
                whole(state, plan, truth, faults).await
            }
        }
        _ => error(StatusCode::NOT_FOUND, "no such endpoint on the simulator"),
    }
}

/// Words in a prompt value: a string, token ids, or an array of parts or messages with text.
fn word_count(x: &Value) -> usize {
    match x {
        Value::String(s) => s.split_whitespace().count(),
        Value::Array(ids) if !ids.is_empty() && ids.iter().all(Value::is_u64) => ids.len(),
        Value::Array(parts) => parts
            .iter()
            .map(|p| match p.get("content") {
                // A message (Responses API input items): its role costs what a chat message's does.
                Some(c) => 4 + word_count(c),
                None => p
                    .get("text")
                    .or(Some(p))
                    .and_then(Value::as_str)
                    .map_or(0, |s| s.split_whitespace().count()),
            })
            .sum(),
        _ => 0,
    }
}

/// The prompt's size in tokens (by the simulator's rule: words, plus 4 per message) and the
/// text of its last message or prompt.
fn prompt_of(v: &Value, ep: Endpoint) -> (u64, Option<&str>) {
    fn last_message(m: &[Value]) -> Option<&str> {
        let c = m.last()?.get("content")?;
        c.as_str().or_else(|| {
            c.as_array()?
                .iter()
                .rev()
                .find_map(|p| p.get("text").and_then(Value::as_str))
        })
    }
    let messages = |key: &str| v.get(key).and_then(Value::as_array);
    match ep {
        Endpoint::ChatCompletions | Endpoint::Messages | Endpoint::OllamaChat => {
            let m = messages("messages").map_or(&[][..], Vec::as_slice);
            let system = v.get("system").map_or(0, word_count);
            let n: usize = m
                .iter()
                .map(|m| 4 + m.get("content").map_or(0, word_count))
                .sum();
            ((n + system) as u64, last_message(m))
        }
        Endpoint::Responses => {
            let input = v.get("input");
            let last = match input {
                Some(Value::String(s)) => Some(s.as_str()),
                Some(Value::Array(m)) => last_message(m),
                _ => None,
            };
            (input.map_or(0, word_count) as u64, last)
        }
        Endpoint::GenerateStream | Endpoint::Generate => {
            let i = v.get("inputs");
            (i.map_or(0, word_count) as u64, i.and_then(Value::as_str))
        }
        Endpoint::Completions | Endpoint::OllamaGenerate | Endpoint::LlamaCompletion => {
            let p = v.get("prompt");
            (p.map_or(0, word_count) as u64, p.and_then(Value::as_str))
        }
    }
}

/// The prompt to echo with log-probabilities: a completions request with `echo: true` and
/// `logprobs` set, and one text prompt.
fn echo_of(state: &SimState, v: &Value, ep: Endpoint) -> Option<String> {
    if ep != Endpoint::Completions
        || v.get("echo").and_then(Value::as_bool) != Some(true)
        || v.get("logprobs").is_none_or(Value::is_null)
    {
        return None;
    }
    match v.get("prompt")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(a) if a.len() == 1 && a[0].is_string() => a[0].as_str().map(str::to_owned),
        // Token ids, as `/tokenize` gave them.
        Value::Array(a) => {
            let ids: Option<Vec<u64>> = a.iter().map(Value::as_u64).collect();
            state.vocab.lock().decode(&ids?)
        }
        _ => None,
    }
}

/// For a quiz prompt ending in a choice's letter (`…Answer: B`, scored by log-likelihood): the
/// letter the model favours — the right one, or at the profile's error rate a wrong one. The
/// coin is the question's, not the request's, so every choice of one question is scored by the
/// same belief.
fn favoured_letter(prompt: &str, error_rate: f64, seed: u64) -> Option<char> {
    let (question, letter) = prompt.trim_end().rsplit_once(char::is_whitespace)?;
    if !(letter.len() == 1 && letter.chars().all(|c| matches!(c, 'A'..='D'))) {
        return None;
    }
    let right = super::quiz::solve(question)?;
    let mut r = Rng::new(seed ^ crate::util::hash::stable_hash(question.as_bytes()));
    Some(if r.unit() < error_rate {
        super::quiz::wrong(right, &mut r)
    } else {
        right
    })
}

/// The text of a prompt of token ids (as `/tokenize` gave them out), to answer as text.
fn decoded_prompt(state: &SimState, v: &Value) -> Option<String> {
    let Some(Value::Array(a)) = v.get("prompt") else {
        return None;
    };
    let ids: Option<Vec<u64>> = a.iter().map(Value::as_u64).collect();
    state.vocab.lock().decode(&ids?)
}

/// A prompt of token ids that `/tokenize` never gave out (vLLM would refuse ids past its vocabulary).
fn unknown_ids(state: &SimState, v: &Value) -> bool {
    let Some(Value::Array(a)) = v.get("prompt") else {
        return false;
    };
    let ids: Option<Vec<u64>> = a.iter().map(Value::as_u64).collect();
    ids.is_some_and(|ids| !ids.is_empty() && state.vocab.lock().decode(&ids).is_none())
}

/// `/tokenize` as vLLM answers it: the prompt's token ids (the simulator's word tokens).
fn tokenize(state: &SimState, v: &Value) -> Response<SimBody> {
    let Some(prompt) = v.get("prompt").and_then(Value::as_str) else {
        return error(StatusCode::BAD_REQUEST, "prompt (a string) is required");
    };
    let ids = state.vocab.lock().encode(prompt);
    let body = json!({"count": ids.len(), "max_model_len": 1 << 20, "tokens": ids});
    full(StatusCode::OK, "application/json", body.to_string())
}

fn plan(state: &SimState, v: &Value, ep: Endpoint) -> Plan {
    let index = state.next_index.fetch_add(1, Ordering::Relaxed);
    let mut rng = Rng::new(state.opts.seed.wrapping_add(index));
    let p = &state.opts.profile;
    let max_tokens = v
        .as_object()
        .and_then(|o| crate::dialect::request_param(o, &crate::dialect::MAX_TOKENS_PARAMS))
        .and_then(Value::as_u64);
    let output_tokens = max_tokens
        .unwrap_or_else(|| u64::from(rng.range(p.min_output_tokens, p.max_output_tokens)))
        .max(1);
    let (prompt_tokens, last_text) = prompt_of(v, ep);
    let decoded = decoded_prompt(state, v);
    let last_text = last_text.or(decoded.as_deref());
    // A quiz question gets a one-letter answer, a word problem its sum: right, or wrong at the
    // profile's error rate.
    let mut r = Rng::new(state.opts.seed ^ index.rotate_left(23) ^ 0x0A05);
    let wrong = r.unit() < p.answer_error_rate;
    let answer = last_text.and_then(|t| {
        if let Some((right, off_by_one)) = super::quiz::solve_code(t) {
            return Some(if wrong { off_by_one } else { right });
        }
        if let Some(right) = super::quiz::solve(t) {
            let letter = if wrong {
                super::quiz::wrong(right, &mut r)
            } else {
                right
            };
            return Some(format!(" {letter}"));
        }
        let sum = super::quiz::solve_sum(t)? + u64::from(wrong);
        Some(format!(" The numbers add up to {sum}.\n#### {sum}"))
    });
    // vLLM's `ignore_eos` and `min_tokens`: the model does not stop at its answer's end, so an
    // answer shorter than asked becomes text of the length asked (`ignore_eos`: max_tokens;
    // `min_tokens` alone: at least that many).
    let ignore_eos = v
        .get("ignore_eos")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let min_tokens = v.get("min_tokens").and_then(Value::as_u64).unwrap_or(0);
    let answer = answer.filter(|a| {
        let n = a.split_whitespace().count() as u64;
        !(ignore_eos && n < output_tokens) && n >= min_tokens
    });
    let output_tokens = match &answer {
        Some(a) => a.split_whitespace().count() as u64,
        None if ignore_eos => output_tokens,
        None => output_tokens.max(min_tokens),
    };
    let stream = if ep.stream_in_body() {
        v.get("stream")
            .and_then(Value::as_bool)
            .unwrap_or(ep.streams_by_default())
    } else {
        ep.streams_by_default()
    };
    Plan {
        gen: Gen {
            index,
            ep,
            model: v
                .get("model")
                .and_then(Value::as_str)
                .unwrap_or(&state.opts.model)
                .to_owned(),
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            prompt_tokens: prompt_tokens.max(1),
            output_tokens,
            hit_max: max_tokens.is_some() && answer.is_none(),
            include_usage: v
                .pointer("/stream_options/include_usage")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            details: v
                .pointer("/parameters/details")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            role_chunk: p.role_chunk,
            echo: echo_of(state, v, ep).map(|prompt| Echo {
                favours: favoured_letter(&prompt, p.answer_error_rate, state.opts.seed),
                prompt,
                nll_shift: p.nll_shift,
                seed: state.opts.seed ^ index.rotate_left(7),
            }),
        },
        stream,
        answer,
    }
}

/// `k` words, one token each, each with its leading space.
fn words(rng: &mut Rng, k: u64) -> Vec<&'static str> {
    (0..k)
        .map(|_| WORDS[(rng.next_u64() % WORDS.len() as u64) as usize])
        .collect()
}

/// Counts the stream as active, and the KV-cache tokens it holds, while alive.
struct Active<'a> {
    s: &'a SimState,
    kv: u64,
}

impl<'a> Active<'a> {
    fn new(s: &'a SimState) -> Self {
        s.active.fetch_add(1, Ordering::Relaxed);
        Self { s, kv: 0 }
    }

    /// The stream now holds `n` more tokens in the KV cache.
    fn hold(&mut self, n: u64) {
        self.s.engine.kv_tokens.fetch_add(n, Ordering::Relaxed);
        self.kv += n;
    }
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.s.active.fetch_sub(1, Ordering::Relaxed);
        self.s
            .engine
            .kv_tokens
            .fetch_sub(self.kv, Ordering::Relaxed);
    }
}

/// A prefill done: counted as vLLM counts `request_prefill_time_seconds`.
fn prefilled(state: &SimState, took: std::time::Duration) {
    let e = &state.engine;
    e.prefill_us.fetch_add(
        u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
    e.prefills.fetch_add(1, Ordering::Relaxed);
}

/// A request scheduled into the batch: its wait counted as vLLM counts
/// `request_queue_time_seconds`.
fn scheduled(state: &SimState, truth: &Truth) {
    let waited = truth.admitted.map_or(std::time::Duration::ZERO, |a| {
        a.saturating_duration_since(truth.arrival)
    });
    let e = &state.engine;
    e.queue_us.fetch_add(
        u64::try_from(waited.as_micros()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
    e.scheduled.fetch_add(1, Ordering::Relaxed);
}

/// `/metrics` under vLLM's names, from the simulator's own state.
fn metrics(state: &SimState) -> String {
    let e = &state.engine;
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let labels = format!(
        "{{engine=\"0\",model_name={}}}",
        Value::from(state.opts.model.as_str())
    );
    let kv = load(&e.kv_tokens) as f64 / state.opts.profile.kv_capacity_tokens.max(1) as f64;
    let mut out = String::new();
    let mut put = |name: &str, kind: &str, suffix: &str, v: f64| {
        out.push_str(&format!(
            "# TYPE {name} {kind}\n{name}{suffix}{labels} {v:?}\n"
        ));
    };
    put(
        "vllm:num_requests_running",
        "gauge",
        "",
        state.active.load(Ordering::Relaxed) as f64,
    );
    put(
        "vllm:num_requests_waiting",
        "gauge",
        "",
        state.waiting.load(Ordering::Relaxed) as f64,
    );
    put("vllm:kv_cache_usage_perc", "gauge", "", kv.min(1.0));
    let prompt = load(&e.prompt_tokens) as f64;
    put("vllm:prefix_cache_queries", "counter", "_total", prompt);
    put("vllm:prefix_cache_hits", "counter", "_total", 0.0);
    put("vllm:prompt_tokens", "counter", "_total", prompt);
    put(
        "vllm:generation_tokens",
        "counter",
        "_total",
        load(&e.generation_tokens) as f64,
    );
    // Histograms of seconds, by their sum and count (a single `+Inf` bucket).
    for (name, micros, count) in [
        (
            "vllm:request_prefill_time_seconds",
            &e.prefill_us,
            &e.prefills,
        ),
        ("vllm:request_queue_time_seconds", &e.queue_us, &e.scheduled),
    ] {
        let (sum, n) = (load(micros) as f64 / 1e6, load(count) as f64);
        out.push_str(&format!(
            "# TYPE {name} histogram\n\
             {name}_bucket{{engine=\"0\",le=\"+Inf\"}} {n:?}\n\
             {name}_sum{labels} {sum:?}\n\
             {name}_count{labels} {n:?}\n"
        ));
    }
    out
}

fn finish(state: &SimState, truth: Truth) {
    if let Some(tx) = state.spans.as_ref().filter(|_| truth.completed) {
        let id = state.span_ids.lock().next_u64() | 1;
        if let Some(span) = super::spans::span_of(&truth, id) {
            let _ = tx.send(span);
        }
    }
    if state.opts.record_truth {
        state.truth.lock().push(truth);
    }
    state.finished.send_modify(|n| *n += 1);
}

async fn generate(
    state: Arc<SimState>,
    plan: Plan,
    mut truth: Truth,
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
    faults: Faults,
) {
    let done = 'run: {
        // A full batch: wait for a slot (the client may leave meanwhile).
        let _slot = match admit(&state, &tx, faults.queue_hold(plan.gen.index)).await {
            Some(s) => s,
            None => break 'run false,
        };
        truth.admitted = Some(admitted_at(&state, &truth, &faults));
        scheduled(&state, &truth);
        let mut active = Active::new(&state);
        active.hold(plan.gen.prompt_tokens);
        stream(&state, &plan, &mut truth, &tx, &faults, &mut active).await
    };
    truth.completed = done;
    truth.cancelled = !done;
    finish(&state, truth);
}

/// A slot in the batch (`max_batch`), waited for in the queue; `None` when the client left first.
/// `Some(None)`: no batch limit.
async fn admit(
    state: &SimState,
    tx: &mpsc::Sender<Result<Bytes, std::io::Error>>,
    hold: std::time::Duration,
) -> Option<Option<tokio::sync::OwnedSemaphorePermit>> {
    if state.batch.is_none() && hold.is_zero() {
        return Some(None);
    }
    let _queued = Queued::new(state);
    if !hold.is_zero() {
        tokio::select! {
            () = tokio::time::sleep(hold) => {}
            () = tx.closed() => return None,
        }
    }
    let Some(batch) = &state.batch else {
        return Some(None);
    };
    let slot = tokio::select! {
        p = Arc::clone(batch).acquire_owned() => p.ok(),
        () = tx.closed() => None,
    };
    slot.map(Some)
}

/// When a request just admitted left the queue: now, or its arrival when it never queued (no
/// batch limit, no hold).
fn admitted_at(state: &SimState, truth: &Truth, faults: &Faults) -> Instant {
    if state.batch.is_some() || !faults.queue_hold(truth.index).is_zero() {
        Instant::now()
    } else {
        truth.arrival
    }
}

/// Counts a request as waiting for a batch slot while alive (dropped with its future too).
struct Queued<'a>(&'a SimState);

impl<'a> Queued<'a> {
    fn new(s: &'a SimState) -> Self {
        s.waiting.fetch_add(1, Ordering::Relaxed);
        Self(s)
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Writes the whole stream; false when the client went away first.
async fn stream(
    state: &SimState,
    plan: &Plan,
    truth: &mut Truth,
    tx: &mpsc::Sender<Result<Bytes, std::io::Error>>,
    faults: &Faults,
    active: &mut Active<'_>,
) -> bool {
    let gen = &plan.gen;
    let mut chunks = 0u32;
    let mut fault_rng = Rng::new(state.opts.seed ^ gen.index.rotate_left(41) ^ 0xBAD);
    let p = &state.opts.profile;
    let mut rng = Rng::new(state.opts.seed.wrapping_add(gen.index).rotate_left(17));
    let record = state.opts.record_truth;
    // NDJSON has no comments.
    let comments = state.opts.truth_comments && !gen.ndjson();
    let send = |kind: ChunkKind, mut bytes: Vec<u8>, truth: &mut Truth, chunks: &mut u32| {
        *chunks += 1;
        let at = Instant::now();
        if comments {
            let mut c = format!(": t_us={}\n", (at - truth.arrival).as_micros()).into_bytes();
            c.append(&mut bytes);
            bytes = c;
        }
        if record {
            let start = truth.bytes.len();
            truth.bytes.extend_from_slice(&bytes);
            truth.sent.push(Sent {
                at,
                kind,
                range: start..truth.bytes.len(),
            });
        }
        tx.send(Ok(Bytes::from(bytes)))
    };
    // Applied before each chunk: die (abort the connection) or stall (go quiet until the client
    // leaves) once the configured number of chunks has been sent.
    let fault_due = |chunks: u32| -> Option<bool> {
        if faults.die_after_chunks.is_some_and(|k| chunks >= k) {
            return Some(true);
        }
        faults
            .stall_after_chunks
            .is_some_and(|k| chunks >= k)
            .then_some(false)
    };
    macro_rules! check_fault {
        () => {
            match fault_due(chunks) {
                Some(true) => {
                    // A backend that dies after writing: what it wrote reaches the wire first
                    // (its server flushes while the body waits), then the connection breaks.
                    // Sent at once, the error could reach the server before its flush and the
                    // last chunk would never leave.
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    let _ = tx
                        .send(Err(std::io::Error::other("injected: backend died")))
                        .await;
                    return false;
                }
                Some(false) => {
                    tx.closed().await;
                    return false;
                }
                None => {}
            }
        };
    }
    if let Some(pre) = gen.preamble() {
        if send(ChunkKind::Role, pre, truth, &mut chunks)
            .await
            .is_err()
        {
            return false;
        }
    }
    let slow = std::time::Duration::from_secs_f64(faults.slow_first_token_ms / 1000.0);
    // Prefill starts when the request is admitted to the batch (at once without a limit).
    let started = truth.admitted.unwrap_or(truth.arrival);
    let mut deadline = started + rng.jitter(p.ttft(gen.prompt_tokens), p.jitter) + slow;
    let mut produced = 0;
    let mut text = String::new();
    // The Responses API numbers its events (the preamble took 0..4); TGI numbers its tokens.
    let responses = gen.ep == Endpoint::Responses;
    let mut seq: u64 = if responses { 4 } else { 1 };
    let (mut first, mut last) = (None, None);
    while produced < gen.output_tokens {
        tokio::select! {
            () = sleep_until(deadline) => {}
            () = tx.closed() => return false,
        }
        check_fault!();
        // An answer goes in one chunk.
        let k = match plan.answer {
            Some(_) => gen.output_tokens - produced,
            None => u64::from(p.tokens_per_chunk).min(gen.output_tokens - produced),
        };
        let ws = match &plan.answer {
            Some(a) => vec![a.as_str()],
            None => words(&mut rng, k),
        };
        for w in &ws {
            text.push_str(w);
        }
        let kind = ChunkKind::Content { tokens: k as u32 };
        let end = produced + k >= gen.output_tokens;
        let mut event = gen.content(&ws, seq, end, &text);
        seq += if responses { 1 } else { k };
        if faults.malformed_rate > 0.0 && fault_rng.unit() < faults.malformed_rate {
            // Cut the JSON short: the event is still a well-formed SSE event (NDJSON line).
            let term: &[u8] = if gen.ndjson() { b"\n" } else { b"\n\n" };
            event.truncate(event.len() - term.len() - 4);
            event.extend_from_slice(term);
        }
        let now = Instant::now();
        if first.is_none() {
            // From leaving the queue, as vLLM's prefill time runs from the request's scheduling.
            prefilled(state, now - started);
        }
        first.get_or_insert(now);
        last = Some(now);
        truth.first_token = first;
        truth.last_token = last;
        active.hold(k);
        state
            .engine
            .generation_tokens
            .fetch_add(k, Ordering::Relaxed);
        if send(kind, event, truth, &mut chunks).await.is_err() {
            return false;
        }
        produced += k;
        let step = rng.jitter(
            p.decode_step(state.active.load(Ordering::Relaxed)),
            p.jitter,
        );
        deadline += step * k as u32;
    }
    let eng = match (first, last) {
        (Some(f), Some(l)) => EngineTime {
            prefill: f - started,
            decode: l - f,
        },
        _ => EngineTime::default(),
    };
    for (kind, bytes) in gen.tail(seq, &text, eng) {
        check_fault!();
        if send(kind, bytes, truth, &mut chunks).await.is_err() {
            return false;
        }
    }
    true
}

async fn whole(
    state: Arc<SimState>,
    plan: Plan,
    mut truth: Truth,
    faults: Faults,
) -> Response<SimBody> {
    let gen = &plan.gen;
    let p = &state.opts.profile;
    let mut rng = Rng::new(state.opts.seed.wrapping_add(gen.index).rotate_left(17));
    let body = {
        let hold = faults.queue_hold(gen.index);
        let _slot = {
            let _queued = (state.batch.is_some() || !hold.is_zero()).then(|| Queued::new(&state));
            tokio::time::sleep(hold).await;
            match &state.batch {
                Some(b) => Arc::clone(b).acquire_owned().await.ok(),
                None => None,
            }
        };
        let started = admitted_at(&state, &truth, &faults);
        truth.admitted = Some(started);
        scheduled(&state, &truth);
        let mut active = Active::new(&state);
        active.hold(gen.prompt_tokens + gen.output_tokens);
        let slow = std::time::Duration::from_secs_f64(faults.slow_first_token_ms / 1000.0);
        let prefill = rng.jitter(p.ttft(gen.prompt_tokens), p.jitter) + slow;
        prefilled(&state, prefill);
        state
            .engine
            .generation_tokens
            .fetch_add(gen.output_tokens, Ordering::Relaxed);
        let mut deadline = started + prefill;
        for _ in 1..gen.output_tokens {
            deadline += rng.jitter(
                p.decode_step(state.active.load(Ordering::Relaxed)),
                p.jitter,
            );
        }
        sleep_until(deadline).await;
        let text = match &plan.answer {
            // A token's leading space goes (` A` → `A`); code keeps its indentation.
            Some(a) if !a.starts_with("  ") => a.trim_start().to_owned(),
            Some(a) => a.clone(),
            None => words(&mut rng, gen.output_tokens).concat(),
        };
        let eng = EngineTime {
            prefill,
            decode: (deadline - started).saturating_sub(prefill),
        };
        truth.first_token = Some(started + prefill);
        truth.last_token = Some(deadline);
        gen.whole(&text, eng).to_string()
    };
    let at = Instant::now();
    if state.opts.record_truth {
        truth.bytes = body.clone().into_bytes();
        truth.sent.push(Sent {
            at,
            kind: ChunkKind::Body,
            range: 0..truth.bytes.len(),
        });
    }
    truth.completed = true;
    finish(&state, truth);
    full(StatusCode::OK, "application/json", body)
}
