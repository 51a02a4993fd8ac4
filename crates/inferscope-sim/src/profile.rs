//! The simulator's timing model and its named profiles.
//!
//! TTFT = `ttft_base + prefill_per_token × prompt_tokens`; each decode step takes
//! `tpot × (1 + batch_slowdown × (active_streams − 1))`, times a uniform jitter factor in
//! `[1 − jitter, 1 + jitter]`. Output length is `max_tokens` when given, otherwise uniform in
//! `[min_output_tokens, max_output_tokens]`. Everything random comes from a seeded generator.

use serde::Deserialize;
use std::time::Duration;

/// A simulator profile's values do not make sense (the message says which).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidProfile(pub String);

/// A simulated backend's behaviour.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Profile name (reported as the served model's `owned_by`).
    pub name: String,
    /// Fixed part of the time to first token, in milliseconds.
    pub ttft_base_ms: f64,
    /// Prefill cost per prompt token, in milliseconds.
    #[serde(default)]
    pub prefill_per_token_ms: f64,
    /// Decode time per output token with one active stream, in milliseconds.
    pub tpot_ms: f64,
    /// Relative jitter of every wait (0 = exact timing).
    #[serde(default)]
    pub jitter: f64,
    /// Fractional decode slowdown per additional concurrent stream (batching).
    #[serde(default)]
    pub batch_slowdown: f64,
    /// Output tokens carried by each content chunk.
    #[serde(default = "one")]
    pub tokens_per_chunk: u32,
    /// Output length bounds when the request gives no `max_tokens`.
    #[serde(default = "min_out")]
    pub min_output_tokens: u32,
    /// See `min_output_tokens`.
    #[serde(default = "max_out")]
    pub max_output_tokens: u32,
    /// Send a role-only first chunk as soon as the request arrives (like vLLM's first delta).
    #[serde(default = "yes")]
    pub role_chunk: bool,
    /// Fraction of quiz questions (see `quiz`) answered wrong: the quality cost of a variant.
    #[serde(default)]
    pub answer_error_rate: f64,
    /// Nats added to every prompt token's surprisal (`logprob`): perplexity × e^shift, the other
    /// quality cost of a variant.
    #[serde(default)]
    pub nll_shift: f64,
    /// Tokens its KV cache holds: `/metrics` reports the tokens of the streams in flight (prompt
    /// and output so far) over this as `vllm:kv_cache_usage_perc`.
    #[serde(default = "kv_capacity")]
    pub kv_capacity_tokens: u64,
    /// Requests generated at once (the engine's batch); more wait in a queue before their
    /// prefill starts (`vllm:num_requests_waiting`). Absent: no limit.
    #[serde(default)]
    pub max_batch: Option<u32>,
    /// Injected faults (none by default).
    #[serde(default)]
    pub faults: super::Faults,
}

fn one() -> u32 {
    1
}
fn min_out() -> u32 {
    32
}
fn max_out() -> u32 {
    96
}
fn yes() -> bool {
    true
}
fn kv_capacity() -> u64 {
    65_536
}

impl Profile {
    /// FP16-like: the baseline.
    pub fn fp16() -> Self {
        Self {
            name: "fp16".into(),
            ttft_base_ms: 40.0,
            prefill_per_token_ms: 0.05,
            tpot_ms: 20.0,
            jitter: 0.1,
            batch_slowdown: 0.004,
            tokens_per_chunk: 1,
            min_output_tokens: 32,
            max_output_tokens: 96,
            role_chunk: true,
            answer_error_rate: 0.01,
            nll_shift: 0.0,
            kv_capacity_tokens: kv_capacity(),
            max_batch: None,
            faults: super::Faults::default(),
        }
    }

    /// INT8-like: faster prefill and decode than `fp16`.
    pub fn int8() -> Self {
        Self {
            name: "int8".into(),
            ttft_base_ms: 30.0,
            prefill_per_token_ms: 0.035,
            tpot_ms: 13.0,
            answer_error_rate: 0.04,
            nll_shift: 0.03,
            kv_capacity_tokens: kv_capacity(),
            max_batch: None,
            ..Self::fp16()
        }
    }

    /// A built-in profile by name.
    pub fn named(name: &str) -> Option<Self> {
        match name {
            "fp16" => Some(Self::fp16()),
            "int8" => Some(Self::int8()),
            _ => None,
        }
    }

    /// Time to first token for a prompt of `prompt_tokens`, before jitter.
    pub fn ttft(&self, prompt_tokens: u64) -> Duration {
        ms(self.ttft_base_ms + self.prefill_per_token_ms * prompt_tokens as f64)
    }

    /// One decode step with `active` concurrent streams, before jitter.
    pub fn decode_step(&self, active: usize) -> Duration {
        let slow = 1.0 + self.batch_slowdown * (active.saturating_sub(1)) as f64;
        ms(self.tpot_ms * slow)
    }

    /// Checks the values make sense.
    pub fn validate(&self) -> Result<(), InvalidProfile> {
        let finite = [
            self.ttft_base_ms,
            self.prefill_per_token_ms,
            self.tpot_ms,
            self.jitter,
            self.batch_slowdown,
        ];
        if finite.iter().any(|v| !v.is_finite() || *v < 0.0) {
            return Err(InvalidProfile(
                "timing values must be finite and non-negative".into(),
            ));
        }
        if self.jitter >= 1.0 {
            return Err(InvalidProfile("jitter must be below 1".into()));
        }
        if !(0.0..=1.0).contains(&self.answer_error_rate) {
            return Err(InvalidProfile(
                "answer_error_rate must be between 0 and 1".into(),
            ));
        }
        if !self.nll_shift.is_finite() {
            return Err(InvalidProfile("nll_shift must be finite".into()));
        }
        if self.tokens_per_chunk == 0 {
            return Err(InvalidProfile("tokens_per_chunk must be at least 1".into()));
        }
        if self.min_output_tokens == 0 || self.min_output_tokens > self.max_output_tokens {
            return Err(InvalidProfile(
                "need 1 <= min_output_tokens <= max_output_tokens".into(),
            ));
        }
        self.faults.validate()
    }
}

fn ms(v: f64) -> Duration {
    Duration::from_secs_f64(v.max(0.0) / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int8_is_faster_and_batching_slows_decode() {
        let (f, i) = (Profile::fp16(), Profile::int8());
        assert!(i.ttft(100) < f.ttft(100));
        assert!(i.decode_step(1) < f.decode_step(1));
        assert!(f.decode_step(65) > f.decode_step(1));
        assert_eq!(f.ttft(0), Duration::from_millis(40));
    }
}
