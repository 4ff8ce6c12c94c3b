//! A deterministic simulator of a ratemesh cluster: N [`Node`](crate::mesh::Node)s in virtual time, driven by a
//! seeded RNG, over links with latency, jitter (reordering), loss and duplication, with
//! partitions and heals, per-node clock skew, crashes and restarts. The nodes hand each
//! other their encoded frames, as a transport does; the gossip bytes count their lengths.
//!
//! It feeds the merged request stream, in true time order, to an oracle (one central limiter
//! of the same policy) and reports the measures of `docs/overshoot.md`: overshoot (exact
//! timestamps), overshoot in the policy's own terms (what the declared bound covers),
//! utilization, false denials and false admissions against the oracle, how long requests
//! waited for their key's owner, gossip bytes, capacity after a crash. The same run with
//! [`Admission::LocalOnly`], [`Admission::StaticSplit`] and [`Admission::StaleSum`] gives
//! the baselines.

mod baseline;
pub(crate) mod cut;
pub(crate) mod measure;
mod overshoot;
mod own_room;
pub(crate) mod traffic;
mod world;

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::algorithm::KeyMachine;
use crate::clock::Nanos;
use crate::mesh::keymap::FixedMap;
use crate::mesh::membership::weight;
use crate::mesh::message::KeyRef;
use crate::mesh::node::{Admit, NodeConfig};
use crate::policy::Policy;

pub use baseline::Admission;
pub use traffic::{Arrival, Traffic, generate as arrivals};
pub(crate) use world::SimNode;
use world::{SimEvent, World, drain_events};

/// More events than this at one simulated instant is a livelock (every arrival of a
/// synchronized burst of the largest runs is one event).
const MAX_EVENTS_AT_ONE_INSTANT: u64 = 5_000_000;

/// Traffic starts here (true time), so that every node's skewed clock stays positive.
pub(crate) const START_NS: Nanos = 1_000_000_000_000;

/// Nodes start this long before the traffic, so a run measures a running cluster, not its
/// first exchange.
pub(crate) const WARM_UP_NS: Nanos = 1_000_000_000;

/// The largest cluster the simulator runs.
pub const MAX_NODES: usize = 1024;

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

/// A node that crashes (loses all state) and may restart.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Crash {
    /// Which node.
    pub node: usize,
    /// When it crashes, in ns after the start.
    pub at_ns: Nanos,
    /// When it restarts, in ns after the start (`None`: never).
    pub restart_ns: Option<Nanos>,
}

/// A node that drains (gives its leases back, hands its keys over and leaves, as
/// `ratemesh node` does on SIGTERM), stops, and may start again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Drain {
    /// Which node.
    pub node: usize,
    /// When it drains, in ns after the start: from then on its requests go to the other
    /// nodes, and it stops [`DRAIN_STOP_NS`] later.
    pub at_ns: Nanos,
    /// When it starts again, in ns after the start (`None`: never, a scale-in).
    pub restart_ns: Option<Nanos>,
}

/// The nodes of a simulated cluster of `nodes` in the order they rank for key `key` (0-based,
/// as [`Arrival::key`]) while all are up: its owner first, then its successor.
pub fn ranked(nodes: usize, key: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..nodes).collect();
    order.sort_by_key(|&id| std::cmp::Reverse(weight(key + 1, id as u64)));
    order
}

/// How long a draining node keeps running after it left (as `ratemesh node` does: it sends
/// its handoffs and leaving frames, then closes).
pub const DRAIN_STOP_NS: Nanos = 200_000_000;

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
    /// Offered load as a multiple of the limit's rate (per key).
    pub demand: f64,
    /// Requests cost `1..=max_cost` (uniform).
    pub max_cost: u64,
    /// Number of keys the load is spread over (the measures are per key, worst key).
    pub keys: u64,
    /// Each key's requests go to a fixed set of this many nodes, drawn at random per key
    /// (`None`: to the nodes the traffic model picks, all of them).
    pub nodes_per_key: Option<usize>,
    /// Length of the run in ns.
    pub duration_ns: Nanos,
    /// The RNG seed: the same seed gives the same run.
    pub seed: u64,
    /// An optional partition.
    pub partition: Option<Partition>,
    /// Crashes and restarts.
    pub crashes: Vec<Crash>,
    /// Drains, and starts after them.
    pub drains: Vec<Drain>,
    /// The admission rule.
    pub admission: Admission,
    /// Rounds of silence before a member is declared dead.
    pub dead_after_rounds: u64,
    /// The longest a request waits for its key's owner, in ns.
    pub max_wait_ns: Nanos,
    /// Each node's gossip budget, bytes per second ([`NodeConfig::gossip_budget_bytes_per_s`]).
    pub gossip_budget_bytes_per_s: u64,
    /// Tokens a node admits for a key it holds nothing of before the owner answers
    /// ([`NodeConfig::first_credit`]).
    pub first_credit: u64,
    /// Split each node's rounds into slices of this many keys, with what arrives meanwhile
    /// taken in between, as `ratemesh node` does ([`Node::handle_timeout_within`](crate::mesh::Node::handle_timeout_within)); 0: each
    /// round in one go.
    pub round_slice_keys: usize,
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
            nodes_per_key: None,
            duration_ns: 20_000_000_000,
            seed: 1,
            partition: None,
            crashes: Vec::new(),
            drains: Vec::new(),
            admission: Admission::Leases,
            dead_after_rounds: 10,
            max_wait_ns: 100_000_000,
            gossip_budget_bytes_per_s: crate::mesh::node::DEFAULT_GOSSIP_BUDGET_BYTES_PER_S,
            first_credit: 0,
            round_slice_keys: 0,
        }
    }

    fn node_config(&self, id: usize, incarnation: u64) -> NodeConfig {
        let seeds = (0..self.nodes as u64).collect();
        let mut c = NodeConfig::new(id as u64, seeds, vec![self.policy]);
        c.gossip_interval_ns = self.gossip_interval_ns;
        c.dead_after_rounds = self.dead_after_rounds;
        c.max_wait_ns = self.max_wait_ns;
        c.first_credit = self.first_credit;
        c.gossip_budget_bytes_per_s = self.gossip_budget_bytes_per_s;
        c.incarnation = incarnation;
        c
    }
}

/// The declared bound on overshoot in the policy's own terms, by cause (see
/// `docs/overshoot.md`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct DeclaredBound {
    /// Without faults: 0 for the lease rule, whatever the node count, interval, latency,
    /// loss and clock skew (those cost waiting, never overshoot). `N − 1` for the baselines
    /// that do not share.
    pub steady: f64,
    /// A crash of a key's owner: what it granted itself and had not yet backed up to its
    /// successor (measured at the crash, as a fraction of the limit).
    pub crash: f64,
    /// A partition: what the side that loses the key's authority had leased and the other
    /// side cannot know (measured at the split, at most 1).
    pub partition: f64,
    /// First requests admitted on credit before the owner answered: one credit per node
    /// run (a start or a restart), over the capacity.
    pub first: f64,
}

impl DeclaredBound {
    /// Return the sum of the terms.
    pub fn total(&self) -> f64 {
        self.steady + self.crash + self.partition + self.first
    }
}

/// Return the part of the bound `config` declares before running anything (the crash and
/// partition terms are state-dependent and measured during the run).
pub fn declared_bound(config: &SimConfig) -> DeclaredBound {
    let n = config.nodes as f64;
    match config.admission {
        Admission::Leases => {
            // A node takes a key's credit at most once per window (bucket: per time to
            // fill the burst); a restarted node starts afresh.
            let capacity = config.policy.capacity();
            let runs = config.nodes
                + config
                    .crashes
                    .iter()
                    .filter(|c| c.restart_ns.is_some())
                    .count()
                + config
                    .drains
                    .iter()
                    .filter(|d| d.restart_ns.is_some())
                    .count();
            let first = if config.first_credit > 0 && capacity >= 10 * config.first_credit {
                (runs as u64 * config.first_credit) as f64 / capacity as f64
            } else {
                0.0
            };
            DeclaredBound {
                first,
                ..DeclaredBound::default()
            }
        }
        Admission::StaticSplit => DeclaredBound::default(),
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
    /// Overshoot in the policy's own terms (per window of the cluster's clock, the weighted
    /// estimate, or the bucket bound): what the declared bound covers; worst key.
    pub policy_overshoot: f64,
    /// The oracle's overshoot on its own admissions (the algorithm's own error).
    pub oracle_overshoot: f64,
    /// Mesh admitted cost / oracle admitted cost.
    pub utilization: f64,
    /// Fraction of requests decided differently from the oracle.
    pub wrong_decision_rate: f64,
    /// Requests the mesh denied that the oracle admitted, over the oracle's admissions.
    pub false_denial_rate: f64,
    /// Requests the mesh admitted that the oracle denied, over all requests.
    pub false_admit_rate: f64,
    /// The false-denial rate over the keys the oracle never denied (the under-limit keys).
    pub false_denial_rate_under_limit_keys: f64,
    /// Fraction of requests that waited for their key's owner.
    pub waited_fraction: f64,
    /// Median wait of the requests that waited, ms.
    pub wait_p50_ms: f64,
    /// 99th percentile wait of the requests that waited, ms.
    pub wait_p99_ms: f64,
    /// The declared bound on `policy_overshoot`.
    pub declared_bound: DeclaredBound,
    /// Gossip bytes sent per node per second.
    pub gossip_bytes_per_node_per_s: f64,
    /// With a partition: ms from the heal until every live node agrees on every key's owner
    /// and only that owner can grant.
    pub convergence_ms_after_heal: Option<f64>,
    /// With a crash: mesh admitted / oracle admitted from the crash for two windows (at least
    /// 2 s, at most to the end of the run).
    pub capacity_after_crash: Option<f64>,
    /// With a crash: ms from the crash until the survivors declared it dead.
    pub detection_ms: Option<f64>,
    /// With a crash: ms from the failure detection until the mesh's admissions since the
    /// crash stay at ≥ 95% of the oracle's (0: they never fell below).
    pub recovery_ms_after_detection: Option<f64>,
    /// Requests offered.
    pub requests: u64,
    /// Cost admitted by the mesh.
    pub admitted: u64,
    /// Cost admitted by the oracle.
    pub oracle_admitted: u64,
    /// Frames refused by nodes (must be 0 in a simulation without bad peers).
    pub frames_dropped: u64,
    /// Whether two live nodes could grant from the same key's budget at once (must never
    /// happen).
    pub double_authority: bool,
    /// Requests the mesh denied although there was room for them, by the oracle's history
    /// and by the mesh's own admissions (one central limiter that admitted exactly what the
    /// mesh admitted, earlier requests it admitted after this arrival included), for
    /// everything offered for their key within one gossip round and two one-way delays either
    /// side of their arrival, and for one round of the policy's rate (a bucket's: one round
    /// and one delay); for windows, not counting those that arrived within a round and five
    /// one-way delays of the window's end (0 below the limit without loss or faults: the
    /// guarantee of `docs/overshoot.md`).
    pub false_denials_with_room: u64,
    /// Of `false_denials_with_room`, those refused before their wait reached `max_wait`, on
    /// a live node, not answered at their window's end, for which there was room for what was
    /// offered until a round and two one-way delays after their answer, and beyond what
    /// the leases of nodes their owner could not hear held (crashed, or across a partition:
    /// counted spent there) as long as that weighs, with clocks close enough to tell once
    /// ownership may have moved (within a twentieth of a window), in a window that the key's
    /// authority began within a round and five one-way delays of the oracle's: 0 below the
    /// limit under loss, partitions, crashes, restarts and drains alike (for a bucket: without loss or
    /// a reduced gossip budget), the guarantee of `docs/overshoot.md`: a fault delays
    /// answers, it never makes an owner refuse what it has room for.
    pub refused_with_room: u64,
    /// The budget lost, over the limit (worst key): where the last decision of a window (a
    /// bucket: of the run) once the membership events are over (the last one, plus twice
    /// the failure detection time and `max_wait`) is a denial, the room one central limiter
    /// that admitted what the mesh admitted would still have had then, beyond what was
    /// offered within a round of it; the largest. Lost budget shows at demand 1 or above,
    /// on windows long enough that the events happen inside one.
    pub budget_lost: f64,
    /// Drains begun during the run.
    pub drains: u64,
    /// With a crash: the most the crashed node's lease held of a key when it crashed, over
    /// the limit: what the survivors count as spent (the loss a crash may cost, see
    /// `docs/overshoot.md`).
    pub crash_loss: f64,
}

/// Run the simulation `config` describes.
///
/// ```
/// use std::time::Duration;
/// use ratemesh::Policy;
/// use ratemesh::sim::{self, SimConfig, Traffic};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // 5 nodes share 100 requests a second per key; clients send 80% of that, 1% of the
/// // packets are lost.
/// let mut config = SimConfig::new(Policy::global_fixed_window(100, Duration::from_secs(1))?);
/// config.nodes = 5;
/// config.traffic = Traffic::Poisson;
/// config.demand = 0.8;
/// config.loss = 0.01;
/// config.duration_ns = 3_000_000_000;
/// let report = sim::run(&config);
/// // Under the limit nobody is denied; the overshoot stays within its declared bound.
/// assert!(report.false_denial_rate < 0.01);
/// assert!(report.policy_overshoot <= report.declared_bound.total() + 1e-9);
/// # Ok(()) }
/// ```
pub fn run(config: &SimConfig) -> SimReport {
    assert!(
        (1..=MAX_NODES).contains(&config.nodes),
        "1 to {MAX_NODES} nodes"
    );
    let mut rng = fastrand::Rng::with_seed(config.seed);
    let nodes = (0..config.nodes)
        .map(|_| SimNode {
            node: None,
            baseline: None,
            counts_owed: FixedMap::default(),
            offset_ns: if config.skew_ns > 0 {
                rng.i64(-(config.skew_ns as i64)..=config.skew_ns as i64)
            } else {
                0
            },
            incarnation: 0,
            draining: false,
            waiting: FixedMap::default(),
            unframed: Vec::new(),
        })
        .collect();
    let arrivals = traffic::generate(config, &mut rng);
    let mut world = World {
        config,
        rng,
        queue: BinaryHeap::new(),
        slots: Vec::new(),
        free: Vec::new(),
        seq: 0,
        events: Vec::new(),
        nodes,
        partitioned: false,
        held: Vec::new(),
        bytes_sent: 0,
        frames_dropped: 0,
        next_tick: vec![0; config.nodes],
    };
    for i in 0..config.nodes {
        world.start_node(i, START_NS - WARM_UP_NS);
    }
    for i in 0..config.nodes {
        world.flush(i, START_NS - WARM_UP_NS);
    }
    if let Some(p) = config.partition {
        world.push(START_NS + p.at_ns, SimEvent::Split);
        world.push(START_NS + p.heal_ns, SimEvent::Heal);
    }
    for c in &config.crashes {
        world.push(START_NS + c.at_ns, SimEvent::Crash(c.node));
        if let Some(r) = c.restart_ns {
            world.push(START_NS + r, SimEvent::Restart(c.node));
        }
    }
    for d in &config.drains {
        world.push(START_NS + d.at_ns, SimEvent::Drain(d.node));
        world.push(START_NS + d.at_ns + DRAIN_STOP_NS, SimEvent::Stop(d.node));
        if let Some(r) = d.restart_ns {
            world.push(
                START_NS + r.max(d.at_ns + DRAIN_STOP_NS),
                SimEvent::Restart(d.node),
            );
        }
    }
    let end = START_NS + config.duration_ns;
    let mut oracles: Vec<KeyMachine> = (0..config.keys.max(1))
        .map(|_| KeyMachine::new(config.policy))
        .collect();
    // The oracle is one central limiter: it runs on the clock of the node that owns the key
    // while every node is up, the clock the cluster's windows follow.
    let oracle_offsets: Vec<i64> = (0..config.keys.max(1))
        .map(|k| {
            let owner = (0..config.nodes as u64)
                .max_by_key(|&id| weight(k + 1, id))
                .unwrap_or(0);
            world.nodes[owner as usize].offset_ns
        })
        .collect();
    let mut record = measure::Recorder::new(config, &arrivals);
    let mut next_arrival = 0;
    // Events at one instant: nodes that answer each other at once without end (a livelock
    // over zero-latency links) would otherwise stop simulated time.
    let (mut instant, mut at_instant) = (0, 0u64);
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
        if now == instant {
            at_instant += 1;
            assert!(
                at_instant < MAX_EVENTS_AT_ONE_INSTANT,
                "livelock: {at_instant} events at simulated instant {now} ns"
            );
        } else {
            (instant, at_instant) = (now, 0);
        }
        if arrival_at <= event_at {
            let index = next_arrival;
            let a = arrivals[index];
            next_arrival += 1;
            let oracle_now = (now as i64 + oracle_offsets[a.key as usize]) as Nanos;
            let oracle = oracles[a.key as usize].decide(oracle_now, a.cost);
            record.offered(index, a.key, a.cost, &oracle, now, oracle_now);
            // A request for a crashed or draining node goes to the next live one (a load
            // balancer's job).
            let target = (0..config.nodes)
                .map(|k| (a.node + k) % config.nodes)
                .find(|&k| world.nodes[k].node.is_some() && !world.nodes[k].draining);
            match target {
                Some(k) => {
                    let local = world.nodes[k].local(now);
                    let sim_node = &mut world.nodes[k];
                    let admit = match &mut sim_node.baseline {
                        Some(b) => Admit::Now(
                            b.decide(
                                KeyRef {
                                    policy: 0,
                                    key: a.key + 1,
                                },
                                a.cost,
                                local,
                            ),
                            None,
                        ),
                        None => sim_node.node.as_mut().expect("live node").decide(
                            0,
                            a.key + 1,
                            a.cost,
                            local,
                        ),
                    };
                    match admit {
                        Admit::Now(d, _) => record.decided(index, now, d.is_allowed(), 0),
                        Admit::Wait(id) => {
                            world.nodes[k].waiting.insert(id, (index, now));
                        }
                    }
                    record.ran(k);
                    record.check_cut(k, &world.nodes);
                    record.check_unheard(k, &world.nodes);
                    drain_events(&mut world, &mut record, k, now);
                    world.flush(k, now);
                    world.schedule(k, now);
                }
                None => record.failed(index, now),
            }
            continue;
        }
        let Some(event) = world.pop() else {
            break;
        };
        match event {
            SimEvent::Tick(i) => {
                if world.next_tick[i] == now {
                    world.next_tick[i] = 0;
                }
                let local = world.nodes[i].local(now);
                let Some(node) = world.nodes[i].node.as_mut() else {
                    continue;
                };
                if node.poll_timeout() > local {
                    world.schedule(i, now);
                    continue;
                }
                let rounds = node.stats().rounds;
                if config.round_slice_keys > 0 {
                    node.handle_timeout_within(local, config.round_slice_keys);
                } else {
                    node.handle_timeout(local);
                }
                if node.stats().rounds != rounds {
                    world.nodes[i].owe_counts();
                }
                record.ran(i);
                record.check_cut(i, &world.nodes);
                record.check_unheard(i, &world.nodes);
                drain_events(&mut world, &mut record, i, now);
                world.flush(i, now);
                world.schedule(i, now);
                record.check_authorities(now, &world.nodes, world.partitioned);
                if config
                    .partition
                    .is_some_and(|p| now >= START_NS + p.heal_ns)
                {
                    record.check_convergence(now, &world.nodes);
                }
            }
            SimEvent::Deliver {
                from,
                to,
                incarnation,
                reliable,
                frame,
            } => {
                if world.cut(from, to) && reliable {
                    world.held.push((from, to, 0, frame));
                    continue;
                }
                if world.nodes[to].incarnation != incarnation || world.cut(from, to) {
                    continue;
                }
                let local = world.nodes[to].local(now);
                let Some(node) = world.nodes[to].node.as_mut() else {
                    continue;
                };
                match node.handle_frame(local, from as u64, &frame.bytes) {
                    Ok(()) => {
                        if let Some(b) = &mut world.nodes[to].baseline {
                            for c in &frame.counts {
                                b.apply(from as u64, c, local);
                            }
                        }
                    }
                    Err(_) => world.frames_dropped += 1,
                }
                record.ran(to);
                record.check_cut(to, &world.nodes);
                record.check_unheard(to, &world.nodes);
                drain_events(&mut world, &mut record, to, now);
                world.flush(to, now);
                world.schedule(to, now);
            }
            SimEvent::Crash(i) => {
                record.crashed(now, i, &world.nodes);
                record.handoffs_lost(&world.handoffs_to(i));
                // What it kept for its peers goes with the process.
                world.held.retain(|&(from, ..)| from != i);
                world.nodes[i].node = None;
                world.nodes[i].incarnation += 1;
                // The requests it held get an error: denied.
                for (_, (index, _)) in std::mem::take(&mut world.nodes[i].waiting) {
                    record.failed(index, now);
                }
            }
            SimEvent::Drain(i) => {
                let local = world.nodes[i].local(now);
                if world.nodes[i].node.is_none() {
                    continue;
                }
                world.nodes[i].draining = true;
                record.drained(now, i);
                if let Some(node) = world.nodes[i].node.as_mut() {
                    node.leave(local);
                }
                record.ran(i);
                drain_events(&mut world, &mut record, i, now);
                world.flush(i, now);
                world.schedule(i, now);
            }
            SimEvent::Stop(i) => {
                if !world.nodes[i].draining {
                    continue;
                }
                world.held.retain(|&(from, ..)| from != i);
                record.event(now);
                world.nodes[i].draining = false;
                world.nodes[i].node = None;
                world.nodes[i].incarnation += 1;
                for (_, (index, _)) in std::mem::take(&mut world.nodes[i].waiting) {
                    record.failed(index, now);
                }
            }
            SimEvent::Restart(i) => {
                if world.nodes[i].node.is_some() {
                    continue;
                }
                record.event(now);
                record.ran(i);
                world.start_node(i, now);
                world.flush(i, now);
            }
            SimEvent::Split => {
                world.partitioned = true;
                let minority = config.partition.map_or(0, |p| p.minority);
                record.split(now, minority, config, &world.nodes);
            }
            SimEvent::Heal => {
                world.partitioned = false;
                record.heal(now);
                for (from, to, len, frame) in std::mem::take(&mut world.held) {
                    world.send(from, now, to, len, true, frame);
                }
            }
        }
    }
    // Requests still waiting at the end are left out (the run stops before their answer).
    let seconds = config.duration_ns as f64 / 1e9;
    let (bytes_sent, frames_dropped) = (world.bytes_sent, world.frames_dropped);
    // The nodes' state is done with: freed before the measures take their memory.
    drop(world);
    drop(oracles);
    let mut report = record.finish(config, &arrivals);
    let declared = declared_bound(config);
    report.declared_bound.steady = declared.steady;
    report.declared_bound.first = declared.first;
    report.gossip_bytes_per_node_per_s = bytes_sent as f64 / config.nodes as f64 / seconds;
    report.frames_dropped = frames_dropped;
    report
}

/// The baseline rules, by name: what the simulator compares the mesh with.
pub const BASELINES: [(&str, Admission); 3] = [
    ("local_only", Admission::LocalOnly),
    ("static_split", Admission::StaticSplit),
    ("stale_sum", Admission::StaleSum),
];

/// The most `nodes × keys` for which `ratemesh simulate` runs the `stale_sum` baseline
/// unless told to: every node sends every count it changes to every other node and keeps
/// every other node's count of every key, so simulating it costs about nodes² × requests
/// (64 nodes × 213,333 keys: about 18 s and 3 GB per simulated second).
pub(crate) const STALE_SUM_MAX_NODE_KEYS: u64 = 1_000_000;

/// Tell whether simulating `config`'s `stale_sum` baseline is too costly to run by default
/// (more than a million node-keys).
pub fn stale_sum_is_costly(config: &SimConfig) -> bool {
    (config.nodes as u64).saturating_mul(config.keys) > STALE_SUM_MAX_NODE_KEYS
}

/// Run `config` with baseline rule `admission`.
pub fn run_baseline(config: &SimConfig, admission: Admission) -> SimReport {
    let mut c = config.clone();
    c.admission = admission;
    run(&c)
}

/// Run `config` with each baseline rule; return `(name, report)` pairs.
pub fn run_baselines(config: &SimConfig) -> Vec<(&'static str, SimReport)> {
    BASELINES
        .into_iter()
        .map(|(name, admission)| (name, run_baseline(config, admission)))
        .collect()
}
