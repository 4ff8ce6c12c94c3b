//! The authority of one global key: the single place that hands out its budget.
//!
//! Every key has one authority, kept by the key's owner (rendezvous hashing over the live
//! members, `mesh::membership`). It runs the policy's algorithm for the whole cluster, but
//! instead of admitting requests it *leases* tokens to the nodes that use the key (the owner
//! included), which then admit locally from their lease (`mesh::lease`). A lease counts as
//! spent the moment it is granted, so the cluster never admits more than the authority
//! granted, and the authority never grants more than the policy allows:
//!
//! - **fixed window**: the leases of a window sum to at most the limit, and a window's
//!   lease dies with the window (holders stop early by their clock error, `mesh::timing`);
//! - **sliding-window counter**: `previous · (1 − elapsed) + leased ≤ limit` at every grant,
//!   with `previous` an upper bound of the previous window's count (corrected downward as
//!   holders report their final counts); the weight only falls, so a later admission stays
//!   within the bound;
//! - **token bucket, GCRA**: a bucket of free tokens refilled at the rate, whose level plus
//!   the tokens leased and not yet reported spent never exceeds the burst. Over any interval
//!   the cluster then admits at most what was leased before it began (≤ burst − level) plus
//!   the level and the refill: `burst + rate · |I|`.
//!
//! Leases follow demand: a holder gets what it needs now plus a few rounds of its demand,
//! at most half of its demand-weighted part of the headroom, so far from the limit most
//! requests never wait and near it the authority keeps the budget to answer whoever asks.
//! When a request needs more than is free but holders sit on unspent leases, the authority
//! recalls them and the request waits instead of being denied.

use std::collections::VecDeque;

use crate::algorithm::sliding_window;
use crate::clock::Nanos;
use crate::mesh::NodeId;
use crate::mesh::membership::RankMemo;
use crate::mesh::message::{AuthorityState, HolderRecord, KeyRef, Want};
use crate::mesh::timing::Offset;
use crate::mesh::windows::MeshPolicy;
use crate::policy::{Algorithm, Policy};

mod grants;
mod records;
mod reset;

pub(crate) use records::{holding_id, is_retired};

/// Rounds of demand a lease covers when the budget is tight.
pub(crate) const SHORT_LEASE_ROUNDS: u64 = 4;
/// Rounds of demand a lease covers when the budget is plentiful.
pub(crate) const LONG_LEASE_ROUNDS: u64 = 25;

/// What the authority answers a request for tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// The holder's cumulative grant for `window` is now `granted` (it may be partial: less
    /// than asked, when `retry_after` is also set).
    Grant {
        /// The window (0 for buckets).
        window: u64,
        /// Granted so far in the window, cumulative.
        granted: u64,
        /// When the window ends, local (windows; 0 for buckets).
        ends_at: Nanos,
        /// Not 0: the rest cannot be had; retry after this many ns.
        retry_after: Nanos,
        /// Tokens the authority is recalling for this holder: its waiting requests that fit
        /// in them wait; with `retry_after`, the others are denied now.
        more_coming: u64,
    },
    /// Nothing yet: the request waits for recalled tokens (or for the window to begin).
    Wait,
}

#[derive(Debug, Clone, Copy)]
struct Waiter {
    node: NodeId,
    need: u64,
    deadline: Nanos,
    /// When refill alone may cover `need` (buckets, sliding windows): look again then.
    wake: Nanos,
}

/// What an authority keeps of one holder's wants besides its record.
#[derive(Debug, Clone, Copy)]
struct Asked {
    node: NodeId,
    /// The newest want seen (its `seq`).
    seq: u32,
    /// The cheapest request it last reported waiting (0: none reported).
    smallest: u64,
}

/// The authority of one key, on the node that keeps it.
#[derive(Debug, Clone)]
pub(crate) struct Authority {
    key: KeyRef,
    version: u64,
    /// Windows: the current window's index and local bounds.
    window: u64,
    start: Nanos,
    end: Nanos,
    next_start: Nanos,
    /// Sliding window: the previous window's count (upper bound).
    previous: u64,
    /// Windows: tokens of the current window a reset forgave (`authority::reset`), and of
    /// the previous window (sliding windows weigh it).
    forgiven: u64,
    forgiven_before: u64,
    /// Buckets: free tokens in ns of refill, as of `level_at`.
    level_ns: u64,
    level_at: Nanos,
    /// Buckets: since when the level has stood at its cap (burst minus what is leased and
    /// not reported spent), losing refill; and up to when that lost refill was given back
    /// for spending reported since ([`Authority::report`]).
    capped_since: Option<Nanos>,
    credited_until: Nanos,
    holders: Vec<HolderRecord>,
    waiting: VecDeque<Waiter>,
    recalled_at: Nanos,
    /// What each holder's wants said beyond its record (a few holders: a list).
    asked: Vec<Asked>,
    /// How long a request may wait for room the policy frees by itself (0: denied at once).
    hold_ns: Nanos,
    /// Changed since its successor was last sent a backup (the node's rounds send one).
    dirty: bool,
    /// The key's owner and successor, as last ranked.
    rank: RankMemo,
}

impl Authority {
    /// Create the authority of a key nobody knows yet, at `now`: an empty window aligned
    /// on this node's clock, or a full bucket.
    pub(crate) fn fresh(key: KeyRef, policy: &MeshPolicy, now: Nanos) -> Self {
        let window = policy.window_at(now);
        Authority {
            key,
            version: 1,
            window: window.index,
            start: window.start_ns,
            end: window.end_ns,
            next_start: window.end_ns,
            previous: 0,
            forgiven: 0,
            forgiven_before: 0,
            level_ns: policy.window_ns(),
            level_at: now,
            capped_since: None,
            credited_until: 0,
            holders: Vec::new(),
            waiting: VecDeque::new(),
            recalled_at: 0,
            asked: Vec::new(),
            hold_ns: 0,
            dirty: false,
            rank: RankMemo::default(),
        }
    }

    /// Create the authority of a key whose earlier owner was declared dead without leaving
    /// this node a backup: its windows follow that owner's clock (`offset`), numbered as it
    /// numbered them and converted so that each begins no earlier here than it did there. Its
    /// window of an index then never begins before the earlier owner's, whose grants of the
    /// window before this node cannot know: they all fall before it.
    pub(crate) fn fresh_after(
        key: KeyRef,
        policy: &MeshPolicy,
        offset: Offset,
        now: Nanos,
    ) -> Self {
        let mut a = Self::fresh(key, policy, now);
        if !policy.algorithm().counts_per_window() {
            return a;
        }
        let window = policy.window_at(offset.to_peer(now).saturating_sub(offset.error));
        let start = offset.latest_local(window.start_ns).min(now);
        a.window = window.index;
        a.start = start;
        a.end = start.saturating_add(window.len());
        a.next_start = a.end;
        a
    }

    /// Take over a state another node sent (its backup or handoff) at `now`; `offset` is
    /// that node's clock. Times are converted so that this node's leases of the current
    /// window end no later, and the next window begins no earlier, than the sender's.
    pub(crate) fn from_state(
        state: &AuthorityState,
        policy: &MeshPolicy,
        offset: Offset,
        now: Nanos,
    ) -> Self {
        let end = offset.earliest_local(state.ends_at);
        let next_start = offset
            .latest_local(state.next_at.max(state.ends_at))
            .max(end);
        let level_at = offset.latest_local(state.level_at).min(now);
        let mut a = Authority {
            key: state.key,
            version: state.version + 1,
            window: state.window,
            start: next_start.saturating_sub(policy.length_of(state.window)),
            end,
            next_start,
            previous: state.previous,
            forgiven: 0,
            forgiven_before: 0,
            level_ns: state.level_ns.min(policy.window_ns()),
            level_at,
            capped_since: None,
            credited_until: 0,
            holders: state.holders.clone(),
            waiting: VecDeque::new(),
            recalled_at: 0,
            asked: Vec::new(),
            hold_ns: 0,
            dirty: false,
            rank: RankMemo::default(),
        };
        a.holders.sort_by_key(|h| h.node);
        a.holders.dedup_by_key(|h| h.node);
        a
    }

    /// The key's policy is enforced with other limits from now on (`old` until now): the
    /// same algorithm (and window) with another limit, or another rate and burst (a live
    /// change). What was counted stays counted; a bucket keeps its free tokens (at most its
    /// new depth).
    pub(crate) fn limits_changed(&mut self, old: &Policy, new: &Policy) {
        if new.algorithm().is_bucket() {
            let tokens = self.level_ns / old.interval_ns().max(1);
            self.level_ns = tokens
                .saturating_mul(new.interval_ns())
                .min(new.window_ns());
        }
        self.capped_since = None;
        self.version += 1;
    }

    /// Let a request wait up to `hold_ns` for room the policy frees by itself (a sliding
    /// window's previous window fading, a bucket refilling) when that room comes within the
    /// hold, after the requests waiting ahead; beyond it, the request is denied at once.
    /// Near the limit this serves requests in the order the owner hears them instead of
    /// denying one a moment before room appears for it.
    /// Note a change its successor's backup does not show yet; tell whether it is the
    /// first since the last backup.
    pub(crate) fn mark_dirty(&mut self) -> bool {
        !std::mem::replace(&mut self.dirty, true)
    }

    /// Tell whether it changed since the last backup, and count it backed up from now.
    pub(crate) fn take_dirty(&mut self) -> bool {
        std::mem::take(&mut self.dirty)
    }

    /// The key's ranking as this node last made it ([`RankMemo`]).
    pub(crate) fn rank(&self) -> &RankMemo {
        &self.rank
    }

    pub(crate) fn with_hold(mut self, hold_ns: Nanos) -> Self {
        self.hold_ns = hold_ns;
        self
    }

    /// Return the state to send to a successor or a new owner, with times on this clock.
    pub(crate) fn state(&self) -> AuthorityState {
        AuthorityState {
            key: self.key,
            version: self.version,
            window: self.window,
            ends_at: self.end,
            next_at: self.next_start,
            previous: self.previous,
            level_ns: self.level_ns,
            level_at: self.level_at,
            holders: self.holders.clone(),
        }
    }

    /// Tell whether `state` (a backup from a peer whose clock is `offset` from this node's)
    /// would be an idle authority at `now` if this node took it over ([`Authority::from_state`]
    /// then [`Authority::is_idle`]), without building it: a window's counts no longer matter,
    /// or a bucket is full with nothing leased.
    pub(crate) fn state_is_idle(
        state: &AuthorityState,
        policy: &MeshPolicy,
        offset: Offset,
        now: Nanos,
    ) -> bool {
        let w = policy.window_ns();
        if policy.algorithm().is_bucket() {
            let outstanding = state
                .holders
                .iter()
                .filter(|h| !is_retired(h))
                .any(|h| h.tally.unspent() > 0);
            let level_at = offset.latest_local(state.level_at).min(now);
            !outstanding && state.level_ns.min(w).saturating_add(now - level_at) >= w
        } else {
            let end = offset.earliest_local(state.ends_at);
            let next_start = offset
                .latest_local(state.next_at.max(state.ends_at))
                .max(end);
            now >= next_start.saturating_add(policy.length_of(state.window.saturating_add(1)))
        }
    }

    /// Return the current window's index and its local bounds `[start, end)` (windows).
    pub(crate) fn frame(&self) -> (u64, Nanos, Nanos) {
        (self.window, self.start, self.end)
    }

    /// What `node`'s wants said, if it sent any.
    fn asked(&self, node: NodeId) -> Option<&Asked> {
        self.asked.iter().find(|a| a.node == node)
    }

    fn asked_mut(&mut self, node: NodeId) -> &mut Asked {
        let at = match self.asked.iter().position(|a| a.node == node) {
            Some(at) => at,
            None => {
                self.asked.push(Asked {
                    node,
                    seq: 0,
                    smallest: 0,
                });
                self.asked.len() - 1
            }
        };
        &mut self.asked[at]
    }

    /// Return the cheapest waiting request `node` last reported (none: `None`).
    pub(crate) fn smallest_of(&self, node: NodeId) -> Option<u64> {
        self.asked(node).map(|a| a.smallest).filter(|&s| s > 0)
    }

    /// Return the newest want of `node` this authority saw.
    pub(crate) fn seq_of(&self, node: NodeId) -> u32 {
        self.asked(node).map_or(0, |a| a.seq)
    }

    /// Return which of `node`'s holdings its record counts for.
    pub(crate) fn holding_of(&self, node: NodeId) -> u64 {
        self.holders
            .iter()
            .find(|h| h.node == node)
            .map_or(0, |h| h.holding)
    }

    /// Tell whether `want` comes from a holding of `node` older than the one its record
    /// counts for (delayed or duplicated after the holding was forgotten and made again).
    pub(crate) fn is_stale(&self, node: NodeId, incarnation: u64, want: &Want) -> bool {
        self.holders
            .iter()
            .any(|h| h.node == node && h.incarnation == incarnation && h.holding > want.holding)
    }

    /// Return the holders' records.
    pub(crate) fn holders(&self) -> &[HolderRecord] {
        &self.holders
    }

    /// Tell whether requests wait at the authority.
    pub(crate) fn has_waiters(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// Return the earliest instant the authority must act by itself (a waiter's deadline, or
    /// the start of a window after a handover gap).
    pub(crate) fn next_timeout(&self) -> Option<Nanos> {
        self.waiting.iter().map(|w| w.deadline.min(w.wake)).min()
    }

    /// Tell whether the authority holds nothing worth keeping at `now`: no holder has an
    /// unspent lease, the window's counts no longer matter, a bucket is full.
    pub(crate) fn is_idle(&mut self, policy: &MeshPolicy, now: Nanos) -> bool {
        if !self.waiting.is_empty() {
            return false;
        }
        if policy.algorithm().is_bucket() {
            self.refill(policy, now);
            self.outstanding() == 0 && self.level_ns >= policy.window_ns()
        } else {
            now >= self
                .next_start
                .saturating_add(policy.length_of(self.window.saturating_add(1)))
        }
    }

    fn interval(&self, policy: &MeshPolicy) -> u64 {
        policy.interval_ns().max(1)
    }

    /// Tokens leased and not reported spent or returned (buckets).
    fn outstanding(&self) -> u64 {
        self.holders
            .iter()
            .filter(|h| !is_retired(h))
            .map(|h| h.tally.unspent())
            .sum()
    }

    /// Buckets: `tokens` leased earlier were reported spent at `now`, the last of them at
    /// least `ago` ns before. While the level stood at its cap, the cap held those tokens
    /// back from refilling although they were gone: give back the refill lost since then
    /// (each instant of it once), as a central bucket charged at the spending would have
    /// refilled. Then the cap is what is still leased.
    fn credit_spent(&mut self, policy: &MeshPolicy, now: Nanos, tokens: u64, ago: Nanos) {
        let cap = policy
            .window_ns()
            .saturating_sub(self.outstanding().saturating_mul(self.interval(policy)));
        if let Some(capped) = self.capped_since {
            let from = now.saturating_sub(ago).max(capped).max(self.credited_until);
            let credit = now
                .saturating_sub(from)
                .min(tokens.saturating_mul(self.interval(policy)))
                .min(cap.saturating_sub(self.level_ns));
            self.level_ns += credit;
            self.credited_until = from + credit;
        }
        if self.level_ns < cap {
            self.capped_since = None;
        }
    }

    /// Tokens leased in the current window (windows), less what a reset forgave.
    fn allocated(&self) -> u64 {
        self.leased_in_window().saturating_sub(self.forgiven)
    }

    /// Tokens leased in the current window (windows), all of them.
    fn leased_in_window(&self) -> u64 {
        self.holders
            .iter()
            .map(|h| h.tally.granted.saturating_sub(h.tally.returned))
            .sum()
    }

    /// The previous window's count as the sliding window weighs it, less what a reset
    /// forgave.
    fn counted_previous(&self) -> u64 {
        self.previous.saturating_sub(self.forgiven_before)
    }

    fn refill(&mut self, policy: &MeshPolicy, now: Nanos) {
        if now <= self.level_at {
            return;
        }
        let cap = policy
            .window_ns()
            .saturating_sub(self.outstanding().saturating_mul(self.interval(policy)));
        let level = self.level_ns.saturating_add(now - self.level_at);
        // The level never drops because the cap fell: leased tokens came out of it already.
        if self.level_ns >= cap {
            self.capped_since.get_or_insert(self.level_at);
        } else if level >= cap {
            self.capped_since = Some(self.level_at + (cap - self.level_ns));
            self.level_ns = cap;
        } else {
            self.capped_since = None;
            self.level_ns = level;
        }
        self.level_at = now;
    }

    /// Move to the window containing `now` (windows): the schedule's, placed on this clock
    /// where the authority placed the next window (a taken-over window may begin later here
    /// than on the schedule's clock, [`Authority::from_state`]).
    fn roll(&mut self, policy: &MeshPolicy, now: Nanos) {
        if !policy.algorithm().counts_per_window() || now < self.next_start {
            return;
        }
        let next = self.window.saturating_add(1);
        // This clock minus the schedule's, at the next window's start.
        let shift = i128::from(self.next_start) - i128::from(policy.window(next).start_ns);
        let on_schedule = u64::try_from(i128::from(now) - shift).unwrap_or(0);
        let at = policy.window_at(on_schedule);
        let at = if at.index < next {
            policy.window(next)
        } else {
            at
        };
        let skipped = at.index - next;
        let place = |t: Nanos| u64::try_from(i128::from(t) + shift).unwrap_or(u64::MAX);
        // A holder whose lease ended reported its final count; the others count what they
        // were leased (an upper bound, lowered when their final count arrives).
        let held = |h: &HolderRecord| {
            if h.closed {
                h.tally.used
            } else {
                h.tally.granted.saturating_sub(h.tally.returned)
            }
        };
        self.previous = if skipped == 0 {
            self.holders.iter().map(held).sum()
        } else {
            0
        };
        self.forgiven_before = if skipped == 0 { self.forgiven } else { 0 };
        self.forgiven = 0;
        for h in &mut self.holders {
            h.previous_held = if skipped == 0 { held(h) } else { 0 };
            // A departed holder's count (its record kept under a ghost id) is all there is.
            h.previous_final = skipped != 0 || h.closed || h.incarnation == 0;
            h.tally.granted = 0;
            h.tally.returned = 0;
            h.tally.used = 0;
            h.closed = false;
        }
        self.window = at.index;
        self.start = if skipped == 0 {
            self.next_start
        } else {
            place(at.start_ns)
        };
        self.end = place(at.end_ns);
        self.next_start = self.end;
        self.version += 1;
        // Holders with nothing in either window need no record, unless they wait: the record
        // names the holding a grant is for (one made afresh would name none, and the holder
        // would drop it while the window counts it).
        let waiting = &self.waiting;
        self.holders.retain(|h| {
            h.previous_held > 0
                || h.demand > 0
                || h.tally.granted > 0
                || waiting.iter().any(|w| w.node == h.node)
        });
    }

    /// Return the tokens that can be granted at `now`.
    pub(crate) fn available(&mut self, policy: &MeshPolicy, now: Nanos) -> u64 {
        let limit = policy.capacity();
        match policy.algorithm() {
            Algorithm::FixedWindow => {
                self.roll(policy, now);
                limit.saturating_sub(self.allocated())
            }
            Algorithm::SlidingWindow => {
                self.roll(policy, now);
                // The central algorithm's test, with the leases as the window's count.
                let elapsed = now.saturating_sub(self.start);
                let w = policy.length_of(self.window);
                sliding_window::room(limit, w, self.counted_previous(), elapsed)
                    .saturating_sub(self.allocated())
            }
            // A bucket (the node takes no other algorithm).
            _ => {
                self.refill(policy, now);
                self.level_ns / self.interval(policy)
            }
        }
    }

    /// Tokens granted to `node` that its want does not count yet (grants on their way to it
    /// when it asked): they serve part of the want's need. A want about an earlier window
    /// (or from a holding with no grant yet, window 0) has seen none of this window's
    /// grants; another holding's record has nothing on its way to this one.
    pub(crate) fn in_flight(
        &mut self,
        policy: &MeshPolicy,
        now: Nanos,
        node: NodeId,
        want: &Want,
    ) -> u64 {
        self.roll(policy, now);
        let seen = if !policy.algorithm().counts_per_window() || want.window == self.window {
            want.tally.granted
        } else if want.window < self.window {
            0
        } else {
            return 0;
        };
        self.holders
            .iter()
            .find(|h| h.node == node && h.holding == want.holding)
            .map_or(0, |h| h.tally.granted.saturating_sub(seen))
    }
}

#[cfg(test)]
mod tests;
