//! `Recorder`: where finished `RequestRecord`s go — the stats histograms (updated in place, once per
//! request, under a short lock) and the access-log channel (never awaited; drops are counted).

use crate::accesslog::AccessLog;
use crate::meter::{Outcome, RequestRecord};
use crate::stats::Stats;
use crate::telemetry::Telemetry;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

/// Passive health and latency feedback to the backend that served the last attempt.
fn feed_back(rec: &RequestRecord) {
    let Some(b) = &rec.meta.upstream else { return };
    match rec.outcome {
        Outcome::Ok => b.observe_success(rec.ttft, rec.tpot),
        // The backend failed, broke the stream, or stalled.
        Outcome::BackendError | Outcome::Truncated | Outcome::Timeout => b.observe_failure(),
        // Neither proves anything about the backend.
        Outcome::ClientError
        | Outcome::ClientCancelled
        | Outcome::Rejected
        | Outcome::GatewayError => {}
    }
}

/// Receives every request's record, exactly once each.
#[derive(Debug)]
pub struct Recorder {
    /// Latency and token statistics.
    pub stats: Stats,
    /// The JSONL access log (disabled when not configured).
    pub log: AccessLog,
    /// OpenTelemetry export (absent when off).
    pub telemetry: Option<Telemetry>,
    /// Per-variant samples of A/B experiments.
    pub experiments: crate::experiment::Experiments,
    in_flight: AtomicI64,
}

impl Recorder {
    /// A recorder feeding `stats`, `log` and, when on, `telemetry`.
    pub fn new(stats: Stats, log: AccessLog, telemetry: Option<Telemetry>) -> Self {
        Self {
            stats,
            log,
            telemetry,
            experiments: crate::experiment::Experiments::default(),
            in_flight: AtomicI64::new(0),
        }
    }

    /// A request started (its record will arrive later).
    pub fn started(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
    }

    /// Requests started and not yet recorded.
    pub fn in_flight(&self) -> i64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// A guardrail rolled `variant` back: exported as an OpenTelemetry event when telemetry is on
    /// (the log line and the metric come from the guardrail itself).
    pub fn guardrail_tripped(&self, route: &str, variant: &str, trip: &crate::experiment::Trip) {
        if let Some(t) = &self.telemetry {
            t.event(
                "inferscope.guardrail.tripped",
                vec![
                    ("inferscope.route", route.to_string()),
                    ("inferscope.variant", variant.to_string()),
                    ("inferscope.guardrail.rule", trip.rule.clone()),
                    ("inferscope.guardrail.value", trip.value.to_string()),
                ],
            );
        }
    }

    /// Takes one finished request.
    pub fn record(&self, rec: RequestRecord) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        feed_back(&rec);
        self.stats.record(&rec);
        self.experiments.record(&rec);
        if let Some(g) = &rec.meta.guard {
            for (variant, trip) in g.observe(&rec) {
                self.guardrail_tripped(&rec.meta.route, &variant, &trip);
            }
        }
        if let Some(pair) = &rec.meta.shadow_pair {
            let ok = rec.outcome == Outcome::Ok;
            pair.offer(
                rec.meta.is_shadow,
                rec.response.output_content.clone().filter(|_| ok),
            );
        }
        let rec = Arc::new(rec);
        if let Some(t) = &self.telemetry {
            t.submit(Arc::clone(&rec));
        }
        self.log.send(rec);
    }
}
