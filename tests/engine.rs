//! The backend's own view, joined: engine and GPU metrics read from each engine's and exporter's
//! documented exposition (tests/fixtures/metrics/), and scraped end to end from the simulator's
//! vLLM-named `/metrics` into `/stats`, `/metrics` and each request's access-log line.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use inferscope::route::engine::{EngineView, GpuView};
use serde_json::Value;
use std::time::Duration;

fn fixture(name: &str) -> String {
    std::fs::read_to_string(format!(
        "{}/tests/fixtures/metrics/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

fn near(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() < 1e-9)
}

#[test]
fn every_engine_is_read_by_its_own_names() {
    let first = EngineView::parse(&fixture("vllm.txt"), None);
    // Two engines (data parallel): queues summed, the fuller cache kept.
    assert_eq!((first.running, first.waiting), (Some(21.0), Some(4.0)));
    assert!(near(first.kv_cache_usage, 0.71));
    assert_eq!(
        first.prefix_cache_hit_rate, None,
        "a rate needs two scrapes"
    );
    let later = EngineView::parse(&fixture("vllm-later.txt"), Some(&first));
    assert!(near(later.prefix_cache_hit_rate, 400.0 / 500.0));
    assert!(near(later.prefill_seconds, 1.5 / 10.0));
    // vLLM's queue-time histogram: 2 s more over 4 more requests.
    assert!(near(later.queue_seconds, 2.0 / 4.0));
    assert_eq!(first.queue_seconds, None, "a mean needs two scrapes");
    // A counter that went back (a restart) gives no rate rather than a wrong one.
    let restarted = EngineView::parse(&fixture("vllm.txt"), Some(&later));
    assert_eq!(restarted.prefix_cache_hit_rate, None);

    let sglang = EngineView::parse(&fixture("sglang.txt"), None);
    assert_eq!((sglang.running, sglang.waiting), (Some(24.0), Some(5.0)));
    assert!(near(sglang.kv_cache_usage, 0.43));
    assert!(near(sglang.prefix_cache_hit_rate, 0.25));
    let tgi = EngineView::parse(&fixture("tgi.txt"), None);
    assert_eq!((tgi.running, tgi.waiting), (Some(32.0), Some(7.0)));
    let llama = EngineView::parse(&fixture("llamacpp.txt"), None);
    assert_eq!((llama.running, llama.waiting), (Some(2.0), Some(1.0)));
    assert!(near(llama.kv_cache_usage, 0.125));
    assert!(EngineView::parse(&fixture("dcgm.txt"), None).is_empty());
    // TensorRT-LLM behind Triton: the batch is the `scheduled` requests (not `active`, which
    // holds the ones still in context), the queue `waiting`, the KV cache its `fraction`.
    let triton = EngineView::parse(&fixture("triton-trtllm.txt"), None);
    assert_eq!((triton.running, triton.waiting), (Some(12.0), Some(3.0)));
    assert!(near(triton.kv_cache_usage, 0.75));
    let serve = EngineView::parse(&fixture("trtllm-serve.txt"), None);
    assert_eq!((serve.running, serve.waiting), (Some(9.0), Some(4.0)));
    assert!(near(serve.kv_cache_usage, 0.5));
    // trtllm-serve's own /metrics: JSON iteration statistics, the latest iteration read.
    let iterations = EngineView::parse(&fixture("trtllm-serve-iterations.json"), None);
    assert_eq!(
        (iterations.running, iterations.waiting),
        (Some(7.0), Some(2.0))
    );
    assert!(near(iterations.kv_cache_usage, 0.5));
    assert!(EngineView::parse("[]", None).is_empty());
}

#[test]
fn both_gpu_exporters_are_read_in_base_units() {
    let dcgm = GpuView::parse(&fixture("dcgm.txt"));
    assert_eq!(dcgm.count, 2);
    assert!(near(dcgm.utilization, 0.94));
    assert!(near(dcgm.memory_used_bytes, 2.0 * 77824.0 * 1048576.0));
    assert!(near(dcgm.memory_total_bytes, 2.0 * 81920.0 * 1048576.0));
    assert!(near(dcgm.power_watts, 1200.0));
    assert!(near(dcgm.sm_clock_hz, 1867.5e6));
    // The energy counter, millijoules summed over the GPUs, in joules.
    assert!(near(dcgm.energy_joules, 1_800_000.0));
    let smi = GpuView::parse(&fixture("nvidia-smi-exporter.txt"));
    assert_eq!(smi.count, 1);
    assert!(near(smi.utilization, 0.83));
    assert!(near(smi.memory_used_bytes, 2.097152e10));
    assert!(near(smi.memory_total_bytes, 2.4146608128e10));
    assert!(near(smi.power_watts, 71.5));
    assert!(near(smi.sm_clock_hz, 2.04e9));
    assert_eq!(
        smi.energy_joules, None,
        "nvidia_gpu_exporter has no energy counter"
    );
}

/// A server answering every GET with `body` as a Prometheus exposition.
async fn exporter(body: &str) -> std::net::SocketAddr {
    let response = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    start_raw(vec![response.into_bytes()], Duration::ZERO).await
}

async fn stats(admin: std::net::SocketAddr) -> Value {
    serde_json::from_str(&admin_get(admin, "/stats").await.1).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_and_gpu_scrapes_reach_stats_metrics_and_each_request() {
    // Long streams, so a scrape sees them running.
    let sim = start_sim(exact(5.0, 20.0), 11).await;
    let gpu = exporter(&fixture("dcgm.txt")).await;
    let dir = temp_dir();
    let yaml = format!(
        "access_log: {{ path: {:?} }}\n\
         backends:\n  - name: sim\n    url: \"http://{}\"\n    metrics: {{ interval: 50ms, gpu_url: \"http://{gpu}/metrics\" }}\n  \
         - name: blind\n    url: \"http://{}\"\n    metrics: {{ url: \"http://{DEAD}/metrics\", interval: 50ms }}\n\
         routes:\n  - name: main\n    match: {{ model: demo }}\n    backends: [sim]\n  \
         - name: other\n    backends: [blind]\n",
        dir.join("access.jsonl"),
        sim.addr,
        sim.addr,
    );
    let gw = start_yaml(&yaml).await;
    // Three streams held open (150 tokens at 20 ms: three seconds).
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut c = Client::connect(gw.data_addr).await;
        let r = c
            .send_until("POST", "/v1/chat/completions", &chat(true, 150, ""), &[], 2)
            .await;
        held.push((c, r));
    }
    // Until a scrape has seen all three.
    let mut seen = Value::Null;
    for _ in 0..100 {
        let s = stats(gw.admin_addr).await;
        let b = s["backends"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["backend"] == "sim")
            .unwrap()
            .clone();
        if b["scrape"]["engine"]["running"] == 3.0 {
            seen = b;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let scrape = &seen["scrape"];
    assert!(scrape["fresh"].as_bool().unwrap(), "{seen}");
    assert_eq!(scrape["engine"]["waiting"], 0.0);
    let kv = scrape["engine"]["kv_cache_usage"].as_f64().unwrap();
    assert!(
        kv > 0.0 && kv < 0.01,
        "three short prompts in 65,536 tokens: {kv}"
    );
    assert_eq!(scrape["gpu"]["count"], 2);
    assert_eq!(scrape["gpu"]["power_watts"], 1200.0);
    // A request now is sent while the engine runs three.
    let r = post(
        gw.data_addr,
        "/v1/chat/completions",
        &chat(true, 3, ""),
        &[],
    )
    .await;
    assert_eq!(r.status, 200);
    // The unreachable exporter has never answered: a backend still starting, not a failing one;
    // nothing joined.
    let r = post(
        gw.data_addr,
        "/v1/completions",
        r#"{"model":"x","prompt":"hi","max_tokens":2}"#,
        &[],
    )
    .await;
    assert_eq!(r.status, 200);
    let blind = backend_stats(gw.admin_addr, "blind").await;
    assert!(
        blind["scrape"]["before_first_answer_total"]
            .as_u64()
            .unwrap()
            > 0,
        "{blind}"
    );
    assert_eq!(blind["scrape"]["failed_total"], 0, "{blind}");
    assert!(blind["scrape"].get("engine").is_none(), "{blind}");
    // The engine ran a fourth request a moment ago: a scrape taken during it says 4, the next
    // one 3 again (the three held streams).
    let series = [
        "inferscope_backend_engine_running{backend=\"sim\"} 3",
        "inferscope_backend_gpu_power_watts{backend=\"sim\"} 1200",
        "inferscope_backend_engine_waiting{backend=\"sim\"} 0",
    ];
    let mut metrics = String::new();
    for _ in 0..100 {
        metrics = admin_get(gw.admin_addr, "/metrics").await.1;
        if series.iter().all(|s| metrics.contains(s)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for s in series {
        assert!(metrics.contains(s), "{s} not in:\n{metrics}");
    }
    assert!(metrics.contains("inferscope_backend_scrape_failures_total{backend=\"blind\"} 0"));
    for (c, _) in held {
        c.abort();
    }
    let log = stop_and_read_log(gw, &dir).await;
    let line = log
        .iter()
        .find(|l| l["backend"] == "sim" && l["output_tokens"] == 3)
        .unwrap_or_else(|| panic!("no short chat request in {log:?}"));
    assert_eq!(line["backend_running"], 3.0, "{line}");
    assert_eq!(line["backend_queue_depth"], 0.0, "{line}");
    // And how old the scrape it came from was: no older than `stale_after` (three intervals).
    let age = line["backend_load_age_ms"].as_u64().unwrap();
    assert!(age <= 150, "{line}");
    assert!(
        line["backend_kv_cache_usage"].as_f64().unwrap() > 0.0,
        "{line}"
    );
    let blind = log.iter().find(|l| l["backend"] == "blind").unwrap();
    assert!(blind.get("backend_running").is_none(), "{blind}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulator_queues_past_its_batch_and_says_so() {
    let profile = inferscope::sim::Profile {
        max_batch: Some(2),
        ..exact(5.0, 20.0)
    };
    let sim = start_sim(profile, 12).await;
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut c = Client::connect(sim.addr).await;
        // Headers come at once; tokens only once in the batch.
        let r = c
            .send_until("POST", "/v1/chat/completions", &chat(true, 100, ""), &[], 0)
            .await;
        held.push((c, r));
    }
    let mut text = String::new();
    for _ in 0..100 {
        text = admin_get(sim.addr, "/metrics").await.1;
        if text.contains("vllm:num_requests_waiting{engine=\"0\",model_name=\"demo\"} 2.0") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let v = EngineView::parse(&text, None);
    assert_eq!((v.running, v.waiting), (Some(2.0), Some(2.0)), "{text}");
    for (c, _) in held {
        c.abort();
    }
    // The queue empties as the clients leave.
    for _ in 0..100 {
        let v = EngineView::parse(&admin_get(sim.addr, "/metrics").await.1, None);
        if v.waiting == Some(0.0) && v.running == Some(0.0) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the simulator still counts streams whose clients left");
}

#[test]
fn the_gpu_command_lists_gpus_or_says_there_is_none() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_inferscope"))
        .arg("gpu")
        .output()
        .unwrap();
    if out.status.success() {
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(v["count"].as_u64().unwrap() > 0, "{v}");
    } else {
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.starts_with("no GPU: "), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulators_prefill_time_leaves_out_the_queue_as_vllms_does() {
    // One request at a time, four sent at once, each 40 ms to its first token and 20 tokens at
    // 5 ms: the last waits ~400 ms in the queue. vLLM's prefill time runs from scheduling.
    let sim = start_sim(
        inferscope::sim::Profile {
            max_batch: Some(1),
            ..exact(40.0, 5.0)
        },
        1,
    )
    .await;
    let mut reqs = Vec::new();
    for _ in 0..4 {
        reqs.push(tokio::spawn(
            async move { chat_ok(sim.addr, true, 20).await },
        ));
    }
    for r in reqs {
        r.await.unwrap();
    }
    let (_, text) = {
        let r = Client::connect(sim.addr)
            .await
            .send("GET", "/metrics", "", &[])
            .await;
        (r.status, String::from_utf8(r.body()).unwrap())
    };
    let sample = |name: &str| {
        inferscope::util::promtext::samples(&text)
            .find(|s| s.name == name)
            .map(|s| s.value)
            .unwrap()
    };
    let (sum, n) = (
        sample("vllm:request_prefill_time_seconds_sum"),
        sample("vllm:request_prefill_time_seconds_count"),
    );
    assert_eq!(n, 4.0);
    let mean = sum / n;
    assert!(
        (0.035..0.1).contains(&mean),
        "mean prefill {mean} s: the queue left out"
    );
    // They did queue: the check above could fail.
    let queued = sample("vllm:request_queue_time_seconds_sum") / 4.0;
    assert!(queued > 0.1, "mean queue time {queued} s");
}

/// A DCGM exporter of one GPU drawing `watts`: its energy counter (millijoules) grows with the
/// wall clock at that power, its sampled power reads the same.
async fn metered_gpu(watts: f64) -> std::net::SocketAddr {
    use axum::routing::get;
    let start = std::time::Instant::now();
    let app = axum::Router::new().route(
        "/metrics",
        get(move || async move {
            let mj = 5e8 + watts * start.elapsed().as_secs_f64() * 1000.0;
            format!("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{gpu=\"0\"}} {mj:.0}\nDCGM_FI_DEV_POWER_USAGE{{gpu=\"0\"}} {watts}\nDCGM_FI_DEV_GPU_UTIL{{gpu=\"0\"}} 90\n")
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_variant_has_its_gpus_power_and_joules_per_output_token() {
    // fp16's GPU draws 300 W, int8's 150 W; each variant's backend owns its GPU.
    // Traffic over two seconds: the tokens served per second need a span of one.
    let (fp16, int8) = (
        start_sim(exact(1.0, 3.0), 1).await,
        start_sim(exact(1.0, 3.0), 2).await,
    );
    let (g16, g8) = (metered_gpu(300.0).await, metered_gpu(150.0).await);
    let yaml = format!(
        "backends:\n  - {{ name: fp16, url: \"http://{}\", metrics: {{ interval: 50ms, gpu_url: \"http://{g16}/metrics\" }} }}\n  - {{ name: int8, url: \"http://{}\", metrics: {{ interval: 50ms, gpu_url: \"http://{g8}/metrics\" }} }}\nroutes:\n  - name: chat\n    experiment:\n      name: int8-vs-fp16\n      sticky_key: \"header:x-user-id\"\n      variants:\n        - {{ name: fp16, backends: [fp16], weight: 50, control: true }}\n        - {{ name: int8, backends: [int8], weight: 50 }}\n",
        fp16.addr, int8.addr
    );
    let gw = start_yaml(&yaml).await;
    for i in 0..32 {
        let r = post(
            gw.data_addr,
            "/v1/chat/completions",
            &chat(true, 20, ""),
            &[("x-user-id", &format!("u{i}"))],
        )
        .await;
        assert_eq!(r.status, 200);
    }
    // Several scrapes, so the counter's mean is over more than one interval.
    let admin = gw.admin_addr;
    until(
        Duration::from_secs(10),
        "both variants' power from their GPUs' counters",
        || async move {
            let doc: Value =
                serde_json::from_str(&admin_get(admin, "/experiments").await.1).unwrap();
            let v = &doc["experiments"][0]["variants"];
            v[0]["gpu_watts"].is_number() && v[1]["gpu_watts"].is_number()
        },
    )
    .await;
    let doc: Value = serde_json::from_str(&admin_get(admin, "/experiments").await.1).unwrap();
    // The tokens each backend produced over the same window, every group of it (all purposes).
    let stats: Value = serde_json::from_str(&admin_get(admin, "/stats").await.1).unwrap();
    let window = stats["uptime_s"].as_f64().unwrap().min(60.0);
    let tokens = |backend: &str| -> f64 {
        stats["groups"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|g| g["backend"] == backend)
            .map(|g| g["window"]["output_tokens"].as_f64().unwrap())
            .sum()
    };
    for v in doc["experiments"][0]["variants"].as_array().unwrap() {
        let name = v["variant"].as_str().unwrap();
        let want = if name == "fp16" { 300.0 } else { 150.0 };
        let w = v["gpu_watts"].as_f64().unwrap();
        assert!((w - want).abs() < 0.1 * want, "{v}");
        let per_s = tokens(name) / window;
        let j = v["joules_per_output_token"].as_f64().unwrap();
        // (The two documents are read a moment apart: the window grew a little between.)
        assert!(
            (j - w / per_s).abs() <= 0.05 * j,
            "{j} vs {w} W / {per_s} tok/s"
        );
    }
    gw.shutdown();
}
