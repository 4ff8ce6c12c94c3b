//! Keys as the admin API addresses them: a policy and the attributes a request would carry
//! (`rules::direct`'s), hashed into the key that request gets; this node's state of a local
//! policy's key, and a reset of it (its count and lockout forgotten); a `redis` policy's key
//! read or reset in Redis.

use super::Rules;
use super::compile::Remote;
use super::direct::{Attributes, DirectError};
use crate::backend::exact::ExactError;
use crate::clock::Nanos;
use crate::decision::Decision;

/// Where a key's policy is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    /// On each node by itself.
    Local,
    /// By the mesh: the policy's number among the mesh policies.
    Mesh(u32),
    /// In Redis: the policy's number among the `redis` policies.
    Exact(u32),
}

impl Backend {
    /// The name the policy file gives it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Backend::Local => "local",
            Backend::Mesh(_) => "mesh",
            Backend::Exact(_) => "redis",
        }
    }
}

/// A key of a policy, as the admin API names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeyAddress {
    /// The policy's name.
    pub(crate) policy: &'static str,
    p: usize,
    route: Option<usize>,
    /// The key's hash (the counter key requests with these attributes are counted under).
    pub(crate) key: u64,
    /// Where it is decided.
    pub(crate) backend: Backend,
}

/// A local policy's key on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LocalKey {
    /// What a request of one token would be told now (nothing taken).
    pub(crate) decision: Decision,
    /// Nanoseconds the key's lockout (`block_for`) still lasts (0: none).
    pub(crate) lockout_ns: Nanos,
    /// Whether the node kept any state of the key (before a reset: whether it forgot some).
    pub(crate) known: bool,
}

impl Rules {
    /// The key requests with `attributes` get under policy `policy`.
    pub(crate) fn key_address(
        &self,
        policy: &str,
        attributes: &Attributes,
    ) -> Result<KeyAddress, DirectError> {
        let (p, route, key) = self.direct_address(policy, attributes)?;
        let compiled = &self.policies[p];
        let backend = match compiled.remote {
            None => Backend::Local,
            Some(Remote::Mesh(number)) => Backend::Mesh(number),
            Some(Remote::Exact(number)) => Backend::Exact(number),
        };
        Ok(KeyAddress {
            policy: compiled.name,
            p,
            route,
            key,
            backend,
        })
    }

    /// This node's state of `key` under the local policy named `policy` at `now`, and with
    /// `reset` its count and lockout forgotten after; `None` if no local policy has the name.
    pub(crate) fn local_key(
        &self,
        policy: &str,
        key: u64,
        now: Nanos,
        reset: bool,
    ) -> Option<LocalKey> {
        let compiled = self
            .policies
            .iter()
            .find(|c| c.name == policy && c.remote.is_none())?;
        let lockouts = compiled.lockouts.as_ref();
        let lockout_ns = lockouts.and_then(|l| l.left(key, now)).unwrap_or(0);
        let decision = compiled.decide_local(key, now, 0, true, &mut crate::local::Charge::Key);
        let known = if reset {
            let forgot = compiled.store.forget(&key) | compiled.forget_overridden(key);
            lockouts.is_some_and(|l| l.clear(key)) || forgot
        } else {
            decision.remaining < decision.limit || lockout_ns > 0
        };
        Some(LocalKey {
            decision,
            lockout_ns,
            known,
        })
    }

    /// A `redis` policy's key as Redis counts it (a peek: nothing taken).
    pub(crate) async fn exact_key(&self, address: &KeyAddress) -> Result<Decision, ExactError> {
        let (Backend::Exact(number), Some(exact)) = (address.backend, self.exact.as_ref()) else {
            return Err(ExactError::new(std::io::Error::other("not a redis policy")));
        };
        let route = self.exact_route(address.route, address.p);
        exact
            .decide(number, address.key, route, 0)
            .await
            .map(|a| a.decision)
    }

    /// Reset a `redis` policy's key in Redis: resolves to whether Redis counted anything.
    pub(crate) async fn exact_reset(&self, address: &KeyAddress) -> Result<bool, ExactError> {
        let (Backend::Exact(number), Some(exact)) = (address.backend, self.exact.as_ref()) else {
            return Err(ExactError::new(std::io::Error::other("not a redis policy")));
        };
        let route = self.exact_route(address.route, address.p);
        exact.reset(number, address.key, route).await
    }
}
