//! `inferscope report FILE.jsonl`: the table a benchmark write-up needs, from an access log —
//! TTFT, TPOT, tokens/s, P99, error rate per variant (or backend, model, route), with model,
//! backend and variant labels — and, given a control, the comparison of each group with it.

use crate::accesslog::LogLine;
use crate::experiment::{summarize, Arm, Summary};
use crate::meter::Purpose;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::path::PathBuf;
use std::sync::Arc;

/// What to report.
#[derive(Debug, Clone)]
pub struct ReportOptions {
    /// The access logs (several: one population, e.g. a fleet's replicas).
    pub files: Vec<PathBuf>,
    /// Grouping label: `variant`, `backend`, `model`, `route`, `purpose` or `stream`.
    pub by: String,
    /// Which traffic to read (`None`: live and shadow copies; `all`; or one purpose).
    pub purpose: Option<String>,
    /// Group compared against (e.g. the experiment's control variant).
    pub control: Option<String>,
    /// Fixed horizon for verdicts.
    pub min_samples: usize,
    /// One client's largest share of a group's requests in a comparison (the experiment's
    /// `max_client_share`).
    pub max_client_share: f64,
    /// JSON instead of a table: per group the labels, counts and every metric's p50/p90/p99,
    /// and the comparisons (the `/experiments` shape).
    pub json: bool,
    /// Eval results (`inferscope eval --json`) joined to the latency comparison, per variant.
    pub quality: Vec<crate::experiment::quality::QualityResult>,
    /// Limits the joined verdict is judged against (an experiment's `accept:`).
    pub accept: Option<crate::config::AcceptConfig>,
    /// The gateway's backends (`--config`): each group's cost per million output tokens, from
    /// the `price:` of the backends its lines name.
    pub backends: Vec<crate::config::BackendConfig>,
}

/// What `--by` accepts.
const GROUPINGS: [&str; 6] = ["variant", "backend", "model", "route", "purpose", "stream"];

/// A line's purpose: its `purpose`, or for logs written before it existed, `shadow` when marked
/// so and else `live`.
fn line_purpose(v: &LogLine) -> Purpose {
    match v.purpose.as_deref() {
        Some(p) => Purpose::parse(p).unwrap_or(Purpose::Live),
        None if v.shadow => Purpose::Shadow,
        None => Purpose::Live,
    }
}

/// Why no report could be made.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// Not one of the labels.
    #[error("--by {0}: use variant, backend, model, route, purpose or stream")]
    BadGrouping(String),
    /// Not a purpose.
    #[error("--purpose {0}: use live, shadow, eval, bench or all")]
    BadPurpose(String),
    /// The log could not be read.
    #[error("{}: {error}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
    /// The file holds no access-log lines.
    #[error("{}: no access-log lines", .0.display())]
    Empty(PathBuf),
    /// Eval results or limits without what they need.
    #[error("{0}")]
    Quality(String),
    /// `--control` names no group.
    #[error("--control {control}: no such {by} in the log")]
    NoControl {
        /// The control given.
        control: String,
        /// The grouping label.
        by: String,
    },
}

/// `--json`: the groups (each with its labels and the `/experiments` per-variant fields), the
/// verdicts where asked for, the comparisons, and what was skipped or left out.
#[derive(serde::Serialize)]
struct JsonReport<'a> {
    by: &'a str,
    groups: Vec<serde_json::Map<String, serde_json::Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    verdicts: Option<Vec<crate::experiment::quality::VerdictRow>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    quality: Option<&'a [crate::experiment::quality::QualityResult]>,
    comparisons: Vec<crate::experiment::Comparison>,
    method: String,
    skipped_lines: u64,
    left_out: BTreeMap<&'static str, u64>,
}

/// Reads `o.files` line by line: each access-log line of the purposes `o` wants, with the
/// group it falls in by `o.by`, goes to `each`; returns what was left out, by reason. A line that
/// is not an access-log line is skipped (the first three are named on standard error).
pub fn each_line(
    o: &ReportOptions,
    mut each: impl FnMut(Arc<str>, &LogLine),
) -> Result<BTreeMap<&'static str, u64>, ReportError> {
    if !GROUPINGS.contains(&o.by.as_str()) {
        return Err(ReportError::BadGrouping(o.by.clone()));
    }
    // Which purposes are read: live traffic and shadow copies unless told otherwise (everything
    // when grouping by purpose).
    let wanted: Vec<Purpose> = match o.purpose.as_deref() {
        None if o.by == "purpose" => Purpose::ALL.to_vec(),
        None => vec![Purpose::Live, Purpose::Shadow],
        Some("all") => Purpose::ALL.to_vec(),
        Some(p) => vec![Purpose::parse(p).ok_or_else(|| ReportError::BadPurpose(p.into()))?],
    };
    let keep_forced = o.by != "variant" || o.purpose.as_deref() == Some("all");
    let mut left_out: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut bad = 0;
    for file in &o.files {
        let text =
            crate::util::fs::read_to_string(file, crate::util::fs::DATA_CAP).map_err(|error| {
                ReportError::Read {
                    path: file.clone(),
                    error,
                }
            })?;
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let Ok(v) = serde_json::from_str::<LogLine>(line) else {
                bad += 1;
                if bad <= 3 {
                    eprintln!(
                        "warning: {}:{}: not an access-log line, skipped",
                        file.display(),
                        i + 1
                    );
                }
                continue;
            };
            let purpose = line_purpose(&v);
            if !wanted.contains(&purpose) {
                *left_out.entry(purpose.as_str()).or_default() += 1;
                continue;
            }
            if !keep_forced && v.variant_forced {
                *left_out.entry("variant_forced").or_default() += 1;
                continue;
            }
            let label = |l: &Option<String>| l.as_deref().unwrap_or("-").to_string();
            let key: Arc<str> = match o.by.as_str() {
                "purpose" => purpose.as_str().into(),
                "stream" => match v.stream {
                    Some(true) => "streamed".into(),
                    Some(false) => "unstreamed".into(),
                    None => "-".into(),
                },
                "route" => label(&v.route).into(),
                "model" => label(&v.model).into(),
                "backend" => label(&v.backend).into(),
                _ => label(&v.variant).into(),
            };
            each(key, &v);
        }
    }
    if bad > 0 {
        left_out.insert("not_log_lines", bad);
    }
    Ok(left_out)
}

/// Builds the report text, or says what is wrong with the file.
pub fn report(o: &ReportOptions) -> Result<String, ReportError> {
    let mut arms: BTreeMap<Arc<str>, Arm> = BTreeMap::new();
    let mut labels: BTreeMap<Arc<str>, [BTreeSet<String>; 3]> = BTreeMap::new();
    let mut left_out = each_line(o, |key, v| {
        let label = |l: &Option<String>| l.as_deref().unwrap_or("-").to_string();
        let seed = crate::util::stable_hash(key.as_bytes());
        arms.entry(Arc::clone(&key))
            .or_insert_with(|| Arm::new(seed))
            .record_line(v);
        let l = labels.entry(key).or_default();
        for (j, k) in [&v.model, &v.backend, &v.variant].into_iter().enumerate() {
            l[j].insert(label(k));
        }
    })?;
    let bad = left_out.remove("not_log_lines").unwrap_or(0);
    if arms.is_empty() {
        return Err(ReportError::Empty(
            o.files.first().cloned().unwrap_or_default(),
        ));
    }
    if let Some(control) = &o.control {
        if !arms.contains_key(control.as_str()) {
            return Err(ReportError::NoControl {
                control: control.clone(),
                by: o.by.clone(),
            });
        }
    }
    let asked = !o.quality.is_empty() || o.accept.is_some();
    if asked {
        let Some(control) = o.control.as_deref().filter(|_| o.by == "variant") else {
            return Err(ReportError::Quality(
                "--quality and --accept join eval results to variants: give --by variant and --control".into(),
            ));
        };
        if let Some(q) = o.quality.iter().find(|q| q.control != control) {
            return Err(ReportError::Quality(format!(
                "eval result {:?} has control `{}`, not --control {control}",
                q.suite, q.control
            )));
        }
    }
    let prices: BTreeMap<String, crate::experiment::quality::VariantPrice> = labels
        .iter()
        .filter_map(|(group, l)| {
            let backends: Option<Vec<&crate::config::BackendConfig>> = l[1]
                .iter()
                .map(|name| o.backends.iter().find(|b| b.name == *name))
                .collect();
            Some((
                group.to_string(),
                crate::experiment::quality::VariantPrice::of(&backends?)?,
            ))
        })
        .collect();
    // Verdict rows: when asked for, or when there is a cost to show beside the latency.
    let joined = o.by == "variant" && o.control.is_some() && (asked || !prices.is_empty());
    let summary = |control: &str| {
        let mut s = summarize(
            "report",
            control,
            &arms,
            crate::experiment::Horizon {
                min_samples: o.min_samples,
                max_client_share: o.max_client_share,
            },
        );
        crate::experiment::quality::add_costs(&mut s, &prices);
        s
    };
    let verdicts = |summary: &Summary| {
        crate::experiment::quality::verdicts(
            summary,
            &o.quality,
            &[],
            None,
            o.accept.as_ref(),
            crate::experiment::quality::ResultsFrom::Files,
        )
    };
    // The label columns other than the grouping one (which is the first column already).
    let label_cols: Vec<(usize, &str)> = ["model", "backend", "variant"]
        .into_iter()
        .enumerate()
        .filter(|(_, l)| *l != o.by)
        .collect();
    let join = |s: &BTreeSet<String>| s.iter().cloned().collect::<Vec<_>>();
    if o.json {
        let doc = summary(o.control.as_deref().unwrap_or(""));
        let verdicts = joined.then(|| verdicts(&doc));
        // Each group: the `/experiments` per-variant fields, its grouping label, and every
        // value of the other labels its lines name (`variant` among them when grouping by
        // something else: then it is that list).
        let groups = doc
            .variants
            .iter()
            .map(|g| {
                let serde_json::Value::Object(mut m) = serde_json::to_value(g).unwrap_or_default()
                else {
                    return serde_json::Map::new();
                };
                if let Some(l) = labels.get(g.variant.as_str()) {
                    m.insert(o.by.clone(), g.variant.clone().into());
                    for (j, name) in &label_cols {
                        m.insert((*name).to_string(), join(&l[*j]).into());
                    }
                }
                m
            })
            .collect();
        let report = JsonReport {
            by: &o.by,
            groups,
            quality: verdicts.as_ref().map(|_| o.quality.as_slice()),
            verdicts,
            comparisons: doc.comparisons,
            method: doc.method,
            skipped_lines: bad,
            left_out,
        };
        return Ok(format!(
            "{}\n",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        ));
    }
    let mut out = String::new();
    let mut head = format!("| {} |", o.by);
    for (_, name) in &label_cols {
        head.push_str(&format!(" {name} |"));
    }
    head.push_str(" requests | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms | ITL p50 ms | ITL p99 ms | E2E p99 ms | tokens/s | error rate |");
    let _ = writeln!(out, "{head}");
    let _ = writeln!(out, "|{}", "---|".repeat(label_cols.len() + 11));
    for (k, a) in &arms {
        let q = |i: usize, p: f64| {
            let mut s = a.samples[i].values();
            s.sort_unstable_by(f64::total_cmp);
            crate::util::quantile::of_sorted_ms(&s, p)
                .map_or_else(|| "-".to_string(), |v| format!("{v:.2}"))
        };
        let l = &labels[k];
        let mut row = format!("| {k} |");
        for (j, _) in &label_cols {
            row.push_str(&format!(" {} |", join(&l[*j]).join(", ")));
        }
        let _ = writeln!(
            out,
            "{row} {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.2}% |",
            a.requests,
            q(0, 0.5),
            q(0, 0.99),
            q(2, 0.5),
            q(2, 0.99),
            q(3, 0.5),
            q(3, 0.99),
            if a.samples[4].seen() > 0 {
                q(4, 0.99)
            } else {
                q(5, 0.99)
            },
            a.tokens_per_s(),
            a.error_rate() * 100.0
        );
    }
    if let Some(control) = &o.control {
        let s = summary(control);
        let _ = writeln!(out, "\nCompared with {control} ({}):", s.method);
        for c in &s.comparisons {
            let _ = writeln!(out, "- {}", c.verdict);
        }
        if joined {
            let _ = writeln!(out, "\nVerdict (latency, quality, throughput):");
            for v in verdicts(&s) {
                let _ = writeln!(out, "- {}", v.row);
                for c in &v.checks {
                    let _ = writeln!(
                        out,
                        "  - {} {}: {}: {} ({})",
                        c.limit,
                        serde_json::Value::from(c.max),
                        c.observed,
                        c.state.as_str(),
                        c.why
                    );
                }
            }
        }
    }
    if !left_out.is_empty() {
        let what: Vec<String> = left_out.iter().map(|(k, n)| format!("{n} {k}")).collect();
        let _ = writeln!(
            out,
            "\nLeft out: {} (an eval's or a benchmark's requests are not live traffic, a forced variant is not a random draw; --purpose all reads them)",
            what.join(", ")
        );
    }
    if bad > 0 {
        let _ = writeln!(
            out,
            "\n({bad} lines were not access-log lines and were skipped)"
        );
    }
    Ok(out)
}
