//! Backends that keep counters outside this process.
//!
//! [`redis`] is the exact backend for low-volume money paths: one atomic Lua script per
//! decision, time from Redis's own clock, and a fail mode per policy when Redis is away.
//! [`mesh`] is the cluster-wide limit kept by the nodes' gossip, as the policy file uses it.

pub mod mesh;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "redis")]
pub mod token_cache;
