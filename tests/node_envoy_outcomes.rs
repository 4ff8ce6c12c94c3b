//! Failed logins counted behind Envoy, as `deploy/envoy/login-outcomes.yaml` sends them to a
//! `ratemesh node`'s `[envoy_rls]` port: a check that takes nothing (hits 0) before each
//! login, and the login's outcome as its hits when its stream ends, on a local or `mesh`
//! descriptor and a `redis` one (Redis asked to look at a check, the mesh giving back the
//! token a check took).

mod support;

#[path = "support/redis_server.rs"]
mod redis_server;
#[path = "support/rls.rs"]
mod rls;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use rls::*;
use support::*;

/// The domain `deploy/envoy/login-outcomes.yaml` sends: failed logins per account (on each
/// node) and per address (in Redis, for every node).
const LOGIN: &str = r#"
env = "test"
key_secret = "test-secret"

[redis]
url = "URL"

[[envoy.domains]]
domain = "login"
descriptors = [
  { key = "account", backend = "local", rate_limit = { requests_per_unit = 3, unit = "hour" } },
  { key = "remote_address", backend = "redis", rate_limit = { requests_per_unit = 5, unit = "hour" } },
]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_logins_are_checked_before_and_counted_when_the_stream_ends() {
    let Some(redis) = redis_server::RedisServer::start("envoy-outcomes") else {
        return;
    };
    logins_behind_envoy(&LOGIN.replace("URL", &redis.url())).await;
}

/// The same with the account counted by the mesh: a check takes a token of the account's
/// lease and gives it back at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mesh_descriptor_is_checked_before_and_counted_when_the_stream_ends() {
    let Some(redis) = redis_server::RedisServer::start("envoy-outcomes-mesh") else {
        return;
    };
    let text = LOGIN.replace("URL", &redis.url()).replace(
        "key = \"account\", backend = \"local\"",
        "key = \"account\", backend = \"mesh\"",
    );
    assert!(text.contains("backend = \"mesh\""));
    logins_behind_envoy(&text).await;
}

/// Logins as Envoy reports them, against the `login` domain of `policies`: alice's
/// successes cost nothing, bob's account is over after 3 failures, an address after 5.
async fn logins_behind_envoy(policies: &str) {
    let dir = tempfile::tempdir().unwrap();
    let (files, rls) = rls_cluster(dir.path(), 1, policies);
    let node = start(&files[0]);
    wait_healthy(&client(), &node).await;
    let mut rls_client = rls_client(rls[0]).await;
    away_from_window_ends(5.0);
    // What Envoy sends for one login: before it runs, hits 0; when it ends, its outcome.
    let login = |account: &str, address: &str, hits: u64| {
        request(
            "login",
            vec![
                descriptor(&[("account", account)], Some(hits)),
                descriptor(&[("remote_address", address)], Some(hits)),
            ],
            1,
        )
    };
    let mut attempt = async |account: &str, address: &str, failed: bool| -> bool {
        let check = ask(&mut rls_client, login(account, address, 0))
            .await
            .unwrap();
        if check.overall_code != Code::Ok as i32 {
            return false;
        }
        let done = ask(&mut rls_client, login(account, address, u64::from(failed)))
            .await
            .unwrap();
        assert_eq!(
            done.overall_code,
            Code::Ok as i32,
            "a stream-end call within the limit"
        );
        true
    };
    // Successful logins cost nothing.
    for _ in 0..10 {
        assert!(attempt("alice", "192.0.2.1", false).await);
    }
    // Three failures on bob's account: the next check is over, before the login runs.
    for i in 0..3 {
        assert!(attempt("bob", &format!("198.51.100.{i}"), true).await);
    }
    assert!(
        !attempt("bob", "192.0.2.1", false).await,
        "bob's account is over"
    );
    // Five failures from one address over five accounts: the Redis count is over at the
    // check (Redis asked to look, taking nothing).
    for i in 0..5 {
        assert!(attempt(&format!("user{i}"), "203.0.113.9", true).await);
    }
    assert!(
        !attempt("carol", "203.0.113.9", false).await,
        "the address is over"
    );
    assert!(
        attempt("carol", "192.0.2.1", false).await,
        "carol elsewhere is not"
    );
    // The check-only calls charged nothing in Redis: alice's address has its 5.
    let look = ask(&mut rls_client, login("alice", "192.0.2.1", 0))
        .await
        .unwrap();
    assert_eq!(look.statuses[1].limit_remaining, 5);
}
