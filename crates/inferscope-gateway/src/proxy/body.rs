//! Request bodies a client controls, bounded: how fast they must arrive (`Pace`: a longest
//! silence and, after a grace period, a slowest average rate — as Kestrel's
//! `MinRequestBodyDataRate`), how large one may be, and how much of them the gateway holds at once
//! across all requests (`BodyBudget`). Inference bodies are read whole (`read_whole`); every other
//! body streams through `PacedBody` under the same pace.

use super::error::ProxyError;
use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

/// Time a body may take before the minimum rate applies.
pub const RATE_GRACE: Duration = Duration::from_secs(5);

/// Under pressure (`limit::Slots::pressured`) the minimum rate is this many times higher…
pub(super) const PRESSURE_RATE_FACTOR: u64 = 8;
/// …and applies after this grace instead of `RATE_GRACE` (as Envoy's overload manager shortens
/// timeouts when resources run low): a body that keeps a slot at just above the relaxed pace is
/// cut once slots run out.
pub(super) const PRESSURE_GRACE: Duration = Duration::from_secs(1);

/// How often a body waiting at the relaxed pace looks again whether pressure has come.
const PRESSURE_RECHECK: Duration = Duration::from_millis(250);

/// The pace a request body must keep.
#[derive(Debug, Clone)]
pub struct Pace {
    /// Longest silence between body bytes (and before the first).
    pub silence: Duration,
    /// Slowest average rate after `RATE_GRACE`, bytes/s (0: no minimum).
    pub min_rate: u64,
    /// The slots whose pressure tightens the rate (`None`: never tightened).
    pub slots: Option<Arc<super::limit::Slots>>,
}

/// One body's progress against its `Pace`.
#[derive(Debug, Clone)]
struct Progress {
    pace: Pace,
    started: Instant,
    last: Instant,
    received: u64,
}

impl Progress {
    fn new(pace: Pace) -> Self {
        let now = Instant::now();
        Self {
            pace,
            started: now,
            last: now,
            received: 0,
        }
    }

    fn got(&mut self, n: usize) {
        self.received += n as u64;
        self.last = Instant::now();
    }

    /// When the body is too slow unless more bytes arrive first, at the pace that holds now.
    fn deadline(&self) -> Instant {
        let pressured = self.pace.slots.as_ref().is_some_and(|s| s.pressured());
        self.deadline_at(pressured)
    }

    fn deadline_at(&self, pressured: bool) -> Instant {
        // A year stands in for "never" (a configured duration may not fit an `Instant`).
        let never = || self.last + Duration::from_secs(365 * 86_400);
        let silent = self
            .last
            .checked_add(self.pace.silence)
            .unwrap_or_else(never);
        if self.pace.min_rate == 0 {
            return silent;
        }
        let (rate, grace) = if pressured {
            (
                self.pace.min_rate.saturating_mul(PRESSURE_RATE_FACTOR),
                PRESSURE_GRACE,
            )
        } else {
            (self.pace.min_rate, RATE_GRACE)
        };
        // rate = received / elapsed falls below the minimum once elapsed > received / min_rate.
        let earned = Duration::try_from_secs_f64(self.received as f64 / rate as f64)
            .unwrap_or(Duration::MAX)
            .max(grace);
        silent.min(self.started.checked_add(earned).unwrap_or_else(never))
    }

    /// When to look again: the deadline, or sooner while pressure could still come and tighten
    /// it.
    fn wake(&self) -> Instant {
        let deadline = self.deadline();
        match &self.pace.slots {
            Some(s) if self.pace.min_rate > 0 && !s.pressured() => {
                deadline.min(Instant::now() + PRESSURE_RECHECK)
            }
            _ => deadline,
        }
    }

    /// The body has fallen behind the pace that holds now.
    fn too_slow(&self) -> bool {
        Instant::now() >= self.deadline()
    }
}

/// Request bodies held in memory across all requests, against a cap.
#[derive(Debug)]
pub struct BodyBudget {
    held: AtomicUsize,
    max: usize,
}

impl BodyBudget {
    /// A budget of `max` bytes.
    pub fn new(max: usize) -> Self {
        Self {
            held: AtomicUsize::new(0),
            max,
        }
    }

    /// Bytes held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Takes `n` more bytes for `r`, or refuses when the cap would be passed.
    fn grow(self: &Arc<Self>, r: &mut Reservation, n: usize) -> Result<(), ProxyError> {
        let mut cur = self.held.load(Ordering::Relaxed);
        loop {
            let next = cur.saturating_add(n);
            if next > self.max {
                return Err(ProxyError::BodyBudget);
            }
            match self
                .held
                .compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(now) => cur = now,
            }
        }
        r.bytes += n;
        Ok(())
    }
}

/// Bytes of the `BodyBudget` one request holds; given back when dropped (the request's meter
/// keeps it until the response ends, since the body is kept for retries).
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<BodyBudget>,
    bytes: usize,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// Reads a whole body of at most `limit` bytes at `pace`, holding its bytes against `budget` as
/// they arrive. (Not the declared length up front: heads alone, cheap to send, would then
/// reserve the budget and refuse everyone else until their bodies timed out.)
pub(super) async fn read_whole<B>(
    body: B,
    limit: usize,
    declared: Option<u64>,
    pace: Pace,
    budget: &Arc<BodyBudget>,
) -> Result<(Bytes, Reservation), ProxyError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<crate::meter::BoxError>,
{
    let mut reservation = Reservation {
        budget: Arc::clone(budget),
        bytes: 0,
    };
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ProxyError::BodyTooLarge(limit));
    }
    let mut progress = Progress::new(pace);
    // One frame is kept as it came; from the second on, the bytes are copied into one buffer as
    // they arrive (once, as joining them at the end would). A frame is a slice of the connection's
    // read buffer: kept as slices, a body dripped a few bytes at a time would pin a whole read
    // buffer per drip, far more memory than the bytes the budget counts.
    let mut first: Option<Bytes> = None;
    let mut joined: Option<BytesMut> = None;
    let mut len = 0usize;
    tokio::pin!(body);
    loop {
        let frame = match tokio::time::timeout_at(progress.wake(), body.frame()).await {
            Err(_) if progress.too_slow() => return Err(ProxyError::BodyTimeout),
            Err(_) => continue,
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                let e: crate::meter::BoxError = e.into();
                return Err(if client_left(e.as_ref()) {
                    ProxyError::ClientGone
                } else {
                    ProxyError::BodyRead
                });
            }
            Ok(Some(Ok(f))) => f,
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers: nothing to keep
        };
        progress.got(data.len());
        len += data.len();
        if len > limit {
            return Err(ProxyError::BodyTooLarge(limit));
        }
        let more = len.saturating_sub(reservation.bytes);
        if more > 0 {
            budget.grow(&mut reservation, more)?;
        }
        match (&mut joined, first.take()) {
            (Some(b), _) => b.extend_from_slice(&data),
            (None, None) => first = Some(data),
            (None, Some(f)) => {
                // Grown as bytes arrive, not sized by the declared length: a head alone must not
                // make the gateway allocate.
                let mut b = BytesMut::with_capacity(len);
                b.extend_from_slice(&f);
                b.extend_from_slice(&data);
                joined = Some(b);
            }
        }
    }
    let bytes = match (joined, first) {
        (Some(b), _) => b.freeze(),
        (None, Some(f)) => f,
        (None, None) => Bytes::new(),
    };
    Ok((bytes, reservation))
}

/// The body failed because the client went away (the connection ended before the body did).
fn client_left(e: &(dyn std::error::Error + 'static)) -> bool {
    use std::io::ErrorKind as K;
    let incomplete = crate::util::errors::find::<hyper::Error>(e)
        .is_some_and(hyper::Error::is_incomplete_message);
    let io = crate::util::errors::find::<std::io::Error>(e).map(std::io::Error::kind);
    incomplete
        || matches!(
            io,
            Some(K::UnexpectedEof | K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe)
        )
}

/// A request body too slow for its pace.
#[derive(Debug, thiserror::Error)]
#[error("the request body arrived too slowly")]
pub struct TooSlow;

pin_project! {
    /// A streamed request body that fails (`TooSlow`) when the client does not keep `Pace`.
    /// `Unpin` when `B` is (its timer is boxed): an HTTP/2 upstream connection needs that.
    pub struct PacedBody<B> {
        #[pin]
        inner: B,
        timer: Pin<Box<Sleep>>,
        progress: Progress,
        // The last poll returned a frame: a wait starts now.
        fresh: bool,
    }
}

impl<B> PacedBody<B> {
    /// `inner` at `pace`, from now.
    pub fn new(inner: B, pace: Pace) -> Self {
        let progress = Progress::new(pace);
        Self {
            inner,
            timer: Box::pin(tokio::time::sleep_until(progress.wake())),
            progress,
            fresh: true,
        }
    }
}

impl<B> std::fmt::Debug for PacedBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PacedBody")
            .field("progress", &self.progress)
            .finish_non_exhaustive()
    }
}

impl<B> Body for PacedBody<B>
where
    B: Body,
    B::Error: Into<crate::meter::BoxError>,
{
    type Data = B::Data;
    type Error = crate::meter::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref() {
                    this.progress.got(bytes::Buf::remaining(d));
                    this.timer.as_mut().reset(this.progress.wake());
                }
                *this.fresh = true;
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                // Not polled for a while (the upstream was not ready for more): the client's
                // pace is judged from now, not from before the gateway stopped reading.
                if std::mem::take(this.fresh) && this.timer.deadline() <= Instant::now() {
                    let at = Instant::now() + this.progress.pace.silence.min(RATE_GRACE);
                    this.timer.as_mut().reset(at);
                }
                loop {
                    match this.timer.as_mut().poll(cx) {
                        Poll::Ready(()) if this.progress.too_slow() => {
                            return Poll::Ready(Some(Err(Box::new(TooSlow))))
                        }
                        // Woken to look whether pressure came: not too slow yet.
                        Poll::Ready(()) => this.timer.as_mut().reset(this.progress.wake()),
                        Poll::Pending => return Poll::Pending,
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
