//! Client API keys and rate limits on the data plane, over real sockets: both key headers, 401
//! for the rest, the key's name (never the key) in log, stats and metrics, credentials kept from
//! the backend unless forwarded, request and token limits with `Retry-After` and `x-ratelimit-*`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use inferscope::sim::{self, SimHandle, SimOptions};
use serde_json::Value;
use tokio::net::TcpListener;

async fn sim_keeping_credentials() -> SimHandle {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut opts = SimOptions::new(exact(1.0, 1.0));
    opts.record_truth = true;
    opts.keep_credentials = true;
    sim::spawn(listener, opts, std::future::pending()).unwrap()
}

const TEAM_A: &str = "sk-team-a-0123456789abcdef";
const TEAM_B: &str = "sk-team-b-fedcba9876543210";

fn sha256_hex(s: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, s.as_bytes());
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// A small non-streamed chat request with `headers`.
async fn ask(addr: std::net::SocketAddr, headers: &[(&str, &str)]) -> Received {
    post(addr, "/v1/chat/completions", &chat(false, 2, ""), headers).await
}

/// The `retry-after` header, seconds.
fn retry_after(r: &Received) -> u64 {
    r.headers["retry-after"].to_str().unwrap().parse().unwrap()
}

fn auth_yaml(dir: &std::path::Path, forward: bool) -> String {
    let file = dir.join("team-b.key");
    std::fs::write(&file, format!("{TEAM_B}\n")).unwrap();
    format!(
        "auth:\n  forward_client_key: {forward}\n  keys:\n    - {{ name: team-a, sha256: \"{}\" }}\n    - {{ name: team-b, key_file: {:?} }}\n",
        sha256_hex(TEAM_A),
        file
    )
}

#[tokio::test]
async fn keys_in_either_header_pass_and_everything_else_gets_401() {
    let dir = temp_dir();
    let sim = sim_keeping_credentials().await;
    let gw = start_gateway(&[("a", sim.addr)], &dir, &auth_yaml(&dir, false)).await;
    let body = chat(true, 3, "");
    let bearer = format!("Bearer {TEAM_A}");
    let ok_a = post(
        gw.data_addr,
        "/v1/chat/completions",
        &body,
        &[("authorization", &bearer)],
    )
    .await;
    assert_eq!(ok_a.status, 200);
    let ok_b = post(
        gw.data_addr,
        "/v1/chat/completions",
        &body,
        &[("x-api-key", TEAM_B)],
    )
    .await;
    assert_eq!(ok_b.status, 200);
    for headers in [
        vec![],
        vec![("authorization", "Bearer sk-team-a-0123456789abcdeF")],
        vec![("x-api-key", "nope")],
        vec![("authorization", TEAM_A)],
    ] {
        let r = post(gw.data_addr, "/v1/chat/completions", &body, &headers).await;
        assert_eq!(r.status, 401, "{headers:?}");
        let v: Value = serde_json::from_slice(&r.body()).unwrap();
        assert_eq!(v["error"]["code"], "invalid_api_key", "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert!(v["error"]["param"].is_null());
        assert_eq!(r.headers["www-authenticate"], "Bearer");
    }
    assert_eq!(
        sim.truth().len(),
        2,
        "refused requests never reach the backend"
    );
    assert!(
        sim.credentials().is_empty(),
        "the gateway's keys stay at the gateway: {:?}",
        sim.credentials()
    );
    let (_, stats) = admin_get(gw.admin_addr, "/stats").await;
    let stats: Value = serde_json::from_str(&stats).unwrap();
    assert_eq!(stats["keys"]["unauthorized"], 4);
    let by_key = stats["keys"]["by_key"].as_array().unwrap();
    assert_eq!(by_key.len(), 2);
    for k in by_key {
        assert_eq!(k["requests"], 1, "{k}");
        assert!(k["output_tokens"].as_u64().unwrap() > 0, "{k}");
    }
    let (_, metrics) = admin_get(gw.admin_addr, "/metrics").await;
    assert!(metrics.contains("inferscope_key_requests_total{key=\"team-a\"} 1"));
    assert!(metrics.contains("inferscope_unauthorized_total 4"));
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 6, "every request is one line, refused ones too");
    let keys: Vec<_> = log.iter().map(|l| l["key"].clone()).collect();
    assert_eq!(keys.iter().filter(|k| **k == "team-a").count(), 1);
    assert_eq!(keys.iter().filter(|k| **k == "team-b").count(), 1);
    assert_eq!(
        log.iter()
            .filter(|l| l["status"] == 401 && l["error"] == "invalid_api_key")
            .count(),
        4
    );
    let text = std::fs::read_to_string(dir.join("access.jsonl")).unwrap();
    assert!(!text.contains(TEAM_A) && !text.contains(TEAM_B));
}

#[tokio::test]
async fn a_forwarded_key_reaches_the_backend() {
    let dir = temp_dir();
    let sim = sim_keeping_credentials().await;
    let gw = start_gateway(&[("a", sim.addr)], &dir, &auth_yaml(&dir, true)).await;
    let r = post(
        gw.data_addr,
        "/v1/chat/completions",
        &chat(false, 2, ""),
        &[("x-api-key", TEAM_B)],
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        sim.credentials(),
        vec![("x-api-key".to_string(), TEAM_B.to_string())]
    );
    gw.shutdown();
}

#[tokio::test]
async fn request_limits_per_key_answer_429_with_the_openai_headers() {
    let dir = temp_dir();
    let sim = sim_keeping_credentials().await;
    let extra = format!(
        "{}rate_limits:\n  per_key: {{ requests_per_minute: 3 }}\n  keys:\n    team-b: {{ requests_per_minute: 1 }}\n",
        auth_yaml(&dir, false)
    );
    let gw = start_gateway(&[("a", sim.addr)], &dir, &extra).await;
    let bearer = format!("Bearer {TEAM_A}");
    let a = [("authorization", bearer.as_str())];
    for left in ["2", "1", "0"] {
        let r = ask(gw.data_addr, &a).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.headers["x-ratelimit-limit-requests"], "3");
        assert_eq!(r.headers["x-ratelimit-remaining-requests"], left);
        assert!(r.headers.contains_key("x-ratelimit-reset-requests"));
    }
    let refused = ask(gw.data_addr, &a).await;
    assert_eq!(refused.status, 429);
    // A request's worth refills in 20 s at 3 per minute.
    let retry = retry_after(&refused);
    assert!((19..=20).contains(&retry), "{retry}");
    assert_eq!(refused.headers["x-ratelimit-remaining-requests"], "0");
    let v: Value = serde_json::from_slice(&refused.body()).unwrap();
    assert_eq!(v["error"]["code"], "rate_limit_exceeded");
    // Another key has its own bucket (and its own, smaller limit).
    let b = [("x-api-key", TEAM_B)];
    let r = ask(gw.data_addr, &b).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["x-ratelimit-limit-requests"], "1");
    let r = ask(gw.data_addr, &b).await;
    assert_eq!(r.status, 429);
    assert_eq!(sim.truth().len(), 4);
    let log = stop_and_read_log(gw, &dir).await;
    let limited: Vec<_> = log
        .iter()
        .filter(|l| l["outcome"] == "rate_limited")
        .collect();
    assert_eq!(limited.len(), 2);
    assert!(limited.iter().all(|l| l["error"] == "rate_limit_exceeded"));
}

#[tokio::test]
async fn token_limits_per_route_charge_measured_usage_after_the_response() {
    let dir = temp_dir();
    let sim = start_sim(exact(1.0, 1.0), 1).await;
    // 60 tokens a minute: one token a second. The first request (prompt ~7 + 100 output) leaves
    // the route in debt; the next waits that debt out.
    let gw = start_gateway(
        &[("a", sim.addr)],
        &dir,
        "rate_limits:\n  routes:\n    main: { tokens_per_minute: 60 }\n",
    )
    .await;
    let r = post(
        gw.data_addr,
        "/v1/chat/completions",
        &chat(true, 100, ""),
        &[],
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["x-ratelimit-limit-tokens"], "60");
    assert_eq!(r.headers["x-ratelimit-remaining-tokens"], "60");
    // The charge lands when the record is written, right after the body ends.
    let admin = gw.admin_addr;
    common::until(
        std::time::Duration::from_secs(5),
        "the request recorded",
        || async move { common::recorded(admin).await == 1 },
    )
    .await;
    let refused = ask(gw.data_addr, &[]).await;
    assert_eq!(
        refused.status,
        429,
        "{}",
        String::from_utf8_lossy(&refused.body())
    );
    assert_eq!(refused.headers["x-ratelimit-remaining-tokens"], "0");
    let retry = retry_after(&refused);
    let log = stop_and_read_log(gw, &dir).await;
    let used = log[0]["input_tokens"].as_u64().unwrap() + log[0]["output_tokens"].as_u64().unwrap();
    // In debt by `used - 60` tokens at one a second (less the moment that passed).
    assert!(
        retry + 1 >= used - 60 && retry <= used - 60 + 1,
        "retry {retry}, used {used}"
    );
    assert_eq!(log[1]["outcome"], "rate_limited");
}

/// A key guesser: past `auth.max_failures_per_minute` failed checks, its address gets 429
/// `auth_throttled` (`Retry-After: 60`) without a key check — a right key included — while other
/// addresses are served; every request is still one log line.
#[tokio::test]
async fn failed_key_checks_are_throttled_per_address() {
    let dir = temp_dir();
    let sim = sim_keeping_credentials().await;
    let yaml = auth_yaml(&dir, false).replace("auth:\n", "auth:\n  max_failures_per_minute: 5\n");
    let gw = start_gateway(&[("a", sim.addr)], &dir, &yaml).await;
    let from = |key: String| async move {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind("127.0.0.3:0".parse().unwrap()).unwrap();
        let io = sock.connect(gw.data_addr).await.unwrap();
        Client::over(io)
            .await
            .send(
                "POST",
                "/v1/chat/completions",
                &chat(false, 2, ""),
                &[("authorization", &key)],
            )
            .await
    };
    for i in 0..5 {
        let r = from(format!("Bearer sk-guess-{i}")).await;
        assert_eq!(r.status, 401, "guess {i}");
    }
    let r = from(format!("Bearer {TEAM_A}")).await;
    assert_eq!(r.status, 429);
    assert_eq!(r.headers["x-inferscope-error"], "auth_throttled");
    assert_eq!(retry_after(&r), 60);
    let bearer = format!("Bearer {TEAM_A}");
    assert_eq!(
        ask(gw.data_addr, &[("authorization", &bearer)])
            .await
            .status,
        200
    );
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 7);
    assert_eq!(log[5]["error"], "auth_throttled", "{}", log[5]);
}

/// Under pressure (`overload_at`), a key holding its share of the slots among the keys holding
/// any gets 503 `client_share`; another key still gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_pressure_a_key_gets_its_share_of_the_slots() {
    let dir = temp_dir();
    let sim = start_sim(exact(1.0, 40.0), 1).await;
    let yaml = format!(
        "{}limits: {{ max_concurrent_requests: 4, overload_at: 0.5 }}\n",
        auth_yaml(&dir, false)
    );
    let gw = start_gateway(&[("a", sim.addr)], &dir, &yaml).await;
    let (a, b) = (format!("Bearer {TEAM_A}"), format!("Bearer {TEAM_B}"));
    let open = |key: String| async move {
        let mut c = Client::connect(gw.data_addr).await;
        // Reads the head and the first frame, keeping the stream (its slot) open.
        let r = c
            .send_until(
                "POST",
                "/v1/chat/completions",
                &chat(true, 50, ""),
                &[("authorization", &key)],
                1,
            )
            .await;
        (r, c)
    };
    let (rb, _hold_b) = open(b.clone()).await;
    assert_eq!(rb.status, 200);
    let (ra1, _hold_a1) = open(a.clone()).await;
    assert_eq!(ra1.status, 200);
    // Two slots taken of four: pressure. Team A holds 1, its share among two keys is 2.
    let (ra2, _hold_a2) = open(a.clone()).await;
    assert_eq!(ra2.status, 200);
    let (ra3, _) = open(a.clone()).await;
    assert_eq!(ra3.status, 503);
    assert_eq!(ra3.headers["x-inferscope-error"], "client_share");
    // Team B is below its share: it gets the last slot.
    let (rb2, _hold_b2) = open(b.clone()).await;
    assert_eq!(rb2.status, 200);
}
