//! HTTP: the tower layer that answers 429 properly, the identity of a request, the rate-limit
//! response fields, and a retry helper for callers of rate-limited APIs.
//!
//! A request is decided in `RateLimitService::call` → [`crate::rules::Rules::decide`].

pub mod client;
pub mod headers;
pub mod identity;
mod layer;
pub mod sf;

pub use identity::{AuthenticatedUser, ClientAddr, ClientTier};
pub use layer::{DenialHook, RateLimitLayer, RateLimitService, ReloadError};
