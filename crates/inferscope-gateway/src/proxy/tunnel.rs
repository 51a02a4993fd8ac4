//! Upgraded connections (`Connection: upgrade` + `Upgrade: websocket`, the OpenAI Realtime API):
//! the handshake is forwarded to the backend on a connection of its own, and once both sides have
//! switched protocols the bytes are relayed both ways untouched. The session is one record,
//! written when it ends: its duration (`e2e`), the bytes each way (`bytes_in`, `bytes_out`),
//! status 101, and how it ended.

use super::error::ProxyError;
use super::service::ProxyBody;
use crate::meter::{Batch, Outcome, Session};
use crate::route::Backend;
use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::{BodyExt, Either, Empty, Full, Limited};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

/// Largest body of a refused handshake passed back (the backend's error page).
const MAX_REFUSAL_BODY: usize = 64 << 10;

/// True for an HTTP/1.1 GET asking to switch to WebSocket (other upgrades, such as `h2c`, are
/// hop-by-hop negotiations with the gateway itself: their headers are dropped as before).
pub(super) fn is_upgrade(method: &Method, version: Version, headers: &HeaderMap) -> bool {
    method == Method::GET
        && version == Version::HTTP_11
        && headers
            .get(header::UPGRADE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| {
                v.split(',')
                    .any(|p| p.trim().eq_ignore_ascii_case("websocket"))
            })
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// How long a session may run, and go quiet.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Limits {
    /// No bytes either way for this long ends it (`None`: never).
    pub idle: Option<Duration>,
    /// It ends at this instant (`None`: never).
    pub until: Option<Instant>,
    /// Connecting to the backend gives up after this.
    pub connect: Duration,
    /// The backend's answer to the handshake must arrive within this (the route's
    /// `timeouts.first_token`, the head's timeout for any request); past it, or past `until`:
    /// 504 `upstream_timeout`.
    pub handshake: Option<Duration>,
}

/// Sends the handshake to `backend` (`headers`: the client's, already cleaned for upstream, and
/// `upgrade`: its `Upgrade` value). On `101` the session is relayed in a task of its own
/// (`session` writes its record when it ends) and the 101 goes back to the client as the backend
/// sent it; any other answer is passed back as it is and is the session's record. A handshake
/// that could not be sent is the caller's to answer, with the session back.
#[allow(clippy::too_many_arguments)]
pub(super) async fn open(
    backend: &Backend,
    path_and_query: Option<&http::uri::PathAndQuery>,
    headers: HeaderMap,
    upgrade: HeaderValue,
    client: OnUpgrade,
    session: Session,
    limits: Limits,
) -> Result<Response<ProxyBody>, (ProxyError, Session)> {
    let deadline = [limits.handshake.map(|d| Instant::now() + d), limits.until]
        .into_iter()
        .flatten()
        .min();
    let exchange = handshake(backend, path_and_query, headers, upgrade, limits.connect);
    let answered = match deadline {
        Some(t) => tokio::time::timeout_at(t, exchange)
            .await
            .unwrap_or(Err(ProxyError::UpstreamTimeout)),
        None => exchange.await,
    };
    let mut resp = match answered {
        Ok(r) => r,
        Err(e) => return Err((e, session)),
    };
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        // Refused: the backend's answer, and the record says so.
        let (parts, body) = resp.into_parts();
        let body = Limited::new(body, MAX_REFUSAL_BODY)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let status = parts.status.as_u16();
        let outcome = if status >= 500 {
            Outcome::BackendError
        } else {
            Outcome::ClientError
        };
        let n = body.len() as u64;
        session.finish(status, outcome, Some("upgrade_refused"), 0, n);
        let mut r = Response::from_parts(parts, Either::Right(Full::new(body.into())));
        super::request::remove_hop_headers(r.headers_mut());
        return Ok(r);
    }
    let upstream = hyper::upgrade::on(&mut resp);
    let (parts, _) = resp.into_parts();
    let mut session = session;
    session.switched();
    tokio::spawn(relay(client, upstream, session, limits));
    // The 101 as the backend sent it (its Upgrade, Connection and Sec-WebSocket-* headers).
    Ok(Response::from_parts(
        parts,
        Either::Right(Full::new(Batch::default())),
    ))
}

/// The handshake on a connection of its own (upgraded connections are never pooled).
async fn handshake(
    backend: &Backend,
    path_and_query: Option<&http::uri::PathAndQuery>,
    mut headers: HeaderMap,
    upgrade: HeaderValue,
    connect: Duration,
) -> Result<Response<hyper::body::Incoming>, ProxyError> {
    let mut parts = backend.base.clone().into_parts();
    parts.path_and_query = backend.upstream_path(path_and_query);
    let uri = Uri::from_parts(parts).map_err(|_| ProxyError::BadUpstreamRequest)?;
    let host = uri.host().ok_or(ProxyError::BadUpstreamRequest)?;
    let tls = backend.tls.as_deref();
    let port = uri
        .port_u16()
        .unwrap_or(if tls.is_some() { 443 } else { 80 });
    if let Some((name, value)) = &backend.authorization {
        headers.insert(name.clone(), value.clone());
    }
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, upgrade);
    if let Some(a) = uri
        .authority()
        .and_then(|a| HeaderValue::try_from(a.as_str()).ok())
    {
        headers.insert(header::HOST, a);
    }
    let stream = crate::tls::connect(host, port, tls, connect)
        .await
        .map_err(|e| ProxyError::Upstream(super::upstream::UpstreamError::Connect(e)))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| ProxyError::Upstream(e.into()))?;
    tokio::spawn(conn.with_upgrades());
    let mut req = Request::new(Empty::<Bytes>::new());
    *req.method_mut() = Method::GET;
    *req.uri_mut() = Uri::from(
        uri.path_and_query()
            .cloned()
            .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/")),
    );
    *req.headers_mut() = headers;
    sender
        .send_request(req)
        .await
        .map_err(|e| ProxyError::Upstream(e.into()))
}

/// Counts the bytes read through it.
struct Counted<R> {
    inner: R,
    n: Arc<AtomicU64>,
}

impl<R: AsyncRead + Unpin> AsyncRead for Counted<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        let read = buf.filled().len() - before;
        self.n.fetch_add(read as u64, Relaxed);
        r
    }
}

/// Copies `from` to `to` until `from` ends, then closes `to`'s write side.
async fn pump<R, W>(mut from: R, mut to: W) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 16 << 10];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        to.write_all(&buf[..n]).await?;
        to.flush().await?;
    }
}

async fn relay(client: OnUpgrade, upstream: OnUpgrade, session: Session, limits: Limits) {
    let (c, u) = tokio::join!(client, upstream);
    let (c, u) = match (c, u) {
        (Ok(c), Ok(u)) => (TokioIo::new(c), TokioIo::new(u)),
        (Err(_), _) => {
            return session.finish(101, Outcome::ClientCancelled, Some("upgrade_failed"), 0, 0)
        }
        (_, Err(_)) => {
            return session.finish(101, Outcome::BackendError, Some("upgrade_failed"), 0, 0)
        }
    };
    let (up, down) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (cr, cw) = tokio::io::split(c);
    let (ur, uw) = tokio::io::split(u);
    let to_backend = pump(
        Counted {
            inner: cr,
            n: Arc::clone(&up),
        },
        uw,
    );
    let to_client = pump(
        Counted {
            inner: ur,
            n: Arc::clone(&down),
        },
        cw,
    );
    // Each direction runs until its side closes; the session ends when both have.
    let both = async {
        tokio::pin!(to_backend, to_client);
        let (mut a, mut b) = (None, None);
        while a.is_none() || b.is_none() {
            tokio::select! {
                r = &mut to_backend, if a.is_none() => a = Some(r),
                r = &mut to_client, if b.is_none() => b = Some(r),
            }
            // A side that failed takes the session down with it.
            if matches!(a, Some(Err(_))) || matches!(b, Some(Err(_))) {
                break;
            }
        }
        (a, b)
    };
    tokio::pin!(both);
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let (mut last, mut quiet_since) = (0u64, Instant::now());
    let ended = loop {
        tokio::select! {
            r = &mut both => break Some(r),
            _ = tick.tick() => {
                let now = Instant::now();
                let moved = up.load(Relaxed) + down.load(Relaxed);
                if moved != last {
                    last = moved;
                    quiet_since = now;
                }
                if session.cutting() {
                    break None;
                }
                if limits.idle.is_some_and(|d| now.duration_since(quiet_since) >= d)
                    || limits.until.is_some_and(|t| now >= t)
                {
                    break Some((None, Some(Err(std::io::Error::from(std::io::ErrorKind::TimedOut)))));
                }
            }
        }
    };
    let (i, o) = (up.load(Relaxed), down.load(Relaxed));
    let (outcome, error) = match ended {
        None => (Outcome::Shutdown, Some("shutdown")),
        Some((Some(Err(_)), _)) => (Outcome::ClientCancelled, Some("client_disconnected")),
        Some((_, Some(Err(e)))) if e.kind() == std::io::ErrorKind::TimedOut => {
            (Outcome::Timeout, Some("session_timeout"))
        }
        Some((_, Some(Err(_)))) => (Outcome::Truncated, Some("upstream_body_error")),
        Some(_) => (Outcome::Ok, None),
    };
    session.finish(101, outcome, error, i, o);
}
