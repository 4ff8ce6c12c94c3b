//! The system clock: the TSC read through `quanta`, in nanoseconds since the UNIX epoch,
//! kept on the operating system's monotonic clock.
//!
//! `quanta` turns TSC ticks into nanoseconds with a rate it measures once, over well under a
//! millisecond; its error (tens of parts per million, more when the process starts on a busy
//! machine) adds up to a millisecond a minute and seconds a day. A clock whose windows must
//! begin where the other nodes' (and UTC's) begin cannot drift like that, so this clock does
//! its own conversion and corrects it about once a second against `CLOCK_MONOTONIC` (which
//! NTP disciplines as it does the wall clock): the rate is measured over the whole time since
//! start, and any offset left is slewed out over the next second (at most 1,000 ppm, so the
//! clock never jumps back). Every clock of a process shares one such conversion: two
//! components of a node never disagree on the time.
//!
//! A read costs one TSC read, a sequence lock's loads and a multiplication; the correction is
//! made by whichever read first finds it due (one at a time) and takes about a microsecond.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use super::{Nanos, duration_to_nanos};

/// Fixed-point bits of the conversion's rate (nanoseconds per tick).
const RATE_SHIFT: u32 = 32;
/// How often the conversion is checked against the monotonic clock.
const CHECK_EVERY_NS: u128 = 1_000_000_000;
/// The largest slew: 1 ms per second of offset taken out.
const MAX_SLEW_PPM: i128 = 1_000;
/// A pair of readings taken further apart than this (a preemption between them) is retried.
const TIGHT_NS: u64 = 5_000;

/// The process's one conversion from TSC ticks to nanoseconds since the UNIX epoch.
#[derive(Debug)]
pub(super) struct Anchor {
    clock: quanta::Clock,
    /// When the clock started: TSC ticks, monotonic instant, UNIX time.
    origin_raw: u64,
    origin_mono: Instant,
    origin_unix: Nanos,
    /// Sequence lock over the conversion below: odd while it changes.
    seq: AtomicU64,
    /// The conversion: `at_ns + (raw − at_raw) · rate >> RATE_SHIFT`, and the tick after
    /// which it should be checked.
    at_raw: AtomicU64,
    at_ns: AtomicU64,
    rate: AtomicU64,
    check_at: AtomicU64,
    /// A read is correcting the conversion.
    correcting: AtomicBool,
}

static ANCHOR: OnceLock<Anchor> = OnceLock::new();

/// The process's anchor, made at the first call.
pub(super) fn anchor() -> &'static Anchor {
    ANCHOR.get_or_init(Anchor::new)
}

/// Read the monotonic clock and `read` as close together as the machine lets (a few tries
/// when a preemption falls between): the monotonic instant halfway and `read`'s value.
fn paired<T>(mut read: impl FnMut() -> T) -> (Instant, T) {
    let mut best = None;
    for _ in 0..8 {
        let before = Instant::now();
        let value = read();
        let after = Instant::now();
        let width = duration_to_nanos(after - before);
        let mid = before + (after - before) / 2;
        if width <= TIGHT_NS {
            return (mid, value);
        }
        if best.as_ref().is_none_or(|(w, _, _)| width < *w) {
            best = Some((width, mid, value));
        }
    }
    let (_, mid, value) = best.expect("eight tries");
    (mid, value)
}

impl Anchor {
    fn new() -> Anchor {
        let clock = quanta::Clock::new();
        let (origin_mono, (origin_raw, origin_unix)) = paired(|| {
            let unix = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(duration_to_nanos)
                .unwrap_or(0);
            (clock.raw(), unix)
        });
        // quanta's own rate to begin with: nanoseconds per 2^32 ticks.
        let rate = clock.delta_as_nanos(0, 1 << RATE_SHIFT).max(1);
        Anchor {
            clock,
            origin_raw,
            origin_mono,
            origin_unix,
            seq: AtomicU64::new(0),
            at_raw: AtomicU64::new(origin_raw),
            at_ns: AtomicU64::new(origin_unix),
            rate: AtomicU64::new(rate),
            check_at: AtomicU64::new(origin_raw.saturating_add(ticks_in(rate))),
            correcting: AtomicBool::new(false),
        }
    }

    /// Return the current time (ns since the UNIX epoch).
    #[inline]
    pub(super) fn now(&self) -> Nanos {
        let raw = self.clock.raw();
        let (at_raw, at_ns, rate, check_at) = self.conversion();
        if raw >= check_at {
            self.correct(raw);
        }
        convert(raw, at_raw, at_ns, rate)
    }

    /// The conversion in force, read under the sequence lock.
    #[inline]
    fn conversion(&self) -> (u64, u64, u64, u64) {
        loop {
            let before = self.seq.load(Ordering::Acquire);
            if before & 1 == 0 {
                let at_raw = self.at_raw.load(Ordering::Relaxed);
                let at_ns = self.at_ns.load(Ordering::Relaxed);
                let rate = self.rate.load(Ordering::Relaxed);
                let check_at = self.check_at.load(Ordering::Relaxed);
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == before {
                    return (at_raw, at_ns, rate, check_at);
                }
            }
            std::hint::spin_loop();
        }
    }

    /// Check the conversion against the monotonic clock and set the next one: the rate
    /// measured since start, slewed to take out the offset found over the next second.
    #[cold]
    fn correct(&self, seen_raw: u64) {
        if self
            .correcting
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        let (at_raw, at_ns, rate, check_at) = self.conversion();
        if seen_raw >= check_at {
            let (mono, raw) = paired(|| self.clock.raw());
            let elapsed_ns = duration_to_nanos(mono.saturating_duration_since(self.origin_mono));
            let elapsed_ticks = raw.saturating_sub(self.origin_raw);
            // Where this clock is now, with the conversion in force (it goes on from there).
            let here = convert(raw, at_raw, at_ns, rate);
            let (next_rate, next_ns) = if elapsed_ticks == 0 || raw < at_raw {
                (rate, here)
            } else {
                let measured =
                    ((u128::from(elapsed_ns) << RATE_SHIFT) / u128::from(elapsed_ticks)).max(1);
                let truth = i128::from(self.origin_unix.saturating_add(elapsed_ns));
                let offset = truth - i128::from(here);
                let most = MAX_SLEW_PPM * CHECK_EVERY_NS as i128 / 1_000_000;
                // Behind by more than a slew can make up: step forward (never back).
                let (slew, start) = if offset > most {
                    (0, truth as u64)
                } else {
                    (offset.max(-most), here)
                };
                let slewed =
                    measured as i128 * (CHECK_EVERY_NS as i128 + slew) / CHECK_EVERY_NS as i128;
                (slewed.clamp(1, i128::from(u64::MAX)) as u64, start)
            };
            let seq = self.seq.load(Ordering::Relaxed);
            self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
            fence(Ordering::Release);
            self.at_raw.store(raw, Ordering::Relaxed);
            self.at_ns.store(next_ns, Ordering::Relaxed);
            self.rate.store(next_rate, Ordering::Relaxed);
            self.check_at
                .store(raw.saturating_add(ticks_in(next_rate)), Ordering::Relaxed);
            self.seq.store(seq.wrapping_add(2), Ordering::Release);
        }
        self.correcting.store(false, Ordering::Release);
    }
}

/// Ticks in [`CHECK_EVERY_NS`] at `rate`.
fn ticks_in(rate: u64) -> u64 {
    u64::try_from((CHECK_EVERY_NS << RATE_SHIFT) / u128::from(rate.max(1))).unwrap_or(u64::MAX)
}

/// `at_ns` plus the ticks since `at_raw` at `rate` (a tick read before a concurrent
/// correction, earlier than its anchor, reads as the anchor: never earlier).
#[inline]
fn convert(raw: u64, at_raw: u64, at_ns: u64, rate: u64) -> Nanos {
    let ticks = raw.saturating_sub(at_raw);
    let ns = (u128::from(ticks) * u128::from(rate)) >> RATE_SHIFT;
    at_ns.saturating_add(u64::try_from(ns).unwrap_or(u64::MAX))
}

#[cfg(all(test, not(ratemesh_loom)))]
mod tests {
    use super::*;

    #[test]
    fn conversion_goes_on_from_where_it_was() {
        // 3 ticks per ns (rate 1/3 ns per tick).
        let rate = (1u64 << RATE_SHIFT) / 3;
        assert_eq!(convert(1_000, 1_000, 50, rate), 50);
        assert_eq!(convert(4_000, 1_000, 50, rate), 50 + 999);
        // A tick before the anchor reads as the anchor.
        assert_eq!(convert(900, 1_000, 50, rate), 50);
        assert_eq!(ticks_in(1 << RATE_SHIFT), 1_000_000_000);
    }

    #[test]
    fn the_clock_follows_the_monotonic_clock() {
        let anchor = anchor();
        let (mono, start) = paired(|| anchor.now());
        let mut last = start;
        // Through at least one correction (reads past `check_at` make it).
        while mono.elapsed() < std::time::Duration::from_millis(1_300) {
            let now = anchor.now();
            assert!(now >= last, "went back: {last} -> {now}");
            last = now;
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let (mono_now, clock_now) = paired(|| anchor.now());
        let by_clock = clock_now - start;
        let by_mono = duration_to_nanos(mono_now - mono);
        let apart = by_clock.abs_diff(by_mono);
        // Both read the same stretch of time, each within a preemption of it.
        assert!(apart < 20_000_000, "{by_clock} vs {by_mono}");
    }
}
