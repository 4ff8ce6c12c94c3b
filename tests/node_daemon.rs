//! `ratemesh node` as real processes: three nodes on loopback hold one global limit through
//! their HTTP ports, serve `/metrics` and `/health`, drain on SIGTERM; bad node files are
//! refused with the file, the line and the field.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ratemesh::daemon::config::NodeFile;

const BIN: &str = env!("CARGO_BIN_EXE_ratemesh");

/// A node process, killed when dropped.
struct NodeProcess {
    child: Child,
    http: SocketAddr,
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn policies(extra: &str) -> String {
    // 300 tokens, refilled one a minute: what the test admits is the burst, cluster-wide.
    format!(
        "env = \"test\"\nkey_secret = \"test-secret\"\ndefault_tier = \"api\"\n\n\
         [policies.global]\nalgorithm = \"token-bucket\"\nrate = 1\nperiod = \"1m\"\nburst = 300\n\
         backend = \"mesh\"\n{extra}\n[tiers.api]\npolicies = [\"global\"]\n"
    )
}

/// Write certificates, the policy file and `n` node files into `dir`; return the files.
fn write_cluster(dir: &Path, n: usize) -> Vec<std::path::PathBuf> {
    let certs = ratemesh::net::certs::generate("test", n as u64).unwrap();
    ratemesh::net::certs::write(&dir.join("certs"), &certs).unwrap();
    std::fs::write(dir.join("policies.toml"), policies("")).unwrap();
    let udp: Vec<UdpSocket> = (0..n)
        .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
        .collect();
    let tcp: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let quic: Vec<SocketAddr> = udp.iter().map(|s| s.local_addr().unwrap()).collect();
    let http: Vec<SocketAddr> = tcp.iter().map(|s| s.local_addr().unwrap()).collect();
    drop((udp, tcp));
    (0..n)
        .map(|i| {
            let id = i + 1;
            let mut text = format!(
                "id = {id}\nlisten = \"{}\"\nhttp = \"{}\"\ngossip_interval = \"20ms\"\n\
                 policy_file = \"policies.toml\"\ndrain = \"2s\"\n\n[tls]\nca = \"certs/ca.pem\"\n\
                 cert = \"certs/node-{id}.pem\"\nkey = \"certs/node-{id}.key\"\n",
                quic[i], http[i]
            );
            for (j, addr) in quic.iter().enumerate().filter(|&(j, _)| j != i) {
                text.push_str(&format!("\n[[peers]]\nid = {}\naddr = \"{addr}\"\n", j + 1));
            }
            let path = dir.join(format!("node-{id}.toml"));
            std::fs::write(&path, text).unwrap();
            path
        })
        .collect()
}

/// Start `ratemesh node --config file` and wait for its ready line.
fn start(file: &Path) -> NodeProcess {
    let mut child = Command::new(BIN)
        .args(["node", "--config"])
        .arg(file)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains(" ready: "), "unexpected first line: {line:?}");
    let http = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("http="))
        .unwrap()
        .parse()
        .unwrap();
    NodeProcess { child, http }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

async fn wait_healthy(client: &reqwest::Client, node: &NodeProcess) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let url = format!("http://{}/health", node.http);
        if let Ok(response) = client.get(&url).send().await
            && response.status() == 200
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node at {} never healthy",
            node.http
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn metrics_of(client: &reqwest::Client, node: &NodeProcess) -> String {
    let url = format!("http://{}/metrics", node.http);
    client.get(url).send().await.unwrap().text().await.unwrap()
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name) && !l.starts_with('#'))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no metric {name} in:\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_node_processes_hold_one_limit_and_drain_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster(dir.path(), 3);
    let mut nodes: Vec<NodeProcess> = files.iter().map(|f| start(f)).collect();
    let client = client();
    for node in &nodes {
        wait_healthy(&client, node).await;
    }

    // 600 requests of one client, spread over the three nodes, 12 at a time.
    let mut admitted = 0u64;
    let mut limited = 0u64;
    for round in 0..50 {
        let mut batch = Vec::new();
        for k in 0..12 {
            let node = &nodes[(round + k) % 3];
            let url = format!("http://{}/api/orders", node.http);
            let request = client.get(url).header("x-api-key", "tenant-1");
            batch.push(tokio::spawn(async move { request.send().await }));
        }
        for task in batch {
            let response = task.await.unwrap().unwrap();
            match response.status().as_u16() {
                200 => admitted += 1,
                429 => {
                    limited += 1;
                    assert!(response.headers().contains_key("retry-after"));
                    assert!(response.headers().contains_key("ratelimit-policy"));
                }
                other => panic!("unexpected status {other}"),
            }
        }
    }
    assert_eq!(admitted + limited, 600);
    assert!(admitted <= 300, "admitted {admitted} over the global 300");
    assert!(admitted >= 270, "admitted only {admitted} of the 300");

    // Another client has its own 300.
    let url = format!("http://{}/api/orders", nodes[0].http);
    let other = client
        .get(&url)
        .header("x-api-key", "tenant-2")
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 200);

    let metrics = metrics_of(&client, &nodes[0]).await;
    assert_eq!(metric(&metrics, "ratemesh_peers_up"), 2.0);
    assert_eq!(metric(&metrics, "ratemesh_node_running"), 1.0);
    assert_eq!(metric(&metrics, "ratemesh_majority"), 1.0);
    assert!(metric(&metrics, "ratemesh_gossip_bytes_sent_total") > 0.0);
    assert!(metric(&metrics, "ratemesh_gossip_messages_received_total") > 0.0);
    assert!(metrics.contains("ratemesh_decisions_total{policy=\"global\",outcome=\"allowed\"}"));
    assert!(metrics.contains("ratemesh_gossip_dropped_frames_total"));

    // SIGTERM: the node drains and exits cleanly; the others see a peer go.
    let pid = nodes[2].child.id();
    // SAFETY: signalling our own child process.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) }, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = nodes[2].child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "node did not stop on SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "exit status {status}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = metrics_of(&client, &nodes[0]).await;
        if metric(&text, "ratemesh_peers_up") == 1.0 {
            assert_eq!(metric(&text, "ratemesh_majority"), 1.0);
            break;
        }
        assert!(Instant::now() < deadline, "node 1 still counts 2 peers up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The node handed its keys over as it left: the two others admit a fresh client at once.
    for node in &nodes[..2] {
        let url = format!("http://{}/api/orders", node.http);
        let response = client
            .get(&url)
            .header("x-api-key", "tenant-3")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }
    nodes.truncate(2);
}

#[test]
fn a_bad_node_file_is_refused_with_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster(dir.path(), 2);
    let good = std::fs::read_to_string(&files[0]).unwrap();
    let check = |text: &str, field: &str, reason: &str| {
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, text).unwrap();
        let error = NodeFile::from_file(&path).unwrap_err();
        assert_eq!(error.field, field, "{error}");
        assert!(error.reason.contains(reason), "{error}");
        assert!(error.file.ends_with("bad.toml"), "{error}");
        // The binary refuses to start with the same message.
        let output = Command::new(BIN)
            .args(["node", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(&error.to_string()), "{stderr}");
        error
    };
    let error = check(&good.replace("id = 1\n", "id = 0\n"), "id", "start at 1");
    assert_eq!(error.line, 1);
    check(
        &good.replace("listen = \"127.0.0.1:", "listen = \"localhost-"),
        "listen",
        "not an address",
    );
    let error = check(
        &good.replace(
            "gossip_interval = \"20ms\"",
            "gossip_interval = \"20 parsecs\"",
        ),
        "gossip_interval",
        "not a duration",
    );
    assert_eq!(error.line, 4);
    check(
        &good.replace("gossip_interval = \"20ms\"", "gossip_interval = \"1h\""),
        "gossip_interval",
        "between",
    );
    check(
        &good.replace("certs/node-1.key", "certs/missing.key"),
        "tls.key",
        "no file",
    );
    check(
        &good.replace("[[peers]]\nid = 2", "[[peers]]\nid = 1"),
        "peers[0].id",
        "this node",
    );
    check(&format!("speed = 3\n{good}"), "speed", "unknown field");

    // Another node's certificate: refused at start, naming the field.
    let path = dir.path().join("swapped.toml");
    std::fs::write(&path, good.replace("certs/node-1.", "certs/node-2.")).unwrap();
    let file = NodeFile::from_file(&path).unwrap();
    let error = file.load_tls().unwrap_err();
    assert_eq!(error.field, "tls.cert", "{error}");
    assert!(
        error.reason.contains("not the certificate of node 1"),
        "{error}"
    );

    // The policy file's own errors name the policy file.
    std::fs::write(
        dir.path().join("policies.toml"),
        policies("").replace("token-bucket", "sliding-log").replace(
            "rate = 1\nperiod = \"1m\"\nburst = 300",
            "limit = 300\nwindow = \"1m\"",
        ),
    )
    .unwrap();
    let error = NodeFile::from_file(&files[0]).unwrap_err();
    assert!(error.file.ends_with("policies.toml"), "{error}");
    assert_eq!(error.field, "policies.global.algorithm", "{error}");
}
