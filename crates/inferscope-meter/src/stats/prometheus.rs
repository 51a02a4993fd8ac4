//! Prometheus text exposition rendered from the same HdrHistograms as `/stats`.
//!
//! Histogram buckets use the OpenTelemetry GenAI recommended boundaries: TTFT boundaries for the
//! time-to-first-token/chunk histograms, TPOT boundaries for TPOT and ITL, the
//! `gen_ai.server.request.duration` boundaries for end-to-end latency.

use super::{Snapshot, Tally};
use crate::util::prometheus::{Labels, Native, Writer};
use crate::Outcome;

/// Native histogram resolution: 2^5 = 32 buckets per power of two, each 2.2% wide (a quantile
/// from them is within 2.2% of the exact one; the classic GenAI buckets are up to 2.5× wide).
pub const NATIVE_SCHEMA: i32 = 5;

/// Values at or below this are counted as zero (none are: the histograms start at 1 µs).
const NATIVE_ZERO_THRESHOLD: f64 = 1e-9;

/// The native histogram of an HdrHistogram of microseconds, in seconds: each HdrHistogram
/// bucket (0.1% wide) falls into the native bucket holding its middle value.
pub fn native(h: &hdrhistogram::Histogram<u64>) -> Native {
    let scale = f64::from(1u32 << NATIVE_SCHEMA);
    let mut buckets: Vec<(i32, u64)> = Vec::new();
    let mut zero = 0;
    for v in h.iter_recorded() {
        let secs = h.median_equivalent(v.value_iterated_to()) as f64 / 1e6;
        let n = v.count_at_value();
        if secs <= NATIVE_ZERO_THRESHOLD {
            zero += n;
            continue;
        }
        // Bucket i holds (2^((i-1)/scale), 2^(i/scale)].
        let i = (secs.log2() * scale).ceil() as i32;
        match buckets.last_mut() {
            Some((last, c)) if *last == i => *c += n,
            _ => buckets.push((i, n)),
        }
    }
    Native::from_buckets(NATIVE_SCHEMA, NATIVE_ZERO_THRESHOLD, zero, &buckets)
}

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
pub(crate) const OVERHEAD_BOUNDS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
];

/// The gateway's own delays: from tens of microseconds (idle host) to seconds (starved host).
pub const LAG_BOUNDS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5,
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
    /// The current value (a counter's total, a gauge's level).
    pub value: f64,
}

/// Renders the snapshot and the gateway-wide scalars as Prometheus text format 0.0.4.
pub fn render(snap: &Snapshot, scalars: &[Scalar]) -> String {
    let mut w = Writer::new();
    write(&mut w, snap, scalars);
    w.finish()
}

/// Writes the snapshot's series and the scalars into `w`.
pub fn write(w: &mut Writer, snap: &Snapshot, scalars: &[Scalar]) {
    let groups: Vec<(Labels, &Tally)> = snap
        .groups
        .iter()
        .map(|(k, c, _)| {
            let labels = Labels::new(&[
                ("route", &k.route),
                ("model", &k.model),
                ("backend", &k.backend),
                ("variant", &k.variant),
                ("purpose", k.purpose.as_str()),
                ("stream", k.stream_label()),
            ]);
            (labels, c)
        })
        .collect();

    w.family(
        "inferscope_requests_total",
        "counter",
        "Requests finished, by outcome.",
    );
    for (labels, t) in &groups {
        for o in Outcome::ALL {
            let n = t.outcomes[o.index()];
            if n > 0 {
                w.sample_with(
                    "inferscope_requests_total",
                    labels,
                    Some(("outcome", o.as_str())),
                    n,
                );
            }
        }
    }
    type Count = fn(&Tally) -> u64;
    let counters: [(&str, &str, Count); 5] = [
        (
            "inferscope_input_tokens_total",
            "Prompt tokens of finished requests.",
            |t| t.input_tokens,
        ),
        (
            "inferscope_output_tokens_total",
            "Output tokens of finished requests.",
            |t| t.output_tokens,
        ),
        (
            "inferscope_malformed_events_total",
            "Streamed events that were not the expected JSON (forwarded untouched).",
            |t| t.malformed_events,
        ),
        (
            "inferscope_slo_evaluated_requests_total",
            "Requests of routes with latency objectives (slo:), judged against them.",
            |t| t.slo_evaluated,
        ),
        (
            "inferscope_slo_met_requests_total",
            "Requests that succeeded and met every latency objective of their route (goodput).",
            |t| t.slo_met,
        ),
    ];
    for (name, help, get) in counters {
        let samples = groups.iter().map(|(labels, t)| (labels, get(t)));
        w.series(name, "counter", help, samples);
    }
    // Only the groups of backends whose engines send spans.
    let engine: [(&str, &str, Count); 3] = [
        (
            "inferscope_engine_spans_joined_total",
            "Requests whose engine span (engine_spans:) was joined to their record.",
            |t| t.engine_joined,
        ),
        (
            "inferscope_engine_spans_missing_total",
            "Requests whose engine span did not come within engine_spans.wait.",
            |t| t.engine_missing,
        ),
        (
            "inferscope_starved_requests_total",
            "Requests that waited in the engine's queue starved_factor times the median of the backend's recent requests or more.",
            |t| t.starved,
        ),
    ];
    for (name, help, get) in engine {
        let samples = groups
            .iter()
            .filter(|(_, t)| t.engine_joined + t.engine_missing > 0)
            .map(|(labels, t)| (labels, get(t)));
        w.series(name, "counter", help, samples);
    }

    let hists: [(&str, &str, usize, &[f64]); 11] = [
        ("inferscope_time_to_first_token_seconds", "Time from request accepted to the first output event (TTFT).", 0, TTFT_BOUNDS),
        ("inferscope_time_to_first_chunk_seconds", "Time from request accepted to the first streamed event of any kind (TTFC).", 1, TTFT_BOUNDS),
        ("inferscope_time_per_output_token_seconds", "Mean time per output token after the first (TPOT).", 2, TPOT_BOUNDS),
        ("inferscope_inter_token_latency_seconds", "Gap between successive output events (ITL).", 3, TPOT_BOUNDS),
        ("inferscope_request_duration_seconds", "Time from request accepted to the end of the response body (E2E).", 4, DURATION_BOUNDS),
        ("inferscope_gateway_overhead_seconds", "Time the gateway added: request handling before the upstream send plus frame observation.", 5, OVERHEAD_BOUNDS),
        ("inferscope_accept_delay_seconds", "Kernel arrival of the request's first byte to the gateway's service call (kernel clock only).", 6, LAG_BOUNDS),
        ("inferscope_forward_lag_seconds", "Per stream, the largest upstream read stamp to hand-off delay (a lower bound on the gateway's hold).", 7, LAG_BOUNDS),
        ("inferscope_engine_queue_seconds", "Time in the engine's queue, from its span (engine_spans:).", 8, DURATION_BOUNDS),
        ("inferscope_engine_prefill_seconds", "Time in the engine's prefill, from its span (engine_spans:).", 9, TTFT_BOUNDS),
        ("inferscope_engine_decode_seconds", "Time in the engine's decode, from its span (engine_spans:).", 10, DURATION_BOUNDS),
    ];
    for (name, help, idx, bounds) in hists {
        w.family(name, "histogram", help);
        for (labels, t) in &groups {
            let h = &t.hists[idx];
            if h.count() > 0 {
                let nat = h.histogram().filter(|_| w.is_protobuf()).map(native);
                w.histogram_with(
                    name,
                    labels,
                    bounds,
                    |le| h.count_le(le),
                    h.sum_seconds(),
                    h.count(),
                    nat.as_ref(),
                );
            }
        }
    }
    for s in scalars {
        w.family(s.name, s.kind, s.help);
        w.sample(s.name, &Labels::none(), s.value);
    }
}
