//! The node's state transfers with its peers, as one owned part: whose answer to its start
//! it waits for, whose start it answered, how often each peer declared it dead, the
//! authorities it keeps for owners that do not answer yet, the members that left lately
//! (their handoffs awaited), the keys whose authority it handed to a peer that declared it
//! dead (to come back), and since when it may not grant because a peer declared it dead.
//! `node::recovery` decides what to transfer; this part remembers it.

use std::collections::{BTreeMap, BTreeSet};

use crate::clock::Nanos;
use crate::mesh::NodeId;
use crate::mesh::keymap::FixedMap;
use crate::mesh::message::KeyRef;

/// What the node remembers of its state transfers.
#[derive(Debug, Default)]
pub(super) struct Transfers {
    /// Peers whose answer to this node's start the node waits for.
    waiting: BTreeSet<NodeId>,
    /// The incarnation of each peer whose start this node answered.
    answered: FixedMap<NodeId, u64>,
    /// How many times each peer had declared this node dead when it last checked.
    deaths_seen: BTreeMap<NodeId, u32>,
    /// Keys whose authority this node keeps for an owner that does not answer yet: looked
    /// at again every round.
    held: Vec<KeyRef>,
    /// Members that left lately, and until when (local time) their handoffs are awaited.
    departed: Vec<(NodeId, Nanos)>,
    /// Keys this node owns whose authority it handed to the peer that had declared it dead,
    /// to merge and hand back: no fresh authority is made for them meanwhile.
    returning: FixedMap<KeyRef, NodeId>,
    /// When this node last learned that a peer declared it dead (local time), until every
    /// member it counts alive has echoed one of its frames sent since.
    declared_dead_at: Option<Nanos>,
}

impl Transfers {
    /// A node that starts waiting for the answer of each of `peers`.
    pub(super) fn new(peers: impl IntoIterator<Item = NodeId>) -> Self {
        Transfers {
            waiting: peers.into_iter().collect(),
            ..Transfers::default()
        }
    }

    /// Tell whether every peer waited for has answered this node's start.
    pub(super) fn synced(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Wait for `peer`'s answer too (a member learned while joining).
    pub(super) fn await_answer(&mut self, peer: NodeId) {
        self.waiting.insert(peer);
    }

    /// `peer` answered this node's start (or is gone: nothing more comes from it).
    pub(super) fn answered_by(&mut self, peer: NodeId) {
        self.waiting.remove(&peer);
    }

    /// Tell whether this node answered the start of `peer`'s run `incarnation` already.
    pub(super) fn has_answered(&self, peer: NodeId, incarnation: u64) -> bool {
        self.answered.get(&peer) == Some(&incarnation)
    }

    /// This node answers the start of `peer`'s run `incarnation`.
    pub(super) fn answer(&mut self, peer: NodeId, incarnation: u64) {
        self.answered.insert(peer, incarnation);
    }

    /// `peer` declared this node dead `deaths` times in all: return whether that is more
    /// than when it last checked (it did again), and if so note it, at `now`.
    pub(super) fn declared_dead(&mut self, peer: NodeId, deaths: u32, now: Nanos) -> bool {
        let seen = self.deaths_seen.entry(peer).or_insert(0);
        if deaths <= *seen {
            return false;
        }
        *seen = deaths;
        self.declared_dead_at = Some(now);
        true
    }

    /// Since when this node grants nothing because a peer declared it dead, if it does.
    pub(super) fn declared_dead_at(&self) -> Option<Nanos> {
        self.declared_dead_at
    }

    /// Every member heard this node again: it may grant.
    pub(super) fn heard_back(&mut self) {
        self.declared_dead_at = None;
    }

    /// Keep `key`'s authority for an owner that does not answer yet.
    pub(super) fn hold(&mut self, key: KeyRef) {
        if !self.held.contains(&key) {
            self.held.push(key);
        }
    }

    /// Tell whether authorities are kept for owners that did not answer.
    pub(super) fn holds_any(&self) -> bool {
        !self.held.is_empty()
    }

    /// Take the keys held, to try their owners again.
    pub(super) fn take_held(&mut self) -> Vec<KeyRef> {
        std::mem::take(&mut self.held)
    }

    /// `peer` left at `now`: await its handoffs until `until`.
    pub(super) fn departed(&mut self, peer: NodeId, now: Nanos, until: Nanos) {
        self.departed.retain(|&(q, due)| q != peer && due > now);
        self.departed.push((peer, until));
    }

    /// Forget the departed members whose handoffs are no longer awaited at `now`.
    pub(super) fn expire_departed(&mut self, now: Nanos) {
        if !self.departed.is_empty() {
            self.departed.retain(|&(_, due)| due > now);
        }
    }

    /// The members that left lately, and until when their handoffs are awaited.
    pub(super) fn departed_members(&self) -> &[(NodeId, Nanos)] {
        &self.departed
    }

    /// `key`'s authority went to `peer`, which declared this node dead, to come back.
    pub(super) fn returning(&mut self, key: KeyRef, peer: NodeId) {
        self.returning.insert(key, peer);
    }

    /// Tell whether `key`'s authority is on its way back.
    pub(super) fn is_returning(&self, key: KeyRef) -> bool {
        self.returning.contains_key(&key)
    }

    /// `key`'s authority is here again.
    pub(super) fn returned(&mut self, key: KeyRef) {
        self.returning.remove(&key);
    }

    /// Keep waiting only for the keys `owned` says this node owns.
    pub(super) fn keep_returning(&mut self, owned: impl Fn(KeyRef) -> bool) {
        self.returning.retain(|&k, _| owned(k));
    }

    /// `peer` is down or left: nothing more comes from it (what it was to hand back is
    /// lost with it).
    pub(super) fn peer_gone(&mut self, peer: NodeId) {
        self.waiting.remove(&peer);
        self.returning.retain(|_, to| *to != peer);
    }

    /// `peer` restarted: its earlier run's answers and counts are over.
    pub(super) fn peer_restarted(&mut self, peer: NodeId) {
        self.answered.remove(&peer);
        self.deaths_seen.remove(&peer);
        self.returning.retain(|_, to| *to != peer);
    }

    /// `peer` is forgotten.
    pub(super) fn peer_forgotten(&mut self, peer: NodeId) {
        self.waiting.remove(&peer);
        self.peer_restarted(peer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: u64) -> KeyRef {
        KeyRef { policy: 0, key: k }
    }

    #[test]
    fn a_start_is_synced_once_every_peer_answered_or_went() {
        let mut t = Transfers::new([2, 3]);
        assert!(!t.synced());
        t.answered_by(2);
        t.peer_gone(3);
        assert!(t.synced());
        t.answer(4, 9);
        assert!(t.has_answered(4, 9) && !t.has_answered(4, 10));
        t.peer_restarted(4);
        assert!(!t.has_answered(4, 9));
    }

    #[test]
    fn a_new_death_is_noted_once_and_its_returning_keys_go_with_the_peer() {
        let mut t = Transfers::default();
        assert!(t.declared_dead(2, 1, 50));
        assert!(!t.declared_dead(2, 1, 60));
        assert_eq!(t.declared_dead_at(), Some(50));
        t.returning(key(1), 2);
        assert!(t.is_returning(key(1)));
        t.peer_gone(2);
        assert!(!t.is_returning(key(1)));
        t.heard_back();
        assert_eq!(t.declared_dead_at(), None);
        t.hold(key(5));
        t.hold(key(5));
        assert_eq!(t.take_held(), vec![key(5)]);
        t.departed(3, 10, 100);
        t.expire_departed(100);
        assert!(t.departed_members().is_empty());
    }
}
