//! Where a backend stands on its roofline (Williams, Waterman and Patterson, "Roofline: an
//! insightful visual performance model", CACM 2009): from the TPOT and TTFT this gateway measured,
//! the batch its engine reports, and what the operator says of the model and the GPUs
//! (`model:`, `gpu:`), the decode bandwidth achieved and its share of the peak (MBU), and the
//! prefill compute achieved and its share of the peak (MFU).
//!
//! - One decode step reads every weight once and each running sequence's KV cache:
//!   `bytes/step = P·b + B·L·kv` (P parameters of b bytes, batch B, mean context L tokens of kv
//!   bytes each). It takes one TPOT, so the bandwidth achieved is `bytes/step ÷ TPOT` and
//!   **MBU** = that ÷ the GPUs' HBM bandwidth (Databricks, "LLM Inference Performance Engineering:
//!   Best Practices", 2023).
//! - A step does about `2·P·B` FLOPs (a forward pass is ~2 FLOPs per parameter per token: Kaplan
//!   et al., "Scaling Laws for Neural Language Models", 2020, §2.1), so its arithmetic intensity is
//!   `2·P·B ÷ bytes/step`; below the ridge (`peak FLOP/s ÷ peak bytes/s`) decode is memory-bound.
//! - Prefill of n prompt tokens does about `2·P·n` FLOPs; **MFU** = that ÷ (prefill time × peak
//!   FLOP/s) (Chowdhery et al., "PaLM", 2022, appendix B). The prefill time is the engine's own
//!   (vLLM's `request_prefill_time_seconds`) when scraped; otherwise the TTFT, which includes
//!   queueing and the network, so the MFU is then a lower bound.

use crate::accesslog::LogLine;
use crate::config::{GpuSpec, ModelSpec};
use serde::{Deserialize, Serialize};

/// Peak HBM bandwidth (GB/s) and dense BF16/FP16 tensor throughput (TFLOP/s) of one GPU, from
/// NVIDIA's datasheets (SXM parts where there are two).
pub const PRESETS: [(&str, f64, f64); 5] = [
    ("a100", 2039.0, 312.0),
    ("h100", 3350.0, 989.0),
    ("h200", 4800.0, 989.0),
    ("l4", 300.0, 121.0),
    ("l40s", 864.0, 362.0),
];

/// The peaks of a backend's GPUs, all of them together.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Peak {
    /// Bytes per second.
    pub bytes_per_s: f64,
    /// FLOP per second.
    pub flops: f64,
    /// How many GPUs the peaks add up (a model split over them: tensor parallel).
    pub count: u32,
}

impl Peak {
    /// From a `gpu:` section: its numbers, else its preset's; `None` when neither gives both.
    pub fn of(g: &GpuSpec) -> Option<Self> {
        let preset = g
            .preset
            .as_deref()
            .and_then(|p| PRESETS.iter().find(|(n, _, _)| n.eq_ignore_ascii_case(p)));
        let gb_s = g.hbm_gb_s.or(preset.map(|p| p.1))?;
        let tflops = g.tflops.or(preset.map(|p| p.2))?;
        let n = f64::from(g.count.max(1));
        Some(Self {
            bytes_per_s: gb_s * 1e9 * n,
            flops: tflops * 1e12 * n,
            count: g.count.max(1),
        })
    }
}

/// What was measured, for one backend.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Measured {
    /// Median TPOT over the window, seconds.
    pub tpot_s: Option<f64>,
    /// Median TTFT over the window, seconds.
    pub ttft_s: Option<f64>,
    /// Mean prompt tokens per request over the window.
    pub prompt_tokens: Option<f64>,
    /// Mean output tokens per request over the window.
    pub output_tokens: Option<f64>,
    /// The engine's batch while busy (mean of its reported running requests over the window's
    /// busy scrapes).
    pub batch: Option<f64>,
    /// Mean prefill time, as the engine reported it.
    pub engine_prefill_s: Option<f64>,
}

fn pct(x: f64) -> String {
    if x < 0.01 {
        format!("{:.2}%", 100.0 * x)
    } else {
        format!("{:.0}%", 100.0 * x)
    }
}

/// Where one backend sits on its roofline: the peak and model it rests on, decode's bandwidth and
/// prefill's compute, each with its verdict in words (`/stats`, `bench`, `report`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Assessment {
    /// The GPUs' peaks.
    pub peak: PeakView,
    /// The model's size.
    pub model: ModelView,
    /// Decode (`None`: no TPOT measured).
    pub decode: Option<Decode>,
    /// Prefill (`None`: no prompt tokens or prefill time measured).
    pub prefill: Option<Prefill>,
}

impl Assessment {
    /// The verdicts in words, decode first.
    pub fn words(&self) -> impl Iterator<Item = &str> {
        let d = self.decode.as_ref().map(|d| d.words.as_str());
        let p = self.prefill.as_ref().map(|p| p.words.as_str());
        d.into_iter().chain(p)
    }
}

/// The peaks, in the units people quote.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeakView {
    /// HBM bandwidth, GB/s (all GPUs).
    pub hbm_gb_s: f64,
    /// Dense compute, TFLOP/s (all GPUs).
    pub tflops: f64,
    /// GPUs the model is served on.
    pub gpus: u32,
}

/// The model as configured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelView {
    /// Parameters, billions.
    pub params_b: f64,
    /// Bytes per parameter (2 for FP16, 1 for INT8).
    pub bytes_per_param: f64,
    /// KV-cache bytes per token, where given.
    pub kv_bytes_per_token: Option<f64>,
}

/// Decode against HBM bandwidth.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decode {
    /// The TPOT it rests on, milliseconds.
    pub tpot_ms: f64,
    /// The engine's batch, where known.
    pub batch: Option<f64>,
    /// Mean context per sequence, tokens (prompt plus half the output).
    pub context_tokens: Option<f64>,
    /// Bytes read per decode step (weights, plus the KV cache where known).
    pub bytes_per_step: f64,
    /// Of which the KV cache.
    pub kv_bytes_per_step: Option<f64>,
    /// Achieved bandwidth, GB/s.
    pub achieved_gb_s: f64,
    /// Model-bandwidth utilisation: achieved over peak.
    pub mbu: f64,
    /// FLOPs per byte of a step, where the batch is known.
    pub arithmetic_intensity: Option<f64>,
    /// The GPUs' ridge point, FLOP/byte.
    pub ridge: f64,
    /// `memory-bound`, `compute-bound`, or `memory-bound at small batches`.
    pub bound: String,
    /// The verdict in words.
    pub words: String,
}

/// Prefill against peak compute.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prefill {
    /// Mean prompt tokens.
    pub prompt_tokens: f64,
    /// The prefill time it rests on, seconds.
    pub seconds: f64,
    /// `engine` (the engine's own prefill time) or `ttft` (which includes queueing).
    pub source: String,
    /// Timed by TTFT: the utilisation is a lower bound.
    pub lower_bound: bool,
    /// Achieved compute, TFLOP/s.
    pub achieved_tflops: f64,
    /// Model-FLOPs utilisation: achieved over peak.
    pub mfu: f64,
    /// The verdict in words.
    pub words: String,
}

/// The roofline of one backend, with its verdict in words.
pub fn assess(model: &ModelSpec, peak: Peak, m: Measured) -> Assessment {
    let p = model.params_b * 1e9;
    let weights = p * model.bytes_per_param;
    let ridge = peak.flops / peak.bytes_per_s;
    let decode = m.tpot_s.filter(|t| *t > 0.0).map(|tpot| {
        // KV traffic needs the batch and the context; without them the bytes are the weights
        // alone, a lower bound.
        let context = m
            .prompt_tokens
            .map(|i| i + m.output_tokens.unwrap_or(0.0) / 2.0);
        let kv = match (model.kv_bytes_per_token, m.batch, context) {
            (Some(k), Some(b), Some(l)) => Some(b * l * k),
            _ => None,
        };
        let bytes = weights + kv.unwrap_or(0.0);
        let achieved = bytes / tpot;
        let mbu = achieved / peak.bytes_per_s;
        let intensity = m.batch.map(|b| 2.0 * p * b / bytes);
        let bound = match intensity {
            Some(i) if i >= ridge => "compute-bound",
            Some(_) => "memory-bound",
            None => "memory-bound at small batches",
        };
        let mut words = format!(
            "decode at {} of HBM bandwidth ({:.0} of {:.0} GB/s",
            pct(mbu),
            achieved / 1e9,
            peak.bytes_per_s / 1e9
        );
        match (m.batch, intensity) {
            (Some(b), Some(i)) => words.push_str(&format!(
                "; batch {b:.0}, {i:.1} FLOP/byte against a ridge of {ridge:.0}): {bound}"
            )),
            _ => words.push_str(&format!("; batch unknown): {bound}")),
        }
        if intensity.is_some_and(|i| i < ridge) && mbu < 0.3 {
            words.push_str(", far below its bound: per-step overheads dominate");
        }
        if kv.is_none() {
            words.push_str(" (KV-cache traffic left out: a lower bound)");
        }
        Decode {
            tpot_ms: tpot * 1e3,
            batch: m.batch,
            context_tokens: context,
            bytes_per_step: bytes,
            kv_bytes_per_step: kv,
            achieved_gb_s: achieved / 1e9,
            mbu,
            arithmetic_intensity: intensity,
            ridge,
            bound: bound.to_string(),
            words,
        }
    });
    let prefill = m.prompt_tokens.filter(|n| *n > 0.0).and_then(|n| {
        let (secs, source) = match (m.engine_prefill_s, m.ttft_s) {
            (Some(s), _) if s > 0.0 => (s, "engine"),
            (_, Some(t)) if t > 0.0 => (t, "ttft"),
            _ => return None,
        };
        let flops = 2.0 * p * n / secs;
        let mfu = flops / peak.flops;
        let lower = source == "ttft";
        let words = format!(
            "prefill at {}{} of peak compute ({:.1} of {:.0} TFLOP/s, {n:.0} prompt tokens in {:.1} ms{})",
            pct(mfu),
            if lower { " or more" } else { "" },
            flops / 1e12,
            peak.flops / 1e12,
            secs * 1e3,
            if lower {
                " of TTFT, which includes queueing"
            } else {
                " by the engine's count"
            }
        );
        Some(Prefill {
            prompt_tokens: n,
            seconds: secs,
            source: source.to_string(),
            lower_bound: lower,
            achieved_tflops: flops / 1e12,
            mfu,
            words,
        })
    });
    Assessment {
        peak: PeakView {
            hbm_gb_s: peak.bytes_per_s / 1e9,
            tflops: peak.flops / 1e12,
            gpus: peak.count,
        },
        model: ModelView {
            params_b: model.params_b,
            bytes_per_param: model.bytes_per_param,
            kv_bytes_per_token: model.kv_bytes_per_token,
        },
        decode,
        prefill,
    }
}

/// What the roofline of `backend` rests on, read back from access-log lines (`ok` ones): the
/// median TPOT and TTFT, the mean tokens, the mean engine batch the requests were sent into
/// (`backend_running`) and the mean engine prefill time (`engine_prefill_ms`), where logged.
pub fn measured_from_log(lines: &[LogLine], backend: &str) -> (Measured, usize) {
    let ok: Vec<&LogLine> = lines
        .iter()
        .filter(|l| l.backend.as_deref() == Some(backend) && l.outcome.as_deref() == Some("ok"))
        .collect();
    let field =
        |k: fn(&LogLine) -> Option<f64>| -> Vec<f64> { ok.iter().filter_map(|l| k(l)).collect() };
    let median = |k: fn(&LogLine) -> Option<f64>| {
        let mut v = field(k);
        v.sort_by(f64::total_cmp);
        crate::util::quantile::of_sorted_ms(&v, 0.5).map(|ms| ms / 1e3)
    };
    let mean = |k: fn(&LogLine) -> Option<f64>| {
        let v = field(k);
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    let m = Measured {
        tpot_s: median(|l| l.tpot_ms),
        ttft_s: median(|l| l.ttft_ms),
        prompt_tokens: mean(|l| l.input_tokens.map(|n| n as f64)),
        output_tokens: mean(|l| l.output_tokens.map(|n| n as f64)),
        batch: mean(|l| l.backend_running).filter(|b| *b > 0.0),
        engine_prefill_s: mean(|l| l.engine_prefill_ms).map(|ms| ms / 1e3),
    };
    (m, ok.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h100() -> Peak {
        Peak::of(&GpuSpec {
            preset: Some("H100".into()),
            ..GpuSpec::default()
        })
        .unwrap_or_else(|| panic!("preset"))
    }

    #[test]
    fn the_presets_are_the_ones_config_accepts() {
        let names: Vec<&str> = PRESETS.iter().map(|p| p.0).collect();
        assert_eq!(names, crate::config::GPU_PRESETS);
    }

    #[test]
    fn an_8b_fp16_model_on_an_h100() {
        // 8 B parameters at 2 bytes: 16 GB a step. At 8 ms a token, 2 TB/s: 60% of 3.35 TB/s.
        let model = ModelSpec {
            params_b: 8.0,
            bytes_per_param: 2.0,
            kv_bytes_per_token: None,
        };
        let m = Measured {
            tpot_s: Some(0.008),
            batch: Some(16.0),
            ttft_s: Some(0.1),
            prompt_tokens: Some(1000.0),
            ..Measured::default()
        };
        let v = assess(&model, h100(), m);
        let d = v.decode.unwrap_or_else(|| panic!("decode"));
        assert!((d.achieved_gb_s - 2000.0).abs() < 1e-6);
        assert!((d.mbu - 2000.0 / 3350.0).abs() < 1e-9);
        // 2·P·B / (P·b) = B = 16 FLOP/byte, far below the ridge of 989/3.35 = 295.
        assert!((d.arithmetic_intensity.unwrap_or(0.0) - 16.0).abs() < 1e-9);
        assert_eq!(d.bound, "memory-bound");
        let w = &d.words;
        assert!(w.starts_with("decode at 60% of HBM bandwidth"), "{w}");
        assert!(w.contains("KV-cache traffic left out"), "{w}");
        // Prefill: 2 · 8e9 · 1000 FLOPs in 0.1 s = 160 TFLOP/s, at least 16% of 989.
        let p = v.prefill.unwrap_or_else(|| panic!("prefill"));
        assert_eq!(p.source, "ttft");
        assert!((p.achieved_tflops - 160.0).abs() < 1e-6);
        assert!(
            p.words
                .starts_with("prefill at 16% or more of peak compute"),
            "{}",
            p.words
        );
    }

    #[test]
    fn kv_traffic_counts_and_int8_halves_the_weights() {
        let peak = Peak::of(&GpuSpec {
            hbm_gb_s: Some(1000.0),
            tflops: Some(100.0),
            count: 2,
            ..GpuSpec::default()
        })
        .unwrap_or_else(|| panic!("numbers"));
        assert_eq!(peak.bytes_per_s, 2e12);
        let m = Measured {
            tpot_s: Some(0.01),
            batch: Some(4.0),
            prompt_tokens: Some(900.0),
            output_tokens: Some(200.0),
            engine_prefill_s: Some(0.05),
            ..Measured::default()
        };
        let fp16 = ModelSpec {
            params_b: 1.0,
            bytes_per_param: 2.0,
            kv_bytes_per_token: Some(1e5),
        };
        let v = assess(&fp16, peak, m);
        // 2 GB of weights plus 4 sequences × 1,000 tokens × 100 kB = 0.4 GB.
        assert_eq!(v.decode.map(|d| d.bytes_per_step), Some(2.4e9));
        assert_eq!(v.prefill.map(|p| p.source), Some("engine".into()));
        let int8 = ModelSpec {
            bytes_per_param: 1.0,
            ..fp16
        };
        assert_eq!(
            assess(&int8, peak, m).decode.map(|d| d.bytes_per_step),
            Some(1.4e9)
        );
        assert!(Peak::of(&GpuSpec::default()).is_none());
    }
}
