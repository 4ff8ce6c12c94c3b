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

use std::cmp::Reverse;

use super::{Event, Node};
use crate::clock::Nanos;
use crate::mesh::NodeId;
use crate::mesh::authority::Authority;
use crate::mesh::message::{Item, KeyRef};

/// Rounds between two looks at every authority for those idle (a look visits them all; an
/// idle authority kept a little longer changes nothing).
const IDLE_SWEEP_ROUNDS: u64 = 8;

/// The most keys' room the list of due keys keeps from one timeout to the next.
const MAX_KEPT_DUE: usize = 4096;

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
        if self.round_left.is_some() {
            if now < self.next_tick {
                // Deadlines due meanwhile, then the round's next keys.
                self.deadlines(now);
                return self.round_slice(now, max_keys);
            }
            self.round_slice(now, usize::MAX);
        }
        let g = self.config.gossip_interval_ns;
        let new_round = now >= self.next_tick;
        let previous_round = self.round;
        if !new_round {
            self.deadlines(now);
            return false;
        }
        // A round later than an interval: this node itself did not run meanwhile (a starved
        // thread, a long pause); its peers' silence over that time is its own.
        let late = now - self.next_tick;
        if late > g {
            self.membership.paused(late, now);
        }
        self.membership.round_late(late, g);
        self.round = now / g;
        self.next_tick = (self.round + 1) * g;
        self.stats.rounds += 1;
        self.rounds_done = self.stats.rounds - 1;
        self.outbox.new_round(self.config.round_budget_bytes());
        let changes = self.membership.check(now);
        self.apply_changes(now, &changes);
        self.join_tick(now);
        if self.membership.is_leaving() {
            // Leases whose requests waited at the leave, served or denied since.
            self.give_back_all(now);
        }
        if !self.held.is_empty() {
            self.retry_held(now);
        }
        if !self.departed.is_empty() {
            self.departed.retain(|&(_, due)| due > now);
        }
        let round = self.round;
        // The keys due now, and those the round must look at.
        let mut due = std::mem::take(&mut self.due);
        self.pop_due(now, &mut due);
        due.append(&mut self.candidates);
        // Keys the membership change just touched are looked at in this round.
        due.append(&mut self.touched);
        while let Some(&Reverse((at, key))) = self.wakes.peek() {
            if at > round {
                break;
            }
            self.wakes.pop();
            due.push(key);
        }
        if round > previous_round + 1 {
            due.extend(self.fading.drain(..).map(|(_, key)| key));
        } else {
            self.fading.retain(|&(until, _)| until > round);
        }
        due.sort_unstable();
        due.dedup();
        self.due = due;
        self.round_left = Some((0, now));
        self.round_slice(now, max_keys)
    }

    /// Take the timers' entries due at `now` that are live into `due`.
    fn pop_due(&mut self, now: Nanos, due: &mut Vec<KeyRef>) {
        while let Some(&Reverse((at, key))) = self.timers.peek() {
            if at > now {
                break;
            }
            self.timers.pop();
            if self.is_queued(at, key) {
                due.push(key);
            }
        }
    }

    /// The keys' deadlines due at `now`, outside a round's start.
    fn deadlines(&mut self, now: Nanos) {
        let mut due = std::mem::take(&mut self.deadline_keys);
        self.pop_due(now, &mut due);
        due.sort_unstable();
        due.dedup();
        for &key in &due {
            self.fired(key, now);
            self.key_timeout(key, now, None);
            self.touched.push(key);
        }
        due.clear();
        if due.capacity() <= MAX_KEPT_DUE {
            self.deadline_keys = due;
        }
        self.flush(now);
    }

    /// Look at up to `max_keys` more of the current round's keys (`self.due`, from
    /// `self.round_left`); finish the round once none is left. Return whether some are.
    fn round_slice(&mut self, now: Nanos, max_keys: usize) -> bool {
        let Some((from, _)) = self.round_left else {
            return false;
        };
        let round = self.round;
        let due = std::mem::take(&mut self.due);
        let to = due.len().min(from.saturating_add(max_keys));
        // Keys touched before this slice (by a request taken in between) stay for the next
        // round, as between rounds.
        let start = self.touched.len();
        for &key in &due[from..to] {
            let before = self.touched.len();
            self.fired(key, now);
            self.key_timeout(key, now, Some(round));
            // While its entries are at hand: a key's round touches no other key.
            debug_assert!(self.touched[before..].iter().all(|&k| k == key));
            self.schedule(key, round);
        }
        // What the next rounds must look at.
        let mut touched = std::mem::take(&mut self.touched);
        for &key in &touched[start..] {
            if due.binary_search(&key).is_err() {
                self.arm(key);
                self.candidates.push(key);
            }
        }
        touched.truncate(start);
        self.touched = touched;
        self.due = due;
        if to < self.due.len() {
            self.round_left = Some((to, now));
            self.flush(now);
            return true;
        }
        self.round_left = None;
        self.rounds_done = self.stats.rounds;
        if round.is_multiple_of(IDLE_SWEEP_ROUNDS) {
            self.drop_idle_authorities(now);
        }
        let due = std::mem::take(&mut self.due);
        self.keep_due(due);
        self.round_work(now);
        self.flush(now);
        false
    }

    /// Keep the emptied list of due keys for the next timeout, unless a burst grew it.
    fn keep_due(&mut self, mut due: Vec<KeyRef>) {
        due.clear();
        if due.capacity() <= MAX_KEPT_DUE {
            self.due = due;
        }
    }

    /// After `key`'s round: queue its next instant, and say when a round looks at it next
    /// (the next round, or its wake round if its holding is at rest).
    fn schedule(&mut self, key: KeyRef, round: u64) {
        self.arm(key);
        let holding = self.holdings.get(&key);
        let busy_authority = self.authorities.get(&key).is_some_and(|a| a.has_waiters());
        match holding {
            Some(h) if h.at_rest(round) && !busy_authority => {
                let fading = h.fading_rounds();
                if fading > 0 {
                    self.fading.push((round + fading, key));
                }
                let g = self.config.gossip_interval_ns;
                self.wakes.push(Reverse((h.wake_round(round, g), key)));
            }
            Some(_) => self.candidates.push(key),
            None if busy_authority => self.candidates.push(key),
            None => {}
        }
    }

    /// An authority no key's round looked at is dropped once it holds nothing worth keeping
    /// (the one thing its round would do).
    fn drop_idle_authorities(&mut self, now: Nanos) {
        let idle: Vec<KeyRef> = self
            .authorities
            .iter_mut()
            .filter_map(|(&key, a)| a.is_idle(now).then_some(key))
            .collect();
        for key in idle {
            self.authorities.remove(&key);
        }
    }

    /// A key's timer at `now` (and its round's work when `round` is given).
    fn key_timeout(&mut self, key: KeyRef, now: Nanos, round: Option<u64>) {
        let g = self.config.gossip_interval_ns;
        let rounds = self.stats.rounds;
        let owner_answers = self.holdings.get(&key).is_some_and(|h| {
            let owner = self.membership.owner_and_successor_in(key.key, h.rank()).0;
            self.membership.is_responsive(owner, now)
        });
        if let Some(h) = self.holdings.get_mut(&key) {
            h.timeouts(now, g, &mut self.decided);
            self.stats.timeouts += self.decided.len() as u64;
            for (id, decision) in self.decided.drain(..) {
                self.events.push_back(Event::Decided { id, decision });
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
                let queued = h.queued_mut().take();
                self.holdings.remove(&key);
                self.cells.remove(&key);
                // The key's queued instant moves to its authority with the entry it names.
                if let Some(a) = self.authorities.get_mut(&key) {
                    *a.queued_mut() = queued;
                }
            }
        }
        if self.authorities.contains_key(&key) {
            if self.authority_ready(key, now) {
                self.serve_waiting(key, now);
            } else if let Some(a) = self.authorities.get_mut(&key) {
                // Deadlines pass even while the authority may not grant: deny those, and look
                // at the others again at the next round.
                a.defer_wakes(self.next_tick);
                for (node, answer) in a.deny_overdue(now) {
                    self.answer(now, key, node, answer);
                }
            }
            if round.is_some()
                && let Some(a) = self.authorities.get_mut(&key)
                && a.is_idle(now)
            {
                self.authorities.remove(&key);
            }
        }
    }

    /// Drop the backups that would be idle authorities if this node took them over now: the
    /// owner drops such an authority without telling (it holds nothing worth keeping), and
    /// taking over without a backup makes an equivalent one. Without this, every key a
    /// flood brought would keep its backup here for as long as its owner lives.
    fn drop_idle_backups(&mut self, now: Nanos) {
        let mut idle = Vec::new();
        for (key, b) in &self.backups {
            let Some((policy, kind)) = self.policy(key.policy) else {
                continue;
            };
            let offset = self.offset_or_guess(b.from, now);
            if Authority::state_is_idle(&b.state, &policy, kind, offset, now) {
                idle.push(*key);
            }
        }
        for key in idle {
            self.backups.remove(&key);
        }
    }

    /// Give back the memory of maps a burst of keys grew and that are now mostly empty (a
    /// map keeps its capacity when entries leave).
    fn shrink(&mut self) {
        fn shrink_map<K: Eq + std::hash::Hash, V, S: std::hash::BuildHasher>(
            map: &mut std::collections::HashMap<K, V, S>,
        ) {
            if map.capacity() > 1024 && map.len() < map.capacity() / 4 {
                map.shrink_to(map.len() * 2);
            }
        }
        shrink_map(&mut self.holdings);
        shrink_map(&mut self.authorities);
        shrink_map(&mut self.backups);
        if self.timers.capacity() > 1024 && self.timers.len() < self.timers.capacity() / 4 {
            self.timers.shrink_to(self.timers.len() * 2);
        }
        if self.wakes.capacity() > 1024 && self.wakes.len() < self.wakes.capacity() / 4 {
            self.wakes.shrink_to(self.wakes.len() * 2);
        }
        if self.fading.capacity() > 1024 && self.fading.len() < self.fading.capacity() / 4 {
            self.fading.shrink_to(self.fading.len() * 2);
        }
        if self.dirty.capacity() > 1024 {
            self.dirty.shrink_to(1024);
        }
        self.cells.shrink();
    }

    fn round_work(&mut self, now: Nanos) {
        // Backups of the authorities that changed, to their successors.
        // In key order; a key listed twice (its authority dropped and made again) once.
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.sort_unstable();
        dirty.dedup();
        let me = self.config.id;
        for &key in &dirty {
            // Only an owner backs its authorities up (one it keeps for a member it has not
            // heard yet is not its own).
            if let Some(a) = self.authorities.get_mut(&key)
                && a.take_dirty()
                && let (owner, Some(successor)) =
                    self.membership.owner_and_successor_in(key.key, a.rank())
                && owner == me
            {
                self.stats.backups_sent += 1;
                self.outbox.push(successor, Item::Backup(a.state()));
            }
        }
        dirty.clear();
        self.dirty = dirty;
        // Backups of a live owner that stopped sending them, or of keys nobody would give
        // this node any more, are dropped.
        let round = self.round;
        if round.is_multiple_of(64) {
            self.shrink();
        }
        if round.is_multiple_of(16) {
            self.drop_idle_backups(now);
            let me = self.config.id;
            let membership = &self.membership;
            self.backups.retain(|k, b| {
                let (owner, successor) = membership.owner_and_successor_in(k.key, &b.rank);
                (membership.is_alive(b.from) && successor == Some(me)) || owner == me
            });
            // This node owns such a key again only once the peer holding it is gone, which
            // ends the wait anyway.
            self.returning
                .retain(|k, _| membership.owner_and_successor(k.key).0 == me);
        }
        if self.declared_dead_at.is_some() && self.heard_back() {
            self.declared_dead_at = None;
        }
        self.spread_members(round);
        self.limits_round();
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
