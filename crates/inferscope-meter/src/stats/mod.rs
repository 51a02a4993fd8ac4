//! Live statistics: per group (`route`, `model`, `backend`, `variant`) a cumulative tally and a
//! sliding window of the last 60 s (six 10-s slots), with rollups built by merging at read time.
//! `/stats` JSON and Prometheus text are both rendered from these same histograms.

mod doc;
pub mod hdr;
mod prometheus;
mod tally;

pub use doc::{
    EngineSpanCounts, GoodputStats, GroupStats, LatencyStats, Periods, RollupRow, Rollups,
    StatsDoc, TallyStats,
};
pub use prometheus::{
    native as native_histogram, render as render_prometheus, write as write_prometheus, Scalar,
    DURATION_BOUNDS, LAG_BOUNDS, NATIVE_SCHEMA, TPOT_BOUNDS, TTFT_BOUNDS,
};
pub use tally::{Hist, Tally, METRICS};

use crate::{Purpose, RequestRecord};
use parking_lot::{Mutex, MutexGuard};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use tokio::time::Instant;

/// Length of the sliding window.
pub(crate) const WINDOW_SECS: u64 = 60;
const SLOT_SECS: u64 = 10;
const SLOTS: usize = (WINDOW_SECS / SLOT_SECS) as usize;

/// Label put in place of a model name once `max_groups` is reached (client-chosen model names
/// must not grow memory without bound).
pub(crate) const OTHER_MODEL: &str = "__other__";

/// The labels that identify a group.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupKey {
    /// Route name.
    pub route: Arc<str>,
    /// Requested model.
    pub model: Arc<str>,
    /// Backend name.
    pub backend: Arc<str>,
    /// Experiment variant.
    pub variant: Arc<str>,
    /// Why the requests were sent (only `live` enters the rollups).
    pub purpose: Purpose,
    /// The client asked for a streamed response (E2E means something else for each kind).
    pub stream: bool,
}

impl GroupKey {
    /// `stream` as a label value.
    pub(crate) fn stream_label(&self) -> &'static str {
        if self.stream {
            "true"
        } else {
            "false"
        }
    }
}

#[derive(Debug, Default)]
struct Group {
    cumulative: Tally,
    slots: [Option<(u64, Tally)>; SLOTS],
}

impl Group {
    /// Adds one finished request to the cumulative tally and to the slot of `epoch`.
    fn add(&mut self, epoch: u64, r: &RequestRecord) {
        self.cumulative.record(r);
        self.slot(epoch).record(r);
    }

    /// Adds a request's engine span (joined at `epoch`).
    fn add_engine(&mut self, epoch: u64, r: &RequestRecord) {
        self.cumulative.record_engine(r);
        self.slot(epoch).record_engine(r);
    }

    /// The window's tally of `epoch`, emptied when it last held an older one.
    fn slot(&mut self, epoch: u64) -> &mut Tally {
        let slot = &mut self.slots[(epoch % SLOTS as u64) as usize];
        if !matches!(slot, Some((e, _)) if *e == epoch) {
            *slot = None;
        }
        &mut slot.get_or_insert_with(|| (epoch, Tally::window_slot())).1
    }
}

/// Thread-safe statistics store. Updated once per finished request.
#[derive(Debug)]
pub struct Stats {
    groups: Mutex<HashMap<GroupKey, Group>>,
    start: Instant,
    max_groups: usize,
}

impl crate::RecordSink for Stats {
    fn record(&self, rec: &Arc<RequestRecord>) {
        Stats::record(self, rec);
    }
}

/// A consistent copy of the tallies, taken under the lock and rendered outside it.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Seconds since start.
    pub uptime: f64,
    /// Per group: (key, cumulative, last-60-s window).
    pub groups: Vec<(GroupKey, Tally, Tally)>,
}

impl Stats {
    /// An empty store holding at most `max_groups` distinct groups.
    pub fn new(max_groups: usize) -> Self {
        Self {
            groups: Mutex::new(HashMap::new()),
            start: Instant::now(),
            max_groups,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<GroupKey, Group>> {
        self.groups.lock()
    }

    /// Adds what a request's engine span said to its group (after `record`, once the span was
    /// joined or given up on).
    pub fn record_engine(&self, r: &RequestRecord) {
        if r.engine_span.get().is_none() {
            return;
        }
        self.update(r, |g, epoch| g.add_engine(epoch, r));
    }

    /// Adds one finished request to its group's cumulative tally and current window slot.
    pub fn record(&self, r: &RequestRecord) {
        self.update(r, |g, epoch| g.add(epoch, r));
    }

    fn update(&self, r: &RequestRecord, f: impl FnOnce(&mut Group, u64)) {
        let epoch = self.start.elapsed().as_secs() / SLOT_SECS;
        let m = &r.meta;
        let mut key = GroupKey {
            route: Arc::clone(&m.route),
            model: Arc::clone(&m.model),
            backend: Arc::clone(&m.backend),
            variant: Arc::clone(&m.variant),
            purpose: m.purpose,
            stream: m.stream,
        };
        let mut groups = self.lock();
        // One lookup for a known group (every request but a group's first).
        if let Some(g) = groups.get_mut(&key) {
            f(g, epoch);
            return;
        }
        if groups.len() >= self.max_groups {
            key.model = Arc::from(OTHER_MODEL);
        }
        f(groups.entry(key).or_default(), epoch);
    }

    /// Output tokens of every request `backend` answered over the window (every group: every
    /// purpose, every variant), and the window's length in seconds; counters only, no histogram
    /// copied.
    pub fn window_output_tokens(&self, backend: &str) -> (u64, f64) {
        let elapsed = self.start.elapsed();
        let epoch = elapsed.as_secs() / SLOT_SECS;
        let groups = self.lock();
        let tokens = groups
            .iter()
            .filter(|(k, _)| *k.backend == *backend)
            .flat_map(|(_, g)| g.slots.iter().flatten())
            .filter(|(e, _)| epoch.saturating_sub(*e) < SLOTS as u64)
            .map(|(_, t)| t.output_tokens)
            .sum();
        (tokens, elapsed.as_secs_f64().min(WINDOW_SECS as f64))
    }

    /// Copies every group's tallies (window = slots of the last 60 s).
    pub fn snapshot(&self) -> Snapshot {
        let elapsed = self.start.elapsed();
        let epoch = elapsed.as_secs() / SLOT_SECS;
        let groups = self.lock();
        let mut out: Vec<(GroupKey, Tally, Tally)> = groups
            .iter()
            .map(|(k, g)| {
                let mut w = Tally::default();
                for (e, t) in g.slots.iter().flatten() {
                    if epoch.saturating_sub(*e) < SLOTS as u64 {
                        w.merge(t);
                    }
                }
                (k.clone(), g.cumulative.clone(), w)
            })
            .collect();
        drop(groups);
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Snapshot {
            uptime: elapsed.as_secs_f64(),
            groups: out,
        }
    }
}

impl Snapshot {
    /// Seconds the window covers (shorter than 60 s right after start).
    pub(crate) fn window_seconds(&self) -> f64 {
        self.uptime.min(WINDOW_SECS as f64)
    }

    /// The admin `/stats` document: groups, then rollups by each label and overall.
    pub fn doc(&self) -> StatsDoc {
        let (up, win) = (self.uptime, self.window_seconds());
        let periods = |c: &Tally, w: &Tally| Periods {
            cumulative: c.stats(Some(up)),
            window: w.stats(Some(win)),
        };
        let groups = self
            .groups
            .iter()
            .map(|(k, c, w)| GroupStats {
                route: k.route.to_string(),
                model: k.model.to_string(),
                backend: k.backend.to_string(),
                variant: k.variant.to_string(),
                purpose: k.purpose.as_str().to_string(),
                stream: k.stream,
                cumulative: c.stats(Some(up)),
                window: w.stats(Some(win)),
            })
            .collect();
        // Rollups are of live traffic (`purpose`: each purpose's own).
        let by = |label: &str| -> Vec<RollupRow> {
            let mut by: BTreeMap<&str, (Tally, Tally)> = BTreeMap::new();
            for (k, c, w) in &self.groups {
                let name = match label {
                    "purpose" => k.purpose.as_str(),
                    _ if k.purpose != Purpose::Live => continue,
                    "route" => &k.route,
                    "model" => &k.model,
                    "backend" => &k.backend,
                    "stream" => k.stream_label(),
                    _ => &k.variant,
                };
                let e = by.entry(name).or_default();
                e.0.merge(c);
                e.1.merge(w);
            }
            by.iter()
                .map(|(name, (c, w))| {
                    let mut row = RollupRow {
                        route: None,
                        model: None,
                        backend: None,
                        variant: None,
                        stream: None,
                        purpose: None,
                        periods: periods(c, w),
                    };
                    let slot = match label {
                        "route" => &mut row.route,
                        "model" => &mut row.model,
                        "backend" => &mut row.backend,
                        "stream" => &mut row.stream,
                        "purpose" => &mut row.purpose,
                        _ => &mut row.variant,
                    };
                    *slot = Some((*name).to_string());
                    row
                })
                .collect()
        };
        let (mut c_all, mut w_all) = (Tally::default(), Tally::default());
        for (_, c, w) in self.groups.iter().filter(|g| g.0.purpose == Purpose::Live) {
            c_all.merge(c);
            w_all.merge(w);
        }
        StatsDoc {
            uptime_s: (up * 1000.0).round() / 1000.0,
            window_s: WINDOW_SECS,
            units: "milliseconds".into(),
            groups,
            rollups: Rollups {
                route: by("route"),
                model: by("model"),
                backend: by("backend"),
                variant: by("variant"),
                stream: by("stream"),
                purpose: by("purpose"),
                all: periods(&c_all, &w_all),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Outcome, RequestMeta};
    use std::time::Duration;

    fn record(route: &str, ttft_ms: u64) -> RequestRecord {
        let meta = {
            let mut m = RequestMeta::new(http::Method::POST, "/v1/chat/completions");
            m.route = Arc::from(route);
            m.model = Arc::from("m");
            m.backend = Arc::from("b");
            m.stream = true;
            m
        };
        let mut r = RequestRecord::without_body(meta, 200, Outcome::Ok, None, 0);
        r.ttft = Some(Duration::from_millis(ttft_ms));
        r.output_tokens = Some(10);
        r
    }

    #[tokio::test(start_paused = true)]
    async fn window_forgets_after_sixty_seconds_cumulative_does_not() {
        let stats = Stats::new(16);
        stats.record(&record("a", 100));
        tokio::time::advance(Duration::from_secs(45)).await;
        stats.record(&record("a", 200));
        let snap = stats.snapshot();
        let (_, cum, win) = &snap.groups[0];
        assert_eq!((cum.requests, win.requests), (2, 2));
        tokio::time::advance(Duration::from_secs(30)).await; // t = 75 s: the first left the window
        let snap = stats.snapshot();
        let (_, cum, win) = &snap.groups[0];
        assert_eq!((cum.requests, win.requests), (2, 1));
        assert_eq!(win.hists[0].count(), 1);
        let json = serde_json::to_value(snap.doc()).unwrap_or_default();
        // HdrHistograms: cumulative at 3 significant digits (0.1%), window slots at 2 (1%).
        let near = |v: &serde_json::Value, want: f64, rel: f64| {
            (v.as_f64().unwrap_or(0.0) - want).abs() <= want * rel
        };
        let (g, c) = (
            &json["groups"][0]["window"]["ttft"],
            &json["groups"][0]["cumulative"]["ttft"],
        );
        assert!(
            near(&g["max"], 200.0, 0.01) && near(&g["p50"], 200.0, 0.01),
            "{json}"
        );
        assert!(near(&c["p50"], 100.0, 0.001), "{json}");
        // 10 tokens over the 60-s window; 20 over 75 s of uptime.
        assert_eq!(json["groups"][0]["window"]["output_tokens_per_s"], 0.167);
        assert_eq!(
            json["rollups"]["all"]["cumulative"]["output_tokens_per_s"],
            0.267
        );
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(stats.snapshot().groups[0].2.requests, 0);
    }

    #[test]
    fn rollups_merge_groups_and_cardinality_is_capped() {
        let stats = Stats::new(2);
        stats.record(&record("a", 10));
        stats.record(&record("b", 20));
        stats.record(&record("c", 30)); // third group: over the cap, folded into __other__
        let json = serde_json::to_value(stats.snapshot().doc()).unwrap_or_default();
        assert_eq!(json["rollups"]["all"]["cumulative"]["requests"], 3);
        let empty = Vec::new();
        let models: Vec<&str> = json["rollups"]["model"]
            .as_array()
            .unwrap_or(&empty)
            .iter()
            .filter_map(|m| m["model"].as_str())
            .collect();
        assert_eq!(models, vec![OTHER_MODEL, "m"]);
        assert_eq!(json["rollups"]["route"].as_array().map(Vec::len), Some(3));
    }
}
