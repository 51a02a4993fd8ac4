//! Shadow traffic: a configured fraction of an experiment's requests is also sent to a shadow
//! variant. The client only ever sees the primary's bytes; the shadow response is read to the end
//! and measured (its records carry the variant label `NAME:shadow`) but discarded, under its own
//! concurrency budget (saturated → not sent, counted), so it can never slow or fail the primary.
//! When both answers of a pair are in, their texts are compared: exact match and ROUGE-L. A pair
//! is joined by an id both records carry (`RequestMeta::shadow_pair`).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Largest text compared per side (characters beyond are ignored).
pub const MAX_COMPARED: usize = 64 * 1024;

/// Pairs waiting for their second answer at most; beyond it new ones are not compared (counted).
const MAX_PENDING: usize = 4096;

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
    /// Pairs left uncompared because too many were waiting for their second answer.
    pub unpaired: AtomicU64,
    agreement: Mutex<Agreement>,
    next_pair: AtomicU64,
    /// First answers waiting for their pair's second: (is the copy, its text).
    pending: Mutex<HashMap<u64, (bool, Option<String>)>>,
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
            unpaired: AtomicU64::new(0),
            agreement: Mutex::new(Agreement::default()),
            next_pair: AtomicU64::new(1),
            pending: Mutex::new(HashMap::new()),
        }
    }

    /// Decides whether this request is shadowed; when it is, returns the budget slot (held by the
    /// copy until it ends) and the id joining the two answers.
    pub fn admit(&self) -> Option<(OwnedSemaphorePermit, u64)> {
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
                Some((p, self.next_pair.fetch_add(1, Ordering::Relaxed)))
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

    /// One answer of pair `pair` (`text` is `None` when that side failed or had no text): the
    /// second to arrive compares them.
    pub fn offer(&self, pair: u64, is_copy: bool, text: Option<String>) {
        let mut pending = self.pending.lock();
        match pending.remove(&pair) {
            Some((first_is_copy, first)) if first_is_copy != is_copy => {
                drop(pending);
                if let (Some(a), Some(b)) = (first, text) {
                    self.add(&a, &b);
                }
            }
            // The same side twice cannot happen; keep the newer.
            Some(_) | None if pending.len() < MAX_PENDING => {
                pending.insert(pair, (is_copy, text));
            }
            Some(_) | None => {
                self.unpaired.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Agreement so far.
    pub fn agreement(&self) -> Agreement {
        *self.agreement.lock()
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
        // Answers are joined by pair id, in either order.
        let (_, pair) = held.unwrap_or_else(|| panic!("admitted"));
        tight.offer(pair, true, Some("a b".into()));
        tight.offer(pair + 1, false, Some("x".into()));
        tight.offer(pair, false, Some("a b".into()));
        assert_eq!(tight.agreement().pairs, 1);
        assert_eq!(tight.agreement().exact, 1);
        assert_eq!(tight.dropped.load(Ordering::Relaxed), 1);
    }
}
