//! `GET /v1/top` with `[admin] show_identities` on a `ratemesh node`: the heaviest keys in
//! clear where the node saw them on requests, an address by its prefix with the route,
//! a header only when `show_parts` names it, an API key never; without the setting, hashes
//! only.

mod support;

use std::process::Command;

use serde_json::Value;
use support::*;

const TOKEN: &str = "support-0123456789abcdef0123456789abcdef";

const POLICIES: &str = "env = \"test\"\nkey_secret = \"test-secret\"\ndefault_tier = \"api\"\n\n\
    [identity]\norder = [\"api_key\", \"ip\"]\napi_key_header = \"x-api-key\"\n\n\
    [policies.per_key]\nalgorithm = \"fixed-window\"\nlimit = 2\nwindow = \"1h\"\n\n\
    [policies.per_account]\nalgorithm = \"fixed-window\"\nlimit = 2\nwindow = \"1h\"\n\
    by = [\"header:x-account\"]\n\n\
    [policies.per_team]\nalgorithm = \"fixed-window\"\nlimit = 1000\nwindow = \"1h\"\n\
    by = [\"header:x-team\"]\n\n\
    [policies.per_address]\nalgorithm = \"fixed-window\"\nlimit = 1000\nwindow = \"1h\"\n\
    by = [\"ip\", \"route\"]\n\n\
    [tiers.api]\npolicies = [\"per_key\", \"per_account\", \"per_team\"]\n\n\
    [[routes]]\nname = \"search\"\npath_prefix = \"/search\"\npolicies = [\"per_address\"]\n";

async fn top(
    client: &reqwest::Client,
    admin: std::net::SocketAddr,
    policy: &str,
    by: &str,
) -> Value {
    let response = client
        .get(format!("http://{admin}/v1/top?policy={policy}&by={by}&n=5"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

/// Start one node with `[admin]` and `extra` in it; send requests; return its top lists.
async fn tops(extra: &str) -> [Value; 4] {
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster_with(dir.path(), 1, POLICIES);
    let admin = add_admin(dir.path(), &files, |_| true, TOKEN)[0];
    edit_file(&files[0], |t| format!("{t}{extra}"));
    let node = start(&files[0]);
    let client = client();
    wait_healthy(&client, &node).await;
    for i in 0..6 {
        client
            .get(format!("http://{}/search/{i}", node.http))
            .header("x-api-key", "sk_live_hot")
            .header("x-account", "alice")
            .header("x-team", "blue")
            .send()
            .await
            .unwrap();
    }
    [
        top(&client, admin, "per_key", "denied").await,
        top(&client, admin, "per_account", "admitted").await,
        top(&client, admin, "per_team", "admitted").await,
        top(&client, admin, "per_address", "admitted").await,
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_keys_show_the_identities_the_node_may_show() {
    let [per_key, per_account, per_team, per_address] =
        tops("show_identities = true\nshow_parts = [\"header:x-account\"]\n").await;
    // Two admitted, then every layer denies at the API key's policy first.
    assert_eq!(per_key["keys"][0]["count"], 4, "{per_key}");
    assert!(per_key["keys"][0].get("identity").is_none(), "{per_key}");
    let text = per_key.to_string();
    assert!(!text.contains("sk_live_hot"), "{text}");
    assert_eq!(
        per_account["keys"][0]["identity"], "header:x-account=alice",
        "{per_account}"
    );
    // `x-team` is not in show_parts: its only part is secret, so nothing is shown.
    assert_eq!(per_team["keys"][0]["count"], 2, "{per_team}");
    assert!(per_team["keys"][0].get("identity").is_none(), "{per_team}");
    assert_eq!(
        per_address["keys"][0]["identity"], "ip=127.0.0.1 route=search",
        "{per_address}"
    );

    // Without show_identities: hashes only.
    let [_, per_account, _, per_address] = tops("").await;
    assert!(
        per_account["keys"][0].get("identity").is_none(),
        "{per_account}"
    );
    assert!(
        per_address["keys"][0].get("identity").is_none(),
        "{per_address}"
    );
}

#[test]
fn show_parts_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster_with(dir.path(), 1, POLICIES);
    add_admin(dir.path(), &files, |_| true, TOKEN);
    let original = std::fs::read_to_string(&files[0]).unwrap();
    for (extra, says) in [
        (
            "show_parts = [\"header:x-account\"]\n",
            "show_identities = true",
        ),
        (
            "show_identities = true\nshow_parts = [\"api_key\"]\n",
            "API keys never",
        ),
        (
            "show_identities = true\nshow_parts = [\"header:\"]\n",
            "admin.show_parts",
        ),
    ] {
        std::fs::write(&files[0], format!("{original}{extra}")).unwrap();
        let out = Command::new(BIN)
            .args(["node", "--check-config"])
            .arg(&files[0])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && text.contains(says) && text.contains("admin.show_parts"),
            "{extra}: {text}"
        );
    }
}
