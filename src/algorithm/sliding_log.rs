//! Sliding log: exact. Keeps `(time, cost)` of every admitted request still inside the window
//! and admits while their sum plus the new cost stays within `limit`.
//!
//! An entry admitted at `t` counts for every `now` with `now < t + W`. Entries have a cost of
//! at least 1 and sum to at most `limit`, so a key never holds more than `limit` entries;
//! requests at the same nanosecond share one entry.

use std::collections::VecDeque;

use crate::clock::Nanos;
use crate::decision::Decision;
use crate::policy::Policy;

/// The admitted requests of one key still inside the window, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlidingLog {
    entries: VecDeque<(Nanos, u64)>,
    total: u64,
}

impl SlidingLog {
    /// Drop entries that left the window ending at `now`.
    #[inline]
    fn expire(&mut self, window_ns: Nanos, now: Nanos) {
        while let Some(&(at, cost)) = self.entries.front() {
            if at.saturating_add(window_ns) > now {
                break;
            }
            self.total -= cost;
            self.entries.pop_front();
        }
    }

    /// Return the number of entries kept (at most the policy's `limit`).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Tell whether no entry is kept.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Decide a request of `cost` tokens at `now`, logging it if admitted.
    ///
    /// A cost of 0 is a peek: the log's total now, admitted if one more token fits, else the
    /// denial of a request of one token; nothing is logged (entries that left the window are
    /// dropped, which changes no decision).
    pub fn decide(&mut self, policy: &Policy, now: Nanos, cost: u64) -> Decision {
        if cost == 0 {
            return self.peek(policy, now);
        }
        self.decide_cost(policy, now, cost)
    }

    /// [`SlidingLog::decide`] for a cost of at least 1.
    #[inline(always)]
    fn decide_cost(&mut self, policy: &Policy, now: Nanos, cost: u64) -> Decision {
        let limit = policy.capacity();
        if cost > limit {
            return Decision::cannot_fit(limit);
        }
        let window = policy.window_ns();
        self.expire(window, now);
        if self.total + cost > limit {
            // The earliest instant at which enough old entries have left the window.
            let mut freed = 0;
            let mut retry_after = window;
            for &(at, entry_cost) in &self.entries {
                freed += entry_cost;
                if self.total - freed + cost <= limit {
                    retry_after = (at + window).saturating_sub(now);
                    break;
                }
            }
            let reset_after = self.reset_after(window, now);
            return Decision::denied(limit, limit - self.total, reset_after, retry_after);
        }
        match self.entries.back_mut() {
            Some((at, entry_cost)) if *at == now => *entry_cost += cost,
            _ => self.entries.push_back((now, cost)),
        }
        self.total += cost;
        Decision::allowed(limit, limit - self.total, self.reset_after(window, now))
    }

    /// Report the log now as a request of one token would find it; log nothing.
    #[inline(always)]
    fn peek(&mut self, policy: &Policy, now: Nanos) -> Decision {
        let (limit, window) = (policy.capacity(), policy.window_ns());
        self.expire(window, now);
        if self.total >= limit {
            // A request of one token is denied, and a denial logs nothing.
            return self.decide_cost(policy, now, 1);
        }
        Decision::allowed(limit, limit - self.total, self.reset_after(window, now))
    }

    fn reset_after(&self, window: Nanos, now: Nanos) -> Nanos {
        self.entries
            .back()
            .map_or(0, |&(at, _)| (at + window).saturating_sub(now))
    }

    /// Give back `cost` tokens admitted at `charged_at`.
    pub fn refund(&mut self, charged_at: Nanos, cost: u64) {
        if let Some(pos) = self.entries.iter().rposition(|&(at, _)| at == charged_at) {
            let entry = &mut self.entries[pos];
            let taken = entry.1.min(cost);
            entry.1 -= taken;
            self.total -= taken;
            if entry.1 == 0 {
                self.entries.remove(pos);
            }
        }
    }

    /// Tell whether every entry has left the window, so the key can be forgotten.
    pub fn is_idle(&self, policy: &Policy, now: Nanos) -> bool {
        self.entries
            .back()
            .is_none_or(|&(at, _)| at.saturating_add(policy.window_ns()) <= now)
    }
}
