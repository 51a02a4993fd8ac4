//! HTTP/2 upstream connections: multiplexed, shared by the requests to one backend, each driven by
//! a task of its own. (A connection carries many streams, so no one response body can drive it as
//! an HTTP/1 body drives its connection: each chunk crosses from the connection's task to the
//! task forwarding it. docs/perf-log/ measures what that costs.)
//!
//! A connection takes streams up to the backend's `SETTINGS_MAX_CONCURRENT_STREAMS` (100 until
//! the backend says otherwise), and at most `MAX_STREAMS`; past that a new connection opens, so no
//! request waits inside a connection for a free stream (that wait would be counted as the
//! backend's TTFT). Opening is shared: requests that find no connection with room wait for the
//! one being opened instead of each opening their own, and all of them get its failure.
//! Connections idle past the idle timeout, or closed by the backend, leave the pool at the next
//! sweep; pings every `PING_EVERY` while streams are open close a connection whose backend
//! stopped answering, failing its streams rather than leaving them hanging.

use super::{Key, UpstreamRequestBody};
use crate::tls::Stream;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OnceCell;
use tokio::time::Instant;

/// Streams one connection carries at most, whatever the backend allows.
pub(super) const MAX_STREAMS: usize = 100;

/// Ping interval while streams are open; a ping unanswered for `PING_TIMEOUT` closes the
/// connection.
const PING_EVERY: Duration = Duration::from_secs(30);
const PING_TIMEOUT: Duration = Duration::from_secs(20);

/// One HTTP/2 connection in the pool.
pub(super) struct Conn {
    sender: http2::SendRequest<UpstreamRequestBody>,
    /// Streams open on it now.
    open: AtomicUsize,
    /// The backend's stream limit as the connection last saw it (its SETTINGS).
    limit: Arc<AtomicUsize>,
    /// Since when no stream has been open.
    idle_since: Mutex<Instant>,
    /// The socket's latest kernel receive stamp.
    pub rx: Arc<AtomicU64>,
    key: Key,
}

impl Conn {
    fn room(&self) -> bool {
        let limit = self.limit.load(Relaxed).min(MAX_STREAMS);
        self.open.load(Relaxed) < limit && !self.sender.is_closed()
    }
}

/// One stream's hold on its connection, released when dropped.
pub(super) struct Slot(Arc<Conn>);

impl Slot {
    /// A sender for this stream's request.
    pub(super) fn sender(&self) -> http2::SendRequest<UpstreamRequestBody> {
        self.0.sender.clone()
    }

    /// The connection's latest kernel receive stamp.
    pub(super) fn rx(&self) -> &Arc<AtomicU64> {
        &self.0.rx
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.0.open.fetch_sub(1, Relaxed) == 1 {
            *self.0.idle_since.lock() = Instant::now();
        }
    }
}

/// Why opening a connection failed, kept for every request that waited on it.
pub(super) type DialError = (std::io::ErrorKind, String);

/// What opening a connection gave: an HTTP/2 connection (pooled), or the backend chose HTTP/1.1
/// by ALPN (the caller pooled that connection as HTTP/1).
pub(super) type Dialed = Result<bool, DialError>;

type Dial = Arc<OnceCell<Dialed>>;

/// The HTTP/2 connections, per authority and TLS configuration.
#[derive(Default)]
pub(super) struct Pool {
    conns: Mutex<HashMap<Key, Vec<Arc<Conn>>>>,
    dialing: Mutex<HashMap<Key, Dial>>,
}

impl Pool {
    /// A stream on a pooled connection with room, if there is one (the fullest such: streams
    /// gather on few connections, and the others go idle and close).
    pub(super) fn take(&self, key: &Key) -> Option<Slot> {
        let mut conns = self.conns.lock();
        let list = conns.get_mut(key)?;
        list.retain(|c| !c.sender.is_closed());
        let conn = list
            .iter()
            .filter(|c| c.room())
            .max_by_key(|c| c.open.load(Relaxed))?;
        conn.open.fetch_add(1, Relaxed);
        Some(Slot(Arc::clone(conn)))
    }

    /// Whether a pooled connection to `key` has room for a stream now.
    fn room(&self, key: &Key) -> bool {
        self.conns
            .lock()
            .get(key)
            .is_some_and(|l| l.iter().any(|c| c.room()))
    }

    /// Whether an open connection to `key` allows streams at all (full or not).
    pub(super) fn usable(&self, key: &Key) -> bool {
        self.conns.lock().get(key).is_some_and(|l| {
            l.iter()
                .any(|c| !c.sender.is_closed() && c.limit.load(Relaxed) > 0)
        })
    }

    /// Takes a connection out of the pool (it gave a request back: it is closing).
    pub(super) fn retire(&self, slot: &Slot) {
        if let Some(list) = self.conns.lock().get_mut(&slot.0.key) {
            list.retain(|c| !Arc::ptr_eq(c, &slot.0));
        }
    }

    /// Opens a connection with `open` — or waits for the one being opened for `key` — and
    /// pools it when it is HTTP/2.
    pub(super) async fn dial<F>(&self, key: &Key, open: F) -> Dialed
    where
        F: Future<Output = Result<Option<Conn>, DialError>>,
    {
        let cell = Arc::clone(self.dialing.lock().entry(key.clone()).or_default());
        let dialed = cell
            .get_or_init(|| async {
                // A dial that ended between the caller's `take` and this call has pooled a
                // connection with room (its cell is gone, so this one is new): use it rather than
                // open a second.
                if self.room(key) {
                    return Ok(true);
                }
                let conn = open.await?;
                let h2 = conn.is_some();
                if let Some(c) = conn {
                    self.conns
                        .lock()
                        .entry(key.clone())
                        .or_default()
                        .push(Arc::new(c));
                }
                Ok(h2)
            })
            .await
            .clone();
        let mut dialing = self.dialing.lock();
        if dialing.get(key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
            dialing.remove(key);
        }
        dialed
    }

    /// The backend's stream limit as its connections last saw it (`MAX_STREAMS` before any):
    /// a new connection starts from it, not from the protocol's default, until the backend's
    /// SETTINGS arrive on it.
    pub(super) fn known_limit(&self, key: &Key) -> usize {
        self.conns
            .lock()
            .get(key)
            .and_then(|l| l.iter().map(|c| c.limit.load(Relaxed)).min())
            .unwrap_or(MAX_STREAMS)
            .min(MAX_STREAMS)
    }

    /// Drops connections closed by the backend or idle for `idle_timeout`.
    pub(super) fn sweep(&self, idle_timeout: Duration) {
        let mut conns = self.conns.lock();
        for list in conns.values_mut() {
            list.retain(|c| {
                !c.sender.is_closed()
                    && (c.open.load(Relaxed) > 0 || c.idle_since.lock().elapsed() < idle_timeout)
            });
        }
        conns.retain(|_, list| !list.is_empty());
    }

    /// Connections pooled now.
    pub(super) fn len(&self) -> usize {
        self.conns.lock().values().map(Vec::len).sum()
    }
}

/// The HTTP/2 handshake on `stream`, sending at most `streams` at once until the backend's
/// SETTINGS say otherwise; the connection runs on a task of its own from here on.
pub(super) async fn handshake(stream: Stream, key: Key, streams: usize) -> Result<Conn, DialError> {
    let rx = stream.rx_cell();
    let (sender, conn) = http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .initial_max_send_streams(streams)
        .keep_alive_interval(PING_EVERY)
        .keep_alive_timeout(PING_TIMEOUT)
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|e| (std::io::ErrorKind::Other, format!("HTTP/2 handshake: {e}")))?;
    let limit = Arc::new(AtomicUsize::new(streams));
    let seen = Arc::clone(&limit);
    tokio::spawn(async move {
        let mut conn = conn;
        // The backend's SETTINGS may lower (or raise) its stream limit at any time.
        let _ = std::future::poll_fn(|cx| {
            let done = Pin::new(&mut conn).poll(cx);
            seen.store(conn.current_max_send_streams(), Relaxed);
            done
        })
        .await;
    });
    Ok(Conn {
        sender,
        open: AtomicUsize::new(0),
        limit,
        idle_since: Mutex::new(Instant::now()),
        rx,
        key,
    })
}
