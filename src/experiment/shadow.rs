//! Shadow traffic: a configured fraction of an experiment's requests is also sent to a shadow
//! variant. The client only ever sees the primary's bytes; the shadow response is read to the end
//! and measured (its records carry the variant label `NAME:shadow`) but discarded, under its own
//! concurrency budget (saturated → not sent, counted), so it can never slow or fail the primary.
//! When both answers of a pair are in, their texts are compared: exact match and ROUGE-L.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Largest text compared per side (characters beyond are ignored).
pub const MAX_COMPARED: usize = 64 * 1024;

/// A route's shadow policy and counters.
#[derive(Debug)]
pub struct Shadow {
    /// Shadow variant (its pool receives the copies).
    pub variant: Arc<str>,
    /// Its index in the split.
    pub variant_index: usize,
    /// Label of shadow records: `variant:shadow`.
    pub label: Arc<str>,
    fraction: f64,
    permits: Arc<Semaphore>,
    counter: AtomicU64,
    salt: u64,
    /// Copies not sent because the shadow budget was exhausted.
    pub dropped: AtomicU64,
    /// Copies sent.
    pub sent: AtomicU64,
    agreement: Mutex<Agreement>,
}

/// Output agreement between primary and shadow answers.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Agreement {
    /// Pairs compared.
    pub pairs: u64,
    /// Pairs with identical text.
    pub exact: u64,
    /// Sum of ROUGE-L F1 over pairs.
    pub rouge_l_sum: f64,
}

impl Shadow {
    /// A shadow policy sending `fraction` of requests to `variant`, at most `max_concurrency` at once.
    pub fn new(
        variant: &str,
        variant_index: usize,
        fraction: f64,
        max_concurrency: usize,
        salt: u64,
    ) -> Self {
        Self {
            variant: variant.into(),
            variant_index,
            label: format!("{variant}:shadow").into(),
            fraction,
            permits: Arc::new(Semaphore::new(max_concurrency)),
            counter: AtomicU64::new(0),
            salt,
            dropped: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            agreement: Mutex::new(Agreement::default()),
        }
    }

    /// Decides whether this request is shadowed; returns the budget slot when it is.
    pub fn admit(&self) -> Option<OwnedSemaphorePermit> {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let draw = crate::util::stable_hash(
            &(self.salt ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)).to_le_bytes(),
        );
        if (draw as f64 / u64::MAX as f64) >= self.fraction {
            return None;
        }
        match Arc::clone(&self.permits).try_acquire_owned() {
            Ok(p) => {
                self.sent.fetch_add(1, Ordering::Relaxed);
                Some(p)
            }
            Err(_) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    fn add(&self, a: &str, b: &str) {
        let mut g = self.agreement.lock();
        g.pairs += 1;
        g.exact += u64::from(a == b);
        g.rouge_l_sum += rouge_l(a, b);
    }

    /// Agreement so far.
    pub fn agreement(&self) -> Agreement {
        *self.agreement.lock()
    }
}

/// One side of a pair: not arrived yet (`None`), or arrived with its text if it had one.
type Side = Option<Option<String>>;

/// Joins a primary answer with its shadow's; the second to arrive compares them.
#[derive(Debug)]
pub struct Pair {
    shadow: Arc<Shadow>,
    slots: Mutex<(Side, Side)>,
}

impl Pair {
    /// A pair for one shadowed request.
    pub fn new(shadow: Arc<Shadow>) -> Arc<Self> {
        Arc::new(Self {
            shadow,
            slots: Mutex::new((None, None)),
        })
    }

    /// Offers one side's text (`None`: that side failed or had no text).
    pub fn offer(&self, is_shadow: bool, text: Option<String>) {
        let mut s = self.slots.lock();
        if is_shadow {
            s.1 = Some(text);
        } else {
            s.0 = Some(text);
        }
        if let (Some(Some(a)), Some(Some(b))) = (&s.0, &s.1) {
            self.shadow.add(a, b);
        }
    }
}

/// ROUGE-L F1 over whitespace tokens (longest common subsequence), 1.0 for two empty texts.
pub fn rouge_l(a: &str, b: &str) -> f64 {
    let x: Vec<&str> = a.split_whitespace().take(2048).collect();
    let y: Vec<&str> = b.split_whitespace().take(2048).collect();
    if x.is_empty() && y.is_empty() {
        return 1.0;
    }
    if x.is_empty() || y.is_empty() {
        return 0.0;
    }
    let mut prev = vec![0u32; y.len() + 1];
    let mut cur = vec![0u32; y.len() + 1];
    for xi in &x {
        for (j, yj) in y.iter().enumerate() {
            cur[j + 1] = if xi == yj {
                prev[j] + 1
            } else {
                cur[j].max(prev[j + 1])
            };
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    let lcs = f64::from(prev[y.len()]);
    let (p, r) = (lcs / y.len() as f64, lcs / x.len() as f64);
    if p + r == 0.0 {
        0.0
    } else {
        2.0 * p * r / (p + r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rouge_l_on_known_pairs() {
        assert_eq!(rouge_l("the cat sat", "the cat sat"), 1.0);
        assert_eq!(rouge_l("a b c d", "x y z"), 0.0);
        // LCS("a b c d", "a c d e") = 3: P = R = 3/4.
        assert!((rouge_l("a b c d", "a c d e") - 0.75).abs() < 1e-12);
    }

    #[test]
    fn fraction_and_budget() {
        let s = Shadow::new("int8", 1, 0.5, 1000, 7);
        let sent = (0..10_000).filter(|_| s.admit().is_some()).count();
        assert!((4700..=5300).contains(&sent), "{sent}");
        let tight = Shadow::new("int8", 1, 1.0, 1, 7);
        let held = tight.admit();
        assert!(held.is_some() && tight.admit().is_none());
        assert_eq!(tight.dropped.load(Ordering::Relaxed), 1);
    }
}
