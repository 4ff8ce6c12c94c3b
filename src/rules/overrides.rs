//! Overrides of a policy's limit for one key (the admin API), as this node's rules apply
//! them: a local policy's key is decided on a store of its own with the override's limit
//! (seeded with what the key had used, so raising a limit adds the difference), until the
//! override ends; a `mesh` policy's key is enforced with it by the mesh node
//! ([`crate::backend::mesh::GlobalLimits::set_override`]: the key's owner grants by it), a
//! `redis` one by the Redis backend ([`crate::backend::exact::ExactLimits::set_override`]).
//! A lockout still applies under an override. The request path pays one atomic load for a
//! policy without overrides, and one map lookup for a policy with some.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use dashmap::DashMap;

#[cfg(feature = "node")]
use super::Rules;
use crate::clock::Nanos;
use crate::local::Store;
#[cfg(feature = "node")]
use crate::policy::{Policy, PolicyError};

/// One key's override on this node.
pub(super) struct Overridden {
    /// The key's counters under the override's limit.
    pub(super) store: Store<u64>,
    /// When the override ends (UNIX ns).
    until: Nanos,
}

/// A local policy's overridden keys.
#[derive(Default)]
pub(super) struct PolicyOverrides {
    count: AtomicUsize,
    map: DashMap<u64, Arc<Overridden>>,
}

/// Why an override could not be applied.
#[cfg(feature = "node")]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum OverrideError {
    /// No policy of that name.
    #[error("no policy named `{0}`")]
    UnknownPolicy(String),
    /// The limit does not suit the policy's algorithm.
    #[error("{0}")]
    Limit(PolicyError),
}

impl PolicyOverrides {
    /// Run `f` on the store that decides `key` at `now`: its override's while one runs,
    /// else `base` (the policy's own).
    #[inline]
    pub(super) fn with_store<R>(
        &self,
        base: &Store<u64>,
        key: u64,
        now: Nanos,
        f: impl FnOnce(&Store<u64>) -> R,
    ) -> R {
        if self.count.load(Ordering::Relaxed) != 0
            && let Some(o) = self.map.get(&key)
            && o.until > now
        {
            return f(&o.store);
        }
        f(base)
    }

    /// Forget `key`'s counts under its override (a reset); tell whether it had one.
    #[cfg(feature = "node")]
    pub(super) fn forget(&self, key: u64) -> bool {
        self.map.get(&key).is_some_and(|o| o.store.forget(&key))
    }

    /// Drop the overrides that ended by `now`.
    #[cfg(feature = "node")]
    fn sweep(&self, now: Nanos) {
        if self.count.load(Ordering::Relaxed) != 0 {
            self.map.retain(|_, o| o.until > now);
            self.count.store(self.map.len(), Ordering::Relaxed);
        }
    }

    /// Decide `key` with `policy` until `until` from `at` (the policy's time at `now`),
    /// beginning from what it used so far (`seen`: a look at it); or (`None`) by `base`.
    #[cfg(feature = "node")]
    fn set(&self, key: u64, overridden: Option<(Policy, Nanos)>, seen: crate::Decision, at: Nanos) {
        match overridden {
            None => {
                self.map.remove(&key);
            }
            Some((policy, until)) => {
                let used = seen.limit.saturating_sub(seen.remaining);
                let store = Store::new(policy, 1);
                if used > 0 {
                    store.decide(&key, at, used.min(policy.capacity()));
                }
                self.map.insert(key, Arc::new(Overridden { store, until }));
            }
        }
        self.count.store(self.map.len(), Ordering::Relaxed);
    }
}

#[cfg(feature = "node")]
impl Rules {
    /// Enforce `limit` on `key` of policy `policy` until `until` (UNIX ns), or (`None`) the
    /// policy's own limit again, from `now`.
    pub(crate) fn set_override(
        &self,
        policy: &str,
        key: u64,
        limit: Option<(u64, Nanos)>,
        now: Nanos,
    ) -> Result<(), OverrideError> {
        let compiled = self
            .policies
            .iter()
            .find(|c| c.name == policy)
            .ok_or_else(|| OverrideError::UnknownPolicy(policy.to_string()))?;
        let overridden = match limit {
            Some((limit, until)) => Some((
                compiled
                    .named
                    .policy
                    .with_limit(limit)
                    .map_err(OverrideError::Limit)?,
                until,
            )),
            None => None,
        };
        if let Some(number) = compiled.mesh_number() {
            if let Some(mesh) = &self.mesh {
                mesh.set_override(number, key, overridden.map(|(p, _)| p.capacity()));
            }
            return Ok(());
        }
        if let Some(number) = compiled.exact_number() {
            if let Some(exact) = &self.exact {
                exact.set_override(number, key, overridden.map(|(p, _)| p));
            }
            return Ok(());
        }
        let at = compiled.local_now(now);
        // What the key used, under its policy or its override so far.
        let seen = compiled.with_store(key, now, |s| s.decide(&key, at, 0));
        compiled.overrides.set(key, overridden, seen, at);
        Ok(())
    }

    /// Check that `limit` suits policy `policy` (its algorithm's bounds).
    pub(crate) fn check_override(&self, policy: &str, limit: u64) -> Result<(), OverrideError> {
        let compiled = self
            .policies
            .iter()
            .find(|c| c.name == policy)
            .ok_or_else(|| OverrideError::UnknownPolicy(policy.to_string()))?;
        compiled
            .named
            .policy
            .with_limit(limit)
            .map(|_| ())
            .map_err(OverrideError::Limit)
    }

    /// Drop the local overrides that ended by `now` (the node's sweeper).
    pub(crate) fn sweep_overrides(&self, now: Nanos) {
        for p in &self.policies {
            p.overrides.sweep(now);
        }
    }
}
