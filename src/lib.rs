//! ratemesh: a rate limiter for API gateways that needs no central store.
//!
//! Every gateway node decides locally, in nanoseconds, from per-key state in a concurrent
//! map. A request is decided in [`Limiter::check`] (see `limiter.rs`): it reads the clock
//! once, and each layered policy's [`local::Store`] runs one compare-and-swap (or one
//! per-key lock) on the key's cell through the pure functions of [`algorithm`].
//!
//! ```
//! use std::time::Duration;
//! use ratemesh::{Limiter, Policy};
//!
//! let limiter = Limiter::builder()
//!     .policy(Policy::token_bucket(10, Duration::from_secs(1), 20).unwrap())
//!     .policy(Policy::fixed_window(1000, Duration::from_secs(86_400)).unwrap())
//!     .build::<String>()
//!     .unwrap();
//! let decision = limiter.check("tenant-42", 1);
//! assert!(decision.is_allowed());
//! assert_eq!(decision.remaining, 19);
//! ```
//!
//! Behind HTTP, a request is decided in `http::RateLimitService::call`, which identifies the
//! client and calls [`rules::Rules::decide`] (tiers, routes, costs, layered policies).
//!
//! Module map (pure modules take `now` as an argument and do no IO):
//! - [`clock`]: `Nanos`, the `Clock` trait, system, manual and tokio clocks.
//! - [`policy`]: validated policies and their typed errors.
//! - [`algorithm`]: the algorithms as pure state machines over `now`.
//! - [`local`]: the concurrent per-key store with a hard cap on keys.
//! - [`limiter`]: layered policies, `check` and `until_ready`.
//! - [`decision`]: what a decision reports.
//! - [`config`]: the TOML policy file and its located errors.
//! - [`rules`]: the compiled policy file; where an HTTP request is decided.
//! - [`http`]: the tower layer, identity, response fields, retry helper.
//! - [`backend`]: exact limits in Redis (Lua scripts, fail modes).
//! - [`mesh`]: the global limit across nodes: one authority per key on its owner, leases
//!   to the nodes that use the key, the sans-IO state machine ([`mesh::Node`]) and the peer
//!   frame codec. A global request is decided from the node's lease (one CAS in
//!   [`mesh::lease::LeaseCell`]) or waits for the key's owner ([`mesh::Node::decide`]).
//! - [`sim`]: the deterministic cluster simulator behind `ratemesh simulate`.

#![deny(missing_docs)]

pub mod algorithm;
#[cfg(any(feature = "http", feature = "quic"))]
pub mod backend;
pub mod clock;
#[cfg(feature = "http")]
pub mod config;
#[cfg(feature = "node")]
pub mod daemon;
pub mod decision;
#[cfg(feature = "http")]
pub mod http;
pub mod limiter;
pub mod local;
#[cfg(feature = "mesh")]
pub mod mesh;
#[cfg(feature = "quic")]
pub mod net;
pub mod policy;
#[cfg(feature = "http")]
pub mod rules;
#[cfg(feature = "mesh")]
pub mod sim;
mod sync;

#[cfg(feature = "tokio")]
pub use clock::TokioClock;
pub use clock::{Clock, ManualClock, Nanos, SystemClock};
pub use decision::{Decision, Verdict};
#[cfg(feature = "tokio")]
pub use limiter::WaitError;
pub use limiter::{Limiter, LimiterBuilder, LimiterError};
pub use policy::{Algorithm, Policy, PolicyError};
