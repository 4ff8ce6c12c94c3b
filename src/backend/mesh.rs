//! The `mesh` backend as the policy file sees it: a cluster-wide limit that a running mesh
//! node decides from its lease of the key (one compare-and-swap), or, when its lease is
//! short, after asking the key's owner for more (a short wait, never a denial for being
//! shared).
//!
//! [`crate::net::MeshNet`] (a node with its QUIC transport) implements [`GlobalLimits`];
//! [`crate::rules::Rules::with_mesh`] connects it to the policies with `backend = "mesh"`.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::decision::Decision;
use crate::policy::Policy;

/// Decide requests against the cluster-wide policies of a mesh node.
pub trait GlobalLimits: Send + Sync {
    /// Decide a request of `cost` tokens for `key` (a hash that is the same on every node)
    /// under mesh policy number `policy` (its index in
    /// [`crate::config::GatewayConfig::mesh_policies`]).
    fn decide(&self, policy: u32, key: u64, cost: u64) -> MeshDecision;

    /// Enforce `policies` (the file's `mesh` policies, in order) from now on, and announce
    /// `digest` ([`crate::config::GatewayConfig::mesh_digest`]) to the peers: a live change of
    /// limits, rates or bursts (a reload). Refused (with the reason) when the change needs
    /// the nodes restarted, e.g. another algorithm; the default refuses every change.
    fn reconfigure(&self, policies: &[Policy], digest: u64) -> Result<(), String> {
        let _ = (policies, digest);
        Err("this mesh cannot change its policies while it runs".to_owned())
    }
}

/// A global decision: ready at once (the node's lease decided), or on its way from the key's
/// owner.
#[derive(Debug)]
pub enum MeshDecision {
    /// Decided.
    Ready(Option<Decision>),
    /// The request waits for the owner's answer; `fallback` answers if the node stops first.
    Waiting {
        /// Where the answer arrives.
        answer: tokio::sync::oneshot::Receiver<Decision>,
        /// The decision if no answer ever comes (the node shut down).
        fallback: Decision,
    },
}

impl MeshDecision {
    /// The decision if it is ready, or `fallback` without waiting.
    pub fn now_or(self, fallback: Decision) -> Decision {
        match self {
            MeshDecision::Ready(Some(d)) => d,
            MeshDecision::Ready(None) => fallback,
            MeshDecision::Waiting { mut answer, .. } => answer.try_recv().unwrap_or(fallback),
        }
    }
}

impl Future for MeshDecision {
    type Output = Decision;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Decision> {
        match self.get_mut() {
            MeshDecision::Ready(d) => Poll::Ready(d.take().expect("polled after completion")),
            MeshDecision::Waiting { answer, fallback } => match Pin::new(answer).poll(cx) {
                Poll::Ready(Ok(d)) => Poll::Ready(d),
                Poll::Ready(Err(_)) => Poll::Ready(*fallback),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}
