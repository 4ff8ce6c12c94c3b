//! `[envoy]`: the domains and descriptors that Envoy's rate limit service API decides (a
//! node's `[envoy_rls]` port), in the spirit of envoyproxy/ratelimit's configuration.
//!
//! ```toml
//! [envoy]
//! backend = "mesh"                 # where inline limits count: "local" (default), "mesh", "redis"
//!
//! [[envoy.domains]]
//! domain = "edge"
//!
//! [[envoy.domains.descriptors]]    # ("remote_address", any value): 100 a minute per address
//! key = "remote_address"
//! rate_limit = { requests_per_unit = 100, unit = "minute" }
//!
//! [[envoy.domains.descriptors]]    # ("api_key", any value): a policy of this file
//! key = "api_key"
//! policy = "per_key"
//!
//! [[envoy.domains.descriptors]]    # ("path", "/login") then ("remote_address", any value)
//! key = "path"
//! value = "/login"
//! descriptors = [
//!   { key = "remote_address", rate_limit = { requests_per_unit = 5, unit = "minute" } },
//! ]
//! ```
//!
//! A descriptor without `value` matches every value of its key, and each value gets its own
//! counter. An inline `rate_limit` becomes a fixed-window policy named after its path
//! (`edge/remote_address`, `edge/path=/login/remote_address`) on the `backend` of the
//! descriptor or of `[envoy]`; `policy` names a `[policies.NAME]` of the file, whatever its
//! backend.

use std::collections::BTreeSet;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::named_policy::{Backend, FailMode, NamedPolicy};
use super::source::{ConfigError, Source};
use crate::policy::{Algorithm, Policy};

/// The deepest descriptor tree (entries in one descriptor) the file may describe.
pub const MAX_DESCRIPTOR_DEPTH: usize = 16;
/// The most descriptors (at every depth, every domain) a file may describe.
pub(super) const MAX_DESCRIPTORS: usize = 10_000;
/// The longest domain, descriptor key or value in the file, in bytes.
pub(super) const MAX_NAME_BYTES: usize = 256;

/// The `[envoy]` section: domains of descriptors.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EnvoyConfig {
    /// The domains, in file order.
    pub domains: Vec<EnvoyDomain>,
}

/// One `[[envoy.domains]]` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvoyDomain {
    /// The domain Envoy names in its requests.
    pub domain: String,
    /// Its top-level descriptors.
    pub descriptors: Vec<EnvoyDescriptor>,
}

/// One descriptor of a domain: an entry `(key, value)` to match, what a request whose
/// descriptor ends here meets, and the descriptors nested under it.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvoyDescriptor {
    /// The entry's key.
    pub key: String,
    /// The entry's value; `None` matches every value (each with its own counter).
    pub value: Option<String>,
    /// What a descriptor that ends here meets.
    pub limit: DescriptorLimit,
    /// Descriptors one entry deeper.
    pub descriptors: Vec<EnvoyDescriptor>,
}

/// What a descriptor that ends at a configured descriptor meets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DescriptorLimit {
    /// Nothing: only its nested descriptors limit (a descriptor ending here is unknown).
    None,
    /// A named policy of the file (an inline `rate_limit` is one, named after its path).
    Policy {
        /// The policy's name.
        name: String,
        /// `shadow_mode`: counted and reported, never over the limit.
        shadow: bool,
        /// The unit an inline limit was written with (`None`: a named policy).
        unit: Option<RateLimitUnit>,
    },
    /// `unlimited = true`: never limited.
    Unlimited,
}

/// The units of an inline `rate_limit`, as Envoy's API names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateLimitUnit {
    /// One second.
    Second,
    /// One minute.
    Minute,
    /// One hour.
    Hour,
    /// One day (UTC).
    Day,
    /// Seven days.
    Week,
    /// Thirty days.
    Month,
    /// 365 days.
    Year,
}

impl RateLimitUnit {
    const ALL: [RateLimitUnit; 7] = [
        RateLimitUnit::Second,
        RateLimitUnit::Minute,
        RateLimitUnit::Hour,
        RateLimitUnit::Day,
        RateLimitUnit::Week,
        RateLimitUnit::Month,
        RateLimitUnit::Year,
    ];

    /// The unit's length in seconds (a month is 30 days, a year 365).
    pub fn seconds(self) -> u64 {
        match self {
            RateLimitUnit::Second => 1,
            RateLimitUnit::Minute => 60,
            RateLimitUnit::Hour => 3600,
            RateLimitUnit::Day => 86_400,
            RateLimitUnit::Week => 7 * 86_400,
            RateLimitUnit::Month => 30 * 86_400,
            RateLimitUnit::Year => 365 * 86_400,
        }
    }

    /// The unit's name in the file (`second`, …).
    pub fn name(self) -> &'static str {
        match self {
            RateLimitUnit::Second => "second",
            RateLimitUnit::Minute => "minute",
            RateLimitUnit::Hour => "hour",
            RateLimitUnit::Day => "day",
            RateLimitUnit::Week => "week",
            RateLimitUnit::Month => "month",
            RateLimitUnit::Year => "year",
        }
    }

    /// The unit whose length is exactly `window_ns`, if any.
    pub fn of_window(window_ns: u64) -> Option<RateLimitUnit> {
        Self::ALL
            .into_iter()
            .find(|unit| unit.seconds().checked_mul(1_000_000_000) == Some(window_ns))
    }

    fn parse(text: &str) -> Option<RateLimitUnit> {
        Self::ALL
            .into_iter()
            .find(|unit| unit.name().eq_ignore_ascii_case(text))
    }
}

/// The `[envoy]` table as the file spells it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEnvoy {
    backend: Option<Backend>,
    #[serde(default)]
    domains: Vec<Spanned<RawDomain>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDomain {
    domain: String,
    #[serde(default)]
    descriptors: Vec<Spanned<RawDescriptor>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDescriptor {
    key: String,
    value: Option<String>,
    rate_limit: Option<RawRateLimit>,
    policy: Option<String>,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    unlimited: bool,
    backend: Option<Backend>,
    #[serde(default)]
    descriptors: Vec<Spanned<RawDescriptor>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRateLimit {
    requests_per_unit: u64,
    unit: String,
}

/// What building the descriptors needs from the rest of the file.
pub(super) struct Context<'a> {
    pub(super) source: &'a Source<'a>,
    /// The file's named policies; inline limits are added to them.
    pub(super) policies: &'a mut Vec<NamedPolicy>,
    pub(super) has_redis: bool,
    pub(super) has_key_secret: bool,
}

/// Validate `[envoy]`; add a policy for each inline `rate_limit` to `cx.policies`.
pub(super) fn build_envoy(
    cx: &mut Context<'_>,
    raw: &Spanned<RawEnvoy>,
) -> Result<EnvoyConfig, ConfigError> {
    let source = cx.source;
    let envoy = raw.get_ref();
    let default_backend = envoy.backend.unwrap_or_default();
    let mut seen = BTreeSet::new();
    let mut count = 0;
    let mut domains = Vec::with_capacity(envoy.domains.len());
    for (i, spanned) in envoy.domains.iter().enumerate() {
        let domain = spanned.get_ref();
        let line = source.line_of_key(spanned.span(), "domain");
        let field = format!("envoy.domains[{i}].domain");
        check_name(&domain.domain).map_err(|reason| source.error(line, &field, reason))?;
        if !seen.insert(domain.domain.clone()) {
            return Err(source.error(
                line,
                field,
                format!("a second domain `{}`; each domain once", domain.domain),
            ));
        }
        let mut walk = Walk {
            cx: &mut *cx,
            default_backend,
            count: &mut count,
        };
        let descriptors = walk.level(
            &domain.descriptors,
            &format!("envoy.domains[{i}].descriptors"),
            &domain.domain,
            0,
        )?;
        if descriptors.is_empty() {
            return Err(source.error(
                source.line_of(spanned.span().start),
                format!("envoy.domains[{i}].descriptors"),
                format!("domain `{}` has no descriptors", domain.domain),
            ));
        }
        domains.push(EnvoyDomain {
            domain: domain.domain.clone(),
            descriptors,
        });
    }
    Ok(EnvoyConfig { domains })
}

/// A domain's descriptors on their way to the compiled form.
struct Walk<'c, 'a> {
    cx: &'c mut Context<'a>,
    default_backend: Backend,
    count: &'c mut usize,
}

impl Walk<'_, '_> {
    /// Build one level of descriptors; `field` is its dotted path, `path` the policy name
    /// prefix (domain and the entries above), `depth` the entries above.
    fn level(
        &mut self,
        raw: &[Spanned<RawDescriptor>],
        field: &str,
        path: &str,
        depth: usize,
    ) -> Result<Vec<EnvoyDescriptor>, ConfigError> {
        let source = self.cx.source;
        let mut seen = BTreeSet::new();
        let mut out = Vec::with_capacity(raw.len());
        for (i, spanned) in raw.iter().enumerate() {
            let d = spanned.get_ref();
            let span = spanned.span();
            let at = |key: &str| source.line_of_key(span.clone(), key);
            let field = format!("{field}[{i}]");
            let fail =
                |key: &str, reason: String| source.error(at(key), format!("{field}.{key}"), reason);
            *self.count += 1;
            if *self.count > MAX_DESCRIPTORS {
                return Err(fail(
                    "key",
                    format!("more than {MAX_DESCRIPTORS} descriptors in the file"),
                ));
            }
            if depth >= MAX_DESCRIPTOR_DEPTH {
                return Err(fail(
                    "descriptors",
                    format!("descriptors nest at most {MAX_DESCRIPTOR_DEPTH} deep"),
                ));
            }
            check_name(&d.key).map_err(|reason| fail("key", reason))?;
            if let Some(value) = &d.value {
                check_name(value).map_err(|reason| fail("value", reason))?;
            }
            if !seen.insert((d.key.clone(), d.value.clone())) {
                return Err(fail(
                    "key",
                    format!(
                        "a second descriptor for `{}`{} at this level",
                        d.key,
                        d.value
                            .as_ref()
                            .map_or_else(|| " (any value)".to_string(), |v| format!(" = `{v}`"))
                    ),
                ));
            }
            let segment = match &d.value {
                Some(value) => format!("{}={value}", d.key),
                None => d.key.clone(),
            };
            let here = format!("{path}/{segment}");
            let given = [d.rate_limit.is_some(), d.policy.is_some(), d.unlimited];
            let mut named = ["rate_limit", "policy", "unlimited"]
                .into_iter()
                .zip(given)
                .filter_map(|(name, g)| g.then_some(name));
            if let (Some(first), Some(second)) = (named.next(), named.next()) {
                return Err(fail(
                    second,
                    format!(
                        "`{second}` with `{first}`: give one of `rate_limit`, `policy` and \
                         `unlimited = true`"
                    ),
                ));
            }
            if d.backend.is_some() && d.rate_limit.is_none() {
                return Err(fail(
                    "backend",
                    "`backend` says where an inline `rate_limit` counts; a `policy` has its own"
                        .into(),
                ));
            }
            if d.shadow_mode && !given[0] && !given[1] {
                return Err(fail(
                    "shadow_mode",
                    "shadow mode needs a `rate_limit` or a `policy` to count".into(),
                ));
            }
            let limit = if let Some(rate) = &d.rate_limit {
                self.inline(rate, d, &here, &fail)?
            } else if let Some(name) = &d.policy {
                self.named(name, d.shadow_mode, &fail)?
            } else if d.unlimited {
                DescriptorLimit::Unlimited
            } else {
                DescriptorLimit::None
            };
            let descriptors = self.level(
                &d.descriptors,
                &format!("{field}.descriptors"),
                &here,
                depth + 1,
            )?;
            if limit == DescriptorLimit::None && descriptors.is_empty() {
                return Err(fail(
                    "key",
                    format!(
                        "descriptor `{segment}` limits nothing: give it a `rate_limit`, a \
                         `policy`, `unlimited = true` or nested `descriptors`"
                    ),
                ));
            }
            out.push(EnvoyDescriptor {
                key: d.key.clone(),
                value: d.value.clone(),
                limit,
                descriptors,
            });
        }
        Ok(out)
    }

    /// An inline `rate_limit`: a fixed window of the unit, added to the file's policies.
    fn inline(
        &mut self,
        rate: &RawRateLimit,
        d: &RawDescriptor,
        name: &str,
        fail: &dyn Fn(&str, String) -> ConfigError,
    ) -> Result<DescriptorLimit, ConfigError> {
        let unit = RateLimitUnit::parse(&rate.unit).ok_or_else(|| {
            fail(
                "rate_limit",
                format!(
                    "`{}` is not a unit; write one of second, minute, hour, day, week, month \
                     (30 days), year (365 days)",
                    rate.unit
                ),
            )
        })?;
        if rate.requests_per_unit == 0 || rate.requests_per_unit > u64::from(u32::MAX) - 1 {
            return Err(fail(
                "rate_limit",
                format!(
                    "requests_per_unit = {}: between 1 and {}",
                    rate.requests_per_unit,
                    u32::MAX - 1
                ),
            ));
        }
        let backend = d.backend.unwrap_or(self.default_backend);
        let window = Duration::from_secs(unit.seconds());
        if d.shadow_mode && backend != Backend::Local {
            return Err(fail(
                "shadow_mode",
                format!(
                    "a shadow descriptor is counted on each node: it cannot use the `{}` \
                     backend (set `backend = \"local\"` on it)",
                    backend_name(backend)
                ),
            ));
        }
        match backend {
            Backend::Local => {}
            Backend::Mesh => {
                if !self.cx.has_key_secret {
                    return Err(fail(
                        "rate_limit",
                        "backend `mesh` needs a top-level `key_secret`, the same on every node"
                            .into(),
                    ));
                }
                if !cfg!(feature = "mesh") {
                    return Err(fail(
                        "rate_limit",
                        "backend `mesh` needs ratemesh built with its `mesh` feature".into(),
                    ));
                }
            }
            Backend::Redis => {
                if !self.cx.has_redis {
                    return Err(fail(
                        "rate_limit",
                        "backend `redis` needs a `[redis]` section with `url` or `cluster`".into(),
                    ));
                }
            }
        }
        let policy = if backend == Backend::Mesh {
            Policy::global_fixed_window(rate.requests_per_unit, window)
        } else {
            Policy::fixed_window(rate.requests_per_unit, window)
        }
        .map_err(|e| fail("rate_limit", e.to_string()))?;
        if self.cx.policies.iter().any(|p| p.name == name) {
            return Err(fail(
                "rate_limit",
                format!(
                    "the inline limit is named `{name}`, which a `[policies]` entry of the file \
                     already uses; rename that policy"
                ),
            ));
        }
        self.cx.policies.push(NamedPolicy {
            name: name.to_string(),
            policy,
            backend,
            fail_mode: FailMode::default(),
            shadow: d.shadow_mode,
            time_zone: None,
            calendar: None,
            max_hold: None,
            token_cache: None,
            by: None,
            on_missing: Default::default(),
            count_when: None,
            block_for: None,
        });
        Ok(DescriptorLimit::Policy {
            name: name.to_string(),
            shadow: d.shadow_mode,
            unit: Some(unit),
        })
    }

    /// `policy = "NAME"`: a policy of the file.
    fn named(
        &self,
        name: &str,
        shadow_mode: bool,
        fail: &dyn Fn(&str, String) -> ConfigError,
    ) -> Result<DescriptorLimit, ConfigError> {
        let Some(named) = self.cx.policies.iter().find(|p| p.name == name) else {
            return Err(fail("policy", format!("no policy named `{name}`")));
        };
        if named.count_when.is_some() {
            return Err(fail(
                "policy",
                format!(
                    "policy `{name}` counts by the response's status (`count_when`), which \
                     Envoy's rate limit service never sees: name another policy"
                ),
            ));
        }
        if named.by.is_some() {
            return Err(fail(
                "policy",
                format!(
                    "policy `{name}` counts `by` parts of an HTTP request; under Envoy the \
                     descriptor is the key: name a policy without `by`"
                ),
            ));
        }
        if matches!(named.policy.algorithm(), Algorithm::LeakyBucketShape { .. }) {
            return Err(fail(
                "policy",
                format!(
                    "policy `{name}` shapes (it delays requests); Envoy's API answers at once: \
                     use another algorithm"
                ),
            ));
        }
        if shadow_mode && named.backend != Backend::Local {
            return Err(fail(
                "shadow_mode",
                format!(
                    "policy `{name}` uses the `{}` backend; a shadow descriptor needs a local \
                     policy",
                    backend_name(named.backend)
                ),
            ));
        }
        Ok(DescriptorLimit::Policy {
            name: name.to_string(),
            shadow: shadow_mode || named.shadow,
            unit: None,
        })
    }
}

fn backend_name(backend: Backend) -> &'static str {
    match backend {
        Backend::Local => "local",
        Backend::Mesh => "mesh",
        Backend::Redis => "redis",
    }
}

/// A domain, key or value as the file may write it: 1 to [`MAX_NAME_BYTES`] bytes, no
/// control characters.
fn check_name(text: &str) -> Result<(), String> {
    if text.is_empty() {
        return Err("must not be empty".into());
    }
    if text.len() > MAX_NAME_BYTES {
        return Err(format!("{} bytes; at most {MAX_NAME_BYTES}", text.len()));
    }
    if text.chars().any(char::is_control) {
        return Err("must not contain control characters".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_are_named_and_found_by_their_length() {
        assert_eq!(RateLimitUnit::parse("MINUTE"), Some(RateLimitUnit::Minute));
        assert_eq!(RateLimitUnit::parse("fortnight"), None);
        assert_eq!(
            RateLimitUnit::of_window(3_600_000_000_000),
            Some(RateLimitUnit::Hour)
        );
        assert_eq!(RateLimitUnit::of_window(90_000_000_000), None);
    }
}
