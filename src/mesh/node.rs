//! The sans-IO state machine of one mesh node: no sockets, no clock, no threads.
//!
//! Inputs carry `now` (this node's clock, in ns): [`Node::decide`] (a request),
//! [`Node::handle_frame`] (bytes from a peer), [`Node::handle_timeout`] (its timer).
//! Outputs are polled: [`Node::poll_transmit`], [`Node::poll_timeout`], [`Node::poll_event`].
//!
//! The node is made of owned parts, each in its own module:
//! - [`Membership`]: who is alive, who owns a key (rendezvous hashing), frame headers;
//! - [`Holding`] per key this node uses: its lease, waiting requests, demand;
//! - [`Authority`] per key this node owns: the key's budget, leased to the holders;
//! - backups of the authorities this node would take over (it is their successor);
//! - [`Outbox`]: items packed into frames; [`Cells`]: the lease cells the request path reads.
//!
//! A request takes tokens from its key's lease ([`Cells::decide`], one compare-and-swap).
//! One that cannot waits (at most `max_wait`) while the node asks the key's owner for more;
//! the owner grants from the key's authority, recalls unused leases, or denies with the time
//! a retry can succeed. Every round the node reports to the owners, gives idle leases back,
//! backs up the authorities it changed to their successors, and sends a heartbeat to every
//! peer it has not written to. A node keeps an authority only while its successor confirms
//! hearing it (a frame echoing one of ours, within `authority_lease`), and the successor
//! takes over only after `dead_after` of silence, which is longer: two nodes never grant
//! from the same key at once, even when one stops hearing the other.
//!
//! A starting node asks every peer for what it should hold (its authorities, its backups)
//! and creates no new authority until each peer answered or was declared dead.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::clock::Nanos;
use crate::decision::{Decision, MeshCharge};
use crate::mesh::NodeId;
use crate::mesh::authority::Authority;
use crate::mesh::cells::Cells;
use crate::mesh::holder::{Holding, Slow};
use crate::mesh::lease::MAX_LEASE_TOKENS;
use crate::mesh::locks::{Locks, MAX_LOCKOUT_NS};
use crate::mesh::membership::Membership;
use crate::mesh::message::{AuthorityState, Grant, Item, KeyRef};
use crate::mesh::outbox::{Outbox, Transmit};
use crate::mesh::windows::MeshPolicy;
use authorities::Authorities;
use backups::Backups;
use holdings::Holdings;
use schedule::Schedule;
use transfers::Transfers;

mod admin;
mod authorities;
mod backups;
mod config;
mod deferred;
mod frames;
mod holdings;
mod inspect;
mod join;
mod limits;
mod lockouts;
mod members;
mod owner;
mod recovery;
mod rounds;
mod schedule;
mod snapshots;
mod transfers;

pub use admin::{ASK_APP, ASK_KEY, ASK_RESET, AdminMessage, KeyView};
pub use config::{DEFAULT_GOSSIP_BUDGET_BYTES_PER_S, MeshError, NodeConfig, WhileJoining};
pub use inspect::{LeaseState, Leased, Leases};
pub use snapshots::SavedKey;

/// How a request went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Decided; an admission from the key's lease names what it took, to give back with
    /// [`Node::refund`].
    Now(Decision, Option<MeshCharge>),
    /// It waits for the key's owner; its decision comes as [`Event::Decided`] with this id.
    Wait(u64),
}

/// Something the driver (or the simulator) should know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A waiting request was decided.
    Decided {
        /// The id [`Admit::Wait`] gave.
        id: u64,
        /// The decision.
        decision: Decision,
        /// What an admission took, to give back with [`Node::refund`].
        charge: Option<MeshCharge>,
    },
    /// A member was declared dead.
    PeerDown(NodeId),
    /// A member is alive (again).
    PeerUp(NodeId),
    /// A member restarted.
    PeerRestarted(NodeId),
    /// A member left the cluster.
    PeerLeft(NodeId),
    /// A member went silent long enough to be suspected.
    PeerSuspected(NodeId),
    /// A member named by another, not heard yet: reach it (address in `Membership::peer`).
    PeerLearned(NodeId),
    /// A member was dropped from the table (gone for long, or pending and told gone).
    PeerForgotten(NodeId),
    /// The node joined its cluster (a member answered it, or it started one of its own).
    Joined,
    /// The node has heard from every peer since it started and admits for its own keys.
    Recovered,
    /// A member's configuration digest differs from this node's (mesh policies, `key_secret`
    /// or `env`): the lowest of their limits applies until they agree.
    ConfigDiffers(NodeId),
    /// A member whose configuration differed now agrees with this node's (or is gone).
    ConfigAgrees(NodeId),
    /// An authority of this node began a window (windows): where the key's windows lie.
    Window {
        /// The key's mesh policy (its index among the node's policies).
        policy: u32,
        /// The key.
        key: u64,
        /// The window's index.
        window: u64,
        /// Its start on this node's clock.
        start: Nanos,
    },
}

/// Counters about the node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeStats {
    /// Rounds run.
    pub rounds: u64,
    /// Frames sent.
    pub frames_sent: u64,
    /// Bytes sent.
    pub bytes_sent: u64,
    /// Frames received and applied.
    pub frames_received: u64,
    /// Frames refused (malformed, oversized, wrong version, invalid content, unknown peer).
    pub frames_dropped: u64,
    /// Requests that waited for their key's owner.
    pub waits: u64,
    /// Waiting requests denied at their deadline.
    pub timeouts: u64,
    /// Grants made by this node's authorities.
    pub grants: u64,
    /// Authorities taken over from a dead owner's backup.
    pub promotions: u64,
    /// Authorities handed to another node.
    pub handoffs_sent: u64,
    /// Authorities received from another node.
    pub handoffs_received: u64,
    /// Backups sent.
    pub backups_sent: u64,
    /// Grants and recalls dropped because they were sent to this node's earlier run.
    pub to_earlier_run: u64,
    /// Changes of the limits a policy is enforced with (reloads, peers' differing limits).
    pub policy_changes: u64,
    /// Requests decided by `while_joining`, before the node joined its cluster.
    pub joining_decisions: u64,
    /// Key items the gossip budget held back for a later round.
    pub gossip_held_back: u64,
    /// Requests for a key the node held nothing of, admitted on its first-request credit
    /// before the owner answered ([`NodeConfig::first_credit`]).
    pub credited: u64,
    /// Lockouts (`block_for`) this node's authorities started.
    pub lockouts: u64,
    /// Keys this node's authorities reset (the admin API).
    pub resets: u64,
    /// Authorities begun from a state saved before a restart ([`Node::restore_saved`]).
    pub snapshots_restored: u64,
}

/// One mesh node: the sans-IO state machine a transport drives.
///
/// The transport owns the clock and the sockets: it calls [`Node::handle_frame`] with each
/// peer frame, [`Node::handle_timeout`] at [`Node::poll_timeout`], and sends what
/// [`Node::poll_transmit`] returns. Requests are decided by [`Node::decide`] (or, without
/// the node, from the shared [`Node::cells`]).
///
/// ```
/// use std::time::Duration;
/// use ratemesh::Policy;
/// use ratemesh::mesh::{Admit, Event, Node, NodeConfig};
///
/// // What a transport does: call each node at its timeout, carry its frames to the peer.
/// fn step(nodes: &mut [Node], now: u64) {
///     for i in 0..nodes.len() {
///         if nodes[i].poll_timeout() <= now {
///             nodes[i].handle_timeout(now);
///         }
///         while let Some(t) = nodes[i].poll_transmit() {
///             let from = nodes[i].id();
///             let to = nodes.iter().position(|n| n.id() == t.to).unwrap();
///             nodes[to].handle_frame(now, from, &t.bytes).unwrap();
///         }
///     }
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Two nodes share 100 requests a minute per key. Time is what the caller says it is.
/// let policy = Policy::global_fixed_window(100, Duration::from_secs(60))?;
/// let mut now = 1_000_000_000;
/// let mut nodes = [1, 2]
///     .map(|id| Node::new(NodeConfig::new(id, vec![1, 2], vec![policy]), now))
///     .into_iter()
///     .collect::<Result<Vec<_>, _>>()?;
/// while !nodes.iter().all(Node::is_running) {
///     now += 10_000_000;
///     step(&mut nodes, now);
/// }
///
/// // Node 2 has no lease of key 42 yet: the request waits for the key's owner.
/// let decision = match nodes[1].decide(0, 42, 1, now) {
///     Admit::Now(decision, _) => decision,
///     Admit::Wait(id) => loop {
///         now += 1_000_000;
///         step(&mut nodes, now);
///         if let Some(Event::Decided { id: got, decision, .. }) = nodes[1].poll_event() {
///             if got == id {
///                 break decision;
///             }
///         }
///     },
/// };
/// assert!(decision.is_allowed());
/// assert_eq!(decision.limit, 100);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Node {
    config: NodeConfig,
    membership: Membership,
    holdings: Holdings,
    authorities: Authorities,
    backups: Backups,
    cells: Arc<Cells>,
    outbox: Outbox,
    transmits: VecDeque<Transmit>,
    events: VecDeque<Event>,
    /// Scratch of the requests a holding decided (emptied into `events` each time).
    decided: Vec<crate::mesh::holder::Decided>,
    /// Scratch of a flush: the frames made, before they are queued.
    flushed: Vec<Transmit>,
    stats: NodeStats,
    next_id: u64,
    /// How deep the current call re-asks through this node's own authority.
    local_depth: u8,
    /// Whose start answer the node waits for, whose it answered, the authorities it keeps
    /// or awaits, and whether a peer declared it dead.
    transfers: Transfers,
    /// Holders' reports kept for keys this node owns while their authority is not here.
    deferred: deferred::Deferred,
    running: bool,
    membership_version: u64,
    /// The node's rounds, and when each key needs the node next.
    schedule: Schedule,
    /// Joining the cluster, and the decisions before.
    join: join::Join,
    /// The node's own policies, and its peers' while their configurations differ.
    limits: limits::Enforcement,
    /// The keys locked out (`block_for`) that this node's authorities or backups keep.
    locks: Locks,
    /// Questions and answers of the admin API for the embedding program.
    admin: admin::AdminQueue,
    /// What was saved for a restart of every node, and read back.
    snapshots: snapshots::Snapshots,
}

impl Node {
    /// Build a node at `now` (its clock).
    pub fn new(config: NodeConfig, now: Nanos) -> Result<Node, MeshError> {
        for (index, p) in config.policies.iter().enumerate() {
            if !p.algorithm().is_shared_by_mesh() {
                return Err(MeshError::UnsupportedAlgorithm {
                    index,
                    algorithm: p.algorithm().name(),
                });
            }
            if p.capacity() > MAX_LEASE_TOKENS {
                return Err(MeshError::LimitTooLarge {
                    index,
                    limit: p.capacity(),
                });
            }
        }
        if config.lockouts.len() > config.policies.len()
            || config.lockouts.iter().any(|&l| l > MAX_LOCKOUT_NS)
        {
            return Err(MeshError::Invalid {
                field: "lockouts",
                reason: "one per policy at most, each at most a week",
            });
        }
        let max = crate::ids::MAX_NODE_ID;
        if config.id > max || config.seeds.iter().any(|&s| s > max) {
            return Err(MeshError::Invalid {
                field: "id",
                reason: "node ids are at most 2^63 - 1",
            });
        }
        if config.gossip_interval_ns == 0 {
            return Err(MeshError::Invalid {
                field: "gossip_interval",
                reason: "must be positive",
            });
        }
        if config.dead_after_rounds < 3 {
            return Err(MeshError::Invalid {
                field: "dead_after_rounds",
                reason: "must be at least 3",
            });
        }
        if config.max_datagram_bytes < 200 {
            return Err(MeshError::Invalid {
                field: "max_datagram_bytes",
                reason: "must be at least 200",
            });
        }
        let incarnation = if config.incarnation == 0 {
            now.max(1)
        } else {
            config.incarnation
        };
        let dead_after = config.dead_after_rounds * config.gossip_interval_ns;
        let mut membership =
            Membership::new(config.id, incarnation, &config.seeds, dead_after, now);
        membership.set_configured(config.cluster_size);
        let transfers = Transfers::new(membership.peers().keys().copied());
        let running = transfers.synced() && !config.joins;
        membership.set_syncing(!running);
        membership.set_digest(config.digest);
        let cells = Arc::new(Cells::with_calendars(
            config.policies.clone(),
            &config.calendars,
            config.max_keys,
        ));
        let g = config.gossip_interval_ns;
        let mut node = Node {
            membership_version: membership.version(),
            membership,
            holdings: Holdings::default(),
            authorities: Authorities::default(),
            backups: Backups::default(),
            cells,
            outbox: Outbox::default(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            decided: Vec::new(),
            flushed: Vec::new(),
            stats: NodeStats::default(),
            next_id: 1,
            local_depth: 0,
            running,
            schedule: Schedule::new(now, g),
            transfers,
            deferred: deferred::Deferred::default(),
            join: join::Join::new(&config, now),
            limits: limits::Enforcement::new(config.policies.clone(), config.calendars.clone()),
            locks: Locks::default(),
            admin: admin::AdminQueue::default(),
            snapshots: snapshots::Snapshots::default(),
            config,
        };
        // Say hello (and ask for what this node should hold) at once.
        let peers: Vec<NodeId> = node.membership.peers().keys().copied().collect();
        for p in peers {
            node.outbox.heartbeat(p);
        }
        node.flush(now);
        Ok(node)
    }

    /// Return when the node must be called again (its clock), at the latest: at once while a
    /// round is split over several calls ([`Node::handle_timeout_within`]).
    pub fn poll_timeout(&self) -> Nanos {
        self.schedule.next_timeout()
    }

    /// Note that `key`'s authority changed since its last backup (listed once until the
    /// round sends it).
    fn mark_dirty(&mut self, key: KeyRef) {
        self.authorities.changed(key);
    }

    /// Queue the next instant `key` needs the node: its holding's or its authority's
    /// earliest deadline.
    fn arm(&mut self, key: KeyRef) {
        let holding = self.holdings.get(&key);
        let authority = self.authorities.get(&key);
        if holding.is_none() && authority.is_none() {
            return;
        }
        let at = [
            holding.and_then(Holding::next_deadline),
            authority.and_then(Authority::next_timeout),
        ]
        .into_iter()
        .flatten()
        .min();
        self.schedule.arm(key, at);
    }

    /// `key` has no holding and no authority any more: nothing is queued for it.
    fn forget_if_gone(&mut self, key: KeyRef) {
        if !self.holdings.contains_key(&key) && !self.authorities.contains_key(&key) {
            self.schedule.forget(key);
        }
    }

    /// Return the next frame to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// Return the next event.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The policy number `index` is enforced with now, if there is one.
    fn policy(&self, index: u32) -> Option<MeshPolicy> {
        self.limits.of_policy(index)
    }

    /// The policy the state of `key` (its authority, its holding) is enforced with now:
    /// such state exists only for a policy the node has, and their number never changes.
    fn enforced(&self, key: KeyRef) -> MeshPolicy {
        self.limits
            .of_key(&key)
            .unwrap_or_else(|| self.limits.enforced()[key.policy as usize].into())
    }

    fn holding_mut(&mut self, key: KeyRef) -> Option<&mut Holding> {
        let policy = self.limits.of_key(&key)?;
        Some(
            self.holdings
                .get_or_make(key, &policy, self.stats.rounds, &self.cells),
        )
    }

    /// Decide a request of `cost` for `key` (its stable hash, [`crate::ids::KeyHasher::key`])
    /// under mesh policy `policy`, at `now`.
    pub fn decide(&mut self, policy: u32, key: u64, cost: u64, now: Nanos) -> Admit {
        let kr = KeyRef { policy, key };
        let Some(p) = self.policy(policy) else {
            return Admit::Now(Decision::cannot_fit(0), None);
        };
        if let Some((d, charge)) = self.cells.decide_charged(policy, key, cost, now) {
            return Admit::Now(d, charge);
        }
        if cost == 0 || cost > p.capacity() {
            return Admit::Now(Decision::cannot_fit(p.capacity()), None);
        }
        if !self.join.joined() {
            return Admit::Now(self.joining_decide(kr, *p, cost, now), None);
        }
        // A key beyond `max_keys` (a flood of new keys, or more keys in use than the node is
        // sized for): this node's share of the limit, with no gossip; the cluster then admits
        // at most the limit for such a key, and may deny a key whose traffic leans on one
        // node.
        if self.cells.is_full(policy, key) {
            return Admit::Now(self.cells.overflow(policy, key, cost, now), None);
        }
        let id = self.next_id;
        self.next_id += 1;
        let deadline = now.saturating_add(self.config.max_wait_ns);
        // A key this node holds nothing of: its first request may go on credit.
        let credit = if self.holdings.contains_key(&kr) {
            0
        } else {
            self.config
                .credit_for(p.capacity(), self.membership.alive_count())
        };
        let Some(h) = self.holding_mut(kr) else {
            return Admit::Now(Decision::cannot_fit(0), None);
        };
        let slow = h.slow(&p, now, id, cost, deadline);
        // The next round counts what was offered.
        self.schedule.touch(kr);
        match slow {
            Slow::Decided(d) => Admit::Now(d, None),
            Slow::Taken(d, charge) => Admit::Now(d, Some(charge)),
            Slow::Waits => {
                self.stats.waits += 1;
                self.ask(kr, now, false);
                self.flush(now);
                // A key this node owns may be answered at once.
                let answered = self
                    .events
                    .iter()
                    .position(|e| matches!(e, Event::Decided { id: i, .. } if *i == id))
                    .and_then(|i| self.events.remove(i));
                if let Some(Event::Decided {
                    decision, charge, ..
                }) = answered
                {
                    self.stats.waits -= 1;
                    return Admit::Now(decision, charge);
                }
                if cost <= credit
                    && let Some(h) = self.holdings.get_mut(&kr)
                {
                    // Admitted now; the tokens the want asked for pay for it when they
                    // come, and the node keeps the holding (so takes no second credit for
                    // the key) for a window.
                    h.prepay(id, now.saturating_add(p.window_ns()));
                    self.stats.waits -= 1;
                    self.stats.credited += 1;
                    // What it reports is what a key unused for a while has: the whole
                    // capacity but this request, until the window's end on this clock.
                    let reset = if p.algorithm().is_rate_based() {
                        cost.saturating_mul(p.interval_ns())
                    } else {
                        p.window_at(now).end_ns.saturating_sub(now)
                    };
                    let decision = Decision::allowed(p.capacity(), p.capacity() - cost, reset);
                    return Admit::Now(decision, None);
                }
                Admit::Wait(id)
            }
        }
    }

    /// Give back `cost` tokens an admission of `key` took (its `charge`, from
    /// [`Admit::Now`] or [`Event::Decided`]): another policy of the request denied it. They
    /// go back to the key's lease if it is still the one they came from; otherwise they stay
    /// counted (the cluster then admits less, never more). Return whether they went back.
    pub fn refund(&self, policy: u32, key: u64, cost: u64, charge: MeshCharge) -> bool {
        self.cells.refund(policy, key, cost, charge)
    }

    /// Send the key's owner this node's lease state (and what its waiting requests need).
    fn ask(&mut self, key: KeyRef, now: Nanos, refill: bool) {
        let last = self.membership.is_leaving();
        self.ask_with(key, now, refill, last);
    }

    /// [`Node::ask`]; `last`: a leaving node's report, which must arrive (it goes on a
    /// reliable frame).
    fn ask_with(&mut self, key: KeyRef, now: Nanos, refill: bool, last: bool) {
        self.schedule.touch(key);
        let round = self.schedule.round();
        let leaving_owner = self
            .membership
            .is_leaving()
            .then(|| self.rightful_owner(key.key, now));
        let Some(h) = self.holdings.get_mut(&key) else {
            return;
        };
        // Rounds it skipped at rest since it was last looked at count before it reports.
        h.catch_up_to(self.schedule.rounds_done());
        let owner = leaving_owner
            .unwrap_or_else(|| self.membership.owner_and_successor_in(key.key, h.rank()).0);
        let resend = resend_after(&self.membership, &self.config, owner, now);
        let want = h.want(now, round, refill, resend);
        if owner == self.config.id {
            let incarnation = self.membership.incarnation();
            self.on_want(now, owner, incarnation, want);
        } else if last {
            self.outbox.push_reliable(owner, Item::Want(want));
        } else {
            self.outbox.push(owner, Item::Want(want));
        }
    }

    /// Give back what every lease holds (those with no request waiting) and report it to
    /// the keys' owners on reliable frames, with what was spent since the last report: a
    /// leaving node's last reports.
    fn give_back_all(&mut self, now: Nanos) {
        let keys: Vec<KeyRef> = self.holdings.keys().collect();
        for key in keys {
            if let Some(h) = self.holdings.get_mut(&key)
                && (h.give_back(0) > 0 || h.unconfirmed())
            {
                self.ask_with(key, now, false, true);
            }
        }
    }

    /// Tell whether this node could grant from a key's budget at `now` (it keeps the key's
    /// authority, owns the key, and its authority lease holds).
    pub fn can_grant(&self, policy: u32, key: u64, now: Nanos) -> bool {
        let Some(a) = self.authorities.get(&KeyRef { policy, key }) else {
            return false;
        };
        let (owner, successor) = self.membership.owner_and_successor_in(key, a.rank());
        owner == self.config.id
            && !self.membership.is_leaving()
            && self.lease_holds(key, successor, Some(a.rank()), now)
    }

    /// Return the backup this node keeps of a key's authority, if any.
    pub(crate) fn backup(&self, policy: u32, key: u64) -> Option<&AuthorityState> {
        self.backups.get(&KeyRef { policy, key }).map(|b| &b.state)
    }

    fn on_grant(&mut self, now: Nanos, from: NodeId, grant: Grant) {
        let Some(policy) = self.limits.of_key(&grant.key) else {
            return;
        };
        let expiry = if policy.algorithm().counts_per_window() {
            match self.membership.offset(from, now) {
                Some(o) => o.earliest_local(grant.ends_at),
                None => now,
            }
        } else {
            0
        };
        let Some(h) = self.holdings.get_mut(&grant.key) else {
            return;
        };
        self.schedule.touch(grant.key);
        h.apply_grant(&policy, now, &grant, expiry, &mut self.decided);
        if grant.window >= h.lease().0 {
            h.previous_confirmed();
        }
        let again = h.should_ask(now);
        for (id, decision, charge) in self.decided.drain(..) {
            self.events.push_back(Event::Decided {
                id,
                decision,
                charge,
            });
        }
        if self.membership.is_leaving() {
            // A leaving node admits nothing more: what it was granted goes back.
            if let Some(h) = self.holdings.get_mut(&grant.key)
                && h.give_back(0) > 0
            {
                self.ask(grant.key, now, false);
            }
            return;
        }
        // A grant from this node's own authority re-asks in the same call; the depth cap
        // keeps a holder and its local authority from echoing each other without end (the
        // holder's resend timer asks again).
        if again && self.local_depth < MAX_LOCAL_DEPTH {
            self.local_depth += 1;
            self.ask(grant.key, now, false);
            self.local_depth -= 1;
        }
    }

    /// Leave the cluster at `now` (a drain): give every lease back, hand every authority to
    /// its next owner, and say so in every frame from now on. Until it stops, the node gives
    /// back whatever it is granted still, and passes on whatever authority reaches it.
    pub fn leave(&mut self, now: Nanos) {
        // Given back first: the leases of keys it owns go back into their authorities
        // here, before those are handed over; the others' owners get the reports on reliable
        // frames.
        self.give_back_all(now);
        self.membership.leave();
        // The backups of owners that do not answer (one that died a moment ago, not
        // declared dead yet) may be all that is left of their authorities: they go to the
        // next owners too, as authorities. (A live owner backs up to its new successor
        // itself; a stale copy merged into its authority would count again grants that it
        // has since forgotten, once all spent and refilled.)
        // (One that would be idle by now holds nothing its next owner's fresh one lacks.)
        let orphaned = self.backups.keys_where(|key, b| {
            !self.membership.is_responsive(b.from, now)
                && !self.authorities.contains_key(key)
                && !self.is_idle_backup(key, b, now)
        });
        for key in orphaned {
            let (Some(b), Some(policy)) = (self.backups.remove(&key), self.limits.of_key(&key))
            else {
                continue;
            };
            let offset = self.offset_or_guess(b.from, now);
            let authority = Authority::from_state(&b.state, &policy, offset, now);
            self.authorities.insert(key, authority);
        }
        let keys: Vec<KeyRef> = self.authorities.keys().collect();
        for key in keys {
            let next = self.rightful_owner(key.key, now);
            if next != self.config.id {
                self.hand_off(now, key, next);
            }
        }
        let peers: Vec<NodeId> = self.membership.peers().keys().copied().collect();
        for p in peers {
            self.outbox.heartbeat(p);
        }
        self.flush(now);
    }

    fn flush(&mut self, now: Nanos) {
        self.cells.publish(
            self.running,
            self.join.joined(),
            self.membership.configured(),
        );
        let touched = self.schedule.take_touched();
        for &key in &touched {
            self.arm(key);
            self.schedule.candidate(key);
        }
        self.schedule.keep_touched(touched);
        self.schedule
            .drop_stale_timers(|key| self.authorities.has_waiters(key));
        if self.outbox.is_empty() {
            return;
        }
        let mut out = std::mem::take(&mut self.flushed);
        let membership = &mut self.membership;
        self.outbox.flush(
            self.config.max_datagram_bytes,
            |to| membership.header(now, to),
            &mut out,
        );
        self.stats.gossip_held_back = self.outbox.held_back();
        for t in out.drain(..) {
            self.stats.frames_sent += 1;
            self.stats.bytes_sent += t.bytes.len() as u64;
            self.transmits.push_back(t);
        }
        // The list's room serves the next flush, unless a burst grew it.
        if out.capacity() <= MAX_KEPT_FLUSHED {
            self.flushed = out;
        }
    }
}

/// The most frames' room a flush's scratch lists keep for the next flush (a round's flush
/// makes one frame per peer).
const MAX_KEPT_FLUSHED: usize = 256;

/// How deep a holder's re-ask may recurse through this node's own authority.
const MAX_LOCAL_DEPTH: u8 = 4;

/// How long a holder waits for a key's `owner` to answer before it asks again: three
/// round trips to it (a lost frame costs that much), between 2 ms and two rounds.
fn resend_after(membership: &Membership, config: &NodeConfig, owner: NodeId, now: Nanos) -> Nanos {
    let round_trip = membership.offset(owner, now).map_or(0, |o| o.round_trip);
    (3 * round_trip).clamp(2_000_000, 2 * config.gossip_interval_ns)
}

/// Give a map's memory back when it is mostly empty.
fn shrink_map<K: Eq + std::hash::Hash, V, S: std::hash::BuildHasher>(
    map: &mut std::collections::HashMap<K, V, S>,
) {
    if map.capacity() > 1024 && map.len() < map.capacity() / 4 {
        map.shrink_to(map.len() * 2);
    }
}

#[cfg(test)]
mod tests;
