//! Fidelity: how far the gateway's TTFT, TPOT and ITL are from the simulator's ground truth at 1,
//! 64 and 512 concurrent streams. Gateway records and simulator truth are matched by response id.
//!
//! Run: `cargo bench --bench fidelity` (environment: `LEVELS`, default `1,64,512`).
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use inferscope::lab::loadgen::{self, Arrivals, BenchOptions};
use inferscope::sim::{self, ChunkKind, Profile, SimOptions};
use std::collections::HashMap;

fn pcts(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    (q(0.5), q(0.99), v[v.len() - 1])
}

async fn level(streams: usize) {
    // The simulator's burst of connections from the gateway's pool must not overflow a small
    // listen backlog (a dropped SYN costs a second).
    let listener = inferscope::server::bind_loopback().unwrap();
    let profile = Profile {
        ttft_base_ms: 50.0,
        prefill_per_token_ms: 0.0,
        tpot_ms: 20.0,
        jitter: 0.2,
        batch_slowdown: 0.0,
        ..Profile::fp16()
    };
    let mut opts = SimOptions::new(profile);
    opts.record_truth = true;
    let sim = sim::spawn(listener, opts, std::future::pending()).unwrap();
    let dir = std::env::temp_dir().join(format!(
        "inferscope-fidelity-{}-{streams}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let yaml = format!(
        "access_log: {{ path: {:?} }}\nlimits: {{ max_concurrent_requests: 20000 }}\nbackends:\n  - {{ name: s, url: \"http://{}\" }}\nroutes:\n  - {{ name: all, backends: [s] }}\n",
        dir.join("access.jsonl"),
        sim.addr
    );
    let cfg = inferscope::config::parse(&yaml, "fidelity.yaml").unwrap();
    let gw = inferscope::app::start_local(cfg).await.unwrap();
    let requests = (streams * 2).max(40);
    let o = BenchOptions {
        url: format!("http://{}", gw.data_addr),
        model: "demo".into(),
        endpoint: Default::default(),
        prompts: loadgen::synthetic_prompts(16, 16, 1),
        arrivals: Arrivals::Concurrency(streams),
        pacing: Default::default(),
        requests,
        duration: None,
        stream: true,
        max_tokens: 32,
        ignore_eos: false,
        timeout: None,
        slo: vec![],
        headers: vec![],
        seed: 1,
        progress: false,
        http2_connections: None,
        // Warm-up wave (excluded below), sent by the same client: opens the client's connections
        // and the gateway's upstream ones, so the measured requests see a running gateway's
        // steady state.
        warmup: streams,
        connector: inferscope::tls::Connector::new(None, std::time::Duration::from_secs(5)),
    };
    let (samples, _) = loadgen::run(&o).await;
    gw.shutdown();
    gw.wait().await;
    let truth: HashMap<String, sim::Truth> = sim
        .truth()
        .into_iter()
        .map(|t| (format!("chatcmpl-sim-{}", t.index), t))
        .collect();
    let (mut ttft, mut tpot, mut itl_p50) = (Vec::new(), Vec::new(), Vec::new());
    let log = std::fs::read_to_string(dir.join("access.jsonl")).unwrap();
    for line in log.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let Some(t) = v["response_id"].as_str().and_then(|id| truth.get(id)) else {
            continue;
        };
        if t.index < streams as u64 {
            continue; // the warm-up wave
        }
        let content: Vec<_> = t
            .sent
            .iter()
            .filter(|s| matches!(s.kind, ChunkKind::Content { .. }))
            .map(|s| s.at)
            .collect();
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
        ttft.push((v["ttft_ms"].as_f64().unwrap() - ms(content[0] - t.arrival)).abs());
        let truth_tpot = ms(content[content.len() - 1] - content[0]) / (content.len() - 1) as f64;
        tpot.push((v["tpot_ms"].as_f64().unwrap() - truth_tpot).abs());
        let mut gaps: Vec<f64> = content.windows(2).map(|w| ms(w[1] - w[0])).collect();
        gaps.sort_by(f64::total_cmp);
        let truth_p50 = gaps[((gaps.len() - 1) as f64 * 0.5).round() as usize];
        itl_p50.push((v["itl_ms"]["p50"].as_f64().unwrap() - truth_p50).abs());
    }
    let ok = samples
        .iter()
        .filter(|s| s.status == 200 && s.complete)
        .count();
    let (a, b, c) = (pcts(ttft.clone()), pcts(tpot), pcts(itl_p50));
    println!(
        "| {streams} | {requests} | {ok} | {} | {:.3} / {:.3} / {:.3} | {:.3} / {:.3} / {:.3} | {:.3} / {:.3} / {:.3} |",
        ttft.len(), a.0, a.1, a.2, b.0, b.1, b.2, c.0, c.1, c.2
    );
}

fn main() {
    let levels: Vec<usize> = std::env::var("LEVELS")
        .unwrap_or_else(|_| "1,64,512".into())
        .split(',')
        .filter_map(|x| x.trim().parse().ok())
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!("| streams | requests | complete | matched | TTFT abs error ms p50 / p99 / max | TPOT abs error ms p50 / p99 / max | ITL p50 abs error ms p50 / p99 / max |");
    println!("|---|---|---|---|---|---|---|");
    for l in levels {
        rt.block_on(level(l));
    }
}
