//! `MeteredBody`: wraps the upstream response body, timestamps each frame in `poll_frame`, hands
//! the same data on at once (a `Bytes`, or a `Batch` of them: what one upstream read brought, one
//! stamp for all its pieces), and finalizes the request's record exactly once — at the end of the
//! body, on a body error, or on drop (the client went away).
//!
//! A stream that breaks (the upstream body fails, or a deadline passes) is not ended cleanly:
//! after the bytes that arrived, the body returns an error, so the server aborts the response —
//! HTTP/1 closes the connection without the terminating chunk, h2 resets the stream — and the
//! client can tell a cut-off response from a complete one (as nginx and Envoy do).
//!
//! The one exception to "forward as-is": when the gateway injected `stream_options.include_usage`,
//! the extra usage-only event is cut out of the stream (by slicing the `Bytes`, not copying). To
//! do that, while that event has not been seen, an incomplete trailing event is held back until
//! its end arrives — at most one event's bytes, for at most the time the backend takes to finish
//! writing it.

use super::batch::Parts;
use super::measure::{End, Meter, StripPlan};
use bytes::{Buf, Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use inferscope_wire::sse::OpenBlock;
use pin_project_lite::pin_project;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::time::Instant;
use tokio::time::Sleep;

pin_project! {
    /// An `http_body::Body` that measures the body it wraps without buffering it.
    pub struct MeteredBody<B> {
        #[pin]
        inner: B,
        // Boxed: the response that carries this body is moved through the server's queues
        // several times before its first frame; the meter would be ~1.8 KB of each move.
        meter: Option<Box<Meter>>,
        // Strip mode only: the start of an incomplete event, and frames decided but not returned.
        held: Option<Bytes>,
        // Strip mode only: the open event outgrew `max_event_bytes` (so it is not the small
        // usage chunk) and was handed on; the rest of it passes without being held.
        passing: bool,
        queue: VecDeque<Bytes>,
        upstream_done: bool,
        // How the body ended when that is decided before the last bytes are handed on (a body
        // error or a timeout with frames still queued): the record is written once they are.
        ending: Option<End>,
        // The stream is to be aborted (after what is queued) for this reason.
        abort: Option<&'static str>,
        // The abort yielded once, so the server could flush what was handed on before it.
        abort_yielded: bool,
        // Deadlines (first token, idle, total): one timer, re-armed per frame, never reallocated.
        timer: Option<Pin<Box<Sleep>>>,
        last_frame: Instant,
        // The upstream body's trailers: its end (a server writes them and drops the body), so
        // they go last, after what is queued and after the record is written.
        trailers: Option<http::HeaderMap>,
    }

    impl<B> PinnedDrop for MeteredBody<B> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(meter) = this.meter.take() {
                let handed_all = this.queue.is_empty() && this.held.is_none();
                let end = match this.ending.take() {
                    Some(end) => end,
                    // Clients may close as soon as they have everything they need, without
                    // reading the end of the body (Python clients stop at `[DONE]`; a client
                    // that got a `content-length: 0` head reads nothing). The response was
                    // whole when every byte was handed on and the upstream body had ended, or
                    // when its terminal event was.
                    None if handed_all && (*this.upstream_done || meter.terminal_seen()) => {
                        End::Complete
                    }
                    None => End::Dropped,
                };
                meter.finish(end);
            }
        }
    }
}

impl<B: Body> MeteredBody<B> {
    /// Wraps `inner` without measuring it (a response metered already).
    pub(crate) fn unmetered(inner: B) -> Self {
        Self {
            inner,
            meter: None,
            held: None,
            passing: false,
            queue: VecDeque::new(),
            upstream_done: false,
            ending: None,
            abort: None,
            abort_yielded: false,
            timer: None,
            last_frame: Instant::now(),
            trailers: None,
        }
    }

    /// Wraps `inner`, feeding its frames to `meter`.
    pub fn new(inner: B, meter: Box<Meter>) -> Self {
        let now = Instant::now();
        // An empty body (`content-length: 0`) has ended already: servers write its head and
        // drop it without polling, and that is a complete response.
        let upstream_done = inner.is_end_stream();
        let timer = next_deadline(&meter, now).map(|at| Box::pin(tokio::time::sleep_until(at)));
        Self {
            inner,
            meter: Some(meter),
            held: None,
            passing: false,
            queue: VecDeque::new(),
            upstream_done,
            ending: None,
            abort: None,
            abort_yielded: false,
            timer,
            last_frame: now,
            trailers: None,
        }
    }
}

/// The earliest deadline still to watch.
fn next_deadline(m: &Meter, now: Instant) -> Option<Instant> {
    let d = m.deadlines;
    [
        d.idle.map(|i| now + i),
        d.first_token.filter(|_| !m.has_output()),
        d.total,
    ]
    .into_iter()
    .flatten()
    .min()
}

/// Which deadline has passed, if any.
fn expired(m: &Meter, last_frame: Instant, now: Instant) -> Option<&'static str> {
    let d = m.deadlines;
    if d.total.is_some_and(|t| now >= t) {
        Some("total_timeout")
    } else if !m.has_output() && d.first_token.is_some_and(|t| now >= t) {
        Some("first_token_timeout")
    } else if d.idle.is_some_and(|i| now >= last_frame + i) {
        Some("idle_timeout")
    } else {
        None
    }
}

/// Formats a body error without requiring `Display` of every body type.
struct DisplayErr<'a, E>(&'a E);

impl<E: std::fmt::Debug> std::fmt::Display for DisplayErr<'_, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// The error a broken stream ends with: the server aborts the response instead of ending it.
#[derive(Debug, thiserror::Error)]
#[error("response stream aborted: {0}")]
pub struct StreamAborted(pub &'static str);

/// Errors of `MeteredBody`.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<B> Body for MeteredBody<B>
where
    B: Body,
    B::Data: Parts,
    B::Error: std::fmt::Debug,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, BoxError>>> {
        let mut this = self.project();
        loop {
            if let Some(bytes) = this.queue.pop_front() {
                // What is decided goes on together, as it came (one read's worth, less the cut).
                let data = B::Data::gather(bytes, this.queue);
                if let Some(m) = this.meter.as_mut() {
                    m.sent(data.remaining());
                }
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            if *this.upstream_done {
                if let Some(m) = this.meter.take() {
                    m.finish(this.ending.take().unwrap_or(End::Complete));
                }
                if let Some(kind) = *this.abort {
                    // Servers write what they buffered when the body is not ready: yield once,
                    // so the bytes that arrived reach the client before the abort discards the
                    // connection (HTTP/1) or the stream (h2).
                    if !*this.abort_yielded {
                        *this.abort_yielded = true;
                        cx.waker().wake_by_ref();
                        return Poll::Pending;
                    }
                    *this.abort = None;
                    return Poll::Ready(Some(Err(Box::new(StreamAborted(kind)))));
                }
                return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))));
            }
            let polled = match this.inner.as_mut().poll_frame(cx) {
                Poll::Ready(item) => item,
                Poll::Pending => {
                    let (Some(timer), Some(m)) = (this.timer.as_mut(), this.meter.as_ref()) else {
                        return Poll::Pending;
                    };
                    if timer.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    let now = Instant::now();
                    match expired(m, *this.last_frame, now) {
                        Some(kind) => {
                            // Abort the client's stream after what arrived; the upstream body
                            // is dropped with this body, which closes its connection.
                            *this.upstream_done = true;
                            *this.ending = Some(End::TimedOut(kind));
                            *this.abort = Some(kind);
                            if let Some(h) = this.held.take() {
                                this.queue.push_back(h);
                            }
                            *this.timer = None;
                            continue;
                        }
                        None => {
                            if let Some(at) = next_deadline(m, *this.last_frame) {
                                timer.as_mut().reset(at);
                                cx.waker().wake_by_ref();
                            }
                            return Poll::Pending;
                        }
                    }
                }
            };
            match polled {
                None => {
                    *this.upstream_done = true;
                    // A held, never-completed event is still the client's: forward it.
                    if let Some(h) = this.held.take() {
                        this.queue.push_back(h);
                    }
                }
                Some(Err(e)) => {
                    // The upstream broke mid-body: abort the client's stream after what arrived
                    // (never a fabricated `[DONE]`), and record it as truncated.
                    tracing::debug!(error = %DisplayErr(&e), "upstream body failed");
                    *this.upstream_done = true;
                    *this.ending = Some(End::BodyError);
                    *this.abort = Some("upstream_body_error");
                    if let Some(h) = this.held.take() {
                        this.queue.push_back(h);
                    }
                }
                Some(Ok(frame)) => {
                    let data = match frame.into_data().map_err(Frame::into_trailers) {
                        Ok(data) => data,
                        // Trailers end the body: what is held goes first, then the record is
                        // written, then the trailers are handed on.
                        Err(trailers) => {
                            *this.trailers = trailers.ok();
                            *this.upstream_done = true;
                            if let Some(h) = this.held.take() {
                                this.queue.push_back(h);
                            }
                            continue;
                        }
                    };
                    let now = Instant::now();
                    let Some(m) = this.meter.as_mut() else {
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    };
                    *this.last_frame = now;
                    // A body of known length ends with its last byte: hyper may never poll again.
                    let last = this.inner.is_end_stream();
                    if !m.stripping() && this.held.is_none() {
                        // Every piece of a frame was here when it was polled: one stamp for all.
                        m.observe_parts(data.parts(), now);
                        // A frame leaves no deadline earlier than the armed one: the idle
                        // deadline moves on with every frame, the first-token one goes once
                        // output is seen, the total one stays, and the timer was armed from an
                        // earlier frame (or the start). So a frame never touches the timer; when
                        // it fires, the pending arm above re-arms it from the last frame. No
                        // timer-wheel update, and no deadline arithmetic, per frame.
                        debug_assert!(!matches!(
                            (this.timer.as_ref(), next_deadline(m, now)),
                            (Some(timer), Some(at)) if at < timer.deadline()
                        ));
                        m.sent(data.remaining());
                        if last {
                            *this.upstream_done = true;
                            if let Some(m) = this.meter.take() {
                                m.finish(End::Complete);
                            }
                        }
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                    // Stripping (or holding): a piece at a time, through the queue.
                    for piece in data.parts() {
                        let stripping = m.stripping();
                        let mut plan = m.observe(piece, now);
                        if !stripping && this.held.is_none() {
                            if !piece.is_empty() {
                                this.queue.push_back(piece.clone());
                            }
                            continue;
                        }
                        let mut hold = m.stripping();
                        if std::mem::take(this.passing) {
                            // The event handed on went out whole from its start: never cut its
                            // tail.
                            if plan.drop.is_some_and(|(start, _)| start.is_none()) {
                                plan.drop = None;
                            }
                            // Still inside it: let it pass.
                            if plan.open == Some(OpenBlock::Earlier) {
                                hold = false;
                                *this.passing = true;
                            }
                        }
                        *this.held = strip(this.held.take(), piece.clone(), plan, hold, this.queue);
                        // What is held is bounded by the longest event measured: an event longer
                        // than that is not the usage chunk, so it is handed on now rather than
                        // held (and re-copied) until it ends.
                        if this
                            .held
                            .as_ref()
                            .is_some_and(|h| h.len() > m.max_event_bytes())
                        {
                            if let Some(h) = this.held.take() {
                                this.queue.push_back(h);
                            }
                            *this.passing = true;
                        }
                    }
                    if last {
                        *this.upstream_done = true;
                        if let Some(h) = this.held.take() {
                            this.queue.push_back(h);
                        }
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // Claimed only once the record is written, so the end is never reported before it.
        self.meter.is_none()
            && self.abort.is_none()
            && self.queue.is_empty()
            && self.held.is_none()
            && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        if self.held.is_some() || self.meter.as_deref().is_some_and(Meter::stripping) {
            SizeHint::default()
        } else {
            self.inner.size_hint()
        }
    }
}

/// Splits `held ++ data` into what goes to the client now (pushed on `queue`), what is dropped
/// (the injected usage event) and what stays held (an incomplete trailing event, while `hold`).
fn strip(
    held: Option<Bytes>,
    data: Bytes,
    plan: StripPlan,
    hold: bool,
    queue: &mut VecDeque<Bytes>,
) -> Option<Bytes> {
    let h = held.as_ref().map_or(0, Bytes::len);
    let total = h + data.len();
    let drop = plan.drop.map(|(s, e)| (s.map_or(0, |s| h + s), h + e));
    let hold_from = match (hold, plan.open) {
        (true, Some(OpenBlock::At(t))) => h + t,
        (true, Some(OpenBlock::Earlier)) => 0,
        _ => total,
    };
    let piece = |a: usize, b: usize, queue: &mut VecDeque<Bytes>| {
        if let Some(held) = &held {
            if a < h {
                queue.push_back(held.slice(a..b.min(h)));
            }
        }
        if b > h {
            queue.push_back(data.slice(a.max(h) - h..b - h));
        }
    };
    match drop {
        Some((ds, de)) => {
            if ds > 0 {
                piece(0, ds, queue);
            }
            if hold_from > de {
                piece(de, hold_from, queue);
            }
        }
        None if hold_from > 0 => piece(0, hold_from, queue),
        None => {}
    }
    queue.retain(|b| !b.is_empty());
    if hold_from >= total {
        None
    } else if hold_from >= h {
        Some(data.slice(hold_from - h..))
    } else {
        // The incomplete event spans frames: join its pieces (rare; bounded by one event).
        let mut joined = BytesMut::with_capacity(total - hold_from);
        if let Some(held) = &held {
            joined.extend_from_slice(&held[hold_from..]);
        }
        joined.extend_from_slice(&data);
        Some(joined.freeze())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(
        held: Option<&'static [u8]>,
        data: &'static [u8],
        plan: StripPlan,
        hold: bool,
    ) -> (Vec<u8>, Option<Vec<u8>>) {
        let mut q = VecDeque::new();
        let held = strip(
            held.map(Bytes::from_static),
            Bytes::from_static(data),
            plan,
            hold,
            &mut q,
        );
        (
            q.iter().flat_map(|b| b.to_vec()).collect(),
            held.map(|b| b.to_vec()),
        )
    }

    #[test]
    fn drops_the_usage_event_and_holds_an_incomplete_tail() {
        let plan = StripPlan {
            drop: Some((Some(4), 8)),
            open: Some(OpenBlock::At(10)),
        };
        assert_eq!(
            run(None, b"aaaaUUUUbbcc", plan, true),
            (b"aaaabb".to_vec(), Some(b"cc".to_vec()))
        );
        let plan = StripPlan {
            drop: Some((None, 2)),
            open: None,
        };
        assert_eq!(
            run(Some(b"UU"), b"UUdd", plan, false),
            (b"dd".to_vec(), None)
        );
        let plan = StripPlan {
            drop: None,
            open: Some(OpenBlock::Earlier),
        };
        assert_eq!(
            run(Some(b"ab"), b"cd", plan, true),
            (Vec::new(), Some(b"abcd".to_vec()))
        );
        let plan = StripPlan {
            drop: None,
            open: None,
        };
        assert_eq!(
            run(Some(b"ab"), b"cd", plan, false),
            (b"abcd".to_vec(), None)
        );
    }
}
