//! A node as the owner of keys: whether it may grant (its authority lease), and how it
//! answers holders' wants with grants, waits, denials and recalls.

use super::backups::Backup;
use super::{Event, Node};
use crate::clock::Nanos;
use crate::mesh::NodeId;
use crate::mesh::authority::{Answer, Authority};
use crate::mesh::membership::RankMemo;
use crate::mesh::message::{Grant, Item, KeyRef, Want};
use crate::mesh::timing::Offset;

/// The least time between two recalls of one key's leases.
pub(super) const RECALL_GAP_NS: Nanos = 1_000_000;

impl Node {
    /// Make sure this node keeps the key's authority if it should and may; tell whether it
    /// can grant from it now.
    pub(super) fn authority_ready(&mut self, key: KeyRef, now: Nanos) -> bool {
        let kept = self.authorities.get(&key);
        let (owner, successor) = match kept {
            Some(a) => self.membership.owner_and_successor_in(key.key, a.rank()),
            None => self.membership.owner_and_successor(key.key),
        };
        if owner != self.config.id || self.membership.is_leaving() {
            if kept.is_some() {
                let to = self.rightful_owner(key.key, now);
                if to != self.config.id {
                    self.hand_off(now, key, to);
                }
            }
            return false;
        }
        if !self.lease_holds(key.key, successor, kept.map(Authority::rank), now) {
            return false;
        }
        if kept.is_some() {
            return true;
        }
        if !self.running || self.transfers.is_returning(key) {
            // Recovering, or the key's authority is on its way back: a fresh one would count
            // the window from zero again.
            return false;
        }
        if self.awaits_handoff(key, now) {
            // Its owner left and hands it over: the handoff, not a backup or a fresh
            // authority, has what it granted.
            return false;
        }
        let Some(policy) = self.limits.of_key(&key) else {
            return false;
        };
        // A backup whose authority would be idle by now holds nothing a fresh one does not,
        // and its records are of a run of the authority its owner may have dropped since:
        // merged later with the state of the one that followed (a handoff on its way),
        // they would count again what that one granted.
        let idle = self.backup_is_idle(&key, now);
        let backup = self.backups.remove(&key).filter(|_| !idle);
        let authority = match backup {
            Some(Backup {
                from, state, reset, ..
            }) => {
                self.stats.promotions += 1;
                let offset = self.offset_or_guess(from, now);
                let mut a = Authority::from_state(&state, &policy, offset, now);
                if let Some((window, forgiven)) = reset {
                    a.forgive(window, forgiven);
                }
                let membership = &self.membership;
                a.retire_departed(&policy, |node, run| membership.is_live_run(node, run));
                a
            }
            None => match self.earlier_owner(key.key) {
                // A restart of every node: what this node saved, where nobody had the key.
                None if self.snapshots_hold(&key) => self
                    .take_restored(&key, &policy, now)
                    .unwrap_or_else(|| Authority::fresh(key, &policy, now)),
                Some(by) => {
                    let offset = self.offset_or_guess(by, now);
                    Authority::fresh_after(key, &policy, offset, now)
                }
                None => Authority::fresh(key, &policy, now),
            },
        };
        self.authorities
            .insert(key, authority.with_hold(self.config.hold_ns()));
        self.mark_dirty(key);
        self.note_frame(key, None);
        self.count_deferred(now, key);
        true
    }

    /// Count the reports kept for `key` while its authority was not here (it is now).
    pub(super) fn count_deferred(&mut self, now: Nanos, key: KeyRef) {
        for r in self.deferred.take(key) {
            let alive = self.membership.is_alive(r.from);
            self.note_report(now, r.from, r.incarnation, &r.want, alive);
        }
    }

    /// Tell whether this node may grant from `key` as its owner at `now`: its successor
    /// confirmed hearing it within the authority lease and, by the view it last told, ranks
    /// it first for the key and itself second (two nodes that each count the other dead
    /// cannot both lean on one successor, not even across a change of the successor's view),
    /// and it received frames from a majority of the members within the lease (members not
    /// heard since this node started do not count: a restarted node does not lean on them),
    /// and it is not waiting to be heard back after a peer declared it dead.
    ///
    /// `memo`, if given, is the key's kept ranking.
    pub(super) fn lease_holds(
        &self,
        key: u64,
        successor: Option<NodeId>,
        memo: Option<&RankMemo>,
        now: Nanos,
    ) -> bool {
        if !self.heard_back() {
            return false;
        }
        let lease = self.config.authority_lease_rounds() * self.config.gossip_interval_ns;
        if let Some(s) = successor {
            let confirmed = self.membership.peer(s).map_or(0, |p| p.confirmed);
            if confirmed.saturating_add(lease) <= now || !self.membership.agrees_i_own(s, key, memo)
            {
                return false;
            }
        }
        self.membership.majority_heard_at(now, lease)
    }

    /// Tell whether every member this node counts alive echoed one of its frames sent since it
    /// last learned that a peer declared it dead. The members that declared it dead count
    /// fewer members, so a majority of theirs and a majority of this node's may both hold
    /// (six nodes, one crashed, cut 3 | 2: the three count three members once they declared
    /// the two dead, while the two still count five, and at the heal one of the three heard
    /// by the two makes them three of five). A member counts this node alive again from its
    /// first frame on, and hands over the keys this node owns at once, so once each has
    /// echoed a later frame, none of them still grants this node's keys.
    pub(super) fn heard_back(&self) -> bool {
        let Some(since) = self.transfers.declared_dead_at() else {
            return true;
        };
        self.membership
            .peers()
            .values()
            .filter(|p| p.alive && !p.left && !p.pending)
            .all(|p| p.confirmed >= since)
    }

    /// The member declared dead most recently among those that rank above this node for
    /// `key`: the owner the key may have had before this node, which may have granted until
    /// its authority lease ran out.
    fn earlier_owner(&self, key: u64) -> Option<NodeId> {
        self.membership
            .dead_above(key)
            .max_by_key(|&(id, declared)| (declared, id))
            .map(|(id, _)| id)
    }

    /// A peer's clock offset, or a wide guess (a dead node's clock cannot be asked): the
    /// whole failure detection time either way.
    pub(super) fn offset_or_guess(&self, from: NodeId, now: Nanos) -> Offset {
        self.membership.offset(from, now).unwrap_or(Offset {
            offset: 0,
            error: self.config.dead_after_rounds * self.config.gossip_interval_ns,
            round_trip: 0,
        })
    }

    pub(super) fn note_frame(&mut self, key: KeyRef, before: Option<u64>) {
        if let Some(a) = self.authorities.get(&key)
            && self.limits.enforced()[key.policy as usize]
                .algorithm()
                .counts_per_window()
        {
            let (window, start, _) = a.frame();
            if before != Some(window) {
                self.events.push_back(Event::Window {
                    policy: key.policy,
                    key: key.key,
                    window,
                    start,
                });
            }
        }
    }

    /// A holder's want reached this node (the key's owner, as the holder sees it).
    pub(super) fn on_want(&mut self, now: Nanos, from: NodeId, incarnation: u64, want: Want) {
        let key = want.key;
        self.schedule.touch(key);
        // A holder that left (or is counted dead) sends its last report: it corrects its
        // record, and nothing is granted to it.
        let alive = self.membership.is_alive(from);
        if !alive && !self.authorities.contains_key(&key) {
            return;
        }
        if alive && !self.authority_ready(key, now) {
            let owner = self.membership.owner_and_successor(key.key).0;
            if (owner != self.config.id || self.membership.is_leaving()) && from != self.config.id {
                self.outbox.push(from, Item::NotOwner(key));
            }
            // An authority kept here that may not grant (its lease does not hold, or it
            // waits to be handed over) still counts what the holder gave back and spent:
            // its state is merged or handed over with them.
            self.note_report(now, from, incarnation, &want, true);
            return;
        }
        if !alive {
            self.note_report(now, from, incarnation, &want, false);
            // What it gave back may serve whoever waits.
            self.serve_waiting(key, now);
            return;
        }
        let max_wait = self.config.max_wait_ns;
        let policy = self.enforced(key);
        let locked = self.locked(&key, now).is_some();
        let a = self.authorities.get_mut(&key).expect("made ready above");
        if a.is_stale(from, incarnation, &want) {
            // From a holding the node has since forgotten (delayed or duplicated): the
            // current holding speaks for itself.
            return;
        }
        let before = Some(a.frame().0);
        // Grants already on their way serve part of the need (a holder asks again as more
        // requests queue, before the first answer arrives); the answer then only repeats
        // what was granted, which also makes up for a lost grant.
        let in_flight = a.in_flight(&policy, now, from, &want);
        let news = a.report(&policy, now, from, incarnation, &want, true);
        let need = want.need.saturating_sub(in_flight);
        let answer = if locked {
            // Locked out: nothing is granted; a holder that asks is denied until the end.
            (want.need > 0 || want.refill || news).then(|| a.current(&policy, now, from))
        } else if need > 0 {
            Some(a.request(&policy, now, from, incarnation, need, now + max_wait))
        } else if want.need > 0 {
            Some(a.current(&policy, now, from))
        } else if want.refill {
            Some(a.request(&policy, now, from, incarnation, 0, now))
        } else if want.previous_used.is_some() {
            Some(a.current(&policy, now, from))
        } else if news {
            // A report: answered when the holder lacks something (a grant lost on the way,
            // another window's tokens or its denial), or to confirm the counts of a holder
            // at rest (it keeps the key until then); otherwise the answer would repeat what
            // it holds, or (a final count answered by the next window's empty lease) give
            // it nothing.
            let at_rest = a.at_rest(from);
            match a.current(&policy, now, from) {
                Answer::Grant {
                    window, granted, ..
                } if window == want.window && granted == want.tally.granted && !at_rest => None,
                Answer::Grant {
                    window,
                    granted: 0,
                    retry_after: 0,
                    more_coming: 0,
                    ..
                } if window > want.window => None,
                current => Some(current),
            }
        } else {
            None
        };
        let recall = if locked {
            a.recall_all(now, RECALL_GAP_NS)
        } else {
            a.recall_targets(&policy, now, RECALL_GAP_NS)
        };
        self.authorities.changed(key);
        self.note_frame(key, before);
        if let Some(answer) = answer {
            self.answer(now, key, from, answer);
        }
        // A report may free tokens for whoever waits, or show that none can be had.
        self.serve_waiting(key, now);
        self.recall(now, key, recall);
    }

    /// Count a holder's report at the key's authority kept here, granting nothing: the last
    /// report of a holder that departed (`alive` false), or one that reached an authority
    /// that may not grant now. A holder with nothing unspent left (or a departed one) is
    /// told its counts arrived, so that it stops telling them.
    fn note_report(
        &mut self,
        now: Nanos,
        from: NodeId,
        incarnation: u64,
        want: &Want,
        alive: bool,
    ) {
        let key = want.key;
        let policy = self.enforced(key);
        let Some(a) = self.authorities.get_mut(&key) else {
            // The owner, waiting for its authority of the key: counted once it is here.
            if self.membership.owner_and_successor(key.key).0 == self.config.id
                && !self.membership.is_leaving()
            {
                self.deferred.defer(now, from, incarnation, want);
            }
            return;
        };
        if a.is_stale(from, incarnation, want) {
            return;
        }
        let before = Some(a.frame().0);
        let news = a.report(&policy, now, from, incarnation, want, alive);
        let ack = !alive || (news && want.need == 0 && a.at_rest(from));
        let (window, _, ends_at) = a.frame();
        self.authorities.changed(key);
        self.note_frame(key, before);
        if !ack {
            return;
        }
        let grant = Grant {
            key,
            window: want.window,
            granted: want.tally.granted,
            ends_at: if want.window == window && want.window > 0 {
                ends_at
            } else {
                0
            },
            retry_after: 0,
            more_coming: 0,
            answers: want.seq,
            holding: want.holding,
        };
        if from == self.config.id {
            self.on_grant(now, from, grant);
        } else {
            self.outbox.push(from, Item::Grant(grant));
        }
    }

    pub(super) fn recall(&mut self, now: Nanos, key: KeyRef, targets: Vec<(NodeId, u64)>) {
        for (n, keep) in targets {
            if n == self.config.id {
                if let Some(h) = self.holdings.get_mut(&key) {
                    h.recall(keep);
                    self.ask(key, now, false);
                }
            } else {
                self.outbox.push(n, Item::Recall { key, keep });
            }
        }
    }

    pub(super) fn answer(&mut self, now: Nanos, key: KeyRef, to: NodeId, answer: Answer) {
        let Answer::Grant {
            window,
            granted,
            ends_at,
            retry_after,
            more_coming,
        } = answer
        else {
            return;
        };
        self.stats.grants += 1;
        let retry_after = self.lockout_retry(now, key, retry_after);
        let (answers, holding) = self
            .authorities
            .get(&key)
            .map_or((0, 0), |a| (a.seq_of(to), a.holding_of(to)));
        let grant = Grant {
            key,
            window,
            granted,
            ends_at,
            retry_after,
            more_coming,
            answers,
            holding,
        };
        if to == self.config.id {
            // Other holders report what they were granted to whoever takes over after a
            // crash; this node cannot, so its own grants reach the backup at once.
            if let (Some(a), (owner, Some(successor))) = (
                self.authorities.get(&key),
                self.membership.owner_and_successor(key.key),
            ) && owner == self.config.id
            {
                self.stats.backups_sent += 1;
                self.outbox.push_backup(successor, a.state());
            }
            self.on_grant(now, to, grant);
        } else {
            self.outbox.push(to, Item::Grant(grant));
        }
    }

    pub(super) fn serve_waiting(&mut self, key: KeyRef, now: Nanos) {
        self.schedule.touch(key);
        if !self.authorities.has_waiters(key) {
            return;
        }
        if self.locked(&key, now).is_some() {
            self.enforce_lockout(now, key);
            return;
        }
        let policy = self.enforced(key);
        let Some(a) = self.authorities.get_mut(&key) else {
            return;
        };
        let before = Some(a.frame().0);
        let answers = a.serve_waiting(&policy, now);
        self.note_frame(key, before);
        for (node, _, answer) in answers {
            self.answer(now, key, node, answer);
        }
    }
}
