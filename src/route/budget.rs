//! Retry budget: retries may add at most `ratio` extra load over time, plus a floor of
//! `min_per_second`, so a struggling fleet is not finished off by its own retries.

use parking_lot::Mutex;
use tokio::time::Instant;

/// A token bucket in thousandths of a token: each request deposits `ratio` tokens, each second
/// adds `min_per_second`, each retry withdraws one. Capped at ten seconds' worth of either.
#[derive(Debug)]
pub struct RetryBudget {
    ratio_milli: u64,
    min_per_second: u64,
    cap_milli: u64,
    state: Mutex<(u64, Instant)>,
}

const ONE: u64 = 1000;

impl RetryBudget {
    /// A full budget.
    pub fn new(ratio: f64, min_per_second: u32) -> Self {
        let ratio_milli = (ratio * ONE as f64).round() as u64;
        let min = u64::from(min_per_second);
        let cap_milli = (10 * min * ONE).max(10 * ratio_milli).max(ONE);
        Self {
            ratio_milli,
            min_per_second: min,
            cap_milli,
            state: Mutex::new((cap_milli, Instant::now())),
        }
    }

    fn refill(&self, s: &mut (u64, Instant)) {
        let now = Instant::now();
        let ms = u64::try_from(now.saturating_duration_since(s.1).as_millis()).unwrap_or(u64::MAX);
        // Whole milliseconds only, so no refill is lost to rounding.
        s.0 =
            s.0.saturating_add(ms.saturating_mul(self.min_per_second))
                .min(self.cap_milli);
        s.1 += std::time::Duration::from_millis(ms);
    }

    /// A request arrived.
    pub fn deposit(&self) {
        let mut s = self.state.lock();
        self.refill(&mut s);
        s.0 = (s.0 + self.ratio_milli).min(self.cap_milli);
    }

    /// May one retry happen now? Takes a token if so.
    pub fn try_withdraw(&self) -> bool {
        let mut s = self.state.lock();
        self.refill(&mut s);
        if s.0 >= ONE {
            s.0 -= ONE;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn budget_caps_retries_and_refills() {
        let b = RetryBudget::new(0.2, 1);
        let mut n = 0;
        while b.try_withdraw() {
            n += 1;
        }
        assert_eq!(n, 10, "starts full: ten seconds of the floor");
        for _ in 0..10 {
            b.deposit();
        }
        assert!(
            b.try_withdraw() && b.try_withdraw(),
            "ten requests at 20% earn two retries"
        );
        assert!(!b.try_withdraw());
        tokio::time::advance(Duration::from_secs(3)).await;
        let mut n = 0;
        while b.try_withdraw() {
            n += 1;
        }
        assert_eq!(n, 3, "the floor refills one per second");
    }
}
