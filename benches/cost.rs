//! The cost budget: instructions and system calls per request through the gateway alone, at 1
//! and 64 tokens, streamed and not, against `benches/cost-baseline.json`.
//!
//! ```text
//! cargo bench --bench cost                  # measure, compare, exit 1 past the budget
//! COST_UPDATE=1 cargo bench --bench cost    # write the measured figures as the new baseline
//! COST_BIN=path/to/inferscope cargo bench --bench cost   # measure another build
//! ```
//!
//! Instructions are counted by callgrind (valgrind), which counts what the gateway executed, not
//! how long it took: the same binary, load and config give the same count within a few tenths of
//! a percent whatever else the machine is doing, so a budget can be held on a shared machine
//! where timings cannot. Only the gateway's process is counted: the simulated backend and the
//! client are processes of their own, and counting is on only while the measured requests run
//! (`callgrind_control -i on|off`), after a warm-up. System calls are counted by `strace -c` on
//! every thread of the gateway, running natively, over the same requests.
//!
//! A figure more than `TOLERANCE` above its baseline fails the run. Raising a baseline is a
//! decision: the commit that does it says in the perf log what the cost bought.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How far above its baseline a figure may go.
const TOLERANCE: f64 = 0.03;

/// One measured load.
struct Scenario {
    name: &'static str,
    stream: bool,
    tokens: u32,
    /// Requests counted (after `WARM_UP` more).
    requests: usize,
}

const WARM_UP: usize = 50;

const SCENARIOS: [Scenario; 4] = [
    Scenario {
        name: "stream_1",
        stream: true,
        tokens: 1,
        requests: 200,
    },
    Scenario {
        name: "stream_64",
        stream: true,
        tokens: 64,
        requests: 100,
    },
    Scenario {
        name: "unary_1",
        stream: false,
        tokens: 1,
        requests: 200,
    },
    Scenario {
        name: "unary_64",
        stream: false,
        tokens: 64,
        requests: 100,
    },
];

/// What a figure is, per request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Instructions,
    Syscalls,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Instructions => "instructions",
            Kind::Syscalls => "syscalls",
        }
    }
}

fn main() {
    let bin = std::env::var_os("COST_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_inferscope")),
        PathBuf::from,
    );
    let dir = std::env::temp_dir().join(format!("inferscope-cost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for tool in ["valgrind", "callgrind_control", "strace"] {
        let ok = Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "the cost budget needs {tool} (Debian: valgrind, strace; .ci/run installs them)"
        );
    }
    let sim = Sim::start(&bin, &dir);
    let config = dir.join("gw.yaml");
    std::fs::write(
        &config,
        format!(
            "access_log: {{ path: {:?} }}\nbackends:\n  - {{ name: sim, url: \"http://{}\" }}\nroutes:\n  - {{ name: all, backends: [sim] }}\n",
            dir.join("access.jsonl"),
            sim.addr
        ),
    )
    .unwrap();
    let mut measured: BTreeMap<(String, Kind), f64> = BTreeMap::new();
    for s in &SCENARIOS {
        let ir = instructions(&bin, &config, &dir, s);
        measured.insert((s.name.to_owned(), Kind::Instructions), ir);
        let (total, by_call) = syscalls(&bin, &config, &dir, s);
        measured.insert((s.name.to_owned(), Kind::Syscalls), total);
        let top: Vec<String> = by_call
            .iter()
            .filter(|(_, n)| **n >= 0.05)
            .map(|(c, n)| format!("{c} {n:.2}"))
            .collect();
        println!(
            "{:<10} {:>9.0} instructions/request  {:>6.2} syscalls/request ({})",
            s.name,
            ir,
            total,
            top.join(", ")
        );
    }
    drop(sim);
    let _ = std::fs::remove_dir_all(&dir);

    let baseline_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/cost-baseline.json");
    if std::env::var_os("COST_UPDATE").is_some() {
        let doc: BTreeMap<String, BTreeMap<&str, f64>> =
            measured
                .iter()
                .fold(BTreeMap::new(), |mut doc, ((name, kind), v)| {
                    doc.entry(name.clone())
                        .or_default()
                        .insert(kind.as_str(), (v * 100.0).round() / 100.0);
                    doc
                });
        let text = serde_json::to_string_pretty(&doc).unwrap();
        std::fs::write(&baseline_path, format!("{text}\n")).unwrap();
        println!("baseline written to {}", baseline_path.display());
        return;
    }
    let baseline: BTreeMap<String, BTreeMap<String, f64>> = serde_json::from_str(
        &std::fs::read_to_string(&baseline_path)
            .unwrap_or_else(|e| panic!("{}: {e}", baseline_path.display())),
    )
    .unwrap();
    println!("\n| load | figure | baseline | now | change | budget |");
    println!("|---|---|---|---|---|---|");
    let mut over = Vec::new();
    for ((name, kind), now) in &measured {
        let Some(base) = baseline.get(name).and_then(|b| b.get(kind.as_str())) else {
            over.push(format!("{name} {}: no baseline", kind.as_str()));
            continue;
        };
        let change = now / base - 1.0;
        let ok = change <= TOLERANCE;
        println!(
            "| {name} | {} per request | {base:.0} | {now:.2} | {:+.2}% | {} |",
            kind.as_str(),
            change * 100.0,
            if ok { "within" } else { "OVER" }
        );
        if !ok {
            over.push(format!(
                "{name} {}: {now:.0} is {:+.1}% over {base:.0}",
                kind.as_str(),
                change * 100.0
            ));
        }
    }
    if !over.is_empty() {
        eprintln!(
            "\nover the cost budget (+{:.0}%): {}\nIf the cost buys something, raise the baseline (COST_UPDATE=1 cargo bench --bench cost) in the same commit and say in the perf log what it bought.",
            TOLERANCE * 100.0,
            over.join("; ")
        );
        std::process::exit(1);
    }
}

/// The simulated backend, a process of its own: exact timing, a token a chunk.
struct Sim {
    child: Child,
    addr: SocketAddr,
}

impl Sim {
    fn start(bin: &Path, dir: &Path) -> Self {
        let port = free_port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let child = Command::new(bin)
            .args(["sim", "--listen", &addr.to_string()])
            .args(["--ttft-ms", "1", "--tpot-ms", "0.2", "--jitter", "0"])
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(addr).is_err() {
            assert!(Instant::now() < deadline, "the simulator did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Self { child, addr }
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The gateway under `prefix` (valgrind, or nothing), one Tokio worker, on free ports; returns
/// the child and its data address once it says it is ready.
fn gateway(prefix: &[String], bin: &Path, config: &Path, dir: &Path) -> (Child, SocketAddr) {
    let (data, admin) = (free_port(), free_port());
    let mut cmd = match prefix.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    let mut child = cmd
        .args(["serve", "--config"])
        .arg(config)
        .args(["--listen", &format!("127.0.0.1:{data}")])
        .args(["--admin", &format!("127.0.0.1:{admin}")])
        .env("TOKIO_WORKER_THREADS", "1")
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(
        line.contains("ready"),
        "the gateway did not start: {line:?}"
    );
    (child, format!("127.0.0.1:{data}").parse().unwrap())
}

/// `n` requests of `s` on one kept-alive connection, one after another, each read to its end.
fn load(addr: SocketAddr, s: &Scenario, n: usize) {
    let body = format!(
        r#"{{"model":"demo","stream":{},"max_tokens":{},"messages":[{{"role":"user","content":"hi"}}]}}"#,
        s.stream, s.tokens
    );
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut conn = TcpStream::connect(addr).unwrap();
    conn.set_nodelay(true).unwrap();
    for _ in 0..n {
        conn.write_all(head.as_bytes()).unwrap();
        read_response(&mut conn);
    }
}

/// Reads one HTTP/1.1 response: its head, then a `Content-Length` body or chunks to the last.
fn read_response(conn: &mut TcpStream) {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        conn.read_exact(&mut byte).unwrap();
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    if let Some(len) = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
    {
        let mut body = vec![0u8; len];
        conn.read_exact(&mut body).unwrap();
        return;
    }
    // Chunked: size line, data, CRLF, until the zero-size chunk and its CRLF.
    loop {
        let mut line = Vec::new();
        while !line.ends_with(b"\r\n") {
            conn.read_exact(&mut byte).unwrap();
            line.push(byte[0]);
        }
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&line)
                .trim()
                .split(';')
                .next()
                .unwrap(),
            16,
        )
        .unwrap();
        let mut data = vec![0u8; size + 2];
        conn.read_exact(&mut data).unwrap();
        if size == 0 {
            return;
        }
    }
}

/// Instructions per request of `s`: callgrind counting only while the measured requests run.
fn instructions(bin: &Path, config: &Path, dir: &Path, s: &Scenario) -> f64 {
    let out = dir.join(format!("callgrind.{}.out", s.name));
    let prefix = vec![
        "valgrind".to_owned(),
        "--tool=callgrind".to_owned(),
        "--instr-atstart=no".to_owned(),
        format!("--callgrind-out-file={}", out.display()),
    ];
    let (mut child, addr) = gateway(&prefix, bin, config, dir);
    load(addr, s, WARM_UP);
    let control = |on: &str| {
        let ok = Command::new("callgrind_control")
            .args(["-i", on, &child.id().to_string()])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|st| st.success());
        assert!(ok, "callgrind_control -i {on}");
    };
    control("on");
    load(addr, s, s.requests);
    control("off");
    stop(&mut child);
    let text = std::fs::read_to_string(&out).unwrap();
    let total: f64 = text
        .lines()
        // `totals:` is what was counted while instrumentation was on (`summary:` is 0 with
        // `--instr-atstart=no`).
        .find_map(|l| l.strip_prefix("totals:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no total in {}", out.display()));
    total / s.requests as f64
}

/// System calls per request of `s` (and per call), counted by strace on every thread of the
/// gateway while the measured requests run.
fn syscalls(bin: &Path, config: &Path, dir: &Path, s: &Scenario) -> (f64, BTreeMap<String, f64>) {
    let (mut child, addr) = gateway(&[], bin, config, dir);
    load(addr, s, WARM_UP);
    let out = dir.join(format!("strace.{}.txt", s.name));
    let mut strace = Command::new("strace");
    strace.args(["-c", "-o"]).arg(&out);
    for task in std::fs::read_dir(format!("/proc/{}/task", child.id())).unwrap() {
        strace.args(["-p", &task.unwrap().file_name().to_string_lossy()]);
    }
    let mut tracer = strace.stderr(Stdio::piped()).spawn().unwrap();
    // strace says "Process N attached" for each thread once it is tracing.
    let mut attached = 0;
    let threads = std::fs::read_dir(format!("/proc/{}/task", child.id()))
        .unwrap()
        .count();
    let mut err = BufReader::new(tracer.stderr.take().unwrap());
    let mut line = String::new();
    while attached < threads {
        line.clear();
        if err.read_line(&mut line).unwrap() == 0 {
            break;
        }
        attached += usize::from(line.contains("attached"));
    }
    load(addr, s, s.requests);
    let _ = Command::new("kill")
        .args(["-INT", &tracer.id().to_string()])
        .status();
    let _ = tracer.wait();
    stop(&mut child);
    let text = std::fs::read_to_string(&out).unwrap();
    let mut by = BTreeMap::new();
    let mut total = 0.0;
    for l in text.lines() {
        let cols: Vec<&str> = l.split_whitespace().collect();
        // % time, seconds, usecs/call, calls, [errors], syscall
        if cols.len() >= 5 && cols[0].parse::<f64>().is_ok() {
            let calls: f64 = cols[3].parse().unwrap_or(0.0);
            let name = cols.last().unwrap().to_string();
            if name == "total" {
                continue;
            }
            total += calls;
            by.insert(name, calls / s.requests as f64);
        }
    }
    (total / s.requests as f64, by)
}

fn stop(child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}
