//! Joining a running cluster, and deciding before the node has.
//!
//! A node that joins ([`NodeConfig::joins`](super::NodeConfig)) starts knowing only the
//! members it was configured with (none, when it has only seed addresses). It says it is
//! syncing in every header; a member that hears it answers with its list of members and
//! what the node should hold, then `SyncDone`. The first member whose list and `SyncDone`
//! both arrived (they may travel apart) makes the node *joined*: from then on it decides like any member, and it owns keys once every member it
//! knew of by then answered too (`Node::is_running`). A node with no configured member that
//! hears no one within `join_timeout_ns` (or whose seeds turn out to be itself alone,
//! [`Node::start_alone`]) starts a cluster of its own; clusters that later find each other
//! merge like members that come back after a partition.
//!
//! Before it has joined, a node decides its mesh policies by `while_joining`: its even share
//! of each limit here (`local-share`, the default), every request denied, or every request
//! admitted.

use std::collections::BTreeSet;
use std::net::SocketAddr;

use super::{Event, Node};
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::local::Store;
use crate::mesh::NodeId;
use crate::mesh::cells::scaled;
use crate::mesh::message::KeyRef;
use crate::mesh::node::config::{NodeConfig, WhileJoining};
use crate::policy::Policy;

/// A denial while joining (`while_joining = "deny"`) says to retry after this long.
const DENY_RETRY_NS: Nanos = 1_000_000_000;

/// Where a node stands in joining its cluster.
#[derive(Debug)]
pub(super) struct Join {
    joined: bool,
    deadline: Nanos,
    /// Members the node expects (seed addresses that answered, a configured cluster size).
    expected: usize,
    /// Per policy, the keys decided by the node's share while it joins.
    stores: Vec<Option<Store<u64>>>,
    /// Members whose `SyncDone` arrived, and members whose list of members arrived.
    answered: BTreeSet<NodeId>,
    listed: BTreeSet<NodeId>,
}

impl Join {
    pub(super) fn new(config: &NodeConfig, now: Nanos) -> Join {
        Join {
            joined: !config.joins,
            deadline: now.saturating_add(config.join_timeout_ns),
            expected: config.cluster_size,
            stores: Vec::new(),
            answered: BTreeSet::new(),
            listed: BTreeSet::new(),
        }
    }

    pub(super) fn joined(&self) -> bool {
        self.joined
    }
}

impl Node {
    /// Tell whether the node has joined its cluster (a member answered it, or it started a
    /// cluster of its own). Before, it decides by `while_joining` and owns no key.
    pub fn is_joined(&self) -> bool {
        self.join.joined
    }

    /// Return how the node decides before it has joined.
    pub fn while_joining(&self) -> WhileJoining {
        self.config.while_joining
    }

    /// Tell the node it expects `members` members (itself included): a joining node's share
    /// of a limit is the limit over the most of this, the configured cluster size and the
    /// members it knows.
    pub fn expect_members(&mut self, members: usize) {
        self.join.expected = self.join.expected.max(members);
    }

    /// Add member `id`, which reached this node at `now` (over an authenticated connection),
    /// reached at `addr` (the transport's address, opaque here). A new member counts at once;
    /// the others are told about it.
    pub fn add_member(&mut self, now: Nanos, id: NodeId, addr: Option<SocketAddr>) {
        if id == self.config.id {
            return;
        }
        let changes = self.membership.add(id, addr, now);
        if !changes.is_empty() {
            // Say hello at once: a joining node's header asks for the members list.
            self.outbox.heartbeat(id);
        }
        self.apply_changes(now, &changes);
        self.flush(now);
    }

    /// Start a cluster of its own at `now`, if the node is still joining with no member to
    /// wait for (its seeds resolved to itself alone, or to nothing).
    pub fn start_alone(&mut self, now: Nanos) {
        if !self.join.joined && !self.has_configured_peers() && self.transfers.synced() {
            self.become_joined(now);
        }
    }

    fn has_configured_peers(&self) -> bool {
        self.config.seeds.iter().any(|&id| id != self.config.id)
    }

    /// Member `from` answered this node's sync (`SyncDone`).
    pub(super) fn join_answered(&mut self, now: Nanos, from: NodeId) {
        if !self.join.joined {
            self.join.answered.insert(from);
            self.join_if_told(now);
        }
    }

    /// Member `from` sent its list of members (it names itself in it).
    pub(super) fn join_listed(&mut self, now: Nanos, from: NodeId) {
        if !self.join.joined {
            self.join.listed.insert(from);
            self.join_if_told(now);
        }
    }

    /// Join once one member's list and `SyncDone` both arrived.
    fn join_if_told(&mut self, now: Nanos) {
        if self
            .join
            .answered
            .intersection(&self.join.listed)
            .next()
            .is_some()
        {
            self.become_joined(now);
        }
    }

    /// Once a round: a joining node with no configured member starts a cluster of its own
    /// when no one answered within the join timeout.
    pub(super) fn join_tick(&mut self, now: Nanos) {
        if !self.join.joined && now >= self.join.deadline && !self.has_configured_peers() {
            self.become_joined(now);
        }
    }

    fn become_joined(&mut self, now: Nanos) {
        self.join.joined = true;
        self.join.stores.clear();
        self.join.answered.clear();
        self.join.listed.clear();
        self.events.push_back(Event::Joined);
        self.finish_sync();
        self.flush(now);
    }

    /// Decide a request while the node has not joined, by `while_joining`.
    pub(super) fn joining_decide(
        &mut self,
        key: KeyRef,
        policy: Policy,
        cost: u64,
        now: Nanos,
    ) -> Decision {
        self.stats.joining_decisions += 1;
        let limit = policy.capacity();
        match self.config.while_joining {
            WhileJoining::Allow => Decision::allowed(limit, limit.saturating_sub(cost), 0),
            WhileJoining::Deny => Decision::denied(limit, 0, 0, DENY_RETRY_NS),
            WhileJoining::LocalShare => {
                let index = key.policy as usize;
                if self.join.stores.len() <= index {
                    self.join.stores.resize_with(index + 1, || None);
                }
                let members = self.membership.configured().max(self.join.expected);
                let max_keys = self.config.max_keys.max(1);
                let store = self.join.stores[index]
                    .get_or_insert_with(|| Store::new(scaled(&policy, members), max_keys));
                self.cells
                    .decide_alone(key.policy, store, key.key, cost, now)
            }
        }
    }
}
