//! Token bucket: `capacity` tokens, one more every `interval_ns`, a request takes `cost`.
//!
//! The state is one `u64`: `full_at_ns`, the instant at which the bucket will be full again
//! (0 for a fresh key). The level follows from it: `capacity·interval − (full_at − now)`
//! nanoseconds' worth of tokens. Exact integer arithmetic, no drift, and it fits in one
//! atomic word.

use crate::clock::Nanos;
use crate::decision::Decision;
use crate::policy::Policy;

/// Decide a request of `cost` tokens at `now`; return the decision and the next state. A
/// cost of 0 is a peek ([`plan`]).
#[inline]
pub fn decide(policy: &Policy, full_at_ns: Nanos, now: Nanos, cost: u64) -> (Decision, Nanos) {
    match plan(policy, full_at_ns, now, cost) {
        Ok((next, deficit_after_ns)) => (admitted(policy, deficit_after_ns), next),
        Err(decision) => (decision, full_at_ns),
    }
}

/// Plan a request of `cost` tokens at `now`: the next state and the time still missing until
/// full after it (for [`admitted`]), or the decision that writes nothing (a denial, a cost
/// that can never fit, a peek). The part of [`decide`] that a compare-and-swap loop must
/// repeat.
///
/// A cost of 0 is a peek: the level now, admitted if a request of one token would be, else
/// that request's denial.
#[inline(always)]
pub fn plan(
    policy: &Policy,
    full_at_ns: Nanos,
    now: Nanos,
    cost: u64,
) -> Result<(Nanos, Nanos), Decision> {
    if cost == 0 {
        return Err(peek(policy, full_at_ns, now));
    }
    plan_cost(policy, full_at_ns, now, cost)
}

/// [`plan`] for a cost of at least 1.
#[inline(always)]
fn plan_cost(
    policy: &Policy,
    full_at_ns: Nanos,
    now: Nanos,
    cost: u64,
) -> Result<(Nanos, Nanos), Decision> {
    let capacity = policy.capacity();
    if cost > capacity {
        return Err(Decision::cannot_fit(capacity));
    }
    let interval = policy.interval_ns();
    let depth_ns = policy.window_ns(); // capacity · interval
    // Time still missing until full; a thread holding an older `now` than the writer of
    // `full_at_ns` may see more than the depth: that is an empty bucket.
    let deficit_ns = full_at_ns.saturating_sub(now).min(depth_ns);
    let level_ns = depth_ns - deficit_ns;
    let need_ns = cost * interval;
    if need_ns > level_ns {
        let retry_after = need_ns - level_ns;
        return Err(Decision::denied(
            capacity,
            policy.tokens_in(level_ns),
            deficit_ns,
            retry_after,
        ));
    }
    let deficit_after = deficit_ns + need_ns;
    Ok((now + deficit_after, deficit_after))
}

/// Report the level now as a request of one token would find it; change nothing.
#[inline(always)]
fn peek(policy: &Policy, full_at_ns: Nanos, now: Nanos) -> Decision {
    match plan_cost(policy, full_at_ns, now, 1) {
        // The level before that token.
        Ok((_, deficit_after_ns)) => {
            let deficit_ns = deficit_after_ns - policy.interval_ns();
            let level_ns = policy.window_ns() - deficit_ns;
            Decision::allowed(policy.capacity(), policy.tokens_in(level_ns), deficit_ns)
        }
        Err(denial) => denial,
    }
}

/// Report an admission that left `deficit_after_ns` missing until full (from [`plan`]).
#[inline(always)]
pub fn admitted(policy: &Policy, deficit_after_ns: Nanos) -> Decision {
    Decision::allowed(
        policy.capacity(),
        policy.tokens_in(policy.window_ns() - deficit_after_ns),
        deficit_after_ns,
    )
}

/// Give back `cost` tokens taken earlier (never more than a full bucket).
#[inline]
pub fn refund(policy: &Policy, full_at_ns: Nanos, cost: u64) -> Nanos {
    full_at_ns.saturating_sub(cost * policy.interval_ns())
}

/// Tell whether the bucket is full, so that forgetting the key changes no future decision.
#[inline]
pub fn is_idle(full_at_ns: Nanos, now: Nanos) -> bool {
    full_at_ns <= now
}
