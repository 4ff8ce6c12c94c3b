//! Gossip over real QUIC on loopback (`cargo bench --bench net`), two figures:
//! 1. the round trip of one gossip-sized datagram (1100 bytes) between two endpoints with the
//!    nodes' mutual-TLS configuration, echoed by the peer: p50 / p99 over 2000 trips;
//! 2. how long the first request of a fresh key waits on node A when node B owns the key
//!    (two `MeshNet` nodes, 20 ms gossip interval): A asks B and B grants, one round trip
//!    plus both nodes' processing; p50 / p99 over 300 fresh keys. Later requests of the key
//!    are decided from A's lease without any message.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ratemesh::Policy;
use ratemesh::mesh::NodeConfig;
use ratemesh::net::certs::{self, ClusterCerts};
use ratemesh::net::{MeshNet, NetConfig, transport_config};
use ratemesh::net::{NodeTls, node_tls};

fn tls(certs: &ClusterCerts, id: u64) -> NodeTls {
    let (_, cert, key) = certs.nodes.iter().find(|(n, _, _)| *n == id).unwrap();
    node_tls(
        certs.ca_cert_pem.as_bytes(),
        cert.as_bytes(),
        key.as_bytes(),
        transport_config(),
    )
    .unwrap()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn report(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    println!(
        "{name:<48} p50 {:>9.3} ms   p99 {:>9.3} ms   ({} samples)",
        percentile(&samples, 0.5).as_secs_f64() * 1e3,
        percentile(&samples, 0.99).as_secs_f64() * 1e3,
        samples.len()
    );
}

async fn datagram_round_trip(certs: &ClusterCerts) -> Vec<Duration> {
    let a = tls(certs, 1);
    let b = tls(certs, 2);
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let server = quinn::Endpoint::server(b.server, any).unwrap();
    let server_addr = server.local_addr().unwrap();
    let echo = tokio::spawn(async move {
        let connection = server.accept().await.unwrap().await.unwrap();
        while let Ok(bytes) = connection.read_datagram().await {
            if connection.send_datagram(bytes).is_err() {
                break;
            }
        }
    });
    let mut client = quinn::Endpoint::client(any).unwrap();
    client.set_default_client_config(a.client);
    let connection = client
        .connect(server_addr, &certs::node_name(2))
        .unwrap()
        .await
        .unwrap();
    let payload = Bytes::from(vec![7u8; 1100]);
    let mut samples = Vec::new();
    for i in 0..2100 {
        let start = Instant::now();
        connection.send_datagram(payload.clone()).unwrap();
        let Ok(Ok(_)) =
            tokio::time::timeout(Duration::from_secs(1), connection.read_datagram()).await
        else {
            continue; // lost on loopback: rare; not a sample
        };
        if i >= 100 {
            samples.push(start.elapsed());
        }
    }
    connection.close(0u32.into(), b"done");
    echo.abort();
    samples
}

async fn first_request_wait(certs: &ClusterCerts) -> Vec<Duration> {
    let policy = Policy::global_fixed_window(100_000, Duration::from_secs(3600)).unwrap();
    let mut nodes = Vec::new();
    for id in [1u64, 2] {
        let mut node = NodeConfig::new(id, vec![1, 2], vec![policy]);
        node.gossip_interval_ns = 20_000_000;
        nodes.push(
            MeshNet::start(NetConfig {
                node,
                listen: "127.0.0.1:0".parse().unwrap(),
                peers: Vec::new(),
                tls: tls(certs, id),
            })
            .await
            .unwrap(),
        );
    }
    nodes[0].add_peer(2, nodes[1].local_addr());
    nodes[1].add_peer(1, nodes[0].local_addr());
    while !(nodes[0].is_running() && nodes[1].is_running()) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut samples = Vec::new();
    let mut key = 0u64;
    while samples.len() < 300 {
        key += 1;
        if nodes[0].with_node(|n| n.owner_of(key)) != 2 {
            continue;
        }
        // Arrive at a random point of the gossip round, as real traffic does.
        tokio::time::sleep(Duration::from_micros(fastrand::u64(0..20_000))).await;
        let start = Instant::now();
        let decision = nodes[0].decide(0, key, 1).await;
        assert!(decision.is_allowed());
        samples.push(start.elapsed());
    }
    for node in nodes {
        node.shutdown().await;
    }
    samples
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` would pass nothing. Either way
    // this is a measurement, not a test.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let certs = certs::generate("bench", 2).unwrap();
    runtime.block_on(async {
        report(
            "net/datagram_round_trip (1100 B, loopback)",
            datagram_round_trip(&certs).await,
        );
        report(
            "net/first_request_wait (fresh key owned by the peer)",
            first_request_wait(&certs).await,
        );
    });
}
