//! The hardware side of a bench run: the engine's own metrics (its running batch, its queue,
//! its KV cache) and the GPUs' (utilisation, memory, power, the energy counter) sampled through
//! the run, from the engine's `/metrics`, a DCGM exporter (or nvidia_gpu_exporter), or NVML on
//! this host — and from them the energy per output token, and the batch the roofline takes.

use crate::route::engine::{EngineView, GpuView};
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tokio::time::Instant;

/// Where the GPUs are read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuSource {
    /// A DCGM exporter's or nvidia_gpu_exporter's `/metrics`.
    Url(String),
    /// This host's GPUs through NVML.
    Nvml,
}

impl GpuSource {
    /// `nvml`, or an `http(s)://` URL.
    pub fn parse(s: &str) -> Option<Self> {
        if s == "nvml" {
            Some(Self::Nvml)
        } else if s.starts_with("http://") || s.starts_with("https://") {
            Some(Self::Url(s.to_owned()))
        } else {
            None
        }
    }
}

/// One reading.
#[derive(Debug, Clone)]
struct Reading {
    /// Seconds after sampling began.
    t: f64,
    engine: Option<EngineView>,
    gpu: Option<GpuView>,
}

/// Samples while a run goes on: started before it, stopped after it.
pub struct Sampler {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<(Vec<Reading>, Vec<String>)>,
    every: Duration,
}

impl Sampler {
    /// Starts sampling `engine` (an engine's `/metrics` URL) and `gpu` every `every`, the first
    /// reading at once. `connector` makes the connections (TLS for `https://`); `headers` go
    /// with each (the run's purpose, so a gateway counts these reads as the benchmark's, and
    /// its key).
    pub fn start(
        engine: Option<String>,
        gpu: Option<GpuSource>,
        every: Duration,
        connector: crate::tls::Connector,
        headers: Vec<(String, String)>,
    ) -> Self {
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let client: Client<crate::tls::Connector, Full<Bytes>> =
            Client::builder(TokioExecutor::new()).build(connector);
        let task = tokio::spawn(async move {
            let start = Instant::now();
            let mut readings = Vec::new();
            let mut errors: Vec<String> = Vec::new();
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut last = false;
            loop {
                if !last {
                    tokio::select! {
                        _ = tick.tick() => {}
                        _ = &mut stopped => last = true,
                    }
                }
                let t = start.elapsed().as_secs_f64();
                let engine_text = match &engine {
                    Some(u) => match get(&client, u, &headers).await {
                        Ok(t) => Some(t),
                        Err(e) => {
                            note(&mut errors, format!("{u}: {e}"));
                            None
                        }
                    },
                    None => None,
                };
                let base = readings
                    .iter()
                    .rev()
                    .find_map(|r: &Reading| r.engine.as_ref());
                let engine_view = engine_text
                    .map(|t| EngineView::parse(&t, base))
                    .filter(|v| !v.is_empty());
                let gpu_view = match &gpu {
                    Some(GpuSource::Url(u)) => match get(&client, u, &headers).await {
                        Ok(t) => Some(GpuView::parse(&t)).filter(|g| g.count > 0),
                        Err(e) => {
                            note(&mut errors, format!("{u}: {e}"));
                            None
                        }
                    },
                    Some(GpuSource::Nvml) => match crate::route::nvml::read() {
                        Ok(g) => Some(g),
                        Err(e) => {
                            note(&mut errors, e);
                            None
                        }
                    },
                    None => None,
                };
                readings.push(Reading {
                    t,
                    engine: engine_view,
                    gpu: gpu_view,
                });
                if last {
                    break;
                }
            }
            (readings, errors)
        });
        Self { stop, task, every }
    }

    /// Takes a last reading, stops, and sums up what was read; `output_tokens`: the run's, for
    /// the energy per token.
    pub async fn finish(self, output_tokens: u64) -> Hardware {
        let _ = self.stop.send(());
        let (readings, errors) = self.task.await.unwrap_or_default();
        summarize(&readings, output_tokens, self.every, errors)
    }
}

/// Keeps the first few distinct errors.
fn note(errors: &mut Vec<String>, e: String) {
    if errors.len() < 4 && !errors.contains(&e) {
        errors.push(e);
    }
}

async fn get(
    client: &Client<crate::tls::Connector, Full<Bytes>>,
    url: &str,
    headers: &[(String, String)],
) -> Result<String, String> {
    let b = super::get_body(client, url, headers, 16 << 20).await?;
    Ok(String::from_utf8_lossy(&b).into_owned())
}

/// The hardware side of a run, as the report keeps it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Hardware {
    /// Readings taken (the first before the run, the last after it).
    pub samples: usize,
    /// Seconds between readings.
    pub every_s: f64,
    /// From the first reading to the last, seconds.
    pub span_s: f64,
    /// What the engine said, where it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineSide>,
    /// What the GPUs said, where they answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuSide>,
    /// Why a source did not answer (the first few).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
}

/// The engine through the run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineSide {
    /// Mean requests running over the readings that found it busy: the batch its requests
    /// decoded in (what the roofline takes).
    pub running_mean_busy: Option<f64>,
    /// The most running at a reading.
    pub running_max: Option<f64>,
    /// The most waiting at a reading.
    pub waiting_max: Option<f64>,
    /// The fullest the KV cache was at a reading, 0–1.
    pub kv_cache_usage_max: Option<f64>,
    /// Mean engine prefill time over the run, seconds (vLLM's histogram, first to last reading).
    pub prefill_seconds: Option<f64>,
}

/// The GPUs through the run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuSide {
    /// GPUs seen.
    pub count: u32,
    /// Mean utilisation over the readings, 0–1.
    pub utilization_mean: Option<f64>,
    /// The most memory used at a reading, bytes.
    pub memory_used_max_bytes: Option<f64>,
    /// Mean power over the readings, watts (all GPUs).
    pub power_mean_watts: Option<f64>,
    /// The energy the GPUs used over the run, joules.
    pub energy_joules: Option<f64>,
    /// How: `counter` (the GPUs' energy counter, last reading minus first) or `power`
    /// (power integrated over the readings, trapezoids: an estimate between readings).
    pub energy_from: Option<String>,
    /// Energy over the run's output tokens.
    pub joules_per_output_token: Option<f64>,
}

fn mean(v: impl Iterator<Item = f64>) -> Option<f64> {
    let (s, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    (n > 0).then(|| s / n as f64)
}

fn most(v: impl Iterator<Item = f64>) -> Option<f64> {
    v.reduce(f64::max)
}

fn summarize(r: &[Reading], output_tokens: u64, every: Duration, errors: Vec<String>) -> Hardware {
    let span = match (r.first(), r.last()) {
        (Some(a), Some(b)) => b.t - a.t,
        _ => 0.0,
    };
    let engines: Vec<&EngineView> = r.iter().filter_map(|x| x.engine.as_ref()).collect();
    let engine = (!engines.is_empty()).then(|| {
        // vLLM's prefill histogram, over the run: from the first reading's counters to the last's.
        let prefill = match (engines.first(), engines.last()) {
            (Some(a), Some(b)) if engines.len() > 1 => b.prefill_since(a),
            _ => None,
        };
        EngineSide {
            running_mean_busy: mean(
                engines
                    .iter()
                    .filter_map(|e| e.running)
                    .filter(|n| *n > 0.0),
            ),
            running_max: most(engines.iter().filter_map(|e| e.running)),
            waiting_max: most(engines.iter().filter_map(|e| e.waiting)),
            kv_cache_usage_max: most(engines.iter().filter_map(|e| e.kv_cache_usage)),
            prefill_seconds: prefill,
        }
    });
    let gpus: Vec<(f64, &GpuView)> = r
        .iter()
        .filter_map(|x| Some((x.t, x.gpu.as_ref()?)))
        .collect();
    let gpu = (!gpus.is_empty()).then(|| {
        let counter = match (gpus.first(), gpus.last()) {
            (Some(a), Some(b)) if gpus.len() > 1 => {
                b.1.energy_joules
                    .zip(a.1.energy_joules)
                    .map(|(b, a)| b - a)
                    .filter(|d| *d >= 0.0)
            }
            _ => None,
        };
        let integrated = {
            let pts: Vec<(f64, f64)> = gpus
                .iter()
                .filter_map(|(t, g)| Some((*t, g.power_watts?)))
                .collect();
            (pts.len() > 1).then(|| {
                pts.windows(2)
                    .map(|w| (w[1].0 - w[0].0) * (w[0].1 + w[1].1) / 2.0)
                    .sum::<f64>()
            })
        };
        let (energy, from) = match (counter, integrated) {
            (Some(c), _) => (Some(c), Some("counter".to_owned())),
            (None, Some(p)) => (Some(p), Some("power".to_owned())),
            _ => (None, None),
        };
        GpuSide {
            count: gpus.iter().map(|(_, g)| g.count).max().unwrap_or(0),
            utilization_mean: mean(gpus.iter().filter_map(|(_, g)| g.utilization)),
            memory_used_max_bytes: most(gpus.iter().filter_map(|(_, g)| g.memory_used_bytes)),
            power_mean_watts: mean(gpus.iter().filter_map(|(_, g)| g.power_watts)),
            energy_joules: energy,
            energy_from: from,
            joules_per_output_token: energy
                .filter(|_| output_tokens > 0)
                .map(|e| e / output_tokens as f64),
        }
    });
    Hardware {
        samples: r.len(),
        every_s: every.as_secs_f64(),
        span_s: span,
        engine,
        gpu,
        errors,
    }
}

impl Hardware {
    /// Lines for the terminal.
    pub fn words(&self) -> Vec<String> {
        let mut out = Vec::new();
        let f = |v: Option<f64>, unit: &str, scale: f64| {
            v.map_or("-".to_owned(), |v| format!("{:.2}{unit}", v * scale))
        };
        if let Some(e) = &self.engine {
            out.push(format!(
                "engine: batch {} running on average while busy (at most {}), at most {} waiting, KV cache at most {}",
                f(e.running_mean_busy, "", 1.0),
                f(e.running_max, "", 1.0),
                f(e.waiting_max, "", 1.0),
                f(e.kv_cache_usage_max, "%", 100.0),
            ));
        }
        if let Some(g) = &self.gpu {
            out.push(format!(
                "gpu: {} GPU(s), {} utilised on average, {} power on average, memory at most {}",
                g.count,
                f(g.utilization_mean, "%", 100.0),
                f(g.power_mean_watts, " W", 1.0),
                f(g.memory_used_max_bytes, " GiB", 1.0 / (1u64 << 30) as f64),
            ));
            match (g.energy_joules, g.joules_per_output_token) {
                (Some(e), Some(j)) => out.push(format!(
                    "energy: {e:.1} J over the run ({}), {j:.4} J per output token",
                    if g.energy_from.as_deref() == Some("counter") {
                        "the GPUs' energy counter"
                    } else {
                        "power integrated between readings"
                    }
                )),
                (Some(e), None) => {
                    out.push(format!("energy: {e:.1} J over the run, no output token"))
                }
                _ => out.push("energy: not read (one reading, or no counter and no power)".into()),
            }
        }
        for e in &self.errors {
            out.push(format!("hardware: not read: {e}"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn gpu(power: f64, energy: Option<f64>) -> GpuView {
        GpuView {
            count: 1,
            power_watts: Some(power),
            energy_joules: energy,
            ..GpuView::default()
        }
    }

    #[test]
    fn energy_from_the_counter_else_from_power_integrated() {
        let r = |t: f64, g: GpuView| Reading {
            t,
            engine: None,
            gpu: Some(g),
        };
        let with_counter = [
            r(0.0, gpu(100.0, Some(5000.0))),
            r(2.0, gpu(300.0, Some(5500.0))),
        ];
        let h = summarize(&with_counter, 1000, Duration::from_secs(1), vec![]);
        let g = h.gpu.unwrap();
        assert_eq!(
            (g.energy_joules, g.energy_from.as_deref()),
            (Some(500.0), Some("counter"))
        );
        assert_eq!(g.joules_per_output_token, Some(0.5));
        // No counter: (100 + 300) / 2 W over 2 s, then 300 W over 1 s.
        let power = [
            r(0.0, gpu(100.0, None)),
            r(2.0, gpu(300.0, None)),
            r(3.0, gpu(300.0, None)),
        ];
        let g = summarize(&power, 100, Duration::from_secs(1), vec![])
            .gpu
            .unwrap();
        assert_eq!(
            (g.energy_joules, g.energy_from.as_deref()),
            (Some(700.0), Some("power"))
        );
        assert_eq!(g.joules_per_output_token, Some(7.0));
        assert_eq!(g.power_mean_watts, Some(700.0 / 3.0));
    }
}
