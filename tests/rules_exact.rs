//! `backend = "redis"` policies as the rules decide them, through the `ExactLimits` seam with
//! a stand-in backend (no Redis needed): asked after the local layers, a denial or a closed
//! failure gives their charges back (the local ones and the earlier `redis` ones), an open
//! failure decides on the local store, `count_when` gives a charge back through the
//! backend, and the backend hears the policy's number, the client's key and the route.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use http::Method;
use ratemesh::backend::exact::{ExactAnswer, ExactError, ExactFuture, ExactLimits, RefundFuture};
use ratemesh::config::{GatewayConfig, IdentitySource};
use ratemesh::rules::{Identity, Outcome, RequestFacts, Rules};
use ratemesh::{Decision, Verdict};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// Decide on a limiter of its own.
    Decide,
    /// Fail, as Redis down would.
    Fail,
}

/// What the backend was asked: policy number, key, route, cost.
type Call = (u32, u64, Option<String>, u64);

/// A counter's place: policy number, key, route.
type Counter = (u32, u64, Option<String>);

/// A stand-in exact backend: `limit` tokens per (policy, key, route) that never refill, and
/// a log of calls and refunds.
struct FakeExact {
    limit: u64,
    used: Mutex<HashMap<Counter, u64>>,
    answer: Mutex<Answer>,
    calls: Mutex<Vec<Call>>,
    refunds: Mutex<Vec<Call>>,
}

impl FakeExact {
    fn new(limit: u64) -> Arc<Self> {
        Arc::new(FakeExact {
            limit,
            used: Mutex::new(HashMap::new()),
            answer: Mutex::new(Answer::Decide),
            calls: Mutex::new(Vec::new()),
            refunds: Mutex::new(Vec::new()),
        })
    }

    fn check(&self, counter: Counter, cost: u64) -> Decision {
        let mut used = self.used.lock().unwrap();
        let used = used.entry(counter).or_default();
        let denied = *used + cost > self.limit;
        if !denied {
            *used += cost;
        }
        Decision {
            limit: self.limit,
            remaining: self.limit - *used,
            reset_after_ns: 1,
            retry_after_ns: u64::from(denied),
            delay_ns: 0,
            policy_index: 0,
            verdict: if denied {
                Verdict::Denied
            } else {
                Verdict::Allowed
            },
        }
    }

    fn refunds(&self) -> Vec<Call> {
        self.refunds.lock().unwrap().clone()
    }

    fn answer(&self, answer: Answer) {
        *self.answer.lock().unwrap() = answer;
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }
}

impl ExactLimits for FakeExact {
    fn decide<'a>(
        &'a self,
        policy: u32,
        key: u64,
        route: Option<&'a str>,
        cost: u64,
    ) -> ExactFuture<'a> {
        let route = route.map(str::to_string);
        self.calls
            .lock()
            .unwrap()
            .push((policy, key, route.clone(), cost));
        let answer = *self.answer.lock().unwrap();
        Box::pin(async move {
            match answer {
                Answer::Decide => Ok(ExactAnswer::new(
                    self.check((policy, key, route), cost),
                    Instant::now(),
                )),
                Answer::Fail => Err(ExactError::new(std::io::Error::other("connection refused"))),
            }
        })
    }

    fn refund<'a>(
        &'a self,
        policy: u32,
        key: u64,
        route: Option<&'a str>,
        cost: u64,
        sent: Instant,
    ) -> RefundFuture<'a> {
        assert!(sent <= Instant::now());
        let route = route.map(str::to_string);
        self.refunds
            .lock()
            .unwrap()
            .push((policy, key, route.clone(), cost));
        let mut used = self.used.lock().unwrap();
        let counter = used.entry((policy, key, route)).or_default();
        let back = *counter >= cost;
        *counter -= cost.min(*counter);
        Box::pin(std::future::ready(Ok(back)))
    }
}

fn file(fail_mode: &str) -> String {
    format!(
        r#"
env = "test"
key_secret = "s"
default_tier = "api"

[redis]
url = "redis://127.0.0.1:1"

[policies.local_cap]
algorithm = "token-bucket"
rate = 1
period = "1h"
burst = 5

[policies.money]
algorithm = "token-bucket"
rate = 1
period = "1h"
burst = 2
backend = "redis"
fail_mode = "{fail_mode}"

[tiers.api]
policies = ["local_cap", "money"]
"#
    )
}

/// A file whose `redis` policy applies through a route (the rules refuse a tier and a route
/// that together apply two), keyed per client and route.
const ROUTE: &str = r#"
env = "test"
key_secret = "s"
default_tier = "api"

[redis]
url = "redis://127.0.0.1:1"

[policies.local_cap]
algorithm = "token-bucket"
rate = 1
period = "1h"
burst = 5

[policies.audit]
algorithm = "fixed-window"
limit = 1000
window = "1m"
shadow = true

[policies.transfers]
algorithm = "fixed-window"
limit = 10
window = "1m"
backend = "redis"

[tiers.api]
policies = ["local_cap", "audit"]

[[routes]]
name = "transfer"
path_prefix = "/transfer"
policies = ["transfers"]
"#;

fn rules(fail_mode: &str, exact: Arc<FakeExact>) -> Rules {
    let config = GatewayConfig::from_toml_str(&file(fail_mode), "test.toml").unwrap();
    Rules::with_backends(config, None, Some(exact)).unwrap()
}

async fn decide(rules: &Rules, tier: &str, path: &str) -> Outcome {
    let identity = Identity::new(IdentitySource::ApiKey, "k");
    let facts = RequestFacts {
        identity: &identity,
        tier: Some(tier),
        method: &Method::POST,
        path,
        request: Default::default(),
    };
    rules.decide_exact(&facts, 1_000_000_000_000).await
}

/// The local cap's tokens left, as the next admitted request reports them.
fn local_left(outcome: &Outcome) -> u64 {
    outcome.enforced[0].decision.remaining
}

#[tokio::test]
async fn an_exact_denial_gives_back_the_local_charges() {
    let exact = FakeExact::new(2);
    let rules = rules("open", Arc::clone(&exact));
    assert!(rules.needs_io() && rules.has_exact_policies());
    for left in [4, 3] {
        let outcome = decide(&rules, "api", "/").await;
        assert!(outcome.allowed);
        assert_eq!(local_left(&outcome), left);
        assert_eq!(outcome.enforced.len(), 2, "local, then exact");
    }
    // The exact policy is spent: denied, and the local cap keeps its 3 tokens.
    for _ in 0..3 {
        let outcome = decide(&rules, "api", "/").await;
        assert!(!outcome.allowed);
        let denial = outcome.denied_by().unwrap();
        assert_eq!(
            (denial.name, denial.decision.verdict),
            ("money", Verdict::Denied)
        );
        assert_eq!(local_left(&outcome), 2, "charged before the exact denial");
    }
    exact.answer(Answer::Fail);
    let outcome = decide(&rules, "api", "/").await;
    // Failing open: the policy's local store decides (it has its own 2 tokens).
    assert!(outcome.allowed);
    assert_eq!(outcome.enforced[1].decision.remaining, 1);
    assert_eq!(local_left(&outcome), 2);
}

#[tokio::test]
async fn failing_closed_refuses_as_unavailable_and_leaves_no_charge() {
    let exact = FakeExact::new(100);
    let rules = rules("closed", Arc::clone(&exact));
    exact.answer(Answer::Fail);
    for _ in 0..3 {
        let outcome = decide(&rules, "api", "/").await;
        assert!(!outcome.allowed);
        assert_eq!(outcome.backend_unavailable, Some("money"));
        assert_eq!(outcome.enforced.len(), 1, "the local layer only");
        assert_eq!(
            local_left(&outcome),
            4,
            "the refusals charged the local cap"
        );
    }
    exact.answer(Answer::Decide);
    let outcome = decide(&rules, "api", "/").await;
    assert!(outcome.allowed && outcome.backend_unavailable.is_none());
    assert_eq!(local_left(&outcome), 4);
}

#[tokio::test]
async fn the_backend_hears_the_policy_number_the_key_and_the_route() {
    let exact = FakeExact::new(100);
    let hasher_of = |rules: &Rules, parts: &[&[u8]]| rules.hasher().key(parts);
    // A tier's policy: the client's key, no route.
    let tiered = rules("open", Arc::clone(&exact));
    decide(&tiered, "api", "/transfer/42").await;
    let client = hasher_of(&tiered, &[b"test", b"api_key", b"k"]);
    assert_eq!(exact.calls(), [(0, client, None, 1)]);
    // A route's policy: the client's and the route's key, and the route's name.
    let exact = FakeExact::new(100);
    let config = GatewayConfig::from_toml_str(ROUTE, "route.toml").unwrap();
    let routed = Rules::with_backends(config, None, Some(Arc::clone(&exact) as _)).unwrap();
    decide(&routed, "api", "/").await;
    decide(&routed, "api", "/transfer/42").await;
    // A local denial never reaches the backend (the local cap holds 5).
    for _ in 0..10 {
        decide(&routed, "api", "/transfer/42").await;
    }
    let per_route = hasher_of(&routed, &[b"test", b"api_key", b"k", b"transfer"]);
    let calls = exact.calls();
    assert_eq!(calls[0], (0, per_route, Some("transfer".to_string()), 1));
    assert_eq!(
        calls.len(),
        4,
        "the local cap let 4 requests through to the route"
    );
    let names: Vec<&str> = routed
        .config()
        .redis_policies()
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(names, ["transfers"]);
}

#[tokio::test]
async fn deciding_without_io_answers_exact_policies_locally_and_a_reload_keeps_the_backend() {
    let exact = FakeExact::new(100);
    let rules = rules("open", Arc::clone(&exact));
    let identity = Identity::new(IdentitySource::ApiKey, "k");
    let facts = RequestFacts {
        identity: &identity,
        tier: Some("api"),
        method: &Method::GET,
        path: "/",
        request: Default::default(),
    };
    let outcome = rules.decide(&facts, 1_000_000_000_000);
    assert!(outcome.allowed);
    assert_eq!(
        outcome.enforced[1].decision.remaining, 1,
        "the local store of `money`"
    );
    assert!(exact.calls().is_empty());
    let config = GatewayConfig::from_toml_str(&file("closed"), "test.toml").unwrap();
    let reloaded = Rules::reloaded(config, &rules).unwrap();
    decide(&reloaded, "api", "/").await;
    assert_eq!(
        exact.calls().len(),
        1,
        "the reloaded rules asked the same backend"
    );
}

/// Two `redis` policies on one request (per client, and one for everybody on the route):
/// a denial by the second gives back the first's charge, in Redis.
const TWO: &str = r#"
env = "test"
key_secret = "s"
default_tier = "api"

[redis]
url = "redis://127.0.0.1:1"

[policies.per_client]
algorithm = "fixed-window"
limit = 3
window = "1h"
backend = "redis"

[policies.everybody]
algorithm = "fixed-window"
limit = 3
window = "1h"
backend = "redis"
by = []

[tiers.api]
policies = ["per_client", "everybody"]
"#;

/// The number the backend knows a `redis` policy by.
fn number_of(rules: &Rules, name: &str) -> u32 {
    let names = rules.config().redis_policies();
    names.iter().position(|p| p.name == name).unwrap() as u32
}

async fn decide_as(rules: &Rules, client: &str) -> Outcome {
    let identity = Identity::new(IdentitySource::ApiKey, client);
    let facts = RequestFacts {
        identity: &identity,
        tier: Some("api"),
        method: &Method::GET,
        path: "/",
        request: Default::default(),
    };
    rules.decide_exact(&facts, 1_000_000_000_000).await
}

#[tokio::test]
async fn a_denial_by_a_later_redis_policy_gives_back_the_earlier_ones_charge() {
    // Both limits are 3 per client and 3 for everybody (the fake's limit per counter).
    let exact = FakeExact::new(3);
    let config = GatewayConfig::from_toml_str(TWO, "two.toml").unwrap();
    let rules = Rules::with_backends(config, None, Some(Arc::clone(&exact) as _)).unwrap();
    // Alice takes the 3 tokens everybody shares.
    for _ in 0..3 {
        assert!(decide_as(&rules, "alice").await.allowed);
    }
    assert!(exact.refunds().is_empty());
    // Bob is denied by `everybody`: his own counter is charged, then given back.
    for _ in 0..5 {
        let outcome = decide_as(&rules, "bob").await;
        assert!(!outcome.allowed);
        assert_eq!(outcome.denied_by().unwrap().name, "everybody");
    }
    let per_client = number_of(&rules, "per_client");
    let refunds = exact.refunds();
    assert_eq!(
        refunds.len(),
        5,
        "each denial gave back the per-client charge"
    );
    assert!(
        refunds
            .iter()
            .all(|(policy, _, _, cost)| (*policy, *cost) == (per_client, 1))
    );
    // Bob's own counter is whole: with room for everybody again he has his 3.
    let bob = refunds[0].1;
    assert_eq!(exact.used.lock().unwrap()[&(per_client, bob, None)], 0);
    exact.used.lock().unwrap().clear();
    for _ in 0..3 {
        assert!(decide_as(&rules, "bob").await.allowed);
    }
    let outcome = decide_as(&rules, "bob").await;
    assert_eq!(outcome.denied_by().unwrap().name, "per_client");
    assert_eq!(
        exact.refunds().len(),
        5,
        "a first-layer denial leaves nothing to give back"
    );
}

#[tokio::test]
async fn a_redis_policy_counted_by_status_gives_its_charge_back_through_the_backend() {
    let exact = FakeExact::new(2);
    let file = TWO.replace(
        "backend = \"redis\"\n\n[policies.everybody]",
        "backend = \"redis\"\ncount_when = { status = [401] }\n\n[policies.everybody]",
    );
    assert_ne!(file, TWO);
    let config = GatewayConfig::from_toml_str(&file, "two.toml").unwrap();
    let rules = Rules::with_backends(config, None, Some(Arc::clone(&exact) as _)).unwrap();
    for status in [200, 200, 200, 401, 401] {
        let outcome = decide_as(&rules, "carol").await;
        assert!(outcome.allowed, "status {status}: only the 401s count");
        assert_eq!(outcome.pending.len(), 1);
        let pending = outcome.pending[0];
        assert!(pending.needs_io());
        match rules.settle(&pending, status) {
            Some(refund) => {
                assert_eq!(status, 200);
                assert!(refund.await.unwrap());
            }
            None => assert_eq!(status, 401),
        }
        if status == 200 {
            // `everybody` (no count_when) stays charged: reset it for the next round.
            let per_client = number_of(&rules, "per_client");
            exact
                .used
                .lock()
                .unwrap()
                .retain(|(policy, ..), _| *policy == per_client);
        }
    }
    // Two 401s spent carol's 2; the next is denied before it runs.
    let outcome = decide_as(&rules, "carol").await;
    assert_eq!(outcome.denied_by().map(|d| d.name), Some("per_client"));
}
