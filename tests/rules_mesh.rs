//! `backend = "mesh"` in the policy file: validation, and how mesh policies layer with the
//! local ones and with each other (checked after the local ones, in order; a denial by any
//! gives the others' charges back, a `count_when` charge goes back by the response).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use http::Method;
use ratemesh::backend::mesh::{GlobalLimits, MeshAnswer, MeshCharge, MeshDecision};
use ratemesh::config::{GatewayConfig, IdentitySource};
use ratemesh::rules::{Identity, RequestFacts, Rules, RulesError};
use ratemesh::{Decision, Limiter, Policy, Verdict};

/// A stand-in for a mesh node: one local limiter per mesh policy, counting its calls,
/// denying the first `deny_first` of them and every call of policy `deny_policy`, and
/// keeping the charges given back (each admission's charge is its call's number).
struct FakeMesh {
    limiter: Limiter<(u32, u64)>,
    calls: AtomicU64,
    deny_first: u64,
    deny_policy: Option<u32>,
    /// (policy, key, cost, charge) of every refund.
    refunds: Mutex<Vec<(u32, u64, u64, u64)>>,
}

impl GlobalLimits for FakeMesh {
    fn decide(&self, policy: u32, key: u64, cost: u64) -> MeshDecision {
        let call = self.calls.fetch_add(1, Ordering::Relaxed);
        let decision = self.limiter.check(&(policy, key), cost);
        if call < self.deny_first || self.deny_policy == Some(policy) {
            // Deny as an owner that has no room left would.
            let denied = Decision {
                remaining: 0,
                retry_after_ns: 20_000_000,
                verdict: Verdict::Denied,
                ..decision
            };
            return MeshDecision::Ready(Some(denied.into()));
        }
        MeshDecision::Ready(Some(MeshAnswer {
            decision,
            charge: decision.is_allowed().then(|| MeshCharge::new(call)),
        }))
    }

    fn refund(&self, policy: u32, key: u64, cost: u64, charge: MeshCharge) -> bool {
        let mut refunds = self.refunds.lock().unwrap();
        refunds.push((policy, key, cost, charge.token()));
        true
    }
}

fn fake(deny_first: u64) -> Arc<FakeMesh> {
    fake_denying(deny_first, None)
}

fn fake_denying(deny_first: u64, deny_policy: Option<u32>) -> Arc<FakeMesh> {
    let policy = Policy::token_bucket(1, std::time::Duration::from_secs(3600), 100).unwrap();
    Arc::new(FakeMesh {
        limiter: Limiter::builder().policy(policy).build().unwrap(),
        calls: AtomicU64::new(0),
        deny_first,
        deny_policy,
        refunds: Mutex::new(Vec::new()),
    })
}

const FILE: &str = r#"
key_secret = "s"
default_tier = "api"

[policies.local_cap]
algorithm = "token-bucket"
rate = 1
period = "1h"
burst = 5

[policies.global]
algorithm = "fixed-window"
limit = 100
window = "1s"
backend = "mesh"

[tiers.api]
policies = ["local_cap", "global"]
"#;

fn config(text: &str) -> GatewayConfig {
    GatewayConfig::from_toml_str(text, "test.toml").unwrap()
}

/// A GET of `path` by API key `k`.
fn facts<'a>(identity: &'a Identity, path: &'a str) -> RequestFacts<'a> {
    RequestFacts {
        identity,
        tier: None,
        method: &Method::GET,
        path,
        request: Default::default(),
    }
}

fn decide(rules: &Rules) -> bool {
    let identity = Identity::new(IdentitySource::ApiKey, "k");
    rules
        .decide(&facts(&identity, "/"), 1_000_000_000_000)
        .allowed
}

#[test]
fn a_mesh_denial_leaves_no_local_charge() {
    let mesh = fake(20);
    let rules = Rules::with_mesh(config(FILE), mesh.clone()).unwrap();
    for _ in 0..20 {
        assert!(!decide(&rules));
    }
    assert_eq!(mesh.calls.load(Ordering::Relaxed), 20);
    // The local bucket of 5 is still full: the mesh's denials were refunded.
    let admitted = (0..10).filter(|_| decide(&rules)).count();
    assert_eq!(admitted, 5);
    // A local denial does not reach the mesh.
    assert_eq!(mesh.calls.load(Ordering::Relaxed), 25);
}

#[test]
fn the_mesh_numbers_its_policies_by_name() {
    let text = FILE.replace(
        "[tiers.api]",
        "[policies.another]\nalgorithm = \"gcra\"\nrate = 5\nperiod = \"1s\"\nburst = 5\nbackend = \"mesh\"\n\n[tiers.api]",
    );
    let config = config(&text);
    let names: Vec<&str> = config
        .mesh_policies()
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(names, ["another", "global"]);
}

/// Two mesh policies for one request (an account's and an address's, say), after a local
/// one: the second's denial gives the first's charge back to the mesh and the local charge
/// back to its bucket; with both admitting, nothing goes back.
#[test]
fn a_denial_by_a_later_mesh_policy_gives_the_earlier_one_s_charge_back() {
    let two = FILE.replace(
        "[tiers.api]\npolicies = [\"local_cap\", \"global\"]",
        "[policies.global2]\nalgorithm = \"fixed-window\"\nlimit = 10\nwindow = \"1s\"\nbackend = \"mesh\"\n\n[tiers.api]\npolicies = [\"local_cap\", \"global\", \"global2\"]",
    );
    // Mesh policies are numbered by name: global = 0, global2 = 1.
    let mesh = fake_denying(0, Some(1));
    let rules = Rules::with_mesh(config(&two), mesh.clone()).unwrap();
    for _ in 0..8 {
        assert!(!decide(&rules));
    }
    // Every request asked both, in order; each first charge went back, the latest first.
    assert_eq!(mesh.calls.load(Ordering::Relaxed), 16);
    let refunds = mesh.refunds.lock().unwrap().clone();
    assert_eq!(refunds.len(), 8);
    for (i, &(policy, _, cost, charge)) in refunds.iter().enumerate() {
        assert_eq!((policy, cost, charge), (0, 1, 2 * i as u64));
    }
    // The local bucket of 5 is still full.
    let mesh = fake(0);
    let rules = Rules::with_mesh(config(&two), mesh.clone()).unwrap();
    assert_eq!((0..10).filter(|_| decide(&rules)).count(), 5);
    assert!(mesh.refunds.lock().unwrap().is_empty());
    // Also on a route, for clients with no tier.
    let on_a_route = "key_secret = \"s\"\nallow_unlimited = true\n\n[policies.a]\nalgorithm = \"fixed-window\"\nlimit = 10\nwindow = \"1s\"\nbackend = \"mesh\"\n\n[policies.b]\nalgorithm = \"fixed-window\"\nlimit = 10\nwindow = \"1s\"\nbackend = \"mesh\"\n\n[[routes]]\nname = \"r\"\npath_prefix = \"/r\"\npolicies = [\"a\", \"b\"]\n";
    let mesh = fake_denying(0, Some(1));
    let rules = Rules::with_mesh(config(on_a_route), mesh.clone()).unwrap();
    let identity = Identity::new(IdentitySource::ApiKey, "k");
    let facts = facts(&identity, "/r");
    assert!(!rules.decide(&facts, 1_000_000_000_000).allowed);
    assert_eq!(mesh.refunds.lock().unwrap().len(), 1);
}

/// `count_when` on a mesh policy: the request takes its token up front, and a response
/// whose status does not count gives it back to the mesh.
#[test]
fn a_mesh_count_when_charge_goes_back_when_the_status_does_not_count() {
    let text = FILE.replace(
        "backend = \"mesh\"",
        "backend = \"mesh\"\ncount_when = { status = [401] }",
    );
    let mesh = fake(0);
    let rules = Rules::with_mesh(config(&text), mesh.clone()).unwrap();
    let identity = Identity::new(IdentitySource::ApiKey, "k");
    let facts = facts(&identity, "/");
    for status in [200, 401, 204] {
        let outcome = rules.decide(&facts, 1_000_000_000_000);
        assert!(outcome.allowed);
        assert_eq!(
            outcome.pending.len(),
            1,
            "the mesh charge waits for the status"
        );
        for pending in &outcome.pending {
            assert!(!pending.needs_io());
            assert!(rules.settle(pending, status).is_none());
        }
    }
    let refunds: Vec<u64> = mesh.refunds.lock().unwrap().iter().map(|r| r.3).collect();
    // Calls 0 (200) and 2 (204) went back; 1 (401) counts.
    assert_eq!(refunds, [0, 2]);
}

#[test]
fn mesh_policies_need_a_mesh_and_fixed_policies() {
    assert!(matches!(
        Rules::new(config(FILE)),
        Err(RulesError::NoMesh { policy }) if policy == "global"
    ));
    let rules = Rules::with_mesh(config(FILE), fake(0)).unwrap();
    // A new limit goes to the mesh node, which may refuse it (this one cannot change).
    let changed = FILE.replace("limit = 100", "limit = 200");
    assert!(matches!(
        Rules::reloaded(config(&changed), &rules),
        Err(RulesError::MeshReconfigure { .. })
    ));
    // A renamed mesh policy would number the policies differently on the nodes.
    let renamed = FILE
        .replace("[policies.global]", "[policies.worldwide]")
        .replace("\"global\"]", "\"worldwide\"]");
    assert!(matches!(
        Rules::reloaded(config(&renamed), &rules),
        Err(RulesError::MeshPoliciesChanged { .. })
    ));
    let local_changed = FILE.replace("burst = 5", "burst = 6");
    let reloaded = Rules::reloaded(config(&local_changed), &rules).unwrap();
    assert!(decide(&reloaded), "the reloaded rules keep the mesh");
    // A mesh policy's lockout is the cluster's: part of the digest, and fixed while the
    // nodes run.
    let locked = FILE.replace(
        "backend = \"mesh\"",
        "backend = \"mesh\"\nblock_for = \"15m\"",
    );
    assert_ne!(locked, FILE);
    assert_ne!(config(&locked).mesh_digest(), config(FILE).mesh_digest());
    match Rules::reloaded(config(&locked), &rules) {
        Err(RulesError::MeshReconfigure { reason }) => {
            assert!(reason.contains("block_for"), "{reason}")
        }
        other => panic!("{:?}", other.err()),
    }
}

#[test]
fn a_mesh_policy_is_validated_where_it_is_written() {
    let error = |text: &str| GatewayConfig::from_toml_str(text, "test.toml").unwrap_err();
    let e = error(&FILE.replace("key_secret = \"s\"\n", ""));
    assert_eq!(e.field, "policies.global.backend", "{e}");
    assert!(e.reason.contains("key_secret"), "{e}");
    let e = error(&FILE.replace(
        "algorithm = \"fixed-window\"",
        "algorithm = \"sliding-log\"",
    ));
    assert_eq!(e.field, "policies.global.algorithm", "{e}");
    let e = error(&FILE.replace("limit = 100", "limit = 300000000000000"));
    assert_eq!(e.field, "policies.global.limit", "{e}");
    // Large limits and month-long windows are fine.
    for (limit, window) in [("1000000", "24h"), ("4294967295", "744h")] {
        let text = FILE
            .replace("limit = 100", &format!("limit = {limit}"))
            .replace("window = \"1s\"", &format!("window = \"{window}\""));
        GatewayConfig::from_toml_str(&text, "test.toml").unwrap();
    }
    let e = error(&FILE.replace(
        "backend = \"mesh\"",
        "backend = \"mesh\"\ntime_zone = \"Europe/Paris\"",
    ));
    assert_eq!(e.field, "policies.global.time_zone", "{e}");
    let e = error(&FILE.replace("backend = \"mesh\"", "backend = \"mesh\"\nshadow = true"));
    assert_eq!(e.field, "policies.global.shadow", "{e}");
}
