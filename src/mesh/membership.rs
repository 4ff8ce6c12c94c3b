//! Who is in the cluster and alive, who owns a key, and what each frame's header says.
//!
//! - **Liveness.** Every frame from a peer counts as a heartbeat. A peer silent for
//!   `dead_after` is declared dead, but only by a node that still sees a majority of the
//!   members alive (the side of a partition without a majority declares nobody dead). A
//!   member that leaves (drain) says so in its last frames and is dropped at once.
//! - **Ownership.** Rendezvous hashing over the live members: a key's *owner* is the live
//!   member with the highest weight for it, its *successor* the next one. Views that agree
//!   give every key one owner; a change moves only the keys of the member that came or went.
//! - **Headers.** Each frame to a peer echoes the newest frame received from it (clock
//!   samples, `mesh::timing`), and each frame from a peer echoes ours: the newest of our frames
//!   a peer confirms having received is what the authority lease of `mesh::node` checks.

use std::collections::BTreeMap;

use crate::clock::Nanos;
use crate::mesh::NodeId;
use crate::mesh::message::{Header, MAX_DEAD_LISTED};
use crate::mesh::timing::{Offset, PeerClock};

/// One peer as this node sees it.
#[derive(Debug, Clone, Default)]
pub struct Peer {
    /// Whether it counts as a live member (owner candidate).
    pub alive: bool,
    /// Whether it announced that it leaves the cluster.
    pub left: bool,
    /// Local time of its newest frame (or of this node's start, before any).
    pub heard_at: Nanos,
    /// Its incarnation, once heard.
    pub incarnation: Option<u64>,
    /// Its clock.
    pub clock: PeerClock,
    /// How many times this node declared it dead.
    pub deaths: u32,
    /// The most times it said it declared this node dead.
    pub my_deaths: u32,
    /// The newest `sent_at` received from it (its clock), and when (local).
    pub last_received: Option<(u64, Nanos)>,
    /// The newest of this node's `sent_at` it echoed (this node's clock).
    pub confirmed: Nanos,
    /// When this node last sent it a frame (local).
    pub sent_at: Nanos,
    /// The members it counts as dead, as its newest frame said (`None`: unknown, or more
    /// than a header lists).
    pub their_dead: Option<Vec<NodeId>>,
}

/// What changed in a membership update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// A peer was declared dead.
    Down(NodeId),
    /// A peer that was dead (or never heard) is alive.
    Up(NodeId),
    /// A peer restarted (new incarnation): whatever it held is gone.
    Restarted(NodeId),
    /// A peer left the cluster.
    Left(NodeId),
}

/// This node's view of the cluster.
#[derive(Debug, Clone)]
pub struct Membership {
    me: NodeId,
    incarnation: u64,
    configured: usize,
    peers: BTreeMap<NodeId, Peer>,
    dead_after_ns: Nanos,
    version: u64,
    leaving: bool,
    syncing: bool,
    /// It heard less than a majority at its last check.
    cut_off: bool,
    /// Derived from `peers` (rebuilt by `refresh` whenever `version` changes): the owner
    /// candidates (this node, then the live peers by id) and the peers that did not leave,
    /// each with its id mixed for [`weight`]; the peers counted dead (not left), by id; how
    /// many left.
    candidates: Vec<(NodeId, u64)>,
    present: Vec<(NodeId, u64)>,
    dead: Vec<NodeId>,
    left_count: usize,
    /// `heard_at` of the peers that did not leave, sorted.
    recent: Vec<Nanos>,
}

impl Membership {
    /// Start a view at `now`: `members` (this node may be among them) all count as alive
    /// until they stay silent for `dead_after_ns`.
    pub fn new(
        me: NodeId,
        incarnation: u64,
        members: &[NodeId],
        dead_after_ns: Nanos,
        now: Nanos,
    ) -> Self {
        let mut peers = BTreeMap::new();
        for &id in members.iter().filter(|&&id| id != me) {
            peers.insert(
                id,
                Peer {
                    alive: true,
                    heard_at: now,
                    ..Peer::default()
                },
            );
        }
        let configured = peers.len() + 1;
        let mut m = Membership {
            me,
            incarnation,
            configured,
            peers,
            dead_after_ns,
            version: 1,
            leaving: false,
            syncing: false,
            cut_off: false,
            candidates: Vec::new(),
            present: Vec::new(),
            dead: Vec::new(),
            left_count: 0,
            recent: Vec::new(),
        };
        m.refresh();
        m
    }

    /// Rebuild what is derived from the peers (after a change of who is alive or left).
    fn refresh(&mut self) {
        self.candidates.clear();
        self.candidates.push((self.me, mixed_id(self.me)));
        self.present.clear();
        self.dead.clear();
        self.recent.clear();
        for (&id, p) in &self.peers {
            if p.alive {
                self.candidates.push((id, mixed_id(id)));
            }
            if !p.left {
                self.present.push((id, mixed_id(id)));
                self.recent.push(p.heard_at);
                if !p.alive {
                    self.dead.push(id);
                }
            }
        }
        self.left_count = self.peers.len() - self.present.len();
        self.recent.sort_unstable();
    }

    /// Return how many peers that did not leave were heard within `span` before `now`
    /// (`heard_at + span > now`).
    pub fn heard_within(&self, now: Nanos, span: Nanos) -> usize {
        match now.checked_sub(span) {
            Some(since) => self.recent.len() - self.recent.partition_point(|&h| h <= since),
            None => self.recent.len(),
        }
    }

    /// Return this node's id.
    pub fn me(&self) -> NodeId {
        self.me
    }

    /// Return this node's incarnation.
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// Return a number that changes whenever the set of live members changes.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Return the peers.
    pub fn peers(&self) -> &BTreeMap<NodeId, Peer> {
        &self.peers
    }

    /// Return peer `id`.
    pub fn peer(&self, id: NodeId) -> Option<&Peer> {
        self.peers.get(&id)
    }

    /// Count a majority over at least `size` members (a cluster configured larger than the
    /// members this node knows of).
    pub fn set_configured(&mut self, size: usize) {
        self.configured = self.configured.max(size);
    }

    /// Return the number of members the cluster was configured with (this node included).
    pub fn configured(&self) -> usize {
        self.configured
    }

    /// Return the number of members a majority is counted over: the configured ones less
    /// those that left (a clean leave, announced; a member that died still counts, since
    /// silence cannot tell a death from a cut). Two sides that each saw some of the leaves
    /// still cannot both hold a majority: every leave either saw is a real one.
    pub fn quorum_of(&self) -> usize {
        self.configured.saturating_sub(self.left_count).max(1)
    }

    /// Tell whether `heard` members (this node included) are a majority.
    pub fn is_majority(&self, heard: usize) -> bool {
        heard * 2 > self.quorum_of()
    }

    /// Return the number of live members (this node included).
    pub fn alive_count(&self) -> usize {
        self.candidates.len()
    }

    /// Tell whether this node sees a majority of the members alive.
    pub fn has_majority(&self) -> bool {
        self.is_majority(self.alive_count())
    }

    /// Tell whether `id` is a live member (this node always is).
    pub fn is_alive(&self, id: NodeId) -> bool {
        id == self.me || self.peers.get(&id).is_some_and(|p| p.alive)
    }

    /// Mark this node as leaving: its headers say so from now on.
    pub fn leave(&mut self) {
        self.leaving = true;
    }

    /// Mark this node as syncing (its headers ask peers for what it should hold) or not.
    pub fn set_syncing(&mut self, syncing: bool) {
        self.syncing = syncing;
    }

    /// Add a member learned at run time (it counts as alive until silent).
    pub fn add(&mut self, id: NodeId, now: Nanos) {
        if id == self.me || self.peers.contains_key(&id) {
            return;
        }
        self.peers.insert(
            id,
            Peer {
                alive: true,
                heard_at: now,
                ..Peer::default()
            },
        );
        self.configured += 1;
        self.version += 1;
        self.refresh();
    }

    /// Record a frame's header from `from` at `now`; return what changed.
    pub fn heard(&mut self, now: Nanos, from: NodeId, header: &Header) -> Vec<Change> {
        let mut changes = Vec::new();
        let version = self.version;
        let Some(peer) = self.peers.get_mut(&from) else {
            return changes;
        };
        let restarted = peer.incarnation.is_some_and(|i| i != header.incarnation);
        if peer.left && !restarted && !header.leaving {
            // An older frame of the incarnation that left, overtaken by its leaving frames
            // (datagrams and streams are not ordered): it says nothing new.
            return changes;
        }
        if restarted {
            peer.clock.reset();
            peer.confirmed = 0;
            peer.last_received = None;
            changes.push(Change::Restarted(from));
        }
        peer.incarnation = Some(header.incarnation);
        let heard_before = peer.heard_at;
        peer.heard_at = now;
        if !peer.left {
            // Keep `recent` sorted: move this peer's entry.
            let at = self.recent.partition_point(|&h| h < heard_before);
            if self.recent.get(at) == Some(&heard_before) {
                self.recent.remove(at);
            }
            let to = self.recent.partition_point(|&h| h < now);
            self.recent.insert(to, now);
        }
        peer.their_dead.clone_from(&header.dead);
        peer.clock
            .observe(now, header.sent_at, header.echo, header.held);
        if header.echo <= now {
            peer.confirmed = peer.confirmed.max(header.echo);
        }
        if peer.last_received.is_none_or(|(t, _)| header.sent_at >= t) {
            peer.last_received = Some((header.sent_at, now));
        }
        peer.my_deaths = peer.my_deaths.max(header.your_deaths);
        if header.leaving {
            if !peer.left {
                peer.left = true;
                peer.alive = false;
                self.version += 1;
                changes.push(Change::Left(from));
            }
        } else {
            if peer.left {
                // It came back after leaving (a restart with the same id).
                peer.left = false;
            }
            if !peer.alive {
                peer.alive = true;
                self.version += 1;
                changes.push(Change::Up(from));
            }
        }
        if self.version != version {
            self.refresh();
        }
        changes
    }

    /// Declare dead the peers silent for `dead_after` at `now` (only with a majority alive).
    ///
    /// A node that heard less than a majority within `dead_after` (it was cut off) declares
    /// nobody dead; when it hears a majority again, the silence of the others counts from
    /// then: they may simply not have reached it yet, and declaring them dead would make it
    /// take over keys that a live owner still keeps.
    pub fn check(&mut self, now: Nanos) -> Vec<Change> {
        let mut changes = Vec::new();
        // Only peers heard in the last half of `dead_after` count: on a real cut every peer
        // goes silent within a round of the others, so a node on the small side cannot
        // count as alive those it heard just before the cut.
        let fresh = self.dead_after_ns / 2;
        let heard = 1 + self.heard_within(now, fresh);
        if !self.is_majority(heard) {
            self.cut_off = true;
            return changes;
        }
        if self.cut_off {
            self.cut_off = false;
            for p in self.peers.values_mut() {
                p.heard_at = p.heard_at.max(now);
            }
            self.refresh();
            return changes;
        }
        let silent: Vec<NodeId> = self
            .peers
            .iter()
            .filter(|(_, p)| p.alive && now.saturating_sub(p.heard_at) >= self.dead_after_ns)
            .map(|(&id, _)| id)
            .collect();
        if silent.is_empty() {
            return changes;
        }
        // Those heard recently, this node included, are a majority of the members (checked
        // above), so the silent ones can be declared dead.
        for id in silent {
            let peer = self.peers.get_mut(&id).expect("listed above");
            peer.alive = false;
            peer.deaths += 1;
            changes.push(Change::Down(id));
        }
        self.version += 1;
        self.refresh();
        changes
    }

    /// Build the header of a frame to `to`, sent at `now`.
    pub fn header(&mut self, now: Nanos, to: NodeId) -> Header {
        let (echo, held, your_deaths) = match self.peers.get_mut(&to) {
            Some(peer) => {
                peer.sent_at = now;
                let (echo, held) = peer
                    .last_received
                    .map_or((0, 0), |(sent, at)| (sent, now.saturating_sub(at)));
                (echo, held, peer.deaths)
            }
            None => (0, 0, 0),
        };
        let dead = &self.dead;
        Header {
            incarnation: self.incarnation,
            sent_at: now,
            echo,
            held,
            your_deaths,
            syncing: self.syncing,
            leaving: self.leaving,
            dead: (dead.len() <= MAX_DEAD_LISTED).then(|| dead.clone()),
        }
    }

    /// Return the clock offset of peer `id` at `now`, once measured.
    pub fn offset(&self, id: NodeId, now: Nanos) -> Option<Offset> {
        if id == self.me {
            return Some(Offset {
                offset: 0,
                error: 0,
                round_trip: 0,
            });
        }
        self.peers.get(&id)?.clock.offset(now)
    }

    /// Return the live members ranked by rendezvous weight for `key`, highest first: the
    /// first is the key's owner, the second its successor.
    pub fn ranked(&self, key: u64) -> impl Iterator<Item = NodeId> + '_ {
        let mut best: [(u64, NodeId); 2] = [(0, self.me), (0, self.me)];
        let mut found = 0usize;
        for &(id, mixed) in &self.candidates {
            let w = mix(key ^ mixed);
            if found == 0 || w > best[0].0 {
                best[1] = best[0];
                best[0] = (w, id);
            } else if found == 1 || w > best[1].0 {
                best[1] = (w, id);
            }
            found += 1;
        }
        best.into_iter().take(found.min(2)).map(|(_, id)| id)
    }

    /// Tell whether peer `id`, by the view its newest frame told, ranks this node first for
    /// `key` (it counts this node and itself alive, and every member it counts alive ranks
    /// below this node). Unknown views do not agree.
    pub fn agrees_i_own(&self, id: NodeId, key: u64) -> bool {
        let Some(dead) = self.peers.get(&id).and_then(|p| p.their_dead.as_ref()) else {
            return false;
        };
        if dead.contains(&self.me) {
            return false;
        }
        let mine = weight(key, self.me);
        self.present
            .iter()
            .filter(|(peer, _)| !dead.contains(peer))
            .all(|&(_, mixed)| mix(key ^ mixed) < mine)
    }

    /// Return the key's owner and successor (if there is a second live member).
    pub fn owner_and_successor(&self, key: u64) -> (NodeId, Option<NodeId>) {
        let mut ranked = self.ranked(key);
        let owner = ranked.next().unwrap_or(self.me);
        (owner, ranked.next())
    }
}

/// The rendezvous weight of member `id` for `key`.
pub fn weight(key: u64, id: NodeId) -> u64 {
    mix(key ^ mixed_id(id))
}

/// The part of [`weight`] that depends on the member alone.
fn mixed_id(id: NodeId) -> u64 {
    mix(id.wrapping_add(0x9e37_79b9_7f4a_7c15))
}

/// A 64-bit finalizer (splitmix64's): spreads every input bit over the output.
pub fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEAD: Nanos = 200_000_000;

    fn header(incarnation: u64, sent_at: u64) -> Header {
        Header {
            incarnation,
            sent_at,
            ..Header::default()
        }
    }

    #[test]
    fn an_owner_needs_its_successor_to_rank_it_first() {
        let mut m = Membership::new(1, 7, &[1, 2, 3], DEAD, 0);
        let key = (0..u64::MAX)
            .find(|&k| weight(k, 3) > weight(k, 1) && weight(k, 1) > weight(k, 2))
            .unwrap();
        // Node 2 has told nothing yet: no agreement.
        assert!(!m.agrees_i_own(2, key));
        // Node 2 counts node 3 alive: node 3 ranks first, not this node.
        let mut h = header(1, 100);
        h.dead = Some(vec![]);
        m.heard(10, 2, &h);
        assert!(!m.agrees_i_own(2, key));
        // Node 2 counts node 3 dead: this node ranks first by its view.
        h.dead = Some(vec![3]);
        m.heard(20, 2, &h);
        assert!(m.agrees_i_own(2, key));
        // A view too large to list, or one that counts this node dead, never agrees.
        h.dead = None;
        m.heard(30, 2, &h);
        assert!(!m.agrees_i_own(2, key));
        h.dead = Some(vec![1, 3]);
        m.heard(40, 2, &h);
        assert!(!m.agrees_i_own(2, key));
    }

    #[test]
    fn silence_kills_only_with_a_majority() {
        let mut m = Membership::new(1, 7, &[1, 2, 3], DEAD, 0);
        m.heard(DEAD, 2, &header(1, 100));
        assert!(m.check(DEAD + 50).contains(&Change::Down(3)));
        assert!(!m.is_alive(3));
        // Node 2 goes silent too: 1 of 3 is no majority, so nobody more is declared dead.
        assert!(m.check(10 * DEAD).is_empty());
        assert!(m.is_alive(2));
        // Node 3 is heard again.
        assert_eq!(m.heard(11 * DEAD, 3, &header(1, 5)), vec![Change::Up(3)]);
    }

    #[test]
    fn a_new_incarnation_is_a_restart_and_leaving_drops_at_once() {
        let mut m = Membership::new(1, 7, &[1, 2, 3], DEAD, 0);
        m.heard(10, 2, &header(1, 10));
        assert_eq!(m.heard(20, 2, &header(2, 20)), vec![Change::Restarted(2)]);
        let mut leaving = header(2, 30);
        leaving.leaving = true;
        assert_eq!(m.heard(30, 2, &leaving), vec![Change::Left(2)]);
        assert_eq!(m.alive_count(), 2);
        // A frame it sent before leaving, overtaken by the leaving one, brings it back
        // neither alive nor restarted; a new incarnation does.
        assert!(m.heard(31, 2, &header(2, 25)).is_empty());
        assert_eq!(m.alive_count(), 2);
        assert!(
            m.heard(40, 2, &header(3, 40))
                .contains(&Change::Restarted(2))
        );
        assert_eq!(m.alive_count(), 3);
    }

    #[test]
    fn the_majority_is_counted_over_the_members_that_did_not_leave() {
        let mut m = Membership::new(1, 7, &[1, 2, 3, 4, 5], DEAD, 0);
        for p in 2..=5 {
            m.heard(10, p, &header(1, 10));
        }
        let mut leaving = header(1, 20);
        leaving.leaving = true;
        for p in [3, 4, 5] {
            m.heard(20, p, &leaving);
        }
        // Two of the five configured, both of the two that stayed.
        assert_eq!(m.quorum_of(), 2);
        assert!(m.has_majority());
        assert!(m.check(30).is_empty());
        // A member that dies still counts: one of two is no majority.
        assert!(m.check(10 + DEAD).is_empty());
        assert!(!m.is_majority(1));
    }

    #[test]
    fn owners_are_spread_and_move_only_with_their_member() {
        let m = Membership::new(1, 1, &[1, 2, 3, 4], DEAD, 0);
        let owners: Vec<NodeId> = (0..4000u64).map(|k| m.owner_and_successor(k).0).collect();
        for id in 1..=4 {
            let n = owners.iter().filter(|&&o| o == id).count();
            assert!((800..1200).contains(&n), "node {id} owns {n}");
        }
        let mut smaller = m.clone();
        smaller.peers.get_mut(&4).unwrap().alive = false;
        smaller.refresh();
        for (k, &owner) in owners.iter().enumerate() {
            let (now, _) = smaller.owner_and_successor(k as u64);
            if owner != 4 {
                assert_eq!(now, owner, "key {k} moved");
            } else {
                // The successor takes over.
                assert_eq!(Some(now), m.owner_and_successor(k as u64).1);
            }
        }
    }

    #[test]
    fn headers_echo_the_newest_frame_and_confirm_ours() {
        let mut m = Membership::new(1, 1, &[1, 2], DEAD, 0);
        let mut from_2 = header(9, 500);
        from_2.echo = 40;
        m.heard(600, 2, &from_2);
        assert_eq!(m.peer(2).unwrap().confirmed, 40);
        let h = m.header(700, 2);
        assert_eq!((h.echo, h.held), (500, 100));
    }
}
