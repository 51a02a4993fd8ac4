//! The backend's own view of itself: its engine's Prometheus metrics (vLLM, SGLang, TGI,
//! llama.cpp, TensorRT-LLM: Triton's backend and `trtllm-serve`'s Prometheus names or its JSON
//! iteration statistics) and its GPUs' (NVIDIA DCGM exporter, nvidia_gpu_exporter), scraped every
//! `metrics.interval` and kept on the backend — for `/stats`, `/metrics`, the `least_queue`
//! balancer, and each request's record at the moment it was sent.

use crate::util::promtext::{samples, Sample};
use std::time::Duration;
use tokio::time::Instant;

/// Names each engine gives the same quantity, first match wins per sample.
const RUNNING: &[&str] = &[
    "vllm:num_requests_running",
    "sglang:num_running_reqs",
    "tgi_batch_current_size",
    "llamacpp:requests_processing",
    // trtllm-serve (`trtllm:` where Dynamo passes it through).
    "trtllm_num_requests_running",
    "trtllm:num_requests_running",
];
const WAITING: &[&str] = &[
    "vllm:num_requests_waiting",
    "sglang:num_queue_reqs",
    "tgi_queue_size",
    "llamacpp:requests_deferred",
    "trtllm_num_requests_waiting",
    "trtllm:num_requests_waiting",
];
/// KV-cache use as a ratio (vLLM's `_perc` is a ratio despite its name).
const KV_USAGE: &[&str] = &[
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "sglang:token_usage",
    "llamacpp:kv_cache_usage_ratio",
    "trtllm_kv_cache_utilization",
    "trtllm:kv_cache_utilization",
];
/// Triton's TensorRT-LLM backend: one family per quantity, told apart by a label.
const TRITON_REQUESTS: &str = "nv_trt_llm_request_metrics";
const TRITON_KV_BLOCKS: &str = "nv_trt_llm_kv_cache_block_metrics";

/// The value of label `key` in a sample.
fn label<'a>(s: &Sample<'a>, key: &str) -> Option<&'a str> {
    crate::util::promtext::pairs(s.labels).find_map(|(k, v)| (k == key).then_some(v))
}
const PREFIX_HITS: &[&str] = &[
    "vllm:prefix_cache_hits_total",
    "vllm:gpu_prefix_cache_hits_total",
];
const PREFIX_QUERIES: &[&str] = &[
    "vllm:prefix_cache_queries_total",
    "vllm:gpu_prefix_cache_queries_total",
];
const PREFIX_RATE: &[&str] = &["sglang:cache_hit_rate"];
const PREFILL_SUM: &[&str] = &["vllm:request_prefill_time_seconds_sum"];
const PREFILL_COUNT: &[&str] = &["vllm:request_prefill_time_seconds_count"];
const QUEUE_SUM: &[&str] = &["vllm:request_queue_time_seconds_sum"];
const QUEUE_COUNT: &[&str] = &["vllm:request_queue_time_seconds_count"];

/// Counters kept between scrapes, for rates over the interval.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Counters {
    prefix_hits: Option<f64>,
    prefix_queries: Option<f64>,
    prefill_sum: Option<f64>,
    prefill_count: Option<f64>,
    queue_sum: Option<f64>,
    queue_count: Option<f64>,
}

/// What the engine said in one scrape.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineView {
    /// Requests the engine is running (its batch), summed over its series.
    pub running: Option<f64>,
    /// Requests waiting in the engine's queue, summed.
    pub waiting: Option<f64>,
    /// KV-cache use, 0–1 (the fullest series).
    pub kv_cache_usage: Option<f64>,
    /// Prefix-cache hits over queries since `base` (the scrape loop passes the oldest of the
    /// last minute; SGLang: its own rate).
    pub prefix_cache_hit_rate: Option<f64>,
    /// Mean engine prefill time of the requests that finished prefill since `base`.
    pub prefill_seconds: Option<f64>,
    /// Mean time in the engine's queue of the requests scheduled since `base` (vLLM's
    /// `request_queue_time_seconds` histogram).
    pub queue_seconds: Option<f64>,
    /// Mean `running` over the scrapes of the last minute that found it busy (`running > 0`):
    /// the batch its requests decoded in (set by the scrape loop).
    pub busy_batch: Option<f64>,
    counters: Counters,
}

/// What the GPUs said in one scrape (every GPU the exporter lists).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuView {
    /// GPUs seen.
    pub count: u32,
    /// Mean utilisation, 0–1.
    pub utilization: Option<f64>,
    /// Memory used, bytes, summed.
    pub memory_used_bytes: Option<f64>,
    /// Memory in all, bytes, summed.
    pub memory_total_bytes: Option<f64>,
    /// Power draw, watts, summed.
    pub power_watts: Option<f64>,
    /// Mean SM clock, hertz.
    pub sm_clock_hz: Option<f64>,
    /// Energy the GPUs used since their driver loaded, joules, summed (DCGM's and NVML's
    /// counter): its difference over a run is the run's energy.
    pub energy_joules: Option<f64>,
    /// Mean power over the last minute from that counter, watts (set by the scrape loop; a
    /// sampled `power_watts` misses what happens between scrapes, the counter does not).
    pub energy_watts: Option<f64>,
}

impl GpuView {
    /// Mean power: from the energy counter where there is one, else the sampled draw.
    pub fn mean_watts(&self) -> Option<f64> {
        self.energy_watts.or(self.power_watts)
    }
}

/// The latest scrape of a backend.
#[derive(Debug, Clone, PartialEq)]
pub struct Scraped {
    /// When it was taken.
    pub at: Instant,
    /// The engine's metrics, when an engine endpoint is configured and answered.
    pub engine: Option<EngineView>,
    /// The GPUs', when a GPU endpoint is configured and answered.
    pub gpu: Option<GpuView>,
    /// Requests this gateway had in flight to the backend when the scrape was stored.
    pub in_flight: usize,
}

fn one_of(s: &Sample<'_>, names: &[&str]) -> bool {
    s.value.is_finite() && names.contains(&s.name)
}

fn add(acc: &mut Option<f64>, v: f64) {
    *acc = Some(acc.unwrap_or(0.0) + v);
}

fn max(acc: &mut Option<f64>, v: f64) {
    *acc = Some(acc.map_or(v, |a| a.max(v)));
}

/// `(now − before) / (now_total − before_total)` over an interval; `None` without a previous
/// scrape, without new queries, or when a counter went back (a restart).
fn ratio_since(now: (Option<f64>, Option<f64>), before: (Option<f64>, Option<f64>)) -> Option<f64> {
    let (n, d) = (now.0? - before.0?, now.1? - before.1?);
    (d > 0.0 && n >= 0.0).then(|| (n / d).min(1.0))
}

/// A histogram's mean over an interval: `Δsum / Δcount` from its `(sum, count)` now and
/// before; `None` without new samples or when it went back (a restart).
fn mean_since(now: (Option<f64>, Option<f64>), before: (Option<f64>, Option<f64>)) -> Option<f64> {
    let (sum, n) = (now.0? - before.0?, now.1? - before.1?);
    (n > 0.0 && sum >= 0.0).then(|| sum / n)
}

impl EngineView {
    /// Reads an engine's exposition; `base` (an earlier scrape) turns counters into rates and
    /// means since then.
    pub fn parse(text: &str, base: Option<&EngineView>) -> Self {
        if text.trim_start().starts_with('[') {
            return Self::iterations(text);
        }
        let mut v = EngineView::default();
        let mut sglang_rate = None;
        for s in samples(text) {
            let c = &mut v.counters;
            if one_of(&s, RUNNING) {
                add(&mut v.running, s.value);
            } else if one_of(&s, WAITING) {
                add(&mut v.waiting, s.value);
            } else if one_of(&s, KV_USAGE) {
                max(&mut v.kv_cache_usage, s.value.clamp(0.0, 1.0));
            } else if one_of(&s, PREFIX_HITS) {
                add(&mut c.prefix_hits, s.value);
            } else if one_of(&s, PREFIX_QUERIES) {
                add(&mut c.prefix_queries, s.value);
            } else if one_of(&s, PREFIX_RATE) {
                max(&mut sglang_rate, s.value.clamp(0.0, 1.0));
            } else if one_of(&s, PREFILL_SUM) {
                add(&mut c.prefill_sum, s.value);
            } else if one_of(&s, PREFILL_COUNT) {
                add(&mut c.prefill_count, s.value);
            } else if one_of(&s, QUEUE_SUM) {
                add(&mut c.queue_sum, s.value);
            } else if one_of(&s, QUEUE_COUNT) {
                add(&mut c.queue_count, s.value);
            } else if s.name == TRITON_REQUESTS && s.value.is_finite() {
                // `scheduled`: in the batch this iteration; `waiting`: queued.
                match label(&s, "request_type") {
                    Some("scheduled") => add(&mut v.running, s.value),
                    Some("waiting") => add(&mut v.waiting, s.value),
                    _ => {}
                }
            } else if s.name == TRITON_KV_BLOCKS
                && s.value.is_finite()
                && label(&s, "kv_cache_block_type") == Some("fraction")
            {
                max(&mut v.kv_cache_usage, s.value.clamp(0.0, 1.0));
            }
        }
        if let Some(p) = base.map(|p| p.counters) {
            let c = v.counters;
            v.prefix_cache_hit_rate = ratio_since(
                (c.prefix_hits, c.prefix_queries),
                (p.prefix_hits, p.prefix_queries),
            );
            v.prefill_seconds = mean_since(
                (c.prefill_sum, c.prefill_count),
                (p.prefill_sum, p.prefill_count),
            );
            v.queue_seconds =
                mean_since((c.queue_sum, c.queue_count), (p.queue_sum, p.queue_count));
        }
        v.prefix_cache_hit_rate = v.prefix_cache_hit_rate.or(sglang_rate);
        v
    }

    /// `trtllm-serve`'s `/metrics`: JSON, the iteration statistics since the last read; the
    /// latest iteration's active and queued requests and KV-cache blocks in use.
    fn iterations(text: &str) -> Self {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Iteration {
            num_active_requests: Option<f64>,
            num_queued_requests: Option<f64>,
            kv_cache_stats: Option<KvStats>,
        }
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct KvStats {
            used_num_blocks: Option<f64>,
            max_num_blocks: Option<f64>,
        }
        let Some(last) = serde_json::from_str::<Vec<Iteration>>(text)
            .ok()
            .and_then(|v| v.into_iter().last())
        else {
            return Self::default();
        };
        let kv = last.kv_cache_stats.and_then(|k| {
            let (used, max) = (k.used_num_blocks?, k.max_num_blocks?);
            (max > 0.0).then(|| (used / max).clamp(0.0, 1.0))
        });
        Self {
            running: last.num_active_requests,
            waiting: last.num_queued_requests,
            kv_cache_usage: kv,
            ..Self::default()
        }
    }

    /// The mean engine prefill time of the requests that finished prefill between `earlier`
    /// and this scrape, seconds (vLLM's histogram).
    pub fn prefill_since(&self, earlier: &EngineView) -> Option<f64> {
        let (c, p) = (self.counters, earlier.counters);
        mean_since(
            (c.prefill_sum, c.prefill_count),
            (p.prefill_sum, p.prefill_count),
        )
    }

    /// True when the exposition named none of the quantities read (not an engine this knows).
    pub fn is_empty(&self) -> bool {
        self.running.is_none()
            && self.waiting.is_none()
            && self.kv_cache_usage.is_none()
            && self.counters == Counters::default()
    }
}

impl GpuView {
    /// As `/stats` and `inferscope gpu` show it.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "count": self.count,
            "utilization": self.utilization,
            "memory_used_bytes": self.memory_used_bytes,
            "memory_total_bytes": self.memory_total_bytes,
            "power_watts": self.power_watts,
            "sm_clock_hz": self.sm_clock_hz,
            "energy_joules": self.energy_joules,
            "energy_watts": self.energy_watts,
        })
    }

    /// Reads a DCGM exporter's or nvidia_gpu_exporter's exposition.
    pub fn parse(text: &str) -> Self {
        const MIB: f64 = 1024.0 * 1024.0;
        let (mut util, mut clock) = ((0.0, 0u32), (0.0, 0u32));
        let mut g = GpuView::default();
        let (mut used, mut free, mut total) = (None, None, None);
        for s in samples(text) {
            if !s.value.is_finite() {
                continue;
            }
            match s.name {
                // DCGM: percent, MiB, watts, MHz.
                "DCGM_FI_DEV_GPU_UTIL" => util = (util.0 + s.value / 100.0, util.1 + 1),
                "DCGM_FI_DEV_FB_USED" => add(&mut used, s.value * MIB),
                "DCGM_FI_DEV_FB_FREE" => add(&mut free, s.value * MIB),
                "DCGM_FI_DEV_POWER_USAGE" => add(&mut g.power_watts, s.value),
                "DCGM_FI_DEV_SM_CLOCK" => clock = (clock.0 + s.value * 1e6, clock.1 + 1),
                // Millijoules since the driver loaded.
                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" => {
                    add(&mut g.energy_joules, s.value / 1000.0);
                }
                // nvidia_gpu_exporter: ratios, bytes, watts, hertz.
                "nvidia_smi_utilization_gpu_ratio" => util = (util.0 + s.value, util.1 + 1),
                "nvidia_smi_memory_used_bytes" => add(&mut used, s.value),
                "nvidia_smi_memory_total_bytes" => add(&mut total, s.value),
                "nvidia_smi_power_draw_watts" => add(&mut g.power_watts, s.value),
                "nvidia_smi_clocks_current_sm_clock_hz" => {
                    clock = (clock.0 + s.value, clock.1 + 1);
                }
                _ => {}
            }
        }
        g.count = util.1;
        g.utilization = (util.1 > 0).then(|| (util.0 / f64::from(util.1)).clamp(0.0, 1.0));
        g.sm_clock_hz = (clock.1 > 0).then(|| clock.0 / f64::from(clock.1));
        g.memory_used_bytes = used;
        g.memory_total_bytes = total.or_else(|| used.zip(free).map(|(u, f)| u + f));
        g
    }
}

/// How loaded an engine is for a new request, lower first: the queue it would join (waiting, plus
/// what this gateway sent since the scrape), then KV-cache use, then the batch.
pub fn queue_score(s: &Scraped, in_flight_now: usize) -> Option<(f64, f64, f64)> {
    let e = s.engine.as_ref()?;
    let sent_since = in_flight_now.saturating_sub(s.in_flight) as f64;
    Some((
        e.waiting.unwrap_or(0.0) + sent_since,
        e.kv_cache_usage.unwrap_or(0.0),
        e.running.unwrap_or(0.0),
    ))
}

/// An engine's load as a request found it: what its record keeps.
pub fn at_request(
    s: &Scraped,
    now: Instant,
    stale_after: Duration,
) -> Option<crate::facts::EngineLoad> {
    let age = now.saturating_duration_since(s.at);
    if age > stale_after {
        return None;
    }
    let e = s.engine.as_ref()?;
    Some(crate::facts::EngineLoad {
        running: e.running.map(|v| v as f32),
        waiting: e.waiting.map(|v| v as f32),
        kv_cache_usage: e.kv_cache_usage.map(|v| v as f32),
        age_ms: u32::try_from(age.as_millis()).unwrap_or(u32::MAX),
    })
}
