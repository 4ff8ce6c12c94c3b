//! The check that a policy file limits something: a file under which requests would pass
//! no enforced policy is refused unless it says `allow_unlimited = true`.

use std::collections::BTreeMap;

use super::named_policy::NamedPolicy;
use super::routes::RouteRule;
use super::source::{ConfigError, Source};

/// Refuse a file under which requests would pass no enforced policy at all, unless it says
/// `allow_unlimited = true`: no tier or route enforces anything, or a client that matches no
/// tier (no `default_tier`, no `no_tier = "refuse"`, or a default tier that enforces
/// nothing) meets no enforced policy on some route, or on a path no route covers. A file
/// with Envoy domains (`envoy`) and neither tiers nor routes limits through Envoy's API only.
pub(super) fn check_limits_something(
    source: &Source<'_>,
    policies: &[NamedPolicy],
    tiers: &BTreeMap<String, Vec<String>>,
    default_tier: Option<&str>,
    refuse_without_tier: bool,
    routes: &[RouteRule],
    envoy: bool,
) -> Result<(), ConfigError> {
    if envoy && tiers.is_empty() && routes.is_empty() {
        return Ok(());
    }
    let enforces = |names: &[String]| {
        names
            .iter()
            .any(|name| policies.iter().any(|p| &p.name == name && !p.shadow))
    };
    let how = "name a `default_tier` whose policies apply to every other client, set \
               `no_tier = \"refuse\"`, or say `allow_unlimited = true` if that is what you want";
    let nothing_anywhere =
        !tiers.values().any(|t| enforces(t)) && !routes.iter().any(|r| enforces(&r.policies));
    if nothing_anywhere {
        return Err(source.error(
            1,
            "allow_unlimited",
            "no request can ever be limited: no tier and no route has a policy that is \
             enforced (not shadow); add one, or say `allow_unlimited = true` if that is what you want",
        ));
    }
    if refuse_without_tier
        || default_tier.is_some_and(|t| tiers.get(t).is_some_and(|p| enforces(p)))
    {
        return Ok(());
    }
    let who = match default_tier {
        Some(tier) => format!("clients that match no tier get tier `{tier}`, which enforces no policy;"),
        None => "clients that match no tier (there is no `default_tier`) pass only their route's policies;".to_string(),
    };
    if let Some(route) = routes.iter().find(|r| !enforces(&r.policies)) {
        return Err(source.error(
            1,
            "default_tier",
            format!(
                "{who} on route `{}` they would meet none, unlimited: {how}",
                route.name
            ),
        ));
    }
    let catch_all = routes.iter().any(|r| r.matching.matches_all());
    if !catch_all {
        return Err(source.error(
            1,
            "default_tier",
            format!("{who} a request that matches no route would meet none, unlimited: {how}"),
        ));
    }
    Ok(())
}
