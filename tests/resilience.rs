//! Safe in front of production: failover before the first byte (and never after), timeouts that
//! abort streams (the client can tell) and close the upstream, outlier ejection and recovery, bounded queues,
//! active probes, and hot reload. Every test also checks requests in = access-log lines out.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use inferscope::sim::{Faults, Profile};
use std::time::Duration;

fn yaml(dir: &std::path::Path, backends: &str, route: &str) -> String {
    format!(
        "access_log: {{ path: {:?} }}\nbackends:\n{backends}routes:\n  - name: main\n{route}",
        dir.join("access.jsonl")
    )
}

fn faulty(f: Faults) -> Profile {
    Profile {
        faults: f,
        ..exact(5.0, 5.0)
    }
}

/// A backend that answers every generation request with 503.
fn always_503() -> Profile {
    faulty(Faults {
        error_rate: 1.0,
        error_status: Some(503),
        ..Faults::default()
    })
}

fn dead_port() -> std::net::SocketAddr {
    common::DEAD
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_before_the_first_byte_is_invisible_to_the_client() {
    let bad = start_sim(always_503(), 1).await;
    let good = start_sim(exact(5.0, 2.0), 2).await;
    let dead = dead_port();
    let dir = temp_dir();
    let backends = format!(
        "  - {{ name: bad, url: \"http://{}\" }}\n  - {{ name: dead, url: \"http://{dead}\" }}\n  - {{ name: good, url: \"http://{}\" }}\n",
        bad.addr, good.addr
    );
    let gw = start_yaml(&yaml(
        &dir,
        &backends,
        "    backends: [bad, dead, good]\n    retry: { attempts: 2 }\n",
    ))
    .await;
    for _ in 0..3 {
        let r = post(
            gw.data_addr,
            "/v1/chat/completions",
            &chat(true, 4, ""),
            &[],
        )
        .await;
        assert_eq!(r.status, 200, "the client never sees the failed attempts");
        assert!(r.body().ends_with(b"data: [DONE]\n\n"));
        assert!(r.headers.get("x-inferscope-error").is_none());
    }
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 3, "3 requests in, 3 lines out");
    assert!(
        log.iter()
            .all(|l| l["outcome"] == "ok" && l["backend"] == "good"),
        "{log:?}"
    );
    let retries: Vec<serde_json::Value> = log
        .iter()
        .flat_map(|l| l["retries"].as_array().cloned().unwrap_or_default())
        .collect();
    assert!(
        retries
            .iter()
            .any(|r| r["backend"] == "bad" && r["status"] == 503),
        "{retries:?}"
    );
    assert!(
        retries
            .iter()
            .any(|r| r["backend"] == "dead" && r["error"] == "upstream_connect"),
        "{retries:?}"
    );
    let attempts: u64 = log.iter().map(|l| l["attempts"].as_u64().unwrap()).sum();
    assert_eq!(attempts, 3 + retries.len() as u64);
    // The client's bytes are the good backend's, untouched.
    assert_eq!(good.truth().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_retry_once_streaming_has_begun() {
    let dying = start_sim(
        faulty(Faults {
            die_after_chunks: Some(3),
            ..Faults::default()
        }),
        1,
    )
    .await;
    let good = start_sim(exact(5.0, 2.0), 2).await;
    let dir = temp_dir();
    let backends = format!(
        "  - {{ name: dying, url: \"http://{}\" }}\n  - {{ name: good, url: \"http://{}\" }}\n",
        dying.addr, good.addr
    );
    let gw = start_yaml(&yaml(
        &dir,
        &backends,
        "    backends: [dying, good]\n    retry: { attempts: 2 }\n",
    ))
    .await;
    let r = stream_chat(&gw).await;
    assert_eq!(r.status, 200);
    let body = String::from_utf8(r.body()).unwrap();
    assert_eq!(
        body.matches("data: ").count(),
        3,
        "what arrived before the backend died, and no more"
    );
    assert!(!body.contains("[DONE]"), "never a fabricated [DONE]");
    assert!(
        r.aborted,
        "the client can tell: the response was aborted, not ended cleanly"
    );
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 1);
    assert_eq!(log[0]["outcome"], "truncated");
    assert_eq!(log[0]["backend"], "dying");
    assert_eq!(log[0]["attempts"], 1);
    assert!(
        good.truth().is_empty(),
        "nothing was retried after the first byte"
    );
}

/// One streamed 20-token chat through `gw`.
async fn stream_chat(gw: &inferscope::app::Running) -> Received {
    post(
        gw.data_addr,
        "/v1/chat/completions",
        &chat(true, 20, ""),
        &[],
    )
    .await
}

/// A gateway in front of the backend at `addr` with the route's idle timeout `idle`, and one
/// streamed 20-token chat through it: the response, the gateway and its log's directory.
async fn stream_under_idle_timeout(
    addr: std::net::SocketAddr,
    idle: &str,
) -> (Received, inferscope::app::Running, std::path::PathBuf) {
    let dir = temp_dir();
    let backends = format!("  - {{ name: s, url: \"http://{addr}\" }}\n");
    let route = format!("    backends: [s]\n    timeouts: {{ idle: {idle} }}\n");
    let gw = start_yaml(&yaml(&dir, &backends, &route)).await;
    let r = stream_chat(&gw).await;
    (r, gw, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_stream_hits_the_idle_timeout_and_the_upstream_is_closed() {
    let stalling = start_sim(
        faulty(Faults {
            stall_after_chunks: Some(3),
            ..Faults::default()
        }),
        1,
    )
    .await;
    let (r, gw, dir) = stream_under_idle_timeout(stalling.addr, "300ms").await;
    assert_eq!(r.status, 200);
    let body = String::from_utf8(r.body()).unwrap();
    assert_eq!(body.matches("data: ").count(), 3);
    assert!(!body.contains("[DONE]"));
    assert!(
        r.aborted,
        "a timed-out stream is aborted, not ended cleanly"
    );
    // The gateway dropped the upstream response: the simulator sees its client go away.
    assert!(stalling.wait_finished(1, Duration::from_secs(10)).await);
    assert!(stalling.truth()[0].cancelled);
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log[0]["outcome"], "timeout");
    assert_eq!(log[0]["error"], "idle_timeout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_never_pauses_for_the_idle_timeout_outlives_it_many_times() {
    // Chunks every 60 ms for ~1.2 s under a 250 ms idle timeout: the idle deadline moves on with
    // every chunk (the timer is re-armed when it fires, not on every chunk), so the stream ends
    // whole.
    let sim = start_sim(exact(60.0, 60.0), 1).await;
    let (r, gw, dir) = stream_under_idle_timeout(sim.addr, "250ms").await;
    assert_eq!(r.status, 200);
    let body = String::from_utf8(r.body()).unwrap();
    assert!(body.contains("[DONE]"), "{body}");
    assert!(!r.aborted);
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log[0]["outcome"], "ok");
    assert!(log[0]["e2e_ms"].as_f64().unwrap() > 1000.0, "{}", log[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_token_timeout_ends_streams_and_answers_504_before_a_head() {
    let slow = start_sim(
        faulty(Faults {
            slow_first_token_ms: 3000.0,
            ..Faults::default()
        }),
        1,
    )
    .await;
    let dir = temp_dir();
    let backends = format!("  - {{ name: slow, url: \"http://{}\" }}\n", slow.addr);
    let gw = start_yaml(&yaml(
        &dir,
        &backends,
        "    backends: [slow]\n    timeouts: { first_token: 300ms }\n",
    ))
    .await;
    // Streaming: the head (and role chunk) came at once; no token by the deadline.
    let r = post(
        gw.data_addr,
        "/v1/chat/completions",
        &chat(true, 5, ""),
        &[],
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(!String::from_utf8(r.body())
        .unwrap()
        .contains("\"content\":\" "));
    assert!(r.aborted);
    // Not streaming: no response head by the deadline.
    let r = post(
        gw.data_addr,
        "/v1/chat/completions",
        &chat(false, 5, ""),
        &[],
    )
    .await;
    assert_eq!(r.status, 504);
    assert_eq!(r.headers["x-inferscope-error"], "upstream_timeout");
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 2);
    assert_eq!(
        (log[0]["outcome"].as_str(), log[0]["error"].as_str()),
        (Some("timeout"), Some("first_token_timeout"))
    );
    assert_eq!(
        (log[1]["outcome"].as_str(), log[1]["status"].as_u64()),
        (Some("timeout"), Some(504))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flapping_backend_is_ejected_and_recovers() {
    let flaky = start_sim(always_503(), 1).await;
    let good = start_sim(exact(2.0, 1.0), 2).await;
    let dir = temp_dir();
    let backends = format!(
        "  - {{ name: flaky, url: \"http://{}\", outlier: {{ consecutive_failures: 2, base_ejection: 700ms }} }}\n  - {{ name: good, url: \"http://{}\" }}\n",
        flaky.addr, good.addr
    );
    let gw = start_yaml(&yaml(
        &dir,
        &backends,
        "    backends: [flaky, good]\n    retry: { attempts: 1 }\n",
    ))
    .await;
    for _ in 0..8 {
        let r = post(
            gw.data_addr,
            "/v1/chat/completions",
            &chat(true, 2, ""),
            &[],
        )
        .await;
        assert_eq!(r.status, 200, "failures are retried on the good backend");
    }
    assert_eq!(
        flaky.truth().len(),
        2,
        "ejected after two failures: no more traffic while ejected"
    );
    let b = backend_stats(gw.admin_addr, "flaky").await;
    assert_eq!(
        (b["ejected"].as_bool(), b["ejections_total"].as_u64()),
        (Some(true), Some(1))
    );
    let (_, metrics) = admin_get(gw.admin_addr, "/metrics").await;
    assert!(
        metrics.contains("inferscope_backend_up{backend=\"flaky\"} 0"),
        "{metrics}"
    );

    // It recovers; after the ejection ends (a configured wall-clock period) it gets traffic again.
    flaky.set_faults(Faults::default());
    until(Duration::from_secs(5), "the ejection ended", || async {
        let (_, m) = admin_get(gw.admin_addr, "/metrics").await;
        m.contains("inferscope_backend_up{backend=\"flaky\"} 1")
    })
    .await;
    for _ in 0..4 {
        assert_eq!(
            post(
                gw.data_addr,
                "/v1/chat/completions",
                &chat(true, 2, ""),
                &[]
            )
            .await
            .status,
            200
        );
    }
    assert!(flaky.truth().len() > 2, "back in rotation");
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 12);
    assert!(log.iter().all(|l| l["outcome"] == "ok"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_queue_gets_429_and_queue_timeout_503_with_retry_after() {
    let sim = start_sim(exact(5.0, 20.0), 1).await;
    let dir = temp_dir();
    let backends = format!(
        "  - {{ name: one, url: \"http://{0}\", max_concurrency: 1, max_queue: 0 }}\n  - {{ name: two, url: \"http://{0}\", max_concurrency: 1, max_queue: 1, queue_timeout: 200ms }}\n",
        sim.addr
    );
    let extra = "  - { name: second, match: { model: two }, backends: [two] }\n";
    let gw = start_yaml(&format!(
        "{}{extra}",
        yaml(
            &dir,
            &backends,
            "    match: { model: demo }\n    backends: [one]\n"
        )
    ))
    .await;
    let mut hold = Client::connect(gw.data_addr).await;
    let first = hold
        .send_until("POST", "/v1/chat/completions", &chat(true, 100, ""), &[], 2)
        .await;
    assert!(first.rest.is_some());
    let full = post(
        gw.data_addr,
        "/v1/chat/completions",
        &chat(true, 2, ""),
        &[],
    )
    .await;
    assert_eq!(full.status, 429);
    assert_eq!(full.headers["retry-after"], "1");
    assert_eq!(full.headers["x-inferscope-error"], "backend_queue_full");

    let two = chat(true, 100, "").replace("\"demo\"", "\"two\"");
    let mut hold2 = Client::connect(gw.data_addr).await;
    let held = hold2
        .send_until("POST", "/v1/chat/completions", &two, &[], 2)
        .await;
    assert!(held.rest.is_some());
    let waited = post(
        gw.data_addr,
        "/v1/chat/completions",
        &chat(true, 2, "").replace("\"demo\"", "\"two\""),
        &[],
    )
    .await;
    assert_eq!(waited.status, 503);
    assert_eq!(
        waited.headers["x-inferscope-error"],
        "backend_queue_timeout"
    );
    assert_eq!(waited.headers["retry-after"], "1");
    hold.abort();
    hold2.abort();
    assert!(sim.wait_finished(2, Duration::from_secs(10)).await);
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 4);
    assert_eq!(log.iter().filter(|l| l["outcome"] == "rejected").count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_probes_drive_readiness() {
    let sim = start_sim(exact(1.0, 1.0), 1).await;
    let dir = temp_dir();
    let backends = format!(
        "  - {{ name: s, url: \"http://{}\", probe: {{ path: /health, interval: 50ms, timeout: 200ms, unhealthy_threshold: 1, healthy_threshold: 1 }} }}\n",
        sim.addr
    );
    let gw = start_yaml(&yaml(&dir, &backends, "    backends: [s]\n")).await;
    let until = |want: u16| {
        let admin = gw.admin_addr;
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while tokio::time::Instant::now() < deadline {
                if admin_get(admin, "/readyz").await.0 == want {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            false
        }
    };
    assert!(until(200).await);
    sim.set_faults(Faults {
        refuse: true,
        ..Faults::default()
    });
    assert!(
        until(503).await,
        "a failing probe takes the only backend out: not ready"
    );
    sim.set_faults(Faults::default());
    assert!(until(200).await, "and a passing one brings it back");
    stop_and_read_log(gw, &dir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_rejects_a_bad_config_and_applies_a_good_one_without_dropping_streams() {
    let a = start_sim(exact(5.0, 10.0), 1).await;
    let b = start_sim(exact(5.0, 1.0), 2).await;
    let dir = temp_dir();
    let path = dir.join("gw.yaml");
    let config = |backend: &str, addr: std::net::SocketAddr| {
        yaml(
            &dir,
            &format!("  - {{ name: {backend}, url: \"http://{addr}\" }}\n"),
            &format!("    backends: [{backend}]\n"),
        )
    };
    std::fs::write(&path, config("a", a.addr)).unwrap();
    let cfg = inferscope::config::load(&path).unwrap();
    let any: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
    let gw = inferscope::app::start(
        cfg,
        inferscope::app::Overrides {
            listen: Some(any),
            admin: Some(any),
            config_path: Some(path.clone()),
        },
    )
    .await
    .unwrap();

    // A stream starts on the old config …
    let addr = gw.data_addr;
    let stream =
        tokio::spawn(
            async move { post(addr, "/v1/chat/completions", &chat(true, 30, ""), &[]).await },
        );
    let t = tokio::time::Instant::now();
    while a.active() == 0 && t.elapsed() < Duration::from_secs(5) {
        tokio::task::yield_now().await;
    }
    // … a broken file is rejected, the old config keeps serving …
    std::fs::write(&path, "backends: [ oops").unwrap();
    assert!(gw.reloader.reload().await.is_err());
    assert_eq!(
        post(
            gw.data_addr,
            "/v1/chat/completions",
            &chat(true, 2, ""),
            &[]
        )
        .await
        .status,
        200
    );
    // … and a good one moves new requests to the new backend.
    std::fs::write(&path, config("b", b.addr)).unwrap();
    gw.reloader.reload().await.unwrap();
    assert_eq!(
        post(
            gw.data_addr,
            "/v1/chat/completions",
            &chat(true, 2, ""),
            &[]
        )
        .await
        .status,
        200
    );
    let first = stream.await.unwrap();
    assert!(
        first.body().ends_with(b"data: [DONE]\n\n"),
        "the in-flight stream finished on the config it started with"
    );
    let (_, metrics) = admin_get(gw.admin_addr, "/metrics").await;
    // (The file watcher may also have noticed the writes: at least one of each.)
    let value = |name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    assert!(value("inferscope_config_reloads_total") >= 1, "{metrics}");
    assert!(
        value("inferscope_config_reload_failures_total") >= 1,
        "{metrics}"
    );
    let log = stop_and_read_log(gw, &dir).await;
    let backends: Vec<&str> = log.iter().map(|l| l["backend"].as_str().unwrap()).collect();
    assert_eq!(log.len(), 3);
    assert_eq!(
        backends.iter().filter(|b| **b == "a").count(),
        2,
        "{backends:?}"
    );
    assert_eq!(
        backends.iter().filter(|b| **b == "b").count(),
        1,
        "{backends:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_answering_429_rests_for_its_retry_after_and_traffic_fails_over() {
    let limited = start_raw(
        vec![b"HTTP/1.1 429 Too Many Requests\r\nretry-after: 30\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}".to_vec()],
        Duration::ZERO,
    )
    .await;
    let good = start_sim(exact(1.0, 1.0), 3).await;
    let dir = temp_dir();
    let yaml = format!(
        "access_log: {{ path: {:?} }}\nbackends:\n  - {{ name: limited, url: \"http://{limited}\" }}\n  - {{ name: good, url: \"http://{}\" }}\nroutes:\n  - {{ name: solo, match: {{ model: solo }}, backends: [limited] }}\n  - {{ name: main, balancer: round_robin, backends: [limited, good] }}\n",
        dir.join("access.jsonl"),
        good.addr
    );
    let gw = start_yaml(&yaml).await;
    // Every request succeeds: the first 429 fails over, then the backend rests.
    for _ in 0..6 {
        let r = post(
            gw.data_addr,
            "/v1/chat/completions",
            &chat(false, 2, ""),
            &[],
        )
        .await;
        assert_eq!(r.status, 200);
    }
    let limited_stats = backend_stats(gw.admin_addr, "limited").await;
    assert_eq!(limited_stats["rate_limited"], true);
    assert_eq!(
        limited_stats["rate_limited_total"], 1,
        "asked again while resting"
    );
    assert_eq!(
        limited_stats["ejections_total"], 0,
        "a 429 is not a failure"
    );
    // With nowhere else to go, the client gets the backend's 429 and its Retry-After.
    let solo = chat(false, 2, "").replace("\"demo\"", "\"solo\"");
    let r = post(gw.data_addr, "/v1/chat/completions", &solo, &[]).await;
    assert_eq!(r.status, 429);
    assert_eq!(r.headers["retry-after"], "30");
    let log = stop_and_read_log(gw, &dir).await;
    let retried: Vec<&serde_json::Value> =
        log.iter().filter(|l| l.get("retries").is_some()).collect();
    assert_eq!(retried.len(), 1);
    assert_eq!(retried[0]["retries"][0]["status"], 429);
    assert_eq!(retried[0]["retries"][0]["backend"], "limited");
    let last = log.last().unwrap();
    assert_eq!(
        (last["outcome"].as_str(), last["error"].as_str()),
        (Some("rate_limited"), Some("upstream_rate_limited"))
    );
}
