//! HTTP: the tower layer that answers 429 properly, the identity of a request, the rate-limit
//! response fields, and a retry helper for callers of rate-limited APIs.
//!
//! A request passes the layer in two steps (`http::gate`): matched once against the rules
//! ([`crate::rules::Rules`]' plan of its policies), then charged and answered.

mod answer;
pub mod client;
pub(crate) mod forms;
mod gate;
pub(crate) mod headers;
pub(crate) mod identity;
mod layer;
pub(crate) mod sf;
mod slots;

pub use answer::DenialHook;
#[cfg(feature = "node")]
pub(crate) use gate::{Gate, Matched, Responding};
pub use headers::{
    RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};
pub use identity::{
    AuthenticatedUser, ClientAddr, ClientTier, DEFAULT_MAX_IDENTITY_BYTES, IdentityTooLong,
};
pub use layer::{RateLimitLayer, RateLimitService, ReloadError};
