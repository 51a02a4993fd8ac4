//! Hostile inputs on the admin side, as an attacker on loopback would send them: the OTLP
//! receiver (span bombs, forged spans, floods of unknown spans, trickled bodies), the state
//! directory's journals (FIFOs, torn and invalid lines, a disk that refuses writes), the admin
//! listener's connections (slow heads), token guessing, and clients that try to steer an
//! experiment's automatic decisions. Each test fails on a gateway without the bound it checks.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value::Value as V, AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// An engine that sends its spans itself (the test plays its exporter): each request's
/// `traceparent` is handed to the test, and the answer waits until the test releases it.
struct Engine {
    addr: SocketAddr,
    traces: mpsc::UnboundedReceiver<(Vec<u8>, Vec<u8>)>,
    release: mpsc::UnboundedSender<()>,
}

async fn engine() -> Engine {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, traces) = mpsc::unbounded_channel();
    let (release, mut released) = mpsc::unbounded_channel::<()>();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let head = read_request(&mut s).await;
            let tp = head
                .lines()
                .find_map(|l| l.strip_prefix("traceparent:"))
                .unwrap_or_default()
                .trim()
                .to_owned();
            let parts: Vec<&str> = tp.split('-').collect();
            let hex = |s: &str| {
                (0..s.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
                    .collect::<Vec<u8>>()
            };
            let _ = tx.send((hex(parts[1]), hex(parts[2])));
            if released.recv().await.is_none() {
                return;
            }
            let body = r#"{"id":"chatcmpl-1","object":"chat.completion","model":"demo","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}"#;
            let reply = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = s.write_all(reply.as_bytes()).await;
            let _ = s.shutdown().await;
        }
    });
    Engine {
        addr,
        traces,
        release,
    }
}

fn secs(k: &str, v: f64) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: Some(AnyValue {
            value: Some(V::DoubleValue(v)),
        }),
        ..Default::default()
    }
}

/// An engine span of (trace, parent) with `queue` and `prefill` seconds.
fn engine_span(trace: Vec<u8>, parent: Vec<u8>, queue: f64, prefill: f64) -> Span {
    Span {
        trace_id: trace,
        span_id: vec![1; 8],
        parent_span_id: parent,
        name: "llm_request".into(),
        attributes: vec![
            secs("gen_ai.latency.time_in_queue", queue),
            secs("gen_ai.latency.time_in_model_prefill", prefill),
            secs("gen_ai.latency.time_in_model_decode", 0.001),
        ],
        ..Default::default()
    }
}

fn export(spans: Vec<Span>) -> Vec<u8> {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            scope_spans: vec![ScopeSpans {
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

/// POSTs an OTLP/HTTP export to the admin listener; returns the status.
async fn post_export(admin: SocketAddr, body: Vec<u8>, gzip: bool) -> u16 {
    let mut headers = vec![("content-type", "application/x-protobuf")];
    if gzip {
        headers.push(("content-encoding", "gzip"));
    }
    Client::connect(admin)
        .await
        .send_bytes("POST", "/v1/traces", bytes::Bytes::from(body), &headers)
        .await
        .status
}

/// `post_export`, sent again while the receiver says it is busy (429, 503), as an exporter
/// retries: the status it finally answered.
async fn post_export_retrying(admin: SocketAddr, body: Vec<u8>) -> u16 {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let status = post_export(admin, body.clone(), false).await;
        if !matches!(status, 429 | 503) || std::time::Instant::now() > deadline {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn gateway_yaml(dir: &std::path::Path, engine: SocketAddr, extra: &str) -> String {
    format!(
        "access_log: {{ path: {:?} }}\n\
         backends:\n  - name: engine\n    url: \"http://{engine}\"\n    engine_spans: {{ wait: 10s }}\n\
         routes:\n  - name: main\n    backends: [engine]\n{extra}",
        dir.join("access.jsonl"),
    )
}

/// A gzip'd export of millions of empty spans (4 KiB on the wire, 4 MiB inflated) is read
/// in bounded memory: the gateway's peak resident memory stays far below what decoding every
/// span into a message would take (3.7 GB), two such exports at once included, and the
/// gateway answers its probes throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gzipped_span_bomb_is_read_in_bounded_memory() {
    let dir = temp_dir();
    let cfg = dir.join("gw.yaml");
    std::fs::write(
        &cfg,
        "backends:\n  - name: e\n    sim: { profile: fp16, seed: 1 }\n    engine_spans: { wait: 1s }\n\
         routes:\n  - name: main\n    backends: [e]\n",
    )
    .unwrap();
    let (mut child, _data, admin) = serve(&cfg);
    // ScopeSpans holding 8 M empty spans (field 2, length 0), in ResourceSpans, in the request.
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
    assert!(plain.len() <= 4 << 20);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    std::io::Write::write_all(&mut gz, &plain).unwrap();
    let bomb = gz.finish().unwrap();
    assert!(bomb.len() < 64 << 10, "{} bytes", bomb.len());
    let (a, b, probe) = tokio::join!(
        post_export(admin, bomb.clone(), true),
        post_export(admin, bomb, true),
        async {
            let (status, _) = admin_get(admin, "/healthz").await;
            status
        }
    );
    assert_eq!((a, b, probe), (200, 200, 200));
    // One that inflates past 4 MiB is refused as too large, once 4 MiB are out.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    std::io::Write::write_all(&mut gz, &vec![0u8; 16 << 20]).unwrap();
    let big = gz.finish().unwrap();
    assert_eq!(post_export(admin, big.clone(), true).await, 413);
    // 12 MiB inflated in a moment: past the 8 MiB a second the receiver reads, the next is told
    // to come back (an exporter retries), and so a stream of bombs costs little CPU.
    assert_eq!(post_export(admin, big, true).await, 429);
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
    let peak_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    // Exports of 4 MiB inflated, one at a time, plus the gateway itself: well under 256 MiB
    // (decoded as messages, one took ~900 MB).
    assert!(
        peak_kib < 256 << 10,
        "peak resident memory {} MiB",
        peak_kib >> 10
    );
}

/// A forged engine span (a queue and prefill of 1e19 s) is joined without its impossible
/// durations, counted, and the access log goes on writing every request's line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_engine_span_does_not_stop_the_access_log() {
    let dir = temp_dir();
    let mut e = engine().await;
    let gw = start_yaml(&gateway_yaml(&dir, e.addr, "")).await;
    let data = gw.data_addr;
    let first =
        tokio::spawn(
            async move { post(data, "/v1/chat/completions", &chat(false, 4, ""), &[]).await },
        );
    let (trace, parent) = e.traces.recv().await.unwrap();
    e.release.send(()).unwrap();
    assert_eq!(first.await.unwrap().status, 200);
    let forged = export(vec![engine_span(trace, parent, 1e19, 1e19)]);
    assert_eq!(post_export(gw.admin_addr, forged, false).await, 200);
    // The requests after it are logged too.
    for _ in 0..3 {
        let next = tokio::spawn(async move {
            post(data, "/v1/chat/completions", &chat(false, 4, ""), &[]).await
        });
        let (trace, parent) = e.traces.recv().await.unwrap();
        e.release.send(()).unwrap();
        assert_eq!(next.await.unwrap().status, 200);
        let span = export(vec![engine_span(trace, parent, 0.002, 0.003)]);
        assert_eq!(post_export(gw.admin_addr, span, false).await, 200);
    }
    let (_, prom) = admin_get(gw.admin_addr, "/metrics").await;
    assert!(
        prom.contains("inferscope_engine_span_values_out_of_range_total 1"),
        "{prom}"
    );
    let lines = stop_and_read_log(gw, &dir).await;
    assert_eq!(lines.len(), 4, "{lines:?}");
    let forged = &lines[0];
    assert_eq!(forged["engine_span"], "joined", "{forged}");
    assert!(forged["engine_queue_ms"].is_null(), "{forged}");
    for l in &lines[1..] {
        assert_eq!(l["engine_queue_ms"], 2.0, "{l}");
    }
}

/// A flood of spans for requests this gateway never sent is dropped on arrival and counted:
/// it cannot crowd out the span of a request of its own that arrives before its record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_unknown_spans_does_not_crowd_out_real_ones() {
    let dir = temp_dir();
    let mut e = engine().await;
    let gw = start_yaml(&gateway_yaml(&dir, e.addr, "")).await;
    // 70,000 spans of traces nobody sent, in four exports: more than the join holds (65,536).
    for part in 0..4u64 {
        let flood: Vec<Span> = (0..17_500u64)
            .map(|i| {
                let i = part * 17_500 + i + 1;
                engine_span(
                    u128::from(i).to_be_bytes().to_vec(),
                    i.to_be_bytes().to_vec(),
                    0.001,
                    0.001,
                )
            })
            .collect();
        assert_eq!(
            post_export_retrying(gw.admin_addr, export(flood)).await,
            200
        );
    }
    // The span of a real request arrives while its response is still open: span first.
    let data = gw.data_addr;
    let req =
        tokio::spawn(
            async move { post(data, "/v1/chat/completions", &chat(false, 4, ""), &[]).await },
        );
    let (trace, parent) = e.traces.recv().await.unwrap();
    let span = export(vec![engine_span(trace, parent, 0.004, 0.005)]);
    assert_eq!(post_export_retrying(gw.admin_addr, span).await, 200);
    e.release.send(()).unwrap();
    assert_eq!(req.await.unwrap().status, 200);
    let (_, prom) = admin_get(gw.admin_addr, "/metrics").await;
    assert!(
        prom.contains("inferscope_engine_spans_dropped_total{reason=\"unexpected\"} 70000"),
        "{prom}"
    );
    let lines = stop_and_read_log(gw, &dir).await;
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["engine_span"], "joined", "{}", lines[0]);
    assert_eq!(lines[0]["engine_queue_ms"], 4.0);
}

/// The receiver takes spans only where a backend expects them, and only under the admin
/// listener's own `Host` (a rebinding page cannot post spans); a body trickled past 10 s is cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_receiver_is_closed_without_engine_spans_checks_the_host_and_cuts_slow_bodies() {
    let dir = temp_dir();
    let sim = start_sim(exact(5.0, 1.0), 1).await;
    let plain = start_gateway(&[("b", sim.addr)], &dir, "").await;
    let body = export(vec![engine_span(vec![1; 16], vec![2; 8], 0.1, 0.1)]);
    assert_eq!(
        post_export(plain.admin_addr, body.clone(), false).await,
        404
    );
    plain.shutdown();

    let e = engine().await;
    let gw = start_yaml(&gateway_yaml(&temp_dir(), e.addr, "")).await;
    let r = Client::connect(gw.admin_addr)
        .await
        .send_bytes(
            "POST",
            "/v1/traces",
            bytes::Bytes::from(body.clone()),
            &[
                ("content-type", "application/x-protobuf"),
                ("host", "attacker.example:9464"),
            ],
        )
        .await;
    assert_eq!(r.status, 421);
    assert_eq!(post_export(gw.admin_addr, body, false).await, 200);
    // A body that never finishes: cut at 10 s with 408, not held.
    let mut s = tokio::net::TcpStream::connect(gw.admin_addr).await.unwrap();
    s.write_all(
        format!(
            "POST /v1/traces HTTP/1.1\r\nhost: {}\r\ncontent-type: application/x-protobuf\r\ncontent-length: 1000\r\n\r\n\x0a",
            gw.admin_addr
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = vec![0u8; 256];
    let t0 = std::time::Instant::now();
    let n = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::io::AsyncReadExt::read(&mut s, &mut buf),
    )
    .await
    .expect("answered")
    .unwrap();
    let head = String::from_utf8_lossy(&buf[..n]);
    assert!(head.starts_with("HTTP/1.1 408"), "{head}");
    assert!(t0.elapsed() >= Duration::from_secs(9), "{:?}", t0.elapsed());
    let (_, prom) = admin_get(gw.admin_addr, "/metrics").await;
    for o in ["misdirected", "slow_body"] {
        assert!(
            prom.contains(&format!(
                "inferscope_otlp_exports_total{{outcome=\"{o}\"}} 1"
            )),
            "{o}: {prom}"
        );
    }
    drop(sim);
}

/// A gateway with a state directory in front of two simulators, its experiment rolling a
/// rejected variant back by itself.
async fn stateful(state: &std::path::Path) -> (String, Vec<inferscope::sim::SimHandle>) {
    let (a, b) = (
        start_sim(exact(1.0, 1.0), 1).await,
        start_sim(exact(1.0, 1.0), 2).await,
    );
    let yaml = format!(
        "state_dir: {state:?}\nbackends:\n  - {{ name: fp16, url: \"http://{}\" }}\n  - {{ name: int8, url: \"http://{}\" }}\nroutes:\n  - name: chat\n    experiment:\n      name: int8-vs-fp16\n      accept: {{ accuracy_drop_max_points: 1.0 }}\n      on_reject: fallback\n      variants:\n        - {{ name: fp16, backends: [fp16], weight: 50, control: true }}\n        - {{ name: int8, backends: [int8], weight: 50 }}\n",
        a.addr, b.addr
    );
    (yaml, vec![a, b])
}

const BROKEN: &str = r#"{"kind":"accuracy","suite":"quiz","route":"chat","model":"m","control":"fp16","variants":[{"variant":"fp16","value":0.99,"n":500},{"variant":"int8","value":0.8,"n":500}],"comparisons":[{"variant":"int8","difference":-0.19,"ci95":[-0.23,-0.15]}]}"#;

async fn tripped(admin: SocketAddr) -> usize {
    let (_, body) = admin_get(admin, "/experiments").await;
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    doc["experiments"][0]["guardrails"]["tripped"]
        .as_array()
        .map_or(0, Vec::len)
}

fn mkfifo(path: &std::path::Path) {
    let _ = std::fs::remove_file(path);
    let ok = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "mkfifo {}", path.display());
}

/// A state file swapped for a FIFO while the gateway runs, or a directory where a file should
/// be (as a read-only disk refuses writes): the post that cannot be kept is refused at once and
/// says so, the reset that cannot be kept changes nothing, the failures are counted, and the
/// data plane and the probes answer throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_file_that_cannot_be_written_refuses_what_it_cannot_keep_and_blocks_nothing() {
    let state = temp_dir().join("state");
    let (yaml, _sims) = stateful(&state).await;
    let gw = start_yaml(&yaml).await;
    for _ in 0..6 {
        chat_ok(gw.data_addr, true, 2).await;
    }
    let r = post(gw.admin_addr, "/experiments/quality", BROKEN, &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(tripped(gw.admin_addr).await, 1);

    mkfifo(&state.join("quality.jsonl"));
    let (mmlu, request) = (BROKEN.replace("quiz", "mmlu"), chat(true, 2, ""));
    let t0 = std::time::Instant::now();
    let (r, healthz, data) = tokio::join!(
        post(gw.admin_addr, "/experiments/quality", &mmlu, &[]),
        admin_get(gw.admin_addr, "/healthz"),
        post(gw.data_addr, "/v1/chat/completions", &request, &[]),
    );
    assert_eq!(r.status, 500, "{}", String::from_utf8_lossy(&r.body()));
    assert!(
        String::from_utf8_lossy(&r.body()).contains("quality.jsonl"),
        "the refusal names the file"
    );
    assert!(t0.elapsed() < Duration::from_secs(6), "{:?}", t0.elapsed());
    assert_eq!((healthz.0, data.status), (200, 200));

    // rollbacks.jsonl cannot be written: the reset is refused and nothing changes.
    let rollbacks = state.join("rollbacks.jsonl");
    std::fs::rename(&rollbacks, state.join("rollbacks.aside")).unwrap();
    std::fs::create_dir(&rollbacks).unwrap();
    let r = post(
        gw.admin_addr,
        "/experiments/reset",
        r#"{"route":"chat","variant":"int8"}"#,
        &[],
    )
    .await;
    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body()));
    assert_eq!(
        tripped(gw.admin_addr).await,
        1,
        "a reset not kept changes nothing"
    );
    let (_, prom) = admin_get(gw.admin_addr, "/metrics").await;
    for file in ["quality.jsonl", "rollbacks.jsonl"] {
        let failed = prom
            .lines()
            .find(|l| {
                l.starts_with(&format!(
                    "inferscope_state_writes_total{{file=\"{file}\",outcome=\"failed\"}}"
                ))
            })
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0);
        assert!(failed >= 1.0, "{file}: {prom}");
    }
    gw.shutdown();
    assert!(gw.wait().await);
}

/// What the state directory holds is read back with bounds: a line with an invalid byte and a
/// last line torn inside a multi-byte character are skipped (the gateway starts with the rest),
/// and a state file that is a FIFO or `/dev/zero` is refused at start with its name, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_files_are_read_back_with_bounds() {
    let state = temp_dir().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let (yaml, _sims) = stateful(&state).await;
    let kept = BROKEN.replace("quiz", "mmlu");
    let mut text = format!("{{\"route\":\"chat\",\"result\":{kept}}}\n").into_bytes();
    text.extend_from_slice(b"{\"route\":\"chat\",\"result\":\"\xff\"}\n");
    text.extend_from_slice("{\"route\":\"chat\",\"result\":{\"suite\":\"é".as_bytes());
    text.pop(); // the last line ends inside the two bytes of `é`
    std::fs::write(state.join("quality.jsonl"), &text).unwrap();
    let gw = start_yaml(&yaml).await;
    let (_, body) = admin_get(gw.admin_addr, "/experiments").await;
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    let suites: Vec<&str> = doc["experiments"][0]["quality"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|q| q["suite"].as_str())
        .collect();
    assert_eq!(suites, ["mmlu"], "{doc}");
    // The next result starts a line of its own.
    let r = post(gw.admin_addr, "/experiments/quality", BROKEN, &[]).await;
    assert_eq!(r.status, 200);
    gw.shutdown();
    assert!(gw.wait().await);
    let on_disk = std::fs::read(state.join("quality.jsonl")).unwrap();
    assert!(on_disk.ends_with(b"}}\n"));
    assert_eq!(on_disk.iter().filter(|&&b| b == b'\n').count(), 3);

    for (what, make) in [
        (
            "a FIFO",
            Box::new(|p: &std::path::Path| mkfifo(p)) as Box<dyn Fn(&std::path::Path)>,
        ),
        (
            "a character device",
            Box::new(|p: &std::path::Path| {
                let _ = std::fs::remove_file(p);
                std::os::unix::fs::symlink("/dev/zero", p).unwrap();
            }),
        ),
    ] {
        make(&state.join("rollbacks.jsonl"));
        let cfg = inferscope::config::parse(&yaml, "test.yaml").unwrap();
        let started =
            tokio::time::timeout(Duration::from_secs(5), inferscope::app::start_local(cfg))
                .await
                .expect("start does not hang");
        let Err(e) = started else {
            panic!("started on {what}")
        };
        let e = format!("{e:#}");
        assert!(e.contains("rollbacks.jsonl") && e.contains(what), "{e}");
    }
}

/// A full disk under the state directory: a result that cannot be written whole is refused
/// and cut back, never glued to the next; once space returns every acknowledged result is read
/// back at restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: mounts a small tmpfs (lane 2)"]
async fn a_full_disk_under_the_state_directory_loses_no_acknowledged_result() {
    let disk = SmallDisk::mount(64);
    let state = disk.0.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let (yaml, _sims) = stateful(&state).await;
    let gw = start_yaml(&yaml).await;
    // Leave about one 4 KiB page free: a few ~600-byte results fit, then the disk is full.
    let filler = disk.0.join("filler");
    let free = || {
        let out = std::process::Command::new("df")
            .args(["--output=avail", "-B1"])
            .arg(&disk.0)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .nth(1)
            .and_then(|l| l.trim().parse::<u64>().ok())
            .unwrap()
    };
    std::fs::write(&filler, vec![0u8; (free() - 6000) as usize]).unwrap();
    let (mut acknowledged, mut refused) = (Vec::new(), 0);
    for i in 0..20 {
        let suite = format!("suite-{i:02}-{}", "x".repeat(180));
        let r = post(
            gw.admin_addr,
            "/experiments/quality",
            &BROKEN.replace("quiz", &suite),
            &[],
        )
        .await;
        match r.status {
            200 => acknowledged.push(suite),
            500 => refused += 1,
            s => panic!("{s}: {}", String::from_utf8_lossy(&r.body())),
        }
    }
    assert!(refused > 0 && !acknowledged.is_empty(), "{refused} refused");
    // Whole lines only on disk.
    let text = std::fs::read_to_string(state.join("quality.jsonl")).unwrap();
    assert!(text.is_empty() || text.ends_with('\n'));
    for l in text.lines() {
        serde_json::from_str::<serde_json::Value>(l).unwrap();
    }
    // Space returns: the next result is kept, and a restart reads back every acknowledged one.
    std::fs::remove_file(&filler).unwrap();
    let last = BROKEN.replace("quiz", "after");
    assert_eq!(
        post(gw.admin_addr, "/experiments/quality", &last, &[])
            .await
            .status,
        200
    );
    acknowledged.push("after".into());
    gw.shutdown();
    assert!(gw.wait().await);
    let gw = start_yaml(&yaml).await;
    let (_, body) = admin_get(gw.admin_addr, "/experiments").await;
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    let mut back: Vec<String> = doc["experiments"][0]["quality"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|q| q["suite"].as_str().map(str::to_owned))
        .collect();
    back.sort();
    acknowledged.sort();
    assert_eq!(back, acknowledged);
    gw.shutdown();
    assert!(gw.wait().await);
}

/// 70 connections trickling their heads (no token needed to do that) hold every one of the
/// admin listener's 64 connections: the probes still get in, each within a kubelet's 1 s
/// timeout (the trickler that waited longest, 250 ms at least, makes room), and the evictions
/// are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trickled_heads_cannot_keep_the_probes_out_of_the_admin_listener() {
    let sim = start_sim(exact(5.0, 1.0), 1).await;
    let dir = temp_dir();
    let gw = start_gateway(&[("b", sim.addr)], &dir, "").await;
    let admin = gw.admin_addr;
    let mut tricklers = Vec::new();
    for _ in 0..70 {
        tricklers.push(tokio::spawn(async move {
            let Ok(mut s) = tokio::net::TcpStream::connect(admin).await else {
                return;
            };
            for b in b"GET /stats HTTP/1.1\r\nhost: x\r\nx-pad: ".iter().cycle() {
                if s.write_all(&[*b]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }));
    }
    // Every admin connection is taken by a trickler.
    until(
        Duration::from_secs(10),
        "the admin listener is full",
        || async { tricklers.iter().filter(|t| !t.is_finished()).count() >= 64 },
    )
    .await;
    let t0 = std::time::Instant::now();
    for _ in 0..10 {
        let probe = tokio::time::timeout(Duration::from_secs(1), admin_get(admin, "/healthz"))
            .await
            .expect("a probe answered within 1 s");
        assert_eq!(probe.0, 200);
    }
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    let (_, prom) = admin_get(admin, "/metrics").await;
    let evicted: f64 = prom
        .lines()
        .find_map(|l| l.strip_prefix("inferscope_admin_connections_evicted_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    // The six tricklers past the cap, then the first probe, each made room for.
    assert!(evicted >= 7.0, "{evicted}");
    for t in tricklers {
        t.abort();
    }
    gw.shutdown();
}

/// Guessing the admin token: past 30 failed checks a minute an address is refused (429) without
/// a check, counted; the right token from that address waits out the minute too, the probes
/// stay open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_token_guesses_are_throttled_per_address() {
    std::env::set_var("HOSTILE_ADMIN_TOKEN", "0123456789abcdef-right");
    let sim = start_sim(exact(5.0, 1.0), 1).await;
    let dir = temp_dir();
    let gw = start_gateway(
        &[("b", sim.addr)],
        &dir,
        "admin: { token_env: HOSTILE_ADMIN_TOKEN }\n",
    )
    .await;
    // The guesser comes from 127.0.0.2; the operator from 127.0.0.1.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let mut c = Client::over(socket.connect(gw.admin_addr).await.unwrap()).await;
    let mut statuses = Vec::new();
    for i in 0..40 {
        let guess = format!("Bearer guess-{i}");
        let r = c
            .send("GET", "/stats", "", &[("authorization", guess.as_str())])
            .await;
        statuses.push(r.status);
    }
    assert_eq!(statuses.iter().filter(|s| **s == 401).count(), 30);
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 10);
    let right = c
        .send(
            "GET",
            "/metrics",
            "",
            &[("authorization", "Bearer 0123456789abcdef-right")],
        )
        .await;
    assert_eq!(right.status, 429, "the address waits out its minute");
    assert_eq!(c.send("GET", "/healthz", "", &[]).await.status, 200);
    let prom = Client::connect(gw.admin_addr)
        .await
        .send(
            "GET",
            "/metrics",
            "",
            &[("authorization", "Bearer 0123456789abcdef-right")],
        )
        .await;
    assert_eq!(prom.status, 200, "another address is not throttled");
    let prom = String::from_utf8(prom.body()).unwrap();
    assert!(
        prom.contains("inferscope_auth_throttled_total{plane=\"admin\"} 11"),
        "{prom}"
    );
    gw.shutdown();
}

/// One request from the loopback address `from` (127.0.0.x: a client of its own).
async fn post_from(from: &str, to: SocketAddr, body: &str, headers: &[(&str, &str)]) -> Received {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let stream = socket.connect(to).await.unwrap();
    Client::over(stream)
        .await
        .send("POST", "/v1/chat/completions", body, headers)
        .await
}

/// Sticky keys (`PREFIX-i`) the split of the experiment in `yaml` sends to `arm`, `n` of them:
/// found on a gateway of the same config that names the arm in its answers.
async fn users_of(yaml: &str, arm: &str, prefix: &str, n: usize) -> Vec<String> {
    let probe = start_yaml(&yaml.replace(
        "      sticky_key:",
        "      expose_variant: true\n      sticky_key:",
    ))
    .await;
    let mut users = Vec::new();
    for i in 0.. {
        let user = format!("{prefix}-{i}");
        let r = post(
            probe.data_addr,
            "/v1/chat/completions",
            &chat(false, 1, ""),
            &[("x-user-id", user.as_str())],
        )
        .await;
        if r.headers["x-inferscope-variant"] == arm {
            users.push(user);
            if users.len() == n {
                break;
            }
        }
    }
    probe.shutdown();
    users
}

/// Requests a client forced to a variant (`allow_override`) are answered and told their
/// variant (the client chose it), and trip no guardrail: they are not a draw from the split.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_requests_trip_no_guardrail() {
    let (fp16, int8) = (
        start_sim(exact(2.0, 1.0), 1).await,
        start_sim(exact(2.0, 1.0), 2).await,
    );
    let yaml = format!(
        "backends:\n  - {{ name: fp16, url: \"http://{}\" }}\n  - {{ name: int8, url: \"http://{}\" }}\nroutes:\n  - name: chat\n    experiment:\n      name: int8-vs-fp16\n      allow_override: true\n      guardrails:\n        window: 60s\n        min_samples: 3\n        rules:\n          - {{ variant: int8, metric: e2e_p99_ms, max: 50 }}\n      variants:\n        - {{ name: fp16, backends: [fp16], weight: 50, control: true }}\n        - {{ name: int8, backends: [int8], weight: 50 }}\n",
        fp16.addr, int8.addr
    );
    let gw = start_yaml(&yaml).await;
    let long = chat(true, 200, "");
    for _ in 0..6 {
        let r = post(
            gw.data_addr,
            "/v1/chat/completions",
            &long,
            &[("x-inferscope-variant", "int8")],
        )
        .await;
        assert_eq!(r.status, 200);
        assert_eq!(r.headers["x-inferscope-variant"], "int8");
        assert!(ms_of_e2e(&r) > 100.0);
    }
    // Guardrails judge as each record arrives: the six are in, none tripped.
    until(Duration::from_secs(5), "the six recorded", || async {
        recorded(gw.admin_addr).await >= 6
    })
    .await;
    let (_, body) = admin_get(gw.admin_addr, "/experiments").await;
    let x: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        x["experiments"][0]["guardrails"]["tripped"],
        serde_json::json!([])
    );
    assert_eq!(x["experiments"][0]["left_out"]["variant_forced"], 6);
    gw.shutdown();
}

/// How long a response took from the request's send to its last frame, ms.
fn ms_of_e2e(r: &Received) -> f64 {
    r.frames
        .last()
        .map_or(0.0, |(t, _)| t.duration_since(r.t_send).as_secs_f64() * 1e3)
}

/// A verdict that acts by itself is a fair comparison of what users felt, whatever one client
/// does: responses do not name the arm; a client that picks its arm anyway (a sticky key from a
/// header it sets) and sends it long requests weighs no more than its share, so the verdict is
/// not turned; and a client that hangs up on one arm's answers makes the latency limits
/// undecided instead of decided its way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_picks_its_arm_cannot_steer_an_automatic_rollout() {
    let (fp16, int8) = (
        start_sim(exact(2.0, 1.0), 1).await,
        start_sim(exact(2.0, 1.0), 2).await,
    );
    let yaml = format!(
        "backends:\n  - {{ name: fp16, url: \"http://{}\" }}\n  - {{ name: int8, url: \"http://{}\" }}\nroutes:\n  - name: chat\n    experiment:\n      name: int8-vs-fp16\n      sticky_key: \"header:x-user-id\"\n      min_samples: 20\n      accept: {{ e2e_change_max: 50 }}\n      on_reject: fallback\n      variants:\n        - {{ name: fp16, backends: [fp16], weight: 50, control: true }}\n        - {{ name: int8, backends: [int8], weight: 50 }}\n",
        fp16.addr, int8.addr
    );
    let gw = start_yaml(&yaml).await;
    let data = gw.data_addr;
    let short = chat(true, 4, "");
    // Honest users from five addresses: both arms, short answers.
    let mut n = 0;
    for from in [
        "127.0.0.2",
        "127.0.0.3",
        "127.0.0.4",
        "127.0.0.5",
        "127.0.0.6",
    ] {
        for _ in 0..16 {
            n += 1;
            let user = format!("user-{n}");
            let r = post_from(from, data, &short, &[("x-user-id", user.as_str())]).await;
            assert_eq!(r.status, 200);
            assert!(
                r.headers.get("x-inferscope-variant").is_none(),
                "the arm is not named by default"
            );
        }
    }
    // The attacker picks int8 through the sticky key and sends it 100 long requests.
    let long = chat(true, 100, "");
    for user in users_of(&yaml, "int8", "mine", 100).await {
        let r = post_from("127.0.0.9", data, &long, &[("x-user-id", user.as_str())]).await;
        assert_eq!(r.status, 200);
    }
    let view = || async {
        let (_, body) = admin_get(gw.admin_addr, "/experiments").await;
        let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
        doc["experiments"][0].clone()
    };
    let x = view().await;
    let int8_requests = x["variants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["variant"] == "int8")
        .map(|v| v["requests"].as_u64().unwrap())
        .unwrap();
    assert!(
        int8_requests >= 130,
        "the attacker's requests reached int8: {x}"
    );
    let row = &x["verdicts"][0];
    assert_ne!(row["decision"], "reject", "{row}");
    let e2e = x["comparisons"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["metric"] == "e2e")
        .unwrap()
        .clone();
    assert!(
        e2e["verdict"].as_str().unwrap().contains("weight bounded"),
        "{e2e}"
    );
    // The judge (every second) has kept a decision, and rolled nothing back.
    until(
        Duration::from_secs(5),
        "the judge kept a decision",
        || async {
            view().await["decided"]
                .as_array()
                .is_some_and(|d| d.iter().any(|d| d["variant"] == "int8"))
        },
    )
    .await;
    let x = view().await;
    assert_eq!(x["guardrails"]["tripped"], serde_json::json!([]), "{x}");

    // Now it hangs up on int8's answers: cancellations differ, no latency limit is decided.
    for user in users_of(&yaml, "int8", "gone", 30).await {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.9:0".parse().unwrap()).unwrap();
        let mut client = Client::over(socket.connect(data).await.unwrap()).await;
        let r = client
            .send_until(
                "POST",
                "/v1/chat/completions",
                &long,
                &[("x-user-id", user.as_str())],
                1,
            )
            .await;
        drop(r);
        client.abort();
    }
    until(
        Duration::from_secs(5),
        "the cancellations recorded",
        || async {
            view().await["variants"]
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v["outcomes"]["client_cancelled"].as_u64() >= Some(30))
        },
    )
    .await;
    let x = view().await;
    let check = &x["verdicts"][0]["checks"][0];
    assert_eq!(check["state"], "undecided", "{check}");
    assert!(
        check["why"].as_str().unwrap().contains("cancelled"),
        "{check}"
    );
    gw.shutdown();
}

/// A posted result that is well formed but impossible is refused with its reason, and nothing
/// acts on it: an inverted interval around a 60-point drop, an accuracy of 7, a suite name that
/// rewrites a terminal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impossible_quality_results_are_refused() {
    let state = temp_dir().join("state");
    let (yaml, _sims) = stateful(&state).await;
    let gw = start_yaml(&yaml).await;
    for (body, why) in [
        (BROKEN.replace("[-0.23,-0.15]", "[0.2,-0.9]"), "[low, high]"),
        (BROKEN.replace("\"value\":0.99", "\"value\":7"), "0..1"),
        (BROKEN.replace("\"quiz\"", "\"quiz\\u001b[2J\""), "control"),
    ] {
        let r = post(gw.admin_addr, "/experiments/quality", &body, &[]).await;
        assert_eq!(r.status, 400, "{body}");
        let text = String::from_utf8_lossy(&r.body()).into_owned();
        assert!(text.contains(why), "{text}");
    }
    let (_, body) = admin_get(gw.admin_addr, "/experiments").await;
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(doc["experiments"][0]["quality"], serde_json::json!([]));
    assert_eq!(tripped(gw.admin_addr).await, 0);
    gw.shutdown();
}
