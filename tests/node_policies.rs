//! Policies that count `by` parts of a request, and `[access]`, on three `ratemesh node`
//! processes: a mesh policy per account header holds its limit across the cluster, a request
//! without the header is refused with 400, a route's cap for everybody counts every client,
//! and addresses forwarded by a trusted proxy are exempt or refused.

mod support;

use support::*;

const POLICIES: &str = "env = \"test\"\nkey_secret = \"test-secret\"\ndefault_tier = \"api\"\n\n\
    [identity]\ntrusted_proxies = [\"127.0.0.1\"]\n\n\
    [access]\nexempt = [\"10.20.0.0/16\"]\ndeny = [\"203.0.113.0/24\"]\n\n\
    [policies.per_account]\nalgorithm = \"fixed-window\"\nlimit = 10\nwindow = \"1h\"\n\
    backend = \"mesh\"\nby = [\"header:x-account\"]\n\n\
    [policies.search_for_everyone]\nalgorithm = \"fixed-window\"\nlimit = 4\nwindow = \"1h\"\n\
    by = []\n\n\
    [tiers.api]\npolicies = [\"per_account\"]\n\n\
    [[routes]]\nname = \"search\"\npath_prefix = \"/search\"\npolicies = [\"search_for_everyone\"]\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_count_by_a_header_across_the_cluster_and_addresses_are_screened() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster_with(dir.path(), 3, POLICIES);
    let nodes: Vec<NodeProcess> = files.iter().map(|f| start(f)).collect();
    let client = client();
    for node in &nodes {
        wait_healthy(&client, node).await;
    }
    let get = |node: &NodeProcess, path: &str| client.get(format!("http://{}{path}", node.http));

    // 30 requests of one account, round-robin over the nodes, from many addresses: the
    // account's 10 for the hour, cluster-wide.
    let mut admitted = 0;
    for i in 0..30usize {
        let response = get(&nodes[i % 3], "/api/orders")
            .header("x-account", "alice")
            .header("x-forwarded-for", format!("192.0.2.{}", i + 1))
            .send()
            .await
            .unwrap();
        match response.status().as_u16() {
            200 => admitted += 1,
            429 => assert!(response.headers().contains_key("retry-after")),
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(admitted, 10, "one account's hourly 10 across three nodes");
    // Another account has its own.
    let response = get(&nodes[1], "/api/orders")
        .header("x-account", "bob")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);

    // No account header: 400, and the body names the part.
    let response = get(&nodes[2], "/api/orders").send().await.unwrap();
    assert_eq!(response.status(), 400);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["part"], "header:x-account");

    // The search route's 4 per node for everybody (a local policy counted by no part).
    let mut admitted = 0;
    for i in 0..8 {
        let response = get(&nodes[0], "/search")
            .header("x-account", format!("searcher-{i}"))
            .send()
            .await
            .unwrap();
        admitted += usize::from(response.status() == 200);
    }
    assert_eq!(admitted, 4, "the route's cap counts every client");

    // Behind the trusted proxy (the test's loopback address): a denied range is refused
    // before any counting, an exempt one is never limited.
    let response = get(&nodes[0], "/api/orders")
        .header("x-account", "carol")
        .header("x-forwarded-for", "203.0.113.9")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 403);
    for _ in 0..15 {
        let response = get(&nodes[1], "/api/orders")
            .header("x-account", "alice")
            .header("x-forwarded-for", "10.20.3.4")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "exempt address limited");
    }
    // Each is counted.
    let text = metrics_of(&client, &nodes[0]).await;
    assert_eq!(
        metric(
            &text,
            "ratemesh_requests_refused_total{reason=\"access_denied\"}"
        ),
        1.0
    );
    let text = metrics_of(&client, &nodes[1]).await;
    assert_eq!(metric(&text, "ratemesh_requests_exempt_total"), 15.0);
}

/// A JWKS rotated on disk is read again by a running node: a token signed with the new key
/// is believed within seconds, with no SIGHUP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_reads_a_rotated_jwks_and_counts_by_the_verified_subject() {
    use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
    let dir = tempfile::tempdir().unwrap();
    let b64url = |bytes: &[u8]| -> String {
        const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut out = String::new();
        for chunk in bytes.chunks(3) {
            let n =
                chunk.iter().fold(0u32, |n, &b| (n << 8) | u32::from(b)) << (8 * (3 - chunk.len()));
            for i in 0..=chunk.len() {
                out.push(ABC[(n >> (18 - 6 * i) & 63) as usize] as char);
            }
        }
        out
    };
    let jwk = |kid: &str, pair: &rcgen::KeyPair| {
        let raw = pair.public_key_raw();
        serde_json::json!({
            "kty": "EC", "crv": "P-256", "kid": kid, "alg": "ES256",
            "x": b64url(&raw[1..33]), "y": b64url(&raw[33..65]),
        })
    };
    let old = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let new = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let jwks = dir.path().join("jwks.json");
    std::fs::write(
        &jwks,
        serde_json::json!({ "keys": [jwk("old", &old)] }).to_string(),
    )
    .unwrap();
    let text = "env = \"test\"\nkey_secret = \"test-secret\"\ndefault_tier = \"api\"\n\n\
        [jwt]\nalgorithms = [\"ES256\"]\njwks_file = \"jwks.json\"\n\n\
        [policies.per_subject]\nalgorithm = \"fixed-window\"\nlimit = 3\nwindow = \"1h\"\n\
        backend = \"mesh\"\nby = [\"jwt:sub\"]\n\n[tiers.api]\npolicies = [\"per_subject\"]\n";
    let files = write_cluster_with(dir.path(), 1, text);
    let node = start(&files[0]);
    let client = client();
    wait_healthy(&client, &node).await;
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 600;
    let token = |kid: &str, pair: &rcgen::KeyPair, sub: &str| {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(kid.to_string());
        let key = EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).unwrap();
        encode(
            &header,
            &serde_json::json!({ "sub": sub, "exp": exp }),
            &key,
        )
        .unwrap()
    };
    let send = |token: String| {
        let request = client
            .get(format!("http://{}/api/orders", node.http))
            .bearer_auth(token);
        async move { request.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(send(token("old", &old, "gina")).await, 200);
    assert_eq!(
        send(token("new", &new, "gina")).await,
        400,
        "kid new unknown"
    );
    std::fs::write(
        &jwks,
        serde_json::json!({ "keys": [jwk("old", &old), jwk("new", &new)] }).to_string(),
    )
    .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while send(token("new", &new, "gina")).await != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "the rotated JWKS was never read"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    // gina: one by the old key, one by the new: her third is her last.
    assert_eq!(send(token("old", &old, "gina")).await, 200);
    assert_eq!(send(token("new", &new, "gina")).await, 429);
    let text = metrics_of(&client, &node).await;
    assert!(
        metric(
            &text,
            "ratemesh_identity_rejected_total{reason=\"unknown_kid\"}"
        ) >= 1.0
    );
    assert_eq!(
        metric(&text, "ratemesh_jwt_key_reloads_total{result=\"applied\"}"),
        1.0
    );
}

/// `count_when` in the node's proxy mode: the upstream's 401s count, its 200s are given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxying_node_counts_failed_logins_by_the_upstreams_status() {
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream_addr = upstream.local_addr().unwrap();
    let app = axum::Router::new().route(
        "/login",
        axum::routing::post(|headers: http::HeaderMap| async move {
            if headers.get("x-password").is_some_and(|p| p == "right") {
                http::StatusCode::OK
            } else {
                http::StatusCode::UNAUTHORIZED
            }
        }),
    );
    let server = tokio::spawn(async move { axum::serve(upstream, app).await.unwrap() });
    let dir = tempfile::tempdir().unwrap();
    let text = "env = \"test\"\nkey_secret = \"test-secret\"\ndefault_tier = \"api\"\n\n\
        [identity]\norder = [\"ip\"]\n\n\
        [policies.per_client]\nalgorithm = \"fixed-window\"\nlimit = 100\nwindow = \"1h\"\n\n\
        [policies.failed_logins]\nalgorithm = \"fixed-window\"\nlimit = 3\nwindow = \"15m\"\n\
        by = [\"ip\"]\ncount_when = { status = [401] }\n\n\
        [tiers.api]\npolicies = [\"per_client\"]\n\n\
        [[routes]]\nname = \"login\"\nmethod = \"POST\"\npath = \"/login\"\npolicies = [\"failed_logins\"]\n";
    let files = write_cluster_with(dir.path(), 1, text);
    edit_file(&files[0], |t| {
        format!("{t}\n[[proxy]]\npath_prefix = \"/\"\nupstream = \"http://{upstream_addr}\"\n")
    });
    let node = start(&files[0]);
    let client = client();
    wait_healthy(&client, &node).await;
    let attempt = |password: &'static str| {
        let request = client
            .post(format!("http://{}/login", node.http))
            .header("x-password", password);
        async move { request.send().await.unwrap().status().as_u16() }
    };
    for _ in 0..5 {
        assert_eq!(attempt("right").await, 200);
    }
    for _ in 0..3 {
        assert_eq!(attempt("wrong").await, 401);
    }
    assert_eq!(
        attempt("right").await,
        429,
        "three failures hold the address back"
    );
    server.abort();
}

/// Login protection by the account a JSON body names, in the node's proxy mode: failed
/// attempts on one account count from any address, the upstream gets the body unchanged,
/// and a body past the route's `max_body_bytes` is 413 and costs nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxying_node_counts_failed_logins_by_the_account_in_the_body() {
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream_addr = upstream.local_addr().unwrap();
    let app = axum::Router::new().route(
        "/login",
        axum::routing::post(|body: String| async move {
            let login: serde_json::Value = match serde_json::from_str(&body) {
                Ok(login) => login,
                Err(_) => return http::StatusCode::BAD_REQUEST,
            };
            if login["password"] == "right" {
                http::StatusCode::OK
            } else {
                http::StatusCode::UNAUTHORIZED
            }
        }),
    );
    let server = tokio::spawn(async move { axum::serve(upstream, app).await.unwrap() });
    let dir = tempfile::tempdir().unwrap();
    let text = "env = \"test\"\nkey_secret = \"test-secret\"\ndefault_tier = \"api\"\n\n\
        [identity]\norder = [\"ip\"]\n\n\
        [policies.per_client]\nalgorithm = \"fixed-window\"\nlimit = 100\nwindow = \"1h\"\n\n\
        [policies.failed_logins_per_account]\nalgorithm = \"fixed-window\"\nlimit = 3\n\
        window = \"15m\"\nby = [\"json:/username\"]\ncount_when = { status = [401] }\n\n\
        [tiers.api]\npolicies = [\"per_client\"]\n\n\
        [[routes]]\nname = \"login\"\nmethod = \"POST\"\npath = \"/login\"\n\
        max_body_bytes = 512\npolicies = [\"failed_logins_per_account\"]\n";
    let files = write_cluster_with(dir.path(), 1, text);
    edit_file(&files[0], |t| {
        format!("{t}\n[[proxy]]\npath_prefix = \"/\"\nupstream = \"http://{upstream_addr}\"\n")
    });
    let node = start(&files[0]);
    let client = client();
    wait_healthy(&client, &node).await;
    let attempt = |body: String| {
        let request = client
            .post(format!("http://{}/login", node.http))
            .header("content-type", "application/json")
            .body(body);
        async move { request.send().await.unwrap().status().as_u16() }
    };
    let login =
        |user: &str, password: &str| format!(r#"{{"username":"{user}","password":"{password}"}}"#);
    // The upstream reads the password from the body the node passed on.
    assert_eq!(attempt(login("alice", "right")).await, 200);
    for _ in 0..3 {
        assert_eq!(attempt(login("alice", "wrong")).await, 401);
    }
    assert_eq!(
        attempt(login("alice", "right")).await,
        429,
        "three failures lock alice's account"
    );
    assert_eq!(
        attempt(login("bob", "right")).await,
        200,
        "bob's is his own"
    );
    let long = format!(r#"{{"username":"bob","pad":"{}"}}"#, "x".repeat(600));
    assert_eq!(attempt(long).await, 413);
    let text = metrics_of(&client, &node).await;
    assert_eq!(
        metric(
            &text,
            "ratemesh_requests_refused_total{reason=\"body_too_large\"}"
        ),
        1.0
    );
    server.abort();
}

/// `cost_from` on a node: a query parameter's page size sets what a search costs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_takes_a_searchs_cost_from_its_page_size() {
    let dir = tempfile::tempdir().unwrap();
    let text = "env = \"test\"\nkey_secret = \"test-secret\"\ndefault_tier = \"api\"\n\n\
        [identity]\norder = [\"ip\"]\n\n\
        [policies.per_client]\nalgorithm = \"fixed-window\"\nlimit = 20\nwindow = \"1h\"\n\n\
        [tiers.api]\npolicies = [\"per_client\"]\n\n\
        [[routes]]\nname = \"search\"\npath = \"/search\"\ncost_from = \"query:page_size\"\n\
        cost_per_unit = 0.1\nmax_cost = 10\n";
    let files = write_cluster_with(dir.path(), 1, text);
    let node = start(&files[0]);
    let client = client();
    wait_healthy(&client, &node).await;
    let search = |page_size: u32| {
        let request = client.get(format!("http://{}/search?page_size={page_size}", node.http));
        async move { request.send().await.unwrap().status().as_u16() }
    };
    // 95 costs 10 (rounded up): two fit in 20, a third does not, nor does one of 1.
    assert_eq!(search(95).await, 200);
    assert_eq!(search(100).await, 200);
    assert_eq!(search(95).await, 429);
    assert_eq!(search(1).await, 429);
}

/// `cost_from = "graphql"` on a node: a query's computed cost is charged, a costlier one than
/// `max_cost` is refused with 400 and counted as such.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_prices_graphql_queries_and_refuses_costly_ones() {
    let dir = tempfile::tempdir().unwrap();
    let text = "env = \"test\"\nkey_secret = \"test-secret\"\ndefault_tier = \"api\"\n\n\
        [identity]\norder = [\"ip\"]\n\n\
        [policies.points]\nalgorithm = \"fixed-window\"\nlimit = 100\nwindow = \"1h\"\n\n\
        [tiers.api]\npolicies = [\"points\"]\n\n\
        [[routes]]\nname = \"graphql\"\npath = \"/graphql\"\ncost_from = \"graphql\"\n\
        max_cost = 60\ngraphql_weights = { search = 5 }\n";
    let files = write_cluster_with(dir.path(), 1, text);
    let node = start(&files[0]);
    let client = client();
    wait_healthy(&client, &node).await;
    let ask = |query: &str| {
        let request = client
            .post(format!("http://{}/graphql", node.http))
            .json(&serde_json::json!({ "query": query }));
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.json::<serde_json::Value>().await.ok())
        }
    };
    // search (5) + 10 × title: 15 each, six of them in the 100.
    for _ in 0..6 {
        assert_eq!(ask("{ search(first: 10) { title } }").await.0, 200);
    }
    // 90 spent: a query of 15 does not fit.
    assert_eq!(ask("{ search(first: 10) { title } }").await.0, 429);
    let (status, body) = ask("{ search(first: 100) { title } }").await;
    assert_eq!(status, 400);
    assert_eq!(body.unwrap()["cost"], 105);
    let text = metrics_of(&client, &node).await;
    assert_eq!(
        metric(
            &text,
            "ratemesh_requests_refused_total{reason=\"graphql_too_costly\"}"
        ),
        1.0
    );
}

/// A plans file of a million API keys beside the policy file: a `ratemesh node` gives each
/// key its tier, and an unknown key the default; SIGHUP reads a changed plans file and keeps
/// every counter of the policies that did not change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_takes_plans_for_a_million_api_keys_and_reloads_them_keeping_counters() {
    use ratemesh::ids::KeyHasher;
    let dir = tempfile::tempdir().unwrap();
    let policies = "env = \"test\"\nkey_secret = \"test-secret\"\ndefault_tier = \"free\"\n\
        plans_file = \"plans.csv\"\n\n\
        [policies.free_hourly]\nalgorithm = \"fixed-window\"\nlimit = 2\nwindow = \"1h\"\n\n\
        [policies.pro_hourly]\nalgorithm = \"fixed-window\"\nlimit = 5\nwindow = \"1h\"\n\n\
        [tiers.free]\npolicies = [\"free_hourly\"]\n\n[tiers.pro]\npolicies = [\"pro_hourly\"]\n";
    let files = write_cluster_with(dir.path(), 1, policies);
    let hasher = KeyHasher::from_secret("test-secret");
    let plans = |moved_tier: &str| {
        let mut text = String::with_capacity(32 << 20);
        for i in 0..999_998u32 {
            let tier = if i % 3 == 0 { "pro" } else { "free" };
            let key = format!("sk_customer_{i}");
            text.push_str(&format!(
                "{},{tier}\n",
                hasher.label("api_key", key.as_bytes())
            ));
        }
        text.push_str(&format!("{},pro\n", hasher.label("api_key", b"sk_pro")));
        text.push_str(&format!(
            "{},{moved_tier}\n",
            hasher.label("api_key", b"sk_moves")
        ));
        std::fs::write(dir.path().join("plans.csv"), text).unwrap();
    };
    plans("free");
    let node = start(&files[0]);
    let client = client();
    wait_healthy(&client, &node).await;
    let text = metrics_of(&client, &node).await;
    assert_eq!(metric(&text, "ratemesh_plan_keys"), 1_000_000.0);
    let admitted = |key: &'static str, n: usize| {
        let client = client.clone();
        let node = &node;
        async move {
            let mut admitted = 0;
            for _ in 0..n {
                admitted += usize::from(status_of(&client, node, key).await == 200);
            }
            admitted
        }
    };
    assert_eq!(admitted("sk_pro", 7).await, 5, "pro: 5 an hour");
    assert_eq!(admitted("sk_customer_3", 7).await, 5, "pro: 5 an hour");
    assert_eq!(admitted("sk_customer_4", 7).await, 2, "free: 2 an hour");
    assert_eq!(admitted("sk_moves", 7).await, 2, "free: 2 an hour");
    assert_eq!(admitted("sk_unknown", 7).await, 2, "the default tier");
    let rss = rss_kib(node.child.id()).unwrap();

    // `sk_moves` goes pro: after SIGHUP it has the pro policy's 5; every counter stays.
    plans("pro");
    signal(&node, libc::SIGHUP);
    wait_metric_line(
        &client,
        &node,
        "ratemesh_config_reloads_total{result=\"applied\"} 1",
    )
    .await;
    assert_eq!(admitted("sk_moves", 7).await, 5, "now pro");
    assert_eq!(admitted("sk_pro", 3).await, 0, "its count was kept");
    assert_eq!(admitted("sk_unknown", 3).await, 0, "its count was kept");
    eprintln!(
        "a million keys: RSS {rss} KiB after start, {} KiB after a reload",
        rss_kib(node.child.id()).unwrap()
    );
}
