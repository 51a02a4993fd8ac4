//! The tower layers in front of `ProxyService`: request ids and the in-flight limit.

use crate::meter::Permit;
use crate::util::Ids;
use http::{HeaderValue, Request, Response};
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::sync::Semaphore;
use tower::{Layer, Service};

/// The request's id, set by `RequestIdLayer`.
#[derive(Debug, Clone)]
pub struct RequestId(pub Arc<str>);

/// Header carrying the request id back to the client.
pub const REQUEST_ID_HEADER: &str = "x-inferscope-request-id";

/// Gives every request an id (extension `RequestId`) and returns it as `x-inferscope-request-id`.
#[derive(Debug, Clone)]
pub struct RequestIdLayer {
    ids: Arc<Ids>,
}

impl RequestIdLayer {
    /// A layer drawing ids from `ids`.
    pub fn new(ids: Arc<Ids>) -> Self {
        Self { ids }
    }
}

impl<S> Layer<S> for RequestIdLayer {
    type Service = SetRequestId<S>;
    fn layer(&self, inner: S) -> SetRequestId<S> {
        SetRequestId {
            inner,
            ids: Arc::clone(&self.ids),
        }
    }
}

/// Service of `RequestIdLayer`.
#[derive(Debug, Clone)]
pub struct SetRequestId<S> {
    inner: S,
    ids: Arc<Ids>,
}

impl<S, B, RB> Service<Request<B>> for SetRequestId<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
{
    type Response = Response<RB>;
    type Error = S::Error;
    type Future = WithRequestId<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let id = self.ids.request_id();
        let header = HeaderValue::try_from(id.as_str()).ok();
        req.extensions_mut().insert(RequestId(id.into()));
        WithRequestId {
            inner: self.inner.call(req),
            header,
        }
    }
}

pin_project! {
    /// Response future of `SetRequestId`.
    pub struct WithRequestId<F> {
        #[pin]
        inner: F,
        header: Option<HeaderValue>,
    }
}

impl<F, RB, E> Future for WithRequestId<F>
where
    F: Future<Output = Result<Response<RB>, E>>,
{
    type Output = Result<Response<RB>, E>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut res = ready!(this.inner.poll(cx))?;
        if let Some(h) = this.header.take() {
            res.headers_mut().insert(REQUEST_ID_HEADER, h);
        }
        Poll::Ready(Ok(res))
    }
}

/// Whether the in-flight limit admitted the request (extension set by `InFlightLimitLayer`).
#[derive(Debug, Clone)]
pub enum Admission {
    /// Admitted; the permit lives until the response body ends.
    Admitted(Permit),
    /// The limit was reached: the proxy answers 503 and records `rejected`.
    Full,
}

/// Caps requests in flight, counting each until its response body ends (not just until headers):
/// for streaming inference that is what occupies the gateway. Never queues: over the limit the
/// request is marked `Admission::Full` and the proxy rejects it (so the rejection is recorded like
/// any other request).
#[derive(Debug, Clone)]
pub struct InFlightLimitLayer {
    permits: Arc<Semaphore>,
}

impl InFlightLimitLayer {
    /// A limit of `max` requests.
    pub fn new(max: usize) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(max)),
        }
    }
}

impl<S> Layer<S> for InFlightLimitLayer {
    type Service = InFlightLimit<S>;
    fn layer(&self, inner: S) -> InFlightLimit<S> {
        InFlightLimit {
            inner,
            permits: Arc::clone(&self.permits),
        }
    }
}

/// Service of `InFlightLimitLayer`.
#[derive(Debug, Clone)]
pub struct InFlightLimit<S> {
    inner: S,
    permits: Arc<Semaphore>,
}

impl<S, B> Service<Request<B>> for InFlightLimit<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> S::Future {
        let admission = match Arc::clone(&self.permits).try_acquire_owned() {
            Ok(p) => Admission::Admitted(Arc::new(p)),
            Err(_) => Admission::Full,
        };
        req.extensions_mut().insert(admission);
        self.inner.call(req)
    }
}
