//! A deterministic simulator of a ratemesh cluster: N [`Node`]s in virtual time, driven by a
//! seeded RNG, over links with latency, jitter (reordering), loss and duplication, with
//! partitions and heals, per-node clock skew, crashes and restarts.
//!
//! It feeds the merged request stream, in true time order, to an oracle (one central limiter
//! of the same policy) and reports the measures of `docs/overshoot.md`: overshoot (exact
//! timestamps), overshoot in the policy's own terms (what the declared bound covers),
//! utilization, wrong-decision rate, gossip bytes, convergence after a heal. The same run
//! with [`Admission::LocalOnly`], [`Admission::StaticSplit`] and [`Admission::StaleSum`]
//! gives the baselines.

pub mod measure;
pub mod traffic;

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::algorithm::KeyMachine;
use crate::clock::Nanos;
use crate::mesh::cell::MeshKind;
use crate::mesh::node::{Admission, Node, NodeConfig};
use crate::mesh::share;
use crate::policy::Policy;
pub use traffic::Traffic;

/// Traffic starts here (true time), so that every node's skewed clock stays positive.
pub const START_NS: Nanos = 1_000_000_000_000;

/// Nodes start this long before the traffic, so a run measures a running cluster, not its
/// first snapshot exchange.
pub const WARM_UP_NS: Nanos = 1_000_000_000;

/// A partition of the first `minority` nodes from the others.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Partition {
    /// When it starts, in ns after the start.
    pub at_ns: Nanos,
    /// When it heals, in ns after the start.
    pub heal_ns: Nanos,
    /// How many nodes (the first ones) are cut off from the rest.
    pub minority: usize,
}

/// A node that crashes (loses all state) and restarts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Crash {
    /// Which node.
    pub node: usize,
    /// When it crashes, in ns after the start.
    pub at_ns: Nanos,
    /// When it restarts, in ns after the start.
    pub restart_ns: Nanos,
}

/// A simulated cluster and its load.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Number of nodes.
    pub nodes: usize,
    /// Gossip interval in ns.
    pub gossip_interval_ns: Nanos,
    /// One-way latency in ns.
    pub latency_ns: Nanos,
    /// Extra random delay per message, uniform in `0..=jitter_ns` (reorders messages).
    pub jitter_ns: Nanos,
    /// Probability that a datagram is lost.
    pub loss: f64,
    /// Probability that a datagram is delivered twice.
    pub duplication: f64,
    /// Each node's clock is off by a uniform offset in `-skew_ns..=skew_ns`.
    pub skew_ns: Nanos,
    /// The global policy.
    pub policy: Policy,
    /// How requests arrive.
    pub traffic: Traffic,
    /// Offered load as a multiple of the limit's rate.
    pub demand: f64,
    /// Requests cost `1..=max_cost` (uniform).
    pub max_cost: u64,
    /// Number of keys the load is spread over (the measures are per key, worst key).
    pub keys: u64,
    /// Length of the run in ns.
    pub duration_ns: Nanos,
    /// The RNG seed: the same seed gives the same run.
    pub seed: u64,
    /// An optional partition.
    pub partition: Option<Partition>,
    /// Crashes and restarts.
    pub crashes: Vec<Crash>,
    /// The admission rule.
    pub admission: Admission,
    /// Rounds of silence before a member is declared dead.
    pub dead_after_rounds: u64,
    /// The most a node adds to its share per round (fraction of the budget).
    pub max_claim_fraction: f64,
    /// The least share of a live node (fraction of the budget).
    pub floor_fraction: f64,
}

impl SimConfig {
    /// A 5-node cluster with 20 ms gossip and 1 ms latency, 2x demand, for `policy`.
    pub fn new(policy: Policy) -> Self {
        SimConfig {
            nodes: 5,
            gossip_interval_ns: 20_000_000,
            latency_ns: 1_000_000,
            jitter_ns: 0,
            loss: 0.0,
            duplication: 0.0,
            skew_ns: 0,
            policy,
            traffic: Traffic::Uniform,
            demand: 2.0,
            max_cost: 1,
            keys: 1,
            duration_ns: 20_000_000_000,
            seed: 1,
            partition: None,
            crashes: Vec::new(),
            admission: Admission::Shares,
            dead_after_rounds: 10,
            max_claim_fraction: 0.1,
            floor_fraction: 0.002,
        }
    }

    fn node_config(&self, id: usize) -> NodeConfig {
        let seeds = (0..self.nodes as u64).collect();
        let mut c = NodeConfig::new(id as u64, seeds, vec![self.policy]);
        c.gossip_interval_ns = self.gossip_interval_ns;
        c.dead_after_rounds = self.dead_after_rounds;
        c.max_claim_fraction = self.max_claim_fraction;
        c.floor_fraction = self.floor_fraction;
        c.admission = self.admission;
        c
    }
}

/// The declared bound on overshoot in the policy's own terms, by cause (see
/// `docs/overshoot.md`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct DeclaredBound {
    /// Without partitions or skew: 0 for the share rule, whatever the node count, interval,
    /// latency and loss (those cost utilization, never overshoot).
    pub steady: f64,
    /// Skewed clocks shift window boundaries: each node's share may land in two windows.
    pub skew: f64,
    /// A partition: the side without a majority keeps its shares while the majority
    /// reassigns them; at most the budget that side can hold.
    pub partition: f64,
}

impl DeclaredBound {
    /// Return the sum of the terms.
    pub fn total(&self) -> f64 {
        self.steady + self.skew + self.partition
    }
}

/// Return the bound `config` declares, before running anything.
pub fn declared_bound(config: &SimConfig) -> DeclaredBound {
    let n = config.nodes as f64;
    let window = MeshKind::of(&config.policy) != Some(MeshKind::Bucket);
    match config.admission {
        Admission::Shares => {
            let partition = config.partition.map_or(0.0, |p| {
                let minority = p.minority.min(config.nodes - p.minority);
                let majority = config.nodes - minority;
                if majority * 2 > config.nodes {
                    1.0 - majority as f64 * config.floor_fraction
                } else {
                    0.0
                }
            });
            DeclaredBound {
                steady: 0.0,
                skew: if window && config.skew_ns > 0 {
                    1.0
                } else {
                    0.0
                },
                partition,
            }
        }
        Admission::StaticSplit => DeclaredBound {
            skew: if window && config.skew_ns > 0 {
                1.0
            } else {
                0.0
            },
            ..DeclaredBound::default()
        },
        Admission::LocalOnly | Admission::StaleSum => DeclaredBound {
            steady: n - 1.0,
            ..DeclaredBound::default()
        },
    }
}

/// The measures of one run.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SimReport {
    /// `max A([t, t+W)) / L - 1` (windows) or `max A(I) / (b + r|I|) - 1` (buckets), exact
    /// timestamps, floored at 0; worst key.
    pub overshoot: f64,
    /// Overshoot in the policy's own terms (per aligned window, the weighted estimate, or
    /// the bucket bound): what the declared bound covers; worst key.
    pub policy_overshoot: f64,
    /// The oracle's overshoot on its own admissions (the algorithm's own error).
    pub oracle_overshoot: f64,
    /// Mesh admitted cost / oracle admitted cost.
    pub utilization: f64,
    /// Fraction of requests decided differently from the oracle.
    pub wrong_decision_rate: f64,
    /// The declared bound on `policy_overshoot`.
    pub declared_bound: DeclaredBound,
    /// With a partition: the share of the budget the side without a majority held when it
    /// began (a tighter, state-dependent partition bound).
    pub partition_share_at_split: Option<f64>,
    /// Gossip bytes sent per node per second.
    pub gossip_bytes_per_node_per_s: f64,
    /// With a partition: ms from the heal until every node holds every other node's counts
    /// as of the heal.
    pub convergence_ms_after_heal: Option<f64>,
    /// Requests offered.
    pub requests: u64,
    /// Cost admitted by the mesh.
    pub admitted: u64,
    /// Cost admitted by the oracle.
    pub oracle_admitted: u64,
    /// Frames refused by nodes (must be 0 in a simulation without bad peers).
    pub frames_dropped: u64,
    /// Whether some node saw a gossiped count decrease (must never happen).
    pub counter_decreased: bool,
    /// The largest sum of the running nodes' allowances seen at any tick, as a fraction of
    /// the budget (at most 1 under the share rule outside partitions; the first 16 keys).
    pub max_share_sum: f64,
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Tick(usize),
    Deliver {
        from: usize,
        to: usize,
        incarnation: u64,
        bytes: Vec<u8>,
    },
    Crash(usize),
    Restart(usize),
    Heal,
    Split,
}

pub(crate) struct SimNode {
    node: Option<Node>,
    offset_ns: i64,
    incarnation: u64,
}

impl SimNode {
    fn local(&self, true_ns: Nanos) -> Nanos {
        (true_ns as i64 + self.offset_ns) as Nanos
    }
    fn true_time(&self, local_ns: Nanos) -> Nanos {
        (local_ns as i64 - self.offset_ns) as Nanos
    }
}

struct World<'a> {
    config: &'a SimConfig,
    rng: fastrand::Rng,
    queue: BinaryHeap<Reverse<(Nanos, u64, Event)>>,
    seq: u64,
    nodes: Vec<SimNode>,
    partitioned: bool,
    bytes_sent: u64,
    frames_dropped: u64,
}

impl World<'_> {
    fn push(&mut self, at: Nanos, event: Event) {
        self.seq += 1;
        self.queue.push(Reverse((at, self.seq, event)));
    }

    fn cut(&self, a: usize, b: usize) -> bool {
        match self.config.partition {
            Some(p) if self.partitioned => (a < p.minority) != (b < p.minority),
            _ => false,
        }
    }

    fn start_node(&mut self, i: usize, now: Nanos) {
        let local = self.nodes[i].local(now);
        let node = Node::new(self.config.node_config(i), local).expect("valid simulated config");
        let next = self.nodes[i].true_time(node.poll_timeout());
        self.nodes[i].node = Some(node);
        self.nodes[i].incarnation += 1;
        self.push(next.max(now), Event::Tick(i));
    }

    /// Move node `i`'s outgoing frames onto the links.
    fn flush(&mut self, i: usize, now: Nanos) {
        while let Some(t) = self.nodes[i].node.as_mut().and_then(Node::poll_transmit) {
            let to = t.to as usize;
            self.bytes_sent += t.bytes.len() as u64;
            if to >= self.nodes.len() || self.cut(i, to) {
                continue;
            }
            let copies = if t.reliable {
                1
            } else if self.rng.f64() < self.config.loss {
                0
            } else if self.rng.f64() < self.config.duplication {
                2
            } else {
                1
            };
            for _ in 0..copies {
                let jitter = if self.config.jitter_ns > 0 {
                    self.rng.u64(0..=self.config.jitter_ns)
                } else {
                    0
                };
                let at = now + self.config.latency_ns + jitter;
                let incarnation = self.nodes[to].incarnation;
                self.push(
                    at,
                    Event::Deliver {
                        from: i,
                        to,
                        incarnation,
                        bytes: t.bytes.clone(),
                    },
                );
            }
        }
    }
}

/// Run the simulation `config` describes.
pub fn run(config: &SimConfig) -> SimReport {
    let mut rng = fastrand::Rng::with_seed(config.seed);
    let nodes = (0..config.nodes)
        .map(|_| SimNode {
            node: None,
            offset_ns: if config.skew_ns > 0 {
                rng.i64(-(config.skew_ns as i64)..=config.skew_ns as i64)
            } else {
                0
            },
            incarnation: 0,
        })
        .collect();
    let arrivals = traffic::generate(config, &mut rng);
    let mut world = World {
        config,
        rng,
        queue: BinaryHeap::new(),
        seq: 0,
        nodes,
        partitioned: false,
        bytes_sent: 0,
        frames_dropped: 0,
    };
    for i in 0..config.nodes {
        world.start_node(i, START_NS - WARM_UP_NS);
    }
    for i in 0..config.nodes {
        world.flush(i, START_NS - WARM_UP_NS);
    }
    if let Some(p) = config.partition {
        world.push(START_NS + p.at_ns, Event::Split);
        world.push(START_NS + p.heal_ns, Event::Heal);
    }
    for c in &config.crashes {
        world.push(START_NS + c.at_ns, Event::Crash(c.node));
        world.push(START_NS + c.restart_ns, Event::Restart(c.node));
    }
    let end = START_NS + config.duration_ns;
    let mut oracles: Vec<KeyMachine> = (0..config.keys)
        .map(|_| KeyMachine::new(config.policy))
        .collect();
    let mut record = measure::Recorder::new(config);
    let mut convergence = measure::Convergence::default();
    let mut next_arrival = 0;
    loop {
        let event_at = world
            .queue
            .peek()
            .map_or(Nanos::MAX, |Reverse((t, _, _))| *t);
        let arrival_at = arrivals.get(next_arrival).map_or(Nanos::MAX, |a| a.at_ns);
        let now = event_at.min(arrival_at);
        if now >= end {
            break;
        }
        if arrival_at <= event_at {
            let a = arrivals[next_arrival];
            next_arrival += 1;
            // A request for a crashed node goes to the next live one (a load balancer's job).
            let target = (0..config.nodes)
                .map(|k| (a.node + k) % config.nodes)
                .find(|&k| world.nodes[k].node.is_some());
            let oracle = oracles[a.key as usize].decide(now, a.cost).is_allowed();
            let allowed = match target {
                Some(k) => {
                    let local = world.nodes[k].local(now);
                    let node = world.nodes[k].node.as_mut().expect("live node");
                    node.decide(0, a.key + 1, a.cost, local).is_allowed()
                }
                None => false,
            };
            record.request(now, a.key, a.cost, allowed, oracle);
            continue;
        }
        let Some(Reverse((_, _, event))) = world.queue.pop() else {
            break;
        };
        match event {
            Event::Tick(i) => {
                let offset = world.nodes[i].offset_ns;
                let Some(node) = world.nodes[i].node.as_mut() else {
                    continue;
                };
                node.handle_timeout((now as i64 + offset) as Nanos);
                let next = (node.poll_timeout() as i64 - offset) as Nanos;
                world.push(next.max(now + 1), Event::Tick(i));
                world.flush(i, now);
                if let Some(p) = config.partition
                    && now >= START_NS + p.heal_ns
                {
                    convergence.check(now, &world.nodes, config);
                }
                record.check_counters(now, &world.nodes, config);
                if config.admission == Admission::Shares {
                    record.check_shares(&world.nodes, config);
                }
                // Claims of the round the split fell in may still land on the cut-off side:
                // the share it holds is measured over the first rounds of the partition.
                if let Some(p) = config.partition
                    && world.partitioned
                    && now <= START_NS + p.at_ns + 3 * config.gossip_interval_ns
                {
                    let share = measure::minority_share(&world.nodes, config);
                    record.partition_share = Some(record.partition_share.unwrap_or(0.0).max(share));
                }
            }
            Event::Deliver {
                from,
                to,
                incarnation,
                bytes,
            } => {
                if world.nodes[to].incarnation != incarnation || world.cut(from, to) {
                    continue;
                }
                let local = world.nodes[to].local(now);
                let Some(node) = world.nodes[to].node.as_mut() else {
                    continue;
                };
                if node.handle_frame(local, from as u64, &bytes).is_err() {
                    world.frames_dropped += 1;
                }
                world.flush(to, now);
                if let Some(p) = config.partition
                    && now >= START_NS + p.heal_ns
                {
                    convergence.check(now, &world.nodes, config);
                }
            }
            Event::Crash(i) => {
                world.nodes[i].node = None;
                world.nodes[i].incarnation += 1;
            }
            Event::Restart(i) => {
                world.start_node(i, now);
                world.flush(i, now);
            }
            Event::Split => {
                world.partitioned = true;
                record.partition_share = Some(measure::minority_share(&world.nodes, config));
            }
            Event::Heal => {
                world.partitioned = false;
                convergence.start(now, &world.nodes, config);
            }
        }
    }
    let seconds = config.duration_ns as f64 / 1e9;
    let mut report = record.finish(config);
    report.declared_bound = declared_bound(config);
    report.gossip_bytes_per_node_per_s = world.bytes_sent as f64 / config.nodes as f64 / seconds;
    report.convergence_ms_after_heal = convergence.result_ms();
    report.frames_dropped = world.frames_dropped;
    report
}

/// Run `config` with each baseline rule; return `(name, report)` pairs.
pub fn run_baselines(config: &SimConfig) -> Vec<(&'static str, SimReport)> {
    [
        ("local_only", Admission::LocalOnly),
        ("static_split", Admission::StaticSplit),
        ("stale_sum", Admission::StaleSum),
    ]
    .into_iter()
    .map(|(name, admission)| {
        let mut c = config.clone();
        c.admission = admission;
        (name, run(&c))
    })
    .collect()
}

/// Return the fraction of the budget `share` stands for (re-exported for reports).
pub fn share_fraction(share: share::Share) -> f64 {
    share::to_fraction(share)
}
