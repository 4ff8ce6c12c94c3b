//! How an authority answers holders: grants with a lease on top, waits for recalled or
//! refilled tokens, denials with a retry time, and recalls of unused leases.

use std::collections::VecDeque;

use super::{Answer, Authority, LONG_LEASE_ROUNDS, SHORT_LEASE_ROUNDS, Waiter, is_retired};
use crate::algorithm::sliding_window;
use crate::clock::Nanos;
use crate::mesh::NodeId;
use crate::mesh::message::HolderRecord;
use crate::mesh::windows::MeshPolicy;
use crate::policy::Algorithm;

impl Authority {
    /// Serve a request of `need` tokens from `node` (whose report was applied just before):
    /// grant, wait for recalled tokens (until `deadline`), or deny with a retry time.
    pub(crate) fn request(
        &mut self,
        policy: &MeshPolicy,
        now: Nanos,
        node: NodeId,
        incarnation: u64,
        need: u64,
        deadline: Nanos,
    ) -> Answer {
        self.roll(policy, now);
        if self.between_windows(policy, now) {
            // After a handover, the next window starts a little later than this one ended.
            self.enqueue(policy, now, node, need, deadline);
            return Answer::Wait;
        }
        self.offer(policy, now, node, incarnation, need, deadline)
    }

    /// Grant what `need` gets now: all of it (with a lease on top), or what is free while
    /// the rest waits for recalled tokens, or what is free with a denial of the rest.
    fn offer(
        &mut self,
        policy: &MeshPolicy,
        now: Nanos,
        node: NodeId,
        incarnation: u64,
        need: u64,
        deadline: Nanos,
    ) -> Answer {
        let available = self.available(policy, now);
        if need <= available {
            let extra = self.lease_extra(node, available - need);
            return self.grant(policy, node, incarnation, need + extra, 0);
        }
        let recoverable = if now < deadline {
            self.recoverable(policy, now, node)
        } else {
            0
        };
        // What is free now serves the first waiting requests; as much of the rest as a
        // recall may bring back waits; the rest is denied now.
        let mut coming = (need - available).min(recoverable);
        if available + coming < need && now < deadline {
            // Room the policy frees by itself (a sliding window's previous window fading, a
            // bucket refilling, the next window) serves the rest if it comes soon enough,
            // after what waits ahead: hold the rest for it rather than deny.
            let ahead: u64 = self
                .waiting
                .iter()
                .filter(|w| w.node != node)
                .map(|w| w.need)
                .sum();
            let hold = self.hold_ns.min(deadline - now);
            if self.until_room(policy, now, need + ahead) <= hold {
                coming = need - available;
            }
        }
        if coming > 0 {
            self.enqueue(policy, now, node, coming, deadline);
        }
        let denied = available + coming < need;
        if available == 0 && !denied {
            return Answer::Wait;
        }
        let smallest = self.smallest_of(node).unwrap_or(need).clamp(1, need);
        // What is free goes to the holder unless it serves none of its requests (even the
        // cheapest needs more, and nothing more is coming): it then stays free for the
        // others rather than sit unused in this holder's lease.
        let free = if denied && coming == 0 && available < smallest {
            0
        } else {
            available
        };
        let answer = self.grant_more(policy, node, incarnation, free, 0, coming);
        if !denied {
            return answer;
        }
        // When the cheapest of the requests left could fit, with what the holder's lease
        // holds after this grant and what the recall brings back (the holder asks again
        // then; a later estimate would deny it requests there is room for). Its lease, as
        // its report tells, holds at least what it has (it may have spent more since).
        let held = self
            .holders
            .binary_search_by_key(&node, |h| h.node)
            .ok()
            .map(|i| &self.holders[i])
            .filter(|h| !h.closed)
            .map_or(0, |h| h.tally.unspent());
        let short = smallest.saturating_sub(held).saturating_sub(coming);
        let retry = self.retry_after(policy, now, short.max(1));
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

    fn enqueue(
        &mut self,
        policy: &MeshPolicy,
        now: Nanos,
        node: NodeId,
        need: u64,
        deadline: Nanos,
    ) {
        let wake = now
            .saturating_add(self.retry_after(policy, now, need))
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

    fn grant(
        &mut self,
        policy: &MeshPolicy,
        node: NodeId,
        incarnation: u64,
        tokens: u64,
        retry_after: Nanos,
    ) -> Answer {
        self.grant_more(policy, node, incarnation, tokens, retry_after, 0)
    }

    fn grant_more(
        &mut self,
        policy: &MeshPolicy,
        node: NodeId,
        incarnation: u64,
        tokens: u64,
        retry_after: Nanos,
        more_coming: u64,
    ) -> Answer {
        let interval = self.interval(policy);
        let algorithm = policy.algorithm();
        let r = self.record_mut(policy, node, incarnation);
        r.tally.granted += tokens;
        let granted = r.tally.granted;
        if algorithm.is_bucket() {
            self.level_ns = self
                .level_ns
                .saturating_sub(tokens.saturating_mul(interval));
        }
        if tokens > 0 {
            self.version += 1;
        }
        Answer::Grant {
            window: if algorithm.counts_per_window() {
                self.window
            } else {
                0
            },
            granted,
            ends_at: if algorithm.counts_per_window() {
                self.end
            } else {
                0
            },
            retry_after,
            more_coming,
        }
    }

    /// Tokens a wait may free at `now`: what other holders sit on, as far as their reports
    /// tell (a recall brings it back; not from a holder that waits itself, which is never
    /// recalled), and, for a sliding window, the weight of what the previous window leased
    /// but may not have used (the final counts are on their way).
    fn recoverable(&self, policy: &MeshPolicy, now: Nanos, except: NodeId) -> u64 {
        let unspent_leases: u64 = self
            .holders
            .iter()
            .filter(|h| {
                h.node != except
                    && h.incarnation != 0
                    && !self.waiting.iter().any(|w| w.node == h.node)
            })
            .map(|h| h.tally.unspent())
            .sum();
        let pending_finals = if policy.algorithm().weighs_previous() {
            let unconfirmed: u64 = self
                .holders
                .iter()
                .filter(|h| !h.previous_final && !is_retired(h))
                .map(|h| h.previous_held)
                .sum();
            let w = policy.length_of(self.window);
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
    pub(crate) fn recall_targets(
        &mut self,
        policy: &MeshPolicy,
        now: Nanos,
        min_gap: Nanos,
    ) -> Vec<(NodeId, u64)> {
        if self.waiting.is_empty() || now < self.recalled_at.saturating_add(min_gap) {
            return Vec::new();
        }
        let waiting: Vec<NodeId> = self.waiting.iter().map(|w| w.node).collect();
        let wanted: u64 = self.waiting.iter().map(|w| w.need).sum();
        let shortfall = wanted.saturating_sub(self.available(policy, now));
        let round = |h: &HolderRecord| u64::from(h.demand).div_ceil(16);
        let candidates: Vec<&HolderRecord> = self
            .holders
            .iter()
            .filter(|h| h.incarnation != 0 && !waiting.contains(&h.node) && h.tally.unspent() > 0)
            .collect();
        let beyond_a_round: u64 = candidates
            .iter()
            .map(|h| h.tally.unspent().saturating_sub(round(h)))
            .sum();
        let keep_a_round = beyond_a_round >= shortfall;
        let targets: Vec<(NodeId, u64)> = candidates
            .into_iter()
            .filter(|h| !keep_a_round || h.tally.unspent() > round(h))
            .map(|h| (h.node, if keep_a_round { round(h) } else { 0 }))
            .collect();
        if !targets.is_empty() {
            self.recalled_at = now;
        }
        targets
    }

    /// Tell whether `now` falls between a window's end and the next one's start (after a
    /// handover the next window starts a little later): nothing is granted then, and a
    /// request that waits past its deadline meanwhile is denied for the gap, not for room.
    pub(crate) fn between_windows(&self, policy: &MeshPolicy, now: Nanos) -> bool {
        policy.algorithm().counts_per_window() && now >= self.end && now < self.next_start
    }

    /// Return the holders to ask for all they hold (a lockout): every holder whose record
    /// shows unspent tokens, at most once per `min_gap` ns.
    pub(crate) fn recall_all(&mut self, now: Nanos, min_gap: Nanos) -> Vec<(NodeId, u64)> {
        if now < self.recalled_at.saturating_add(min_gap) {
            return Vec::new();
        }
        let targets: Vec<(NodeId, u64)> = self
            .holders
            .iter()
            .filter(|h| h.incarnation != 0 && !h.closed && h.tally.unspent() > 0)
            .map(|h| (h.node, 0))
            .collect();
        if !targets.is_empty() {
            self.recalled_at = now;
        }
        targets
    }

    /// Stop waiting for room for anyone (a lockout): return the holders that waited, to be
    /// answered with a denial.
    pub(crate) fn take_waiting(&mut self) -> Vec<NodeId> {
        self.waiting.drain(..).map(|w| w.node).collect()
    }

    /// Serve the waiting requests that can be served at `now` (after returns, or a new
    /// window), and deny those past their deadline; return the answers by node.
    pub(crate) fn serve_waiting(
        &mut self,
        policy: &MeshPolicy,
        now: Nanos,
    ) -> Vec<(NodeId, u64, Answer)> {
        // A new window first: the records looked up below are then the ones granted from.
        self.roll(policy, now);
        let mut answers = Vec::new();
        let mut still = VecDeque::new();
        while let Some(w) = self.waiting.pop_front() {
            let incarnation = self
                .holders
                .iter()
                .find(|h| h.node == w.node)
                .map_or(0, |h| h.incarnation);
            if self.between_windows(policy, now) {
                if now >= w.deadline {
                    let retry = self.next_start - now;
                    answers.push((
                        w.node,
                        incarnation,
                        self.grant(policy, w.node, incarnation, 0, retry),
                    ));
                } else {
                    still.push_back(Waiter {
                        wake: self.next_start.min(w.deadline),
                        ..w
                    });
                }
                continue;
            }
            if self.available(policy, now) == 0
                && now < w.deadline
                && self.recoverable(policy, now, w.node) >= w.need
            {
                let wake = now.saturating_add(self.retry_after(policy, now, w.need));
                still.push_back(Waiter {
                    wake: wake.min(w.deadline),
                    ..w
                });
                continue;
            }
            let before = self.waiting.len();
            let answer = self.offer(policy, now, w.node, incarnation, w.need, w.deadline);
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
    pub(crate) fn defer_wakes(&mut self, at: Nanos) {
        for w in &mut self.waiting {
            w.wake = w.wake.max(at).min(w.deadline);
        }
    }

    /// Forget the waiting requests past their deadline (while the authority may not grant),
    /// without answering them: the holder's requests waited since before the want reached
    /// here, so its own deadlines passed first and it denied them. A denial from here would
    /// also deny the requests its later wants counted, which still have time to wait (and
    /// say nothing of the room).
    pub(crate) fn drop_overdue(&mut self, now: Nanos) {
        self.waiting.retain(|w| w.deadline > now);
    }

    /// Answer `node` with what it holds now, granting nothing (an acknowledgement).
    pub(crate) fn current(&mut self, policy: &MeshPolicy, now: Nanos, node: NodeId) -> Answer {
        self.roll(policy, now);
        let granted = self
            .holders
            .iter()
            .find(|h| h.node == node)
            .map_or(0, |h| h.tally.granted);
        Answer::Grant {
            window: if policy.algorithm().counts_per_window() {
                self.window
            } else {
                0
            },
            granted,
            ends_at: if policy.algorithm().counts_per_window() {
                self.end
            } else {
                0
            },
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
        let unspent = r.tally.unspent();
        let cap = (u128::from(headroom) * u128::from(demand) / u128::from(total) / 2) as u64;
        target.saturating_sub(unspent).min(cap)
    }

    /// When `need` tokens could be had at the earliest (from `now`), in ns (at least 1 ms).
    pub(crate) fn retry_after(&mut self, policy: &MeshPolicy, now: Nanos, need: u64) -> Nanos {
        self.until_room(policy, now, need).max(1_000_000)
    }

    /// How long until `need` tokens fit, from `now`, by the policy alone (no returns).
    fn until_room(&mut self, policy: &MeshPolicy, now: Nanos, need: u64) -> Nanos {
        let limit = policy.capacity();
        match policy.algorithm() {
            Algorithm::FixedWindow => self.next_start.saturating_sub(now),
            Algorithm::SlidingWindow => {
                let allocated = self.allocated();
                let w = policy.length_of(self.window);
                let previous = self.counted_previous();
                if allocated + need > limit || previous == 0 {
                    self.next_start.saturating_sub(now)
                } else {
                    let room = limit - allocated - need;
                    let e = sliding_window::fits_at(w, previous, room);
                    (self.start + e).saturating_sub(now)
                }
            }
            // A bucket (the node takes no other algorithm).
            _ => {
                self.refill(policy, now);
                need.saturating_mul(self.interval(policy))
                    .saturating_sub(self.level_ns)
            }
        }
    }
}
