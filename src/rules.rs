//! The compiled policy file: which policies a request passes, under which keys, at what cost.
//!
//! [`Rules::decide`] is where an HTTP request is decided: it picks the client's tier and the
//! request's route, checks the enforced policies as one layered decision (a denial by one
//! leaves no charge on the others): the local ones, then the `mesh` policies (cluster-wide
//! limits, [`crate::backend::mesh`]), then the `redis` policies (the exact backend,
//! [`crate::backend::exact`], with [`Rules::decide_exact`]); then it counts the
//! shadow policies, which report but never deny. Both remote kinds enter through a trait and
//! follow the same path: a request is matched once (`rules::plan`), then charged
//! (`rules::decide`). Keys are 64-bit keyed hashes
//! ([`crate::ids::KeyHasher`]) of `(env, identity source, identity, [route])`: no client secret (API key,
//! user id, IP) is ever stored, logged or used as a metric label.

mod compile;
mod decide;
mod direct;
mod envoy;
mod graphql;
#[cfg(feature = "node")]
pub(crate) mod identities;
mod jwt;
mod key;
#[cfg(feature = "node")]
mod keys;
mod lockout;
mod overrides;
mod plan;
mod request;
pub(crate) mod top;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::backend::exact::ExactLimits;
use crate::backend::mesh::GlobalLimits;
#[cfg(feature = "redis")]
use crate::backend::redis::BackendError;
#[cfg(feature = "redis")]
use crate::backend::redis_limits::RedisLimits;
use crate::config::{GatewayConfig, IdentityConfig, IdentitySource};
use crate::ids::{KeyHasher, KeyPrefix};
use crate::limiter::MAX_POLICIES;
use compile::{CompiledPolicy, CompiledRoute, Counted, Layers, compile};
pub use decide::NO_TIER_POLICY;
pub use direct::{Attributes, DirectError, MAX_ATTRIBUTE_BYTES, MAX_ATTRIBUTES};
use envoy::EnvoyDomains;
pub use envoy::{
    CurrentLimit, DescriptorMatch, DescriptorQuery, DescriptorStatus, EnvoyError, EnvoyOutcome,
    MAX_DESCRIPTORS_PER_REQUEST,
};
use jwt::JwtVerifier;
pub use jwt::{Claims, Rejection};
use key::KeyModel;
pub(crate) use key::address_text;
#[cfg(feature = "node")]
pub(crate) use keys::{Backend, KeyAddress};
#[cfg(feature = "node")]
pub(crate) use overrides::OverrideError;
#[cfg(feature = "otel")]
pub(crate) use plan::PlanSummary;
pub(crate) use plan::Planned;
#[cfg(all(test, feature = "node"))]
pub(crate) use plan::plans_made;
pub use request::{
    GraphQlRefusal, Identity, MissingPart, Outcome, Pending, PolicyReport, Refusal, RequestFacts,
    RequestParts,
};

/// Why the rules could not be built from a valid file.
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    /// The Redis backend could not be set up.
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    #[error("redis backend: {0}")]
    Backend(#[from] BackendError),
    /// `[jwt]`'s key file could not be read or holds no usable key.
    #[error("[jwt] keys: {0}")]
    JwtKeys(String),
    /// The file has a `[redis]` section but ratemesh was built without its `redis` feature.
    #[error("the file has a `[redis]` section: build ratemesh with its `redis` feature")]
    RedisFeatureOff,
    /// The file has `backend = "mesh"` policies but no mesh node was given.
    #[error(
        "policy `{policy}` uses backend `mesh`: run it in a mesh node (`ratemesh node`) or build the rules with a mesh (`Rules::with_mesh`)"
    )]
    NoMesh {
        /// The first mesh policy.
        policy: String,
    },
    /// A reload changed mesh policies in a way a running node cannot (an algorithm, a
    /// window's length).
    #[error("the `mesh` policies cannot change this way while the nodes run: {reason}")]
    MeshReconfigure {
        /// Why, from the mesh node.
        reason: String,
    },
    /// A reload added, removed or renamed mesh policies, which a running node cannot do.
    #[error(
        "the `mesh` policies changed ({before} → {after}): they are numbered by name on every node, so adding, removing or renaming one needs every node stopped, then started with the new file (their limits and rates change live)"
    )]
    MeshPoliciesChanged {
        /// The mesh policies before, by name.
        before: String,
        /// The mesh policies in the new file.
        after: String,
    },
    /// A tier and a route together apply more policies than one decision can layer.
    #[error("tier `{tier}` with route `{route}` applies {count} policies; at most {MAX_POLICIES}")]
    TooManyPolicies {
        /// The tier.
        tier: String,
        /// The route.
        route: String,
        /// How many policies.
        count: usize,
    },
}

/// A policy file compiled for deciding requests; cheap to share behind an `Arc`.
///
/// What [`RateLimitLayer`](crate::http::RateLimitLayer) decides with, for gateways that are
/// not tower services: identify the client, then decide.
///
/// ```
/// use http::Method;
/// use ratemesh::config::{GatewayConfig, IdentitySource};
/// use ratemesh::rules::{Identity, RequestFacts, Rules};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let config = GatewayConfig::from_toml_str(
///     r#"
///     default_tier = "free"
///     [policies.per_minute]
///     algorithm = "fixed-window"
///     limit = 2
///     window = "1m"
///     [tiers.free]
///     policies = ["per_minute"]
///     "#,
///     "policies.toml",
/// )?;
/// let rules = Rules::new(config)?;
/// let client = Identity::new(IdentitySource::ApiKey, "k-123");
/// let facts = RequestFacts {
///     identity: &client,
///     tier: None,
///     method: &Method::GET,
///     path: "/orders",
///     request: Default::default(), // what policies that count `by` read
/// };
/// let now = 0; // nanoseconds on the rules' clock (`RateLimitLayer` reads its own)
/// assert!(rules.decide(&facts, now).allowed);
/// assert!(rules.decide(&facts, now).allowed);
/// let denied = rules.decide(&facts, now);
/// assert!(!denied.allowed);
/// let by = denied.denied_by().unwrap();
/// assert_eq!(by.name, "per_minute");
/// assert!(by.decision.retry_after_ns > 0); // for `Retry-After`
/// # Ok(()) }
/// ```
pub struct Rules {
    config: GatewayConfig,
    mesh: Option<Arc<dyn GlobalLimits>>,
    exact: Option<Arc<dyn ExactLimits>>,
    /// `exact` was given by the caller rather than made from the file's `[redis]` section.
    exact_given: bool,
    hasher: KeyHasher,
    /// The environment and each identity source hashed, for a client's key to finish with
    /// the identity ([`client_keys_slot`]).
    client_keys: [KeyPrefix; 4],
    policies: Vec<CompiledPolicy>,
    /// Per policy, what it counts `by` (`None`: the identity chain's key).
    models: Vec<Option<KeyModel>>,
    /// Some policy counts by a part of the request beyond the identity.
    reads_request: bool,
    /// Some policy counts by the client's address, or `[access]` lists addresses.
    reads_address: bool,
    /// Some policy counts by a field of the request's body (`json:`, `form:`); of JSON.
    reads_body: bool,
    reads_json: bool,
    /// `[jwt]`, when some policy counts by a claim.
    jwt: Option<JwtVerifier>,
    tiers: BTreeMap<String, Layers>,
    routes: Vec<CompiledRoute>,
    tenants: HashMap<String, String>,
    /// `tenants` entries of API keys: the digest of their `api_key:` label → tier.
    api_key_tenants: HashMap<u64, String>,
    /// The `[envoy]` descriptors, for Envoy's rate limit service API.
    envoy: EnvoyDomains,
    /// Some policy is decided by the exact backend (`backend = "redis"` with a backend).
    exact_policies: bool,
    /// Some policy is decided by the mesh (`backend = "mesh"` with a mesh).
    mesh_policies: bool,
}

/// The identity sources, in the order of [`Rules`]' client key prefixes.
const CLIENT_KEY_SOURCES: [IdentitySource; 4] = [
    IdentitySource::User,
    IdentitySource::ApiKey,
    IdentitySource::Device,
    IdentitySource::Ip,
];

/// Where the key prefix of `source` is among [`CLIENT_KEY_SOURCES`].
fn client_keys_slot(source: IdentitySource) -> usize {
    match source {
        IdentitySource::User => 0,
        IdentitySource::ApiKey => 1,
        IdentitySource::Device => 2,
        IdentitySource::Ip => 3,
    }
}

impl std::fmt::Debug for Rules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rules")
            .field(
                "policies",
                &self
                    .policies
                    .iter()
                    .map(|p| &p.named.name)
                    .collect::<Vec<_>>(),
            )
            .field("tiers", &self.tiers.keys().collect::<Vec<_>>())
            .field(
                "routes",
                &self.routes.iter().map(|r| &r.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Rules {
    /// Compile a validated file with fresh counters; its `redis` policies are decided by the
    /// deployment its `[redis]` section names. A file with `backend = "mesh"` policies needs
    /// [`Rules::with_mesh`].
    pub fn new(config: GatewayConfig) -> Result<Self, RulesError> {
        Self::build(config, None, None, None)
    }

    /// Compile a validated file as a node's start does, without starting what decides its
    /// remote policies: a `[redis]` deployment is not contacted (it connects on first use),
    /// and `mesh` policies compile as they do in a node. Whatever the start would refuse in
    /// the file (its JWT keys, a `[redis]` section without the `redis` feature) is refused.
    /// Needs a Tokio runtime when the file has a `[redis]` section.
    pub fn check(config: GatewayConfig) -> Result<(), RulesError> {
        Self::build(config, None, Some(Arc::new(NotStarted)), None).map(drop)
    }

    /// Compile a validated file whose `backend = "mesh"` policies are decided by `mesh` (a
    /// node built with [`GatewayConfig::mesh_policies`], in that order).
    pub fn with_mesh(
        config: GatewayConfig,
        mesh: Arc<dyn GlobalLimits>,
    ) -> Result<Self, RulesError> {
        Self::build(config, None, Some(mesh), None)
    }

    /// Compile a validated file whose remote policies are decided by the backends given:
    /// `mesh` for `backend = "mesh"`, and `exact` for `backend = "redis"` (numbered as in
    /// [`GatewayConfig::redis_policies`]) instead of the deployment that the file's `[redis]`
    /// section names. A reload keeps both.
    pub fn with_backends(
        config: GatewayConfig,
        mesh: Option<Arc<dyn GlobalLimits>>,
        exact: Option<Arc<dyn ExactLimits>>,
    ) -> Result<Self, RulesError> {
        Self::build(config, None, mesh, exact.map(|e| (e, true)))
    }

    /// Compile a new file, keeping the counters of every policy whose name and parameters
    /// are unchanged from `previous`, its mesh node (whose policies must not change), and
    /// its Redis backend (connection and token caches) when the `[redis]` section and the
    /// `redis` policies are unchanged.
    pub fn reloaded(config: GatewayConfig, previous: &Rules) -> Result<Self, RulesError> {
        let names = |c: &GatewayConfig| {
            c.mesh_policies()
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let named = |c: &GatewayConfig| {
            c.mesh_policies()
                .iter()
                .map(|p| p.name.clone())
                .collect::<Vec<_>>()
        };
        if named(&config) != named(&previous.config) {
            return Err(RulesError::MeshPoliciesChanged {
                before: names(&previous.config),
                after: names(&config),
            });
        }
        // A mesh policy's lockout is the cluster's, started and kept by the keys' owners:
        // every node must keep the same one.
        for (new, old) in config
            .mesh_policies()
            .iter()
            .zip(previous.config.mesh_policies())
        {
            if new.calendar != old.calendar {
                return Err(RulesError::MeshReconfigure {
                    reason: format!(
                        "policy `{}`: its `calendar` and `time_zone` cannot change while the nodes run (the windows would not carry over): stop every node, then start them all with the new file",
                        new.name
                    ),
                });
            }
            if new.block_for != old.block_for {
                return Err(RulesError::MeshReconfigure {
                    reason: format!(
                        "policy `{}`: its `block_for` cannot change while the nodes run: stop every node, then start them all with the new file",
                        new.name
                    ),
                });
            }
        }
        // Limits, rates and bursts of mesh policies change live: the mesh node takes them
        // (and the new digest) once the rest of the file compiled.
        let digest = config.mesh_digest();
        let changed = digest != previous.config.mesh_digest();
        let policies: Vec<crate::policy::Policy> =
            config.mesh_policies().iter().map(|p| p.policy).collect();
        let redis_of = |c: &GatewayConfig| {
            let policies = c.redis_policies();
            let policies: Vec<_> = policies
                .iter()
                .map(|p| (p.name.clone(), p.policy, p.token_cache))
                .collect();
            (c.redis.clone(), c.env.clone(), policies)
        };
        let exact = previous
            .exact
            .as_ref()
            .filter(|_| previous.exact_given || redis_of(&config) == redis_of(&previous.config))
            .map(|exact| (Arc::clone(exact), previous.exact_given));
        let rules = Self::build(config, Some(previous), previous.mesh.clone(), exact)?;
        if changed && let Some(mesh) = &rules.mesh {
            mesh.reconfigure(&policies, digest)
                .map_err(|reason| RulesError::MeshReconfigure { reason })?;
        }
        Ok(rules)
    }

    fn build(
        config: GatewayConfig,
        previous: Option<&Rules>,
        mesh: Option<Arc<dyn GlobalLimits>>,
        exact: Option<(Arc<dyn ExactLimits>, bool)>,
    ) -> Result<Self, RulesError> {
        if mesh.is_none()
            && let Some(first) = config.mesh_policies().first()
        {
            return Err(RulesError::NoMesh {
                policy: first.name.clone(),
            });
        }
        let (exact, exact_given) = match exact {
            Some((exact, given)) => (Some(exact), given),
            None => (exact_from_file(&config)?, false),
        };
        let hasher = match &config.key_secret {
            Some(secret) => KeyHasher::from_secret(secret),
            None => previous.map_or_else(KeyHasher::random, |p| p.hasher.clone()),
        };
        let compiled = compile(
            &config,
            previous.map(|p| &p.policies[..]),
            mesh.is_some(),
            exact.is_some(),
        )?;
        let envoy = EnvoyDomains::compile(&config.envoy, &compiled.policies);
        let tenants = config
            .tenants
            .iter()
            .filter(|(k, _)| !k.starts_with("api_key:"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let api_key_tenants = config
            .tenants
            .iter()
            .filter_map(|(k, v)| {
                let hex = k.strip_prefix("api_key:")?;
                Some((u64::from_str_radix(hex, 16).ok()?, v.clone()))
            })
            .collect();
        let client_keys = CLIENT_KEY_SOURCES
            .map(|source| hasher.key_prefix(&[config.env.as_bytes(), source.name().as_bytes()]));
        let models: Vec<Option<KeyModel>> = compiled
            .policies
            .iter()
            .map(|p| {
                p.named
                    .by
                    .as_ref()
                    .map(|by| KeyModel::new(&hasher, &config.env, by, p.named.on_missing))
            })
            .collect();
        let reads_request = models.iter().any(Option::is_some);
        let reads_address =
            !config.access.is_empty() || models.iter().flatten().any(KeyModel::uses_address);
        // A route that prices GraphQL queries reads its JSON body (or its URL) too.
        let graphql = compiled.routes.iter().any(|r| r.prices_graphql());
        let reads_body = graphql || models.iter().flatten().any(KeyModel::uses_body);
        let reads_json = graphql || models.iter().flatten().any(KeyModel::uses_json);
        let tier_from_claims = config
            .tier_from
            .iter()
            .any(|t| matches!(t, crate::config::TierSource::Jwt(_)));
        let tier_from_headers = config
            .tier_from
            .iter()
            .any(|t| matches!(t, crate::config::TierSource::Header(_)));
        let reads_request =
            reads_request || tier_from_headers || compiled.routes.iter().any(|r| r.reads_request());
        let reads_claims = tier_from_claims
            || !config.access.exempt_subjects.is_empty()
            || models.iter().flatten().any(KeyModel::uses_claims);
        let jwt = match (&config.jwt, reads_claims) {
            (Some(jwt), true) => Some(JwtVerifier::new(jwt).map_err(RulesError::JwtKeys)?),
            _ => None,
        };
        let exact_policies = exact.is_some() && !config.redis_policies().is_empty();
        let mesh_policies = mesh.is_some() && !config.mesh_policies().is_empty();
        Ok(Rules {
            exact_policies,
            mesh_policies,
            config,
            mesh,
            exact,
            exact_given,
            hasher,
            client_keys,
            policies: compiled.policies,
            models,
            reads_request,
            reads_address,
            reads_body,
            reads_json,
            jwt,
            tiers: compiled.tiers,
            routes: compiled.routes,
            tenants,
            api_key_tenants,
            envoy,
        })
    }

    /// Return the file these rules were compiled from.
    pub fn config(&self) -> &GatewayConfig {
        &self.config
    }

    /// Return how clients are identified.
    pub fn identity_config(&self) -> &IdentityConfig {
        &self.config.identity
    }

    /// Return the hasher of identities.
    pub fn hasher(&self) -> &KeyHasher {
        &self.hasher
    }

    /// Count `report`'s decision in `ratemesh_decisions_total` (by policy and outcome).
    pub(crate) fn count(&self, report: &PolicyReport) {
        let counted = match (report.decision.is_allowed(), report.shadow) {
            (true, _) => Counted::Allowed,
            (false, false) => Counted::Denied,
            (false, true) => Counted::ShadowDenied,
        };
        let cached = self
            .policies
            .get(report.index as usize)
            .filter(|p| std::ptr::eq(p.name, report.name))
            .map(|p| &p.counters);
        compile::count(cached, report.name, counted);
    }

    /// Return a short, secret-free label of `identity` for logs: `api_key:9f2c41d07ab3e6f1`.
    pub fn client_label(&self, identity: &Identity) -> String {
        self.hasher
            .label(identity.source.name(), identity.value.as_bytes())
    }

    /// Tell whether the store of policy `name` is the same object as in `other` (its
    /// counters survived a reload).
    pub fn shares_counters_with(&self, other: &Rules, name: &str) -> bool {
        let find = |rules: &Rules| {
            rules
                .policies
                .iter()
                .find(|p| p.named.name == name)
                .map(|p| Arc::as_ptr(&p.store))
        };
        matches!((find(self), find(other)), (Some(a), Some(b)) if a == b)
    }

    /// Tell whether some request may have to wait for IO: a `redis` policy, or a `mesh`
    /// policy whose key's owner the node may have to ask. Such rules are decided with
    /// [`Rules::decide_exact`]; others with [`Rules::decide`], which gives the same answer.
    /// (The tower layer asks this of each request: one whose policies are all local is
    /// decided at once even when other routes have remote ones.)
    pub fn needs_io(&self) -> bool {
        self.exact_policies || self.mesh_policies
    }

    /// Tell whether a decision reads the request's parts beyond its identity (some policy
    /// counts `by` them): the caller then fills [`RequestFacts::request`].
    pub fn reads_request(&self) -> bool {
        self.reads_request
    }

    /// Tell whether a decision may read the request's body (some policy counts by a field
    /// of it, `json:` or `form:`): the caller then fills [`RequestParts::body`] for requests
    /// whose plan asks for it (the tower layer and the node read it, up to the route's
    /// `max_body_bytes`, only then).
    pub fn reads_body(&self) -> bool {
        self.reads_body
    }

    /// Tell whether some policy counts by a field of a JSON body (the layer parses a body it
    /// read once, for all of them).
    pub(crate) fn reads_json(&self) -> bool {
        self.reads_json
    }

    /// Tell whether a decision needs the client's address beyond the identity chain (a
    /// policy that counts by it, or `[access]`): the caller then fills
    /// [`RequestParts::client_ip`].
    pub fn reads_address(&self) -> bool {
        self.reads_address
    }

    /// The claims of the verified JWT in `headers`, when some policy counts by one: `None`
    /// without a token or when it fails verification (counted in
    /// `ratemesh_identity_rejected_total{reason}`).
    pub fn jwt_claims(&self, headers: &http::HeaderMap) -> Option<Claims> {
        match self.jwt.as_ref()?.verify(headers)? {
            Ok(claims) => Some(claims),
            Err(rejection) => {
                metrics::counter!("ratemesh_identity_rejected_total", "reason" => rejection.label())
                    .increment(1);
                None
            }
        }
    }

    /// Read `[jwt]`'s key file again if it changed on disk (a JWKS rotated by the identity
    /// provider); return whether the keys changed. A file that no longer loads keeps the
    /// keys in force and says why.
    pub fn refresh_keys(&self) -> Result<bool, String> {
        self.jwt.as_ref().map_or(Ok(false), JwtVerifier::refresh)
    }

    /// Tell whether any policy is decided by the exact backend (`backend = "redis"`).
    pub fn has_exact_policies(&self) -> bool {
        self.exact_policies
    }
}

/// The exact backend that the file's `[redis]` section names, if any.
/// The mesh of a node that has not started, which a file is checked against: it decides
/// nothing (the node's share would answer).
struct NotStarted;

impl GlobalLimits for NotStarted {
    fn decide(&self, _policy: u32, _key: u64, _cost: u64) -> crate::backend::mesh::MeshDecision {
        crate::backend::mesh::MeshDecision::Ready(None)
    }
}

fn exact_from_file(config: &GatewayConfig) -> Result<Option<Arc<dyn ExactLimits>>, RulesError> {
    #[cfg(feature = "redis")]
    {
        let redis = RedisLimits::from_config(config)?;
        Ok(redis.map(|redis| Arc::new(redis) as Arc<dyn ExactLimits>))
    }
    #[cfg(not(feature = "redis"))]
    match config.redis {
        Some(_) => Err(RulesError::RedisFeatureOff),
        None => Ok(None),
    }
}
