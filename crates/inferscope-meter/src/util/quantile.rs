//! The one percentile rule, used by every number the gateway reports (`/stats`, `/metrics`
//! summaries, the access log's ITL summary, span attributes, `/experiments`, `inferscope report`,
//! `inferscope bench`, guardrails).
//!
//! The q-quantile of n samples is the sample of rank ⌈q·n⌉ (at least 1): the nearest-rank rule,
//! which is what HdrHistogram's `value_at_quantile` computes. Where a histogram is kept, the value
//! reported is the highest value of the bucket that sample fell in (3 significant digits: at most
//! 0.1% above the sample); where exact samples are kept, the sample at that rank is rounded the
//! same way, so the same samples give the same number on every path.

use hdrhistogram::Histogram;
use std::sync::OnceLock;

/// Largest recordable value: one hour in microseconds (larger values saturate).
pub(crate) const MAX_US: u64 = 3_600_000_000;

/// Significant digits of the cumulative histograms (and of exact-sample rounding).
pub(crate) const DIGITS: u8 = 3;

/// Significant digits of the sliding window's histograms (1% resolution).
pub(crate) const WINDOW_DIGITS: u8 = 2;

/// The 1-based rank of the `q`-quantile among `n > 0` samples: ⌈q·n⌉, clamped to `1..=n` —
/// computed exactly as HdrHistogram computes it (same floating-point expression).
#[inline]
pub fn rank(n: usize, q: f64) -> usize {
    let q = if q > 1.0 { 1.0 } else { q };
    ((q * n as f64).ceil() as usize).clamp(1, n.max(1))
}

/// The sample at the `q`-quantile's rank of ascending `sorted`, unrounded (for the statistics
/// that resample: bootstrap intervals, change estimates).
pub fn at_rank<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    Some(sorted[rank(sorted.len(), q) - 1])
}

/// A histogram with no counts, used only for its bucket arithmetic (`u8` counters: 23 KB).
fn buckets() -> Option<&'static Histogram<u8>> {
    static H: OnceLock<Option<Histogram<u8>>> = OnceLock::new();
    H.get_or_init(|| Histogram::new_with_bounds(1, MAX_US, DIGITS).ok())
        .as_ref()
}

/// What a 3-digit HdrHistogram reports for a sample of `us` microseconds: the highest value of
/// its bucket (values above `MAX_US` saturate, as they do when recorded).
pub(crate) fn round_us(us: u64) -> u64 {
    let us = us.min(MAX_US);
    buckets().map_or(us, |h| h.highest_equivalent(us))
}

/// The reported `q`-quantile of ascending exact samples in microseconds.
pub fn of_sorted_us(sorted: &[u64], q: f64) -> Option<u64> {
    at_rank(sorted, q).map(round_us)
}

/// Whole microseconds of a millisecond value that holds whole microseconds (as the log and the
/// reservoirs keep them).
#[inline]
pub fn ms_to_us(ms: f64) -> u64 {
    if ms.is_finite() && ms > 0.0 {
        (ms * 1000.0).round() as u64
    } else {
        0
    }
}

/// Milliseconds of whole microseconds (`/stats`, the log and reports all print this).
#[inline]
pub fn us_to_ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// Whole microseconds of a duration, truncated as histograms record it.
#[inline]
pub fn duration_us(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A duration as the milliseconds every path reports: whole microseconds, truncated.
#[inline]
pub fn duration_ms(d: std::time::Duration) -> f64 {
    us_to_ms(duration_us(d))
}

/// The reported `q`-quantile, in milliseconds, of ascending samples in milliseconds.
pub fn of_sorted_ms(sorted: &[f64], q: f64) -> Option<f64> {
    at_rank(sorted, q).map(|ms| us_to_ms(round_us(ms_to_us(ms))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rank_is_nearest_rank() {
        assert_eq!(rank(4, 0.5), 2);
        assert_eq!(rank(5, 0.5), 3);
        assert_eq!(rank(100, 0.99), 99);
        assert_eq!(rank(101, 0.99), 100);
        assert_eq!(rank(3, 0.0), 1);
        assert_eq!(rank(3, 1.0), 3);
        assert_eq!(at_rank(&[1.0, 2.0, 3.0, 4.0], 0.5), Some(2.0));
        assert_eq!(at_rank::<u64>(&[], 0.5), None);
    }

    #[test]
    fn exact_samples_give_what_a_histogram_of_them_gives() {
        // Any samples: exact path and histogram path agree at every quantile, to the bit.
        let mut rng = crate::util::Rng::new(7);
        for n in [1usize, 2, 3, 10, 99, 100, 101, 1000, 4321] {
            let mut v: Vec<u64> = (0..n)
                .map(|_| rng.next_u64() % 2_000_000 + (rng.next_u64() % 3) * 10)
                .collect();
            let mut h = Histogram::<u64>::new_with_bounds(1, MAX_US, DIGITS).unwrap_or_else(|e| {
                panic!("{e}");
            });
            for x in &v {
                h.saturating_record(*x);
            }
            v.sort_unstable();
            // (At q = 0 HdrHistogram reports its bucket's lowest value; nothing asks for q = 0.)
            for q in [0.001, 0.25, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0] {
                assert_eq!(
                    of_sorted_us(&v, q),
                    Some(h.value_at_quantile(q)),
                    "n={n} q={q}"
                );
            }
            assert_eq!(round_us(v[n - 1]), h.max(), "n={n} max");
        }
    }

    #[test]
    fn milliseconds_round_trip_through_whole_microseconds() {
        for us in [0u64, 1, 999, 1000, 13_302, 123_456_789] {
            assert_eq!(ms_to_us(us_to_ms(us)), us);
        }
        let d = std::time::Duration::from_nanos(13_302_999);
        assert_eq!(duration_ms(d), 13.302);
        assert_eq!(
            of_sorted_ms(&[13.302], 0.5),
            Some(us_to_ms(round_us(13_302)))
        );
    }
}
