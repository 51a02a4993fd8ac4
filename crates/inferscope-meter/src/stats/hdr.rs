//! `GET /stats?format=hdr`: every group's cumulative tally with its HdrHistograms serialized
//! (HdrHistogram V2 + deflate, base64, as HdrHistogram's interval logs carry them), so replicas'
//! numbers can be merged exactly — the merged p99 of a fleet is the p99 of all its requests, not
//! an average of p99s. `inferscope report --merge` reads these documents (from files or admin
//! URLs) and merges them.

use super::{GroupKey, Hist, Snapshot, Tally, METRICS};
use crate::Outcome;
use base64::Engine;
use hdrhistogram::serialization::{Deserializer, Serializer, V2DeflateSerializer};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The document's `format` value.
pub const FORMAT: &str = "inferscope-hdr";
/// The document's `version`.
pub(crate) const VERSION: u64 = 1;

/// A document that is not an inferscope HdrHistogram export.
#[derive(Debug, thiserror::Error)]
pub enum HdrError {
    /// Not JSON, or not the format.
    #[error("not an inferscope /stats?format=hdr document ({0})")]
    NotHdr(String),
    /// A histogram that does not decode.
    #[error("group {group}: {metric}: {why}")]
    Histogram {
        /// The group's labels.
        group: String,
        /// The metric.
        metric: String,
        /// What is wrong with the histogram (not base64, not deflate, not a V2 histogram).
        why: String,
    },
}

fn encode(h: &hdrhistogram::Histogram<u64>, ser: &mut V2DeflateSerializer) -> Option<String> {
    let mut buf = Vec::new();
    ser.serialize(h, &mut buf).ok()?;
    Some(base64::engine::general_purpose::STANDARD.encode(buf))
}

/// A `/stats?format=hdr` document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct HdrDoc {
    /// `inferscope-hdr` (`FORMAT`).
    pub format: String,
    /// The format's version (`1`).
    pub version: u64,
    /// How the histograms are encoded, in words.
    #[serde(default)]
    pub encoding: String,
    /// Seconds the exporting gateway had been up.
    #[serde(default)]
    pub uptime_s: f64,
    /// One entry per group.
    #[serde(default)]
    pub groups: Vec<HdrGroup>,
}

/// One group of an export: its labels, counters, and each metric's histogram.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct HdrGroup {
    /// Route name.
    #[serde(default = "none")]
    pub route: String,
    /// Requested model.
    #[serde(default = "none")]
    pub model: String,
    /// Backend name.
    #[serde(default = "none")]
    pub backend: String,
    /// Experiment variant.
    #[serde(default = "none")]
    pub variant: String,
    /// Purpose (exports older than it: live).
    #[serde(default)]
    pub purpose: Option<String>,
    /// Streamed (exports older than it: streamed).
    #[serde(default = "streamed")]
    pub stream: bool,
    /// Requests recorded in the group, every outcome.
    #[serde(default)]
    pub requests: u64,
    /// Requests by outcome (outcomes seen only).
    #[serde(default)]
    pub outcomes: BTreeMap<String, u64>,
    /// Prompt tokens.
    #[serde(default)]
    pub input_tokens: u64,
    /// Output tokens.
    #[serde(default)]
    pub output_tokens: u64,
    /// Stream events that could not be parsed.
    #[serde(default)]
    pub malformed_events: u64,
    /// Requests judged against the objectives.
    #[serde(default)]
    pub slo_evaluated: u64,
    /// Of those, the ones that met them.
    #[serde(default)]
    pub slo_met: u64,
    /// Each metric's histogram, V2 + deflate, base64 (`METRICS` names; recorded ones only).
    #[serde(default)]
    pub histograms: BTreeMap<String, String>,
    /// Each metric's exact sum, microseconds.
    #[serde(default)]
    pub sums_us: BTreeMap<String, u64>,
}

fn none() -> String {
    crate::NONE.to_string()
}

fn streamed() -> bool {
    true
}

/// The export of a snapshot's cumulative tallies.
pub fn export(snap: &Snapshot) -> HdrDoc {
    let mut ser = V2DeflateSerializer::new();
    let groups = snap
        .groups
        .iter()
        .map(|(k, t, _)| {
            let mut histograms = BTreeMap::new();
            let mut sums_us = BTreeMap::new();
            for (name, h) in METRICS.iter().zip(&t.hists) {
                if let Some(enc) = h.histogram().and_then(|h| encode(h, &mut ser)) {
                    histograms.insert((*name).to_string(), enc);
                    sums_us.insert((*name).to_string(), h.sum_us());
                }
            }
            HdrGroup {
                route: k.route.to_string(),
                model: k.model.to_string(),
                backend: k.backend.to_string(),
                variant: k.variant.to_string(),
                purpose: Some(k.purpose.as_str().to_string()),
                stream: k.stream,
                requests: t.requests,
                outcomes: Outcome::ALL
                    .iter()
                    .filter(|o| t.outcomes[o.index()] > 0)
                    .map(|o| (o.as_str().to_string(), t.outcomes[o.index()]))
                    .collect(),
                input_tokens: t.input_tokens,
                output_tokens: t.output_tokens,
                malformed_events: t.malformed_events,
                slo_evaluated: t.slo_evaluated,
                slo_met: t.slo_met,
                histograms,
                sums_us,
            }
        })
        .collect();
    HdrDoc {
        format: FORMAT.to_string(),
        version: VERSION,
        encoding: "HdrHistogram V2 + deflate, base64; values in microseconds".to_string(),
        uptime_s: snap.uptime,
        groups,
    }
}

/// Reads an export (as JSON) back into tallies by group.
pub fn import(doc: &Value) -> Result<Vec<(GroupKey, Tally)>, HdrError> {
    let format = doc.get("format").cloned().unwrap_or(Value::Null);
    if format != FORMAT {
        return Err(HdrError::NotHdr(format!(
            "format is {format}, not {FORMAT:?}"
        )));
    }
    let doc = HdrDoc::deserialize(doc).map_err(|e| HdrError::NotHdr(e.to_string()))?;
    if doc.version != VERSION {
        return Err(HdrError::NotHdr(format!(
            "version {} (this build reads {VERSION})",
            doc.version
        )));
    }
    let mut de = Deserializer::new();
    let mut out = Vec::new();
    for g in doc.groups {
        let key = GroupKey {
            route: g.route.into(),
            model: g.model.into(),
            backend: g.backend.into(),
            variant: g.variant.into(),
            purpose: g
                .purpose
                .as_deref()
                .and_then(crate::Purpose::parse)
                .unwrap_or_default(),
            stream: g.stream,
        };
        let mut t = Tally {
            requests: g.requests,
            input_tokens: g.input_tokens,
            output_tokens: g.output_tokens,
            malformed_events: g.malformed_events,
            slo_evaluated: g.slo_evaluated,
            slo_met: g.slo_met,
            ..Tally::default()
        };
        for o in Outcome::ALL {
            t.outcomes[o.index()] = g.outcomes.get(o.as_str()).copied().unwrap_or(0);
        }
        for (i, name) in METRICS.iter().enumerate() {
            let Some(b64) = g.histograms.get(*name) else {
                continue;
            };
            let fail = |why: String| HdrError::Histogram {
                group: format!(
                    "{}/{}/{}/{}",
                    key.route, key.model, key.backend, key.variant
                ),
                metric: (*name).into(),
                why,
            };
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| fail(e.to_string()))?;
            let h: hdrhistogram::Histogram<u64> = de
                .deserialize(&mut bytes.as_slice())
                .map_err(|e| fail(format!("{e:?}")))?;
            t.hists[i] = Hist::from_parts(h, g.sums_us.get(*name).copied().unwrap_or(0));
        }
        out.push((key, t));
    }
    Ok(out)
}

/// Merges imported exports: tallies of the same labels are added.
pub fn merge(parts: impl IntoIterator<Item = Vec<(GroupKey, Tally)>>) -> BTreeMap<GroupKey, Tally> {
    let mut all: BTreeMap<GroupKey, Tally> = BTreeMap::new();
    for part in parts {
        for (k, t) in part {
            all.entry(k).or_default().merge(&t);
        }
    }
    all
}

/// Rolls merged groups up by one label (`route`, `model`, `backend`, `variant`, `stream`, or
/// `all`: live traffic; `purpose`: every purpose's own).
pub fn rollup(groups: &BTreeMap<GroupKey, Tally>, by: &str) -> BTreeMap<Arc<str>, Tally> {
    let mut out: BTreeMap<Arc<str>, Tally> = BTreeMap::new();
    for (k, t) in groups {
        let name = match by {
            "purpose" => Arc::from(k.purpose.as_str()),
            _ if k.purpose != crate::Purpose::Live => continue,
            "stream" => Arc::from(k.stream_label()),
            "route" => Arc::clone(&k.route),
            "model" => Arc::clone(&k.model),
            "backend" => Arc::clone(&k.backend),
            "variant" => Arc::clone(&k.variant),
            _ => Arc::from("all"),
        };
        out.entry(name).or_default().merge(t);
    }
    out
}

/// `inferscope report --merge` over exports: per group of `by`, the merged counts and exact
/// percentiles (table, or JSON with `json`). Verdicts need samples, which histograms are not:
/// with a `control`, the report says to merge the replicas' access logs instead.
pub fn report(
    docs: &[Value],
    by: &str,
    control: Option<&str>,
    json_out: bool,
) -> Result<String, HdrError> {
    use std::fmt::Write;
    if ![
        "variant", "backend", "model", "route", "purpose", "stream", "all",
    ]
    .contains(&by)
    {
        return Err(HdrError::NotHdr(format!(
            "--by {by}: use variant, backend, model, route, purpose, stream or all"
        )));
    }
    let parts = docs.iter().map(import).collect::<Result<Vec<_>, _>>()?;
    let merged = merge(parts);
    let groups = rollup(&merged, by);
    if json_out {
        /// One merged group: its name under `by` and its counts and percentiles (no rates:
        /// the replicas' spans differ).
        #[derive(Serialize)]
        struct Row<'a> {
            #[serde(flatten)]
            name: BTreeMap<&'a str, &'a str>,
            #[serde(flatten)]
            stats: super::TallyStats,
        }
        #[derive(Serialize)]
        struct Merged<'a> {
            by: &'a str,
            replicas: usize,
            groups: Vec<Row<'a>>,
        }
        let doc = Merged {
            by,
            replicas: docs.len(),
            groups: groups
                .iter()
                .map(|(name, t)| Row {
                    name: BTreeMap::from([(by, name.as_ref())]),
                    stats: t.stats(None),
                })
                .collect(),
        };
        let doc = serde_json::to_string_pretty(&doc).unwrap_or_default();
        return Ok(format!("{doc}\n"));
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| {by} | requests | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms | ITL p50 ms | ITL p99 ms | E2E p99 ms | goodput | error rate |"
    );
    let _ = writeln!(out, "|{}", "---|".repeat(11));
    for (name, t) in &groups {
        let q = |i: usize, p: f64| {
            t.hists[i]
                .histogram()
                .filter(|h| !h.is_empty())
                .map_or_else(
                    || "-".to_string(),
                    |h| {
                        format!(
                            "{:.2}",
                            crate::util::quantile::us_to_ms(h.value_at_quantile(p))
                        )
                    },
                )
        };
        let goodput = if t.slo_evaluated > 0 {
            format!("{:.1}%", 100.0 * t.slo_met as f64 / t.slo_evaluated as f64)
        } else {
            "-".into()
        };
        let rate = 100.0 * Outcome::error_rate(&t.outcomes, t.requests);
        let _ = writeln!(
            out,
            "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {goodput} | {rate:.2}% |",
            t.requests,
            q(0, 0.5),
            q(0, 0.99),
            q(2, 0.5),
            q(2, 0.99),
            q(3, 0.5),
            q(3, 0.99),
            q(4, 0.99)
        );
    }
    let _ = writeln!(
        out,
        "\nMerged from {} replica export(s): exact HdrHistogram sums (3 significant digits).",
        docs.len()
    );
    if control.is_some() {
        let _ = writeln!(
            out,
            "No verdicts from histograms: comparisons resample requests. For the fleet's verdict, merge the replicas' access logs: inferscope report --merge A.jsonl B.jsonl --control …"
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn an_export_reads_back_to_the_same_percentiles_and_merges_exactly() {
        let key = |v: &str| GroupKey {
            route: "r".into(),
            model: "m".into(),
            backend: "b".into(),
            variant: v.into(),
            purpose: crate::Purpose::Live,
            stream: true,
        };
        let tally = |from: u64, n: u64| {
            let mut t = Tally::default();
            for i in 0..n {
                t.requests += 1;
                t.hists[0].record(Duration::from_micros(from + i * 37));
            }
            t
        };
        let snap = |t: Tally| Snapshot {
            uptime: 1.0,
            groups: vec![(key("a"), t, Tally::default())],
        };
        let (a, b) = (tally(1_000, 500), tally(40_000, 700));
        let json = |d: HdrDoc| serde_json::to_value(d).unwrap_or_default();
        let (ea, eb) = (
            json(export(&snap(a.clone()))),
            json(export(&snap(b.clone()))),
        );
        let text = ea.to_string();
        let back = import(&serde_json::from_str(&text).unwrap_or_default()).unwrap_or_default();
        assert_eq!(back[0].1.hists[0].summary_ms(), a.hists[0].summary_ms());
        let merged = merge([
            import(&ea).unwrap_or_default(),
            import(&eb).unwrap_or_default(),
        ]);
        let mut truth = a;
        truth.merge(&b);
        let m = &merged[&key("a")];
        assert_eq!(m.requests, 1200);
        assert_eq!(m.hists[0].summary_ms(), truth.hists[0].summary_ms());
        assert_eq!(m.hists[0].sum_seconds(), truth.hists[0].sum_seconds());
        assert!(matches!(
            import(&serde_json::json!({"format": "x"})),
            Err(HdrError::NotHdr(_))
        ));
    }
}
