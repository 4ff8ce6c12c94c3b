//! A mesh policy's limit changed live on real nodes: SIGHUP applies it without a restart,
//! the nodes report that their configurations differ while the change rolls out, and the
//! lowest limit holds until every node runs the new one.

mod support;

use std::time::{Duration, Instant};

use support::*;

/// One mesh policy: `limit` per day for each client (about a day, with at least half of it
/// left, so no window ends mid-test).
fn file(limit: u64) -> String {
    with_room(&format!(
        "env = \"test\"\nkey_secret = \"test-secret\"\ndefault_tier = \"api\"\n\n\
         [policies.global]\nalgorithm = \"fixed-window\"\nlimit = {limit}\nwindow = \"1d\"\n\
         backend = \"mesh\"\n\n[tiers.api]\npolicies = [\"global\"]\n"
    ))
}

/// Clients enough that each node owns some of their keys.
const CLIENTS: usize = 12;

/// Send `count` requests of each client, one node after the other; return how many of
/// each got a 200.
async fn admitted(client: &reqwest::Client, nodes: &[NodeProcess], count: usize) -> Vec<usize> {
    let mut ok = vec![0; CLIENTS];
    for i in 0..count {
        for (c, ok) in ok.iter_mut().enumerate() {
            let node = &nodes[(i + c) % nodes.len()];
            if status_of(client, node, &format!("client-{c}")).await == 200 {
                *ok += 1;
            }
        }
    }
    ok
}

/// Wait until `node`'s metric `name` reads `value`.
async fn wait_metric(client: &reqwest::Client, node: &NodeProcess, name: &str, value: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = metrics_of(client, node).await;
        if metric(&text, name) == value {
            return;
        }
        assert!(Instant::now() < deadline, "{name} never {value}:\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_changed_by_sighup_applies_cluster_wide_once_every_node_runs_it() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster_with(dir.path(), 3, &file(100));
    // Each node reads its own copy of the policy file, so they can change one at a time.
    for (i, f) in files.iter().enumerate() {
        let own = format!("policies-{}.toml", i + 1);
        std::fs::write(dir.path().join(&own), file(100)).unwrap();
        edit_file(f, |text| {
            text.replace("\"policies.toml\"", &format!("\"{own}\""))
        });
    }
    let nodes: Vec<NodeProcess> = files.iter().map(|f| start(f)).collect();
    let client = client();
    for node in &nodes {
        wait_healthy(&client, node).await;
    }
    assert_eq!(admitted(&client, &nodes, 150).await, [100; CLIENTS]);

    // Node 1 runs 300 a day; nodes 2 and 3 still 100: reported, and the lower limit holds.
    std::fs::write(dir.path().join("policies-1.toml"), file(300)).unwrap();
    signal(&nodes[0], libc::SIGHUP);
    wait_metric_line(
        &client,
        &nodes[0],
        "ratemesh_config_reloads_total{result=\"applied\"} 1",
    )
    .await;
    wait_metric(&client, &nodes[0], "ratemesh_config_mismatch", 2.0).await;
    wait_metric(&client, &nodes[1], "ratemesh_config_mismatch", 1.0).await;
    assert_eq!(admitted(&client, &nodes, 60).await, [0; CLIENTS]);

    // Every node runs it: the new limit, counting what the day admitted already.
    for i in [1, 2] {
        std::fs::write(
            dir.path().join(format!("policies-{}.toml", i + 1)),
            file(300),
        )
        .unwrap();
        signal(&nodes[i], libc::SIGHUP);
    }
    for node in &nodes {
        wait_metric(&client, node, "ratemesh_config_mismatch", 0.0).await;
    }
    let more = admitted(&client, &nodes, 260).await;
    assert!(
        more.iter().all(|&n| (195..=200).contains(&n)),
        "{more:?} admitted of the 200 each the raise allows"
    );
    assert_eq!(admitted(&client, &nodes, 30).await, [0; CLIENTS]);
}
