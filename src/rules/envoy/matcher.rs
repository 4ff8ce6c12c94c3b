//! The `[envoy]` descriptors compiled for matching: per domain, a tree of entries with the
//! policy a descriptor that ends at each node meets.
//!
//! A request's descriptor is matched as envoyproxy/ratelimit matches it: entry by entry, an
//! exact `(key, value)` first, else the key with any value; the descriptor's limit is the
//! one of the node its last entry reaches. A descriptor that stops before a node with a
//! limit, or goes deeper than the tree, matches nothing.

use std::collections::HashMap;

use crate::config::{DescriptorLimit, EnvoyConfig, EnvoyDescriptor, RateLimitUnit};
use crate::rules::compile::CompiledPolicy;

/// What a descriptor that ends at a node meets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::rules) enum Target {
    /// Nothing (only deeper descriptors limit).
    None,
    /// Policy number `index` of the rules.
    Policy {
        /// The policy's index in the compiled rules.
        index: usize,
        /// Counted and reported, never over the limit.
        shadow: bool,
        /// The limit as Envoy's API states it: requests per unit.
        limit: CurrentLimit,
    },
    /// Never limited.
    Unlimited,
}

/// A limit as Envoy's API states it (`current_limit` of a descriptor's status).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentLimit {
    /// The policy's name.
    pub name: &'static str,
    /// Requests per unit: the policy's capacity (the limit of a window, a bucket's burst).
    pub requests_per_unit: u64,
    /// The unit: the one written, or the one as long as the policy's window (a bucket's time
    /// to refill from empty); `None` when no unit is that long.
    pub unit: Option<RateLimitUnit>,
}

/// One level of a domain's tree.
#[derive(Debug, Default)]
pub(in crate::rules) struct Level {
    /// key → value → node.
    exact: HashMap<Box<str>, HashMap<Box<str>, Node>>,
    /// key (any value) → node.
    any: HashMap<Box<str>, Node>,
}

#[derive(Debug)]
pub(in crate::rules) struct Node {
    pub(in crate::rules) target: Target,
    children: Level,
}

/// Every domain's tree.
#[derive(Debug, Default)]
pub(in crate::rules) struct EnvoyDomains {
    domains: HashMap<Box<str>, Level>,
}

impl EnvoyDomains {
    /// Compile `config` against the rules' policies (every name it uses is one of them: the
    /// file was validated).
    pub(in crate::rules) fn compile(config: &EnvoyConfig, policies: &[CompiledPolicy]) -> Self {
        let domains = config
            .domains
            .iter()
            .map(|d| {
                (
                    Box::from(d.domain.as_str()),
                    level(&d.descriptors, policies),
                )
            })
            .collect();
        EnvoyDomains { domains }
    }

    /// The tree of `domain`, if the file has it.
    pub(in crate::rules) fn domain(&self, domain: &str) -> Option<&Level> {
        self.domains.get(domain)
    }

    /// Tell whether the file has any domain.
    pub(in crate::rules) fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }
}

impl Level {
    /// The node that `entries` (key, value) reach, or `None` when they match no path to its
    /// end.
    pub(in crate::rules) fn lookup<'t>(&'t self, entries: &[(&str, &str)]) -> Option<&'t Node> {
        let mut level = self;
        for (i, (key, value)) in entries.iter().enumerate() {
            let node = level
                .exact
                .get(*key)
                .and_then(|values| values.get(*value))
                .or_else(|| level.any.get(*key))?;
            if i + 1 == entries.len() {
                return Some(node);
            }
            level = &node.children;
        }
        None
    }
}

fn level(descriptors: &[EnvoyDescriptor], policies: &[CompiledPolicy]) -> Level {
    let mut out = Level::default();
    for d in descriptors {
        let node = Node {
            target: target(&d.limit, policies),
            children: level(&d.descriptors, policies),
        };
        match &d.value {
            Some(value) => {
                out.exact
                    .entry(Box::from(d.key.as_str()))
                    .or_default()
                    .insert(Box::from(value.as_str()), node);
            }
            None => {
                out.any.insert(Box::from(d.key.as_str()), node);
            }
        }
    }
    out
}

fn target(limit: &DescriptorLimit, policies: &[CompiledPolicy]) -> Target {
    match limit {
        DescriptorLimit::None => Target::None,
        DescriptorLimit::Unlimited => Target::Unlimited,
        DescriptorLimit::Policy { name, shadow, unit } => {
            let Some(index) = policies.iter().position(|p| &p.named.name == name) else {
                return Target::None;
            };
            let policy = &policies[index].named.policy;
            Target::Policy {
                index,
                shadow: *shadow,
                limit: CurrentLimit {
                    name: policies[index].name,
                    requests_per_unit: policy.capacity(),
                    unit: unit.or_else(|| RateLimitUnit::of_window(policy.window_ns())),
                },
            }
        }
    }
}
