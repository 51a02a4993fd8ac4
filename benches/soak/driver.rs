//! Chaos soak driver, shared by `benches/chaos_soak.rs` (long form) and `tests/soak.rs` (short
//! form in CI): several simulators behind one gateway, faults switched on a fixed schedule, closed-
//! loop streaming clients, then an account of every request and of the process's memory and file
//! descriptors before and after.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use inferscope::sim::{self, Faults, Profile, SimHandle, SimOptions};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// What a soak run saw.
#[derive(Debug)]
pub struct Report {
    /// Requests the clients sent.
    pub sent: u64,
    /// Client-side result: HTTP status (and whether the stream reached `[DONE]`).
    pub client: BTreeMap<String, u64>,
    /// Gateway-side outcomes from the access log.
    pub outcomes: BTreeMap<String, u64>,
    /// Access-log lines written.
    pub logged: u64,
    /// Upstream attempts that failed before the first byte and were retried elsewhere.
    pub retried: u64,
    /// Resident memory (KiB) after warm-up and at the end.
    pub rss_kib: (u64, u64),
    /// Open file descriptors after warm-up and at the end of the load (pooled keep-alive
    /// connections included).
    pub fds: (usize, usize),
    /// Open file descriptors before the gateway started and after it shut down: equal when
    /// nothing leaked.
    pub fds_outside: (usize, usize),
    /// Wall time of the load phase.
    pub seconds: f64,
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

async fn sim_with(
    faults: Faults,
    seed: u64,
    stop: tokio::sync::watch::Receiver<bool>,
) -> SimHandle {
    let listener = inferscope::server::bind_loopback().unwrap();
    let profile = Profile {
        ttft_base_ms: 2.0,
        prefill_per_token_ms: 0.0,
        tpot_ms: 1.0,
        jitter: 0.2,
        faults,
        ..Profile::fp16()
    };
    let mut opts = SimOptions::new(profile);
    opts.seed = seed;
    let mut stop = stop;
    sim::spawn(listener, opts, async move {
        let _ = stop.wait_for(|s| *s).await;
    })
    .unwrap()
}

/// The fault schedule of the chaos backend: each phase lasts `phase`.
fn phases() -> Vec<Faults> {
    vec![
        Faults::default(),
        Faults {
            die_after_chunks: Some(4),
            ..Faults::default()
        },
        Faults {
            stall_after_chunks: Some(3),
            ..Faults::default()
        },
        Faults {
            refuse: true,
            ..Faults::default()
        },
        Faults {
            slow_first_token_ms: 400.0,
            ..Faults::default()
        },
    ]
}

async fn one_request(
    send: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    body: &'static str,
) -> String {
    let req = http::Request::post("/v1/chat/completions")
        .header("host", "soak")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap();
    if send.ready().await.is_err() {
        return "connection_lost".into();
    }
    match send.send_request(req).await {
        Err(_) => "connection_lost".into(),
        Ok(resp) => {
            let status = resp.status().as_u16();
            match resp.into_body().collect().await.map(|c| c.to_bytes()) {
                Ok(b) if b.ends_with(b"data: [DONE]\n\n") => format!("{status} complete"),
                Ok(_) => format!("{status} incomplete"),
                Err(_) => format!("{status} broken"),
            }
        }
    }
}

/// Runs the soak for `seconds` with `concurrency` clients.
pub async fn run(seconds: f64, concurrency: usize) -> Report {
    let dir = std::env::temp_dir().join(format!("inferscope-soak-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let fds_before = fds();
    let (stop_sims, sims_rx) = tokio::sync::watch::channel(false);
    let clean = sim_with(Faults::default(), 1, sims_rx.clone()).await;
    let erroring = sim_with(
        Faults {
            error_rate: 0.2,
            error_status: Some(503),
            ..Faults::default()
        },
        2,
        sims_rx.clone(),
    )
    .await;
    let malformed = sim_with(
        Faults {
            malformed_rate: 0.05,
            ..Faults::default()
        },
        3,
        sims_rx.clone(),
    )
    .await;
    let chaos = sim_with(Faults::default(), 4, sims_rx.clone()).await;
    let yaml = format!(
        "access_log: {{ path: {:?} }}\nbackends:\n  - {{ name: clean, url: \"http://{}\" }}\n  - {{ name: erroring, url: \"http://{}\" }}\n  - {{ name: malformed, url: \"http://{}\" }}\n  - {{ name: chaos, url: \"http://{}\", outlier: {{ consecutive_failures: 3, base_ejection: 500ms, max_ejection: 2s }} }}\nroutes:\n  - name: all\n    backends: [clean, erroring, malformed, chaos]\n    balancer: least_outstanding\n    retry: {{ attempts: 2 }}\n    timeouts: {{ first_token: 300ms, idle: 200ms, total: 5s }}\n",
        dir.join("access.jsonl"),
        clean.addr,
        erroring.addr,
        malformed.addr,
        chaos.addr
    );
    let cfg = inferscope::config::parse(&yaml, "soak.yaml").unwrap();
    let gw = inferscope::app::start_local(cfg).await.unwrap();
    let addr = gw.data_addr;
    let body = r#"{"model":"demo","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"soak"}]}"#;

    // Warm up at full concurrency (so connection pools reach their working size), then take the
    // baseline.
    let warm: Vec<_> = (0..concurrency)
        .map(|_| {
            tokio::spawn(async move {
                let s = TcpStream::connect(addr).await.unwrap();
                let (mut send, conn) =
                    hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(s))
                        .await
                        .unwrap();
                tokio::spawn(conn);
                for _ in 0..4 {
                    one_request(&mut send, body).await;
                }
            })
        })
        .collect();
    for w in warm {
        let _ = w.await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (rss0, fds0) = (rss_kib(), fds());

    let start = Instant::now();
    let end = start + Duration::from_secs_f64(seconds);
    let chaos_task = {
        let chaos = chaos.clone();
        tokio::spawn(async move {
            let phase = Duration::from_millis(700);
            for f in phases().into_iter().cycle() {
                chaos.set_faults(f);
                if Instant::now() + phase > end {
                    break;
                }
                tokio::time::sleep(phase).await;
            }
            chaos.set_faults(Faults::default());
        })
    };
    let sent = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let sent = Arc::clone(&sent);
        tasks.push(tokio::spawn(async move {
            let mut seen: BTreeMap<String, u64> = BTreeMap::new();
            let mut conn: Option<hyper::client::conn::http1::SendRequest<Full<Bytes>>> = None;
            while Instant::now() < end {
                if conn.as_ref().is_none_or(|c| c.is_closed()) {
                    let s = TcpStream::connect(addr).await.unwrap();
                    s.set_nodelay(true).unwrap();
                    let (send, c) =
                        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(s))
                            .await
                            .unwrap();
                    tokio::spawn(c);
                    conn = Some(send);
                }
                let Some(send) = conn.as_mut() else { continue };
                sent.fetch_add(1, Ordering::Relaxed);
                let r = one_request(send, body).await;
                if r != "200 complete" {
                    conn = None; // a broken stream leaves the connection unusable
                }
                *seen.entry(r).or_default() += 1;
            }
            seen
        }));
    }
    let mut client = BTreeMap::new();
    for t in tasks {
        for (k, v) in t.await.unwrap() {
            *client.entry(k).or_default() += v;
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let _ = chaos_task.await;
    tokio::time::sleep(Duration::from_millis(500)).await; // let closed connections be reaped
    let (rss1, fds1) = (rss_kib(), fds());
    gw.shutdown();
    gw.wait().await;
    let _ = stop_sims.send(true);
    drop((clean, erroring, malformed, chaos));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let fds_after = fds();
    let log = std::fs::read_to_string(dir.join("access.jsonl")).unwrap_or_default();
    let mut outcomes = BTreeMap::new();
    let mut logged = 0;
    let mut retried = 0;
    for l in log.lines() {
        logged += 1;
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        retried += v["retries"].as_array().map_or(0, |r| r.len() as u64);
        *outcomes
            .entry(v["outcome"].as_str().unwrap_or("?").to_string())
            .or_default() += 1;
    }
    Report {
        sent: sent.load(Ordering::Relaxed) + 4 * concurrency as u64,
        retried,
        client,
        outcomes,
        logged,
        rss_kib: (rss0, rss1),
        fds: (fds0, fds1),
        fds_outside: (fds_before, fds_after),
        seconds,
    }
}

impl Report {
    /// Prints the report as Markdown.
    pub fn print(&self) {
        println!(
            "load: {:.1} s, {} requests sent (warm-up included), {} access-log lines, {} failed attempts retried elsewhere",
            self.seconds, self.sent, self.logged, self.retried
        );
        println!("\n| client saw | requests |\n|---|---|");
        for (k, v) in &self.client {
            println!("| {k} | {v} |");
        }
        println!("\n| gateway outcome | requests |\n|---|---|");
        for (k, v) in &self.outcomes {
            println!("| {k} | {v} |");
        }
        println!(
            "\nRSS: {} KiB after warm-up, {} KiB at the end; open fds: {} → {} during the load, {} before start → {} after shutdown",
            self.rss_kib.0, self.rss_kib.1, self.fds.0, self.fds.1, self.fds_outside.0, self.fds_outside.1
        );
    }
}
