//! `run(listener, service, options, shutdown)`: accepts connections on an already-bound listener
//! (so tests bind port 0), serves HTTP/1.1 and h2c on each (hyper-util auto), and on shutdown stops
//! accepting, lets in-flight requests finish within the grace period, then returns.
//!
//! Used by the data plane, the admin plane and the simulator alike. TLS arrives in a later change
//! at the `accept` seam below.

use hyper::body::{Body, Incoming};
use hyper::service::Service;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use std::future::Future;
use std::time::Duration;
use tokio::net::TcpListener;

/// Connection-level settings.
#[derive(Debug, Clone, Copy)]
pub struct ServerOptions {
    /// Close an HTTP/1 connection whose request head takes longer than this to arrive.
    pub header_read_timeout: Option<Duration>,
    /// How long in-flight requests may take to finish after shutdown begins.
    pub grace: Duration,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            header_read_timeout: Some(Duration::from_secs(30)),
            grace: Duration::from_secs(30),
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
    builder.http1().timer(TokioTimer::new());
    if let Some(t) = opts.header_read_timeout {
        builder.http1().header_read_timeout(t);
    }
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, _peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Small SSE writes must leave at once: Nagle would hold them for the peer's delayed ACK.
        let _ = stream.set_nodelay(true);
        let builder = builder.clone();
        let service = service.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            if let Err(e) = watcher.watch(conn).await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => true,
        () = tokio::time::sleep(opts.grace) => false,
    }
}
