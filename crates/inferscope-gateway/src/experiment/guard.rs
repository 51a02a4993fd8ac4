//! Guardrails: per-variant SLOs over a sliding window with a minimum sample size. A breach rolls
//! the variant back — its traffic goes to the control — and it stays rolled back until an operator
//! resets it (`POST /experiments/reset`), which also clears its window, so stale samples cannot
//! trip it again at once. Trips are logged, counted and shown in `/experiments`.

use crate::config::GuardrailsConfig;
use crate::config::{GuardLatency, GuardMetric};
use crate::meter::{Outcome, RequestRecord};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::time::Instant;

/// Evaluated at most this often (per experiment).
const EVAL_EVERY: Duration = Duration::from_millis(250);

#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    ok: bool,
    ttft_ms: Option<f64>,
    tpot_ms: Option<f64>,
    e2e_ms: f64,
}

/// Why and when a variant was rolled back.
#[derive(Debug, Clone)]
pub struct Trip {
    /// When the rule tripped.
    pub at: SystemTime,
    /// The rule, as configured.
    pub rule: String,
    /// The observed value.
    pub value: f64,
    /// Samples in the window then.
    pub n: usize,
}

#[derive(Debug, Default)]
struct State {
    windows: HashMap<Arc<str>, VecDeque<Sample>>,
    /// Feedback per variant: (when, signal name, value).
    feedback: HashMap<Arc<str>, VecDeque<(Instant, String, f64)>>,
    tripped: HashMap<Arc<str>, Trip>,
    /// Variants a person put back (`reset`): a verdict does not roll them back again until
    /// new evidence comes (`clear_pardons`, at a posted result).
    pardoned: std::collections::HashSet<Arc<str>>,
    last_eval: Option<Instant>,
    trips_total: u64,
}

/// One experiment's guardrails.
#[derive(Debug)]
pub struct Guardrails {
    cfg: GuardrailsConfig,
    control: Arc<str>,
    state: Mutex<State>,
}

fn quantile(mut v: Vec<f64>, q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable_by(f64::total_cmp);
    crate::util::quantile::of_sorted_ms(&v, q)
}

impl Guardrails {
    /// Guardrails for an experiment whose control is `control`.
    pub fn new(cfg: GuardrailsConfig, control: &str) -> Self {
        Self {
            cfg,
            control: control.into(),
            state: Mutex::new(State::default()),
        }
    }

    /// True when `variant` is rolled back.
    pub fn tripped(&self, variant: &str) -> bool {
        self.state.lock().tripped.contains_key(variant)
    }

    /// The variant to serve instead of `variant` (itself unless rolled back).
    pub fn control(&self) -> &Arc<str> {
        &self.control
    }

    /// Adds one feedback value for `variant` (for `feedback:NAME` rules) and checks the rules.
    /// Returns the trips this caused.
    pub fn observe_feedback(
        &self,
        variant: &Arc<str>,
        name: &str,
        value: f64,
    ) -> Vec<(Arc<str>, Trip)> {
        if variant.as_ref() == self.control.as_ref() {
            return Vec::new();
        }
        let mut s = self.state.lock();
        s.feedback
            .entry(Arc::clone(variant))
            .or_default()
            .push_back((Instant::now(), name.to_string(), value));
        self.evaluate(&mut s, Instant::now())
    }

    /// Adds a finished request of a variant and, at most every 250 ms, checks the rules. Returns
    /// the trips this caused.
    pub fn observe(&self, r: &RequestRecord) -> Vec<(Arc<str>, Trip)> {
        let v = &r.meta.variant;
        if v.as_ref() == self.control.as_ref() {
            return Vec::new();
        }
        let now = Instant::now();
        let ms = crate::util::quantile::duration_ms;
        let mut s = self.state.lock();
        let w = s.windows.entry(Arc::clone(v)).or_default();
        w.push_back(Sample {
            at: now,
            ok: !matches!(
                r.outcome,
                Outcome::BackendError
                    | Outcome::Truncated
                    | Outcome::Timeout
                    | Outcome::GatewayError
            ),
            ttft_ms: r.ttft.map(ms),
            tpot_ms: r.tpot.map(ms),
            e2e_ms: ms(r.e2e),
        });
        if s.last_eval
            .is_some_and(|t| now.saturating_duration_since(t) < EVAL_EVERY)
        {
            return Vec::new();
        }
        self.evaluate(&mut s, now)
    }

    fn evaluate(&self, s: &mut State, now: Instant) -> Vec<(Arc<str>, Trip)> {
        s.last_eval = Some(now);
        let window = self.cfg.window;
        let mut trips = Vec::new();
        for f in s.feedback.values_mut() {
            while f
                .front()
                .is_some_and(|x| now.saturating_duration_since(x.0) > window)
            {
                f.pop_front();
            }
        }
        let mut variants: Vec<Arc<str>> =
            s.windows.keys().chain(s.feedback.keys()).cloned().collect();
        variants.sort();
        variants.dedup();
        for variant in variants {
            if let Some(w) = s.windows.get_mut(&variant) {
                while w
                    .front()
                    .is_some_and(|x| now.saturating_duration_since(x.at) > window)
                {
                    w.pop_front();
                }
            }
            for rule in &self.cfg.rules {
                if rule
                    .variant
                    .as_deref()
                    .is_some_and(|rv| rv != variant.as_ref())
                {
                    continue;
                }
                let (value, n) = match &rule.metric {
                    GuardMetric::Feedback(name) => {
                        let vals: Vec<f64> = s
                            .feedback
                            .get(&variant)
                            .into_iter()
                            .flatten()
                            .filter(|x| x.1 == *name)
                            .map(|x| x.2)
                            .collect();
                        let mean = (!vals.is_empty())
                            .then(|| vals.iter().sum::<f64>() / vals.len() as f64);
                        (mean, vals.len())
                    }
                    _ => match s.windows.get(&variant) {
                        Some(w) => (measure(&rule.metric, w), w.len()),
                        None => (None, 0),
                    },
                };
                let Some(value) = value.filter(|_| n >= self.cfg.min_samples) else {
                    continue;
                };
                let breached =
                    rule.max.is_some_and(|m| value > m) || rule.min.is_some_and(|m| value < m);
                if breached {
                    trips.push((Arc::clone(&variant), rule.describe(), value, n));
                    break;
                }
            }
        }
        let mut new = Vec::new();
        for (variant, rule, value, n) in trips {
            if s.tripped.contains_key(&variant) {
                continue;
            }
            tracing::warn!(variant = %variant, rule = %rule, value, n, control = %self.control, "guardrail tripped: variant rolled back to the control");
            s.trips_total += 1;
            let trip = Trip {
                at: SystemTime::now(),
                rule,
                value,
                n,
            };
            s.tripped.insert(Arc::clone(&variant), trip.clone());
            new.push((variant, trip));
        }
        new
    }

    /// Rolls `variant` back for `rule` (a reason other than the configured rules: a `reject`
    /// verdict); `None` when it is the control or already rolled back.
    pub fn trip(&self, variant: &str, rule: &str) -> Option<Trip> {
        if variant == self.control.as_ref() {
            return None;
        }
        let mut s = self.state.lock();
        if s.tripped.contains_key(variant) || s.pardoned.contains(variant) {
            return None;
        }
        tracing::warn!(variant = %variant, rule = %rule, control = %self.control, "variant rolled back to the control");
        s.trips_total += 1;
        let trip = Trip {
            at: SystemTime::now(),
            rule: rule.to_owned(),
            value: 0.0,
            n: 0,
        };
        s.tripped.insert(Arc::from(variant), trip.clone());
        Some(trip)
    }

    /// The variants `reset(variant)` would put back now.
    pub fn tripped_among(&self, variant: Option<&str>) -> Vec<String> {
        self.state
            .lock()
            .tripped
            .keys()
            .filter(|k| variant.is_none_or(|v| k.as_ref() == v))
            .map(|k| k.to_string())
            .collect()
    }

    /// Un-trips `variant` (all variants when `None`) and clears its window. Returns the variants
    /// that were reset.
    pub fn reset(&self, variant: Option<&str>) -> Vec<String> {
        let mut s = self.state.lock();
        let names: Vec<Arc<str>> = s
            .tripped
            .keys()
            .filter(|k| variant.is_none_or(|v| k.as_ref() == v))
            .cloned()
            .collect();
        for n in &names {
            s.tripped.remove(n);
            s.windows.remove(n);
            s.feedback.remove(n);
            s.pardoned.insert(Arc::clone(n));
            tracing::info!(variant = %n, "guardrail reset: variant back in the experiment");
        }
        names.iter().map(|n| n.to_string()).collect()
    }

    /// Marks `variant` as put back by a person (as before a restart).
    pub fn pardon(&self, variant: &str) {
        self.state.lock().pardoned.insert(Arc::from(variant));
    }

    /// New evidence (a posted result): a verdict may roll back a variant a person put back.
    pub fn clear_pardons(&self) {
        self.state.lock().pardoned.clear();
    }

    /// Trips since start.
    pub fn trips_total(&self) -> u64 {
        self.state.lock().trips_total
    }

    /// The state, for `/experiments`.
    pub fn view(&self) -> super::GuardrailsView {
        let s = self.state.lock();
        super::GuardrailsView {
            window_s: self.cfg.window.as_secs_f64(),
            min_samples: self.cfg.min_samples,
            rules: self.cfg.rules.iter().map(|r| r.describe()).collect(),
            tripped: s
                .tripped
                .iter()
                .map(|(v, t)| super::TripView {
                    variant: v.to_string(),
                    rule: t.rule.clone(),
                    value: t.value,
                    samples: t.n,
                    at: crate::util::time::rfc3339(t.at),
                })
                .collect(),
            trips_total: s.trips_total,
        }
    }
}

/// The value of a latency percentile or the error rate over a window (`None` for a feedback
/// metric, which is not measured from requests).
fn measure(metric: &GuardMetric, w: &VecDeque<Sample>) -> Option<f64> {
    let (of, percentile) = match *metric {
        GuardMetric::ErrorRate => {
            return Some(w.iter().filter(|s| !s.ok).count() as f64 / w.len() as f64)
        }
        GuardMetric::Latency { of, percentile } => (of, percentile),
        GuardMetric::Feedback(_) => return None,
    };
    let values: Vec<f64> = match of {
        GuardLatency::Ttft => w.iter().filter_map(|s| s.ttft_ms).collect(),
        GuardLatency::Tpot => w.iter().filter_map(|s| s.tpot_ms).collect(),
        GuardLatency::E2e => w.iter().map(|s| s.e2e_ms).collect(),
    };
    quantile(values, f64::from(percentile) / 100.0)
}
