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
///
/// A cost of 0 is a peek: the state now, admitted if a request of one token would conform,
/// else that request's denial; the state is unchanged.
#[inline]
pub fn decide(policy: &Policy, tat_ns: Nanos, now: Nanos, cost: u64) -> (Decision, Nanos) {
    if cost == 0 {
        return (peek(policy, tat_ns, now), tat_ns);
    }
    decide_cost(policy, tat_ns, now, cost)
}

/// [`decide`] for a cost of at least 1.
#[inline(always)]
fn decide_cost(policy: &Policy, tat_ns: Nanos, now: Nanos, cost: u64) -> (Decision, Nanos) {
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

/// Report the state now as a request of one token would find it; change nothing.
#[inline(always)]
fn peek(policy: &Policy, tat_ns: Nanos, now: Nanos) -> Decision {
    let (probe, new_tat) = decide_cost(policy, tat_ns, now, 1);
    if !probe.is_allowed() {
        return probe;
    }
    // The arrival time before that token: `max(tat, now)`.
    let tat = new_tat - policy.interval_ns();
    let tau = policy.capacity() * policy.interval_ns();
    Decision::allowed(
        policy.capacity(),
        policy.tokens_in(now + tau - tat),
        tat - now,
    )
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
