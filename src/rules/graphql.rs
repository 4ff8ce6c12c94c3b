//! A GraphQL query's cost, computed before any counting as the route's
//! [`GraphQlPricing`] says: each field its weight (1 unless weighted), plus what it selects
//! times its page size when it is a list (`first`, `last` or `limit`, the variable's value or
//! its default, else `graphql_list_size` for the fields of `graphql_lists`); fragments and
//! inline fragments add what they select (every branch: an upper bound). The query comes
//! from a JSON body (`query`, `variables`, `operationName`), an `application/graphql` body, or
//! the URL (`?query=…&variables=…&operationName=…`), and is parsed by `apollo-parser` with
//! limits on tokens and nesting, so that no document grows memory or the stack without bound,
//! into a [`Program`] (`graphql::program`) that a route keeps for the next request of the same
//! document ([`Programs`]).

use std::borrow::Cow;
use std::sync::Arc;

use dashmap::DashMap;

use super::request::{GraphQlRefusal, RequestFacts};
use crate::config::GraphQlPricing;
use program::Program;

mod program;

/// The longest `variables` a URL may carry, in bytes.
const MAX_URL_VARIABLES: usize = 8192;

/// The most documents a route keeps compiled.
const MAX_PROGRAMS: usize = 1024;

/// The most nodes a route keeps compiled, over all its documents (about 50 bytes each); a
/// document larger than an eighth of this is compiled for each request.
const MAX_PROGRAM_NODES: usize = 1 << 16;

/// What the queries a route priced lately compile to, by (query, `operationName`): a query
/// seen before is priced from its variables alone, without a parse. Bounded in documents and
/// in nodes; once full it starts afresh. Keyed by a hash with a key of the process's own, so
/// that no client can choose two queries that share an entry.
#[derive(Debug, Default)]
pub(super) struct Programs {
    map: DashMap<u64, Result<Arc<Program>, GraphQlRefusal>, ahash::RandomState>,
    nodes: std::sync::atomic::AtomicUsize,
    hasher: ahash::RandomState,
}

impl Programs {
    fn get_or_compile(
        &self,
        pricing: &GraphQlPricing,
        query: &str,
        operation_name: Option<&str>,
    ) -> Result<Arc<Program>, GraphQlRefusal> {
        use std::sync::atomic::Ordering;
        let key = self.hasher.hash_one((query, operation_name));
        if let Some(known) = self.map.get(&key) {
            return known.clone();
        }
        let compiled = program::compile(pricing, query, operation_name).map(Arc::new);
        let size = compiled.as_ref().map_or(1, |p| p.len());
        if size <= MAX_PROGRAM_NODES / 8 {
            if self.map.len() >= MAX_PROGRAMS
                || self.nodes.fetch_add(size, Ordering::Relaxed) + size > MAX_PROGRAM_NODES
            {
                self.map.clear();
                self.nodes.store(size, Ordering::Relaxed);
            }
            self.map.insert(key, compiled.clone());
        }
        compiled
    }
}

/// What a priced query cost, and how deep its fields nest, or why it is refused.
pub(super) fn price(
    pricing: &GraphQlPricing,
    programs: &Programs,
    facts: &RequestFacts<'_>,
) -> Result<(u64, u32), GraphQlRefusal> {
    let request = query_of(facts)?;
    let program =
        programs.get_or_compile(pricing, &request.query, request.operation_name.as_deref())?;
    if program.depth > pricing.max_depth {
        return Err(GraphQlRefusal::TooDeep {
            depth: program.depth,
            max_depth: pricing.max_depth,
        });
    }
    let variables = request.variables.as_ref().and_then(|v| v.as_object());
    Ok((program.cost(variables), program.depth))
}

/// The query, its variables and its operation's name, as the request gives them.
struct QueryRequest<'f> {
    query: Cow<'f, str>,
    variables: Option<Cow<'f, serde_json::Value>>,
    operation_name: Option<Cow<'f, str>>,
}

fn query_of<'f>(facts: &RequestFacts<'f>) -> Result<QueryRequest<'f>, GraphQlRefusal> {
    let parts = &facts.request;
    if let Some(serde_json::Value::Object(object)) = parts.json {
        let query = object
            .get("query")
            .and_then(serde_json::Value::as_str)
            .ok_or(GraphQlRefusal::Invalid(
                "the JSON body has no `query` string",
            ))?;
        return Ok(QueryRequest {
            query: Cow::Borrowed(query),
            variables: object
                .get("variables")
                .filter(|v| !v.is_null())
                .map(Cow::Borrowed),
            operation_name: object
                .get("operationName")
                .and_then(serde_json::Value::as_str)
                .map(Cow::Borrowed),
        });
    }
    if let Some(body) = parts.body.filter(|b| !b.is_empty()) {
        let graphql_body = parts
            .headers
            .and_then(|h| h.get(http::header::CONTENT_TYPE))
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.trim_start().starts_with("application/graphql"));
        if !graphql_body {
            return Err(GraphQlRefusal::Invalid(
                "the body is neither JSON with a `query` nor application/graphql",
            ));
        }
        let query = std::str::from_utf8(body)
            .map_err(|_| GraphQlRefusal::Invalid("the query is not UTF-8"))?;
        return Ok(QueryRequest {
            query: Cow::Borrowed(query),
            variables: None,
            operation_name: None,
        });
    }
    let mut request = QueryRequest {
        query: Cow::Borrowed(""),
        variables: None,
        operation_name: None,
    };
    let mut found = false;
    for (key, value) in form_urlencoded::parse(parts.query.unwrap_or("").as_bytes()) {
        match &*key {
            "query" if !found => {
                request.query = Cow::Owned(value.into_owned());
                found = true;
            }
            "variables" if request.variables.is_none() && !value.is_empty() => {
                if value.len() > MAX_URL_VARIABLES {
                    return Err(GraphQlRefusal::Invalid("`variables` is too long"));
                }
                let parsed = serde_json::from_str(&value)
                    .map_err(|_| GraphQlRefusal::Invalid("`variables` is not JSON"))?;
                request.variables = Some(Cow::Owned(parsed));
            }
            "operationName" if request.operation_name.is_none() => {
                request.operation_name = Some(Cow::Owned(value.into_owned()));
            }
            _ => {}
        }
    }
    if !found {
        return Err(GraphQlRefusal::Invalid(
            "no GraphQL query: a JSON body with `query`, or `?query=`",
        ));
    }
    Ok(request)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pricing() -> GraphQlPricing {
        let weights = [("search".to_string(), 10i64)].into_iter().collect();
        GraphQlPricing::new(None, Some(&weights), &["nodes".to_string()], Some(20)).unwrap()
    }

    fn variables(json: &str) -> serde_json::Map<String, serde_json::Value> {
        serde_json::from_str(json).unwrap()
    }

    /// One document, compiled once, priced with the variables of each request.
    #[test]
    fn a_document_is_compiled_once_and_priced_by_each_request_s_variables() {
        let pricing = pricing();
        let programs = Programs::default();
        let query = "query Q($n: Int = 5) { search(first: $n) { nodes { id ...F } } } \
                     fragment F on Item { a b }";
        // search: 10 + n × (nodes: 1 + 20 × (id 1 + a 1 + b 1)) = 10 + 61n.
        for (vars, cost) in [("{}", 10 + 61 * 5), (r#"{"n": 2}"#, 10 + 61 * 2)] {
            let program = programs.get_or_compile(&pricing, query, None).unwrap();
            assert_eq!(program.cost(Some(&variables(vars))), cost, "{vars}");
            assert_eq!(program.depth, 3);
        }
        assert_eq!(programs.map.len(), 1);
        // A negative or huge size is clamped, a string one is ignored (the default holds).
        let program = programs.get_or_compile(&pricing, query, None).unwrap();
        assert_eq!(program.cost(Some(&variables(r#"{"n": -3}"#))), 10);
        assert_eq!(program.cost(Some(&variables(r#"{"n": "7"}"#))), 10 + 61 * 5);
        // A refusal is kept too: the same invalid document is not parsed again.
        let refused = programs.get_or_compile(&pricing, "{ a ", None);
        assert!(matches!(refused, Err(GraphQlRefusal::Invalid(_))));
        assert_eq!(programs.map.len(), 2);
    }

    /// Fragments that spread each other twice, forty deep: one node each, priced in one pass
    /// (a walk that followed every spread would take 2^40 steps), the cost saturating.
    #[test]
    fn fragments_spread_twice_at_every_level_compile_and_price_in_linear_time() {
        let mut query = String::from("{ ...F0 }");
        for i in 0..40 {
            query.push_str(&format!(
                " fragment F{i} on T {{ a {{ ...F{} }} b {{ ...F{} }} }}",
                i + 1,
                i + 1
            ));
        }
        query.push_str(" fragment F40 on T { leaf }");
        let program = program::compile(&pricing(), &query, None).unwrap();
        assert!(program.len() < 1000, "{} nodes", program.len());
        assert!(program.cost(None) > 1 << 40);
        assert_eq!(program.depth, 41);
    }

    /// The cache stays within its bounds: past its documents, it starts afresh.
    #[test]
    fn the_cache_is_bounded() {
        let pricing = pricing();
        let programs = Programs::default();
        for i in 0..(MAX_PROGRAMS + 10) {
            let query = format!("{{ f{i} }}");
            programs.get_or_compile(&pricing, &query, None).unwrap();
            assert!(programs.map.len() <= MAX_PROGRAMS);
        }
        // A document past an eighth of the node budget is not kept.
        let mut big = String::from("{ ");
        for i in 0..(MAX_PROGRAM_NODES / 8 + 1) {
            big.push_str(&format!("f{i} "));
        }
        big.push('}');
        let before = programs.map.len();
        assert!(programs.get_or_compile(&pricing, &big, None).is_ok());
        assert_eq!(programs.map.len(), before);
    }
}
