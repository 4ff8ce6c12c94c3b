//! Hot keys: each thread's shortcuts to the cells of the keys it checks again and again.
//!
//! A map lookup takes a shard's read lock and releases it: two atomic read-modify-writes
//! around the one that decides (the cell's compare-and-swap), and on a hot key all three
//! contend for cache lines that every core writes. A shortcut skips the map: the thread
//! hashes the key, finds it among its own shortcuts, compares the key, and runs the
//! compare-and-swap on a cell that it holds through an `Arc`.
//!
//! Cold keys must not pay for this. A store keeps a 256-bit filter of its hot keys' hashes:
//! a key whose bit is clear has no shortcut anywhere and skips the lookup, and a thread
//! notes only one in [`SAMPLE_MISSES`] of those lookups to spot a key coming again. The
//! filter and the sampling only steer speed; a decision is exact whichever path it takes.
//!
//! The shared cells themselves, and how a key's cell moves into one and out of the store,
//! are in [`words`](super::words).

use std::borrow::Borrow;
use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use thread_local::ThreadLocal;

use super::cell::WordCell;
use crate::decision::Decision;

/// Shortcut sets per thread and store (a power of two).
const SETS: usize = 16;
/// Shortcuts per set.
const WAYS: usize = 2;
/// A thread notes one in this many lookups (at random) of keys that cannot be hot (their
/// filter bit is clear): a key turns hot when two noted lookups in a row of its set are its
/// own, so a key that a thread checks again and again turns hot after about 32 checks.
pub(crate) const SAMPLE_MISSES: u32 = 16;
/// Words of the hot-key filter (64 bits each).
const FILTER_WORDS: usize = 4;

thread_local! {
    /// This thread's sampler (xorshift): random, so that every store of a layered limiter is
    /// sampled alike whatever the number of layers.
    static SAMPLER: Cell<u64> = const { Cell::new(0x9e37_79b9_7f4a_7c15) };
}

/// Tell whether this thread notes this lookup (one in [`SAMPLE_MISSES`], at random).
#[inline(always)]
fn sampled() -> bool {
    SAMPLER.with(|sampler| {
        let mut x = sampler.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        sampler.set(x);
        x % u64::from(SAMPLE_MISSES) == 0
    })
}

/// The filter word and bit of a hash.
#[inline(always)]
fn filter_bit(hash: u64) -> (usize, u64) {
    let index = (hash >> 56) as usize % (64 * FILTER_WORDS);
    (index / 64, 1 << (index % 64))
}

/// A hot key's cell, shared by the store and threads' shortcuts, with its key (to check a
/// shortcut against the key asked for without going through the map).
pub(crate) struct SharedCell<K> {
    cell: WordCell,
    key: K,
}

impl<K> SharedCell<K> {
    /// Create the shared cell of `key`, holding `state`.
    pub(crate) fn new(state: u64, key: K) -> Self {
        SharedCell {
            cell: WordCell::with_state(state),
            key,
        }
    }

    /// Return the cell.
    #[inline(always)]
    pub(crate) fn cell(&self) -> &WordCell {
        &self.cell
    }
}

/// A thread's way to one hot key's cell.
struct Shortcut<K> {
    /// The key's hash (compared before the key).
    hash: u64,
    shared: Arc<SharedCell<K>>,
}

/// One set of a thread's shortcuts, on one cache line: a check that misses its shortcut
/// reads and writes this line only (cold keys' map lookups keep evicting the rest).
#[repr(align(64))]
struct ShortcutSet<K> {
    ways: [Option<Shortcut<K>>; WAYS],
    /// The hash of the last key of this set noted on its way to the map: a key noted twice
    /// in a row turns hot.
    last_miss: u64,
    /// The way to replace next (the one not used last).
    victim: u8,
}

/// One thread's shortcuts into one store.
struct Shortcuts<K> {
    sets: [ShortcutSet<K>; SETS],
}

impl<K> Shortcuts<K> {
    fn new() -> Self {
        Shortcuts {
            sets: std::array::from_fn(|_| ShortcutSet {
                ways: std::array::from_fn(|_| None),
                last_miss: 0,
                victim: 0,
            }),
        }
    }
}

/// What a thread's shortcuts said about a key.
pub(crate) enum Lookup {
    /// Decided through a live shortcut.
    Decided(Decision),
    /// No live shortcut; `repeat` when this lookup was noted and the previous noted one of
    /// its set was the same key (the key turns hot).
    Missed {
        /// The key was noted twice in a row.
        repeat: bool,
    },
}

#[inline(always)]
fn set_of(hash: u64) -> usize {
    // The map picks shards with the high bits and buckets with the low ones; any bits do.
    (hash >> 32) as usize & (SETS - 1)
}

/// Every thread's shortcuts into one store, and the filter of its hot keys.
pub(crate) struct HotKeys<K: Send + Sync> {
    /// A bit per hash prefix, set for every hot key (a hint: it may also be set for keys
    /// that are no longer hot, until [`HotKeys::rebuild_filter`]).
    filter: [AtomicU64; FILTER_WORDS],
    threads: ThreadLocal<RefCell<Shortcuts<K>>>,
}

impl<K: Send + Sync> HotKeys<K> {
    pub(crate) fn new() -> Self {
        HotKeys {
            filter: Default::default(),
            threads: ThreadLocal::new(),
        }
    }

    /// Mark the key with hash `hash` hot in the filter.
    pub(crate) fn mark_hot(&self, hash: u64) {
        let (word, bit) = filter_bit(hash);
        if self.filter[word].load(Ordering::Relaxed) & bit == 0 {
            self.filter[word].fetch_or(bit, Ordering::Relaxed);
        }
    }

    /// Set the filter to the hashes of the keys hot now (after a sweep removed some). A key
    /// that turns hot meanwhile may lose its bit: its requests then find it moved in the map,
    /// which marks it again.
    pub(crate) fn rebuild_filter(&self, hot: impl Iterator<Item = u64>) {
        let mut words = [0u64; FILTER_WORDS];
        for hash in hot {
            let (word, bit) = filter_bit(hash);
            words[word] |= bit;
        }
        for (slot, word) in self.filter.iter().zip(words) {
            slot.store(word, Ordering::Relaxed);
        }
    }

    /// Decide through this thread's shortcut to `key`, if it may have one and it is live;
    /// otherwise note the miss (one in [`SAMPLE_MISSES`] for a key that cannot be hot) and
    /// send the request to the map.
    #[inline(always)]
    pub(crate) fn decide<Q>(
        &self,
        hash: u64,
        key: &Q,
        decide: impl FnOnce(&WordCell) -> Option<Decision>,
    ) -> Lookup
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let (word, bit) = filter_bit(hash);
        if self.filter[word].load(Ordering::Relaxed) & bit == 0 {
            let repeat = sampled() && self.note_miss(hash);
            return Lookup::Missed { repeat };
        }
        // A key's `Eq` that re-entered the store would find the table borrowed: map path.
        let Ok(mut shortcuts) = self.shortcuts().try_borrow_mut() else {
            return Lookup::Missed { repeat: false };
        };
        let set = &mut shortcuts.sets[set_of(hash)];
        let found = set.ways.iter().position(
            |way| matches!(way, Some(s) if s.hash == hash && s.shared.key.borrow() == key),
        );
        if let Some(way) = found
            && let Some(shortcut) = &set.ways[way]
        {
            match decide(shortcut.shared.cell()) {
                Some(decision) => {
                    set.victim = (way ^ 1) as u8;
                    return Lookup::Decided(decision);
                }
                // Evicted by a sweep: forget it; the map holds the key afresh.
                None => set.ways[way] = None,
            }
        }
        let repeat = std::mem::replace(&mut set.last_miss, hash) == hash;
        Lookup::Missed { repeat }
    }

    /// Keep a shortcut to `shared` (its key's hash is `hash`), in place of the way of its
    /// set used least recently. Call without holding a map lock: it may drop an older
    /// shortcut, and with it a key.
    pub(crate) fn keep(&self, hash: u64, shared: Arc<SharedCell<K>>) {
        self.mark_hot(hash);
        let Ok(mut shortcuts) = self.shortcuts().try_borrow_mut() else {
            return;
        };
        let set = &mut shortcuts.sets[set_of(hash)];
        let victim = usize::from(set.victim);
        set.ways[victim] = Some(Shortcut { hash, shared });
        set.victim = (victim ^ 1) as u8;
        set.last_miss = 0;
    }

    /// Note a lookup through the map of the key with hash `hash`; tell whether the previous
    /// noted one of its set was the same key.
    #[cold]
    #[inline(never)]
    fn note_miss(&self, hash: u64) -> bool {
        let Ok(mut shortcuts) = self.shortcuts().try_borrow_mut() else {
            return false;
        };
        let set = &mut shortcuts.sets[set_of(hash)];
        std::mem::replace(&mut set.last_miss, hash) == hash
    }

    /// Return this thread's shortcuts (made on the thread's first use of the store).
    #[inline(always)]
    fn shortcuts(&self) -> &RefCell<Shortcuts<K>> {
        match self.threads.get() {
            Some(shortcuts) => shortcuts,
            None => self.new_shortcuts(),
        }
    }

    #[cold]
    #[inline(never)]
    fn new_shortcuts(&self) -> &RefCell<Shortcuts<K>> {
        self.threads.get_or(|| RefCell::new(Shortcuts::new()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;
    use std::time::Duration;

    fn policy() -> Policy {
        Policy::token_bucket(1, Duration::from_secs(3600), 10).unwrap()
    }

    fn decide(hot: &HotKeys<String>, hash: u64, key: &str) -> Lookup {
        hot.decide(hash, key, |cell| cell.decide_live(&policy(), 1, 1, true))
    }

    #[test]
    fn a_kept_shortcut_decides_for_its_key_only() {
        let hot = HotKeys::<String>::new();
        assert!(matches!(decide(&hot, 7, "a"), Lookup::Missed { .. }));
        let shared = Arc::new(SharedCell::new(0, "a".to_string()));
        hot.keep(7, Arc::clone(&shared));
        let Lookup::Decided(decision) = decide(&hot, 7, "a") else {
            panic!("the shortcut was not used");
        };
        assert!(decision.is_allowed());
        assert_eq!(shared.cell().decide(&policy(), 1, 0, true).remaining, 9);
        // Same hash, another key: the key comparison sends it to the map.
        assert!(matches!(decide(&hot, 7, "b"), Lookup::Missed { .. }));
        // Another thread has no shortcut.
        std::thread::scope(|scope| {
            scope.spawn(|| assert!(matches!(decide(&hot, 7, "a"), Lookup::Missed { .. })));
        });
    }

    #[test]
    fn a_key_looked_up_again_and_again_is_seen_twice_and_one_of_many_is_not() {
        let hot = HotKeys::<String>::new();
        let repeats = |hashes: &mut dyn Iterator<Item = u64>| {
            hashes
                .filter(|&hash| matches!(decide(&hot, hash, "k"), Lookup::Missed { repeat: true }))
                .count()
        };
        // One key, 1000 lookups: about 1000/16 noted, nearly all of them repeats.
        assert!(repeats(&mut std::iter::repeat_n(5 << 32, 1000)) > 20);
        // 1000 different keys of one set: never twice in a row.
        assert_eq!(repeats(&mut (1..=1000u64).map(|k| (5 << 32) | k)), 0);
    }

    #[test]
    fn a_shortcut_to_an_evicted_cell_is_dropped() {
        let hot = HotKeys::<String>::new();
        let shared = Arc::new(SharedCell::new(0, "a".to_string()));
        hot.keep(7, Arc::clone(&shared));
        assert!(shared.cell().retire_if_idle(&policy(), 1));
        assert!(matches!(decide(&hot, 7, "a"), Lookup::Missed { .. }));
        // Dropped: this thread no longer holds the cell.
        assert_eq!(Arc::strong_count(&shared), 1);
    }

    #[test]
    fn two_hot_keys_of_one_set_both_keep_their_shortcut() {
        let hot = HotKeys::<String>::new();
        let (a, b) = (
            Arc::new(SharedCell::new(0, "a".to_string())),
            Arc::new(SharedCell::new(0, "b".to_string())),
        );
        // Same set (bits 32.. of the hash), different hashes.
        let (hash_a, hash_b) = (1 << 32, (1 << 32) | 1);
        hot.keep(hash_a, a);
        hot.keep(hash_b, b);
        for _ in 0..3 {
            assert!(matches!(decide(&hot, hash_a, "a"), Lookup::Decided(_)));
            assert!(matches!(decide(&hot, hash_b, "b"), Lookup::Decided(_)));
        }
    }
}
