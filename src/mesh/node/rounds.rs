//! A node's timer: the deadlines of its keys, and its rounds.
//!
//! Every round, a key's holding counts its demand, reports to the key's owner, refills or
//! gives its lease back, and is forgotten once idle; an authority is dropped once nothing
//! it holds matters any more; the changed authorities are backed up and every peer hears
//! from the node. A round looks only at the keys that need it: those touched since the last
//! round (a request, a frame, a timer), those with something left to do, and those whose
//! time comes; a holding *at rest* ([`Holding::at_rest`](crate::mesh::holder::Holding::at_rest): nothing leased, waiting, wanted or
//! to report, and no demand, or a lone request's demand that fades out before a report of
//! it is due) changes in a round only by one more idle round and the fading of its demand,
//! so its rounds are skipped until [`Holding::wake_round`](crate::mesh::holder::Holding::wake_round) and counted when it is next looked at
//! ([`Holding::catch_up`](crate::mesh::holder::Holding::catch_up)), or before it next reports ([`Holding::catch_up_to`](crate::mesh::holder::Holding::catch_up_to)). A
//! round later than the next (a node that ran late) looks at the holdings whose demand
//! still fades, as their own rounds would have reported it. Looking at a key in any round
//! is what every round once did, so skipping changes no decision.

use super::backups::Backup;
use super::{Event, Node};
use crate::clock::Nanos;
use crate::mesh::NodeId;
use crate::mesh::authority::Authority;
use crate::mesh::message::{Item, KeyRef};

/// Rounds between two looks at every authority for those idle (a look visits them all; an
/// idle authority kept a little longer changes nothing).
const IDLE_SWEEP_ROUNDS: u64 = 8;

impl Node {
    /// Run the node's timer at `now`: a round's work when a round began, and the deadlines.
    pub fn handle_timeout(&mut self, now: Nanos) {
        self.handle_timeout_within(now, usize::MAX);
    }

    /// Like [`Node::handle_timeout`], but look at no more than `max_keys` of a round's keys
    /// in this call: return `true` if some are left, for the next calls (at once, with the
    /// node's frames and requests that came meanwhile taken in between: a large round then
    /// holds none of them back for long). A round's start (its membership work and
    /// heartbeats) is never split; a round left unfinished when the next one is due is
    /// finished first.
    pub fn handle_timeout_within(&mut self, now: Nanos, max_keys: usize) -> bool {
        let max_keys = max_keys.max(1);
        if self.schedule.round_unfinished() {
            if now < self.schedule.next_tick() {
                // Deadlines due meanwhile, then the round's next keys.
                self.deadlines(now);
                return self.round_slice(now, max_keys);
            }
            self.round_slice(now, usize::MAX);
        }
        let g = self.config.gossip_interval_ns;
        if now < self.schedule.next_tick() {
            self.deadlines(now);
            return false;
        }
        // A round later than an interval: this node itself did not run meanwhile (a starved
        // thread, a long pause); its peers' silence over that time is its own.
        let late = now - self.schedule.next_tick();
        if late > g {
            self.membership.paused(late, now);
        }
        self.membership.round_late(late, g);
        self.stats.rounds += 1;
        let previous_round = self.schedule.begin_round(now, g, self.stats.rounds);
        self.outbox.new_round(self.config.round_budget_bytes());
        let changes = self.membership.check(now);
        self.apply_changes(now, &changes);
        self.join_tick(now);
        if self.membership.is_leaving() {
            // Leases whose requests waited at the leave, served or denied since.
            self.give_back_all(now);
        }
        if self.transfers.holds_any() {
            self.retry_held(now);
        }
        self.transfers.expire_departed(now);
        // The keys due now, and those the round must look at.
        self.schedule
            .plan_round(now, previous_round, |key| self.authorities.has_waiters(key));
        self.round_slice(now, max_keys)
    }

    /// The keys' deadlines due at `now`, outside a round's start.
    fn deadlines(&mut self, now: Nanos) {
        let due = self
            .schedule
            .deadline_keys(now, |key| self.authorities.has_waiters(key));
        for &key in &due {
            self.schedule.fired(key, now);
            self.key_timeout(key, now, None);
            self.schedule.touch(key);
        }
        self.schedule.keep_deadline_keys(due);
        self.flush(now);
    }

    /// Look at up to `max_keys` more of the current round's keys; finish the round once
    /// none is left. Return whether some are.
    fn round_slice(&mut self, now: Nanos, max_keys: usize) -> bool {
        let Some((due, from, to)) = self.schedule.slice(max_keys) else {
            return false;
        };
        let round = self.schedule.round();
        // Keys touched before this slice (by a request taken in between) stay for the next
        // round, as between rounds.
        let start = self.schedule.touched_len();
        for &key in &due[from..to] {
            let before = self.schedule.touched_len();
            self.schedule.fired(key, now);
            self.key_timeout(key, now, Some(round));
            // While its entries are at hand: a key's round touches no other key.
            debug_assert!(self.schedule.touched_only(before, key));
            self.after_round(key, round);
        }
        // What the next rounds must look at.
        let mut touched = self.schedule.take_touched_list();
        for &key in &touched[start..] {
            if due.binary_search(&key).is_err() {
                self.arm(key);
                self.schedule.candidate(key);
            }
        }
        touched.truncate(start);
        self.schedule.put_touched(touched);
        if !self.schedule.end_slice(due, to, now, self.stats.rounds) {
            self.flush(now);
            return true;
        }
        if round.is_multiple_of(IDLE_SWEEP_ROUNDS) {
            self.drop_idle_authorities(now);
        }
        self.round_work(now);
        self.flush(now);
        false
    }

    /// After `key`'s round: queue its next instant, and say when a round looks at it next
    /// (the next round, or its wake round if its holding is at rest).
    fn after_round(&mut self, key: KeyRef, round: u64) {
        self.arm(key);
        let holding = self.holdings.get(&key);
        let busy_authority = self.authorities.get(&key).is_some_and(|a| a.has_waiters());
        match holding {
            Some(h) if h.at_rest(round) && !busy_authority => {
                let g = self.config.gossip_interval_ns;
                self.schedule
                    .rest(key, h.wake_round(round, g), h.fading_rounds());
            }
            Some(_) => self.schedule.candidate(key),
            None if busy_authority => self.schedule.candidate(key),
            None => {}
        }
    }

    /// An authority no key's round looked at is dropped once it holds nothing worth keeping
    /// (the one thing its round would do).
    fn drop_idle_authorities(&mut self, now: Nanos) {
        let limits = &self.limits;
        let idle = self.authorities.drop_idle(|key, a| {
            limits
                .of_key(key)
                .is_some_and(|policy| a.is_idle(&policy, now))
        });
        for key in idle {
            self.forget_if_gone(key);
        }
    }

    /// A key's timer at `now` (and its round's work when `round` is given).
    fn key_timeout(&mut self, key: KeyRef, now: Nanos, round: Option<u64>) {
        let g = self.config.gossip_interval_ns;
        let rounds = self.stats.rounds;
        let policy = self.enforced(key);
        let owner_answers = self.holdings.get(&key).is_some_and(|h| {
            let owner = self.membership.owner_and_successor_in(key.key, h.rank()).0;
            self.membership.is_responsive(owner, now)
        });
        if let Some(h) = self.holdings.get_mut(&key) {
            h.timeouts(&policy, now, g, &mut self.decided);
            self.stats.timeouts += self.decided.len() as u64;
            for (id, decision, charge) in self.decided.drain(..) {
                self.events.push_back(Event::Decided {
                    id,
                    decision,
                    charge,
                });
            }
            let ended = h.expire_now(now);
            let (tell, refill) = match round {
                Some(round) => {
                    h.catch_up(rounds);
                    h.tick(now, round, owner_answers)
                }
                None => (false, false),
            };
            if h.should_ask(now) || tell || ended {
                self.ask(key, now, refill);
            } else if round.is_some() && h.is_idle(now) {
                self.holdings.remove(&key, &self.cells);
                self.forget_if_gone(key);
            }
        }
        if self.authorities.contains_key(&key) {
            if self.authority_ready(key, now) {
                self.serve_waiting(key, now);
            } else if let Some(a) = self.authorities.get_mut(&key) {
                // Deadlines pass even while the authority may not grant: forget those, and
                // look at the others again at the next round.
                a.defer_wakes(self.schedule.next_tick());
                a.drop_overdue(now);
            }
            if round.is_some()
                && let Some(a) = self.authorities.get_mut(&key)
                && a.is_idle(&policy, now)
            {
                self.authorities.remove(&key);
                self.forget_if_gone(key);
            }
        }
    }

    /// Drop the backups that would be idle authorities if this node took them over now: the
    /// owner drops such an authority without telling (it holds nothing worth keeping), and
    /// taking over without a backup makes an equivalent one. Without this, every key a
    /// flood brought would keep its backup here for as long as its owner lives.
    fn drop_idle_backups(&mut self, now: Nanos) {
        let idle = self
            .backups
            .keys_where(|key, b| self.is_idle_backup(key, b, now));
        for key in idle {
            self.backups.remove(&key);
        }
    }

    /// Tell whether the backup kept of `key` would be an idle authority if this node took
    /// it over at `now`.
    pub(super) fn backup_is_idle(&self, key: &KeyRef, now: Nanos) -> bool {
        self.backups
            .get(key)
            .is_some_and(|b| self.is_idle_backup(key, b, now))
    }

    pub(super) fn is_idle_backup(&self, key: &KeyRef, b: &Backup, now: Nanos) -> bool {
        self.limits.of_key(key).is_some_and(|policy| {
            let offset = self.offset_or_guess(b.from, now);
            Authority::state_is_idle(&b.state, &policy, offset, now)
        })
    }

    /// Give back the memory of maps a burst of keys grew and that are now mostly empty (a
    /// map keeps its capacity when entries leave).
    fn shrink(&mut self) {
        self.holdings.shrink();
        self.authorities.shrink();
        self.backups.shrink();
        self.schedule.shrink();
        self.cells.shrink();
    }

    fn round_work(&mut self, now: Nanos) {
        // Backups of the authorities that changed, to their successors.
        // In key order; a key listed twice (its authority dropped and made again) once.
        let me = self.config.id;
        let (membership, stats, outbox) = (&self.membership, &mut self.stats, &mut self.outbox);
        self.authorities.backups(|key, a| {
            // Only an owner backs its authorities up (one it keeps for a member it has not
            // heard yet is not its own).
            if let (owner, Some(successor)) = membership.owner_and_successor_in(key.key, a.rank())
                && owner == me
            {
                stats.backups_sent += 1;
                outbox.push(successor, Item::Backup(a.state()));
            }
        });
        // Backups of a live owner that stopped sending them, or of keys nobody would give
        // this node any more, are dropped.
        let round = self.schedule.round();
        if round.is_multiple_of(64) {
            self.shrink();
            self.sweep_restored(now);
        }
        if round.is_multiple_of(16) {
            self.drop_idle_backups(now);
            let me = self.config.id;
            let membership = &self.membership;
            self.backups.keep_own(me, membership);
            // This node owns such a key again only once the peer holding it is gone, which
            // ends the wait anyway.
            self.transfers
                .keep_returning(|k| membership.owner_and_successor(k.key).0 == me);
        }
        if self.transfers.declared_dead_at().is_some() && self.heard_back() {
            self.transfers.heard_back();
        }
        self.spread_members(round);
        self.limits_round();
        self.lockout_rounds(now, round);
        // Heartbeats: every live peer hears from this node every round; dead ones every 8.
        let peers: Vec<(NodeId, bool)> = self
            .membership
            .peers()
            .iter()
            .map(|(&id, p)| (id, p.alive))
            .collect();
        for (p, alive) in peers {
            if alive || round.is_multiple_of(8) {
                self.outbox.heartbeat(p);
            }
        }
    }
}
