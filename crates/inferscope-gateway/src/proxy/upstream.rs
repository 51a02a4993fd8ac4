//! The upstream client: HTTP/1.1 keep-alive connections pooled per backend authority, each one
//! driven by the task that uses it rather than by a task of its own; and, for backends with
//! `http2: true`, multiplexed HTTP/2 connections (`h2`).
//!
//! HTTP/1.1 is spoken by a client of the gateway's own (`h1`): a connection is its socket and
//! one small read buffer, and the response body decodes straight from that buffer, so every chunk
//! already read is handed to the server connection in the same turn and written with the others
//! — without holding any chunk back: a chunk that arrives alone is written alone, at once.
//! (hyper-util's pooled client ran every connection as a task of its own that handed the body
//! over a one-slot channel, one decoded chunk at a time: one upstream read of 64 chunks became
//! 64 downstream writes, docs/perf-log/ "End-to-end"; hyper's own client connection, driven
//! inline, still kept three buffers of 8–12 KB per connection, docs/perf-log/ change 5.)
//!
//! Pool behaviour: an idle HTTP/1.1 connection stays pooled for its backend's `idle_timeout`, or
//! less when the backend's `Keep-Alive: timeout=N` says it closes sooner: the gateway lets go of a
//! connection before the backend does, because a request sent just as the backend closes the
//! connection is lost (nothing tells whether the backend read it, so it cannot be sent again). An
//! idle connection is checked when it is taken (closed by the backend, expired, bytes nobody
//! asked for: dropped) and by a sweep every second, so connections closed by the backend do not
//! linger. The same holds for HTTP/2 connections (`h2`), which a backend closes
//! with GOAWAY; a request given back by a closing HTTP/2 connection is sent again on another.
//!
//! HTTP/2 is spoken with prior knowledge over `http://` (h2c) and offered by ALPN over `https://`;
//! a TLS backend that picks HTTP/1.1 gets HTTP/1.1 from then on.

pub mod h1;
mod h2;

use crate::meter::Batch;
use crate::tls::{ClientTls, Stream};
use bytes::Bytes;
use http::uri::{Authority, PathAndQuery};
use http::{header, HeaderValue, Request, Response, Uri, Version};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;

/// Body sent upstream: whole (inference requests, read for inspection) or streamed (uploads).
/// The streamed kind is boxed, so the common whole kind stays small.
pub type UpstreamRequestBody =
    http_body_util::Either<http_body_util::Full<Bytes>, Box<super::body::PacedBody<Incoming>>>;

/// Connections are pooled per authority and TLS configuration (one backend's client
/// certificate or CA is not another's).
#[derive(Debug, Clone)]
pub(crate) struct Key {
    authority: Authority,
    tls: usize,
}

// The authority as written, byte for byte, hashed in one write: `Authority`'s own `Hash` feeds
// the hasher a byte at a time (it ignores case), which cost more than the rest of a checkout.
// Backends spelled in other cases get pools of their own.
impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.tls == other.tls && self.authority.as_str() == other.authority.as_str()
    }
}

impl Eq for Key {}

impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.tls.hash(state);
        self.authority.as_str().hash(state);
    }
}

/// Why an upstream request failed before a response head arrived.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// No connection could be made (refused, unreachable, DNS, connect timeout).
    #[error("connect: {0}")]
    Connect(std::io::Error),
    /// An HTTP/2 connection failed while sending the request or waiting for the response head.
    #[error(transparent)]
    Http(#[from] hyper::Error),
    /// An HTTP/1.1 connection failed while sending the request or waiting for the response head.
    #[error("{0}")]
    H1(#[source] h1::Error),
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

/// An idle HTTP/1.1 connection in the pool.
struct Idle {
    conn: h1::Conn<Stream>,
    /// It is let go at this instant.
    until: Instant,
    rx: Arc<AtomicU64>,
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

/// An idle connection that expired, was closed by the backend or received bytes nobody asked for
/// is of no further use.
fn still_usable(idle: &mut Idle, now: Instant) -> bool {
    now < idle.until && idle.conn.is_usable()
}

/// How long a connection whose response carried `headers` may stay pooled: `idle`, or less when
/// a `Keep-Alive: timeout=N` field says the backend closes it after N seconds (then a second less,
/// or half a second when N is 1; zero when N is 0).
fn keep_for(headers: &http::HeaderMap, idle: Duration) -> Duration {
    const KEEP_ALIVE: http::HeaderName = http::HeaderName::from_static("keep-alive");
    let Some(v) = headers.get(KEEP_ALIVE) else {
        return idle;
    };
    let said = v.as_bytes().split(|&b| b == b',').find_map(|p| {
        let p = p.trim_ascii();
        let (name, value) = p.split_at(p.iter().position(|&b| b == b'=')?);
        if !name.trim_ascii().eq_ignore_ascii_case(b"timeout") {
            return None;
        }
        std::str::from_utf8(&value[1..])
            .ok()?
            .trim()
            .parse::<u64>()
            .ok()
    });
    match said {
        None => idle,
        Some(0) => Duration::ZERO,
        Some(1) => idle.min(Duration::from_millis(500)),
        Some(n) => idle.min(Duration::from_secs(n - 1)),
    }
}

/// The pooled upstream client. Cheap to clone; clones share the pool.
#[derive(Clone)]
pub struct UpstreamClient {
    pool: Arc<Pool>,
    connect_timeout: Duration,
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
    /// A client; idle HTTP/2 connections are closed after `h2_idle_timeout` (HTTP/1.1 ones after
    /// what each request says). Must be created inside a Tokio runtime (it starts the idle sweep).
    pub fn new(connect_timeout: Duration, h2_idle_timeout: Duration) -> Self {
        let pool = Arc::new(Pool::default());
        tokio::spawn(sweep(Arc::downgrade(&pool), h2_idle_timeout));
        Self {
            pool,
            connect_timeout,
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
    /// drives an HTTP/1 connection; read to its end, the connection goes back to the pool for
    /// `idle` at most (see the module's notes).
    pub async fn request(
        &self,
        mut req: Request<UpstreamRequestBody>,
        tls: Option<&Arc<ClientTls>>,
        http2: bool,
        idle: Duration,
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
            // Boxed: the HTTP/2 dial is most of this future's size, and the HTTP/1.1 path (each
            // request's future is moved into its own allocation) should not carry it.
            req = match Box::pin(self.request_h2(req, &key, tls, idle)).await {
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
        let (conn, rx) = match self.checkout(&key) {
            Some(c) => c,
            // Boxed for the same reason: a new connection is the exception on a pooled path.
            None => Box::pin(self.connect(&key, tls)).await?,
        };
        let resp = conn.send(req).await.map_err(h1_failure)?;
        let (parts, body) = resp.into_parts();
        let h1 = H1 {
            body,
            key,
            pool: Arc::downgrade(&self.pool),
            keep: keep_for(&parts.headers, idle),
        };
        // No body to read (HEAD, 204, Content-Length: 0): nobody polls it, so the connection
        // goes back now.
        let link = if h1.body.is_end_stream() {
            h1.release();
            None
        } else {
            Some(Link::H1(h1))
        };
        Ok(Response::from_parts(
            parts,
            UpstreamResponseBody { link, rx: Some(rx) },
        ))
    }

    /// `request` over HTTP/2; the request back when the backend chose HTTP/1.1 by ALPN.
    async fn request_h2(
        &self,
        mut req: Request<UpstreamRequestBody>,
        key: &Key,
        tls: Option<&Arc<ClientTls>>,
        idle: Duration,
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
                None => match self.pool.h2.dial(key, self.open_h2(key, tls, idle)).await {
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
                    let rx = Some(Arc::clone(slot.rx()));
                    return Ok(Ok(resp.map(|incoming| UpstreamResponseBody {
                        link: Some(Link::H2 {
                            incoming,
                            _slot: slot,
                        }),
                        rx,
                    })));
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
    /// when the backend picks HTTP/1.1 — an HTTP/1 one, pooled as such for `idle` (`Ok(None)`).
    async fn open_h2(
        &self,
        key: &Key,
        tls: Option<&Arc<ClientTls>>,
        idle: Duration,
    ) -> Result<Option<h2::Conn>, h2::DialError> {
        let failed = |e: std::io::Error| (e.kind(), e.to_string());
        let stream = self.open(key, tls).await.map_err(failed)?;
        if tls.is_none() || stream.alpn() == Some(b"h2") {
            let streams = self.pool.h2.known_limit(key);
            return h2::handshake(stream, key.clone(), streams).await.map(Some);
        }
        self.pool.h1_only.lock().insert(key.clone());
        let rx = stream.rx_cell();
        self.pool.lock().entry(key.clone()).or_default().push(Idle {
            conn: h1::Conn::new(stream),
            until: Instant::now() + idle,
            rx,
        });
        Ok(None)
    }

    /// The most recently used idle connection that can carry a request (its socket and buffer
    /// are the warmest); those that cannot are dropped on the way.
    fn checkout(&self, key: &Key) -> Option<(h1::Conn<Stream>, Arc<AtomicU64>)> {
        let now = Instant::now();
        let mut pool = self.pool.lock();
        let list = pool.get_mut(key)?;
        while let Some(mut idle) = list.pop() {
            if still_usable(&mut idle, now) {
                return Some((idle.conn, idle.rx));
            }
        }
        None
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
    ) -> Result<(h1::Conn<Stream>, Arc<AtomicU64>), UpstreamError> {
        let stream = self.open(key, tls).await.map_err(UpstreamError::Connect)?;
        let rx = stream.rx_cell();
        Ok((h1::Conn::new(stream), rx))
    }
}

/// A TLS alert on the first read is the backend refusing the handshake (TLS 1.3 servers check a
/// client certificate after the client considers the handshake done): the request never reached
/// it, so it is a connect failure (failover applies), not a failed request.
fn tls_refusal(e: hyper::Error) -> UpstreamError {
    match refused_by_tls(&e) {
        Some(c) => c,
        None => UpstreamError::Http(e),
    }
}

/// `tls_refusal` for an HTTP/1.1 connection's failure.
fn h1_failure(e: h1::Error) -> UpstreamError {
    match refused_by_tls(&e) {
        Some(c) => c,
        None => UpstreamError::H1(e),
    }
}

fn refused_by_tls(e: &(dyn std::error::Error + 'static)) -> Option<UpstreamError> {
    let tls = crate::util::errors::find::<rustls::Error>(e)?;
    Some(UpstreamError::Connect(std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        format!("TLS: {tls}"),
    )))
}

/// Every second, drops idle connections that expired or that the backend closed.
async fn sweep(pool: Weak<Pool>, h2_idle_timeout: Duration) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let Some(pool) = pool.upgrade() else { return };
        pool.h2.sweep(h2_idle_timeout);
        let now = Instant::now();
        let mut idle = pool.lock();
        for list in idle.values_mut() {
            list.retain_mut(|c| still_usable(c, now));
        }
        idle.retain(|_, list| !list.is_empty());
    }
}

/// A response body being read from a pooled HTTP/1.1 connection, and where the connection goes
/// back.
struct H1 {
    body: h1::ResponseBody<Stream>,
    key: Key,
    pool: Weak<Pool>,
    /// How long the connection may stay pooled after the body's end (`keep_for`).
    keep: Duration,
}

impl H1 {
    /// The body has ended: the connection goes back to the pool when it can carry another
    /// request.
    fn release(self) {
        let (Some(pool), Some(rx)) = (self.pool.upgrade(), self.body.io().map(Stream::rx_cell))
        else {
            return;
        };
        if self.keep.is_zero() {
            return;
        }
        if let Some(conn) = self.body.into_idle() {
            pool.lock().entry(self.key).or_default().push(Idle {
                conn,
                until: Instant::now() + self.keep,
                rx,
            });
        }
    }
}

/// Whose connection a response came on. (The HTTP/1.1 body stays inline: boxing it would cost
/// an allocation per request on the common path, to shrink a value that is built once and moved
/// little.)
#[allow(clippy::large_enum_variant)]
enum Link {
    /// An HTTP/1.1 connection, read by the body.
    H1(H1),
    /// A stream of a shared HTTP/2 connection (the slot, held until the body ends, counts the
    /// stream against the connection's limit).
    H2 { incoming: Incoming, _slot: h2::Slot },
}

/// Why a response body failed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamBodyError {
    /// Its HTTP/1.1 connection failed or the backend broke the message.
    #[error("{0}")]
    H1(#[source] h1::Error),
    /// Its HTTP/2 stream or connection failed.
    #[error("{0}")]
    H2(#[source] hyper::Error),
}

/// A response body. Over HTTP/1.1 it reads its own upstream connection; at its end the
/// connection returns to the pool, dropped early it closes the connection (the backend stops
/// generating). Over HTTP/2, dropped early it resets its stream (RST_STREAM, CANCEL: the same for
/// the backend).
pub struct UpstreamResponseBody {
    /// `None` once the body has ended (or failed).
    link: Option<Link>,
    rx: Option<Arc<AtomicU64>>,
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
        self.rx.clone()
    }

    /// The HTTP version the response came over.
    pub fn is_h2(&self) -> bool {
        matches!(self.link, Some(Link::H2 { .. }))
    }
}

impl Body for UpstreamResponseBody {
    type Data = Batch;
    type Error = UpstreamBodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Batch>, UpstreamBodyError>>> {
        let this = &mut *self;
        let next = match this.link.as_mut() {
            None => return Poll::Ready(None),
            Some(Link::H1(h1)) => Pin::new(&mut h1.body)
                .poll_frame(cx)
                .map_err(UpstreamBodyError::H1),
            Some(Link::H2 { incoming, .. }) => Pin::new(incoming)
                .poll_frame(cx)
                .map_ok(|f| f.map_data(Batch::from))
                .map_err(UpstreamBodyError::H2),
        };
        let ended = match &next {
            // The end; or the last bytes of a sized body, after which the server connection
            // stops polling (it asks `is_end_stream`).
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(_))) => this.is_end_stream(),
            // A broken connection is not pooled (over HTTP/2 only the stream broke).
            Poll::Ready(Some(Err(_))) => {
                this.link = None;
                false
            }
            Poll::Pending => false,
        };
        if ended {
            if let Some(Link::H1(h1)) = this.link.take() {
                h1.release();
            }
        }
        next
    }

    fn is_end_stream(&self) -> bool {
        match &self.link {
            None => true,
            Some(Link::H1(h1)) => h1.body.is_end_stream(),
            Some(Link::H2 { incoming, .. }) => incoming.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.link {
            None => SizeHint::with_exact(0),
            Some(Link::H1(h1)) => h1.body.size_hint(),
            Some(Link::H2 { incoming, .. }) => incoming.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keep_alive_timeout_shortens_how_long_a_connection_stays_pooled() {
        let idle = Duration::from_secs(4);
        let cases: &[(Option<&str>, Duration)] = &[
            (None, idle),
            (Some("timeout=5"), Duration::from_secs(4)),
            (Some("timeout=3"), Duration::from_secs(2)),
            (Some("timeout=60, max=1000"), idle),
            (Some("max=100, Timeout = 2"), Duration::from_secs(1)),
            (Some("timeout=1"), Duration::from_millis(500)),
            (Some("timeout=0"), Duration::ZERO),
            (Some("max=5"), idle),
            (Some("timeout=soon"), idle),
            (Some("timeout"), idle),
        ];
        for (value, want) in cases {
            let mut headers = http::HeaderMap::new();
            if let Some(v) = value {
                headers.insert("keep-alive", HeaderValue::from_static(v));
            }
            assert_eq!(keep_for(&headers, idle), *want, "{value:?}");
        }
    }
}
