//! The algorithms, each a pure state machine over `now`: no clock, no IO, no locks.
//!
//! Token bucket, GCRA, both leaky buckets and the fixed window keep their whole state in one
//! `u64` ("word algorithms"), so the local store can update them with a single
//! compare-and-swap. The sliding-window counter and the sliding log keep a small struct.
//! [`KeyMachine`] wraps any of them for one key, for tests, simulations and replays.

#[cfg(any(feature = "http", feature = "mesh"))]
pub(crate) mod calendar;
pub mod fixed_window;
pub mod gcra;
pub mod leaky_bucket;
pub mod sliding_log;
pub mod sliding_window;
pub mod token_bucket;

pub use sliding_log::SlidingLog;
pub use sliding_window::SlidingWindowState;

use crate::clock::Nanos;
use crate::decision::Decision;
use crate::policy::{Algorithm, Policy};

/// Decide a request of `cost` tokens at `now` for a word algorithm; return the decision and
/// the next state (equal to `state` when nothing changes).
///
/// `reserve` only matters to a shaping leaky bucket (see [`leaky_bucket::shape`]).
/// Panics in debug builds if `policy` is not a word algorithm.
#[inline]
pub(crate) fn word_decide(
    policy: &Policy,
    state: u64,
    now: Nanos,
    cost: u64,
    reserve: bool,
) -> (Decision, u64) {
    match policy.algorithm() {
        Algorithm::TokenBucket => token_bucket::decide(policy, state, now, cost),
        Algorithm::Gcra => gcra::decide(policy, state, now, cost),
        Algorithm::LeakyBucketPolice => leaky_bucket::police(policy, state, now, cost),
        Algorithm::LeakyBucketShape { max_wait_ns } => {
            leaky_bucket::shape(policy, max_wait_ns, state, now, cost, reserve)
        }
        Algorithm::FixedWindow => fixed_window::decide(policy, state, now, cost),
        Algorithm::SlidingLog | Algorithm::SlidingWindow => {
            debug_assert!(
                false,
                "{} is not a word algorithm",
                policy.algorithm().name()
            );
            (Decision::cannot_fit(policy.capacity()), state)
        }
    }
}

/// Give back `cost` tokens that a word algorithm admitted at `charged_at`.
#[inline]
pub(crate) fn word_refund(policy: &Policy, state: u64, charged_at: Nanos, cost: u64) -> u64 {
    match policy.algorithm() {
        Algorithm::TokenBucket => token_bucket::refund(policy, state, cost),
        Algorithm::Gcra => gcra::refund(policy, state, cost),
        Algorithm::LeakyBucketPolice | Algorithm::LeakyBucketShape { .. } => {
            leaky_bucket::refund(policy, state, cost)
        }
        Algorithm::FixedWindow => fixed_window::refund(policy, state, charged_at, cost),
        Algorithm::SlidingLog | Algorithm::SlidingWindow => state,
    }
}

/// Tell whether a word state is equivalent to a fresh key's at `now`.
#[inline]
pub(crate) fn word_is_idle(policy: &Policy, state: u64, now: Nanos) -> bool {
    match policy.algorithm() {
        Algorithm::TokenBucket => token_bucket::is_idle(state, now),
        Algorithm::Gcra => gcra::is_idle(state, now),
        Algorithm::LeakyBucketPolice | Algorithm::LeakyBucketShape { .. } => {
            leaky_bucket::is_idle(state, now)
        }
        Algorithm::FixedWindow => fixed_window::is_idle(policy, state, now),
        Algorithm::SlidingLog | Algorithm::SlidingWindow => true,
    }
}

/// The state of one key under any algorithm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyState {
    /// A word algorithm's `u64`.
    Word(u64),
    /// A sliding-window counter's counts.
    SlidingWindow(SlidingWindowState),
    /// A sliding log's entries.
    SlidingLog(SlidingLog),
}

impl KeyState {
    /// Return the state of a key never seen before under `policy`.
    pub fn fresh(policy: &Policy) -> Self {
        match policy.algorithm() {
            Algorithm::SlidingLog => KeyState::SlidingLog(SlidingLog::default()),
            Algorithm::SlidingWindow => KeyState::SlidingWindow(SlidingWindowState::default()),
            _ => KeyState::Word(0),
        }
    }
}

/// One key's state machine under one policy: feed it `(now, cost)`, read decisions.
///
/// The local store runs the same functions on shared cells; this single-owner form is what
/// the property tests and the simulator drive.
///
/// ```
/// use std::time::Duration;
/// use ratemesh::Policy;
/// use ratemesh::algorithm::KeyMachine;
///
/// let mut key = KeyMachine::new(Policy::fixed_window(2, Duration::from_secs(1))?);
/// assert!(key.decide(0, 1).is_allowed());
/// assert!(key.decide(100_000_000, 1).is_allowed());
/// assert!(!key.decide(500_000_000, 1).is_allowed()); // the window's limit is reached
/// assert!(key.decide(1_000_000_000, 1).is_allowed()); // the next window
/// # Ok::<(), ratemesh::PolicyError>(())
/// ```
#[derive(Debug, Clone)]
pub struct KeyMachine {
    policy: Policy,
    state: KeyState,
}

impl KeyMachine {
    /// Create the machine of a fresh key.
    pub fn new(policy: Policy) -> Self {
        KeyMachine {
            state: KeyState::fresh(&policy),
            policy,
        }
    }

    /// Return the policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Return the current state.
    pub fn state(&self) -> &KeyState {
        &self.state
    }

    /// Decide a request of `cost` tokens at `now` (a shaping bucket reserves its slot).
    pub fn decide(&mut self, now: Nanos, cost: u64) -> Decision {
        match &mut self.state {
            KeyState::Word(word) => {
                let (decision, next) = word_decide(&self.policy, *word, now, cost, true);
                *word = next;
                decision
            }
            KeyState::SlidingWindow(counts) => counts.decide(&self.policy, now, cost),
            KeyState::SlidingLog(log) => log.decide(&self.policy, now, cost),
        }
    }

    /// Tell whether the key is back to its fresh state at `now`.
    pub fn is_idle(&self, now: Nanos) -> bool {
        match &self.state {
            KeyState::Word(word) => word_is_idle(&self.policy, *word, now),
            KeyState::SlidingWindow(counts) => counts.is_idle(&self.policy, now),
            KeyState::SlidingLog(log) => log.is_idle(&self.policy, now),
        }
    }
}
