//! Who is in the cluster and alive, who owns a key, and what each frame's header says.
//!
//! - **Liveness.** Every frame from a peer counts as a heartbeat. A peer silent for half of
//!   `dead_after` is *suspected* and the suspicion is told to the members (and passed on to
//!   the suspect, which refutes it with a higher liveness counter that the members spread:
//!   a peer that only this node cannot hear stays alive). A peer silent for `dead_after`
//!   with no refutation is declared dead, but only by a node that still hears a majority
//!   (the side of a partition without a majority declares nobody dead). A member that leaves
//!   (drain) says so in its last frames and is dropped at once.
//! - **The majority** is counted over the live members as this node sees them: the members
//!   it heard (or was configured with) that did not leave and were not declared dead, plus
//!   the members a configured `cluster_size` promises beyond those it knows. Joins raise it,
//!   clean leaves and declared deaths lower it (`docs/overshoot.md` states the rule and what
//!   it costs under a partition).
//! - **Members learned from others** (`membership::rumors`): a member another
//!   member names is *pending* until this node hears it: no owner candidate, not counted,
//!   never declared dead by silence (forgotten when a member tells it dead or gone).
//! - **Ownership.** Rendezvous hashing over the live members: a key's *owner* is the live
//!   member with the highest weight for it, its *successor* the next one. Views that agree
//!   give every key one owner; a change moves only the keys of the member that came or went.
//! - **Headers.** Each frame to a peer echoes the newest frame received from it (clock
//!   samples, `mesh::timing`), and each frame from a peer echoes ours: the newest of our frames
//!   a peer confirms having received is what the authority lease of `mesh::node` checks.

mod ranking;
mod rumors;

use std::cell::Cell;
use std::collections::BTreeMap;
use std::net::SocketAddr;

use crate::clock::Nanos;
use crate::mesh::NodeId;
use crate::mesh::message::{Header, MAX_DEAD_LISTED, Member, MemberState};
use crate::mesh::timing::{Offset, PeerClock};
pub(crate) use ranking::RankMemo;
pub(crate) use ranking::mix;
pub use ranking::weight;
use ranking::{RANK_CACHE, Ranking, premix};

/// The most members a node keeps track of (itself included).
pub(crate) const MAX_MEMBERS: usize = 1024;

/// A member that left or was declared dead, and that this node was not configured with, is
/// forgotten after this long (10 minutes).
pub(crate) const FORGET_AFTER_NS: Nanos = 600_000_000_000;

/// One peer as this node sees it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Peer {
    /// Whether it counts as a live member (owner candidate, counted in the majority).
    pub alive: bool,
    /// Whether it announced that it leaves the cluster.
    pub left: bool,
    /// Learned from another member and not heard from yet: no owner candidate, not counted,
    /// never declared dead by silence.
    pub pending: bool,
    /// Listed in this node's configuration (never forgotten).
    pub configured: bool,
    /// Since when it is suspected (silent for half of `dead_after`), while it is.
    pub suspect_since: Option<Nanos>,
    /// When another member last passed on its refutation of a suspicion (local time).
    pub vouched_at: Nanos,
    /// Its liveness counter, the highest told.
    pub seq: u32,
    /// Where it is reached, as this node knows it (the transport's address; frames carry
    /// it as text: [`addr_to_wire`]).
    pub addr: Option<SocketAddr>,
    /// When it was learned, or last changed between alive, dead and left (local time).
    pub since: Nanos,
    /// Local time of its newest frame (or of this node's start, before any; 0 while
    /// pending).
    pub heard_at: Nanos,
    /// Local time of the last frame received from it (0: none yet). Unlike `heard_at`, never
    /// set by this node's start or the end of a cut: the majority an authority lease needs
    /// is of members actually heard.
    pub frame_at: Nanos,
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
    /// Its lag score, as its newest frame said (at most [`MAX_LAG_SCORE`]).
    pub lag: u32,
}

/// What changed in a membership update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// A peer was declared dead.
    Down(NodeId),
    /// A peer that was dead (or never heard) is alive.
    Up(NodeId),
    /// A peer restarted (new incarnation): whatever it held is gone.
    Restarted(NodeId),
    /// A peer left the cluster.
    Left(NodeId),
    /// A peer went silent long enough to be suspected (it is still a member).
    Suspected(NodeId),
    /// Another member named a peer this node did not know (pending until heard: the
    /// transport should reach it).
    Learned(NodeId),
    /// A peer was dropped from the table (gone for long, or pending and told gone).
    Forgotten(NodeId),
}

/// This node's view of the cluster.
#[derive(Debug, Clone)]
pub(crate) struct Membership {
    me: NodeId,
    incarnation: u64,
    /// This node's liveness counter (raised to refute a suspicion).
    seq: u32,
    /// Members a configured cluster size promises beyond those known: counted in the
    /// majority until members fill them.
    phantoms: usize,
    peers: BTreeMap<NodeId, Peer>,
    dead_after_ns: Nanos,
    version: u64,
    leaving: bool,
    syncing: bool,
    /// The digest of this node's configuration, sent in every header.
    digest: u64,
    /// It heard less than a majority at its last check.
    cut_off: bool,
    /// What this node tells every live peer for the next few rounds: members that came,
    /// were suspected, refuted, died or left (with the rounds left to tell each).
    news: Vec<(Member, u8)>,
    /// How far behind this node itself runs (0 to [`MAX_LAG_SCORE`]): each late round
    /// raises it, eight rounds on time in a row lower it by one. Each point adds half of
    /// `dead_after` to the silence after which this node declares a peer dead.
    lag_score: u32,
    /// Rounds on time since the score last changed.
    on_time: u32,
    /// The live members, this node first, each with its id's half of the rendezvous weight
    /// ([`premix`]): what [`Membership::ranked`] ranks. Rebuilt by [`Membership::reindex`]
    /// whenever a peer comes, goes, dies, revives or leaves.
    live: Vec<(u64, NodeId)>,
    /// Raised whenever the members or the majority's size change (not when a frame is
    /// heard): what the cached instant of [`Membership::majority_heard_at`] was computed
    /// among.
    stamp: u64,
    /// The last instant [`Membership::majority_heard_at`] computed: (stamp, lease, until).
    /// Frames only move members' `frame_at` later, so while the stamp holds it is a lower
    /// bound of the instant computed afresh.
    heard_until: Cell<(u64, Nanos, Nanos)>,
    /// The peers that did not leave and are not alive (dead or pending), premixed: with the
    /// live members, every peer [`Membership::agrees_i_own`] looks through.
    dormant: Vec<(u64, NodeId)>,
    /// Raised whenever the live members change: what [`Membership::rank_cache`] entries
    /// were ranked among.
    live_version: u64,
    /// The latest rankings, by key (a request's key is ranked several times in a row, on
    /// the request and in the rounds that follow).
    rank_cache: Box<[Cell<Ranking>]>,
}

/// The highest lag score: a node that runs late waits up to five times `dead_after` before it
/// declares a peer dead.
pub(crate) const MAX_LAG_SCORE: u32 = 8;

/// A member's address as frames carry it ([`Member::addr`]): its text (`"10.0.0.7:7000"`,
/// `"[fd00::7]:7000"`), empty when not known.
pub(crate) fn addr_to_wire(addr: Option<SocketAddr>) -> Vec<u8> {
    addr.map(|a| a.to_string().into_bytes()).unwrap_or_default()
}

/// A member's address from a frame: `None` when empty or not an address.
pub(crate) fn addr_from_wire(bytes: &[u8]) -> Option<SocketAddr> {
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

impl Membership {
    /// Start a view at `now`: `members` (this node may be among them) all count as alive
    /// until they stay silent for `dead_after_ns`.
    pub(crate) fn new(
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
                    configured: true,
                    heard_at: now,
                    since: now,
                    ..Peer::default()
                },
            );
        }
        let mut m = Membership {
            me,
            incarnation,
            seq: 0,
            phantoms: 0,
            peers,
            dead_after_ns,
            version: 1,
            leaving: false,
            syncing: false,
            digest: 0,
            cut_off: false,
            news: Vec::new(),
            lag_score: 0,
            on_time: 0,
            live: Vec::new(),
            stamp: 0,
            heard_until: Cell::new((u64::MAX, 0, 0)),
            dormant: Vec::new(),
            live_version: 0,
            rank_cache: (0..RANK_CACHE).map(|_| Cell::new(Ranking::NONE)).collect(),
        };
        m.reindex();
        m
    }

    /// Rebuild the lists ranking reads ([`Membership::ranked`],
    /// [`Membership::agrees_i_own`]) from the peer table.
    fn reindex(&mut self) {
        self.stamp += 1;
        self.live_version += 1;
        self.dormant.clear();
        self.dormant.extend(
            self.peers
                .iter()
                .filter(|(_, p)| !p.left && !p.alive)
                .map(|(&id, _)| (premix(id), id)),
        );
        self.live.clear();
        self.live.push((premix(self.me), self.me));
        self.live.extend(
            self.peers
                .iter()
                .filter(|(_, p)| p.alive)
                .map(|(&id, _)| (premix(id), id)),
        );
    }

    /// Return this node's incarnation.
    pub(crate) fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// Return this node's liveness counter (raised each time it refutes a suspicion).
    pub(crate) fn seq(&self) -> u32 {
        self.seq
    }

    /// Return a number that changes whenever the set of live members changes.
    pub(crate) fn version(&self) -> u64 {
        self.version
    }

    /// Return the peers.
    pub(crate) fn peers(&self) -> &BTreeMap<NodeId, Peer> {
        &self.peers
    }

    /// Return peer `id`.
    pub(crate) fn peer(&self, id: NodeId) -> Option<&Peer> {
        self.peers.get(&id)
    }

    /// Count a majority over at least `size` members: a cluster configured larger than the
    /// members this node knows of (the members it learns later fill the difference).
    pub(crate) fn set_configured(&mut self, size: usize) {
        self.phantoms = size.saturating_sub(1 + self.peers.len());
        self.stamp += 1;
    }

    /// Return the number of members this node knows of (itself, its peers in any state, and
    /// the members a configured cluster size promises beyond them).
    pub(crate) fn configured(&self) -> usize {
        1 + self.phantoms + self.peers.len()
    }

    /// Return the number of members a majority is counted over: this node, the live members
    /// (a suspected one still counts), and the members a configured cluster size promises
    /// beyond those known. A member that left or was declared dead no longer counts; one
    /// learned from others counts once heard.
    pub(crate) fn quorum_of(&self) -> usize {
        self.phantoms + self.live.len()
    }

    /// Tell whether `heard` members (this node included) are a majority.
    pub(crate) fn is_majority(&self, heard: usize) -> bool {
        heard * 2 > self.quorum_of()
    }

    /// Return the number of live members (this node included).
    pub(crate) fn alive_count(&self) -> usize {
        self.live.len()
    }

    /// Return until when (local time, exclusive) this node will have received frames from a
    /// majority of the members within `lease` before it, with what it heard so far: members
    /// that left and those never heard do not count. 0 if never; `Nanos::MAX` if this node
    /// alone is a majority.
    pub(crate) fn majority_heard_until(&self, lease: Nanos) -> Nanos {
        // A majority is this node and `needed` peers: 2 (1 + needed) > quorum.
        let needed = self.quorum_of() / 2;
        if needed == 0 {
            Nanos::MAX
        } else {
            let mut heard: Vec<Nanos> = self
                .peers
                .values()
                .filter(|p| !p.left && p.frame_at > 0)
                .map(|p| p.frame_at)
                .collect();
            if heard.len() < needed {
                0
            } else {
                let (_, nth, _) = heard.select_nth_unstable_by(needed - 1, |a, b| b.cmp(a));
                nth.saturating_add(lease)
            }
        }
    }

    /// Tell whether this node received frames from a majority of the members within `lease`
    /// before `now` (`now < majority_heard_until(lease)`), counting the peers only when the
    /// instant last computed has passed.
    pub(crate) fn majority_heard_at(&self, now: Nanos, lease: Nanos) -> bool {
        let (stamp, cached_lease, until) = self.heard_until.get();
        if stamp == self.stamp && cached_lease == lease && now < until {
            return true;
        }
        let until = self.majority_heard_until(lease);
        self.heard_until.set((self.stamp, lease, until));
        now < until
    }

    /// Tell whether this node heard a majority of the members at its last check (it may
    /// declare deaths, and its authorities may grant).
    pub(crate) fn has_majority(&self) -> bool {
        !self.cut_off && self.is_majority(self.alive_count())
    }

    /// Tell whether `id` is a live member (this node always is).
    pub(crate) fn is_alive(&self, id: NodeId) -> bool {
        id == self.me || self.peers.get(&id).is_some_and(|p| p.alive)
    }

    /// Mark this node as leaving: its headers say so from now on.
    pub(crate) fn leave(&mut self) {
        self.leaving = true;
    }

    /// Tell whether this node is leaving the cluster.
    pub(crate) fn is_leaving(&self) -> bool {
        self.leaving
    }

    /// Tell whether `id` answers at `now`: this node, or a live member heard since this
    /// node started and within the last quarter of `dead_after` (every live peer sends a
    /// frame every round). A key's state sent to a member that does not may be lost with
    /// it: it may have died a moment ago.
    pub(crate) fn is_responsive(&self, id: NodeId, now: Nanos) -> bool {
        id == self.me
            || self.peers.get(&id).is_some_and(|p| {
                p.alive
                    && !p.left
                    && p.incarnation.is_some()
                    && now.saturating_sub(p.heard_at) < self.dead_after_ns / 4
            })
    }

    /// The live members by rendezvous weight for `key`, highest first (all of them).
    pub(crate) fn ranked_all(&self, key: u64) -> Vec<NodeId> {
        let mut ranked: Vec<(u64, NodeId)> = self
            .live
            .iter()
            .map(|&(pre, id)| (mix(key ^ pre), id))
            .collect();
        ranked.sort_unstable_by(|a, b| b.cmp(a));
        ranked.into_iter().map(|(_, id)| id).collect()
    }

    /// Tell whether `id`'s run `incarnation` is a live member's: this node's own run, or a
    /// peer counted alive whose incarnation is that one (or not heard yet). A holding of any
    /// other run is over.
    pub(crate) fn is_live_run(&self, id: NodeId, incarnation: u64) -> bool {
        if id == self.me {
            return incarnation == self.incarnation;
        }
        self.peers
            .get(&id)
            .is_some_and(|p| p.alive && !p.left && p.incarnation.is_none_or(|i| i == incarnation))
    }

    /// Mark this node as syncing (its headers ask peers for what it should hold) or not.
    pub(crate) fn set_syncing(&mut self, syncing: bool) {
        self.syncing = syncing;
    }

    /// Set the digest of this node's configuration that its headers carry.
    pub(crate) fn set_digest(&mut self, digest: u64) {
        self.digest = digest;
    }

    /// Add a member that reached this node at `now` (an authenticated connection), with the
    /// address it is reached at: it counts as alive until silent. A member known already
    /// keeps its state (a pending one is alive now). Return what changed.
    pub(crate) fn add(&mut self, id: NodeId, addr: Option<SocketAddr>, now: Nanos) -> Vec<Change> {
        let mut changes = Vec::new();
        if id == self.me {
            return changes;
        }
        if let Some(peer) = self.peers.get_mut(&id) {
            if addr.is_some() {
                peer.addr = addr;
            }
            if peer.pending {
                peer.pending = false;
                peer.alive = true;
                peer.heard_at = now;
                peer.since = now;
                self.phantoms = self.phantoms.saturating_sub(1);
                self.version += 1;
                changes.push(Change::Up(id));
                self.reindex();
            }
            return changes;
        }
        if self.peers.len() + 1 >= MAX_MEMBERS {
            return changes;
        }
        self.peers.insert(
            id,
            Peer {
                alive: true,
                heard_at: now,
                since: now,
                addr,
                ..Peer::default()
            },
        );
        self.phantoms = self.phantoms.saturating_sub(1);
        self.version += 1;
        self.reindex();
        self.tell(Member {
            id,
            incarnation: 0,
            seq: 0,
            state: MemberState::Alive,
            addr: addr_to_wire(addr),
        });
        changes.push(Change::Up(id));
        changes
    }

    /// Record a frame's header from `from` at `now`; return what changed.
    pub(crate) fn heard(&mut self, now: Nanos, from: NodeId, header: &Header) -> Vec<Change> {
        let mut changes = Vec::new();
        let Some(peer) = self.peers.get_mut(&from) else {
            return changes;
        };
        let standing = (peer.alive, peer.left);
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
            peer.seq = 0;
            changes.push(Change::Restarted(from));
        }
        if std::mem::take(&mut peer.pending) {
            // A member learned from others, heard at last: it fills a promised place.
            self.phantoms = self.phantoms.saturating_sub(1);
            self.stamp += 1;
        }
        peer.suspect_since = None;
        peer.incarnation = Some(header.incarnation);
        peer.lag = u32::from(header.lag).min(MAX_LAG_SCORE);
        peer.heard_at = now;
        peer.frame_at = now;
        peer.clock
            .observe(now, header.sent_at, header.echo, header.held);
        if header.echo <= now {
            peer.confirmed = peer.confirmed.max(header.echo);
        }
        if peer.last_received.is_none_or(|(t, _)| header.sent_at >= t) {
            peer.last_received = Some((header.sent_at, now));
            // The view of its newest frame: a frame overtaken on the way tells an older one.
            peer.their_dead.clone_from(&header.dead);
        }
        peer.my_deaths = peer.my_deaths.max(header.your_deaths);
        if header.leaving {
            if !peer.left {
                peer.left = true;
                peer.alive = false;
                peer.since = now;
                self.version += 1;
                changes.push(Change::Left(from));
                self.tell_state(from, MemberState::Left);
            }
        } else {
            if peer.left {
                // It came back after leaving (a restart with the same id).
                peer.left = false;
            }
            if !peer.alive {
                peer.alive = true;
                peer.since = now;
                self.version += 1;
                changes.push(Change::Up(from));
            }
        }
        if self.peers.get(&from).map(|p| (p.alive, p.left)) != Some(standing) {
            self.reindex();
        }
        changes
    }

    /// Note how late this node's round began (`late`, for rounds of `interval`): a node that
    /// itself runs behind (a starved process, an overloaded machine) may not have read what
    /// its peers sent, so it waits longer before it declares one dead (the local health of
    /// SWIM's Lifeguard extension). Declaring later is always safe: an owner's authority
    /// lease lapses before the shortest silence, `dead_after`, ends.
    pub(crate) fn round_late(&mut self, late: Nanos, interval: Nanos) {
        if late > interval / 4 {
            self.lag_score = (self.lag_score + 1).min(MAX_LAG_SCORE);
            self.on_time = 0;
        } else {
            self.on_time += 1;
            if self.on_time >= 8 {
                self.lag_score = self.lag_score.saturating_sub(1);
                self.on_time = 0;
            }
        }
    }

    /// Return this node's lag score (0: its rounds run on time; see
    /// [`Membership::round_late`]).
    pub(crate) fn lag_score(&self) -> u32 {
        self.lag_score
    }

    /// Return the silence after which this node declares a peer whose lag score is
    /// `peer_lag` dead now: `dead_after`, plus half of it per point of the higher of the two
    /// lag scores (this node's, and the peer's as its last frame said: a peer that runs
    /// behind may go quiet for longer without being dead).
    pub(crate) fn patience_ns(&self, peer_lag: u32) -> Nanos {
        let lag = self.lag_score.max(peer_lag.min(MAX_LAG_SCORE));
        self.dead_after_ns
            .saturating_add(u64::from(lag) * (self.dead_after_ns / 2))
    }

    /// This node did not run for `ns` before `now`: what its peers said meanwhile may have been
    /// lost on the way in, so their silence counts from `ns` later (at most from `now`).
    pub(crate) fn paused(&mut self, ns: Nanos, now: Nanos) {
        for p in self.peers.values_mut() {
            p.heard_at = p.heard_at.saturating_add(ns).min(now);
        }
    }

    /// Declare dead the peers silent for `dead_after` at `now` (only with a majority alive),
    /// suspect those silent for half of it, and forget the members gone for long.
    ///
    /// A node that heard less than a majority within `dead_after` (it was cut off) declares
    /// nobody dead; when it hears a majority again, the silence of the others counts from
    /// then: they may simply not have reached it yet, and declaring them dead would make it
    /// take over keys that a live owner still keeps.
    pub(crate) fn check(&mut self, now: Nanos) -> Vec<Change> {
        let mut changes = Vec::new();
        self.forget_gone(now, &mut changes);
        if !changes.is_empty() {
            self.reindex();
        }
        // Only peers heard in the last half of `dead_after` count: on a real cut every peer
        // goes silent within a round of the others, so a node on the small side cannot
        // count as alive those it heard just before the cut.
        let fresh = self.dead_after_ns / 2;
        let heard = 1 + self
            .peers
            .values()
            .filter(|p| !p.left && !p.pending && now.saturating_sub(p.heard_at) < fresh)
            .count();
        if !self.is_majority(heard) {
            self.cut_off = true;
            return changes;
        }
        if self.cut_off {
            self.cut_off = false;
            for p in self.peers.values_mut().filter(|p| !p.pending) {
                p.heard_at = p.heard_at.max(now);
            }
            return changes;
        }
        // Suspicion: a live peer silent for half of `dead_after` (and not vouched for since)
        // is told about, so that it can refute through any member that still hears it.
        let suspects: Vec<NodeId> = self
            .peers
            .iter()
            .filter(|(_, p)| {
                p.alive
                    && p.suspect_since.is_none()
                    && now.saturating_sub(p.heard_at.max(p.vouched_at)) >= fresh
            })
            .map(|(&id, _)| id)
            .collect();
        for id in suspects {
            let peer = self.peers.get_mut(&id).expect("listed above");
            peer.suspect_since = Some(now);
            changes.push(Change::Suspected(id));
            self.tell_state(id, MemberState::Suspect);
        }
        let silent: Vec<NodeId> = self
            .peers
            .iter()
            .filter(|(_, p)| {
                p.alive
                    && now.saturating_sub(p.heard_at.max(p.vouched_at)) >= self.patience_ns(p.lag)
            })
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
            peer.suspect_since = None;
            peer.since = now;
            peer.deaths += 1;
            changes.push(Change::Down(id));
            self.tell_state(id, MemberState::Dead);
        }
        self.version += 1;
        self.reindex();
        changes
    }

    /// Drop the members not configured that left or died `FORGET_AFTER_NS` ago.
    fn forget_gone(&mut self, now: Nanos, changes: &mut Vec<Change>) {
        let gone: Vec<NodeId> = self
            .peers
            .iter()
            .filter(|(_, p)| {
                !p.configured
                    && !p.alive
                    && !p.pending
                    && now.saturating_sub(p.since.max(p.heard_at)) >= FORGET_AFTER_NS
            })
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            self.peers.remove(&id);
            changes.push(Change::Forgotten(id));
        }
    }

    /// Build the header of a frame to `to`, sent at `now`.
    pub(crate) fn header(&mut self, now: Nanos, to: NodeId) -> Header {
        let (echo, held, your_deaths, to_incarnation) = match self.peers.get_mut(&to) {
            Some(peer) => {
                peer.sent_at = now;
                let (echo, held) = peer
                    .last_received
                    .map_or((0, 0), |(sent, at)| (sent, now.saturating_sub(at)));
                (echo, held, peer.deaths, peer.incarnation.unwrap_or(0))
            }
            None => (0, 0, 0, 0),
        };
        // The dead are among the dormant: no walk over every peer for each frame.
        let dead: Vec<NodeId> = self
            .dormant
            .iter()
            .map(|&(_, id)| id)
            .filter(|id| self.peers.get(id).is_some_and(|p| !p.pending))
            .collect();
        debug_assert_eq!(
            dead,
            self.peers
                .iter()
                .filter(|(_, p)| !p.alive && !p.left && !p.pending)
                .map(|(&id, _)| id)
                .collect::<Vec<_>>(),
            "the dormant list follows the peer table"
        );
        Header {
            incarnation: self.incarnation,
            to_incarnation,
            sent_at: now,
            echo,
            held,
            your_deaths,
            syncing: self.syncing,
            leaving: self.leaving,
            dead: (dead.len() <= MAX_DEAD_LISTED).then_some(dead),
            digest: self.digest,
            lag: u8::try_from(self.lag_score).unwrap_or(u8::MAX),
        }
    }

    /// Return the clock offset of peer `id` at `now`, once measured.
    pub(crate) fn offset(&self, id: NodeId, now: Nanos) -> Option<Offset> {
        if id == self.me {
            return Some(Offset {
                offset: 0,
                error: 0,
                round_trip: 0,
            });
        }
        self.peers.get(&id)?.clock.offset(now)
    }
}

#[cfg(test)]
mod tests;
