//! One request matched against the rules, once, before anything is charged: `[access]`,
//! the client's tier, the request's route and cost, and the key of each policy it passes
//! ([`Planned`]). What the match yields is owned (numbers and keys, no borrow of the
//! request), so a decision that waits for the mesh or Redis carries it instead of a copy of
//! the request; and it says whether this request needs IO ([`Planned::needs_io`]), so a
//! request whose policies are all local is decided at once whatever other routes use.

use super::Rules;
use super::compile::Layers;
use super::request::{MissingPart, Refusal, RequestFacts};
use crate::config::{Access, IdentitySource, OnMissing, TierSource};

/// (policy, key) of each layer a request passes, inline for the few a request usually has,
/// so that listing them allocates nothing.
pub(super) type Keyed = smallvec::SmallVec<[(usize, u64); 4]>;

/// A request matched against the rules: decided before any policy counts it, or the
/// policies to charge. Made by [`Rules::plan`], spent by [`Rules::charge`] or
/// [`Rules::charge_io`] on the same rules.
#[derive(Debug)]
#[allow(
    clippy::large_enum_variant,
    reason = "made and spent once per request, moved by value: a box would allocate each time"
)]
pub(crate) enum Planned {
    /// Exempt (`None`) or refused before any counting: an address in `[access]`, an exempt
    /// API key or subject, a missing part of a policy that refuses such requests.
    Before(Option<Refusal>),
    /// The policies to charge.
    Charge(Plan),
    /// A policy it passes counts by a field of its body, not read yet: read the body, up to
    /// this many bytes (longer: refused, [`Refusal::BodyTooLarge`]), and plan it again with
    /// the body.
    ReadBody(u64),
}

impl Planned {
    /// Tell whether deciding this request may wait for IO: it passes a `mesh` policy (whose
    /// key's owner the node may have to ask) or a `redis` one.
    pub(crate) fn needs_io(&self) -> bool {
        match self {
            Planned::Before(_) | Planned::ReadBody(_) => false,
            Planned::Charge(plan) => {
                !plan.refused && (!plan.global.is_empty() || !plan.exact.is_empty())
            }
        }
    }
}

/// What a trace says of a request's match: its route and the policies it passes.
#[cfg(feature = "otel")]
#[derive(Debug, Default)]
pub(crate) struct PlanSummary {
    /// The matched route's name.
    pub(crate) route: Option<&'static str>,
    /// The policies charged (tier's, route's, then the `mesh` and the `redis` ones).
    pub(crate) policies: Vec<&'static str>,
    /// It passes a `mesh` policy or more (whose keys' owners it may wait for).
    pub(crate) mesh: bool,
    /// It passes a `redis` policy (or more).
    pub(crate) redis: bool,
}

#[cfg(feature = "otel")]
impl Rules {
    /// Say what `planned` charges, by name (for a trace; allocates).
    pub(crate) fn summary(&self, planned: &Planned) -> PlanSummary {
        let Planned::Charge(plan) = planned else {
            return PlanSummary::default();
        };
        let named = |&(index, _): &(usize, u64)| self.policies[index].name;
        PlanSummary {
            route: plan.route.map(|r| self.routes[r].name),
            policies: plan
                .enforced
                .iter()
                .chain(&plan.global)
                .chain(&plan.exact)
                .map(named)
                .collect(),
            mesh: !plan.global.is_empty(),
            redis: !plan.exact.is_empty(),
        }
    }
}

/// Which policies a request passes, under which keys, at what cost.
#[derive(Debug)]
pub(crate) struct Plan {
    /// The client matches no tier and the file says `no_tier = "refuse"`.
    pub(super) refused: bool,
    /// The matched route's place in the rules' routes.
    pub(super) route: Option<usize>,
    pub(super) cost: u64,
    /// (policy, key) of the layers decided on this node, the tier's then the route's.
    pub(super) enforced: Keyed,
    pub(super) shadow: Keyed,
    /// The request's `mesh` policies, in order (one inline: most requests pass one at most).
    pub(super) global: smallvec::SmallVec<[(usize, u64); 1]>,
    /// The request's `redis` policies, in order.
    pub(super) exact: Keyed,
    /// The policies left out because the request lacks a part of their `by`.
    pub(super) skipped: Vec<MissingPart>,
}

#[cfg(test)]
thread_local! {
    /// How many requests this thread matched against rules: a test's count of matches.
    static PLANS_MADE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many requests this thread has matched against rules ([`Rules::plan`]).
#[cfg(test)]
pub(crate) fn plans_made() -> usize {
    PLANS_MADE.with(std::cell::Cell::get)
}

impl Rules {
    /// Remember, for `/v1/top`, the keys in clear of the policies `plan` charges for the
    /// request `facts`, the parts `show` allows shown (`[admin] show_identities`).
    #[cfg(feature = "node")]
    pub(crate) fn remember_identities(
        &self,
        facts: &RequestFacts<'_>,
        plan: &Plan,
        show: &super::identities::ShowIdentities,
    ) {
        let layers = [&plan.enforced[..], &plan.shadow, &plan.global, &plan.exact];
        self.remember_keys(facts, plan.route, layers, show);
    }

    /// Match one request against the rules: `[access]` and the exempt clients first, then
    /// the tier, the route (the most specific that matches), the cost and each policy's key.
    pub(crate) fn plan(&self, facts: &RequestFacts<'_>) -> Planned {
        #[cfg(test)]
        PLANS_MADE.with(|made| made.set(made.get() + 1));
        if let Some(screened) = self.screen(facts) {
            return Planned::Before(screened);
        }
        let route_index = self.routes.iter().position(|r| r.matches(facts));
        let route = route_index.map(|i| &self.routes[i]);
        let tier = self.tier_of(facts);
        if self.reads_body && facts.request.body.is_none() {
            let reads_body = |layers: &Layers| {
                [
                    &layers.enforced,
                    &layers.shadow,
                    &layers.global,
                    &layers.exact,
                ]
                .into_iter()
                .flatten()
                .any(|&i| self.models[i].as_ref().is_some_and(|m| m.uses_body()))
            };
            let route_reads = route.is_some_and(|r| r.prices_graphql() || reads_body(&r.layers));
            if tier.is_some_and(reads_body) || route_reads {
                return Planned::ReadBody(
                    route.map_or(crate::config::DEFAULT_MAX_BODY_BYTES, |r| r.max_body_bytes),
                );
            }
        }
        // The key of (environment, source, identity[, route]), its first two parts hashed
        // when the rules were made.
        let prefix = &self.client_keys[super::client_keys_slot(facts.identity.source)];
        let value = facts.identity.value.as_bytes();
        let client_key = prefix.key(&[value]);
        let route_key = route
            .map(|r| prefix.key(&[value, r.name.as_bytes()]))
            .unwrap_or(client_key);
        let mut missing: Option<MissingPart> = None;
        let mut skipped = Vec::new();
        // (policy index, key) of each layer: the tier's under the client's key, then the
        // route's under the client's and the route's; a policy that counts `by` under the
        // key of those parts of the request (left out, or the request refused, when it
        // lacks one).
        let mut keyed = |of: fn(&Layers) -> &Vec<usize>| -> Keyed {
            let tier_layers = tier.map_or(&[][..], |t| of(t)).iter().map(|&i| (i, false));
            let route_layers = route
                .map_or(&[][..], |r| of(&r.layers))
                .iter()
                .map(|&i| (i, true));
            let mut out = Keyed::new();
            for (i, via_route) in tier_layers.chain(route_layers) {
                let Some(model) = &self.models[i] else {
                    out.push((i, if via_route { route_key } else { client_key }));
                    continue;
                };
                match model.key(facts, route.map(|r| r.name), &self.config.identity) {
                    Ok(key) => out.push((i, key)),
                    Err(part) => {
                        let lacking = MissingPart {
                            policy: self.policies[i].name,
                            part,
                        };
                        match model.on_missing {
                            OnMissing::Refuse => {
                                missing.get_or_insert(lacking);
                            }
                            OnMissing::Skip => skipped.push(lacking),
                        }
                    }
                }
            }
            out
        };
        let enforced = keyed(|l| &l.enforced);
        let shadow = keyed(|l| &l.shadow);
        let global = keyed(|l| &l.global).into_iter().collect();
        let exact = keyed(|l| &l.exact);
        if let Some(missing) = missing {
            return Planned::Before(Some(Refusal::Missing(missing)));
        }
        let cost = match route.map(|r| r.cost_of(facts)) {
            None => 1,
            Some(Ok(cost)) => cost,
            Some(Err(refusal)) => return Planned::Before(Some(refusal)),
        };
        Planned::Charge(Plan {
            refused: tier.is_none() && self.config.refuse_without_tier,
            route: route_index,
            cost,
            enforced,
            shadow,
            global,
            exact,
            skipped,
        })
    }

    fn tier_of(&self, facts: &RequestFacts<'_>) -> Option<&Layers> {
        // The tier an earlier layer chose, else the first of `tier_from` that names one,
        // else the default; a name with no tier counts as none.
        if let Some(tier) = facts.tier {
            return self.tiers.get(tier);
        }
        for from in &self.config.tier_from {
            let named = match from {
                TierSource::Tenants => self.tenant_tier(facts),
                TierSource::Jwt(claim) => facts
                    .request
                    .claims
                    .and_then(|claims| claims.get(claim.as_str()))
                    .and_then(|value| value.as_str()),
                TierSource::Header(name) if facts.request.from_trusted_proxy => facts
                    .request
                    .headers
                    .and_then(|h| h.get(name))
                    .and_then(|v| v.to_str().ok()),
                TierSource::Header(_) => None,
            };
            if let Some(layers) = named.and_then(|tier| self.tiers.get(tier.trim())) {
                return Some(layers);
            }
        }
        self.config
            .default_tier
            .as_deref()
            .and_then(|tier| self.tiers.get(tier))
    }

    /// The tier `tenants` gives the client: an API key by the digest of its label, others
    /// by `kind:value`.
    fn tenant_tier(&self, facts: &RequestFacts<'_>) -> Option<&str> {
        let identity = facts.identity;
        if identity.source == IdentitySource::ApiKey {
            let plans = self.config.plans.as_deref();
            if self.api_key_tenants.is_empty() && plans.is_none() {
                return None;
            }
            let digest = self
                .hasher
                .label_digest("api_key", identity.value.as_bytes());
            return match self.api_key_tenants.get(&digest) {
                Some(tier) => Some(tier.as_str()),
                None => plans.and_then(|plans| plans.tier_of(digest)),
            };
        }
        if self.tenants.is_empty() {
            return None;
        }
        identity
            .tenant_name()
            .and_then(|name| self.tenants.get(&name))
            .map(String::as_str)
    }

    /// What `[access]` decides before any policy counts: exempt (`Some(None)`), refused
    /// (`Some(Some(_))`), or `None` to go on.
    fn screen(&self, facts: &RequestFacts<'_>) -> Option<Option<Refusal>> {
        let access = &self.config.access;
        let by_address = match facts.request.client_ip {
            Some(ip) if !access.is_empty() => access.of(ip),
            _ => Access::Limited,
        };
        match by_address {
            Access::Denied => return Some(Some(Refusal::Denied)),
            Access::Exempt => return Some(None),
            Access::Limited => {}
        }
        if !access.names_clients() {
            return None;
        }
        let identity = facts.identity;
        let exempt_key = identity.source == IdentitySource::ApiKey
            && !access.exempt_api_keys.is_empty()
            && access.exempt_api_keys.contains(
                &self
                    .hasher
                    .label_digest("api_key", identity.value.as_bytes()),
            );
        let exempt_subject = facts
            .request
            .claims
            .and_then(|claims| claims.get("sub"))
            .and_then(|sub| sub.as_str())
            .is_some_and(|sub| access.exempt_subjects.iter().any(|s| s == sub));
        (exempt_key || exempt_subject).then_some(None)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use http::Method;

    use super::*;
    use crate::backend::mesh::{GlobalLimits, MeshDecision};
    use crate::config::GatewayConfig;
    use crate::rules::Identity;

    /// A mesh that is never asked here.
    struct Unasked;

    impl GlobalLimits for Unasked {
        fn decide(&self, _: u32, _: u64, _: u64) -> MeshDecision {
            MeshDecision::Ready(None)
        }
    }

    /// A local policy for every client, and a mesh policy on `/global` alone.
    const FILE: &str = "key_secret = \"s\"\ndefault_tier = \"api\"\n\
        [policies.local]\nalgorithm = \"token-bucket\"\nrate = 1\nperiod = \"1h\"\nburst = 5\n\
        [policies.global]\nalgorithm = \"fixed-window\"\nlimit = 100\nwindow = \"1s\"\nbackend = \"mesh\"\n\
        [tiers.api]\npolicies = [\"local\"]\n\
        [[routes]]\nname = \"global\"\npath_prefix = \"/global\"\npolicies = [\"global\"]\n";

    fn planned(rules: &Rules, path: &str) -> Planned {
        let identity = Identity::new(IdentitySource::ApiKey, "k");
        rules.plan(&RequestFacts {
            identity: &identity,
            tier: None,
            method: &Method::GET,
            path,
            request: Default::default(),
        })
    }

    #[test]
    fn a_request_whose_policies_are_local_needs_no_io_while_another_route_has_a_mesh_policy() {
        let config = GatewayConfig::from_toml_str(FILE, "test.toml").unwrap();
        let rules = Rules::with_mesh(config, Arc::new(Unasked)).unwrap();
        assert!(
            rules.needs_io(),
            "the rule set as a whole has a mesh policy"
        );
        assert!(!planned(&rules, "/orders").needs_io());
        assert!(planned(&rules, "/global").needs_io());
        assert!(planned(&rules, "/global/x").needs_io());
    }

    #[test]
    fn a_plan_is_charged_as_a_decision_is() {
        let config = GatewayConfig::from_toml_str(FILE, "test.toml").unwrap();
        let rules = Rules::with_mesh(config, Arc::new(Unasked)).unwrap();
        let before = plans_made();
        for left in (0..5).rev() {
            let outcome = rules.charge(planned(&rules, "/orders"), 0);
            assert!(outcome.allowed);
            assert_eq!(outcome.enforced[0].decision.remaining, left);
        }
        assert!(!rules.charge(planned(&rules, "/orders"), 0).allowed);
        assert_eq!(plans_made() - before, 6, "one match per request");
    }
}
