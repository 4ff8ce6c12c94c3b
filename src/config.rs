//! The policy file: TOML that product and security people can read, validated into
//! [`GatewayConfig`] with errors that name the file, the line and the field.
//!
//! ```toml
//! env = "prod"
//! default_tier = "free"                        # clients that match no tier (or: no_tier = "refuse")
//!
//! [identity]
//! order = ["user", "api_key", "device", "ip"]   # first one present wins
//! api_key_header = "x-api-key"
//! trusted_proxies = ["10.0.0.0/8"]              # X-Forwarded-For is read only from these
//!
//! [policies.per_second]
//! algorithm = "token-bucket"
//! rate = 10
//! period = "1s"
//! burst = 20
//!
//! [policies.daily]
//! algorithm = "fixed-window"
//! limit = 10000
//! window = "1d"
//! time_zone = "Europe/Paris"                   # days start at local midnight
//!
//! [redis]
//! url = "redis://127.0.0.1:6379"
//!
//! [policies.payments]                          # exact across the fleet, through Redis
//! algorithm = "token-bucket"
//! rate = 50
//! period = "1s"
//! burst = 100
//! backend = "redis"
//! fail_mode = "closed"
//! token_cache = { batch = 10, ttl = "100ms" }  # optional, for very hot keys
//!
//! [tiers.free]
//! policies = ["per_second", "daily"]
//!
//! [tenants]
//! "user:alice" = "free"
//!
//! [[routes]]
//! name = "search"
//! method = "GET"
//! path_prefix = "/search"
//! cost = 10
//!
//! [[envoy.domains]]                            # Envoy's rate limit service API (a node's [envoy_rls])
//! domain = "edge"
//! descriptors = [{ key = "remote_address", rate_limit = { requests_per_unit = 100, unit = "minute" } }]
//! ```

mod access;
mod cost;
mod envoy;
mod graphql;
mod identity;
mod jwt;
mod key;
mod limits;
mod matching;
mod named_policy;
mod outcome;
mod plans;
mod raw;
mod redis;
mod routes;
mod source;
mod tiers;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use access::build_access;
pub use access::{Access, AccessLists, MAX_ACCESS_RANGES};
pub use cost::{CostFrom, CostMap, CostSource};
use envoy::build_envoy;
pub use envoy::{
    DescriptorLimit, EnvoyConfig, EnvoyDescriptor, EnvoyDomain, MAX_DESCRIPTOR_DEPTH, RateLimitUnit,
};
pub use graphql::GraphQlPricing;
use identity::build_identity;
pub use identity::{IdentityConfig, IdentitySource};
use jwt::build_jwt;
pub use jwt::{JwtConfig, JwtKeySource, KeySet, MAX_KEY_FILE_BYTES};
pub use key::{AddressPrefixes, CountBy, KeyPart, MAX_BY_PARTS, OnMissing};
use limits::check_limits_something;
pub use matching::{HostPattern, MAX_PATTERN_SEGMENTS, PathPattern, RouteMatch, Segment};
use named_policy::build_policy;
pub use named_policy::{
    Backend, DEFAULT_MAX_HOLD, FailMode, MAX_BLOCK_FOR, MAX_MAX_HOLD, MAX_TOKEN_CACHE_TTL,
    NamedPolicy, TokenCacheConfig,
};
pub use outcome::StatusSet;
pub use plans::Plans;
use plans::load_plans;
use raw::{NoTier, RawConfig};
use redis::build_redis;
pub use redis::{RedisConfig, RedisEndpoints, RedisTls};
pub(crate) use routes::DEFAULT_MAX_BODY_BYTES;
pub use routes::RouteRule;
use routes::build_routes;
pub use source::ConfigError;
/// For the node file (`daemon::node_file`), which shares the file format's conventions.
#[cfg(feature = "node")]
pub(crate) use source::parse_duration;
pub(crate) use source::{Source, read_config_file};
pub use tiers::TierSource;
use tiers::check_tenant;

/// A validated policy file.
#[derive(Debug, Clone, PartialEq)]
pub struct GatewayConfig {
    /// The environment name (part of every key; keeps staging and production apart).
    pub env: String,
    /// The secret that keys the hash of identities; random per process when absent.
    pub key_secret: Option<String>,
    /// How clients are identified.
    pub identity: IdentityConfig,
    /// Addresses never limited, and addresses refused (`[access]`).
    pub access: AccessLists,
    /// How tokens are verified, for policies that count by JWT claims (`[jwt]`).
    pub jwt: Option<JwtConfig>,
    /// Also send `X-RateLimit-Limit`, `-Remaining`, `-Reset`.
    pub legacy_headers: bool,
    /// The named policies.
    pub policies: Vec<NamedPolicy>,
    /// Tier name → the policies every request of that tier passes.
    pub tiers: BTreeMap<String, Vec<String>>,
    /// The tier of clients not listed in `tenants`.
    pub default_tier: Option<String>,
    /// `no_tier = "refuse"`: a client that matches no tier (and there is no `default_tier`)
    /// is refused instead of passing only its route's policies.
    pub refuse_without_tier: bool,
    /// `allow_unlimited = true`: the file may leave requests limited by no policy at all.
    pub allow_unlimited: bool,
    /// Client identity (`user:alice`, as the identity's kind and value; `api_key:HASH` for
    /// an API key) → tier.
    pub tenants: BTreeMap<String, String>,
    /// The plans file (`plans_file`): more API keys (by hash) → tier, read with the file.
    pub plans: Option<Arc<Plans>>,
    /// Where a client's tier comes from, in order, before `default_tier` (`tier_from`).
    pub tier_from: Vec<TierSource>,
    /// Routes, most specific first.
    pub routes: Vec<RouteRule>,
    /// The Redis deployment of `backend = "redis"` policies.
    pub redis: Option<RedisConfig>,
    /// The domains and descriptors of Envoy's rate limit service API (`[envoy]`); their
    /// inline limits are in `policies`, named after their paths.
    pub envoy: EnvoyConfig,
}

impl GatewayConfig {
    /// Read and validate a policy file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let text = read_config_file(path)?;
        Self::from_toml_str(&text, &path.display().to_string())
    }

    /// Validate a policy file's text; `origin` names it in errors.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let source = Source { file: origin, text };
        let raw: RawConfig = source.parse()?;
        build(&source, raw)
    }

    /// Return the named policy.
    pub fn policy(&self, name: &str) -> Option<&NamedPolicy> {
        self.policies.iter().find(|p| p.name == name)
    }

    /// Return the digest the mesh nodes compare (never 0): their `mesh` policies (names,
    /// algorithms, limits, windows), `env` and `key_secret`, hashed with the secret as the key
    /// so it reveals nothing. Nodes whose digests differ report it and enforce the lowest of
    /// each policy's limits until they agree.
    pub fn mesh_digest(&self) -> u64 {
        let secret = self.key_secret.as_deref().unwrap_or("");
        let mut bytes = Vec::new();
        for p in self.mesh_policies() {
            bytes.extend_from_slice(&(p.name.len() as u64).to_le_bytes());
            bytes.extend_from_slice(p.name.as_bytes());
            bytes.extend_from_slice(p.policy.algorithm().name().as_bytes());
            // What it counts by: another `by` makes other keys.
            if let Some(by) = &p.by {
                bytes.extend_from_slice(b"by");
                for part in &by.parts {
                    let name = part.name();
                    bytes.extend_from_slice(&(name.len() as u64).to_le_bytes());
                    bytes.extend_from_slice(name.as_bytes());
                }
            }
            // Calendar periods: every node must number the same windows.
            if let Some(calendar) = &p.calendar {
                bytes.extend_from_slice(b"calendar");
                bytes.extend_from_slice(calendar.calendar().as_str().as_bytes());
                let zone = calendar.zone_name().unwrap_or("");
                bytes.extend_from_slice(&(zone.len() as u64).to_le_bytes());
                bytes.extend_from_slice(zone.as_bytes());
            }
            // A lockout: every node must start and keep the same ones.
            if let Some(block) = p.block_for {
                bytes.extend_from_slice(b"block_for");
                bytes.extend_from_slice(&crate::clock::duration_to_nanos(block).to_le_bytes());
            }
            for n in [
                p.policy.capacity(),
                p.policy.interval_ns(),
                p.policy.window_ns(),
            ] {
                bytes.extend_from_slice(&n.to_le_bytes());
            }
        }
        crate::ids::KeyHasher::from_secret(secret).config_digest(&[
            b"ratemesh-config-1",
            self.env.as_bytes(),
            &bytes,
        ])
    }

    /// Return the `backend = "mesh"` policies in their mesh order (by name): the index of
    /// each is its policy number on the mesh, the same on every node that loads this file.
    pub fn mesh_policies(&self) -> Vec<&NamedPolicy> {
        self.policies
            .iter()
            .filter(|p| p.backend == Backend::Mesh)
            .collect()
    }

    /// Return the `backend = "redis"` policies in file order (by name): the index of each is
    /// its number for [`crate::backend::exact::ExactLimits`].
    pub fn redis_policies(&self) -> Vec<&NamedPolicy> {
        self.policies
            .iter()
            .filter(|p| p.backend == Backend::Redis)
            .collect()
    }
}

fn build(source: &Source<'_>, raw: RawConfig) -> Result<GatewayConfig, ConfigError> {
    let mut policies = Vec::new();
    let redis = match &raw.redis {
        Some(spanned) => Some(build_redis(source, spanned)?),
        None => None,
    };
    for (name, spanned) in &raw.policies {
        policies.push(build_policy(
            source,
            name,
            spanned,
            redis.is_some(),
            raw.key_secret.is_some(),
        )?);
    }
    let known = |name: &str| policies.iter().any(|p: &NamedPolicy| p.name == name);

    let mut tiers = BTreeMap::new();
    for (tier, spanned) in &raw.tiers {
        let field = format!("tiers.{tier}.policies");
        let line = source.line_of_key(spanned.span(), "policies");
        for name in &spanned.get_ref().policies {
            if !known(name) {
                return Err(source.error(line, field, format!("no policy named `{name}`")));
            }
        }
        tiers.insert(tier.clone(), spanned.get_ref().policies.clone());
    }
    let tier_exists = |line: usize, field: &str, tier: &str| {
        if tiers.contains_key(tier) {
            Ok(())
        } else {
            Err(source.error(line, field, format!("no tier named `{tier}`")))
        }
    };
    let default_tier = match &raw.default_tier {
        Some(tier) => {
            tier_exists(
                source.line_of(tier.span().start),
                "default_tier",
                tier.get_ref(),
            )?;
            Some(tier.get_ref().clone())
        }
        None => None,
    };
    let mut tenants = BTreeMap::new();
    for (tenant, tier) in &raw.tenants {
        let field = format!("tenants.{tenant}");
        let line = source.line_of(tier.span().start);
        tier_exists(line, &field, tier.get_ref())?;
        check_tenant(tenant).map_err(|reason| source.error(line, &field, reason))?;
        if tenant.starts_with("api_key:") && raw.key_secret.is_none() {
            return Err(source.error(
                line,
                &field,
                "API keys are listed by their hash under `key_secret`: set `key_secret`",
            ));
        }
        tenants.insert(tenant.clone(), tier.get_ref().clone());
    }
    let plans = match &raw.plans_file {
        Some(name) => {
            let line = source.line_of(name.span().start);
            if raw.key_secret.is_none() {
                return Err(source.error(
                    line,
                    "plans_file",
                    "API keys are listed by their hash under `key_secret`: set `key_secret`",
                ));
            }
            Some(Arc::new(load_plans(
                source,
                line,
                name.get_ref(),
                &tiers,
                &tenants,
            )?))
        }
        None => None,
    };
    let tier_from = match &raw.tier_from {
        None => vec![TierSource::Tenants],
        Some(list) => {
            let line = source.line_of(list.span().start);
            let mut sources = Vec::new();
            for text in list.get_ref() {
                let parsed = TierSource::parse(text)
                    .map_err(|reason| source.error(line, "tier_from", reason))?;
                if sources.contains(&parsed) {
                    return Err(source.error(
                        line,
                        "tier_from",
                        format!("`{text}` is listed twice"),
                    ));
                }
                sources.push(parsed);
            }
            sources
        }
    };

    let routes = build_routes(source, &raw.routes, &policies, &tiers)?;

    // After the tiers and routes: the inline limits of descriptors are for Envoy alone.
    let envoy = match &raw.envoy {
        Some(spanned) => {
            let mut cx = envoy::Context {
                source,
                policies: &mut policies,
                has_redis: redis.is_some(),
                has_key_secret: raw.key_secret.is_some(),
            };
            build_envoy(&mut cx, spanned)?
        }
        None => EnvoyConfig::default(),
    };
    // Policies stay ordered by name: the mesh numbers its policies in this order.
    policies.sort_by(|a, b| a.name.cmp(&b.name));

    let refuse_without_tier = match &raw.no_tier {
        Some(no_tier) if default_tier.is_some() => {
            return Err(source.error(
                source.line_of(no_tier.span().start),
                "no_tier",
                "give either `default_tier` (clients that match no tier get it) or \
                 `no_tier = \"refuse\"` (they are refused), not both",
            ));
        }
        Some(no_tier) => *no_tier.get_ref() == NoTier::Refuse,
        None => false,
    };
    if !raw.allow_unlimited {
        check_limits_something(
            source,
            &policies,
            &tiers,
            default_tier.as_deref(),
            refuse_without_tier,
            &routes,
            !envoy.domains.is_empty(),
        )?;
    }

    let identity = match &raw.identity {
        Some(spanned) => build_identity(source, spanned)?,
        None => IdentityConfig::default(),
    };

    let access = match &raw.access {
        Some(spanned) => build_access(source, spanned)?,
        None => AccessLists::default(),
    };
    let jwt = match &raw.jwt {
        Some(spanned) => Some(build_jwt(source, spanned)?),
        None => None,
    };
    if let Some(spanned) = &raw.access {
        let line = |key| source.line_of_key(spanned.span(), key);
        if !access.exempt_api_keys.is_empty() && raw.key_secret.is_none() {
            return Err(source.error(
                line("exempt_api_keys"),
                "access.exempt_api_keys",
                "API keys are listed by their hash under `key_secret`: set `key_secret`",
            ));
        }
        if !access.exempt_subjects.is_empty() && jwt.is_none() {
            return Err(source.error(
                line("exempt_subjects"),
                "access.exempt_subjects",
                "subjects come from verified tokens: add a `[jwt]` section",
            ));
        }
    }
    if jwt.is_none()
        && let Some(list) = &raw.tier_from
        && tier_from.iter().any(|t| matches!(t, TierSource::Jwt(_)))
    {
        return Err(source.error(
            source.line_of(list.span().start),
            "tier_from",
            "takes a tier from a JWT claim: add a `[jwt]` section that says how tokens are verified",
        ));
    }
    if jwt.is_none()
        && let Some((name, spanned)) = raw.policies.iter().find(|(name, _)| {
            policies.iter().any(|p| {
                &p.name == *name
                    && p.by.as_ref().is_some_and(|by| {
                        by.parts.iter().any(|part| matches!(part, KeyPart::Jwt(_)))
                    })
            })
        })
    {
        return Err(source.error(
            source.line_of_key(spanned.span(), "by"),
            format!("policies.{name}.by"),
            "counts by a JWT claim: add a `[jwt]` section that says how tokens are verified",
        ));
    }

    Ok(GatewayConfig {
        env: raw.env.clone().unwrap_or_else(|| "default".to_string()),
        key_secret: raw.key_secret.clone(),
        identity,
        access,
        jwt,
        legacy_headers: raw.headers.as_ref().is_some_and(|h| h.legacy),
        policies,
        tiers,
        default_tier,
        refuse_without_tier,
        allow_unlimited: raw.allow_unlimited,
        tenants,
        plans,
        tier_from,
        routes,
        redis,
        envoy,
    })
}
