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

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;
use axum::body::{Body, Bytes, HttpBody};
use http::{Request, Response, StatusCode};
use tower::{Layer, Service};

use crate::clock::{Clock, SystemClock};
use crate::config::{ConfigError, GatewayConfig};
use crate::http::answer::{DenialHook, denial, identity_too_long, with_fields};
use crate::http::identity::{
    AuthenticatedUser, ClientTier, DEFAULT_MAX_IDENTITY_BYTES, IdentityTooLong, client_ip,
    identify, peer_of,
};
use crate::rules::{Claims, Outcome, Refusal, RequestFacts, RequestParts, Rules, RulesError};

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

/// What one decision needs, taken from the request.
struct Prepared {
    rules: Arc<Rules>,
    identity: crate::rules::Identity,
    tier: Option<String>,
    method: http::Method,
    path: String,
    parts: OwnedParts,
    now: crate::clock::Nanos,
}

/// [`RequestParts`] taken from a request, for a decision that waits: copied only when the
/// rules read them.
#[derive(Default)]
struct OwnedParts {
    headers: Option<http::HeaderMap>,
    client_ip: Option<std::net::IpAddr>,
    user: Option<String>,
    query: Option<String>,
    host: Option<String>,
    claims: Option<Claims>,
    from_trusted_proxy: bool,
}

impl OwnedParts {
    fn of(parts: &RequestParts<'_>, claims: Option<Claims>) -> Self {
        OwnedParts {
            headers: parts.headers.cloned(),
            client_ip: parts.client_ip,
            user: parts.user.map(str::to_string),
            query: parts.query.map(str::to_string),
            host: parts.host.map(str::to_string),
            claims,
            from_trusted_proxy: parts.from_trusted_proxy,
        }
    }

    fn view(&self) -> RequestParts<'_> {
        RequestParts {
            headers: self.headers.as_ref(),
            client_ip: self.client_ip,
            user: self.user.as_deref(),
            query: self.query.as_deref(),
            host: self.host.as_deref(),
            claims: self.claims.as_ref(),
            from_trusted_proxy: self.from_trusted_proxy,
        }
    }
}

/// The parts of `request` that `rules` read beyond its identity (none, for rules that count
/// only by the identity chain and list no addresses), with the claims of its verified JWT.
fn request_parts<'a, B>(
    request: &'a Request<B>,
    rules: &Rules,
    claims: Option<&'a Claims>,
) -> RequestParts<'a> {
    let mut parts = RequestParts {
        claims,
        ..RequestParts::default()
    };
    let config = rules.identity_config();
    if rules.reads_address() {
        parts.client_ip = client_ip(
            request.headers(),
            peer_of(request.extensions()),
            &config.trusted_proxies,
        );
    }
    if rules.reads_request() {
        parts.from_trusted_proxy = peer_of(request.extensions())
            .is_some_and(|peer| config.trusted_proxies.iter().any(|net| net.contains(&peer)));
        parts.headers = Some(request.headers());
        parts.user = request
            .extensions()
            .get::<AuthenticatedUser>()
            .map(|user| user.0.as_str());
        parts.query = request.uri().query();
        parts.host = request.uri().host().or_else(|| {
            request
                .headers()
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(|h| {
                    h.rsplit_once(':')
                        .filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit()))
                        .map_or(h, |(host, _)| host)
                })
        });
    }
    parts
}

struct Shared {
    rules: ArcSwap<Rules>,
    clock: Arc<dyn Clock>,
    on_denied: Option<DenialHook>,
    max_identity_bytes: usize,
}

/// A tower `Layer` that rate-limits requests by a policy file; clone it freely.
#[derive(Clone)]
pub struct RateLimitLayer {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("rules", &*self.shared.rules.load())
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
            shared: Arc::new(Shared {
                rules: ArcSwap::from_pointee(Rules::new(config)?),
                clock,
                on_denied: None,
                max_identity_bytes: DEFAULT_MAX_IDENTITY_BYTES,
            }),
        })
    }

    /// Build the layer for a file with `backend = "mesh"` policies, decided by `mesh` (a
    /// running node, e.g. [`crate::net::MeshNet`]), with the system clock.
    pub fn with_mesh(
        config: GatewayConfig,
        mesh: Arc<dyn crate::backend::mesh::GlobalLimits>,
    ) -> Result<Self, RulesError> {
        Ok(RateLimitLayer {
            shared: Arc::new(Shared {
                rules: ArcSwap::from_pointee(Rules::with_mesh(config, mesh)?),
                clock: Arc::new(SystemClock::new()),
                on_denied: None,
                max_identity_bytes: DEFAULT_MAX_IDENTITY_BYTES,
            }),
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
        let shared = Shared {
            rules: ArcSwap::new(self.shared.rules.load_full()),
            clock: Arc::clone(&self.shared.clock),
            on_denied: Some(Arc::new(hook)),
            max_identity_bytes: self.shared.max_identity_bytes,
        };
        RateLimitLayer {
            shared: Arc::new(shared),
        }
    }

    /// Refuse requests whose API key or device id is longer than `max` bytes (default
    /// [`DEFAULT_MAX_IDENTITY_BYTES`]) with 431 and a JSON body. Identities are hashed whole,
    /// never cut, so this cap bounds the work per request.
    ///
    /// Call it while building, before cloning (like [`RateLimitLayer::on_denied`]).
    pub fn max_identity_bytes(self, max: usize) -> Self {
        let shared = Shared {
            rules: ArcSwap::new(self.shared.rules.load_full()),
            clock: Arc::clone(&self.shared.clock),
            on_denied: self.shared.on_denied.clone(),
            max_identity_bytes: max,
        };
        RateLimitLayer {
            shared: Arc::new(shared),
        }
    }

    /// Return the rules in force.
    pub fn rules(&self) -> Arc<Rules> {
        self.shared.rules.load_full()
    }

    /// The rules in force, borrowed for a moment: unlike [`RateLimitLayer::rules`], no count
    /// shared by every thread is written (a thread of its own holds the loan), so threads
    /// deciding at once do not take turns over one cache line. Not to be held across an
    /// `.await`.
    #[cfg(feature = "node")]
    pub(crate) fn rules_now(&self) -> arc_swap::Guard<Arc<Rules>> {
        self.shared.rules.load()
    }

    /// Read the layer's clock (nanoseconds), for decisions made beside the layer (Envoy's
    /// rate limit service API in a node).
    pub fn now_ns(&self) -> crate::clock::Nanos {
        self.shared.clock.now_ns()
    }

    /// Replace the rules with `config`, keeping the counters of unchanged policies.
    pub fn reload(&self, config: GatewayConfig) -> Result<(), RulesError> {
        let current = self.shared.rules.load_full();
        let next = Rules::reloaded(config, &current)?;
        self.shared.rules.store(Arc::new(next));
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

    /// Who sent `request`, by `rules`' identity settings.
    fn identify<B>(
        &self,
        request: &Request<B>,
        rules: &Rules,
    ) -> Result<crate::rules::Identity, IdentityTooLong> {
        identify(
            request.headers(),
            request.extensions(),
            rules.identity_config(),
            self.shared.max_identity_bytes,
        )
    }

    /// Take what a decision needs from `request` (owned, so the decision can wait on Redis
    /// without borrowing the request).
    fn prepare<B>(
        &self,
        request: &Request<B>,
        rules: Arc<Rules>,
    ) -> Result<Prepared, IdentityTooLong> {
        let identity = self.identify(request, &rules)?;
        Ok(Prepared {
            identity,
            tier: request
                .extensions()
                .get::<ClientTier>()
                .map(|t| t.0.clone()),
            method: request.method().clone(),
            path: request.uri().path().to_string(),
            parts: OwnedParts::of(
                &request_parts(request, &rules, None),
                rules.jwt_claims(request.headers()),
            ),
            now: self.shared.clock.now_ns(),
            rules,
        })
    }

    /// Decide without IO, from `request` as it stands.
    fn decide_now<B>(
        &self,
        request: &Request<B>,
        rules: &Rules,
    ) -> Result<Outcome, IdentityTooLong> {
        let identity = self.identify(request, rules)?;
        let claims = rules.jwt_claims(request.headers());
        let facts = RequestFacts {
            identity: &identity,
            tier: request
                .extensions()
                .get::<ClientTier>()
                .map(|t| t.0.as_str()),
            method: request.method(),
            path: request.uri().path(),
            request: request_parts(request, rules, claims.as_ref()),
        };
        let outcome = rules.decide(&facts, self.shared.clock.now_ns());
        record(&outcome, rules, &identity);
        Ok(outcome)
    }

    /// Decide, asking Redis when a `redis` policy applies.
    async fn decide(&self, prepared: Prepared) -> (Outcome, Arc<Rules>) {
        let Prepared {
            rules,
            identity,
            tier,
            method,
            path,
            parts,
            now,
        } = prepared;
        let facts = RequestFacts {
            identity: &identity,
            tier: tier.as_deref(),
            method: &method,
            path: &path,
            request: parts.view(),
        };
        let outcome = if rules.needs_io() {
            rules.decide_exact(&facts, now).await
        } else {
            rules.decide(&facts, now)
        };
        record(&outcome, &rules, &identity);
        (outcome, rules)
    }

    fn denial_response(&self, outcome: &Outcome, rules: &Rules) -> Response<Body> {
        denial(
            outcome,
            self.shared.on_denied.as_ref(),
            rules.config().legacy_headers,
        )
    }
}

/// Count decisions by policy and outcome (never by client), and log shadow denials with a
/// secret-free label of the client.
fn record(outcome: &Outcome, rules: &Rules, identity: &crate::rules::Identity) {
    for report in outcome.enforced.iter().chain(&outcome.shadow) {
        rules.count(report);
    }
    match outcome.refused {
        Some(Refusal::Missing(_)) => {
            metrics::counter!("ratemesh_requests_refused_total", "reason" => "missing_part")
                .increment(1);
        }
        Some(Refusal::Denied) => {
            metrics::counter!("ratemesh_requests_refused_total", "reason" => "access_denied")
                .increment(1);
        }
        None => {}
    }
    if outcome.exempt {
        metrics::counter!("ratemesh_requests_exempt_total").increment(1);
    }
    for skipped in &outcome.skipped {
        metrics::counter!("ratemesh_policy_skipped_total", "policy" => skipped.policy, "part" => skipped.part)
            .increment(1);
    }
    if let Some(denial) = outcome.denied_by() {
        tracing::debug!(client = %rules.client_label(identity), policy = %denial.name, "rate limited");
    }
    for report in outcome.shadow_denials() {
        tracing::info!(client = %rules.client_label(identity), policy = %report.name, "shadow policy would deny");
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
        let inner = std::mem::replace(&mut self.inner, clone);
        self.layer.respond(inner, request)
    }
}

impl<S> RateLimitService<S> {
    /// Call a clone of the inner service, through a shared reference (for an inner service
    /// that is always ready, like the node's own).
    #[cfg(feature = "node")]
    pub(crate) fn call_shared<ReqBody, ResBody>(
        &self,
        request: Request<ReqBody>,
    ) -> Responding<S::Error>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
        ReqBody: Send + 'static,
        ResBody: HttpBody<Data = Bytes> + Send + 'static,
        ResBody::Error: Into<axum::BoxError>,
    {
        self.layer.respond(self.inner.clone(), request)
    }

    /// The same layer around `f` of the inner service.
    #[cfg(feature = "node")]
    pub(crate) fn map_inner(&self, f: impl FnOnce(&S) -> S) -> RateLimitService<S> {
        RateLimitService {
            layer: self.layer.clone(),
            inner: f(&self.inner),
        }
    }
}

/// A boxed response future of a [`RateLimitService`].
type Responding<E> = Pin<Box<dyn Future<Output = Result<Response<Body>, E>> + Send>>;

impl RateLimitLayer {
    /// Decide `request` and hand it to `inner` when admitted.
    fn respond<S, ReqBody, ResBody>(
        &self,
        mut inner: S,
        request: Request<ReqBody>,
    ) -> Responding<S::Error>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
        ReqBody: Send + 'static,
        ResBody: HttpBody<Data = Bytes> + Send + 'static,
        ResBody::Error: Into<axum::BoxError>,
    {
        // Borrowed (no shared count written), and taken whole only by a decision that waits.
        let rules = self.shared.rules.load();
        if !rules.needs_io() {
            // Decided now, from the request as it stands (nothing copied out of it), and
            // handed on at once unless a shaping policy delays it: the future holds no part
            // of the request, so the connection's read buffer is free for the next one.
            let outcome = match self.decide_now(&request, &rules) {
                Ok(outcome) => outcome,
                Err(too_long) => {
                    return Box::pin(std::future::ready(Ok(identity_too_long(&too_long))));
                }
            };
            if !outcome.allowed {
                let response = self.denial_response(&outcome, &rules);
                return Box::pin(std::future::ready(Ok(response)));
            }
            let legacy = rules.config().legacy_headers;
            // Kept across the call only to settle `count_when` charges by the response.
            let settle =
                settle_after(&outcome, &request).then(|| arc_swap::Guard::into_inner(rules));
            if outcome.delay_ns == 0 && settle.is_none() {
                let forwarded = inner.call(request);
                return Box::pin(async move {
                    let response = forwarded.await?;
                    Ok(with_fields(response, &outcome, legacy))
                });
            }
            return Box::pin(async move {
                if outcome.delay_ns > 0 {
                    tokio::time::sleep(Duration::from_nanos(outcome.delay_ns)).await;
                }
                let response = inner.call(request).await?;
                if let Some(rules) = settle {
                    settle_by(&rules, &outcome, response.status());
                }
                Ok(with_fields(response, &outcome, legacy))
            });
        }
        let layer = self.clone();
        let prepared = match layer.prepare(&request, arc_swap::Guard::into_inner(rules)) {
            Ok(prepared) => prepared,
            Err(too_long) => return Box::pin(async move { Ok(identity_too_long(&too_long)) }),
        };
        Box::pin(async move {
            let (outcome, rules) = layer.decide(prepared).await;
            if !outcome.allowed {
                return Ok(layer.denial_response(&outcome, &rules));
            }
            let legacy = rules.config().legacy_headers;
            let settle = settle_after(&outcome, &request).then_some(rules);
            if outcome.delay_ns > 0 {
                tokio::time::sleep(Duration::from_nanos(outcome.delay_ns)).await;
            }
            let response = inner.call(request).await?;
            if let Some(rules) = settle {
                settle_by(&rules, &outcome, response.status());
            }
            Ok(with_fields(response, &outcome, legacy))
        })
    }
}

/// Marks a request whose response is not the protected service's (a forward-auth check):
/// `count_when` charges are then kept, since the outcome is never seen.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OutcomeUnseen;

/// Tell whether `outcome` has `count_when` charges to settle after `request`'s response.
fn settle_after<B>(outcome: &Outcome, request: &Request<B>) -> bool {
    !outcome.pending.is_empty() && request.extensions().get::<OutcomeUnseen>().is_none()
}

/// Keep or give back each `count_when` charge of `outcome` by the response's status.
fn settle_by(rules: &Rules, outcome: &Outcome, status: StatusCode) {
    for pending in &outcome.pending {
        rules.settle(pending, status.as_u16());
    }
}
