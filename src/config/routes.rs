//! `[[routes]]`: what a route matches (methods, hosts, a path prefix, template or glob,
//! headers), its cost and its own policies; the order in which routes are matched (most
//! specific first).

use std::collections::BTreeMap;

use http::{HeaderName, Method};
use serde::Deserialize;
use toml::Spanned;

use super::cost::{CostFrom, CostMap, CostSource};
use super::matching::{HostPattern, PathPattern, RouteMatch};
use super::named_policy::NamedPolicy;
use super::source::{ConfigError, Source};

/// A route: requests it matches cost `cost` tokens and also pass through `policies` (keyed
/// per client and per route, unless they count `by` other parts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteRule {
    /// The route's name (part of its keys).
    pub name: String,
    /// What it matches.
    pub matching: RouteMatch,
    /// The cost of one request, in tokens of every policy that applies (when `cost_from`
    /// gives none).
    pub cost: u64,
    /// The cost taken from the request (`cost_from`), if the route says so.
    pub cost_from: Option<CostFrom>,
    /// Policies that apply to this route in addition to the tier's.
    pub policies: Vec<String>,
    /// The longest request body read for a policy that counts by a field of it (`json:`,
    /// `form:`); a longer one is answered `413`. Bodies of requests whose policies read no
    /// field are never read.
    pub max_body_bytes: u64,
}

/// A route's `max_body_bytes` when the file gives none, and the one for requests that match
/// no route.
pub(crate) const DEFAULT_MAX_BODY_BYTES: u64 = 16 * 1024;
/// The largest `max_body_bytes` a route may give.
pub(crate) const MAX_MAX_BODY_BYTES: u64 = 16 * 1024 * 1024;

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
        if let Some(same) = routes.iter().find(|r| r.matching == route.matching) {
            return Err(source.error(
                line,
                format!("routes.{}", route.name),
                format!(
                    "matches the same requests as route `{}`: the match would be ambiguous",
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
    // Stable: routes as specific as each other keep the file's order.
    routes.sort_by(|a: &RouteRule, b: &RouteRule| {
        b.matching.specificity().cmp(&a.matching.specificity())
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
    let method = |text: &String| -> Result<Option<Method>, ConfigError> {
        if text == "*" || text.eq_ignore_ascii_case("any") {
            return Ok(None);
        }
        Method::from_bytes(text.to_ascii_uppercase().as_bytes())
            .map(Some)
            .map_err(|_| {
                source.error(
                    at("method"),
                    field("method"),
                    format!("`{text}` is not an HTTP method"),
                )
            })
    };
    let mut methods = Vec::new();
    for text in raw.method.iter().chain(&raw.methods) {
        match method(text)? {
            Some(m) if !methods.contains(&m) => methods.push(m),
            Some(_) => {}
            // "any" among others means any.
            None => {
                methods.clear();
                break;
            }
        }
    }
    let paths = [
        ("path_prefix", &raw.path_prefix),
        ("path", &raw.path),
        ("path_glob", &raw.path_glob),
    ];
    let given: Vec<(&str, &String)> = paths
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| (*k, v)))
        .collect();
    let path = match given.as_slice() {
        [] => PathPattern::Prefix(String::new()),
        [("path_prefix", prefix)] => {
            if !prefix.starts_with('/') {
                return Err(source.error(
                    at("path_prefix"),
                    field("path_prefix"),
                    "must start with `/`",
                ));
            }
            PathPattern::Prefix(prefix.trim_end_matches('/').to_string())
        }
        [("path", text)] => PathPattern::template(text)
            .map_err(|reason| source.error(at("path"), field("path"), reason))?,
        [("path_glob", text)] => PathPattern::glob(text)
            .map_err(|reason| source.error(at("path_glob"), field("path_glob"), reason))?,
        _ => {
            return Err(source.error(
                at(given[1].0),
                field(given[1].0),
                "give one of `path_prefix`, `path` and `path_glob`",
            ));
        }
    };
    let mut hosts = Vec::new();
    for text in raw.host.iter().chain(&raw.hosts) {
        hosts.push(
            HostPattern::parse(text)
                .map_err(|reason| source.error(at("host"), field("host"), reason))?,
        );
    }
    let mut headers = Vec::new();
    for (name, value) in &raw.headers {
        let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
            source.error(
                at("headers"),
                field("headers"),
                format!("`{name}` is not a header name"),
            )
        })?;
        headers.push((header, (value != "*").then(|| value.clone())));
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
    let cost_from = cost_from(source, raw, &at, &field)?;
    // The cost must fit every policy this route can meet: its own and every tier's (the
    // most `cost_from` may give, too).
    let applicable = raw
        .policies
        .iter()
        .chain(tiers.values().flatten())
        .filter_map(|name| policies.iter().find(|p| &p.name == name));
    for named in applicable {
        let costs = std::iter::once(("cost", raw.cost))
            .chain(cost_from.as_ref().map(|c| ("max_cost", c.max_cost)));
        for (key, cost) in costs {
            named.policy.validate_cost(cost).map_err(|error| {
                source.error(
                    at(key),
                    field(key),
                    format!("{error} (policy `{}`)", named.name),
                )
            })?;
        }
    }
    let max_body_bytes = match raw.max_body_bytes {
        None => DEFAULT_MAX_BODY_BYTES,
        Some(n) if (1..=MAX_MAX_BODY_BYTES as i64).contains(&n) => n as u64,
        Some(n) => {
            return Err(source.error(
                at("max_body_bytes"),
                field("max_body_bytes"),
                format!("{n}: give 1 to {MAX_MAX_BODY_BYTES} bytes"),
            ));
        }
    };
    Ok(RouteRule {
        name: raw.name.clone(),
        matching: RouteMatch {
            methods,
            hosts,
            path,
            headers,
        },
        cost: raw.cost,
        cost_from,
        policies: raw.policies.clone(),
        max_body_bytes,
    })
}

/// A route's `cost_from` with its map (`cost_per_unit` or `cost_table`) and `max_cost`.
fn cost_from(
    source: &Source<'_>,
    raw: &RawRoute,
    at: &dyn Fn(&str) -> usize,
    field: &dyn Fn(&str) -> String,
) -> Result<Option<CostFrom>, ConfigError> {
    let error = |key: &str, message: String| source.error(at(key), field(key), message);
    let graphql = raw.cost_from.as_deref() == Some("graphql");
    if !graphql {
        let given = [
            ("max_depth", raw.max_depth.is_some()),
            ("graphql_weights", raw.graphql_weights.is_some()),
            ("graphql_lists", !raw.graphql_lists.is_empty()),
            ("graphql_list_size", raw.graphql_list_size.is_some()),
        ];
        if let Some((key, _)) = given.iter().find(|(_, given)| *given) {
            return Err(error(key, "needs `cost_from = \"graphql\"`".into()));
        }
    }
    let Some(text) = &raw.cost_from else {
        for key in ["cost_per_unit", "cost_table", "max_cost"] {
            let given = match key {
                "cost_per_unit" => raw.cost_per_unit.is_some(),
                "cost_table" => raw.cost_table.is_some(),
                _ => raw.max_cost.is_some(),
            };
            if given {
                return Err(error(key, "needs `cost_from`".into()));
            }
        }
        return Ok(None);
    };
    let from = if graphql {
        if let Some(key) = [
            ("cost_per_unit", raw.cost_per_unit.is_some()),
            ("cost_table", raw.cost_table.is_some()),
        ]
        .iter()
        .find_map(|&(key, given)| given.then_some(key))
        {
            return Err(error(
                key,
                "a GraphQL query's cost is computed, not mapped: weights go in `graphql_weights`"
                    .into(),
            ));
        }
        let pricing = crate::config::GraphQlPricing::new(
            raw.max_depth,
            raw.graphql_weights.as_ref(),
            &raw.graphql_lists,
            raw.graphql_list_size,
        )
        .map_err(|(key, reason)| error(key, reason))?;
        CostSource::GraphQl(Box::new(pricing))
    } else {
        CostSource::parse(text).map_err(|reason| error("cost_from", reason))?
    };
    let max_cost = match raw.max_cost {
        Some(max) if max >= 1 && (max as u64) >= raw.cost => max as u64,
        Some(max) => {
            return Err(error(
                "max_cost",
                format!("{max}: at least 1 and at least `cost` ({})", raw.cost),
            ));
        }
        None => {
            return Err(error(
                "cost_from",
                "needs `max_cost`: the most one request may cost".into(),
            ));
        }
    };
    let map = match (raw.cost_per_unit, &raw.cost_table) {
        (Some(_), Some(_)) => {
            return Err(error(
                "cost_table",
                "give one of `cost_per_unit` and `cost_table`".into(),
            ));
        }
        (Some(factor), None) if factor.is_finite() && (1e-6..=1e12).contains(&factor) => {
            CostMap::Linear((factor * 1e6).round() as u64)
        }
        (Some(factor), None) => {
            return Err(error(
                "cost_per_unit",
                format!("{factor}: a number from 0.000001 to 10^12"),
            ));
        }
        (None, Some(rows)) => {
            let mut table = Vec::with_capacity(rows.len());
            for &[up_to, cost] in rows {
                let valid = up_to >= 0
                    && (1..=max_cost as i64).contains(&cost)
                    && table
                        .last()
                        .is_none_or(|&(last, _): &(u64, u64)| up_to as u64 > last);
                if !valid {
                    return Err(error(
                        "cost_table",
                        format!(
                            "[{up_to}, {cost}]: rows are [up to, cost] with up to increasing \
                             and cost from 1 to `max_cost` ({max_cost})"
                        ),
                    ));
                }
                table.push((up_to as u64, cost as u64));
            }
            if table.is_empty() || table.len() > MAX_COST_TABLE_ROWS {
                return Err(error(
                    "cost_table",
                    format!("1 to {MAX_COST_TABLE_ROWS} rows"),
                ));
            }
            CostMap::Table(table)
        }
        (None, None) => CostMap::Value,
    };
    Ok(Some(CostFrom {
        source: from,
        map,
        max_cost,
    }))
}

/// The most rows a `cost_table` may have.
const MAX_COST_TABLE_ROWS: usize = 64;

/// A `[[routes]]` table as the file spells it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRoute {
    name: String,
    method: Option<String>,
    #[serde(default)]
    methods: Vec<String>,
    host: Option<String>,
    #[serde(default)]
    hosts: Vec<String>,
    path_prefix: Option<String>,
    path: Option<String>,
    path_glob: Option<String>,
    /// Header name → value (`"*"`: present with any value).
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default = "one")]
    cost: u64,
    #[serde(default)]
    policies: Vec<String>,
    max_body_bytes: Option<i64>,
    cost_from: Option<String>,
    cost_per_unit: Option<f64>,
    cost_table: Option<Vec<[i64; 2]>>,
    max_cost: Option<i64>,
    max_depth: Option<i64>,
    graphql_weights: Option<std::collections::HashMap<String, i64>>,
    #[serde(default)]
    graphql_lists: Vec<String>,
    graphql_list_size: Option<i64>,
}

/// A route's cost when the file gives none.
fn one() -> u64 {
    1
}
