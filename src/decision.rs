//! The answer to one request: admitted or not, and what an HTTP response needs to say so.

use crate::clock::Nanos;
#[cfg(any(feature = "http", feature = "quic"))]
pub use global::{MeshAnswer, MeshDecision};

#[cfg(any(feature = "http", feature = "quic"))]
mod global;

/// Whether a request was admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Admitted; the tokens are taken.
    Allowed,
    /// Not admitted now; a retry after `retry_after_ns` can succeed. Nothing was taken.
    Denied,
    /// Not admitted, ever: the cost is larger than the policy's capacity. Retrying cannot help.
    CannotFit,
}

/// What a policy decided for one request, with the numbers the HTTP layer reports.
///
/// Token counts are in the policy's tokens (one per unit of cost); times are nanoseconds
/// from the instant of the decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Decision {
    /// The policy's capacity in tokens: the burst of a bucket, the limit of a window.
    pub limit: u64,
    /// Tokens still available after this decision (0 when denied for lack of them).
    pub remaining: u64,
    /// Nanoseconds until the key is back to its full `limit` (bucket full, window over).
    pub reset_after_ns: Nanos,
    /// When denied: nanoseconds until the same request can succeed. Zero otherwise.
    pub retry_after_ns: Nanos,
    /// When admitted by a shaping policy: nanoseconds the request must wait for its slot
    /// before it is forwarded. Zero for every other algorithm.
    pub delay_ns: Nanos,
    /// Which policy of a layered limiter produced this decision (0 for a single policy):
    /// the one that denied, or the most restrictive of those that admitted.
    pub policy_index: u32,
    /// Admitted, denied for now, or denied for good.
    pub verdict: Verdict,
}

impl Decision {
    /// Tell whether the request was admitted.
    #[inline]
    pub fn is_allowed(&self) -> bool {
        self.verdict == Verdict::Allowed
    }

    /// Build an admission.
    #[inline]
    pub(crate) fn allowed(limit: u64, remaining: u64, reset_after_ns: Nanos) -> Self {
        Decision {
            verdict: Verdict::Allowed,
            limit,
            remaining,
            reset_after_ns,
            retry_after_ns: 0,
            delay_ns: 0,
            policy_index: 0,
        }
    }

    /// Build a denial that a retry after `retry_after_ns` can turn into an admission.
    #[inline]
    pub(crate) fn denied(
        limit: u64,
        remaining: u64,
        reset_after_ns: Nanos,
        retry_after_ns: Nanos,
    ) -> Self {
        Decision {
            verdict: Verdict::Denied,
            limit,
            remaining,
            reset_after_ns,
            retry_after_ns: retry_after_ns.max(1),
            delay_ns: 0,
            policy_index: 0,
        }
    }

    /// Build the answer for a cost above the capacity.
    #[inline]
    pub(crate) fn cannot_fit(limit: u64) -> Self {
        Decision {
            verdict: Verdict::CannotFit,
            limit,
            remaining: 0,
            reset_after_ns: 0,
            retry_after_ns: 0,
            delay_ns: 0,
            policy_index: 0,
        }
    }

    /// Tell whether `self` leaves less room than `other` (fewer tokens, then a later reset).
    #[inline]
    pub(crate) fn is_tighter_than(&self, other: &Decision) -> bool {
        (self.remaining, std::cmp::Reverse(self.reset_after_ns))
            < (other.remaining, std::cmp::Reverse(other.reset_after_ns))
    }
}

/// What a global admission took, for the same backend to give it back
/// ([`GlobalLimits::refund`](crate::backend::mesh::GlobalLimits::refund)) when another
/// policy of the request denies it, or when a `count_when` policy does not count its
/// outcome. A token of the backend's own making: a mesh node's names the lease the tokens
/// came out of, and gives them back only to that lease.
#[cfg(any(feature = "http", feature = "mesh"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MeshCharge(u64);

#[cfg(any(feature = "http", feature = "mesh"))]
impl MeshCharge {
    /// A charge the backend names by `token`.
    pub const fn new(token: u64) -> Self {
        MeshCharge(token)
    }

    /// The backend's token.
    pub const fn token(self) -> u64 {
        self.0
    }
}
