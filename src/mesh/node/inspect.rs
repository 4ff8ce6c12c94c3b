//! What a node reports about itself: identity, members, counters and the state of a key
//! (read-only views for the transport, metrics, the simulator and tests).

use std::sync::Arc;

use super::{Node, NodeConfig, NodeStats};
use crate::clock::Nanos;
use crate::mesh::NodeId;
use crate::mesh::authority::Authority;
use crate::mesh::cells::Cells;
use crate::mesh::membership::Membership;
use crate::mesh::message::{AuthorityState, KeyRef};
use crate::policy::Policy;

/// A node's lease of one key, as [`Node::lease_state`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseState {
    /// The window the lease is for (window policies; 0 for buckets).
    pub window: u64,
    /// For window policies, the local instant the lease ends.
    pub expiry: Nanos,
    /// The tokens this node may still admit under the lease.
    pub unspent: u64,
    /// The requests waiting for the key's owner.
    pub waiting: usize,
}

/// What a key's authority (or its backup) leased in its current window:
/// [`Node::leases`], [`Node::backed_up_leases`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leases {
    /// The window (window policies; 0 for buckets).
    pub window: u64,
    /// One entry per holding of the key.
    pub holdings: Vec<Leased>,
}

/// What one holding of a key was leased, as the key's authority counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leased {
    /// The node that holds it.
    pub node: NodeId,
    /// The node's run (incarnation) that holds it.
    pub incarnation: u64,
    /// The holding's number on that run.
    pub holding: u64,
    /// The tokens granted to it.
    pub granted: u64,
    /// The tokens it gave back.
    pub returned: u64,
    /// The tokens it reported spent.
    pub used: u64,
}

impl Leased {
    /// The tokens granted and not given back.
    pub fn held(&self) -> u64 {
        self.granted.saturating_sub(self.returned)
    }
}

fn leases(state: &AuthorityState) -> Leases {
    Leases {
        window: state.window,
        holdings: state
            .holders
            .iter()
            .map(|h| Leased {
                node: h.node,
                incarnation: h.incarnation,
                holding: h.holding,
                granted: h.tally.granted,
                returned: h.tally.returned,
                used: h.tally.used,
            })
            .collect(),
    }
}

impl Node {
    /// Return this node's id.
    pub fn id(&self) -> NodeId {
        self.config.id
    }

    /// Return the configuration (its policies as this node's file gives them: see
    /// [`Node::policies`] for the limits enforced).
    pub fn config(&self) -> &NodeConfig {
        &self.config
    }

    /// Return the mesh policies as enforced now: the configuration's, with the lowest of
    /// each policy's limits among this node and the live peers whose configuration differs
    /// ([`Node::reconfigure`]).
    pub fn policies(&self) -> &[Policy] {
        self.limits.enforced()
    }

    /// Return this run's incarnation.
    pub fn incarnation(&self) -> u64 {
        self.membership.incarnation()
    }

    /// Tell whether the node heard from every peer since it started (or declared it dead),
    /// so it serves the keys it owns.
    pub fn is_running(&self) -> bool {
        self.running
    }

    /// Return the counters.
    pub fn stats(&self) -> NodeStats {
        self.stats
    }

    /// Return the members with whether each is alive (this node included).
    pub fn members(&self) -> Vec<(NodeId, bool)> {
        let mut out: Vec<(NodeId, bool)> = self
            .membership
            .peers()
            .iter()
            .map(|(&id, p)| (id, p.alive))
            .collect();
        out.push((self.config.id, true));
        out.sort_unstable();
        out
    }

    /// Return the membership view.
    pub(crate) fn membership(&self) -> &Membership {
        &self.membership
    }

    /// Tell whether `id` is a member this node knows of, alive or not (itself included).
    pub fn is_member(&self, id: NodeId) -> bool {
        id == self.config.id || self.membership.peer(id).is_some()
    }

    /// Tell whether `id` is a live member as this node sees it (itself always is).
    pub fn is_alive(&self, id: NodeId) -> bool {
        self.membership.is_alive(id)
    }

    /// Return the number of live members, this node included.
    pub fn alive_count(&self) -> usize {
        self.membership.alive_count()
    }

    /// Tell whether this node heard a majority of the live members at its last check: only
    /// then may it declare deaths, and its authorities grant.
    pub fn has_majority(&self) -> bool {
        self.membership.has_majority()
    }

    /// Return how late this node's own gossip rounds run (0: on time; it grows while they run
    /// late, and peers then wait longer before suspecting this node).
    pub fn lag_score(&self) -> u32 {
        self.membership.lag_score()
    }

    /// Return the members known to have left cleanly (they said so before going).
    pub fn departed(&self) -> Vec<NodeId> {
        let mut out: Vec<NodeId> = self
            .membership
            .peers()
            .iter()
            .filter(|(_, p)| p.left)
            .map(|(&id, _)| id)
            .collect();
        out.sort_unstable();
        out
    }

    /// Return how many times this node refuted a suspicion of itself during this run.
    pub fn refutations(&self) -> u32 {
        self.membership.seq()
    }

    /// Return the number of keys this node uses or owns.
    pub fn key_count(&self) -> usize {
        self.holdings.len().max(self.authorities.len())
    }

    /// Return the number of authorities this node keeps.
    pub fn authority_count(&self) -> usize {
        self.authorities.len()
    }

    /// Return the lease cells the request path reads (a shared read handle).
    pub fn cells(&self) -> Arc<Cells> {
        Arc::clone(&self.cells)
    }

    /// Return the authority of a key, if this node keeps it.
    pub(crate) fn authority(&self, policy: u32, key: u64) -> Option<&Authority> {
        self.authorities.get(&KeyRef { policy, key })
    }

    /// Return the state of a key's authority (its budget and the leases it granted), if this
    /// node keeps it.
    pub(crate) fn authority_state(&self, policy: u32, key: u64) -> Option<AuthorityState> {
        self.authority(policy, key).map(Authority::state)
    }

    /// Return what a key's authority on this node leased in the current window, one entry
    /// per holding, if this node keeps the key's authority.
    pub fn leases(&self, policy: u32, key: u64) -> Option<Leases> {
        self.authority(policy, key).map(|a| leases(&a.state()))
    }

    /// Return what a peer's authority of a key leased, as the backup this node keeps of it
    /// (as the key's successor), if it keeps one.
    pub fn backed_up_leases(&self, policy: u32, key: u64) -> Option<Leases> {
        self.backup(policy, key).map(leases)
    }

    /// Return this node's lease of a key, if it uses the key.
    pub fn lease_state(&self, policy: u32, key: u64) -> Option<LeaseState> {
        self.holdings.get(&KeyRef { policy, key }).map(|h| {
            let (window, expiry) = h.lease();
            LeaseState {
                window,
                expiry,
                unspent: h.unspent(),
                waiting: h.waiting(),
            }
        })
    }

    /// Return the owner of a key as this node sees it.
    pub fn owner_of(&self, key: u64) -> NodeId {
        self.membership.owner_and_successor(key).0
    }
}
