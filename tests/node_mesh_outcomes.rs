//! Several `mesh` policies on one request, on three `ratemesh node` processes: failed logins
//! counted per account (from the JSON body) and per address, both cluster-wide, by the
//! response's status (`count_when`). A successful login gives its tokens back to the mesh;
//! a request denied by one policy gives back what the other took, so an attacker's 429s on
//! one key never charge another.

mod support;

use support::login;
use support::*;

/// What both files begin with: every client is its address, forwarded by the test.
const HEAD: &str = r#"
env = "test"
key_secret = "test-secret"
allow_unlimited = true

[identity]
order = ["ip"]
trusted_proxies = ["127.0.0.1"]
"#;

const POLICIES: &str = r#"
# 20 failed logins per address (a token bucket that refills one an hour).
[policies.failed_logins_per_address]
algorithm = "token-bucket"
rate = 1
period = "1h"
burst = 20
backend = "mesh"
by = ["ip"]
count_when = { status = [401, 403] }

# 5 failed logins per account in an hour.
[policies.failed_logins_per_account]
algorithm = "fixed-window"
limit = 5
window = "1h"
backend = "mesh"
by = ["json:/username"]
count_when = { status = [401, 403] }

[[routes]]
name = "login"
method = "POST"
path = "/login"
max_body_bytes = 4096
policies = ["failed_logins_per_address", "failed_logins_per_account"]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_mesh_policies_count_failed_logins_and_give_back_what_they_do_not_count() {
    let (upstream, server) = login::password_checker().await;
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster_with(dir.path(), 3, &format!("{HEAD}{POLICIES}"));
    for file in &files {
        edit_file(file, |t| {
            format!("{t}\n[[proxy]]\npath_prefix = \"/\"\nupstream = \"http://{upstream}\"\n")
        });
    }
    let nodes: Vec<NodeProcess> = files.iter().map(|f| start(f)).collect();
    let client = client();
    for node in &nodes {
        wait_healthy(&client, node).await;
    }
    let attempt = async |node: &NodeProcess, from: &str, user: &str, password: &str| {
        login::attempt(&client, node, from, user, password).await.0
    };
    // Successful logins cost nothing: alice logs in 30 times from one address, over the
    // three nodes (each took a token of both policies and gave it back).
    for i in 0..30 {
        let status = attempt(&nodes[i % 3], "192.0.2.10", "alice", "right").await;
        assert_eq!(status, 200, "login {i}");
    }
    // Five failures on bob's account, from five addresses: the account is over.
    for i in 0..5 {
        let from = format!("203.0.113.{}", 20 + i);
        assert_eq!(attempt(&nodes[i % 3], &from, "bob", "guess").await, 401);
    }
    // An address tries bob's account 10 times more: each is denied by the account's
    // policy, after the address's policy took a token, which goes back.
    for i in 0..10 {
        let status = attempt(&nodes[i % 3], "198.51.100.7", "bob", "guess").await;
        assert_eq!(status, 429, "bob's account is over (attempt {i})");
    }
    // So that address still has all of its 20 failures, then it is over: the 21st is
    // denied, even for an account with room.
    for i in 0..20 {
        let user = format!("user{i}");
        let status = attempt(&nodes[i % 3], "198.51.100.7", &user, "guess").await;
        assert_eq!(status, 401, "failure {i} of the address");
    }
    assert_eq!(
        attempt(&nodes[0], "198.51.100.7", "carol", "right").await,
        429,
        "the address is over"
    );
    // Its denials charged no account: carol, from her own address, logs in, and has her 5
    // failures.
    assert_eq!(
        attempt(&nodes[1], "192.0.2.31", "carol", "right").await,
        200
    );
    for i in 0..5 {
        assert_eq!(
            attempt(&nodes[i % 3], "192.0.2.31", "carol", "guess").await,
            401
        );
    }
    assert_eq!(
        attempt(&nodes[2], "192.0.2.31", "carol", "guess").await,
        429
    );
    // What went back, counted on the nodes.
    let mut returned = 0.0;
    for node in &nodes {
        let text = metrics_of(&client, node).await;
        returned += text
            .lines()
            .filter(|l| {
                l.starts_with("ratemesh_mesh_refunds_total{") && l.contains("result=\"returned\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
    }
    // 30 successful logins × 2 policies, 10 address charges given back, 1 of carol's.
    assert!(returned >= 71.0, "{returned} charges went back");
    server.abort();
}

const LOCKOUT: &str = r#"
# 3 failed logins per account in 2 seconds; the 4th locks the account out for 2 minutes.
[policies.failed_logins_per_account]
algorithm = "fixed-window"
limit = 3
window = "2s"
backend = "mesh"
by = ["json:/username"]
count_when = { status = [401, 403] }
block_for = "2m"

[[routes]]
name = "login"
method = "POST"
path = "/login"
max_body_bytes = 4096
policies = ["failed_logins_per_account"]
"#;

/// Wait until every node serves and counts three live members.
async fn wait_three(client: &reqwest::Client, nodes: &[NodeProcess]) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    for node in nodes {
        loop {
            let body: serde_json::Value = match client
                .get(format!("http://{}/health", node.http))
                .send()
                .await
            {
                Ok(r) if r.status() == 200 => r.json().await.unwrap_or_default(),
                _ => serde_json::Value::Null,
            };
            if body["members"] == 3 {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "never 3 members");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mesh_lockout_holds_on_every_node_and_through_each_nodes_restart() {
    let (upstream, server) = login::password_checker().await;
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster_with(dir.path(), 3, &format!("{HEAD}{LOCKOUT}"));
    for file in &files {
        edit_file(file, |t| {
            format!("{t}\n[[proxy]]\npath_prefix = \"/\"\nupstream = \"http://{upstream}\"\n")
        });
    }
    let mut nodes: Vec<NodeProcess> = files.iter().map(|f| start(f)).collect();
    let client = client();
    wait_three(&client, &nodes).await;
    // Three failures on dave's account, then the fourth attempt is denied: locked out.
    let mut locked = None;
    for i in 0..6 {
        let (status, retry) =
            login::attempt(&client, &nodes[i % 3], "192.0.2.40", "dave", "guess").await;
        if status == 429 {
            locked = Some((std::time::Instant::now(), retry.expect("a Retry-After")));
            break;
        }
        assert_eq!(status, 401, "failure {i}");
    }
    let (at, first) = locked.expect("dave's account was never denied");
    assert!(
        (110..=120).contains(&first),
        "Retry-After {first} of a 2m lockout"
    );
    // Every node denies dave for the rest of the lockout, his right password too, and
    // says until when; each node's crash and restart keeps it.
    let check = async |nodes: &[NodeProcess], when: &str| {
        for (n, node) in nodes.iter().enumerate() {
            let (status, retry) =
                login::attempt(&client, node, "192.0.2.40", "dave", "right").await;
            assert_eq!(status, 429, "node {} {when}", n + 1);
            let retry = retry.expect("a Retry-After");
            let left = first.saturating_sub(at.elapsed().as_secs());
            assert!(
                retry + 2 >= left && retry <= first,
                "node {} {when}: Retry-After {retry}, {left} s left",
                n + 1
            );
        }
    };
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    check(&nodes, "after the window").await;
    for i in 0..3 {
        signal(&nodes[i], libc::SIGKILL);
        exit_of(&mut nodes[i], std::time::Duration::from_secs(10)).await;
        nodes[i] = start(&files[i]);
        wait_three(&client, &nodes).await;
        check(&nodes, &format!("after node {} restarted", i + 1)).await;
    }
    // Other accounts are not locked out.
    let (status, _) = login::attempt(&client, &nodes[0], "192.0.2.41", "erin", "right").await;
    assert_eq!(status, 200);
    server.abort();
}
