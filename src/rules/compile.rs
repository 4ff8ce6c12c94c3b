//! The policy file compiled for deciding: each policy with its store (kept across a reload
//! when unchanged) and where it is decided, and tiers and routes as lists of policy numbers,
//! split by how each policy is decided.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use jiff::Timestamp;

use super::RulesError;
use super::request::PolicyReport;
use crate::algorithm::calendar::Warped;
use crate::clock::Nanos;
use crate::config::{Backend, GatewayConfig, NamedPolicy};
use crate::decision::Decision;
use crate::limiter::MAX_POLICIES;
use crate::local::{Charge, DEFAULT_MAX_KEYS, Store};
use crate::policy::Algorithm;

/// Where a policy that is not decided on this node alone is decided, and its number there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Remote {
    /// By the mesh ([`crate::backend::mesh::GlobalLimits`]), as its mesh policy number.
    Mesh(u32),
    /// By the exact backend ([`crate::backend::exact::ExactLimits`]), as its `redis`
    /// policy number.
    Exact(u32),
}

/// The longest a concurrency policy's denial says to wait, and its reset: a second.
const SLOT_RETRY_NS: Nanos = 1_000_000_000;

pub(super) struct CompiledPolicy {
    pub(super) named: NamedPolicy,
    pub(super) name: &'static str,
    pub(super) sf_name: &'static str,
    /// This node's counters: the policy itself when local, the fail-open fallback when exact.
    pub(super) store: Arc<Store<u64>>,
    /// Where the policy is decided when not by `store` alone.
    pub(super) remote: Option<Remote>,
    /// Its place in the file's policies.
    pub(super) index: u32,
    /// `ratemesh_decisions_total` of this policy by outcome, registered with the metrics
    /// recorder installed when the policy first decides (a request looks up no registry).
    pub(super) counters: [OnceLock<metrics::Counter>; 3],
    /// `ratemesh_mesh_refunds_total` of this policy, kept (0) and returned (1), registered at
    /// the first of each.
    pub(super) mesh_refunds: [OnceLock<metrics::Counter>; 2],
    /// Its `RateLimit-Policy` item for the limit it first reported (formatted once).
    pub(super) policy_field: OnceLock<(u64, http::HeaderValue)>,
    /// The keys it locked out (`block_for`; kept across a reload with the store).
    pub(super) lockouts: Option<Arc<super::lockout::Lockouts>>,
    /// What its denials answer, formatted at its first.
    pub(super) denial_forms: OnceLock<&'static crate::http::forms::DenialForms>,
    /// A calendar policy's clock (`calendar`).
    pub(super) warp: Option<crate::algorithm::calendar::Warp>,
    /// Its heaviest keys, admitted and denied (kept across a reload with the store).
    pub(super) top: Arc<super::top::PolicyTop>,
    /// Its recent keys in clear (`[admin] show_identities`).
    #[cfg(feature = "node")]
    pub(super) identities: Arc<super::identities::PolicyIdentities>,
    /// Its keys' overrides (the admin API; kept across a reload with the store).
    pub(super) overrides: Arc<super::overrides::PolicyOverrides>,
}

/// What a decision of a policy is counted as in `ratemesh_decisions_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counted {
    /// Admitted.
    Allowed = 0,
    /// Denied.
    Denied = 1,
    /// A shadow policy would have denied.
    ShadowDenied = 2,
}

impl Counted {
    fn label(self) -> &'static str {
        match self {
            Counted::Allowed => "allowed",
            Counted::Denied => "denied",
            Counted::ShadowDenied => "shadow_denied",
        }
    }
}

/// `name`, kept for the life of the process: the names of policies and routes (and their
/// `RateLimit-Policy` items), so that a decision's report copies a `&'static str` instead
/// of writing an `Arc`'s count, a cache line that every HTTP thread would take in turn.
/// Each distinct text is kept once, however often the file is reloaded: what is kept grows
/// only with the names the operator writes.
pub(super) fn intern(name: &str) -> &'static str {
    static KEPT: OnceLock<std::sync::Mutex<std::collections::HashSet<&'static str>>> =
        OnceLock::new();
    let mut kept = KEPT
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(&known) = kept.get(name) {
        return known;
    }
    let leaked: &'static str = Box::leak(Box::from(name));
    kept.insert(leaked);
    leaked
}

/// Count one decision of the policy named `name` as `counted`, through `cached` when given.
pub(super) fn count(
    cached: Option<&[OnceLock<metrics::Counter>; 3]>,
    name: &'static str,
    counted: Counted,
) {
    let register = || metrics::counter!("ratemesh_decisions_total", "policy" => name, "outcome" => counted.label());
    match cached {
        Some(counters) => counters[counted as usize]
            .get_or_init(register)
            .increment(1),
        None => register().increment(1),
    }
}

impl CompiledPolicy {
    /// Run `f` on the store that decides `key` at `now`: its override's while one runs,
    /// else the policy's own.
    #[inline]
    pub(super) fn with_store<R>(
        &self,
        key: u64,
        now: Nanos,
        f: impl FnOnce(&Store<u64>) -> R,
    ) -> R {
        self.overrides.with_store(&self.store, key, now, f)
    }

    /// Forget `key`'s counts under its override too (a reset); tell whether it had one.
    #[cfg(feature = "node")]
    pub(super) fn forget_overridden(&self, key: u64) -> bool {
        self.overrides.forget(key)
    }

    /// Its number among the mesh policies, if it is one the mesh decides.
    #[cfg(feature = "node")]
    pub(super) fn mesh_number(&self) -> Option<u32> {
        match self.remote {
            Some(Remote::Mesh(number)) => Some(number),
            _ => None,
        }
    }

    /// Its number among the `redis` policies, if it is one Redis decides.
    #[cfg(feature = "node")]
    pub(super) fn exact_number(&self) -> Option<u32> {
        match self.remote {
            Some(Remote::Exact(number)) => Some(number),
            _ => None,
        }
    }

    /// `now` on this policy's time axis: a calendar period's clock
    /// ([`crate::algorithm::calendar::Warp`]), or shifted by the zone's UTC offset, so that a
    /// fixed window of a day starts at local midnight.
    pub(super) fn local_now(&self, now: Nanos) -> Nanos {
        self.local_time(now).0
    }

    /// `now` on this policy's time axis, and (calendar periods) how to map durations back.
    fn local_time(&self, now: Nanos) -> (Nanos, Option<Warped>) {
        if let Some(warp) = &self.warp {
            let warped = warp.at(now);
            return (warped.now, Some(warped));
        }
        (self.zoned_now(now), None)
    }

    /// Decide `cost` for `key` at `now` on this node's counters (the key's override's while
    /// one runs), on the policy's time axis; set `charge` to what it took.
    pub(super) fn decide_local(
        &self,
        key: u64,
        now: Nanos,
        cost: u64,
        reserve: bool,
        charge: &mut Charge,
    ) -> Decision {
        let (at, warped) = self.local_time(now);
        let mut decision = self.with_store(key, now, |store| {
            store.decide_charge(&key, at, cost, reserve, charge)
        });
        if let Some(w) = warped {
            decision.reset_after_ns = w.real(decision.reset_after_ns);
            decision.retry_after_ns = w.real(decision.retry_after_ns);
        }
        decision
    }

    /// Give back `cost` that a decision of [`CompiledPolicy::decide_local`] took from
    /// `charge`, at `now`.
    pub(super) fn refund_local(&self, key: u64, charge: Charge, now: Nanos, cost: u64) {
        let at = self.local_now(now);
        self.with_store(key, now, |store| store.refund(&key, charge, at, cost));
    }

    fn zoned_now(&self, now: Nanos) -> Nanos {
        match &self.named.time_zone {
            None => now,
            Some(zone) => {
                let at =
                    Timestamp::from_nanosecond(i128::from(now)).unwrap_or(Timestamp::UNIX_EPOCH);
                let offset_ns = i64::from(zone.to_offset(at).seconds()) * 1_000_000_000;
                now.saturating_add_signed(offset_ns)
            }
        }
    }

    pub(super) fn report(&self, decision: Decision) -> PolicyReport {
        let decision = match self.named.max_hold {
            // A slot comes free when a response ends, which nothing here foresees: the log's
            // own times (when an entry would be reclaimed) say nothing of it.
            Some(_) => Decision {
                reset_after_ns: decision.reset_after_ns.min(SLOT_RETRY_NS),
                retry_after_ns: decision.retry_after_ns.min(SLOT_RETRY_NS),
                ..decision
            },
            None => decision,
        };
        let window_s = self.named.policy.window_ns().div_ceil(1_000_000_000);
        let field = || {
            let item = [("q", decision.limit), ("w", window_s)];
            let value = crate::http::sf::item_list(std::iter::once((self.sf_name, item)))?;
            // Kept like the name: a report's copy of it writes no count shared by threads.
            let kept = intern(value.to_str().ok()?);
            http::HeaderValue::from_maybe_shared(bytes::Bytes::from_static(kept.as_bytes()))
                .ok()
                .map(|value| (decision.limit, value))
        };
        let policy_field = match self.policy_field.get() {
            Some(cached) => Some(cached),
            None => field().map(|made| self.policy_field.get_or_init(|| made)),
        };
        PolicyReport {
            name: self.name,
            sf_name: self.sf_name,
            decision,
            window_s,
            shadow: self.named.shadow,
            index: self.index,
            policy_field: policy_field
                .filter(|(limit, _)| *limit == decision.limit)
                .map(|(_, value)| value.clone()),
            denial_forms: (decision.verdict == crate::Verdict::Denied).then(|| {
                *self
                    .denial_forms
                    .get_or_init(|| crate::http::forms::DenialForms::of(self.name, self.sf_name))
            }),
        }
    }
}

/// The policies of a tier or a route, by how each is decided.
#[derive(Default)]
pub(super) struct Layers {
    /// Decided on this node; a shaping policy last (it reserves a slot, never refunded).
    pub(super) enforced: Vec<usize>,
    /// Counted after an admission, never denying.
    pub(super) shadow: Vec<usize>,
    /// `redis` policies (decided last, in order).
    pub(super) exact: Vec<usize>,
    /// `mesh` policies (decided after the local ones, in order).
    pub(super) global: Vec<usize>,
}

pub(super) struct CompiledRoute {
    pub(super) name: &'static str,
    matching: crate::config::RouteMatch,
    pub(super) cost: u64,
    pub(super) layers: Layers,
    /// The longest body read for a policy that counts by a field of it.
    pub(super) max_body_bytes: u64,
    /// The cost taken from the request, if the route says so.
    cost_from: Option<crate::config::CostFrom>,
    /// The GraphQL documents this route priced lately, compiled (a route that prices them).
    programs: Option<super::graphql::Programs>,
}

impl CompiledRoute {
    pub(super) fn matches(&self, facts: &super::request::RequestFacts<'_>) -> bool {
        self.matching.matches(
            facts.method,
            facts.path,
            facts.request.host,
            facts.request.headers,
        )
    }

    /// Tell whether matching reads the host or headers.
    pub(super) fn reads_request(&self) -> bool {
        self.matching.reads_request() || self.cost_from.is_some()
    }

    /// The cost of the request `facts`: from `cost_from` when the request gives a number
    /// there (a header only from a trusted proxy), else the route's constant.
    pub(super) fn cost_of(
        &self,
        facts: &super::request::RequestFacts<'_>,
    ) -> Result<u64, super::request::Refusal> {
        use crate::config::CostSource;
        let Some(from) = &self.cost_from else {
            return Ok(self.cost);
        };
        let value = match &from.source {
            CostSource::Header(name) if facts.request.from_trusted_proxy => facts
                .request
                .headers
                .and_then(|h| h.get(name))
                .map(http::HeaderValue::as_bytes),
            CostSource::Header(_) => None,
            CostSource::Query(param) => facts.request.query_param(param),
            CostSource::GraphQl(pricing) => {
                use super::request::{GraphQlRefusal, Refusal};
                let programs =
                    self.programs
                        .as_ref()
                        .ok_or(Refusal::GraphQl(GraphQlRefusal::Invalid(
                            "the route keeps no compiled queries",
                        )))?;
                let (cost, _) =
                    super::graphql::price(pricing, programs, facts).map_err(Refusal::GraphQl)?;
                if cost > from.max_cost {
                    return Err(Refusal::GraphQl(GraphQlRefusal::TooCostly {
                        cost,
                        max_cost: from.max_cost,
                    }));
                }
                return Ok(cost.max(1));
            }
        };
        Ok(value.and_then(|v| from.cost(v)).unwrap_or(self.cost))
    }

    /// Tell whether the route prices GraphQL queries (it reads the body for them).
    pub(super) fn prices_graphql(&self) -> bool {
        self.cost_from
            .as_ref()
            .is_some_and(|c| matches!(c.source, crate::config::CostSource::GraphQl(_)))
    }
}

/// The compiled file.
pub(super) struct Compiled {
    pub(super) policies: Vec<CompiledPolicy>,
    pub(super) tiers: BTreeMap<String, Layers>,
    pub(super) routes: Vec<CompiledRoute>,
}

/// Compile `config`, keeping the store of every policy unchanged from `previous`; `mesh`
/// and `exact` tell whether those backends are there to decide remote policies.
pub(super) fn compile(
    config: &GatewayConfig,
    previous: Option<&[CompiledPolicy]>,
    mesh: bool,
    exact: bool,
) -> Result<Compiled, RulesError> {
    let number = |policies: Vec<&NamedPolicy>, name: &str| {
        policies
            .iter()
            .position(|p| p.name == name)
            .map(|i| i as u32)
    };
    let policies: Vec<CompiledPolicy> = config
        .policies
        .iter()
        .enumerate()
        .map(|(index, named)| {
            let previous = previous.and_then(|old| old.iter().find(|old| old.named == *named));
            if named.max_hold.is_some() {
                // Shown from the start, at 0 (a scrape that finds none reads it as such).
                let name = intern(&named.name);
                metrics::counter!("ratemesh_concurrency_reclaimed_total", "policy" => name)
                    .increment(0);
            }
            let kept = previous.map(|old| Arc::clone(&old.store));
            let overrides = previous
                .map(|old| Arc::clone(&old.overrides))
                .unwrap_or_default();
            let top = previous.map(|old| Arc::clone(&old.top)).unwrap_or_default();
            #[cfg(feature = "node")]
            let identities = previous
                .map(|old| Arc::clone(&old.identities))
                .unwrap_or_default();
            let lockouts = named.block_for.map(|block| {
                previous
                    .and_then(|old| old.lockouts.clone())
                    .unwrap_or_else(|| {
                        Arc::new(super::lockout::Lockouts::new(
                            crate::clock::duration_to_nanos(block),
                        ))
                    })
            });
            let remote = match named.backend {
                Backend::Local => None,
                Backend::Mesh if mesh => {
                    number(config.mesh_policies(), &named.name).map(Remote::Mesh)
                }
                Backend::Redis if exact => {
                    number(config.redis_policies(), &named.name).map(Remote::Exact)
                }
                // No backend to ask: the node's own store decides.
                Backend::Mesh | Backend::Redis => None,
            };
            CompiledPolicy {
                named: named.clone(),
                name: intern(&named.name),
                sf_name: intern(&crate::http::sf::sf_string(&named.name)),
                store: kept.unwrap_or_else(|| Arc::new(Store::new(named.policy, DEFAULT_MAX_KEYS))),
                remote,
                index: index as u32,
                counters: Default::default(),
                mesh_refunds: Default::default(),
                policy_field: OnceLock::new(),
                lockouts,
                denial_forms: OnceLock::new(),
                overrides,
                warp: named
                    .calendar
                    .clone()
                    .map(crate::algorithm::calendar::Warp::new),
                top,
                #[cfg(feature = "node")]
                identities,
            }
        })
        .collect();
    let layers = |names: &[String]| split(&policies, names);
    let tiers: BTreeMap<String, Layers> = config
        .tiers
        .iter()
        .map(|(name, names)| (name.clone(), layers(names)))
        .collect();
    let routes: Vec<CompiledRoute> = config
        .routes
        .iter()
        .map(|route| CompiledRoute {
            name: intern(&route.name),
            matching: route.matching.clone(),
            cost: route.cost,
            layers: layers(&route.policies),
            max_body_bytes: route.max_body_bytes,
            cost_from: route.cost_from.clone(),
            programs: route
                .cost_from
                .as_ref()
                .filter(|c| matches!(c.source, crate::config::CostSource::GraphQl(_)))
                .map(|_| super::graphql::Programs::default()),
        })
        .collect();
    check_counts(&tiers, &routes)?;
    Ok(Compiled {
        policies,
        tiers,
        routes,
    })
}

/// Sort the policies `names` by how each is decided.
fn split(policies: &[CompiledPolicy], names: &[String]) -> Layers {
    let mut layers = Layers::default();
    let index = |name: &String| policies.iter().position(|p| &p.named.name == name);
    for i in names.iter().filter_map(index) {
        let list = match (policies[i].named.shadow, policies[i].remote) {
            (true, _) => &mut layers.shadow,
            (false, Some(Remote::Exact(_))) => &mut layers.exact,
            (false, Some(Remote::Mesh(_))) => &mut layers.global,
            (false, None) => &mut layers.enforced,
        };
        list.push(i);
    }
    // A shaping policy reserves a slot: check it last so it never needs a refund.
    layers.enforced.sort_by_key(|&i| {
        matches!(
            policies[i].named.policy.algorithm(),
            Algorithm::LeakyBucketShape { .. }
        )
    });
    layers
}

/// Refuse a file under which one request would meet more policies on this node than one
/// decision layers, or more `mesh` policies than that: every tier with every route.
fn check_counts(
    tiers: &BTreeMap<String, Layers>,
    routes: &[CompiledRoute],
) -> Result<(), RulesError> {
    let no_tier = (String::new(), Layers::default());
    for (tier_name, tier) in tiers
        .iter()
        .chain(std::iter::once((&no_tier.0, &no_tier.1)))
    {
        for route in routes {
            // A `redis` policy is decided locally when the rules decide without IO.
            let count = tier.enforced.len()
                + route.layers.enforced.len()
                + tier.exact.len()
                + route.layers.exact.len();
            let count = count.max(tier.global.len() + route.layers.global.len());
            if count > MAX_POLICIES {
                return Err(RulesError::TooManyPolicies {
                    tier: tier_name.clone(),
                    route: route.name.to_string(),
                    count,
                });
            }
        }
    }
    Ok(())
}
