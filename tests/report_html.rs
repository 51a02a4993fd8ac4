//! `inferscope report --html`: the page made from real bench runs (two simulators of different
//! speed, a sweep with SLOs) and a gateway's access log — every chart drawn with its series,
//! every number the tables show equal to the JSON it came from, nothing fetched — and, in the
//! second lane, the same page in headless Chromium.

use crate::common::*;
use crate::dashboard::{browse, chromium, tagged, unescape};
use inferscope::lab::loadgen::{BenchReport, SweepReport};
use std::path::{Path, PathBuf};

/// The runs and the page: (page, fp16 run, int8 run, sweep).
async fn made(dir: &Path) -> (PathBuf, BenchReport, BenchReport, SweepReport) {
    let fast = start_sim(exact(3.0, 1.0), 1).await;
    let slow = start_sim(exact(6.0, 2.0), 2).await;
    let gw = start_gateway(&[("sim", fast.addr)], dir, "").await;
    let (fp16, int8, sweep, page) = (
        dir.join("fp16.json"),
        dir.join("int8.json"),
        dir.join("sweep.json"),
        dir.join("page.html"),
    );
    let urls = (
        format!("http://{}", slow.addr),
        format!("http://{}", fast.addr),
        format!("http://{}", gw.data_addr),
    );
    let paths = (fp16.clone(), int8.clone(), sweep.clone());
    tokio::task::spawn_blocking(move || {
        let s = |p: &Path| p.to_str().unwrap().to_owned();
        let base = [
            "bench",
            "--requests",
            "20",
            "--concurrency",
            "2",
            "--max-tokens",
            "6",
        ];
        inferscope(
            &[
                &base[..],
                &[
                    "--url",
                    &urls.0,
                    "--per-request",
                    "--label",
                    "quant=fp16",
                    "--out",
                    &s(&paths.0),
                ],
            ]
            .concat(),
        );
        inferscope(&[&base[..], &["--url", &urls.1, "--out", &s(&paths.1)]].concat());
        inferscope(&[
            "bench",
            "--url",
            &urls.2,
            "--sweep",
            "20,40",
            "--requests",
            "10",
            "--max-tokens",
            "4",
            "--slo",
            "ttft=2s,tpot=1s",
            "--purpose",
            "live",
            "--out",
            &s(&paths.2),
        ]);
    })
    .await
    .unwrap();
    let log = dir.join("access.jsonl");
    stop_and_read_log(gw, dir).await;
    let args: Vec<String> = vec![
        "report".into(),
        "--html".into(),
        page.display().to_string(),
        "--title".into(),
        "fp16 & int8".into(),
        "--bench".into(),
        format!("fp16={}", fp16.display()),
        "--bench".into(),
        format!("int8={}", int8.display()),
        "--bench".into(),
        sweep.display().to_string(),
        log.display().to_string(),
    ];
    tokio::task::spawn_blocking(move || {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        inferscope(&a);
    })
    .await
    .unwrap();
    let read = |p: &Path| std::fs::read(p).unwrap();
    (
        page,
        serde_json::from_slice(&read(&fp16)).unwrap(),
        serde_json::from_slice(&read(&int8)).unwrap(),
        serde_json::from_slice(&read(&sweep)).unwrap(),
    )
}

/// Checks the page's text (a file, or the DOM a browser made of it).
fn check(page: &str, fp16: &BenchReport, int8: &BenchReport, sweep: &SweepReport) {
    // Four CDFs, three per-load latency charts and the throughput one.
    let charts = tagged(page, "data-chart");
    let ids: Vec<&str> = charts.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        ids,
        [
            "cdf-ttft",
            "cdf-tpot",
            "cdf-itl",
            "cdf-e2e",
            "load-ttft",
            "load-tpot",
            "load-e2e",
            "load-throughput"
        ]
    );
    // Each CDF has a curve per run and the log's group; fp16's from its every request.
    let series = tagged(page, "data-series");
    for name in ["fp16", "int8 (p50/p90/p99 only)", "variant -"] {
        assert_eq!(
            series.iter().filter(|(k, _)| k == name).count(),
            4,
            "{name}: {series:?}"
        );
    }
    let points: Vec<usize> = page
        .split("data-series=\"fp16\" data-points=\"")
        .skip(1)
        .map(|s| s.split('"').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(points[0], 20, "one point per request's TTFT");
    // The SLO lines and the knee.
    let refs = tagged(page, "data-ref");
    assert!(
        refs.iter().any(|(k, _)| k == "SLO ttft ≤ 2000 ms"),
        "{refs:?}"
    );
    let cap = sweep.capacity.as_ref().unwrap();
    assert_eq!(cap.rate, Some(40.0), "loose SLOs: every rate met them");
    assert!(refs.iter().any(|(k, _)| k == "capacity 40.00 req/s"));
    // Every number shown is the JSON's.
    let json = |r: &BenchReport, key: &str| -> Option<f64> {
        let d = |d: Option<inferscope::lab::loadgen::Dist>, stat: &str| {
            d.map(|d| match stat {
                "mean" => d.mean,
                "median" => d.median,
                "p90" => d.p90,
                _ => d.p99,
            })
        };
        let mut parts = key.split('/');
        Some(match (parts.next()?, parts.next()) {
            ("requests", None) => r.requests as f64,
            ("successful", None) => r.successful as f64,
            ("failed", None) => r.failed as f64,
            ("request_throughput", None) => r.request_throughput,
            ("output_token_throughput", None) => r.output_token_throughput,
            ("goodput", None) => r.goodput?,
            ("slo_attainment", None) => r.slo_attainment?,
            ("ttft", Some(s)) => d(r.ttft_ms, s)?,
            ("tpot", Some(s)) => d(r.tpot_ms, s)?,
            ("itl", Some(s)) => d(r.itl_ms, s)?,
            ("e2e", Some(s)) => d(r.e2e_ms, s)?,
            _ => return None,
        })
    };
    let mut compared = 0;
    for (key, text) in tagged(page, "data-key") {
        let text = unescape(&text);
        let (owner, rest) = key.split_once('/').unwrap();
        let want = match owner {
            "fp16" => json(fp16, rest),
            "int8" => json(int8, rest),
            "sweep" if rest == "capacity" => {
                assert_eq!(text, cap.words());
                continue;
            }
            "sweep" => {
                let (rate, stat) = rest.split_once('/').unwrap();
                let run = sweep
                    .runs
                    .iter()
                    .find(|r| format!("{:.3}", r.rate.unwrap()) == rate)
                    .unwrap();
                json(run, stat)
            }
            _ => continue,
        };
        let want = want.unwrap_or_else(|| panic!("{key}: not in the JSON"));
        let shown: f64 = text.parse().unwrap_or_else(|_| panic!("{key}: {text}"));
        assert!(
            (shown - want).abs() <= 0.0005,
            "{key}: {text} shown, {want} in the JSON"
        );
        compared += 1;
    }
    assert!(compared >= 2 * 21 + 2 * 9, "{compared} numbers compared");
    // What was run, with its label.
    assert!(page.contains("<td>labels.quant</td><td>fp16</td>"));
    // Nothing fetched: no script, no link, no source.
    assert!(!page.contains("<script") && !page.contains("href=") && !page.contains("src="));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_html_report_draws_every_run_and_shows_the_jsons_numbers() {
    let dir = temp_dir();
    let (page, fp16, int8, sweep) = made(&dir).await;
    let text = std::fs::read_to_string(&page).unwrap();
    assert!(text.contains("<title>fp16 &amp; int8</title>"));
    check(&text, &fp16, &int8, &sweep);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium"]
async fn the_html_report_renders_in_a_real_browser() {
    let bin = chromium();
    let dir = temp_dir();
    let (page, fp16, int8, sweep) = made(&dir).await;
    let url = format!("file://{}", page.display());
    let (dom, stderr) = tokio::task::spawn_blocking({
        let (bin, url) = (bin.clone(), url.clone());
        move || browse(&bin, &url, &["--dump-dom"])
    })
    .await
    .unwrap();
    assert!(dom.contains("</svg>"), "no page: {stderr}");
    assert!(
        !stderr.contains("Uncaught") && !stderr.contains(":CONSOLE("),
        "errors on the page: {stderr}"
    );
    check(&dom, &fp16, &int8, &sweep);
    let shot = dir.join("report.png");
    let arg = format!("--screenshot={}", shot.display());
    let (_, stderr) = tokio::task::spawn_blocking(move || browse(&bin, &url, &[&arg]))
        .await
        .unwrap();
    let png = std::fs::read(&shot).unwrap_or_else(|_| panic!("no screenshot: {stderr}"));
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 20_000,
        "{} bytes",
        png.len()
    );
}
