//! The `[admin]` port of a `ratemesh node`: bearer tokens; the decision API, on a local, an
//! identity-chain and a `mesh` policy sharing counters with HTTP requests that carry the same
//! attributes, errors per request, and the Python client of `examples/`; the configuration
//! in force (`/v1/config`).

mod support;

use std::process::Command;

use support::*;

const TOKEN: &str = "billing-0123456789abcdef0123456789abcdef";

const POLICIES: &str = "env = \"test\"\nkey_secret = \"test-secret\"\ndefault_tier = \"api\"\n\n\
    [identity]\norder = [\"api_key\", \"ip\"]\napi_key_header = \"x-api-key\"\n\n\
    [policies.per_account]\nalgorithm = \"fixed-window\"\nlimit = 3\nwindow = \"1h\"\n\
    by = [\"header:x-account\"]\n\n\
    [policies.per_key]\nalgorithm = \"fixed-window\"\nlimit = 5\nwindow = \"1h\"\n\
    backend = \"mesh\"\n\n\
    [tiers.api]\npolicies = [\"per_key\", \"per_account\"]\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applications_ask_the_node_and_share_its_counters() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster_with(dir.path(), 1, POLICIES);
    std::fs::write(
        dir.path().join("admin-tokens"),
        format!("# who may call\nbilling {TOKEN}\n"),
    )
    .unwrap();
    let admin = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let admin_addr = admin.local_addr().unwrap();
    drop(admin);
    edit_file(&files[0], |t| {
        format!("{t}\n[admin]\nlisten = \"{admin_addr}\"\ntoken_file = \"admin-tokens\"\n")
    });
    let node = start(&files[0]);
    let client = client();
    wait_healthy(&client, &node).await;
    let decide = |token: &str, body: serde_json::Value| {
        let request = client
            .post(format!("http://{admin_addr}/v1/decide"))
            .bearer_auth(token)
            .json(&body);
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.json::<serde_json::Value>().await.unwrap())
        }
    };
    let ask = |policy: &str, attributes: serde_json::Value| serde_json::json!({"requests": [{"policy": policy, "attributes": attributes}]});

    // No token, or another one: 401.
    let (status, body) = decide("not-a-token", ask("per_account", serde_json::json!({}))).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (401, Some("unauthorized"))
    );

    // One account's 3 for the hour, asked directly, in one call.
    let alice =
        serde_json::json!({"policy": "per_account", "attributes": {"header:x-account": "alice"}});
    let (status, body) = decide(
        TOKEN,
        serde_json::json!({"requests": [alice, alice, alice, alice]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let allowed: Vec<bool> = body["responses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["allowed"].as_bool().unwrap())
        .collect();
    assert_eq!(allowed, [true, true, true, false]);
    assert_eq!(body["responses"][3]["limit"], 3);
    assert!(body["responses"][3]["retry_after_ms"].as_u64().unwrap() > 0);

    // An HTTP request of the same account meets the same counter: 429.
    let http = |key: &str, account: &str| {
        let request = client
            .get(format!("http://{}/orders", node.http))
            .header("x-api-key", key)
            .header("x-account", account);
        async move { request.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(http("sk_a", "alice").await, 429);
    // The other way round: bob's two HTTP requests leave him one, and the mesh policy of the
    // identity chain (his API key) counts both paths too.
    assert_eq!(http("sk_bob", "bob").await, 200);
    assert_eq!(http("sk_bob", "bob").await, 200);
    let (_, body) = decide(
        TOKEN,
        ask(
            "per_account",
            serde_json::json!({"header:x-account": "bob"}),
        ),
    )
    .await;
    assert_eq!(body["responses"][0]["remaining"], 0, "{body}");
    // Bob's key has 3 of its 5 left: asked directly, 3 are allowed, the fourth is not.
    let bob = serde_json::json!({"policy": "per_key", "attributes": {"api_key": "sk_bob"}});
    let (_, body) = decide(TOKEN, serde_json::json!({"requests": [bob, bob, bob, bob]})).await;
    let allowed: Vec<bool> = body["responses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["allowed"].as_bool().unwrap())
        .collect();
    assert_eq!(allowed, [true, true, true, false], "{body}");

    // Each request that cannot be decided says why; the others are decided.
    let (status, body) = decide(
        TOKEN,
        serde_json::json!({"requests": [
            {"policy": "nope", "attributes": {}},
            {"policy": "per_account", "attributes": {}},
            {"policy": "per_account", "attributes": {"header:bad name": "x"}},
            {"policy": "per_account", "attributes": {"route": "none"}},
            {"policy": "per_account", "attributes": {"ip": "not an address"}},
            {"policy": "per_account", "attributes": {"header:x-account": "carol"}, "cost": 9},
            {"policy": "per_account", "attributes": {"header:x-account": "carol"}},
        ]}),
    )
    .await;
    assert_eq!(status, 200);
    let kinds: Vec<&str> = body["responses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r["error"].as_str().unwrap_or(if r["allowed"] == true {
                "allowed"
            } else {
                "denied"
            })
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "unknown_policy",
            "missing_part",
            "bad_attribute",
            "unknown_route",
            "bad_attribute",
            "denied",
            "allowed"
        ]
    );
    // A body that is not a call, or more than 1,000 requests: 400.
    let (status, body) = decide(TOKEN, serde_json::json!({"requests": "all"})).await;
    assert_eq!((status, body["error"].as_str()), (400, Some("bad_request")));
    let carol =
        serde_json::json!({"policy": "per_account", "attributes": {"header:x-account": "carol"}});
    let (status, body) = decide(TOKEN, serde_json::json!({"requests": vec![carol; 1001]})).await;
    assert_eq!((status, body["error"].as_str()), (400, Some("bad_request")));

    // The configuration in force: this node, the policies, the members.
    let config = |token: &str| {
        let request = client
            .get(format!("http://{admin_addr}/v1/config"))
            .bearer_auth(token);
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.json::<serde_json::Value>().await.unwrap())
        }
    };
    assert_eq!(config("wrong").await.0, 401);
    let (status, body) = config(TOKEN).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["node"]["id"], 1);
    assert_eq!(body["node"]["version"], env!("CARGO_PKG_VERSION"));
    let names: Vec<&str> = body["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["per_account", "per_key"]);
    assert_eq!(body["policies"][0]["by"][0], "header:x-account");
    assert_eq!(body["policies"][1]["backend"], "mesh");
    assert_eq!(body["members"][0]["id"], 1);
    assert_eq!(body["mesh_digest"].as_str().unwrap().len(), 16);
    let text = metrics_of(&client, &node).await;
    assert_eq!(
        metric(
            &text,
            "ratemesh_admin_calls_total{call=\"decide\",result=\"ok\"}"
        ),
        4.0
    );
    assert_eq!(
        metric(
            &text,
            "ratemesh_admin_calls_total{call=\"config\",result=\"unauthorized\"}"
        ),
        1.0
    );

    // `ratemesh ctl`, with the token from the environment.
    let ctl = |token: &str, args: &[&str]| {
        let output = Command::new(BIN)
            .args(["ctl", "--admin", &admin_addr.to_string()])
            .args(args)
            .env("RATEMESH_TOKEN", token)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&output.stdout).into_owned();
        let complained = String::from_utf8_lossy(&output.stderr).into_owned();
        (output.status.success(), said, complained)
    };
    let (ok, said, _) = ctl(TOKEN, &["config"]);
    assert!(
        ok && said.contains("per_account") && said.contains("header:x-account"),
        "{said}"
    );
    let (ok, said, _) = ctl(TOKEN, &["members"]);
    assert!(
        ok && said.lines().any(|l| l.trim_start().starts_with("1  yes")),
        "{said}"
    );
    let (ok, said, _) = ctl(TOKEN, &["decide", "per_account", "header:x-account=erin"]);
    assert!(ok && said.starts_with("allowed: 2 of 3 left"), "{said}");
    let (ok, said, _) = ctl(TOKEN, &["--json", "config"]);
    let parsed: serde_json::Value = serde_json::from_str(&said).unwrap();
    assert!(ok && parsed["policies"].is_array());
    let (ok, _, complained) = ctl("wrong-token", &["config"]);
    assert!(!ok && complained.contains("401"), "{complained}");

    // A rotated token file is read again while the node runs: the new token is taken, the
    // one it no longer lists refused.
    let rotated = "ops-fedcba9876543210fedcba9876543210";
    std::fs::write(dir.path().join("admin-tokens"), format!("ops {rotated}\n")).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while config(rotated).await.0 != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "the rotated token file was never read"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_eq!(config(TOKEN).await.0, 401);
    std::fs::write(
        dir.path().join("admin-tokens"),
        format!("ops {rotated}\nbilling {TOKEN}\n"),
    )
    .unwrap();
    while config(TOKEN).await.0 != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "the token file was never read again"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }

    // The Python client of `examples/` (standard library only).
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/decide_client.py");
    let run = |attributes: &[&str]| {
        Command::new("python3")
            .arg(script)
            .args(["--url", &format!("http://{admin_addr}"), "per_account"])
            .args(attributes)
            .env("RATEMESH_TOKEN", TOKEN)
            .output()
    };
    match run(&["header:x-account=dave"]) {
        Err(error) => eprintln!("SKIPPED the Python client: no python3 ({error})"),
        Ok(output) => {
            let said = String::from_utf8_lossy(&output.stdout);
            assert!(
                output.status.success(),
                "{said}{}",
                String::from_utf8_lossy(&output.stderr)
            );
            assert!(said.starts_with("allowed 2/3 left"), "{said}");
            for _ in 0..2 {
                run(&["header:x-account=dave"]).unwrap();
            }
            let output = run(&["header:x-account=dave"]).unwrap();
            assert_eq!(output.status.code(), Some(1));
            assert!(String::from_utf8_lossy(&output.stdout).starts_with("denied, retry in"));
        }
    }
}

#[test]
fn bad_admin_tables_are_refused_with_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster_with(dir.path(), 1, POLICIES);
    let text = std::fs::read_to_string(&files[0]).unwrap();
    let http = text
        .lines()
        .find_map(|l| l.strip_prefix("http = "))
        .unwrap()
        .trim_matches('"')
        .to_string();
    std::fs::write(dir.path().join("short-tokens"), "billing short\n").unwrap();
    for (table, field, says) in [
        (
            format!("listen = \"{http}\"\ntoken_file = \"none\"\n"),
            "admin.listen",
            "HTTP address",
        ),
        (
            "listen = \"nowhere\"\ntoken_file = \"none\"\n".to_string(),
            "admin.listen",
            "not an address",
        ),
        (
            "listen = \"127.0.0.1:1\"\ntoken_file = \"none\"\n".to_string(),
            "admin.token_file",
            "none",
        ),
        (
            "listen = \"127.0.0.1:1\"\ntoken_file = \"short-tokens\"\n".to_string(),
            "admin.token_file",
            "line 1",
        ),
    ] {
        let with = format!("{text}\n[admin]\n{table}");
        let error = ratemesh::node::NodeFile::from_toml_str(&with, &files[0]).unwrap_err();
        assert_eq!(error.field, field, "{error}");
        assert!(error.reason.contains(says), "{error}");
        assert!(!error.reason.contains("short\n"), "{error}");
        assert!(error.line > 1, "{error}");
    }
}
