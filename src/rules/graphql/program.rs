//! A query document compiled once into what its cost depends on: a graph of fields (a
//! fragment spread twice is one node reached twice), each with its weight and its page size
//! (a literal, or a variable with its default), children before parents. Pricing a request
//! then only reads its variables: no parse, no recursion.

use std::collections::HashMap;

use apollo_parser::{Parser, cst};

use super::super::request::GraphQlRefusal;
use crate::config::GraphQlPricing;

/// The most tokens a query may have.
const MAX_TOKENS: usize = 20_000;

/// The parser's nesting limit (fields, fragments and values): above any `max_depth`.
pub(super) const MAX_NESTING: usize = 256;

/// One operation of a document, ready to price.
#[derive(Debug)]
pub(super) struct Program {
    /// Children before parents; the last is the operation's selection.
    nodes: Vec<Node>,
    /// Every node's children, by index, one range per node.
    edges: Vec<u32>,
    /// The deepest field's depth (does not depend on the variables).
    pub(super) depth: u32,
}

#[derive(Debug)]
struct Node {
    weight: u64,
    /// Its children: `edges[from..to]`.
    from: u32,
    to: u32,
    size: Size,
}

/// How many items a field returns.
#[derive(Debug)]
enum Size {
    /// One (not a list, or no children to multiply).
    One,
    /// The largest of its size arguments that has a value, else `fallback`.
    Arguments {
        arguments: Box<[Argument]>,
        fallback: u64,
    },
}

#[derive(Debug)]
enum Argument {
    Literal(u64),
    Variable {
        name: Box<str>,
        default: Option<u64>,
    },
}

impl Program {
    /// The number of nodes (what a cache counts).
    pub(super) fn len(&self) -> usize {
        self.nodes.len()
    }

    /// The cost with `variables` (a JSON object, or none).
    pub(super) fn cost(
        &self,
        variables: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> u64 {
        let mut costs: Vec<u64> = Vec::with_capacity(self.nodes.len());
        for node in &self.nodes {
            let selected = self.edges[node.from as usize..node.to as usize]
                .iter()
                .fold(0u64, |sum, &child| {
                    sum.saturating_add(costs[child as usize])
                });
            let size = match &node.size {
                Size::One => 1,
                Size::Arguments {
                    arguments,
                    fallback,
                } => arguments
                    .iter()
                    .filter_map(|argument| match argument {
                        Argument::Literal(n) => Some(*n),
                        Argument::Variable { name, default } => variables
                            .and_then(|vars| vars.get(&**name))
                            .and_then(serde_json::Value::as_i64)
                            .map(|n| n.clamp(0, i64::from(u32::MAX)) as u64)
                            .or(*default),
                    })
                    .max()
                    .unwrap_or(*fallback),
            };
            costs.push(node.weight.saturating_add(selected.saturating_mul(size)));
        }
        costs.last().copied().unwrap_or(0)
    }
}

/// Parse `query` and compile its operation `operation_name` (the only one when `None`).
pub(super) fn compile(
    pricing: &GraphQlPricing,
    query: &str,
    operation_name: Option<&str>,
) -> Result<Program, GraphQlRefusal> {
    let tree = Parser::new(query)
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
    let operation = match operation_name {
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
        defaults,
        memo: HashMap::new(),
        visiting: Vec::new(),
        program: Program {
            nodes: Vec::new(),
            edges: Vec::new(),
            depth: 0,
        },
    };
    let set = operation
        .selection_set()
        .ok_or(GraphQlRefusal::Invalid("an operation without a selection"))?;
    let (_, depth) = walk.set(&set, root, 0)?;
    let mut program = walk.program;
    program.depth = depth;
    Ok(program)
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

/// One operation's walk: fragments compiled once each (a fragment spread twice is one node
/// reached twice), and a cycle of fragments refused.
struct Walk<'a> {
    pricing: &'a GraphQlPricing,
    fragments: &'a HashMap<String, cst::FragmentDefinition>,
    defaults: HashMap<String, u64>,
    /// (node, depth) of each fragment walked, by the field it was spread in and its name
    /// (weights may name the enclosing field; depth counted from the fragment).
    memo: HashMap<(String, String), (u32, u32)>,
    /// The fragments being walked, innermost last.
    visiting: Vec<String>,
    program: Program,
}

impl Walk<'_> {
    /// Add a node of `children`; return its index.
    fn push(&mut self, weight: u64, children: &[u32], size: Size) -> u32 {
        let from = self.program.edges.len() as u32;
        self.program.edges.extend_from_slice(children);
        self.program.nodes.push(Node {
            weight,
            from,
            to: self.program.edges.len() as u32,
            size,
        });
        (self.program.nodes.len() - 1) as u32
    }

    /// The node of `set` inside field `parent`, and the deepest field it reaches (`depth`:
    /// the fields above it).
    fn set(
        &mut self,
        set: &cst::SelectionSet,
        parent: &str,
        depth: u32,
    ) -> Result<(u32, u32), GraphQlRefusal> {
        let mut children = Vec::new();
        let mut deepest = depth;
        for selection in set.selections() {
            let (node, d) = match selection {
                cst::Selection::Field(field) => self.field(&field, parent, depth)?,
                cst::Selection::InlineFragment(inline) => match inline.selection_set() {
                    Some(inner) => self.set(&inner, parent, depth)?,
                    None => continue,
                },
                cst::Selection::FragmentSpread(spread) => {
                    let name = spread
                        .fragment_name()
                        .and_then(|n| n.name())
                        .map(|n| n.text().to_string())
                        .ok_or(GraphQlRefusal::Invalid("a fragment spread without a name"))?;
                    let (node, d) = self.fragment(&name, parent)?;
                    (node, depth + d)
                }
            };
            children.push(node);
            deepest = deepest.max(d);
        }
        Ok((self.push(0, &children, Size::One), deepest))
    }

    fn field(
        &mut self,
        field: &cst::Field,
        parent: &str,
        depth: u32,
    ) -> Result<(u32, u32), GraphQlRefusal> {
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
            return Ok((self.push(weight, &[], Size::One), depth));
        };
        let (selected, deepest) = self.set(&inner, &name, depth)?;
        let size = self.page_size(field, &name);
        Ok((self.push(weight, &[selected], size), deepest))
    }

    /// How many items a field returns: its size arguments (the largest that has a value),
    /// else the list size for a field of `graphql_lists`, else one.
    fn page_size(&self, field: &cst::Field, name: &str) -> Size {
        let mut arguments = Vec::new();
        for argument in field.arguments().iter().flat_map(|a| a.arguments()) {
            let is_size = argument
                .name()
                .is_some_and(|n| GraphQlPricing::is_size_argument(n.text().as_ref()));
            if !is_size {
                continue;
            }
            match argument.value() {
                Some(cst::Value::Variable(variable)) => {
                    if let Some(name) = variable.name() {
                        let name = name.text().to_string();
                        let default = self.defaults.get(&name).copied();
                        arguments.push(Argument::Variable {
                            name: name.into(),
                            default,
                        });
                    }
                }
                Some(literal) => {
                    if let Some(n) = int_of(&literal) {
                        arguments.push(Argument::Literal(n));
                    }
                }
                None => {}
            }
        }
        let fallback = if self.pricing.is_list(name) {
            self.pricing.list_size
        } else {
            1
        };
        if arguments.is_empty() && fallback == 1 {
            return Size::One;
        }
        Size::Arguments {
            arguments: arguments.into(),
            fallback,
        }
    }

    fn fragment(&mut self, name: &str, parent: &str) -> Result<(u32, u32), GraphQlRefusal> {
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
        let compiled = match definition.selection_set() {
            None => (self.push(0, &[], Size::One), 0),
            Some(set) => {
                self.visiting.push(name.to_string());
                let compiled = self.set(&set, parent, 0);
                self.visiting.pop();
                compiled?
            }
        };
        self.memo.insert(key, compiled);
        Ok(compiled)
    }
}
