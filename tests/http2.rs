//! HTTP/2 upstreams (`http2: true`): with prior knowledge to a backend that speaks nothing else,
//! and by ALPN over TLS (HTTP/1.1 kept when the backend picks it). Requests share connections up
//! to the backend's stream limit and measure as over HTTP/1; a client that leaves resets only its
//! own stream; a backend that closes its connections, or cannot be reached, is handled as an
//! HTTP/1 one is (a new connection, failover); probes speak HTTP/2 too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use bytes::Bytes;
use common::*;
use http_body_util::Full;
use inferscope::sim::{self, ChunkKind, Profile, SimHandle, SimOptions, Truth};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;

/// A simulator recording truth that speaks HTTP/2 only (prior knowledge), with `max_streams`
/// streams per connection.
async fn h2_only_sim(profile: Profile, max_streams: u32) -> SimHandle {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    h2_only_sim_on(listener, profile, max_streams, std::future::pending())
}

fn h2_only_sim_on(
    listener: TcpListener,
    profile: Profile,
    max_streams: u32,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> SimHandle {
    let mut opts = SimOptions::new(profile);
    opts.record_truth = true;
    opts.http2_only = true;
    opts.h2_max_streams = max_streams;
    sim::spawn(listener, opts, shutdown).unwrap()
}

fn gateway_yaml(dir: &std::path::Path, backends: &str, route: &str) -> String {
    format!(
        "access_log: {{ path: {:?} }}\nbackends:\n{backends}routes:\n  - name: main\n{route}",
        dir.join("access.jsonl")
    )
}

/// A gateway with one backend at `addr`, `http2: true`, and its access-log directory.
async fn h2_gateway(addr: SocketAddr) -> (inferscope::app::Running, std::path::PathBuf) {
    let dir = temp_dir();
    let yaml = gateway_yaml(
        &dir,
        &format!("  - {{ name: h2, url: \"http://{addr}\", http2: true }}\n"),
        "    backends: [h2]\n",
    );
    (start_yaml(&yaml).await, dir)
}

/// Connections the simulator's requests came on.
fn connections(truth: &[Truth]) -> usize {
    truth.iter().map(|t| t.peer).collect::<HashSet<_>>().len()
}

/// Waits until `check` holds on the simulator's truth (or fails after 10 s).
async fn until(sim: &SimHandle, what: &str, check: impl Fn(&[Truth]) -> bool) -> Vec<Truth> {
    let t0 = std::time::Instant::now();
    loop {
        let truth = sim.truth();
        if check(&truth) {
            return truth;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn streamed(max_tokens: u32) -> String {
    chat(
        true,
        max_tokens,
        r#","stream_options":{"include_usage":true}"#,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2c_backend_gets_multiplexed_requests_measured_exactly() {
    let sim = h2_only_sim(exact(40.0, 10.0), 256).await;
    let (gw, dir) = h2_gateway(sim.addr).await;

    // One request, measured against the simulator's truth.
    let r = post(gw.data_addr, "/v1/chat/completions", &streamed(12), &[]).await;
    assert_eq!(r.status, 200);
    let t = sim.truth().remove(0);
    assert_eq!(t.version, http::Version::HTTP_2);
    assert_eq!(r.body(), t.bytes, "forwarded untouched");

    // Eight at once: one connection carries them all.
    let runs: Vec<_> = (0..8)
        .map(|_| {
            let addr = gw.data_addr;
            tokio::spawn(
                async move { post(addr, "/v1/chat/completions", &streamed(12), &[]).await },
            )
        })
        .collect();
    for run in runs {
        let r = run.await.unwrap();
        assert_eq!(r.status, 200);
        assert!(r.body().ends_with(b"data: [DONE]\n\n"));
    }
    let truth = sim.truth();
    assert_eq!(truth.len(), 9);
    assert!(truth.iter().all(|t| t.completed));
    assert_eq!(connections(&truth), 1, "every request on one connection");

    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 9);
    assert!(
        log.iter()
            .all(|l| l["outcome"] == "ok" && l["output_tokens"] == 12),
        "{log:?}"
    );
    // Causality bounds on the first: the gateway's TTFT lies between the simulator's and the
    // client's (1 µs: the log's rounding).
    let line = &log[0];
    let us = Duration::from_micros(1);
    let tok1 = t
        .sent
        .iter()
        .find(|s| matches!(s.kind, ChunkKind::Content { .. }))
        .unwrap();
    let gw_ttft = ms(line, "ttft_ms");
    assert!(tok1.at - t.arrival <= gw_ttft + us, "{gw_ttft:?}");
    let client_ttft = r.time_of_byte(tok1.range.end).unwrap() - r.t_send;
    assert!(gw_ttft <= client_ttft + us, "{gw_ttft:?} > {client_ttft:?}");
    let times = t.content_times();
    let truth_tpot = (times[times.len() - 1] - times[0]) / 11;
    assert!(
        ms(line, "tpot_ms").abs_diff(truth_tpot) < Duration::from_millis(1),
        "TPOT {:?} vs truth {truth_tpot:?}",
        ms(line, "tpot_ms")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_backends_stream_limit_another_connection_opens() {
    // The backend allows 4 streams per connection (its SETTINGS): 10 requests at once need 3
    // connections; none waits inside a connection for a stream.
    let sim = h2_only_sim(exact(150.0, 20.0), 4).await;
    let (gw, dir) = h2_gateway(sim.addr).await;
    // The first connection, and the backend's SETTINGS with it.
    assert_eq!(
        post(gw.data_addr, "/v1/chat/completions", &streamed(2), &[])
            .await
            .status,
        200
    );
    let runs: Vec<_> = (0..10)
        .map(|_| {
            let addr = gw.data_addr;
            tokio::spawn(async move { post(addr, "/v1/chat/completions", &streamed(8), &[]).await })
        })
        .collect();
    for run in runs {
        assert_eq!(run.await.unwrap().status, 200);
    }
    let truth = sim.truth();
    assert_eq!(truth.len(), 11);
    let burst = &truth[1..];
    assert_eq!(connections(burst), 3, "4 + 4 + 2 streams");
    assert!(
        truth.iter().any(|t| t.peer == burst[0].peer) && connections(&truth) == 3,
        "the first connection is reused"
    );
    // No request waited for a stream: each arrived at the backend within a few ms of the others
    // (waiting would have cost a whole response, ≥ 290 ms).
    let first = burst.iter().map(|t| t.arrival).min().unwrap();
    let last = burst.iter().map(|t| t.arrival).max().unwrap();
    assert!(
        last - first < Duration::from_millis(150),
        "arrivals spread over {:?}",
        last - first
    );
    stop_and_read_log(gw, &dir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_resets_only_its_own_stream() {
    let sim = h2_only_sim(exact(20.0, 40.0), 256).await;
    let (gw, dir) = h2_gateway(sim.addr).await;
    let stays = {
        let addr = gw.data_addr;
        tokio::spawn(async move { post(addr, "/v1/chat/completions", &streamed(30), &[]).await })
    };
    let mut leaving = Client::connect(gw.data_addr).await;
    let r = leaving
        .send_until("POST", "/v1/chat/completions", &streamed(30), &[], 3)
        .await;
    assert_eq!(r.status, 200);
    drop(r);
    leaving.abort();
    // The backend learns at once (RST_STREAM): it stops generating that response…
    let truth = until(&sim, "the backend saw the reset", |t| {
        t.iter().any(|t| t.cancelled)
    })
    .await;
    let cancelled = truth.iter().find(|t| t.cancelled).unwrap();
    assert!(!cancelled.completed);
    // … while the other stream on the same connection goes on to its end.
    let r = stays.await.unwrap();
    assert_eq!(r.status, 200);
    assert!(r.body().ends_with(b"data: [DONE]\n\n"));
    let truth = until(&sim, "both recorded", |t| t.len() == 2).await;
    assert_eq!(connections(&truth), 1, "one connection, still open");
    assert!(truth.iter().any(|t| t.completed));
    // The next request reuses that connection.
    assert_eq!(
        post(gw.data_addr, "/v1/chat/completions", &streamed(2), &[])
            .await
            .status,
        200
    );
    assert_eq!(connections(&sim.truth()), 1);
    let log = stop_and_read_log(gw, &dir).await;
    let outcomes: Vec<&str> = log.iter().map(|l| l["outcome"].as_str().unwrap()).collect();
    assert_eq!(log.len(), 3, "{outcomes:?}");
    assert_eq!(
        outcomes
            .iter()
            .filter(|o| **o == "client_cancelled")
            .count(),
        1,
        "{outcomes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_closes_its_connection_gets_a_new_one() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let first = h2_only_sim_on(listener, exact(5.0, 2.0), 256, async {
        let _ = stopped.await;
    });
    let (gw, dir) = h2_gateway(addr).await;
    let r = post(gw.data_addr, "/v1/chat/completions", &streamed(3), &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(first.truth().len(), 1);
    // The backend restarts: GOAWAY on the pooled connection, then a new process on the port.
    stop.send(()).unwrap();
    let t0 = std::time::Instant::now();
    let listener = loop {
        match TcpListener::bind(addr).await {
            Ok(l) => break l,
            Err(_) if t0.elapsed() < Duration::from_secs(10) => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Err(e) => panic!("{addr}: {e}"),
        }
    };
    let second = h2_only_sim_on(listener, exact(5.0, 2.0), 256, std::future::pending());
    for _ in 0..3 {
        let r = post(gw.data_addr, "/v1/chat/completions", &streamed(3), &[]).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body()));
    }
    let truth = second.truth();
    assert_eq!(truth.len(), 3);
    assert!(truth.iter().all(|t| t.version == http::Version::HTTP_2));
    assert_eq!(connections(&truth), 1);
    let log = stop_and_read_log(gw, &dir).await;
    assert!(log.iter().all(|l| l["outcome"] == "ok"), "{log:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_h2_backend_fails_over_and_is_ejected() {
    let good = h2_only_sim(exact(5.0, 2.0), 256).await;
    let dir = temp_dir();
    let yaml = gateway_yaml(
        &dir,
        &format!(
            "  - {{ name: dead, url: \"http://{DEAD}\", http2: true, outlier: {{ consecutive_failures: 2, base_ejection: 60s }} }}\n  - {{ name: good, url: \"http://{}\", http2: true }}\n",
            good.addr
        ),
        "    backends: [dead, good]\n    retry: { attempts: 2 }\n",
    );
    let gw = start_yaml(&yaml).await;
    for _ in 0..6 {
        let r = post(gw.data_addr, "/v1/chat/completions", &streamed(3), &[]).await;
        assert_eq!(r.status, 200);
    }
    let dead = backend_stats(gw.admin_addr, "dead").await;
    assert_eq!(dead["ejected"], true, "{dead}");
    let log = stop_and_read_log(gw, &dir).await;
    assert!(
        log.iter()
            .all(|l| l["outcome"] == "ok" && l["backend"] == "good"),
        "{log:?}"
    );
    let connect_failures = log
        .iter()
        .flat_map(|l| l["retries"].as_array().cloned().unwrap_or_default())
        .filter(|r| r["backend"] == "dead" && r["error"] == "upstream_connect")
        .count();
    assert_eq!(
        connect_failures, 2,
        "two failures eject it; then it is skipped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_speak_http2_to_an_http2_backend() {
    let sim = h2_only_sim(exact(5.0, 2.0), 256).await;
    let dir = temp_dir();
    // The same HTTP/2-only server twice: asked for HTTP/2, and (wrongly) not.
    let probe = "probe: { path: /health, interval: 50ms, timeout: 1s, unhealthy_threshold: 2 }";
    let yaml = gateway_yaml(
        &dir,
        &format!(
            "  - {{ name: h2, url: \"http://{0}\", http2: true, {probe} }}\n  - {{ name: h1, url: \"http://{0}\", {probe} }}\n",
            sim.addr
        ),
        "    backends: [h2, h1]\n",
    );
    let gw = start_yaml(&yaml).await;
    let t0 = std::time::Instant::now();
    loop {
        let (h2, h1) = (
            backend_stats(gw.admin_addr, "h2").await,
            backend_stats(gw.admin_addr, "h1").await,
        );
        if h2["probe_healthy"] == true && h1["probe_healthy"] == false {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{h2}\n{h1}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    gw.shutdown();
}

/// An HTTPS server that offers only HTTP/1.1 by ALPN and answers every request with a complete
/// (non-streamed) chat completion; records the HTTP versions it saw.
async fn https_h1_only(p: &pki::Pki) -> (SocketAddr, Arc<Mutex<Vec<http::Version>>>) {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&p.server_cert)
        .unwrap()
        .map(|c| c.unwrap())
        .collect();
    let key = PrivateKeyDer::from_pem_file(&p.server_key).unwrap();
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let (acceptor, log) = (acceptor.clone(), Arc::clone(&log));
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = hyper::service::service_fn(move |req: http::Request<_>| {
                    log.lock().unwrap().push(req.version());
                    let body = r#"{"id":"c","object":"chat.completion","model":"demo","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}"#;
                    async move {
                        Ok::<_, std::convert::Infallible>(
                            http::Response::builder()
                                .header("content-type", "application/json")
                                .body(Full::new(Bytes::from_static(body.as_bytes())))
                                .unwrap(),
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    (addr, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_alpn_picks_http2_and_http11_stays_when_the_backend_offers_only_that() {
    let dir = temp_dir();
    let p = pki::make(&dir);
    // A backend offering h2 and HTTP/1.1 by ALPN (the simulator over TLS).
    let mut opts = SimOptions::new(exact(5.0, 2.0));
    opts.record_truth = true;
    opts.tls = Some(Arc::new(
        inferscope::tls::ServerTls::load(inferscope::tls::ServerFiles {
            cert: p.server_cert.clone(),
            key: p.server_key.clone(),
            client_ca: None,
            client_cert_required: false,
        })
        .unwrap(),
    ));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let both = sim::spawn(listener, opts, std::future::pending()).unwrap();
    let (h1_only, seen) = https_h1_only(&p).await;
    let tls = format!("tls: {{ roots: none, ca_file: {:?} }}", p.ca);
    let yaml = gateway_yaml(
        &dir,
        &format!(
            "  - {{ name: both, url: \"https://localhost:{}\", http2: true, {tls} }}\n  - {{ name: h1only, url: \"https://localhost:{}\", http2: true, {tls} }}\n  - {{ name: plain, url: \"https://localhost:{}\", {tls} }}\n",
            both.addr.port(),
            h1_only.port(),
            both.addr.port()
        ),
        "    backends: [both, h1only, plain]\n",
    );
    let gw = start_yaml(&yaml).await;
    // Round robin: each backend twice.
    for _ in 0..6 {
        let r = post(
            gw.data_addr,
            "/v1/chat/completions",
            &chat(false, 2, ""),
            &[],
        )
        .await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body()));
    }
    let versions: Vec<http::Version> = both.truth().iter().map(|t| t.version).collect();
    assert_eq!(versions.len(), 4, "both and plain, twice each");
    assert_eq!(
        versions
            .iter()
            .filter(|v| **v == http::Version::HTTP_2)
            .count(),
        2,
        "h2 where asked for, HTTP/1.1 otherwise: {versions:?}"
    );
    assert_eq!(
        *seen.lock().unwrap(),
        vec![http::Version::HTTP_11; 2],
        "the HTTP/1.1-only backend gets HTTP/1.1"
    );
    let log = stop_and_read_log(gw, &dir).await;
    assert!(log.iter().all(|l| l["outcome"] == "ok"), "{log:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_closes_every_new_connection_gets_a_502_at_once() {
    // Reads the connection preface, then closes: every HTTP/2 connection dies at once. (The
    // request is sent before the close is seen, so this takes the "given back, sent once more"
    // path; the guard against dialling again and again when a new connection is already closed
    // when looked at is not reached here.)
    let closer = start_raw(Vec::new(), Duration::ZERO).await;
    let (gw, dir) = h2_gateway(closer).await;
    let t0 = std::time::Instant::now();
    let r = post(gw.data_addr, "/v1/chat/completions", &streamed(3), &[]).await;
    assert_eq!(r.status, 502, "{}", String::from_utf8_lossy(&r.body()));
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), 1);
    assert_eq!(log[0]["outcome"], "backend_error", "{}", log[0]);
}
