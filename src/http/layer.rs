//! The tower layer: one line in an axum or hyper service.
//!
//! ```no_run
//! # use ratemesh::config::GatewayConfig;
//! # use ratemesh::http::RateLimitLayer;
//! # fn app() -> Result<(), Box<dyn std::error::Error>> {
//! let limits = RateLimitLayer::from_file("policies.toml")?;
//! let app: axum::Router = axum::Router::new()
//!     .route("/", axum::routing::get(|| async { "ok" }))
//!     .layer(limits.clone());
//! # Ok(()) }
//! ```
//!
//! Every clone of the layer and of its services shares one set of counters (an `Arc`), unlike
//! tower's own `RateLimit`, which counts per service instance.

use std::path::Path;
use std::sync::Arc;
use std::task::{Context, Poll};

use arc_swap::ArcSwap;
use axum::body::{Body, Bytes, HttpBody};
use http::{Request, Response};
use tower::{Layer, Service};

use crate::clock::{Clock, SystemClock};
use crate::config::{ConfigError, GatewayConfig};
use crate::http::gate::{Gate, Responding};
use crate::http::identity::peer_of;
use crate::rules::{Outcome, Rules, RulesError};

/// Why a reload was refused; the rules in force are unchanged.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The new file is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The new file is valid but cannot be compiled.
    #[error(transparent)]
    Rules(#[from] RulesError),
}

/// A tower `Layer` that rate-limits requests by a policy file; clone it freely.
#[derive(Clone)]
pub struct RateLimitLayer {
    gate: Arc<Gate>,
}

impl std::fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("rules", &*self.gate.rules.load())
            .finish()
    }
}

impl RateLimitLayer {
    /// Build the layer from a validated policy file, with the system clock.
    pub fn new(config: GatewayConfig) -> Result<Self, RulesError> {
        Self::with_clock(config, Arc::new(SystemClock::new()))
    }

    /// Build the layer with an explicit clock (tests, simulations).
    pub fn with_clock(config: GatewayConfig, clock: Arc<dyn Clock>) -> Result<Self, RulesError> {
        Ok(RateLimitLayer {
            gate: Arc::new(Gate::new(Rules::new(config)?, clock)),
        })
    }

    /// Build the layer for a file with `backend = "mesh"` policies, decided by `mesh` (a
    /// running node, e.g. [`crate::net::MeshNet`]), with the system clock.
    pub fn with_mesh(
        config: GatewayConfig,
        mesh: Arc<dyn crate::backend::mesh::GlobalLimits>,
    ) -> Result<Self, RulesError> {
        Ok(RateLimitLayer {
            gate: Arc::new(Gate::new(
                Rules::with_mesh(config, mesh)?,
                Arc::new(SystemClock::new()),
            )),
        })
    }

    /// Read a policy file and build the layer.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, ReloadError> {
        Ok(Self::new(GatewayConfig::from_file(path)?)?)
    }

    /// Answer denied requests with `hook` instead of the default 429 JSON response. The
    /// rate-limit fields and `Retry-After` are still added, unless the hook sets them.
    ///
    /// Call it while building, before cloning: the returned layer keeps the counters but has
    /// its own handle for [`RateLimitLayer::reload`].
    pub fn on_denied(
        self,
        hook: impl Fn(&Outcome) -> Response<Body> + Send + Sync + 'static,
    ) -> Self {
        self.rebuilt(|gate| gate.on_denied = Some(Arc::new(hook)))
    }

    /// Refuse requests whose API key or device id is longer than `max` bytes (default
    /// [`crate::http::identity::DEFAULT_MAX_IDENTITY_BYTES`]) with 431 and a JSON body. Identities are hashed whole,
    /// never cut, so this cap bounds the work per request.
    ///
    /// Call it while building, before cloning (like [`RateLimitLayer::on_denied`]).
    pub fn max_identity_bytes(self, max: usize) -> Self {
        self.rebuilt(|gate| gate.max_identity_bytes = max)
    }

    /// Remember the keys of requests in clear, the parts `show` allows, for the admin API's
    /// `/v1/top` (`[admin] show_identities`). Call it while building, before cloning.
    #[cfg(feature = "node")]
    pub(crate) fn show_identities(
        self,
        show: Option<crate::rules::identities::ShowIdentities>,
    ) -> Self {
        self.rebuilt(|gate| gate.show_identities = show.map(Arc::new))
    }

    /// This layer's gate, changed by `change`, with the same rules (and counters).
    fn rebuilt(self, change: impl FnOnce(&mut Gate)) -> Self {
        let mut gate = Gate {
            rules: ArcSwap::new(self.gate.rules.load_full()),
            clock: Arc::clone(&self.gate.clock),
            on_denied: self.gate.on_denied.clone(),
            max_identity_bytes: self.gate.max_identity_bytes,
            #[cfg(feature = "node")]
            show_identities: self.gate.show_identities.clone(),
        };
        change(&mut gate);
        RateLimitLayer {
            gate: Arc::new(gate),
        }
    }

    /// Return the rules in force.
    pub fn rules(&self) -> Arc<Rules> {
        self.gate.rules.load_full()
    }

    /// The rules in force, borrowed for a moment ([`Gate::rules_now`]). Not to be held
    /// across an `.await`.
    #[cfg(feature = "node")]
    pub(crate) fn rules_now(&self) -> arc_swap::Guard<Arc<Rules>> {
        self.gate.rules_now()
    }

    /// The layer's two steps, for a server that matches a request where it routes it and
    /// charges it where it answers it (the node).
    #[cfg(feature = "node")]
    pub(crate) fn gate(&self) -> &Arc<Gate> {
        &self.gate
    }

    /// Read the layer's clock (nanoseconds), for decisions made beside the layer (Envoy's
    /// rate limit service API in a node).
    pub fn now_ns(&self) -> crate::clock::Nanos {
        self.gate.clock.now_ns()
    }

    /// Replace the rules with `config`, keeping the counters of unchanged policies.
    pub fn reload(&self, config: GatewayConfig) -> Result<(), RulesError> {
        let current = self.gate.rules.load_full();
        let next = Rules::reloaded(config, &current)?;
        self.gate.rules.store(Arc::new(next));
        tracing::info!("rate-limit policies reloaded");
        Ok(())
    }

    /// Re-read `path` and reload; an invalid file is rejected and the old rules stay.
    pub fn reload_from_file(&self, path: impl AsRef<Path>) -> Result<(), ReloadError> {
        let config = GatewayConfig::from_file(path)?;
        Ok(self.reload(config)?)
    }

    /// Reload from `path` whenever the process receives SIGHUP (Unix), until the runtime
    /// stops. Errors are logged and leave the old rules in force.
    #[cfg(unix)]
    pub fn reload_on_sighup(
        &self,
        path: impl AsRef<Path>,
    ) -> std::io::Result<tokio::task::JoinHandle<()>> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hangups = signal(SignalKind::hangup())?;
        let layer = self.clone();
        let path = path.as_ref().to_path_buf();
        Ok(tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                match layer.reload_from_file(&path) {
                    Ok(()) => tracing::info!(path = %path.display(), "reloaded on SIGHUP"),
                    Err(error) => {
                        tracing::error!(%error, "reload on SIGHUP refused; old policies stay")
                    }
                }
            }
        }))
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimitService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimitService {
            layer: self.clone(),
            inner,
        }
    }
}

/// The service made by [`RateLimitLayer`].
#[derive(Clone, Debug)]
pub struct RateLimitService<S> {
    layer: RateLimitLayer,
    inner: S,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimitService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<axum::BoxError>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Responding<S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The inner service that `poll_ready` readied is the one we call; leave a fresh clone.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        // Alone, the layer matches the request itself, from the peer its extensions name.
        let gate = &self.layer.gate;
        let matched = gate.plan(gate.rules_now(), &request, peer_of(request.extensions()));
        gate.pass(matched, request, move |request| inner.call(request))
    }
}
