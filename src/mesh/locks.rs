//! Keys locked out by their policy (`block_for`), as a node knows them: the lockouts it
//! started as a key's authority and those its peers told it of (it backs the key up, or
//! takes its authority over). The one place a node keeps them; the key's authority reads
//! them (`mesh::node::lockouts`).
//!
//! A lockout starts when the key's authority first denies a request of the key, and lasts
//! the policy's `block_for` from then: the authority grants nothing of the key until it
//! ends, recalls every lease of it, and answers every want with a denial whose retry time
//! is the lockout's end. Requests denied during a lockout do not extend it.

use std::collections::HashMap;

use crate::clock::Nanos;
use crate::mesh::NodeId;
use crate::mesh::message::KeyRef;

/// The most keys a node keeps locked out; beyond (after the ended lockouts are swept), a
/// denied key is not locked out (the policy still denies it by its own count).
pub(crate) const MAX_LOCKED_KEYS: usize = 1_000_000;

/// The longest lockout (`block_for`): a week.
pub(crate) const MAX_LOCKOUT_NS: Nanos = 7 * 24 * 3600 * 1_000_000_000;

/// One lockout: when it ends (local), and the member last told of it as the key's
/// successor.
#[derive(Debug, Clone, Copy)]
struct Lock {
    until: Nanos,
    told: Option<NodeId>,
}

/// The keys a node knows locked out.
#[derive(Debug, Default)]
pub(crate) struct Locks {
    locks: HashMap<KeyRef, Lock>,
    /// The membership's version when the successors of the keys were last looked at.
    seen_membership: u64,
}

impl Locks {
    /// How long `key` stays locked out at `now`, if it is.
    pub(crate) fn left(&self, key: &KeyRef, now: Nanos) -> Option<Nanos> {
        let lock = self.locks.get(key)?;
        (lock.until > now).then(|| lock.until - now)
    }

    /// End `key`'s lockout (a reset); tell whether one was kept.
    pub(crate) fn clear(&mut self, key: &KeyRef) -> bool {
        self.locks.remove(key).is_some()
    }

    /// Lock `key` out from `now` for `block` ns, unless a lockout of it runs; return the
    /// time left of the lockout in force (`None`: the table is full of running lockouts).
    pub(crate) fn lock(&mut self, key: KeyRef, now: Nanos, block: Nanos) -> Option<Nanos> {
        if let Some(left) = self.left(&key, now) {
            return Some(left);
        }
        self.heard(key, now, block).then_some(block)
    }

    /// A peer told of a lockout of `key` with `left` ns to run at `now`: keep the later end
    /// of it and of one known here. Tell whether the table has it.
    pub(crate) fn heard(&mut self, key: KeyRef, now: Nanos, left: Nanos) -> bool {
        let until = now.saturating_add(left);
        if let Some(lock) = self.locks.get_mut(&key) {
            if until > lock.until {
                *lock = Lock { until, told: None };
            }
            return true;
        }
        if self.locks.len() >= MAX_LOCKED_KEYS {
            self.sweep(now);
            if self.locks.len() >= MAX_LOCKED_KEYS {
                return false;
            }
        }
        self.locks.insert(key, Lock { until, told: None });
        true
    }

    /// The time left of `key`'s lockout at `now` if `successor` was not told of it yet
    /// (it is counted told from now).
    pub(crate) fn tell(&mut self, key: &KeyRef, successor: NodeId, now: Nanos) -> Option<Nanos> {
        let lock = self.locks.get_mut(key)?;
        if lock.until <= now || lock.told == Some(successor) {
            return None;
        }
        lock.told = Some(successor);
        Some(lock.until - now)
    }

    /// The keys locked out at `now`, if the membership changed since the last call
    /// (`version`): their successors may have changed.
    pub(crate) fn after_membership(&mut self, version: u64, now: Nanos) -> Vec<KeyRef> {
        if version == self.seen_membership {
            return Vec::new();
        }
        self.seen_membership = version;
        self.running(now)
    }

    /// When `key`'s lockout ends, if one is kept (ended or not).
    pub(crate) fn until(&self, key: &KeyRef) -> Option<Nanos> {
        self.locks.get(key).map(|lock| lock.until)
    }

    /// The keys locked out at `now`.
    pub(crate) fn running(&self, now: Nanos) -> Vec<KeyRef> {
        self.locks
            .iter()
            .filter(|(_, lock)| lock.until > now)
            .map(|(key, _)| *key)
            .collect()
    }

    /// Forget the lockouts that ended by `now`.
    pub(crate) fn sweep(&mut self, now: Nanos) {
        self.locks.retain(|_, lock| lock.until > now);
    }

    /// Return how many lockouts the table keeps (some may have ended).
    pub(crate) fn len(&self) -> usize {
        self.locks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: KeyRef = KeyRef { policy: 0, key: 7 };

    #[test]
    fn a_lockout_runs_its_time_and_a_denial_during_it_does_not_extend_it() {
        let mut locks = Locks::default();
        assert_eq!(locks.left(&K, 0), None);
        assert_eq!(locks.lock(K, 1_000, 100), Some(100));
        assert_eq!(locks.lock(K, 1_050, 100), Some(50));
        assert_eq!(locks.left(&K, 1_099), Some(1));
        assert_eq!(locks.left(&K, 1_100), None);
        assert_eq!(locks.lock(K, 1_200, 100), Some(100));
    }

    #[test]
    fn a_peer_lengthens_a_lockout_never_shortens_it_and_each_successor_is_told_once() {
        let mut locks = Locks::default();
        assert!(locks.heard(K, 0, 100));
        assert_eq!(locks.tell(&K, 2, 10), Some(90));
        assert_eq!(locks.tell(&K, 2, 20), None);
        assert!(locks.heard(K, 50, 10));
        assert_eq!(locks.left(&K, 50), Some(50));
        assert_eq!(locks.tell(&K, 3, 20), Some(80));
        // A later end is news for the successor already told.
        assert!(locks.heard(K, 50, 100));
        assert_eq!(locks.tell(&K, 3, 60), Some(90));
        assert_eq!(locks.after_membership(1, 60), vec![K]);
        assert_eq!(locks.after_membership(1, 60), vec![]);
        locks.sweep(150);
        assert_eq!(locks.len(), 0);
    }
}
