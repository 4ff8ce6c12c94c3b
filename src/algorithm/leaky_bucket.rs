//! Leaky bucket, as a meter (police: reject when full) and as a queue (shape: wait for a slot).
//!
//! Both keep one `u64`. Police keeps `drained_at_ns`, the instant at which the bucket will be
//! empty: its level is `drained_at − now` nanoseconds of tokens out of `capacity·interval`.
//! Shape keeps `next_free_ns`, the start of the next free slot: a request of `cost` tokens
//! is released at `max(next_free, now)` and holds the line for `cost·interval` after that.

use crate::clock::Nanos;
use crate::decision::Decision;
use crate::policy::Policy;

/// Decide a policing request of `cost` tokens at `now`; return the decision and next state.
///
/// A cost of 0 is a peek: the level now, admitted if one more token fits, else the denial of
/// a request of one token; the state is unchanged.
#[inline]
pub fn police(policy: &Policy, drained_at_ns: Nanos, now: Nanos, cost: u64) -> (Decision, Nanos) {
    if cost == 0 {
        return (peek_police(policy, drained_at_ns, now), drained_at_ns);
    }
    police_cost(policy, drained_at_ns, now, cost)
}

/// [`police`] for a cost of at least 1.
#[inline(always)]
fn police_cost(policy: &Policy, drained_at_ns: Nanos, now: Nanos, cost: u64) -> (Decision, Nanos) {
    let capacity = policy.capacity();
    if cost > capacity {
        return (Decision::cannot_fit(capacity), drained_at_ns);
    }
    let interval = policy.interval_ns();
    let depth_ns = capacity * interval;
    let level_ns = drained_at_ns.saturating_sub(now);
    let level_after = level_ns + cost * interval;
    if level_after > depth_ns {
        let free_ns = depth_ns.saturating_sub(level_ns);
        let decision = Decision::denied(
            capacity,
            policy.tokens_in(free_ns),
            level_ns,
            level_after - depth_ns,
        );
        return (decision, drained_at_ns);
    }
    let decision = Decision::allowed(
        capacity,
        policy.tokens_in(depth_ns - level_after),
        level_after,
    );
    (decision, now + level_after)
}

/// Decide a shaping request of `cost` tokens at `now`; return the decision and next state.
///
/// With `reserve`, an admitted request may be given a slot in the future (`delay_ns`), up to
/// `max_wait_ns` away, and the slot is taken at once. Without it, only a slot that starts
/// now is taken; otherwise the request is denied with the wait as `retry_after_ns`, which
/// is how a waiting caller polls without holding a slot it might abandon.
///
/// A cost of 0 is a peek: the verdict and delay a request of one token would get now, with
/// no slot taken.
#[inline]
pub fn shape(
    policy: &Policy,
    max_wait_ns: Nanos,
    next_free_ns: Nanos,
    now: Nanos,
    cost: u64,
    reserve: bool,
) -> (Decision, Nanos) {
    if cost == 0 {
        let peek = peek_shape(policy, max_wait_ns, next_free_ns, now, reserve);
        return (peek, next_free_ns);
    }
    shape_cost(policy, max_wait_ns, next_free_ns, now, cost, reserve)
}

/// [`shape`] for a cost of at least 1.
#[inline(always)]
fn shape_cost(
    policy: &Policy,
    max_wait_ns: Nanos,
    next_free_ns: Nanos,
    now: Nanos,
    cost: u64,
    reserve: bool,
) -> (Decision, Nanos) {
    let capacity = policy.capacity();
    if cost > capacity {
        return (Decision::cannot_fit(capacity), next_free_ns);
    }
    let interval = policy.interval_ns();
    let depth_ns = capacity * interval;
    let start = next_free_ns.max(now);
    let wait_ns = start - now;
    if wait_ns > max_wait_ns || (!reserve && wait_ns > 0) {
        let retry_after = if reserve {
            wait_ns - max_wait_ns
        } else {
            wait_ns
        };
        let remaining = policy.tokens_in(depth_ns.saturating_sub(wait_ns));
        let decision = Decision::denied(capacity, remaining, wait_ns, retry_after);
        return (decision, next_free_ns);
    }
    let next_free = start + cost * interval;
    let queued_after = next_free - now;
    let mut decision = Decision::allowed(
        capacity,
        policy.tokens_in(depth_ns.saturating_sub(queued_after)),
        queued_after,
    );
    decision.delay_ns = wait_ns;
    (decision, next_free)
}

/// Report a policing bucket's level now as a request of one token would find it.
#[inline(always)]
fn peek_police(policy: &Policy, drained_at_ns: Nanos, now: Nanos) -> Decision {
    let (probe, _) = police_cost(policy, drained_at_ns, now, 1);
    if !probe.is_allowed() {
        return probe;
    }
    // The level before that token.
    let level_ns = probe.reset_after_ns - policy.interval_ns();
    let free_ns = policy.capacity() * policy.interval_ns() - level_ns;
    Decision::allowed(policy.capacity(), policy.tokens_in(free_ns), level_ns)
}

/// Report a shaping bucket's queue now as a request of one token would find it.
#[inline(always)]
fn peek_shape(
    policy: &Policy,
    max_wait_ns: Nanos,
    next_free_ns: Nanos,
    now: Nanos,
    reserve: bool,
) -> Decision {
    let (probe, _) = shape_cost(policy, max_wait_ns, next_free_ns, now, 1, reserve);
    if !probe.is_allowed() {
        return probe;
    }
    // The queue before that slot: the wait it would have.
    let wait_ns = probe.delay_ns;
    let depth_ns = policy.capacity() * policy.interval_ns();
    let remaining = policy.tokens_in(depth_ns.saturating_sub(wait_ns));
    let mut decision = Decision::allowed(policy.capacity(), remaining, wait_ns);
    decision.delay_ns = wait_ns;
    decision
}

/// Give back `cost` tokens taken earlier by a policing bucket.
#[inline]
pub fn refund(policy: &Policy, state_ns: Nanos, cost: u64) -> Nanos {
    state_ns.saturating_sub(cost * policy.interval_ns())
}

/// Tell whether the bucket is empty (police) or no slot is taken (shape).
#[inline]
pub fn is_idle(state_ns: Nanos, now: Nanos) -> bool {
    state_ns <= now
}
