//! The gateway's figures per benchmark run: the requests a client tagged with one run id
//! (`x-inferscope-run`, taken where the route takes the purpose header) tallied apart, so that
//! `inferscope bench --compare-gateway` sets its figures beside the gateway's over exactly the
//! same requests, never beside totals that hold other traffic. `MAX_RUNS` runs are kept, the
//! one that went longest without a request let go first; one client (its key, else its address)
//! holds at most `MAX_RUNS_PER_CLIENT`, its own oldest let go for its next: a client cannot grow
//! the table, nor push a running benchmark out of it with forged ids.

use crate::facts::Facts;
use crate::meter::RequestRecord;
use inferscope_meter::stats::{Tally, TallyStats};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use tokio::time::Instant;

/// The header a benchmark tags its requests with.
pub const RUN_HEADER: &str = "x-inferscope-run";

/// Runs kept: the most recently active ones.
pub const MAX_RUNS: usize = 16;
/// Runs one client holds at most.
pub const MAX_RUNS_PER_CLIENT: usize = 4;

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
    /// Who started it (`facts::client_id`).
    owner: u64,
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
        let owner = crate::facts::client_id(
            Facts::of(&rec.meta).key.as_deref(),
            rec.meta.client.map(|a| a.ip()),
        );
        let own: Vec<usize> = (0..runs.len())
            .filter(|i| runs[*i].owner == owner)
            .collect();
        let evict = if own.len() >= MAX_RUNS_PER_CLIENT {
            own.first().copied()
        } else if runs.len() >= MAX_RUNS {
            (0..runs.len()).min_by_key(|i| runs[*i].last)
        } else {
            None
        };
        if let Some(i) = evict {
            runs.remove(i);
        }
        let mut tally = Tally::default();
        tally.record(rec);
        runs.push_back(Run {
            id: Arc::clone(id),
            owner,
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

    fn tagged(run: &str, from: [u8; 4]) -> RequestRecord {
        let mut m = crate::meter::RequestMeta::new(http::Method::POST, "/v1/chat/completions");
        m.client = Some(std::net::SocketAddr::from((from, 1234)));
        Facts::of_mut(&mut m).run = run_id(run.as_bytes());
        RequestRecord::without_body(m, 200, crate::meter::Outcome::Ok, None, 0)
    }

    #[tokio::test(start_paused = true)]
    async fn forged_run_ids_cannot_push_a_running_benchmark_out() {
        let runs = Runs::default();
        runs.record(&tagged("bench-1", [10, 0, 0, 1]));
        // One address forging 40 ids holds 4 at most; the benchmark stays.
        for i in 0..40 {
            runs.record(&tagged(&format!("forged-{i}"), [10, 0, 0, 66]));
        }
        assert_eq!(runs.ids().len(), 5);
        assert!(runs.get("bench-1").is_some());
        // Many addresses: the run that went longest without a request goes first, and a
        // running benchmark keeps sending.
        for i in 0..40u8 {
            tokio::time::advance(std::time::Duration::from_millis(10)).await;
            runs.record(&tagged("bench-1", [10, 0, 0, 1]));
            runs.record(&tagged(&format!("many-{i}"), [10, 1, 0, i]));
        }
        assert_eq!(runs.ids().len(), MAX_RUNS);
        assert!(runs.get("bench-1").is_some());
    }

    #[test]
    fn run_ids_are_short_and_plain() {
        assert!(run_id(b"bench-1700000000000-9f2c").is_some());
        assert!(run_id(b"").is_none());
        assert!(run_id(&[b'a'; 65]).is_none());
        assert!(run_id(b"a b").is_none());
        assert!(run_id("é".as_bytes()).is_none());
    }
}
