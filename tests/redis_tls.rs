//! The exact backend over TLS and through Sentinel, against real `redis-server` processes:
//! a `rediss://` server that asks for client certificates decides with the CA and client
//! certificate of `[redis.tls]`, and refuses a client without them or trusting another CA;
//! a `ratemesh node` does the same from its policy file; the primary that a Sentinel names
//! decides, and after the primary is killed and the Sentinel fails over, the new primary
//! decides and carries on the same count. Skipped with a notice without redis-server
//! (required with `RATEMESH_REQUIRE_REDIS=1`, as CI sets).

mod support;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ratemesh::backend::redis::{RedisConnection, RedisLimiter, redis_key};
use ratemesh::config::GatewayConfig;
use ratemesh::net::certs;

/// A redis-server (or Sentinel) process, killed when dropped.
struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn have_redis(name: &str) -> bool {
    let found = Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok();
    if !found {
        assert!(
            std::env::var("RATEMESH_REQUIRE_REDIS").as_deref() != Ok("1"),
            "redis-server is required (RATEMESH_REQUIRE_REDIS=1) but not on PATH"
        );
        eprintln!("SKIPPED: redis-server is not on PATH; install redis-server to run {name}");
    }
    found
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Start `redis-server` with `args` (its port is `port`) and wait until it accepts TCP.
fn redis(dir: &Path, port: u16, args: &[&str]) -> Server {
    let child = Command::new("redis-server")
        .args(args)
        .args([
            "--save",
            "",
            "--appendonly",
            "no",
            "--bind",
            "127.0.0.1",
            "--dir",
        ])
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let server = Server { child, port };
    wait_port(port);
    server
}

fn wait_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on port {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `redis-cli -p port args…`, its output.
fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A CA, a certificate for 127.0.0.1 and a client certificate, as files in `dir`; return
/// the CA's file.
fn tls_files(dir: &Path) -> PathBuf {
    let cluster = certs::generate("redis", 0).unwrap();
    let year = Duration::from_secs(365 * 86_400);
    let (server, server_key) =
        certs::issue("redis", &cluster.ca_key_pem, &["127.0.0.1".into()], year).unwrap();
    let (client, client_key) =
        certs::issue("redis", &cluster.ca_key_pem, &["gateway".into()], year).unwrap();
    for (name, text) in [
        ("ca.pem", &cluster.ca_cert_pem),
        ("server.pem", &server),
        ("server.key", &server_key),
        ("client.pem", &client),
        ("client.key", &client_key),
    ] {
        std::fs::write(dir.join(name), text).unwrap();
    }
    dir.join("ca.pem")
}

/// A TLS-only redis-server that asks every client for a certificate of the CA in `dir`.
fn tls_redis(dir: &Path) -> Server {
    let port = free_port();
    let file = |name: &str| dir.join(name).display().to_string();
    redis(
        dir,
        port,
        &[
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--tls-cert-file",
            &file("server.pem"),
            "--tls-key-file",
            &file("server.key"),
            "--tls-ca-cert-file",
            &file("ca.pem"),
            "--tls-auth-clients",
            "yes",
        ],
    )
}

/// A policy file at `dir/policies.toml` with `redis` (the `[redis]` section and what
/// follows it) and one Redis policy of 3 an hour; return it parsed.
fn config(dir: &Path, redis: &str) -> Result<GatewayConfig, String> {
    let text = format!(
        "env = \"test\"\nkey_secret = \"s\"\ndefault_tier = \"all\"\n\n\
         [policies.exact]\nalgorithm = \"sliding-log\"\nlimit = 3\nwindow = \"1h\"\n\
         backend = \"redis\"\nfail_mode = \"closed\"\n\n[tiers.all]\npolicies = [\"exact\"]\n\n{redis}"
    );
    let path = dir.join("policies.toml");
    std::fs::write(&path, &text).unwrap();
    GatewayConfig::from_toml_str(&text, &path.display().to_string()).map_err(|e| e.to_string())
}

/// The limiter of `config`'s Redis policy.
fn limiter(config: &GatewayConfig) -> RedisLimiter {
    let connection = RedisConnection::from_config(config.redis.as_ref().unwrap()).unwrap();
    let policy = config.redis_policies()[0].policy;
    RedisLimiter::new(connection, policy).unwrap()
}

/// Decide `n` requests of `key`; return how many were admitted (panics on an error).
async fn admitted(limiter: &RedisLimiter, key: &str, n: usize) -> usize {
    let mut admitted = 0;
    for _ in 0..n {
        admitted += usize::from(limiter.check(key, 1).await.unwrap().is_allowed());
    }
    admitted
}

#[tokio::test]
async fn a_rediss_server_decides_with_the_ca_and_client_certificate_of_redis_tls() {
    if !have_redis("a_rediss_server_decides_with_the_ca_and_client_certificate_of_redis_tls") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    tls_files(dir.path());
    let server = tls_redis(dir.path());
    let url = format!("rediss://127.0.0.1:{}", server.port);
    let good = config(
        dir.path(),
        &format!(
            "[redis]\nurl = \"{url}\"\ntimeout = \"2s\"\n\n[redis.tls]\nca = \"ca.pem\"\n\
             cert = \"client.pem\"\nkey = \"client.key\"\n"
        ),
    )
    .unwrap();
    let key = redis_key("test", "exact", "tenant", None);
    assert_eq!(admitted(&limiter(&good), &key, 5).await, 3);

    // Without the client certificate the server refuses the handshake; trusting only the
    // system's CAs, the client refuses the server's certificate.
    let no_client = config(
        dir.path(),
        &format!("[redis]\nurl = \"{url}\"\ntimeout = \"2s\"\n\n[redis.tls]\nca = \"ca.pem\"\n"),
    )
    .unwrap();
    let system_roots = config(
        dir.path(),
        &format!("[redis]\nurl = \"{url}\"\ntimeout = \"2s\"\n"),
    )
    .unwrap();
    for refused in [no_client, system_roots] {
        let error = limiter(&refused).check(&key, 1).await.unwrap_err();
        eprintln!("refused as expected: {error}");
    }
    // The count is the server's: still spent.
    assert_eq!(admitted(&limiter(&good), &key, 1).await, 0);

    // Bad `[redis.tls]` settings are refused with file, line and field.
    for (redis, want) in [
        (
            "[redis]\nurl = \"redis://127.0.0.1:1\"\n\n[redis.tls]\nca = \"ca.pem\"\n",
            "redis.tls",
        ),
        (
            &*format!("[redis]\nurl = \"{url}\"\n\n[redis.tls]\nca = \"missing.pem\"\n"),
            "redis.tls.ca",
        ),
        (
            &*format!("[redis]\nurl = \"{url}\"\n\n[redis.tls]\nca = \"client.key\"\n"),
            "redis.tls.ca",
        ),
        (
            &*format!("[redis]\nurl = \"{url}\"\n\n[redis.tls]\ncert = \"client.pem\"\n"),
            "redis.tls",
        ),
        (
            "[redis]\nsentinels = [\"redis://127.0.0.1:1\"]\n",
            "redis.master",
        ),
        (
            "[redis]\nsentinels = [\"redis://user:secret@127.0.0.1:1\"]\nmaster = \"m\"\n",
            "redis.sentinels",
        ),
    ] {
        let error = config(dir.path(), redis).unwrap_err();
        assert!(
            error.contains("policies.toml:") && error.contains(&format!("`{want}`")),
            "{want}: {error}"
        );
    }
}

#[tokio::test]
async fn the_primary_a_sentinel_names_decides_and_after_a_failover_the_new_one_carries_on() {
    if !have_redis(
        "the_primary_a_sentinel_names_decides_and_after_a_failover_the_new_one_carries_on",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (primary_port, replica_port, sentinel_port) = (free_port(), free_port(), free_port());
    let mut primary = Some(redis(
        dir.path(),
        primary_port,
        &["--port", &primary_port.to_string()],
    ));
    let replica_dir = dir.path().join("replica");
    std::fs::create_dir_all(&replica_dir).unwrap();
    let _replica = redis(
        &replica_dir,
        replica_port,
        &[
            "--port",
            &replica_port.to_string(),
            "--replicaof",
            "127.0.0.1",
            &primary_port.to_string(),
        ],
    );
    let sentinel_file = dir.path().join("sentinel.conf");
    std::fs::write(
        &sentinel_file,
        format!(
            "port {sentinel_port}\nbind 127.0.0.1\n\
             sentinel monitor main 127.0.0.1 {primary_port} 1\n\
             sentinel down-after-milliseconds main 500\n\
             sentinel failover-timeout main 3000\n"
        ),
    )
    .unwrap();
    let _sentinel = Server {
        child: Command::new("redis-server")
            .arg(&sentinel_file)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
        port: sentinel_port,
    };
    wait_port(sentinel_port);
    // The Sentinel knows the replica before it can fail over to it.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cli(sentinel_port, &["SENTINEL", "REPLICAS", "main"]).contains(&replica_port.to_string())
    {
        assert!(
            Instant::now() < deadline,
            "the Sentinel never saw the replica"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let config = config(
        dir.path(),
        &format!(
            "[redis]\nsentinels = [\"redis://127.0.0.1:{sentinel_port}\"]\nmaster = \"main\"\n\
             timeout = \"1s\"\n"
        ),
    )
    .unwrap();
    let limiter = limiter(&config);
    let key = redis_key("test", "exact", "tenant", None);
    assert_eq!(admitted(&limiter, &key, 2).await, 2);
    // Both writes reach the replica before the primary dies.
    assert_eq!(
        cli(primary_port, &["WAIT", "1", "5000"]),
        "1",
        "the replica did not acknowledge"
    );
    drop(primary.take());

    // Calls fail until the Sentinel promotes the replica; then the new primary decides,
    // with the count it was sent: one more, then none.
    let deadline = Instant::now() + Duration::from_secs(30);
    let first = loop {
        match limiter.check(&key, 1).await {
            Ok(decision) => break decision,
            Err(error) => {
                assert!(
                    Instant::now() < deadline,
                    "no decision 30 s after the primary died: {error}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert!(first.is_allowed(), "{first:?}");
    assert_eq!(admitted(&limiter, &key, 3).await, 0);
    assert!(
        cli(replica_port, &["ROLE"]).starts_with("master"),
        "the replica was not promoted"
    );
}

/// A `ratemesh node` whose Redis policy reaches a TLS-only server with `[redis.tls]`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_decides_a_redis_policy_over_tls() {
    use support::*;
    if !have_redis("a_node_decides_a_redis_policy_over_tls") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    tls_files(dir.path());
    let server = tls_redis(dir.path());
    let policy = policies("").replace("[tiers.api]\npolicies = [\"global\"]", "")
        + &format!(
            "\n[policies.exact]\nalgorithm = \"sliding-log\"\nlimit = 3\nwindow = \"1h\"\n\
             backend = \"redis\"\nfail_mode = \"closed\"\n\n[tiers.api]\npolicies = [\"exact\"]\n\n\
             [redis]\nurl = \"rediss://127.0.0.1:{}\"\ntimeout = \"2s\"\n\n[redis.tls]\n\
             ca = \"ca.pem\"\ncert = \"client.pem\"\nkey = \"client.key\"\n",
            server.port
        );
    let files = write_cluster_with(dir.path(), 1, &policy);
    let node = start(&files[0]);
    let client = client();
    wait_healthy(&client, &node).await;
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(status_of(&client, &node, "tenant").await);
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
}
