//! `Tally`: the counters and HdrHistograms (µs, 3 significant digits) of one group over one span
//! of time, mergeable so rollups and windows are built by adding tallies.

use super::doc::{EngineSpanCounts, GoodputStats, LatencyStats, TallyStats};
use crate::util::quantile::{self, MAX_US};
use crate::{Outcome, RequestRecord};
use hdrhistogram::Histogram;
use std::time::Duration;

/// A histogram created on first use (groups that never stream hold no TTFT histogram), plus the
/// exact sum for Prometheus `_sum`.
#[derive(Debug, Clone, Default)]
pub struct Hist {
    h: Option<Histogram<u64>>,
    sum_us: u64,
    /// Significant digits when created: 3 (the default) for cumulative histograms, 2 for the
    /// sliding window's slots (1% resolution, a seventh of the memory: six slots per metric).
    coarse: bool,
}

impl Hist {
    /// Records one duration. (Inlined into `Tally::record`'s loops: out of line it cost a third
    /// more per recorded request, `per_request/record_64_token_stream` in benches/data_path.rs.)
    #[inline(always)]
    pub fn record(&mut self, d: Duration) {
        self.record_us_n(quantile::duration_us(d), 1);
    }

    /// Records `n` samples of `us` microseconds.
    #[inline(always)]
    pub(crate) fn record_us_n(&mut self, us: u64, n: u64) {
        if self.h.is_none() {
            let digits = if self.coarse {
                quantile::WINDOW_DIGITS
            } else {
                quantile::DIGITS
            };
            self.h = Histogram::new_with_bounds(1, MAX_US, digits).ok();
        }
        if let Some(h) = &mut self.h {
            h.saturating_record_n(us.min(MAX_US), n);
        }
        self.sum_us = self.sum_us.saturating_add(us.saturating_mul(n));
    }

    /// Adds another histogram's samples.
    pub fn merge(&mut self, other: &Hist) {
        if let Some(o) = &other.h {
            match &mut self.h {
                Some(h) => {
                    let _ = h.add(o);
                }
                None => self.h = Some(o.clone()),
            }
        }
        self.sum_us = self.sum_us.saturating_add(other.sum_us);
    }

    /// A histogram read back from an export, with its exact sum.
    pub fn from_parts(h: Histogram<u64>, sum_us: u64) -> Self {
        Self {
            h: Some(h),
            sum_us,
            coarse: false,
        }
    }

    /// The HdrHistogram (`None` until the first sample).
    pub fn histogram(&self) -> Option<&Histogram<u64>> {
        self.h.as_ref()
    }

    /// Exact sum of samples, in microseconds.
    pub(crate) fn sum_us(&self) -> u64 {
        self.sum_us
    }

    /// Number of samples.
    pub fn count(&self) -> u64 {
        self.h.as_ref().map_or(0, Histogram::len)
    }

    /// Exact sum of samples, in seconds.
    pub fn sum_seconds(&self) -> f64 {
        self.sum_us as f64 / 1e6
    }

    /// Samples ≤ `le_seconds` (for cumulative Prometheus buckets).
    pub(crate) fn count_le(&self, le_seconds: f64) -> u64 {
        let Some(h) = &self.h else { return 0 };
        let le_us = (le_seconds * 1e6) as u64;
        if le_us >= h.max() {
            return h.len();
        }
        h.count_between(0, le_us)
    }

    /// `{p50 p90 p95 p99 p999 mean max count}` in milliseconds (`None` when empty); quantiles
    /// by the one rule (`stats::quantile`).
    pub(crate) fn summary_ms(&self) -> Option<LatencyStats> {
        let h = self.h.as_ref().filter(|h| !h.is_empty())?;
        let ms = quantile::us_to_ms;
        Some(LatencyStats {
            p50: ms(h.value_at_quantile(0.50)),
            p90: ms(h.value_at_quantile(0.90)),
            p95: ms(h.value_at_quantile(0.95)),
            p99: ms(h.value_at_quantile(0.99)),
            p999: ms(h.value_at_quantile(0.999)),
            mean: h.mean().round() / 1000.0,
            max: ms(h.max()),
            count: h.len(),
        })
    }
}

/// The latency metrics every tally keeps, by their `/stats` names.
pub const METRICS: [&str; 11] = [
    "ttft",
    "ttfc",
    "tpot",
    "itl",
    "e2e",
    "overhead",
    "accept_delay",
    "forward_lag",
    // The engine's own times, from its span (`engine_spans:`).
    "engine_queue",
    "engine_prefill",
    "engine_decode",
];

/// Counters and histograms of one group over one span of time.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// Requests recorded.
    pub requests: u64,
    /// Requests by outcome, indexed by `Outcome::index`.
    pub outcomes: [u64; Outcome::ALL.len()],
    /// Sum of prompt tokens.
    pub input_tokens: u64,
    /// Sum of output tokens.
    pub output_tokens: u64,
    /// Events that were not the expected JSON.
    pub malformed_events: u64,
    /// Requests judged against their route's latency objectives.
    pub slo_evaluated: u64,
    /// Of those, the ones that met every objective (goodput).
    pub slo_met: u64,
    /// Requests whose engine span was joined (`engine_spans:`).
    pub engine_joined: u64,
    /// Requests whose engine span did not come.
    pub engine_missing: u64,
    /// Joined requests that waited in the engine's queue far longer than their neighbours.
    pub starved: u64,
    /// Histograms in `METRICS` order.
    pub hists: [Hist; METRICS.len()],
}

impl Tally {
    /// A tally for one slot of the sliding window (histograms at 2 significant digits).
    pub(crate) fn window_slot() -> Self {
        let mut t = Self::default();
        for h in &mut t.hists {
            h.coarse = true;
        }
        t
    }

    /// Adds one request.
    pub fn record(&mut self, r: &RequestRecord) {
        self.requests += 1;
        self.outcomes[r.outcome.index()] += 1;
        self.input_tokens += r.input_tokens.unwrap_or(0);
        self.output_tokens += r.output_tokens.unwrap_or(0);
        self.malformed_events += u64::from(r.malformed_events);
        if let Some(met) = r.slo_met() {
            self.slo_evaluated += 1;
            self.slo_met += u64::from(met);
        }
        let [ttft, ttfc, tpot, itl, e2e, overhead, accept_delay, forward_lag, ..] = &mut self.hists;
        if let Some(d) = r.ttft {
            ttft.record(d);
        }
        if let Some(d) = r.ttfc {
            ttfc.record(d);
        }
        if let Some(d) = r.tpot {
            tpot.record(d);
        }
        r.itl.for_each_us(|us, n| itl.record_us_n(us, n));
        e2e.record(r.e2e);
        if let Some(d) = r.overhead {
            overhead.record(d);
        }
        if let Some(d) = r.meta.accept_delay {
            accept_delay.record(d);
        }
        if let Some(d) = r.forward_lag {
            forward_lag.record(d);
        }
    }

    /// Adds what the engine's span of a request said (or that it did not come).
    pub fn record_engine(&mut self, r: &RequestRecord) {
        let Some(join) = r.engine_span.get() else {
            return;
        };
        let crate::EngineJoin::Joined { span, starved } = join else {
            self.engine_missing += 1;
            return;
        };
        self.engine_joined += 1;
        self.starved += u64::from(*starved == Some(true));
        let [.., queue, prefill, decode] = &mut self.hists;
        for (h, d) in [
            (queue, span.queue),
            (prefill, span.prefill),
            (decode, span.decode),
        ] {
            if let Some(d) = d {
                h.record(d);
            }
        }
    }

    /// Adds another tally.
    pub fn merge(&mut self, o: &Tally) {
        self.requests += o.requests;
        for (a, b) in self.outcomes.iter_mut().zip(o.outcomes) {
            *a += b;
        }
        self.input_tokens += o.input_tokens;
        self.output_tokens += o.output_tokens;
        self.malformed_events += o.malformed_events;
        self.slo_evaluated += o.slo_evaluated;
        self.slo_met += o.slo_met;
        self.engine_joined += o.engine_joined;
        self.engine_missing += o.engine_missing;
        self.starved += o.starved;
        for (a, b) in self.hists.iter_mut().zip(&o.hists) {
            a.merge(b);
        }
    }

    /// The `/stats` figures of this tally, with rates over `seconds` (`None`: no span, no rates).
    pub fn stats(&self, seconds: Option<f64>) -> TallyStats {
        let mut t = TallyStats {
            requests: self.requests,
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
            malformed_events: self.malformed_events,
            ..TallyStats::default()
        };
        for o in Outcome::ALL {
            let n = self.outcomes[o.index()];
            t.outcomes.insert(o.as_str().into(), n);
            if o != Outcome::Ok && n > 0 {
                t.errors.insert(o.as_str().into(), n);
            }
        }
        for (name, h) in METRICS.iter().zip(&self.hists) {
            if let Some(slot) = t.latency_mut(name) {
                *slot = h.summary_ms();
            }
        }
        let rate = |n: u64| {
            seconds.map(|s| {
                if s > 0.0 {
                    ((n as f64 / s) * 1000.0).round() / 1000.0
                } else {
                    0.0
                }
            })
        };
        t.requests_per_s = rate(self.requests);
        t.output_tokens_per_s = rate(self.output_tokens);
        t.goodput = (self.slo_evaluated > 0).then(|| GoodputStats {
            evaluated: self.slo_evaluated,
            met: self.slo_met,
            share: ((self.slo_met as f64 / self.slo_evaluated as f64) * 1e4).round() / 1e4,
            met_per_s: rate(self.slo_met),
        });
        if self.engine_joined + self.engine_missing > 0 {
            t.engine_spans = Some(EngineSpanCounts {
                joined: self.engine_joined,
                missing: self.engine_missing,
                starved: self.starved,
            });
        }
        t
    }
}
