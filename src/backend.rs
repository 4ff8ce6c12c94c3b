//! Backends that keep counters outside this process.
//!
//! A policy file's remote policies reach the rules through one trait per kind, and follow
//! one path there (local layers charged first, a remote denial gives their charges back):
//! [`mesh`] ([`mesh::GlobalLimits`]) is the cluster-wide limit kept by the nodes' gossip;
//! [`exact`] ([`exact::ExactLimits`]) is a limit kept exactly in one remote store, with a
//! fail mode per policy. [`redis`] is that store: one atomic Lua script per decision, time
//! from Redis's own clock, for low-volume money paths; [`token_cache`] spares it calls for
//! hot keys; [`redis_limits`] is a policy file's `redis` policies on it.

#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod exact;
pub mod mesh;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis_limits;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod token_cache;
