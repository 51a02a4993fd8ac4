//! Fault injection for the simulator, to drive the gateway's resilience: errors, dying and
//! stalling streams, slow first tokens, malformed events, dropped connections. Changeable while
//! the simulator runs (`SimHandle::set_faults`), so a test can make a backend flap.

use serde::Deserialize;

/// What goes wrong, and how often. The default is nothing.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Faults {
    /// Close each connection as soon as a request arrives, without answering.
    #[serde(default)]
    pub refuse: bool,
    /// Fraction of generation requests answered with `error_status` instead.
    #[serde(default)]
    pub error_rate: f64,
    /// Status used for injected errors (default 503).
    #[serde(default)]
    pub error_status: Option<u16>,
    /// Abort the connection after this many streamed chunks (no terminating chunk).
    #[serde(default)]
    pub die_after_chunks: Option<u32>,
    /// Stop sending after this many streamed chunks, keeping the connection open.
    #[serde(default)]
    pub stall_after_chunks: Option<u32>,
    /// Extra delay before the first token, in milliseconds.
    #[serde(default)]
    pub slow_first_token_ms: f64,
    /// Fraction of content events sent as malformed JSON.
    #[serde(default)]
    pub malformed_rate: f64,
    /// Every Nth request (by arrival: indices N−1, 2N−1…) waits `queue_hold_ms` more in the
    /// queue before it is admitted: a request starved by the scheduler.
    #[serde(default)]
    pub queue_hold_every: Option<u64>,
    /// How long those requests are held, in milliseconds.
    #[serde(default)]
    pub queue_hold_ms: f64,
}

impl Faults {
    /// How long request `index` is held in the queue.
    pub fn queue_hold(&self, index: u64) -> std::time::Duration {
        match self.queue_hold_every {
            Some(n) if n > 0 && index % n == n - 1 => {
                std::time::Duration::from_secs_f64(self.queue_hold_ms / 1000.0)
            }
            _ => std::time::Duration::ZERO,
        }
    }
}

impl Faults {
    /// Checks the values make sense.
    pub fn validate(&self) -> Result<(), super::InvalidProfile> {
        for (name, v) in [
            ("error_rate", self.error_rate),
            ("malformed_rate", self.malformed_rate),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(super::InvalidProfile(format!(
                    "{name} must be between 0 and 1"
                )));
            }
        }
        for (name, v) in [
            ("slow_first_token_ms", self.slow_first_token_ms),
            ("queue_hold_ms", self.queue_hold_ms),
        ] {
            if !v.is_finite() || v < 0.0 {
                return Err(super::InvalidProfile(format!(
                    "{name} must be finite and non-negative"
                )));
            }
        }
        if let Some(s) = self.error_status {
            if !(100..=599).contains(&s) {
                return Err(super::InvalidProfile(
                    "error_status must be an HTTP status".into(),
                ));
            }
        }
        Ok(())
    }
}
