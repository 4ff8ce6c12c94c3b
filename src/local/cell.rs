//! Per-key cells: where one request is decided against one key's state.
//!
//! [`WordCell`] holds a word algorithm's state in one `AtomicU64` and decides with a
//! compare-and-swap loop: read the state, run the pure algorithm, publish the next state only
//! if nobody changed it meanwhile, otherwise decide again on the newer state. A denial writes
//! nothing. The sliding algorithms keep a small struct behind a per-key mutex.

use std::sync::{Mutex, MutexGuard};

use crate::algorithm::{
    SlidingLog, SlidingWindowState, token_bucket, word_decide, word_is_idle, word_refund,
};
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::policy::{Algorithm, Policy};
use crate::sync::{AtomicU64, Ordering};

/// One key's state for token bucket, GCRA, leaky buckets and fixed window: one atomic word.
#[derive(Debug)]
pub struct WordCell {
    state: AtomicU64,
}

impl Default for WordCell {
    fn default() -> Self {
        Self::new()
    }
}

impl WordCell {
    /// Create the cell of a fresh key.
    pub fn new() -> Self {
        WordCell {
            state: AtomicU64::new(0),
        }
    }

    /// Decide a request of `cost` tokens at `now` with one compare-and-swap loop.
    #[inline]
    pub fn decide(&self, policy: &Policy, now: Nanos, cost: u64, reserve: bool) -> Decision {
        if policy.algorithm() == Algorithm::TokenBucket {
            return self.decide_token_bucket(policy, now, cost);
        }
        self.update(|state| word_decide(policy, state, now, cost, reserve))
    }

    /// Decide a token bucket request: only the next state is computed inside the
    /// compare-and-swap loop; the admission's report (a division) after it succeeds, which
    /// keeps the loop short when threads contend for one key.
    #[inline(always)]
    pub fn decide_token_bucket(&self, policy: &Policy, now: Nanos, cost: u64) -> Decision {
        self.update_then(
            |state| token_bucket::plan(policy, state, now, cost),
            |deficit_after_ns| token_bucket::admitted(policy, deficit_after_ns),
        )
    }

    /// Run `plan` (state in; next state and a report, or a decision that writes nothing) in
    /// a compare-and-swap loop; once the next state is published, turn the report into the
    /// decision with `finish`.
    #[inline(always)]
    pub fn update_then<R>(
        &self,
        plan: impl Fn(u64) -> Result<(u64, R), Decision>,
        finish: impl FnOnce(R) -> Decision,
    ) -> Decision {
        let mut current = self.state.load(Ordering::Acquire);
        loop {
            let (next, report) = match plan(current) {
                Ok(planned) => planned,
                Err(decision) => return decision,
            };
            if next == current {
                return finish(report);
            }
            match self.state.compare_exchange_weak(
                current,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return finish(report),
                Err(actual) => current = actual,
            }
        }
    }

    /// Run `step` (a pure algorithm: state in, decision and next state out) in a
    /// compare-and-swap loop until its next state is published or nothing needs writing.
    #[inline]
    pub fn update(&self, step: impl Fn(u64) -> (Decision, u64)) -> Decision {
        self.update_then(
            |state| {
                let (decision, next) = step(state);
                Ok((next, decision))
            },
            |decision| decision,
        )
    }

    /// Give back `cost` tokens admitted at `charged_at`.
    pub fn refund(&self, policy: &Policy, charged_at: Nanos, cost: u64) {
        let mut current = self.state.load(Ordering::Acquire);
        loop {
            let next = word_refund(policy, current, charged_at, cost);
            match self.state.compare_exchange_weak(
                current,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return,
                Err(actual) => current = actual,
            }
        }
    }

    /// Return the raw state word.
    pub fn load(&self) -> u64 {
        self.state.load(Ordering::Acquire)
    }

    /// Tell whether the key is back to its fresh state at `now`.
    pub fn is_idle(&self, policy: &Policy, now: Nanos) -> bool {
        word_is_idle(policy, self.load(), now)
    }
}

/// Lock a per-key mutex; a poisoned lock (a panic elsewhere) still yields the state.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The behaviour the store needs from any per-key cell.
pub(crate) trait Cell: Default + Send + Sync {
    fn refund(&self, policy: &Policy, charged_at: Nanos, cost: u64);
    fn is_idle(&self, policy: &Policy, now: Nanos) -> bool;
}

impl Cell for WordCell {
    fn refund(&self, policy: &Policy, charged_at: Nanos, cost: u64) {
        WordCell::refund(self, policy, charged_at, cost)
    }
    fn is_idle(&self, policy: &Policy, now: Nanos) -> bool {
        WordCell::is_idle(self, policy, now)
    }
}

impl Cell for Mutex<SlidingWindowState> {
    fn refund(&self, policy: &Policy, charged_at: Nanos, cost: u64) {
        lock(self).refund(policy, charged_at, cost)
    }
    fn is_idle(&self, policy: &Policy, now: Nanos) -> bool {
        lock(self).is_idle(policy, now)
    }
}

impl Cell for Mutex<SlidingLog> {
    fn refund(&self, _policy: &Policy, charged_at: Nanos, cost: u64) {
        lock(self).refund(charged_at, cost)
    }
    fn is_idle(&self, policy: &Policy, now: Nanos) -> bool {
        lock(self).is_idle(policy, now)
    }
}
