//! `Recorder`: the gateway's sinks for finished records — the stats histograms (updated in place,
//! once per request, under a short lock), per-variant experiment data, the routing side's
//! observers, OpenTelemetry and the access log (both queued, never awaited; drops are counted). It
//! is one `RecordSink` to the meter, and gives the admin plane typed access to each part.

use crate::accesslog::AccessLog;
use crate::experiment::Experiments;
use crate::meter::{RecordSink, RequestRecord};
use crate::stats::Stats;
use crate::telemetry::Telemetry;
use std::sync::{Arc, OnceLock};

/// Receives every request's record, exactly once each, and fans it out.
#[derive(Debug)]
pub struct Recorder {
    /// Latency and token statistics.
    pub stats: Stats,
    /// The JSONL access log (disabled when not configured).
    pub log: AccessLog,
    /// OpenTelemetry export (absent when off).
    pub telemetry: Option<Telemetry>,
    /// Per-variant samples of A/B experiments, and feedback.
    pub experiments: Experiments,
    /// The routing side's observers (backend health, guardrails, shadow agreement), set once
    /// the router exists.
    observers: OnceLock<Vec<Arc<dyn RecordSink>>>,
}

impl Recorder {
    /// A recorder feeding `stats`, `log` and, when on, `telemetry`.
    pub fn new(stats: Stats, log: AccessLog, telemetry: Option<Telemetry>) -> Self {
        Self {
            stats,
            log,
            telemetry,
            experiments: Experiments::default(),
            observers: OnceLock::new(),
        }
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

    /// Adds the observers every record is also given to (once; later calls are ignored).
    pub fn observe_with(&self, observers: Vec<Arc<dyn RecordSink>>) {
        let _ = self.observers.set(observers);
    }
}

impl RecordSink for Recorder {
    fn record(&self, rec: &Arc<RequestRecord>) {
        for o in self.observers.get().into_iter().flatten() {
            o.record(rec);
        }
        self.stats.record(rec);
        self.experiments.record(rec);
        if let Some(t) = &self.telemetry {
            t.submit(Arc::clone(rec));
        }
        self.log.send(Arc::clone(rec));
    }
}
