//! Telemetry on vs off, side by side in one process and one run: requests/s and client-side
//! latency of streaming requests through two gateways that differ only in telemetry (spans and
//! metrics exported over OTLP/HTTP to a loopback sink that accepts and discards).
//!
//! Run: `cargo bench --bench telemetry_overhead` (environment: `REQUESTS`, `CONCURRENCY`, `ROUNDS`).
//! Everything (simulator, gateways, sink, clients) shares this machine's cores, so read the ratio.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use inferscope::app::Running;
use inferscope::sim::{self, Profile, SimOptions};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// An OTLP/HTTP sink: reads each export fully and answers 200 with an empty protobuf body.
async fn sink() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let svc = hyper::service::service_fn(|req: http::Request<hyper::body::Incoming>| async move {
        let _ = req.into_body().collect().await;
        let mut r = http::Response::new(Full::new(Bytes::new()));
        r.headers_mut().insert(
            "content-type",
            http::HeaderValue::from_static("application/x-protobuf"),
        );
        Ok::<_, std::convert::Infallible>(r)
    });
    tokio::spawn(inferscope::server::run(
        listener,
        svc,
        Default::default(),
        std::future::pending(),
    ));
    addr
}

async fn gateway(sim: SocketAddr, telemetry: Option<SocketAddr>) -> Running {
    let mut yaml = format!("backends:\n  - {{ name: sim, url: \"http://{sim}\" }}\nroutes:\n  - {{ name: all, backends: [sim] }}\n");
    if let Some(t) = telemetry {
        yaml.push_str(&format!("telemetry:\n  otlp: {{ endpoint: \"http://{t}\", protocol: http/protobuf }}\n  batch: {{ interval: 200ms }}\n  metrics_interval: 1s\n"));
    }
    let cfg = inferscope::config::parse(&yaml, "bench.yaml").unwrap();
    inferscope::app::start_local(cfg).await.unwrap()
}

/// Closed-loop load: `concurrency` connections, `requests` in all. Returns (req/s, sorted latencies).
async fn load(addr: SocketAddr, requests: usize, concurrency: usize) -> (f64, Vec<Duration>) {
    let body = r#"{"model":"demo","stream":true,"max_tokens":16,"messages":[{"role":"user","content":"hello"}]}"#;
    let per = requests / concurrency;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        tasks.push(tokio::spawn(async move {
            let stream = TcpStream::connect(addr).await.unwrap();
            stream.set_nodelay(true).unwrap();
            let (mut send, conn) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                    .await
                    .unwrap();
            tokio::spawn(conn);
            let mut lat = Vec::with_capacity(per);
            for _ in 0..per {
                let req = http::Request::post("/v1/chat/completions")
                    .header("host", "bench")
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from_static(body.as_bytes())))
                    .unwrap();
                send.ready().await.unwrap();
                let t = Instant::now();
                let resp = send.send_request(req).await.unwrap();
                let bytes = resp.into_body().collect().await.unwrap().to_bytes();
                assert!(bytes.ends_with(b"data: [DONE]\n\n"));
                lat.push(t.elapsed());
            }
            lat
        }));
    }
    let mut all = Vec::with_capacity(requests);
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let secs = start.elapsed().as_secs_f64();
    all.sort();
    (all.len() as f64 / secs, all)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let requests = env("REQUESTS", 4000);
    let concurrency = env("CONCURRENCY", 32);
    let rounds = env("ROUNDS", 5);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let listener = inferscope::server::bind_loopback().unwrap();
        let profile = Profile { ttft_base_ms: 0.0, prefill_per_token_ms: 0.0, tpot_ms: 0.0, jitter: 0.0, ..Profile::fp16() };
        let sim = sim::spawn(listener, SimOptions::new(profile), std::future::pending()).unwrap();
        let sink = sink().await;
        let off = gateway(sim.addr, None).await;
        let on = gateway(sim.addr, Some(sink)).await;
        // Warm both up (connections, histograms, exporters).
        load(off.data_addr, 256, concurrency).await;
        load(on.data_addr, 256, concurrency).await;
        let mut results: [(Vec<f64>, Vec<f64>, Vec<f64>); 2] = Default::default();
        for round in 0..rounds {
            // Alternate the order so drift in machine load hits both equally.
            let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for i in order {
                let addr = if i == 0 { off.data_addr } else { on.data_addr };
                let (rps, lat) = load(addr, requests, concurrency).await;
                let p = |q: f64| lat[((lat.len() - 1) as f64 * q) as usize].as_secs_f64() * 1000.0;
                results[i].0.push(rps);
                results[i].1.push(p(0.5));
                results[i].2.push(p(0.99));
            }
        }
        let spans = on.recorder.telemetry.as_ref().map_or(0, |t| t.counters.spans_exported.load(std::sync::atomic::Ordering::Relaxed));
        println!("streaming requests of 16 tokens, {requests} per round, concurrency {concurrency}, {rounds} rounds (medians)");
        println!("{:<14} {:>10} {:>12} {:>12}", "telemetry", "req/s", "p50 ms", "p99 ms");
        for (i, name) in ["off", "on (OTLP/HTTP)"].iter().enumerate() {
            let r = &results[i];
            println!("{:<14} {:>10.0} {:>12.3} {:>12.3}", name, median(r.0.clone()), median(r.1.clone()), median(r.2.clone()));
        }
        let ratio = median(results[1].0.clone()) / median(results[0].0.clone());
        println!("throughput with telemetry on / off: {ratio:.3}  (spans exported: {spans})");
    });
}
