//! The sans-IO gossip state machine of one node: no sockets, no clock, no threads.
//!
//! Inputs carry `now` (this node's clock, in ns): [`Node::decide`] (a request),
//! [`Node::handle_frame`] (bytes from a peer), [`Node::handle_timeout`] (a round tick).
//! Outputs are polled: [`Node::poll_transmit`], [`Node::poll_timeout`], [`Node::poll_event`].
//!
//! Time is cut into rounds of one gossip interval (`round = floor(now / interval)`). At each
//! round's tick a node
//! 1. updates its membership view (a member silent for `dead_after_rounds` is declared dead,
//!    but only by a node that still sees a majority of the members alive);
//! 2. runs the release step on every key that is not settled ([`share::next_share`] without
//!    claims: a share goes down when another member is short, or when the shares together
//!    exceed the budget) and announces what changed;
//! 3. sends each peer a delta of what changed since the round the peer last confirmed.
//!
//! Its *claim step* for the round runs once every live member's announcements of the round
//! have arrived complete, all report the same membership digest and the peers acknowledged
//! this node's previous round: claims split the room among the short members, so the
//! claims of a round never sum above it.
//!
//! A starting (or restarted) node first asks its peers for snapshots and admits nothing
//! until a majority of the members answered: it gets its own counts and shares back, counts
//! the claims its peers may not have seen as used (windows), empties its buckets, and starts
//! from a zero share if the cluster released its share while it was away.
//!
//! The request path is [`MeshCell::decide`]: one compare-and-swap on the key's cell, which
//! the round updates with another. See `docs/overshoot.md` for the bound this guarantees.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use crate::clock::Nanos;
use crate::decision::Decision;
use crate::mesh::NodeId;
use crate::mesh::cell::{MAX_MESH_WINDOW_LIMIT, MeshCell, MeshKind};
use crate::mesh::counter::GCounter;
use crate::mesh::message::{Announce, Delta, Frame, KeyUpdate, RoundHeader, Snapshot};
use crate::mesh::share::{self, Announced, ONE, Share, ShareRules, share_for, tokens_of};
use crate::mesh::wire::{self, MAX_FRAME_BYTES, WireError};
use crate::policy::Policy;

/// How many of a node's claim steps its peers may not know of when it stops: a node claims
/// at step `r` only when every peer acknowledged its announcements up to round `r - 1`,
/// which carry its claims up to step `r - 2`.
pub const UNSEEN_CLAIM_STEPS: u64 = 2;

/// How many rounds (or windows) ahead of this node's clock a peer's frame may be; further
/// is refused (a peer's clock that ran away must not pin this node's view of it).
pub const MAX_ROUNDS_AHEAD: u64 = 3;

/// How a node decides admission. Only [`Admission::Shares`] is bounded; the others are the
/// baselines the simulator compares it with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Admission {
    /// Budget shares that follow demand (the bounded rule).
    #[default]
    Shares,
    /// Every node enforces the full limit alone (up to N times the limit).
    LocalOnly,
    /// Every node enforces `limit / cluster_size` (under-uses skewed traffic).
    StaticSplit,
    /// Admit while the last-known global sum is under the limit (the naive rule).
    StaleSum,
}

/// A node's configuration.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// This node.
    pub id: NodeId,
    /// The members it starts with (its seeds); it may include `id`.
    pub seeds: Vec<NodeId>,
    /// The most members the cluster has; a key's budget starts split evenly among them.
    pub cluster_size: usize,
    /// The gossip interval in ns (one round).
    pub gossip_interval_ns: Nanos,
    /// Rounds of silence after which a member is declared dead.
    pub dead_after_rounds: u64,
    /// The least share of every live member, as a fraction of the budget.
    pub floor_fraction: f64,
    /// The most a node adds to its share in one round, as a fraction of the budget.
    pub max_claim_fraction: f64,
    /// How long a starting node waits for a majority's snapshots before it runs without
    /// them, in ns. `None` (the default) waits for ever: a node cut off from the majority
    /// then admits nothing, which keeps the declared bound; a timeout trades the bound for
    /// availability (such a node may admit up to the even share on top of the limit).
    pub recover_timeout_ns: Option<Nanos>,
    /// The largest delta datagram, in bytes.
    pub max_datagram_bytes: usize,
    /// The rule of admission.
    pub admission: Admission,
    /// The most keys a node holds; frames that would add more are refused.
    pub max_keys: usize,
    /// The cluster's global policies, indexed by position (the same list on every node).
    pub policies: Vec<Policy>,
}

impl NodeConfig {
    /// A configuration with the defaults for `id` among `seeds`.
    pub fn new(id: NodeId, seeds: Vec<NodeId>, policies: Vec<Policy>) -> Self {
        let cluster_size = seeds
            .iter()
            .chain(std::iter::once(&id))
            .collect::<BTreeSet<_>>()
            .len();
        NodeConfig {
            id,
            seeds,
            cluster_size,
            gossip_interval_ns: 20_000_000,
            dead_after_rounds: 10,
            floor_fraction: 0.002,
            max_claim_fraction: 0.1,
            recover_timeout_ns: None,
            max_datagram_bytes: 1150,
            admission: Admission::Shares,
            max_keys: 1_000_000,
            policies,
        }
    }
}

/// Why a node could not be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MeshError {
    /// A policy the mesh cannot share.
    #[error(
        "policy {index}: the mesh shares token buckets, GCRA, fixed and sliding windows, not {algorithm}"
    )]
    UnsupportedAlgorithm {
        /// The policy's index.
        index: usize,
        /// Its algorithm.
        algorithm: &'static str,
    },
    /// A window limit above what the cell holds.
    #[error("policy {index}: a mesh window limit is at most {MAX_MESH_WINDOW_LIMIT}, got {limit}")]
    LimitTooLarge {
        /// The policy's index.
        index: usize,
        /// Its limit.
        limit: u64,
    },
    /// A setting out of range.
    #[error("{field}: {reason}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
}

/// Bytes for one peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// The peer.
    pub to: NodeId,
    /// One frame.
    pub bytes: Vec<u8>,
    /// Send on a stream (snapshots) rather than as a datagram (deltas).
    pub reliable: bool,
}

/// Something the driver may want to know or log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A member unknown so far was learned from a peer.
    Discovered(NodeId),
    /// A member was declared dead.
    PeerDown(NodeId),
    /// A member declared dead was heard again.
    PeerUp(NodeId),
    /// The node got its state back and admits again.
    Recovered,
    /// An idle key was forgotten: a driver that keeps the key's cell must drop it too.
    KeyForgotten {
        /// The policy index.
        policy: u32,
        /// The key's hash.
        key: u64,
    },
}

/// Counters about the node's gossip.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeStats {
    /// Rounds run.
    pub rounds: u64,
    /// Rounds whose view was complete and consistent (claims allowed).
    pub consistent_rounds: u64,
    /// Frames sent.
    pub frames_sent: u64,
    /// Bytes sent.
    pub bytes_sent: u64,
    /// Frames received and applied.
    pub frames_received: u64,
    /// Frames refused (malformed, oversized, wrong version, invalid content, unknown peer).
    pub frames_dropped: u64,
    /// Snapshots sent.
    pub snapshots_sent: u64,
}

/// Why a frame was refused. Nothing it carried was applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The bytes do not decode.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// The sender is this node or not a member and the cluster is full.
    #[error("frame from node {0}, which is not a member")]
    UnknownPeer(NodeId),
    /// The content is out of range.
    #[error("invalid frame content: {0}")]
    Invalid(&'static str),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Alive,
    Dead { since_round: u64 },
}

#[derive(Debug, Clone)]
struct Peer {
    status: Status,
    last_heard: Nanos,
    /// The highest round of this peer whose changes we hold completely.
    complete: u64,
    /// The highest round seen in a header (headers of older rounds are ignored).
    header_round: u64,
    digest: u64,
    previous_digest: u64,
    /// The highest round of ours this peer holds completely (from its headers).
    their_ack: u64,
    /// Delta parts seen for `parts_round`.
    parts_round: u64,
    parts_seen: u64,
    /// Snapshot parts seen for `snapshot_round`.
    snapshot_round: u64,
    snapshot_parts: BTreeSet<u16>,
    /// It came back after its share was released: it must not recover that share.
    released_when_back: bool,
    /// The round of our last delta to it.
    sent_through: u64,
}

impl Peer {
    fn new(now: Nanos) -> Self {
        Peer {
            status: Status::Alive,
            last_heard: now,
            complete: 0,
            header_round: 0,
            digest: 0,
            previous_digest: 0,
            their_ack: 0,
            parts_round: 0,
            parts_seen: 0,
            snapshot_round: 0,
            snapshot_parts: BTreeSet::new(),
            released_when_back: false,
            sent_through: 0,
        }
    }

    fn digest_as_of(&self, round: u64) -> Option<u64> {
        if self.header_round == round {
            Some(self.digest)
        } else if self.header_round == round + 1 {
            Some(self.previous_digest)
        } else {
            None
        }
    }
}

/// How keys first seen in the hold after a restart start.
#[derive(Debug, Clone, Copy)]
struct Restart {
    until_round: u64,
    /// 0 when the cluster released this node's share while it was away, else the even share.
    initial_share: Share,
    /// The share a window key counts as already used (claims no peer may have seen).
    charge_share: Share,
}

/// What a member announced for a key, with the value before its last change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct History {
    changed: u64,
    now: Announce,
    before: Announce,
}

impl History {
    fn fresh(default: Announce) -> Self {
        History {
            changed: 0,
            now: default,
            before: default,
        }
    }

    /// Return the announcement in effect in `round`, its demand decayed to that round (the
    /// value before the last change is kept as of the round before it).
    fn as_of(&self, round: u64) -> Option<Announce> {
        if round >= self.changed {
            Some(Announce {
                demand: share::decayed(self.now.demand, round - self.changed),
                ..self.now
            })
        } else if round + 1 == self.changed {
            Some(self.before)
        } else {
            None
        }
    }
}

#[derive(Debug)]
struct KeyState {
    cell: Arc<MeshCell>,
    /// This node's demand average, in sixteenths of a token per round.
    demand: u32,
    own: History,
    /// The last round in which anything we gossip about this key changed.
    changed_round: u64,
    sent_counts: (u64, u64, u64),
    peers: Vec<(NodeId, History)>,
    /// The share in effect (a claim changes it between two announcements).
    current_share: Share,
    /// A bucket's count slot: `(index, admitted total at its start, previous slot's count)`.
    bucket_slot: (u64, u64, u64),
    /// A bucket's admitted total at the last round.
    last_admitted: u64,
    /// Nothing to do until this key is offered a request or a peer updates it: its last
    /// round changed nothing, nobody was short and the shares fit.
    settled: bool,
    /// G-counters of admitted cost per window (the two latest), one entry per node.
    counts: Vec<(u64, GCounter)>,
}

impl KeyState {
    fn peer(&self, id: NodeId) -> Option<&History> {
        self.peers
            .binary_search_by_key(&id, |(n, _)| *n)
            .ok()
            .map(|i| &self.peers[i].1)
    }

    fn peer_mut(&mut self, id: NodeId, default: Announce) -> &mut History {
        let i = match self.peers.binary_search_by_key(&id, |(n, _)| *n) {
            Ok(i) => i,
            Err(i) => {
                self.peers.insert(i, (id, History::fresh(default)));
                i
            }
        };
        &mut self.peers[i].1
    }

    fn counter_mut(&mut self, window: u64) -> &mut GCounter {
        let i = match self.counts.iter().position(|(w, _)| *w == window) {
            Some(i) => i,
            None => {
                self.counts.push((window, GCounter::new()));
                self.counts.sort_by_key(|(w, _)| *w);
                self.counts.len() - 1
            }
        };
        let i = self
            .counts
            .iter()
            .position(|(w, _)| *w == window)
            .unwrap_or(i);
        &mut self.counts[i].1
    }

    fn counter(&self, window: u64) -> Option<&GCounter> {
        self.counts
            .iter()
            .find(|(w, _)| *w == window)
            .map(|(_, c)| c)
    }
}

#[derive(Debug)]
enum Phase {
    Recovering {
        since: Nanos,
        answered: BTreeSet<NodeId>,
        /// Per key: the most any peer knew of our counts and share.
        found: BTreeMap<(u32, u64), KeyUpdate>,
        /// The latest round of ours that some peer held completely.
        best_ack: u64,
        /// Some peer had released our share while we were away.
        released: bool,
    },
    Running,
}

/// The membership as of one round: who is alive, who is dead and still holds a share.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct View {
    alive: Vec<NodeId>,
    /// Dead members whose share is still held, with the most they may have claimed in
    /// rounds this node did not hear of.
    held: Vec<(NodeId, Share)>,
}

/// One node of the mesh (sans-IO).
#[derive(Debug)]
pub struct Node {
    config: NodeConfig,
    kinds: Vec<MeshKind>,
    /// The share rules of each policy. A bucket's claims are not limited per round: its
    /// restart is safe without it (it restarts empty), and released tokens must find a
    /// bucket large enough to take them.
    rules: Vec<ShareRules>,
    /// The most a window node may add to its share in one round.
    max_claim: Share,
    default_share: Share,
    hold_rounds: u64,
    /// Rounds for which a node's admissions still count (windows: two windows; buckets:
    /// the refill time): the restart rules apply that long.
    memory_rounds: u64,
    round: u64,
    /// The last round whose claim step ran.
    claimed_round: u64,
    /// After a restart: until which round new window keys are charged, at which share.
    restart: Option<Restart>,
    /// The latest `now` this node was given (for keys created by peers' frames).
    last_now: Nanos,
    phase: Phase,
    peers: BTreeMap<NodeId, Peer>,
    keys: BTreeMap<(u32, u64), KeyState>,
    digests: [u64; 2],
    view_previous: View,
    outbox: VecDeque<Transmit>,
    events: VecDeque<Event>,
    stats: NodeStats,
    scratch_live: Vec<Announced>,
    scratch_targets: Vec<Share>,
}

impl Node {
    /// Start a node at `now`: it asks its seeds for snapshots and admits once it has them.
    pub fn new(config: NodeConfig, now: Nanos) -> Result<Node, MeshError> {
        if config.gossip_interval_ns == 0 {
            return Err(MeshError::Invalid {
                field: "gossip_interval_ns",
                reason: "must be positive",
            });
        }
        if config.cluster_size == 0 || config.cluster_size > 1024 {
            return Err(MeshError::Invalid {
                field: "cluster_size",
                reason: "must be between 1 and 1024",
            });
        }
        let mut kinds = Vec::with_capacity(config.policies.len());
        let mut hold_ns: Nanos = 0;
        let mut memory_ns: Nanos = 0;
        for (index, policy) in config.policies.iter().enumerate() {
            let kind = MeshKind::of(policy).ok_or(MeshError::UnsupportedAlgorithm {
                index,
                algorithm: policy.algorithm().name(),
            })?;
            if kind != MeshKind::Bucket && policy.capacity() > MAX_MESH_WINDOW_LIMIT {
                return Err(MeshError::LimitTooLarge {
                    index,
                    limit: policy.capacity(),
                });
            }
            if kind != MeshKind::Bucket {
                hold_ns = hold_ns.max(2 * policy.window_ns());
            }
            // How long what a node admitted still matters: two windows, or a bucket's
            // refill time.
            memory_ns = memory_ns.max(if kind == MeshKind::Bucket {
                policy.window_ns()
            } else {
                2 * policy.window_ns()
            });
            kinds.push(kind);
        }
        let default_share = ONE / config.cluster_size as Share;
        let floor = share::from_fraction(config.floor_fraction).min(default_share);
        let max_claim = share::from_fraction(config.max_claim_fraction).max(1);
        let g = u128::from(config.gossip_interval_ns);
        let rules = config
            .policies
            .iter()
            .zip(&kinds)
            .map(|(p, kind)| {
                let (max_claim, round_budget) = match kind {
                    MeshKind::Bucket => (ONE, 16 * g / u128::from(p.interval_ns())),
                    _ => (
                        max_claim,
                        16 * u128::from(p.capacity()) * g / u128::from(p.window_ns()),
                    ),
                };
                ShareRules {
                    floor,
                    max_claim,
                    round_budget: round_budget.clamp(1, u128::from(u64::MAX)) as u64,
                }
            })
            .collect();
        let mut peers = BTreeMap::new();
        for &seed in &config.seeds {
            if seed != config.id && peers.len() + 1 < config.cluster_size {
                peers.insert(seed, Peer::new(now));
            }
        }
        let round = now / config.gossip_interval_ns;
        let hold_rounds = hold_ns.div_ceil(config.gossip_interval_ns);
        let memory_rounds = memory_ns.div_ceil(config.gossip_interval_ns);
        let mut node = Node {
            config,
            kinds,
            rules,
            max_claim,
            memory_rounds,
            default_share,
            hold_rounds,
            round,
            claimed_round: round,
            restart: None,
            last_now: now,
            phase: Phase::Recovering {
                since: now,
                answered: BTreeSet::new(),
                found: BTreeMap::new(),
                best_ack: 0,
                released: false,
            },
            peers,
            keys: BTreeMap::new(),
            digests: [0; 2],
            view_previous: View::default(),
            outbox: VecDeque::new(),
            events: VecDeque::new(),
            stats: NodeStats::default(),
            scratch_live: Vec::new(),
            scratch_targets: Vec::new(),
        };
        node.digests = [node.digest(), 0];
        node.view_previous = node.view();
        let request = wire::encode(&Frame::SnapshotRequest { round }).unwrap_or_default();
        let ids: Vec<NodeId> = node.peers.keys().copied().collect();
        for to in ids {
            node.send(to, request.clone(), true);
        }
        node.finish_recovery_if_ready(now);
        Ok(node)
    }

    /// Return this node's id.
    pub fn id(&self) -> NodeId {
        self.config.id
    }

    /// Return the configuration.
    pub fn config(&self) -> &NodeConfig {
        &self.config
    }

    /// Tell whether the node has its state and admits requests.
    pub fn is_running(&self) -> bool {
        matches!(self.phase, Phase::Running)
    }

    /// Return the gossip counters.
    pub fn stats(&self) -> NodeStats {
        self.stats
    }

    /// Return the members this node knows, itself included, with whether each is alive.
    pub fn members(&self) -> Vec<(NodeId, bool)> {
        let mut out = vec![(self.config.id, true)];
        out.extend(
            self.peers
                .iter()
                .map(|(&id, p)| (id, p.status == Status::Alive)),
        );
        out.sort_unstable();
        out
    }

    /// Return the number of keys the node holds state for.
    pub fn key_count(&self) -> usize {
        self.keys.len()
    }

    /// Decide a request for `key` under global policy `policy` at `now`.
    ///
    /// Until the node has recovered its state from its peers it denies, with a retry after
    /// one gossip interval.
    pub fn decide(&mut self, policy: u32, key: u64, cost: u64, now: Nanos) -> Decision {
        self.last_now = self.last_now.max(now);
        let Some(p) = self.config.policies.get(policy as usize) else {
            return Decision::cannot_fit(0);
        };
        if !self.is_running() {
            let limit = p.capacity();
            let g = self.config.gossip_interval_ns;
            return Decision::denied(limit, 0, g, g);
        }
        if self.keys.len() >= self.config.max_keys && !self.keys.contains_key(&(policy, key)) {
            // Full: a new key waits until idle keys are forgotten (never reset a busy one).
            let g = self.config.gossip_interval_ns;
            return Decision::denied(p.capacity(), 0, g, g);
        }
        let cell = self.cell(policy, key);
        let kind = self.kinds[policy as usize];
        cell.decide(kind, &self.config.policies[policy as usize], now, cost)
    }

    /// Return the kind of cell policy `policy` uses, if it is one of this node's policies.
    pub fn kind(&self, policy: u32) -> Option<MeshKind> {
        self.kinds.get(policy as usize).copied()
    }

    /// Return the cell of `key` under `policy`, creating it (with the even share) on first
    /// use. A driver may keep it and call [`MeshCell::decide`] from any thread.
    ///
    /// Panics if `policy` is not an index of the configured policies.
    pub fn cell(&mut self, policy: u32, key: u64) -> Arc<MeshCell> {
        let state = self.key_state(policy, key);
        Arc::clone(&state.cell)
    }

    /// Return the share this node holds for `key` under `policy`.
    pub fn share(&self, policy: u32, key: u64) -> Share {
        self.keys
            .get(&(policy, key))
            .map_or(self.default_share, |k| k.own.now.share)
    }

    /// Return the share this node's cell enforces for `key` (its allowance, which may be
    /// below the share it announces while its usage drains), or `None` while recovering.
    pub fn allowance_share(&self, policy: u32, key: u64) -> Option<Share> {
        if !self.is_running() {
            return None;
        }
        Some(self.keys.get(&(policy, key)).map_or(
            match self.config.admission {
                Admission::Shares | Admission::StaticSplit => self.default_share,
                Admission::LocalOnly | Admission::StaleSum => ONE,
            },
            |k| k.current_share,
        ))
    }

    /// Return this node's view of the cluster-wide count of `key` in `window` (the window's
    /// G-counter), if it holds one.
    pub fn counts(&self, policy: u32, key: u64, window: u64) -> Option<&GCounter> {
        self.keys.get(&(policy, key))?.counter(window)
    }

    /// Return the time of the next round, when [`Node::handle_timeout`] has work.
    pub fn poll_timeout(&self) -> Nanos {
        (self.round + 1) * self.config.gossip_interval_ns
    }

    /// Return the next frame to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.outbox.pop_front()
    }

    /// Return the next event.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn key_state(&mut self, policy: u32, key: u64) -> &mut KeyState {
        let kind = self.kinds[policy as usize];
        let share = match self.config.admission {
            Admission::LocalOnly => ONE,
            Admission::StaleSum => ONE,
            Admission::StaticSplit | Admission::Shares => self.default_share,
        };
        let default = Announce {
            share: self.default_share,
            ..Announce::default()
        };
        let policy_ref = self.config.policies[policy as usize];
        let restart = match self.restart {
            Some(r) if self.round < r.until_round && self.config.admission == Admission::Shares => {
                Some(r)
            }
            _ => None,
        };
        let round = self.round;
        let now = self.last_now;
        self.keys.entry((policy, key)).or_insert_with(|| {
            let share = restart.map_or(share, |r| r.initial_share);
            let cell = Arc::new(MeshCell::new(kind, &policy_ref, share));
            let mut own = History::fresh(default);
            let current_share = share;
            let mut announced = share;
            if let Some(r) = restart {
                // Restarted recently: this key may have been used before the crash under a
                // share no peer heard of; count the most it could have been as used, and
                // announce what this node holds so the peers do not assume the even share.
                if kind == MeshKind::Bucket {
                    cell.empty_bucket(&policy_ref, now);
                } else {
                    let used = cell.recover_window(
                        kind,
                        &policy_ref,
                        now,
                        0,
                        0,
                        tokens_of(r.charge_share, policy_ref.capacity()),
                    );
                    announced = share_for(used, policy_ref.capacity()).max(share);
                }
                own = History {
                    changed: round,
                    now: Announce {
                        share: announced,
                        ..default
                    },
                    before: default,
                };
            }
            KeyState {
                cell,
                demand: 0,
                own,
                changed_round: if restart.is_some() { round } else { 0 },
                sent_counts: (0, 0, 0),
                peers: Vec::new(),
                current_share,
                bucket_slot: (0, 0, 0),
                last_admitted: 0,
                settled: false,
                counts: Vec::new(),
            }
        })
    }

    fn default_announce(&self) -> Announce {
        Announce {
            share: self.default_share,
            ..Announce::default()
        }
    }

    fn send(&mut self, to: NodeId, bytes: Vec<u8>, reliable: bool) {
        self.stats.frames_sent += 1;
        self.stats.bytes_sent += bytes.len() as u64;
        if reliable {
            self.stats.snapshots_sent += 1;
        }
        self.outbox.push_back(Transmit {
            to,
            bytes,
            reliable,
        });
    }

    fn view(&self) -> View {
        let mut view = View {
            alive: vec![self.config.id],
            held: Vec::new(),
        };
        for (&id, p) in &self.peers {
            match p.status {
                Status::Alive => view.alive.push(id),
                Status::Dead { since_round } if self.round < since_round + self.hold_rounds => {
                    let extra =
                        (UNSEEN_CLAIM_STEPS * u64::from(self.max_claim)).min(u64::from(ONE));
                    view.held.push((id, extra as Share))
                }
                Status::Dead { .. } => {}
            }
        }
        view.alive.sort_unstable();
        view
    }

    fn digest(&self) -> u64 {
        let view = self.view();
        let mut h = 0x9e37_79b9_7f4a_7c15u64;
        for id in &view.alive {
            h = mix(h ^ id);
        }
        h = mix(h ^ 0xdead);
        for (id, _) in &view.held {
            let p = &self.peers[id];
            h = mix(h ^ id);
            h = mix(h ^ p.complete);
            h = mix(h ^ p.header_round);
            h = mix(h ^ p.parts_seen ^ (p.parts_round << 1));
        }
        h
    }

    /// Run the round that `now` falls in, if not done yet.
    pub fn handle_timeout(&mut self, now: Nanos) {
        self.last_now = self.last_now.max(now);
        let round = now / self.config.gossip_interval_ns;
        if round <= self.round {
            return;
        }
        let previous_round = self.round;
        self.round = round;
        self.stats.rounds += 1;
        self.update_membership(now, previous_round);
        self.finish_recovery_if_ready(now);
        self.repeat_snapshot_requests(round);
        // The view and digest of the previous round are what claims this round rely on.
        let view_previous = self.view_previous.clone();
        if self.is_running() {
            self.update_keys(now, &view_previous, previous_round + 1);
        }
        self.view_previous = self.view();
        self.digests = [self.digest(), self.digests[0]];
        self.send_deltas();
        self.try_claim(now);
    }

    /// Claim room for this round, once every live member's announcements of this round are
    /// here and all agree on the membership (at most once per round, before the next tick).
    fn try_claim(&mut self, now: Nanos) {
        let round = self.round;
        if self.claimed_round >= round
            || !self.is_running()
            || self.config.admission != Admission::Shares
        {
            return;
        }
        let digest = self.digests[0];
        let view = self.view_previous.clone();
        let ready = view.alive.iter().all(|&id| {
            id == self.config.id
                || self.peers.get(&id).is_some_and(|p| {
                    p.status == Status::Alive
                        && p.complete >= round
                        && p.digest_as_of(round) == Some(digest)
                        // The peer holds our announcements up to the last round: so at a
                        // crash, at most this step's and the previous step's claims are
                        // unknown to it (see `UNSEEN_CLAIM_STEPS`).
                        && p.their_ack + 1 >= round
                })
        });
        if !ready {
            return;
        }
        self.claimed_round = round;
        self.stats.consistent_rounds += 1;
        let me = self.config.id;
        let default = self.default_announce();
        let mut live = std::mem::take(&mut self.scratch_live);
        let mut targets = std::mem::take(&mut self.scratch_targets);
        for (&(policy, _), state) in self.keys.iter_mut() {
            if state.settled {
                continue;
            }
            let kind = self.kinds[policy as usize];
            let p = self.config.policies[policy as usize];
            let own = Announced {
                share: state.own.now.share,
                demand: state.own.as_of(round).map_or(0, |a| a.demand),
                released: if state.own.changed == round {
                    state.own.now.released
                } else {
                    0
                },
            };
            let (me_index, held, consistent) =
                gather(state, &view, me, default, (round, true), own, &mut live);
            let used = match kind {
                MeshKind::Bucket => 0,
                _ => {
                    let w = state.cell.window(&p, now);
                    share_for(w.estimate(kind, &p, now).min(p.capacity()), p.capacity())
                }
            };
            let rules = &self.rules[policy as usize];
            let wanted =
                share::next_share(rules, &live, me_index, held, used, consistent, &mut targets);
            let announced = live[me_index].share;
            let allowance = if wanted > announced {
                // A claim, on top of what the peers count this node as holding.
                wanted
            } else if wanted < announced && kind != MeshKind::Bucket {
                // A release never raises the allowance. (A bucket releases only at its
                // tick, where the tokens it gives up are announced.)
                wanted.min(state.current_share)
            } else {
                state.current_share
            };
            if allowance != state.current_share {
                state.cell.set_share(kind, &p, now, allowance);
                state.current_share = allowance;
                if kind == MeshKind::Bucket && wanted > announced {
                    // Take over released tokens in proportion to this node's part of the
                    // round's claims (which every member computes alike from the same
                    // announcements), so the grants sum to at most the tokens released.
                    let claims = share::total_claims(rules, &live, held, &mut targets).max(1);
                    let pool: u64 = live.iter().map(|a| u64::from(a.released)).sum();
                    let mine = u64::from(wanted - announced);
                    let grant = (u128::from(pool) * u128::from(mine) / u128::from(claims)) as u64;
                    if grant > 0 {
                        state.cell.grant_bucket(&p, now, grant);
                    }
                }
            }
        }
        self.scratch_live = live;
        self.scratch_targets = targets;
    }

    /// While recovering, ask the peers that have not answered again every few rounds (a
    /// request to a peer that was down or cut off is lost).
    fn repeat_snapshot_requests(&mut self, round: u64) {
        let Phase::Recovering { answered, .. } = &self.phase else {
            return;
        };
        if !round.is_multiple_of(5) {
            return;
        }
        let ask: Vec<NodeId> = self
            .peers
            .keys()
            .copied()
            .filter(|id| !answered.contains(id))
            .collect();
        if let Ok(request) = wire::encode(&Frame::SnapshotRequest { round }) {
            for to in ask {
                self.send(to, request.clone(), true);
            }
        }
    }

    fn update_membership(&mut self, now: Nanos, previous_round: u64) {
        let g = self.config.gossip_interval_ns;
        let total = self.peers.len() + 1;
        let alive = 1 + self
            .peers
            .values()
            .filter(|p| {
                p.status == Status::Alive
                    && now.saturating_sub(p.last_heard) < self.config.dead_after_rounds * g
            })
            .count();
        let majority = alive * 2 > total;
        let round = self.round;
        let mut downs = Vec::new();
        for (&id, p) in self.peers.iter_mut() {
            if p.status == Status::Alive
                && majority
                && now.saturating_sub(p.last_heard) >= self.config.dead_after_rounds * g
            {
                p.status = Status::Dead {
                    since_round: round.max(previous_round + 1),
                };
                downs.push(id);
            }
        }
        self.events.extend(downs.into_iter().map(Event::PeerDown));
    }

    fn finish_recovery_if_ready(&mut self, now: Nanos) {
        let Phase::Recovering {
            since, answered, ..
        } = &self.phase
        else {
            return;
        };
        let members = self.peers.len() + 1;
        let have = answered.len() + 1;
        let timed_out = self
            .config
            .recover_timeout_ns
            .is_some_and(|timeout| now.saturating_sub(*since) >= timeout);
        if have * 2 <= members && !timed_out && members > 1 {
            return;
        }
        let Phase::Recovering {
            found,
            best_ack,
            released,
            ..
        } = std::mem::replace(&mut self.phase, Phase::Running)
        else {
            return;
        };
        // Claims this node made in steps no peer saw are unknown: count the most it could
        // have claimed in them as used (windows; admissions older than the hold expired).
        // Some peer released our share while we were away (and may have claimed it since):
        // start from nothing; what we admitted before has expired with the hold.
        let unseen_rounds = if released
            || best_ack == 0
            || self.round.saturating_sub(best_ack) >= self.memory_rounds
        {
            0
        } else {
            UNSEEN_CLAIM_STEPS
        };
        let extra = unseen_rounds * u64::from(self.max_claim);
        if released || extra > 0 {
            let initial_share = if released { 0 } else { self.default_share };
            let charge_share = (u64::from(initial_share) + extra).min(u64::from(ONE)) as Share;
            self.restart = Some(Restart {
                until_round: self.round + self.memory_rounds,
                initial_share,
                charge_share,
            });
        }
        // Every key this node holds now (some were created by peers' frames while it
        // recovered) starts from what the peers knew of it, or from the restart rule.
        let initial_share = if released { 0 } else { self.default_share };
        let mut all: BTreeMap<(u32, u64), Option<KeyUpdate>> =
            self.keys.keys().map(|&k| (k, None)).collect();
        for (k, update) in found {
            all.insert(k, Some(update));
        }
        let round = self.round;
        let me = self.config.id;
        for ((policy, key), update) in all {
            let kind = self.kinds[policy as usize];
            let policy_ref = self.config.policies[policy as usize];
            let state = self.key_state(policy, key);
            let recovered_share = match (released, &update) {
                (false, Some(u)) => u.now.share,
                _ => initial_share,
            };
            let mut announced = state
                .cell
                .set_share(kind, &policy_ref, now, recovered_share);
            match kind {
                MeshKind::Bucket => {
                    state.cell.empty_bucket(&policy_ref, now);
                    // Carry the recovered count of this refill slot: the cell counts
                    // from zero, so the slot's base starts below it (wrapping).
                    let index = policy_ref.window_of(now);
                    let (current, previous) = match &update {
                        Some(u) if u.window == index => (u.current, u.previous),
                        Some(u) if u.window + 1 == index => (0, u.current),
                        _ => (0, 0),
                    };
                    let total = state.cell.admitted();
                    state.bucket_slot = (index, total.wrapping_sub(current), previous);
                    state.last_admitted = total;
                    state.counter_mut(index).raise(me, current);
                    if index > 0 {
                        state.counter_mut(index - 1).raise(me, previous);
                    }
                }
                _ => {
                    let index = policy_ref.window_of(now);
                    let (previous, current) = match &update {
                        Some(u) if u.window == index => (u.previous, u.current),
                        Some(u) if u.window + 1 == index => (u.current, 0),
                        _ => (0, 0),
                    };
                    let charge = (u64::from(recovered_share) + extra).min(u64::from(ONE)) as Share;
                    let used = state.cell.recover_window(
                        kind,
                        &policy_ref,
                        now,
                        previous,
                        current,
                        tokens_of(charge, policy_ref.capacity()),
                    );
                    state.counter_mut(index).raise(me, current);
                    if index > 0 {
                        state.counter_mut(index - 1).raise(me, previous);
                    }
                    announced = announced.max(share_for(used, policy_ref.capacity()));
                }
            }
            state.current_share = recovered_share;
            let before = update.map_or(state.own.now, |u| u.now);
            state.own = History {
                changed: round,
                now: Announce {
                    share: announced,
                    demand: 0,
                    released: 0,
                },
                before,
            };
            // Announce it in the next delta even if a peer already acknowledged this round.
            state.changed_round = round + 1;
        }
        self.events.push_back(Event::Recovered);
    }

    /// Run the round's release step on every key and announce what changed. `first_round`
    /// is the first round since the last tick (earlier than this one if ticks were late):
    /// a change takes effect from it, since a claim made before may have been in effect in
    /// the rounds the node skipped.
    fn update_keys(&mut self, now: Nanos, view: &View, first_round: u64) {
        let round = self.round;
        let me = self.config.id;
        let default = self.default_announce();
        let admission = self.config.admission;
        let mut live = std::mem::take(&mut self.scratch_live);
        let mut targets = std::mem::take(&mut self.scratch_targets);
        let mut idle = Vec::new();
        // Settled keys are skipped, except when the membership changed and on every 50th
        // round (which also forgets idle keys): a round then costs what changed, not what is
        // held.
        let full_pass = admission != Admission::Shares
            || self.digest() != self.digests[0]
            || round.is_multiple_of(50);
        for (&(policy, key), state) in self.keys.iter_mut() {
            let kind = self.kinds[policy as usize];
            let p = self.config.policies[policy as usize];
            let offered = state.cell.take_offered();
            if state.settled && offered == 0 && !full_pass {
                continue;
            }
            // An average over about 16 rounds, in sixteenths: decay by 15/16, add the cost.
            state.demand = share::decayed(state.demand, 1)
                .saturating_add(offered.min(u64::from(u32::MAX)) as u32);
            // Own usage, in tokens, and the counts we gossip.
            let (used_share, counts) = match kind {
                MeshKind::Bucket => {
                    // Buckets count admissions per refill time, like a window, so old
                    // counts expire and a key can be forgotten.
                    let total = state.cell.admitted();
                    let index = p.window_of(now);
                    let (slot, base, _) = state.bucket_slot;
                    if index != slot {
                        let previous = if index == slot + 1 {
                            state.last_admitted.wrapping_sub(base)
                        } else {
                            0
                        };
                        state.bucket_slot = (index, state.last_admitted, previous);
                    }
                    state.last_admitted = total;
                    let (_, base, previous) = state.bucket_slot;
                    (0, Some((index, total.wrapping_sub(base), previous)))
                }
                _ => {
                    let w = state.cell.window(&p, now);
                    let used = w.estimate(kind, &p, now).min(p.capacity());
                    let index = p.window_of(now);
                    (
                        share_for(used, p.capacity()),
                        Some((index, w.current, w.previous)),
                    )
                }
            };
            // Releases are unilateral, so any data will do: this node's fresh demand
            // (its last round, unsmoothed) against the others' latest announcements.
            // A window may follow its raw demand down (it keeps what it used); a bucket
            // follows the smoothed demand, or a quiet round after a burst would cost it the
            // tokens it saved for the next one.
            // This node counts as holding what it announced or its allowance, whichever is
            // larger (a claim raises the allowance before the next announcement).
            let holding = state.own.now.share.max(state.current_share);
            let fresh = Announced {
                share: holding,
                demand: match kind {
                    MeshKind::Bucket => state.demand,
                    _ => (offered as f64 * 16.0).round() as u32,
                },
                released: 0,
            };
            let (me_index, held, _) =
                gather(state, view, me, default, (round, false), fresh, &mut live);
            let rules = &self.rules[policy as usize];
            let wanted = match admission {
                Admission::Shares => share::next_share(
                    rules,
                    &live,
                    me_index,
                    held,
                    used_share,
                    false,
                    &mut targets,
                ),
                Admission::LocalOnly => ONE,
                Admission::StaticSplit => self.default_share,
                Admission::StaleSum => match kind {
                    MeshKind::Bucket => ONE,
                    _ => {
                        let others = others_estimate(state, me, &p, kind, now);
                        share_for(p.capacity().saturating_sub(others), p.capacity())
                    }
                },
            };
            let tokens_before = match kind {
                MeshKind::Bucket => state.cell.bucket_tokens(&p, now),
                _ => 0,
            };
            // A decrease never raises the allowance (it may sit below the announced share
            // while usage drains); the baselines set theirs as they like.
            let allowance = if admission == Admission::Shares && wanted < holding {
                wanted.min(state.current_share)
            } else if admission == Admission::Shares {
                state.current_share
            } else {
                wanted
            };
            let applied = state.cell.set_share(kind, &p, now, allowance);
            state.current_share = allowance;
            let released = match kind {
                MeshKind::Bucket => tokens_before
                    .saturating_sub(state.cell.bucket_tokens(&p, now))
                    .min(u64::from(u32::MAX)) as u32,
                _ => 0,
            };
            // Peers decay the announced demand themselves: announce it again only when the
            // key is sent anyway (its counts changed) or it is off by more than twice.
            let counts_changed = counts.is_some_and(|c| c != rolled(state.sent_counts, c.0));
            let predicted = state.own.as_of(round).map_or(0, |a| a.demand);
            let demand = if counts_changed
                || state.demand > predicted.saturating_mul(2)
                || state.demand.saturating_mul(2) < predicted
            {
                state.demand
            } else {
                predicted
            };
            let share_or_release_changed = applied != state.own.now.share || released > 0;
            if share_or_release_changed || demand != predicted {
                let first_round = first_round.clamp(state.own.changed + 1, round);
                let before = state
                    .own
                    .as_of(first_round.saturating_sub(1))
                    .unwrap_or(state.own.now);
                let announce = Announce {
                    share: applied,
                    demand,
                    released,
                };
                state.own = History {
                    changed: first_round,
                    now: announce,
                    before,
                };
                state.changed_round = round;
            } else if state.own.now.released > 0 {
                // Released tokens belong to the round that announced them.
                state.own.now.released = 0;
            }
            if let Some((index, current, previous)) = counts {
                // A window rolling over changes nothing peers cannot work out themselves.
                if (index, current, previous) != rolled(state.sent_counts, index) {
                    state.changed_round = round;
                }
                state.sent_counts = (index, current, previous);
                state.counter_mut(index).raise(me, current);
                if index > 0 {
                    state.counter_mut(index - 1).raise(me, previous);
                }
                state
                    .counts
                    .retain(|(w, _)| *w + 1 >= index && *w <= index + 1);
            }
            state.settled = admission == Admission::Shares
                && state.changed_round < round
                && share::is_settled(&self.rules[policy as usize], &live, held, &targets);
            let quiet = offered == 0
                && state.demand == 0
                && state.own.as_of(round) == Some(default)
                && state.own.before.share == default.share
                && state.peers.iter().all(|(_, h)| {
                    h.as_of(round) == Some(default) && h.before.share == default.share
                })
                && state.counts.iter().all(|(_, c)| c.total() == 0)
                && (kind != MeshKind::Bucket || state.cell.is_full_bucket(&p, now))
                && round > state.changed_round + 2;
            if quiet {
                idle.push((policy, key));
            }
        }
        for (policy, key) in idle {
            self.keys.remove(&(policy, key));
            self.events.push_back(Event::KeyForgotten { policy, key });
        }
        self.scratch_live = live;
        self.scratch_targets = targets;
    }

    fn header(&self, to: NodeId) -> RoundHeader {
        let mut members: Vec<NodeId> = self.peers.keys().copied().collect();
        members.push(self.config.id);
        members.sort_unstable();
        RoundHeader {
            round: self.round,
            digest: self.digests[0],
            previous_digest: self.digests[1],
            members,
            ack: self.peers.get(&to).map_or(0, |p| p.complete),
        }
    }

    fn own_update(&self, policy: u32, key: u64, state: &KeyState) -> KeyUpdate {
        let (window, current, previous) = state.sent_counts;
        KeyUpdate {
            policy,
            key,
            window,
            current,
            previous,
            changed: state.own.changed,
            now: state.own.now,
            before: state.own.before,
        }
    }

    fn send_deltas(&mut self) {
        // A recovering node sends nothing but its snapshot requests: a delta would let the
        // peers count its rounds as complete before it knows its own state.
        if !self.is_running() {
            return;
        }
        let ids: Vec<NodeId> = self.peers.keys().copied().collect();
        for to in ids {
            // Send what changed since our last delta to this peer, which it normally has by
            // now; if its acknowledgements stall (a lost datagram), since what it confirmed.
            let peer = &self.peers[&to];
            let since = if peer.their_ack + 3 >= self.round {
                peer.their_ack.max(peer.sent_through)
            } else {
                peer.their_ack
            };
            let updates: Vec<KeyUpdate> = if self.is_running() {
                self.keys
                    .iter()
                    .filter(|(_, s)| s.changed_round > since)
                    .map(|(&(policy, key), s)| self.own_update(policy, key, s))
                    .collect()
            } else {
                Vec::new()
            };
            let header = self.header(to);
            let budget = self
                .config
                .max_datagram_bytes
                .saturating_sub(1 + wire::encoded_len(&header) + 16)
                .max(64);
            let mut parts: Vec<Vec<KeyUpdate>> = vec![Vec::new()];
            let mut size = 0;
            for u in updates {
                let len = wire::encoded_len(&u);
                if size + len > budget && !parts.last().is_some_and(Vec::is_empty) {
                    parts.push(Vec::new());
                    size = 0;
                }
                size += len;
                if let Some(last) = parts.last_mut() {
                    last.push(u);
                }
            }
            if parts.len() > 64 {
                // Too far behind for datagrams: send the whole state on a stream.
                self.send_snapshot(to);
                if let Some(p) = self.peers.get_mut(&to) {
                    p.sent_through = self.round;
                }
                continue;
            }
            let count = parts.len() as u16;
            for (i, keys) in parts.into_iter().enumerate() {
                let frame = Frame::Delta(Delta {
                    header: header.clone(),
                    since,
                    part: i as u16,
                    parts: count,
                    keys,
                });
                if let Ok(bytes) = wire::encode(&frame) {
                    self.send(to, bytes, false);
                }
            }
            if let Some(p) = self.peers.get_mut(&to) {
                p.sent_through = self.round;
            }
        }
    }

    fn send_snapshot(&mut self, to: NodeId) {
        let header = self.header(to);
        let you_were_released = self.peers.get(&to).is_some_and(|p| match p.status {
            Status::Dead { since_round } => self.round >= since_round + self.hold_rounds,
            Status::Alive => p.released_when_back,
        });
        let mut mine = Vec::new();
        let mut yours = Vec::new();
        let running = self.is_running();
        for (&(policy, key), s) in &self.keys {
            if running {
                mine.push(self.own_update(policy, key, s));
            }
            if let Some(h) = s.peer(to) {
                let (window, current, previous) = {
                    let latest = s.counts.last().map_or(0, |(w, _)| *w);
                    let current = s.counter(latest).map_or(0, |c| c.get(to));
                    let previous = if latest > 0 {
                        s.counter(latest - 1).map_or(0, |c| c.get(to))
                    } else {
                        0
                    };
                    (latest, current, previous)
                };
                yours.push(KeyUpdate {
                    policy,
                    key,
                    window,
                    current,
                    previous,
                    changed: h.changed,
                    now: h.now,
                    before: h.before,
                });
            }
        }
        // The decoder's limit counts decoded bytes (about 70 per update, `keys` and `yours`
        // together), not encoded ones.
        let per_part = MAX_FRAME_BYTES / 2 / 96;
        let parts = mine
            .len()
            .div_ceil(per_part)
            .max(yours.len().div_ceil(per_part))
            .max(1);
        if parts > usize::from(u16::MAX) {
            return;
        }
        let mut mine = mine.into_iter();
        let mut yours = yours.into_iter();
        for part in 0..parts {
            let frame = Frame::Snapshot(Snapshot {
                you_were_released,
                sender_running: running,
                header: header.clone(),
                part: part as u16,
                parts: parts as u16,
                keys: mine.by_ref().take(per_part).collect(),
                yours: yours.by_ref().take(per_part).collect(),
            });
            if let Ok(bytes) = wire::encode(&frame) {
                self.send(to, bytes, true);
            }
        }
    }

    /// Apply a frame that `from` sent. A frame that does not decode or carries values out of
    /// range is refused whole, counted, and changes nothing.
    pub fn handle_frame(
        &mut self,
        now: Nanos,
        from: NodeId,
        bytes: &[u8],
    ) -> Result<(), FrameError> {
        self.last_now = self.last_now.max(now);
        let result = self.apply_frame(now, from, bytes);
        match result {
            Ok(()) => {
                self.stats.frames_received += 1;
                self.try_claim(now);
            }
            Err(_) => self.stats.frames_dropped += 1,
        }
        result
    }

    fn apply_frame(&mut self, now: Nanos, from: NodeId, bytes: &[u8]) -> Result<(), FrameError> {
        let frame: Frame = wire::decode(bytes)?;
        if from == self.config.id {
            return Err(FrameError::UnknownPeer(from));
        }
        let round_now = now / self.config.gossip_interval_ns;
        match &frame {
            Frame::Delta(d) => {
                validate_parts(d.part, d.parts)?;
                self.validate(now, &d.header, &d.keys)?;
            }
            Frame::Snapshot(s) => {
                validate_parts(s.part, s.parts)?;
                self.validate(now, &s.header, &s.keys)?;
                self.validate_keys(now, s.header.round, &s.yours)?;
            }
            Frame::SnapshotRequest { round } if *round > round_now + MAX_ROUNDS_AHEAD => {
                return Err(FrameError::Invalid(
                    "round too far ahead of this node's clock",
                ));
            }
            Frame::SnapshotRequest { .. } => {}
        }
        if !self.peers.contains_key(&from) {
            if self.peers.len() + 1 >= self.config.cluster_size {
                return Err(FrameError::UnknownPeer(from));
            }
            self.peers.insert(from, Peer::new(now));
            self.events.push_back(Event::Discovered(from));
        }
        self.heard(now, from);
        match frame {
            Frame::SnapshotRequest { .. } => self.send_snapshot(from),
            Frame::Delta(d) => {
                if !d.keys.is_empty()
                    && let Some(p) = self.peers.get_mut(&from)
                {
                    p.released_when_back = false;
                }
                self.apply_header(now, from, &d.header);
                self.apply_updates(now, from, &d.keys);
                let p = self.peers.get_mut(&from).expect("peer inserted above");
                let round = d.header.round;
                if round > p.parts_round {
                    p.parts_round = round;
                    p.parts_seen = 0;
                }
                if round == p.parts_round && d.since <= p.complete && d.part < 64 {
                    p.parts_seen |= 1 << d.part;
                    let all = if d.parts >= 64 {
                        u64::MAX
                    } else {
                        (1u64 << d.parts) - 1
                    };
                    if p.parts_seen & all == all {
                        p.complete = p.complete.max(round);
                    }
                }
            }
            Frame::Snapshot(s) => {
                self.apply_header(now, from, &s.header);
                self.apply_updates(now, from, &s.keys);
                if let Phase::Recovering {
                    found,
                    best_ack,
                    released,
                    ..
                } = &mut self.phase
                {
                    *best_ack = (*best_ack).max(s.header.ack);
                    *released |= s.you_were_released;
                    for u in &s.yours {
                        let entry = found.entry((u.policy, u.key)).or_insert(*u);
                        if u.window > entry.window {
                            entry.window = u.window;
                            entry.current = u.current;
                            entry.previous = u.previous;
                        } else if u.window == entry.window {
                            entry.current = entry.current.max(u.current);
                            entry.previous = entry.previous.max(u.previous);
                        }
                        if u.now.share > entry.now.share {
                            entry.now = u.now;
                        }
                    }
                }
                let p = self.peers.get_mut(&from).expect("peer inserted above");
                let round = s.header.round;
                if round > p.snapshot_round {
                    p.snapshot_round = round;
                    p.snapshot_parts.clear();
                }
                if round == p.snapshot_round {
                    p.snapshot_parts.insert(s.part);
                    if p.snapshot_parts.len() >= usize::from(s.parts) {
                        // A recovering sender's snapshot is not its state yet.
                        if s.sender_running {
                            p.complete = p.complete.max(round);
                        }
                        if let Phase::Recovering { answered, .. } = &mut self.phase {
                            answered.insert(from);
                        }
                        self.finish_recovery_if_ready(now);
                    }
                }
            }
        }
        Ok(())
    }

    fn validate(
        &self,
        now: Nanos,
        header: &RoundHeader,
        keys: &[KeyUpdate],
    ) -> Result<(), FrameError> {
        if header.members.len() > 1024 {
            return Err(FrameError::Invalid("more than 1024 members"));
        }
        let round_now = now / self.config.gossip_interval_ns;
        if header.round > round_now + MAX_ROUNDS_AHEAD {
            return Err(FrameError::Invalid(
                "round too far ahead of this node's clock",
            ));
        }
        if header.ack > round_now + MAX_ROUNDS_AHEAD {
            return Err(FrameError::Invalid(
                "acknowledges a round this node has not run",
            ));
        }
        self.validate_keys(now, header.round, keys)
    }

    fn validate_keys(&self, now: Nanos, round: u64, keys: &[KeyUpdate]) -> Result<(), FrameError> {
        let mut new_keys = 0usize;
        for u in keys {
            let Some(p) = self.config.policies.get(u.policy as usize) else {
                return Err(FrameError::Invalid("unknown policy index"));
            };
            if u.changed > round {
                return Err(FrameError::Invalid(
                    "a change in a later round than the frame's",
                ));
            }
            if u.window > p.window_of(now) + MAX_ROUNDS_AHEAD {
                return Err(FrameError::Invalid(
                    "a window too far ahead of this node's clock",
                ));
            }
            if !self.keys.contains_key(&(u.policy, u.key)) {
                new_keys += 1;
            }
            if u.now.share > ONE || u.before.share > ONE {
                return Err(FrameError::Invalid("share above the whole budget"));
            }
            if u64::from(u.now.released.max(u.before.released)) > p.capacity() {
                return Err(FrameError::Invalid("released tokens above the burst"));
            }
            // A node counts at most its share (charges included) per window; a bucket's
            // refill time also refills it once.
            let most = 2 * p.capacity();
            if u.current > most || u.previous > most {
                return Err(FrameError::Invalid("a count above twice the capacity"));
            }
        }
        if self.keys.len() + new_keys > self.config.max_keys {
            return Err(FrameError::Invalid("more keys than max_keys"));
        }
        Ok(())
    }

    fn heard(&mut self, now: Nanos, from: NodeId) {
        let Some(p) = self.peers.get_mut(&from) else {
            return;
        };
        p.last_heard = p.last_heard.max(now);
        if let Status::Dead { since_round } = p.status {
            p.released_when_back = self.round >= since_round + self.hold_rounds;
            p.status = Status::Alive;
            self.events.push_back(Event::PeerUp(from));
            // Heal: send the returning peer everything, so both sides converge at once.
            self.send_snapshot(from);
        }
    }

    fn apply_header(&mut self, _now: Nanos, from: NodeId, header: &RoundHeader) {
        let learned: Vec<NodeId> = header
            .members
            .iter()
            .copied()
            .filter(|id| *id != self.config.id && !self.peers.contains_key(id))
            .collect();
        for id in learned {
            if self.peers.len() + 1 >= self.config.cluster_size {
                break;
            }
            // Heard of, not from: it must speak before it counts as alive for long.
            self.peers.insert(id, Peer::new(_now));
            self.events.push_back(Event::Discovered(id));
        }
        let p = self.peers.get_mut(&from).expect("caller inserted the peer");
        if header.round >= p.header_round {
            p.previous_digest = header.previous_digest;
            p.header_round = header.round;
            p.digest = header.digest;
            p.their_ack = header.ack;
        }
    }

    fn apply_updates(&mut self, now: Nanos, from: NodeId, updates: &[KeyUpdate]) {
        let default = self.default_announce();
        let stale_sum = self.config.admission == Admission::StaleSum;
        for u in updates {
            let kind = self.kinds[u.policy as usize];
            let p = self.config.policies[u.policy as usize];
            let state = self.key_state(u.policy, u.key);
            state.settled = false;
            let h = state.peer_mut(from, default);
            if u.changed >= h.changed {
                *h = History {
                    changed: u.changed,
                    now: u.now,
                    before: u.before,
                };
            }
            let index = p.window_of(now);
            if kind == MeshKind::Bucket && stale_sum {
                let before = state.counter(u.window).map_or(0, |c| c.get(from));
                if u.current > before {
                    state.cell.charge_bucket(&p, now, u.current - before);
                }
            }
            if u.window + 1 >= index && u.window <= index + 1 {
                state.counter_mut(u.window).raise(from, u.current);
                if u.window > 0 && u.window >= index {
                    state.counter_mut(u.window - 1).raise(from, u.previous);
                }
                state
                    .counts
                    .retain(|(w, _)| *w + 1 >= index && *w <= index + 1);
            }
        }
    }
}

/// Collect the announcements of `view`'s live members for one key into `live` (`own` for this
/// node), as of `round` when `exact` (else the latest, decayed to `round`); return this
/// node's index, the share still held by dead members, and whether every announcement of
/// that round was known.
fn gather(
    state: &KeyState,
    view: &View,
    me: NodeId,
    default: Announce,
    (round, exact): (u64, bool),
    own: Announced,
    live: &mut Vec<Announced>,
) -> (usize, u64, bool) {
    live.clear();
    let mut me_index = 0;
    let mut consistent = true;
    for &id in &view.alive {
        if id == me {
            me_index = live.len();
            live.push(own);
            continue;
        }
        let announced = match (state.peer(id), exact) {
            (None, _) => default,
            (Some(h), false) => h.as_of(h.changed.max(round)).unwrap_or(h.now),
            (Some(h), true) => {
                let r = round;
                let mut a = h.as_of(r).unwrap_or_else(|| {
                    consistent = false;
                    h.now
                });
                // Released tokens belong to the round that announced them.
                if h.changed != r {
                    a.released = 0;
                }
                a
            }
        };
        live.push(Announced {
            share: announced.share,
            demand: announced.demand,
            released: announced.released,
        });
    }
    let held: u64 = view
        .held
        .iter()
        .map(|&(id, extra)| {
            let share = state.peer(id).map_or(default.share, |h| h.now.share);
            (u64::from(share) + u64::from(extra)).min(u64::from(ONE))
        })
        .sum();
    // The dead members' real shares are at most what the live ones leave of the budget
    // (claims never sum above it), so while the live shares fit, holding more than the rest
    // would only shave the survivors for nothing; it still leaves no room to claim. When the
    // live shares alone exceed the budget (a heal), the full hold is shaved for.
    let live_total: u64 = live.iter().map(|a| u64::from(a.share)).sum();
    let held = if live_total <= u64::from(ONE) {
        held.min(u64::from(ONE) - live_total)
    } else {
        held
    };
    (me_index, held, consistent)
}

/// Return window counts `(index, current, previous)` moved to window `index` without new
/// admissions.
fn rolled(counts: (u64, u64, u64), index: u64) -> (u64, u64, u64) {
    let (sent, current, _) = counts;
    if index == sent {
        counts
    } else if index == sent + 1 {
        (index, 0, current)
    } else {
        (index, 0, 0)
    }
}

/// Refuse a part index out of its range.
fn validate_parts(part: u16, parts: u16) -> Result<(), FrameError> {
    if parts == 0 || part >= parts {
        return Err(FrameError::Invalid("part index out of range"));
    }
    Ok(())
}

/// The other nodes' estimate for a window key, from the gossiped counters.
fn others_estimate(state: &KeyState, me: NodeId, p: &Policy, kind: MeshKind, now: Nanos) -> u64 {
    let index = p.window_of(now);
    let current = state.counter(index).map_or(0, |c| c.total() - c.get(me));
    if kind == MeshKind::FixedWindow {
        return current;
    }
    let previous = if index > 0 {
        state
            .counter(index - 1)
            .map_or(0, |c| c.total() - c.get(me))
    } else {
        0
    };
    let w = p.window_ns();
    let weighted = (u128::from(previous) * u128::from(w - now % w)).div_ceil(u128::from(w)) as u64;
    weighted + current
}

fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}
