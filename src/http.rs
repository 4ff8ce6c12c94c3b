//! HTTP: the tower layer that answers 429 properly, the identity of a request, the rate-limit
//! response fields, and a retry helper for callers of rate-limited APIs.
//!
//! A request is decided in `RateLimitService::call` → [`crate::rules::Rules::decide`].

mod answer;
pub mod client;
pub(crate) mod headers;
pub(crate) mod identity;
mod layer;
pub(crate) mod sf;

pub use answer::DenialHook;
pub use headers::{
    RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};
pub use identity::{
    AuthenticatedUser, ClientAddr, ClientTier, DEFAULT_MAX_IDENTITY_BYTES, IdentityTooLong,
};
#[cfg(feature = "node")]
pub(crate) use layer::OutcomeUnseen;
pub use layer::{RateLimitLayer, RateLimitService, ReloadError};
