//! Quality results beside latency: what `inferscope eval` measured per variant (accuracy on a
//! suite, perplexity on a corpus), posted to admin `POST /experiments/quality` or read by `report`
//! from the eval's JSON, and the joined verdict of each variant against the control — latency
//! change, quality change, throughput — judged against the experiment's `accept:` limits.
//!
//! Every limit is judged on a 95% interval, never on a point estimate: a limit is met when the
//! whole interval is on its good side, broken when the whole interval is on its bad side, and
//! undecided otherwise (or while the data is missing). A variant is accepted when every limit is
//! met, rejected when any is broken, and undecided otherwise.

use super::{FeedbackMean, Metric, Summary, VariantSummary};
use crate::config::AcceptConfig;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Results kept per route (suites and corpora); a post beyond it is refused.
pub const MAX_RESULTS_PER_ROUTE: usize = 64;

/// What a quality result measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QualityKind {
    /// Share of items answered right (`value` in 0..=1; differences in the same unit).
    Accuracy,
    /// Token-level perplexity of a reference text (lower is better).
    Perplexity,
}

/// One variant's score.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QualityVariant {
    /// Variant name.
    pub variant: String,
    /// Accuracy (0..=1) or perplexity.
    pub value: f64,
    /// 95% interval of `value`, where there is one.
    #[serde(default)]
    pub ci95: Option<[f64; 2]>,
    /// Items asked or tokens scored.
    pub n: u64,
}

/// One variant against the control, paired over the same items or windows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QualityComparison {
    /// Variant name.
    pub variant: String,
    /// Variant minus control, in `value`'s unit.
    pub difference: f64,
    /// 95% interval of the difference (`None`: too little data for one, e.g. a single window).
    #[serde(default)]
    pub ci95: Option<[f64; 2]>,
}

/// One eval run: a suite (or corpus) scored on every variant. `inferscope eval --json` prints it
/// (with more fields, which are kept in the eval's output and not needed here).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QualityResult {
    /// Accuracy or perplexity.
    pub kind: QualityKind,
    /// The suite or corpus (e.g. `mmlu`, `gsm8k`, the corpus file's name).
    pub suite: String,
    /// The model requested.
    #[serde(default)]
    pub model: Option<String>,
    /// The route it was measured on (else found from `model` and `path`).
    #[serde(default)]
    pub route: Option<String>,
    /// The path the eval's requests used.
    #[serde(default)]
    pub path: Option<String>,
    /// The control variant.
    pub control: String,
    /// Per variant, the control among them.
    pub variants: Vec<QualityVariant>,
    /// Every other variant against the control.
    #[serde(default)]
    pub comparisons: Vec<QualityComparison>,
    /// Perplexity: what a window is counted in (`tokens`, or characters and why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
}

/// The answer to a result posted to admin `POST /experiments/quality`: where it was filed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Filed {
    /// The route the result was filed under.
    pub route: String,
    /// Its experiment.
    pub experiment: String,
}

/// Why a posted result was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum QualityError {
    /// Not the expected JSON.
    #[error("not a quality result: {0}")]
    Invalid(String),
    /// It names no experiment.
    #[error("{0}")]
    NoExperiment(String),
    /// Too many suites on this route already.
    #[error("route `{0}` holds {MAX_RESULTS_PER_ROUTE} results already; post to an existing suite name to replace one")]
    Full(String),
    /// It could not be kept in the state directory (so it was not taken: post it again).
    #[error("could not keep it in {0}")]
    Store(String),
}

impl QualityResult {
    /// Parses and checks a posted result: finite numbers, the control among the variants, every
    /// comparison about a listed variant.
    pub fn parse(body: &[u8]) -> Result<Self, QualityError> {
        let r: QualityResult =
            serde_json::from_slice(body).map_err(|e| QualityError::Invalid(e.to_string()))?;
        r.check().map_err(QualityError::Invalid)?;
        Ok(r)
    }

    /// Checks the result makes sense, not only its form: names on one line without control or
    /// bidi characters (they are printed in terminals and pages); accuracies in 0–1 and their
    /// differences in −1–1, perplexities of at least 1; each interval ordered (low ≤ high) in
    /// the same range; the control among the variants, each comparison about a listed variant.
    fn check(&self) -> Result<(), String> {
        let name_ok = |s: &str, max: usize| {
            !s.trim().is_empty() && s.len() <= max && !s.chars().any(crate::util::label::is_unsafe)
        };
        if !name_ok(&self.suite, 200) {
            return Err("`suite` must be a name of 1 to 200 characters on one line, without control or bidirectional characters".into());
        }
        if self.variants.is_empty() || self.variants.len() > 64 {
            return Err("`variants` must list 1 to 64 variants".into());
        }
        let accuracy = self.kind == QualityKind::Accuracy;
        let value_ok = |x: f64| {
            x.is_finite()
                && if accuracy {
                    (0.0..=1.0).contains(&x)
                } else {
                    x >= 1.0
                }
        };
        let value_range = if accuracy {
            "an accuracy is a share in 0..1"
        } else {
            "a perplexity is at least 1"
        };
        // An interval is ordered and within the value's own range. (It need not hold its
        // estimate: a percentile bootstrap's may not.)
        let ordered = |ci: &Option<[f64; 2]>, ok: &dyn Fn(f64) -> bool| {
            ci.is_none_or(|[lo, hi]| ok(lo) && ok(hi) && lo <= hi)
        };
        for v in &self.variants {
            if !name_ok(&v.variant, 200) {
                return Err("a variant's name must be 1 to 200 characters without control or bidirectional characters".into());
            }
            if !value_ok(v.value) || !ordered(&v.ci95, &value_ok) {
                return Err(format!(
                    "variant `{}`: {value_range}, and its ci95 must be [low, high] in the same range",
                    v.variant
                ));
            }
        }
        if !self.variants.iter().any(|v| v.variant == self.control) {
            return Err(format!(
                "the control `{}` is not among the variants",
                self.control
            ));
        }
        let difference_ok = |d: f64| d.is_finite() && (!accuracy || (-1.0..=1.0).contains(&d));
        for c in &self.comparisons {
            if !self.variants.iter().any(|v| v.variant == c.variant) {
                return Err(format!(
                    "comparison of `{}`, which is not among the variants",
                    c.variant
                ));
            }
            if !difference_ok(c.difference) || !ordered(&c.ci95, &difference_ok) {
                return Err(format!(
                    "comparison of `{}`: the difference (variant − control{}) and its ci95 [low, high] must be finite{}",
                    c.variant,
                    if accuracy { ", in −1..1" } else { "" },
                    if accuracy { " shares" } else { "" },
                ));
            }
        }
        Ok(())
    }

    /// The comparison of `variant` with the control.
    pub fn comparison(&self, variant: &str) -> Option<&QualityComparison> {
        self.comparisons.iter().find(|c| c.variant == variant)
    }
}

/// One route's results, by kind and suite.
type Suites = BTreeMap<(QualityKind, String), QualityResult>;

/// The latest result of each suite, per route: in memory, and with a state directory
/// (`state_dir:`) also appended to its `quality.jsonl`, synced before the post is answered and
/// read back at start, so a restart keeps them.
#[derive(Debug, Default)]
pub struct Quality {
    by_route: Mutex<HashMap<Arc<str>, Suites>>,
    /// `quality.jsonl`, where a state directory is.
    journal: std::sync::OnceLock<super::journal::Journal>,
    /// One post at a time: the file's order is the order results take effect in.
    posting: tokio::sync::Mutex<()>,
}

/// A `quality.jsonl` line: the route and the result filed for it.
#[derive(Debug, Serialize, Deserialize)]
struct Kept {
    route: String,
    result: QualityResult,
}

impl Quality {
    /// Keeps results in `path` from now on, after reading back what it holds (torn and invalid
    /// lines skipped, results that no longer pass the checks left out); returns how many
    /// results were read back.
    pub fn persist_to(&self, path: &std::path::Path) -> std::io::Result<usize> {
        let (journal, back) =
            super::journal::Journal::open(path, "quality.jsonl", Some(Self::compact))?;
        for line in back.text.lines() {
            let Ok(k) = serde_json::from_str::<Kept>(line) else {
                continue;
            };
            if k.result.check().is_ok() {
                let _ = self.insert(&Arc::from(k.route.as_str()), k.result);
            }
        }
        let _ = self.journal.set(journal);
        Ok(self.by_route.lock().values().map(BTreeMap::len).sum())
    }

    /// The journal, where a state directory is.
    pub fn journal(&self) -> Option<&super::journal::Journal> {
        self.journal.get()
    }

    /// `quality.jsonl` compacted: the latest line of each route's suite, in the order of those
    /// lines.
    fn compact(text: &str) -> Vec<String> {
        let mut latest: HashMap<(String, QualityKind, String), usize> = HashMap::new();
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            if let Ok(k) = serde_json::from_str::<Kept>(l) {
                latest.insert((k.route, k.result.kind, k.result.suite), i);
            }
        }
        let mut keep: Vec<usize> = latest.into_values().collect();
        keep.sort_unstable();
        keep.into_iter().map(|i| lines[i].to_owned()).collect()
    }

    /// Keeps `r` as route `route`'s result for its suite, replacing an earlier one; with a state
    /// directory, only once it is on disk.
    pub async fn post(&self, route: &Arc<str>, r: QualityResult) -> Result<(), QualityError> {
        let _turn = self.posting.lock().await;
        {
            let all = self.by_route.lock();
            let full = all.get(route).is_some_and(|m| {
                !m.contains_key(&(r.kind, r.suite.clone())) && m.len() >= MAX_RESULTS_PER_ROUTE
            });
            if full {
                return Err(QualityError::Full(route.to_string()));
            }
        }
        if let Some(j) = self.journal.get() {
            let line = serde_json::to_string(&Kept {
                route: route.to_string(),
                result: r.clone(),
            })
            .map_err(|e| QualityError::Store(e.to_string()))?;
            j.append_synced(line)
                .await
                .map_err(|e| QualityError::Store(format!("{}: {e}", j.path().display())))?;
        }
        self.insert(route, r)
    }

    fn insert(&self, route: &Arc<str>, r: QualityResult) -> Result<(), QualityError> {
        let mut all = self.by_route.lock();
        let results = all.entry(Arc::clone(route)).or_default();
        let key = (r.kind, r.suite.clone());
        if !results.contains_key(&key) && results.len() >= MAX_RESULTS_PER_ROUTE {
            return Err(QualityError::Full(route.to_string()));
        }
        results.insert(key, r);
        Ok(())
    }

    /// Route `route`'s results, accuracy first, by suite.
    pub fn results(&self, route: &str) -> Vec<QualityResult> {
        self.by_route
            .lock()
            .get(route)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }
}

/// What a variant's output costs, from its backends' `price:`: the amount, and its currency.
#[derive(Debug, Clone, PartialEq)]
pub struct VariantPrice {
    /// Per token or per hour.
    pub basis: PriceBasis,
    /// The backends' currency (`USD`).
    pub currency: String,
}

/// How a variant is priced.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PriceBasis {
    /// A list price per million output tokens (every backend of the variant has the same).
    PerMillion(f64),
    /// What its backends cost per hour together (GPU-hour price × GPUs, summed).
    PerHour(f64),
}

impl VariantPrice {
    /// The price of a variant served by `backends`: `None` when one has no price, or when they
    /// are priced differently (per token and per hour, at different list prices, or in different
    /// currencies).
    pub fn of(backends: &[&crate::config::BackendConfig]) -> Option<Self> {
        use PriceBasis::{PerHour, PerMillion};
        let mut out: Option<PriceBasis> = None;
        let mut currency: Option<&str> = None;
        for b in backends {
            let p = b.price.as_ref()?;
            if currency.is_some_and(|c| c != p.currency()) {
                return None;
            }
            currency = Some(p.currency());
            let gpus = b.gpu.as_ref().map_or(1, |g| g.count.max(1));
            let this = match (p.per_million_output_tokens, p.per_gpu_hour) {
                (Some(m), None) => PerMillion(m),
                (None, Some(h)) => PerHour(h * f64::from(gpus)),
                _ => return None,
            };
            out = Some(match (out, this) {
                (None, t) => t,
                (Some(PerMillion(a)), PerMillion(b)) if a == b => PerMillion(a),
                (Some(PerHour(a)), PerHour(b)) => PerHour(a + b),
                _ => return None,
            });
        }
        Some(Self {
            basis: out?,
            currency: currency?.to_owned(),
        })
    }

    /// Money per million output tokens, and on what basis: a list price as it is; an hourly
    /// price over the tokens served per second (`served`) at the load the variant saw.
    pub fn per_million(&self, served: Option<f64>) -> Option<(f64, &'static str)> {
        match self.basis {
            PriceBasis::PerMillion(p) => Some((p, "list price")),
            PriceBasis::PerHour(h) => served
                .filter(|t| *t > 0.0)
                .map(|t| (h / (t * 3600.0) * 1e6, "at the load served")),
        }
    }
}

/// Adds each variant's cost per million output tokens (`cost_per_million_output_tokens`,
/// `cost_basis`) to `summarize`'s output, from `prices` by variant.
pub fn add_costs(summary: &mut Summary, prices: &BTreeMap<String, VariantPrice>) {
    for v in &mut summary.variants {
        let served = v.served_output_tokens_per_s;
        let Some(price) = prices.get(&v.variant) else {
            continue;
        };
        if let Some((cost, basis)) = price.per_million(served) {
            v.cost_per_million_output_tokens = Some((cost * 1e4).round() / 1e4);
            v.cost_basis = Some(basis.to_string());
            v.cost_currency = Some(price.currency.clone());
        }
    }
}

/// Adds each variant's GPU power and energy per output token (`gpu_watts`,
/// `joules_per_output_token`) from `energy` by variant: (watts, output tokens per second its
/// GPUs produced), both over the same last minute.
pub fn add_energy(summary: &mut Summary, energy: &BTreeMap<String, (f64, f64)>) {
    for v in &mut summary.variants {
        let Some((w, per_s)) = energy.get(&v.variant) else {
            continue;
        };
        v.gpu_watts = Some((w * 10.0).round() / 10.0);
        v.joules_per_output_token = (*per_s > 0.0).then(|| ((w / per_s) * 1e4).round() / 1e4);
    }
}

/// `x` with its sign (U+2212 for minus), `decimals` places.
fn signed(x: f64, decimals: usize) -> String {
    let s = format!("{:.*}", decimals, x.abs());
    let zero = s.chars().all(|c| c == '0' || c == '.');
    if zero {
        s
    } else if x < 0.0 {
        format!("\u{2212}{s}")
    } else {
        format!("+{s}")
    }
}

/// `value [lo, hi]` with signs, in `scale` units (100: fractions shown as percent or points).
fn with_interval(d: f64, ci: Option<[f64; 2]>, scale: f64, decimals: usize, unit: &str) -> String {
    let v = signed(d * scale, decimals);
    match ci {
        Some([lo, hi]) => format!(
            "{v}{unit} [{}, {}]",
            signed(lo * scale, decimals),
            signed(hi * scale, decimals)
        ),
        None => format!("{v}{unit} (no interval)"),
    }
}

/// The state of one limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// The whole interval is on the limit's good side.
    Met,
    /// The whole interval is on its bad side.
    Broken,
    /// The interval straddles the limit, or there is no data yet.
    Undecided,
}

impl State {
    /// The name in JSON and in the report.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Met => "met",
            State::Broken => "broken",
            State::Undecided => "undecided",
        }
    }
}

/// What the joined verdict decides for a variant, from the states of its checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Every limit is met.
    Accept,
    /// A limit is broken.
    Reject,
    /// Neither yet.
    Undecided,
}

impl Decision {
    /// The name in JSON and in the report's row.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Accept => "accept",
            Decision::Reject => "reject",
            Decision::Undecided => "undecided",
        }
    }

    fn of(checks: &[Check]) -> Self {
        if checks.iter().any(|c| c.state == State::Broken) {
            Decision::Reject
        } else if checks.iter().all(|c| c.state == State::Met) {
            Decision::Accept
        } else {
            Decision::Undecided
        }
    }
}

/// One check of a variant against one `accept:` limit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    /// The limit's key (`tpot_change_max`, `accuracy_drop_max_points`, …).
    pub limit: String,
    /// The suite or corpus a quality limit was judged on (one check per suite).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suite: Option<String>,
    /// Its value.
    pub max: f64,
    /// What was observed, as the row shows it.
    pub observed: String,
    /// Met, broken or undecided.
    pub state: State,
    /// Why, in words.
    pub why: String,
}

/// The joined verdict of one variant against the control.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerdictRow {
    /// The variant judged.
    pub variant: String,
    /// The control.
    pub control: String,
    /// Latency, quality, feedback, throughput and cost in one line.
    pub row: String,
    /// Given only where `accept:` limits are.
    pub decision: Option<Decision>,
    /// One per limit.
    pub checks: Vec<Check>,
}

/// Judges "the change is at most `max`" on interval `ci` (same unit).
fn at_most(ci: Option<[f64; 2]>, max: f64) -> State {
    match ci {
        Some([_, hi]) if hi <= max => State::Met,
        Some([lo, _]) if lo > max => State::Broken,
        _ => State::Undecided,
    }
}

fn check(limit: &str, max: f64, observed: String, state: State, why: &str) -> Check {
    Check {
        limit: limit.to_string(),
        suite: None,
        max,
        observed,
        state,
        why: why.to_string(),
    }
}

/// Where a verdict's quality results come from: what a missing one's check tells the reader to
/// do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultsFrom {
    /// Posted to the admin API (`eval --report-to`).
    Posted,
    /// Files given to `report` or `verdict` (`--quality`, from `eval --json`).
    Files,
}

/// Whether `variant`'s requests were cancelled by their clients significantly more or less
/// often than the control's (the 95% Newcombe interval of the difference excludes zero): then
/// the words that say so, for the latency checks.
fn cancellations_differ(summary: &Summary, control: &str, variant: &str) -> Option<String> {
    let (c, v) = (summary.variant(control)?, summary.variant(variant)?);
    let cancelled = |s: &VariantSummary| s.outcomes.get("client_cancelled").copied().unwrap_or(0);
    let (kc, kv) = (cancelled(c), cancelled(v));
    if kc + kv == 0 {
        return None;
    }
    let (d, ci) = super::compare::proportion_change(kc, c.requests, kv, v.requests)?;
    ci.excludes(0.0).then(|| {
        format!(
            "not decided: clients cancelled {:.1}% of {variant}'s requests and {:.1}% of {control}'s ({:+.1} points, 95% [{:+.1}, {:+.1}]): latency is measured on the requests that ran to their end, so the arms are no longer comparable",
            100.0 * kv as f64 / v.requests.max(1) as f64,
            100.0 * kc as f64 / c.requests.max(1) as f64,
            100.0 * d,
            100.0 * ci.lo,
            100.0 * ci.hi,
        )
    })
}

/// The joined verdict of every non-control variant: one row each, from the latency comparisons in
/// `summary` (`summarize`'s output), the quality `results`, the `feedback` summary and the shadow
/// agreement (`shadow`: the shadow variant's name, its exact matches and pairs), judged against
/// `accept` where given; `from` says where missing results are to come from.
pub fn verdicts(
    summary: &Summary,
    results: &[QualityResult],
    feedback: &[FeedbackMean],
    shadow: Option<(&str, u64, u64)>,
    accept: Option<&AcceptConfig>,
    from: ResultsFrom,
) -> Vec<VerdictRow> {
    let control = summary.control.as_str();
    let field =
        |name: &str, key: fn(&VariantSummary) -> Option<f64>| summary.variant(name).and_then(key);
    let ppl_count = results
        .iter()
        .filter(|r| r.kind == QualityKind::Perplexity)
        .count();
    // Every variant with evidence of any kind is judged on what it has: one that served no
    // request yet but was scored by an eval gets its quality checks (a quality reject needs no
    // latency sample).
    let mut judged: Vec<&str> = summary
        .variants
        .iter()
        .map(|v| v.variant.as_str())
        .collect();
    for r in results {
        for v in &r.variants {
            if !judged.contains(&v.variant.as_str()) {
                judged.push(v.variant.as_str());
            }
        }
    }
    judged
        .into_iter()
        .filter(|v| *v != control)
        .map(|variant| {
            let mut parts = Vec::new();
            let mut checks = Vec::new();
            // Latency is measured on the requests that ran to their end: where one arm's
            // clients hang up significantly more often than the other's, the arms' samples are
            // no longer comparable (a client that knows its arm can drop the answers it does
            // not like), so no latency limit is decided.
            let skew = cancellations_differ(summary, control, variant);
            // Latency: the median change and its interval, once there is enough data.
            for (metric, limit) in [
                (Metric::Ttft, accept.and_then(|a| a.ttft_change_max)),
                (Metric::Tpot, accept.and_then(|a| a.tpot_change_max)),
                (Metric::E2e, accept.and_then(|a| a.e2e_change_max)),
            ] {
                // E2E is compared streamed with streamed; an experiment serving only
                // non-streamed requests is judged on theirs.
                let c = summary.comparison(variant, metric).or_else(|| {
                    (metric == Metric::E2e)
                        .then(|| summary.comparison(variant, Metric::E2eUnstreamed))
                        .flatten()
                });
                let label = metric.as_str().to_uppercase();
                let ci = c
                    .and_then(|c| c.median_ci)
                    .filter(|[lo, hi]| lo.is_finite() && hi.is_finite());
                let shown = match (c, ci) {
                    (Some(c), Some(ci)) => Some(format!(
                        "{label} {}",
                        with_interval(c.median_change.unwrap_or(f64::NAN), Some(ci), 100.0, 0, "%")
                    )),
                    (Some(c), None) => Some(format!(
                        "{label} n/a (n = {} of {} per variant)",
                        c.n_control.min(c.n_treatment).unwrap_or(0),
                        summary.min_samples
                    )),
                    (None, _) => None,
                };
                if metric != Metric::E2e || limit.is_some() {
                    parts.extend(shown.clone());
                }
                if let Some(max) = limit {
                    let pct = ci.map(|[lo, hi]| [lo * 100.0, hi * 100.0]);
                    let state = at_most(pct, max);
                    let why = match (state, ci) {
                        (_, None) => "not enough latency samples yet",
                        (State::Undecided, _) => "the interval straddles the limit",
                        (State::Met, _) => "the whole interval is at or below the limit",
                        (State::Broken, _) => "the whole interval is above the limit",
                    };
                    let key = format!("{}_change_max", metric.as_str());
                    let mut c = check(
                        &key,
                        max,
                        shown.unwrap_or_else(|| format!("{label}: no data")),
                        state,
                        why,
                    );
                    if let (Some(skew), true) = (&skew, ci.is_some()) {
                        c.state = State::Undecided;
                        c.why.clone_from(skew);
                    }
                    checks.push(c);
                }
            }
            // Quality: every posted suite and corpus that scored this variant.
            let mut accuracy_seen = false;
            let mut ppl_seen = false;
            for r in results {
                let Some(c) = r.comparison(variant) else {
                    continue;
                };
                match r.kind {
                    QualityKind::Accuracy => {
                        accuracy_seen = true;
                        let shown = format!(
                            "{} {}",
                            r.suite,
                            with_interval(c.difference, c.ci95, 100.0, 1, " pts")
                        );
                        if let Some(max) = accept.and_then(|a| a.accuracy_drop_max_points) {
                            // A drop of at most `max` points: the difference is at least −max.
                            let neg = c.ci95.map(|[lo, hi]| [-hi * 100.0, -lo * 100.0]);
                            let state = at_most(neg, max);
                            let why = match state {
                                State::Met => "the whole interval is above the largest drop",
                                State::Broken => "the whole interval is below the largest drop",
                                State::Undecided if c.ci95.is_none() => "no interval",
                                State::Undecided => {
                                    "the interval straddles the largest drop (more items narrow it)"
                                }
                            };
                            checks.push(Check {
                                suite: Some(r.suite.clone()),
                                ..check("accuracy_drop_max_points", max, shown.clone(), state, why)
                            });
                        }
                        parts.push(shown);
                    }
                    QualityKind::Perplexity => {
                        ppl_seen = true;
                        let name = if ppl_count == 1 {
                            "ppl".to_string()
                        } else {
                            format!("ppl {}", r.suite)
                        };
                        let shown =
                            format!("{name} {}", with_interval(c.difference, c.ci95, 1.0, 2, ""));
                        if let Some(max) = accept.and_then(|a| a.ppl_rise_max) {
                            let state = at_most(c.ci95, max);
                            let why = match state {
                                State::Met => "the whole interval is at or below the largest rise",
                                State::Broken => "the whole interval is above the largest rise",
                                State::Undecided if c.ci95.is_none() => {
                                    "no interval (too few windows: a smaller --window gives more)"
                                }
                                State::Undecided => "the interval straddles the largest rise",
                            };
                            checks.push(Check {
                                suite: Some(r.suite.clone()),
                                ..check("ppl_rise_max", max, shown.clone(), state, why)
                            });
                        }
                        parts.push(shown);
                    }
                }
            }
            for (seen, limit, max, what) in [
                (
                    accuracy_seen,
                    "accuracy_drop_max_points",
                    accept.and_then(|a| a.accuracy_drop_max_points),
                    match from {
                        ResultsFrom::Posted => "no accuracy result posted (inferscope eval --report-to)",
                        ResultsFrom::Files => "no accuracy result given (--quality FILE, from inferscope eval --json)",
                    },
                ),
                (
                    ppl_seen,
                    "ppl_rise_max",
                    accept.and_then(|a| a.ppl_rise_max),
                    match from {
                        ResultsFrom::Posted => {
                            "no perplexity result posted (inferscope eval --perplexity --report-to)"
                        }
                        ResultsFrom::Files => {
                            "no perplexity result given (--quality FILE, from inferscope eval --perplexity --json)"
                        }
                    },
                ),
            ] {
                if let (false, Some(max)) = (seen, max) {
                    checks.push(check(limit, max, "no data".into(), State::Undecided, what));
                }
            }
            // Feedback means, variant beside control (no limit: signals differ per deployment).
            for f in feedback.iter().filter(|f| f.variant == variant) {
                let name = f.name.as_str();
                let mean = |f: &FeedbackMean| {
                    let m = f.mean?;
                    Some(match f.ci {
                        [Some(lo), Some(hi)] => format!("{m:.2} [{lo:.2}, {hi:.2}]"),
                        _ => format!("{m:.2}"),
                    })
                };
                let Some(mine) = mean(f) else { continue };
                let theirs = feedback
                    .iter()
                    .find(|g| g.variant == control && g.name == name)
                    .and_then(mean);
                parts.push(match theirs {
                    Some(t) => format!("{name} {mine} vs {t}"),
                    None => format!("{name} {mine}"),
                });
            }
            if let Some((sv, exact, pairs)) = shadow {
                // The shadow's own arm (`NAME:shadow`) carries its agreement with the primary.
                let mine = variant.strip_suffix(":shadow") == Some(sv);
                if let (true, Some(ci)) = (mine, super::compare::wilson(exact, pairs)) {
                    parts.push(format!(
                        "shadow exact match {:.0}% [{:.0}, {:.0}]",
                        exact as f64 * 100.0 / pairs as f64,
                        ci.lo * 100.0,
                        ci.hi * 100.0
                    ));
                }
            }
            let rate = |v: &VariantSummary| Some(v.output_tokens_per_s);
            if let (Some(t), Some(c)) = (field(variant, rate), field(control, rate)) {
                parts.push(format!("{t:.0} vs {c:.0} tok/s per stream"));
            }
            let served = |v: &VariantSummary| v.served_output_tokens_per_s;
            if let (Some(t), Some(c)) = (field(variant, served), field(control, served)) {
                parts.push(format!("{t:.0} vs {c:.0} tok/s served"));
            }
            let cost = |v: &VariantSummary| v.cost_per_million_output_tokens;
            if let (Some(t), Some(c)) = (field(variant, cost), field(control, cost)) {
                let basis = |v: &str| {
                    summary
                        .variant(v)
                        .and_then(|x| x.cost_basis.clone())
                        .unwrap_or_default()
                };
                let (bt, bc) = (basis(variant), basis(control));
                let basis = if bt == bc {
                    bt
                } else {
                    format!("{bt} vs {bc}")
                };
                let currency = |v: &str| {
                    summary
                        .variant(v)
                        .and_then(|x| x.cost_currency.clone())
                        .unwrap_or_default()
                };
                let (ct, cc) = (currency(variant), currency(control));
                parts.push(if ct == cc {
                    format!("{t:.2} vs {c:.2} {ct} per M output tokens ({basis})")
                } else {
                    format!("{t:.2} {ct} vs {c:.2} {cc} per M output tokens ({basis})")
                });
            }
            let energy = |v: &VariantSummary| v.joules_per_output_token;
            let joules = (field(variant, energy), field(control, energy));
            if let (Some(t), Some(c)) = joules {
                parts.push(format!("{t:.3} vs {c:.3} J per output token"));
            }
            if let Some(max) = accept.and_then(|a| a.energy_change_max) {
                // No interval: power is sampled, not a sample per request. The check says so.
                checks.push(match joules {
                    (Some(t), Some(c)) if c > 0.0 => {
                        let change = (t / c - 1.0) * 100.0;
                        let (state, why) = if change <= max {
                            (State::Met, "at or below the limit (a point estimate over the last minute: no interval)")
                        } else {
                            (State::Broken, "above the limit (a point estimate over the last minute: no interval)")
                        };
                        check(
                            "energy_change_max",
                            max,
                            format!("energy {change:+.1}% ({t:.3} vs {c:.3} J per output token)"),
                            state,
                            why,
                        )
                    }
                    _ => check(
                        "energy_change_max",
                        max,
                        "no data".into(),
                        State::Undecided,
                        "no energy per output token for both variants (their backends need GPU power: gpu_url or nvml, GPUs of their own, and traffic in the last minute)",
                    ),
                });
            }
            let decision = accept.map(|_| Decision::of(&checks));
            let mut row = format!("{variant}: {}", parts.join("; "));
            if let Some(d) = decision {
                row.push_str(" \u{2192} ");
                row.push_str(d.as_str());
            }
            VerdictRow {
                variant: variant.to_string(),
                control: control.to_string(),
                row,
                decision,
                checks,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn summary(tpot_ci: Option<[f64; 2]>) -> Summary {
        let mut tpot = crate::experiment::Comparison::new("int8", Metric::Tpot, "…".into());
        match tpot_ci {
            Some(ci) => {
                (tpot.n_control, tpot.n_treatment) = (Some(500), Some(500));
                tpot.median_change = Some((ci[0] + ci[1]) / 2.0);
                tpot.median_ci = Some(ci);
            }
            None => (tpot.n_control, tpot.n_treatment) = (Some(12), Some(9)),
        }
        let variant = |name: &str, rate: f64| VariantSummary {
            variant: name.into(),
            output_tokens_per_s: rate,
            ..VariantSummary::default()
        };
        Summary {
            name: "test".into(),
            control: "fp16".into(),
            min_samples: 200,
            method: String::new(),
            variants: vec![variant("fp16", 40.0), variant("int8", 55.0)],
            comparisons: vec![tpot],
        }
    }

    fn result(kind: QualityKind, suite: &str, d: f64, ci: Option<[f64; 2]>) -> QualityResult {
        QualityResult {
            kind,
            suite: suite.into(),
            model: None,
            route: None,
            path: None,
            control: "fp16".into(),
            variants: vec![],
            comparisons: vec![QualityComparison {
                variant: "int8".into(),
                difference: d,
                ci95: ci,
            }],
            unit: None,
        }
    }

    fn accept() -> AcceptConfig {
        AcceptConfig {
            tpot_change_max: Some(0.0),
            accuracy_drop_max_points: Some(1.0),
            ppl_rise_max: Some(0.5),
            ..AcceptConfig::default()
        }
    }

    fn decide(tpot: Option<[f64; 2]>, acc: Option<[f64; 2]>, ppl: Option<[f64; 2]>) -> VerdictRow {
        let mut results = Vec::new();
        if let Some(ci) = acc {
            results.push(result(
                QualityKind::Accuracy,
                "mmlu",
                (ci[0] + ci[1]) / 2.0,
                Some(ci),
            ));
        }
        if let Some(ci) = ppl {
            results.push(result(
                QualityKind::Perplexity,
                "wiki",
                (ci[0] + ci[1]) / 2.0,
                Some(ci),
            ));
        }
        verdicts(
            &summary(tpot),
            &results,
            &[],
            None,
            Some(&accept()),
            ResultsFrom::Posted,
        )
        .pop()
        .unwrap()
    }

    #[test]
    fn a_variant_is_accepted_only_when_every_interval_is_inside_its_limit() {
        let v = decide(
            Some([-0.31, -0.29]),
            Some([-0.019, 0.003]),
            Some([0.15, 0.27]),
        );
        // accuracy −1.9 points at worst: more than 1 point of drop is still possible.
        assert_eq!(v.decision, Some(Decision::Undecided), "{v:?}");
        assert_eq!(
            v.row,
            "int8: TPOT \u{2212}30% [\u{2212}31, \u{2212}29]; mmlu \u{2212}0.8 pts [\u{2212}1.9, +0.3]; ppl +0.21 [+0.15, +0.27]; 55 vs 40 tok/s per stream \u{2192} undecided"
        );
        let v = decide(
            Some([-0.31, -0.29]),
            Some([-0.009, 0.003]),
            Some([0.15, 0.27]),
        );
        assert_eq!(v.decision, Some(Decision::Accept), "{v:?}");
        // Any limit broken with confidence rejects, whatever the others say.
        let v = decide(
            Some([-0.31, -0.29]),
            Some([-0.009, 0.003]),
            Some([0.55, 0.6]),
        );
        assert_eq!(v.decision, Some(Decision::Reject), "{v:?}");
        let v = decide(Some([0.01, 0.03]), Some([-0.009, 0.003]), Some([0.1, 0.2]));
        assert_eq!(v.decision, Some(Decision::Reject), "{v:?}");
        let v = decide(Some([-0.31, -0.29]), Some([-0.05, -0.02]), Some([0.1, 0.2]));
        assert_eq!(v.decision, Some(Decision::Reject), "{v:?}");
    }

    #[test]
    fn missing_data_leaves_the_verdict_undecided_and_says_what_is_missing() {
        let v = decide(None, None, Some([0.1, 0.2]));
        assert_eq!(v.decision, Some(Decision::Undecided), "{v:?}");
        let whys: Vec<&str> = v
            .checks
            .iter()
            .filter(|c| c.state == State::Undecided)
            .map(|c| c.why.as_str())
            .collect();
        assert_eq!(
            whys,
            [
                "not enough latency samples yet",
                "no accuracy result posted (inferscope eval --report-to)"
            ]
        );
        assert!(
            v.row.contains("TPOT n/a (n = 9 of 200 per variant)"),
            "{v:?}"
        );
    }

    #[test]
    fn an_energy_limit_is_judged_on_the_point_estimate_and_says_so() {
        let limit = AcceptConfig {
            energy_change_max: Some(-20.0),
            ..AcceptConfig::default()
        };
        let judge = |t: Option<f64>, c: Option<f64>| {
            let mut s = summary(None);
            s.variants[0].joules_per_output_token = c;
            s.variants[1].joules_per_output_token = t;
            verdicts(&s, &[], &[], None, Some(&limit), ResultsFrom::Posted)
                .pop()
                .unwrap()
        };
        let v = judge(Some(0.6), Some(1.0));
        assert_eq!(v.decision, Some(Decision::Accept), "{v:?}");
        assert_eq!(
            v.checks[0].observed,
            "energy -40.0% (0.600 vs 1.000 J per output token)"
        );
        assert!(v.checks[0].why.contains("no interval"), "{v:?}");
        let v = judge(Some(0.9), Some(1.0));
        assert_eq!(v.decision, Some(Decision::Reject), "{v:?}");
        let v = judge(None, Some(1.0));
        assert_eq!(v.decision, Some(Decision::Undecided), "{v:?}");
        assert!(v.checks[0].why.contains("GPU power"), "{v:?}");
    }

    #[tokio::test]
    async fn posted_results_are_checked() {
        let ok = br#"{"kind":"accuracy","suite":"mmlu","control":"fp16",
            "variants":[{"variant":"fp16","value":0.6,"n":10},{"variant":"int8","value":0.5,"n":10}],
            "comparisons":[{"variant":"int8","difference":-0.1,"ci95":[-0.3,0.1]}]}"#;
        let r = QualityResult::parse(ok).unwrap();
        assert_eq!(r.comparison("int8").unwrap().ci95, Some([-0.3, 0.1]));
        for (bad, why) in [
            (
                r#"{"kind":"bleu","suite":"x","control":"a","variants":[]}"#,
                "unknown variant",
            ),
            (
                r#"{"kind":"accuracy","suite":"","control":"a","variants":[{"variant":"a","value":1,"n":1}]}"#,
                "`suite`",
            ),
            (
                r#"{"kind":"accuracy","suite":"x","control":"b","variants":[{"variant":"a","value":1,"n":1}]}"#,
                "control `b`",
            ),
            (
                r#"{"kind":"accuracy","suite":"x","control":"a","variants":[{"variant":"a","value":1,"n":1}],"comparisons":[{"variant":"c","difference":0}]}"#,
                "`c`",
            ),
            // Form is not sense: an accuracy of 7, a difference of −7, an inverted interval,
            // a perplexity below 1, a suite name that rewrites a terminal.
            (
                r#"{"kind":"accuracy","suite":"x","control":"a","variants":[{"variant":"a","value":7,"n":1}]}"#,
                "share in 0..1",
            ),
            (
                r#"{"kind":"accuracy","suite":"x","control":"a","variants":[{"variant":"a","value":0.5,"n":1},{"variant":"b","value":0.5,"n":1}],"comparisons":[{"variant":"b","difference":-7}]}"#,
                "in −1..1",
            ),
            (
                r#"{"kind":"accuracy","suite":"x","control":"a","variants":[{"variant":"a","value":0.9,"n":1},{"variant":"b","value":0.3,"n":1}],"comparisons":[{"variant":"b","difference":-0.6,"ci95":[0.1,-0.9]}]}"#,
                "[low, high]",
            ),
            (
                r#"{"kind":"perplexity","suite":"x","control":"a","variants":[{"variant":"a","value":0.5,"n":1}]}"#,
                "at least 1",
            ),
            (
                r#"{"kind":"accuracy","suite":"x\u001b[2J\u202e","control":"a","variants":[{"variant":"a","value":1,"n":1}]}"#,
                "without control",
            ),
        ] {
            let e = QualityResult::parse(bad.as_bytes())
                .unwrap_err()
                .to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
        let q = Quality::default();
        let route: Arc<str> = Arc::from("demo");
        for i in 0..MAX_RESULTS_PER_ROUTE {
            let mut r = r.clone();
            r.suite = format!("s{i}");
            q.post(&route, r).await.unwrap();
        }
        // A new suite past the cap is refused; a known one is replaced.
        let mut extra = r.clone();
        extra.suite = "one more".into();
        assert_eq!(
            q.post(&route, extra).await,
            Err(QualityError::Full("demo".into()))
        );
        let mut again = r.clone();
        again.suite = "s3".into();
        again.comparisons[0].difference = 0.0;
        q.post(&route, again).await.unwrap();
        let results = q.results("demo");
        assert_eq!(results.len(), MAX_RESULTS_PER_ROUTE);
        let s3 = results.iter().find(|r| r.suite == "s3").unwrap();
        assert_eq!(s3.comparisons[0].difference, 0.0);
    }
}
