//! The authority's last denial, as a holding remembers it: requests that cost as much as the
//! cheapest one it denied are denied here, without asking again, until its retry time.

use crate::clock::Nanos;

/// How soon a holder asks again after a denial while requests still wait.
pub(super) const DENIED_RESEND_NS: Nanos = 2_000_000;

/// A denial in force: `cost` tokens or more are refused until `until` (local), told to
/// retry at `retry_at` (no earlier than `until`; later during a lockout that outlasts the
/// window the holder asks about again at its end).
#[derive(Debug, Default)]
pub(super) struct Denial {
    until: Nanos,
    cost: u64,
    retry_at: Nanos,
}

impl Denial {
    /// The authority denied requests costing `cost` and more until `until`, and said to
    /// retry at `retry_at`.
    pub(super) fn set(&mut self, until: Nanos, cost: u64, retry_at: Nanos) {
        self.until = until;
        self.cost = cost;
        self.retry_at = retry_at.max(until);
    }

    /// The room it was about changed: the next request asks again.
    pub(super) fn forget(&mut self) {
        self.until = 0;
    }

    /// The time left before a request of `cost` at `now` may retry, if it is refused here.
    pub(super) fn refuses(&self, now: Nanos, cost: u64) -> Option<Nanos> {
        (now < self.until && cost >= self.cost).then(|| self.retry_at - now)
    }

    /// Until when the denial holds (0: none).
    pub(super) fn until(&self) -> Nanos {
        self.until
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_denial_refuses_as_dear_requests_until_its_time() {
        let mut d = Denial::default();
        assert_eq!(d.refuses(0, 5), None);
        d.set(100, 4, 0);
        assert_eq!(d.refuses(40, 4), Some(60));
        assert_eq!(d.refuses(40, 3), None);
        assert_eq!(d.refuses(100, 9), None);
        // A lockout past the window: refused until the window's end, told its own end.
        d.set(100, 1, 5_000);
        assert_eq!(d.refuses(40, 1), Some(4_960));
        assert_eq!(d.refuses(100, 1), None);
        d.forget();
        assert_eq!(d.refuses(40, 9), None);
    }
}
