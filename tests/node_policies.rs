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
