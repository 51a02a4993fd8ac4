//! Fair shares of a pool (request slots, connections) among the clients holding it: counted per
//! client, and under pressure a client that holds its share is refused one more.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A multiply-rotate hasher seeded at random per table: a lookup per request and its release
/// cost a few instructions instead of SipHash's ~140, and a client that cannot learn the seed
/// cannot aim its addresses at one bucket (the table holds at most the clients connected).
#[derive(Debug, Clone, Copy)]
struct Seeded(u64);

impl Default for Seeded {
    fn default() -> Self {
        // One SipHash of nothing under std's random keys: a random seed without a new dependency.
        Self(std::collections::hash_map::RandomState::new().hash_one(0u8) | 1)
    }
}

impl BuildHasher for Seeded {
    type Hasher = SeededHasher;
    fn build_hasher(&self) -> SeededHasher {
        SeededHasher(self.0)
    }
}

#[derive(Debug)]
struct SeededHasher(u64);

impl Hasher for SeededHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .rotate_left(29);
    }

    fn finish(&self) -> u64 {
        let x = self.0 ^ (self.0 >> 32);
        x.wrapping_mul(0xD6E8_FEB8_6659_FD93) ^ (x >> 29)
    }
}

/// How long a client refused for want of room counts as waiting.
pub const WAITING_FOR: Duration = Duration::from_secs(2);

/// Most waiting clients remembered (a flood of addresses cannot grow the table).
const MAX_WAITING: usize = 4096;

/// What each client holds of a pool, and which clients were lately refused for want of room
/// (they wait), for fair shares under pressure.
#[derive(Debug)]
pub struct Shares<K: Hash + Eq> {
    inner: parking_lot::Mutex<Inner<K>>,
}

#[derive(Debug)]
struct Inner<K> {
    /// Units held per client. A client that gives its last one back keeps its entry (at 0), so
    /// one request's admission and release update a count rather than insert and remove; entries
    /// at 0 are swept when they outnumber the holders.
    held: HashMap<K, u32, Seeded>,
    /// Clients holding at least one.
    holders: usize,
    waiting: HashMap<K, Instant, Seeded>,
}

impl<K: Hash + Eq> Default for Shares<K> {
    fn default() -> Self {
        Self {
            inner: parking_lot::Mutex::new(Inner {
                held: HashMap::default(),
                holders: 0,
                waiting: HashMap::default(),
            }),
        }
    }
}

impl<K: Hash + Eq> Inner<K> {
    fn held_by(&self, key: &K) -> u32 {
        self.held.get(key).copied().unwrap_or(0)
    }

    fn take(&mut self, key: K) {
        let n = self.held.entry(key).or_default();
        if *n == 0 {
            self.holders += 1;
        }
        *n += 1;
    }
}

/// One unit a client holds of a `Shares`; given back when dropped.
#[derive(Debug)]
pub struct ShareGuard<K: Hash + Eq + Clone> {
    shares: Arc<Shares<K>>,
    key: K,
}

impl<K: Hash + Eq + Clone> Drop for ShareGuard<K> {
    fn drop(&mut self) {
        let mut inner = self.shares.inner.lock();
        let Some(n) = inner.held.get_mut(&self.key) else {
            return;
        };
        *n = n.saturating_sub(1);
        if *n == 0 {
            inner.holders -= 1;
            if inner.held.len() > 2 * inner.holders + 64 {
                inner.held.retain(|_, n| *n > 0);
            }
        }
    }
}

impl<K: Hash + Eq + Clone> Shares<K> {
    /// One more unit for `key`, unless `pressured`, other clients wait (were refused for want of
    /// room within `WAITING_FOR`), and `key` already holds its fair share of `max`: `max` ÷ the
    /// clients holding any or waiting, `key` counted. A client alone, or among clients that all
    /// got in, may take every unit.
    pub fn admit(self: &Arc<Self>, key: K, max: usize, pressured: bool) -> Option<ShareGuard<K>> {
        let mut inner = self.inner.lock();
        let mine = inner.held_by(&key);
        if pressured && !inner.waiting.is_empty() {
            let now = Instant::now();
            inner
                .waiting
                .retain(|_, at| now.duration_since(*at) < WAITING_FOR);
            let others_waiting = inner.waiting.keys().filter(|k| **k != key).count();
            if others_waiting > 0 {
                let waiting_only = inner
                    .waiting
                    .keys()
                    .filter(|k| **k != key && inner.held_by(k) == 0)
                    .count();
                let clients = inner.holders + waiting_only + usize::from(mine == 0);
                let fair = (max / clients.max(1)).max(1);
                if mine as usize >= fair {
                    return None;
                }
            }
        }
        if !inner.waiting.is_empty() {
            inner.waiting.remove(&key);
        }
        inner.take(key.clone());
        Some(ShareGuard {
            shares: Arc::clone(self),
            key,
        })
    }

    /// One more unit for `key`, unless `pressured`, other clients hold some, and `key` holds its
    /// fair share among the holders (for connections: who waits in the kernel's backlog cannot
    /// be seen, but a client that got in keeps its connections).
    pub fn admit_among_holders(
        self: &Arc<Self>,
        key: K,
        max: usize,
        pressured: bool,
    ) -> Option<ShareGuard<K>> {
        let mut inner = self.inner.lock();
        let mine = inner.held_by(&key);
        let others = inner.holders - usize::from(mine > 0);
        if pressured && others > 0 {
            let fair = (max / (others + 1)).max(1);
            if mine as usize >= fair {
                return None;
            }
        }
        inner.take(key.clone());
        Some(ShareGuard {
            shares: Arc::clone(self),
            key,
        })
    }

    /// `key` was refused for want of room: it waits, and others' shares make room for it.
    pub fn waiting(&self, key: K) {
        let mut inner = self.inner.lock();
        let now = Instant::now();
        if inner.waiting.len() >= MAX_WAITING {
            inner
                .waiting
                .retain(|_, at| now.duration_since(*at) < WAITING_FOR);
        }
        if inner.waiting.len() < MAX_WAITING {
            inner.waiting.insert(key, now);
        }
    }

    /// Clients holding any.
    pub fn clients(&self) -> usize {
        self.inner.lock().holders
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn under_pressure_a_client_gets_its_fair_share_once_others_wait() {
        let s: Arc<Shares<u8>> = Arc::default();
        // No pressure: any number.
        let mut a: Vec<_> = (0..10).map(|_| s.admit(1, 10, false).unwrap()).collect();
        // Under pressure, alone, nobody waiting: more is fine (a load balancer's one address).
        a.push(s.admit(1, 10, true).unwrap());
        a.pop();
        // Client 2 was refused for want of room: it waits, so client 1 (10 of 10) gets no more.
        s.waiting(2);
        assert!(s.admit(1, 10, true).is_none());
        // The newcomer gets in (two clients: a share of 5 each; it holds none).
        let b = s.admit(2, 10, true).unwrap();
        // Nobody waits once it got in; client 1 may take more again.
        assert!(s.admit(1, 10, true).is_some());
        s.waiting(3);
        a.truncate(2);
        // Three clients now (one waiting): a share of 3; client 1 holds 2.
        assert!(s.admit(1, 10, true).is_some());
        drop(b);
        drop(a);
        assert_eq!(s.clients(), 0);
    }
}
