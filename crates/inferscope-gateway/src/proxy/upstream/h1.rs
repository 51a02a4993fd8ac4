//! HTTP/1.1 client connections of the gateway's own, for the upstream pool.
//!
//! Why not hyper's client connection: it keeps three buffers per connection for as long as the
//! connection lives — an 8 KiB write buffer for request heads, a read buffer of at least 8 KiB
//! (hyper's minimum, and `read_buf_exact_size` would also cap the response head at the buffer's
//! size) and the first block of its request channel (32 requests inline) — 25 of the 39 KB an
//! open stream held (docs/perf-log/, change 5), and it hands each decoded chunk to the body
//! through a channel. Here a connection is its socket and one read buffer that starts at 4 KiB
//! and grows only while reads fill it; the head of a request is written from a buffer that lives
//! for that write; the response head has a limit of its own (`MAX_HEAD_BYTES`); and the body
//! decodes straight from the read buffer: every frame is a slice of it, never a copy.
//!
//! What it speaks, as hyper's client does (tests/fuzz.rs checks the two against each other on
//! generated responses cut at random points): status line and headers by `httparse` with its
//! strict defaults (no obsolete line folding, at most `MAX_HEADERS` fields); 1xx responses
//! other than 101 skipped; no body for `HEAD`, 204 and 304; a `Transfer-Encoding` whose last
//! coding is `chunked` decoded as chunks (size, extensions up to 16 KiB a body, trailers up to
//! 16 KiB given as a trailers frame), any other `Transfer-Encoding` read to the close, an error
//! from an HTTP/1.0 server; `Content-Length` values that must all agree; else read to the close.
//! Keep-alive: HTTP/1.1 unless `Connection: close`, HTTP/1.0 only with `keep-alive`. Where it
//! differs: a response head that arrives while the request body is still being sent ends the
//! sending and the connection is not reused (hyper goes on sending); a response head past
//! `MAX_HEAD_BYTES` is refused (hyper's client allows about 400 KiB).

use super::UpstreamRequestBody;
use crate::meter::{Batch, MAX_PIECES};
use bytes::{Buf, Bytes, BytesMut};
use http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll, Waker};
use tokio::io::{AsyncRead, AsyncWrite};

/// Largest response head (status line and fields) accepted.
pub const MAX_HEAD_BYTES: usize = 64 << 10;
/// Most fields in a response head, and lines in a chunked body's trailers (hyper's limit).
pub const MAX_HEADERS: usize = 100;
/// Longest trailer section of a chunked body (hyper's limit).
const MAX_TRAILER_BYTES: usize = 16 << 10;
/// Most bytes of chunk extensions in one body (hyper's limit).
const MAX_EXTENSION_BYTES: u64 = 16 << 10;
/// The read buffer's first size, and the least it grows by.
const MIN_READ: usize = 4 << 10;
/// The most it grows by at once (after reads that filled what they were offered).
const MAX_READ: usize = 64 << 10;
/// Least free space offered to a read.
const MIN_FREE: usize = 1 << 10;

/// Why a request on an HTTP/1.1 connection failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or writing the socket failed.
    #[error("connection error: {0}")]
    Io(#[from] io::Error),
    /// The backend closed the connection before the response head was complete.
    #[error("the connection closed before a complete response head")]
    Closed,
    /// The backend closed the connection before the response body was complete.
    #[error("the connection closed before the response body was complete")]
    IncompleteBody,
    /// The response is not valid HTTP/1.1.
    #[error("invalid response: {0}")]
    Parse(&'static str),
    /// The response head is longer than `MAX_HEAD_BYTES`.
    #[error("the response head is longer than {MAX_HEAD_BYTES} bytes")]
    HeadTooLarge,
    /// The request body failed while it was being sent.
    #[error("the request body failed")]
    RequestBody(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl Error {
    /// The connection ended before a message was complete (head or body).
    pub fn is_incomplete_message(&self) -> bool {
        matches!(self, Error::Closed | Error::IncompleteBody)
    }
}

/// The read buffer: `buf[..filled]` is data received and not yet consumed, `buf[filled..]` is
/// zeroed space the next read fills (reads need initialized memory, and the code forbids
/// `unsafe`: space is zeroed when it is added, not before every read). Consumed data is split
/// off the front, so frames are slices of it; when the space runs short the buffer reclaims its
/// allocation if every frame cut from it is gone, else takes a new one.
#[derive(Debug)]
struct ReadBuffer {
    buf: BytesMut,
    filled: usize,
    /// What the next growth adds: doubled after a read that filled its space, halved after one
    /// that used a quarter of it, between `MIN_READ` and `MAX_READ`.
    grow: usize,
}

impl ReadBuffer {
    fn new() -> Self {
        Self {
            buf: BytesMut::new(),
            filled: 0,
            grow: MIN_READ,
        }
    }

    fn data(&self) -> &[u8] {
        &self.buf[..self.filled]
    }

    /// The first `n` bytes of data, as a frame (no copy).
    fn take(&mut self, n: usize) -> Bytes {
        self.filled -= n;
        self.buf.split_to(n).freeze()
    }

    /// Drops the first `n` bytes of data.
    fn consume(&mut self, n: usize) {
        self.filled -= n;
        self.buf.advance(n);
    }

    /// Reads once into the free space (growing it first when short): the bytes read, 0 at the
    /// end of the stream.
    fn poll_fill<T: AsyncRead + Unpin>(
        &mut self,
        io: &mut T,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<usize>> {
        if self.buf.len() - self.filled < MIN_FREE {
            self.buf.truncate(self.filled);
            self.buf.reserve(self.grow);
            self.buf.resize(self.filled + self.grow, 0);
        }
        let offered = self.buf.len() - self.filled;
        let mut rb = tokio::io::ReadBuf::new(&mut self.buf[self.filled..]);
        ready!(Pin::new(io).poll_read(cx, &mut rb))?;
        let n = rb.filled().len();
        self.filled += n;
        if n == offered {
            self.grow = (self.grow * 2).min(MAX_READ);
        } else if n <= offered / 4 {
            self.grow = (self.grow / 2).max(MIN_READ);
        }
        Poll::Ready(Ok(n))
    }
}

/// An HTTP/1.1 client connection: the socket and its read buffer.
#[derive(Debug)]
pub struct Conn<T> {
    io: T,
    read: ReadBuffer,
}

impl<T: AsyncRead + AsyncWrite + Unpin> Conn<T> {
    /// A connection over `io` (connected, TLS done).
    pub fn new(io: T) -> Self {
        Self {
            io,
            read: ReadBuffer::new(),
        }
    }

    /// An idle connection, polled once without waiting: `false` when the backend closed it or
    /// sent bytes nobody asked for (either way it cannot carry a request).
    pub fn is_usable(&mut self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        self.read.filled == 0 && self.read.poll_fill(&mut self.io, &mut cx).is_pending()
    }

    /// Sends `req` (origin-form URI, `Host` set) and reads the response head. The response's
    /// body reads the rest; at its end, `ResponseBody::into_idle` gives the connection back
    /// when it can carry another request.
    pub async fn send(
        mut self,
        req: Request<UpstreamRequestBody>,
    ) -> Result<Response<ResponseBody<T>>, Error> {
        let (mut parts, body) = req.into_parts();
        let mut sender = Sender::new(&mut parts, body);
        let head_only = parts.method == Method::HEAD;
        // A head is looked for in what the buffer holds, then again only after bytes are added.
        let mut fresh = !self.read.data().is_empty();
        let parsed = std::future::poll_fn(|cx| loop {
            let mut moved = false;
            if !sender.done {
                match sender.poll_send(&mut self.io, cx) {
                    Poll::Ready(Ok(())) => moved = true,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => {}
                }
            }
            if std::mem::take(&mut fresh) {
                if let Some(head) = parse_head(&mut self.read, head_only)? {
                    return Poll::Ready(Ok(head));
                }
            }
            match self.read.poll_fill(&mut self.io, cx) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(Error::Closed)),
                Poll::Ready(Ok(_)) => {
                    fresh = true;
                    moved = true;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(Error::Io(e))),
                Poll::Pending => {}
            }
            if !moved {
                return Poll::Pending;
            }
        })
        .await?;
        // A response before the whole request was sent: the rest is not sent, and the backend
        // may still be waiting for it, so the connection ends with this response.
        let keep_alive = parsed.keep_alive && sender.done;
        drop(sender);
        let decode = match parsed.framing {
            Framing::Empty => Decode::Done,
            Framing::Length(0) => Decode::Done,
            Framing::Length(n) => Decode::Length(n),
            Framing::Chunked => Decode::Chunked(Chunked::default()),
            Framing::Close => Decode::Close,
        };
        let body = ResponseBody {
            conn: Some(self),
            decode,
            keep_alive: keep_alive && parsed.framing != Framing::Close,
        };
        Ok(parsed.head.map(|()| body))
    }
}

/// How a request body goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// No body.
    None,
    /// Exactly this many bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`: read chunk by chunk until the last one.
    Chunked,
}

/// Writes a request: its head, then its body, in as few writes as the frames at hand allow.
struct Sender {
    /// What is to be written next, in order.
    queue: Vec<Bytes>,
    /// Bytes of `queue[0]` already written.
    offset: usize,
    /// The streamed body, while frames are to come from it.
    stream: Option<Box<super::super::body::PacedBody<hyper::body::Incoming>>>,
    plan: Plan,
    /// Body bytes queued so far.
    sent: u64,
    /// Everything is written.
    done: bool,
}

impl Sender {
    /// Sets the framing headers of `parts` as hyper's client would, encodes the head, and takes
    /// the body.
    fn new(parts: &mut http::request::Parts, body: UpstreamRequestBody) -> Self {
        let headers = &mut parts.headers;
        headers.remove(header::TRANSFER_ENCODING);
        let (plan, first, stream) = match body {
            http_body_util::Either::Left(full) => {
                let data = full_bytes(full);
                if data.is_empty() {
                    (Plan::None, None, None)
                } else {
                    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(data.len()));
                    (Plan::Length(data.len() as u64), Some(data), None)
                }
            }
            http_body_util::Either::Right(stream) => {
                let declared = content_length(headers);
                let exact = stream.size_hint().exact();
                match (declared, exact) {
                    (Some(Ok(n)), _) => (Plan::Length(n), None, Some(stream)),
                    (None, Some(n)) => {
                        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
                        (Plan::Length(n), None, Some(stream))
                    }
                    // GET, HEAD and CONNECT with a body of unknown length: no body (hyper's
                    // rule: those methods almost never have one).
                    _ if matches!(parts.method, Method::GET | Method::HEAD | Method::CONNECT) => {
                        (Plan::None, None, None)
                    }
                    _ => {
                        headers.remove(header::CONTENT_LENGTH);
                        headers.insert(
                            header::TRANSFER_ENCODING,
                            HeaderValue::from_static("chunked"),
                        );
                        (Plan::Chunked, None, Some(stream))
                    }
                }
            }
        };
        let mut head = Vec::with_capacity(64 + 48 * parts.headers.len());
        head.extend_from_slice(parts.method.as_str().as_bytes());
        head.push(b' ');
        let pq = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        head.extend_from_slice(pq.as_bytes());
        head.extend_from_slice(b" HTTP/1.1\r\n");
        for (name, value) in &parts.headers {
            head.extend_from_slice(name.as_str().as_bytes());
            head.extend_from_slice(b": ");
            head.extend_from_slice(value.as_bytes());
            head.extend_from_slice(b"\r\n");
        }
        head.extend_from_slice(b"\r\n");
        let mut queue = Vec::with_capacity(3);
        queue.push(Bytes::from(head));
        let mut sent = 0;
        if let Some(data) = first {
            sent = data.len() as u64;
            queue.push(data);
        }
        let stream = if plan == Plan::None { None } else { stream };
        Self {
            queue,
            offset: 0,
            stream,
            plan,
            sent,
            done: false,
        }
    }

    /// Writes what is queued and queues the body's next frames. `Ready(Ok(()))` when it made
    /// progress (`done` says whether all is sent), `Pending` when it could not.
    fn poll_send<T: AsyncWrite + Unpin>(
        &mut self,
        io: &mut T,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), Error>> {
        let mut moved = false;
        loop {
            if !self.queue.is_empty() {
                let mut slices = [IoSlice::new(&[]); 4];
                let n = self.queue.len().min(slices.len());
                slices[0] = IoSlice::new(&self.queue[0][self.offset..]);
                for (s, b) in slices[1..n].iter_mut().zip(&self.queue[1..n]) {
                    *s = IoSlice::new(b);
                }
                let wrote = match Pin::new(&mut *io).poll_write_vectored(cx, &slices[..n]) {
                    Poll::Ready(Ok(0)) => {
                        return Poll::Ready(Err(Error::Io(io::ErrorKind::WriteZero.into())))
                    }
                    Poll::Ready(Ok(w)) => w,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(Error::Io(e))),
                    Poll::Pending if moved => return Poll::Ready(Ok(())),
                    Poll::Pending => return Poll::Pending,
                };
                moved = true;
                self.advance(wrote);
                continue;
            }
            let Some(stream) = self.stream.as_mut() else {
                // Flushing is a no-op on sockets; TLS needs it to send its buffered records.
                return match Pin::new(&mut *io).poll_flush(cx) {
                    Poll::Ready(Ok(())) => {
                        self.done = true;
                        Poll::Ready(Ok(()))
                    }
                    Poll::Ready(Err(e)) => Poll::Ready(Err(Error::Io(e))),
                    Poll::Pending if moved => Poll::Ready(Ok(())),
                    Poll::Pending => Poll::Pending,
                };
            };
            match Pin::new(stream.as_mut()).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    let Ok(data) = frame.into_data() else {
                        // Trailers of the client's body: not forwarded (`Trailer` and `TE` are
                        // hop-by-hop).
                        continue;
                    };
                    if data.is_empty() {
                        continue;
                    }
                    self.sent += data.len() as u64;
                    match self.plan {
                        Plan::Length(n) if self.sent > n => {
                            return Poll::Ready(Err(Error::RequestBody(
                                "the request body is longer than its Content-Length".into(),
                            )))
                        }
                        Plan::Chunked => {
                            self.queue
                                .push(Bytes::from(format!("{:x}\r\n", data.len())));
                            self.queue.push(data);
                            self.queue.push(Bytes::from_static(b"\r\n"));
                        }
                        _ => self.queue.push(data),
                    }
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(Error::RequestBody(e))),
                Poll::Ready(None) => {
                    self.stream = None;
                    match self.plan {
                        Plan::Length(n) if self.sent < n => {
                            return Poll::Ready(Err(Error::RequestBody(
                                "the request body is shorter than its Content-Length".into(),
                            )))
                        }
                        Plan::Chunked => self.queue.push(Bytes::from_static(b"0\r\n\r\n")),
                        _ => {}
                    }
                }
                Poll::Pending if moved => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn advance(&mut self, mut n: usize) {
        while n > 0 {
            let left = self.queue[0].len() - self.offset;
            if n < left {
                self.offset += n;
                return;
            }
            n -= left;
            self.queue.remove(0);
            self.offset = 0;
        }
        while self.queue.first().is_some_and(|b| b.len() == self.offset) {
            self.queue.remove(0);
            self.offset = 0;
        }
    }
}

/// The bytes of a whole body (`Full` gives its data in one frame, at once).
fn full_bytes(mut full: http_body_util::Full<Bytes>) -> Bytes {
    let mut cx = Context::from_waker(Waker::noop());
    match Pin::new(&mut full).poll_frame(&mut cx) {
        Poll::Ready(Some(Ok(frame))) => frame.into_data().unwrap_or_default(),
        _ => Bytes::new(),
    }
}

/// The `Content-Length` fields: `None` when absent, an error when they do not all give the same
/// valid number (comma-separated values included).
fn content_length(headers: &HeaderMap) -> Option<Result<u64, ()>> {
    let mut found: Option<u64> = None;
    for v in headers.get_all(header::CONTENT_LENGTH) {
        let Ok(line) = v.to_str() else {
            return Some(Err(()));
        };
        for part in line.split(',') {
            let Some(n) = digits(part.trim().as_bytes()) else {
                return Some(Err(()));
            };
            match found {
                Some(m) if m != n => return Some(Err(())),
                _ => found = Some(n),
            }
        }
    }
    found.map(Ok)
}

/// A decimal number of digits only (no sign, no space).
fn digits(b: &[u8]) -> Option<u64> {
    if b.is_empty() {
        return None;
    }
    b.iter().try_fold(0u64, |n, &d| match d {
        b'0'..=b'9' => n.checked_mul(10)?.checked_add(u64::from(d - b'0')),
        _ => None,
    })
}

/// How a response body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Empty,
    Length(u64),
    Chunked,
    Close,
}

struct Parsed {
    head: Response<()>,
    framing: Framing,
    keep_alive: bool,
}

/// Where a head's status line ends and its fields lie: httparse's reading, with room for `N`
/// fields.
struct Found<const N: usize> {
    len: usize,
    code: u16,
    http10: bool,
    reason: Option<hyper::ext::ReasonPhrase>,
    /// Name start and end, value start and end, of each field.
    at: [(usize, usize, usize, usize); N],
    n: usize,
}

impl<const N: usize> Found<N> {
    /// The head at the start of `data`: `None` while incomplete.
    fn read(data: &[u8]) -> Result<Option<Self>, httparse::Error> {
        let mut fields = [httparse::EMPTY_HEADER; N];
        let mut res = httparse::Response::new(&mut fields);
        let len = match res.parse(data)? {
            httparse::Status::Complete(len) => len,
            httparse::Status::Partial => return Ok(None),
        };
        let code = res.code.unwrap_or(0);
        let canonical = StatusCode::from_u16(code)
            .ok()
            .and_then(|s| s.canonical_reason());
        let reason = res
            .reason
            .filter(|r| Some(*r) != canonical)
            .and_then(|r| hyper::ext::ReasonPhrase::try_from(r.as_bytes()).ok());
        let base = data.as_ptr() as usize;
        let mut at = [(0, 0, 0, 0); N];
        for (slot, h) in at.iter_mut().zip(res.headers.iter()) {
            let name = h.name.as_ptr() as usize - base;
            let value = h.value.as_ptr() as usize - base;
            *slot = (name, name + h.name.len(), value, value + h.value.len());
        }
        Ok(Some(Self {
            len,
            code,
            http10: res.version == Some(0),
            reason,
            at,
            n: res.headers.len(),
        }))
    }
}

/// Room for the fields of a first reading: most response heads have a handful; one with more
/// is read again with room for `MAX_HEADERS` (every reading fills its whole table first).
const FIRST_FIELDS: usize = 16;

/// Parses a response head at the start of the buffer (skipping 1xx heads other than 101):
/// `None` until it is complete.
fn parse_head(read: &mut ReadBuffer, head_only: bool) -> Result<Option<Parsed>, Error> {
    loop {
        let data = read.data();
        let avail = data.len();
        let read_as = match Found::<FIRST_FIELDS>::read(data) {
            Err(httparse::Error::TooManyHeaders) => match Found::<MAX_HEADERS>::read(data) {
                Ok(Some(f)) => build(
                    read,
                    head_only,
                    f.len,
                    f.code,
                    f.http10,
                    f.reason,
                    &f.at[..f.n],
                ),
                Ok(None) => Ok(Head::Incomplete),
                Err(e) => Err(Error::Parse(parse_error(e))),
            },
            Ok(Some(f)) => build(
                read,
                head_only,
                f.len,
                f.code,
                f.http10,
                f.reason,
                &f.at[..f.n],
            ),
            Ok(None) => Ok(Head::Incomplete),
            Err(e) => Err(Error::Parse(parse_error(e))),
        };
        match read_as? {
            Head::Incomplete if avail > MAX_HEAD_BYTES => return Err(Error::HeadTooLarge),
            Head::Incomplete => return Ok(None),
            Head::Informational => continue,
            Head::Final(p) => return Ok(Some(p)),
        }
    }
}

/// What a complete or incomplete head came to.
enum Head {
    Incomplete,
    /// A 1xx head (not 101), consumed.
    Informational,
    Final(Parsed),
}

/// The response of a complete head of `len` bytes whose fields lie at `at`: consumed from the
/// buffer, its fields slices of it.
fn build(
    read: &mut ReadBuffer,
    head_only: bool,
    len: usize,
    code: u16,
    http10: bool,
    reason: Option<hyper::ext::ReasonPhrase>,
    at: &[(usize, usize, usize, usize)],
) -> Result<Head, Error> {
    if len > MAX_HEAD_BYTES {
        return Err(Error::HeadTooLarge);
    }
    let status = StatusCode::from_u16(code).map_err(|_| Error::Parse("invalid status"))?;
    if matches!(code, 100 | 102..=199) {
        read.consume(len);
        return Ok(Head::Informational);
    }
    let head = read.take(len);
    let mut headers = HeaderMap::with_capacity(at.len());
    let mut keep_alive = !http10;
    let mut close = false;
    for &(n0, n1, v0, v1) in at {
        let name = HeaderName::from_bytes(&head[n0..n1])
            .map_err(|_| Error::Parse("invalid header name"))?;
        let value = HeaderValue::from_maybe_shared(head.slice(v0..v1))
            .map_err(|_| Error::Parse("invalid header value"))?;
        if name == header::CONNECTION {
            if close || has_token(&value, "close") {
                close = true;
                keep_alive = false;
            } else if !keep_alive && has_token(&value, "keep-alive") {
                keep_alive = true;
            }
        }
        headers.append(name, value);
    }
    let framing = framing(code, head_only, http10, &headers)?;
    // Transfer-Encoding overrides a Content-Length beside it, which must not be forwarded (RFC
    // 9112 §6.3; hyper ≥ 1.13 drops it too); a body framed so is not followed by another message
    // on its connection.
    if headers.contains_key(header::TRANSFER_ENCODING)
        && headers.remove(header::CONTENT_LENGTH).is_some()
        && framing != Framing::Empty
    {
        keep_alive = false;
    }
    let mut response = Response::new(());
    *response.status_mut() = status;
    *response.version_mut() = if http10 {
        http::Version::HTTP_10
    } else {
        http::Version::HTTP_11
    };
    *response.headers_mut() = headers;
    if let Some(r) = reason {
        response.extensions_mut().insert(r);
    }
    Ok(Head::Final(Parsed {
        head: response,
        framing,
        // 101: the connection has switched to another protocol.
        keep_alive: keep_alive && code != 101,
    }))
}

fn parse_error(e: httparse::Error) -> &'static str {
    match e {
        httparse::Error::HeaderName => "invalid header name",
        httparse::Error::HeaderValue => "invalid header value",
        httparse::Error::NewLine => "invalid line ending",
        httparse::Error::Status => "invalid status",
        httparse::Error::Token => "invalid token",
        httparse::Error::TooManyHeaders => "too many header fields",
        httparse::Error::Version => "invalid HTTP version",
    }
}

/// `value` lists `token` (comma-separated, any case).
fn has_token(value: &HeaderValue, token: &str) -> bool {
    value
        .to_str()
        .is_ok_and(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
}

/// How the body of a response is delimited (RFC 9112 §6.3, as hyper reads it).
fn framing(code: u16, head_only: bool, http10: bool, h: &HeaderMap) -> Result<Framing, Error> {
    if code == 101 || code == 204 || code == 304 || head_only {
        return Ok(Framing::Empty);
    }
    if h.contains_key(header::TRANSFER_ENCODING) {
        if http10 {
            return Err(Error::Parse("Transfer-Encoding in an HTTP/1.0 response"));
        }
        let chunked = h
            .get_all(header::TRANSFER_ENCODING)
            .iter()
            .next_back()
            .and_then(|v| v.to_str().ok())
            .and_then(|s| s.rsplit(',').next())
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("chunked"));
        return Ok(if chunked {
            Framing::Chunked
        } else {
            Framing::Close
        });
    }
    match content_length(h) {
        // hyper's largest: `u64::MAX` and the one below it mean "chunked" and "close" there.
        Some(Ok(n)) if n >= u64::MAX - 1 => Err(Error::Parse("invalid Content-Length")),
        Some(Ok(n)) => Ok(Framing::Length(n)),
        Some(Err(())) => Err(Error::Parse("invalid Content-Length")),
        None => Ok(Framing::Close),
    }
}

/// Where a response body's decoding stands.
#[derive(Debug)]
enum Decode {
    Length(u64),
    Chunked(Chunked),
    Close,
    Done,
}

/// The chunked decoder: hyper's states, stepped over whole slices of the buffer.
#[derive(Debug, Default)]
struct Chunked {
    state: Chunk,
    size: u64,
    extensions: u64,
    trailers: Option<BytesMut>,
    trailer_lines: usize,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    #[default]
    Start,
    Size,
    SizeLws,
    Extension,
    SizeLf,
    Body,
    BodyCr,
    BodyLf,
    EndCr,
    Trailer,
    TrailerLf,
    EndLf,
    End,
}

/// What one decoding step found.
enum Step {
    Frame(Frame<Bytes>),
    /// The buffer holds no more of the body: read.
    More,
    End,
}

fn hex(b: u8) -> Option<u64> {
    match b {
        b'0'..=b'9' => Some(u64::from(b - b'0')),
        b'a'..=b'f' => Some(u64::from(b - b'a' + 10)),
        b'A'..=b'F' => Some(u64::from(b - b'A' + 10)),
        _ => None,
    }
}

impl Chunked {
    fn step(&mut self, read: &mut ReadBuffer) -> Result<Step, Error> {
        loop {
            match self.state {
                Chunk::Body => {
                    if read.filled == 0 {
                        return Ok(Step::More);
                    }
                    return Ok(Step::Frame(Frame::data(self.take_data(read))));
                }
                Chunk::End => {
                    return match self.trailers.take() {
                        Some(t) => Ok(Step::Frame(Frame::trailers(trailers(
                            &t,
                            self.trailer_lines,
                        )?))),
                        None => Ok(Step::End),
                    };
                }
                _ => {}
            }
            self.run(read)?;
            if !matches!(self.state, Chunk::Body | Chunk::End) {
                return Ok(Step::More);
            }
        }
    }

    /// The buffered part of the current chunk's data (the state is `Body`).
    fn take_data(&mut self, read: &mut ReadBuffer) -> Bytes {
        let n = usize::try_from(self.size)
            .unwrap_or(usize::MAX)
            .min(read.filled);
        self.size -= n as u64;
        if self.size == 0 {
            self.state = Chunk::BodyCr;
        }
        read.take(n)
    }

    /// Steps through the buffer's bytes until a chunk's data or the end of the body, consuming
    /// them. A bad byte is left in the buffer (with the state before it), so it fails again.
    fn run(&mut self, read: &mut ReadBuffer) -> Result<(), Error> {
        if let Some(used) = self.next_size(read.data()) {
            read.consume(used);
            return Ok(());
        }
        let mut used = 0;
        let mut failed = Ok(());
        for &b in read.data() {
            if let Err(e) = self.byte(b) {
                failed = Err(e);
                break;
            }
            used += 1;
            if matches!(self.state, Chunk::Body | Chunk::End) {
                break;
            }
        }
        read.consume(used);
        failed
    }

    /// The common case at once: a chunk's end (`\r\n`, unless at the first chunk) and the next
    /// size line, plain hex digits and `\r\n`, whole in `d`, for a chunk that is not the last.
    /// Returns the bytes it used, with the state the byte loop would have reached over them;
    /// `None`, changing nothing, for anything else (the byte loop then reads it).
    fn next_size(&mut self, d: &[u8]) -> Option<usize> {
        let start = match self.state {
            Chunk::BodyCr if d.starts_with(b"\r\n") => 2,
            Chunk::Start => 0,
            _ => return None,
        };
        let mut size = 0u64;
        let mut i = start;
        // Sixteen hex digits fit a `u64`; a seventeenth is not `\r`, so the check below fails.
        while i - start < 16 {
            let Some(v) = d.get(i).and_then(|&b| hex(b)) else {
                break;
            };
            size = size * 16 + v;
            i += 1;
        }
        if i == start || size == 0 || d.get(i..i + 2)? != b"\r\n" {
            return None;
        }
        self.size = size;
        self.state = Chunk::Body;
        Some(i + 2)
    }

    /// The body has ended with no trailers to give.
    fn ended(&self) -> bool {
        self.state == Chunk::End && self.trailers.is_none()
    }

    /// One byte of a size line, a chunk's end or the trailers.
    fn byte(&mut self, b: u8) -> Result<(), Error> {
        let bad = |what| Err(Error::Parse(what));
        self.state = match (self.state, b) {
            (Chunk::Start, _) => {
                self.size = hex(b).ok_or(Error::Parse("invalid chunk size"))?;
                Chunk::Size
            }
            (Chunk::Size, b'\t' | b' ') => Chunk::SizeLws,
            (Chunk::Size | Chunk::SizeLws, b';') => Chunk::Extension,
            (Chunk::Size | Chunk::SizeLws | Chunk::Extension, b'\r') => Chunk::SizeLf,
            (Chunk::Size, _) => {
                let d = hex(b).ok_or(Error::Parse("invalid chunk size"))?;
                self.size = self
                    .size
                    .checked_mul(16)
                    .and_then(|s| s.checked_add(d))
                    .ok_or(Error::Parse("chunk size overflows"))?;
                Chunk::Size
            }
            (Chunk::SizeLws, b'\t' | b' ') => Chunk::SizeLws,
            (Chunk::SizeLws, _) => return bad("invalid whitespace in a chunk size line"),
            (Chunk::Extension, b'\n') => return bad("a chunk extension holds a newline"),
            (Chunk::Extension, _) => {
                self.extensions += 1;
                if self.extensions >= MAX_EXTENSION_BYTES {
                    return bad("chunk extensions over the limit");
                }
                Chunk::Extension
            }
            (Chunk::SizeLf, b'\n') if self.size == 0 => Chunk::EndCr,
            (Chunk::SizeLf, b'\n') => Chunk::Body,
            (Chunk::SizeLf, _) => return bad("invalid chunk size line ending"),
            (Chunk::BodyCr, b'\r') => Chunk::BodyLf,
            (Chunk::BodyCr, _) => return bad("invalid chunk end"),
            (Chunk::BodyLf, b'\n') => Chunk::Start,
            (Chunk::BodyLf, _) => return bad("invalid chunk end"),
            (Chunk::EndCr, b'\r') => {
                self.push_trailer(b, false)?;
                Chunk::EndLf
            }
            // A bare LF ending a trailer line: refused, as hyper ≥ 1.13 does (a line one side
            // ends there and another does not is how a second message gets smuggled in).
            (Chunk::EndCr | Chunk::Trailer, b'\n') => return bad("invalid trailer line ending"),
            (Chunk::EndCr, _) => {
                self.push_trailer(b, true)?;
                Chunk::Trailer
            }
            (Chunk::Trailer, _) => {
                self.push_trailer(b, false)?;
                if b == b'\r' {
                    Chunk::TrailerLf
                } else {
                    Chunk::Trailer
                }
            }
            (Chunk::TrailerLf, b'\n') => {
                if self.trailer_lines >= MAX_HEADERS {
                    return bad("too many trailer fields");
                }
                self.trailer_lines += 1;
                self.push_trailer(b, false)?;
                Chunk::EndCr
            }
            (Chunk::TrailerLf, _) => return bad("invalid trailer line ending"),
            (Chunk::EndLf, b'\n') => {
                self.push_trailer(b, false)?;
                Chunk::End
            }
            (Chunk::EndLf, _) => return bad("invalid end of a chunked body"),
            (Chunk::Body | Chunk::End, _) => self.state,
        };
        Ok(())
    }

    /// Keeps a byte of the trailers (`start`: it begins them); past the limit, an error.
    fn push_trailer(&mut self, b: u8, start: bool) -> Result<(), Error> {
        let t = match (&mut self.trailers, start) {
            (Some(t), _) => t,
            (t @ None, true) => t.insert(BytesMut::with_capacity(64)),
            (None, false) => return Ok(()),
        };
        if t.len() >= MAX_TRAILER_BYTES {
            return Err(Error::Parse("trailers over the limit"));
        }
        t.extend_from_slice(&[b]);
        Ok(())
    }
}

/// The trailer fields of a chunked body.
fn trailers(raw: &[u8], lines: usize) -> Result<HeaderMap, Error> {
    let mut fields = vec![httparse::EMPTY_HEADER; lines];
    match httparse::parse_headers(raw, &mut fields) {
        Ok(httparse::Status::Complete((_, fields))) => {
            let mut map = HeaderMap::with_capacity(fields.len());
            for f in fields.iter() {
                let name = HeaderName::from_bytes(f.name.as_bytes())
                    .map_err(|_| Error::Parse("invalid trailer name"))?;
                let value = HeaderValue::from_bytes(f.value)
                    .map_err(|_| Error::Parse("invalid trailer value"))?;
                map.append(name, value);
            }
            Ok(map)
        }
        Ok(httparse::Status::Partial) => Err(Error::Parse("incomplete trailers")),
        Err(e) => Err(Error::Parse(parse_error(e))),
    }
}

/// A response body read from its connection: each frame slices of the read buffer — of a chunked
/// body, every chunk the buffer holds (up to `meter::MAX_PIECES`), so what one read brought goes
/// on as one frame.
#[derive(Debug)]
pub struct ResponseBody<T> {
    /// `None` after an error.
    conn: Option<Conn<T>>,
    decode: Decode,
    keep_alive: bool,
}

impl<T: AsyncRead + AsyncWrite + Unpin> ResponseBody<T> {
    /// The connection, when the body has ended and the connection can carry another request
    /// (keep-alive, the whole request sent, nothing more received).
    pub fn into_idle(self) -> Option<Conn<T>> {
        let conn = self.conn?;
        (matches!(self.decode, Decode::Done) && self.keep_alive && conn.read.filled == 0)
            .then_some(conn)
    }

    /// The connection's socket, while the body has it.
    pub fn io(&self) -> Option<&T> {
        self.conn.as_ref().map(|c| &c.io)
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> Body for ResponseBody<T> {
    type Data = Batch;
    type Error = Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Batch>, Error>>> {
        let this = self.get_mut();
        loop {
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            let read = &mut conn.read;
            let step = match &mut this.decode {
                Decode::Done => return Poll::Ready(None),
                Decode::Length(left) => {
                    if read.filled == 0 {
                        Ok(Step::More)
                    } else {
                        let n = usize::try_from(*left)
                            .unwrap_or(usize::MAX)
                            .min(read.filled);
                        *left -= n as u64;
                        let frame = Frame::data(read.take(n));
                        if *left == 0 {
                            this.decode = Decode::Done;
                        }
                        Ok(Step::Frame(frame))
                    }
                }
                Decode::Chunked(c) => c.step(read),
                Decode::Close => Ok(if read.filled == 0 {
                    Step::More
                } else {
                    Step::Frame(Frame::data(read.take(read.filled)))
                }),
            };
            match step {
                Ok(Step::Frame(f)) => {
                    let mut f = f.map_data(Batch::from);
                    if let Decode::Chunked(c) = &mut this.decode {
                        if let Some(batch) = f.data_mut() {
                            // The chunks after this one already read go in the same frame; and
                            // the terminator of the body may be here too: end now, so the
                            // connection goes back to the pool without another poll. (An error
                            // in what follows comes with the next poll.)
                            loop {
                                if c.state != Chunk::Body {
                                    let _ = c.run(&mut conn.read);
                                }
                                if c.state != Chunk::Body
                                    || conn.read.filled == 0
                                    || batch.count() >= MAX_PIECES
                                {
                                    break;
                                }
                                batch.push(c.take_data(&mut conn.read));
                            }
                        }
                        if f.is_trailers() || c.ended() {
                            this.decode = Decode::Done;
                        }
                    }
                    return Poll::Ready(Some(Ok(f)));
                }
                Ok(Step::End) => {
                    this.decode = Decode::Done;
                    return Poll::Ready(None);
                }
                Ok(Step::More) => {}
                Err(e) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(e)));
                }
            }
            match conn.read.poll_fill(&mut conn.io, cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) => {
                    if let Decode::Close = this.decode {
                        this.decode = Decode::Done;
                        this.keep_alive = false;
                        return Poll::Ready(None);
                    }
                    this.conn = None;
                    return Poll::Ready(Some(Err(Error::IncompleteBody)));
                }
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(Error::Io(e))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.decode, Decode::Done)
    }

    fn size_hint(&self) -> SizeHint {
        match self.decode {
            Decode::Done => SizeHint::with_exact(0),
            Decode::Length(n) => SizeHint::with_exact(n),
            _ => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::meter::Parts;
    use http_body_util::{BodyExt, Either, Full};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// What a client made of a response: status, fields, body, trailers — or the failure.
    #[derive(Debug, PartialEq)]
    enum Seen {
        Response {
            status: u16,
            headers: HeaderMap,
            body: Vec<u8>,
            trailers: Option<HeaderMap>,
            reused: bool,
        },
        HeadFailed(String),
        BodyFailed(String),
    }

    fn get(method: Method) -> Request<UpstreamRequestBody> {
        let mut r = Request::new(Either::Left(Full::new(Bytes::new())));
        *r.method_mut() = method;
        *r.uri_mut() = "/v1/models".parse().unwrap();
        r.headers_mut()
            .insert(header::HOST, HeaderValue::from_static("backend"));
        r
    }

    /// Sends one request on a connection whose backend answers `response`, written in pieces cut
    /// at `cuts` (then the backend closes); returns what was seen and the request's bytes.
    async fn exchange(
        req: Request<UpstreamRequestBody>,
        response: &[u8],
        cuts: &[usize],
    ) -> (Seen, Vec<u8>) {
        let (client, mut server) = tokio::io::duplex(1 << 20);
        let response = response.to_vec();
        let mut at: Vec<usize> = cuts.iter().map(|&c| c.min(response.len())).collect();
        at.sort_unstable();
        let backend = tokio::spawn(async move {
            let mut got = vec![0u8; 65536];
            let n = server.read(&mut got).await.unwrap();
            got.truncate(n);
            let mut from = 0;
            for c in at.into_iter().chain([response.len()]) {
                if c > from {
                    server.write_all(&response[from..c]).await.unwrap();
                    from = c;
                    tokio::task::yield_now().await;
                }
            }
            got
        });
        let seen = match Conn::new(client).send(req).await {
            Err(e) => Seen::HeadFailed(e.to_string()),
            Ok(resp) => {
                let (parts, mut body) = resp.into_parts();
                let (mut data, mut trailers) = (Vec::new(), None);
                let mut failed = None;
                while let Some(f) = body.frame().await {
                    match f {
                        Ok(f) => match f.into_data() {
                            Ok(mut d) => {
                                while d.has_remaining() {
                                    data.extend_from_slice(d.chunk());
                                    d.advance(d.chunk().len());
                                }
                            }
                            Err(f) => trailers = f.into_trailers().ok(),
                        },
                        Err(e) => {
                            failed = Some(e.to_string());
                            break;
                        }
                    }
                }
                match failed {
                    Some(e) => Seen::BodyFailed(e),
                    None => Seen::Response {
                        status: parts.status.as_u16(),
                        headers: parts.headers,
                        body: data,
                        trailers,
                        reused: body.into_idle().is_some(),
                    },
                }
            }
        };
        (seen, backend.await.unwrap())
    }

    fn ok(seen: &Seen) -> (&[u8], bool) {
        match seen {
            Seen::Response { body, reused, .. } => (body, *reused),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_chunked_body_is_the_same_however_it_is_cut() {
        let wire = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
                     5\r\nhello\r\n6;name=value\r\n world\r\nA \r\n0123456789\r\n\
                     000000000000000000003\r\nabc\r\n000000000000000B\r\n0123456789a\r\n\
                     00\r\n\r\n";
        for cut in 0..wire.len() {
            let (seen, _) = exchange(get(Method::GET), wire, &[cut, cut + 3]).await;
            assert_eq!(
                ok(&seen),
                (&b"hello world0123456789abc0123456789a"[..], true),
                "cut at {cut}"
            );
        }
    }

    #[tokio::test]
    async fn trailers_come_as_a_frame_and_the_connection_is_kept() {
        let wire = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
                     2\r\nok\r\n0\r\nx-checksum: 7\r\nx-more: a b\r\n\r\n";
        for cut in [0, 40, 50, 60, wire.len() - 1] {
            let (seen, _) = exchange(get(Method::GET), wire, &[cut]).await;
            let Seen::Response {
                body,
                trailers,
                reused,
                ..
            } = seen
            else {
                panic!("{seen:?}")
            };
            assert_eq!(body, b"ok");
            let t = trailers.expect("trailers");
            assert_eq!(t["x-checksum"], "7");
            assert_eq!(t["x-more"], "a b");
            assert!(reused);
        }
    }

    #[tokio::test]
    async fn sized_empty_and_close_delimited_bodies() {
        /// Request method, response, where it is cut, the body read, whether the connection is
        /// kept.
        type Case = (Method, &'static [u8], &'static [usize], &'static [u8], bool);
        let cases: [Case; 8] = [
            // Bytes past the message: the body is right, the connection is not reused.
            (
                Method::GET,
                b"HTTP/1.1 200 OK\r\ncontent-length: 5, 5\r\n\r\nhelloEXTRA",
                &[20],
                b"hello",
                false,
            ),
            (
                Method::GET,
                b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello",
                &[],
                b"hello",
                true,
            ),
            (
                Method::HEAD,
                b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n",
                &[],
                b"",
                true,
            ),
            (
                Method::GET,
                b"HTTP/1.1 204 No Content\r\n\r\n",
                &[],
                b"",
                true,
            ),
            (
                Method::GET,
                b"HTTP/1.1 200 OK\r\n\r\nuntil the end",
                &[19],
                b"until the end",
                false,
            ),
            // Any other transfer coding last: to the close.
            (
                Method::GET,
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, gzip\r\n\r\n5\r\nhello",
                &[],
                b"5\r\nhello",
                false,
            ),
            (
                Method::GET,
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                &[],
                b"ok",
                false,
            ),
            (
                Method::GET,
                b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\nconnection: keep-alive\r\n\r\nok",
                &[],
                b"ok",
                true,
            ),
        ];
        for (method, wire, cuts, body, reused) in cases {
            let (seen, _) = exchange(get(method), wire, cuts).await;
            assert_eq!(
                ok(&seen),
                (body, reused),
                "{:?}",
                String::from_utf8_lossy(wire)
            );
        }
    }

    /// Transfer-Encoding beside Content-Length, in either order: the chunked body is read, the
    /// Content-Length is not passed on, and the connection is not reused.
    #[tokio::test]
    async fn a_content_length_beside_transfer_encoding_is_dropped_and_the_connection_not_reused() {
        for wire in [
            &b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 9\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        ] {
            let (seen, _) = exchange(get(Method::GET), wire, &[]).await;
            let Seen::Response { headers, .. } = &seen else {
                panic!("{seen:?}")
            };
            assert!(!headers.contains_key("content-length"), "{headers:?}");
            assert_eq!(headers["transfer-encoding"], "chunked");
            assert_eq!(ok(&seen), (&b"ok"[..], false));
        }
    }

    #[tokio::test]
    async fn informational_heads_are_skipped() {
        let (seen, _) = exchange(
            get(Method::GET),
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n\
              HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
            &[10, 30],
        )
        .await;
        let Seen::Response {
            status, headers, ..
        } = &seen
        else {
            panic!("{seen:?}")
        };
        assert_eq!(*status, 200);
        assert!(!headers.contains_key("link"));
        assert_eq!(ok(&seen), (&b"ok"[..], true));
    }

    #[tokio::test]
    async fn broken_responses_fail() {
        let cases: [(&[u8], &str); 8] = [
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 3, 5\r\n\r\n",
                "Content-Length",
            ),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
                "Content-Length",
            ),
            (
                b"HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
                "HTTP/1.0",
            ),
            (b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n", "header"),
            (b"HTTP/1.1 20 OK\r\n\r\n", "status"),
            (b"HTTP/1.1 200 OK\r\ncontent-len", "closed"),
            (b"", "closed"),
            (b"SSH-2.0-OpenSSH\r\n\r\n", "version"),
        ];
        for (wire, says) in cases {
            let (seen, _) = exchange(get(Method::GET), wire, &[]).await;
            match seen {
                Seen::HeadFailed(e) => assert!(e.contains(says), "{e} for {wire:?}"),
                other => panic!("{other:?} for {wire:?}"),
            }
        }
        let bodies: [&[u8]; 9] = [
            // Trailer lines ended by a bare LF (a smuggled message could follow).
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\nGET / HTTP/1.1\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nx: 1\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhelloX\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n11111111111111111\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n11111111111111111\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFF\r\nnot that long",
        ];
        for wire in bodies {
            let (seen, _) = exchange(get(Method::GET), wire, &[]).await;
            assert!(matches!(seen, Seen::BodyFailed(_)), "{seen:?} for {wire:?}");
        }
    }

    #[tokio::test]
    async fn a_head_has_a_limit_of_its_own() {
        let mut wire = b"HTTP/1.1 200 OK\r\n".to_vec();
        while wire.len() <= MAX_HEAD_BYTES {
            wire.extend_from_slice(format!("x-filler: {}\r\n", "a".repeat(1000)).as_bytes());
        }
        let (seen, _) = exchange(get(Method::GET), &wire, &[]).await;
        assert_eq!(seen, Seen::HeadFailed(Error::HeadTooLarge.to_string()));
        // Far above the read buffer's first 4 KiB, below the limit: fine.
        let mut wire = b"HTTP/1.1 200 OK\r\n".to_vec();
        for _ in 0..20 {
            wire.extend_from_slice(format!("x-filler: {}\r\n", "a".repeat(1000)).as_bytes());
        }
        wire.extend_from_slice(b"content-length: 2\r\n\r\nok");
        let (seen, _) = exchange(get(Method::GET), &wire, &[100, 5000, 9000]).await;
        assert_eq!(ok(&seen), (&b"ok"[..], true));
    }

    #[tokio::test]
    async fn heads_with_many_fields_are_read_whole_up_to_the_limit() {
        // Around the first reading's room and the limit; the last field is the framing, so a
        // head read with fields missing would lose the body.
        for n in [
            FIRST_FIELDS - 1,
            FIRST_FIELDS,
            FIRST_FIELDS + 1,
            MAX_HEADERS,
        ] {
            let mut wire = b"HTTP/1.1 200 OK\r\n".to_vec();
            for i in 0..n - 1 {
                wire.extend_from_slice(format!("x-field-{i}: {i}\r\n").as_bytes());
            }
            wire.extend_from_slice(b"content-length: 2\r\n\r\nok");
            for cut in [0, 30, wire.len() / 2, wire.len() - 3] {
                let (seen, _) = exchange(get(Method::GET), &wire, &[cut]).await;
                let Seen::Response { headers, body, .. } = &seen else {
                    panic!("{n} fields, cut at {cut}: {seen:?}")
                };
                assert_eq!(headers.len(), n, "{n} fields, cut at {cut}");
                assert_eq!(headers[format!("x-field-{}", n - 2)], (n - 2).to_string());
                assert_eq!(body, b"ok");
            }
        }
        let mut wire = b"HTTP/1.1 200 OK\r\n".to_vec();
        for i in 0..=MAX_HEADERS {
            wire.extend_from_slice(format!("x-field-{i}: {i}\r\n").as_bytes());
        }
        wire.extend_from_slice(b"\r\n");
        let (seen, _) = exchange(get(Method::GET), &wire, &[]).await;
        assert!(matches!(seen, Seen::HeadFailed(_)), "{seen:?}");
    }

    #[tokio::test]
    async fn the_request_goes_as_hyper_would_write_it() {
        let mut req = get(Method::POST);
        *req.body_mut() = Either::Left(Full::new(Bytes::from_static(b"{\"a\":1}")));
        req.headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from_static("99"));
        req.headers_mut()
            .append("x-two", HeaderValue::from_static("1"));
        req.headers_mut()
            .append("x-two", HeaderValue::from_static("2"));
        let (_, sent) = exchange(req, b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", &[]).await;
        let sent = String::from_utf8(sent).unwrap();
        assert!(sent.starts_with("POST /v1/models HTTP/1.1\r\n"), "{sent}");
        // The length is the body's, whatever the header said.
        assert!(sent.contains("\r\ncontent-length: 7\r\n"), "{sent}");
        assert!(sent.contains("\r\nx-two: 1\r\nx-two: 2\r\n"), "{sent}");
        assert!(sent.ends_with("\r\n\r\n{\"a\":1}"), "{sent}");
        // No body: no length added.
        let (_, sent) = exchange(get(Method::GET), b"HTTP/1.1 204 No Content\r\n\r\n", &[]).await;
        let sent = String::from_utf8(sent).unwrap();
        assert_eq!(sent, "GET /v1/models HTTP/1.1\r\nhost: backend\r\n\r\n");
    }

    #[tokio::test]
    async fn chunks_of_one_read_go_on_as_one_frame_sharing_the_read_buffer() {
        // 70 chunks in one read: frames of `MAX_PIECES` chunks and the rest, each chunk a slice
        // of the one read buffer (no copy), in order.
        let mut wire = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        let mut want = Vec::new();
        for i in 0..70 {
            let c = format!("chunk {i:02}");
            wire.extend_from_slice(format!("{:x}\r\n{c}\r\n", c.len()).as_bytes());
            want.push(c);
        }
        wire.extend_from_slice(b"0\r\n\r\n");
        let (client, mut server) = tokio::io::duplex(1 << 16);
        server.write_all(&wire).await.unwrap();
        let resp = Conn::new(client).send(get(Method::GET)).await.unwrap();
        let mut body = resp.into_body();
        let mut frames = Vec::new();
        while let Some(f) = body.frame().await {
            frames.push(f.unwrap().into_data().unwrap());
        }
        let counts: Vec<usize> = frames.iter().map(Batch::count).collect();
        assert_eq!(counts, [MAX_PIECES, MAX_PIECES, 70 - 2 * MAX_PIECES]);
        let pieces: Vec<&Bytes> = frames.iter().flat_map(|f| f.parts()).collect();
        let got: Vec<&[u8]> = pieces.iter().map(|b| &b[..]).collect();
        let want: Vec<&[u8]> = want.iter().map(|c| c.as_bytes()).collect();
        assert_eq!(got, want);
        let base = pieces[0].as_ptr() as usize;
        assert!(pieces
            .iter()
            .all(|b| (b.as_ptr() as usize).abs_diff(base) < 4096));
        assert!(body.is_end_stream());
        assert!(body.into_idle().is_some());
    }

    #[tokio::test]
    async fn a_frame_holds_only_what_was_read() {
        // A chunk whose end has not arrived goes on in part, at once; nothing waits for more.
        let (client, mut server) = tokio::io::duplex(1 << 16);
        server
            .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\none\r\n7\r\ntw")
            .await
            .unwrap();
        let resp = Conn::new(client).send(get(Method::GET)).await.unwrap();
        let mut body = resp.into_body();
        let f = body.frame().await.unwrap().unwrap().into_data().unwrap();
        let got: Vec<&[u8]> = f.parts().iter().map(|b| &b[..]).collect();
        assert_eq!(got, [&b"one"[..], b"tw"]);
        server.write_all(b"o-two\r\n0\r\n\r\n").await.unwrap();
        let f = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(f.parts(), [Bytes::from_static(b"o-two")]);
        assert!(body.frame().await.is_none());
        assert!(body.into_idle().is_some());
    }
}
