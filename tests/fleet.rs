//! A fleet: two gateway processes sharing one stream of traffic. Their percentiles merge exactly
//! (`/stats?format=hdr`, `inferscope report --merge`), a real Prometheus computes the fleet's
//! p50/p99 from native histograms within a bucket's width of that truth (and from classic buckets
//! within the classic bucket), and the fleet's experiment verdict from the merged access logs is
//! the verdict of one log holding the same requests.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::prom::{query, scalar};
use common::*;
use inferscope::sim::Profile;
use serde_json::Value;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

struct Fleet {
    gateways: Vec<(Child, SocketAddr, SocketAddr)>,
    logs: Vec<PathBuf>,
    dir: PathBuf,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for (c, _, _) in &mut self.gateways {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Two gateway processes in front of the same two simulators (an experiment: fp16 control,
/// int8 with a 30% faster decode), with wide TTFT jitter so the tail is spread over buckets.
async fn fleet(fp16: SocketAddr, int8: SocketAddr) -> Fleet {
    let dir = temp_dir();
    let mut gateways = Vec::new();
    let mut logs = Vec::new();
    for i in 0..2 {
        let log = dir.join(format!("access-{i}.jsonl"));
        let cfg = dir.join(format!("gw-{i}.yaml"));
        std::fs::write(
            &cfg,
            format!(
                "access_log: {{ path: {log:?} }}\nbackends:\n  - {{ name: fp16, url: \"http://{fp16}\" }}\n  - {{ name: int8, url: \"http://{int8}\" }}\nroutes:\n  - name: chat\n    slo: {{ ttft: 60ms }}\n    experiment:\n      name: int8-vs-fp16\n      sticky_key: \"header:x-user-id\"\n      min_samples: 50\n      variants:\n        - {{ name: fp16, backends: [fp16], weight: 50, control: true }}\n        - {{ name: int8, backends: [int8], weight: 50 }}\n"
            ),
        )
        .unwrap();
        gateways.push(serve(&cfg));
        logs.push(log);
    }
    Fleet {
        gateways,
        logs,
        dir,
    }
}

/// `n` streamed requests, 8 at a time, alternating between the gateways.
async fn load(f: &Fleet, n: usize) {
    let addrs: Vec<SocketAddr> = f.gateways.iter().map(|g| g.1).collect();
    let mut tasks = Vec::new();
    for c in 0..8 {
        let addrs = addrs.clone();
        tasks.push(tokio::spawn(async move {
            let mut i = c;
            while i < n {
                let r = post(
                    addrs[i % 2],
                    "/v1/chat/completions",
                    &chat(true, 6, ""),
                    &[("x-user-id", &format!("user-{i}"))],
                )
                .await;
                assert_eq!(r.status, 200);
                i += 8;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

fn sims() -> (Profile, Profile) {
    let p = |tpot| Profile {
        jitter: 0.9,
        ..exact(40.0, tpot)
    };
    (p(4.0), p(2.8))
}

/// The fleet's exact TTFT quantiles: both exports merged (`report --merge URL URL --json`).
fn merged_truth(f: &Fleet) -> Value {
    let admins: Vec<String> = f
        .gateways
        .iter()
        .map(|g| format!("http://{}", g.2))
        .collect();
    let mut args = vec!["report", "--by", "all", "--json", "--merge"];
    args.extend(admins.iter().map(String::as_str));
    let out = inferscope(&args);
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    doc["groups"][0].clone()
}

/// Requests in the merge tests.
const N: usize = 400;

/// Two replicas that served `N` requests, and their merged export (checked against the union of
/// both access logs).
async fn merged_fleet() -> (Fleet, Value) {
    let (p16, p8) = sims();
    let (fp16, int8) = (start_sim(p16, 1).await, start_sim(p8, 2).await);
    let f = fleet(fp16.addr, int8.addr).await;
    load(&f, N).await;

    // The merged export is every request: its quantiles are those of the union of both logs.
    let truth = merged_truth(&f);
    assert_eq!(truth["requests"], N as u64, "{truth}");
    let mut ttfts: Vec<u64> = Vec::new();
    for log in &f.logs {
        let text = wait_for_lines(log, N / 2).await;
        ttfts.extend(text.iter().filter_map(|l| {
            l["ttft_ms"]
                .as_f64()
                .map(inferscope::util::quantile::ms_to_us)
        }));
    }
    assert_eq!(ttfts.len(), N);
    ttfts.sort_unstable();
    for (q, key) in [(0.5, "p50"), (0.99, "p99")] {
        let exact = inferscope::util::quantile::of_sorted_us(&ttfts, q).unwrap() as f64 / 1000.0;
        let merged = truth["ttft"][key].as_f64().unwrap();
        assert!(
            (merged - exact).abs() <= exact * 0.001 + 0.001,
            "merged {key} {merged} vs the logs' {exact}"
        );
    }

    (f, truth)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_merge_exactly() {
    let (fleet, truth) = merged_fleet().await;
    assert_eq!(truth["requests"], N as u64, "{truth}");

    // The merge carries the quality results posted to the replicas: one posted to both (as
    // `eval --report-to A,B` does) is one entry held by both; one posted to a single replica is
    // said to be held by one of two.
    let result = |suite: &str| {
        format!(
            r#"{{"kind":"accuracy","suite":"{suite}","route":"chat","control":"fp16",
            "variants":[{{"variant":"fp16","value":0.6,"n":100}},{{"variant":"int8","value":0.55,"n":100}}],
            "comparisons":[{{"variant":"int8","difference":-0.05,"ci95":[-0.09,-0.01]}}]}}"#
        )
    };
    for (i, g) in fleet.gateways.iter().enumerate() {
        let mut suites = vec!["mmlu"];
        if i == 0 {
            suites.push("quiz");
        }
        for suite in suites {
            let r = Client::connect(g.2)
                .await
                .send("POST", "/experiments/quality", &result(suite), &[])
                .await;
            assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body()));
        }
    }
    let admins: Vec<String> = fleet
        .gateways
        .iter()
        .map(|g| format!("http://{}", g.2))
        .collect();
    let mut args = vec!["report", "--json", "--merge"];
    args.extend(admins.iter().map(String::as_str));
    let doc: Value = serde_json::from_slice(&inferscope(&args).stdout).unwrap();
    let held: Vec<(String, usize)> = doc["quality"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| {
            (
                q["result"]["suite"].as_str().unwrap().to_owned(),
                q["replicas"].as_array().unwrap().len(),
            )
        })
        .collect();
    assert_eq!(
        held,
        [("mmlu".to_owned(), 2), ("quiz".to_owned(), 1)],
        "{doc}"
    );
    args.remove(1);
    let text = String::from_utf8(inferscope(&args).stdout).unwrap();
    assert!(
        text.contains("| int8-vs-fp16 | mmlu | accuracy | int8 | 55.0% | - | 100 | -5.0 pts | [-9.0, -1.0] | 2 of 2 |")
            && text.contains("| 1 of 2 |")
            && text.contains("posted to some of them only"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs prometheus"]
async fn prometheus_computes_the_fleets_percentiles_within_a_bucket() {
    let bin = prom::binary();
    let (f, truth) = merged_fleet().await;
    let targets: Vec<SocketAddr> = f.gateways.iter().map(|g| g.2).collect();
    let config = prom::scrape_config(&targets);
    let native = prom::start(&bin, &f.dir, "native", &config, true);
    let classic = prom::start(&bin, &f.dir, "classic", &config, false);
    prom::scraped(&native, 2, N).await;
    prom::scraped(&classic, 2, N).await;

    let width = 2f64.powf(1.0 / f64::from(1u32 << inferscope::stats::NATIVE_SCHEMA)) - 1.0;
    let mut lines = Vec::new();
    for (q, key) in [(0.5, "p50"), (0.99, "p99")] {
        let exact = truth["ttft"][key].as_f64().unwrap() / 1000.0;
        // Native: the histograms of both replicas summed, then the quantile.
        let nat = scalar(
            &query(
                &native,
                &format!("histogram_quantile({q}, sum(inferscope_time_to_first_token_seconds))"),
            )
            .await,
        )
        .unwrap();
        let err = (nat - exact).abs() / exact;
        assert!(
            err <= width + 0.001,
            "native {key} {nat} vs exact {exact}: {:.2}% off, a bucket is {:.2}%",
            err * 100.0,
            width * 100.0
        );
        // Classic: within the GenAI bucket holding the exact value, and no better.
        let cl = scalar(
            &query(
                &classic,
                &format!(
                    "histogram_quantile({q}, sum by (le) (inferscope_time_to_first_token_seconds_bucket))"
                ),
            )
            .await,
        )
        .unwrap();
        let bounds = inferscope::stats::TTFT_BOUNDS;
        let hi = bounds.iter().copied().find(|b| *b >= exact).unwrap();
        let lo = bounds
            .iter()
            .copied()
            .rev()
            .find(|b| *b < exact)
            .unwrap_or(0.0);
        assert!(
            lo <= cl && cl <= hi,
            "classic {key} {cl} outside ({lo}, {hi}] holding {exact}"
        );
        lines.push(format!(
            "TTFT {key}: exact {:.2} ms, native {:.2} ms ({:+.2}%), classic {:.2} ms ({:+.2}%)",
            exact * 1e3,
            nat * 1e3,
            (nat / exact - 1.0) * 100.0,
            cl * 1e3,
            (cl / exact - 1.0) * 100.0
        ));
    }
    println!("{}", lines.join("\n"));
    // With native histograms on, this Prometheus keeps the native histogram only.
    assert!(
        query(&native, "inferscope_time_to_first_token_seconds_bucket")
            .await
            .is_empty()
    );
    assert!(
        !query(&classic, "inferscope_time_to_first_token_seconds_bucket")
            .await
            .is_empty()
    );
    // Goodput across the fleet is a ratio of sums.
    let good = scalar(
        &query(
            &native,
            "sum(inferscope_slo_met_requests_total) / sum(inferscope_slo_evaluated_requests_total)",
        )
        .await,
    )
    .unwrap();
    let share = truth["goodput"]["share"].as_f64().unwrap();
    assert!((good - share).abs() < 1e-3, "{good} vs {share}");
}

/// Reads an access log once it has `n` lines (or what it has after 10 s).
async fn wait_for_lines(path: &Path, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        if lines.len() >= n || Instant::now() > deadline {
            return lines;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_verdict_from_merged_logs_is_one_logs_verdict() {
    let (p16, p8) = sims();
    let (fp16, int8) = (start_sim(p16, 1).await, start_sim(p8, 2).await);
    let f = fleet(fp16.addr, int8.addr).await;
    load(&f, 240).await;
    let mut all: Vec<Value> = Vec::new();
    let mut per: Vec<usize> = Vec::new();
    for log in &f.logs {
        let lines = wait_for_lines(log, 120).await;
        per.push(lines.len());
        all.extend(lines);
    }
    assert_eq!(per, vec![120, 120]);
    // One process's log of the same requests: the lines in time order.
    all.sort_by(|a, b| a["ts"].as_str().cmp(&b["ts"].as_str()));
    let one = f.dir.join("one.jsonl");
    let text: String = all.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&one, text).unwrap();
    let report = |args: &[&str]| -> Value {
        let mut all = vec![
            "report",
            "--control",
            "fp16",
            "--min-samples",
            "50",
            "--json",
        ];
        all.extend(args);
        serde_json::from_slice(&inferscope(&all).stdout).unwrap()
    };
    let logs: Vec<&str> = f.logs.iter().map(|p| p.to_str().unwrap()).collect();
    let mut merge_args = vec!["--merge"];
    merge_args.extend(&logs);
    let fleet = report(&merge_args);
    let single = report(&[one.to_str().unwrap()]);
    assert_eq!(fleet["comparisons"], single["comparisons"]);
    assert_eq!(fleet["groups"], single["groups"]);
    let tpot = comparison(&fleet, "int8", "tpot");
    assert!(tpot["significant"].as_bool().unwrap(), "{tpot}");
    // Histograms and logs do not mix.
    let out = Command::new(env!("CARGO_BIN_EXE_inferscope"))
        .args([
            "report",
            "--merge",
            logs[0],
            &format!("http://{}", f.gateways[0].2),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not both"));
}
