//! A rate limiter for API gateways that needs no central store.
//!
//! Every gateway node decides locally, in tens of nanoseconds, from per-key state in a
//! concurrent map: [`Limiter`] for limits in code, [`http::RateLimitLayer`] for a tower
//! service driven by a TOML policy file, exact limits in Redis ([`backend::redis`]) and limits
//! shared by a cluster ([`mesh`], [`net::MeshNet`]). Features: `tokio`, `http`, `redis`,
//! `mesh`, `quic`, `node`, `cli` (the default is all of them; with `default-features = false`,
//! the local engine alone).
//!
//! # Quick start: `Limiter`
//!
//! ```
//! use std::time::Duration;
//! use ratemesh::{Limiter, Policy, Verdict};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Per key: 10 requests per second with bursts of 20, and 1000 per UTC day.
//! let limiter = Limiter::builder()
//!     .policy(Policy::token_bucket(10, Duration::from_secs(1), 20)?)
//!     .policy(Policy::fixed_window(1000, Duration::from_secs(86_400))?)
//!     .build::<String>()?;
//!
//! let decision = limiter.check("tenant-42", 1); // a `&str` key: no allocation
//! assert_eq!(decision.verdict, Verdict::Allowed);
//! assert_eq!(decision.remaining, 19);
//!
//! // A denial says when a retry will succeed (`Retry-After`), and charges nothing.
//! let denied = (0..20).map(|_| limiter.check("tenant-42", 1)).last().unwrap();
//! assert_eq!(denied.verdict, Verdict::Denied);
//! assert!(denied.retry_after_ns > 0);
//! # Ok(()) }
//! ```
//!
//! `Limiter` is `Sync`: share it behind an `Arc`. A request passes only if every policy
//! admits it; a denial by one gives back what the others took.
//!
//! # Quick start: `RateLimitLayer` (feature `http`)
//!
//! ```
//! # #[cfg(feature = "http")]
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use ratemesh::config::GatewayConfig;
//! use ratemesh::http::RateLimitLayer;
//! use tower::ServiceExt;
//!
//! // Usually `RateLimitLayer::from_file("policies.toml")`, and `reload_on_sighup` with it.
//! let config = GatewayConfig::from_toml_str(
//!     r#"
//!     default_tier = "free"
//!     [policies.per_second]
//!     algorithm = "token-bucket"
//!     rate = 10
//!     period = "1s"
//!     burst = 20
//!     [tiers.free]
//!     policies = ["per_second"]
//!     "#,
//!     "policies.toml",
//! )?;
//! let limits = RateLimitLayer::new(config)?;
//! let app = axum::Router::new()
//!     .route("/", axum::routing::get(|| async { "ok" }))
//!     .layer(limits.clone());
//! // Serve it with `app.into_make_service_with_connect_info::<SocketAddr>()`, so that
//! // clients without a user or API key are known by their address.
//!
//! let request = http::Request::get("/")
//!     .header("x-api-key", "k1")
//!     .body(axum::body::Body::empty())?;
//! let response = app.oneshot(request).await?;
//! assert_eq!(response.status(), 200);
//! assert_eq!(response.headers()["ratelimit"], r#""per_second";r=19;t=1"#);
//! # Ok(()) }
//! # #[cfg(not(feature = "http"))]
//! # fn main() {}
//! ```
//!
//! A denied request gets `429` with `Retry-After`, the `RateLimit-Policy` and `RateLimit`
//! fields and a JSON body. [`http::RateLimitLayer::reload`] replaces the rules while the
//! service runs; unchanged policies keep their counters.
//!
//! # Where a request is decided
//!
//! A request is decided in [`Limiter::check`] (see `limiter.rs`): it reads the clock once,
//! and each layered policy's [`local::Store`] runs one compare-and-swap (or one per-key lock)
//! on the key's cell through the pure functions of [`algorithm`].
//!
//! Behind HTTP, a request is decided in `http::RateLimitService::call`, which identifies the
//! client and calls [`rules::Rules::decide`] (tiers, routes, costs, layered policies).
//!
//! Module map (pure modules take `now` as an argument and do no IO):
//! - [`clock`]: `Nanos`, the `Clock` trait, system, manual and tokio clocks.
//! - [`policy`]: validated policies and their typed errors.
//! - [`algorithm`]: the algorithms as pure state machines over `now`.
//! - [`local`]: the concurrent per-key store with a hard cap on keys.
//! - [`Limiter`] (`limiter.rs`): layered policies, `check` and `until_ready`.
//! - [`Decision`] (`decision.rs`): what a decision reports.
//! - [`ids`]: what must agree across processes: node ids and the keyed hash of identities.
//! - [`config`]: the TOML policy file and its located errors.
//! - [`rules`]: the compiled policy file; where an HTTP request is decided.
//! - [`http`]: the tower layer, identity, response fields, retry helper.
//! - [`backend`]: exact limits in Redis (Lua scripts, fail modes).
//! - [`mesh`]: the global limit across nodes: one authority per key on its owner, leases
//!   to the nodes that use the key, the sans-IO state machine ([`mesh::Node`]) and the peer
//!   frame codec. A global request is decided from the node's lease (one CAS in
//!   `mesh::lease::LeaseCell`) or waits for the key's owner ([`mesh::Node::decide`]).
//! - [`sim`]: the deterministic cluster simulator behind `ratemesh simulate`.
//! - [`net`]: the QUIC transport of the mesh ([`net::MeshNet`]), cluster certificates.
//! - [`node`]: a whole `ratemesh node` (HTTP gateway, mesh, metrics) in your own process.

#![deny(missing_docs)]
#![warn(unreachable_pub, unnameable_types)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod algorithm;
#[cfg(any(feature = "http", feature = "quic"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "http", feature = "quic"))))]
pub mod backend;
pub mod clock;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod config;
#[cfg(feature = "node")]
mod daemon;
mod decision;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod http;
#[cfg(any(feature = "http", feature = "mesh"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "http", feature = "mesh"))))]
pub mod ids;
mod limiter;
pub mod local;
#[cfg(feature = "mesh")]
#[cfg_attr(docsrs, doc(cfg(feature = "mesh")))]
pub mod mesh;
#[cfg(feature = "quic")]
#[cfg_attr(docsrs, doc(cfg(feature = "quic")))]
pub mod net;
#[cfg(feature = "node")]
#[cfg_attr(docsrs, doc(cfg(feature = "node")))]
pub mod node;
pub mod policy;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod rules;
#[cfg(feature = "mesh")]
#[cfg_attr(docsrs, doc(cfg(feature = "mesh")))]
pub mod sim;
mod sync;
#[cfg(all(test, feature = "mesh"))]
mod testing;
#[cfg(feature = "node")]
mod top;

/// Entry points for fuzz targets (`tests/fuzz/`, feature `fuzzing`): not part of the supported API,
/// and changed as the fuzz targets need.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    /// Parse `data` as an upstream's answer the way the reverse proxy's HTTP/1.1 client reads
    /// one: its final head (interim 1xx heads skipped), the body framing that head gives, a
    /// chunk-size line and a trailer section. Panics if a result breaks what the proxy relies
    /// on (a hop-by-hop field handed on, a framing that contradicts the fields, ...).
    pub fn h1_head(data: &[u8]) {
        crate::daemon::fuzz_head(data);
    }
}

#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub use clock::TokioClock;
pub use clock::{Clock, ManualClock, Nanos, SystemClock};
pub use decision::{Decision, Verdict};
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub use limiter::WaitError;
pub use limiter::{Limiter, LimiterBuilder, LimiterError, MAX_POLICIES};
pub use local::ToKey;
pub use policy::{Algorithm, Policy, PolicyError};

/// The README's Rust snippets, compiled (and run, unless marked `no_run`) as doctests.
#[cfg(all(doctest, feature = "http"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
