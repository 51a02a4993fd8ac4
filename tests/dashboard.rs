//! The dashboard in a real browser: headless Chromium loads admin `GET /`, runs its script against
//! a gateway that served an experiment, and the page it renders is checked — no script errors,
//! every chart drawn, and every number it shows equal to `/stats` and every verdict to
//! `/experiments` at the same moment (the load stopped first).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::*;
use inferscope::sim::Profile;
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

pub(crate) fn chromium() -> PathBuf {
    program(
        &["chromium", "chromium-browser", "google-chrome"],
        "apt-get install chromium",
    )
}

/// Runs headless Chromium on `url` for a few seconds of page time; returns (DOM, stderr).
pub(crate) fn browse(bin: &std::path::Path, url: &str, extra: &[&str]) -> (String, String) {
    let profile = temp_dir();
    let out = Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--enable-logging=stderr",
            "--v=0",
            "--window-size=1400,1800",
            "--virtual-time-budget=7000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(url)
        .output()
        .unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `(attribute value, element text)` for every element carrying `attr`.
pub(crate) fn tagged(dom: &str, attr: &str) -> Vec<(String, String)> {
    let needle = format!("{attr}=\"");
    let mut out = Vec::new();
    let mut rest = dom;
    while let Some(i) = rest.find(&needle) {
        rest = &rest[i + needle.len()..];
        let Some(end) = rest.find('"') else { break };
        let key = rest[..end].to_string();
        let Some(gt) = rest.find('>') else { break };
        let text_end = rest[gt + 1..].find('<').unwrap_or(0);
        let text = rest[gt + 1..gt + 1 + text_end].to_string();
        out.push((key, text));
        rest = &rest[gt..];
    }
    out
}

pub(crate) fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&amp;", "&")
}

fn at<'a>(doc: &'a Value, path: &str) -> &'a Value {
    path.split('/').fold(doc, |v, k| match k.parse::<usize>() {
        Ok(i) if v.is_array() => &v[i],
        _ => &v[k],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium"]
async fn the_dashboard_shows_what_stats_says_in_a_real_browser() {
    let bin = chromium();
    let p = |tpot| Profile {
        jitter: 0.3,
        ..exact(8.0, tpot)
    };
    // fp16's engine sends its spans to the admin listener: bound first, served once the
    // gateway (and so the admin address) exists.
    let fp16_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let fp16_addr = fp16_listener.local_addr().unwrap();
    let int8 = start_sim(p(2.0), 2).await;
    let dir = temp_dir();
    let yaml = format!(
        "access_log: {{ path: {:?} }}\nbackends:\n  - {{ name: fp16, url: \"http://{}\", metrics: {{ interval: 100ms }}, engine_spans: {{ wait: 10s }}, model: {{ params_b: 8 }}, gpu: {{ preset: h100 }} }}\n  - {{ name: int8, url: \"http://{}\" }}\nroutes:\n  - name: chat\n    slo: {{ ttft: 12ms, tpot: 3ms }}\n    experiment:\n      name: int8-vs-fp16\n      sticky_key: \"header:x-user-id\"\n      min_samples: 20\n      guardrails: {{ rules: [{{ variant: int8, metric: ttft_p99_ms, max: 10000 }}] }}\n      accept: {{ tpot_change_max: 0, accuracy_drop_max_points: 5 }}\n      variants:\n        - {{ name: fp16, backends: [fp16], weight: 50, control: true }}\n        - {{ name: int8, backends: [int8], weight: 50 }}\n",
        dir.join("access.jsonl"),
        fp16_addr,
        int8.addr
    );
    let gw = start_yaml(&yaml).await;
    let mut opts = inferscope::sim::SimOptions::new(p(3.0));
    opts.seed = 1;
    opts.spans = Some(inferscope::sim::SpanExport {
        endpoint: format!("http://{}/v1/traces", gw.admin_addr)
            .parse()
            .unwrap(),
        delay: Duration::from_millis(50),
    });
    let _fp16 = inferscope::sim::spawn(fp16_listener, opts, std::future::pending()).unwrap();
    for i in 0..80 {
        let r = post(
            gw.data_addr,
            "/v1/chat/completions",
            &chat(true, 6, ""),
            &[("x-user-id", &format!("u{i}"))],
        )
        .await;
        assert_eq!(r.status, 200);
    }
    // The load has stopped: /stats and /experiments now hold still (but for rates over time)
    // once a scrape of the backend's engine has seen it idle (one taken during the last request
    // says one is running; the page, loaded later, would show the next).
    let t0 = std::time::Instant::now();
    let stats: Value = loop {
        let (_, body) = admin_get(gw.admin_addr, "/stats").await;
        let stats: Value = serde_json::from_str(&body).unwrap();
        let engine = &stats["backends"][0]["scrape"]["engine"];
        // …and once every fp16 request's span is joined.
        let fp16 = stats["rollups"]["backend"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["backend"] == "fp16")
            .map(|b| b["cumulative"].clone())
            .unwrap_or_default();
        let joined = fp16["engine_spans"]["joined"] == fp16["requests"];
        if engine["running"].as_f64() == Some(0.0)
            && engine["waiting"].as_f64() == Some(0.0)
            && joined
        {
            break stats;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{engine}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // An eval's result, as `eval --report-to` posts it: joined into the verdict row.
    let quality = r#"{"kind":"accuracy","suite":"mmlu","model":"m","control":"fp16",
        "variants":[{"variant":"fp16","value":0.8,"n":100},{"variant":"int8","value":0.79,"n":100}],
        "comparisons":[{"variant":"int8","difference":-0.01,"ci95":[-0.03,0.01]}]}"#;
    let r = post(gw.admin_addr, "/experiments/quality", quality, &[]).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body()));
    let (_, body) = admin_get(gw.admin_addr, "/experiments").await;
    let exps: Value = serde_json::from_str(&body).unwrap();

    let url = format!("http://{}/", gw.admin_addr);
    let (dom, stderr) = tokio::task::spawn_blocking({
        let bin = bin.clone();
        move || browse(&bin, &url, &["--dump-dom"])
    })
    .await
    .unwrap();
    assert!(dom.contains("<title>inferscope</title>"), "{stderr}\n{dom}");

    // No script error: the page's own error box is empty and the browser logged none.
    let errors = dom
        .split("<pre id=\"errors\">")
        .nth(1)
        .and_then(|s| s.split("</pre>").next())
        .unwrap();
    assert_eq!(errors.trim(), "", "script errors on the page");
    for line in stderr.lines() {
        assert!(
            !(line.contains("Uncaught") || line.contains("Refused to")),
            "console: {line}"
        );
    }
    let polls: u32 = dom
        .split("data-polls=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    assert!(polls >= 2, "the page polled {polls} times");

    // Every chart has data.
    for chart in ["c-ttft", "c-tpot", "c-e2e", "c-rate", "c-hist"] {
        let at_chart = dom.split(&format!("id=\"{chart}\"")).next().unwrap();
        let tag_start = at_chart.rfind('<').unwrap();
        let tag = &dom[tag_start..tag_start + 200.min(dom.len() - tag_start)];
        let points: u64 = tag
            .split("data-points=\"")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        assert!(points > 0, "chart {chart} is empty: {tag}");
    }

    // Every number shown is /stats's.
    let cells = tagged(&dom, "data-stat");
    assert!(cells.len() >= 40, "{} numbers shown", cells.len());
    assert!(
        cells
            .iter()
            .any(|(p, _)| p.ends_with("scrape/engine/kv_cache_usage")),
        "the scraped backend's engine columns are shown"
    );
    assert!(
        cells
            .iter()
            .any(|(p, _)| p.ends_with("cumulative/engine_queue/p99")),
        "where the time went is shown for the backend whose engine sends spans"
    );
    let words = at(&stats, "backends/0/roofline/decode/words");
    assert!(
        dom.contains(&format!("fp16: {}", words.as_str().unwrap_or("?"))),
        "the roofline verdict {words} is shown"
    );
    let mut compared = 0;
    for (path, text) in &cells {
        let want = at(&stats, path);
        let text = unescape(text);
        if let Some(s) = want.as_str() {
            assert_eq!(&text, s, "{path}");
            continue;
        }
        let shown: f64 = text
            .trim_end_matches('%')
            .parse()
            .unwrap_or_else(|_| panic!("{path}: {text:?} is not a number (stats has {want})"));
        let want = want.as_f64().unwrap_or_else(|| panic!("{path}: {want}"));
        if path.ends_with("_per_s") {
            // A rate over the window's time: it only falls while no request comes.
            assert!(
                shown <= want + 0.01 && shown > 0.0,
                "{path}: {shown} vs {want}"
            );
            continue;
        }
        let digits = text
            .trim_end_matches('%')
            .split('.')
            .nth(1)
            .map_or(0, str::len) as i32;
        let scale = if path.ends_with("goodput/share")
            || path.ends_with("kv_cache_usage")
            || path.ends_with("utilization")
        {
            100.0
        } else {
            1.0
        };
        assert!(
            (shown - want * scale).abs() <= 0.5 * 10f64.powi(-digits) + 1e-9,
            "{path}: the page shows {text}, /stats says {want}"
        );
        compared += 1;
    }
    assert!(compared >= 30, "{compared} numbers compared");

    // Every verdict shown is /experiments's.
    let verdicts = tagged(&dom, "data-verdict");
    let n = exps["experiments"][0]["comparisons"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(verdicts.len(), n);
    for (path, text) in &verdicts {
        assert_eq!(unescape(text), at(&exps, path).as_str().unwrap(), "{path}");
    }
    // The joined row: latency, the posted suite, throughput and the decision, as /experiments.
    let joined = tagged(&dom, "data-joined");
    assert_eq!(joined.len(), 1, "one row: int8 against fp16");
    let (path, text) = &joined[0];
    let row = at(&exps, path).as_str().unwrap();
    assert_eq!(unescape(text), row, "{path}");
    assert!(
        row.starts_with("int8: TTFT ")
            && row.contains("mmlu \u{2212}1.0 pts [\u{2212}3.0, +1.0]")
            && row.ends_with("\u{2192} accept"),
        "{row}"
    );
    assert!(
        dom.contains("guardrails: every variant serving"),
        "guardrail state shown"
    );

    // A picture of it, as a person would see it.
    let shot = dir.join("dashboard.png");
    let (_, stderr) = tokio::task::spawn_blocking({
        let bin = bin.clone();
        let url = format!("http://{}/", gw.admin_addr);
        let arg = format!("--screenshot={}", shot.display());
        move || browse(&bin, &url, &[&arg])
    })
    .await
    .unwrap();
    let png = std::fs::read(&shot).unwrap_or_else(|_| panic!("no screenshot: {stderr}"));
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 20_000,
        "{} bytes",
        png.len()
    );
}
