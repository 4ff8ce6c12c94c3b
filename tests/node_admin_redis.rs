//! The admin API on a `redis` policy, with a redis-server of the test's own and two
//! `ratemesh node`s sharing it: a key read from Redis, its reset (one fresh limit for the
//! whole cluster), an override enforced by every node through the policy's script, and its
//! removal.

mod support;

#[path = "support/redis_server.rs"]
mod redis_server;

use serde_json::{Value, json};
use support::*;

const TOKEN: &str = "support-0123456789abcdef0123456789abcdef";

const POLICIES: &str = "env = \"test\"\nkey_secret = \"test-secret\"\ndefault_tier = \"api\"\n\n\
    [redis]\nurl = \"URL\"\n\n\
    [policies.per_account]\nalgorithm = \"fixed-window\"\nlimit = 3\nwindow = \"1h\"\n\
    backend = \"redis\"\nby = [\"header:x-account\"]\n\n\
    [tiers.api]\npolicies = [\"per_account\"]\n";

async fn call(
    client: &reqwest::Client,
    admin: std::net::SocketAddr,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    admin_call(client, admin, TOKEN, method, path, body).await
}

/// `n` requests of `account` round the nodes; how many were admitted.
async fn admitted(
    client: &reqwest::Client,
    nodes: &[NodeProcess],
    account: &str,
    n: usize,
) -> usize {
    let mut ok = 0;
    for i in 0..n {
        let status = client
            .get(format!("http://{}/orders", nodes[i % nodes.len()].http))
            .header("x-account", account)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16();
        ok += usize::from(status == 200);
    }
    ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_key_is_read_reset_and_overridden_for_the_whole_cluster() {
    let Some(redis) = redis_server::RedisServer::start("admin-redis") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster_with(dir.path(), 2, &POLICIES.replace("URL", &redis.url()));
    let admins = add_admin(dir.path(), &files, |_| true, TOKEN);
    let nodes: Vec<NodeProcess> = files.iter().map(|f| start(f)).collect();
    let client = client();
    for node in &nodes {
        wait_healthy(&client, node).await;
    }
    let alice = "/v1/keys?policy=per_account&header:x-account=alice";

    // Three admitted across both nodes, then none: one count in Redis.
    assert_eq!(admitted(&client, &nodes, "alice", 5).await, 3);
    let (status, key) = call(&client, admins[1], reqwest::Method::GET, alice, None).await;
    assert_eq!(status, 200, "{key}");
    assert_eq!(
        (
            key["backend"].as_str(),
            key["limit"].as_u64(),
            key["remaining"].as_u64()
        ),
        (Some("redis"), Some(3), Some(0)),
        "{key}"
    );
    assert!(key["reset_after_ms"].as_u64().unwrap() > 0, "{key}");

    // A reset: exactly one fresh limit across the nodes.
    let (status, reset) = call(
        &client,
        admins[0],
        reqwest::Method::POST,
        "/v1/keys/reset?policy=per_account&header:x-account=alice",
        None,
    )
    .await;
    assert_eq!(
        (status, reset["reset"].as_bool()),
        (200, Some(true)),
        "{reset}"
    );
    let (_, key) = call(&client, admins[1], reqwest::Method::GET, alice, None).await;
    assert_eq!(key["remaining"].as_u64(), Some(3), "{key}");
    assert_eq!(admitted(&client, &nodes, "alice", 6).await, 3);

    // An override of 6 for bob, set on one node, enforced by both.
    let (status, set) = call(
        &client,
        admins[0],
        reqwest::Method::PUT,
        "/v1/overrides",
        Some(json!({"policy": "per_account", "attributes": {"header:x-account": "bob"}, "limit": 6, "for": "1h"})),
    )
    .await;
    assert_eq!(status, 200, "{set}");
    assert_eq!(set["nodes"], json!([1, 2]), "{set}");
    assert_eq!(admitted(&client, &nodes, "bob", 9).await, 6);
    // Carol keeps the policy's limit.
    assert_eq!(admitted(&client, &nodes, "carol", 5).await, 3);
    // Removed: bob is back to 3 and has used 6 (over his limit now: denied, never an
    // unreadable answer that would fail open).
    let (status, removed) = call(
        &client,
        admins[1],
        reqwest::Method::DELETE,
        "/v1/overrides",
        Some(json!({"policy": "per_account", "attributes": {"header:x-account": "bob"}})),
    )
    .await;
    assert_eq!(status, 200, "{removed}");
    assert_eq!(admitted(&client, &nodes, "bob", 4).await, 0);
    let (_, key) = call(
        &client,
        admins[0],
        reqwest::Method::GET,
        "/v1/keys?policy=per_account&header:x-account=bob",
        None,
    )
    .await;
    assert_eq!(
        (key["limit"].as_u64(), key["remaining"].as_u64()),
        (Some(3), Some(0)),
        "{key}"
    );
    drop(redis);
}
