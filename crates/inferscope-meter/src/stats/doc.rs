//! The typed `/stats` document: what `Snapshot::doc` builds and admin `GET /stats` serves, and
//! what its readers (`inferscope bench --compare-gateway`, the dashboard's tests) take back.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The admin `/stats` document: every group, and rollups of live traffic by each label.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StatsDoc {
    /// Seconds since start.
    pub uptime_s: f64,
    /// Length of the sliding window, seconds.
    pub window_s: u64,
    /// The unit of every latency (`milliseconds`).
    pub units: String,
    /// One entry per group (route, model, backend, variant, purpose, stream).
    pub groups: Vec<GroupStats>,
    /// Groups merged by one label, and overall.
    pub rollups: Rollups,
}

/// One group: its labels, and its tallies since start and over the window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct GroupStats {
    /// Route name.
    pub route: String,
    /// Requested model.
    pub model: String,
    /// Backend name.
    pub backend: String,
    /// Experiment variant.
    pub variant: String,
    /// `live`, `shadow`, `eval` or `bench`.
    pub purpose: String,
    /// Streamed responses.
    pub stream: bool,
    /// Since start.
    pub cumulative: TallyStats,
    /// Over the sliding window.
    pub window: TallyStats,
}

/// Since start and over the window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Periods {
    /// Since start.
    pub cumulative: TallyStats,
    /// Over the sliding window.
    pub window: TallyStats,
}

/// One rollup row: the label's value and the merged tallies. Exactly one label field is set,
/// the one the list is by.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RollupRow {
    /// By route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    /// By model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// By backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// By variant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// By stream (`true`, `false`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<String>,
    /// By purpose (every purpose, not live traffic only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purpose: Option<String>,
    /// The merged tallies.
    #[serde(flatten)]
    pub periods: Periods,
}

/// Rollups of live traffic by each label (`purpose`: each purpose's own), and overall.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Rollups {
    /// By route.
    pub route: Vec<RollupRow>,
    /// By model.
    pub model: Vec<RollupRow>,
    /// By backend.
    pub backend: Vec<RollupRow>,
    /// By variant.
    pub variant: Vec<RollupRow>,
    /// By stream.
    pub stream: Vec<RollupRow>,
    /// By purpose.
    pub purpose: Vec<RollupRow>,
    /// Every live request.
    pub all: Periods,
}

impl Rollups {
    /// The row of `purpose` in the by-purpose list.
    pub fn of_purpose(&self, purpose: &str) -> Option<&RollupRow> {
        self.purpose
            .iter()
            .find(|r| r.purpose.as_deref() == Some(purpose))
    }
}

/// Counters, latency summaries and rates of one tally.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct TallyStats {
    /// Requests recorded.
    pub requests: u64,
    /// Requests by outcome other than `ok` (outcomes seen only).
    pub errors: BTreeMap<String, u64>,
    /// Requests by every outcome.
    pub outcomes: BTreeMap<String, u64>,
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Stream events that could not be parsed.
    pub malformed_events: u64,
    /// Time to first token.
    pub ttft: Option<LatencyStats>,
    /// Time to first chunk.
    pub ttfc: Option<LatencyStats>,
    /// Time per output token.
    pub tpot: Option<LatencyStats>,
    /// Inter-token latency.
    pub itl: Option<LatencyStats>,
    /// End to end.
    pub e2e: Option<LatencyStats>,
    /// The gateway's own time.
    pub overhead: Option<LatencyStats>,
    /// Kernel arrival to accept.
    pub accept_delay: Option<LatencyStats>,
    /// Upstream chunk arrival to its write to the client.
    pub forward_lag: Option<LatencyStats>,
    /// The engine's queue time (engine spans).
    pub engine_queue: Option<LatencyStats>,
    /// The engine's prefill time.
    pub engine_prefill: Option<LatencyStats>,
    /// The engine's decode time.
    pub engine_decode: Option<LatencyStats>,
    /// Requests per second over the tally's span (absent where there is no span: merged
    /// exports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_s: Option<f64>,
    /// Output tokens per second over the span.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens_per_s: Option<f64>,
    /// Against the objectives (`None`: no request judged).
    pub goodput: Option<GoodputStats>,
    /// Engine spans joined, missing and starved (only where engine spans are read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_spans: Option<EngineSpanCounts>,
}

impl TallyStats {
    /// The slot of a latency metric by its `/stats` name (`METRICS`; `None` for another name).
    pub(crate) fn latency_mut(&mut self, metric: &str) -> Option<&mut Option<LatencyStats>> {
        Some(match metric {
            "ttft" => &mut self.ttft,
            "ttfc" => &mut self.ttfc,
            "tpot" => &mut self.tpot,
            "itl" => &mut self.itl,
            "e2e" => &mut self.e2e,
            "overhead" => &mut self.overhead,
            "accept_delay" => &mut self.accept_delay,
            "forward_lag" => &mut self.forward_lag,
            "engine_queue" => &mut self.engine_queue,
            "engine_prefill" => &mut self.engine_prefill,
            "engine_decode" => &mut self.engine_decode,
            _ => return None,
        })
    }
}

/// One latency histogram summarised, milliseconds (quantiles by the one rule).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LatencyStats {
    /// 50th percentile (the one percentile rule, `util::quantile`).
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Arithmetic mean of the recorded values.
    pub mean: f64,
    /// Largest value.
    pub max: f64,
    /// Values recorded.
    pub count: u64,
}

/// Requests judged against the objectives, and how many met them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct GoodputStats {
    /// Requests judged.
    pub evaluated: u64,
    /// Requests that met every objective.
    pub met: u64,
    /// `met / evaluated`, four decimals.
    pub share: f64,
    /// Met per second over the span (absent where there is no span).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub met_per_s: Option<f64>,
}

/// Engine spans joined to records, missed, and the records judged starved.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct EngineSpanCounts {
    /// Records an engine span was joined to.
    pub joined: u64,
    /// Waited for and not received.
    pub missing: u64,
    /// Joined and judged starved (queued behind others' prefill).
    pub starved: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kept_metric_has_its_field() {
        let mut t = TallyStats::default();
        for name in crate::stats::METRICS {
            assert!(
                t.latency_mut(name).is_some(),
                "{name} has no field in TallyStats"
            );
        }
        assert!(t.latency_mut("ttft_p99").is_none());
    }
}
