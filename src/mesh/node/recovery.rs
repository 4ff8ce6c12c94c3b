//! How a node follows membership changes: authorities handed to their owners and taken
//! back, a starting peer told what it should hold, a restarted or departed holder's leases
//! written off.

use super::{Event, Node};
use crate::clock::Nanos;
use crate::mesh::NodeId;
use crate::mesh::authority::Authority;
use crate::mesh::membership::Change;
use crate::mesh::message::{AuthorityState, Item, KeyRef};
use crate::mesh::timing::Offset;

impl Node {
    pub(super) fn hand_off(&mut self, key: KeyRef, to: NodeId) {
        if let Some(a) = self.authorities.remove(&key) {
            self.stats.handoffs_sent += 1;
            self.outbox.push_reliable(to, Item::Handoff(a.state()));
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
        self.touched.push(key);
        let Some((policy, kind)) = self.policy(key.policy) else {
            return;
        };
        self.backups.remove(&key);
        self.returning.remove(&key);
        let incoming = Authority::from_state(&state, policy, kind, offset, now)
            .with_hold(self.config.hold_ns());
        let before = self.authorities.get(&key).map(|a| a.frame().0);
        match self.authorities.get_mut(&key) {
            Some(a) => a.merge(&incoming),
            None => {
                self.authorities.insert(key, incoming);
            }
        }
        self.mark_dirty(key);
        self.note_frame(key, before);
        // Pass it on if this node is not the owner (any more).
        let owner = self.membership.owner_and_successor(key.key).0;
        if owner != self.config.id {
            self.hand_off(key, owner);
        } else {
            self.serve_waiting(key, now);
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
        let seen = self.deaths_seen.entry(from).or_insert(0);
        if deaths <= *seen {
            return;
        }
        *seen = deaths;
        self.declared_dead_at = Some(now);
        let keys: Vec<KeyRef> = self
            .authorities
            .keys()
            .copied()
            .filter(|k| self.membership.owner_and_successor(k.key).1 == Some(from))
            .collect();
        for key in keys {
            self.hand_off(key, from);
            self.returning.insert(key, from);
        }
    }

    /// Send a starting peer what it should hold: the authorities it owns, the backups of the
    /// keys it would take over.
    pub(super) fn answer_sync(&mut self, to: NodeId, incarnation: u64) {
        self.answered_sync.insert(to, incarnation);
        // The members it should know first (a joining node learns its cluster here).
        self.send_members(to, true);
        let owned: Vec<KeyRef> = self
            .authorities
            .keys()
            .copied()
            .filter(|k| self.membership.owner_and_successor(k.key).0 == to)
            .collect();
        for key in owned {
            self.hand_off(key, to);
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
        let restored: Vec<AuthorityState> = self
            .backups
            .iter()
            .filter(|(k, b)| b.from == to && self.membership.owner_and_successor(k.key).0 == to)
            .map(|(_, b)| b.state.clone())
            .collect();
        for state in restored {
            self.outbox.push_reliable(to, Item::Restore(state));
        }
        self.outbox.push_reliable(to, Item::SyncDone);
    }

    pub(super) fn finish_sync(&mut self) {
        if !self.running && self.sync_waiting.is_empty() && self.join.joined() {
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
                    for a in self.authorities.values_mut() {
                        a.forget_holder(p);
                    }
                    self.sync_waiting.remove(&p);
                    // What it was to hand back is lost with it.
                    self.returning.retain(|_, to| *to != p);
                }
                Change::Up(p) | Change::Learned(p) => {
                    self.events.push_back(if matches!(change, Change::Up(_)) {
                        Event::PeerUp(p)
                    } else {
                        Event::PeerLearned(p)
                    });
                    // A joining node waits for every member it learns of before it owns keys.
                    if !self.join.joined() {
                        self.sync_waiting.insert(p);
                    }
                }
                Change::Suspected(p) => self.events.push_back(Event::PeerSuspected(p)),
                Change::Forgotten(p) => {
                    self.events.push_back(Event::PeerForgotten(p));
                    self.sync_waiting.remove(&p);
                    self.answered_sync.remove(&p);
                    self.deaths_seen.remove(&p);
                    self.returning.retain(|_, to| *to != p);
                }
                Change::Restarted(p) => {
                    self.events.push_back(Event::PeerRestarted(p));
                    for a in self.authorities.values_mut() {
                        a.forget_holder(p);
                    }
                    if let Some(b) = &mut self.baseline {
                        b.forget(p);
                    }
                    self.answered_sync.remove(&p);
                    self.deaths_seen.remove(&p);
                    self.returning.retain(|_, to| *to != p);
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
        let keys: Vec<KeyRef> = self.authorities.keys().copied().collect();
        for key in keys {
            let owner = self.membership.owner_and_successor(key.key).0;
            if owner != self.config.id {
                self.hand_off(key, owner);
            } else {
                self.mark_dirty(key);
            }
        }
        let keys: Vec<KeyRef> = self.holdings.keys().copied().collect();
        for key in keys {
            let h = self.holdings.get_mut(&key).expect("listed");
            h.report_due();
            self.touched.push(key);
            if h.waiting() > 0 {
                self.ask(key, now, false);
            }
        }
        // Backups of keys this node now owns are taken over when a holder asks.
    }
}
