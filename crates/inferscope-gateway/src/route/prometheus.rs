//! The routing layer's own Prometheus series, written through the one writer: each backend's
//! health and load, what its engine and GPUs reported when scraped, its place on its roofline,
//! and each experiment's guardrails.

use super::{Backend, BackendStatus, Router, Target};
use crate::stats::roofline::Assessment;
use crate::stats::Snapshot;
use crate::util::prometheus::{Labels, Writer};

impl Router {
    /// Writes the backends' and guardrails' series (`snap`: the statistics the roofline rests on).
    pub fn write_prometheus(&self, snap: &Snapshot, w: &mut Writer) {
        backend_metrics(self, w);
        roofline_metrics(self, snap, w);
        guardrail_metrics(self, w);
        promotion_metrics(self, w);
    }
}

/// Where backend `b` sits on its roofline (`model:` and `gpu:` set), from its requests over the
/// window and its engine's fresh scrape.
pub fn roofline(b: &Backend, snap: &Snapshot) -> Option<Assessment> {
    let (m, peak) = b.roofline.as_ref()?;
    Some(crate::stats::roofline::assess(m, *peak, measured(snap, b)))
}

/// Per-backend health and load gauges, for `/metrics`.
fn backend_metrics(router: &Router, w: &mut Writer) {
    type Get = fn(&BackendStatus) -> f64;
    let all: Vec<BackendStatus> = router.backends().iter().map(|b| b.status()).collect();
    let series: [(&str, &str, &str, Get); 6] = [
        (
            "inferscope_backend_up",
            "gauge",
            "1 when the backend is available (probe healthy, not ejected, not resting after a 429).",
            |s| f64::from(u8::from(s.available)),
        ),
        (
            "inferscope_backend_ejections_total",
            "counter",
            "Passive outlier ejections.",
            |s| s.ejections_total as f64,
        ),
        (
            "inferscope_backend_rate_limited_total",
            "counter",
            "429 answers from the backend (each rests it for its Retry-After).",
            |s| s.rate_limited_total as f64,
        ),
        (
            "inferscope_backend_in_flight",
            "gauge",
            "Requests in flight to the backend.",
            |s| s.in_flight as f64,
        ),
        (
            "inferscope_backend_queued",
            "gauge",
            "Requests waiting in the backend's queue.",
            |s| s.queued as f64,
        ),
        (
            "inferscope_backend_ttft_ewma_seconds",
            "gauge",
            "Moving average of the TTFT measured through the backend.",
            |s| s.ewma_ttft_ms / 1000.0,
        ),
    ];
    let labels: Vec<Labels> = all
        .iter()
        .map(|s| Labels::new(&[("backend", &s.name)]))
        .collect();
    for (name, kind, help, get) in series {
        w.series(name, kind, help, labels.iter().zip(all.iter().map(get)));
    }
    scrape_metrics(&all, &labels, w);
}

/// Each backend's place on its roofline (`model:` and `gpu:` set), for `/metrics`.
fn roofline_metrics(router: &Router, snap: &crate::stats::Snapshot, w: &mut Writer) {
    let rows: Vec<(Labels, Assessment)> = router
        .backends()
        .iter()
        .filter_map(|b| Some((Labels::new(&[("backend", &b.name)]), roofline(b, snap)?)))
        .collect();
    if rows.is_empty() {
        return;
    }
    type Get = fn(&Assessment) -> Option<f64>;
    let series: [(&str, &str, Get); 4] = [
        (
            "inferscope_backend_decode_bandwidth_bytes_per_second",
            "Decode bandwidth achieved by the backend: (weights + KV cache read per step) / TPOT.",
            |a| a.decode.as_ref().map(|d| d.achieved_gb_s * 1e9),
        ),
        (
            "inferscope_backend_mbu_ratio",
            "Model-bandwidth utilisation of the backend's decode: achieved / peak HBM bandwidth.",
            |a| a.decode.as_ref().map(|d| d.mbu),
        ),
        (
            "inferscope_backend_prefill_mfu_ratio",
            "Model-FLOPs utilisation of the backend's prefill (a lower bound when timed by TTFT).",
            |a| a.prefill.as_ref().map(|p| p.mfu),
        ),
        (
            "inferscope_backend_prefill_flops_per_second",
            "Prefill compute achieved by the backend: 2 x parameters x prompt tokens / prefill time.",
            |a| a.prefill.as_ref().map(|p| p.achieved_tflops * 1e12),
        ),
    ];
    for (name, help, get) in series {
        let values = rows.iter().filter_map(|(l, a)| Some((l, get(a)?)));
        w.series(name, "gauge", help, values);
    }
}

/// The backends' own metrics as last scraped, for `/metrics`: a series only for the backends
/// whose latest scrape had the value (stale ones included: the age says how old).
fn scrape_metrics(all: &[BackendStatus], labels: &[Labels], w: &mut Writer) {
    use super::engine::{EngineView, GpuView};
    type Engine = fn(&EngineView) -> Option<f64>;
    type Gpu = fn(&GpuView) -> Option<f64>;
    let scraped = || all.iter().zip(labels);
    if all.iter().all(|s| s.scrapes == (0, 0)) {
        return; // no backend scrapes its metrics
    }
    w.series(
        "inferscope_backend_scrapes_total",
        "counter",
        "Scrapes of the backend's metrics endpoints where every one answered.",
        scraped().map(|(s, l)| (l, s.scrapes.0 as f64)),
    );
    w.series(
        "inferscope_backend_scrape_failures_total",
        "counter",
        "Scrapes of the backend's metrics endpoints where one did not answer.",
        scraped().map(|(s, l)| (l, s.scrapes.1 as f64)),
    );
    w.series(
        "inferscope_backend_scrape_age_seconds",
        "gauge",
        "Age of the latest scrape of the backend's metrics.",
        scraped().filter_map(|(s, l)| Some((l, s.scraped.as_ref()?.1.as_secs_f64()))),
    );
    let engine: [(&str, &str, Engine); 6] = [
        (
            "inferscope_backend_engine_running",
            "Requests the backend's engine runs (its batch), as last scraped.",
            |e| e.running,
        ),
        (
            "inferscope_backend_engine_waiting",
            "Requests waiting in the backend engine's queue, as last scraped.",
            |e| e.waiting,
        ),
        (
            "inferscope_backend_kv_cache_usage_ratio",
            "The backend engine's KV-cache use, 0-1, as last scraped.",
            |e| e.kv_cache_usage,
        ),
        (
            "inferscope_backend_prefix_cache_hit_ratio",
            "The backend engine's prefix-cache hits over queries over the last minute.",
            |e| e.prefix_cache_hit_rate,
        ),
        (
            "inferscope_backend_engine_prefill_seconds",
            "The backend engine's mean prefill time over the last minute.",
            |e| e.prefill_seconds,
        ),
        (
            "inferscope_backend_engine_queue_seconds",
            "The backend engine's mean time in its queue over the last minute (vLLM's request_queue_time_seconds).",
            |e| e.queue_seconds,
        ),
    ];
    for (name, help, get) in engine {
        let rows = scraped().filter_map(|(s, l)| {
            let e = s.scraped.as_ref()?.0.engine.as_ref()?;
            Some((l, get(e)?))
        });
        w.series(name, "gauge", help, rows);
    }
    let gpu: [(&str, &str, Gpu); 5] = [
        (
            "inferscope_backend_gpu_utilization_ratio",
            "Mean utilisation of the backend's GPUs, 0-1.",
            |g| g.utilization,
        ),
        (
            "inferscope_backend_gpu_memory_used_bytes",
            "Memory used on the backend's GPUs.",
            |g| g.memory_used_bytes,
        ),
        (
            "inferscope_backend_gpu_memory_total_bytes",
            "Memory of the backend's GPUs.",
            |g| g.memory_total_bytes,
        ),
        (
            "inferscope_backend_gpu_power_watts",
            "Power drawn by the backend's GPUs.",
            |g| g.power_watts,
        ),
        (
            "inferscope_backend_gpu_sm_clock_hertz",
            "Mean SM clock of the backend's GPUs.",
            |g| g.sm_clock_hz,
        ),
    ];
    for (name, help, get) in gpu {
        let rows = scraped().filter_map(|(s, l)| {
            let g = s.scraped.as_ref()?.0.gpu.as_ref()?;
            Some((l, get(g)?))
        });
        w.series(name, "gauge", help, rows);
    }
    // The exporter's own counter, passed on: its rate is the power, its difference over a span
    // the energy of that span (divided by the output tokens: joules per token).
    let rows = scraped().filter_map(|(s, l)| {
        let g = s.scraped.as_ref()?.0.gpu.as_ref()?;
        Some((l, g.energy_joules?))
    });
    w.series(
        "inferscope_backend_gpu_energy_joules_total",
        "counter",
        "Energy the backend's GPUs used since their driver loaded (DCGM's or NVML's counter).",
        rows,
    );
}

/// What the roofline of backend `b` rests on: its requests over the window (every group it
/// served, merged) and its engine's fresh scrape.
fn measured(snap: &Snapshot, b: &Backend) -> crate::stats::roofline::Measured {
    use crate::meter::Outcome;
    let mut t = crate::stats::Tally::default();
    for (k, _, w) in &snap.groups {
        if *k.backend == *b.name {
            t.merge(w);
        }
    }
    let median = |name: &str| {
        let i = crate::stats::METRICS.iter().position(|m| *m == name)?;
        let h = t.hists[i].histogram().filter(|h| !h.is_empty())?;
        Some(h.value_at_quantile(0.5) as f64 / 1e6)
    };
    let ok = t.outcomes[Outcome::Ok.index()] as f64;
    let mean = |sum: u64| (ok > 0.0 && sum > 0).then(|| sum as f64 / ok);
    let engine = b.fresh_scrape();
    let engine = engine.as_ref().and_then(|s| s.engine.as_ref());
    crate::stats::roofline::Measured {
        tpot_s: median("tpot"),
        ttft_s: median("ttft"),
        prompt_tokens: mean(t.input_tokens),
        output_tokens: mean(t.output_tokens),
        batch: engine.and_then(|e| e.busy_batch.or(e.running)),
        engine_prefill_s: engine.and_then(|e| e.prefill_seconds),
    }
}

/// Promotion gauges (`on_accept: promote`), for `/metrics`.
fn promotion_metrics(router: &Router, w: &mut Writer) {
    let mut share = Vec::new();
    let mut steps = Vec::new();
    for r in router.routes() {
        let Target::Experiment(x) = &r.target else {
            continue;
        };
        let Some(p) = &x.promotion else { continue };
        // What a promotion moves: from the control's share to the promoted variant's.
        let moved = p.promoted().map(|(v, s)| {
            let room = x.split.share(&x.control);
            let m = (f64::from(s) / 100.0 - x.split.share(&v)).clamp(0.0, room);
            (v, m)
        });
        for v in x.split.names() {
            let labels = Labels::new(&[("route", &r.name), ("variant", v)]);
            let mut now = x.split.share(v);
            if let Some((pv, m)) = &moved {
                if pv == v {
                    now += m;
                } else if *v == x.control {
                    now -= m;
                }
            }
            share.push((labels, now));
        }
        steps.push((
            Labels::new(&[("route", &r.name)]),
            p.view().promotions_total,
        ));
    }
    if share.is_empty() {
        return;
    }
    w.series(
        "inferscope_experiment_variant_share",
        "gauge",
        "The variant's share of the experiment's traffic by its split, 0 to 1 (its weight's, or a promotion's).",
        share.iter().map(|(l, v)| (l, v)),
    );
    w.series(
        "inferscope_experiment_promotions_total",
        "counter",
        "Steps taken by on_accept: promote.",
        steps.iter().map(|(l, v)| (l, v)),
    );
}

/// Guardrail state gauges, for `/metrics`.
fn guardrail_metrics(router: &Router, w: &mut Writer) {
    let mut tripped = Vec::new();
    let mut trips = Vec::new();
    for r in router.routes() {
        let Target::Experiment(x) = &r.target else {
            continue;
        };
        let Some(g) = &x.guard else { continue };
        for v in x.split.names() {
            let labels = Labels::new(&[("route", &r.name), ("variant", v)]);
            tripped.push((labels, u8::from(g.tripped(v))));
        }
        trips.push((Labels::new(&[("route", &r.name)]), g.trips_total()));
    }
    if tripped.is_empty() {
        return;
    }
    w.series(
        "inferscope_guardrail_tripped",
        "gauge",
        "1 while the variant is rolled back to the control.",
        tripped.iter().map(|(l, v)| (l, v)),
    );
    w.series(
        "inferscope_guardrail_trips_total",
        "counter",
        "Guardrail trips.",
        trips.iter().map(|(l, v)| (l, v)),
    );
}
