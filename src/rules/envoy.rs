//! Envoy's rate limit service API decided by the rules: a request names a domain of the
//! file's `[envoy]` section and carries descriptors, each matched to the policy of its
//! configured descriptor ([`matcher`]) and decided under its own key.
//!
//! One request is charged all or nothing, like an HTTP request's layers:
//!
//! 1. every descriptor on this node's policies is decided (a check-only descriptor, of cost
//!    0, only looks); if any is over its limit, the others' charges are given back;
//! 2. then, one after another, the descriptors on `mesh` policies, then those on `redis`
//!    policies (a check-only one asks Redis to look, or takes a token of the mesh and gives
//!    it back at once); the first one over its limit gives back the local charges and the
//!    earlier remote ones (a `mesh` charge to the node's lease it came from, if it still
//!    holds it), and the later remote ones are not asked;
//! 3. shadow descriptors are counted once the request is admitted, and never make it over.
//!
//! Keys are keyed hashes ([`crate::ids::KeyHasher`]) of `(env, "envoy", domain, key₁,
//! value₁, …)`: each distinct value of a descriptor has its own counters, and no value is
//! ever stored, logged or used as a metric label.

mod matcher;

use super::Rules;
use super::compile::Remote;
use super::request::{Outcome, PolicyReport};
use crate::backend::exact::{ExactDecision, fail_over};
use crate::clock::Nanos;
use crate::decision::{Decision, MeshCharge, Verdict};
use crate::local::Charge;
pub use matcher::CurrentLimit;
pub(super) use matcher::EnvoyDomains;
use matcher::Target;

/// The most descriptors one request may carry.
pub const MAX_DESCRIPTORS_PER_REQUEST: usize = 64;

/// One descriptor of a request: its entries and the tokens it takes.
#[derive(Debug, Clone)]
pub struct DescriptorQuery<'a> {
    /// `(key, value)` entries, outermost first.
    pub entries: Vec<(&'a str, &'a str)>,
    /// Tokens the descriptor takes (its `hits_addend`); 0 only checks: it takes nothing and
    /// is over the limit when its policy has no room for one more.
    pub hits: u64,
}

/// How a descriptor met the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DescriptorMatch {
    /// It matches no configured descriptor: never limited.
    Unknown,
    /// It matches an `unlimited` descriptor.
    Unlimited,
    /// It matches a descriptor with a policy.
    Limited,
    /// It matches a descriptor in shadow mode: counted, never over the limit.
    Shadow,
}

/// One descriptor's part in the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorStatus {
    /// Over its limit.
    pub over_limit: bool,
    /// How it met the file.
    pub matched: DescriptorMatch,
    /// Its limit; `None` when unknown, unlimited, or a check-only descriptor on a remote
    /// policy (not asked).
    pub limit: Option<CurrentLimit>,
    /// Tokens left after this request (`u64::MAX` when unlimited; 0 when not asked).
    pub remaining: u64,
    /// Nanoseconds until its limit is whole again (a window's end); `None` when it was not
    /// decided or no wait helps (a cost above the limit).
    pub reset_after_ns: Option<Nanos>,
}

/// The answer to one request.
#[derive(Debug, Clone)]
pub struct EnvoyOutcome {
    /// Some enforced descriptor is over its limit.
    pub over_limit: bool,
    /// One status per descriptor, in the request's order.
    pub statuses: Vec<DescriptorStatus>,
    /// The decided policies as an HTTP request reports them (the one over its limit last),
    /// for the `RateLimit` fields and the decision counters.
    pub outcome: Outcome,
}

/// Why a request was not decided.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvoyError {
    /// The file has no such domain.
    #[error("the policy file has no `[[envoy.domains]]` entry for this domain")]
    UnknownDomain,
    /// More descriptors than [`MAX_DESCRIPTORS_PER_REQUEST`].
    #[error("{0} descriptors; at most {MAX_DESCRIPTORS_PER_REQUEST} in one request")]
    TooManyDescriptors(usize),
}

/// A descriptor that meets a policy: where its tokens go.
#[derive(Debug, Clone, Copy)]
struct Pending {
    slot: usize,
    policy: usize,
    key: u64,
    cost: u64,
}

/// One request on its way: what it charged on this node, what each descriptor got.
struct Run<'r> {
    rules: &'r Rules,
    now: Nanos,
    statuses: Vec<DescriptorStatus>,
    /// Local descriptors (and check-only ones on local policies), in request order.
    local: Vec<Pending>,
    global: Vec<Pending>,
    exact: Vec<Pending>,
    shadow: Vec<Pending>,
    /// Local charges to give back on a denial: the descriptor and where it took from.
    charged: Vec<(Pending, Charge)>,
    /// The `redis` descriptors that charged, with their policy's number and when their call
    /// was sent: what a later denial gives back.
    exact_charged: Vec<(Pending, u32, std::time::Instant)>,
    /// The `mesh` descriptors that charged, with what each took: what a later denial gives
    /// back.
    mesh_charged: Vec<(Pending, MeshCharge)>,
    admitted: Vec<PolicyReport>,
    denied: Vec<PolicyReport>,
    shadow_reports: Vec<PolicyReport>,
    unavailable: Option<&'static str>,
}

impl Rules {
    /// Tell whether the file describes any Envoy domain.
    pub fn has_envoy_domains(&self) -> bool {
        !self.envoy.is_empty()
    }

    /// Decide one request of Envoy's rate limit service API at `now` (nanoseconds on the
    /// limiter's clock): `domain` and its descriptors. A `mesh` policy may wait for its
    /// key's owner (at most its `max_wait`) and a `redis` policy asks Redis, as in
    /// [`Rules::decide_exact`].
    pub async fn decide_descriptors(
        &self,
        domain: &str,
        queries: &[DescriptorQuery<'_>],
        now: Nanos,
    ) -> Result<EnvoyOutcome, EnvoyError> {
        if queries.len() > MAX_DESCRIPTORS_PER_REQUEST {
            return Err(EnvoyError::TooManyDescriptors(queries.len()));
        }
        let tree = self.envoy.domain(domain).ok_or(EnvoyError::UnknownDomain)?;
        let mut run = Run::new(self, now, queries.len());
        for (slot, query) in queries.iter().enumerate() {
            let node = tree.lookup(&query.entries);
            run.place(slot, node.map(|n| &n.target), domain, query);
        }
        run.decide_local();
        run.ask_mesh().await;
        run.ask_exact().await;
        Ok(run.finish())
    }

    /// The counters' key of a descriptor in `domain`.
    fn envoy_key(&self, domain: &str, entries: &[(&str, &str)]) -> u64 {
        let mut parts: Vec<&[u8]> = Vec::with_capacity(3 + 2 * entries.len());
        parts.extend([
            self.config.env.as_bytes(),
            b"envoy".as_slice(),
            domain.as_bytes(),
        ]);
        for (key, value) in entries {
            parts.push(key.as_bytes());
            parts.push(value.as_bytes());
        }
        self.hasher.key(&parts)
    }
}

impl<'r> Run<'r> {
    fn new(rules: &'r Rules, now: Nanos, count: usize) -> Self {
        let unknown = DescriptorStatus {
            over_limit: false,
            matched: DescriptorMatch::Unknown,
            limit: None,
            remaining: 0,
            reset_after_ns: None,
        };
        Run {
            rules,
            now,
            statuses: vec![unknown; count],
            local: Vec::new(),
            global: Vec::new(),
            exact: Vec::new(),
            shadow: Vec::new(),
            charged: Vec::new(),
            exact_charged: Vec::new(),
            mesh_charged: Vec::new(),
            admitted: Vec::new(),
            denied: Vec::new(),
            shadow_reports: Vec::new(),
            unavailable: None,
        }
    }

    fn over(&self) -> bool {
        !self.denied.is_empty() || self.unavailable.is_some()
    }

    /// Sort descriptor `slot` by where it is decided.
    fn place(
        &mut self,
        slot: usize,
        target: Option<&Target>,
        domain: &str,
        query: &DescriptorQuery<'_>,
    ) {
        let status = &mut self.statuses[slot];
        let (index, shadow, limit) = match target {
            None | Some(Target::None) => return,
            Some(Target::Unlimited) => {
                status.matched = DescriptorMatch::Unlimited;
                status.remaining = u64::MAX;
                return;
            }
            Some(Target::Policy {
                index,
                shadow,
                limit,
            }) => (*index, *shadow, limit),
        };
        status.matched = if shadow {
            DescriptorMatch::Shadow
        } else {
            DescriptorMatch::Limited
        };
        status.limit = Some(limit.clone());
        let policy = &self.rules.policies[index];
        let capacity = policy.named.policy.capacity();
        if query.hits > capacity {
            // No wait can make it fit: over the limit, nothing charged anywhere.
            let report = policy.report(Decision::cannot_fit(capacity));
            status.over_limit = !shadow;
            if shadow {
                self.shadow_reports.push(report);
            } else {
                self.denied.push(report);
            }
            return;
        }
        let pending = Pending {
            slot,
            policy: index,
            key: self.rules.envoy_key(domain, &query.entries),
            cost: query.hits,
        };
        let list = match (shadow, policy.remote) {
            (true, _) => &mut self.shadow,
            (false, None) => &mut self.local,
            // A check-only descriptor takes nothing: Redis is asked to look (a cost of 0),
            // the mesh takes one token and gives it back at once ([`Run::ask_mesh`]).
            (false, Some(Remote::Mesh(_))) => &mut self.global,
            (false, Some(Remote::Exact(_))) => &mut self.exact,
        };
        list.push(pending);
    }

    /// Note what policy `p` decided for descriptor `slot`.
    fn settle(&mut self, pending: Pending, decision: Decision) {
        let status = &mut self.statuses[pending.slot];
        status.over_limit = !decision.is_allowed();
        status.remaining = decision.remaining;
        status.reset_after_ns = (decision.verdict != Verdict::CannotFit)
            .then(|| decision.reset_after_ns.max(decision.retry_after_ns));
        let policy = &self.rules.policies[pending.policy];
        policy
            .top
            .note(pending.key, decision.is_allowed(), self.now);
        let report = policy.report(decision);
        if decision.is_allowed() {
            self.admitted.push(report);
        } else {
            self.denied.push(report);
        }
    }

    /// Decide every descriptor on this node's policies; if one is over, give the others'
    /// charges back.
    fn decide_local(&mut self) {
        let rules = self.rules;
        for pending in std::mem::take(&mut self.local) {
            let policy = &rules.policies[pending.policy];
            let mut charge = Charge::Key;
            let decision =
                policy.decide_local(pending.key, self.now, pending.cost, true, &mut charge);
            if decision.is_allowed() && pending.cost > 0 {
                self.charged.push((pending, charge));
            }
            self.settle(pending, decision);
        }
        if self.over() {
            self.refund();
        }
    }

    /// Give back what the `mesh` and the local descriptors took (latest first); their
    /// statuses say what is left without this request.
    fn refund(&mut self) {
        for (pending, charge) in std::mem::take(&mut self.mesh_charged).into_iter().rev() {
            if self
                .rules
                .refund_mesh(pending.policy, pending.key, pending.cost, charge)
            {
                self.give_back_status(pending);
            }
        }
        for (pending, charge) in std::mem::take(&mut self.charged).into_iter().rev() {
            let policy = &self.rules.policies[pending.policy];
            policy.refund_local(pending.key, charge, self.now, pending.cost);
            let status = &mut self.statuses[pending.slot];
            status.remaining = status
                .remaining
                .saturating_add(pending.cost)
                .min(policy.named.policy.capacity());
        }
    }

    /// Descriptor `pending`'s status once its charge went back.
    fn give_back_status(&mut self, pending: Pending) {
        let capacity = self.rules.policies[pending.policy].named.policy.capacity();
        let status = &mut self.statuses[pending.slot];
        status.remaining = status.remaining.saturating_add(pending.cost).min(capacity);
    }

    /// Ask the mesh for each `mesh` descriptor in turn, while the request is admitted. A
    /// check-only one (no hits) takes one token and gives it back at once: over when that
    /// token is denied. Where the node cannot give it back (a key it decides by its share
    /// alone, or admits on credit), the token stays counted.
    async fn ask_mesh(&mut self) {
        let Some(mesh) = self.rules.mesh.clone() else {
            return;
        };
        for pending in std::mem::take(&mut self.global) {
            if self.over() {
                return;
            }
            let Some(Remote::Mesh(number)) = self.rules.policies[pending.policy].remote else {
                continue;
            };
            let check = pending.cost == 0;
            let answer = mesh
                .decide(number, pending.key, pending.cost.max(1))
                .answer()
                .await;
            let mut decision = answer.decision;
            if let Some(charge) = answer.charge.filter(|_| decision.is_allowed()) {
                if !check {
                    self.mesh_charged.push((pending, charge));
                } else if self
                    .rules
                    .refund_mesh(pending.policy, pending.key, 1, charge)
                {
                    decision.remaining = decision.remaining.saturating_add(1).min(decision.limit);
                }
            }
            self.settle(pending, decision);
            if !decision.is_allowed() {
                self.refund();
            }
        }
    }

    /// Ask Redis for each `redis` descriptor in turn, while the request is admitted; a
    /// failure meets the policy's fail mode.
    async fn ask_exact(&mut self) {
        let Some(exact) = self.rules.exact.clone() else {
            return;
        };
        for pending in std::mem::take(&mut self.exact) {
            if self.over() {
                return;
            }
            let policy = &self.rules.policies[pending.policy];
            let Some(Remote::Exact(number)) = policy.remote else {
                continue;
            };
            let answer = exact.decide(number, pending.key, None, pending.cost).await;
            let sent = answer.as_ref().ok().map(|a| a.sent);
            let at = policy.local_now(self.now);
            let fallback = || policy.store.decide(&pending.key, at, pending.cost);
            let answer = answer.map(|a| a.decision);
            match fail_over(policy.name, policy.named.fail_mode, answer, fallback) {
                ExactDecision::Exact(decision) | ExactDecision::Fallback(decision) => {
                    if let Some(sent) = sent.filter(|_| decision.is_allowed() && pending.cost > 0) {
                        self.exact_charged.push((pending, number, sent));
                    }
                    self.settle(pending, decision);
                    if !decision.is_allowed() {
                        self.refund();
                    }
                }
                ExactDecision::Unavailable => {
                    self.unavailable = Some(policy.name);
                    self.refund();
                }
            }
        }
        if self.over() {
            // Redis gives back what the earlier `redis` descriptors took.
            for (pending, number, sent) in std::mem::take(&mut self.exact_charged).into_iter().rev()
            {
                let refunded = exact
                    .refund(number, pending.key, None, pending.cost, sent)
                    .await;
                if refunded.as_ref().is_ok_and(|&back| back) {
                    let policy = &self.rules.policies[pending.policy];
                    let status = &mut self.statuses[pending.slot];
                    status.remaining = status
                        .remaining
                        .saturating_add(pending.cost)
                        .min(policy.named.policy.capacity());
                }
                self.rules.note_refund(pending.policy, refunded);
            }
        }
    }

    /// Count the shadow descriptors (after an admission; otherwise they only look) and put
    /// the answer together.
    fn finish(mut self) -> EnvoyOutcome {
        let admitted = !self.over();
        for pending in std::mem::take(&mut self.shadow) {
            let policy = &self.rules.policies[pending.policy];
            let cost = if admitted { pending.cost } else { 0 };
            let decision = policy.decide_local(pending.key, self.now, cost, true, &mut Charge::Key);
            let status = &mut self.statuses[pending.slot];
            status.remaining = decision.remaining;
            status.reset_after_ns = Some(decision.reset_after_ns.max(decision.retry_after_ns));
            self.shadow_reports.push(policy.report(decision));
        }
        let mut enforced = self.admitted;
        enforced.append(&mut self.denied);
        EnvoyOutcome {
            over_limit: !admitted,
            statuses: self.statuses,
            outcome: Outcome {
                allowed: admitted,
                cost: 1,
                route: None,
                enforced,
                shadow: self.shadow_reports,
                delay_ns: 0,
                backend_unavailable: self.unavailable,
                refused: None,
                exempt: false,
                skipped: Vec::new(),
                pending: Vec::new(),
            },
        }
    }
}
