//! A seeded random number generator for everything that must be reproducible: the simulator's
//! timing and answers, bootstrap resampling, reservoirs, generated datasets and load.

use std::time::Duration;

/// SplitMix64: small, fast, and the same sequence for the same seed on every platform.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform integer in `[lo, hi]`.
    pub fn range(&mut self, lo: u32, hi: u32) -> u32 {
        let span = u64::from(hi - lo) + 1;
        lo + (self.next_u64() % span) as u32
    }

    /// `d` scaled by a uniform factor in `[1 − jitter, 1 + jitter]`.
    pub fn jitter(&mut self, d: Duration, jitter: f64) -> Duration {
        if jitter == 0.0 {
            return d;
        }
        d.mul_f64(1.0 + jitter * (2.0 * self.unit() - 1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_deterministic_and_jitter_bounded() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        for _ in 0..1000 {
            let (x, y) = (
                a.jitter(Duration::from_millis(10), 0.2),
                b.jitter(Duration::from_millis(10), 0.2),
            );
            assert_eq!(x, y);
            assert!(x >= Duration::from_millis(8) && x <= Duration::from_millis(12));
        }
    }
}
