//! `inferscope bench` against the gateway and simulator: every request measured, figures that
//! bracket the gateway's own, open- and closed-loop arrivals.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use inferscope::lab::loadgen::{self, Arrivals, BenchOptions};
use std::time::Duration;

fn options(url: String, arrivals: Arrivals, requests: usize) -> BenchOptions {
    BenchOptions {
        url,
        model: "demo".into(),
        endpoint: Default::default(),
        prompts: loadgen::synthetic_prompts(10, 16, 1),
        arrivals,
        pacing: Default::default(),
        requests,
        duration: None,
        stream: true,
        max_tokens: 8,
        ignore_eos: false,
        timeout: None,
        slo: loadgen::parse_slo("ttft=10s,tpot=10s").unwrap(),
        headers: vec![],
        seed: 3,
        progress: false,
        http2_connections: None,
        warmup: 0,
        connector: inferscope::tls::Connector::new(None, std::time::Duration::from_secs(5)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_measures_every_request_and_brackets_the_gateway() {
    let sim = start_sim(exact(20.0, 3.0), 1).await;
    let dir = temp_dir();
    let gw = start_gateway(&[("sim", sim.addr)], &dir, "").await;
    let o = options(
        format!("http://{}", gw.data_addr),
        Arrivals::Concurrency(4),
        24,
    );
    let (samples, wall) = loadgen::run(&o).await;
    let r = loadgen::summarize(&samples, wall, &o.slo);
    assert_eq!((r.requests, r.failed), (24, 0));
    assert_eq!(
        r.goodput,
        Some(r.request_throughput),
        "loose SLOs: all good"
    );
    let tokens: u64 = samples.iter().map(|s| s.output_tokens).sum();
    assert_eq!(tokens, 24 * 8, "output tokens from usage");
    let (_, stats) = admin_get(gw.admin_addr, "/stats").await;
    // The live document reads back into its type.
    let stats: inferscope::stats::StatsDoc = serde_json::from_str(&stats).unwrap();
    let all = &stats.rollups.all;
    assert_eq!(all.cumulative.requests, 24);
    let gw_ttft = all.cumulative.ttft.unwrap().p50;
    let client_ttft = r.ttft_ms.unwrap().median;
    // The client's clock starts before the gateway's and stops after it: never below (1% slack
    // for the histogram's precision and the different medians of 24 samples).
    assert!(
        client_ttft >= gw_ttft * 0.99 && client_ttft >= 20.0,
        "client {client_ttft} vs gateway {gw_ttft}"
    );
    let text = loadgen::render(&r, Some(&all.cumulative));
    assert!(
        text.contains("| TTFT |") && text.contains("gateway p50"),
        "{text}"
    );
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 24);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_arrivals_follow_the_rate() {
    let sim = start_sim(exact(1.0, 1.0), 2).await;
    let dir = temp_dir();
    let gw = start_gateway(&[("sim", sim.addr)], &dir, "").await;
    // 40 requests at 100/s, evenly spaced: about 0.4 s however fast each request is.
    let o = options(
        format!("http://{}", gw.data_addr),
        Arrivals::Constant(100.0),
        40,
    );
    let (samples, wall) = loadgen::run(&o).await;
    assert_eq!(samples.len(), 40);
    assert!(wall >= Duration::from_millis(390), "{wall:?}");
    assert!(samples.iter().all(|s| s.status == 200 && s.complete));
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_connections_multiplex_many_streams_through_the_gateway() {
    let sim = start_sim(exact(5.0, 2.0), 4).await;
    let dir = temp_dir();
    let gw = start_gateway(&[("sim", sim.addr)], &dir, "").await;
    let mut o = options(
        format!("http://{}", gw.data_addr),
        Arrivals::Concurrency(300),
        300,
    );
    o.http2_connections = Some(3);
    let (samples, wall) = loadgen::run(&o).await;
    let r = loadgen::summarize(&samples, wall, &o.slo);
    assert_eq!((r.successful, r.failed), (300, 0), "{r:?}");
    assert!(samples.iter().all(|s| s.complete && s.output_tokens == 8));
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 300);
    assert!(
        log.iter().all(|l| l["protocol"] == "HTTP/2.0"),
        "every request arrived over HTTP/2: {:?}",
        log.first()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warmup_requests_are_sent_but_left_out_of_the_report() {
    let sim = start_sim(exact(2.0, 1.0), 5).await;
    let dir = temp_dir();
    let gw = start_gateway(&[("sim", sim.addr)], &dir, "").await;
    let mut o = options(
        format!("http://{}", gw.data_addr),
        Arrivals::Concurrency(2),
        6,
    );
    o.warmup = 4;
    let (samples, wall) = loadgen::run(&o).await;
    let r = loadgen::summarize(&samples, wall, &o.slo);
    assert_eq!((r.requests, r.failed), (6, 0));
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 10, "4 warm-up requests reached the gateway too");
}

/// `inferscope bench` says its requests are a benchmark's: where the route takes the purpose they
/// are counted apart from live traffic (its own `/stats` rollup, compared with the client's
/// figures by `--compare-gateway`); where it does not, the run says so and they count as live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_benchmark_is_counted_apart_where_the_route_takes_its_purpose() {
    let sim = start_sim(exact(2.0, 1.0), 1).await;
    for taken in [true, false] {
        let dir = temp_dir();
        let extra = if taken {
            "    purpose_header: true\n"
        } else {
            ""
        };
        let gw = start_gateway(&[("sim", sim.addr)], &dir, extra).await;
        // Other traffic first: the gateway's totals are not this run's.
        for _ in 0..5 {
            chat_ok(gw.data_addr, true, 30).await;
        }
        let (url, admin) = (
            format!("http://{}", gw.data_addr),
            format!("http://{}", gw.admin_addr),
        );
        let report = dir.join("run.json");
        let out_arg = report.display().to_string();
        let out = tokio::task::spawn_blocking(move || {
            inferscope(&[
                "bench",
                "--url",
                &url,
                "--model",
                "demo",
                "--concurrency",
                "2",
                "--requests",
                "12",
                "--max-tokens",
                "4",
                // Warm-up requests and the counting of the prompts' tokens go through the
                // gateway too, untagged: not the run's requests.
                "--warmup",
                "2",
                "--dataset-name",
                "random",
                "--random-input-len",
                "8",
                "--compare-gateway",
                &admin,
                // The engine's description and its /metrics read through the run: the
                // benchmark's requests too, never live traffic.
                "--engine-info",
                "--sample-every",
                "50ms",
                "--out",
                &out_arg,
            ])
        })
        .await
        .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        );
        let (_, stats) = admin_get(gw.admin_addr, "/stats").await;
        let stats: serde_json::Value = serde_json::from_str(&stats).unwrap();
        let live = stats["rollups"]["all"]["cumulative"]["requests"].as_u64();
        let by_purpose = |p: &str| {
            stats["rollups"]["purpose"]
                .as_array()
                .unwrap()
                .iter()
                .find(|g| g["purpose"] == p)
                .map(|g| g["cumulative"]["requests"].as_u64().unwrap())
        };
        let r = report_at(&report);
        let run_id = r.run.as_ref().unwrap().run_id.clone().unwrap();
        if taken {
            assert_eq!(live, Some(5), "{stats}");
            assert!(
                by_purpose("bench").unwrap() > 14,
                "the run, its warm-up and its /tokenize calls: {stats}"
            );
            assert!(!stderr.contains("did not take"), "{stderr}");
            // The client's figures sit beside the gateway's for the same requests: this run's
            // twelve, not the gateway's totals.
            assert!(stdout.contains("| gateway p50 | Δ p50 |"), "{stdout}");
            assert!(
                stdout.contains("gateway: 12 of this run's 12 requests recorded under its run id"),
                "{stdout}"
            );
            let g = r.gateway.expect("the gateway's figures in the report");
            assert_eq!((g.requests, g.output_tokens), (12, 48));
            // The client's clock brackets the gateway's.
            assert!(r.e2e_ms.unwrap().median >= g.e2e.unwrap().p50 * 0.99);
            let (status, one) = admin_get(gw.admin_addr, &format!("/stats/runs/{run_id}")).await;
            assert_eq!(status, 200, "{one}");
        } else {
            assert!(live.unwrap() > 19, "{stats}");
            assert!(
                stderr.contains("the gateway columns are left out"),
                "{stderr}"
            );
            assert!(r.gateway.is_none());
            let (status, _) = admin_get(gw.admin_addr, &format!("/stats/runs/{run_id}")).await;
            assert_eq!(status, 404);
            assert!(
                stderr.contains("did not take x-inferscope-purpose: bench"),
                "{stderr}"
            );
        }
        let log = stop_and_read_log(gw, &dir).await;
        let want = if taken { "bench" } else { "live" };
        let tagged: Vec<_> = log.iter().filter(|l| l["run"] == run_id.as_str()).collect();
        assert!(tagged.iter().all(|l| l["purpose"] == want), "{log:?}");
        assert_eq!(
            tagged.len(),
            if taken { 12 } else { 0 },
            "the run's lines carry its id"
        );
    }
}

/// `inferscope bench ARGS`, with the OpenAI SDK's variables cleared and then `env` set: its
/// output, whatever its exit status.
fn bench_cli(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_inferscope"));
    cmd.arg("bench")
        .args(args)
        .env_remove("OPENAI_BASE_URL")
        .env_remove("OPENAI_API_KEY");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// `inferscope bench ARGS --out FILE` off the runtime (what it measures may run on it), the
/// file named `name` in a new directory: its output, and the file's path.
async fn bench_file(args: &[&str], name: &str) -> (std::process::Output, std::path::PathBuf) {
    let file = temp_dir().join(name);
    let mut all: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    all.extend(["--out".to_owned(), file.display().to_string()]);
    let out = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = all.iter().map(String::as_str).collect();
        bench_cli(&args, &[])
    })
    .await
    .unwrap();
    (out, file)
}

/// `bench_file` in the report's own format: the output, and the report written (`None`: none).
async fn bench_run(args: &[&str]) -> (std::process::Output, Option<loadgen::BenchReport>) {
    let (out, file) = bench_file(args, "run.json").await;
    let report = std::fs::read(&file)
        .ok()
        .map(|b| serde_json::from_slice(&b).unwrap());
    (out, report)
}

/// `bench_run` against a simulator of `profile`, two requests in flight: also how long it took.
async fn bench_sim(
    profile: inferscope::sim::Profile,
    args: &[&str],
) -> (std::process::Output, Option<loadgen::BenchReport>, Duration) {
    let sim = start_sim(profile, 1).await;
    let url = format!("http://{}", sim.addr);
    let mut all = vec!["--url", url.as_str(), "--concurrency", "2"];
    all.extend(args);
    let t0 = std::time::Instant::now();
    let (out, report) = bench_run(&all).await;
    (out, report, t0.elapsed())
}

/// SHA-256, lowercase hex (ring's, not the code under test's).
fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The `--out` report a run wrote.
fn report_at(path: &std::path::Path) -> loadgen::BenchReport {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_reported_by_reason_and_fail_the_run() {
    let sim = start_sim(exact(1.0, 1.0), 1).await;
    let dir = temp_dir();
    let out = dir.join("dead.json");
    let (dead, wrong, file) = (
        format!("http://{DEAD}"),
        format!("http://{}/no/such/api", sim.addr),
        out.to_str().unwrap().to_owned(),
    );
    let run = tokio::task::spawn_blocking(move || {
        let a = bench_cli(&["--url", &dead, "--requests", "3", "--out", &file], &[]);
        let b = bench_cli(&["--url", &wrong, "--requests", "2"], &[]);
        (a, b)
    });
    let (dead_run, wrong_run) = run.await.unwrap();
    // Nothing listens: each request a connect failure, the error said, the run failed.
    let (stdout, stderr) = (
        String::from_utf8_lossy(&dead_run.stdout),
        String::from_utf8_lossy(&dead_run.stderr),
    );
    assert_eq!(dead_run.status.code(), Some(1), "{stdout}{stderr}");
    assert!(
        stderr.contains("no request succeeded: 3 of 3 failed (most: 3 × connect)"),
        "{stderr}"
    );
    assert!(stdout.contains("failed: 3 × connect, e.g. "), "{stdout}");
    let r = report_at(&out);
    assert_eq!((r.failed, r.failures.len()), (3, 1), "{r:?}");
    assert_eq!(r.failures[0].count, 3);
    match &r.failures[0].example {
        loadgen::Failure::Connect { error } => assert!(!error.is_empty()),
        other => panic!("{other:?}"),
    }
    // A path the server does not have: the status and what it said.
    let stdout = String::from_utf8_lossy(&wrong_run.stdout);
    assert_eq!(wrong_run.status.code(), Some(1));
    assert!(stdout.contains("failed: 2 × status 404, e.g. "), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_url_and_key_are_read_as_the_openai_sdk_reads_them() {
    let sim = start_sim(exact(1.0, 1.0), 1).await;
    let dir = temp_dir();
    let key = "sk-bench-0123456789abcdef";
    let digest = sha256_hex(key.as_bytes());
    let gw = start_gateway(
        &[("sim", sim.addr)],
        &dir,
        &format!("auth:\n  keys:\n    - {{ name: team, sha256: \"{digest}\" }}\n"),
    )
    .await;
    let base = format!("http://{}", gw.data_addr);
    let v1 = format!("{base}/v1/");
    let run = tokio::task::spawn_blocking(move || {
        let args = ["--requests", "2", "--max-tokens", "3"];
        // The base URL with `/v1` (and a trailing slash), and the key, from the environment.
        let from_env = bench_cli(&args, &[("OPENAI_BASE_URL", &v1), ("OPENAI_API_KEY", key)]);
        // Without `/v1`, on the command line; a wrong key.
        let mut flags = vec!["--url", base.as_str(), "--api-key", "sk-wrong"];
        flags.extend(args);
        let wrong_key = bench_cli(&flags, &[]);
        (from_env, wrong_key)
    });
    let (from_env, wrong_key) = run.await.unwrap();
    assert!(
        from_env.status.success(),
        "{}",
        String::from_utf8_lossy(&from_env.stderr)
    );
    assert!(String::from_utf8_lossy(&from_env.stdout).contains("(2 successful, 0 failed)"));
    assert_eq!(wrong_key.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&wrong_key.stdout).contains("failed: 2 × status 401, e.g. "),
        "{}",
        String::from_utf8_lossy(&wrong_key.stdout)
    );
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 4);
    assert!(
        log.iter().all(|l| l["path"] == "/v1/chat/completions"),
        "{log:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_is_spoken_and_measured() {
    let sim = start_sim(exact(2.0, 1.0), 1).await;
    let dir = temp_dir();
    let gw = start_gateway(&[("sim", sim.addr)], &dir, "").await;
    let url = format!("http://{}", gw.data_addr);
    let out = dir.clone();
    let reports = tokio::task::spawn_blocking(move || {
        ["chat", "completions", "responses", "messages"].map(|ep| {
            let file = out.join(format!("{ep}.json"));
            let args = [
                "--url",
                url.as_str(),
                "--endpoint",
                ep,
                "--requests",
                "3",
                "--max-tokens",
                "5",
                "--out",
                file.to_str().unwrap(),
            ];
            let run = bench_cli(&args, &[]);
            assert!(
                run.status.success(),
                "{ep}: {}",
                String::from_utf8_lossy(&run.stdout)
            );
            (ep, report_at(&file))
        })
    })
    .await
    .unwrap();
    for (ep, r) in &reports {
        assert_eq!((r.successful, r.failed), (3, 0), "{ep}");
        // Every token read from the endpoint's own events: five each, four gaps between them.
        assert!(r.ttft_ms.is_some() && r.tpot_ms.is_some(), "{ep}: {r:?}");
        let tokens = r.output_token_throughput * r.duration_s;
        assert!((tokens - 15.0).abs() < 1e-6, "{ep}: {tokens}");
    }
    let log = stop_and_read_log(gw, &dir).await;
    let paths: std::collections::BTreeSet<&str> =
        log.iter().filter_map(|l| l["path"].as_str()).collect();
    assert_eq!(
        paths,
        [
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/messages",
            "/v1/responses"
        ]
        .into()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duration_stops_the_run_and_cuts_what_is_in_flight() {
    // Each request takes ~0.45 s (20 tokens 20 ms apart after 50 ms): at 1 s two are in flight.
    let (run, report, took) = bench_sim(
        exact(50.0, 20.0),
        &[
            "--requests",
            "1000",
            "--max-tokens",
            "20",
            "--duration",
            "1s",
        ],
    )
    .await;
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let r = report.expect("a report");
    // It ran for its duration, not until the last request ended (a 20-token stream at most).
    assert!(r.duration_s >= 1.0 && r.duration_s < 1.3, "{r:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!((1..=2).contains(&r.cut_at_end), "{r:?}");
    assert_eq!(r.failed, 0, "cut requests are not failures: {r:?}");
    assert!(r.successful >= 2, "{r:?}");
    assert!(
        String::from_utf8_lossy(&run.stdout).contains("in flight when --duration ended"),
        "{}",
        String::from_utf8_lossy(&run.stdout)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_says_what_was_run() {
    let sim = start_sim(exact(1.0, 1.0), 1).await;
    let dir = temp_dir();
    let data = dir.join("prompts.jsonl");
    std::fs::write(&data, "{\"prompt\": \"one\"}\n{\"prompt\": \"two\"}\n").unwrap();
    let url = format!("http://{}/v1", sim.addr);
    let (run, report) = bench_run(&[
        "--url",
        &url,
        "--model",
        "demo",
        "--dataset",
        data.to_str().unwrap(),
        "--concurrency",
        "2",
        "--requests",
        "4",
        "--max-tokens",
        "3",
        "--seed",
        "7",
        "--label",
        "quant=int8",
        "--label",
        "gpu = h100",
        "--api-key",
        "sk-not-in-the-report",
    ])
    .await;
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let report = report.expect("a report");
    let text = serde_json::to_string(&report).unwrap();
    assert!(!text.contains("sk-not-in-the-report"), "{text}");
    let info = report.run.expect("the run's description");
    assert_eq!(info.url, format!("http://{}/v1/chat/completions", sim.addr));
    assert_eq!(
        (info.endpoint.as_str(), info.model.as_str(), info.seed),
        ("chat", "demo", 7)
    );
    assert_eq!(
        (info.arrivals.as_str(), info.concurrency, info.rate),
        ("concurrency", Some(2), None)
    );
    assert_eq!(
        (info.max_requests, info.max_tokens, info.stream),
        (4, 3, true)
    );
    assert_eq!(
        info.dataset_sha256.as_deref(),
        Some(sha256_hex(&std::fs::read(&data).unwrap()).as_str())
    );
    assert_eq!(
        info.labels,
        [
            ("gpu".to_owned(), "h100".to_owned()),
            ("quant".to_owned(), "int8".to_owned())
        ]
        .into()
    );
    assert_eq!(info.inferscope_version, env!("CARGO_PKG_VERSION"));
    assert!(
        info.date.ends_with('Z') && info.date.starts_with("20"),
        "{}",
        info.date
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignore_eos_is_sent_and_the_report_weighs_measured_against_asked_tokens() {
    // A backend that notes each request's body and answers a 2-token stream, whatever was asked.
    let (backend, bodies) = body_noting_backend().await;
    let url = format!("http://{backend}");
    let (run, report) = bench_run(&[
        "--url",
        &url,
        "--requests",
        "2",
        "--max-tokens",
        "9",
        "--ignore-eos",
    ])
    .await;
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let bodies = bodies.lock().unwrap().clone();
    assert_eq!(bodies.len(), 2);
    for b in &bodies {
        let v: serde_json::Value = serde_json::from_slice(b).unwrap();
        assert_eq!(
            (v["ignore_eos"].as_bool(), v["min_tokens"].as_u64()),
            (Some(true), Some(9)),
            "{v}"
        );
    }
    let r = report.expect("a report");
    assert_eq!(
        (r.total_output_tokens, r.requested_output_tokens),
        (4, 18),
        "{r:?}"
    );
    assert!(r.run.unwrap().ignore_eos);
    assert!(
        String::from_utf8_lossy(&run.stdout).contains("output tokens: 4 of 18 asked for"),
        "{}",
        String::from_utf8_lossy(&run.stdout)
    );
}

/// A chat backend that keeps every request body and streams two tokens and `[DONE]`.
async fn body_noting_backend() -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let bodies = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = std::sync::Arc::clone(&bodies);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let seen = std::sync::Arc::clone(&seen);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                // The head, then the body its content-length names.
                let body = loop {
                    let Ok(n) = s.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map_or(0, |v| v.trim().parse().unwrap());
                    if buf.len() >= end + 4 + len {
                        break buf[end + 4..end + 4 + len].to_vec();
                    }
                };
                seen.lock().unwrap().push(body);
                let events = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n";
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{events}",
                    events.len()
                );
                let _ = s.write_all(answer.as_bytes()).await;
            });
        }
    });
    (addr, bodies)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_past_its_timeout_fails_as_a_timeout() {
    // 20 tokens 100 ms apart: two seconds a request, against a 300 ms limit.
    let (run, report, took) = bench_sim(
        exact(10.0, 100.0),
        &[
            "--requests",
            "2",
            "--max-tokens",
            "20",
            "--timeout",
            "300ms",
        ],
    )
    .await;
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert_eq!(run.status.code(), Some(1));
    let r = report.expect("a report");
    assert_eq!(r.failures.len(), 1, "{r:?}");
    assert_eq!(
        (r.failures[0].reason.as_str(), r.failures[0].count),
        ("timeout", 2)
    );
    assert_eq!(
        r.failures[0].example,
        loadgen::Failure::Timeout { after_ms: 300 }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_is_read_as_it_describes_itself() {
    use axum::routing::get;
    // An engine answering as vLLM does, and TGI's /info besides.
    let app = axum::Router::new()
        .route("/version", get(|| async { r#"{"version": "0.99.1"}"# }))
        .route(
            "/v1/models",
            get(|| async {
                r#"{"object": "list", "data": [{"id": "tiny-llama", "object": "model", "max_model_len": 2048}]}"#
            }),
        )
        .route(
            "/metrics",
            get(|| async {
                "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",engine=\"0\",gpu_memory_utilization=\"0.9\",num_gpu_blocks=\"2048\"} 1.0\nvllm:num_requests_running{engine=\"0\",model_name=\"tiny-llama\"} 0.0\n"
            }),
        )
        .route("/info", get(|| async { r#"{"model_id": "tiny-llama", "max_batch_total_tokens": 16000}"# }))
        // Ollama's description of the model asked for, on POST.
        .route(
            "/api/show",
            axum::routing::post(|body: String| async move {
                let asked: serde_json::Value = serde_json::from_str(&body).unwrap();
                assert_eq!(asked["model"], "demo");
                r#"{"modelfile": "FROM /models/x", "template": "{{ .Prompt }}", "details": {"family": "llama", "parameter_size": "8.0B", "quantization_level": "Q4_K_M"}, "model_info": {"llama.context_length": 131072}}"#
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let info = loadgen::engine_info(&options(
        format!("http://{addr}/v1"),
        Arrivals::Concurrency(1),
        1,
    ))
    .await;
    assert_eq!(info.version.as_deref(), Some("0.99.1"));
    assert_eq!(
        info.engine.as_deref(),
        Some("vllm"),
        "told by its metric names"
    );
    assert!(
        info.summary().starts_with("vLLM 0.99.1, tiny-llama"),
        "{}",
        info.summary()
    );
    assert_eq!(info.models.len(), 1);
    assert_eq!(
        (info.models[0].id.as_str(), info.models[0].max_model_len),
        ("tiny-llama", Some(2048))
    );
    let cache: Vec<(&str, &str)> = info
        .cache_config
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        cache,
        [
            ("block_size", "16"),
            ("cache_dtype", "auto"),
            ("gpu_memory_utilization", "0.9"),
            ("num_gpu_blocks", "2048")
        ]
    );
    assert_eq!(
        info.server_info["/info"]["max_batch_total_tokens"], 16000,
        "{info:?}"
    );
    assert!(!info.server_info.contains_key("/props"));
    let show = &info.server_info["/api/show"];
    assert_eq!(show["details"]["quantization_level"], "Q4_K_M", "{show}");
    assert!(show.get("modelfile").is_none() && show.get("template").is_none());
    // trtllm-serve: its /version, and its /metrics as JSON iteration statistics.
    let trt = axum::Router::new()
        .route("/version", get(|| async { r#"{"version": "0.20.0"}"# }))
        .route(
            "/metrics",
            get(|| async {
                r#"[{"iter": 41, "numActiveRequests": 3, "maxBatchSizeRuntime": 64}, {"iter": 42, "numActiveRequests": 5, "maxBatchSizeRuntime": 64, "kvCacheStats": {"usedNumBlocks": 120, "maxNumBlocks": 4096}}]"#
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let trt_addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, trt).await });
    let info = loadgen::engine_info(&options(
        format!("http://{trt_addr}"),
        Arrivals::Concurrency(1),
        1,
    ))
    .await;
    assert_eq!(
        (info.engine.as_deref(), info.version.as_deref()),
        (Some("tensorrt-llm"), Some("0.20.0"))
    );
    assert_eq!(
        info.server_info["/metrics"]["iter"], 42,
        "the latest iteration"
    );
    assert!(
        info.summary().starts_with("TensorRT-LLM 0.20.0"),
        "{}",
        info.summary()
    );
    // Nothing there: nothing claimed.
    let none = loadgen::engine_info(&options(
        format!("http://{DEAD}"),
        Arrivals::Concurrency(1),
        1,
    ))
    .await;
    assert!(none.is_empty(), "{none:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn format_vllm_writes_what_vllm_bench_serve_saves() {
    let sim = start_sim(exact(5.0, 2.0), 1).await;
    let url = format!("http://{}", sim.addr);
    let dir = temp_dir();
    let (ours, theirs) = (dir.join("ours.json"), dir.join("vllm.json"));
    let (o, t) = (ours.clone(), theirs.clone());
    tokio::task::spawn_blocking(move || {
        for (file, format) in [(&o, "inferscope"), (&t, "vllm")] {
            let args = [
                "--url",
                url.as_str(),
                "--rate",
                "50",
                "--requests",
                "10",
                "--max-tokens",
                "6",
                "--seed",
                "5",
                "--format",
                format,
                "--percentiles",
                "50,90,99",
                "--out",
                file.to_str().unwrap(),
            ];
            let run = bench_cli(&args, &[]);
            assert!(
                run.status.success(),
                "{}",
                String::from_utf8_lossy(&run.stderr)
            );
        }
    })
    .await
    .unwrap();
    let r = report_at(&ours);
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&theirs).unwrap()).unwrap();
    assert_eq!(
        (v["completed"].as_u64(), v["failed"].as_u64()),
        (Some(10), Some(0)),
        "{v}"
    );
    assert_eq!(
        (v["backend"].as_str(), v["request_rate"].as_f64()),
        (Some("openai-chat"), Some(50.0))
    );
    assert_eq!(v["total_output_tokens"], 60);
    assert_eq!(
        v["cut_at_end"], 0,
        "what --duration cut is said, not hidden"
    );
    for key in [
        "input_lens",
        "output_lens",
        "ttfts",
        "itls",
        "latencies",
        "errors",
    ] {
        assert_eq!(v[key].as_array().map(Vec::len), Some(10), "{key}: {v}");
    }
    assert!(v["output_lens"].as_array().unwrap().iter().all(|n| n == 6));
    assert!(v["errors"].as_array().unwrap().iter().all(|e| e == ""));
    for metric in ["ttft", "tpot", "itl", "e2el"] {
        for stat in ["mean", "median", "std", "p50", "p90", "p99"] {
            let key = format!("{stat}_{metric}_ms");
            assert!(v[&key].as_f64().is_some_and(|x| x >= 0.0), "{key}: {v}");
        }
    }
    // Each per-request array holds seconds, the statistics milliseconds: the median TTFT from
    // the array is the file's median (ten values: the mean of the middle two).
    let mut ttfts: Vec<f64> = v["ttfts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() * 1000.0)
        .collect();
    ttfts.sort_by(f64::total_cmp);
    let median = (ttfts[4] + ttfts[5]) / 2.0;
    assert!(
        (v["median_ttft_ms"].as_f64().unwrap() - median).abs() < 1e-6,
        "{v}"
    );
    // Our own file: the asked percentiles by the gateway's rule, the same as its table's.
    let ttft = r.ttft_ms.unwrap();
    assert_eq!(r.percentiles["ttft"]["p50"], ttft.median, "{r:?}");
    assert_eq!(r.percentiles["ttft"]["p90"], ttft.p90, "{r:?}");
    assert_eq!(r.percentiles["e2e"]["p99"], r.e2e_ms.unwrap().p99, "{r:?}");
    // vLLM's TTFT is not ours: the file says whose definitions it holds, and its TTFT is the
    // first chunk with choices — the simulator's role chunk, at once — where ours waits for the
    // first token (5 ms). The two files are two runs of the same workload: vLLM's TTFT is the
    // size of our TTFC, well below our TTFT.
    assert!(
        v["definitions"].as_str().unwrap().starts_with("vLLM's"),
        "{v}"
    );
    let (ours_ttft, ours_ttfc) = (r.ttft_ms.unwrap().median, r.ttfc_ms.unwrap().median);
    assert!(
        ours_ttft >= 5.0 && median < 2.0,
        "ours {ours_ttft} vs vLLM's {median}"
    );
    assert!(
        (ours_ttfc - median).abs() < 1.5,
        "TTFC {ours_ttfc} vs vLLM's {median}"
    );
    // vLLM's latency ends at the last chunk with choices, before the usage chunk and [DONE].
    let latencies: Vec<f64> = v["latencies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() * 1000.0)
        .collect();
    assert!(
        latencies.iter().all(|l| *l > 5.0 + 2.0 * 4.0),
        "{latencies:?}"
    );
}

/// A sample workload file in `tests/fixtures/workloads/`.
fn workload(name: &str) -> String {
    format!(
        "{}/tests/fixtures/workloads/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// The simulator's own count of `text` in tokens (its `/tokenize`, as vLLM's answers).
async fn sim_tokens(sim: std::net::SocketAddr, text: &str) -> u64 {
    let body = serde_json::json!({"model": "demo", "prompt": text}).to_string();
    let r = post(
        sim,
        "/tokenize",
        &body,
        &[("content-type", "application/json")],
    )
    .await;
    assert_eq!(r.status, 200);
    serde_json::from_slice::<serde_json::Value>(&r.body()).unwrap()["count"]
        .as_u64()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharegpt_replies_set_the_output_lengths_by_the_backends_tokenizer_with_vllms_filters() {
    let sim = start_sim(exact(1.0, 0.2), 1).await;
    let url = format!("http://{}", sim.addr);
    let file = workload("sharegpt.json");
    let (run, report) = bench_run(&[
        "--url",
        &url,
        "--dataset",
        &file,
        "--requests",
        "100",
        "--concurrency",
        "4",
        "--ignore-eos",
        "--endpoint",
        "completions",
    ])
    .await;
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    let r = report.expect("a report");
    let w = r
        .run
        .as_ref()
        .unwrap()
        .workload
        .clone()
        .expect("the workload in the report");
    // 16 conversations: one has a single turn (not read), three fail vLLM's filters.
    assert_eq!(
        (
            w.layout.as_str(),
            w.entries,
            w.kept,
            w.too_short,
            w.too_long
        ),
        ("sharegpt", 15, 12, 2, 1),
        "{w:?}"
    );
    assert!(w.counted_by.starts_with("tokenizer at http://"), "{w:?}");
    assert!(stderr.contains("workload: 12 of 15 sharegpt entries (2 too short, 1 too long); lengths by tokenizer at"), "{stderr}");
    // Each kept conversation's reply, counted by the backend, is what was asked; and with
    // ignore_eos, what came.
    let convs: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let mut asked = 0;
    let mut prompts = 0;
    for c in convs.as_array().unwrap() {
        // The twelve kept: `s0` … `s11`.
        let id = c["id"].as_str().unwrap();
        if id
            .strip_prefix('s')
            .is_some_and(|n| n.parse::<u32>().is_ok())
        {
            let turns = c["conversations"].as_array().unwrap();
            asked += sim_tokens(sim.addr, turns[1]["value"].as_str().unwrap()).await;
            prompts += sim_tokens(sim.addr, turns[0]["value"].as_str().unwrap()).await;
        }
    }
    // 100 requests of 12 kept entries: each kept one once, then 88 drawn from them as vLLM
    // oversamples, said so.
    assert_eq!((r.requests, w.oversampled), (100, 88));
    assert!(
        stderr.contains("88 requests repeat kept entries"),
        "{stderr}"
    );
    assert!(
        r.requested_output_tokens > asked && r.requested_output_tokens < 100 * asked / 12 * 3,
        "{} asked, {asked} for the twelve",
        r.requested_output_tokens
    );
    assert_eq!(
        r.total_output_tokens, r.requested_output_tokens,
        "the simulator honours ignore_eos"
    );
    assert!(r.total_input_tokens > prompts, "{}", r.total_input_tokens);
    // --max-tokens overrides the replies' lengths (and skips the output-length filter).
    let (run, report) = bench_run(&[
        "--url",
        &url,
        "--dataset",
        &file,
        "--requests",
        "13",
        "--max-tokens",
        "5",
    ])
    .await;
    assert!(run.status.success());
    let r = report.unwrap();
    let w = r.run.as_ref().unwrap().workload.clone().unwrap();
    assert_eq!((w.kept, w.too_short, w.too_long), (13, 1, 1), "{w:?}");
    assert_eq!(r.requested_output_tokens, 13 * 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alpaca_and_longbench_are_read_in_their_released_layouts() {
    let (backend, bodies) = body_noting_backend().await;
    let url = format!("http://{backend}");
    let (run, report) = bench_run(&[
        "--url",
        &url,
        "--dataset",
        &workload("alpaca.json"),
        "--requests",
        "4",
        "--seed",
        "2",
    ])
    .await;
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    let w = report.unwrap().run.unwrap().workload.unwrap();
    assert_eq!((w.layout.as_str(), w.kept, w.too_short), ("alpaca", 3, 1));
    assert!(
        w.counted_by.starts_with("estimate"),
        "no /tokenize here: {w:?}"
    );
    let sent: Vec<serde_json::Value> = bodies
        .lock()
        .unwrap()
        .iter()
        .map(|b| serde_json::from_slice(b).unwrap())
        .filter(|v: &serde_json::Value| v.get("messages").is_some())
        .collect();
    let by_prompt: std::collections::BTreeMap<String, u64> = sent
        .iter()
        .map(|v| {
            (
                v["messages"][0]["content"].as_str().unwrap().to_owned(),
                v["max_tokens"].as_u64().unwrap(),
            )
        })
        .collect();
    // The instruction, and the input on its own line; the output's length by the estimate
    // (4 characters a token, rounded up).
    assert_eq!(
        by_prompt.get("Translate the sentence into French.\nThe server is fast."),
        Some(&6)
    );
    // Its output, `batch`, is under 4 tokens: dropped, as vLLM drops it.
    assert!(!by_prompt.keys().any(|p| p.starts_with("Classify")));
    assert_eq!(by_prompt.len(), 3, "{by_prompt:?}");

    bodies.lock().unwrap().clear();
    let (run, report) = bench_run(&[
        "--url",
        &url,
        "--dataset",
        &workload("longbench.jsonl"),
        "--requests",
        "10",
        "--longbench-length",
        "0-4k",
    ])
    .await;
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let w = report.unwrap().run.unwrap().workload.unwrap();
    assert_eq!(
        (w.layout.as_str(), w.kept, w.other_length),
        ("longbench", 3, 2),
        "{w:?}"
    );
    let sent: Vec<serde_json::Value> = bodies
        .lock()
        .unwrap()
        .iter()
        .map(|b| serde_json::from_slice(b).unwrap())
        .filter(|v: &serde_json::Value| v.get("messages").is_some())
        .collect();
    let mut limits: Vec<(u64, bool)> = sent
        .iter()
        .map(|v| {
            let p = v["messages"][0]["content"].as_str().unwrap();
            (v["max_tokens"].as_u64().unwrap(), p.ends_with("\nAnswer:"))
        })
        .collect();
    limits.sort_unstable();
    limits.dedup();
    // hotpotqa: 32 tokens; qasper: 128; a dataset LongBench does not list: the generic 128.
    assert_eq!(limits, [(32, true), (128, true)], "{sent:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_prompts_are_sized_in_tokens_with_a_shared_prefix() {
    let sim = start_sim(exact(1.0, 0.2), 1).await;
    let url = format!("http://{}", sim.addr);
    let (run, report) = bench_run(&[
        "--url",
        &url,
        "--dataset-name",
        "random",
        "--random-input-len",
        "40",
        "--random-output-len",
        "6",
        "--random-range-ratio",
        "0.5",
        "--random-prefix-len",
        "10",
        "--requests",
        "20",
        "--concurrency",
        "4",
        "--endpoint",
        "completions",
    ])
    .await;
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let r = report.unwrap();
    let w = r.run.as_ref().unwrap().workload.clone().unwrap();
    assert_eq!(
        (w.layout.as_str(), w.kept, w.length_misses),
        ("random", 20, 0),
        "{w:?}"
    );
    // Prompts of 10 + [20, 60] tokens as the backend counts them; outputs of [3, 9].
    let mean_in = r.total_input_tokens as f64 / 20.0;
    assert!((30.0..=70.0).contains(&mean_in), "{mean_in}");
    assert!(r.requested_output_tokens >= 60 && r.requested_output_tokens <= 180);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dataset_in_no_known_layout_is_refused_with_its_line_and_the_layouts_accepted() {
    let dir = temp_dir();
    let bad = dir.join("bad.json");
    std::fs::write(
        &bad,
        "[\n {\"conversations\": [\n  {\"from\": \"human\"}\n ]}\n]\n",
    )
    .unwrap();
    let out = bench_cli(
        &[
            "--url",
            "http://127.0.0.1:9",
            "--dataset",
            bad.to_str().unwrap(),
        ],
        &[],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.json")
            && err.contains("line 3: not the sharegpt layout: missing field `value`"),
        "{err}"
    );
    assert!(err.contains("accepted layouts: ShareGPT"), "{err}");
    let jsonl = dir.join("q.jsonl");
    std::fs::write(&jsonl, "{\"question\": \"why?\"}\n").unwrap();
    let out = bench_cli(
        &[
            "--url",
            "http://127.0.0.1:9",
            "--dataset",
            jsonl.to_str().unwrap(),
        ],
        &[],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("line 1: no string \"prompt\" (keys: question)"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulator_answers_past_its_end_when_asked_to_ignore_eos() {
    // A quiz question: the simulator answers it with one letter and stops, as a model stops at
    // its end-of-sequence token; with ignore_eos it goes on to max_tokens, as vLLM does.
    let sim = start_sim(exact(1.0, 0.2), 1).await;
    let url = format!("http://{}", sim.addr);
    let dir = temp_dir();
    let file = dir.join("quiz.jsonl");
    let quiz = inferscope::sim::quiz::prompt(
        "What is 2 + 3?",
        &["4".into(), "5".into(), "6".into(), "7".into()],
    );
    std::fs::write(
        &file,
        format!("{}\n", serde_json::json!({ "prompt": quiz })),
    )
    .unwrap();
    let file = file.to_str().unwrap();
    let base = [
        "--url",
        &url,
        "--dataset",
        file,
        "--requests",
        "3",
        "--max-tokens",
        "12",
    ];
    let (_, stops) = bench_run(&base).await;
    assert_eq!(stops.unwrap().total_output_tokens, 3);
    let (_, goes_on) = bench_run(&[&base[..], &["--ignore-eos"]].concat()).await;
    assert_eq!(goes_on.unwrap().total_output_tokens, 36);
}

/// The most requests of `samples` in flight at once, from their send times and latencies.
fn most_in_flight(samples: &[loadgen::Sample]) -> usize {
    let mut edges: Vec<(f64, i32)> = samples
        .iter()
        .flat_map(|s| [(s.sent_s, 1), (s.sent_s + s.e2e / 1000.0, -1)])
        .collect();
    // An end before a start at the same instant.
    edges.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut now, mut most) = (0, 0);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    most as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_with_a_concurrency_cap_never_has_more_in_flight() {
    // 100 req/s offered, each request ~50 ms: uncapped, about five would be in flight.
    let sim = start_sim(exact(10.0, 5.0), 1).await;
    let mut o = options(format!("http://{}", sim.addr), Arrivals::Poisson(100.0), 30);
    let (samples, _) = loadgen::run(&o).await;
    assert!(
        most_in_flight(&samples) > 2,
        "the check can fail: uncapped it is over 2"
    );
    o.pacing.max_concurrency = Some(2);
    let (samples, _) = loadgen::run(&o).await;
    assert_eq!(samples.iter().filter(|s| s.failure.is_none()).count(), 30);
    assert!(
        most_in_flight(&samples) <= 2,
        "{}",
        most_in_flight(&samples)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warmup_and_cooldown_stretches_are_sent_but_left_out() {
    let sim = start_sim(exact(1.0, 0.2), 1).await;
    // Evenly 20 req/s for 2 s: the first and last half second hold about ten requests each.
    let mut o = options(format!("http://{}", sim.addr), Arrivals::Constant(20.0), 40);
    o.pacing.warmup_time = Duration::from_millis(500);
    o.pacing.cooldown_time = Duration::from_millis(500);
    let (samples, wall) = loadgen::run(&o).await;
    let r = loadgen::summarize(&samples, wall, &o.slo);
    assert!((16..=22).contains(&r.excluded), "{}", r.excluded);
    assert_eq!(r.requests + r.excluded, 40);
    // Every measured request was sent between the stretches.
    let sent: Vec<f64> = samples
        .iter()
        .filter(|s| !s.excluded)
        .map(|s| s.sent_s)
        .collect();
    assert!(sent.iter().all(|t| (0.45..=1.6).contains(t)), "{sent:?}");
    // Rates over the measured span (about a second), not the whole run.
    assert!(
        r.request_throughput > 15.0 && r.request_throughput < 26.0,
        "{} req/s over {} s",
        r.request_throughput,
        r.duration_s
    );
    let text = loadgen::render(&r, None);
    assert!(text.contains("excluded: "), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ramp_up_starts_slow() {
    let sim = start_sim(exact(1.0, 0.2), 1).await;
    // 40 req/s evenly: 20 in the first half second without a ramp; with a one-second ramp from
    // 4 req/s, about 5.
    let mut o = options(format!("http://{}", sim.addr), Arrivals::Constant(40.0), 60);
    o.pacing.ramp_up = Some(Duration::from_secs(1));
    let (samples, _) = loadgen::run(&o).await;
    let early = samples.iter().filter(|s| s.sent_s < 0.5).count();
    assert!(
        (3..=8).contains(&early),
        "{early} sent in the first half second"
    );
    assert_eq!(samples.len(), 60);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bursty_arrivals_bunch_up_at_the_same_mean_rate() {
    let sim = start_sim(exact(0.5, 0.1), 1).await;
    let gaps = |samples: &[loadgen::Sample]| {
        let mut t: Vec<f64> = samples.iter().map(|s| s.sent_s).collect();
        t.sort_by(f64::total_cmp);
        let g: Vec<f64> = t.windows(2).map(|w| w[1] - w[0]).collect();
        let mean = g.iter().sum::<f64>() / g.len() as f64;
        let var = g.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / g.len() as f64;
        (mean, var.sqrt() / mean)
    };
    let mut o = options(
        format!("http://{}", sim.addr),
        Arrivals::Poisson(100.0),
        200,
    );
    let (poisson, _) = loadgen::run(&o).await;
    o.pacing.burstiness = 0.25;
    let (bursty, _) = loadgen::run(&o).await;
    let ((m1, cv1), (m2, cv2)) = (gaps(&poisson), gaps(&bursty));
    // Gamma gaps of shape k have a coefficient of variation of 1/sqrt(k): 1 and 2.
    assert!(cv1 > 0.7 && cv1 < 1.4, "Poisson CV {cv1}");
    assert!(cv2 > 1.5, "bursty CV {cv2}");
    assert!(
        m2 > 0.005 && m2 < 0.02 && m1 > 0.005 && m1 < 0.02,
        "{m1} {m2}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_prints_and_keeps_its_capacity() {
    let sim = start_sim(exact(1.0, 0.2), 1).await;
    let url = format!("http://{}", sim.addr);
    let (out, file) = bench_file(
        &[
            "--url",
            &url,
            "--sweep",
            "5,10",
            "--requests",
            "6",
            "--slo",
            "ttft=10s",
            "--max-tokens",
            "4",
        ],
        "sweep.json",
    )
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("| met SLOs |") && stdout.contains("| 100% |"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "capacity: at least 10.00 req/s: 90% of requests met ttft<=10000ms at every rate swept"
        ),
        "{stdout}"
    );
    let doc: loadgen::SweepReport = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(doc.runs.len(), 2);
    let c = doc.capacity.unwrap();
    assert_eq!((c.rate, c.next), (Some(10.0), None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_is_kept_on_request_as_json_or_csv() {
    let sim = start_sim(exact(2.0, 1.0), 1).await;
    let url = format!("http://{}", sim.addr);
    let (run, report) = bench_run(&[
        "--url",
        &url,
        "--requests",
        "5",
        "--max-tokens",
        "4",
        "--per-request",
    ])
    .await;
    assert!(run.status.success());
    let r = report.unwrap();
    assert_eq!(r.per_request.len(), 5);
    for s in &r.per_request {
        assert_eq!((s.status, s.output_tokens, s.itl.len()), (200, 4, 3));
        assert!(s.ttft.unwrap() >= 2.0 && s.e2e >= s.ttft.unwrap());
    }
    // The median of the kept TTFTs is the report's (within the gateway's rounding: three
    // significant digits of microseconds, as its histograms keep them).
    let mut ttft: Vec<f64> = r.per_request.iter().map(|s| s.ttft.unwrap()).collect();
    ttft.sort_by(f64::total_cmp);
    assert!(
        (r.ttft_ms.unwrap().median - ttft[2]).abs() <= ttft[2] * 0.001 + 0.001,
        "{ttft:?} {:?}",
        r.ttft_ms
    );

    let (out, file) = bench_file(
        &[
            "--url",
            &url,
            "--requests",
            "3",
            "--max-tokens",
            "4",
            "--format",
            "csv",
        ],
        "run.csv",
    )
    .await;
    assert!(out.status.success());
    let text = std::fs::read_to_string(&file).unwrap();
    let mut lines = text.lines();
    let head: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(head, loadgen::CSV_COLUMNS.split(',').collect::<Vec<_>>());
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 3);
    let col = |name: &str| head.iter().position(|h| *h == name).unwrap();
    for row in &rows {
        assert_eq!(row.len(), head.len());
        assert_eq!(
            (
                row[col("status")],
                row[col("ok")],
                row[col("output_tokens")]
            ),
            ("200", "1", "4")
        );
        let ttft: f64 = row[col("ttft_ms")].parse().unwrap();
        assert!(ttft >= 2.0);
    }
}

/// A DCGM exporter for two GPUs whose energy counters each rise 25 J (25,000 mJ) per scrape and
/// whose power reads 250 W each: known values to check the arithmetic against.
async fn fake_dcgm() -> std::net::SocketAddr {
    use axum::routing::get;
    let scrapes = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let app = axum::Router::new().route(
        "/metrics",
        get(move || {
            let n = scrapes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                let mj = 1_000_000 + 25_000 * n;
                let mut t = String::from("# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n");
                for g in 0..2 {
                    t.push_str(&format!(
                        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{gpu=\"{g}\"}} {mj}\nDCGM_FI_DEV_POWER_USAGE{{gpu=\"{g}\"}} 250\nDCGM_FI_DEV_GPU_UTIL{{gpu=\"{g}\"}} 80\nDCGM_FI_DEV_FB_USED{{gpu=\"{g}\"}} 1024\n"
                    ));
                }
                t
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hardware_side_gives_energy_per_token_and_the_engines_own_batch() {
    // An engine that runs two at a time while the client keeps eight in flight: the roofline
    // must take the engine's batch (2), not the client's (8).
    let sim = start_sim(
        inferscope::sim::Profile {
            max_batch: Some(2),
            ..exact(5.0, 4.0)
        },
        1,
    )
    .await;
    let dcgm = fake_dcgm().await;
    let url = format!("http://{}", sim.addr);
    let (engine, gpu) = (
        format!("http://{}/metrics", sim.addr),
        format!("http://{dcgm}/metrics"),
    );
    let (run, report) = bench_run(&[
        "--url",
        &url,
        "--concurrency",
        "8",
        "--requests",
        "24",
        "--max-tokens",
        "20",
        "--engine-metrics",
        &engine,
        "--gpu-metrics",
        &gpu,
        "--sample-every",
        "100ms",
        "--params-b",
        "8",
        "--gpu",
        "h100",
    ])
    .await;
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let r = report.unwrap();
    let h = r.hardware.clone().expect("the hardware side");
    assert!(h.samples >= 4, "{h:?}");
    let g = h.gpu.clone().unwrap();
    // Two GPUs, 25 J each per reading after the first.
    let want = 2.0 * 25.0 * (h.samples - 1) as f64;
    assert_eq!(g.count, 2);
    assert_eq!(
        (g.energy_joules, g.energy_from.as_deref()),
        (Some(want), Some("counter")),
        "{g:?}"
    );
    assert_eq!(r.total_output_tokens, 24 * 20);
    let jpt = g.joules_per_output_token.unwrap();
    assert!((jpt - want / 480.0).abs() < 1e-12, "{jpt}");
    assert_eq!(g.power_mean_watts, Some(500.0));
    assert!((g.utilization_mean.unwrap() - 0.8).abs() < 1e-9);
    assert!(
        stdout.contains(&format!("{jpt:.4} J per output token")),
        "{stdout}"
    );
    let e = h.engine.clone().unwrap();
    assert_eq!(e.running_max, Some(2.0), "{e:?}");
    assert!(e.waiting_max.unwrap() >= 4.0, "{e:?}");
    let batch = r
        .roofline
        .as_ref()
        .unwrap()
        .decode
        .as_ref()
        .unwrap()
        .batch
        .unwrap();
    assert!(
        batch > 1.0 && batch <= 2.0,
        "the engine's batch, not the client's 8: {batch}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_gpu_is_said_and_the_run_goes_on() {
    let sim = start_sim(exact(1.0, 0.2), 1).await;
    let url = format!("http://{}", sim.addr);
    let (run, report) = bench_run(&[
        "--url",
        &url,
        "--requests",
        "3",
        "--gpu-metrics",
        "http://127.0.0.1:9/metrics",
        "--sample-every",
        "50ms",
    ])
    .await;
    assert!(run.status.success());
    let h = report.unwrap().hardware.unwrap();
    assert!(
        h.gpu.is_none() && h.errors.iter().any(|e| e.contains("127.0.0.1:9")),
        "{h:?}"
    );
    assert!(String::from_utf8_lossy(&run.stdout)
        .contains("hardware: not read: http://127.0.0.1:9/metrics"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_loop_run_ends_with_its_last_request_not_a_gap_later() {
    // Evenly 2 req/s, three requests: sent at 0, 0.5 and 1 s, each answered in a few ms. The
    // run lasts about a second; waiting out one more gap would make it 1.5 s and its throughput
    // a third lower than what was served.
    let sim = start_sim(exact(1.0, 0.2), 1).await;
    let o = options(format!("http://{}", sim.addr), Arrivals::Constant(2.0), 3);
    let (samples, wall) = loadgen::run(&o).await;
    assert_eq!(samples.len(), 3);
    assert!(
        wall >= Duration::from_secs(1) && wall < Duration::from_millis(1300),
        "{wall:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_to_the_knee_doubles_until_the_slos_break_then_bisects() {
    // Two at a time, ~25 ms each: about 80 req/s served; far past it, requests queue and miss
    // a 50 ms TTFT.
    let sim = start_sim(
        inferscope::sim::Profile {
            max_batch: Some(2),
            ..exact(5.0, 2.0)
        },
        1,
    )
    .await;
    let url = format!("http://{}", sim.addr);
    let (out, file) = bench_file(
        &[
            "--url",
            &url,
            "--sweep-to-knee",
            "10",
            "--knee-steps",
            "2",
            "--requests",
            "30",
            "--max-tokens",
            "10",
            "--slo",
            "ttft=50ms",
        ],
        "knee.json",
    )
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: loadgen::SweepReport = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let rates: Vec<f64> = doc.runs.iter().map(|r| r.rate.unwrap()).collect();
    assert!(rates.windows(2).all(|w| w[0] < w[1]), "by rate: {rates:?}");
    // Doublings from 10 until one missed, then two bisections between it and the last good.
    let c = doc.capacity.unwrap();
    let (good, (bad, attained)) = (c.rate.unwrap(), c.next.unwrap());
    assert!(attained < 0.9 && good < bad, "{c:?}");
    let doublings = rates
        .iter()
        .filter(|r| [10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0].contains(r))
        .count();
    assert_eq!(rates.len(), doublings + 2, "{rates:?}");
    assert!(stdout.contains("capacity: "), "{stdout}");
}

/// A backend whose `/tokenize` fails now and then (every `fail_every`-th call: a busy engine's
/// tokenizer), and always for a prompt holding `poison`; it answers chat completions at once.
/// Returns its address and the prompts it answered, in order.
async fn flaky_tokenizer(
    fail_every: usize,
    poison: &'static str,
) -> (
    std::net::SocketAddr,
    std::sync::Arc<parking_lot::Mutex<Vec<String>>>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let asked = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = std::sync::Arc::clone(&asked);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let (seen, calls) = (std::sync::Arc::clone(&seen), std::sync::Arc::clone(&calls));
            tokio::spawn(async move {
                loop {
                    // One request: head, then its Content-Length body.
                    let mut buf = Vec::new();
                    let mut byte = [0u8; 1];
                    while !buf.ends_with(b"\r\n\r\n") {
                        if s.read_exact(&mut byte).await.is_err() {
                            return;
                        }
                        buf.push(byte[0]);
                    }
                    let head = String::from_utf8_lossy(&buf).to_ascii_lowercase();
                    let len = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse::<usize>().ok())
                        .unwrap_or(0);
                    let mut body = vec![0u8; len];
                    if s.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                    let (status, reply) = if head.starts_with("post /tokenize") {
                        let text = v["prompt"].as_str().unwrap_or_default();
                        let n = calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                        if text.contains(poison) || n % fail_every == 0 {
                            ("500 Internal Server Error", "{}".to_owned())
                        } else {
                            let count = text.split_whitespace().count() + 1;
                            ("200 OK", format!("{{\"count\":{count}}}"))
                        }
                    } else {
                        let prompt = v["prompt"]
                            .as_str()
                            .or_else(|| v["messages"][0]["content"].as_str())
                            .unwrap_or_default()
                            .to_owned();
                        seen.lock().push(prompt);
                        (
                            "200 OK",
                            r#"{"id":"c","object":"text_completion","model":"demo","choices":[{"index":0,"text":"ok","finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}"#.to_owned(),
                        )
                    };
                    let out = format!(
                        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{reply}",
                        reply.len()
                    );
                    if s.write_all(out.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, asked)
}

/// A tokenizer that fails now and then loses no entry (each count is tried again) and recycles
/// none: the kept entries are sent once each, in vLLM's order. One that keeps failing on some
/// entries drops those, counted by reason — and past a bound the run stops and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_tokenizer_drops_nothing_silently_and_repeats_no_prompt() {
    let file = workload("sharegpt.json");
    let (addr, asked) = flaky_tokenizer(3, "no-such-text").await;
    let url = format!("http://{addr}");
    let (run, report) = bench_run(&[
        "--url",
        &url,
        "--dataset",
        &file,
        "--requests",
        "12",
        "--endpoint",
        "completions",
        "--no-stream",
        "--max-tokens",
        "4",
    ])
    .await;
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    let w = report.unwrap().run.unwrap().workload.unwrap();
    assert_eq!(
        (w.entries, w.kept, w.tokenizer_failed, w.oversampled),
        (15, 12, 0, 0),
        "{w:?}"
    );
    let prompts = asked.lock().clone();
    let distinct: std::collections::BTreeSet<&String> = prompts.iter().collect();
    assert_eq!(
        (prompts.len(), distinct.len()),
        (12, 12),
        "no prompt repeated"
    );

    // Entries the tokenizer never counts (the four prompts holding \"the\"): dropped and
    // counted, up to three; past it, the run stops and says why.
    let (addr, _) = flaky_tokenizer(usize::MAX, " the ").await;
    let url = format!("http://{addr}");
    let (run, _) = bench_run(&[
        "--url",
        &url,
        "--dataset",
        &file,
        "--requests",
        "12",
        "--endpoint",
        "completions",
        "--no-stream",
    ])
    .await;
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success(), "{stderr}");
    assert!(
        stderr.contains("the tokenizer") && stderr.contains("failed on 4 of the"),
        "{stderr}"
    );
}

/// A backend given as `http://host:port/v1` (the OpenAI SDK's and LiteLLM's habit): requests
/// keep their path, and the engine's own paths (`/tokenize`, `/metrics`, `/health`) reach its
/// root, so bench counts in the engine's tokens through the gateway; `check` refuses a URL that
/// names an endpoint, with the base URL to give instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_url_ending_in_v1_reaches_the_engines_own_paths() {
    let sim = start_sim(exact(1.0, 0.2), 1).await;
    let dir = temp_dir();
    let gw = start_yaml(&format!(
        "access_log: {{ path: {:?} }}\nbackends:\n  - {{ name: e, url: \"http://{}/v1\", metrics: {{ interval: 100ms }} }}\nroutes:\n  - {{ name: all, backends: [e] }}\n",
        dir.join("access.jsonl"),
        sim.addr
    ))
    .await;
    let r = post(
        gw.data_addr,
        "/tokenize",
        r#"{"model":"demo","prompt":"hello there world"}"#,
        &[],
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body()));
    let url = format!("http://{}", gw.data_addr);
    let (run, report) = bench_run(&[
        "--url",
        &url,
        "--dataset",
        &workload("sharegpt.json"),
        "--requests",
        "12",
        "--max-tokens",
        "4",
    ])
    .await;
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let w = report.unwrap().run.unwrap().workload.unwrap();
    assert!(w.counted_by.starts_with("tokenizer at"), "{w:?}");
    // The engine's own metrics are scraped from its root too.
    until(
        Duration::from_secs(5),
        "a scrape of the engine's /metrics",
        || async {
            backend_stats(gw.admin_addr, "e").await["scrape"]["ok_total"]
                .as_u64()
                .is_some_and(|n| n > 0)
        },
    )
    .await;
    gw.shutdown();

    let cfg = dir.join("endpoint.yaml");
    std::fs::write(
        &cfg,
        "backends:\n  - { name: e, url: \"http://127.0.0.1:8000/v1/chat/completions\" }\nroutes:\n  - { name: all, backends: [e] }\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_inferscope"))
        .args(["check", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("names an endpoint") && err.contains("`http://127.0.0.1:8000/v1`"),
        "{err}"
    );
}
