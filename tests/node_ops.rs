//! Operating `ratemesh node` as real processes: SIGHUP reloads the policy file (or refuses
//! it and keeps serving), SIGTERM drains the way load balancers expect, identities are hashed
//! whole, and the HTTP server closes slow and idle connections and caps how many are open.

mod support;

use std::io::{Read, Write};
use std::process::Stdio;
use std::time::{Duration, Instant};

use ratemesh::node::NodeFile;
use support::*;

/// A mesh policy `global` and a local one `per_key` (5 per client), plus `extra`.
fn reload_policies(global_burst: u32, per_key_burst: &str, extra: bool) -> String {
    let mut text = format!(
        "env = \"test\"\nkey_secret = \"test-secret\"\ndefault_tier = \"api\"\n\n\
         [policies.global]\nalgorithm = \"token-bucket\"\nrate = 1\nperiod = \"1m\"\n\
         burst = {global_burst}\nbackend = \"mesh\"\n\n\
         [policies.per_key]\nalgorithm = \"token-bucket\"\nrate = 1\nperiod = \"1m\"\n\
         burst = {per_key_burst}\n\n"
    );
    if extra {
        text.push_str(
            "[policies.extra]\nalgorithm = \"token-bucket\"\nrate = 1\nperiod = \"1m\"\nburst = 100\n\n\
             [tiers.api]\npolicies = [\"global\", \"per_key\", \"extra\"]\n",
        );
    } else {
        text.push_str("[tiers.api]\npolicies = [\"global\", \"per_key\"]\n");
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_a_valid_policy_file_refuses_a_bad_one_and_never_stops_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster_with(dir.path(), 1, &reload_policies(1000, "5", false));
    let policy_path = dir.path().join("policies.toml");
    let log_path = dir.path().join("node.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut node = spawn_node(&files[0], Stdio::from(log));
    let client = client();
    wait_healthy(&client, &node).await;
    let text = metrics_of(&client, &node).await;
    let first_hash = config_hash(&text);
    assert_eq!(first_hash.len(), 64, "a SHA-256 in hex");
    assert!(text.contains("ratemesh_config_reloads_total{result=\"applied\"} 0"));
    for _ in 0..3 {
        assert_eq!(status_of(&client, &node, "a").await, 200);
    }

    // A valid file: applied; `per_key` is unchanged, so client `a` keeps its count (3 of 5).
    std::fs::write(&policy_path, reload_policies(1000, "5", true)).unwrap();
    signal(&node, libc::SIGHUP);
    let text = wait_metric_line(
        &client,
        &node,
        "ratemesh_config_reloads_total{result=\"applied\"} 1",
    )
    .await;
    let second_hash = config_hash(&text);
    assert_ne!(
        second_hash, first_hash,
        "the hash follows the file in force"
    );
    assert_eq!(status_of(&client, &node, "a").await, 200);
    assert_eq!(status_of(&client, &node, "a").await, 200);
    assert_eq!(status_of(&client, &node, "a").await, 429);
    let text = metrics_of(&client, &node).await;
    assert!(
        text.contains("ratemesh_decisions_total{policy=\"extra\",outcome=\"allowed\"}"),
        "the new policy decides:\n{text}"
    );

    // An invalid file: refused, logged with file, line and field; the old rules stay.
    let bad = reload_policies(1000, "\"many\"", true);
    let bad_line = bad.lines().position(|l| l.contains("\"many\"")).unwrap() + 1;
    std::fs::write(&policy_path, &bad).unwrap();
    signal(&node, libc::SIGHUP);
    let text = wait_metric_line(
        &client,
        &node,
        "ratemesh_config_reloads_total{result=\"refused\"} 1",
    )
    .await;
    assert_eq!(config_hash(&text), second_hash);
    assert_eq!(status_of(&client, &node, "a").await, 429);
    assert_eq!(status_of(&client, &node, "b").await, 200);

    // A file that changes a mesh policy's algorithm: refused, saying what to do (its limit
    // would change live: tests/node_live_limits.rs).
    let other_algorithm = reload_policies(1000, "5", true).replacen(
        "algorithm = \"token-bucket\"",
        "algorithm = \"gcra\"",
        1,
    );
    std::fs::write(&policy_path, other_algorithm).unwrap();
    signal(&node, libc::SIGHUP);
    let text = wait_metric_line(
        &client,
        &node,
        "ratemesh_config_reloads_total{result=\"refused\"} 2",
    )
    .await;
    assert_eq!(config_hash(&text), second_hash);
    assert!(
        node.child.try_wait().unwrap().is_none(),
        "a reload stopped the node"
    );
    assert_eq!(status_of(&client, &node, "c").await, 200);

    signal(&node, libc::SIGTERM);
    assert!(exit_of(&mut node, Duration::from_secs(10)).await.success());
    let log = std::fs::read_to_string(&log_path).unwrap();
    let located = format!("policies.toml:{bad_line}: `policies.per_key.burst`");
    assert!(log.contains(&located), "no `{located}` in the log:\n{log}");
    assert!(
        log.contains("its algorithm cannot change while the nodes run"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_503_on_health_while_still_serving_then_exits_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster(dir.path(), 1);
    edit_file(&files[0], |text| {
        text.replace("drain_grace = \"200ms\"", "drain_grace = \"4s\"")
    });
    let mut node = start(&files[0]);
    let client = client();
    wait_healthy(&client, &node).await;

    signal(&node, libc::SIGTERM);
    wait_health(&client, &node, 503).await;
    // Still serving during the grace, on kept-alive and on new connections.
    assert_eq!(status_of(&client, &node, "tenant-1").await, 200);
    let fresh = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    assert_eq!(status_of(&fresh, &node, "tenant-2").await, 200);
    let health = fresh
        .get(format!("http://{}/health", node.http))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 503);
    let body: serde_json::Value = health.json().await.unwrap();
    assert_eq!(body["draining"], true);

    let status = exit_of(&mut node, Duration::from_secs(15)).await;
    assert!(status.success(), "exit status {status}");
    assert!(
        std::net::TcpStream::connect(node.http).is_err(),
        "the port is closed after the drain"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_alive_connections_are_closed_when_the_grace_ends_not_at_the_drain_s_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster(dir.path(), 1);
    // Timeouts and a drain far longer than the test waits: only the stop signal can close
    // the idle connection in time.
    edit_file(&files[0], |text| {
        with_http_table(
            &text.replace("drain = \"2s\"", "drain = \"60s\""),
            "idle_timeout = \"60s\"\n",
        )
    });
    let mut node = start(&files[0]);
    let client = client();
    wait_healthy(&client, &node).await;
    let addr = node.http;
    let idle = tokio::task::spawn_blocking(move || {
        let mut idle = std::net::TcpStream::connect(addr).unwrap();
        assert_eq!(get_health(&mut idle), 200);
        idle
    })
    .await
    .unwrap();
    let started = Instant::now();
    signal(&node, libc::SIGTERM);
    tokio::task::spawn_blocking(move || {
        let mut idle = idle;
        wait_closed(&mut idle, Duration::from_secs(20));
    })
    .await
    .unwrap();
    let status = exit_of(&mut node, Duration::from_secs(20)).await;
    assert!(status.success(), "exit status {status}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the drain waited for the idle connection: {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_or_a_sigint_ends_the_drain_at_once() {
    let client = client();
    for second in [libc::SIGTERM, libc::SIGINT] {
        let dir = tempfile::tempdir().unwrap();
        let files = write_cluster(dir.path(), 1);
        // A grace far longer than the test waits: only the second signal can end it.
        edit_file(&files[0], |text| {
            text.replace("drain_grace = \"200ms\"", "drain_grace = \"10m\"")
        });
        let mut node = start(&files[0]);
        wait_healthy(&client, &node).await;
        signal(&node, libc::SIGTERM);
        wait_health(&client, &node, 503).await;
        signal(&node, second);
        let status = exit_of(&mut node, Duration::from_secs(15)).await;
        assert!(
            status.success(),
            "exit status {status} after signal {second}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identities_are_hashed_whole_and_overlong_ones_are_answered_431() {
    let one_per_key = "env = \"test\"\nkey_secret = \"test-secret\"\ndefault_tier = \"api\"\n\n\
                       [policies.per_key]\nalgorithm = \"token-bucket\"\nrate = 1\nperiod = \"1m\"\n\
                       burst = 1\n\n[tiers.api]\npolicies = [\"per_key\"]\n";
    let client = client();

    // A node with the default cap (4 KiB).
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster_with(dir.path(), 1, one_per_key);
    let node = start(&files[0]);
    wait_healthy(&client, &node).await;
    assert_eq!(status_of(&client, &node, &"k".repeat(4096)).await, 200);
    let url = format!("http://{}/api/orders", node.http);
    let response = client
        .get(&url)
        .header("x-api-key", "k".repeat(4097))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 431);
    assert_eq!(
        response.headers()["content-type"],
        "application/json",
        "a JSON body"
    );
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["error"], "identity_too_long");
    assert_eq!(body["max_bytes"], 4096);
    let text = metrics_of(&client, &node).await;
    assert_eq!(
        metric(
            &text,
            "ratemesh_requests_refused_total{reason=\"identity_too_long\"}"
        ),
        1.0
    );
    drop(node);

    // A node that takes 64 KiB keys: two that share their first 60,000 bytes are two clients.
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster_with(dir.path(), 1, one_per_key);
    edit_file(&files[0], |text| {
        with_http_table(text, "max_identity_bytes = 65536\n")
    });
    let node = start(&files[0]);
    wait_healthy(&client, &node).await;
    let prefix = "k".repeat(60_000);
    let (first, second) = (format!("{prefix}-1"), format!("{prefix}-2"));
    assert_eq!(status_of(&client, &node, &first).await, 200);
    assert_eq!(
        status_of(&client, &node, &second).await,
        200,
        "one bucket for two keys"
    );
    assert_eq!(status_of(&client, &node, &first).await, 429);
    assert_eq!(status_of(&client, &node, &"k".repeat(65_537)).await, 431);
}

#[test]
fn drain_grace_and_http_settings_are_checked_with_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster(dir.path(), 2);
    let good = std::fs::read_to_string(&files[0]).unwrap();
    let grace_line = good
        .lines()
        .position(|l| l.starts_with("drain_grace"))
        .unwrap()
        + 1;
    let check = |text: &str| {
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, text).unwrap();
        let error = NodeFile::from_file(&path).unwrap_err();
        assert!(error.file.ends_with("bad.toml"), "{error}");
        error
    };
    let error = check(&good.replace("drain_grace = \"200ms\"", "drain_grace = \"soon\""));
    assert_eq!(
        (error.line, error.field.as_str()),
        (grace_line, "drain_grace")
    );
    assert!(error.reason.contains("not a duration"), "{error}");
    let error = check(&good.replace("drain_grace = \"200ms\"", "drain_grace = \"2h\""));
    assert_eq!(
        (error.line, error.field.as_str()),
        (grace_line, "drain_grace")
    );
    assert!(error.reason.contains("at most"), "{error}");

    let with_http = |settings: &str| with_http_table(&good, settings);
    let text = with_http("max_identity_bytes = 0\n");
    let line = text
        .lines()
        .position(|l| l.starts_with("max_identity"))
        .unwrap()
        + 1;
    let error = check(&text);
    assert_eq!(
        (error.line, error.field.as_str()),
        (line, "http.max_identity_bytes")
    );
    let text = with_http("idle_timeout = \"1m\"\nheader_read_timeout = \"0s\"\n");
    let line = text
        .lines()
        .position(|l| l.starts_with("header_read"))
        .unwrap()
        + 1;
    let error = check(&text);
    assert_eq!(
        (error.line, error.field.as_str()),
        (line, "http.header_read_timeout")
    );
    let text = with_http("max_conections = 10\n");
    let line = text.lines().position(|l| l == "[http]").unwrap() + 1;
    let error = check(&text);
    assert_eq!((error.line, error.field.as_str()), (line, "http"));
    assert!(
        error.reason.contains("unknown field `max_conections`"),
        "{error}"
    );

    let ok = dir.path().join("ok.toml");
    let settings = "max_identity_bytes = 8192\nidle_timeout = \"90s\"\nmax_connections = 100\n";
    std::fs::write(&ok, with_http(settings)).unwrap();
    let file = NodeFile::from_file(&ok).unwrap();
    assert_eq!(file.http_settings.max_identity_bytes, 8192);
    assert_eq!(file.http_settings.idle_timeout, Duration::from_secs(90));
    assert_eq!(file.http_settings.max_connections, Some(100));
    assert_eq!(
        file.http_settings.header_read_timeout,
        Duration::from_secs(10)
    );
    assert_eq!(file.drain_grace, Duration::from_millis(200));
}

/// Read from `stream` until the node closes it (EOF or reset); panic after `limit`.
/// `ratemesh node --check-config FILE`: exit 0 and one line for a file a node starts with;
/// exit 1 and the file, line and field of what is wrong in the node file, the policy file,
/// the plans file or the certificates, and of a JWT key file the policies need; nothing
/// bound (the ports of the good file stay free).
#[test]
fn check_config_accepts_what_a_node_starts_with_and_names_the_file_line_and_field_of_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster(dir.path(), 2);
    let run = |file: &std::path::Path| {
        let out = std::process::Command::new(BIN)
            .args(["node", "--check-config"])
            .arg(file)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.code(), text)
    };
    let (code, text) = run(&files[0]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("node 1, 1 peers"), "{text}");
    // Nothing was bound: the node starts on its ports at once.
    drop(start(&files[0]));
    let good = std::fs::read_to_string(&files[0]).unwrap();
    let policies = std::fs::read_to_string(dir.path().join("policies.toml")).unwrap();
    let line =
        |text: &str, start: &str| text.lines().position(|l| l.starts_with(start)).unwrap() + 1;
    let bad = |name: &str, node: String, policy: Option<String>| {
        let node = match policy {
            Some(text) => {
                let file = format!("{name}-policies.toml");
                std::fs::write(dir.path().join(&file), text).unwrap();
                node.replace("policies.toml", &file)
            }
            None => node,
        };
        let path = dir.path().join(format!("{name}.toml"));
        std::fs::write(&path, node).unwrap();
        let (code, text) = run(&path);
        assert_eq!(code, Some(1), "{name}: {text}");
        text
    };
    // The node file: another node's certificate; a field of the wrong kind.
    let text = bad("cert", good.replace("node-1.pem", "node-2.pem"), None);
    assert!(
        text.contains(&format!("cert.toml:{}: `tls.cert`", line(&good, "cert =")))
            && text.contains("not the certificate of node 1"),
        "{text}"
    );
    let text = bad(
        "gossip",
        good.replace("gossip_interval = \"20ms\"", "gossip_interval = 20"),
        None,
    );
    assert!(
        text.contains(&format!(
            "gossip.toml:{}: `gossip_interval`",
            line(&good, "gossip_interval")
        )),
        "{text}"
    );
    // The policy file.
    let text = bad(
        "burst",
        good.clone(),
        Some(policies.replace("burst = 300", "burst = \"x\"")),
    );
    assert!(
        text.contains(&format!(
            "burst-policies.toml:{}: `policies.global.burst`",
            line(&policies, "burst")
        )),
        "{text}"
    );
    // Its plans file: a line that is not `api_key:HASH,TIER`.
    std::fs::write(
        dir.path().join("plans.csv"),
        "api_key:0123456789abcdef,api\nnot a line\n",
    )
    .unwrap();
    let text = bad(
        "plans",
        good.clone(),
        Some(policies.replace("default_tier", "plans_file = \"plans.csv\"\ndefault_tier")),
    );
    assert!(text.contains("plans.csv:2: `api_key`"), "{text}");
    // A JWT key file the policies need and that is missing: the start would refuse it.
    let jwt = policies.replace(
        "backend = \"mesh\"\n",
        "backend = \"mesh\"\n\n[policies.per_user]\nalgorithm = \"fixed-window\"\nlimit = 5\nwindow = \"1s\"\nby = [\"jwt:sub\"]\n",
    ).replace("policies = [\"global\"]", "policies = [\"global\", \"per_user\"]")
        + "\n[jwt]\nalgorithms = [\"ES256\"]\npublic_key_file = \"missing.pem\"\n";
    let text = bad("jwt", good.clone(), Some(jwt));
    assert!(
        text.contains("jwt-policies.toml") && text.contains("missing.pem"),
        "{text}"
    );
}

fn wait_closed(stream: &mut std::net::TcpStream, limit: Duration) {
    let deadline = Instant::now() + limit;
    stream
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return,
        }
        assert!(
            Instant::now() < deadline,
            "the node kept the connection open for {limit:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_request_heads_and_idle_keep_alive_connections_are_closed() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster(dir.path(), 1);
    edit_file(&files[0], |text| {
        with_http_table(
            text,
            "header_read_timeout = \"1s\"\nidle_timeout = \"2s\"\n",
        )
    });
    let node = start(&files[0]);
    let client = client();
    wait_healthy(&client, &node).await;
    let addr = node.http;
    tokio::task::spawn_blocking(move || {
        // A head sent a few bytes at a time, never finished: closed after the header time,
        // although bytes keep coming.
        let mut slow = std::net::TcpStream::connect(addr).unwrap();
        slow.write_all(b"GET /api/orders HTTP/1.1\r\nHost: x\r\n")
            .unwrap();
        slow.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut buf = [0u8; 1024];
        let closed = loop {
            if slow.write_all(b"X-Slow: 1\r\n").is_err() {
                break true;
            }
            match slow.read(&mut buf) {
                Ok(0) => break true,
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => break true,
            }
            if Instant::now() > deadline {
                break false;
            }
        };
        assert!(closed, "a slow head kept its connection for 20 s");

        // A connection that opens and sends nothing: closed after the header time.
        let mut silent = std::net::TcpStream::connect(addr).unwrap();
        wait_closed(&mut silent, Duration::from_secs(20));

        // A kept-alive connection with no next request: closed after the idle time.
        let mut idle = std::net::TcpStream::connect(addr).unwrap();
        idle.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut head = [0u8; 12];
        idle.read_exact(&mut head).unwrap();
        assert_eq!(&head, b"HTTP/1.1 200");
        wait_closed(&mut idle, Duration::from_secs(20));
    })
    .await
    .unwrap();
    let text = metrics_of(&client, &node).await;
    assert!(
        metric(
            &text,
            "ratemesh_http_connections_closed_total{reason=\"header_timeout\"}"
        ) >= 2.0,
        "{text}"
    );
    assert!(
        metric(
            &text,
            "ratemesh_http_connections_closed_total{reason=\"idle_timeout\"}"
        ) >= 1.0,
        "{text}"
    );
}

/// `GET /health` on a kept-alive connection; read the whole response, return its status.
fn get_health(stream: &mut std::net::TcpStream) -> u16 {
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .unwrap()
        .parse()
        .unwrap();
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).unwrap();
    head[9..12].parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_connection_cap_new_connections_wait_and_open_ones_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster(dir.path(), 1);
    edit_file(&files[0], |text| {
        with_http_table(text, "max_connections = 3\nheader_read_timeout = \"1m\"\n")
    });
    let node = start(&files[0]);
    let client = client();
    wait_healthy(&client, &node).await;
    drop(client); // its kept-alive connection would count against the cap

    // One kept-alive connection that is served, and two that hold their place.
    let addr = node.http;
    let mut served = std::net::TcpStream::connect(addr).unwrap();
    assert_eq!(get_health(&mut served), 200);
    let held: Vec<std::net::TcpStream> = (0..2)
        .map(|_| std::net::TcpStream::connect(addr).unwrap())
        .collect();

    // A fourth waits (the kernel queues it) while the three are open...
    let waiting = tokio::spawn(async move {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap();
        client
            .get(format!("http://{addr}/health"))
            .send()
            .await
            .map(|r| r.status().as_u16())
    });
    for _ in 0..3 {
        // ...and the established connection is still served meanwhile.
        assert_eq!(get_health(&mut served), 200);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        !waiting.is_finished(),
        "a connection beyond the cap was served while the cap was reached"
    );
    // One closes: the waiting connection is accepted and served.
    drop(held);
    assert_eq!(waiting.await.unwrap().unwrap(), 200);
    drop(served);
    let text = metrics_of(&support::client(), &node).await;
    assert!(
        metric(&text, "ratemesh_http_connection_cap_reached_total") >= 1.0,
        "{text}"
    );
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_soft_open_file_limit_is_raised_to_the_hard_limit_and_logged() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster(dir.path(), 1);
    let log_path = dir.path().join("node.log");
    let mut command = node_command(&files[0]);
    command
        .env("RUST_LOG", "info")
        .stderr(std::fs::File::create(&log_path).unwrap());
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        command.pre_exec(|| {
            let mut limit = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            limit.rlim_cur = limit.rlim_max.min(256);
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut node = spawn(command);
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", node.child.id())).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    // "Max open files  SOFT  HARD  files"
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields[3], fields[4], "{line}");
    signal(&node, libc::SIGTERM);
    assert!(exit_of(&mut node, Duration::from_secs(10)).await.success());
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(
        log.contains("raised the open-file limit") && log.contains("from=256"),
        "{log}"
    );
}
