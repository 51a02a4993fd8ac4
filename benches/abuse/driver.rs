//! Abuse soak driver, shared by `benches/abuse_soak.rs` (long form, numbers in
//! docs/RELIABILITY.md) and `tests/abuse.rs` (short form in CI): one gateway in front of a good
//! and a faulty simulator; normal streaming clients run alone (quiet phase), then alongside
//! hostile clients and traffic to the faulty backend (abuse phase). Reports the normal clients'
//! latency in both phases, what every hostile client got, and the account: every request whose
//! head reached the gateway against the access-log lines written.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use inferscope::sim::{self, Faults, Profile, SimHandle, SimOptions};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Latencies of the normal clients in one phase, milliseconds.
#[derive(Debug, Default, Clone)]
pub struct Latency {
    /// Requests that completed with `[DONE]`.
    pub ok: u64,
    /// Requests that did not.
    pub failed: u64,
    /// Time to the first body byte, per request.
    pub ttfb: Vec<f64>,
    /// End to end, per request.
    pub e2e: Vec<f64>,
}

impl Latency {
    /// Nearest-rank quantile of `v`.
    pub fn q(v: &[f64], q: f64) -> f64 {
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        if s.is_empty() {
            return f64::NAN;
        }
        let rank = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len());
        s[rank - 1]
    }
}

/// What an abuse run saw.
#[derive(Debug, Default)]
pub struct Report {
    /// Normal clients alone.
    pub quiet: Latency,
    /// Normal clients during the abuse.
    pub abused: Latency,
    /// Clients of the faulty backend during the abuse (completed / not).
    pub faulty: (u64, u64),
    /// Per hostile action: how many were made.
    pub hostile: BTreeMap<&'static str, u64>,
    /// What hostile requests got, by status line.
    pub hostile_status: BTreeMap<String, u64>,
    /// Request heads that reached the gateway (normal, faulty-route and hostile ones).
    pub requests: u64,
    /// Access-log lines written.
    pub logged: u64,
    /// Access-log lines by outcome and error.
    pub outcomes: BTreeMap<String, u64>,
    /// Resident memory (KiB) before the abuse and at its end.
    pub rss_kib: (u64, u64),
    /// The admin listener's probes during the abuse: answered, and their latency (ms).
    pub probes: Latency,
    /// The gateway's own counts at the end: OTLP exports by outcome, state-file writes by
    /// outcome, admin connections evicted.
    pub admin_counts: BTreeMap<String, f64>,
    /// Seconds of each phase.
    pub seconds: (f64, f64),
}

impl Report {
    /// Prints the account (the form docs/RELIABILITY.md quotes).
    pub fn print(&self) {
        let row = |name: &str, l: &Latency| {
            println!(
                "{name:>7}: {ok:>6} ok {failed:>3} failed | ttfb p50 {:>6.2} p99 {:>6.2} ms | e2e p50 {:>6.2} p99 {:>6.2} ms",
                Latency::q(&l.ttfb, 0.5),
                Latency::q(&l.ttfb, 0.99),
                Latency::q(&l.e2e, 0.5),
                Latency::q(&l.e2e, 0.99),
                ok = l.ok,
                failed = l.failed,
            );
        };
        println!(
            "normal traffic (quiet {:.0} s, then {:.0} s under abuse):",
            self.seconds.0, self.seconds.1
        );
        row("quiet", &self.quiet);
        row("abused", &self.abused);
        println!(
            "p99 ratio abused/quiet: ttfb {:.2}, e2e {:.2}",
            Latency::q(&self.abused.ttfb, 0.99) / Latency::q(&self.quiet.ttfb, 0.99),
            Latency::q(&self.abused.e2e, 0.99) / Latency::q(&self.quiet.e2e, 0.99)
        );
        println!(
            "faulty backend: {} complete, {} failed or cut",
            self.faulty.0, self.faulty.1
        );
        println!("hostile actions: {:?}", self.hostile);
        println!("hostile answers: {:?}", self.hostile_status);
        println!(
            "requests in {} = log lines out {} ({})",
            self.requests,
            self.logged,
            if self.requests == self.logged {
                "equal"
            } else {
                "DIFFERENT"
            }
        );
        println!("log outcomes: {:?}", self.outcomes);
        println!("rss KiB: {} -> {}", self.rss_kib.0, self.rss_kib.1);
        println!(
            "admin probes under abuse: {} answered, {} not | p50 {:.2} p99 {:.2} max {:.2} ms",
            self.probes.ok,
            self.probes.failed,
            Latency::q(&self.probes.e2e, 0.5),
            Latency::q(&self.probes.e2e, 0.99),
            Latency::q(&self.probes.e2e, 1.0),
        );
        println!("admin side: {:?}", self.admin_counts);
    }
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

async fn start_sim(faults: Faults, seed: u64) -> SimHandle {
    let listener = inferscope::server::bind_loopback().unwrap();
    let profile = Profile {
        ttft_base_ms: 5.0,
        prefill_per_token_ms: 0.0,
        tpot_ms: 2.0,
        jitter: 0.1,
        faults,
        ..Profile::fp16()
    };
    let mut opts = SimOptions::new(profile);
    opts.seed = seed;
    sim::spawn(listener, opts, std::future::pending()).unwrap()
}

fn chat(model: &str, stream: bool, tokens: u32) -> String {
    format!(
        r#"{{"model":"{model}","stream":{stream},"max_tokens":{tokens},"messages":[{{"role":"user","content":"hello"}}]}}"#
    )
}

/// Counts shared by every client.
#[derive(Default)]
struct Shared {
    requests: AtomicU64,
    stop_normal: AtomicBool,
    stop_hostile: AtomicBool,
    hostile: parking_lot::Mutex<BTreeMap<&'static str, u64>>,
    statuses: parking_lot::Mutex<BTreeMap<String, u64>>,
}

impl Shared {
    fn did(&self, what: &'static str) {
        *self.hostile.lock().entry(what).or_default() += 1;
    }

    fn got(&self, status: Option<String>) {
        let key = status.unwrap_or_else(|| "closed".into());
        *self.statuses.lock().entry(key).or_default() += 1;
    }
}

/// One normal client: closed-loop streaming requests on a kept-alive connection.
async fn normal_client(addr: SocketAddr, shared: Arc<Shared>, model: &'static str) -> Latency {
    let mut lat = Latency::default();
    'conn: while !shared.stop_normal.load(Ordering::Relaxed) {
        let Ok(stream) = TcpStream::connect(addr).await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let Ok((mut sender, conn)) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await
        else {
            continue;
        };
        tokio::spawn(conn);
        while !shared.stop_normal.load(Ordering::Relaxed) {
            if sender.ready().await.is_err() {
                continue 'conn;
            }
            let req = http::Request::post("/v1/chat/completions")
                .header("host", "gw")
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(chat(model, true, 16))))
                .unwrap();
            let t0 = Instant::now();
            shared.requests.fetch_add(1, Ordering::Relaxed);
            let Ok(resp) = sender.send_request(req).await else {
                lat.failed += 1;
                continue 'conn;
            };
            let mut body = resp.into_body();
            let mut first = None;
            let mut all = Vec::new();
            let mut broke = false;
            while let Some(f) = body.frame().await {
                match f {
                    Ok(f) => {
                        if let Ok(d) = f.into_data() {
                            first.get_or_insert_with(Instant::now);
                            all.extend_from_slice(&d);
                        }
                    }
                    Err(_) => {
                        broke = true;
                        break;
                    }
                }
            }
            let e2e = t0.elapsed().as_secs_f64() * 1e3;
            if !broke && all.ends_with(b"data: [DONE]\n\n") {
                lat.ok += 1;
                if model == "good" {
                    lat.ttfb
                        .push(first.map_or(e2e, |f| f.duration_since(t0).as_secs_f64() * 1e3));
                    lat.e2e.push(e2e);
                }
            } else {
                lat.failed += 1;
                if broke {
                    continue 'conn;
                }
            }
        }
    }
    lat
}

/// Reads until a status line arrives (or the peer closes); returns it.
async fn status_line<R: tokio::io::AsyncRead + Unpin>(
    s: &mut R,
    within: Duration,
) -> Option<String> {
    let mut got = Vec::new();
    let mut buf = [0u8; 2048];
    let deadline = Instant::now() + within;
    while !got.windows(2).any(|w| w == b"\r\n") {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
            _ => return None,
        }
    }
    let text = String::from_utf8_lossy(&got).into_owned();
    text.lines()
        .next()
        .map(|l| l.split_whitespace().take(2).collect::<Vec<_>>().join(" "))
}

/// Holds `n` connections that never send a byte, reopening those the gateway closes.
async fn silent(addr: SocketAddr, shared: Arc<Shared>) {
    let mut buf = [0u8; 64];
    while !shared.stop_hostile.load(Ordering::Relaxed) {
        let Ok(mut s) = TcpStream::connect(addr).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        shared.did("silent_connection");
        // Wait until closed (or the end).
        loop {
            if shared.stop_hostile.load(Ordering::Relaxed) {
                return;
            }
            let read = tokio::time::timeout(Duration::from_millis(200), s.read(&mut buf)).await;
            if let Ok(Ok(0) | Err(_)) = read {
                break;
            }
        }
    }
}

/// Sends one raw request head (and optional body bytes), counts it, returns the status line.
async fn raw_request(addr: SocketAddr, shared: &Shared, bytes: &[u8]) -> Option<String> {
    let mut s = TcpStream::connect(addr).await.ok()?;
    s.write_all(bytes).await.ok()?;
    shared.requests.fetch_add(1, Ordering::Relaxed);
    status_line(&mut s, Duration::from_secs(10)).await
}

/// Request bodies trickled a byte every 500 ms (far under the minimum rate).
async fn trickler(addr: SocketAddr, shared: Arc<Shared>) {
    while !shared.stop_hostile.load(Ordering::Relaxed) {
        let Ok(s) = TcpStream::connect(addr).await else {
            continue;
        };
        let (mut rd, mut wr) = s.into_split();
        let head = "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{";
        if wr.write_all(head.as_bytes()).await.is_err() {
            continue;
        }
        shared.requests.fetch_add(1, Ordering::Relaxed);
        shared.did("slow_body");
        let drip = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                if wr.write_all(b" ").await.is_err() {
                    return;
                }
            }
        });
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        let status = loop {
            match tokio::time::timeout(Duration::from_secs(30), rd.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => {
                    got.extend_from_slice(&buf[..n]);
                    if got.windows(2).any(|w| w == b"\r\n") {
                        let t = String::from_utf8_lossy(&got).into_owned();
                        break t
                            .lines()
                            .next()
                            .map(|l| l.split_whitespace().take(2).collect::<Vec<_>>().join(" "));
                    }
                }
                _ => break None,
            }
        };
        drip.abort();
        shared.got(status);
    }
}

/// Connects from the loopback address `from` (a client address of its own).
async fn connect_from(from: [u8; 4], addr: SocketAddr) -> Option<TcpStream> {
    let sock = tokio::net::TcpSocket::new_v4().ok()?;
    sock.bind(SocketAddr::from((from, 0))).ok()?;
    sock.connect(addr).await.ok()
}

/// Uploads a 100 KB body at ~1.1 KB/s (just above the default minimum pace) from 127.0.0.2, and
/// starts over whenever it is cut or refused: holding a slot for as long as the pace allows.
async fn paced_uploader(addr: SocketAddr, shared: Arc<Shared>) {
    while !shared.stop_hostile.load(Ordering::Relaxed) {
        let Some(s) = connect_from([127, 0, 0, 2], addr).await else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let (mut rd, mut wr) = s.into_split();
        let head = "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n{";
        if wr.write_all(head.as_bytes()).await.is_err() {
            continue;
        }
        shared.requests.fetch_add(1, Ordering::Relaxed);
        shared.did("paced_upload");
        let stop = &shared.stop_hostile;
        let drip = async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                if stop.load(Ordering::Relaxed) || wr.write_all(&[b' '; 110]).await.is_err() {
                    // Stopped or cut: hold the write side until the answer is read.
                    std::future::pending::<()>().await;
                }
            }
        };
        let status = tokio::select! {
            s = status_line(&mut rd, Duration::from_secs(120)) => s,
            () = drip => None,
        };
        shared.got(status);
    }
}

/// An h2 client from 127.0.0.3 whose streams start with a zero window and that never sends
/// WINDOW_UPDATE: 16 streaming requests on one connection, held until the gateway closes it.
async fn zero_window_h2(addr: SocketAddr, shared: Arc<Shared>) {
    while !shared.stop_hostile.load(Ordering::Relaxed) {
        let Some(s) = connect_from([127, 0, 0, 3], addr).await else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let Ok((send, conn)) =
            hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .initial_stream_window_size(0)
                .handshake(hyper_util::rt::TokioIo::new(s))
                .await
        else {
            continue;
        };
        let conn = tokio::spawn(conn);
        let mut held = Vec::new();
        for _ in 0..16 {
            let req = http::Request::post("/v1/chat/completions")
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(chat("good", true, 64))))
                .unwrap();
            shared.requests.fetch_add(1, Ordering::Relaxed);
            shared.did("zero_window_stream");
            match send.clone().send_request(req).await {
                Ok(r) => {
                    shared.got(Some(format!("HTTP/2 {}", r.status().as_u16())));
                    held.push(r);
                }
                Err(_) => shared.got(None),
            }
        }
        // Held until the gateway closes the connection (or the end).
        while !conn.is_finished() && !shared.stop_hostile.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if conn.is_finished() {
            shared.did("zero_window_connection_closed");
        }
        drop(held);
        conn.abort();
    }
}

/// WebSocket handshakes from 127.0.0.4 to a backend that takes them and never answers; the
/// route's head timeout must answer each.
async fn hung_upgrade(addr: SocketAddr, shared: Arc<Shared>) {
    while !shared.stop_hostile.load(Ordering::Relaxed) {
        let Some(mut s) = connect_from([127, 0, 0, 4], addr).await else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let hs = "GET /mute/realtime HTTP/1.1\r\nhost: gw\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\r\n";
        if s.write_all(hs.as_bytes()).await.is_err() {
            continue;
        }
        shared.requests.fetch_add(1, Ordering::Relaxed);
        shared.did("hung_upgrade");
        let status = status_line(&mut s, Duration::from_secs(30)).await;
        shared.got(status);
    }
}

/// A backend that reads each request and never answers.
async fn mute_backend() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                }
            });
        }
    });
    addr
}

/// Loops one kind of malformed or oversize request.
async fn repeat(addr: SocketAddr, shared: Arc<Shared>, what: &'static str, bytes: Vec<u8>) {
    while !shared.stop_hostile.load(Ordering::Relaxed) {
        let status = raw_request(addr, &shared, &bytes).await;
        shared.did(what);
        shared.got(status);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn post_bytes(body: &str) -> Vec<u8> {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Admin requests made over a raw connection: `bytes`, then the status line.
async fn admin_raw(admin: SocketAddr, bytes: &[u8]) -> Option<String> {
    let mut s = TcpStream::connect(admin).await.ok()?;
    s.write_all(bytes).await.ok()?;
    status_line(&mut s, Duration::from_secs(15)).await
}

/// An OTLP/HTTP export request to the admin listener.
fn export_bytes(body: &[u8], gzip: bool) -> Vec<u8> {
    let mut v = format!(
        "POST /v1/traces HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/x-protobuf\r\n{}content-length: {}\r\nconnection: close\r\n\r\n",
        if gzip { "content-encoding: gzip\r\n" } else { "" },
        body.len()
    )
    .into_bytes();
    v.extend_from_slice(body);
    v
}

/// 4 MiB of empty spans (the most an export may hold), gzip'd (~4 KiB on the wire).
fn span_bomb() -> Vec<u8> {
    let mut scope = Vec::with_capacity(4 << 20);
    for _ in 0..(2 << 20) - 16 {
        scope.extend_from_slice(&[0x12, 0x00]);
    }
    let wrap = |inner: Vec<u8>, field: u8| {
        let mut out = vec![(field << 3) | 2];
        let mut n = inner.len();
        while n >= 0x80 {
            out.push((n as u8) | 0x80);
            n >>= 7;
        }
        out.push(n as u8);
        out.extend(inner);
        out
    };
    let plain = wrap(wrap(scope, 2), 1);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    std::io::Write::write_all(&mut gz, &plain).unwrap();
    gz.finish().unwrap()
}

/// A span of trace `i` with a queue and prefill of 1e19 s.
fn forged_span(i: u64) -> Vec<u8> {
    let attr = |k: &str| {
        let mut any = vec![0x21]; // double_value = 4
        any.extend_from_slice(&1e19f64.to_le_bytes());
        let mut kv = vec![0x0a, k.len() as u8];
        kv.extend_from_slice(k.as_bytes());
        kv.push(0x12);
        kv.push(any.len() as u8);
        kv.extend(any);
        kv
    };
    let mut span = vec![0x0a, 16];
    span.extend_from_slice(&u128::from(i + 1).to_be_bytes());
    span.extend_from_slice(&[0x22, 8]);
    span.extend_from_slice(&(i + 1).to_be_bytes());
    for k in [
        "gen_ai.latency.time_in_queue",
        "gen_ai.latency.time_in_model_prefill",
    ] {
        let kv = attr(k);
        span.push(0x4a);
        span.push(kv.len() as u8);
        span.extend(kv);
    }
    let mut scope = vec![0x12, span.len() as u8];
    scope.extend(span);
    let mut rs = vec![0x12, scope.len() as u8];
    rs.extend(scope);
    let mut req = vec![0x0a, rs.len() as u8];
    req.extend(rs);
    req
}

/// The admin side under abuse: span bombs and forged spans to the OTLP receiver, results
/// posted while the state files are swapped for a FIFO and a directory, and 70 trickled heads.
fn admin_abuse(
    admin: SocketAddr,
    state: std::path::PathBuf,
    shared: &Arc<Shared>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    let bomb = export_bytes(&span_bomb(), true);
    for _ in 0..2 {
        let (bomb, shared) = (bomb.clone(), Arc::clone(shared));
        tasks.push(tokio::spawn(async move {
            while !shared.stop_hostile.load(Ordering::Relaxed) {
                let status = admin_raw(admin, &bomb).await;
                shared.did("otlp_span_bomb");
                shared.got(status.map(|s| format!("admin {s}")));
            }
        }));
    }
    let shared2 = Arc::clone(shared);
    tasks.push(tokio::spawn(async move {
        let mut i = 0;
        while !shared2.stop_hostile.load(Ordering::Relaxed) {
            i += 1;
            let status = admin_raw(admin, &export_bytes(&forged_span(i), false)).await;
            shared2.did("otlp_forged_span");
            shared2.got(status.map(|s| format!("admin {s}")));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }));
    // The state files: rollbacks.jsonl a FIFO, verdicts.jsonl a directory; results posted on.
    let _ = std::fs::remove_file(state.join("rollbacks.jsonl"));
    let _ = std::process::Command::new("mkfifo")
        .arg(state.join("rollbacks.jsonl"))
        .status();
    let _ = std::fs::remove_file(state.join("verdicts.jsonl"));
    let _ = std::fs::create_dir(state.join("verdicts.jsonl"));
    let shared3 = Arc::clone(shared);
    tasks.push(tokio::spawn(async move {
        let mut i = 0u64;
        while !shared3.stop_hostile.load(Ordering::Relaxed) {
            i += 1;
            let body = format!(
                r#"{{"kind":"accuracy","suite":"s{}","route":"exp","control":"a","variants":[{{"variant":"a","value":0.9,"n":100}},{{"variant":"b","value":0.6,"n":100}}],"comparisons":[{{"variant":"b","difference":-0.3,"ci95":[-0.4,-0.2]}}]}}"#,
                i % 8
            );
            let req = format!(
                "POST /experiments/quality HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let status = admin_raw(admin, req.as_bytes()).await;
            shared3.did("quality_post");
            shared3.got(status.map(|s| format!("admin {s}")));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }));
    for _ in 0..70 {
        let shared = Arc::clone(shared);
        tasks.push(tokio::spawn(async move {
            while !shared.stop_hostile.load(Ordering::Relaxed) {
                let Ok(mut s) = TcpStream::connect(admin).await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                shared.did("admin_trickled_head");
                for b in b"GET /stats HTTP/1.1\r\nhost: x\r\nx-pad: ".iter().cycle() {
                    if shared.stop_hostile.load(Ordering::Relaxed)
                        || s.write_all(&[*b]).await.is_err()
                    {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }
        }));
    }
    tasks
}

/// `/healthz` every 100 ms, each on a new connection, as a kubelet probes: answered within 1 s
/// or not, and how long it took.
async fn probe(admin: SocketAddr, shared: Arc<Shared>) -> Latency {
    let mut lat = Latency::default();
    while !shared.stop_normal.load(Ordering::Relaxed) {
        let t0 = Instant::now();
        let ok = tokio::time::timeout(
            Duration::from_secs(1),
            admin_raw(
                admin,
                b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n",
            ),
        )
        .await;
        match ok {
            Ok(Some(s)) if s.ends_with("200") => {
                lat.ok += 1;
                lat.e2e.push(t0.elapsed().as_secs_f64() * 1e3);
            }
            _ => lat.failed += 1,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    lat
}

/// The value of every series of `names` on `/metrics`, by its line's name and labels.
async fn admin_metrics(admin: SocketAddr, names: &[&str]) -> BTreeMap<String, f64> {
    let mut s = match TcpStream::connect(admin).await {
        Ok(s) => s,
        Err(_) => return BTreeMap::new(),
    };
    let _ = s
        .write_all(b"GET /metrics HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n")
        .await;
    let mut text = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut text)).await;
    String::from_utf8_lossy(&text)
        .lines()
        .filter(|l| names.iter().any(|n| l.starts_with(n)))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect()
}

/// Runs the soak: `quiet` seconds of normal traffic alone, then `abuse` seconds with the hostile
/// clients and faulty-backend traffic. `normal` closed-loop clients, `silent_conns` idle sockets.
pub async fn run(quiet: f64, abuse: f64, normal: usize, silent_conns: usize) -> Report {
    let good = start_sim(Faults::default(), 1).await;
    let bad = start_sim(
        Faults {
            error_rate: 0.2,
            die_after_chunks: Some(6),
            malformed_rate: 0.05,
            ..Faults::default()
        },
        2,
    )
    .await;
    let dir = std::env::temp_dir().join(format!(
        "inferscope-abuse-{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("access.jsonl");
    let mute = mute_backend().await;
    let state = dir.join("state");
    let yaml = format!(
        "access_log: {{ path: {log:?} }}
state_dir: {state:?}
limits:
  client_idle_timeout: 2s
  header_read_timeout: 2s
  body_read_timeout: 2s
  max_connections: 4000
backends:
  - {{ name: good, url: \"http://{good}\", engine_spans: {{ wait: 50ms }} }}
  - {{ name: good2, url: \"http://{good}\" }}
  - {{ name: bad, url: \"http://{}\" }}
  - {{ name: mute, url: \"http://{mute}\" }}
routes:
  - {{ name: mute, match: {{ path_prefix: /mute }}, backends: [mute], timeouts: {{ first_token: 1s }} }}
  - {{ name: bad, match: {{ model: bad }}, backends: [bad], retry: {{ attempts: 0 }} }}
  - name: exp
    match: {{ model: exp }}
    experiment:
      name: a-vs-b
      min_samples: 10
      accept: {{ e2e_change_max: 50, accuracy_drop_max_points: 1 }}
      on_reject: fallback
      variants:
        - {{ name: a, backends: [good2], weight: 50, control: true }}
        - {{ name: b, backends: [good2], weight: 50 }}
  - {{ name: good, backends: [good] }}
",
        bad.addr,
        good = good.addr,
    );
    let config = inferscope::config::parse(&yaml, "abuse.yaml").unwrap();
    let gw = inferscope::app::start_local(config).await.unwrap();
    let addr = gw.data_addr;
    let shared = Arc::new(Shared::default());

    // Quiet phase.
    let t = Instant::now();
    let clients: Vec<_> = (0..normal)
        .map(|_| tokio::spawn(normal_client(addr, Arc::clone(&shared), "good")))
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(quiet)).await;
    shared.stop_normal.store(true, Ordering::Relaxed);
    let mut quiet_lat = Latency::default();
    for c in clients {
        merge(&mut quiet_lat, c.await.unwrap());
    }
    let quiet_secs = t.elapsed().as_secs_f64();
    let rss_before = rss_kib();

    // Abuse phase: the same normal clients, and everything else at once.
    shared.stop_normal.store(false, Ordering::Relaxed);
    let t = Instant::now();
    let clients: Vec<_> = (0..normal)
        .map(|_| tokio::spawn(normal_client(addr, Arc::clone(&shared), "good")))
        .collect();
    let faulty: Vec<_> = (0..4)
        .map(|_| tokio::spawn(normal_client(addr, Arc::clone(&shared), "bad")))
        .collect();
    // Traffic for the experiment whose verdict is judged (and kept) every second.
    let judged: Vec<_> = (0..2)
        .map(|_| tokio::spawn(normal_client(addr, Arc::clone(&shared), "exp")))
        .collect();
    let admin = gw.admin_addr;
    let probes = tokio::spawn(probe(admin, Arc::clone(&shared)));
    let mut hostile = Vec::new();
    for _ in 0..silent_conns {
        hostile.push(tokio::spawn(silent(addr, Arc::clone(&shared))));
    }
    for _ in 0..20 {
        hostile.push(tokio::spawn(trickler(addr, Arc::clone(&shared))));
        hostile.push(tokio::spawn(paced_uploader(addr, Arc::clone(&shared))));
    }
    for _ in 0..2 {
        hostile.push(tokio::spawn(zero_window_h2(addr, Arc::clone(&shared))));
    }
    for _ in 0..4 {
        hostile.push(tokio::spawn(hung_upgrade(addr, Arc::clone(&shared))));
    }
    let mut many = String::from("GET /v1/models HTTP/1.1\r\nhost: gw\r\n");
    for i in 0..300 {
        many.push_str(&format!("x-h{i}: v\r\n"));
    }
    many.push_str("\r\n");
    let huge_model = chat(&"m".repeat(256 << 10), false, 2);
    let deep = format!(
        r#"{{"model":"good","messages":[],"x":{}{}}}"#,
        "[".repeat(500),
        "]".repeat(500)
    );
    let spoof = "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\nx-inferscope-shadow: 1\r\nx-inferscope-request-id: forged\r\nconnection: close\r\ncontent-length: ";
    let spoof_body = chat("good", false, 2);
    let actions: Vec<(&'static str, Vec<u8>)> = vec![
        ("header_flood", many.into_bytes()),
        (
            "smuggling",
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-length: 5\r\ncontent-length: 7\r\n\r\nhello".to_vec(),
        ),
        ("huge_model_name", post_bytes(&huge_model)),
        ("deep_json", post_bytes(&deep)),
        (
            "spoofed_headers",
            format!("{spoof}{}\r\n\r\n{spoof_body}", spoof_body.len()).into_bytes(),
        ),
    ];
    for (what, bytes) in actions {
        hostile.push(tokio::spawn(repeat(addr, Arc::clone(&shared), what, bytes)));
    }
    hostile.extend(admin_abuse(admin, state.clone(), &shared));
    tokio::time::sleep(Duration::from_secs_f64(abuse)).await;
    shared.stop_normal.store(true, Ordering::Relaxed);
    let mut abused_lat = Latency::default();
    for c in clients {
        merge(&mut abused_lat, c.await.unwrap());
    }
    let mut faulty_lat = Latency::default();
    for c in faulty {
        merge(&mut faulty_lat, c.await.unwrap());
    }
    for c in judged {
        c.await.unwrap();
    }
    let abuse_secs = t.elapsed().as_secs_f64();
    let rss_after = rss_kib();
    let probes = probes.await.unwrap();
    let admin_counts = admin_metrics(
        admin,
        &[
            "inferscope_otlp_exports_total",
            "inferscope_state_writes_total",
            "inferscope_admin_connections_evicted_total",
            "inferscope_engine_span_values_out_of_range_total",
            "inferscope_engine_spans_dropped_total",
        ],
    )
    .await;
    shared.stop_hostile.store(true, Ordering::Relaxed);
    for h in hostile {
        let _ = tokio::time::timeout(Duration::from_secs(40), h).await;
    }
    gw.shutdown();
    gw.wait().await;

    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let mut outcomes = BTreeMap::new();
    let mut logged = 0;
    for line in text.lines() {
        logged += 1;
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let key = format!(
            "{}/{}",
            v["outcome"].as_str().unwrap_or("?"),
            v["error"].as_str().unwrap_or("-")
        );
        *outcomes.entry(key).or_default() += 1;
    }
    let _ = std::fs::remove_dir_all(&dir);
    let hostile_counts = shared.hostile.lock().clone();
    let statuses = shared.statuses.lock().clone();
    Report {
        quiet: quiet_lat,
        abused: abused_lat,
        faulty: (faulty_lat.ok, faulty_lat.failed),
        hostile: hostile_counts,
        hostile_status: statuses,
        requests: shared.requests.load(Ordering::Relaxed),
        logged,
        outcomes,
        rss_kib: (rss_before, rss_after),
        seconds: (quiet_secs, abuse_secs),
        probes,
        admin_counts,
    }
}

fn merge(into: &mut Latency, l: Latency) {
    into.ok += l.ok;
    into.failed += l.failed;
    into.ttfb.extend(l.ttfb);
    into.e2e.extend(l.e2e);
}
