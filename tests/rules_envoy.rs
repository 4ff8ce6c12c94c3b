//! `[envoy]` descriptors in the policy file and their decisions (Envoy's rate limit service
//! API, without the gRPC port): validation with file, line and field; matching as
//! envoyproxy/ratelimit matches (exact value before any value, nested, the descriptor's last
//! entry decides); one counter per value; all or nothing across a request's descriptors;
//! shadow, check-only and oversized descriptors; mesh descriptors after the local ones;
//! reloads.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ratemesh::backend::mesh::{GlobalLimits, MeshAnswer, MeshCharge, MeshDecision};
use ratemesh::config::GatewayConfig;
use ratemesh::rules::{DescriptorMatch, DescriptorQuery, EnvoyError, EnvoyOutcome, Rules};
use ratemesh::{Decision, Limiter, Policy, Verdict};

const FILE: &str = r#"
env = "test"
key_secret = "s"

[policies.per_key]
algorithm = "token-bucket"
rate = 1
period = "1h"
burst = 3

[policies.watch]
algorithm = "fixed-window"
limit = 1
window = "1m"
shadow = true

[[envoy.domains]]
domain = "edge"

[[envoy.domains.descriptors]]
key = "remote_address"
rate_limit = { requests_per_unit = 2, unit = "minute" }

[[envoy.domains.descriptors]]
key = "remote_address"
value = "10.0.0.1"
rate_limit = { requests_per_unit = 5, unit = "minute" }

[[envoy.domains.descriptors]]
key = "api_key"
policy = "per_key"

[[envoy.domains.descriptors]]
key = "trusted"
unlimited = true

[[envoy.domains.descriptors]]
key = "path"
value = "/login"
descriptors = [
  { key = "user", rate_limit = { requests_per_unit = 1, unit = "hour" } },
  { key = "watched", policy = "watch" },
]

[[envoy.domains]]
domain = "internal"
descriptors = [{ key = "service", rate_limit = { requests_per_unit = 1, unit = "second" } }]
"#;

/// A minute boundary (in ns on the limiter's clock) plus 15 s.
const NOW: u64 = 1_000 * 60_000_000_000 + 15_000_000_000;

fn rules(text: &str) -> Rules {
    Rules::new(GatewayConfig::from_toml_str(text, "policies.toml").unwrap()).unwrap()
}

fn query<'a>(entries: &[(&'a str, &'a str)], hits: u64) -> DescriptorQuery<'a> {
    DescriptorQuery {
        entries: entries.to_vec(),
        hits,
    }
}

fn decide(rules: &Rules, domain: &str, queries: &[DescriptorQuery<'_>]) -> EnvoyOutcome {
    futures_lite(rules.decide_descriptors(domain, queries, NOW)).unwrap()
}

/// Run a future that needs no runtime (every policy here is local, or a ready stand-in).
fn futures_lite<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(future)
}

/// Send `n` requests with one descriptor; return how many were admitted.
fn admitted(rules: &Rules, entries: &[(&str, &str)], n: usize) -> usize {
    (0..n)
        .filter(|_| !decide(rules, "edge", &[query(entries, 1)]).over_limit)
        .count()
}

#[test]
fn descriptors_match_like_envoyproxy_ratelimit_each_value_with_its_own_counter() {
    let rules = rules(FILE);
    // Any value: 2 a minute, per address; the exact value has its own limit.
    assert_eq!(admitted(&rules, &[("remote_address", "10.0.0.7")], 4), 2);
    assert_eq!(admitted(&rules, &[("remote_address", "10.0.0.8")], 4), 2);
    assert_eq!(admitted(&rules, &[("remote_address", "10.0.0.1")], 7), 5);
    // A policy of the file, per key.
    assert_eq!(admitted(&rules, &[("api_key", "k1")], 5), 3);
    // Nested: the last entry's descriptor decides.
    assert_eq!(
        admitted(&rules, &[("path", "/login"), ("user", "ann")], 3),
        1
    );
    assert_eq!(
        admitted(&rules, &[("path", "/login"), ("user", "bob")], 3),
        1
    );

    // Unknown: another key, a value without a descriptor, stopping short of a limit, going
    // deeper than the file, an unlimited one: OK, never limited, no limit reported.
    for entries in [
        &[("country", "fr")][..],
        &[("path", "/other"), ("user", "ann")],
        &[("path", "/login")],
        &[("remote_address", "10.0.0.7"), ("user", "x")],
    ] {
        let outcome = decide(&rules, "edge", &[query(entries, 1)]);
        assert!(!outcome.over_limit, "{entries:?}");
        assert_eq!(outcome.statuses[0].matched, DescriptorMatch::Unknown);
        assert_eq!(outcome.statuses[0].limit, None);
    }
    let trusted = decide(&rules, "edge", &[query(&[("trusted", "yes")], 1_000_000)]);
    assert_eq!(trusted.statuses[0].matched, DescriptorMatch::Unlimited);
    assert_eq!(trusted.statuses[0].remaining, u64::MAX);

    // A domain the file does not have.
    assert_eq!(
        futures_lite(rules.decide_descriptors("nope", &[query(&[("a", "b")], 1)], NOW))
            .unwrap_err(),
        EnvoyError::UnknownDomain
    );
}

#[test]
fn statuses_carry_the_limit_what_is_left_and_the_time_to_the_window_end() {
    let rules = rules(FILE);
    let first = decide(&rules, "edge", &[query(&[("remote_address", "a")], 1)]);
    let status = &first.statuses[0];
    let limit = status.limit.as_ref().unwrap();
    assert_eq!(limit.name, "edge/remote_address");
    assert_eq!(limit.requests_per_unit, 2);
    assert_eq!(
        limit.unit.map(|u| u.name()),
        Some("minute"),
        "inline limits keep their unit"
    );
    assert_eq!(status.remaining, 1);
    // 15 s into the minute: 45 s to its end.
    assert_eq!(status.reset_after_ns, Some(45_000_000_000));
    decide(&rules, "edge", &[query(&[("remote_address", "a")], 1)]);
    let over = decide(&rules, "edge", &[query(&[("remote_address", "a")], 1)]);
    assert!(over.over_limit && over.statuses[0].over_limit);
    assert_eq!(over.statuses[0].remaining, 0);
    assert_eq!(over.statuses[0].reset_after_ns, Some(45_000_000_000));
    assert_eq!(
        over.outcome.denied_by().unwrap().name,
        "edge/remote_address"
    );
    // A token bucket of the file: its burst, and an hour's unit is its refill time (3 h).
    let bucket = decide(&rules, "edge", &[query(&[("api_key", "z")], 1)]);
    let limit = bucket.statuses[0].limit.as_ref().unwrap();
    assert_eq!((limit.requests_per_unit, limit.unit), (3, None));
}

#[test]
fn a_request_is_charged_all_or_nothing() {
    let rules = rules(FILE);
    // Use up /login for ann (1 an hour).
    assert_eq!(
        admitted(&rules, &[("path", "/login"), ("user", "ann")], 1),
        1
    );
    // Two descriptors: the address would admit, the user is over: nothing is taken.
    for _ in 0..5 {
        let outcome = decide(
            &rules,
            "edge",
            &[
                query(&[("remote_address", "b")], 1),
                query(&[("path", "/login"), ("user", "ann")], 1),
            ],
        );
        assert!(outcome.over_limit);
        assert!(!outcome.statuses[0].over_limit && outcome.statuses[1].over_limit);
        // What is left without this request: the address's two are untouched.
        assert_eq!(outcome.statuses[0].remaining, 2);
    }
    assert_eq!(admitted(&rules, &[("remote_address", "b")], 3), 2);
}

#[test]
fn shadow_check_only_and_oversized_descriptors() {
    let rules = rules(FILE);
    let watched = [("path", "/login"), ("watched", "w")];
    // Shadow: counted, reported, never over (its limit is 1 a minute).
    for i in 0..3 {
        let outcome = decide(&rules, "edge", &[query(&watched, 1)]);
        assert!(!outcome.over_limit);
        assert_eq!(outcome.statuses[0].matched, DescriptorMatch::Shadow);
        assert_eq!(outcome.outcome.shadow_denials().count(), usize::from(i > 0));
    }
    // Check only (hits 0): takes nothing, over when no room is left for one more.
    for _ in 0..4 {
        let outcome = decide(&rules, "edge", &[query(&[("remote_address", "c")], 0)]);
        assert!(!outcome.over_limit);
        assert_eq!(outcome.statuses[0].remaining, 2);
    }
    assert_eq!(admitted(&rules, &[("remote_address", "c")], 2), 2);
    let look = decide(&rules, "edge", &[query(&[("remote_address", "c")], 0)]);
    assert!(look.over_limit);
    // More hits than the limit holds: over, nothing charged, no wait helps.
    let huge = decide(
        &rules,
        "edge",
        &[query(&[("remote_address", "d")], u64::MAX)],
    );
    assert!(huge.over_limit);
    assert_eq!(huge.statuses[0].reset_after_ns, None);
    assert_eq!(
        huge.outcome.denied_by().unwrap().decision.verdict,
        Verdict::CannotFit
    );
    assert_eq!(admitted(&rules, &[("remote_address", "d")], 3), 2);
}

#[test]
fn a_reload_keeps_the_counters_of_unchanged_descriptors() {
    let before = rules(FILE);
    assert_eq!(admitted(&before, &[("remote_address", "e")], 2), 2);
    let changed = FILE.replace(
        "requests_per_unit = 1, unit = \"second\"",
        "requests_per_unit = 9, unit = \"second\"",
    );
    let after = Rules::reloaded(
        GatewayConfig::from_toml_str(&changed, "policies.toml").unwrap(),
        &before,
    )
    .unwrap();
    assert!(after.shares_counters_with(&before, "edge/remote_address"));
    assert!(!after.shares_counters_with(&before, "internal/service"));
    assert_eq!(admitted(&after, &[("remote_address", "e")], 2), 0);
}

/// The policy file's error for `text`: `(line, field)`.
fn error_of(text: &str) -> (usize, String, String) {
    let error = GatewayConfig::from_toml_str(text, "policies.toml").unwrap_err();
    assert_eq!(error.file, "policies.toml");
    (error.line, error.field, error.reason)
}

#[test]
fn bad_descriptors_are_refused_with_file_line_and_field() {
    let head = "key_secret = \"s\"\n[policies.p]\nalgorithm = \"token-bucket\"\nrate = 1\nperiod = \"1s\"\nburst = 1\n\n[[envoy.domains]]\ndomain = \"edge\"\n\n[[envoy.domains.descriptors]]\nkey = \"a\"\n";
    let cases: &[(&str, usize, &str, &str)] = &[
        (
            "policy = \"nope\"\n",
            13,
            "envoy.domains[0].descriptors[0].policy",
            "no policy named `nope`",
        ),
        (
            "rate_limit = { requests_per_unit = 1, unit = \"fortnight\" }\n",
            13,
            "envoy.domains[0].descriptors[0].rate_limit",
            "not a unit",
        ),
        (
            "rate_limit = { requests_per_unit = 0, unit = \"second\" }\n",
            13,
            "envoy.domains[0].descriptors[0].rate_limit",
            "between 1 and",
        ),
        (
            "policy = \"p\"\nunlimited = true\n",
            14,
            "envoy.domains[0].descriptors[0].unlimited",
            "give one of",
        ),
        (
            "",
            12,
            "envoy.domains[0].descriptors[0].key",
            "limits nothing",
        ),
        (
            "policy = \"p\"\n\n[[envoy.domains.descriptors]]\nkey = \"a\"\nunlimited = true\n",
            16,
            "envoy.domains[0].descriptors[1].key",
            "a second descriptor",
        ),
        (
            "policy = \"p\"\nshadow_mode = true\nbackend = \"mesh\"\n",
            15,
            "envoy.domains[0].descriptors[0].backend",
            "inline",
        ),
        (
            "rate_limit = { requests_per_unit = 1, unit = \"second\" }\nbackend = \"redis\"\n",
            13,
            "envoy.domains[0].descriptors[0].rate_limit",
            "[redis]",
        ),
        (
            "rate_limit = { requests_per_unit = 1, unit = \"second\" }\nbackend = \"mesh\"\nshadow_mode = true\n",
            15,
            "envoy.domains[0].descriptors[0].shadow_mode",
            "counted on each node",
        ),
        (
            "policy = \"p\"\n\n[[envoy.domains]]\ndomain = \"edge\"\ndescriptors = [{ key = \"b\", policy = \"p\" }]\n",
            16,
            "envoy.domains[1].domain",
            "a second domain",
        ),
        (
            "policy = \"p\"\nvalue = \"\"\n",
            14,
            "envoy.domains[0].descriptors[0].value",
            "must not be empty",
        ),
    ];
    for (tail, line, field, reason) in cases {
        let (got_line, got_field, got_reason) = error_of(&format!("{head}{tail}"));
        assert_eq!(
            (got_line, got_field.as_str()),
            (*line, *field),
            "{tail}: {got_reason}"
        );
        assert!(got_reason.contains(reason), "{tail}: {got_reason}");
    }
    // A mesh limit needs the cluster's key secret; a named policy clashing with an inline
    // limit's name is refused.
    let no_secret = "[envoy]\nbackend = \"mesh\"\n[[envoy.domains]]\ndomain = \"e\"\ndescriptors = [{ key = \"a\", rate_limit = { requests_per_unit = 1, unit = \"second\" } }]\n";
    let (_, field, reason) = error_of(no_secret);
    assert_eq!(field, "envoy.domains[0].descriptors[0].rate_limit");
    assert!(reason.contains("key_secret"), "{reason}");
    let clash = "[policies.\"e/a\"]\nalgorithm = \"token-bucket\"\nrate = 1\nperiod = \"1s\"\nburst = 1\n[[envoy.domains]]\ndomain = \"e\"\ndescriptors = [{ key = \"a\", rate_limit = { requests_per_unit = 1, unit = \"second\" } }]\n";
    assert!(error_of(clash).2.contains("already uses"));
    // A file with domains and no tiers or routes limits through Envoy only: accepted.
    GatewayConfig::from_toml_str(
        "[[envoy.domains]]\ndomain = \"e\"\ndescriptors = [{ key = \"a\", rate_limit = { requests_per_unit = 1, unit = \"second\" } }]\n",
        "policies.toml",
    )
    .unwrap();
}

/// A stand-in for a mesh node that counts its calls, denies those from `deny_from` on, and
/// keeps the charges given back (an admission's charge is its call's number).
struct FakeMesh {
    limiter: Limiter<(u32, u64)>,
    calls: AtomicU64,
    deny_from: u64,
    /// (cost, charge) of every refund.
    refunds: Mutex<Vec<(u64, u64)>>,
}

impl GlobalLimits for FakeMesh {
    fn decide(&self, policy: u32, key: u64, cost: u64) -> MeshDecision {
        let call = self.calls.fetch_add(1, Ordering::Relaxed);
        let decision = self.limiter.check(&(policy, key), cost);
        if call >= self.deny_from {
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

    fn refund(&self, _: u32, _: u64, cost: u64, charge: MeshCharge) -> bool {
        self.refunds.lock().unwrap().push((cost, charge.token()));
        true
    }
}

fn fake_mesh(deny_from: u64) -> Arc<FakeMesh> {
    let policy = Policy::token_bucket(1, std::time::Duration::from_secs(3600), 100).unwrap();
    Arc::new(FakeMesh {
        limiter: Limiter::builder().policy(policy).build().unwrap(),
        calls: AtomicU64::new(0),
        deny_from,
        refunds: Mutex::new(Vec::new()),
    })
}

#[test]
fn mesh_descriptors_are_asked_after_the_local_ones_and_a_mesh_denial_gives_them_back() {
    let text = FILE.replacen(
        "[[envoy.domains]]",
        "[envoy]\nbackend = \"mesh\"\n\n[[envoy.domains]]",
        1,
    );
    // Every inline limit of the file is now a mesh policy; `per_key` stays local.
    let config = GatewayConfig::from_toml_str(&text, "policies.toml").unwrap();
    assert!(
        config
            .mesh_policies()
            .iter()
            .any(|p| p.name == "edge/remote_address")
    );
    let denying = fake_mesh(0);
    let rules = Rules::with_mesh(config.clone(), denying.clone()).unwrap();
    for _ in 0..5 {
        let outcome = decide(
            &rules,
            "edge",
            &[
                query(&[("api_key", "k")], 1),
                query(&[("remote_address", "x")], 1),
                query(&[("remote_address", "y")], 1),
            ],
        );
        assert!(outcome.over_limit && outcome.statuses[1].over_limit);
        // The second mesh descriptor was never asked.
        assert_eq!(outcome.statuses[2].reset_after_ns, None);
    }
    assert_eq!(denying.calls.load(Ordering::Relaxed), 5);
    // The local bucket (3) was given back every time.
    assert_eq!(admitted(&rules, &[("api_key", "k")], 4), 3);
    // A local denial asks no mesh at all.
    let calls = denying.calls.load(Ordering::Relaxed);
    let outcome = decide(
        &rules,
        "edge",
        &[
            query(&[("api_key", "k")], 1),
            query(&[("remote_address", "x")], 1),
        ],
    );
    assert!(outcome.over_limit && outcome.statuses[0].over_limit);
    assert_eq!(denying.calls.load(Ordering::Relaxed), calls);

    // A second mesh descriptor's denial gives the first one's charge back.
    let second_denies = fake_mesh(1);
    let rules = Rules::with_mesh(config.clone(), second_denies.clone()).unwrap();
    let outcome = decide(
        &rules,
        "edge",
        &[
            query(&[("remote_address", "x")], 1),
            query(&[("remote_address", "y")], 1),
        ],
    );
    assert!(outcome.over_limit && !outcome.statuses[0].over_limit);
    assert!(outcome.statuses[1].over_limit);
    assert_eq!(*second_denies.refunds.lock().unwrap(), [(1, 0)]);
    // A check-only mesh descriptor takes one token and gives it back at once; over when
    // that token is denied.
    let roomy = fake_mesh(u64::MAX);
    let rules = Rules::with_mesh(config.clone(), roomy.clone()).unwrap();
    let outcome = decide(&rules, "edge", &[query(&[("remote_address", "x")], 0)]);
    assert!(!outcome.over_limit);
    assert_eq!(outcome.statuses[0].remaining, 100);
    assert_eq!(*roomy.refunds.lock().unwrap(), [(1, 0)]);
    let full = fake_mesh(0);
    let rules = Rules::with_mesh(config, full.clone()).unwrap();
    let outcome = decide(&rules, "edge", &[query(&[("remote_address", "x")], 0)]);
    assert!(outcome.over_limit && outcome.statuses[0].over_limit);
    assert!(full.refunds.lock().unwrap().is_empty());
}
