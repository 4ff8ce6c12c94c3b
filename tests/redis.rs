//! The exact backend against a real redis-server that each test starts on a unix socket and
//! stops. Without redis-server on PATH the tests say so and pass, unless
//! `RATEMESH_REQUIRE_REDIS=1` (as in `.ci/run`), where they fail.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ratemesh::algorithm::KeyMachine;
use ratemesh::backend::redis::{
    ExactDecision, ExactLimiter, FailMode, RedisConnection, RedisLimiter, redis_key,
};
use ratemesh::{Limiter, Policy, Verdict};

#[path = "support/redis_server.rs"]
mod redis_server;
use redis_server::RedisServer;

fn connection(server: &RedisServer) -> RedisConnection {
    RedisConnection::single(&server.url(), Duration::from_millis(500)).unwrap()
}

/// Policies whose intervals and windows are whole microseconds (Redis time is in µs).
fn policies() -> Vec<Policy> {
    let s = Duration::from_secs(1);
    vec![
        Policy::token_bucket(20, s, 7).unwrap(),
        Policy::gcra(20, s, 7).unwrap(),
        Policy::fixed_window(9, Duration::from_millis(700)).unwrap(),
        Policy::sliding_window(9, Duration::from_millis(700)).unwrap(),
        Policy::sliding_log(9, Duration::from_millis(700)).unwrap(),
    ]
}

#[tokio::test]
async fn every_script_decides_like_the_local_engine() {
    let Some(server) = RedisServer::start("parity") else {
        return;
    };
    for (p, policy) in policies().into_iter().enumerate() {
        let redis = RedisLimiter::new(connection(&server), policy).unwrap();
        for seed in 1..=3u64 {
            let key = redis_key(
                "test",
                policy.algorithm().name(),
                &format!("client-{seed}"),
                None,
            );
            let mut local = KeyMachine::new(policy);
            let mut now_us = 1_700_000_000_000_000u64 + seed * 1000 + p as u64;
            let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            for step in 0..300 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Gaps of 0-60 ms in whole milliseconds half the time, so arrivals hit boundaries.
                let gap_us = if x % 2 == 0 {
                    (x >> 8) % 60_000
                } else {
                    ((x >> 8) % 60) * 1000
                };
                now_us += gap_us;
                // A cost of 0 (one arrival in four) is a peek, in Redis as locally.
                let cost = (x >> 32) % 4;
                let expected = local.decide(now_us * 1000, cost);
                let got = redis.check_at(&key, cost, Some(now_us)).await.unwrap();
                let context = format!(
                    "{} seed {seed} step {step}: redis {got:?} local {expected:?}",
                    policy.algorithm().name()
                );
                // Redis keeps time in whole microseconds: a retry time the local engine
                // computes to the nanosecond is the next whole microsecond there.
                assert_eq!(
                    got.retry_after_ns,
                    expected.retry_after_ns.div_ceil(1000) * 1000,
                    "{context}"
                );
                assert_eq!(
                    ratemesh::Decision {
                        retry_after_ns: 0,
                        ..got
                    },
                    ratemesh::Decision {
                        retry_after_ns: 0,
                        ..expected
                    },
                    "{context}"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_tasks_on_one_key_admit_exactly_the_capacity() {
    let Some(server) = RedisServer::start("concurrent") else {
        return;
    };
    // 1000 tokens, one more per hour: no refill during the test.
    let policy = Policy::token_bucket(1, Duration::from_secs(3600), 1000).unwrap();
    let redis = Arc::new(RedisLimiter::new(connection(&server), policy).unwrap());
    let admitted = Arc::new(AtomicU64::new(0));
    let key = redis_key("test", "tb", "hot", None);
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (redis, admitted, key) = (Arc::clone(&redis), Arc::clone(&admitted), key.clone());
            tokio::spawn(async move {
                for _ in 0..40 {
                    if redis.check(&key, 1).await.unwrap().is_allowed() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(admitted.load(Ordering::Relaxed), 1000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_token_cache_admits_exactly_the_capacity_with_few_redis_calls() {
    let Some(server) = RedisServer::start("cache") else {
        return;
    };
    let policy = Policy::token_bucket(1, Duration::from_secs(3600), 1000).unwrap();
    let redis = RedisLimiter::new(connection(&server), policy).unwrap();
    let cache = Arc::new(
        ratemesh::backend::token_cache::TokenCache::new(redis, 20, Duration::from_secs(30))
            .unwrap(),
    );
    let admitted = Arc::new(AtomicU64::new(0));
    let key = redis_key("test", "tb", "cached", None);
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (cache, admitted, key) = (Arc::clone(&cache), Arc::clone(&admitted), key.clone());
            tokio::spawn(async move {
                for _ in 0..40 {
                    if cache.check(&key, 1).await.unwrap().is_allowed() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    // Never more than Redis granted; the cache empties before Redis says no, so nothing is
    // lost either (one node, one key, a long ttl).
    assert_eq!(admitted.load(Ordering::Relaxed), 1000);
    // 2560 requests: about one Redis call per batch of 21 while tokens last; once Redis has
    // said the bucket is empty (no refill for an hour), the denials are answered locally.
    let calls = cache.redis_calls();
    let local = cache.local_denials();
    eprintln!(
        "token cache: 2560 requests, 1000 admitted, {calls} Redis calls, {local} local denials"
    );
    // 64 tasks miss the cache together at times, so the counts vary with scheduling; the
    // bounds are loose on purpose (one call per request without the cache).
    assert!(calls < 2560 / 4, "{calls} Redis calls");
    assert!(local > 1000, "{local} local denials");
}

#[tokio::test]
async fn the_token_cache_denies_locally_only_while_redis_has_no_token() {
    let Some(server) = RedisServer::start("cache-empty") else {
        return;
    };
    // One token per 2 s, burst 3; the cache takes one extra token per call.
    let policy = Policy::token_bucket(1, Duration::from_secs(2), 3).unwrap();
    let redis = RedisLimiter::new(connection(&server), policy).unwrap();
    let cache =
        ratemesh::backend::token_cache::TokenCache::new(redis, 1, Duration::from_secs(5)).unwrap();
    let key = redis_key("test", "tb", "empty", None);
    let mut admitted = 0;
    let last_denial = loop {
        let decision = cache.check(&key, 1).await.unwrap();
        if !decision.is_allowed() {
            break decision;
        }
        admitted += 1;
        assert!(admitted <= 3, "never more than the burst");
    };
    assert_eq!(admitted, 3, "the burst, through the cache");
    assert!(last_denial.retry_after_ns <= 2_000_000_000);
    let calls_before = cache.redis_calls();
    for _ in 0..1000 {
        let asked = std::time::Instant::now();
        let decision = cache.check(&key, 1).await.unwrap();
        assert_eq!(decision.verdict, Verdict::Denied);
        assert!(decision.retry_after_ns <= 2_000_000_000);
        // A request of 2 tokens waits one interval more, less the time between the two
        // decisions (each reads the clock; a retry time is rounded up to the microsecond).
        let two = cache.check(&key, 2).await.unwrap();
        let between = asked.elapsed().as_nanos() as u64;
        assert!(
            two.retry_after_ns + between + 1_000 >= decision.retry_after_ns + 2_000_000_000,
            "{} then {} ns, {between} ns apart",
            decision.retry_after_ns,
            two.retry_after_ns
        );
    }
    assert!(
        cache.redis_calls() - calls_before <= 2,
        "{} calls for 2000 denied requests",
        cache.redis_calls() - calls_before
    );
    assert!(cache.local_denials() >= 1998);
    // The local denial's retry time is never later than Redis's: after it, Redis admits.
    let decision = cache.check(&key, 1).await.unwrap();
    tokio::time::sleep(Duration::from_nanos(decision.retry_after_ns)).await;
    assert!(cache.check(&key, 1).await.unwrap().is_allowed());
    // A cost above the burst can never fit, cached or not.
    assert_eq!(
        cache.check(&key, 4).await.unwrap().verdict,
        Verdict::CannotFit
    );
}

/// A policy file whose `redis` token bucket (1000 tokens, no refill to speak of) has a
/// `token_cache`, with `key_secret` so that keys are stable.
fn cached_policy_file(url: &str) -> String {
    format!(
        r#"
env = "test"
key_secret = "s"
default_tier = "all"
[redis]
url = "{url}"
[policies.hot]
algorithm = "token-bucket"
rate = 1
period = "1h"
burst = 1000
backend = "redis"
token_cache = {{ batch = 20, ttl = "5s" }}
[tiers.all]
policies = ["hot"]
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_cache_in_the_policy_file_admits_exactly_the_burst_with_fewer_redis_calls() {
    use ratemesh::config::{GatewayConfig, IdentitySource};
    use ratemesh::rules::{Identity, RequestFacts, Rules};
    let Some(server) = RedisServer::start("cache-file") else {
        return;
    };
    let config =
        GatewayConfig::from_toml_str(&cached_policy_file(&server.url()), "cache.toml").unwrap();
    let rules = Arc::new(Rules::new(config).unwrap());
    let admitted = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (rules, admitted) = (Arc::clone(&rules), Arc::clone(&admitted));
            tokio::spawn(async move {
                let identity = Identity::new(IdentitySource::ApiKey, "hot-client");
                let facts = RequestFacts {
                    identity: &identity,
                    tier: None,
                    method: &http::Method::GET,
                    path: "/",
                    request: Default::default(),
                };
                let clock = ratemesh::SystemClock::new();
                for _ in 0..40 {
                    let now = ratemesh::clock::Clock::now_ns(&clock);
                    if rules.decide_exact(&facts, now).await.allowed {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let calls = server.evalsha_calls();
    eprintln!("policy-file token cache: 2560 requests, 1000 admitted, {calls} EVALSHA calls");
    assert_eq!(admitted.load(Ordering::Relaxed), 1000);
    // Without the cache every request is one call: 2560. With it the 1000 admissions take
    // about 1000 / 21 calls, and once Redis said the bucket is empty the denials stay local.
    // (64 tasks miss the cache together at times: the bound is loose on purpose.)
    assert!(calls < 2560 / 4, "{calls} calls");

    // The same file without the cache makes one call per request.
    let plain = cached_policy_file(&server.url())
        .replace("token_cache = { batch = 20, ttl = \"5s\" }\n", "");
    let rules = Rules::new(GatewayConfig::from_toml_str(&plain, "plain.toml").unwrap()).unwrap();
    let identity = Identity::new(IdentitySource::ApiKey, "another-client");
    let facts = RequestFacts {
        identity: &identity,
        tier: None,
        method: &http::Method::GET,
        path: "/",
        request: Default::default(),
    };
    let before = server.evalsha_calls();
    for _ in 0..30 {
        assert!(rules.decide_exact(&facts, 0).await.allowed);
    }
    assert_eq!(server.evalsha_calls() - before, 30);
}

#[tokio::test]
async fn a_flushed_script_cache_is_recovered() {
    let Some(server) = RedisServer::start("noscript") else {
        return;
    };
    let policy = Policy::gcra(10, Duration::from_secs(1), 5).unwrap();
    let redis = RedisLimiter::new(connection(&server), policy).unwrap();
    assert!(redis.check("rl:{a}:k", 1).await.unwrap().is_allowed());
    server.cli(&["SCRIPT", "FLUSH"]);
    let after = redis.check("rl:{a}:k", 1).await.unwrap();
    assert!(after.is_allowed());
    assert_eq!(
        after.remaining, 3,
        "the state survived; only the script cache was flushed"
    );
}

#[tokio::test]
async fn redis_down_fails_open_or_closed_as_the_policy_says_and_recovers() {
    let Some(mut server) = RedisServer::start("failmode") else {
        return;
    };
    let policy = Policy::token_bucket(1, Duration::from_secs(3600), 3).unwrap();
    let fallback = || {
        Limiter::builder()
            .policy(Policy::token_bucket(1, Duration::from_secs(3600), 1).unwrap())
            .build::<String>()
            .unwrap()
    };
    let open = ExactLimiter::new(
        RedisLimiter::new(connection(&server), policy).unwrap(),
        FailMode::Open,
        fallback(),
    );
    let closed = ExactLimiter::new(
        RedisLimiter::new(connection(&server), policy).unwrap(),
        FailMode::Closed,
        fallback(),
    );
    assert!(matches!(open.check("rl:{o}:k", 1).await, ExactDecision::Exact(d) if d.remaining == 2));
    assert!(matches!(
        closed.check("rl:{c}:k", 1).await,
        ExactDecision::Exact(_)
    ));

    server.stop();
    // Fail open: the local fallback (burst 1) decides, and the failover is counted.
    let first = open.check("rl:{o}:k", 1).await;
    assert!(
        matches!(first, ExactDecision::Fallback(d) if d.verdict == Verdict::Allowed),
        "{first:?}"
    );
    assert!(
        matches!(open.check("rl:{o}:k", 1).await, ExactDecision::Fallback(d) if d.verdict == Verdict::Denied)
    );
    assert!(open.failovers() >= 2);
    // Fail closed: denied, and not as a rate limit.
    assert_eq!(
        closed.check("rl:{c}:k", 1).await,
        ExactDecision::Unavailable
    );

    // Redis comes back (empty: nothing was persisted); no restart of the gateway needed.
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let ExactDecision::Exact(d) = closed.check("rl:{c}:k", 1).await {
            assert_eq!(d.verdict, Verdict::Allowed);
            break;
        }
        assert!(Instant::now() < deadline, "no recovery within 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn keys_carry_the_identity_as_a_hash_tag() {
    assert_eq!(
        redis_key("prod", "pay", "api_key:9f2c", Some("reset")),
        "rl:{api_key:9f2c}:prod:pay:reset"
    );
    assert_eq!(
        redis_key("prod", "pay", "user:1", None),
        "rl:{user:1}:prod:pay"
    );
}

/// A free TCP port whose cluster-bus port (+10000) is free too (both probed, small race).
fn free_port_pair() -> u16 {
    loop {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        if port < 55_000 && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_node_redis_cluster_decides_without_crossslot() {
    if Command::new("redis-server")
        .arg("--version")
        .output()
        .is_err()
    {
        assert_ne!(
            std::env::var("RATEMESH_REQUIRE_REDIS").as_deref(),
            Ok("1"),
            "redis-server is required"
        );
        eprintln!("SKIPPED: redis-server is not on PATH");
        return;
    }
    let dir = std::env::temp_dir().join(format!("ratemesh-redis-cluster-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    struct Nodes(Vec<Child>);
    impl Drop for Nodes {
        fn drop(&mut self) {
            for child in &mut self.0 {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
    let ports: Vec<u16> = (0..3).map(|_| free_port_pair()).collect();
    let mut nodes = Nodes(Vec::new());
    for port in &ports {
        let node_dir = dir.join(port.to_string());
        std::fs::create_dir_all(&node_dir).unwrap();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--cluster-enabled",
                "yes",
            ])
            .args([
                "--cluster-config-file",
                "nodes.conf",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
            ])
            .arg(&node_dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        nodes.0.push(child);
    }
    let ping = |port: u16| {
        Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "PING"])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("PONG"))
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ports.iter().all(|&p| ping(p)) {
        assert!(Instant::now() < deadline, "cluster nodes did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let addresses: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let created = Command::new("redis-cli")
        .args(["--cluster", "create"])
        .args(&addresses)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .output()
        .unwrap();
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stdout)
    );
    let cluster_ok = |port: u16| {
        Command::new("redis-cli")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "CLUSTER",
                "INFO",
            ])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("cluster_state:ok"))
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ports.iter().all(|&p| cluster_ok(p)) {
        assert!(Instant::now() < deadline, "the cluster did not become ok");
        std::thread::sleep(Duration::from_millis(50));
    }

    let urls: Vec<String> = addresses.iter().map(|a| format!("redis://{a}")).collect();
    let connection = RedisConnection::cluster(&urls, Duration::from_secs(2)).unwrap();
    let mut decisions = 0;
    for policy in policies() {
        let redis = RedisLimiter::new(connection.clone(), policy).unwrap();
        // Many clients, so the keys spread over all three nodes' slots.
        for client in 0..40 {
            let key = redis_key(
                "test",
                policy.algorithm().name(),
                &format!("client-{client}"),
                Some("pay"),
            );
            for _ in 0..3 {
                redis
                    .check(&key, 1)
                    .await
                    .unwrap_or_else(|e| panic!("{key}: {e}"));
                decisions += 1;
            }
        }
    }
    assert_eq!(decisions, 5 * 40 * 3);
    // Without the hash tag, the sliding log's two keys land in different slots: the test
    // would have seen CROSSSLOT had `redis_key` not tagged the identity.
    let log = RedisLimiter::new(connection.clone(), policies()[4]).unwrap();
    let error = log.check("rl:untagged:client", 1).await.unwrap_err();
    assert!(
        error.to_string().to_lowercase().contains("crossslot"),
        "{error}"
    );
    drop(nodes);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A policy file with an exact money-path policy, served over HTTP on loopback.
async fn serve_with_redis(url: &str, fail_mode: &str) -> (String, tokio::task::JoinHandle<()>) {
    use axum::routing::post;
    let file = format!(
        r#"
env = "test"
key_secret = "s"
default_tier = "all"
[redis]
url = "{url}"
timeout = "200ms"
[policies.per_second]
algorithm = "token-bucket"
rate = 100
period = "1s"
burst = 100
[policies.password_reset]
algorithm = "sliding-log"
limit = 3
window = "1m"
backend = "redis"
fail_mode = "{fail_mode}"
[tiers.all]
policies = ["per_second"]
[[routes]]
name = "reset"
method = "POST"
path_prefix = "/password-reset"
policies = ["password_reset"]
"#
    );
    let config = ratemesh::config::GatewayConfig::from_toml_str(&file, "money.toml").unwrap();
    let layer = ratemesh::http::RateLimitLayer::new(config).unwrap();
    let app = axum::Router::new()
        .route("/password-reset", post(|| async { "sent" }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
        )
        .await
        .unwrap();
    });
    (base, task)
}

#[tokio::test]
async fn a_money_path_policy_is_exact_through_redis_and_fails_closed_with_503() {
    let Some(mut server) = RedisServer::start("http-closed") else {
        return;
    };
    let (base, task) = serve_with_redis(&server.url(), "closed").await;
    let http = reqwest::Client::new();
    let reset = || {
        http.post(format!("{base}/password-reset"))
            .header("x-api-key", "victim")
            .send()
    };
    for _ in 0..3 {
        assert_eq!(reset().await.unwrap().status(), 200);
    }
    let denied = reset().await.unwrap();
    assert_eq!(denied.status(), 429);
    assert!(denied.headers().get("retry-after").is_some());
    assert!(
        denied
            .headers()
            .get("ratelimit")
            .unwrap()
            .to_str()
            .unwrap()
            .contains("\"password_reset\";r=0")
    );
    // Another client is untouched: the limit is per client, exactly.
    let other = http
        .post(format!("{base}/password-reset"))
        .header("x-api-key", "other")
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 200);

    server.stop();
    let down = http
        .post(format!("{base}/password-reset"))
        .header("x-api-key", "third")
        .send()
        .await
        .unwrap();
    assert_eq!(
        down.status(),
        503,
        "fail closed: the backend failed, not the client"
    );
    let body: serde_json::Value = down.json().await.unwrap();
    assert_eq!(body["error"], "temporary-reduced-capacity");
    assert_eq!(body["policy"], "password_reset");
    task.abort();
}

#[tokio::test]
async fn a_fail_open_policy_decides_locally_while_redis_is_down() {
    let Some(mut server) = RedisServer::start("http-open") else {
        return;
    };
    let (base, task) = serve_with_redis(&server.url(), "open").await;
    server.stop();
    let http = reqwest::Client::new();
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let response = http
            .post(format!("{base}/password-reset"))
            .header("x-api-key", "k")
            .send()
            .await
            .unwrap();
        statuses.push(response.status().as_u16());
    }
    assert_eq!(
        statuses,
        vec![200, 200, 200, 429],
        "the local fallback enforces the same policy"
    );
    task.abort();
}

#[tokio::test]
async fn a_lockout_kept_in_redis_holds_the_key_for_every_gateway_until_it_ends() {
    let Some(server) = RedisServer::start("lockout") else {
        return;
    };
    let block = Duration::from_secs(900);
    let s = Duration::from_secs(1);
    let minute = Duration::from_secs(60);
    for policy in [
        Policy::token_bucket(2, minute, 2).unwrap(),
        Policy::gcra(2, minute, 2).unwrap(),
        Policy::fixed_window(2, minute).unwrap(),
        Policy::sliding_window(2, minute).unwrap(),
        Policy::sliding_log(2, minute).unwrap(),
    ] {
        let name = policy.algorithm().name();
        // Two gateways with the same policy on one Redis.
        let one = RedisLimiter::new(connection(&server), policy)
            .unwrap()
            .with_block_for(block);
        let two = RedisLimiter::new(connection(&server), policy)
            .unwrap()
            .with_block_for(block);
        let key = redis_key("test", name, "locked", None);
        let t0 = 1_700_000_040_000_000u64;
        for i in 0..2 {
            assert!(
                one.check_at(&key, 1, Some(t0 + i))
                    .await
                    .unwrap()
                    .is_allowed(),
                "{name}"
            );
        }
        // The third is denied and locks the key for 900 s.
        let denied = one.check_at(&key, 1, Some(t0 + 2)).await.unwrap();
        assert_eq!(denied.verdict, Verdict::Denied, "{name}");
        assert_eq!(denied.retry_after_ns, block.as_nanos() as u64, "{name}");
        // Two minutes on, the policy alone would admit again: the lockout holds, on the
        // other gateway too, with the time left.
        let later = t0 + 2 + 120 * 1_000_000;
        let held = two.check_at(&key, 1, Some(later)).await.unwrap();
        assert_eq!(held.verdict, Verdict::Denied, "{name}");
        assert_eq!(held.retry_after_ns, 780 * s.as_nanos() as u64, "{name}");
        assert_eq!(held.remaining, 0, "{name}");
        // A peek while locked reports it and changes nothing.
        let peek = two.check_at(&key, 0, Some(later)).await.unwrap();
        assert_eq!(peek.verdict, Verdict::Denied, "{name}");
        // Once it ends, the key is admitted again.
        let after = t0 + 2 + 900 * 1_000_000;
        assert!(
            two.check_at(&key, 1, Some(after))
                .await
                .unwrap()
                .is_allowed(),
            "{name}"
        );
        // Without `block_for`, the same policy holds no lockout.
        let plain = RedisLimiter::new(connection(&server), policy).unwrap();
        let other = redis_key("test", name, "unlocked", None);
        for i in 0..3 {
            plain.check_at(&other, 1, Some(t0 + i)).await.unwrap();
        }
        assert!(
            plain
                .check_at(&other, 1, Some(later))
                .await
                .unwrap()
                .is_allowed(),
            "{name}"
        );
    }
}
