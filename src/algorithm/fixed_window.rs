//! Fixed window: at most `limit` tokens per window `[k·W, (k+1)·W)`, aligned to the epoch.
//!
//! The state is one `u64`: the window index (low 32 bits of `now / W`) in the high half and
//! the count in the low half. A key idle for exactly 2^32 windows would alias; idle keys are
//! evicted long before that. Known weakness, kept on purpose: `limit` at the end of one
//! window and `limit` at the start of the next admit `2·limit` within a few nanoseconds.

use crate::clock::Nanos;
use crate::decision::Decision;
use crate::policy::Policy;

#[inline]
fn unpack(state: u64) -> (u32, u64) {
    ((state >> 32) as u32, state & 0xffff_ffff)
}

#[inline]
fn pack(index: u32, count: u64) -> u64 {
    (u64::from(index) << 32) | count
}

/// Return the 32-bit index of the window containing `now`.
#[inline]
pub fn window_index(policy: &Policy, now: Nanos) -> u32 {
    policy.window_of(now) as u32
}

/// Decide a request of `cost` tokens at `now`; return the decision and the next state.
///
/// A cost of 0 is a peek: the window's count now, admitted if one more token fits, else the
/// denial of a request of one token (until the window ends); the state is unchanged.
#[inline]
pub fn decide(policy: &Policy, state: u64, now: Nanos, cost: u64) -> (Decision, u64) {
    if cost == 0 {
        return (peek(policy, state, now), state);
    }
    decide_cost(policy, state, now, cost)
}

/// [`decide`] for a cost of at least 1.
#[inline(always)]
fn decide_cost(policy: &Policy, state: u64, now: Nanos, cost: u64) -> (Decision, u64) {
    let limit = policy.capacity();
    if cost > limit {
        return (Decision::cannot_fit(limit), state);
    }
    let window = policy.window_ns();
    let absolute_index = policy.window_of(now);
    let index = absolute_index as u32;
    let (stored_index, stored_count) = unpack(state);
    let count = if stored_index == index {
        stored_count
    } else {
        0
    };
    let reset_after = (absolute_index + 1) * window - now;
    if count + cost > limit {
        let decision = Decision::denied(limit, limit - count, reset_after, reset_after);
        return (decision, state);
    }
    let count_after = count + cost;
    let decision = Decision::allowed(limit, limit - count_after, reset_after);
    (decision, pack(index, count_after))
}

/// Report the window now as a request of one token would find it; change nothing.
#[inline(always)]
fn peek(policy: &Policy, state: u64, now: Nanos) -> Decision {
    let (probe, _) = decide_cost(policy, state, now, 1);
    if !probe.is_allowed() {
        return probe;
    }
    // The count before that token.
    Decision {
        remaining: probe.remaining + 1,
        ..probe
    }
}

/// Give back `cost` tokens taken at `charged_at`, if that window is still the stored one.
#[inline]
pub fn refund(policy: &Policy, state: u64, charged_at: Nanos, cost: u64) -> u64 {
    let (index, count) = unpack(state);
    if index == window_index(policy, charged_at) {
        pack(index, count.saturating_sub(cost))
    } else {
        state
    }
}

/// Tell whether the stored window is over (or empty), so the key can be forgotten.
///
/// "Over" means strictly earlier than the window of `now`, compared with wrap-around, so a
/// sweeper whose `now` lags a writer's never drops a live count.
#[inline]
pub fn is_idle(policy: &Policy, state: u64, now: Nanos) -> bool {
    let (index, count) = unpack(state);
    count == 0 || (window_index(policy, now).wrapping_sub(index) as i32) > 0
}
