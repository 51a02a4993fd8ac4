//! `Recorder`: the gateway's sinks for finished records — the stats histograms (updated in place,
//! once per request, under a short lock), per-variant experiment data, the routing side's
//! observers, OpenTelemetry and the access log (both queued, never awaited; drops are counted). It
//! is one `RecordSink` to the meter, and gives the admin plane typed access to each part.
//! Records of requests whose engine sends its own spans (`engine_spans:`) reach the access log
//! and OpenTelemetry once that span is joined (`join`), or its wait ran out.

mod join;

pub use join::JoinCounts;

use crate::accesslog::AccessLog;
use crate::experiment::Experiments;
use crate::meter::{RecordSink, RequestRecord};
use crate::stats::Stats;
use crate::telemetry::Telemetry;
use parking_lot::Mutex;
use std::sync::{Arc, OnceLock};

/// Receives every request's record, exactly once each, and fans it out.
#[derive(Debug)]
pub struct Recorder {
    /// Latency and token statistics.
    pub stats: Stats,
    /// The same, per benchmark run (`x-inferscope-run`).
    pub runs: crate::stats::runs::Runs,
    /// The JSONL access log (disabled when not configured).
    pub log: AccessLog,
    /// OpenTelemetry export (absent when off).
    pub telemetry: Option<Telemetry>,
    /// Per-variant samples of A/B experiments, and feedback.
    pub experiments: Experiments,
    /// The routing side's observers (backend health, guardrails, shadow agreement), set once
    /// the router exists.
    observers: OnceLock<Vec<Arc<dyn RecordSink>>>,
    /// Records waiting for their engine's span, and spans for their record.
    joins: Mutex<join::Joiner>,
}

impl Recorder {
    /// A recorder feeding `stats`, `log` and, when on, `telemetry`.
    pub fn new(stats: Stats, log: AccessLog, telemetry: Option<Telemetry>) -> Self {
        Self {
            stats,
            runs: Default::default(),
            log,
            telemetry,
            experiments: Experiments::default(),
            observers: OnceLock::new(),
            joins: Mutex::default(),
        }
    }

    /// Engine spans received over OTLP: each completes the record waiting for it, or waits for
    /// its record (where this gateway sent that request).
    pub fn engine_spans(&self, export: crate::telemetry::receive::Decoded) {
        let now = tokio::time::Instant::now();
        let done: Vec<_> = {
            let mut j = self.joins.lock();
            j.counts.out_of_range += export.out_of_range;
            j.counts.over_cap += export.dropped;
            export
                .spans
                .into_iter()
                .filter_map(|s| j.span(s, now))
                .collect()
        };
        for rec in done {
            self.complete(rec);
        }
    }

    /// Writes out the records whose engine span did not come in time (`all`: every record still
    /// waiting, at shutdown). Returns how many still wait.
    pub fn expire_joins(&self, all: bool) -> usize {
        let (done, left) = {
            let mut j = self.joins.lock();
            let done = j.expire(tokio::time::Instant::now(), all);
            (done, j.waiting())
        };
        for rec in done {
            self.complete(rec);
        }
        left
    }

    /// Expires joins every `every` until `stop` resolves; then waits up to `grace` for the
    /// spans of the records still waiting, and writes out the rest.
    pub async fn run_joins(
        self: Arc<Self>,
        every: std::time::Duration,
        grace: std::time::Duration,
        stop: impl std::future::Future<Output = ()>,
    ) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(stop);
        loop {
            tokio::select! {
                _ = tick.tick() => { self.expire_joins(false); }
                () = &mut stop => break,
            }
        }
        let end = tokio::time::Instant::now() + grace;
        while self.expire_joins(false) > 0 && tokio::time::Instant::now() < end {
            tokio::time::sleep(every.min(grace)).await;
        }
        self.expire_joins(true);
    }

    /// A request went to a backend with `engine_spans:` under this trace and CLIENT span: its
    /// engine's span may come before its record.
    pub fn expect_span(&self, trace_id: u128, parent: u64) {
        self.joins
            .lock()
            .expect(trace_id, parent, tokio::time::Instant::now());
    }

    /// The join's counters.
    pub fn join_counts(&self) -> JoinCounts {
        self.joins.lock().counts
    }

    /// What waits for a record's engine span: its engine statistics, its span and its log line.
    fn complete(&self, rec: Arc<RequestRecord>) {
        self.stats.record_engine(&rec);
        if let Some(t) = &self.telemetry {
            t.submit(Arc::clone(&rec));
        }
        self.log.send(rec);
    }

    /// A guardrail (or a verdict) rolled `variant` back: kept where a state directory is, and
    /// exported as an OpenTelemetry event when telemetry is on (the log line and the metric come
    /// from the guardrail itself).
    pub fn guardrail_tripped(&self, route: &str, variant: &str, trip: &crate::experiment::Trip) {
        self.experiments
            .rollbacks
            .tripped(route, variant, &trip.rule);
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

    /// `on_accept: promote` moved `variant` to `share` percent of the traffic (0: its ramp
    /// stopped): kept where a state directory is, counted, and exported as an OpenTelemetry
    /// event when telemetry is on (the log line comes from the promotion itself).
    pub fn promoted(&self, route: &str, variant: &str, share: u32) {
        self.experiments.rollbacks.promoted(route, variant, share);
        if let Some(t) = &self.telemetry {
            t.event(
                "inferscope.experiment.promoted",
                vec![
                    ("inferscope.route", route.to_string()),
                    ("inferscope.variant", variant.to_string()),
                    ("inferscope.promotion.share", share.to_string()),
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
        self.runs.record(rec);
        self.experiments.record(rec);
        // A request its engine finished and reports on: the log line and span wait for the
        // engine's span (statistics above do not). Engines send no span for a request they
        // refused or that was cancelled, so those do not wait.
        if join::engine_spans(&rec.meta).is_some() && rec.meta.t_sent.is_some() {
            let now = tokio::time::Instant::now();
            let ready = {
                let mut j = self.joins.lock();
                j.arrived(rec);
                (rec.outcome == crate::meter::Outcome::Ok).then(|| j.hold(Arc::clone(rec), now))
            };
            match ready {
                Some(Some(r)) => self.complete(r),
                Some(None) => {}
                None => {
                    if let Some(t) = &self.telemetry {
                        t.submit(Arc::clone(rec));
                    }
                    self.log.send(Arc::clone(rec));
                }
            }
            return;
        }
        if let Some(t) = &self.telemetry {
            t.submit(Arc::clone(rec));
        }
        self.log.send(Arc::clone(rec));
    }
}
