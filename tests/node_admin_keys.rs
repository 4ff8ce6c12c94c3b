//! The admin API's keys on a three-node cluster of `ratemesh node`s: a key's state read
//! across the cluster (a mesh key from its owner, a local key from every node), a reset that
//! gives the key exactly one fresh limit whichever node the requests reach (and ends its
//! lockout), a node stopped with SIGSTOP standing in for a partition, bad calls, and
//! `ratemesh ctl keys`.

mod support;

use std::process::Command;

use serde_json::{Value, json};
use support::*;

const TOKEN: &str = "support-0123456789abcdef0123456789abcdef";

const POLICIES: &str = "env = \"test\"\nkey_secret = \"test-secret\"\ndefault_tier = \"api\"\n\n\
    [identity]\norder = [\"api_key\", \"ip\"]\napi_key_header = \"x-api-key\"\n\n\
    [policies.per_key]\nalgorithm = \"fixed-window\"\nlimit = 5\nwindow = \"1h\"\n\
    backend = \"mesh\"\n\n\
    [policies.per_account]\nalgorithm = \"fixed-window\"\nlimit = 3\nwindow = \"1h\"\n\
    by = [\"header:x-account\"]\nblock_for = \"2h\"\n\n\
    [tiers.api]\npolicies = [\"per_key\", \"per_account\"]\n";

struct Admin {
    client: reqwest::Client,
    addr: std::net::SocketAddr,
}

impl Admin {
    async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        token: &str,
    ) -> (u16, Value) {
        let url = format!("http://{}{path}", self.addr);
        let mut request = match method {
            "GET" => self.client.get(url),
            _ => self.client.post(url),
        }
        .bearer_auth(token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json::<Value>().await.unwrap())
    }

    async fn get(&self, query: &str) -> (u16, Value) {
        self.call("GET", &format!("/v1/keys?{query}"), None, TOKEN)
            .await
    }

    async fn reset(&self, body: Value) -> (u16, Value) {
        self.call("POST", "/v1/keys/reset", Some(body), TOKEN).await
    }
}

/// Requests for `api_key` (and `account`) sent round the nodes: how many were admitted.
async fn admitted(
    client: &reqwest::Client,
    nodes: &[&NodeProcess],
    api_key: &str,
    account: &str,
    n: usize,
) -> usize {
    let mut ok = 0;
    for i in 0..n {
        let status = client
            .get(format!("http://{}/orders", nodes[i % nodes.len()].http))
            .header("x-api-key", api_key)
            .header("x-account", account)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16();
        if status == 200 {
            ok += 1;
        } else {
            assert_eq!(status, 429);
        }
    }
    ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_read_and_reset_across_the_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster_with(dir.path(), 3, POLICIES);
    let addr = add_admin(dir.path(), &files, |i| i == 0, TOKEN)[0];
    let nodes: Vec<NodeProcess> = files.iter().map(|f| start(f)).collect();
    let client = client();
    for node in &nodes {
        wait_healthy(&client, node).await;
    }
    let all: Vec<&NodeProcess> = nodes.iter().collect();
    let admin = Admin {
        client: client.clone(),
        addr,
    };

    // A mesh key used up across the nodes: its owner tells where its 5 went.
    assert_eq!(admitted(&client, &all, "sk_alice", "a1", 4).await, 4);
    assert_eq!(admitted(&client, &all, "sk_alice", "a2", 4).await, 1);
    let (status, key) = admin.get("policy=per_key&api_key=sk_alice").await;
    assert_eq!(status, 200, "{key}");
    assert_eq!(
        (key["backend"].as_str(), key["limit"].as_u64()),
        (Some("mesh"), Some(5))
    );
    assert_eq!(
        key["remaining"].as_u64().unwrap() + key["used"].as_u64().unwrap(),
        5,
        "{key}"
    );
    assert_eq!(key["available"], 0, "{key}");
    let owner = key["owner"].as_u64().unwrap();
    assert!((1..=3).contains(&owner));
    assert_eq!(key["key"].as_str().unwrap().len(), 16);

    // A local key, counted on each node by itself: a9 used up on node 1, which locked it
    // out.
    assert_eq!(admitted(&client, &all[..1], "sk_bob", "a9", 4).await, 3);
    let (status, local) = admin.get("policy=per_account&header:x-account=a9").await;
    assert_eq!(status, 200, "{local}");
    let per_node = local["nodes"].as_array().unwrap();
    assert_eq!(per_node.len(), 3, "{local}");
    assert_eq!(per_node[0]["node"], 1, "{local}");
    assert!(
        per_node[0]["lockout_ms"].as_u64().unwrap() > 3_600_000,
        "{local}"
    );
    assert_eq!(per_node[1]["remaining"], 3, "{local}");

    // A reset gives the mesh key exactly one fresh limit, whichever nodes the requests reach.
    let (status, after) = admin
        .reset(json!({"policy": "per_key", "attributes": {"api_key": "sk_alice"}}))
        .await;
    assert_eq!(status, 200, "{after}");
    assert_eq!(
        (after["reset"].as_bool(), after["used"].as_u64()),
        (Some(true), Some(0)),
        "{after}"
    );
    assert_eq!(admitted(&client, &all, "sk_alice", "a3", 3).await, 3);
    assert_eq!(admitted(&client, &all, "sk_alice", "a4", 9).await, 2);
    // A reset of the local key ends its lockout on every node, and its count.
    let (status, after) = admin
        .reset(json!({"policy": "per_account", "attributes": {"header:x-account": "a9"}}))
        .await;
    assert_eq!(status, 200, "{after}");
    let (_, local) = admin.get("policy=per_account&header:x-account=a9").await;
    for n in local["nodes"].as_array().unwrap() {
        assert_eq!(
            (n["remaining"].as_u64(), n["lockout_ms"].as_u64()),
            (Some(3), Some(0)),
            "{local}"
        );
    }
    assert_eq!(admitted(&client, &all[..1], "sk_carol", "a9", 4).await, 3);
    let (_, fresh) = admin
        .reset(json!({"policy": "per_key", "attributes": {"api_key": "sk_alice"}}))
        .await;
    assert_eq!(fresh["remaining"], 5, "{fresh}");
    assert_eq!(admitted(&client, &all, "sk_alice", "a5", 3).await, 3);

    // Bad calls: clear statuses and JSON errors.
    assert_eq!(admin.get("policy=nope&api_key=x").await.0, 404);
    assert_eq!(admin.get("api_key=x").await.0, 400);
    assert_eq!(
        admin.get("policy=per_account").await.1["error"],
        "missing_part"
    );
    assert_eq!(
        admin.get("policy=per_key&ip=not-an-ip").await.1["error"],
        "bad_attribute"
    );
    let (status, _) = admin
        .call("GET", "/v1/keys?policy=per_key&api_key=x", None, "wrong")
        .await;
    assert_eq!(status, 401);
    // An identity of any bytes is a key like any other.
    let (status, odd) = admin.get("policy=per_key&api_key=%00%FF%E2%82%AC%0A").await;
    assert_eq!((status, odd["remaining"].as_u64()), (200, Some(5)), "{odd}");

    // Who is hammering us: one account denied 27 times on node 2, another 3 times, a third
    // never; the first is the top key, the one `/v1/keys` names for it.
    let node2 = [&nodes[1]];
    for (account, n) in [("hot", 30), ("warm", 6), ("calm", 2)] {
        for i in 0..n {
            admitted(&client, &node2, &format!("sk_{account}_{i}"), account, 1).await;
        }
    }
    let (status, top) = admin
        .call(
            "GET",
            "/v1/top?policy=per_account&by=denied&n=3",
            None,
            TOKEN,
        )
        .await;
    assert_eq!(status, 200, "{top}");
    let (_, hot) = admin.get("policy=per_account&header:x-account=hot").await;
    let (_, warm) = admin.get("policy=per_account&header:x-account=warm").await;
    assert_eq!(top["keys"][0]["key"], hot["key"], "{top}");
    assert_eq!(top["keys"][0]["count"], 27, "{top}");
    assert_eq!(top["keys"][1]["key"], warm["key"], "{top}");
    assert_eq!(top["nodes"], json!([1, 2, 3]), "{top}");
    let out = Command::new(BIN)
        .args([
            "ctl",
            "--admin",
            &addr.to_string(),
            "top",
            "--policy",
            "per_account",
        ])
        .env("RATEMESH_TOKEN", TOKEN)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains(hot["key"].as_str().unwrap()),
        "{text}"
    );
    assert_eq!(
        admin
            .call("GET", "/v1/top?policy=nope", None, TOKEN)
            .await
            .0,
        404
    );
    assert_eq!(
        admin
            .call("GET", "/v1/top?policy=per_account&n=0", None, TOKEN)
            .await
            .0,
        400
    );

    // `ratemesh ctl keys`.
    let out = Command::new(BIN)
        .args([
            "ctl",
            "--admin",
            &addr.to_string(),
            "keys",
            "get",
            "per_key",
            "api_key=sk_alice",
        ])
        .env("RATEMESH_TOKEN", TOKEN)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("per_key key")
            && text.contains("left")
            && text.contains(&format!("owner node {owner}")),
        "{text}"
    );

    // A node that does not answer (stopped): a local key lists it unreachable (504, the
    // others' counts given); a mesh key it owns cannot be read or reset, and says so.
    let stopped = if owner == 1 { 2 } else { owner };
    let mut stopped_key = None;
    for i in 0..200 {
        let (_, key) = admin.get(&format!("policy=per_key&api_key=sk_{i}")).await;
        if key["owner"].as_u64() == Some(stopped) {
            stopped_key = Some(format!("sk_{i}"));
            break;
        }
    }
    let stopped_key = stopped_key.expect("a key the stopped node owns");
    let stopped_node = &nodes[stopped as usize - 1];
    signal(stopped_node, libc::SIGSTOP);
    let (status, refused) = admin
        .reset(json!({"policy": "per_key", "attributes": {"api_key": stopped_key}}))
        .await;
    assert_eq!(
        (status, refused["error"].as_str()),
        (504, Some("owner_unreachable")),
        "{refused}"
    );
    let (status, local) = admin.get("policy=per_account&header:x-account=a9").await;
    assert_eq!(status, 504, "{local}");
    assert_eq!(local["unreachable"][0]["node"], stopped, "{local}");
    assert_eq!(local["nodes"].as_array().unwrap().len(), 2, "{local}");
    signal(stopped_node, libc::SIGCONT);
    // Back: the reset goes through.
    let (status, after) = admin
        .reset(json!({"policy": "per_key", "attributes": {"api_key": stopped_key}}))
        .await;
    assert_eq!(status, 200, "{after}");
}
