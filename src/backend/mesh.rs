//! The `mesh` backend as the policy file sees it: a cluster-wide limit that a running mesh
//! node decides locally (one compare-and-swap), while its gossip keeps the nodes' shares of
//! the limit summing to at most the limit.
//!
//! [`crate::net::MeshNet`] (a node with its QUIC transport) implements [`GlobalLimits`];
//! [`crate::rules::Rules::with_mesh`] connects it to the policies with `backend = "mesh"`.

use crate::decision::Decision;

/// Decide requests against the cluster-wide policies of a mesh node.
pub trait GlobalLimits: Send + Sync {
    /// Decide a request of `cost` tokens for `key` (a hash that is the same on every node)
    /// under mesh policy number `policy` (its index in
    /// [`crate::config::GatewayConfig::mesh_policies`]).
    fn decide(&self, policy: u32, key: u64, cost: u64) -> Decision;
}
