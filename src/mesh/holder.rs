//! One key on a node that uses it: its lease, the requests that wait for more, its demand,
//! and what it tells the key's authority.
//!
//! Requests take tokens from the lease's cell (`mesh::lease`, no lock). One that finds too
//! few waits here (`max_wait` at most), first in first out: the cell's tokens move into a
//! reserve that only waiting requests use, so later requests queue behind them instead of
//! overtaking. The holder then asks the authority for what the waiting requests need; the
//! answer is a larger lease, a wait while the authority recalls unused leases, or a denial
//! with the time a retry can succeed, which the holder then applies to later requests
//! without asking again. A window's lease dies with its window; the holder then knows its
//! final count of that window exactly (granted − returned − left) and, for a sliding
//! window, reports it, so the authority's view of the previous count tightens to what was
//! really used (a fixed window starts afresh: its final counts are not sent). A window's
//! lease spent to its last token is no news either: the authority counts what it granted as
//! spent until told otherwise, so a sparse key's request under a fixed window costs a
//! want, a grant and the owner's backup (a sliding window adds the final count and the
//! owner's backup of it).

use std::collections::VecDeque;
use std::sync::Arc;

use crate::clock::Nanos;
use crate::decision::Decision;
use crate::mesh::authority::SHORT_LEASE_ROUNDS;
use crate::mesh::lease::{LeaseCell, Miss};
use crate::mesh::membership::RankMemo;
use crate::mesh::message::{Grant, KeyRef, Want};
use crate::mesh::tally::Tally;
use crate::policy::{Algorithm, Policy};
use asking::Asking;
use demand::Demand;
use denial::{DENIED_RESEND_NS, Denial};

mod asking;
mod demand;
mod denial;
mod waiting;

pub(crate) use waiting::{Decided, Slow, Waiting};

/// Rounds without demand after which a holder gives its unspent lease back.
pub(crate) const IDLE_ROUNDS: u32 = 10;

/// Over how many rounds the holdings whose times end together are looked at again (by key).
const WAKE_SPREAD_ROUNDS: u64 = 16;

/// Rounds between reports of a holder's count when nothing else is sent.
pub(crate) const REPORT_ROUNDS: u64 = 4;

/// One key on a node that uses it.
#[derive(Debug)]
pub(crate) struct Holding {
    key: KeyRef,
    /// Numbers this holding among the node's holdings of the key (see [`Want::holding`]).
    id: u64,
    cell: Arc<LeaseCell>,
    /// The key's algorithm and window (fixed while the nodes run; the limits it is
    /// enforced with are the node's, handed to the decisions that use them).
    algorithm: Algorithm,
    window_ns: Nanos,
    /// The lease's window (windows; 0 for buckets and before the first grant).
    window: u64,
    granted: u64,
    returned: u64,
    /// The most admissions a want of this lease reported: what the authority may have
    /// counted. Tokens given back to the lease after they were reported
    /// ([`crate::mesh::lease::LeaseCell::give_back`]) may be admitted again here, but are
    /// never returned to the authority too: the holding reports at least this many used.
    used_sent: u64,
    /// When the lease expires (local; windows).
    expiry: Nanos,
    /// The lease of `window` ended; `closed_used` is the final count.
    closed: bool,
    closed_used: u64,
    /// The final count of the window before `window`, until the authority confirms it.
    previous_used: Option<u64>,
    /// Tokens set aside for waiting requests.
    reserve: u64,
    waiting: VecDeque<Waiting>,
    /// The authority's last denial, in force here until its retry time.
    denial: Denial,
    /// What the key asks for, round by round.
    demand: Demand,
    used_at_tick: u64,
    /// The count of admissions last seen, and when it was first seen: the last admission
    /// it counts was no later ([`Want::spent_ago`]).
    used_seen: (u64, Nanos),
    /// What it told the key's authority and heard back.
    asking: Asking,
    /// Kept at least until then (a holding that admitted a request on credit): the node
    /// takes a key's credit again only once it forgot the key.
    keep_until: Nanos,
    /// The key's owner and successor, as last ranked.
    rank: RankMemo,
}

impl Holding {
    /// A key this node has no lease for yet; `id` is larger than any earlier holding's of
    /// the key on this node.
    pub(crate) fn new(key: KeyRef, policy: &Policy, id: u64) -> Self {
        let cell = LeaseCell::of_holding(id);
        let algorithm = policy.algorithm();
        if !algorithm.counts_per_window() {
            // A bucket's lease never expires: its tokens stay counted until spent or given
            // back.
            cell.renew(0, None);
        }
        Holding {
            key,
            id,
            cell: Arc::new(cell),
            algorithm,
            window_ns: policy.window_ns(),
            window: 0,
            granted: 0,
            returned: 0,
            used_sent: 0,
            expiry: 0,
            closed: algorithm.counts_per_window(),
            closed_used: 0,
            previous_used: None,
            reserve: 0,
            waiting: VecDeque::new(),
            denial: Denial::default(),
            demand: Demand::default(),
            used_at_tick: 0,
            used_seen: (0, 0),
            asking: Asking::default(),
            keep_until: 0,
            rank: RankMemo::default(),
        }
    }

    /// The key's ranking as this node last made it ([`RankMemo`]).
    pub(crate) fn rank(&self) -> &RankMemo {
        &self.rank
    }

    /// The key's policy is enforced with other limits from now on (a live change of its
    /// limit or rate); the lease keeps the tokens it was granted. A denial the authority
    /// gave under the old limits no longer holds: the next request asks again.
    pub(crate) fn limits_changed(&mut self) {
        self.denial.forget();
    }

    /// Forget the authority's last denial: the room it was about changed (a member that
    /// left gave its lease back); the next request asks again.
    pub(crate) fn forget_denial(&mut self) {
        self.denial.forget();
    }

    /// Tell whether the rounds after round `round` would change nothing here but the count
    /// of idle rounds and the decay of the demand, until [`Holding::wake_round`]: nothing
    /// waits or is set aside, the lease cannot be spent (its cell is empty or closed),
    /// nothing to report, and no demand, or a lone request's demand that decays to nothing
    /// before a report of it is due (and asks for no refill). A node may skip such a
    /// holding's rounds, as long as nothing happens to it, and then [`Holding::catch_up`].
    pub(crate) fn at_rest(&self, round: u64) -> bool {
        let used = self.used();
        let (reported_used, reported_round, reported_demand) = self.asking.last_report();
        self.waiting.is_empty()
            && self.reserve == 0
            && self.demand.offered() == 0
            && reported_demand == 0
            && (self.closed || self.cell.remaining() == 0)
            && used == self.used_at_tick
            && (used == reported_used || self.spent_out_at(0))
            && self.previous_used.is_none()
            && !(self.asking.report_due() && self.granted > 0)
            && !self.asking.withdraw_due()
            && self
                .demand
                .fades_unreported(round, reported_round.saturating_add(self.report_every()))
    }

    /// Return the rounds with nothing offered after which the demand is 0.
    pub(crate) fn fading_rounds(&self) -> u64 {
        self.demand.fading_rounds()
    }

    /// Return the first round at which a holding at rest after round `round` may be
    /// forgotten ([`Holding::is_idle`]; rounds are `interval` ns long): its idle rounds are
    /// enough and its times have passed. Before, its rounds change nothing but the idle count.
    pub(crate) fn wake_round(&self, round: u64, interval: Nanos) -> u64 {
        let idle = round + self.demand.idle_rounds_left().max(1);
        let at = self
            .denial
            .until()
            .max(self.keep_until)
            .max(self.counted_until());
        // A round that begins at `now` has the number `now / interval`: none before
        // `at / interval` reaches `at`. The holdings of one window all reach it at its end:
        // each waits a few rounds more by its key, so that they are forgotten over
        // several rounds rather than in one long one.
        let spread = if at == 0 {
            0
        } else {
            self.key.key % WAKE_SPREAD_ROUNDS
        };
        idle.max(at / interval.max(1) + spread)
    }

    /// Start counting rounds from the node's count `rounds` (a new holding).
    pub(crate) fn count_rounds_from(&mut self, rounds: u64) {
        self.demand.count_rounds_from(rounds);
    }

    /// The node runs its round number `rounds` (its count) for this holding: the rounds it
    /// skipped since the holding's last, all at rest, were idle rounds.
    pub(crate) fn catch_up(&mut self, rounds: u64) {
        self.demand.catch_up(rounds);
    }

    /// The node ran its rounds up to its count `rounds`, and this holding was not looked at
    /// since its last: count them (all at rest) before anything reads the demand.
    pub(crate) fn catch_up_to(&mut self, rounds: u64) {
        self.demand.catch_up_to(rounds);
    }

    /// Return the lease cell the request path uses.
    pub(crate) fn cell(&self) -> &Arc<LeaseCell> {
        &self.cell
    }

    /// Return the number of waiting requests.
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Return the tokens this node may still admit under its lease (cell and reserve).
    pub(crate) fn unspent(&self) -> u64 {
        if self.closed {
            0
        } else {
            self.cell.remaining() + self.reserve
        }
    }

    /// A window's lease spent to its last token, nothing waiting, no demand left: its count
    /// is no news to the authority, which counts what it granted as spent until told
    /// otherwise (should it run short, its recall asks for the count; a key still in
    /// demand here reports as before, so the authority's view of what it could recall
    /// stays fresh). A bucket's authority needs to hear of spending to refill.
    fn spent_out(&self) -> bool {
        self.spent_out_at(self.demand.level())
    }

    /// [`Holding::spent_out`] once the demand is `demand`.
    fn spent_out_at(&self, demand: u32) -> bool {
        self.algorithm.counts_per_window()
            && self.unspent() == 0
            && self.waiting.is_empty()
            && demand == 0
    }

    /// Rounds between two reports of a change of the count or the demand.
    fn report_every(&self) -> u64 {
        // A bucket's authority holds back what it leased until it hears it was spent:
        // report spending at the next round (a window's leases count as spent anyway).
        if self.algorithm.counts_per_window() {
            REPORT_ROUNDS
        } else {
            1
        }
    }

    /// The counts the authority must have before the holding is forgotten: what it gave
    /// back, and for a bucket what it spent (`used`); a window counts its leases as spent
    /// until told what came back.
    fn counts(&self, used: u64) -> (u64, u64) {
        if self.algorithm.counts_per_window() {
            (self.returned, 0)
        } else {
            (self.returned, used)
        }
    }

    /// Tell whether the authority has not confirmed the holding's latest counts: what it
    /// gave back or (a bucket) spent would otherwise stay counted as leased if the report
    /// went missing (a lost datagram, an owner that could not take it then). A window's
    /// lease that ended has nothing left to confirm.
    pub(crate) fn unconfirmed(&self) -> bool {
        self.granted > 0
            && !(self.algorithm.counts_per_window() && self.closed)
            && !self.asking.confirmed(self.counts(self.used()))
    }

    /// Return the lease's window and, for windows, its local expiry.
    pub(crate) fn lease(&self) -> (u64, Nanos) {
        (self.window, self.expiry)
    }

    /// Look at the count of admissions at `now`: a new value was reached by now.
    fn see_used(&mut self, now: Nanos) -> u64 {
        let used = self.used();
        if used != self.used_seen.0 {
            self.used_seen = (used, now);
        }
        used
    }

    /// Tokens admitted under the current lease, as reported: never fewer than a want
    /// reported.
    fn used(&self) -> u64 {
        if self.closed {
            return self.closed_used;
        }
        self.admitted().max(self.used_sent)
    }

    /// Tokens admitted under the current lease and not given back to it.
    fn admitted(&self) -> u64 {
        self.granted
            .saturating_sub(self.returned)
            .saturating_sub(self.cell.remaining())
            .saturating_sub(self.reserve)
    }

    fn allowed(&self, policy: &Policy, now: Nanos, remaining: u64) -> Decision {
        let reset = if self.algorithm.counts_per_window() {
            self.expiry.saturating_sub(now)
        } else {
            policy
                .capacity()
                .saturating_sub(remaining)
                .saturating_mul(policy.interval_ns())
        };
        Decision::allowed(policy.capacity(), remaining, reset)
    }

    fn denied(&self, policy: &Policy, now: Nanos, retry_after: Nanos) -> Decision {
        let reset = if self.algorithm.counts_per_window() {
            self.expiry.saturating_sub(now).max(retry_after)
        } else {
            self.window_ns
        };
        Decision::denied(policy.capacity(), 0, reset, retry_after)
    }

    /// End an expired window lease at `now`: the cell admits nothing more, and the final
    /// count is known.
    pub(crate) fn expire(&mut self, now: Nanos) {
        if self.algorithm.counts_per_window() && !self.closed && now >= self.expiry {
            let left = self.cell.close();
            self.closed_used = self
                .granted
                .saturating_sub(self.returned)
                .saturating_sub(left)
                .saturating_sub(self.reserve)
                .max(self.used_sent);
            self.reserve = 0;
            self.closed = true;
        }
    }

    /// Decide a request the lease cell could not: admit from the cell if it can now, deny
    /// if the authority recently said no, or let it wait (`id`, until `deadline`).
    pub(crate) fn slow(
        &mut self,
        policy: &Policy,
        now: Nanos,
        id: u64,
        cost: u64,
        deadline: Nanos,
    ) -> Slow {
        if cost == 0 || cost > policy.capacity() {
            return Slow::Decided(Decision::cannot_fit(policy.capacity()));
        }
        self.expire(now);
        if self.waiting.is_empty() {
            match self.cell.take_charged(now, cost) {
                Ok((remaining, charge)) => {
                    return Slow::Taken(self.allowed(policy, now, remaining), charge);
                }
                Err(Miss::Short { .. } | Miss::Expired) => {}
            }
            if let Some(retry) = self.denial.refuses(now, cost) {
                self.demand.offer(cost);
                return Slow::Decided(self.denied(policy, now, retry));
            }
        }
        self.demand.offer(cost);
        if !self.closed {
            self.reserve += self.cell.withdraw(u64::MAX);
        }
        self.waiting.push_back(Waiting {
            id,
            cost,
            deadline,
            asked: 0,
            prepaid: false,
        });
        Slow::Waits
    }

    /// Tell whether a want should go out now for the waiting requests (none in flight that
    /// asked for as much, or its answer is overdue).
    pub(crate) fn should_ask(&self, now: Nanos) -> bool {
        if self.waiting.is_empty() {
            return false;
        }
        self.asking.should_ask(now, self.need())
    }

    /// Build the item to send the authority at `now` (`need` = what the waiting requests
    /// need, `refill` = ask for a longer lease); if it asks for tokens and no answer comes
    /// within `resend_after`, it is sent again.
    pub(crate) fn want(
        &mut self,
        now: Nanos,
        round: u64,
        refill: bool,
        resend_after: Nanos,
    ) -> Want {
        let need = self.need();
        let used = self.see_used(now);
        if !self.closed {
            self.used_sent = used;
        }
        let seq = self.asking.send(
            now,
            (!self.waiting.is_empty()).then_some((need, resend_after)),
            used,
            round,
            self.demand.level(),
            self.counts(used),
        );
        for w in self.waiting.iter_mut().filter(|w| w.asked == 0) {
            w.asked = seq;
        }
        Want {
            key: self.key,
            window: self.window,
            tally: Tally {
                granted: self.granted,
                returned: self.returned,
                used,
            },
            closed: self.algorithm.counts_per_window() && self.closed,
            need,
            smallest: self.waiting.iter().map(|w| w.cost).min().unwrap_or(0),
            seq,
            refill,
            demand: self.demand.level(),
            spent_ago: now.saturating_sub(self.used_seen.1),
            previous_used: self.previous_used,
            holding: self.id,
        }
    }

    /// Apply the authority's answer at `now`; `expiry` is the local instant the window ends
    /// (converted from the authority's clock, never later than it). The waiting requests
    /// decided are added to `decided`.
    pub(crate) fn apply_grant(
        &mut self,
        policy: &Policy,
        now: Nanos,
        grant: &Grant,
        expiry: Nanos,
        decided: &mut Vec<Decided>,
    ) {
        // A grant for an earlier holding of the key (on its way when that holding was
        // forgotten) was counted for that holding: not this one's.
        if grant.holding != self.id {
            return;
        }
        // An answer about a window whose lease already ended here (it came late, or out of
        // order) says nothing about the requests waiting now: they ask again.
        let stale = self.algorithm.counts_per_window()
            && (grant.window < self.window
                || (grant.window == self.window && self.closed && self.granted > 0));
        if stale {
            // Not at once: the authority may not have ended the window yet (its clock may
            // be behind this node's estimate), and would answer the same.
            self.asking
                .ask_again_at(now + DENIED_RESEND_NS, self.need());
            return;
        }
        // The authority saw the counts of the wants this answers; its retry time counts
        // from its decision, a trip before now: from the oldest want not answered yet, if
        // this answers one of those.
        let decided_at = self.asking.answered(grant.answers, now);
        let granted_before = (self.window, self.granted);
        if self.algorithm.counts_per_window() {
            if grant.window > self.window || (self.closed && self.granted == 0 && self.window == 0)
            {
                // A lease for a newer window: the old one is over (closed as if expired).
                self.expire(now.max(self.expiry));
                // Its final count of the window before: its lease's, or 0 if it had none
                // though it asked before this window began (a grant of it that never came
                // counts there until told).
                let asked_before = decided_at < expiry.saturating_sub(self.window_ns);
                self.previous_used = match self.algorithm.weighs_previous() {
                    true if self.window > 0 && grant.window == self.window + 1 => {
                        Some(self.closed_used)
                    }
                    true if asked_before => Some(0),
                    _ => None,
                };
                // What the old lease admitted since the last round still counts toward the
                // demand; the new lease's count starts at 0.
                self.demand
                    .offer(self.closed_used.saturating_sub(self.used_at_tick));
                self.used_at_tick = 0;
                // The authority's record of the new window starts at 0 too.
                self.asking.new_window();
                self.window = grant.window;
                self.granted = grant.granted;
                self.returned = 0;
                self.used_sent = 0;
                self.expiry = expiry;
                self.closed = now >= expiry;
                // A lease that arrives after its window ended closes unspent at once: its
                // final count (0) is due like any other's.
                if self.closed && grant.granted > 0 && self.algorithm.weighs_previous() {
                    self.asking.report_next_round();
                }
                self.closed_used = 0;
                self.cell.renew(0, Some(expiry));
                self.reserve = if self.closed { 0 } else { grant.granted };
            } else if grant.window == self.window && grant.granted > self.granted {
                if !self.closed {
                    self.reserve += grant.granted - self.granted;
                }
                self.granted = grant.granted;
            }
        } else if grant.granted > self.granted {
            self.reserve += grant.granted - self.granted;
            self.granted = grant.granted;
        }
        if (self.window, self.granted) != granted_before {
            // Progress: what still waits may ask again at once. An answer that only says
            // "wait" or "no" keeps the resend timer (the authority keeps what it queued), or
            // holder and authority would echo each other at the speed of the network.
            self.asking.progress();
        } else if grant.retry_after > 0 {
            // A denial: what still waits asks again soon (the room may have changed), but
            // not at once.
            self.asking.denied(now + DENIED_RESEND_NS);
        }
        self.serve(policy, now, decided);
        if grant.retry_after > 0 && !self.waiting.is_empty() {
            // The denial is about the requests the answered want counted (later ones wait
            // for their own answer). Of those, each that fits in what is held back and what
            // the authority recalls for it keeps waiting, behind a denied one too.
            let answers = grant.answers;
            let counted = |w: &Waiting| w.asked != 0 && (answers.wrapping_sub(w.asked) as i32) >= 0;
            let mut coming = grant.more_coming + self.reserve;
            let mut denied = Vec::new();
            let mut kept = VecDeque::with_capacity(self.waiting.len());
            for w in self.waiting.drain(..) {
                if !counted(&w) {
                    kept.push_back(w);
                } else if w.cost <= coming {
                    coming -= w.cost;
                    kept.push_back(w);
                } else {
                    denied.push(w);
                }
            }
            self.waiting = kept;
            if let Some(min) = denied.iter().map(|w| w.cost).min() {
                let mut until = decided_at.saturating_add(grant.retry_after);
                // What the requests denied here meanwhile are told: as the ones denied now
                // (a lockout's end, not the window's).
                let retry_at = now.saturating_add(grant.retry_after);
                if self.algorithm.counts_per_window() {
                    // A denial is about the owner's window: the next one is asked afresh,
                    // however late the answer came (a repeated answer's decision time is
                    // not known here).
                    until = until.min(expiry);
                }
                self.denial.set(until, min, retry_at);
            }
            for w in denied.iter().filter(|w| !w.prepaid) {
                decided.push((w.id, self.denied(policy, now, grant.retry_after), None));
            }
            // What the denied held back may serve those behind them.
            self.serve(policy, now, decided);
        }
        self.settle();
        self.see_used(now);
    }

    /// Return the earliest instant the holder needs its node: a waiting request's deadline,
    /// or the time to ask again when the last want may have been lost (`resend_after`).
    pub(crate) fn next_deadline(&self) -> Option<Nanos> {
        // A sliding window's lease ends at its expiry: the final count goes to the authority
        // then. A fixed window's has nothing to send then (its cell stops at the expiry by
        // itself): it is closed when the holding is next looked at.
        let expiry = (self.algorithm.weighs_previous() && !self.closed).then_some(self.expiry);
        let deadline = self.waiting.iter().map(|w| w.deadline).min();
        let resend = self.asking.resend_at().filter(|_| !self.waiting.is_empty());
        [expiry, deadline, resend].into_iter().flatten().min()
    }

    /// End the lease if it expired at `now`; tell whether it ended now (its final count is
    /// then due at the authority).
    pub(crate) fn expire_now(&mut self, now: Nanos) -> bool {
        let was = self.closed;
        self.expire(now);
        self.final_due(was)
    }

    /// The lease closed since it was `was` closed, and the authority wants its final count
    /// (a sliding window's; a fixed window's authority starts each window afresh).
    fn final_due(&self, was: bool) -> bool {
        self.closed && !was && self.granted > 0 && self.algorithm.weighs_previous()
    }

    /// Give back what the lease holds beyond `keep` tokens; return how many.
    pub(crate) fn give_back(&mut self, keep: u64) -> u64 {
        if self.closed || !self.waiting.is_empty() {
            return 0;
        }
        let excess = self.cell.remaining().saturating_sub(keep);
        let admitted = self.admitted();
        let taken = self.cell.withdraw(excess);
        // Tokens given back to the lease after a want reported them used stay counted as
        // used: the authority counted them, and may not take them back twice.
        let counted = self.used_sent.saturating_sub(admitted).min(taken);
        self.returned += taken - counted;
        taken - counted
    }

    /// Give back what the lease holds beyond `keep` tokens (the authority recalls it).
    pub(crate) fn recall(&mut self, keep: u64) -> u64 {
        self.give_back(keep)
    }

    /// The round's bookkeeping at `now`: expire a window lease, update the demand, give an
    /// idle lease back. `owner_answers`: the key's owner is heard (a holder stops waiting
    /// for the confirmation of its counts only from an owner that answers without giving
    /// it, never from one it cannot reach). Return whether the authority should hear from
    /// this holder now and whether to ask for a longer lease.
    pub(crate) fn tick(&mut self, now: Nanos, round: u64, owner_answers: bool) -> (bool, bool) {
        let was_closed = self.closed;
        self.expire(now);
        let used = self.see_used(now);
        let spent = used.saturating_sub(self.used_at_tick);
        // More than one token asked for this round (spent, or asked for on the slow path).
        let waiting = self.waiting.iter().map(|w| w.cost).sum::<u64>();
        let several = self.demand.round(round, spent, waiting);
        // A closed lease's final count was counted when it was spent: it is no new demand.
        self.used_at_tick = used;
        let mut tell = self.final_due(was_closed);
        if self.demand.idle_rounds() >= IDLE_ROUNDS && self.give_back(0) > 0 {
            tell = true;
        }
        let unspent = self.unspent();
        let per_round = self.demand.per_round();
        // Only while requests come: a key quiet for `IDLE_ROUNDS` gives its lease back, and
        // refilling it then would only be given back again. And not for a lone request (one
        // token in a round, none in the `IDLE_ROUNDS` before: a sparse key's usual request,
        // in a holding made for it), which would give most of a lease fetched ahead back
        // unspent, at the cost of a want, a grant and a return.
        let refill = self.demand.level() > 0
            && (several || self.demand.busy())
            && self.demand.idle_rounds() < IDLE_ROUNDS
            && self.waiting.is_empty()
            && now >= self.denial.until()
            && unspent * 2 < per_round * SHORT_LEASE_ROUNDS;
        let (reported_used, reported_round, reported_demand) = self.asking.last_report();
        let changed = (used != reported_used && !self.spent_out())
            || self.demand.level().abs_diff(reported_demand) > reported_demand / 2;
        if changed && round >= reported_round + self.report_every() {
            tell = true;
        }
        if self.previous_used.is_some() && round >= reported_round + REPORT_ROUNDS {
            tell = true;
        }
        let waits = !self.waiting.is_empty();
        if self.asking.report_due() && (self.granted > 0 || waits)
            || self.asking.withdraw_due() && !waits
        {
            tell = true;
        }
        // Counts at rest that the authority has not confirmed: told again until it does (or
        // until the holder stops waiting).
        if self.demand.idle_rounds() > 0
            && self.unconfirmed()
            && round >= reported_round + REPORT_ROUNDS
            && self
                .asking
                .unconfirmed_at_rest(self.counts(self.used()), owner_answers)
        {
            tell = true;
        }
        (tell || refill, refill)
    }

    /// The authority has the final count of the previous window.
    pub(crate) fn previous_confirmed(&mut self) {
        self.previous_used = None;
    }

    /// Until when the holding's last lease may still count (0: a bucket's, or no lease
    /// yet): a window longer than the lease's own end, an estimate made early. A sliding
    /// window weighs the previous window; and an owner that takes over without a backup
    /// may run the same window up to a clock error past that end, learning its grants only
    /// from the holders' reports.
    fn counted_until(&self) -> Nanos {
        if !self.algorithm.counts_per_window() || self.expiry == 0 {
            return 0;
        }
        self.expiry.saturating_add(self.window_ns)
    }

    /// Tell whether the holding can be forgotten at `now`: nothing waits, nothing leased,
    /// and (windows) the authority no longer counts its last lease.
    pub(crate) fn is_idle(&self, now: Nanos) -> bool {
        now >= self.counted_until()
            && self.waiting.is_empty()
            && self.demand.level() == 0
            && self.demand.idle_rounds() >= IDLE_ROUNDS
            && now >= self.denial.until()
            && now >= self.keep_until
            && (self.closed || self.cell.remaining() == 0)
            && self.previous_used.is_none()
            && !self.asking.withdraw_due()
            && !self.unconfirmed()
    }

    /// The key's owner may have changed: report to it at the next round, so a new
    /// authority learns this node's lease before it grants anyone more.
    pub(crate) fn report_due(&mut self) {
        self.asking.report_to_new_owner();
    }
}

#[cfg(test)]
mod tests;
