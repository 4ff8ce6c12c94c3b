//! Time as the limiter sees it: `Nanos` (u64 nanoseconds) and the `Clock` that reads it.
//!
//! Everything below this module takes `now` as an argument; only a `Clock` reads the
//! operating system. The system clock counts nanoseconds since the UNIX epoch so that
//! fixed windows line up with wall-clock seconds, minutes and days (UTC), but it advances
//! monotonically: a wall-clock step after start-up does not move it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    #[inline]
    fn now_ns(&self) -> Nanos {
        (**self).now_ns()
    }
}

/// Read the TSC through `quanta` and report nanoseconds since the UNIX epoch.
///
/// `quanta` costs about 15 ns per read here against about 47 ns for `std::time::Instant`
/// (see `benches/local.rs`, group `clock`). The UNIX offset is taken once at construction;
/// afterwards the clock is monotonic and ignores wall-clock steps.
#[derive(Clone, Debug)]
pub struct SystemClock {
    clock: quanta::Clock,
    origin_raw: u64,
    origin_unix_ns: Nanos,
}

impl SystemClock {
    /// Create a clock anchored at the current wall-clock time.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let origin_raw = clock.raw();
        let origin_unix_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(duration_to_nanos)
            .unwrap_or(0);
        SystemClock {
            clock,
            origin_raw,
            origin_unix_ns,
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
        let elapsed = self.clock.delta_as_nanos(self.origin_raw, self.clock.raw());
        self.origin_unix_ns.saturating_add(elapsed)
    }
}

/// Hold a time that only moves when told to; for tests, simulations and replays.
///
/// Cloning shares the same time, so a test can keep one handle and give another to a
/// limiter.
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    now_ns: Arc<AtomicU64>,
}

impl ManualClock {
    /// Create a clock that reads `start_ns`.
    pub fn new(start_ns: Nanos) -> Self {
        ManualClock {
            now_ns: Arc::new(AtomicU64::new(start_ns)),
        }
    }

    /// Move the clock forward by `delta_ns` nanoseconds.
    pub fn advance_ns(&self, delta_ns: Nanos) {
        self.now_ns.fetch_add(delta_ns, Ordering::SeqCst);
    }

    /// Move the clock forward by `delta`.
    pub fn advance(&self, delta: Duration) {
        self.advance_ns(duration_to_nanos(delta));
    }

    /// Set the clock to `now_ns`; it never moves backwards, so an earlier value is ignored.
    pub fn set_ns(&self, now_ns: Nanos) {
        self.now_ns.fetch_max(now_ns, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now_ns(&self) -> Nanos {
        self.now_ns.load(Ordering::SeqCst)
    }
}

/// Follow tokio's clock, including `tokio::time::pause()` and `advance()`; for async tests.
///
/// Reports nanoseconds since the clock was created.
#[cfg(feature = "tokio")]
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

#[cfg(test)]
mod tests {
    use super::*;

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
