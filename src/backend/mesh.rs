//! The `mesh` backend as the policy file sees it: a cluster-wide limit that a running mesh
//! node decides from its lease of the key (one compare-and-swap), or, when its lease is
//! short, after asking the key's owner for more (a short wait, never a denial for being
//! shared).
//!
//! [`crate::net::MeshNet`] (a node with its QUIC transport) implements [`GlobalLimits`];
//! [`crate::rules::Rules::with_mesh`] connects it to the policies with `backend = "mesh"`.

use crate::policy::Policy;

/// Decide requests against the cluster-wide policies of a mesh node.
pub trait GlobalLimits: Send + Sync {
    /// Decide a request of `cost` tokens for `key` (a hash that is the same on every node)
    /// under mesh policy number `policy` (its index in
    /// [`crate::config::GatewayConfig::mesh_policies`]).
    fn decide(&self, policy: u32, key: u64, cost: u64) -> MeshDecision;

    /// Give back `cost` tokens that an admission of `key` under mesh policy number `policy`
    /// took (`charge`, from [`MeshDecision::answer`]): another policy of the request denied
    /// it, or its response did not count (`count_when`). Return whether they went back (they
    /// stay counted otherwise: the cluster then admits less, never more). The default
    /// gives nothing back.
    fn refund(&self, policy: u32, key: u64, cost: u64, charge: MeshCharge) -> bool {
        let _ = (policy, key, cost, charge);
        false
    }

    /// Enforce `policies` (the file's `mesh` policies, in order) from now on, and announce
    /// `digest` ([`crate::config::GatewayConfig::mesh_digest`]) to the peers: a live change of
    /// limits, rates or bursts (a reload). Refused (with the reason) when the change needs
    /// the nodes restarted, e.g. another algorithm; the default refuses every change.
    fn reconfigure(&self, policies: &[Policy], digest: u64) -> Result<(), String> {
        let _ = (policies, digest);
        Err("this mesh cannot change its policies while it runs".to_owned())
    }

    /// Enforce a limit of `limit` on `key` under mesh policy number `policy` from now on
    /// (an override of the admin API), or (`None`) the policy's own again. The default
    /// ignores it.
    fn set_override(&self, policy: u32, key: u64, limit: Option<u64>) {
        let _ = (policy, key, limit);
    }
}

pub use crate::decision::{MeshAnswer, MeshCharge, MeshDecision};

/// A node with its QUIC transport decides the `mesh` policies.
#[cfg(feature = "quic")]
impl GlobalLimits for crate::net::MeshNet {
    fn decide(&self, policy: u32, key: u64, cost: u64) -> MeshDecision {
        crate::net::MeshNet::decide(self, policy, key, cost)
    }

    fn refund(&self, policy: u32, key: u64, cost: u64, charge: MeshCharge) -> bool {
        crate::net::MeshNet::refund(self, policy, key, cost, charge)
    }

    fn reconfigure(&self, policies: &[Policy], digest: u64) -> Result<(), String> {
        crate::net::MeshNet::reconfigure(self, policies.to_vec(), digest).map_err(|e| e.to_string())
    }

    fn set_override(&self, policy: u32, key: u64, limit: Option<u64>) {
        crate::net::MeshNet::set_override(self, policy, key, limit);
    }
}
