//! What the admin API reads of a key's authority, and a reset: the key back to one fresh
//! limit.
//!
//! A reset never lowers a count: counts are cumulative and merge by taking the larger, so
//! a lower one would lose to any older copy. It *forgives* instead: of the current window,
//! every token reported spent (windows), or the bucket filled to what its leases leave
//! (buckets). Tokens leased and not reported spent stay counted: a holder may still admit
//! them, so from the reset to the window's end the cluster admits at most one limit.

use super::{Authority, is_retired};
use crate::clock::Nanos;
use crate::mesh::NodeId;
use crate::mesh::windows::MeshPolicy;

/// A key's authority as the admin API shows it, at one instant on the owner's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct View {
    /// Tokens the authority can grant now.
    pub(crate) available: u64,
    /// Tokens leased to holders and not reported spent or given back.
    pub(crate) leased: u64,
    /// Tokens reported spent in the current window (windows; buckets: since the lease
    /// began), less what a reset forgave.
    pub(crate) used: u64,
    /// Nanoseconds until the count starts afresh (windows: the window's end; buckets: until
    /// it is full again if nothing more is taken, leased tokens counted as taken).
    pub(crate) reset_after: Nanos,
    /// The current window's index (0 for buckets).
    pub(crate) window: u64,
    /// Each live holder: its node, what it holds unspent, what it reported spent.
    pub(crate) holders: Vec<(NodeId, u64, u64)>,
    /// Tokens a reset forgave in the current window.
    pub(crate) forgiven: u64,
}

impl Authority {
    /// The key's state at `now`.
    pub(crate) fn view(&mut self, policy: &MeshPolicy, now: Nanos) -> View {
        let available = self.available(policy, now);
        let holders: Vec<(NodeId, u64, u64)> = self
            .holders
            .iter()
            .filter(|h| !is_retired(h))
            .map(|h| (h.node, h.tally.unspent(), h.tally.used))
            .collect();
        let leased: u64 = self
            .holders
            .iter()
            .filter(|h| !h.closed)
            .map(|h| h.tally.unspent())
            .sum();
        let used: u64 = self.holders.iter().map(|h| h.tally.used).sum();
        let reset_after = if policy.algorithm().counts_per_window() {
            self.next_start.saturating_sub(now)
        } else {
            // Leased tokens count as taken, as they do for the limit.
            policy.window_ns().saturating_sub(self.level_ns)
        };
        View {
            available,
            leased,
            used: used.saturating_sub(self.forgiven),
            reset_after,
            window: if policy.algorithm().counts_per_window() {
                self.window
            } else {
                0
            },
            holders,
            forgiven: self.forgiven,
        }
    }

    /// Reset the key at `now`: forgive what the current window counted beyond what its
    /// holders still hold (windows; a sliding window forgets its previous window too), or
    /// fill the bucket to what its leases leave. Return the window and what it forgave.
    pub(crate) fn reset(&mut self, policy: &MeshPolicy, now: Nanos) -> (u64, u64) {
        self.version += 1;
        self.dirty = true;
        if policy.algorithm().counts_per_window() {
            self.available(policy, now);
            let leased = self.leased_in_window();
            let unspent: u64 = self
                .holders
                .iter()
                .map(|h| {
                    h.tally
                        .granted
                        .saturating_sub(h.tally.returned)
                        .saturating_sub(h.tally.used)
                })
                .sum();
            self.forgiven = leased.saturating_sub(unspent);
            self.forgiven_before = self.previous;
            (self.window, self.forgiven)
        } else {
            self.refill(policy, now);
            let cap = policy
                .window_ns()
                .saturating_sub(self.outstanding().saturating_mul(self.interval(policy)));
            self.level_ns = self.level_ns.max(cap);
            self.capped_since = Some(now);
            self.credited_until = now;
            (0, 0)
        }
    }

    /// What a reset in `window` forgave, as the key's successor heard it: it applies if
    /// this authority (taken over from the successor's backup) is still in that window.
    pub(crate) fn forgive(&mut self, window: u64, forgiven: u64) {
        if self.window == window {
            self.forgiven = self.forgiven.max(forgiven);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::mesh::authority::tests::{KEY, want as want_of};
    use crate::mesh::message::Want;
    use crate::policy::Policy;

    const S: Nanos = 1_000_000_000;

    fn want(window: u64, granted: u64, used: u64) -> Want {
        want_of(window, granted, used, 16)
    }

    #[test]
    fn a_reset_forgives_what_was_spent_and_keeps_what_is_leased() {
        let policy = MeshPolicy::from(Policy::fixed_window(10, Duration::from_secs(60)).unwrap());
        let now = 60 * S;
        let mut a = Authority::fresh(KEY, &policy, now);
        a.report(&policy, now, 2, 1, &want(1, 0, 0), true);
        a.request(&policy, now, 2, 1, 10, 0);
        assert_eq!(a.available(&policy, now), 0);
        // Node 2 reports 7 of its 10 spent.
        a.report(&policy, now, 2, 1, &want(1, 10, 7), true);
        let before = a.view(&policy, now);
        assert_eq!((before.available, before.leased, before.used), (0, 3, 7));
        assert_eq!(a.reset(&policy, now), (1, 7));
        // The 3 still leased may be admitted: 7 more can be granted, 10 in all.
        let after = a.view(&policy, now);
        assert_eq!((after.available, after.leased, after.used), (7, 3, 0));
        assert_eq!(after.reset_after, 60 * S);
        // The next window forgets the forgiveness.
        assert_eq!(a.available(&policy, 120 * S), 10);
        assert_eq!(a.view(&policy, 120 * S).forgiven, 0);
    }

    #[test]
    fn a_reset_fills_a_bucket_to_what_its_leases_leave() {
        let policy = MeshPolicy::from(Policy::token_bucket(1, Duration::from_secs(1), 10).unwrap());
        let mut a = Authority::fresh(KEY, &policy, S);
        a.report(&policy, S, 2, 1, &want(0, 0, 0), true);
        a.request(&policy, S, 2, 1, 10, 0);
        assert_eq!(a.available(&policy, S), 0);
        a.report(&policy, S, 2, 1, &want(0, 10, 6), true);
        a.reset(&policy, S);
        // 4 still leased: 6 free, full again 4 s after.
        assert_eq!(a.available(&policy, S), 6);
        assert_eq!(a.view(&policy, S).reset_after, 4 * S);
    }
}
