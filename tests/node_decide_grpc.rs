//! The decision API over gRPC (`[admin] grpc_listen`, `ratemesh.decide.v1.Decide`) of a real
//! `ratemesh node`: a call's checks decided in order with an error per check that cannot be
//! decided, the counters shared with `POST /v1/decide` and with HTTP requests that carry the
//! same attributes (a local, a `mesh` and a `jwt:sub` policy), bearer tokens, the limits of a
//! call (checks, bytes), the calls counted, the port stopped with the node; and the node
//! file's errors for `grpc_listen`.

mod support;

#[path = "support/decide_grpc.rs"]
mod decide_grpc;

use std::process::Command;
use std::time::Duration;

use decide_grpc::{Check, DecideClient, check};
use support::*;

const TOKEN: &str = "billing-0123456789abcdef0123456789abcdef";

const POLICIES: &str = "env = \"test\"\nkey_secret = \"test-secret\"\ndefault_tier = \"api\"\n\n\
    [identity]\norder = [\"api_key\", \"ip\"]\napi_key_header = \"x-api-key\"\n\n\
    [jwt]\nalgorithms = [\"HS256\"]\nsecret_file = \"hmac.secret\"\n\n\
    [policies.per_account]\nalgorithm = \"fixed-window\"\nlimit = 3\nwindow = \"1h\"\n\
    by = [\"header:x-account\"]\n\n\
    [policies.per_key]\nalgorithm = \"fixed-window\"\nlimit = 5\nwindow = \"1h\"\n\
    backend = \"mesh\"\n\n\
    [policies.per_subject]\nalgorithm = \"fixed-window\"\nlimit = 2\nwindow = \"1h\"\n\
    by = [\"jwt:sub\"]\non_missing = \"skip\"\n\n\
    [tiers.api]\npolicies = [\"per_key\", \"per_account\", \"per_subject\"]\n";

/// A free loopback port's address.
fn free_addr() -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

fn with_claims(mut check: Check, claims: &str) -> Check {
    check.jwt_claims_json = claims.to_string();
    check
}

fn with_cost(mut check: Check, cost: u64) -> Check {
    check.cost = Some(cost);
    check
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applications_ask_over_grpc_on_the_counters_of_json_and_http() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster_with(dir.path(), 1, POLICIES);
    std::fs::write(
        dir.path().join("hmac.secret"),
        "0123456789abcdef0123456789abcdef-test\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("admin-tokens"),
        format!("billing {TOKEN}\n"),
    )
    .unwrap();
    let (admin_addr, grpc_addr) = (free_addr(), free_addr());
    edit_file(&files[0], |t| {
        format!(
            "{t}\n[admin]\nlisten = \"{admin_addr}\"\ntoken_file = \"admin-tokens\"\n\
             grpc_listen = \"{grpc_addr}\"\n"
        )
    });
    let mut node = start(&files[0]);
    let http = client();
    wait_healthy(&http, &node).await;
    let mut grpc = DecideClient::connect(grpc_addr, TOKEN).await;

    // No token, or one the token file does not list: UNAUTHENTICATED, nothing decided.
    for token in ["", "billing-not-a-token-0123456789abcdef0123"] {
        let status = grpc
            .with_token(token)
            .decide(vec![check("per_account", &[("header:x-account", "alice")])])
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    }

    // A call of mixed checks: each answered in its place, in order.
    let alice = || check("per_account", &[("header:x-account", "alice")]);
    let dan = || with_claims(check("per_subject", &[]), r#"{"sub": "dan"}"#);
    let results = grpc
        .decide(vec![
            alice(),
            check("nope", &[("header:x-account", "alice")]),
            check("per_account", &[]),
            with_cost(alice(), 9),
            check(
                "per_account",
                &[("header:x-account", "alice"), ("route", "none")],
            ),
            check("per_account", &[("header:bad name", "x")]),
            dan(),
            with_cost(dan(), 0),
            with_claims(check("per_subject", &[]), "{not json"),
            alice(),
        ])
        .await
        .unwrap();
    let kinds: Vec<&str> = results.iter().map(|r| r.kind()).collect();
    assert_eq!(
        kinds,
        [
            "allowed",
            "unknown_policy",
            "missing_part",
            "denied",
            "unknown_route",
            "bad_attribute",
            "allowed",
            "allowed",
            "bad_attribute",
            "allowed",
        ],
        "{results:?}"
    );
    assert_eq!((results[0].limit, results[0].remaining), (3, 2));
    assert!(results[1].message.contains("nope"), "{:?}", results[1]);
    // A cost over the limit can never be allowed (and takes nothing).
    assert_eq!((results[3].limit, results[3].remaining), (3, 0));
    // The look (cost 0) takes nothing: dan has 1 of 2 left both times.
    assert_eq!((results[6].remaining, results[7].remaining), (1, 1));
    assert_eq!(results[9].remaining, 1);

    // Alice's third of 3 through the JSON API, then an HTTP request of hers: 429; over gRPC
    // she is denied too, with when to retry.
    let json = http
        .post(format!("http://{admin_addr}/v1/decide"))
        .bearer_auth(TOKEN)
        .json(&serde_json::json!({"requests": [
            {"policy": "per_account", "attributes": {"header:x-account": "alice"}}
        ]}))
        .send()
        .await
        .unwrap()
        .json::<serde_json::Value>()
        .await
        .unwrap();
    assert_eq!(json["responses"][0]["remaining"], 0, "{json}");
    let get = |key: &str, account: &str| {
        let request = http
            .get(format!("http://{}/orders", node.http))
            .header("x-api-key", key)
            .header("x-account", account);
        async move { request.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(get("sk_alice", "alice").await, 429);
    let results = grpc.decide(vec![alice()]).await.unwrap();
    assert!(
        !results[0].allowed && results[0].retry_after_ms > 0,
        "{results:?}"
    );
    // The other way round: bob's two HTTP requests leave his account one and his API key
    // (the `mesh` policy of the identity chain) 3 of 5.
    assert_eq!(get("sk_bob", "bob").await, 200);
    assert_eq!(get("sk_bob", "bob").await, 200);
    let bob_key = || check("per_key", &[("api_key", "sk_bob")]);
    let results = grpc
        .decide(vec![
            check("per_account", &[("header:x-account", "bob")]),
            bob_key(),
            bob_key(),
            bob_key(),
            bob_key(),
        ])
        .await
        .unwrap();
    let kinds: Vec<&str> = results.iter().map(|r| r.kind()).collect();
    assert_eq!(
        kinds,
        ["allowed", "allowed", "allowed", "allowed", "denied"],
        "{results:?}"
    );
    assert_eq!(results[0].remaining, 0);

    // 1,001 checks: INVALID_ARGUMENT, and none of them charged.
    let erin = || check("per_account", &[("header:x-account", "erin")]);
    let status = grpc.decide(vec![erin(); 1001]).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("1000"), "{status:?}");
    // A message over 1 MiB: OUT_OF_RANGE.
    let huge = check("per_account", &[("header:x-account", &"x".repeat(1 << 20))]);
    let status = grpc.decide(vec![huge]).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
    let results = grpc.decide(vec![erin()]).await.unwrap();
    assert_eq!(results[0].remaining, 2, "{results:?}");
    // 1,000 are one call.
    let results = grpc
        .decide(vec![check("per_key", &[("api_key", "sk_many")]); 1000])
        .await
        .unwrap();
    assert_eq!(results.iter().filter(|r| r.allowed).count(), 5);

    // Every call counted by result, apart from the JSON API's.
    let text = metrics_of(&http, &node).await;
    for (result, calls) in [("ok", 5.0), ("unauthorized", 2.0), ("bad_request", 2.0)] {
        let series =
            format!("ratemesh_admin_calls_total{{call=\"decide_grpc\",result=\"{result}\"}}");
        assert_eq!(metric(&text, &series), calls, "{series}");
    }
    assert_eq!(
        metric(
            &text,
            "ratemesh_admin_calls_total{call=\"decide\",result=\"ok\"}"
        ),
        1.0
    );

    // A client generated from `docs/decide.proto` by protoc (the Python example).
    python_example(grpc_addr);

    // SIGTERM: the gRPC port stops with the admin port and the node exits.
    signal(&node, libc::SIGTERM);
    let status = exit_of(&mut node, Duration::from_secs(15)).await;
    assert!(status.success(), "{status:?}");
    assert!(std::net::TcpStream::connect(grpc_addr).is_err());
}

/// Run `examples/decide_grpc_client.py` (python3 with grpcio and grpcio-tools) against the
/// node: skipped with a notice without them, unless `RATEMESH_REQUIRE_ENVOY_CLIENT=1` (the
/// same Python tools as the Envoy test's client) makes that a failure.
fn python_example(grpc: std::net::SocketAddr) {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/decide_grpc_client.py"
    );
    let run = |token: &str, args: &[&str]| {
        let output = Command::new("python3")
            .arg(script)
            .args(["--addr", &grpc.to_string()])
            .args(args)
            .env("RATEMESH_TOKEN", token)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&output.stdout).into_owned();
        let complained = String::from_utf8_lossy(&output.stderr).into_owned();
        (output.status.code(), said, complained)
    };
    match Command::new("python3").args([script, "--check"]).output() {
        Ok(output) if output.status.success() => {}
        other => {
            let why = match other {
                Ok(output) => String::from_utf8_lossy(&output.stderr).trim().to_string(),
                Err(error) => error.to_string(),
            };
            assert!(
                std::env::var("RATEMESH_REQUIRE_ENVOY_CLIENT").as_deref() != Ok("1"),
                "the gRPC example needs python3 with grpcio and grpcio-tools: {why}"
            );
            eprintln!("SKIPPED the Python gRPC example: {why}");
            return;
        }
    }
    let (code, said, complained) = run(TOKEN, &["per_account", "header:x-account=frank"]);
    assert_eq!(code, Some(0), "{said}{complained}");
    assert!(said.starts_with("allowed 2/3 left"), "{said}");
    let (code, said, _) = run(
        TOKEN,
        &["per_account", "header:x-account=frank", "--cost", "0"],
    );
    assert_eq!(code, Some(0));
    assert!(said.starts_with("allowed 2/3 left"), "{said}");
    let (code, said, _) = run(
        TOKEN,
        &["per_subject", "--jwt", r#"{"sub": "dan"}"#, "--cost", "2"],
    );
    assert_eq!(code, Some(1), "{said}");
    assert!(said.starts_with("denied"), "{said}");
    let (code, said, _) = run(TOKEN, &["nope"]);
    assert_eq!(code, Some(2));
    assert!(said.starts_with("unknown_policy"), "{said}");
    let (code, _, complained) = run("wrong-token", &["per_account", "header:x-account=frank"]);
    assert_eq!(code, Some(2));
    assert!(complained.starts_with("UNAUTHENTICATED"), "{complained}");
}

#[test]
fn bad_grpc_listen_is_refused_with_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster_with(dir.path(), 1, &policies(""));
    std::fs::write(
        dir.path().join("admin-tokens"),
        format!("billing {TOKEN}\n"),
    )
    .unwrap();
    let text = std::fs::read_to_string(&files[0]).unwrap();
    let http = text
        .lines()
        .find_map(|l| l.strip_prefix("http = "))
        .unwrap()
        .trim_matches('"')
        .to_string();
    let table = |grpc: &str| {
        format!(
            "{text}\n[admin]\nlisten = \"127.0.0.1:18090\"\ntoken_file = \"admin-tokens\"\n\
             grpc_listen = \"{grpc}\"\n"
        )
    };
    for (grpc, says) in [
        ("nowhere", "not an address"),
        ("127.0.0.1", "not an address"),
        (http.as_str(), "HTTP address"),
        ("127.0.0.1:18090", "admin port"),
        ("0.0.0.0:18090", "admin port"),
    ] {
        let with = table(grpc);
        let error = ratemesh::node::NodeFile::from_toml_str(&with, &files[0]).unwrap_err();
        assert_eq!(error.field, "admin.grpc_listen", "{error}");
        assert!(error.reason.contains(says), "{grpc}: {error}");
        let line = with
            .lines()
            .position(|l| l.starts_with("grpc_listen"))
            .unwrap()
            + 1;
        assert_eq!(error.line, line, "{error}");
        assert!(error.to_string().contains("node-1.toml"), "{error}");
    }
    let error = ratemesh::node::NodeFile::from_toml_str(
        &format!("{text}\n[admin]\nlisten = \"127.0.0.1:18090\"\ntoken_file = \"admin-tokens\"\ngrpc_listen = 8091\n"),
        &files[0],
    )
    .unwrap_err();
    assert!(error.to_string().contains("grpc_listen"), "{error}");
    ratemesh::node::NodeFile::from_toml_str(&table("127.0.0.1:18091"), &files[0]).unwrap();
}
