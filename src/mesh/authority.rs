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

use std::collections::{HashMap, VecDeque};

use crate::clock::Nanos;
use crate::mesh::NodeId;
use crate::mesh::message::{AuthorityState, HolderRecord, KeyRef, Want};
use crate::mesh::timing::Offset;
use crate::policy::{Algorithm, Policy};

/// Rounds of demand a lease covers when the budget is tight.
pub const SHORT_LEASE_ROUNDS: u64 = 4;
/// Rounds of demand a lease covers when the budget is plentiful.
pub const LONG_LEASE_ROUNDS: u64 = 25;

/// How a mesh policy keeps its cluster-wide state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MeshKind {
    /// Token bucket or GCRA: one bucket of free tokens at the authority.
    Bucket,
    /// Fixed window: the leases of a window sum to at most the limit.
    FixedWindow,
    /// Sliding-window counter: the previous window weighted, plus this window's leases.
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

    /// Tell whether the kind counts per window (its leases expire with the window).
    pub fn is_window(self) -> bool {
        self != MeshKind::Bucket
    }
}

/// What the authority answers a request for tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
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

/// The authority of one key, on the node that keeps it.
#[derive(Debug, Clone)]
pub struct Authority {
    key: KeyRef,
    kind: MeshKind,
    policy: Policy,
    version: u64,
    /// Windows: the current window's index and local bounds.
    window: u64,
    start: Nanos,
    end: Nanos,
    next_start: Nanos,
    /// Sliding window: the previous window's count (upper bound).
    previous: u64,
    /// Buckets: free tokens in ns of refill, as of `level_at`.
    level_ns: u64,
    level_at: Nanos,
    holders: Vec<HolderRecord>,
    waiting: VecDeque<Waiter>,
    recalled_at: Nanos,
    /// Each holder's cheapest waiting request, as it last reported.
    smallest: HashMap<NodeId, u64>,
    /// Each holder's newest want seen.
    seqs: HashMap<NodeId, u32>,
}

impl Authority {
    /// Create the authority of a key nobody knows yet, at `now`: an empty window aligned
    /// on this node's clock, or a full bucket.
    pub fn fresh(key: KeyRef, policy: Policy, kind: MeshKind, now: Nanos) -> Self {
        let w = policy.window_ns();
        let window = now / w;
        Authority {
            key,
            kind,
            policy,
            version: 1,
            window,
            start: window * w,
            end: (window + 1) * w,
            next_start: (window + 1) * w,
            previous: 0,
            level_ns: policy.window_ns(),
            level_at: now,
            holders: Vec::new(),
            waiting: VecDeque::new(),
            recalled_at: 0,
            smallest: HashMap::new(),
            seqs: HashMap::new(),
        }
    }

    /// Take over a state another node sent (its backup or handoff) at `now`; `offset` is
    /// that node's clock. Times are converted so that this node's leases of the current
    /// window end no later, and the next window begins no earlier, than the sender's.
    pub fn from_state(
        state: &AuthorityState,
        policy: Policy,
        kind: MeshKind,
        offset: Offset,
        now: Nanos,
    ) -> Self {
        let w = policy.window_ns();
        let end = offset.earliest_local(state.ends_at);
        let next_start = offset.latest_local(state.ends_at).max(end);
        let level_at = offset.latest_local(state.level_at).min(now);
        let mut a = Authority {
            key: state.key,
            kind,
            policy,
            version: state.version + 1,
            window: state.window,
            start: next_start.saturating_sub(w),
            end,
            next_start,
            previous: state.previous,
            level_ns: state.level_ns.min(policy.window_ns()),
            level_at,
            holders: state.holders.clone(),
            waiting: VecDeque::new(),
            recalled_at: 0,
            smallest: HashMap::new(),
            seqs: HashMap::new(),
        };
        a.holders.sort_by_key(|h| h.node);
        a.holders.dedup_by_key(|h| h.node);
        a
    }

    /// Fold in a state another node kept for the same key (a handoff back, or two
    /// authorities after a disagreement): each holder keeps its largest counts, the bucket its
    /// lowest level, the window the newer one.
    pub fn merge(&mut self, other: &Authority) {
        if other.kind.is_window() && other.window > self.window {
            let mut merged = other.clone();
            merged.version = self.version.max(other.version) + 1;
            *self = merged;
            return;
        }
        if other.kind.is_window() && other.window < self.window {
            return;
        }
        for theirs in &other.holders {
            match self.holders.iter_mut().find(|h| h.node == theirs.node) {
                Some(mine) if mine.incarnation == theirs.incarnation => {
                    mine.granted = mine.granted.max(theirs.granted);
                    mine.returned = mine.returned.max(theirs.returned);
                    mine.used = mine.used.max(theirs.used);
                    mine.previous_held = mine.previous_held.max(theirs.previous_held);
                    mine.previous_final &= theirs.previous_final;
                    mine.closed |= theirs.closed;
                }
                Some(mine) if mine.incarnation < theirs.incarnation => *mine = *theirs,
                Some(_) => {}
                None => self.holders.push(*theirs),
            }
        }
        self.holders.sort_by_key(|h| h.node);
        self.previous = self.previous.max(other.previous);
        self.level_ns = self.level_ns.min(other.level_ns);
        self.end = self.end.min(other.end);
        self.next_start = self.next_start.max(other.next_start);
        self.version = self.version.max(other.version) + 1;
    }

    /// Return the state to send to a successor or a new owner, with times on this clock.
    pub fn state(&self) -> AuthorityState {
        AuthorityState {
            key: self.key,
            version: self.version,
            window: self.window,
            ends_at: self.end,
            previous: self.previous,
            level_ns: self.level_ns,
            level_at: self.level_at,
            holders: self.holders.clone(),
        }
    }

    /// Return the key.
    pub fn key(&self) -> KeyRef {
        self.key
    }

    /// Return the version (it grows with every change).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Return the current window's index and its local bounds `[start, end)` (windows).
    pub fn frame(&self) -> (u64, Nanos, Nanos) {
        (self.window, self.start, self.end)
    }

    /// Return the newest want of `node` this authority saw.
    pub fn seq_of(&self, node: NodeId) -> u32 {
        self.seqs.get(&node).copied().unwrap_or(0)
    }

    /// Return the holders' records.
    pub fn holders(&self) -> &[HolderRecord] {
        &self.holders
    }

    /// Tell whether requests wait at the authority.
    pub fn has_waiters(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// Return the earliest instant the authority must act by itself (a waiter's deadline, or
    /// the start of a window after a handover gap).
    pub fn next_timeout(&self) -> Option<Nanos> {
        self.waiting.iter().map(|w| w.deadline.min(w.wake)).min()
    }

    /// Tell whether the authority holds nothing worth keeping at `now`: no holder has an
    /// unspent lease, the window's counts no longer matter, a bucket is full.
    pub fn is_idle(&mut self, now: Nanos) -> bool {
        if !self.waiting.is_empty() {
            return false;
        }
        match self.kind {
            MeshKind::Bucket => {
                self.refill(now);
                self.outstanding() == 0 && self.level_ns >= self.policy.window_ns()
            }
            _ => now >= self.next_start.saturating_add(self.policy.window_ns()),
        }
    }

    fn interval(&self) -> u64 {
        self.policy.interval_ns().max(1)
    }

    /// Tokens leased and not reported spent or returned (buckets).
    fn outstanding(&self) -> u64 {
        self.holders
            .iter()
            .map(|h| h.granted.saturating_sub(h.returned).saturating_sub(h.used))
            .sum()
    }

    /// Tokens leased in the current window (windows).
    fn allocated(&self) -> u64 {
        self.holders
            .iter()
            .map(|h| h.granted.saturating_sub(h.returned))
            .sum()
    }

    fn refill(&mut self, now: Nanos) {
        if now <= self.level_at {
            return;
        }
        let cap = self
            .policy
            .window_ns()
            .saturating_sub(self.outstanding().saturating_mul(self.interval()));
        let level = self.level_ns.saturating_add(now - self.level_at);
        // The level never drops because the cap fell: leased tokens came out of it already.
        self.level_ns = if self.level_ns >= cap {
            self.level_ns
        } else {
            level.min(cap)
        };
        self.level_at = now;
    }

    /// Move to the window containing `now` (windows).
    fn roll(&mut self, now: Nanos) {
        if !self.kind.is_window() || now < self.next_start {
            return;
        }
        let w = self.policy.window_ns();
        let skipped = (now - self.next_start) / w;
        // A holder whose lease ended reported its final count; the others count what they
        // were leased (an upper bound, lowered when their final count arrives).
        let held = |h: &HolderRecord| {
            if h.closed {
                h.used
            } else {
                h.granted.saturating_sub(h.returned)
            }
        };
        self.previous = if skipped == 0 {
            self.holders.iter().map(held).sum()
        } else {
            0
        };
        for h in &mut self.holders {
            h.previous_held = if skipped == 0 { held(h) } else { 0 };
            // A departed holder's count (its record kept under a ghost id) is all there is.
            h.previous_final = skipped != 0 || h.closed || h.incarnation == 0;
            h.granted = 0;
            h.returned = 0;
            h.used = 0;
            h.closed = false;
        }
        self.window += 1 + skipped;
        self.start = self.next_start + skipped * w;
        self.end = self.start + w;
        self.next_start = self.end;
        self.version += 1;
        // Holders with nothing in either window need no record.
        self.holders
            .retain(|h| h.previous_held > 0 || h.demand > 0 || h.granted > 0);
    }

    /// Return the tokens that can be granted at `now`.
    pub fn available(&mut self, now: Nanos) -> u64 {
        let limit = self.policy.capacity();
        match self.kind {
            MeshKind::Bucket => {
                self.refill(now);
                self.level_ns / self.interval()
            }
            MeshKind::FixedWindow => {
                self.roll(now);
                limit.saturating_sub(self.allocated())
            }
            MeshKind::SlidingWindow => {
                self.roll(now);
                // Exactly the central algorithm's test, in token·ns:
                // previous·(W − e) + (allocated + need)·W ≤ limit·W.
                let w = u128::from(self.policy.window_ns());
                let elapsed = u128::from(now.saturating_sub(self.start)).min(w);
                let room = (u128::from(limit) * w)
                    .saturating_sub(u128::from(self.previous) * (w - elapsed))
                    / w;
                (room as u64).saturating_sub(self.allocated())
            }
        }
    }

    /// Tokens granted to `node` that its want does not count yet (grants on their way to it
    /// when it asked): they serve part of the want's need (window policies). A want about the
    /// window before has seen none of this window's grants (a holding that starts afresh,
    /// window 0, counts nothing).
    pub fn in_flight(&mut self, now: Nanos, node: NodeId, want: &Want) -> u64 {
        self.roll(now);
        // A bucket counts grants since its holder record began, and a holding may start
        // afresh (granted 0) against an older record: that difference is not in flight.
        if !self.kind.is_window() && want.granted == 0 {
            return 0;
        }
        let seen = if !self.kind.is_window() || want.window == self.window {
            want.granted
        } else if want.window > 0 && want.window + 1 == self.window {
            0
        } else {
            return 0;
        };
        self.holders
            .iter()
            .find(|h| h.node == node)
            .map_or(0, |h| h.granted.saturating_sub(seen))
    }

    fn record_mut(&mut self, node: NodeId, incarnation: u64) -> &mut HolderRecord {
        let i = match self.holders.binary_search_by_key(&node, |h| h.node) {
            Ok(i) => {
                if self.holders[i].incarnation != incarnation {
                    // A restarted holder: its old lease is spent for good.
                    self.forget_holder_at(i);
                    self.holders.insert(i, blank(node, incarnation));
                }
                i
            }
            Err(i) => {
                self.holders.insert(i, blank(node, incarnation));
                i
            }
        };
        &mut self.holders[i]
    }

    /// A holder is gone (dead, or restarted): whatever it did not report counts as spent,
    /// and a bucket's burst is no longer held back for it.
    pub fn forget_holder(&mut self, node: NodeId) {
        if let Ok(i) = self.holders.binary_search_by_key(&node, |h| h.node) {
            self.forget_holder_at(i);
            self.version += 1;
        }
        self.waiting.retain(|w| w.node != node);
    }

    fn forget_holder_at(&mut self, i: usize) {
        let h = self.holders.remove(i);
        if self.kind.is_window() {
            // Its lease stays counted in the window (it may have spent it): keep a record
            // under a node id no member has, so the window's totals do not change.
            let ghost = HolderRecord {
                node: u64::MAX - h.node,
                incarnation: 0,
                demand: 0,
                previous_final: true,
                ..h
            };
            if ghost.granted > 0 || ghost.previous_held > 0 {
                let at = self
                    .holders
                    .binary_search_by_key(&ghost.node, |r| r.node)
                    .unwrap_or_else(|e| e);
                match self.holders.get_mut(at) {
                    Some(r) if r.node == ghost.node => {
                        r.granted += ghost.granted.saturating_sub(ghost.returned);
                        r.previous_held += ghost.previous_held;
                    }
                    _ => self.holders.insert(
                        at,
                        HolderRecord {
                            returned: 0,
                            granted: ghost.granted.saturating_sub(ghost.returned),
                            used: 0,
                            ..ghost
                        },
                    ),
                }
            }
        }
    }

    /// Apply a holder's report (its cumulative counts and demand). Return whether it told
    /// something the holder should see acknowledged (tokens given back, a final count).
    pub fn report(&mut self, now: Nanos, node: NodeId, incarnation: u64, want: &Want) -> bool {
        self.roll(now);
        if self.kind == MeshKind::Bucket {
            self.refill(now);
        }
        let kind = self.kind;
        let window = self.window;
        let interval = self.interval();
        let mut previous_correction = 0;
        let mut previous_raise = 0;
        let mut returned_tokens = 0;
        let mut granted_unseen = 0;
        let mut news = false;
        {
            if want.smallest > 0 {
                self.smallest.insert(node, want.smallest);
            }
            let seq = self.seqs.entry(node).or_insert(0);
            *seq = (*seq).max(want.seq);
            let known = self
                .holders
                .iter()
                .any(|h| h.node == node && h.incarnation == incarnation);
            let r = self.record_mut(node, incarnation);
            r.demand = want.demand;
            if !kind.is_window() || want.window == window {
                // A bucket taken over from a backup learns here of grants made after the
                // backup: those tokens left the bucket too (a window counts its holders'
                // grants, so the maximum below is enough there).
                if kind == MeshKind::Bucket && known && want.granted > r.granted {
                    granted_unseen = want.granted - r.granted;
                }
                // The holder's counts are authoritative for what it received and gave back:
                // a grant is always made on top of its latest report.
                r.granted = r.granted.max(want.granted);
                if want.returned > r.returned {
                    returned_tokens = want.returned - r.returned;
                    r.returned = want.returned;
                }
                r.used = r.used.max(want.used);
                if kind.is_window() && want.closed && !r.closed {
                    r.closed = true;
                    news = true;
                }
            }
            // The holder's final count of the window before ours, if it knows it.
            let previous_final = if want.window + 1 == window && want.closed {
                Some(want.used)
            } else if want.window == window {
                want.previous_used
            } else {
                None
            };
            if kind.is_window() && !r.previous_final {
                match previous_final {
                    Some(final_used) => {
                        news = true;
                        if final_used < r.previous_held {
                            previous_correction = r.previous_held - final_used;
                            r.previous_held = final_used;
                        }
                        r.previous_final = true;
                    }
                    None if want.window + 1 == window => {
                        // What it held then, as it reports it: an upper bound of its count.
                        let held = want.granted.saturating_sub(want.returned);
                        if held > r.previous_held {
                            previous_raise = held - r.previous_held;
                            r.previous_held = held;
                        }
                    }
                    None => {}
                }
            }
        }
        self.previous = self
            .previous
            .saturating_sub(previous_correction)
            .saturating_add(previous_raise);
        if granted_unseen > 0 {
            self.level_ns = self
                .level_ns
                .saturating_sub(granted_unseen.saturating_mul(interval));
        }
        if kind == MeshKind::Bucket && returned_tokens > 0 {
            self.level_ns = self
                .level_ns
                .saturating_add(returned_tokens.saturating_mul(interval))
                .min(self.policy.window_ns());
        }
        self.version += 1;
        news || returned_tokens > 0
    }

    /// Serve a request of `need` tokens from `node` (whose report was applied just before):
    /// grant, wait for recalled tokens (until `deadline`), or deny with a retry time.
    pub fn request(
        &mut self,
        now: Nanos,
        node: NodeId,
        incarnation: u64,
        need: u64,
        deadline: Nanos,
    ) -> Answer {
        self.roll(now);
        if self.kind.is_window() && now >= self.end && now < self.next_start {
            // After a handover, the next window starts a little later than this one ended.
            self.enqueue(now, node, need, deadline);
            return Answer::Wait;
        }
        self.offer(now, node, incarnation, need, deadline)
    }

    /// Grant what `need` gets now: all of it (with a lease on top), or what is free while
    /// the rest waits for recalled tokens, or what is free with a denial of the rest.
    fn offer(
        &mut self,
        now: Nanos,
        node: NodeId,
        incarnation: u64,
        need: u64,
        deadline: Nanos,
    ) -> Answer {
        let available = self.available(now);
        if need <= available {
            let extra = self.lease_extra(node, available - need);
            return self.grant(node, incarnation, need + extra, 0);
        }
        let recoverable = if now < deadline {
            self.recoverable(now, node)
        } else {
            0
        };
        // What is free now serves the first waiting requests; as much of the rest as a
        // recall may bring back waits; the rest is denied now.
        let coming = (need - available).min(recoverable);
        if coming > 0 {
            self.enqueue(now, node, coming, deadline);
        }
        let denied = available + coming < need;
        if available == 0 && !denied {
            return Answer::Wait;
        }
        let answer = self.grant_more(node, incarnation, available, 0, coming);
        if !denied {
            return answer;
        }
        // When the cheapest of the requests left could fit, after this grant.
        let smallest = self
            .smallest
            .get(&node)
            .copied()
            .unwrap_or(need)
            .clamp(1, need);
        let retry = self.retry_after(now, smallest);
        match answer {
            Answer::Grant {
                window,
                granted,
                ends_at,
                more_coming,
                ..
            } => Answer::Grant {
                window,
                granted,
                ends_at,
                retry_after: retry,
                more_coming,
            },
            Answer::Wait => Answer::Wait,
        }
    }

    fn enqueue(&mut self, now: Nanos, node: NodeId, need: u64, deadline: Nanos) {
        let wake = now
            .saturating_add(self.retry_after(now, need))
            .min(deadline);
        match self.waiting.iter_mut().find(|w| w.node == node) {
            Some(w) => {
                w.need = w.need.max(need);
                w.deadline = w.deadline.max(deadline);
                w.wake = w.wake.min(wake);
            }
            None => self.waiting.push_back(Waiter {
                node,
                need,
                deadline,
                wake,
            }),
        }
    }

    fn grant(&mut self, node: NodeId, incarnation: u64, tokens: u64, retry_after: Nanos) -> Answer {
        self.grant_more(node, incarnation, tokens, retry_after, 0)
    }

    fn grant_more(
        &mut self,
        node: NodeId,
        incarnation: u64,
        tokens: u64,
        retry_after: Nanos,
        more_coming: u64,
    ) -> Answer {
        let interval = self.interval();
        let kind = self.kind;
        let r = self.record_mut(node, incarnation);
        r.granted += tokens;
        let granted = r.granted;
        if kind == MeshKind::Bucket {
            self.level_ns = self
                .level_ns
                .saturating_sub(tokens.saturating_mul(interval));
        }
        if tokens > 0 {
            self.version += 1;
        }
        Answer::Grant {
            window: if kind.is_window() { self.window } else { 0 },
            granted,
            ends_at: if kind.is_window() { self.end } else { 0 },
            retry_after,
            more_coming,
        }
    }

    /// Tokens a wait may free at `now`: what other holders sit on, as far as their reports
    /// tell (a recall brings it back), and, for a sliding window, the weight of what the
    /// previous window leased but may not have used (the final counts are on their way).
    fn recoverable(&self, now: Nanos, except: NodeId) -> u64 {
        let unspent_leases: u64 = self
            .holders
            .iter()
            .filter(|h| h.node != except && h.incarnation != 0)
            .map(unspent)
            .sum();
        let pending_finals = if self.kind == MeshKind::SlidingWindow {
            let unconfirmed: u64 = self
                .holders
                .iter()
                .filter(|h| !h.previous_final)
                .map(|h| h.previous_held)
                .sum();
            let w = self.policy.window_ns();
            let elapsed = now.saturating_sub(self.start).min(w);
            (u128::from(unconfirmed) * u128::from(w - elapsed)).div_ceil(u128::from(w)) as u64
        } else {
            0
        };
        unspent_leases + pending_finals
    }

    /// Return the holders to ask for tokens back, with what each may keep, when requests
    /// wait: what they hold beyond a round of their demand if that is enough, else all of
    /// it. At most once per `min_gap` ns.
    pub fn recall_targets(&mut self, now: Nanos, min_gap: Nanos) -> Vec<(NodeId, u64)> {
        if self.waiting.is_empty() || now < self.recalled_at.saturating_add(min_gap) {
            return Vec::new();
        }
        let waiting: Vec<NodeId> = self.waiting.iter().map(|w| w.node).collect();
        let wanted: u64 = self.waiting.iter().map(|w| w.need).sum();
        let shortfall = wanted.saturating_sub(self.available(now));
        let round = |h: &HolderRecord| u64::from(h.demand).div_ceil(16);
        let candidates: Vec<&HolderRecord> = self
            .holders
            .iter()
            .filter(|h| h.incarnation != 0 && !waiting.contains(&h.node) && unspent(h) > 0)
            .collect();
        let beyond_a_round: u64 = candidates
            .iter()
            .map(|h| unspent(h).saturating_sub(round(h)))
            .sum();
        let keep_a_round = beyond_a_round >= shortfall;
        let targets: Vec<(NodeId, u64)> = candidates
            .into_iter()
            .filter(|h| !keep_a_round || unspent(h) > round(h))
            .map(|h| (h.node, if keep_a_round { round(h) } else { 0 }))
            .collect();
        if !targets.is_empty() {
            self.recalled_at = now;
        }
        targets
    }

    /// Serve the waiting requests that can be served at `now` (after returns, or a new
    /// window), and deny those past their deadline; return the answers by node.
    pub fn serve_waiting(&mut self, now: Nanos) -> Vec<(NodeId, u64, Answer)> {
        let mut answers = Vec::new();
        let mut still = VecDeque::new();
        while let Some(w) = self.waiting.pop_front() {
            let incarnation = self
                .holders
                .iter()
                .find(|h| h.node == w.node)
                .map_or(0, |h| h.incarnation);
            if self.kind.is_window() && now >= self.end && now < self.next_start {
                if now >= w.deadline {
                    let retry = self.next_start - now;
                    answers.push((
                        w.node,
                        incarnation,
                        self.grant(w.node, incarnation, 0, retry),
                    ));
                } else {
                    still.push_back(Waiter {
                        wake: self.next_start.min(w.deadline),
                        ..w
                    });
                }
                continue;
            }
            if self.available(now) == 0
                && now < w.deadline
                && self.recoverable(now, w.node) >= w.need
            {
                let wake = now.saturating_add(self.retry_after(now, w.need));
                still.push_back(Waiter {
                    wake: wake.min(w.deadline),
                    ..w
                });
                continue;
            }
            let before = self.waiting.len();
            let answer = self.offer(now, w.node, incarnation, w.need, w.deadline);
            // `offer` queued the rest at the back: keep this waiter's place instead.
            if self.waiting.len() > before
                && let Some(rest) = self.waiting.pop_back()
            {
                still.push_back(rest);
            }
            if answer != Answer::Wait {
                answers.push((w.node, incarnation, answer));
            }
        }
        self.waiting = still;
        answers
    }

    /// Look at the waiting requests no sooner than `at` (while the authority may not grant,
    /// only their deadlines matter).
    pub fn defer_wakes(&mut self, at: Nanos) {
        for w in &mut self.waiting {
            w.wake = w.wake.max(at).min(w.deadline);
        }
    }

    /// Deny the waiting requests past their deadline (while the authority may not grant).
    pub fn deny_overdue(&mut self, now: Nanos) -> Vec<(NodeId, Answer)> {
        let mut answers = Vec::new();
        let overdue: Vec<Waiter> = self
            .waiting
            .iter()
            .copied()
            .filter(|w| w.deadline <= now)
            .collect();
        self.waiting.retain(|w| w.deadline > now);
        for w in overdue {
            let incarnation = self
                .holders
                .iter()
                .find(|h| h.node == w.node)
                .map_or(0, |h| h.incarnation);
            let retry = self.retry_after(now, w.need);
            answers.push((w.node, self.grant(w.node, incarnation, 0, retry)));
        }
        answers
    }

    /// Answer `node` with what it holds now, granting nothing (an acknowledgement).
    pub fn current(&mut self, now: Nanos, node: NodeId) -> Answer {
        self.roll(now);
        let granted = self
            .holders
            .iter()
            .find(|h| h.node == node)
            .map_or(0, |h| h.granted);
        Answer::Grant {
            window: if self.kind.is_window() {
                self.window
            } else {
                0
            },
            granted,
            ends_at: if self.kind.is_window() { self.end } else { 0 },
            retry_after: 0,
            more_coming: 0,
        }
    }

    /// How many tokens beyond `need` to lease to `node`, out of `headroom` (none while
    /// others wait: what is free goes to them first).
    fn lease_extra(&self, node: NodeId, headroom: u64) -> u64 {
        let Some(r) = self.holders.iter().find(|h| h.node == node) else {
            return 0;
        };
        if r.demand == 0 || headroom == 0 || self.waiting.iter().any(|w| w.node != node) {
            return 0;
        }
        let total: u64 = self
            .holders
            .iter()
            .filter(|h| h.incarnation != 0)
            .map(|h| u64::from(h.demand))
            .sum::<u64>()
            .max(1);
        let demand = u64::from(r.demand);
        let plentiful =
            u128::from(headroom) * 16 >= u128::from(total) * u128::from(4 * LONG_LEASE_ROUNDS);
        let rounds = if plentiful {
            LONG_LEASE_ROUNDS
        } else {
            SHORT_LEASE_ROUNDS
        };
        let target = (demand * rounds).div_ceil(16);
        let unspent = r.granted.saturating_sub(r.returned).saturating_sub(r.used);
        let cap = (u128::from(headroom) * u128::from(demand) / u128::from(total) / 2) as u64;
        target.saturating_sub(unspent).min(cap)
    }

    /// When `need` tokens could be had at the earliest (from `now`), in ns (at least 1 ms).
    pub fn retry_after(&mut self, now: Nanos, need: u64) -> Nanos {
        let limit = self.policy.capacity();
        let retry = match self.kind {
            MeshKind::Bucket => {
                self.refill(now);
                need.saturating_mul(self.interval())
                    .saturating_sub(self.level_ns)
            }
            MeshKind::FixedWindow => self.next_start.saturating_sub(now),
            MeshKind::SlidingWindow => {
                let allocated = self.allocated();
                let w = self.policy.window_ns();
                if allocated + need > limit || self.previous == 0 {
                    self.next_start.saturating_sub(now)
                } else {
                    // previous · (w − e) / w ≤ limit − allocated − need.
                    let room = limit - allocated - need;
                    let e = w
                        - (u128::from(room) * u128::from(w) / u128::from(self.previous))
                            .min(u128::from(w)) as u64;
                    (self.start + e).saturating_sub(now)
                }
            }
        };
        retry.max(1_000_000)
    }
}

/// Tokens a holder was leased and has not reported spent or given back.
fn unspent(h: &HolderRecord) -> u64 {
    h.granted.saturating_sub(h.returned).saturating_sub(h.used)
}

fn blank(node: NodeId, incarnation: u64) -> HolderRecord {
    HolderRecord {
        node,
        incarnation,
        granted: 0,
        returned: 0,
        used: 0,
        demand: 0,
        previous_held: 0,
        previous_final: true,
        closed: false,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const KEY: KeyRef = KeyRef { policy: 0, key: 7 };
    const S: Nanos = 1_000_000_000;

    fn want(window: u64, granted: u64, used: u64, demand: u32) -> Want {
        Want {
            key: KEY,
            window,
            granted,
            returned: 0,
            used,
            closed: false,
            need: 0,
            smallest: 0,
            seq: 0,
            refill: false,
            demand,
            previous_used: None,
        }
    }

    fn granted(answer: Answer) -> (u64, Nanos) {
        match answer {
            Answer::Grant {
                granted,
                retry_after,
                ..
            } => (granted, retry_after),
            Answer::Wait => panic!("waits"),
        }
    }

    #[test]
    fn a_fixed_window_never_leases_more_than_the_limit() {
        let policy = Policy::fixed_window(100, Duration::from_secs(1)).unwrap();
        let mut a = Authority::fresh(KEY, policy, MeshKind::FixedWindow, 10 * S);
        let mut total = 0;
        for i in 0..300u64 {
            let node = i % 3;
            let before = a
                .holders()
                .iter()
                .find(|h| h.node == node)
                .map_or(0, |h| h.granted);
            a.report(10 * S + i, node, 1, &want(10, before, before, 32));
            let (g, _) = granted(a.request(10 * S + i, node, 1, 1, 0));
            total += g - before;
        }
        assert_eq!(total, 100);
        // The next window starts afresh.
        let (g, retry) = granted(a.request(11 * S, 0, 1, 5, 0));
        assert_eq!(retry, 0);
        assert!(g >= 5);
    }

    #[test]
    fn a_sliding_window_weighs_the_previous_window_and_corrects_it_with_final_counts() {
        let policy = Policy::sliding_window(100, Duration::from_secs(1)).unwrap();
        let mut a = Authority::fresh(KEY, policy, MeshKind::SlidingWindow, 10 * S);
        a.report(10 * S, 1, 1, &want(10, 0, 0, 0));
        granted(a.request(10 * S, 1, 1, 80, 0));
        // Half-way through the next window, 80 · 0.5 = 40 of the previous still weighs.
        assert_eq!(a.available(11 * S + S / 2), 60);
        // The holder reports it only used 20: the previous count shrinks.
        let mut w = want(10, 80, 20, 0);
        w.closed = true;
        a.report(11 * S + S / 2, 1, 1, &w);
        assert_eq!(a.available(11 * S + S / 2), 90);
    }

    #[test]
    fn a_bucket_refills_but_never_above_the_burst_less_the_leases() {
        let policy = Policy::token_bucket(100, Duration::from_secs(1), 100).unwrap();
        let mut a = Authority::fresh(KEY, policy, MeshKind::Bucket, 10 * S);
        a.report(10 * S, 1, 1, &want(0, 0, 0, 0));
        granted(a.request(10 * S, 1, 1, 60, 0));
        assert_eq!(a.available(10 * S), 40);
        // A second later the bucket would be full, but 60 tokens are still leased.
        assert_eq!(a.available(11 * S), 40);
        // The holder reports it spent them: the cap rises, the level refills from there.
        a.report(11 * S, 1, 1, &want(0, 60, 60, 0));
        assert_eq!(a.available(11 * S), 40);
        assert_eq!(a.available(11 * S + S / 2), 90);
        // A dead holder's lease counts as spent.
        granted(a.request(12 * S, 1, 1, 50, 0));
        a.forget_holder(1);
        assert_eq!(a.available(12 * S), 50);
        assert_eq!(a.available(13 * S), 100);
    }

    #[test]
    fn a_request_waits_for_recalled_tokens_instead_of_a_denial() {
        let policy = Policy::fixed_window(10, Duration::from_secs(3600)).unwrap();
        let mut a = Authority::fresh(KEY, policy, MeshKind::FixedWindow, 10 * S);
        a.report(10 * S, 1, 1, &want(0, 0, 0, 0));
        granted(a.request(10 * S, 1, 1, 10, 0));
        a.report(10 * S, 2, 1, &want(0, 0, 0, 0));
        assert_eq!(a.request(10 * S, 2, 1, 3, 11 * S), Answer::Wait);
        assert_eq!(a.recall_targets(10 * S, 0), vec![(1, 0)]);
        // Node 1 gives 5 back.
        let window = a.frame().0;
        let mut back = want(window, 10, 2, 0);
        back.returned = 5;
        a.report(10 * S + 1, 1, 1, &back);
        let answers = a.serve_waiting(10 * S + 1);
        assert_eq!(answers.len(), 1);
        assert_eq!(granted(answers[0].2), (3, 0));
        // Node 3 needs 5: the 2 left are granted, 3 more may come back from node 1 (it holds
        // 3 unspent): the rest of its requests wait for them.
        a.report(10 * S + 2, 3, 1, &want(0, 0, 0, 0));
        match a.request(10 * S + 2, 3, 1, 5, 11 * S) {
            Answer::Grant {
                granted,
                retry_after,
                more_coming,
                ..
            } => assert_eq!((granted, retry_after, more_coming), (2, 0, 3)),
            Answer::Wait => panic!("waits"),
        }
        // Node 1 spent them after all: node 3's waiting need cannot be met, it is denied
        // with the window's end.
        a.report(10 * S + 3, 1, 1, &want(window, 10, 5, 0));
        a.report(10 * S + 3, 2, 1, &want(window, 3, 3, 0));
        let answers = a.serve_waiting(10 * S + 3);
        assert_eq!(answers.len(), 1);
        let (_, retry) = granted(answers[0].2);
        assert!(retry > 3000 * S, "{retry}");
    }

    #[test]
    fn leases_follow_demand_and_shrink_near_the_limit() {
        let policy = Policy::fixed_window(10_000, Duration::from_secs(1)).unwrap();
        let mut a = Authority::fresh(KEY, policy, MeshKind::FixedWindow, 10 * S);
        // 10 tokens per round: plenty of room, a long lease.
        a.report(10 * S, 1, 1, &want(0, 0, 0, 160));
        let (g, _) = granted(a.request(10 * S, 1, 1, 1, 0));
        assert_eq!(g, 1 + 250);
        // Near the limit: at most half of the headroom.
        let policy = Policy::fixed_window(100, Duration::from_secs(1)).unwrap();
        let mut a = Authority::fresh(KEY, policy, MeshKind::FixedWindow, 10 * S);
        a.report(10 * S, 1, 1, &want(0, 0, 0, 160));
        let (g, _) = granted(a.request(10 * S, 1, 1, 1, 0));
        assert_eq!(g, 1 + 40);
    }

    #[test]
    fn a_taken_over_state_ends_its_window_no_later_than_the_sender() {
        let policy = Policy::fixed_window(100, Duration::from_secs(1)).unwrap();
        let mut a = Authority::fresh(KEY, policy, MeshKind::FixedWindow, 10 * S);
        a.report(10 * S, 1, 1, &want(0, 0, 0, 0));
        granted(a.request(10 * S, 1, 1, 30, 0));
        // The receiver's clock is 5 s behind, known within 2 ms.
        let offset = Offset {
            offset: 5 * S as i64,
            error: 2_000_000,
            round_trip: 4_000_000,
        };
        let mut b = Authority::from_state(&a.state(), policy, MeshKind::FixedWindow, offset, 5 * S);
        let (window, _, end) = b.frame();
        assert_eq!(window, 10);
        assert_eq!(end, 6 * S - 2_000_000);
        assert_eq!(b.available(5 * S), 70);
        // Between its end and the next start, requests wait.
        assert_eq!(b.request(6 * S, 2, 1, 1, 7 * S), Answer::Wait);
        let answers = b.serve_waiting(6 * S + 2_000_000);
        assert_eq!(answers.len(), 1);
    }
}
