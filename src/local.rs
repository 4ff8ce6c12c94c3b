//! The local store: one policy's per-key cells in a `DashMap`, with a hard cap on keys.
//!
//! # The request path
//! A decision hashes the key (ahash with a per-process random seed, which resists hash
//! flooding by clients). For a word algorithm (token bucket, GCRA, leaky buckets, fixed
//! window) the thread first looks among its own shortcuts to hot keys' cells (`local::hot`,
//! skipped for keys that a filter shows cannot be hot): on a hit it compares the key and runs
//! the cell's compare-and-swap loop, and takes no lock at all. Otherwise it takes the read
//! lock of one of the map's shards and runs the cell's compare-and-swap loop (word
//! algorithms) or its per-key mutex (sliding window, sliding log). No global lock; for a
//! known key, no allocation (a key that turns hot moves its cell into a shared one once). A
//! new key is inserted under that shard's write lock.
//!
//! # The cap on keys and eviction
//! A key is *idle* when its state is equivalent to a fresh key's (a full bucket, windows
//! that are over, a log with no entry left in the window). Forgetting an idle key changes
//! no future decision, so eviction is exact: only idle keys are ever removed. A hot key's
//! shared cell is retired as it is removed, so that threads' shortcuts to it can never admit
//! again (see `local::hot` and `local::words`).
//!
//! The store never holds more than `max_keys` keys. When a new key arrives at the cap, the
//! store first sweeps out idle keys (at most once per `sweep_interval`); if the map is still
//! full, the request is decided against one shared **overflow cell** with the same policy.
//! All new keys that arrive while the store is full of busy keys share that one budget: a
//! flood of random keys can neither grow memory nor reset a busy key, and is itself limited.

mod cell;
mod hot;
mod key;
mod words;

#[cfg(not(ratemesh_loom))]
pub(crate) use cell::WordCell;
#[cfg(ratemesh_loom)]
pub use cell::{RETIRED, WordCell};
pub use key::ToKey;

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;

use crate::algorithm::{SlidingLog, SlidingWindowState, fixed_window, gcra};
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::policy::{Algorithm, Policy};
use cell::{Cell, lock};
use words::WordCells;

/// The default hasher: ahash with a random per-process seed (DoS-resistant, fast).
pub type DefaultHasher = ahash::RandomState;

/// The default cap on keys per policy.
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// Where a decision's tokens were taken: needed to give them back exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Charge {
    /// The key's own cell.
    Key,
    /// The shared overflow cell (the store was full of busy keys).
    Overflow,
}

/// Counters of a store, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreStats {
    /// Keys held now.
    pub keys: usize,
    /// Idle keys evicted since the start.
    pub evicted: u64,
    /// Decisions made on the overflow cell because the store was full.
    pub overflow_decisions: u64,
    /// Keys held now whose cell is shared with threads' shortcuts (hot keys; at most one
    /// in 16 of `max_keys`).
    pub hot_keys: usize,
    /// Keys whose cell moved into a shared one, since the start (a key counts again if it
    /// turns hot again after an eviction).
    pub hot_keys_moved: u64,
}

/// One algorithm's decision on one kind of cell, as a type: the store compiles one lookup and
/// one compare-and-swap loop per algorithm, with no algorithm `match` inside the loop.
trait Step<C> {
    fn decide(cell: &C, policy: &Policy, now: Nanos, cost: u64, reserve: bool) -> Decision;
}

struct TokenBucketStep;
struct GcraStep;
struct FixedWindowStep;
/// The leaky buckets: dispatches on police or shape inside the loop.
struct AnyWordStep;
struct SlidingWindowStep;
struct SlidingLogStep;

/// A word algorithm's decision on one cell: `decide` where the cell cannot have been retired
/// (the caller holds its map shard's lock), `decide_live` where it may have been (through a
/// thread's shortcut, or an inline cell that may have moved): `None` then.
trait WordStep {
    fn decide(cell: &WordCell, policy: &Policy, now: Nanos, cost: u64, reserve: bool) -> Decision;

    fn decide_live(
        cell: &WordCell,
        policy: &Policy,
        now: Nanos,
        cost: u64,
        reserve: bool,
    ) -> Option<Decision>;
}

impl WordStep for TokenBucketStep {
    #[inline(always)]
    fn decide(cell: &WordCell, policy: &Policy, now: Nanos, cost: u64, _: bool) -> Decision {
        cell.decide_token_bucket(policy, now, cost)
    }

    #[inline(always)]
    fn decide_live(
        cell: &WordCell,
        policy: &Policy,
        now: Nanos,
        cost: u64,
        _: bool,
    ) -> Option<Decision> {
        cell.decide_token_bucket_live(policy, now, cost)
    }
}

impl WordStep for GcraStep {
    #[inline(always)]
    fn decide(cell: &WordCell, policy: &Policy, now: Nanos, cost: u64, _: bool) -> Decision {
        cell.update(|state| gcra::decide(policy, state, now, cost))
    }

    #[inline(always)]
    fn decide_live(
        cell: &WordCell,
        policy: &Policy,
        now: Nanos,
        cost: u64,
        _: bool,
    ) -> Option<Decision> {
        cell.update_live(|state| gcra::decide(policy, state, now, cost))
    }
}

impl WordStep for FixedWindowStep {
    #[inline(always)]
    fn decide(cell: &WordCell, policy: &Policy, now: Nanos, cost: u64, _: bool) -> Decision {
        cell.update(|state| fixed_window::decide(policy, state, now, cost))
    }

    #[inline(always)]
    fn decide_live(
        cell: &WordCell,
        policy: &Policy,
        now: Nanos,
        cost: u64,
        _: bool,
    ) -> Option<Decision> {
        cell.update_live(|state| fixed_window::decide(policy, state, now, cost))
    }
}

impl WordStep for AnyWordStep {
    #[inline(always)]
    fn decide(cell: &WordCell, policy: &Policy, now: Nanos, cost: u64, reserve: bool) -> Decision {
        cell.decide(policy, now, cost, reserve)
    }

    #[inline(always)]
    fn decide_live(
        cell: &WordCell,
        policy: &Policy,
        now: Nanos,
        cost: u64,
        reserve: bool,
    ) -> Option<Decision> {
        cell.decide_live(policy, now, cost, reserve)
    }
}

impl Step<Mutex<SlidingWindowState>> for SlidingWindowStep {
    #[inline(always)]
    fn decide(
        cell: &Mutex<SlidingWindowState>,
        policy: &Policy,
        now: Nanos,
        cost: u64,
        _: bool,
    ) -> Decision {
        lock(cell).decide(policy, now, cost)
    }
}

impl Step<Mutex<SlidingLog>> for SlidingLogStep {
    #[inline(always)]
    fn decide(
        cell: &Mutex<SlidingLog>,
        policy: &Policy,
        now: Nanos,
        cost: u64,
        _: bool,
    ) -> Decision {
        lock(cell).decide(policy, now, cost)
    }
}

struct Cells<K, C, S> {
    map: DashMap<K, C, S>,
    overflow: C,
}

/// The cells of one policy, by algorithm, so a decision dispatches with one jump.
enum Table<K: Send + Sync, S> {
    TokenBucket(WordCells<K, S>),
    Gcra(WordCells<K, S>),
    FixedWindow(WordCells<K, S>),
    /// Both leaky buckets (word algorithms that dispatch inside the loop).
    LeakyBucket(WordCells<K, S>),
    SlidingWindow(Cells<K, Mutex<SlidingWindowState>, S>),
    SlidingLog(Cells<K, Mutex<SlidingLog>, S>),
}

/// Run `$body` with `$cells` bound to the table's map cells, whatever their kind.
macro_rules! with_cells {
    ($table:expr, $cells:ident => $body:expr) => {
        match $table {
            Table::TokenBucket(words)
            | Table::Gcra(words)
            | Table::FixedWindow(words)
            | Table::LeakyBucket(words) => {
                let $cells = &words.cells;
                $body
            }
            Table::SlidingWindow($cells) => $body,
            Table::SlidingLog($cells) => $body,
        }
    };
}

/// Bookkeeping shared by the three kinds of table (the policy, the key cap, sweeps, counters).
struct Bookkeeping {
    policy: Policy,
    max_keys: usize,
    keys: AtomicUsize,
    sweep_interval_ns: Nanos,
    /// When the last sweep ran, plus one (0 = never).
    last_sweep_ns: AtomicU64,
    evicted: AtomicU64,
    overflow_decisions: AtomicU64,
    hot_keys_moved: AtomicU64,
}

/// One policy's state for every key: a `DashMap` of cells with a hard cap on keys.
///
/// The engine under [`Limiter`](crate::Limiter), for callers that read the clock themselves.
///
/// ```
/// use std::time::Duration;
/// use ratemesh::Policy;
/// use ratemesh::local::Store;
///
/// // One token a second, bursts of one, at most 10,000 keys.
/// let store: Store<u64> = Store::new(Policy::token_bucket(1, Duration::from_secs(1), 1)?, 10_000);
/// let t0 = 5_000_000_000; // nanoseconds, on any clock the caller keeps
/// assert!(store.decide(&7, t0, 1).is_allowed());
/// assert!(!store.decide(&7, t0, 1).is_allowed());
/// assert!(store.decide(&7, t0 + 1_000_000_000, 1).is_allowed()); // a token a second later
/// assert_eq!(store.len(), 1);
/// # Ok::<(), ratemesh::PolicyError>(())
/// ```
pub struct Store<K: Send + Sync, S = DefaultHasher> {
    table: Table<K, S>,
    limits: Bookkeeping,
}

impl<K: Send + Sync, S> std::fmt::Debug for Store<K, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("policy", &self.limits.policy)
            .field("max_keys", &self.limits.max_keys)
            .field("keys", &self.limits.keys.load(Ordering::Relaxed))
            .finish()
    }
}

fn default_sweep_interval(policy: &Policy) -> Nanos {
    (policy.window_ns() / 4).clamp(1_000_000, 1_000_000_000)
}

impl<K: Hash + Eq + Send + Sync> Store<K, DefaultHasher> {
    /// Create a store for `policy` that holds at most `max_keys` keys.
    ///
    /// With `max_keys == 0` every key shares the overflow cell (one limit for all).
    pub fn new(policy: Policy, max_keys: usize) -> Self {
        Self::with_hasher(policy, max_keys, DefaultHasher::new())
    }
}

impl<K: Hash + Eq + Send + Sync, S: BuildHasher + Clone> Store<K, S> {
    /// Create a store with an explicit hasher (keys come from clients: keep it keyed).
    pub fn with_hasher(policy: Policy, max_keys: usize, hasher: S) -> Self {
        fn cells<K: Hash + Eq, C: Default, S: BuildHasher + Clone>(hasher: S) -> Cells<K, C, S> {
            Cells {
                map: DashMap::with_hasher(hasher),
                overflow: C::default(),
            }
        }
        let words = |hasher: S| {
            WordCells::new(cells(hasher.clone()), hasher, words::max_hot_keys(max_keys))
        };
        let table = match policy.algorithm() {
            Algorithm::TokenBucket => Table::TokenBucket(words(hasher)),
            Algorithm::Gcra => Table::Gcra(words(hasher)),
            Algorithm::FixedWindow => Table::FixedWindow(words(hasher)),
            Algorithm::LeakyBucketPolice | Algorithm::LeakyBucketShape { .. } => {
                Table::LeakyBucket(words(hasher))
            }
            Algorithm::SlidingWindow => Table::SlidingWindow(cells(hasher)),
            Algorithm::SlidingLog => Table::SlidingLog(cells(hasher)),
        };
        Store {
            table,
            limits: Bookkeeping {
                policy,
                max_keys,
                keys: AtomicUsize::new(0),
                sweep_interval_ns: default_sweep_interval(&policy),
                last_sweep_ns: AtomicU64::new(0),
                evicted: AtomicU64::new(0),
                overflow_decisions: AtomicU64::new(0),
                hot_keys_moved: AtomicU64::new(0),
            },
        }
    }

    /// Sweep for idle keys at most once per `interval_ns` when the store is full.
    pub fn with_sweep_interval_ns(mut self, interval_ns: Nanos) -> Self {
        self.limits.sweep_interval_ns = interval_ns;
        self
    }

    /// Return the policy.
    pub fn policy(&self) -> &Policy {
        &self.limits.policy
    }

    /// Return the cap on keys.
    pub fn max_keys(&self) -> usize {
        self.limits.max_keys
    }

    /// Return the number of keys held (counts every shard: not for the request path).
    pub fn len(&self) -> usize {
        with_cells!(&self.table, cells => cells.map.len())
    }

    /// Tell whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Return the counters.
    pub fn stats(&self) -> StoreStats {
        StoreStats {
            keys: self.len(),
            evicted: self.limits.evicted.load(Ordering::Relaxed),
            overflow_decisions: self.limits.overflow_decisions.load(Ordering::Relaxed),
            hot_keys: match &self.table {
                Table::TokenBucket(words)
                | Table::Gcra(words)
                | Table::FixedWindow(words)
                | Table::LeakyBucket(words) => words.hot_keys(),
                Table::SlidingWindow(_) | Table::SlidingLog(_) => 0,
            },
            hot_keys_moved: self.limits.hot_keys_moved.load(Ordering::Relaxed),
        }
    }

    /// Decide a request of `cost` tokens for `key` at `now` (a shaping bucket reserves; a
    /// cost of 0 is a peek that takes nothing and stores no new key, as in
    /// [`crate::Limiter::check`]).
    #[inline]
    pub fn decide<'a, Q>(&self, key: &'a Q, now: Nanos, cost: u64) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToKey<'a, K> + ?Sized,
    {
        self.decide_charge(key, now, cost, true, &mut Charge::Key)
    }

    /// Decide, and set `charge` to where the tokens were taken so that [`Store::refund`] can
    /// return them. (An out-parameter rather than a tuple: the decision is then written once,
    /// straight into the caller's slot.)
    #[inline(always)]
    pub fn decide_charge<'a, Q>(
        &self,
        key: &'a Q,
        now: Nanos,
        cost: u64,
        reserve: bool,
        charge: &mut Charge,
    ) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToKey<'a, K> + ?Sized,
    {
        // Dispatch on the algorithm once, outside the compare-and-swap loop, so that each
        // loop is compiled for one algorithm.
        let (limits, r) = (&self.limits, reserve);
        match &self.table {
            // The default algorithm is compiled into the caller.
            Table::TokenBucket(c) => {
                c.decide_inline::<TokenBucketStep, Q>(limits, key, now, cost, r, charge)
            }
            Table::Gcra(c) => c.decide::<GcraStep, Q>(limits, key, now, cost, r, charge),
            Table::FixedWindow(c) => {
                c.decide::<FixedWindowStep, Q>(limits, key, now, cost, r, charge)
            }
            Table::LeakyBucket(c) => c.decide::<AnyWordStep, Q>(limits, key, now, cost, r, charge),
            Table::SlidingWindow(c) => {
                c.decide::<SlidingWindowStep, Q>(limits, key, now, cost, r, charge)
            }
            Table::SlidingLog(c) => {
                c.decide::<SlidingLogStep, Q>(limits, key, now, cost, r, charge)
            }
        }
    }

    /// Give back `cost` tokens that a decision at `charged_at` took from `charge`.
    pub fn refund<Q>(&self, key: &Q, charge: Charge, charged_at: Nanos, cost: u64)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let policy = &self.limits.policy;
        match &self.table {
            Table::TokenBucket(words)
            | Table::Gcra(words)
            | Table::FixedWindow(words)
            | Table::LeakyBucket(words) => words.refund(policy, key, charge, charged_at, cost),
            Table::SlidingWindow(cells) => cells.refund(policy, key, charge, charged_at, cost),
            Table::SlidingLog(cells) => cells.refund(policy, key, charge, charged_at, cost),
        }
    }

    /// Forget `key` whatever its state, as if it had never been seen (a reset): its next
    /// request finds the whole limit. Return whether the store kept it.
    pub fn forget<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let limits = &self.limits;
        let removed = match &self.table {
            Table::TokenBucket(words)
            | Table::Gcra(words)
            | Table::FixedWindow(words)
            | Table::LeakyBucket(words) => return words.forget(limits, key),
            Table::SlidingWindow(cells) => cells.map.remove(key).is_some(),
            Table::SlidingLog(cells) => cells.map.remove(key).is_some(),
        };
        if removed {
            limits.keys.fetch_sub(1, Ordering::Relaxed);
        }
        removed
    }

    /// Remove every key that is idle at `now`; return how many were removed.
    ///
    /// Takes each shard's write lock in turn, so call it from a background task, not per
    /// request. The store also sweeps by itself when a new key arrives at the cap.
    pub fn evict_idle(&self, now: Nanos) -> usize {
        let (limits, policy) = (&self.limits, &self.limits.policy);
        match &self.table {
            Table::TokenBucket(words)
            | Table::Gcra(words)
            | Table::FixedWindow(words)
            | Table::LeakyBucket(words) => words.sweep(limits, now),
            Table::SlidingWindow(cells) => cells.sweep(limits, now, |_, c| c.is_idle(policy, now)),
            Table::SlidingLog(cells) => cells.sweep(limits, now, |_, c| c.is_idle(policy, now)),
        }
    }
}

impl<K: Hash + Eq, C: Cell, S: BuildHasher + Clone> Cells<K, C, S> {
    /// [`Cells::decide_inline`], out of line: each algorithm gets its own copy with a frame
    /// sized for it alone, and the dispatch in `Store::decide_charge` stays a jump.
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn decide<'a, D: Step<C>, Q>(
        &self,
        limits: &Bookkeeping,
        key: &'a Q,
        now: Nanos,
        cost: u64,
        reserve: bool,
        charge: &mut Charge,
    ) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToKey<'a, K> + ?Sized,
    {
        self.decide_inline::<D, Q>(limits, key, now, cost, reserve, charge)
    }

    /// Find (or make room for) the key's cell and run algorithm `D` on it.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn decide_inline<'a, D: Step<C>, Q>(
        &self,
        limits: &Bookkeeping,
        key: &'a Q,
        now: Nanos,
        cost: u64,
        reserve: bool,
        charge: &mut Charge,
    ) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToKey<'a, K> + ?Sized,
    {
        let policy = &limits.policy;
        let decide = |cell: &C| D::decide(cell, policy, now, cost, reserve);
        if let Some(cell) = self.map.get(key) {
            *charge = Charge::Key;
            return decide(&cell);
        }
        let evict = |_: &K, cell: &C| cell.is_idle(policy, now);
        let (decision, taken_from) = self.decide_new_key(limits, key, now, cost, decide, evict);
        *charge = taken_from;
        decision
    }

    /// The slow path of a decision: the key is not in the map yet. `evict` tells whether a
    /// sweep (if the store is full) may remove a key.
    #[cold]
    #[inline(never)]
    fn decide_new_key<'a, Q>(
        &self,
        limits: &Bookkeeping,
        key: &'a Q,
        now: Nanos,
        cost: u64,
        decide: impl Fn(&C) -> Decision,
        evict: impl FnMut(&K, &C) -> bool,
    ) -> (Decision, Charge)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToKey<'a, K> + ?Sized,
    {
        if cost == 0 {
            // A peek at an unknown key: report a fresh key's state without storing one.
            return (decide(&C::default()), Charge::Key);
        }
        if !self.reserve_slot(limits, now, evict) {
            limits.overflow_decisions.fetch_add(1, Ordering::Relaxed);
            return (decide(&self.overflow), Charge::Overflow);
        }
        match self.map.entry(key.to_key()) {
            Entry::Occupied(entry) => {
                // Another thread inserted it meanwhile: give the slot back.
                limits.keys.fetch_sub(1, Ordering::Relaxed);
                (decide(entry.get()), Charge::Key)
            }
            Entry::Vacant(entry) => (decide(&entry.insert(C::default())), Charge::Key),
        }
    }

    /// Reserve room for one more key, sweeping idle keys first if the store is full.
    fn reserve_slot(
        &self,
        limits: &Bookkeeping,
        now: Nanos,
        mut evict: impl FnMut(&K, &C) -> bool,
    ) -> bool {
        for attempt in 0..2 {
            if limits.keys.fetch_add(1, Ordering::Relaxed) < limits.max_keys {
                return true;
            }
            limits.keys.fetch_sub(1, Ordering::Relaxed);
            if attempt == 0 && !self.sweep_if_due(limits, now, &mut evict) {
                return false;
            }
        }
        false
    }

    /// Sweep if no sweep ran in the last interval; return whether this call swept.
    fn sweep_if_due(
        &self,
        limits: &Bookkeeping,
        now: Nanos,
        evict: impl FnMut(&K, &C) -> bool,
    ) -> bool {
        let last = limits.last_sweep_ns.load(Ordering::Relaxed);
        let due = last == 0 || now >= (last - 1).saturating_add(limits.sweep_interval_ns);
        if !due
            || limits
                .last_sweep_ns
                .compare_exchange(
                    last,
                    now.saturating_add(1),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            return false;
        }
        self.sweep(limits, now, evict);
        true
    }

    /// Remove the keys that `evict` picks (idle keys); return how many were removed.
    fn sweep(
        &self,
        limits: &Bookkeeping,
        now: Nanos,
        mut evict: impl FnMut(&K, &C) -> bool,
    ) -> usize {
        let mut removed = 0usize;
        self.map.retain(|key, cell| {
            let idle = evict(key, cell);
            removed += usize::from(idle);
            !idle
        });
        if removed > 0 {
            limits.keys.fetch_sub(removed, Ordering::Relaxed);
            limits.evicted.fetch_add(removed as u64, Ordering::Relaxed);
            tracing::debug!(removed, now, "evicted idle keys");
        }
        removed
    }

    fn refund<Q>(&self, policy: &Policy, key: &Q, charge: Charge, charged_at: Nanos, cost: u64)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match charge {
            Charge::Overflow => self.overflow.refund(policy, charged_at, cost),
            Charge::Key => {
                // A key evicted since the charge was idle again: nothing left to give back.
                if let Some(cell) = self.map.get(key) {
                    cell.refund(policy, charged_at, cost);
                }
            }
        }
    }
}
