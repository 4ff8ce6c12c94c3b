//! The cost of the mesh's rounds: CPU per round on one node of a 5-node cluster holding
//! leases on 10k and 100k active keys (and owning a fifth of them), and the bytes it sends.
//!
//! `cargo bench --bench gossip`. Each measured iteration is one round of node 0
//! (`handle_timeout` plus collecting the frames it sends: reports and wants for the leases
//! it holds, grants and backups for the keys it owns); the peers tick and answer outside the
//! timing, so grants and acknowledgements flow as in a real cluster.
//! - `sparse`: a fiftieth of the keys take one admission on node 0 per round (each key once a
//!   second): many keys, each well under its limit, the common case;
//! - `busy`: every key had one admission on node 0 since the last round (the worst case).
//!
//! Bytes per node per second for a described workload come from the simulator, for
//! example `ratemesh simulate --keys 10000 --limit 100 --demand 0.01 --traffic poisson`.

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use ratemesh::Policy;
use ratemesh::mesh::{Node, NodeConfig};

const ROUND_NS: u64 = 20_000_000;
const START: u64 = 1_000_000_000_000;
const NODES: usize = 5;

struct Cluster {
    nodes: Vec<Node>,
    now: u64,
}

impl Cluster {
    fn new(keys: u64) -> Self {
        let policy = Policy::sliding_window(1000, Duration::from_secs(1)).unwrap();
        let nodes = (0..NODES as u64)
            .map(|i| {
                let mut config = NodeConfig::new(i, (0..NODES as u64).collect(), vec![policy]);
                config.max_keys = 1_000_000;
                Node::new(config, START).unwrap()
            })
            .collect();
        let mut c = Cluster { nodes, now: START };
        c.exchange();
        for key in 0..keys {
            let now = c.now;
            c.nodes[(key % NODES as u64) as usize].decide(0, key, 1, now);
        }
        for _ in 0..5 {
            c.round(None);
        }
        c
    }

    /// Deliver every queued frame; return the bytes node 0 sent.
    fn exchange(&mut self) -> usize {
        let mut sent_by_0 = 0;
        loop {
            let mut moved = false;
            for i in 0..self.nodes.len() {
                while let Some(t) = self.nodes[i].poll_transmit() {
                    moved = true;
                    if i == 0 {
                        sent_by_0 += t.bytes.len();
                    }
                    let now = self.now;
                    let _ = self.nodes[t.to as usize].handle_frame(now, i as u64, &t.bytes);
                }
            }
            if !moved {
                return sent_by_0;
            }
        }
    }

    /// Run one round on every node, after an admission on node 0 for the keys in `touched`;
    /// time node 0's tick and its encoding.
    fn round(&mut self, touched: Option<std::ops::Range<u64>>) -> (Duration, usize) {
        self.now += ROUND_NS;
        let now = self.now;
        for key in touched.unwrap_or(0..0) {
            self.nodes[0].decide(0, key, 1, now);
        }
        let start = Instant::now();
        self.nodes[0].handle_timeout(now);
        let mut frames = Vec::new();
        while let Some(t) = self.nodes[0].poll_transmit() {
            frames.push(t);
        }
        let elapsed = start.elapsed();
        let bytes: usize = frames.iter().map(|t| t.bytes.len()).sum();
        for t in frames {
            let _ = self.nodes[t.to as usize].handle_frame(now, 0, &t.bytes);
        }
        for node in &mut self.nodes[1..] {
            node.handle_timeout(now);
        }
        self.exchange();
        (elapsed, bytes)
    }
}

fn rounds(c: &mut Criterion) {
    let mut group = c.benchmark_group("gossip/round");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(8));
    for keys in [10_000u64, 100_000] {
        let label = format!("{}k_keys", keys / 1000);
        let mut cluster = Cluster::new(keys);
        for (name, per_round) in [("sparse", keys / 50), ("busy", keys)] {
            let mut bytes = 0;
            let mut measured = 0;
            let mut next = 0;
            group.bench_function(format!("{label}/{name}"), |b| {
                b.iter_custom(|iters| {
                    (0..iters)
                        .map(|_| {
                            let touched = next..next + per_round;
                            next = (next + per_round) % keys;
                            let (elapsed, sent) = cluster.round(Some(touched));
                            bytes += sent;
                            measured += 1;
                            elapsed
                        })
                        .sum()
                })
            });
            let per = bytes / measured.max(1);
            eprintln!(
                "gossip/round/{label}/{name}: node 0 sent {per} bytes per round to 4 peers \
                 ({:.2} MB/s at 20 ms)",
                per as f64 * 50.0 / 1e6
            );
        }
    }
    group.finish();
}

criterion_group!(benches, rounds);
criterion_main!(benches);
