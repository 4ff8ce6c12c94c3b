//! The policy file: precise errors for invalid files, reloads that keep counters, calendar
//! days in a time zone, and SIGHUP.

use std::sync::Arc;
use std::time::Duration;

use http::Method;
use ratemesh::config::{ConfigError, GatewayConfig, IdentitySource};
use ratemesh::http::RateLimitLayer;
use ratemesh::rules::{Identity, RequestFacts, Rules};
use ratemesh::{Clock, ManualClock, Nanos};

const FIXTURE: &str = include_str!("fixtures/policies.toml");

fn error_of(text: &str) -> ConfigError {
    GatewayConfig::from_toml_str(text, "bad.toml").expect_err("the file should be rejected")
}

/// The line number of the first line containing `needle`.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|l| l.contains(needle))
        .expect("needle present")
        + 1
}

#[test]
fn the_fixture_is_valid() {
    let config = GatewayConfig::from_toml_str(FIXTURE, "fixture").unwrap();
    assert_eq!(config.policies.len(), 5);
    assert_eq!(config.routes[0].cost, 2);
    assert_eq!(config.default_tier.as_deref(), Some("free"));
}

#[test]
fn an_unknown_algorithm_names_the_line_and_field() {
    let text = FIXTURE.replace(
        "algorithm = \"sliding-window\"",
        "algorithm = \"sliding-widow\"",
    );
    let error = error_of(&text);
    assert_eq!(error.file, "bad.toml");
    assert_eq!(error.line, line_of(&text, "sliding-widow"));
    assert_eq!(error.field, "policies.search_per_minute.algorithm");
    assert!(error.reason.contains("sliding-widow"), "{error}");
    assert!(
        error
            .to_string()
            .starts_with(&format!("bad.toml:{}:", error.line))
    );
}

#[test]
fn a_zero_window_names_the_line_and_field() {
    let text = FIXTURE.replace("window = \"1h\"", "window = \"0s\"");
    let error = error_of(&text);
    assert_eq!(
        (error.line, error.field.as_str()),
        (line_of(&text, "window = \"0s\""), "policies.audit.window")
    );
    assert!(error.reason.contains("greater than zero"), "{error}");
}

#[test]
fn a_bad_duration_and_a_window_over_a_year_are_rejected() {
    let text = FIXTURE.replace("period = \"1m\"", "period = \"one minute\"");
    let error = error_of(&text);
    assert_eq!(error.field, "policies.burst.period");
    assert_eq!(error.line, line_of(&text, "one minute"));
    let text = FIXTURE.replace("window = \"1d\"", "window = \"400d\"");
    let error = error_of(&text);
    assert_eq!(error.field, "policies.daily.window");
    assert!(error.reason.contains("maximum"), "{error}");
}

#[test]
fn a_tier_pointing_to_a_missing_policy_is_rejected() {
    let text = FIXTURE.replace(
        "policies = [\"pro_burst\", \"daily\"]",
        "policies = [\"pro_burst\", \"weekly\"]",
    );
    let error = error_of(&text);
    assert_eq!(error.field, "tiers.pro.policies");
    assert_eq!(error.line, line_of(&text, "\"weekly\""));
    assert!(error.reason.contains("weekly"));
}

#[test]
fn overlapping_routes_are_rejected() {
    let text = format!(
        "{FIXTURE}\n[[routes]]\nname = \"search2\"\nmethod = \"get\"\npath_prefix = \"/search/\"\n"
    );
    let error = error_of(&text);
    assert_eq!(error.field, "routes.search2");
    assert!(error.reason.contains("ambiguous"), "{error}");
    assert_eq!(error.line, line_of(&text, "name = \"search2\"") - 1);
}

#[test]
fn unknown_fields_missing_fields_and_costs_that_never_fit_are_rejected() {
    let text = FIXTURE.replace("burst = 5", "burst = 5\nbrust = 6");
    let error = error_of(&text);
    assert!(error.reason.contains("brust"), "{error}");
    assert_eq!(error.line, line_of(&text, "brust"));

    let text = FIXTURE.replace("burst = 5\n", "");
    let error = error_of(&text);
    assert_eq!(error.field, "policies.burst.burst");
    assert!(error.reason.contains("required"), "{error}");

    let text = FIXTURE.replace("cost = 2", "cost = 6");
    let error = error_of(&text);
    assert_eq!(error.field, "routes.search.cost");
    assert_eq!(error.line, line_of(&text, "cost = 6"));
    assert!(error.reason.contains("can never fit"), "{error}");

    let text = FIXTURE.replace("cost = 2", "cost = 0");
    assert!(error_of(&text).reason.contains("greater than zero"));

    let text = FIXTURE.replace(
        "[tenants]\n\"user:carol\" = \"pro\"",
        "[tenants]\n\"user:carol\" = \"platinum\"",
    );
    assert_eq!(error_of(&text).field, "tenants.user:carol");

    let text = FIXTURE.replace("time_zone", "x").replace(
        "window = \"1d\"",
        "window = \"1d\"\ntime_zone = \"Mars/Olympus\"",
    );
    assert_eq!(error_of(&text).field, "policies.daily.time_zone");

    let text = FIXTURE.replace("window = \"1d\"", "window = \"1d\"\nbackend = \"redis\"");
    let error = error_of(&text);
    assert_eq!(error.field, "policies.daily.backend");
    assert!(error.reason.contains("[redis]"), "{error}");

    // A mesh policy is valid in the file, but rules without a mesh node refuse it.
    let text = FIXTURE.replace("window = \"1d\"", "window = \"1d\"\nbackend = \"mesh\"");
    let config = GatewayConfig::from_toml_str(&text, "test.toml").unwrap();
    let error = Rules::new(config).unwrap_err().to_string();
    assert!(error.contains("`daily` uses backend `mesh`"), "{error}");

    let text = format!(
        "{}\n[redis]\nurl = \"redis://127.0.0.1:1\"\n",
        FIXTURE.replace(
            "burst = 5",
            "burst = 5\nbackend = \"redis\"\ntime_zone = \"UTC\""
        )
    );
    assert_eq!(error_of(&text).field, "policies.burst.time_zone");
}

fn facts<'a>(identity: &'a Identity, method: &'a Method) -> RequestFacts<'a> {
    RequestFacts {
        identity,
        tier: None,
        method,
        path: "/",
        request: Default::default(),
    }
}

#[test]
fn a_reload_keeps_the_counters_of_unchanged_policies_only() {
    let clock = ManualClock::new(1_800_000_000_000_000_000);
    let layer = RateLimitLayer::with_clock(
        GatewayConfig::from_toml_str(FIXTURE, "v1").unwrap(),
        Arc::new(clock.clone()),
    )
    .unwrap();
    let alice = Identity::new(IdentitySource::User, "alice");
    let get = Method::GET;
    for _ in 0..5 {
        assert!(
            layer
                .rules()
                .decide(&facts(&alice, &get), clock.now_ns())
                .allowed
        );
    }
    assert!(
        !layer
            .rules()
            .decide(&facts(&alice, &get), clock.now_ns())
            .allowed
    );
    let before = layer.rules();

    // v2 changes the daily limit and adds nothing else: `burst` keeps its (spent) counter.
    let v2 = FIXTURE.replace("limit = 1000", "limit = 2000");
    layer
        .reload(GatewayConfig::from_toml_str(&v2, "v2").unwrap())
        .unwrap();
    let after = layer.rules();
    assert!(after.shares_counters_with(&before, "burst"));
    assert!(!after.shares_counters_with(&before, "daily"));
    let outcome = after.decide(&facts(&alice, &get), clock.now_ns());
    assert!(!outcome.allowed, "alice's spent burst survived the reload");
    assert_eq!(outcome.denied_by().unwrap().name, "burst");

    // A broken file is refused and the rules in force stay.
    let dir = std::env::temp_dir().join(format!("ratemesh-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("policies.toml");
    std::fs::write(&path, FIXTURE.replace("rate = 1\n", "rate = 0\n")).unwrap();
    let error = layer.reload_from_file(&path).unwrap_err();
    assert!(error.to_string().contains("policies.burst.rate"), "{error}");
    assert!(Arc::ptr_eq(&layer.rules(), &after));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_daily_quota_resets_at_midnight_in_its_time_zone() {
    let text = FIXTURE
        .replace("limit = 1000", "limit = 3")
        .replace(
            "window = \"1d\"",
            "window = \"1d\"\ntime_zone = \"Asia/Tokyo\"",
        )
        .replace("rate = 1\n", "rate = 1000\n")
        .replace("burst = 5", "burst = 1000");
    let rules = Rules::new(GatewayConfig::from_toml_str(&text, "tokyo").unwrap()).unwrap();
    let bob = Identity::new(IdentitySource::User, "bob");
    let get = Method::GET;
    const HOUR: Nanos = 3_600_000_000_000;
    // 2027-01-15 14:00 UTC is 23:00 in Tokyo (UTC+9).
    let evening = 1_800_000_000_000_000_000 / 86_400_000_000_000 * 86_400_000_000_000 + 14 * HOUR;
    let decide = |now: Nanos| rules.decide(&facts(&bob, &get), now);
    for _ in 0..3 {
        assert!(decide(evening).allowed);
    }
    let denied = decide(evening);
    assert!(!denied.allowed);
    assert_eq!(denied.denied_by().unwrap().name, "daily");
    assert_eq!(denied.denied_by().unwrap().decision.retry_after_ns, HOUR);
    // 15:00 UTC is midnight in Tokyo: a new day, hours before midnight UTC.
    assert!(decide(evening + HOUR).allowed);
}

#[cfg(unix)]
#[tokio::test]
async fn sighup_reloads_the_file() {
    let dir = std::env::temp_dir().join(format!("ratemesh-sighup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("policies.toml");
    std::fs::write(&path, FIXTURE).unwrap();
    let layer = RateLimitLayer::from_file(&path).unwrap();
    let task = layer.reload_on_sighup(&path).unwrap();
    let before = layer.rules();
    std::fs::write(&path, FIXTURE.replace("limit = 1000", "limit = 5000")).unwrap();
    // SAFETY-free: `kill` from libc is not a dependency; signal ourselves through the shell.
    let status = std::process::Command::new("kill")
        .args(["-HUP", &std::process::id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while Arc::ptr_eq(&layer.rules(), &before) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no reload within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        layer
            .rules()
            .config()
            .policy("daily")
            .unwrap()
            .policy
            .capacity(),
        5000
    );
    task.abort();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_token_cache_is_checked_where_it_is_written() {
    let redis = "\n[redis]\nurl = \"redis://127.0.0.1:1\"\n";
    let with_cache = |policy_lines: &str, cache: &str| {
        format!(
            "{}{redis}",
            FIXTURE.replace(
                "burst = 100\n",
                &format!("burst = 100\n{policy_lines}token_cache = {cache}\n"),
            )
        )
    };
    let good = with_cache("backend = \"redis\"\n", "{ batch = 10, ttl = \"100ms\" }");
    let config = GatewayConfig::from_toml_str(&good, "good.toml").unwrap();
    let cache = config.policy("pro_burst").unwrap().token_cache.unwrap();
    assert_eq!((cache.batch, cache.ttl), (10, Duration::from_millis(100)));
    Rules::new(config).expect("a cached redis policy compiles");

    for (policy_lines, cache, reason) in [
        ("", "{ batch = 10, ttl = \"100ms\" }", "backend = \"redis\""),
        (
            "backend = \"redis\"\n",
            "{ batch = 100, ttl = \"100ms\" }",
            "below the burst (100)",
        ),
        (
            "backend = \"redis\"\n",
            "{ batch = 0, ttl = \"100ms\" }",
            "at least 1",
        ),
        (
            "backend = \"redis\"\n",
            "{ batch = 10, ttl = \"0s\" }",
            "above zero",
        ),
        (
            "backend = \"redis\"\n",
            "{ batch = 10, ttl = \"1m\" }",
            "rate × ttl",
        ),
        (
            "backend = \"redis\"\n",
            "{ batch = 10, ttl = \"soon\" }",
            "not a duration",
        ),
    ] {
        let text = with_cache(policy_lines, cache);
        let error = error_of(&text);
        assert_eq!(error.field, "policies.pro_burst.token_cache", "{error}");
        assert_eq!(error.line, line_of(&text, "token_cache"), "{error}");
        assert!(error.reason.contains(reason), "{error}");
    }

    // Only buckets: a window has no tokens to hand out ahead of time.
    let text = format!(
        "{}{redis}",
        FIXTURE.replace(
            "limit = 30\n",
            "limit = 30\nbackend = \"redis\"\ntoken_cache = { batch = 5, ttl = \"1s\" }\n",
        )
    );
    let error = error_of(&text);
    assert_eq!(error.field, "policies.search_per_minute.token_cache");
    assert!(error.reason.contains("token-bucket or gcra"), "{error}");

    let text = with_cache(
        "backend = \"redis\"\n",
        "{ batch = 10, ttl = \"1s\", size = 3 }",
    );
    assert!(
        error_of(&text).reason.contains("size"),
        "unknown key refused"
    );
}
