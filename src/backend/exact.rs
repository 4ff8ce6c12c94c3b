//! The exact backend as the policy file sees it: policies with `backend = "redis"`, decided
//! by one remote store for the whole fleet, with a fail mode for when it cannot answer.
//!
//! [`ExactLimits`] is the seam through which [`crate::rules::Rules`] asks it, as
//! [`GlobalLimits`](super::mesh::GlobalLimits) is the mesh's: the Redis backend
//! ([`crate::backend::redis_limits::RedisLimits`]) implements it, and so can a test double.
//! [`fail_over`] is the one place a failure meets its policy's fail mode, for the rules and
//! for [`crate::backend::redis::ExactLimiter`] alike.

use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

use crate::config::FailMode;
use crate::decision::{Decision, Verdict};

/// Why the exact backend could not decide (Redis down, a timeout, a malformed reply).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct ExactError(Box<dyn std::error::Error + Send + Sync>);

impl ExactError {
    /// Wrap the backend's own error.
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        ExactError(Box::new(error))
    }
}

/// What the exact backend answered: its decision, and when the call that made it was sent
/// (the charge is no older: what [`ExactLimits::refund`] needs to find the charge's window).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExactAnswer {
    /// The backend's decision.
    pub decision: Decision,
    /// When the call was sent.
    pub sent: Instant,
}

impl ExactAnswer {
    /// `decision`, made by a call sent at `sent`.
    pub fn new(decision: Decision, sent: Instant) -> Self {
        ExactAnswer { decision, sent }
    }
}

/// The answer of the exact backend, on its way.
pub type ExactFuture<'a> =
    Pin<Box<dyn Future<Output = Result<ExactAnswer, ExactError>> + Send + 'a>>;

/// Whether a refund went back, on its way: `false` when the charge stays counted (its window
/// is over, or the refund could not tell it from one of the window before).
pub type RefundFuture<'a> = Pin<Box<dyn Future<Output = Result<bool, ExactError>> + Send + 'a>>;

/// Decide requests against the exact policies of a policy file.
pub trait ExactLimits: Send + Sync {
    /// Decide a request of `cost` tokens under exact policy number `policy` (its index in
    /// [`crate::config::GatewayConfig::redis_policies`]) for the counters keyed `key` (the
    /// keyed hash of the client, and of `route` when the policy applies through that route).
    fn decide<'a>(
        &'a self,
        policy: u32,
        key: u64,
        route: Option<&'a str>,
        cost: u64,
    ) -> ExactFuture<'a>;

    /// Give back `cost` tokens that a decision of exact policy number `policy` took for
    /// `key` (and `route`, as decided) by a call sent at `sent` ([`ExactAnswer::sent`]):
    /// another policy denied the request, or its response does not count (`count_when`).
    /// A refund never lets the policy admit more than it would have without the charge.
    fn refund<'a>(
        &'a self,
        policy: u32,
        key: u64,
        route: Option<&'a str>,
        cost: u64,
        sent: Instant,
    ) -> RefundFuture<'a>;

    /// Enforce `policy` (an override's limit) on `key` of exact policy number `policy_number`
    /// from now on, or (`None`) the policy's own limits again. The default ignores it.
    fn set_override(&self, policy_number: u32, key: u64, policy: Option<crate::policy::Policy>) {
        let _ = (policy_number, key, policy);
    }

    /// Forget what exact policy number `policy` counts for `key` (and `route`): a reset
    /// (the admin API), after which the key has its whole limit. Resolves to whether
    /// anything was counted. The default cannot.
    fn reset<'a>(&'a self, policy: u32, key: u64, route: Option<&'a str>) -> RefundFuture<'a> {
        let _ = (policy, key, route);
        Box::pin(async {
            Err(ExactError::new(std::io::Error::other(
                "this exact backend cannot reset a key",
            )))
        })
    }
}

/// The outcome of an exact decision, saying which path decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExactDecision {
    /// The backend decided.
    Exact(Decision),
    /// The backend failed; the local fallback decided (fail-open).
    Fallback(Decision),
    /// The backend failed and the policy fails closed.
    Unavailable,
}

impl ExactDecision {
    /// Tell whether the request may go on.
    pub fn is_allowed(&self) -> bool {
        match self {
            ExactDecision::Exact(d) | ExactDecision::Fallback(d) => d.verdict == Verdict::Allowed,
            ExactDecision::Unavailable => false,
        }
    }
}

/// Turn the backend's answer into the policy's decision: the backend's own, or on a failure
/// what the fail mode says (`fallback` decides when it fails open). A failure is counted
/// (`ratemesh_backend_failovers_total{policy, mode}`) and logged.
pub fn fail_over<E: std::fmt::Display>(
    policy: &str,
    mode: FailMode,
    answer: Result<Decision, E>,
    fallback: impl FnOnce() -> Decision,
) -> ExactDecision {
    let error = match answer {
        Ok(decision) => return ExactDecision::Exact(decision),
        Err(error) => error,
    };
    let mode_name = match mode {
        FailMode::Open => "open",
        FailMode::Closed => "closed",
    };
    metrics::counter!("ratemesh_backend_failovers_total", "policy" => policy.to_string(), "mode" => mode_name)
        .increment(1);
    tracing::warn!(policy, %error, mode = mode_name, "exact backend failed; applying the fail mode");
    match mode {
        FailMode::Open => ExactDecision::Fallback(fallback()),
        FailMode::Closed => ExactDecision::Unavailable,
    }
}
