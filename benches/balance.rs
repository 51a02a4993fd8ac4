//! Balancers against unequal backends: the same Poisson load, one run per balancer, through a
//! gateway in front of two simulators with the same batch size (8) and TTFT, one three times
//! slower per token. `round_robin` ignores the difference; `latency_aware` follows the TTFT and
//! TPOT this gateway measured; `least_queue` follows what the engines report at `/metrics`
//! (scraped every 100 ms): their queues, then their KV-cache use.
//!
//! Run: `cargo bench --bench balance` (environment: `RATE` requests/s, default 14; `SECS` per
//! balancer, default 20). Client-side numbers, by the gateway's percentile rule.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use inferscope::lab::loadgen::{self, Arrivals, BenchOptions};
use inferscope::sim::{self, Profile, SimOptions};
use std::time::Duration;

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn sim(tpot_ms: f64, seed: u64) -> sim::SimHandle {
    let listener = inferscope::server::bind_loopback().unwrap();
    let mut opts = SimOptions::new(Profile {
        ttft_base_ms: 40.0,
        prefill_per_token_ms: 0.0,
        tpot_ms,
        jitter: 0.1,
        batch_slowdown: 0.0,
        max_batch: Some(8),
        ..Profile::fp16()
    });
    opts.seed = seed;
    sim::spawn(listener, opts, std::future::pending()).unwrap()
}

async fn run(balancer: &str, rate: f64, secs: u64) {
    let (fast, slow) = (sim(8.0, 1).await, sim(24.0, 2).await);
    let dir = std::env::temp_dir().join(format!("inferscope-balance-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let yaml = format!(
        "access_log: {{ path: {:?} }}\nlimits: {{ max_concurrent_requests: 20000 }}\nbackends:\n  \
         - {{ name: fast, url: \"http://{}\", metrics: {{ interval: 100ms }} }}\n  \
         - {{ name: slow, url: \"http://{}\", metrics: {{ interval: 100ms }} }}\n\
         routes:\n  - {{ name: all, backends: [fast, slow], balancer: {balancer} }}\n",
        dir.join("access.jsonl"),
        fast.addr,
        slow.addr
    );
    let cfg = inferscope::config::parse(&yaml, "balance.yaml").unwrap();
    let gw = inferscope::app::start_local(cfg).await.unwrap();
    let o = BenchOptions {
        url: format!("http://{}", gw.data_addr),
        model: "demo".into(),
        endpoint: Default::default(),
        prompts: loadgen::synthetic_prompts(16, 64, 1),
        arrivals: Arrivals::Poisson(rate),
        pacing: Default::default(),
        requests: (rate * secs as f64 * 2.0) as usize + 10,
        duration: Some(Duration::from_secs(secs)),
        stream: true,
        max_tokens: 64,
        ignore_eos: false,
        timeout: None,
        slo: vec![],
        headers: vec![],
        seed: 7,
        progress: false,
        http2_connections: None,
        warmup: 0,
        connector: inferscope::tls::Connector::new(None, Duration::from_secs(5)),
    };
    let (samples, wall) = loadgen::run(&o).await;
    gw.shutdown();
    gw.wait().await;
    let log = std::fs::read_to_string(dir.join("access.jsonl")).unwrap();
    let to_fast = log
        .lines()
        .filter(|l| l.contains("\"backend\":\"fast\""))
        .count();
    let all = log.lines().count().max(1);
    let r = loadgen::summarize(&samples, wall, &[]);
    use inferscope::lab::loadgen::Dist;
    let median = |d: Option<Dist>| d.map_or(f64::NAN, |d| d.median);
    let p99 = |d: Option<Dist>| d.map_or(f64::NAN, |d| d.p99);
    println!(
        "| {balancer} | {} | {} | {:.0}% | {:.1} / {:.1} | {:.2} / {:.2} | {:.0} / {:.0} |",
        r.requests,
        r.failed,
        100.0 * to_fast as f64 / all as f64,
        median(r.ttft_ms),
        p99(r.ttft_ms),
        median(r.tpot_ms),
        p99(r.tpot_ms),
        median(r.e2e_ms),
        p99(r.e2e_ms),
    );
}

fn main() {
    let rate: f64 = env("RATE", 14.0);
    let secs: u64 = env("SECS", 20);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!("Poisson {rate} req/s for {secs} s per balancer; fast: 8 ms/token, slow: 24 ms/token, both batch 8, 64 tokens");
    println!("| balancer | requests | failed | to fast | TTFT ms p50 / p99 | TPOT ms p50 / p99 | E2E ms p50 / p99 |");
    println!("|---|---|---|---|---|---|---|");
    for b in ["round_robin", "latency_aware", "least_queue"] {
        rt.block_on(run(b, rate, secs));
    }
}
