//! `ratemesh node` as real processes: three nodes on loopback hold one global limit through
//! their HTTP ports, serve `/metrics` and `/health`, drain on SIGTERM; bad node files are
//! refused with the file, the line and the field.

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use ratemesh::node::NodeFile;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_node_processes_hold_one_limit_and_drain_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster(dir.path(), 3);
    // The default wait for a key's owner (100 ms): the bounds below allow for a request
    // denied because its owner answered late.
    for file in &files {
        edit_file(file, |t| t.replace("mesh_max_wait = \"1s\"\n", ""));
    }
    let mut nodes: Vec<NodeProcess> = files.iter().map(|f| start(f)).collect();
    let client = client();
    for node in &nodes {
        wait_healthy(&client, node).await;
    }

    // 600 requests of one client, spread over the three nodes, 12 at a time.
    let mut admitted = 0u64;
    let mut limited = 0u64;
    for round in 0..50 {
        let mut batch = Vec::new();
        for k in 0..12 {
            let node = &nodes[(round + k) % 3];
            let url = format!("http://{}/api/orders", node.http);
            let request = client.get(url).header("x-api-key", "tenant-1");
            batch.push(tokio::spawn(async move { request.send().await }));
        }
        for task in batch {
            let response = task.await.unwrap().unwrap();
            match response.status().as_u16() {
                200 => admitted += 1,
                429 => {
                    limited += 1;
                    assert!(response.headers().contains_key("retry-after"));
                    assert!(response.headers().contains_key("ratelimit-policy"));
                }
                other => panic!("unexpected status {other}"),
            }
        }
    }
    assert_eq!(admitted + limited, 600);
    assert!(admitted <= 300, "admitted {admitted} over the global 300");
    assert!(admitted >= 270, "admitted only {admitted} of the 300");

    // Another client has its own 300.
    let url = format!("http://{}/api/orders", nodes[0].http);
    let other = client
        .get(&url)
        .header("x-api-key", "tenant-2")
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 200);

    let metrics = metrics_of(&client, &nodes[0]).await;
    assert_eq!(metric(&metrics, "ratemesh_peers_up"), 2.0);
    assert_eq!(metric(&metrics, "ratemesh_node_running"), 1.0);
    assert_eq!(metric(&metrics, "ratemesh_majority"), 1.0);
    assert!(metric(&metrics, "ratemesh_gossip_bytes_sent_total") > 0.0);
    assert!(metric(&metrics, "ratemesh_gossip_messages_received_total") > 0.0);
    assert!(metrics.contains("ratemesh_decisions_total{policy=\"global\",outcome=\"allowed\"}"));
    assert!(metrics.contains("ratemesh_gossip_dropped_frames_total"));

    // SIGTERM: the node drains and exits cleanly; the others see a peer go.
    let pid = nodes[2].child.id();
    // SAFETY: signalling our own child process.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) }, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = nodes[2].child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "node did not stop on SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "exit status {status}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = metrics_of(&client, &nodes[0]).await;
        if metric(&text, "ratemesh_peers_up") == 1.0 {
            assert_eq!(metric(&text, "ratemesh_majority"), 1.0);
            break;
        }
        assert!(Instant::now() < deadline, "node 1 still counts 2 peers up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The node handed its keys over as it left: the two others admit a fresh client at once.
    for node in &nodes[..2] {
        let url = format!("http://{}/api/orders", node.http);
        let response = client
            .get(&url)
            .header("x-api-key", "tenant-3")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }
    nodes.truncate(2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_hour_window_admits_fresh_keys_and_holds_a_busy_key_to_its_limit() {
    let dir = tempfile::tempdir().unwrap();
    let text = "env = \"test\"\nkey_secret = \"test-secret\"\ndefault_tier = \"api\"\n\n\
                [policies.hourly]\nalgorithm = \"sliding-window\"\nlimit = 1000\nwindow = \"1h\"\n\
                backend = \"mesh\"\n\n[tiers.api]\npolicies = [\"hourly\"]\n";
    let files = write_cluster_with(dir.path(), 3, text);
    let nodes: Vec<NodeProcess> = files.iter().map(|f| start(f)).collect();
    let client = client();
    for node in &nodes {
        wait_healthy(&client, node).await;
    }

    // 300 fresh keys, 3 requests each, round-robin over the nodes: all far below the limit.
    let mut admitted = 0;
    for chunk in (0..300).collect::<Vec<u32>>().chunks(25) {
        let mut batch = Vec::new();
        for &k in chunk {
            for r in 0..3usize {
                let node = &nodes[(k as usize + r) % 3];
                let url = format!("http://{}/api/orders", node.http);
                let request = client.get(url).header("x-api-key", format!("fresh-{k}"));
                batch.push(tokio::spawn(async move { request.send().await }));
            }
        }
        for task in batch {
            if task.await.unwrap().unwrap().status() == 200 {
                admitted += 1;
            }
        }
    }
    assert_eq!(
        admitted, 900,
        "fresh keys far below their hourly limit were denied"
    );

    // One key sent 1500 times round-robin, 15 at a time: it gets its 1000 for the hour.
    let mut admitted = 0;
    for round in 0..100 {
        let mut batch = Vec::new();
        for k in 0..15 {
            let node = &nodes[(round + k) % 3];
            let url = format!("http://{}/api/orders", node.http);
            let request = client.get(url).header("x-api-key", "busy");
            batch.push(tokio::spawn(async move { request.send().await }));
        }
        for task in batch {
            if task.await.unwrap().unwrap().status() == 200 {
                admitted += 1;
            }
        }
    }
    eprintln!("one key, 1500 requests round-robin: {admitted} admitted");
    assert!(
        (980..=1000).contains(&admitted),
        "one key admitted {admitted} of its hourly 1000"
    );
    // And it is denied on every node afterwards, with a retry time within the hour.
    for node in &nodes {
        assert_eq!(status_of(&client, node, "busy").await, 429);
    }
}

#[test]
fn a_bad_node_file_is_refused_with_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster(dir.path(), 2);
    let good = std::fs::read_to_string(&files[0]).unwrap();
    let check = |text: &str, field: &str, reason: &str| {
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, text).unwrap();
        let error = NodeFile::from_file(&path).unwrap_err();
        assert_eq!(error.field, field, "{error}");
        assert!(error.reason.contains(reason), "{error}");
        assert!(error.file.ends_with("bad.toml"), "{error}");
        // The binary refuses to start with the same message.
        let output = Command::new(BIN)
            .args(["node", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(&error.to_string()), "{stderr}");
        error
    };
    let error = check(&good.replace("id = 1\n", "id = 0\n"), "id", "1 to 2^63 - 1");
    check(
        &good.replace("id = 1\n", "id = 9223372036854775808\n"),
        "id",
        "1 to 2^63 - 1",
    );
    assert_eq!(error.line, 1);
    check(
        &good.replace("listen = \"127.0.0.1:", "listen = \"localhost-"),
        "listen",
        "not an address",
    );
    let error = check(
        &good.replace(
            "gossip_interval = \"20ms\"",
            "gossip_interval = \"20 parsecs\"",
        ),
        "gossip_interval",
        "not a duration",
    );
    assert_eq!(error.line, 4);
    check(
        &good.replace("gossip_interval = \"20ms\"", "gossip_interval = \"1h\""),
        "gossip_interval",
        "between",
    );
    check(
        &good.replace("certs/node-1.key", "certs/missing.key"),
        "tls.key",
        "no file",
    );
    check(
        &good.replace("[[peers]]\nid = 2", "[[peers]]\nid = 1"),
        "peers[0].id",
        "this node",
    );
    check(&format!("speed = 3\n{good}"), "speed", "unknown field");
    check(
        &format!("mesh_max_keys = 0\n{good}"),
        "mesh_max_keys",
        "between 1 and",
    );
    let path = dir.path().join("capped.toml");
    std::fs::write(&path, format!("mesh_max_keys = 5000\n{good}")).unwrap();
    let file = NodeFile::from_file(&path).unwrap();
    assert_eq!(file.node_config().max_keys, 5000);
    assert_eq!(file.node_config().first_credit, 0, "off unless asked for");
    check(
        &format!("mesh_first_credit = -1\n{good}"),
        "mesh_first_credit",
        "between 0 and",
    );
    let path = dir.path().join("credit.toml");
    std::fs::write(&path, format!("mesh_first_credit = 2\n{good}")).unwrap();
    let file = NodeFile::from_file(&path).unwrap();
    assert_eq!(file.node_config().first_credit, 2);
    assert_eq!(file.node_config().max_wait_ns, 1_000_000_000);
    let path = dir.path().join("default-wait.toml");
    let good = good.replace("mesh_max_wait = \"1s\"\n", "");
    std::fs::write(&path, &good).unwrap();
    let file = NodeFile::from_file(&path).unwrap();
    assert_eq!(
        file.node_config().max_wait_ns,
        100_000_000,
        "the default wait"
    );
    check(
        &format!("mesh_max_wait = \"5ms\"\n{good}"),
        "mesh_max_wait",
        "between the gossip interval",
    );
    check(
        &format!("mesh_max_wait = \"2m\"\n{good}"),
        "mesh_max_wait",
        "and 60s",
    );
    let path = dir.path().join("wait.toml");
    std::fs::write(&path, format!("mesh_max_wait = \"1500ms\"\n{good}")).unwrap();
    let file = NodeFile::from_file(&path).unwrap();
    assert_eq!(file.node_config().max_wait_ns, 1_500_000_000);
    check(
        &format!("gossip_budget_bytes_per_s = 10\n{good}"),
        "gossip_budget_bytes_per_s",
        "between 10000 and",
    );
    let path = dir.path().join("budget.toml");
    std::fs::write(
        &path,
        format!("gossip_budget_bytes_per_s = 2000000\n{good}"),
    )
    .unwrap();
    let config = NodeFile::from_file(&path).unwrap().node_config();
    assert_eq!(config.gossip_budget_bytes_per_s, 2_000_000);
    // 40 kB per 20 ms round.
    assert_eq!(config.round_budget_bytes(), 40_000);

    // Another node's certificate: refused at start, naming the field.
    let path = dir.path().join("swapped.toml");
    std::fs::write(&path, good.replace("certs/node-1.", "certs/node-2.")).unwrap();
    let file = NodeFile::from_file(&path).unwrap();
    let error = file.load_tls().unwrap_err();
    assert_eq!(error.field, "tls.cert", "{error}");
    assert!(
        error.reason.contains("not the certificate of node 1"),
        "{error}"
    );

    // The policy file's own errors name the policy file.
    std::fs::write(
        dir.path().join("policies.toml"),
        policies("").replace("token-bucket", "sliding-log").replace(
            "rate = 1\nperiod = \"1m\"\nburst = 300",
            "limit = 300\nwindow = \"1m\"",
        ),
    )
    .unwrap();
    let error = NodeFile::from_file(&files[0]).unwrap_err();
    assert!(error.file.ends_with("policies.toml"), "{error}");
    assert_eq!(error.field, "policies.global.algorithm", "{error}");
}

/// Send `n` requests from `from` (a loopback address), with `api_key` if any; return how
/// many were admitted.
async fn admitted_from(
    node: &NodeProcess,
    from: std::net::IpAddr,
    api_key: Option<&str>,
    n: usize,
) -> usize {
    let client = reqwest::Client::builder()
        .local_address(from)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut admitted = 0;
    for _ in 0..n {
        let mut request = client.get(format!("http://{}/api", node.http));
        if let Some(key) = api_key {
            request = request.header("x-api-key", key);
        }
        let status = request.send().await.unwrap().status();
        assert!(status == 200 || status == 429, "status {status}");
        admitted += usize::from(status == 200);
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_without_a_key_are_limited_by_their_own_address() {
    // A local bucket of 3, by API key, else by the client's address: each address and each
    // key has its own 3 (the node attaches the address only when the rules read it).
    let dir = tempfile::tempdir().unwrap();
    let text = "env = \"test\"\ndefault_tier = \"api\"\n\n[identity]\norder = [\"api_key\", \"ip\"]\n\n\
                [policies.small]\nalgorithm = \"token-bucket\"\nrate = 1\nperiod = \"1h\"\nburst = 3\n\n\
                [tiers.api]\npolicies = [\"small\"]\n";
    let files = write_cluster_with(dir.path(), 1, text);
    let node = start(&files[0]);
    wait_healthy(&client(), &node).await;
    let (one, two) = ("127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap());
    assert_eq!(admitted_from(&node, one, None, 5).await, 3, "127.0.0.1");
    assert_eq!(admitted_from(&node, two, None, 5).await, 3, "127.0.0.2");
    assert_eq!(
        admitted_from(&node, one, Some("key-a"), 5).await,
        3,
        "key-a"
    );
    assert_eq!(
        admitted_from(&node, two, None, 1).await,
        0,
        "127.0.0.2 again"
    );
}
