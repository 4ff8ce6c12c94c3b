//! Calendar windows: the day, ISO week, month or year of a time zone's civil calendar that
//! contains an instant, for fixed windows such as "1,000,000 requests per calendar month in
//! Europe/Paris" (as AWS usage plans and Gubernator's Gregorian durations count).
//!
//! Sans-IO: time is a `u64` of nanoseconds since the UNIX epoch (UTC), always passed in.
//!
//! # Windows
//!
//! A period starts at local midnight of its first day (a Monday for [`Calendar::Week`], the 1st
//! for [`Calendar::Month`], January 1st for [`Calendar::Year`]) and ends where the next one
//! starts, so windows tile time with no gap and no overlap: `end_of(i) == start_of(i + 1)`.
//! A window is half-open, `[start_ns, end_ns)`.
//!
//! # A midnight that does not exist, or happens twice
//!
//! Where a DST change or an offset change falls on midnight (America/Santiago, America/Havana,
//! Asia/Beirut), the local midnight becomes an instant by jiff's *compatible* disambiguation
//! (RFC 5545's and Temporal's rule): a midnight in a gap is read with the offset in force
//! before the gap, so it lands as far after the transition as it is after the gap's first local
//! time (on the transition itself when the gap starts at midnight); a repeated midnight is its
//! first occurrence. `now` belongs to the window whose `[start_ns, end_ns)` holds it, which is
//! not always its local date's: where a gap or fold straddles midnight (America/St_Johns went
//! back from 00:01 to 23:01 until 2011), the minutes on the far side of the midnight's instant
//! count in the neighbouring window. A day that a zone skipped (Pacific/Apia and
//! Pacific/Fakaofo 2011-12-30, Pacific/Kiritimati and Pacific/Kanton 1994-12-31,
//! Pacific/Kwajalein 1993-08-21) is an empty window, `start == end`, that
//! [`CalendarWindow::window_at`] never returns: there the index advances by 2.
//!
//! # Index
//!
//! [`Window::index`] counts periods from the one that contains the local date 1969-12-29
//! (a Monday, index 0), so that every `u64` instant has a non-negative index in every zone
//! (the local date of the epoch is 1969-12-31 west of UTC): 1970-01-01 is day 3, week 0,
//! month 1 and year 1. It increases by exactly 1 from one window to the next, the empty
//! windows above aside.
//!
//! # Range
//!
//! Nothing here panics. Instants are clamped to the `u64` range, 1970-01-01T00:00:00Z to
//! 2554-07-21T23:34:33.709551615Z (jiff supports years -9999 to 9999, so a `u64` `now` is
//! always within it): the window holding the epoch starts at 0 even where its local midnight
//! came earlier, the last one ends at `u64::MAX` (so `now == u64::MAX` has `end_ns == now`),
//! and `start_of`/`end_of` of an index past that are `u64::MAX`.

use std::fmt;
use std::str::FromStr;

use jiff::Timestamp;
use jiff::civil::DateTime;
use jiff::tz::{AmbiguousOffset, TimeZone};

const NS_PER_SEC: u64 = 1_000_000_000;
const SECS_PER_DAY: i64 = 86_400;
/// The index origin, 1969-12-29 (a Monday), in days since 1970-01-01.
const ORIGIN_DAY: i64 = -3;
/// The index origin's year.
const ORIGIN_YEAR: i64 = 1969;
/// The index origin's month, 1969-12, in months since 0000-01.
const ORIGIN_MONTH: i64 = ORIGIN_YEAR * 12 + 11;
/// Local 2555-01-01: a period starting on or after it starts after `u64::MAX` ns in every zone
/// (offsets are within ±26 h), so its start saturates without asking the time zone.
const LAST_DAY: i64 = days_from_civil(2555, 1, 1);
/// The last index whose start is computed, per calendar (indexed by `Calendar as usize`).
const MAX_INDEX: [u64; 4] = [
    Calendar::Day.index_of_day(LAST_DAY),
    Calendar::Week.index_of_day(LAST_DAY),
    Calendar::Month.index_of_day(LAST_DAY),
    Calendar::Year.index_of_day(LAST_DAY),
];
/// Steps from the window of `now`'s local date to the window holding `now` (one suffices for
/// a shift of less than a period; the bound keeps a pathological custom zone finite).
const MAX_STEPS: u32 = 4;

/// The length of a calendar window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Calendar {
    /// A civil day, from local midnight to local midnight.
    Day,
    /// An ISO week, from Monday's local midnight.
    Week,
    /// A calendar month, from the 1st's local midnight.
    Month,
    /// A calendar year, from January 1st's local midnight.
    Year,
}

impl Calendar {
    /// Its name as parsed: `"day"`, `"week"`, `"month"` or `"year"`.
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Calendar::Day => "day",
            Calendar::Week => "week",
            Calendar::Month => "month",
            Calendar::Year => "year",
        }
    }

    /// The index of the period containing local day `day` (days since 1970-01-01).
    const fn index_of_day(self, day: i64) -> u64 {
        let index = match self {
            Calendar::Day => day - ORIGIN_DAY,
            Calendar::Week => (day - ORIGIN_DAY).div_euclid(7),
            Calendar::Month => {
                let (y, m, _) = civil_from_days(day);
                y * 12 + m - 1 - ORIGIN_MONTH
            }
            Calendar::Year => civil_from_days(day).0 - ORIGIN_YEAR,
        };
        if index < 0 { 0 } else { index as u64 }
    }

    /// The local first day of period `index` (days since 1970-01-01); `None` past 2555.
    fn first_day(self, index: u64) -> Option<i64> {
        if index > MAX_INDEX[self as usize] {
            return None;
        }
        let index = i64::try_from(index).ok()?;
        Some(match self {
            Calendar::Day => ORIGIN_DAY + index,
            Calendar::Week => ORIGIN_DAY + 7 * index,
            Calendar::Month => {
                let month = ORIGIN_MONTH + index;
                days_from_civil(month / 12, month % 12 + 1, 1)
            }
            Calendar::Year => days_from_civil(ORIGIN_YEAR + index, 1, 1),
        })
    }
}

impl fmt::Display for Calendar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Calendar {
    type Err = ParseCalendarError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "day" => Ok(Calendar::Day),
            "week" => Ok(Calendar::Week),
            "month" => Ok(Calendar::Month),
            "year" => Ok(Calendar::Year),
            _ => Err(ParseCalendarError {
                input: s.to_owned(),
            }),
        }
    }
}

/// A calendar period name that is not one of `day`, `week`, `month`, `year`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ParseCalendarError {
    /// The text that was given.
    pub(crate) input: String,
}

impl fmt::Display for ParseCalendarError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown calendar period `{}`: expected one of day, week, month, year",
            self.input
        )
    }
}

impl std::error::Error for ParseCalendarError {}

/// A time zone name that jiff's bundled tz database does not know.
#[derive(Debug, Clone)]
pub(crate) struct UnknownZoneError {
    /// The name that was given.
    pub(crate) zone: String,
    /// jiff's reason.
    pub(crate) reason: jiff::Error,
}

impl fmt::Display for UnknownZoneError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown time zone `{}`: {}", self.zone, self.reason)
    }
}

impl std::error::Error for UnknownZoneError {}

/// One calendar window, `[start_ns, end_ns)` in nanoseconds since the UNIX epoch.
///
/// The default, all zeros, contains no instant: a fresh cache for
/// [`CalendarWindow::window_cached`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub(crate) struct Window {
    /// Periods since the one containing the local date 1969-12-29 (see the module docs).
    pub(crate) index: u64,
    /// The instant of its first local midnight (saturated to 0).
    pub(crate) start_ns: u64,
    /// The start of the next window (saturated to `u64::MAX`).
    pub(crate) end_ns: u64,
}

impl Window {
    /// Its length in ns.
    #[cfg(feature = "mesh")]
    pub(crate) fn len(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }

    /// Whether `now_ns` lies in `[start_ns, end_ns)`.
    #[inline]
    pub(crate) fn contains(&self, now_ns: u64) -> bool {
        self.start_ns <= now_ns && now_ns < self.end_ns
    }
}

/// Calendar periods of one length in one time zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CalendarWindow {
    calendar: Calendar,
    tz: TimeZone,
}

impl CalendarWindow {
    /// Periods of `calendar` in the civil time of `tz`.
    pub(crate) fn new(calendar: Calendar, tz: TimeZone) -> Self {
        CalendarWindow { calendar, tz }
    }

    /// Periods of `calendar` in the zone named `zone` ("UTC", "Europe/Paris", ...), from
    /// jiff's bundled tz database.
    pub(crate) fn from_zone_name(calendar: Calendar, zone: &str) -> Result<Self, UnknownZoneError> {
        match TimeZone::get(zone) {
            Ok(tz) => Ok(Self::new(calendar, tz)),
            Err(reason) => Err(UnknownZoneError {
                zone: zone.to_owned(),
                reason,
            }),
        }
    }

    /// The length of its periods.
    pub(crate) fn calendar(&self) -> Calendar {
        self.calendar
    }

    /// Its time zone's IANA name (`None` for a zone made without one).
    #[cfg(feature = "http")]
    pub(crate) fn zone_name(&self) -> Option<&str> {
        self.tz.iana_name()
    }

    /// The window containing `now_ns`: `start_ns <= now_ns < end_ns` (except at `u64::MAX`,
    /// see the module docs), for every zone whose clock changes are shorter than a period, as
    /// are all of the tz database's. No allocation; three time zone look-ups.
    pub(crate) fn window_at(&self, now_ns: u64) -> Window {
        // At most 18_446_744_073 s: within `i64` and jiff's range.
        let secs = (now_ns / NS_PER_SEC) as i64;
        // Offsets are whole seconds, so the whole second decides the local date.
        let offset = Timestamp::from_second(secs).map_or(0, |ts| self.tz.to_offset(ts).seconds());
        let day = (secs + i64::from(offset)).div_euclid(SECS_PER_DAY);
        let mut index = self.calendar.index_of_day(day);
        let mut start = self.start_of(index);
        let mut end = self.end_of(index);
        // A gap or fold that straddles a midnight without starting at it can put `now` before
        // the start of its local date's window, or after its end (see the module docs).
        for _ in 0..MAX_STEPS {
            if now_ns < start && index > 0 {
                index -= 1;
                end = start;
                start = self.start_of(index);
            } else if now_ns >= end && end < u64::MAX {
                index += 1;
                start = end;
                end = self.end_of(index);
            } else {
                break;
            }
        }
        Window {
            index,
            start_ns: start,
            end_ns: end,
        }
    }

    /// [`window_at`](Self::window_at), answered from `cache` without a time zone look-up when
    /// `cache` contains `now_ns`. The caller keeps the returned window as its next cache;
    /// `cache` must come from this same `CalendarWindow` (or be [`Window::default`]).
    #[inline]
    pub(crate) fn window_cached(&self, now_ns: u64, cache: &Window) -> Window {
        if cache.contains(now_ns) {
            *cache
        } else {
            self.window_at(now_ns)
        }
    }

    /// The start of window `index`: its first local midnight, clamped to the `u64` range.
    pub(crate) fn start_of(&self, index: u64) -> u64 {
        match self.calendar.first_day(index) {
            Some(day) => self.midnight_ns(day),
            None => u64::MAX,
        }
    }

    /// The end of window `index`, which is the start of window `index + 1`.
    pub(crate) fn end_of(&self, index: u64) -> u64 {
        self.start_of(index.saturating_add(1))
    }

    /// The instant of local midnight at the start of `day` (days since 1970-01-01, within
    /// 1969-12-29..=2555-01-01), compatible disambiguation, clamped to the `u64` range.
    fn midnight_ns(&self, day: i64) -> u64 {
        let (y, m, d) = civil_from_days(day);
        let midnight = match (i16::try_from(y), i8::try_from(m), i8::try_from(d)) {
            (Ok(y), Ok(m), Ok(d)) => DateTime::new(y, m, d, 0, 0, 0, 0).ok(),
            _ => None,
        };
        // Unreachable `None` (every date in range is valid): UTC.
        let offset = midnight.map_or(0, |dt| {
            match self.tz.to_ambiguous_timestamp(dt).offset() {
                AmbiguousOffset::Unambiguous { offset } => offset.seconds(),
                // Compatible: the offset before the transition, for a gap and for a fold.
                AmbiguousOffset::Gap { before, .. } | AmbiguousOffset::Fold { before, .. } => {
                    before.seconds()
                }
            }
        });
        let secs = day * SECS_PER_DAY - i64::from(offset);
        if secs <= 0 {
            0
        } else {
            (secs as u64).saturating_mul(NS_PER_SEC)
        }
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's `days_from_civil`).
const fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The proleptic Gregorian `(year, month, day)` of a day since 1970-01-01 (`civil_from_days`).
const fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    (y, m, d)
}

impl Calendar {
    /// The length the fixed-length algorithms count one period as ([`Warp`]): at least
    /// its longest (a day, a week, 31 days, 366 days).
    pub(crate) const fn nominal_ns(self) -> u64 {
        const DAY: u64 = 86_400 * 1_000_000_000;
        match self {
            Calendar::Day => DAY,
            Calendar::Week => 7 * DAY,
            Calendar::Month => 31 * DAY,
            Calendar::Year => 366 * DAY,
        }
    }
}

/// A calendar policy's clock for the fixed-length algorithms: each period maps onto one
/// window of the nominal length (its index times that length, plus the part of the period
/// gone by, scaled), so a fixed or sliding window counts calendar periods unchanged; a
/// duration the algorithm reports maps back by the period's own length ([`Warped::real`]).
/// Lock-free: the current period is cached and swapped when it ends.
#[derive(Debug)]
pub(crate) struct Warp {
    calendar: CalendarWindow,
    nominal: u64,
    cache: arc_swap::ArcSwap<Window>,
}

/// An instant on a [`Warp`]'s clock, and its period's length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Warped {
    /// The instant, on the algorithm's clock.
    pub(crate) now: u64,
    nominal: u64,
    length: u64,
}

impl Warped {
    /// A duration on the algorithm's clock, in real nanoseconds.
    #[inline]
    pub(crate) fn real(&self, d: u64) -> u64 {
        let real = u128::from(d) * u128::from(self.length) / u128::from(self.nominal.max(1));
        u64::try_from(real).unwrap_or(u64::MAX)
    }
}

impl Warp {
    /// The clock of `calendar`'s periods.
    pub(crate) fn new(calendar: CalendarWindow) -> Warp {
        Warp {
            nominal: calendar.calendar().nominal_ns(),
            calendar,
            cache: arc_swap::ArcSwap::from_pointee(Window::default()),
        }
    }

    /// `now` (UNIX ns) on the algorithm's clock.
    #[inline]
    pub(crate) fn at(&self, now: u64) -> Warped {
        let cached = **self.cache.load();
        let w = self.calendar.window_cached(now, &cached);
        if w != cached {
            self.cache.store(std::sync::Arc::new(w));
        }
        let length = w.end_ns.saturating_sub(w.start_ns).max(1);
        let into = u128::from(now.saturating_sub(w.start_ns)) * u128::from(self.nominal)
            / u128::from(length);
        let now = w.index.saturating_mul(self.nominal).saturating_add(
            u64::try_from(into)
                .unwrap_or(u64::MAX)
                .min(self.nominal - 1),
        );
        Warped {
            now,
            nominal: self.nominal,
            length,
        }
    }
}

#[cfg(test)]
mod tests;
