//! Shared test harness: an in-process gateway and simulator on real loopback sockets (port 0), a
//! plain HTTP client that timestamps every frame it receives, and a scripted raw-socket backend
//! for responses the simulator does not produce (errors, broken streams).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod harness;
pub mod meter;
pub mod otlp;
pub mod pki;
pub mod prom;

use bytes::Bytes;
use http::{HeaderMap, Request};
use http_body_util::{BodyExt, Full};
use inferscope::app::{self, Running};
use inferscope::config;
use inferscope::sim::{self, Profile, SimHandle, SimOptions};
use serde_json::Value;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// An address where nothing listens: connecting is refused at once. (A port freed by a test
/// could be taken by another test running at the same time; port 1 is never bound here.)
pub const DEAD: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::LOCALHOST,
    1,
));

/// A file under the repository's `data/` (datasets and corpora shipped with the project).
pub fn data_file(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("data")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The path of a file or directory under the repository's `data/`, as a program argument.
pub fn data_file_path(name: &str) -> String {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("data")
        .join(name)
        .display()
        .to_string()
}

/// The first of `names` on `PATH`, for a second-lane test (`#[ignore = "needs …"]`, run by
/// `cargo test -- --ignored` and `.ci/run`). Absent, the test fails: a lane that asked for a
/// program and found none must not pass.
pub fn program(names: &[&str], install: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    names
        .iter()
        .flat_map(|name| dirs.iter().map(move |d| d.join(name)))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("this test needs {names:?} on PATH ({install}; .ci/run does)"))
}

/// A small tmpfs mounted for a lane-2 test (`#[ignore = "needs root: …"]`), unmounted on drop.
/// Where this process may not mount one, the test fails: it was asked for.
pub struct SmallDisk(pub PathBuf);

impl SmallDisk {
    pub fn mount(kib: usize) -> Self {
        let dir = temp_dir().join("disk");
        std::fs::create_dir_all(&dir).unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={kib}k"), "tmpfs"])
            .arg(&dir)
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "this test needs to mount a tmpfs (root; .ci/run runs as root)"
        );
        Self(dir)
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// A fresh, empty directory for one test's files.
pub fn temp_dir() -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let d = std::env::temp_dir().join(format!(
        "inferscope-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A simulator with exact timing (no jitter) unless the profile says otherwise, recording truth.
pub async fn start_sim(profile: Profile, seed: u64) -> SimHandle {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut opts = SimOptions::new(profile);
    opts.seed = seed;
    opts.record_truth = true;
    sim::spawn(listener, opts, std::future::pending()).unwrap()
}

/// A quick, exact profile: TTFT `ttft_ms`, TPOT `tpot_ms`, no jitter, no batching effect.
pub fn exact(ttft_ms: f64, tpot_ms: f64) -> Profile {
    Profile {
        jitter: 0.0,
        batch_slowdown: 0.0,
        ttft_base_ms: ttft_ms,
        prefill_per_token_ms: 0.0,
        tpot_ms,
        ..Profile::fp16()
    }
}

/// A gateway in front of `backends` (name → address), one route `main` for every path, the
/// access log in `dir`. `extra` is appended to the YAML (e.g. `limits:`).
pub async fn start_gateway(
    backends: &[(&str, SocketAddr)],
    dir: &std::path::Path,
    extra: &str,
) -> Running {
    let mut yaml = format!(
        "access_log: {{ path: {:?} }}\nbackends:\n",
        dir.join("access.jsonl")
    );
    for (name, addr) in backends {
        yaml.push_str(&format!("  - {{ name: {name}, url: \"http://{addr}\" }}\n"));
    }
    let names: Vec<&str> = backends.iter().map(|b| b.0).collect();
    yaml.push_str(&format!(
        "routes:\n  - name: main\n    backends: [{}]\n",
        names.join(", ")
    ));
    yaml.push_str(extra);
    start_yaml(&yaml).await
}

/// A gateway from YAML text, on ephemeral ports.
pub async fn start_yaml(yaml: &str) -> Running {
    let cfg = config::parse(yaml, "test.yaml").unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    app::start_local(cfg).await.unwrap()
}

/// Shuts the gateway down (which flushes the access log) and returns the log's lines.
pub async fn stop_and_read_log(running: Running, dir: &std::path::Path) -> Vec<Value> {
    running.shutdown();
    assert!(running.wait().await, "gateway did not drain in time");
    let text = std::fs::read_to_string(dir.join("access.jsonl")).unwrap_or_default();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// What a client saw.
#[derive(Debug)]
pub struct Received {
    pub status: u16,
    pub headers: HeaderMap,
    /// Every body frame with the instant it arrived.
    pub frames: Vec<(Instant, Bytes)>,
    /// Instant just before the request was written.
    pub t_send: Instant,
    /// The unread rest of the body when reading stopped early (kept open while this lives).
    pub rest: Option<hyper::body::Incoming>,
    /// The body ended in an error (the server aborted it) rather than cleanly.
    pub aborted: bool,
}

impl Received {
    pub fn body(&self) -> Vec<u8> {
        self.frames.iter().flat_map(|f| f.1.to_vec()).collect()
    }

    /// Instant at which the client had received the first `n` body bytes.
    pub fn time_of_byte(&self, n: usize) -> Option<Instant> {
        let mut seen = 0;
        for (t, b) in &self.frames {
            seen += b.len();
            if seen >= n {
                return Some(*t);
            }
        }
        None
    }
}

/// A client connection (HTTP/1.1 over a fresh loopback TCP connection).
pub struct Client {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    conn: JoinHandle<()>,
    /// `Host` sent: the address connected to.
    host: String,
}

impl Client {
    pub async fn connect(addr: SocketAddr) -> Self {
        let stream = TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let mut c = Self::over(stream).await;
        c.host = addr.to_string();
        c
    }

    /// HTTP/1.1 over an established connection (e.g. TLS).
    pub async fn over<I>(io: I) -> Self
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io))
                .await
                .unwrap();
        let conn = tokio::spawn(async move {
            let _ = conn.await;
        });
        Self {
            sender,
            conn,
            host: "localhost".into(),
        }
    }

    fn request(
        &self,
        method: &str,
        path: &str,
        body: Bytes,
        headers: &[(&str, &str)],
    ) -> Request<Full<Bytes>> {
        let mut b = Request::builder().method(method).uri(path);
        let has = |name: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name));
        if !has("host") {
            b = b.header("host", &self.host);
        }
        if !body.is_empty() && !has("content-type") {
            b = b.header("content-type", "application/json");
        }
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(Full::new(body)).unwrap()
    }

    /// Sends a request and reads the whole response, timestamping frames.
    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        body: &str,
        headers: &[(&str, &str)],
    ) -> Received {
        self.send_until(method, path, body, headers, usize::MAX)
            .await
    }

    /// Like `send`, but stops reading after `max_frames` body frames (the rest stays unread).
    pub async fn send_until(
        &mut self,
        method: &str,
        path: &str,
        body: &str,
        headers: &[(&str, &str)],
        max_frames: usize,
    ) -> Received {
        let req = self.request(method, path, Bytes::from(body.to_owned()), headers);
        self.send_request(req, max_frames).await
    }

    /// Sends `body` as it is (bytes, any content type: `content-type` in `headers`).
    pub async fn send_bytes(
        &mut self,
        method: &str,
        path: &str,
        body: Bytes,
        headers: &[(&str, &str)],
    ) -> Received {
        let req = self.request(method, path, body, headers);
        self.send_request(req, usize::MAX).await
    }

    async fn send_request(&mut self, req: Request<Full<Bytes>>, max_frames: usize) -> Received {
        self.sender.ready().await.unwrap();
        let t_send = Instant::now();
        let resp = self.sender.send_request(req).await.unwrap();
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let mut body = resp.into_body();
        let mut frames = Vec::new();
        let mut rest = None;
        let mut aborted = false;
        loop {
            if frames.len() >= max_frames {
                rest = Some(body);
                break;
            }
            match body.frame().await {
                Some(Ok(f)) => {
                    let now = Instant::now();
                    if let Ok(d) = f.into_data() {
                        frames.push((now, d));
                    }
                }
                Some(Err(_)) => {
                    aborted = true;
                    break;
                }
                None => break,
            }
        }
        Received {
            status,
            headers,
            frames,
            t_send,
            rest,
            aborted,
        }
    }

    /// Closes the TCP connection at once.
    pub fn abort(self) {
        self.conn.abort();
        drop(self.sender);
    }
}

/// An h2c (prior knowledge) connection to `addr`, driven in the background.
pub async fn h2_connect(addr: SocketAddr) -> hyper::client::conn::http2::SendRequest<Full<Bytes>> {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    send
}

/// One request on a fresh connection.
pub async fn post(addr: SocketAddr, path: &str, body: &str, headers: &[(&str, &str)]) -> Received {
    Client::connect(addr)
        .await
        .send("POST", path, body, headers)
        .await
}

/// A chat completion of `max_tokens` through `addr`, asserted answered 200.
pub async fn chat_ok(addr: SocketAddr, stream: bool, max_tokens: u32) -> Received {
    let r = post(
        addr,
        "/v1/chat/completions",
        &chat(stream, max_tokens, ""),
        &[],
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body()));
    r
}

/// GET `path` on the admin listener and parse JSON (or return text as a JSON string).
pub async fn admin_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let r = Client::connect(addr).await.send("GET", path, "", &[]).await;
    (r.status, String::from_utf8(r.body()).unwrap())
}

/// The value of an unlabelled series `name` on the admin listener's `/metrics` (0 when absent).
pub async fn metric(admin: SocketAddr, name: &str) -> f64 {
    let (_, text) = admin_get(admin, "/metrics").await;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

/// Requests the gateway has recorded (every outcome): the sum of `inferscope_requests_total`.
/// The recorder counts a record in the statistics after its observers (the rate limiter's
/// charge, the routing observer) have seen it, so a count that includes a request means those
/// have too.
pub async fn recorded(admin: SocketAddr) -> u64 {
    let (_, text) = admin_get(admin, "/metrics").await;
    text.lines()
        .filter(|l| l.starts_with("inferscope_requests_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.trim().parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Polls `check` every 20 ms until it holds; panics naming `what` after `limit`. (Tests wait on
/// a condition, never on a sleep.)
pub async fn until<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(Instant::now() < deadline, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The `/stats` entry of backend `name` (health, ejection, in-flight).
pub async fn backend_stats(admin: SocketAddr, name: &str) -> Value {
    let (_, stats) = admin_get(admin, "/stats").await;
    let stats: Value = serde_json::from_str(&stats).unwrap();
    stats["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["backend"] == name)
        .unwrap_or_else(|| panic!("no backend {name} in {stats}"))
        .clone()
}

/// Runs the `inferscope` binary with `args` and then `file`; panics with its stderr unless it
/// succeeds.
pub fn run_cli(args: &[&str], file: &std::path::Path) -> std::process::Output {
    let mut all: Vec<&str> = args.to_vec();
    all.push(file.to_str().unwrap());
    inferscope(&all)
}

/// Runs the `inferscope` binary with `args`; panics with its stderr unless it succeeds.
pub fn inferscope(args: &[&str]) -> std::process::Output {
    succeeds(std::process::Command::new(env!("CARGO_BIN_EXE_inferscope")).args(args))
}

/// Runs `cmd` to its end; panics with its stderr unless it succeeds.
pub fn succeeds(cmd: &mut std::process::Command) -> std::process::Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The comparison of `variant` on `metric` in an `/experiments` document (its first experiment)
/// or a `report --json` document.
pub fn comparison(doc: &Value, variant: &str, metric: &str) -> Value {
    let list = if doc["experiments"].is_array() {
        &doc["experiments"][0]["comparisons"]
    } else {
        &doc["comparisons"]
    };
    list.as_array()
        .unwrap()
        .iter()
        .find(|c| c["variant"] == variant && c["metric"] == metric)
        .unwrap_or_else(|| panic!("no {variant} {metric} comparison in {doc}"))
        .clone()
}

/// A chat request body.
pub fn chat(stream: bool, max_tokens: u32, extra: &str) -> String {
    format!(
        r#"{{"model":"demo","stream":{stream},"max_tokens":{max_tokens},"messages":[{{"role":"user","content":"say something short"}}]{extra}}}"#
    )
}

/// A backend that answers every connection with `response` (raw HTTP/1.1 bytes, written in the
/// given pieces with `gap` between them), then closes. A real server on a real socket, for
/// responses the simulator does not make.
pub async fn start_raw(pieces: Vec<Vec<u8>>, gap: Duration) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let pieces = pieces.clone();
            tokio::spawn(async move {
                read_request(&mut s).await;
                for (i, p) in pieces.iter().enumerate() {
                    if i > 0 {
                        tokio::time::sleep(gap).await;
                    }
                    if s.write_all(p).await.is_err() {
                        return;
                    }
                }
                let _ = s.shutdown().await;
            });
        }
    });
    addr
}

/// Reads one request (head and `Content-Length` body) and returns its head, lower-cased.
pub async fn read_request(s: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let Ok(n) = s.read(&mut chunk).await else {
            return String::new();
        };
        if n == 0 {
            return String::new();
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                return head;
            }
        }
    }
}

/// A chunked SSE response head.
pub const SSE_HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";

/// One HTTP/1.1 chunk holding `data`.
pub fn chunk(data: &[u8]) -> Vec<u8> {
    let mut v = format!("{:x}\r\n", data.len()).into_bytes();
    v.extend_from_slice(data);
    v.extend_from_slice(b"\r\n");
    v
}

/// Milliseconds field of a log line, as a Duration.
pub fn ms(v: &Value, key: &str) -> Duration {
    Duration::from_secs_f64(
        v[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key} missing in {v}"))
            / 1000.0,
    )
}

/// Sends `sig` (`-HUP`, `-TERM`…) to `pid`.
pub fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

/// Starts the binary on the config at `path`; returns the child, data and admin addresses.
pub fn serve(
    path: &std::path::Path,
) -> (
    std::process::Child,
    std::net::SocketAddr,
    std::net::SocketAddr,
) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_inferscope"));
    cmd.stderr(std::process::Stdio::null());
    serve_with(cmd, path)
}

/// `serve` through `cmd` (the binary, or a wrapper such as `prlimit` with the binary as its
/// first argument, and the stderr wanted).
pub fn serve_with(
    mut cmd: std::process::Command,
    path: &std::path::Path,
) -> (
    std::process::Child,
    std::net::SocketAddr,
    std::net::SocketAddr,
) {
    use std::io::BufRead as _;
    let mut child = cmd
        .args(["serve", "--config"])
        .arg(path)
        .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let field = |k: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .unwrap()
            .parse::<std::net::SocketAddr>()
            .unwrap()
    };
    (child, field("data="), field("admin="))
}
