//! The map of lease cells the request path reads: owned by the node (which adds and removes
//! cells as keys come and go), shared read-only with the threads that decide requests.
//!
//! [`Cells::decide`] is the whole fast path of a global decision: one map read (a shard's
//! read lock) and the lease's compare-and-swap. It returns `None` when the lease cannot
//! decide (no cell yet, too few tokens, expired): the caller then takes the node's slow path.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;

use crate::clock::Nanos;
use crate::decision::Decision;
use crate::mesh::authority::MeshKind;
use crate::mesh::lease::LeaseCell;
use crate::mesh::message::KeyRef;
use crate::policy::Policy;

/// The lease cells of one node, by key.
#[derive(Debug)]
pub struct Cells {
    map: DashMap<KeyRef, Arc<LeaseCell>, ahash::RandomState>,
    policies: Vec<Limits>,
}

/// What the request path needs of a policy; its limit and rate change live
/// ([`Cells::set_policy`]).
#[derive(Debug)]
struct Limits {
    kind: MeshKind,
    capacity: AtomicU64,
    interval_ns: AtomicU64,
}

impl Cells {
    /// An empty map for the cluster's `policies` (all of a kind the mesh shares).
    pub fn new(policies: Vec<(Policy, MeshKind)>) -> Self {
        Cells {
            map: DashMap::with_hasher(ahash::RandomState::new()),
            policies: policies
                .into_iter()
                .map(|(p, kind)| Limits {
                    kind,
                    capacity: AtomicU64::new(p.capacity()),
                    interval_ns: AtomicU64::new(p.interval_ns()),
                })
                .collect(),
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

    pub(crate) fn insert(&self, key: KeyRef, cell: Arc<LeaseCell>) {
        self.map.insert(key, cell);
    }

    pub(crate) fn remove(&self, key: &KeyRef) {
        self.map.remove(key);
    }
}
