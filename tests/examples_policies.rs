//! The policy files in `examples/policies/`, run as an operator would: on three `ratemesh
//! node` processes (mesh policies per plan, Redis policies for a route's cap and for login
//! protection), and login protection also through the tower layer. Each file is used as
//! written, except that rates per second become rates per hour (so that what a test admits
//! does not depend on how fast it runs), and with the test's own redis-server and trusted
//! proxy.

mod support;

#[path = "support/redis_server.rs"]
mod redis_server;

use std::path::Path;

use support::login;
use support::*;

const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/policies");

/// The example `name`, its rates per second made per hour, written as `policies.toml` in
/// `dir`, with `edit` applied.
fn example(name: &str, edit: impl FnOnce(String) -> String) -> String {
    let text = std::fs::read_to_string(Path::new(EXAMPLES).join(name)).unwrap();
    let hourly = text
        .replace("period = \"1s\"", "period = \"1h\"")
        .replace("window = \"1s\"", "window = \"1h\"");
    assert_ne!(hourly, text, "{name} has rates per second");
    edit(hourly)
}

/// Send `n` requests from `send(i)` round-robin over the nodes; count the statuses.
async fn count(n: usize, send: impl AsyncFn(usize) -> u16) -> (usize, usize, Vec<u16>) {
    let (mut ok, mut limited, mut other) = (0, 0, Vec::new());
    for i in 0..n {
        match send(i).await {
            200 => ok += 1,
            429 => limited += 1,
            status => other.push(status),
        }
    }
    (ok, limited, other)
}

#[test]
fn every_example_policy_file_loads() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("plans.csv"), "").unwrap();
    std::fs::write(dir.path().join("jwt.secret"), "x".repeat(40)).unwrap();
    let mut seen = 0;
    for entry in std::fs::read_dir(EXAMPLES).unwrap() {
        let path = entry.unwrap().path();
        let copy = dir.path().join(path.file_name().unwrap());
        std::fs::copy(&path, &copy).unwrap();
        if let Err(error) = ratemesh::config::GatewayConfig::from_file(&copy) {
            panic!("{}: {error}", path.display());
        }
        seen += 1;
    }
    assert_eq!(seen, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_by_api_key_and_a_route_cap_hold_across_three_nodes() {
    let Some(redis) = redis_server::RedisServer::start("example-plans") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // The search route's 1,000 a second for everybody, made 6 an hour for the test.
    let text = example("plans_by_api_key.toml", |t| {
        t.replace("limit = 1000", "limit = 6")
            .replace("redis://127.0.0.1:6379", &redis.url())
    });
    std::fs::write(dir.path().join("plans.csv"), "").unwrap();
    let files = write_cluster_with(dir.path(), 3, &text);
    // The plans file, from a billing export, as the docs say.
    let plans = {
        use std::io::Write;
        let mut child = std::process::Command::new(BIN)
            .args(["hash-key", "--plans", "--config"])
            .arg(dir.path().join("policies.toml"))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"sk_pro_acme,pro\nsk_free_bob,free\n")
            .unwrap();
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success());
        String::from_utf8(output.stdout).unwrap()
    };
    assert!(!plans.contains("sk_"), "keys never in clear: {plans}");
    std::fs::write(dir.path().join("plans.csv"), plans).unwrap();
    let nodes: Vec<NodeProcess> = files.iter().map(|f| start(f)).collect();
    let client = client();
    for node in &nodes {
        wait_healthy(&client, node).await;
    }
    let send = |path: &'static str, key: &'static str| {
        let (client, nodes) = (&client, &nodes);
        async move |i: usize| {
            let request = client.get(format!("http://{}{path}", nodes[i % 3].http));
            let request = if key.is_empty() {
                request
            } else {
                request.header("x-api-key", key)
            };
            request.send().await.unwrap().status().as_u16()
        }
    };
    // A free key: its 10, over the three nodes; a key the file does not list is free too.
    for key in ["sk_free_bob", "sk_nobody_knows"] {
        let (ok, limited, other) = count(30, send("/orders", key)).await;
        assert_eq!((ok, limited, other), (10, 20, vec![]), "{key}");
    }
    // A pro key: 30 of 30 (its limit is 100).
    let (ok, _, _) = count(30, send("/orders", "sk_pro_acme")).await;
    assert_eq!(ok, 30);
    // The search route's cap counts every client: 6 of 8 clients' requests, beside each
    // client's own limit.
    let keys = [
        "k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7", //
    ];
    let mut ok = 0;
    for (i, key) in keys.iter().enumerate() {
        ok += usize::from(send("/search", key)(i).await == 200);
    }
    assert_eq!(ok, 6, "the route's cap for everybody");
    let text = metrics_of(&client, &nodes[0]).await;
    assert_eq!(metric(&text, "ratemesh_plan_keys"), 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_by_a_verified_jwt_claim_hold_across_three_nodes() {
    use jsonwebtoken::{EncodingKey, Header, encode};
    let dir = tempfile::tempdir().unwrap();
    let secret = b"a-secret-of-at-least-thirty-two-bytes-for-hs256";
    std::fs::write(dir.path().join("jwt.secret"), secret).unwrap();
    let files = write_cluster_with(dir.path(), 3, &example("plans_by_jwt.toml", |t| t));
    let nodes: Vec<NodeProcess> = files.iter().map(|f| start(f)).collect();
    let client = client();
    for node in &nodes {
        wait_healthy(&client, node).await;
    }
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 600;
    let token = |sub: &str, plan: &str, iss: &str, key: &[u8]| {
        let claims = serde_json::json!({ "sub": sub, "plan": plan, "iss": iss, "exp": exp });
        encode(&Header::default(), &claims, &EncodingKey::from_secret(key)).unwrap()
    };
    let issuer = "https://id.example.com/";
    let send = |token: String| {
        let (client, nodes) = (&client, &nodes);
        async move |i: usize| {
            let request = client
                .get(format!("http://{}/orders", nodes[i % 3].http))
                .bearer_auth(&token);
            request.send().await.unwrap().status().as_u16()
        }
    };
    // A free subject: 10 of 30 over the three nodes; a pro one: 30 of 30.
    let (ok, limited, other) = count(30, send(token("alice", "free", issuer, secret))).await;
    assert_eq!((ok, limited, other), (10, 20, vec![]));
    let (ok, _, other) = count(30, send(token("bob", "pro", issuer, secret))).await;
    assert_eq!((ok, other), (30, vec![]));
    // A token of another issuer, or signed with another secret, names no subject: 400.
    let other_issuer = token("carol", "pro", "https://evil.example/", secret);
    let forged = token(
        "carol",
        "pro",
        issuer,
        b"not-the-secret-but-just-as-long-as-it",
    );
    for bad in [other_issuer, forged] {
        let (_, _, other) = count(3, send(bad)).await;
        assert_eq!(other, vec![400, 400, 400]);
    }
    // Without a token: 400 too.
    let response = client
        .get(format!("http://{}/orders", nodes[0].http))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_protection_counts_failures_in_redis_across_three_nodes_and_a_restart() {
    let Some(redis) = redis_server::RedisServer::start("example-login") else {
        return;
    };
    let text = example("login_protection.toml", |t| {
        t.replace("redis://127.0.0.1:6379", &redis.url()).replace(
            "# trusted_proxies = [\"10.0.0.0/8\"]",
            "trusted_proxies = [\"127.0.0.1\"]",
        )
    });
    login_protection_on_three_nodes(&text).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_protection_on_the_mesh_counts_failures_across_three_nodes_and_a_restart() {
    let text = example("login_protection_mesh.toml", |t| {
        t.replace(
            "# trusted_proxies = [\"10.0.0.0/8\"]",
            "trusted_proxies = [\"127.0.0.1\"]",
        )
    });
    login_protection_on_three_nodes(&text).await;
}

/// A login protection file (`text`) on three nodes proxying `/login`: successes cost
/// nothing, an address's 20 failures and an account's 5 lock each out for 15 minutes on every
/// node and through a node's restart, and charge nobody else.
async fn login_protection_on_three_nodes(text: &str) {
    let (upstream, server) = login::password_checker().await;
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster_with(dir.path(), 3, text);
    for file in &files {
        edit_file(file, |t| {
            format!("{t}\n[[proxy]]\npath_prefix = \"/\"\nupstream = \"http://{upstream}\"\n")
        });
    }
    let mut nodes: Vec<NodeProcess> = files.iter().map(|f| start(f)).collect();
    let client = client();
    for node in &nodes {
        wait_healthy(&client, node).await;
    }
    let attempt = async |node: &NodeProcess, from: &str, user: &str, password: &str| {
        login::attempt(&client, node, from, user, password).await
    };
    // Successful logins cost nothing: alice logs in 30 times.
    for i in 0..30 {
        let (status, _) = attempt(&nodes[i % 3], "192.0.2.10", "alice", "right").await;
        assert_eq!(status, 200, "login {i}");
    }
    // One address tries 20 accounts with wrong passwords, over the three nodes: its 20
    // failures, then it is locked out, even with a right password.
    for i in 0..20 {
        let user = format!("user{i}");
        let (status, _) = attempt(&nodes[i % 3], "198.51.100.7", &user, "guess").await;
        assert_eq!(status, 401, "attempt {i}");
    }
    let (status, retry) = attempt(&nodes[0], "198.51.100.7", "alice", "right").await;
    assert_eq!(
        (status, retry),
        (429, Some(900)),
        "the address is locked out"
    );
    // Alice, from her address, is not: the attacker's 429 did not charge her account.
    assert_eq!(
        attempt(&nodes[1], "192.0.2.10", "alice", "right").await.0,
        200
    );
    // Five failures on bob's account from five addresses lock the account (and only it).
    for i in 0..5 {
        let from = format!("203.0.113.{}", 20 + i);
        assert_eq!(attempt(&nodes[i % 3], &from, "bob", "guess").await.0, 401);
    }
    let (status, retry) = attempt(&nodes[2], "192.0.2.30", "bob", "right").await;
    assert_eq!(status, 429, "bob's account is locked out");
    assert!(retry.is_some_and(|s| (890..=900).contains(&s)), "{retry:?}");
    assert_eq!(
        attempt(&nodes[2], "192.0.2.31", "carol", "right").await.0,
        200
    );
    // The lockout outlives any node: a node started afresh sees it (kept in Redis, or by
    // the key's owner and successor on the mesh).
    nodes.remove(0);
    let restarted = start(&files[0]);
    wait_healthy(&client, &restarted).await;
    let (status, _) = attempt(&restarted, "192.0.2.30", "bob", "right").await;
    assert_eq!(status, 429, "the lockout outlives the node");
    assert_eq!(
        attempt(&restarted, "192.0.2.10", "alice", "right").await.0,
        200
    );
    server.abort();
}

#[tokio::test]
async fn login_protection_works_the_same_through_the_tower_layer() {
    use std::net::SocketAddr;
    use tower::ServiceExt;
    let Some(redis) = redis_server::RedisServer::start("example-login-layer") else {
        return;
    };
    let text = example("login_protection.toml", |t| {
        t.replace("redis://127.0.0.1:6379", &redis.url())
    });
    let config = ratemesh::config::GatewayConfig::from_toml_str(&text, "policies.toml").unwrap();
    let layer = ratemesh::http::RateLimitLayer::new(config).unwrap();
    let app = login::login_service().layer(layer);
    let attempt = async |from: &str, user: &str, password: &str| {
        let mut request = http::Request::post("/login")
            .header("content-type", "application/json")
            .body(axum::body::Body::from(login::body(user, password)))
            .unwrap();
        let peer: SocketAddr = format!("{from}:4000").parse().unwrap();
        request
            .extensions_mut()
            .insert(ratemesh::http::ClientAddr(peer));
        let response = app.clone().oneshot(request).await.unwrap();
        response.status().as_u16()
    };
    for _ in 0..10 {
        assert_eq!(attempt("192.0.2.10", "alice", "right").await, 200);
    }
    for i in 0..5 {
        let from = format!("203.0.113.{}", 20 + i);
        assert_eq!(attempt(&from, "bob", "guess").await, 401);
    }
    assert_eq!(attempt("192.0.2.30", "bob", "right").await, 429);
    assert_eq!(attempt("192.0.2.10", "alice", "right").await, 200);
    // A body that is not JSON names no account: 400, and nothing is counted.
    let mut request = http::Request::post("/login")
        .body(axum::body::Body::from("username=alice"))
        .unwrap();
    request.extensions_mut().insert(ratemesh::http::ClientAddr(
        "192.0.2.10:4000".parse().unwrap(),
    ));
    let response = app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), 400);
}
