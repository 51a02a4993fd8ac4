//! The gateway-wide in-flight limit, as a tower layer inside `MeterLayer`, and fair shares of it
//! under pressure.
//!
//! Not tower's `ConcurrencyLimit`: that one queues callers and releases its permit when the
//! response head is returned, while for streaming inference it is the body that occupies the
//! gateway. This one never queues — above the limit it answers 503 with `Retry-After` itself
//! (recorded as `rejected`, `overloaded`) — and its permit is held by the request's meter until
//! the response body ends.
//!
//! **Shares.** Once `overload_at` of the slots are taken, a client address that already holds its
//! fair share while another address waits — the slots divided by the addresses holding any or
//! refused for want of room within 2 s — gets 503 `client_share` instead of one more; so does a
//! key holding its share among the keys holding any. One address cannot take the rest while
//! others wait, and a deployment whose traffic all comes from one address (a load balancer)
//! keeps every slot, its fair share being all of them. The same pressure tightens the pace
//! request bodies must keep (`body::Pace`).

use super::error::ProxyError;
use super::service::{ProxyBody, ProxyFuture};
use crate::meter::Annotations;
use crate::util::shares::Shares;
use http::Request;
use http_body_util::Either;
use std::net::IpAddr;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::Semaphore;
use tower::{Layer, Service};

/// The gateway's request slots (`limits.max_concurrent_requests`) and their shares.
#[derive(Debug)]
pub struct Slots {
    sem: Arc<Semaphore>,
    max: usize,
    /// Slots taken from which shares and the tighter body pace apply (`max` × `overload_at`,
    /// rounded up; above `max`: never).
    pressure_at: usize,
    /// By client address.
    pub by_client: Arc<Shares<IpAddr>>,
    /// By client key.
    pub by_key: Arc<Shares<Arc<str>>>,
}

impl Slots {
    /// `max` slots, under pressure from `overload_at` (a fraction; 1 or more: shares never
    /// apply).
    pub fn new(max: usize, overload_at: f64) -> Self {
        let pressure_at = if overload_at >= 1.0 {
            usize::MAX
        } else {
            ((max as f64) * overload_at.max(0.0)).ceil() as usize
        };
        Self {
            sem: Arc::new(Semaphore::new(max)),
            max,
            pressure_at,
            by_client: Arc::default(),
            by_key: Arc::default(),
        }
    }

    /// Slots taken now.
    pub fn in_use(&self) -> usize {
        self.max.saturating_sub(self.sem.available_permits())
    }

    /// Enough slots are taken that shares and the tighter body pace apply.
    pub fn pressured(&self) -> bool {
        self.in_use() >= self.pressure_at
    }

    /// `pressured`, for a request that holds one of the slots taken: counting the others.
    pub fn pressured_before_one(&self) -> bool {
        self.in_use().saturating_sub(1) >= self.pressure_at
    }

    /// Shares (and the tighter pace) can apply: `overload_at` is below 1.
    pub fn shares_apply(&self) -> bool {
        self.pressure_at != usize::MAX
    }

    /// All slots.
    pub fn max(&self) -> usize {
        self.max
    }
}

/// Caps requests in flight, counting each until its response body ends; under pressure, each
/// client address to its share.
#[derive(Debug, Clone)]
pub struct InFlightLimitLayer(Arc<Slots>);

impl InFlightLimitLayer {
    /// A limit of `max` requests, with no shares.
    pub fn new(max: usize) -> Self {
        Self(Arc::new(Slots::new(max, 1.0)))
    }

    /// A limit over `slots` (shared with the gateway, which takes keys' shares and paces
    /// bodies by their pressure).
    pub fn over(slots: Arc<Slots>) -> Self {
        Self(slots)
    }
}

impl<S> Layer<S> for InFlightLimitLayer {
    type Service = InFlightLimit<S>;
    fn layer(&self, inner: S) -> InFlightLimit<S> {
        InFlightLimit(inner, Arc::clone(&self.0))
    }
}

/// The service `InFlightLimitLayer` makes.
#[derive(Debug, Clone)]
pub struct InFlightLimit<S>(S, Arc<Slots>);

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
        let slots = &self.1;
        let client = req
            .extensions()
            .get::<crate::server::ClientAddr>()
            .map(|c| c.0.ip());
        let admitted = Arc::clone(&slots.sem)
            .try_acquire_owned()
            .map_err(|_| {
                // Out of room: this client waits, and others' shares make room for it.
                if let Some(ip) = client {
                    slots.by_client.waiting(ip);
                }
                ProxyError::Overloaded
            })
            .and_then(|permit| {
                let pressured = slots.pressured_before_one();
                let share = match client.filter(|_| slots.pressure_at != usize::MAX) {
                    Some(ip) => Some(
                        slots
                            .by_client
                            .admit(ip, slots.max, pressured)
                            .ok_or(ProxyError::ClientShare)?,
                    ),
                    None => None,
                };
                Ok((permit, share))
            });
        match (admitted, notes) {
            (Ok(held), Some(notes)) => {
                notes.hold(held);
                self.0.call(req)
            }
            (Ok(held), None) => {
                let fut = self.0.call(req);
                Box::pin(async move {
                    let r = fut.await;
                    drop(held);
                    r
                })
            }
            (Err(e), notes) => {
                if let Some(n) = notes {
                    n.refuse(e.outcome(), e.kind());
                }
                let resp = e.into_response().map(Either::Right);
                Box::pin(std::future::ready(Ok(resp)))
            }
        }
    }
}
