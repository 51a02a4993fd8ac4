//! `run(listener, service, options, shutdown)`: accepts connections on an already-bound listener
//! (so tests bind port 0), serves HTTP/1.1 and h2c on each (hyper-util auto), and on shutdown stops
//! accepting, lets in-flight requests finish within the grace period, then returns.
//!
//! Used by the data plane, the admin plane and the simulator alike. What a client controls at the
//! connection level is bounded here: connections at once (`max_connections`; at the cap the loop
//! stops accepting, so the kernel's backlog holds the rest), the time until the first request
//! head (`header_read_timeout`, which also covers the HTTP/2 preface sniff hyper's own timer does
//! not), silence on a connection with no request open (`idle_timeout`: HTTP/1 before and between
//! requests, h2 alike), header size and count, h2 streams per connection. Accept errors (out of
//! file descriptors…) back off exponentially and are logged at most once per 10 s with a count.
//!
//! With `tls`, each accepted connection first completes a TLS handshake (within
//! `header_read_timeout`; ALPN picks h2 or HTTP/1.1), counted in `tls_failures` when it fails.
//!
//! Requests get the peer address as a `ClientAddr` extension.

use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::service::Service;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulConnection;
use pin_project_lite::pin_project;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::Instant;

pub use inferscope_meter::conn::{ClientAddr, Refused, StalledCut, WhenWritten, WriteClock};

/// A connection with a response that has waited this many idle timeouts for its client to take
/// it (its head or a frame handed on, the body not polled since) is closed.
pub const STALL_IDLE_TIMEOUTS: u32 = 5;

/// Called for every `Refused` request.
pub type OnRefused = Arc<dyn Fn(Refused) + Send + Sync>;

/// Connection-level counters (exported on `/metrics`).
#[derive(Debug, Default)]
pub struct ConnCounters {
    /// Connections open now.
    pub open: AtomicUsize,
    /// Connections accepted.
    pub accepted: AtomicU64,
    /// Closed for silence with no request open, or no first request in time.
    pub closed_idle: AtomicU64,
    /// Closed with requests open because a response waited `STALL_IDLE_TIMEOUTS` idle timeouts
    /// for the client to take it (a zero-window h2 client, a client that stopped reading).
    pub closed_stalled: AtomicU64,
    /// `accept` failed (out of file descriptors and the like).
    pub accept_errors: AtomicU64,
    /// Times the loop waited because `max_connections` were open.
    pub at_capacity: AtomicU64,
    /// Requests the HTTP layer refused (`Refused`).
    pub refused: AtomicU64,
    /// TLS handshakes that failed or timed out (no certificate the CA signed, plain HTTP on a
    /// TLS port, a scanner…).
    pub tls_failures: AtomicU64,
    /// Connections closed at once because, under pressure, their address held its share.
    pub refused_share: AtomicU64,
    /// Connections closed at capacity to make room for a new one, because they had waited
    /// longest for their first request head (`ServerOptions::evict_waiting_heads`).
    pub evicted: AtomicU64,
}

impl ConnCounters {
    /// The data plane's connection series, for `/metrics` (TLS failures apart: the admin
    /// listener's are added to them there).
    pub fn scalars(&self) -> impl Iterator<Item = crate::meter::stats::Scalar> {
        let open = crate::meter::stats::Scalar {
            name: "inferscope_client_connections",
            kind: "gauge",
            help: "Client connections open on the data plane.",
            value: self.open.load(Ordering::Relaxed) as f64,
        };
        let counters = [
            ("inferscope_client_connections_total", "Client connections accepted on the data plane.", &self.accepted),
            ("inferscope_client_connections_idle_closed_total", "Client connections closed for silence with no request open (or no first request in time).", &self.closed_idle),
            ("inferscope_client_connections_stalled_closed_total", "Client connections closed because a response waited 5 idle timeouts for the client to take it (a zero-window h2 stream, a client that stopped reading).", &self.closed_stalled),
            ("inferscope_client_connections_share_refused_total", "Client connections closed at once: under pressure (limits.overload_at), their address held its fair share.", &self.refused_share),
            ("inferscope_client_connections_at_capacity_total", "Times accepting paused because max_connections were open.", &self.at_capacity),
            ("inferscope_accept_errors_total", "accept() failures (e.g. out of file descriptors); each backs off.", &self.accept_errors),
            ("inferscope_http_refused_total", "Request heads the HTTP layer refused (malformed 400, oversize 431, incomplete 408).", &self.refused),
        ]
        .map(|(name, help, v)| crate::meter::stats::Scalar {
            name,
            kind: "counter",
            help,
            value: v.load(Ordering::Relaxed) as f64,
        });
        std::iter::once(open).chain(counters)
    }
}

/// Connection-level settings.
#[derive(Clone)]
pub struct ServerOptions {
    /// A request head must arrive within this: the first one from the connection's start, later
    /// ones (HTTP/1) from their first byte.
    pub header_read_timeout: Option<Duration>,
    /// Close a connection with no request open after this long without a byte either way.
    pub idle_timeout: Option<Duration>,
    /// Connections open at once; at the cap new ones wait in the listen backlog.
    pub max_connections: usize,
    /// Most header fields in an HTTP/1 request head (431 beyond it).
    pub max_headers: usize,
    /// Largest request head, bytes (HTTP/1: 431 beyond it; h2: the header list size).
    pub max_header_bytes: usize,
    /// Concurrent h2 streams per connection.
    pub h2_max_streams: u32,
    /// How long in-flight requests may take to finish after shutdown begins.
    pub grace: Duration,
    /// Told about requests refused before the service saw them.
    pub on_refused: Option<OnRefused>,
    /// Counters to update.
    pub counters: Arc<ConnCounters>,
    /// Called when the grace period ends with connections still open, just before they are
    /// cut (so their requests can be recorded as cut by the shutdown).
    pub on_cut: Option<Arc<dyn Fn() + Send + Sync>>,
    /// Terminate TLS on every connection.
    pub tls: Option<Arc<crate::tls::ServerTls>>,
    /// Read with kernel receive stamps (Linux) and give each request its `clock::Arrival`.
    pub kernel_clock: bool,
    /// Fraction of `max_connections` open from which an address holding its fair share (the
    /// connections divided by the addresses holding any) has a new connection closed at once;
    /// 1: never.
    pub overload_at: f64,
    /// At `max_connections`, a new connection takes the place of the one that has waited
    /// longest for its first request head, when it has waited at least this long (`None`: the
    /// new connection waits in the backlog). Trickled heads (slowloris) then cannot keep a
    /// client that sends its request at once out: the admin listener's probes.
    pub evict_waiting_heads: Option<Duration>,
}

impl std::fmt::Debug for ServerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerOptions")
            .field("header_read_timeout", &self.header_read_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .field("max_connections", &self.max_connections)
            .field("max_headers", &self.max_headers)
            .field("max_header_bytes", &self.max_header_bytes)
            .field("h2_max_streams", &self.h2_max_streams)
            .field("grace", &self.grace)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            header_read_timeout: Some(Duration::from_secs(30)),
            idle_timeout: Some(Duration::from_secs(60)),
            max_connections: 10_000,
            max_headers: 100,
            max_header_bytes: 64 << 10,
            h2_max_streams: 256,
            grace: Duration::from_secs(30),
            on_refused: None,
            counters: Arc::default(),
            on_cut: None,
            tls: None,
            kernel_clock: true,
            overload_at: 1.0,
            evict_waiting_heads: None,
        }
    }
}

/// Serves `service` on every connection accepted from `listener` until `shutdown` resolves, then
/// drains. Returns `true` when every connection finished within the grace period.
pub async fn run<S, B>(
    listener: TcpListener,
    service: S,
    opts: ServerOptions,
    shutdown: impl Future<Output = ()>,
) -> bool
where
    S: Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .max_headers(opts.max_headers)
        // hyper's own minimum read buffer is 8 KiB.
        .max_buf_size(opts.max_header_bytes.max(8192));
    if let Some(t) = opts.header_read_timeout {
        builder.http1().header_read_timeout(t);
    }
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(opts.h2_max_streams)
        .max_header_list_size(u32::try_from(opts.max_header_bytes).unwrap_or(u32::MAX));
    // Shutdown reaches every connection's supervisor, which closes it gracefully (HTTP/1: after
    // the response in flight; h2: GOAWAY, then the open streams finish).
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    // Accepted sockets inherit the option.
    let stamps = opts.kernel_clock && crate::clock::enable_rx_stamps(&listener);
    let slots = Arc::new(Semaphore::new(opts.max_connections.max(1)));
    let shares: Arc<crate::util::shares::Shares<std::net::IpAddr>> = Arc::default();
    let pressure_at = if opts.overload_at >= 1.0 {
        usize::MAX
    } else {
        ((opts.max_connections as f64) * opts.overload_at.max(0.0)).ceil() as usize
    };
    let mut accept_errors = AcceptBackoff::default();
    // Connection tasks, so those still open when the grace period ends can be cut (their
    // requests' records are written as they are dropped).
    let mut conns = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    // Connections that have not sent a first request yet, oldest first (for eviction).
    let mut heads = WaitingHeads::default();
    // A connection accepted at capacity, waiting for the slot its eviction frees.
    let mut early: Option<(tokio::net::TcpStream, SocketAddr)> = None;
    loop {
        let permit = match Arc::clone(&slots).try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                opts.counters.at_capacity.fetch_add(1, Ordering::Relaxed);
                let mut permit = None;
                // With eviction on, a connection waiting in the backlog is taken in, and the
                // one that has waited longest for its first head makes room for it (tried
                // again every 20 ms while none has waited long enough).
                let mut evicted = false;
                while permit.is_none() {
                    let min_age = opts.evict_waiting_heads;
                    let retry = async {
                        if early.is_some() && !evicted {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        } else {
                            std::future::pending::<()>().await;
                        }
                    };
                    tokio::select! {
                        p = Arc::clone(&slots).acquire_owned() => match p {
                            Ok(p) => permit = Some(p),
                            Err(_) => break,
                        },
                        accepted = listener.accept(), if min_age.is_some() && early.is_none() => {
                            if let Ok(conn) = accepted {
                                early = Some(conn);
                            }
                        }
                        () = retry => {}
                        () = &mut shutdown => break,
                    }
                    if let (Some(min_age), Some(_), false) = (min_age, &early, evicted) {
                        evicted = heads.evict_oldest(min_age);
                        if evicted {
                            opts.counters.evicted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                match permit {
                    Some(p) => p,
                    None => break,
                }
            }
        };
        let taken = match early.take() {
            Some(conn) => Ok(Ok(conn)),
            None => tokio::select! {
                accepted = listener.accept() => Ok(accepted),
                () = &mut shutdown => Err(()),
            },
        };
        let Ok(accepted) = taken else { break };
        let (stream, peer) = {
            match accepted {
                Ok(conn) => {
                    accept_errors.reset();
                    conn
                }
                Err(e) => {
                    opts.counters.accept_errors.fetch_add(1, Ordering::Relaxed);
                    let pause = accept_errors.failed(&e);
                    tokio::select! {
                        () = tokio::time::sleep(pause) => continue,
                        () = &mut shutdown => break,
                    }
                }
            }
        };
        // Under pressure an address holding its share of the connections gets no more.
        let share = if pressure_at == usize::MAX {
            None
        } else {
            let pressured = opts.counters.open.load(Ordering::Relaxed) >= pressure_at;
            match shares.admit_among_holders(peer.ip(), opts.max_connections, pressured) {
                Some(g) => Some(g),
                None => {
                    opts.counters.refused_share.fetch_add(1, Ordering::Relaxed);
                    drop(stream);
                    drop(permit);
                    continue;
                }
            }
        };
        // Small SSE writes must leave at once: Nagle would hold them for the peer's delayed ACK.
        let _ = stream.set_nodelay(true);
        opts.counters.accepted.fetch_add(1, Ordering::Relaxed);
        opts.counters.open.fetch_add(1, Ordering::Relaxed);
        let state = Arc::new(ConnState::default());
        if opts.evict_waiting_heads.is_some() {
            heads.push(&state);
        }
        let io = Tracked {
            inner: crate::clock::StampedTcp::new(stream, stamps),
            closing: WritesClosed(Arc::clone(&state.writes)),
            state: Arc::clone(&state),
        };
        let service = PerConnection {
            inner: service.clone(),
            state: Arc::clone(&state),
            peer: ClientAddr(peer),
        };
        let builder = builder.clone();
        let stop = stop_rx.clone();
        let opts = opts.clone();
        while conns.try_join_next().is_some() {}
        // Plain and TLS connections are spawned as tasks of their own types: a task's future is
        // as large as its largest state, and a plain connection would otherwise carry room for
        // the TLS session and its handshake.
        match opts.tls.clone() {
            None => conns.spawn(async move {
                let accepted = Instant::now();
                let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
                let result = supervise(conn, &state, &opts, accepted, stop).await;
                ended(result, &state, &opts, peer, accepted);
                drop((permit, share));
            }),
            Some(tls) => conns.spawn(async move {
                let accepted = Instant::now();
                let limit = opts.header_read_timeout.unwrap_or(Duration::from_secs(30));
                let result = match tokio::time::timeout(limit, tls.acceptor().accept(io)).await {
                    Ok(Ok(tls_stream)) => {
                        state.after_handshake(tls_stream.get_ref().1.alpn_protocol());
                        let conn = builder
                            .serve_connection_with_upgrades(TokioIo::new(tls_stream), service);
                        supervise(conn, &state, &opts, accepted, stop).await
                    }
                    Ok(Err(e)) => {
                        opts.counters.tls_failures.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        Some(Ok(()))
                    }
                    Err(_) => {
                        opts.counters.tls_failures.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(%peer, "TLS handshake timed out");
                        Some(Ok(()))
                    }
                };
                ended(result, &state, &opts, peer, accepted);
                drop((permit, share));
            }),
        };
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let drained = tokio::time::timeout(opts.grace, async {
        while conns.join_next().await.is_some() {}
    })
    .await
    .is_ok();
    if !drained {
        if let Some(f) = &opts.on_cut {
            f();
        }
        conns.abort_all();
        // Aborted tasks drop their connections (and with them the requests' bodies) as they
        // finish; a bounded wait, so a stuck drop cannot hold the shutdown.
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            while conns.join_next().await.is_some() {}
        })
        .await;
    }
    drained
}

type ConnError = Box<dyn std::error::Error + Send + Sync>;

/// A connection's end: the request it refused or timed out on goes to the access log; the
/// counters learn how it closed.
fn ended(
    result: Option<Result<(), ConnError>>,
    state: &ConnState,
    opts: &ServerOptions,
    peer: SocketAddr,
    accepted: Instant,
) {
    match result {
        Some(Err(e)) => refused(&e, state, opts, peer, accepted),
        Some(Ok(())) => {}
        // Closed mid-head: a request that never completed.
        None if state.partial_head() => {
            report(opts, peer, 408, "header_read_timeout", accepted);
        }
        None => {
            opts.counters.closed_idle.fetch_add(1, Ordering::Relaxed);
        }
    }
    opts.counters.open.fetch_sub(1, Ordering::Relaxed);
}

/// The listen backlog when nothing sets one: connections the kernel completes and holds until
/// they are accepted. Tokio's `TcpListener::bind` (and std's) ask for 128: a burst of more new
/// connections than the accept loop takes in one turn, or any at `max_connections`, has its SYNs
/// dropped and its clients wait a second to send them again, time no measurement of the
/// gateway's sees.
pub const DEFAULT_BACKLOG: u32 = 4096;

/// Binds a listener on `addr` with `SO_REUSEADDR` (as Tokio's `bind` does) and a listen backlog
/// of `backlog` connections (the kernel caps it at `net.core.somaxconn`: see `somaxconn`).
/// Call within a Tokio runtime.
pub fn bind(addr: SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

/// A listener on an ephemeral loopback port with `DEFAULT_BACKLOG` (the embedded simulators,
/// tests and benches).
pub fn bind_loopback() -> std::io::Result<TcpListener> {
    bind(SocketAddr::from(([127, 0, 0, 1], 0)), DEFAULT_BACKLOG)
}

/// The kernel's cap on a listen backlog (`net.core.somaxconn`), where it can be read.
pub fn somaxconn() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// File descriptors kept aside from client connections: the admin listener's connections, the
/// access log, simulators, the runtime's own.
const FD_RESERVE: u64 = 128;

/// The process's open-file limit (soft, hard), where the platform says.
pub fn fd_limit() -> Option<(u64, u64)> {
    #[cfg(unix)]
    {
        rlimit::getrlimit(rlimit::Resource::NOFILE).ok()
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// Raises the soft open-file limit to the hard one (as Go's runtime and nginx's
/// `worker_rlimit_nofile` do): a process-wide change, made by the `serve` command only. Returns
/// the soft limit in force afterwards.
pub fn raise_fd_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        rlimit::increase_nofile_limit(u64::MAX).ok()
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// `max_connections` as the open-file limit allows: each client connection may need one upstream
/// connection too, after `FD_RESERVE`. Out of descriptors, accept fails for the admin listener
/// as well, so the cap keeps `/healthz` answering.
pub fn connections_within_fd_limit(configured: usize) -> usize {
    match fd_limit() {
        Some((soft, _)) => {
            let fit = usize::try_from(soft.saturating_sub(FD_RESERVE) / 2).unwrap_or(usize::MAX);
            configured.min(fit.max(1))
        }
        None => configured,
    }
}

/// Drives a connection until it ends, or closes it gracefully (HTTP/1: at once when idle; h2:
/// GOAWAY) and reports `None` when no request is open and it stays silent past the idle timeout,
/// or when no first request head arrives in time; a close that does not finish within a second
/// drops the connection. Checks every half timeout, so a silent connection is closed between 1
/// and 1.5 timeouts after its last byte. On `stop` (shutdown) it closes gracefully and keeps
/// driving the requests in flight.
async fn supervise<C>(
    conn: C,
    state: &ConnState,
    opts: &ServerOptions,
    accepted: Instant,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Option<Result<(), ConnError>>
where
    C: GracefulConnection<Error = ConnError>,
{
    tokio::pin!(conn);
    let first = opts.header_read_timeout;
    let idle = opts.idle_timeout;
    let tick = [first, idle]
        .into_iter()
        .flatten()
        .min()
        .map(|t| (t / 2).max(Duration::from_millis(5)));
    let mut last_ops = 0;
    let mut quiet_since = accepted;
    let mut stopping = false;
    loop {
        let check = async {
            match tick {
                Some(t) if !stopping => tokio::time::sleep(t).await,
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            r = conn.as_mut() => return Some(r),
            _ = stop.changed(), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
                continue;
            }
            // It sent no request: nothing to finish, closed at once.
            () = state.evict.notified() => return None,
            () = check => {}
        }
        let now = Instant::now();
        let ops = state.io_ops.load(Ordering::Relaxed);
        if ops != last_ops {
            last_ops = ops;
            quiet_since = now;
        }
        if state.open.load(Ordering::Relaxed) > 0 {
            // Requests are open: the connection is closed only when a response waits on the
            // client — its head or a frame handed on and the body not polled since (a zero-window
            // h2 stream, a client that stopped reading) — for `STALL_IDLE_TIMEOUTS` idle
            // timeouts. A request waiting for its backend is the route's timeouts' business.
            let (Some(limit), Some(tick)) = (idle.map(|t| t * STALL_IDLE_TIMEOUTS), tick) else {
                continue;
            };
            let tick_now = state.tick();
            let stuck = state
                .oldest_wait(tick_now)
                .is_some_and(|ticks| tick * u32::try_from(ticks).unwrap_or(u32::MAX) >= limit);
            if stuck {
                state.cut_stalled.0.store(true, Ordering::Relaxed);
                opts.counters.closed_stalled.fetch_add(1, Ordering::Relaxed);
                return Some(Ok(()));
            }
            continue;
        }
        let no_first_request = state.requests.load(Ordering::Relaxed) == 0
            && first.is_some_and(|t| now.duration_since(accepted) >= t);
        let silent = idle.is_some_and(|t| now.duration_since(quiet_since) >= t);
        if no_first_request || silent {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(Duration::from_secs(1), conn.as_mut()).await;
            return None;
        }
    }
}

/// A connection that ended with an error: when the HTTP layer refused a request head, that is a
/// request the access log must show.
fn refused(
    e: &ConnError,
    state: &ConnState,
    opts: &ServerOptions,
    peer: SocketAddr,
    accepted: Instant,
) {
    let Some(h) = crate::util::errors::find::<hyper::Error>(e.as_ref()) else {
        tracing::debug!(error = %e, "connection ended with an error");
        return;
    };
    let (status, kind) = if h.is_parse_too_large() {
        (431, "request_head_too_large")
    } else if h.is_parse() || h.is_parse_status() {
        (400, "bad_request_head")
    } else if h.is_timeout() && state.partial_head() {
        (408, "header_read_timeout")
    } else {
        tracing::debug!(error = %e, "connection ended with an error");
        return;
    };
    report(opts, peer, status, kind, accepted);
}

fn report(
    opts: &ServerOptions,
    peer: SocketAddr,
    status: u16,
    kind: &'static str,
    accepted: Instant,
) {
    opts.counters.refused.fetch_add(1, Ordering::Relaxed);
    if let Some(f) = &opts.on_refused {
        f(Refused {
            peer,
            status,
            kind,
            accepted,
        });
    }
}

/// Exponential back-off for failing `accept` calls (5 ms doubling to 1 s), logging at most once
/// per 10 s with the number of failures since the last line.
#[derive(Debug)]
struct AcceptBackoff {
    pause: Duration,
    log: crate::util::errors::Sparse,
}

impl Default for AcceptBackoff {
    fn default() -> Self {
        Self {
            pause: Duration::ZERO,
            log: crate::util::errors::Sparse::every(Duration::from_secs(10)),
        }
    }
}

impl AcceptBackoff {
    fn failed(&mut self, e: &std::io::Error) -> Duration {
        self.pause = (self.pause * 2).clamp(Duration::from_millis(5), Duration::from_secs(1));
        if let Some(failures) = self.log.hit() {
            tracing::warn!(error = %e, failures, pause_ms = self.pause.as_millis() as u64, "accept failed; backing off");
        }
        self.pause
    }

    fn reset(&mut self) {
        self.pause = Duration::ZERO;
    }
}

/// What the supervisor knows of a connection: IO progress (counted, not timed: no clock read per
/// read or write), requests open and requests seen.
#[derive(Debug, Default)]
struct ConnState {
    io_ops: AtomicU64,
    reads: AtomicU64,
    /// `reads` when the last open request ended.
    reads_when_idle: AtomicU64,
    open: AtomicUsize,
    requests: AtomicU64,
    /// The connection began with the HTTP/2 preface (frames between requests are not heads).
    h2: std::sync::atomic::AtomicBool,
    /// Kernel stamp (`clock::pack`) of the first read since the connection last had no request
    /// open: the read that brought the next head's first byte. 0: none; `UNSTAMPED`: that read
    /// had no stamp.
    head_rx: AtomicU64,
    /// Kernel stamp of the latest read.
    last_rx: AtomicU64,
    /// The supervisor's check count (its clock for `waits`).
    ticks: AtomicU64,
    /// Per open response body: the tick at which it handed a frame on and has not been polled
    /// since (0: not waiting on the client).
    waits: parking_lot::Mutex<Vec<std::sync::Weak<AtomicU64>>>,
    /// Shared with the connection's requests (`StalledCut`).
    cut_stalled: StalledCut,
    /// Shared with the connection's requests.
    writes: Arc<WriteClock>,
    /// Told to close: it waited longest for its first head when a new connection needed room.
    evict: tokio::sync::Notify,
}

/// Connections that have not sent a first request, oldest first: at capacity, the oldest that
/// has waited long enough makes room for a new connection (`evict_waiting_heads`).
#[derive(Debug, Default)]
struct WaitingHeads(std::collections::VecDeque<(Instant, std::sync::Weak<ConnState>)>);

impl WaitingHeads {
    fn push(&mut self, state: &Arc<ConnState>) {
        // Entries leave when they are looked at; past twice what was ever needed, the gone and
        // the served are swept so the queue stays as long as the connections waiting.
        if self.0.len() >= 64 && self.0.len().is_power_of_two() {
            self.0
                .retain(|(_, w)| w.upgrade().is_some_and(|s| s.waits_for_first_head()));
        }
        self.0.push_back((Instant::now(), Arc::downgrade(state)));
    }

    /// Tells the connection that has waited longest for its first head to close, if it has
    /// waited `min_age` at least. True when one was told.
    fn evict_oldest(&mut self, min_age: Duration) -> bool {
        let now = Instant::now();
        while let Some((at, w)) = self.0.front() {
            let Some(state) = w.upgrade().filter(|s| s.waits_for_first_head()) else {
                self.0.pop_front();
                continue;
            };
            if now.duration_since(*at) < min_age {
                return false;
            }
            self.0.pop_front();
            state.evict.notify_one();
            return true;
        }
        false
    }
}

/// `head_rx` when the head's first read carried no stamp.
const UNSTAMPED: u64 = u64::MAX;

impl ConnState {
    /// Advances the supervisor's clock; returns the new tick.
    fn tick(&self) -> u64 {
        self.ticks.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// How many ticks the longest-waiting response frame has waited for the client to take it.
    fn oldest_wait(&self, now: u64) -> Option<u64> {
        let mut waits = self.waits.lock();
        waits.retain(|w| w.strong_count() > 0);
        waits
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .map(|w| w.load(Ordering::Relaxed))
            .filter(|&since| since != 0)
            .map(|since| now.saturating_sub(since))
            .max()
    }

    /// A slot for the wait of a response whose head is handed on now: it waits on the client
    /// until its body is first polled.
    fn register_wait(&self) -> Arc<AtomicU64> {
        let slot = Arc::new(AtomicU64::new(self.ticks.load(Ordering::Relaxed).max(1)));
        let mut waits = self.waits.lock();
        // Ended responses are swept here too (the supervisor sweeps only while requests are
        // open): at each power of two from 32, so a long-lived connection's list stays as long
        // as its open responses, at amortized constant cost.
        if waits.len() >= 32 && waits.len().is_power_of_two() {
            waits.retain(|w| w.strong_count() > 0);
        }
        waits.push(Arc::downgrade(&slot));
        drop(waits);
        slot
    }

    // One writer (the connection's task): plain stores, no locked instruction.
    #[inline]
    fn progressed(&self) {
        let n = self.io_ops.load(Ordering::Relaxed);
        self.io_ops.store(n.wrapping_add(1), Ordering::Relaxed);
    }

    /// No request has come on this connection yet.
    fn waits_for_first_head(&self) -> bool {
        self.requests.load(Ordering::Relaxed) == 0
    }

    /// Bytes arrived since the last request ended but no request is open: part of a head (an
    /// idle keep-alive connection is not one).
    fn partial_head(&self) -> bool {
        !self.h2.load(Ordering::Relaxed)
            && self.open.load(Ordering::Relaxed) == 0
            && self.reads.load(Ordering::Relaxed) > self.reads_when_idle.load(Ordering::Relaxed)
    }

    /// The handshake's reads were not a request head; ALPN `h2` means HTTP/2 frames follow.
    fn after_handshake(&self, alpn: Option<&[u8]>) {
        if alpn == Some(b"h2") {
            self.h2.store(true, Ordering::Relaxed);
        }
        let reads = self.reads.load(Ordering::Relaxed);
        self.reads_when_idle.store(reads, Ordering::Relaxed);
        self.head_rx.store(0, Ordering::Relaxed);
    }

    /// The next read may bring a head's first byte: an HTTP/1 connection with no request open
    /// and nothing read since.
    #[inline]
    fn awaits_head(&self) -> bool {
        self.open.load(Ordering::Relaxed) == 0
            && self.head_rx.load(Ordering::Relaxed) == 0
            && !self.h2.load(Ordering::Relaxed)
    }

    /// A read that moved bytes: `stamp` is its kernel stamp, `first` the stamp of the segment
    /// that carried its first byte (when it was asked for).
    #[inline]
    fn read(&self, stamp: Option<std::time::Instant>, first: Option<std::time::Instant>) {
        self.progressed();
        let n = self.reads.load(Ordering::Relaxed);
        self.reads.store(n + 1, Ordering::Relaxed);
        let packed = stamp.map(crate::clock::pack);
        if let Some(p) = packed {
            self.last_rx.store(p, Ordering::Relaxed);
        }
        if self.open.load(Ordering::Relaxed) == 0 && self.head_rx.load(Ordering::Relaxed) == 0 {
            let head = first.map(crate::clock::pack).or(packed);
            self.head_rx
                .store(head.unwrap_or(UNSTAMPED), Ordering::Relaxed);
        }
    }

    /// The arrival of the request being handed to the service now: over HTTP/1 with no other
    /// request open, the stamp of the read that brought its head's first byte; otherwise (h2,
    /// pipelining) the stamp of the latest read, which carried its head or came after it.
    fn arrival(&self) -> Option<crate::clock::Arrival> {
        let head = self.head_rx.swap(0, Ordering::Relaxed);
        let packed = if self.h2.load(Ordering::Relaxed) || self.open.load(Ordering::Relaxed) > 0 {
            self.last_rx.load(Ordering::Relaxed)
        } else {
            match head {
                UNSTAMPED => 0,
                0 => self.last_rx.load(Ordering::Relaxed),
                p => p,
            }
        };
        crate::clock::unpack(packed).map(crate::clock::Arrival)
    }
}

pin_project! {
    /// A socket that counts the reads and writes that moved bytes, and notes their kernel
    /// receive stamps.
    struct Tracked {
        #[pin]
        inner: crate::clock::StampedTcp,
        state: Arc<ConnState>,
        closing: WritesClosed,
    }
}

impl AsyncRead for Tracked {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let mut this = self.project();
        let before = buf.filled().len();
        if this.state.awaits_head() {
            this.inner.as_mut().get_mut().want_first_byte();
        }
        let r = this.inner.as_mut().poll_read(cx, buf);
        if buf.filled().len() > before {
            if this.state.reads.load(Ordering::Relaxed) == 0
                && buf.filled()[before..].starts_with(b"PRI ")
            {
                this.state.h2.store(true, Ordering::Relaxed);
            }
            this.state.read(this.inner.fresh(), this.inner.first_byte());
        }
        r
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.project();
        this.state.writes.attempted();
        let r = this.inner.poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            this.state.progressed();
        }
        r
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.project();
        this.state.writes.attempted();
        let r = this.inner.poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            this.state.progressed();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }
}

/// Runs the work still waiting for a write attempt when the connection is gone (there will be
/// none).
struct WritesClosed(Arc<WriteClock>);

impl Drop for WritesClosed {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// The service for one connection: counts its open requests (until their response body is
/// dropped) and tags each request with the peer address.
#[derive(Clone)]
struct PerConnection<S> {
    inner: S,
    state: Arc<ConnState>,
    peer: ClientAddr,
}

/// Counts one open request while alive.
struct OpenGuard(Arc<ConnState>);

impl OpenGuard {
    fn new(state: &Arc<ConnState>) -> Self {
        state.open.fetch_add(1, Ordering::Relaxed);
        state.requests.fetch_add(1, Ordering::Relaxed);
        Self(Arc::clone(state))
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        if self.0.open.fetch_sub(1, Ordering::Relaxed) == 1 {
            let reads = self.0.reads.load(Ordering::Relaxed);
            self.0.reads_when_idle.store(reads, Ordering::Relaxed);
        }
    }
}

impl<S, B> Service<Request<Incoming>> for PerConnection<S>
where
    S: Service<Request<Incoming>, Response = Response<B>>,
{
    type Response = Response<Guarded<B>>;
    type Error = S::Error;
    type Future = GuardedFuture<S::Future>;

    fn call(&self, mut req: Request<Incoming>) -> Self::Future {
        if let Some(a) = self.state.arrival() {
            req.extensions_mut().insert(a);
        }
        let guard = OpenGuard::new(&self.state);
        req.extensions_mut().insert(self.peer);
        req.extensions_mut().insert(self.state.cut_stalled.clone());
        req.extensions_mut().insert(Arc::clone(&self.state.writes));
        GuardedFuture {
            inner: self.inner.call(req),
            guard: Some(guard),
        }
    }
}

pin_project! {
    /// The service's future, holding the request's `OpenGuard` until it hands it to the body.
    struct GuardedFuture<F> {
        #[pin]
        inner: F,
        guard: Option<OpenGuard>,
    }
}

impl<F, B, E> Future for GuardedFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<Guarded<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let resp = std::task::ready!(this.inner.poll(cx))?;
        let guard = this.guard.take();
        let wait = guard.as_ref().map(|g| g.0.register_wait());
        Poll::Ready(Ok(resp.map(|inner| Guarded {
            inner,
            wait,
            _guard: guard,
        })))
    }
}

pin_project! {
    /// A response body that keeps its request counted as open until it is dropped, and notes
    /// (in `wait`) when it handed a frame on and was not polled again: the connection waits on
    /// the client.
    struct Guarded<B> {
        #[pin]
        inner: B,
        wait: Option<Arc<AtomicU64>>,
        _guard: Option<OpenGuard>,
    }
}

impl<B: Body> Body for Guarded<B> {
    type Data = B::Data;
    type Error = B::Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let r = this.inner.poll_frame(cx);
        if let (Some(wait), Some(g)) = (this.wait.as_ref(), this._guard.as_ref()) {
            // One writer (the connection's task): plain stores. A frame handed on starts a wait
            // that the next poll ends; the supervisor reads how long the oldest has lasted.
            let since = match &r {
                Poll::Ready(Some(Ok(_))) => g.0.ticks.load(Ordering::Relaxed).max(1),
                _ => 0,
            };
            wait.store(since, Ordering::Relaxed);
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ended_responses_leave_no_trace_in_a_long_lived_connection() {
        let state = ConnState::default();
        // A million short requests on one connection, none open when the supervisor looks.
        for _ in 0..1_000_000 {
            drop(state.register_wait());
        }
        assert!(
            state.waits.lock().len() <= 64,
            "{}",
            state.waits.lock().len()
        );
        // An open response is still seen waiting, and for how long.
        let open = state.register_wait();
        let now = state.tick() + 10;
        assert_eq!(state.oldest_wait(now), Some(10));
        open.store(0, Ordering::Relaxed);
        assert_eq!(state.oldest_wait(now), None);
    }
}
