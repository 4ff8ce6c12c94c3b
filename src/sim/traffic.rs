//! Traffic models: when requests arrive, on which node, for which key, at what cost.

use crate::clock::Nanos;
use crate::mesh::membership::mix;
use crate::policy::Algorithm;
use crate::sim::{START_NS, SimConfig};

/// How the offered load is spread over time and nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Traffic {
    /// Evenly spaced arrivals, round-robin over the nodes.
    Uniform,
    /// Evenly spaced arrivals, all on node 0.
    OneNode,
    /// Evenly spaced arrivals; a fraction of them on one node that changes every
    /// `every_ns`, the rest round-robin over the others.
    MovingHotspot {
        /// How long the hot spot stays on one node, in ns.
        every_ns: Nanos,
        /// The fraction of the traffic on the hot node, in thousandths (1000: all of it).
        permille: u32,
    },
    /// At every window start (a bucket's refill time), every node receives its part of one
    /// window's demand at the same instant.
    SynchronizedBurst,
    /// Poisson arrivals, each on a random node.
    Poisson,
    /// Poisson arrivals of bursts (a twentieth of the limit each), each burst on a random node.
    Bursty,
    /// Poisson arrivals on random nodes, keys drawn by a Zipf law over `keys` (key `k`, from
    /// 1, has weight `1 / k^s`): a few keys carry most of the load.
    Zipf {
        /// The exponent `s`, in thousandths.
        exponent_milli: u32,
    },
}

impl Traffic {
    /// Return the model's name as the `simulate` command spells it.
    pub fn name(&self) -> &'static str {
        match self {
            Traffic::Uniform => "uniform",
            Traffic::OneNode => "one-node",
            Traffic::MovingHotspot { .. } => "moving-hotspot",
            Traffic::SynchronizedBurst => "synchronized-burst",
            Traffic::Poisson => "poisson",
            Traffic::Bursty => "bursty",
            Traffic::Zipf { .. } => "zipf",
        }
    }
}

/// One request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    /// True time, ns.
    pub at_ns: Nanos,
    /// The node it reaches.
    pub node: usize,
    /// The key (0-based).
    pub key: u64,
    /// Its cost in tokens.
    pub cost: u64,
}

/// The fixed set of nodes each key's requests go to (`SimConfig::nodes_per_key`): for key
/// `k`, `size` distinct nodes of `0..nodes` drawn by an RNG seeded with the run's seed and
/// the key (Floyd's sampling), so the sets do not depend on the traffic model.
struct KeySets {
    seed: u64,
    nodes: usize,
    size: usize,
    /// The set of the key asked last.
    key: Option<u64>,
    set: Vec<usize>,
}

impl KeySets {
    fn new(seed: u64, nodes: usize, size: usize) -> Self {
        KeySets {
            seed,
            nodes,
            size: size.clamp(1, nodes.max(1)),
            key: None,
            set: Vec::with_capacity(size),
        }
    }

    /// Return node `index` (taken modulo the set's size) of `key`'s set.
    fn node(&mut self, key: u64, index: usize) -> usize {
        if self.key != Some(key) {
            let mut rng = fastrand::Rng::with_seed(mix(self.seed ^ mix(key.wrapping_add(1))));
            self.set.clear();
            for j in self.nodes - self.size..self.nodes {
                let t = rng.usize(0..=j);
                let pick = if self.set.contains(&t) { j } else { t };
                self.set.push(pick);
            }
            self.key = Some(key);
        }
        self.set[index % self.size]
    }
}

/// Generate the requests of a run, sorted by time.
pub fn generate(config: &SimConfig, rng: &mut fastrand::Rng) -> Vec<Arrival> {
    let policy = &config.policy;
    // The policy's sustained rate in tokens per ns, and its period.
    let (tokens_per_ns, period_ns) = match policy.algorithm() {
        Algorithm::TokenBucket | Algorithm::Gcra => {
            (1.0 / policy.interval_ns() as f64, policy.window_ns())
        }
        _ => (
            policy.capacity() as f64 / policy.window_ns() as f64,
            policy.window_ns(),
        ),
    };
    let mean_cost = (1 + config.max_cost.max(1)) as f64 / 2.0;
    let keys = config.keys.max(1);
    let per_ns = config.demand * tokens_per_ns / mean_cost * keys as f64;
    let n = config.nodes.max(1);
    // With a set of nodes per key, a random node is a random index into the key's set
    // (resolved below, once the key is known).
    let sets = config
        .nodes_per_key
        .map(|k| KeySets::new(config.seed, n, k));
    let random_node = |rng: &mut fastrand::Rng| match &sets {
        Some(s) => rng.usize(0..s.size),
        None => rng.usize(0..n),
    };
    let end = START_NS + config.duration_ns;
    let mut out = Vec::new();
    let cost = |rng: &mut fastrand::Rng| rng.u64(1..=config.max_cost.max(1));
    if per_ns <= 0.0 {
        return out;
    }
    let gap = 1.0 / per_ns;
    match config.traffic {
        Traffic::Uniform | Traffic::OneNode | Traffic::MovingHotspot { .. } => {
            let mut i: u64 = 0;
            loop {
                let at = START_NS + (i as f64 * gap) as Nanos;
                if at >= end {
                    break;
                }
                let node = match config.traffic {
                    Traffic::Uniform => (i as usize) % n,
                    Traffic::OneNode => 0,
                    Traffic::MovingHotspot { every_ns, permille } => {
                        let hot = (((at - START_NS) / every_ns.max(1)) as usize) % n;
                        // Spread the cold part evenly: request i is cold when the running
                        // share of cold requests falls behind (1 - fraction).
                        let cold = n > 1
                            && (i + 1) * u64::from(1000 - permille.min(1000)) / 1000
                                > i * u64::from(1000 - permille.min(1000)) / 1000;
                        if cold {
                            let k = (i as usize / 7) % (n - 1);
                            (hot + 1 + k) % n
                        } else {
                            hot
                        }
                    }
                    _ => unreachable!("matched above"),
                };
                out.push(Arrival {
                    at_ns: at,
                    node,
                    key: (i / n as u64) % keys,
                    cost: cost(rng),
                });
                i += 1;
            }
        }
        Traffic::Zipf { exponent_milli } => {
            let s = f64::from(exponent_milli) / 1000.0;
            let mut cdf: Vec<f64> = Vec::with_capacity(keys as usize);
            let mut sum = 0.0;
            for k in 1..=keys {
                sum += 1.0 / (k as f64).powf(s);
                cdf.push(sum);
            }
            let mut t = START_NS as f64;
            loop {
                t += -gap * (1.0 - rng.f64()).ln();
                if t >= end as f64 {
                    break;
                }
                let u = rng.f64() * sum;
                let key = cdf.partition_point(|&c| c < u).min(keys as usize - 1) as u64;
                out.push(Arrival {
                    at_ns: t as Nanos,
                    node: random_node(rng),
                    key,
                    cost: cost(rng),
                });
            }
        }
        Traffic::Poisson => {
            let mut t = START_NS as f64;
            loop {
                t += -gap * (1.0 - rng.f64()).ln();
                if t >= end as f64 {
                    break;
                }
                out.push(Arrival {
                    at_ns: t as Nanos,
                    node: random_node(rng),
                    key: rng.u64(0..keys),
                    cost: cost(rng),
                });
            }
        }
        Traffic::Bursty => {
            let burst = (policy.capacity() / 20).max(1);
            let burst_gap = gap * burst as f64;
            let mut t = START_NS as f64;
            loop {
                t += -burst_gap * (1.0 - rng.f64()).ln();
                if t >= end as f64 {
                    break;
                }
                let node = random_node(rng);
                let key = rng.u64(0..keys);
                for _ in 0..burst {
                    out.push(Arrival {
                        at_ns: t as Nanos,
                        node,
                        key,
                        cost: cost(rng),
                    });
                }
            }
        }
        Traffic::SynchronizedBurst => {
            let per_period = (per_ns * period_ns as f64).round() as u64;
            let per_node = per_period.div_ceil(n as u64);
            let first = START_NS.div_ceil(period_ns) * period_ns;
            let mut at = first;
            while at < end {
                for node in 0..n {
                    for j in 0..per_node {
                        out.push(Arrival {
                            at_ns: at,
                            node,
                            key: j % keys,
                            cost: cost(rng),
                        });
                    }
                }
                at += period_ns;
            }
        }
    }
    if let Some(mut sets) = sets {
        for a in &mut out {
            a.node = sets.node(a.key, a.node);
        }
    }
    out.sort_by_key(|a| a.at_ns);
    out
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::time::Duration;

    use super::*;
    use crate::policy::Policy;

    #[test]
    fn each_key_goes_to_its_own_few_nodes() {
        let policy = Policy::global_sliding_window(100, Duration::from_secs(1)).unwrap();
        for traffic in [Traffic::Poisson, Traffic::Uniform, Traffic::Bursty] {
            let mut c = SimConfig::new(policy);
            c.nodes = 64;
            c.keys = 500;
            c.nodes_per_key = Some(3);
            c.demand = 0.05;
            c.duration_ns = 10_000_000_000;
            let arrivals = generate(&c, &mut fastrand::Rng::with_seed(7));
            let mut sets: BTreeMap<u64, BTreeSet<usize>> = BTreeMap::new();
            for a in &arrivals {
                sets.entry(a.key).or_default().insert(a.node);
            }
            assert!(sets.values().all(|s| s.len() <= 3), "{traffic:?}");
            // Most keys use all three of their nodes, and the sets cover the cluster.
            let full = sets.values().filter(|s| s.len() == 3).count();
            assert!(
                full * 10 > sets.len() * 8,
                "{traffic:?}: {full} of {}",
                sets.len()
            );
            let used: BTreeSet<usize> = sets.values().flatten().copied().collect();
            assert_eq!(used.len(), 64, "{traffic:?}");
        }
    }
}
