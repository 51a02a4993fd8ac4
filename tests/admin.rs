//! The admin plane's exposure: a bearer token guards everything but the probes, state changes
//! need a JSON body, and a non-loopback admin address without a token is refused (by `serve`
//! and by `check`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use inferscope::app::{self, Overrides};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TOKEN: &str = "s3cret-admin-token-0123456789";

fn yaml(sim: SocketAddr, admin: &str) -> String {
    format!(
        "admin: {{ listen: \"127.0.0.1:0\"{admin} }}\nbackends:\n  - {{ name: s, url: \"http://{sim}\" }}\nroutes:\n  - {{ name: all, backends: [s] }}\n"
    )
}

/// One raw admin request; returns the status code and the whole response.
async fn raw(addr: SocketAddr, head: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).await.unwrap();
    let text = String::from_utf8_lossy(&got).into_owned();
    let code = text.split_whitespace().nth(1).unwrap().parse().unwrap();
    (code, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_guards_everything_but_the_probes() {
    let var = format!("INFERSCOPE_TEST_ADMIN_TOKEN_{}", std::process::id());
    std::env::set_var(&var, TOKEN);
    let sim = start_sim(exact(1.0, 1.0), 1).await;
    let gw = start_yaml(&yaml(sim.addr, &format!(", token_env: {var}"))).await;
    let a = gw.admin_addr;
    let get = |path: &str, auth: Option<&str>| {
        let auth = auth.map_or(String::new(), |t| format!("authorization: Bearer {t}\r\n"));
        format!("GET {path} HTTP/1.1\r\nhost: localhost\r\n{auth}connection: close\r\n\r\n")
    };
    for probe in ["/healthz", "/readyz"] {
        assert_eq!(raw(a, &get(probe, None)).await.0, 200, "{probe}");
    }
    // The dashboard page is static (a browser cannot send a bearer token when navigating): it
    // loads, asks for the token, and sends it with each request for data.
    let (code, page) = raw(a, &get("/", None)).await;
    assert_eq!(code, 200);
    assert!(page.contains("<title>inferscope</title>") && !page.contains(TOKEN));
    let lower = page.to_ascii_lowercase();
    assert!(lower.contains("content-security-policy: default-src 'none'"));
    assert!(lower.contains("x-frame-options: deny"));
    // Its script runs by its hash; no inline script is allowed as such.
    let csp = lower
        .lines()
        .find(|l| l.starts_with("content-security-policy:"))
        .unwrap();
    assert!(csp.contains("script-src 'sha256-"), "{csp}");
    assert!(!csp.contains("script-src 'unsafe-inline'"), "{csp}");
    // The scheme is case-insensitive (RFC 7235), as on the data plane.
    let lower_case = format!(
        "GET /stats HTTP/1.1\r\nhost: localhost\r\nauthorization: bearer {TOKEN}\r\nconnection: close\r\n\r\n"
    );
    assert_eq!(raw(a, &lower_case).await.0, 200);
    for path in ["/stats", "/metrics", "/experiments", "/stats?format=hdr"] {
        let (code, text) = raw(a, &get(path, None)).await;
        assert_eq!(code, 401, "{path}");
        assert!(text
            .to_ascii_lowercase()
            .contains("www-authenticate: bearer"));
        assert_eq!(
            raw(a, &get(path, Some("wrong-token-0123456789"))).await.0,
            401
        );
        assert_eq!(raw(a, &get(path, Some(TOKEN))).await.0, 200, "{path}");
    }
    // The token never shows in what the admin plane serves.
    let (_, metrics) = raw(a, &get("/metrics", Some(TOKEN))).await;
    let (_, stats) = raw(a, &get("/stats", Some(TOKEN))).await;
    assert!(!metrics.contains(TOKEN) && !stats.contains(TOKEN));
    gw.shutdown();
    assert!(gw.wait().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_changes_need_a_json_body() {
    let sim = start_sim(exact(1.0, 1.0), 1).await;
    let gw = start_yaml(&yaml(sim.addr, "")).await;
    let body = r#"{"route":"all"}"#;
    for (ctype, want) in [
        ("text/plain", 415),
        ("application/x-www-form-urlencoded", 415),
    ] {
        let head = format!(
            "POST /experiments/reset HTTP/1.1\r\nhost: localhost\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        assert_eq!(raw(gw.admin_addr, &head).await.0, want, "{ctype}");
    }
    let head = format!(
        "POST /feedback HTTP/1.1\r\nhost: localhost\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    assert_eq!(raw(gw.admin_addr, &head).await.0, 415, "no content type");
    gw.shutdown();
    assert!(gw.wait().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_loopback_admin_address_needs_a_token_or_an_explicit_opt_out() {
    let sim = start_sim(exact(1.0, 1.0), 1).await;
    let start = |extra: &str| {
        let cfg = inferscope::config::parse(&yaml(sim.addr, extra), "admin.yaml").unwrap();
        app::start(
            Arc::new(cfg),
            Overrides {
                listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
                admin: Some(SocketAddr::from(([0, 0, 0, 0], 0))),
                config_path: None,
            },
        )
    };
    let refused = start("").await.unwrap_err().to_string();
    assert!(refused.contains("not a loopback address"), "{refused}");
    let opted_out = start(", allow_unauthenticated: true").await.unwrap();
    opted_out.shutdown();
    opted_out.wait().await;

    // `check` says the same of a file that asks for it.
    let dir = temp_dir();
    let file = dir.join("exposed.yaml");
    std::fs::write(
        &file,
        yaml(sim.addr, "").replace("127.0.0.1:0", "0.0.0.0:9464"),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_inferscope"))
        .arg("check")
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("admin.listen") && err.contains("token_env"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_answer_only_to_their_own_host_names() {
    let sim = start_sim(exact(1.0, 1.0), 1).await;
    let gw = start_yaml(&yaml(sim.addr, ", allowed_hosts: [inferscope.internal]")).await;
    let a = gw.admin_addr;
    let get = |path: &str, host: &str| {
        format!("GET {path} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n")
    };
    let own = a.to_string();
    for host in [
        own.as_str(),
        "localhost:9464",
        "127.0.0.1",
        "[::1]:1",
        "Inferscope.Internal",
    ] {
        assert_eq!(raw(a, &get("/stats", host)).await.0, 200, "{host}");
    }
    // A rebinding page reaches the listener under the attacker's name: refused, reads and
    // writes alike.
    for path in ["/", "/stats", "/experiments"] {
        let (code, text) = raw(a, &get(path, "evil.example:9464")).await;
        assert_eq!(code, 421, "{path}");
        assert!(text.contains("allowed_hosts"));
    }
    let post = "POST /experiments/reset HTTP/1.1\r\nhost: evil.example\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}";
    assert_eq!(raw(a, post).await.0, 421);
    assert_eq!(
        raw(a, &get("/stats", "10.1.2.3")).await.0,
        421,
        "another address"
    );
    // Machines name the listener as they like.
    for path in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(raw(a, &get(path, "evil.example")).await.0, 200, "{path}");
    }
    gw.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_paths_and_methods_get_plain_answers() {
    let sim = start_sim(exact(1.0, 1.0), 1).await;
    let gw = start_yaml(&yaml(sim.addr, "")).await;
    let a = gw.admin_addr;
    let req = |method: &str, path: &str| {
        format!("{method} {path} HTTP/1.1\r\nhost: {a}\r\ncontent-type: application/json\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
    };
    let (code, text) = raw(a, &req("GET", "/nope")).await;
    assert_eq!(code, 404);
    assert!(text.contains("try / (the dashboard)"), "{text}");
    // A page's path with a method it does not take, and a receiver's.
    for (method, path) in [
        ("POST", "/stats"),
        ("PUT", "/feedback"),
        ("GET", "/v1/traces"),
    ] {
        let (code, text) = raw(a, &req(method, path)).await;
        assert_eq!(code, 405, "{method} {path}");
        assert!(
            text.contains("method not allowed"),
            "{method} {path}: {text}"
        );
    }
    // HEAD is GET without the body.
    let (code, text) = raw(a, &req("HEAD", "/healthz")).await;
    assert_eq!(code, 200);
    assert!(!text.contains("ok\n"), "{text}");
    gw.shutdown();
}
