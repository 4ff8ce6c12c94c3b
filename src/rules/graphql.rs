//! A GraphQL query's cost, computed before any counting as the route's
//! [`GraphQlPricing`] says: each field its weight (1 unless weighted), plus what it selects
//! times its page size when it is a list (`first`, `last` or `limit`, the variable's value or
//! its default, else `graphql_list_size` for the fields of `graphql_lists`); fragments and
//! inline fragments add what they select (every branch: an upper bound). The query comes
//! from a JSON body (`query`, `variables`, `operationName`), an `application/graphql` body, or
//! the URL (`?query=…&variables=…&operationName=…`), and is parsed by `apollo-parser` with
//! limits on tokens and nesting, so that no document grows memory or the stack without bound.

use std::borrow::Cow;
use std::collections::HashMap;

use apollo_parser::{Parser, cst};

use super::request::{GraphQlRefusal, RequestFacts};
use crate::config::GraphQlPricing;

/// The most tokens a query may have.
const MAX_TOKENS: usize = 20_000;

/// The parser's nesting limit (fields, fragments and values): above any `max_depth`.
const MAX_NESTING: usize = 256;

/// The longest `variables` a URL may carry, in bytes.
const MAX_URL_VARIABLES: usize = 8192;

/// What a priced query cost, or why it is refused.
pub(super) fn price(
    pricing: &GraphQlPricing,
    facts: &RequestFacts<'_>,
) -> Result<(u64, u32), GraphQlRefusal> {
    let request = query_of(facts)?;
    let tree = Parser::new(&request.query)
        .token_limit(MAX_TOKENS)
        .recursion_limit(MAX_NESTING)
        .parse();
    if let Some(error) = tree.errors().next() {
        return Err(match error.message() {
            m if error.is_limit() && m.contains("recursion") => GraphQlRefusal::TooDeep {
                depth: MAX_NESTING as u32,
                max_depth: pricing.max_depth,
            },
            _ if error.is_limit() => GraphQlRefusal::Invalid("the query has too many tokens"),
            _ => GraphQlRefusal::Invalid("the query is not valid GraphQL"),
        });
    }
    let document = tree.document();
    let mut operations = Vec::new();
    let mut fragments = HashMap::new();
    for definition in document.definitions() {
        match definition {
            cst::Definition::OperationDefinition(op) => operations.push(op),
            cst::Definition::FragmentDefinition(f) => {
                let name = f
                    .fragment_name()
                    .and_then(|n| n.name())
                    .map(|n| n.text().to_string())
                    .ok_or(GraphQlRefusal::Invalid("a fragment without a name"))?;
                if fragments.insert(name, f).is_some() {
                    return Err(GraphQlRefusal::Invalid("two fragments of one name"));
                }
            }
            _ => return Err(GraphQlRefusal::Invalid("a query document defines no types")),
        }
    }
    let name_of = |op: &cst::OperationDefinition| op.name().map(|n| n.text().to_string());
    let operation = match request.operation_name.as_deref() {
        Some(wanted) => operations
            .iter()
            .find(|op| name_of(op).as_deref() == Some(wanted))
            .ok_or(GraphQlRefusal::Invalid(
                "no operation of that `operationName`",
            ))?,
        None if operations.len() == 1 => &operations[0],
        None if operations.is_empty() => {
            return Err(GraphQlRefusal::Invalid("the document has no operation"));
        }
        None => {
            return Err(GraphQlRefusal::Invalid(
                "several operations and no `operationName`",
            ));
        }
    };
    let root = match operation.operation_type() {
        Some(t) if t.mutation_token().is_some() => "mutation",
        Some(t) if t.subscription_token().is_some() => "subscription",
        _ => "query",
    };
    let mut defaults = HashMap::new();
    if let Some(definitions) = operation.variable_definitions() {
        for definition in definitions.variable_definitions() {
            let name = definition.variable().and_then(|v| v.name());
            let value = definition
                .default_value()
                .and_then(|d| d.value())
                .and_then(|v| int_of(&v));
            if let (Some(name), Some(value)) = (name, value) {
                defaults.insert(name.text().to_string(), value);
            }
        }
    }
    let mut walk = Walk {
        pricing,
        fragments: &fragments,
        variables: request.variables.as_ref().and_then(|v| v.as_object()),
        defaults,
        memo: HashMap::new(),
        visiting: Vec::new(),
    };
    let set = operation
        .selection_set()
        .ok_or(GraphQlRefusal::Invalid("an operation without a selection"))?;
    let (cost, depth) = walk.set(&set, root, 0)?;
    if depth > pricing.max_depth {
        return Err(GraphQlRefusal::TooDeep {
            depth,
            max_depth: pricing.max_depth,
        });
    }
    Ok((cost, depth))
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

/// An integer literal's value, clamped to `0..=u32::MAX`.
fn int_of(value: &cst::Value) -> Option<u64> {
    match value {
        cst::Value::IntValue(int) => {
            let text = int.int_token()?.text().to_string();
            let number: i128 = text.parse().ok()?;
            Some(number.clamp(0, i128::from(u32::MAX)) as u64)
        }
        _ => None,
    }
}

/// One operation's walk: fragments priced once each (a fragment spread twice costs twice,
/// but is walked once), and a cycle of fragments refused.
struct Walk<'a> {
    pricing: &'a GraphQlPricing,
    fragments: &'a HashMap<String, cst::FragmentDefinition>,
    variables: Option<&'a serde_json::Map<String, serde_json::Value>>,
    defaults: HashMap<String, u64>,
    /// (cost, depth) of each fragment walked, by the field it was spread in and its name
    /// (weights may name the enclosing field; depth counted from the fragment).
    memo: HashMap<(String, String), (u64, u32)>,
    /// The fragments being walked, innermost last.
    visiting: Vec<String>,
}

impl Walk<'_> {
    /// The cost of `set` inside field `parent`, and the deepest field it reaches (`depth`:
    /// the fields above it).
    fn set(
        &mut self,
        set: &cst::SelectionSet,
        parent: &str,
        depth: u32,
    ) -> Result<(u64, u32), GraphQlRefusal> {
        let (mut cost, mut deepest) = (0u64, depth);
        for selection in set.selections() {
            let (c, d) = match selection {
                cst::Selection::Field(field) => self.field(&field, parent, depth)?,
                cst::Selection::InlineFragment(inline) => match inline.selection_set() {
                    Some(inner) => self.set(&inner, parent, depth)?,
                    None => (0, depth),
                },
                cst::Selection::FragmentSpread(spread) => {
                    let name = spread
                        .fragment_name()
                        .and_then(|n| n.name())
                        .map(|n| n.text().to_string())
                        .ok_or(GraphQlRefusal::Invalid("a fragment spread without a name"))?;
                    let (c, d) = self.fragment(&name, parent)?;
                    (c, depth + d)
                }
            };
            cost = cost.saturating_add(c);
            deepest = deepest.max(d);
        }
        Ok((cost, deepest))
    }

    fn field(
        &mut self,
        field: &cst::Field,
        parent: &str,
        depth: u32,
    ) -> Result<(u64, u32), GraphQlRefusal> {
        let name = field
            .name()
            .map(|n| n.text().to_string())
            .ok_or(GraphQlRefusal::Invalid("a field without a name"))?;
        let depth = depth + 1;
        if depth as usize > MAX_NESTING {
            return Err(GraphQlRefusal::TooDeep {
                depth,
                max_depth: self.pricing.max_depth,
            });
        }
        let weight = self.pricing.weight(parent, &name);
        let Some(inner) = field.selection_set() else {
            return Ok((weight, depth));
        };
        let (selected, deepest) = self.set(&inner, &name, depth)?;
        let size = self.page_size(field, &name);
        Ok((
            weight.saturating_add(selected.saturating_mul(size)),
            deepest,
        ))
    }

    /// How many items a field returns: its size argument, else the list size for a field of
    /// `graphql_lists`, else one.
    fn page_size(&self, field: &cst::Field, name: &str) -> u64 {
        let mut size = None;
        for argument in field.arguments().iter().flat_map(|a| a.arguments()) {
            let is_size = argument
                .name()
                .is_some_and(|n| GraphQlPricing::is_size_argument(n.text().as_ref()));
            if !is_size {
                continue;
            }
            let value = argument.value().and_then(|v| match v {
                cst::Value::Variable(variable) => {
                    let name = variable.name()?.text().to_string();
                    self.variables
                        .and_then(|vars| vars.get(&name))
                        .and_then(serde_json::Value::as_i64)
                        .map(|n| n.clamp(0, i64::from(u32::MAX)) as u64)
                        .or_else(|| self.defaults.get(&name).copied())
                }
                literal => int_of(&literal),
            });
            size = size.max(value);
        }
        size.unwrap_or(if self.pricing.is_list(name) {
            self.pricing.list_size
        } else {
            1
        })
    }

    fn fragment(&mut self, name: &str, parent: &str) -> Result<(u64, u32), GraphQlRefusal> {
        let key = (parent.to_string(), name.to_string());
        if let Some(&known) = self.memo.get(&key) {
            return Ok(known);
        }
        if self.visiting.iter().any(|v| v == name) {
            return Err(GraphQlRefusal::Invalid("fragments that spread each other"));
        }
        if self.visiting.len() >= MAX_NESTING {
            return Err(GraphQlRefusal::TooDeep {
                depth: MAX_NESTING as u32,
                max_depth: self.pricing.max_depth,
            });
        }
        let Some(definition) = self.fragments.get(name) else {
            return Err(GraphQlRefusal::Invalid(
                "a spread of a fragment not defined",
            ));
        };
        let Some(set) = definition.selection_set() else {
            return Ok((0, 0));
        };
        self.visiting.push(name.to_string());
        let priced = self.set(&set, parent, 0);
        self.visiting.pop();
        let priced = priced?;
        self.memo.insert(key, priced);
        Ok(priced)
    }
}
