//! The admin ports with mutual TLS (`[admin] client_ca`), on a `ratemesh node`: an operator's
//! certificate from `ratemesh certs --operator` names the caller (`ratemesh ctl --cert`, the
//! gRPC decision API); a certificate of another CA, no certificate, or plain HTTP is refused;
//! with a token file beside it, a call without a certificate needs a token; a `client_ca`
//! replaced on disk applies to the next connection.

mod support;

#[path = "support/decide_grpc.rs"]
mod decide_grpc;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use decide_grpc::{DecideClient, check};
use support::*;

const TOKEN: &str = "support-0123456789abcdef0123456789abcdef";

const POLICIES: &str = "env = \"test\"\nkey_secret = \"test-secret\"\ndefault_tier = \"api\"\n\n\
    [policies.per_account]\nalgorithm = \"fixed-window\"\nlimit = 3\nwindow = \"1m\"\n\
    by = [\"header:x-account\"]\n\n\
    [tiers.api]\npolicies = [\"per_account\"]\n";

/// `ratemesh` with `args` in `dir`, with `token` in `RATEMESH_TOKEN` if given.
fn ratemesh(dir: &Path, args: &[&str], token: Option<&str>) -> Output {
    let mut command = Command::new(BIN);
    command
        .current_dir(dir)
        .args(args)
        .env_remove("RATEMESH_TOKEN");
    if let Some(token) = token {
        command.env("RATEMESH_TOKEN", token);
    }
    command.output().unwrap()
}

/// `ratemesh certs ARGS` (words split at spaces) in `dir`.
fn certs(dir: &Path, args: &str) -> Output {
    let mut words = vec!["certs"];
    words.extend(args.split(' '));
    ratemesh(dir, &words, None)
}

/// `ratemesh ctl --admin ADDR [TLS flags] config`.
fn ctl_config(dir: &Path, admin: &str, tls: &[&str], token: Option<&str>) -> Output {
    let mut args = vec!["ctl", "--admin", admin];
    args.extend_from_slice(tls);
    args.push("config");
    ratemesh(dir, &args, token)
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_ports_take_client_certificates_of_their_ca() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let files = write_cluster_with(d, 1, POLICIES);
    // An operator's certificate of the cluster CA, and one of another CA.
    let made = certs(d, "--out certs --cluster test --operator alice");
    assert!(made.status.success(), "{}", text(&made));
    let other = certs(d, "--out other --cluster other --nodes 1");
    assert!(other.status.success(), "{}", text(&other));
    let made = certs(d, "--out other --cluster other --operator mallory");
    assert!(made.status.success(), "{}", text(&made));
    let bad = certs(d, "--out certs --cluster test --operator a/b");
    assert!(
        !bad.status.success() && text(&bad).contains("operator's name"),
        "{}",
        text(&bad)
    );

    std::fs::copy(d.join("certs/ca.pem"), d.join("operators-ca.pem")).unwrap();
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    };
    let (admin, grpc) = (free(), free());
    edit_file(&files[0], |t| {
        format!(
            "{t}\n[admin]\nlisten = \"{admin}\"\nclient_ca = \"operators-ca.pem\"\ngrpc_listen = \"{grpc}\"\n"
        )
    });
    let log = d.join("node.log");
    let mut command = node_command(&files[0]);
    command
        .env("RUST_LOG", "warn,ratemesh::admin=info")
        .stderr(std::fs::File::create(&log).unwrap());
    let node = spawn(command);
    let client = client();
    wait_healthy(&client, &node).await;
    let admin = admin.to_string();
    let alice = [
        "--ca",
        "certs/ca.pem",
        "--cert",
        "certs/operator-alice.pem",
        "--key",
        "certs/operator-alice.key",
    ];
    let mallory = [
        "--ca",
        "certs/ca.pem",
        "--cert",
        "other/operator-mallory.pem",
        "--key",
        "other/operator-mallory.key",
    ];

    // Alice's certificate names her; the node's own certificate (the cluster CA's) does too.
    let out = ctl_config(d, &admin, &alice, None);
    assert!(
        out.status.success() && text(&out).contains("per_account"),
        "{}",
        text(&out)
    );
    let node_cert = [
        "--ca",
        "certs/ca.pem",
        "--cert",
        "certs/node-1.pem",
        "--key",
        "certs/node-1.key",
    ];
    let out = ctl_config(d, &admin, &node_cert, None);
    assert!(out.status.success(), "{}", text(&out));
    // Another CA's certificate, no certificate (even with a token), plain HTTP: refused.
    let out = ctl_config(d, &admin, &mallory, None);
    assert!(!out.status.success(), "{}", text(&out));
    let out = ctl_config(d, &admin, &["--ca", "certs/ca.pem"], Some(TOKEN));
    assert!(!out.status.success(), "{}", text(&out));
    let out = ctl_config(d, &admin, &[], Some(TOKEN));
    assert!(!out.status.success(), "{}", text(&out));
    // A client that checks the node against another CA refuses the node.
    let out = ctl_config(
        d,
        &admin,
        &[
            "--ca",
            "other/ca.pem",
            "--cert",
            "certs/operator-alice.pem",
            "--key",
            "certs/operator-alice.key",
        ],
        None,
    );
    assert!(
        !out.status.success() && text(&out).contains("TLS"),
        "{}",
        text(&out)
    );

    // The gRPC decision API over the same TLS.
    let read = |p: &str| std::fs::read(d.join(p)).unwrap();
    let (ca, cert, key) = (
        read("certs/ca.pem"),
        read("certs/operator-alice.pem"),
        read("certs/operator-alice.key"),
    );
    let mut decide = DecideClient::connect_tls(grpc, &ca, Some((&cert, &key)))
        .await
        .unwrap();
    let results = decide
        .decide(vec![check("per_account", &[("header:x-account", "carol")])])
        .await
        .unwrap();
    assert!(results[0].allowed, "{results:?}");
    let (m_cert, m_key) = (
        read("other/operator-mallory.pem"),
        read("other/operator-mallory.key"),
    );
    let refused = match DecideClient::connect_tls(grpc, &ca, Some((&m_cert, &m_key))).await {
        Err(_) => true,
        Ok(mut client) => client
            .decide(vec![check("per_account", &[("header:x-account", "carol")])])
            .await
            .is_err(),
    };
    assert!(refused);

    // A client_ca replaced on disk: the next connection is checked against the new one.
    std::fs::copy(d.join("other/ca.pem"), d.join("operators-ca.pem")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let out = ctl_config(d, &admin, &mallory, None);
        if out.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new client_ca was not taken: {}",
            text(&out)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let out = ctl_config(d, &admin, &alice, None);
    assert!(!out.status.success(), "{}", text(&out));

    let metrics = metrics_of(&client, &node).await;
    assert!(
        metric(
            &metrics,
            "ratemesh_admin_calls_total{call=\"handshake\",result=\"unauthorized\"}"
        ) >= 3.0,
        "{metrics}"
    );
    assert_eq!(
        metric(
            &metrics,
            "ratemesh_admin_tls_reloads_total{result=\"applied\"}"
        ),
        1.0
    );
    drop(node);
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("alice (certificate)"), "{logged}");
    assert!(logged.contains("mallory (certificate)"), "{logged}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_token_file_too_a_call_without_a_certificate_needs_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let files = write_cluster_with(d, 1, POLICIES);
    let made = certs(d, "--out certs --cluster test --operator alice");
    assert!(made.status.success(), "{}", text(&made));
    std::fs::write(d.join("admin-tokens"), format!("support {TOKEN}\n")).unwrap();
    let admin = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    edit_file(&files[0], |t| {
        format!(
            "{t}\n[admin]\nlisten = \"{admin}\"\ntoken_file = \"admin-tokens\"\nclient_ca = \"certs/ca.pem\"\n"
        )
    });
    let node = start(&files[0]);
    wait_healthy(&client(), &node).await;
    let admin = admin.to_string();
    let alice = [
        "--ca",
        "certs/ca.pem",
        "--cert",
        "certs/operator-alice.pem",
        "--key",
        "certs/operator-alice.key",
    ];
    assert!(ctl_config(d, &admin, &alice, None).status.success());
    let out = ctl_config(d, &admin, &["--ca", "certs/ca.pem"], Some(TOKEN));
    assert!(out.status.success(), "{}", text(&out));
    let out = ctl_config(
        d,
        &admin,
        &["--ca", "certs/ca.pem"],
        Some("support-not-the-token-0123456789abcdef"),
    );
    assert!(
        !out.status.success() && text(&out).contains("401"),
        "{}",
        text(&out)
    );
    // Plain HTTP on a TLS port: no answer.
    let out = ctl_config(d, &admin, &[], Some(TOKEN));
    assert!(!out.status.success(), "{}", text(&out));
    drop(node);

    // Neither a token file nor a client_ca: the node file is refused, naming the table.
    edit_file(&files[0], |t| {
        t.replace(
            "token_file = \"admin-tokens\"\nclient_ca = \"certs/ca.pem\"\n",
            "",
        )
    });
    let out = ratemesh(
        d,
        &["node", "--check-config", files[0].to_str().unwrap()],
        None,
    );
    assert!(
        !out.status.success() && text(&out).contains("client_ca"),
        "{}",
        text(&out)
    );
    edit_file(&files[0], |t| format!("{t}client_ca = \"nope.pem\"\n"));
    let out = ratemesh(
        d,
        &["node", "--check-config", files[0].to_str().unwrap()],
        None,
    );
    assert!(
        !out.status.success() && text(&out).contains("admin.client_ca"),
        "{}",
        text(&out)
    );
}
