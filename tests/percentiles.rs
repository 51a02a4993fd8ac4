//! One percentile rule everywhere: the same samples give the same p50/p99 in the access log's ITL
//! summary, the span attributes, `/stats` (cumulative exactly; the 60-s window within its 1%),
//! `/experiments` and `inferscope report`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::otlp::*;
use common::*;
use inferscope::sim::Profile;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use serde_json::Value;
use std::collections::BTreeMap;

/// Everything each path reported after `users` requests (one per user id).
struct Seen {
    log: Vec<Value>,
    stats: Value,
    experiments: Value,
    report: Value,
    /// Per request id: the CLIENT span's attributes.
    spans: BTreeMap<String, Vec<opentelemetry_proto::tonic::common::v1::KeyValue>>,
}

async fn run(users: usize) -> Seen {
    // Jittered timing, so every gap differs and the ranks matter.
    let jittery = |tpot_ms: f64| Profile {
        jitter: 0.4,
        ..exact(8.0, tpot_ms)
    };
    let fp16 = start_sim(jittery(3.0), 11).await;
    let int8 = start_sim(jittery(2.0), 12).await;
    let (otlp, collected) = start_grpc().await;
    let dir = temp_dir();
    let yaml = format!(
        "access_log: {{ path: {:?} }}\nbackends:\n  - {{ name: fp16, url: \"http://{}\" }}\n  - {{ name: int8, url: \"http://{}\" }}\nroutes:\n  - name: chat\n    experiment:\n      name: x\n      sticky_key: \"header:x-user-id\"\n      min_samples: 1\n      variants:\n        - {{ name: fp16, backends: [fp16], weight: 50, control: true }}\n        - {{ name: int8, backends: [int8], weight: 50 }}\ntelemetry:\n  otlp: {{ endpoint: \"http://{otlp}\", protocol: grpc, timeout: 5s }}\n  batch: {{ interval: 50ms }}\n  metrics_interval: 60s\n",
        dir.join("access.jsonl"),
        fp16.addr,
        int8.addr
    );
    let gw = start_yaml(&yaml).await;
    for i in 0..users {
        let user = format!("user-{i}");
        let r = post(
            gw.data_addr,
            "/v1/chat/completions",
            &chat(true, 24, ""),
            &[("x-user-id", &user)],
        )
        .await;
        assert_eq!(r.status, 200);
    }
    let (_, stats) = admin_get(gw.admin_addr, "/stats").await;
    let (_, experiments) = admin_get(gw.admin_addr, "/experiments").await;
    let log = stop_and_read_log(gw, &dir).await;
    assert_eq!(log.len(), users);
    let out = run_cli(
        &[
            "report",
            "--json",
            "--control",
            "fp16",
            "--min-samples",
            "1",
        ],
        &dir.join("access.jsonl"),
    );
    let mut spans = BTreeMap::new();
    for (_, s) in collected.spans() {
        if s.kind == SpanKind::Client as i32 {
            let id = attr_str(&s.attributes, "inferscope.request_id").unwrap();
            spans.insert(id, s.attributes);
        }
    }
    Seen {
        log,
        stats: serde_json::from_str(&stats).unwrap(),
        experiments: serde_json::from_str(&experiments).unwrap(),
        report: serde_json::from_slice(&out.stdout).unwrap(),
        spans,
    }
}

/// The `/stats` group of `variant` (one backend per variant here).
fn stats_group<'a>(stats: &'a Value, variant: &str) -> &'a Value {
    stats["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["variant"] == variant)
        .unwrap_or_else(|| panic!("no /stats group for {variant}: {stats}"))
}

fn by_variant<'a>(list: &'a Value, key: &str, variant: &str) -> &'a Value {
    list.as_array()
        .unwrap()
        .iter()
        .find(|g| g[key] == variant)
        .unwrap_or_else(|| panic!("no {variant} in {list}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_gives_one_itl_p50_and_p99_on_every_path() {
    let seen = run(1).await;
    let line = &seen.log[0];
    let variant = line["variant"].as_str().unwrap();
    let logged = &line["itl_ms"];
    assert_eq!(logged["count"], 23, "24 tokens, 23 gaps: {line}");
    // The log's summary is the rule applied to its own gaps (nearest rank, not interpolation).
    let mut gaps: Vec<u64> = line["itl_us"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g.as_u64().unwrap())
        .collect();
    assert_eq!(gaps.len(), 23);
    gaps.sort_unstable();
    let rule = |q: f64| inferscope::util::quantile::of_sorted_us(&gaps, q).unwrap() as f64 / 1e3;
    assert_eq!(logged["p50"].as_f64(), Some(rule(0.5)), "{line}");
    assert_eq!(logged["p99"].as_f64(), Some(rule(0.99)), "{line}");
    // Nearest rank of 23 samples: p50 is the 12th, p99 the 23rd (the largest).
    assert_eq!(logged["p99"], logged["max"]);

    let span = &seen.spans[line["request_id"].as_str().unwrap()];
    let stats = &stats_group(&seen.stats, variant)["cumulative"]["itl"];
    let window = &stats_group(&seen.stats, variant)["window"]["itl"];
    let experiments = by_variant(
        &seen.experiments["experiments"][0]["variants"],
        "variant",
        variant,
    );
    let report = by_variant(&seen.report["groups"], "variant", variant);
    for (q, key, span_key) in [
        (0.5, "p50", "inferscope.itl.p50"),
        (0.99, "p99", "inferscope.itl.p99"),
    ] {
        let want = rule(q);
        let span_ms = attr_f64(span, span_key).unwrap() * 1e3;
        assert!(
            (span_ms - want).abs() < 1e-9,
            "span {key} {span_ms} vs {want}"
        );
        assert_eq!(stats[key].as_f64(), Some(want), "/stats {key}: {stats}");
        assert_eq!(
            experiments["itl"][key].as_f64(),
            Some(want),
            "/experiments {key}"
        );
        assert_eq!(
            report["itl"][key].as_f64(),
            Some(want),
            "report {key}: {report}"
        );
        let w = window[key].as_f64().unwrap();
        assert!(
            (w - want).abs() <= want * 0.01,
            "window {key} {w} vs {want}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_requests_give_the_same_percentiles_in_stats_experiments_and_report() {
    let seen = run(40).await;
    let mut checked = 0;
    for variant in ["fp16", "int8"] {
        let group = stats_group(&seen.stats, variant);
        let experiments = by_variant(
            &seen.experiments["experiments"][0]["variants"],
            "variant",
            variant,
        );
        let report = by_variant(&seen.report["groups"], "variant", variant);
        assert_eq!(report["requests"], group["cumulative"]["requests"]);
        for metric in ["ttft", "ttfc", "tpot", "itl", "e2e"] {
            let (cum, win) = (&group["cumulative"][metric], &group["window"][metric]);
            assert_eq!(
                experiments[metric]["n"], cum["count"],
                "{variant} {metric}: every sample is in the reservoir"
            );
            for key in ["p50", "p99"] {
                let want = cum[key].as_f64().unwrap();
                assert_eq!(
                    experiments[metric][key].as_f64(),
                    Some(want),
                    "{variant} {metric} {key}: /experiments vs /stats"
                );
                assert_eq!(
                    report[metric][key].as_f64(),
                    Some(want),
                    "{variant} {metric} {key}: report vs /stats"
                );
                let w = win[key].as_f64().unwrap();
                assert!(
                    (w - want).abs() <= want * 0.01,
                    "{variant} {metric} {key}: window {w} vs {want}"
                );
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 20);
}
