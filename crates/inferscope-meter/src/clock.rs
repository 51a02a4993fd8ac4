//! The gateway's clock as an instrument: when bytes really arrived, and whether the gateway
//! itself is running late.
//!
//! - **Kernel receive stamps.** On Linux a socket with `SO_TIMESTAMPNS` (set on a listener, its
//!   accepted sockets inherit it) gets, with every `recvmsg`, the software receive time of the
//!   data it returns: when the kernel took the packet, not when this process was scheduled to read
//!   it. `StampedTcp` reads that way and keeps the stamp of its latest read. On a host where the
//!   inference server saturates the cores, the gap between the two is what a user feels and a
//!   user-space clock misses (hundreds of milliseconds, docs/perf-log/).
//!   A read whose packets carry no stamp (stamping is switched on in the kernel's receive path a
//!   moment after the first socket asks for it) leaves the previous stamp in place and returns
//!   nothing new: the caller sees no fresher stamp and falls back to its own clock.
//! - **REALTIME → monotonic.** Kernel stamps are `CLOCK_REALTIME`; measurements run on the
//!   monotonic clock. A stamp converts through the offset between the two read at the moment of
//!   conversion (`stamp_to_instant`). A step of the wall clock (NTP, an operator) changes that
//!   offset: a change beyond what slewing allows since the previous conversion is counted as a
//!   step and that stamp is refused (the caller falls back to its own clock).
//! - **Heartbeat.** How late the gateway gets to work that is due — waiting for a CPU, which a
//!   runtime's busy ratio cannot see: the forward lag of frames handed on while they flow, a
//!   timer's lateness while requests wait in silence, nothing while idle (`Heartbeat`).
//!   It keeps the lateness (a histogram) for `/metrics`, and warns when it passes a threshold, because then every number the gateway reports is suspect by that
//!   much.

use parking_lot::Mutex;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Which clock a request's arrival time comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Source {
    /// The kernel's receive stamp of the read that brought the request's first byte.
    Kernel,
    /// The gateway's own clock when its service was called (no stamp available).
    #[default]
    User,
}

impl Source {
    /// `kernel` or `user`.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Kernel => "kernel",
            Source::User => "user",
        }
    }
}

/// Where the packed timeline (`pack`) starts: an hour before it was first needed, so instants
/// taken a little before that (a request's start, read before its meter packs anything) still
/// pack to what they are.
fn epoch() -> Instant {
    static E: OnceLock<Instant> = OnceLock::new();
    *E.get_or_init(|| {
        let now = Instant::now();
        now.checked_sub(Duration::from_secs(3600)).unwrap_or(now)
    })
}

/// Starts the packed timeline now, unless it has started (instants over an hour before its
/// start all pack to the same value). The metering and the heartbeat start it when made.
pub fn start() {
    epoch();
}

/// An instant packed into a `u64` (nanoseconds from a process epoch, plus one: 0 is "none"), for
/// atomics shared between a socket and its readers.
pub fn pack(t: Instant) -> u64 {
    u64::try_from(t.saturating_duration_since(epoch()).as_nanos())
        .unwrap_or(u64::MAX - 1)
        .saturating_add(1)
}

/// The instant `pack` made, or `None` for 0.
pub fn unpack(v: u64) -> Option<Instant> {
    (v != 0).then(|| epoch() + Duration::from_nanos(v - 1))
}

/// Wall-clock steps seen while converting stamps.
pub static CLOCK_STEPS: AtomicU64 = AtomicU64::new(0);

/// Largest change of the REALTIME − monotonic offset taken for drift, not a step: 1 ms plus what
/// NTP may slew (500 ppm) over the time since the previous conversion.
fn step_tolerance(elapsed: Duration) -> i128 {
    1_000_000 + (elapsed.as_nanos() as i128) / 2000
}

/// A stamp older than this is not believed (a step backwards, or a broken stamp).
const MAX_AGE: Duration = Duration::from_secs(60);

/// The converter's memory: the offset at the previous conversion and when it was read.
static LAST_OFFSET: Mutex<Option<(i128, Instant)>> = Mutex::new(None);

/// Converts a `CLOCK_REALTIME` stamp (time since the Unix epoch) to the monotonic timeline, with
/// the clocks read now. `None` when the stamp cannot be trusted: a wall-clock step since the
/// previous conversion (counted in `CLOCK_STEPS`), or a stamp from the future or over a minute
/// old.
pub(crate) fn stamp_to_instant(stamp: Duration) -> Option<Instant> {
    convert(stamp, SystemTime::now(), Instant::now(), &LAST_OFFSET)
}

fn convert(
    stamp: Duration,
    real_now: SystemTime,
    mono_now: Instant,
    last: &Mutex<Option<(i128, Instant)>>,
) -> Option<Instant> {
    let real_ns = real_now.duration_since(UNIX_EPOCH).ok()?.as_nanos() as i128;
    let mono_ns = mono_now.saturating_duration_since(epoch()).as_nanos() as i128;
    let offset = real_ns - mono_ns;
    {
        let mut prev = last.lock();
        if let Some((o, at)) = *prev {
            if (offset - o).abs() > step_tolerance(mono_now.saturating_duration_since(at)) {
                *prev = Some((offset, mono_now));
                CLOCK_STEPS.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        }
        *prev = Some((offset, mono_now));
    }
    let age = real_ns - stamp.as_nanos() as i128;
    // The kernel stamps before we read the clock; a stamp ahead of it by more than a little is
    // wrong.
    if age < -1_000_000 || age > MAX_AGE.as_nanos() as i128 {
        return None;
    }
    mono_now.checked_sub(Duration::from_nanos(u64::try_from(age.max(0)).ok()?))
}

/// Asks the kernel to stamp what `socket` receives (`SO_TIMESTAMPNS`). On a listener, accepted
/// sockets inherit it. `false` where unsupported.
pub fn enable_rx_stamps(socket: &impl std::os::fd::AsFd) -> bool {
    #[cfg(target_os = "linux")]
    {
        nix::sys::socket::setsockopt(socket, nix::sys::socket::sockopt::ReceiveTimestampns, &true)
            .is_ok()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = socket;
        false
    }
}

/// Largest single stamped read: what is zeroed before each `recvmsg` (hyper's read buffers start
/// at 8 KiB).
const MAX_READ: usize = 16 << 10;
/// Least a stamped read offers.
const MIN_READ: usize = 2 << 10;

/// A TCP stream whose reads carry the kernel's receive stamp: `last_rx` is the stamp of the latest
/// read that returned data (converted to an `Instant`), also published to `rx_cell` for readers
/// elsewhere (the stamp of the latest read that moved bytes, packed). Writes pass through.
#[derive(Debug)]
pub struct StampedTcp {
    inner: TcpStream,
    stamps: bool,
    cmsg: Vec<u8>,
    rx: Arc<AtomicU64>,
    fresh: Option<Instant>,
    /// The next read first peeks at one byte, for the stamp of the segment that carried it
    /// (`first`): set by the server while a connection waits for the next head.
    want_first: bool,
    first: Option<Instant>,
    /// Bytes zeroed and offered to the next `recvmsg`: doubled when a read fills it, halved
    /// when reads use a quarter of it, between `MIN_READ` and `MAX_READ`.
    window: usize,
}

impl StampedTcp {
    /// Wraps `inner`; with `stamps`, reads use `recvmsg` and expect `SO_TIMESTAMPNS` to be on
    /// (inherited from the listener, or `enable_rx_stamps`).
    pub fn new(inner: TcpStream, stamps: bool) -> Self {
        #[cfg(target_os = "linux")]
        let cmsg = if stamps {
            nix::cmsg_space!(nix::sys::time::TimeSpec)
        } else {
            Vec::new()
        };
        #[cfg(not(target_os = "linux"))]
        let (cmsg, stamps) = {
            let _ = stamps;
            (Vec::new(), false)
        };
        Self {
            inner,
            stamps,
            cmsg,
            rx: Arc::new(AtomicU64::new(0)),
            fresh: None,
            want_first: false,
            first: None,
            window: 4 << 10,
        }
    }

    /// Connects to `addr` with receive stamps on.
    pub fn stamped(inner: TcpStream) -> Self {
        let on = enable_rx_stamps(&inner);
        Self::new(inner, on)
    }

    /// The stamp of the latest read, if that read had one (`None` also when it returned no
    /// data).
    pub fn fresh(&self) -> Option<Instant> {
        self.fresh
    }

    /// Asks the next read that returns data to report, in `first_byte`, the stamp of the segment
    /// that carried its first byte.
    ///
    /// A read reports the stamp of the last segment it took: when a client wrote a request's head
    /// and body apart and the gateway read both at once (it was late), that is the body's
    /// arrival. So the first read of a head first peeks at one byte, which takes only the first
    /// segment. The kernel keeps a stamp per buffer, not per segment: a segment merged into the
    /// one before it (on a fresh connection, whose first segments are acknowledged at once)
    /// carries the later stamp, and then so does the peek. One more `recvmsg` per head.
    pub fn want_first_byte(&mut self) {
        self.want_first = self.stamps;
    }

    /// The stamp of the first byte of the latest read, when `want_first_byte` asked for it and
    /// the peek had one.
    pub fn first_byte(&self) -> Option<Instant> {
        self.first
    }

    /// The stamp of the latest read that returned data (`None`: none yet, or stamps off).
    pub fn last_rx(&self) -> Option<Instant> {
        unpack(self.rx.load(Ordering::Relaxed))
    }

    /// The shared cell `last_rx` reads (packed with `pack`).
    pub fn rx_cell(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.rx)
    }

    /// The socket.
    pub fn get_ref(&self) -> &TcpStream {
        &self.inner
    }

    #[cfg(target_os = "linux")]
    fn poll_read_stamped(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        use nix::sys::socket::{recvmsg, MsgFlags};
        use std::os::fd::AsRawFd;
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            std::task::ready!(self.inner.poll_read_ready(cx))?;
            let fd = self.inner.as_raw_fd();
            // A slice must be initialized to be handed to `recvmsg`: only the window is zeroed,
            // not all the spare capacity of a large buffer on every read.
            let want = buf.remaining().min(self.window);
            let dst = buf.initialize_unfilled_to(want);
            let cmsg = &mut self.cmsg;
            let mut short = None;
            let peek = self.want_first;
            let mut first = None;
            let got = self.inner.try_io(tokio::io::Interest::READABLE, || {
                if peek {
                    first = peek_stamp(fd, &mut dst[..1], cmsg)?;
                }
                let mut iov = [io::IoSliceMut::new(dst)];
                let msg = recvmsg::<()>(fd, &mut iov, Some(cmsg), MsgFlags::empty())
                    .map_err(io::Error::from)?;
                let stamp = stamp_of(&msg);
                // A read that did not fill what it offered drained the socket (epoll is
                // edge-triggered): the readiness is cleared, as Tokio's own reads do, by
                // saying "would block" to `try_io` with the data kept aside. Without this the
                // next read is a `recvmsg` that fails with EAGAIN.
                if 0 < msg.bytes && msg.bytes < want {
                    short = Some((msg.bytes, stamp));
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                Ok((msg.bytes, stamp))
            });
            let got = match (got, short) {
                (Err(e), Some(read)) if e.kind() == io::ErrorKind::WouldBlock => Ok(read),
                (got, _) => got,
            };
            match got {
                Ok((n, stamp)) => {
                    buf.advance(n);
                    self.fresh = None;
                    self.first = None;
                    if n > 0 {
                        if let Some(at) = stamp.and_then(stamp_to_instant) {
                            self.rx.store(pack(at), Ordering::Relaxed);
                            self.fresh = Some(at);
                        }
                    }
                    if n > 0 && peek {
                        self.want_first = false;
                        // Usually one segment brought it all: the read's own stamp, converted
                        // once.
                        self.first = match first {
                            Some(f) if Some(f) == stamp => self.fresh,
                            f => f.and_then(stamp_to_instant),
                        };
                    }
                    if n == want {
                        self.window = (self.window * 2).min(MAX_READ);
                    } else if n <= self.window / 4 {
                        self.window = (self.window / 2).max(MIN_READ);
                    }
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

/// The kernel stamp of the segment holding the socket's next byte, read with `MSG_PEEK` into
/// `one` (the byte stays queued).
#[cfg(target_os = "linux")]
#[allow(clippy::ptr_arg)] // nix's `recvmsg` takes the control buffer as a `Vec`
fn peek_stamp(
    fd: std::os::fd::RawFd,
    one: &mut [u8],
    cmsg: &mut Vec<u8>,
) -> io::Result<Option<Duration>> {
    use nix::sys::socket::{recvmsg, MsgFlags};
    let mut iov = [io::IoSliceMut::new(one)];
    let msg =
        recvmsg::<()>(fd, &mut iov, Some(cmsg), MsgFlags::MSG_PEEK).map_err(io::Error::from)?;
    Ok(if msg.bytes == 0 { None } else { stamp_of(&msg) })
}

/// The `SO_TIMESTAMPNS` stamp a `recvmsg` returned, if any.
#[cfg(target_os = "linux")]
fn stamp_of(msg: &nix::sys::socket::RecvMsg<'_, '_, ()>) -> Option<Duration> {
    use nix::sys::socket::ControlMessageOwned;
    msg.cmsgs().ok()?.find_map(|c| match c {
        ControlMessageOwned::ScmTimestampns(ts) => Some(Duration::new(
            u64::try_from(ts.tv_sec()).unwrap_or(0),
            u32::try_from(ts.tv_nsec()).unwrap_or(0),
        )),
        _ => None,
    })
}

impl AsyncRead for StampedTcp {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        #[cfg(target_os = "linux")]
        if this.stamps {
            return this.poll_read_stamped(cx, buf);
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for StampedTcp {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// When a request's first byte reached the host, by the kernel's stamp: put in the request's
/// extensions by the server, read by the meter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival(pub Instant);

/// The longest the heartbeat's timer sleeps while frames beat for it: sixteen ticks.
const MAX_TIMER_TICKS: u32 = 16;

/// How late the gateway gets to work that is due: the heartbeat's record.
///
/// Its samples come from two places. While frames flow, each frame handed on to a client is a
/// beat: its forward lag (hand-off − the kernel's stamp of the upstream read) is how late the
/// gateway was to data that was waiting for it, measured on the work itself (at most one frame a
/// tick is taken, so the hot path pays an atomic load). While requests are in flight and no frame
/// beats, a timer does: it sleeps a tick and notes how late it wakes. The timer's sleep doubles,
/// up to sixteen ticks, while frames keep beating during it, and drops back to one tick the first
/// time none did; with no request in flight it does not run at all. So an idle gateway wakes for
/// nothing, a streaming one does not wake twice per token, and a silent wait (a long prefill) is
/// still watched every tick.
#[derive(Debug)]
pub struct Heartbeat {
    /// The timer's shortest sleep, and the least time between two frame beats.
    pub tick: Duration,
    /// Microseconds on the packed timeline (`pack`) of the latest frame beat.
    last_frame_us: AtomicU64,
    hist: Mutex<Lateness>,
    timer_beats: AtomicU64,
    frame_beats: AtomicU64,
    busy: tokio::sync::Notify,
    warn_over: Duration,
}

#[derive(Debug)]
struct Lateness {
    hist: Option<hdrhistogram::Histogram<u64>>,
    last_warned: Option<Instant>,
    /// The worst beat over the threshold since the last warning, and how many were over it.
    worst: Duration,
    over: u64,
}

/// Warnings come at most this often.
const WARN_EVERY: Duration = Duration::from_secs(10);

impl Lateness {
    /// Notes a beat `late` past its due time (over the threshold or not); returns what to warn
    /// of — the worst beat since the last warning and how many were over the threshold — when
    /// one is over it and the last warning is `WARN_EVERY` old.
    fn over(
        &mut self,
        late: Duration,
        threshold: Duration,
        now: Instant,
    ) -> Option<(Duration, u64)> {
        if late <= threshold {
            return None;
        }
        self.worst = self.worst.max(late);
        self.over += 1;
        if self
            .last_warned
            .is_some_and(|t| now.duration_since(t) <= WARN_EVERY)
        {
            return None;
        }
        self.last_warned = Some(now);
        let said = (self.worst, self.over);
        self.worst = Duration::ZERO;
        self.over = 0;
        Some(said)
    }
}

/// Where a beat came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Beat {
    Timer,
    Frame,
}

impl Heartbeat {
    /// A heartbeat of `tick` that warns (at most every 10 s) when a beat is later than `warn`.
    pub fn new(tick: Duration, warn: Duration) -> Self {
        start();
        Self {
            tick,
            last_frame_us: AtomicU64::new(0),
            // 1 µs to 1 h, 2 significant digits (valid bounds: never `None`).
            hist: Mutex::new(Lateness {
                hist: hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 2).ok(),
                last_warned: None,
                worst: Duration::ZERO,
                over: 0,
            }),
            timer_beats: AtomicU64::new(0),
            frame_beats: AtomicU64::new(0),
            busy: tokio::sync::Notify::new(),
            warn_over: warn,
        }
    }

    fn tick_us(&self) -> u64 {
        u64::try_from(self.tick.as_micros()).unwrap_or(u64::MAX)
    }

    /// Notes one beat `late` past when its work was due.
    fn beat(&self, late: Duration, from: Beat) {
        let us = u64::try_from(late.as_micros()).unwrap_or(u64::MAX);
        match from {
            Beat::Timer => &self.timer_beats,
            Beat::Frame => &self.frame_beats,
        }
        .fetch_add(1, Ordering::Relaxed);
        let mut l = self.hist.lock();
        if let Some(h) = l.hist.as_mut() {
            h.saturating_record(us.max(1));
        }
        if let Some((worst, late_beats)) = l.over(late, self.warn_over, Instant::now()) {
            drop(l);
            // The worst since the last warning (not the beat that happened to cross now).
            let late_ms = worst.as_secs_f64() * 1e3;
            match from {
                Beat::Timer => tracing::warn!(
                    late_ms,
                    late_beats,
                    "the gateway woke late: its process waits for a CPU, so every latency it reports may be off by as much (late_ms: the worst since the last warning)"
                ),
                Beat::Frame => tracing::warn!(
                    late_ms,
                    late_beats,
                    "the gateway handed a frame on late: its process waits for a CPU, so every latency it reports may be off by as much (late_ms: the worst since the last warning)"
                ),
            }
        }
    }

    /// A frame handed on at `now` (an instant packed by `pack`) whose upstream read the kernel
    /// stamped `lag` earlier: a beat, when the last frame beat is a tick old. Called for every
    /// frame: one atomic load when it is not a beat.
    pub fn frame(&self, now: u64, lag: Duration) {
        let t = now / 1000;
        let last = self.last_frame_us.load(Ordering::Relaxed);
        if t < last.saturating_add(self.tick_us()) {
            return;
        }
        // One of the frames racing for this beat takes it.
        if self
            .last_frame_us
            .compare_exchange(last, t, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            self.beat(lag, Beat::Frame);
        }
    }

    /// A request is in flight now where none was: the timer runs again.
    pub fn busy(&self) {
        self.busy.notify_one();
    }

    /// A copy of the lateness histogram (microseconds).
    pub fn histogram(&self) -> Option<hdrhistogram::Histogram<u64>> {
        self.hist.lock().hist.clone()
    }

    /// Writes how late the gateway got to due work (a histogram) and the wall-clock steps
    /// seen, for `/metrics`.
    pub fn write_prometheus(&self, w: &mut crate::util::prometheus::Writer) {
        let none = crate::util::prometheus::Labels::new(&[]);
        if let Some(h) = self.histogram() {
            let name = "inferscope_heartbeat_lateness_seconds";
            w.family(
                name,
                "histogram",
                "How late the gateway got to work that was due (waiting for a CPU): frames handed on after their read's kernel stamp, and the heartbeat timer while no frame flowed. Every latency it reports may be off by as much.",
            );
            w.histogram(
                name,
                &none,
                crate::stats::LAG_BOUNDS,
                |le| h.count_between(0, (le * 1e6) as u64),
                h.mean() * h.len() as f64 / 1e6,
                h.len(),
            );
        }
        let steps = "inferscope_clock_steps_total";
        w.family(
            steps,
            "counter",
            "Wall-clock steps seen while converting kernel receive stamps (those requests fell back to the gateway's clock).",
        );
        w.sample(steps, &none, CLOCK_STEPS.load(Ordering::Relaxed) as f64);
    }

    /// Beats so far: (from the timer, from frames).
    pub fn beats(&self) -> (u64, u64) {
        (
            self.timer_beats.load(Ordering::Relaxed),
            self.frame_beats.load(Ordering::Relaxed),
        )
    }

    /// Lateness quantiles over the whole run, microseconds: (p50, p99, max).
    pub fn quantiles_us(&self) -> (u64, u64, u64) {
        let l = self.hist.lock();
        let q = |f: fn(&hdrhistogram::Histogram<u64>) -> u64| l.hist.as_ref().map_or(0, f);
        (
            q(|h| h.value_at_quantile(0.5)),
            q(|h| h.value_at_quantile(0.99)),
            q(|h| h.max()),
        )
    }

    /// The timer, until `stop`: while `idle()` says no request is in flight it waits for
    /// `busy()`; otherwise it sleeps (a tick, or longer while frames beat) and notes how late it
    /// woke.
    pub async fn run(
        self: Arc<Self>,
        idle: impl Fn() -> bool,
        stop: impl std::future::Future<Output = ()>,
    ) {
        tokio::pin!(stop);
        let mut sleep = self.tick;
        loop {
            if idle() {
                tokio::select! {
                    () = self.busy.notified() => {}
                    () = &mut stop => return,
                }
                sleep = self.tick;
                continue;
            }
            let frames = self.frame_beats.load(Ordering::Relaxed);
            let due = tokio::time::Instant::now() + sleep;
            tokio::select! {
                () = tokio::time::sleep_until(due) => {}
                () = &mut stop => return,
            }
            let late = tokio::time::Instant::now().saturating_duration_since(due);
            self.beat(late, Beat::Timer);
            sleep = if self.frame_beats.load(Ordering::Relaxed) != frames {
                (sleep * 2).min(self.tick * MAX_TIMER_TICKS)
            } else {
                self.tick
            };
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_lateness_warning_says_the_worst_since_the_last_one() {
        let mut l = Lateness {
            hist: None,
            last_warned: None,
            worst: Duration::ZERO,
            over: 0,
        };
        let ms = Duration::from_millis;
        let t = Instant::now();
        assert_eq!(l.over(ms(10), ms(50), t), None);
        assert_eq!(l.over(ms(67), ms(50), t), Some((ms(67), 1)));
        // Within 10 s: kept, not said.
        assert_eq!(l.over(ms(1556), ms(50), t + ms(1000)), None);
        assert_eq!(l.over(ms(80), ms(50), t + ms(2000)), None);
        // The next warning says the worst of them (and the one now), and how many were over.
        assert_eq!(
            l.over(ms(60), ms(50), t + Duration::from_secs(11)),
            Some((ms(1556), 3))
        );
        assert_eq!(l.over(ms(70), ms(50), t + Duration::from_secs(12)), None);
    }

    #[test]
    fn realtime_stamps_land_on_the_monotonic_timeline() {
        let last = Mutex::new(None);
        let mono = Instant::now() + Duration::from_secs(5);
        let real = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        // A stamp 250 ms before the clocks were read is 250 ms before `mono`.
        let stamp = Duration::from_secs(1_800_000_000) - Duration::from_millis(250);
        let at = convert(stamp, real, mono, &last).unwrap();
        assert_eq!(mono - at, Duration::from_millis(250));
        // A second later, both clocks moved together: no step.
        let at = convert(
            stamp + Duration::from_secs(1),
            real + Duration::from_secs(1),
            mono + Duration::from_secs(1),
            &last,
        )
        .unwrap();
        assert_eq!(
            mono + Duration::from_secs(1) - at,
            Duration::from_millis(250)
        );
    }

    #[test]
    fn a_wall_clock_step_is_refused_and_counted_then_trusted_again() {
        let last = Mutex::new(None);
        let mono = Instant::now() + Duration::from_secs(5);
        let real = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let s = Duration::from_secs(1_800_000_000);
        assert!(convert(s, real, mono, &last).is_some());
        let steps = CLOCK_STEPS.load(Ordering::Relaxed);
        // The wall clock jumps 2 s ahead while the monotonic clock moves 10 ms.
        let stepped = real + Duration::from_secs(2) + Duration::from_millis(10);
        let m2 = mono + Duration::from_millis(10);
        assert_eq!(
            convert(s + Duration::from_secs(2), stepped, m2, &last),
            None
        );
        assert!(CLOCK_STEPS.load(Ordering::Relaxed) > steps);
        // From then on the new offset holds.
        let m3 = m2 + Duration::from_millis(10);
        let at = convert(
            s + Duration::from_secs(2) + Duration::from_millis(15),
            stepped + Duration::from_millis(10),
            m3,
            &last,
        )
        .unwrap();
        assert_eq!(m3 - at, Duration::from_millis(5));
        // Slewing (here 200 µs over 10 s) is drift, not a step.
        let m4 = m3 + Duration::from_secs(10);
        let r4 = stepped
            + Duration::from_millis(10)
            + Duration::from_secs(10)
            + Duration::from_micros(200);
        assert!(convert(s + Duration::from_secs(12), r4, m4, &last).is_some());
    }

    #[test]
    fn stamps_from_the_future_or_too_old_are_not_believed() {
        let last = Mutex::new(None);
        let mono = Instant::now() + Duration::from_secs(5);
        let real = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let s = Duration::from_secs(1_800_000_000);
        assert_eq!(
            convert(s + Duration::from_millis(5), real, mono, &last),
            None
        );
        assert_eq!(
            convert(s - Duration::from_secs(61), real, mono, &last),
            None
        );
        assert!(convert(s + Duration::from_micros(100), real, mono, &last).is_some());
    }

    #[test]
    fn packed_instants_round_trip() {
        let t = Instant::now();
        assert_eq!(unpack(pack(t)), Some(t));
        assert_eq!(unpack(0), None);
        // An instant taken before the timeline was first needed packs to what it is.
        let early = Instant::now() - Duration::from_secs(5);
        start();
        let late = Instant::now();
        assert_eq!(Duration::from_nanos(pack(late) - pack(early)), late - early);
    }

    /// Short reads clear the socket's readiness (no EAGAIN read after each): every byte written
    /// later must still wake the reader, in pieces of every size, with and without pauses, and
    /// so must the end of the stream.
    #[tokio::test]
    async fn every_byte_arrives_however_it_is_written() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let on = enable_rx_stamps(&listener);
        let addr = listener.local_addr().unwrap();
        let mut client = TcpStream::connect(addr).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let mut server = StampedTcp::new(server, on);
        let sizes: Vec<usize> = (0..300u64)
            .map(|i| match i % 5 {
                0 => 1,
                1 => 250,
                2 => 4096,
                3 => 20_000,
                _ => (i as usize * 7919) % 9000 + 1,
            })
            .collect();
        let total: usize = sizes.iter().sum();
        let writer = tokio::spawn(async move {
            let mut sent = Vec::with_capacity(total);
            for (i, n) in sizes.into_iter().enumerate() {
                let piece: Vec<u8> = (0..n).map(|j| (i * 31 + j) as u8).collect();
                client.write_all(&piece).await.unwrap();
                sent.extend_from_slice(&piece);
                if i % 7 == 0 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            sent
        });
        let mut got = Vec::with_capacity(total);
        let mut buf = vec![0u8; 64 << 10];
        while got.len() < total {
            let n = tokio::time::timeout(Duration::from_secs(10), server.read(&mut buf))
                .await
                .expect("a read waited for bytes that had been written")
                .unwrap();
            assert!(n > 0, "end of stream before every byte arrived");
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, writer.await.unwrap());
        // The writer is gone: its FIN may have come with the last bytes, whose read cleared the
        // readiness; the end of the stream must still be seen (Tokio keeps "read closed").
        let n = tokio::time::timeout(Duration::from_secs(10), server.read(&mut buf))
            .await
            .expect("the end of the stream was not seen")
            .unwrap();
        assert_eq!(n, 0);
    }

    #[tokio::test]
    async fn a_socket_reports_when_the_kernel_received_its_data() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let on = enable_rx_stamps(&listener);
        // The kernel turns stamping on for its receive path a moment after the first socket asks
        // (a deferred static key): packets before that carry no stamp.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let addr = listener.local_addr().unwrap();
        let mut client = TcpStream::connect(addr).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let mut server = StampedTcp::new(server, on);
        let sent = Instant::now();
        client.write_all(b"hello").await.unwrap();
        // Read only after a pause: the stamp is the arrival, not the read.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut buf = [0u8; 16];
        let n = server.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"hello");
        if cfg!(target_os = "linux") {
            assert!(on);
            let at = server.last_rx().unwrap();
            assert!(
                at >= sent - Duration::from_millis(1),
                "not before it was sent"
            );
            assert!(
                at < sent + Duration::from_millis(40),
                "stamped on arrival, not at the read 50 ms later: {:?}",
                at - sent
            );
        } else {
            assert_eq!(server.last_rx(), None);
        }
    }

    /// A heartbeat of 10 ms watching `in_flight`, until the returned sender is dropped.
    fn watching(in_flight: &Arc<AtomicU64>) -> (Arc<Heartbeat>, tokio::sync::oneshot::Sender<()>) {
        let hb = Arc::new(Heartbeat::new(
            Duration::from_millis(10),
            Duration::from_secs(1),
        ));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let f = Arc::clone(in_flight);
        tokio::spawn(
            Arc::clone(&hb).run(move || f.load(Ordering::Relaxed) == 0, async {
                let _ = stopped.await;
            }),
        );
        (hb, stop)
    }

    #[tokio::test(start_paused = true)]
    async fn the_heartbeat_sleeps_while_idle_and_beats_each_tick_while_busy() {
        let in_flight = Arc::new(AtomicU64::new(0));
        let (hb, _stop) = watching(&in_flight);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(hb.beats(), (0, 0), "no request in flight: no wake-up");
        in_flight.store(1, Ordering::Relaxed);
        hb.busy();
        tokio::time::sleep(Duration::from_millis(1005)).await;
        let (timer, frames) = hb.beats();
        assert_eq!(frames, 0);
        assert!(
            (99..=101).contains(&timer),
            "{timer} beats in 1 s of 10 ms ticks"
        );
        // Idle again: the timer stops after the beat it was sleeping for.
        in_flight.store(0, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let after = hb.beats().0;
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(hb.beats().0, after);
    }

    #[tokio::test(start_paused = true)]
    async fn frames_beat_for_the_timer_while_they_flow() {
        let in_flight = Arc::new(AtomicU64::new(1));
        let (hb, _stop) = watching(&in_flight);
        // A stream's frames every 20 ms for 2 s, each handed on 3 ms after its read.
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            hb.frame(
                pack(tokio::time::Instant::now().into_std()),
                Duration::from_millis(3),
            );
        }
        let (timer, frames) = hb.beats();
        assert!((95..=100).contains(&frames), "{frames}");
        // The timer backs off to 160 ms: 10 + 20 + 40 + 80, then about 12 of 160 ms.
        assert!(timer <= 20, "{timer} timer beats while frames flowed");
        let (p50, _, max) = hb.quantiles_us();
        assert!((2900..=3100).contains(&p50), "{p50}");
        assert!(max >= 2900, "{max}");
        // The frames stop, the request is still in flight (a long prefill): a tick again, after
        // the long sleep under way and one more (the first that saw no frame beat).
        tokio::time::sleep(Duration::from_millis(330)).await;
        let t0 = hb.beats().0;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let ticks = hb.beats().0 - t0;
        assert!((49..=51).contains(&ticks), "{ticks}");
    }

    #[test]
    fn one_frame_a_tick_is_a_beat() {
        let hb = Heartbeat::new(Duration::from_millis(10), Duration::from_secs(1));
        let t = Instant::now() + Duration::from_secs(1);
        for i in 0..100u64 {
            // 100 frames 1 ms apart: 10 ticks.
            hb.frame(pack(t + Duration::from_millis(i)), Duration::from_micros(i));
        }
        assert_eq!(hb.beats(), (0, 10));
        // The samples are the lags of the frames taken: 0, 10, ..., 90 µs.
        let h = hb.histogram().unwrap();
        assert_eq!(h.len(), 10);
        assert_eq!(h.max(), 90);
    }
}
