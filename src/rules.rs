//! The compiled policy file: which policies a request passes, under which keys, at what cost.
//!
//! [`Rules::decide`] is where an HTTP request is decided: it picks the client's tier and the
//! request's route, checks the enforced policies as one layered decision (a denial by one
//! leaves no charge on the others): the local ones, then at most one `mesh` policy (the
//! cluster-wide limit, [`crate::backend::mesh`]), then at most one `redis` policy
//! ([`Rules::decide_exact`]); then it counts the shadow policies, which report but never
//! deny. Keys are 64-bit keyed hashes of `(env, identity source, identity, [route])`: no
//! client secret (API key, user id, IP) is ever stored, logged or used as a metric label.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;

use http::Method;
use jiff::Timestamp;
use siphasher::sip::SipHasher13;
use siphasher::sip128::SipHasher13 as SipHasher13x128;

use crate::backend::mesh::{GlobalLimits, MeshDecision};
#[cfg(feature = "redis")]
use crate::backend::redis::{
    BackendError, RedisConnection, RedisLimiter, record_failover, redis_key,
};
#[cfg(feature = "redis")]
use crate::backend::token_cache::TokenCache;
use crate::clock::Nanos;
#[cfg(feature = "redis")]
use crate::config::FailMode;
use crate::config::{GatewayConfig, IdentityConfig, IdentitySource, NamedPolicy};
use crate::decision::{Decision, Verdict};
use crate::limiter::{MAX_POLICIES, decide_in_layers};
use crate::local::{Charge, DEFAULT_MAX_KEYS, Store};

/// The name reported (headers, JSON body, metrics) for a client refused because it matches
/// no tier and the file says `no_tier = "refuse"`.
pub const NO_TIER_POLICY: &str = "no_tier";

/// Why the rules could not be built from a valid file.
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    /// The Redis backend could not be set up.
    #[cfg(feature = "redis")]
    #[error("redis backend: {0}")]
    Backend(#[from] BackendError),
    /// The file has a `[redis]` section but ratemesh was built without its `redis` feature.
    #[error("the file has a `[redis]` section: build ratemesh with its `redis` feature")]
    RedisFeatureOff,
    /// A tier and a route together apply two `redis` (or two `mesh`) policies; a request
    /// passes at most one of each.
    #[error(
        "tier `{tier}` with route `{route}` applies two `{backend}` policies; at most one per request"
    )]
    TwoRemotePolicies {
        /// `redis` or `mesh`.
        backend: &'static str,
        /// The tier.
        tier: String,
        /// The route (empty: the tier alone).
        route: String,
    },
    /// The file has `backend = "mesh"` policies but no mesh node was given.
    #[error(
        "policy `{policy}` uses backend `mesh`: run it in a mesh node (`ratemesh node`) or build the rules with a mesh (`Rules::with_mesh`)"
    )]
    NoMesh {
        /// The first mesh policy.
        policy: String,
    },
    /// A reload changed the mesh policies, which a running node cannot change.
    #[error(
        "the `mesh` policies changed ({before} → {after}); they are fixed for the life of a node and numbered by name on every node: stop every node, then start them all with the new file"
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

/// Hash identities with a secret key (SipHash-1-3), so keys and labels reveal nothing.
#[derive(Clone)]
pub struct KeyHasher {
    key: [u8; 16],
}

impl std::fmt::Debug for KeyHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyHasher(<secret>)")
    }
}

impl KeyHasher {
    /// Derive the key from a configured secret (the same secret gives the same keys on
    /// every node and across restarts).
    pub fn from_secret(secret: &str) -> Self {
        let hash = SipHasher13x128::new_with_keys(0x7261_7465_6d65_7368, 0x6b65_7973_6563_7274)
            .hash(secret.as_bytes());
        KeyHasher {
            key: hash.as_bytes(),
        }
    }

    /// Make a random key for this process (keys then differ between processes).
    pub fn random() -> Self {
        let mut key = [0u8; 16];
        for half in key.chunks_mut(8) {
            let random = std::collections::hash_map::RandomState::new().hash_one(0u8);
            half.copy_from_slice(&random.to_le_bytes());
        }
        KeyHasher { key }
    }

    fn hash(&self, domain: u8, parts: &[&[u8]]) -> u64 {
        let mut hasher = SipHasher13::new_with_key(&self.key);
        hasher.write_u8(domain);
        for part in parts {
            hasher.write_usize(part.len());
            hasher.write(part);
        }
        hasher.finish()
    }

    /// Return a short, secret-free label for logs: `api_key:9f2c41d07ab3e6f1`.
    pub fn label(&self, identity: &Identity) -> String {
        let digest = self.hash(
            1,
            &[identity.source.name().as_bytes(), identity.value.as_bytes()],
        );
        format!("{}:{digest:016x}", identity.source.name())
    }
}

/// Who is asking: the source that identified the client and its raw value.
///
/// The value may be a secret (an API key): it is only ever hashed, and `Debug` hides it.
#[derive(Clone, PartialEq, Eq)]
pub struct Identity {
    /// Which part of the request identified the client.
    pub source: IdentitySource,
    value: String,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Identity({}:<{} bytes>)",
            self.source.name(),
            self.value.len()
        )
    }
}

impl Identity {
    /// Identify a client by `value` taken from `source`.
    pub fn new(source: IdentitySource, value: impl Into<String>) -> Self {
        Identity {
            source,
            value: value.into(),
        }
    }

    /// The name `tenants` uses for this client: `user:alice`, `ip:192.0.2.7`, `device:…`.
    /// API keys are never named in a config file, so they have none.
    fn tenant_name(&self) -> Option<String> {
        (self.source != IdentitySource::ApiKey)
            .then(|| format!("{}:{}", self.source.name(), self.value))
    }
}

/// What the rules need to know about a request.
#[derive(Debug, Clone, Copy)]
pub struct RequestFacts<'a> {
    /// The client.
    pub identity: &'a Identity,
    /// A tier chosen by an earlier layer (e.g. from the client's plan), else looked up.
    pub tier: Option<&'a str>,
    /// The request method.
    pub method: &'a Method,
    /// The request path (no query).
    pub path: &'a str,
}

/// One policy's part in a decision, for the response headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyReport {
    /// The policy's name.
    pub name: Arc<str>,
    /// The name serialized as a structured-field string (with its quotes).
    pub sf_name: Arc<str>,
    /// Its decision.
    pub decision: Decision,
    /// Its window in whole seconds (a bucket's time to refill from empty), for `w=`.
    pub window_s: u64,
    /// Counted but never denying.
    pub shadow: bool,
}

/// The outcome of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Forward the request (shadow denials do not stop it).
    pub allowed: bool,
    /// The request's cost in tokens.
    pub cost: u64,
    /// The matched route, if any.
    pub route: Option<Arc<str>>,
    /// The enforced policies that were checked, in order; on a denial, the last is the one
    /// that denied.
    pub enforced: Vec<PolicyReport>,
    /// The shadow policies (counted after an admission).
    pub shadow: Vec<PolicyReport>,
    /// When admitted by a shaping policy: nanoseconds to wait before forwarding.
    pub delay_ns: Nanos,
    /// A `redis` policy that fails closed could not reach Redis: the request is refused
    /// because the backend failed, not the client (answer 503, not 429).
    pub backend_unavailable: Option<Arc<str>>,
}

impl Outcome {
    /// Return the enforced policy that denied the request.
    pub fn denied_by(&self) -> Option<&PolicyReport> {
        self.enforced
            .last()
            .filter(|report| !report.decision.is_allowed())
    }

    /// Return the shadow policies that would have denied the request.
    pub fn shadow_denials(&self) -> impl Iterator<Item = &PolicyReport> {
        self.shadow
            .iter()
            .filter(|report| !report.decision.is_allowed())
    }
}

struct CompiledPolicy {
    named: NamedPolicy,
    name: Arc<str>,
    sf_name: Arc<str>,
    /// This node's counters: the policy itself when local, the fail-open fallback when exact.
    store: Arc<Store<u64>>,
    /// The exact backend of a `backend = "redis"` policy.
    #[cfg(feature = "redis")]
    redis: Option<RedisLimiter>,
    /// The local cache of tokens granted by `redis`, when the policy asks for one.
    #[cfg(feature = "redis")]
    token_cache: Option<Arc<TokenCache>>,
    /// The mesh policy number of a `backend = "mesh"` policy.
    mesh: Option<u32>,
}

impl CompiledPolicy {
    /// Whether Redis decides this policy (`backend = "redis"`).
    fn is_exact(&self) -> bool {
        #[cfg(feature = "redis")]
        return self.redis.is_some();
        #[cfg(not(feature = "redis"))]
        false
    }

    /// `now` on this policy's time axis: shifted by the zone's UTC offset, so that a fixed
    /// window of a day starts at local midnight.
    fn local_now(&self, now: Nanos) -> Nanos {
        match &self.named.time_zone {
            None => now,
            Some(zone) => {
                let at =
                    Timestamp::from_nanosecond(i128::from(now)).unwrap_or(Timestamp::UNIX_EPOCH);
                let offset_ns = i64::from(zone.to_offset(at).seconds()) * 1_000_000_000;
                now.saturating_add_signed(offset_ns)
            }
        }
    }

    fn report(&self, decision: Decision) -> PolicyReport {
        PolicyReport {
            name: Arc::clone(&self.name),
            sf_name: Arc::clone(&self.sf_name),
            decision,
            window_s: self.named.policy.window_ns().div_ceil(1_000_000_000),
            shadow: self.named.shadow,
        }
    }
}

struct CompiledRoute {
    name: Arc<str>,
    method: Option<Method>,
    path_prefix: String,
    cost: u64,
    enforced: Vec<usize>,
    shadow: Vec<usize>,
    exact: Vec<usize>,
    global: Vec<usize>,
}

impl CompiledRoute {
    fn matches(&self, method: &Method, path: &str) -> bool {
        if self.method.as_ref().is_some_and(|m| m != method) {
            return false;
        }
        match path.strip_prefix(self.path_prefix.as_str()) {
            Some(rest) => rest.is_empty() || rest.starts_with('/') || self.path_prefix.is_empty(),
            None => false,
        }
    }
}

#[derive(Default)]
struct CompiledTier {
    enforced: Vec<usize>,
    shadow: Vec<usize>,
    /// `redis` policies (at most one per request, decided last).
    exact: Vec<usize>,
    /// `mesh` policies (at most one per request, decided after the local ones).
    global: Vec<usize>,
}

/// A policy file compiled for deciding requests; cheap to share behind an `Arc`.
pub struct Rules {
    config: GatewayConfig,
    #[cfg(feature = "redis")]
    redis_connection: Option<RedisConnection>,
    mesh: Option<Arc<dyn GlobalLimits>>,
    hasher: KeyHasher,
    policies: Vec<CompiledPolicy>,
    tiers: BTreeMap<String, CompiledTier>,
    routes: Vec<CompiledRoute>,
    tenants: HashMap<String, String>,
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
    /// Compile a validated file with fresh counters. A file with `backend = "mesh"`
    /// policies needs [`Rules::with_mesh`].
    pub fn new(config: GatewayConfig) -> Result<Self, RulesError> {
        Self::build(config, None, None)
    }

    /// Compile a validated file whose `backend = "mesh"` policies are decided by `mesh` (a
    /// node built with [`GatewayConfig::mesh_policies`], in that order).
    pub fn with_mesh(
        config: GatewayConfig,
        mesh: Arc<dyn GlobalLimits>,
    ) -> Result<Self, RulesError> {
        Self::build(config, None, Some(mesh))
    }

    /// Compile a new file, keeping the counters of every policy whose name and parameters
    /// are unchanged from `previous` (and its mesh node, whose policies must not change).
    pub fn reloaded(config: GatewayConfig, previous: &Rules) -> Result<Self, RulesError> {
        let names = |c: &GatewayConfig| {
            c.mesh_policies()
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let same = |c: &GatewayConfig| {
            c.mesh_policies()
                .iter()
                .map(|p| (p.name.clone(), p.policy))
                .collect::<Vec<_>>()
        };
        if same(&config) != same(&previous.config) {
            return Err(RulesError::MeshPoliciesChanged {
                before: names(&previous.config),
                after: names(&config),
            });
        }
        Self::build(config, Some(previous), previous.mesh.clone())
    }

    fn build(
        config: GatewayConfig,
        previous: Option<&Rules>,
        mesh: Option<Arc<dyn GlobalLimits>>,
    ) -> Result<Self, RulesError> {
        if mesh.is_none()
            && let Some(first) = config.mesh_policies().first()
        {
            return Err(RulesError::NoMesh {
                policy: first.name.clone(),
            });
        }
        let mesh_number = |name: &str| {
            config
                .mesh_policies()
                .iter()
                .position(|p| p.name == name)
                .map(|i| i as u32)
        };
        #[cfg(feature = "redis")]
        let redis_connection = match (&config.redis, previous) {
            (None, _) => None,
            (Some(redis), Some(old)) if old.config.redis.as_ref() == Some(redis) => {
                old.redis_connection.clone()
            }
            (Some(redis), _) => Some(RedisConnection::from_config(redis)?),
        };
        #[cfg(not(feature = "redis"))]
        if config.redis.is_some() {
            return Err(RulesError::RedisFeatureOff);
        }
        let hasher = match &config.key_secret {
            Some(secret) => KeyHasher::from_secret(secret),
            None => previous.map_or_else(KeyHasher::random, |p| p.hasher.clone()),
        };
        let policies: Vec<CompiledPolicy> = config
            .policies
            .iter()
            .map(|named| -> Result<CompiledPolicy, RulesError> {
                let old = previous.and_then(|p| p.policies.iter().find(|old| old.named == *named));
                let kept = old.map(|old| Arc::clone(&old.store));
                #[cfg(feature = "redis")]
                let redis = match (named.backend, &redis_connection) {
                    (crate::config::Backend::Redis, Some(connection)) => {
                        Some(RedisLimiter::new(connection.clone(), named.policy)?)
                    }
                    _ => None,
                };
                // Tokens already granted stay usable across a reload that keeps the policy and
                // the Redis deployment.
                #[cfg(feature = "redis")]
                let same_redis = previous.is_some_and(|p| p.config.redis == config.redis);
                #[cfg(feature = "redis")]
                let token_cache = match (&redis, named.token_cache) {
                    (Some(redis), Some(cache)) => Some(
                        match old
                            .and_then(|o| o.token_cache.as_ref())
                            .filter(|_| same_redis)
                        {
                            Some(kept) => Arc::clone(kept),
                            None => {
                                Arc::new(TokenCache::new(redis.clone(), cache.batch, cache.ttl)?)
                            }
                        },
                    ),
                    _ => None,
                };
                Ok(CompiledPolicy {
                    named: named.clone(),
                    name: Arc::from(named.name.as_str()),
                    sf_name: Arc::from(crate::http::sf::sf_string(&named.name)),
                    store: kept
                        .unwrap_or_else(|| Arc::new(Store::new(named.policy, DEFAULT_MAX_KEYS))),
                    #[cfg(feature = "redis")]
                    redis,
                    #[cfg(feature = "redis")]
                    token_cache,
                    mesh: mesh_number(&named.name),
                })
            })
            .collect::<Result<_, _>>()?;
        let index = |name: &String| policies.iter().position(|p| &p.named.name == name);
        let split = |names: &[String]| {
            let mut enforced = Vec::new();
            let mut shadow = Vec::new();
            let mut exact = Vec::new();
            let mut global = Vec::new();
            for i in names.iter().filter_map(index) {
                if policies[i].named.shadow {
                    shadow.push(i);
                } else if policies[i].is_exact() {
                    exact.push(i);
                } else if policies[i].mesh.is_some() {
                    global.push(i);
                } else {
                    enforced.push(i);
                }
            }
            // A shaping policy reserves a slot: check it last so it never needs a refund.
            enforced.sort_by_key(|&i| {
                matches!(
                    policies[i].named.policy.algorithm(),
                    crate::Algorithm::LeakyBucketShape { .. }
                )
            });
            (enforced, shadow, exact, global)
        };
        let tiers: BTreeMap<String, CompiledTier> = config
            .tiers
            .iter()
            .map(|(name, names)| {
                let (enforced, shadow, exact, global) = split(names);
                (
                    name.clone(),
                    CompiledTier {
                        enforced,
                        shadow,
                        exact,
                        global,
                    },
                )
            })
            .collect();
        let routes: Vec<CompiledRoute> = config
            .routes
            .iter()
            .map(|route| {
                let (enforced, shadow, exact, global) = split(&route.policies);
                CompiledRoute {
                    name: Arc::from(route.name.as_str()),
                    method: route.method.clone(),
                    path_prefix: route.path_prefix.clone(),
                    cost: route.cost,
                    enforced,
                    shadow,
                    exact,
                    global,
                }
            })
            .collect();
        // Every tier with every route, and each route alone (a client with no tier).
        let no_tier = (String::new(), CompiledTier::default());
        for (tier_name, tier) in tiers
            .iter()
            .chain(std::iter::once((&no_tier.0, &no_tier.1)))
        {
            let alone = [(String::new(), 0usize, 0usize)];
            let with_routes = routes
                .iter()
                .map(|r| (r.name.to_string(), r.exact.len(), r.global.len()));
            for (route, route_exact, route_global) in alone.into_iter().chain(with_routes) {
                for (backend, count) in [
                    ("redis", tier.exact.len() + route_exact),
                    ("mesh", tier.global.len() + route_global),
                ] {
                    if count > 1 {
                        return Err(RulesError::TwoRemotePolicies {
                            backend,
                            tier: tier_name.clone(),
                            route: route.clone(),
                        });
                    }
                }
            }
            for route in &routes {
                let count = tier.enforced.len() + route.enforced.len();
                if count > MAX_POLICIES {
                    return Err(RulesError::TooManyPolicies {
                        tier: tier_name.clone(),
                        route: route.name.to_string(),
                        count,
                    });
                }
            }
        }
        let tenants = config
            .tenants
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Ok(Rules {
            config,
            #[cfg(feature = "redis")]
            redis_connection,
            mesh,
            hasher,
            policies,
            tiers,
            routes,
            tenants,
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

    /// Return the hasher of identities (for secret-free log labels).
    pub fn hasher(&self) -> &KeyHasher {
        &self.hasher
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

    fn tier_of(&self, facts: &RequestFacts<'_>) -> Option<&CompiledTier> {
        let named = facts
            .tier
            .map(str::to_string)
            .or_else(|| {
                facts
                    .identity
                    .tenant_name()
                    .and_then(|n| self.tenants.get(&n).cloned())
            })
            .or_else(|| self.config.default_tier.clone());
        named.and_then(|name| self.tiers.get(&name))
    }

    /// Work out which policies a request passes, under which keys, at what cost.
    fn plan(&self, facts: &RequestFacts<'_>) -> Plan<'_> {
        let route = self
            .routes
            .iter()
            .find(|r| r.matches(facts.method, facts.path));
        let cost = route.map_or(1, |r| r.cost);
        let tier = self.tier_of(facts);
        let env = self.config.env.as_bytes();
        let source = facts.identity.source.name().as_bytes();
        let value = facts.identity.value.as_bytes();
        let client_key = self.hasher.hash(0, &[env, source, value]);
        let route_key = route
            .map(|r| {
                self.hasher
                    .hash(0, &[env, source, value, r.name.as_bytes()])
            })
            .unwrap_or(client_key);
        // (policy index, key) of each layer: the tier's under the client's key, then the
        // route's under the client's and the route's.
        let keyed = |of_tier: fn(&CompiledTier) -> &Vec<usize>,
                     of_route: fn(&CompiledRoute) -> &Vec<usize>| {
            let tier_layers = tier
                .map_or(&[][..], |t| of_tier(t))
                .iter()
                .map(|&i| (i, client_key));
            let route_layers = route
                .map_or(&[][..], |r| of_route(r))
                .iter()
                .map(|&i| (i, route_key));
            tier_layers
                .chain(route_layers)
                .collect::<Vec<(usize, u64)>>()
        };
        Plan {
            refused: tier.is_none() && self.config.refuse_without_tier,
            route,
            cost,
            enforced: keyed(|t| &t.enforced, |r| &r.enforced),
            shadow: keyed(|t| &t.shadow, |r| &r.shadow),
            exact: keyed(|t| &t.exact, |r| &r.exact).first().copied(),
            global: keyed(|t| &t.global, |r| &r.global).first().copied(),
        }
    }

    /// Run the local layers of `layers`; return the final decision, the reports, and the
    /// charges taken (for a later refund).
    fn decide_local(
        &self,
        layers: &[(usize, u64)],
        cost: u64,
        now: Nanos,
    ) -> (Decision, Vec<PolicyReport>, Vec<Charge>) {
        let mut reports = Vec::with_capacity(layers.len() + 1);
        let mut charges = Vec::with_capacity(layers.len());
        let decision = decide_in_layers(
            layers.len(),
            |i, charge| {
                let (p, key) = layers[i];
                let policy = &self.policies[p];
                let decision =
                    policy
                        .store
                        .decide_charge(&key, policy.local_now(now), cost, true, charge);
                reports.push(policy.report(decision));
                charges.push(*charge);
                decision
            },
            |i, charge| {
                let (p, key) = layers[i];
                let policy = &self.policies[p];
                policy
                    .store
                    .refund(&key, charge, policy.local_now(now), cost);
            },
        );
        (decision, reports, charges)
    }

    /// Run the local layers, then the request's `mesh` policy if they admit, waiting for the
    /// key's owner when the node's lease is short; a mesh denial gives the local charges back.
    async fn decide_local_then_mesh(
        &self,
        plan: &Plan<'_>,
        layers: &[(usize, u64)],
        now: Nanos,
    ) -> (Decision, Vec<PolicyReport>, Vec<Charge>) {
        let (local, reports, charges, pending) = self.start_mesh(plan, layers, now);
        match pending {
            None => (local, reports, charges),
            Some((p, global)) => {
                let global = global.await;
                self.finish_mesh(plan, layers, now, (local, reports, charges), p, global)
            }
        }
    }

    /// As [`Rules::decide_local_then_mesh`], without waiting: a request the node's lease
    /// cannot decide at once is denied for one millisecond.
    fn decide_local_then_mesh_now(
        &self,
        plan: &Plan<'_>,
        layers: &[(usize, u64)],
        now: Nanos,
    ) -> (Decision, Vec<PolicyReport>, Vec<Charge>) {
        let (local, reports, charges, pending) = self.start_mesh(plan, layers, now);
        match pending {
            None => (local, reports, charges),
            Some((p, global)) => {
                let fallback = Decision::denied(local.limit, 0, 0, 1_000_000);
                let global = global.now_or(fallback);
                self.finish_mesh(plan, layers, now, (local, reports, charges), p, global)
            }
        }
    }

    /// Run the local layers and, if they admit and a mesh policy applies, ask the mesh.
    #[allow(clippy::type_complexity)]
    fn start_mesh(
        &self,
        plan: &Plan<'_>,
        layers: &[(usize, u64)],
        now: Nanos,
    ) -> (
        Decision,
        Vec<PolicyReport>,
        Vec<Charge>,
        Option<(usize, MeshDecision)>,
    ) {
        let (local, reports, charges) = self.decide_local(layers, plan.cost, now);
        let (Verdict::Allowed, Some((p, key)), Some(mesh)) =
            (local.verdict, plan.global, &self.mesh)
        else {
            return (local, reports, charges, None);
        };
        let number = self.policies[p]
            .mesh
            .expect("a mesh layer names a mesh policy");
        let global = mesh.decide(number, key, plan.cost);
        (local, reports, charges, Some((p, global)))
    }

    fn finish_mesh(
        &self,
        plan: &Plan<'_>,
        layers: &[(usize, u64)],
        now: Nanos,
        (local, mut reports, charges): (Decision, Vec<PolicyReport>, Vec<Charge>),
        p: usize,
        global: Decision,
    ) -> (Decision, Vec<PolicyReport>, Vec<Charge>) {
        reports.push(self.policies[p].report(global));
        if global.verdict != Verdict::Allowed {
            self.refund_local(layers, &charges, plan.cost, now);
            return (global, reports, charges);
        }
        (local, reports, charges)
    }

    fn refund_local(&self, layers: &[(usize, u64)], charges: &[Charge], cost: u64, now: Nanos) {
        for (&(p, key), &charge) in layers.iter().zip(charges).rev() {
            let policy = &self.policies[p];
            policy
                .store
                .refund(&key, charge, policy.local_now(now), cost);
        }
    }

    fn count_shadow(&self, plan: &Plan<'_>, now: Nanos) -> Vec<PolicyReport> {
        plan.shadow
            .iter()
            .map(|&(p, key)| {
                let policy = &self.policies[p];
                policy.report(policy.store.decide(&key, policy.local_now(now), plan.cost))
            })
            .collect()
    }

    fn outcome(
        &self,
        plan: &Plan<'_>,
        allowed: bool,
        delay_ns: Nanos,
        enforced: Vec<PolicyReport>,
        now: Nanos,
    ) -> Outcome {
        Outcome {
            allowed,
            cost: plan.cost,
            route: plan.route.map(|r| Arc::clone(&r.name)),
            enforced,
            shadow: if allowed {
                self.count_shadow(plan, now)
            } else {
                Vec::new()
            },
            delay_ns: if allowed { delay_ns } else { 0 },
            backend_unavailable: None,
        }
    }

    /// The outcome for a client that matches no tier under `no_tier = "refuse"`: denied by
    /// [`NO_TIER_POLICY`], a limit of zero that no retry can meet (nothing is charged).
    fn refused(&self, plan: &Plan<'_>) -> Outcome {
        let report = PolicyReport {
            name: Arc::from(NO_TIER_POLICY),
            sf_name: Arc::from(crate::http::sf::sf_string(NO_TIER_POLICY)),
            decision: Decision::cannot_fit(0),
            window_s: 0,
            shadow: false,
        };
        self.outcome(plan, false, 0, vec![report], 0)
    }

    /// Decide one request at `now` (nanoseconds on the limiter's clock), without IO.
    ///
    /// A `mesh` policy is decided by the node's lease of the key (one compare-and-swap, on
    /// the node's clock) without waiting: when the lease is short, the request is denied
    /// for a millisecond. A `redis` policy is answered here by its local store, as when it
    /// fails open. Use [`Rules::decide_exact`] to wait for the mesh and to ask Redis.
    pub fn decide(&self, facts: &RequestFacts<'_>, now: Nanos) -> Outcome {
        let plan = self.plan(facts);
        if plan.refused {
            return self.refused(&plan);
        }
        let mut layers = plan.enforced.clone();
        layers.extend(plan.exact);
        let (decision, reports, _) = self.decide_local_then_mesh_now(&plan, &layers, now);
        self.outcome(
            &plan,
            decision.verdict == Verdict::Allowed,
            decision.delay_ns,
            reports,
            now,
        )
    }

    /// Decide one request with the IO it may need: a `mesh` policy waits for the key's owner
    /// when the node's lease is short, and a `redis` policy asks Redis (at most one per
    /// request, decided after the local and mesh ones pass; a denial there gives the local
    /// charges back, while a mesh charge stays counted: the cluster then admits less, never
    /// more).
    pub async fn decide_exact(&self, facts: &RequestFacts<'_>, now: Nanos) -> Outcome {
        let plan = self.plan(facts);
        if plan.refused {
            return self.refused(&plan);
        }
        // `plan.exact` only ever names a policy with a Redis limiter; resolve it before any
        // local charge is taken.
        #[cfg(feature = "redis")]
        if let Some((p, key, policy, redis)) = plan.exact.and_then(|(p, key)| {
            let policy = &self.policies[p];
            policy.redis.as_ref().map(|redis| (p, key, policy, redis))
        }) {
            return self.decide_redis(&plan, (p, key), policy, redis, now).await;
        }
        let mut layers = plan.enforced.clone();
        layers.extend(plan.exact);
        let (decision, reports, _) = self.decide_local_then_mesh(&plan, &layers, now).await;
        self.outcome(
            &plan,
            decision.verdict == Verdict::Allowed,
            decision.delay_ns,
            reports,
            now,
        )
    }

    /// The local and mesh layers of `plan`, then its `redis` policy `policy` (number `p`,
    /// key `key`), refunding the local charges when Redis denies or fails closed.
    #[cfg(feature = "redis")]
    async fn decide_redis(
        &self,
        plan: &Plan<'_>,
        (p, key): (usize, u64),
        policy: &CompiledPolicy,
        redis: &RedisLimiter,
        now: Nanos,
    ) -> Outcome {
        let (local, mut reports, charges) =
            self.decide_local_then_mesh(plan, &plan.enforced, now).await;
        if local.verdict != Verdict::Allowed {
            return self.outcome(plan, false, 0, reports, now);
        }
        let route = plan
            .route
            .filter(|r| r.exact.contains(&p))
            .map(|r| &*r.name);
        let identity = format!("{key:016x}");
        let rkey = redis_key(&self.config.env, &policy.named.name, &identity, route);
        let reply = match &policy.token_cache {
            Some(cache) => cache.check(&rkey, plan.cost).await,
            None => redis.check(&rkey, plan.cost).await,
        };
        let exact = match reply {
            Ok(decision) => decision,
            Err(error) => {
                record_failover(&policy.name, policy.named.fail_mode, &error);
                match policy.named.fail_mode {
                    FailMode::Open => policy.store.decide(&key, policy.local_now(now), plan.cost),
                    FailMode::Closed => {
                        self.refund_local(&plan.enforced, &charges, plan.cost, now);
                        let mut outcome = self.outcome(plan, false, 0, reports, now);
                        outcome.backend_unavailable = Some(Arc::clone(&policy.name));
                        return outcome;
                    }
                }
            }
        };
        reports.push(policy.report(exact));
        if exact.verdict != Verdict::Allowed {
            self.refund_local(&plan.enforced, &charges, plan.cost, now);
            return self.outcome(plan, false, 0, reports, now);
        }
        self.outcome(plan, true, local.delay_ns, reports, now)
    }

    /// Tell whether a request may have to wait for IO: a `redis` policy, or a `mesh` policy
    /// whose key's owner the node may have to ask. Such rules are decided with
    /// [`Rules::decide_exact`].
    pub fn needs_io(&self) -> bool {
        self.has_exact_policies() || self.mesh.is_some()
    }

    /// Tell whether any policy uses the `redis` backend.
    pub fn has_exact_policies(&self) -> bool {
        self.config.redis.is_some() && self.policies.iter().any(CompiledPolicy::is_exact)
    }
}

/// Which policies a request passes, under which keys, at what cost.
struct Plan<'a> {
    /// The client matches no tier and the file says `no_tier = "refuse"`.
    refused: bool,
    route: Option<&'a CompiledRoute>,
    cost: u64,
    enforced: Vec<(usize, u64)>,
    shadow: Vec<(usize, u64)>,
    exact: Option<(usize, u64)>,
    global: Option<(usize, u64)>,
}
