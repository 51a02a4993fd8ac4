//! The roofline end to end: a simulated backend with a known TPOT, declared as an 8 B FP16 model
//! on an H100, has its decode bandwidth and MBU computed in `/stats` from what the gateway
//! measured and what the engine reported, and the INT8 variant of the same model moves half
//! the bytes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_place_each_backend_on_its_roofline() {
    let (fp16, int8) = (
        start_sim(exact(30.0, 10.0), 1).await,
        start_sim(exact(30.0, 10.0), 2).await,
    );
    let yaml = format!(
        "backends:\n  \
         - name: fp16\n    url: \"http://{}\"\n    metrics: {{ interval: 50ms }}\n    \
           model: {{ params_b: 8, bytes_per_param: 2 }}\n    gpu: {{ preset: h100 }}\n  \
         - name: int8\n    url: \"http://{}\"\n    metrics: {{ interval: 50ms }}\n    \
           model: {{ params_b: 8, bytes_per_param: 1 }}\n    gpu: {{ hbm_gb_s: 3350, tflops: 989 }}\n\
         routes:\n  - name: a\n    match: {{ model: a }}\n    backends: [fp16]\n  \
         - name: b\n    backends: [int8]\n",
        fp16.addr, int8.addr
    );
    let gw = start_yaml(&yaml).await;
    for model in ["a", "b"] {
        // Two at a time, so the engine reports a batch of two while they decode.
        let body = format!(
            r#"{{"model":"{model}","stream":true,"max_tokens":40,"messages":[{{"role":"user","content":"one two three four"}}]}}"#
        );
        let (x, y) = tokio::join!(
            post(gw.data_addr, "/v1/chat/completions", &body, &[]),
            post(gw.data_addr, "/v1/chat/completions", &body, &[])
        );
        assert_eq!((x.status, y.status), (200, 200));
    }
    let stats: Value = serde_json::from_str(&admin_get(gw.admin_addr, "/stats").await.1).unwrap();
    let roof = |name: &str| -> Value {
        stats["backends"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["backend"] == name)
            .unwrap()["roofline"]
            .clone()
    };
    let (a, b) = (roof("fp16"), roof("int8"));
    let d = &a["decode"];
    let tpot = d["tpot_ms"].as_f64().unwrap();
    assert!((tpot - 10.0).abs() < 1.0, "TPOT {tpot} ms: {a}");
    // 16 GB a step in one TPOT.
    let gb_s = d["achieved_gb_s"].as_f64().unwrap();
    assert!((gb_s - 16.0 / (tpot / 1e3)).abs() < 1e-6, "{a}");
    assert!((d["mbu"].as_f64().unwrap() - gb_s / 3350.0).abs() < 1e-9);
    assert_eq!(a["peak"]["hbm_gb_s"], 3350.0);
    assert_eq!(d["bound"], "memory-bound", "{a}");
    // The mean of the engine's running count over the scrapes while it was busy: 2 while both
    // decode, 1 in a scrape that falls where one has started or ended before the other.
    let batch = d["batch"].as_f64().unwrap();
    assert!(
        (1.5..=2.0).contains(&batch),
        "the engine's batch while it decoded: {a}"
    );
    let words = d["words"].as_str().unwrap();
    assert!(
        words.starts_with("decode at ") && words.contains("memory-bound"),
        "{words}"
    );
    // The same TPOT with half the bytes per parameter: half the bandwidth.
    let ratio =
        b["decode"]["bytes_per_step"].as_f64().unwrap() / d["bytes_per_step"].as_f64().unwrap();
    assert!((ratio - 0.5).abs() < 1e-9, "{b}");
    // Prefill from the engine's own prefill time (the simulator reports it).
    let p = &a["prefill"];
    assert_eq!(p["source"], "engine", "{a}");
    let secs = p["seconds"].as_f64().unwrap();
    assert!((secs - 0.030).abs() < 0.005, "prefill {secs} s: {a}");
    let (_, metrics) = admin_get(gw.admin_addr, "/metrics").await;
    let line = metrics
        .lines()
        .find(|l| l.starts_with("inferscope_backend_mbu_ratio{backend=\"fp16\"}"))
        .unwrap_or_else(|| panic!("no MBU series in:\n{metrics}"));
    let mbu: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!((mbu - gb_s / 3350.0).abs() < 0.05, "{line}");
    assert!(metrics.contains("inferscope_backend_prefill_mfu_ratio{backend=\"int8\"}"));
    drop(gw);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_and_report_give_the_roofline_too() {
    let sim = start_sim(exact(20.0, 10.0), 3).await;
    let dir = temp_dir();
    let cfg = dir.join("gw.yaml");
    let yaml = format!(
        "access_log: {{ path: {:?} }}\nbackends:\n  - name: s\n    url: \"http://{}\"\n    metrics: {{ interval: 50ms }}\n    \
         model: {{ params_b: 8, bytes_per_param: 1 }}\n    gpu: {{ preset: l40s }}\nroutes:\n  - {{ name: all, backends: [s] }}\n",
        dir.join("access.jsonl"),
        sim.addr
    );
    std::fs::write(&cfg, &yaml).unwrap();
    let gw = start_yaml(&yaml).await;
    let url = format!("http://{}", gw.data_addr);
    let out = tokio::task::spawn_blocking(move || {
        inferscope(&[
            "bench",
            "--url",
            &url,
            "--model",
            "demo",
            "--requests",
            "12",
            "--concurrency",
            "3",
            "--max-tokens",
            "20",
            "--params-b",
            "8",
            "--bytes-per-param",
            "1",
            "--gpu",
            "l40s",
        ])
    })
    .await
    .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("roofline: decode at "))
        .unwrap_or_else(|| panic!("no decode roofline in:\n{text}"));
    // 8 GB a step at about 10 ms a token, against the L40S's 864 GB/s: near 800 GB/s.
    assert!(line.contains("of 864 GB/s"), "{line}");
    assert!(line.contains("memory-bound"), "{line}");
    assert!(
        text.contains("roofline: prefill at ") && text.contains("% or more of peak compute"),
        "{text}"
    );
    let log = dir.join("access.jsonl");
    stop_and_read_log(gw, &dir).await;
    let out = inferscope(&[
        "report",
        log.to_str().unwrap(),
        "--config",
        cfg.to_str().unwrap(),
    ]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("roofline of s (12 requests):"), "{text}");
    assert!(text.contains("decode at "), "{text}");
    let out = inferscope(&[
        "report",
        log.to_str().unwrap(),
        "--config",
        cfg.to_str().unwrap(),
        "--json",
    ]);
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["roofline"]["s"]["peak"]["hbm_gb_s"], 864.0, "{doc}");
    assert!(
        doc["roofline"]["s"]["decode"]["mbu"].as_f64().unwrap() > 0.5,
        "{doc}"
    );
}
