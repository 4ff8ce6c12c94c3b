//! A mesh policy as the state of its keys enforces it: its limits (a [`Policy`]) and where
//! its windows fall on the clock, lengths from the UNIX epoch or the calendar periods of a
//! time zone (`calendar`, `time_zone`).
//!
//! Window `i` of a policy of length `w` is `[i × w, (i + 1) × w)`; of a calendar, the period
//! [`CalendarWindow`] numbers `i`, whose length varies (a February, a day of a daylight-saving
//! change). Every node numbers windows alike, so the index a want names is the same window
//! wherever it is read; an authority places each window on its own clock from the index
//! ([`crate::mesh::authority`]). Sans-IO: `now` is passed in.

use std::ops::Deref;

use crate::algorithm::calendar::{CalendarWindow, Window};
use crate::clock::Nanos;
use crate::policy::Policy;

/// A mesh policy with the schedule of its windows. Derefs to its [`Policy`]; the
/// [`Policy::window_ns`] of a calendar policy is its periods' nominal length (at least the
/// longest), which bounds a period where an upper bound is enough.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MeshPolicy {
    policy: Policy,
    calendar: Option<CalendarWindow>,
}

impl MeshPolicy {
    /// `policy`, whose windows (if it counts windows) are `calendar`'s periods, or lengths
    /// from the epoch (`None`).
    pub(crate) fn new(policy: Policy, calendar: Option<CalendarWindow>) -> Self {
        let calendar = calendar.filter(|_| policy.algorithm().counts_per_window());
        MeshPolicy { policy, calendar }
    }

    /// The same windows with a limit of `limit` (a window keeps its length, a bucket its
    /// time to fill); unchanged if no policy of the kind takes it.
    pub(crate) fn with_limit(self, limit: u64) -> Self {
        MeshPolicy {
            policy: self.policy.with_limit(limit).unwrap_or(self.policy),
            calendar: self.calendar,
        }
    }

    /// The window containing `now`.
    pub(crate) fn window_at(&self, now: Nanos) -> Window {
        match &self.calendar {
            Some(c) => c.window_at(now),
            None => self.window(now / self.policy.window_ns().max(1)),
        }
    }

    /// Window `index`.
    pub(crate) fn window(&self, index: u64) -> Window {
        let (start_ns, end_ns) = match &self.calendar {
            Some(c) => (c.start_of(index), c.end_of(index)),
            None => {
                let start = index.saturating_mul(self.policy.window_ns());
                (start, start.saturating_add(self.policy.window_ns()))
            }
        };
        Window {
            index,
            start_ns,
            end_ns,
        }
    }

    /// The length of window `index`.
    pub(crate) fn length_of(&self, index: u64) -> Nanos {
        match &self.calendar {
            Some(_) => self.window(index).len(),
            None => self.policy.window_ns(),
        }
    }
}

impl Deref for MeshPolicy {
    type Target = Policy;

    fn deref(&self) -> &Policy {
        &self.policy
    }
}

impl From<Policy> for MeshPolicy {
    /// A policy whose windows are lengths from the epoch.
    fn from(policy: Policy) -> Self {
        MeshPolicy::new(policy, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::calendar::Calendar;
    use std::time::Duration;

    const S: Nanos = 1_000_000_000;

    #[test]
    fn lengths_from_the_epoch() {
        let p = MeshPolicy::from(Policy::global_fixed_window(10, Duration::from_secs(60)).unwrap());
        let w = p.window_at(125 * S);
        assert_eq!((w.index, w.start_ns, w.end_ns), (2, 120 * S, 180 * S));
        assert_eq!(p.window(3).start_ns, 180 * S);
        assert_eq!(p.length_of(7), 60 * S);
    }

    #[test]
    fn calendar_months_have_their_own_lengths() {
        let policy = Policy::global_fixed_window(10, Duration::from_secs(31 * 86_400)).unwrap();
        let calendar = CalendarWindow::from_zone_name(Calendar::Month, "UTC").unwrap();
        let p = MeshPolicy::new(policy, Some(calendar));
        // 2028-02-15T00:00:00Z: February of a leap year, 29 days.
        let w = p.window_at(feb_15_2028());
        assert_eq!(w.len(), 29 * 86_400 * S);
        assert_eq!(p.length_of(w.index + 1), 31 * 86_400 * S);
        assert_eq!(p.window(w.index + 1).start_ns, w.end_ns);
        // A bucket has no windows: its calendar is dropped.
        let bucket = Policy::token_bucket(10, Duration::from_secs(1), 10).unwrap();
        let calendar = CalendarWindow::from_zone_name(Calendar::Day, "UTC").unwrap();
        assert_eq!(
            MeshPolicy::new(bucket, Some(calendar)),
            MeshPolicy::from(bucket)
        );
    }

    /// 2028-02-15T00:00:00Z in ns.
    fn feb_15_2028() -> Nanos {
        1_834_185_600 * S
    }
}
