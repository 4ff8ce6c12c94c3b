//! Three mesh nodes in one process, on loopback, through the library (no daemon, no files):
//! one global limit per key held across them, with QUIC and mutual TLS between the nodes.
//!
//! ```sh
//! cargo run --release --example mesh_in_process
//! ```
//!
//! In a gateway each node runs in its own process; `ratemesh node` does all of this from a
//! node file. To put the mesh behind HTTP, give the node to the tower layer:
//! `RateLimitLayer::with_mesh(config, Arc::new(net))` decides the policy file's
//! `backend = "mesh"` policies on it.
//!
//! Cargo.toml:
//!
//! ```toml
//! ratemesh = { version = "0.1", default-features = false, features = ["quic"] }
//! tokio = { version = "1", features = ["rt-multi-thread", "macros"] }
//! ```

use std::time::{Duration, Instant};

use ratemesh::Policy;
use ratemesh::ids::KeyHasher;
use ratemesh::mesh::NodeConfig;
use ratemesh::net::certs::{self, ClusterCerts};
use ratemesh::net::node_tls;
use ratemesh::net::{MeshNet, NetConfig, transport_config};

/// Every key: a bucket of 300 tokens refilled at 5 per second, across the whole cluster.
fn global_policy() -> Policy {
    Policy::token_bucket(5, Duration::from_secs(1), 300).expect("a valid policy")
}

/// Keys travel between nodes as a keyed hash that is the same in every process: every node
/// of a cluster hashes with the same secret (a policy file's `key_secret`).
fn key(hasher: &KeyHasher, client: &str) -> u64 {
    hasher.key(&[b"example", client.as_bytes()])
}

async fn start(
    certs: &ClusterCerts,
    id: u64,
    members: &[u64],
) -> Result<MeshNet, Box<dyn std::error::Error>> {
    let (_, cert, key) = certs
        .nodes
        .iter()
        .find(|(n, _, _)| *n == id)
        .ok_or("no certificate")?;
    // Mutual TLS: this node's certificate, signed by the cluster CA, which is the only CA
    // whose certificates it accepts from peers.
    let tls = node_tls(
        certs.ca_cert_pem.as_bytes(),
        cert.as_bytes(),
        key.as_bytes(),
        transport_config(),
    )?;
    let mut node = NodeConfig::new(id, members.to_vec(), vec![global_policy()]);
    node.gossip_interval_ns = 20_000_000; // 20 ms
    let net = MeshNet::start(NetConfig {
        node,
        listen: "127.0.0.1:0".parse()?, // any free UDP port
        peers: Vec::new(),              // added below, once every node has its port
        tls,
    })
    .await?;
    Ok(net)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A cluster CA and certificates for nodes 1..=3 (`ratemesh certs` writes the same as files).
    let certs = certs::generate("example", 3)?;
    let members = [1, 2, 3];
    let mut nodes = Vec::new();
    for id in members {
        nodes.push(start(&certs, id, &members).await?);
    }
    for (i, a) in nodes.iter().enumerate() {
        for (j, b) in nodes.iter().enumerate() {
            if i != j {
                a.add_peer(members[j], b.local_addr());
            }
        }
    }
    // A node admits once it has heard its peers (after a restart: got its state back).
    let started = Instant::now();
    while !nodes.iter().all(MeshNet::is_running) {
        if started.elapsed() > Duration::from_secs(10) {
            return Err("the nodes did not connect within 10 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "3 nodes up in {} ms: {}",
        started.elapsed().as_millis(),
        nodes
            .iter()
            .map(|n| n.local_addr().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );

    // One client sends 900 requests, spread over the three nodes: the cluster admits its
    // limit once, not once per node.
    let hasher = KeyHasher::from_secret("example-cluster-secret");
    let tenant = key(&hasher, "tenant-42");
    let began = Instant::now();
    let mut admitted = [0u64; 3];
    for i in 0..900 {
        let node = i % 3;
        // At once from the node's lease of the key, or after asking the key's owner.
        if nodes[node].decide(0, tenant, 1).await.is_allowed() {
            admitted[node] += 1;
        }
    }
    let seconds = began.elapsed().as_secs_f64();
    println!(
        "tenant-42: 900 requests in {seconds:.2} s, admitted {} (node 1: {}, node 2: {}, node 3: {}); \
         the bucket allows 300 + 5/s = {:.0}",
        admitted.iter().sum::<u64>(),
        admitted[0],
        admitted[1],
        admitted[2],
        300.0 + 5.0 * seconds,
    );

    // Clients under their limit are admitted whichever node they reach.
    let mut fresh = 0;
    for client in 0..100 {
        let client = key(&hasher, &format!("client-{client}"));
        for node in &nodes {
            fresh += u64::from(node.decide(0, client, 1).await.is_allowed());
        }
    }
    println!("100 other clients, one request on each node: {fresh} of 300 admitted");

    let bytes: u64 = nodes
        .iter()
        .map(|n| {
            n.stats()
                .bytes_sent
                .load(std::sync::atomic::Ordering::Relaxed)
        })
        .sum();
    println!("gossip so far: {bytes} bytes sent by the three nodes");

    // A node that leaves hands its keys to the others first (`ratemesh node` does this on
    // SIGTERM); the other two carry on without waiting for a failure detector.
    let third = nodes.pop().expect("three nodes");
    third.leave().await;
    let newcomer = key(&hasher, "after-the-drain");
    let mut after = 0;
    for i in 0..10 {
        after += u64::from(nodes[i % 2].decide(0, newcomer, 1).await.is_allowed());
    }
    println!("node 3 left; nodes 1 and 2 admit a new client: {after} of 10");

    for node in nodes {
        node.shutdown().await;
    }
    Ok(())
}
