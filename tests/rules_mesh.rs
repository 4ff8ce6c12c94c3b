//! `backend = "mesh"` in the policy file: validation, and how a mesh policy layers with the
//! local ones (checked after them; a mesh denial leaves no local charge).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use http::Method;
use ratemesh::backend::mesh::{GlobalLimits, MeshDecision};
use ratemesh::config::{GatewayConfig, IdentitySource};
use ratemesh::rules::{Identity, RequestFacts, Rules, RulesError};
use ratemesh::{Decision, Limiter, Policy, Verdict};

/// A stand-in for a mesh node: one local limiter per mesh policy, counting its calls and
/// denying the first `deny_first` of them.
struct FakeMesh {
    limiter: Limiter<(u32, u64)>,
    calls: AtomicU64,
    deny_first: u64,
}

impl GlobalLimits for FakeMesh {
    fn decide(&self, policy: u32, key: u64, cost: u64) -> MeshDecision {
        let call = self.calls.fetch_add(1, Ordering::Relaxed);
        let decision = self.limiter.check(&(policy, key), cost);
        if call < self.deny_first {
            // Deny as an owner that has no room left would.
            return MeshDecision::Ready(Some(Decision {
                remaining: 0,
                retry_after_ns: 20_000_000,
                verdict: Verdict::Denied,
                ..decision
            }));
        }
        MeshDecision::Ready(Some(decision))
    }
}

fn fake(deny_first: u64) -> Arc<FakeMesh> {
    let policy = Policy::token_bucket(1, std::time::Duration::from_secs(3600), 100).unwrap();
    Arc::new(FakeMesh {
        limiter: Limiter::builder().policy(policy).build().unwrap(),
        calls: AtomicU64::new(0),
        deny_first,
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

fn decide(rules: &Rules) -> bool {
    let identity = Identity::new(IdentitySource::ApiKey, "k");
    let facts = RequestFacts {
        identity: &identity,
        tier: None,
        method: &Method::GET,
        path: "/",
        request: Default::default(),
    };
    rules.decide(&facts, 1_000_000_000_000).allowed
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

#[test]
fn mesh_policies_need_a_mesh_one_per_request_and_fixed_policies() {
    assert!(matches!(
        Rules::new(config(FILE)),
        Err(RulesError::NoMesh { policy }) if policy == "global"
    ));
    let two = FILE.replace(
        "[tiers.api]\npolicies = [\"local_cap\", \"global\"]",
        "[policies.global2]\nalgorithm = \"fixed-window\"\nlimit = 10\nwindow = \"1s\"\nbackend = \"mesh\"\n\n[tiers.api]\npolicies = [\"global\", \"global2\"]",
    );
    assert!(matches!(
        Rules::with_mesh(config(&two), fake(0)),
        Err(RulesError::TwoRemotePolicies {
            backend: "mesh",
            ..
        })
    ));
    // Also on a route, for clients with no tier.
    let on_a_route = "key_secret = \"s\"\nallow_unlimited = true\n\n[policies.a]\nalgorithm = \"fixed-window\"\nlimit = 10\nwindow = \"1s\"\nbackend = \"mesh\"\n\n[policies.b]\nalgorithm = \"fixed-window\"\nlimit = 10\nwindow = \"1s\"\nbackend = \"mesh\"\n\n[[routes]]\nname = \"r\"\npath_prefix = \"/r\"\npolicies = [\"a\", \"b\"]\n";
    assert!(matches!(
        Rules::with_mesh(config(on_a_route), fake(0)),
        Err(RulesError::TwoRemotePolicies {
            backend: "mesh",
            ..
        })
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
