//! The JSONL access log: one line per request — failed, rejected and cancelled ones too — written
//! by one task fed through a bounded channel. The data path never waits on it: when the channel
//! is full the record is dropped and counted (`inferscope_access_log_dropped_total`). Lines are
//! buffered and reach the file within `FLUSH_EVERY` (and at shutdown, and on `flush`).

use crate::meter::RequestRecord;
use serde::Serialize;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{mpsc, oneshot};

/// Longest a written line waits in the buffer before it reaches the file.
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);

enum Msg {
    Record(Arc<RequestRecord>),
    Flush(oneshot::Sender<()>),
}

/// Sending side of the access log. Cheap to call from the data path.
#[derive(Debug)]
pub struct AccessLog {
    tx: Option<mpsc::Sender<Msg>>,
    counters: Arc<Counters>,
}

#[derive(Debug, Default)]
struct Counters {
    dropped: AtomicU64,
    written: AtomicU64,
    write_errors: AtomicU64,
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
            tx: None,
            counters: Arc::default(),
        }
    }

    /// Opens (appends to) `path` — `-` means standard output — and spawns the writer task on the
    /// current runtime. `capacity` bounds the records waiting to be written.
    pub async fn open(path: &Path, capacity: usize) -> std::io::Result<Self> {
        let out: Box<dyn AsyncWrite + Send + Unpin> = if path == Path::new("-") {
            Box::new(tokio::io::stdout())
        } else {
            Box::new(
                tokio::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .await?,
            )
        };
        let (tx, rx) = mpsc::channel(capacity.max(1));
        let counters = Arc::<Counters>::default();
        tokio::spawn(write_loop(
            rx,
            BufWriter::with_capacity(64 * 1024, out),
            Arc::clone(&counters),
        ));
        Ok(Self {
            tx: Some(tx),
            counters,
        })
    }

    /// Queues one record; never waits. A full queue drops it and counts the drop.
    pub fn send(&self, rec: Arc<RequestRecord>) {
        if let Some(tx) = &self.tx {
            if tx.try_send(Msg::Record(rec)).is_err() {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Waits until every record queued before this call is written and flushed (shutdown path).
    pub async fn flush(&self) {
        if let Some(tx) = &self.tx {
            let (ack, done) = oneshot::channel();
            if tx.send(Msg::Flush(ack)).await.is_ok() {
                let _ = tokio::time::timeout(Duration::from_secs(10), done).await;
            }
        }
    }

    /// Records dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.counters.dropped.load(Ordering::Relaxed)
    }

    /// Lines written so far.
    pub fn written(&self) -> u64 {
        self.counters.written.load(Ordering::Relaxed)
    }

    /// Failed writes so far.
    pub fn write_errors(&self) -> u64 {
        self.counters.write_errors.load(Ordering::Relaxed)
    }
}

impl crate::meter::RecordSink for AccessLog {
    fn record(&self, rec: &Arc<RequestRecord>) {
        self.send(Arc::clone(rec));
    }
}

async fn write_loop(
    mut rx: mpsc::Receiver<Msg>,
    mut out: BufWriter<Box<dyn AsyncWrite + Send + Unpin>>,
    counters: Arc<Counters>,
) {
    let mut line = Vec::with_capacity(1024);
    let mut warned = false;
    // Lines reach the file when the buffer fills or `FLUSH_EVERY` after they were written, not one
    // write per request: at thousands of requests per second a write (and, for a file, a hop
    // through Tokio's blocking pool) per line cost more CPU than proxying the request.
    let mut tick = tokio::time::interval(FLUSH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut dirty = false;
    loop {
        let msg = tokio::select! {
            msg = rx.recv() => msg,
            _ = tick.tick(), if dirty => {
                let _ = out.flush().await;
                dirty = false;
                continue;
            }
        };
        match msg {
            None => break,
            Some(Msg::Record(rec)) => {
                line.clear();
                if serde_json::to_writer(&mut line, &LogLine::from(&*rec)).is_ok() {
                    line.push(b'\n');
                    match out.write_all(&line).await {
                        Ok(()) => counters.written.fetch_add(1, Ordering::Relaxed),
                        Err(e) => {
                            if !warned {
                                tracing::error!(error = %e, "access log write failed");
                                warned = true;
                            }
                            counters.write_errors.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                    dirty = true;
                }
            }
            Some(Msg::Flush(ack)) => {
                let _ = out.flush().await;
                dirty = false;
                let _ = ack.send(());
            }
        }
    }
    let _ = out.flush().await;
}

use crate::util::quantile::{duration_ms as ms, us_to_ms};

#[derive(Serialize)]
struct RetryLine<'a> {
    backend: &'a str,
    status: Option<u16>,
    error: &'static str,
}

#[derive(Serialize)]
struct ItlSummary {
    p50: f64,
    p99: f64,
    max: f64,
    count: u64,
}

/// Every inter-token gap of the request, in order, in whole microseconds: what `/stats` records,
/// so offline reports compute ITL from the same samples.
struct ItlGaps<'a>(&'a [crate::meter::ItlSample]);

impl Serialize for ItlGaps<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(crate::meter::ItlSample::gap_us))
    }
}

/// The client's address as `ip:port`, written without an intermediate string.
struct Client(std::net::SocketAddr);

impl Serialize for Client {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

/// The access-log line: field names are a contract (docs/ARCHITECTURE.md §5).
#[derive(Serialize)]
struct LogLine<'a> {
    ts: String,
    request_id: &'a str,
    trace_id: &'a str,
    route: &'a str,
    model: &'a str,
    backend: &'a str,
    variant: &'a str,
    method: &'a str,
    path: &'a str,
    protocol: &'static str,
    client: Option<Client>,
    status: u16,
    stream: bool,
    outcome: &'static str,
    ttft_ms: Option<f64>,
    ttfc_ms: Option<f64>,
    tpot_ms: Option<f64>,
    e2e_ms: f64,
    upstream_ttft_ms: Option<f64>,
    overhead_ms: Option<f64>,
    itl_ms: Option<ItlSummary>,
    itl_us: ItlGaps<'a>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    tokens_source: Option<&'static str>,
    finish_reason: Option<&'a str>,
    response_id: Option<&'a str>,
    bytes_in: u64,
    bytes_out: u64,
    malformed_events: u32,
    error: Option<&'static str>,
    attempts: usize,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    retries: Vec<RetryLine<'a>>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    shadow: bool,
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

impl<'a> From<&'a RequestRecord> for LogLine<'a> {
    fn from(r: &'a RequestRecord) -> Self {
        let m = &r.meta;
        let itl = r.itl_summary().map(|s| ItlSummary {
            p50: us_to_ms(s.p50_us),
            p99: us_to_ms(s.p99_us),
            max: us_to_ms(s.max_us),
            count: s.count,
        });
        LogLine {
            ts: crate::util::time::rfc3339(m.ts),
            request_id: &m.request_id,
            trace_id: &m.trace_id,
            route: &m.route,
            model: &m.model,
            backend: &m.backend,
            variant: &m.variant,
            method: m.method.as_str(),
            path: &m.path,
            protocol: protocol(m.version),
            client: m.client.map(Client),
            status: r.status,
            stream: m.stream,
            outcome: r.outcome.as_str(),
            ttft_ms: r.ttft.map(ms),
            ttfc_ms: r.ttfc.map(ms),
            tpot_ms: r.tpot.map(ms),
            e2e_ms: ms(r.e2e),
            upstream_ttft_ms: r.upstream_ttft.map(ms),
            overhead_ms: r.overhead.map(ms),
            itl_ms: itl,
            itl_us: ItlGaps(r.itl.samples()),
            input_tokens: r.input_tokens,
            output_tokens: r.output_tokens,
            tokens_source: r.tokens_source.map(|t| t.as_str()),
            finish_reason: r.finish_reason.as_ref().map(|f| f.as_str()),
            response_id: r.response.id.as_deref(),
            bytes_in: m.bytes_in,
            bytes_out: r.bytes_out,
            malformed_events: r.malformed_events,
            error: r.error,
            attempts: m.attempts.len() + usize::from(m.t_sent.is_some()),
            retries: m
                .attempts
                .iter()
                .map(|a| RetryLine {
                    backend: &a.backend,
                    status: a.status,
                    error: a.error,
                })
                .collect(),
            shadow: m.is_shadow,
        }
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
}
