//! Overshoot from a run's admissions, in exact timestamps and in the policy's own terms
//! (definitions in `docs/overshoot.md`).

use std::collections::BTreeMap;

use crate::clock::Nanos;
use crate::policy::{Algorithm, Policy};

/// Overshoot with exact timestamps: `max A([t, t+W)) / L - 1` for windows,
/// `max A(I) / (b + r|I|) - 1` for buckets, floored at 0. `admissions` sorted by time.
pub(crate) fn exact_overshoot(policy: &Policy, admissions: &[(Nanos, u64)]) -> f64 {
    match policy.algorithm() {
        Algorithm::TokenBucket | Algorithm::Gcra => bucket_overshoot(policy, admissions),
        _ => {
            let w = policy.window_ns();
            let limit = policy.capacity() as f64;
            let mut best = 0u64;
            let mut sum = 0u64;
            let mut j = 0;
            for i in 0..admissions.len() {
                while j < admissions.len() && admissions[j].0 < admissions[i].0 + w {
                    sum += admissions[j].1;
                    j += 1;
                }
                best = best.max(sum);
                sum -= admissions[i].1;
            }
            (best as f64 / limit - 1.0).max(0.0)
        }
    }
}

/// Overshoot in the policy's own terms over the windows the key's authorities used, given as
/// (start in true time, window index) in any order. An instant falls in the window that began
/// last before it; a window that began again under the same index right after (a handoff: the
/// new owner's start of the same window) is the same window. Window indexes need not grow
/// with time: a fresh authority on a node whose clock is behind numbers its windows from its
/// own clock (a partition that cut off both the owner and its successor). Admissions before
/// the first recorded window fall in windows aligned on true time. Buckets need no windows.
pub(crate) fn framed_overshoot(
    policy: &Policy,
    admissions: &[(Nanos, u64)],
    starts: &[(Nanos, u64)],
) -> f64 {
    if policy.algorithm().is_bucket() {
        return bucket_overshoot(policy, admissions);
    }
    let w = policy.window_ns();
    let limit = policy.capacity() as f64;
    let mut sorted = starts.to_vec();
    sorted.sort_unstable();
    let mut frames: Vec<(Nanos, u64)> = Vec::with_capacity(sorted.len());
    for (start, index) in sorted {
        if frames.last().is_none_or(|&(_, last)| last != index) {
            frames.push((start, index));
        }
    }
    // The window of an instant: (its number, start, whether framed, the number of the window
    // before it), from the frames (numbered in the order they began) or aligned on true time.
    // A sliding window's previous window is the one numbered just before it, if it began
    // right before it (no authority may have begun the windows between two it began).
    let window_of = |t: Nanos| -> (u64, Nanos, bool, Option<u64>) {
        let i = frames.partition_point(|&(s, _)| s <= t);
        if i == 0 {
            (t / w, t / w * w, false, (t / w).checked_sub(1))
        } else {
            let (start, index) = frames[i - 1];
            let previous =
                (i >= 2 && frames[i - 2].1.checked_add(1) == Some(index)).then(|| (i - 2) as u64);
            ((i - 1) as u64, start, true, previous)
        }
    };
    let mut per_window: BTreeMap<(bool, u64), u64> = BTreeMap::new();
    let mut best = 0.0f64;
    for &(t, c) in admissions {
        let (index, start, framed, previous) = window_of(t);
        let current = per_window.entry((framed, index)).or_insert(0);
        *current += c;
        let current = *current;
        let estimate = match policy.algorithm() {
            Algorithm::FixedWindow => current as f64,
            _ => {
                let previous = previous
                    .and_then(|p| per_window.get(&(framed, p)))
                    .copied()
                    .unwrap_or(0);
                let elapsed = (t.saturating_sub(start)).min(w) as f64 / w as f64;
                previous as f64 * (1.0 - elapsed) + current as f64
            }
        };
        best = best.max(estimate);
    }
    // Rounding of the weights: anything within a billionth of the limit is the limit.
    (best / limit - 1.0 - 1e-9).max(0.0)
}

/// `max over intervals I of A(I) / (b + r·|I|) - 1`, by bisection on the ratio: for a given
/// ratio, the worst interval is found in one pass (maximum subarray of `A - c·|I|`).
fn bucket_overshoot(policy: &Policy, admissions: &[(Nanos, u64)]) -> f64 {
    if admissions.is_empty() {
        return 0.0;
    }
    let b = policy.capacity() as f64;
    let r = 1.0 / policy.interval_ns() as f64;
    let exceeds = |ratio: f64| {
        let c = ratio * r;
        let mut before = 0.0f64; // admitted before the current instant
        let mut best_start = f64::INFINITY;
        let mut i = 0;
        while i < admissions.len() {
            let t = admissions[i].0 as f64;
            // An interval may start at this instant: remember the best start.
            best_start = best_start.min(before - c * t);
            let mut at = before;
            while i < admissions.len() && admissions[i].0 as f64 == t {
                at += admissions[i].1 as f64;
                i += 1;
            }
            if at - c * t - best_start > ratio * b * (1.0 + 1e-12) {
                return true;
            }
            before = at;
        }
        false
    };
    if !exceeds(1.0) {
        return 0.0;
    }
    let total: u64 = admissions.iter().map(|&(_, c)| c).sum();
    let (mut low, mut high) = (1.0f64, (total as f64 / b).max(1.0) + 1.0);
    for _ in 0..60 {
        let mid = (low + high) / 2.0;
        if exceeds(mid) {
            low = mid;
        } else {
            high = mid;
        }
    }
    high - 1.0
}
