//! `[[routes]]`: method and path prefix, cost, and the route's own policies; the order in
//! which routes are matched (most specific first).

use std::collections::BTreeMap;

use http::Method;
use serde::Deserialize;
use toml::Spanned;

use super::policy::NamedPolicy;
use super::source::{ConfigError, Source};

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

/// Validate every route, refuse ambiguous or duplicate ones, and order them for matching:
/// most specific first (longer prefixes, then a named method before "any").
pub(super) fn build_routes(
    source: &Source<'_>,
    raw: &[Spanned<RawRoute>],
    policies: &[NamedPolicy],
    tiers: &BTreeMap<String, Vec<String>>,
) -> Result<Vec<RouteRule>, ConfigError> {
    let mut routes: Vec<RouteRule> = Vec::new();
    for spanned in raw {
        let route = build_route(source, spanned, policies, tiers)?;
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
    routes.sort_by(|a: &RouteRule, b: &RouteRule| {
        (b.path_prefix.len(), b.method.is_some()).cmp(&(a.path_prefix.len(), a.method.is_some()))
    });
    Ok(routes)
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

/// A `[[routes]]` table as the file spells it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRoute {
    name: String,
    method: Option<String>,
    path_prefix: String,
    #[serde(default = "one")]
    cost: u64,
    #[serde(default)]
    policies: Vec<String>,
}

/// A route's cost when the file gives none.
fn one() -> u64 {
    1
}
