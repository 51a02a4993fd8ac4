//! The JSONL access log: one line per request — failed, rejected and cancelled ones too — written
//! by one task fed through a bounded queue. The data path never waits on it: when the queue is
//! full the record is dropped and counted (`inferscope_access_log_dropped_total`). Nor does it
//! wake the writer for each record: the first record of a batch does (its `FLUSH_EVERY` clock
//! starts), and so does a queue `WAKE_AT` long; the writer takes the whole batch at once.
//!
//! Lines are gathered in a buffer and reach the file within `FLUSH_EVERY` (and at shutdown, on
//! `flush`, and when 64 KiB are waiting), in one write on Tokio's blocking pool. The file only
//! ever holds whole lines: when a write fails (a full disk), the file is cut back to its length
//! before the write, the lines stay buffered and are tried again (the file is reopened first); a
//! buffer that grows past `MAX_PENDING` while writes fail loses its oldest lines, counted as lost.
//! `written` counts lines that reached the file. Errors are logged at most once per 10 s.
//!
//! `reopen` (SIGUSR1, for logrotate's `create` mode) switches to a fresh file at the same path
//! between two writes; `rotate` (size and age) renames the file to `PATH.1` (shifting older ones,
//! keeping `keep`) itself.

use crate::meter::RequestRecord;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

/// One access-log field: its name (nested ones dotted, list items as `[]`), when it is written,
/// and what it holds. `FIELDS` is the reference page `docs/reference/access-log.md`; the tests
/// check it names every field the writer writes, and nothing else.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    /// The name, e.g. `itl_ms.p99` or `retries[].status`.
    pub name: &'static str,
    /// When it is written (`always`, or the condition).
    pub when: &'static str,
    /// What it holds.
    pub what: &'static str,
}

const fn f(name: &'static str, when: &'static str, what: &'static str) -> Field {
    Field { name, when, what }
}

/// Every field of an access-log line, in the order written.
pub const FIELDS: &[Field] = &[
    f("ts", "always", "wall-clock time the request head was accepted, RFC 3339, UTC"),
    f("request_id", "always", "the gateway's request id (also the `x-inferscope-request-id` response header)"),
    f("trace_id", "always", "W3C trace id: the client's `traceparent`'s, or a new one"),
    f("route", "always", "the route that matched (`-` when none did)"),
    f("model", "always", "the model the client asked for (`-` when none; cut at `limits.max_model_name_bytes`)"),
    f("backend", "always", "the backend that served the last attempt (`-` when none was chosen)"),
    f("variant", "always", "the experiment variant (`-` outside an experiment)"),
    f("method", "always", "the HTTP method"),
    f("path", "always", "the request path, without the query"),
    f("protocol", "always", "the client's HTTP version (`HTTP/1.1`, `HTTP/2.0`)"),
    f("client", "always", "the connection's peer `ip:port` (never a forwarded header); null when unknown"),
    f("key", "with `auth:`", "the client key's name"),
    f("run", "when tagged", "the benchmark run the client tagged the request with (`x-inferscope-run`, on a route with `purpose_header: true`)"),
    f("status", "always", "the status sent to the client"),
    f("stream", "always", "the client asked for a streamed response"),
    f("outcome", "always", "`ok`, `client_error`, `backend_error`, `truncated`, `timeout`, `client_cancelled`, `rejected`, `gateway_error`, `shutdown` or `rate_limited`"),
    f("ttft_ms", "always (null without a token)", "time to first token: arrival to the write of the first output event"),
    f("ttfc_ms", "always (null without a chunk)", "time to first chunk: arrival to the write of the first body chunk"),
    f("tpot_ms", "always (null below two tokens)", "time per output token after the first: (last token − first token) / (tokens − 1)"),
    f("e2e_ms", "always", "arrival to the write of the response's end"),
    f("upstream_ttft_ms", "always (null without a token)", "the backend's share of TTFT: from sending the request to the first token's arrival"),
    f("overhead_ms", "always (null when nothing was sent)", "the gateway's own time: arrival to sending upstream, plus time spent observing frames"),
    f("clock", "always", "`kernel` (arrival from the kernel's receive stamp) or `user` (the gateway's own clock)"),
    f("accept_delay_ms", "always (null with `clock: user`)", "from the kernel's stamp of the head to the gateway taking the request"),
    f("forward_lag_ms", "always (null without frames)", "longest hold of a frame between its arrival from upstream and its hand-off (a lower bound)"),
    f("handoff_lag_ms", "when the server timed the writes", "longest wait between handing a timed frame on and the connection's next write"),
    f("itl_ms", "always (null without a gap)", "inter-token latency of this request"),
    f("itl_ms.p50", "with `itl_ms`", "median gap"),
    f("itl_ms.p99", "with `itl_ms`", "99th-percentile gap"),
    f("itl_ms.max", "with `itl_ms`", "longest gap"),
    f("itl_ms.count", "with `itl_ms`", "gaps, all of them (also beyond those in `itl_us`)"),
    f("itl_us", "always", "every gap, in order, whole microseconds, up to the first 4,096"),
    f("input_tokens", "always (null when unknown)", "prompt tokens, by `tokens_source`"),
    f("output_tokens", "always (null when unknown)", "output tokens, by `tokens_source`"),
    f("tokens_source", "always (null when no count)", "`usage` (the backend's own count), `events` (the sum of its per-event counts) or `counted` (output events counted)"),
    f("event_tokens", "always (null without events)", "tokens per output event: `exact`, `derived` or `assumed`"),
    f("engine_queue_ms", "with a joined engine span", "the engine's queue time"),
    f("engine_prefill_ms", "with an engine span or the response's timings", "the engine's prefill time"),
    f("engine_decode_ms", "with an engine span or the response's timings", "the engine's decode time"),
    f("engine_span", "with `engine_spans:`", "`joined`, or `missing` when none came within its wait"),
    f("engine_request_id", "with a joined span that names it", "the engine's own request id"),
    f("engine_ttft_ms", "with a joined span that has it", "the engine's own time to first token"),
    f("ttft_parts_ms", "with a joined span", "TTFT in parts that add up to it"),
    f("ttft_parts_ms.gateway", "with `ttft_parts_ms`", "TTFT − upstream TTFT: before the send and the first token's hold"),
    f("ttft_parts_ms.queue", "with `ttft_parts_ms`", "the engine's queue time"),
    f("ttft_parts_ms.prefill", "with `ttft_parts_ms`", "the engine's prefill time"),
    f("ttft_parts_ms.rest", "with `ttft_parts_ms`", "upstream TTFT − queue − prefill: network, HTTP server, tokenizer (negative when the engine's numbers exceed the gateway's)"),
    f("e2e_parts_ms", "with a joined span", "E2E in parts that add up to it"),
    f("e2e_parts_ms.gateway", "with `e2e_parts_ms`", "the gateway's overhead"),
    f("e2e_parts_ms.queue", "with `e2e_parts_ms`", "the engine's queue time"),
    f("e2e_parts_ms.prefill", "with `e2e_parts_ms`", "the engine's prefill time"),
    f("e2e_parts_ms.decode", "with `e2e_parts_ms`", "the engine's decode time"),
    f("e2e_parts_ms.rest", "with `e2e_parts_ms`", "E2E − the others"),
    f("starved", "with a joined span and enough history", "the request queued far longer than the backend's recent median: starved by others' prefill"),
    f("backend_running", "with a fresh scrape of the engine's metrics", "requests the engine was running when this one was sent"),
    f("backend_queue_depth", "with a fresh scrape", "requests waiting in the engine's queue then"),
    f("backend_kv_cache_usage", "with a fresh scrape", "the engine's KV-cache use then (0–1)"),
    f("backend_load_age_ms", "with a fresh scrape", "how old that scrape was when the request was sent"),
    f("finish_reason", "always (null when none)", "why generation stopped: `stop`, `length`, `tool_calls`, `content_filter`, or the backend's own word"),
    f("response_id", "always (null when none)", "the backend's response id"),
    f("bytes_in", "always", "request body bytes (read bodies exactly; bodies streamed through by `content-length`)"),
    f("bytes_out", "always", "response body bytes handed on to the client"),
    f("malformed_events", "always", "stream events that could not be parsed (forwarded all the same)"),
    f("error", "always (null on success)", "what went wrong, in a word or a phrase"),
    f("attempts", "always", "upstream attempts (retries included)"),
    f("retries", "when an attempt was retried", "each failed attempt before the last"),
    f("retries[].backend", "with `retries`", "the backend tried"),
    f("retries[].status", "with `retries`", "its status (null when it gave none)"),
    f("retries[].error", "with `retries`", "why it failed"),
    f("purpose", "always", "`live`, `shadow`, `eval` or `bench`"),
    f("shadow", "on shadow copies", "`true`: a copy the gateway made (logs older than `purpose`)"),
    f("variant_forced", "when the client forced the variant", "`true`: not a random draw, left out of the comparisons"),
    f("slo_met", "with the route's `slo:`", "every latency objective held"),
];

/// An access-log line as its readers (`inferscope report`, the roofline) take it back: the
/// fields they use, each optional (a line written before a field existed lacks it; fields a
/// reader does not use are ignored).
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
#[non_exhaustive]
pub struct LogLine {
    /// Arrival, RFC 3339.
    pub ts: Option<String>,
    /// The request's id.
    pub request_id: Option<String>,
    /// The route.
    pub route: Option<String>,
    /// The model requested.
    pub model: Option<String>,
    /// The backend that answered.
    pub backend: Option<String>,
    /// The experiment variant.
    pub variant: Option<String>,
    /// The client forced the variant.
    #[serde(default)]
    pub variant_forced: bool,
    /// The client's address (`ip:port`).
    pub client: Option<String>,
    /// The client key's name, where keys are configured.
    pub key: Option<String>,
    /// `live`, `shadow`, `eval` or `bench` (absent in logs older than it).
    pub purpose: Option<String>,
    /// The benchmark run it was tagged with.
    pub run: Option<String>,
    /// A shadow copy (logs older than `purpose`).
    #[serde(default)]
    pub shadow: bool,
    /// Whether the client asked for a stream (`None`: lines written before the field existed).
    pub stream: Option<bool>,
    /// How the request ended.
    pub outcome: Option<String>,
    /// Met the route's objectives (absent: not judged).
    pub slo_met: Option<bool>,
    /// End to end, milliseconds.
    pub e2e_ms: Option<f64>,
    /// Time to first token, milliseconds.
    pub ttft_ms: Option<f64>,
    /// Time to first chunk, milliseconds.
    pub ttfc_ms: Option<f64>,
    /// Time per output token, milliseconds.
    pub tpot_ms: Option<f64>,
    /// Prompt tokens.
    pub input_tokens: Option<u64>,
    /// Output tokens.
    pub output_tokens: Option<u64>,
    /// Every inter-token gap, microseconds (absent in logs older than it).
    #[serde(default)]
    pub itl_us: Vec<u64>,
    /// Requests the engine was running when this one was sent (engine load, where scraped).
    pub backend_running: Option<f64>,
    /// The engine's prefill time, milliseconds (engine spans, where read).
    pub engine_prefill_ms: Option<f64>,
}

/// Longest a written line waits in the buffer before it reaches the file.
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);

/// Buffered bytes that trigger a write before the tick.
const WRITE_AT: usize = 64 << 10;

/// Records waiting that wake the writer before its tick.
const WAKE_AT: usize = 256;

/// Most bytes kept while writes fail; beyond it the oldest lines are lost (and counted).
pub const MAX_PENDING: usize = 8 << 20;

/// Rotation by size and age (`access_log.rotate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rotation {
    /// Rotate before a write would take the file past this many bytes.
    pub max_bytes: Option<u64>,
    /// Rotate a file this old (since it was opened).
    pub max_age: Option<Duration>,
    /// Rotated files kept (`PATH.1` … `PATH.keep`); older ones are deleted. Disk use stays
    /// within about `(keep + 1) × max_bytes`.
    pub keep: usize,
}

/// What the writer is asked besides writing records.
enum Msg {
    Flush(oneshot::Sender<()>),
    Reopen,
    Close(oneshot::Sender<()>),
}

/// Records waiting for the writer: pushed under a short lock, taken by the writer a batch at
/// a time.
#[derive(Debug)]
struct Queue {
    records: parking_lot::Mutex<Vec<Arc<RequestRecord>>>,
    capacity: usize,
    /// Closed: records are dropped (and counted).
    closed: std::sync::atomic::AtomicBool,
    wake: tokio::sync::Notify,
}

/// Sending side of the access log. Cheap to call from the data path.
#[derive(Debug)]
pub struct AccessLog {
    queue: Option<Arc<Queue>>,
    tx: Option<mpsc::Sender<Msg>>,
    counters: Arc<Counters>,
}

#[derive(Debug, Default)]
struct Counters {
    dropped: AtomicU64,
    written: AtomicU64,
    write_errors: AtomicU64,
    lost: AtomicU64,
    rotations: AtomicU64,
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Msg")
    }
}

impl AccessLog {
    /// A log that records nothing (no `access_log` configured).
    pub fn disabled() -> Self {
        Self {
            queue: None,
            tx: None,
            counters: Arc::default(),
        }
    }

    /// Opens (appends to) `path` — `-` means standard output — and spawns the writer task on the
    /// current runtime. `capacity` bounds the records waiting to be written.
    pub async fn open(path: &Path, capacity: usize) -> std::io::Result<Self> {
        Self::open_with(path, capacity, None).await
    }

    /// `open`, rotating the file by size and age.
    pub async fn open_with(
        path: &Path,
        capacity: usize,
        rotation: Option<Rotation>,
    ) -> std::io::Result<Self> {
        let sink = if path == Path::new("-") {
            Sink::Stdout
        } else {
            let p = path.to_path_buf();
            let file = tokio::task::spawn_blocking(move || open_append(&p))
                .await
                .map_err(std::io::Error::other)??;
            Sink::File {
                path: path.to_path_buf(),
                file: Some(file),
                opened: Instant::now(),
                rotation,
            }
        };
        let (tx, rx) = mpsc::channel(4);
        let counters = Arc::<Counters>::default();
        let queue = Arc::new(Queue {
            records: parking_lot::Mutex::new(Vec::new()),
            capacity: capacity.max(1),
            closed: std::sync::atomic::AtomicBool::new(false),
            wake: tokio::sync::Notify::new(),
        });
        tokio::spawn(write_loop(
            Arc::clone(&queue),
            rx,
            sink,
            Arc::clone(&counters),
        ));
        Ok(Self {
            queue: Some(queue),
            tx: Some(tx),
            counters,
        })
    }

    /// Queues one record; never waits. A full queue drops it and counts the drop.
    pub fn send(&self, rec: Arc<RequestRecord>) {
        let Some(q) = &self.queue else { return };
        let mut records = q.records.lock();
        if records.len() >= q.capacity || q.closed.load(Ordering::Relaxed) {
            drop(records);
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        records.push(rec);
        let n = records.len();
        drop(records);
        // The first record starts the batch's clock; a long queue is taken before it.
        if n == 1 || n == WAKE_AT.min(q.capacity) {
            q.wake.notify_one();
        }
    }

    /// Waits until every record queued before this call is written (or, while writes fail,
    /// tried once more) — the shutdown path.
    pub async fn flush(&self) {
        if let Some(tx) = &self.tx {
            let (ack, done) = oneshot::channel();
            if tx.send(Msg::Flush(ack)).await.is_ok() {
                let _ = tokio::time::timeout(Duration::from_secs(10), done).await;
            }
        }
    }

    /// Writes what is queued one last time and closes the log: lines that still cannot be
    /// written are counted as lost. Records sent afterwards are dropped (and counted).
    pub async fn close(&self) {
        if let Some(tx) = &self.tx {
            let (ack, done) = oneshot::channel();
            if tx.send(Msg::Close(ack)).await.is_ok() {
                let _ = tokio::time::timeout(Duration::from_secs(10), done).await;
            }
        }
    }

    /// Switches to a fresh file at the configured path after the lines queued before it
    /// (logrotate moved the old one away).
    pub async fn reopen(&self) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Msg::Reopen).await;
        }
    }

    /// The writer's counters, for `/metrics`.
    pub fn scalars(&self) -> [crate::meter::stats::Scalar; 5] {
        let counter = |name, help, v: u64| crate::meter::stats::Scalar {
            name,
            kind: "counter",
            help,
            value: v as f64,
        };
        [
            counter(
                "inferscope_access_log_dropped_total",
                "Access-log records dropped because the writer queue was full.",
                self.dropped(),
            ),
            counter(
                "inferscope_access_log_written_total",
                "Access-log lines that reached the file.",
                self.written(),
            ),
            counter(
                "inferscope_access_log_write_errors_total",
                "Access-log writes that failed (the file is cut back to whole lines and the lines retried).",
                self.write_errors(),
            ),
            counter(
                "inferscope_access_log_lost_total",
                "Access-log lines given up on after writes kept failing.",
                self.lost(),
            ),
            counter(
                "inferscope_access_log_rotations_total",
                "Access-log files rotated (size, age) or reopened (SIGUSR1).",
                self.rotations(),
            ),
        ]
    }

    /// Records dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.counters.dropped.load(Ordering::Relaxed)
    }

    /// Lines that reached the file (or standard output).
    pub fn written(&self) -> u64 {
        self.counters.written.load(Ordering::Relaxed)
    }

    /// Writes that failed (each retried with the same lines).
    pub fn write_errors(&self) -> u64 {
        self.counters.write_errors.load(Ordering::Relaxed)
    }

    /// Lines given up on: buffered past `MAX_PENDING` while writes kept failing, or still
    /// unwritten when the log closed.
    pub fn lost(&self) -> u64 {
        self.counters.lost.load(Ordering::Relaxed)
    }

    /// Files rotated away (by size or age, or reopened on request).
    pub fn rotations(&self) -> u64 {
        self.counters.rotations.load(Ordering::Relaxed)
    }
}

impl crate::meter::RecordSink for AccessLog {
    fn record(&self, rec: &Arc<RequestRecord>) {
        self.send(Arc::clone(rec));
    }
}

fn open_append(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

/// Where lines go.
enum Sink {
    Stdout,
    File {
        path: PathBuf,
        /// `None` while a reopen is due (after an error or on request).
        file: Option<std::fs::File>,
        opened: Instant,
        rotation: Option<Rotation>,
    },
}

/// Lines waiting for the file: whole lines, with the offset where each ends.
#[derive(Default)]
struct Pending {
    bytes: Vec<u8>,
    ends: std::collections::VecDeque<usize>,
}

impl Pending {
    fn push_line(&mut self, line: &[u8]) {
        self.bytes.extend_from_slice(line);
        self.ends.push_back(self.bytes.len());
    }

    /// Drops the oldest lines until at most `max` bytes remain; returns how many were dropped.
    fn shed(&mut self, max: usize) -> u64 {
        let mut cut = 0;
        let mut n = 0;
        while self.bytes.len() - cut > max {
            match self.ends.pop_front() {
                Some(end) => {
                    cut = end;
                    n += 1;
                }
                None => break,
            }
        }
        if cut > 0 {
            self.bytes.drain(..cut);
            for e in &mut self.ends {
                *e -= cut;
            }
        }
        n
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
    }
}

impl Sink {
    /// Writes `buf` (whole lines) completely, or leaves the file as it was. Returns the buffer,
    /// whether the file was rotated first, and the result.
    async fn write(&mut self, buf: Vec<u8>) -> (Vec<u8>, bool, std::io::Result<()>) {
        match self {
            Sink::Stdout => {
                let r = tokio::task::spawn_blocking(move || {
                    let mut out = std::io::stdout().lock();
                    let r = out.write_all(&buf).and_then(|()| out.flush());
                    (buf, false, r)
                })
                .await;
                r.unwrap_or_else(|e| (Vec::new(), false, Err(std::io::Error::other(e))))
            }
            Sink::File {
                path,
                file,
                opened,
                rotation,
            } => {
                let path = path.clone();
                let rotation = *rotation;
                let age = opened.elapsed();
                let taken = file.take();
                let r = tokio::task::spawn_blocking(move || {
                    write_file(&path, taken, rotation, age, buf)
                })
                .await;
                match r {
                    Ok((f, rotated, buf, result)) => {
                        if rotated {
                            *opened = Instant::now();
                        }
                        *file = f;
                        (buf, rotated, result)
                    }
                    Err(e) => (Vec::new(), false, Err(std::io::Error::other(e))),
                }
            }
        }
    }

    fn reopen(&mut self) {
        if let Sink::File { file, opened, .. } = self {
            *file = None;
            *opened = Instant::now();
        }
    }
}

/// On the blocking pool: (re)opens, rotates when due, appends `buf` whole or cuts the file back.
/// Returns the file (`None` after an error: reopened next time), whether it rotated, the buffer
/// and the result.
#[allow(clippy::type_complexity)]
fn write_file(
    path: &Path,
    file: Option<std::fs::File>,
    rotation: Option<Rotation>,
    age: Duration,
    buf: Vec<u8>,
) -> (Option<std::fs::File>, bool, Vec<u8>, std::io::Result<()>) {
    let mut rotated = false;
    let mut file = match file {
        Some(f) => f,
        None => match open_append(path) {
            Ok(f) => f,
            Err(e) => return (None, false, buf, Err(e)),
        },
    };
    let before = match file.metadata() {
        Ok(m) => m.len(),
        Err(e) => return (None, false, buf, Err(e)),
    };
    let mut before = before;
    if let Some(r) = rotation {
        let too_big = r
            .max_bytes
            .is_some_and(|m| before > 0 && before + buf.len() as u64 > m);
        let too_old = r.max_age.is_some_and(|m| before > 0 && age >= m);
        if too_big || too_old {
            match rotate_files(path, r.keep).and_then(|()| open_append(path)) {
                Ok(f) => {
                    file = f;
                    before = 0;
                    rotated = true;
                }
                Err(e) => return (None, false, buf, Err(e)),
            }
        }
    }
    let result = file.write_all(&buf);
    if result.is_err() {
        // Never leave a torn line: cut back to the last whole one.
        let _ = file.set_len(before);
        return (None, rotated, buf, result);
    }
    (Some(file), rotated, buf, Ok(()))
}

/// `PATH.(keep-1)` → `PATH.keep` … `PATH` → `PATH.1`; the oldest beyond `keep` is deleted.
fn rotate_files(path: &Path, keep: usize) -> std::io::Result<()> {
    let numbered = |i: usize| {
        let mut s = path.as_os_str().to_owned();
        s.push(format!(".{i}"));
        PathBuf::from(s)
    };
    if keep == 0 {
        return std::fs::remove_file(path);
    }
    let _ = std::fs::remove_file(numbered(keep));
    for i in (1..keep).rev() {
        let from = numbered(i);
        if from.exists() {
            std::fs::rename(&from, numbered(i + 1))?;
        }
    }
    std::fs::rename(path, numbered(1))
}

/// Serializes every queued record into `pending`.
fn take_batch(
    queue: &Queue,
    batch: &mut Vec<Arc<RequestRecord>>,
    line: &mut Vec<u8>,
    pending: &mut Pending,
) {
    std::mem::swap(&mut *queue.records.lock(), batch);
    for rec in batch.drain(..) {
        line.clear();
        write_line(&rec, line);
        line.push(b'\n');
        pending.push_line(line);
    }
}

async fn write_loop(
    queue: Arc<Queue>,
    mut rx: mpsc::Receiver<Msg>,
    mut sink: Sink,
    counters: Arc<Counters>,
) {
    let mut line = Vec::with_capacity(1024);
    let mut batch = Vec::new();
    let mut pending = Pending::default();
    let mut spare = Vec::with_capacity(WRITE_AT * 2);
    let mut errors = crate::util::errors::Sparse::every(Duration::from_secs(10));
    // Lines reach the file when enough are waiting or `FLUSH_EVERY` after the first of them was
    // queued, not one write per request: at thousands of requests per second a write (and a
    // hop through Tokio's blocking pool) per line cost more CPU than proxying the request.
    let mut due: Option<tokio::time::Instant> = None;
    let mut closed = None;
    loop {
        let tick = async {
            match due {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = queue.wake.notified() => {
                if queue.records.lock().len() >= WAKE_AT.min(queue.capacity) {
                    take_batch(&queue, &mut batch, &mut line, &mut pending);
                    if pending.bytes.len() >= WRITE_AT {
                        write_out(&mut sink, &mut pending, &mut spare, &counters, &mut errors).await;
                    }
                }
                due.get_or_insert_with(|| tokio::time::Instant::now() + FLUSH_EVERY);
            }
            () = tick => {
                take_batch(&queue, &mut batch, &mut line, &mut pending);
                write_out(&mut sink, &mut pending, &mut spare, &counters, &mut errors).await;
                // Lines a failed write kept are tried again a tick later.
                due = (!pending.ends.is_empty()).then(|| tokio::time::Instant::now() + FLUSH_EVERY);
            }
            msg = rx.recv() => match msg {
                None => break,
                Some(Msg::Close(ack)) => {
                    closed = Some(ack);
                    break;
                }
                Some(Msg::Flush(ack)) => {
                    take_batch(&queue, &mut batch, &mut line, &mut pending);
                    write_out(&mut sink, &mut pending, &mut spare, &counters, &mut errors).await;
                    let _ = ack.send(());
                }
                Some(Msg::Reopen) => {
                    take_batch(&queue, &mut batch, &mut line, &mut pending);
                    write_out(&mut sink, &mut pending, &mut spare, &counters, &mut errors).await;
                    sink.reopen();
                    counters.rotations.fetch_add(1, Ordering::Relaxed);
                    tracing::info!("access log reopened");
                }
            }
        }
    }
    // Closing: whatever is queued, then a last attempt; records sent from now on are dropped.
    // Under the queue's lock: a record is either queued before (and taken below) or dropped.
    {
        let _records = queue.records.lock();
        queue.closed.store(true, Ordering::Relaxed);
    }
    rx.close();
    take_batch(&queue, &mut batch, &mut line, &mut pending);
    write_out(&mut sink, &mut pending, &mut spare, &counters, &mut errors).await;
    let left = pending.ends.len() as u64;
    if left > 0 {
        counters.lost.fetch_add(left, Ordering::Relaxed);
        tracing::error!(
            lines = left,
            "access log closed with lines that could not be written"
        );
    }
    if let Some(ack) = closed {
        let _ = ack.send(());
    }
}

/// One attempt to write every pending line.
async fn write_out(
    sink: &mut Sink,
    pending: &mut Pending,
    spare: &mut Vec<u8>,
    counters: &Counters,
    errors: &mut crate::util::errors::Sparse,
) {
    if pending.ends.is_empty() {
        return;
    }
    // The lines go to the blocking pool; the spare buffer (its capacity kept) takes their place.
    let buf = std::mem::replace(&mut pending.bytes, std::mem::take(spare));
    let (mut buf, rotated, result) = sink.write(buf).await;
    if rotated {
        counters.rotations.fetch_add(1, Ordering::Relaxed);
    }
    match result {
        Ok(()) => {
            counters
                .written
                .fetch_add(pending.ends.len() as u64, Ordering::Relaxed);
            buf.clear();
            *spare = buf;
            pending.clear();
        }
        Err(e) => {
            counters.write_errors.fetch_add(1, Ordering::Relaxed);
            if let Some(failures) = errors.hit() {
                tracing::error!(error = %e, failures, pending_lines = pending.ends.len(), "access log write failed; lines kept and retried");
            }
            // Nothing was written: the lines stay, oldest first.
            *spare = std::mem::replace(&mut pending.bytes, buf);
            spare.clear();
            let lost = pending.shed(MAX_PENDING);
            if lost > 0 {
                counters.lost.fetch_add(lost, Ordering::Relaxed);
            }
        }
    }
}

use crate::util::json::{key, Object};
use crate::util::quantile::duration_us as us;

/// Writes a record's access-log line (one JSON object, no newline) at the end of `out`. The
/// field names are a contract (docs/ARCHITECTURE.md §5, `tests/golden/access-log-fields.txt`).
pub fn write_line(r: &RequestRecord, out: &mut Vec<u8>) {
    let m = &r.meta;
    let mut o = Object::open(out);
    let ts = o.key(key!("ts"));
    ts.push(b'"');
    crate::util::time::write_rfc3339(ts, m.ts);
    ts.push(b'"');
    o.str(key!("request_id"), &m.request_id);
    o.str(key!("trace_id"), &m.trace_id);
    o.str(key!("route"), &m.route);
    o.str(key!("model"), &m.model);
    o.str(key!("backend"), &m.backend);
    o.str(key!("variant"), &m.variant);
    o.str(key!("method"), m.method.as_str());
    o.str(key!("path"), &m.path);
    o.str(key!("protocol"), protocol(m.version));
    match m.client {
        // Digits, dots, colons and brackets: nothing to escape.
        Some(addr) => {
            let out = o.key(key!("client"));
            out.push(b'"');
            match addr {
                std::net::SocketAddr::V4(a) => {
                    for (i, b) in a.ip().octets().into_iter().enumerate() {
                        if i > 0 {
                            out.push(b'.');
                        }
                        crate::util::json::uint(out, u64::from(b));
                    }
                    out.push(b':');
                    crate::util::json::uint(out, u64::from(a.port()));
                }
                a => {
                    let _ = write!(out, "{a}");
                }
            }
            out.push(b'"');
        }
        None => o.null(key!("client")),
    }
    let facts = crate::facts::Facts::of(m);
    if let Some(name) = facts.key.as_deref() {
        o.str(key!("key"), name);
    }
    if let Some(run) = facts.run.as_deref() {
        o.str(key!("run"), run);
    }
    o.u64(key!("status"), u64::from(r.status));
    o.bool(key!("stream"), m.stream);
    o.str(key!("outcome"), r.outcome.as_str());
    o.ms(key!("ttft_ms"), r.ttft.map(us));
    o.ms(key!("ttfc_ms"), r.ttfc.map(us));
    o.ms(key!("tpot_ms"), r.tpot.map(us));
    o.ms(key!("e2e_ms"), Some(us(r.e2e)));
    o.ms(key!("upstream_ttft_ms"), r.upstream_ttft.map(us));
    o.ms(key!("overhead_ms"), r.overhead.map(us));
    o.str(key!("clock"), m.clock.as_str());
    o.ms(key!("accept_delay_ms"), m.accept_delay.map(us));
    o.ms(key!("forward_lag_ms"), r.forward_lag.map(us));
    if let Some(lag) = r.handoff_lag {
        o.ms(key!("handoff_lag_ms"), Some(us(lag)));
    }
    match r.itl_summary() {
        Some(s) => {
            let mut itl = Object::open(o.key(key!("itl_ms")));
            itl.ms(key!("p50"), Some(s.p50_us));
            itl.ms(key!("p99"), Some(s.p99_us));
            itl.ms(key!("max"), Some(s.max_us));
            itl.u64(key!("count"), s.count);
            itl.close();
        }
        None => o.null(key!("itl_ms")),
    }
    // Every inter-token gap of the request, in order, in whole microseconds: what `/stats`
    // records, so offline reports compute ITL from the same samples.
    let gaps = o.key(key!("itl_us"));
    gaps.push(b'[');
    for (i, g) in r.itl.samples().iter().enumerate() {
        if i > 0 {
            gaps.push(b',');
        }
        crate::util::json::uint(gaps, g.gap_us());
    }
    gaps.push(b']');
    o.opt_u64(key!("input_tokens"), r.input_tokens);
    o.opt_u64(key!("output_tokens"), r.output_tokens);
    o.opt_str(key!("tokens_source"), r.tokens_source.map(|t| t.as_str()));
    o.opt_str(key!("event_tokens"), r.event_tokens.map(|t| t.as_str()));
    // The engine's times: from its span when one was joined, else from its response.
    let joined = r.engine_joined();
    let engine = r.response.engine;
    if let Some(v) = joined.and_then(|(s, _)| s.queue) {
        o.ms(key!("engine_queue_ms"), Some(us(v)));
    }
    let prefill = joined.map_or(engine.and_then(|e| e.prefill), |(s, _)| s.prefill);
    if let Some(v) = prefill {
        o.ms(key!("engine_prefill_ms"), Some(us(v)));
    }
    let decode = joined.map_or(engine.and_then(|e| e.decode), |(s, _)| s.decode);
    if let Some(v) = decode {
        o.ms(key!("engine_decode_ms"), Some(us(v)));
    }
    match (r.engine_span.get(), joined) {
        (Some(_), Some((span, starved))) => {
            o.str(key!("engine_span"), "joined");
            o.opt_str(key!("engine_request_id"), span.request_id.as_deref());
            if let Some(v) = span.ttft {
                o.ms(key!("engine_ttft_ms"), Some(us(v)));
            }
            for (field, b) in [
                (key!("ttft_parts_ms"), r.ttft_breakdown()),
                (key!("e2e_parts_ms"), r.e2e_breakdown()),
            ] {
                if let Some(b) = b {
                    parts(o.key(field), &b, field == key!("e2e_parts_ms"));
                }
            }
            if let Some(s) = starved {
                o.bool(key!("starved"), s);
            }
        }
        (Some(_), None) => o.str(key!("engine_span"), "missing"),
        (None, _) => {}
    }
    let load = facts.engine;
    for (field, v) in [
        (key!("backend_running"), load.and_then(|e| e.running)),
        (key!("backend_queue_depth"), load.and_then(|e| e.waiting)),
        (
            key!("backend_kv_cache_usage"),
            load.and_then(|e| e.kv_cache_usage),
        ),
    ] {
        if v.is_some() {
            o.f32(field, v);
        }
    }
    // How old the scrape those came from was when the request was sent.
    if let Some(e) = load {
        o.u64(key!("backend_load_age_ms"), u64::from(e.age_ms));
    }
    o.opt_str(
        key!("finish_reason"),
        r.finish_reason.as_ref().map(|f| f.as_str()),
    );
    o.opt_str(key!("response_id"), r.response.id.as_deref());
    o.u64(key!("bytes_in"), m.bytes_in);
    o.u64(key!("bytes_out"), r.bytes_out);
    o.u64(key!("malformed_events"), u64::from(r.malformed_events));
    o.opt_str(key!("error"), r.error);
    let attempts = facts.attempts.len() + usize::from(m.t_sent.is_some());
    o.u64(key!("attempts"), attempts as u64);
    if !facts.attempts.is_empty() {
        let list = o.key(key!("retries"));
        list.push(b'[');
        for (i, a) in facts.attempts.iter().enumerate() {
            if i > 0 {
                list.push(b',');
            }
            let mut retry = Object::open(list);
            retry.str(key!("backend"), &a.backend);
            retry.opt_u64(key!("status"), a.status.map(u64::from));
            retry.str(key!("error"), a.error);
            retry.close();
        }
        list.push(b']');
    }
    o.str(key!("purpose"), m.purpose.as_str());
    if m.purpose == crate::meter::Purpose::Shadow {
        o.bool(key!("shadow"), true);
    }
    if m.variant_forced {
        o.bool(key!("variant_forced"), true);
    }
    if let Some(met) = r.slo_met() {
        o.bool(key!("slo_met"), met);
    }
    o.close();
}

/// `{"gateway":…,"queue":…,"prefill":…,["decode":…,]"rest":…}` in milliseconds.
fn parts(out: &mut Vec<u8>, b: &crate::meter::Breakdown, decode: bool) {
    let mut p = Object::open(out);
    p.ms(key!("gateway"), Some(us(b.gateway)));
    p.ms(key!("queue"), Some(us(b.queue)));
    p.ms(key!("prefill"), Some(us(b.prefill)));
    if decode {
        p.ms(key!("decode"), Some(us(b.decode)));
    }
    // Signed: negative when the engine's numbers exceed what the gateway measured.
    crate::util::json::float(p.key(key!("rest")), Some(b.rest_us as f64 / 1000.0));
    p.close();
}

/// A record's access-log line as a JSON object (the fields other sinks carry too).
pub fn line_json(rec: &RequestRecord) -> serde_json::Value {
    let mut line = Vec::with_capacity(1024);
    write_line(rec, &mut line);
    serde_json::from_slice(&line).unwrap_or(serde_json::Value::Null)
}

/// The client's protocol, spelled like nginx's `$server_protocol`.
fn protocol(v: http::Version) -> &'static str {
    match v {
        http::Version::HTTP_09 => "HTTP/0.9",
        http::Version::HTTP_10 => "HTTP/1.0",
        http::Version::HTTP_2 => "HTTP/2.0",
        http::Version::HTTP_3 => "HTTP/3.0",
        _ => "HTTP/1.1",
    }
}

#[cfg(test)]
mod queue_tests {
    use super::*;
    use crate::meter::{Outcome, RequestMeta};

    fn rec() -> RequestRecord {
        let meta = RequestMeta::new(http::Method::GET, "/");
        RequestRecord::without_body(meta, 200, Outcome::Ok, None, 0)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_full_queue_drops_and_counts_never_waits() {
        let path =
            std::env::temp_dir().join(format!("inferscope-log-{}.jsonl", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let log = AccessLog::open(&path, 4)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        // On a current-thread runtime the writer cannot run until this task yields: the queue
        // takes 4 records and the other 96 are dropped, without `send` ever blocking.
        for _ in 0..100 {
            log.send(Arc::new(rec()));
        }
        assert_eq!(log.dropped(), 96);
        log.flush().await;
        assert_eq!(log.written(), 4);
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        assert_eq!(text.lines().count(), 4);
        let line: serde_json::Value =
            serde_json::from_str(text.lines().next().unwrap_or("")).unwrap_or_default();
        assert_eq!(line["outcome"], "ok");
        let _ = std::fs::remove_file(&path);
    }
    #[test]
    fn a_line_is_one_json_object_with_the_client_as_written_by_display() {
        for client in [
            None,
            Some("127.0.0.1:80"),
            Some("10.200.3.45:65535"),
            Some("0.0.0.0:0"),
            Some("[::1]:8080"),
            Some("[fe80::1%2]:443"),
        ] {
            let mut r = rec();
            r.meta.client = client.map(|c| c.parse().unwrap_or_else(|e| panic!("{c}: {e}")));
            r.meta.path = "/v1/\"odd\"\npath".into();
            let mut out = b"keep".to_vec();
            write_line(&r, &mut out);
            assert!(out.starts_with(b"keep{\"ts\":\""));
            let line: serde_json::Value = serde_json::from_slice(&out[4..]).unwrap_or_default();
            let want = r.meta.client.map(|c| c.to_string());
            assert_eq!(line["client"].as_str(), want.as_deref(), "{client:?}");
            assert_eq!(line["path"], "/v1/\"odd\"\npath");
            assert_eq!(line["status"], 200);
            assert_eq!(line, line_json(&r));
        }
    }
}
