//! Facts the HTTP server attaches to each request's extensions for the meter: the client's
//! address, whether the connection was cut for a stalled client, and when the connection tried to
//! write. A server that attaches none still gets every measurement but the write-side lag
//! (`handoff_lag`) and the `client_stalled` outcome.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::time::Instant;

/// The client's address, in every request's extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub SocketAddr);

/// In every request's extensions: set when the server closed the request's connection because
/// the client stopped taking response bytes (`ServerOptions::idle_timeout`, 5×), so a response
/// dropped by that close is recorded as `client_stalled`.
#[derive(Debug, Clone, Default)]
pub struct StalledCut(pub Arc<std::sync::atomic::AtomicBool>);

/// In every request's extensions: when the request's connection tried to write. A response
/// frame handed to the server is written by the connection's first write attempt after it (HTTP/1
/// writes in order; over h2 that attempt may carry other streams' frames first: a lower bound).
/// The meter times what the user feels by it — a gateway preempted between handing a frame on
/// and writing it is late by that much — and a record whose last frame is not yet written waits
/// for that attempt (`after_attempt`).
#[derive(Default)]
pub struct WriteClock {
    /// Write attempts so far (poll_write calls: written, or refused by a full socket).
    seq: AtomicU64,
    /// Attempt `n`'s instant (`clock::pack`) at `n % WRITE_RING`.
    at: [AtomicU64; WRITE_RING],
    /// Work waiting for an attempt: (its index, the work).
    waiting: parking_lot::Mutex<Vec<(u64, WhenWritten)>>,
    any_waiting: std::sync::atomic::AtomicBool,
    /// The connection is gone: no attempt will come.
    closed: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for WriteClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteClock")
            .field("seq", &self.seq)
            .field("waiting", &self.waiting.lock().len())
            .finish()
    }
}

/// Work run once a given write attempt happened, with its instant (`None`: the connection closed
/// first, or the instant is no longer kept).
pub type WhenWritten = Box<dyn FnOnce(Option<std::time::Instant>) + Send>;

/// Write attempts whose instants are kept.
const WRITE_RING: usize = 8;

impl WriteClock {
    /// The index the next write attempt will have.
    #[inline]
    pub fn next(&self) -> u64 {
        self.seq.load(Ordering::Acquire)
    }

    /// When attempt `n` happened: `None` before it has, or once eight later attempts overwrote it.
    pub fn attempt(&self, n: u64) -> Option<std::time::Instant> {
        let before = self.seq.load(Ordering::Acquire);
        if before <= n {
            return None;
        }
        let v = self.at[(n % WRITE_RING as u64) as usize].load(Ordering::Acquire);
        let after = self.seq.load(Ordering::Acquire);
        (after < n + WRITE_RING as u64)
            .then(|| crate::clock::unpack(v))
            .flatten()
    }

    /// Runs `f` with the instant of attempt `n` once it happened (at once if it has).
    pub(crate) fn after_attempt(&self, n: u64, f: WhenWritten) {
        if self.seq.load(Ordering::Acquire) > n || self.closed.load(Ordering::Acquire) {
            return f(self.attempt(n));
        }
        self.waiting.lock().push((n, f));
        self.any_waiting.store(true, Ordering::Release);
        // The attempt, or the close, may have come between the check and the push.
        let closed = self.closed.load(Ordering::Acquire);
        if closed || self.seq.load(Ordering::Acquire) > n {
            self.run_due(closed);
        }
    }

    /// One write attempt, now (the server calls it at each `poll_write`). One clock read and two stores; the waiting list only when
    /// something waits.
    #[inline]
    pub fn attempted(&self) {
        let n = self.seq.load(Ordering::Relaxed);
        let now = crate::clock::pack(std::time::Instant::now());
        self.at[(n % WRITE_RING as u64) as usize].store(now, Ordering::Release);
        self.seq.store(n + 1, Ordering::Release);
        if self.any_waiting.load(Ordering::Acquire) {
            self.run_due(false);
        }
    }

    /// The connection is gone: runs the work still waiting for a write attempt (there will be
    /// none). The server calls it when the connection ends.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.run_due(true);
    }

    /// Runs the waiting work whose attempt happened (all of it with `closed`).
    fn run_due(&self, closed: bool) {
        let seq = self.seq.load(Ordering::Acquire);
        let due: Vec<(u64, WhenWritten)> = {
            let mut waiting = self.waiting.lock();
            // Usually everything waiting is due (one response's record): taken whole.
            let due = if closed || waiting.iter().all(|(n, _)| *n < seq) {
                std::mem::take(&mut *waiting)
            } else {
                let (due, keep) = std::mem::take(&mut *waiting)
                    .into_iter()
                    .partition(|(n, _)| *n < seq);
                *waiting = keep;
                due
            };
            self.any_waiting
                .store(!waiting.is_empty(), Ordering::Release);
            due
        };
        for (n, f) in due {
            f(if n < seq { self.attempt(n) } else { None });
        }
    }
}

/// A request the HTTP layer refused before the service saw it (malformed or oversize head, a head
/// that did not arrive in time): no method, path or id is known.
#[derive(Debug, Clone, Copy)]
pub struct Refused {
    /// Who sent it.
    pub peer: SocketAddr,
    /// What hyper answered (400, 431), or 408 when the connection was closed waiting for a head.
    pub status: u16,
    /// Bounded kind: `bad_request_head`, `request_head_too_large`, `header_read_timeout`.
    pub kind: &'static str,
    /// When the connection was accepted.
    pub accepted: Instant,
}
