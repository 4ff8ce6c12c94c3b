//! `block_for`: keys a policy denied, kept denied until their lockout ends (on this node).

use dashmap::DashMap;

use crate::clock::Nanos;

/// The most keys one policy keeps locked out; beyond (after the ended lockouts are swept),
/// a denied key is not locked out (the policy still denies it by its own count).
pub(super) const MAX_LOCKED_KEYS: usize = 1_000_000;

/// A policy's locked-out keys: the instant each lockout ends.
pub(super) struct Lockouts {
    until: DashMap<u64, Nanos>,
    block_ns: Nanos,
}

impl Lockouts {
    pub(super) fn new(block_ns: Nanos) -> Self {
        Lockouts {
            until: DashMap::new(),
            block_ns,
        }
    }

    /// How long `key` stays locked out at `now`, if it is.
    pub(super) fn left(&self, key: u64, now: Nanos) -> Option<Nanos> {
        let until = *self.until.get(&key)?;
        (until > now).then(|| until - now)
    }

    /// End `key`'s lockout (a reset); tell whether it had one.
    #[cfg(feature = "node")]
    pub(super) fn clear(&self, key: u64) -> bool {
        self.until.remove(&key).is_some()
    }

    /// Lock `key` out from `now` for the policy's `block_for`; return the time it lasts
    /// (`None`: the table is full of lockouts still running).
    pub(super) fn lock(&self, key: u64, now: Nanos) -> Option<Nanos> {
        if self.until.len() >= MAX_LOCKED_KEYS {
            self.until.retain(|_, until| *until > now);
            if self.until.len() >= MAX_LOCKED_KEYS {
                return None;
            }
        }
        let until = now.saturating_add(self.block_ns);
        self.until.insert(key, until);
        Some(self.block_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lockout_lasts_its_time_then_ends() {
        let lockouts = Lockouts::new(100);
        assert_eq!(lockouts.left(7, 0), None);
        assert_eq!(lockouts.lock(7, 1_000), Some(100));
        assert_eq!(lockouts.left(7, 1_050), Some(50));
        assert_eq!(lockouts.left(7, 1_100), None);
        assert_eq!(lockouts.left(8, 1_050), None);
    }
}
