//! `WakeGate`: polls a side future (a deadline timer, a shutdown signal) only when that future
//! has woken its task, not on every wake-up of a task that other things wake far more often.
//!
//! A streaming response's task is woken once per chunk: by the upstream socket, then by the
//! client socket. A deadline timer or a shutdown watch polled beside the stream would be polled
//! each of those times, to say "not yet" (a Tokio `Sleep` poll is a coop-budget check, a lock-free
//! state read and a waker registration, ~110 instructions). Behind the gate it is polled with a
//! waker of the gate's own, which raises a flag and wakes the task; a later poll of the task goes
//! through to the future only if the flag is up, the task's waker changed, or the caller said the
//! future must be polled again (`rearm`: a reset timer must be polled to be registered).
//!
//! Nothing is missed: the flag is lowered before the future is polled, and the poll sees every
//! event that raised it; an event after that raises it again and wakes the task again.

use parking_lot::Mutex;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

/// What the side future's waker shares with the gate.
#[derive(Debug, Default)]
struct Flag {
    fired: AtomicBool,
    /// The task to wake: the waker of the task's latest poll that went through.
    task: Mutex<Option<Waker>>,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.fired.store(true, Ordering::Release);
        if let Some(w) = &*self.task.lock() {
            w.wake_by_ref();
        }
    }
}

/// Polls a future only when it woke (see the module doc). One gate per side future; the future
/// itself stays with the caller.
#[derive(Debug)]
pub struct WakeGate {
    flag: Arc<Flag>,
    /// The waker the side future is polled with (wakes through `flag`).
    waker: Waker,
    /// The task waker `flag` holds, to tell whether the task's waker changed; `None` until the
    /// first poll and after `rearm`.
    task: Option<Waker>,
}

impl Default for WakeGate {
    fn default() -> Self {
        Self::new()
    }
}

impl WakeGate {
    /// A gate whose first poll goes through.
    pub fn new() -> Self {
        let flag = Arc::new(Flag::default());
        Self {
            waker: Waker::from(Arc::clone(&flag)),
            flag,
            task: None,
        }
    }

    /// The next poll goes through, woken or not (the future was replaced or reset).
    pub fn rearm(&mut self) {
        self.task = None;
    }

    /// Polls `fut` if it woke the task since its last poll, if this is the first poll or one
    /// after `rearm` or after a poll that was ready, or if the task's waker is not the one it
    /// was polled under; otherwise `Pending` without polling it.
    pub fn poll<F: Future + ?Sized>(
        &mut self,
        fut: Pin<&mut F>,
        cx: &mut Context<'_>,
    ) -> Poll<F::Output> {
        self.poll_with(cx, |cx| fut.poll(cx))
    }

    /// `poll` for a poll function (a socket's readiness): called with the gate's context when
    /// it would be polled. A ready result leaves nothing registered to wake the task, so the
    /// poll after it goes through.
    pub fn poll_with<T>(
        &mut self,
        cx: &mut Context<'_>,
        f: impl FnOnce(&mut Context<'_>) -> Poll<T>,
    ) -> Poll<T> {
        match &self.task {
            Some(w) if w.will_wake(cx.waker()) => {
                if !self.flag.fired.load(Ordering::Acquire) {
                    return Poll::Pending;
                }
            }
            _ => {
                *self.flag.task.lock() = Some(cx.waker().clone());
                self.task = Some(cx.waker().clone());
            }
        }
        // Lowered before the poll: whatever raised it, the poll sees.
        self.flag.fired.store(false, Ordering::Release);
        let r = f(&mut Context::from_waker(&self.waker));
        if r.is_ready() {
            self.rearm();
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    /// A future that counts its polls and is ready once `ready` is set, waking whoever polled it
    /// last when `fire` is called.
    #[derive(Default)]
    struct Probe {
        polls: AtomicUsize,
        ready: AtomicBool,
        waker: Mutex<Option<Waker>>,
    }

    impl Probe {
        fn fire(&self) {
            self.ready.store(true, Ordering::SeqCst);
            if let Some(w) = self.waker.lock().take() {
                w.wake();
            }
        }
    }

    struct Poll1<'a>(&'a Probe);

    impl Future for Poll1<'_> {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.0.polls.fetch_add(1, Ordering::SeqCst);
            if self.0.ready.load(Ordering::SeqCst) {
                return Poll::Ready(());
            }
            *self.0.waker.lock() = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    /// Counts the wakes of the task.
    #[derive(Default)]
    struct Task(AtomicUsize);

    impl Wake for Task {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn polls_only_after_a_wake_and_sees_it() {
        let probe = Probe::default();
        let mut fut = Poll1(&probe);
        let task = Arc::new(Task::default());
        let waker = Waker::from(Arc::clone(&task));
        let mut cx = Context::from_waker(&waker);
        let mut gate = WakeGate::new();
        assert!(gate.poll(Pin::new(&mut fut), &mut cx).is_pending());
        assert_eq!(
            probe.polls.load(Ordering::SeqCst),
            1,
            "the first poll goes through"
        );
        for _ in 0..10 {
            assert!(gate.poll(Pin::new(&mut fut), &mut cx).is_pending());
        }
        assert_eq!(probe.polls.load(Ordering::SeqCst), 1, "no wake, no poll");
        probe.fire();
        assert_eq!(
            task.0.load(Ordering::SeqCst),
            1,
            "the side future's wake reaches the task"
        );
        assert!(gate.poll(Pin::new(&mut fut), &mut cx).is_ready());
        assert_eq!(probe.polls.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_new_task_waker_or_a_rearm_goes_through() {
        let probe = Probe::default();
        let mut fut = Poll1(&probe);
        let (a, b) = (Arc::new(Task::default()), Arc::new(Task::default()));
        let (wa, wb) = (Waker::from(Arc::clone(&a)), Waker::from(Arc::clone(&b)));
        let mut gate = WakeGate::new();
        let _ = gate.poll(Pin::new(&mut fut), &mut Context::from_waker(&wa));
        let _ = gate.poll(Pin::new(&mut fut), &mut Context::from_waker(&wb));
        assert_eq!(probe.polls.load(Ordering::SeqCst), 2, "the waker changed");
        gate.rearm();
        let _ = gate.poll(Pin::new(&mut fut), &mut Context::from_waker(&wb));
        assert_eq!(probe.polls.load(Ordering::SeqCst), 3, "rearmed");
        probe.fire();
        assert_eq!(
            (a.0.load(Ordering::SeqCst), b.0.load(Ordering::SeqCst)),
            (0, 1),
            "the wake goes to the latest task waker"
        );
    }

    /// With a real Tokio timer: a task that is woken often by something else still sees its
    /// deadline, at its time, while the timer is polled only at the start and when it fires.
    #[tokio::test(start_paused = true)]
    async fn a_tokio_timer_behind_the_gate_fires_on_time() {
        let start = tokio::time::Instant::now();
        let mut sleep = Box::pin(tokio::time::sleep(Duration::from_millis(50)));
        let polls = AtomicUsize::new(0);
        let mut timer = std::pin::pin!(std::future::poll_fn(|cx| {
            polls.fetch_add(1, Ordering::SeqCst);
            sleep.as_mut().poll(cx)
        }));
        let mut gate = WakeGate::new();
        let mut ticks = tokio::time::interval(Duration::from_millis(1));
        let mut woken_by_ticks = 0;
        std::future::poll_fn(|cx| loop {
            if let Poll::Ready(()) = gate.poll(timer.as_mut(), cx) {
                return Poll::Ready(());
            }
            match ticks.poll_tick(cx) {
                Poll::Ready(_) => woken_by_ticks += 1,
                Poll::Pending => return Poll::Pending,
            }
        })
        .await;
        assert_eq!(start.elapsed(), Duration::from_millis(50));
        assert!(woken_by_ticks >= 50, "{woken_by_ticks} ticks");
        assert_eq!(
            polls.load(Ordering::SeqCst),
            2,
            "polled at the start and when it fired"
        );
    }
}
