//! The upstream client: HTTP/1.1 keep-alive connections pooled per backend authority, each one
//! driven by the task that uses it rather than by a task of its own; and, for backends with
//! `http2: true`, multiplexed HTTP/2 connections (`h2`).
//!
//! Why not hyper-util's pooled client for HTTP/1: it runs every connection as a separate task that
//! hands the response body over a one-slot channel, one decoded chunk at a time. The task
//! forwarding to the client then wakes once per chunk and, finding the channel empty again,
//! flushes after every chunk: when a backend writes chunks back to back (a burst after a stall,
//! speculative decoding, a fast small model), one upstream read of 64 chunks became 64 downstream
//! writes, twice the CPU per request of nginx (BENCHMARKS.md, "End-to-end"). Here the response
//! body polls its own connection, so every chunk already in the read buffer is decoded and handed
//! to the server connection in the same turn, and the server writes them together — without
//! holding any chunk back: a chunk that arrives alone is written alone, at once. It also saves the
//! task switch per chunk between the two tasks.
//!
//! Pool behaviour: an idle connection is checked when it is taken (closed by the backend, expired,
//! not ready: dropped) and by a sweep every few seconds, so connections closed by the backend do not
//! linger. A request that the backend never saw because its pooled connection had just closed is
//! sent again on a new connection. The same holds for HTTP/2 connections (`h2`), which a backend
//! closes with GOAWAY.
//!
//! HTTP/2 is spoken with prior knowledge over `http://` (h2c) and offered by ALPN over `https://`;
//! a TLS backend that picks HTTP/1.1 gets HTTP/1.1 from then on.

mod h2;

use crate::tls::{ClientTls, Stream};
use bytes::Bytes;
use http::uri::{Authority, PathAndQuery};
use http::{header, HeaderValue, Request, Response, Uri, Version};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, Connection, SendRequest};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::time::Instant;

/// Body sent upstream. The streamed kind is boxed: hyper's HTTP/1.1 client queues requests in
/// a channel whose first block (32 requests) every connection allocates when it opens, so each
/// byte of this type costs 32 per upstream connection (with the streamed body inline: 11.8 KB a
/// connection, the largest single allocation of an open stream).
pub type UpstreamRequestBody =
    http_body_util::Either<http_body_util::Full<Bytes>, Box<super::body::PacedBody<Incoming>>>;

type Conn = Connection<TokioIo<Stream>, UpstreamRequestBody>;

/// Connections are pooled per authority and TLS configuration (one backend's client
/// certificate or CA is not another's).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    authority: Authority,
    tls: usize,
}

/// Why an upstream request failed before a response head arrived.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// No connection could be made (refused, unreachable, DNS, connect timeout).
    #[error("connect: {0}")]
    Connect(std::io::Error),
    /// The connection failed while sending the request or waiting for the response head.
    #[error(transparent)]
    Http(#[from] hyper::Error),
    /// The request URI has no authority, names a scheme other than `http` or `https`, or `https`
    /// without a TLS configuration.
    #[error("upstream URI needs http://host[:port] or https://host[:port] with TLS")]
    BadUri,
}

impl UpstreamError {
    /// The backend could not be reached at all.
    pub fn is_connect(&self) -> bool {
        matches!(self, UpstreamError::Connect(_))
    }
}

struct Idle {
    sender: SendRequest<UpstreamRequestBody>,
    conn: Conn,
    since: Instant,
    rx: Arc<AtomicU64>,
}

/// A live connection checked out of the pool (or new).
struct Driver {
    sender: SendRequest<UpstreamRequestBody>,
    /// `None` once the connection future finished (closed or failed).
    conn: Option<Conn>,
    key: Key,
    pool: Weak<Pool>,
    /// The socket's latest kernel receive stamp.
    rx: Arc<AtomicU64>,
}

impl Driver {
    /// Drives the connection's I/O; notes when it has finished.
    fn poll_conn(&mut self, cx: &mut Context<'_>) {
        if let Some(conn) = self.conn.as_mut() {
            if Pin::new(conn).poll(cx).is_ready() {
                self.conn = None;
            }
        }
    }
}

#[derive(Default)]
struct Pool {
    idle: Mutex<HashMap<Key, Vec<Idle>>>,
    h2: h2::Pool,
    /// TLS backends asked for HTTP/2 that chose HTTP/1.1 by ALPN.
    h1_only: Mutex<HashSet<Key>>,
}

impl Pool {
    fn lock(&self) -> parking_lot::MutexGuard<'_, HashMap<Key, Vec<Idle>>> {
        self.idle.lock()
    }
}

/// Polls an idle connection once without a waker: lets it read a close from the backend and
/// become ready for the next request. `false`: it is of no further use.
fn still_usable(idle: &mut Idle, idle_timeout: Duration) -> bool {
    if idle.since.elapsed() >= idle_timeout {
        return false;
    }
    let mut cx = Context::from_waker(Waker::noop());
    if Pin::new(&mut idle.conn).poll(&mut cx).is_ready() {
        return false;
    }
    !idle.sender.is_closed()
}

/// The pooled upstream client. Cheap to clone; clones share the pool.
#[derive(Clone)]
pub struct UpstreamClient {
    pool: Arc<Pool>,
    connect_timeout: Duration,
    idle_timeout: Duration,
    /// Read with kernel receive stamps (forward lag, upstream TTFT without the gateway's wait).
    stamps: bool,
}

impl std::fmt::Debug for UpstreamClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let idle: usize = self.pool.lock().values().map(Vec::len).sum();
        f.debug_struct("UpstreamClient")
            .field("idle_connections", &idle)
            .field("h2_connections", &self.pool.h2.len())
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

impl UpstreamClient {
    /// A client; idle connections are closed after `idle_timeout`. Must be created inside a Tokio
    /// runtime (it starts the idle sweep).
    pub fn new(connect_timeout: Duration, idle_timeout: Duration) -> Self {
        let pool = Arc::new(Pool::default());
        tokio::spawn(sweep(Arc::downgrade(&pool), idle_timeout));
        Self {
            pool,
            connect_timeout,
            idle_timeout,
            stamps: true,
        }
    }

    /// Reads with kernel receive stamps or not (`limits.kernel_clock`).
    pub fn with_stamps(mut self, stamps: bool) -> Self {
        self.stamps = stamps;
        self
    }

    /// Sends `req` (absolute `http://` URI, or `https://` with `tls`) and waits for the response
    /// head, over HTTP/2 when `http2` (see the module's notes), else HTTP/1.1. The response body
    /// drives an HTTP/1 connection; read to its end, the connection goes back to the pool.
    pub async fn request(
        &self,
        mut req: Request<UpstreamRequestBody>,
        tls: Option<&Arc<ClientTls>>,
        http2: bool,
    ) -> Result<Response<UpstreamResponseBody>, UpstreamError> {
        let uri = req.uri().clone();
        match (uri.scheme_str(), tls) {
            (Some("http") | None, None) | (Some("https"), Some(_)) => {}
            _ => return Err(UpstreamError::BadUri),
        }
        let authority = uri.authority().cloned().ok_or(UpstreamError::BadUri)?;
        let key = Key {
            tls: tls.map_or(0, |t| Arc::as_ptr(t) as usize),
            authority,
        };
        if http2 && !self.pool.h1_only.lock().contains(&key) {
            req = match self.request_h2(req, &key, tls).await {
                Ok(resp) => return resp,
                Err(back) => back,
            };
        }
        // Origin form on the wire, and the Host header the absolute URI implied.
        let pq = uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        *req.uri_mut() = Uri::from(pq);
        *req.version_mut() = Version::HTTP_11;
        if !req.headers().contains_key(header::HOST) {
            if let Ok(v) = HeaderValue::from_str(key.authority.as_str()) {
                req.headers_mut().insert(header::HOST, v);
            }
        }
        loop {
            let (mut driver, reused) = match self.checkout(&key) {
                Some(d) => (d, true),
                None => (self.connect(&key, tls).await?, false),
            };
            let sent = driver.sender.try_send_request(req);
            tokio::pin!(sent);
            let head = std::future::poll_fn(|cx| {
                driver.poll_conn(cx);
                sent.as_mut().poll(cx)
            })
            .await;
            match head {
                Ok(resp) => {
                    return Ok(resp.map(|incoming| UpstreamResponseBody {
                        incoming,
                        link: Some(Link::H1(driver)),
                    }))
                }
                // A pooled connection that closed before it took the request: the backend never
                // saw it, so it goes again on another connection (pooled or new).
                Err(mut e) if reused => match e.take_message() {
                    Some(back) => req = back,
                    None => return Err(UpstreamError::Http(e.into_error())),
                },
                Err(e) => return Err(tls_refusal(e.into_error())),
            }
        }
    }

    /// `request` over HTTP/2; the request back when the backend chose HTTP/1.1 by ALPN.
    async fn request_h2(
        &self,
        mut req: Request<UpstreamRequestBody>,
        key: &Key,
        tls: Option<&Arc<ClientTls>>,
    ) -> Result<Result<Response<UpstreamResponseBody>, UpstreamError>, Request<UpstreamRequestBody>>
    {
        // The absolute URI gives `:scheme` and `:authority`; no Host header beside them.
        *req.version_mut() = Version::HTTP_2;
        req.headers_mut().remove(header::HOST);
        // A request given back by a closing connection goes again, once.
        let mut again = true;
        loop {
            let slot = match self.pool.h2.take(key) {
                Some(s) => s,
                None => match self.pool.h2.dial(key, self.open_h2(key, tls)).await {
                    // Room, unless other requests took it all (then another connection), or the
                    // backend closes new connections or allows no stream on them (then this is a
                    // failure to connect, not a reason to dial forever).
                    Ok(true) if self.pool.h2.usable(key) => continue,
                    Ok(true) => {
                        let e = std::io::Error::new(
                            std::io::ErrorKind::ConnectionAborted,
                            "the backend closed its new HTTP/2 connection or allows no stream on it",
                        );
                        return Ok(Err(UpstreamError::Connect(e)));
                    }
                    Ok(false) => return Err(req),
                    Err((kind, msg)) => {
                        return Ok(Err(UpstreamError::Connect(std::io::Error::new(kind, msg))))
                    }
                },
            };
            match slot.sender().try_send_request(req).await {
                Ok(resp) => {
                    return Ok(Ok(resp.map(|incoming| UpstreamResponseBody {
                        incoming,
                        link: Some(Link::H2(slot)),
                    })))
                }
                Err(mut e) => match e.take_message() {
                    Some(back) if std::mem::take(&mut again) => {
                        self.pool.h2.retire(&slot);
                        req = back;
                    }
                    _ => return Ok(Err(tls_refusal(e.into_error()))),
                },
            }
        }
    }

    /// Opens a connection for a backend asked for HTTP/2: an HTTP/2 connection, or — over TLS
    /// when the backend picks HTTP/1.1 — an HTTP/1 one, pooled as such (`Ok(None)`).
    async fn open_h2(
        &self,
        key: &Key,
        tls: Option<&Arc<ClientTls>>,
    ) -> Result<Option<h2::Conn>, h2::DialError> {
        let failed = |e: std::io::Error| (e.kind(), e.to_string());
        let stream = self.open(key, tls).await.map_err(failed)?;
        if tls.is_none() || stream.alpn() == Some(b"h2") {
            let streams = self.pool.h2.known_limit(key);
            return h2::handshake(stream, key.clone(), streams).await.map(Some);
        }
        let driver = self.handshake_h1(key, stream).await.map_err(|e| match e {
            UpstreamError::Connect(e) => failed(e),
            e => (std::io::ErrorKind::Other, e.to_string()),
        })?;
        self.pool.h1_only.lock().insert(key.clone());
        let Driver {
            sender, conn, rx, ..
        } = driver;
        if let Some(conn) = conn {
            self.pool.lock().entry(key.clone()).or_default().push(Idle {
                sender,
                conn,
                since: Instant::now(),
                rx,
            });
        }
        Ok(None)
    }

    fn checkout(&self, key: &Key) -> Option<Driver> {
        let mut pool = self.pool.lock();
        let list = pool.get_mut(key)?;
        // Alive but not yet asking for a request (the end of its last response is still being
        // processed): kept, not closed; it goes back after the search.
        let mut busy = Vec::new();
        let mut found = None;
        // Most recently used first: its socket and buffers are the warmest.
        while let Some(mut idle) = list.pop() {
            if !still_usable(&mut idle, self.idle_timeout) {
                continue;
            }
            if idle.sender.is_ready() {
                found = Some(Driver {
                    sender: idle.sender,
                    conn: Some(idle.conn),
                    key: key.clone(),
                    pool: Arc::downgrade(&self.pool),
                    rx: idle.rx,
                });
                break;
            }
            busy.push(idle);
        }
        list.extend(busy);
        found
    }

    /// A TCP (and TLS) connection to the backend.
    async fn open(&self, key: &Key, tls: Option<&Arc<ClientTls>>) -> std::io::Result<Stream> {
        let default_port = if tls.is_some() { 443 } else { 80 };
        let port = key.authority.port_u16().unwrap_or(default_port);
        crate::tls::connect_with(
            key.authority.host(),
            port,
            tls.map(|t| t.as_ref()),
            self.connect_timeout,
            self.stamps,
        )
        .await
    }

    async fn connect(
        &self,
        key: &Key,
        tls: Option<&Arc<ClientTls>>,
    ) -> Result<Driver, UpstreamError> {
        let stream = self.open(key, tls).await.map_err(UpstreamError::Connect)?;
        self.handshake_h1(key, stream).await
    }

    async fn handshake_h1(&self, key: &Key, stream: Stream) -> Result<Driver, UpstreamError> {
        let rx = stream.rx_cell();
        let (sender, conn) = http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await
            .map_err(UpstreamError::Http)?;
        Ok(Driver {
            sender,
            conn: Some(conn),
            key: key.clone(),
            pool: Arc::downgrade(&self.pool),
            rx,
        })
    }
}

/// A TLS alert on the first read is the backend refusing the handshake (TLS 1.3 servers check a
/// client certificate after the client considers the handshake done): the request never reached
/// it, so it is a connect failure (failover applies), not a failed request.
fn tls_refusal(e: hyper::Error) -> UpstreamError {
    match crate::util::errors::find::<rustls::Error>(&e) {
        Some(tls) => UpstreamError::Connect(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            format!("TLS: {tls}"),
        )),
        None => UpstreamError::Http(e),
    }
}

/// Every few seconds, drops idle connections that expired or that the backend closed.
async fn sweep(pool: Weak<Pool>, idle_timeout: Duration) {
    let every = (idle_timeout / 4).clamp(Duration::from_millis(500), Duration::from_secs(5));
    loop {
        tokio::time::sleep(every).await;
        let Some(pool) = pool.upgrade() else { return };
        pool.h2.sweep(idle_timeout);
        let mut idle = pool.lock();
        for list in idle.values_mut() {
            list.retain_mut(|c| still_usable(c, idle_timeout));
        }
        idle.retain(|_, list| !list.is_empty());
    }
}

/// Whose connection a response came on. (The HTTP/1 driver stays inline: boxing it would cost an
/// allocation per request on the common path, to shrink a value that is built once and moved
/// little.)
#[allow(clippy::large_enum_variant)]
enum Link {
    /// An HTTP/1 connection, driven by the body.
    H1(Driver),
    /// A stream of a shared HTTP/2 connection.
    H2(h2::Slot),
}

/// A response body. Over HTTP/1 it drives its own upstream connection; at its end the connection
/// returns to the pool, dropped early it closes the connection (the backend stops generating).
/// Over HTTP/2, dropped early it resets its stream (RST_STREAM, CANCEL: the same for the backend).
pub struct UpstreamResponseBody {
    incoming: Incoming,
    link: Option<Link>,
}

impl std::fmt::Debug for UpstreamResponseBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamResponseBody")
            .finish_non_exhaustive()
    }
}

impl UpstreamResponseBody {
    /// The connection's latest kernel receive stamp (`clock::pack`), for the meter.
    /// Over HTTP/2 the latest read may have brought another stream's frames.
    pub fn rx_cell(&self) -> Option<Arc<AtomicU64>> {
        match self.link.as_ref()? {
            Link::H1(d) => Some(Arc::clone(&d.rx)),
            Link::H2(s) => Some(Arc::clone(s.rx())),
        }
    }

    /// The HTTP version the response came over.
    pub fn is_h2(&self) -> bool {
        matches!(self.link, Some(Link::H2(_)))
    }

    fn release(&mut self) {
        let Some(Link::H1(mut d)) = self.link.take() else {
            return;
        };
        let Some(mut conn) = d.conn.take() else {
            return;
        };
        // Let the connection finish the message and ask for the next request.
        let mut cx = Context::from_waker(Waker::noop());
        if Pin::new(&mut conn).poll(&mut cx).is_ready() || d.sender.is_closed() {
            return;
        }
        if let Some(pool) = d.pool.upgrade() {
            pool.lock().entry(d.key).or_default().push(Idle {
                sender: d.sender,
                conn,
                since: Instant::now(),
                rx: d.rx,
            });
        }
    }
}

impl Body for UpstreamResponseBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        if let Some(Link::H1(d)) = this.link.as_mut() {
            d.poll_conn(cx);
        }
        let next = Pin::new(&mut this.incoming).poll_frame(cx);
        match &next {
            // The end; or the last bytes of a sized body, after which the server connection
            // stops polling (it asks `is_end_stream`).
            Poll::Ready(None) => this.release(),
            Poll::Ready(Some(Ok(_))) if this.incoming.is_end_stream() => this.release(),
            // A broken connection is not pooled (over HTTP/2 only the stream broke).
            Poll::Ready(Some(Err(_))) => this.link = None,
            _ => {}
        }
        next
    }

    fn is_end_stream(&self) -> bool {
        self.incoming.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.incoming.size_hint()
    }
}
