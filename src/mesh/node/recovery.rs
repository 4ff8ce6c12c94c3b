//! How a node follows membership changes: authorities handed to their owners and taken
//! back, a starting peer told what it should hold, a restarted or departed holder's leases
//! written off.

use super::{Event, Node};
use crate::clock::Nanos;
use crate::mesh::NodeId;
use crate::mesh::authority::Authority;
use crate::mesh::holder::Holding;
use crate::mesh::membership::{Change, weight};
use crate::mesh::message::{AuthorityState, Item, KeyRef};
use crate::mesh::timing::Offset;

impl Node {
    /// Send a key's authority to `to`, its owner: unless `to` does not answer (never heard
    /// since this node started, as a restarted node counts its peers alive until told
    /// otherwise, or suspected): a state sent to a member that died meanwhile would be lost.
    /// This node then keeps the authority, granting nothing from it, until it hears `to`
    /// again or learns that it is gone (the membership changes, and it is handed on).
    pub(super) fn hand_off(&mut self, now: Nanos, key: KeyRef, to: NodeId) {
        if !self.membership.is_responsive(to, now) {
            if self.authorities.contains_key(&key) {
                self.transfers.hold(key);
            }
            return;
        }
        if let Some(a) = self.authorities.remove(&key) {
            self.forget_if_gone(key);
            self.stats.handoffs_sent += 1;
            self.outbox.push_reliable(to, Item::Handoff(a.state()));
            self.hand_lockout(now, key, to);
        }
    }

    pub(super) fn on_handoff(&mut self, now: Nanos, from: NodeId, state: AuthorityState) {
        self.stats.handoffs_received += 1;
        let offset = self.offset_or_guess(from, now);
        self.install(now, from, offset, state);
    }

    /// Take over an authority's state (a handoff, or a restore after a restart), merged with
    /// what this node keeps of the key; times are converted with `offset`.
    pub(super) fn install(
        &mut self,
        now: Nanos,
        _from: NodeId,
        offset: Offset,
        state: AuthorityState,
    ) {
        let key = state.key;
        self.schedule.touch(key);
        let Some(policy) = self.limits.of_key(&key) else {
            return;
        };
        self.backups.remove(&key);
        self.transfers.returned(key);
        let incoming =
            Authority::from_state(&state, &policy, offset, now).with_hold(self.config.hold_ns());
        let before = self.authorities.get(&key).map(|a| a.frame().0);
        let a = self.authorities.merge_in(key, incoming, &policy);
        // The sender may not know yet of the holders this node knows are gone.
        let membership = &self.membership;
        a.retire_departed(&policy, |node, run| membership.is_live_run(node, run));
        self.count_deferred(now, key);
        self.mark_dirty(key);
        self.note_frame(key, before);
        // Pass it on if this node is not the owner (any more).
        let owner = self.rightful_owner(key.key, now);
        if owner != self.config.id {
            self.hand_off(now, key, owner);
        } else {
            self.serve_waiting(key, now);
        }
    }

    /// Tell whether `key`'s authority may be on its way from a member that left lately and
    /// ranked above this node for it (its owner, most likely). A backup of it from that
    /// member whose authority would be idle by now says nothing is coming: it dropped
    /// the authority too.
    pub(super) fn awaits_handoff(&self, key: KeyRef, now: Nanos) -> bool {
        let departed = self.transfers.departed_members();
        if departed.is_empty() {
            return false;
        }
        let mine = weight(key.key, self.config.id);
        departed.iter().any(|&(p, due)| {
            if due <= now || weight(key.key, p) < mine {
                return false;
            }
            // Unless this node's own holding of the key is in use: then an authority of it
            // is live (the backup is of an earlier run of it, whose later backups were lost).
            let leased = self.holdings.get(&key).is_some_and(|h| !h.is_idle(now));
            let idle_backup = !leased
                && self.backups.get(&key).is_some_and(|b| b.from == p)
                && self.backup_is_idle(&key, now);
            !idle_backup
        })
    }

    /// Hand on the authorities kept for owners that did not answer ([`Node::hand_off`]),
    /// those that answer now; keep those this node owns now.
    pub(super) fn retry_held(&mut self, now: Nanos) {
        for key in self.transfers.take_held() {
            let owner = self.rightful_owner(key.key, now);
            if owner != self.config.id {
                self.hand_off(now, key, owner);
            } else if self.authorities.contains_key(&key) {
                self.mark_dirty(key);
            }
        }
    }

    /// The node a key's authority belongs with: its owner, or, while this node leaves, the
    /// first other member of its ranking that answers (the owner once the others hear it
    /// left, and have declared dead those that do not answer).
    pub(super) fn rightful_owner(&self, key: u64, now: Nanos) -> NodeId {
        let me = self.config.id;
        if self.membership.is_leaving() {
            let others: Vec<NodeId> = self
                .membership
                .ranked_all(key)
                .into_iter()
                .filter(|&n| n != me)
                .collect();
            others
                .iter()
                .copied()
                .find(|&n| self.membership.is_responsive(n, now))
                .or(others.first().copied())
                .unwrap_or(me)
        } else {
            self.membership.owner_and_successor(key).0
        }
    }

    /// A peer that declared this node dead may have taken over the authorities it backs up:
    /// hand them to it (it merges them with what it granted since) and let it hand them back,
    /// making no fresh authority for those keys meanwhile. Any key may have moved to an owner
    /// of the peer's view without this node, which grants until it hears this node again:
    /// this node grants nothing until every member it counts alive has heard it since
    /// ([`Node::heard_back`]).
    pub(super) fn check_deaths(&mut self, now: Nanos, from: NodeId) {
        let Some(deaths) = self.membership.peer(from).map(|p| p.my_deaths) else {
            return;
        };
        if !self.transfers.declared_dead(from, deaths, now) {
            return;
        }
        let keys: Vec<KeyRef> = self
            .authorities
            .keys()
            .filter(|k| self.membership.owner_and_successor(k.key).1 == Some(from))
            .collect();
        for key in keys {
            self.hand_off(now, key, from);
            self.transfers.returning(key, from);
        }
    }

    /// Send a starting peer what it should hold: the authorities it owns, the backups of the
    /// keys it would take over.
    pub(super) fn answer_sync(&mut self, now: Nanos, to: NodeId, incarnation: u64) {
        self.transfers.answer(to, incarnation);
        // The members it should know first (a joining node learns its cluster here).
        self.send_members(to, true);
        let owned: Vec<KeyRef> = self
            .authorities
            .keys()
            .filter(|k| self.membership.owner_and_successor(k.key).0 == to)
            .collect();
        for key in owned {
            self.hand_off(now, key, to);
        }
        let backed: Vec<AuthorityState> = self
            .authorities
            .iter()
            .filter(|(k, _)| self.membership.owner_and_successor(k.key).1 == Some(to))
            .map(|(_, a)| a.state())
            .collect();
        for state in backed {
            self.stats.backups_sent += 1;
            self.outbox.push_reliable(to, Item::Backup(state));
        }
        // What it kept before it restarted: the backups it sent this node.
        let restored = self.backups.states_where(|k, b| {
            b.from == to && self.membership.owner_and_successor(k.key).0 == to
        });
        for state in restored {
            self.outbox.push_reliable(to, Item::Restore(state));
        }
        // The lockouts of the keys it owns or backs up (their authorities may be gone
        // here, idle, while the lockout runs).
        for key in self.locks.running(now) {
            let (owner, successor) = self.membership.owner_and_successor(key.key);
            if owner == to || successor == Some(to) {
                self.hand_lockout(now, key, to);
            }
        }
        self.outbox.push_reliable(to, Item::SyncDone);
    }

    pub(super) fn finish_sync(&mut self) {
        if !self.running && self.transfers.synced() && self.join.joined() {
            self.running = true;
            self.membership.set_syncing(false);
            self.events.push_back(Event::Recovered);
        }
    }

    pub(super) fn apply_changes(&mut self, now: Nanos, changes: &[Change]) {
        for &change in changes {
            match change {
                Change::Down(p) | Change::Left(p) => {
                    self.events.push_back(if matches!(change, Change::Down(_)) {
                        Event::PeerDown(p)
                    } else {
                        Event::PeerLeft(p)
                    });
                    if matches!(change, Change::Left(_)) {
                        // What it gave back may have made room that a denial here does
                        // not know of.
                        self.holdings.for_each(None, Holding::forget_denial);
                        // A leaving owner hands its keys over: wait for that (at most half
                        // of `max_wait`, and the time a death takes to declare) rather than
                        // take a backup over or make an authority afresh.
                        let wait = (self.config.max_wait_ns / 2)
                            .min(self.config.dead_after_rounds * self.config.gossip_interval_ns);
                        self.transfers.departed(p, now, now.saturating_add(wait));
                    }
                    self.authorities.forget_holder(|k| self.limits.of_key(k), p);
                    // What it was to hand back is lost with it.
                    self.transfers.peer_gone(p);
                }
                Change::Up(p) | Change::Learned(p) => {
                    self.events.push_back(if matches!(change, Change::Up(_)) {
                        Event::PeerUp(p)
                    } else {
                        Event::PeerLearned(p)
                    });
                    // A joining node waits for every member it learns of before it owns keys.
                    if !self.join.joined() {
                        self.transfers.await_answer(p);
                    }
                }
                Change::Suspected(p) => self.events.push_back(Event::PeerSuspected(p)),
                Change::Forgotten(p) => {
                    self.events.push_back(Event::PeerForgotten(p));
                    self.transfers.peer_forgotten(p);
                }
                Change::Restarted(p) => {
                    self.events.push_back(Event::PeerRestarted(p));
                    self.authorities.forget_holder(|k| self.limits.of_key(k), p);
                    self.transfers.peer_restarted(p);
                }
            }
        }
        if !changes.is_empty() {
            self.finish_sync();
        }
        if self.membership.version() != self.membership_version {
            self.membership_version = self.membership.version();
            self.rebalance(now);
        }
    }

    /// The live members changed: move authorities to their owners, back up to the new
    /// successors, and tell the new owners of this node's keys what it holds.
    pub(super) fn rebalance(&mut self, now: Nanos) {
        let keys: Vec<KeyRef> = self.authorities.keys().collect();
        for key in keys {
            let owner = self.rightful_owner(key.key, now);
            if owner != self.config.id {
                self.hand_off(now, key, owner);
            } else {
                self.mark_dirty(key);
            }
        }
        let keys: Vec<KeyRef> = self.holdings.keys().collect();
        for key in keys {
            let h = self.holdings.get_mut(&key).expect("listed");
            h.report_due();
            self.schedule.touch(key);
            if h.waiting() > 0 {
                self.ask(key, now, false);
            }
        }
        // Backups of keys this node now owns are taken over when a holder asks.
    }
}
