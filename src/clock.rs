//! Time as the limiter sees it: `Nanos` (u64 nanoseconds) and the `Clock` that reads it.
//!
//! Everything below this module takes `now` as an argument; only a `Clock` reads the
//! operating system. The system clock counts nanoseconds since the UNIX epoch so that
//! fixed windows line up with wall-clock seconds, minutes and days (UTC), but it advances
//! monotonically: a wall-clock step after start-up does not move it.
//!
//! A clock also tells a waiter how to wait for an instant ([`Clock::wake_at`]): a clock that
//! moves only when told ([`ManualClock`]) wakes its waiters itself as it moves; a clock that
//! follows real time leaves them to a timer (`Limiter::until_ready` sleeps on tokio's).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Waker;
use std::time::Duration;

mod system;

/// Nanoseconds: an instant (since the clock's epoch) or a duration, depending on the name.
pub type Nanos = u64;

/// Nanoseconds in one second.
pub const NANOS_PER_SEC: Nanos = 1_000_000_000;

/// Convert a `Duration` to nanoseconds, saturating at `u64::MAX` (about 584 years).
pub fn duration_to_nanos(duration: Duration) -> Nanos {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// Read the current time in nanoseconds.
///
/// Implementations must be monotonic (never go backwards) and cheap: the limiter reads
/// the clock once per decision.
pub trait Clock: Send + Sync + 'static {
    /// Return the current instant in nanoseconds since this clock's epoch.
    fn now_ns(&self) -> Nanos;

    /// Arrange for `waker` to be woken once this clock reads `at` or later, and return
    /// `true`; or return `false` if the clock follows real time, so that a waiter sleeps on a
    /// timer for `at − now_ns()` and then reads the clock again.
    ///
    /// The default returns `false`, which is right for a clock that advances with real time
    /// (or with tokio's time, as [`TokioClock`] does). A clock that moves only when told must
    /// wake its waiters as it moves, as [`ManualClock`] does; otherwise a waiter would sleep
    /// in real time while the clock stands still. If `now_ns() >= at` already, wake `waker`
    /// at once.
    fn wake_at(&self, at: Nanos, waker: &Waker) -> bool {
        let _ = (at, waker);
        false
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    #[inline]
    fn now_ns(&self) -> Nanos {
        (**self).now_ns()
    }

    fn wake_at(&self, at: Nanos, waker: &Waker) -> bool {
        (**self).wake_at(at, waker)
    }
}

/// Read the TSC through `quanta` and report nanoseconds since the UNIX epoch.
///
/// `quanta` costs about 15 ns per read here against about 47 ns for `std::time::Instant`
/// (see `benches/local.rs`, group `clock`). The UNIX offset is taken once, at the first
/// clock the process makes; afterwards the clock is monotonic and ignores wall-clock steps.
/// Its rate is checked against the operating system's monotonic clock about once a second
/// and any drift slewed out, so it stays within microseconds of it (`quanta`'s own
/// conversion drifts by up to about a millisecond a minute). Every `SystemClock` of a
/// process reads the same time.
#[derive(Clone, Copy, Debug)]
pub struct SystemClock {
    anchor: &'static system::Anchor,
}

impl SystemClock {
    /// Create a clock anchored at the current wall-clock time (the process's first clock;
    /// later ones share its anchor).
    pub fn new() -> Self {
        SystemClock {
            anchor: system::anchor(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now_ns(&self) -> Nanos {
        self.anchor.now()
    }
}

/// Hold a time that only moves when told to; for tests, simulations and replays.
///
/// Cloning shares the same time, so a test can keep one handle and give another to a
/// limiter. Moving the clock wakes the waiters whose instant it reached
/// ([`Clock::wake_at`]), so `Limiter::until_ready` on this clock returns once another task
/// advances it far enough, and never sleeps in real time.
///
/// ```
/// use std::time::Duration;
/// use ratemesh::{Clock, ManualClock};
///
/// let clock = ManualClock::new(0);
/// let handle = clock.clone(); // the same time
/// handle.advance(Duration::from_millis(250));
/// assert_eq!(clock.now_ns(), 250_000_000);
/// ```
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    shared: Arc<Manual>,
}

#[derive(Debug, Default)]
struct Manual {
    now_ns: AtomicU64,
    /// Waiters and the instant each waits for.
    alarms: Mutex<Vec<(Nanos, Waker)>>,
}

impl ManualClock {
    /// Create a clock that reads `start_ns`.
    pub fn new(start_ns: Nanos) -> Self {
        ManualClock {
            shared: Arc::new(Manual {
                now_ns: AtomicU64::new(start_ns),
                alarms: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Move the clock forward by `delta_ns` nanoseconds.
    pub fn advance_ns(&self, delta_ns: Nanos) {
        let before = self.shared.now_ns.fetch_add(delta_ns, Ordering::SeqCst);
        self.ring(before.wrapping_add(delta_ns));
    }

    /// Move the clock forward by `delta`.
    pub fn advance(&self, delta: Duration) {
        self.advance_ns(duration_to_nanos(delta));
    }

    /// Set the clock to `now_ns`; it never moves backwards, so an earlier value is ignored.
    pub fn set_ns(&self, now_ns: Nanos) {
        let before = self.shared.now_ns.fetch_max(now_ns, Ordering::SeqCst);
        self.ring(before.max(now_ns));
    }

    /// Wake the waiters whose instant `now` reached (outside the lock).
    fn ring(&self, now: Nanos) {
        let mut due = Vec::new();
        {
            let mut alarms = self.alarms();
            if alarms.is_empty() {
                return;
            }
            alarms.retain(|(at, waker)| {
                if *at <= now {
                    due.push(waker.clone());
                }
                *at > now
            });
        }
        due.into_iter().for_each(Waker::wake);
    }

    fn alarms(&self) -> std::sync::MutexGuard<'_, Vec<(Nanos, Waker)>> {
        // The list stays consistent even if a waker panicked while it was held.
        self.shared
            .alarms
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now_ns(&self) -> Nanos {
        self.shared.now_ns.load(Ordering::SeqCst)
    }

    fn wake_at(&self, at: Nanos, waker: &Waker) -> bool {
        let mut alarms = self.alarms();
        // Read under the lock: a move either happened before (seen here) or rings after.
        if self.now_ns() >= at {
            drop(alarms);
            waker.wake_by_ref();
            return true;
        }
        // A waiter polled again for the same instant keeps one alarm.
        if !alarms
            .iter()
            .any(|(when, known)| *when == at && known.will_wake(waker))
        {
            alarms.push((at, waker.clone()));
        }
        true
    }
}

/// Follow tokio's clock, including `tokio::time::pause()` and `advance()`; for async tests.
///
/// Reports nanoseconds since the clock was created.
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
#[derive(Clone, Copy, Debug)]
pub struct TokioClock {
    origin: tokio::time::Instant,
}

#[cfg(feature = "tokio")]
impl TokioClock {
    /// Create a clock that reads 0 now.
    pub fn new() -> Self {
        TokioClock {
            origin: tokio::time::Instant::now(),
        }
    }
}

#[cfg(feature = "tokio")]
impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(feature = "tokio")]
impl Clock for TokioClock {
    fn now_ns(&self) -> Nanos {
        duration_to_nanos(tokio::time::Instant::now().duration_since(self.origin))
    }
}

/// No timer to wait on (see [`wait_until`]).
#[cfg(feature = "tokio")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NoTimer;

/// Wait until `clock` reads `at` or later: woken by the clock itself if it can
/// ([`Clock::wake_at`]), else on tokio's timer, reading the clock again after each sleep.
///
/// A real-time clock needs a tokio runtime with timers (`enable_time`); without one this
/// returns `NoTimer` instead of sleeping.
#[cfg(feature = "tokio")]
pub(crate) async fn wait_until<C: Clock + ?Sized>(clock: &C, at: Nanos) -> Result<(), NoTimer> {
    use std::task::Poll;
    loop {
        // `None`: reached; `Some(ns)`: a real-time clock, `ns` short of `at`.
        let short_ns = std::future::poll_fn(|cx| {
            let now = clock.now_ns();
            if now >= at {
                Poll::Ready(None)
            } else if clock.wake_at(at, cx.waker()) {
                Poll::Pending
            } else {
                Poll::Ready(Some(at - now))
            }
        })
        .await;
        match short_ns {
            None => return Ok(()),
            Some(ns) => tokio_sleep(Duration::from_nanos(ns))?.await,
        }
    }
}

/// Start a sleep on the current tokio runtime's timer, or say there is none.
#[cfg(feature = "tokio")]
fn tokio_sleep(duration: Duration) -> Result<tokio::time::Sleep, NoTimer> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(NoTimer);
    }
    // Tokio has no way to ask whether the runtime was built with timers: creating the sleep
    // panics when it was not. Catch that (tokio's message still reaches the panic hook).
    std::panic::catch_unwind(|| tokio::time::sleep(duration)).map_err(|_| NoTimer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{SystemTime, UNIX_EPOCH};

    #[test]
    fn system_clock_is_near_wall_clock_and_monotonic() {
        let clock = SystemClock::new();
        let wall = duration_to_nanos(SystemTime::now().duration_since(UNIX_EPOCH).unwrap());
        let a = clock.now_ns();
        let b = clock.now_ns();
        assert!(b >= a);
        assert!(a.abs_diff(wall) < 5 * NANOS_PER_SEC, "{a} vs {wall}");
    }

    #[test]
    fn manual_clock_wakes_its_waiters_as_it_reaches_their_instant() {
        use std::sync::atomic::AtomicUsize;
        use std::task::Wake;
        struct Count(AtomicUsize);
        impl Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&count));
        let woken = || count.0.load(Ordering::SeqCst);
        let clock = ManualClock::new(100);
        assert!(clock.wake_at(200, &waker));
        assert!(clock.wake_at(200, &waker), "polled again: one alarm");
        clock.advance_ns(50);
        assert_eq!(woken(), 0);
        clock.set_ns(200);
        assert_eq!(woken(), 1);
        clock.advance_ns(1_000);
        assert_eq!(woken(), 1, "an alarm rings once");
        assert!(clock.wake_at(300, &waker), "an instant already passed");
        assert_eq!(woken(), 2);
        // A real-time clock leaves waiting to a timer.
        assert!(!SystemClock::new().wake_at(u64::MAX, &waker));
    }

    #[test]
    fn manual_clock_moves_only_forward() {
        let clock = ManualClock::new(100);
        clock.advance_ns(50);
        assert_eq!(clock.now_ns(), 150);
        clock.set_ns(120);
        assert_eq!(clock.now_ns(), 150);
        clock.set_ns(1_000);
        assert_eq!(clock.now_ns(), 1_000);
    }
}
