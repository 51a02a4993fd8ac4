//! Request, trace and span ids.
//!
//! Ids are drawn from a keyed pseudo-random function of a counter: SipHash under keys the
//! standard library draws from the operating system's randomness (`RandomState`). Within a
//! process every id is distinct (distinct counter values under one key); across processes the keys
//! differ; and one id tells nothing about any other — unlike `prefix-counter` ids, where one id
//! reveals every other request's.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Process-wide id source.
#[derive(Debug)]
pub struct Ids {
    keys: [RandomState; 2],
    counter: AtomicU64,
}

impl Default for Ids {
    fn default() -> Self {
        Self {
            keys: [RandomState::new(), RandomState::new()],
            counter: AtomicU64::new(0),
        }
    }
}

impl Ids {
    fn draw(&self, key: usize, n: u64) -> u64 {
        let mut h = self.keys[key].build_hasher();
        h.write_u64(n);
        h.finish()
    }

    fn next(&self) -> u64 {
        self.counter.fetch_add(1, Ordering::Relaxed)
    }

    /// A new request id: 32 hex digits (128 bits).
    pub fn request_id(&self) -> Arc<str> {
        let n = self.next();
        let v = u128::from(self.draw(0, n)) << 64 | u128::from(self.draw(1, n));
        hex_str(&hex::<32>(v))
    }

    /// A new non-zero 64-bit id for traces and spans.
    pub fn span_id(&self) -> u64 {
        self.draw(0, self.next()) | 1
    }
}

/// The low `4 N` bits of `v` as `N` lowercase hex digits (at most 32), most significant first.
pub fn hex<const N: usize>(v: u128) -> [u8; N] {
    const { assert!(N <= 32, "a u128 has 32 hex digits") };
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; N];
    for (i, d) in out.iter_mut().enumerate() {
        *d = DIGITS[((v >> (4 * (N - 1 - i))) & 0xf) as usize];
    }
    out
}

/// Hex digits as a string.
pub(crate) fn hex_str(digits: &[u8]) -> Arc<str> {
    // Hex digits are ASCII.
    Arc::from(std::str::from_utf8(digits).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn ids_are_distinct_non_zero_and_unrelated_across_sources() {
        let ids = Ids::default();
        let spans: HashSet<u64> = (0..1000).map(|_| ids.span_id()).collect();
        assert_eq!(spans.len(), 1000);
        assert!(!spans.contains(&0));
        let a: HashSet<Arc<str>> = (0..1000).map(|_| ids.request_id()).collect();
        assert_eq!(a.len(), 1000);
        assert!(a.iter().all(|id| id.len() == 32));
        // Another source (another process, in effect) shares no ids, and consecutive ids share
        // no prefix that would reveal a sequence.
        let other = Ids::default();
        assert!((0..1000).all(|_| !a.contains(&other.request_id())));
        let (x, y) = (ids.request_id(), ids.request_id());
        assert_ne!(x[..8], y[..8]);
    }

    #[test]
    fn hex_digits_are_what_format_writes() {
        let mut rng = crate::util::Rng::new(3);
        for _ in 0..1000 {
            let v = u128::from(rng.next_u64()) << 64 | u128::from(rng.next_u64());
            let v = v >> (rng.next_u64() % 128);
            assert_eq!(&*hex_str(&hex::<32>(v)), format!("{v:032x}"));
            assert_eq!(&*hex_str(&hex::<16>(v)), format!("{:016x}", v as u64));
            assert_eq!(&*hex_str(&hex::<2>(v)), format!("{:02x}", v as u8));
        }
    }
}
