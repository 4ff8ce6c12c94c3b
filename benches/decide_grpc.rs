//! The decision API over gRPC on loopback (`cargo bench --bench decide_grpc`): a whole node
//! started in this process (`ratemesh::node::start`, its `[admin] grpc_listen` port), asked by
//! a tonic client over TCP on 127.0.0.1 for calls of 100 checks of a local policy (100
//! accounts, each allowed), one call at a time; p50 / p99 over 2000 calls after 200 to warm
//! up. Every call is logged at the node's default level (info), formatted into a sink. For
//! comparison, the same 100 checks decided in process (`Rules::decide_direct`, no transport).

#[path = "../tests/support/decide_grpc.rs"]
mod decide_grpc;

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::time::{Duration, Instant};

use decide_grpc::{DecideClient, check};
use ratemesh::config::GatewayConfig;
use ratemesh::http::RateLimitLayer;
use ratemesh::rules::Attributes;

const TOKEN: &str = "bench-0123456789abcdef0123456789abcdef";

/// A local policy no check of the benchmark exhausts.
const POLICIES: &str = r#"
default_tier = "all"
key_secret = "bench"
[policies.per_account]
algorithm = "token-bucket"
rate = 1000000000
period = "1s"
burst = 1000000
by = ["header:x-account"]
[tiers.all]
policies = ["per_account"]
"#;

const CHECKS: usize = 100;
const WARM_UP: usize = 200;
const CALLS: usize = 2000;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn report(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    println!(
        "{name:<52} p50 {:>7.3} ms   p99 {:>7.3} ms   ({} calls)",
        percentile(&samples, 0.5).as_secs_f64() * 1e3,
        percentile(&samples, 0.99).as_secs_f64() * 1e3,
        samples.len()
    );
}

fn free_tcp() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// Write a one-node cluster's files into `dir`; return the node file and the gRPC address.
fn write_node(dir: &std::path::Path) -> (std::path::PathBuf, SocketAddr) {
    let certs = ratemesh::net::certs::generate("bench", 1).unwrap();
    ratemesh::net::certs::write(&dir.join("certs"), &certs).unwrap();
    std::fs::write(dir.join("policies.toml"), POLICIES).unwrap();
    std::fs::write(dir.join("admin-tokens"), format!("bench {TOKEN}\n")).unwrap();
    let quic = UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (http, admin, grpc) = (free_tcp(), free_tcp(), free_tcp());
    let text = format!(
        "id = 1\nlisten = \"{quic}\"\nhttp = \"{http}\"\npolicy_file = \"policies.toml\"\n\n\
         [tls]\nca = \"certs/ca.pem\"\ncert = \"certs/node-1.pem\"\nkey = \"certs/node-1.key\"\n\n\
         [admin]\nlisten = \"{admin}\"\ntoken_file = \"admin-tokens\"\ngrpc_listen = \"{grpc}\"\n"
    );
    let path = dir.join("node-1.toml");
    std::fs::write(&path, text).unwrap();
    (path, grpc)
}

async fn grpc_calls(grpc: SocketAddr) -> Vec<Duration> {
    let mut client = DecideClient::connect(grpc, TOKEN).await;
    let checks: Vec<_> = (0..CHECKS)
        .map(|i| {
            check(
                "per_account",
                &[("header:x-account", &format!("account-{i}"))],
            )
        })
        .collect();
    let mut samples = Vec::with_capacity(CALLS);
    for call in 0..WARM_UP + CALLS {
        let start = Instant::now();
        let results = client.decide(checks.clone()).await.unwrap();
        let took = start.elapsed();
        assert!(results.len() == CHECKS && results.iter().all(|r| r.allowed));
        if call >= WARM_UP {
            samples.push(took);
        }
    }
    samples
}

async fn in_process(dir: &std::path::Path) -> Vec<Duration> {
    let config = GatewayConfig::from_file(dir.join("policies.toml")).unwrap();
    let layer = RateLimitLayer::new(config).unwrap();
    let rules = layer.rules();
    let attributes: Vec<Attributes> = (0..CHECKS)
        .map(|i| {
            let mut a = Attributes::new();
            a.insert("header:x-account".into(), format!("account-{i}").into());
            a
        })
        .collect();
    let mut samples = Vec::with_capacity(CALLS);
    for call in 0..WARM_UP + CALLS {
        let start = Instant::now();
        for a in &attributes {
            let decision = rules
                .decide_direct("per_account", a, 1, layer.now_ns())
                .await
                .unwrap();
            assert!(decision.is_allowed());
        }
        if call >= WARM_UP {
            samples.push(start.elapsed());
        }
    }
    samples
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` would pass nothing. Either way
    // this is a measurement, not a test.
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_writer(std::io::sink)
        .init();
    let dir = tempfile::tempdir().unwrap();
    let (file, grpc) = write_node(dir.path());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let file = ratemesh::node::NodeFile::from_file(&file).unwrap();
        let node = ratemesh::node::start(&file).await.unwrap();
        tokio::spawn(node.serve());
        report(
            "decide_grpc/100_checks_local (loopback, one call)",
            grpc_calls(grpc).await,
        );
        report(
            "decide_direct/100_checks_local (in process)",
            in_process(dir.path()).await,
        );
    });
    // The node is left serving: the process ends here.
    std::process::exit(0);
}
