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
