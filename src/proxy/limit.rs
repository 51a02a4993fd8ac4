//! The gateway-wide in-flight limit, as a tower layer inside `MeterLayer`.
//!
//! Not tower's `ConcurrencyLimit`: that one queues callers and releases its permit when the
//! response head is returned, while for streaming inference it is the body that occupies the
//! gateway. This one never queues — above the limit it answers 503 with `Retry-After` itself
//! (recorded as `rejected`, `overloaded`) — and its permit is held by the request's meter until
//! the response body ends.

use super::error::ProxyError;
use super::service::{ProxyBody, ProxyFuture};
use crate::meter::Annotations;
use http::Request;
use http_body_util::Either;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::Semaphore;
use tower::{Layer, Service};

/// Caps requests in flight, counting each until its response body ends.
#[derive(Debug, Clone)]
pub struct InFlightLimitLayer(Arc<Semaphore>);

impl InFlightLimitLayer {
    /// A limit of `max` requests.
    pub fn new(max: usize) -> Self {
        Self(Arc::new(Semaphore::new(max)))
    }
}

impl<S> Layer<S> for InFlightLimitLayer {
    type Service = InFlightLimit<S>;
    fn layer(&self, inner: S) -> InFlightLimit<S> {
        InFlightLimit(inner, Arc::clone(&self.0))
    }
}

/// Service of `InFlightLimitLayer`: the inner service and the permits.
#[derive(Debug, Clone)]
pub struct InFlightLimit<S>(S, Arc<Semaphore>);

impl<S, B> Service<Request<B>> for InFlightLimit<S>
where
    S: Service<
        Request<B>,
        Response = http::Response<ProxyBody>,
        Error = std::convert::Infallible,
        Future = ProxyFuture,
    >,
{
    type Response = http::Response<ProxyBody>;
    type Error = std::convert::Infallible;
    type Future = ProxyFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> ProxyFuture {
        let notes = req.extensions().get::<Annotations>().cloned();
        match (Arc::clone(&self.1).try_acquire_owned(), notes) {
            (Ok(permit), Some(notes)) => {
                notes.hold(permit);
                self.0.call(req)
            }
            // Not measured (no `MeterLayer` outside): hold the permit until the response head.
            (Ok(permit), None) => {
                let fut = self.0.call(req);
                Box::pin(async move {
                    let r = fut.await;
                    drop(permit);
                    r
                })
            }
            (Err(_), notes) => {
                let e = ProxyError::Overloaded;
                if let Some(n) = notes {
                    n.refuse(e.outcome(), e.kind());
                }
                let resp = e.into_response().map(Either::Right);
                Box::pin(std::future::ready(Ok(resp)))
            }
        }
    }
}
