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

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use dashmap::DashMap;

use crate::algorithm::calendar::{CalendarWindow, Warp};
use crate::clock::Nanos;
use crate::decision::{Decision, MeshCharge};
use crate::local::Store;
use crate::mesh::lease::LeaseCell;
use crate::mesh::message::KeyRef;
use crate::policy::{Algorithm, Policy};

/// `policy` with a `1 / nodes` share of its limit (and rate): what a node enforces alone
/// (its overflow store, and its decisions before it joined).
pub(crate) fn scaled(policy: &Policy, nodes: usize) -> Policy {
    let n = nodes.max(1) as u64;
    let share = |x: u64| (x / n).max(1);
    match policy.algorithm() {
        Algorithm::TokenBucket | Algorithm::Gcra => {
            // Rate r per window: r/n per window, burst/n.
            let window = std::time::Duration::from_nanos(policy.window_ns());
            let built = if policy.algorithm() == Algorithm::Gcra {
                Policy::gcra(share(policy.capacity()), window, share(policy.capacity()))
            } else {
                Policy::token_bucket(share(policy.capacity()), window, share(policy.capacity()))
            };
            built.unwrap_or(*policy)
        }
        Algorithm::FixedWindow => Policy::fixed_window(
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

/// A node's admission front: the lease cells of its keys, which the request path decides
/// on without the node ([`Cells::admit`]), the keys beyond the node's cap decided by its
/// share alone, and what the node tells the request path of itself (running, joined, its
/// cluster's size). The node owns it and alone writes it; a transport reads it.
#[derive(Debug)]
pub struct Cells {
    map: DashMap<KeyRef, Arc<LeaseCell>, ahash::RandomState>,
    /// How many cells `map` holds (kept beside it: a `DashMap`'s own count reads every
    /// shard).
    count: AtomicUsize,
    policies: Vec<CellPolicy>,
    /// Per policy, the keys decided by this node's share alone (made at the first such key).
    overflow: Vec<OnceLock<Store<u64>>>,
    /// The most keys the node holds leases for (its `max_keys`).
    max_keys: usize,
    /// Requests for keys beyond `max_keys`, decided by the node's share alone.
    overflowed: AtomicU64,
    /// What the node published at its last call.
    running: AtomicBool,
    joined: AtomicBool,
    members: AtomicUsize,
}

/// What the request path needs of a policy; its limit and rate change live
/// ([`Cells::set_policy`]).
#[derive(Debug)]
struct CellPolicy {
    capacity: AtomicU64,
    interval_ns: AtomicU64,
    /// The policy as configured (the overflow store's is scaled from it).
    policy: Policy,
    /// A calendar policy's clock for its overflow store (whose fixed windows then count
    /// the calendar's periods).
    warp: Option<Warp>,
}

impl Cells {
    /// An empty map for the cluster's `policies` (all of a kind the mesh shares), for a
    /// node that holds leases for at most `max_keys` keys.
    pub fn new(policies: Vec<Policy>, max_keys: usize) -> Self {
        Cells::with_calendars(policies, &[], max_keys)
    }

    /// [`Cells::new`], with each window policy's calendar (by index; missing or `None`:
    /// windows of its length).
    pub(crate) fn with_calendars(
        policies: Vec<Policy>,
        calendars: &[Option<CalendarWindow>],
        max_keys: usize,
    ) -> Self {
        Cells {
            max_keys: max_keys.max(1),
            overflowed: AtomicU64::new(0),
            running: AtomicBool::new(false),
            joined: AtomicBool::new(false),
            members: AtomicUsize::new(1),
            map: DashMap::with_hasher(ahash::RandomState::new()),
            count: AtomicUsize::new(0),
            overflow: policies.iter().map(|_| OnceLock::new()).collect(),
            policies: policies
                .into_iter()
                .enumerate()
                .map(|(i, p)| CellPolicy {
                    capacity: AtomicU64::new(p.capacity()),
                    interval_ns: AtomicU64::new(p.interval_ns()),
                    policy: p,
                    warp: calendars.get(i).cloned().flatten().map(Warp::new),
                })
                .collect(),
        }
    }

    /// Decide a request at the front, without the node: by the key's lease if it covers it
    /// ([`Cells::decide`]), or by the node's share alone for a new key while the node holds
    /// its most keys (counted: [`Cells::overflowed`]). `None`: the node must decide it.
    /// An admission by the lease comes with its charge, to give back with
    /// [`Cells::refund`].
    pub fn admit(
        &self,
        policy: u32,
        key: u64,
        cost: u64,
        now: Nanos,
    ) -> Option<(Decision, Option<MeshCharge>)> {
        if let Some(decided) = self.decide_charged(policy, key, cost, now) {
            return Some(decided);
        }
        if self.is_full(policy, key) {
            return Some((self.overflow(policy, key, cost, now), None));
        }
        None
    }

    /// Give `cost` tokens of `charge` back to `key`'s lease, if they came from the lease it
    /// holds now (a later lease, or none, refuses them: they stay counted). Return whether
    /// they went back.
    pub fn refund(&self, policy: u32, key: u64, cost: u64, charge: MeshCharge) -> bool {
        self.map
            .get(&KeyRef { policy, key })
            .is_some_and(|cell| cell.give_back(charge, cost))
    }

    /// Tell whether `key` is a new key while the node holds its most keys.
    #[inline]
    pub(crate) fn is_full(&self, policy: u32, key: u64) -> bool {
        self.len() >= self.max_keys && !self.contains(policy, key)
    }

    /// Decide a request for a key beyond the node's cap by its share alone, counted
    /// ([`Cells::overflowed`]).
    pub(crate) fn overflow(&self, policy: u32, key: u64, cost: u64, now: Nanos) -> Decision {
        self.overflowed.fetch_add(1, Ordering::Relaxed);
        let members = self.members();
        self.overflow_decide(policy, key, cost, now, members, self.max_keys)
    }

    /// Return how many requests for keys beyond the node's cap were decided by its share.
    pub fn overflowed(&self) -> u64 {
        self.overflowed.load(Ordering::Relaxed)
    }

    /// The node's cap on the keys it holds leases for.
    pub fn max_keys(&self) -> usize {
        self.max_keys
    }

    /// Publish the node's state to the request path (the node's own call, after each of
    /// its calls): whether it runs, whether it joined, its cluster's configured size.
    pub(crate) fn publish(&self, running: bool, joined: bool, members: usize) {
        self.running.store(running, Ordering::Release);
        self.joined.store(joined, Ordering::Release);
        self.members.store(members.max(1), Ordering::Relaxed);
    }

    /// Tell whether the node has recovered its state and admits (as last published).
    pub fn is_running(&self) -> bool {
        self.running.load(Ordering::Acquire)
    }

    /// Tell whether the node has joined its cluster (as last published).
    pub fn is_joined(&self) -> bool {
        self.joined.load(Ordering::Acquire)
    }

    /// The node's configured cluster size (as last published): the share of a request
    /// decided alone is `1 / members` of the limit.
    #[inline]
    pub fn members(&self) -> usize {
        self.members.load(Ordering::Relaxed)
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
        let store =
            store.get_or_init(|| Store::new(scaled(&limits.policy, members), max_keys.max(1)));
        self.decide_alone(policy, store, key, cost, now)
    }

    /// Decide `cost` for `key` at `now` in `store`, a store of policy number `policy`'s
    /// keys decided by this node alone: on a calendar policy's clock, so that its fixed
    /// windows are the calendar's periods.
    pub(crate) fn decide_alone(
        &self,
        policy: u32,
        store: &Store<u64>,
        key: u64,
        cost: u64,
        now: Nanos,
    ) -> Decision {
        let warp = self
            .policies
            .get(policy as usize)
            .and_then(|l| l.warp.as_ref());
        let Some(warp) = warp else {
            return store.decide(&key, now, cost);
        };
        let at = warp.at(now);
        let mut decision = store.decide(&key, at.now, cost);
        decision.reset_after_ns = at.real(decision.reset_after_ns);
        decision.retry_after_ns = at.real(decision.retry_after_ns);
        decision
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
        self.decide_charged(policy, key, cost, now).map(|(d, _)| d)
    }

    /// Decide a request from its lease alone, if the lease can; an admission comes with
    /// what it took.
    #[inline]
    pub(crate) fn decide_charged(
        &self,
        policy: u32,
        key: u64,
        cost: u64,
        now: Nanos,
    ) -> Option<(Decision, Option<MeshCharge>)> {
        let limits = self.policies.get(policy as usize)?;
        let capacity = limits.capacity.load(Ordering::Relaxed);
        if cost == 0 || cost > capacity {
            return Some((Decision::cannot_fit(capacity), None));
        }
        let cell = self.map.get(&KeyRef { policy, key })?;
        let (remaining, charge) = cell.take_charged(now, cost).ok()?;
        let reset = if limits.policy.algorithm().counts_per_window() {
            cell.expiry().unwrap_or(now).saturating_sub(now)
        } else {
            capacity
                .saturating_sub(remaining)
                .saturating_mul(limits.interval_ns.load(Ordering::Relaxed))
        };
        Some((Decision::allowed(capacity, remaining, reset), Some(charge)))
    }

    /// Return the number of cells.
    #[inline]
    pub fn len(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// Tell whether there are no cells.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tell whether the node holds a lease cell for `key` under policy `policy`.
    pub fn contains(&self, policy: u32, key: u64) -> bool {
        self.map.contains_key(&KeyRef { policy, key })
    }

    /// Give back the memory of a map that a burst of keys grew and that is now mostly empty.
    pub(crate) fn shrink(&self) {
        if self.map.capacity() > 1024 && self.len() < self.map.capacity() / 4 {
            self.map.shrink_to_fit();
        }
    }

    pub(crate) fn insert(&self, key: KeyRef, cell: Arc<LeaseCell>) {
        if self.map.insert(key, cell).is_none() {
            self.count.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn remove(&self, key: &KeyRef) {
        if self.map.remove(key).is_some() {
            self.count.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[cfg(all(test, not(ratemesh_loom)))]
mod tests {
    use super::*;

    fn cells() -> Cells {
        let policy = Policy::fixed_window(30, std::time::Duration::from_secs(1)).unwrap();
        Cells::new(vec![policy], 1_000_000)
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
