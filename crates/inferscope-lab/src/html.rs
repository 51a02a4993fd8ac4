//! `inferscope report --html`: one self-contained page (no script, no font, nothing fetched)
//! from bench results and access logs — each metric's distribution per run or variant as CDFs
//! overlaid, a sweep's latency and throughput against offered load with the SLO lines and the
//! knee marked, the figures as tables, and each run's metadata, engine configuration and
//! hardware side (GPU power, energy per output token). The
//! charts are SVG drawn here; every number a table shows carries `data-key`, so a test can hold
//! the page against the JSON it came from.

use crate::accesslog::LogLine;
use crate::loadgen::{BenchReport, Dist, Sample, SweepReport};
use std::fmt::Write;

/// Colours of the series, in order (distinct in colour and in grey).
const COLOURS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2",
];

/// The four per-request metrics drawn.
const METRICS: [(&str, &str); 4] = [
    ("ttft", "TTFT"),
    ("tpot", "TPOT"),
    ("itl", "ITL"),
    ("e2e", "E2E"),
];

/// One run or group of requests: its samples per metric, milliseconds.
#[derive(Debug, Clone, Default)]
pub struct Series {
    /// The legend's name.
    pub name: String,
    /// Per metric (`METRICS` order), every sample, ascending; or where only percentiles are
    /// known, the points (value, share) they give.
    pub curves: [Curve; 4],
    /// The figures of the summary table, per metric.
    pub dists: [Option<Dist>; 4],
    /// Requests, successful, failed.
    pub counts: (usize, usize, usize),
    /// Requests and output tokens per second, where known.
    pub rates: Option<(f64, f64)>,
    /// Metadata rows (run description, engine configuration): (section, key, value).
    pub meta: Vec<(String, String, String)>,
}

/// A distribution to draw.
#[derive(Debug, Clone, Default)]
pub enum Curve {
    /// Nothing measured.
    #[default]
    None,
    /// Every sample, ascending.
    Samples(Vec<f64>),
    /// Only the report's percentiles: (value, share).
    Points(Vec<(f64, f64)>),
}

impl Series {
    /// A bench run: its kept requests where `--per-request` kept them, else its percentiles.
    pub fn of_bench(name: &str, r: &BenchReport) -> Self {
        let dists = [r.ttft_ms, r.tpot_ms, r.itl_ms, r.e2e_ms];
        let measured: Vec<&Sample> = r
            .per_request
            .iter()
            .filter(|s| s.failure.is_none() && !s.excluded)
            .collect();
        let curves = if measured.is_empty() {
            dists.map(|d| match d {
                Some(d) => Curve::Points(vec![(d.median, 0.5), (d.p90, 0.9), (d.p99, 0.99)]),
                None => Curve::None,
            })
        } else {
            let pick = |f: &dyn Fn(&Sample) -> Vec<f64>| {
                let mut v: Vec<f64> = measured.iter().flat_map(|s| f(s)).collect();
                v.sort_by(f64::total_cmp);
                if v.is_empty() {
                    Curve::None
                } else {
                    Curve::Samples(v)
                }
            };
            [
                pick(&|s| s.ttft.into_iter().collect()),
                pick(&|s| s.tpot.into_iter().collect()),
                pick(&|s| s.itl.clone()),
                pick(&|s| vec![s.e2e]),
            ]
        };
        let meta = report_meta(r);
        Self {
            name: name.to_owned(),
            curves,
            dists,
            counts: (r.requests, r.successful, r.failed),
            rates: Some((r.request_throughput, r.output_token_throughput)),
            meta,
        }
    }

    /// A group of access-log lines (the successful ones drawn and summed up).
    pub fn of_lines(name: &str, lines: &[LogLine]) -> Self {
        let ok: Vec<&LogLine> = lines
            .iter()
            .filter(|l| l.outcome.as_deref() == Some("ok"))
            .collect();
        let take = |f: &dyn Fn(&LogLine) -> Vec<f64>| {
            let mut v: Vec<f64> = ok.iter().flat_map(|l| f(l)).collect();
            v.sort_by(f64::total_cmp);
            v
        };
        let mut samples = [
            take(&|l| l.ttft_ms.into_iter().collect()),
            take(&|l| l.tpot_ms.into_iter().collect()),
            take(&|l| l.itl_us.iter().map(|u| *u as f64 / 1000.0).collect()),
            take(&|l| l.e2e_ms.into_iter().collect()),
        ];
        let dists = [0, 1, 2, 3].map(|i| Dist::of_samples(&mut samples[i]));
        Self {
            name: name.to_owned(),
            curves: samples.map(|v| {
                if v.is_empty() {
                    Curve::None
                } else {
                    Curve::Samples(v)
                }
            }),
            dists,
            counts: (lines.len(), ok.len(), lines.len() - ok.len()),
            rates: None,
            meta: Vec::new(),
        }
    }
}

/// A row of what was run: section, dotted key, value.
type MetaRow = (String, String, String);

/// A bench report's description as rows: its run, the engine's own, its hardware side.
fn report_meta(r: &BenchReport) -> Vec<MetaRow> {
    let mut meta = Vec::new();
    for (section, v) in [
        ("run", r.run.as_ref().map(serde_json::to_value)),
        ("engine", r.engine.as_ref().map(serde_json::to_value)),
        ("hardware", r.hardware.as_ref().map(serde_json::to_value)),
    ] {
        if let Some(Ok(v)) = v {
            flatten(section, &v, "", &mut meta);
        }
    }
    meta
}

/// `v`'s leaves as (section, dotted key, value) rows.
fn flatten(
    section: &str,
    v: &serde_json::Value,
    prefix: &str,
    out: &mut Vec<(String, String, String)>,
) {
    let key = |k: &str| {
        if prefix.is_empty() {
            k.to_owned()
        } else {
            format!("{prefix}.{k}")
        }
    };
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                flatten(section, v, &key(k), out);
            }
        }
        serde_json::Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                flatten(section, v, &key(&i.to_string()), out);
            }
        }
        serde_json::Value::Null => {}
        serde_json::Value::String(s) => out.push((section.into(), prefix.into(), s.clone())),
        other => out.push((section.into(), prefix.into(), other.to_string())),
    }
}

/// What a page shows.
#[derive(Debug, Clone, Default)]
pub struct Page {
    /// The heading.
    pub title: String,
    /// Runs and groups, overlaid.
    pub series: Vec<Series>,
    /// Sweeps, each with its name.
    pub sweeps: Vec<(String, SweepReport)>,
}

/// Text made safe for HTML.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A number as the tables print it (and as the test reads it back).
fn num(v: f64) -> String {
    format!("{v:.3}")
}

/// A chart's line: name, colour, points, dashed.
type Line = (String, &'static str, Vec<(f64, f64)>, bool);

/// One line chart.
struct Chart<'a> {
    id: &'a str,
    title: String,
    x_label: &'a str,
    y_label: &'a str,
    lines: Vec<Line>,
    /// Horizontal reference lines: (label, y).
    h: Vec<(String, f64)>,
    /// Vertical reference lines: (label, x).
    v: Vec<(String, f64)>,
    x_max: Option<f64>,
    y_max: Option<f64>,
}

const W: f64 = 640.0;
const H: f64 = 300.0;
const PAD_L: f64 = 56.0;
const PAD_R: f64 = 16.0;
const PAD_T: f64 = 12.0;
const PAD_B: f64 = 40.0;

/// A "nice" upper bound for an axis: 1, 2 or 5 times a power of ten, at least `v`.
fn nice(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|c| *c >= v * 0.999)
        .unwrap_or(10.0 * p)
}

impl Chart<'_> {
    fn svg(&self) -> String {
        let all = self.lines.iter().flat_map(|l| l.2.iter());
        let (mut xm, mut ym) = (0.0f64, 0.0f64);
        for (x, y) in all {
            xm = xm.max(*x);
            ym = ym.max(*y);
        }
        for (_, y) in &self.h {
            ym = ym.max(*y);
        }
        for (_, x) in &self.v {
            xm = xm.max(*x);
        }
        let xm = nice(self.x_max.unwrap_or(xm));
        let ym = self.y_max.unwrap_or_else(|| nice(ym));
        let px = |x: f64| PAD_L + (x / xm).min(1.0) * (W - PAD_L - PAD_R);
        let py = |y: f64| H - PAD_B - (y / ym).min(1.0) * (H - PAD_T - PAD_B);
        let mut s = String::new();
        let _ = write!(
            s,
            r##"<figure data-chart="{id}"><figcaption>{title}</figcaption><svg viewBox="0 0 {W} {H}" role="img" aria-label="{title}">"##,
            id = self.id,
            title = esc(&self.title)
        );
        // Axes and five ticks each.
        let _ = write!(
            s,
            r##"<path class="axis" d="M{l} {t}V{b}H{r}"/>"##,
            l = PAD_L,
            t = PAD_T,
            b = H - PAD_B,
            r = W - PAD_R
        );
        for i in 0..=5 {
            let f = f64::from(i) / 5.0;
            let (x, y) = (px(xm * f), py(ym * f));
            let _ = write!(
                s,
                r##"<path class="grid" d="M{x:.1} {t}V{b}"/><text x="{x:.1}" y="{ty}" text-anchor="middle">{xv}</text><path class="grid" d="M{l} {y:.1}H{r}"/><text x="{lx}" y="{yy:.1}" text-anchor="end">{yv}</text>"##,
                t = PAD_T,
                b = H - PAD_B,
                ty = H - PAD_B + 14.0,
                xv = tick(xm * f),
                l = PAD_L,
                r = W - PAD_R,
                lx = PAD_L - 4.0,
                yy = y + 4.0,
                yv = tick(ym * f),
            );
        }
        let _ = write!(
            s,
            r##"<text x="{cx}" y="{by}" text-anchor="middle" class="label">{xl}</text><text transform="translate(12 {cy}) rotate(-90)" text-anchor="middle" class="label">{yl}</text>"##,
            cx = (PAD_L + W - PAD_R) / 2.0,
            by = H - 6.0,
            xl = esc(self.x_label),
            cy = (PAD_T + H - PAD_B) / 2.0,
            yl = esc(self.y_label)
        );
        for (label, y) in &self.h {
            let _ = write!(
                s,
                r##"<path class="ref" data-ref="{l}" d="M{a} {y:.1}H{b}"/><text x="{tx}" y="{ty:.1}" text-anchor="end" class="ref">{l}</text>"##,
                l = esc(label),
                a = PAD_L,
                b = W - PAD_R,
                y = py(*y),
                tx = W - PAD_R - 2.0,
                ty = py(*y) - 3.0
            );
        }
        for (label, x) in &self.v {
            let _ = write!(
                s,
                r##"<path class="knee" data-ref="{l}" d="M{x:.1} {t}V{b}"/><text x="{tx:.1}" y="{ty}" class="knee">{l}</text>"##,
                l = esc(label),
                x = px(*x),
                t = PAD_T,
                b = H - PAD_B,
                tx = px(*x) + 3.0,
                ty = PAD_T + 12.0
            );
        }
        for (name, colour, pts, dashed) in &self.lines {
            if pts.is_empty() {
                continue;
            }
            let mut d = String::new();
            for (i, (x, y)) in pts.iter().enumerate() {
                let _ = write!(
                    d,
                    "{}{:.1} {:.1}",
                    if i == 0 { "M" } else { "L" },
                    px(*x),
                    py(*y)
                );
            }
            let _ = write!(
                s,
                r##"<path class="series" data-series="{n}" data-points="{k}" stroke="{colour}"{dash} d="{d}"/>"##,
                n = esc(name),
                k = pts.len(),
                dash = if *dashed {
                    r#" stroke-dasharray="5 3""#
                } else {
                    ""
                }
            );
            if pts.len() <= 40 {
                for (x, y) in pts {
                    let _ = write!(
                        s,
                        r##"<circle cx="{:.1}" cy="{:.1}" r="2.5" fill="{colour}"/>"##,
                        px(*x),
                        py(*y)
                    );
                }
            }
        }
        s.push_str("</svg><div class=\"legend\">");
        for (name, colour, pts, dashed) in &self.lines {
            if pts.is_empty() {
                continue;
            }
            let _ = write!(
                s,
                r##"<span><i style="border-top:2px {} {colour}"></i>{}</span>"##,
                if *dashed { "dashed" } else { "solid" },
                esc(name)
            );
        }
        s.push_str("</div></figure>\n");
        s
    }
}

/// An axis tick's text.
fn tick(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// A CDF's points: at most 400, evenly by rank, with the first and last samples.
fn cdf(c: &Curve) -> Vec<(f64, f64)> {
    match c {
        Curve::None => Vec::new(),
        Curve::Points(p) => p.clone(),
        Curve::Samples(v) => {
            let n = v.len();
            let step = n.div_ceil(400).max(1);
            let mut out: Vec<(f64, f64)> = (0..n)
                .step_by(step)
                .map(|i| (v[i], (i + 1) as f64 / n as f64))
                .collect();
            if (n - 1) % step != 0 {
                out.push((v[n - 1], 1.0));
            }
            out
        }
    }
}

/// The SLO limit on `metric` a report states (`ttft<=200ms`), milliseconds.
fn slo_ms(slo: &[String], metric: &str) -> Option<f64> {
    slo.iter().find_map(|s| {
        let (m, v) = s.split_once("<=")?;
        (m == metric).then(|| v.trim_end_matches("ms").parse().ok())?
    })
}

const STYLE: &str = "body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#222;max-width:1400px}\
h1{font-size:20px}h2{font-size:16px;margin-top:28px}\
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(520px,1fr));gap:16px}\
figure{margin:0;border:1px solid #ddd;border-radius:6px;padding:8px}figcaption{font-weight:600;margin-bottom:4px}\
svg{width:100%;height:auto}svg text{font-size:11px;fill:#555}svg .label{font-size:12px;fill:#222}\
.axis{stroke:#444;fill:none}.grid{stroke:#eee;fill:none}.series{fill:none;stroke-width:2}\
.ref{stroke:#999;stroke-dasharray:2 3;fill:#777}.knee{stroke:#000;stroke-dasharray:6 3;fill:#000}\
.legend span{margin-right:14px;white-space:nowrap}.legend i{display:inline-block;width:22px;margin-right:4px;vertical-align:middle}\
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}\
th{background:#f6f6f6}.wide{overflow-x:auto}td:first-child,th:first-child{text-align:left}.note{color:#666}";

/// The page.
pub fn render(p: &Page) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title><style>{STYLE}</style></head><body><h1>{t}</h1>",
        t = esc(&p.title)
    );
    if !p.series.is_empty() {
        s.push_str("<h2>Distributions</h2><div class=\"charts\">\n");
        for (i, (id, name)) in METRICS.iter().enumerate() {
            let lines: Vec<_> = p
                .series
                .iter()
                .enumerate()
                .map(|(k, se)| {
                    let approx = matches!(se.curves[i], Curve::Points(_));
                    let label = if approx {
                        format!("{} (p50/p90/p99 only)", se.name)
                    } else {
                        se.name.clone()
                    };
                    (
                        label,
                        COLOURS[k % COLOURS.len()],
                        cdf(&se.curves[i]),
                        approx,
                    )
                })
                .collect();
            // The x axis to the highest p99, so one long tail does not flatten the rest.
            let x_max = p
                .series
                .iter()
                .filter_map(|se| se.dists[i].map(|d| d.p99))
                .fold(0.0f64, f64::max);
            let chart = Chart {
                id: &format!("cdf-{id}"),
                title: format!("{name}: share of requests at or under (CDF)"),
                x_label: "milliseconds",
                y_label: "share",
                lines,
                h: Vec::new(),
                v: Vec::new(),
                x_max: (x_max > 0.0).then_some(x_max * 1.1),
                y_max: Some(1.0),
            };
            s.push_str(&chart.svg());
        }
        s.push_str("</div><p class=\"note\">Each x axis ends at 1.1 × the highest p99 shown; a dashed curve is drawn through a run's percentiles only (bench without --per-request).</p>\n");
        summary_table(&mut s, &p.series);
    }
    for (name, sw) in &p.sweeps {
        sweep(&mut s, name, sw);
    }
    // What was run: each run's description, and each sweep's (its first rate's).
    let mut tables: Vec<(String, Vec<MetaRow>)> = p
        .series
        .iter()
        .filter(|se| !se.meta.is_empty())
        .map(|se| (se.name.clone(), se.meta.clone()))
        .collect();
    tables.extend(p.sweeps.iter().filter_map(|(name, sw)| {
        let r = sw.runs.first()?;
        Some((format!("{name} (its first rate)"), report_meta(r)))
    }));
    if !tables.is_empty() {
        s.push_str("<h2>What was run</h2>\n");
    }
    for (name, rows) in &tables {
        let _ = write!(
            s,
            "<h3>{n}</h3><table data-meta=\"{n}\"><tr><th>section</th><th>key</th><th>value</th></tr>",
            n = esc(name)
        );
        for (sec, k, v) in rows {
            let _ = write!(
                s,
                "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(sec),
                esc(k),
                esc(v)
            );
        }
        s.push_str("</table>\n");
    }
    let _ = writeln!(
        s,
        "<p class=\"note\">Made by inferscope {} (report --html).</p></body></html>",
        env!("CARGO_PKG_VERSION")
    );
    s
}

fn summary_table(s: &mut String, series: &[Series]) {
    s.push_str("<h2>Figures (ms)</h2><div class=\"wide\"><table data-table=\"summary\"><tr><th>run / group</th><th>requests</th><th>ok</th><th>failed</th><th>req/s</th><th>output tok/s</th>");
    for (_, name) in METRICS {
        let _ = write!(
            s,
            "<th>{name} mean</th><th>{name} p50</th><th>{name} p90</th><th>{name} p99</th>"
        );
    }
    s.push_str("</tr>\n");
    for se in series {
        let n = esc(&se.name);
        let _ = write!(
            s,
            "<tr><td>{n}</td><td data-key=\"{n}/requests\">{}</td><td data-key=\"{n}/successful\">{}</td><td data-key=\"{n}/failed\">{}</td>",
            se.counts.0, se.counts.1, se.counts.2
        );
        match se.rates {
            Some((r, t)) => {
                let _ = write!(s, "<td data-key=\"{n}/request_throughput\">{}</td><td data-key=\"{n}/output_token_throughput\">{}</td>", num(r), num(t));
            }
            None => s.push_str("<td>-</td><td>-</td>"),
        }
        for (i, (id, _)) in METRICS.iter().enumerate() {
            match se.dists[i] {
                Some(d) => {
                    for (stat, v) in [
                        ("mean", d.mean),
                        ("median", d.median),
                        ("p90", d.p90),
                        ("p99", d.p99),
                    ] {
                        let _ = write!(s, "<td data-key=\"{n}/{id}/{stat}\">{}</td>", num(v));
                    }
                }
                None => s.push_str("<td>-</td><td>-</td><td>-</td><td>-</td>"),
            }
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</table></div>\n");
}

fn sweep(s: &mut String, name: &str, sw: &SweepReport) {
    let mut rows: Vec<&BenchReport> = sw.runs.iter().filter(|r| r.rate.is_some()).collect();
    rows.sort_by(|a, b| a.rate.unwrap_or(0.0).total_cmp(&b.rate.unwrap_or(0.0)));
    let _ = writeln!(s, "<h2>Against offered load: {}</h2>", esc(name));
    let slo = rows.first().map(|r| r.slo.clone()).unwrap_or_default();
    let knee: Vec<(String, f64)> = sw
        .capacity
        .as_ref()
        .and_then(|c| c.rate)
        .map(|r| vec![(format!("capacity {r:.2} req/s"), r)])
        .unwrap_or_default();
    let line = |f: &dyn Fn(&BenchReport) -> Option<f64>| -> Vec<(f64, f64)> {
        rows.iter().filter_map(|r| Some((r.rate?, f(r)?))).collect()
    };
    s.push_str("<div class=\"charts\">\n");
    for (id, title, metric, get) in [
        (
            "load-ttft",
            "TTFT against offered load",
            "ttft",
            (|r: &BenchReport| r.ttft_ms) as fn(&BenchReport) -> Option<Dist>,
        ),
        (
            "load-tpot",
            "TPOT against offered load",
            "tpot",
            |r: &BenchReport| r.tpot_ms,
        ),
        (
            "load-e2e",
            "E2E against offered load",
            "e2e",
            |r: &BenchReport| r.e2e_ms,
        ),
    ] {
        let chart = Chart {
            id,
            title: title.into(),
            x_label: "offered requests/s",
            y_label: "milliseconds",
            lines: vec![
                (
                    "p50".into(),
                    COLOURS[0],
                    line(&|r| get(r).map(|d| d.median)),
                    false,
                ),
                (
                    "p99".into(),
                    COLOURS[1],
                    line(&|r| get(r).map(|d| d.p99)),
                    false,
                ),
            ],
            h: slo_ms(&slo, metric)
                .map(|v| vec![(format!("SLO {metric} ≤ {v} ms"), v)])
                .unwrap_or_default(),
            v: knee.clone(),
            x_max: None,
            y_max: None,
        };
        s.push_str(&chart.svg());
    }
    let offered = line(&|r| r.rate);
    let chart = Chart {
        id: "load-throughput",
        title: "Throughput against offered load".into(),
        x_label: "offered requests/s",
        y_label: "requests/s",
        lines: vec![
            (
                "achieved".into(),
                COLOURS[0],
                line(&|r| Some(r.request_throughput)),
                false,
            ),
            (
                "goodput (met every SLO)".into(),
                COLOURS[2],
                line(&|r| r.goodput),
                false,
            ),
            ("offered".into(), "#999999", offered, true),
        ],
        h: Vec::new(),
        v: knee.clone(),
        x_max: None,
        y_max: None,
    };
    s.push_str(&chart.svg());
    s.push_str("</div>\n");
    if let Some(c) = &sw.capacity {
        let _ = writeln!(
            s,
            "<p data-key=\"{}/capacity\">{}</p>",
            esc(name),
            esc(&c.words())
        );
    }
    let _ = writeln!(s, "<table data-table=\"sweep\"><tr><th>offered req/s</th><th>achieved req/s</th><th>output tok/s</th><th>goodput req/s</th><th>met SLOs</th><th>TTFT p50</th><th>TTFT p99</th><th>TPOT p50</th><th>TPOT p99</th><th>E2E p99</th><th>failed</th></tr>");
    for r in rows {
        let rate = r.rate.unwrap_or(0.0);
        let k = format!("{}/{}", esc(name), num(rate));
        let cell = |stat: &str, v: Option<f64>| match v {
            Some(v) => format!("<td data-key=\"{k}/{stat}\">{}</td>", num(v)),
            None => "<td>-</td>".into(),
        };
        let _ = writeln!(
            s,
            "<tr><td>{}</td>{}{}{}{}{}{}{}{}{}<td>{}</td></tr>",
            num(rate),
            cell("request_throughput", Some(r.request_throughput)),
            cell("output_token_throughput", Some(r.output_token_throughput)),
            cell("goodput", r.goodput),
            cell("slo_attainment", r.slo_attainment),
            cell("ttft/median", r.ttft_ms.map(|d| d.median)),
            cell("ttft/p99", r.ttft_ms.map(|d| d.p99)),
            cell("tpot/median", r.tpot_ms.map(|d| d.median)),
            cell("tpot/p99", r.tpot_ms.map(|d| d.p99)),
            cell("e2e/p99", r.e2e_ms.map(|d| d.p99)),
            r.failed
        );
    }
    s.push_str("</table>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_bounds_and_cdf_points() {
        assert_eq!(nice(0.7), 1.0);
        assert_eq!(nice(13.0), 20.0);
        assert_eq!(nice(450.0), 500.0);
        let v: Vec<f64> = (1..=1000).map(f64::from).collect();
        let pts = cdf(&Curve::Samples(v));
        assert!(pts.len() <= 401);
        assert_eq!(pts.first(), Some(&(1.0, 0.001)));
        assert_eq!(pts.last(), Some(&(1000.0, 1.0)));
        assert_eq!(
            slo_ms(&["ttft<=200ms".into(), "tpot<=30ms".into()], "tpot"),
            Some(30.0)
        );
    }

    #[test]
    fn a_page_is_self_contained_and_escapes_what_it_is_given() {
        let mut se = Series {
            name: "<int8>".into(),
            ..Series::default()
        };
        se.curves[0] = Curve::Samples(vec![1.0, 2.0, 3.0]);
        let page = render(&Page {
            title: "t & t".into(),
            series: vec![se],
            sweeps: Vec::new(),
        });
        assert!(page.contains("data-series=\"&lt;int8&gt;\""));
        assert!(page.contains("<title>t &amp; t</title>"));
        assert!(!page.contains("<script") && !page.contains("src=") && !page.contains("href="));
        assert_eq!(page.matches("data-chart=").count(), 4);
    }
}
