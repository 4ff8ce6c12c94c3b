//! Quotas that survive a restart of every node: a three-node cluster of `ratemesh node`s
//! uses part of a daily quota, all three are killed at once (SIGKILL: no drain) and started
//! again, and the quota's remaining count is back (from each node's `[state]` snapshots).
//! A minute's window is not saved.

mod support;

use std::time::Duration;

use support::*;

const POLICIES: &str = "env = \"test\"\nkey_secret = \"test-secret\"\ndefault_tier = \"api\"\n\n\
    [identity]\norder = [\"api_key\", \"ip\"]\napi_key_header = \"x-api-key\"\n\n\
    [policies.daily]\nalgorithm = \"fixed-window\"\nlimit = 20\nwindow = \"1d\"\n\
    backend = \"mesh\"\n\n\
    [tiers.api]\npolicies = [\"daily\"]\n";

async fn admitted(client: &reqwest::Client, nodes: &[NodeProcess], key: &str, n: usize) -> usize {
    let mut ok = 0;
    for i in 0..n {
        let status = client
            .get(format!("http://{}/", nodes[i % nodes.len()].http))
            .header("x-api-key", key)
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
async fn a_daily_quota_survives_every_node_killed_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster_with(dir.path(), 3, POLICIES);
    for file in &files {
        edit_file(file, |t| {
            format!("{t}\n[state]\nsnapshot_interval = \"200ms\"\n")
        });
    }
    let mut nodes: Vec<NodeProcess> = files.iter().map(|f| start(f)).collect();
    let client = client();
    for node in &nodes {
        wait_healthy(&client, node).await;
    }
    assert_eq!(admitted(&client, &nodes, "sk_daily", 12).await, 12);
    // The holders give back what they did not spend once idle (what a node holds when it
    // dies counts as spent), and the owner writes its count.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let written: f64 = {
        let mut sum = 0.0;
        for node in &nodes {
            // A node that keeps nothing of the key writes nothing (no such series).
            let text = metrics_of(&client, node).await;
            if text
                .lines()
                .any(|l| l.starts_with("ratemesh_snapshot_keys_written_total "))
            {
                sum += metric(&text, "ratemesh_snapshot_keys_written_total");
            }
        }
        sum
    };
    assert!(
        written >= 2.0,
        "owner and successor wrote the key: {written}"
    );
    for node in &nodes {
        signal(node, libc::SIGKILL);
    }
    for node in &mut nodes {
        exit_of(node, Duration::from_secs(10)).await;
    }
    nodes = files.iter().map(|f| start(f)).collect();
    for node in &nodes {
        wait_healthy(&client, node).await;
    }
    // 12 of the day's 20 were used: 8 more, not 20.
    assert_eq!(admitted(&client, &nodes, "sk_daily", 15).await, 8);
    // Another key's day starts afresh.
    assert_eq!(admitted(&client, &nodes, "sk_other", 21).await, 20);
}

#[test]
fn bad_state_tables_are_refused_with_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster_with(dir.path(), 1, POLICIES);
    let text = std::fs::read_to_string(&files[0]).unwrap();
    for (table, field, says) in [
        (
            "snapshot_interval = \"10ms\"\n",
            "state.snapshot_interval",
            "between 100ms and 1h",
        ),
        (
            "snapshot_interval = \"often\"\n",
            "state.snapshot_interval",
            "often",
        ),
        ("every = \"1s\"\n", "state", "unknown field"),
    ] {
        let with = format!("{text}\n[state]\n{table}");
        let error = ratemesh::node::NodeFile::from_toml_str(&with, &files[0]).unwrap_err();
        assert!(error.field.starts_with(field), "{error}");
        assert!(error.reason.contains(says), "{error}");
        assert!(error.line > 1, "{error}");
    }
    // Without [state]: state/node-ID beside the node file, written every second.
    let file = ratemesh::node::NodeFile::from_toml_str(&text, &files[0]).unwrap();
    assert_eq!(file.state.dir, dir.path().join("state/node-1"));
    assert_eq!(file.state.snapshot_interval, Duration::from_secs(1));
}
