//! Comparing a variant with the control on one latency metric, with statistics a skeptical
//! engineer can check:
//!
//! - the relative difference of medians (and of p99s), with 95% percentile-bootstrap confidence
//!   intervals (2,000 resamples, seeded: the same data always gives the same interval);
//! - the Mann–Whitney U test (normal approximation with tie correction) for a location shift,
//!   with the Hodges–Lehmann estimate of that shift;
//! - a fixed horizon: no verdict until both arms reach the minimum sample size, so looking early
//!   cannot produce a "significant" result by chance. (Looking again after the horizon does
//!   inflate the error rate; the minimum is the guard the output enforces.)
//!
//! Large arms are subsampled (seeded) to at most `MAX_SAMPLES` for the bootstrap and the
//! Hodges–Lehmann estimate, which keeps a comparison under ~100 ms.

use crate::util::Rng;

/// Resamples per bootstrap interval.
pub const RESAMPLES: usize = 2000;
/// Largest arm used as is; bigger arms are subsampled.
pub const MAX_SAMPLES: usize = 2000;

/// A two-sided 95% interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interval {
    /// Lower bound.
    pub lo: f64,
    /// Upper bound.
    pub hi: f64,
}

impl Interval {
    /// True when the interval excludes `x`.
    pub fn excludes(&self, x: f64) -> bool {
        x < self.lo || x > self.hi
    }
}

/// The comparison of a treatment arm against the control on one metric.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    /// Samples in the control arm.
    pub n_control: usize,
    /// Samples in the treatment arm.
    pub n_treatment: usize,
    /// Median of treatment / median of control − 1.
    pub median_change: f64,
    /// 95% bootstrap interval of `median_change`.
    pub median_ci: Interval,
    /// p99 of treatment / p99 of control − 1.
    pub p99_change: f64,
    /// 95% bootstrap interval of `p99_change`.
    pub p99_ci: Interval,
    /// Hodges–Lehmann estimate of the shift (treatment − control), in the metric's unit.
    pub hodges_lehmann: f64,
    /// Two-sided Mann–Whitney p-value.
    pub p_value: f64,
}

impl Comparison {
    /// Significant at 5%: the median interval excludes 0 and the rank test agrees.
    pub fn significant(&self) -> bool {
        self.median_ci.excludes(0.0) && self.p_value < 0.05
    }
}

/// Wilson score 95% interval of a proportion `k / n` (`None` when `n == 0`).
pub fn wilson(k: u64, n: u64) -> Option<Interval> {
    if n == 0 {
        return None;
    }
    const Z: f64 = 1.959_963_984_540_054;
    let (n, p) = (n as f64, k as f64 / n as f64);
    let z2 = Z * Z;
    let centre = (p + z2 / (2.0 * n)) / (1.0 + z2 / n);
    let half = Z / (1.0 + z2 / n) * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    Some(Interval {
        lo: (centre - half).max(0.0),
        hi: (centre + half).min(1.0),
    })
}

/// The difference of two proportions, `k_t/n_t − k_c/n_c`, with Newcombe's hybrid score 95%
/// interval (method 10: each arm's Wilson interval, combined), which keeps its coverage near
/// 0 and 1 where the normal (Wald) interval does not.
pub fn proportion_change(k_c: u64, n_c: u64, k_t: u64, n_t: u64) -> Option<(f64, Interval)> {
    let (wc, wt) = (wilson(k_c, n_c)?, wilson(k_t, n_t)?);
    let (pc, pt) = (k_c as f64 / n_c as f64, k_t as f64 / n_t as f64);
    let d = pt - pc;
    let lo = d - ((pt - wt.lo).powi(2) + (wc.hi - pc).powi(2)).sqrt();
    let hi = d + ((wt.hi - pt).powi(2) + (pc - wc.lo).powi(2)).sqrt();
    Some((d, Interval { lo, hi }))
}

/// The `q` quantile of sorted data by the one rank rule (`stats::quantile`), unrounded: the
/// estimators and their bootstrap work on the exact samples. NaN when empty.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    crate::util::quantile::at_rank(sorted, q).unwrap_or(f64::NAN)
}

/// Samples grouped by the unit that was drawn at random: a request. A request's ITL gaps are
/// one cluster (they share its stream, its batch, its engine's state: not independent draws);
/// every other metric has one sample per request. Clusters are in a canonical order (by their
/// smallest value, then size, then id), so a comparison depends on the samples, not on the
/// order they arrived in (a fleet's merged logs give what one log of the same requests gives).
#[derive(Debug, Clone, Default)]
pub struct Clusters {
    /// Every value, cluster after cluster.
    values: Vec<f64>,
    /// Each cluster's range in `values`.
    ranges: Vec<(usize, usize)>,
}

impl Clusters {
    /// One value per cluster.
    pub fn singletons(x: &[f64]) -> Self {
        let mut values = x.to_vec();
        values.sort_unstable_by(f64::total_cmp);
        let ranges = (0..values.len()).map(|i| (i, i + 1)).collect();
        Self { values, ranges }
    }

    /// `samples` as (cluster id, value), grouped by id.
    pub fn of(samples: &[(u64, f64)]) -> Self {
        let mut by: Vec<(u64, f64)> = samples.to_vec();
        by.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
        let mut groups: Vec<(f64, usize, u64, usize)> = Vec::new(); // (min, len, id, start)
        let mut i = 0;
        while i < by.len() {
            let mut j = i;
            while j < by.len() && by[j].0 == by[i].0 {
                j += 1;
            }
            groups.push((by[i].1, j - i, by[i].0, i));
            i = j;
        }
        groups.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        let mut out = Self::default();
        for (_, len, _, start) in groups {
            let at = out.values.len();
            out.values
                .extend(by[start..start + len].iter().map(|s| s.1));
            out.ranges.push((at, at + len));
        }
        out
    }

    /// Clusters.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// No cluster.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    fn cluster(&self, i: usize) -> &[f64] {
        let (a, b) = self.ranges[i];
        &self.values[a..b]
    }

    /// At most `MAX_SAMPLES` clusters, drawn at random (with replacement) past it.
    fn subsample(&self, rng: &mut Rng) -> Self {
        if self.len() <= MAX_SAMPLES {
            return self.clone();
        }
        let mut out = Self::default();
        for _ in 0..MAX_SAMPLES {
            let c = self.cluster((rng.next_u64() % self.len() as u64) as usize);
            let at = out.values.len();
            out.values.extend_from_slice(c);
            out.ranges.push((at, at + c.len()));
        }
        out
    }

    /// Each cluster's median, in cluster order.
    fn medians(&self) -> Vec<f64> {
        (0..self.len())
            .map(|i| {
                let mut c = self.cluster(i).to_vec();
                c.sort_unstable_by(f64::total_cmp);
                quantile(&c, 0.5)
            })
            .collect()
    }

    /// Every value, sorted.
    fn sorted(&self) -> Vec<f64> {
        let mut v = self.values.clone();
        v.sort_unstable_by(f64::total_cmp);
        v
    }

    /// The median and p99 of a resample of the clusters (as many, with replacement).
    fn resample_quantiles(&self, rng: &mut Rng, buf: &mut Vec<f64>) -> (f64, f64) {
        buf.clear();
        for _ in 0..self.len() {
            buf.extend_from_slice(self.cluster((rng.next_u64() % self.len() as u64) as usize));
        }
        buf.sort_unstable_by(f64::total_cmp);
        (quantile(buf, 0.5), quantile(buf, 0.99))
    }
}

/// Standard normal CDF (Abramowitz–Stegun 7.1.26 via erf; |error| < 1.5e-7).
fn normal_cdf(z: f64) -> f64 {
    let x = z.abs() / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * x);
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let erf = 1.0 - poly * (-x * x).exp();
    if z >= 0.0 {
        0.5 * (1.0 + erf)
    } else {
        0.5 * (1.0 - erf)
    }
}

/// Two-sided Mann–Whitney p-value (normal approximation, tie-corrected, continuity-corrected).
pub fn mann_whitney(a: &[f64], b: &[f64]) -> f64 {
    let (n1, n2) = (a.len() as f64, b.len() as f64);
    if a.is_empty() || b.is_empty() {
        return 1.0;
    }
    let mut all: Vec<(f64, bool)> = a
        .iter()
        .map(|x| (*x, true))
        .chain(b.iter().map(|x| (*x, false)))
        .collect();
    all.sort_unstable_by(|x, y| x.0.total_cmp(&y.0));
    let (mut rank_a, mut ties) = (0.0, 0.0);
    let mut i = 0;
    while i < all.len() {
        let mut j = i;
        while j + 1 < all.len() && all[j + 1].0 == all[i].0 {
            j += 1;
        }
        let t = (j - i + 1) as f64;
        let avg = (i + j) as f64 / 2.0 + 1.0;
        rank_a += all[i..=j].iter().filter(|x| x.1).count() as f64 * avg;
        ties += t * t * t - t;
        i = j + 1;
    }
    let u = rank_a - n1 * (n1 + 1.0) / 2.0;
    let mean = n1 * n2 / 2.0;
    let n = n1 + n2;
    let var = n1 * n2 / 12.0 * ((n + 1.0) - ties / (n * (n - 1.0)));
    if var <= 0.0 {
        return 1.0;
    }
    let z = ((u - mean).abs() - 0.5).max(0.0) / var.sqrt();
    (2.0 * (1.0 - normal_cdf(z))).clamp(0.0, 1.0)
}

/// Hodges–Lehmann shift: the median of all pairwise differences `b_j − a_i`.
pub fn hodges_lehmann(a: &[f64], b: &[f64]) -> f64 {
    let mut d: Vec<f64> = Vec::with_capacity(a.len() * b.len());
    for x in a {
        for y in b {
            d.push(y - x);
        }
    }
    d.sort_unstable_by(f64::total_cmp);
    quantile(&d, 0.5)
}

/// Compares `treatment` with `control` (raw samples, one per request, any unit). `seed` fixes
/// the resampling.
pub fn compare(control: &[f64], treatment: &[f64], seed: u64) -> Option<Comparison> {
    compare_clusters(
        &Clusters::singletons(control),
        &Clusters::singletons(treatment),
        seed,
    )
}

/// Compares `treatment` with `control` where samples come in clusters (a request's ITL gaps):
/// the percentiles are over every sample, but the bootstrap resamples clusters, the rank test
/// and the Hodges–Lehmann shift are on each cluster's median, and the counts are of clusters —
/// so a stream's hundreds of gaps count as the one draw they are, not as hundreds.
pub fn compare_clusters(control: &Clusters, treatment: &Clusters, seed: u64) -> Option<Comparison> {
    if control.len() < 2 || treatment.len() < 2 {
        return None;
    }
    let mut rng = Rng::new(seed);
    let (c, t) = (control.subsample(&mut rng), treatment.subsample(&mut rng));
    let (cs, ts) = (c.sorted(), t.sorted());
    let ratio = |num: f64, den: f64| if den > 0.0 { num / den - 1.0 } else { f64::NAN };
    let median_change = ratio(quantile(&ts, 0.5), quantile(&cs, 0.5));
    let p99_change = ratio(quantile(&ts, 0.99), quantile(&cs, 0.99));
    let (mut meds, mut p99s) = (Vec::with_capacity(RESAMPLES), Vec::with_capacity(RESAMPLES));
    let (mut b1, mut b2) = (Vec::new(), Vec::new());
    for _ in 0..RESAMPLES {
        let (cm, c99) = c.resample_quantiles(&mut rng, &mut b1);
        let (tm, t99) = t.resample_quantiles(&mut rng, &mut b2);
        meds.push(ratio(tm, cm));
        p99s.push(ratio(t99, c99));
    }
    let interval = |v: &mut Vec<f64>| {
        v.retain(|x| x.is_finite());
        v.sort_unstable_by(f64::total_cmp);
        Interval {
            lo: quantile(v, 0.025),
            hi: quantile(v, 0.975),
        }
    };
    let (cm, tm) = (c.medians(), t.medians());
    Some(Comparison {
        n_control: control.len(),
        n_treatment: treatment.len(),
        median_change,
        median_ci: interval(&mut meds),
        p99_change,
        p99_ci: interval(&mut p99s),
        hodges_lehmann: hodges_lehmann(&cm[..cm.len().min(500)], &tm[..tm.len().min(500)]),
        p_value: mann_whitney(&cm, &tm),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Log-normal latencies (median `median`), like real TTFT distributions.
    fn lognormal(rng: &mut Rng, n: usize, median: f64) -> Vec<f64> {
        (0..n)
            .map(|_| {
                // Box–Muller.
                let (u1, u2) = (rng.unit().max(1e-12), rng.unit());
                let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
                median * (0.4 * z).exp()
            })
            .collect()
    }

    #[test]
    fn the_median_interval_covers_the_true_change_in_at_least_93_of_100_trials() {
        // Truth: treatment is 30% faster at the median (and everywhere: a scale change).
        let truth = -0.30;
        let mut covered = 0;
        let mut significant = 0;
        for trial in 0..100u64 {
            let mut rng = Rng::new(1000 + trial);
            let control = lognormal(&mut rng, 300, 100.0);
            let treatment = lognormal(&mut rng, 300, 70.0);
            let c = compare(&control, &treatment, trial).unwrap_or_else(|| panic!("comparable"));
            if !c.median_ci.excludes(truth) {
                covered += 1;
            }
            significant += usize::from(c.significant());
        }
        println!("coverage of the 95% median interval: {covered}/100; detected: {significant}/100");
        assert!(covered >= 93, "coverage {covered}/100");
        assert_eq!(
            significant, 100,
            "a 30% shift with n=300 per arm is always detected"
        );
    }

    #[test]
    fn no_difference_is_rarely_significant() {
        let mut false_positives = 0;
        for trial in 0..100u64 {
            let mut rng = Rng::new(5000 + trial);
            let a = lognormal(&mut rng, 200, 100.0);
            let b = lognormal(&mut rng, 200, 100.0);
            false_positives += usize::from(compare(&a, &b, trial).is_some_and(|c| c.significant()));
        }
        println!("false positives at 5%: {false_positives}/100");
        assert!(false_positives <= 10, "{false_positives}/100");
    }

    #[test]
    fn proportion_intervals_match_published_values() {
        // Newcombe (1998), table II, example (a): 56/70 vs 48/80 → 0.2000 [0.0524, 0.3339].
        let (d, ci) =
            proportion_change(48, 80, 56, 70).unwrap_or((0.0, Interval { lo: 0.0, hi: 0.0 }));
        assert!((d - 0.2).abs() < 1e-9);
        assert!(
            (ci.lo - 0.0524).abs() < 5e-4 && (ci.hi - 0.3339).abs() < 5e-4,
            "{ci:?}"
        );
        // Wilson for 0 of 10: [0, 0.2775].
        let w = wilson(0, 10).unwrap_or(Interval { lo: 1.0, hi: 1.0 });
        assert!(w.lo == 0.0 && (w.hi - 0.2775).abs() < 5e-4, "{w:?}");
        assert!(wilson(0, 0).is_none());
    }

    #[test]
    fn mann_whitney_and_hodges_lehmann_on_known_data() {
        let a = [1.0, 2.0, 3.0, 4.0, 5.0];
        let b = [6.0, 7.0, 8.0, 9.0, 10.0];
        assert!(mann_whitney(&a, &b) < 0.02);
        assert!(mann_whitney(&a, &a) > 0.9);
        assert_eq!(hodges_lehmann(&a, &b), 5.0);
        assert!((normal_cdf(1.959_964) - 0.975).abs() < 1e-6);
        assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0], 0.5), 2.0);
    }
}
