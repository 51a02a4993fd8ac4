//! TLS both ways over real loopback sockets, with certificates made in the test: a TLS listener
//! (HTTP/1.1 and h2 by ALPN), mTLS accept and refuse, an `https://` backend shaped like a hosted
//! API (TLS, an API root path, a required key), an upstream whose certificate nothing trusts,
//! and a certificate replaced on disk while the gateway runs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use bytes::Bytes;
use common::pki;
use http_body_util::{BodyExt, Full};
use inferscope::sim::{self, SimHandle, SimOptions};
use inferscope::tls::{ServerFiles, ServerTls};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// A simulator shaped like a hosted API: TLS with `pki`'s server certificate, the API under
/// `/api/v1`, key `sk-upstream-secret` required.
async fn hosted_sim(p: &pki::Pki) -> SimHandle {
    hosted_sim_with(ServerFiles {
        cert: p.server_cert.clone(),
        key: p.server_key.clone(),
        client_ca: None,
        client_cert_required: false,
    })
    .await
}

async fn hosted_sim_with(files: ServerFiles) -> SimHandle {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut opts = SimOptions::new(common::exact(5.0, 2.0));
    opts.record_truth = true;
    opts.keep_credentials = true;
    opts.api_root = Some("/api/v1".into());
    opts.api_key = Some("sk-upstream-secret".into());
    opts.tls = Some(Arc::new(ServerTls::load(files).unwrap()));
    sim::spawn(listener, opts, std::future::pending()).unwrap()
}

/// A chat request (streamed or not, `max_tokens`) without headers.
async fn chat_to(addr: SocketAddr, stream: bool, max_tokens: u32) -> common::Received {
    common::post(
        addr,
        "/v1/chat/completions",
        &common::chat(stream, max_tokens, ""),
        &[],
    )
    .await
}

fn listener_tls(p: &pki::Pki, mtls: bool) -> String {
    let mut s = format!(
        "tls:\n  cert: {:?}\n  key: {:?}\n",
        p.server_cert, p.server_key
    );
    if mtls {
        s.push_str(&format!("  client_ca: {:?}\n", p.ca));
    }
    s
}

#[tokio::test]
async fn a_hosted_api_behind_tls_both_ways_streams_and_is_measured() {
    let dir = common::temp_dir();
    let p = pki::make(&dir);
    let sim = hosted_sim(&p).await;
    std::env::set_var("INFERSCOPE_TEST_TLS_UPSTREAM_KEY", "sk-upstream-secret");
    let yaml = format!(
        "{}access_log: {{ path: {:?} }}
backends:
  - name: hosted
    url: \"https://localhost:{}/api/v1\"
    api_key_env: INFERSCOPE_TEST_TLS_UPSTREAM_KEY
    tls: {{ roots: none, ca_file: {:?} }}
    probe: {{ path: /v1/models, interval: 100ms, timeout: 2s }}
routes:
  - name: main
    backends: [hosted]
",
        listener_tls(&p, false),
        dir.join("access.jsonl"),
        sim.addr.port(),
        p.ca
    );
    let gw = common::start_yaml(&yaml).await;

    // HTTP/1.1 by ALPN, streaming.
    let tls = pki::connect(
        gw.data_addr,
        pki::client_config(&p.ca, None, &[b"http/1.1"]),
    )
    .await
    .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let mut c = common::Client::over(tls).await;
    let r = c
        .send(
            "POST",
            "/v1/chat/completions",
            &common::chat(true, 8, ""),
            &[("authorization", "Bearer client-own-key")],
        )
        .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body()));
    let body = String::from_utf8(r.body()).unwrap();
    assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
    assert!(
        r.frames.len() > 3,
        "streamed in several frames: {}",
        r.frames.len()
    );
    let truth = sim.truth();
    assert_eq!(truth.len(), 1);
    assert_eq!(
        truth[0].path, "/v1/chat/completions",
        "the API root was applied"
    );
    // The bytes the backend sent, unchanged but for the usage event the gateway asked for
    // (the client did not).
    let sent = String::from_utf8(truth[0].bytes.clone()).unwrap();
    let expected: String = sent
        .split_inclusive("\n\n")
        .filter(|e| !e.contains("\"usage\""))
        .collect();
    assert!(expected == body, "the backend's events, unchanged");
    // The operator's key replaced the client's on the way out.
    let creds = sim.credentials();
    assert!(creds
        .iter()
        .all(|(k, v)| k == "authorization" && v == "Bearer sk-upstream-secret"));

    // h2 by ALPN on the same listener.
    let tls = pki::connect(gw.data_addr, pki::client_config(&p.ca, None, &[b"h2"]))
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut h2, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tls),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let req = http::Request::post("https://localhost/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(common::chat(true, 4, ""))))
        .unwrap();
    let resp = h2.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("[DONE]"));

    // The probe reaches the API root over TLS with the key: the backend stays available.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let b = common::backend_stats(gw.admin_addr, "hosted").await;
    assert_eq!(b["available"], true, "{b}");
    assert!(
        sim.truth().len() >= 2,
        "probes are not generation requests; the two chats were"
    );

    let log = common::stop_and_read_log(gw, &dir).await;
    let chats: Vec<_> = log
        .iter()
        .filter(|l| l["path"] == "/v1/chat/completions")
        .collect();
    assert_eq!(chats.len(), 2, "{log:?}");
    for l in chats {
        assert_eq!(l["status"], 200, "{l}");
        assert!(l["ttft_ms"].as_f64().unwrap() >= 5.0, "{l}");
        assert_eq!(l["backend"], "hosted");
    }
}

/// A raw TLS attempt: `Ok` when a request got an answer.
async fn try_request(addr: SocketAddr, config: Arc<rustls::ClientConfig>) -> Result<u16, String> {
    let tls = pki::connect(addr, config)
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = http::Request::post("/v1/chat/completions")
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(common::chat(false, 2, ""))))
        .unwrap();
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    Ok(resp.status().as_u16())
}

#[tokio::test]
async fn mtls_admits_certificates_of_the_ca_and_refuses_the_rest() {
    let dir = common::temp_dir();
    let p = pki::make(&dir);
    let sim = common::start_sim(common::exact(1.0, 1.0), 1).await;
    let extra = listener_tls(&p, true);
    let yaml = format!(
        "{extra}backends:\n  - {{ name: a, url: \"http://{}\" }}\nroutes:\n  - {{ name: main, backends: [a] }}\n",
        sim.addr
    );
    let gw = common::start_yaml(&yaml).await;
    let ok = try_request(
        gw.data_addr,
        pki::client_config(&p.ca, Some((&p.client_cert, &p.client_key)), &[b"http/1.1"]),
    )
    .await;
    assert_eq!(ok, Ok(200));
    let none = try_request(
        gw.data_addr,
        pki::client_config(&p.ca, None, &[b"http/1.1"]),
    )
    .await;
    assert!(none.is_err(), "no certificate: {none:?}");
    let stranger = try_request(
        gw.data_addr,
        pki::client_config(
            &p.ca,
            Some((&p.stranger_cert, &p.stranger_key)),
            &[b"http/1.1"],
        ),
    )
    .await;
    assert!(stranger.is_err(), "another CA's certificate: {stranger:?}");
    // Plain HTTP on the TLS port gets no HTTP answer either.
    let plain = tokio::time::timeout(
        Duration::from_secs(5),
        common::Client::connect(gw.data_addr),
    )
    .await
    .unwrap();
    drop(plain);
    let admin = gw.admin_addr;
    common::until(Duration::from_secs(5), "two handshake failures counted", || async move {
        common::metric(admin, "inferscope_tls_handshake_failures_total").await >= 2.0
    })
    .await;
    assert_eq!(
        sim.truth().len(),
        1,
        "only the admitted client reached the backend"
    );
    gw.shutdown();
}

#[tokio::test]
async fn an_upstream_certificate_nothing_trusts_is_a_connect_failure() {
    let dir = common::temp_dir();
    let p = pki::make(&dir);
    let sim = hosted_sim(&p).await;
    let yaml = format!(
        "access_log: {{ path: {:?} }}
backends:
  - name: hosted
    url: \"https://localhost:{}/api/v1\"
    tls: {{ roots: none, ca_file: {:?} }}
routes:
  - {{ name: main, backends: [hosted] }}
",
        dir.join("access.jsonl"),
        sim.addr.port(),
        p.other_ca
    );
    let gw = common::start_yaml(&yaml).await;
    let r = chat_to(gw.data_addr, false, 2).await;
    assert_eq!(r.status, 502, "{}", String::from_utf8_lossy(&r.body()));
    assert!(
        sim.truth().is_empty(),
        "no request reached a server it could not verify"
    );
    let log = common::stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 1);
    assert_eq!(log[0]["error"], "upstream_connect", "{}", log[0]);
}

/// A gateway serving TLS from `p`'s server certificate in front of a fresh simulator, and a
/// client that trusts `p`'s CA.
async fn tls_gateway(
    p: &pki::Pki,
) -> (
    SimHandle,
    inferscope::app::Running,
    Arc<rustls::ClientConfig>,
) {
    let sim = common::start_sim(common::exact(1.0, 1.0), 1).await;
    let yaml = format!(
        "{}backends:\n  - {{ name: a, url: \"http://{}\" }}\nroutes:\n  - {{ name: main, backends: [a] }}\n",
        listener_tls(p, false),
        sim.addr
    );
    let gw = common::start_yaml(&yaml).await;
    (sim, gw, pki::client_config(&p.ca, None, &[b"http/1.1"]))
}

#[tokio::test]
async fn a_replaced_certificate_is_served_without_a_restart() {
    let dir = common::temp_dir();
    let p = pki::make(&dir);
    let (_sim, gw, old) = tls_gateway(&p).await;
    assert_eq!(try_request(gw.data_addr, Arc::clone(&old)).await, Ok(200));
    // A broken file is refused and the running certificate stays.
    std::fs::write(&p.server_cert, "not a certificate").unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(try_request(gw.data_addr, Arc::clone(&old)).await, Ok(200));
    // A new certificate from another CA: new handshakes verify only against that CA.
    let new_ca = dir.join("new-ca.pem");
    pki::reissue_server(&dir, &new_ca);
    let new = pki::client_config(&new_ca, None, &[b"http/1.1"]);
    let mut served = false;
    for _ in 0..50 {
        if try_request(gw.data_addr, Arc::clone(&new)).await == Ok(200) {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(served, "the new certificate is served");
    assert!(
        try_request(gw.data_addr, old).await.is_err(),
        "the old one is not"
    );
    gw.shutdown();
}

/// A certificate path swapped for a FIFO nobody writes, then for `/dev/zero` (a mistaken symlink
/// during a rotation): each reload is refused at once, the running certificate keeps serving, and
/// a valid certificate written afterwards is picked up.
#[cfg(unix)]
#[tokio::test]
async fn a_certificate_path_that_is_not_a_regular_file_is_refused_and_watching_goes_on() {
    let dir = common::temp_dir();
    let p = pki::make(&dir);
    let (_sim, gw, old) = tls_gateway(&p).await;
    assert_eq!(try_request(gw.data_addr, Arc::clone(&old)).await, Ok(200));
    let failures = || common::metric(gw.admin_addr, "inferscope_tls_reload_failures_total");
    // A FIFO: opening it for reading would block until a writer comes, which none does.
    std::fs::remove_file(&p.server_cert).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(&p.server_cert)
        .status()
        .unwrap();
    assert!(made.success());
    common::until(Duration::from_secs(10), "the FIFO is refused", || async {
        failures().await >= 1.0
    })
    .await;
    assert_eq!(try_request(gw.data_addr, Arc::clone(&old)).await, Ok(200));
    // A symlink to /dev/zero: reading it would never end.
    std::fs::remove_file(&p.server_cert).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &p.server_cert).unwrap();
    common::until(Duration::from_secs(10), "/dev/zero is refused", || async {
        failures().await >= 2.0
    })
    .await;
    assert_eq!(try_request(gw.data_addr, Arc::clone(&old)).await, Ok(200));
    // A valid certificate afterwards: the watcher is still watching.
    std::fs::remove_file(&p.server_cert).unwrap();
    let new_ca = dir.join("new-ca.pem");
    pki::reissue_server(&dir, &new_ca);
    let new = pki::client_config(&new_ca, None, &[b"http/1.1"]);
    common::until(
        Duration::from_secs(10),
        "the new certificate is served",
        || {
            let new = Arc::clone(&new);
            async move { try_request(gw.data_addr, new).await == Ok(200) }
        },
    )
    .await;
    assert_eq!(
        common::metric(gw.admin_addr, "inferscope_tls_reloads_total").await,
        1.0
    );
    gw.shutdown();
}

async fn otlp_over_tls(protocol: &str) {
    let dir = common::temp_dir();
    let p = pki::make(&dir);
    let (addr, collected) = if protocol == "grpc" {
        common::otlp::start_grpc_with(Some((
            std::fs::read(&p.server_cert).unwrap(),
            std::fs::read(&p.server_key).unwrap(),
        )))
        .await
    } else {
        common::otlp::start_http_with(Some(Arc::new(
            ServerTls::load(ServerFiles {
                cert: p.server_cert.clone(),
                key: p.server_key.clone(),
                client_ca: None,
                client_cert_required: false,
            })
            .unwrap(),
        )))
        .await
    };
    let sim = common::start_sim(common::exact(1.0, 1.0), 1).await;
    let yaml = format!(
        "backends:\n  - {{ name: a, url: \"http://{}\" }}\nroutes:\n  - {{ name: main, backends: [a] }}\ntelemetry:\n  otlp: {{ endpoint: \"https://localhost:{}\", protocol: {protocol}, headers: {{ authorization: \"Bearer otlp-secret\" }}, tls: {{ roots: none, ca_file: {:?} }} }}\n  batch: {{ interval: 50ms }}\n",
        sim.addr,
        addr.port(),
        p.ca
    );
    let gw = common::start_yaml(&yaml).await;
    let r = chat_to(gw.data_addr, true, 3).await;
    assert_eq!(r.status, 200);
    let mut spans = Vec::new();
    for _ in 0..100 {
        spans = collected.spans();
        if !spans.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!spans.is_empty(), "spans arrived over TLS ({protocol})");
    if protocol != "grpc" {
        let auth = collected.auth.lock().unwrap().clone();
        assert_eq!(auth[0].as_deref(), Some("Bearer otlp-secret"));
    }
    gw.shutdown();
    assert!(gw.wait().await, "drained, telemetry flushed");
}

#[tokio::test]
async fn otlp_exports_over_tls_with_grpc() {
    otlp_over_tls("grpc").await;
}

#[tokio::test]
async fn otlp_exports_over_tls_with_http() {
    otlp_over_tls("http/protobuf").await;
}

#[tokio::test]
async fn an_upstream_that_wants_a_client_certificate_and_a_server_name_gets_both() {
    let dir = common::temp_dir();
    let p = pki::make(&dir);
    // The backend's certificate names only `api.hosted.test`, and it requires a client
    // certificate from the test CA.
    let sim = hosted_sim_with(ServerFiles {
        cert: p.named_cert.clone(),
        key: p.named_key.clone(),
        client_ca: Some(p.ca.clone()),
        client_cert_required: true,
    })
    .await;
    std::env::set_var("INFERSCOPE_TEST_TLS_UPSTREAM_KEY_2", "sk-upstream-secret");
    let yaml = |tls: &str| {
        format!(
            "access_log: {{ path: {:?} }}
backends:
  - name: hosted
    url: \"https://127.0.0.1:{}/api/v1\"
    api_key_env: INFERSCOPE_TEST_TLS_UPSTREAM_KEY_2
    tls: {{ roots: none, ca_file: {:?}{tls} }}
routes:
  - {{ name: main, backends: [hosted] }}
",
            dir.join("access.jsonl"),
            sim.addr.port(),
            p.ca
        )
    };
    let full = format!(
        ", server_name: api.hosted.test, cert: {:?}, key: {:?}",
        p.client_cert, p.client_key
    );
    let gw = common::start_yaml(&yaml(&full)).await;
    let r = chat_to(gw.data_addr, true, 3).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body()));
    assert_eq!(sim.truth().len(), 1);
    gw.shutdown();
    // Without the server name the certificate does not match the address; without the client
    // certificate the backend refuses the handshake: a connect failure either way, and the
    // backend never sees a request.
    let no_name = format!(", cert: {:?}, key: {:?}", p.client_cert, p.client_key);
    for tls in [no_name.as_str(), ", server_name: api.hosted.test"] {
        let gw = common::start_yaml(&yaml(tls)).await;
        let r = chat_to(gw.data_addr, false, 2).await;
        assert_eq!(r.status, 502, "{tls}");
        assert_eq!(r.headers["x-inferscope-error"], "upstream_connect", "{tls}");
        gw.shutdown();
    }
    assert_eq!(sim.truth().len(), 1);
}

#[tokio::test]
async fn an_admin_plane_behind_mtls_serves_only_certified_clients() {
    let dir = common::temp_dir();
    let p = pki::make(&dir);
    let sim = common::start_sim(common::exact(1.0, 1.0), 1).await;
    let yaml = format!(
        "admin:\n  tls: {{ cert: {:?}, key: {:?}, client_ca: {:?} }}\nbackends:\n  - {{ name: a, url: \"http://{}\" }}\nroutes:\n  - {{ name: main, backends: [a] }}\n",
        p.server_cert, p.server_key, p.ca, sim.addr
    );
    // Counted as authentication: a non-loopback admin address would be allowed.
    let cfg = inferscope::config::parse(&yaml, "gw.yaml").unwrap();
    assert!(
        inferscope::config::admin_exposure(&cfg.admin, "0.0.0.0:9464".parse().unwrap()).is_none()
    );
    let gw = common::start_yaml(&yaml).await;
    let certified =
        pki::client_config(&p.ca, Some((&p.client_cert, &p.client_key)), &[b"http/1.1"]);
    let tls = pki::connect(gw.admin_addr, certified).await.unwrap();
    let r = common::Client::over(tls)
        .await
        .send("GET", "/stats", "", &[])
        .await;
    assert_eq!(r.status, 200);
    let anonymous = pki::client_config(&p.ca, None, &[b"http/1.1"]);
    let refused = match pki::connect(gw.admin_addr, anonymous).await {
        Err(_) => true,
        Ok(tls) => {
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                    .await
                    .unwrap();
            tokio::spawn(conn);
            let req = http::Request::get("/stats")
                .header("host", "localhost")
                .body(Full::new(Bytes::new()))
                .unwrap();
            sender.send_request(req).await.is_err()
        }
    };
    assert!(refused, "no certificate, no admin page");
    // The refused handshake is counted like the data plane's.
    let certified =
        pki::client_config(&p.ca, Some((&p.client_cert, &p.client_key)), &[b"http/1.1"]);
    common::until(
        Duration::from_secs(5),
        "the admin handshake failure is counted",
        || {
            let certified = Arc::clone(&certified);
            async move {
                let tls = pki::connect(gw.admin_addr, certified).await.unwrap();
                let r = common::Client::over(tls)
                    .await
                    .send("GET", "/metrics", "", &[])
                    .await;
                String::from_utf8(r.body())
                    .unwrap()
                    .lines()
                    .find_map(|l| l.strip_prefix("inferscope_tls_handshake_failures_total "))
                    .is_some_and(|v| v.trim().parse::<f64>().unwrap() >= 1.0)
            }
        },
    )
    .await;
    gw.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_load_generator_speaks_tls_and_sends_a_key() {
    use inferscope::lab::loadgen::{self, Arrivals, BenchOptions};
    let dir = common::temp_dir();
    let p = pki::make(&dir);
    let sim = common::start_sim(common::exact(2.0, 1.0), 1).await;
    let key_file = dir.join("k");
    std::fs::write(&key_file, "sk-bench-key").unwrap();
    let yaml = format!(
        "{}auth:\n  keys: [{{ name: bench, key_file: {:?} }}]\nbackends:\n  - {{ name: a, url: \"http://{}\" }}\nroutes:\n  - {{ name: main, backends: [a] }}\n",
        listener_tls(&p, false),
        key_file,
        sim.addr
    );
    let gw = common::start_yaml(&yaml).await;
    let url = format!("https://localhost:{}", gw.data_addr.port());
    let options = |requests, h2, headers: Vec<(String, String)>, connector| BenchOptions {
        url: url.clone(),
        model: "demo".into(),
        endpoint: Default::default(),
        prompts: loadgen::synthetic_prompts(4, 8, 1),
        arrivals: Arrivals::Concurrency(2),
        pacing: Default::default(),
        requests,
        duration: None,
        stream: true,
        max_tokens: 4,
        ignore_eos: false,
        timeout: None,
        slo: Vec::new(),
        headers,
        seed: 1,
        progress: false,
        http2_connections: h2,
        warmup: 0,
        connector,
    };
    let key = || vec![("authorization".into(), "Bearer sk-bench-key".into())];
    for (h2, alpn) in [(None, &b"http/1.1"[..]), (Some(1), &b"h2"[..])] {
        let connector =
            inferscope::tls::Connector::for_url(&url, Some(p.ca.clone()), &[alpn]).unwrap();
        let (samples, _) = loadgen::run(&options(6, h2, key(), connector)).await;
        assert_eq!(samples.len(), 6);
        assert!(
            samples.iter().all(|s| s.status == 200 && s.complete),
            "{h2:?}: {:?}",
            samples.iter().map(|s| s.status).collect::<Vec<_>>()
        );
    }
    // Without the CA the handshake fails: nothing measured as a success.
    let connector = inferscope::tls::Connector::for_url(&url, None, &[b"http/1.1"]).unwrap();
    let (samples, _) = loadgen::run(&options(1, None, key(), connector)).await;
    assert!(samples.iter().all(|s| s.status != 200));
    gw.shutdown();
}
