//! One request through its layers, as [`super::plan`] matched it: charge the local layers
//! → ask the remote ones (the `mesh` policies, then the `redis` policies, in order) → on any
//! denial, give the local and `mesh` charges back ([`Passage::refund`], the local ones
//! through the same [`Charges`] as a local denial) and the `redis` ones
//! ([`Passage::refund_exact`]).

use super::Rules;
use super::compile::Remote;
use super::plan::{Keyed, Plan, Planned};
use super::request::{Outcome, Pending, PolicyReport, Refusal, RequestFacts};
use crate::backend::exact::RefundFuture;
use crate::backend::exact::{ExactAnswer, ExactDecision, ExactError, ExactFuture, fail_over};
use crate::backend::mesh::{MeshAnswer, MeshDecision};
use crate::clock::Nanos;
use crate::decision::MeshCharge;
use crate::decision::{Decision, Verdict};
use crate::limiter::{Charges, decide_in_layers};
use crate::local::Charge;

/// The name reported (headers, JSON body, metrics) for a client refused because it matches
/// no tier and the file says `no_tier = "refuse"`.
pub const NO_TIER_POLICY: &str = "no_tier";

/// [`NO_TIER_POLICY`] as a structured-field string.
const NO_TIER_SF_NAME: &str = "\"no_tier\"";

/// How long a request that the mesh cannot decide at once is denied for, when the rules
/// decide without waiting.
const MESH_BUSY_RETRY_NS: Nanos = 1_000_000;

/// A request on its way through its layers: what this node charged, what each layer said.
struct Passage<'r> {
    rules: &'r Rules,
    plan: Plan,
    now: Nanos,
    /// The layers charged on this node, in order, and what each took.
    local: Keyed,
    charges: Charges,
    reports: Vec<PolicyReport>,
    /// The tightest admission so far, or the denial.
    decision: Decision,
    /// A `redis` policy that fails closed could not be decided.
    unavailable: Option<&'static str>,
    /// The `redis` policies that charged the request, and when their calls were sent: what
    /// a later denial gives back.
    exact_charged: smallvec::SmallVec<[(usize, u64, std::time::Instant); 2]>,
    /// The `mesh` policies that charged the request, with what each took: what a later
    /// denial gives back.
    mesh_charged: smallvec::SmallVec<[(usize, u64, MeshCharge); 1]>,
}

impl<'r> Passage<'r> {
    /// Charge the local layers of `plan` (and its `redis` policy on its local store, when
    /// `exact_here`); a denial by one gives the earlier ones back.
    fn start(rules: &'r Rules, mut plan: Plan, now: Nanos, exact_here: bool) -> Self {
        // The plan's enforced layers are read only from here on, as `local`.
        let mut local = std::mem::take(&mut plan.enforced);
        if exact_here {
            local.extend(std::mem::take(&mut plan.exact));
        }
        let mut reports = Vec::with_capacity(local.len() + 1);
        // What each admitting layer took, for a remote denial to give back.
        let mut charges = Charges::default();
        let decision = decide_in_layers(
            local.len(),
            |i, charge| {
                let (p, key) = local[i];
                let policy = &rules.policies[p];
                // A key locked out (`block_for`) is denied until its lockout ends, uncharged.
                if let Some(left) = policy.lockouts.as_ref().and_then(|l| l.left(key, now)) {
                    let limit = policy.named.policy.capacity();
                    let decision = Decision::denied(limit, 0, left, left);
                    policy.top.note(key, false, now);
                    reports.push(policy.report(decision));
                    return decision;
                }
                let mut decision = policy.decide_local(key, now, plan.cost, true, charge);
                if decision.verdict == Verdict::Denied
                    && let Some(left) = policy.lockouts.as_ref().and_then(|l| l.lock(key, now))
                {
                    decision.retry_after_ns = decision.retry_after_ns.max(left);
                    decision.reset_after_ns = decision.reset_after_ns.max(left);
                }
                policy.top.note(key, decision.is_allowed(), now);
                reports.push(policy.report(decision));
                if decision.is_allowed() {
                    charges.note(i, *charge);
                }
                decision
            },
            |i, charge| rules.refund(local[i], charge, plan.cost, now),
        );
        if !decision.is_allowed() {
            // `decide_in_layers` gave the earlier layers' charges back.
            charges = Charges::default();
        }
        Passage {
            rules,
            plan,
            now,
            local,
            charges,
            reports,
            decision,
            unavailable: None,
            exact_charged: smallvec::SmallVec::new(),
            mesh_charged: smallvec::SmallVec::new(),
        }
    }

    fn admitted(&self) -> bool {
        self.decision.verdict == Verdict::Allowed && self.unavailable.is_none()
    }

    /// Ask the mesh for `mesh` policy `p` under `key`, once every layer before it admitted
    /// the request.
    fn ask_mesh(&self, p: usize, key: u64) -> Option<MeshDecision> {
        if !self.admitted() {
            return None;
        }
        let Some(Remote::Mesh(number)) = self.rules.policies[p].remote else {
            return None;
        };
        let mesh = self.rules.mesh.as_ref()?;
        Some(mesh.decide(number, key, self.plan.cost))
    }

    /// Take the mesh's answer for policy `p` (key `key`): an admission's charge is kept for
    /// a later denial to give back.
    fn settle_mesh(&mut self, p: usize, key: u64, answer: MeshAnswer) {
        if let Some(charge) = answer.charge.filter(|_| answer.decision.is_allowed()) {
            self.mesh_charged.push((p, key, charge));
        }
        self.settle(p, key, answer.decision);
    }

    /// Ask the exact backend for `redis` policy `p` under `key`, once every layer before it
    /// admitted the request.
    fn ask_exact(&self, p: usize, key: u64) -> Option<ExactFuture<'r>> {
        if !self.admitted() {
            return None;
        }
        let Some(Remote::Exact(number)) = self.rules.policies[p].remote else {
            return None;
        };
        let exact = self.rules.exact.as_ref()?;
        let route = self.rules.exact_route(self.plan.route, p);
        Some(exact.decide(number, key, route, self.plan.cost))
    }

    /// Take a remote layer's decision: report it; a denial gives the local charges back.
    fn settle(&mut self, p: usize, key: u64, decision: Decision) {
        let policy = &self.rules.policies[p];
        policy.top.note(key, decision.is_allowed(), self.now);
        self.reports.push(policy.report(decision));
        if decision.verdict != Verdict::Allowed {
            self.decision = decision;
            self.refund();
        }
    }

    /// Take the exact backend's answer for policy `p` (key `key`) through its fail mode.
    fn settle_exact(&mut self, p: usize, key: u64, answer: Result<ExactAnswer, ExactError>) {
        let policy = &self.rules.policies[p];
        let (cost, at) = (self.plan.cost, policy.local_now(self.now));
        let sent = answer.as_ref().ok().map(|a| a.sent);
        let fallback = || policy.store.decide(&key, at, cost);
        match fail_over(
            policy.name,
            policy.named.fail_mode,
            answer.map(|a| a.decision),
            fallback,
        ) {
            ExactDecision::Exact(decision) => {
                if let Some(sent) = sent.filter(|_| decision.is_allowed()) {
                    self.exact_charged.push((p, key, sent));
                }
                self.settle(p, key, decision)
            }
            ExactDecision::Fallback(decision) => self.settle(p, key, decision),
            ExactDecision::Unavailable => {
                self.unavailable = Some(policy.name);
                self.refund();
            }
        }
    }

    /// Give back what the `redis` policies took, once a later one denied the request (or
    /// could not decide it and fails closed).
    async fn refund_exact(&mut self) {
        if self.admitted() {
            return;
        }
        let Some(exact) = self.rules.exact.as_ref() else {
            return;
        };
        for (p, key, sent) in std::mem::take(&mut self.exact_charged).into_iter().rev() {
            let Some(Remote::Exact(number)) = self.rules.policies[p].remote else {
                continue;
            };
            let route = self.rules.exact_route(self.plan.route, p);
            let refunded = exact.refund(number, key, route, self.plan.cost, sent).await;
            self.rules.note_refund(p, refunded);
        }
    }

    /// Give back what the `mesh` layers took, then the local ones (latest first). A mesh
    /// charge whose lease moved on meanwhile stays counted: the cluster then admits less,
    /// never more.
    fn refund(&mut self) {
        let (rules, local, cost, now) = (self.rules, &self.local, self.plan.cost, self.now);
        for (p, key, charge) in std::mem::take(&mut self.mesh_charged).into_iter().rev() {
            rules.refund_mesh(p, key, cost, charge);
        }
        std::mem::take(&mut self.charges)
            .refund(&mut |i, charge| rules.refund(local[i], charge, cost, now));
    }

    fn finish(self) -> Outcome {
        let allowed = self.admitted();
        let mut outcome = self.rules.outcome(
            &self.plan,
            allowed,
            self.decision.delay_ns,
            self.reports,
            self.now,
        );
        outcome.backend_unavailable = self.unavailable;
        if allowed {
            // `count_when` policies: settled by the response's status.
            // Concurrency policies: given back when the response ends.
            let holds = |p: usize| self.rules.policies[p].named.max_hold.is_some();
            let pending = |p: usize, key: u64| Pending {
                policy: p,
                key,
                charge: Charge::Key,
                at: self.now,
                cost: self.plan.cost,
                sent: None,
                route: None,
                mesh: None,
                holds: holds(p),
            };
            let counts_by_status = |p: usize| {
                let named = &self.rules.policies[p].named;
                named.count_when.is_some() || named.max_hold.is_some()
            };
            for (i, &(p, key)) in self.local.iter().enumerate() {
                if counts_by_status(p) {
                    let charge = self.charges.charge_of(i);
                    outcome.pending.push(Pending {
                        charge,
                        ..pending(p, key)
                    });
                }
            }
            for &(p, key, sent) in &self.exact_charged {
                if counts_by_status(p) {
                    let route = self.rules.exact_route(self.plan.route, p);
                    outcome.pending.push(Pending {
                        sent: Some(sent),
                        route,
                        ..pending(p, key)
                    });
                }
            }
            for &(p, key, charge) in &self.mesh_charged {
                if counts_by_status(p) {
                    outcome.pending.push(Pending {
                        mesh: Some(charge),
                        ..pending(p, key)
                    });
                }
            }
        }
        outcome
    }
}

impl Rules {
    /// Settle a `count_when` charge by the response's `status`: kept when the policy counts
    /// it, given back otherwise. Call it once per pending charge of an admitted request's
    /// [`Outcome::pending`], on the rules that decided it. A local or `mesh` policy's charge
    /// is given back before it returns (a `mesh` one to the node's lease of the key, if it
    /// still holds the lease the charge came from); a `redis` policy's by the future it
    /// returns, which the caller drives (it may outlive the response: spawn it).
    pub fn settle(&self, pending: &Pending, status: u16) -> Option<RefundFuture<'_>> {
        let policy = self.policies.get(pending.policy)?;
        let counted = policy
            .named
            .count_when
            .as_ref()
            .is_none_or(|when| when.contains(status));
        if counted || pending.holds {
            return None;
        }
        self.give_back(pending)
    }

    /// Give back a concurrency policy's slots that an admitted request held
    /// ([`Pending::holds_slots`]), its response over at `now`. Call it once per such pending
    /// charge, on the rules that decided it. A slot held `max_hold` or longer was reclaimed
    /// by then (it left the policy's log, and another request may hold it): it is counted in
    /// `ratemesh_concurrency_reclaimed_total{policy}`, not given back (as is a `redis` slot
    /// Redis no longer finds). A `redis` policy's
    /// slots go back by the future it returns (spawn it), its `max_hold` counted from when
    /// the call that took them was sent, less a sixteenth for the clocks' disagreement.
    pub fn release(&self, pending: &Pending, now: Nanos) -> Option<RefundFuture<'_>> {
        let policy = self.policies.get(pending.policy)?;
        let hold = crate::clock::duration_to_nanos(policy.named.max_hold?);
        let held = match pending.sent {
            Some(sent) => crate::clock::duration_to_nanos(sent.elapsed()).saturating_add(hold / 16),
            None => now.saturating_sub(pending.at),
        };
        let reclaimed = || {
            metrics::counter!("ratemesh_concurrency_reclaimed_total", "policy" => policy.name)
                .increment(1);
        };
        if held >= hold {
            reclaimed();
            return None;
        }
        let refund = self.give_back(pending)?;
        Some(Box::pin(async move {
            let given_back = refund.await;
            // Redis found no entry of the call's (it left the log): reclaimed at `max_hold`.
            if matches!(given_back, Ok(false)) {
                reclaimed();
            }
            given_back
        }))
    }

    /// Give a pending charge back: a local or `mesh` one before it returns, a `redis` one by
    /// the future it returns.
    fn give_back(&self, pending: &Pending) -> Option<RefundFuture<'_>> {
        let policy = self.policies.get(pending.policy)?;
        if let Some(charge) = pending.mesh {
            self.refund_mesh(pending.policy, pending.key, pending.cost, charge);
            return None;
        }
        if let Some(sent) = pending.sent {
            let Some(Remote::Exact(number)) = policy.remote else {
                return None;
            };
            let exact = self.exact.as_ref()?;
            let (p, cost) = (pending.policy, pending.cost);
            let refund = exact.refund(number, pending.key, pending.route, cost, sent);
            return Some(Box::pin(async move {
                let refunded = refund.await;
                let given_back = refunded.as_ref().is_ok_and(|&back| back);
                self.note_refund(p, refunded);
                Ok(given_back)
            }));
        }
        self.refund(
            (pending.policy, pending.key),
            pending.charge,
            pending.cost,
            pending.at,
        );
        None
    }

    /// The route whose name `redis` policy `p`'s keys carry for a request of `route`: the
    /// route's own policies (not counting `by`) are counted per route.
    pub(super) fn exact_route(&self, route: Option<usize>, p: usize) -> Option<&'static str> {
        route
            .map(|r| &self.routes[r])
            .filter(|r| r.layers.exact.contains(&p) && self.models[p].is_none())
            .map(|r| r.name)
    }

    /// Count and log a `redis` refund of policy `p` that failed (the charge stays counted).
    pub(super) fn note_refund(&self, p: usize, refunded: Result<bool, ExactError>) {
        if let Err(error) = refunded {
            let name = self.policies[p].name;
            metrics::counter!("ratemesh_refunds_failed_total", "policy" => name).increment(1);
            tracing::warn!(policy = name, %error, "could not give a charge back; it stays counted");
        }
    }

    /// Give back `cost` that `mesh` policy `p` took for `key` (`charge`), counted by
    /// whether it went back; return whether it did.
    pub(super) fn refund_mesh(&self, p: usize, key: u64, cost: u64, charge: MeshCharge) -> bool {
        let (Some(mesh), Some(Remote::Mesh(number))) = (&self.mesh, self.policies[p].remote) else {
            return false;
        };
        let back = mesh.refund(number, key, cost, charge);
        let name = self.policies[p].name;
        let result = if back { "returned" } else { "kept" };
        self.policies[p].mesh_refunds[usize::from(back)]
            .get_or_init(|| metrics::counter!("ratemesh_mesh_refunds_total", "policy" => name, "result" => result))
            .increment(1);
        back
    }

    /// Give back `cost` that layer `(p, key)` took from `charge` at `now`.
    fn refund(&self, (p, key): (usize, u64), charge: Charge, cost: u64, now: Nanos) {
        self.policies[p].refund_local(key, charge, now, cost);
    }

    fn count_shadow(&self, plan: &Plan, now: Nanos) -> Vec<PolicyReport> {
        plan.shadow
            .iter()
            .map(|&(p, key)| {
                let policy = &self.policies[p];
                let mut charge = Charge::Key;
                policy.report(policy.decide_local(key, now, plan.cost, true, &mut charge))
            })
            .collect()
    }

    fn outcome(
        &self,
        plan: &Plan,
        allowed: bool,
        delay_ns: Nanos,
        enforced: Vec<PolicyReport>,
        now: Nanos,
    ) -> Outcome {
        Outcome {
            allowed,
            cost: plan.cost,
            route: plan.route.map(|r| self.routes[r].name),
            enforced,
            shadow: if allowed {
                self.count_shadow(plan, now)
            } else {
                Vec::new()
            },
            delay_ns: if allowed { delay_ns } else { 0 },
            backend_unavailable: None,
            refused: None,
            exempt: false,
            skipped: plan.skipped.clone(),
            pending: Vec::new(),
        }
    }

    /// The outcome of a request refused before any counting, or exempt from every policy.
    fn before_counting(&self, refused: Option<Refusal>) -> Outcome {
        Outcome {
            allowed: refused.is_none(),
            cost: 0,
            route: None,
            enforced: Vec::new(),
            shadow: Vec::new(),
            delay_ns: 0,
            backend_unavailable: None,
            refused,
            exempt: refused.is_none(),
            skipped: Vec::new(),
            pending: Vec::new(),
        }
    }

    /// The outcome for a client that matches no tier under `no_tier = "refuse"`: denied by
    /// [`NO_TIER_POLICY`], a limit of zero that no retry can meet (nothing is charged).
    fn refused(&self, plan: &Plan) -> Outcome {
        let report = PolicyReport {
            name: NO_TIER_POLICY,
            sf_name: NO_TIER_SF_NAME,
            decision: Decision::cannot_fit(0),
            window_s: 0,
            shadow: false,
            index: u32::MAX,
            policy_field: None,
            denial_forms: None,
        };
        self.outcome(plan, false, 0, vec![report], 0)
    }

    /// Decide one request at `now` (nanoseconds on the limiter's clock), without IO.
    ///
    /// A `mesh` policy is decided by the node's lease of the key (one compare-and-swap, on
    /// the node's clock) without waiting: when the lease is short, the request is denied
    /// for a millisecond. A `redis` policy is answered here by its local store, as when it
    /// fails open. Use [`Rules::decide_exact`] to wait for the mesh and to ask Redis.
    ///
    /// A policy that counts by a field of the body (`json:`, `form:`) reads it from
    /// [`RequestParts::body`](super::RequestParts::body): without one, the field is
    /// missing.
    pub fn decide(&self, facts: &RequestFacts<'_>, now: Nanos) -> Outcome {
        self.charge(self.plan_given(facts), now)
    }

    /// Plan a request as its caller gave it: a body it did not give is an empty one.
    fn plan_given(&self, facts: &RequestFacts<'_>) -> Planned {
        match self.plan(facts) {
            Planned::ReadBody(_) => {
                let mut given = *facts;
                given.request.body = Some(b"");
                self.plan(&given)
            }
            planned => planned,
        }
    }

    /// Decide one request with the IO it may need: a `mesh` policy waits for the key's owner
    /// when the node's lease is short, and a `redis` policy asks the exact backend (each in
    /// order, after the local ones pass; a denial by any, or a failure under
    /// `fail_mode = "closed"`, gives the charges of the others back).
    pub async fn decide_exact(&self, facts: &RequestFacts<'_>, now: Nanos) -> Outcome {
        self.charge_io(self.plan_given(facts), now).await
    }

    /// Charge a request these rules planned, at `now`, without IO (as [`Rules::decide`]
    /// does); for a plan with no `mesh` or `redis` policy, the same outcome as
    /// [`Rules::charge_io`].
    pub(crate) fn charge(&self, planned: Planned, now: Nanos) -> Outcome {
        let plan = match planned {
            Planned::Before(refused) => return self.before_counting(refused),
            // The layer reads the body and plans again, `decide` plans with the body given:
            // a body left unread counts as one too long to read.
            Planned::ReadBody(limit) => {
                return self.before_counting(Some(Refusal::BodyTooLarge { limit }));
            }
            Planned::Charge(plan) if plan.refused => return self.refused(&plan),
            Planned::Charge(plan) => plan,
        };
        let mut passage = Passage::start(self, plan, now, true);
        for (p, key) in std::mem::take(&mut passage.plan.global) {
            let Some(mesh) = passage.ask_mesh(p, key) else {
                break;
            };
            let busy = Decision::denied(passage.decision.limit, 0, 0, MESH_BUSY_RETRY_NS);
            passage.settle_mesh(p, key, mesh.answer_now_or(busy));
        }
        passage.finish()
    }

    /// Charge a request these rules planned, at `now`, with the IO it may need (as
    /// [`Rules::decide_exact`] does).
    pub(crate) async fn charge_io(&self, planned: Planned, now: Nanos) -> Outcome {
        let plan = match planned {
            Planned::Before(refused) => return self.before_counting(refused),
            Planned::ReadBody(limit) => {
                return self.before_counting(Some(Refusal::BodyTooLarge { limit }));
            }
            Planned::Charge(plan) if plan.refused => return self.refused(&plan),
            Planned::Charge(plan) => plan,
        };
        let mut passage = Passage::start(self, plan, now, false);
        for (p, key) in std::mem::take(&mut passage.plan.global) {
            let Some(mesh) = passage.ask_mesh(p, key) else {
                break;
            };
            let answer = mesh.answer().await;
            passage.settle_mesh(p, key, answer);
        }
        let exact = std::mem::take(&mut passage.plan.exact);
        for (p, key) in exact {
            let Some(answer) = passage.ask_exact(p, key) else {
                break;
            };
            let answer = answer.await;
            passage.settle_exact(p, key, answer);
        }
        passage.refund_exact().await;
        passage.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_s_key_is_the_hash_of_its_environment_source_and_identity() {
        use crate::config::GatewayConfig;
        let config = GatewayConfig::from_toml_str(
            "env = \"prod\"\nkey_secret = \"s\"\ndefault_tier = \"t\"\n[policies.p]\nalgorithm = \"fixed-window\"\nlimit = 2\nwindow = \"1m\"\n\
             [tiers.t]\npolicies = [\"p\"]\n",
            "test.toml",
        )
        .unwrap();
        let rules = Rules::new(config).unwrap();
        for source in super::super::CLIENT_KEY_SOURCES {
            let slot = super::super::client_keys_slot(source);
            assert_eq!(super::super::CLIENT_KEY_SOURCES[slot], source);
            assert_eq!(
                rules.client_keys[slot].key(&[b"k-1"]),
                rules
                    .hasher
                    .key(&[b"prod", source.name().as_bytes(), b"k-1"])
            );
        }
    }

    #[test]
    fn the_no_tier_name_is_serialized_as_a_string() {
        assert_eq!(NO_TIER_SF_NAME, crate::http::sf::sf_string(NO_TIER_POLICY));
    }
}
