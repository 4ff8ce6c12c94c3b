//! What the tests of `ratemesh node` share: a cluster's files on loopback, node processes
//! (killed when dropped), and reading their `/health` and `/metrics`.

// Each test crate uses a different part of these helpers.
#![allow(dead_code)]

pub mod login;
pub mod upstream;
pub mod window;

/// `text` (a policy file) with every `window = "…"` of a minute or more written as a length of
/// about as much whose window has at least half its length left ([`window::window_with_room`]): the
/// node's fixed windows are aligned to the UNIX epoch, so an hour-long window written as
/// `"1h"` ends at the top of every hour, in the middle of a test run then.
pub fn with_room(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("window = \"") {
        let (head, tail) = rest.split_at(at + "window = \"".len());
        out.push_str(head);
        let end = tail.find('"').expect("a closed string");
        let written = &tail[..end];
        match humantime::parse_duration(written) {
            Ok(length) if length >= Duration::from_secs(60) => {
                let length = window::window_with_room(length);
                out.push_str(&format!("{}s", length.as_secs()));
            }
            _ => out.push_str(written),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_ratemesh");

/// A node process, killed when dropped.
pub struct NodeProcess {
    pub child: Child,
    pub http: SocketAddr,
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn policies(extra: &str) -> String {
    // 300 tokens, refilled one a minute: what the test admits is the burst, cluster-wide.
    format!(
        "env = \"test\"\nkey_secret = \"test-secret\"\ndefault_tier = \"api\"\n\n\
         [policies.global]\nalgorithm = \"token-bucket\"\nrate = 1\nperiod = \"1m\"\nburst = 300\n\
         backend = \"mesh\"\n{extra}\n[tiers.api]\npolicies = [\"global\"]\n"
    )
}

/// Write certificates, the policy file and `n` node files into `dir`; return the files.
pub fn write_cluster(dir: &Path, n: usize) -> Vec<std::path::PathBuf> {
    write_cluster_with(dir, n, &policies(""))
}

/// Write certificates, `policy_text` as the policy file and `n` node files into `dir`.
///
/// A request waits up to a second for its key's owner (`mesh_max_wait`, 100 ms by default):
/// a test that counts every admission must not see a denial because the machine was too busy
/// to answer within 100 ms. A test of the default removes the line. Windows of a minute or
/// more are written with room ([`with_room`]).
pub fn write_cluster_with(dir: &Path, n: usize, policy_text: &str) -> Vec<std::path::PathBuf> {
    let certs = ratemesh::net::certs::generate("test", n as u64).unwrap();
    ratemesh::net::certs::write(&dir.join("certs"), &certs).unwrap();
    std::fs::write(dir.join("policies.toml"), with_room(policy_text)).unwrap();
    let (quic, http) = node_addrs(n);
    (0..n)
        .map(|i| {
            let id = i + 1;
            let mut text = format!(
                "id = {id}\nlisten = \"{}\"\nhttp = \"{}\"\ngossip_interval = \"20ms\"\n\
                 mesh_max_wait = \"1s\"\npolicy_file = \"policies.toml\"\ndrain = \"2s\"\ndrain_grace = \"200ms\"\n\n[tls]\nca = \"certs/ca.pem\"\n\
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

/// Loopback addresses for `n` nodes' QUIC (UDP) and HTTP (TCP) listeners, on ports below
/// the kernel's ephemeral range, each free when chosen: a port left free while its node
/// restarts is never handed meanwhile to a socket bound to port 0 (a relay's, a client's,
/// another test's).
pub fn node_addrs(n: usize) -> (Vec<SocketAddr>, Vec<SocketAddr>) {
    use std::hash::{BuildHasher, Hasher};
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (from, to) = (10_000u16, low.max(12_000));
    let pick = || {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u8(0);
        from + (h.finish() % u64::from(to - from)) as u16
    };
    let mut udp = Vec::new();
    let mut tcp = Vec::new();
    while udp.len() < n {
        if let Ok(s) = UdpSocket::bind(("127.0.0.1", pick())) {
            udp.push(s);
        }
    }
    while tcp.len() < n {
        if let Ok(s) = TcpListener::bind(("127.0.0.1", pick())) {
            tcp.push(s);
        }
    }
    let quic = udp.iter().map(|s| s.local_addr().unwrap()).collect();
    let http = tcp.iter().map(|s| s.local_addr().unwrap()).collect();
    (quic, http)
}

/// Start `ratemesh node --config file` and wait for its ready line.
pub fn start(file: &Path) -> NodeProcess {
    spawn_node(file, Stdio::inherit())
}

/// Start a node whose log (stderr) goes to `stderr`, and wait for its ready line.
pub fn spawn_node(file: &Path, stderr: Stdio) -> NodeProcess {
    let mut command = node_command(file);
    command.stderr(stderr);
    spawn(command)
}

/// The command that runs a node from `file`, logging warnings and errors.
pub fn node_command(file: &Path) -> Command {
    let mut command = Command::new(BIN);
    command
        .args(["node", "--config"])
        .arg(file)
        .env("RUST_LOG", "warn");
    command
}

/// Run `command` (a [`node_command`]) and wait for the node's ready line.
pub fn spawn(mut command: Command) -> NodeProcess {
    let mut child = command.stdout(Stdio::piped()).spawn().unwrap();
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

/// An HTTP client with a 5 s timeout.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

pub async fn wait_healthy(client: &reqwest::Client, node: &NodeProcess) {
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

pub async fn metrics_of(client: &reqwest::Client, node: &NodeProcess) -> String {
    let url = format!("http://{}/metrics", node.http);
    client.get(url).send().await.unwrap().text().await.unwrap()
}

/// The node's metrics, or the error that kept them (a node too busy to answer in time).
pub async fn try_metrics_of(
    client: &reqwest::Client,
    node: &NodeProcess,
) -> Result<String, reqwest::Error> {
    let url = format!("http://{}/metrics", node.http);
    client.get(url).send().await?.text().await
}

/// Tell whether checks of speed (throughput floors, a loaded machine's failure detector)
/// run: only with `RATEMESH_TIMED_CHECKS=1`, on a quiet machine (not in CI, where another
/// build may share the CPU). Their figures are printed either way.
pub fn timed_checks() -> bool {
    std::env::var("RATEMESH_TIMED_CHECKS").is_ok_and(|v| v == "1")
}

pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name) && !l.starts_with('#'))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no metric {name} in:\n{text}"))
}

/// Send one request of `api_key` to `node`; return its status.
pub async fn status_of(client: &reqwest::Client, node: &NodeProcess, api_key: &str) -> u16 {
    let url = format!("http://{}/api/orders", node.http);
    let response = client
        .get(url)
        .header("x-api-key", api_key)
        .send()
        .await
        .unwrap();
    response.status().as_u16()
}

/// The resident memory of process `pid`, in KiB (`None` once it is gone).
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Send `signal` to `node`.
pub fn signal(node: &NodeProcess, signal: libc::c_int) {
    // SAFETY: signalling our own child process.
    assert_eq!(
        unsafe { libc::kill(node.child.id() as libc::pid_t, signal) },
        0
    );
}

/// Wait (at most `limit`) for `node` to exit; return its status.
pub async fn exit_of(node: &mut NodeProcess, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = node.child.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "node still running after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Poll `/metrics` until `line` (a full series, e.g. `name{label="x"} 1`) appears.
pub async fn wait_metric_line(client: &reqwest::Client, node: &NodeProcess, line: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = metrics_of(client, node).await;
        if text.lines().any(|l| l == line) {
            return text;
        }
        assert!(Instant::now() < deadline, "no `{line}` in:\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The `hash` label of `ratemesh_config_info`.
pub fn config_hash(text: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix("ratemesh_config_info{hash=\""))
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("no ratemesh_config_info in:\n{text}"))
        .to_string()
}

/// Poll `/health` until it answers `status`.
pub async fn wait_health(client: &reqwest::Client, node: &NodeProcess, status: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let url = format!("http://{}/health", node.http);
    loop {
        if let Ok(response) = client.get(&url).send().await
            && response.status() == status
        {
            return;
        }
        assert!(Instant::now() < deadline, "/health never answered {status}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Move the node file's `http = "ADDR"` line into an `[http]` table with `settings`.
pub fn with_http_table(node_file: &str, settings: &str) -> String {
    let http_line = node_file
        .lines()
        .find(|l| l.starts_with("http = "))
        .unwrap();
    let addr = http_line.trim_start_matches("http = ");
    format!(
        "{}\n[http]\naddr = {addr}\n{settings}",
        node_file.replace(&format!("{http_line}\n"), "")
    )
}

/// Rewrite the node file at `path` with `edit`.
pub fn edit_file(path: &Path, edit: impl FnOnce(&str) -> String) {
    let text = std::fs::read_to_string(path).unwrap();
    std::fs::write(path, edit(&text)).unwrap();
}

/// One call to an admin port with a bearer token: its status and JSON answer.
pub async fn admin_call(
    client: &reqwest::Client,
    admin: SocketAddr,
    token: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    let mut request = client
        .request(method, format!("http://{admin}{path}"))
        .bearer_auth(token);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

/// Give the nodes of `files` (those picked by `with_admin`) an `[admin]` port on loopback
/// with a token file of one caller, `support`, whose token is `token`; return each picked
/// node's admin address, in order.
pub fn add_admin(
    dir: &Path,
    files: &[std::path::PathBuf],
    with_admin: impl Fn(usize) -> bool,
    token: &str,
) -> Vec<SocketAddr> {
    std::fs::write(dir.join("admin-tokens"), format!("support {token}\n")).unwrap();
    let mut addrs = Vec::new();
    for (_, file) in files.iter().enumerate().filter(|&(i, _)| with_admin(i)) {
        let addr = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        edit_file(file, |t| {
            format!("{t}\n[admin]\nlisten = \"{addr}\"\ntoken_file = \"admin-tokens\"\n")
        });
        addrs.push(addr);
    }
    addrs
}
