//! Every request reaches the access log exactly once — ok, failed, rejected or cancelled — and the
//! gateway's own edges behave: cancellation, limits, drain, h2c, the embedded default.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use std::collections::BTreeMap;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_cancels_upstream_and_is_recorded() {
    let sim = start_sim(exact(5.0, 30.0), 1).await;
    let dir = temp_dir();
    let gw = start_gateway(&[("sim", sim.addr)], &dir, "").await;
    let mut c = Client::connect(gw.data_addr).await;
    let r = c
        .send_until("POST", "/v1/chat/completions", &chat(true, 200, ""), &[], 3)
        .await;
    assert_eq!(r.frames.len(), 3);
    let received = r.body().len();
    drop(r);
    c.abort();
    // The simulator notices at once that its client (the gateway) went away.
    assert!(
        sim.wait_finished(1, Duration::from_secs(10)).await,
        "upstream request kept running"
    );
    let t = sim.truth().remove(0);
    assert!(t.cancelled && !t.completed);
    assert!(
        t.sent.len() < 20,
        "generation stopped early, not after 200 tokens"
    );
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 1);
    assert_eq!(log[0]["outcome"], "client_cancelled");
    assert_eq!(log[0]["error"], "client_disconnected");
    let out = log[0]["bytes_out"].as_u64().unwrap() as usize;
    assert!(
        received <= out,
        "bytes_out counts what was handed on: {out} < the {received} received"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_requests_in_n_log_lines_out() {
    let sim = start_sim(exact(5.0, 2.0), 2).await;
    let dead = common::DEAD;
    let dir = temp_dir();
    let yaml = format!(
        "access_log: {{ path: {:?} }}\nlimits: {{ max_request_body_bytes: 2000 }}\nbackends:\n  - {{ name: sim, url: \"http://{}\" }}\n  - {{ name: dead, url: \"http://{dead}\" }}\nroutes:\n  - {{ name: chat, match: {{ model: demo }}, backends: [sim] }}\n  - {{ name: gone, match: {{ model: gone }}, backends: [dead] }}\n  - {{ name: models, match: {{ path_prefix: /v1/models }}, backends: [sim] }}\n",
        dir.join("access.jsonl"),
        sim.addr
    );
    let gw = start_yaml(&yaml).await;
    let a = gw.data_addr;
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(
            post(a, "/v1/chat/completions", &chat(true, 4, ""), &[])
                .await
                .status,
        );
    }
    statuses.push(
        post(a, "/v1/chat/completions", &chat(false, 4, ""), &[])
            .await
            .status,
    );
    let nowhere = post(a, "/v1/chat/completions", r#"{"model":"nope"}"#, &[]).await;
    assert_eq!(nowhere.headers["x-inferscope-error"], "no_route");
    statuses.push(nowhere.status);
    let big = format!(r#"{{"model":"demo","prompt":"{}"}}"#, "x".repeat(3000));
    let too_big = post(a, "/v1/completions", &big, &[]).await;
    assert_eq!(too_big.headers["x-inferscope-error"], "body_too_large");
    let err: serde_json::Value = serde_json::from_slice(&too_big.body()).unwrap();
    assert_eq!(err["error"]["code"], "body_too_large");
    statuses.push(too_big.status);
    let refused = post(
        a,
        "/v1/chat/completions",
        r#"{"model":"gone","stream":true}"#,
        &[],
    )
    .await;
    assert_eq!(refused.headers["x-inferscope-error"], "upstream_connect");
    statuses.push(refused.status);
    let models = Client::connect(a)
        .await
        .send("GET", "/v1/models", "", &[])
        .await;
    statuses.push(models.status);
    let mut c = Client::connect(a).await;
    c.send_until("POST", "/v1/chat/completions", &chat(true, 500, ""), &[], 2)
        .await;
    c.abort();
    assert!(sim.wait_finished(5, Duration::from_secs(10)).await);
    assert_eq!(statuses, vec![200, 200, 200, 200, 404, 413, 502, 200]);

    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 9, "9 requests in, 9 lines out");
    let mut outcomes = BTreeMap::new();
    for l in &log {
        *outcomes
            .entry(l["outcome"].as_str().unwrap().to_string())
            .or_insert(0) += 1;
        assert!(l["request_id"].as_str().is_some_and(|s| !s.is_empty()));
        assert_eq!(l["trace_id"].as_str().map(str::len), Some(32));
    }
    let want: BTreeMap<String, i32> = [
        ("ok", 5),
        ("rejected", 2),
        ("backend_error", 1),
        ("client_cancelled", 1),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(outcomes, want);
    let models_line = log.iter().find(|l| l["path"] == "/v1/models").unwrap();
    assert_eq!(models_line["route"], "models");
    assert_eq!(models_line["method"], "GET");
    assert_eq!(models_line["protocol"], "HTTP/1.1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_concurrency_limit_gets_503_with_retry_after() {
    let sim = start_sim(exact(5.0, 20.0), 3).await;
    let dir = temp_dir();
    let gw = start_gateway(
        &[("sim", sim.addr)],
        &dir,
        "limits: { max_concurrent_requests: 1 }\n",
    )
    .await;
    // The first stream holds the only slot until its body ends, not just until its headers.
    let mut first = Client::connect(gw.data_addr).await;
    let r = first
        .send_until("POST", "/v1/chat/completions", &chat(true, 50, ""), &[], 2)
        .await;
    assert_eq!(r.status, 200);
    assert!(r.rest.is_some(), "the first response is still open");
    let second = post(
        gw.data_addr,
        "/v1/chat/completions",
        &chat(true, 2, ""),
        &[],
    )
    .await;
    assert_eq!(second.status, 503);
    assert_eq!(second.headers["retry-after"], "1");
    assert_eq!(second.headers["x-inferscope-error"], "overloaded");
    assert!(second.headers.contains_key("x-inferscope-request-id"));
    first.abort();
    assert!(sim.wait_finished(1, Duration::from_secs(10)).await);
    let log = stop_and_read_log(gw, &dir).await;
    let outcomes: Vec<&str> = log.iter().map(|l| l["outcome"].as_str().unwrap()).collect();
    assert_eq!(outcomes.len(), 2);
    assert!(
        outcomes.contains(&"rejected") && outcomes.contains(&"client_cancelled"),
        "{outcomes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_an_in_flight_stream_finish() {
    let sim = start_sim(exact(5.0, 15.0), 4).await;
    let dir = temp_dir();
    let gw = start_gateway(&[("sim", sim.addr)], &dir, "").await;
    let addr = gw.data_addr;
    let admin = gw.admin_addr;
    let stream =
        tokio::spawn(
            async move { post(addr, "/v1/chat/completions", &chat(true, 20, ""), &[]).await },
        );
    // Shut down once the stream is under way (its first token has been generated).
    let t = tokio::time::Instant::now();
    while sim.active() == 0 && t.elapsed() < Duration::from_secs(5) {
        tokio::task::yield_now().await;
    }
    gw.shutdown();
    // Draining: no longer ready, while the admin plane still answers.
    assert_eq!(admin_get(admin, "/readyz").await.0, 503);
    let r = stream.await.unwrap();
    assert_eq!(r.status, 200);
    assert!(
        r.body().ends_with(b"data: [DONE]\n\n"),
        "the stream completed during the drain"
    );
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 1);
    assert_eq!(log[0]["outcome"], "ok");
    assert_eq!(log[0]["output_tokens"], 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_clients_are_served_and_measured() {
    let sim = start_sim(exact(5.0, 3.0), 5).await;
    let dir = temp_dir();
    let gw = start_gateway(&[("sim", sim.addr)], &dir, "").await;
    let mut send = h2_connect(gw.data_addr).await;
    let req = http::Request::post(format!("http://{}/v1/chat/completions", gw.data_addr))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(chat(true, 5, ""))))
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.version(), http::Version::HTTP_2);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(body.ends_with(b"data: [DONE]\n\n"));
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log[0]["outcome"], "ok");
    assert_eq!(log[0]["output_tokens"], 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_default_measures_both_simulated_backends() {
    let mut cfg = inferscope::config::embedded_default().unwrap();
    cfg.access_log = None;
    // The embedded default keeps its state across a restart, beside its access log.
    assert_eq!(
        cfg.state_dir.as_deref(),
        Some(std::path::Path::new("inferscope-state"))
    );
    cfg.state_dir = Some(temp_dir());
    let gw = inferscope::app::start_local(cfg).await.unwrap();
    // One request forced to each variant (the override header), so both backends are measured.
    let mut variants = Vec::new();
    for v in ["fp16", "int8"] {
        let r = post(
            gw.data_addr,
            "/v1/chat/completions",
            &chat(true, 3, ""),
            &[("x-inferscope-variant", v)],
        )
        .await;
        assert_eq!(r.status, 200);
        variants.push(
            r.headers["x-inferscope-variant"]
                .to_str()
                .unwrap()
                .to_string(),
        );
    }
    assert_eq!(variants, vec!["fp16", "int8"]);
    let (status, text) = admin_get(gw.admin_addr, "/stats").await;
    assert_eq!(status, 200);
    let stats: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut backends: Vec<&str> = stats["rollups"]["backend"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["backend"].as_str().unwrap())
        .collect();
    backends.sort();
    assert_eq!(backends, vec!["fp16", "int8"]);
    for b in stats["rollups"]["backend"].as_array().unwrap() {
        assert_eq!(b["cumulative"]["ttft"]["count"], 1);
        assert_eq!(b["cumulative"]["output_tokens"], 3);
    }
    let (_, metrics) = admin_get(gw.admin_addr, "/metrics").await;
    assert!(metrics.contains(r#"inferscope_requests_total{route="demo",model="demo",backend="int8",variant="int8",purpose="live",stream="true",outcome="ok"} 1"#), "{metrics}");
    assert!(metrics.contains("inferscope_time_to_first_token_seconds_bucket{"));
    assert_eq!(admin_get(gw.admin_addr, "/readyz").await.0, 200);
    assert_eq!(admin_get(gw.admin_addr, "/healthz").await.0, 200);
    gw.shutdown();
    assert!(gw.wait().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_log_lines_reach_the_file_while_the_gateway_runs() {
    let sim = start_sim(exact(1.0, 1.0), 9).await;
    let dir = temp_dir();
    let gw = start_gateway(&[("sim", sim.addr)], &dir, "").await;
    let lines = || {
        std::fs::read_to_string(dir.join("access.jsonl"))
            .unwrap_or_default()
            .lines()
            .count()
    };
    for want in [1, 21] {
        let n = if want == 1 { 1 } else { 20 };
        for _ in 0..n {
            let r = post(
                gw.data_addr,
                "/v1/chat/completions",
                &chat(true, 2, ""),
                &[],
            )
            .await;
            assert_eq!(r.status, 200);
        }
        // Buffered, but flushed within `FLUSH_EVERY` (100 ms) without any shutdown.
        let t0 = std::time::Instant::now();
        while lines() < want && t0.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(lines(), want);
    }
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 21);
}
