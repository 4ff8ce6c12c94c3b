//! GCRA, the generic cell rate algorithm, with governor's and redis-cell's semantics.
//!
//! The state is one `u64`: the theoretical arrival time `tat_ns` of the next request
//! (0 for a fresh key). A request of `cost` tokens conforms if
//! `max(tat, now) + cost·T − τ ≤ now`, with `T = interval` and `τ = burst·T`
//! (governor writes `τ = (burst−1)·T` and tests `tat + (cost−1)·T − τ`, which is the same).

use crate::clock::Nanos;
use crate::decision::Decision;
use crate::policy::Policy;

/// Decide a request of `cost` tokens at `now`; return the decision and the next state.
#[inline]
pub fn decide(policy: &Policy, tat_ns: Nanos, now: Nanos, cost: u64) -> (Decision, Nanos) {
    let burst = policy.capacity();
    if cost > burst {
        return (Decision::cannot_fit(burst), tat_ns);
    }
    let t = policy.interval_ns();
    let tau = burst * t;
    let tat = tat_ns.max(now);
    let new_tat = tat + cost * t;
    let allow_at = new_tat.saturating_sub(tau);
    if allow_at > now {
        let remaining = policy.tokens_in((now + tau).saturating_sub(tat));
        let decision = Decision::denied(burst, remaining, tat - now, allow_at - now);
        return (decision, tat_ns);
    }
    let remaining = policy.tokens_in(now + tau - new_tat);
    (Decision::allowed(burst, remaining, new_tat - now), new_tat)
}

/// Give back `cost` tokens taken earlier.
#[inline]
pub fn refund(policy: &Policy, tat_ns: Nanos, cost: u64) -> Nanos {
    tat_ns.saturating_sub(cost * policy.interval_ns())
}

/// Tell whether the theoretical arrival time has passed (a full bucket).
#[inline]
pub fn is_idle(tat_ns: Nanos, now: Nanos) -> bool {
    tat_ns <= now
}
