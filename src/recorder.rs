//! `Recorder`: where finished `RequestRecord`s go — the stats histograms (updated in place, once per
//! request, under a short lock) and the access-log channel (never awaited; drops are counted).

use crate::accesslog::AccessLog;
use crate::meter::RequestRecord;
use crate::stats::Stats;
use std::sync::atomic::{AtomicI64, Ordering};

/// Receives every request's record, exactly once each.
#[derive(Debug)]
pub struct Recorder {
    /// Latency and token statistics.
    pub stats: Stats,
    /// The JSONL access log (disabled when not configured).
    pub log: AccessLog,
    in_flight: AtomicI64,
}

impl Recorder {
    /// A recorder feeding `stats` and `log`.
    pub fn new(stats: Stats, log: AccessLog) -> Self {
        Self {
            stats,
            log,
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

    /// Takes one finished request.
    pub fn record(&self, rec: RequestRecord) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.stats.record(&rec);
        self.log.send(rec);
    }
}
