//! Fidelity on a starved host: is the TTFT the gateway logs the TTFT its clients felt, when the
//! gateway has to wait for a CPU?
//!
//! The simulator and the gateway run as separate processes (the simulator's delays are its own);
//! clients open one connection per request. The referee is a packet capture on loopback (tcpdump,
//! kernel timestamps): per request, wire TTFT = the first gateway→client packet carrying output
//! − the first client→gateway packet of the request, matched to the access log by request id.
//! Phases: idle host, and a host whose every core runs a real-time busy loop (`chrt -f 1`,
//! bounded in time; RT throttling leaves other tasks 5% of each second), each with the kernel
//! clock on and off.
//!
//! Half the clients (`SPLIT=0`: none) are like httpx- and aiohttp-based benchmark clients: a
//! keep-alive connection each, and every request's head and body written apart, `SPLIT_MS`
//! (default 2) between them — the wire's TTFT starts at the head. Each kind has its own row.
//!
//! Needs Linux, root (for the real-time priority) and tcpdump (`apt-get install tcpdump`).
//! Run: `cargo bench --bench starved` (environment: `PHASE_SECONDS` per phase, default 8;
//! `CONCURRENCY`, default 4). With `BACKEND=http://host:port` (and `MODEL`) the gateway fronts
//! that server instead of the simulator — the real vLLM CPU server (`../shared/vllm-cpu/`)
//! contends for the cores itself, so only the kernel-clock on/off phases run, without a hog.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn env_or(k: &str, d: usize) -> usize {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

/// Starts `cmd` and returns it with the first line it prints that starts with `prefix` (the
/// caller stops and waits for it).
#[allow(clippy::zombie_processes)]
fn start(mut cmd: Command, prefix: &str) -> (Child, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "no `{prefix}` line");
        if line.starts_with(prefix) {
            return (child, line);
        }
    }
}

fn field(line: &str, key: &str) -> SocketAddr {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key))
        .unwrap()
        .parse()
        .unwrap()
}

fn stop(child: &mut Child, sig: &str) {
    let _ = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status();
    let _ = child.wait();
}

/// One request on its own connection; reads to the end.
fn request(addr: SocketAddr, model: &str) -> bool {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return false;
    };
    let _ = s.set_nodelay(true);
    let body = format!(
        r#"{{"model":"{model}","stream":true,"max_tokens":16,"messages":[{{"role":"user","content":"hello there"}}]}}"#
    );
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    if s.write_all(head.as_bytes()).is_err() {
        return false;
    }
    let mut sink = Vec::new();
    s.read_to_end(&mut sink).is_ok()
}

/// Requests on one keep-alive connection until `stop_at`, each with its head and body written
/// `gap` apart; adds this connection's local port to `ports` and counts the requests answered.
fn split_requests(
    addr: SocketAddr,
    model: &str,
    gap: Duration,
    stop_at: Instant,
    ports: &std::sync::Mutex<std::collections::HashSet<u16>>,
    sent: &AtomicUsize,
) {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return;
    };
    let _ = s.set_nodelay(true);
    ports.lock().unwrap().insert(s.local_addr().unwrap().port());
    let body = format!(
        r#"{{"model":"{model}","stream":true,"max_tokens":16,"messages":[{{"role":"user","content":"hello there"}}]}}"#
    );
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let mut buf = vec![0u8; 16 << 10];
    while Instant::now() < stop_at {
        if s.write_all(head.as_bytes()).is_err() {
            return;
        }
        std::thread::sleep(gap);
        if s.write_all(body.as_bytes()).is_err() {
            return;
        }
        // To the chunked body's end (the tail of what was read so far holds the terminator).
        let mut tail: Vec<u8> = Vec::new();
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    tail.extend_from_slice(&buf[..n]);
                    if tail.ends_with(b"\r\n0\r\n\r\n") {
                        break;
                    }
                    let keep = tail.len().saturating_sub(8);
                    tail.drain(..keep);
                }
            }
        }
        sent.fetch_add(1, Ordering::Relaxed);
    }
}

/// A TCP segment on loopback: capture time (ns since the epoch), ports, payload.
struct Segment {
    t_ns: u64,
    src: u16,
    dst: u16,
    payload: Vec<u8>,
}

/// Reads a pcap file (microsecond or nanosecond; Ethernet, Linux cooked v1/v2, or raw IP).
fn read_pcap(path: &Path) -> Vec<Segment> {
    let b = std::fs::read(path).unwrap();
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
    let magic = u32_at(0);
    let nano = match magic {
        0xa1b2_3c4d => true,
        0xa1b2_c3d4 => false,
        m => panic!("pcap magic {m:#x}: only little-endian captures are read"),
    };
    let link = u32_at(20);
    let l2 = match link {
        1 => 14,
        113 => 16,
        276 => 20,
        101 | 228 => 0,
        other => panic!("link type {other}"),
    };
    let mut out = Vec::new();
    let mut i = 24;
    while i + 16 <= b.len() {
        let (sec, frac, incl) = (
            u32_at(i) as u64,
            u32_at(i + 4) as u64,
            u32_at(i + 8) as usize,
        );
        let t_ns = sec * 1_000_000_000 + if nano { frac } else { frac * 1000 };
        let p = &b[i + 16..(i + 16 + incl).min(b.len())];
        i += 16 + incl;
        if p.len() < l2 + 20 {
            continue;
        }
        let ip = &p[l2..];
        if ip[0] >> 4 != 4 || ip[9] != 6 {
            continue;
        }
        let ihl = ((ip[0] & 0x0f) as usize) * 4;
        let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
        let tcp = &ip[ihl..total.min(ip.len())];
        if tcp.len() < 20 {
            continue;
        }
        let off = ((tcp[12] >> 4) as usize) * 4;
        let payload = tcp.get(off..).unwrap_or(&[]).to_vec();
        if payload.is_empty() {
            continue;
        }
        out.push(Segment {
            t_ns,
            src: u16::from_be_bytes([tcp[0], tcp[1]]),
            dst: u16::from_be_bytes([tcp[2], tcp[3]]),
            payload,
        });
    }
    out
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A `"content":"…"` with something in it.
fn has_output(payload: &[u8]) -> bool {
    let key = b"\"content\":\"";
    let mut at = 0;
    while let Some(i) = find(&payload[at..], key) {
        let next = at + i + key.len();
        if payload.get(next).is_some_and(|b| *b != b'"') {
            return true;
        }
        at = next;
    }
    false
}

/// Per request id: wire TTFT from the capture — from the first client→gateway segment of the
/// request (the SYN on a fresh connection; on a kept-alive one the first segment carrying data
/// after the previous response began) to the first gateway→client segment carrying output.
fn wire_ttft(segments: &[Segment], gw_port: u16) -> HashMap<String, f64> {
    #[derive(Default)]
    struct Conn {
        t_req: Option<u64>,
        id: Option<String>,
        t_tok: Option<u64>,
    }
    let mut done: Vec<Conn> = Vec::new();
    let mut conns: HashMap<u16, Conn> = HashMap::new();
    for s in segments {
        if s.dst == gw_port {
            let c = conns.entry(s.src).or_default();
            if c.id.is_some() && !s.payload.is_empty() {
                // The next request on a kept-alive connection.
                done.push(std::mem::take(c));
            }
            c.t_req.get_or_insert(s.t_ns);
        } else if s.src == gw_port {
            let c = conns.entry(s.dst).or_default();
            if c.id.is_none() {
                if let Some(at) = find(&s.payload, b"x-inferscope-request-id: ") {
                    let rest = &s.payload[at + 25..];
                    let end = find(rest, b"\r\n").unwrap_or(rest.len());
                    c.id = Some(String::from_utf8_lossy(&rest[..end]).into_owned());
                }
            }
            // The first event carrying output (the role chunk's content is empty).
            if c.t_tok.is_none() && has_output(&s.payload) {
                c.t_tok = Some(s.t_ns);
            }
        }
    }
    done.into_iter()
        .chain(conns.into_values())
        .filter_map(|c| Some((c.id?, (c.t_tok? - c.t_req?) as f64 / 1e6)))
        .collect()
}

fn pct(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

struct Row {
    phase: &'static str,
    clock: &'static str,
    /// Which clients: fresh connections, or heads and bodies apart on kept-alive ones.
    clients: &'static str,
    n: usize,
    /// |wire − logged| p50, p99, p99.9, max.
    diff: (f64, f64, f64, f64),
    /// Requests beyond 5 ms off, and of those the ones whose record says the gateway was late
    /// by at least the difference less 1 ms (accept delay, forward lag).
    beyond_5ms: (usize, usize),
    wire_ttft: (f64, f64),
    accept: (f64, f64),
    lag: (f64, f64),
    late_max: f64,
}

/// Real-time busy loops, killed when dropped.
struct Hogs(Vec<Child>);

impl Drop for Hogs {
    fn drop(&mut self) {
        for h in &mut self.0 {
            let _ = h.kill();
            let _ = h.wait();
        }
    }
}

fn phase(
    kernel_clock: bool,
    hog: bool,
    secs: u64,
    conc: usize,
    split: Option<Duration>,
    backend: &str,
    model: &str,
) -> Vec<Row> {
    let bin = env!("CARGO_BIN_EXE_inferscope");
    let dir = std::env::temp_dir().join(format!(
        "inferscope-starved-{}-{kernel_clock}-{hog}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("gw.yaml");
    std::fs::write(
        &config,
        format!(
            "access_log: {{ path: {:?} }}\nlimits: {{ kernel_clock: {kernel_clock}, max_concurrent_requests: 10000 }}\nbackends:\n  - {{ name: s, url: \"{backend}\" }}\nroutes:\n  - {{ name: all, backends: [s] }}\n",
            dir.join("access.jsonl")
        ),
    )
    .unwrap();
    let mut cmd = Command::new(bin);
    cmd.args(["serve", "--config"]).arg(&config).args([
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
    ]);
    let (mut gw, line) = start(cmd, "inferscope ready");
    let (data, admin) = (field(&line, "data="), field(&line, "admin="));
    let pcap = dir.join("lo.pcap");
    let mut dump = Command::new("tcpdump")
        .args([
            "-i",
            "lo",
            "-s",
            "0",
            "-U",
            "--time-stamp-precision=nano",
            "-w",
        ])
        .arg(&pcap)
        .args(["tcp", "port", &data.port().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tcpdump (apt-get install tcpdump)");
    let mut err = BufReader::new(dump.stderr.take().unwrap());
    let mut l = String::new();
    while err.read_line(&mut l).unwrap() > 0 && !l.contains("listening") {
        l.clear();
    }
    // Warm up: the kernel turns receive stamping on a moment after the first socket asks.
    for _ in 0..4 {
        request(data, model);
    }
    // The hogs are stopped by this process (normal priority: the 5% RT throttling leaves is
    // enough to run `kill`), never by a timer of their own — a real-time `timeout` on a core
    // spinning at the same priority never gets to run. A detached watchdog kills them anyway if
    // this process dies first.
    let mut hogs = Hogs(Vec::new());
    if hog {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        for _ in 0..cores {
            hogs.0.push(
                Command::new("chrt")
                    .args(["-f", "1", "sh", "-c", "while :; do :; done"])
                    .spawn()
                    .expect("chrt (root needed)"),
            );
        }
        let pids: Vec<String> = hogs.0.iter().map(|h| h.id().to_string()).collect();
        let _ = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "sleep {}; kill -9 {} 2>/dev/null",
                secs + 30,
                pids.join(" ")
            ))
            .spawn();
        std::thread::sleep(Duration::from_millis(300));
    }
    let stop_at = Instant::now() + Duration::from_secs(secs);
    let done = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let split_ports = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let workers: Vec<_> = (0..conc)
        .map(|i| {
            let (done, sent) = (Arc::clone(&done), Arc::clone(&sent));
            let ports = Arc::clone(&split_ports);
            let model = model.to_owned();
            std::thread::spawn(move || match split.filter(|_| i % 2 == 1) {
                Some(gap) => {
                    while !done.load(Ordering::Relaxed) && Instant::now() < stop_at {
                        split_requests(data, &model, gap, stop_at, &ports, &sent);
                    }
                }
                None => {
                    while !done.load(Ordering::Relaxed) && Instant::now() < stop_at {
                        if request(data, &model) {
                            sent.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    done.store(true, Ordering::Relaxed);
    drop(hogs);
    std::thread::sleep(Duration::from_millis(300));
    // The heartbeat's lateness, from the gateway itself.
    let stats = {
        let mut s = TcpStream::connect(admin).unwrap();
        write!(
            s,
            "GET /stats HTTP/1.1\r\nhost: {admin}\r\nconnection: close\r\n\r\n"
        )
        .unwrap();
        let mut t = String::new();
        s.read_to_string(&mut t).unwrap();
        let body = &t[t.find("\r\n\r\n").unwrap() + 4..];
        serde_json::from_str::<serde_json::Value>(body).unwrap()
    };
    let late_max = stats["instrument"]["heartbeat"]["lateness_ms"]["max"]
        .as_f64()
        .unwrap_or(f64::NAN);
    stop(&mut dump, "-INT");
    stop(&mut gw, "-TERM");
    let wire = wire_ttft(&read_pcap(&pcap), data.port());
    let log = std::fs::read_to_string(dir.join("access.jsonl")).unwrap();
    let split_ports = split_ports.lock().unwrap().clone();
    #[derive(Default)]
    struct Kind {
        diffs: Vec<f64>,
        wires: Vec<f64>,
        accepts: Vec<f64>,
        lags: Vec<f64>,
        beyond: usize,
        beyond_said: usize,
    }
    let mut kinds = [Kind::default(), Kind::default()];
    for l in log.lines().skip(4) {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        let (Some(id), Some(ttft)) = (v["request_id"].as_str(), v["ttft_ms"].as_f64()) else {
            continue;
        };
        let Some(w) = wire.get(id) else { continue };
        let port = v["client"]
            .as_str()
            .and_then(|c| c.rsplit(':').next()?.parse::<u16>().ok());
        let k = &mut kinds[usize::from(port.is_some_and(|p| split_ports.contains(&p)))];
        let diff = (w - ttft).abs();
        let accept = v["accept_delay_ms"].as_f64().unwrap_or(0.0);
        let lag = v["forward_lag_ms"].as_f64().unwrap_or(0.0);
        if diff > 5.0 {
            k.beyond += 1;
            if accept.max(lag) >= diff - 1.0 {
                k.beyond_said += 1;
            }
        }
        k.diffs.push(diff);
        k.wires.push(*w);
        k.accepts.push(accept);
        k.lags.push(lag);
    }
    kinds
        .into_iter()
        .zip(["fresh connection each", "head and body apart, kept alive"])
        .filter(|(k, _)| !k.diffs.is_empty())
        .map(|(mut k, clients)| Row {
            phase: if hog { "RT hog on every core" } else { "idle" },
            clock: if kernel_clock { "kernel" } else { "user" },
            clients,
            n: k.diffs.len(),
            diff: (
                pct(&mut k.diffs, 0.5),
                pct(&mut k.diffs, 0.99),
                pct(&mut k.diffs, 0.999),
                pct(&mut k.diffs, 1.0),
            ),
            beyond_5ms: (k.beyond, k.beyond_said),
            wire_ttft: (pct(&mut k.wires, 0.5), pct(&mut k.wires, 0.99)),
            accept: (pct(&mut k.accepts, 0.5), pct(&mut k.accepts, 0.99)),
            lag: (pct(&mut k.lags, 0.5), pct(&mut k.lags, 0.99)),
            late_max,
        })
        .collect()
}

fn main() {
    if !cfg!(target_os = "linux") {
        println!("starved: Linux only");
        return;
    }
    let secs = env_or("PHASE_SECONDS", 8) as u64;
    let conc = env_or("CONCURRENCY", 4);
    let external = std::env::var("BACKEND").ok();
    let model = std::env::var("MODEL").unwrap_or_else(|_| "demo".into());
    let split =
        (env_or("SPLIT", 1) != 0).then(|| Duration::from_millis(env_or("SPLIT_MS", 2) as u64));
    let mut sim = None;
    let backend = match &external {
        Some(url) => url.clone(),
        None => {
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_inferscope"));
            cmd.args([
                "sim",
                "--listen",
                "127.0.0.1:0",
                "--ttft-ms",
                "30",
                "--tpot-ms",
                "5",
                "--jitter",
                "0",
            ]);
            let (child, line) = start(cmd, "inferscope-sim ready");
            sim = Some(child);
            format!("http://{}", field(&line, "addr="))
        }
    };
    let hogs: &[bool] = if external.is_some() {
        &[false]
    } else {
        &[false, true]
    };
    let mut rows = Vec::new();
    for &hog in hogs {
        for kernel in [true, false] {
            for r in phase(kernel, hog, secs, conc, split, &backend, &model) {
                eprintln!(
                    "{} / {} / {}: n={} |wire-log| p50 {:.2} p99 {:.2} p99.9 {:.2} max {:.2} ms",
                    r.phase, r.clock, r.clients, r.n, r.diff.0, r.diff.1, r.diff.2, r.diff.3
                );
                rows.push(r);
            }
        }
    }
    if let Some(mut s) = sim {
        stop(&mut s, "-TERM");
    }
    let host = |r: &Row| match &external {
        Some(b) => format!("{} streams to {b}", conc),
        None => r.phase.to_string(),
    };
    println!("| host | t0 clock | clients | requests | \\|wire − logged\\| TTFT p50 / p99 / p99.9 / max (ms) | > 5 ms (of them, late by a field) | wire TTFT p50 / p99 (ms) | accept delay p50 / p99 (ms) | forward lag p50 / p99 (ms) | heartbeat lateness max (ms) |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {:.2} / {:.2} / {:.2} / {:.2} | {} ({}) | {:.1} / {:.1} | {:.2} / {:.2} | {:.2} / {:.2} | {:.1} |",
            host(r),
            r.clock,
            r.clients,
            r.n,
            r.diff.0,
            r.diff.1,
            r.diff.2,
            r.diff.3,
            r.beyond_5ms.0,
            r.beyond_5ms.1,
            r.wire_ttft.0,
            r.wire_ttft.1,
            r.accept.0,
            r.accept.1,
            r.lag.0,
            r.lag.1,
            r.late_max
        );
    }
}
