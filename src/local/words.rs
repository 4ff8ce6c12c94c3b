//! A word algorithm's table (token bucket, GCRA, leaky buckets, fixed window): the map of
//! inline cells, the shared cells of hot keys, and each thread's shortcuts to those.
//!
//! # A key's cell, inline or shared
//! A key's cell lives inline in the map (one `AtomicU64` next to the key) until a thread
//! notes it twice in a row among its sampled lookups of that shortcut set
//! (`Lookup::Missed { repeat }`, about 32 checks in a row; see [`hot`](super::hot)). Then,
//! under the shard's write lock (no decision is running on the inline cell), its state moves into a
//! [`SharedCell`] kept in a second map, `shared`, and the inline cell is set to
//! [`RETIRED`], which here means *moved*. That move is the only allocation, once per key's
//! life; the thread keeps a shortcut to the shared cell, and so does every other thread that
//! later finds the key moved. Cold keys keep one word per key; only hot keys pay for the
//! second entry, and at most [`max_hot_keys`] keys are hot at once.
//!
//! Under a shard's read lock an inline cell can neither move nor be evicted (both take the
//! write lock), so a decision through the map that finds its cell moved decides on the
//! shared cell while still holding that lock.
//!
//! # Eviction
//! The sweep removes an idle inline cell as before. A moved key is removed only if its shared
//! cell retires (a compare-and-swap from its idle state to [`RETIRED`], which on a shared
//! cell means *evicted*), and then leaves both maps in the same step, under the shard's write
//! lock. A thread whose shortcut finds the cell evicted drops the shortcut and decides
//! through the map, where the key is fresh. The retiring swap fails if a decision changed the
//! state after the sweep found it idle, so an evicted cell never admitted anything that the
//! fresh key does not know about.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use dashmap::DashMap;

use super::cell::{RETIRED, WordCell};
use super::hot::{HotKeys, Lookup, SharedCell};
use super::{Bookkeeping, Cells, Charge, ToKey, WordStep};
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::policy::Policy;

/// A request on its way through the map (after its shortcut missed).
#[derive(Clone, Copy)]
struct MapCall {
    hash: u64,
    /// The thread noted this key twice in a row: move its cell.
    repeat: bool,
    now: Nanos,
    cost: u64,
    reserve: bool,
}

/// A word algorithm's cells, the hot keys' shared cells, and threads' shortcuts to them.
pub(super) struct WordCells<K: Send + Sync, S> {
    /// Every key, with its cell inline (or [`RETIRED`]: moved to `shared`).
    pub(super) cells: Cells<K, WordCell, S>,
    /// The cells of hot keys (the keys whose inline cell is [`RETIRED`]).
    shared: DashMap<K, Arc<SharedCell<K>>, S>,
    /// Entries in `shared` (kept by the code that inserts and removes them).
    hot_keys: AtomicUsize,
    /// The cap on `hot_keys` (see [`max_hot_keys`]).
    max_hot_keys: usize,
    /// A sweep removed hot keys: the hot-key filter has bits to clear.
    filter_stale: AtomicBool,
    hot: HotKeys<K>,
}

/// Return the cap on hot keys for a store of `max_keys`: one key in 16 (at least 64, or
/// every key of a smaller store). Keys that send requests in runs could otherwise all turn
/// hot; with the cap, memory stays within `max_keys` inline cells plus this many shared ones,
/// and a key that finds the cap reached keeps deciding through the map.
pub(super) fn max_hot_keys(max_keys: usize) -> usize {
    (max_keys / 16).max(max_keys.min(64))
}

impl<K: Hash + Eq + Send + Sync, S: BuildHasher + Clone> WordCells<K, S> {
    /// Create an empty table around `cells`, with `hasher` for the shared cells and room
    /// for `max_hot_keys` of them.
    pub(super) fn new(cells: Cells<K, WordCell, S>, hasher: S, max_hot_keys: usize) -> Self {
        WordCells {
            cells,
            shared: DashMap::with_hasher(hasher),
            hot_keys: AtomicUsize::new(0),
            max_hot_keys,
            filter_stale: AtomicBool::new(false),
            hot: HotKeys::new(),
        }
    }

    /// Return the number of keys with a shared cell (counts every shard: not for the
    /// request path).
    pub(super) fn hot_keys(&self) -> usize {
        self.shared.len()
    }

    /// [`WordCells::decide_inline`], out of line (see `Cells::decide`).
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn decide<'a, D: WordStep, Q>(
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

    /// Decide through this thread's shortcut to the key's cell if it has a live one, else
    /// through the map.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn decide_inline<'a, D: WordStep, Q>(
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
        let hash = self.cells.map.hasher().hash_one(key);
        let lookup = self.hot.decide(hash, key, |cell| {
            D::decide_live(cell, policy, now, cost, reserve)
        });
        let repeat = match lookup {
            Lookup::Decided(decision) => {
                *charge = Charge::Key;
                return decision;
            }
            Lookup::Missed { repeat } => repeat,
        };
        let map = MapCall {
            hash,
            repeat,
            now,
            cost,
            reserve,
        };
        self.decide_through_map::<D, Q>(limits, key, map, charge)
    }

    /// The path of a key without a live shortcut on this thread: decide on its map cell (or
    /// the shared cell it moved to); then keep a shortcut to a shared cell, or move the cell
    /// of a key that the thread noted twice in a row.
    #[inline(always)]
    fn decide_through_map<'a, D: WordStep, Q>(
        &self,
        limits: &Bookkeeping,
        key: &'a Q,
        call: MapCall,
        charge: &mut Charge,
    ) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToKey<'a, K> + ?Sized,
    {
        let MapCall {
            hash,
            repeat,
            now,
            cost,
            reserve,
        } = call;
        let policy = &limits.policy;
        if let Some(cell) = self.cells.map.get(key) {
            *charge = Charge::Key;
            if let Some(decision) = D::decide_live(&cell, policy, now, cost, reserve) {
                drop(cell);
                if repeat && self.hot_keys.load(Ordering::Relaxed) < self.max_hot_keys {
                    self.share(limits, hash, key);
                }
                return decision;
            }
            // Moved: the read lock on `cell` keeps sweeps out while we decide.
            let shared = self.shared.get(key).map(|shared| Arc::clone(&shared));
            let decision = self.decide_moved::<D>(shared.as_deref(), policy, now, cost, reserve);
            drop(cell);
            if let Some(shared) = shared {
                self.hot.keep(hash, shared);
            }
            return decision;
        }
        let decide = |cell: &WordCell| match D::decide_live(cell, policy, now, cost, reserve) {
            Some(decision) => decision,
            // Inserted and moved by other threads meanwhile (the entry's lock is held).
            None => {
                let shared = self.shared.get(key);
                self.decide_moved::<D>(shared.as_deref().map(|s| &**s), policy, now, cost, reserve)
            }
        };
        let evict = |key: &K, cell: &WordCell| self.evict_if_idle(key, cell, policy, now);
        let (decision, taken_from) = self
            .cells
            .decide_new_key(limits, key, now, cost, decide, evict);
        *charge = taken_from;
        self.rebuild_filter_if_stale();
        decision
    }

    /// Decide on the shared cell of a moved key; the caller holds the map shard's lock, so
    /// the cell cannot be evicted meanwhile.
    fn decide_moved<D: WordStep>(
        &self,
        shared: Option<&SharedCell<K>>,
        policy: &Policy,
        now: Nanos,
        cost: u64,
        reserve: bool,
    ) -> Decision {
        match shared {
            Some(shared) => D::decide(shared.cell(), policy, now, cost, reserve),
            // A moved key always has a shared cell (both change under the same lock); were
            // it missing, the overflow cell would still limit the request.
            None => D::decide(&self.cells.overflow, policy, now, cost, reserve),
        }
    }

    /// Move a hot key's cell into a shared one (once per key's life) and keep a shortcut.
    #[cold]
    #[inline(never)]
    fn share<'a, Q>(&self, limits: &Bookkeeping, hash: u64, key: &'a Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToKey<'a, K> + ?Sized,
    {
        let Some(cell) = self.cells.map.get_mut(key) else {
            return;
        };
        let shared = if cell.load() == RETIRED {
            // Another thread moved it first.
            self.shared.get(key).map(|shared| Arc::clone(&shared))
        } else if self.hot_keys.fetch_add(1, Ordering::Relaxed) >= self.max_hot_keys {
            self.hot_keys.fetch_sub(1, Ordering::Relaxed);
            None
        } else {
            // Build and insert first, retire last: were `to_key` or `hash` to panic, the
            // inline cell would still hold the state.
            let shared = Arc::new(SharedCell::new(cell.load(), key.to_key()));
            let before = self.shared.insert(key.to_key(), Arc::clone(&shared));
            debug_assert!(before.is_none(), "a key moved twice");
            cell.retire();
            limits.hot_keys_moved.fetch_add(1, Ordering::Relaxed);
            Some(shared)
        };
        drop(cell);
        if let Some(shared) = shared {
            self.hot.keep(hash, shared);
        }
    }

    /// Tell whether the sweep may remove `key` now: its inline cell is idle, or its shared
    /// cell is idle and now retired (then it also leaves `shared`). Called under the map
    /// shard's write lock.
    fn evict_if_idle(&self, key: &K, cell: &WordCell, policy: &Policy, now: Nanos) -> bool {
        if cell.load() != RETIRED {
            return cell.is_idle(policy, now);
        }
        let retired = match self.shared.get(key) {
            Some(shared) => shared.cell().retire_if_idle(policy, now),
            None => true,
        };
        if retired && self.shared.remove(key).is_some() {
            self.hot_keys.fetch_sub(1, Ordering::Relaxed);
            self.filter_stale.store(true, Ordering::Relaxed);
        }
        retired
    }

    /// Forget `key` whatever its state (a reset): its cell, and its shared cell if it moved
    /// (retired first, so a thread's shortcut to it finds the key afresh). Return whether
    /// the store kept it.
    pub(super) fn forget<Q>(&self, limits: &Bookkeeping, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let Some((_, cell)) = self.cells.map.remove(key) else {
            return false;
        };
        limits.keys.fetch_sub(1, Ordering::Relaxed);
        if cell.load() == RETIRED
            && let Some((_, shared)) = self.shared.remove(key)
        {
            shared.cell().retire();
            self.hot_keys.fetch_sub(1, Ordering::Relaxed);
            self.filter_stale.store(true, Ordering::Relaxed);
            self.rebuild_filter_if_stale();
        }
        true
    }

    /// Remove every idle key; return how many were removed.
    pub(super) fn sweep(&self, limits: &Bookkeeping, now: Nanos) -> usize {
        let policy = &limits.policy;
        let removed = self.cells.sweep(limits, now, |key, cell| {
            self.evict_if_idle(key, cell, policy, now)
        });
        self.rebuild_filter_if_stale();
        removed
    }

    /// Rebuild the hot-key filter if a sweep removed hot keys since the last rebuild.
    fn rebuild_filter_if_stale(&self) {
        if self.filter_stale.load(Ordering::Relaxed)
            && self.filter_stale.swap(false, Ordering::Relaxed)
        {
            let hasher = self.cells.map.hasher();
            self.hot
                .rebuild_filter(self.shared.iter().map(|entry| hasher.hash_one(entry.key())));
        }
    }

    /// Give back `cost` tokens that a decision at `charged_at` took from `charge`.
    pub(super) fn refund<Q>(
        &self,
        policy: &Policy,
        key: &Q,
        charge: Charge,
        charged_at: Nanos,
        cost: u64,
    ) where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let cell = match charge {
            Charge::Overflow => return self.cells.overflow.refund(policy, charged_at, cost),
            // A key evicted since the charge was idle again: nothing left to give back.
            Charge::Key => match self.cells.map.get(key) {
                Some(cell) => cell,
                None => return,
            },
        };
        // Under the read lock the cell can neither move nor be evicted.
        if cell.load() != RETIRED {
            cell.refund(policy, charged_at, cost);
        } else if let Some(shared) = self.shared.get(key) {
            shared.cell().refund(policy, charged_at, cost);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::local::{Store, Table};

    const SECOND: Nanos = 1_000_000_000;

    /// Decide for `key` through this thread's shortcut only.
    fn through_shortcut(store: &Store<u64>, key: u64) -> Option<Decision> {
        let Table::TokenBucket(words) = &store.table else {
            panic!("not a token bucket");
        };
        let hash = words.cells.map.hasher().hash_one(key);
        let policy = store.policy();
        match words
            .hot
            .decide(hash, &key, |cell| cell.decide_live(policy, SECOND, 1, true))
        {
            Lookup::Decided(decision) => Some(decision),
            Lookup::Missed { .. } => None,
        }
    }

    #[test]
    fn a_key_checked_again_and_again_is_decided_through_a_shortcut() {
        let policy = Policy::token_bucket(1, Duration::from_secs(3600), 1000).unwrap();
        let store: Store<u64> = Store::new(policy, 100);
        let mut checks = 0;
        while through_shortcut(&store, 5).is_none() {
            assert!(store.decide(&5, SECOND, 1).is_allowed());
            checks += 1;
            assert!(checks < 500, "not hot after {checks} checks");
        }
        // The shortcut decided on the same state as the map (one more token taken).
        assert_eq!(store.decide(&5, SECOND, 0).remaining, 1000 - checks - 1);
        assert_eq!(store.stats().hot_keys, 1);
        // Another thread finds the key moved in the map, and keeps a shortcut of its own.
        std::thread::scope(|scope| {
            scope.spawn(|| {
                assert!(through_shortcut(&store, 5).is_none());
                assert!(store.decide(&5, SECOND, 1).is_allowed());
                assert!(through_shortcut(&store, 5).is_some());
            });
        });
        assert_eq!(store.decide(&5, SECOND, 0).remaining, 1000 - checks - 3);
        // A refund through the map reaches the shared cell.
        store.refund(&5, Charge::Key, SECOND, 2);
        assert_eq!(store.decide(&5, SECOND, 0).remaining, 1000 - checks - 1);
        // Forgotten (a reset): the shortcut finds the shared cell retired, and the key is
        // fresh, through the shortcut and the map.
        assert!(store.forget(&5));
        assert_eq!((store.len(), store.stats().hot_keys), (0, 0));
        assert!(through_shortcut(&store, 5).is_none());
        assert_eq!(store.decide(&5, SECOND, 1).remaining, 999);
        assert!(!store.forget(&6));
    }
}
