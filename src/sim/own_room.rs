//! The room one central limiter would have for a key had it admitted exactly what the mesh
//! admitted: what a denial is measured against, besides the oracle's own history.

use crate::clock::Nanos;
use crate::policy::Policy;

/// The room one central limiter would see for a key if it had admitted exactly what the
/// mesh admitted (times on the oracle's clock), asked in increasing time.
pub(super) struct OwnRoom<'a> {
    policy: Policy,
    admissions: &'a [(Nanos, u64)],
    /// Prefix sums of the admitted costs.
    prefix: Vec<u64>,
    /// Buckets: admissions applied so far, the level (ns of refill, may go negative) and
    /// its instant.
    applied: usize,
    level: i128,
    level_at: Option<i128>,
}

impl<'a> OwnRoom<'a> {
    pub(super) fn new(policy: &Policy, admissions: &'a [(Nanos, u64)]) -> Self {
        let mut prefix = Vec::with_capacity(admissions.len() + 1);
        prefix.push(0);
        for &(_, c) in admissions {
            prefix.push(prefix.last().copied().unwrap_or(0) + c);
        }
        OwnRoom {
            policy: *policy,
            admissions,
            prefix,
            applied: 0,
            level: i128::from(policy.window_ns()),
            level_at: None,
        }
    }

    /// Admitted cost in true time `[from, to)`.
    fn sum(&self, from: Nanos, to: Nanos) -> u64 {
        let a = self.admissions.partition_point(|&(t, _)| t < from);
        let b = self.admissions.partition_point(|&(t, _)| t < to);
        self.prefix[b.max(a)] - self.prefix[a]
    }

    /// The room at true time `at`, which is `oracle_at` on the oracle's clock.
    pub(super) fn at(&mut self, at: Nanos, oracle_at: Nanos) -> u64 {
        let limit = self.policy.capacity();
        let w = self.policy.window_ns();
        if self.policy.algorithm().is_bucket() {
            let interval = i128::from(self.policy.interval_ns().max(1));
            let cap = i128::from(w);
            let refill_to = |level: &mut i128, level_at: &mut Option<i128>, t: i128| {
                let from = level_at.unwrap_or(t);
                *level = (*level + (t - from).max(0)).min(cap);
                *level_at = Some(t);
            };
            while self.applied < self.admissions.len() && self.admissions[self.applied].0 < at {
                let (t, c) = self.admissions[self.applied];
                refill_to(&mut self.level, &mut self.level_at, i128::from(t));
                self.level -= i128::from(c) * interval;
                self.applied += 1;
            }
            refill_to(&mut self.level, &mut self.level_at, i128::from(at));
            (self.level.max(0) / interval) as u64
        } else {
            // The oracle's window grid, in true time.
            let start = at - oracle_at % w;
            let current = self.sum(start, at);
            let previous = if self.policy.algorithm().weighs_previous() {
                let e = oracle_at % w;
                let before = self.sum(start.saturating_sub(w), start);
                (u128::from(before) * u128::from(w - e) / u128::from(w)) as u64
            } else {
                0
            };
            limit.saturating_sub(current + previous)
        }
    }
}
