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
//! ```

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use http::{HeaderName, Method};
use ipnet::IpNet;
use jiff::tz::TimeZone;
use serde::Deserialize;
use toml::Spanned;

use crate::policy::{Algorithm, Policy, PolicyError};

mod limits;
use limits::check_limits_something;

/// What was wrong with a policy file, and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: `{field}`: {reason}")]
pub struct ConfigError {
    /// The file (or the origin given to [`GatewayConfig::from_toml_str`]).
    pub file: String,
    /// The 1-based line of the offending field (or of its table).
    pub line: usize,
    /// The dotted path of the field, e.g. `policies.daily.window`.
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

/// The parts of a request that can identify a client, in order of preference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdentitySource {
    /// The authenticated user that an earlier auth layer put in the request's extensions
    /// ([`crate::http::AuthenticatedUser`]).
    User,
    /// The API key header (hashed before use).
    ApiKey,
    /// The device id header (hashed before use).
    Device,
    /// The client IP: the peer address, or the forwarded address when the peer is a trusted
    /// proxy.
    Ip,
}

impl IdentitySource {
    /// Return the short name used in keys, logs and configs.
    pub fn name(self) -> &'static str {
        match self {
            IdentitySource::User => "user",
            IdentitySource::ApiKey => "api_key",
            IdentitySource::Device => "device",
            IdentitySource::Ip => "ip",
        }
    }
}

/// Where a policy's counters live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// This node's own store.
    #[default]
    Local,
    /// The cluster-wide limit, shared by the nodes' gossip (needs `key_secret` and a
    /// running mesh node: `ratemesh node`, or [`crate::http::RateLimitLayer::with_mesh`]).
    Mesh,
    /// Exact counters in Redis (needs a `[redis]` section).
    Redis,
}

/// What a policy does when its backend (Redis) fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum FailMode {
    /// Decide on this node's own counters with the same policy instead, and count it.
    #[default]
    Open,
    /// Deny, saying that the backend failed (503, not 429).
    Closed,
}

/// How the client is identified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentityConfig {
    /// The sources to try, first present wins.
    pub order: Vec<IdentitySource>,
    /// The API key header.
    pub api_key_header: HeaderName,
    /// The device id header.
    pub device_header: HeaderName,
    /// Peers whose `X-Forwarded-For` / `Forwarded` headers are believed.
    pub trusted_proxies: Vec<IpNet>,
}

impl Default for IdentityConfig {
    fn default() -> Self {
        IdentityConfig {
            order: vec![
                IdentitySource::User,
                IdentitySource::ApiKey,
                IdentitySource::Device,
                IdentitySource::Ip,
            ],
            api_key_header: HeaderName::from_static("x-api-key"),
            device_header: HeaderName::from_static("x-device-id"),
            trusted_proxies: Vec::new(),
        }
    }
}

/// One named policy of the file.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedPolicy {
    /// Its name (as in `RateLimit-Policy`).
    pub name: String,
    /// The validated limit.
    pub policy: Policy,
    /// Where its counters live.
    pub backend: Backend,
    /// What happens when the backend fails.
    pub fail_mode: FailMode,
    /// Count and report, never deny.
    pub shadow: bool,
    /// Windows start at midnight in this zone (fixed windows); `None` = UTC.
    pub time_zone: Option<TimeZone>,
    /// A per-node cache of tokens granted by Redis (`redis` buckets only); `None` = off.
    pub token_cache: Option<TokenCacheConfig>,
}

/// The local token cache of a `redis` token bucket or GCRA policy
/// (see [`crate::backend::token_cache`] for the error it adds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenCacheConfig {
    /// Tokens taken from Redis on top of a request's cost, for the next requests on this node.
    pub batch: u64,
    /// How long cached tokens may be spent after Redis granted them.
    pub ttl: Duration,
}

/// The longest `token_cache.ttl`: the cache may admit up to `rate · ttl` more than the policy
/// in an interval, so it is kept short.
pub const MAX_TOKEN_CACHE_TTL: Duration = Duration::from_secs(10);

/// A route: requests matching a method and a path prefix cost `cost` tokens and also pass
/// through `policies` (keyed per client and per route).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteRule {
    /// The route's name (part of its keys).
    pub name: String,
    /// The method, or any.
    pub method: Option<Method>,
    /// The path prefix, matched on segment boundaries (`/search` matches `/search/x`, not
    /// `/searchx`).
    pub path_prefix: String,
    /// The cost of one request, in tokens of every policy that applies.
    pub cost: u64,
    /// Policies that apply to this route in addition to the tier's.
    pub policies: Vec<String>,
}

/// Where the `redis` backend lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// One server (`redis://host:port`, `redis+unix:///path`), or the nodes of a cluster.
    pub endpoints: RedisEndpoints,
    /// The timeout of every call; past it the policy's fail mode decides.
    pub timeout: Duration,
}

/// One Redis server or a Redis Cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisEndpoints {
    /// One server.
    Single(String),
    /// Any nodes of one cluster.
    Cluster(Vec<String>),
}

/// A validated policy file.
#[derive(Debug, Clone, PartialEq)]
pub struct GatewayConfig {
    /// The environment name (part of every key; keeps staging and production apart).
    pub env: String,
    /// The secret that keys the hash of identities; random per process when absent.
    pub key_secret: Option<String>,
    /// How clients are identified.
    pub identity: IdentityConfig,
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
    /// Client identity (`user:alice`, as the identity's kind and value) → tier.
    pub tenants: BTreeMap<String, String>,
    /// Routes, most specific first.
    pub routes: Vec<RouteRule>,
    /// The Redis deployment of `backend = "redis"` policies.
    pub redis: Option<RedisConfig>,
}

// ---- raw file format ---------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    env: Option<String>,
    #[serde(default)]
    key_secret: Option<String>,
    #[serde(default)]
    default_tier: Option<Spanned<String>>,
    #[serde(default)]
    no_tier: Option<Spanned<NoTier>>,
    #[serde(default)]
    allow_unlimited: bool,
    #[serde(default)]
    identity: Option<Spanned<RawIdentity>>,
    #[serde(default)]
    headers: Option<RawHeaders>,
    #[serde(default)]
    policies: BTreeMap<String, Spanned<RawPolicy>>,
    #[serde(default)]
    tiers: BTreeMap<String, Spanned<RawTier>>,
    #[serde(default)]
    tenants: BTreeMap<String, Spanned<String>>,
    #[serde(default)]
    routes: Vec<Spanned<RawRoute>>,
    #[serde(default)]
    redis: Option<Spanned<RawRedis>>,
}

/// What happens to a client that matches no tier when there is no `default_tier`.
#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum NoTier {
    /// Refuse its requests (a limit of zero).
    Refuse,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRedis {
    url: Option<String>,
    #[serde(default)]
    cluster: Vec<String>,
    timeout: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawIdentity {
    order: Option<Vec<IdentitySource>>,
    api_key_header: Option<String>,
    device_header: Option<String>,
    #[serde(default)]
    trusted_proxies: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHeaders {
    #[serde(default)]
    legacy: bool,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "kebab-case")]
enum AlgorithmName {
    TokenBucket,
    Gcra,
    LeakyBucketPolice,
    LeakyBucketShape,
    FixedWindow,
    SlidingLog,
    SlidingWindow,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    algorithm: AlgorithmName,
    rate: Option<u64>,
    period: Option<String>,
    burst: Option<u64>,
    limit: Option<u64>,
    window: Option<String>,
    max_wait: Option<String>,
    #[serde(default)]
    backend: Backend,
    #[serde(default)]
    fail_mode: FailMode,
    #[serde(default)]
    shadow: bool,
    time_zone: Option<String>,
    token_cache: Option<RawTokenCache>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTokenCache {
    batch: u64,
    ttl: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTier {
    policies: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    name: String,
    method: Option<String>,
    path_prefix: String,
    #[serde(default = "one")]
    cost: u64,
    #[serde(default)]
    policies: Vec<String>,
}

fn one() -> u64 {
    1
}

// ---- locating errors ---------------------------------------------------------------------

/// A file's text and name, to place errors at a line and a dotted field.
pub(crate) struct Source<'a> {
    pub(crate) file: &'a str,
    pub(crate) text: &'a str,
}

impl Source<'_> {
    pub(crate) fn line_of(&self, offset: usize) -> usize {
        self.text[..offset.min(self.text.len())]
            .bytes()
            .filter(|&b| b == b'\n')
            .count()
            + 1
    }

    /// The dotted path of the key at `offset`: the enclosing `[table]` plus the line's key.
    pub(crate) fn path_at(&self, offset: usize) -> String {
        let before = &self.text[..offset.min(self.text.len())];
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let line = self.text[line_start..].lines().next().unwrap_or("");
        if line.trim_start().starts_with('[') {
            // A table header (perhaps a broken one): the table is the field.
            let name = line.trim().trim_matches(|c| c == '[' || c == ']').trim();
            return name.to_string();
        }
        let key = line
            .split_once('=')
            .map(|(k, _)| k.trim().trim_matches('"').to_string())
            .filter(|k| !k.starts_with('['));
        let table = before[..line_start]
            .lines()
            .rev()
            .map(str::trim)
            .find(|l| l.starts_with('['))
            .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim().to_string());
        match (table, key) {
            (Some(table), Some(key)) => format!("{table}.{key}"),
            (Some(table), None) => table,
            (None, Some(key)) => key,
            (None, None) => String::new(),
        }
    }

    /// The line of `key = ...` in the table that starts at `span` (up to the next table
    /// header), or the table's first line.
    pub(crate) fn line_of_key(&self, span: std::ops::Range<usize>, key: &str) -> usize {
        let start = span.start.min(self.text.len());
        let mut offset = start;
        for (i, line) in self.text[start..].split_inclusive('\n').enumerate() {
            let trimmed = line.trim_start();
            if i > 0 && trimmed.starts_with('[') {
                break;
            }
            if let Some(rest) = trimmed.strip_prefix(key)
                && rest.trim_start().starts_with('=')
            {
                return self.line_of(offset);
            }
            offset += line.len();
        }
        self.line_of(start)
    }

    /// Deserialize the text; a TOML or shape error names its line and dotted field.
    pub(crate) fn parse<T: serde::de::DeserializeOwned>(&self) -> Result<T, ConfigError> {
        toml::from_str(self.text).map_err(|e| {
            let offset = e.span().map_or(0, |span| span.start);
            let field = self.path_at(offset);
            self.error(
                self.line_of(offset),
                if field.is_empty() {
                    "(file)".to_string()
                } else {
                    field
                },
                e.message().trim().to_string(),
            )
        })
    }

    pub(crate) fn error(
        &self,
        line: usize,
        field: impl Into<String>,
        reason: impl Into<String>,
    ) -> ConfigError {
        ConfigError {
            file: self.file.to_string(),
            line,
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Read a config file, or say which file could not be read and why.
pub(crate) fn read_config_file(path: &Path) -> Result<String, ConfigError> {
    let file = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| ConfigError {
        file: file.clone(),
        line: 1,
        field: "(file)".to_string(),
        reason: format!("cannot read the file: {e}"),
    })?;
    String::from_utf8(bytes).map_err(|e| {
        let valid = e.utf8_error().valid_up_to();
        // The text before the first bad byte is valid: it places the error.
        let before = String::from_utf8_lossy(&e.as_bytes()[..valid]).into_owned();
        let source = Source {
            file: &file,
            text: &before,
        };
        let field = source.path_at(valid);
        source.error(
            source.line_of(valid),
            if field.is_empty() {
                "(file)".to_string()
            } else {
                field
            },
            format!("the file is not UTF-8 text (byte {valid} is not); TOML files are UTF-8"),
        )
    })
}

pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| {
        format!("`{text}` is not a duration ({e}); write e.g. \"1s\", \"500ms\", \"1m\", \"1d\"")
    })
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

    /// Return the `backend = "mesh"` policies in their mesh order (by name): the index of
    /// each is its policy number on the mesh, the same on every node that loads this file.
    pub fn mesh_policies(&self) -> Vec<&NamedPolicy> {
        self.policies
            .iter()
            .filter(|p| p.backend == Backend::Mesh)
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
        tier_exists(source.line_of(tier.span().start), &field, tier.get_ref())?;
        tenants.insert(tenant.clone(), tier.get_ref().clone());
    }

    let mut routes: Vec<RouteRule> = Vec::new();
    for spanned in &raw.routes {
        let route = build_route(source, spanned, &policies, &tiers)?;
        let line = source.line_of(spanned.span().start);
        if let Some(same) = routes
            .iter()
            .find(|r| r.method == route.method && r.path_prefix == route.path_prefix)
        {
            return Err(source.error(
                line,
                format!("routes.{}", route.name),
                format!(
                    "same method and path prefix as route `{}`: the match would be ambiguous",
                    same.name
                ),
            ));
        }
        if routes.iter().any(|r| r.name == route.name) {
            return Err(source.error(
                line,
                format!("routes.{}.name", route.name),
                "two routes share this name",
            ));
        }
        routes.push(route);
    }
    // Most specific first: longer prefixes, then a named method before "any".
    routes.sort_by(|a: &RouteRule, b: &RouteRule| {
        (b.path_prefix.len(), b.method.is_some()).cmp(&(a.path_prefix.len(), a.method.is_some()))
    });

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
        )?;
    }

    let identity = match &raw.identity {
        Some(spanned) => build_identity(source, spanned)?,
        None => IdentityConfig::default(),
    };

    Ok(GatewayConfig {
        env: raw.env.clone().unwrap_or_else(|| "default".to_string()),
        key_secret: raw.key_secret.clone(),
        identity,
        legacy_headers: raw.headers.as_ref().is_some_and(|h| h.legacy),
        policies,
        tiers,
        default_tier,
        refuse_without_tier,
        allow_unlimited: raw.allow_unlimited,
        tenants,
        routes,
        redis,
    })
}

fn build_redis(
    source: &Source<'_>,
    spanned: &Spanned<RawRedis>,
) -> Result<RedisConfig, ConfigError> {
    let raw = spanned.get_ref();
    let span = spanned.span();
    let endpoints = match (&raw.url, raw.cluster.is_empty()) {
        (Some(url), true) => RedisEndpoints::Single(url.clone()),
        (None, false) => RedisEndpoints::Cluster(raw.cluster.clone()),
        (Some(_), false) => {
            return Err(source.error(
                source.line_of_key(span.clone(), "cluster"),
                "redis.cluster",
                "give either `url` or `cluster`, not both",
            ));
        }
        (None, true) => {
            return Err(source.error(
                source.line_of(span.start),
                "redis",
                "needs `url` (one server) or `cluster` (its nodes)",
            ));
        }
    };
    let timeout = match &raw.timeout {
        None => Duration::from_millis(250),
        Some(text) => parse_duration(text).map_err(|reason| {
            source.error(
                source.line_of_key(span.clone(), "timeout"),
                "redis.timeout",
                reason,
            )
        })?,
    };
    Ok(RedisConfig { endpoints, timeout })
}

fn build_identity(
    source: &Source<'_>,
    spanned: &Spanned<RawIdentity>,
) -> Result<IdentityConfig, ConfigError> {
    let raw = spanned.get_ref();
    let span = spanned.span();
    let mut identity = IdentityConfig::default();
    if let Some(order) = &raw.order {
        if order.is_empty() {
            let line = source.line_of_key(span.clone(), "order");
            return Err(source.error(line, "identity.order", "must name at least one source"));
        }
        identity.order = order.clone();
    }
    let header = |key: &str, value: &Option<String>, default: HeaderName| match value {
        None => Ok(default),
        Some(name) => HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
            source.error(
                source.line_of_key(span.clone(), key),
                format!("identity.{key}"),
                format!("`{name}` is not a valid header name"),
            )
        }),
    };
    identity.api_key_header = header(
        "api_key_header",
        &raw.api_key_header,
        identity.api_key_header,
    )?;
    identity.device_header = header("device_header", &raw.device_header, identity.device_header)?;
    for proxy in &raw.trusted_proxies {
        let net = proxy
            .parse::<IpNet>()
            .or_else(|_| proxy.parse::<std::net::IpAddr>().map(IpNet::from))
            .map_err(|_| {
                source.error(
                    source.line_of_key(span.clone(), "trusted_proxies"),
                    "identity.trusted_proxies",
                    format!("`{proxy}` is not an IP address or CIDR range"),
                )
            })?;
        identity.trusted_proxies.push(net);
    }
    Ok(identity)
}

fn build_policy(
    source: &Source<'_>,
    name: &str,
    spanned: &Spanned<RawPolicy>,
    has_redis: bool,
    has_key_secret: bool,
) -> Result<NamedPolicy, ConfigError> {
    let raw = spanned.get_ref();
    let span = spanned.span();
    let at = |key: &str| source.line_of_key(span.clone(), key);
    let field = |key: &str| format!("policies.{name}.{key}");
    let fail = |key: &str, reason: String| source.error(at(key), field(key), reason);
    let required = |key: &str, value: Option<u64>| {
        value.ok_or_else(|| {
            fail(
                key,
                format!("required by algorithm `{}`", algorithm_name(raw.algorithm)),
            )
        })
    };
    let duration = |key: &str, value: &Option<String>| -> Result<Duration, ConfigError> {
        match value {
            Some(text) => parse_duration(text).map_err(|reason| fail(key, reason)),
            None => Err(fail(
                key,
                format!("required by algorithm `{}`", algorithm_name(raw.algorithm)),
            )),
        }
    };
    let unused = |key: &str, present: bool| {
        if present {
            Err(fail(
                key,
                format!("not used by algorithm `{}`", algorithm_name(raw.algorithm)),
            ))
        } else {
            Ok(())
        }
    };
    let rate_based = matches!(
        raw.algorithm,
        AlgorithmName::TokenBucket
            | AlgorithmName::Gcra
            | AlgorithmName::LeakyBucketPolice
            | AlgorithmName::LeakyBucketShape
    );
    let policy = if rate_based {
        unused("limit", raw.limit.is_some())?;
        unused("window", raw.window.is_some())?;
        let rate = required("rate", raw.rate)?;
        let period = duration("period", &raw.period)?;
        match raw.algorithm {
            AlgorithmName::LeakyBucketShape => {
                unused("burst", raw.burst.is_some())?;
                let max_wait = duration("max_wait", &raw.max_wait)?;
                Policy::leaky_bucket_shape(rate, period, max_wait)
            }
            algorithm => {
                unused("max_wait", raw.max_wait.is_some())?;
                let burst = required("burst", raw.burst)?;
                match algorithm {
                    AlgorithmName::TokenBucket => Policy::token_bucket(rate, period, burst),
                    AlgorithmName::Gcra => Policy::gcra(rate, period, burst),
                    _ => Policy::leaky_bucket_police(rate, period, burst),
                }
            }
        }
    } else {
        for key in ["rate", "period", "burst", "max_wait"] {
            let present = match key {
                "rate" => raw.rate.is_some(),
                "period" => raw.period.is_some(),
                "burst" => raw.burst.is_some(),
                _ => raw.max_wait.is_some(),
            };
            unused(key, present)?;
        }
        let limit = required("limit", raw.limit)?;
        let window = duration("window", &raw.window)?;
        let global = raw.backend == Backend::Mesh;
        match raw.algorithm {
            AlgorithmName::FixedWindow if global => Policy::global_fixed_window(limit, window),
            AlgorithmName::FixedWindow => Policy::fixed_window(limit, window),
            AlgorithmName::SlidingLog => Policy::sliding_log(limit, window),
            _ if global => Policy::global_sliding_window(limit, window),
            _ => Policy::sliding_window(limit, window),
        }
    }
    .map_err(|error| {
        let key = policy_error_field(&error);
        fail(key, error.to_string())
    })?;

    let time_zone = match &raw.time_zone {
        None => None,
        Some(zone) => {
            if policy.algorithm() != Algorithm::FixedWindow {
                return Err(fail(
                    "time_zone",
                    "only a fixed window has calendar boundaries to place in a time zone".into(),
                ));
            }
            let tz = TimeZone::get(zone)
                .map_err(|e| fail("time_zone", format!("unknown time zone `{zone}`: {e}")))?;
            Some(tz)
        }
    };
    match raw.backend {
        Backend::Local => {}
        Backend::Mesh => {
            if !has_key_secret {
                return Err(fail(
                    "backend",
                    "backend `mesh` needs a top-level `key_secret`, the same on every node, so that a client has one key cluster-wide".into(),
                ));
            }
            if raw.shadow {
                return Err(fail(
                    "shadow",
                    "a shadow policy cannot use the `mesh` backend".into(),
                ));
            }
            if !cfg!(feature = "mesh") {
                return Err(fail(
                    "backend",
                    "backend `mesh` needs ratemesh built with its `mesh` feature".into(),
                ));
            }
            #[cfg(feature = "mesh")]
            if crate::mesh::MeshKind::of(&policy).is_none() {
                return Err(fail(
                    "algorithm",
                    "the mesh shares token-bucket, gcra, fixed-window and sliding-window policies"
                        .into(),
                ));
            }
            if raw.time_zone.is_some() {
                return Err(fail(
                    "time_zone",
                    "time zones are not supported by the `mesh` backend (its windows are UTC)"
                        .into(),
                ));
            }
        }
        Backend::Redis => {
            if !has_redis {
                return Err(fail(
                    "backend",
                    "backend `redis` needs a `[redis]` section with `url` or `cluster`".into(),
                ));
            }
            if raw.shadow {
                return Err(fail(
                    "shadow",
                    "a shadow policy cannot use the `redis` backend".into(),
                ));
            }
            if matches!(
                policy.algorithm(),
                Algorithm::LeakyBucketPolice | Algorithm::LeakyBucketShape { .. }
            ) {
                return Err(fail("algorithm", "the leaky buckets have no Redis script; use token-bucket, gcra, fixed-window, sliding-window or sliding-log".into()));
            }
            let unit_ns = if policy.algorithm().is_rate_based() {
                policy.interval_ns()
            } else {
                policy.window_ns()
            };
            if unit_ns % 1000 != 0 {
                let key = if policy.algorithm().is_rate_based() {
                    "rate"
                } else {
                    "window"
                };
                return Err(fail(
                    key,
                    format!(
                        "Redis keeps time in microseconds; this policy's {} ns is not a whole number of them",
                        unit_ns
                    ),
                ));
            }
            if raw.time_zone.is_some() {
                return Err(fail(
                    "time_zone",
                    "time zones are not supported by the `redis` backend (its windows are UTC)"
                        .into(),
                ));
            }
        }
    }
    let token_cache = match &raw.token_cache {
        None => None,
        Some(cache) => Some(token_cache_config(cache, raw.backend, &policy, &fail)?),
    };
    Ok(NamedPolicy {
        name: name.to_string(),
        policy,
        backend: raw.backend,
        fail_mode: raw.fail_mode,
        shadow: raw.shadow,
        time_zone,
        token_cache,
    })
}

/// Validate a policy's `token_cache` table (errors point at `token_cache`).
fn token_cache_config(
    raw: &RawTokenCache,
    backend: Backend,
    policy: &Policy,
    fail: &dyn Fn(&str, String) -> ConfigError,
) -> Result<TokenCacheConfig, ConfigError> {
    if backend != Backend::Redis {
        return Err(fail(
            "token_cache",
            "a token cache sits in front of Redis: it needs `backend = \"redis\"`".into(),
        ));
    }
    if !matches!(policy.algorithm(), Algorithm::TokenBucket | Algorithm::Gcra) {
        return Err(fail(
            "token_cache",
            format!(
                "a token cache needs a token-bucket or gcra policy, not {}",
                policy.algorithm().name()
            ),
        ));
    }
    if raw.batch == 0 || raw.batch >= policy.capacity() {
        return Err(fail(
            "token_cache",
            format!(
                "batch = {} must be at least 1 and below the burst ({})",
                raw.batch,
                policy.capacity()
            ),
        ));
    }
    let ttl = parse_duration(&raw.ttl).map_err(|reason| fail("token_cache", reason))?;
    if ttl.is_zero() {
        return Err(fail(
            "token_cache",
            "ttl must be above zero (leave `token_cache` out to turn the cache off)".into(),
        ));
    }
    if ttl > MAX_TOKEN_CACHE_TTL {
        return Err(fail(
            "token_cache",
            format!(
                "ttl = \"{}\" is longer than {} s: cached tokens may be spent up to a ttl late, so the cache can admit rate × ttl more than the policy in an interval",
                raw.ttl,
                MAX_TOKEN_CACHE_TTL.as_secs()
            ),
        ));
    }
    Ok(TokenCacheConfig {
        batch: raw.batch,
        ttl,
    })
}

fn algorithm_name(algorithm: AlgorithmName) -> &'static str {
    match algorithm {
        AlgorithmName::TokenBucket => "token-bucket",
        AlgorithmName::Gcra => "gcra",
        AlgorithmName::LeakyBucketPolice => "leaky-bucket-police",
        AlgorithmName::LeakyBucketShape => "leaky-bucket-shape",
        AlgorithmName::FixedWindow => "fixed-window",
        AlgorithmName::SlidingLog => "sliding-log",
        AlgorithmName::SlidingWindow => "sliding-window",
    }
}

/// The config key that a policy validation error is about.
fn policy_error_field(error: &PolicyError) -> &'static str {
    match error {
        PolicyError::Zero { field } | PolicyError::TooLarge { field, .. } => field,
        PolicyError::RateTooHigh { .. } => "rate",
        PolicyError::CostExceedsCapacity { .. } => "burst",
    }
}

fn build_route(
    source: &Source<'_>,
    spanned: &Spanned<RawRoute>,
    policies: &[NamedPolicy],
    tiers: &BTreeMap<String, Vec<String>>,
) -> Result<RouteRule, ConfigError> {
    let raw = spanned.get_ref();
    let span = spanned.span();
    let at = |key: &str| source.line_of_key(span.clone(), key);
    let field = |key: &str| format!("routes.{}.{key}", raw.name);
    let method = match &raw.method {
        None => None,
        Some(text) if text == "*" || text.eq_ignore_ascii_case("any") => None,
        Some(text) => Some(
            Method::from_bytes(text.to_ascii_uppercase().as_bytes()).map_err(|_| {
                source.error(
                    at("method"),
                    field("method"),
                    format!("`{text}` is not an HTTP method"),
                )
            })?,
        ),
    };
    if !raw.path_prefix.starts_with('/') {
        return Err(source.error(
            at("path_prefix"),
            field("path_prefix"),
            "must start with `/`",
        ));
    }
    for name in &raw.policies {
        if !policies.iter().any(|p| &p.name == name) {
            return Err(source.error(
                at("policies"),
                field("policies"),
                format!("no policy named `{name}`"),
            ));
        }
    }
    // The cost must fit every policy this route can meet: its own and every tier's.
    let applicable = raw
        .policies
        .iter()
        .chain(tiers.values().flatten())
        .filter_map(|name| policies.iter().find(|p| &p.name == name));
    for named in applicable {
        named.policy.validate_cost(raw.cost).map_err(|error| {
            source.error(
                at("cost"),
                field("cost"),
                format!("{error} (policy `{}`)", named.name),
            )
        })?;
    }
    Ok(RouteRule {
        name: raw.name.clone(),
        method,
        path_prefix: raw.path_prefix.trim_end_matches('/').to_string(),
        cost: raw.cost,
        policies: raw.policies.clone(),
    })
}
