//! `inferscope report`: per-group latency from access logs or HdrHistogram exports, each group
//! compared with a control; the verdict with --quality and --accept.

use super::fetch_json;
use crate::config;
use anyhow::Context as _;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Access logs (JSON lines); several are read as one (a fleet's replicas).
    #[arg(required_unless_present_any = ["merge", "bench"])]
    files: Vec<PathBuf>,
    /// Write one self-contained HTML page here (no script, nothing fetched): each metric's
    /// CDF per bench run and per group of the access logs, overlaid; a sweep's latency and
    /// throughput against offered load with the SLO lines and the capacity marked; the figures
    /// as tables; each run's metadata and engine configuration.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// A `bench --out` result for --html (repeatable), as `NAME=FILE` or `FILE` (named by its
    /// file name): a run (its every request drawn where it was run with --per-request, its
    /// percentiles otherwise) or a sweep.
    #[arg(long, value_name = "[NAME=]FILE", requires = "html")]
    bench: Vec<String>,
    /// The page's title.
    #[arg(long, default_value = "inferscope report", requires = "html")]
    title: String,
    /// Merge replicas exactly: admin URLs (read at /stats?format=hdr, with the quality results
    /// posted to each at /experiments), saved /stats?format=hdr documents, or access logs
    /// (every sample: the fleet's verdict).
    #[arg(long, num_args = 1.., value_name = "URL|FILE")]
    merge: Vec<String>,
    /// For admin URLs: a bearer token, from this environment variable.
    #[arg(long, value_name = "VAR")]
    token_env: Option<String>,
    /// For https:// admin URLs: a PEM CA bundle trusted besides the bundled Mozilla roots.
    #[arg(long)]
    ca_file: Option<PathBuf>,
    /// Group by `variant`, `backend`, `model`, `route`, `purpose` or `stream`.
    #[arg(long, default_value = "variant")]
    by: String,
    /// Which traffic to read: `live` (with shadow copies, as their own `VARIANT:shadow`
    /// group: the default), `eval`, `bench`, `shadow`, or `all`. Grouped by variant, a
    /// variant a client forced is left out unless `all`.
    #[arg(long, value_name = "PURPOSE")]
    purpose: Option<String>,
    /// The group the others are compared with (e.g. the control variant).
    #[arg(long)]
    control: Option<String>,
    /// No verdict until both groups have this many samples of a metric (the fixed horizon:
    /// the experiment's `min_samples`, which a log does not carry).
    #[arg(long, default_value_t = crate::config::DEFAULT_MIN_SAMPLES)]
    min_samples: usize,
    /// No one client (its key's name, else its address) weighs more than this share of a
    /// group's requests in a comparison (the experiment's `max_client_share`; 1: unbounded).
    #[arg(long, default_value_t = crate::config::DEFAULT_MAX_CLIENT_SHARE, value_name = "SHARE")]
    max_client_share: f64,
    /// Print JSON (per group: labels, counts, p50/p90/p99 of every metric; comparisons).
    #[arg(long)]
    json: bool,
    /// The gateway's config: with access logs, each backend it gives `model:` and `gpu:` is
    /// placed on its roofline from its logged requests, and each group whose backends have a
    /// `price:` gets its cost per million output tokens.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Eval results to join to the comparison (`inferscope eval --json > FILE`; repeatable):
    /// one verdict row per variant, latency and quality side by side (needs --control).
    #[arg(long, value_name = "FILE")]
    quality: Vec<PathBuf>,
    /// Limits of the verdict, as an experiment's `accept:`, e.g.
    /// `tpot_change_max=0,accuracy_drop_max_points=1,ppl_rise_max=0.5`.
    #[arg(long, value_name = "KEY=VALUE,...")]
    accept: Option<String>,
}

pub(crate) fn exec(args: &Args) -> ExitCode {
    if let Some(out) = &args.html {
        return match html(args, out) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(2)
            }
        };
    }
    let Args {
        files,
        merge,
        token_env,
        ca_file,
        by,
        purpose,
        control,
        min_samples,
        max_client_share,
        json,
        config: roof_config,
        quality,
        accept,
        ..
    } = args;
    let mut sources: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    sources.extend(merge.iter().cloned());
    let token = token_env.as_ref().and_then(|v| std::env::var(v).ok());
    let joined = read_quality(quality).and_then(|q| Ok((q, parse_accept(accept.as_deref())?)));
    let backends = match roof_config.as_deref().map(config::load).transpose() {
        Ok(c) => c.map(|c| c.backends.clone()).unwrap_or_default(),
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    let (quality, accept) = match joined {
        Ok(j) => j,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    let opts = crate::lab::report::ReportOptions {
        files: Vec::new(),
        by: by.clone(),
        purpose: purpose.clone(),
        control: control.clone(),
        min_samples: *min_samples,
        max_client_share: *max_client_share,
        json: *json,
        quality,
        accept,
        backends,
    };
    let made =
        read_report_sources(&sources, token.as_deref(), ca_file.clone()).and_then(|read| {
            match read {
                ReportSources::Logs(files) => {
                    let opts = crate::lab::report::ReportOptions {
                        files: files.clone(),
                        ..opts
                    };
                    let text = crate::lab::report::report(&opts).map_err(anyhow::Error::from)?;
                    match roof_config {
                        Some(c) => with_rooflines(text, &files, c, *json),
                        None => Ok(text),
                    }
                }
                ReportSources::Hdr(..) if opts.quality.len() + usize::from(opts.accept.is_some()) > 0 => {
                    anyhow::bail!("--quality and --accept are read with access logs, not with /stats?format=hdr sources (their comparisons have no intervals to judge)")
                }
                ReportSources::Hdr(docs, posted) => {
                    let text = crate::stats::hdr::report(&docs, by, control.as_deref(), *json)?;
                    with_posted_quality(text, &posted, docs.len(), *json)
                }
            }
        });
    match made {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// `report --html`: the page from the bench results and the access logs' groups.
fn html(args: &Args, out: &std::path::Path) -> anyhow::Result<()> {
    use crate::lab::html::{Page, Series};
    use crate::lab::loadgen::{BenchReport, SweepReport};
    anyhow::ensure!(
        args.merge.is_empty(),
        "--html reads bench results (--bench) and access logs, not --merge sources"
    );
    let mut page = Page {
        title: args.title.clone(),
        ..Page::default()
    };
    for b in &args.bench {
        let (name, path) = match b.split_once('=') {
            Some((n, p)) if !n.is_empty() && !std::path::Path::new(b).exists() => {
                (n.to_owned(), PathBuf::from(p))
            }
            _ => {
                let p = PathBuf::from(b);
                let stem = p
                    .file_stem()
                    .map_or_else(|| b.clone(), |s| s.to_string_lossy().into_owned());
                (stem, p)
            }
        };
        let bytes = crate::util::fs::read(&path, crate::util::fs::DATA_CAP)
            .with_context(|| format!("--bench {}", path.display()))?;
        let doc: serde_json::Value = serde_json::from_slice(&bytes)
            .with_context(|| format!("--bench {}: not JSON", path.display()))?;
        if doc.get("runs").is_some() {
            let sw: SweepReport = serde_json::from_value(doc).with_context(|| {
                format!("--bench {}: not a bench --sweep result", path.display())
            })?;
            page.sweeps.push((name, sw));
        } else {
            let r: BenchReport = serde_json::from_value(doc).with_context(|| {
                format!(
                    "--bench {}: not a bench result in the inferscope format (--format vllm and csv files are not read back)",
                    path.display()
                )
            })?;
            page.series.push(Series::of_bench(&name, &r));
        }
    }
    if !args.files.is_empty() {
        let opts = crate::lab::report::ReportOptions {
            files: args.files.clone(),
            by: args.by.clone(),
            purpose: args.purpose.clone(),
            control: None,
            min_samples: args.min_samples,
            max_client_share: args.max_client_share,
            json: false,
            quality: Vec::new(),
            accept: None,
            backends: Vec::new(),
        };
        let mut groups: std::collections::BTreeMap<String, Vec<crate::accesslog::LogLine>> =
            std::collections::BTreeMap::new();
        crate::lab::report::each_line(&opts, |key, line| {
            groups
                .entry(key.to_string())
                .or_default()
                .push(line.clone());
        })?;
        for (key, lines) in &groups {
            page.series
                .push(Series::of_lines(&format!("{} {key}", args.by), lines));
        }
    }
    anyhow::ensure!(
        !page.series.is_empty() || !page.sweeps.is_empty(),
        "--html: nothing to draw (no bench result, no access-log line of the purposes read)"
    );
    std::fs::write(out, crate::lab::html::render(&page))
        .with_context(|| format!("writing {}", out.display()))?;
    eprintln!(
        "wrote {} ({} distributions, {} sweeps)",
        out.display(),
        page.series.len(),
        page.sweeps.len()
    );
    Ok(())
}

/// A report with each configured backend's roofline (`model:` and `gpu:` in `config`) from the
/// logs' lines: appended as text, or as `roofline` in the JSON document.
fn with_rooflines(
    report: String,
    files: &[PathBuf],
    config: &std::path::Path,
    json: bool,
) -> anyhow::Result<String> {
    use crate::stats::roofline;
    let cfg = config::load(config)?;
    let mut lines = Vec::new();
    for f in files {
        let text = crate::util::fs::read_to_string(f, crate::util::fs::DATA_CAP)
            .with_context(|| format!("reading {}", f.display()))?;
        lines.extend(
            text.lines()
                .filter_map(|l| serde_json::from_str::<crate::accesslog::LogLine>(l).ok()),
        );
    }
    let mut found = std::collections::BTreeMap::new();
    let mut out = String::new();
    for b in &cfg.backends {
        let (Some(model), Some(peak)) = (b.model, b.gpu.as_ref().and_then(roofline::Peak::of))
        else {
            continue;
        };
        let (m, n) = roofline::measured_from_log(&lines, &b.name);
        if n == 0 {
            continue;
        }
        let v = roofline::assess(&model, peak, m);
        out.push_str(&format!("\nroofline of {} ({n} requests):\n", b.name));
        for w in v.words() {
            out.push_str(&format!("  {w}\n"));
        }
        found.insert(b.name.clone(), v);
    }
    if !json {
        return Ok(report + &out);
    }
    let mut doc: serde_json::Value = serde_json::from_str(&report)?;
    if let serde_json::Value::Object(m) = &mut doc {
        m.insert("roofline".into(), serde_json::to_value(found)?);
    }
    Ok(serde_json::to_string_pretty(&doc)? + "\n")
}

/// The eval results given to `report --quality`, each checked as the admin API checks a post.
pub(crate) fn read_quality(
    files: &[PathBuf],
) -> anyhow::Result<Vec<crate::experiment::quality::QualityResult>> {
    files
        .iter()
        .map(|f| {
            let bytes = crate::util::fs::read(f, crate::util::fs::DATA_CAP)
                .with_context(|| format!("--quality {}", f.display()))?;
            crate::experiment::quality::QualityResult::parse(&bytes)
                .with_context(|| format!("--quality {}", f.display()))
        })
        .collect()
}

/// `report --accept KEY=VALUE,...`, the keys of an experiment's `accept:`.
pub(crate) fn parse_accept(s: Option<&str>) -> anyhow::Result<Option<crate::config::AcceptConfig>> {
    let Some(s) = s else { return Ok(None) };
    let mut a = crate::config::AcceptConfig::default();
    for pair in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .with_context(|| format!("--accept {pair}: write KEY=VALUE"))?;
        let v: f64 = v
            .trim()
            .parse()
            .ok()
            .filter(|v: &f64| v.is_finite())
            .with_context(|| format!("--accept {pair}: not a number"))?;
        let slot = match k.trim() {
            "ttft_change_max" => &mut a.ttft_change_max,
            "tpot_change_max" => &mut a.tpot_change_max,
            "e2e_change_max" => &mut a.e2e_change_max,
            "accuracy_drop_max_points" => &mut a.accuracy_drop_max_points,
            "ppl_rise_max" => &mut a.ppl_rise_max,
            "energy_change_max" => &mut a.energy_change_max,
            other => anyhow::bail!("--accept {other}: use ttft_change_max, tpot_change_max, e2e_change_max, accuracy_drop_max_points, ppl_rise_max or energy_change_max"),
        };
        *slot = Some(v);
    }
    anyhow::ensure!(a.limits().next().is_some(), "--accept: no limit given");
    Ok(Some(a))
}

/// What `report` was given: access logs, or HdrHistogram exports.
enum ReportSources {
    Logs(Vec<PathBuf>),
    /// Histogram exports, and the quality results the admin URLs among them hold.
    Hdr(Vec<serde_json::Value>, Vec<Posted>),
}

/// A quality result posted to a fleet's replicas (`eval --report-to URL1,URL2`): the experiment
/// it was filed under, the result, and which replicas hold it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
struct Posted {
    experiment: String,
    route: String,
    result: crate::experiment::quality::QualityResult,
    replicas: Vec<String>,
}

/// The quality results each admin URL holds (`GET /experiments`), one entry per distinct result:
/// replicas that took the same post share an entry; a replica holding another result for the
/// same suite shows as its own entry.
fn collect_posted(from: &[(String, serde_json::Value)]) -> anyhow::Result<Vec<Posted>> {
    let mut out: Vec<Posted> = Vec::new();
    for (url, doc) in from {
        for x in doc["experiments"].as_array().into_iter().flatten() {
            for q in x["quality"].as_array().into_iter().flatten() {
                let result: crate::experiment::quality::QualityResult =
                    serde_json::from_value(q.clone())
                        .with_context(|| format!("{url}/experiments: a quality result"))?;
                let (experiment, route) = (
                    x["name"].as_str().unwrap_or_default().to_owned(),
                    x["route"].as_str().unwrap_or_default().to_owned(),
                );
                match out
                    .iter_mut()
                    .find(|p| p.experiment == experiment && p.route == route && p.result == result)
                {
                    Some(p) => p.replicas.push(url.clone()),
                    None => out.push(Posted {
                        experiment,
                        route,
                        result,
                        replicas: vec![url.clone()],
                    }),
                }
            }
        }
    }
    Ok(out)
}

/// The merged histogram report with the replicas' posted quality results: a table after the
/// text, or `quality` in the JSON document.
fn with_posted_quality(
    report: String,
    posted: &[Posted],
    replicas: usize,
    json: bool,
) -> anyhow::Result<String> {
    use std::fmt::Write as _;
    if json {
        let mut doc: serde_json::Value = serde_json::from_str(&report)?;
        if let serde_json::Value::Object(m) = &mut doc {
            m.insert("quality".into(), serde_json::to_value(posted)?);
        }
        return Ok(serde_json::to_string_pretty(&doc)? + "\n");
    }
    if posted.is_empty() {
        return Ok(report);
    }
    let mut out = report;
    out.push_str("\nQuality results posted to the replicas (eval --report-to):\n\n| experiment | suite | kind | variant | value | 95% CI | n | Δ vs control | 95% CI | held by |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for p in posted {
        let r = &p.result;
        let accuracy = r.kind == crate::experiment::quality::QualityKind::Accuracy;
        let (scale, digits, unit, points) = if accuracy {
            (100.0, 1, "%", " pts")
        } else {
            (1.0, 2, "", "")
        };
        let ci = |c: Option<[f64; 2]>, sign: bool| {
            c.map_or_else(
                || "-".to_owned(),
                |[lo, hi]| {
                    if sign {
                        format!("[{:+.digits$}, {:+.digits$}]", lo * scale, hi * scale)
                    } else {
                        format!(
                            "[{:.digits$}{unit}, {:.digits$}{unit}]",
                            lo * scale,
                            hi * scale
                        )
                    }
                },
            )
        };
        for v in &r.variants {
            let (d, dci) = match r.comparison(&v.variant) {
                Some(c) => (
                    format!("{:+.digits$}{points}", c.difference * scale),
                    ci(c.ci95, true),
                ),
                None => ("-".to_owned(), "-".to_owned()),
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {:.digits$}{unit} | {} | {} | {d} | {dci} | {} of {replicas} |",
                p.experiment,
                r.suite,
                if accuracy { "accuracy" } else { "perplexity" },
                v.variant,
                v.value * scale,
                ci(v.ci95, false),
                v.n,
                p.replicas.len()
            );
        }
    }
    if posted.iter().any(|p| p.replicas.len() < replicas) {
        out.push_str("\nA result held by fewer than every replica was posted to some of them only (or differs between them): post to all (eval --report-to URL1,URL2,…).\n");
    }
    Ok(out)
}

/// Reads every source: an admin URL is fetched at `/stats?format=hdr`; a file holding one JSON
/// document of that format is an export; any other file is an access log. Mixing the two is an
/// error (a log's samples and a histogram's buckets do not add up to one population).
fn read_report_sources(
    sources: &[String],
    token: Option<&str>,
    ca_file: Option<PathBuf>,
) -> anyhow::Result<ReportSources> {
    let mut logs = Vec::new();
    let mut docs = Vec::new();
    let mut experiments = Vec::new();
    let urls: Vec<&String> = sources
        .iter()
        .filter(|s| s.starts_with("http://") || s.starts_with("https://"))
        .collect();
    if !urls.is_empty() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        for u in &urls {
            let doc = rt.block_on(fetch_json(u, "/stats?format=hdr", token, ca_file.clone()))?;
            docs.push(doc);
            let x = rt.block_on(fetch_json(u, "/experiments", token, ca_file.clone()))?;
            experiments.push(((*u).clone(), x));
        }
    }
    for s in sources.iter().filter(|s| !urls.contains(s)) {
        let path = PathBuf::from(s);
        let text = crate::util::fs::read_to_string(&path, crate::util::fs::DATA_CAP)
            .with_context(|| s.clone())?;
        match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(v) if v["format"] == crate::stats::hdr::FORMAT => docs.push(v),
            _ => logs.push(path),
        }
    }
    match (logs.is_empty(), docs.is_empty()) {
        (false, false) => anyhow::bail!(
            "give access logs or /stats?format=hdr exports (admin URLs), not both: a log's samples and a histogram's buckets are not one population"
        ),
        (true, _) => Ok(ReportSources::Hdr(docs, collect_posted(&experiments)?)),
        (false, true) => Ok(ReportSources::Logs(logs)),
    }
}
