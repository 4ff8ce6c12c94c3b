//! `ratemesh simulate`: run the deterministic simulator for a described cluster and print
//! the overshoot to expect, next to the baselines.

use std::time::Duration;

use clap::{Args, ValueEnum};
use ratemesh::Policy;
use ratemesh::sim::Admission;
use ratemesh::sim::{self, Crash, Drain, Partition, SimConfig, SimReport, Traffic};

/// The algorithms a global policy can use.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum MeshAlgorithm {
    /// Token bucket (`--rate`, `--burst`).
    TokenBucket,
    /// GCRA (`--rate`, `--burst`), the same decisions as the token bucket.
    Gcra,
    /// Sliding-window counter (`--limit` per `--window-ms`).
    SlidingWindow,
    /// Fixed window (`--limit` per `--window-ms`).
    FixedWindow,
}

/// The traffic models.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum TrafficArg {
    /// Evenly spaced, round-robin over the nodes.
    Uniform,
    /// Evenly spaced, all on one node.
    OneNode,
    /// Evenly spaced on one node that changes every `--hotspot-every-s`.
    MovingHotspot,
    /// Every node gets its part of a window's demand at each window start.
    SynchronizedBurst,
    /// Poisson arrivals on random nodes.
    Poisson,
    /// Poisson bursts (a twentieth of the limit each) on random nodes.
    Bursty,
    /// Poisson arrivals on random nodes, keys drawn by a Zipf law over `--keys`.
    Zipf,
}

/// Flags of `ratemesh simulate`.
#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// Number of nodes.
    #[arg(long, default_value_t = 5)]
    nodes: usize,
    /// Gossip interval, ms.
    #[arg(long, default_value_t = 20.0)]
    gossip_ms: f64,
    /// One-way latency between nodes, ms.
    #[arg(long, default_value_t = 1.0)]
    latency_ms: f64,
    /// Extra random delay per message, up to this many ms (reorders messages).
    #[arg(long, default_value_t = 0.0)]
    jitter_ms: f64,
    /// Probability that a gossip datagram is lost (0..1).
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Probability that a gossip datagram is delivered twice (0..1).
    #[arg(long, default_value_t = 0.0)]
    duplication: f64,
    /// Each node's clock is off by up to this many ms.
    #[arg(long, default_value_t = 0.0)]
    skew_ms: f64,
    /// The global policy's algorithm.
    #[arg(long, value_enum, default_value_t = MeshAlgorithm::SlidingWindow)]
    algorithm: MeshAlgorithm,
    /// Window limit (tokens per window).
    #[arg(long, default_value_t = 1000)]
    limit: u64,
    /// Window length, ms.
    #[arg(long, default_value_t = 1000)]
    window_ms: u64,
    /// Bucket rate, tokens per second (default: limit per window).
    #[arg(long)]
    rate: Option<u64>,
    /// Bucket burst, tokens (default: the limit).
    #[arg(long)]
    burst: Option<u64>,
    /// How requests arrive.
    #[arg(long, value_enum, default_value_t = TrafficArg::Uniform)]
    traffic: TrafficArg,
    /// How long the moving hot spot stays on one node, s.
    #[arg(long, default_value_t = 2.0)]
    hotspot_every_s: f64,
    /// The fraction of the traffic on the moving hot spot (the rest is spread over the others).
    #[arg(long, default_value_t = 0.8)]
    hotspot_fraction: f64,
    /// The Zipf law's exponent (`--traffic zipf`).
    #[arg(long, default_value_t = 1.0)]
    zipf_exponent: f64,
    /// Offered load as a multiple of the limit, per key.
    #[arg(long, default_value_t = 2.0)]
    demand: f64,
    /// Requests cost 1..=max-cost tokens.
    #[arg(long, default_value_t = 1)]
    max_cost: u64,
    /// Number of keys the load is spread over.
    #[arg(long, default_value_t = 1)]
    keys: u64,
    /// Send each key's requests to a fixed set of this many nodes, drawn at random per key
    /// (default: the nodes the traffic model picks, all of them).
    #[arg(long)]
    nodes_per_key: Option<usize>,
    /// Simulated seconds.
    #[arg(long, default_value_t = 20.0)]
    duration_s: f64,
    /// RNG seed (the same seed gives the same run).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Run this many seeds (seed, seed + 1, ...) and print the median of each figure.
    #[arg(long, default_value_t = 1)]
    seeds: u64,
    /// The longest a request waits for its key's owner, ms.
    #[arg(long, default_value_t = 100.0)]
    max_wait_ms: f64,
    /// Each node's gossip budget, bytes per second (key items beyond it wait a round, the
    /// most urgent first; as `gossip_budget_bytes_per_s` in a node file).
    #[arg(long, default_value_t = ratemesh::mesh::DEFAULT_GOSSIP_BUDGET_BYTES_PER_S)]
    gossip_budget: u64,
    /// Tokens a node admits for a key it holds nothing of before the key's owner answers
    /// (as `mesh_first_credit` in a node file; 0: the first request waits).
    #[arg(long, default_value_t = 0)]
    first_credit: u64,
    /// Cut the first `--minority` nodes off at this second.
    #[arg(long, requires = "heal_at_s")]
    partition_at_s: Option<f64>,
    /// Heal the partition at this second.
    #[arg(long, requires = "partition_at_s")]
    heal_at_s: Option<f64>,
    /// How many nodes the partition cuts off (default: the smaller half).
    #[arg(long)]
    minority: Option<usize>,
    /// Crash this node (0-based; it loses all state).
    #[arg(long, requires = "crash_at_s")]
    crash_node: Option<usize>,
    /// When the node crashes, s.
    #[arg(long, requires = "crash_node")]
    crash_at_s: Option<f64>,
    /// Drain this node (0-based) as `ratemesh node` does on SIGTERM: it gives its leases
    /// back, hands its keys over and leaves; its requests go to the other nodes.
    #[arg(long, requires = "drain_at_s", conflicts_with = "crash_node")]
    drain_node: Option<usize>,
    /// When the node drains, s.
    #[arg(long, requires = "drain_node")]
    drain_at_s: Option<f64>,
    /// Start the crashed or drained node again at this second (default: it stays down).
    #[arg(long)]
    restart_at_s: Option<f64>,
    /// A rolling restart: drain every node in turn, one every this many seconds (from
    /// `--rolling-from-s`), each started again `--rolling-down-s` after its drain.
    #[arg(long, conflicts_with_all = ["crash_node", "drain_node"])]
    rolling_every_s: Option<f64>,
    /// When the rolling restart begins, s.
    #[arg(long, default_value_t = 1.0)]
    rolling_from_s: f64,
    /// How long each node of a rolling restart stays down, s (default: half of
    /// `--rolling-every-s`).
    #[arg(long)]
    rolling_down_s: Option<f64>,
    /// Skip the baselines (faster for large runs).
    #[arg(long)]
    no_baselines: bool,
    /// Run the `stale_sum` baseline even where it is costly to simulate (more than a million
    /// nodes × keys: every node sends every count to every other node).
    #[arg(long, conflicts_with = "no_baselines")]
    all_baselines: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

fn ms(value: f64) -> u64 {
    (value * 1e6).round().max(0.0) as u64
}

fn config(args: &SimulateArgs) -> Result<SimConfig, String> {
    if args.nodes == 0 || args.nodes > sim::MAX_NODES {
        return Err(format!("--nodes: between 1 and {}", sim::MAX_NODES));
    }
    if !(0.0..=1.0).contains(&args.loss) || !(0.0..=1.0).contains(&args.duplication) {
        return Err("--loss and --duplication: within 0..1".into());
    }
    if args.gossip_ms <= 0.0 || args.duration_s <= 0.0 || args.demand < 0.0 {
        return Err("--gossip-ms and --duration-s must be positive, --demand not negative".into());
    }
    if args.nodes_per_key.is_some_and(|k| k == 0 || k > args.nodes) {
        return Err("--nodes-per-key: between 1 and --nodes".into());
    }
    if args.seeds == 0 || args.seeds > 1000 {
        return Err("--seeds: between 1 and 1000".into());
    }
    if args.max_wait_ms <= 0.0 {
        return Err("--max-wait-ms must be positive".into());
    }
    if args.gossip_budget == 0 {
        return Err("--gossip-budget must be positive".into());
    }
    let window = Duration::from_millis(args.window_ms);
    let bucket_rate = args
        .rate
        .unwrap_or_else(|| (args.limit * 1000).div_ceil(args.window_ms.max(1)));
    let burst = args.burst.unwrap_or(args.limit);
    let policy = match args.algorithm {
        MeshAlgorithm::SlidingWindow => Policy::global_sliding_window(args.limit, window),
        MeshAlgorithm::FixedWindow => Policy::global_fixed_window(args.limit, window),
        MeshAlgorithm::TokenBucket => {
            Policy::token_bucket(bucket_rate, Duration::from_secs(1), burst)
        }
        MeshAlgorithm::Gcra => Policy::gcra(bucket_rate, Duration::from_secs(1), burst),
    }
    .map_err(|e| format!("policy: {e}"))?;
    let mut c = SimConfig::new(policy);
    c.nodes = args.nodes;
    c.gossip_interval_ns = ms(args.gossip_ms);
    c.latency_ns = ms(args.latency_ms);
    c.jitter_ns = ms(args.jitter_ms);
    c.loss = args.loss;
    c.duplication = args.duplication;
    c.skew_ns = ms(args.skew_ms);
    c.max_wait_ns = ms(args.max_wait_ms);
    c.gossip_budget_bytes_per_s = args.gossip_budget;
    c.first_credit = args.first_credit;
    c.traffic = match args.traffic {
        TrafficArg::Uniform => Traffic::Uniform,
        TrafficArg::OneNode => Traffic::OneNode,
        TrafficArg::MovingHotspot => Traffic::MovingHotspot {
            every_ns: ms(args.hotspot_every_s * 1000.0),
            permille: (args.hotspot_fraction.clamp(0.0, 1.0) * 1000.0).round() as u32,
        },
        TrafficArg::SynchronizedBurst => Traffic::SynchronizedBurst,
        TrafficArg::Poisson => Traffic::Poisson,
        TrafficArg::Bursty => Traffic::Bursty,
        TrafficArg::Zipf => Traffic::Zipf {
            exponent_milli: (args.zipf_exponent.clamp(0.0, 10.0) * 1000.0).round() as u32,
        },
    };
    c.demand = args.demand;
    c.max_cost = args.max_cost.max(1);
    c.keys = args.keys.max(1);
    c.nodes_per_key = args.nodes_per_key;
    c.duration_ns = ms(args.duration_s * 1000.0);
    c.seed = args.seed;
    if let (Some(at), Some(heal)) = (args.partition_at_s, args.heal_at_s) {
        if heal <= at {
            return Err("--heal-at-s must be after --partition-at-s".into());
        }
        let minority = args.minority.unwrap_or(args.nodes / 2);
        if minority == 0 || minority >= args.nodes {
            return Err("--minority: between 1 and nodes - 1".into());
        }
        c.partition = Some(Partition {
            at_ns: ms(at * 1000.0),
            heal_ns: ms(heal * 1000.0),
            minority,
        });
    }
    if args.restart_at_s.is_some() && args.crash_node.is_none() && args.drain_node.is_none() {
        return Err("--restart-at-s: with --crash-node or --drain-node".into());
    }
    if let (Some(node), Some(at)) = (args.drain_node, args.drain_at_s) {
        if node >= args.nodes {
            return Err("--drain-node: a node index below --nodes".into());
        }
        if args.restart_at_s.is_some_and(|r| r <= at) {
            return Err("--restart-at-s must be after --drain-at-s".into());
        }
        c.drains.push(Drain {
            node,
            at_ns: ms(at * 1000.0),
            restart_ns: args.restart_at_s.map(|r| ms(r * 1000.0)),
        });
    }
    if let Some(every) = args.rolling_every_s {
        let down = args.rolling_down_s.unwrap_or(every / 2.0);
        if every <= 0.0 || down <= 0.0 || args.rolling_from_s < 0.0 {
            return Err("--rolling-every-s and --rolling-down-s must be positive".into());
        }
        for node in 0..args.nodes {
            let at = args.rolling_from_s + node as f64 * every;
            c.drains.push(Drain {
                node,
                at_ns: ms(at * 1000.0),
                restart_ns: Some(ms((at + down) * 1000.0)),
            });
        }
    }
    if let (Some(node), Some(at)) = (args.crash_node, args.crash_at_s) {
        if node >= args.nodes {
            return Err("--crash-node: a node index below --nodes".into());
        }
        if args.restart_at_s.is_some_and(|r| r <= at) {
            return Err("--restart-at-s must be after --crash-at-s".into());
        }
        c.crashes.push(Crash {
            node,
            at_ns: ms(at * 1000.0),
            restart_ns: args.restart_at_s.map(|r| ms(r * 1000.0)),
        });
    }
    Ok(c)
}

fn fields(r: &SimReport) -> serde_json::Value {
    serde_json::json!({
        "overshoot": r.overshoot,
        "policy_overshoot": r.policy_overshoot,
        "oracle_overshoot": r.oracle_overshoot,
        "utilization": r.utilization,
        "false_denial_rate": r.false_denial_rate,
        "false_admit_rate": r.false_admit_rate,
        "false_denial_rate_under_limit_keys": r.false_denial_rate_under_limit_keys,
        "wrong_decision_rate": r.wrong_decision_rate,
        "waited_fraction": r.waited_fraction,
        "wait_p50_ms": r.wait_p50_ms,
        "wait_p99_ms": r.wait_p99_ms,
        "declared_bound": r.declared_bound.total(),
        "declared_bound_terms": {
            "steady": r.declared_bound.steady,
            "crash": r.declared_bound.crash,
            "partition": r.declared_bound.partition,
            "first": r.declared_bound.first,
        },
        "gossip_bytes_per_node_per_s": r.gossip_bytes_per_node_per_s,
        "convergence_ms_after_heal": r.convergence_ms_after_heal,
        "capacity_after_crash": r.capacity_after_crash,
        "detection_ms": r.detection_ms,
        "recovery_ms_after_detection": r.recovery_ms_after_detection,
        "admitted": r.admitted,
        "oracle_admitted": r.oracle_admitted,
        "requests": r.requests,
        "false_denials_with_room": r.false_denials_with_room,
        "refused_with_room": r.refused_with_room,
        "budget_lost": r.budget_lost,
        "crash_loss": r.crash_loss,
        "drains": r.drains,
    })
}

/// The median of each figure over several runs (the runs of one rule, several seeds).
fn median(runs: &[SimReport]) -> SimReport {
    fn mid(mut values: Vec<f64>) -> f64 {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    }
    fn mid_opt(values: Vec<Option<f64>>) -> Option<f64> {
        let some: Vec<f64> = values.into_iter().flatten().collect();
        (!some.is_empty()).then(|| mid(some))
    }
    let f = |get: fn(&SimReport) -> f64| mid(runs.iter().map(get).collect());
    let o = |get: fn(&SimReport) -> Option<f64>| mid_opt(runs.iter().map(get).collect());
    let u = |get: fn(&SimReport) -> u64| mid(runs.iter().map(|r| get(r) as f64).collect()) as u64;
    let mut out = runs[runs.len() / 2].clone();
    out.overshoot = f(|r| r.overshoot);
    out.policy_overshoot = f(|r| r.policy_overshoot);
    out.oracle_overshoot = f(|r| r.oracle_overshoot);
    out.utilization = f(|r| r.utilization);
    out.false_denial_rate = f(|r| r.false_denial_rate);
    out.false_admit_rate = f(|r| r.false_admit_rate);
    out.false_denial_rate_under_limit_keys = f(|r| r.false_denial_rate_under_limit_keys);
    out.wrong_decision_rate = f(|r| r.wrong_decision_rate);
    out.waited_fraction = f(|r| r.waited_fraction);
    out.wait_p50_ms = f(|r| r.wait_p50_ms);
    out.wait_p99_ms = f(|r| r.wait_p99_ms);
    out.declared_bound.crash = f(|r| r.declared_bound.crash);
    out.gossip_bytes_per_node_per_s = f(|r| r.gossip_bytes_per_node_per_s);
    out.convergence_ms_after_heal = o(|r| r.convergence_ms_after_heal);
    out.capacity_after_crash = o(|r| r.capacity_after_crash);
    out.detection_ms = o(|r| r.detection_ms);
    out.recovery_ms_after_detection = o(|r| r.recovery_ms_after_detection);
    out.admitted = u(|r| r.admitted);
    out.oracle_admitted = u(|r| r.oracle_admitted);
    out.requests = u(|r| r.requests);
    out.false_denials_with_room = u(|r| r.false_denials_with_room);
    out.refused_with_room = u(|r| r.refused_with_room);
    out.budget_lost = f(|r| r.budget_lost);
    out.crash_loss = f(|r| r.crash_loss);
    out
}

/// Run `config` over `seeds` seeds; return the median of each rule's figures.
fn run_seeds(
    config: &SimConfig,
    seeds: u64,
    baselines: &[(&'static str, Admission)],
) -> (SimReport, Vec<(&'static str, SimReport)>) {
    let mut mesh = Vec::new();
    let mut others: Vec<(&'static str, Vec<SimReport>)> = Vec::new();
    for i in 0..seeds {
        let mut c = config.clone();
        c.seed = config.seed.wrapping_add(i);
        mesh.push(sim::run(&c));
        for (k, &(name, admission)) in baselines.iter().enumerate() {
            if others.len() <= k {
                others.push((name, Vec::new()));
            }
            others[k].1.push(sim::run_baseline(&c, admission));
        }
    }
    let others = others
        .into_iter()
        .map(|(name, runs)| (name, median(&runs)))
        .collect();
    (median(&mesh), others)
}

/// Run `ratemesh simulate`.
pub fn run(args: &SimulateArgs) -> Result<(), Box<dyn std::error::Error>> {
    let config = config(args)?;
    let skip_stale_sum = !args.all_baselines && sim::stale_sum_is_costly(&config);
    let rules: Vec<(&'static str, Admission)> = sim::BASELINES
        .into_iter()
        .filter(|&(_, a)| !(args.no_baselines || (skip_stale_sum && a == Admission::StaleSum)))
        .collect();
    let (mesh, baselines) = run_seeds(&config, args.seeds, &rules);
    if args.json {
        let mut out = fields(&mesh);
        out["seeds"] = args.seeds.into();
        out["baselines"] = baselines
            .iter()
            .map(|(name, r)| ((*name).to_string(), fields(r)))
            .collect::<serde_json::Map<_, _>>()
            .into();
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "ratemesh simulate: {} nodes, gossip {} ms, latency {} ms, loss {}, skew {} ms, {:?} \
         (capacity {}), traffic {}, demand {}x, {} key(s){}, {} s, seed {}{}",
        config.nodes,
        args.gossip_ms,
        args.latency_ms,
        args.loss,
        args.skew_ms,
        args.algorithm,
        config.policy.capacity(),
        config.traffic.name(),
        args.demand,
        config.keys,
        config
            .nodes_per_key
            .map_or(String::new(), |k| format!(" on {k} node(s) each")),
        args.duration_s,
        args.seed,
        if args.seeds > 1 {
            format!(" (median of {} seeds)", args.seeds)
        } else {
            String::new()
        }
    );
    if let Some(p) = config.partition {
        println!(
            "partition: first {} nodes cut off from {:.1} s to {:.1} s",
            p.minority,
            p.at_ns as f64 / 1e9,
            p.heal_ns as f64 / 1e9
        );
    }
    println!(
        "\n{:<13} {:>9} {:>9} {:>9} {:>10} {:>10} {:>9} {:>8} {:>9} {:>12}",
        "rule",
        "false-den",
        "false-adm",
        "utiliz.",
        "overshoot",
        "policy-ov",
        "declared",
        "waited",
        "p99 wait",
        "gossip B/s"
    );
    let row = |name: &str, r: &SimReport| {
        println!(
            "{:<13} {:>8.3}% {:>8.3}% {:>8.1}% {:>9.2}% {:>9.2}% {:>8.1}% {:>7.1}% {:>6.1} ms {:>12.0}",
            name,
            r.false_denial_rate * 100.0,
            r.false_admit_rate * 100.0,
            r.utilization * 100.0,
            r.overshoot * 100.0,
            r.policy_overshoot * 100.0,
            r.declared_bound.total() * 100.0,
            r.waited_fraction * 100.0,
            r.wait_p99_ms,
            r.gossip_bytes_per_node_per_s
        )
    };
    row("ratemesh", &mesh);
    for (name, r) in &baselines {
        row(name, r);
    }
    if skip_stale_sum && !args.no_baselines {
        println!(
            "{:<13} not simulated: every node would send every count to every other node \
             ({} nodes x {} keys; --all-baselines runs it)",
            "stale_sum", config.nodes, config.keys
        );
    }
    println!(
        "\noracle (one central limiter, same stream): overshoot {:.2}%, admitted {} tokens; \
         {} requests",
        mesh.oracle_overshoot * 100.0,
        mesh.oracle_admitted,
        mesh.requests
    );
    if config.keys > 1 {
        println!(
            "false denials on the keys the oracle never denied: {:.3}%",
            mesh.false_denial_rate_under_limit_keys * 100.0
        );
    }
    if let Some(capacity) = mesh.capacity_after_crash {
        println!(
            "crash: detected after {}; mesh admitted {:.1}% of the oracle's in the two windows \
             after it; back at >= 95% {} after detection; the crashed node held {:.2}% of the \
             limit in a key's lease (counted as spent: the most the crash may lose)",
            mesh.detection_ms
                .map_or("never".to_string(), |ms| format!("{ms:.0} ms")),
            capacity * 100.0,
            mesh.recovery_ms_after_detection
                .map_or("never".to_string(), |ms| format!("{ms:.0} ms")),
            mesh.crash_loss * 100.0
        );
    }
    if !config.drains.is_empty() || config.partition.is_some() || !config.crashes.is_empty() {
        let drains = config.drains.len().max(1) as f64;
        println!(
            "budget lost: {:.2}% of the limit (worst key: the room one central limiter with the \
             mesh's admissions still had at its last denial){}",
            mesh.budget_lost * 100.0,
            if config.drains.len() > 1 {
                format!(
                    "; {:.2}% per drain over {} drains",
                    mesh.budget_lost * 100.0 / drains,
                    config.drains.len()
                )
            } else {
                String::new()
            }
        );
    }
    if config.partition.is_some() {
        println!(
            "partition: the nodes agreed on every key's owner {} after the heal",
            mesh.convergence_ms_after_heal
                .map_or("never".to_string(), |ms| format!("{ms:.1} ms"))
        );
    }
    println!(
        "\nfalse-den: denied where one central limiter admitted (over its admissions); waited: \
         requests that waited for their key's owner; overshoot: exact timestamps; policy-ov: \
         in the policy's own terms, what `declared` bounds (docs/overshoot.md)."
    );
    Ok(())
}
