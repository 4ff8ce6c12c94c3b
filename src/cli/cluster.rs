//! Local cluster processes for `ratemesh demo`: certificates and node files in a temporary
//! directory, one `ratemesh node` process per node on loopback, killed when dropped (also
//! on an error or Ctrl-C).

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// One node of the local cluster.
pub struct NodeProcess {
    /// Its id (1-based).
    pub id: u64,
    /// Its HTTP address.
    pub http: SocketAddr,
    config: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

/// The cluster's files and processes; dropping it kills every process it started.
pub struct LocalCluster {
    dir: Option<tempfile::TempDir>,
    dir_path: PathBuf,
    exe: PathBuf,
    /// The nodes, by id order.
    pub nodes: Vec<NodeProcess>,
}

/// Find `count` free loopback ports of each kind (UDP for QUIC, TCP for HTTP).
fn free_ports(count: usize) -> std::io::Result<(Vec<SocketAddr>, Vec<SocketAddr>)> {
    let udp: Vec<UdpSocket> = (0..count)
        .map(|_| UdpSocket::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()?;
    let tcp: Vec<TcpListener> = (0..count)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()?;
    let udp = udp
        .iter()
        .map(|s| s.local_addr())
        .collect::<Result<_, _>>()?;
    let tcp = tcp
        .iter()
        .map(|s| s.local_addr())
        .collect::<Result<_, _>>()?;
    Ok((udp, tcp))
}

impl LocalCluster {
    /// Write certificates, the policy file (`policies`) and one node file per node into a
    /// temporary directory: `nodes` members that list each other as peers, then `joiners`
    /// that no member lists, whose files name node 1 as their seed (they join the running
    /// cluster). Starts nothing.
    pub fn prepare(
        nodes: usize,
        joiners: usize,
        policies: &str,
    ) -> Result<LocalCluster, Box<dyn std::error::Error>> {
        let dir = tempfile::Builder::new()
            .prefix("ratemesh-demo-")
            .tempdir()?;
        let total = nodes + joiners;
        let certs = ratemesh::net::certs::generate("demo", total as u64)?;
        ratemesh::net::certs::write(&dir.path().join("certs"), &certs)?;
        std::fs::write(dir.path().join("policies.toml"), policies)?;
        let (quic, http) = free_ports(total)?;
        let mut out = Vec::new();
        for i in 0..total {
            let id = i as u64 + 1;
            let mut text = format!(
                "id = {id}\nlisten = \"{}\"\nhttp = \"{}\"\ngossip_interval = \"20ms\"\n\
                 policy_file = \"policies.toml\"\ndrain = \"1s\"\ndrain_grace = \"0s\"\n\n[tls]\n\
                 ca = \"certs/ca.pem\"\ncert = \"certs/node-{id}.pem\"\nkey = \"certs/node-{id}.key\"\n",
                quic[i], http[i]
            );
            if i < nodes {
                for (j, addr) in quic[..nodes].iter().enumerate().filter(|&(j, _)| j != i) {
                    text.push_str(&format!("\n[[peers]]\nid = {}\naddr = \"{addr}\"\n", j + 1));
                }
            } else {
                // Seeds go before the first table.
                text = format!("seeds = [\"{}\"]\n{text}", quic[0]);
            }
            let config = dir.path().join(format!("node-{id}.toml"));
            std::fs::write(&config, text)?;
            out.push(NodeProcess {
                id,
                http: http[i],
                config,
                log: dir.path().join(format!("node-{id}.log")),
                child: None,
            });
        }
        Ok(LocalCluster {
            dir_path: dir.path().to_path_buf(),
            dir: Some(dir),
            exe: std::env::current_exe()?,
            nodes: out,
        })
    }

    /// Return the directory holding the certificates, files and logs.
    pub fn dir(&self) -> &Path {
        &self.dir_path
    }

    /// Keep the directory when the cluster is dropped (it is deleted otherwise); return it.
    pub fn keep_files(&mut self) -> PathBuf {
        if let Some(dir) = self.dir.take() {
            let _ = dir.keep();
        }
        self.dir_path.clone()
    }

    /// Start node `index` (0-based) and wait until it prints that it listens.
    pub async fn start(&mut self, index: usize) -> Result<(), Box<dyn std::error::Error>> {
        let exe = self.exe.clone();
        let node = &mut self.nodes[index];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)?;
        let mut command = Command::new(exe);
        #[cfg(target_os = "linux")]
        // SAFETY: prctl is async-signal-safe; the closure touches nothing else. The child
        // then dies with the demo even if the demo itself is killed with SIGKILL.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = command
            .arg("node")
            .arg("--config")
            .arg(&node.config)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let ready = tokio::time::timeout(Duration::from_secs(20), async {
            while let Some(line) = lines.next_line().await? {
                if line.contains(" ready: ") {
                    return Ok::<bool, std::io::Error>(true);
                }
            }
            Ok(false)
        })
        .await;
        node.child = Some(child);
        match ready {
            Ok(Ok(true)) => Ok(()),
            _ => Err(format!(
                "node {} did not start; its log: {}",
                node.id,
                node.log.display()
            )
            .into()),
        }
    }

    /// Kill node `index` at once (SIGKILL: a crash, not a drain).
    pub async fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.nodes[index].child.take() {
            let _ = child.kill().await;
        }
    }

    /// Make node `index` leave for good: SIGTERM (it drains: hands its keys to their next
    /// owners and tells the others), then wait at most `limit` for it to exit; return how long
    /// it took and whether it exited cleanly, or `None` if it had to be killed.
    pub async fn leave(&mut self, index: usize, limit: Duration) -> Option<(Duration, bool)> {
        let mut child = self.nodes[index].child.take()?;
        let started = Instant::now();
        if let Some(pid) = child.id() {
            // SAFETY: sending a signal to our own child's pid has no memory effects.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGTERM);
            }
        }
        match tokio::time::timeout(limit, child.wait()).await {
            Ok(Ok(status)) => Some((started.elapsed(), status.success())),
            _ => {
                let _ = child.kill().await;
                None
            }
        }
    }

    /// Wait until node `index` answers `/health` with 200 (it admits); return how long
    /// that took, or `None` after `limit`.
    pub async fn wait_healthy(&self, index: usize, limit: Duration) -> Option<Duration> {
        let started = Instant::now();
        let url = format!("http://{}/health", self.nodes[index].http);
        let client = http_client(1);
        while started.elapsed() < limit {
            if let Ok(uri) = url.parse::<http::Uri>()
                && let Ok(Ok(response)) =
                    tokio::time::timeout(Duration::from_millis(500), client.get(uri)).await
                && response.status() == http::StatusCode::OK
            {
                return Some(started.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    /// Stop every node: SIGTERM first (they drain), SIGKILL after a second.
    pub async fn stop(&mut self) {
        for node in &mut self.nodes {
            if let Some(child) = &node.child
                && let Some(pid) = child.id()
            {
                // SAFETY: sending a signal to our own child's pid has no memory effects.
                unsafe {
                    libc::kill(pid as libc::pid_t, libc::SIGTERM);
                }
            }
        }
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take()
                && tokio::time::timeout(Duration::from_secs(2), child.wait())
                    .await
                    .is_err()
            {
                let _ = child.kill().await;
            }
        }
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(child) = node.child.as_mut() {
                let _ = child.start_kill();
            }
        }
    }
}

/// An HTTP/1.1 client for the nodes' HTTP ports: keep-alive, at most `idle` idle
/// connections per node address.
pub fn http_client(idle: usize) -> Client<HttpConnector, Empty<Bytes>> {
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(idle)
        .build_http()
}
