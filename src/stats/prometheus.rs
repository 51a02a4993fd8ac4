//! Prometheus text exposition rendered from the same HdrHistograms as `/stats`.
//!
//! Histogram buckets use the OpenTelemetry GenAI recommended boundaries: TTFT boundaries for the
//! time-to-first-token/chunk histograms, TPOT boundaries for TPOT and ITL, the
//! `gen_ai.server.request.duration` boundaries for end-to-end latency.

use super::{Hist, Snapshot, Tally};
use crate::meter::Outcome;
use std::fmt::Write;

/// `gen_ai.server.time_to_first_token` advisory boundaries (seconds).
pub const TTFT_BOUNDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];
/// `gen_ai.server.time_per_output_token` advisory boundaries (seconds).
pub const TPOT_BOUNDS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
];
/// `gen_ai.server.request.duration` advisory boundaries (seconds).
pub const DURATION_BOUNDS: &[f64] = &[
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];
/// Gateway overhead: sub-millisecond resolution matters here.
pub const OVERHEAD_BOUNDS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
];

/// One gateway-wide sample appended after the per-group series.
#[derive(Debug, Clone, Copy)]
pub struct Scalar {
    /// Metric name (with `inferscope_` prefix).
    pub name: &'static str,
    /// `counter` or `gauge`.
    pub kind: &'static str,
    /// HELP text.
    pub help: &'static str,
    /// Value.
    pub value: f64,
}

/// Renders the snapshot and the gateway-wide scalars as Prometheus text format 0.0.4.
pub fn render(snap: &Snapshot, scalars: &[Scalar]) -> String {
    let mut out = String::with_capacity(8192);
    let groups: Vec<(String, &Tally)> = snap
        .groups
        .iter()
        .map(|(k, c, _)| {
            let labels = format!(
                "route=\"{}\",model=\"{}\",backend=\"{}\",variant=\"{}\"",
                esc(&k.route),
                esc(&k.model),
                esc(&k.backend),
                esc(&k.variant)
            );
            (labels, c)
        })
        .collect();

    header(
        &mut out,
        "inferscope_requests_total",
        "counter",
        "Requests finished, by outcome.",
    );
    for (labels, t) in &groups {
        for o in Outcome::ALL {
            let n = t.outcomes[o.index()];
            if n > 0 {
                let _ = writeln!(
                    out,
                    "inferscope_requests_total{{{labels},outcome=\"{}\"}} {n}",
                    o.as_str()
                );
            }
        }
    }
    header(
        &mut out,
        "inferscope_input_tokens_total",
        "counter",
        "Prompt tokens of finished requests.",
    );
    for (labels, t) in &groups {
        let _ = writeln!(
            out,
            "inferscope_input_tokens_total{{{labels}}} {}",
            t.input_tokens
        );
    }
    header(
        &mut out,
        "inferscope_output_tokens_total",
        "counter",
        "Output tokens of finished requests.",
    );
    for (labels, t) in &groups {
        let _ = writeln!(
            out,
            "inferscope_output_tokens_total{{{labels}}} {}",
            t.output_tokens
        );
    }
    header(
        &mut out,
        "inferscope_malformed_events_total",
        "counter",
        "Streamed events that were not the expected JSON (forwarded untouched).",
    );
    for (labels, t) in &groups {
        let _ = writeln!(
            out,
            "inferscope_malformed_events_total{{{labels}}} {}",
            t.malformed_events
        );
    }

    let hists: [(&str, &str, usize, &[f64]); 6] = [
        ("inferscope_time_to_first_token_seconds", "Time from request accepted to the first output event (TTFT).", 0, TTFT_BOUNDS),
        ("inferscope_time_to_first_chunk_seconds", "Time from request accepted to the first streamed event of any kind (TTFC).", 1, TTFT_BOUNDS),
        ("inferscope_time_per_output_token_seconds", "Mean time per output token after the first (TPOT).", 2, TPOT_BOUNDS),
        ("inferscope_inter_token_latency_seconds", "Gap between successive output events (ITL).", 3, TPOT_BOUNDS),
        ("inferscope_request_duration_seconds", "Time from request accepted to the end of the response body (E2E).", 4, DURATION_BOUNDS),
        ("inferscope_gateway_overhead_seconds", "Time the gateway added: request handling before the upstream send plus frame observation.", 5, OVERHEAD_BOUNDS),
    ];
    for (name, help, idx, bounds) in hists {
        header(&mut out, name, "histogram", help);
        for (labels, t) in &groups {
            histogram(&mut out, name, labels, &t.hists[idx], bounds);
        }
    }
    for s in scalars {
        header(&mut out, s.name, s.kind, s.help);
        let _ = writeln!(out, "{} {}", s.name, s.value);
    }
    out
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn histogram(out: &mut String, name: &str, labels: &str, h: &Hist, bounds: &[f64]) {
    let count = h.count();
    if count == 0 {
        return;
    }
    for le in bounds {
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels},le=\"{le}\"}} {}",
            h.count_le(*le)
        );
    }
    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {count}");
    let _ = writeln!(out, "{name}_sum{{{labels}}} {}", h.sum_seconds());
    let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
}

/// Escapes a label value (backslash, quote, newline).
fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn buckets_are_cumulative_and_end_at_count() {
        let mut h = Hist::default();
        for ms in [3, 30, 300, 3000] {
            h.record(Duration::from_millis(ms));
        }
        let mut out = String::new();
        histogram(&mut out, "x", "a=\"b\"", &h, TTFT_BOUNDS);
        assert!(out.contains("x_bucket{a=\"b\",le=\"0.005\"} 1\n"), "{out}");
        assert!(out.contains("x_bucket{a=\"b\",le=\"0.04\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{a=\"b\",le=\"0.5\"} 3\n"), "{out}");
        assert!(out.contains("x_bucket{a=\"b\",le=\"+Inf\"} 4\n"), "{out}");
        assert!(out.contains("x_sum{a=\"b\"} 3.333\n"), "{out}");
    }
}
