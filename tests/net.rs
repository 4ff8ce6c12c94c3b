//! Three mesh nodes over real QUIC with mutual TLS on loopback: the global limit holds
//! across them, and a node whose certificate comes from another CA is refused and changes
//! no counter.

use std::net::SocketAddr;
use std::time::Duration;

use ratemesh::Policy;
use ratemesh::mesh::node::NodeConfig;
use ratemesh::net::certs::{self, ClusterCerts};
use ratemesh::net::tls::node_tls;
use ratemesh::net::{MeshNet, NetConfig, transport_config};

fn policy() -> Policy {
    // A bucket of 300 that refills one token a minute: the test's admissions are its burst.
    Policy::token_bucket(1, Duration::from_secs(60), 300).unwrap()
}

async fn start(certs: &ClusterCerts, id: u64, members: &[u64]) -> MeshNet {
    start_on(certs, id, members, "127.0.0.1:0".parse().unwrap()).await
}

async fn start_on(certs: &ClusterCerts, id: u64, members: &[u64], listen: SocketAddr) -> MeshNet {
    try_start_on(certs, id, members, listen).await.unwrap()
}

async fn try_start_on(
    certs: &ClusterCerts,
    id: u64,
    members: &[u64],
    listen: SocketAddr,
) -> Result<MeshNet, ratemesh::net::NetError> {
    let (_, cert, key) = certs.nodes.iter().find(|(n, _, _)| *n == id).unwrap();
    let tls = node_tls(
        certs.ca_cert_pem.as_bytes(),
        cert.as_bytes(),
        key.as_bytes(),
        transport_config(),
    )
    .unwrap();
    let mut node = NodeConfig::new(id, members.to_vec(), vec![policy()]);
    node.gossip_interval_ns = 20_000_000;
    MeshNet::start(NetConfig {
        node,
        listen,
        peers: Vec::new(),
        tls,
    })
    .await
}

/// Certificates for nodes 1-3, their member list, and the three nodes (not yet connected).
async fn three_nodes() -> (ClusterCerts, [u64; 3], Vec<MeshNet>) {
    let certs = certs::generate("test", 3).unwrap();
    let members = [1, 2, 3];
    let mut nodes = Vec::new();
    for id in members {
        nodes.push(start(&certs, id, &members).await);
    }
    (certs, members, nodes)
}

async fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    for _ in 0..200 {
        if ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_hold_one_global_limit_and_refuse_another_ca() {
    let (_, _, nodes) = three_nodes().await;
    for a in &nodes {
        for (j, b) in nodes.iter().enumerate() {
            let id = j as u64 + 1;
            if a.local_addr() != b.local_addr() {
                a.add_peer(id, b.local_addr());
            }
        }
    }
    wait_until("every node to recover from its peers", || {
        nodes.iter().all(MeshNet::is_running)
    })
    .await;

    // 900 requests for one key, spread over the three nodes: the cluster admits at most the
    // burst (300; the refill is one token a minute) and, with the even split, all of it.
    let key = ratemesh::mesh::key_hash(b"test-cluster-key", b"tenant-42");
    let mut admitted = 0;
    for i in 0..900 {
        if nodes[i % 3].decide(0, key, 1).is_allowed() {
            admitted += 1;
        }
    }
    assert!(admitted <= 301, "admitted {admitted} of a global 300");
    assert!(admitted >= 290, "admitted only {admitted} of a global 300");

    // A node with a certificate from another CA is refused by the accepting side.
    let rogue_certs = certs::generate("rogue", 4).unwrap();
    let rogue = start(&rogue_certs, 4, &[1, 2, 3, 4]).await;
    let refused_before = nodes[0]
        .stats()
        .refused
        .load(std::sync::atomic::Ordering::Relaxed);
    rogue.add_peer(1, nodes[0].local_addr());
    wait_until("the rogue node to be refused", || {
        nodes[0]
            .stats()
            .refused
            .load(std::sync::atomic::Ordering::Relaxed)
            > refused_before
    })
    .await;
    // ...and nothing it could send reached the node.
    assert_eq!(
        nodes[0]
            .stats()
            .frames_dropped
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    for n in nodes {
        n.shutdown().await;
    }
    rogue.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_rejoins_and_gets_its_counts_back() {
    let (certs, members, mut nodes) = three_nodes().await;
    let addrs: Vec<SocketAddr> = nodes.iter().map(MeshNet::local_addr).collect();
    for (i, a) in nodes.iter().enumerate() {
        for (j, addr) in addrs.iter().enumerate() {
            if i != j {
                a.add_peer(j as u64 + 1, *addr);
            }
        }
    }
    wait_until("every node to recover", || {
        nodes.iter().all(MeshNet::is_running)
    })
    .await;
    let key = ratemesh::mesh::key_hash(b"test-cluster-key", b"tenant-7");
    let admitted = (0..200)
        .filter(|_| nodes[2].decide(0, key, 1).is_allowed())
        .count() as u64;
    assert!(
        (95..=100).contains(&admitted),
        "node 3 admitted {admitted} of its 100"
    );
    let slot = policy().window_of(ratemesh::clock::Clock::now_ns(&ratemesh::SystemClock::new()));
    wait_until("the peers to hold node 3's count", || {
        nodes[0].with_node(|n| n.counts(0, key, slot).map_or(0, |c| c.get(3))) >= admitted
    })
    .await;

    // Kill node 3 and start it again on the same address.
    let old = nodes.pop().unwrap();
    old.shutdown().await;
    // The old socket is released once its tasks have seen the shutdown.
    let mut attempt = 0;
    let restarted = loop {
        match try_start_on(&certs, 3, &members, addrs[2]).await {
            Ok(net) => break net,
            Err(e) if attempt < 40 => {
                attempt += 1;
                let _ = e;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("cannot restart node 3: {e}"),
        }
    };
    assert!(
        !restarted.decide(0, key, 1).is_allowed(),
        "admitted before recovering"
    );
    restarted.add_peer(1, addrs[0]);
    restarted.add_peer(2, addrs[1]);
    wait_until("node 3 to recover", || restarted.is_running()).await;
    let own = restarted.with_node(|n| n.counts(0, key, slot).map_or(0, |c| c.get(3)));
    assert!(own >= admitted, "node 3 got back {own} of {admitted}");
    // It restarted with an empty bucket: what it spent before the crash stays spent.
    assert!(!restarted.decide(0, key, 1).is_allowed());
    for n in nodes {
        n.shutdown().await;
    }
    restarted.shutdown().await;
}

/// A UDP relay between two nodes that can drop everything (a partition) and heal.
struct Relay {
    addr: SocketAddr,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    /// Relay datagrams sent to the returned address on to `target`, and the replies back.
    async fn start(target: SocketAddr) -> Relay {
        use std::sync::atomic::Ordering;
        let front = std::sync::Arc::new(tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap());
        let back = std::sync::Arc::new(tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap());
        back.connect(target).await.unwrap();
        let addr = front.local_addr().unwrap();
        let cut = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let client = std::sync::Arc::new(std::sync::Mutex::new(None::<SocketAddr>));
        let (f, b, c, k) = (front.clone(), back.clone(), client.clone(), cut.clone());
        let forward = tokio::spawn(async move {
            let mut buf = vec![0u8; 65536];
            while let Ok((n, from)) = f.recv_from(&mut buf).await {
                *c.lock().unwrap() = Some(from);
                if !k.load(Ordering::Relaxed) {
                    let _ = b.send(&buf[..n]).await;
                }
            }
        });
        let (f, b, c, k) = (front, back, client, cut.clone());
        let task = tokio::spawn(async move {
            let mut buf = vec![0u8; 65536];
            while let Ok(n) = b.recv(&mut buf).await {
                let to = *c.lock().unwrap();
                if let Some(to) = to
                    && !k.load(Ordering::Relaxed)
                {
                    let _ = f.send_to(&buf[..n], to).await;
                }
            }
            forward.abort();
        });
        Relay { addr, cut, task }
    }

    fn set_cut(&self, cut: bool) {
        self.cut.store(cut, std::sync::atomic::Ordering::Relaxed);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_stays_within_the_declared_bound_and_heals() {
    let (_, _, nodes) = three_nodes().await;
    // Every node reaches every other through its own relay, so links can be cut.
    let mut relays = Vec::new();
    for (i, a) in nodes.iter().enumerate() {
        for (j, b) in nodes.iter().enumerate() {
            if i != j {
                let relay = Relay::start(b.local_addr()).await;
                a.add_peer(j as u64 + 1, relay.addr);
                relays.push(((i, j), relay));
            }
        }
    }
    wait_until("every node to recover", || {
        nodes.iter().all(MeshNet::is_running)
    })
    .await;
    let key = ratemesh::mesh::key_hash(b"test-cluster-key", b"tenant-9");
    // Before the split each node holds a third of the burst of 300.
    let share_3 = nodes[2].with_node(|n| ratemesh::mesh::share::to_fraction(n.share(0, key)));

    // Cut node 3 off from nodes 1 and 2 (both directions).
    for ((i, j), relay) in &relays {
        if *i == 2 || *j == 2 {
            relay.set_cut(true);
        }
    }
    // Nodes 1 and 2 (a majority) declare node 3 dead after 10 silent rounds, and may then
    // take its share; node 3 (no majority) keeps its own.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let mut admitted = 0u64;
    for i in 0..1200 {
        if nodes[i % 3].decide(0, key, 1).is_allowed() {
            admitted += 1;
        }
    }
    eprintln!("admitted {admitted} of 300 during the partition");
    let bound = 300.0 * (1.0 + share_3.max(1.0 / 3.0)) + 1.0;
    assert!(
        admitted as f64 <= bound,
        "admitted {admitted} during the partition, bound {bound}"
    );
    assert!(admitted >= 290, "admitted only {admitted}");

    // Heal: every node gets every other node's counts.
    for (_, relay) in &relays {
        relay.set_cut(false);
    }
    let slot = policy().window_of(ratemesh::clock::Clock::now_ns(&ratemesh::SystemClock::new()));
    wait_until("the counters to converge after the heal", || {
        let views: Vec<Vec<u64>> = nodes
            .iter()
            .map(|n| {
                n.with_node(|node| {
                    (1..=3)
                        .map(|id| node.counts(0, key, slot).map_or(0, |c| c.get(id)))
                        .collect()
                })
            })
            .collect();
        views.windows(2).all(|w| w[0] == w[1])
    })
    .await;
    for n in nodes {
        n.shutdown().await;
    }
    for (_, relay) in relays {
        relay.task.abort();
    }
}
