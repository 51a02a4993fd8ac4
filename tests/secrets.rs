//! No secret in any sink. The gateway runs as a real process with every kind of secret configured
//! — the upstream API key, client keys, the admin token, an OTLP header — and traffic that
//! presents right and wrong keys; then every sink is read whole and searched for each secret:
//! the access log, debug-level stderr, `/stats`, `/metrics`, `/experiments`, every response
//! the clients got (bodies and headers), and every span and metric exported over OTLP.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use inferscope::sim::{self, SimOptions};
use std::process::Command;
use std::time::Duration;
use tokio::net::TcpListener;

const UPSTREAM: &str = "sk-upstream-SECRET-1111aaaa";
const CLIENT: &str = "sk-client-SECRET-2222bbbb";
const WRONG: &str = "sk-wrong-SECRET-3333cccc";
const ADMIN: &str = "admin-SECRET-4444dddd-0123456789";
const OTLP: &str = "otlp-SECRET-5555eeee";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_any_sink() {
    let dir = temp_dir();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut opts = SimOptions::new(exact(2.0, 1.0));
    opts.api_key = Some(UPSTREAM.into());
    let sim = sim::spawn(listener, opts, std::future::pending()).unwrap();
    let (collector, collected) = common::otlp::start_http().await;
    let log = dir.join("access.jsonl");
    let config = dir.join("gw.yaml");
    std::fs::write(
        &config,
        format!(
            "access_log: {{ path: {log:?} }}
admin: {{ token_env: T_ADMIN }}
auth:
  keys:
    - {{ name: team-a, key_env: T_CLIENT }}
backends:
  - {{ name: hosted, url: \"http://{}\", api_key_env: T_UPSTREAM }}
routes:
  - {{ name: main, backends: [hosted] }}
telemetry:
  otlp: {{ endpoint: \"http://{collector}\", protocol: http/protobuf, headers: {{ authorization: \"Bearer {OTLP}\" }} }}
  batch: {{ interval: 50ms }}
  metrics_interval: 200ms
",
            sim.addr
        ),
    )
    .unwrap();
    let stderr = std::fs::File::create(dir.join("stderr.txt")).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_inferscope"));
    cmd.env("RUST_LOG", "debug")
        .env("T_ADMIN", ADMIN)
        .env("T_CLIENT", CLIENT)
        .env("T_UPSTREAM", UPSTREAM)
        .stderr(stderr);
    let (mut child, data, admin) = serve_with(cmd, &config);

    let mut seen = String::new();
    let mut keep = |r: &Received| {
        seen.push_str(&format!("{:?}\n", r.headers));
        seen.push_str(&String::from_utf8_lossy(&r.body()));
    };
    let good = format!("Bearer {CLIENT}");
    let wrong = format!("Bearer {WRONG}");
    let admin_auth = format!("Bearer {ADMIN}");
    let ok = post(
        data,
        "/v1/chat/completions",
        &chat(true, 4, ""),
        &[("authorization", &good)],
    )
    .await;
    assert_eq!(ok.status, 200);
    keep(&ok);
    let ok = post(
        data,
        "/v1/completions",
        r#"{"model":"demo","prompt":"hi","max_tokens":2}"#,
        &[("x-api-key", CLIENT)],
    )
    .await;
    assert_eq!(ok.status, 200);
    keep(&ok);
    for h in [
        vec![("authorization", wrong.as_str())],
        vec![("x-api-key", WRONG)],
        vec![],
    ] {
        let r = post(data, "/v1/chat/completions", &chat(false, 2, ""), &h).await;
        assert_eq!(r.status, 401);
        keep(&r);
    }
    for path in ["/stats", "/metrics", "/experiments"] {
        let r = Client::connect(admin)
            .await
            .send("GET", path, "", &[("authorization", &admin_auth)])
            .await;
        assert_eq!(r.status, 200, "{path}");
        keep(&r);
        let r = Client::connect(admin)
            .await
            .send("GET", path, "", &[("authorization", &wrong)])
            .await;
        assert_eq!(r.status, 401, "{path}");
        keep(&r);
    }
    // Spans and at least one metric export arrive.
    for _ in 0..100 {
        if collected.spans().len() >= 5 && !collected.metrics.lock().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    signal(child.id(), "-TERM");
    assert!(child.wait().unwrap().success());

    let log_text = std::fs::read_to_string(&log).unwrap();
    let stderr_text = std::fs::read_to_string(dir.join("stderr.txt")).unwrap();
    let spans = format!("{:?}", collected.traces.lock().unwrap());
    let metrics = format!("{:?}", collected.metrics.lock().unwrap());
    // Each sink is really there and really about these requests.
    assert_eq!(log_text.lines().count(), 5, "{log_text}");
    assert!(log_text.contains("\"key\":\"team-a\""));
    assert!(spans.contains("team-a"), "the key's name is on the spans");
    assert!(stderr_text.contains("DEBUG") || stderr_text.contains("INFO"));
    assert!(seen.contains("invalid_api_key") && seen.contains("inferscope_key_requests_total"));
    assert!(!metrics.is_empty());
    for (sink, text) in [
        ("access log", &log_text),
        ("stderr", &stderr_text),
        ("responses and admin pages", &seen),
        ("spans", &spans),
        ("exported metrics", &metrics),
    ] {
        for secret in [UPSTREAM, CLIENT, WRONG, ADMIN, OTLP] {
            assert!(!text.contains(secret), "{sink} holds {secret}");
        }
        // Nor any recognisable part of one.
        assert!(!text.contains("SECRET"), "{sink} holds part of a secret");
    }
}
