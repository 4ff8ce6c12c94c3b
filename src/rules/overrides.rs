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

use super::compile::CompiledPolicy;
#[cfg(feature = "node")]
use super::{Rules, compile::Remote};
use crate::clock::Nanos;
use crate::local::Store;
#[cfg(feature = "node")]
use crate::policy::PolicyError;

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

impl CompiledPolicy {
    /// Run `f` on the store that decides `key` at `now`: its override's while one runs,
    /// else the policy's own.
    #[inline]
    pub(super) fn with_store<R>(
        &self,
        key: u64,
        now: Nanos,
        f: impl FnOnce(&Store<u64>) -> R,
    ) -> R {
        if self.overrides.count.load(Ordering::Relaxed) != 0
            && let Some(o) = self.overrides.map.get(&key)
            && o.until > now
        {
            return f(&o.store);
        }
        f(&self.store)
    }

    /// Forget `key`'s counts under its override too (a reset); tell whether it had one.
    #[cfg(feature = "node")]
    pub(super) fn forget_overridden(&self, key: u64) -> bool {
        self.overrides
            .map
            .get(&key)
            .is_some_and(|o| o.store.forget(&key))
    }

    /// Drop the overrides that ended by `now`.
    #[cfg(feature = "node")]
    fn sweep_overrides(&self, now: Nanos) {
        if self.overrides.count.load(Ordering::Relaxed) != 0 {
            self.overrides.map.retain(|_, o| o.until > now);
            self.overrides
                .count
                .store(self.overrides.map.len(), Ordering::Relaxed);
        }
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
        match compiled.remote {
            Some(Remote::Mesh(number)) => {
                if let Some(mesh) = &self.mesh {
                    mesh.set_override(number, key, overridden.map(|(p, _)| p.capacity()));
                }
                return Ok(());
            }
            Some(Remote::Exact(number)) => {
                if let Some(exact) = &self.exact {
                    exact.set_override(number, key, overridden.map(|(p, _)| p));
                }
                return Ok(());
            }
            None => {}
        }
        let table = &compiled.overrides;
        match overridden {
            None => {
                table.map.remove(&key);
            }
            Some((policy, until)) => {
                let at = compiled.local_now(now);
                // What the key used, under its policy or its override so far.
                let seen = compiled.with_store(key, now, |s| s.decide(&key, at, 0));
                let used = seen.limit.saturating_sub(seen.remaining);
                let store = Store::new(policy, 1);
                if used > 0 {
                    store.decide(&key, at, used.min(policy.capacity()));
                }
                table.map.insert(key, Arc::new(Overridden { store, until }));
            }
        }
        table.count.store(table.map.len(), Ordering::Relaxed);
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
            p.sweep_overrides(now);
        }
    }
}
