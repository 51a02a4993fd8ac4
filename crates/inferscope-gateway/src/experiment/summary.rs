//! The typed shapes of an experiment's summary: per variant what it served and how fast, and
//! each variant against the control. `summarize` builds them from the arms; admin
//! `GET /experiments`, `inferscope report` and the verdict rows read them; JSON is made from them
//! only where they leave the process.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What a comparison row compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Time to first token.
    Ttft,
    /// Time to first chunk.
    Ttfc,
    /// Time per output token.
    Tpot,
    /// Inter-token latency (every gap).
    Itl,
    /// End to end, streamed requests.
    E2e,
    /// End to end, non-streamed requests.
    E2eUnstreamed,
    /// Share of judged requests that met the latency objectives.
    Goodput,
    /// Errors over requests.
    ErrorRate,
}

impl Metric {
    /// The latency metrics, in the order of an arm's samples (`super::COMPARED`).
    pub const LATENCY: [Metric; 6] = [
        Metric::Ttft,
        Metric::Ttfc,
        Metric::Tpot,
        Metric::Itl,
        Metric::E2e,
        Metric::E2eUnstreamed,
    ];

    /// The name in JSON and in `/stats`.
    pub fn as_str(self) -> &'static str {
        match self {
            Metric::Ttft => "ttft",
            Metric::Ttfc => "ttfc",
            Metric::Tpot => "tpot",
            Metric::Itl => "itl",
            Metric::E2e => "e2e",
            Metric::E2eUnstreamed => "e2e_unstreamed",
            Metric::Goodput => "goodput",
            Metric::ErrorRate => "error_rate",
        }
    }
}

/// One latency metric of one variant, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    /// 50th percentile (the one percentile rule, `util::quantile`).
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Values seen (the percentiles are over a uniform sample of them when there are more than
    /// the reservoir holds).
    pub n: u64,
}

impl Percentiles {
    /// The percentiles of `sorted` (ascending, milliseconds), `None` when it is empty.
    pub fn of_sorted(sorted: &[f64], seen: u64) -> Option<Self> {
        let q = |p: f64| crate::util::quantile::of_sorted_ms(sorted, p);
        Some(Self {
            p50: q(0.5)?,
            p90: q(0.9)?,
            p99: q(0.99)?,
            n: seen,
        })
    }
}

/// The share of judged requests that met the objectives, with its Wilson interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GoodputShare {
    /// `met / evaluated`.
    pub share: f64,
    /// 95% Wilson interval of the share.
    pub ci: [f64; 2],
    /// Requests that met every objective.
    pub met: u64,
    /// Requests judged.
    pub evaluated: u64,
}

/// One variant: its counts, rates and latency percentiles.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VariantSummary {
    /// The variant (or, in a report, the group).
    pub variant: String,
    /// Requests recorded, every outcome.
    pub requests: u64,
    /// Errors over requests.
    pub error_rate: f64,
    /// Output tokens per second of generation time, per stream.
    pub output_tokens_per_s: f64,
    /// Output tokens over the variant's span: what its backends served per second (`None`
    /// before a span of a second).
    pub served_output_tokens_per_s: Option<f64>,
    /// Requests by outcome (outcomes seen only).
    pub outcomes: BTreeMap<String, u64>,
    /// Against the route's objectives (`None`: no request judged).
    pub goodput: Option<GoodputShare>,
    /// Time to first token.
    pub ttft: Option<Percentiles>,
    /// Time to first chunk.
    pub ttfc: Option<Percentiles>,
    /// Time per output token.
    pub tpot: Option<Percentiles>,
    /// Inter-token latency.
    pub itl: Option<Percentiles>,
    /// End to end, streamed.
    pub e2e: Option<Percentiles>,
    /// End to end, not streamed.
    pub e2e_unstreamed: Option<Percentiles>,
    /// Money per million output tokens, where the backends have a `price:`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_per_million_output_tokens: Option<f64>,
    /// What that cost rests on (`list price`, `at the load served`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_basis: Option<String>,
    /// The currency of that cost (`USD`, from the backends' `price.currency`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_currency: Option<String>,
    /// Power of the variant's backends' GPUs, watts (the last minute's mean from their energy
    /// counter, else their sampled draw), where each backend's GPUs are scraped and serve this
    /// variant alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_watts: Option<f64>,
    /// That power over the output tokens per second its backends produced in the same minute
    /// (every request they answered: evals and benchmarks drew power too): joules per output
    /// token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub joules_per_output_token: Option<f64>,
}

impl VariantSummary {
    /// One latency metric (`None` for goodput and error rate, or when there is no sample).
    pub fn latency(&self, metric: Metric) -> Option<&Percentiles> {
        match metric {
            Metric::Ttft => self.ttft.as_ref(),
            Metric::Ttfc => self.ttfc.as_ref(),
            Metric::Tpot => self.tpot.as_ref(),
            Metric::Itl => self.itl.as_ref(),
            Metric::E2e => self.e2e.as_ref(),
            Metric::E2eUnstreamed => self.e2e_unstreamed.as_ref(),
            Metric::Goodput | Metric::ErrorRate => None,
        }
    }

    pub(crate) fn latency_mut(&mut self, metric: Metric) -> Option<&mut Option<Percentiles>> {
        match metric {
            Metric::Ttft => Some(&mut self.ttft),
            Metric::Ttfc => Some(&mut self.ttfc),
            Metric::Tpot => Some(&mut self.tpot),
            Metric::Itl => Some(&mut self.itl),
            Metric::E2e => Some(&mut self.e2e),
            Metric::E2eUnstreamed => Some(&mut self.e2e_unstreamed),
            Metric::Goodput | Metric::ErrorRate => None,
        }
    }
}

/// One variant against the control on one metric. Which fields are present depends on the
/// metric and on whether there was enough data:
///
/// - latency, below the horizon: `n_control`, `n_treatment`, `verdict`;
/// - latency: those and the median and p99 changes with their intervals, the Hodges–Lehmann
///   shift, the Mann–Whitney p-value and `significant`;
/// - goodput: `n_control`, `n_treatment`, `control`, `treatment`, `change`, `change_ci`,
///   `significant`;
/// - error rate: `control`, `treatment`.
///
/// A ratio that is undefined (a control median of zero) is `null` in JSON and NaN here.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// The treatment variant.
    pub variant: String,
    /// What is compared.
    pub metric: Metric,
    /// Samples of the control.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_control: Option<u64>,
    /// Samples of the treatment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_treatment: Option<u64>,
    /// Relative change of the median (0.1: 10% slower).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "nan_null")]
    pub median_change: Option<f64>,
    /// Its 95% bootstrap interval.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "nan_null::pair"
    )]
    pub median_ci: Option<[f64; 2]>,
    /// Relative change of the p99.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "nan_null")]
    pub p99_change: Option<f64>,
    /// Its 95% bootstrap interval.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "nan_null::pair"
    )]
    pub p99_ci: Option<[f64; 2]>,
    /// Hodges–Lehmann shift, milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "nan_null")]
    pub hodges_lehmann_ms: Option<f64>,
    /// Mann–Whitney U p-value.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "nan_null")]
    pub p_value: Option<f64>,
    /// Goodput or error rate of the control.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control: Option<f64>,
    /// Goodput or error rate of the treatment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub treatment: Option<f64>,
    /// Goodput: treatment minus control (a fraction).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change: Option<f64>,
    /// Its 95% interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change_ci: Option<[f64; 2]>,
    /// The interval excludes no change, at or above the horizon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub significant: Option<bool>,
    /// The comparison in one line.
    pub verdict: String,
}

impl Comparison {
    /// A row with only the variant, the metric and the verdict; the rest is set by the caller.
    pub fn new(variant: &str, metric: Metric, verdict: String) -> Self {
        Self {
            variant: variant.to_string(),
            metric,
            n_control: None,
            n_treatment: None,
            median_change: None,
            median_ci: None,
            p99_change: None,
            p99_ci: None,
            hodges_lehmann_ms: None,
            p_value: None,
            control: None,
            treatment: None,
            change: None,
            change_ci: None,
            significant: None,
            verdict,
        }
    }
}

/// Per-variant summary and the comparisons with the control (`summarize`'s output).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The experiment (`report` for `inferscope report`).
    pub name: String,
    /// The control variant.
    pub control: String,
    /// The fixed horizon: below it per variant, no verdict.
    pub min_samples: usize,
    /// How the comparisons are made, in one line.
    pub method: String,
    /// Every variant, the control among them.
    pub variants: Vec<VariantSummary>,
    /// Every other variant against the control.
    pub comparisons: Vec<Comparison>,
}

impl Summary {
    /// One variant's summary.
    pub fn variant(&self, name: &str) -> Option<&VariantSummary> {
        self.variants.iter().find(|v| v.variant == name)
    }

    /// The comparison of `variant` with the control on `metric`.
    pub fn comparison(&self, variant: &str, metric: Metric) -> Option<&Comparison> {
        self.comparisons
            .iter()
            .find(|c| c.variant == variant && c.metric == metric)
    }
}

/// `null` in JSON for a number that is not finite (and NaN back), as serde_json writes it.
mod nan_null {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub(super) fn serialize<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
        v.serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        Ok(Some(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN)))
    }

    /// An interval `[lo, hi]` whose ends may be `null`.
    pub(super) mod pair {
        use serde::{Deserialize, Deserializer, Serialize, Serializer};

        pub(crate) fn serialize<S: Serializer>(
            v: &Option<[f64; 2]>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            v.serialize(s)
        }

        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<[f64; 2]>, D::Error> {
            let pair = Option::<[Option<f64>; 2]>::deserialize(d)?;
            Ok(pair.map(|[lo, hi]| [lo.unwrap_or(f64::NAN), hi.unwrap_or(f64::NAN)]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_undefined_ratio_goes_out_as_null_and_comes_back_as_nan() {
        let mut c = Comparison::new("int8", Metric::Ttft, "int8 TTFT".into());
        c.n_control = Some(3);
        c.median_change = Some(f64::NAN);
        c.median_ci = Some([f64::NAN, 0.5]);
        let json = serde_json::to_string(&c).unwrap_or_default();
        assert!(json.contains(r#""median_change":null"#), "{json}");
        assert!(json.contains(r#""median_ci":[null,0.5]"#), "{json}");
        assert!(
            !json.contains("p99_change"),
            "absent fields stay absent: {json}"
        );
        let back: Comparison = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}"));
        assert!(back.median_change.is_some_and(f64::is_nan));
        assert_eq!(back.median_ci.map(|[_, hi]| hi), Some(0.5));
        assert_eq!(back.metric, Metric::Ttft);
        assert_eq!(back.p99_change, None);
    }

    #[test]
    fn metric_names_are_the_stats_names() {
        for m in Metric::LATENCY {
            assert_eq!(
                serde_json::to_value(m).ok(),
                Some(serde_json::Value::from(m.as_str()))
            );
        }
        assert_eq!(Metric::LATENCY.map(Metric::as_str), super::super::COMPARED);
    }
}
