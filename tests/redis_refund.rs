//! Giving a charge back in Redis, against a real redis-server that each test starts: every
//! algorithm's refund undoes one charge and no more, a window's charge is kept once its
//! window is over (or when the refund cannot tell it from the window before) while a log's
//! is given back until it leaves the log, and the rules
//! give back an earlier `redis` policy's charge when a later one denies the request.

use std::sync::Arc;
use std::time::Duration;

use http::Method;
use ratemesh::backend::redis::{RedisConnection, RedisLimiter, redis_key};
use ratemesh::backend::redis_limits::RedisLimits;
use ratemesh::config::{GatewayConfig, IdentitySource};
use ratemesh::rules::{Identity, Outcome, RequestFacts, Rules};
use ratemesh::{Policy, Verdict};

#[path = "support/redis_server.rs"]
mod redis_server;
use redis_server::RedisServer;

/// An instant in whole windows of 700 ms and whole seconds (Redis time, µs).
const T0: u64 = 1_700_000_000_100_000;

fn connection(server: &RedisServer) -> RedisConnection {
    RedisConnection::single(&server.url(), Duration::from_millis(500)).unwrap()
}

#[tokio::test]
async fn a_refund_undoes_one_charge_for_every_algorithm() {
    let Some(server) = RedisServer::start("refund-each") else {
        return;
    };
    let s = Duration::from_secs(1);
    let window = Duration::from_millis(700);
    for policy in [
        Policy::token_bucket(20, s, 3).unwrap(),
        Policy::gcra(20, s, 3).unwrap(),
        Policy::fixed_window(3, window).unwrap(),
        Policy::sliding_window(3, window).unwrap(),
        Policy::sliding_log(3, window).unwrap(),
    ] {
        let name = policy.algorithm().name();
        let redis = RedisLimiter::new(connection(&server), policy).unwrap();
        let key = redis_key("test", name, "refund", None);
        // Three charges a microsecond apart spend the capacity.
        for i in 0..3 {
            let d = redis.check_at(&key, 1, Some(T0 + i)).await.unwrap();
            assert!(d.is_allowed(), "{name}: charge {i}");
        }
        let now = T0 + 10;
        let denied = redis.check_at(&key, 1, Some(now)).await.unwrap();
        assert_eq!(denied.verdict, Verdict::Denied, "{name}");
        // Give one back (charged within the last 100 µs): exactly one more fits.
        assert!(
            redis.refund_at(&key, 1, 100, Some(now)).await.unwrap(),
            "{name}"
        );
        let again = redis.check_at(&key, 1, Some(now + 1)).await.unwrap();
        assert!(again.is_allowed(), "{name}: the refunded token");
        let next = redis.check_at(&key, 1, Some(now + 2)).await.unwrap();
        assert_eq!(next.verdict, Verdict::Denied, "{name}: one token, no more");
    }
}

#[tokio::test]
async fn a_windows_charge_is_kept_once_its_window_is_over_or_cannot_be_told_apart() {
    let Some(server) = RedisServer::start("refund-windows") else {
        return;
    };
    let window_us = 700_000;
    let window = Duration::from_micros(window_us);
    let start = T0 - T0 % window_us;
    for policy in [
        Policy::fixed_window(3, window).unwrap(),
        Policy::sliding_window(3, window).unwrap(),
    ] {
        let name = policy.algorithm().name();
        let redis = RedisLimiter::new(connection(&server), policy).unwrap();
        let key = redis_key("test", name, "boundaries", None);
        // A charge at the end of one window, refunded in the next: kept.
        let late = start + window_us - 5;
        assert!(
            redis
                .check_at(&key, 1, Some(late))
                .await
                .unwrap()
                .is_allowed()
        );
        let next_window = start + window_us + 5;
        assert!(
            !redis
                .refund_at(&key, 1, 20, Some(next_window))
                .await
                .unwrap(),
            "{name}: a refund reaching into the window before gives nothing back"
        );
        // Three charges in the new window, then a refund that could be of either window.
        for i in 0..3 {
            let at = next_window + 1 + i;
            let d = redis.check_at(&key, 1, Some(at)).await.unwrap();
            assert!(
                d.is_allowed() || name != "fixed-window",
                "{name}: charge {i}: {d:?}"
            );
        }
        let now = next_window + 10;
        assert!(
            !redis.refund_at(&key, 1, 100, Some(now)).await.unwrap(),
            "{name}: [now - 100 µs, now] begins in the window before"
        );
        // The same refund known to be recent goes back.
        assert!(
            redis.refund_at(&key, 1, 9, Some(now)).await.unwrap(),
            "{name}"
        );
    }
    // A log has no windows to cross: a charge at the end of one span of its length is given
    // back in the next, and nothing more than what was charged goes back.
    let redis =
        RedisLimiter::new(connection(&server), Policy::sliding_log(3, window).unwrap()).unwrap();
    let key = redis_key("test", "sliding-log", "boundaries", None);
    let late = start + window_us - 5;
    assert!(
        redis
            .check_at(&key, 1, Some(late))
            .await
            .unwrap()
            .is_allowed()
    );
    assert!(
        redis
            .refund_at(&key, 1, 20, Some(start + window_us + 5))
            .await
            .unwrap()
    );
    assert!(
        !redis
            .refund_at(&key, 1, 20, Some(start + window_us + 6))
            .await
            .unwrap(),
        "one charge, one refund"
    );
    // An entry that left the log is never taken for the refund of a later charge.
    assert!(
        redis
            .check_at(&key, 1, Some(late + 1))
            .await
            .unwrap()
            .is_allowed()
    );
    assert!(
        !redis
            .refund_at(&key, 1, 20, Some(late + 1 + window_us))
            .await
            .unwrap()
    );
}

#[tokio::test]
async fn a_sliding_log_gives_back_the_earliest_entry_of_the_cost_within_the_span() {
    let Some(server) = RedisServer::start("refund-log") else {
        return;
    };
    let window = Duration::from_millis(700);
    let redis =
        RedisLimiter::new(connection(&server), Policy::sliding_log(4, window).unwrap()).unwrap();
    let key = redis_key("test", "log", "earliest", None);
    // Entries at T0 (cost 2), T0 + 100 (cost 1), T0 + 200 (cost 1).
    for (at, cost) in [(T0, 2), (T0 + 100, 1), (T0 + 200, 1)] {
        assert!(
            redis
                .check_at(&key, cost, Some(at))
                .await
                .unwrap()
                .is_allowed()
        );
    }
    // A refund of cost 1 charged within [T0 + 50, T0 + 250]: the entry at T0 + 100 goes.
    assert!(redis.refund_at(&key, 1, 200, Some(T0 + 250)).await.unwrap());
    // What is left: 2 at T0 and 1 at T0 + 200. At T0 + 700_000 the first leaves the window,
    // the one at T0 + 200 is still counted: 3 tokens free, not 4.
    let at = T0 + 700_000;
    let d = redis.check_at(&key, 0, Some(at)).await.unwrap();
    assert_eq!(d.remaining, 3, "{d:?}");
}

const TWO: &str = r#"
env = "test"
key_secret = "s"
default_tier = "api"

[redis]
url = "URL"

[policies.per_account]
algorithm = "fixed-window"
limit = 5
window = "15m"
backend = "redis"
by = ["header:x-account"]

[policies.per_address]
algorithm = "token-bucket"
rate = 2
period = "1h"
burst = 2
backend = "redis"
by = ["ip"]

[tiers.api]
policies = ["per_account", "per_address"]
"#;

async fn login(rules: &Rules, account: &str, address: &str) -> Outcome {
    let identity = Identity::new(IdentitySource::Ip, address);
    let mut headers = http::HeaderMap::new();
    headers.insert("x-account", account.parse().unwrap());
    let facts = RequestFacts {
        identity: &identity,
        tier: Some("api"),
        method: &Method::POST,
        path: "/login",
        request: ratemesh::rules::RequestParts {
            headers: Some(&headers),
            client_ip: Some(address.parse().unwrap()),
            ..Default::default()
        },
    };
    rules.decide_exact(&facts, 1_000_000_000_000).await
}

#[tokio::test]
async fn an_attackers_denials_by_address_never_charge_the_victims_account_in_redis() {
    let Some(server) = RedisServer::start("refund-rules") else {
        return;
    };
    let file = TWO.replace("URL", &server.url());
    let config = GatewayConfig::from_toml_str(&file, "two.toml").unwrap();
    let redis = RedisLimits::from_config(&config).unwrap().unwrap();
    let rules = Rules::with_backends(config, None, Some(Arc::new(redis))).unwrap();
    // The attacker's address may try twice; every later try is denied by address, and the
    // account's charge of each is given back.
    for i in 0..20 {
        let outcome = login(&rules, "victim", "198.51.100.7").await;
        assert_eq!(outcome.allowed, i < 2, "try {i}");
        if !outcome.allowed {
            assert_eq!(outcome.denied_by().unwrap().name, "per_address");
        }
    }
    // The victim's account was charged twice (the two tries that passed): 3 logins left.
    for i in 0..3 {
        let outcome = login(&rules, "victim", &format!("203.0.113.{}", 10 + i)).await;
        assert!(outcome.allowed, "the victim's login {i}");
    }
    let outcome = login(&rules, "victim", "203.0.113.50").await;
    assert_eq!(outcome.denied_by().unwrap().name, "per_account");
}
