//! `[policies.NAME]`: one named policy (algorithm and limits, backend, fail mode, shadow,
//! time zone, token cache), validated with errors that name the field.

use std::time::Duration;

use jiff::tz::TimeZone;
use serde::Deserialize;
use toml::Spanned;

use super::key::{CountBy, OnMissing};
use super::outcome::{RawCountWhen, StatusSet};
use super::source::{ConfigError, Source, parse_duration};
use crate::policy::{Algorithm, Policy, PolicyError};

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
    /// Windows are calendar periods (`calendar` with `time_zone`): days, ISO weeks, months
    /// or years of the zone's calendar.
    pub(crate) calendar: Option<crate::algorithm::calendar::CalendarWindow>,
    /// A per-node cache of tokens granted by Redis (`redis` buckets only); `None` = off.
    pub token_cache: Option<TokenCacheConfig>,
    /// What it counts by (`by`); `None`: the client, and for a route's policies the client
    /// and the route.
    pub by: Option<CountBy>,
    /// What happens to a request that lacks a part of `by`.
    pub on_missing: OnMissing,
    /// Count a request only when its response has one of these statuses (`count_when`):
    /// its tokens are taken before it runs and given back after, otherwise.
    pub count_when: Option<StatusSet>,
    /// Once the policy denies a key, deny it for this long (`block_for`, a lockout).
    pub block_for: Option<Duration>,
    /// A concurrency policy (`algorithm = "concurrency"`): each admitted request holds its
    /// cost in slots until its response ends (its body sent, the client gone, or the
    /// service failed), at most this long (`max_hold`), after which the slot is reclaimed.
    pub max_hold: Option<Duration>,
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

/// A concurrency policy's `max_hold` unless the file gives one.
pub const DEFAULT_MAX_HOLD: Duration = Duration::from_secs(5 * 60);

/// The longest `max_hold`.
pub const MAX_MAX_HOLD: Duration = Duration::from_secs(24 * 3600);

/// The longest `block_for`.
pub const MAX_BLOCK_FOR: Duration = Duration::from_secs(7 * 24 * 3600);

/// The longest `token_cache.ttl`: the cache may admit up to `rate · ttl` more than the policy
/// in an interval, so it is kept short.
pub const MAX_TOKEN_CACHE_TTL: Duration = Duration::from_secs(10);

pub(super) fn build_policy(
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
    let calendar: Option<crate::algorithm::calendar::Calendar> = match &raw.calendar {
        None => None,
        Some(text) => Some(text.parse().map_err(
            |e: crate::algorithm::calendar::ParseCalendarError| fail("calendar", e.to_string()),
        )?),
    };
    let policy = if rate_based {
        unused("calendar", calendar.is_some())?;
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
        if raw.algorithm == AlgorithmName::Concurrency {
            unused("window", raw.window.is_some())?;
            unused("calendar", calendar.is_some())?;
        } else {
            unused("max_hold", raw.max_hold.is_some())?;
        }
        let window = match calendar {
            Some(calendar) => {
                if raw.window.is_some() {
                    return Err(fail(
                        "window",
                        "give `calendar` (a calendar period) or `window` (a length), not both"
                            .into(),
                    ));
                }
                if !matches!(
                    raw.algorithm,
                    AlgorithmName::FixedWindow | AlgorithmName::SlidingWindow
                ) {
                    return Err(fail(
                        "calendar",
                        "calendar periods are for fixed-window and sliding-window policies".into(),
                    ));
                }
                Duration::from_nanos(calendar.nominal_ns())
            }
            None if raw.algorithm == AlgorithmName::Concurrency => {
                let hold = match &raw.max_hold {
                    Some(text) => parse_duration(text).map_err(|r| fail("max_hold", r))?,
                    None => DEFAULT_MAX_HOLD,
                };
                if hold < Duration::from_secs(1) || hold > MAX_MAX_HOLD {
                    return Err(fail(
                        "max_hold",
                        format!("between 1s and {MAX_MAX_HOLD:?}, got {hold:?}"),
                    ));
                }
                hold
            }
            None => duration("window", &raw.window)?,
        };
        let global = raw.backend == Backend::Mesh;
        match raw.algorithm {
            AlgorithmName::FixedWindow if global => Policy::global_fixed_window(limit, window),
            AlgorithmName::FixedWindow => Policy::fixed_window(limit, window),
            // Slots as entries of a log of the last `max_hold`: a response's end takes its
            // entry out, and an entry left past `max_hold` leaves by itself.
            AlgorithmName::SlidingLog | AlgorithmName::Concurrency => {
                Policy::sliding_log(limit, window)
            }
            _ if global => Policy::global_sliding_window(limit, window),
            _ => Policy::sliding_window(limit, window),
        }
    }
    .map_err(|error| {
        let key = policy_error_field(&error);
        fail(key, error.to_string())
    })?;

    let calendar = match calendar {
        None => None,
        Some(calendar) => {
            let zone = raw.time_zone.as_deref().unwrap_or("UTC");
            Some(
                crate::algorithm::calendar::CalendarWindow::from_zone_name(calendar, zone)
                    .map_err(|e| fail("time_zone", e.to_string()))?,
            )
        }
    };
    let time_zone = match &raw.time_zone {
        // The calendar's.
        Some(_) if calendar.is_some() => None,
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
            if raw.algorithm == AlgorithmName::Concurrency {
                return Err(fail(
                    "backend",
                    "the mesh does not share concurrency policies: use `local` (per node) or \
                     `redis` (cluster-wide)"
                        .into(),
                ));
            }
            #[cfg(feature = "mesh")]
            if !policy.algorithm().is_shared_by_mesh() {
                return Err(fail(
                    "algorithm",
                    "the mesh shares token-bucket, gcra, fixed-window and sliding-window policies"
                        .into(),
                ));
            }
            if raw.time_zone.is_some() && calendar.is_none() {
                return Err(fail(
                    "time_zone",
                    "time zones are not supported by the `mesh` backend's windows of a length \
                     (they are UTC); its `calendar` periods take one"
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
            if raw.time_zone.is_some() && calendar.is_none() {
                return Err(fail(
                    "time_zone",
                    "time zones are not supported by the `redis` backend's windows of a length \
                     (they are UTC); its `calendar` periods take one"
                        .into(),
                ));
            }
        }
    }
    let token_cache = match &raw.token_cache {
        None => None,
        Some(cache) => Some(token_cache_config(cache, raw.backend, &policy, &fail)?),
    };
    let by = match &raw.by {
        None => None,
        Some(list) => Some(CountBy::parse(list).map_err(|reason| fail("by", reason))?),
    };
    if raw.on_missing.is_some() && by.is_none() {
        return Err(fail(
            "on_missing",
            "applies to the parts a policy counts `by`: give `by` too (the client of the \
             identity chain is never missing)"
                .into(),
        ));
    }
    let count_when = match &raw.count_when {
        None => None,
        Some(raw_when) => {
            if matches!(policy.algorithm(), Algorithm::LeakyBucketShape { .. }) {
                return Err(fail(
                    "count_when",
                    "a shaping policy reserves a slot it never gives back".into(),
                ));
            }
            Some(
                raw_when
                    .build()
                    .map_err(|reason| fail("count_when", reason))?,
            )
        }
    };
    let block_for = match &raw.block_for {
        None => None,
        Some(text) => {
            let block = parse_duration(text).map_err(|reason| fail("block_for", reason))?;
            if block.is_zero() || block > MAX_BLOCK_FOR {
                return Err(fail(
                    "block_for",
                    format!("between 1s and {MAX_BLOCK_FOR:?}, got {block:?}"),
                ));
            }
            if raw.shadow {
                return Err(fail(
                    "block_for",
                    "a shadow policy never denies, so it never locks a key out".into(),
                ));
            }
            if token_cache.is_some() {
                return Err(fail(
                    "block_for",
                    "a token cache asks Redis for a batch, whose denial would lock the key \
                     out when the request alone fits: give one or the other"
                        .into(),
                ));
            }
            Some(block)
        }
    };
    // A concurrency policy's log is as long as its `max_hold`.
    let max_hold = (raw.algorithm == AlgorithmName::Concurrency)
        .then(|| Duration::from_nanos(policy.window_ns()));
    if max_hold.is_some() {
        let refused = [
            (
                raw.shadow,
                "shadow",
                "a concurrency policy enforces or is left out",
            ),
            (
                raw.count_when.is_some(),
                "count_when",
                "a concurrency policy gives every slot back when the response ends, whatever its status",
            ),
            (
                raw.block_for.is_some(),
                "block_for",
                "a concurrency policy locks no key out",
            ),
        ];
        if let Some((_, key, reason)) = refused.into_iter().find(|(bad, ..)| *bad) {
            return Err(fail(key, reason.into()));
        }
    }
    Ok(NamedPolicy {
        name: name.to_string(),
        policy,
        backend: raw.backend,
        fail_mode: raw.fail_mode,
        shadow: raw.shadow,
        time_zone,
        calendar,
        token_cache,
        by,
        on_missing: raw.on_missing.unwrap_or_default(),
        count_when,
        block_for,
        max_hold,
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
        AlgorithmName::Concurrency => "concurrency",
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

/// The algorithms as the file names them.
#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
enum AlgorithmName {
    TokenBucket,
    Gcra,
    LeakyBucketPolice,
    LeakyBucketShape,
    FixedWindow,
    SlidingLog,
    SlidingWindow,
    Concurrency,
}

/// A `[policies.NAME]` table as the file spells it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPolicy {
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
    calendar: Option<String>,
    token_cache: Option<RawTokenCache>,
    by: Option<Vec<String>>,
    on_missing: Option<OnMissing>,
    count_when: Option<RawCountWhen>,
    block_for: Option<String>,
    max_hold: Option<String>,
}

/// A policy's `token_cache` as the file spells it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTokenCache {
    batch: u64,
    ttl: String,
}
