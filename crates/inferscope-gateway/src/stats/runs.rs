//! The gateway's figures per benchmark run: the requests a client tagged with one run id
//! (`x-inferscope-run`, taken where the route takes the purpose header) tallied apart, so that
//! `inferscope bench --compare-gateway` sets its figures beside the gateway's over exactly the
//! same requests, never beside totals that hold other traffic. The newest `MAX_RUNS` runs are
//! kept; a client cannot grow the table.

use crate::facts::Facts;
use crate::meter::RequestRecord;
use inferscope_meter::stats::{Tally, TallyStats};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use tokio::time::Instant;

/// The header a benchmark tags its requests with.
pub const RUN_HEADER: &str = "x-inferscope-run";

/// Runs kept: the newest ones, the oldest dropped first.
pub const MAX_RUNS: usize = 16;

/// A run id as a client may give it: 1 to 64 of `A-Z a-z 0-9 . _ : -`.
pub fn run_id(v: &[u8]) -> Option<Arc<str>> {
    let ok = (1..=64).contains(&v.len())
        && v.iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    ok.then(|| std::str::from_utf8(v).ok().map(Arc::from))
        .flatten()
}

#[derive(Debug)]
struct Run {
    id: Arc<str>,
    tally: Tally,
    first: Instant,
    last: Instant,
}

/// The tallies of the newest runs.
#[derive(Debug, Default)]
pub struct Runs {
    runs: Mutex<VecDeque<Run>>,
}

impl Runs {
    /// Adds a finished request to its run's tally (nothing for an untagged one).
    pub fn record(&self, rec: &RequestRecord) {
        let Some(id) = &Facts::of(&rec.meta).run else {
            return;
        };
        let now = Instant::now();
        let mut runs = self.runs.lock();
        if let Some(r) = runs.iter_mut().find(|r| r.id == *id) {
            r.tally.record(rec);
            r.last = now;
            return;
        }
        if runs.len() >= MAX_RUNS {
            runs.pop_front();
        }
        let mut tally = Tally::default();
        tally.record(rec);
        runs.push_back(Run {
            id: Arc::clone(id),
            tally,
            first: now,
            last: now,
        });
    }

    /// Run `id`'s figures, rates over the span from its first request's end to its last's.
    pub fn get(&self, id: &str) -> Option<TallyStats> {
        let runs = self.runs.lock();
        let r = runs.iter().find(|r| &*r.id == id)?;
        let span = r.last.saturating_duration_since(r.first).as_secs_f64();
        Some(r.tally.stats(Some(span)))
    }

    /// The ids kept, oldest first.
    pub fn ids(&self) -> Vec<String> {
        self.runs.lock().iter().map(|r| r.id.to_string()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_short_and_plain() {
        assert!(run_id(b"bench-1700000000000-9f2c").is_some());
        assert!(run_id(b"").is_none());
        assert!(run_id(&[b'a'; 65]).is_none());
        assert!(run_id(b"a b").is_none());
        assert!(run_id("é".as_bytes()).is_none());
    }
}
