//! How a route prices GraphQL queries (`cost_from = "graphql"`): each field costs 1 unless
//! weighted, a list field multiplies what it selects by its page size, and a query above
//! `max_cost` or nested deeper than `max_depth` is refused before any counting.
//!
//! ```toml
//! [[routes]]
//! name = "graphql"
//! path = "/graphql"
//! cost_from = "graphql"
//! max_cost = 1000                               # a costlier query: 400, counted nowhere
//! max_depth = 10                                # a deeper one: 400
//! graphql_weights = { search = 10, "repository.issues" = 2 }
//! graphql_lists = ["nodes", "edges"]            # lists without a size argument
//! graphql_list_size = 20                        # … count this many
//! ```
//!
//! The schema is not known: a weight names a field (`search`) or a field inside another
//! (`repository.issues`, the enclosing field's name; `query`, `mutation` and `subscription`
//! at the top). A field is a list when it has a `first`, `last` or `limit` argument (its
//! value, or the variable's) or is named in `graphql_lists`.

use std::collections::HashMap;

/// The default `max_depth`.
pub(crate) const DEFAULT_MAX_DEPTH: u32 = 15;

/// The deepest `max_depth` a file may set (the parser's own nesting limit is above it).
pub(crate) const MAX_MAX_DEPTH: u32 = 128;

/// The default `graphql_list_size`.
pub(crate) const DEFAULT_LIST_SIZE: u64 = 10;

/// The arguments that give a list field's page size.
const LIST_ARGUMENTS: [&str; 3] = ["first", "last", "limit"];

/// A route's GraphQL pricing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphQlPricing {
    /// The deepest nesting of fields a query may have.
    pub(crate) max_depth: u32,
    /// Weights by `field` or `parent.field` (1 otherwise).
    pub(crate) weights: HashMap<String, u64>,
    /// Fields that are lists though they carry no size argument.
    pub(crate) lists: Vec<String>,
    /// The page size of a list field without a size argument.
    pub(crate) list_size: u64,
}

impl GraphQlPricing {
    /// Build from a route's settings; the error names the setting.
    pub(crate) fn new(
        max_depth: Option<i64>,
        weights: Option<&HashMap<String, i64>>,
        lists: &[String],
        list_size: Option<i64>,
    ) -> Result<Self, (&'static str, String)> {
        let max_depth = match max_depth {
            None => DEFAULT_MAX_DEPTH,
            Some(d) if (1..=i64::from(MAX_MAX_DEPTH)).contains(&d) => d as u32,
            Some(d) => return Err(("max_depth", format!("{d}: give 1 to {MAX_MAX_DEPTH}"))),
        };
        let mut table = HashMap::new();
        for (name, &weight) in weights.into_iter().flatten() {
            let valid_name = !name.is_empty()
                && name.split('.').count() <= 2
                && name.split('.').all(is_graphql_name);
            if !valid_name {
                return Err((
                    "graphql_weights",
                    format!("`{name}`: a field name, or `parent.field`"),
                ));
            }
            if !(0..=1_000_000).contains(&weight) {
                return Err((
                    "graphql_weights",
                    format!("`{name}` = {weight}: give 0 to 1000000"),
                ));
            }
            table.insert(name.clone(), weight as u64);
        }
        if let Some(bad) = lists.iter().find(|n| !is_graphql_name(n)) {
            return Err(("graphql_lists", format!("`{bad}` is not a field name")));
        }
        let list_size = match list_size {
            None => DEFAULT_LIST_SIZE,
            Some(n) if (1..=100_000).contains(&n) => n as u64,
            Some(n) => return Err(("graphql_list_size", format!("{n}: give 1 to 100000"))),
        };
        Ok(GraphQlPricing {
            max_depth,
            weights: table,
            lists: lists.to_vec(),
            list_size,
        })
    }

    /// The weight of field `name` inside `parent`.
    pub(crate) fn weight(&self, parent: &str, name: &str) -> u64 {
        if !self.weights.is_empty() {
            let mut key = String::with_capacity(parent.len() + 1 + name.len());
            key.push_str(parent);
            key.push('.');
            key.push_str(name);
            if let Some(&w) = self.weights.get(&key).or_else(|| self.weights.get(name)) {
                return w;
            }
        }
        1
    }

    /// Tell whether an argument named `name` gives a list field's page size (`first`,
    /// `last`, `limit`).
    pub(crate) fn is_size_argument(name: &str) -> bool {
        LIST_ARGUMENTS.contains(&name)
    }

    /// Tell whether field `name` is a list without a size argument.
    pub(crate) fn is_list(&self, name: &str) -> bool {
        self.lists.iter().any(|l| l == name)
    }
}

/// `[_A-Za-z][_0-9A-Za-z]*`, a GraphQL name.
fn is_graphql_name(text: &str) -> bool {
    let mut chars = text.chars();
    chars
        .next()
        .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_checked_and_weights_found_by_parent_then_name() {
        let weights: HashMap<String, i64> = [
            ("search".to_string(), 10),
            ("repository.issues".to_string(), 2),
        ]
        .into();
        let p = GraphQlPricing::new(Some(8), Some(&weights), &["nodes".into()], None).unwrap();
        assert_eq!(p.weight("query", "search"), 10);
        assert_eq!(p.weight("repository", "issues"), 2);
        assert_eq!(p.weight("user", "issues"), 1);
        assert!(p.is_list("nodes") && !p.is_list("node"));
        assert_eq!((p.max_depth, p.list_size), (8, DEFAULT_LIST_SIZE));
        for (depth, weights, lists, size, field) in [
            (Some(0), None, vec![], None, "max_depth"),
            (Some(129), None, vec![], None, "max_depth"),
            (None, Some(("a.b.c", 1)), vec![], None, "graphql_weights"),
            (None, Some(("1x", 1)), vec![], None, "graphql_weights"),
            (None, Some(("x", -1)), vec![], None, "graphql_weights"),
            (None, None, vec!["a-b".to_string()], None, "graphql_lists"),
            (None, None, vec![], Some(0), "graphql_list_size"),
        ] {
            let table: Option<HashMap<String, i64>> =
                weights.map(|(n, w)| [(n.to_string(), w)].into());
            let error = GraphQlPricing::new(depth, table.as_ref(), &lists, size).unwrap_err();
            assert_eq!(error.0, field, "{error:?}");
        }
    }
}
