//! Hot keys: each thread's shortcuts to the cells of the keys it checks again and again.
//!
//! A map lookup takes a shard's read lock and releases it: two atomic read-modify-writes
//! around the one that decides (the cell's compare-and-swap), and on a hot key all three
//! contend for cache lines that every core writes. A shortcut skips the map: the thread
//! hashes the key, finds it among its own shortcuts, compares the key, and runs the
//! compare-and-swap on a cell that it holds through an `Arc`.
//!
//! The shared cells themselves, and how a key's cell moves into one and out of the store,
//! are in [`words`](super::words).

use std::borrow::Borrow;
use std::cell::RefCell;
use std::sync::Arc;

use thread_local::ThreadLocal;

use super::cell::WordCell;
use crate::decision::Decision;

/// Shortcut sets per thread and store (a power of two).
const SETS: usize = 16;
/// Shortcuts per set.
const WAYS: usize = 2;

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

/// One thread's shortcuts into one store.
struct Shortcuts<K> {
    /// `WAYS` shortcuts per set.
    ways: [[Option<Shortcut<K>>; WAYS]; SETS],
    /// Per set, the way to replace next (the one not used last).
    victim: [u8; SETS],
    /// Per set, the hash of the last key looked up through the map: a key seen twice in a
    /// row turns hot.
    last_miss: [u64; SETS],
}

impl<K> Shortcuts<K> {
    fn new() -> Self {
        Shortcuts {
            ways: std::array::from_fn(|_| std::array::from_fn(|_| None)),
            victim: [0; SETS],
            last_miss: [0; SETS],
        }
    }
}

/// What a thread's shortcuts said about a key.
pub(crate) enum Lookup {
    /// Decided through a live shortcut.
    Decided(Decision),
    /// No live shortcut; `repeat` when the previous miss of its set was the same key (a key
    /// decided twice in a row through the map turns hot).
    Missed {
        /// The key missed twice in a row.
        repeat: bool,
    },
}

#[inline(always)]
fn set_of(hash: u64) -> usize {
    // The map picks shards with the high bits and buckets with the low ones; any bits do.
    (hash >> 32) as usize & (SETS - 1)
}

/// Every thread's shortcuts into one store.
pub(crate) struct HotKeys<K: Send + Sync> {
    threads: ThreadLocal<RefCell<Shortcuts<K>>>,
}

impl<K: Send + Sync> HotKeys<K> {
    pub(crate) fn new() -> Self {
        HotKeys {
            threads: ThreadLocal::new(),
        }
    }

    /// Decide through this thread's shortcut to `key`, if it has a live one; otherwise note
    /// the miss and send the request to the map.
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
        // A key's `Eq` that re-entered the store would find the table borrowed: map path.
        let Ok(mut shortcuts) = self.shortcuts().try_borrow_mut() else {
            return Lookup::Missed { repeat: false };
        };
        let set = set_of(hash);
        let found = shortcuts.ways[set].iter().position(
            |way| matches!(way, Some(s) if s.hash == hash && s.shared.key.borrow() == key),
        );
        if let Some(way) = found
            && let Some(shortcut) = &shortcuts.ways[set][way]
        {
            match decide(shortcut.shared.cell()) {
                Some(decision) => {
                    shortcuts.victim[set] = (way ^ 1) as u8;
                    return Lookup::Decided(decision);
                }
                // Evicted by a sweep: forget it; the map holds the key afresh.
                None => shortcuts.ways[set][way] = None,
            }
        }
        let repeat = std::mem::replace(&mut shortcuts.last_miss[set], hash) == hash;
        Lookup::Missed { repeat }
    }

    /// Keep a shortcut to `shared` (its key's hash is `hash`), in place of the way of its
    /// set used least recently. Call without holding a map lock: it may drop an older
    /// shortcut, and with it a key.
    pub(crate) fn keep(&self, hash: u64, shared: Arc<SharedCell<K>>) {
        let Ok(mut shortcuts) = self.shortcuts().try_borrow_mut() else {
            return;
        };
        let set = set_of(hash);
        let victim = usize::from(shortcuts.victim[set]);
        shortcuts.ways[set][victim] = Some(Shortcut { hash, shared });
        shortcuts.victim[set] = (victim ^ 1) as u8;
        shortcuts.last_miss[set] = 0;
    }

    #[inline(always)]
    fn shortcuts(&self) -> &RefCell<Shortcuts<K>> {
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
        assert!(matches!(
            decide(&hot, 7, "a"),
            Lookup::Missed { repeat: false }
        ));
        assert!(matches!(
            decide(&hot, 7, "a"),
            Lookup::Missed { repeat: true }
        ));
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
