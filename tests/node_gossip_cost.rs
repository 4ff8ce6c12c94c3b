//! The simulator's gossip cost against real nodes: three `ratemesh node` processes on
//! loopback get the very requests `ratemesh simulate` generates for a workload (same
//! arrival times, nodes and keys), and the bytes of gossip they send per node per second
//! (`ratemesh_gossip_bytes_sent_total`) must agree with the simulator's
//! `gossip_bytes_per_node_per_s` for it within 25%.

mod support;

use std::time::Duration;

use ratemesh::Policy;
use ratemesh::sim::{self, SimConfig, Traffic};
use support::{client, metric, metrics_of, start, wait_healthy, write_cluster_with};

const NODES: usize = 3;

fn policy_file(limit: u64) -> String {
    format!(
        "env = \"test\"\nkey_secret = \"test-secret\"\ndefault_tier = \"api\"\n\n\
         [policies.global]\nalgorithm = \"sliding-window\"\nlimit = {limit}\nwindow = \"1s\"\n\
         backend = \"mesh\"\n\n[tiers.api]\npolicies = [\"global\"]\n"
    )
}

fn workload(keys: u64, demand: f64, seconds: u64) -> SimConfig {
    let mut c = SimConfig::new(Policy::sliding_window(100, Duration::from_secs(1)).unwrap());
    c.nodes = NODES;
    c.keys = keys;
    c.demand = demand;
    c.traffic = Traffic::Poisson;
    c.duration_ns = seconds * 1_000_000_000;
    // Loopback: well under a millisecond each way.
    c.latency_ns = 100_000;
    c.jitter_ns = 100_000;
    c.seed = 7;
    c
}

async fn gossip_bytes(client: &reqwest::Client, nodes: &[support::NodeProcess]) -> f64 {
    let mut total = 0.0;
    for node in nodes {
        total += metric(
            &metrics_of(client, node).await,
            "ratemesh_gossip_bytes_sent_total",
        );
    }
    total
}

/// Run `config`'s requests through real nodes; return their gossip bytes per node per second.
async fn real_cost(config: &SimConfig) -> (f64, usize) {
    let dir = tempfile::tempdir().unwrap();
    let files = write_cluster_with(dir.path(), NODES, &policy_file(config.policy.capacity()));
    let nodes: Vec<_> = files.iter().map(|f| start(f)).collect();
    let client = client();
    for node in &nodes {
        wait_healthy(&client, node).await;
    }
    let arrivals = sim::arrivals(config, &mut fastrand::Rng::with_seed(config.seed));
    let first = arrivals.first().map_or(0, |a| a.at_ns);
    let before = gossip_bytes(&client, &nodes).await;
    let start_at = tokio::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for a in &arrivals {
        tokio::time::sleep_until(start_at + Duration::from_nanos(a.at_ns - first)).await;
        let url = format!("http://{}/api/orders", nodes[a.node].http);
        let request = client.get(url).header("x-api-key", format!("k{}", a.key));
        tasks.spawn(async move { request.send().await.map(|r| r.status().as_u16()) });
        while let Some(done) = tasks.try_join_next() {
            done.unwrap().unwrap();
        }
    }
    tokio::time::sleep_until(start_at + Duration::from_nanos(config.duration_ns)).await;
    let after = gossip_bytes(&client, &nodes).await;
    let elapsed = start_at.elapsed().as_secs_f64();
    while let Some(done) = tasks.join_next().await {
        done.unwrap().unwrap();
    }
    ((after - before) / NODES as f64 / elapsed, arrivals.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulators_gossip_cost_matches_real_nodes_within_a_quarter() {
    // 300 keys each used about 5 times a second, spread over the three nodes (many keys,
    // each far under its limit: the case where gossip is the cost); then 30 keys at 40% of
    // their limit (fewer keys, each busier).
    for (keys, demand) in [(300, 0.05), (30, 0.4)] {
        let config = workload(keys, demand, 5);
        let simulated = sim::run(&config).gossip_bytes_per_node_per_s;
        let (real, requests) = real_cost(&config).await;
        let ratio = real / simulated;
        eprintln!(
            "{keys} keys, demand {demand}: {requests} requests; gossip per node: real {real:.0} B/s, \
             simulated {simulated:.0} B/s, ratio {ratio:.3}"
        );
        assert!(
            (0.75..=1.25).contains(&ratio),
            "{keys} keys at {demand}: real {real:.0} B/s against simulated {simulated:.0} B/s"
        );
    }
}
