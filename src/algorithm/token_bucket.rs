//! Token bucket: `capacity` tokens, one more every `interval_ns`, a request takes `cost`.
//!
//! The state is one `u64`: `full_at_ns`, the instant at which the bucket will be full again
//! (0 for a fresh key). The level follows from it: `capacity·interval − (full_at − now)`
//! nanoseconds' worth of tokens. Exact integer arithmetic, no drift, and it fits in one
//! atomic word.

use crate::clock::Nanos;
use crate::decision::Decision;
use crate::policy::Policy;

/// Decide a request of `cost` tokens at `now`; return the decision and the next state.
#[inline]
pub fn decide(policy: &Policy, full_at_ns: Nanos, now: Nanos, cost: u64) -> (Decision, Nanos) {
    let capacity = policy.capacity();
    if cost > capacity {
        return (Decision::cannot_fit(capacity), full_at_ns);
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
        let decision = Decision::denied(
            capacity,
            policy.tokens_in(level_ns),
            deficit_ns,
            retry_after,
        );
        return (decision, full_at_ns);
    }
    let deficit_after = deficit_ns + need_ns;
    let decision = Decision::allowed(
        capacity,
        policy.tokens_in(depth_ns - deficit_after),
        deficit_after,
    );
    (decision, now + deficit_after)
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
