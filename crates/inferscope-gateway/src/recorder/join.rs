//! Joining engines' spans to records. A record of a request sent to a backend with
//! `engine_spans:` waits here until its engine's span arrives (by trace id and the parent span
//! id the gateway sent) or its `wait` runs out; a span that arrives first waits for its record.
//! Each joined span's queue time is judged against the backend's recent ones: starved when
//! `starved_factor` × their median or more. Bounded: past `MAX_WAITING` records or spans, the
//! oldest are let go (counted).

use crate::config::EngineSpansConfig;
use crate::meter::{EngineJoin, EngineSpan, RequestMeta, RequestRecord};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Records (and spans) waiting at most: beyond, the next is not held.
const MAX_WAITING: usize = 1 << 16;
/// How long a span waits for its record (a request still streaming when its engine finished).
const SPAN_WAIT: Duration = Duration::from_secs(30);
/// Recent queue times kept per backend, at most.
const WINDOW_CAP: usize = 1024;
/// How long a sent request's span is expected before its record (a request longer than this
/// whose span comes first is counted `unexpected`).
const EXPECT_FOR: Duration = Duration::from_secs(3600);
/// Fewer earlier requests than this in the window: no starvation verdict.
const MIN_NEIGHBOURS: usize = 5;

type Key = (u128, u64);

/// Counters of the join, for `/stats` and `/metrics`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct JoinCounts {
    /// Engine spans received (with latencies).
    pub received: u64,
    /// Records joined with their span.
    pub joined: u64,
    /// Records whose span did not come within `wait` (or that could not be held).
    pub missing: u64,
    /// Spans no record claimed within `SPAN_WAIT` (a request not through this gateway, or a
    /// retried attempt's).
    pub unclaimed: u64,
    /// Joined requests flagged starved.
    pub starved: u64,
    /// Spans of no request this gateway sent (or sent longer ago than `EXPECT_FOR`): dropped
    /// on arrival.
    pub unexpected: u64,
    /// Spans with a duration past a day or not a number (that duration left out).
    pub out_of_range: u64,
    /// Spans past the most one export may carry, not read.
    pub over_cap: u64,
}

impl JoinCounts {
    /// The span side's counters as Prometheus series (the records' side, joined and missing,
    /// is in the statistics' `inferscope_engine_spans_joined_total` and `…_missing_total`).
    pub fn write_prometheus(&self, w: &mut crate::util::prometheus::Writer) {
        use crate::util::prometheus::Labels;
        let none = Labels::new(&[]);
        let name = "inferscope_engine_spans_received_total";
        w.family(
            name,
            "counter",
            "Engine spans with latencies received over OTLP (`engine_spans:`).",
        );
        w.sample(name, &none, self.received as f64);
        let name = "inferscope_engine_spans_dropped_total";
        w.family(
            name,
            "counter",
            "Engine spans received and not joined, by reason: unclaimed (the request's record did not come within 30 s); unexpected (of no request this gateway sent, or sent over an hour before: dropped on arrival, so a flood cannot crowd out real spans); over_cap (past 65,536 engine spans in one export).",
        );
        for (reason, v) in [
            ("unclaimed", self.unclaimed),
            ("unexpected", self.unexpected),
            ("over_cap", self.over_cap),
        ] {
            w.sample(name, &Labels::new(&[("reason", reason)]), v as f64);
        }
        let name = "inferscope_engine_span_values_out_of_range_total";
        w.family(
            name,
            "counter",
            "Engine spans with a duration past a day or not a number: that duration is left out of the span (forged or broken), the rest kept.",
        );
        w.sample(name, &none, self.out_of_range as f64);
    }
}

#[derive(Debug, Default)]
pub(super) struct Joiner {
    waiting: HashMap<Key, (Arc<RequestRecord>, Instant)>,
    spans: HashMap<Key, (EngineSpan, Instant)>,
    /// Requests sent to a backend with `engine_spans:` whose record has not come yet: the
    /// spans that may arrive before their record.
    expected: HashMap<Key, Instant>,
    /// Per backend: when each recent span was joined, and its queue time.
    windows: HashMap<Arc<str>, VecDeque<(Instant, Duration)>>,
    pub(super) counts: JoinCounts,
    /// Shut down: nothing is held any more.
    closed: bool,
}

/// The backend's engine-span settings the proxy attached to the request (`engine_spans:`): its
/// record waits for the engine's span to be joined.
pub(crate) fn engine_spans(meta: &RequestMeta) -> Option<&EngineSpansConfig> {
    meta.extensions
        .get::<Arc<EngineSpansConfig>>()
        .map(|c| &**c)
}

fn key(rec: &RequestRecord) -> Key {
    (rec.meta.trace.trace_id, rec.meta.trace.client_span)
}

impl Joiner {
    /// A request was sent with its trace (`trace_id`, the CLIENT span `parent`): its engine's
    /// span may arrive before its record.
    pub(super) fn expect(&mut self, trace_id: u128, parent: u64, now: Instant) {
        if self.closed {
            return;
        }
        if self.expected.len() >= MAX_WAITING {
            self.expected
                .retain(|_, at| now.saturating_duration_since(*at) < EXPECT_FOR);
            if self.expected.len() >= MAX_WAITING {
                return;
            }
        }
        self.expected.insert((trace_id, parent), now);
    }

    /// A record came: its request's spans (the last attempt's and the retried ones') are no
    /// longer expected ahead of it.
    pub(super) fn arrived(&mut self, rec: &RequestRecord) {
        if self.expected.is_empty() {
            return;
        }
        self.expected.remove(&key(rec));
        for a in &crate::facts::Facts::of(&rec.meta).attempts {
            self.expected.remove(&(rec.meta.trace.trace_id, a.span_id));
        }
    }

    /// Holds `rec` for its span; returns it at once when the span is already here (joined) or
    /// when no more can be held (missing).
    pub(super) fn hold(
        &mut self,
        rec: Arc<RequestRecord>,
        now: Instant,
    ) -> Option<Arc<RequestRecord>> {
        let k = key(&rec);
        if let Some((span, _)) = self.spans.remove(&k) {
            self.join(&rec, span, now);
            return Some(rec);
        }
        let wait = engine_spans(&rec.meta).map_or(Duration::ZERO, |c| c.wait);
        if self.closed || self.waiting.len() >= MAX_WAITING || wait.is_zero() {
            self.missing(&rec);
            return Some(rec);
        }
        if let Some((earlier, _)) = self.waiting.insert(k, (rec, now + wait)) {
            // Two records of one trace and CLIENT span: not expected; the earlier goes as is.
            self.missing(&earlier);
            return Some(earlier);
        }
        None
    }

    /// Takes a span: returns the record it completes, if that record is waiting.
    pub(super) fn span(&mut self, span: EngineSpan, now: Instant) -> Option<Arc<RequestRecord>> {
        self.counts.received += 1;
        let k = (span.trace_id, span.parent);
        if let Some((rec, _)) = self.waiting.remove(&k) {
            self.join(&rec, span, now);
            return Some(rec);
        }
        if self.expected.remove(&k).is_none() {
            self.counts.unexpected += 1;
            return None;
        }
        if self.spans.len() >= MAX_WAITING {
            self.counts.unclaimed += 1;
        } else {
            self.spans.insert(k, (span, now + SPAN_WAIT));
        }
        None
    }

    /// Lets go of what waited past its deadline (with `all`: every record, and from then on
    /// none is held): the records, now marked missing.
    pub(super) fn expire(&mut self, now: Instant, all: bool) -> Vec<Arc<RequestRecord>> {
        self.closed |= all;
        let due: Vec<Key> = self
            .waiting
            .iter()
            .filter(|(_, (_, at))| all || *at <= now)
            .map(|(k, _)| *k)
            .collect();
        let out: Vec<Arc<RequestRecord>> = due
            .iter()
            .filter_map(|k| self.waiting.remove(k))
            .map(|(rec, _)| rec)
            .collect();
        for rec in &out {
            self.missing(rec);
        }
        let before = self.spans.len();
        self.spans.retain(|_, (_, at)| *at > now);
        self.counts.unclaimed += (before - self.spans.len()) as u64;
        out
    }

    /// Records waiting for their spans.
    pub(super) fn waiting(&self) -> usize {
        self.waiting.len()
    }

    fn missing(&mut self, rec: &RequestRecord) {
        self.counts.missing += 1;
        let _ = rec.engine_span.set(EngineJoin::Missing);
    }

    fn join(&mut self, rec: &RequestRecord, span: EngineSpan, now: Instant) {
        self.counts.joined += 1;
        let starved = match (span.queue, engine_spans(&rec.meta)) {
            (Some(q), Some(cfg)) => {
                let w = self
                    .windows
                    .entry(Arc::clone(&rec.meta.backend))
                    .or_default();
                while w
                    .front()
                    .is_some_and(|(at, _)| now.saturating_duration_since(*at) > cfg.starved_window)
                    || w.len() >= WINDOW_CAP
                {
                    w.pop_front();
                }
                let verdict = starved(w.iter().map(|(_, q)| *q).collect(), q, cfg);
                w.push_back((now, q));
                verdict
            }
            _ => None,
        };
        self.counts.starved += u64::from(starved == Some(true));
        let _ = rec.engine_span.set(EngineJoin::Joined { span, starved });
    }
}

/// `queue` against the queue times of the requests before it: starved when at least
/// `starved_min` and more than `starved_factor` × their median; `None` with too few.
fn starved(
    mut before: Vec<Duration>,
    queue: Duration,
    cfg: &crate::config::EngineSpansConfig,
) -> Option<bool> {
    if before.len() < MIN_NEIGHBOURS {
        return None;
    }
    let mid = before.len() / 2;
    let (_, median, _) = before.select_nth_unstable(mid);
    Some(
        queue >= cfg.starved_min && queue.as_secs_f64() > cfg.starved_factor * median.as_secs_f64(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EngineSpansConfig;

    fn record(trace: u128, span: u64, wait_ms: u64) -> Arc<RequestRecord> {
        let mut m = crate::meter::RequestMeta::new(http::Method::POST, "/v1/chat/completions");
        m.trace.trace_id = trace;
        m.trace.client_span = span;
        m.backend = Arc::from("b");
        m.extensions.insert(Arc::new(EngineSpansConfig {
            wait: Duration::from_millis(wait_ms),
            ..EngineSpansConfig::default()
        }));
        Arc::new(RequestRecord::without_body(
            m,
            200,
            crate::meter::Outcome::Ok,
            None,
            0,
        ))
    }

    fn span(trace: u128, parent: u64, queue_ms: u64) -> EngineSpan {
        EngineSpan {
            trace_id: trace,
            parent,
            queue: Some(Duration::from_millis(queue_ms)),
            ..EngineSpan::default()
        }
    }

    #[test]
    fn records_and_spans_meet_whichever_comes_first_and_only_their_own() {
        let mut j = Joiner::default();
        let t = Instant::now();
        // Record first: held, then completed by its span (not by another trace's, nor by a
        // span of the same trace under another parent, which no request sent: unexpected).
        j.expect(1, 10, t);
        j.expect(2, 10, t);
        j.expect(3, 30, t);
        assert!(j.hold(record(1, 10, 1000), t).is_none());
        assert!(j.span(span(2, 10, 5), t).is_none());
        assert!(j.span(span(1, 11, 5), t).is_none());
        let done = j
            .span(span(1, 10, 7), t)
            .unwrap_or_else(|| panic!("joined"));
        assert_eq!(
            done.engine_joined().and_then(|(s, _)| s.queue),
            Some(Duration::from_millis(7))
        );
        // Span first: the record is complete as it arrives.
        let done = j
            .hold(record(2, 10, 1000), t)
            .unwrap_or_else(|| panic!("joined at once"));
        assert!(done.engine_joined().is_some());
        // A record whose span never comes goes at its deadline, marked missing; a span of a
        // request sent whose record never claims it is dropped after SPAN_WAIT and counted.
        assert!(j.span(span(3, 30, 5), t).is_none());
        assert!(j.hold(record(3, 31, 50), t).is_none());
        assert!(j.expire(t + Duration::from_millis(49), false).is_empty());
        let gone = j.expire(t + Duration::from_millis(50), false);
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].engine_span.get(), Some(&EngineJoin::Missing));
        j.expire(t + SPAN_WAIT + Duration::from_millis(1), false);
        assert_eq!(
            (
                j.counts.received,
                j.counts.joined,
                j.counts.missing,
                j.counts.unclaimed,
                j.counts.unexpected
            ),
            (4, 2, 1, 1, 1)
        );
        // Shut down: what waits goes, and nothing more is held.
        assert!(j.hold(record(4, 40, 1000), t).is_none());
        assert_eq!(j.expire(t, true).len(), 1);
        assert!(j.hold(record(5, 50, 1000), t).is_some());
    }

    #[test]
    fn starved_is_far_above_the_median_and_above_the_floor() {
        let cfg = EngineSpansConfig::default();
        let ms = Duration::from_millis;
        let before = vec![ms(40), ms(50), ms(60), ms(50), ms(45)];
        assert_eq!(starved(before.clone(), ms(201), &cfg), Some(true));
        assert_eq!(starved(before.clone(), ms(199), &cfg), Some(false));
        assert_eq!(starved(before[..4].to_vec(), ms(900), &cfg), None);
        // An idle engine: 0.1 ms medians, a 5 ms queue is not starvation.
        let idle = vec![Duration::from_micros(100); 8];
        assert_eq!(starved(idle, ms(5), &cfg), Some(false));
    }
}
