//! The admin API's overrides on a three-node cluster of `ratemesh node`s: a mesh key and a
//! local key given limits of their own, enforced on every node; a node stopped (SIGSTOP)
//! while one is set takes it from a peer once it runs again; every node stopped and started
//! again keeps them (`state_dir`); a removal; bad calls; `ratemesh ctl overrides`.

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::*;

const TOKEN: &str = "support-0123456789abcdef0123456789abcdef";

const POLICIES: &str = "env = \"test\"\nkey_secret = \"test-secret\"\ndefault_tier = \"api\"\n\n\
    [identity]\norder = [\"api_key\", \"ip\"]\napi_key_header = \"x-api-key\"\n\n\
    [policies.per_key]\nalgorithm = \"fixed-window\"\nlimit = 5\nwindow = \"1h\"\n\
    backend = \"mesh\"\n\n\
    [policies.per_account]\nalgorithm = \"fixed-window\"\nlimit = 3\nwindow = \"1h\"\n\
    by = [\"header:x-account\"]\n\n\
    [tiers.api]\npolicies = [\"per_key\", \"per_account\"]\n";

async fn call(
    client: &reqwest::Client,
    admin: std::net::SocketAddr,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    admin_call(client, admin, TOKEN, method, path, body).await
}

/// Requests with `api_key` (a fresh account each, or `account`) round `nodes`: admitted.
async fn admitted(
    client: &reqwest::Client,
    nodes: &[&NodeProcess],
    api_key: &dyn Fn(usize) -> String,
    account: &dyn Fn(usize) -> String,
    n: usize,
) -> usize {
    let mut ok = 0;
    for i in 0..n {
        let status = client
            .get(format!("http://{}/orders", nodes[i % nodes.len()].http))
            .header("x-api-key", api_key(i))
            .header("x-account", account(i))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16();
        ok += usize::from(status == 200);
    }
    ok
}

/// The RFC 3339 instant `days` days from now, at midnight UTC.
fn in_days(days: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = (now / 86_400 + days) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T00:00:00Z")
}

fn listed(v: &Value) -> Vec<(String, u64)> {
    v["overrides"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            (
                o["policy"].as_str().unwrap().to_string(),
                o["limit"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_reach_every_node_and_survive_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster_with(dir.path(), 3, POLICIES);
    let admins = add_admin(dir.path(), &files, |_| true, TOKEN);
    let mut nodes: Vec<NodeProcess> = files.iter().map(|f| start(f)).collect();
    let client = client();
    for node in &nodes {
        wait_healthy(&client, node).await;
    }
    let admin = admins[0];

    // A mesh key raised from 5 to 8, a local key from 3 to 6, for an hour.
    let (status, set) = call(
        &client,
        admin,
        reqwest::Method::PUT,
        "/v1/overrides",
        Some(json!({"policy": "per_key", "attributes": {"api_key": "sk_vip"}, "limit": 8, "for": "1h", "reason": "launch day"})),
    )
    .await;
    assert_eq!(status, 200, "{set}");
    assert_eq!(set["nodes"], json!([1, 2, 3]), "{set}");
    assert_eq!(set["by"], "support");
    let (status, set) = call(
        &client,
        admin,
        reqwest::Method::PUT,
        "/v1/overrides",
        Some(json!({"policy": "per_account", "attributes": {"header:x-account": "big"}, "limit": 6, "until": in_days(30)})),
    )
    .await;
    assert_eq!(status, 200, "{set}");
    let all: Vec<&NodeProcess> = nodes.iter().collect();
    let vip = |_: usize| "sk_vip".to_string();
    let fresh = |i: usize| format!("acct-{i}");
    assert_eq!(admitted(&client, &all, &vip, &fresh, 12).await, 8);
    let keyed = |i: usize| format!("sk_big_{i}");
    let big = |_: usize| "big".to_string();
    assert_eq!(admitted(&client, &all[1..2], &keyed, &big, 8).await, 6);
    assert_eq!(
        admitted(&client, &all[2..3], &keyed, &|_| "small".into(), 5).await,
        3
    );

    // Listed on every node, identities hashed.
    let (_, list) = call(
        &client,
        admins[2],
        reqwest::Method::GET,
        "/v1/overrides",
        None,
    )
    .await;
    let mut found = listed(&list);
    found.sort();
    assert_eq!(
        found,
        [("per_account".to_string(), 6), ("per_key".to_string(), 8)],
        "{list}"
    );
    assert_eq!(list["overrides"][0]["key"].as_str().unwrap().len(), 16);
    assert!(!list.to_string().contains("sk_vip"));

    // Node 3 stopped while a third is set: it takes it from a peer once it runs again.
    signal(&nodes[2], libc::SIGSTOP);
    let (status, set) = call(
        &client,
        admin,
        reqwest::Method::PUT,
        "/v1/overrides",
        Some(json!({"policy": "per_key", "attributes": {"api_key": "sk_late"}, "limit": 9, "for": "2h"})),
    )
    .await;
    assert_eq!(status, 200, "{set}");
    assert_eq!(set["pending"], json!([3]), "{set}");
    signal(&nodes[2], libc::SIGCONT);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, list) = call(
            &client,
            admins[2],
            reqwest::Method::GET,
            "/v1/overrides",
            None,
        )
        .await;
        if listed(&list).len() == 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node 3 never pulled the override: {list}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // Bad calls.
    let put = |body: Value| {
        call(
            &client,
            admin,
            reqwest::Method::PUT,
            "/v1/overrides",
            Some(body),
        )
    };
    let (status, bad) =
        put(json!({"policy": "per_key", "attributes": {"api_key": "x"}, "limit": 0, "for": "1h"}))
            .await;
    assert_eq!(
        (status, bad["error"].as_str()),
        (400, Some("bad_limit")),
        "{bad}"
    );
    let (status, _) = put(
        json!({"policy": "per_key", "attributes": {"api_key": "x"}, "limit": 9, "for": "500days"}),
    )
    .await;
    assert_eq!(status, 400);
    let (status, _) =
        put(json!({"policy": "per_key", "attributes": {"api_key": "x"}, "limit": 9})).await;
    assert_eq!(status, 400);
    let (status, _) =
        put(json!({"policy": "nope", "attributes": {"api_key": "x"}, "limit": 9, "for": "1h"}))
            .await;
    assert_eq!(status, 404);

    // Every node stopped, then started again: the overrides are read back from each
    // node's state directory, and enforced.
    for node in &nodes {
        signal(node, libc::SIGTERM);
    }
    for node in &mut nodes {
        exit_of(node, Duration::from_secs(20)).await;
    }
    nodes = files.iter().map(|f| start(f)).collect();
    for node in &nodes {
        wait_healthy(&client, node).await;
    }
    let (_, list) = call(
        &client,
        admins[1],
        reqwest::Method::GET,
        "/v1/overrides",
        None,
    )
    .await;
    assert_eq!(listed(&list).len(), 3, "{list}");
    let all: Vec<&NodeProcess> = nodes.iter().collect();
    // The local key's count started afresh: its override's 6 again (not the policy's 3).
    assert_eq!(admitted(&client, &all[1..2], &keyed, &big, 8).await, 6);
    // The mesh key's hour came back from the snapshots: its 8 are used.
    assert_eq!(admitted(&client, &all, &vip, &fresh, 4).await, 0);

    // Removed: the policy's limit again, on every node.
    let (status, removed) = call(
        &client,
        admin,
        reqwest::Method::DELETE,
        "/v1/overrides",
        Some(json!({"policy": "per_account", "attributes": {"header:x-account": "big"}})),
    )
    .await;
    assert_eq!(status, 200, "{removed}");
    assert_eq!(admitted(&client, &all[..1], &keyed, &big, 5).await, 3);
    let (_, list) = call(
        &client,
        admins[2],
        reqwest::Method::GET,
        "/v1/overrides?policy=per_account",
        None,
    )
    .await;
    assert!(listed(&list).is_empty(), "{list}");

    // `ratemesh ctl overrides list`.
    let out = Command::new(BIN)
        .args(["ctl", "--admin", &admin.to_string(), "overrides", "list"])
        .env("RATEMESH_TOKEN", TOKEN)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("per_key") && text.contains("launch day"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_resets_and_overrides_of_one_key_settle_on_one_limit() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster_with(dir.path(), 3, POLICIES);
    let admins = add_admin(dir.path(), &files, |_| true, TOKEN);
    let nodes: Vec<NodeProcess> = files.iter().map(|f| start(f)).collect();
    let client = client();
    for node in &nodes {
        wait_healthy(&client, node).await;
    }
    let all: Vec<&NodeProcess> = nodes.iter().collect();
    let race = |_: usize| "sk_race".to_string();
    let fresh = |i: usize| format!("acct-race-{i}");
    assert_eq!(admitted(&client, &all, &race, &fresh, 7).await, 5);

    // Six resets and three overrides (7, 8, 9) of the key at once, through every node.
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..9 {
        let (client, admin) = (client.clone(), admins[i % 3]);
        calls.spawn(async move {
            let key = json!({"policy": "per_key", "attributes": {"api_key": "sk_race"}});
            if i % 3 == 2 {
                let mut set = key;
                set["limit"] = json!(7 + i / 3);
                set["for"] = json!("1h");
                call(
                    &client,
                    admin,
                    reqwest::Method::PUT,
                    "/v1/overrides",
                    Some(set),
                )
                .await
            } else {
                call(
                    &client,
                    admin,
                    reqwest::Method::POST,
                    "/v1/keys/reset",
                    Some(key),
                )
                .await
            }
        });
    }
    while let Some(answer) = calls.join_next().await {
        let (status, body) = answer.unwrap();
        assert_eq!(status, 200, "{body}");
    }

    // Every node settles on the same one override, the one set last.
    let deadline = Instant::now() + Duration::from_secs(30);
    let limit = loop {
        let mut seen = Vec::new();
        for &admin in &admins {
            let (_, list) = call(&client, admin, reqwest::Method::GET, "/v1/overrides", None).await;
            seen.push(listed(&list));
        }
        if seen.iter().all(|l| l.len() == 1 && *l == seen[0]) {
            break seen[0][0].1;
        }
        assert!(Instant::now() < deadline, "the nodes disagree: {seen:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!((7..=9).contains(&limit), "{limit}");
    for &admin in &admins {
        let (status, key) = call(
            &client,
            admin,
            reqwest::Method::GET,
            "/v1/keys?policy=per_key&api_key=sk_race",
            None,
        )
        .await;
        assert_eq!((status, key["limit"].as_u64()), (200, Some(limit)), "{key}");
    }
    // The resets forgave the five spent before them: the override's limit, once.
    let fresh = |i: usize| format!("acct-race-after-{i}");
    assert_eq!(
        admitted(&client, &all, &race, &fresh, 12).await,
        limit as usize
    );
}
