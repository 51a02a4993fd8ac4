//! End-to-end comparison, in one run on one machine: the simulator directly, through inferscope
//! (HTTP/1.1 upstream, and HTTP/2 upstream as `inferscope-h2`), and through nginx
//! (`proxy_buffering off`, HTTP/1.1 keep-alive upstream). Every party is its own
//! process: the proxy under test pinned to core 0, the simulator and the load generator
//! (`inferscope bench`) to core 1, so both proxies get the same core and nothing else on it.
//!
//! Phases (each repeated `ROUNDS` times, the order of the targets rotated per round; a
//! figure is the median over rounds of the per-round value). Each run first sends warm-up
//! requests (about as many as it keeps open at once), left out of the report; the proxy's CPU
//! is counted over them and the measured ones, and CPU per request divides by both:
//! 1. latency: closed loop at concurrency 1, 64 and 512, streams of 64 chunks 20 ms apart; added
//!    TTFT and added inter-chunk gap (p50, p99) = proxied minus direct in the same round; proxy CPU
//!    time per request (in phases 1–4 also the user-space share of it, `cpu_user_share`, from
//!    the utime and stime ticks) and RSS;
//! 2. open loop at 1,000 req/s (Poisson), streams of 16 chunks 20 ms apart: added TTFT p50/p99;
//! 3. throughput: closed loop at concurrency 64 against a simulator that does not wait (64 chunks
//!    written back to back): requests/s and proxy CPU per request;
//! 4. the same throughput run with each proxy capped to `CAP_PCT`% of one core (cgroup v1 CPU
//!    quota), so the proxy is the bottleneck: requests/s on the same share of a core;
//!    `short` (not in the default set): both again with 16-chunk streams, where the fixed cost
//!    of a request (head, body inspection, routing, record, log line) weighs most;
//! 5. `paired` (not in the default set): two proxies at the same time on the same core, each
//!    with its own open-loop client, streams of 1, 16 and 64 chunks 20 ms apart (1,000 req/s;
//!    250 for 64 chunks): the ratio of their CPU per request, round by round (`PAIRS`, default
//!    `nginx:inferscope`; `PAIRED_TOKENS`);
//! 6. concurrent streams: `STREAMS` (default 10,000) streams held at once, 16 chunks 1 s apart,
//!    over HTTP/2 from the client (100 streams per connection) and HTTP/1.1 upstream (HTTP/2 for
//!    `inferscope-h2`): peak proxy RSS and how many completed.
//!
//! Run: `cargo bench --bench e2e_compare` (needs `nginx` and `taskset` on PATH; environment:
//! `KERNEL_CLOCK` (true: the gateway's `limits.kernel_clock`), `ROUNDS` (3), `RATE_ROUNDS` (5, the open-loop phase), `LEVELS` (1,64,512), `STREAMS` (10000), `PHASES` (latency,rate,throughput,capped,streams; also short, paired), `CAP_PCT` (25),
//! `TARGETS` (direct,inferscope,inferscope-h2,nginx: `inferscope-h2` is inferscope with HTTP/2
//! upstream connections, h2c with prior knowledge; `inferscope-base` is the build `BASE_BIN`
//! names, in the default set when it is given, for before/after tables from one run;
//! `vllm-router`, `smg` and `tensorzero`, not in the default set, are the LLM routers from PyPI
//! (`pip install vllm-router smg tensorzero`, on `PATH`; `ROUTER_PYTHON` is the Python that has
//! `tensorzero`), one Tokio worker each on the proxies' core), `PIN`
//! (1), `PROXY_BIN` (another inferscope build as the proxy under test; the simulator and client
//! stay this build's), `PROXY_CORES` (`0`: the cores the proxies are pinned to, e.g. `0,1` to
//! give them both while the client and simulator keep core 1) and `PROXY_WORKERS` (1: Tokio
//! worker threads of inferscope and the routers, nginx worker processes)). Writes the table to
//! stdout and everything to `target/e2e_compare.json`.
//!
//! Without `PROXY_BIN`, the `inferscope` target is the binary `cargo bench` builds, which has the
//! dev-dependencies' features unified into it (tokio's `test-util`: one atomic load more per
//! Tokio clock read). For a before/after table against a `BASE_BIN` built by `cargo build
//! --release`, give the after build the same way as `PROXY_BIN`.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_inferscope");

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_port(port: u16) {
    let t0 = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "port {port} never opened"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A command pinned to `core` (when pinning is on); the proxies' core 0 stands for the cores
/// `PROXY_CORES` names (default `0`).
fn pinned(core: u32, program: &str) -> Command {
    if env_or("PIN", "1") == "1" {
        let cores = if core == 0 {
            env_or("PROXY_CORES", "0")
        } else {
            core.to_string()
        };
        let mut c = Command::new("taskset");
        c.args(["-c", &cores, program]);
        c
    } else {
        Command::new(program)
    }
}

/// Worker threads (Tokio) or processes (nginx) each proxy runs: `PROXY_WORKERS` (1).
fn proxy_workers() -> String {
    env_or("PROXY_WORKERS", "1")
}

struct Proc {
    child: Child,
}

impl Proc {
    /// The process and its children (nginx: master and worker).
    fn pids(&self) -> Vec<u32> {
        let root = self.child.id();
        let mut pids = vec![root];
        if let Ok(dir) = std::fs::read_dir("/proc") {
            for e in dir.flatten() {
                let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                    continue;
                };
                if parent(pid) == Some(root) {
                    pids.push(pid);
                }
            }
        }
        pids
    }
    /// CPU seconds the process tree's threads have run (`/proc/PID/task/TID/schedstat`,
    /// nanoseconds, so short runs resolve; the 10 ms ticks of `/proc/PID/stat` would not).
    fn cpu_s(&self) -> f64 {
        let mut ns = 0u64;
        for pid in self.pids() {
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
                continue;
            };
            for t in tasks.flatten() {
                let s = std::fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
                ns += s
                    .split_whitespace()
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
        ns as f64 / 1e9
    }
    /// User and system CPU ticks of the process tree (`/proc/PID/stat` utime, stime): the split
    /// of `cpu_s` between the program and the kernel working for it.
    fn ticks(&self) -> (u64, u64) {
        let (mut user, mut sys) = (0, 0);
        for pid in self.pids() {
            let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            let Some(end) = s.rfind(')') else {
                continue;
            };
            // After the parenthesised command name, from field 3 (state): utime is field 14,
            // stime field 15.
            let mut f = s[end + 2..].split_whitespace().skip(11);
            user += f.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            sys += f.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        }
        (user, sys)
    }
    /// (current RSS, peak RSS) of the process tree, MiB.
    fn rss_mib(&self) -> (f64, f64) {
        let (mut now, mut peak) = (0.0, 0.0);
        for pid in self.pids() {
            let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
                continue;
            };
            for line in s.lines() {
                let kb = |l: &str| {
                    l.split_whitespace()
                        .nth(1)
                        .and_then(|v| v.parse::<f64>().ok())
                        .unwrap_or(0.0)
                        / 1024.0
                };
                if line.starts_with("VmRSS:") {
                    now += kb(line);
                } else if line.starts_with("VmHWM:") {
                    peak += kb(line);
                }
            }
        }
        (now, peak)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The parent of `pid`, from `/proc/PID/stat`.
fn parent(pid: u32) -> Option<u32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the parenthesised command name: state, ppid, …
    s[s.rfind(')')? + 2..]
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// A simulator on core 1: the first token after `ttft_ms`, then one every `tpot_ms`, exactly (no
/// jitter: a proxy's added milliseconds must not drown in the backend's own variation; streams
/// started together stay in step, as a batching engine's do).
fn sim(dir: &Path, name: &str, ttft_ms: f64, tpot_ms: f64) -> (Proc, u16) {
    let port = free_port();
    let profile = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &profile,
        format!(
            "name: {name}\nttft_base_ms: {ttft_ms}\ntpot_ms: {tpot_ms}\njitter: 0\n\
             batch_slowdown: 0\nprefill_per_token_ms: 0\n"
        ),
    )
    .unwrap();
    let mut cmd = pinned(1, BIN);
    cmd.args(["sim", "--listen", &format!("127.0.0.1:{port}")])
        .arg("--profile")
        .arg(&profile);
    (start(cmd, port), port)
}

/// Starts `cmd` with its output discarded and waits until it listens on `port`.
fn start(mut cmd: Command, port: u16) -> Proc {
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_port(port);
    Proc { child }
}

/// inferscope as target `t`: this build with HTTP/1.1 upstream connections (`inferscope`) or
/// HTTP/2 ones (`inferscope-h2`: h2c with prior knowledge), or the build `BASE_BIN` names with
/// HTTP/1.1 (`inferscope-base`, the "before" of a before/after comparison in one run).
fn inferscope(dir: &Path, upstream: u16, t: Target) -> (Proc, u16) {
    let (port, admin) = (free_port(), free_port());
    let name = t.name();
    let http2 = t == Target::InferscopeH2;
    let cfg = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &cfg,
        format!(
            "listen: 127.0.0.1:{port}\nadmin: {{ listen: 127.0.0.1:{admin} }}\n\
             access_log: {{ path: {:?} }}\nlimits: {{ max_concurrent_requests: 50000, kernel_clock: {} }}\n\
             backends:\n  - {{ name: sim, url: \"http://127.0.0.1:{upstream}\", http2: {http2} }}\n\
             routes:\n  - {{ name: all, backends: [sim] }}\n",
            dir.join(format!("{name}-access.jsonl")),
            env_or("KERNEL_CLOCK", "true")
        ),
    )
    .unwrap();
    // `PROXY_BIN` runs another build as the proxy under test (measured against nginx and the
    // same client); `BASE_BIN` is the build of the `inferscope-base` target.
    let bin = if t == Target::Baseline {
        std::env::var("BASE_BIN").expect("the inferscope-base target needs BASE_BIN")
    } else {
        std::env::var("PROXY_BIN").unwrap_or_else(|_| BIN.to_string())
    };
    let mut cmd = pinned(0, &bin);
    cmd.arg("serve")
        .arg("--config")
        .arg(&cfg)
        // One core, one worker: the same share nginx gets with one worker process.
        .env("TOKIO_WORKER_THREADS", proxy_workers())
        .env("RUST_LOG", "warn");
    (start(cmd, port), port)
}

/// An LLM router from PyPI as target `t`, on core 0 with one Tokio worker, in front of the
/// simulator; ready once a streamed request through it succeeds (smg registers its worker in
/// the background after it listens). The programs come from `PATH` (`vllm-router`, `smg`) or,
/// for TensorZero, whose HTTP gateway only its Python client starts (`_start_http_gateway`, a
/// private function), from `ROUTER_PYTHON` (default `python3`) with the `tensorzero` package.
fn router(dir: &Path, upstream: u16, t: Target) -> (Proc, u16) {
    let (port, metrics) = (free_port(), free_port());
    let worker = format!("http://127.0.0.1:{upstream}");
    let common = |c: &mut Command| {
        c.env("TOKIO_WORKER_THREADS", proxy_workers())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
    };
    let (proc, port) = match t {
        Target::VllmRouter | Target::Smg => {
            // No admission bound: the others have none (10,000 streams are held at once).
            let (program, own): (&str, &[&str]) = if t == Target::Smg {
                ("smg", &["launch", "--max-concurrent-requests", "0"])
            } else {
                (
                    "vllm-router",
                    &[
                        "--max-concurrent-requests",
                        "1000000",
                        "--log-level",
                        "warning",
                    ],
                )
            };
            let mut c = pinned(0, program);
            c.args(own)
                .args(["--host", "127.0.0.1", "--port", &port.to_string()])
                .args(["--prometheus-host", "127.0.0.1"])
                .args(["--prometheus-port", &metrics.to_string()])
                .args(["--worker-urls", &worker, "--policy", "round_robin"]);
            common(&mut c);
            let child = c
                .spawn()
                .unwrap_or_else(|e| panic!("{}: {e} (pip install vllm-router smg)", t.name()));
            (Proc { child }, port)
        }
        _ => {
            let d = dir.join("tensorzero");
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(
                d.join("tensorzero.toml"),
                format!(
                    "[models.demo]\nrouting = [\"sim\"]\n\n[models.demo.providers.sim]\n\
                     type = \"openai\"\napi_base = \"{worker}/v1/\"\nmodel_name = \"demo\"\n\
                     api_key_location = \"none\"\n"
                ),
            )
            .unwrap();
            std::fs::write(
                d.join("gateway.py"),
                "import sys, time, tensorzero\n\
                 gw = tensorzero._start_http_gateway(config_file=sys.argv[1], clickhouse_url=None,\n\
                 \x20   postgres_url=None, valkey_url=None, async_setup=False)\n\
                 open(sys.argv[2], \"w\").write(gw.base_url + \"\\n\")\n\
                 while True:\n    time.sleep(3600)\n",
            )
            .unwrap();
            let url_file = d.join("base_url");
            let _ = std::fs::remove_file(&url_file);
            let mut c = pinned(0, &env_or("ROUTER_PYTHON", "python3"));
            c.arg(d.join("gateway.py"))
                .arg(d.join("tensorzero.toml"))
                .arg(&url_file);
            common(&mut c);
            let child = c.spawn().unwrap();
            // It picks its own port and writes its base URL: http://127.0.0.1:PORT/openai/v1.
            let t0 = Instant::now();
            let line = loop {
                match std::fs::read_to_string(&url_file) {
                    Ok(l) if l.ends_with('\n') => break l,
                    _ if t0.elapsed() > Duration::from_secs(30) => {
                        panic!("tensorzero never started (pip install tensorzero)")
                    }
                    _ => std::thread::sleep(Duration::from_millis(50)),
                }
            };
            let port = line
                .trim()
                .strip_prefix("http://127.0.0.1:")
                .and_then(|r| r.split('/').next()?.parse().ok())
                .unwrap_or_else(|| panic!("tensorzero wrote {line:?}"));
            (Proc { child }, port)
        }
    };
    wait_port(port);
    wait_streams(port, t);
    (proc, port)
}

/// Waits until a streamed chat completion through `port` answers 200.
fn wait_streams(port: u16, t: Target) {
    use std::io::{Read, Write};
    let body = format!(
        r#"{{"model":"{}","messages":[{{"role":"user","content":"hi"}}],"stream":true,"max_tokens":2}}"#,
        t.model()
    );
    let req = format!(
        "POST {}/v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        t.prefix(),
        body.len()
    );
    let t0 = Instant::now();
    loop {
        let mut head = [0u8; 12];
        let ok = std::net::TcpStream::connect(("127.0.0.1", port))
            .and_then(|mut s| {
                s.write_all(req.as_bytes())?;
                s.read_exact(&mut head)
            })
            .is_ok();
        if ok && head.ends_with(b"200") {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{} never streamed: {:?}",
            t.name(),
            String::from_utf8_lossy(&head)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// nginx with one worker on core 0; HTTP/1.1 on `port`, HTTP/2 with prior knowledge on `h2`.
fn nginx(dir: &Path, upstream: u16) -> (Proc, u16, u16) {
    let (port, h2) = (free_port(), free_port());
    let d = dir.join("nginx");
    std::fs::create_dir_all(d.join("tmp")).unwrap();
    let conf = format!(
        r#"worker_processes {workers};
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
worker_rlimit_nofile 19000;
events {{ worker_connections 18000; multi_accept on; }}
http {{
    access_log {d}/access.log combined buffer=64k flush=1s;
    client_body_temp_path {d}/tmp/body;
    proxy_temp_path {d}/tmp/proxy;
    fastcgi_temp_path {d}/tmp/fastcgi;
    uwsgi_temp_path {d}/tmp/uwsgi;
    scgi_temp_path {d}/tmp/scgi;
    tcp_nodelay on;
    keepalive_requests 10000000;
    keepalive_timeout 300s;
    http2_max_concurrent_streams 128;
    upstream sim {{
        server 127.0.0.1:{upstream};
        keepalive 1024;
        keepalive_requests 10000000;
    }}
    server {{
        listen 127.0.0.1:{port} reuseport;
        listen 127.0.0.1:{h2} http2;
        location / {{
            proxy_pass http://sim;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 300s;
        }}
    }}
}}
"#,
        d = d.display(),
        workers = proxy_workers()
    );
    let path = d.join("nginx.conf");
    std::fs::write(&path, conf).unwrap();
    let child = pinned(0, "nginx")
        .arg("-p")
        .arg(&d)
        .arg("-c")
        .arg(&path)
        .arg("-e")
        .arg(d.join("error.log"))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("nginx not found: apt-get install nginx-light");
    wait_port(port);
    wait_port(h2);
    (Proc { child }, port, h2)
}

/// One `inferscope bench` run on core 1 against target `t` on `port`; its JSON report.
fn client(dir: &Path, t: Target, port: u16, args: &[String]) -> Value {
    // One report file per target: the paired phase runs two clients at once.
    let out = dir.join(format!("client-{}.json", t.name()));
    let _ = std::fs::remove_file(&out);
    let status = pinned(1, BIN)
        .args([
            "bench",
            "--url",
            &format!("http://127.0.0.1:{port}{}", t.prefix()),
        ])
        .args(["--model", t.model()])
        .args(["--input-words", "16"])
        // Failures are data here (each phase reports them), not a reason to stop.
        .args(["--max-error-rate", "1"])
        .args(args)
        .arg("--out")
        .arg(&out)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "inferscope bench failed");
    serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap()
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[derive(Clone, Copy, PartialEq)]
enum Target {
    Direct,
    Inferscope,
    /// inferscope with HTTP/2 (h2c) upstream connections.
    InferscopeH2,
    /// The `BASE_BIN` build of inferscope, HTTP/1.1 upstream.
    Baseline,
    Nginx,
    /// The LLM routers a user would otherwise deploy (PyPI: `vllm-router`, `smg` (SGLang's
    /// router, renamed), `tensorzero`), on the same core as the proxies.
    VllmRouter,
    Smg,
    TensorZero,
}

impl Target {
    const ALL: [Target; 8] = [
        Target::Direct,
        Target::Baseline,
        Target::Inferscope,
        Target::InferscopeH2,
        Target::Nginx,
        Target::VllmRouter,
        Target::Smg,
        Target::TensorZero,
    ];

    fn name(self) -> &'static str {
        match self {
            Target::Direct => "direct",
            Target::Inferscope => "inferscope",
            Target::InferscopeH2 => "inferscope-h2",
            Target::Baseline => "inferscope-base",
            Target::Nginx => "nginx",
            Target::VllmRouter => "vllm-router",
            Target::Smg => "smg",
            Target::TensorZero => "tensorzero",
        }
    }

    /// The model the client asks for: TensorZero names its models in its own namespace.
    fn model(self) -> &'static str {
        match self {
            Target::TensorZero => "tensorzero::model_name::demo",
            _ => "demo",
        }
    }

    /// Where the target's OpenAI API lives (TensorZero: under `/openai`).
    fn prefix(self) -> &'static str {
        match self {
            Target::TensorZero => "/openai",
            _ => "",
        }
    }

    fn is_inferscope(self) -> bool {
        matches!(
            self,
            Target::Inferscope | Target::InferscopeH2 | Target::Baseline
        )
    }

    /// The targets `TARGETS` names (by default every one, `inferscope-base` when `BASE_BIN` is
    /// set).
    fn chosen() -> Vec<Target> {
        let default = if std::env::var_os("BASE_BIN").is_some() {
            "direct,inferscope-base,inferscope,inferscope-h2,nginx"
        } else {
            "direct,inferscope,inferscope-h2,nginx"
        };
        let only = env_or("TARGETS", default);
        let names: Vec<&str> = only.split(',').map(str::trim).collect();
        Target::ALL
            .into_iter()
            .filter(|t| names.contains(&t.name()))
            .collect()
    }
}

/// The targets in front of one simulator: the chosen proxies only.
struct Stage {
    _sim: Proc,
    sim_port: u16,
    /// Each proxy: its target, process, HTTP/1.1 port and HTTP/2 (prior knowledge) port.
    proxies: Vec<(Target, Proc, u16, u16)>,
}

impl Stage {
    fn new(dir: &Path, ttft_ms: f64, tpot_ms: f64) -> Stage {
        Stage::with(dir, ttft_ms, tpot_ms, Target::chosen())
    }
    fn with(dir: &Path, ttft_ms: f64, tpot_ms: f64, targets: Vec<Target>) -> Stage {
        let (sim, sim_port) = sim(dir, "sim", ttft_ms, tpot_ms);
        let proxies = targets
            .into_iter()
            .filter_map(|t| match t {
                Target::Direct => None,
                Target::Nginx => {
                    let (p, port, h2) = nginx(dir, sim_port);
                    Some((t, p, port, h2))
                }
                Target::VllmRouter | Target::Smg | Target::TensorZero => {
                    let (p, port) = router(dir, sim_port, t);
                    Some((t, p, port, port))
                }
                // inferscope serves HTTP/1.1 and h2c on one port.
                _ => {
                    let (p, port) = inferscope(dir, sim_port, t);
                    Some((t, p, port, port))
                }
            })
            .collect();
        Stage {
            _sim: sim,
            sim_port,
            proxies,
        }
    }
    fn port(&self, t: Target, h2: bool) -> u16 {
        match self.proxies.iter().find(|p| p.0 == t) {
            None => self.sim_port,
            Some(p) if h2 => p.3,
            Some(p) => p.2,
        }
    }
    fn proxy(&self, t: Target) -> Option<&Proc> {
        self.proxies.iter().find(|p| p.0 == t).map(|p| &p.1)
    }
}

/// One measured run of one target: the client's report plus the proxy's CPU and memory.
struct Run {
    report: Value,
    /// The proxy's CPU over the warm-up and the measured requests.
    cpu_s: f64,
    /// Requests sent before the measured ones (their CPU is in `cpu_s`).
    warmup: usize,
    /// The user-space share of `cpu_s` (NaN when no tick was counted).
    user_share: f64,
    rss_mib: f64,
    peak_rss_mib: f64,
    /// inferscope only: p99 of its own `overhead_ms` (time from accepting the request to handing
    /// it upstream, plus time spent observing chunks) over this run's access-log lines.
    overhead_p99_ms: Option<f64>,
}

impl Run {
    /// The proxy's CPU seconds per request: the CPU counted includes the warm-up's requests,
    /// which are the same requests, so they are counted too.
    fn cpu_per_request_s(&self) -> f64 {
        self.cpu_s / (f(&self.report["successful"]) + self.warmup as f64).max(1.0)
    }
}

fn access_lines(dir: &Path, t: Target) -> Vec<String> {
    std::fs::read_to_string(dir.join(format!("{}-access.jsonl", t.name())))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// `warmup` requests are sent at once before the measured ones, by the same client process (so
/// its connections, and the proxy's upstream ones, are open when the measured run starts), and
/// left out of the report; the proxy's CPU time includes them, so CPU per request counts them.
fn run(stage: &Stage, dir: &Path, t: Target, a: &[String], warmup: usize) -> Run {
    // The access log is flushed within 100 ms.
    std::thread::sleep(Duration::from_millis(300));
    let logged = access_lines(dir, t).len() + if t.is_inferscope() { warmup } else { 0 };
    let cpu0 = stage.proxy(t).map_or(0.0, Proc::cpu_s);
    let ticks0 = stage.proxy(t).map_or((0, 0), Proc::ticks);
    let mut a = a.to_vec();
    a.extend(args(&["--warmup", &warmup.to_string()]));
    let report = client(dir, t, stage.port(t, false), &a);
    let cpu_s = stage.proxy(t).map_or(0.0, Proc::cpu_s) - cpu0;
    let ticks1 = stage.proxy(t).map_or((0, 0), Proc::ticks);
    let (user, sys) = (
        ticks1.0.saturating_sub(ticks0.0),
        ticks1.1.saturating_sub(ticks0.1),
    );
    let user_share = user as f64 / (user + sys) as f64;
    let (rss_mib, peak_rss_mib) = stage.proxy(t).map_or((0.0, 0.0), Proc::rss_mib);
    let overhead_p99_ms = t.is_inferscope().then(|| {
        std::thread::sleep(Duration::from_millis(300));
        let mut v: Vec<f64> = access_lines(dir, t)[logged..]
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok()?["overhead_ms"].as_f64())
            .collect();
        v.sort_by(f64::total_cmp);
        v.get(((v.len().max(1) - 1) as f64 * 0.99) as usize)
            .copied()
            .unwrap_or(f64::NAN)
    });
    Run {
        report,
        cpu_s,
        warmup,
        user_share,
        rss_mib,
        peak_rss_mib,
        overhead_p99_ms,
    }
}

/// `rounds` rounds of one run per target, the targets' order rotated each round.
fn measure(
    stage: &Stage,
    dir: &Path,
    a: &[String],
    warmup: usize,
    rounds: usize,
) -> Vec<Vec<(Target, Run)>> {
    (0..rounds)
        .map(|round| {
            rotation(round)
                .into_iter()
                .map(|t| (t, run(stage, dir, t, a, warmup)))
                .collect()
        })
        .collect()
}

/// Closed loop at 64 for 10 s, streams of `tokens` tokens (against a simulator that does not
/// wait).
fn back_to_back(tokens: u32) -> Vec<String> {
    args(&[
        "--concurrency",
        "64",
        "--duration",
        "10s",
        "--requests",
        "10000000",
        "--max-tokens",
        &tokens.to_string(),
    ])
}

/// Every target, the order rotated by `round` (direct is always measured: "added" is against it).
fn rotation(round: usize) -> Vec<Target> {
    let mut all = Target::chosen();
    if !all.contains(&Target::Direct) {
        all.insert(0, Target::Direct);
    }
    let n = all.len();
    (0..n).map(|i| all[(round + i) % n]).collect()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

/// Per-round (target → run) tables; figures are medians over rounds of per-round differences.
fn latency_rows(label: &str, rounds: &[Vec<(Target, Run)>], out: &mut Vec<Value>) {
    fn get(round: &[(Target, Run)], t: Target) -> &Run {
        &round.iter().find(|(x, _)| *x == t).unwrap().1
    }
    let proxies = rounds[0]
        .iter()
        .map(|(t, _)| *t)
        .filter(|t| *t != Target::Direct);
    let mut proxies: Vec<Target> = proxies.collect();
    proxies.sort_by_key(|t| Target::ALL.iter().position(|x| x == t));
    for t in proxies {
        let added = |key: &str, q: &str| {
            median(
                rounds
                    .iter()
                    .map(|r| {
                        f(&get(r, t).report[key][q]) - f(&get(r, Target::Direct).report[key][q])
                    })
                    .collect(),
            )
        };
        let rounds_of = |key: &str, q: &str| -> Vec<f64> {
            rounds
                .iter()
                .map(|r| {
                    let d =
                        f(&get(r, t).report[key][q]) - f(&get(r, Target::Direct).report[key][q]);
                    (d * 1000.0).round() / 1000.0
                })
                .collect()
        };
        let row = json!({
            "phase": label,
            "proxy": t.name(),
            "added_ttft_p50_ms": added("ttft_ms", "median"),
            "added_ttft_p99_ms": added("ttft_ms", "p99"),
            "added_gap_p50_ms": added("itl_ms", "median"),
            "added_gap_p99_ms": added("itl_ms", "p99"),
            "added_ttft_p99_ms_per_round": rounds_of("ttft_ms", "p99"),
            "own_overhead_p99_ms": median(rounds.iter().filter_map(|r| get(r, t).overhead_p99_ms).collect()),
            "direct_ttft_p50_ms": median(rounds.iter().map(|r| f(&get(r, Target::Direct).report["ttft_ms"]["median"])).collect()),
            "direct_ttft_p99_ms": median(rounds.iter().map(|r| f(&get(r, Target::Direct).report["ttft_ms"]["p99"])).collect()),
            "req_per_s": median(rounds.iter().map(|r| f(&get(r, t).report["request_throughput"])).collect()),
            "direct_req_per_s": median(rounds.iter().map(|r| f(&get(r, Target::Direct).report["request_throughput"])).collect()),
            "failed": rounds.iter().map(|r| f(&get(r, t).report["failed"])).sum::<f64>(),
            "cpu_us_per_request": median(rounds.iter().map(|r| get(r, t).cpu_per_request_s() * 1e6).collect()),
            "cpu_util": median(rounds.iter().map(|r| get(r, t).cpu_per_request_s() * f(&get(r, t).report["successful"]) / f(&get(r, t).report["duration_s"])).collect()),
            "cpu_user_share": median(rounds.iter().map(|r| get(r, t).user_share).collect()),
            "rss_mib": median(rounds.iter().map(|r| get(r, t).rss_mib).collect()),
            "peak_rss_mib": rounds.iter().map(|r| get(r, t).peak_rss_mib).fold(0.0, f64::max),
        });
        println!("{row}");
        out.push(row);
    }
}

/// The pairs `PAIRS` names (`a:b,…`; by default `nginx:inferscope`, and
/// `inferscope-base:inferscope` when `BASE_BIN` is set).
fn pairs() -> Vec<(Target, Target)> {
    let default = if std::env::var_os("BASE_BIN").is_some() {
        "nginx:inferscope,inferscope-base:inferscope"
    } else {
        "nginx:inferscope"
    };
    let by_name = |n: &str| {
        Target::ALL
            .into_iter()
            .find(|t| t.name() == n.trim())
            .unwrap_or_else(|| panic!("PAIRS: no target {n:?}"))
    };
    env_or("PAIRS", default)
        .split(',')
        .map(|p| {
            let (a, b) = p.split_once(':').expect("PAIRS: a:b,c:d");
            // One process cannot be measured against itself: both clients would load it.
            assert_ne!(a.trim(), b.trim(), "PAIRS: a pair of two different targets");
            (by_name(a), by_name(b))
        })
        .collect()
}

/// Two proxies measured over the same seconds: each gets its own client (both on core 1) with
/// the same open-loop load, both proxies share core 0 and the simulator, so whatever else the
/// machine does weighs on both alike. The figure is the ratio of their CPU per request in each
/// round (b over a), which stays within ~1% between rounds where either proxy's own figure
/// moves by 15% from one run to the next. Loads: streams of `PAIRED_TOKENS` (1,16,64) chunks
/// 20 ms apart, 1,000 req/s (past 16 chunks 16,000 chunks a second), 8 s each.
fn paired(dir: &Path, rounds: usize, rows: &mut Vec<Value>) {
    let pairs = pairs();
    let mut targets: Vec<Target> = pairs.iter().flat_map(|&(a, b)| [a, b]).collect();
    targets.sort_by_key(|t| Target::ALL.iter().position(|x| x == t));
    targets.dedup();
    let stage = Stage::with(dir, 50.0, 20.0, targets);
    let tokens: Vec<u32> = env_or("PAIRED_TOKENS", "1,16,64")
        .split(',')
        .map(|s| s.trim().parse().unwrap())
        .collect();
    for n in tokens {
        // Past 16 chunks, fewer streams a second: the same chunks a second as at 16, which the
        // simulator and both clients on core 1 keep up with (at 500 req/s of 64 chunks the
        // TTFT p99 through either proxy tripled: core 1, not the proxies, was the limit).
        let rate: u32 = if n > 16 { 16_000 / n } else { 1000 };
        let a = args(&[
            "--rate",
            &rate.to_string(),
            "--requests",
            &(rate * 8).to_string(),
            "--max-tokens",
            &n.to_string(),
        ]);
        // Warm-up: the connections the run keeps busy, with room.
        let busy = f64::from(rate) * (50.0 + 20.0 * f64::from(n)) / 1000.0;
        let warmup = ((busy * 1.4) as usize).max(64);
        for &(x, y) in &pairs {
            let per_round: Vec<(Run, Run)> = (0..rounds)
                .map(|_| {
                    std::thread::scope(|s| {
                        let ry = s.spawn(|| run(&stage, dir, y, &a, warmup));
                        let rx = run(&stage, dir, x, &a, warmup);
                        (rx, ry.join().unwrap())
                    })
                })
                .collect();
            let per_req = |r: &Run| r.cpu_per_request_s() * 1e6;
            let ratios: Vec<f64> = per_round
                .iter()
                .map(|(rx, ry)| ((per_req(ry) / per_req(rx)) * 1000.0).round() / 1000.0)
                .collect();
            let med = |g: &dyn Fn(&(Run, Run)) -> f64| median(per_round.iter().map(g).collect());
            let row = json!({
                "phase": format!("paired open loop {rate} req/s, {n} chunks"),
                "a": x.name(),
                "b": y.name(),
                "cpu_ratio_b_over_a": median(ratios.clone()),
                "cpu_ratio_per_round": ratios,
                "a_cpu_us_per_request": med(&|p| per_req(&p.0)),
                "b_cpu_us_per_request": med(&|p| per_req(&p.1)),
                "a_user_us_per_request": med(&|p| per_req(&p.0) * p.0.user_share),
                "b_user_us_per_request": med(&|p| per_req(&p.1) * p.1.user_share),
                "a_ttft_p99_ms": med(&|p| f(&p.0.report["ttft_ms"]["p99"])),
                "b_ttft_p99_ms": med(&|p| f(&p.1.report["ttft_ms"]["p99"])),
                "failed": per_round.iter().map(|p| f(&p.0.report["failed"]) + f(&p.1.report["failed"])).sum::<f64>(),
            });
            println!("{row}");
            rows.push(row);
        }
    }
}

/// A cgroup (v1 `cpu` controller) holding the proxies to `pct`% of one core, removed on drop.
struct CpuCap(PathBuf);

impl CpuCap {
    fn new(pct: u32) -> Option<CpuCap> {
        let dir = PathBuf::from(format!(
            "/sys/fs/cgroup/cpu/inferscope-e2e-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).ok()?;
        std::fs::write(dir.join("cpu.cfs_period_us"), "100000").ok()?;
        std::fs::write(dir.join("cpu.cfs_quota_us"), (pct * 1000).to_string()).ok()?;
        Some(CpuCap(dir))
    }
    fn add(&self, p: &Proc) -> bool {
        p.pids()
            .into_iter()
            .all(|pid| std::fs::write(self.0.join("cgroup.procs"), pid.to_string()).is_ok())
    }
}

impl Drop for CpuCap {
    fn drop(&mut self) {
        // Processes still inside go back to the root group, then the group can go.
        let procs = std::fs::read_to_string(self.0.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines() {
            let _ = std::fs::write("/sys/fs/cgroup/cpu/cgroup.procs", pid);
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Maximum requests/s when the proxy, not the client or the simulator, is the bottleneck: both
/// proxies capped to the same share of a core (`CAP_PCT`, default 25%), back-to-back 64-chunk
/// streams at concurrency 64. Skipped where cgroups cannot be written.
fn capped(dir: &Path, rounds: usize, tokens: u32, label: &str, rows: &mut Vec<Value>) {
    let pct: u32 = env_or("CAP_PCT", "25").parse().unwrap();
    let stage = Stage::new(dir, 0.0, 0.0);
    let Some(cap) = CpuCap::new(pct) else {
        println!("capped phase skipped: cannot create a cpu cgroup");
        return;
    };
    if !stage.proxies.iter().all(|p| cap.add(&p.1)) {
        println!("capped phase skipped: cannot move the proxies into the cgroup");
        return;
    }
    let per_round = measure(&stage, dir, &back_to_back(tokens), 64, rounds);
    latency_rows(
        &format!("{label}, proxy capped at {pct}% of a core"),
        &per_round,
        rows,
    );
    drop(stage);
    drop(cap);
}

/// Holds `n` streams at once through `t` over HTTP/2 (100 streams per connection); samples RSS while they
/// are open.
fn streams(dir: &Path, n: usize) -> Vec<Value> {
    let mut rows = Vec::new();
    for t in Target::chosen() {
        // A fresh stage per target: the peak RSS is this phase's alone.
        let stage = Stage::new(dir, 50.0, 1000.0);
        let port = stage.port(t, true);
        // Before any stream: what the process holds idle (a router inside a Python process
        // carries the interpreter).
        let idle = stage.proxy(t).map_or(0.0, |p| p.rss_mib().0);
        let dir2 = dir.to_path_buf();
        let n_s = n.to_string();
        // 100 streams per connection: under nginx's `http2_max_concurrent_streams` (128).
        let conns = n.div_ceil(100).to_string();
        let client = std::thread::spawn(move || {
            client(
                &dir2,
                t,
                port,
                &args(&[
                    "--concurrency",
                    &n_s,
                    "--requests",
                    &n_s,
                    "--max-tokens",
                    "16",
                    "--http2-connections",
                    &conns,
                ]),
            )
        });
        let mut peak_sampled: f64 = 0.0;
        while !client.is_finished() {
            if let Some(p) = stage.proxy(t) {
                peak_sampled = peak_sampled.max(p.rss_mib().0);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let report = client.join().unwrap();
        let peak = stage.proxy(t).map_or(0.0, |p| p.rss_mib().1);
        let row = json!({
            "phase": "streams",
            "target": t.name(),
            "streams": n,
            "successful": report["successful"],
            "failed": report["failed"],
            "ttft_p99_ms": report["ttft_ms"]["p99"],
            "e2e_p99_ms": report["e2e_ms"]["p99"],
            "proxy_idle_rss_mib": idle,
            "proxy_peak_rss_mib": peak,
            "proxy_rss_sampled_max_mib": peak_sampled,
        });
        println!("{row}");
        rows.push(row);
    }
    rows
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let rounds: usize = env_or("ROUNDS", "3").parse().unwrap();
    let levels: Vec<usize> = env_or("LEVELS", "1,64,512")
        .split(',')
        .map(|s| s.trim().parse().unwrap())
        .collect();
    let phases = env_or("PHASES", "latency,rate,throughput,capped,streams");
    let n_streams: usize = env_or("STREAMS", "10000").parse().unwrap();
    let dir: PathBuf = std::env::temp_dir().join(format!("inferscope-e2e-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut rows = Vec::new();

    if phases.contains("latency") {
        let stage = Stage::new(&dir, 50.0, 20.0);
        for &c in &levels {
            let requests = (c * 4).max(20);
            let a = args(&[
                "--concurrency",
                &c.to_string(),
                "--requests",
                &requests.to_string(),
                "--max-tokens",
                "64",
            ]);
            let per_round = measure(&stage, &dir, &a, c, rounds);
            latency_rows(&format!("latency c={c}"), &per_round, &mut rows);
        }
    }
    if phases.contains("rate") {
        let stage = Stage::new(&dir, 50.0, 20.0);
        let a = args(&[
            "--rate",
            "1000",
            "--requests",
            "10000",
            "--max-tokens",
            "16",
        ]);
        // Warm-up: as many connections as the run keeps busy (~370 streams).
        let rate_rounds: usize = env_or("RATE_ROUNDS", "5").parse().unwrap();
        let per_round = measure(&stage, &dir, &a, 512, rate_rounds);
        latency_rows("open loop 1000 req/s", &per_round, &mut rows);
    }
    if phases.contains("throughput") {
        let stage = Stage::new(&dir, 0.0, 0.0);
        let per_round = measure(&stage, &dir, &back_to_back(64), 64, rounds);
        latency_rows("throughput c=64", &per_round, &mut rows);
    }
    if phases.contains("capped") {
        capped(&dir, rounds, 64, "throughput c=64", &mut rows);
    }
    if phases.contains("short") {
        // The per-request fixed cost: 16-chunk streams back to back, free and capped.
        let stage = Stage::new(&dir, 0.0, 0.0);
        let per_round = measure(&stage, &dir, &back_to_back(16), 64, rounds);
        latency_rows("short streams c=64 (16 chunks)", &per_round, &mut rows);
        drop(stage);
        capped(
            &dir,
            rounds,
            16,
            "short streams c=64 (16 chunks)",
            &mut rows,
        );
    }
    if phases.contains("paired") {
        paired(&dir, rounds, &mut rows);
    }
    if phases.contains("streams") {
        rows.extend(streams(&dir, n_streams));
    }
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/e2e_compare.json");
    std::fs::write(&out, serde_json::to_string_pretty(&rows).unwrap()).unwrap();
    println!("written: {}", out.display());
    let _ = std::fs::remove_dir_all(&dir);
}
