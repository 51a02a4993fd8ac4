//! A/B experiments: per variant, the samples the comparison needs (bounded reservoirs of TTFT,
//! TPOT, ITL and E2E, outcome counts, tokens), and the comparison of each variant with the control
//! (`compare`), served at admin `GET /experiments` and read by `inferscope report` (the lab crate).
//!
//! Shadow traffic is in `shadow`.

pub mod compare;
mod feedback;
mod guard;
pub mod journal;
mod promote;
pub mod quality;
pub mod shadow;
mod summary;

pub use feedback::{Feedback, FeedbackError, FeedbackMean, FeedbackStats};
pub use guard::{Guardrails, Trip};
pub use promote::{Promotion, PromotionView};
pub use summary::{Comparison, GoodputShare, Metric, Percentiles, Summary, VariantSummary};

use crate::accesslog::LogLine;
use crate::meter::NONE;
use crate::meter::{Outcome, Purpose, RequestRecord};
use crate::util::Rng;
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Request header forcing an experiment's variant (where the experiment allows it), and response
/// header naming the variant that served.
pub const VARIANT_HEADER: &str = "x-inferscope-variant";

/// What a comparison waits for and how it weighs clients.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Horizon {
    /// No verdict until both arms have this many requests with a sample of the metric.
    pub min_samples: usize,
    /// No client (key, else address) weighs more than this share of an arm's requests in a
    /// comparison (`bound_clients`); 1: unbounded.
    pub max_client_share: f64,
}

/// Samples kept per metric and variant (uniform reservoir over everything seen).
pub const RESERVOIR: usize = 10_000;

/// Metrics compared between variants, by their `/stats` names. E2E is a different quantity for
/// a streamed and a non-streamed request: each is compared with its own kind (`e2e`: streamed,
/// `e2e_unstreamed`: not).
pub const COMPARED: [&str; 6] = ["ttft", "ttfc", "tpot", "itl", "e2e", "e2e_unstreamed"];

/// One kept sample: its value, the request it came from (a request's ITL gaps share it), and
/// the client that sent it (its key's name, else its address: `client_id`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Milliseconds.
    pub ms: f64,
    /// The request (a hash of its id).
    pub request: u64,
    /// The client (`client_id`; 0 when unknown).
    pub client: u64,
}

pub use crate::facts::client_id;

/// A uniform random sample of a stream of samples (Algorithm R), bounded in memory.
#[derive(Debug, Clone)]
pub struct Reservoir {
    values: Vec<Sample>,
    seen: u64,
    rng: Rng,
}

impl Reservoir {
    /// An empty reservoir; `seed` fixes which values are kept.
    pub fn new(seed: u64) -> Self {
        Self {
            values: Vec::new(),
            seen: 0,
            rng: Rng::new(seed),
        }
    }

    /// Offers one sample.
    pub fn push(&mut self, x: Sample) {
        self.seen += 1;
        if self.values.len() < RESERVOIR {
            self.values.push(x);
        } else {
            let j = self.rng.next_u64() % self.seen;
            if (j as usize) < RESERVOIR {
                self.values[j as usize] = x;
            }
        }
    }

    /// The kept samples.
    pub fn samples(&self) -> &[Sample] {
        &self.values
    }

    /// The kept values, milliseconds.
    pub fn values(&self) -> Vec<f64> {
        self.values.iter().map(|s| s.ms).collect()
    }

    /// Values offered so far.
    pub fn seen(&self) -> u64 {
        self.seen
    }
}

/// `samples` with no client weighing more than `max_share` of the requests left — or, where
/// there are too few clients for that, more than the next-largest client: each client over the
/// bound keeps a seeded random choice of its requests (all the samples of each kept request).
/// A lone client (or clients not told apart: id 0) is left whole. Returns the samples kept and
/// how many requests were left out.
pub fn bound_clients(samples: &[Sample], max_share: f64, seed: u64) -> (Vec<Sample>, u64) {
    use std::collections::BTreeSet;
    let mut requests: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    for s in samples {
        requests.entry(s.client).or_default().insert(s.request);
    }
    if requests.len() < 2 || max_share >= 1.0 {
        return (samples.to_vec(), 0);
    }
    let mut counts: Vec<usize> = requests.values().map(BTreeSet::len).collect();
    counts.sort_unstable_by(|a, b| b.cmp(a));
    // The largest cap `t` with t ≤ max_share × Σ min(n_i, t): no client over max_share of
    // what is kept. Σ min(n_i, t) / t falls as t grows, so the bound holds below some t.
    let kept = |t: usize| counts.iter().map(|n| (*n).min(t)).sum::<usize>();
    let holds = |t: usize| (t as f64) <= max_share * kept(t) as f64;
    let cap = if holds(1) {
        let (mut lo, mut hi) = (1, counts[0]);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if holds(mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    } else {
        // Too few clients for the share: none outweighs the next-largest.
        counts[1]
    };
    let mut keep: BTreeSet<(u64, u64)> = BTreeSet::new();
    let mut left_out = 0u64;
    let mut rng = Rng::new(seed);
    for (client, reqs) in &requests {
        let mut reqs: Vec<u64> = reqs.iter().copied().collect();
        if reqs.len() > cap && *client != 0 {
            // A seeded partial shuffle: the first `cap` are kept.
            for i in 0..cap {
                let j = i + (rng.next_u64() % (reqs.len() - i) as u64) as usize;
                reqs.swap(i, j);
            }
            left_out += (reqs.len() - cap) as u64;
            reqs.truncate(cap);
        }
        keep.extend(reqs.into_iter().map(|r| (*client, r)));
    }
    let out = samples
        .iter()
        .filter(|s| keep.contains(&(s.client, s.request)))
        .copied()
        .collect();
    (out, left_out)
}

/// One variant's accumulated data.
#[derive(Debug, Clone)]
pub struct Arm {
    /// Requests recorded, every outcome.
    pub requests: u64,
    /// By outcome, indexed by `Outcome::index`.
    pub outcomes: [u64; Outcome::ALL.len()],
    /// Output tokens of successful requests.
    pub output_tokens: u64,
    /// Seconds those requests took end to end.
    pub output_seconds: f64,
    /// Samples in `COMPARED` order, in milliseconds.
    pub samples: [Reservoir; COMPARED.len()],
    /// Requests judged against the route's latency objectives.
    pub slo_evaluated: u64,
    /// Of those, the ones that met them all.
    pub slo_met: u64,
    /// Unix seconds: the earliest request's arrival and the latest one's end (the time over
    /// which the variant served its tokens).
    pub span: Option<(f64, f64)>,
}

impl Arm {
    /// An empty arm; `seed` seeds its reservoirs (a replayed log samples the same way each run).
    pub fn new(seed: u64) -> Self {
        Self {
            requests: 0,
            outcomes: [0; Outcome::ALL.len()],
            output_tokens: 0,
            output_seconds: 0.0,
            samples: std::array::from_fn(|i| Reservoir::new(seed.wrapping_add(i as u64))),
            slo_evaluated: 0,
            slo_met: 0,
            span: None,
        }
    }

    /// Widens the span to a request that arrived at `start` (Unix seconds) and took `e2e_s`.
    fn cover(&mut self, start: f64, e2e_s: f64) {
        let end = start + e2e_s.max(0.0);
        self.span = Some(match self.span {
            Some((a, b)) => (a.min(start), b.max(end)),
            None => (start, end),
        });
    }

    /// Output tokens over the variant's span: what its backends served per second at the load
    /// they saw (`None` before a span of at least a second).
    pub fn served_tokens_per_s(&self) -> Option<f64> {
        let (a, b) = self.span?;
        (b - a >= 1.0).then(|| self.output_tokens as f64 / (b - a))
    }

    /// Adds one request.
    pub fn record(&mut self, r: &RequestRecord) {
        self.requests += 1;
        self.outcomes[r.outcome.index()] += 1;
        self.count_slo(r.slo_met());
        let start = r
            .meta
            .ts
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        self.cover(start, r.e2e.as_secs_f64());
        if r.outcome != Outcome::Ok {
            return;
        }
        self.output_tokens += r.output_tokens.unwrap_or(0);
        self.output_seconds += r.e2e.as_secs_f64();
        let (request, client) = (
            crate::util::stable_hash(r.meta.request_id.as_bytes()),
            client_id(
                crate::facts::Facts::of(&r.meta).key.as_deref(),
                r.meta.client.map(|a| a.ip()),
            ),
        );
        let at = |ms: f64| Sample {
            ms,
            request,
            client,
        };
        let ms = |d| at(crate::util::quantile::duration_ms(d));
        let [ttft, ttfc, tpot, itl, e2e, e2e_unstreamed] = &mut self.samples;
        if let Some(d) = r.ttft {
            ttft.push(ms(d));
        }
        if let Some(d) = r.ttfc {
            ttfc.push(ms(d));
        }
        if let Some(d) = r.tpot {
            tpot.push(ms(d));
        }
        r.itl.for_each_us(|us, n| {
            for _ in 0..n {
                itl.push(at(crate::util::quantile::us_to_ms(us)));
            }
        });
        if r.meta.stream {
            e2e.push(ms(r.e2e));
        } else {
            e2e_unstreamed.push(ms(r.e2e));
        }
    }

    /// Adds one access-log line (`inferscope report` reads the log back into arms).
    pub fn record_line(&mut self, v: &LogLine) {
        let Some(o) = v.outcome.as_deref().and_then(Outcome::parse) else {
            return;
        };
        self.requests += 1;
        self.outcomes[o.index()] += 1;
        self.count_slo(v.slo_met);
        let e2e_s = v.e2e_ms.unwrap_or(0.0) / 1000.0;
        if let Some(start) = v.ts.as_deref().and_then(crate::util::time::parse_rfc3339) {
            self.cover(start, e2e_s);
        }
        if o != Outcome::Ok {
            return;
        }
        self.output_tokens += v.output_tokens.unwrap_or(0);
        self.output_seconds += e2e_s;
        let addr = v.client.as_deref().and_then(|c| {
            c.parse::<std::net::SocketAddr>()
                .map(|a| a.ip())
                .or_else(|_| c.parse())
                .ok()
        });
        // A request is one draw wherever its line is read (one log, or a fleet's merged ones).
        let request = v
            .request_id
            .as_deref()
            .map_or(self.requests, |id| crate::util::stable_hash(id.as_bytes()));
        let client = client_id(v.key.as_deref(), addr);
        let at = |ms: f64| Sample {
            ms,
            request,
            client,
        };
        let e2e = if v.stream == Some(false) { 5 } else { 4 };
        for (i, x) in [
            (0, v.ttft_ms),
            (1, v.ttfc_ms),
            (2, v.tpot_ms),
            (e2e, v.e2e_ms),
        ] {
            if let Some(x) = x {
                self.samples[i].push(at(x));
            }
        }
        // Every gap, as `/stats` records them (logs written before `itl_us` existed have only
        // per-request summaries: their ITL is left out rather than estimated).
        for &us in &v.itl_us {
            self.samples[3].push(at(crate::util::quantile::us_to_ms(us)));
        }
    }

    fn count_slo(&mut self, met: Option<bool>) {
        if let Some(met) = met {
            self.slo_evaluated += 1;
            self.slo_met += u64::from(met);
        }
    }

    /// Share of judged requests that met the latency objectives (`None`: none judged).
    pub fn goodput(&self) -> Option<f64> {
        (self.slo_evaluated > 0).then(|| self.slo_met as f64 / self.slo_evaluated as f64)
    }

    /// Errors (every outcome but `ok`, `client_cancelled` and `shutdown`) over requests.
    pub fn error_rate(&self) -> f64 {
        Outcome::error_rate(&self.outcomes, self.requests)
    }

    /// Output tokens per second of generation time, over successful requests.
    pub fn tokens_per_s(&self) -> f64 {
        if self.output_seconds > 0.0 {
            self.output_tokens as f64 / self.output_seconds
        } else {
            0.0
        }
    }
}

/// One experiment's arms, by variant.
pub type Arms = BTreeMap<Arc<str>, Arm>;

/// Requests an experiment's route served that its comparisons leave out, and why.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeftOut {
    /// The client forced the variant: not a random draw from the split.
    pub forced: u64,
    /// Declared `eval`.
    pub eval: u64,
    /// Declared `bench`.
    pub bench: u64,
}

impl Serialize for LeftOut {
    /// The counts, and what they mean (`why`).
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut m = s.serialize_struct("LeftOut", 4)?;
        m.serialize_field("variant_forced", &self.forced)?;
        m.serialize_field("eval", &self.eval)?;
        m.serialize_field("bench", &self.bench)?;
        m.serialize_field("why", "compared: live traffic the split assigned (and shadow copies, as VARIANT:shadow); a forced variant is not a random draw, an eval's or a benchmark's request is not what users felt")?;
        m.end()
    }
}

/// One experiment as admin `GET /experiments` serves it: the summary and comparisons, and
/// beside them what was left out, the feedback, the guardrails, the quality results, the
/// `accept:` limits, the joined verdicts and the shadow's agreement.
#[derive(Debug, Clone, Serialize)]
pub struct ExperimentView {
    /// Variants and comparisons with the control.
    #[serde(flatten)]
    pub summary: Summary,
    /// The route the experiment splits.
    pub route: String,
    /// What the comparisons leave out.
    pub left_out: LeftOut,
    /// Feedback means per variant and signal.
    pub feedback: Vec<FeedbackMean>,
    /// The guardrails, where configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guardrails: Option<GuardrailsView>,
    /// Eval results posted for this route.
    pub quality: Vec<quality::QualityResult>,
    /// The `accept:` limits (`null`: none configured).
    pub accept: Option<BTreeMap<&'static str, f64>>,
    /// One joined verdict per non-control variant.
    pub verdicts: Vec<quality::VerdictRow>,
    /// The shadow policy and its agreement, where configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shadow: Option<ShadowView>,
    /// The ramp of `on_accept: promote`, where configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub promotion: Option<PromotionView>,
    /// Each variant's last decision kept (with `state_dir:`, from before a restart too) and
    /// since when.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub decided: Vec<DecisionLine>,
}

/// An experiment's guardrails: their window, rules and what tripped.
#[derive(Debug, Clone, Serialize)]
pub struct GuardrailsView {
    /// The sliding window, seconds.
    pub window_s: f64,
    /// Samples a window needs before a rule is judged.
    pub min_samples: usize,
    /// Each rule, as configured.
    pub rules: Vec<String>,
    /// Variants pulled from the split, with the trip that pulled them.
    pub tripped: Vec<TripView>,
    /// Trips since start.
    pub trips_total: u64,
}

/// One trip of a guardrail.
#[derive(Debug, Clone, Serialize)]
pub struct TripView {
    /// The variant pulled.
    pub variant: String,
    /// The rule that tripped, as configured.
    pub rule: String,
    /// The observed value.
    pub value: f64,
    /// Samples in the window then.
    pub samples: usize,
    /// When (RFC 3339).
    pub at: String,
}

/// A shadow policy: where copies go, how many went, and how well they agree with the primary.
#[derive(Debug, Clone, Serialize)]
pub struct ShadowView {
    /// The variant receiving copies.
    pub variant: String,
    /// Its label in the arms (`VARIANT:shadow`).
    pub label: String,
    /// Copies sent.
    pub sent: u64,
    /// Copies dropped (over the concurrency cap).
    pub dropped: u64,
    /// Agreement of the copies with the primary answers.
    pub agreement: AgreementView,
}

/// Agreement of shadow copies with the primary: exact-match rate and mean ROUGE-L (`None` before
/// the first pair).
#[derive(Debug, Clone, Serialize)]
pub struct AgreementView {
    /// Pairs compared.
    pub pairs: u64,
    /// Pairs with identical text, over pairs.
    pub exact_match_rate: Option<f64>,
    /// Mean ROUGE-L F1 over pairs.
    pub rouge_l_mean: Option<f64>,
}

impl ShadowView {
    /// The view of a shadow policy now.
    pub fn of(sh: &shadow::Shadow) -> Self {
        use std::sync::atomic::Ordering::Relaxed;
        let ag = sh.agreement();
        let rate = |k: f64| (ag.pairs > 0).then(|| k / ag.pairs as f64);
        Self {
            variant: sh.variant.to_string(),
            label: sh.label.to_string(),
            sent: sh.sent.load(Relaxed),
            dropped: sh.dropped.load(Relaxed),
            agreement: AgreementView {
                pairs: ag.pairs,
                exact_match_rate: rate(ag.exact as f64),
                rouge_l_mean: rate(ag.rouge_l_sum),
            },
        }
    }
}

/// The data of every experiment, keyed by route then variant, and the feedback joined to it.
#[derive(Debug, Default)]
pub struct Experiments {
    arms: Mutex<HashMap<Arc<str>, (Arms, LeftOut)>>,
    /// Quality signals posted to `/feedback`, joined to variants.
    pub feedback: Feedback,
    /// Eval results posted to `/experiments/quality`.
    pub quality: quality::Quality,
    /// Variants rolled back (by a guardrail or a verdict) and put back, kept where a state
    /// directory is.
    pub rollbacks: Rollbacks,
    /// Each variant's verdict decisions as they changed, kept where a state directory is.
    pub decisions: Decisions,
}

/// Verdict decisions kept across a restart: each change of a variant's decision (`accept`,
/// `reject`, `undecided`) appended (synced, by the journal's own thread) to the state
/// directory's `verdicts.jsonl` with the checks behind it — the record of what the gateway
/// decided, and when, that a rollout's review reads. Past `journal::MAX_LINES` the file keeps its
/// newer half and every variant's latest decision.
#[derive(Debug, Default)]
pub struct Decisions {
    journal: std::sync::OnceLock<journal::Journal>,
    last: Mutex<HashMap<(String, String), DecisionLine>>,
}

/// A `verdicts.jsonl` line: a variant's decision from `at` on, and its checks then.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct DecisionLine {
    /// When it was decided (RFC 3339).
    pub at: String,
    /// The experiment's route.
    pub route: String,
    /// The variant judged.
    pub variant: String,
    /// `accept`, `reject` or `undecided`.
    pub decision: String,
    /// Each check as `limit max [on suite]: state`.
    pub checks: Vec<String>,
}

impl Decisions {
    /// Keeps decisions in `path` from now on; returns how many lines it holds (the last decision
    /// of each variant read back).
    pub fn persist_to(&self, path: &std::path::Path) -> std::io::Result<usize> {
        let (j, back) = journal::Journal::open(path, "verdicts.jsonl", Some(Self::compact))?;
        let mut last = self.last.lock();
        let mut n = 0;
        for l in back.text.lines() {
            if let Ok(d) = serde_json::from_str::<DecisionLine>(l) {
                last.insert((d.route.clone(), d.variant.clone()), d);
                n += 1;
            }
        }
        let _ = self.journal.set(j);
        Ok(n)
    }

    /// The journal, where a state directory is.
    pub fn journal(&self) -> Option<&journal::Journal> {
        self.journal.get()
    }

    /// `verdicts.jsonl` compacted: its newer half, and before it each variant's latest line
    /// when that is older.
    fn compact(text: &str) -> Vec<String> {
        let all: Vec<&str> = text.lines().collect();
        let newer = &all[all.len() / 2..];
        let mut latest: HashMap<(String, String), &str> = HashMap::new();
        for l in &all {
            if let Ok(d) = serde_json::from_str::<DecisionLine>(l) {
                latest.insert((d.route, d.variant), l);
            }
        }
        let mut older: Vec<String> = latest
            .into_values()
            .filter(|l| !newer.contains(l))
            .map(str::to_owned)
            .collect();
        older.sort();
        older
            .into_iter()
            .chain(newer.iter().map(|l| (*l).to_owned()))
            .collect()
    }

    /// `variant` of `route` is judged `row` now: kept when its decision changed. True then.
    pub fn note(&self, route: &str, row: &quality::VerdictRow) -> bool {
        let Some(decision) = row.decision else {
            return false;
        };
        let key = (route.to_owned(), row.variant.clone());
        let mut last = self.last.lock();
        if last
            .get(&key)
            .is_some_and(|d| d.decision == decision.as_str())
        {
            return false;
        }
        let line = DecisionLine {
            at: crate::util::time::rfc3339(std::time::SystemTime::now()),
            route: route.to_owned(),
            variant: row.variant.clone(),
            decision: decision.as_str().to_owned(),
            checks: row
                .checks
                .iter()
                .map(|c| {
                    let on = c
                        .suite
                        .as_ref()
                        .map(|s| format!(" on {s}"))
                        .unwrap_or_default();
                    format!("{} {}{on}: {}", c.limit, c.max, c.state.as_str())
                })
                .collect(),
        };
        tracing::info!(route = %route, variant = %row.variant, decision = %line.decision, "verdict changed");
        if let (Some(j), Ok(l)) = (self.journal.get(), serde_json::to_string(&line)) {
            j.append(l);
        }
        last.insert(key, line);
        true
    }

    /// The last decision kept of each variant of `route` (from before a restart too).
    pub fn last(&self, route: &str) -> Vec<DecisionLine> {
        let mut v: Vec<DecisionLine> = self
            .last
            .lock()
            .values()
            .filter(|d| d.route == route)
            .cloned()
            .collect();
        v.sort_by(|a, b| a.variant.cmp(&b.variant));
        v
    }
}

/// Rollbacks kept across a restart: each trip, reset, promotion and new evidence applied to what
/// is in force (in memory: a reload reapplies it from there) and appended (synced, by the
/// journal's own thread) to the state directory's `rollbacks.jsonl`, replayed at start.
#[derive(Debug, Default)]
pub struct Rollbacks {
    journal: std::sync::OnceLock<journal::Journal>,
    in_force: Mutex<InForce>,
}

/// A `rollbacks.jsonl` line: a variant rolled back for `rule`; or (`rule` absent) put back by a
/// person, which a verdict respects until new evidence; or (`evidence`) new evidence posted for
/// the route.
/// Or (`share`) promoted to that share of the traffic (`on_accept: promote`; 0: the ramp stopped).
#[derive(Debug, Default, Serialize, serde::Deserialize)]
struct RollbackLine {
    route: String,
    #[serde(default)]
    variant: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rule: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    evidence: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    share: Option<u32>,
}

/// What `rollbacks.jsonl` holds in force.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InForce {
    /// (route, variant, rule) rolled back.
    pub tripped: Vec<(String, String, String)>,
    /// (route, variant) put back by a person since the route's last evidence.
    pub pardoned: Vec<(String, String)>,
    /// (route, variant, share) promoted.
    pub promoted: Vec<(String, String, u32)>,
}

impl InForce {
    /// What a line changes: the last word on each (route, variant) wins.
    fn apply(&mut self, r: RollbackLine) {
        if r.evidence {
            self.pardoned.retain(|(route, _)| *route != r.route);
            return;
        }
        let this = |route: &String, v: &String| *route == r.route && *v == r.variant;
        if let Some(share) = r.share {
            // One variant of a route is promoted at a time.
            self.promoted.retain(|(route, _, _)| *route != r.route);
            if share > 0 {
                self.promoted.push((r.route, r.variant, share));
            }
            return;
        }
        self.tripped.retain(|(route, v, _)| !this(route, v));
        self.pardoned.retain(|(route, v)| !this(route, v));
        self.promoted.retain(|(route, v, _)| !this(route, v));
        match r.rule {
            Some(rule) => self.tripped.push((r.route, r.variant, rule)),
            None => self.pardoned.push((r.route, r.variant)),
        }
    }

    /// What the lines of a `rollbacks.jsonl` hold in force (lines that do not parse skipped).
    fn of(text: &str) -> Self {
        let mut f = Self::default();
        for l in text.lines() {
            if let Ok(r) = serde_json::from_str::<RollbackLine>(l) {
                f.apply(r);
            }
        }
        f
    }

    /// The lines that hold this in force, and nothing else: what a long file is compacted to.
    fn lines(&self) -> Vec<String> {
        let tripped = self
            .tripped
            .iter()
            .map(|(route, variant, rule)| RollbackLine {
                route: route.clone(),
                variant: variant.clone(),
                rule: Some(rule.clone()),
                ..RollbackLine::default()
            });
        let pardoned = self.pardoned.iter().map(|(route, variant)| RollbackLine {
            route: route.clone(),
            variant: variant.clone(),
            ..RollbackLine::default()
        });
        let promoted = self
            .promoted
            .iter()
            .map(|(route, variant, share)| RollbackLine {
                route: route.clone(),
                variant: variant.clone(),
                share: Some(*share),
                ..RollbackLine::default()
            });
        tripped
            .chain(pardoned)
            .chain(promoted)
            .filter_map(|l| serde_json::to_string(&l).ok())
            .collect()
    }
}

impl Rollbacks {
    /// Keeps rollbacks in `path` from now on; returns those in force there (the last word on
    /// each pair winning; torn and invalid lines skipped).
    pub fn persist_to(&self, path: &std::path::Path) -> std::io::Result<InForce> {
        let (j, back) = journal::Journal::open(
            path,
            "rollbacks.jsonl",
            Some(|t: &str| InForce::of(t).lines()),
        )?;
        let f = InForce::of(&back.text);
        *self.in_force.lock() = f.clone();
        let _ = self.journal.set(j);
        Ok(f)
    }

    /// The journal, where a state directory is.
    pub fn journal(&self) -> Option<&journal::Journal> {
        self.journal.get()
    }

    /// What is in force now (a reload reapplies it to the new router).
    pub fn in_force(&self) -> InForce {
        self.in_force.lock().clone()
    }

    /// `variant` of `route` was rolled back for `rule`.
    pub fn tripped(&self, route: &str, variant: &str, rule: &str) {
        self.keep(RollbackLine {
            route: route.into(),
            variant: variant.into(),
            rule: Some(rule.into()),
            ..RollbackLine::default()
        });
    }

    /// `variants` of `route` are to be put back: kept on disk (where a state directory is)
    /// before the caller puts them back, so an answered reset survives a restart. An error
    /// means nothing was kept and nothing must change.
    pub async fn reset(&self, route: &str, variants: &[String]) -> std::io::Result<()> {
        for v in variants {
            let line = RollbackLine {
                route: route.into(),
                variant: v.clone(),
                ..RollbackLine::default()
            };
            if let Some(j) = self.journal.get() {
                j.append_synced(serde_json::to_string(&line).map_err(std::io::Error::other)?)
                    .await?;
            }
            self.in_force.lock().apply(line);
        }
        Ok(())
    }

    /// `variant` of `route` was promoted to `share` percent of the traffic (0: its ramp
    /// stopped).
    pub fn promoted(&self, route: &str, variant: &str, share: u32) {
        self.keep(RollbackLine {
            route: route.into(),
            variant: variant.into(),
            share: Some(share),
            ..RollbackLine::default()
        });
    }

    /// New evidence was posted for `route`: what a person put back may be rolled back again.
    pub fn evidence(&self, route: &str) {
        self.keep(RollbackLine {
            route: route.into(),
            evidence: true,
            ..RollbackLine::default()
        });
    }

    /// In force at once; on disk as soon as the journal's writer gets to it.
    fn keep(&self, line: RollbackLine) {
        if let (Some(j), Ok(l)) = (self.journal.get(), serde_json::to_string(&line)) {
            j.append(l);
        }
        self.in_force.lock().apply(line);
    }
}

impl Experiments {
    /// The journals kept (where a state directory or `feedback.path` is).
    pub fn journals(&self) -> impl Iterator<Item = &journal::Journal> {
        [
            self.quality.journal(),
            self.rollbacks.journal(),
            self.decisions.journal(),
            self.feedback.journal(),
        ]
        .into_iter()
        .flatten()
    }

    /// Waits until every journal has tried what was queued (at shutdown); names those that
    /// could not within `journal::SYNC_WAIT`.
    pub async fn flush_journals(&self) {
        for j in self.journals() {
            if !j.flush().await {
                tracing::warn!(file = %j.path().display(), "{}: lines still queued at shutdown were not all written", j.name);
            }
        }
    }

    /// The journals' writes as Prometheus series.
    pub fn write_journal_metrics(&self, w: &mut crate::util::prometheus::Writer) {
        use crate::util::prometheus::Labels;
        use std::sync::atomic::Ordering::Relaxed;
        let name = "inferscope_state_writes_total";
        w.family(
            name,
            "counter",
            "Lines the gateway's state files took (state_dir's quality.jsonl, rollbacks.jsonl, verdicts.jsonl; feedback.path), by outcome: written (synced); failed (the file could not be opened, written or synced: a full, read-only or swapped disk); dropped (the writer was behind, or a caller stopped waiting for it).",
        );
        for j in self.journals() {
            for (outcome, n) in [
                ("written", &j.counts.written),
                ("failed", &j.counts.failed),
                ("dropped", &j.counts.dropped),
            ] {
                w.sample(
                    name,
                    &Labels::new(&[("file", j.name), ("outcome", outcome)]),
                    n.load(Relaxed),
                );
            }
        }
    }

    /// Adds a finished request that an experiment assigned to a variant: to its arm when the
    /// split drew it for live traffic (or it is a shadow copy), else to what is left out.
    pub fn record(&self, r: &RequestRecord) {
        let m = &r.meta;
        if m.variant.as_ref() == NONE {
            return;
        }
        self.feedback.remember(&m.request_id, &m.route, &m.variant);
        let mut arms = self.arms.lock();
        let (route, left_out) = arms.entry(Arc::clone(&m.route)).or_default();
        match m.purpose {
            Purpose::Eval => left_out.eval += 1,
            Purpose::Bench => left_out.bench += 1,
            Purpose::Live if m.variant_forced => left_out.forced += 1,
            Purpose::Live | Purpose::Shadow => {
                let seed = crate::util::stable_hash(m.variant.as_bytes());
                route
                    .entry(Arc::clone(&m.variant))
                    .or_insert_with(|| Arm::new(seed))
                    .record(r);
            }
        }
    }

    /// A copy of one route's arms.
    pub fn arms(&self, route: &str) -> BTreeMap<Arc<str>, Arm> {
        self.arms
            .lock()
            .get(route)
            .map(|(a, _)| a.clone())
            .unwrap_or_default()
    }

    /// What one route's comparisons left out.
    pub fn left_out(&self, route: &str) -> LeftOut {
        self.arms
            .lock()
            .get(route)
            .map(|(_, l)| *l)
            .unwrap_or_default()
    }
}

impl crate::meter::RecordSink for Experiments {
    fn record(&self, rec: &Arc<RequestRecord>) {
        Experiments::record(self, rec);
    }
}

/// Signed percentage, as in `−31%`.
fn pct(x: f64) -> String {
    let v = (x * 100.0).round();
    if v == 0.0 {
        "0%".to_string()
    } else if v < 0.0 {
        format!("\u{2212}{}%", -v)
    } else {
        format!("+{v}%")
    }
}

/// Per-variant summary and comparisons with the control (`/experiments`, reports).
/// `min_samples` is the fixed horizon: below it no verdict is given.
pub fn summarize(
    name: &str,
    control: &str,
    arms: &BTreeMap<Arc<str>, Arm>,
    horizon: Horizon,
) -> Summary {
    let Horizon {
        min_samples,
        max_client_share,
    } = horizon;
    let variants: Vec<VariantSummary> = arms
        .iter()
        .map(|(v, a)| {
            let mut s = VariantSummary {
                variant: v.to_string(),
                requests: a.requests,
                error_rate: a.error_rate(),
                output_tokens_per_s: (a.tokens_per_s() * 100.0).round() / 100.0,
                served_output_tokens_per_s: a
                    .served_tokens_per_s()
                    .map(|t| (t * 100.0).round() / 100.0),
                outcomes: Outcome::ALL
                    .iter()
                    .filter(|o| a.outcomes[o.index()] > 0)
                    .map(|o| (o.as_str().to_string(), a.outcomes[o.index()]))
                    .collect(),
                goodput: a
                    .goodput()
                    .zip(compare::wilson(a.slo_met, a.slo_evaluated))
                    .map(|(share, ci)| GoodputShare {
                        share,
                        ci: [ci.lo, ci.hi],
                        met: a.slo_met,
                        evaluated: a.slo_evaluated,
                    }),
                ttft: None,
                ttfc: None,
                tpot: None,
                itl: None,
                e2e: None,
                e2e_unstreamed: None,
                cost_per_million_output_tokens: None,
                cost_basis: None,
                cost_currency: None,
                gpu_watts: None,
                joules_per_output_token: None,
            };
            for (metric, r) in Metric::LATENCY.into_iter().zip(&a.samples) {
                let mut sorted = r.values();
                sorted.sort_unstable_by(f64::total_cmp);
                if let Some(slot) = s.latency_mut(metric) {
                    *slot = Percentiles::of_sorted(&sorted, r.seen());
                }
            }
            s
        })
        .collect();
    let mut comparisons = Vec::new();
    if let Some(base) = arms.get(control) {
        for (v, a) in arms.iter().filter(|(v, _)| v.as_ref() != control) {
            for (i, metric) in Metric::LATENCY.into_iter().enumerate() {
                let (c, t) = (base.samples[i].samples(), a.samples[i].samples());
                if c.is_empty() && t.is_empty() {
                    continue;
                }
                let seed =
                    crate::util::stable_hash(format!("{name}/{v}/{}", metric.as_str()).as_bytes());
                // No one client outweighs the rest; then each request is one draw (its ITL
                // gaps together).
                let ((c, c_out), (t, t_out)) = (
                    bound_clients(c, max_client_share, seed),
                    bound_clients(t, max_client_share, seed ^ 1),
                );
                let clusters = |x: &[Sample]| {
                    compare::Clusters::of(&x.iter().map(|s| (s.request, s.ms)).collect::<Vec<_>>())
                };
                let (c, t) = (clusters(&c), clusters(&t));
                let label = metric.as_str().to_uppercase();
                let (nc, nt) = (c.len(), t.len());
                if nc.min(nt) < min_samples {
                    let mut row = Comparison::new(
                        v,
                        metric,
                        format!(
                            "{v} {label}: not enough data yet (n = {} of {min_samples} per variant)",
                            nc.min(nt)
                        ),
                    );
                    row.n_control = Some(nc as u64);
                    row.n_treatment = Some(nt as u64);
                    comparisons.push(row);
                    continue;
                }
                let Some(cmp) = compare::compare_clusters(&c, &t, seed) else {
                    continue;
                };
                let bounded = match c_out + t_out {
                    0 => String::new(),
                    n => format!(" (one client's weight bounded: {n} of its requests left out)"),
                };
                let verdict = format!(
                    "{v} {label} {} [{}, {}], {}{bounded}",
                    pct(cmp.median_change),
                    pct(cmp.median_ci.lo),
                    pct(cmp.median_ci.hi),
                    if cmp.significant() {
                        "significant"
                    } else {
                        "not significant"
                    }
                );
                let mut row = Comparison::new(v, metric, verdict);
                row.n_control = Some(cmp.n_control as u64);
                row.n_treatment = Some(cmp.n_treatment as u64);
                row.median_change = Some(cmp.median_change);
                row.median_ci = Some([cmp.median_ci.lo, cmp.median_ci.hi]);
                row.p99_change = Some(cmp.p99_change);
                row.p99_ci = Some([cmp.p99_ci.lo, cmp.p99_ci.hi]);
                row.hodges_lehmann_ms = Some(cmp.hodges_lehmann);
                row.p_value = Some(cmp.p_value);
                row.significant = Some(cmp.significant());
                comparisons.push(row);
            }
            if let Some((d, ci)) = compare::proportion_change(
                base.slo_met,
                base.slo_evaluated,
                a.slo_met,
                a.slo_evaluated,
            ) {
                let (nc, nt) = (base.slo_evaluated, a.slo_evaluated);
                let pts = |x: f64| {
                    let v = (x * 1000.0).round() / 10.0;
                    if v < 0.0 {
                        format!("\u{2212}{}", -v)
                    } else {
                        format!("+{v}")
                    }
                };
                let verdict = if nc.min(nt) < min_samples as u64 {
                    format!(
                        "{v} goodput: not enough data yet (n = {} of {min_samples} per variant)",
                        nc.min(nt)
                    )
                } else {
                    format!(
                        "{v} goodput {} points [{}, {}], {}",
                        pts(d),
                        pts(ci.lo),
                        pts(ci.hi),
                        if ci.excludes(0.0) {
                            "significant"
                        } else {
                            "not significant"
                        }
                    )
                };
                let mut row = Comparison::new(v, Metric::Goodput, verdict);
                row.n_control = Some(nc);
                row.n_treatment = Some(nt);
                row.control = base.goodput();
                row.treatment = a.goodput();
                row.change = Some(d);
                row.change_ci = Some([ci.lo, ci.hi]);
                row.significant = Some(nc.min(nt) >= min_samples as u64 && ci.excludes(0.0));
                comparisons.push(row);
            }
            let (ec, et) = (base.error_rate(), a.error_rate());
            let mut row = Comparison::new(
                v,
                Metric::ErrorRate,
                format!(
                    "{v} error rate {:.2}% vs {:.2}% (control)",
                    et * 100.0,
                    ec * 100.0
                ),
            );
            row.control = Some(ec);
            row.treatment = Some(et);
            comparisons.push(row);
        }
    }
    Summary {
        name: name.to_string(),
        control: control.to_string(),
        min_samples,
        method: METHOD.to_string(),
        variants,
        comparisons,
    }
}

/// How `summarize` compares, as its output states it.
const METHOD: &str = "median and p99 change with 95% percentile-bootstrap intervals (2000 resamples); Mann-Whitney U p-value; fixed horizon: no verdict below min_samples per variant";

#[cfg(test)]
mod journal_tests {
    use super::*;

    #[test]
    fn compacted_rollbacks_hold_the_same_in_force() {
        let lines = [
            r#"{"route":"chat","variant":"int8","rule":"ttft_p99_ms > 500"}"#,
            r#"{"route":"chat","variant":"int8"}"#,
            r#"{"route":"chat","evidence":true}"#,
            r#"{"route":"chat","variant":"int4","rule":"verdict: reject (x)"}"#,
            r#"{"route":"chat","variant":"int8","share":50}"#,
            r#"{"route":"chat","variant":"int8","share":100}"#,
            r#"{"route":"code","variant":"b"}"#,
        ];
        let f = InForce::of(&lines.join("\n"));
        assert_eq!(
            f.tripped,
            [("chat".into(), "int4".into(), "verdict: reject (x)".into())]
        );
        assert_eq!(f.pardoned, [("code".to_owned(), "b".to_owned())]);
        assert_eq!(f.promoted, [("chat".to_owned(), "int8".to_owned(), 100)]);
        let again = InForce::of(&f.lines().join("\n"));
        assert_eq!(again, f);
    }
}
