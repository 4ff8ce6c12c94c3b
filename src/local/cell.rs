//! Per-key cells: where one request is decided against one key's state.
//!
//! [`WordCell`] holds a word algorithm's state in one `AtomicU64` and decides with a
//! compare-and-swap loop: read the state, run the pure algorithm, publish the next state only
//! if nobody changed it meanwhile, otherwise decide again on the newer state. A denial writes
//! nothing. The sliding algorithms keep a small struct behind a per-key mutex.
//!
//! `WordCell` is public only to the loom models (`--cfg ratemesh_loom`), which race it from
//! outside the crate.
#![cfg_attr(not(ratemesh_loom), allow(unreachable_pub))]

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

    /// Create a cell holding `state` (a word algorithm's state).
    pub fn with_state(state: u64) -> Self {
        WordCell {
            state: AtomicU64::new(state),
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

    /// Decide like [`WordCell::decide`] on a cell that may have been retired; return `None`
    /// (and change nothing) if it was: the key must then be decided through the map.
    #[inline]
    pub fn decide_live(
        &self,
        policy: &Policy,
        now: Nanos,
        cost: u64,
        reserve: bool,
    ) -> Option<Decision> {
        if policy.algorithm() == Algorithm::TokenBucket {
            return self.decide_token_bucket_live(policy, now, cost);
        }
        self.update_live(|state| word_decide(policy, state, now, cost, reserve))
    }

    /// [`WordCell::decide_token_bucket`] on a cell that may have been retired (`None`).
    #[inline(always)]
    pub fn decide_token_bucket_live(
        &self,
        policy: &Policy,
        now: Nanos,
        cost: u64,
    ) -> Option<Decision> {
        live_outcome(self.update_then(
            live(|state| token_bucket::plan(policy, state, now, cost)),
            |deficit_after_ns| token_bucket::admitted(policy, deficit_after_ns),
        ))
    }

    /// [`WordCell::update`] on a cell that may have been retired (`None`).
    #[inline(always)]
    pub fn update_live(&self, step: impl Fn(u64) -> (Decision, u64)) -> Option<Decision> {
        live_outcome(self.update_then(
            live(|state| {
                let (decision, next) = step(state);
                Ok((next, decision))
            }),
            |decision| decision,
        ))
    }

    /// Decide a token bucket request: only the next state is computed inside the
    /// compare-and-swap loop; the admission's report (a division) after it succeeds, which
    /// keeps the loop short when threads contend for one key.
    #[inline(always)]
    pub fn decide_token_bucket(&self, policy: &Policy, now: Nanos, cost: u64) -> Decision {
        outcome(self.update_then(
            |state| {
                debug_assert_ne!(state, RETIRED, "a decision on a retired cell");
                token_bucket::plan(policy, state, now, cost)
            },
            |deficit_after_ns| token_bucket::admitted(policy, deficit_after_ns),
        ))
    }

    /// Run `plan` (state in; next state and a report, or a stop that writes nothing) in a
    /// compare-and-swap loop; once the next state is published, turn the report into the
    /// decision with `finish`.
    #[inline(always)]
    pub fn update_then<R, E>(
        &self,
        plan: impl Fn(u64) -> Result<(u64, R), E>,
        finish: impl FnOnce(R) -> Decision,
    ) -> Result<Decision, E> {
        let mut current = self.state.load(Ordering::Acquire);
        loop {
            let (next, report) = plan(current)?;
            if next == current {
                return Ok(finish(report));
            }
            match self.state.compare_exchange_weak(
                current,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(finish(report)),
                Err(actual) => current = actual,
            }
        }
    }

    /// Run `step` (a pure algorithm: state in, decision and next state out) in a
    /// compare-and-swap loop until its next state is published or nothing needs writing.
    #[inline]
    pub fn update(&self, step: impl Fn(u64) -> (Decision, u64)) -> Decision {
        outcome(self.update_then(
            |state| {
                debug_assert_ne!(state, RETIRED, "a decision on a retired cell");
                let (decision, next) = step(state);
                Ok::<_, Decision>((next, decision))
            },
            |decision| decision,
        ))
    }

    /// Retire the cell whatever its state (its state moves elsewhere); return that state.
    pub fn retire(&self) -> u64 {
        self.state.swap(RETIRED, Ordering::AcqRel)
    }

    /// Retire the cell if its key is idle at `now`: from then on it never admits (every
    /// [`WordCell::decide_live`] returns `None`). Return whether it is retired.
    ///
    /// The compare-and-swap from the idle state fails if a decision changed the state first,
    /// so a retired cell has admitted nothing since it was found idle.
    pub fn retire_if_idle(&self, policy: &Policy, now: Nanos) -> bool {
        let state = self.state.load(Ordering::Acquire);
        word_is_idle(policy, state, now)
            && self
                .state
                .compare_exchange(state, RETIRED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }

    /// Give back `cost` tokens admitted at `charged_at`.
    pub fn refund(&self, policy: &Policy, charged_at: Nanos, cost: u64) {
        let mut current = self.state.load(Ordering::Acquire);
        loop {
            debug_assert_ne!(current, RETIRED, "a refund on a retired cell");
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

/// The state of a retired cell (see [`WordCell::retire_if_idle`]). No algorithm reaches it
/// from a clock reading: time states stay below `now + 2^63` and a fixed window's count below
/// `u32::MAX`.
pub const RETIRED: u64 = u64::MAX;

/// Stop a plan on a retired cell.
#[inline(always)]
fn live<R>(
    plan: impl Fn(u64) -> Result<(u64, R), Decision>,
) -> impl Fn(u64) -> Result<(u64, R), Option<Decision>> {
    move |state| {
        if state == RETIRED {
            Err(None)
        } else {
            plan(state).map_err(Some)
        }
    }
}

/// The decision of a loop that stops only with a decision.
#[inline(always)]
fn outcome(result: Result<Decision, Decision>) -> Decision {
    match result {
        Ok(decision) | Err(decision) => decision,
    }
}

/// The decision of a loop that may stop on a retired cell (`None`).
#[inline(always)]
fn live_outcome(result: Result<Decision, Option<Decision>>) -> Option<Decision> {
    match result {
        Ok(decision) => Some(decision),
        Err(stop) => stop,
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
