//! The per-key cell of a mesh policy on one node: the node's own usage *and* its allowance
//! in one `AtomicU64`, so that a request is one compare-and-swap and a share change from the
//! gossip is another, and the two can never interleave into an admission above the share.
//!
//! Layouts:
//! - windows (fixed window, sliding-window counter):
//!   `[window index mod 1024: 10][previous: 18][current: 18][allowance: 18]`, in tokens. A
//!   mesh window policy's limit is therefore at most [`MAX_MESH_WINDOW_LIMIT`].
//! - buckets (token bucket, GCRA, one shared implementation):
//!   `[theoretical arrival time in 64 ns units mod 2^44: 44][share: 20]`. The node's bucket
//!   refills at `share · rate` and holds at most `share · burst`; the time tolerance
//!   `burst / rate` does not depend on the share, so the cell needs only the share.
//!
//! Besides the word, the cell counts the cost offered to it (admitted or not) with one
//! relaxed add; the gossip reads it once per round as the key's demand.

use crate::clock::Nanos;
use crate::decision::Decision;
use crate::mesh::share::{ONE, Share, share_for, tokens_of};
use crate::policy::{Algorithm, Policy};
use crate::sync::{AtomicU64, Ordering};

/// The largest limit of a mesh window policy (18 bits per count in the cell).
pub const MAX_MESH_WINDOW_LIMIT: u64 = (1 << 18) - 1;

const COUNT_MASK: u64 = (1 << 18) - 1;
const SLOT_MASK: u64 = (1 << 10) - 1;
const TAT_UNIT_SHIFT: u32 = 6;
const TAT_MASK: u64 = (1 << 44) - 1;
const SHARE_MASK: u64 = (1 << 20) - 1;

/// How a mesh policy keeps its per-node state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MeshKind {
    /// Token bucket or GCRA: a bucket of `share · burst` refilled at `share · rate`.
    Bucket,
    /// Fixed window: the node's count in the current window, at most its allowance.
    FixedWindow,
    /// Sliding-window counter: the node's weighted estimate, at most its allowance.
    SlidingWindow,
}

impl MeshKind {
    /// Return the kind for `policy`, or `None` for the algorithms the mesh does not share
    /// (leaky buckets, sliding log).
    pub fn of(policy: &Policy) -> Option<MeshKind> {
        match policy.algorithm() {
            Algorithm::TokenBucket | Algorithm::Gcra => Some(MeshKind::Bucket),
            Algorithm::FixedWindow => Some(MeshKind::FixedWindow),
            Algorithm::SlidingWindow => Some(MeshKind::SlidingWindow),
            _ => None,
        }
    }
}

/// A window word, unpacked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WindowWord {
    /// The window index mod 1024.
    pub slot: u64,
    /// Tokens this node admitted in the previous window.
    pub previous: u64,
    /// Tokens this node admitted in the current window.
    pub current: u64,
    /// The most the node's estimate may reach, in tokens (`share · limit`).
    pub allowance: u64,
}

impl WindowWord {
    fn unpack(word: u64) -> Self {
        WindowWord {
            slot: word >> 54,
            previous: (word >> 36) & COUNT_MASK,
            current: (word >> 18) & COUNT_MASK,
            allowance: word & COUNT_MASK,
        }
    }

    fn pack(self) -> u64 {
        ((self.slot & SLOT_MASK) << 54)
            | ((self.previous & COUNT_MASK) << 36)
            | ((self.current & COUNT_MASK) << 18)
            | (self.allowance & COUNT_MASK)
    }

    /// Move to window `index` (counts of a window more than one back are dropped).
    pub fn rolled(mut self, index: u64) -> Self {
        let slot = index & SLOT_MASK;
        if slot == self.slot {
            return self;
        }
        self.previous = if (self.slot + 1) & SLOT_MASK == slot {
            self.current
        } else {
            0
        };
        self.current = 0;
        self.slot = slot;
        self
    }

    /// Return the node's usage at `now` in tokens (rounded up): the current count for a
    /// fixed window, `previous·(W − elapsed)/W + current` for a sliding window.
    pub fn estimate(&self, kind: MeshKind, policy: &Policy, now: Nanos) -> u64 {
        match kind {
            MeshKind::SlidingWindow => {
                let w = policy.window_ns();
                let elapsed = now % w;
                let weighted = (u128::from(self.previous) * u128::from(w - elapsed))
                    .div_ceil(u128::from(w)) as u64;
                weighted + self.current
            }
            _ => self.current,
        }
    }
}

/// A bucket word, unpacked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct BucketWord {
    tat_units: u64,
    share: Share,
}

impl BucketWord {
    fn unpack(word: u64) -> Self {
        BucketWord {
            tat_units: word >> 20,
            share: (word & SHARE_MASK) as Share,
        }
    }

    fn pack(self) -> u64 {
        ((self.tat_units & TAT_MASK) << 20) | (u64::from(self.share) & SHARE_MASK)
    }

    /// Return how far the theoretical arrival time is ahead of `now_units` (0 when it is in
    /// the past), reading the 44-bit time modulo its range.
    fn ahead_units(&self, now_units: u64) -> u64 {
        let diff = self.tat_units.wrapping_sub(now_units) & TAT_MASK;
        if diff >= 1 << 43 { 0 } else { diff }
    }
}

/// Return the emission interval at `share`, in 64 ns units per token (rounded up), or `None`
/// for a zero share.
fn interval_units(policy: &Policy, share: Share) -> Option<u128> {
    if share == 0 {
        return None;
    }
    let ns = (u128::from(policy.interval_ns()) * u128::from(ONE)).div_ceil(u128::from(share));
    Some(ns.div_ceil(1 << TAT_UNIT_SHIFT).max(1))
}

/// One key's mesh state on one node.
#[derive(Debug)]
pub struct MeshCell {
    word: AtomicU64,
    offered: AtomicU64,
    admitted: AtomicU64,
}

impl MeshCell {
    /// Create the cell of a key this node has not used, holding `share` of `policy`.
    pub fn new(kind: MeshKind, policy: &Policy, share: Share) -> Self {
        let word = match kind {
            MeshKind::Bucket => BucketWord {
                tat_units: 0,
                share,
            }
            .pack(),
            _ => WindowWord {
                allowance: tokens_of(share, policy.capacity()),
                ..WindowWord::default()
            }
            .pack(),
        };
        MeshCell {
            word: AtomicU64::new(word),
            offered: AtomicU64::new(0),
            admitted: AtomicU64::new(0),
        }
    }

    /// Decide a request of `cost` tokens at `now` (this node's clock): one compare-and-swap.
    pub fn decide(&self, kind: MeshKind, policy: &Policy, now: Nanos, cost: u64) -> Decision {
        let limit = policy.capacity();
        if cost == 0 || cost > limit {
            return Decision::cannot_fit(limit);
        }
        self.offered.fetch_add(cost, Ordering::Relaxed);
        let mut current = self.word.load(Ordering::Acquire);
        loop {
            let (decision, next) = match kind {
                MeshKind::Bucket => decide_bucket(policy, current, now, cost),
                _ => decide_window(kind, policy, current, now, cost),
            };
            if next == current {
                return decision;
            }
            match self.word.compare_exchange_weak(
                current,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    if kind == MeshKind::Bucket {
                        self.admitted.fetch_add(cost, Ordering::Relaxed);
                    }
                    return decision;
                }
                Err(actual) => current = actual,
            }
        }
    }

    /// Return the cost a bucket admitted since the cell was created (its gossiped count).
    pub fn admitted(&self) -> u64 {
        self.admitted.load(Ordering::Relaxed)
    }

    /// Tell whether a bucket is full at `now` (nothing of it spent).
    pub fn is_full_bucket(&self, _policy: &Policy, now: Nanos) -> bool {
        BucketWord::unpack(self.word.load(Ordering::Acquire)).ahead_units(now >> TAT_UNIT_SHIFT)
            == 0
    }

    /// Spend `cost` tokens of a bucket that other nodes admitted (the stale-sum baseline's
    /// way of counting the cluster's admissions against one bucket).
    pub fn charge_bucket(&self, policy: &Policy, now: Nanos, cost: u64) {
        self.update(|word| {
            let b = BucketWord::unpack(word);
            let Some(interval) = interval_units(policy, b.share) else {
                return word;
            };
            let now_units = now >> TAT_UNIT_SHIFT;
            let cap = u128::from(policy.window_ns() >> TAT_UNIT_SHIFT) * 4;
            let ahead = (u128::from(b.ahead_units(now_units)) + interval * u128::from(cost))
                .min(cap) as u64;
            BucketWord {
                tat_units: now_units + ahead,
                ..b
            }
            .pack()
        });
    }

    /// Replace the word by `next(word)` with a compare-and-swap loop; return the word written.
    fn update(&self, mut next: impl FnMut(u64) -> u64) -> u64 {
        let mut current = self.word.load(Ordering::Acquire);
        loop {
            let new = next(current);
            if new == current {
                return new;
            }
            match self
                .word
                .compare_exchange_weak(current, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return new,
                Err(actual) => current = actual,
            }
        }
    }

    /// Take the cost offered since the last call (the key's demand over one round).
    pub fn take_offered(&self) -> u64 {
        self.offered.swap(0, Ordering::Relaxed)
    }

    /// Return the window word rolled to `now` (windows only).
    pub fn window(&self, policy: &Policy, now: Nanos) -> WindowWord {
        WindowWord::unpack(self.word.load(Ordering::Acquire)).rolled(policy.window_of(now))
    }

    /// Return the node's share as the cell holds it (buckets) or the share its allowance
    /// stands for (windows).
    pub fn share(&self, kind: MeshKind, policy: &Policy) -> Share {
        let word = self.word.load(Ordering::Acquire);
        match kind {
            MeshKind::Bucket => BucketWord::unpack(word).share,
            _ => share_for(WindowWord::unpack(word).allowance, policy.capacity()),
        }
    }

    /// Set the node's share to `wanted` at `now` (one compare-and-swap loop) and return
    /// the share the cell now holds, with the node's usage at that instant in tokens.
    ///
    /// A window admits nothing more while its estimate is above the new allowance, and
    /// must still be counted as holding what it used: the share returned (the one to
    /// announce) is the larger of `wanted` and the share its estimate stands for. A bucket
    /// keeps the tokens it has
    /// (never more than the new share's burst): a larger share refills faster but brings no
    /// tokens of its own, so no share change can create a burst.
    pub fn set_share(&self, kind: MeshKind, policy: &Policy, now: Nanos, wanted: Share) -> Share {
        let mut applied = wanted;
        self.update(|word| match kind {
            MeshKind::Bucket => rescale_bucket(policy, word, now, wanted),
            _ => {
                let w = WindowWord::unpack(word).rolled(policy.window_of(now));
                let used = w.estimate(kind, policy, now).min(policy.capacity());
                applied = share_for(used, policy.capacity()).max(wanted);
                let allowance = tokens_of(wanted, policy.capacity());
                WindowWord { allowance, ..w }.pack()
            }
        });
        applied
    }

    /// Raise the window counts to at least `previous` and `current` for window `index`
    /// (recovery from peers' snapshots), then count more as used in the current window until
    /// the estimate is at least `charge_tokens`, so admissions that were never gossiped
    /// before a restart are covered. Return the estimate afterwards, in tokens.
    pub fn recover_window(
        &self,
        kind: MeshKind,
        policy: &Policy,
        now: Nanos,
        previous: u64,
        current: u64,
        charge_tokens: u64,
    ) -> u64 {
        let word = self.update(|word| {
            let mut w = WindowWord::unpack(word).rolled(policy.window_of(now));
            w.previous = w.previous.max(previous).min(COUNT_MASK);
            w.current = w.current.max(current).min(COUNT_MASK);
            let used = w.estimate(kind, policy, now);
            w.current = (w.current + charge_tokens.saturating_sub(used)).min(COUNT_MASK);
            w.pack()
        });
        WindowWord::unpack(word).estimate(kind, policy, now)
    }

    /// Return the whole tokens a bucket holds at `now`.
    pub fn bucket_tokens(&self, policy: &Policy, now: Nanos) -> u64 {
        let b = BucketWord::unpack(self.word.load(Ordering::Acquire));
        let Some(interval) = interval_units(policy, b.share) else {
            return 0;
        };
        let tolerance = u128::from(policy.window_ns() >> TAT_UNIT_SHIFT);
        let ahead = u128::from(b.ahead_units(now >> TAT_UNIT_SHIFT)).min(tolerance);
        ((tolerance - ahead) / interval) as u64
    }

    /// Add `tokens` to a bucket (never beyond its share of the burst): tokens another node
    /// released with its share.
    pub fn grant_bucket(&self, policy: &Policy, now: Nanos, tokens: u64) {
        self.update(|word| {
            let b = BucketWord::unpack(word);
            let Some(interval) = interval_units(policy, b.share) else {
                return word;
            };
            let now_units = now >> TAT_UNIT_SHIFT;
            let ahead = u128::from(b.ahead_units(now_units));
            let ahead = ahead.saturating_sub(interval * u128::from(tokens)) as u64;
            BucketWord {
                tat_units: now_units + ahead,
                ..b
            }
            .pack()
        });
    }

    /// Empty a bucket at `now` (a restarted node cannot know what it spent before).
    pub fn empty_bucket(&self, policy: &Policy, now: Nanos) {
        let tat_units = (now + policy.window_ns()) >> TAT_UNIT_SHIFT;
        self.update(|word| {
            BucketWord {
                tat_units,
                ..BucketWord::unpack(word)
            }
            .pack()
        });
    }
}

fn decide_window(
    kind: MeshKind,
    policy: &Policy,
    word: u64,
    now: Nanos,
    cost: u64,
) -> (Decision, u64) {
    let limit = policy.capacity();
    let w_ns = policy.window_ns();
    let index = policy.window_of(now);
    let w = WindowWord::unpack(word).rolled(index);
    let used = w.estimate(kind, policy, now);
    let window_end = (index + 1) * w_ns - now;
    if used + cost <= w.allowance {
        let next = WindowWord {
            current: w.current + cost,
            ..w
        };
        let reset = if kind == MeshKind::SlidingWindow {
            window_end + w_ns
        } else {
            window_end
        };
        let remaining = w.allowance - used - cost;
        return (Decision::allowed(limit, remaining, reset), next.pack());
    }
    let retry = match kind {
        MeshKind::SlidingWindow if w.current + cost <= w.allowance && w.previous > 0 => {
            // Wait until the previous window's weight has decayed enough.
            let spare = u128::from(w.allowance - w.current - cost);
            let keep_ns = (spare * u128::from(w_ns) / u128::from(w.previous)) as u64;
            let elapsed_needed = w_ns.saturating_sub(keep_ns);
            elapsed_needed.saturating_sub(now % w_ns).max(1)
        }
        _ => window_end,
    };
    let remaining = w.allowance.saturating_sub(used);
    let reset = window_end
        + if kind == MeshKind::SlidingWindow {
            w_ns
        } else {
            0
        };
    (Decision::denied(limit, remaining, reset, retry), word)
}

fn decide_bucket(policy: &Policy, word: u64, now: Nanos, cost: u64) -> (Decision, u64) {
    let limit = policy.capacity();
    let b = BucketWord::unpack(word);
    let tolerance_units = policy.window_ns() >> TAT_UNIT_SHIFT;
    let Some(interval) = interval_units(policy, b.share) else {
        return (
            Decision::denied(limit, 0, policy.window_ns(), policy.window_ns()),
            word,
        );
    };
    let now_units = now >> TAT_UNIT_SHIFT;
    let ahead = u128::from(b.ahead_units(now_units));
    let after = ahead + interval * u128::from(cost);
    if after <= u128::from(tolerance_units) {
        let next = BucketWord {
            tat_units: now_units + after as u64,
            share: b.share,
        };
        let remaining = ((u128::from(tolerance_units) - after) / interval) as u64;
        let reset = (after as u64) << TAT_UNIT_SHIFT;
        return (Decision::allowed(limit, remaining, reset), next.pack());
    }
    let remaining = ((u128::from(tolerance_units).saturating_sub(ahead)) / interval) as u64;
    let retry = ((after - u128::from(tolerance_units)) as u64) << TAT_UNIT_SHIFT;
    let reset = (ahead as u64) << TAT_UNIT_SHIFT;
    (Decision::denied(limit, remaining, reset, retry), word)
}

fn rescale_bucket(policy: &Policy, word: u64, now: Nanos, wanted: Share) -> u64 {
    let b = BucketWord::unpack(word);
    let now_units = now >> TAT_UNIT_SHIFT;
    let tolerance = u128::from(policy.window_ns() >> TAT_UNIT_SHIFT);
    let ahead = u128::from(b.ahead_units(now_units)).min(tolerance);
    // The tokens left, in time at the old share: keep them (capped by the new burst).
    let spare = tolerance - ahead;
    let ahead_next = if wanted == 0 || b.share == 0 {
        tolerance
    } else {
        tolerance.saturating_sub(spare * u128::from(b.share) / u128::from(wanted))
    };
    BucketWord {
        tat_units: now_units + ahead_next as u64,
        share: wanted,
    }
    .pack()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_window_admits_up_to_its_allowance() {
        let policy = Policy::fixed_window(1000, Duration::from_secs(1)).unwrap();
        let cell = MeshCell::new(MeshKind::FixedWindow, &policy, ONE / 4);
        let now = 5_000_000_000;
        let admitted = (0..400)
            .filter(|_| {
                cell.decide(MeshKind::FixedWindow, &policy, now, 1)
                    .is_allowed()
            })
            .count();
        assert_eq!(admitted, 250);
        // A lower share stops admissions and is still announced as what was used.
        let applied = cell.set_share(MeshKind::FixedWindow, &policy, now, ONE / 10);
        assert_eq!(tokens_of(applied, 1000), 250);
        assert!(
            !cell
                .decide(MeshKind::FixedWindow, &policy, now, 1)
                .is_allowed()
        );
        // The next window starts with the lower share.
        let later = now + 1_000_000_000;
        let applied = cell.set_share(MeshKind::FixedWindow, &policy, later, ONE / 10);
        assert_eq!(tokens_of(applied, 1000), tokens_of(ONE / 10, 1000));
    }

    #[test]
    fn a_bucket_admits_its_share_of_the_burst_and_refills_at_its_share_of_the_rate() {
        let policy = Policy::token_bucket(100, Duration::from_secs(1), 100).unwrap();
        let cell = MeshCell::new(MeshKind::Bucket, &policy, ONE / 2);
        let now = 10_000_000_000;
        let burst = (0..100)
            .filter(|_| cell.decide(MeshKind::Bucket, &policy, now, 1).is_allowed())
            .count();
        assert_eq!(burst, 50);
        // One second later: 50 more (half the rate).
        let later = now + 1_000_000_000;
        let refill = (0..100)
            .filter(|_| {
                cell.decide(MeshKind::Bucket, &policy, later, 1)
                    .is_allowed()
            })
            .count();
        assert!((49..=50).contains(&refill), "{refill}");
    }

    #[test]
    fn a_larger_bucket_share_brings_no_tokens() {
        let policy = Policy::token_bucket(100, Duration::from_secs(1), 100).unwrap();
        let cell = MeshCell::new(MeshKind::Bucket, &policy, ONE / 2);
        let now = 10_000_000_000;
        while cell.decide(MeshKind::Bucket, &policy, now, 1).is_allowed() {}
        cell.set_share(MeshKind::Bucket, &policy, now, ONE);
        assert!(!cell.decide(MeshKind::Bucket, &policy, now, 1).is_allowed());
        // ...and a smaller share keeps at most its burst.
        let cell = MeshCell::new(MeshKind::Bucket, &policy, ONE);
        cell.set_share(MeshKind::Bucket, &policy, now, ONE / 10);
        let admitted = (0..100)
            .filter(|_| cell.decide(MeshKind::Bucket, &policy, now, 1).is_allowed())
            .count();
        assert!((9..=10).contains(&admitted), "{admitted}");
    }

    #[test]
    fn a_sliding_window_weighs_the_previous_window() {
        let policy = Policy::sliding_window(100, Duration::from_secs(1)).unwrap();
        let cell = MeshCell::new(MeshKind::SlidingWindow, &policy, ONE);
        let start = 3_000_000_000;
        for _ in 0..100 {
            assert!(
                cell.decide(MeshKind::SlidingWindow, &policy, start, 1)
                    .is_allowed()
            );
        }
        // Half-way through the next window, half of the previous count still weighs.
        let mid = start + 1_500_000_000;
        let admitted = (0..100)
            .filter(|_| {
                cell.decide(MeshKind::SlidingWindow, &policy, mid, 1)
                    .is_allowed()
            })
            .count();
        assert_eq!(admitted, 50);
    }
}
