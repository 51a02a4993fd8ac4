//! `on_accept: promote`: a variant whose verdict is `accept` gets a growing share of the
//! experiment's traffic, step by step (`promote.steps`, each held `promote.hold`), for as long as
//! the verdict stays `accept`. The share is taken from the control's traffic, by the same sticky
//! hash that assigns variants, so a user moved to the variant at one step stays there at the
//! next. One variant is promoted at a time. A `reject` stops the ramp (the configured split
//! again); an `undecided` holds it where it is. A person's reset (`POST /experiments/reset`)
//! puts the configured split back and holds it until new evidence (a posted result).

use crate::config::PromoteConfig;
use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Where a promotion stands.
#[derive(Debug, Clone)]
struct Step {
    variant: Arc<str>,
    /// Into `steps`.
    index: usize,
    since: SystemTime,
}

#[derive(Debug, Default)]
struct State {
    step: Option<Step>,
    /// Put back by a person: not promoted again until new evidence.
    held: HashSet<Arc<str>>,
    promotions_total: u64,
}

/// One experiment's promotion.
#[derive(Debug)]
pub struct Promotion {
    steps: Vec<u32>,
    hold: Duration,
    control: Arc<str>,
    state: Mutex<State>,
}

/// What `/experiments` shows of a promotion.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PromotionView {
    /// The shares of the ramp, percent.
    pub steps: Vec<u32>,
    /// How long each is held, seconds.
    pub hold_s: f64,
    /// The variant promoted now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// Its share of the experiment's traffic now, percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<u32>,
    /// Since when (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// Variants a person put back, held until new evidence.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<String>,
    /// Steps taken since start.
    pub promotions_total: u64,
}

impl Promotion {
    /// The ramp of `cfg` for an experiment whose control is `control`.
    pub fn new(cfg: &PromoteConfig, control: &str) -> Self {
        Self {
            steps: cfg.steps.clone(),
            hold: cfg.hold,
            control: control.into(),
            state: Mutex::new(State::default()),
        }
    }

    /// The variant promoted now and its share of the traffic, percent.
    pub fn promoted(&self) -> Option<(Arc<str>, u32)> {
        let s = self.state.lock();
        let step = s.step.as_ref()?;
        Some((Arc::clone(&step.variant), self.steps[step.index]))
    }

    /// `variant`'s verdict is `accept` now, and `configured` is its share by weight (percent):
    /// the first step above it at once, the next once the current one has been held. Returns
    /// the new share when it changed.
    pub fn advance(&self, variant: &str, configured: f64) -> Option<u32> {
        if variant == self.control.as_ref() {
            return None;
        }
        let mut s = self.state.lock();
        if s.held.contains(variant) {
            return None;
        }
        let index = match &s.step {
            Some(step) if step.variant.as_ref() != variant => return None,
            Some(step) => {
                let held = step.since.elapsed().unwrap_or_default() >= self.hold;
                if !held || step.index + 1 >= self.steps.len() {
                    return None;
                }
                step.index + 1
            }
            None => self
                .steps
                .iter()
                .position(|share| f64::from(*share) > configured)?,
        };
        s.step = Some(Step {
            variant: Arc::from(variant),
            index,
            since: SystemTime::now(),
        });
        s.promotions_total += 1;
        let share = self.steps[index];
        tracing::warn!(variant = %variant, share, control = %self.control, "verdict accept: variant promoted");
        Some(share)
    }

    /// `variant`'s verdict is `reject` now: its ramp stops and the configured split is back.
    /// True when it was being promoted.
    pub fn stop(&self, variant: &str) -> bool {
        let mut s = self.state.lock();
        if s.step
            .as_ref()
            .is_some_and(|p| p.variant.as_ref() == variant)
        {
            s.step = None;
            tracing::warn!(variant = %variant, "verdict reject: promotion stopped, the configured split is back");
            return true;
        }
        false
    }

    /// A person put `variant` (every variant when `None`) back to the configured split: held
    /// there until new evidence. Returns the variant whose promotion was undone.
    pub fn reset(&self, variant: Option<&str>) -> Option<String> {
        let mut s = self.state.lock();
        let step = s
            .step
            .take_if(|p| variant.is_none_or(|v| p.variant.as_ref() == v))?;
        s.held.insert(Arc::clone(&step.variant));
        tracing::info!(variant = %step.variant, "promotion reset: the configured split is back");
        Some(step.variant.to_string())
    }

    /// Back to `share` of `variant` (as before a restart); the hold starts again.
    pub fn restore(&self, variant: &str, share: u32) {
        let Some(index) = self.steps.iter().rposition(|s| *s <= share) else {
            return;
        };
        self.state.lock().step = Some(Step {
            variant: Arc::from(variant),
            index,
            since: SystemTime::now(),
        });
    }

    /// Marks `variant` as put back by a person (as before a restart).
    pub fn hold(&self, variant: &str) {
        self.state.lock().held.insert(Arc::from(variant));
    }

    /// New evidence (a posted result): a variant a person put back may be promoted again.
    pub fn clear_holds(&self) {
        self.state.lock().held.clear();
    }

    /// The state, for `/experiments`.
    pub fn view(&self) -> PromotionView {
        let s = self.state.lock();
        let mut held: Vec<String> = s.held.iter().map(|v| v.to_string()).collect();
        held.sort();
        PromotionView {
            steps: self.steps.clone(),
            hold_s: self.hold.as_secs_f64(),
            variant: s.step.as_ref().map(|p| p.variant.to_string()),
            share: s.step.as_ref().map(|p| self.steps[p.index]),
            since: s.step.as_ref().map(|p| crate::util::time::rfc3339(p.since)),
            held,
            promotions_total: s.promotions_total,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(hold: Duration) -> Promotion {
        Promotion::new(
            &PromoteConfig {
                steps: vec![25, 50, 100],
                hold,
            },
            "fp16",
        )
    }

    #[test]
    fn steps_are_taken_one_at_a_time_after_each_hold() {
        let p = ramp(Duration::from_secs(3600));
        assert_eq!(p.advance("fp16", 50.0), None, "never the control");
        // Configured at 30%: the first step above it.
        assert_eq!(p.advance("int8", 30.0), Some(50));
        assert_eq!(p.advance("int8", 30.0), None, "held for an hour");
        assert_eq!(p.advance("int4", 30.0), None, "one variant at a time");
        let p = ramp(Duration::ZERO);
        assert_eq!(p.advance("int8", 10.0), Some(25));
        assert_eq!(p.advance("int8", 10.0), Some(50));
        assert_eq!(p.advance("int8", 10.0), Some(100));
        assert_eq!(p.advance("int8", 10.0), None, "the end of the ramp");
        assert_eq!(p.view().promotions_total, 3);
    }

    #[test]
    fn a_reject_stops_it_and_a_reset_holds_it_until_new_evidence() {
        let p = ramp(Duration::ZERO);
        p.advance("int8", 10.0);
        assert!(p.stop("int8"));
        assert_eq!(p.promoted(), None);
        p.advance("int8", 10.0);
        assert_eq!(p.reset(Some("int8")).as_deref(), Some("int8"));
        assert_eq!(p.advance("int8", 10.0), None, "held");
        assert_eq!(p.view().held, ["int8"]);
        p.clear_holds();
        assert_eq!(p.advance("int8", 10.0), Some(25));
        p.restore("int8", 60);
        assert_eq!(p.promoted().map(|x| x.1), Some(50), "the step at or below");
    }
}
