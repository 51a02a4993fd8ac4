//! Live statistics: per group (`route`, `model`, `backend`, `variant`) a cumulative tally and a
//! sliding window of the last 60 s (six 10-s slots), with rollups built by merging at read time.
//! `/stats` JSON and Prometheus text are both rendered from these same histograms.

mod prometheus;
mod tally;

pub use prometheus::{render as render_prometheus, Scalar};
pub use tally::{Hist, Tally, METRICS};

use crate::meter::RequestRecord;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::time::Instant;

/// Length of the sliding window.
pub const WINDOW_SECS: u64 = 60;
const SLOT_SECS: u64 = 10;
const SLOTS: usize = (WINDOW_SECS / SLOT_SECS) as usize;

/// Label put in place of a model name once `max_groups` is reached (client-chosen model names
/// must not grow memory without bound).
pub const OTHER_MODEL: &str = "__other__";

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
}

#[derive(Debug, Default)]
struct Group {
    cumulative: Tally,
    slots: [Option<(u64, Tally)>; SLOTS],
}

/// Thread-safe statistics store. Updated once per finished request.
#[derive(Debug)]
pub struct Stats {
    groups: Mutex<HashMap<GroupKey, Group>>,
    start: Instant,
    max_groups: usize,
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
        self.groups.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds one finished request to its group's cumulative tally and current window slot.
    pub fn record(&self, r: &RequestRecord) {
        let epoch = self.start.elapsed().as_secs() / SLOT_SECS;
        let m = &r.meta;
        let mut key = GroupKey {
            route: Arc::clone(&m.route),
            model: Arc::clone(&m.model),
            backend: Arc::clone(&m.backend),
            variant: Arc::clone(&m.variant),
        };
        let mut groups = self.lock();
        if !groups.contains_key(&key) && groups.len() >= self.max_groups {
            key.model = Arc::from(OTHER_MODEL);
        }
        let g = groups.entry(key).or_default();
        g.cumulative.record(r);
        let slot = &mut g.slots[(epoch % SLOTS as u64) as usize];
        match slot {
            Some((e, t)) if *e == epoch => t.record(r),
            _ => {
                let mut t = Tally::default();
                t.record(r);
                *slot = Some((epoch, t));
            }
        }
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
    pub fn window_seconds(&self) -> f64 {
        self.uptime.min(WINDOW_SECS as f64)
    }

    /// The admin `/stats` document: groups, then rollups by each label and overall.
    pub fn to_json(&self) -> Value {
        let (up, win) = (self.uptime, self.window_seconds());
        let pair =
            |c: &Tally, w: &Tally| json!({ "cumulative": c.to_json(up), "window": w.to_json(win) });
        let groups: Vec<Value> = self
            .groups
            .iter()
            .map(|(k, c, w)| {
                let mut v = pair(c, w);
                if let Value::Object(m) = &mut v {
                    m.insert("route".into(), k.route.as_ref().into());
                    m.insert("model".into(), k.model.as_ref().into());
                    m.insert("backend".into(), k.backend.as_ref().into());
                    m.insert("variant".into(), k.variant.as_ref().into());
                }
                v
            })
            .collect();
        let mut rollups = Map::new();
        for label in ["route", "model", "backend", "variant"] {
            let mut by: BTreeMap<&str, (Tally, Tally)> = BTreeMap::new();
            for (k, c, w) in &self.groups {
                let name = match label {
                    "route" => &k.route,
                    "model" => &k.model,
                    "backend" => &k.backend,
                    _ => &k.variant,
                };
                let e = by.entry(name).or_default();
                e.0.merge(c);
                e.1.merge(w);
            }
            let list: Vec<Value> = by
                .iter()
                .map(|(name, (c, w))| {
                    let mut v = pair(c, w);
                    if let Value::Object(m) = &mut v {
                        m.insert(label.into(), (*name).into());
                    }
                    v
                })
                .collect();
            rollups.insert(label.into(), list.into());
        }
        let (mut c_all, mut w_all) = (Tally::default(), Tally::default());
        for (_, c, w) in &self.groups {
            c_all.merge(c);
            w_all.merge(w);
        }
        rollups.insert("all".into(), pair(&c_all, &w_all));
        json!({
            "uptime_s": (up * 1000.0).round() / 1000.0,
            "window_s": WINDOW_SECS,
            "units": "milliseconds",
            "groups": groups,
            "rollups": rollups,
        })
    }
}
