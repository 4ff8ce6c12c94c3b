//! `backend = "redis"` policies as the rules decide them, through the `ExactLimits` seam with
//! a stand-in backend (no Redis needed): asked after the local layers, a denial or a closed
//! failure gives their charges back, an open failure decides on the local store, and the
//! backend hears the policy's number, the client's key and the route.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::Method;
use ratemesh::backend::exact::{ExactError, ExactFuture, ExactLimits};
use ratemesh::config::{GatewayConfig, IdentitySource};
use ratemesh::rules::{Identity, Outcome, RequestFacts, Rules};
use ratemesh::{Limiter, Policy, Verdict};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// Decide on a limiter of its own.
    Decide,
    /// Fail, as Redis down would.
    Fail,
}

/// What the backend was asked: policy number, key, route, cost.
type Call = (u32, u64, Option<String>, u64);

/// A stand-in exact backend: one local limiter per (policy, key, route), and a log of calls.
struct FakeExact {
    limiter: Limiter<(u32, u64, Option<String>)>,
    answer: Mutex<Answer>,
    calls: Mutex<Vec<Call>>,
}

impl FakeExact {
    fn new(burst: u64) -> Arc<Self> {
        let policy = Policy::token_bucket(1, Duration::from_secs(3600), burst).unwrap();
        Arc::new(FakeExact {
            limiter: Limiter::builder().policy(policy).build().unwrap(),
            answer: Mutex::new(Answer::Decide),
            calls: Mutex::new(Vec::new()),
        })
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
                Answer::Decide => Ok(self.limiter.check(&(policy, key, route), cost)),
                Answer::Fail => Err(ExactError::new(std::io::Error::other("connection refused"))),
            }
        })
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
