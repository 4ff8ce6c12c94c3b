//! The map of lease cells the request path reads: owned by the node (which adds and removes
//! cells as keys come and go), shared read-only with the threads that decide requests.
//!
//! [`Cells::decide`] is the whole fast path of a global decision: one map read (a shard's
//! read lock) and the lease's compare-and-swap. It returns `None` when the lease cannot
//! decide (no cell yet, too few tokens, expired): the caller then takes the node's slow path.
//!
//! [`Cells::overflow_decide`] is the fallback for a key the node cannot hold a lease for
//! (beyond its key cap, or arriving faster than the node can introduce keys): the key is
//! decided by this node alone at its share of the limit, in a local store per policy, with
//! no lock wider than the local store's shard.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use dashmap::DashMap;

use crate::clock::Nanos;
use crate::decision::Decision;
use crate::local::Store;
use crate::mesh::authority::MeshKind;
use crate::mesh::lease::LeaseCell;
use crate::mesh::message::KeyRef;
use crate::policy::Policy;

/// `policy` with a `1 / nodes` share of its limit (and rate): what a node enforces alone
/// (its overflow store, and its decisions before it joined).
pub(crate) fn scaled(policy: &Policy, nodes: usize) -> Policy {
    let n = nodes.max(1) as u64;
    let share = |x: u64| (x / n).max(1);
    match MeshKind::of(policy) {
        Some(MeshKind::Bucket) => {
            // Rate r per window: r/n per window, burst/n.
            let window = std::time::Duration::from_nanos(policy.window_ns());
            let built = if policy.algorithm() == crate::policy::Algorithm::Gcra {
                Policy::gcra(share(policy.capacity()), window, share(policy.capacity()))
            } else {
                Policy::token_bucket(share(policy.capacity()), window, share(policy.capacity()))
            };
            built.unwrap_or(*policy)
        }
        Some(MeshKind::FixedWindow) => Policy::fixed_window(
            share(policy.capacity()),
            std::time::Duration::from_nanos(policy.window_ns()),
        )
        .unwrap_or(*policy),
        _ => Policy::sliding_window(
            share(policy.capacity()),
            std::time::Duration::from_nanos(policy.window_ns()),
        )
        .unwrap_or(*policy),
    }
}

/// How [`Cells::decide_behind`] decided a request the node could not take in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behind {
    /// By the key's lease, which covered it.
    Lease(Decision),
    /// Denied: the node holds a lease for the key that could not cover it.
    Late(Decision),
    /// Not decided: the node holds no lease for the key (its share may decide it).
    Unheld,
}

/// The lease cells of one node, by key.
#[derive(Debug)]
pub struct Cells {
    map: DashMap<KeyRef, Arc<LeaseCell>, ahash::RandomState>,
    policies: Vec<Limits>,
    /// Per policy, the keys decided by this node's share alone (made at the first such key).
    overflow: Vec<OnceLock<Store<u64>>>,
}

/// What the request path needs of a policy; its limit and rate change live
/// ([`Cells::set_policy`]).
#[derive(Debug)]
struct Limits {
    kind: MeshKind,
    capacity: AtomicU64,
    interval_ns: AtomicU64,
    /// The policy as configured (the overflow store's is scaled from it).
    policy: Policy,
}

impl Cells {
    /// An empty map for the cluster's `policies` (all of a kind the mesh shares).
    pub fn new(policies: Vec<(Policy, MeshKind)>) -> Self {
        Cells {
            map: DashMap::with_hasher(ahash::RandomState::new()),
            overflow: policies.iter().map(|_| OnceLock::new()).collect(),
            policies: policies
                .into_iter()
                .map(|(p, kind)| Limits {
                    kind,
                    capacity: AtomicU64::new(p.capacity()),
                    interval_ns: AtomicU64::new(p.interval_ns()),
                    policy: p,
                })
                .collect(),
        }
    }

    /// Return policy number `policy`'s limit (its capacity), 0 for no such policy.
    pub fn capacity(&self, policy: u32) -> u64 {
        self.policies
            .get(policy as usize)
            .map_or(0, |l| l.capacity.load(Ordering::Relaxed))
    }

    /// Decide a request for `key` by this node alone, at its share of the limit among
    /// `members` (`limit / members`), in policy `policy`'s overflow store of at most
    /// `max_keys` keys (beyond them, that store's shared overflow cell). For a key the node
    /// cannot hold a lease for; no gossip.
    pub fn overflow_decide(
        &self,
        policy: u32,
        key: u64,
        cost: u64,
        now: Nanos,
        members: usize,
        max_keys: usize,
    ) -> Decision {
        let (Some(limits), Some(store)) = (
            self.policies.get(policy as usize),
            self.overflow.get(policy as usize),
        ) else {
            return Decision::cannot_fit(0);
        };
        store
            .get_or_init(|| Store::new(scaled(&limits.policy, members), max_keys.max(1)))
            .decide(&key, now, cost)
    }

    /// Decide a request the node cannot take in time (its queue to the node is full, or the
    /// request waited in it longer than the mesh's longest wait). A key this node holds a
    /// lease for is decided by the lease, or denied with `retry_after`: the other holders
    /// may have the rest of the limit, and the node's share would admit on top of what the
    /// key's authority granted. Any other key (its first request here) is left to the
    /// node's share ([`Behind::Unheld`], see [`Cells::overflow_decide`]).
    pub fn decide_behind(
        &self,
        policy: u32,
        key: u64,
        cost: u64,
        now: Nanos,
        retry_after: Nanos,
    ) -> Behind {
        if !self.contains(policy, key) {
            return Behind::Unheld;
        }
        match self.decide(policy, key, cost, now) {
            Some(d) => Behind::Lease(d),
            None => Behind::Late(Decision::denied(
                self.capacity(policy),
                0,
                retry_after,
                retry_after,
            )),
        }
    }

    /// Decide policy number `index` by `policy` from now on (the same kind, another limit
    /// or rate).
    pub(crate) fn set_policy(&self, index: usize, policy: &Policy) {
        if let Some(l) = self.policies.get(index) {
            l.capacity.store(policy.capacity(), Ordering::Relaxed);
            l.interval_ns.store(policy.interval_ns(), Ordering::Relaxed);
        }
    }

    /// Decide a request from its lease alone, if the lease can.
    #[inline]
    pub fn decide(&self, policy: u32, key: u64, cost: u64, now: Nanos) -> Option<Decision> {
        let limits = self.policies.get(policy as usize)?;
        let kind = limits.kind;
        let capacity = limits.capacity.load(Ordering::Relaxed);
        if cost == 0 || cost > capacity {
            return Some(Decision::cannot_fit(capacity));
        }
        let cell = self.map.get(&KeyRef { policy, key })?;
        let remaining = cell.take(now, cost).ok()?;
        let reset = if kind.is_window() {
            cell.expiry().unwrap_or(now).saturating_sub(now)
        } else {
            capacity
                .saturating_sub(remaining)
                .saturating_mul(limits.interval_ns.load(Ordering::Relaxed))
        };
        Some(Decision::allowed(capacity, remaining, reset))
    }

    /// Return the number of cells.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Tell whether there are no cells.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Tell whether the node holds a lease cell for `key` under policy `policy`.
    pub fn contains(&self, policy: u32, key: u64) -> bool {
        self.map.contains_key(&KeyRef { policy, key })
    }

    /// Give back the memory of a map that a burst of keys grew and that is now mostly empty.
    pub(crate) fn shrink(&self) {
        if self.map.capacity() > 1024 && self.map.len() < self.map.capacity() / 4 {
            self.map.shrink_to_fit();
        }
    }

    pub(crate) fn insert(&self, key: KeyRef, cell: Arc<LeaseCell>) {
        self.map.insert(key, cell);
    }

    pub(crate) fn remove(&self, key: &KeyRef) {
        self.map.remove(key);
    }
}

#[cfg(all(test, not(ratemesh_loom)))]
mod tests {
    use super::*;

    fn cells() -> Cells {
        let policy = Policy::fixed_window(30, std::time::Duration::from_secs(1)).unwrap();
        Cells::new(vec![(policy, MeshKind::FixedWindow)])
    }

    #[test]
    fn a_node_behind_never_decides_a_key_it_holds_a_lease_for_by_its_share() {
        let cells = cells();
        let lease = Arc::new(LeaseCell::new());
        lease.renew(1, Some(1 << 30));
        cells.insert(KeyRef { policy: 0, key: 7 }, Arc::clone(&lease));
        // The lease covers one request; the next is denied rather than left to the share
        // (which would come on top of the other holders' leases).
        let now = 1 << 20;
        assert!(matches!(
            cells.decide_behind(0, 7, 1, now, 50),
            Behind::Lease(d) if d.is_allowed()
        ));
        assert!(matches!(
            cells.decide_behind(0, 7, 1, now, 50),
            Behind::Late(d) if !d.is_allowed() && d.retry_after_ns == 50
        ));
        // A key with no lease here is left to the node's share.
        assert_eq!(cells.decide_behind(0, 8, 1, now, 50), Behind::Unheld);
    }
}
